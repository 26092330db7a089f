/*
 * prot.c - the protocol stream of a server connection (see prot.h).
 *
 * Invariants:
 * - The input buffer holds in[in_start .. in_end): bytes received and not
 *   yet handed to the caller.  They are always application bytes (after
 *   TLS decryption).  A fill reads as much as the kernel has (up to the
 *   free space), never one byte at a time: a 14 KB message sent as lines
 *   costs a handful of recv() calls, not one per line.
 * - The descriptor is never switched to non-blocking mode (it is borrowed
 *   and may be shared); instead every socket call is made with
 *   MSG_DONTWAIT and a poll() with the timeout runs only when the kernel
 *   says "would block".  So a timeout holds even when a TLS record arrives
 *   only in part.  For a descriptor that is not a socket (a pipe when run
 *   by hand) read()/write() are used after poll() says ready.
 * - TLS goes through a small BIO of our own on the same descriptor, with
 *   the same non-blocking calls; OpenSSL reports WANT_READ/WANT_WRITE and
 *   we poll.  send() uses MSG_NOSIGNAL, so a closed peer is an EPIPE, not
 *   a signal (non-sockets still need SIGPIPE ignored, as prot.h says).
 * - Write errors (and write timeouts) are sticky: p->write_error stays set
 *   and later output is dropped.  Read EOF and read errors are sticky as
 *   well; a read timeout is not.
 * - A timeout bounds each wait for the peer (an inactivity timeout), not
 *   a whole call.  Bytes of a partial line read before a timeout are lost
 *   to the caller; the connection is expected to be closed then.
 * - prot_starttls() empties the input buffer before the handshake: what
 *   the client sent after its STARTTLS line never reaches the protocol.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "lib/prot.h"
#include "lib/tls.h"

struct prot {
    int fd;
    int timeout;                /* seconds, 0 = forever */
    int notsock;                /* fd is not a socket: read()/write() */
    int (*interrupt)(void);     /* prot_set_interrupt(), or NULL */
    int mem;                    /* prot_new_mem(): no descriptor at all */

    unsigned char *in;          /* PROT_BUFSIZE bytes */
    size_t in_start, in_end;
    int read_eof;               /* sticky: peer closed */
    int read_error;             /* sticky: PROT_IOERROR */

    unsigned char *out;         /* PROT_BUFSIZE bytes */
    size_t out_len;
    int write_error;            /* sticky: 0 or PROT_TIMEOUT/PROT_IOERROR */

    SSL *ssl;
    char *tls_info;
    int tls_ssf;

    unsigned long long bytes_in, bytes_out;
    char error[256];
};

