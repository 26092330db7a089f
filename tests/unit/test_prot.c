/*
 * test_prot.c - unit tests of lib/prot.c, lib/tls.c and lib/saslserver.c
 * over real sockets (socketpair), with real peers in forked processes:
 * line reading (CRLF, bare LF, NUL bytes, over-long lines, EOF inside a
 * line, timeouts, one byte at a time), exact and partial reads,
 * pipelined input, buffered writes, a closed peer and a peer that does
 * not read; a real TLS handshake against a self-signed certificate made
 * by the openssl command, data both ways, the STARTTLS command injection
 * discard, handshake failures and timeouts; certificate/key loading
 * errors; SASL PLAIN and LOGIN against a sasldb made by saslpasswd2;
 * COMPRESS=DEFLATE against zlib driven by the test itself (pipelined
 * compressed input, a line that inflates to megabytes, sync-flushed
 * output, corrupt input).
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <zlib.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/prot.h"
#include "lib/saslserver.h"
#include "lib/tls.h"
#include "tests/testhelp.h"

/* Made once by the group setup. */
static char *tmpdir;
static char *cert1, *key1;      /* a matching pair, CN=localhost */
static char *cert2, *key2;      /* another pair */

/* ---- helpers ------------------------------------------------------- */

static void make_pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
}

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

/* Fork a child that runs fn(fd, arg) on fd and _exits with its result;
 * the parent gets the pid.  The child closes other_fd first. */
static pid_t fork_peer(int fd, int other_fd, int (*fn)(int fd, void *arg),
                       void *arg)
{
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        th_child_signals();
        alarm(30);          /* never outlive a stuck test */
        close(other_fd);
        _exit(fn(fd, arg));
    }
    close(fd);
    return pid;
}

static void wait_peer(pid_t pid)
{
    int status = 0;
    char text[64];

    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("peer process failed: %s",
                 th_status_text(status, text, sizeof(text)));
}

static void expect_line(struct prot *p, size_t maxlen, int want_r,
                        const char *want, size_t wantlen,
                        enum prot_eol want_eol)
{
    struct buf line = BUF_INITIALIZER;
    enum prot_eol eol = (enum prot_eol)99;
    int r = prot_getline(p, &line, maxlen, &eol);

    assert_int_equal(r, want_r);
    assert_int_equal(line.len, wantlen);
    if (wantlen)
        assert_memory_equal(line.s, want, wantlen);
    assert_int_equal(eol, want_eol);
    buf_free(&line);
}

#define EXPECT(p, max, r, lit, eol) \
    expect_line((p), (max), (r), (lit), sizeof(lit) - 1, (eol))


/* ---- COMPRESS=DEFLATE ----------------------------------------------- */

/* Deflate len bytes with a sync flush, append to out. */
static void z_send(z_stream *z, const void *data, size_t len,
                   struct buf *out)
{
    unsigned char chunk[16384];

    z->next_in = (unsigned char *)data;
    z->avail_in = (uInt)len;
    do {
        z->next_out = chunk;
        z->avail_out = sizeof(chunk);
        assert_true(deflate(z, Z_SYNC_FLUSH) != Z_STREAM_ERROR);
        buf_append(out, chunk, sizeof(chunk) - z->avail_out);
    } while (z->avail_out == 0 || z->avail_in > 0);
}

static void test_compress(void **state)
{
    int sv[2];
    struct prot *p;
    z_stream zc, zd;
    struct buf wire = BUF_INITIALIZER, line = BUF_INITIALIZER;
    struct buf got = BUF_INITIALIZER;
    char *big;
    unsigned char raw[65536], plain[65536];
    size_t bomb = 4u << 20, total = 0;
    (void)state;

    memset(&zc, 0, sizeof(zc));
    memset(&zd, 0, sizeof(zd));
    assert_int_equal(deflateInit2(&zc, 6, Z_DEFLATED, -15, 8,
                                  Z_DEFAULT_STRATEGY), Z_OK);
    assert_int_equal(inflateInit2(&zd, -15), Z_OK);
    make_pair(sv);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);

    /* the command, and a compressed one pipelined right behind it */
    buf_appendcstr(&wire, "a COMPRESS DEFLATE\r\n");
    z_send(&zc, "b NOOP\r\n", 8, &wire);
    assert_int_equal(write_all(sv[1], wire.s, wire.len), 0);
    EXPECT(p, 100, PROT_OK, "a COMPRESS DEFLATE", PROT_EOL_CRLF);
    prot_puts(p, "a OK\r\n");
    assert_int_equal(prot_compress_start(p), PROT_OK);
    assert_int_equal(prot_is_compressed(p), 1);
    assert_int_equal(prot_compress_start(p), PROT_IOERROR);
    /* TLS cannot start inside the compressed stream */
    assert_int_equal(prot_starttls(p, NULL, NULL), PROT_IOERROR);
    assert_non_null(strstr(prot_error(p), "compression"));
    assert_int_equal(read(sv[1], raw, 6), 6);       /* plain OK */
    assert_memory_equal(raw, "a OK\r\n", 6);
    EXPECT(p, 100, PROT_OK, "b NOOP", PROT_EOL_CRLF);

    /* a line inflating to 4 MiB (a few KiB on the wire): too long, the
     * rest skipped, the next line fine */
    big = malloc(bomb);
    assert_non_null(big);
    memset(big, 'A', bomb);
    buf_reset(&wire);
    z_send(&zc, big, bomb, &wire);
    z_send(&zc, "\r\nc NOOP\r\n", 10, &wire);
    assert_true(wire.len < 64 * 1024);
    assert_int_equal(write_all(sv[1], wire.s, wire.len), 0);
    expect_line(p, 1000, PROT_TOOLONG, big, 1000, PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_OK, "c NOOP", PROT_EOL_CRLF);

    /* output: everything written before a flush can be inflated */
    memset(big, 'y', 200000);
    big[199998] = '\r';
    big[199999] = '\n';
    prot_write(p, big, 200000);
    assert_int_equal(prot_flush(p), PROT_OK);
    while (total < 200000) {
        ssize_t n = read(sv[1], raw, sizeof(raw));

        assert_true(n > 0);
        zd.next_in = raw;
        zd.avail_in = (uInt)n;
        do {
            zd.next_out = plain;
            zd.avail_out = sizeof(plain);
            assert_true(inflate(&zd, Z_SYNC_FLUSH) != Z_DATA_ERROR);
            buf_append(&got, plain, sizeof(plain) - zd.avail_out);
            total += sizeof(plain) - zd.avail_out;
        } while (zd.avail_out == 0);
    }
    assert_int_equal(got.len, 200000);
    assert_memory_equal(got.s, big, 200000);
    assert_true(prot_bytes_out(p) < 200000 / 10);

    /* corrupt compressed input: an I/O error, not a crash */
    assert_int_equal(write_all(sv[1], "\xff\xff\xff\xff garbage\r\n", 14), 0);
    assert_int_equal(prot_getline(p, &line, 100, NULL), PROT_IOERROR);
    assert_non_null(strstr(prot_error(p), "inflate"));

    free(big);
    buf_free(&wire);
    buf_free(&line);
    buf_free(&got);
    deflateEnd(&zc);
    inflateEnd(&zd);
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);
}

