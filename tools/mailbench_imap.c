/*
 * mailbench_imap.c - the IMAP part of mailbench: the session state
 * machine (`imap` and `mixed` modes) and the per-user message counts of
 * `--verify imap`.
 *
 * A session: greeting, [STARTTLS,] [CAPABILITY when the greeting did not
 * carry it,] LOGIN (or AUTHENTICATE PLAIN, with SASL-IR when offered),
 * SELECT INBOX, UID SEARCH ALL (the UIDs the operations pick from; its
 * latency is reported as UIDS), --ops operations drawn by the --mix
 * weights, LOGOUT.  One command is outstanding at a time.  An operation
 * that needs a message when the mailbox is empty is skipped and counted.
 *
 * Responses are read line by line; a line ending in a literal {N} (or
 * {N+}) is followed by N bytes that are skipped (counted as fetched
 * bytes) and by the rest of the same response.  Untagged data the state
 * machine does not need is skipped.  Untagged EXPUNGE responses update the
 * session's UID list and are counted for the session's user: sessions of
 * one user never overlap (each session slot has its own set of users), so
 * every expunged message is seen by exactly one session and counted once.
 *
 * A verify connection logs in as one user and sends STATUS INBOX
 * (MESSAGES) and LOGOUT pipelined after the login command.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

#include "tools/mailbench.h"

enum {
    I_GREETING = 1, I_STARTTLS, I_TLS, I_CAPA, I_AUTH_CONT, I_AUTH,
    I_SELECT, I_UIDS, I_OP, I_EXP_STORE, I_EXP_EXPUNGE, I_VSTATUS,
    I_APPEND_CONT, I_LOGOUT
};

#define MB_MAX_UIDS 10000000

static const int mailbench_op_lat[MB_OP_COUNT] = {
    [MB_OP_FETCHHDR] = MB_LAT_FETCH_HDR,
    [MB_OP_FETCHBODY] = MB_LAT_FETCH_BODY,
    [MB_OP_STORE] = MB_LAT_STORE,
    [MB_OP_SEARCH] = MB_LAT_SEARCH,
    [MB_OP_EXPUNGE] = MB_LAT_EXPUNGE,
    [MB_OP_APPEND] = MB_LAT_APPEND,
};

/* The message APPEND adds: headers and a small text body. */
static const char mailbench_append_msg[] =
    "From: mailbench <bench@example.org>\r\n"
    "To: mailbench <bench@example.com>\r\n"
    "Subject: mailbench append\r\n"
    "Date: Mon, 2 Jan 2006 15:04:05 +0000\r\n"
    "Message-ID: <append@mailbench.example.org>\r\n"
    "MIME-Version: 1.0\r\n"
    "Content-Type: text/plain; charset=us-ascii\r\n"
    "\r\n"
    "A message added by IMAP APPEND while the mailbox is in use.\r\n"
    "The quick brown fox jumps over the lazy dog, again and again.\r\n";

void mailbench_imap_init(struct mb_run *run)
{
    struct mb_imap *im = &run->imap;

    im->sessions = run->opt.sessions;
    if (im->sessions > run->opt.users) {
        /* sessions of one user must not overlap (exact EXPUNGE counts) */
        fprintf(stderr, "mailbench: --sessions %u is more than --users %lu: "
                "%lu concurrent sessions\n", run->opt.sessions,
                run->opt.users, run->opt.users);
        im->sessions = (unsigned)run->opt.users;
    }
    im->slot_round = calloc(im->sessions, sizeof(unsigned long));
    im->slot_busy = calloc(im->sessions, 1);
    if (!im->slot_round || !im->slot_busy)
        mailbench_oom();
}

void mailbench_imap_free(struct mb_run *run)
{
    free(run->imap.slot_round);
    free(run->imap.slot_busy);
}

/* ---- sending ---------------------------------------------------------------- */

