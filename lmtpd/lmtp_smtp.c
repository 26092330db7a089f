/*
 * lmtp_smtp.c - Sieve's outgoing messages over one kept-open SMTP
 * connection (see lmtp_smtp.h).
 *
 * A transaction: RSET (on a connection already used), MAIL FROM, RCPT TO,
 * DATA, each answered before the next is sent, or all four written at
 * once when the MTA announced PIPELINING (RFC 2920) and their answers read
 * in order; then the message, dot-stuffed with CRLF line ends, and its
 * end of data, whose 250 is the MTA's acceptance.  Any failure drops the
 * connection (its state is not worth guessing); a failure on a connection
 * already used before the end of data was written (the MTA's idle timeout
 * closed it, a 421) is tried again once on a new connection, since the
 * MTA cannot have accepted the message.
 */
#include "config.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "lmtpd/lmtp_smtp.h"

#define LMTP_SMTP_PORT "587"
#define LMTP_SMTP_LINE 2048        /* reply text kept for the logs */

struct lmtp_smtp {
    const struct imapconf *conf;
    int fd;                        /* -1: not connected */
    int used;                      /* a transaction ran on this connection */
    int pipelining;                /* the MTA announced PIPELINING */
    char in[4096];                 /* received, not yet consumed */
    size_t inlen;
    struct buf reply;              /* the last reply's text */
    struct buf out;
    unsigned long sent, connects;
};

/* the outcome of one step */
enum { SM_OK = 0, SM_REFUSED = -1, SM_IO = -2 };

struct lmtp_smtp *lmtp_smtp_new(const struct imapconf *conf)
{
    struct lmtp_smtp *sm = calloc(1, sizeof(*sm));

    if (!sm)
        return NULL;
    sm->conf = conf;
    sm->fd = -1;
    return sm;
}

unsigned long lmtp_smtp_sent(const struct lmtp_smtp *sm)
{
    return sm->sent;
}

unsigned long lmtp_smtp_connects(const struct lmtp_smtp *sm)
{
    return sm->connects;
}