static void prot_seterror(struct prot *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void prot_seterror(struct prot *p, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(p->error, sizeof(p->error), fmt, ap);
    va_end(ap);
}

/* The first queued OpenSSL error as text (the queue is cleared). */
static void prot_ssl_reason(char *out, size_t outlen)
{
    unsigned long e = ERR_get_error();

    if (e == 0)
        snprintf(out, outlen, "unknown TLS error");
    else
        ERR_error_string_n(e, out, outlen);
    ERR_clear_error();
}

struct prot *prot_new(int fd)
{
    struct prot *p = calloc(1, sizeof(*p));

    if (!p)
        return NULL;
    p->in = malloc(PROT_BUFSIZE);
    p->out = malloc(PROT_BUFSIZE);
    if (!p->in || !p->out) {
        free(p->in);
        free(p->out);
        free(p);
        return NULL;
    }
    p->fd = fd;
    snprintf(p->error, sizeof(p->error), "no error");
    return p;
}

struct prot *prot_new_mem(const void *data, size_t len)
{
    struct prot *p = calloc(1, sizeof(*p));

    if (!p)
        return NULL;
    /* the whole input at once; read_eof makes prot_fill() stop there, so
     * the buffer is never compacted or refilled and may be of any size */
    p->in = malloc(len > 0 ? len : 1);
    p->out = malloc(PROT_BUFSIZE);
    if (!p->in || !p->out) {
        free(p->in);
        free(p->out);
        free(p);
        return NULL;
    }
    if (len > 0)
        memcpy(p->in, data, len);
    p->in_end = len;
    p->read_eof = 1;
    p->mem = 1;
    p->fd = -1;
    snprintf(p->error, sizeof(p->error), "no error");
    return p;
}

void prot_free(struct prot **pp)
{
    struct prot *p;

    if (!pp || !*pp)
        return;
    p = *pp;
    if (p->ssl) {
        /* close_notify, one non-blocking attempt; the peer may be gone */
        if (!p->write_error)
            (void)SSL_shutdown(p->ssl);
        ERR_clear_error();
        SSL_free(p->ssl);
    }
    free(p->tls_info);
    free(p->in);
    free(p->out);
    free(p);
    *pp = NULL;
}

void prot_set_interrupt(struct prot *p, int (*check)(void))
{
    if (p)
        p->interrupt = check;
}

void prot_settimeout(struct prot *p, int seconds)
{
    p->timeout = seconds > 0 ? seconds : 0;
}

/* ---- low level: non-blocking system calls and waits ---------------- */

static double prot_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Wait until fd is ready for `events` (POLLIN / POLLOUT), at most the
 * timeout.  PROT_OK, PROT_TIMEOUT, PROT_IOERROR, PROT_INTERRUPTED (input
 * only, when the interrupt check says so; it is asked before each wait
 * and at least once a second, so a signal arriving just before poll()
 * is noticed too). */
static int prot_wait(struct prot *p, short events)
{
    double deadline = p->timeout ? prot_now() + p->timeout : 0;
    int (*check)(void) = (events & POLLIN) ? p->interrupt : NULL;

    for (;;) {
        struct pollfd pfd = { .fd = p->fd, .events = events, .revents = 0 };
        int ms = -1;
        int r;

        if (check && check())
            return PROT_INTERRUPTED;
        if (p->timeout) {
            double left = deadline - prot_now();
            if (left <= 0)
                return PROT_TIMEOUT;
            ms = (int)(left * 1000.0) + 1;
        }
        if (check && (ms < 0 || ms > 1000))
            ms = 1000;
        r = poll(&pfd, 1, ms);
        if (r > 0) {
            if (pfd.revents & POLLNVAL) {
                prot_seterror(p, "poll: descriptor %d not open", p->fd);
                return PROT_IOERROR;
            }
            /* POLLHUP/POLLERR: let the read or write report it */
            return PROT_OK;
        }
        if (r == 0) {
            if (check && (!p->timeout || prot_now() < deadline))
                continue;   /* a slice of the wait, not the timeout */
            return PROT_TIMEOUT;
        }
        if (errno != EINTR) {
            prot_seterror(p, "poll: %s", strerror(errno));
            return PROT_IOERROR;
        }
    }
}

/* One non-blocking read: >0 bytes, 0 EOF, -1 with errno (EAGAIN when
 * nothing is there). */
static ssize_t prot_sys_read(struct prot *p, void *data, size_t len)
{
    ssize_t n;

    if (!p->notsock) {
        n = recv(p->fd, data, len, MSG_DONTWAIT);
        if (n >= 0 || errno != ENOTSOCK)
            return n;
        p->notsock = 1;
    }
    {
        struct pollfd pfd = { .fd = p->fd, .events = POLLIN, .revents = 0 };
        if (poll(&pfd, 1, 0) == 0) {
            errno = EAGAIN;
            return -1;
        }
    }
    return read(p->fd, data, len);
}

/* One non-blocking write: bytes written, or -1 with errno. */
static ssize_t prot_sys_write(struct prot *p, const void *data, size_t len)
{
    ssize_t n;

    if (!p->notsock) {
        n = send(p->fd, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0 || errno != ENOTSOCK)
            return n;
        p->notsock = 1;
    }
    {
        struct pollfd pfd = { .fd = p->fd, .events = POLLOUT, .revents = 0 };
        if (poll(&pfd, 1, 0) == 0) {
            errno = EAGAIN;
            return -1;
        }
    }
    /* a pipe that polls writable takes PIPE_BUF bytes without blocking */
    if (len > PIPE_BUF)
        len = PIPE_BUF;
    return write(p->fd, data, len);
}

/* ---- the BIO under OpenSSL ----------------------------------------- */

static int prot_bio_read(BIO *b, char *data, size_t len, size_t *n_r)
{
    struct prot *p = BIO_get_data(b);
    ssize_t n;

    BIO_clear_retry_flags(b);
    *n_r = 0;
    do {
        n = prot_sys_read(p, data, len);
    } while (n < 0 && errno == EINTR);
    if (n > 0) {
        *n_r = (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        BIO_set_retry_read(b);
    else if (n == 0)
        BIO_set_flags(b, BIO_FLAGS_IN_EOF);
    return 0;
}

static int prot_bio_write(BIO *b, const char *data, size_t len, size_t *n_r)
{
    struct prot *p = BIO_get_data(b);
    ssize_t n;

    BIO_clear_retry_flags(b);
    *n_r = 0;
    do {
        n = prot_sys_write(p, data, len);
    } while (n < 0 && errno == EINTR);
    if (n >= 0) {
        *n_r = (size_t)n;
        return 1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        BIO_set_retry_write(b);
    return 0;
}

static long prot_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)num;
    (void)ptr;
    switch (cmd) {
    case BIO_CTRL_FLUSH:
        return 1;       /* nothing is buffered here */
    case BIO_CTRL_EOF:
        return BIO_test_flags(b, BIO_FLAGS_IN_EOF) != 0;
    default:
        return 0;
    }
}

static int prot_bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static BIO_METHOD *prot_bio_method;

static void prot_bio_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOURCE_SINK, "cyrusdeliver prot");

    if (!m)
        return;
    if (!BIO_meth_set_read_ex(m, prot_bio_read)
        || !BIO_meth_set_write_ex(m, prot_bio_write)
        || !BIO_meth_set_ctrl(m, prot_bio_ctrl)
        || !BIO_meth_set_create(m, prot_bio_create)) {
        BIO_meth_free(m);
        return;
    }
    prot_bio_method = m;
}

