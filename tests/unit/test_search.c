/*
 * test_search.c - the SEARCH evaluator (imapd/search.c) over a real
 * mailbox: twenty messages appended through store/append.h (plain ASCII,
 * RFC 2047 encoded-word headers, base64 and quoted-printable bodies, 8-bit
 * ISO-8859-1 text, multipart with non-text parts, an attached
 * message/rfc822, and malformed ones), flags and keywords set through the
 * index, then SEARCH commands parsed by imapparse.c exactly as a client
 * sends them and run with search_run().  Every key is checked for a
 * message it must match and one it must not.  Backend independent: the
 * store configuration uses the flat backend.  Also the pieces of SORT and
 * THREAD (imapd/sort.c) that stand alone: the RFC 5256 base subject, the
 * sent-date parser, the ESEARCH response and sequence-set text.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "imapd/imapparse.h"
#include "imapd/search.h"
#include "imapd/sort.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/prot.h"
#include "store/append.h"
#include "store/mailbox.h"
#include "store/store.h"
#include "tests/testhelp.h"

#define NMSG 20
#define DAY 86400
#define JAN1_2024 1704067200   /* 2024-01-01 00:00:00 UTC */

/* ---- the messages ------------------------------------------------------ */

static const char *const msgs[NMSG] = {
    /* 1: plain ASCII */
    "From: Alice Example <alice@example.org>\n"
    "To: bob@example.com\n"
    "Cc: Carol <carol@example.net>\n"
    "Subject: Quarterly report\n"
    "Date: Mon, 4 Mar 2024 10:00:00 +0000\n"
    "Message-ID: <1@example.org>\n"
    "\n"
    "Please find the numbers below.\n"
    "Regards, Alice\n",
    /* 2: Q-encoded ISO-8859-1 subject, B-encoded UTF-8 From */
    "From: =?UTF-8?B?Sm9zw6kgTcO8bGxlcg==?= <jose@example.es>\n"
    "To: team@example.com\n"
    "Subject: =?ISO-8859-1?Q?Gr=FC=DFe_aus_M=FCnchen?=\n"
    "Date: 2 Feb 2024 09:00:00 +0100\n"
    "\n"
    "Hallo zusammen.\n",
    /* 3: adjacent encoded words, folded subject, Bcc */
    "From: dave@example.org\n"
    "To: eve@example.org\n"
    "Bcc: secret-list@example.org\n"
    "Subject: =?UTF-8?Q?caf=C3=A9?=\n"
    "   =?UTF-8?Q?_cr=C3=A8me?= and more\n"
    "Date: Sat, 3 Feb 2024 09:00:00 +0000\n"
    "\n"
    "Dessert menu.\n",
    /* 4: base64 UTF-8 body */
    "From: frank@example.org\n"
    "Subject: base64 body\n"
    "Date: 4 Feb 2024 09:00:00 +0000\n"
    "MIME-Version: 1.0\n"
    "Content-Type: text/plain; charset=\"utf-8\"\n"
    "Content-Transfer-Encoding: base64\n"
    "\n"
    "RGFzIMOEcGZlbG11cyBpc3QgbGVja2VyLg0Kw5xCRVJSQVNDSFVORyBpbSBLw7Zy\n"
    "YmNoZW4NCg==\n",
    /* 5: quoted-printable UTF-8 body with a soft line break */
    "From: grace@example.org\n"
    "Subject: qp body\n"
    "Date: 5 Feb 2024 09:00:00 +0000\n"
    "MIME-Version: 1.0\n"
    "Content-Type: text/plain; charset=UTF-8\n"
    "Content-Transfer-Encoding: quoted-printable\n"
    "\n"
    "The price is =E2=82=AC100 and soft=\n"
    "break word =3D equal.\n",
    /* 6: 8-bit ISO-8859-1 body */
    "From: heidi@example.org\n"
    "Subject: latin1 body\n"
    "Date: 6 Feb 2024 09:00:00 +0000\n"
    "MIME-Version: 1.0\n"
    "Content-Type: text/plain; charset=iso-8859-1\n"
    "Content-Transfer-Encoding: 8bit\n"
    "\n"
    "Ol\xe9 se\xf1or, hasta ma\xf1" "ana. \xc4RGER\n",
    /* 7: multipart/mixed: text, binary attachment, html in qp */
    "From: ivan@example.org\n"
    "Subject: multipart mixed\n"
    "Date: 7 Feb 2024 09:00:00 +0000\n"
    "MIME-Version: 1.0\n"
    "Content-Type: multipart/mixed; boundary=\"=_bnd 7\"\n"
    "\n"
    "preamble needle-preamble\n"
    "--=_bnd 7\n"
    "Content-Type: text/plain\n"
    "\n"
    "first part needle-alpha\n"
    "--=_bnd 7\n"
    "Content-Type: application/octet-stream\n"
    "Content-Transfer-Encoding: base64\n"
    "\n"
    "bmVlZGxlLWhpZGRlbiBpbiBiaW5hcnk=\n"
    "--=_bnd 7\n"
    "Content-Type: text/html; charset=us-ascii\n"
    "Content-Transfer-Encoding: quoted-printable\n"
    "\n"
    "<b>needle=2Dbeta</b>\n"
    "--=_bnd 7--\n"
    "\n"
    "epilogue-text\n",
    /* 8: an attached message */
    "From: judy@example.org\n"
    "Subject: forwarded\n"
    "Date: 8 Feb 2024 09:00:00 +0000\n"
    "MIME-Version: 1.0\n"
    "Content-Type: multipart/mixed; boundary=outer\n"
    "\n"
    "--outer\n"
    "Content-Type: text/plain\n"
    "\n"
    "see attached\n"
    "--outer\n"
    "Content-Type: message/rfc822\n"
    "\n"
    "From: mallory@example.org\n"
    "Subject: inner-subject-xyz\n"
    "\n"
    "inner body text\n"
    "--outer--\n",
    /* 9: large (filled in by make_messages) */
    NULL,
    /* 10: no Date header */
    "From: ken@example.org\n"
    "Subject: no date here\n"
    "\n"
    "undated\n",
    /* 11: unparseable Date */
    "From: leo@example.org\n"
    "Subject: bad date\n"
    "Date: garbage in the date\n"
    "\n"
    "bad date body\n",
    /* 12: obsolete two-digit year with a comment */
    "From: mia@example.org\n"
    "Subject: old mail\n"
    "Date: (sent) 5 Jan 99 10:00 -0500\n"
    "\n"
    "from the last century\n",
    /* 13: multipart without a boundary parameter */
    "From: nina@example.org\n"
    "Subject: no boundary\n"
    "Date: 13 Feb 2024 09:00:00 +0000\n"
    "Content-Type: multipart/mixed\n"
    "\n"
    "boundaryless text\n",
    /* 14: multipart without a close delimiter */
    "From: oscar@example.org\n"
    "Subject: unclosed\n"
    "Date: 14 Feb 2024 09:00:00 +0000\n"
    "Content-Type: multipart/alternative; boundary=b14\n"
    "\n"
    "--b14\n"
    "Content-Type: text/plain\n"
    "\n"
    "unclosed part text\n",
    /* 15: a header without the empty line */
    "Subject: only header\n"
    "X-Junk no colon on this line\n"
    "Date: 15 Feb 2024 09:00:00 +0000\n",
    /* 16: broken base64, unknown charset */
    "From: pat@example.org\n"
    "Subject: broken base64\n"
    "Date: 16 Feb 2024 09:00:00 +0000\n"
    "Content-Type: text/plain; charset=x-unknown\n"
    "Content-Transfer-Encoding: base64\n"
    "\n"
    "!!!@@@###\n",
    /* 17: bad and unknown-charset encoded words, a custom field */
    "From: quinn@example.org\n"
    "Subject: =?UTF-8?X?abc?= and =?KOI8-R?B?8NLJ18XU?= end\n"
    "X-Custom: Custom-Value-17\n"
    "X-Empty: left =?UTF-8?B?\?= right\n"
    "Date: 17 Feb 2024 09:00:00 +0000\n"
    "\n"
    "custom\n",
    /* 18: nested too deep (filled in by make_messages) */
    NULL,
    /* 19: an empty message */
    "\n",
    /* 20: keyword message, NUL byte in the body */
    "From: rita@example.org\n"
    "To: Undisclosed recipients:;\n"
    "Subject: keyword message\n"
    "Date: 20 Feb 2024 09:00:00 +0000\n"
    "\n"
    "before\0after nul\n",
};
static const size_t msg20_len = sizeof(
    "From: rita@example.org\n"
    "To: Undisclosed recipients:;\n"
    "Subject: keyword message\n"
    "Date: 20 Feb 2024 09:00:00 +0000\n"
    "\n"
    "before\0after nul\n") - 1;

