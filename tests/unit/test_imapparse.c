/*
 * test_imapparse.c - unit tests of imapd/imapparse.c over real sockets
 * (socketpair + struct prot): the lexer (atoms, quoted strings with
 * escapes, literals {n} with the continuation callback, LITERAL+ {n+}),
 * the limits (line, literal, command, APPEND size, nesting), every
 * structured parser (sequence sets, mailboxes, flags, dates, FETCH,
 * STORE, SEARCH, STATUS, LIST, SELECT, APPEND, ID, ENABLE, AUTHENTICATE),
 * and for each malformed command: the BAD text and the next command
 * parsed correctly (the stream stays in sync).  A forked client plays the
 * synchronizing-literal dialogue and another sends one byte at a time.
 */
#include "config.h"

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "imapd/imapparse.h"
#include "lib/buf.h"
#include "lib/metrics.h"
#include "lib/prot.h"
#include "tests/testhelp.h"

/* ---- fixture ------------------------------------------------------- */

struct fx {
    int sv[2];              /* sv[0] server (prot), sv[1] client */
    struct prot *p;
    struct imapparse_cmd cmd;
    struct imapparse_options opts;
};

static int write_all(int fd, const void *data, size_t len)
{
    const char *d = data;

    while (len > 0) {
        ssize_t n = write(fd, d, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        d += n;
        len -= (size_t)n;
    }
    return 0;
}

static int setup(void **state)
{
    struct fx *fx = calloc(1, sizeof(*fx));

    assert_non_null(fx);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fx->sv), 0);
    fx->p = prot_new(fx->sv[0]);
    assert_non_null(fx->p);
    prot_settimeout(fx->p, 10);
    imapparse_cmd_init(&fx->cmd);
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    struct fx *fx = *state;

    imapparse_cmd_free(&fx->cmd);
    prot_free(&fx->p);
    close(fx->sv[0]);
    if (fx->sv[1] >= 0)
        close(fx->sv[1]);
    free(fx);
    return 0;
}

static void csend(struct fx *fx, const char *s)
{
    assert_int_equal(write_all(fx->sv[1], s, strlen(s)), 0);
}

static int rd(struct fx *fx)
{
    return imapparse_read(fx->p, &fx->opts, &fx->cmd);
}

/* what the server wrote to the client so far (non-blocking) */
static void client_output(struct fx *fx, struct buf *out)
{
    char tmp[4096];
    ssize_t n;

    buf_reset(out);
    while ((n = recv(fx->sv[1], tmp, sizeof(tmp), MSG_DONTWAIT)) > 0)
        assert_int_equal(buf_append(out, tmp, (size_t)n), 0);
}

/* the next command must be "tag NOOP" */
static void expect_noop(struct fx *fx, const char *tag)
{
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.tag, tag);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_NOOP);
}

/* send `line` then "Z NOOP"; the first must fail with result/text */
static void expect_bad(struct fx *fx, const char *line, int result,
                       const char *tag, const char *text)
{
    csend(fx, line);
    csend(fx, "Z NOOP\r\n");
    if (rd(fx) != result)
        fail_msg("command %s: result %d", line, result);
    if (tag)
        assert_string_equal(fx->cmd.tag, tag);
    else
        assert_null(fx->cmd.tag);
    assert_non_null(fx->cmd.error);
    if (text && strstr(fx->cmd.error, text) == NULL)
        fail_msg("error text \"%s\" lacks \"%s\" (command %s)",
                 fx->cmd.error, text, line);
    expect_noop(fx, "Z");
}

/* ---- simple commands ----------------------------------------------- */

static void test_simple(void **state)
{
    struct fx *fx = *state;

    csend(fx, "a1 capability\r\nA2 NOOP\nx LOGOUT\r\n"
              "t IDLE\r\nt NAMESPACE\r\nt STARTTLS\r\nt UNSELECT\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.tag, "a1");
    assert_string_equal(fx->cmd.name, "CAPABILITY");
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_CAPABILITY);
    assert_int_equal(fx->cmd.ntokens, 0);
    expect_noop(fx, "A2");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_LOGOUT);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_IDLE);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_NAMESPACE);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_STARTTLS);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_UNSELECT);
    close(fx->sv[1]);
    fx->sv[1] = -1;
    assert_int_equal(rd(fx), IMAPPARSE_EOF);
    assert_false(imapparse_in_sync(IMAPPARSE_EOF));
    assert_true(imapparse_in_sync(IMAPPARSE_BAD));
}

static void test_login_strings(void **state)
{
    struct fx *fx = *state;

    csend(fx, "a LOGIN fred \"pa ss\\\"w\\\\d\"\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_LOGIN);
    assert_string_equal(fx->cmd.arg[0], "fred");
    assert_string_equal(fx->cmd.arg[1], "pa ss\"w\\d");
    assert_int_equal(fx->cmd.arg_len[1], 9);

    /* literals: synchronizing (default "+ Ready") and LITERAL+ */
    csend(fx, "b LOGIN {4}\r\nfr d {3+}\r\na)b\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[0], "fr d");
    assert_string_equal(fx->cmd.arg[1], "a)b");
    assert_int_equal(fx->cmd.tokens[0].type, IMAPPARSE_TOK_LITERAL);
    {
        struct buf out = BUF_INITIALIZER;

        client_output(fx, &out);
        assert_string_equal(buf_cstring(&out), "+ Ready for more\r\n");
        buf_free(&out);
    }
    /* empty literal and empty quoted string */
    csend(fx, "c LOGIN {0}\r\n \"\"\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[0], "");
    assert_string_equal(fx->cmd.arg[1], "");
}

/* LIST-EXTENDED (RFC 5258), LIST-STATUS (RFC 5819), CREATE-SPECIAL-USE
 * and the SPECIAL-USE selection and return options (RFC 6154) */
static void test_list_extended(void **state)
{
    struct fx *fx = *state;
    const struct imapparse_list *l = &fx->cmd.list;

    csend(fx, "a LIST \"\" %\r\n"
              "b LIST (SUBSCRIBED RECURSIVEMATCH remote) \"\" (\"%\" "
              "{5+}\r\ninbox) RETURN (CHILDREN subscribed)\r\n"
              "c LIST () \"\" * RETURN (STATUS (MESSAGES SIZE) "
              "SPECIAL-USE)\r\n"
              "d LIST (SPECIAL-USE) \"\" * RETURN ()\r\n"
              "d2 LIST \"\" * RETURN (MYRIGHTS)\r\n"
              "e CREATE Sent (USE (\\Sent \\drafts))\r\n"
              "f CREATE x (USE ())\r\n"
              "g STATUS x (SIZE MESSAGES)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_LIST);
    assert_int_equal(l->extended, 0);
    assert_int_equal(l->patterns.n, 1);
    assert_string_equal(l->patterns.s[0], "%");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(l->extended, 1);
    assert_int_equal(l->select, IMAPPARSE_LSEL_SUBSCRIBED |
                     IMAPPARSE_LSEL_RECURSIVEMATCH | IMAPPARSE_LSEL_REMOTE);
    assert_int_equal(l->ret, IMAPPARSE_LRET_CHILDREN |
                     IMAPPARSE_LRET_SUBSCRIBED);
    assert_int_equal(l->patterns.n, 2);
    assert_string_equal(l->patterns.s[1], "inbox");
    assert_string_equal(fx->cmd.arg[1], "%");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(l->extended, 1);
    assert_int_equal(l->select, 0);
    assert_int_equal(l->ret, IMAPPARSE_LRET_STATUS |
                     IMAPPARSE_LRET_SPECIALUSE);
    assert_int_equal(l->status.n, 2);
    assert_int_equal(l->status.items[1], IMAPPARSE_STATUS_SIZE);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(l->select, IMAPPARSE_LSEL_SPECIALUSE);
    assert_int_equal(l->ret, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(l->ret, IMAPPARSE_LRET_MYRIGHTS);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_CREATE);
    assert_string_equal(fx->cmd.arg[0], "Sent");
    assert_int_equal(fx->cmd.use_set, 1);
    assert_int_equal(fx->cmd.use.n, 2);
    assert_string_equal(fx->cmd.use.s[1], "\\drafts");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.use_set, 1);
    assert_int_equal(fx->cmd.use.n, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.status.items[0], IMAPPARSE_STATUS_SIZE);
    csend(fx, "s STATUS x (APPENDLIMIT MESSAGES)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.status.items[0], IMAPPARSE_STATUS_APPENDLIMIT);

    expect_bad(fx, "a LIST (RECURSIVEMATCH) \"\" *\r\n", IMAPPARSE_BAD,
               "a", "RECURSIVEMATCH");
    expect_bad(fx, "a LIST (SPECIAL-USE RECURSIVEMATCH) \"\" *\r\n",
               IMAPPARSE_BAD, "a", "RECURSIVEMATCH");
    expect_bad(fx, "a LIST (BOGUS) \"\" *\r\n", IMAPPARSE_BAD, "a",
               "Unknown selection option");
    expect_bad(fx, "a LIST \"\" * RETURN (BOGUS)\r\n", IMAPPARSE_BAD, "a",
               "Unknown return option");
    expect_bad(fx, "a LIST \"\" * RETURN\r\n", IMAPPARSE_BAD, "a",
               "return option list");
    expect_bad(fx, "a LIST \"\" * FOO ()\r\n", IMAPPARSE_BAD, "a",
               "extra");
    expect_bad(fx, "a LIST \"\" ()\r\n", IMAPPARSE_BAD, "a", "pattern");
    expect_bad(fx, "a LIST \"\" * RETURN (STATUS ())\r\n", IMAPPARSE_BAD,
               "a", "status item");
    expect_bad(fx, "a LIST \"\" * RETURN (STATUS (MESSAGES) STATUS "
               "(UNSEEN))\r\n", IMAPPARSE_BAD, "a", "Repeated");
    expect_bad(fx, "a LIST \"\" * RETURN (CHILDREN) x\r\n", IMAPPARSE_BAD,
               "a", "extra");
    expect_bad(fx, "a CREATE x (USE (Sent))\r\n", IMAPPARSE_BAD, "a",
               "use attribute");
    expect_bad(fx, "a CREATE x (FOO (\\Sent))\r\n", IMAPPARSE_BAD, "a",
               "Unknown create parameter");
    expect_bad(fx, "a CREATE x (USE (\\Sent) USE (\\Junk))\r\n",
               IMAPPARSE_BAD, "a", "Repeated USE");
    expect_bad(fx, "a CREATE x (USE (\\Sent)\r\n", IMAPPARSE_BAD, "a",
               NULL);
}

static void test_mailboxes(void **state)
{
    struct fx *fx = *state;

    csend(fx, "a SELECT inbox\r\nb EXAMINE \"Inbox.Sub\" (CONDSTORE)\r\n"
              "c CREATE inboxes\r\nd RENAME a] {3}\r\nb c\r\n"
              "e LIST \"\" %\r\nf LSUB user. *x%]\r\n"
              "g DELETE x\r\nh SUBSCRIBE INBOX\r\ni UNSUBSCRIBE y\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_SELECT);
    assert_string_equal(fx->cmd.arg[0], "INBOX");
    assert_int_equal(fx->cmd.condstore, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_EXAMINE);
    assert_string_equal(fx->cmd.arg[0], "INBOX.Sub");
    assert_int_equal(fx->cmd.condstore, 1);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[0], "inboxes");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_RENAME);
    assert_string_equal(fx->cmd.arg[0], "a]");
    assert_string_equal(fx->cmd.arg[1], "b c");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_LIST);
    assert_string_equal(fx->cmd.arg[0], "");
    assert_string_equal(fx->cmd.arg[1], "%");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_LSUB);
    assert_string_equal(fx->cmd.arg[0], "user.");
    assert_string_equal(fx->cmd.arg[1], "*x%]");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_DELETE);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_SUBSCRIBE);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_UNSUBSCRIBE);

    expect_bad(fx, "a SELECT\r\n", IMAPPARSE_BAD, "a", "Missing mailbox");
    expect_bad(fx, "a SELECT a%b\r\n", IMAPPARSE_BAD, "a", "Invalid char");
    expect_bad(fx, "a SELECT x (QRESYNCX)\r\n", IMAPPARSE_BAD, "a",
               "Unknown select parameter");

    /* QRESYNC (RFC 7162 3.2.5) */
    csend(fx, "a SELECT x (QRESYNC (67890007 20050715194045000 "
              "41,43:211,214:541))\r\n"
              "b EXAMINE x (CONDSTORE QRESYNC (1 2 1:5 (3,7 11:12)))\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.qresync.set, 1);
    assert_int_equal(fx->cmd.qresync.uidvalidity, 67890007);
    assert_true(fx->cmd.qresync.modseq == 20050715194045000ULL);
    assert_int_equal(fx->cmd.qresync.has_known_uids, 1);
    assert_int_equal(fx->cmd.qresync.known_uids.n, 3);
    assert_int_equal(fx->cmd.qresync.known_uids.r[2].hi, 541);
    assert_int_equal(fx->cmd.qresync.has_match, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.condstore, 1);
    assert_int_equal(fx->cmd.qresync.has_match, 1);
    assert_int_equal(fx->cmd.qresync.match_seqs.n, 2);
    assert_int_equal(fx->cmd.qresync.match_uids.r[0].lo, 11);
    expect_bad(fx, "a SELECT x (QRESYNC)\r\n", IMAPPARSE_BAD, "a", NULL);
    expect_bad(fx, "a SELECT x (QRESYNC (0 1))\r\n", IMAPPARSE_BAD, "a",
               "uidvalidity");
    expect_bad(fx, "a SELECT x (QRESYNC (1 0))\r\n", IMAPPARSE_BAD, "a",
               "mod-sequence");
    expect_bad(fx, "a SELECT x (QRESYNC (1 1 1:*))\r\n", IMAPPARSE_BAD,
               "a", "known-uids");
    expect_bad(fx, "a SELECT x (QRESYNC (1 1 (1 2 3)))\r\n", IMAPPARSE_BAD,
               "a", NULL);
    expect_bad(fx, "a SELECT x (QRESYNC (1 1) QRESYNC (1 1))\r\n",
               IMAPPARSE_BAD, "a", "Repeated");
    expect_bad(fx, "a CREATE x y\r\n", IMAPPARSE_BAD, "a", "extra");
    expect_bad(fx, "a LIST \"\"\r\n", IMAPPARSE_BAD, "a", "pattern");
}

