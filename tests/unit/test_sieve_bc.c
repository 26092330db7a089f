/*
 * test_sieve_bc.c - unit tests of the stored compiled form (sieve/
 * sieve_bc.c): a script and its decoded form run to the same actions and
 * encode to the same bytes; a changed text, extension set, limit or
 * format version is stale; every truncation and every bit flip is
 * rejected; payloads damaged behind a valid checksum are rejected or
 * decode to a tree that runs without a fault (run under the sanitizer
 * build too); the size hint makes the tree one allocation, and a wrong
 * one changes nothing but the allocations.
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/buf.h"
#include "lib/crc32c.h"
#include "lib/strarray.h"
#include "sieve/sieve.h"
#include "sieve/sieve_bc.h"
#include "sieve/sieve_msg.h"
#include "sieve/sieve_tree.h"

static const char msg_text[] =
    "From: \"A\" <a+x@example.org>\r\n"
    "To: b@example.com, c@example.net\r\n"
    "Subject: =?UTF-8?Q?caf=C3=A9?= hello world\r\n"
    "Date: Tue, 1 Jul 2003 10:52:37 +0200\r\n"
    "Message-ID: <m1@example.org>\r\n"
    "Content-Type: text/plain\r\n"
    "\r\n"
    "body text\r\n";

/* most of what the checker resolves: tags with arguments, positional
 * lists and strings, regexes compiled at check time, encoded characters,
 * variables, a block under a failed ihave (unchecked), nested tests */
static const char rich_script[] =
    "require [\"fileinto\", \"imap4flags\", \"copy\", \"mailbox\","
    " \"variables\", \"regex\", \"relational\", \"comparator-i;ascii-numeric\","
    " \"envelope\", \"subaddress\", \"body\", \"date\", \"index\","
    " \"editheader\", \"vacation\", \"duplicate\", \"environment\","
    " \"encoded-character\", \"ihave\", \"include\", \"special-use\"];\n"
    "set :lower :length \"n\" \"${hex:41 42}C\";\n"
    "set \"s\" \"${unicode:e9}\";\n"
    "if header :regex :comparator \"i;ascii-casemap\" \"subject\" "
    "\"^caf(.)\" { addflag \"\\\\Seen\"; set \"m\" \"${1}\"; }\n"
    "if address :domain :is [\"from\", \"to\"] \"example.org\" {"
    " fileinto :copy :flags [\"$a\", \"\\\\Flagged\"] \"INBOX.org\"; }\n"
    "elsif envelope :user \"to\" \"b\" { keep; }\n"
    "else { discard; }\n"
    "if allof (not exists \"x-nope\", anyof (size :over 10, true),"
    " header :count \"ge\" :comparator \"i;ascii-numeric\" \"to\" \"1\")"
    " { addheader :last \"X-Seen\" \"${n} ${m}\"; }\n"
    "if body :contains \"text\" { setflag \"f\" \"\\\\Answered\"; }\n"
    "if date :zone \"+0100\" \"date\" \"year\" \"2003\" {"
    " deleteheader :index 1 \"X-Seen\"; }\n"
    "if ihave \"nope-ext\" { nope \"x\"; }\n"
    "if string :matches \"${s}\" \"*\" { fileinto :create"
    " :specialuse \"\\\\Junk\" \"Junk\"; }\n"
    "if not duplicate :handle \"h\" :seconds 60 {"
    " vacation :days 2 :subject \"away\" :addresses [\"b@example.com\"]"
    " \"I am away.\"; }\n"
    "if environment :is \"name\" \"x\" { stop; }\n"
    "include :optional :once \"other\";\n";

static const char *run_script(const struct sieve_script *s, struct buf *out)
{
    struct sieve_msg m;
    struct sieve_message_ctx ctx;
    struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
    struct buf err = BUF_INITIALIZER;
    int rc;

    sieve_msg_init(&m, msg_text, sizeof(msg_text) - 1);
    m.env_from = "a@example.org";
    m.now = 1057049557;
    strarray_append(&m.env_to, "b+d@example.com");
    sieve_msg_ctx(&m, &ctx);
    rc = sieve_execute(s, &ctx, &acts, &err);
    buf_reset(out);
    sieve_actions_format(&acts, out);
    buf_printf(out, "rc=%d %s\n", rc, buf_cstring(&err));
    sieve_actions_fini(&acts);
    sieve_msg_fini(&m);
    buf_free(&err);
    return buf_cstring(out);
}