static uint64_t lmtp_smtp_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Wait until fd is ready for events before deadline: 0, or -1 (late). */
static int lmtp_smtp_wait(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = { .fd = fd, .events = events };
        uint64_t now = lmtp_smtp_now();
        int r;

        if (now >= deadline)
            return -1;
        r = poll(&p, 1, (int)(deadline - now > 1000 ? 1000
                                                    : deadline - now));
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static void lmtp_smtp_close(struct lmtp_smtp *sm)
{
    if (sm->fd >= 0)
        close(sm->fd);
    sm->fd = -1;
    sm->used = 0;
    sm->pipelining = 0;
    sm->inlen = 0;
}

/* Split smtp_host into a host and port (or a UNIX path: *port_r NULL).
 * 0, or -1 with *why_r. */
static int lmtp_smtp_parse(const char *spec, char *host, size_t hostsz,
                           const char **port_r, char *port, size_t portsz,
                           const char **why_r)
{
    size_t n = strlen(spec);
    const char *slash, *colon;

    *port_r = NULL;
    /* Cyrus's flags after the address: /noauth is what we do anyway */
    if (spec[0] != '/' && (slash = strchr(spec, '/')) != NULL) {
        if (strcmp(slash, "/noauth") != 0) {
            *why_r = "unsupported smtp_host flag (only /noauth)";
            return -1;
        }
        n = (size_t)(slash - spec);
    }
    if (n == 0 || n >= hostsz) {
        *why_r = "empty or too long smtp_host";
        return -1;
    }
    if (spec[0] == '/') {
        memcpy(host, spec, n);
        host[n] = '\0';
        return 0;
    }
    if (spec[0] == '[') {             /* [ADDRESS]:PORT */
        const char *close = memchr(spec, ']', n);

        if (!close) {
            *why_r = "smtp_host: no ] after [";
            return -1;
        }
        memcpy(host, spec + 1, (size_t)(close - spec - 1));
        host[close - spec - 1] = '\0';
        colon = close + 1 < spec + n && close[1] == ':' ? close + 1 : NULL;
    } else {
        colon = memchr(spec, ':', n);
        memcpy(host, spec, colon ? (size_t)(colon - spec) : n);
        host[colon ? (size_t)(colon - spec) : n] = '\0';
    }
    if (colon) {
        size_t plen = (size_t)(spec + n - colon - 1);

        if (plen == 0 || plen >= portsz) {
            *why_r = "smtp_host: bad port";
            return -1;
        }
        memcpy(port, colon + 1, plen);
        port[plen] = '\0';
    } else {
        snprintf(port, portsz, "%s", LMTP_SMTP_PORT);
    }
    *port_r = port;
    return 0;
}

/* Connect fd to addr before deadline (non-blocking): 0 or -1. */
static int lmtp_smtp_connect1(int fd, const struct sockaddr *addr,
                              socklen_t alen, uint64_t deadline)
{
    int e = 0;
    socklen_t el = sizeof(e);

    if (connect(fd, addr, alen) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR)
        return -1;
    if (lmtp_smtp_wait(fd, POLLOUT, deadline) != 0) {
        errno = ETIMEDOUT;
        return -1;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
        return -1;
    if (e != 0) {
        errno = e;
        return -1;
    }
    return 0;
}

/* Write all of p[0..n) before deadline: SM_OK or SM_IO. */
static int lmtp_smtp_write(struct lmtp_smtp *sm, const char *p, size_t n,
                           uint64_t deadline)
{
    while (n > 0) {
        ssize_t w = send(sm->fd, p, n, MSG_NOSIGNAL);

        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return SM_IO;
        if (lmtp_smtp_wait(sm->fd, POLLOUT, deadline) != 0)
            return SM_IO;
    }
    return SM_OK;
}

/* Read one reply (all its lines) before deadline: its code (the reply's
 * text in sm->reply), or SM_IO (closed, timed out, not SMTP). */
static int lmtp_smtp_reply(struct lmtp_smtp *sm, uint64_t deadline)
{
    buf_reset(&sm->reply);
    for (;;) {
        char *nl = memchr(sm->in, '\n', sm->inlen);
        ssize_t r;

        if (nl) {
            size_t len = (size_t)(nl - sm->in) + 1, t = len - 1;
            int code, last;

            if (t > 0 && sm->in[t - 1] == '\r')
                t--;
            if (t < 3 || sm->in[0] < '2' || sm->in[0] > '5' ||
                sm->in[1] < '0' || sm->in[1] > '9' ||
                sm->in[2] < '0' || sm->in[2] > '9' ||
                (t > 3 && sm->in[3] != ' ' && sm->in[3] != '-'))
                return SM_IO;
            code = (sm->in[0] - '0') * 100 + (sm->in[1] - '0') * 10 +
                   (sm->in[2] - '0');
            last = t == 3 || sm->in[3] == ' ';
            if (sm->reply.len < LMTP_SMTP_LINE) {
                if (sm->reply.len)
                    buf_putc(&sm->reply, '|');
                buf_append(&sm->reply, sm->in,
                           t < LMTP_SMTP_LINE ? t : LMTP_SMTP_LINE);
            }
            memmove(sm->in, sm->in + len, sm->inlen - len);
            sm->inlen -= len;
            if (last)
                return code;
            continue;
        }
        if (sm->inlen == sizeof(sm->in))
            return SM_IO;              /* a line longer than SMTP allows */
        r = recv(sm->fd, sm->in + sm->inlen, sizeof(sm->in) - sm->inlen, 0);
        if (r > 0) {
            sm->inlen += (size_t)r;
            continue;
        }
        if (r == 0)
            return SM_IO;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return SM_IO;
        if (lmtp_smtp_wait(sm->fd, POLLIN, deadline) != 0)
            return SM_IO;
    }
}

/* Open the connection: connect, greeting, EHLO (HELO when EHLO is
 * refused).  SM_OK, SM_REFUSED or SM_IO with *stage_r. */
static int lmtp_smtp_open(struct lmtp_smtp *sm, uint64_t deadline,
                          const char **stage_r)
{
    const char *spec = imapconf_getstring(sm->conf, "smtp_host");
    char host[512], portbuf[64], name[256];
    const char *port, *why = NULL;
    int code;

    buf_reset(&sm->reply);
    *stage_r = "connect";
    if (lmtp_smtp_parse(spec ? spec : "", host, sizeof(host), &port,
                        portbuf, sizeof(portbuf), &why) != 0) {
        buf_setcstr(&sm->reply, why);
        return SM_REFUSED;
    }
    if (!port) {
        struct sockaddr_un un;

        memset(&un, 0, sizeof(un));
        un.sun_family = AF_UNIX;
        if (strlen(host) >= sizeof(un.sun_path)) {
            buf_setcstr(&sm->reply, "socket path too long");
            return SM_REFUSED;
        }
        strcpy(un.sun_path, host);
        sm->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        0);
        if (sm->fd < 0 || lmtp_smtp_connect1(sm->fd,
                                              (struct sockaddr *)&un,
                                              sizeof(un), deadline) != 0) {
            buf_setcstr(&sm->reply, strerror(errno));
            lmtp_smtp_close(sm);
            return SM_IO;
        }
    } else {
        struct addrinfo hints, *res = NULL, *ai;
        int e;

        memset(&hints, 0, sizeof(hints));
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_ADDRCONFIG;
        e = getaddrinfo(host, port, &hints, &res);
        if (e != 0) {
            buf_setcstr(&sm->reply, gai_strerror(e));
            return SM_IO;
        }
        errno = ECONNREFUSED;
        for (ai = res; ai; ai = ai->ai_next) {
            sm->fd = socket(ai->ai_family,
                            ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                            ai->ai_protocol);
            if (sm->fd >= 0 && lmtp_smtp_connect1(sm->fd, ai->ai_addr,
                                                  ai->ai_addrlen,
                                                  deadline) == 0)
                break;
            e = errno;
            lmtp_smtp_close(sm);
            errno = e;
        }
        freeaddrinfo(res);
        if (sm->fd < 0) {
            buf_setcstr(&sm->reply, strerror(errno));
            return SM_IO;
        }
    }
    sm->connects++;
    log_info("lmtp: sieve smtp connected host=<%s> connects=<%lu>", spec,
             sm->connects);
    *stage_r = "greeting";
    code = lmtp_smtp_reply(sm, deadline);
    if (code != 220)
        return code == SM_IO ? SM_IO : SM_REFUSED;
    imapconf_servername(sm->conf, name, sizeof(name));
    buf_reset(&sm->out);
    buf_printf(&sm->out, "EHLO %s\r\n", name);
    *stage_r = "EHLO";
    if (lmtp_smtp_write(sm, sm->out.s, sm->out.len, deadline) != SM_OK)
        return SM_IO;
    code = lmtp_smtp_reply(sm, deadline);
    if (code == SM_IO)
        return SM_IO;
    if (code != 250) {
        buf_reset(&sm->out);
        buf_printf(&sm->out, "HELO %s\r\n", name);
        *stage_r = "HELO";
        if (lmtp_smtp_write(sm, sm->out.s, sm->out.len, deadline) != SM_OK)
            return SM_IO;
        code = lmtp_smtp_reply(sm, deadline);
        if (code != 250)
            return code == SM_IO ? SM_IO : SM_REFUSED;
    } else {
        const char *p = buf_cstring(&sm->reply);

        /* the keywords: "250-PIPELINING" lines after the first */
        while ((p = strchr(p, '|')) != NULL) {
            p++;
            if (strncasecmp(p + 4, "PIPELINING", 10) == 0 &&
                (p[14] == '|' || p[14] == '\0' || p[14] == ' '))
                sm->pipelining = 1;
        }
    }
    return SM_OK;
}

/* Append head and body to sm->out as SMTP data: CRLF line ends, a dot
 * doubled at a line's start, the end of data. */
static int lmtp_smtp_data(struct lmtp_smtp *sm, const char *head,
                          size_t headlen, const char *body, size_t bodylen)
{
    const char *parts[2] = { head, body };
    size_t lens[2] = { headlen, bodylen };
    int bol = 1, i;

    buf_reset(&sm->out);
    if (buf_ensure(&sm->out, headlen + bodylen + headlen / 32 +
                   bodylen / 32 + 8) != 0)
        return -1;
    for (i = 0; i < 2; i++) {
        const char *p = parts[i], *end = p + lens[i];

        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t seg = nl ? (size_t)(nl - p) : (size_t)(end - p);

            if (bol && seg > 0 && *p == '.')
                buf_putc(&sm->out, '.');
            buf_append(&sm->out, p, seg);
            if (!nl) {
                bol = 0;
                p = end;
                break;
            }
            if (sm->out.len == 0 || sm->out.s[sm->out.len - 1] != '\r')
                buf_putc(&sm->out, '\r');
            buf_putc(&sm->out, '\n');
            bol = 1;
            p = nl + 1;
        }
    }
    if (!bol)
        buf_appendcstr(&sm->out, "\r\n");
    buf_appendcstr(&sm->out, ".\r\n");
    return sm->out.s ? 0 : -1;
}

