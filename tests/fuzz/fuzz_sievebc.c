/*
 * fuzz_sievebc.c - libFuzzer target for the stored compiled form of a
 * Sieve script (sieve/sieve_bc.c): the input is a payload (the bytes
 * after the 80-byte header); the target wraps it in a header that
 * matches (source hashes of an empty text, the payload's CRC-32C), so
 * that every input reaches the tree decoder, and runs what decodes
 * against a fixed message with every callback of sieve_msg.c.  The
 * seeds are the payloads of scripts of the conformance corpus.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -I. -I$BUILD \
 *     tests/fuzz/fuzz_sievebc.c sieve/sieve*.c ... -o fuzz_sievebc
 *   ./fuzz_sievebc -max_total_time=60 tests/fuzz/corpus/sievebc
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sieve/sieve.h"
#include "sieve/sieve_bc.h"
#include "sieve/sieve_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fuzz_msg[] =
    "From: \"A\" <a+b@example.org>\r\nTo: c@example.com, d@example.net\r\n"
    "Subject: =?UTF-8?Q?caf=C3=A9?= meeting\r\n"
    "Date: Tue, 1 Jul 2003 10:52:37 +0200\r\nMessage-ID: <x@y>\r\n"
    "Content-Type: text/plain\r\n\r\nhello\r\n";

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
    static unsigned char header[SIEVE_BC_HEADER];
    static int have_header;
    struct sieve_script *s = NULL;
    struct buf err = BUF_INITIALIZER, out = BUF_INITIALIZER;
    unsigned char *file;
    uint32_t crc;

    if (!have_header) {
        /* the header of an empty script's compiled form: its source
         * fields are those of the empty text */
        struct buf bc = BUF_INITIALIZER;
        if (sieve_compile("", 0, NULL, NULL, &s, &err) != SIEVE_OK ||
            sieve_bc_encode(s, "", 0, NULL, &bc) != SIEVE_OK)
            abort();
        memcpy(header, bc.s, SIEVE_BC_HEADER);
        sieve_script_free(&s);
        buf_free(&bc);
        have_header = 1;
    }
    if (size > 1 << 20)
        return 0;
    file = malloc(SIEVE_BC_HEADER + size);
    if (!file)
        return 0;
    memcpy(file, header, SIEVE_BC_HEADER);
    memcpy(file + SIEVE_BC_HEADER, data, size);
    file[56] = (unsigned char)size;
    file[57] = (unsigned char)(size >> 8);
    file[58] = (unsigned char)(size >> 16);
    file[59] = (unsigned char)(size >> 24);
    /* the checksum covers the payload and then the header's size hint
     * (the empty script's, too small for most inputs: the loader then
     * takes more chunks) */
    crc = sieve_bc_checksum(file, size);
    file[60] = (unsigned char)crc;
    file[61] = (unsigned char)(crc >> 8);
    file[62] = (unsigned char)(crc >> 16);
    file[63] = (unsigned char)(crc >> 24);
    if (sieve_bc_decode(file, SIEVE_BC_HEADER + size, "", 0, NULL, NULL, &s,
                        NULL) == SIEVE_OK) {
        struct sieve_msg m;
        struct sieve_message_ctx ctx;
        struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
        sieve_msg_init(&m, fuzz_msg, sizeof(fuzz_msg) - 1);
        m.env_from = "a@example.org";
        strarray_append(&m.env_to, "c+d@example.com");
        strarray_append(&m.mailboxes, "INBOX.a");
        sieve_msg_ctx(&m, &ctx);
        ctx.include = fuzz_include;
        fuzz_self = s;
        (void)sieve_execute(s, &ctx, &acts, &err);
        (void)sieve_actions_format(&acts, &out);
        sieve_actions_fini(&acts);
        sieve_msg_fini(&m);
        sieve_script_free(&s);
    }
    free(file);
    buf_free(&err);
    buf_free(&out);
    return 0;
}
