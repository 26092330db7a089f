/*
 * test_mboxname.c - unit tests of store/mboxname.c: every rule of a valid
 * name, both sides of every limit, internal <-> external conversion, owners,
 * LIST patterns (with a pathological one timed) and spool directories.
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "lib/buf.h"
#include "store/mboxname.h"
#include "store/store.h"

/* A name of `len` bytes: components of `part` bytes of 'a'..'z' joined by
 * '.', the last one possibly shorter.  Caller frees. */
static char *make_name(size_t len, size_t part)
{
    char *s = malloc(len + 1);
    size_t i, col = 0;

    assert_non_null(s);
    for (i = 0; i < len; i++) {
        if (col == part) {
            s[i] = '.';
            col = 0;
        } else {
            s[i] = (char)('a' + (i % 26));
            col++;
        }
    }
    s[len] = '\0';
    /* never end on a separator */
    if (len > 0 && s[len - 1] == '.')
        s[len - 1] = 'z';
    return s;
}

static void expect_bad(const char *name, const char *why)
{
    const char *err = (const char *)0x1;

    if (mboxname_check(name, &err) != STORE_BADNAME)
        fail_msg("accepted: \"%s\"", name ? name : "(null)");
    assert_non_null(err);
    if (why && strcmp(err, why) != 0)
        fail_msg("\"%s\": error \"%s\", expected \"%s\"", name, err, why);
    /* the error pointer may be NULL */
    assert_int_equal(mboxname_check(name, NULL), STORE_BADNAME);
}

static void expect_good(const char *name)
{
    const char *err = "poison";

    if (mboxname_check(name, &err) != STORE_OK)
        fail_msg("refused: \"%s\" (%s)", name, err ? err : "?");
    assert_null(err);
}

static void test_check_refused(void **state)
{
    char buf[64];

    (void)state;
    expect_bad(NULL, "empty name");
    expect_bad("", "empty name");
    expect_bad(".", "leading separator");
    expect_bad(".user", "leading separator");
    expect_bad("shared.", "trailing separator");
    expect_bad("shared..x", "empty component");
    expect_bad("a..", "empty component");
    expect_bad("user.", "empty user");
    expect_bad("user..x", "empty user");
    expect_bad("a/b", "'/' in name");
    expect_bad("/", "'/' in name");
    expect_bad("user.alice.*", "wildcard in name");
    expect_bad("user.al%ce", "wildcard in name");
    expect_bad("*", "wildcard in name");
    expect_bad("user.^", "component of only '^'");
    expect_bad("user.alice.^^", "component of only '^'");
    expect_bad("^.x", "component of only '^'");
    expect_bad("a\x7f" "b", "control byte");
    expect_bad("a\x01" "b", "control byte");
    expect_bad("a\tb", "control byte");
    expect_bad("a\nb", "control byte");
    expect_bad("a\x1f", "control byte");
    expect_bad("caf\xc3\xa9", "8-bit byte");
    expect_bad("a\x80", "8-bit byte");
    expect_bad("\xff", "8-bit byte");
    /* every control byte, one by one */
    for (int c = 1; c < 0x20; c++) {
        snprintf(buf, sizeof(buf), "user.a%cb", c);
        expect_bad(buf, "control byte");
    }
    for (int c = 0x80; c <= 0xff; c++) {
        snprintf(buf, sizeof(buf), "user.a%cb", c);
        expect_bad(buf, "8-bit byte");
    }
}

static void test_check_limits(void **state)
{
    char *s;
    char comp[MBOXNAME_PART_MAX + 2];

    (void)state;
    /* one component at the limit, and one byte over */
    memset(comp, 'c', sizeof(comp));
    comp[MBOXNAME_PART_MAX] = '\0';
    expect_good(comp);
    comp[MBOXNAME_PART_MAX] = 'c';
    comp[MBOXNAME_PART_MAX + 1] = '\0';
    expect_bad(comp, "component too long");
    {
        char nm[MBOXNAME_PART_MAX + 16];

        snprintf(nm, sizeof(nm), "user.%s.x", comp);
        expect_bad(nm, "component too long");
        comp[MBOXNAME_PART_MAX] = '\0';
        snprintf(nm, sizeof(nm), "user.%s.x", comp);
        expect_good(nm);
    }
    /* the whole name at the limit, and one byte over */
    s = make_name(MBOXNAME_MAX, 100);
    assert_int_equal(strlen(s), MBOXNAME_MAX);
    expect_good(s);
    free(s);
    s = make_name(MBOXNAME_MAX + 1, 100);
    expect_bad(s, "name too long");
    free(s);
    /* very long input: still refused (bounded scan) */
    s = make_name(100000, 50);
    expect_bad(s, "name too long");
    free(s);
}