/* ---- line reading -------------------------------------------------- */

static void test_getline_ends(void **state)
{
    int sv[2];
    struct prot *p;
    static const char in[] =
        "one\r\ntwo\nthree\r\n\r\n\na\rb\r\ntail\r\r\n";
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    assert_non_null(p);
    assert_int_equal(write_all(sv[1], in, sizeof(in) - 1), 0);
    EXPECT(p, 100, PROT_OK, "one", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_OK, "two", PROT_EOL_LF);
    EXPECT(p, 100, PROT_OK, "three", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_OK, "", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_OK, "", PROT_EOL_LF);
    EXPECT(p, 100, PROT_OK, "a\rb", PROT_EOL_CRLF);     /* bare CR kept */
    EXPECT(p, 100, PROT_OK, "tail\r", PROT_EOL_CRLF);
    assert_int_equal(prot_pending(p), 0);
    assert_int_equal(prot_bytes_in(p), sizeof(in) - 1);
    prot_free(&p);
    assert_null(p);
    prot_free(&p);          /* no-op on NULL */
    close(sv[0]);
    close(sv[1]);
}

static void test_getline_nul(void **state)
{
    int sv[2];
    struct prot *p;
    static const char in[] = "x\0y\r\n\0\n";
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    assert_int_equal(write_all(sv[1], in, sizeof(in) - 1), 0);
    EXPECT(p, 100, PROT_OK, "x\0y", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_OK, "\0", PROT_EOL_LF);
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);
}

/* prot_getline_view(): whole buffered lines in place, with their ends;
 * nothing consumed (0) for a line not all there or over the limit, which
 * prot_getline() then returns as before. */
static void test_getline_view(void **state)
{
    int sv[2];
    struct prot *p;
    const char *d = NULL;
    size_t n = 0;
    enum prot_eol eol = (enum prot_eol)99;
    static const char in[] = "one\r\ntwo\na\rb\r\n\r\nlong line\r\npart";
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    assert_non_null(p);
    /* nothing buffered yet: 0, and nothing is read from the socket */
    assert_int_equal(write_all(sv[1], in, sizeof(in) - 1), 0);
    assert_int_equal(prot_getline_view(p, 100, &d, &n, &eol), 0);
    /* a prot_getline() fills the buffer: the rest is there now */
    EXPECT(p, 100, PROT_OK, "one", PROT_EOL_CRLF);
    assert_int_equal(prot_getline_view(p, 100, &d, &n, &eol), 1);
    assert_int_equal(n, 4);
    assert_memory_equal(d, "two\n", 4);
    assert_int_equal(eol, PROT_EOL_LF);
    assert_int_equal(prot_getline_view(p, 100, &d, &n, &eol), 1);
    assert_int_equal(n, 5);
    assert_memory_equal(d, "a\rb\r\n", 5);   /* bare CR kept */
    assert_int_equal(eol, PROT_EOL_CRLF);
    assert_int_equal(prot_getline_view(p, 100, &d, &n, &eol), 1);
    assert_int_equal(n, 2);
    assert_memory_equal(d, "\r\n", 2);
    assert_int_equal(eol, PROT_EOL_CRLF);
    /* 9 bytes over a limit of 8: not consumed; prot_getline() reports it */
    assert_int_equal(prot_getline_view(p, 8, &d, &n, &eol), 0);
    assert_int_equal(prot_getline_view(p, 9, &d, &n, &eol), 1);
    assert_memory_equal(d, "long line\r\n", 11);
    /* a last line without its LF: 0, still there for prot_getline() */
    assert_int_equal(prot_getline_view(p, 100, &d, &n, &eol), 0);
    close(sv[1]);
    EXPECT(p, 100, PROT_EOF, "part", PROT_EOL_NONE);
    prot_free(&p);
    close(sv[0]);
}

static void test_getline_toolong(void **state)
{
    int sv[2];
    struct prot *p;
    static const char in[] =
        "0123456789\r\n"        /* exactly the limit: fine */
        "0123456789\n"
        "0123456789A\r\n"       /* one over */
        "next\r\n"
        "0123456789\rX\n"       /* the CR is not an end here */
        "0123456789\r\r\n"
        "last\n";
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    assert_int_equal(write_all(sv[1], in, sizeof(in) - 1), 0);
    EXPECT(p, 10, PROT_OK, "0123456789", PROT_EOL_CRLF);
    EXPECT(p, 10, PROT_OK, "0123456789", PROT_EOL_LF);
    /* a line too long still tells how it ended (lmtpd's DATA needs it:
     * only a "." after a real CRLF may end a message) */
    EXPECT(p, 10, PROT_TOOLONG, "0123456789", PROT_EOL_CRLF);
    assert_non_null(strstr(prot_error(p), "limit"));
    EXPECT(p, 10, PROT_OK, "next", PROT_EOL_CRLF);
    EXPECT(p, 10, PROT_TOOLONG, "0123456789", PROT_EOL_LF);
    EXPECT(p, 10, PROT_TOOLONG, "0123456789", PROT_EOL_CRLF);
    EXPECT(p, 10, PROT_OK, "last", PROT_EOL_LF);
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);
}

/* A line far longer than the input buffer, written by a peer, then an
 * ordinary line. */
static int peer_long_line(int fd, void *arg)
{
    size_t len = *(size_t *)arg;
    char *data = malloc(len);
    int r;

    if (!data)
        return 3;
    memset(data, 'x', len);
    r = write_all(fd, data, len) || write_all(fd, "\r\nafter\r\n", 9);
    free(data);
    close(fd);
    return r ? 2 : 0;
}

static void test_getline_toolong_big(void **state)
{
    int sv[2];
    struct prot *p;
    struct buf line = BUF_INITIALIZER;
    size_t len = 5 * PROT_BUFSIZE + 123;
    enum prot_eol eol;
    size_t i;
    pid_t pid;
    (void)state;

    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_long_line, &len);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);
    assert_int_equal(prot_getline(p, &line, 4096, &eol), PROT_TOOLONG);
    assert_int_equal(line.len, 4096);
    for (i = 0; i < line.len; i++)
        assert_int_equal(line.s[i], 'x');
    assert_int_equal(eol, PROT_EOL_CRLF);
    EXPECT(p, 4096, PROT_OK, "after", PROT_EOL_CRLF);
    EXPECT(p, 4096, PROT_EOF, "", PROT_EOL_NONE);
    /* a line longer than the buffer is fine when the limit allows it */
    buf_free(&line);
    wait_peer(pid);
    prot_free(&p);
    close(sv[0]);

    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_long_line, &len);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);
    assert_int_equal(prot_getline(p, &line, len, &eol), PROT_OK);
    assert_int_equal(line.len, len);
    assert_int_equal(eol, PROT_EOL_CRLF);
    EXPECT(p, 10, PROT_OK, "after", PROT_EOL_CRLF);
    buf_free(&line);
    wait_peer(pid);
    prot_free(&p);
    close(sv[0]);
}

