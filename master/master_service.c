/*
 * master_service.c - services: sockets, children, spawn policy, status
 * pipes, backoff, reload and drain (policy described in master_service.h).
 *
 * Invariants:
 * - The master never accepts a connection.  It polls a listening socket
 *   only while the service has no idle and no starting child, is below
 *   maxchild, is not backing off and maxforkrate allows a fork; so a pending
 *   connection it cannot act on never wakes it up (no busy loop).
 * - Counts are not kept incrementally: they are recomputed from the child
 *   list, which is changed in exactly two places (fork, reap).  A status
 *   message only changes the state of a child still in the list; a
 *   message from a pid already reaped is dropped.
 * - Every descriptor the master holds is close-on-exec; a child gets only
 *   fds 0-2 (the master's), 3 (listen), 4 (status pipe write end) and 5
 *   (the service's shared page: whether the master is saturated, i.e.
 *   would start no child for a waiting client; lib/service.h).
 * - Listening sockets are non-blocking (set once, at creation; the flag is
 *   shared by every child): a child that loses the race for a connection
 *   gets EAGAIN from accept() and goes back to its poll (lib/service.h).
 *   The backlog is backlog= or, by default, the system's maximum.
 * - Each service has its own status pipe, read end non-blocking in the
 *   master.  The master keeps the write end open too, so the pipe never
 *   reads EOF while the service exists.  The master holds the only read
 *   end: when it dies, its children's write ends poll POLLERR, one of the
 *   ways they learn that they are orphans (lib/service.c).
 * - A UNIX socket path is removed only when nothing answers on it (a
 *   connect() is refused: a file left by a master that died), and at the
 *   end only when it is still the socket this master bound (same device
 *   and inode): a master that cannot start, or a second one, never takes
 *   the path of a running one away.
 * - An address in use (TCP EADDRINUSE, a UNIX path that answers) is
 *   retried every 100 ms until the bind wait set by
 *   master_service_bind_wait() ends: the workers of a master that was
 *   killed leave after their connection in progress and free it.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/metrics.h"
#include "master/master_compat.h"
#include "lib/service.h"
#include "master/master_service.h"

#define FAILED_START_SECS 2.0
#define BACKOFF_AFTER 5
#define BACKOFF_MAX 64

enum child_state {
    CHILD_STARTING,
    CHILD_READY,
    CHILD_BUSY,
    CHILD_STOPPING
};

static const char *const child_state_names[] = {
    "starting", "ready", "busy", "stopping"
};

struct service;

struct child {
    pid_t pid;
    struct service *svc;
    enum child_state state;
    int was_ready;              /* reported READY at least once */
    int exiting;                /* reported EXITING */
    int signalled;              /* we sent it SIGTERM */
    unsigned served;
    double forked;              /* monotonic */
    struct child *next;
};

struct service {
    char *name;
    /* from the entry */
    char *cmd, *listen, *proto;
    enum master_listen_kind kind;
    char *host, *port;
    int prefork, maxchild, maxforkrate, maxfds, babysit;
    int maxuses, idletimeout, backlog;
    char **argv;

    int listen_fd;              /* -1 when closed */
    char *unix_path;            /* socket file we created, to unlink */
    dev_t unix_dev;             /* ... as bound: unlinked only when the */
    ino_t unix_ino;             /* path still names this socket */
    int status_rd, status_wr;
    int shared_fd;              /* memfd of the shared page, or -1 */
    struct service_shared *shared;  /* mapped, or NULL */
    int removed;                /* no more forks; freed when childless */
    int demand;                 /* the socket was readable */

    int failures;               /* failed starts in a row */
    int backoff;                /* seconds, 0 = none */
    double backoff_until;
    /* maxforkrate: the times of the last maxforkrate forks (a ring,
     * forks[forkpos] the oldest); a fork is allowed when the oldest is
     * at least 1 s old, so no 1-second window holds more than
     * maxforkrate forks */
    double *forks;
    int nforks, forkpos;

    unsigned long served;       /* connections finished by past children */
    unsigned long nforked, ncrashed;    /* for the metrics */
    struct service *next;
};

static struct service *services;
static struct child *children;
static double bind_wait_secs;   /* master_service_bind_wait() */
static int changed_flag = 1;
static char *opt_servicedir, *opt_masterdir, *opt_imapdconf;

/* poll bookkeeping: what each appended pollfd belongs to */
struct pollref {
    struct service *svc;
    int is_listen;
};
static struct pollref *pollrefs;
static size_t pollrefs_alloc;

double master_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *xstrdup_or_null(const char *s)
{
    char *r;

    if (!s) return NULL;
    r = strdup(s);
    if (!r) log_fatal(71, "master: out of memory");
    return r;
}

void master_service_setup(const char *servicedir, const char *masterdir,
                          const char *imapdconf)
{
    free(opt_servicedir);
    free(opt_masterdir);
    free(opt_imapdconf);
    opt_servicedir = xstrdup_or_null(servicedir);
    opt_masterdir = xstrdup_or_null(masterdir);
    opt_imapdconf = xstrdup_or_null(imapdconf);
}