static void encode_text(const char *text, const struct strarray *allowed,
                        struct sieve_script **s_r, struct buf *bc)
{
    struct buf err = BUF_INITIALIZER;

    assert_int_equal(sieve_compile(text, strlen(text), NULL, allowed, s_r,
                                   &err), SIEVE_OK);
    buf_free(&err);
    buf_reset(bc);
    assert_int_equal(sieve_bc_encode(*s_r, text, strlen(text), allowed, bc),
                     SIEVE_OK);
}

/* decoded runs as compiled and encodes to the same bytes */
static void test_roundtrip(void **state)
{
    struct sieve_script *s = NULL, *d = NULL;
    struct buf bc = BUF_INITIALIZER, bc2 = BUF_INITIALIZER;
    struct buf a = BUF_INITIALIZER, b = BUF_INITIALIZER;
    const char *why = NULL;

    (void)state;
    encode_text(rich_script, NULL, &s, &bc);
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, rich_script,
                                     strlen(rich_script), NULL, NULL, &d,
                                     &why), SIEVE_OK);
    assert_null(why);
    assert_non_null(d);
    run_script(s, &a);
    run_script(d, &b);
    assert_string_equal(buf_cstring(&a), buf_cstring(&b));
    /* the script did what it says (the comparison is not of empties) */
    assert_non_null(strstr(buf_cstring(&a), "fileinto :copy"));
    assert_non_null(strstr(buf_cstring(&a), "vacation"));
    assert_int_equal(sieve_bc_encode(d, rich_script, strlen(rich_script),
                                     NULL, &bc2), SIEVE_OK);
    assert_int_equal(bc.len, bc2.len);
    assert_memory_equal(bc.s, bc2.s, bc.len);
    assert_int_equal(sieve_script_requires(d)->count,
                     sieve_script_requires(s)->count);
    sieve_script_free(&s);
    sieve_script_free(&d);
    buf_free(&bc);
    buf_free(&bc2);
    buf_free(&a);
    buf_free(&b);
}

/* stale: another text, extension set, limit, version */
static void test_stale(void **state)
{
    struct sieve_script *s = NULL, *d = NULL;
    struct buf bc = BUF_INITIALIZER;
    struct strarray few = STRARRAY_INITIALIZER;
    struct sieve_limits l;
    const char *text = "require \"fileinto\"; fileinto \"A\";";
    const char *same_len = "require \"fileinto\"; fileinto \"B\";";
    const char *why = NULL;

    (void)state;
    encode_text(text, NULL, &s, &bc);
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, strlen(text), NULL,
                                     NULL, &d, &why), SIEVE_OK);
    sieve_script_free(&d);
    /* the script was changed behind our back: same size, other bytes */
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, same_len,
                                     strlen(same_len), NULL, NULL, &d, &why),
                     SIEVE_EINVAL);
    assert_null(d);
    assert_string_equal(why, "stale: source changed");
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, strlen(text) - 1,
                                     NULL, NULL, &d, &why), SIEVE_EINVAL);
    /* checked against every extension, loaded for fewer */
    strarray_append(&few, "fileinto");
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, strlen(text), NULL,
                                     &few, &d, &why), SIEVE_EINVAL);
    assert_string_equal(why, "stale: extensions or limits changed");
    /* a compile-time limit changed */
    memset(&l, 0, sizeof(l));
    l.max_nesting = 3;
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, strlen(text), &l,
                                     NULL, &d, &why), SIEVE_EINVAL);
    memset(&l, 0, sizeof(l));
    l.max_script_size = 10;
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, strlen(text), &l,
                                     NULL, &d, &why), SIEVE_EINVAL);
    /* run-time limits do not make it stale, and apply */
    memset(&l, 0, sizeof(l));
    l.max_actions = 7;
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, strlen(text), &l,
                                     NULL, &d, &why), SIEVE_OK);
    sieve_script_free(&d);
    /* another format version */
    bc.s[8] = (char)(SIEVE_BC_VERSION + 1);
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, strlen(text), NULL,
                                     NULL, &d, &why), SIEVE_EINVAL);
    assert_string_equal(why, "stale: another format version");
    assert_null(d);
    strarray_fini(&few);
    sieve_script_free(&s);
    buf_free(&bc);
}

/* the loader's form: the caller's text hash and extension mask stand
 * for the text and the list; a damaged payload is caught by its checksum
 * when the text is current, a changed text is stale before any sum */