/* One transaction on the open connection.  SM_OK, SM_REFUSED, or SM_IO
 * (*late_r set once the end of data was written: the MTA may have the
 * message). */
static int lmtp_smtp_transaction(struct lmtp_smtp *sm, const char *from,
                                 const char *to, const char *head,
                                 size_t headlen, const char *body,
                                 size_t bodylen, uint64_t deadline,
                                 const char **stage_r, int *late_r)
{
    static const char *const stages[] = { "RSET", "MAIL", "RCPT", "DATA" };
    static const int want[] = { 250, 250, 250, 354 };
    struct buf cmd[4] = { BUF_INITIALIZER, BUF_INITIALIZER, BUF_INITIALIZER,
                          BUF_INITIALIZER };
    int i, code, rc = SM_OK, first = sm->used ? 0 : 1, got = first;

    if (from[0] == '<' || from[0] == '\0')
        from = from[0] ? from : "<>";
    buf_setcstr(&cmd[0], "RSET\r\n");
    buf_appendcstr(&cmd[1], "MAIL FROM:");
    if (from[0] == '<') {
        buf_appendcstr(&cmd[1], from);
    } else {
        buf_putc(&cmd[1], '<');
        buf_appendcstr(&cmd[1], from);
        buf_putc(&cmd[1], '>');
    }
    buf_appendcstr(&cmd[1], "\r\n");
    buf_appendcstr(&cmd[2], "RCPT TO:<");
    buf_appendcstr(&cmd[2], to);
    buf_appendcstr(&cmd[2], ">\r\n");
    buf_setcstr(&cmd[3], "DATA\r\n");
    sm->used = 1;
    for (i = first; i < 4; i++)
        if (!cmd[i].s) {
            buf_setcstr(&sm->reply, "out of memory");
            rc = SM_REFUSED;
        }
    if (rc == SM_OK && sm->pipelining) {
        /* the commands in one write (RFC 2920 3.1) */
        buf_reset(&sm->out);
        for (i = first; i < 4; i++)
            buf_append(&sm->out, cmd[i].s, cmd[i].len);
        *stage_r = stages[first];
        if (!sm->out.s) {
            buf_setcstr(&sm->reply, "out of memory");
            rc = SM_REFUSED;
        } else if (lmtp_smtp_write(sm, sm->out.s, sm->out.len,
                                   deadline) != SM_OK) {
            rc = SM_IO;
        }
    }
    for (i = first; i < 4 && rc == SM_OK && !sm->pipelining; i++) {
        *stage_r = stages[i];
        if (lmtp_smtp_write(sm, cmd[i].s, cmd[i].len, deadline) != SM_OK) {
            rc = SM_IO;
            break;
        }
        code = lmtp_smtp_reply(sm, deadline);
        if (code == SM_IO || code == 421)
            rc = SM_IO;
        else if (code != want[i] && !(i == 2 && code == 251))
            rc = SM_REFUSED;
    }
    if (sm->pipelining) {
        /* the answers, in order, to what was written */
        for (i = got; i < 4 && rc == SM_OK; i++) {
            *stage_r = stages[i];
            code = lmtp_smtp_reply(sm, deadline);
            if (code == SM_IO || code == 421)
                rc = SM_IO;
            else if (code != want[i] && !(i == 2 && code == 251))
                rc = SM_REFUSED;
        }
    }
    for (i = 0; i < 4; i++)
        buf_free(&cmd[i]);
    if (rc != SM_OK)
        return rc;
    *stage_r = "data";
    if (lmtp_smtp_data(sm, head, headlen, body, bodylen) != 0) {
        buf_setcstr(&sm->reply, "out of memory");
        return SM_REFUSED;
    }
    *late_r = 1;
    if (lmtp_smtp_write(sm, sm->out.s, sm->out.len, deadline) != SM_OK)
        return SM_IO;
    *stage_r = "end of data";
    code = lmtp_smtp_reply(sm, deadline);
    if (code == SM_IO)
        return SM_IO;
    return code == 250 ? SM_OK : SM_REFUSED;
}