static BIO_METHOD *prot_bio_get_method(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, prot_bio_method_init);
    return prot_bio_method;
}

/* An SSL call's failure: wait as asked, or give the final result. */
static int prot_ssl_wait(struct prot *p, int ret, const char *what)
{
    int err = SSL_get_error(p->ssl, ret);
    char reason[200];

    switch (err) {
    case SSL_ERROR_WANT_READ:
        return prot_wait(p, POLLIN);
    case SSL_ERROR_WANT_WRITE:
        return prot_wait(p, POLLOUT);
    case SSL_ERROR_ZERO_RETURN:
        ERR_clear_error();
        return PROT_EOF;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0) {
            if (errno == 0 || errno == ECONNRESET) {
                ERR_clear_error();
                return PROT_EOF;
            }
            prot_seterror(p, "%s: %s", what, strerror(errno));
            return PROT_IOERROR;
        }
        prot_ssl_reason(reason, sizeof(reason));
        prot_seterror(p, "%s: %s", what, reason);
        return PROT_IOERROR;
    default:
        prot_ssl_reason(reason, sizeof(reason));
        prot_seterror(p, "%s: %s", what, reason);
        return PROT_IOERROR;
    }
}

/* ---- reading ------------------------------------------------------- */

/* Read more input into the buffer (at least one byte).  PROT_OK, PROT_EOF,
 * PROT_TIMEOUT, PROT_IOERROR. */
