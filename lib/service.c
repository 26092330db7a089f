/*
 * service.c - the worker side of the master protocol (see service.h).
 *
 * A child started by master finds the service's listening socket on fd 3
 * and the write end of the service's status pipe on fd 4.  It reports
 * READY before it waits for a connection, BUSY once it has one, and
 * EXITING when it leaves on its own; every report is one write(2) of a
 * fixed-size record smaller than PIPE_BUF, so reports from many children
 * on one pipe never interleave.
 *
 * Invariants:
 * - The listening socket's file flags are never changed: its open file
 *   description is shared with the master and every sibling.
 * - SIGTERM is blocked except while the child waits (ppoll with the
 *   unblocked mask, so a SIGTERM cannot slip in between the check of the
 *   flag and the wait), while it is in accept() (the handler jumps out of
 *   the accept), and while serve() runs (the handler only sets the flag;
 *   SA_RESTART keeps serve()'s blocking reads going, so the connection in
 *   progress is finished).
 * - Several idle children wake up for one connection; the master makes
 *   the listening socket non-blocking, so the ones that lose the race get
 *   EAGAIN and go back to their poll (with a blocking socket, as when run
 *   by another launcher, they would wait in accept() for the next
 *   connection; SIGTERM still ends that wait at once).  A SIGTERM that arrives just as accept() returns a
 *   connection drops that connection (the window is a few instructions;
 *   the master sends SIGTERM only when it stops the service anyway).
 * - SIGTERM closes the child's copy of the listening socket at once (in
 *   the handler, once): a child told to stop never accepts again, and a
 *   child finishing a long connection does not keep the address bound.
 * - The child leaves when its master is gone, so that a master killed
 *   with SIGKILL leaves no workers holding its addresses: the kernel
 *   sends SIGTERM when the master dies (PR_SET_PDEATHSIG, set at start;
 *   the master may have died before it was set, so the child then checks
 *   getppid() against CYRUSDELIVER_MASTER_PID and the status pipe), the
 *   status pipe's write end polls POLLERR once no reader is left (the
 *   master holds the only read end), and a status write fails with
 *   EPIPE.  Each way the child ends as on SIGTERM: after the connection
 *   in progress.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/service.h"

static volatile sig_atomic_t service_term_flag;
static volatile sig_atomic_t service_in_accept;
static volatile sig_atomic_t service_listen_open;
static sigjmp_buf service_accept_jmp;

/* Close fd 3 once: after that the number may belong to another file. */
static void service_close_listener(void)
{
    if (service_listen_open) {
        service_listen_open = 0;
        close(SERVICE_LISTEN_FD);
    }
}

static void service_sigterm(int sig)
{
    (void)sig;
    service_term_flag = 1;
    service_close_listener();
    if (service_in_accept) {
        service_in_accept = 0;
        siglongjmp(service_accept_jmp, 1);
    }
}

int service_stopping(void)
{
    return service_term_flag != 0;
}

/* A non-negative integer from the environment, or def. */
static long service_getenv_long(const char *name, long def)
{
    const char *v = getenv(name);
    char *end;
    long n;

    if (!v || !*v) return def;
    errno = 0;
    n = strtol(v, &end, 10);
    if (errno || *end || n < 0) {
        log_warning("service: bad environment value name=<%s>", name);
        return def;
    }
    return n;
}

static int service_status_ok;
static int service_listen_blocking;  /* fd 3 lacks O_NONBLOCK */

static void service_sigalrm(int sig)
{
    (void)sig;          /* only ends a blocking accept() with EINTR */
}

static pid_t service_master_pid;     /* 0 = not known */

/* Leave as on SIGTERM (the master is gone).  SIGTERM must be blocked. */
static void service_orphaned(void)
{
    service_term_flag = 1;
    service_close_listener();
}

/* 1 when the master is known to be gone: not our parent any more, or
 * nobody left to read the status pipe. */
static int service_master_gone(void)
{
    struct pollfd pfd;

    if (service_master_pid > 0 && getppid() != service_master_pid)
        return 1;
    if (!service_status_ok)
        return 0;
    pfd.fd = SERVICE_STATUS_FD;
    pfd.events = 0;
    pfd.revents = 0;
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLERR | POLLHUP));
}