/* LF to CRLF */
static void crlf(struct buf *out, const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        if (s[i] == '\n')
            assert_int_equal(buf_putc(out, '\r'), 0);
        assert_int_equal(buf_putc(out, s[i]), 0);
    }
}

static void make_message(unsigned i, struct buf *out)
{
    struct buf t = BUF_INITIALIZER;
    unsigned j;

    buf_reset(out);
    if (i == 9) {
        buf_appendcstr(&t, "From: big@example.org\nSubject: large one\n"
                       "Date: 9 Feb 2024 09:00:00 +0000\n\n");
        for (j = 0; t.len < 20000; j++)
            buf_printf(&t, "filler line %u of the large message\n", j);
        buf_appendcstr(&t, "the end of it all\n");
    } else if (i == 18) {
        buf_appendcstr(&t, "From: deep@example.org\nSubject: deep\n"
                       "Date: 18 Feb 2024 09:00:00 +0000\n");
        for (j = 0; j < 60; j++) {
            buf_printf(&t, "Content-Type: multipart/mixed; boundary=d%u\n\n"
                       "--d%u\n", j, j);
            if (j == 0)
                buf_appendcstr(&t, "Content-Type: text/plain\n\n"
                               "deep-shallow text\n--d0\n");
        }
        buf_appendcstr(&t, "Content-Type: text/plain\n\ndeepest text\n");
    } else if (i == 20) {
        buf_append(&t, msgs[19], msg20_len);
    } else {
        buf_appendcstr(&t, msgs[i - 1]);
    }
    crlf(out, t.s, t.len);
    buf_free(&t);
}

/* ---- the fixture --------------------------------------------------------- */

struct fx {
    char *dir;
    struct imapconf *conf;
    struct mailbox *mb;
    uint64_t modseq_before;     /* highest modseq after the appends */
    int kw_important;
};

static struct fx fx;

static int64_t internaldate(unsigned i)
{
    if (i == 1)
        return JAN1_2024 + 69 * DAY + 2 * 3600; /* 2024-03-10 02:00 UTC */
    return JAN1_2024 + (int64_t)i * DAY + 12 * 3600;
}

static uint32_t sysflags(unsigned i)
{
    switch (i) {
    case 1: return MAILBOX_FLAG_ANSWERED | MAILBOX_FLAG_SEEN;
    case 2: return MAILBOX_FLAG_FLAGGED;
    case 3: return MAILBOX_FLAG_DELETED;
    case 4: return MAILBOX_FLAG_DRAFT;
    case 5: return MAILBOX_FLAG_ANSWERED | MAILBOX_FLAG_FLAGGED;
    default: return 0;
    }
}

