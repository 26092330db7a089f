/*
 * test_imapurl.c - unit tests of imapd/imapurl.c: the IMAP URL forms
 * CATENATE takes (absolute, path, relative), percent-decoding, sections
 * and partials, and the URLs it refuses (malformed, %00, URLAUTH,
 * HEADER.FIELDS, numbers out of range, junk at the end).
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

#include "imapd/imapurl.h"

static int parse(const char *s, struct imapurl *u, const char **err)
{
    return imapurl_parse(s, strlen(s), u, err);
}

static void test_forms(void **state)
{
    struct imapurl u;
    const char *err = NULL;

    (void)state;
    assert_int_equal(parse("imap://alice;AUTH=*@mail.example:143/"
                           "INBOX.Sent%20Items;UIDVALIDITY=385759045/"
                           ";UID=20/;SECTION=1.2.MIME/;PARTIAL=0.1024",
                           &u, &err), 0);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.host, "mail.example");
    assert_int_equal(u.port, 143);
    assert_string_equal(u.mailbox, "INBOX.Sent Items");
    assert_int_equal(u.uidvalidity, 385759045);
    assert_int_equal(u.uid, 20);
    assert_int_equal(u.section_set, 1);
    assert_int_equal(u.npart, 2);
    assert_int_equal(u.part[0], 1);
    assert_int_equal(u.part[1], 2);
    assert_int_equal(u.kind, MESSAGE_SECTION_MIME);
    assert_int_equal(u.partial, 1);
    assert_int_equal(u.origin, 0);
    assert_int_equal(u.count, 1024);
    imapurl_fini(&u);

    assert_int_equal(parse("/INBOX/;uid=7", &u, &err), 0);
    assert_null(u.host);
    assert_null(u.user);
    assert_string_equal(u.mailbox, "INBOX");
    assert_int_equal(u.uidvalidity, 0);
    assert_int_equal(u.uid, 7);
    assert_int_equal(u.section_set, 0);
    assert_int_equal(u.kind, MESSAGE_SECTION_CONTENT);
    imapurl_fini(&u);

    assert_int_equal(parse(";UID=3/;SECTION=TEXT", &u, &err), 0);
    assert_null(u.mailbox);
    assert_int_equal(u.uid, 3);
    assert_int_equal(u.kind, MESSAGE_SECTION_TEXT);
    imapurl_fini(&u);

    /* '/' in a mailbox name (unixhierarchysep) and %3B for ';' */
    assert_int_equal(parse("/INBOX/a%3Bb/c/;UID=1/;SECTION=HEADER", &u,
                           &err), 0);
    assert_string_equal(u.mailbox, "INBOX/a;b/c");
    assert_int_equal(u.kind, MESSAGE_SECTION_HEADER);
    imapurl_fini(&u);

    assert_int_equal(parse("/INBOX/;UID=1/;PARTIAL=5", &u, &err), 0);
    assert_int_equal(u.partial, 1);
    assert_int_equal(u.origin, 5);
    assert_int_equal(u.count, 0);
    imapurl_fini(&u);
}

static void test_refused(void **state)
{
    static const char *const bad[] = {
        "", "INBOX/;UID=1", "/INBOX", "/INBOX/;UID=0", "/INBOX/;UID=x",
        "/INBOX/;UID=4294967296", "/;UID=1", "/INBOX;UIDVALIDITY=0/;UID=1",
        "/INBOX;UIDVALIDITY=1x/;UID=1", "/IN%00BOX/;UID=1", "/IN%4/;UID=1",
        "/INBOX/;UID=1/;SECTION=HEADER.FIELDS%20(FROM)",
        "/INBOX/;UID=1/;SECTION=0", "/INBOX/;UID=1/;SECTION=MIME",
        "/INBOX/;UID=1/;SECTION=1.", "/INBOX/;UID=1/;URLAUTH=anonymous:x",
        "/INBOX/;UID=1;EXPIRE=2030-01-01T00:00:00Z", "/INBOX/;UID=1 x",
        "/INBOX/;UID=1junk", "imap://host", "imap:///INBOX/;UID=1",
        "imap://@host/INBOX/;UID=1", "imap://host:99999/INBOX/;UID=1",
        "imap://host:/INBOX/;UID=1", "/INBOX/;UID=1/;PARTIAL=1.0",
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct imapurl u;
        const char *err = NULL;

        if (parse(bad[i], &u, &err) != -1)
            fail_msg("accepted: %s", bad[i]);
        assert_non_null(err);
        imapurl_fini(&u);
    }
}

/* every prefix of a good URL, as a length: no read past it */
static void test_prefixes(void **state)
{
    static const char url[] = "imap://a@h:1/B%20x;UIDVALIDITY=2/;UID=3/"
                              ";SECTION=4.TEXT/;PARTIAL=5.6";
    size_t n;

    (void)state;
    for (n = 0; n <= sizeof(url) - 1; n++) {
        char *copy = malloc(n ? n : 1);
        struct imapurl u;
        const char *err;

        assert_non_null(copy);
        memcpy(copy, url, n);
        (void)imapurl_parse(copy, n, &u, &err);
        imapurl_fini(&u);
        free(copy);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forms),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_prefixes),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
