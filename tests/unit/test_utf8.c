/*
 * test_utf8.c - lib/utf8.c: modified UTF-7 (RFC 3501 5.1.3) to and from
 * UTF-8, as imapd's UTF8=ACCEPT (RFC 6855) uses it for mailbox names:
 * known spellings both ways, round trips over every code point class,
 * and the malformed or non-canonical forms the decoder must refuse.
 * Inputs are copied into buffers of exactly their size, so that the
 * sanitizer build catches a read past the end.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lib/buf.h"
#include "lib/utf8.h"

static int to7(const char *in, size_t len, struct buf *out)
{
    char *copy = malloc(len ? len : 1);
    int r;

    assert_non_null(copy);
    memcpy(copy, in, len);
    buf_reset(out);
    r = utf8_to_mutf7(copy, len, out);
    free(copy);
    return r;
}

static int from7(const char *in, struct buf *out)
{
    size_t len = strlen(in);
    char *copy = malloc(len ? len : 1);
    int r;

    assert_non_null(copy);
    memcpy(copy, in, len);
    buf_reset(out);
    r = utf8_from_mutf7(copy, len, out);
    free(copy);
    return r;
}

static void both(const char *utf8, const char *m7)
{
    struct buf out = BUF_INITIALIZER;

    assert_int_equal(to7(utf8, strlen(utf8), &out), 0);
    assert_string_equal(buf_cstring(&out), m7);
    assert_int_equal(from7(m7, &out), 0);
    assert_string_equal(buf_cstring(&out), utf8);
    buf_free(&out);
}

static void test_known(void **state)
{
    (void)state;
    both("", "");
    both("INBOX", "INBOX");
    both("Entwürfe", "Entw&APw-rfe");
    both("R&D", "R&-D");
    both("&&", "&-&-");
    both("Brouillons été", "Brouillons &AOk-t&AOk-");
    both("Ünï", "&ANw-n&AO8-");
    /* RFC 3501 5.1.3's example */
    both("~peter/mail/\xe5\x8f\xb0\xe5\x8c\x97/\xe6\x97\xa5\xe6\x9c\xac"
         "\xe8\xaa\x9e", "~peter/mail/&U,BTFw-/&ZeVnLIqe-");
    /* outside the BMP: a surrogate pair */
    both("\xf0\x9f\x98\x80", "&2D3eAA-");
    both("a\xf0\x9f\x98\x80\xc3\xa9z", "a&2D3eAADp-z");
    both("\xc2\xa0", "&AKA-");
}

static void test_roundtrip(void **state)
{
    static const uint32_t cps[] = {
        0xa0, 0xff, 0x100, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfffd, 0xffff,
        0x10000, 0x10ffff
    };
    struct buf in = BUF_INITIALIZER, m7 = BUF_INITIALIZER,
               back = BUF_INITIALIZER;
    (void)state;

    /* every run length 1..6 of each code point, between ASCII letters */
    for (size_t k = 0; k < sizeof(cps) / sizeof(cps[0]); k++) {
        for (int n = 1; n <= 6; n++) {
            buf_reset(&in);
            buf_putc(&in, 'x');
            for (int j = 0; j < n; j++)
                utf8_put(&in, cps[(k + (size_t)j) % (sizeof(cps)
                                                     / sizeof(cps[0]))]);
            buf_putc(&in, '.');
            assert_int_equal(to7(in.s, in.len, &m7), 0);
            for (size_t i = 0; i < m7.len; i++)
                assert_true(m7.s[i] >= 0x20 && m7.s[i] <= 0x7e);
            assert_int_equal(from7(buf_cstring(&m7), &back), 0);
            assert_int_equal(back.len, in.len);
            assert_memory_equal(back.s, in.s, in.len);
        }
    }
    buf_free(&in);
    buf_free(&m7);
    buf_free(&back);
}

static void test_bad_utf8(void **state)
{
    static const char *const bad[] = {
        "\xff", "a\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
        "tab\t", "del\x7f", "nl\n", "\xc2\x80" /* U+0080, C1 control */,
        "\xc2\x9f"
    };
    struct buf out = BUF_INITIALIZER;
    (void)state;

    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        assert_int_equal(to7(bad[k], strlen(bad[k]), &out), -1);
    /* a NUL byte inside */
    assert_int_equal(to7("a\0b", 3, &out), -1);
    buf_free(&out);
}

static void test_bad_mutf7(void **state)
{
    static const char *const bad[] = {
        "&",            /* unterminated */
        "&AOk",         /* no closing '-' */
        "&AO-",         /* not a whole UTF-16 unit */
        "&AOl-",        /* non-zero padding bits */
        "&AOkA-",       /* a partial unit left over */
        "&AGE-",        /* "a" must be written directly */
        "&ACY-",        /* "&" must be "&-" */
        "&AAk-",        /* a control character */
        "&2D0-",        /* a lone high surrogate */
        "&3gA-",        /* a lone low surrogate */
        "&2D3YPQ-",     /* a high surrogate followed by another */
        "&AOk-&AOk-",   /* two runs in a row: one run is the spelling */
        "&AO/-",        /* '/' is ',' in modified base64 */
        "&AO=-",
        "caf\xc3\xa9",  /* 8-bit bytes */
        "a\tb"
    };
    struct buf out = BUF_INITIALIZER;
    (void)state;

    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        if (from7(bad[k], &out) != -1)
            fail_msg("accepted \"%s\"", bad[k]);
    /* "&-" right after a run is a literal '&', not a second run */
    assert_int_equal(from7("&AOk-&-", &out), 0);
    assert_string_equal(buf_cstring(&out), "\xc3\xa9&");
    buf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_bad_utf8),
        cmocka_unit_test(test_bad_mutf7),
    };
    return cmocka_run_group_tests_name("utf8", tests, NULL, NULL);
}