static void test_check_accepted(void **state)
{
    (void)state;
    expect_good("INBOX");
    expect_good("user");
    expect_good("user.alice");
    expect_good("user.alice.Sent Items");
    expect_good("user.alice^smith.Drafts");
    expect_good("user.a.^x^");
    expect_good("shared.lists.~tilde");
    /* "DOMAIN!" prefix (more in test_userid.c) */
    expect_good("example.com!user.alice.Sent");
    expect_good("example.com!shared.news");
    /* '!' only as the separator of a valid lower-case domain */
    expect_bad("shared.lists.~tilde!", "bad byte in domain");
    expect_bad("!shared", "empty domain");
    expect_bad("user.alice.x!", "empty name");
    expect_bad("example.com!user.a!b", "'!' in name");
    expect_bad("Example.com!user.a", "upper-case domain");
    expect_good("x");
    expect_good(" ");
    expect_good("a&AOQ-b");   /* modified UTF-7 */
}

static void ext_roundtrip(const char *internal, int unixsep,
                          const char *external)
{
    struct buf out = BUF_INITIALIZER;
    const char *err = NULL;

    assert_int_equal(mboxname_to_external(internal, unixsep, &out), STORE_OK);
    assert_string_equal(buf_cstring(&out), external);
    assert_int_equal(mboxname_to_internal(external, unixsep, &out, &err),
                     STORE_OK);
    assert_null(err);
    assert_string_equal(buf_cstring(&out), internal);
    buf_free(&out);
}

static void ext_bad(const char *external, int unixsep, const char *why)
{
    struct buf out = BUF_INITIALIZER;
    const char *err = NULL;

    buf_setcstr(&out, "poison");
    assert_int_equal(mboxname_to_internal(external, unixsep, &out, &err),
                     STORE_BADNAME);
    assert_non_null(err);
    if (why)
        assert_string_equal(err, why);
    assert_int_equal(out.len, 0);
    buf_free(&out);
}

static void test_external(void **state)
{
    struct buf out = BUF_INITIALIZER;

    (void)state;
    ext_roundtrip("user.alice", 0, "user.alice");
    ext_roundtrip("user.alice.Sent", 0, "user.alice.Sent");
    ext_roundtrip("user.alice^smith", 0, "user.alice^smith");
    ext_roundtrip("user.alice", 1, "user/alice");
    ext_roundtrip("user.alice^smith", 1, "user/alice.smith");
    ext_roundtrip("user.alice^smith.Sent^Old.x", 1,
                  "user/alice.smith/Sent.Old/x");
    ext_roundtrip("shared", 1, "shared");

    /* without unixsep '/' is refused */
    ext_bad("user/alice", 0, "'/' in name");
    /* with unixsep, '^' is the internal spelling of '.' */
    ext_bad("user/al^ice", 1, "'^' in name");
    /* the converted name goes through the check */
    ext_bad("user//alice", 1, "empty user");
    ext_bad("user/alice/", 1, "trailing separator");
    ext_bad("/user", 1, "leading separator");
    ext_bad("user/.", 1, "component of only '^'");
    ext_bad("user/alice/..", 1, "component of only '^'");
    ext_bad("user..alice", 0, "empty user");
    ext_bad("", 1, "empty name");
    ext_bad("a*", 1, "wildcard in name");
    ext_bad("caf\xc3\xa9", 0, "8-bit byte");
    {
        char *s = make_name(MBOXNAME_MAX + 1, 100);

        ext_bad(s, 0, "name too long");
        free(s);
    }
    /* an invalid internal name has no external form */
    buf_setcstr(&out, "poison");
    assert_int_equal(mboxname_to_external("a..b", 1, &out), STORE_BADNAME);
    assert_int_equal(mboxname_to_external("a/b", 0, &out), STORE_BADNAME);
    buf_free(&out);
}

