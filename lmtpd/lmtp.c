/*
 * lmtp.c - the LMTP session engine (see lmtp.h).
 *
 * A session is a loop of: read one command line (at most LMTP_CMD_MAX
 * bytes; longer ones are answered "500 5.5.2 Line too long" and skipped),
 * act, queue the reply.  lmtp_serve() runs the loop until the session
 * ends; lmtp_session_input() runs it only while a whole command line is
 * buffered (prot_line_ready) and returns between commands, so one process
 * can wait for many idle sessions at once.  Replies are flushed only when the client has
 * nothing more buffered (PIPELINING, RFC 2920) or before blocking work
 * (the 354 of DATA, a delivery, the TLS handshake, an AUTH challenge).
 *
 * The message (DATA or BDAT chunks) is never held in memory: each piece
 * goes through one filter (lmtp_msg_feed) that checks it and streams it
 * to the staging file with append_stage_write().  The filter is a small
 * state machine over raw bytes (a CR waiting for its LF, the length of
 * the current line, header or body), so DATA lines and BDAT chunks cut
 * anywhere get the same checks: bare CR or LF (refused, or made CRLF with
 * lmtp_bare_newlines: fix), NUL bytes, lines over LMTP_LINE_MAX bytes,
 * header lines over maxheaderlines, and maxmessagesize.  The first
 * problem found is remembered; from then on nothing more is written, the
 * rest of the message is read and thrown away (so the session stays in
 * step with the client), and every recipient gets the problem's reply.
 * The client's header section is copied (up to LMTP_HDR_KEEP bytes, whole
 * lines only) for deliver_find_msgid().
 *
 * The end of DATA is <CRLF>.<CRLF> and nothing else (RFC 5321 4.1.1.4):
 * a "." line with a bare LF before or after it, or between bare CRs,
 * is message text, so bytes after it are never read as commands (no
 * message smuggled inside another).  A leading dot is unstuffed only
 * after a real CRLF.  With lmtp_bare_newlines: fix such a lone dot is
 * stored doubled (".."), never as a line that is only "."; with reject
 * the message is refused for its bare newline anyway.  BDAT chunks are
 * counted: their bytes are data whatever they hold.
 *
 * Before the client's bytes the stage gets "Return-Path: <sender>" and a
 * Received header (RFC 5321 4.4, with-protocol per RFC 3848).
 *
 * A 250 for a recipient follows only deliver_message()'s STORE_OK for it,
 * which comes after the durable commit; every other outcome is a 4xx or
 * 5xx.
 *
 * A frontend (lmtp_proxy) opens no mailbox list: RCPT asks the directory
 * (store/directory.h) which backend holds the user, the message is
 * staged the same way (without Return-Path: the backend adds it), and
 * at its end lmtp_proxy.c relays it to the backends; each recipient gets
 * its backend's reply, so a 250 follows only the backend's 250.  Per connection state is freed when the session ends, whatever the
 * way (QUIT, EOF, timeout, a stream error).
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/fmt.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "lib/prot.h"
#include "lib/procid.h"
#include "lib/saslserver.h"
#include "lib/service.h"
#include "lmtpd/lmtp.h"
#include "lmtpd/lmtp_proxy.h"
#include "lmtpd/lmtp_sieve.h"
#include "lmtpd/rcpt.h"
#include "lmtpd/received.h"
#include "store/append.h"
#include "store/deliver.h"
#include "store/directory.h"
#include "store/store.h"
#include "store/userid.h"
#include "store/userstate.h"

#define LMTP_CMD_MAX 4096        /* command line, without CRLF */
#define LMTP_LINE_MAX 65536      /* message text line, without CRLF */
#define LMTP_AUTH_LINE_MAX 12288 /* RFC 4954 section 4 */
#define LMTP_HDR_KEEP 65536      /* header bytes kept for the Message-ID */
#define LMTP_OUT_CHUNK 65536     /* filter output written in pieces */
#define LMTP_FOLD 78

#define R_TEMPFAIL "451 4.3.0 Temporary failure, try again later"
#define R_NOSPACE "452 4.3.1 Insufficient system storage"
#define R_TOOBIG "552 5.3.4 Message size exceeds fixed maximum message size"
#define R_UNKNOWN "550 5.1.1 User unknown"
#define R_NOPOST "550 5.7.1 Permission denied"
#define R_QUOTA_TEMP "452 4.2.2 Over quota"
#define R_QUOTA_PERM "552 5.2.2 Over quota"
#define R_NUL "554 5.6.0 Message contains NUL"
#define R_NEEDUTF8 "553 5.6.7 Non-ASCII address requires SMTPUTF8"
#define R_BARE "554 5.6.0 Message contains bare CR or LF"
#define R_LONGLINE "554 5.6.0 Message contains a line too long"
#define R_HDRLINES "554 5.6.0 Message has too many header lines"
#define R_BADMSG "554 5.6.0 Message refused"
#define R_MOVING "451 4.2.1 Mailbox is being moved, try again later"
#define R_MOVED "451 4.2.1 Mailbox has moved to another server, try again later"
#define R_NODIRECTORY "451 4.4.3 Directory server failure, try again later"

struct lmtp_server {
    const struct imapconf *conf;
    struct deliver_ctx *dctx;
    struct rcpt_ctx *rctx;
    struct lmtp_sieve *sieve;   /* users' Sieve scripts (with dctx) */
    struct tls_server *tls;
    int sasl_ok;
    char servername[256];
    uint64_t maxsize;           /* 0 = no limit */
    unsigned long maxheaderlines;
    size_t maxrcpts;
    int timeout;
    int bare_fix;
    int overquota_perm;
    int db_failed;              /* the last open of the databases failed */
    unsigned long seq;          /* for Received ids */
    time_t date_at;             /* the second date[] was made for */
    char date[64];              /* the Received header's date (RFC 5322),
                                   made once a second */
    /* lmtp_proxy: a frontend (no local databases) */
    int proxy;
    struct directory *dir;
    struct lmtp_proxy *px;
    struct userid_policy policy;
    int downcase;
};

/* What went wrong with a message (the first problem counts). */
enum lmtp_msgerr {
    MSG_OK = 0,
    MSG_TOOBIG,
    MSG_NUL,
    MSG_BARE,
    MSG_LONGLINE,
    MSG_HDRLINES,
    MSG_STORE                   /* msg.store_err says which */
};

struct lmtp_msg {
    struct append_stage *st;    /* NULL while no message is open */
    struct buf out;             /* filtered bytes not yet written */
    struct buf hdr;             /* the client's header, whole lines */
    size_t hdr_linestart;       /* hdr.len where the current line began */
    int hdr_full;               /* stopped copying the header */
    uint64_t size;              /* client bytes after the filter */
    unsigned long hdrlines;
    size_t linelen;             /* bytes in the current line */
    int in_header;
    int cr;                     /* a CR is waiting for its LF */
    int dotguard;               /* DATA: watch lines that are only "." */
    int dot;                    /* a "." opening the line is held back */
    int bare_eol;               /* the last line end was a bare CR or LF */
    enum lmtp_msgerr err;
    int store_err;
};

struct lmtp_rcpt {
    char *mailbox;              /* internal name */
    char *reply;                /* a Sieve reject's reply, or NULL */
    char *addr;                 /* as the client wrote it, for logs */
    uint64_t rcpt_us;           /* when RCPT was accepted (metrics) */
    int backend;                /* lmtp_proxy: the backend's index */
};

struct lmtp_session {
    struct lmtp_server *srv;
    struct prot *p;
    const struct lmtp_conn *conn;
    struct buf line;
    struct buf helo;
    struct saslserver *sasl;
    char *authuser;             /* after a successful AUTH */
    int lhlo;
    int quit;
    /* the mail transaction */
    int mail;
    int bdat;                   /* BDAT chunks were sent */
    struct buf sender;          /* reverse-path without <> */
    uint64_t size_param;        /* MAIL SIZE=, 0 = none */
    int smtputf8;               /* MAIL SMTPUTF8 (RFC 6531) */
    struct lmtp_rcpt *rcpts;
    size_t nrcpts, arcpts;
    struct lmtp_msg msg;
};

/* ---- the server ------------------------------------------------------- */

/* Open the delivery and recipient contexts if they are not open yet (at
 * start, and again at each RCPT after a failure: a damaged or locked
 * mailbox list makes RCPT answer 451 until it is repaired, instead of
 * the worker dying at start and the master backing it off while clients
 * wait).  STORE_OK or the error (logged once per failure streak). */
static int lmtp_server_dbs(struct lmtp_server *srv)
{
    int r = STORE_OK;

    if (!srv->dctx)
        r = deliver_ctx_new(srv->conf, &srv->dctx);
    if (r == STORE_OK && !srv->rctx)
        r = rcpt_ctx_new(srv->conf, &srv->rctx);
    if (r == STORE_OK && !srv->sieve &&
        lmtp_sieve_new(srv->conf, srv->dctx, &srv->sieve) != 0)
        r = STORE_NOMEM;
    if (r != STORE_OK) {
        if (!srv->db_failed)
            log_error("lmtp: cannot open the mailbox list error=<%s>; "
                      "recipients get 451 until it opens",
                      store_strerror(r));
        srv->db_failed = 1;
        return r;
    }
    if (srv->db_failed)
        log_info("lmtp: mailbox list open again");
    srv->db_failed = 0;
    return STORE_OK;
}

