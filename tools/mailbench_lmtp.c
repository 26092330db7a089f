/*
 * mailbench_lmtp.c - the LMTP part of mailbench: the client state machine
 * of one connection, the message bytes, the accounting of what each
 * mailbox must hold afterwards, and `--verify cmd:PROGRAM`.
 *
 * A connection: greeting (220), LHLO (multi-line 250 reply: PIPELINING,
 * STARTTLS are noted), optionally STARTTLS and LHLO again, then messages
 * one after the other without RSET: MAIL, the RCPTs and DATA, in one write
 * when the server offers PIPELINING (else one at a time), then the message
 * after the 354, then one reply per accepted recipient (RFC 2033).  A
 * transaction that did not reach the data is closed with RSET.  With -k
 * each connection carries one message and QUITs.
 *
 * Message-IDs are <IDX.SEED.RUNID.mailbench@HOST>: RUNID (8 hex digits
 * from the clock and the pid) keeps two runs with the same seed from
 * looking like duplicates to a server that suppresses them.
 *
 * The message bytes: the body is generated once (printable 76-character
 * lines, none starting with "."), followed by ".\r\n"; a message is a
 * small header (Date, From, To, Subject, Message-ID) built per message
 * from templates whose index digits are patched in place, followed by the
 * tail of the shared body such that header + body is exactly -s bytes.
 * The body is never copied: it is the external segment of the
 * connection's output (writev).
 *
 * Accounting: message i goes to users (i*R + j) mod M.  A repeated
 * Message-ID (--dup) copies an earlier message that every recipient
 * accepted (its recipients and its Message-ID), so that a server that
 * suppresses duplicates must store nothing new; with --dedup yes such a
 * copy adds no expected message.  Every 2xx per-recipient reply adds one
 * expected message to that user (run->expect_add); the IMAP part
 * subtracts what it expunged (run->expunged); verification compares
 * baseline + expected with the count after the run.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/mailbench.h"

enum {
    L_GREETING = 1, L_LHLO, L_STARTTLS, L_TLS, L_TRANS, L_BODY, L_RSET,
    L_QUIT
};

#define MB_LINE 78      /* 76 characters and CR LF */

char *mailbench_user_name(const struct mb_run *run, unsigned long idx)
{
    char tmp[512];

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    /* the format was checked: exactly one integer conversion */
    if (strstr(run->opt.user_fmt, "%l"))
        snprintf(tmp, sizeof(tmp), run->opt.user_fmt, (long)(idx + 1));
    else
        snprintf(tmp, sizeof(tmp), run->opt.user_fmt, (int)(idx + 1));
#pragma GCC diagnostic pop
    return mailbench_strdup(tmp);
}

/* Write v as exactly `width` decimal digits at p. */
static void mailbench_lmtp_digits(char *p, unsigned long v, int width)
{
    for (int i = width - 1; i >= 0; i--) {
        p[i] = (char)('0' + v % 10);
        v /= 10;
    }
}

static unsigned long mailbench_lmtp_rcpt(const struct mb_run *run,
                                         unsigned long src, unsigned j)
{
    unsigned long long x = (unsigned long long)src * run->opt.rcpts + j;

    return (unsigned long)(x % run->nusers);
}

/* The To: header of a message from src: every recipient, one per line. */
static void mailbench_lmtp_to(struct mb_conn *c, unsigned long src)
{
    struct mb_run *run = c->run;

    for (unsigned j = 0; j < run->opt.rcpts; j++) {
        unsigned long u = mailbench_lmtp_rcpt(run, src, j);

        mailbench_conn_printf(c, "%s<%s@%s>", j ? ",\r\n " : "To: ",
                              run->user_names[u], run->opt.domain);
    }
    mailbench_conn_write(c, "\r\n", 2);
}