/* One byte per write, with pauses: every split point of every line end. */
static int peer_bytewise(int fd, void *arg)
{
    const char *s = arg;
    size_t len = 7 + 6 + 5 + 4;     /* the text below, with its NUL */
    size_t i;

    for (i = 0; i < len; i++) {
        if (write_all(fd, s + i, 1) < 0)
            return 2;
        usleep(2000);
    }
    close(fd);
    return 0;
}

static void test_getline_bytewise(void **state)
{
    int sv[2];
    struct prot *p;
    static char text[] = "line1\r\nline2\nx\0y\r\nlast";
    pid_t pid;
    (void)state;

    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_bytewise, text);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);
    EXPECT(p, 100, PROT_OK, "line1", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_OK, "line2", PROT_EOL_LF);
    EXPECT(p, 100, PROT_OK, "x\0y", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_EOF, "last", PROT_EOL_NONE);
    wait_peer(pid);
    prot_free(&p);
    close(sv[0]);
}

static void test_getline_eof(void **state)
{
    int sv[2];
    struct prot *p;
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    assert_int_equal(write_all(sv[1], "ok\r\nabc", 7), 0);
    assert_int_equal(shutdown(sv[1], SHUT_WR), 0);
    EXPECT(p, 100, PROT_OK, "ok", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_EOF, "abc", PROT_EOL_NONE);    /* last line, no LF */
    EXPECT(p, 100, PROT_EOF, "", PROT_EOL_NONE);       /* sticky */
    EXPECT(p, 2, PROT_EOF, "", PROT_EOL_NONE);
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);

    /* a peer that closes with our output unread (a reset): also EOF */
    make_pair(sv);
    p = prot_new(sv[0]);
    prot_puts(p, "250 unread by the peer\r\n");
    assert_int_equal(prot_flush(p), PROT_OK);
    assert_int_equal(write_all(sv[1], "QUIT\r\nxy", 8), 0);
    close(sv[1]);
    EXPECT(p, 100, PROT_OK, "QUIT", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_EOF, "xy", PROT_EOL_NONE);
    EXPECT(p, 100, PROT_EOF, "", PROT_EOL_NONE);
    prot_puts(p, "221 bye\r\n");
    assert_int_equal(prot_flush(p), PROT_IOERROR);
    prot_free(&p);
    close(sv[0]);

    /* EOF inside an over-long line: EOF wins, the line is cut */
    make_pair(sv);
    p = prot_new(sv[0]);
    assert_int_equal(write_all(sv[1], "abcdef", 6), 0);
    close(sv[1]);
    EXPECT(p, 3, PROT_EOF, "abc", PROT_EOL_NONE);
    prot_free(&p);
    close(sv[0]);
}

/* prot_set_interrupt: a signal handler sets the flag while the reader
 * waits; the read gives way at once (well before its timeout), buffered
 * input stays, and without the check the same wait runs to its end. */
static volatile sig_atomic_t interrupt_flag;
static int interrupt_check(void) { return interrupt_flag; }
static void interrupt_handler(int sig) { (void)sig; interrupt_flag = 1; }

static void test_getline_interrupt(void **state)
{
    int sv[2];
    struct prot *p;
    struct sigaction sa, old;
    struct itimerval it;
    double t0, dt;
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    prot_settimeout(p, 5);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = interrupt_handler;
    sa.sa_flags = SA_RESTART;
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    interrupt_flag = 0;
    prot_set_interrupt(p, interrupt_check);
    memset(&it, 0, sizeof(it));
    it.it_value.tv_usec = 200000;
    assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    t0 = th_now();
    EXPECT(p, 100, PROT_INTERRUPTED, "", PROT_EOL_NONE);
    dt = th_now() - t0;
    assert_true(dt >= 0.15);
    assert_true(dt < 2.0);
    /* already set: no wait at all; a complete buffered line still reads */
    assert_int_equal(write_all(sv[1], "next\r\n", 6), 0);
    EXPECT(p, 100, PROT_OK, "next", PROT_EOL_CRLF);
    EXPECT(p, 100, PROT_INTERRUPTED, "", PROT_EOL_NONE);
    /* cleared: the wait runs to the timeout */
    prot_set_interrupt(p, NULL);
    prot_settimeout(p, 1);
    t0 = th_now();
    EXPECT(p, 100, PROT_TIMEOUT, "", PROT_EOL_NONE);
    assert_true(th_now() - t0 >= 0.9);
    assert_int_equal(sigaction(SIGALRM, &old, NULL), 0);
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);
}

static void test_getline_timeout(void **state)
{
    int sv[2];
    struct prot *p;
    double t0, dt;
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    prot_settimeout(p, 1);
    t0 = th_now();
    EXPECT(p, 100, PROT_TIMEOUT, "", PROT_EOL_NONE);
    dt = th_now() - t0;
    assert_true(dt >= 0.9);
    assert_true(dt < 5.0);
    assert_non_null(strstr(prot_error(p), "timeout"));
    /* not sticky: data arriving later is read */
    assert_int_equal(write_all(sv[1], "late\r\n", 6), 0);
    EXPECT(p, 100, PROT_OK, "late", PROT_EOL_CRLF);
    /* a partial line and then silence also times out */
    assert_int_equal(write_all(sv[1], "part", 4), 0);
    t0 = th_now();
    EXPECT(p, 100, PROT_TIMEOUT, "part", PROT_EOL_NONE);
    assert_true(th_now() - t0 >= 0.9);
    /* and the read side */
    {
        struct buf b = BUF_INITIALIZER;
        size_t n = 99;
        assert_int_equal(prot_read(p, &b, 1), PROT_TIMEOUT);
        assert_int_equal(prot_read_some(p, &b, 10, &n), PROT_TIMEOUT);
        assert_int_equal(n, 0);
        buf_free(&b);
    }
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);
}

/* ---- exact reads, pending ----------------------------------------- */