static void test_decode_known(void **state)
{
    struct sieve_script *s = NULL, *d = NULL;
    struct buf bc = BUF_INITIALIZER;
    struct strarray few = STRARRAY_INITIALIZER;
    const char *text = "require \"fileinto\"; fileinto \"A\";";
    size_t len = strlen(text);
    uint64_t h = sieve_bc_hash(text, len);
    uint32_t all = sieve_bc_extmask(NULL);
    const char *why = NULL;

    (void)state;
    /* the format's hash, pinned: the same on every host (a change makes
     * every stored file stale, so it goes with a new format version) */
    assert_true(sieve_bc_hash("", 0) == 0x5349455642430002ULL);
    assert_true(sieve_bc_hash("abc", 3) == 0xe7fc3951d6b8af3bULL);
    assert_true(h == 0xe95cb3c3e9279c01ULL);
    encode_text(text, NULL, &s, &bc);
    assert_int_equal(sieve_bc_decode_known(bc.s, bc.len, len, h, all, NULL,
                                           &d, &why), SIEVE_OK);
    assert_non_null(d);
    sieve_script_free(&d);
    /* the same hash as the full form computes */
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, text, len, NULL, NULL,
                                     &d, &why), SIEVE_OK);
    sieve_script_free(&d);
    assert_int_equal(sieve_bc_decode_known(bc.s, bc.len, len, h + 1, all,
                                           NULL, &d, &why), SIEVE_EINVAL);
    assert_null(d);
    assert_string_equal(why, "stale: source changed");
    strarray_append(&few, "fileinto");
    assert_int_not_equal(sieve_bc_extmask(&few), all);
    assert_int_equal(sieve_bc_decode_known(bc.s, bc.len, len, h,
                                           sieve_bc_extmask(&few), NULL, &d,
                                           &why), SIEVE_EINVAL);
    assert_string_equal(why, "stale: extensions or limits changed");
    /* the last payload byte damaged: the checksum, for the current text */
    bc.s[bc.len - 1] ^= 0x40;
    assert_int_equal(sieve_bc_decode_known(bc.s, bc.len, len, h, all, NULL,
                                           &d, &why), SIEVE_EINVAL);
    assert_null(d);
    assert_string_equal(why, "corrupt: checksum mismatch");
    /* and stale first when the text changed too */
    assert_int_equal(sieve_bc_decode_known(bc.s, bc.len, len + 1, h, all,
                                           NULL, &d, &why), SIEVE_EINVAL);
    assert_string_equal(why, "stale: source changed");
    strarray_fini(&few);
    sieve_script_free(&s);
    buf_free(&bc);
}

/* every truncation, every bit flip: rejected */
static void test_truncated_and_flipped(void **state)
{
    struct sieve_script *s = NULL, *d = NULL;
    struct buf bc = BUF_INITIALIZER;
    const char *why;
    char *copy;
    size_t i, len = strlen(rich_script);
    int bit;

    (void)state;
    encode_text(rich_script, NULL, &s, &bc);
    copy = malloc(bc.len);
    assert_non_null(copy);
    for (i = 0; i < bc.len; i++) {
        /* an exact-size copy, so that ASan sees a read past the end */
        char *t = malloc(i ? i : 1);
        assert_non_null(t);
        memcpy(t, bc.s, i);
        why = NULL;
        assert_int_equal(sieve_bc_decode(t, i, rich_script, len, NULL, NULL,
                                         &d, &why), SIEVE_EINVAL);
        assert_null(d);
        assert_non_null(why);
        free(t);
    }
    for (i = 0; i < bc.len; i++) {
        for (bit = 0; bit < 8; bit++) {
            memcpy(copy, bc.s, bc.len);
            copy[i] ^= (char)(1 << bit);
            assert_int_not_equal(sieve_bc_decode(copy, bc.len, rich_script,
                                                 len, NULL, NULL, &d, &why),
                                 SIEVE_OK);
            assert_null(d);
        }
    }
    free(copy);
    sieve_script_free(&s);
    buf_free(&bc);
}

/* payload bytes changed and the checksum made to match (what a bug or a
 * deliberate edit could write): the decoder must refuse or hand back a
 * tree that executes without a fault */
