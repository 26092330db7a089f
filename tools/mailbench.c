/*
 * mailbench.c - the load tool for LMTP storms and IMAP sessions: main(),
 * the options, the event loop and the connection plumbing.
 *
 *   mailbench lmtp  [common] [lmtp options]
 *   mailbench imap  [common] [imap options]
 *   mailbench mixed [common] [lmtp options] [imap options]
 *
 * (man/mailbench.8 is the manual.)  One process, one thread: every
 * connection is a nonblocking socket registered with one epoll instance,
 * driven by the state machine of its protocol (mailbench_lmtp.c,
 * mailbench_imap.c) through struct mb_conn_ops.  The plumbing here owns
 * the bytes: reads go into a per-connection buffer that the protocol
 * consumes line by line (mailbench_conn_line) or in counted runs
 * (mailbench_conn_skip, for IMAP literals); writes are queued in a
 * per-connection buffer followed by at most one external segment (the
 * shared message body, never copied) and written with writev(), or with
 * SSL_write() on TLS connections (OpenSSL 3, nonblocking: WANT_READ and
 * WANT_WRITE map to the epoll interest set).
 *
 * Invariants: a connection is in the run's open list until
 * mailbench_conn_close(); closed connections are only freed after the
 * current batch of epoll events, so an event for a connection closed
 * earlier in the batch is seen as dead and skipped.  EPOLLOUT is
 * registered exactly while output is pending, a connect is in progress, or
 * OpenSSL asked to write.
 *
 * The run: optional baseline count (--verify), the load (LMTP and/or
 * IMAP pumps open connections as slots free up), the count after, then
 * the report.  Exit 0 all good, 1 errors, 2 usage or setup error.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>

#include <openssl/err.h>

#include "tools/mailbench.h"

#define MB_IN_INITIAL 16384
#define MB_IN_MAX ((size_t)8 << 20)     /* longest line we accept */

static const char *mailbench_progname = "mailbench";

/* ---- small helpers ------------------------------------------------------- */

void mailbench_oom(void)
{
    fprintf(stderr, "%s: out of memory\n", mailbench_progname);
    exit(MB_EXIT_SETUP);
}

void *mailbench_malloc(size_t n)
{
    void *p = malloc(n ? n : 1);

    if (!p)
        mailbench_oom();
    return p;
}

void *mailbench_realloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);

    if (!q)
        mailbench_oom();
    return q;
}

char *mailbench_strdup(const char *s)
{
    char *p = strdup(s);

    if (!p)
        mailbench_oom();
    return p;
}