static void service_report(enum service_state state, unsigned served)
{
    struct service_status st;
    ssize_t n;

    if (!service_status_ok) return;
    memset(&st, 0, sizeof(st));
    st.pid = (uint32_t)getpid();
    st.state = (uint32_t)state;
    st.served = (uint32_t)served;
    do {
        n = write(SERVICE_STATUS_FD, &st, sizeof(st));
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EPIPE) {
        service_status_ok = 0;       /* nobody reads: the master is gone */
        service_orphaned();
    } else if (n < 0 && errno != EAGAIN) {
        log_warning("service: status write failed error=<%s>",
                    strerror(errno));
    }
}

static void service_peer_text(const struct sockaddr_storage *ss,
                              socklen_t len, char *out, size_t outlen)
{
    char host[INET6_ADDRSTRLEN];

    if (len == 0 || ss->ss_family == AF_UNIX) {
        snprintf(out, outlen, "unix");
    } else if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;
        if (!inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host)))
            snprintf(host, sizeof(host), "?");
        snprintf(out, outlen, "%s:%u", host, (unsigned)ntohs(sin->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;
        if (!inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host)))
            snprintf(host, sizeof(host), "?");
        snprintf(out, outlen, "[%s]:%u", host,
                 (unsigned)ntohs(sin6->sin6_port));
    } else {
        snprintf(out, outlen, "unknown");
    }
}

/* 1 when fd 3 is a listening socket. */
static int service_have_listener(void)
{
    int on = 0;
    socklen_t len = sizeof(on);

    if (getsockopt(SERVICE_LISTEN_FD, SOL_SOCKET, SO_ACCEPTCONN,
                   &on, &len) < 0)
        return 0;
    return on != 0;
}

/* The accept loop proper; returns the exit status. */
static int service_loop(const struct service_callbacks *cb, long maxuses,
                        long idletimeout)
{
    sigset_t term, waitmask;
    volatile unsigned served = 0;
    volatile int report_ready = 1;
    volatile int status = 0;
    const char *volatile why = "stopped";

    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &waitmask);
    sigdelset(&waitmask, SIGTERM);

    for (;;) {
        struct pollfd pfd[2];
        nfds_t npfd = 1;
        struct timespec ts, *tsp = NULL;
        struct sockaddr_storage ss;
        socklen_t sslen;
        char peer[INET6_ADDRSTRLEN + 16];
        int r, fd = -1;

        if (service_term_flag) {
            why = service_master_gone() ? "master gone" : "stopped";
            break;
        }
        if (maxuses > 0 && served >= (unsigned long)maxuses) {
            why = "maxuses";
            break;
        }
        if (report_ready) {
            service_report(SERVICE_READY, served);
            report_ready = 0;
        }

        pfd[0].fd = SERVICE_LISTEN_FD;
        pfd[0].events = POLLIN;
        pfd[0].revents = 0;
        if (service_status_ok) {
            /* the write end reports POLLERR once the master is gone */
            pfd[1].fd = SERVICE_STATUS_FD;
            pfd[1].events = 0;
            pfd[1].revents = 0;
            npfd = 2;
        }
        if (idletimeout > 0) {
            ts.tv_sec = idletimeout;
            ts.tv_nsec = 0;
            tsp = &ts;
        }
        r = ppoll(pfd, npfd, tsp, &waitmask);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            log_error("service: poll failed error=<%s>", strerror(errno));
            status = 1;
            goto out_noreport;
        }
        if (r == 0) { why = "idle"; break; }
        if (npfd == 2 && (pfd[1].revents & (POLLERR | POLLHUP))) {
            service_orphaned();
            why = "master gone";
            break;
        }
        if (!(pfd[0].revents & (POLLIN | POLLERR | POLLNVAL)))
            continue;
        if (pfd[0].revents & (POLLERR | POLLNVAL)) {
            log_error("service: listening socket failed");
            status = 1;
            goto out_noreport;
        }

        sslen = sizeof(ss);
        memset(&ss, 0, sizeof(ss));
        if (sigsetjmp(service_accept_jmp, 1) == 0) {
            service_in_accept = 1;
            sigprocmask(SIG_UNBLOCK, &term, NULL);
            fd = accept(SERVICE_LISTEN_FD, (struct sockaddr *)&ss, &sslen);
            service_in_accept = 0;
            sigprocmask(SIG_BLOCK, &term, NULL);
        } else {
            /* SIGTERM while blocked in accept(): the mask was restored */
            why = "stopped";
            break;
        }
        if (fd < 0) {
            switch (errno) {
            case EINTR: case EAGAIN: case ECONNABORTED: case EPROTO:
            case ENETDOWN: case ENOPROTOOPT: case EHOSTDOWN: case ENONET:
            case EHOSTUNREACH: case EOPNOTSUPP: case ENETUNREACH:
                continue;
            case EMFILE: case ENFILE: case ENOBUFS: case ENOMEM:
                log_warning("service: accept failed error=<%s>",
                            strerror(errno));
                {
                    struct timespec pause = { 0, 100 * 1000 * 1000 };
                    nanosleep(&pause, NULL);
                }
                continue;
            default:
                log_error("service: accept failed error=<%s>",
                          strerror(errno));
                status = 1;
                goto out_noreport;
            }
        }

        served++;
        service_report(SERVICE_BUSY, served);
        service_peer_text(&ss, sslen, peer, sizeof(peer));
        sigprocmask(SIG_UNBLOCK, &term, NULL);
        cb->serve(fd, peer, cb->rock);
        sigprocmask(SIG_BLOCK, &term, NULL);
        close(fd);
        report_ready = 1;
    }

    if (strcmp(why, "master gone") == 0)
        log_info("service: master gone: leaving served=<%u>", served);
    else
        log_debug("service: leaving reason=<%s> served=<%u>", why, served);
    service_report(SERVICE_EXITING, served);