/* ---- sequence sets and dates --------------------------------------- */

static void test_seqset(void **state)
{
    struct imapparse_seqset set;

    (void)state;
    assert_int_equal(imapparse_seqset_parse("1,3:5,*,9:7,4294967295", 22,
                                            &set), 0);
    assert_int_equal(set.n, 5);
    assert_int_equal(set.r[0].lo, 1);
    assert_int_equal(set.r[0].hi, 1);
    assert_int_equal(set.r[1].lo, 3);
    assert_int_equal(set.r[1].hi, 5);
    assert_int_equal(set.r[2].lo, 0);
    assert_int_equal(set.r[3].lo, 9);
    assert_int_equal(set.r[3].hi, 7);
    assert_int_equal(set.r[4].lo, 4294967295u);
    assert_true(imapparse_seqset_contains(&set, 4, 100));
    assert_true(imapparse_seqset_contains(&set, 8, 100));
    assert_true(imapparse_seqset_contains(&set, 100, 100));
    assert_false(imapparse_seqset_contains(&set, 2, 100));
    assert_false(imapparse_seqset_contains(&set, 99, 100));
    free(set.r);

    assert_int_equal(imapparse_seqset_parse("5:*", 3, &set), 0);
    assert_true(imapparse_seqset_contains(&set, 3, 3));  /* 5:* = 3:5 */
    assert_false(imapparse_seqset_contains(&set, 2, 3));
    free(set.r);

    assert_int_equal(imapparse_seqset_parse("0", 1, &set), -1);
    assert_int_equal(imapparse_seqset_parse("1,", 2, &set), -1);
    assert_int_equal(imapparse_seqset_parse(",1", 2, &set), -1);
    assert_int_equal(imapparse_seqset_parse("1:", 2, &set), -1);
    assert_int_equal(imapparse_seqset_parse("1:2:3", 5, &set), -1);
    assert_int_equal(imapparse_seqset_parse("4294967296", 10, &set), -1);
    assert_int_equal(imapparse_seqset_parse("01", 2, &set), -1);
    assert_int_equal(imapparse_seqset_parse("a", 1, &set), -1);
    assert_int_equal(imapparse_seqset_parse("", 0, &set), -1);
}

static void test_dates(void **state)
{
    struct imapparse_date d;
    time_t t;

    (void)state;
    assert_int_equal(imapparse_date_parse("1-Feb-2024", 10, &d), 0);
    assert_int_equal(d.year, 2024);
    assert_int_equal(d.mon, 2);
    assert_int_equal(d.mday, 1);
    assert_int_equal(imapparse_date_parse("\"29-feb-2024\"", 13, &d), 0);
    assert_int_equal(d.mday, 29);
    assert_int_equal(imapparse_date_days(&d), 19782);
    assert_int_equal(imapparse_date_parse("29-Feb-2023", 11, &d), -1);
    assert_int_equal(imapparse_date_parse("1-Foo-2024", 10, &d), -1);
    assert_int_equal(imapparse_date_parse("1-Feb-24", 8, &d), -1);
    assert_int_equal(imapparse_date_parse("123-Feb-2024", 12, &d), -1);
    assert_int_equal(imapparse_date_parse("1-Feb-2024x", 11, &d), -1);

    assert_int_equal(imapparse_datetime_parse("17-Jul-1996 02:44:25 -0700",
                                              26, &t), 0);
    assert_int_equal((long long)t, 837596665LL);
    assert_int_equal(imapparse_datetime_parse(" 1-Jan-1970 00:00:00 +0000",
                                              26, &t), 0);
    assert_int_equal((long long)t, 0);
    assert_int_equal(imapparse_datetime_parse("01-Jan-1970 01:00:00 +0100",
                                              26, &t), 0);
    assert_int_equal((long long)t, 0);
    assert_int_equal(imapparse_datetime_parse("01-Jan-1970 24:00:00 +0100",
                                              26, &t), -1);
    assert_int_equal(imapparse_datetime_parse("01-Jan-1970 01:00:00 0100",
                                              25, &t), -1);
    assert_int_equal(imapparse_datetime_parse("01-Jan-1970 01:00 +0100",
                                              23, &t), -1);
}

/* ---- FETCH --------------------------------------------------------- */