int lmtp_server_new(const struct imapconf *conf, struct tls_server *tls,
                    int sasl_ok, struct lmtp_server **srv_r)
{
    struct lmtp_server *srv;
    long v;
    int r;

    *srv_r = NULL;
    srv = calloc(1, sizeof(*srv));
    if (!srv) {
        log_error("lmtp: out of memory");
        return -1;
    }
    srv->conf = conf;
    srv->tls = tls;
    srv->sasl_ok = sasl_ok;
    {
        /* a configuration error is refused at start, never ignored */
        struct userid_policy pol;
        const char *why = NULL;

        if (userid_policy_init(conf, &pol, &why) != STORE_OK) {
            log_error("lmtp: bad configuration key=<defaultdomain> "
                      "value=<%s> error=<%s>",
                      imapconf_getstring(conf, "defaultdomain"),
                      why ? why : "out of memory");
            free(srv);
            return -1;
        }
        srv->policy = pol;
    }
    srv->proxy = imapconf_getswitch(conf, "lmtp_proxy");
    srv->downcase = imapconf_getswitch(conf, "lmtp_downcase_rcpt");
    if (srv->proxy) {
        const char *why = NULL;

        if (directory_new(conf, &srv->dir, &why) != 0 ||
            lmtp_proxy_new(conf, &srv->px, &why) != 0) {
            log_error("lmtp: bad configuration for lmtp_proxy error=<%s>",
                      why ? why : "out of memory");
            lmtp_server_free(&srv);
            return -1;
        }
        log_info("lmtp: frontend mode directory=<%s> backends=<%s>",
                 imapconf_getstring(conf, "directory_db"),
                 imapconf_getstring(conf, "proxy_backends"));
    } else {
        (void)lmtp_server_dbs(srv);   /* a failure is retried at RCPT */
    }
    imapconf_servername(conf, srv->servername, sizeof(srv->servername));
    v = imapconf_getint(conf, "maxmessagesize");
    srv->maxsize = v > 0 ? (uint64_t)v : 0;
    v = imapconf_getint(conf, "maxheaderlines");
    srv->maxheaderlines = v > 0 ? (unsigned long)v : 1000;
    v = imapconf_getint(conf, "lmtp_max_recipients");
    srv->maxrcpts = v > 0 ? (size_t)v : 1000;
    v = imapconf_getint(conf, "lmtp_timeout");
    srv->timeout = v > 0 ? (int)v : 300;
    srv->bare_fix = strcmp(imapconf_getstring(conf, "lmtp_bare_newlines"),
                           "fix") == 0;
    srv->overquota_perm = imapconf_getswitch(conf,
                                             "lmtp_over_quota_perm_failure");
    {
        /* staging files of workers that were killed mid-delivery */
        unsigned long removed = 0;

        r = append_stage_cleanup(conf, NULL, 86400, &removed);
        if (r != STORE_OK)
            log_warning("lmtp: staging cleanup failed error=<%s>",
                        store_strerror(r));
        else if (removed)
            log_info("lmtp: removed stale staging files count=<%lu>",
                     removed);
    }
    *srv_r = srv;
    return 0;
}

void lmtp_server_free(struct lmtp_server **srvp)
{
    struct lmtp_server *srv = *srvp;

    if (!srv)
        return;
    rcpt_ctx_free(&srv->rctx);
    lmtp_sieve_free(&srv->sieve);
    deliver_ctx_free(&srv->dctx);
    directory_free(&srv->dir);
    lmtp_proxy_free(&srv->px);
    userid_policy_free(&srv->policy);
    free(srv);
    *srvp = NULL;
}

/* ---- small helpers ----------------------------------------------------- */

static const char *lmtp_store_reply(const struct lmtp_server *srv, int r)
{
    switch (r) {
    case STORE_OK:
        return "250 2.1.5 Ok";
    case STORE_OVERQUOTA:
        return srv->overquota_perm ? R_QUOTA_PERM : R_QUOTA_TEMP;
    case STORE_NOSPACE:
        return R_NOSPACE;
    case STORE_TOOBIG:
        return R_TOOBIG;
    case STORE_NOTFOUND:
    case STORE_BADNAME:
        return R_UNKNOWN;
    case STORE_PERMISSION:
        return R_NOPOST;
    case STORE_BADMESSAGE:
        return R_BADMSG;
    default:
        return R_TEMPFAIL;
    }
}

static const char *lmtp_msg_reply(const struct lmtp_server *srv,
                                  const struct lmtp_msg *m)
{
    switch (m->err) {
    case MSG_OK:
        return NULL;
    case MSG_TOOBIG:
        return R_TOOBIG;
    case MSG_NUL:
        return R_NUL;
    case MSG_BARE:
        return R_BARE;
    case MSG_LONGLINE:
        return R_LONGLINE;
    case MSG_HDRLINES:
        return R_HDRLINES;
    case MSG_STORE:
        return lmtp_store_reply(srv, m->store_err);
    }
    return R_TEMPFAIL;
}

static void lmtp_reply(struct lmtp_session *s, const char *text)
{
    prot_puts(s->p, text);
    prot_puts(s->p, "\r\n");
}

/* Client bytes made fit for a log line. */
static const char *lmtp_clean(const char *data, size_t len, char *out,
                              size_t outlen)
{
    return log_sanitize(data, len, out, outlen);
}

/* What a recipient's reply means, for the log: "delivered", "duplicate"
 * (2xx, nothing stored), "overquota", "deferred" (another 4xx) or
 * "refused" (another 5xx). */
static const char *lmtp_status_word(const char *reply, int duplicate)
{
    if (reply[0] == '2')
        return duplicate ? "duplicate" : "delivered";
    if (strcmp(reply, R_QUOTA_TEMP) == 0 || strcmp(reply, R_QUOTA_PERM) == 0)
        return "overquota";
    return reply[0] == '4' ? "deferred" : "refused";
}

/* One line per recipient and outcome (after DATA, or a refusal at RCPT):
 *   lmtp: recipient qid=<Q> msgid=<M> sender=<S> rcpt=<R> mailbox=<B>
 *   uid=<U> size=<N> status=<delivered> reply=<250 2.1.5> delay=<0.012>
 *   peer=<P>
 * qid and msgid only when known, mailbox when resolved, uid when
 * stored, size once the message was read; a frontend (lmtp_proxy) logs
 * user=<U> backend=<B> instead of mailbox and uid.  reply is the reply's code
 * and enhanced code; delay the seconds from RCPT to this reply. */
static void lmtp_log_rcpt(struct lmtp_session *s, const char *qid,
                          const char *msgid, const char *addr,
                          const char *mailbox, uint32_t uid,
                          const uint64_t *size, const char *reply,
                          int duplicate, uint64_t rcpt_us, int backend)
{
    char csender[256], cqid[RECEIVED_QID_MAX + 16], cmsgid[300];
    char cmailbox[400], cuid[32], csize[40];
    uint64_t now = metrics_now_us();
    uint64_t us = now > rcpt_us ? now - rcpt_us : 0;
    size_t codelen = strcspn(reply, " ");

    if (reply[codelen] == ' ')
        codelen += 1 + strcspn(reply + codelen + 1, " ");
    lmtp_clean(s->sender.s ? s->sender.s : "", s->sender.len, csender,
               sizeof(csender));
    cqid[0] = cmsgid[0] = cmailbox[0] = cuid[0] = csize[0] = '\0';
    /* the optional fields by fmt_snprintf(): snprintf() costs some
     * thousand instructions a call, and this line is written for every
     * recipient */
    if (qid && *qid)
        fmt_snprintf(cqid, sizeof(cqid), " qid=<%s>", qid);
    if (msgid && *msgid)
        fmt_snprintf(cmsgid, sizeof(cmsgid), " msgid=<%s>", msgid);
    if (mailbox && *mailbox && backend >= 0 && s->srv->px)
        fmt_snprintf(cmailbox, sizeof(cmailbox),
                     " user=<%.*s> backend=<%s>", 256, mailbox,
                     lmtp_proxy_name(s->srv->px, backend));
    else if (mailbox && *mailbox)
        fmt_snprintf(cmailbox, sizeof(cmailbox), " mailbox=<%.*s>", 256,
                     mailbox);
    if (uid)
        fmt_snprintf(cuid, sizeof(cuid), " uid=<%u>", (unsigned)uid);
    if (size)
        fmt_snprintf(csize, sizeof(csize), " size=<%llu>",
                     (unsigned long long)*size);
    log_info("lmtp: recipient%s%s sender=<%s> rcpt=<%s>%s%s%s status=<%s> "
             "reply=<%.*s> delay=<%llu.%03llu> peer=<%s>", cqid, cmsgid,
             csender, addr, cmailbox, cuid, csize,
             lmtp_status_word(reply, duplicate), (int)codelen, reply,
             (unsigned long long)(us / 1000000),
             (unsigned long long)(us / 1000 % 1000), s->conn->peer);
}

/* Case-insensitive "does (s, len) start with word"? */
static int lmtp_prefix(const char *s, size_t len, const char *word)
{
    size_t n = strlen(word);

    return len >= n && strncasecmp(s, word, n) == 0;
}

/* Parse 1..20 decimal digits into *v_r (no overflow). 0 or -1. */
static int lmtp_parse_size(const char *s, size_t len, uint64_t *v_r)
{
    uint64_t v = 0;
    size_t i;

    if (len == 0 || len > 20)
        return -1;
    for (i = 0; i < len; i++) {
        unsigned d;

        if (s[i] < '0' || s[i] > '9')
            return -1;
        d = (unsigned)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *v_r = v;
    return 0;
}

/* RFC 3461 xtext: printable ASCII except '+' and '=', or "+XX". */
static int lmtp_is_xtext(const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '+') {
            if (len - i < 3 || !isxdigit((unsigned char)s[i + 1]) ||
                !isxdigit((unsigned char)s[i + 2]))
                return 0;
            i += 2;
        } else if (c < 33 || c > 126 || c == '=') {
            return 0;
        }
    }
    return 1;
}

/* ---- the transaction --------------------------------------------------- */

/* Forget the message.  The two buffers keep their memory for the next
 * message of the session (a 14 KB message would otherwise grow each of
 * them by realloc from scratch, copying as it goes); lmtp_serve() frees
 * them when the session ends. */
static void lmtp_msg_discard(struct lmtp_msg *m)
{
    struct buf out = m->out, hdr = m->hdr;

    append_stage_free(&m->st);   /* unlinks the staging file */
    buf_reset(&out);
    buf_reset(&hdr);
    memset(m, 0, sizeof(*m));
    m->out = out;
    m->hdr = hdr;
}

static void lmtp_txn_reset(struct lmtp_session *s)
{
    size_t i;

    for (i = 0; i < s->nrcpts; i++) {
        free(s->rcpts[i].mailbox);
        free(s->rcpts[i].addr);
        free(s->rcpts[i].reply);
    }
    free(s->rcpts);
    s->rcpts = NULL;
    s->nrcpts = s->arcpts = 0;
    buf_free(&s->sender);
    s->size_param = 0;
    s->smtputf8 = 0;
    s->mail = 0;
    s->bdat = 0;
    lmtp_msg_discard(&s->msg);
}