out_noreport:
    sigprocmask(SIG_UNBLOCK, &term, NULL);
    return status;
}

/* ---- the multiplexing loop (service_main_mux) ------------------------ */

/* How long a process that holds n connections lets a new one wait on the
 * listening socket, so that a process with none (or one the master forks
 * meanwhile) takes it first: 10 ms doubled for each connection beyond
 * the first, at most 160 ms.  Connections stay where they are accepted,
 * so spreading a burst of new ones over processes matters. */
#define SERVICE_MUX_DEFER 0.010
#define SERVICE_MUX_DEFER_MAX 0.160

/* The master's shared page (fd 5), mapped read-only, or NULL. */
static const struct service_shared *service_shared_page;

static void service_shared_map(void)
{
    struct stat st;
    void *m;

    if (fstat(SERVICE_SHARED_FD, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size < (off_t)sizeof(struct service_shared))
        return;             /* no page (an older master, run by hand) */
    m = mmap(NULL, sizeof(struct service_shared), PROT_READ, MAP_SHARED,
             SERVICE_SHARED_FD, 0);
    if (m == MAP_FAILED)
        return;
    service_shared_page = m;
    close(SERVICE_SHARED_FD);
}

/* 1 when the master will start no child for a waiting client. */
static int service_master_saturated(void)
{
    if (!service_shared_page)
        return 1;
    return __atomic_load_n(&service_shared_page->saturated,
                           __ATOMIC_RELAXED) != 0;
}

static double service_mux_defer(size_t nconns)
{
    double d = SERVICE_MUX_DEFER;

    while (nconns-- > 1 && d < SERVICE_MUX_DEFER_MAX)
        d *= 2;
    return d < SERVICE_MUX_DEFER_MAX ? d : SERVICE_MUX_DEFER_MAX;
}

struct service_conn {
    int fd;                     /* -1: ended, to be removed */
    void *h;                    /* the callbacks' handle */
    double last;                /* monotonic time of the last input */
};

static double service_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void service_soonest(double *wake, double t)
{
    if (*wake == 0 || t < *wake)
        *wake = t;
}

/* Drop the connections marked ended (fd -1). */
static size_t service_conns_compact(struct service_conn *c, size_t n)
{
    size_t i, j = 0;

    for (i = 0; i < n; i++)
        if (c[i].fd >= 0)
            c[j++] = c[i];
    return j;
}

/* The idle connection that has been silent longest and may give way
 * (evictable), or -1; its silence must have lasted idle_timeout by
 * *at_r's time: *at_r gets when that is (<= now: at once). */
static long service_conns_victim(const struct service_mux_callbacks *cb,
                                 struct service_conn *c, size_t n,
                                 double *at_r)
{
    long best = -1;
    size_t i;

    if (cb->idle_timeout <= 0)
        return -1;
    for (i = 0; i < n; i++) {
        if (c[i].fd < 0 || (cb->evictable && !cb->evictable(c[i].h, cb->rock)))
            continue;
        if (best < 0 || c[i].last < c[best].last)
            best = (long)i;
    }
    if (best >= 0)
        *at_r = c[best].last + cb->idle_timeout;
    return best;
}

/* Accept one connection from the (non-blocking) listening socket: the fd,
 * or -1 (lost the race, a transient error, or SIGTERM), or -2 for a
 * failure that ends the process.  SIGTERM must be blocked. */
static int service_accept(const sigset_t *term, char *peer, size_t peerlen)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    volatile int fd = -1;

    memset(&ss, 0, sizeof(ss));
    if (sigsetjmp(service_accept_jmp, 1) == 0) {
        /* a blocking listening socket (not made by our master): a lost
         * race must not keep the connections held here waiting, so a
         * timer (SIGALRM, no SA_RESTART) ends the wait */
        struct itimerval limit = { { 0, 0 }, { 0, 50000 } };
        struct itimerval off = { { 0, 0 }, { 0, 0 } };

        if (service_listen_blocking)
            setitimer(ITIMER_REAL, &limit, NULL);
        service_in_accept = 1;
        sigprocmask(SIG_UNBLOCK, term, NULL);
        fd = accept(SERVICE_LISTEN_FD, (struct sockaddr *)&ss, &sslen);
        service_in_accept = 0;
        sigprocmask(SIG_BLOCK, term, NULL);
        if (service_listen_blocking)
            setitimer(ITIMER_REAL, &off, NULL);
    } else {
        return -1;          /* SIGTERM while in accept(): mask restored */
    }
    if (fd < 0) {
        switch (errno) {
        case EINTR: case EAGAIN: case ECONNABORTED: case EPROTO:
        case ENETDOWN: case ENOPROTOOPT: case EHOSTDOWN: case ENONET:
        case EHOSTUNREACH: case EOPNOTSUPP: case ENETUNREACH:
            return -1;
        case EMFILE: case ENFILE: case ENOBUFS: case ENOMEM:
            log_warning("service: accept failed error=<%s>", strerror(errno));
            {
                struct timespec pause = { 0, 100 * 1000 * 1000 };
                nanosleep(&pause, NULL);
            }
            return -1;
        default:
            log_error("service: accept failed error=<%s>", strerror(errno));
            return -2;
        }
    }
    service_peer_text(&ss, sslen, peer, peerlen);
    return fd;
}