double mailbench_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* splitmix64: small, fast, and the same sequence for the same seed */
uint64_t mailbench_random(struct mb_run *run)
{
    uint64_t z = (run->rng += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void mailbench_fatal(struct mb_run *run, int code, const char *fmt, ...)
{
    va_list ap;

    if (run->fatal)
        return;             /* the first reason is the one to tell */
    run->fatal = code;
    va_start(ap, fmt);
    vsnprintf(run->fatal_msg, sizeof(run->fatal_msg), fmt, ap);
    va_end(ap);
}

void mailbench_warn(struct mb_run *run, const char *fmt, ...)
{
    va_list ap;

    run->warnings++;
    if (run->warnings > 20)
        return;
    if (run->progress)
        fputs("\r\033[K", stderr);
    fprintf(stderr, "%s: ", mailbench_progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    if (run->warnings == 20)
        fprintf(stderr, "%s: (further errors are counted, not shown)\n",
                mailbench_progname);
}

const char *mailbench_printable(const char *s, size_t len, char *out,
                                size_t outlen)
{
    size_t i;

    if (outlen == 0)
        return "";
    for (i = 0; i < len && i + 1 < outlen; i++)
        out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    out[i] = '\0';
    return out;
}

void mailbench_error_code(struct mb_run *run, int code)
{
    if (code < 0 || code > 999)
        code = 0;
    run->err_code[code]++;
}

void mailbench_error_kind(struct mb_run *run, int kind)
{
    if (kind >= 0 && kind < MB_ERR_COUNT)
        run->err_kind[kind]++;
}

unsigned long mailbench_error_total(const struct mb_run *run)
{
    unsigned long t = 0;

    for (int i = 0; i < 1000; i++)
        t += run->err_code[i];
    for (int i = 0; i < MB_ERR_COUNT; i++)
        t += run->err_kind[i];
    return t;
}

/* ---- targets ------------------------------------------------------------- */

/* /path | unix:/path | host:port | [v6]:port  ->  target->addr */
static int mailbench_target_parse(struct mb_target *t, const char *spec,
                                  char *err, size_t errlen)
{
    const char *path = NULL;

    t->spec = spec;
    memset(&t->addr, 0, sizeof(t->addr));
    if (strncmp(spec, "unix:", 5) == 0)
        path = spec + 5;
    else if (spec[0] == '/' || spec[0] == '.')
        path = spec;
    if (path) {
        struct sockaddr_un *sun = (struct sockaddr_un *)&t->addr;

        if (!*path || strlen(path) >= sizeof(sun->sun_path)) {
            snprintf(err, errlen, "%s target %s: bad socket path", t->proto,
                     spec);
            return -1;
        }
        sun->sun_family = AF_UNIX;
        memcpy(sun->sun_path, path, strlen(path) + 1);
        t->addrlen = (socklen_t)sizeof(*sun);
        return 0;
    }

    char host[256];
    const char *port;
    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');

        if (!close || close[1] != ':' || (size_t)(close - spec - 1) >= sizeof(host)) {
            snprintf(err, errlen, "%s target %s: expected [v6addr]:port",
                     t->proto, spec);
            return -1;
        }
        memcpy(host, spec + 1, (size_t)(close - spec - 1));
        host[close - spec - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(spec, ':');

        if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof(host)) {
            snprintf(err, errlen, "%s target %s: expected /socket/path, "
                     "unix:/path, host:port or [v6addr]:port", t->proto, spec);
            return -1;
        }
        memcpy(host, spec, (size_t)(colon - spec));
        host[colon - spec] = '\0';
        port = colon + 1;
    }
    if (!*port) {
        snprintf(err, errlen, "%s target %s: no port", t->proto, spec);
        return -1;
    }

    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    int r = getaddrinfo(host, port, &hints, &res);
    if (r != 0 || !res) {
        snprintf(err, errlen, "%s target %s: %s", t->proto, spec,
                 gai_strerror(r));
        return -1;
    }
    memcpy(&t->addr, res->ai_addr, res->ai_addrlen);
    t->addrlen = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

/* ---- connections ---------------------------------------------------------- */

static void mailbench_conn_events(struct mb_conn *c)
{
    uint32_t want = EPOLLIN;
    struct epoll_event ev;

    if (c->dead)
        return;
    if (!c->connected || c->ssl_want_write
        || c->out.len > c->out_off || c->ext_off < c->ext_len)
        want |= EPOLLOUT;
    if (want == c->events)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.events = want;
    ev.data.ptr = c;
    if (epoll_ctl(c->run->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->events = want;
}

int mailbench_conn_open(struct mb_run *run, struct mb_target *target,
                        int kind, const struct mb_conn_ops *ops,
                        struct mb_conn **c_r)
{
    int family = target->addr.ss_family;
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    *c_r = NULL;
    if (fd < 0) {
        mailbench_error_kind(run, MB_ERR_CONNECT);
        mailbench_fatal(run, MB_EXIT_ERRORS, "socket: %s", strerror(errno));
        return -1;
    }
    if (family != AF_UNIX) {
        int one = 1;

        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    int r = connect(fd, (struct sockaddr *)&target->addr, target->addrlen);
    /* even a connect that completed at once is reported through the
     * first EPOLLOUT, so that ops->connected runs from the loop */
    int connected = 0;
    if (r < 0 && errno != EINPROGRESS) {
        int e = errno;

        close(fd);
        if (e == EAGAIN && family == AF_UNIX)
            return 1;       /* the listener's backlog is full */
        mailbench_error_kind(run, MB_ERR_CONNECT);
        target->failures_in_row++;
        if (!target->ever_ready)
            mailbench_fatal(run, MB_EXIT_SETUP, "cannot connect to %s "
                            "target %s: %s", target->proto, target->spec,
                            strerror(e));
        else if (target->failures_in_row >= 50)
            mailbench_fatal(run, MB_EXIT_ERRORS, "%s target %s: %u connects "
                            "failed in a row, the last: %s", target->proto,
                            target->spec, target->failures_in_row,
                            strerror(e));
        return -1;
    }

    struct mb_conn *c = calloc(1, sizeof(*c));
    if (!c)
        mailbench_oom();
    c->run = run;
    c->ops = ops;
    c->target = target;
    c->kind = kind;
    c->fd = fd;
    c->connected = connected;
    c->t_open = c->t_activity = run->now = mailbench_now();
    c->in_cap = MB_IN_INITIAL;
    c->in = mailbench_malloc(c->in_cap);
    buf_set_max(&c->out, (size_t)64 << 20);

    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.ptr = c;
    if (epoll_ctl(run->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        mailbench_fatal(run, MB_EXIT_ERRORS, "epoll_ctl: %s", strerror(errno));
        close(fd);
        free(c->in);
        free(c);
        return -1;
    }
    c->events = ev.events;
    c->next = run->conns;
    if (run->conns)
        run->conns->prev = c;
    run->conns = c;
    *c_r = c;
    return 0;
}

void mailbench_conn_close(struct mb_conn *c)
{
    struct mb_run *run = c->run;

    if (c->dead)
        return;
    c->dead = 1;
    epoll_ctl(run->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->ssl) {
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        run->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = NULL;
    c->next = run->dead;
    run->dead = c;
}

void mailbench_conn_fail(struct mb_conn *c, int kind, const char *why)
{
    if (c->dead)
        return;
    c->ops->failed(c, kind, why);
    mailbench_conn_close(c);
}

static void mailbench_conn_free_dead(struct mb_run *run)
{
    while (run->dead) {
        struct mb_conn *c = run->dead;

        run->dead = c->next;
        free(c->in);
        buf_free(&c->out);
        free(c->msg.code);
        free(c->uids);
        free(c);
    }
}

void mailbench_conn_write(struct mb_conn *c, const void *data, size_t len)
{
    if (buf_append(&c->out, data, len) < 0)
        mailbench_oom();
}

void mailbench_conn_printf(struct mb_conn *c, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = buf_vprintf(&c->out, fmt, ap);
    va_end(ap);
    if (r < 0)
        mailbench_oom();
}

void mailbench_conn_write_ext(struct mb_conn *c, const char *data, size_t len)
{
    c->ext = data;
    c->ext_len = len;
    c->ext_off = 0;
}

/* Describe the last OpenSSL error. */
static void mailbench_ssl_why(char *out, size_t outlen, const char *what,
                              int sslerr)
{
    unsigned long e = ERR_get_error();
    char detail[256];

    if (e)
        ERR_error_string_n(e, detail, sizeof(detail));
    else if (sslerr == SSL_ERROR_SYSCALL)
        snprintf(detail, sizeof(detail), "%s",
                 errno ? strerror(errno) : "connection closed by the server");
    else
        snprintf(detail, sizeof(detail), "SSL error %d", sslerr);
    ERR_clear_error();
    snprintf(out, outlen, "%s: %s", what, detail);
}

void mailbench_conn_flush(struct mb_conn *c)
{
    char why[320];

    if (c->dead || !c->connected || c->tls_state == 1)
        return;
    while (c->out.len > c->out_off || c->ext_off < c->ext_len) {
        if (c->ssl) {
            const char *p;
            size_t len;
            int n;

            if (c->out.len > c->out_off) {
                p = c->out.s + c->out_off;
                len = c->out.len - c->out_off;
            } else {
                p = c->ext + c->ext_off;
                len = c->ext_len - c->ext_off;
            }
            if (len > INT_MAX)
                len = INT_MAX;
            ERR_clear_error();
            n = SSL_write(c->ssl, p, (int)len);
            if (n <= 0) {
                int e = SSL_get_error(c->ssl, n);

                if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ)
                    break;
                mailbench_ssl_why(why, sizeof(why), "TLS write", e);
                mailbench_conn_fail(c, MB_ERR_CLOSED, why);
                return;
            }
            if (c->out.len > c->out_off)
                c->out_off += (size_t)n;
            else
                c->ext_off += (size_t)n;
        } else {
            struct iovec iov[2];
            int niov = 0;
            ssize_t n;

            if (c->out.len > c->out_off) {
                iov[niov].iov_base = c->out.s + c->out_off;
                iov[niov++].iov_len = c->out.len - c->out_off;
            }
            if (c->ext_off < c->ext_len) {
                iov[niov].iov_base = (void *)(c->ext + c->ext_off);
                iov[niov++].iov_len = c->ext_len - c->ext_off;
            }
            n = writev(c->fd, iov, niov);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK)
                    break;
                snprintf(why, sizeof(why), "write: %s", strerror(errno));
                mailbench_conn_fail(c, MB_ERR_CLOSED, why);
                return;
            }
            size_t left = (size_t)n;
            size_t first = c->out.len - c->out_off;
            if (left >= first) {
                c->out_off = c->out.len;
                left -= first;
                c->ext_off += left;
            } else {
                c->out_off += left;
            }
        }
    }
    if (c->out_off == c->out.len && c->ext_off == c->ext_len) {
        int had = c->out.len > 0 || c->ext_len > 0;

        buf_reset(&c->out);
        c->out_off = 0;
        c->ext = NULL;
        c->ext_len = c->ext_off = 0;
        if (had && c->ops->sent)
            c->ops->sent(c);
    }
    mailbench_conn_events(c);
}

int mailbench_conn_line(struct mb_conn *c, const char **line_r, size_t *len_r)
{
    const char *start = c->in + c->in_off;
    size_t avail = c->in_len - c->in_off;
    const char *nl = memchr(start, '\n', avail);
    size_t len;

    if (!nl)
        return 0;
    len = (size_t)(nl - start);
    c->in_off += len + 1;
    if (len > 0 && start[len - 1] == '\r')
        len--;
    *line_r = start;
    *len_r = len;
    return 1;
}

size_t mailbench_conn_skip(struct mb_conn *c, size_t n)
{
    size_t avail = c->in_len - c->in_off;

    if (n > avail)
        n = avail;
    c->in_off += n;
    return n;
}

/* Room for more input: drop what was consumed, grow when full. */
static int mailbench_conn_in_room(struct mb_conn *c)
{
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_len == c->in_cap) {
        if (c->in_cap >= MB_IN_MAX)
            return -1;
        c->in_cap *= 2;
        c->in = mailbench_realloc(c->in, c->in_cap);
    }
    return 0;
}

static void mailbench_conn_handshake(struct mb_conn *c)
{
    char why[320];
    int r;

    ERR_clear_error();
    r = SSL_do_handshake(c->ssl);
    if (r == 1) {
        c->tls_state = 2;
        c->ssl_want_write = 0;
        c->t_activity = c->run->now;
        if (c->tls_implicit)
            c->ops->connected(c);
        else
            c->ops->tls_ready(c);
        if (!c->dead)
            mailbench_conn_flush(c);
        return;
    }
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        c->ssl_want_write = (e == SSL_ERROR_WANT_WRITE);
        mailbench_conn_events(c);
        return;
    }
    mailbench_ssl_why(why, sizeof(why), "TLS handshake", e);
    mailbench_conn_fail(c, MB_ERR_TLS, why);
}

void mailbench_conn_starttls(struct mb_conn *c)
{
    if (c->in_len > c->in_off) {
        /* bytes after the STARTTLS reply in the clear: refuse them */
        mailbench_conn_fail(c, MB_ERR_PROTOCOL,
                            "data in the clear after the STARTTLS reply");
        return;
    }
    c->ssl = SSL_new(c->run->ssl_ctx);
    if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1) {
        mailbench_conn_fail(c, MB_ERR_TLS, "cannot set up TLS");
        return;
    }
    SSL_set_connect_state(c->ssl);
    c->tls_state = 1;
    mailbench_conn_handshake(c);
}

/* Read everything available; 1 when the input handler should run. */
static int mailbench_conn_read(struct mb_conn *c)
{
    char why[320];
    int got = 0;

    for (;;) {
        if (mailbench_conn_in_room(c) < 0) {
            mailbench_conn_fail(c, MB_ERR_PROTOCOL,
                                "a response line longer than 8 MB");
            return 0;
        }
        size_t room = c->in_cap - c->in_len;
        if (c->ssl) {
            ERR_clear_error();
            int n = SSL_read(c->ssl, c->in + c->in_len,
                             room > INT_MAX ? INT_MAX : (int)room);
            if (n > 0) {
                c->in_len += (size_t)n;
                got = 1;
                c->ssl_want_write = 0;
                continue;
            }
            int e = SSL_get_error(c->ssl, n);
            if (e == SSL_ERROR_WANT_READ) {
                c->ssl_want_write = 0;
                break;
            }
            if (e == SSL_ERROR_WANT_WRITE) {
                c->ssl_want_write = 1;
                break;
            }
            if (got)
                c->ops->input(c);
            if (c->dead)
                return 0;
            if (e == SSL_ERROR_ZERO_RETURN)
                snprintf(why, sizeof(why), "connection closed by the server");
            else
                mailbench_ssl_why(why, sizeof(why), "TLS read", e);
            mailbench_conn_fail(c, MB_ERR_CLOSED, why);
            return 0;
        }
        ssize_t n = read(c->fd, c->in + c->in_len, room);
        if (n > 0) {
            c->in_len += (size_t)n;
            got = 1;
            if ((size_t)n < room)
                break;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (got)
            c->ops->input(c);
        if (c->dead)
            return 0;
        if (n == 0)
            snprintf(why, sizeof(why), "connection closed by the server");
        else
            snprintf(why, sizeof(why), "read: %s", strerror(errno));
        mailbench_conn_fail(c, MB_ERR_CLOSED, why);
        return 0;
    }
    if (got)
        c->t_activity = c->run->now;
    return got;
}

static void mailbench_conn_event(struct mb_conn *c, uint32_t events)
{
    char why[320];

    if (!c->connected) {
        int err = 0;
        socklen_t len = sizeof(err);

        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err == 0 && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0)
            return;
        if (err) {
            struct mb_target *t = c->target;

            t->failures_in_row++;
            if (!t->ever_ready)
                mailbench_fatal(c->run, MB_EXIT_SETUP, "cannot connect to "
                                "%s target %s: %s", t->proto, t->spec,
                                strerror(err));
            snprintf(why, sizeof(why), "connect: %s", strerror(err));
            mailbench_conn_fail(c, MB_ERR_CONNECT, why);
            return;
        }
        c->connected = 1;
        c->t_activity = c->run->now;
        if (c->target->tls) {
            c->ssl = SSL_new(c->run->ssl_ctx);
            if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1) {
                mailbench_conn_fail(c, MB_ERR_TLS, "cannot set up TLS");
                return;
            }
            SSL_set_connect_state(c->ssl);
            c->tls_state = 1;
            c->tls_implicit = 1;
            mailbench_conn_handshake(c);
            return;
        }
        c->ops->connected(c);
        if (!c->dead)
            mailbench_conn_flush(c);
        return;
    }
    if (c->tls_state == 1) {
        mailbench_conn_handshake(c);
        if (c->dead || c->tls_state == 1)
            return;
    }
    if (events & EPOLLOUT)
        mailbench_conn_flush(c);
    if (c->dead)
        return;
    if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        || (c->ssl && (c->ssl_want_write || SSL_pending(c->ssl)))) {
        if (mailbench_conn_read(c)) {
            c->ops->input(c);
            if (!c->dead)
                mailbench_conn_flush(c);
        }
    }
    if (!c->dead)
        mailbench_conn_events(c);
}

