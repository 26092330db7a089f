/*
 * test_userid.c - unit tests of store/userid.c and the virtual domain part
 * of store/mboxname.c: the domain rules on both sides of every limit, the
 * canonical user id under each virtdomains value, INBOX names, and the
 * session view of names (own domain, other domain, global admin).
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
#include "lib/imapconf.h"
#include "store/mboxname.h"
#include "store/store.h"
#include "store/userid.h"

/* A domain of `len` bytes made of labels of `label` bytes.  Caller frees. */
static char *make_domain(size_t len, size_t label)
{
    char *s = malloc(len + 1);
    size_t i, col = 0;

    assert_non_null(s);
    for (i = 0; i < len; i++) {
        if (col == label && i + 1 < len) {
            s[i] = '.';
            col = 0;
        } else {
            s[i] = (char)('a' + (i % 26));
            col++;
        }
    }
    s[len] = '\0';
    return s;
}

static void domain_bad(const char *d, const char *why)
{
    struct buf lower = BUF_INITIALIZER;
    const char *err = NULL;

    if (mboxname_domain_check(d, strlen(d), &lower, &err) != STORE_BADNAME)
        fail_msg("accepted domain \"%s\"", d);
    assert_non_null(err);
    if (why && strcmp(err, why) != 0)
        fail_msg("\"%s\": error \"%s\", expected \"%s\"", d, err, why);
    assert_int_equal(lower.len, 0);
    buf_free(&lower);
}

static void domain_good(const char *d, const char *lower_expected)
{
    struct buf lower = BUF_INITIALIZER;
    const char *err = NULL;

    if (mboxname_domain_check(d, strlen(d), &lower, &err) != STORE_OK)
        fail_msg("refused domain \"%s\" (%s)", d, err ? err : "?");
    assert_string_equal(buf_cstring(&lower), lower_expected);
    buf_free(&lower);
}

static void test_domain_rules(void **state)
{
    char *d;

    (void)state;
    domain_good("example.com", "example.com");
    domain_good("Example.COM", "example.com");
    domain_good("a-b.c-d.e9", "a-b.c-d.e9");
    domain_good("1.2", "1.2");
    domain_bad("", "empty domain");
    domain_bad(".", "empty domain label");
    domain_bad("example", "domain of one label");
    domain_bad(".example.com", "empty domain label");
    domain_bad("example.com.", "empty domain label");
    domain_bad("a..b", "empty domain label");
    domain_bad("-a.com", "domain label begins or ends with '-'");
    domain_bad("a-.com", "domain label begins or ends with '-'");
    domain_bad("[127.0.0.1]", "address literal as domain");
    domain_bad("a_b.com", "bad byte in domain");
    domain_bad("a!b.com", "bad byte in domain");
    domain_bad("a/b.com", "bad byte in domain");
    domain_bad("a b.com", "bad byte in domain");
    domain_bad("a@b.com", "bad byte in domain");
    domain_bad("\xc3\xa9.com", "bad byte in domain");
    /* a label of 63 bytes, then 64 */
    d = make_domain(63 + 4, 63);
    domain_good(d, d);
    free(d);
    d = make_domain(64 + 4, 64);
    domain_bad(d, "domain label too long");
    free(d);
    /* 253 bytes, then 254, and 300 */
    d = make_domain(253, 40);
    domain_good(d, d);
    free(d);
    d = make_domain(254, 40);
    domain_bad(d, "domain too long");
    free(d);
    d = make_domain(300, 40);
    domain_bad(d, "domain too long");
    free(d);
    /* only len bytes are read */
    assert_int_equal(mboxname_domain_check("example.com!junk", 11, NULL,
                                           NULL), STORE_OK);
}