int mailbench_lmtp_init(struct mb_run *run)
{
    struct mb_lmtp *l = &run->lmtp;
    unsigned long m = run->opt.mailboxes;
    struct buf b = BUF_INITIALIZER;
    char date[64];
    time_t t = time(NULL);
    struct tm tm;
    size_t longest = 0;

    run->nusers = m;
    run->user_names = mailbench_malloc(m * sizeof(char *));
    for (unsigned long u = 0; u < m; u++) {
        run->user_names[u] = mailbench_user_name(run, u);
        if (strlen(run->user_names[u]) > longest)
            longest = strlen(run->user_names[u]);
    }
    run->expect_add = calloc(m, sizeof(uint32_t));
    run->expunged = calloc(m, sizeof(uint32_t));
    run->verify.baseline = calloc(m, sizeof(uint32_t));
    run->verify.found = calloc(m, sizeof(uint32_t));
    run->verify.known = calloc(m, sizeof(int));
    if (run->opt.dup_pct > 0)
        l->sources = calloc(run->opt.msgs, sizeof(unsigned long));
    if (!run->expect_add || !run->expunged || !run->verify.baseline
        || !run->verify.found || !run->verify.known
        || (run->opt.dup_pct > 0 && !l->sources))
        mailbench_oom();

    /* a run's Message-IDs are its own: a second run with the same seed
     * must not be taken for duplicates of the first by the server */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned runid = (unsigned)(ts.tv_sec * 1000003u + ts.tv_nsec / 1000)
        ^ ((unsigned)getpid() << 16);

    /* header templates */
    gmtime_r(&t, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S +0000", &tm);
    if (buf_printf(&b, "Date: %s\r\nFrom: <%s>\r\n", date, run->opt.from) < 0)
        mailbench_oom();
    l->head_pre_len = b.len;
    l->head_pre = buf_release(&b);
    for (int p = 0; p < 2; p++) {
        buf_reset(&b);
        if (buf_printf(&b, "Subject:%s mailbench message ", p ? "  " : " ") < 0)
            mailbench_oom();
        l->post_subject_off[p] = b.len;
        if (buf_printf(&b, "0000000000\r\nMessage-ID: <") < 0)
            mailbench_oom();
        l->post_msgid_off[p] = b.len;
        if (buf_printf(&b, "0000000000.%llu.%08x.mailbench@%s>\r\n\r\n",
                       (unsigned long long)run->opt.seed, runid,
                       run->hostname) < 0)
            mailbench_oom();
        l->head_post_len[p] = b.len;
        l->head_post[p] = buf_release(&b);
    }

    /* the largest header must leave room for a body line end */
    size_t to_len = 5 + run->opt.rcpts * (longest + strlen(run->opt.domain)
                                          + 6);
    size_t head_max = l->head_pre_len + to_len + l->head_post_len[1];
    if (run->opt.size < head_max + 2) {
        mailbench_fatal(run, 2, "-s %lu is too small: the headers alone take "
                        "up to %zu bytes", run->opt.size, head_max);
        return -1;
    }

    /* the body: whole lines, at least -s bytes, then ".\r\n" */
    size_t lines = run->opt.size / MB_LINE + 2;
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    l->body_len = lines * MB_LINE;
    l->body = mailbench_malloc(l->body_len + 3);
    for (size_t i = 0; i < lines; i++) {
        char *line = l->body + i * MB_LINE;

        for (int k = 0; k < MB_LINE - 2; k++)
            line[k] = alphabet[(i + (size_t)k) % (sizeof(alphabet) - 1)];
        line[MB_LINE - 2] = '\r';
        line[MB_LINE - 1] = '\n';
    }
    memcpy(l->body + l->body_len, ".\r\n", 3);
    return 0;
}

void mailbench_lmtp_free(struct mb_run *run)
{
    struct mb_lmtp *l = &run->lmtp;

    for (unsigned long u = 0; run->user_names && u < run->nusers; u++)
        free(run->user_names[u]);
    free(run->user_names);
    free(run->expect_add);
    free(run->expunged);
    free(run->verify.baseline);
    free(run->verify.found);
    free(run->verify.known);
    free(l->sources);
    free(l->head_pre);
    free(l->head_post[0]);
    free(l->head_post[1]);
    free(l->body);
}

/* ---- the state machine ---------------------------------------------------- */

static void mailbench_lmtp_next(struct mb_conn *c);

static void mailbench_lmtp_send_lhlo(struct mb_conn *c)
{
    c->pipelining = 0;
    c->cap_starttls = 0;
    c->t_cmd = c->run->now;
    mailbench_conn_printf(c, "LHLO %s\r\n", c->run->opt.lhlo);
    c->state = L_LHLO;
}

static void mailbench_lmtp_connected(struct mb_conn *c)
{
    c->state = L_GREETING;
}

static void mailbench_lmtp_tls_ready(struct mb_conn *c)
{
    mailbench_lmtp_send_lhlo(c);
}

static void mailbench_lmtp_sent(struct mb_conn *c)
{
    if (c->state == L_BODY && c->msg.data_stage == 1) {
        c->msg.t_data_end = c->run->now;
        c->msg.data_stage = 2;
    }
}

static void mailbench_lmtp_quit(struct mb_conn *c)
{
    mailbench_conn_write(c, "QUIT\r\n", 6);
    c->state = L_QUIT;
}

/* Account for every recipient of the message on c (a code < 0: a failure
 * already counted by kind); 1 when every recipient accepted it. */
static int mailbench_lmtp_account(struct mb_conn *c)
{
    struct mb_run *run = c->run;
    struct mb_lmtp *l = &run->lmtp;
    struct mb_lmtp_msg *m = &c->msg;
    int all_ok = 1;

    for (unsigned j = 0; j < run->opt.rcpts; j++) {
        int code = m->code[j];

        if (code >= 200 && code < 300) {
            unsigned long u = mailbench_lmtp_rcpt(run, m->src, j);

            l->delivered_rcpts++;
            if (!(m->dup && run->opt.dedup))
                run->expect_add[u]++;
        } else {
            all_ok = 0;
            if (code >= 0)
                mailbench_error_code(run, code);
        }
    }
    if (all_ok) {
        double lat = run->now - m->t_mail;

        l->delivered_msgs++;
        mailbench_sample_add(&run->lat[MB_LAT_DELIVERY], lat);
        mailbench_series_add(&run->lmtp_series, run->now - run->t_run_start,
                             lat);
        if (m->dup)
            l->dups_delivered++;
        else if (l->sources)
            l->sources[l->nsources++] = m->src;
    } else {
        l->failed_msgs++;
    }
    m->active = 0;
    l->done++;
    c->served++;
    if (l->done == run->opt.msgs)
        l->t_end = run->now;
    return all_ok;
}

/* The message on c is over: account, then RSET or the next message. */
static void mailbench_lmtp_finish(struct mb_conn *c, int rset)
{
    mailbench_lmtp_account(c);
    if (rset) {
        mailbench_conn_write(c, "RSET\r\n", 6);
        c->state = L_RSET;
    } else {
        mailbench_lmtp_next(c);
    }
}

static void mailbench_lmtp_send_rcpt(struct mb_conn *c, unsigned j)
{
    struct mb_run *run = c->run;
    unsigned long u = mailbench_lmtp_rcpt(run, c->msg.src, j);

    mailbench_conn_printf(c, "RCPT TO:<%s@%s>\r\n", run->user_names[u],
                          run->opt.domain);
}

/* Start the next message, or QUIT when there is none (or with -k). */
static void mailbench_lmtp_next(struct mb_conn *c)
{
    struct mb_run *run = c->run;
    struct mb_lmtp *l = &run->lmtp;
    struct mb_lmtp_msg *m = &c->msg;

    if (l->next_msg >= run->opt.msgs
        || (run->opt.one_per_conn && c->served > 0)) {
        if (c->paced) {
            c->paced = 0;
            l->paced--;
        }
        mailbench_lmtp_quit(c);
        return;
    }
    /* --lmtp-rate: message k is due at t_start + k / rate; a connection
     * ahead of the schedule waits (mailbench_lmtp_pump starts it) */
    if (run->opt.lmtp_rate > 0
        && run->now < l->t_start + (double)l->next_msg / run->opt.lmtp_rate) {
        if (!c->paced) {
            c->paced = 1;
            l->paced++;
        }
        return;
    }
    if (c->paced) {
        c->paced = 0;
        l->paced--;
    }
    m->active = 1;
    m->idx = l->next_msg++;
    m->src = m->idx;
    m->dup = 0;
    if (run->opt.dup_pct > 0 && l->nsources > 0
        && (double)(mailbench_random(run) % 1000000) < run->opt.dup_pct * 1e4) {
        m->src = l->sources[mailbench_random(run) % l->nsources];
        m->dup = 1;
        l->dups_sent++;
    }
    m->replies = m->accepted = m->body_replies = 0;
    m->mail_code = 0;
    m->data_stage = 0;
    m->next_rcpt = 0;
    memset(m->code, 0, run->opt.rcpts * sizeof(int));
    m->t_mail = m->t_cmd = run->now;
    if (run->opt.from_each)   /* a sender of its own (vacation's memory) */
        mailbench_conn_printf(c, "MAIL FROM:<m%lu.%s>\r\n", m->src,
                              run->opt.from);
    else
        mailbench_conn_printf(c, "MAIL FROM:<%s>\r\n", run->opt.from);
    if (c->pipelining) {
        for (unsigned j = 0; j < run->opt.rcpts; j++)
            mailbench_lmtp_send_rcpt(c, j);
        mailbench_conn_write(c, "DATA\r\n", 6);
    }
    c->state = L_TRANS;
}

/* After the 354: the header of this message and the shared body. */
static void mailbench_lmtp_send_message(struct mb_conn *c)
{
    struct mb_run *run = c->run;
    struct mb_lmtp *l = &run->lmtp;
    struct mb_lmtp_msg *m = &c->msg;
    size_t start = c->out.len;
    int p = 0;

    mailbench_conn_write(c, l->head_pre, l->head_pre_len);
    mailbench_lmtp_to(c, m->src);
    size_t head = c->out.len - start + l->head_post_len[0];
    size_t body = run->opt.size - head;
    size_t off = l->body_len - body;
    if (l->body[off] == '\n') {
        /* the body would start with a bare LF: one more header byte */
        p = 1;
        off++;
        body--;
    }
    size_t post = c->out.len;
    mailbench_conn_write(c, l->head_post[p], l->head_post_len[p]);
    mailbench_lmtp_digits(c->out.s + post + l->post_subject_off[p], m->idx,
                          10);
    mailbench_lmtp_digits(c->out.s + post + l->post_msgid_off[p], m->src, 10);
    mailbench_conn_write_ext(c, l->body + off, body + 3);
    m->data_stage = 1;
    m->t_data_end = run->now;
    c->state = L_BODY;
}

/* One reply in a transaction: MAIL, RCPT j, DATA, in the order sent. */
static void mailbench_lmtp_trans_reply(struct mb_conn *c, int code)
{
    struct mb_run *run = c->run;
    struct mb_lmtp_msg *m = &c->msg;
    unsigned r = run->opt.rcpts;
    unsigned i = m->replies++;
    int ok = code >= 200 && code < 300;

    if (i == 0) {
        mailbench_sample_add(&run->lat[MB_LAT_MAIL], run->now - m->t_mail);
        m->mail_code = code;
        if (!c->pipelining) {
            if (!ok) {
                for (unsigned j = 0; j < r; j++)
                    m->code[j] = code;
                mailbench_lmtp_finish(c, 1);
                return;
            }
            m->t_cmd = run->now;
            mailbench_lmtp_send_rcpt(c, 0);
        }
        return;
    }
    if (i <= r) {
        unsigned j = i - 1;
        int mail_ok = m->mail_code >= 200 && m->mail_code < 300;

        mailbench_sample_add(&run->lat[MB_LAT_RCPT], run->now - m->t_cmd);
        if (!mail_ok)
            m->code[j] = m->mail_code;
        else if (ok)
            m->accepted++;
        else
            m->code[j] = code;
        if (!c->pipelining) {
            m->t_cmd = run->now;
            if (j + 1 < r) {
                mailbench_lmtp_send_rcpt(c, j + 1);
            } else if (m->accepted > 0) {
                mailbench_conn_write(c, "DATA\r\n", 6);
            } else {
                mailbench_lmtp_finish(c, 1);
            }
        }
        return;
    }
    /* DATA */
    if (code == 354 && m->accepted > 0) {
        mailbench_lmtp_send_message(c);
        return;
    }
    if (code == 354) {
        mailbench_conn_fail(c, MB_ERR_PROTOCOL,
                            "354 to DATA without an accepted recipient");
        return;
    }
    for (unsigned j = 0; j < r; j++)
        if (m->code[j] == 0)
            m->code[j] = code;
    mailbench_lmtp_finish(c, 1);
}

/* One per-recipient reply after the data. */
static void mailbench_lmtp_body_reply(struct mb_conn *c, int code)
{
    struct mb_run *run = c->run;
    struct mb_lmtp_msg *m = &c->msg;

    while (m->next_rcpt < run->opt.rcpts && m->code[m->next_rcpt] != 0)
        m->next_rcpt++;
    if (m->next_rcpt >= run->opt.rcpts) {
        mailbench_conn_fail(c, MB_ERR_PROTOCOL,
                            "more replies after the data than recipients");
        return;
    }
    m->code[m->next_rcpt++] = code;
    if (++m->body_replies < m->accepted)
        return;
    mailbench_sample_add(&run->lat[MB_LAT_DATA], run->now - m->t_data_end);
    mailbench_lmtp_finish(c, 0);
}

static void mailbench_lmtp_ready(struct mb_conn *c)
{
    struct mb_run *run = c->run;

    c->ready = 1;
    c->target->ever_ready = 1;
    c->target->failures_in_row = 0;
    run->lmtp.connecting--;
    mailbench_lmtp_next(c);
}

/* Stop: a setup error when the target never worked, else count and close. */
static void mailbench_lmtp_refused(struct mb_conn *c, const char *what,
                                   const char *line, size_t len)
{
    char text[200], why[320];

    mailbench_printable(line, len, text, sizeof(text));
    snprintf(why, sizeof(why), "%s: %s", what, text);
    if (!c->target->ever_ready)
        mailbench_fatal(c->run, MB_EXIT_SETUP, "LMTP target %s: %s",
                        c->target->spec, why);
    mailbench_conn_fail(c, MB_ERR_PROTOCOL, why);
}

static void mailbench_lmtp_reply(struct mb_conn *c, int code,
                                 const char *line, size_t len)
{
    struct mb_run *run = c->run;

    switch (c->state) {
    case L_GREETING:
        if (code != 220) {
            mailbench_lmtp_refused(c, "greeting", line, len);
            return;
        }
        mailbench_sample_add(&run->lat[MB_LAT_CONNECT], run->now - c->t_open);
        mailbench_lmtp_send_lhlo(c);
        return;
    case L_LHLO:
        if (code != 250) {
            mailbench_lmtp_refused(c, "LHLO refused", line, len);
            return;
        }
        mailbench_sample_add(&run->lat[MB_LAT_LHLO], run->now - c->t_cmd);
        if (c->target->starttls && !c->ssl) {
            mailbench_conn_write(c, "STARTTLS\r\n", 10);
            c->state = L_STARTTLS;
            return;
        }
        mailbench_lmtp_ready(c);
        return;
    case L_STARTTLS:
        if (code != 220) {
            mailbench_lmtp_refused(c, "STARTTLS refused", line, len);
            return;
        }
        c->state = L_TLS;
        mailbench_conn_starttls(c);
        return;
    case L_TRANS:
        mailbench_lmtp_trans_reply(c, code);
        return;
    case L_BODY:
        mailbench_lmtp_body_reply(c, code);
        return;
    case L_RSET:
        mailbench_lmtp_next(c);
        return;
    case L_QUIT:
        run->lmtp.active--;
        mailbench_conn_close(c);
        return;
    default:
        mailbench_lmtp_refused(c, "unexpected reply", line, len);
        return;
    }
}

/* Note the extensions of an LHLO reply line. */
static void mailbench_lmtp_ehlo_line(struct mb_conn *c, const char *text,
                                     size_t len)
{
    if (len >= 10 && strncasecmp(text, "PIPELINING", 10) == 0
        && (len == 10 || text[10] == ' '))
        c->pipelining = 1;
    if (len >= 8 && strncasecmp(text, "STARTTLS", 8) == 0
        && (len == 8 || text[8] == ' '))
        c->cap_starttls = 1;
}

static void mailbench_lmtp_input(struct mb_conn *c)
{
    const char *line;
    size_t len;

    while (!c->dead && mailbench_conn_line(c, &line, &len)) {
        if (len < 3 || line[0] < '2' || line[0] > '5'
            || line[1] < '0' || line[1] > '9' || line[2] < '0'
            || line[2] > '9' || (len > 3 && line[3] != ' ' && line[3] != '-')) {
            mailbench_lmtp_refused(c, "malformed reply line", line, len);
            return;
        }
        int code = (line[0] - '0') * 100 + (line[1] - '0') * 10
            + (line[2] - '0');
        int last = len == 3 || line[3] == ' ';

        if (c->state == L_LHLO && code == 250)
            mailbench_lmtp_ehlo_line(c, line + (len > 3 ? 4 : 3),
                                     len > 3 ? len - 4 : 0);
        if (!last)
            continue;
        if (c->state == L_TLS) {
            mailbench_lmtp_refused(c, "a reply during the TLS handshake",
                                   line, len);
            return;
        }
        mailbench_lmtp_reply(c, code, line, len);
    }
}

static void mailbench_lmtp_failed(struct mb_conn *c, int kind,
                                  const char *why)
{
    struct mb_run *run = c->run;
    struct mb_lmtp *l = &run->lmtp;
    struct mb_lmtp_msg *m = &c->msg;

    l->active--;
    if (!c->ready)
        l->connecting--;
    if (c->paced) {
        c->paced = 0;
        l->paced--;
    }
    if (c->state == L_QUIT && kind == MB_ERR_CLOSED)
        return;         /* closed after QUIT without a 221: fine */
    if (!c->target->ever_ready) {
        mailbench_fatal(run, MB_EXIT_SETUP, "LMTP target %s: %s",
                        c->target->spec, why);
        return;
    }
    mailbench_warn(run, "LMTP connection: %s", why);
    if (m->active) {
        for (unsigned j = 0; j < run->opt.rcpts; j++) {
            if (m->code[j] == 0) {
                m->code[j] = -1;
                mailbench_error_kind(run, kind);
            }
        }
        mailbench_lmtp_account(c);
    } else {
        mailbench_error_kind(run, kind);
    }
}

static const struct mb_conn_ops mailbench_lmtp_ops = {
    .connected = mailbench_lmtp_connected,
    .input = mailbench_lmtp_input,
    .tls_ready = mailbench_lmtp_tls_ready,
    .sent = mailbench_lmtp_sent,
    .failed = mailbench_lmtp_failed,
};

int mailbench_lmtp_due_ms(const struct mb_run *run, int max_ms)
{
    const struct mb_lmtp *l = &run->lmtp;
    double due = l->t_start + (double)l->next_msg / run->opt.lmtp_rate;
    double ms = (due - run->now) * 1000.0;

    if (ms <= 0)
        return 0;
    return ms < max_ms ? (int)ms + 1 : max_ms;
}

int mailbench_lmtp_pump(struct mb_run *run)
{
    struct mb_lmtp *l = &run->lmtp;

    if (l->done >= run->opt.msgs && l->active == 0)
        return 0;
    /* --lmtp-rate: start the held-back connections whose message is due */
    for (struct mb_conn *c = run->conns; c && l->paced; ) {
        struct mb_conn *next = c->next;

        if (c->kind == MB_CONN_LMTP && c->paced && !c->dead) {
            c->t_activity = run->now;   /* waiting on us, not the server */
            mailbench_lmtp_next(c);
            if (!c->paced)
                mailbench_conn_flush(c);
        }
        c = next;
    }
    while (!run->fatal && l->active < run->opt.conns
           && run->now >= l->next_connect
           && run->opt.msgs - l->next_msg > l->connecting) {
        struct mb_conn *c;
        int r = mailbench_conn_open(run, &run->lmtp_target, MB_CONN_LMTP,
                                    &mailbench_lmtp_ops, &c);

        if (r > 0) {
            l->next_connect = run->now + 0.005;
            break;
        }
        if (r < 0) {
            l->next_connect = run->now + 0.05;
            break;
        }
        c->msg.code = calloc(run->opt.rcpts, sizeof(int));
        if (!c->msg.code)
            mailbench_oom();
        l->active++;
        l->connecting++;
    }
    return 1;
}

/* ---- verification ----------------------------------------------------------- */

struct mb_verify_child {
    pid_t pid;
    int fd;
    unsigned long user;
    char out[64];
    size_t len;
};

static int mailbench_verify_spawn(struct mb_run *run, unsigned long user,
                                  struct mb_verify_child *ch, char *cmd)
{
    int p[2];

    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(p[1], 1);
        execl("/bin/sh", "sh", "-c", cmd, "mailbench-verify",
              run->user_names[user], (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    ch->pid = pid;
    ch->fd = p[0];
    ch->user = user;
    ch->len = 0;
    return 0;
}

int mailbench_verify_cmd(struct mb_run *run)
{
    struct mb_verify_state *v = &run->verify;
    unsigned max = run->opt.conns < 32 ? run->opt.conns : 32;
    struct mb_verify_child *ch = calloc(max, sizeof(*ch));
    struct pollfd *pfd = calloc(max, sizeof(*pfd));
    unsigned running = 0;
    char *cmd;
    struct buf b = BUF_INITIALIZER;

    if (!ch || !pfd || buf_printf(&b, "%s \"$1\"", run->opt.verify_cmd) < 0)
        mailbench_oom();
    cmd = buf_release(&b);
    while (v->next_user < run->nusers || running > 0) {
        while (running < max && v->next_user < run->nusers) {
            if (mailbench_verify_spawn(run, v->next_user, &ch[running],
                                       cmd) < 0) {
                mailbench_fatal(run, MB_EXIT_ERRORS, "cannot run %s: %s",
                                run->opt.verify_cmd, strerror(errno));
                break;
            }
            v->next_user++;
            running++;
        }
        if (run->fatal && running == 0)
            break;
        for (unsigned i = 0; i < running; i++) {
            pfd[i].fd = ch[i].fd;
            pfd[i].events = POLLIN;
        }
        if (poll(pfd, running, 1000) < 0 && errno != EINTR) {
            mailbench_fatal(run, MB_EXIT_ERRORS, "poll: %s", strerror(errno));
            break;
        }
        for (unsigned i = 0; i < running; i++) {
            if (!(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            struct mb_verify_child *k = &ch[i];
            ssize_t n = read(k->fd, k->out + k->len,
                             sizeof(k->out) - 1 - k->len);
            if (n > 0) {
                k->len += (size_t)n;
                if (k->len < sizeof(k->out) - 1)
                    continue;
            } else if (n < 0 && errno == EINTR) {
                continue;
            }
            /* EOF (or output too long): the child is done */
            int status = 0;
            close(k->fd);
            while (waitpid(k->pid, &status, 0) < 0 && errno == EINTR)
                ;
            k->out[k->len] = '\0';
            char *end;
            errno = 0;
            unsigned long val = strtoul(k->out, &end, 10);
            while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')
                end++;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0
                || end == k->out || *end || errno || val > UINT32_MAX) {
                char text[80];

                v->failures++;
                mailbench_warn(run, "verify: \"%s %s\" %s (output \"%s\")",
                               run->opt.verify_cmd,
                               run->user_names[k->user],
                               !WIFEXITED(status) ? "was killed"
                               : WEXITSTATUS(status) ? "failed"
                               : "did not print a number",
                               mailbench_printable(k->out, k->len, text,
                                                   sizeof(text)));
            } else {
                v->found[k->user] = (uint32_t)val;
                v->known[k->user] = 1;
            }
            v->done_users++;
            ch[i] = ch[running - 1];
            pfd[i] = pfd[running - 1];
            running--;
            i--;
        }
    }
    free(cmd);
    free(ch);
    free(pfd);
    return run->fatal ? -1 : 0;
}

void mailbench_verify_compare(struct mb_run *run)
{
    struct mb_verify_state *v = &run->verify;

    v->ran = 1;
    v->checked = v->mismatches = 0;
    for (unsigned long u = 0; u < run->nusers; u++) {
        if (!v->known[u])
            continue;
        long long expected = (long long)v->baseline[u] + run->expect_add[u]
            - run->expunged[u];

        v->checked++;
        if ((long long)v->found[u] != expected) {
            v->mismatches++;
            if (v->mismatches <= 20)
                fprintf(stderr, "mailbench: verify: user %s expected %lld "
                        "found %u (before %u, delivered %u, expunged %u)\n",
                        run->user_names[u], expected, v->found[u],
                        v->baseline[u], run->expect_add[u], run->expunged[u]);
        }
    }
    if (v->mismatches > 20)
        fprintf(stderr, "mailbench: verify: %lu mismatches in all\n",
                v->mismatches);
}