static int service_mux_loop(const struct service_mux_callbacks *cb,
                            long maxuses, long idletimeout)
{
    sigset_t term, waitmask;
    size_t maxconns = cb->max_conns > 0 ? (size_t)cb->max_conns : 1;
    struct service_conn *conns = calloc(maxconns, sizeof(*conns));
    struct pollfd *pfd = calloc(maxconns + 2, sizeof(*pfd));
    size_t nconns = 0, i;
    unsigned served = 0;
    int reported = 0, status = 0;
    double defer_until = 0, pending_since = 0, idle_since = service_now();
    const char *why = "stopped";

    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &waitmask);
    sigdelset(&waitmask, SIGTERM);
    if (!conns || !pfd) {
        log_error("service: out of memory");
        status = 1;
        goto out_noreport;
    }

    for (;;) {
        double now = service_now(), wake = 0, at = 0;
        struct timespec ts, *tsp = NULL;
        nfds_t n = 0;
        int accepting, poll_listener, r;
        long listen_ix = -1, status_ix = -1;
        size_t conn_base, had, had_before_timeouts;

        if (service_term_flag) {
            why = service_master_gone() ? "master gone" : "stopped";
            break;
        }
        accepting = service_listen_open &&
                    !(maxuses > 0 && served >= (unsigned long)maxuses);
        if (!accepting && nconns == 0) {
            why = service_listen_open ? "maxuses" : "stopped";
            break;
        }
        if (nconns == 0 && idletimeout > 0) {
            if (now - idle_since >= (double)idletimeout) {
                why = "idle";
                break;
            }
            service_soonest(&wake, idle_since + (double)idletimeout);
        }
        /* READY only with no connection at all: the master counts a
         * process holding connections as busy and starts another for
         * new clients while it may (maxchild) */
        {
            int state = nconns == 0 ? SERVICE_READY : SERVICE_BUSY;

            if (state != reported) {
                service_report((enum service_state)state, served);
                reported = state;
            }
        }

        /* silent for the whole timeout: 421 and close; a process that
         * accepts no more (maxuses) lets an idle connection go after
         * idle_timeout, so that it leaves and a fresh one takes over */
        had_before_timeouts = nconns;
        for (i = 0; i < nconns; i++) {
            double t = cb->timeout > 0
                       ? conns[i].last + (double)cb->timeout : 0;
            enum service_end end_why = SERVICE_END_TIMEOUT;

            if (!accepting && cb->idle_timeout > 0 &&
                (!cb->evictable || cb->evictable(conns[i].h, cb->rock))) {
                double ti = conns[i].last + (double)cb->idle_timeout;

                if (t == 0 || ti < t) {
                    t = ti;
                    end_why = SERVICE_END_IDLE;
                }
            }
            if (t == 0)
                continue;
            if (t <= now) {
                sigprocmask(SIG_UNBLOCK, &term, NULL);
                cb->end(conns[i].h, end_why, cb->rock);
                sigprocmask(SIG_BLOCK, &term, NULL);
                close(conns[i].fd);
                conns[i].fd = -1;
            } else {
                service_soonest(&wake, t);
            }
        }
        nconns = service_conns_compact(conns, nconns);
        if (nconns == 0 && had_before_timeouts > 0) {
            defer_until = 0;
            idle_since = now;
            if (!accepting)
                continue;           /* leaves at the top of the loop */
        }

        poll_listener = accepting;
        if (accepting && defer_until > now) {
            poll_listener = 0;
            service_soonest(&wake, defer_until);
        }
        if (poll_listener && nconns >= maxconns) {
            /* full: a waiting client is looked at only once one of ours
             * may give way to it */
            if (service_conns_victim(cb, conns, nconns, &at) < 0) {
                poll_listener = 0;
            } else if (at > now) {
                poll_listener = 0;
                service_soonest(&wake, at);
            }
        }

        if (poll_listener) {
            listen_ix = (long)n;
            pfd[n].fd = SERVICE_LISTEN_FD;
            pfd[n].events = POLLIN;
            pfd[n++].revents = 0;
        }
        if (service_status_ok) {
            status_ix = (long)n;
            pfd[n].fd = SERVICE_STATUS_FD;
            pfd[n].events = 0;
            pfd[n++].revents = 0;
        }
        conn_base = n;
        for (i = 0; i < nconns; i++) {
            pfd[n].fd = conns[i].fd;
            pfd[n].events = POLLIN;
            pfd[n++].revents = 0;
        }
        if (wake > 0) {
            double left = wake - now;

            if (left < 0)
                left = 0;
            ts.tv_sec = (time_t)left;
            ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9) + 1000000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            tsp = &ts;
        }
        r = ppoll(pfd, n, tsp, &waitmask);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            log_error("service: poll failed error=<%s>", strerror(errno));
            status = 1;
            break;
        }
        if (defer_until > 0 && defer_until <= now && listen_ix >= 0 &&
            !pfd[listen_ix].revents)
            defer_until = pending_since = 0;   /* another one took it */
        if (r == 0)
            continue;
        if (status_ix >= 0 && (pfd[status_ix].revents & (POLLERR | POLLHUP))) {
            service_orphaned();
            why = "master gone";
            break;
        }

        /* connections with input first: a command beats a new client */
        had = nconns;
        for (i = 0; i < nconns; i++) {
            if (!pfd[conn_base + i].revents)
                continue;
            sigprocmask(SIG_UNBLOCK, &term, NULL);
            r = cb->input(conns[i].h, cb->rock);
            sigprocmask(SIG_BLOCK, &term, NULL);
            if (r != 0) {
                close(conns[i].fd);
                conns[i].fd = -1;
            } else {
                conns[i].last = service_now();
            }
        }
        nconns = service_conns_compact(conns, nconns);
        if (had > 0 && nconns == 0)
            idle_since = service_now();

        if (listen_ix < 0 || !pfd[listen_ix].revents || !service_listen_open)
            continue;
        if (pfd[listen_ix].revents & (POLLERR | POLLNVAL)) {
            log_error("service: listening socket failed");
            status = 1;
            break;
        }
        if (nconns > 0) {
            double t = service_now();

            if (!service_master_saturated()) {
                /* the master forks for it, or an idle child takes it:
                 * look again in a moment */
                pending_since = 0;
                defer_until = t + SERVICE_MUX_DEFER;
                continue;
            }
            if (pending_since == 0)
                pending_since = t;
            if (t < pending_since + service_mux_defer(nconns)) {
                /* the least loaded process takes it first */
                defer_until = pending_since + service_mux_defer(nconns);
                continue;
            }
        }
        defer_until = pending_since = 0;
        if (nconns >= maxconns) {
            long v = service_conns_victim(cb, conns, nconns, &at);

            if (v < 0 || at > service_now())
                continue;
            sigprocmask(SIG_UNBLOCK, &term, NULL);
            cb->end(conns[v].h, SERVICE_END_IDLE, cb->rock);
            sigprocmask(SIG_BLOCK, &term, NULL);
            close(conns[v].fd);
            conns[v].fd = -1;
            nconns = service_conns_compact(conns, nconns);
        }
        {
            char peer[INET6_ADDRSTRLEN + 16];
            int fd = service_accept(&term, peer, sizeof(peer));
            void *h;

            if (fd == -2) {
                status = 1;
                break;
            }
            if (fd < 0)
                continue;
            served++;
            if (reported != SERVICE_BUSY) {
                service_report(SERVICE_BUSY, served);
                reported = SERVICE_BUSY;
            }
            sigprocmask(SIG_UNBLOCK, &term, NULL);
            h = cb->open(fd, peer, cb->rock);
            sigprocmask(SIG_BLOCK, &term, NULL);
            if (!h) {
                close(fd);
                if (nconns == 0)
                    idle_since = service_now();
            } else {
                conns[nconns].fd = fd;
                conns[nconns].h = h;
                conns[nconns].last = service_now();
                nconns++;
            }
        }
    }

    /* stopping: every connection is between commands here */
    for (i = 0; i < nconns; i++) {
        cb->end(conns[i].h, SERVICE_END_STOP, cb->rock);
        close(conns[i].fd);
    }
    nconns = 0;
    if (status == 0) {
        if (strcmp(why, "master gone") == 0)
            log_info("service: master gone: leaving served=<%u>", served);
        else
            log_debug("service: leaving reason=<%s> served=<%u>", why,
                      served);
        service_report(SERVICE_EXITING, served);
    }