static void test_mboxname_with_domain(void **state)
{
    const char *err = NULL, *rest = NULL, *d;
    size_t len = 99;
    char big[600];

    (void)state;
    assert_int_equal(mboxname_check("example.com!user.alice", &err),
                     STORE_OK);
    assert_int_equal(mboxname_check("example.com!user.alice.Sent", &err),
                     STORE_OK);
    assert_int_equal(mboxname_check("example.com!shared.news", &err),
                     STORE_OK);
    assert_int_equal(mboxname_check("Example.com!user.alice", &err),
                     STORE_BADNAME);
    assert_string_equal(err, "upper-case domain");
    assert_int_equal(mboxname_check("a..b!user.alice", &err), STORE_BADNAME);
    assert_string_equal(err, "empty domain label");
    assert_int_equal(mboxname_check("example.com!", &err), STORE_BADNAME);
    assert_string_equal(err, "empty name");
    assert_int_equal(mboxname_check("example.com!user.a!b", &err),
                     STORE_BADNAME);
    assert_string_equal(err, "'!' in name");
    /* what precedes the first '!' is a domain, whatever it looks like */
    assert_int_equal(mboxname_check("user!a.b", &err), STORE_BADNAME);
    assert_string_equal(err, "domain of one label");
    assert_int_equal(mboxname_check("user.a!b", &err), STORE_OK);
    assert_int_equal(mboxname_check("x.y!a!b", &err), STORE_BADNAME);
    assert_string_equal(err, "'!' in name");
    assert_int_equal(mboxname_check("!user.a", &err), STORE_BADNAME);
    assert_string_equal(err, "empty domain");
    assert_int_equal(mboxname_check("example.com!user.", &err),
                     STORE_BADNAME);
    assert_string_equal(err, "empty user");
    assert_int_equal(mboxname_check("[1.2.3.4]!user.a", &err),
                     STORE_BADNAME);
    /* the whole name counts toward MBOXNAME_MAX */
    memcpy(big, "example.com!", 12);
    memset(big + 12, 'a', sizeof(big) - 13);
    for (size_t i = 12 + 100; i < sizeof(big) - 1; i += 101)
        big[i] = '.';
    big[MBOXNAME_MAX] = '\0';
    assert_int_equal(mboxname_check(big, &err), STORE_OK);
    big[MBOXNAME_MAX] = 'a';
    big[MBOXNAME_MAX + 1] = '\0';
    assert_int_equal(mboxname_check(big, &err), STORE_BADNAME);
    assert_string_equal(err, "name too long");

    d = mboxname_domain("example.com!user.alice", &len, &rest);
    assert_non_null(d);
    assert_int_equal(len, 11);
    assert_memory_equal(d, "example.com", 11);
    assert_string_equal(rest, "user.alice");
    d = mboxname_domain("user.alice", &len, &rest);
    assert_null(d);
    assert_int_equal(len, 0);
    assert_string_equal(rest, "user.alice");
}

static void test_mboxname_userid_inbox(void **state)
{
    struct buf b = BUF_INITIALIZER;

    (void)state;
    assert_int_equal(mboxname_userid("example.com!user.alice.Sent", &b), 1);
    assert_string_equal(buf_cstring(&b), "alice@example.com");
    assert_int_equal(mboxname_userid("example.com!user.alice", &b), 1);
    assert_string_equal(buf_cstring(&b), "alice@example.com");
    assert_int_equal(mboxname_userid("example.com!shared.news", &b), 0);
    assert_int_equal(mboxname_userid("user.alice", &b), 1);
    assert_string_equal(buf_cstring(&b), "alice");

    assert_int_equal(mboxname_user_inbox("alice@example.com", &b), STORE_OK);
    assert_string_equal(buf_cstring(&b), "example.com!user.alice");
    assert_int_equal(mboxname_user_inbox("alice", &b), STORE_OK);
    assert_string_equal(buf_cstring(&b), "user.alice");
    assert_int_equal(mboxname_user_inbox("alice@Example.com", &b),
                     STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("alice@", &b), STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("@example.com", &b), STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("a.b@example.com", &b),
                     STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("a!b", &b), STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("x.y!a", &b), STORE_BADNAME);
    assert_int_equal(mboxname_user_inbox("a@x.y!user.b", &b),
                     STORE_BADNAME);
    assert_int_equal(b.len, 0);

    /* hashing and the spool */
    assert_int_equal(mboxname_hash_letter("example.com!user.bob"), 'b');
    assert_int_equal(mboxname_domain_hash_letter("example.com"), 'e');
    assert_int_equal(mboxname_domain_hash_letter("9.com"), 'q');
    assert_int_equal(mboxname_spool_dir("/sp", "example.com!user.alice.Sent",
                                        0, &b), STORE_OK);
    assert_string_equal(buf_cstring(&b),
                        "/sp/domain/example.com/user/alice/Sent");
    assert_int_equal(mboxname_spool_dir("/sp/", "example.com!user.alice.Sent",
                                        1, &b), STORE_OK);
    assert_string_equal(buf_cstring(&b),
                        "/sp/domain/e/example.com/a/user/alice/Sent");
    assert_int_equal(mboxname_spool_dir("/sp", "example.com!shared.news",
                                        1, &b), STORE_OK);
    assert_string_equal(buf_cstring(&b),
                        "/sp/domain/e/example.com/s/shared/news");
    assert_int_equal(mboxname_spool_dir("/sp", "user.alice", 1, &b),
                     STORE_OK);
    assert_string_equal(buf_cstring(&b), "/sp/a/user/alice");
    assert_int_equal(mboxname_spool_dir("/sp", "Ex.com!user.alice", 1, &b),
                     STORE_BADNAME);
    buf_free(&b);
}

