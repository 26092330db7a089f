/*
 * test_acl.c - unit tests of store/acl.c: rights letters, the canonical
 * string, rights of a user (own entry, anyone, negative entries, admins),
 * setting and removing entries, malformed ACL strings.
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
#include "store/acl.h"

static int rights_of(const char *letters)
{
    int m = -12345;

    if (acl_parse_rights(letters, &m) < 0)
        fail_msg("letters refused: \"%s\"", letters);
    return m;
}

static void test_parse_rights(void **state)
{
    int m;
    char out[12];

    (void)state;
    assert_int_equal(rights_of(""), 0);
    assert_int_equal(rights_of("l"), ACL_LOOKUP);
    assert_int_equal(rights_of("lrswipkxtea"), ACL_ALL);
    assert_int_equal(rights_of("aetxkpiwsrl"), ACL_ALL);
    assert_int_equal(rights_of("lrr"), ACL_LOOKUP | ACL_READ);
    assert_int_equal(rights_of("c"), ACL_CREATE | ACL_DELETEMBOX);
    assert_int_equal(rights_of("d"), ACL_DELETEMSG | ACL_EXPUNGE);
    assert_int_equal(rights_of("lrsicd"),
                     ACL_LOOKUP | ACL_READ | ACL_SEEN | ACL_INSERT |
                     ACL_CREATE | ACL_DELETEMBOX | ACL_DELETEMSG |
                     ACL_EXPUNGE);
    assert_int_equal(rights_of("p"), ACL_POST);
    assert_int_equal(rights_of("a"), ACL_ADMIN);

    m = 77;
    assert_int_equal(acl_parse_rights("lrz", &m), -1);
    assert_int_equal(m, 77);   /* untouched on error */
    assert_int_equal(acl_parse_rights("L", &m), -1);
    assert_int_equal(acl_parse_rights("l r", &m), -1);
    assert_int_equal(acl_parse_rights("l\t", &m), -1);
    assert_int_equal(acl_parse_rights("0", &m), -1);
    assert_int_equal(acl_parse_rights(NULL, &m), -1);

    /* canonical order, whatever the input order */
    memset(out, 'X', sizeof(out));
    assert_string_equal(acl_rights_string(rights_of("aetxkpiwsrl"), out),
                        "lrswipkxtea");
    assert_string_equal(acl_rights_string(rights_of("cd"), out), "kxte");
    assert_string_equal(acl_rights_string(rights_of("pl"), out), "lp");
    assert_string_equal(acl_rights_string(0, out), "");
    /* bits outside ACL_ALL are not letters */
    assert_string_equal(acl_rights_string(ACL_READ | 0x1000, out), "r");
    /* every single right round-trips */
    for (int bit = 0; bit < 11; bit++) {
        acl_rights_string(1 << bit, out);
        assert_int_equal(strlen(out), 1);
        assert_int_equal(rights_of(out), 1 << bit);
    }
}

static void test_check(void **state)
{
    (void)state;
    assert_int_equal(acl_check(""), 0);
    assert_int_equal(acl_check(NULL), 0);
    assert_int_equal(acl_check("alice\tlrswipkxtea\t"), 0);
    assert_int_equal(acl_check("alice\tlr\tanyone\tp\t-bob\tr\t"), 0);
    assert_int_equal(acl_check("alice\t\t"), 0);            /* no rights */
    assert_int_equal(acl_check("alice\tlrcd\t"), 0);        /* obsolete c, d */
    assert_int_equal(acl_check("al ice\tlr\t"), 0);         /* space is ok */

    assert_int_equal(acl_check("alice"), -1);               /* no TAB */
    assert_int_equal(acl_check("alice\tlr"), -1);           /* no final TAB */
    assert_int_equal(acl_check("\tlr\t"), -1);              /* empty id */
    assert_int_equal(acl_check("-\tlr\t"), -1);             /* "-" alone */
    assert_int_equal(acl_check("alice\tlrz\t"), -1);        /* bad letter */
    assert_int_equal(acl_check("alice\tlr\tbob"), -1);      /* trailing */
    assert_int_equal(acl_check("alice\tlr\tbob\t"), -1);    /* half entry */
    assert_int_equal(acl_check("al\nice\tlr\t"), -1);       /* control */
    assert_int_equal(acl_check("al\x7f" "ice\tlr\t"), -1);
    assert_int_equal(acl_check("alice\tl r\t"), -1);
}