/* BINARY[...]<o.n>, BINARY.PEEK[...], BINARY.SIZE[...] (RFC 3516) */
static void test_fetch_binary(void **state)
{
    struct fx *fx = *state;
    const struct imapparse_fetch_att *a;

    csend(fx, "a FETCH 1 (BINARY[1.2] binary.peek[]<0.10> BINARY.SIZE[3] "
              "BINARY[4]<7.1>)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.fetch.n, 4);
    a = fx->cmd.fetch.atts;
    assert_int_equal(a[0].kind, IMAPPARSE_FETCH_BINARY);
    assert_int_equal(a[0].peek, 0);
    assert_int_equal(a[0].nparts, 2);
    assert_int_equal(a[0].parts[1], 2);
    assert_string_equal(a[0].section, "1.2");
    assert_int_equal(a[0].partial, 0);
    assert_int_equal(a[1].kind, IMAPPARSE_FETCH_BINARY);
    assert_int_equal(a[1].peek, 1);
    assert_int_equal(a[1].nparts, 0);
    assert_string_equal(a[1].section, "");
    assert_int_equal(a[1].partial, 1);
    assert_int_equal(a[1].origin, 0);
    assert_int_equal(a[1].count, 10);
    assert_int_equal(a[2].kind, IMAPPARSE_FETCH_BINARY_SIZE);
    assert_int_equal(a[2].peek, 0);
    assert_string_equal(a[2].section, "3");
    assert_int_equal(a[3].origin, 7);
    assert_int_equal(a[3].count, 1);

    expect_bad(fx, "b FETCH 1 (BINARY[1.TEXT])\r\n", IMAPPARSE_BAD, "b",
               "part numbers only");
    expect_bad(fx, "b FETCH 1 (BINARY[HEADER])\r\n", IMAPPARSE_BAD, "b",
               "part numbers only");
    expect_bad(fx, "b FETCH 1 (BINARY[1.MIME])\r\n", IMAPPARSE_BAD, "b",
               "part numbers only");
    expect_bad(fx, "b FETCH 1 (BINARY[0])\r\n", IMAPPARSE_BAD, "b",
               "part number");
    expect_bad(fx, "b FETCH 1 (BINARY[1.])\r\n", IMAPPARSE_BAD, "b",
               "Invalid section");
    expect_bad(fx, "b FETCH 1 (BINARY[1)\r\n", IMAPPARSE_BAD, "b", "']'");
    expect_bad(fx, "b FETCH 1 (BINARY.SIZE[1]<0.5>)\r\n", IMAPPARSE_BAD, "b",
               "no partial");
    expect_bad(fx, "b FETCH 1 (BINARY[1]<5>)\r\n", IMAPPARSE_BAD, "b",
               "partial");
    expect_bad(fx, "b FETCH 1 (BINARY[1]<0.0>)\r\n", IMAPPARSE_BAD, "b",
               "partial");
    expect_bad(fx, "b FETCH 1 (BINARY.PEEK)\r\n", IMAPPARSE_BAD, "b",
               "Invalid fetch attribute");

    /* SEARCH CHARSET is recorded (RFC 6855 refuses it once UTF8=ACCEPT
     * is enabled) */
    csend(fx, "c SEARCH CHARSET UTF-8 ALL\r\nd SEARCH ALL\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.charset_set, 1);
    assert_int_equal(fx->cmd.utf8, 1);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.charset_set, 0);
}


static void test_fetch(void **state)
{
    struct fx *fx = *state;
    const struct imapparse_fetch_att *a;

    csend(fx, "a FETCH 1:* ALL\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_FETCH);
    assert_int_equal(fx->cmd.uid, 0);
    assert_int_equal(fx->cmd.set.n, 1);
    assert_int_equal(fx->cmd.set.r[0].hi, 0);
    assert_int_equal(fx->cmd.fetch.n, 4);
    assert_int_equal(fx->cmd.fetch.atts[0].kind, IMAPPARSE_FETCH_FLAGS);
    assert_int_equal(fx->cmd.fetch.atts[3].kind, IMAPPARSE_FETCH_ENVELOPE);

    csend(fx, "b UID fetch 5 full\r\nc FETCH 2 fast\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.uid, 1);
    assert_string_equal(fx->cmd.name, "UID FETCH");
    assert_int_equal(fx->cmd.fetch.n, 5);
    assert_int_equal(fx->cmd.fetch.atts[4].kind, IMAPPARSE_FETCH_BODY);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.fetch.n, 3);

    csend(fx, "d FETCH 1,2 (UID FLAGS BODY.PEEK[HEADER.FIELDS (From \"to\" "
              "{7}\r\nSubject)]<0.2048> BODY[1.2.MIME] body[]<10.5> "
              "BODY[3.TEXT] RFC822.SIZE BODYSTRUCTURE RFC822.HEADER "
              "INTERNALDATE MODSEQ BODY[HEADER.FIELDS.NOT (X-A)] BODY[2] "
              "RFC822 RFC822.TEXT BODY)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.fetch.n, 16);
    a = fx->cmd.fetch.atts;
    assert_int_equal(a[0].kind, IMAPPARSE_FETCH_UID);
    assert_int_equal(a[2].kind, IMAPPARSE_FETCH_SECTION);
    assert_int_equal(a[2].peek, 1);
    assert_int_equal(a[2].text, IMAPPARSE_SECTION_HEADER_FIELDS);
    assert_int_equal(a[2].fields.n, 3);
    assert_string_equal(a[2].fields.s[0], "From");
    assert_string_equal(a[2].fields.s[1], "to");
    assert_string_equal(a[2].fields.s[2], "Subject");
    assert_string_equal(a[2].section, "HEADER.FIELDS (FROM TO SUBJECT)");
    assert_int_equal(a[2].partial, 1);
    assert_int_equal(a[2].origin, 0);
    assert_int_equal(a[2].count, 2048);
    assert_int_equal(a[3].peek, 0);
    assert_int_equal(a[3].nparts, 2);
    assert_int_equal(a[3].parts[0], 1);
    assert_int_equal(a[3].parts[1], 2);
    assert_int_equal(a[3].text, IMAPPARSE_SECTION_MIME);
    assert_string_equal(a[3].section, "1.2.MIME");
    assert_int_equal(a[4].text, IMAPPARSE_SECTION_ALL);
    assert_string_equal(a[4].section, "");
    assert_int_equal(a[4].origin, 10);
    assert_int_equal(a[4].count, 5);
    assert_string_equal(a[5].section, "3.TEXT");
    assert_int_equal(a[6].kind, IMAPPARSE_FETCH_RFC822_SIZE);
    assert_int_equal(a[7].kind, IMAPPARSE_FETCH_BODYSTRUCTURE);
    assert_int_equal(a[8].kind, IMAPPARSE_FETCH_RFC822_HEADER);
    assert_int_equal(a[9].kind, IMAPPARSE_FETCH_INTERNALDATE);
    assert_int_equal(a[10].kind, IMAPPARSE_FETCH_MODSEQ);
    assert_int_equal(a[11].text, IMAPPARSE_SECTION_HEADER_FIELDS_NOT);
    assert_string_equal(a[11].section, "HEADER.FIELDS.NOT (X-A)");
    assert_int_equal(a[11].partial, 0);
    assert_string_equal(a[12].section, "2");
    assert_int_equal(a[13].kind, IMAPPARSE_FETCH_RFC822);
    assert_int_equal(a[14].kind, IMAPPARSE_FETCH_RFC822_TEXT);
    assert_int_equal(a[15].kind, IMAPPARSE_FETCH_BODY);
    assert_int_equal(fx->cmd.fetch.changedsince_set, 0);

    csend(fx, "e UID FETCH 1:* (FLAGS) (CHANGEDSINCE 12345)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.fetch.changedsince_set, 1);
    assert_int_equal(fx->cmd.fetch.changedsince, 12345);
    assert_int_equal(fx->cmd.fetch.vanished, 0);

    csend(fx, "e UID FETCH 300:500 (FLAGS) (VANISHED CHANGEDSINCE 7)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.fetch.vanished, 1);
    assert_int_equal(fx->cmd.fetch.changedsince, 7);
    expect_bad(fx, "a UID FETCH 1 FLAGS (VANISHED)\r\n", IMAPPARSE_BAD, "a",
               "VANISHED without CHANGEDSINCE");
    expect_bad(fx, "a UID FETCH 1 FLAGS (CHANGEDSINCE 1 VANISHED VANISHED)"
               "\r\n", IMAPPARSE_BAD, "a", "Repeated");

    expect_bad(fx, "a FETCH 1 (ALL)\r\n", IMAPPARSE_BAD, "a", "not allowed");
    expect_bad(fx, "a FETCH 1 BODY[4.MIMEX]\r\n", IMAPPARSE_BAD, "a",
               "Invalid section");
    expect_bad(fx, "a FETCH 1 BODY[MIME]\r\n", IMAPPARSE_BAD, "a",
               "Invalid section");
    expect_bad(fx, "a FETCH 1 BODY[0]\r\n", IMAPPARSE_BAD, "a",
               "part number");
    expect_bad(fx, "a FETCH 1 BODY[1.]\r\n", IMAPPARSE_BAD, "a", "section");
    expect_bad(fx, "a FETCH 1 BODY[]<1.0>\r\n", IMAPPARSE_BAD, "a",
               "partial");
    expect_bad(fx, "a FETCH 1 BODY[]<1>\r\n", IMAPPARSE_BAD, "a", "partial");
    expect_bad(fx, "a FETCH 1 BODY[HEADER.FIELDS]\r\n", IMAPPARSE_BAD, "a",
               "field list");
    expect_bad(fx, "a FETCH 1 BODY[HEADER.FIELDS ()]\r\n", IMAPPARSE_BAD,
               "a", "Empty header field list");
    expect_bad(fx, "a FETCH 1 BODY[HEADER.FIELDS (A) ]\r\n", IMAPPARSE_BAD,
               "a", "Missing ']'");
    expect_bad(fx, "a FETCH 1 BODY[HEADER.FIELDS (\"a:b\")]\r\n",
               IMAPPARSE_BAD, "a", "field name");
    expect_bad(fx, "a FETCH 1 (FLAGS\r\n", IMAPPARSE_BAD, "a", "Missing ')'");
    expect_bad(fx, "a FETCH 1 ()\r\n", IMAPPARSE_BAD, "a", "Empty");
    expect_bad(fx, "a FETCH 1 FOO\r\n", IMAPPARSE_BAD, "a",
               "Invalid fetch attribute FOO");
    expect_bad(fx, "a FETCH 0 FLAGS\r\n", IMAPPARSE_BAD, "a",
               "sequence set");
    expect_bad(fx, "a FETCH FLAGS\r\n", IMAPPARSE_BAD, "a", "sequence set");
    expect_bad(fx, "a FETCH 1 FLAGS (CHANGEDSINCE 0)\r\n", IMAPPARSE_BAD,
               "a", "mod-sequence");
    expect_bad(fx, "a FETCH 1 FLAGS (X-VANISHED)\r\n", IMAPPARSE_BAD, "a",
               "Unknown modifier");
    expect_bad(fx, "a FETCH 1 FLAGS)\r\n", IMAPPARSE_BAD, "a",
               "Unexpected ')'");
    expect_bad(fx, "a FETCH 1 (FLAGS)(UID)\r\n", IMAPPARSE_BAD, "a",
               "Missing space");
}

/* ---- STORE --------------------------------------------------------- */

static void test_store(void **state)
{
    struct fx *fx = *state;

    csend(fx, "a STORE 1:3 +FLAGS (\\Seen $Junk)\r\n"
              "b UID STORE 7 -flags.silent \\Deleted foo\r\n"
              "c STORE * FLAGS ()\r\n"
              "d STORE 1 (UNCHANGEDSINCE 0) FLAGS.SILENT (\\Answered)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_STORE);
    assert_int_equal(fx->cmd.store.op, IMAPPARSE_STORE_ADD);
    assert_int_equal(fx->cmd.store.silent, 0);
    assert_int_equal(fx->cmd.store.flags.n, 2);
    assert_string_equal(fx->cmd.store.flags.s[0], "\\Seen");
    assert_string_equal(fx->cmd.store.flags.s[1], "$Junk");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.uid, 1);
    assert_int_equal(fx->cmd.store.op, IMAPPARSE_STORE_REMOVE);
    assert_int_equal(fx->cmd.store.silent, 1);
    assert_int_equal(fx->cmd.store.flags.n, 2);
    assert_string_equal(fx->cmd.store.flags.s[1], "foo");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.store.op, IMAPPARSE_STORE_REPLACE);
    assert_int_equal(fx->cmd.store.flags.n, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.store.unchangedsince_set, 1);
    assert_int_equal(fx->cmd.store.unchangedsince, 0);
    assert_int_equal(fx->cmd.store.silent, 1);

    expect_bad(fx, "a STORE 1 FLAGS\r\n", IMAPPARSE_BAD, "a", "Missing flags");
    expect_bad(fx, "a STORE 1 *FLAGS (\\Seen)\r\n", IMAPPARSE_BAD, "a",
               "store item");
    expect_bad(fx, "a STORE 1 FLAGS (\"x\")\r\n", IMAPPARSE_BAD, "a",
               "Invalid flag");
    expect_bad(fx, "a STORE 1 FLAGS (a%)\r\n", IMAPPARSE_BAD, "a",
               "Invalid flag");
    expect_bad(fx, "a STORE 1 FLAGS (\\Seen) x\r\n", IMAPPARSE_BAD, "a",
               "extra");
}

/* ---- SEARCH -------------------------------------------------------- */

static void test_search(void **state)
{
    struct fx *fx = *state;
    const struct imapparse_search *s, *k;

    csend(fx, "a SEARCH CHARSET utf-8 OR FROM \"Fred\" NOT (SEEN TO {3}\r\n"
              "b\xc3\xa9) 1:5,* UID 10:* SINCE 1-Feb-2024 "
              "SENTBEFORE \"2-Mar-2023\" LARGER 100 HEADER X-Spam yes "
              "KEYWORD $Junk UNKEYWORD foo MODSEQ 5 "
              "MODSEQ \"/flags/\\\\draft\" all 6 NEW OLD RECENT ALL "
              "UNANSWERED SMALLER 7 BEFORE 1-Jan-2000 ON 2-Jan-2000 "
              "SENTON 3-Jan-2000 SENTSINCE 4-Jan-2000 BCC b CC c BODY x "
              "SUBJECT s TEXT t\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_SEARCH);
    assert_int_equal(fx->cmd.utf8, 1);
    s = fx->cmd.search;
    assert_non_null(s);
    assert_int_equal(s->key, IMAPPARSE_S_AND);
    assert_int_equal(s->nchildren, 26);
    k = s->children[0];
    assert_int_equal(k->key, IMAPPARSE_S_OR);
    assert_int_equal(k->nchildren, 2);
    assert_int_equal(k->children[0]->key, IMAPPARSE_S_FROM);
    assert_string_equal(k->children[0]->str, "Fred");
    assert_int_equal(k->children[1]->key, IMAPPARSE_S_NOT);
    k = k->children[1]->children[0];
    assert_int_equal(k->key, IMAPPARSE_S_AND);
    assert_int_equal(k->nchildren, 2);
    assert_int_equal(k->children[0]->key, IMAPPARSE_S_FLAG);
    assert_string_equal(k->children[0]->flag, "\\Seen");
    assert_int_equal(k->children[1]->key, IMAPPARSE_S_TO);
    assert_string_equal(k->children[1]->str, "b\xc3\xa9");
    k = s->children[1];
    assert_int_equal(k->key, IMAPPARSE_S_SEQSET);
    assert_int_equal(k->set.n, 2);
    k = s->children[2];
    assert_int_equal(k->key, IMAPPARSE_S_UID);
    assert_int_equal(k->set.r[0].lo, 10);
    k = s->children[3];
    assert_int_equal(k->key, IMAPPARSE_S_SINCE);
    assert_int_equal(k->date.year, 2024);
    k = s->children[4];
    assert_int_equal(k->key, IMAPPARSE_S_SENTBEFORE);
    assert_int_equal(k->date.mon, 3);
    assert_int_equal(s->children[5]->key, IMAPPARSE_S_LARGER);
    assert_int_equal(s->children[5]->number, 100);
    k = s->children[6];
    assert_int_equal(k->key, IMAPPARSE_S_HEADER);
    assert_string_equal(k->field, "X-Spam");
    assert_string_equal(k->str, "yes");
    assert_int_equal(s->children[7]->key, IMAPPARSE_S_FLAG);
    assert_string_equal(s->children[7]->flag, "$Junk");
    assert_int_equal(s->children[8]->key, IMAPPARSE_S_UNFLAG);
    assert_string_equal(s->children[8]->flag, "foo");
    assert_int_equal(s->children[9]->key, IMAPPARSE_S_MODSEQ);
    assert_int_equal(s->children[9]->number, 5);
    assert_null(s->children[9]->field);
    assert_string_equal(s->children[10]->field, "/flags/\\draft");
    assert_string_equal(s->children[10]->str, "all");
    assert_int_equal(s->children[10]->number, 6);
    assert_int_equal(s->children[11]->key, IMAPPARSE_S_NEW);
    assert_int_equal(s->children[12]->key, IMAPPARSE_S_OLD);
    assert_int_equal(s->children[13]->key, IMAPPARSE_S_RECENT);
    assert_int_equal(s->children[14]->key, IMAPPARSE_S_ALL);
    assert_int_equal(s->children[15]->key, IMAPPARSE_S_UNFLAG);
    assert_string_equal(s->children[15]->flag, "\\Answered");
    assert_int_equal(s->children[16]->key, IMAPPARSE_S_SMALLER);
    assert_int_equal(s->children[17]->key, IMAPPARSE_S_BEFORE);
    assert_int_equal(s->children[18]->key, IMAPPARSE_S_ON);
    assert_int_equal(s->children[19]->key, IMAPPARSE_S_SENTON);
    assert_int_equal(s->children[20]->key, IMAPPARSE_S_SENTSINCE);
    assert_int_equal(s->children[20]->date.mday, 4);
    assert_int_equal(s->children[21]->key, IMAPPARSE_S_BCC);
    assert_int_equal(s->children[22]->key, IMAPPARSE_S_CC);
    assert_int_equal(s->children[23]->key, IMAPPARSE_S_BODY);
    assert_int_equal(s->children[24]->key, IMAPPARSE_S_SUBJECT);
    assert_int_equal(s->children[25]->key, IMAPPARSE_S_TEXT);
    assert_string_equal(s->children[25]->str, "t");

    csend(fx, "b UID SEARCH deleted\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.uid, 1);
    assert_int_equal(fx->cmd.utf8, 0);
    assert_int_equal(fx->cmd.search->nchildren, 1);
    assert_string_equal(fx->cmd.search->children[0]->flag, "\\Deleted");

    expect_bad(fx, "a SEARCH CHARSET KOI8-R ALL\r\n", IMAPPARSE_BADCHARSET,
               "a", "KOI8-R");
    expect_bad(fx, "a SEARCH\r\n", IMAPPARSE_BAD, "a", "Missing search key");
    expect_bad(fx, "a SEARCH FOO\r\n", IMAPPARSE_BAD, "a",
               "Invalid search key FOO");
    expect_bad(fx, "a SEARCH OR SEEN\r\n", IMAPPARSE_BAD, "a",
               "Missing search key");
    expect_bad(fx, "a SEARCH SINCE 31-Feb-2024\r\n", IMAPPARSE_BAD, "a",
               "date");
    expect_bad(fx, "a SEARCH LARGER x\r\n", IMAPPARSE_BAD, "a", "number");
    expect_bad(fx, "a SEARCH ()\r\n", IMAPPARSE_BAD, "a", "Missing");
    expect_bad(fx, "a SEARCH HEADER \"a b\" x\r\n", IMAPPARSE_BAD, "a",
               "field name");
    expect_bad(fx, "a SEARCH MODSEQ \"/flags/x\" bogus 5\r\n", IMAPPARSE_BAD,
               "a", "entry type");
    expect_bad(fx, "a SEARCH FROM\r\n", IMAPPARSE_BAD, "a", "search string");

    /* NOT NOT NOT ... nested past max_depth */
    {
        struct buf line = BUF_INITIALIZER;
        int i;

        buf_appendcstr(&line, "a SEARCH");
        for (i = 0; i < 40; i++)
            buf_appendcstr(&line, " NOT");
        buf_appendcstr(&line, " ALL\r\n");
        expect_bad(fx, buf_cstring(&line), IMAPPARSE_TOOBIG, "a",
                   "nested");
        buf_reset(&line);
        buf_appendcstr(&line, "a SEARCH ");
        for (i = 0; i < 40; i++)
            buf_putc(&line, '(');
        buf_appendcstr(&line, "ALL");
        for (i = 0; i < 40; i++)
            buf_putc(&line, ')');
        buf_appendcstr(&line, "\r\n");
        expect_bad(fx, buf_cstring(&line), IMAPPARSE_TOOBIG, "a", "nested");
        buf_free(&line);
    }
}

/* ---- STATUS, COPY, MOVE, EXPUNGE, ENABLE, ID, AUTHENTICATE ---------- */

static void test_misc_commands(void **state)
{
    struct fx *fx = *state;

    csend(fx, "a STATUS inbox (MESSAGES uidnext UIDVALIDITY UNSEEN RECENT "
              "HIGHESTMODSEQ)\r\n"
              "b COPY 1:2 Archive\r\nc UID MOVE 5 \"Trash\"\r\n"
              "d UID EXPUNGE 3:4\r\ne EXPUNGE\r\n"
              "f ENABLE CONDSTORE X-Foo\r\n"
              "g ID (\"name\" \"mutt\" \"version\" NIL)\r\nh ID NIL\r\n"
              "i AUTHENTICATE plain\r\nj AUTHENTICATE PLAIN AGZyZWQAc2VjcmV0\r\n"
              "k AUTHENTICATE PLAIN =\r\nl CHECK\r\nm CLOSE\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_STATUS);
    assert_string_equal(fx->cmd.arg[0], "INBOX");
    assert_int_equal(fx->cmd.status.n, 6);
    assert_int_equal(fx->cmd.status.items[0], IMAPPARSE_STATUS_MESSAGES);
    assert_int_equal(fx->cmd.status.items[1], IMAPPARSE_STATUS_UIDNEXT);
    assert_int_equal(fx->cmd.status.items[5], IMAPPARSE_STATUS_HIGHESTMODSEQ);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_COPY);
    assert_int_equal(fx->cmd.set.r[0].hi, 2);
    assert_string_equal(fx->cmd.arg[0], "Archive");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_MOVE);
    assert_int_equal(fx->cmd.uid, 1);
    assert_string_equal(fx->cmd.arg[0], "Trash");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_EXPUNGE);
    assert_int_equal(fx->cmd.uid, 1);
    assert_int_equal(fx->cmd.set.r[0].lo, 3);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_EXPUNGE);
    assert_int_equal(fx->cmd.set.n, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_ENABLE);
    assert_int_equal(fx->cmd.words.n, 2);
    assert_string_equal(fx->cmd.words.s[0], "CONDSTORE");
    assert_string_equal(fx->cmd.words.s[1], "X-Foo");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_ID);
    assert_int_equal(fx->cmd.idparams.nil, 0);
    assert_int_equal(fx->cmd.idparams.n, 2);
    assert_string_equal(fx->cmd.idparams.field[0], "name");
    assert_string_equal(fx->cmd.idparams.value[0], "mutt");
    assert_null(fx->cmd.idparams.value[1]);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.idparams.nil, 1);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_AUTHENTICATE);
    assert_string_equal(fx->cmd.arg[0], "PLAIN");
    assert_null(fx->cmd.arg[1]);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[1], "AGZyZWQAc2VjcmV0");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[1], "=");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_CHECK);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_CLOSE);

    expect_bad(fx, "a STATUS x (MESSAGES MESSAGES)\r\n", IMAPPARSE_BAD, "a",
               "Repeated");
    expect_bad(fx, "a STATUS x (SIZES)\r\n", IMAPPARSE_BAD, "a",
               "Invalid status item SIZES");
    expect_bad(fx, "a STATUS x ()\r\n", IMAPPARSE_BAD, "a", "status item");
    expect_bad(fx, "a STATUS x\r\n", IMAPPARSE_BAD, "a", "status item list");
    expect_bad(fx, "a COPY 1\r\n", IMAPPARSE_BAD, "a", "mailbox");
    expect_bad(fx, "a ENABLE\r\n", IMAPPARSE_BAD, "a", "capability");
    expect_bad(fx, "a ID (\"a\")\r\n", IMAPPARSE_BAD, "a", "ID value");
    expect_bad(fx, "a ID (name \"x\")\r\n", IMAPPARSE_BAD, "a", "field name");
    expect_bad(fx, "a ID (\"0123456789012345678901234567890\" NIL)\r\n",
               IMAPPARSE_BAD, "a", "too long");
    expect_bad(fx, "a AUTHENTICATE PLAIN a*b\r\n", IMAPPARSE_BAD, "a",
               "initial response");
    expect_bad(fx, "a UID NOOP\r\n", IMAPPARSE_BAD, "a", "Invalid UID command");
    expect_bad(fx, "a UID\r\n", IMAPPARSE_BAD, "a", "Missing command");
    expect_bad(fx, "a NOOP x\r\n", IMAPPARSE_BAD, "a", "extra arguments");
    expect_bad(fx, "a EXPUNGE 1\r\n", IMAPPARSE_BAD, "a", "extra");
}