static void ext_is(const char *name, int unixsep, const char *ud, int admin,
                   const char *expected)
{
    struct buf b = BUF_INITIALIZER;
    int r = mboxname_to_external_for(name, unixsep, ud, admin, &b);

    if (!expected) {
        if (r != STORE_BADNAME)
            fail_msg("%s visible to %s%s as \"%s\"", name, ud ? ud : "-",
                     admin ? " (admin)" : "", buf_cstring(&b));
        assert_int_equal(b.len, 0);
    } else {
        if (r != STORE_OK)
            fail_msg("%s invisible to %s", name, ud ? ud : "-");
        assert_string_equal(buf_cstring(&b), expected);
    }
    buf_free(&b);
}

static void int_is(const char *ext, int unixsep, const char *ud, int admin,
                   const char *expected, const char *why)
{
    struct buf b = BUF_INITIALIZER;
    const char *err = NULL;
    int r = mboxname_to_internal_for(ext, unixsep, ud, admin, &b, &err);

    if (!expected) {
        if (r != STORE_BADNAME)
            fail_msg("\"%s\" from %s accepted as \"%s\"", ext,
                     ud ? ud : "-", buf_cstring(&b));
        assert_int_equal(b.len, 0);
        if (why)
            assert_string_equal(err, why);
    } else {
        if (r != STORE_OK)
            fail_msg("\"%s\" from %s refused: %s", ext, ud ? ud : "-",
                     err ? err : "?");
        assert_string_equal(buf_cstring(&b), expected);
    }
    buf_free(&b);
}

static void test_session_view(void **state)
{
    struct buf b = BUF_INITIALIZER;

    (void)state;
    /* own domain: the plain external form */
    ext_is("example.com!user.alice.Sent", 0, "example.com", 0,
           "user.alice.Sent");
    ext_is("example.com!user.alice^smith.Sent", 1, "example.com", 0,
           "user/alice.smith/Sent");
    ext_is("user.alice.Sent", 1, NULL, 0, "user/alice/Sent");
    ext_is("user.alice.Sent", 1, "", 0, "user/alice/Sent");
    /* other domains: invisible, except to a global admin */
    ext_is("other.org!user.alice", 0, "example.com", 0, NULL);
    ext_is("user.alice", 0, "example.com", 0, NULL);
    ext_is("example.com!user.alice", 0, NULL, 0, NULL);
    ext_is("example.com!user.bob", 0, NULL, 1, "user.bob@example.com");
    ext_is("example.com!user.bob", 1, NULL, 1, "user/bob@example.com");
    ext_is("example.com!user.bob.Sent", 1, NULL, 1,
           "user/bob/Sent@example.com");
    ext_is("example.com!shared.news", 0, NULL, 1, "shared.news@example.com");
    ext_is("bad!name", 0, NULL, 1, NULL);
    /* the plain function shows a global admin's view */
    assert_int_equal(mboxname_to_external("example.com!user.bob.X", 1, &b),
                     STORE_OK);
    assert_string_equal(buf_cstring(&b), "user/bob/X@example.com");

    /* names written by a session land in its domain */
    int_is("user.bob", 0, "example.com", 0, "example.com!user.bob", NULL);
    int_is("user/bob.smith/Sent", 1, "example.com", 0,
           "example.com!user.bob^smith.Sent", NULL);
    int_is("shared.news", 0, "example.com", 0, "example.com!shared.news",
           NULL);
    int_is("user.bob", 0, NULL, 0, "user.bob", NULL);
    int_is("user.bob@other.org", 0, "example.com", 0, NULL, "'@' in name");
    int_is("user.bob@other.org", 0, NULL, 0, NULL, "'@' in name");
    int_is("other.org!user.bob", 0, "example.com", 0, NULL, "'!' in name");
    int_is("other.org!user.bob", 0, NULL, 1, NULL, "'!' in name");
    /* a global admin names any domain */
    int_is("user.bob@Other.ORG", 0, NULL, 1, "other.org!user.bob", NULL);
    int_is("user/bob/Sent@other.org", 1, NULL, 1,
           "other.org!user.bob.Sent", NULL);
    int_is("user.bob", 0, NULL, 1, "user.bob", NULL);
    int_is("user.bob@", 0, NULL, 1, NULL, "empty domain");
    int_is("user.bob@a..b", 0, NULL, 1, NULL, "empty domain label");
    int_is("user.bob@[127.0.0.1]", 0, NULL, 1, NULL,
           "address literal as domain");
    int_is("user.a@b@other.org", 0, NULL, 1, NULL, "'@' in name");
    int_is("user/a!b", 1, NULL, 1, NULL, "'!' in name");
    /* plain conversion never makes a domain name */
    assert_int_equal(mboxname_to_internal("example.com!user.bob", 0, &b,
                                          NULL), STORE_BADNAME);
    buf_free(&b);
}