static void mailbench_imap_cmd(struct mb_conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Send "aN " + the command + CRLF. */
static void mailbench_imap_cmd(struct mb_conn *c, const char *fmt, ...)
{
    va_list ap;
    int r;

    mailbench_conn_printf(c, "a%u ", ++c->tag_sent);
    va_start(ap, fmt);
    r = buf_vprintf(&c->out, fmt, ap);
    va_end(ap);
    if (r < 0)
        mailbench_oom();
    mailbench_conn_write(c, "\r\n", 2);
}

/* An IMAP quoted string. */
static void mailbench_imap_quoted(struct buf *b, const char *s)
{
    if (buf_putc(b, '"') < 0)
        mailbench_oom();
    for (; *s; s++) {
        if ((*s == '"' || *s == '\\') && buf_putc(b, '\\') < 0)
            mailbench_oom();
        if (buf_putc(b, *s) < 0)
            mailbench_oom();
    }
    if (buf_putc(b, '"') < 0)
        mailbench_oom();
}

static char *mailbench_imap_user(struct mb_conn *c)
{
    return mailbench_user_name(c->run, c->user);
}

/* base64("\0user\0password") for AUTHENTICATE PLAIN (caller frees). */
static char *mailbench_imap_plain(struct mb_conn *c)
{
    char *user = mailbench_imap_user(c);
    const char *pw = c->run->opt.password;
    size_t ul = strlen(user), pl = strlen(pw);
    size_t rawlen = 2 + ul + pl;
    unsigned char *raw = mailbench_malloc(rawlen);
    char *out = mailbench_malloc(4 * ((rawlen + 2) / 3) + 1);

    raw[0] = '\0';
    memcpy(raw + 1, user, ul);
    raw[1 + ul] = '\0';
    memcpy(raw + 2 + ul, pw, pl);
    EVP_EncodeBlock((unsigned char *)out, raw, (int)rawlen);
    free(raw);
    free(user);
    return out;
}

/* After the login command: a verify connection pipelines its count. */
static void mailbench_imap_after_auth_sent(struct mb_conn *c)
{
    c->state = I_AUTH;
    if (c->kind == MB_CONN_VERIFY) {
        mailbench_imap_cmd(c, "STATUS INBOX (MESSAGES)");
        mailbench_imap_cmd(c, "LOGOUT");
    }
}

static void mailbench_imap_login(struct mb_conn *c)
{
    struct mb_run *run = c->run;

    c->t_cmd = run->now;
    if (run->opt.auth_plain) {
        char *blob = mailbench_imap_plain(c);

        if (c->cap_sasl_ir) {
            mailbench_imap_cmd(c, "AUTHENTICATE PLAIN %s", blob);
            mailbench_imap_after_auth_sent(c);
        } else {
            mailbench_imap_cmd(c, "AUTHENTICATE PLAIN");
            c->state = I_AUTH_CONT;
        }
        free(blob);
        return;
    }
    if (c->cap_logindisabled) {
        mailbench_fatal(run, c->target->ever_ready ? MB_EXIT_ERRORS
                        : MB_EXIT_SETUP, "IMAP target %s says LOGINDISABLED "
                        "(use --imap-starttls, --imap-tls or --auth plain)",
                        c->target->spec);
        mailbench_conn_close(c);
        return;
    }
    struct buf b = BUF_INITIALIZER;
    char *user = mailbench_imap_user(c);
    mailbench_imap_quoted(&b, user);
    if (buf_putc(&b, ' ') < 0)
        mailbench_oom();
    mailbench_imap_quoted(&b, run->opt.password);
    mailbench_imap_cmd(c, "LOGIN %s", buf_cstring(&b));
    buf_free(&b);
    free(user);
    mailbench_imap_after_auth_sent(c);
}

static int mailbench_imap_need_caps(const struct mb_conn *c)
{
    if (c->caps_known)
        return 0;
    return c->run->opt.auth_plain || c->kind == MB_CONN_IMAP;
}

static void mailbench_imap_after_greeting(struct mb_conn *c)
{
    if (c->target->starttls && !c->ssl) {
        mailbench_imap_cmd(c, "STARTTLS");
        c->state = I_STARTTLS;
    } else if (mailbench_imap_need_caps(c)) {
        mailbench_imap_cmd(c, "CAPABILITY");
        c->state = I_CAPA;
    } else {
        mailbench_imap_login(c);
    }
}

/* ---- the operations ------------------------------------------------------------- */

static void mailbench_imap_logout(struct mb_conn *c)
{
    c->t_cmd = c->run->now;
    mailbench_imap_cmd(c, "LOGOUT");
    c->state = I_LOGOUT;
}

static int mailbench_imap_pick(struct mb_run *run)
{
    unsigned total = 0, x;

    for (int i = 0; i < MB_OP_COUNT; i++)
        total += run->opt.weights[i];
    x = (unsigned)(mailbench_random(run) % total);
    for (int i = 0; i < MB_OP_COUNT; i++) {
        if (x < run->opt.weights[i])
            return i;
        x -= run->opt.weights[i];
    }
    return MB_OP_SEARCH;
}

static void mailbench_imap_next_op(struct mb_conn *c)
{
    struct mb_run *run = c->run;

    for (;;) {
        if (c->ops_left == 0 || run->fatal) {
            mailbench_imap_logout(c);
            return;
        }
        c->ops_left--;
        c->op = mailbench_imap_pick(run);
        if (c->op == MB_OP_APPEND)
            break;
        if (c->exists == 0 || (c->op != MB_OP_SEARCH && c->nuids == 0)) {
            run->imap.skipped++;
            continue;
        }
        break;
    }
    size_t i = (size_t)(mailbench_random(run) % (c->nuids ? c->nuids : 1));
    uint32_t uid = c->nuids ? c->uids[i] : 0;
    c->t_cmd = run->now;
    c->state = I_OP;
    switch (c->op) {
    case MB_OP_FETCHHDR: {
        size_t last = i + 19 < c->nuids ? i + 19 : c->nuids - 1;

        mailbench_imap_cmd(c, "UID FETCH %u:%u (FLAGS BODY.PEEK[HEADER.FIELDS "
                           "(FROM TO SUBJECT DATE MESSAGE-ID)])", uid,
                           c->uids[last]);
        break;
    }
    case MB_OP_FETCHBODY:
        mailbench_imap_cmd(c, "UID FETCH %u BODY.PEEK[]", uid);
        break;
    case MB_OP_STORE:
        mailbench_imap_cmd(c, "UID STORE %u %cFLAGS (\\Seen)", uid,
                           (mailbench_random(run) & 1) ? '+' : '-');
        break;
    case MB_OP_SEARCH:
        if (mailbench_random(run) & 1)
            mailbench_imap_cmd(c, "UID SEARCH UNSEEN");
        else
            mailbench_imap_cmd(c, "UID SEARCH SUBJECT \"x\"");
        break;
    case MB_OP_EXPUNGE:
        c->op_uid = uid;
        mailbench_imap_cmd(c, "UID STORE %u +FLAGS.SILENT (\\Deleted)", uid);
        c->state = I_EXP_STORE;
        break;
    case MB_OP_APPEND:
        /* a synchronizing literal: every server takes it */
        mailbench_imap_cmd(c, "APPEND INBOX (\\Seen) {%zu}",
                           sizeof(mailbench_append_msg) - 1);
        c->state = I_APPEND_CONT;
        break;
    }
}

static void mailbench_imap_op_done(struct mb_conn *c)
{
    struct mb_run *run = c->run;
    double lat = run->now - c->t_cmd;

    mailbench_sample_add(&run->lat[mailbench_op_lat[c->op]], lat);
    mailbench_series_add(&run->imap_series, run->now - run->t_run_start, lat);
    run->imap.ops++;
    mailbench_imap_next_op(c);
}

static int mailbench_imap_cmp_uid(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

/* ---- parsing ------------------------------------------------------------------ */

static int mailbench_imap_word(const char *p, size_t n, const char *word)
{
    size_t l = strlen(word);

    return n >= l && strncasecmp(p, word, l) == 0 && (n == l || p[l] == ' '
                                                       || p[l] == ']');
}

/* Capabilities from "CAP CAP ..." (up to n bytes or a ']'). */
static void mailbench_imap_caps(struct mb_conn *c, const char *p, size_t n)
{
    size_t i = 0;

    c->caps_known = 1;
    c->cap_sasl_ir = c->cap_uidplus = c->cap_logindisabled = 0;
    while (i < n && p[i] != ']') {
        size_t s = i;

        while (i < n && p[i] != ' ' && p[i] != ']')
            i++;
        const char *w = p + s;
        size_t wl = i - s;
        if (wl == 7 && strncasecmp(w, "SASL-IR", 7) == 0)
            c->cap_sasl_ir = 1;
        else if (wl == 7 && strncasecmp(w, "UIDPLUS", 7) == 0)
            c->cap_uidplus = 1;
        else if (wl == 13 && strncasecmp(w, "LOGINDISABLED", 13) == 0)
            c->cap_logindisabled = 1;
        while (i < n && p[i] == ' ')
            i++;
    }
}

/* "[CAPABILITY ...]" at the start of a response text. */
static void mailbench_imap_resp_code(struct mb_conn *c, const char *p,
                                     size_t n)
{
    if (n > 12 && strncasecmp(p, "[CAPABILITY ", 12) == 0)
        mailbench_imap_caps(c, p + 12, n - 12);
}

static unsigned long mailbench_imap_number(const char *p, size_t n,
                                           size_t *used_r)
{
    unsigned long v = 0;
    size_t i = 0;

    while (i < n && p[i] >= '0' && p[i] <= '9' && v < 1000000000000UL)
        v = v * 10 + (unsigned long)(p[i++] - '0');
    *used_r = i;
    return v;
}

static void mailbench_imap_search(struct mb_conn *c, const char *p, size_t n)
{
    size_t i = 0;

    while (i < n) {
        size_t used;
        unsigned long v;

        while (i < n && p[i] == ' ')
            i++;
        v = mailbench_imap_number(p + i, n - i, &used);
        if (used == 0)
            break;
        i += used;
        if (v == 0 || v > UINT32_MAX || c->nuids >= MB_MAX_UIDS)
            continue;
        if (c->nuids == c->uids_cap) {
            c->uids_cap = c->uids_cap ? c->uids_cap * 2 : 64;
            c->uids = mailbench_realloc(c->uids,
                                        c->uids_cap * sizeof(*c->uids));
        }
        c->uids[c->nuids++] = (uint32_t)v;
    }
}

/* "* STATUS mailbox (MESSAGES n ...)" */
static void mailbench_imap_status(struct mb_conn *c, const char *p, size_t n)
{
    const char *open = memrchr(p, '(', n);

    if (!open)
        return;
    size_t i = (size_t)(open - p) + 1;
    while (i < n) {
        size_t used;

        if (n - i > 9 && strncasecmp(p + i, "MESSAGES ", 9) == 0) {
            unsigned long v = mailbench_imap_number(p + i + 9, n - i - 9,
                                                    &used);
            if (used > 0 && v <= UINT32_MAX) {
                c->status_messages = (uint32_t)v;
                c->got_status = 1;
            }
            return;
        }
        /* skip one attribute and its value */
        while (i < n && p[i] != ' ' && p[i] != ')')
            i++;
        while (i < n && p[i] == ' ')
            i++;
        while (i < n && p[i] != ' ' && p[i] != ')')
            i++;
        while (i < n && p[i] == ' ')
            i++;
        if (i < n && p[i] == ')')
            return;
    }
}

static void mailbench_imap_refused(struct mb_conn *c, const char *what,
                                   const char *line, size_t len)
{
    char text[200], why[320];

    mailbench_printable(line, len, text, sizeof(text));
    snprintf(why, sizeof(why), "%s: %s", what, text);
    if (!c->target->ever_ready)
        mailbench_fatal(c->run, MB_EXIT_SETUP, "IMAP target %s: %s",
                        c->target->spec, why);
    mailbench_conn_fail(c, MB_ERR_PROTOCOL, why);
}

static void mailbench_imap_untagged(struct mb_conn *c, const char *p,
                                    size_t n, const char *line, size_t len)
{
    struct mb_run *run = c->run;

    if (n > 0 && p[0] >= '0' && p[0] <= '9') {
        size_t used;
        unsigned long num = mailbench_imap_number(p, n, &used);
        const char *w = p + used + 1;
        size_t wl = n > used + 1 ? n - used - 1 : 0;

        if (mailbench_imap_word(w, wl, "EXISTS")) {
            c->exists = num;
        } else if (mailbench_imap_word(w, wl, "EXPUNGE")) {
            if (c->exists > 0)
                c->exists--;
            if (num >= 1 && num <= c->nuids) {
                memmove(c->uids + num - 1, c->uids + num,
                        (c->nuids - num) * sizeof(*c->uids));
                c->nuids--;
            }
            if (c->kind == MB_CONN_IMAP) {
                c->expunges++;
                run->imap.expunged++;
                if (run->expunged && c->user < run->nusers)
                    run->expunged[c->user]++;
            }
        }
        return;
    }
    if (c->state == I_GREETING) {
        if (mailbench_imap_word(p, n, "OK")) {
            if (n > 3)
                mailbench_imap_resp_code(c, p + 3, n - 3);
            if (c->kind == MB_CONN_IMAP)
                mailbench_sample_add(&run->lat[MB_LAT_IMAP_CONNECT],
                                     run->now - c->t_open);
            mailbench_imap_after_greeting(c);
        } else {
            mailbench_imap_refused(c, "greeting", line, len);
        }
        return;
    }
    if (mailbench_imap_word(p, n, "CAPABILITY"))
        mailbench_imap_caps(c, p + 10, n - 10);
    else if (mailbench_imap_word(p, n, "OK") && n > 3)
        mailbench_imap_resp_code(c, p + 3, n - 3);
    else if (mailbench_imap_word(p, n, "SEARCH") && c->state == I_UIDS)
        mailbench_imap_search(c, p + 6, n - 6);
    else if (mailbench_imap_word(p, n, "STATUS") && c->state == I_VSTATUS)
        mailbench_imap_status(c, p, n);
    /* anything else (FETCH, FLAGS, BYE, RECENT ...) is skipped */
}

/* The end of one session (sessions) or one count (verify). */
static void mailbench_imap_done(struct mb_conn *c)
{
    struct mb_run *run = c->run;

    if (c->kind == MB_CONN_IMAP) {
        run->imap.finished++;
        run->imap.active--;
        run->imap.slot_busy[c->slot] = 0;
    } else {
        run->verify.active--;
        run->verify.done_users++;
    }
    c->state = 0;
    mailbench_conn_close(c);
}

static void mailbench_imap_tagged(struct mb_conn *c, const char *status,
                                  size_t sl, const char *text, size_t tl,
                                  const char *line, size_t len)
{
    struct mb_run *run = c->run;
    int ok = sl == 2 && strncasecmp(status, "OK", 2) == 0;
    int no = sl == 2 && strncasecmp(status, "NO", 2) == 0;
    char ptext[200];

    if (ok)
        mailbench_imap_resp_code(c, text, tl);
    else if (c->state != I_STARTTLS && c->state != I_CAPA
             && c->state != I_AUTH)
        mailbench_error_kind(run, no ? MB_ERR_IMAP_NO : MB_ERR_IMAP_BAD);

    switch (c->state) {
    case I_STARTTLS:
        if (!ok) {
            mailbench_imap_refused(c, "STARTTLS refused", line, len);
            return;
        }
        c->state = I_TLS;
        c->caps_known = 0;
        mailbench_conn_starttls(c);
        return;
    case I_CAPA:
        if (!ok) {
            mailbench_imap_refused(c, "CAPABILITY refused", line, len);
            return;
        }
        c->caps_known = 1;
        mailbench_imap_login(c);
        return;
    case I_AUTH:
    case I_AUTH_CONT: {
        char *user = mailbench_imap_user(c);

        if (!ok) {
            char what[300];

            snprintf(what, sizeof(what), "login as %s failed", user);
            free(user);
            if (!c->target->ever_ready) {
                mailbench_imap_refused(c, what, line, len);
                return;
            }
            mailbench_error_kind(run, no ? MB_ERR_IMAP_NO : MB_ERR_IMAP_BAD);
            mailbench_warn(run, "IMAP %s: %s", what,
                           mailbench_printable(line, len, ptext,
                                               sizeof(ptext)));
            if (c->kind == MB_CONN_VERIFY)
                run->verify.failures++;
            else
                run->imap.failed_sessions++;
            mailbench_imap_done(c);
            return;
        }
        free(user);
        c->ready = 1;
        c->target->ever_ready = 1;
        c->target->failures_in_row = 0;
        if (c->kind == MB_CONN_VERIFY) {
            c->state = I_VSTATUS;
            return;
        }
        mailbench_sample_add(&run->lat[MB_LAT_LOGIN], run->now - c->t_cmd);
        c->t_cmd = run->now;
        mailbench_imap_cmd(c, "SELECT INBOX");
        c->state = I_SELECT;
        return;
    }
    case I_VSTATUS:
        if (ok && c->got_status) {
            run->verify.found[c->user] = c->status_messages;
            run->verify.known[c->user] = 1;
        } else {
            run->verify.failures++;
            mailbench_warn(run, "verify: STATUS INBOX of %s: %s",
                           run->user_names[c->user],
                           ok ? "no MESSAGES in the answer"
                           : mailbench_printable(line, len, ptext,
                                                 sizeof(ptext)));
        }
        c->state = I_LOGOUT;
        return;
    case I_SELECT:
        if (!ok) {
            mailbench_warn(run, "IMAP SELECT INBOX: %s",
                           mailbench_printable(line, len, ptext,
                                               sizeof(ptext)));
            run->imap.failed_sessions++;
            mailbench_imap_logout(c);
            return;
        }
        mailbench_sample_add(&run->lat[MB_LAT_SELECT], run->now - c->t_cmd);
        if (c->exists > 0) {
            c->t_cmd = run->now;
            c->nuids = 0;
            mailbench_imap_cmd(c, "UID SEARCH ALL");
            c->state = I_UIDS;
            return;
        }
        mailbench_imap_next_op(c);
        return;
    case I_UIDS:
        mailbench_sample_add(&run->lat[MB_LAT_UIDS], run->now - c->t_cmd);
        qsort(c->uids, c->nuids, sizeof(*c->uids), mailbench_imap_cmp_uid);
        mailbench_imap_next_op(c);
        return;
    case I_APPEND_CONT:     /* refused before the literal */
    case I_OP:
        if (!ok)
            mailbench_warn(run, "IMAP operation: %s",
                           mailbench_printable(line, len, ptext,
                                               sizeof(ptext)));
        else if (c->op == MB_OP_APPEND && run->expect_add
                 && c->user < run->nusers)
            run->expect_add[c->user]++;     /* verification counts it */
        mailbench_imap_op_done(c);
        return;
    case I_EXP_STORE:
        if (!ok) {
            mailbench_warn(run, "IMAP STORE \\Deleted: %s",
                           mailbench_printable(line, len, ptext,
                                               sizeof(ptext)));
            mailbench_imap_op_done(c);
            return;
        }
        if (c->cap_uidplus)
            mailbench_imap_cmd(c, "UID EXPUNGE %u", c->op_uid);
        else
            mailbench_imap_cmd(c, "EXPUNGE");
        c->state = I_EXP_EXPUNGE;
        return;
    case I_EXP_EXPUNGE:
        if (!ok)
            mailbench_warn(run, "IMAP EXPUNGE: %s",
                           mailbench_printable(line, len, ptext,
                                               sizeof(ptext)));
        mailbench_imap_op_done(c);
        return;
    case I_LOGOUT:
        if (c->kind == MB_CONN_IMAP)
            mailbench_sample_add(&run->lat[MB_LAT_LOGOUT],
                                 run->now - c->t_cmd);
        mailbench_imap_done(c);
        return;
    default:
        mailbench_imap_refused(c, "unexpected tagged response", line, len);
        return;
    }
}

/* One response (its first line). */
static void mailbench_imap_response(struct mb_conn *c, const char *line,
                                    size_t len)
{
    if (len >= 2 && line[0] == '*' && line[1] == ' ') {
        mailbench_imap_untagged(c, line + 2, len - 2, line, len);
        return;
    }
    if (len >= 1 && line[0] == '+') {
        if (c->state == I_AUTH_CONT) {
            char *blob = mailbench_imap_plain(c);

            mailbench_conn_printf(c, "%s\r\n", blob);
            free(blob);
            mailbench_imap_after_auth_sent(c);
        } else if (c->state == I_APPEND_CONT) {
            mailbench_conn_write(c, mailbench_append_msg,
                                 sizeof(mailbench_append_msg) - 1);
            mailbench_conn_write(c, "\r\n", 2);
            c->state = I_OP;
        }
        return;
    }
    /* tagged: "aN STATUS text" */
    char expect[16];
    int el = snprintf(expect, sizeof(expect), "a%u ", c->tag_done + 1);
    if (len < (size_t)el || memcmp(line, expect, (size_t)el) != 0
        || c->tag_done >= c->tag_sent) {
        mailbench_imap_refused(c, "unexpected response", line, len);
        return;
    }
    c->tag_done++;
    const char *st = line + el;
    size_t rest = len - (size_t)el, sl = 0;
    while (sl < rest && st[sl] != ' ')
        sl++;
    const char *text = st + sl;
    size_t tl = rest - sl;
    if (tl > 0) {
        text++;
        tl--;
    }
    mailbench_imap_tagged(c, st, sl, text, tl, line, len);
}

/* The size of a literal that ends the line ({N} or {N+}), or 0 / -1. */
static int mailbench_imap_literal(const char *line, size_t len, size_t *n_r)
{
    size_t i, used;

    if (len < 3 || line[len - 1] != '}')
        return 0;
    i = len - 1;
    if (line[i - 1] == '+')
        i--;
    size_t end = i;
    while (i > 0 && line[i - 1] >= '0' && line[i - 1] <= '9')
        i--;
    if (i == 0 || i == end || line[i - 1] != '{')
        return 0;
    unsigned long v = mailbench_imap_number(line + i, end - i, &used);
    if (used != end - i || v > ((size_t)1 << 40))
        return -1;
    *n_r = v;
    return 1;
}

static void mailbench_imap_input(struct mb_conn *c)
{
    struct mb_run *run = c->run;
    const char *line;
    size_t len;

    while (!c->dead) {
        if (c->lit_left) {
            size_t n = mailbench_conn_skip(c, c->lit_left);

            c->lit_left -= n;
            if (c->kind == MB_CONN_IMAP)
                run->imap.fetch_bytes += n;
            if (c->lit_left)
                return;
            continue;
        }
        if (!mailbench_conn_line(c, &line, &len))
            return;
        int cont = c->in_cont;
        size_t lit = 0;
        int r = mailbench_imap_literal(line, len, &lit);

        c->in_cont = 0;
        if (r < 0) {
            mailbench_imap_refused(c, "a literal too large", line, len);
            return;
        }
        if (r > 0 && !(len >= 1 && line[0] == '+' && !cont)) {
            c->lit_left = lit;
            c->in_cont = 1;
        }
        if (!cont)
            mailbench_imap_response(c, line, len);
    }
}

static void mailbench_imap_connected(struct mb_conn *c)
{
    c->state = I_GREETING;
}

static void mailbench_imap_tls_ready(struct mb_conn *c)
{
    if (mailbench_imap_need_caps(c)) {
        mailbench_imap_cmd(c, "CAPABILITY");
        c->state = I_CAPA;
    } else {
        mailbench_imap_login(c);
    }
}

static void mailbench_imap_failed(struct mb_conn *c, int kind,
                                  const char *why)
{
    struct mb_run *run = c->run;
    int logout = c->state == I_LOGOUT && kind == MB_ERR_CLOSED;

    if (c->kind == MB_CONN_IMAP) {
        run->imap.active--;
        run->imap.slot_busy[c->slot] = 0;
        if (logout) {
            run->imap.finished++;
            return;
        }
        run->imap.failed_sessions++;
    } else {
        run->verify.active--;
        run->verify.done_users++;
        if (logout)
            return;
        if (!run->verify.known[c->user]) {
            run->verify.failures++;
        }
    }
    if (!c->target->ever_ready) {
        mailbench_fatal(run, MB_EXIT_SETUP, "IMAP target %s: %s",
                        c->target->spec, why);
        return;
    }
    mailbench_error_kind(run, kind);
    mailbench_warn(run, "IMAP connection%s%s: %s",
                   c->kind == MB_CONN_VERIFY ? " of verify for " : "",
                   c->kind == MB_CONN_VERIFY ? run->user_names[c->user] : "",
                   why);
}

static const struct mb_conn_ops mailbench_imap_ops = {
    .connected = mailbench_imap_connected,
    .input = mailbench_imap_input,
    .tls_ready = mailbench_imap_tls_ready,
    .sent = NULL,
    .failed = mailbench_imap_failed,
};

int mailbench_imap_pump(struct mb_run *run)
{
    struct mb_imap *im = &run->imap;
    int more_sessions = !im->stop
        && (run->opt.mode == MB_MODE_MIXED || im->started < run->opt.imap_n);

    if (!more_sessions)
        return im->active > 0;
    if (run->now < im->next_connect || run->fatal)
        return 1;
    for (unsigned s = 0; s < im->sessions; s++) {
        struct mb_conn *c;

        if (im->slot_busy[s])
            continue;
        if (run->opt.mode != MB_MODE_MIXED && im->started >= run->opt.imap_n)
            break;
        int r = mailbench_conn_open(run, &run->imap_target, MB_CONN_IMAP,
                                    &mailbench_imap_ops, &c);
        if (r != 0) {
            im->next_connect = run->now + (r > 0 ? 0.005 : 0.05);
            break;
        }
        /* slot s: users u with u mod S == s, round robin */
        unsigned long k = run->opt.users, S = im->sessions;
        unsigned long count = (k - s + S - 1) / S;
        c->slot = s;
        c->user = s + (im->slot_round[s] % count) * S;
        c->ops_left = run->opt.ops;
        im->slot_round[s]++;
        im->slot_busy[s] = 1;
        im->started++;
        im->active++;
    }
    return 1;
}

int mailbench_verify_pump(struct mb_run *run)
{
    struct mb_verify_state *v = &run->verify;

    if (v->next_user >= run->nusers)
        return v->active > 0;
    if (run->now < v->next_connect || run->fatal)
        return 1;
    while (v->active < run->opt.conns && v->next_user < run->nusers) {
        struct mb_conn *c;
        int r = mailbench_conn_open(run, &run->imap_target, MB_CONN_VERIFY,
                                    &mailbench_imap_ops, &c);

        if (r != 0) {
            v->next_connect = run->now + (r > 0 ? 0.005 : 0.05);
            break;
        }
        c->user = v->next_user++;
        v->active++;
    }
    return 1;
}