static char *join_path(const char *dir, size_t dirlen, const char *word)
{
    size_t wl = strlen(word);
    char *p = malloc(dirlen + wl + 2);

    if (!p) log_fatal(71, "master: out of memory");
    memcpy(p, dir, dirlen);
    p[dirlen] = '/';
    memcpy(p + dirlen + 1, word, wl + 1);
    return p;
}

static int is_executable(const char *path)
{
    struct stat sb;

    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode)
        && access(path, X_OK) == 0;
}

char *master_service_resolve(const char *word)
{
    const char *path, *p;
    char *cand;

    if (!word || !*word) return NULL;
    if (strchr(word, '/')) return xstrdup_or_null(word);
    if (opt_servicedir) {
        cand = join_path(opt_servicedir, strlen(opt_servicedir), word);
        if (is_executable(cand)) return cand;
        free(cand);
    }
    if (opt_masterdir) {
        cand = join_path(opt_masterdir, strlen(opt_masterdir), word);
        if (is_executable(cand)) return cand;
        free(cand);
    }
    /* the build tree's siblings of the master (lmtpd/, metricsd/, ...) */
    if ((cand = master_compat_find_ours(word)) != NULL)
        return cand;
#ifdef MASTER_LIBEXECDIR
    cand = join_path(MASTER_LIBEXECDIR, strlen(MASTER_LIBEXECDIR), word);
    if (is_executable(cand)) return cand;
    free(cand);
#endif
    path = getenv("PATH");
    if (!path) path = "/usr/bin:/bin";
    for (p = path; ; ) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);

        if (len == 0) cand = join_path(".", 1, word);
        else cand = join_path(p, len, word);
        if (is_executable(cand)) return cand;
        free(cand);
        if (!colon) break;
        p = colon + 1;
    }
    return NULL;
}

pid_t master_service_forkexec(char *const argv[], int listen_fd,
                              int status_fd, int shared_fd, int maxfds,
                              char *const env[])
{
    char *prog = master_service_resolve(argv[0]);
    sigset_t all, saved;
    pid_t pid;
    int err;

    /* Every signal stays blocked from before fork() until the child has
     * reset its dispositions: a SIGTERM sent to the new pid in between
     * would otherwise run the master's handler in the child (which only
     * writes to the master's self-pipe) and be lost, and the child would
     * exec and never stop.  Blocked, it stays pending and, once the
     * disposition is the default, ends the child when unblocked. */
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &saved);
    pid = fork();
    if (pid != 0) {
        err = errno;
        sigprocmask(SIG_SETMASK, &saved, NULL);
        if (pid < 0) {
            log_error("master: fork failed error=<%s>", strerror(err));
            free(prog);
            return -1;
        }
        free(prog);
        return pid;
    }

    /* the child: nothing here may return */
    {
        static const int sigs[] = { SIGCHLD, SIGHUP, SIGTERM, SIGINT,
                                    SIGQUIT, SIGPIPE, SIGALRM, SIGUSR1,
                                    SIGUSR2 };
        struct sigaction sa;
        sigset_t none;
        size_t i;
        int lfd = -1, sfd = -1, mfd = -1;

        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
            sigaction(sigs[i], &sa, NULL);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);

        /* move them out of the way first: any may sit on 3, 4 or 5 */
        if (listen_fd >= 0 && (lfd = fcntl(listen_fd, F_DUPFD, 6)) < 0)
            _exit(127);
        if (status_fd >= 0 && (sfd = fcntl(status_fd, F_DUPFD, 6)) < 0)
            _exit(127);
        if (shared_fd >= 0 && (mfd = fcntl(shared_fd, F_DUPFD, 6)) < 0)
            _exit(127);
        if (lfd >= 0) {
            if (dup2(lfd, SERVICE_LISTEN_FD) < 0) _exit(127);
        } else {
            close(SERVICE_LISTEN_FD);
        }
        if (sfd >= 0) {
            if (dup2(sfd, SERVICE_STATUS_FD) < 0) _exit(127);
        } else {
            close(SERVICE_STATUS_FD);
        }
        if (mfd >= 0) {
            if (dup2(mfd, SERVICE_SHARED_FD) < 0) _exit(127);
        } else {
            close(SERVICE_SHARED_FD);
        }
        if (close_range(6, ~0U, 0) < 0) {
            long maxfd = sysconf(_SC_OPEN_MAX);
            long fd;
            if (maxfd < 0 || maxfd > 65536) maxfd = 65536;
            for (fd = 6; fd < maxfd; fd++) close((int)fd);
        }
        if (maxfds > 0) {
            struct rlimit rl;
            if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
                rlim_t want = (rlim_t)maxfds;
                if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max)
                    want = rl.rlim_max;
                rl.rlim_cur = want;
                setrlimit(RLIMIT_NOFILE, &rl);
            }
        }
        if (opt_imapdconf) {
            setenv("CYRUSDELIVER_CONF", opt_imapdconf, 1);
            /* the master has logged that file's warnings already */
            setenv("CYRUSDELIVER_CONF_WARNED", opt_imapdconf, 1);
        }
        for (i = 0; env && env[i]; i++) putenv(env[i]);
        if (prog) execv(prog, argv);
        else execvp(argv[0], argv);
        /* stderr is still the master's: one line, then leave */
        {
            char msg[512];
            int n = snprintf(msg, sizeof(msg),
                             "master: exec failed cmd=<%s> error=<%s>\n",
                             argv[0], strerror(errno));
            if (n > 0) {
                ssize_t w = write(2, msg, (size_t)n < sizeof(msg)
                                  ? (size_t)n : sizeof(msg) - 1);
                (void)w;
            }
        }
        _exit(127);
    }
}