static int prot_fill(struct prot *p)
{
    size_t room;

    if (p->read_error)
        return PROT_IOERROR;
    if (p->read_eof)
        return PROT_EOF;
    if (p->in_start == p->in_end) {
        p->in_start = p->in_end = 0;
    } else if (p->in_start > 0 && PROT_BUFSIZE - p->in_end < PROT_BUFSIZE / 4) {
        memmove(p->in, p->in + p->in_start, p->in_end - p->in_start);
        p->in_end -= p->in_start;
        p->in_start = 0;
    }
    room = PROT_BUFSIZE - p->in_end;
    if (room == 0)
        return PROT_OK;      /* full already: nothing to do */

    for (;;) {
        int r;

        if (p->ssl) {
            size_t n = 0;
            int ret;

            errno = 0;
            ret = SSL_read_ex(p->ssl, p->in + p->in_end, room, &n);
            if (ret > 0) {
                p->in_end += n;
                p->bytes_in += n;
                return PROT_OK;
            }
            r = prot_ssl_wait(p, ret, "TLS read");
        } else {
            ssize_t n = prot_sys_read(p, p->in + p->in_end, room);

            if (n > 0) {
                p->in_end += (size_t)n;
                p->bytes_in += (unsigned long long)n;
                return PROT_OK;
            }
            if (n == 0 || errno == ECONNRESET) {
                /* a reset is the peer going away too */
                r = PROT_EOF;
            } else if (errno == EINTR) {
                continue;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                r = prot_wait(p, POLLIN);
            } else {
                prot_seterror(p, "read: %s", strerror(errno));
                r = PROT_IOERROR;
            }
        }
        if (r == PROT_OK)
            continue;
        if (r == PROT_EOF) {
            p->read_eof = 1;
            prot_seterror(p, "read: connection closed by peer");
        } else if (r == PROT_IOERROR) {
            p->read_error = 1;
        } else if (r == PROT_TIMEOUT) {
            prot_seterror(p, "read: timeout after %d seconds", p->timeout);
        }
        return r;
    }
}

int prot_getline(struct prot *p, struct buf *line, size_t maxlen,
                 enum prot_eol *eol_r)
{
    size_t total = 0;        /* bytes of the line seen, without the LF */
    int last_cr = 0;         /* the last byte seen was CR */
    size_t keep = maxlen < SIZE_MAX ? maxlen + 1 : maxlen;

    buf_reset(line);
    if (eol_r)
        *eol_r = PROT_EOL_NONE;

    for (;;) {
        unsigned char *start = p->in + p->in_start;
        size_t avail = p->in_end - p->in_start;
        unsigned char *lf = avail ? memchr(start, '\n', avail) : NULL;
        size_t take = lf ? (size_t)(lf - start) : avail;
        int r;

        /* keep at most maxlen + 1 bytes: the extra one may be the CR */
        if (line->len < keep && take > 0) {
            size_t n = take < keep - line->len ? take : keep - line->len;
            if (buf_append(line, start, n) < 0) {
                prot_seterror(p, "getline: out of memory");
                return PROT_NOMEM;
            }
        }
        if (take > 0) {
            total += take;
            last_cr = start[take - 1] == '\r';
        }
        p->in_start += take;

        if (lf) {
            size_t content = total - (last_cr ? 1 : 0);

            p->in_start++;          /* the LF */
            if (eol_r)
                *eol_r = last_cr ? PROT_EOL_CRLF : PROT_EOL_LF;
            if (content > maxlen) {
                buf_truncate(line, maxlen);
                prot_seterror(p, "getline: line of %zu bytes over the limit"
                              " of %zu", content, maxlen);
                return PROT_TOOLONG;
            }
            buf_truncate(line, content);
            return PROT_OK;
        }

        r = prot_fill(p);
        if (r != PROT_OK) {
            /* EOF (a last line without LF), timeout or error */
            buf_truncate(line, maxlen);
            return r;
        }
    }
}