static void test_read(void **state)
{
    int sv[2];
    struct prot *p;
    struct buf b = BUF_INITIALIZER;
    size_t n = 0;
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    prot_settimeout(p, 5);
    assert_int_equal(write_all(sv[1], "hello world\r\nrest", 17), 0);
    assert_int_equal(prot_read(p, &b, 5), PROT_OK);
    assert_int_equal(b.len, 5);
    assert_memory_equal(b.s, "hello", 5);
    assert_int_equal(prot_read(p, NULL, 1), PROT_OK);      /* skip " " */
    assert_int_equal(prot_read(p, &b, 0), PROT_OK);
    assert_int_equal(b.len, 5);
    /* read_some: what is buffered, at most max */
    assert_int_equal(prot_read_some(p, &b, 3, &n), PROT_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(b.s, "hellowor", 8);
    EXPECT(p, 100, PROT_OK, "ld", PROT_EOL_CRLF);
    buf_reset(&b);
    assert_int_equal(prot_read_some(p, &b, 100, &n), PROT_OK);
    assert_int_equal(n, 4);
    assert_memory_equal(b.s, "rest", 4);
    /* a short read: fewer bytes arrive before EOF */
    assert_int_equal(write_all(sv[1], "abc", 3), 0);
    close(sv[1]);
    buf_reset(&b);
    assert_int_equal(prot_read(p, &b, 10), PROT_EOF);
    assert_int_equal(b.len, 3);
    assert_memory_equal(b.s, "abc", 3);
    assert_int_equal(prot_read_some(p, &b, 10, &n), PROT_EOF);
    assert_int_equal(n, 0);
    buf_free(&b);
    prot_free(&p);
    close(sv[0]);
}

static int peer_big_write(int fd, void *arg)
{
    size_t len = *(size_t *)arg;
    char *data = malloc(len);
    int r;

    if (!data)
        return 3;
    th_fill(data, len, 42);
    r = write_all(fd, data, len);
    free(data);
    close(fd);
    return r ? 2 : 0;
}

static void test_read_big(void **state)
{
    int sv[2];
    struct prot *p;
    struct buf b = BUF_INITIALIZER;
    size_t len = 3 * PROT_BUFSIZE + 777;
    char *want = malloc(len);
    pid_t pid;
    (void)state;

    assert_non_null(want);
    th_fill(want, len, 42);
    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_big_write, &len);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);
    assert_int_equal(prot_read(p, &b, len - 100), PROT_OK);
    assert_int_equal(prot_read(p, NULL, 50), PROT_OK);
    assert_int_equal(prot_read(p, &b, 50), PROT_OK);
    assert_int_equal(b.len, len - 50);
    assert_memory_equal(b.s, want, len - 100);
    assert_memory_equal(b.s + len - 100, want + len - 50, 50);
    assert_int_equal(prot_read(p, &b, 1), PROT_EOF);
    assert_int_equal(prot_bytes_in(p), len);
    wait_peer(pid);
    buf_free(&b);
    free(want);
    prot_free(&p);
    close(sv[0]);
}

static void test_pending(void **state)
{
    int sv[2];
    struct prot *p;
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    prot_settimeout(p, 5);
    assert_int_equal(prot_pending(p), 0);
    assert_int_equal(write_all(sv[1], "RSET\r\nNOOP\r\n", 12), 0);
    assert_int_equal(prot_pending(p), 0);      /* nothing read yet */
    EXPECT(p, 100, PROT_OK, "RSET", PROT_EOL_CRLF);
    assert_int_equal(prot_pending(p), 1);      /* the client pipelined */
    EXPECT(p, 100, PROT_OK, "NOOP", PROT_EOL_CRLF);
    assert_int_equal(prot_pending(p), 0);
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);
}

/* ---- writing ------------------------------------------------------- */

static int peer_check_output(int fd, void *arg)
{
    const struct buf *want = arg;
    char *got = malloc(want->len + 1);
    size_t have = 0;
    ssize_t n;
    char extra;

    if (!got)
        return 3;
    while (have < want->len) {
        n = read(fd, got + have, want->len - have);
        if (n <= 0) {
            fprintf(stderr, "peer: short output %zu of %zu\n", have,
                    want->len);
            return 2;
        }
        have += (size_t)n;
    }
    if (memcmp(got, want->s, want->len) != 0) {
        fprintf(stderr, "peer: output differs\n");
        return 4;
    }
    free(got);
    if (read(fd, &extra, 1) != 0) {
        fprintf(stderr, "peer: more output than expected\n");
        return 5;
    }
    return 0;
}

static void test_write_flush(void **state)
{
    int sv[2];
    struct prot *p;
    struct buf want = BUF_INITIALIZER;
    size_t biglen = 2 * PROT_BUFSIZE + 999;
    char *big = malloc(biglen + 1);
    pid_t pid;
    (void)state;

    assert_non_null(big);
    memset(big, 'q', biglen);
    big[biglen] = '\0';
    buf_set_max(&want, 0);
    assert_int_equal(buf_appendcstr(&want, "220 ready\r\n"), 0);
    assert_int_equal(buf_printf(&want, "250-%s %d\r\n", "host", 42), 0);
    assert_int_equal(buf_append(&want, "a\0b", 3), 0);
    assert_int_equal(buf_printf(&want, "<%s>", big), 0);
    th_fill(big, biglen, 9);
    assert_int_equal(buf_append(&want, big, biglen), 0);
    assert_int_equal(buf_appendcstr(&want, "221 bye\r\n"), 0);

    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_check_output, &want);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);
    prot_puts(p, "220 ready\r\n");
    prot_printf(p, "250-%s %d\r\n", "host", 42);
    prot_write(p, "a\0b", 3);
    memset(big, 'q', biglen);
    prot_printf(p, "<%s>", big);    /* larger than the buffer */
    th_fill(big, biglen, 9);
    prot_write(p, big, biglen);
    prot_puts(p, "221 bye\r\n");
    assert_int_equal(prot_flush(p), PROT_OK);
    assert_int_equal(prot_flush(p), PROT_OK);     /* nothing left */
    assert_int_equal(prot_bytes_out(p), want.len);
    prot_free(&p);
    close(sv[0]);
    wait_peer(pid);
    buf_free(&want);
    free(big);
}

static void test_write_closed_peer(void **state)
{
    int sv[2];
    struct prot *p;
    (void)state;

    make_pair(sv);
    p = prot_new(sv[0]);
    prot_settimeout(p, 5);
    close(sv[1]);
    prot_puts(p, "250 ok\r\n");
    assert_int_equal(prot_flush(p), PROT_IOERROR);     /* EPIPE, no signal */
    assert_non_null(strstr(prot_error(p), "write"));
    prot_puts(p, "more\r\n");                          /* dropped */
    assert_int_equal(prot_flush(p), PROT_IOERROR);     /* sticky */
    assert_int_equal(prot_bytes_out(p), 0);
    /* reading the closed peer: EOF */
    EXPECT(p, 100, PROT_EOF, "", PROT_EOL_NONE);
    prot_free(&p);
    close(sv[0]);
}

static void test_write_timeout(void **state)
{
    int sv[2];
    struct prot *p;
    size_t len = 8 * 1024 * 1024;   /* far beyond the socket buffers */
    char *data = calloc(1, len);
    double t0, dt;
    (void)state;

    assert_non_null(data);
    make_pair(sv);
    p = prot_new(sv[0]);
    prot_settimeout(p, 1);
    t0 = th_now();
    prot_write(p, data, len);       /* the peer never reads */
    assert_int_equal(prot_flush(p), PROT_TIMEOUT);
    dt = th_now() - t0;
    assert_true(dt >= 0.9);
    assert_true(dt < 5.0);
    assert_non_null(strstr(prot_error(p), "timeout"));
    assert_true(prot_bytes_out(p) < len);
    t0 = th_now();
    prot_puts(p, "x");
    assert_int_equal(prot_flush(p), PROT_TIMEOUT);      /* sticky, at once */
    assert_true(th_now() - t0 < 0.5);
    prot_free(&p);
    close(sv[0]);
    close(sv[1]);
    free(data);
}

