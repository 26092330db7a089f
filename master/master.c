/*
 * master.c - the process manager: options, start-up, signals, main loop.
 *
 *   master [-C imapd.conf] [-M cyrus.conf] [-D] [-l] [-d] [-p pidfile]
 *          [-S servicedir] [-T drainsecs] [-s statusfile]
 *
 * Start-up order: read imapd.conf and cyrus.conf (a malformed file stops
 * the master with FILE:LINE), map Cyrus's commands to ours
 * (master_compat.h), open log_file when set, detach unless -D,
 * lock and write the pidfile (-p, default CONFIGDIRECTORY/master.pid; a
 * pidfile locked by a running master stops this one with its pid), open
 * the listening sockets of SERVICES (so ports below 1024 work when started
 * as root), then drop to the user `cyrus_user` when running as root, run
 * START to completion, and only then fork service, event and daemon
 * children.
 *
 * Errors of the start reach the admin who runs the command: until the
 * master is up, warnings and errors are also written to stderr (log
 * echo), and a detaching master's parent stays in the foreground, copies
 * what the daemon writes to stderr to its own stderr and exits only when
 * the daemon reports "started" (exit 0) or has died (its exit status).
 * After the start stderr is /dev/null, unless the lines go to stderr
 * (-l, or no syslog socket and no log_file): then it stays the caller's
 * stderr, so that log lines never go nowhere.
 *
 * A master killed with SIGKILL leaves its pidfile (unlocked) and workers
 * that finish their connection in progress and then leave
 * (lib/service.c).  A master that finds such a pidfile waits up to the
 * drain timeout (-T) for their addresses to be free, else 2 s.
 *
 * Under systemd (built with libsystemd, Type=notify, -D): READY=1 once the
 * sockets are open and START is done, RELOADING=1 / READY=1 around a
 * SIGHUP reload, STOPPING=1 when the drain begins.  Without NOTIFY_SOCKET
 * in the environment these do nothing.
 *
 * Invariants of the loop:
 * - Signal handlers only write the signal number into a non-blocking
 *   self-pipe; all work happens in the loop, so SIGCHLD cannot race with
 *   the child list (reaping is waitpid(-1, WNOHANG) until nothing is left,
 *   after every wake-up by the pipe).
 * - poll() waits on the self-pipe, every status pipe, and only those
 *   listening sockets for which a fork would follow (master_service.h);
 *   the timeout is at most 1 s, so the status file is refreshed each
 *   second, and shorter when a backoff, a fork allowed again by maxforkrate or an
 *   event is due.
 * - SIGTERM/SIGINT: sockets closed, children told to finish, exit 0 when
 *   they are gone or after the drain timeout (the rest get SIGKILL).
 *   SIGQUIT: SIGKILL to all children, exit 0 at once.  SIGHUP: reload.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "lib/privs.h"
#include "master/master_compat.h"
#include "master/master_conf.h"
#include "master/master_event.h"
#include "master/master_metrics.h"
#include "master/master_service.h"
#include "master/master_status.h"

#ifdef HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>
#define master_notify(state) ((void)sd_notify(0, (state)))
#else
#define master_notify(state) ((void)0)
#endif

#ifndef MASTER_LIBEXECDIR
#define MASTER_LIBEXECDIR "(none)"
#endif

#define MASTER_DEFAULT_IMAPDCONF IMAPCONF_DEFAULT_PATH
#define MASTER_DEFAULT_CYRUSCONF IMAPCONF_DEFAULT_CYRUSCONF
#define MASTER_DEFAULT_DRAIN 30

static int sigpipe_fds[2] = { -1, -1 };

static void master_sighandler(int sig)
{
    int saved = errno;
    unsigned char c = (unsigned char)sig;
    ssize_t n = write(sigpipe_fds[1], &c, 1);

    (void)n;   /* pipe full: a wake-up is already pending */
    errno = saved;
}