static struct imapconf *conf_of(const char *text)
{
    struct imapconf *conf = NULL;
    char *error = NULL;

    if (imapconf_load_string("test", text, strlen(text), &conf, &error) != 0)
        fail_msg("config refused: %s", error ? error : "?");
    return conf;
}

static void canon_is(const struct userid_policy *p, const char *raw,
                     const char *server, const char *expected,
                     const char *why)
{
    struct buf b = BUF_INITIALIZER;
    const char *err = NULL;
    int r = userid_canon(p, raw, server, &b, &err);

    if (!expected) {
        if (r != STORE_BADNAME)
            fail_msg("\"%s\" accepted as \"%s\"", raw, buf_cstring(&b));
        assert_int_equal(b.len, 0);
        assert_non_null(err);
        if (why)
            assert_string_equal(err, why);
    } else {
        if (r != STORE_OK)
            fail_msg("\"%s\" refused: %s", raw, err ? err : "?");
        assert_string_equal(buf_cstring(&b), expected);
    }
    buf_free(&b);
}

/* Garbage is refused the same way under every mode. */
static void canon_garbage(const struct userid_policy *p)
{
    char *d = make_domain(300, 40);
    struct buf raw = BUF_INITIALIZER;

    canon_is(p, "", NULL, NULL, "empty user id");
    canon_is(p, "alice@", NULL, NULL, "empty domain");
    canon_is(p, "alice@.", NULL, NULL, "empty domain label");
    canon_is(p, "alice@a..b", NULL, NULL, "empty domain label");
    canon_is(p, "alice@[127.0.0.1]", NULL, NULL,
             "address literal as domain");
    canon_is(p, "@example.com", NULL, NULL, "empty local part");
    canon_is(p, "a!b@example.com", NULL, NULL, "'!' in user id");
    canon_is(p, "alice@ex!ample.com", NULL, NULL, "bad byte in domain");
    canon_is(p, "a/b@example.com", NULL, NULL, "'/' in user id");
    canon_is(p, "alice@ex/ample.com", NULL, NULL, "bad byte in domain");
    canon_is(p, "a^b", NULL, NULL, "'^' in user id");
    canon_is(p, "a b", NULL, NULL, "control byte or space in user id");
    canon_is(p, "a*", NULL, NULL, "wildcard in user id");
    canon_is(p, "a@b@example.com", NULL, NULL, "'@' in local part");
    canon_is(p, "alice@localhost", NULL, NULL, "domain of one label");
    buf_printf(&raw, "alice@%s", d);
    canon_is(p, buf_cstring(&raw), NULL, NULL, "domain too long");
    buf_free(&raw);
    free(d);
}