/* ---- TLS ----------------------------------------------------------- */

/* Read one line from a raw fd a byte at a time (so that no TLS byte after
 * it is consumed).  0 or -1. */
static int raw_getline(int fd, char *out, size_t outlen)
{
    size_t n = 0;

    while (n + 1 < outlen) {
        char c;
        ssize_t r = read(fd, &c, 1);
        if (r <= 0)
            return -1;
        if (c == '\n') {
            if (n > 0 && out[n - 1] == '\r')
                n--;
            out[n] = '\0';
            return 0;
        }
        out[n++] = c;
    }
    return -1;
}

/* A client TLS connection on fd that verifies the server's certificate
 * against cert1 (self-signed) for the name "localhost". */
static SSL *client_connect(int fd, int max_version, SSL_CTX **ctx_r)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    SSL *ssl;

    *ctx_r = ctx;
    if (!ctx)
        return NULL;
    if (max_version) {
        SSL_CTX_set_security_level(ctx, 0);
        SSL_CTX_set_min_proto_version(ctx, 0);
        SSL_CTX_set_max_proto_version(ctx, max_version);
    }
    if (SSL_CTX_load_verify_locations(ctx, cert1, NULL) != 1)
        return NULL;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    ssl = SSL_new(ctx);
    if (!ssl)
        return NULL;
    SSL_set1_host(ssl, "localhost");
    SSL_set_fd(ssl, fd);
    if (SSL_connect(ssl) != 1) {
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

static int ssl_write_all(SSL *ssl, const void *data, size_t len)
{
    size_t n = 0;

    return SSL_write_ex(ssl, data, len, &n) == 1 && n == len ? 0 : -1;
}

static int ssl_read_all(SSL *ssl, void *data, size_t len)
{
    char *d = data;

    while (len > 0) {
        size_t n = 0;
        if (SSL_read_ex(ssl, d, len, &n) != 1)
            return -1;
        d += n;
        len -= n;
    }
    return 0;
}

static int ssl_getline(SSL *ssl, char *out, size_t outlen)
{
    size_t n = 0;

    while (n + 1 < outlen) {
        if (ssl_read_all(ssl, out + n, 1) < 0)
            return -1;
        if (out[n] == '\n') {
            if (n > 0 && out[n - 1] == '\r')
                n--;
            out[n] = '\0';
            return 0;
        }
        n++;
    }
    return -1;
}

#define TLS_UP 100000
#define TLS_DOWN 200000

/* The client of the full session: plain greeting, STARTTLS with an
 * injected NOOP in the same write, handshake, data both ways. */
static int peer_tls_session(int fd, void *arg)
{
    char line[256];
    char *data = malloc(TLS_DOWN);
    char *want = malloc(TLS_DOWN);
    SSL_CTX *ctx = NULL;
    SSL *ssl;
    (void)arg;

    if (!data || !want)
        return 3;
    if (raw_getline(fd, line, sizeof(line)) < 0
        || strcmp(line, "220 ready") != 0)
        return 10;
    if (write_all(fd, "STARTTLS\r\nNOOP\r\n", 16) < 0)
        return 11;
    if (raw_getline(fd, line, sizeof(line)) < 0
        || strcmp(line, "220 go ahead") != 0)
        return 12;
    ssl = client_connect(fd, 0, &ctx);
    if (!ssl) {
        ERR_print_errors_fp(stderr);
        return 13;
    }
    th_fill(data, TLS_UP, 7);
    if (ssl_write_all(ssl, "LINE1\r\n", 7) < 0
        || ssl_write_all(ssl, data, TLS_UP) < 0)
        return 14;
    if (ssl_getline(ssl, line, sizeof(line)) < 0
        || strcmp(line, "OK 100000") != 0)
        return 15;
    th_fill(want, TLS_DOWN, 8);
    if (ssl_read_all(ssl, data, TLS_DOWN) < 0
        || memcmp(data, want, TLS_DOWN) != 0)
        return 16;
    /* pipelined: two commands in one record */
    if (ssl_write_all(ssl, "P1\r\nP2\r\n", 8) < 0)
        return 17;
    if (ssl_getline(ssl, line, sizeof(line)) < 0
        || strcmp(line, "250 both") != 0)
        return 18;
    SSL_shutdown(ssl);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    free(data);
    free(want);
    close(fd);
    return 0;
}

/* Handshake, a partial line, then a close without close_notify. */
static int peer_tls_abrupt(int fd, void *arg)
{
    char line[256];
    SSL_CTX *ctx = NULL;
    SSL *ssl;
    (void)arg;

    if (write_all(fd, "STARTTLS\r\n", 10) < 0
        || raw_getline(fd, line, sizeof(line)) < 0)
        return 10;
    ssl = client_connect(fd, 0, &ctx);
    if (!ssl)
        return 11;
    if (ssl_write_all(ssl, "partial", 7) < 0)
        return 12;
    close(fd);          /* no SSL_shutdown */
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    return 0;
}

static struct tls_server *load_tls(void)
{
    struct tls_server *tls = NULL;
    char *error = NULL;

    if (tls_server_new_files(cert1, key1, &tls, &error) != 0)
        fail_msg("tls_server_new_files: %s", error ? error : "?");
    assert_null(error);
    return tls;
}

static void test_tls_session(void **state)
{
    int sv[2];
    struct prot *p;
    struct tls_server *tls = load_tls();
    struct buf b = BUF_INITIALIZER;
    char *want = malloc(TLS_DOWN);
    size_t discarded = 99;
    pid_t pid;
    (void)state;

    assert_non_null(want);
    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_tls_session, NULL);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);
    assert_int_equal(prot_is_tls(p), 0);
    assert_null(prot_tls_info(p));
    assert_int_equal(prot_tls_ssf(p), 0);
    prot_puts(p, "220 ready\r\n");
    assert_int_equal(prot_flush(p), PROT_OK);
    EXPECT(p, 100, PROT_OK, "STARTTLS", PROT_EOL_CRLF);
    assert_int_equal(prot_pending(p), 1);          /* the injected NOOP */
    prot_puts(p, "220 go ahead\r\n");              /* starttls flushes it */
    if (prot_starttls(p, tls, &discarded) != PROT_OK)
        fail_msg("prot_starttls: %s", prot_error(p));
    assert_int_equal(discarded, 6);                /* "NOOP\r\n" */
    assert_int_equal(prot_is_tls(p), 1);
    assert_non_null(prot_tls_info(p));
    assert_true(strncmp(prot_tls_info(p), "TLSv1.", 6) == 0);
    assert_true(prot_tls_ssf(p) >= 128);

    /* the first line under TLS is the client's, not the injected NOOP */
    EXPECT(p, 100, PROT_OK, "LINE1", PROT_EOL_CRLF);
    th_fill(want, TLS_UP, 7);
    assert_int_equal(prot_read(p, &b, TLS_UP), PROT_OK);
    assert_int_equal(b.len, TLS_UP);
    assert_memory_equal(b.s, want, TLS_UP);

    prot_printf(p, "OK %d\r\n", TLS_UP);
    th_fill(want, TLS_DOWN, 8);
    prot_write(p, want, TLS_DOWN);
    assert_int_equal(prot_flush(p), PROT_OK);

    EXPECT(p, 100, PROT_OK, "P1", PROT_EOL_CRLF);
    assert_int_equal(prot_pending(p), 1);
    EXPECT(p, 100, PROT_OK, "P2", PROT_EOL_CRLF);
    assert_int_equal(prot_pending(p), 0);
    prot_puts(p, "250 both\r\n");
    assert_int_equal(prot_flush(p), PROT_OK);
    /* the client's close_notify */
    EXPECT(p, 100, PROT_EOF, "", PROT_EOL_NONE);
    /* a second STARTTLS is refused */
    assert_int_equal(prot_starttls(p, tls, NULL), PROT_IOERROR);
    wait_peer(pid);
    prot_free(&p);
    close(sv[0]);
    tls_server_free(&tls);
    assert_null(tls);
    buf_free(&b);
    free(want);
}