static void master_signals(void)
{
    static const int sigs[] = { SIGCHLD, SIGHUP, SIGTERM, SIGINT, SIGQUIT };
    struct sigaction sa;
    size_t i;

    if (pipe2(sigpipe_fds, O_CLOEXEC | O_NONBLOCK) < 0)
        log_fatal(71, "master: pipe failed error=<%s>", strerror(errno));
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = master_sighandler;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        sigaction(sigs[i], &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sa.sa_flags = 0;
    sigaction(SIGPIPE, &sa, NULL);
}

static void usage(const char *prog, FILE *out, int code)
    __attribute__((noreturn));

static void usage(const char *prog, FILE *out, int code)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] [-M cyrus.conf] [-D] [-l] [-d] [-p pidfile]\n"
"          [-S servicedir] [-T drainsecs] [-s statusfile]\n"
"  -C FILE  imapd.conf (default " MASTER_DEFAULT_IMAPDCONF ")\n"
"  -M FILE  cyrus.conf (default " MASTER_DEFAULT_CYRUSCONF ")\n"
"  -D       stay in the foreground\n"
"  -l       log to stderr instead of syslog\n"
"  -d       log debug lines too\n"
"  -p FILE  pidfile, locked while the master runs\n"
"           (default CONFIGDIRECTORY/master.pid)\n"
"  -S DIR   look for service programs in DIR first (then in the\n"
"           master's directory, " MASTER_LIBEXECDIR ", $PATH)\n"
"  -T SECS  on SIGTERM wait at most SECS for connections (default %d)\n"
"  -s FILE  status file (default CONFIGDIRECTORY/master.status)\n"
"  -h, --help  this text\n",
            prog, MASTER_DEFAULT_DRAIN);
    exit(code);
}

/* An absolute version of path (malloc'ed), resolved against the cwd. */
static char *absolute(const char *path)
{
    char cwd[PATH_MAX];
    char *r;
    size_t n;

    if (path[0] == '/') {
        r = strdup(path);
    } else {
        if (!getcwd(cwd, sizeof(cwd)))
            log_fatal(71, "master: getcwd failed error=<%s>",
                      strerror(errno));
        n = strlen(cwd) + strlen(path) + 2;
        r = malloc(n);
        if (r) snprintf(r, n, "%s/%s", cwd, path);
    }
    if (!r) log_fatal(71, "master: out of memory");
    return r;
}

static char *master_dir(void)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    char *slash;

    if (n <= 0) return NULL;
    buf[n] = '\0';
    slash = strrchr(buf, '/');
    if (!slash) return NULL;
    *slash = '\0';
    return strdup(buf);
}

/* The detaching parent: copy the daemon's stderr (errfd) to ours until
 * it reports "started" on readyfd (exit 0) or dies (its status). */
__attribute__((noreturn))
static void daemonize_parent(pid_t pid, int errfd, int readyfd)
{
    char buf[4096];
    int ready = 0, st;

    for (;;) {
        struct pollfd pfd[2];
        int r;

        pfd[0].fd = errfd;
        pfd[0].events = POLLIN;
        pfd[1].fd = readyfd;
        pfd[1].events = POLLIN;
        pfd[0].revents = pfd[1].revents = 0;
        r = poll(pfd, 2, -1);     /* errfd -1 (closed) is ignored */
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (errfd >= 0 && pfd[0].revents) {
            ssize_t n = read(errfd, buf, sizeof(buf));
            if (n > 0) {
                ssize_t w = write(2, buf, (size_t)n);
                (void)w;
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            close(errfd);
            errfd = -1;      /* everything written before is shown */
            continue;
        }
        if (pfd[1].revents) {
            char c;
            ssize_t n = read(readyfd, &c, 1);
            if (n < 0 && errno == EINTR) continue;
            ready = n == 1;
            break;
        }
    }
    /* what the daemon wrote before it was done (or died) is in the pipe:
     * copy it without waiting for writers that live on (a START command's
     * own daemon may hold the pipe) */
    if (errfd >= 0) {
        fcntl(errfd, F_SETFL, fcntl(errfd, F_GETFL) | O_NONBLOCK);
        for (;;) {
            ssize_t n = read(errfd, buf, sizeof(buf));
            if (n <= 0) break;
            if (write(2, buf, (size_t)n) < 0) break;
        }
    }
    if (ready) _exit(0);
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) _exit(1);
    }
    if (WIFEXITED(st)) _exit(WEXITSTATUS(st) ? WEXITSTATUS(st) : 1);
    fprintf(stderr, "master: the daemon died at start signal=<%d>\n",
            WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    _exit(1);
}