static void test_damaged_behind_checksum(void **state)
{
    static const unsigned char vals[] = { 0x00, 0x01, 0x02, 0x7f, 0x80, 0xff };
    struct sieve_script *s = NULL, *d = NULL;
    struct buf bc = BUF_INITIALIZER, out = BUF_INITIALIZER;
    const char *why;
    char *copy;
    size_t i, v, len = strlen(rich_script);
    unsigned accepted = 0, refused = 0;

    (void)state;
    encode_text(rich_script, NULL, &s, &bc);
    copy = malloc(bc.len);
    assert_non_null(copy);
    for (i = SIEVE_BC_HEADER; i < bc.len; i++) {
        for (v = 0; v <= sizeof(vals); v++) {
            uint32_t crc;
            unsigned char nb = v < sizeof(vals) ? vals[v]
                                : (unsigned char)(bc.s[i] ^ 0x01);
            if (nb == (unsigned char)bc.s[i])
                continue;
            memcpy(copy, bc.s, bc.len);
            copy[i] = (char)nb;
            crc = sieve_bc_checksum(copy, bc.len - SIEVE_BC_HEADER);
            copy[60] = (char)crc;
            copy[61] = (char)(crc >> 8);
            copy[62] = (char)(crc >> 16);
            copy[63] = (char)(crc >> 24);
            why = NULL;
            if (sieve_bc_decode(copy, bc.len, rich_script, len, NULL, NULL,
                                &d, &why) == SIEVE_OK) {
                accepted++;
                run_script(d, &out);
                sieve_script_free(&d);
            } else {
                assert_non_null(why);
                assert_null(d);
                refused++;
            }
        }
    }
    /* both paths taken: damage the checks see (counts, references,
     * shapes) and damage that is still a valid tree (a string's bytes) */
    printf("# %u damaged forms refused, %u decoded and run\n", refused,
           accepted);
    assert_true(refused > 0 && accepted > 0);
    free(copy);
    sieve_script_free(&s);
    buf_free(&bc);
    buf_free(&out);
}

/* the source identity: unknown (0, 0) as encoded; set, it is read back
 * without a decode, covered by the checksum, and changes nothing else */
static void test_source(void **state)
{
    struct sieve_script *s = NULL, *d = NULL;
    struct buf bc = BUF_INITIALIZER, a = BUF_INITIALIZER, b = BUF_INITIALIZER;
    const char *why = NULL;
    size_t len = strlen(rich_script);
    uint64_t tl, th, ino;
    int64_t mt;

    (void)state;
    encode_text(rich_script, NULL, &s, &bc);
    run_script(s, &a);
    assert_int_equal(sieve_bc_source(bc.s, bc.len, &tl, &th, &ino, &mt), 0);
    assert_int_equal(tl, len);
    assert_true(th == sieve_bc_hash(rich_script, len));
    assert_true(ino == 0 && mt == 0);
    assert_int_equal(sieve_bc_set_source(bc.s, bc.len, 123456789012ULL,
                                         -5), 0);
    assert_int_equal(sieve_bc_source(bc.s, bc.len, &tl, &th, &ino, &mt), 0);
    assert_true(ino == 123456789012ULL && mt == -5);
    assert_int_equal(sieve_bc_set_source(bc.s, bc.len, 42,
                                         1795796638123456789LL), 0);
    assert_int_equal(sieve_bc_source(bc.s, bc.len, &tl, &th, &ino, &mt), 0);
    assert_true(ino == 42 && mt == 1795796638123456789LL);
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, rich_script, len, NULL,
                                     NULL, &d, &why), SIEVE_OK);
    assert_string_equal(run_script(d, &b), buf_cstring(&a));
    sieve_script_free(&d);
    /* a changed identity byte is damage the checksum sees */
    bc.s[70] ^= 1;
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, rich_script, len, NULL,
                                     NULL, &d, &why), SIEVE_EINVAL);
    assert_string_equal(why, "corrupt: checksum mismatch");
    /* not a stored form of this version, or a wrong length: refused */
    assert_int_equal(sieve_bc_source(bc.s, bc.len - 1, &tl, &th, &ino, &mt),
                     -1);
    assert_int_equal(sieve_bc_set_source(bc.s, 10, 1, 1), -1);
    bc.s[8]++;
    assert_int_equal(sieve_bc_source(bc.s, bc.len, &tl, &th, &ino, &mt), -1);
    sieve_script_free(&s);
    buf_free(&bc);
    buf_free(&a);
    buf_free(&b);
}

