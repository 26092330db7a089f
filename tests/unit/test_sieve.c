/*
 * test_sieve.c - unit tests of the Sieve library (sieve/): compile errors
 * and their line numbers, every limit of struct sieve_limits, bounded
 * glob matching, the size bound of :regex keys, temporary failures of callbacks, runtime errors giving
 * the implicit keep, reuse of one compiled script, the allowed-extension
 * list, and every prefix and many mutations of a script compiled and run
 * without a crash (run under the sanitizer build too).
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
#include "lib/strarray.h"
#include "sieve/sieve.h"
#include "sieve/sieve_msg.h"
#include "sieve/sieve_tree.h"

static const char msg_text[] =
    "From: \"A\" <a+x@example.org>\r\n"
    "To: b@example.com\r\n"
    "Subject: hello world\r\n"
    "Message-ID: <m1@example.org>\r\n"
    "\r\n"
    "body text\r\n";

/* compile; return the code, errmsg into err */
static int compile(const char *text, const struct sieve_limits *l,
                   struct sieve_script **s, struct buf *err)
{
    return sieve_compile(text, strlen(text), l, NULL, s, err);
}

/* compile and run against msg_text; the formatted actions into out */
static int run(const char *text, const struct sieve_limits *l,
               struct buf *out, struct buf *err)
{
    struct sieve_script *s = NULL;
    struct sieve_msg m;
    struct sieve_message_ctx ctx;
    struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
    int rc = compile(text, l, &s, err);

    if (rc != SIEVE_OK)
        return rc;
    sieve_msg_init(&m, msg_text, sizeof(msg_text) - 1);
    m.env_from = "a@example.org";
    strarray_append(&m.env_to, "b@example.com");
    sieve_msg_ctx(&m, &ctx);
    rc = sieve_execute(s, &ctx, &acts, err);
    buf_reset(out);
    assert_int_equal(sieve_actions_format(&acts, out), 0);
    sieve_actions_fini(&acts);
    sieve_msg_fini(&m);
    sieve_script_free(&s);
    assert_null(s);
    return rc;
}

/* The header is indexed once, at the first lookup: every field listed
 * (also one without a value, folded ones as one), each value unfolded
 * and decoded when first asked for and served from then on; the answers
 * are those of a scan (repeated fields in order, names case-blind). */
static void test_header_index(void **state)
{
    static const char msg[] =
        "Subject: =?utf-8?q?caf=C3=A9?= day\r\n"
        "X-A: one\r\n"
        "x-a:  two\r\n\tfolded \r\n"
        "Empty:\r\n"
        "no colon here\r\n"
        "X-A: three\r\n"
        "\r\n"
        "X-A: in the body\r\n";
    struct sieve_msg m;
    struct sieve_message_ctx ctx;
    struct strarray v = STRARRAY_INITIALIZER;
    int round;

    (void)state;
    sieve_msg_init(&m, msg, sizeof(msg) - 1);
    sieve_msg_ctx(&m, &ctx);
    assert_int_equal(m.indexed, 0);
    for (round = 0; round < 2; round++) {
        assert_int_equal(ctx.header(ctx.rock, "X-A", 0, &v), 0);
        assert_int_equal(m.indexed, 1);
        assert_int_equal(m.nfields, 5);
        assert_int_equal(v.count, 3);
        assert_string_equal(v.data[0], "one");
        assert_string_equal(v.data[1], "two\tfolded");
        assert_string_equal(v.data[2], "three");
        strarray_fini(&v);
        /* decoded without an encoded word: the same, unfolded, trimmed */
        assert_int_equal(ctx.header(ctx.rock, "x-a", 1, &v), 0);
        assert_int_equal(v.count, 3);
        assert_string_equal(v.data[0], "one");
        assert_string_equal(v.data[1], "two\tfolded");
        assert_string_equal(v.data[2], "three");
        strarray_fini(&v);
        assert_int_equal(ctx.header(ctx.rock, "subject", 1, &v), 0);
        assert_int_equal(v.count, 1);
        assert_string_equal(v.data[0], "caf\xc3\xa9 day");
        strarray_fini(&v);
        assert_int_equal(ctx.header(ctx.rock, "Subject", 0, &v), 0);
        assert_string_equal(v.data[0], "=?utf-8?q?caf=C3=A9?= day");
        strarray_fini(&v);
        assert_int_equal(ctx.header(ctx.rock, "empty", 0, &v), 0);
        assert_int_equal(v.count, 1);
        assert_string_equal(v.data[0], "");
        strarray_fini(&v);
        assert_int_equal(ctx.header(ctx.rock, "no colon here", 0, &v), 0);
        assert_int_equal(v.count, 0);
    }
    assert_int_equal(m.nfields, 5);
    sieve_msg_fini(&m);
    assert_null(m.fields);
    assert_int_equal(m.indexed, 0);
}