static void test_rights(void **state)
{
    const char *acl = "alice\tlrswipkxtea\tanyone\tlp\tbob\tlrs\t";

    (void)state;
    assert_int_equal(acl_rights(acl, "alice", NULL), ACL_ALL);
    assert_int_equal(acl_rights(acl, "bob", NULL),
                     ACL_LOOKUP | ACL_READ | ACL_SEEN | ACL_POST);
    assert_int_equal(acl_rights(acl, "carol", NULL), ACL_LOOKUP | ACL_POST);
    assert_int_equal(acl_rights(acl, "anonymous", NULL),
                     ACL_LOOKUP | ACL_POST);
    assert_int_equal(acl_rights(acl, NULL, NULL), ACL_LOOKUP | ACL_POST);
    /* identifiers compare exactly */
    assert_int_equal(acl_rights(acl, "Alice", NULL), ACL_LOOKUP | ACL_POST);
    assert_int_equal(acl_rights(acl, "alic", NULL), ACL_LOOKUP | ACL_POST);
    assert_int_equal(acl_rights("", "alice", NULL), 0);

    /* "anonymous" entries apply to the anonymous user only */
    acl = "anonymous\tlr\t";
    assert_int_equal(acl_rights(acl, "anonymous", NULL),
                     ACL_LOOKUP | ACL_READ);
    assert_int_equal(acl_rights(acl, "alice", NULL), 0);

    /* negative rights: own and anyone's */
    acl = "alice\tlrswi\t-alice\tw\tanyone\tlrp\t";
    assert_int_equal(acl_rights(acl, "alice", NULL),
                     ACL_LOOKUP | ACL_READ | ACL_SEEN | ACL_INSERT |
                     ACL_POST);
    acl = "alice\tlrswi\tanyone\tlrp\t-anyone\tr\t";
    assert_int_equal(acl_rights(acl, "alice", NULL),
                     ACL_LOOKUP | ACL_SEEN | ACL_WRITE | ACL_INSERT |
                     ACL_POST);
    assert_int_equal(acl_rights(acl, "bob", NULL), ACL_LOOKUP | ACL_POST);
    /* a negative entry of someone else changes nothing */
    acl = "anyone\tlr\t-bob\tlr\t";
    assert_int_equal(acl_rights(acl, "alice", NULL), ACL_LOOKUP | ACL_READ);
    assert_int_equal(acl_rights(acl, "bob", NULL), 0);
    /* the order of entries does not matter */
    acl = "-bob\tlr\tanyone\tlr\t";
    assert_int_equal(acl_rights(acl, "bob", NULL), 0);

    /* admins */
    acl = "alice\tlr\t";
    assert_int_equal(acl_rights(acl, "admin", "cyrus admin"),
                     ACL_LOOKUP | ACL_ADMIN | ACL_CREATE | ACL_DELETEMBOX);
    assert_int_equal(acl_rights(acl, "cyrus", "cyrus admin"),
                     ACL_LOOKUP | ACL_ADMIN | ACL_CREATE | ACL_DELETEMBOX);
    assert_int_equal(acl_rights(acl, "alice", "cyrus admin"),
                     ACL_LOOKUP | ACL_READ);
    assert_int_equal(acl_rights(acl, "adm", "cyrus admin"), 0);
    assert_int_equal(acl_rights(acl, "alice", "alice"),
                     ACL_LOOKUP | ACL_READ | ACL_ADMIN | ACL_CREATE |
                     ACL_DELETEMBOX);
    assert_int_equal(acl_rights(acl, "admin", ""), 0);
    assert_int_equal(acl_rights(acl, "", " "), 0);
    /* an admin keeps admin rights even against a negative entry */
    assert_int_equal(acl_rights("-admin\tla\t", "admin", "admin"),
                     ACL_LOOKUP | ACL_ADMIN | ACL_CREATE | ACL_DELETEMBOX);

    /* a malformed ACL grants nothing (but admins stay admins) */
    assert_int_equal(acl_rights("alice\tlrz\t", "alice", NULL), 0);
    assert_int_equal(acl_rights("anyone\tlr", "alice", NULL), 0);
    assert_int_equal(acl_rights("anyone\tlr\tjunk", "alice", NULL), 0);
    assert_int_equal(acl_rights("anyone\tlrz\t", "admin", "admin"),
                     ACL_LOOKUP | ACL_ADMIN | ACL_CREATE | ACL_DELETEMBOX);
}

