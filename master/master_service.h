/*
 * master_service.h - the SERVICES of cyrus.conf: listening sockets, the
 * children that serve them, the spawn policy, the status pipes, backoff,
 * reload and drain.  Also the one place that forks and execs a command
 * (master_service_forkexec), used for START, EVENTS and DAEMON as well.
 *
 * All functions run in the master's single thread; none blocks (except
 * master_service_forkexec's fork itself).  Times are CLOCK_MONOTONIC
 * seconds (master_now()).
 *
 * Spawn policy, per service (counts: ready, busy, starting = forked but
 * not yet READY, total = all living children including stopping ones):
 * - keep ready + starting >= prefork (babysit=1 makes prefork at least 1);
 * - when ready == 0 and starting == 0 and total < maxchild, the master
 *   polls the listening socket; a pending connection forks one child;
 * - at total >= maxchild the socket is not polled: connections wait in the
 *   kernel backlog until a child becomes READY again (or, for a service
 *   whose children hold several connections, lmtpd, until a busy child
 *   with room takes them: lib/service.h service_main_mux);
 * - maxforkrate > 0: no 1-second window holds more than that many forks
 *   (the last maxforkrate fork times are kept); while the limit is reached
 *   the socket is not polled either;
 * - a child that exits within 2 s of its fork without ever reporting READY
 *   is a failed start; 5 in a row put the service in backoff (no forks for
 *   1 s, doubling to 64 s for each further failure); READY resets it.
 */
#ifndef MASTER_MASTER_SERVICE_H
#define MASTER_MASTER_SERVICE_H

#include <poll.h>
#include <stddef.h>
#include <sys/types.h>

#include "lib/buf.h"
#include "master/master_conf.h"

/* Seconds on the monotonic clock. */
double master_now(void);

/* Where commands are looked up and what children get in their
 * environment: servicedir (-S, may be NULL), the master binary's
 * directory (may be NULL), the absolute path of imapd.conf. Strings are
 * copied. */
void master_service_setup(const char *servicedir, const char *masterdir,
                          const char *imapdconf);

/* The program for a command word: as given when it contains '/', else
 * servicedir/word, masterdir/word, the installed workers' directory
 * (MASTER_LIBEXECDIR, pkglibexecdir, when compiled in)/word, then each
 * $PATH directory, the first executable one.  Returns a malloc'ed path, or NULL (not found). */
char *master_service_resolve(const char *word);

/* Fork and exec argv (argv[0] resolved with master_service_resolve).  In
 * the child: signal dispositions and mask reset, listen_fd (if >= 0) on
 * fd 3, status_fd (if >= 0) on fd 4 and shared_fd (if >= 0) on fd 5,
 * every other fd >= 3 closed,
 * RLIMIT_NOFILE set to maxfds (if > 0), env[] (NAME=VALUE strings, may be
 * NULL) and CYRUSDELIVER_CONF and CYRUSDELIVER_CONF_WARNED (both the
 * imapd.conf path; see imapconf.h) added; exec failure: _exit(127).  Returns
 * the pid, or -1 (logged) when fork failed. */
pid_t master_service_forkexec(char *const argv[], int listen_fd,
                              int status_fd, int shared_fd, int maxfds,
                              char *const env[]);

/* Bring the running services in line with conf (SERVICES entries):
 * added ones get their socket (and are preforked by master_service_spawn),
 * removed ones or ones whose listen/proto changed stop: socket closed
 * (UNIX socket file removed), children sent SIGTERM, the service forgotten
 * when the last child is gone; changed limits/cmd apply to new children
 * and surplus idle children beyond a lower maxchild get SIGTERM.
 * initial: a socket that cannot be opened is an error (returns -1, the
 * caller exits); later (reload) it is logged and that service skipped.
 * Returns 0. */
int master_service_apply(const struct master_conf *conf, int initial);

/* How long master_service_apply() waits for an address in use (a TCP
 * port: EADDRINUSE; a UNIX socket path on which a server answers) before
 * it gives up on that socket: retried every 100 ms, logged once.  0 (the
 * default) = give up at once.  The master sets it for its start only:
 * the workers of a master that was killed free the address after their
 * connection in progress (lib/service.c).  A reload never waits. */
void master_service_bind_wait(double secs);

/* Fork children as the spawn policy asks. */
void master_service_spawn(double now);

/* Append to *fds (grown as needed; *nalloc its size, *n its use) the
 * status pipes and the listening sockets the policy wants polled; lower
 * *deadline to the next backoff end or the time maxforkrate allows a fork again. */
void master_service_poll_prepare(struct pollfd **fds, size_t *nalloc,
                                 size_t *n, double now, double *deadline);
/* Handle the results of poll() for the entries appended from index start
 * up to n (status messages read, demand noted).  Call it right after
 * poll(), before anything that may reap children or reload. */
void master_service_poll_done(const struct pollfd *fds, size_t start,
                              size_t n, double now);

/* "SIGSEGV" for SIGSEGV etc. ("unknown" for others); static string. */
const char *master_signame(int sig);

/* A child was reaped: 1 when it was a service child (logged, counts
 * updated), 0 when the pid is not ours. */
int master_service_reaped(pid_t pid, int wstatus, double now);

/* Stop taking connections: close every listening socket (UNIX socket
 * files removed) and send SIGTERM to every child. */
void master_service_shutdown(void);

/* Send sig to every service child. */
void master_service_killall(int sig);

/* Number of living service children. */
size_t master_service_nchildren(void);

/* 1 (and reset) when counts or states changed since the last call. */
int master_service_changed(void);

/* Append the status-file lines of every service and child to out. */
void master_service_status(struct buf *out, double now);

/* Free everything (sockets closed, children forgotten, not signalled). */
/* Write every service's ready, busy, maxchild, forks and crashes into
 * the metrics file (lib/metrics.h; nothing when metrics are off). */
void master_service_metrics(void);

void master_service_free(void);

#endif