out_noreport:
    free(conns);
    free(pfd);
    sigprocmask(SIG_UNBLOCK, &term, NULL);
    return status;
}

/* What service_main and service_main_mux share before their loop: signal
 * set-up, the orphan check, the environment.  1 to go on, 0 when the
 * master is gone already. */
static int service_setup(long *maxuses_r, long *idletimeout_r)
{
    service_listen_open = 1;
    service_master_pid =
        (pid_t)service_getenv_long("CYRUSDELIVER_MASTER_PID", 0);
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0)
        log_warning("service: prctl PR_SET_PDEATHSIG failed error=<%s>",
                    strerror(errno));
    if (service_master_gone()) {
        log_info("service: master gone before the start: leaving");
        return 0;
    }
    *maxuses_r = service_getenv_long("CYRUSDELIVER_MAXUSES", 0);
    *idletimeout_r = service_getenv_long("CYRUSDELIVER_IDLETIMEOUT", 0);
    if (*idletimeout_r > INT_MAX / 1000)
        *idletimeout_r = INT_MAX / 1000;
    return 1;
}

static void service_signals(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);

    sa.sa_handler = service_sigterm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    service_status_ok = fcntl(SERVICE_STATUS_FD, F_GETFD) >= 0;
}

int service_main_mux(int argc, char **argv,
                     const struct service_mux_callbacks *cb)
{
    long maxuses, idletimeout;
    int status;

    service_signals();
    if (!service_have_listener()) {
        /* run by hand: one session on stdin/stdout */
        service_status_ok = 0;
        if (cb->init && cb->init(argc, argv, cb->rock) != 0) return 75;
        cb->serve(0, "stdin", cb->rock);
        if (cb->done) cb->done(cb->rock);
        return 0;
    }
    if (!service_setup(&maxuses, &idletimeout))
        return 0;
    {
        int fl = fcntl(SERVICE_LISTEN_FD, F_GETFL);
        struct sigaction sa;

        service_shared_map();
        service_listen_blocking = fl >= 0 && !(fl & O_NONBLOCK);
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = service_sigalrm;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);   /* no SA_RESTART */
    }
    if (cb->init && cb->init(argc, argv, cb->rock) != 0) return 75;
    status = service_mux_loop(cb, maxuses, idletimeout);
    if (cb->done) cb->done(cb->rock);
    return status;
}