/* A connection that made no progress for --timeout seconds fails. */
static void mailbench_conn_timeouts(struct mb_run *run)
{
    struct mb_conn *c = run->conns;
    char why[128];

    while (c) {
        struct mb_conn *next = c->next;

        /* before the target ever worked, a silent server is most likely
         * the wrong kind of port (TLS or not): say so sooner */
        double limit = run->opt.timeout;
        if (!c->target->ever_ready && limit > 15)
            limit = 15;
        if (run->now - c->t_activity > limit) {
            if (c->target->ever_ready)
                snprintf(why, sizeof(why), "no answer from the server for "
                         "%.0f s", limit);
            else
                snprintf(why, sizeof(why), "no answer from the server for "
                         "%.0f s (%s)", limit, c->target->tls
                         ? "is it a TLS port?"
                         : "a TLS port? see --lmtp-tls / --imap-tls");
            mailbench_conn_fail(c, MB_ERR_TIMEOUT, why);
        }
        c = next;
    }
}

/* ---- the loop ------------------------------------------------------------- */

/* Run the event loop until pump() says the phase is over and no
 * connection is open, or the run stops. */
static void mailbench_loop(struct mb_run *run, int (*pump)(struct mb_run *))
{
    struct epoll_event evs[256];
    double next_timeout_check = mailbench_now() + 0.25;

    for (;;) {
        run->now = mailbench_now();
        int more = pump(run);
        if (run->fatal) {
            /* close everything: the run is over */
            while (run->conns) {
                struct mb_conn *c = run->conns;

                mailbench_conn_close(c);
            }
            mailbench_conn_free_dead(run);
            break;
        }
        if (!more && !run->conns)
            break;
        /* a pump waiting out a full listen queue: come back soon */
        int wait_ms = 50;
        if (run->lmtp.next_connect > run->now
            || run->imap.next_connect > run->now
            || run->verify.next_connect > run->now)
            wait_ms = 5;
        if (run->lmtp.paced)            /* --lmtp-rate: the next is due */
            wait_ms = mailbench_lmtp_due_ms(run, wait_ms);
        int n = epoll_wait(run->epfd, evs, 256, wait_ms);
        if (n < 0 && errno != EINTR) {
            mailbench_fatal(run, MB_EXIT_ERRORS, "epoll_wait: %s",
                            strerror(errno));
            continue;
        }
        run->now = mailbench_now();
        for (int i = 0; i < n; i++) {
            struct mb_conn *c = evs[i].data.ptr;

            if (!c->dead)
                mailbench_conn_event(c, evs[i].events);
        }
        if (run->now >= next_timeout_check) {
            mailbench_conn_timeouts(run);
            next_timeout_check = run->now + 0.25;
        }
        mailbench_conn_free_dead(run);
        if (run->progress && run->now >= run->next_progress) {
            mailbench_progress(run, 0);
            run->next_progress = run->now + 0.5;
        }
    }
}