/* ---- services ---- */

static void service_close_socket(struct service *s)
{
    if (s->listen_fd >= 0) {
        close(s->listen_fd);
        s->listen_fd = -1;
    }
    if (s->unix_path) {
        struct stat sb;

        if (lstat(s->unix_path, &sb) == 0 && sb.st_dev == s->unix_dev
            && sb.st_ino == s->unix_ino && unlink(s->unix_path) < 0
            && errno != ENOENT)
            log_warning("service=<%s> unlink failed path=<%s> error=<%s>",
                        s->name, s->unix_path, strerror(errno));
        free(s->unix_path);
        s->unix_path = NULL;
    }
}

static void service_free_one(struct service *s)
{
    service_close_socket(s);
    if (s->status_rd >= 0) close(s->status_rd);
    if (s->status_wr >= 0) close(s->status_wr);
    if (s->shared) munmap(s->shared, sizeof(*s->shared));
    if (s->shared_fd >= 0) close(s->shared_fd);
    master_conf_argv_free(s->argv);
    free(s->forks);
    free(s->name);
    free(s->cmd);
    free(s->listen);
    free(s->proto);
    free(s->host);
    free(s->port);
    free(s);
}

/* Copy limits and cmd of e into s.  Returns -1 when cmd does not split. */
/* The listen backlog when cyrus.conf names none: the system's maximum
 * (net.core.somaxconn; listen() caps any larger value at it anyway), so
 * a burst of clients queues instead of being refused (EAGAIN on a UNIX
 * socket, a dropped SYN on TCP). */
static int service_default_backlog(void)
{
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    int v = 0;

    if (f) {
        if (fscanf(f, "%d", &v) != 1)
            v = 0;
        fclose(f);
    }
    if (v < SOMAXCONN)
        v = SOMAXCONN;
    if (v > 65535)
        v = 65535;
    return v;
}

static int service_set_entry(struct service *s, const struct master_entry *e)
{
    char **argv = master_conf_split_cmd(e->cmd);

    if (!argv || !argv[0]) {
        master_conf_argv_free(argv);
        log_error("service=<%s> bad cmd=<%s>", e->name, e->cmd);
        return -1;
    }
    master_conf_argv_free(s->argv);
    s->argv = argv;
    free(s->cmd);
    s->cmd = xstrdup_or_null(e->cmd);
    s->prefork = e->prefork;
    s->maxchild = e->maxchild;
    if (s->maxchild <= 0 || s->maxchild > MASTER_MAXCHILD_CAP)
        s->maxchild = MASTER_MAXCHILD_CAP;
    if (s->prefork > s->maxchild) s->prefork = s->maxchild;
    if (e->maxforkrate != s->maxforkrate || !s->forks) {
        double *f = NULL;
        int i;

        if (e->maxforkrate > 0) {
            f = malloc((size_t)e->maxforkrate * sizeof(*f));
            if (!f) log_fatal(71, "master: out of memory");
            for (i = 0; i < e->maxforkrate; i++) f[i] = -1e9;
        }
        free(s->forks);
        s->forks = f;
        s->nforks = e->maxforkrate;
        s->forkpos = 0;
    }
    s->maxforkrate = e->maxforkrate;
    s->maxfds = e->maxfds;
    s->babysit = e->babysit;
    s->maxuses = e->maxuses;
    s->idletimeout = e->idletimeout;
    s->backlog = e->backlog > 0 ? e->backlog : service_default_backlog();
    return 0;
}

static int set_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFD);

    if (fl < 0) return -1;
    return fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

/* Sleep 100 ms when the bind wait has not ended yet (the first call
 * starts it and logs once); returns 1 after sleeping, 0 when it is over. */
static int service_bind_retry(struct service *s, double *until,
                              const char *what)
{
    struct timespec pause = { 0, 100 * 1000 * 1000 };
    double now = master_now();

    if (*until == 0) {
        if (bind_wait_secs <= 0) return 0;
        *until = now + bind_wait_secs;
        log_warning("service=<%s> address in use listen=<%s> (%s): "
                    "waiting up to seconds=<%g> for it", s->name,
                    s->listen, what, bind_wait_secs);
    }
    if (now >= *until) return 0;
    nanosleep(&pause, NULL);
    return 1;
}