int service_main(int argc, char **argv, const struct service_callbacks *cb)
{
    long maxuses, idletimeout;
    int status;

    service_signals();
    if (!service_have_listener()) {
        /* run by hand: one session on stdin/stdout */
        service_status_ok = 0;
        if (cb->init && cb->init(argc, argv, cb->rock) != 0) return 75;
        cb->serve(0, "stdin", cb->rock);
        if (cb->done) cb->done(cb->rock);
        return 0;
    }
    /* leave when the master dies (see the top of this file); checked
     * once more after setting it: the master may be gone already */
    if (!service_setup(&maxuses, &idletimeout))
        return 0;
    if (cb->init && cb->init(argc, argv, cb->rock) != 0) return 75;

    status = service_loop(cb, maxuses, idletimeout);
    if (cb->done) cb->done(cb->rock);
    return status;
}

/* Copy stdin into the socket and the socket out to stdout until the
 * session ends.  Runs in a child; never returns. */
static void service_relay(int sock)
{
    char buf[65536];
    int in_open = 1;

    for (;;) {
        struct pollfd pfd[2];
        int n = 0, r;
        ssize_t got;

        pfd[n].fd = sock;
        pfd[n].events = POLLIN;
        pfd[n++].revents = 0;
        if (in_open) {
            pfd[n].fd = 0;
            pfd[n].events = POLLIN;
            pfd[n++].revents = 0;
        }
        r = poll(pfd, (nfds_t)n, -1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        if (pfd[0].revents) {
            got = read(sock, buf, sizeof(buf));
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                _exit(0);       /* the session ended */
            for (ssize_t off = 0; off < got;) {
                ssize_t w = write(1, buf + off, (size_t)(got - off));
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0)
                    _exit(1);
                off += w;
            }
        }
        if (in_open && n > 1 && pfd[1].revents) {
            got = read(0, buf, sizeof(buf));
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                in_open = 0;
                shutdown(sock, SHUT_WR);
                continue;
            }
            for (ssize_t off = 0; off < got;) {
                ssize_t w = write(sock, buf + off, (size_t)(got - off));
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0)
                    _exit(0);   /* the session is gone */
                off += w;
            }
        }
    }
}