static int mailbench_run_pump(struct mb_run *run)
{
    int more = 0;

    if (run->opt.mode != MB_MODE_IMAP) {
        more |= mailbench_lmtp_pump(run);
        if (!more && run->opt.mode == MB_MODE_MIXED)
            run->imap.stop = 1;
    }
    if (run->opt.mode != MB_MODE_LMTP)
        more |= mailbench_imap_pump(run);
    return more;
}

/* ---- options -------------------------------------------------------------- */

static void mailbench_usage(FILE *f)
{
    fprintf(f,
"usage: mailbench lmtp|imap|mixed [options]   (see mailbench(8))\n"
"targets: /path | unix:/path | host:port | [v6addr]:port\n"
"  --lmtp TARGET  --imap TARGET  --lmtp-tls --imap-tls\n"
"  --lmtp-starttls --imap-starttls (certificates are not verified)\n"
"common: -c N conns (10)  -q  --json FILE  --csv FILE  --plot FILE.png\n"
"  --label TEXT  --seed N  --timeout SECONDS (60)\n"
"lmtp: -n N msgs (2000)  -s BYTES (13870)  -r R rcpts (1)  -m M mailboxes (n)\n"
"  --user FMT (u%%04d)  --domain D (example.com)  --from ADDR  --from-each\n"
"  --dup PCT (0)  --lhlo NAME  -k (one connection per message)\n"
"  --lmtp-rate MSGS_PER_S (as fast as the server takes them)\n"
"imap: --sessions N (10)  --imap-n N (100)  --users K (100)  --password P\n"
"  --auth login|plain  --mix fetchhdr=4,fetchbody=2,store=2,search=1,expunge=1\n"
"       (and append=W)\n"
"  --ops N (10)\n"
"verification: --verify none|imap|cmd:PROGRAM  --dedup yes|no (yes)\n");
}