/* What is at a UNIX socket path: 0 nothing (or a socket nobody serves,
 * then removed), 1 a socket that answers (in use), -1 something else or
 * an error (logged). */
static int service_unix_probe(struct service *s,
                              const struct sockaddr_un *sun)
{
    struct stat sb;
    int fd, r, err;

    if (lstat(s->host, &sb) < 0) {
        if (errno == ENOENT) return 0;
        log_error("service=<%s> cannot stat path=<%s> error=<%s>",
                  s->name, s->host, strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(sb.st_mode)) {
        log_error("service=<%s> path=<%s> exists and is not a socket: "
                  "not removing it", s->name, s->host);
        return -1;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        log_error("service=<%s> socket failed error=<%s>", s->name,
                  strerror(errno));
        return -1;
    }
    r = connect(fd, (const struct sockaddr *)sun, sizeof(*sun));
    err = errno;
    close(fd);
    if (r == 0 || err == EAGAIN || err == EINPROGRESS)
        return 1;           /* accepted or backlog full: someone serves it */
    if (err == ENOENT) return 0;
    if (err != ECONNREFUSED) {
        log_error("service=<%s> cannot probe path=<%s> error=<%s>",
                  s->name, s->host, strerror(err));
        return -1;
    }
    /* refused: a socket file left behind by a master that is gone */
    if (unlink(s->host) < 0 && errno != ENOENT) {
        log_error("service=<%s> cannot remove stale socket path=<%s> "
                  "error=<%s>", s->name, s->host, strerror(errno));
        return -1;
    }
    log_info("service=<%s> removed stale socket path=<%s>", s->name,
             s->host);
    return 0;
}

static int service_open_unix(struct service *s)
{
    struct sockaddr_un sun;
    struct stat sb;
    size_t len = strlen(s->host);
    double until = 0;
    int fd = -1, r;

    if (len >= sizeof(sun.sun_path)) {
        log_error("service=<%s> socket path too long path=<%s>",
                  s->name, s->host);
        return -1;
    }
    memset(&sun, 0, sizeof(sun));
    sun.sun_family = AF_UNIX;
    memcpy(sun.sun_path, s->host, len + 1);
    for (;;) {
        r = service_unix_probe(s, &sun);
        if (r < 0) return -1;
        if (r == 0) {
            mode_t old;

            fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        0);
            if (fd < 0) goto fail;
            old = umask(0);
            r = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
            umask(old);
            if (r == 0) break;
            if (errno != EADDRINUSE) goto fail;
            close(fd);          /* created meanwhile: probe it again */
            fd = -1;
        }
        if (!service_bind_retry(s, &until, "a running server answers on "
                                "the socket")) {
            log_error("service=<%s> cannot listen path=<%s>: address in "
                      "use (a server answers on it; another master?)",
                      s->name, s->host);
            return -1;
        }
    }
    /* listen at once: until then a client that finds the path is
     * refused (ECONNREFUSED) instead of queued */
    if (listen(fd, s->backlog) < 0) {
        int e = errno;

        unlink(s->host);
        errno = e;
        goto fail;
    }
    if (lstat(s->host, &sb) < 0) goto fail;
    s->unix_path = xstrdup_or_null(s->host);
    s->unix_dev = sb.st_dev;
    s->unix_ino = sb.st_ino;
    if (chmod(s->host, 0777) < 0) goto fail_unlink;
    s->listen_fd = fd;
    return 0;
fail_unlink:
    /* the path is ours: service_close_socket() removes it */
    log_error("service=<%s> cannot listen path=<%s> error=<%s>",
              s->name, s->host, strerror(errno));
    close(fd);
    return -1;
fail:
    log_error("service=<%s> cannot listen path=<%s> error=<%s>",
              s->name, s->host, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
}

static int service_open_tcp(struct service *s)
{
    struct addrinfo hints, *res = NULL, *ai;
    int family = AF_UNSPEC, r, fd = -1, on = 1;
    double until = 0;
    const char *proto = s->proto ? s->proto : "tcp";
    const char *host = s->host;

    if (strcmp(proto, "tcp4") == 0) family = AF_INET;
    else if (strcmp(proto, "tcp6") == 0) family = AF_INET6;
    if (host && (strcmp(host, "*") == 0 || !*host)) host = NULL;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = family;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    r = getaddrinfo(host, s->port, &hints, &res);
    if (r != 0) {
        log_error("service=<%s> cannot resolve listen=<%s> error=<%s>",
                  s->name, s->listen, gai_strerror(r));
        return -1;
    }
again:
    /* "tcp" with no host: prefer a v6 dual-stack socket */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (ai = res; ai; ai = ai->ai_next) {
            if (family == AF_UNSPEC && !host) {
                if (pass == 0 && ai->ai_family != AF_INET6) continue;
                if (pass == 1 && ai->ai_family != AF_INET) continue;
            } else if (pass == 1) {
                break;
            }
            fd = socket(ai->ai_family,
                        ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        ai->ai_protocol);
            if (fd < 0) continue;
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
            if (ai->ai_family == AF_INET6) {
                int v6only = (family == AF_INET6) ? 1 : 0;
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only,
                           sizeof(v6only));
            }
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0
                && listen(fd, s->backlog) == 0)
                break;
            r = errno;
            close(fd);
            fd = -1;
            errno = r;
        }
    }
    if (fd < 0 && errno == EADDRINUSE
        && service_bind_retry(s, &until, "bind"))
        goto again;
    freeaddrinfo(res);
    if (fd < 0) {
        log_error("service=<%s> cannot listen listen=<%s> error=<%s>%s",
                  s->name, s->listen, strerror(errno),
                  errno == EADDRINUSE ? " (another server or master "
                  "holds the address)" : "");
        return -1;
    }
    s->listen_fd = fd;
    return 0;
}