static void lmtp_msg_fail(struct lmtp_msg *m, enum lmtp_msgerr err,
                          int store_err)
{
    if (m->err == MSG_OK) {
        m->err = err;
        m->store_err = store_err;
    }
    buf_reset(&m->out);   /* nothing more is written; memory kept */
}

/* Write what the filter produced to the stage. */
static void lmtp_msg_flush(struct lmtp_msg *m)
{
    int r;

    if (m->out.len == 0 || m->err != MSG_OK)
        return;
    r = append_stage_write(m->st, m->out.s, m->out.len);
    buf_reset(&m->out);
    if (r == STORE_TOOBIG)
        lmtp_msg_fail(m, MSG_TOOBIG, r);
    else if (r != STORE_OK)
        lmtp_msg_fail(m, MSG_STORE, r);
}

static void lmtp_msg_emit(struct lmtp_session *s, const char *data,
                          size_t len)
{
    struct lmtp_msg *m = &s->msg;

    if (m->err != MSG_OK || len == 0)
        return;
    m->size += len;
    if (s->srv->maxsize && m->size > s->srv->maxsize) {
        lmtp_msg_fail(m, MSG_TOOBIG, STORE_TOOBIG);
        return;
    }
    if (m->in_header && !m->hdr_full) {
        if (m->hdr.len + len > LMTP_HDR_KEEP) {
            buf_truncate(&m->hdr, m->hdr_linestart);
            m->hdr_full = 1;
        } else if (buf_append(&m->hdr, data, len) != 0) {
            buf_truncate(&m->hdr, m->hdr_linestart);
            m->hdr_full = 1;
        }
    }
    if (buf_append(&m->out, data, len) != 0) {
        lmtp_msg_fail(m, MSG_STORE, STORE_NOMEM);
        return;
    }
    if (m->out.len >= LMTP_OUT_CHUNK)
        lmtp_msg_flush(m);
}

/* A line ended (its CRLF already emitted). */
static void lmtp_msg_eol(struct lmtp_session *s)
{
    struct lmtp_msg *m = &s->msg;

    if (m->in_header) {
        if (m->linelen == 0) {
            m->in_header = 0;
        } else if (++m->hdrlines > s->srv->maxheaderlines) {
            lmtp_msg_fail(m, MSG_HDRLINES, 0);
        }
        m->hdr_linestart = m->hdr.len;
    }
    m->linelen = 0;
}

/* The length of the run of bytes at p that are none of CR, LF and NUL
 * (the filter's special bytes): three vectorized memchr() calls, each
 * over what is left of the run, instead of a loop over every byte. */
static size_t lmtp_plain_span(const char *p, size_t n)
{
    const char *q;

    if ((q = memchr(p, '\r', n)) != NULL)
        n = (size_t)(q - p);
    if ((q = memchr(p, '\n', n)) != NULL)
        n = (size_t)(q - p);
    if ((q = memchr(p, '\0', n)) != NULL)
        n = (size_t)(q - p);
    return n;
}

/* A line ends (bare: it was a bare CR or LF, made CRLF).  A "." held
 * back at the start of the line comes out first: when the line is only
 * that dot and a bare newline stands before or after it, it is doubled,
 * so that no line made of a lone "." is stored where the client's bytes
 * were not <CRLF>.<CRLF> (the end of DATA that it was not). */
static void lmtp_msg_newline(struct lmtp_session *s, int bare)
{
    struct lmtp_msg *m = &s->msg;

    if (m->dot) {
        m->dot = 0;
        if (bare || m->bare_eol)
            lmtp_msg_emit(s, "..", 2);
        else
            lmtp_msg_emit(s, ".", 1);
    }
    lmtp_msg_emit(s, "\r\n", 2);
    lmtp_msg_eol(s);
    m->bare_eol = bare;
}

/* Bytes of the message (after dot-unstuffing), cut anywhere.  The usual
 * line, ordinary bytes then CRLF in the same piece, goes out with one
 * lmtp_msg_emit() (what it does for run + CRLF is what two calls would
 * do: the size check and the header copy see the same bytes).  With
 * dotguard (DATA), a "." opening a line is held back until the next byte
 * tells whether the line is only that dot (lmtp_msg_newline). */
static void lmtp_msg_feed(struct lmtp_session *s, const char *data,
                          size_t len)
{
    struct lmtp_msg *m = &s->msg;
    size_t i = 0;

    while (i < len && m->err == MSG_OK) {
        unsigned char c = (unsigned char)data[i];

        if (m->cr) {
            m->cr = 0;
            if (c == '\n') {
                lmtp_msg_newline(s, 0);
                i++;
                continue;
            }
            /* a bare CR */
            if (!s->srv->bare_fix) {
                lmtp_msg_fail(m, MSG_BARE, 0);
                break;
            }
            lmtp_msg_newline(s, 1);
            continue;   /* c starts the next line */
        }
        if (c == '\r') {
            if (i + 1 < len && data[i + 1] == '\n') {
                lmtp_msg_newline(s, 0);
                i += 2;
                continue;
            }
            m->cr = 1;
            i++;
            continue;
        }
        if (c == '\n') {
            if (!s->srv->bare_fix) {
                lmtp_msg_fail(m, MSG_BARE, 0);
                break;
            }
            lmtp_msg_newline(s, 1);
            i++;
            continue;
        }
        if (c == '\0') {
            lmtp_msg_fail(m, MSG_NUL, 0);
            break;
        }
        if (m->dotguard && m->linelen == 0 && c == '.') {
            m->dot = 1;
            m->linelen = 1;
            i++;
            continue;
        }
        if (m->dot) {
            /* more follows on the line: the dot is an ordinary byte */
            m->dot = 0;
            lmtp_msg_emit(s, ".", 1);
        }
        /* a run of ordinary bytes */
        {
            size_t j = i + lmtp_plain_span(data + i, len - i),
                   room = LMTP_LINE_MAX - m->linelen;

            if (j - i > room) {
                lmtp_msg_fail(m, MSG_LONGLINE, 0);
                break;
            }
            m->linelen += j - i;
            if (j + 1 < len && data[j] == '\r' && data[j + 1] == '\n') {
                /* the run and its line end at once */
                lmtp_msg_emit(s, data + i, j + 2 - i);
                lmtp_msg_eol(s);
                m->bare_eol = 0;
                i = j + 2;
                continue;
            }
            lmtp_msg_emit(s, data + i, j - i);
            i = j;
        }
    }
}

/* End of the message bytes: a CR left over is a bare one. */
static void lmtp_msg_end(struct lmtp_session *s)
{
    struct lmtp_msg *m = &s->msg;

    if (m->cr && m->err == MSG_OK) {
        m->cr = 0;
        if (!s->srv->bare_fix)
            lmtp_msg_fail(m, MSG_BARE, 0);
        else
            lmtp_msg_newline(s, 1);
    }
    if (m->dot && m->err == MSG_OK) {
        m->dot = 0;
        lmtp_msg_emit(s, ".", 1);
    }
    lmtp_msg_flush(m);
}

/* Append word to a header being folded at LMTP_FOLD columns. */
static void lmtp_fold_word(struct buf *h, size_t *col, const char *word)
{
    size_t n = strlen(word);

    if (*col > 1 && *col + 1 + n > LMTP_FOLD) {
        buf_appendcstr(h, "\r\n\t");
        *col = 1;
    } else {
        buf_putc(h, ' ');
        (*col)++;
    }
    buf_appendcstr(h, word);
    *col += n;
}

/* Words of text (split at spaces) into the folded header. */
static void lmtp_fold_text(struct buf *h, size_t *col, const char *text)
{
    char word[512];
    const char *p = text;

    while (*p) {
        size_t n;

        while (*p == ' ')
            p++;
        n = strcspn(p, " ");
        if (n == 0)
            break;
        if (n >= sizeof(word))
            n = sizeof(word) - 1;
        memcpy(word, p, n);
        word[n] = '\0';
        lmtp_fold_word(h, col, word);
        p += strcspn(p, " ");
    }
}

/* Client text safe inside a header: printable ASCII, no parentheses or
 * backslashes (they would break a comment), no spaces. */
static void lmtp_header_safe(const char *in, size_t len, char *out,
                             size_t outlen)
{
    size_t i, n = 0;

    for (i = 0; i < len && n + 1 < outlen; i++) {
        unsigned char c = (unsigned char)in[i];

        if (c <= 32 || c >= 127 || c == '(' || c == ')' || c == '\\')
            c = '?';
        out[n++] = (char)c;
    }
    out[n] = '\0';
}

/* The TCP-info of the Received header: "[1.2.3.4]", "[IPv6:::1]", or the
 * peer text for local connections. */
static void lmtp_peer_info(const char *peer, char *out, size_t outlen)
{
    const char *colon;

    if (peer[0] == '[') {
        const char *close = strchr(peer, ']');
        size_t n = close ? (size_t)(close - peer - 1) : strlen(peer + 1);

        fmt_snprintf(out, outlen, "[IPv6:%.*s]", (int)n, peer + 1);
    } else if ((colon = strrchr(peer, ':')) != NULL) {
        fmt_snprintf(out, outlen, "[%.*s]", (int)(colon - peer), peer);
    } else {
        fmt_snprintf(out, outlen, "%s", peer);
    }
}

/* Open the stage and write Return-Path and Received.  STORE_OK, or the
 * store error (logged; no stage is left open). */