/* the size hint: what the loaded tree takes, so that it is one
 * allocation; a wrong hint (too small, 0, absurd) with the checksum made
 * to match costs only more chunks: the tree runs the same */
static void test_size_hint(void **state)
{
    static const uint32_t wrong[] = { 0, 1, 16, 0xFFFFFFFFu };
    struct sieve_script *s = NULL, *d = NULL;
    struct buf bc = BUF_INITIALIZER, a = BUF_INITIALIZER, b = BUF_INITIALIZER;
    const struct sv_chunk *c;
    const char *why = NULL;
    size_t len = strlen(rich_script), i, chunks, used;
    unsigned char *f;
    uint32_t hint, crc;

    (void)state;
    encode_text(rich_script, NULL, &s, &bc);
    run_script(s, &a);
    f = (unsigned char *)bc.s;
    hint = (uint32_t)f[44] | (uint32_t)f[45] << 8 | (uint32_t)f[46] << 16 |
           (uint32_t)f[47] << 24;
    assert_true(hint > bc.len);
    /* the checksum is the format's: the payload's CRC-32C, then the hint,
     * then the source identity */
    assert_int_equal(sieve_bc_checksum(f, bc.len - SIEVE_BC_HEADER),
                     crc32c_final(crc32c_update(crc32c_update(
                         crc32c_update(CRC32C_INIT, f + SIEVE_BC_HEADER,
                                       bc.len - SIEVE_BC_HEADER), f + 44, 4),
                         f + 64, 16)));
    assert_int_equal(sieve_bc_decode(bc.s, bc.len, rich_script, len, NULL,
                                     NULL, &d, &why), SIEVE_OK);
    for (chunks = 0, used = 0, c = d->chunks; c; c = c->next, chunks++)
        used += c->used;
    assert_int_equal(chunks, 1);
    assert_int_equal(used, hint);
    assert_int_equal(d->chunks->size, hint);
    sieve_script_free(&d);
    for (i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        f[44] = (unsigned char)wrong[i];
        f[45] = (unsigned char)(wrong[i] >> 8);
        f[46] = (unsigned char)(wrong[i] >> 16);
        f[47] = (unsigned char)(wrong[i] >> 24);
        /* a changed hint alone is damage the checksum sees */
        assert_int_equal(sieve_bc_decode(bc.s, bc.len, rich_script, len,
                                         NULL, NULL, &d, &why), SIEVE_EINVAL);
        assert_string_equal(why, "corrupt: checksum mismatch");
        crc = sieve_bc_checksum(f, bc.len - SIEVE_BC_HEADER);
        f[60] = (unsigned char)crc;
        f[61] = (unsigned char)(crc >> 8);
        f[62] = (unsigned char)(crc >> 16);
        f[63] = (unsigned char)(crc >> 24);
        assert_int_equal(sieve_bc_decode(bc.s, bc.len, rich_script, len,
                                         NULL, NULL, &d, &why), SIEVE_OK);
        assert_string_equal(run_script(d, &b), buf_cstring(&a));
        for (chunks = 0, c = d->chunks; c; c = c->next)
            chunks++;
        assert_true(wrong[i] == 0xFFFFFFFFu || wrong[i] == 0 ||
                    chunks > 1);
        sieve_script_free(&d);
    }
    sieve_script_free(&s);
    buf_free(&bc);
    buf_free(&a);
    buf_free(&b);
}

/* not a compiled form at all */
static void test_garbage(void **state)
{
    struct sieve_script *d = NULL;
    const char *why = NULL;
    char zeros[200];

    (void)state;
    memset(zeros, 0, sizeof(zeros));
    assert_int_equal(sieve_bc_decode(zeros, sizeof(zeros), "", 0, NULL, NULL,
                                     &d, &why), SIEVE_EINVAL);
    assert_int_equal(sieve_bc_decode(rich_script, strlen(rich_script), "", 0,
                                     NULL, NULL, &d, &why), SIEVE_EINVAL);
    assert_int_equal(sieve_bc_decode(NULL, 0, "", 0, NULL, NULL, &d, &why),
                     SIEVE_EINVAL);
    assert_null(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_stale),
        cmocka_unit_test(test_decode_known),
        cmocka_unit_test(test_truncated_and_flipped),
        cmocka_unit_test(test_damaged_behind_checksum),
        cmocka_unit_test(test_size_hint),
        cmocka_unit_test(test_source),
        cmocka_unit_test(test_garbage),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