/* The page shared with the service's children (fd 5, lib/service.h).
 * Without it (no memfd) children act as if the master were saturated:
 * they take connections themselves, only a little later. */
static void service_shared_open(struct service *s)
{
    void *m;
    int fd = memfd_create("cyrusdeliver-service", MFD_CLOEXEC);

    if (fd < 0 || ftruncate(fd, (off_t)sizeof(*s->shared)) < 0) {
        log_warning("service=<%s> no shared page error=<%s>", s->name,
                    strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    m = mmap(NULL, sizeof(*s->shared), PROT_READ | PROT_WRITE, MAP_SHARED,
             fd, 0);
    if (m == MAP_FAILED) {
        log_warning("service=<%s> no shared page error=<%s>", s->name,
                    strerror(errno));
        close(fd);
        return;
    }
    s->shared_fd = fd;
    s->shared = m;
    __atomic_store_n(&s->shared->saturated, 1, __ATOMIC_RELAXED);
}

/* Tell the children whether the master would start another child now. */
static void service_shared_set(struct service *s, int saturated)
{
    if (s->shared && s->shared->saturated != (uint32_t)saturated)
        __atomic_store_n(&s->shared->saturated, (uint32_t)saturated,
                         __ATOMIC_RELAXED);
}

static struct service *service_new(const struct master_entry *e)
{
    struct service *s = calloc(1, sizeof(*s));
    int p[2];

    if (!s) log_fatal(71, "master: out of memory");
    s->listen_fd = s->status_rd = s->status_wr = s->shared_fd = -1;
    s->name = xstrdup_or_null(e->name);
    s->listen = xstrdup_or_null(e->listen);
    s->proto = xstrdup_or_null(e->proto);
    s->kind = e->listen_kind;
    s->host = xstrdup_or_null(e->listen_host);
    s->port = xstrdup_or_null(e->listen_port);
    if (service_set_entry(s, e) < 0) goto fail;
    if (s->kind == MASTER_LISTEN_UNIX) {
        if (!s->host || service_open_unix(s) < 0) goto fail;
    } else {
        if (service_open_tcp(s) < 0) goto fail;
    }
    if (pipe2(p, O_CLOEXEC) < 0) {
        log_error("service=<%s> pipe failed error=<%s>", s->name,
                  strerror(errno));
        goto fail;
    }
    s->status_rd = p[0];
    s->status_wr = p[1];
    fcntl(s->status_rd, F_SETFL, fcntl(s->status_rd, F_GETFL) | O_NONBLOCK);
    service_shared_open(s);
    set_cloexec(s->listen_fd);
    log_info("service=<%s> listening listen=<%s> prefork=<%d> "
             "maxchild=<%d>", s->name, s->listen, s->prefork, s->maxchild);
    return s;
fail:
    service_free_one(s);
    return NULL;
}

struct counts {
    int ready, busy, starting, stopping, total;
};


static void service_counts(const struct service *s, struct counts *c)
{
    const struct child *ch;

    memset(c, 0, sizeof(*c));
    for (ch = children; ch; ch = ch->next) {
        if (ch->svc != s) continue;
        c->total++;
        switch (ch->state) {
        case CHILD_READY: c->ready++; break;
        case CHILD_BUSY: c->busy++; break;
        case CHILD_STARTING: c->starting++; break;
        case CHILD_STOPPING: c->stopping++; break;
        }
    }
}

static void child_term(struct child *ch)
{
    if (ch->signalled) return;
    ch->signalled = 1;
    if (ch->state != CHILD_BUSY) ch->state = CHILD_STOPPING;
    kill(ch->pid, SIGTERM);
    changed_flag = 1;
}

static void service_stop(struct service *s, const char *why)
{
    struct child *ch;

    if (s->removed) return;
    s->removed = 1;
    service_close_socket(s);
    for (ch = children; ch; ch = ch->next)
        if (ch->svc == s) child_term(ch);
    log_info("service=<%s> stopping reason=<%s>", s->name, why);
    changed_flag = 1;
}

/* Free removed services without children. */
static void service_collect(void)
{
    struct service **sp = &services;

    while (*sp) {
        struct service *s = *sp;
        struct counts c;

        if (s->removed) {
            service_counts(s, &c);
            if (c.total == 0) {
                *sp = s->next;
                log_info("service=<%s> stopped", s->name);
                service_free_one(s);
                changed_flag = 1;
                continue;
            }
        }
        sp = &s->next;
    }
}

void master_service_bind_wait(double secs)
{
    bind_wait_secs = secs;
}

int master_service_apply(const struct master_conf *conf, int initial)
{
    struct service *s, **tail;
    size_t i;

    /* removals and socket changes first, so a path reused is free */
    for (s = services; s; s = s->next) {
        const struct master_entry *e;

        if (s->removed) continue;
        e = master_conf_find(conf, s->name);
        if (!e || e->section != MASTER_SECTION_SERVICES) {
            service_stop(s, "removed");
        } else if (strcmp(s->listen, e->listen) != 0
                   || strcmp(s->proto ? s->proto : "",
                             e->proto ? e->proto : "") != 0) {
            service_stop(s, "listen changed");
        } else {
            struct counts c;
            struct child *ch;
            int surplus;

            if (service_set_entry(s, e) < 0) {
                service_stop(s, "bad cmd");
                continue;
            }
            service_counts(s, &c);
            surplus = c.total - c.stopping - s->maxchild;
            for (ch = children; ch && surplus > 0; ch = ch->next) {
                if (ch->svc == s && ch->state == CHILD_READY
                    && !ch->signalled) {
                    child_term(ch);
                    surplus--;
                }
            }
            changed_flag = 1;
        }
    }

    tail = &services;
    while (*tail) tail = &(*tail)->next;
    for (i = 0; i < conf->nentries; i++) {
        const struct master_entry *e = &conf->entries[i];
        int found = 0;

        if (e->section != MASTER_SECTION_SERVICES) continue;
        for (s = services; s; s = s->next)
            if (!s->removed && strcmp(s->name, e->name) == 0) found = 1;
        if (found) continue;
        s = service_new(e);
        if (!s) {
            if (initial) return -1;
            continue;
        }
        *tail = s;
        tail = &s->next;
        changed_flag = 1;
    }
    service_collect();
    return 0;
}

/* When maxforkrate allows the next fork (<= now: at once). */
static double service_next_fork(const struct service *s)
{
    if (s->nforks <= 0 || !s->forks) return 0.0;
    return s->forks[s->forkpos] + 1.0;
}

/* 1 when a fork is allowed right now. */
static int service_can_fork(struct service *s, const struct counts *c,
                            double now)
{
    if (s->removed || s->listen_fd < 0) return 0;
    if (c->total >= s->maxchild) return 0;
    if (s->backoff && now < s->backoff_until) return 0;
    if (service_next_fork(s) > now) return 0;
    return 1;
}

static void service_fork_one(struct service *s, double now)
{
    char envs[3][64];
    char *env[5];
    struct child *ch;
    pid_t pid;

    snprintf(envs[0], sizeof(envs[0]), "CYRUSDELIVER_MAXUSES=%d",
             s->maxuses);
    snprintf(envs[1], sizeof(envs[1]), "CYRUSDELIVER_IDLETIMEOUT=%d",
             s->idletimeout);
    snprintf(envs[2], sizeof(envs[2]), "CYRUSDELIVER_MASTER_PID=%ld",
             (long)getpid());
    env[0] = envs[0];
    env[1] = envs[1];
    env[3] = envs[2];
    /* the name may be long: allocate it */
    {
        size_t n = strlen(s->name) + sizeof("CYRUSDELIVER_SERVICE=");
        env[2] = malloc(n);
        if (!env[2]) log_fatal(71, "master: out of memory");
        snprintf(env[2], n, "CYRUSDELIVER_SERVICE=%s", s->name);
    }
    env[4] = NULL;

    pid = master_service_forkexec(s->argv, s->listen_fd, s->status_wr,
                                  s->shared_fd, s->maxfds, env);
    free(env[2]);
    s->nforked += pid > 0;
    if (s->nforks > 0 && s->forks) {
        s->forks[s->forkpos] = now;
        s->forkpos = (s->forkpos + 1) % s->nforks;
    }
    if (pid < 0) {
        /* treat like a failed start so that we do not spin */
        s->failures++;
        s->backoff = s->backoff ? s->backoff : 1;
        s->backoff_until = now + s->backoff;
        return;
    }
    ch = calloc(1, sizeof(*ch));
    if (!ch) log_fatal(71, "master: out of memory");
    ch->pid = pid;
    ch->svc = s;
    ch->state = CHILD_STARTING;
    ch->forked = now;
    ch->next = children;
    children = ch;
    changed_flag = 1;
    log_debug("service=<%s> forked pid=<%d>", s->name, (int)pid);
}

void master_service_spawn(double now)
{
    struct service *s;

    for (s = services; s; s = s->next) {
        struct counts c;
        int want;

        if (s->removed) continue;
        service_counts(s, &c);
        want = s->prefork;
        if (s->babysit && want < 1) want = 1;
        while (c.ready + c.starting < want && service_can_fork(s, &c, now)) {
            service_fork_one(s, now);
            c.starting++;
            c.total++;
        }
        if (s->demand) {
            s->demand = 0;
            if (c.ready == 0 && c.starting == 0
                && service_can_fork(s, &c, now))
                service_fork_one(s, now);
        }
    }
}

static void pollrefs_grow(size_t need)
{
    if (need <= pollrefs_alloc) return;
    pollrefs_alloc = need * 2 + 8;
    pollrefs = realloc(pollrefs, pollrefs_alloc * sizeof(*pollrefs));
    if (!pollrefs) log_fatal(71, "master: out of memory");
}

static void poll_append(struct pollfd **fds, size_t *nalloc, size_t *n,
                        int fd, struct service *s, int is_listen)
{
    if (*n >= *nalloc) {
        *nalloc = *nalloc * 2 + 8;
        *fds = realloc(*fds, *nalloc * sizeof(**fds));
        if (!*fds) log_fatal(71, "master: out of memory");
    }
    pollrefs_grow(*n + 1);
    (*fds)[*n].fd = fd;
    (*fds)[*n].events = POLLIN;
    (*fds)[*n].revents = 0;
    pollrefs[*n].svc = s;
    pollrefs[*n].is_listen = is_listen;
    (*n)++;
}

void master_service_poll_prepare(struct pollfd **fds, size_t *nalloc,
                                 size_t *n, double now, double *deadline)
{
    struct service *s;

    for (s = services; s; s = s->next) {
        struct counts c;

        if (s->status_rd >= 0)
            poll_append(fds, nalloc, n, s->status_rd, s, 0);
        if (s->removed || s->listen_fd < 0) {
            service_shared_set(s, 1);
            continue;
        }
        service_counts(s, &c);
        /* saturated: no child will be started for a waiting client */
        service_shared_set(s, c.total >= s->maxchild ||
                              (s->backoff && now < s->backoff_until));
        if (c.total >= s->maxchild) continue;
        if (s->backoff && now < s->backoff_until) {
            if (s->backoff_until < *deadline) *deadline = s->backoff_until;
            continue;
        }
        if (service_next_fork(s) > now) {
            double t = service_next_fork(s);
            if (t < *deadline) *deadline = t;
            continue;
        }
        if (c.ready == 0 && c.starting == 0)
            poll_append(fds, nalloc, n, s->listen_fd, s, 1);
    }
}

static struct child *child_find(pid_t pid)
{
    struct child *ch;

    for (ch = children; ch; ch = ch->next)
        if (ch->pid == pid) return ch;
    return NULL;
}

static void service_read_status(struct service *s)
{
    struct service_status msgs[64];

    for (;;) {
        ssize_t n = read(s->status_rd, msgs, sizeof(msgs));
        size_t i, cnt;

        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN)
                log_warning("service=<%s> status read failed error=<%s>",
                            s->name, strerror(errno));
            return;
        }
        if (n == 0) return;
        /* each record is written atomically; a partial one cannot occur */
        cnt = (size_t)n / sizeof(msgs[0]);
        for (i = 0; i < cnt; i++) {
            struct child *ch = child_find((pid_t)msgs[i].pid);

            if (!ch || ch->svc != s) continue;
            ch->served = msgs[i].served;
            switch (msgs[i].state) {
            case SERVICE_READY:
                ch->was_ready = 1;
                if (s->failures || s->backoff) {
                    if (s->backoff)
                        log_info("service=<%s> backoff ended", s->name);
                    s->failures = 0;
                    s->backoff = 0;
                }
                ch->state = ch->signalled ? CHILD_STOPPING : CHILD_READY;
                break;
            case SERVICE_BUSY:
                ch->state = CHILD_BUSY;
                break;
            case SERVICE_EXITING:
                ch->exiting = 1;
                ch->state = CHILD_STOPPING;
                break;
            default:
                log_warning("service=<%s> pid=<%d> bad status state=<%u>",
                            s->name, (int)ch->pid, msgs[i].state);
                break;
            }
            changed_flag = 1;
        }
        if ((size_t)n < sizeof(msgs)) return;
    }
}

