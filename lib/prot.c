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
 * - Layers, top down: the buffers, then deflate (after
 *   prot_compress_start(): zin/zout), then TLS, then the socket.
 *   prot_raw_read()/prot_raw_write() are the TLS-or-socket level;
 *   prot_inflate_read() and prot_deflate_write() sit on them.  The
 *   input buffer always holds inflated bytes; zin_buf the compressed
 *   ones not yet inflated.  Inflate output per call is bounded by the
 *   buffer's free room.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
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
#include <zlib.h>

#include "lib/prot.h"
#include "lib/tls.h"

struct prot {
    int fd;
    int timeout;                /* seconds, 0 = forever */
    int notsock;                /* fd is not a socket: read()/write() */
    int (*interrupt)(void);     /* prot_set_interrupt(), or NULL */
    int wakefd;                 /* prot_set_wakefd(), or -1 */
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

    /* COMPRESS=DEFLATE (prot_compress_start()), NULL without */
    z_stream *zin, *zout;
    unsigned char *zin_buf;     /* compressed input: zin->next_in points
                                   into it (PROT_BUFSIZE bytes) */
    unsigned char *zout_buf;    /* compressed output on its way out */
    int zout_dirty;             /* bytes went into deflate since the last
                                   sync flush */

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
    p->wakefd = -1;
    snprintf(p->error, sizeof(p->error), "no error");
    return p;
}

struct prot *prot_new_mem(const void *data, size_t len)
{
    struct prot *p = calloc(1, sizeof(*p));