static int mailbench_usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static int mailbench_usage_error(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: ", mailbench_progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (mailbench --help)\n");
    return MB_EXIT_SETUP;
}

static int mailbench_parse_ulong(const char *s, const char *what,
                                 unsigned long min, unsigned long max,
                                 unsigned long *out)
{
    char *end;
    unsigned long v;

    errno = 0;
    if (!s || !*s || *s == '-')
        return mailbench_usage_error("%s: expected a number, got \"%s\"",
                                     what, s ? s : "");
    v = strtoul(s, &end, 10);
    if (errno || *end)
        return mailbench_usage_error("%s: expected a number, got \"%s\"",
                                     what, s);
    if (v < min || v > max)
        return mailbench_usage_error("%s: %lu is out of range (%lu..%lu)",
                                     what, v, min, max);
    *out = v;
    return 0;
}

static int mailbench_parse_mix(struct mb_options *o, const char *spec)
{
    static const char *names[MB_OP_COUNT] = {
        "fetchhdr", "fetchbody", "store", "search", "expunge", "append"
    };
    char *copy = mailbench_strdup(spec), *save = NULL, *tok;
    unsigned total = 0;
    int r = 0;

    memset(o->weights, 0, sizeof(o->weights));
    for (tok = strtok_r(copy, ",", &save); tok && !r;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        int found = -1;
        unsigned long w;

        if (!eq) {
            r = mailbench_usage_error("--mix: \"%s\" is not NAME=WEIGHT", tok);
            break;
        }
        *eq = '\0';
        for (int i = 0; i < MB_OP_COUNT; i++)
            if (strcmp(tok, names[i]) == 0)
                found = i;
        if (found < 0) {
            r = mailbench_usage_error("--mix: unknown operation \"%s\" "
                                      "(fetchhdr, fetchbody, store, search, "
                                      "expunge, append)", tok);
            break;
        }
        if (mailbench_parse_ulong(eq + 1, "--mix weight", 0, 1000, &w)) {
            r = MB_EXIT_SETUP;
            break;
        }
        o->weights[found] = (unsigned)w;
        total += (unsigned)w;
    }
    if (!r && total == 0)
        r = mailbench_usage_error("--mix: every weight is 0");
    free(copy);
    return r;
}

/* A printf format with exactly one integer conversion (%d, %04d, %u...)
 * and nothing else that consumes an argument. */
static int mailbench_check_user_fmt(const char *fmt)
{
    int convs = 0;

    for (const char *p = fmt; *p; p++) {
        if (*p != '%')
            continue;
        p++;
        if (*p == '%')
            continue;
        while (*p && strchr("-+ #0", *p))
            p++;
        while (*p >= '0' && *p <= '9')
            p++;
        if (*p == 'l')
            p++;
        if (!*p || !strchr("diux", *p))
            return -1;
        convs++;
    }
    return convs == 1 ? 0 : -1;
}

enum {
    OPT_LMTP = 256, OPT_IMAP, OPT_LMTP_TLS, OPT_IMAP_TLS, OPT_LMTP_STARTTLS,
    OPT_IMAP_STARTTLS, OPT_JSON, OPT_CSV, OPT_PLOT, OPT_LABEL, OPT_SEED,
    OPT_USER, OPT_DOMAIN, OPT_FROM, OPT_FROM_EACH, OPT_DUP, OPT_LHLO, OPT_SESSIONS,
    OPT_IMAP_N, OPT_USERS, OPT_PASSWORD, OPT_AUTH, OPT_MIX, OPT_OPS,
    OPT_VERIFY, OPT_DEDUP, OPT_TIMEOUT, OPT_LMTP_RATE, OPT_HELP
};