/* See service.h. */
void service_serve_stdio(int fd, const char *peer,
                         void (*fn)(int fd, const char *peer, void *rock),
                         void *rock)
{
    struct stat st;
    int sv[2];
    pid_t pid;

    if (fd != 0 || (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))) {
        fn(fd, peer, rock);
        return;
    }
    /* stdin by hand: relay through a socketpair */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        log_error("service: socketpair failed error=<%s>", strerror(errno));
        return;
    }
    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        log_error("service: fork failed error=<%s>", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return;
    }
    if (pid == 0) {
        close(sv[0]);
        service_relay(sv[1]);
    }
    close(sv[1]);
    fn(sv[0], peer, rock);
    close(sv[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* A non-negative decimal for -U / -T. */
static int service_number(const char *s)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 0 || v > 1000000000L)
        return -1;
    return 0;
}

int service_parse_args(int argc, char **argv, char flag, int *flag_r,
                       const char *defconf, const char **confpath_r,
                       void (*usage)(FILE *out))
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    char opts[] = "C:xU:T:h";
    const char *env;
    int opt;

    if (flag)
        opts[2] = flag;
    else
        memmove(opts + 2, opts + 3, sizeof(opts) - 3);
    *confpath_r = NULL;
    if (flag_r)
        *flag_r = 0;
    while ((opt = getopt_long(argc, argv, opts, longopts, NULL)) != -1) {
        if (opt == 'C') {
            *confpath_r = optarg;
        } else if (flag && opt == flag) {
            if (flag_r)
                *flag_r = 1;
        } else if ((opt == 'U' || opt == 'T') &&
                   service_number(optarg) == 0) {
            setenv(opt == 'U' ? "CYRUSDELIVER_MAXUSES"
                              : "CYRUSDELIVER_IDLETIMEOUT", optarg, 1);
        } else if (opt == 'h') {
            usage(stdout);
            return -1;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc) {
        usage(stderr);
        return 2;
    }
    if (!*confpath_r) {
        env = getenv("CYRUSDELIVER_CONF");
        *confpath_r = env && *env ? env : defconf;
    }
    return 0;
}