int prot_getline_view(struct prot *p, size_t maxlen, const char **line_r,
                      size_t *len_r, enum prot_eol *eol_r)
{
    unsigned char *start = p->in + p->in_start, *lf;
    size_t avail = p->in_end - p->in_start, content;
    int crlf;

    if (avail == 0 || (lf = memchr(start, '\n', avail)) == NULL)
        return 0;
    content = (size_t)(lf - start);
    crlf = content > 0 && lf[-1] == '\r';
    if (crlf)
        content--;
    if (content > maxlen)
        return 0;
    *line_r = (const char *)start;
    *len_r = (size_t)(lf - start) + 1;
    *eol_r = crlf ? PROT_EOL_CRLF : PROT_EOL_LF;
    p->in_start += *len_r;
    return 1;
}

int prot_read(struct prot *p, struct buf *out, size_t len)
{
    while (len > 0) {
        size_t avail = p->in_end - p->in_start;
        int r;

        if (avail > 0) {
            size_t n = avail < len ? avail : len;

            if (out && buf_append(out, p->in + p->in_start, n) < 0) {
                prot_seterror(p, "read: out of memory");
                return PROT_NOMEM;
            }
            p->in_start += n;
            len -= n;
            continue;
        }
        r = prot_fill(p);
        if (r != PROT_OK)
            return r;
    }
    return PROT_OK;
}

int prot_read_some(struct prot *p, struct buf *out, size_t max, size_t *n_r)
{
    size_t avail, n;

    *n_r = 0;
    if (max == 0)
        return PROT_OK;
    if (p->in_start == p->in_end) {
        int r = prot_fill(p);
        if (r != PROT_OK)
            return r;
    }
    avail = p->in_end - p->in_start;
    n = avail < max ? avail : max;
    if (buf_append(out, p->in + p->in_start, n) < 0) {
        prot_seterror(p, "read: out of memory");
        return PROT_NOMEM;
    }
    p->in_start += n;
    *n_r = n;
    return PROT_OK;
}

/* One read of what is there, without waiting: 1 bytes added, 0 nothing
 * there yet (or no room), -1 EOF or an error (made sticky). */
static int prot_fill_nowait(struct prot *p)
{
    size_t room;

    if (p->read_error || p->read_eof)
        return -1;
    if (p->in_start == p->in_end) {
        p->in_start = p->in_end = 0;
    } else if (p->in_start > 0) {
        memmove(p->in, p->in + p->in_start, p->in_end - p->in_start);
        p->in_end -= p->in_start;
        p->in_start = 0;
    }
    room = PROT_BUFSIZE - p->in_end;
    if (room == 0)
        return 0;
    for (;;) {
        if (p->ssl) {
            size_t n = 0;
            int ret, err;

            errno = 0;
            ret = SSL_read_ex(p->ssl, p->in + p->in_end, room, &n);
            if (ret > 0) {
                p->in_end += n;
                p->bytes_in += n;
                return 1;
            }
            err = SSL_get_error(p->ssl, ret);
            if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE)
                return 0;
            /* the waiting read reports it properly (EOF or the error) */
            ret = prot_ssl_wait(p, ret, "TLS read");
            if (ret == PROT_EOF) {
                p->read_eof = 1;
                prot_seterror(p, "read: connection closed by peer");
            } else {
                p->read_error = 1;
            }
            return -1;
        } else {
            ssize_t n = prot_sys_read(p, p->in + p->in_end, room);

            if (n > 0) {
                p->in_end += (size_t)n;
                p->bytes_in += (unsigned long long)n;
                return 1;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return 0;
            if (n == 0 || errno == ECONNRESET) {
                p->read_eof = 1;
                prot_seterror(p, "read: connection closed by peer");
            } else {
                prot_seterror(p, "read: %s", strerror(errno));
                p->read_error = 1;
            }
            return -1;
        }
    }
}

