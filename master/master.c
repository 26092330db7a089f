/*
 * master.c - the process manager: options, start-up, signals, main loop.
 *
 *   master [-C imapd.conf] [-M cyrus.conf] [-D] [-l] [-d] [-p pidfile]
 *          [-S servicedir] [-T drainsecs] [-s statusfile]
 *
 * Start-up order: read imapd.conf and cyrus.conf (a malformed file stops
 * the master with FILE:LINE), map Cyrus's commands to ours
 * (master_compat.h), daemonize unless -D, write the pidfile, open
 * the listening sockets of SERVICES (so ports below 1024 work when started
 * as root), then drop to the user `cyrus_user` when running as root, run
 * START to completion, and only then fork service, event and daemon
 * children.
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
#include "lib/privs.h"
#include "master/master_compat.h"
#include "master/master_conf.h"
#include "master/master_event.h"
#include "master/master_service.h"
#include "master/master_status.h"

#define MASTER_DEFAULT_IMAPDCONF "/etc/imapd.conf"
#define MASTER_DEFAULT_CYRUSCONF "/etc/cyrus.conf"
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
"  -p FILE  write the master's pid to FILE\n"
"  -S DIR   look for service programs in DIR first\n"
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

static void daemonize(void)
{
    pid_t pid = fork();
    int fd;

    if (pid < 0) log_fatal(71, "master: fork failed error=<%s>",
                           strerror(errno));
    if (pid > 0) _exit(0);
    if (setsid() < 0)
        log_warning("master: setsid failed error=<%s>", strerror(errno));
    if (chdir("/") < 0)
        log_warning("master: chdir / failed error=<%s>", strerror(errno));
    fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) close(fd);
    }
}

static void write_pidfile(const char *path)
{
    char tmp[PATH_MAX + 8], line[32];
    int fd, n;

    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    n = snprintf(line, sizeof(line), "%ld\n", (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, (size_t)n) != n || close(fd) < 0
        || rename(tmp, path) < 0)
        log_fatal(73, "master: cannot write pidfile=<%s> error=<%s>",
                  path, strerror(errno));
}

static void drop_privileges(const struct imapconf *ic)
{
    const char *err = NULL;
    int was_root = getuid() == 0 || geteuid() == 0;
    int r = privs_drop_to_cyrus_user(ic, &err);

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
    int opt, draining = 0;
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
    if (status_opt) {
        statusfile = absolute(status_opt);
    } else {
        const char *cd = imapconf_getstring(ic, "configdirectory");
        struct buf b = BUF_INITIALIZER;
        buf_printf(&b, "%s/master.status", cd ? cd : ".");
        statusfile = absolute(buf_cstring(&b));
        buf_free(&b);
    }
    if (pidfile_opt) pidfile = absolute(pidfile_opt);
    if (servicedir) sdir = absolute(servicedir);
    mdir = master_dir();
    master_service_setup(sdir, mdir, imapdconf);
    master_compat_apply(conf, cyrusconf, sdir, mdir, imapdconf);

    if (!foreground) daemonize();
    master_signals();
    if (pidfile) write_pidfile(pidfile);

    if (master_service_apply(conf, 1) < 0) {
        master_service_free();
        if (pidfile) unlink(pidfile);
        log_fatal(1, "master: cannot open the listening sockets");
    }
    drop_privileges(ic);
    if (master_event_start(conf) < 0) {
        master_service_shutdown();
        master_service_free();
        if (pidfile) unlink(pidfile);
        log_fatal(1, "master: START failed, not starting services");
    }
    master_event_apply(conf, master_now());
    master_status_init(statusfile);
    log_info("master: started pid=<%ld> config=<%s>", (long)getpid(),
             cyrusconf);

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
                master_compat_apply(nconf, cyrusconf, sdir, mdir, imapdconf);
                master_service_apply(nconf, 0);
                master_event_apply(nconf, now);
                master_conf_free(&conf);
                conf = nconf;
            }
        }
    }

    master_service_shutdown();
    master_service_free();
    master_event_free();
    master_status_remove();
    if (pidfile) unlink(pidfile);
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