static int lmtp_msg_begin(struct lmtp_session *s)
{
    struct lmtp_server *srv = s->srv;
    struct lmtp_msg *m = &s->msg;
    struct buf h = BUF_INITIALIZER;
    char helo[256], peer[128], word[600];
    const char *tlsinfo;
    size_t col;
    time_t now = time(NULL);
    int r;

    lmtp_msg_discard(m);
    r = append_stage_open(srv->conf, NULL, &m->st);
    if (r != STORE_OK) {
        log_error("lmtp: cannot open a staging file error=<%s>",
                  store_strerror(r));
        return r;
    }
    m->in_header = 1;

    /* a frontend leaves Return-Path to the backend that stores it */
    if (!srv->proxy)
        buf_printf(&h, "Return-Path: <%s>\r\n", buf_cstring(&s->sender));
    buf_appendcstr(&h, "Received:");
    col = strlen("Received:");
    lmtp_header_safe(s->helo.s ? s->helo.s : "", s->helo.len, helo,
                     sizeof(helo));
    lmtp_fold_word(&h, &col, "from");
    lmtp_fold_word(&h, &col, helo[0] ? helo : "unknown");
    lmtp_peer_info(s->conn->peer, peer, sizeof(peer));
    fmt_snprintf(word, sizeof(word), "(%s)", peer);
    lmtp_fold_word(&h, &col, word);
    lmtp_fold_word(&h, &col, "by");
    lmtp_fold_word(&h, &col, srv->servername);
    lmtp_fold_text(&h, &col, "(cyrusdeliver lmtpd) with");
    /* RFC 3848 and, for an SMTPUTF8 transaction, RFC 6531 4.3 */
    fmt_snprintf(word, sizeof(word), "%sLMTP%s%s", s->smtputf8 ? "UTF8" : "",
             prot_is_tls(s->p) ? "S" : "", s->authuser ? "A" : "");
    lmtp_fold_word(&h, &col, word);
    tlsinfo = prot_tls_info(s->p);
    if (tlsinfo) {
        char safe[256];
        size_t i;

        fmt_snprintf(safe, sizeof(safe), "%s", tlsinfo);
        for (i = 0; safe[i]; i++)
            if (safe[i] == '(' || safe[i] == ')' || safe[i] == '\\' ||
                (unsigned char)safe[i] < 32 || (unsigned char)safe[i] > 126)
                safe[i] = '?';
        fmt_snprintf(word, sizeof(word), "(using %s)", safe);
        lmtp_fold_text(&h, &col, word);
    }
    srv->seq++;
    fmt_snprintf(word, sizeof(word), "id %lx%05lx%04lx;", (unsigned long)now,
             (unsigned long)procid_get() & 0xfffffUL, srv->seq & 0xffffUL);
    lmtp_fold_text(&h, &col, word);
    if (now != srv->date_at || !srv->date[0]) {
        /* localtime_r() and strftime() cost some 2,000 instructions: once
         * a second, not per message */
        struct tm tm;

        localtime_r(&now, &tm);
        if (strftime(srv->date, sizeof(srv->date),
                     "%a, %d %b %Y %H:%M:%S %z", &tm) == 0)
            srv->date[0] = '\0';
        srv->date_at = now;
    }
    lmtp_fold_text(&h, &col, srv->date);
    buf_appendcstr(&h, "\r\n");

    if (h.len == 0 || !h.s) {
        r = STORE_NOMEM;
    } else {
        /* maxmessagesize is about the client's message, not our headers */
        append_stage_allow_extra(m->st, h.len);
        r = append_stage_write(m->st, h.s, h.len);
    }
    buf_free(&h);
    if (r != STORE_OK) {
        log_error("lmtp: cannot write a staging file error=<%s>",
                  store_strerror(r));
        lmtp_msg_discard(m);
        return r;
    }
    return STORE_OK;
}

/* A recipient's result that is a Sieve reject (its reply text is in
 * lmtp_rcpt.reply); never a store code. */
#define LMTP_RESULT_REJECT (-100)

/* Run every recipient's Sieve script, then store the message in every
 * mailbox the recipients and their scripts chose, in ONE
 * deliver_message() call (one append transaction, one durable commit),
 * and fill dr[i] (one per recipient) with each recipient's outcome: the
 * first failure among its mailboxes, duplicate when every mailbox had
 * it, LMTP_RESULT_REJECT for a Sieve reject, STORE_IOERROR (451) for a
 * temporary Sieve failure. */
static void lmtp_deliver_all(struct lmtp_session *s, const char *msgid,
                             struct deliver_rcpt *dr)
{
    struct lmtp_server *srv = s->srv;
    struct lmtp_sieve_msg sm;
    struct lmtp_sieve_result *sr;
    struct deliver_rcpt *all = NULL;
    size_t *owner = NULL, i, j, n = 0, total = 0;

    memset(&sm, 0, sizeof(sm));
    sm.sender = buf_cstring(&s->sender);
    sm.st = s->msg.st;
    sm.msgid = msgid;
    sm.servername = srv->servername;
    sr = calloc(s->nrcpts, sizeof(*sr));
    if (!sr) {
        for (i = 0; i < s->nrcpts; i++)
            dr[i] = (struct deliver_rcpt){ .mailbox = s->rcpts[i].mailbox,
                                           .result = STORE_NOMEM };
        return;
    }
    for (i = 0; i < s->nrcpts; i++) {
        lmtp_sieve_run(srv->sieve, &sm, s->rcpts[i].addr,
                       s->rcpts[i].mailbox, &sr[i]);
        if (sr[i].outcome == LMTP_SIEVE_NONE)
            total++;
        else if (sr[i].outcome == LMTP_SIEVE_DONE)
            total += sr[i].ntargets;
    }
    all = calloc(total ? total : 1, sizeof(*all));
    owner = calloc(total ? total : 1, sizeof(*owner));
    if (!all || !owner) {
        for (i = 0; i < s->nrcpts; i++)
            dr[i] = (struct deliver_rcpt){ .mailbox = s->rcpts[i].mailbox,
                                           .result = STORE_NOMEM };
        goto out;
    }
    for (i = 0; i < s->nrcpts; i++) {
        if (sr[i].outcome == LMTP_SIEVE_NONE) {
            all[n].mailbox = s->rcpts[i].mailbox;
            owner[n++] = i;
        } else if (sr[i].outcome == LMTP_SIEVE_DONE) {
            for (j = 0; j < sr[i].ntargets; j++) {
                struct lmtp_sieve_target *t = &sr[i].targets[j];

                all[n].mailbox = t->mailbox;
                all[n].sysflags = t->sysflags;
                all[n].keywords = (const char *const *)t->keywords.data;
                all[n].nkeywords = t->keywords.count;
                all[n].stage = t->stage;
                owner[n++] = i;
            }
        }
    }
    if (n)
        deliver_message(srv->dctx, s->msg.st, msgid,
                        msgid ? strlen(msgid) : 0, all, n, 0);
    for (i = 0; i < s->nrcpts; i++) {
        struct deliver_rcpt *d = &dr[i];
        int first = 1;

        *d = (struct deliver_rcpt){ .mailbox = s->rcpts[i].mailbox,
                                    .result = STORE_OK };
        if (sr[i].outcome == LMTP_SIEVE_TEMPFAIL) {
            d->result = STORE_IOERROR;
            continue;
        }
        if (sr[i].outcome == LMTP_SIEVE_REJECT) {
            struct buf reply = BUF_INITIALIZER;

            buf_printf(&reply, "550 5.7.1 %s",
                       sr[i].reason && *sr[i].reason ? sr[i].reason
                                                     : "Message rejected");
            free(s->rcpts[i].reply);
            s->rcpts[i].reply = buf_release(&reply);
            d->result = s->rcpts[i].reply ? LMTP_RESULT_REJECT
                                          : STORE_NOMEM;
            continue;
        }
        for (j = 0; j < n; j++) {
            if (owner[j] != i)
                continue;
            if (sr[i].outcome == LMTP_SIEVE_DONE &&
                all[j].result == STORE_NOTFOUND)
                all[j].result = STORE_IOERROR;   /* a folder vanished */
            if (first) {
                d->mailbox = all[j].mailbox == s->rcpts[i].mailbox
                                 ? s->rcpts[i].mailbox : d->mailbox;
                d->uid = all[j].uid;
                d->duplicate = all[j].duplicate;
                first = 0;
            } else {
                d->duplicate = d->duplicate && all[j].duplicate;
            }
            if (all[j].result != STORE_OK && d->result == STORE_OK)
                d->result = all[j].result;
        }
        if (d->result == STORE_OK && sr[i].outcome == LMTP_SIEVE_DONE)
            lmtp_sieve_commit(srv->sieve, &sr[i]);
    }
out:
    for (i = 0; i < s->nrcpts; i++)
        lmtp_sieve_result_fini(&sr[i]);
    free(sr);
    free(all);
    free(owner);
    lmtp_sieve_msg_fini(&sm);
}

/* A frontend: the message goes to every recipient's backend, one
 * pipelined transaction per backend, all backends at once
 * (lmtp_proxy_send); replies[i] gets recipient i's reply as its backend
 * gave it (malloc'd; NULL when memory ran out). */
static void lmtp_proxy_all(struct lmtp_session *s, char **replies)
{
    size_t i, j, nr = s->nrcpts, ng = 0;
    const char **addrs = calloc(nr, sizeof(*addrs));
    size_t *idx = calloc(nr, sizeof(*idx));
    char **got = calloc(nr, sizeof(*got));
    struct lmtp_proxy_group *groups = calloc(nr, sizeof(*groups));
    char *done = calloc(nr, 1);
    const char *path = append_stage_path(s->msg.st);
    uint64_t size = append_stage_info(s->msg.st)->size;
    size_t k = 0;

    for (i = 0; i < nr; i++)
        replies[i] = NULL;
    if (!addrs || !idx || !got || !groups || !done || !path)
        goto out;
    /* recipients grouped by backend, in the order of each backend's
     * first recipient; idx[] maps the group slots back */
    for (i = 0; i < nr; i++) {
        int b = s->rcpts[i].backend;
        size_t first = k;

        if (done[i])
            continue;
        for (j = i; j < nr; j++) {
            if (s->rcpts[j].backend != b)
                continue;
            addrs[k] = s->rcpts[j].addr;
            idx[k++] = j;
            done[j] = 1;
        }
        groups[ng].backend = b;
        groups[ng].rcpts = &addrs[first];
        groups[ng].n = k - first;
        groups[ng].replies = &got[first];
        ng++;
    }
    lmtp_proxy_send(s->srv->px, buf_cstring(&s->sender), s->smtputf8, path,
                    size, groups, ng);
    for (k = 0; k < nr; k++)
        replies[idx[k]] = got[k];
out:
    free(addrs);
    free(idx);
    free(got);
    free(groups);
    free(done);
}

/* The message is complete: deliver it (a frontend: relay it) and answer
 * per recipient, in RCPT order.  The transaction is reset afterwards. */