static void test_set(void **state)
{
    struct buf out = BUF_INITIALIZER;

    (void)state;
    /* new entries at the end, rights in canonical order */
    assert_int_equal(acl_set(NULL, "alice", rights_of("aeltr"), &out), 0);
    assert_string_equal(buf_cstring(&out), "alice\tlrtea\t");
    assert_int_equal(acl_set("alice\tlr\t", "anyone", ACL_POST, &out), 0);
    assert_string_equal(buf_cstring(&out), "alice\tlr\tanyone\tp\t");
    /* replacing keeps the place */
    assert_int_equal(acl_set("alice\tlr\tanyone\tp\tbob\tl\t", "anyone",
                             rights_of("lrp"), &out), 0);
    assert_string_equal(buf_cstring(&out),
                        "alice\tlr\tanyone\tlrp\tbob\tl\t");
    /* existing entries are written canonically too */
    assert_int_equal(acl_set("alice\tcdrl\t", "bob", ACL_READ, &out), 0);
    assert_string_equal(buf_cstring(&out), "alice\tlrkxte\tbob\tr\t");
    /* removal */
    assert_int_equal(acl_set("alice\tlr\tanyone\tp\tbob\tl\t", "anyone", 0,
                             &out), 0);
    assert_string_equal(buf_cstring(&out), "alice\tlr\tbob\tl\t");
    assert_int_equal(acl_set("alice\tlr\t", "alice", 0, &out), 0);
    assert_string_equal(buf_cstring(&out), "");
    assert_int_equal(acl_set("alice\tlr\t", "nobody", 0, &out), 0);
    assert_string_equal(buf_cstring(&out), "alice\tlr\t");
    /* a negative entry is an identifier of its own */
    assert_int_equal(acl_set("alice\tlr\t", "-alice", ACL_READ, &out), 0);
    assert_string_equal(buf_cstring(&out), "alice\tlr\t-alice\tr\t");
    assert_int_equal(acl_rights(buf_cstring(&out), "alice", NULL),
                     ACL_LOOKUP);
    /* duplicate entries collapse into the first */
    assert_int_equal(acl_set("a\tl\tb\tr\ta\tw\t", "a", ACL_READ, &out), 0);
    assert_string_equal(buf_cstring(&out), "a\tr\tb\tr\t");
    /* the result is always well formed */
    assert_int_equal(acl_check(buf_cstring(&out)), 0);

    /* refused: malformed ACL, bad identifier, bad mask */
    buf_setcstr(&out, "poison");
    assert_int_equal(acl_set("alice\tlrz\t", "bob", ACL_READ, &out), -1);
    assert_int_equal(acl_set("alice\tlr", "bob", ACL_READ, &out), -1);
    assert_int_equal(acl_set("", "", ACL_READ, &out), -1);
    assert_int_equal(acl_set("", "-", ACL_READ, &out), -1);
    assert_int_equal(acl_set("", "a\tb", ACL_READ, &out), -1);
    assert_int_equal(acl_set("", "a\nb", ACL_READ, &out), -1);
    assert_int_equal(acl_set("", "a\x01", ACL_READ, &out), -1);
    assert_int_equal(acl_set("", NULL, ACL_READ, &out), -1);
    assert_int_equal(acl_set("", "bob", 0x1000, &out), -1);
    buf_free(&out);
}

static int each_collect(void *rock, const char *id, size_t idlen, int mask)
{
    struct buf *b = rock;
    char letters[12];

    buf_append(b, id, idlen);
    buf_printf(b, "=%s;", acl_rights_string(mask, letters));
    return 0;
}

static int each_stop(void *rock, const char *id, size_t idlen, int mask)
{
    (void)rock; (void)id; (void)idlen; (void)mask;
    return 7;
}

static void test_each_entry(void **state)
{
    struct buf b = BUF_INITIALIZER;
    const char *acl = "bob\tlr\t-bob\tr\tanyone\tcd\tbob\ti\t";

    (void)state;
    assert_int_equal(acl_each(acl, each_collect, &b), 0);
    assert_string_equal(buf_cstring(&b),
                        "bob=lr;-bob=r;anyone=kxte;bob=i;");
    assert_int_equal(acl_each(acl, each_stop, NULL), 7);
    assert_int_equal(acl_each(NULL, each_stop, NULL), 0);
    buf_reset(&b);
    assert_int_equal(acl_each("bob\tlr\tbad", each_collect, &b), -1);
    assert_string_equal(buf_cstring(&b), "bob=lr;");
    assert_int_equal(acl_entry_rights(acl, "bob"), ACL_LOOKUP | ACL_READ |
                     ACL_INSERT);
    assert_int_equal(acl_entry_rights(acl, "-bob"), ACL_READ);
    assert_int_equal(acl_entry_rights(acl, "bo"), 0);
    assert_int_equal(acl_entry_rights(acl, "carol"), 0);
    assert_int_equal(acl_entry_rights("x\tz\t", "x"), -1);
    buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_rights),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_rights),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_each_entry),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