static const struct option mailbench_longopts[] = {
    { "lmtp", required_argument, NULL, OPT_LMTP },
    { "imap", required_argument, NULL, OPT_IMAP },
    { "lmtp-tls", no_argument, NULL, OPT_LMTP_TLS },
    { "imap-tls", no_argument, NULL, OPT_IMAP_TLS },
    { "lmtp-starttls", no_argument, NULL, OPT_LMTP_STARTTLS },
    { "imap-starttls", no_argument, NULL, OPT_IMAP_STARTTLS },
    { "json", required_argument, NULL, OPT_JSON },
    { "csv", required_argument, NULL, OPT_CSV },
    { "plot", required_argument, NULL, OPT_PLOT },
    { "label", required_argument, NULL, OPT_LABEL },
    { "seed", required_argument, NULL, OPT_SEED },
    { "user", required_argument, NULL, OPT_USER },
    { "domain", required_argument, NULL, OPT_DOMAIN },
    { "from", required_argument, NULL, OPT_FROM },
    { "from-each", no_argument, NULL, OPT_FROM_EACH },
    { "dup", required_argument, NULL, OPT_DUP },
    { "lmtp-rate", required_argument, NULL, OPT_LMTP_RATE },
    { "lhlo", required_argument, NULL, OPT_LHLO },
    { "sessions", required_argument, NULL, OPT_SESSIONS },
    { "imap-n", required_argument, NULL, OPT_IMAP_N },
    { "users", required_argument, NULL, OPT_USERS },
    { "password", required_argument, NULL, OPT_PASSWORD },
    { "auth", required_argument, NULL, OPT_AUTH },
    { "mix", required_argument, NULL, OPT_MIX },
    { "ops", required_argument, NULL, OPT_OPS },
    { "verify", required_argument, NULL, OPT_VERIFY },
    { "dedup", required_argument, NULL, OPT_DEDUP },
    { "timeout", required_argument, NULL, OPT_TIMEOUT },
    { "help", no_argument, NULL, OPT_HELP },
    { NULL, 0, NULL, 0 }
};

/* Is PROGRAM on $PATH (or an executable path)? */
static int mailbench_have_program(const char *prog)
{
    const char *path = getenv("PATH");
    char full[PATH_MAX];

    if (strchr(prog, '/'))
        return access(prog, X_OK) == 0;
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);

        if (len > 0 && len + strlen(prog) + 2 < sizeof(full)) {
            memcpy(full, path, len);
            full[len] = '/';
            strcpy(full + len + 1, prog);
            if (access(full, X_OK) == 0)
                return 1;
        }
        path += len;
        if (*path == ':')
            path++;
    }
    return 0;
}