static void lmtp_msg_finish(struct lmtp_session *s)
{
    struct lmtp_server *srv = s->srv;
    struct lmtp_msg *m = &s->msg;
    struct deliver_rcpt *dr = NULL;
    struct buf msgid = BUF_INITIALIZER;
    const char *fixed = NULL, *result = "ok";
    size_t i, stored = 0, dups = 0, failed = 0;
    char csender[256], cmsgid[256], qid[RECEIVED_QID_MAX + 1];
    int r;

    lmtp_msg_end(s);
    /* a delivery blocks on the commit: send what is queued first */
    prot_flush(s->p);
    /* the lines of this message (Sieve's, every recipient's, the
     * delivery's) go to the log together, with one write, before any
     * reply leaves (the replies are flushed after this returns) */
    log_hold();
    if (m->err == MSG_OK) {
        r = append_stage_close(m->st);
        if (r == STORE_TOOBIG)
            lmtp_msg_fail(m, MSG_TOOBIG, r);
        else if (r != STORE_OK)
            lmtp_msg_fail(m, MSG_STORE, r);
    }
    if (m->err == MSG_OK) {
        dr = calloc(s->nrcpts, sizeof(*dr));
        if (!dr)
            lmtp_msg_fail(m, MSG_STORE, STORE_NOMEM);
    }
    fixed = lmtp_msg_reply(srv, m);
    /* the headers as far as read, also for a refused message */
    deliver_find_msgid(m->hdr.s ? m->hdr.s : "", m->hdr.len, &msgid);
    lmtp_clean(msgid.s ? msgid.s : "", msgid.len, cmsgid, sizeof(cmsgid));
    received_queue_id(m->hdr.s ? m->hdr.s : "", m->hdr.len, qid,
                      sizeof(qid));
    if (!fixed && srv->proxy) {
        char **pr = calloc(s->nrcpts, sizeof(*pr));

        if (pr)
            lmtp_proxy_all(s, pr);
        for (i = 0; i < s->nrcpts; i++) {
            const char *reply = pr && pr[i] ? pr[i] : R_TEMPFAIL;

            lmtp_reply(s, reply);
            metrics_lmtp_final(reply, s->rcpts[i].rcpt_us, m->size);
            lmtp_log_rcpt(s, qid, cmsgid, s->rcpts[i].addr,
                          s->rcpts[i].mailbox, 0, &m->size, reply, 0,
                          s->rcpts[i].rcpt_us, s->rcpts[i].backend);
            if (reply[0] == '2')
                stored++;
            else
                failed++;
            if (pr)
                free(pr[i]);
        }
        free(pr);
        result = failed == 0 ? "ok" : (failed == s->nrcpts ? "failed"
                                                           : "partial");
    } else if (!fixed) {
        lmtp_deliver_all(s, msgid.len ? buf_cstring(&msgid) : NULL, dr);
        for (i = 0; i < s->nrcpts; i++) {
            const char *reply = dr[i].result == LMTP_RESULT_REJECT
                                    ? s->rcpts[i].reply
                                    : lmtp_store_reply(srv, dr[i].result);

            lmtp_reply(s, reply);
            metrics_lmtp_final(reply, s->rcpts[i].rcpt_us, m->size);
            lmtp_log_rcpt(s, qid, cmsgid, s->rcpts[i].addr, dr[i].mailbox,
                          dr[i].result == STORE_OK && !dr[i].duplicate
                              ? dr[i].uid : 0,
                          &m->size, reply, dr[i].duplicate,
                          s->rcpts[i].rcpt_us, -1);
            if (dr[i].result == LMTP_RESULT_REJECT)
                dr[i].result = STORE_PERMISSION;   /* counted as failed */
            if (dr[i].result != STORE_OK) {
                failed++;
            } else if (dr[i].duplicate) {
                metrics_count(METRICS_DUPLICATES, 1);
                dups++;
            } else {
                stored++;
            }
        }
        result = failed == 0 ? "ok" : (failed == s->nrcpts ? "failed"
                                                           : "partial");
    } else {
        for (i = 0; i < s->nrcpts; i++) {
            lmtp_reply(s, fixed);
            metrics_lmtp_final(fixed, s->rcpts[i].rcpt_us, m->size);
            lmtp_log_rcpt(s, qid, cmsgid, s->rcpts[i].addr,
                          s->rcpts[i].mailbox, 0, &m->size, fixed, 0,
                          s->rcpts[i].rcpt_us, s->rcpts[i].backend);
        }
        failed = s->nrcpts;
        result = "refused";
    }
    lmtp_clean(s->sender.s ? s->sender.s : "", s->sender.len, csender,
               sizeof(csender));
    log_info("lmtp: delivery%s%s%s sender=<%s> rcpts=<%lu> size=<%llu> "
             "result=<%s> stored=<%lu> duplicates=<%lu> failed=<%lu> "
             "msgid=<%s> peer=<%s>%s%s%s", qid[0] ? " qid=<" : "", qid,
             qid[0] ? ">" : "", csender,
             (unsigned long)s->nrcpts, (unsigned long long)m->size, result,
             (unsigned long)stored, (unsigned long)dups,
             (unsigned long)failed, cmsgid, s->conn->peer,
             fixed ? " reason=<" : "", fixed ? fixed : "", fixed ? ">" : "");
    log_release();
    free(dr);
    buf_free(&msgid);
    lmtp_txn_reset(s);
}

/* ---- commands ---------------------------------------------------------- */

static void lmtp_timeout_close(struct lmtp_session *s)
{
    prot_printf(s->p, "421 4.4.2 %s Timeout, closing connection\r\n",
                s->srv->servername);
    prot_flush(s->p);
    log_info("lmtp: timeout peer=<%s>", s->conn->peer);
    s->quit = 1;
}

/* A read inside a command failed: end the session. */
static void lmtp_read_failed(struct lmtp_session *s, int r)
{
    if (r == PROT_TIMEOUT) {
        lmtp_timeout_close(s);
        return;
    }
    if (r == PROT_NOMEM) {
        prot_printf(s->p, "421 4.3.0 %s Out of memory, closing "
                    "connection\r\n", s->srv->servername);
        prot_flush(s->p);
    }
    if (r != PROT_EOF)
        log_info("lmtp: connection failed peer=<%s> error=<%s>",
                 s->conn->peer, prot_error(s->p));
    s->quit = 1;
}

static void lmtp_cmd_lhlo(struct lmtp_session *s, const char *arg,
                          size_t len)
{
    struct buf mechs = BUF_INITIALIZER;
    size_t n;

    while (len > 0 && *arg == ' ') {
        arg++;
        len--;
    }
    n = 0;
    while (n < len && arg[n] != ' ')
        n++;
    if (n == 0) {
        lmtp_reply(s, "501 5.5.4 Syntax: LHLO hostname");
        return;
    }
    lmtp_txn_reset(s);
    if (n > 255)
        n = 255;
    buf_setmap(&s->helo, arg, n);
    s->lhlo = 1;
    prot_printf(s->p, "250-%s\r\n", s->srv->servername);
    prot_puts(s->p, "250-8BITMIME\r\n250-ENHANCEDSTATUSCODES\r\n"
                    "250-PIPELINING\r\n250-CHUNKING\r\n250-SMTPUTF8\r\n");
    if (s->srv->maxsize)
        prot_printf(s->p, "250-SIZE %llu\r\n",
                    (unsigned long long)s->srv->maxsize);
    else
        prot_puts(s->p, "250-SIZE\r\n");
    if (s->srv->tls && !prot_is_tls(s->p))
        prot_puts(s->p, "250-STARTTLS\r\n");
    if (s->sasl && !s->authuser && saslserver_mechs(s->sasl, &mechs) == 0 &&
        mechs.len > 0)
        prot_printf(s->p, "250-AUTH %s\r\n", buf_cstring(&mechs));
    buf_free(&mechs);
    prot_puts(s->p, "250 HELP\r\n");
}

/* Does (p, len) hold a byte above 127? */
static int lmtp_has_8bit(const char *p, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++)
        if ((unsigned char)p[i] > 127)
            return 1;
    return 0;
}

/* The ESMTP parameters of MAIL. 0 or -1 (reply queued). */
static int lmtp_mail_params(struct lmtp_session *s, const char *p,
                            size_t len)
{
    size_t i = 0;

    for (;;) {
        size_t kstart, klen, vstart, vlen = 0;
        const char *v = NULL;

        while (i < len && p[i] == ' ')
            i++;
        if (i >= len)
            return 0;
        kstart = i;
        while (i < len && p[i] != ' ' && p[i] != '=')
            i++;
        klen = i - kstart;
        if (i < len && p[i] == '=') {
            vstart = ++i;
            while (i < len && p[i] != ' ')
                i++;
            v = p + vstart;
            vlen = i - vstart;
        }
        if (klen == 4 && strncasecmp(p + kstart, "SIZE", 4) == 0) {
            uint64_t size;

            if (!v || lmtp_parse_size(v, vlen, &size) != 0) {
                lmtp_reply(s, "501 5.5.4 Bad SIZE parameter");
                return -1;
            }
            if (s->srv->maxsize && size > s->srv->maxsize) {
                lmtp_reply(s, R_TOOBIG);
                return -1;
            }
            s->size_param = size;
        } else if (klen == 4 && strncasecmp(p + kstart, "BODY", 4) == 0) {
            if (!v || !((vlen == 4 && strncasecmp(v, "7BIT", 4) == 0) ||
                        (vlen == 8 && strncasecmp(v, "8BITMIME", 8) == 0))) {
                lmtp_reply(s, "501 5.5.4 Bad BODY parameter");
                return -1;
            }
        } else if (klen == 8 && strncasecmp(p + kstart, "SMTPUTF8", 8) == 0) {
            if (v) {
                lmtp_reply(s, "501 5.5.4 SMTPUTF8 takes no value");
                return -1;
            }
            s->smtputf8 = 1;
        } else if (klen == 4 && strncasecmp(p + kstart, "AUTH", 4) == 0) {
            /* RFC 4954 5: accepted; the submitter is not used here */
            if (v && !(vlen == 2 && memcmp(v, "<>", 2) == 0) &&
                !lmtp_is_xtext(v, vlen))
                log_debug("lmtp: AUTH= parameter ignored");
        } else {
            lmtp_reply(s, "555 5.5.4 Unsupported parameter");
            return -1;
        }
    }
}