static void test_tls_abrupt_close(void **state)
{
    int sv[2];
    struct prot *p;
    struct tls_server *tls = load_tls();
    pid_t pid;
    (void)state;

    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_tls_abrupt, NULL);
    p = prot_new(sv[0]);
    prot_settimeout(p, 10);
    EXPECT(p, 100, PROT_OK, "STARTTLS", PROT_EOL_CRLF);
    prot_puts(p, "220 go ahead\r\n");
    if (prot_starttls(p, tls, NULL) != PROT_OK)
        fail_msg("prot_starttls: %s", prot_error(p));
    /* a client vanishing inside a line is an ordinary EOF */
    EXPECT(p, 100, PROT_EOF, "partial", PROT_EOL_NONE);
    EXPECT(p, 100, PROT_EOF, "", PROT_EOL_NONE);
    wait_peer(pid);
    prot_free(&p);          /* close_notify to a closed peer: harmless */
    close(sv[0]);
    tls_server_free(&tls);
}

/* After STARTTLS, either nothing (handshake timeout), garbage, or a
 * client that only speaks TLS 1.1. */
enum tls_bad { BAD_SILENT, BAD_GARBAGE, BAD_OLD_VERSION };

static int peer_tls_bad(int fd, void *arg)
{
    enum tls_bad how = *(enum tls_bad *)arg;
    char line[256];
    SSL_CTX *ctx = NULL;
    SSL *ssl;

    if (write_all(fd, "STARTTLS\r\n", 10) < 0)
        return 10;
    if (raw_getline(fd, line, sizeof(line)) < 0)
        return 11;
    switch (how) {
    case BAD_SILENT:
        /* wait for the server to give up and close */
        while (read(fd, line, sizeof(line)) > 0)
            ;
        return 0;
    case BAD_GARBAGE:
        if (write_all(fd, "this is not TLS at all\r\n", 24) < 0)
            return 12;
        while (read(fd, line, sizeof(line)) > 0)
            ;
        return 0;
    case BAD_OLD_VERSION:
        ssl = client_connect(fd, TLS1_1_VERSION, &ctx);
        SSL_CTX_free(ctx);
        if (ssl) {
            fprintf(stderr, "peer: a TLS 1.1 handshake succeeded\n");
            SSL_free(ssl);
            return 13;
        }
        return 0;
    }
    return 14;
}

static void run_tls_bad(enum tls_bad how, int want_r, const char *want_text)
{
    int sv[2];
    struct prot *p;
    struct tls_server *tls = load_tls();
    pid_t pid;
    double t0;

    make_pair(sv);
    pid = fork_peer(sv[1], sv[0], peer_tls_bad, &how);
    p = prot_new(sv[0]);
    prot_settimeout(p, 1);
    EXPECT(p, 100, PROT_OK, "STARTTLS", PROT_EOL_CRLF);
    prot_puts(p, "220 go ahead\r\n");
    t0 = th_now();
    assert_int_equal(prot_starttls(p, tls, NULL), want_r);
    assert_true(th_now() - t0 < 5.0);
    if (!strstr(prot_error(p), want_text))
        fail_msg("prot_error: %s (wanted %s)", prot_error(p), want_text);
    assert_int_equal(prot_is_tls(p), 0);
    /* the stream is unusable afterwards */
    prot_puts(p, "x\r\n");
    assert_int_not_equal(prot_flush(p), PROT_OK);
    prot_free(&p);
    close(sv[0]);
    wait_peer(pid);
    tls_server_free(&tls);
}

static void test_tls_handshake_timeout(void **state)
{
    (void)state;
    run_tls_bad(BAD_SILENT, PROT_TIMEOUT, "timeout");
}

static void test_tls_handshake_garbage(void **state)
{
    (void)state;
    run_tls_bad(BAD_GARBAGE, PROT_IOERROR, "TLS handshake");
}

static void test_tls_old_version(void **state)
{
    (void)state;
    run_tls_bad(BAD_OLD_VERSION, PROT_IOERROR, "TLS handshake");
}

static void expect_tls_error(const char *cert, const char *key,
                             const char *part1, const char *part2)
{
    struct tls_server *tls = (struct tls_server *)&tls;   /* poison */
    char *error = NULL;

    assert_int_equal(tls_server_new_files(cert, key, &tls, &error), -1);
    assert_null(tls);
    assert_non_null(error);
    if (!strstr(error, part1) || (part2 && !strstr(error, part2)))
        fail_msg("error <%s> lacks <%s> / <%s>", error, part1,
                 part2 ? part2 : "");
    free(error);
}