/* ---- APPEND -------------------------------------------------------- */

static int cont_calls;
static size_t cont_size;
static int cont_append;

static int cont_cb(void *rock, struct prot *p, size_t size, int append,
                   const char **error_r)
{
    size_t limit = *(size_t *)rock;

    cont_calls++;
    cont_size = size;
    cont_append = append;
    if (append && size > limit) {
        *error_r = "[TOOBIG] Over quota";
        return 1;
    }
    prot_puts(p, "+ go ahead\r\n");
    return prot_flush(p) == PROT_OK ? 0 : -1;
}

static void test_acl_quota(void **state)
{
    struct fx *fx = *state;

    csend(fx, "a SETACL inbox.X \"bob@example.com\" +lr\r\n"
              "b DELETEACL Shared -bob\r\nc GETACL INBOX\r\n"
              "d LISTRIGHTS X anyone\r\ne MYRIGHTS X\r\n"
              "f GETQUOTA \"\"\r\ng GETQUOTAROOT inbox\r\n"
              "h SETQUOTA user.bob (STORAGE 512 message 10)\r\n"
              "i SETQUOTA user.bob ()\r\nj SETACL X bob \"\"\r\n"
              "k STATUS X (deleted DELETED-STORAGE)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_SETACL);
    assert_string_equal(fx->cmd.arg[0], "INBOX.X");
    assert_int_equal(fx->cmd.words.n, 2);
    assert_string_equal(fx->cmd.words.s[0], "bob@example.com");
    assert_string_equal(fx->cmd.words.s[1], "+lr");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_DELETEACL);
    assert_int_equal(fx->cmd.words.n, 1);
    assert_string_equal(fx->cmd.words.s[0], "-bob");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_GETACL);
    assert_int_equal(fx->cmd.words.n, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_LISTRIGHTS);
    assert_string_equal(fx->cmd.words.s[0], "anyone");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_MYRIGHTS);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_GETQUOTA);
    assert_string_equal(fx->cmd.arg[0], "");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_GETQUOTAROOT);
    assert_string_equal(fx->cmd.arg[0], "INBOX");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_SETQUOTA);
    assert_string_equal(fx->cmd.arg[0], "user.bob");
    assert_int_equal(fx->cmd.words.n, 4);
    assert_string_equal(fx->cmd.words.s[0], "STORAGE");
    assert_string_equal(fx->cmd.words.s[1], "512");
    assert_string_equal(fx->cmd.words.s[2], "message");
    assert_string_equal(fx->cmd.words.s[3], "10");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_SETQUOTA);
    assert_int_equal(fx->cmd.words.n, 0);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_SETACL);
    assert_string_equal(fx->cmd.words.s[1], "");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_STATUS);
    assert_int_equal(fx->cmd.status.n, 2);
    assert_int_equal(fx->cmd.status.items[0], IMAPPARSE_STATUS_DELETED);
    assert_int_equal(fx->cmd.status.items[1],
                     IMAPPARSE_STATUS_DELETED_STORAGE);

    expect_bad(fx, "a SETACL X bob\r\n", IMAPPARSE_BAD, "a", "rights");
    expect_bad(fx, "a SETACL X bob lr x\r\n", IMAPPARSE_BAD, "a", "extra");
    expect_bad(fx, "a DELETEACL X\r\n", IMAPPARSE_BAD, "a", "identifier");
    expect_bad(fx, "a GETACL\r\n", IMAPPARSE_BAD, "a", "mailbox");
    expect_bad(fx, "a LISTRIGHTS X (bob)\r\n", IMAPPARSE_BAD, "a", NULL);
    expect_bad(fx, "a SETQUOTA r STORAGE 1\r\n", IMAPPARSE_BAD, "a",
               "resource list");
    expect_bad(fx, "a SETQUOTA r (STORAGE)\r\n", IMAPPARSE_BAD, "a",
               "limit");
    expect_bad(fx, "a SETQUOTA r (STORAGE -1)\r\n", IMAPPARSE_BAD, "a",
               "limit");
    expect_bad(fx, "a SETQUOTA r (STORAGE 1\r\n", IMAPPARSE_BAD, "a", ")");
    expect_bad(fx, "a SETQUOTA r (STORAGE 1) x\r\n", IMAPPARSE_BAD, "a",
               "extra");
    expect_bad(fx, "a SETQUOTA r (\"STORAGE\" 1)\r\n", IMAPPARSE_BAD, "a",
               "resource name");
    expect_bad(fx, "a SETQUOTA r (STORAGE 123456789012345678901)\r\n",
               IMAPPARSE_BAD, "a", "limit");
}