/* header_view(): the same answers as header(), decoded; a name asked
 * for again is answered from the views kept (case-blind), also past the
 * point where the table of names is full and starts over, and for a
 * name too long to be kept; a missing header has no values */
static void test_header_view(void **state)
{
    static const char msg[] =
        "Subject: =?utf-8?q?caf=C3=A9?= day\r\n"
        "X-A: one\r\n"
        "x-a:  two\r\n\tfolded \r\n"
        "X-Very-Long-Header-Name-Beyond-Thirty-Two: long\r\n"
        "H0: v0\r\nH1: v1\r\nH2: v2\r\nH3: v3\r\nH4: v4\r\n"
        "H5: v5\r\nH6: v6\r\nH7: v7\r\nH8: v8\r\nH9: v9\r\n"
        "X-A: three\r\n"
        "\r\n"
        "X-A: in the body\r\n";
    struct sieve_msg m;
    struct sieve_message_ctx ctx;
    const char *const *v;
    size_t n;
    int round, k;
    char name[8], val[8];

    (void)state;
    sieve_msg_init(&m, msg, sizeof(msg) - 1);
    sieve_msg_ctx(&m, &ctx);
    assert_non_null(ctx.header_view);
    for (round = 0; round < 3; round++) {
        assert_int_equal(ctx.header_view(ctx.rock, round ? "x-A" : "X-A",
                                         &v, &n), 0);
        assert_int_equal(n, 3);
        assert_string_equal(v[0], "one");
        assert_string_equal(v[1], "two\tfolded");
        assert_string_equal(v[2], "three");
        assert_int_equal(ctx.header_view(ctx.rock, "SUBJECT", &v, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(v[0], "caf\xc3\xa9 day");
        assert_int_equal(ctx.header_view(ctx.rock, "missing", &v, &n), 0);
        assert_int_equal(n, 0);
        assert_int_equal(ctx.header_view(
            ctx.rock, "x-very-long-header-name-beyond-thirty-two", &v, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(v[0], "long");
        if (round == 0)   /* kept: X-A, SUBJECT, missing; not the long one */
            assert_int_equal(m.nviews, 3);
        /* more names than the table holds: it starts over */
        for (k = 0; k < 10; k++) {
            snprintf(name, sizeof(name), "h%d", k);
            snprintf(val, sizeof(val), "v%d", k);
            assert_int_equal(ctx.header_view(ctx.rock, name, &v, &n), 0);
            assert_int_equal(n, 1);
            assert_string_equal(v[0], val);
        }
        assert_true(m.nviews <= SIEVE_MSG_VIEWS);
    }
    assert_int_equal(ctx.header_view(ctx.rock, "h9", &v, &n), 0);
    assert_string_equal(v[0], "v9");
    sieve_msg_fini(&m);
    assert_null(m.view);
    assert_int_equal(m.nviews, 0);
}

static void test_compile_errors(void **state)
{
    static const struct { const char *text; int rc; const char *prefix; }
    cases[] = {
        { "keep;\nfrob;\n", SIEVE_ESYNTAX, "line 2: unknown command" },
        { "if true {\n\n  fileinto \"x\";\n}", SIEVE_ESYNTAX, "line 3: " },
        { "require \"nonesuch\";", SIEVE_ESYNTAX, "line 1: unsupported" },
        { "keep;\nrequire \"fileinto\";", SIEVE_ESYNTAX, "line 2: require" },
        { "if header :bogus \"a\" \"b\" { }", SIEVE_ESYNTAX, "line 1: unknown" },
        { "\n\n\"abc", SIEVE_ESYNTAX, "line 3: unterminated string" },
        { "if size :over 5Q { }", SIEVE_ESYNTAX, "line 1: bad number" },
        { "redirect 5;", SIEVE_ESYNTAX, "line 1: argument 1" },
        { "stop", SIEVE_ESYNTAX, "line 1: expected" },
        { "", SIEVE_OK, "" },
    };
    struct buf err = BUF_INITIALIZER;
    size_t i;
    (void)state;

    /* NUL bytes: in a comment, in a multi-line string */
    {
        struct sieve_script *s = NULL;
        assert_int_equal(sieve_compile("keep; # a\0b\n", 12, NULL, NULL, &s,
                                       &err), SIEVE_ESYNTAX);
        assert_string_equal(buf_cstring(&err), "line 1: NUL byte in script");
        assert_int_equal(sieve_compile("require \"reject\";\nreject text:\n"
                                       "a\0\n.\n;", 37, NULL, NULL, &s, &err),
                         SIEVE_ESYNTAX);
        assert_string_equal(buf_cstring(&err), "line 3: NUL byte in script");
        assert_null(s);
    }
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sieve_script *s = (struct sieve_script *)&err; /* poison */
        int rc = compile(cases[i].text, NULL, &s, &err);
        if (rc != cases[i].rc || strncmp(buf_cstring(&err), cases[i].prefix,
                                         strlen(cases[i].prefix)) != 0)
            fail_msg("case %zu: rc %d err \"%s\"", i, rc, buf_cstring(&err));
        if (rc == SIEVE_OK)
            assert_non_null(s);
        else
            assert_null(s);
        sieve_script_free(&s);
    }
    buf_free(&err);
}

static void test_numbers_and_strings(void **state)
{
    struct buf out = BUF_INITIALIZER, err = BUF_INITIALIZER;
    (void)state;

    /* the message is ~120 bytes: under 1K, over 100 */
    assert_int_equal(run("if allof (size :under 1K, size :over 100,"
                         " size :under 1M, size :under 1G) { discard; }",
                         NULL, &out, &err), SIEVE_OK);
    assert_string_equal(buf_cstring(&out), "discard\n");
    /* multi-line string with CRLF, dot-stuffing, hash comment */
    assert_int_equal(run("require \"reject\";\r\nreject text: # c\r\n"
                         "a\r\n..b\r\n.\r\n;", NULL, &out, &err), SIEVE_OK);
    assert_string_equal(buf_cstring(&out), "reject \"a\\n.b\\n\"\n");
    /* encoded characters */
    assert_int_equal(run("require [\"encoded-character\", \"reject\"];"
                         "reject \"${hex:41 42}${unicode:263a}${hex:9}\";",
                         NULL, &out, &err), SIEVE_OK);
    assert_string_equal(buf_cstring(&out),
                        "reject \"AB\xe2\x98\xba\t\"\n");
    buf_free(&out);
    buf_free(&err);
}

static void test_glob_bounded(void **state)
{
    struct strarray caps = STRARRAY_INITIALIZER;
    unsigned long steps = 0;
    char *s, *p;
    size_t i, slen = 20000, plen;
    (void)state;

    assert_int_equal(sieve_glob("a*c?e", 5, "abbbcde", 7, 0, &caps, &steps,
                                1000000), 1);
    assert_int_equal(caps.count, 3);
    assert_string_equal(caps.data[1], "bbb");
    assert_string_equal(caps.data[2], "d");
    strarray_fini(&caps);
    /* shortest match for the first star (RFC 5229 3.2) */
    assert_int_equal(sieve_glob("[*] *", 5, "[a] [b] c", 9, 0, &caps, &steps,
                                1000000), 1);
    assert_string_equal(caps.data[1], "a");
    assert_string_equal(caps.data[2], "[b] c");
    strarray_fini(&caps);
    assert_int_equal(sieve_glob("A\\*", 3, "a*", 2, 1, NULL, &steps,
                                1000000), 1);
    assert_int_equal(sieve_glob("A\\*", 3, "ab", 2, 1, NULL, &steps,
                                1000000), 0);

    /* "*a*a*...*b" against 20,000 a's: no match, within (p+1)(s+1) steps */
    plen = 41;
    p = malloc(plen + 1);
    s = malloc(slen + 1);
    assert_non_null(p);
    assert_non_null(s);
    for (i = 0; i < 20; i++) {
        p[2 * i] = '*';
        p[2 * i + 1] = 'a';
    }
    p[40] = 'b';
    p[41] = '\0';
    memset(s, 'a', slen);
    s[slen] = '\0';
    steps = 0;
    assert_int_equal(sieve_glob(p, plen, s, slen, 0, NULL, &steps,
                                (unsigned long)-1), 0);
    assert_true(steps <= (plen + 1) * (slen + 1));
    /* and the step budget stops it */
    steps = 0;
    assert_int_equal(sieve_glob(p, plen, s, slen, 0, NULL, &steps, 1000), -2);
    free(p);
    free(s);
}

/* sieve_regex_refusal(): the expanded size glibc's regcomp() would
 * build, squared, and what it refuses outright */
/* :contains: the result, and the steps charged (klen per start position
 * looked at, up to and including the match), with the budget running out
 * at the same position as a byte-by-byte walk would */
static int ts_contains(int casemap, const char *v, const char *k,
                       unsigned long max, unsigned long *steps_r)
{
    unsigned long steps = 0;
    struct sv_matchctx mc;
    int r;

    memset(&mc, 0, sizeof(mc));
    mc.steps = &steps;
    mc.max_steps = max;
    mc.max_len = 1 << 20;
    r = sieve_match(&mc, casemap ? SV_CMP_CASEMAP : SV_CMP_OCTET,
                    SV_MATCH_CONTAINS, 0, v, strlen(v), k, strlen(k), NULL);
    *steps_r = steps;
    return r;
}

static void test_contains(void **state)
{
    unsigned long st;

    (void)state;
    assert_int_equal(ts_contains(0, "xxxxabc", "abc", 1000, &st), 1);
    assert_int_equal(st, 3 * 5);            /* positions 0..4 */
    assert_int_equal(ts_contains(0, "abc", "abc", 1000, &st), 1);
    assert_int_equal(st, 3);
    assert_int_equal(ts_contains(0, "xxxxxx", "ab", 1000, &st), 0);
    assert_int_equal(st, 2 * 5);            /* every position */
    assert_int_equal(ts_contains(0, "ab", "abc", 1000, &st), 0);
    assert_int_equal(st, 0);
    assert_int_equal(ts_contains(0, "anything", "", 1000, &st), 1);
    /* a first byte that starts the key, then a mismatch, then the match */
    assert_int_equal(ts_contains(0, "abxabc", "abc", 1000, &st), 1);
    assert_int_equal(st, 3 * 4);
    assert_int_equal(ts_contains(0, "XXABC", "abc", 1000, &st), 0);
    assert_int_equal(ts_contains(1, "XXABC", "abc", 1000, &st), 1);
    assert_int_equal(st, 3 * 3);
    assert_int_equal(ts_contains(1, "xxabc", "ABC", 1000, &st), 1);
    assert_int_equal(ts_contains(0, "a\xc3\xa9" "b", "\xc3\xa9", 1000, &st), 1);
    /* the budget: 10 positions x 3 = 30 steps to the match at 9 */
    assert_int_equal(ts_contains(0, "xxxxxxxxxabc", "abc", 30, &st), 1);
    assert_int_equal(ts_contains(0, "xxxxxxxxxabc", "abc", 29, &st), -1);
    assert_int_equal(ts_contains(0, "xxxxxxxxxxxx", "abc", 29, &st), -1);
    assert_int_equal(ts_contains(0, "xxxxxxxxxxxx", "abc", 30, &st), 0);
    assert_int_equal(st, 30);
}

static void test_regex_cost(void **state)
{
    static const struct {
        const char *re;
        unsigned long cost;
    } ok[] = {
        { "abc", 9 },
        { "a+", 9 },                  /* a a* : 3 positions */
        { "(ab)+", 49 },              /* (ab) is 3, +: 3*2+1 */
        { "a{1,100}", 101 * 101 },
        { "a{5,}", 49 },              /* 5 copies and a* */
        { "a{,3}", 16 },
        { "[a{]{5}", 36 },            /* a '{' in a bracket is a member */
        { "[]{]x", 4 },               /* ']' first is a member */
        { "[[:alpha:]]{2}", 9 },
        { "a|b", 9 },
        { "{5}", 9 },                 /* nothing to repeat: literals */
        { "a{x}", 16 },               /* not an interval */
        { "[\\1]", 1 },               /* no back-reference in a bracket */
        { "^[0-9]{1,3}(\\.[0-9]{1,3}){3}$", 0 },
    };
    unsigned long cost;
    char deep[80];
    size_t i;
    (void)state;

    for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        const char *why = sieve_regex_refusal(ok[i].re, strlen(ok[i].re),
                                              1000000, &cost);
        if (why)
            fail_msg("%s refused: %s", ok[i].re, why);
        if (ok[i].cost && cost != ok[i].cost)
            fail_msg("%s: cost %lu, want %lu", ok[i].re, cost, ok[i].cost);
    }
    /* the expansions that take gigabytes in regcomp() */
    assert_non_null(sieve_regex_refusal("a++++++++++++++++++++++++++++",
                                        28, 1000000, &cost));
    assert_non_null(sieve_regex_refusal("(a{1,999}){1,999}", 17, 1000000,
                                        &cost));
    assert_non_null(sieve_regex_refusal("a{1,1000}{1,1000}", 17, 1000000,
                                        &cost));
    assert_non_null(sieve_regex_refusal("x{99999999999999999999}", 23,
                                        1000000, &cost));
    assert_null(sieve_regex_refusal("a{1,999}", 8, 1000000, &cost));
    assert_non_null(sieve_regex_refusal("a{1,999}", 8, 999999, &cost));
    assert_non_null(sieve_regex_refusal("(a)\\1", 5, 1000000, &cost));
    memset(deep, '(', 33);
    deep[33] = 'a';
    memset(deep + 34, ')', 33);
    deep[67] = '\0';
    assert_non_null(sieve_regex_refusal(deep, 67, (unsigned long)-1, &cost));
    assert_null(sieve_regex_refusal(deep + 1, 65, (unsigned long)-1, &cost));
}

static void test_limits(void **state)
{
    struct sieve_limits l;
    struct sieve_script *s = NULL;
    struct buf err = BUF_INITIALIZER, out = BUF_INITIALIZER, text =
        BUF_INITIALIZER;
    unsigned i;
    (void)state;

    /* script size */
    memset(&l, 0, sizeof(l));
    l.max_script_size = 10;
    assert_int_equal(compile("keep; keep; keep;", &l, &s, &err), SIEVE_ELIMIT);
    /* nesting: 3 allowed, 4 refused */
    memset(&l, 0, sizeof(l));
    l.max_nesting = 3;
    assert_int_equal(compile("if true { if true { if true { keep; } } }", &l,
                             &s, &err), SIEVE_OK);
    sieve_script_free(&s);
    assert_int_equal(compile("if true { if true { if true { if true {"
                             " keep; } } } }", &l, &s, &err), SIEVE_ELIMIT);
    assert_int_equal(compile("if not not not not true { keep; }", &l, &s,
                             &err), SIEVE_ELIMIT);
    /* string length */
    memset(&l, 0, sizeof(l));
    l.max_string_len = 4;
    assert_int_equal(compile("redirect \"abcde@x\";", &l, &s, &err),
                     SIEVE_ELIMIT);
    /* actions */
    memset(&l, 0, sizeof(l));
    l.max_actions = 3;
    assert_int_equal(run("require \"fileinto\"; fileinto \"a\"; "
                         "fileinto \"b\"; fileinto \"c\";", &l, &out, &err),
                     SIEVE_OK);
    assert_int_equal(run("require \"fileinto\"; fileinto \"a\"; fileinto \"b\";"
                         " fileinto \"c\"; fileinto \"d\";", &l, &out, &err),
                     SIEVE_ERUNTIME);
    assert_string_equal(buf_cstring(&out), "keep implicit\n");
    assert_string_equal(buf_cstring(&err), "line 1: more than 3 actions");
    /* the implicit keep needs no room of its own past max_actions? it
     * does: 3 fileinto :copy + implicit keep = 4 > 3 */
    assert_int_equal(run("require [\"fileinto\", \"copy\"]; fileinto :copy "
                         "\"a\"; fileinto :copy \"b\"; fileinto :copy \"c\";",
                         &l, &out, &err), SIEVE_OK);
    assert_string_equal(buf_cstring(&out), "fileinto :copy \"a\"\nfileinto "
                        ":copy \"b\"\nfileinto :copy \"c\"\nkeep implicit\n");
    /* redirects */
    memset(&l, 0, sizeof(l));
    l.max_redirects = 2;
    assert_int_equal(run("redirect \"a@x.org\"; redirect \"b@x.org\";", &l,
                         &out, &err), SIEVE_OK);
    assert_int_equal(run("redirect \"a@x.org\"; redirect \"b@x.org\"; "
                         "redirect \"c@x.org\";", &l, &out, &err),
                     SIEVE_ERUNTIME);
    /* variables: count and length */
    memset(&l, 0, sizeof(l));
    l.max_variables = 2;
    l.max_variable_len = 3;
    assert_int_equal(run("require [\"variables\", \"reject\"]; set \"a\" "
                         "\"12345\"; set \"b\" \"x\"; reject \"${a}\";", &l,
                         &out, &err), SIEVE_OK);
    assert_string_equal(buf_cstring(&out), "reject \"123\"\n");
    assert_int_equal(run("require \"variables\"; set \"a\" \"1\"; set \"b\" "
                         "\"2\"; set \"c\" \"3\";", &l, &out, &err),
                     SIEVE_ERUNTIME);
    /* match steps */
    memset(&l, 0, sizeof(l));
    l.max_match_steps = 5;
    assert_int_equal(run("if header :matches \"subject\" \"*o*o*z\" "
                         "{ discard; }", &l, &out, &err), SIEVE_ERUNTIME);
    assert_string_equal(buf_cstring(&out), "keep implicit\n");
    /* regex value length */
    memset(&l, 0, sizeof(l));
    l.max_match_len = 5;
    assert_int_equal(run("require \"regex\"; if header :regex \"subject\" "
                         "\"^h\" { discard; }", &l, &out, &err),
                     SIEVE_ERUNTIME);
    /* a regexec() costs (value + 1) x positions of the expanded key:
     * "hello world" is 11 bytes, "^h.{1,100}" 103 positions */
    memset(&l, 0, sizeof(l));
    l.max_match_steps = 1000;
    assert_int_equal(run("require \"regex\"; if header :regex \"subject\" "
                         "\"^h.{1,10}\" { discard; }", &l, &out, &err),
                     SIEVE_OK);
    assert_string_equal(buf_cstring(&out), "discard\n");
    assert_int_equal(run("require \"regex\"; if header :regex \"subject\" "
                         "\"^h.{1,100}\" { discard; }", &l, &out, &err),
                     SIEVE_ERUNTIME);
    assert_string_equal(buf_cstring(&out), "keep implicit\n");
    /* regex size: each key alone within, together over */
    memset(&l, 0, sizeof(l));
    l.max_regex_cost = 20000;
    assert_int_equal(run("require \"regex\"; if header :regex \"subject\" "
                         "\"^h.{1,100}\" { discard; }", &l, &out, &err),
                     SIEVE_OK);
    assert_string_equal(buf_cstring(&out), "discard\n");
    assert_int_equal(compile("require \"regex\"; if header :regex "
                             "\"subject\" [\"^h.{1,100}\", \"^w.{1,100}\"] "
                             "{ discard; }", &l, &s, &err), SIEVE_ESYNTAX);
    assert_non_null(strstr(buf_cstring(&err), "too large together"));
    assert_int_equal(compile("require \"regex\"; if header :regex "
                             "\"subject\" \"a{1,200}\" { discard; }", &l, &s,
                             &err), SIEVE_ESYNTAX);
    assert_non_null(strstr(buf_cstring(&err), "repetitions are expanded"));
    /* built at run time: a runtime error, the implicit keep */
    assert_int_equal(run("require [\"regex\", \"variables\"]; set \"p\" "
                         "\"a{1,200}\"; if header :regex \"subject\" "
                         "\"${p}\" { discard; }", &l, &out, &err),
                     SIEVE_ERUNTIME);
    assert_string_equal(buf_cstring(&out), "keep implicit\n");
    /* a long script made of many commands still compiles */
    for (i = 0; i < 2000; i++)
        buf_appendcstr(&text, "keep;\n");
    assert_int_equal(compile(buf_cstring(&text), NULL, &s, &err), SIEVE_OK);
    sieve_script_free(&s);
    buf_free(&text);
    buf_free(&out);
    buf_free(&err);
}

/* ---- callbacks -------------------------------------------------------- */

static int tempfail_header(void *rock, const char *name, int decoded,
                           struct strarray *values)
{
    (void)rock; (void)name; (void)decoded; (void)values;
    return -1;
}

static int tempfail_header_view(void *rock, const char *name,
                                const char *const **values_r, size_t *n_r)
{
    (void)rock; (void)name; (void)values_r; (void)n_r;
    return -1;
}

static const struct sieve_script *self_script;

static int include_self(void *rock, int global, const char *name,
                        const struct sieve_script **script_r,
                        struct buf *errmsg)
{
    (void)rock; (void)global; (void)name; (void)errmsg;
    *script_r = self_script;
    return 1;
}

/* include "cN": chain[N] (distinct scripts, each including the next) */
static struct sieve_script *chain[6];

static int include_chain(void *rock, int global, const char *name,
                         const struct sieve_script **script_r,
                         struct buf *errmsg)
{
    int n = name[0] == 'c' ? atoi(name + 1) : -1;

    (void)rock; (void)global; (void)errmsg;
    if (n < 0 || n >= 6 || !chain[n])
        return 0;
    *script_r = chain[n];
    return 1;
}

static void test_callbacks(void **state)
{
    struct sieve_script *s = NULL;
    struct sieve_message_ctx ctx;
    struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
    struct buf err = BUF_INITIALIZER;
    struct sieve_limits l;
    (void)state;

    /* a temporary failure: SIEVE_ETEMP, no actions */
    assert_int_equal(compile("require \"fileinto\"; fileinto \"a\"; "
                             "if header :is \"x\" \"y\" { discard; }", NULL,
                             &s, &err), SIEVE_OK);
    memset(&ctx, 0, sizeof(ctx));
    ctx.header = tempfail_header;
    assert_int_equal(sieve_execute(s, &ctx, &acts, &err), SIEVE_ETEMP);
    assert_int_equal(acts.count, 0);
    /* the same through the borrowed view of the common header test */
    memset(&ctx, 0, sizeof(ctx));
    ctx.header_view = tempfail_header_view;
    assert_int_equal(sieve_execute(s, &ctx, &acts, &err), SIEVE_ETEMP);
    assert_int_equal(acts.count, 0);
    sieve_script_free(&s);

    /* NULL callbacks answer "nothing" */
    assert_int_equal(compile("require [\"envelope\", \"body\", \"mailbox\","
                             " \"duplicate\"]; if anyof (envelope \"to\" \"x\","
                             " body :contains \"a\", mailboxexists \"a\","
                             " duplicate, exists \"from\") { discard; }",
                             NULL, &s, &err), SIEVE_OK);
    memset(&ctx, 0, sizeof(ctx));
    assert_int_equal(sieve_execute(s, &ctx, &acts, &err), SIEVE_OK);
    assert_int_equal(acts.count, 1);
    assert_int_equal(acts.v[0].type, SIEVE_ACTION_KEEP);
    assert_true(acts.v[0].implicit);
    sieve_actions_fini(&acts);
    sieve_script_free(&s);

    /* a script including itself: a loop, found at once (RFC 6609 3.2) */
    memset(&l, 0, sizeof(l));
    l.max_include_depth = 3;
    assert_int_equal(compile("require \"include\"; include \"me\";", &l, &s,
                             &err), SIEVE_OK);
    self_script = s;
    memset(&ctx, 0, sizeof(ctx));
    ctx.include = include_self;
    assert_int_equal(sieve_execute(s, &ctx, &acts, &err), SIEVE_ERUNTIME);
    assert_string_equal(buf_cstring(&err), "line 1: include loop: \"me\" "
                        "is already being executed");
    assert_int_equal(acts.count, 1);
    assert_true(acts.v[0].implicit);
    sieve_actions_fini(&acts);
    sieve_script_free(&s);

    /* distinct scripts: nesting bounded by max_include_depth; within
     * it, a chain runs to its end */
    {
        char text[128];
        int i;

        for (i = 0; i < 6; i++) {
            if (i < 5)
                snprintf(text, sizeof(text), "require [\"include\", "
                         "\"editheader\"]; addheader \"X-C\" \"%d\"; "
                         "include \"c%d\";", i, i + 1);
            else
                snprintf(text, sizeof(text), "discard;");
            assert_int_equal(compile(text, &l, &chain[i], &err), SIEVE_OK);
        }
        memset(&ctx, 0, sizeof(ctx));
        ctx.include = include_chain;
        assert_int_equal(sieve_execute(chain[0], &ctx, &acts, &err),
                         SIEVE_ERUNTIME);
        assert_string_equal(buf_cstring(&err),
                            "line 1: include: deeper than 3 levels");
        sieve_actions_fini(&acts);
        assert_int_equal(sieve_execute(chain[2], &ctx, &acts, &err),
                         SIEVE_OK);
        /* c2, c3, c4 add a field each, c5 discards */
        assert_int_equal(acts.count, 4);
        assert_int_equal(acts.v[3].type, SIEVE_ACTION_DISCARD);
        sieve_actions_fini(&acts);
        for (i = 0; i < 6; i++)
            sieve_script_free(&chain[i]);
    }
    buf_free(&err);
}

static void test_reuse_and_allowed(void **state)
{
    struct sieve_script *s = NULL;
    struct buf err = BUF_INITIALIZER;
    struct strarray allowed = STRARRAY_INITIALIZER;
    const char *const *ext;
    int i, found = 0;
    (void)state;

    /* one compiled script, many executions with different messages */
    assert_int_equal(compile("require [\"fileinto\", \"variables\"];"
                             " if header :matches \"subject\" \"n*\""
                             " { fileinto \"${1}\"; }", NULL, &s, &err),
                     SIEVE_OK);
    for (i = 0; i < 200; i++) {
        char msg[128];
        struct sieve_msg m;
        struct sieve_message_ctx ctx;
        struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
        char want[32];
        snprintf(msg, sizeof(msg), "Subject: n%d\r\n\r\nx\r\n", i);
        sieve_msg_init(&m, msg, strlen(msg));
        sieve_msg_ctx(&m, &ctx);
        assert_int_equal(sieve_execute(s, &ctx, &acts, &err), SIEVE_OK);
        assert_int_equal(acts.count, 1);
        snprintf(want, sizeof(want), "%d", i);
        assert_string_equal(acts.v[0].mailbox, want);
        sieve_actions_fini(&acts);
        sieve_msg_fini(&m);
    }
    sieve_script_free(&s);

    /* an extension outside the allowed list is refused */
    strarray_append(&allowed, "reject");
    assert_int_equal(sieve_compile("require \"fileinto\";", 19, NULL,
                                   &allowed, &s, &err), SIEVE_ESYNTAX);
    assert_string_equal(buf_cstring(&err),
                        "line 1: unsupported extension \"fileinto\"");
    assert_int_equal(sieve_compile("require \"reject\";", 17, NULL,
                                   &allowed, &s, &err), SIEVE_OK);
    sieve_script_free(&s);
    strarray_fini(&allowed);

    /* the text form reports a buffer that cannot grow */
    {
        struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
        struct sieve_message_ctx ctx;
        struct buf small = BUF_INITIALIZER;
        assert_int_equal(compile("redirect \"a-long-address@example.org\";",
                                 NULL, &s, &err), SIEVE_OK);
        memset(&ctx, 0, sizeof(ctx));
        assert_int_equal(sieve_execute(s, &ctx, &acts, &err), SIEVE_OK);
        buf_set_max(&small, 10);
        assert_int_equal(sieve_actions_format(&acts, &small), -1);
        assert_true(small.len <= 10);
        buf_free(&small);
        sieve_actions_fini(&acts);
        sieve_script_free(&s);
    }

    for (ext = sieve_extensions(); *ext; ext++)
        if (strcmp(*ext, "vacation-seconds") == 0)
            found = 1;
    assert_true(found);
    assert_true(sieve_extension_supported("comparator-i;ascii-numeric"));
    assert_false(sieve_extension_supported("x-nonesuch"));
    assert_int_equal(sieve_compile(NULL, 3, NULL, NULL, &s, &err),
                     SIEVE_EINVAL);
    buf_free(&err);
}

static const char big_script[] =
    "require [\"fileinto\", \"reject\", \"envelope\", \"imap4flags\", "
    "\"variables\", \"relational\", \"comparator-i;ascii-numeric\", "
    "\"editheader\", \"date\", \"index\", \"regex\", \"body\", "
    "\"vacation\", \"subaddress\", \"encoded-character\"];\n"
    "# comment\n/* block */\n"
    "if anyof (header :matches \"subject\" \"*o w*\", address :detail "
    "\"from\" \"x\") {\n"
    "  set :upper \"v\" \"${1}\"; addflag [\"\\\\Seen\", \"$x\"];\n"
    "  fileinto :flags \"${v}\" \"INBOX.${hex:41}\";\n"
    "} elsif header :value \"ge\" :comparator \"i;ascii-numeric\" "
    "\"x-n\" \"5\" { reject text:\nno\n..\n.\n; }\n"
    "else { addheader :last \"X-A\" \"b\"; deleteheader :index 1 \"x-a\"; }\n"
    "if header :regex \"subject\" \"^h(.*)$\" { vacation :days 2 \"${1}\"; }\n"
    "if date :zone \"+0100\" \"date\" \"year\" \"2020\" { discard; }\n"
    "if body :text :contains \"body\" { keep; }\n";

/* every prefix, and byte mutations: compile, and run what compiles */
static void test_prefixes_and_mutations(void **state)
{
    struct buf out = BUF_INITIALIZER, err = BUF_INITIALIZER;
    size_t n = sizeof(big_script) - 1, i;
    char *copy = malloc(n + 1);
    unsigned seed = 7;
    int compiled = 0;
    (void)state;

    assert_int_equal(run(big_script, NULL, &out, &err), SIEVE_OK);
    assert_string_equal(buf_cstring(&out),
                        "fileinto :flags [ \"HELL\" ] \"INBOX.A\"\n"
                        "vacation :days 2 \"ello world\"\n"
                        "keep :flags [ \"\\\\Seen\", \"$x\" ]\n");
    assert_non_null(copy);
    for (i = 0; i <= n; i++) {
        memcpy(copy, big_script, i);
        copy[i] = '\0';
        if (run(copy, NULL, &out, &err) == SIEVE_OK)
            compiled++;
    }
    assert_true(compiled > 0);
    for (i = 0; i < 3000; i++) {
        size_t k;
        memcpy(copy, big_script, n + 1);
        for (k = 0; k < 3; k++) {
            seed = seed * 1103515245u + 12345u;
            copy[(seed >> 8) % n] = (char)(" \"\\{}[]();:,*$a0\n"[(seed >> 20) % 17]);
        }
        (void)run(copy, NULL, &out, &err);
    }
    free(copy);
    buf_free(&out);
    buf_free(&err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_errors),
        cmocka_unit_test(test_numbers_and_strings),
        cmocka_unit_test(test_glob_bounded),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_contains),
        cmocka_unit_test(test_regex_cost),
        cmocka_unit_test(test_callbacks),
        cmocka_unit_test(test_reuse_and_allowed),
        cmocka_unit_test(test_prefixes_and_mutations),
        cmocka_unit_test(test_header_index),
        cmocka_unit_test(test_header_view),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