static int mailbench_parse_args(struct mb_options *o, int argc, char **argv)
{
    unsigned long v;
    int ch;

    memset(o, 0, sizeof(*o));
    o->conns = 10;
    o->seed = 1;
    o->timeout = 60;
    o->msgs = 2000;
    o->size = 13870;
    o->rcpts = 1;
    o->user_fmt = "u%04d";
    o->domain = "example.com";
    o->from = "bench@example.org";
    o->lhlo = "mailbench";
    o->sessions = 10;
    o->imap_n = 100;
    o->users = 100;
    o->password = "pw";
    o->mix = "fetchhdr=4,fetchbody=2,store=2,search=1,expunge=1";
    o->ops = 10;
    o->dedup = 1;
    o->label = "";

    if (argc < 2) {
        mailbench_usage(stderr);
        return MB_EXIT_SETUP;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        mailbench_usage(stdout);
        exit(MB_EXIT_OK);
    }
    if (strcmp(argv[1], "lmtp") == 0)
        o->mode = MB_MODE_LMTP;
    else if (strcmp(argv[1], "imap") == 0)
        o->mode = MB_MODE_IMAP;
    else if (strcmp(argv[1], "mixed") == 0)
        o->mode = MB_MODE_MIXED;
    else
        return mailbench_usage_error("unknown mode \"%s\": lmtp, imap or "
                                     "mixed", argv[1]);

    optind = 2;
    while ((ch = getopt_long(argc, argv, "c:qn:s:r:m:kh", mailbench_longopts,
                             NULL)) != -1) {
        switch (ch) {
        case 'c':
            if (mailbench_parse_ulong(optarg, "-c", 1, 10000, &v))
                return MB_EXIT_SETUP;
            o->conns = (unsigned)v;
            break;
        case 'q': o->quiet = 1; break;
        case 'n':
            if (mailbench_parse_ulong(optarg, "-n", 1, 100000000UL, &o->msgs))
                return MB_EXIT_SETUP;
            break;
        case 's':
            if (mailbench_parse_ulong(optarg, "-s", 1, 256UL << 20, &o->size))
                return MB_EXIT_SETUP;
            break;
        case 'r':
            if (mailbench_parse_ulong(optarg, "-r", 1, 1000, &v))
                return MB_EXIT_SETUP;
            o->rcpts = (unsigned)v;
            break;
        case 'm':
            if (mailbench_parse_ulong(optarg, "-m", 1, 1000000, &o->mailboxes))
                return MB_EXIT_SETUP;
            break;
        case 'k': o->one_per_conn = 1; break;
        case 'h':
        case OPT_HELP:
            mailbench_usage(stdout);
            exit(MB_EXIT_OK);
        case OPT_LMTP: o->lmtp_spec = optarg; break;
        case OPT_IMAP: o->imap_spec = optarg; break;
        case OPT_LMTP_TLS: o->lmtp_tls = 1; break;
        case OPT_IMAP_TLS: o->imap_tls = 1; break;
        case OPT_LMTP_STARTTLS: o->lmtp_starttls = 1; break;
        case OPT_IMAP_STARTTLS: o->imap_starttls = 1; break;
        case OPT_JSON: o->json = optarg; break;
        case OPT_CSV: o->csv = optarg; break;
        case OPT_PLOT: o->plot = optarg; break;
        case OPT_LABEL: o->label = optarg; break;
        case OPT_SEED:
            if (mailbench_parse_ulong(optarg, "--seed", 0, ULONG_MAX, &v))
                return MB_EXIT_SETUP;
            o->seed = v;
            break;
        case OPT_USER: o->user_fmt = optarg; break;
        case OPT_DOMAIN: o->domain = optarg; break;
        case OPT_FROM: o->from = optarg; break;
        case OPT_FROM_EACH: o->from_each = 1; break;
        case OPT_DUP: {
            char *end;

            errno = 0;
            o->dup_pct = strtod(optarg, &end);
            if (errno || *end || !(o->dup_pct >= 0 && o->dup_pct <= 100))
                return mailbench_usage_error("--dup: a percentage 0..100, "
                                             "got \"%s\"", optarg);
            break;
        }
        case OPT_LMTP_RATE: {
            char *end;

            errno = 0;
            o->lmtp_rate = strtod(optarg, &end);
            if (errno || *end || !(o->lmtp_rate > 0 && o->lmtp_rate <= 1e6))
                return mailbench_usage_error("--lmtp-rate: messages per "
                                             "second, above 0, got \"%s\"",
                                             optarg);
            break;
        }
        case OPT_LHLO: o->lhlo = optarg; break;
        case OPT_SESSIONS:
            if (mailbench_parse_ulong(optarg, "--sessions", 1, 10000, &v))
                return MB_EXIT_SETUP;
            o->sessions = (unsigned)v;
            break;
        case OPT_IMAP_N:
            if (mailbench_parse_ulong(optarg, "--imap-n", 1, 100000000UL,
                                      &o->imap_n))
                return MB_EXIT_SETUP;
            break;
        case OPT_USERS:
            if (mailbench_parse_ulong(optarg, "--users", 1, 1000000,
                                      &o->users))
                return MB_EXIT_SETUP;
            break;
        case OPT_PASSWORD: o->password = optarg; break;
        case OPT_AUTH:
            if (strcmp(optarg, "login") == 0)
                o->auth_plain = 0;
            else if (strcmp(optarg, "plain") == 0)
                o->auth_plain = 1;
            else
                return mailbench_usage_error("--auth: login or plain, got "
                                             "\"%s\"", optarg);
            break;
        case OPT_MIX: o->mix = optarg; break;
        case OPT_OPS:
            if (mailbench_parse_ulong(optarg, "--ops", 0, 100000, &v))
                return MB_EXIT_SETUP;
            o->ops = (unsigned)v;
            break;
        case OPT_VERIFY:
            if (strcmp(optarg, "none") == 0)
                o->verify = MB_VERIFY_NONE;
            else if (strcmp(optarg, "imap") == 0)
                o->verify = MB_VERIFY_IMAP;
            else if (strncmp(optarg, "cmd:", 4) == 0 && optarg[4]) {
                o->verify = MB_VERIFY_CMD;
                o->verify_cmd = optarg + 4;
            } else
                return mailbench_usage_error("--verify: none, imap or "
                                             "cmd:PROGRAM, got \"%s\"",
                                             optarg);
            break;
        case OPT_DEDUP:
            if (strcmp(optarg, "yes") == 0)
                o->dedup = 1;
            else if (strcmp(optarg, "no") == 0)
                o->dedup = 0;
            else
                return mailbench_usage_error("--dedup: yes or no, got \"%s\"",
                                             optarg);
            break;
        case OPT_TIMEOUT: {
            char *end;

            errno = 0;
            o->timeout = strtod(optarg, &end);
            if (errno || *end || !(o->timeout > 0 && o->timeout < 1e6))
                return mailbench_usage_error("--timeout: seconds > 0, got "
                                             "\"%s\"", optarg);
            break;
        }
        default:
            return mailbench_usage_error("bad option");
        }
    }
    if (optind < argc)
        return mailbench_usage_error("unexpected argument \"%s\"",
                                     argv[optind]);
    if (mailbench_parse_mix(o, o->mix))
        return MB_EXIT_SETUP;
    if (mailbench_check_user_fmt(o->user_fmt) < 0)
        return mailbench_usage_error("--user: \"%s\" must hold exactly one "
                                     "integer conversion such as %%04d",
                                     o->user_fmt);
    if (o->mode != MB_MODE_IMAP && !o->lmtp_spec)
        return mailbench_usage_error("%s mode needs --lmtp TARGET",
                                     o->mode == MB_MODE_LMTP ? "lmtp"
                                     : "mixed");
    if (o->mode != MB_MODE_LMTP && !o->imap_spec)
        return mailbench_usage_error("%s mode needs --imap TARGET",
                                     o->mode == MB_MODE_IMAP ? "imap"
                                     : "mixed");
    if (o->verify == MB_VERIFY_IMAP && !o->imap_spec)
        return mailbench_usage_error("--verify imap needs --imap TARGET");
    if (o->mode == MB_MODE_IMAP && o->verify != MB_VERIFY_NONE)
        return mailbench_usage_error("--verify checks the LMTP part: lmtp "
                                     "or mixed mode");
    if (o->lmtp_tls && o->lmtp_starttls)
        return mailbench_usage_error("--lmtp-tls and --lmtp-starttls "
                                     "exclude each other");
    if (o->imap_tls && o->imap_starttls)
        return mailbench_usage_error("--imap-tls and --imap-starttls "
                                     "exclude each other");
    if (o->mailboxes == 0)
        o->mailboxes = o->msgs < 1000000 ? o->msgs : 1000000;
    if (o->rcpts > o->mailboxes)
        return mailbench_usage_error("-r %u is more than the %lu mailboxes "
                                     "(-m): recipients would repeat",
                                     o->rcpts, o->mailboxes);
    if (strpbrk(o->from, "<>\r\n ") || strpbrk(o->domain, "<>\r\n @")
        || strpbrk(o->lhlo, "\r\n ") || strpbrk(o->password, "\r\n"))
        return mailbench_usage_error("--from, --domain, --lhlo and "
                                     "--password must not hold spaces, "
                                     "<, > or line ends");
    if (o->plot) {
        size_t l = strlen(o->plot);

        if (l < 5 || strcmp(o->plot + l - 4, ".png") != 0)
            return mailbench_usage_error("--plot: the file name must end "
                                         "in .png");
        if (!mailbench_have_program("gnuplot"))
            return mailbench_usage_error("--plot needs gnuplot, which is not "
                                         "on PATH (Debian: apt-get install "
                                         "gnuplot-nox)");
    }
    return 0;
}

/* ---- main ----------------------------------------------------------------- */