/* Detach: fork; the parent waits in daemonize_parent().  In the child
 * (returned to): a new session, cwd /, stdin and stdout /dev/null, stderr
 * a pipe to the parent until daemonize_done(); *readyfd_r is the write
 * end of the "started" pipe and *stderr_r the caller's stderr. */
static void daemonize_begin(int *readyfd_r, int *stderr_r)
{
    int errp[2], readyp[2], fd;
    pid_t pid;

    if (pipe2(errp, O_CLOEXEC) < 0 || pipe2(readyp, O_CLOEXEC) < 0)
        log_fatal(71, "master: pipe failed error=<%s>", strerror(errno));
    fflush(stderr);
    pid = fork();
    if (pid < 0) log_fatal(71, "master: fork failed error=<%s>",
                           strerror(errno));
    if (pid > 0) {
        close(errp[1]);
        close(readyp[1]);
        daemonize_parent(pid, errp[0], readyp[0]);
    }
    close(errp[0]);
    close(readyp[0]);
    *readyfd_r = readyp[1];
    *stderr_r = fcntl(2, F_DUPFD_CLOEXEC, 3);
    if (setsid() < 0)
        log_warning("master: setsid failed error=<%s>", strerror(errno));
    if (chdir("/") < 0)
        log_warning("master: chdir / failed error=<%s>", strerror(errno));
    fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        if (fd > 2) close(fd);
    }
    /* dup2 clears close-on-exec on fd 2: START commands write there too */
    dup2(errp[1], 2);
    close(errp[1]);
}

/* The daemon is up: tell the parent, let stderr go (to /dev/null, or
 * back to the caller's when log lines go to stderr). */
static void daemonize_done(int readyfd, int saved_stderr)
{
    char c = 1;
    int fd = -1;

    if (log_get_target() == LOG_TO_STDERR && saved_stderr >= 0)
        fd = saved_stderr;
    else
        fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    fflush(stderr);
    if (fd >= 0) dup2(fd, 2);
    if (fd >= 0 && fd != saved_stderr) close(fd);
    if (saved_stderr >= 0) close(saved_stderr);
    if (write(readyfd, &c, 1) != 1)
        log_warning("master: cannot report the start error=<%s>",
                    strerror(errno));
    close(readyfd);
}

/* Lock the pidfile (held until exit) and write our pid into it.  A lock
 * held by another process stops the start, naming that process.  Sets
 * *crashed_r when the file named a process (the previous master did not
 * remove it: it was killed).  Returns the open, locked descriptor. */