static void test_canon(void **state)
{
    struct imapconf *conf;
    struct userid_policy p;
    const char *err = NULL;

    (void)state;
    /* off: domains validated, then dropped */
    conf = conf_of("virtdomains: off\n");
    assert_int_equal(userid_policy_init(conf, &p, &err), STORE_OK);
    assert_int_equal(p.virtdomains, USERID_VIRTDOMAINS_OFF);
    canon_is(&p, "alice", NULL, "alice", NULL);
    canon_is(&p, "alice@Example.COM", NULL, "alice", NULL);
    canon_is(&p, "alice", "example.com", "alice", NULL);
    canon_is(&p, "alice.smith", NULL, "alice.smith", NULL);
    canon_garbage(&p);
    userid_policy_free(&p);
    imapconf_free(&conf);

    /* userid, no default domain */
    conf = conf_of("virtdomains: userid\n");
    assert_int_equal(userid_policy_init(conf, &p, &err), STORE_OK);
    assert_string_equal(p.defaultdomain, "");
    canon_is(&p, "alice", NULL, "alice", NULL);
    canon_is(&p, "alice@Example.COM", NULL, "alice@example.com", NULL);
    canon_is(&p, "Alice@example.com", NULL, "Alice@example.com", NULL);
    canon_is(&p, "alice", "example.com", "alice", NULL);
    canon_garbage(&p);
    userid_policy_free(&p);
    imapconf_free(&conf);

    /* userid with a default domain */
    conf = conf_of("virtdomains: userid\ndefaultdomain: Main.EXAMPLE\n");
    assert_int_equal(userid_policy_init(conf, &p, &err), STORE_OK);
    assert_string_equal(p.defaultdomain, "main.example");
    canon_is(&p, "alice@main.example", NULL, "alice", NULL);
    canon_is(&p, "alice@MAIN.example", NULL, "alice", NULL);
    canon_is(&p, "alice@other.example", NULL, "alice@other.example", NULL);
    canon_is(&p, "alice", NULL, "alice", NULL);
    canon_garbage(&p);
    userid_policy_free(&p);
    imapconf_free(&conf);

    /* on: the server's domain for a bare local part */
    conf = conf_of("virtdomains: on\ndefaultdomain: main.example\n");
    assert_int_equal(userid_policy_init(conf, &p, &err), STORE_OK);
    assert_int_equal(p.virtdomains, USERID_VIRTDOMAINS_ON);
    canon_is(&p, "alice", "Example.com", "alice@example.com", NULL);
    canon_is(&p, "alice", "main.example", "alice", NULL);
    canon_is(&p, "alice", NULL, "alice", NULL);
    canon_is(&p, "alice", "localhost", "alice", NULL);
    canon_is(&p, "alice@other.org", "example.com", "alice@other.org", NULL);
    canon_is(&p, "alice@main.example", "example.com", "alice", NULL);
    canon_garbage(&p);
    userid_policy_free(&p);
    imapconf_free(&conf);

    /* a bad default domain is refused */
    conf = conf_of("virtdomains: userid\ndefaultdomain: not_a.domain\n");
    assert_int_equal(userid_policy_init(conf, &p, &err), STORE_BADNAME);
    assert_string_equal(err, "bad byte in domain");
    imapconf_free(&conf);
    conf = conf_of("virtdomains: userid\ndefaultdomain: localhost\n");
    assert_int_equal(userid_policy_init(conf, &p, &err), STORE_BADNAME);
    imapconf_free(&conf);
}

static void test_domain_inbox(void **state)
{
    struct buf b = BUF_INITIALIZER;

    (void)state;
    assert_null(userid_domain("alice"));
    assert_string_equal(userid_domain("alice@example.com"), "example.com");
    assert_null(userid_domain(NULL));
    assert_int_equal(userid_inbox("alice", &b), STORE_OK);
    assert_string_equal(buf_cstring(&b), "user.alice");
    assert_int_equal(userid_inbox("alice@example.com", &b), STORE_OK);
    assert_string_equal(buf_cstring(&b), "example.com!user.alice");
    assert_int_equal(userid_inbox("alice.smith@example.com", &b), STORE_OK);
    assert_string_equal(buf_cstring(&b), "example.com!user.alice^smith");
    assert_int_equal(userid_inbox("alice.smith", &b), STORE_OK);
    assert_string_equal(buf_cstring(&b), "user.alice^smith");
    assert_int_equal(userid_inbox("a!b", &b), STORE_BADNAME);
    assert_int_equal(userid_inbox("a^b", &b), STORE_BADNAME);
    assert_int_equal(userid_inbox("a@B.com", &b), STORE_BADNAME);
    assert_int_equal(userid_inbox("a@b", &b), STORE_BADNAME);
    assert_int_equal(userid_inbox("", &b), STORE_BADNAME);
    assert_int_equal(b.len, 0);
    buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_domain_rules),
        cmocka_unit_test(test_mboxname_with_domain),
        cmocka_unit_test(test_mboxname_userid_inbox),
        cmocka_unit_test(test_session_view),
        cmocka_unit_test(test_canon),
        cmocka_unit_test(test_domain_inbox),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