static void test_userid(void **state)
{
    struct buf u = BUF_INITIALIZER;

    (void)state;
    assert_int_equal(mboxname_userid("user.alice", &u), 1);
    assert_string_equal(buf_cstring(&u), "alice");
    assert_int_equal(mboxname_userid("user.bob.Sent.2024", &u), 1);
    assert_string_equal(buf_cstring(&u), "bob");
    assert_int_equal(mboxname_userid("user.a^b.x", &u), 1);
    assert_string_equal(buf_cstring(&u), "a^b");
    assert_int_equal(mboxname_userid("shared.alice", &u), 0);
    assert_int_equal(u.len, 0);
    buf_setcstr(&u, "poison");
    assert_int_equal(mboxname_userid("user", &u), 0);
    assert_int_equal(u.len, 0);
    assert_int_equal(mboxname_userid("users.alice", &u), 0);
    assert_int_equal(mboxname_userid("user.", &u), 0);
    assert_int_equal(mboxname_userid("user..x", &u), 0);
    assert_int_equal(mboxname_userid("user.alice", NULL), 1);

    assert_int_equal(mboxname_user_inbox("alice", &u), STORE_OK);
    assert_string_equal(buf_cstring(&u), "user.alice");
    assert_int_equal(mboxname_user_inbox("al^ice", &u), STORE_OK);
    assert_string_equal(buf_cstring(&u), "user.al^ice");
    assert_int_equal(mboxname_user_inbox("", &u), STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("a.b", &u), STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("a/b", &u), STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("^", &u), STORE_BADNAME);
    assert_int_equal(u.len, 0);
    buf_free(&u);
}

static void test_self_or_child(void **state)
{
    (void)state;
    assert_true(mboxname_is_self_or_child("user.a", "user.a"));
    assert_true(mboxname_is_self_or_child("user.a", "user.a.b"));
    assert_true(mboxname_is_self_or_child("user.a", "user.a.b.c"));
    assert_false(mboxname_is_self_or_child("user.a", "user.ab"));
    assert_false(mboxname_is_self_or_child("user.a", "user"));
    assert_false(mboxname_is_self_or_child("user.a.b", "user.a"));
    assert_false(mboxname_is_self_or_child("user.a", "user.b.a"));
}

static void test_match(void **state)
{
    (void)state;
    /* literal */
    assert_true(mboxname_match("user.alice", "user.alice", '.'));
    assert_false(mboxname_match("user.alice", "user.alicex", '.'));
    assert_false(mboxname_match("user.alice", "user.alic", '.'));
    /* '*' crosses the separator, '%' does not */
    assert_true(mboxname_match("*", "user.alice.Sent", '.'));
    assert_true(mboxname_match("user.*", "user.alice.Sent", '.'));
    assert_true(mboxname_match("%", "user", '.'));
    assert_false(mboxname_match("%", "user.alice", '.'));
    assert_true(mboxname_match("user.%", "user.alice", '.'));
    assert_false(mboxname_match("user.%", "user.alice.Sent", '.'));
    assert_false(mboxname_match("user.%", "user", '.'));
    assert_true(mboxname_match("user.%", "user.", '.'));   /* % may be empty */
    assert_true(mboxname_match("user.%.Sent", "user.bob.Sent", '.'));
    assert_false(mboxname_match("user.%.Sent", "user.bob.x.Sent", '.'));
    assert_true(mboxname_match("user.*.Sent", "user.bob.x.Sent", '.'));
    assert_true(mboxname_match("user.a%", "user.alice", '.'));
    assert_false(mboxname_match("user.a%", "user.bob", '.'));
    assert_true(mboxname_match("%.%", "user.alice", '.'));
    assert_false(mboxname_match("%.%", "user.alice.x", '.'));
    assert_true(mboxname_match("*e", "user.alice", '.'));
    assert_false(mboxname_match("*x", "user.alice", '.'));
    assert_true(mboxname_match("u*e*e", "user.alice", '.'));
    assert_true(mboxname_match("%*", "a.b.c", '.'));
    assert_true(mboxname_match("*%", "a.b.c", '.'));
    assert_true(mboxname_match("%%", "abc", '.'));
    assert_false(mboxname_match("%%", "a.c", '.'));
    assert_true(mboxname_match("", "", '.'));
    assert_false(mboxname_match("", "a", '.'));
    assert_true(mboxname_match("*", "", '.'));
    /* another separator */
    assert_true(mboxname_match("user/%", "user/alice", '/'));
    assert_false(mboxname_match("user/%", "user/alice/x", '/'));
    assert_true(mboxname_match("user/%", "user/alice.x", '/'));
    /* byte exact */
    assert_false(mboxname_match("USER.*", "user.alice", '.'));
    /* names longer than the matcher's stack rows */
    {
        char *s = make_name(2000, 150);
        char pat[16];

        assert_true(mboxname_match("*", s, '.'));
        snprintf(pat, sizeof(pat), "*%c", s[1999]);
        assert_true(mboxname_match(pat, s, '.'));
        assert_false(mboxname_match("%", s, '.'));
        free(s);
    }
}