static void lmtp_cmd_mail(struct lmtp_session *s, const char *arg,
                          size_t len)
{
    struct rcpt_path path;
    const char *err = NULL;
    size_t used = 0;

    if (!s->lhlo) {
        lmtp_reply(s, "503 5.5.1 Send LHLO first");
        return;
    }
    if (s->mail) {
        lmtp_reply(s, "503 5.5.1 Nested MAIL command");
        return;
    }
    if (!s->conn->trusted && !s->authuser) {
        lmtp_reply(s, "530 5.7.0 Authentication required");
        return;
    }
    if (!lmtp_prefix(arg, len, " FROM:")) {
        lmtp_reply(s, "501 5.5.4 Syntax: MAIL FROM:<address>");
        return;
    }
    arg += 6;
    len -= 6;
    rcpt_path_init(&path);
    /* UTF-8 is parsed here and allowed below only when the parameters
     * (which follow the path) include SMTPUTF8 */
    if (rcpt_parse_path(arg, len, RCPT_ALLOW_NULL | RCPT_UTF8, &path, &used,
                        &err) != 0) {
        prot_printf(s->p, "501 5.5.4 Bad sender address: %s\r\n", err);
        rcpt_path_free(&path);
        return;
    }
    s->size_param = 0;
    s->smtputf8 = 0;
    if (used < len && arg[used] != ' ') {
        lmtp_reply(s, "501 5.5.4 Syntax: MAIL FROM:<address> [parameters]");
    } else if (lmtp_mail_params(s, arg + used, len - used) != 0) {
        ;                       /* replied */
    } else if (!s->smtputf8 && lmtp_has_8bit(path.addr.s, path.addr.len)) {
        lmtp_reply(s, R_NEEDUTF8);
    } else {
        buf_free(&s->sender);
        s->sender = path.addr;
        memset(&path.addr, 0, sizeof(path.addr));
        buf_cstring(&s->sender);
        s->mail = 1;
        lmtp_reply(s, "250 2.1.0 Ok");
    }
    if (!s->mail) {
        s->size_param = 0;
        s->smtputf8 = 0;
    }
    rcpt_path_free(&path);
}

/* A recipient refused at RCPT after its lookup: reply (NULL when the
 * caller has sent "550 5.1.2 ...") and log it. */
static void lmtp_rcpt_refused(struct lmtp_session *s,
                              const struct rcpt_path *path, uint64_t t0,
                              const char *reply)
{
    char addr[300];

    if (reply)
        lmtp_reply(s, reply);
    log_sanitize(path->addr.s ? path->addr.s : "", path->addr.len, addr,
                 sizeof(addr));
    lmtp_log_rcpt(s, NULL, NULL, addr, NULL, 0, NULL,
                  reply ? reply : "550 5.1.2", 0, t0, -1);
}

/* The user id a personal recipient names: the local part up to a '+'
 * detail, downcased when lmtp_downcase_rcpt says so, with the domain
 * when virtual domains are on, canonicalized.  0 with it in *userid_r;
 * 1 for a shared mailbox's address (no local part before the '+');
 * -1 when it is no valid user id. */
static int lmtp_rcpt_userid(const struct lmtp_server *srv,
                            const struct rcpt_path *path,
                            struct buf *userid_r)
{
    struct buf raw = BUF_INITIALIZER;
    const char *local = path->local.s ? path->local.s : "";
    const char *err = NULL;
    size_t ulen = strcspn(local, "+"), i;
    int r;

    if (ulen == 0 || ulen > path->local.len)
        return 1;
    buf_setmap(&raw, local, ulen);
    if (srv->downcase)
        for (i = 0; i < raw.len; i++)
            if (raw.s[i] >= 'A' && raw.s[i] <= 'Z')
                raw.s[i] = (char)(raw.s[i] - 'A' + 'a');
    if (srv->policy.virtdomains != USERID_VIRTDOMAINS_OFF &&
        path->domain.len) {
        buf_putc(&raw, '@');
        buf_append(&raw, path->domain.s, path->domain.len);
    }
    r = userid_canon(&srv->policy, buf_cstring(&raw), NULL, userid_r,
                     &err) == STORE_OK ? 0 : -1;
    buf_free(&raw);
    return r;
}

/* A frontend's RCPT: the user id of the recipient, its record in the
 * directory, the backend the record names.  Returns the backend's index
 * with the user id in *userid_r, or -1 after replying (550 5.1.1 no such
 * user, 451 4.4.3 the directory does not answer, 451 4.3.0 a damaged
 * record or one naming a backend this frontend does not know, logged). */
static int lmtp_rcpt_proxy(struct lmtp_session *s,
                           const struct rcpt_path *path, uint64_t t0,
                           struct buf *userid_r)
{
    struct lmtp_server *srv = s->srv;
    const char *backend = NULL;
    int b = -1;
    char caddr[300];

    /* a shared mailbox's address or no valid user id: not here */
    if (lmtp_rcpt_userid(srv, path, userid_r) != 0) {
        lmtp_rcpt_refused(s, path, t0, R_UNKNOWN);
        return -1;
    }
    log_sanitize(path->addr.s ? path->addr.s : "", path->addr.len, caddr,
                 sizeof(caddr));
    switch (directory_lookup(srv->dir, buf_cstring(userid_r), &backend)) {
    case DIRECTORY_OK:
        b = lmtp_proxy_find(srv->px, backend);
        if (b >= 0)
            return b;
        log_error("lmtp: the directory names an unknown backend rcpt=<%s> "
                  "user=<%s> backend=<%s>", caddr, buf_cstring(userid_r),
                  backend);
        lmtp_rcpt_refused(s, path, t0, R_TEMPFAIL);
        return -1;
    case DIRECTORY_NOTFOUND:
        lmtp_rcpt_refused(s, path, t0, R_UNKNOWN);
        return -1;
    case DIRECTORY_BADRECORD:
        log_error("lmtp: damaged directory record rcpt=<%s> user=<%s> "
                  "record=<%s>", caddr, buf_cstring(userid_r), backend);
        lmtp_rcpt_refused(s, path, t0, R_TEMPFAIL);
        return -1;
    default:
        lmtp_rcpt_refused(s, path, t0, R_NODIRECTORY);
        return -1;
    }
}

/* A backend's RCPT for a user that a move is taking away, or that has
 * left (store/userstate.h): 451 4.2.1 and 1, never a 250 (a frontend
 * with a stale directory answer retries and then reaches the new
 * backend) nor a 550 (the user's mailboxes here may be gone already);
 * 0 for everybody else.  The user id is the recipient's, as
 * lmtp_rcpt_proxy() makes it. */
static int lmtp_rcpt_moved(struct lmtp_session *s,
                           const struct rcpt_path *path, uint64_t t0)
{
    struct lmtp_server *srv = s->srv;
    struct buf userid = BUF_INITIALIZER, where = BUF_INITIALIZER;
    enum userstate st = USERSTATE_HERE;

    if (lmtp_rcpt_userid(srv, path, &userid) == 0)
        st = userstate_get(srv->conf, buf_cstring(&userid), &where);
    if (st != USERSTATE_HERE) {
        log_info("lmtp: user is %s user=<%s> backend=<%s>",
                 userstate_name(st), buf_cstring(&userid),
                 buf_cstring(&where));
        lmtp_rcpt_refused(s, path, t0, st == USERSTATE_MOVED ? R_MOVED
                                                             : R_MOVING);
    }
    buf_free(&userid);
    buf_free(&where);
    return st != USERSTATE_HERE;
}

static void lmtp_cmd_rcpt(struct lmtp_session *s, const char *arg,
                          size_t len)
{
    struct rcpt_path path;
    struct buf mailbox = BUF_INITIALIZER;
    const char *err = NULL;
    size_t used = 0, i;
    enum rcpt_result res;
    uint64_t t0 = metrics_now_us();
    int backend = -1;

    if (!s->mail) {
        lmtp_reply(s, "503 5.5.1 Need MAIL command");
        return;
    }
    if (s->bdat) {
        lmtp_reply(s, "503 5.5.1 RCPT not allowed after BDAT");
        return;
    }
    if (!lmtp_prefix(arg, len, " TO:")) {
        lmtp_reply(s, "501 5.5.4 Syntax: RCPT TO:<address>");
        return;
    }
    arg += 4;
    len -= 4;
    rcpt_path_init(&path);
    if (rcpt_parse_path(arg, len, RCPT_UTF8, &path, &used, &err) != 0) {
        prot_printf(s->p, "501 5.5.4 Bad recipient address: %s\r\n", err);
        goto out;
    }
    if (!s->smtputf8 && lmtp_has_8bit(path.addr.s, path.addr.len)) {
        lmtp_reply(s, R_NEEDUTF8);
        goto out;
    }
    for (i = used; i < len && arg[i] == ' '; i++)
        ;
    if (used < len && arg[used] != ' ') {
        lmtp_reply(s, "501 5.5.4 Syntax: RCPT TO:<address>");
        goto out;
    }
    if (i < len) {
        lmtp_reply(s, "555 5.5.4 Unsupported parameter");
        goto out;
    }
    if (s->nrcpts >= s->srv->maxrcpts) {
        lmtp_reply(s, "452 4.5.3 Too many recipients");
        goto out;
    }
    if (s->srv->proxy) {
        backend = lmtp_rcpt_proxy(s, &path, t0, &mailbox);
        if (backend < 0)
            goto out;
    } else if (lmtp_server_dbs(s->srv) != STORE_OK) {
        lmtp_reply(s, R_TEMPFAIL);
        goto out;
    }
    res = s->srv->proxy ? RCPT_OK
                        : rcpt_resolve(s->srv->rctx, path.local.s,
                                       path.local.len, path.domain.s,
                                       path.domain.len, s->size_param,
                                       &mailbox, &err);
    switch (res) {
    case RCPT_OK:
        if (!s->srv->proxy && lmtp_rcpt_moved(s, &path, t0))
            goto out;
        break;
    case RCPT_UNKNOWN:
        if (lmtp_rcpt_moved(s, &path, t0))
            goto out;
        lmtp_rcpt_refused(s, &path, t0, R_UNKNOWN);
        goto out;
    case RCPT_BADDOMAIN:
        prot_printf(s->p, "550 5.1.2 Bad destination domain: %s\r\n",
                    err ? err : "not a valid domain");
        lmtp_rcpt_refused(s, &path, t0, NULL);
        goto out;
    case RCPT_NOPOST:
        lmtp_rcpt_refused(s, &path, t0, R_NOPOST);
        goto out;
    case RCPT_OVERQUOTA:
        metrics_count(METRICS_QUOTA_REFUSALS, 1);
        lmtp_rcpt_refused(s, &path, t0, s->srv->overquota_perm
                                            ? R_QUOTA_PERM : R_QUOTA_TEMP);
        goto out;
    default:
        lmtp_rcpt_refused(s, &path, t0, R_TEMPFAIL);
        goto out;
    }
    if (s->nrcpts == s->arcpts) {
        size_t na = s->arcpts ? s->arcpts * 2 : 8;
        struct lmtp_rcpt *nr = realloc(s->rcpts, na * sizeof(*nr));

        if (!nr) {
            lmtp_reply(s, R_TEMPFAIL);
            goto out;
        }
        s->rcpts = nr;
        s->arcpts = na;
    }
    s->rcpts[s->nrcpts].reply = NULL;
    s->rcpts[s->nrcpts].backend = backend;
    s->rcpts[s->nrcpts].mailbox = buf_release(&mailbox);
    s->rcpts[s->nrcpts].addr = strdup(buf_cstring(&path.addr));
    if (!s->rcpts[s->nrcpts].mailbox || !s->rcpts[s->nrcpts].addr) {
        free(s->rcpts[s->nrcpts].mailbox);
        free(s->rcpts[s->nrcpts].addr);
        lmtp_reply(s, R_TEMPFAIL);
        goto out;
    }
    s->rcpts[s->nrcpts++].rcpt_us = t0;
    lmtp_reply(s, "250 2.1.5 Ok");
out:
    buf_free(&mailbox);
    rcpt_path_free(&path);
}