static int pidfile_lock(const char *path, int *crashed_r)
{
    char line[32], old[32];
    struct flock fl;
    ssize_t got;
    int fd, n;

    *crashed_r = 0;
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        log_fatal(73, "master: cannot open pidfile=<%s> error=<%s>",
                  path, strerror(errno));
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &fl) < 0) {
        int err = errno;
        long other = 0;

        if (err == EAGAIN || err == EACCES) {
            memset(&fl, 0, sizeof(fl));
            fl.l_type = F_WRLCK;
            fl.l_whence = SEEK_SET;
            if (fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK)
                other = (long)fl.l_pid;
            if (other > 0)
                log_fatal(75, "master: another master runs with pid=<%ld> "
                          "(pidfile=<%s> is locked): not starting", other,
                          path);
            log_fatal(75, "master: another master runs (pidfile=<%s> is "
                      "locked): not starting", path);
        }
        log_fatal(73, "master: cannot lock pidfile=<%s> error=<%s>", path,
                  strerror(err));
    }
    got = pread(fd, old, sizeof(old) - 1, 0);
    if (got > 0) {
        old[got] = '\0';
        if (strtol(old, NULL, 10) > 0) *crashed_r = 1;
    }
    n = snprintf(line, sizeof(line), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, line, (size_t)n, 0) != n)
        log_fatal(73, "master: cannot write pidfile=<%s> error=<%s>",
                  path, strerror(errno));
    return fd;
}

static void drop_privileges(const struct imapconf *ic)
{
    const char *err = NULL;
    int was_root = getuid() == 0 || geteuid() == 0;
    int r;

    /* the log file the master opened as root is written by the workers */
    if (was_root && log_get_target() == LOG_TO_FILE) {
        const char *user = imapconf_getstring(ic, "cyrus_user");
        const char *lf = imapconf_getstring(ic, "log_file");
        struct passwd *pw = getpwnam(user && *user ? user : "cyrus");

        if (pw && lf && *lf && chown(lf, pw->pw_uid, pw->pw_gid) < 0)
            log_warning("master: cannot chown log_file=<%s> error=<%s>",
                        lf, strerror(errno));
    }
    r = privs_drop_to_cyrus_user(ic, &err);
    if (r != PRIVS_OK)
        log_fatal(r == PRIVS_NOUSER ? 67 : 71, "master: %s", err);
    if (was_root && getuid() != 0)
        log_info("master: running as user=<%s> uid=<%ld>",
                 imapconf_getstring(ic, "cyrus_user"), (long)getuid());
}

/* Reap every finished child. */
static void reap(double now)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);

        if (pid < 0 && errno == EINTR) continue;
        if (pid <= 0) return;
        metrics_reaped(pid);
        if (!master_service_reaped(pid, st, now)
            && !master_event_reaped(pid, st, now))
            log_info("master: reaped unknown pid=<%d>", (int)pid);
    }
}

/* SIGKILL everything and wait for it (bounded). */
static void kill_and_wait(void)
{
    double until = master_now() + 5.0;

    master_service_killall(SIGKILL);
    master_event_killall(SIGKILL);
    while (master_service_nchildren() + master_event_nchildren() > 0
           && master_now() < until) {
        int st;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (!master_service_reaped(pid, st, master_now()))
            master_event_reaped(pid, st, master_now());
    }
}