int prot_line_ready(struct prot *p)
{
    for (;;) {
        size_t avail = p->in_end - p->in_start;

        if (avail && memchr(p->in + p->in_start, '\n', avail))
            return 1;
        if (p->read_eof || p->read_error)
            return 1;
        if (p->in_start == 0 && p->in_end == PROT_BUFSIZE)
            return 1;                /* a line longer than the buffer */
        if (p->mem)
            return 1;                /* prot_getline() reports the end */
        if (prot_fill_nowait(p) == 0)
            return 0;
    }
}

int prot_pending(const struct prot *p)
{
    if (p->in_end > p->in_start)
        return 1;
    if (p->ssl && SSL_has_pending(p->ssl))
        return 1;
    return 0;
}

/* ---- writing ------------------------------------------------------- */

/* Send out[0 .. out_len).  Sets the sticky error on failure. */
static int prot_send_buffered(struct prot *p)
{
    size_t done = 0;

    if (p->write_error) {
        p->out_len = 0;
        return p->write_error;
    }
    if (p->mem) {               /* prot_new_mem(): output goes nowhere */
        p->bytes_out += p->out_len;
        p->out_len = 0;
        return PROT_OK;
    }
    while (done < p->out_len) {
        int r;

        if (p->ssl) {
            size_t n = 0;
            int ret;

            /* a retried SSL_write gets the same buffer and length */
            errno = 0;
            ret = SSL_write_ex(p->ssl, p->out + done, p->out_len - done, &n);
            if (ret > 0) {
                done += n;
                p->bytes_out += n;
                continue;
            }
            r = prot_ssl_wait(p, ret, "TLS write");
            if (r == PROT_EOF) {
                prot_seterror(p, "TLS write: connection closed by peer");
                r = PROT_IOERROR;
            }
        } else {
            ssize_t n = prot_sys_write(p, p->out + done, p->out_len - done);

            if (n >= 0) {
                done += (size_t)n;
                p->bytes_out += (unsigned long long)n;
                continue;
            }
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                r = prot_wait(p, POLLOUT);
            } else {
                prot_seterror(p, "write: %s", strerror(errno));
                r = PROT_IOERROR;
            }
        }
        if (r == PROT_OK)
            continue;
        if (r == PROT_TIMEOUT)
            prot_seterror(p, "write: timeout after %d seconds", p->timeout);
        p->write_error = r;
        p->out_len = 0;
        return r;
    }
    p->out_len = 0;
    return PROT_OK;
}

void prot_write(struct prot *p, const void *data, size_t len)
{
    const unsigned char *d = data;

    while (len > 0 && !p->write_error) {
        size_t room = PROT_BUFSIZE - p->out_len;
        size_t n = len < room ? len : room;

        memcpy(p->out + p->out_len, d, n);
        p->out_len += n;
        d += n;
        len -= n;
        if (p->out_len == PROT_BUFSIZE)
            (void)prot_send_buffered(p);
    }
}

void prot_puts(struct prot *p, const char *s)
{
    prot_write(p, s, strlen(s));
}

void prot_printf(struct prot *p, const char *fmt, ...)
{
    size_t room = PROT_BUFSIZE - p->out_len;
    va_list ap;
    int n;

    if (p->write_error)
        return;
    /* usually the text fits in the output buffer: format in place */
    va_start(ap, fmt);
    n = vsnprintf((char *)p->out + p->out_len, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < room) {
        p->out_len += (size_t)n;
        if (p->out_len == PROT_BUFSIZE)
            (void)prot_send_buffered(p);
        return;
    }
    {
        struct buf tmp = BUF_INITIALIZER;

        va_start(ap, fmt);
        n = buf_vprintf(&tmp, fmt, ap);
        va_end(ap);
        if (n == 0)
            prot_write(p, tmp.s, tmp.len);
        else
            prot_seterror(p, "printf: out of memory");
        buf_free(&tmp);
    }
}