static void lmtp_cmd_data(struct lmtp_session *s, size_t len)
{
    enum prot_eol eol;
    int after_crlf = 1;   /* the line follows a real CRLF (or the 354) */
    int unstuff, nomem = 0, r;

    if (len > 0) {
        lmtp_reply(s, "501 5.5.4 Syntax: DATA");
        return;
    }
    if (!s->mail) {
        lmtp_reply(s, "503 5.5.1 Need MAIL command");
        return;
    }
    if (s->bdat) {
        lmtp_reply(s, "503 5.5.1 DATA not allowed after BDAT");
        return;
    }
    if (s->nrcpts == 0) {
        lmtp_reply(s, "503 5.5.1 No valid recipients");
        return;
    }
    if ((r = lmtp_msg_begin(s)) != STORE_OK) {
        lmtp_reply(s, lmtp_store_reply(s->srv, r));
        return;
    }
    s->msg.dotguard = 1;
    lmtp_reply(s, "354 Go ahead, end with <CRLF>.<CRLF>");
    if (prot_flush(s->p) != PROT_OK) {
        s->quit = 1;
        return;
    }
    for (;;) {
        const char *d;
        size_t n, content;   /* n: with the line end; content: without */

        /* the usual line is whole in the stream's buffer: used in place,
         * with its line end (no copy, nothing appended) */
        if (prot_getline_view(s->p, LMTP_LINE_MAX, &d, &n, &eol)) {
            content = n - (eol == PROT_EOL_CRLF ? 2 : 1);
        } else {
            r = prot_getline(s->p, &s->line, LMTP_LINE_MAX, &eol);
            if (r == PROT_TOOLONG) {
                lmtp_msg_fail(&s->msg, MSG_LONGLINE, 0);
                after_crlf = eol == PROT_EOL_CRLF;
                continue;
            }
            if (r != PROT_OK) {
                log_info("lmtp: message not received peer=<%s> sender=<%s> "
                         "size=<%llu>", s->conn->peer,
                         s->sender.s ? s->sender.s : "",
                         (unsigned long long)s->msg.size);
                lmtp_txn_reset(s);
                lmtp_read_failed(s, r);
                return;
            }
            content = s->line.len;
            /* the line end goes through the filter with the line */
            nomem = buf_append(&s->line, eol == PROT_EOL_LF ? "\n" : "\r\n",
                               eol == PROT_EOL_LF ? 1 : 2) != 0;
            d = s->line.s;
            n = s->line.len;
        }
        /* only <CRLF>.<CRLF> ends the message (RFC 5321 4.1.1.4) */
        if (after_crlf && eol == PROT_EOL_CRLF && content == 1 && d[0] == '.')
            break;
        /* a dot opening a line after a real CRLF is dot-stuffing; a lone
         * "." with a bare LF before or after it is left to the filter */
        unstuff = after_crlf && content > 1 && d[0] == '.';
        after_crlf = eol == PROT_EOL_CRLF;
        if (nomem) {
            nomem = 0;
            lmtp_msg_fail(&s->msg, MSG_STORE, STORE_NOMEM);
            continue;
        }
        if (unstuff) {
            d++;
            n--;
        }
        lmtp_msg_feed(s, d, n);
    }
    lmtp_msg_finish(s);
}

static void lmtp_cmd_bdat(struct lmtp_session *s, const char *arg,
                          size_t len)
{
    struct buf chunk = BUF_INITIALIZER;
    uint64_t size, left;
    size_t n;
    int last = 0, r, accept;
    const char *reply = NULL;

    while (len > 0 && *arg == ' ') {
        arg++;
        len--;
    }
    n = 0;
    while (n < len && arg[n] != ' ')
        n++;
    if (lmtp_parse_size(arg, n, &size) != 0 || size > INT64_MAX) {
        lmtp_reply(s, "501 5.5.4 Syntax: BDAT size [LAST]");
        return;
    }
    arg += n;
    len -= n;
    while (len > 0 && *arg == ' ') {
        arg++;
        len--;
    }
    if (len == 4 && strncasecmp(arg, "LAST", 4) == 0) {
        last = 1;
    } else if (len > 0) {
        lmtp_reply(s, "501 5.5.4 Syntax: BDAT size [LAST]");
        return;
    }

    accept = 1;
    if (!s->mail) {
        reply = "503 5.5.1 Need MAIL command";
        accept = 0;
    } else if (s->nrcpts == 0) {
        reply = "503 5.5.1 No valid recipients";
        accept = 0;
    } else if (!s->bdat) {
        s->bdat = 1;
        r = lmtp_msg_begin(s);
        if (r != STORE_OK) {
            /* the message is lost: this and later chunks are read and
             * thrown away, LAST answers the error for every recipient */
            lmtp_msg_fail(&s->msg, MSG_STORE, r);
        }
    }
    if (last)
        prot_flush(s->p);   /* the delivery below blocks */

    /* read the chunk (always: the client sends it whatever we answer) */
    left = size;
    while (left > 0) {
        size_t want = left > LMTP_OUT_CHUNK ? LMTP_OUT_CHUNK : (size_t)left;

        buf_reset(&chunk);
        r = prot_read_some(s->p, &chunk, want, &n);
        if (r != PROT_OK) {
            buf_free(&chunk);
            if (s->bdat)
                log_info("lmtp: message not received peer=<%s> size=<%llu>",
                         s->conn->peer, (unsigned long long)s->msg.size);
            lmtp_txn_reset(s);
            lmtp_read_failed(s, r);
            return;
        }
        if (n > want)
            n = want;
        if (accept)
            lmtp_msg_feed(s, chunk.s, n);
        left -= n;
    }
    buf_free(&chunk);

    if (!accept) {
        lmtp_reply(s, reply);
        return;
    }
    if (last) {
        lmtp_msg_finish(s);
        return;
    }
    if (s->msg.err == MSG_TOOBIG || s->msg.err == MSG_STORE)
        lmtp_reply(s, lmtp_msg_reply(s->srv, &s->msg));
    else
        prot_printf(s->p, "250 2.0.0 %llu octets received\r\n",
                    (unsigned long long)size);
}

static void lmtp_sasl_reset(struct lmtp_session *s)
{
    saslserver_free(&s->sasl);
    if (s->srv->sasl_ok)
        s->sasl = saslserver_new("lmtp", s->conn->localaddr,
                                 s->conn->remoteaddr, prot_tls_ssf(s->p));
}

static void lmtp_cmd_auth(struct lmtp_session *s, const char *arg,
                          size_t len)
{
    struct buf chal = BUF_INITIALIZER, mech = BUF_INITIALIZER,
               init = BUF_INITIALIZER;
    char cmech[64];
    size_t n;
    int r;

    if (!s->sasl) {
        lmtp_reply(s, "502 5.5.1 AUTH not available");
        return;
    }
    if (!s->lhlo) {
        lmtp_reply(s, "503 5.5.1 Send LHLO first");
        return;
    }
    if (s->authuser) {
        lmtp_reply(s, "503 5.5.1 Already authenticated");
        return;
    }
    if (s->mail) {
        lmtp_reply(s, "503 5.5.1 AUTH not allowed in a mail transaction");
        return;
    }
    while (len > 0 && *arg == ' ') {
        arg++;
        len--;
    }
    n = 0;
    while (n < len && arg[n] != ' ')
        n++;
    if (n == 0 || n > 40) {
        lmtp_reply(s, "501 5.5.4 Syntax: AUTH mechanism [initial-response]");
        return;
    }
    buf_setmap(&mech, arg, n);
    arg += n;
    len -= n;
    while (len > 0 && *arg == ' ') {
        arg++;
        len--;
    }
    if (len > 0)
        buf_setmap(&init, arg, len);
    r = saslserver_start(s->sasl, buf_cstring(&mech),
                         len > 0 ? buf_cstring(&init) : NULL, &chal);
    while (r == SASLSERVER_CONTINUE) {
        int gr;

        prot_printf(s->p, "334 %s\r\n", buf_cstring(&chal));
        if (prot_flush(s->p) != PROT_OK) {
            s->quit = 1;
            goto out;
        }
        gr = prot_getline(s->p, &s->line, LMTP_AUTH_LINE_MAX, NULL);
        if (gr == PROT_TOOLONG) {
            lmtp_reply(s, "500 5.5.6 Authentication exchange line is too "
                          "long");
            lmtp_sasl_reset(s);
            goto out;
        }
        if (gr != PROT_OK) {
            lmtp_read_failed(s, gr);
            goto out;
        }
        if (memchr(buf_cstring(&s->line), '\0', s->line.len)) {
            r = SASLSERVER_BADB64;
            break;
        }
        r = saslserver_step(s->sasl, buf_cstring(&s->line), &chal);
    }
    lmtp_clean(mech.s, mech.len, cmech, sizeof(cmech));
    if (r == SASLSERVER_DONE && saslserver_user(s->sasl)) {
        s->authuser = strdup(saslserver_user(s->sasl));
        if (!s->authuser) {
            lmtp_reply(s, "454 4.7.0 Temporary authentication failure");
            lmtp_sasl_reset(s);
            goto out;
        }
        log_info("lmtp: authenticated user=<%s> mech=<%s> peer=<%s>",
                 s->authuser, cmech, s->conn->peer);
        lmtp_reply(s, "235 2.7.0 Authentication successful");
        goto out;
    }
    switch (r) {
    case SASLSERVER_FAIL:
        lmtp_reply(s, "535 5.7.8 Authentication credentials invalid");
        break;
    case SASLSERVER_NOMECH:
        lmtp_reply(s, "504 5.5.4 Unrecognized authentication type");
        break;
    case SASLSERVER_BADB64:
        lmtp_reply(s, "501 5.5.2 Cannot decode response");
        break;
    case SASLSERVER_CANCEL:
        lmtp_reply(s, "501 5.0.0 Authentication cancelled");
        break;
    default:
        lmtp_reply(s, "454 4.7.0 Temporary authentication failure");
        break;
    }
    log_info("lmtp: authentication failed mech=<%s> peer=<%s> error=<%s>",
             cmech, s->conn->peer,
             saslserver_error(s->sasl) ? saslserver_error(s->sasl) : "");
    lmtp_sasl_reset(s);
out:
    buf_free(&chal);
    buf_free(&mech);
    buf_free(&init);
}