int main(int argc, char **argv)
{
    const char *imapdconf_opt = NULL, *cyrusconf = MASTER_DEFAULT_CYRUSCONF;
    const char *pidfile_opt = NULL, *status_opt = NULL, *servicedir = NULL;
    char *imapdconf, *pidfile = NULL, *statusfile, *sdir = NULL, *mdir;
    struct imapconf *ic = NULL;
    struct master_conf *conf = NULL;
    char *err = NULL;
    int foreground = 0, to_stderr = 0, debug = 0, drain_secs =
        MASTER_DEFAULT_DRAIN;
    int opt, draining = 0, pidfd, crashed, readyfd = -1, saved_stderr = -1;
    double drain_until = 0;
    struct pollfd *fds = NULL;
    size_t nalloc = 0;

    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    while ((opt = getopt_long(argc, argv, "C:M:Dldp:S:T:s:h", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'C': imapdconf_opt = optarg; break;
        case 'M': cyrusconf = optarg; break;
        case 'D': foreground = 1; break;
        case 'l': to_stderr = 1; break;
        case 'd': debug = 1; break;
        case 'p': pidfile_opt = optarg; break;
        case 'S': servicedir = optarg; break;
        case 'T': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 0 || v > 86400) usage(argv[0], stderr, 64);
            drain_secs = (int)v;
            break;
        }
        case 's': status_opt = optarg; break;
        case 'h': usage(argv[0], stdout, 0);
        default: usage(argv[0], stderr, 64);
        }
    }
    if (optind != argc) usage(argv[0], stderr, 64);

    log_init("master", to_stderr ? LOG_TO_STDERR : LOG_TO_SYSLOG);
    log_set_debug(debug);

    imapdconf = absolute(imapdconf_opt ? imapdconf_opt
                         : MASTER_DEFAULT_IMAPDCONF);
    unsetenv("CYRUSDELIVER_CONF_WARNED");   /* the master itself warns */
    if (imapconf_load(imapdconf, &ic, &err) < 0)
        log_fatal(78, "master: %s", err ? err : "cannot read imapd.conf");
    if (master_conf_load(cyrusconf, &conf, &err) < 0)
        log_fatal(78, "master: %s", err ? err : "cannot read cyrus.conf");
    {
        const char *cd = imapconf_getstring(ic, "configdirectory");
        struct buf b = BUF_INITIALIZER;

        buf_printf(&b, "%s/master.status", cd ? cd : ".");
        statusfile = absolute(status_opt ? status_opt : buf_cstring(&b));
        buf_reset(&b);
        buf_printf(&b, "%s/master.pid", cd ? cd : ".");
        pidfile = absolute(pidfile_opt ? pidfile_opt : buf_cstring(&b));
        buf_free(&b);
    }
    if (servicedir) sdir = absolute(servicedir);
    mdir = master_dir();
    master_service_setup(sdir, mdir, imapdconf);
    master_compat_apply(conf, cyrusconf, sdir, mdir, imapdconf);
    master_metrics_conf(conf, ic);

    /* where lines go: -l, else log_file, else syslog (stderr without a
     * syslog socket); until the master is up, errors also to stderr */
    if (!to_stderr) {
        const char *lf = imapconf_getstring(ic, "log_file");
        if (lf && *lf && log_set_file(lf) < 0)
            log_fatal(73, "master: cannot open log_file=<%s> error=<%s>",
                      lf, strerror(errno));
    }
    log_set_prefix(imapconf_getstring(ic, "syslog_prefix"));
    log_set_echo(1);
    if (log_syslog_missing() && log_get_target() == LOG_TO_STDERR)
        log_warning("master: no syslog socket /dev/log: logging to "
                    "stderr (set log_file in imapd.conf for a file)");

    if (!foreground) daemonize_begin(&readyfd, &saved_stderr);
    pidfd = pidfile_lock(pidfile, &crashed);
    master_signals();

    /* a master killed before us: its workers free the addresses after
     * their connection in progress */
    master_service_bind_wait(crashed ? (drain_secs > 5 ? drain_secs : 5)
                             : 2);
    if (master_service_apply(conf, 1) < 0) {
        master_service_free();
        unlink(pidfile);
        log_fatal(1, "master: cannot open the listening sockets");
    }
    master_service_bind_wait(0);
    drop_privileges(ic);
    master_metrics_start(ic);
    if (master_event_start(conf) < 0) {
        master_service_shutdown();
        master_service_free();
        unlink(pidfile);
        log_fatal(1, "master: START failed, not starting services");
    }
    master_event_apply(conf, master_now());
    master_status_init(statusfile);
    /* the status file exists, listing every service, before the master
     * says it started (the log line, READY=1, the daemon's parent exit):
     * whoever waited for that can read it at once */
    master_status_update(master_now(), 1);
    log_info("master: started pid=<%ld> config=<%s>", (long)getpid(),
             cyrusconf);
    log_set_echo(0);
    if (readyfd >= 0) daemonize_done(readyfd, saved_stderr);
    master_notify("READY=1");

    for (;;) {
        double now = master_now(), deadline = now + 1.0;
        size_t n = 0;
        int timeout, r, got_hup = 0, got_term = 0, got_quit = 0,
            got_chld = 0;

        if (!draining) {
            master_service_spawn(now);
            master_event_run(now, &deadline);
        }
        master_status_update(now, master_service_changed());
        master_service_metrics();
        if (draining) {
            if (master_service_nchildren() + master_event_nchildren()
                == 0)
                break;
            if (now >= drain_until) {
                log_warning("master: drain timeout seconds=<%d>: killing "
                            "children=<%zu>", drain_secs,
                            master_service_nchildren()
                            + master_event_nchildren());
                kill_and_wait();
                break;
            }
            if (drain_until < deadline) deadline = drain_until;
        }

        if (nalloc == 0) {
            nalloc = 16;
            fds = malloc(nalloc * sizeof(*fds));
            if (!fds) log_fatal(71, "master: out of memory");
        }
        fds[0].fd = sigpipe_fds[0];
        fds[0].events = POLLIN;
        fds[0].revents = 0;
        n = 1;
        master_service_poll_prepare(&fds, &nalloc, &n, now, &deadline);
        timeout = (int)((deadline - now) * 1000.0 + 0.999);
        if (timeout < 0) timeout = 0;
        if (timeout > 1000) timeout = 1000;

        r = poll(fds, n, timeout);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            log_fatal(71, "master: poll failed error=<%s>", strerror(errno));
        }
        now = master_now();
        if (r > 0) master_service_poll_done(fds, 1, n, now);

        if (fds[0].revents) {
            unsigned char sigs[64];
            ssize_t got;
            while ((got = read(sigpipe_fds[0], sigs, sizeof(sigs))) > 0) {
                ssize_t i;
                for (i = 0; i < got; i++) {
                    switch (sigs[i]) {
                    case SIGCHLD: got_chld = 1; break;
                    case SIGHUP: got_hup = 1; break;
                    case SIGTERM: case SIGINT: got_term = 1; break;
                    case SIGQUIT: got_quit = 1; break;
                    }
                }
            }
        }
        if (got_chld) reap(now);
        if (got_quit) {
            log_info("master: SIGQUIT: killing all children");
            kill_and_wait();
            break;
        }
        if (got_term && !draining) {
            log_info("master: stopping: draining children=<%zu> "
                     "timeout=<%d>", master_service_nchildren()
                     + master_event_nchildren(), drain_secs);
            master_notify("STOPPING=1");
            draining = 1;
            drain_until = now + drain_secs;
            master_service_shutdown();
            master_event_shutdown();
        }
        if (got_hup && !draining) {
            struct master_conf *nconf = NULL;
            char *rerr = NULL;

            if (master_conf_load(cyrusconf, &nconf, &rerr) < 0) {
                log_error("master: reload failed, keeping the old "
                          "configuration: %s", rerr ? rerr : "?");
                free(rerr);
            } else {
                log_info("master: reloading config=<%s>", cyrusconf);
                master_notify("RELOADING=1");
                master_compat_apply(nconf, cyrusconf, sdir, mdir, imapdconf);
                master_metrics_conf(nconf, ic);
                master_service_apply(nconf, 0);
                master_event_apply(nconf, now);
                master_conf_free(&conf);
                conf = nconf;
                master_notify("READY=1");
            }
        }
    }

    master_service_shutdown();
    master_service_free();
    master_event_free();
    master_status_remove();
    metrics_detach();
    unlink(pidfile);        /* ours: we hold its lock */
    close(pidfd);
    log_info("master: exiting");
    master_conf_free(&conf);
    imapconf_free(&ic);
    free(fds);
    free(imapdconf);
    free(pidfile);
    free(statusfile);
    free(sdir);
    free(mdir);
    return 0;
}