int prot_flush(struct prot *p)
{
    return prot_send_buffered(p);
}

/* ---- TLS ----------------------------------------------------------- */

int prot_starttls(struct prot *p, struct tls_server *tls,
                  size_t *discarded_r)
{
    SSL_CTX *ctx = tls ? tls_server_ssl_ctx(tls) : NULL;
    BIO_METHOD *meth = prot_bio_get_method();
    const SSL_CIPHER *cipher;
    BIO *bio;
    size_t discarded;
    int r;

    if (discarded_r)
        *discarded_r = 0;
    if (p->mem) {
        prot_seterror(p, "starttls: a memory stream has no connection");
        return PROT_IOERROR;
    }
    if (p->ssl) {
        prot_seterror(p, "starttls: TLS is already active");
        return PROT_IOERROR;
    }
    if (!ctx || !meth) {
        prot_seterror(p, "starttls: no TLS context");
        return PROT_IOERROR;
    }
    r = prot_flush(p);
    if (r != PROT_OK)
        return r;

    /* what the client sent after STARTTLS: never seen by the protocol */
    discarded = p->in_end - p->in_start;
    p->in_start = p->in_end = 0;
    if (discarded_r)
        *discarded_r = discarded;

    ERR_clear_error();
    p->ssl = SSL_new(ctx);
    bio = p->ssl ? BIO_new(meth) : NULL;
    if (!bio) {
        char reason[200];

        prot_ssl_reason(reason, sizeof(reason));
        prot_seterror(p, "starttls: %s", reason);
        SSL_free(p->ssl);
        p->ssl = NULL;
        return PROT_NOMEM;
    }
    BIO_set_data(bio, p);
    SSL_set_bio(p->ssl, bio, bio);
    SSL_set_accept_state(p->ssl);

    for (;;) {
        int ret;

        errno = 0;
        ret = SSL_do_handshake(p->ssl);
        if (ret == 1)
            break;
        r = prot_ssl_wait(p, ret, "TLS handshake");
        if (r == PROT_OK)
            continue;
        if (r == PROT_EOF) {
            prot_seterror(p, "TLS handshake: connection closed by peer");
            r = PROT_IOERROR;
        } else if (r == PROT_TIMEOUT) {
            prot_seterror(p, "TLS handshake: timeout after %d seconds",
                          p->timeout);
        }
        /* no close_notify on a failed handshake */
        SSL_free(p->ssl);
        p->ssl = NULL;
        p->read_error = 1;      /* the stream is unusable now */
        p->write_error = PROT_IOERROR;
        return r;
    }

    cipher = SSL_get_current_cipher(p->ssl);
    p->tls_ssf = cipher ? SSL_CIPHER_get_bits(cipher, NULL) : 0;
    {
        const char *version = SSL_get_version(p->ssl);
        const char *name = cipher ? SSL_CIPHER_get_name(cipher) : "unknown";
        size_t len = strlen(version) + strlen(name) + 2;

        p->tls_info = malloc(len);
        if (p->tls_info)
            snprintf(p->tls_info, len, "%s %s", version, name);
    }
    return PROT_OK;
}

int prot_is_tls(const struct prot *p)
{
    return p->ssl != NULL;
}

const char *prot_tls_info(const struct prot *p)
{
    if (!p->ssl)
        return NULL;
    return p->tls_info ? p->tls_info : "TLS";
}

int prot_tls_ssf(const struct prot *p)
{
    return p->ssl ? p->tls_ssf : 0;
}

const char *prot_error(const struct prot *p)
{
    return p->error;
}

unsigned long long prot_bytes_in(const struct prot *p)
{
    return p->bytes_in;
}

unsigned long long prot_bytes_out(const struct prot *p)
{
    return p->bytes_out;
}