void master_service_poll_done(const struct pollfd *fds, size_t start,
                              size_t n, double now)
{
    size_t i;

    (void)now;
    for (i = start; i < n; i++) {
        if (!fds[i].revents) continue;
        if (pollrefs[i].is_listen)
            pollrefs[i].svc->demand = 1;
        else
            service_read_status(pollrefs[i].svc);
    }
}

static const char *signame(int sig)
{
    switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "unknown";
    }
}

const char *master_signame(int sig)
{
    return signame(sig);
}

int master_service_reaped(pid_t pid, int wstatus, double now)
{
    struct child **cp, *ch = NULL;
    struct service *s;
    int failed;

    /* drain the pipes first: a READY/EXITING may still be queued */
    for (s = services; s; s = s->next)
        if (s->status_rd >= 0) service_read_status(s);

    for (cp = &children; *cp; cp = &(*cp)->next) {
        if ((*cp)->pid == pid) {
            ch = *cp;
            *cp = ch->next;
            break;
        }
    }
    if (!ch) return 0;
    s = ch->svc;
    s->served += ch->served;
    changed_flag = 1;

    if (WIFSIGNALED(wstatus)) {
        int sig = WTERMSIG(wstatus);
        if (ch->signalled && sig == SIGTERM)
            log_info("service=<%s> pid=<%d> stopped signal=<%d> (%s)",
                     s->name, (int)pid, sig, signame(sig));
        else
            log_warning("service=<%s> pid=<%d> crashed signal=<%d> (%s)",
                    s->name, (int)pid, sig, signame(sig));
        s->ncrashed += !(ch->signalled && sig == SIGTERM);
    } else {
        int st = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
        if (st == 0 && (ch->exiting || ch->signalled))
            log_info("service=<%s> pid=<%d> exited status=<%d>",
                     s->name, (int)pid, st);
        else {
            log_warning("service=<%s> pid=<%d> exited status=<%d>%s",
                        s->name, (int)pid, st,
                        st == 127 ? " (exec failed)" :
                        st == 75 ? " (init failed)" : "");
            s->ncrashed++;
        }
    }

    failed = !ch->was_ready && !ch->signalled
             && (now - ch->forked) < FAILED_START_SECS;
    if (failed && !s->removed) {
        s->failures++;
        if (s->failures >= BACKOFF_AFTER) {
            int nb = s->backoff ? s->backoff * 2 : 1;
            if (nb > BACKOFF_MAX) nb = BACKOFF_MAX;
            if (nb != s->backoff)
                log_warning("service=<%s> backing off seconds=<%d> "
                            "failures=<%d>", s->name, nb, s->failures);
            s->backoff = nb;
            s->backoff_until = now + nb;
        }
    }
    free(ch);
    service_collect();
    return 1;
}