    if (!p)
        return NULL;
    p->wakefd = -1;
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

static void prot_compress_free(struct prot *p)
{
    if (p->zin) {
        inflateEnd(p->zin);
        free(p->zin);
        p->zin = NULL;
    }
    if (p->zout) {
        deflateEnd(p->zout);
        free(p->zout);
        p->zout = NULL;
    }
    free(p->zin_buf);
    free(p->zout_buf);
    p->zin_buf = p->zout_buf = NULL;
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
    prot_compress_free(p);
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

void prot_set_wakefd(struct prot *p, int fd)
{
    if (p)
        p->wakefd = fd;
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
 * only, when the interrupt check says so).  The check is asked before
 * each wait, after a signal and whenever the wake descriptor is readable.
 * Signals are blocked from the check until the wait has begun (ppoll()
 * with the caller's mask), so a signal that comes just after the check
 * ends the wait at once instead of being noticed late: no periodic
 * wake-up is needed, and an idle connection costs no CPU. */
static int prot_wait(struct prot *p, short events)
{
    double deadline = p->timeout ? prot_now() + p->timeout : 0;
    int (*check)(void) = (events & POLLIN) ? p->interrupt : NULL;
    int wakefd = check ? p->wakefd : -1;
    sigset_t all, orig;
    int rc;

    if (check) {
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &orig);
    }
    for (;;) {
        struct pollfd pfd[2] = {
            { .fd = p->fd, .events = events, .revents = 0 },
            { .fd = wakefd, .events = POLLIN, .revents = 0 },
        };
        struct timespec ts, *tsp = NULL;
        int r;

        if (check && check()) {
            rc = PROT_INTERRUPTED;
            break;
        }
        if (p->timeout) {
            double left = deadline - prot_now();
            if (left <= 0) {
                rc = PROT_TIMEOUT;
                break;
            }
            ts.tv_sec = (time_t)left;
            ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
            tsp = &ts;
        }
        r = ppoll(pfd, wakefd >= 0 ? 2 : 1, tsp, check ? &orig : NULL);
        if (r > 0 && pfd[0].revents == 0) {
            if (pfd[1].revents & POLLNVAL)
                wakefd = -1;    /* closed under us: wait without it */
            continue;           /* the wake descriptor: ask the check */
        }
        if (r > 0) {
            if (pfd[0].revents & POLLNVAL) {
                prot_seterror(p, "poll: descriptor %d not open", p->fd);
                rc = PROT_IOERROR;
                break;
            }
            /* POLLHUP/POLLERR: let the read or write report it */
            rc = PROT_OK;
            break;
        }
        if (r == 0) {
            if (p->timeout && prot_now() < deadline)
                continue;   /* woke a little early */
            rc = PROT_TIMEOUT;
            break;
        }
        if (errno != EINTR) {
            prot_seterror(p, "poll: %s", strerror(errno));
            rc = PROT_IOERROR;
            break;
        }
    }
    if (check)
        pthread_sigmask(SIG_SETMASK, &orig, NULL);
    return rc;
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

/* One read from the connection (through TLS when active) into
 * dst[0 .. room), room >= 1.  With wait, waits as the timeout allows
 * and gives at least one byte; without, *n_r is 0 when nothing is there
 * yet.  PROT_OK (*n_r bytes), PROT_EOF, PROT_TIMEOUT, PROT_IOERROR,
 * PROT_INTERRUPTED; EOF and errors are made sticky here. */
static int prot_raw_read(struct prot *p, unsigned char *dst, size_t room,
                         int wait, size_t *n_r)
{
    *n_r = 0;
    for (;;) {
        int r;

        if (p->ssl) {
            size_t n = 0;
            int ret, err;

            errno = 0;
            ret = SSL_read_ex(p->ssl, dst, room, &n);
            if (ret > 0) {
                p->bytes_in += n;
                *n_r = n;
                return PROT_OK;
            }
            err = SSL_get_error(p->ssl, ret);
            if (!wait && (err == SSL_ERROR_WANT_READ
                          || err == SSL_ERROR_WANT_WRITE))
                return PROT_OK;
            r = prot_ssl_wait(p, ret, "TLS read");
        } else {
            ssize_t n = prot_sys_read(p, dst, room);

            if (n > 0) {
                p->bytes_in += (unsigned long long)n;
                *n_r = (size_t)n;
                return PROT_OK;
            }
            if (n == 0 || errno == ECONNRESET) {
                /* a reset is the peer going away too */
                r = PROT_EOF;
            } else if (errno == EINTR) {
                continue;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (!wait)
                    return PROT_OK;
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

/* prot_raw_read() through the deflate layer: inflate into
 * dst[0 .. room) what is buffered compressed, reading more compressed
 * bytes from the connection only when nothing comes out.  However much
 * the compressed bytes expand, at most room bytes come out per call (the
 * rest waits in zlib), so the line and literal limits of the callers
 * apply to the inflated bytes: a small "decompression bomb" costs no
 * more memory than the same bytes sent plainly. */
static int prot_inflate_read(struct prot *p, unsigned char *dst,
                             size_t room, int wait, size_t *n_r)
{
    z_stream *z = p->zin;

    *n_r = 0;
    for (;;) {
        size_t got, used, n;
        int zr, r;

        z->next_out = dst;
        z->avail_out = (uInt)room;
        zr = inflate(z, Z_SYNC_FLUSH);
        got = room - z->avail_out;
        if (zr != Z_OK && zr != Z_BUF_ERROR && zr != Z_STREAM_END) {
            prot_seterror(p, "inflate: %s",
                          z->msg ? z->msg : "invalid compressed data");
            p->read_error = 1;
            return PROT_IOERROR;
        }
        if (got > 0) {
            *n_r = got;
            return PROT_OK;
        }
        if (zr == Z_STREAM_END) {
            /* RFC 4978 has no end of compression: nothing may follow */
            prot_seterror(p, "inflate: the peer ended its compressed "
                          "stream");
            p->read_error = 1;
            return PROT_IOERROR;
        }
        /* all input went in: fetch more compressed bytes */
        used = z->avail_in;
        if (used > 0 && z->next_in != p->zin_buf)
            memmove(p->zin_buf, z->next_in, used);
        if (used == PROT_BUFSIZE) {
            prot_seterror(p, "inflate: no progress");
            p->read_error = 1;
            return PROT_IOERROR;
        }
        r = prot_raw_read(p, p->zin_buf + used, PROT_BUFSIZE - used, wait,
                          &n);
        z->next_in = p->zin_buf;
        z->avail_in = (uInt)(used + n);
        if (r != PROT_OK || n == 0)
            return r;
    }
}

/* Read more input into the buffer (at least one byte).  PROT_OK, PROT_EOF,
 * PROT_TIMEOUT, PROT_IOERROR. */
static int prot_fill(struct prot *p)
{
    size_t room, n = 0;
    int r;

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
    if (p->zin)
        r = prot_inflate_read(p, p->in + p->in_end, room, 1, &n);
    else
        r = prot_raw_read(p, p->in + p->in_end, room, 1, &n);
    if (r == PROT_OK)
        p->in_end += n;
    return r;
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
    size_t room, n = 0;
    int r;

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
    if (p->zin)
        r = prot_inflate_read(p, p->in + p->in_end, room, 0, &n);
    else
        r = prot_raw_read(p, p->in + p->in_end, room, 0, &n);
    if (r != PROT_OK)
        return -1;
    p->in_end += n;
    return n > 0;
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
    /* compressed bytes not inflated yet do not count: they may be only
     * part of a block, and a caller that flushes its output on 0 must
     * not wait for a command that cannot be inflated yet */
    if (p->ssl && SSL_has_pending(p->ssl))
        return 1;
    return 0;
}

/* ---- writing ------------------------------------------------------- */

/* Send data[0 .. len) on the connection (through TLS when active).
 * Sets the sticky error on failure. */
static int prot_raw_write(struct prot *p, const unsigned char *data,
                          size_t len)
{
    size_t done = 0;

    while (done < len) {
        int r;

        if (p->ssl) {
            size_t n = 0;
            int ret;

            /* a retried SSL_write gets the same buffer and length */
            errno = 0;
            ret = SSL_write_ex(p->ssl, data + done, len - done, &n);
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
            ssize_t n = prot_sys_write(p, data + done, len - done);

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
        return r;
    }
    return PROT_OK;
}

/* out[0 .. out_len) through deflate to the connection; with sync, a
 * Z_SYNC_FLUSH ends it (RFC 4978: the peer can inflate everything sent
 * so far). */
static int prot_deflate_write(struct prot *p, int sync)
{
    z_stream *z = p->zout;

    if (p->out_len == 0 && (!sync || !p->zout_dirty))
        return PROT_OK;
    z->next_in = p->out;
    z->avail_in = (uInt)p->out_len;
    p->zout_dirty = 1;
    for (;;) {
        size_t n;
        int zr, r;

        z->next_out = p->zout_buf;
        z->avail_out = PROT_BUFSIZE;
        zr = deflate(z, sync ? Z_SYNC_FLUSH : Z_NO_FLUSH);
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            prot_seterror(p, "deflate: %s", z->msg ? z->msg : "failed");
            p->write_error = PROT_IOERROR;
            return PROT_IOERROR;
        }
        n = PROT_BUFSIZE - z->avail_out;
        if (n > 0) {
            r = prot_raw_write(p, p->zout_buf, n);
            if (r != PROT_OK)
                return r;
        }
        if (z->avail_in == 0 && z->avail_out > 0)
            break;
    }
    if (sync)
        p->zout_dirty = 0;
    return PROT_OK;
}

/* Send out[0 .. out_len) (sync: the deflate layer flushes too).  Sets
 * the sticky error on failure. */
static int prot_send_buffered(struct prot *p, int sync)
{
    int r;

    if (p->write_error) {
        p->out_len = 0;
        return p->write_error;
    }
    if (p->mem) {               /* prot_new_mem(): output goes nowhere */
        p->bytes_out += p->out_len;
        p->out_len = 0;
        return PROT_OK;
    }
    if (p->zout)
        r = prot_deflate_write(p, sync);
    else
        r = prot_raw_write(p, p->out, p->out_len);
    p->out_len = 0;
    return r;
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
            (void)prot_send_buffered(p, 0);
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
            (void)prot_send_buffered(p, 0);
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
    return prot_send_buffered(p, 1);
}

/* ---- COMPRESS=DEFLATE -------------------------------------------------- */

int prot_compress_start(struct prot *p)
{
    size_t pending;
    int r;

    if (p->zin) {
        prot_seterror(p, "compress: compression is already active");
        return PROT_IOERROR;
    }
    if (p->mem) {
        prot_seterror(p, "compress: a memory stream has no connection");
        return PROT_IOERROR;
    }
    /* the reply that accepted COMPRESS goes out uncompressed */
    r = prot_flush(p);
    if (r != PROT_OK)
        return r;
    p->zin = calloc(1, sizeof(*p->zin));
    p->zout = calloc(1, sizeof(*p->zout));
    p->zin_buf = malloc(PROT_BUFSIZE);
    p->zout_buf = malloc(PROT_BUFSIZE);
    if (!p->zin || !p->zout || !p->zin_buf || !p->zout_buf) {
        free(p->zin);
        free(p->zout);
        p->zin = p->zout = NULL;
        prot_compress_free(p);
        prot_seterror(p, "compress: out of memory");
        return PROT_NOMEM;
    }
    /* raw deflate (no zlib header), 32 KiB window, both directions */
    if (inflateInit2(p->zin, -15) != Z_OK) {
        free(p->zin);
        p->zin = NULL;
        prot_compress_free(p);
        prot_seterror(p, "compress: inflateInit2 failed");
        return PROT_NOMEM;
    }
    if (deflateInit2(p->zout, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK) {
        free(p->zout);
        p->zout = NULL;
        prot_compress_free(p);
        prot_seterror(p, "compress: deflateInit2 failed");
        return PROT_NOMEM;
    }
    /* what the client sent after its command line is compressed already */
    pending = p->in_end - p->in_start;
    if (pending)
        memcpy(p->zin_buf, p->in + p->in_start, pending);
    p->in_start = p->in_end = 0;
    p->zin->next_in = p->zin_buf;
    p->zin->avail_in = (uInt)pending;
    return PROT_OK;
}

int prot_is_compressed(const struct prot *p)
{
    return p->zin != NULL;
}

/* ---- TLS ----------------------------------------------------------- */

/* The handshake of prot_starttls() and prot_starttls_client(): hostname
 * NULL = server side. */
static int prot_tls_handshake(struct prot *p, SSL_CTX *ctx,
                              const char *hostname, size_t *discarded_r)
{
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
    if (p->zin) {
        /* TLS would go inside the compressed stream: not allowed */
        prot_seterror(p, "starttls: compression is active");
        return PROT_IOERROR;
    }
    if (!ctx || !meth) {
        prot_seterror(p, "starttls: no TLS context");
        return PROT_IOERROR;
    }
    r = prot_flush(p);
    if (r != PROT_OK)
        return r;

    /* what the peer sent after STARTTLS: never seen by the protocol */
    discarded = p->in_end - p->in_start;
    p->in_start = p->in_end = 0;
    if (discarded_r)
        *discarded_r = discarded;
    if (hostname && discarded) {
        prot_seterror(p, "starttls: the server sent %lu bytes after its "
                      "reply to STARTTLS", (unsigned long)discarded);
        return PROT_IOERROR;
    }

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
    if (hostname) {
        /* the name to verify, and SNI (not for an IP address literal) */
        if (SSL_set1_host(p->ssl, hostname) != 1
            || (!strchr(hostname, ':') && strspn(hostname, "0123456789.")
                != strlen(hostname)
                && SSL_set_tlsext_host_name(p->ssl, hostname) != 1)) {
            char reason[200];

            prot_ssl_reason(reason, sizeof(reason));
            prot_seterror(p, "starttls: host name <%s>: %s", hostname,
                          reason);
            SSL_free(p->ssl);
            p->ssl = NULL;
            return PROT_IOERROR;
        }
        SSL_set_connect_state(p->ssl);
    } else {
        SSL_set_accept_state(p->ssl);
    }

    for (;;) {
        int ret;

        errno = 0;
        ret = SSL_do_handshake(p->ssl);
        if (ret == 1)
            break;
        if (hostname && SSL_get_verify_result(p->ssl) != X509_V_OK) {
            prot_seterror(p, "TLS handshake: certificate of <%s> not "
                          "verified: %s", hostname,
                          X509_verify_cert_error_string(
                              SSL_get_verify_result(p->ssl)));
            ERR_clear_error();
            r = PROT_IOERROR;
        } else {
            r = prot_ssl_wait(p, ret, "TLS handshake");
            if (r == PROT_OK)
                continue;
        }
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

int prot_starttls(struct prot *p, struct tls_server *tls,
                  size_t *discarded_r)
{
    return prot_tls_handshake(p, tls ? tls_server_ssl_ctx(tls) : NULL, NULL,
                              discarded_r);
}

int prot_starttls_client(struct prot *p, struct tls_client *tls,
                         const char *hostname)
{
    if (!hostname || !*hostname) {
        prot_seterror(p, "starttls: no host name to verify");
        return PROT_IOERROR;
    }
    return prot_tls_handshake(p, tls ? tls_client_ssl_ctx(tls) : NULL,
                              hostname, NULL);
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