static void test_tls_files(void **state)
{
    char *missing = th_path(tmpdir, "missing.pem");
    char *junk = th_path(tmpdir, "junk.pem");
    FILE *f;
    struct tls_server *tls = NULL;
    struct imapconf *conf = NULL;
    struct buf text = BUF_INITIALIZER;
    char *error = NULL;
    (void)state;

    f = fopen(junk, "w");
    assert_non_null(f);
    fputs("-----BEGIN CERTIFICATE-----\nnot base64!\n"
          "-----END CERTIFICATE-----\n", f);
    fclose(f);

    expect_tls_error(cert1, key2, "does not match", key2);
    expect_tls_error(cert2, key1, "does not match", cert2);
    expect_tls_error(missing, key1, missing, "No such file");
    expect_tls_error(cert1, missing, missing, "No such file");
    expect_tls_error(junk, key1, "bad certificate", junk);
    expect_tls_error(cert1, junk, "bad private key", junk);
    expect_tls_error(cert1, cert1, "bad private key", cert1);
    expect_tls_error("", key1, "TLS not configured", NULL);
    expect_tls_error(cert1, NULL, "TLS not configured", NULL);

    /* the matching pair, through imapd.conf */
    assert_int_equal(buf_printf(&text, "tls_server_cert: %s\n"
                                "tls_server_key: %s\n", cert2, key2), 0);
    assert_int_equal(imapconf_load_string("test.conf", text.s, text.len,
                                          &conf, &error), 0);
    assert_int_equal(tls_server_new(conf, &tls, &error), 0);
    assert_null(error);
    assert_non_null(tls);
    assert_non_null(tls_server_ssl_ctx(tls));
    tls_server_free(&tls);
    tls_server_free(&tls);
    imapconf_free(&conf);

    /* unset keys */
    conf = imapconf_defaults();
    assert_non_null(conf);
    assert_int_equal(tls_server_new(conf, &tls, &error), -1);
    assert_non_null(error);
    assert_non_null(strstr(error, "TLS not configured"));
    free(error);
    imapconf_free(&conf);

    buf_free(&text);
    free(missing);
    free(junk);
}

/* ---- SASL ---------------------------------------------------------- */

static int have_program(const char *name)
{
    const char *dirs[] = { "/usr/sbin", "/usr/bin", "/sbin", "/bin", NULL };
    char path[256];
    int i;

    for (i = 0; dirs[i]; i++) {
        snprintf(path, sizeof(path), "%s/%s", dirs[i], name);
        if (access(path, X_OK) == 0)
            return 1;
    }
    return 0;
}

static void b64(const char *data, size_t len, struct buf *out)
{
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *d = (const unsigned char *)data;
    size_t i;

    buf_reset(out);
    for (i = 0; i < len; i += 3) {
        unsigned v = (unsigned)d[i] << 16;
        if (i + 1 < len)
            v |= (unsigned)d[i + 1] << 8;
        if (i + 2 < len)
            v |= d[i + 2];
        buf_putc(out, tab[(v >> 18) & 63]);
        buf_putc(out, tab[(v >> 12) & 63]);
        buf_putc(out, i + 1 < len ? tab[(v >> 6) & 63] : '=');
        buf_putc(out, i + 2 < len ? tab[v & 63] : '=');
    }
    buf_cstring(out);
}

static void plain_response(const char *authz, const char *user,
                           const char *pass, struct buf *out)
{
    struct buf raw = BUF_INITIALIZER;

    buf_appendcstr(&raw, authz);
    buf_putc(&raw, '\0');
    buf_appendcstr(&raw, user);
    buf_putc(&raw, '\0');
    buf_appendcstr(&raw, pass);
    b64(raw.s, raw.len, out);
    buf_free(&raw);
}

static struct imapconf *sasl_conf(const char *sasldb, int allowplaintext)
{
    struct imapconf *conf = NULL;
    struct buf text = BUF_INITIALIZER;
    char *error = NULL;

    buf_printf(&text,
               "servername: test.example\n"
               "allowplaintext: %s\n"
               "sasl_pwcheck_method: auxprop\n"
               "sasl_auxprop_plugin: sasldb\n"
               "sasl_sasldb_path: %s\n"
               "sasl_mech_list: PLAIN LOGIN\n",
               allowplaintext ? "yes" : "no", sasldb);
    if (imapconf_load_string("sasl.conf", text.s, text.len, &conf,
                             &error) != 0)
        fail_msg("conf: %s", error ? error : "?");
    buf_free(&text);
    return conf;
}

static int plain_login(struct saslserver *s, const char *user,
                       const char *pass)
{
    struct buf resp = BUF_INITIALIZER;
    struct buf chal = BUF_INITIALIZER;
    int r;

    plain_response("", user, pass, &resp);
    r = saslserver_start(s, "PLAIN", resp.s, &chal);
    assert_int_equal(chal.len, 0);
    buf_free(&resp);
    buf_free(&chal);
    return r;
}