/* Set user flag `bit` on uid (exclusive lock held by the caller). */
static void set_user_flag(uint32_t uid, int bit)
{
    struct mailbox_record rec;
    uint32_t recno;

    assert_int_equal(mailbox_find_uid(fx.mb, uid, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(fx.mb, recno, &rec), STORE_OK);
    rec.user_flags[bit / 32] |= 1u << (bit % 32);
    assert_int_equal(mailbox_rewrite_record(fx.mb, recno, &rec), STORE_OK);
}

static int group_setup(void **state)
{
    struct append_stage *st = NULL;
    struct append_txn *t = NULL;
    struct buf m = BUF_INITIALIZER;
    unsigned i;
    int bit = -1;
    uint32_t uid;

    (void)state;
    /* a zone 5 hours west of UTC without summer time: the internal date of
     * message 1 falls on the previous day there */
    setenv("TZ", "EST5", 1);
    tzset();
    log_init("test_search", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    memset(&fx, 0, sizeof(fx));
    fx.dir = th_mkdtemp("search");
    fx.conf = th_store_conf(fx.dir, "flat", NULL);
    assert_int_equal(mailbox_create(fx.conf, "user.sam", "default",
                                    "searchtest0001", 0), STORE_OK);
    assert_int_equal(mailbox_open(fx.conf, "user.sam", "default", &fx.mb),
                     STORE_OK);
    assert_int_equal(append_begin(fx.conf, &t), STORE_OK);
    for (i = 1; i <= NMSG; i++) {
        make_message(i, &m);
        assert_int_equal(append_stage_open(fx.conf, NULL, &st), STORE_OK);
        assert_int_equal(append_stage_write(st, m.s, m.len), STORE_OK);
        assert_int_equal(append_stage_close(st), STORE_OK);
        assert_int_equal(append_add(t, fx.mb, st, internaldate(i),
                                    sysflags(i), 0, &uid), STORE_OK);
        assert_int_equal(uid, i);
        assert_int_equal(append_commit(t), STORE_OK);
        append_stage_free(&st);
    }
    append_free(&t);
    buf_free(&m);

    /* keywords and later changes (which raise modseqs) */
    assert_int_equal(mailbox_lock(fx.mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    fx.modseq_before = mailbox_get_header(fx.mb)->highestmodseq;
    assert_int_equal(mailbox_user_flag(fx.mb, "$Junk", 1, &bit), STORE_OK);
    assert_int_equal(mailbox_user_flag(fx.mb, "$Important", 1, &bit),
                     STORE_OK);
    fx.kw_important = bit;
    set_user_flag(20, bit);
    set_user_flag(7, bit);
    assert_int_equal(mailbox_unlock(fx.mb), STORE_OK);
    assert_int_equal(mailbox_lock(fx.mb, MAILBOX_LOCK_SHARED), STORE_OK);
    *state = &fx;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    mailbox_unlock(fx.mb);
    mailbox_close(&fx.mb);
    imapconf_free(&fx.conf);
    th_rmrf(fx.dir);
    free(fx.dir);
    return 0;
}

/* ---- running a SEARCH command --------------------------------------------- */

static const char *seen_set = "1,5:6";

static int recent_cb(void *rock, uint32_t uid)
{
    (void)rock;
    return uid >= 18;
}

static int keyword_cb(void *rock, const char *name, int *bit_r)
{
    (void)rock;
    if (strcasecmp(name, "$Fancy") == 0) {
        *bit_r = fx.kw_important;
        return 0;
    }
    return -1;
}

struct opts {
    const uint32_t *uids;
    uint32_t nmsgs;
    int record_seen;            /* no seen callback */
    int kw_callback;
};

/* Parse "TAG <text>\r\n", run it, return the result as "1 2 3" (or
 * "ERR <code>"); *res_r (may be NULL) gets the result's modseq data. */
static char *run_opts(const char *text, size_t textlen,
                      const struct opts *o, struct search_result *res_r)
{
    struct buf cmdline = BUF_INITIALIZER, out = BUF_INITIALIZER;
    struct imapparse_cmd cmd;
    struct search_params sp;
    struct search_result res;
    struct prot *p;
    size_t i;
    int r;

    buf_appendcstr(&cmdline, "a ");
    buf_append(&cmdline, text, textlen);
    buf_appendcstr(&cmdline, "\r\n");
    p = prot_new_mem(cmdline.s, cmdline.len);
    assert_non_null(p);
    imapparse_cmd_init(&cmd);
    r = imapparse_read(p, NULL, &cmd);
    if (r != IMAPPARSE_OK)
        fail_msg("parse of <%s>: %d %s", buf_cstring(&cmdline), r,
                 cmd.error ? cmd.error : "");
    assert_int_equal(cmd.id, IMAPPARSE_CMD_SEARCH);

    memset(&sp, 0, sizeof(sp));
    sp.mb = fx.mb;
    sp.uids = o ? o->uids : NULL;
    sp.nmsgs = o ? o->nmsgs : 0;
    sp.seen = (o && o->record_seen) ? NULL : search_seen_set;
    sp.recent = recent_cb;
    sp.keyword = (o && o->kw_callback) ? keyword_cb : NULL;
    sp.rock = (void *)seen_set;
    sp.utf8 = cmd.utf8;
    sp.return_uids = cmd.uid;
    memset(&res, 0, sizeof(res));
    r = search_run(&sp, cmd.search, &res);
    if (r != STORE_OK) {
        buf_printf(&out, "ERR %d", r);
        assert_int_equal(res.n, 0);
        assert_null(res.nums);
    }
    for (i = 0; i < res.n; i++) {
        if (i)
            assert_true(res.nums[i] > res.nums[i - 1]);
        buf_printf(&out, "%s%u", i ? " " : "", res.nums[i]);
    }
    if (res_r)
        *res_r = res;
    else
        search_result_free(&res);
    imapparse_cmd_free(&cmd);
    prot_free(&p);
    buf_free(&cmdline);
    buf_cstring(&out);
    return buf_release(&out);
}

static void expect_opts(const char *text, const struct opts *o,
                        const char *want)
{
    char *got = run_opts(text, strlen(text), o, NULL);

    if (strcmp(got, want) != 0)
        fail_msg("SEARCH <%s>: got <%s>, want <%s>", text, got, want);
    free(got);
}

static void expect(const char *text, const char *want)
{
    expect_opts(text, NULL, want);
}

/* prefix {n+}CRLF str suffix */
static void expect_lit(const char *prefix, const char *str,
                       const char *suffix, const char *want)
{
    struct buf t = BUF_INITIALIZER;
    char *got;

    buf_printf(&t, "%s{%zu+}\r\n%s%s", prefix, strlen(str), str, suffix);
    got = run_opts(t.s, t.len, NULL, NULL);
    if (strcmp(got, want) != 0)
        fail_msg("SEARCH <%s>: got <%s>, want <%s>", t.s, got, want);
    free(got);
    buf_free(&t);
}

#define ALL_BUT(...) all_but((const unsigned[]){ __VA_ARGS__, 0 })
static const char *all_but(const unsigned *skip)
{
    static char s[128];
    size_t len = 0;
    unsigned i, j;

    s[0] = '\0';
    for (i = 1; i <= NMSG; i++) {
        for (j = 0; skip[j]; j++)
            if (skip[j] == i)
                break;
        if (skip[j])
            continue;
        len += (size_t)snprintf(s + len, sizeof(s) - len, "%s%u",
                                len ? " " : "", i);
    }
    return s;
}

/* ---- the cases ------------------------------------------------------------- */

static void test_flags(void **state)
{
    struct opts rec = { NULL, 0, 1, 0 };
    struct opts kwcb = { NULL, 0, 0, 1 };

    (void)state;
    expect("SEARCH ALL", ALL_BUT(99));
    expect("SEARCH ANSWERED", "1 5");
    expect("SEARCH UNANSWERED", ALL_BUT(1, 5));
    expect("SEARCH DELETED", "3");
    expect("SEARCH UNDELETED", ALL_BUT(3));
    expect("SEARCH DRAFT", "4");
    expect("SEARCH UNDRAFT", ALL_BUT(4));
    expect("SEARCH FLAGGED", "2 5");
    expect("SEARCH UNFLAGGED", ALL_BUT(2, 5));
    /* \Seen from the caller's seen state, not the record */
    expect("SEARCH SEEN", "1 5 6");
    expect("SEARCH UNSEEN", ALL_BUT(1, 5, 6));
    expect_opts("SEARCH SEEN", &rec, "1");
    expect_opts("SEARCH UNSEEN", &rec, ALL_BUT(1));
    /* keywords through the mailbox's table, case-insensitive */
    expect("SEARCH KEYWORD $Important", "7 20");
    expect("SEARCH KEYWORD $IMPORTANT", "7 20");
    expect("SEARCH UNKEYWORD $Important", ALL_BUT(7, 20));
    expect("SEARCH KEYWORD $Junk", "");
    expect("SEARCH KEYWORD nosuchkeyword", "");
    expect("SEARCH UNKEYWORD nosuchkeyword", ALL_BUT(99));
    /* ... and through the caller's callback */
    expect_opts("SEARCH KEYWORD $Fancy", &kwcb, "7 20");
    expect_opts("SEARCH KEYWORD $Important", &kwcb, "");
    /* recent: uids >= 18 */
    expect("SEARCH RECENT", "18 19 20");
    expect("SEARCH NEW", "18 19 20");
    expect("SEARCH OLD", ALL_BUT(18, 19, 20));
    expect("SEARCH NOT NEW", ALL_BUT(18, 19, 20));
    expect("SEARCH SEEN RECENT", "");
}

static void test_sequences(void **state)
{
    static const uint32_t view[] = { 2, 3, 4, 99, 5, 20 };
    struct opts o = { view, 6, 0, 0 };
    static const uint32_t empty[1] = { 0 };
    struct opts none = { empty, 0, 0, 0 };

    (void)state;
    expect("SEARCH 2:4", "2 3 4");
    expect("SEARCH 4:2", "2 3 4");
    expect("SEARCH *", "20");
    expect("SEARCH 18:*", "18 19 20");
    expect("SEARCH *:19", "19 20");
    expect("SEARCH 1,3,5:6,30", "1 3 5 6");
    expect("SEARCH UID 7", "7");
    expect("SEARCH UID 19:*", "19 20");
    expect("SEARCH UID 25:30", "");
    expect("UID SEARCH 1:3", "1 2 3");
    expect("UID SEARCH UID 2,4 FLAGGED", "2");
    /* a session view: numbers are positions in it; uid 99 (gone) keeps
     * its number 4 but never matches */
    expect_opts("SEARCH ALL", &o, "1 2 3 5 6");
    expect_opts("UID SEARCH ALL", &o, "2 3 4 5 20");
    expect_opts("SEARCH *", &o, "6");
    expect_opts("SEARCH 4", &o, "");
    expect_opts("SEARCH NOT 4", &o, "1 2 3 5 6");
    expect_opts("UID SEARCH UID *", &o, "20");
    expect_opts("UID SEARCH UID 3:*", &o, "3 4 5 20");
    expect_opts("SEARCH FLAGGED", &o, "1 5");
    expect_opts("UID SEARCH FLAGGED", &o, "2 5");
    expect_opts("SEARCH SUBJECT keyword", &o, "6");
    /* an empty view: '*' matches nothing */
    expect_opts("SEARCH *", &none, "");
    expect_opts("SEARCH UID *", &none, "");
    expect_opts("SEARCH ALL", &none, "");
}

static void test_sizes_dates(void **state)
{
    (void)state;
    expect("SEARCH LARGER 10000", "9");
    expect("SEARCH NOT LARGER 10000", ALL_BUT(9));
    expect("SEARCH SMALLER 3", "19");          /* "\r\n" */
    expect("SEARCH SMALLER 2", "");
    expect("SEARCH LARGER 2 SMALLER 3", "");
    /* internal dates, in the local zone (EST5): message 1 is
     * 2024-03-10 02:00 UTC = 2024-03-09 21:00 local; message i >= 2 is
     * 2024-01-(i+1) 07:00 local */
    expect("SEARCH ON 9-Mar-2024", "1");
    expect("SEARCH ON 10-Mar-2024", "");
    expect("SEARCH ON 3-Jan-2024", "2");
    expect("SEARCH BEFORE 5-Jan-2024", "2 3");
    expect("SEARCH BEFORE 3-Jan-2024", "");
    expect("SEARCH SINCE 20-Jan-2024", "1 19 20");
    expect("SEARCH SINCE 1-Apr-2024", "");
    expect("SEARCH SINCE 4-Jan-2024 BEFORE 6-Jan-2024", "3 4");
    /* Date: header; 10 has none, 11 is garbage, 19 is empty */
    expect("SEARCH SENTON 4-Mar-2024", "1");
    expect("SEARCH SENTON 2-Feb-2024", "2");   /* zone disregarded */
    expect("SEARCH SENTON 3-Feb-2024", "3");
    expect("SEARCH SENTBEFORE 1-Jan-2000", "12");
    expect("SEARCH SENTON 5-Jan-1999", "12");
    expect("SEARCH SENTBEFORE 4-Feb-2024", "2 3 12");
    expect("SEARCH SENTSINCE 17-Feb-2024", "1 17 18 20");
    expect("SEARCH SENTSINCE 1-Jan-1970", ALL_BUT(10, 11, 19));
    expect("SEARCH NOT SENTSINCE 1-Jan-1970", "10 11 19");
    expect("SEARCH SENTSINCE 14-Feb-2024 SENTBEFORE 16-Feb-2024", "14 15");
}

static void test_headers(void **state)
{
    (void)state;
    expect("SEARCH FROM alice", "1");
    expect("SEARCH FROM ALICE@EXAMPLE.ORG", "1");
    expect("SEARCH FROM \"Alice Example\"", "1");
    expect("SEARCH FROM nobody", "");
    expect("SEARCH TO bob@", "1");
    expect("SEARCH TO carol", "");
    expect("SEARCH CC carol", "1");
    expect("SEARCH CC bob", "");
    expect("SEARCH BCC secret-list", "3");
    expect("SEARCH BCC alice", "");
    expect("SEARCH SUBJECT quarterly", "1");
    expect("SEARCH SUBJECT \"REPORT\"", "1");
    expect("SEARCH SUBJECT weekly", "");
    expect("SEARCH SUBJECT inner-subject-xyz", "");   /* only the top header */
    expect("SEARCH HEADER X-Custom custom-value-17", "17");
    expect("SEARCH HEADER x-custom \"\"", "17");       /* the field exists */
    expect("SEARCH HEADER X-Custom other", "");
    expect("SEARCH HEADER Message-ID <1@example.org>", "1");
    expect("SEARCH HEADER X-Missing \"\"", "");
    expect("SEARCH SUBJECT \"\"", ALL_BUT(19));
    /* folded value: unfolded before matching */
    expect("SEARCH SUBJECT \"and more\"", "3");
    /* encoded words: decoded (Q ISO-8859-1, B UTF-8, adjacent Q words with
     * the white space between them dropped) */
    expect_lit("SEARCH CHARSET UTF-8 SUBJECT ", "grüße aus münchen", "",
               "2");
    expect_lit("SEARCH CHARSET UTF-8 SUBJECT ", "GRÜSSE", "", "");
    expect_lit("SEARCH CHARSET UTF-8 SUBJECT ", "GRÜßE", "", "2");
    expect_lit("SEARCH CHARSET UTF-8 FROM ", "josé müller", "", "2");
    expect_lit("SEARCH CHARSET UTF-8 FROM ", "JOSÉ", "", "2");
    expect_lit("SEARCH CHARSET UTF-8 SUBJECT ", "café crème and", "", "3");
    expect("SEARCH SUBJECT \"=?UTF-8\"", "17");         /* only the raw ones */
    expect("SEARCH SUBJECT Gr=FC", "");
    /* a bad encoding and an unknown charset compare raw */
    expect("SEARCH SUBJECT \"=?utf-8?x?ABC?=\"", "17");
    expect("SEARCH SUBJECT \"=?KOI8-R?B?8NLJ18XU?= end\"", "17");
    expect("SEARCH SUBJECT 8nlj18xu", "17");
    /* an encoded word that decodes to nothing (no text to append) */
    expect("SEARCH HEADER X-Empty left", "17");
    expect("SEARCH HEADER X-Empty right", "17");
}

static void test_bodies(void **state)
{
    (void)state;
    expect("SEARCH BODY numbers", "1");
    expect("SEARCH BODY \"NUMBERS BELOW\"", "1");
    expect("SEARCH BODY quarterly", "");     /* subject is not body */
    expect("SEARCH TEXT quarterly", "1");
    expect("SEARCH TEXT \"subject: quarterly\"", "1");
    expect("SEARCH TEXT alice@example.org", "1");
    expect("SEARCH TEXT zzzz-nowhere", "");
    /* base64 UTF-8 */
    expect_lit("SEARCH CHARSET UTF-8 BODY ", "äpfelmus", "", "4");
    expect_lit("SEARCH CHARSET UTF-8 BODY ", "überraschung im körbchen", "",
               "4");
    expect("SEARCH BODY RGFzIMOE", "");
    /* quoted-printable: escapes and soft breaks undone */
    expect_lit("SEARCH CHARSET UTF-8 BODY ", "€100", "", "5");
    expect("SEARCH BODY softbreak", "5");
    expect("SEARCH BODY \"= equal\"", "5");
    expect("SEARCH BODY E2=82", "");
    /* ISO-8859-1 8-bit text, searched in UTF-8 */
    expect_lit("SEARCH CHARSET UTF-8 BODY ", "SEÑOR", "", "6");
    expect_lit("SEARCH CHARSET UTF-8 BODY ", "olé", "", "6");
    expect_lit("SEARCH CHARSET UTF-8 TEXT ", "ärger", "", "6");
    expect_lit("SEARCH CHARSET UTF-8 BODY ", "senor", "", "");
    /* a match never spans two lines' worth of parts, text parts only */
    expect("SEARCH BODY needle-alpha", "7");
    expect("SEARCH BODY needle-beta", "7");
    expect("SEARCH BODY needle-hidden", "");
    expect("SEARCH BODY needle-preamble", "");
    expect("SEARCH BODY epilogue-text", "");
    expect("SEARCH BODY \"alpha needle\"", "");
    /* the attached message: its header and body are body text */
    expect("SEARCH BODY inner-subject-xyz", "8");
    expect("SEARCH BODY \"inner body text\"", "8");
    expect("SEARCH TEXT mallory", "8");
    expect("SEARCH BODY \"see attached\"", "8");
    expect("SEARCH BODY \"the end of it all\"", "9");
    expect("SEARCH BODY \"after nul\"", "20");
    expect("SEARCH BODY \"\"", ALL_BUT(99));
    expect("SEARCH TEXT \"\"", ALL_BUT(99));
}

static void test_malformed(void **state)
{
    (void)state;
    expect("SEARCH BODY boundaryless", "13");
    expect("SEARCH BODY \"unclosed part text\"", "14");
    expect("SEARCH SUBJECT \"only header\"", "15");
    expect("SEARCH TEXT \"only header\"", "15");
    expect("SEARCH BODY \"only header\"", "");
    expect("SEARCH SENTON 15-Feb-2024", "15");
    expect("SEARCH BODY \"!!!\"", "");
    expect("SEARCH BODY deep-shallow", "18");
    expect("SEARCH BODY deepest", "");       /* past the depth limit */
    expect("SEARCH TEXT deep", "18");
    /* every message through every text path */
    expect("SEARCH OR OR TEXT xq BODY xq OR FROM xq OR TO xq OR CC xq "
           "OR BCC xq OR SUBJECT xq HEADER X-Junk xq", "");
    expect("SEARCH TEXT e", ALL_BUT(19));
}

static void test_logic(void **state)
{
    (void)state;
    expect("SEARCH OR ANSWERED DELETED", "1 3 5");
    expect("SEARCH OR FROM alice SUBJECT \"qp body\"", "1 5");
    expect("SEARCH NOT OR ANSWERED FLAGGED", ALL_BUT(1, 2, 5));
    expect("SEARCH (FLAGGED ANSWERED)", "5");
    expect("SEARCH (OR FLAGGED DRAFT) NOT 2", "4 5");
    expect("SEARCH OR (FLAGGED ANSWERED) (DELETED BODY dessert)", "3 5");
    expect("SEARCH OR (FLAGGED ANSWERED) (DELETED BODY nothing)", "5");
    expect("SEARCH NOT NOT DRAFT", "4");
    expect("SEARCH NOT (NOT BODY softbreak)", "5");
    expect("SEARCH (NOT BODY softbreak OR SEEN DRAFT)", "1 4 6");
    expect("SEARCH OR OR 1 2 OR 3 UID 4", "1 2 3 4");
    expect("SEARCH 1:10 NOT 3:8 BODY \"\"", "1 2 9 10");
    expect("SEARCH OR SENTON 2-Feb-2024 NOT SUBJECT e", "2 5 6 12 13 19");
}

static void test_modseq(void **state)
{
    struct search_result res;
    char text[64], *got;

    (void)state;
    /* 7 and 20 were changed after the appends (keyword) */
    snprintf(text, sizeof(text), "SEARCH MODSEQ %llu",
             (unsigned long long)fx.modseq_before + 1);
    got = run_opts(text, strlen(text), NULL, &res);
    assert_string_equal(got, "7 20");
    assert_int_equal(res.has_modseq, 1);
    assert_int_equal(res.highest_modseq, fx.modseq_before + 2);
    search_result_free(&res);
    free(got);
    snprintf(text, sizeof(text),
             "SEARCH MODSEQ \"/flags/\\\\draft\" all %llu",
             (unsigned long long)fx.modseq_before + 2);
    expect(text, "7");
    expect("SEARCH MODSEQ 1", ALL_BUT(99));
    expect("SEARCH NOT MODSEQ 1", "");
    got = run_opts("SEARCH FLAGGED", 14, NULL, &res);
    assert_string_equal(got, "2 5");
    assert_int_equal(res.has_modseq, 0);
    search_result_free(&res);
    free(got);
}

/* Cheap keys come first: a message whose file cannot be read is never
 * opened when the index alone decides; when its file is needed, the
 * error is reported, not a wrong answer. */
static void test_cheap_first(void **state)
{
    struct buf path = BUF_INITIALIZER, aside = BUF_INITIALIZER;

    (void)state;
    mailbox_message_path(fx.mb, 4, &path);
    buf_printf(&aside, "%s.aside", buf_cstring(&path));
    assert_int_equal(rename(buf_cstring(&path), buf_cstring(&aside)), 0);
    /* a directory in its place: open works, mapping fails */
    assert_int_equal(mkdir(buf_cstring(&path), 0700), 0);
    expect("SEARCH DRAFT", "4");
    expect("SEARCH UNDRAFT BODY dessert", "3");
    /* the order written does not matter: the index keys go first */
    expect("SEARCH BODY dessert UNDRAFT", "3");
    expect("SEARCH OR BODY dessert DRAFT", "3 4");
    expect("SEARCH TEXT \"qp body\" NOT DRAFT", "5");
    expect("SEARCH OR DRAFT BODY dessert", "3 4");
    expect("SEARCH NOT DRAFT TEXT \"qp body\"", "5");
    expect("SEARCH BODY dessert", "ERR 10");       /* STORE_IOERROR */
    expect("SEARCH NOT 4 SUBJECT base64", "16");
    assert_int_equal(rmdir(buf_cstring(&path)), 0);
    /* a missing file: an empty message for the text keys */
    expect("SEARCH SUBJECT base64", "16");
    expect("SEARCH DRAFT", "4");
    assert_int_equal(rename(buf_cstring(&aside), buf_cstring(&path)), 0);
    expect("SEARCH SUBJECT base64", "4 16");
    buf_free(&path);
    buf_free(&aside);
}

#define FOLDIN "ÀÉÎÕÜ Ÿ ĀŁŜŽ ΣΑΣ ПРИВЕТ ß"
#define HDR1 " =?iso-8859-1?q?a=E9?= \r\n =?utf-8?b?w6k=?= x "
#define HDR2 "a =?us-ascii*en?q?b?= c"
#define HDR3 "=?utf-8?q?x"

/* Last: expunge uid 10 and look through the default view and an older
 * session view that still holds it. */
static void test_expunged(void **state)
{
    static const uint32_t view[] = { 9, 10, 11 };
    struct opts o = { view, 3, 0, 0 };
    struct mailbox_record rec;
    uint32_t recno;

    (void)state;
    assert_int_equal(mailbox_unlock(fx.mb), STORE_OK);
    assert_int_equal(mailbox_lock(fx.mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_find_uid(fx.mb, 10, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(fx.mb, recno, &rec), STORE_OK);
    rec.flags |= MAILBOX_FLAG_EXPUNGED;
    assert_int_equal(mailbox_rewrite_record(fx.mb, recno, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(fx.mb), STORE_OK);
    assert_int_equal(mailbox_lock(fx.mb, MAILBOX_LOCK_SHARED), STORE_OK);

    expect("UID SEARCH ALL", ALL_BUT(10));
    expect("SEARCH ALL", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19");
    expect("UID SEARCH 10", "11");
    expect("SEARCH *", "19");
    expect("UID SEARCH SUBJECT \"no date here\"", "");
    expect("SEARCH NOT SENTSINCE 1-Jan-1970", "10 18");  /* uids 11, 19 */
    expect_opts("SEARCH ALL", &o, "1 3");
    expect_opts("SEARCH NOT 1", &o, "3");
    expect_opts("UID SEARCH UID 10:11", &o, "11");
    expect_opts("SEARCH BODY undated", &o, "");
}


static void expect_base(const char *raw, const char *want, int want_reply)
{
    struct buf out = BUF_INITIALIZER;
    int reply = -1;

    assert_int_equal(sort_base_subject(raw, strlen(raw), &out, &reply), 0);
    if (strcmp(out.s ? buf_cstring(&out) : "", want) != 0 ||
        reply != want_reply)
        fail_msg("base subject of \"%s\": \"%s\" reply %d, want \"%s\" %d",
                 raw, out.s ? buf_cstring(&out) : "", reply, want,
                 want_reply);
    buf_free(&out);
}

static void test_sort_helpers(void **state)
{
    struct buf b = BUF_INITIALIZER;
    static const uint32_t nums[] = { 8, 6, 2, 1, 3, 4, 5, 7 };
    int64_t t;
    (void)state;

    /* RFC 5256 section 2.1 */
    expect_base("lunch", "lunch", 0);
    expect_base("Re: lunch", "lunch", 1);
    expect_base("RE:  Re: re:lunch", "lunch", 1);
    expect_base("Fwd: lunch (fwd)", "lunch", 1);
    expect_base("lunch (fwd) (FWD)  ", "lunch", 1);
    expect_base("Fw: [list] Re[2]: lunch", "lunch", 1);
    expect_base("[list] lunch", "lunch", 0);
    expect_base("[list]", "[list]", 0);          /* would leave nothing */
    expect_base("[Fwd: Re: lunch]", "lunch", 1);
    expect_base("[fwd: [fwd: lunch]]", "lunch", 1);
    expect_base("  lunch\r\n\t plans  ", "lunch plans", 0);
    expect_base("=?UTF-8?Q?Re=3A_Gr=C3=BC=C3=9Fe?=", "Gr\xc3\xbc\xc3\x9f" "e",
                1);
    expect_base("Re:", "", 1);
    expect_base("", "", 0);
    expect_base("Ref: lunch", "Ref: lunch", 0);  /* not a reply prefix */

    /* sent dates: zones applied, two-digit years, comments, bad ones */
    assert_int_equal(sort_parse_datetime("Wed, 6 Nov 2024 09:00:00 +0100",
                                         31, &t), 0);
    assert_int_equal(t, 1730880000);            /* 08:00 UTC */
    assert_int_equal(sort_parse_datetime("6 Nov 2024 03:00 EST", 20, &t), 0);
    assert_int_equal(t, 1730880000);
    assert_int_equal(sort_parse_datetime("06 nov 24 08:00:00 (UTC) GMT",
                                         28, &t), 0);
    assert_int_equal(t, 1730880000);
    assert_int_equal(sort_parse_datetime("yesterday", 9, &t), -1);
    assert_int_equal(sort_parse_datetime("6 Nov 2024", 10, &t), -1);
    assert_int_equal(sort_parse_datetime("32 Nov 2024 10:00 +0000", 23, &t),
                     -1);

    /* ESEARCH text: ranges only where numbers ascend by one */
    search_set_text(&b, nums, 8);
    assert_string_equal(buf_cstring(&b), "8,6,2,1,3:5,7");
    buf_reset(&b);
    search_esearch(&b, "A1", 1, IMAPPARSE_RET_MIN | IMAPPARSE_RET_MAX |
                   IMAPPARSE_RET_ALL | IMAPPARSE_RET_COUNT, nums, 8, 0, 0,
                   0, 0);
    assert_string_equal(buf_cstring(&b), "* ESEARCH (TAG \"A1\") UID MIN 8 "
                        "MAX 7 ALL 8,6,2,1,3:5,7 COUNT 8\r\n");
    buf_reset(&b);
    search_esearch(&b, "A2", 0, IMAPPARSE_RET_MIN | IMAPPARSE_RET_COUNT,
                   NULL, 0, 1, 5, 0, 0);
    assert_string_equal(buf_cstring(&b), "* ESEARCH (TAG \"A2\") COUNT 0\r\n");
    /* PARTIAL (RFC 5267 4.4): positions in the result, in its order */
    buf_reset(&b);
    search_esearch(&b, "A3", 1, IMAPPARSE_RET_PARTIAL | IMAPPARSE_RET_COUNT,
                   nums, 8, 0, 0, 2, 5);
    assert_string_equal(buf_cstring(&b), "* ESEARCH (TAG \"A3\") UID "
                        "PARTIAL (2:5 6,2,1,3) COUNT 8\r\n");
    buf_reset(&b);
    search_esearch(&b, "A4", 0, IMAPPARSE_RET_PARTIAL, nums, 8, 0, 0, 7,
                   100);
    assert_string_equal(buf_cstring(&b), "* ESEARCH (TAG \"A4\") "
                        "PARTIAL (7:100 5,7)\r\n");
    buf_reset(&b);
    search_esearch(&b, "A5", 0, IMAPPARSE_RET_PARTIAL | IMAPPARSE_RET_MIN,
                   nums, 8, 0, 0, 9, 10);
    assert_string_equal(buf_cstring(&b), "* ESEARCH (TAG \"A5\") MIN 8 "
                        "PARTIAL (9:10 NIL)\r\n");
    buf_reset(&b);
    search_esearch(&b, "A6", 0, IMAPPARSE_RET_PARTIAL, NULL, 0, 0, 0, 1, 1);
    assert_string_equal(buf_cstring(&b), "* ESEARCH (TAG \"A6\") "
                        "PARTIAL (1:1 NIL)\r\n");
    buf_free(&b);
}

static void test_helpers(void **state)
{
    struct buf b = BUF_INITIALIZER;
    struct imapparse_date d;

    (void)state;
    assert_int_equal(search_fold(FOLDIN, strlen(FOLDIN), &b), 0);
    assert_string_equal(buf_cstring(&b), "àéîõü ÿ āłŝž σασ привет ß");
    buf_reset(&b);
    assert_int_equal(search_fold("a\xff\xc3", 3, &b), 0);   /* invalid kept */
    assert_int_equal(b.len, 3);
    assert_memory_equal(b.s, "a\xff\xc3", 3);
    buf_reset(&b);
    assert_int_equal(search_decode_header(HDR1, strlen(HDR1), &b), 0);
    assert_string_equal(buf_cstring(&b), "aéé x");
    buf_reset(&b);
    assert_int_equal(search_decode_header(HDR2, strlen(HDR2), &b), 0);
    assert_string_equal(buf_cstring(&b), "a b c");
    buf_reset(&b);
    assert_int_equal(search_decode_header(HDR3, strlen(HDR3), &b), 0);
    assert_string_equal(buf_cstring(&b), "=?utf-8?q?x");
    buf_free(&b);

    assert_int_equal(search_parse_date("Tue, 29 Feb 2000 10:00:00 GMT", 29,
                                       &d), 0);
    assert_int_equal(d.year, 2000);
    assert_int_equal(d.mon, 2);
    assert_int_equal(d.mday, 29);
    assert_int_equal(search_parse_date("1 jan 104 00:00", 15, &d), 0);
    assert_int_equal(d.year, 2004);
    assert_int_equal(search_parse_date("29 Feb 2001 10:00", 17, &d), -1);
    assert_int_equal(search_parse_date("31 Apr 2001 10:00", 17, &d), -1);
    assert_int_equal(search_parse_date("Tue 1 Jan 2001 10:00", 20, &d), -1);
    assert_int_equal(search_parse_date("1 Foo 2001 10:00", 16, &d), -1);
    assert_int_equal(search_parse_date("1 Jan 2001", 10, &d), -1);
    assert_int_equal(search_parse_date("", 0, &d), -1);
    /* random and truncated input: no crash, output bounded (ASan run) */
    {
        static const char *const pieces[] = {
            "=?", "?=", "?Q?", "?B?", "utf-8", "iso-8859-1", "=E9", "=",
            "_", " ", "\r\n", "\xc3", "\xa9", "(", ")", "Mon,", "12",
            "Feb", "1999", ":", "\\", "\"", "*", "w6k", "\0"
        };
        char in[64];
        unsigned seed, j;

        for (seed = 1; seed <= 3000; seed++) {
            size_t len = 0;
            unsigned x = seed * 2654435761u;

            for (j = 0; j < 12; j++) {
                const char *pc = pieces[(x >> 3) % 25];
                size_t pl = pc[0] ? strlen(pc) : 1;

                x = x * 1103515245u + 12345u;
                if (len + pl > sizeof(in))
                    break;
                memcpy(in + len, pc, pl);
                len += pl;
            }
            buf_reset(&b);
            assert_int_equal(search_decode_header(in, len, &b), 0);
            assert_true(b.len <= 4 * len + 4);
            buf_reset(&b);
            assert_int_equal(search_fold(in, len, &b), 0);
            assert_true(b.len <= 2 * len);
            (void)search_parse_date(in, len, &d);
            th_fill(in, sizeof(in), seed);
            buf_reset(&b);
            assert_int_equal(search_decode_header(in, sizeof(in), &b), 0);
            (void)search_parse_date(in, sizeof(in), &d);
        }
        buf_free(&b);
    }
    assert_int_equal(search_seen_set((void *)"1:3,7", 7), 1);
    assert_int_equal(search_seen_set((void *)"1:3,7", 4), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_helpers),
        cmocka_unit_test(test_sort_helpers),
        cmocka_unit_test(test_flags),
        cmocka_unit_test(test_sequences),
        cmocka_unit_test(test_sizes_dates),
        cmocka_unit_test(test_headers),
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_logic),
        cmocka_unit_test(test_modseq),
        cmocka_unit_test(test_cheap_first),
        cmocka_unit_test(test_expunged),
    };

    return cmocka_run_group_tests_name("search", tests, group_setup,
                                       group_teardown);
}