static double now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The least time (of 5 runs, so a loaded machine's pauses drop out) of
 * `reps` non-matches of "*b*b...*bc" with `pairs` "*b" against name. */
static double match_time(const char *name, size_t pairs, int reps)
{
    char pat[2 * MBOXNAME_MAX + 2];
    double best = 1e9, t0, t;
    size_t i;
    int run, k;

    for (i = 0; i < pairs; i++) {
        pat[2 * i] = '*';
        pat[2 * i + 1] = 'b';
    }
    pat[2 * pairs] = 'c';
    pat[2 * pairs + 1] = '\0';
    for (run = 0; run < 5; run++) {
        t0 = now_sec();
        for (k = 0; k < reps; k++)
            assert_false(mboxname_match(pat, name, '.'));
        t = now_sec() - t0;
        if (t < best)
            best = t;
    }
    return best;
}

static void test_match_pathological(void **state)
{
    char name[MBOXNAME_MAX + 1];
    char pat[2 * MBOXNAME_MAX + 2];
    double t0, t;
    size_t i;
    int k;

    (void)state;
    /* twice the wildcards: a matcher polynomial in the pattern takes a
     * few times as long, a backtracking one C(30,12)/C(30,6) = 145 times
     * (on a name short enough for it to finish; measured first, so that
     * such a matcher fails here instead of hanging below); the
     * repetitions are chosen so that the first measure takes 10 ms here */
    {
        char shortname[31];
        double t6, t12;
        int reps = 1;

        memset(shortname, 'b', 30);
        shortname[30] = '\0';
        while ((t6 = match_time(shortname, 6, reps)) < 0.01 && reps < (1 << 24))
            reps *= 2;
        t12 = match_time(shortname, 12, reps);
        print_message("%d matches: 6 wildcards %.4f s, 12 wildcards %.4f s\n",
                      reps, t6, t12);
        if (t12 > 16 * t6)
            fail_msg("doubling the wildcards made matching %.0f times "
                     "slower (%.4f s -> %.4f s): exponential", t12 / t6, t6,
                     t12);
    }
    /* a name of one repeated byte with no 'a' at the end */
    memset(name, 'b', MBOXNAME_MAX);
    name[MBOXNAME_MAX] = '\0';
    for (i = 50; i < MBOXNAME_MAX; i += 51)
        name[i] = '.';
    /* "*%*%*%...a": a backtracking matcher takes exponential time */
    for (i = 0; i + 2 < sizeof(pat) / 2; i += 2) {
        pat[i] = '*';
        pat[i + 1] = '%';
    }
    pat[i] = 'a';
    pat[i + 1] = '\0';
    t0 = now_sec();
    for (k = 0; k < 100; k++)
        assert_false(mboxname_match(pat, name, '.'));
    /* "*b*b*b*...c": many literals, many positions */
    for (i = 0; i + 2 < 200; i += 2) {
        pat[i] = '*';
        pat[i + 1] = 'b';
    }
    pat[i] = 'c';
    pat[i + 1] = '\0';
    for (k = 0; k < 100; k++)
        assert_false(mboxname_match(pat, name, '.'));
    /* "%b%b%b...%c" the same with '%' */
    for (i = 0; i + 2 < 200; i += 2) {
        pat[i] = '%';
        pat[i + 1] = 'b';
    }
    for (k = 0; k < 100; k++)
        assert_false(mboxname_match(pat, name, '.'));
    t = now_sec() - t0;
    /* 300 matches; exponential behaviour would not finish at all.  No
     * bound in seconds (a slow or loaded machine would break it): the
     * growth is measured instead, below. */
    print_message("pathological patterns: %.3f s\n", t);
    /* and they still match when they should */
    name[MBOXNAME_MAX - 1] = 'c';
    assert_true(mboxname_match(pat, name, '.') == 0); /* % cannot cross '.' */
    for (i = 0; i + 2 < 200; i += 2)
        pat[i] = '*';
    assert_true(mboxname_match(pat, name, '.'));

}

static void test_spool_dir(void **state)
{
    struct buf out = BUF_INITIALIZER;

    (void)state;
    assert_int_equal(mboxname_spool_dir("/var/spool/imap", "user.alice.Sent",
                                        0, &out), STORE_OK);
    assert_string_equal(buf_cstring(&out), "/var/spool/imap/user/alice/Sent");
    assert_int_equal(mboxname_spool_dir("/var/spool/imap/", "shared", 0,
                                        &out), STORE_OK);
    assert_string_equal(buf_cstring(&out), "/var/spool/imap/shared");
    assert_int_equal(mboxname_spool_dir("/s", "user.alice.Sent", 1, &out),
                     STORE_OK);
    assert_string_equal(buf_cstring(&out), "/s/a/user/alice/Sent");
    assert_int_equal(mboxname_spool_dir("/s", "user.Bob", 1, &out),
                     STORE_OK);
    assert_string_equal(buf_cstring(&out), "/s/b/user/Bob");
    assert_int_equal(mboxname_spool_dir("/s", "shared.x", 1, &out), STORE_OK);
    assert_string_equal(buf_cstring(&out), "/s/s/shared/x");
    assert_int_equal(mboxname_spool_dir("/s", "user.9lives", 1, &out),
                     STORE_OK);
    assert_string_equal(buf_cstring(&out), "/s/q/user/9lives");
    assert_int_equal(mboxname_spool_dir("/s", "user.a^b", 0, &out), STORE_OK);
    assert_string_equal(buf_cstring(&out), "/s/user/a^b");
    assert_int_equal(mboxname_spool_dir("/s", "user", 1, &out), STORE_OK);
    assert_string_equal(buf_cstring(&out), "/s/u/user");
    /* invalid names never become paths */
    buf_setcstr(&out, "poison");
    assert_int_equal(mboxname_spool_dir("/s", "user..x", 0, &out),
                     STORE_BADNAME);
    assert_int_equal(mboxname_spool_dir("/s", "a/../../etc", 0, &out),
                     STORE_BADNAME);
    assert_int_equal(mboxname_spool_dir("/s", "user.^^", 0, &out),
                     STORE_BADNAME);
    assert_int_equal(out.len, 0);
    buf_free(&out);

    assert_int_equal(mboxname_hash_letter("user.alice"), 'a');
    assert_int_equal(mboxname_hash_letter("user.Zed.x"), 'z');
    assert_int_equal(mboxname_hash_letter("Shared"), 's');
    assert_int_equal(mboxname_hash_letter("user._x"), 'q');
    assert_int_equal(mboxname_hash_letter("~x"), 'q');
    assert_int_equal(mboxname_hash_letter("user"), 'u');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_refused),
        cmocka_unit_test(test_check_limits),
        cmocka_unit_test(test_check_accepted),
        cmocka_unit_test(test_external),
        cmocka_unit_test(test_userid),
        cmocka_unit_test(test_self_or_child),
        cmocka_unit_test(test_match),
        cmocka_unit_test(test_match_pathological),
        cmocka_unit_test(test_spool_dir),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