void master_service_shutdown(void)
{
    struct service *s;

    for (s = services; s; s = s->next)
        service_stop(s, "shutdown");
}

void master_service_killall(int sig)
{
    struct child *ch;

    for (ch = children; ch; ch = ch->next)
        kill(ch->pid, sig);
}

size_t master_service_nchildren(void)
{
    const struct child *ch;
    size_t n = 0;

    for (ch = children; ch; ch = ch->next) n++;
    return n;
}

int master_service_changed(void)
{
    int r = changed_flag;

    changed_flag = 0;
    return r;
}

void master_service_status(struct buf *out, double now)
{
    const struct service *s;
    const struct child *ch;

    for (s = services; s; s = s->next) {
        struct counts c;
        unsigned long served = s->served;
        int backoff = 0;

        service_counts(s, &c);
        for (ch = children; ch; ch = ch->next)
            if (ch->svc == s) served += ch->served;
        if (s->backoff && now < s->backoff_until)
            backoff = (int)(s->backoff_until - now + 0.999);
        buf_printf(out, "service %s listen=%s ready=%d busy=%d total=%d "
                   "served=%lu maxchild=%d backoff=%d%s\n",
                   s->name, s->listen, c.ready, c.busy, c.total, served,
                   s->maxchild, backoff, s->removed ? " stopping=1" : "");
    }
    for (s = services; s; s = s->next) {
        for (ch = children; ch; ch = ch->next) {
            if (ch->svc != s) continue;
            buf_printf(out, "child %s pid=%d state=%s served=%u age=%ld\n",
                       s->name, (int)ch->pid, child_state_names[ch->state],
                       ch->served, (long)(now - ch->forked));
        }
    }
}

void master_service_metrics(void)
{
    const struct service *s;
    int i = 0;

    for (s = services; s && i < METRICS_SERVICES; s = s->next, i++) {
        struct counts c;

        service_counts(s, &c);
        metrics_service_set(i, s->name, (unsigned)c.ready, (unsigned)c.busy,
                            (unsigned)s->maxchild, s->nforked, s->ncrashed);
    }
    for (; i < METRICS_SERVICES; i++)
        metrics_service_set(i, NULL, 0, 0, 0, 0, 0);
}

void master_service_free(void)
{
    while (children) {
        struct child *ch = children;
        children = ch->next;
        free(ch);
    }
    while (services) {
        struct service *s = services;
        services = s->next;
        service_free_one(s);
    }
    free(pollrefs);
    pollrefs = NULL;
    pollrefs_alloc = 0;
    master_service_setup(NULL, NULL, NULL);
}