static void test_sasl(void **state)
{
    char *sasldb = th_path(tmpdir, "sasldb2");
    char cmd[1024];
    struct imapconf *conf;
    struct saslserver *s;
    struct buf mechs = BUF_INITIALIZER;
    struct buf chal = BUF_INITIALIZER;
    struct buf resp = BUF_INITIALIZER;
    (void)state;

    if (!have_program("saslpasswd2")) {
        fprintf(stdout, "SKIP test_sasl: saslpasswd2 not installed"
                " (package sasl2-bin)\n");
        free(sasldb);
        skip();
    }
    /* the user alice in realm test.example (= servername below) */
    snprintf(cmd, sizeof(cmd), "printf %%s 'open sesame' | saslpasswd2 -p"
             " -c -f '%s' -u test.example alice", sasldb);
    assert_int_equal(system(cmd), 0);

    /* echo's newline is not part of the password */
    snprintf(cmd, sizeof(cmd), "echo 'second pw' | saslpasswd2 -p"
             " -c -f '%s' -u test.example carol", sasldb);
    assert_int_equal(system(cmd), 0);

    conf = sasl_conf(sasldb, 0);
    assert_int_equal(saslserver_init(conf, "cyrusdeliver-test"), 0);

    /* without TLS and without allowplaintext: no PLAIN, no LOGIN */
    s = saslserver_new("lmtp", "127.0.0.1;25", "127.0.0.1;4711", 0);
    assert_non_null(s);
    assert_int_equal(saslserver_mechs(s, &mechs), -1);
    assert_int_equal(plain_login(s, "alice", "open sesame"),
                     SASLSERVER_NOMECH);
    assert_null(saslserver_user(s));

    /* after STARTTLS both are offered */
    assert_int_equal(saslserver_set_tls(s, 256), 0);
    assert_int_equal(saslserver_mechs(s, &mechs), 0);
    assert_non_null(strstr(buf_cstring(&mechs), "PLAIN"));
    assert_non_null(strstr(buf_cstring(&mechs), "LOGIN"));
    assert_null(strstr(buf_cstring(&mechs), "ANONYMOUS"));
    assert_int_equal(saslserver_start(s, "ANONYMOUS", NULL, &chal),
                     SASLSERVER_NOMECH);
    assert_int_equal(saslserver_start(s, "NO-SUCH-MECH", NULL, &chal),
                     SASLSERVER_NOMECH);

    /* PLAIN: right and wrong passwords, unknown user */
    assert_int_equal(plain_login(s, "alice", "wrong"), SASLSERVER_FAIL);
    assert_null(saslserver_user(s));
    assert_non_null(saslserver_error(s));
    assert_int_equal(plain_login(s, "bob", "open sesame"), SASLSERVER_FAIL);
    assert_int_equal(plain_login(s, "carol", "second pw"), SASLSERVER_DONE);
    assert_string_equal(saslserver_user(s), "carol");
    saslserver_free(&s);
    s = saslserver_new("lmtp", "127.0.0.1;25", "127.0.0.1;4711", 256);
    assert_non_null(s);
    assert_null(saslserver_user(s));
    assert_int_equal(plain_login(s, "alice", "open sesame"),
                     SASLSERVER_DONE);
    assert_non_null(saslserver_user(s));
    assert_string_equal(saslserver_user(s), "alice");
    /* no second exchange on an authenticated connection */
    assert_int_equal(plain_login(s, "bob", "x"), SASLSERVER_ERROR);
    assert_string_equal(saslserver_user(s), "alice");
    saslserver_free(&s);
    assert_null(s);

    /* the realm given explicitly works too */
    s = saslserver_new("lmtp", NULL, NULL, 256);
    assert_non_null(s);
    assert_int_equal(plain_login(s, "alice@test.example", "open sesame"),
                     SASLSERVER_DONE);
    assert_string_equal(saslserver_user(s), "alice@test.example");
    saslserver_free(&s);

    /* PLAIN without an initial response: an empty challenge, then the
     * response; the bad cases */
    s = saslserver_new("lmtp", NULL, NULL, 256);
    assert_non_null(s);
    assert_int_equal(saslserver_start(s, "PLAIN", NULL, &chal),
                     SASLSERVER_CONTINUE);
    assert_int_equal(chal.len, 0);
    plain_response("", "alice", "open sesame", &resp);
    assert_int_equal(saslserver_step(s, resp.s, &chal), SASLSERVER_DONE);
    assert_string_equal(saslserver_user(s), "alice");
    saslserver_free(&s);

    /* a fresh connection for the failures; after each, a new exchange
     * on the same connection still works */
    s = saslserver_new("lmtp", NULL, NULL, 256);
    assert_non_null(s);
    /* cancel */
    assert_int_equal(saslserver_start(s, "PLAIN", NULL, &chal),
                     SASLSERVER_CONTINUE);
    assert_null(saslserver_user(s));
    assert_int_equal(saslserver_step(s, "*", &chal), SASLSERVER_CANCEL);
    assert_int_equal(saslserver_step(s, resp.s, &chal), SASLSERVER_ERROR);
    /* not base64 */
    assert_int_equal(saslserver_start(s, "PLAIN", "!!not base64!!", &chal),
                     SASLSERVER_BADB64);
    assert_int_equal(saslserver_start(s, "PLAIN", NULL, &chal),
                     SASLSERVER_CONTINUE);
    assert_int_equal(saslserver_step(s, "@@@", &chal), SASLSERVER_BADB64);
    /* "=": an empty initial response, which PLAIN cannot accept */
    {
        int r = saslserver_start(s, "PLAIN", "=", &chal);
        if (r != SASLSERVER_FAIL && r != SASLSERVER_CONTINUE)
            fail_msg("PLAIN with \"=\": %d (%s)", r, saslserver_error(s));
        assert_null(saslserver_user(s));
    }
    assert_int_equal(plain_login(s, "alice", "open sesame"),
                     SASLSERVER_DONE);
    assert_string_equal(saslserver_user(s), "alice");
    saslserver_free(&s);

    /* LOGIN: two challenges */
    s = saslserver_new("imap", NULL, NULL, 256);
    assert_non_null(s);
    assert_int_equal(saslserver_start(s, "LOGIN", NULL, &chal),
                     SASLSERVER_CONTINUE);
    assert_string_equal(buf_cstring(&chal), "VXNlcm5hbWU6");   /* Username: */
    b64("alice", 5, &resp);
    assert_int_equal(saslserver_step(s, resp.s, &chal), SASLSERVER_CONTINUE);
    assert_string_equal(buf_cstring(&chal), "UGFzc3dvcmQ6");   /* Password: */
    b64("open sesame", 11, &resp);
    assert_int_equal(saslserver_step(s, resp.s, &chal), SASLSERVER_DONE);
    assert_string_equal(saslserver_user(s), "alice");
    saslserver_free(&s);
    saslserver_done();
    imapconf_free(&conf);

    /* allowplaintext: yes offers PLAIN without TLS */
    conf = sasl_conf(sasldb, 1);
    assert_int_equal(saslserver_init(conf, "cyrusdeliver-test"), 0);
    s = saslserver_new("lmtp", NULL, NULL, 0);
    assert_non_null(s);
    assert_int_equal(saslserver_mechs(s, &mechs), 0);
    assert_non_null(strstr(buf_cstring(&mechs), "PLAIN"));
    assert_int_equal(plain_login(s, "alice", "open sesame"),
                     SASLSERVER_DONE);
    saslserver_free(&s);
    saslserver_done();
    imapconf_free(&conf);

    buf_free(&mechs);
    buf_free(&chal);
    buf_free(&resp);
    free(sasldb);
}

/* ---- setup --------------------------------------------------------- */

static int make_pair_files(const char *cert, const char *key)
{
    char cmd[2048];

    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost"
             " -addext subjectAltName=DNS:localhost -days 1"
             " -keyout '%s' -out '%s' >/dev/null 2>&1", key, cert);
    return system(cmd);
}

static int group_setup(void **state)
{
    (void)state;
    tmpdir = th_mkdtemp("prot");
    if (!tmpdir)
        return -1;
    cert1 = th_path(tmpdir, "cert1.pem");
    key1 = th_path(tmpdir, "key1.pem");
    cert2 = th_path(tmpdir, "cert2.pem");
    key2 = th_path(tmpdir, "key2.pem");
    if (make_pair_files(cert1, key1) != 0 || make_pair_files(cert2, key2) != 0) {
        fprintf(stderr, "openssl req failed: cannot make test certificates\n");
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (tmpdir)
        th_rmrf(tmpdir);
    free(tmpdir);
    free(cert1);
    free(key1);
    free(cert2);
    free(key2);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_getline_ends),
        cmocka_unit_test(test_getline_nul),
        cmocka_unit_test(test_getline_view),
        cmocka_unit_test(test_getline_toolong),
        cmocka_unit_test(test_getline_toolong_big),
        cmocka_unit_test(test_getline_bytewise),
        cmocka_unit_test(test_getline_eof),
        cmocka_unit_test(test_getline_timeout),
        cmocka_unit_test(test_getline_interrupt),
        cmocka_unit_test(test_read),
        cmocka_unit_test(test_read_big),
        cmocka_unit_test(test_pending),
        cmocka_unit_test(test_write_flush),
        cmocka_unit_test(test_write_closed_peer),
        cmocka_unit_test(test_write_timeout),
        cmocka_unit_test(test_tls_session),
        cmocka_unit_test(test_tls_abrupt_close),
        cmocka_unit_test(test_tls_handshake_timeout),
        cmocka_unit_test(test_tls_handshake_garbage),
        cmocka_unit_test(test_tls_old_version),
        cmocka_unit_test(test_tls_files),
        cmocka_unit_test(test_sasl),
        cmocka_unit_test(test_compress),
    };

    /* a closed peer must give EPIPE, not kill the test */
    signal(SIGPIPE, SIG_IGN);
    log_init("test_prot", LOG_TO_STDERR);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