static void test_append(void **state)
{
    struct fx *fx = *state;
    struct buf msg = BUF_INITIALIZER, out = BUF_INITIALIZER;
    size_t quota = 100;

    fx->opts.cont = cont_cb;
    fx->opts.rock = &quota;
    csend(fx, "a APPEND {5}\r\ninbox (\\Seen $x) \" 7-Feb-1994 21:52:25 "
              "-0800\" {12}\r\nHello\r\nWorld\r\n"
              "b APPEND Drafts {3+}\r\nabc\r\n");
    cont_calls = 0;
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.id, IMAPPARSE_CMD_APPEND);
    assert_string_equal(fx->cmd.arg[0], "INBOX");
    assert_int_equal(fx->cmd.append.flags_set, 1);
    assert_int_equal(fx->cmd.append.flags.n, 2);
    assert_string_equal(fx->cmd.append.flags.s[1], "$x");
    assert_int_equal(fx->cmd.append.date_set, 1);
    assert_int_equal((long long)fx->cmd.append.date, 760686745LL);
    assert_int_equal(fx->cmd.append.size, 12);
    assert_int_equal(fx->cmd.append.nonsync, 0);
    assert_int_equal(cont_calls, 2);            /* mailbox + message */
    assert_int_equal(cont_size, 12);
    assert_int_equal(cont_append, 1);
    client_output(fx, &out);
    assert_string_equal(buf_cstring(&out), "+ go ahead\r\n+ go ahead\r\n");
    /* the parser did not read the message: the caller streams it */
    assert_int_equal(prot_read(fx->p, &msg, fx->cmd.append.size), PROT_OK);
    assert_string_equal(buf_cstring(&msg), "Hello\r\nWorld");
    assert_int_equal(imapparse_append_end(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_OK);

    cont_calls = 0;
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[0], "Drafts");
    assert_int_equal(fx->cmd.append.flags_set, 0);
    assert_int_equal(fx->cmd.append.date_set, 0);
    assert_int_equal(fx->cmd.append.size, 3);
    assert_int_equal(fx->cmd.append.nonsync, 1);
    assert_int_equal(cont_calls, 0);
    buf_reset(&msg);
    assert_int_equal(prot_read(fx->p, &msg, 3), PROT_OK);
    assert_string_equal(buf_cstring(&msg), "abc");
    assert_int_equal(imapparse_append_end(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_OK);

    /* refused by the callback: the client sends nothing more */
    expect_bad(fx, "c APPEND x {1000}\r\n", IMAPPARSE_REFUSED, "c",
               "[TOOBIG] Over quota");
    /* over max_append: refused before the callback */
    fx->opts.max_append = 50;
    cont_calls = 0;
    expect_bad(fx, "c APPEND x {60}\r\n", IMAPPARSE_TOOBIG, "c",
               "Message too large");
    assert_int_equal(cont_calls, 0);
    /* ... and a {n+} one is dropped to stay in sync */
    expect_bad(fx, "c APPEND x {60+}\r\n"
                   "012345678901234567890123456789012345678901234567890123456789"
                   "\r\n", IMAPPARSE_TOOBIG, "c", "Message too large");
    /* bad arguments before a {n+} message: the message is dropped */
    expect_bad(fx, "d APPEND x (\\Seen \"7-Feb-1994\" {4+}\r\nA NO\r\n",
               IMAPPARSE_BAD, "d", "Missing ')'");
    expect_bad(fx, "d APPEND x (\\Seen \"x\") {4+}\r\nA NO\r\n",
               IMAPPARSE_BAD, "d", "Invalid flag");
    expect_bad(fx, "d APPEND x \"7-Feb-1994\" {4+}\r\nA NO\r\n",
               IMAPPARSE_BAD, "d", "date-time");
    cont_calls = 0;
    expect_bad(fx, "d APPEND x \"7-Feb-1994\" {4}\r\n", IMAPPARSE_BAD, "d",
               "date-time");
    assert_int_equal(cont_calls, 0);    /* no "+" for a bad command */
    expect_bad(fx, "e APPEND x\r\n", IMAPPARSE_BAD, "e",
               "Missing message literal");
    expect_bad(fx, "e APPEND\r\n", IMAPPARSE_BAD, "e", "mailbox");

    /* junk after the message */
    csend(fx, "f APPEND x {2+}\r\nhi junk {3+}\r\nabc\r\nZ NOOP\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    buf_reset(&msg);
    assert_int_equal(prot_read(fx->p, &msg, 2), PROT_OK);
    assert_int_equal(imapparse_append_end(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_BAD);
    assert_string_equal(fx->cmd.error, "Junk after message literal");
    expect_noop(fx, "Z");
    buf_free(&msg);
    buf_free(&out);
}

/* MULTIAPPEND, CATENATE, literal8 and UTF8 as events */
static void next_ok(struct fx *fx, int event)
{
    assert_int_equal(imapparse_append_next(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_OK);
    assert_int_equal(fx->cmd.append.event, event);
}

static void read_datan(struct fx *fx, const char *want, size_t len)
{
    struct buf d = BUF_INITIALIZER;

    assert_int_equal(fx->cmd.append.size, len);
    assert_int_equal(prot_read(fx->p, &d, fx->cmd.append.size), PROT_OK);
    assert_memory_equal(d.s, want, len);
    buf_free(&d);
}

static void read_data(struct fx *fx, const char *want)
{
    struct buf d = BUF_INITIALIZER;

    assert_int_equal(fx->cmd.append.size, strlen(want));
    assert_int_equal(prot_read(fx->p, &d, fx->cmd.append.size), PROT_OK);
    assert_memory_equal(d.s, want, strlen(want));
    buf_free(&d);
}

/* an APPEND whose error shows after its first event(s) */
static void expect_bad_later(struct fx *fx, const char *line, int result,
                             const char *text)
{
    int r;

    csend(fx, line);
    csend(fx, "Z NOOP\r\n");
    r = rd(fx);
    while (r == IMAPPARSE_OK) {
        if ((fx->cmd.append.event == IMAPPARSE_APPEND_MESSAGE
             || fx->cmd.append.event == IMAPPARSE_APPEND_TEXT)
            && fx->cmd.append.size)
            assert_int_equal(prot_read(fx->p, NULL, fx->cmd.append.size),
                             PROT_OK);
        assert_int_not_equal(fx->cmd.append.event, IMAPPARSE_APPEND_END);
        r = imapparse_append_next(fx->p, &fx->opts, &fx->cmd);
    }
    if (r != result || !strstr(fx->cmd.error, text))
        fail_msg("command %s: result %d (%s)", line, r, fx->cmd.error);
    expect_noop(fx, "Z");
}

static void test_append_events(void **state)
{
    struct fx *fx = *state;
    struct buf out = BUF_INITIALIZER;
    size_t quota = 100;

    fx->opts.cont = cont_cb;
    fx->opts.rock = &quota;
    /* three messages, the second with flags and a date, the third a
     * literal8 with a NUL */
    {
        static const char cmd[] = "a APPEND x {2+}\r\nm1 (\\Seen) "
            "\"7-Feb-1994 21:52:25 -0800\" {2}\r\nm2 ~{3+}\r\nm\0003\r\n";

        assert_int_equal(write_all(fx->sv[1], cmd, sizeof(cmd) - 1), 0);
    }
    cont_calls = 0;
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.append.event, IMAPPARSE_APPEND_MESSAGE);
    assert_int_equal(fx->cmd.append.nmsg, 1);
    assert_int_equal(fx->cmd.append.flags_set, 0);
    assert_int_equal(fx->cmd.append.binary, 0);
    read_data(fx, "m1");
    next_ok(fx, IMAPPARSE_APPEND_MESSAGE);
    assert_int_equal(fx->cmd.append.nmsg, 2);
    assert_int_equal(fx->cmd.append.flags.n, 1);
    assert_string_equal(fx->cmd.append.flags.s[0], "\\Seen");
    assert_int_equal(fx->cmd.append.date_set, 1);
    assert_int_equal(cont_calls, 1);
    read_data(fx, "m2");
    next_ok(fx, IMAPPARSE_APPEND_MESSAGE);
    assert_int_equal(fx->cmd.append.nmsg, 3);
    assert_int_equal(fx->cmd.append.flags_set, 0);
    assert_int_equal(fx->cmd.append.date_set, 0);
    assert_int_equal(fx->cmd.append.binary, 1);
    assert_int_equal(fx->cmd.append.nonsync, 1);
    read_datan(fx, "m\0003", 3);
    next_ok(fx, IMAPPARSE_APPEND_END);
    assert_int_equal(imapparse_append_next(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_BAD);

    /* CATENATE with TEXT, URL (quoted and literal), then a plain one */
    csend(fx, "b APPEND x (\\Draft) CATENATE (TEXT {3+}\r\nabc URL "
              "\"/INBOX;UIDVALIDITY=5/;UID=2/;SECTION=1\" URL {6+}\r\n"
              ";UID=1 TEXT ~{1+}\r\nz) {1+}\r\nq\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.append.event, IMAPPARSE_APPEND_CATENATE);
    assert_int_equal(fx->cmd.append.flags.n, 1);
    next_ok(fx, IMAPPARSE_APPEND_TEXT);
    read_data(fx, "abc");
    next_ok(fx, IMAPPARSE_APPEND_URL);
    assert_string_equal(fx->cmd.append.url,
                        "/INBOX;UIDVALIDITY=5/;UID=2/;SECTION=1");
    next_ok(fx, IMAPPARSE_APPEND_URL);
    assert_string_equal(fx->cmd.append.url, ";UID=1");
    next_ok(fx, IMAPPARSE_APPEND_TEXT);
    assert_int_equal(fx->cmd.append.binary, 1);
    read_data(fx, "z");
    next_ok(fx, IMAPPARSE_APPEND_CATEND);
    next_ok(fx, IMAPPARSE_APPEND_MESSAGE);
    assert_int_equal(fx->cmd.append.nmsg, 2);
    read_data(fx, "q");
    next_ok(fx, IMAPPARSE_APPEND_END);

    /* UTF8 (~{n}) */
    csend(fx, "c APPEND x UTF8 (~{2+}\r\nab)\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_int_equal(fx->cmd.append.utf8, 1);
    read_data(fx, "ab");
    next_ok(fx, IMAPPARSE_APPEND_END);

    /* errors in the middle drop the rest and stay in sync */
    csend(fx, "d APPEND x {1+}\r\na junk {3+}\r\nabc\r\nZ NOOP\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    read_data(fx, "a");
    assert_int_equal(imapparse_append_next(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_BAD);
    expect_noop(fx, "Z");
    /* a second message over max_append: TOOBIG, its {n+} data dropped */
    fx->opts.max_append = 10;
    csend(fx, "e APPEND x {1+}\r\na {11+}\r\n01234567890\r\nZ NOOP\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    read_data(fx, "a");
    assert_int_equal(imapparse_append_next(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_TOOBIG);
    assert_int_equal(fx->cmd.append.size, 11);
    expect_noop(fx, "Z");
    fx->opts.max_append = 0;
    /* a synchronizing second message refused: no "+", the command ends */
    quota = 5;
    csend(fx, "f APPEND x {1+}\r\na {6}\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    read_data(fx, "a");
    client_output(fx, &out);
    assert_int_equal(imapparse_append_next(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_REFUSED);
    client_output(fx, &out);
    assert_int_equal(out.len, 0);
    csend(fx, "Z NOOP\r\n");
    expect_noop(fx, "Z");
    quota = 100;
    expect_bad(fx, "g APPEND x CATENATE ()\r\n", IMAPPARSE_BAD, "g",
               "Empty CATENATE");
    csend(fx, "g APPEND x CATENATE (TEXT {1+}\r\na\r\nZ NOOP\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    next_ok(fx, IMAPPARSE_APPEND_TEXT);
    read_data(fx, "a");
    assert_int_equal(imapparse_append_next(fx->p, &fx->opts, &fx->cmd),
                     IMAPPARSE_BAD);
    assert_non_null(strstr(fx->cmd.error, "Missing ')'"));
    expect_noop(fx, "Z");
    expect_bad_later(fx, "h APPEND x CATENATE (FOO)\r\n", IMAPPARSE_BAD,
                     "CATENATE part");
    expect_bad_later(fx, "h APPEND x CATENATE (URL)\r\n", IMAPPARSE_BAD,
                     "URL");
    expect_bad_later(fx, "h APPEND x {1+}\r\na CATENATE (TEXT {1+}\r\nb "
                         "URL \"u\" TEXT {2+}\r\ncd\r\n", IMAPPARSE_BAD,
                     "Missing ')'");
    expect_bad_later(fx, "h APPEND x {1+}\r\na (\\Seen)\r\n", IMAPPARSE_BAD,
                     "Missing message literal");
    expect_bad(fx, "h APPEND x UTF8 ({2+}\r\nab)\r\n", IMAPPARSE_BAD, "h",
               "literal8");
    expect_bad(fx, "i APPEND x (~{2+}\r\nab) {1+}\r\na\r\n", IMAPPARSE_BAD,
               "i", NULL);
    expect_bad(fx, "j FETCH 1 ~{2+}\r\nab\r\n", IMAPPARSE_BAD, "j", NULL);
    buf_free(&out);
}

/* ---- lexical errors and resynchronization -------------------------- */

static void test_malformed(void **state)
{
    struct fx *fx = *state;

    expect_bad(fx, "\r\n", IMAPPARSE_BAD, NULL, "Empty command line");
    expect_bad(fx, "a+b NOOP\r\n", IMAPPARSE_BAD, NULL, "Invalid tag");
    expect_bad(fx, "a(b NOOP\r\n", IMAPPARSE_BAD, NULL, "Invalid tag");
    expect_bad(fx, "tagonly\r\n", IMAPPARSE_BAD, "tagonly", "Missing command");
    expect_bad(fx, "a \r\n", IMAPPARSE_BAD, "a", "Missing command");
    expect_bad(fx, "a NO0P\r\n", IMAPPARSE_BAD, "a", "Invalid command name");
    expect_bad(fx, "a FROB x\r\n", IMAPPARSE_BAD, "a",
               "Unrecognized command FROB");
    expect_bad(fx, "a LOGIN  x y\r\n", IMAPPARSE_BAD, "a", "Unexpected space");
    expect_bad(fx, "a LOGIN x y \r\n", IMAPPARSE_BAD, "a", "Unexpected space");
    expect_bad(fx, "a LOGIN \"x\"y z\r\n", IMAPPARSE_BAD, "a",
               "Missing space");
    expect_bad(fx, "a LOGIN \"x y\r\n", IMAPPARSE_BAD, "a", "Unterminated");
    expect_bad(fx, "a LOGIN \"x\\y\" z\r\n", IMAPPARSE_BAD, "a",
               "Invalid escape");
    expect_bad(fx, "a LOGIN x\x01 y\r\n", IMAPPARSE_BAD, "a",
               "Invalid character");
    expect_bad(fx, "a LOGIN x\xff y\r\n", IMAPPARSE_BAD, "a",
               "Invalid character");
    expect_bad(fx, "a LOGIN {3x}\r\n", IMAPPARSE_BAD, "a", "Invalid literal");
    expect_bad(fx, "a LOGIN {3} y\r\n", IMAPPARSE_BAD, "a", "Invalid literal");
    expect_bad(fx, "a LOGIN {99999999999999999999}\r\n", IMAPPARSE_BAD, "a",
               "Invalid literal");
    expect_bad(fx, "a STATUS x ((MESSAGES)\r\n", IMAPPARSE_BAD, "a",
               "Missing ')'");
    expect_bad(fx, "a LOGIN x y)\r\n", IMAPPARSE_BAD, "a", "Unexpected ')'");
    /* NUL in a quoted string and in a literal */
    {
        static const char q[] = "a LOGIN \"x\0y\" z\r\n";
        static const char l[] = "a LOGIN {3+}\r\nx\0y z\r\n";

        assert_int_equal(write_all(fx->sv[1], q, sizeof(q) - 1), 0);
        expect_bad(fx, "", IMAPPARSE_BAD, "a", "Invalid character");
        assert_int_equal(write_all(fx->sv[1], l, sizeof(l) - 1), 0);
        expect_bad(fx, "", IMAPPARSE_BAD, "a", "NUL in literal");
    }
    /* an error in a line followed by {n+} literals: all of it dropped,
     * including a literal that looks like a command */
    expect_bad(fx, "a LOGIN \"bad\\q\" {12+}\r\nb LOGOUT\r\n\r\n {5+}\r\n"
                   "c NOO\r\n", IMAPPARSE_BAD, "a", "Invalid escape");
    /* an error after a literal was read */
    expect_bad(fx, "a LOGIN {2+}\r\nab \"x\\y\"\r\n", IMAPPARSE_BAD, "a",
               "Invalid escape");
    /* a failed argument leaves no stale pointer behind */
    csend(fx, "a LIST\r\nb LOGIN x\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_BAD);
    assert_null(fx->cmd.arg[0]);
    assert_null(fx->cmd.arg[1]);
    assert_int_equal(rd(fx), IMAPPARSE_BAD);
    assert_string_equal(fx->cmd.arg[0], "x");
    assert_null(fx->cmd.arg[1]);
    assert_string_equal(fx->cmd.error, "Missing password");
    /* bare LF line ends work like CRLF */
    csend(fx, "a1 LOGIN {2+}\nab cd\n");
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[0], "ab");
    assert_string_equal(fx->cmd.arg[1], "cd");
}

/* ---- limits -------------------------------------------------------- */

static void test_limits(void **state)
{
    struct fx *fx = *state;
    struct buf line = BUF_INITIALIZER, out = BUF_INITIALIZER;
    size_t i;

    fx->opts.max_line = 100;
    fx->opts.max_literal = 20;
    fx->opts.max_command = 200;
    fx->opts.max_skip = 1000;
    fx->opts.max_tokens = 50;

    /* an over-long line: BAD with the tag, rest of the line skipped */
    buf_appendcstr(&line, "long LOGIN ");
    for (i = 0; i < 200; i++)
        buf_putc(&line, 'x');
    buf_appendcstr(&line, " y\r\n");
    expect_bad(fx, buf_cstring(&line), IMAPPARSE_TOOBIG, "long",
               "Line too long");

    /* an over-long line after a literal: its "{5+}" end is not seen */
    buf_reset(&line);
    buf_appendcstr(&line, "long LOGIN {2+}\r\nab ");
    for (i = 0; i < 150; i++)
        buf_putc(&line, 'x');
    buf_appendcstr(&line, " {5+}\r\n");
    expect_bad(fx, buf_cstring(&line), IMAPPARSE_TOOBIG, "long",
               "Line too long");

    /* an oversized synchronizing literal: refused before it is sent */
    client_output(fx, &out);
    expect_bad(fx, "a LOGIN {21}\r\n", IMAPPARSE_TOOBIG, "a",
               "Literal too large");
    client_output(fx, &out);
    assert_int_equal(out.len, 0);   /* no "+" was sent */
    /* an oversized {n+}: dropped */
    expect_bad(fx, "a LOGIN {21+}\r\n012345678901234567890 x\r\n",
               IMAPPARSE_TOOBIG, "a", "Literal too large");
    /* one past max_skip: cannot be resynchronized */
    csend(fx, "a LOGIN {1001+}\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_DESYNC);
    assert_false(imapparse_in_sync(IMAPPARSE_DESYNC));
    assert_non_null(strstr(fx->cmd.error, "too large"));
    buf_free(&line);
    buf_free(&out);
}

static void test_limits_command(void **state)
{
    struct fx *fx = *state;
    struct buf line = BUF_INITIALIZER;
    int i;

    fx->opts.max_literal = 20;
    fx->opts.max_command = 60;
    fx->opts.max_tokens = 10;
    /* many literals, each fine, together over max_command */
    buf_appendcstr(&line, "a STORE 1 FLAGS");
    for (i = 0; i < 6; i++)
        buf_appendcstr(&line, " {10+}\r\n0123456789");
    buf_appendcstr(&line, "\r\n");
    expect_bad(fx, buf_cstring(&line), IMAPPARSE_TOOBIG, "a",
               "Command too long");
    /* too many tokens */
    expect_bad(fx, "a STORE 1 FLAGS a b c d e f g h i j k\r\n",
               IMAPPARSE_TOOBIG, "a", "Too many arguments");
    /* nesting */
    fx->opts.max_depth = 3;
    expect_bad(fx, "a FETCH 1 ((((FLAGS))))\r\n", IMAPPARSE_TOOBIG, "a",
               "nested");
    /* a silent client: the prot timeout */
    prot_settimeout(fx->p, 1);
    csend(fx, "a LOGIN {2+}\r\n");
    assert_int_equal(rd(fx), IMAPPARSE_TIMEOUT);
    assert_false(imapparse_in_sync(IMAPPARSE_TIMEOUT));
    buf_free(&line);
}

/* ---- real clients in other processes ------------------------------- */

/* Reads the server's output up to and including a line starting "+". */
static int wait_plus(int fd)
{
    char c, prev = '\n';

    for (;;) {
        ssize_t n = read(fd, &c, 1);

        if (n <= 0)
            return -1;
        if (prev == '\n' && c == '+')
            break;
        prev = c;
    }
    while (read(fd, &c, 1) == 1)
        if (c == '\n')
            return 0;
    return -1;
}

static void test_sync_literal_dialogue(void **state)
{
    struct fx *fx = *state;
    pid_t pid = fork();
    int status = 0;

    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = fx->sv[1];

        th_child_signals();
        alarm(20);
        /* a client that waits for "+" before each literal, as it must */
        if (write_all(fd, "a LOGIN {4}\r\n", 13) < 0 || wait_plus(fd) < 0
            || write_all(fd, "user {6}\r\n", 10) < 0 || wait_plus(fd) < 0
            || write_all(fd, "se cr3\r\nb NOOP\r\n", 16) < 0)
            _exit(1);
        _exit(0);
    }
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.arg[0], "user");
    assert_string_equal(fx->cmd.arg[1], "se cr3");
    expect_noop(fx, "b");
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_one_byte_at_a_time(void **state)
{
    struct fx *fx = *state;
    static const char input[] =
        "t1 UID FETCH 1:*,7 (FLAGS BODY.PEEK[HEADER.FIELDS (FROM {2+}\r\n"
        "TO)]<0.100>) (CHANGEDSINCE 9)\r\n"
        "t2 SEARCH NOT SUBJECT \"x\\\"\" OR 1 UID 2\r\nt3 NOOP\r\n";
    pid_t pid = fork();
    int status = 0;

    assert_true(pid >= 0);
    if (pid == 0) {
        size_t i;

        th_child_signals();
        alarm(20);
        for (i = 0; i + 1 < sizeof(input); i++) {
            if (write_all(fx->sv[1], input + i, 1) < 0)
                _exit(1);
            usleep(200);
        }
        _exit(0);
    }
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.tag, "t1");
    assert_int_equal(fx->cmd.fetch.n, 2);
    assert_string_equal(fx->cmd.fetch.atts[1].section,
                        "HEADER.FIELDS (FROM TO)");
    assert_int_equal(fx->cmd.fetch.changedsince, 9);
    assert_int_equal(rd(fx), IMAPPARSE_OK);
    assert_string_equal(fx->cmd.search->children[0]->children[0]->str, "x\"");
    expect_noop(fx, "t3");
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ---- memory streams and a mutation loop ---------------------------- */

static void test_mem_stream_mutations(void **state)
{
    static const char *const seeds[] = {
        "a FETCH 1:* (FLAGS BODY.PEEK[1.HEADER.FIELDS (From To)]<0.10>)\r\n",
        "b SEARCH CHARSET UTF-8 OR (FROM {3+}\r\nabc) NOT SEEN UID 1:5\r\n",
        "c APPEND INBOX (\\Seen) \"01-Jan-2020 10:00:00 +0000\" {3+}\r\nabc\r\n",
        "d STORE 1 (UNCHANGEDSINCE 5) +FLAGS.SILENT (\\Deleted)\r\n",
        "e ID (\"name\" \"x\")\r\nf STATUS x (MESSAGES)\r\n",
    };
    size_t s, iter;
    unsigned seed = 1;

    (void)state;
    for (s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        for (iter = 0; iter < 300; iter++) {
            char data[256];
            size_t len = strlen(seeds[s]), k;
            struct prot *p;
            struct imapparse_cmd cmd;
            int r, rounds = 0;

            memcpy(data, seeds[s], len);
            /* truncate or flip a few bytes */
            seed = seed * 1103515245u + 12345u;
            if (iter % 3 == 0)
                len = (seed >> 8) % (len + 1);
            for (k = 0; k < 1 + iter % 4 && len > 0; k++) {
                seed = seed * 1103515245u + 12345u;
                data[(seed >> 8) % len] = (char)(seed >> 20);
            }
            p = prot_new_mem(data, len);
            assert_non_null(p);
            imapparse_cmd_init(&cmd);
            do {
                r = imapparse_read(p, NULL, &cmd);
                if (r == IMAPPARSE_OK && cmd.id == IMAPPARSE_CMD_APPEND) {
                    if (prot_read(p, NULL, cmd.append.size) != PROT_OK)
                        break;
                    r = imapparse_append_end(p, NULL, &cmd);
                }
                if (r != IMAPPARSE_OK)
                    assert_non_null(cmd.error);
            } while (imapparse_in_sync(r) && ++rounds < 100);
            assert_true(rounds < 100);
            imapparse_cmd_free(&cmd);
            prot_free(&p);
        }
    }
}

/* The metrics label of every command id is the command's name: the table
 * in lib/metrics.c follows enum imapparse_cmdid, and a command added to
 * the enum without it would be counted under another command's name. */
static void test_metrics_names(void **state)
{
    int id, n = 0;

    (void)state;
    assert_string_equal(metrics_imap_cmd[0], "other");
    for (id = 1; id < METRICS_NIMAPCMDS; id++) {
        const char *name = imapparse_cmd_name(id);

        if (!name) {
            assert_string_equal(metrics_imap_cmd[id], "other");
            continue;
        }
        n++;
        assert_string_equal(metrics_imap_cmd[id], name);
    }
    assert_null(imapparse_cmd_name(METRICS_NIMAPCMDS));
    assert_true(n > 30);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_simple, setup, teardown),
        cmocka_unit_test_setup_teardown(test_login_strings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mailboxes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_extended, setup,
                                        teardown),
        cmocka_unit_test(test_seqset),
        cmocka_unit_test(test_dates),
        cmocka_unit_test_setup_teardown(test_fetch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fetch_binary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_search, setup, teardown),
        cmocka_unit_test_setup_teardown(test_misc_commands, setup, teardown),
        cmocka_unit_test_setup_teardown(test_acl_quota, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_events, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_limits_command, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_literal_dialogue, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_one_byte_at_a_time, setup,
                                        teardown),
        cmocka_unit_test(test_mem_stream_mutations),
        cmocka_unit_test(test_metrics_names),
    };

    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
