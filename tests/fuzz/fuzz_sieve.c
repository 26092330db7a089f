/*
 * fuzz_sieve.c - libFuzzer target for the Sieve library: the input is a
 * script, optionally followed by "\n\x01\n" and a message.  The script is
 * compiled with small limits (so that every limit is reachable with short
 * inputs) and, when it compiles, executed against the message (or a fixed
 * one) with every callback of sieve_msg.c, including an include resolver
 * that hands back the script itself; the actions are formatted, so that
 * every string they hold is read under ASan.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. -I$BUILD \
 *     tests/fuzz/fuzz_sieve.c sieve/sieve*.c imapd/search.c ... -o fuzz_sieve
 *   ./fuzz_sieve -max_total_time=60 tests/fuzz/corpus/sieve
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sieve/sieve.h"
#include "sieve/sieve_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fuzz_msg[] =
    "From: \"A\" <a+b@example.org>\r\nTo: c@example.com, d@example.net\r\n"
    "Subject: =?UTF-8?Q?caf=C3=A9?= meeting\r\n"
    "Date: Tue, 1 Jul 2003 10:52:37 +0200\r\nMessage-ID: <x@y>\r\n"
    "Content-Type: multipart/mixed; boundary=B\r\n\r\n--B\r\n"
    "Content-Type: text/plain\r\n\r\nhello\r\n--B--\r\n";

static const struct sieve_script *fuzz_self;

static int fuzz_include(void *rock, int global, const char *name,
                        const struct sieve_script **script_r,
                        struct buf *errmsg)
{
    (void)rock; (void)errmsg;
    if (global || name[0] == 'x')
        return 0;
    *script_r = fuzz_self;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data, *msg = fuzz_msg;
    size_t tlen = size, mlen = sizeof(fuzz_msg) - 1, i;
    struct sieve_limits l;
    struct sieve_script *s = NULL;
    struct buf err = BUF_INITIALIZER, out = BUF_INITIALIZER;

    for (i = 0; i + 3 <= size; i++)
        if (data[i] == '\n' && data[i + 1] == 1 && data[i + 2] == '\n') {
            tlen = i;
            msg = text + i + 3;
            mlen = size - i - 3;
            break;
        }
    memset(&l, 0, sizeof(l));
    l.max_nesting = 8;
    l.max_string_len = 512;
    l.max_actions = 8;
    l.max_redirects = 2;
    l.max_include_depth = 2;
    l.max_variables = 8;
    l.max_variable_len = 64;
    l.max_match_len = 256;
    l.max_match_steps = 20000;
    l.max_headers = 8;
    if (sieve_compile(text, tlen, &l, NULL, &s, &err) == SIEVE_OK) {
        struct sieve_msg m;
        struct sieve_message_ctx ctx;
        struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
        sieve_msg_init(&m, msg, mlen);
        m.env_from = "a@example.org";
        strarray_append(&m.env_to, "c+d@example.com");
        strarray_append(&m.mailboxes, "INBOX.a");
        strarray_append(&m.environment, "domain=example.com");
        sieve_msg_ctx(&m, &ctx);
        ctx.include = fuzz_include;
        fuzz_self = s;
        (void)sieve_execute(s, &ctx, &acts, &err);
        (void)sieve_actions_format(&acts, &out);
        sieve_actions_fini(&acts);
        sieve_msg_fini(&m);
        (void)sieve_script_requires(s);
        sieve_script_free(&s);
    }
    buf_free(&err);
    buf_free(&out);
    return 0;
}
