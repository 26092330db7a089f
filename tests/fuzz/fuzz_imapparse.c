/*
 * fuzz_imapparse.c - libFuzzer target for the IMAP command parser.
 *
 * The input is a client's byte stream: it is served through a memory
 * stream (prot_new_mem()) and parsed command after command, as imapd
 * would, until the parser says the stream is over or out of sync.  An
 * APPEND message is read and dropped as a session would stream it.  Small
 * limits make the size checks reachable with short inputs; a continuation
 * callback refuses some synchronizing literals.  Every structure handed
 * back is walked so that a dangling pointer shows up under ASan.
 *
 * Build by hand (see the report in doc or the build rule), e.g.:
 *   clang-14 -g -O1 -fsanitize=fuzzer,address,undefined -I. -I$BUILD \
 *     tests/fuzz/fuzz_imapparse.c imapd/imapparse.c lib/prot.c lib/buf.c \
 *     lib/tls.c lib/log.c -lssl -lcrypto -o fuzz_imapparse
 *   ./fuzz_imapparse -max_total_time=60 tests/fuzz/corpus/imapparse
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "imapd/imapparse.h"
#include "lib/prot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fuzz_continue(void *rock, struct prot *p, size_t size, int append,
                         const char **error_r)
{
    (void)rock;
    if (size % 7 == 3 || (append && size > 4000)) {
        *error_r = "refused";
        return 1;
    }
    prot_puts(p, "+ Ready for more\r\n");
    return 0;
}

static size_t walk_search(const struct imapparse_search *k, unsigned depth)
{
    size_t sum = 0, i;

    if (!k || depth > 100)
        return 0;
    sum += (size_t)k->key + k->set.n + k->str_len + (size_t)k->date.mday;
    if (k->str)
        sum += strlen(k->str);
    if (k->field)
        sum += strlen(k->field);
    if (k->flag)
        sum += strlen(k->flag);
    for (i = 0; i < k->set.n; i++)
        sum += k->set.r[i].lo + (size_t)k->set.r[i].hi;
    for (i = 0; i < k->nchildren; i++)
        sum += walk_search(k->children[i], depth + 1);
    return sum;
}

static size_t walk(const struct imapparse_cmd *cmd)
{
    size_t sum = 0, i, j;

    if (cmd->tag)
        sum += strlen(cmd->tag);
    if (cmd->name)
        sum += strlen(cmd->name);
    if (cmd->error)
        sum += strlen(cmd->error);
    for (i = 0; i < 2; i++)
        if (cmd->arg[i])
            sum += strlen(cmd->arg[i]) + cmd->arg_len[i];
    for (i = 0; i < cmd->set.n; i++)
        sum += (size_t)imapparse_seqset_contains(&cmd->set, cmd->set.r[i].lo,
                                                 1000);
    for (i = 0; i < cmd->fetch.n; i++) {
        const struct imapparse_fetch_att *a = &cmd->fetch.atts[i];

        if (a->section)
            sum += strlen(a->section);
        for (j = 0; j < a->fields.n; j++)
            sum += strlen(a->fields.s[j]);
        for (j = 0; j < a->nparts; j++)
            sum += a->parts[j];
    }
    for (i = 0; i < cmd->store.flags.n; i++)
        sum += strlen(cmd->store.flags.s[i]);
    for (i = 0; i < cmd->append.flags.n; i++)
        sum += strlen(cmd->append.flags.s[i]);
    for (i = 0; i < cmd->words.n; i++)
        sum += strlen(cmd->words.s[i]);
    for (i = 0; i < cmd->idparams.n; i++)
        sum += strlen(cmd->idparams.field[i])
               + (cmd->idparams.value[i] ? strlen(cmd->idparams.value[i]) : 0);
    for (i = 0; i < cmd->status.n; i++)
        sum += (size_t)cmd->status.items[i];
    sum += walk_search(cmd->search, 0);
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct imapparse_options opts = {
        .max_line = 512,
        .max_literal = 256,
        .max_append = 8192,
        .max_command = 2048,
        .max_skip = 4096,
        .max_tokens = 200,
        .max_depth = 16,
        .cont = fuzz_continue,
    };
    struct prot *p = prot_new_mem(data, size);
    struct imapparse_cmd cmd;
    volatile size_t sink = 0;
    int r, rounds = 0;

    if (!p)
        return 0;
    imapparse_cmd_init(&cmd);
    /* odd-sized inputs run with the default limits */
    do {
        r = imapparse_read(p, (size & 1) ? NULL : &opts, &cmd);
        sink += walk(&cmd);
        /* every APPEND event, its data read and dropped */
        while (r == IMAPPARSE_OK && cmd.id == IMAPPARSE_CMD_APPEND &&
               cmd.append.event != IMAPPARSE_APPEND_END) {
            if ((cmd.append.event == IMAPPARSE_APPEND_MESSAGE ||
                 cmd.append.event == IMAPPARSE_APPEND_TEXT) &&
                prot_read(p, NULL, cmd.append.size) != PROT_OK)
                goto done;
            if (cmd.append.event == IMAPPARSE_APPEND_URL)
                sink += strlen(cmd.append.url) + cmd.append.url_len;
            r = imapparse_append_next(p, (size & 1) ? NULL : &opts, &cmd);
            sink += walk(&cmd);
        }
    } while (imapparse_in_sync(r) && ++rounds < 10000);
done:
    (void)sink;
    imapparse_cmd_free(&cmd);
    prot_free(&p);
    return 0;
}