static int mailbench_tls_init(struct mb_run *run)
{
    run->ssl_ctx = SSL_CTX_new(TLS_client_method());
    if (!run->ssl_ctx)
        return -1;
    /* a load tool: certificates are not verified (see the manual) */
    SSL_CTX_set_verify(run->ssl_ctx, SSL_VERIFY_NONE, NULL);
    SSL_CTX_set_mode(run->ssl_ctx, SSL_MODE_ENABLE_PARTIAL_WRITE
                     | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return 0;
}

static int mailbench_verify_phase(struct mb_run *run, int phase)
{
    struct mb_verify_state *v = &run->verify;

    v->phase = phase;
    v->next_user = 0;
    v->done_users = 0;
    memset(v->known, 0, run->nusers * sizeof(*v->known));
    run->phase_name = "verify";
    if (run->opt.verify == MB_VERIFY_CMD)
        return mailbench_verify_cmd(run);
    mailbench_loop(run, mailbench_verify_pump);
    if (run->progress)
        mailbench_progress(run, 1);
    return run->fatal ? -1 : 0;
}

int main(int argc, char **argv)
{
    static struct mb_run run_storage;
    struct mb_run *run = &run_storage;
    struct rusage ru0, ru1;
    char err[512];
    int rc;

    rc = mailbench_parse_args(&run->opt, argc, argv);
    if (rc)
        return rc;
    signal(SIGPIPE, SIG_IGN);
    run->rng = run->opt.seed;
    run->progress = !run->opt.quiet && isatty(2);
    if (gethostname(run->hostname, sizeof(run->hostname) - 1) < 0
        || !run->hostname[0])
        strcpy(run->hostname, "localhost");

    run->lmtp_target.proto = "LMTP";
    run->imap_target.proto = "IMAP";
    if (run->opt.lmtp_spec) {
        if (mailbench_target_parse(&run->lmtp_target, run->opt.lmtp_spec,
                                   err, sizeof(err)) < 0)
            return mailbench_usage_error("%s", err);
        run->lmtp_target.tls = run->opt.lmtp_tls;
        run->lmtp_target.starttls = run->opt.lmtp_starttls;
    }
    if (run->opt.imap_spec) {
        if (mailbench_target_parse(&run->imap_target, run->opt.imap_spec,
                                   err, sizeof(err)) < 0)
            return mailbench_usage_error("%s", err);
        run->imap_target.tls = run->opt.imap_tls;
        run->imap_target.starttls = run->opt.imap_starttls;
    }
    if (mailbench_tls_init(run) < 0) {
        fprintf(stderr, "%s: cannot set up OpenSSL\n", mailbench_progname);
        return MB_EXIT_SETUP;
    }
    run->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (run->epfd < 0) {
        fprintf(stderr, "%s: epoll_create1: %s\n", mailbench_progname,
                strerror(errno));
        return MB_EXIT_SETUP;
    }
    if (run->opt.mode != MB_MODE_IMAP && mailbench_lmtp_init(run) < 0) {
        fprintf(stderr, "%s: %s\n", mailbench_progname, run->fatal_msg);
        return MB_EXIT_SETUP;
    }
    if (run->opt.mode != MB_MODE_LMTP)
        mailbench_imap_init(run);

    /* the count before */
    if (run->opt.verify != MB_VERIFY_NONE) {
        if (mailbench_verify_phase(run, 0) < 0) {
            fprintf(stderr, "%s: verify (count before the run): %s\n",
                    mailbench_progname, run->fatal_msg);
            return MB_EXIT_SETUP;
        }
        /* the verification's logins count as setup: forget their figures */
        for (int i = 0; i < MB_LAT_COUNT; i++)
            run->lat[i].n = 0;
        if (run->verify.failures) {
            fprintf(stderr, "%s: verify: %lu users could not be counted "
                    "before the run\n", mailbench_progname,
                    run->verify.failures);
            return MB_EXIT_SETUP;
        }
        memcpy(run->verify.baseline, run->verify.found,
               run->nusers * sizeof(*run->verify.found));
    }

    /* the run */
    mailbench_host_read(&run->host_start);
    getrusage(RUSAGE_SELF, &ru0);
    run->t_run_start = mailbench_now();
    run->lmtp.t_start = run->imap.t_start = run->t_run_start;
    run->phase_name = "run";
    run->next_progress = run->t_run_start + 0.5;
    mailbench_loop(run, mailbench_run_pump);
    run->t_run_end = mailbench_now();
    getrusage(RUSAGE_SELF, &ru1);
    mailbench_host_read(&run->host_end);
    run->self_cpu_s =
        (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec)
        + (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6
        + (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec)
        + (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
    if (run->progress)
        mailbench_progress(run, 1);
    if (run->fatal == MB_EXIT_SETUP) {
        fprintf(stderr, "%s: %s\n", mailbench_progname, run->fatal_msg);
        return MB_EXIT_SETUP;
    }
    if (run->fatal) {
        fprintf(stderr, "%s: run stopped: %s\n", mailbench_progname,
                run->fatal_msg);
    }

    /* the count after */
    if (run->opt.verify != MB_VERIFY_NONE && !run->fatal) {
        if (mailbench_verify_phase(run, 1) < 0)
            fprintf(stderr, "%s: verify (count after the run): %s\n",
                    mailbench_progname, run->fatal_msg);
        else
            mailbench_verify_compare(run);
    }

    int outrc = mailbench_report(run);
    rc = MB_EXIT_OK;
    if (run->fatal || mailbench_error_total(run) > 0
        || run->lmtp.failed_msgs > 0 || run->verify.mismatches > 0
        || run->verify.failures > 0)
        rc = MB_EXIT_ERRORS;
    if (outrc < 0 && rc == MB_EXIT_OK)
        rc = MB_EXIT_ERRORS;

    mailbench_lmtp_free(run);
    mailbench_imap_free(run);
    mailbench_report_free(run);
    SSL_CTX_free(run->ssl_ctx);
    close(run->epfd);
    return rc;
}
