/*
 * testsvc.c - the service program the master's integration suite runs
 * (tests/master/test_master.py).  It links lib/service.c like every real
 * service, so the suite exercises the whole master <-> worker protocol.
 *
 * Service modes (run by master through service_main()):
 *   testsvc echo        on connect writes "hello pid=<pid>\n", then reads
 *                       lines and writes each back as "echo: <line>\n" until
 *                       a line "quit" or EOF (lines longer than 1023 bytes
 *                       are answered "error: line too long" and discarded)
 *   testsvc slow SECS   writes "hello pid=<pid>\n", sleeps SECS (fractional;
 *                       a signal does not cut the sleep short), writes
 *                       "done\n" and closes
 *   testsvc exit        exits 1 at once, before service_main(): a failing
 *                       start
 *   testsvc crash       writes "hello pid=<pid>\n", then dies of SIGSEGV
 *                       (core dumps disabled first)
 * Helper modes (START / DAEMON commands, run directly):
 *   testsvc mark FILE [SECS]  sleeps SECS, then creates FILE holding "ok\n";
 *                             exit 0 (1 if FILE cannot be created)
 *   testsvc fail              writes a message to stderr and exits 3
 *   testsvc daemon            waits for a signal (SIGTERM: exit 0)
 *
 * Exit status 2 and a usage line for an unknown mode.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "lib/service.h"

#define TESTSVC_LINE_MAX 1024

enum testsvc_mode {
    TESTSVC_ECHO,
    TESTSVC_SLOW,
    TESTSVC_CRASH
};

struct testsvc {
    enum testsvc_mode mode;
    double slow_seconds;
};

static void testsvc_usage(void)
{
    fprintf(stderr,
            "usage: testsvc echo | slow SECS | exit | crash | "
            "mark FILE [SECS] | fail | daemon\n");
}

/* Parse a non-negative number of seconds; -1 when it is not one. */
static double testsvc_seconds(const char *s)
{
    char *end = NULL;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || v < 0 || v > 3600)
        return -1;
    return v;
}

/* Sleep the whole interval even when signals interrupt it. */
static void testsvc_sleep(double seconds)
{
    struct timespec req, rem;

    req.tv_sec = (time_t)seconds;
    req.tv_nsec = (long)((seconds - (double)req.tv_sec) * 1e9);
    while (nanosleep(&req, &rem) != 0 && errno == EINTR)
        req = rem;
}

/* Write all of (buf, len); -1 on error (the peer left). */
static int testsvc_write(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int testsvc_hello(int fd)
{
    char line[64];
    int n = snprintf(line, sizeof(line), "hello pid=%ld\n", (long)getpid());

    return testsvc_write(fd, line, (size_t)n);
}

/* Answer one complete line (without its '\n'); 1 when it was "quit". */
static int testsvc_echo_line(int fd, const char *line, size_t len)
{
    char out[TESTSVC_LINE_MAX + 16];
    int n;

    if (len > 0 && line[len - 1] == '\r')
        len--;
    if (len == 4 && memcmp(line, "quit", 4) == 0)
        return 1;
    n = snprintf(out, sizeof(out), "echo: %.*s\n", (int)len, line);
    if (testsvc_write(fd, out, (size_t)n) < 0)
        return 1;
    return 0;
}

static void testsvc_echo(int fd)
{
    char buf[TESTSVC_LINE_MAX];
    size_t have = 0;
    int discarding = 0;

    if (testsvc_hello(fd) < 0)
        return;
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof(buf) - have);
        size_t start = 0, i;

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        have += (size_t)n;
        for (i = 0; i < have; i++) {
            if (buf[i] != '\n')
                continue;
            if (discarding) {
                discarding = 0;
            } else if (testsvc_echo_line(fd, buf + start, i - start)) {
                return;
            }
            start = i + 1;
        }
        if (start > 0) {
            memmove(buf, buf + start, have - start);
            have -= start;
        } else if (have == sizeof(buf)) {
            static const char toolong[] = "error: line too long\n";
            if (!discarding && testsvc_write(fd, toolong,
                                             sizeof(toolong) - 1) < 0)
                return;
            discarding = 1;
            have = 0;
        }
    }
}

static void testsvc_crash(int fd)
{
    struct rlimit nocore = { 0, 0 };

    (void)testsvc_hello(fd);
    (void)setrlimit(RLIMIT_CORE, &nocore);
    signal(SIGSEGV, SIG_DFL);
    raise(SIGSEGV);
    _exit(99);  /* not reached */
}

static int testsvc_init(int argc, char **argv, void *rock)
{
    (void)argc;
    (void)argv;
    (void)rock;
    return 0;
}

static void testsvc_serve(int fd, const char *peer, void *rock)
{
    struct testsvc *ts = rock;

    (void)peer;
    switch (ts->mode) {
    case TESTSVC_ECHO:
        testsvc_echo(fd);
        break;
    case TESTSVC_SLOW:
        if (testsvc_hello(fd) < 0)
            return;
        testsvc_sleep(ts->slow_seconds);
        (void)testsvc_write(fd, "done\n", 5);
        break;
    case TESTSVC_CRASH:
        testsvc_crash(fd);
        break;
    }
}

static void testsvc_done(void *rock)
{
    (void)rock;
}

static int testsvc_mark(const char *path, double seconds)
{
    int fd;

    testsvc_sleep(seconds);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "testsvc: cannot create %s: %s\n", path,
                strerror(errno));
        return 1;
    }
    if (testsvc_write(fd, "ok\n", 3) < 0 || close(fd) < 0) {
        fprintf(stderr, "testsvc: cannot write %s: %s\n", path,
                strerror(errno));
        return 1;
    }
    return 0;
}

static volatile sig_atomic_t testsvc_stop;

static void testsvc_on_term(int sig)
{
    (void)sig;
    testsvc_stop = 1;
}

static int testsvc_daemon(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = testsvc_on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    while (!testsvc_stop)
        pause();
    return 0;
}

int main(int argc, char **argv)
{
    struct testsvc ts;
    struct service_callbacks cb;
    const char *mode;

    if (argc < 2) {
        testsvc_usage();
        return 2;
    }
    mode = argv[1];
    memset(&ts, 0, sizeof(ts));

    if (strcmp(mode, "exit") == 0)
        return 1;
    if (strcmp(mode, "fail") == 0) {
        fprintf(stderr, "testsvc: failing on purpose\n");
        return 3;
    }
    if (strcmp(mode, "daemon") == 0)
        return testsvc_daemon();
    if (strcmp(mode, "mark") == 0) {
        double secs = 0;
        if (argc < 3 || argc > 4
            || (argc == 4 && (secs = testsvc_seconds(argv[3])) < 0)) {
            testsvc_usage();
            return 2;
        }
        return testsvc_mark(argv[2], secs);
    }

    if (strcmp(mode, "echo") == 0 && argc == 2) {
        ts.mode = TESTSVC_ECHO;
    } else if (strcmp(mode, "slow") == 0 && argc == 3
               && (ts.slow_seconds = testsvc_seconds(argv[2])) >= 0) {
        ts.mode = TESTSVC_SLOW;
    } else if (strcmp(mode, "crash") == 0 && argc == 2) {
        ts.mode = TESTSVC_CRASH;
    } else {
        testsvc_usage();
        return 2;
    }

    memset(&cb, 0, sizeof(cb));
    cb.init = testsvc_init;
    cb.serve = testsvc_serve;
    cb.done = testsvc_done;
    cb.rock = &ts;
    return service_main(argc, argv, &cb);
}