static void lmtp_cmd_starttls(struct lmtp_session *s, size_t len)
{
    size_t discarded = 0;
    int r;

    if (len > 0) {
        lmtp_reply(s, "501 5.5.4 Syntax: STARTTLS");
        return;
    }
    if (!s->srv->tls) {
        lmtp_reply(s, "502 5.5.1 STARTTLS not available");
        return;
    }
    if (prot_is_tls(s->p)) {
        lmtp_reply(s, "503 5.5.1 TLS already active");
        return;
    }
    lmtp_reply(s, "220 2.0.0 Ready to start TLS");
    r = prot_starttls(s->p, s->srv->tls, &discarded);
    if (r != PROT_OK) {
        log_info("lmtp: TLS handshake failed peer=<%s> error=<%s>",
                 s->conn->peer, prot_error(s->p));
        s->quit = 1;
        return;
    }
    if (discarded)
        log_warning("lmtp: bytes sent before the TLS handshake discarded "
                    "peer=<%s> bytes=<%lu>", s->conn->peer,
                    (unsigned long)discarded);
    /* RFC 3207 4.2: forget everything learnt before the handshake */
    lmtp_txn_reset(s);
    buf_free(&s->helo);
    s->lhlo = 0;
    free(s->authuser);
    s->authuser = NULL;
    lmtp_sasl_reset(s);
}

/* One command line. */
static void lmtp_command(struct lmtp_session *s)
{
    const char *line = s->line.s ? s->line.s : "";
    size_t len = s->line.len, vlen = 0;
    const char *arg;
    size_t alen;

    if (len == 0) {
        lmtp_reply(s, "500 5.5.2 Empty command");
        return;
    }
    if (memchr(line, '\0', len)) {
        lmtp_reply(s, "500 5.5.2 NUL byte in command");
        return;
    }
    while (vlen < len && line[vlen] != ' ')
        vlen++;
    arg = line + vlen;
    alen = len - vlen;

#define VERB(w) (vlen == sizeof(w) - 1 && strncasecmp(line, w, vlen) == 0)
    if (VERB("LHLO")) {
        lmtp_cmd_lhlo(s, arg, alen);
    } else if (VERB("MAIL")) {
        lmtp_cmd_mail(s, arg, alen);
    } else if (VERB("RCPT")) {
        lmtp_cmd_rcpt(s, arg, alen);
    } else if (VERB("DATA")) {
        lmtp_cmd_data(s, alen);
    } else if (VERB("BDAT")) {
        lmtp_cmd_bdat(s, arg, alen);
    } else if (VERB("RSET")) {
        lmtp_txn_reset(s);
        lmtp_reply(s, "250 2.0.0 Ok");
    } else if (VERB("NOOP")) {
        lmtp_reply(s, "250 2.0.0 Ok");
    } else if (VERB("QUIT")) {
        prot_printf(s->p, "221 2.0.0 %s closing connection\r\n",
                    s->srv->servername);
        s->quit = 1;
    } else if (VERB("VRFY")) {
        if (alen == 0)
            lmtp_reply(s, "501 5.5.4 Syntax: VRFY address");
        else
            lmtp_reply(s, "252 2.5.0 Cannot VRFY user, but will accept "
                          "message and attempt delivery");
    } else if (VERB("HELP")) {
        lmtp_reply(s, "214 2.0.0 Commands: LHLO MAIL RCPT DATA BDAT RSET "
                      "NOOP QUIT VRFY HELP STARTTLS AUTH");
    } else if (VERB("STARTTLS")) {
        lmtp_cmd_starttls(s, alen);
    } else if (VERB("AUTH")) {
        lmtp_cmd_auth(s, arg, alen);
    } else if (VERB("HELO") || VERB("EHLO")) {
        lmtp_reply(s, "500 5.5.1 This is LMTP: use LHLO");
    } else {
        lmtp_reply(s, "500 5.5.2 Unknown command");
    }
#undef VERB
}

/* A new session: the greeting is queued (sent by the first flush). */
static struct lmtp_session *lmtp_session_alloc(struct lmtp_server *srv,
                                               struct prot *p,
                                               const struct lmtp_conn *conn)
{
    struct lmtp_session *s = calloc(1, sizeof(*s));

    if (!s) {
        log_error("lmtp: out of memory peer=<%s>", conn->peer);
        return NULL;
    }
    s->srv = srv;
    s->p = p;
    s->conn = conn;
    prot_settimeout(p, srv->timeout);
    lmtp_sasl_reset(s);
    log_debug("lmtp: connection peer=<%s>", conn->peer);
    prot_printf(p, "220 %s LMTP cyrusdeliver ready\r\n", srv->servername);
    return s;
}

/* Serve commands until the session ends (LMTP_SESSION_DONE) or, with
 * nowait, until no whole command line is buffered any more
 * (LMTP_SESSION_IDLE, replies flushed).  Pipelined commands already
 * buffered are served before returning, their replies sent together. */
static int lmtp_session_loop(struct lmtp_session *s, int nowait)
{
    struct prot *p = s->p;
    enum prot_eol eol;
    int r;

    while (!s->quit) {
        if (nowait && !prot_line_ready(p))
            return prot_flush(p) == PROT_OK ? LMTP_SESSION_IDLE
                                            : LMTP_SESSION_DONE;
        if (!prot_pending(p) && prot_flush(p) != PROT_OK)
            return LMTP_SESSION_DONE;
        /* between commands nothing is half-stored: a transaction in
         * progress gets 421 and the client's MTA tries again later */
        if (service_stopping()) {
            prot_printf(p, "421 4.3.2 %s Service shutting down\r\n",
                        s->srv->servername);
            break;
        }
        /* an idle client does not hold up a shutdown (SIGTERM from the
         * master): the wait for the next command gives way to it */
        prot_set_interrupt(p, service_stopping);
        r = prot_getline(p, &s->line, LMTP_CMD_MAX, &eol);
        prot_set_interrupt(p, NULL);
        if (r == PROT_INTERRUPTED) {
            prot_printf(p, "421 4.3.2 %s Service shutting down\r\n",
                        s->srv->servername);
            break;
        }
        if (r == PROT_TOOLONG) {
            lmtp_reply(s, "500 5.5.2 Line too long");
            continue;
        }
        if (r != PROT_OK) {
            lmtp_read_failed(s, r);
            break;
        }
        if (eol == PROT_EOL_LF && !s->srv->bare_fix) {
            /* RFC 5321 2.3.8: a command ends with CRLF.  One that does
             * not is not run: a client and a server that split lines
             * differently must not disagree about what was sent */
            lmtp_reply(s, "500 5.5.2 Command line must end with CRLF");
            continue;
        }
        lmtp_command(s);
    }
    prot_flush(p);
    return LMTP_SESSION_DONE;
}

int lmtp_session_new(struct lmtp_server *srv, struct prot *p,
                     const struct lmtp_conn *conn, struct lmtp_session **s_r)
{
    *s_r = lmtp_session_alloc(srv, p, conn);
    if (!*s_r)
        return -1;
    if (prot_flush(p) != PROT_OK) {
        lmtp_session_free(s_r);
        return -1;
    }
    return 0;
}

int lmtp_session_input(struct lmtp_session *s)
{
    return lmtp_session_loop(s, 1);
}

int lmtp_session_in_transaction(const struct lmtp_session *s)
{
    return s->mail;
}

void lmtp_session_end(struct lmtp_session **sp, enum lmtp_session_end why)
{
    struct lmtp_session *s = *sp;

    if (!s)
        return;
    switch (why) {
    case LMTP_END_TIMEOUT:
        lmtp_timeout_close(s);
        break;
    case LMTP_END_IDLE:
        prot_printf(s->p, "421 4.4.2 %s Idle too long, closing "
                    "connection\r\n", s->srv->servername);
        prot_flush(s->p);
        log_info("lmtp: idle connection closed to make room peer=<%s>",
                 s->conn->peer);
        break;
    case LMTP_END_STOP:
        prot_printf(s->p, "421 4.3.2 %s Service shutting down\r\n",
                    s->srv->servername);
        prot_flush(s->p);
        break;
    }
    lmtp_session_free(sp);
}

void lmtp_session_free(struct lmtp_session **sp)
{
    struct lmtp_session *s = *sp;

    if (!s)
        return;
    lmtp_txn_reset(s);
    buf_free(&s->msg.out);
    buf_free(&s->msg.hdr);
    buf_free(&s->line);
    buf_free(&s->helo);
    free(s->authuser);
    saslserver_free(&s->sasl);
    free(s);
    *sp = NULL;
}

void lmtp_serve(struct lmtp_server *srv, struct prot *p,
                const struct lmtp_conn *conn)
{
    struct lmtp_session *s = lmtp_session_alloc(srv, p, conn);

    if (!s)
        return;
    (void)lmtp_session_loop(s, 0);
    lmtp_session_free(&s);
}