int lmtp_smtp_send(struct lmtp_smtp *sm, const char *from, const char *to,
                   const char *head, size_t headlen, const char *body,
                   size_t bodylen, long timeout_s)
{
    uint64_t deadline = lmtp_smtp_now() +
                        (uint64_t)(timeout_s > 0 ? timeout_s : 300) * 1000;
    const char *stage = "connect";
    int rc = SM_IO, attempt, late = 0;

    /* an address is one line of a command: never a way to add others */
    if (strpbrk(from, "\r\n") || strpbrk(to, "\r\n") ||
        strlen(from) > 512 || strlen(to) > 512) {
        log_error("lmtp: sieve smtp failed to=<(unusable)> "
                  "reply=<address with a line end or too long>");
        return -1;
    }
    for (attempt = 0; attempt < 2; attempt++) {
        int reused = sm->fd >= 0;

        late = 0;
        if (sm->fd < 0 && (rc = lmtp_smtp_open(sm, deadline,
                                                &stage)) != SM_OK) {
            lmtp_smtp_close(sm);
            break;
        }
        rc = lmtp_smtp_transaction(sm, from, to, head, headlen, body,
                                   bodylen, deadline, &stage, &late);
        if (rc == SM_OK) {
            sm->sent++;
            return 0;
        }
        lmtp_smtp_close(sm);
        /* a kept connection the MTA closed meanwhile: once more, new */
        if (!(rc == SM_IO && reused && !late))
            break;
    }
    log_error("lmtp: sieve smtp failed host=<%s> to=<%s> stage=<%s> "
              "reply=<%s>%s", imapconf_getstring(sm->conf, "smtp_host"), to,
              stage, sm->reply.len ? buf_cstring(&sm->reply)
                                   : rc == SM_IO ? "connection lost or "
                                                   "timed out" : "",
              late ? " after=<end of data>" : "");
    return -1;
}

void lmtp_smtp_free(struct lmtp_smtp **smp)
{
    struct lmtp_smtp *sm = *smp;

    if (!sm)
        return;
    if (sm->fd >= 0) {
        /* a polite QUIT, not waited for long */
        (void)lmtp_smtp_write(sm, "QUIT\r\n", 6, lmtp_smtp_now() + 100);
        lmtp_smtp_close(sm);
    }
    buf_free(&sm->reply);
    buf_free(&sm->out);
    free(sm);
    *smp = NULL;
}
