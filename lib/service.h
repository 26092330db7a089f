/*
 * service.h - the worker side of the master protocol: what every service
 * program (lmtpd, imapd, the test service) links to run under master.
 *
 * How the master starts a service child (master/master_service.c):
 *   fd 3 (SERVICE_LISTEN_FD)  the service's listening socket (inherited,
 *                             non-blocking: every idle child polls it and
 *                             accept() gives EAGAIN to those that lose
 *                             the race)
 *   fd 4 (SERVICE_STATUS_FD)  the write end of the service's status pipe
 *   fd 5 (SERVICE_SHARED_FD)  the service's shared page (struct
 *                             service_shared), when the master has one
 *   environment: CYRUSDELIVER_SERVICE=NAME, CYRUSDELIVER_MAXUSES=N,
 *                CYRUSDELIVER_IDLETIMEOUT=SECONDS, CYRUSDELIVER_CONF=path
 *                of imapd.conf (the master's -C),
 *                CYRUSDELIVER_MASTER_PID=the master's pid
 *   argv: the entry's cmd split into words.
 *
 * Status messages: fixed-size struct service_status records written with
 * one write(2) each (smaller than PIPE_BUF, so atomic even with many
 * children on one pipe):
 *   SERVICE_READY    waiting for a connection and holding none: counts
 *                    as an idle child
 *   SERVICE_BUSY     holds a connection (service_main_mux: one or more,
 *                    busy or waiting for their next command)
 *   SERVICE_EXITING  leaving on its own (max uses, idle timeout, told to
 *                    stop): the master need not count it as a crash
 * A child that dies without EXITING is a crash for the master's accounting
 * (it logs the signal or exit code and replaces it as needed).
 *
 * Signals to a child: SIGTERM = close the child's copy of the listening
 * socket, finish the connection in progress (if any), then exit 0; an
 * idle child exits at once.  SIGQUIT/SIGKILL: die.
 *
 * A master that dies (SIGKILL) is noticed by its children: service_main()
 * sets PR_SET_PDEATHSIG to SIGTERM (and checks getppid() against
 * CYRUSDELIVER_MASTER_PID right after, in case the master died first), an
 * idle child also polls the status pipe, whose write end reports POLLERR
 * once the master (its only reader) is gone.  The child then leaves as on
 * SIGTERM, logging "master gone".
 */
#ifndef LIB_SERVICE_H
#define LIB_SERVICE_H

#include <stdio.h>

#include <stdint.h>
#include <sys/types.h>

#define SERVICE_LISTEN_FD 3
#define SERVICE_STATUS_FD 4
#define SERVICE_SHARED_FD 5

/* The page behind fd 5 (a memfd the master maps read-write; children
 * map it read-only): what the master says to all children of the
 * service at once. */
struct service_shared {
    uint32_t saturated;  /* 1: the master starts no child for a waiting
                            client now (maxchild reached, backing off,
                            service removed); 0: it will, or an idle
                            child will take the client */
};

enum service_state {
    SERVICE_READY = 1,
    SERVICE_BUSY = 2,
    SERVICE_EXITING = 3
};

struct service_status {
    uint32_t pid;
    uint32_t state;      /* enum service_state */
    uint32_t served;     /* connections served so far by this child */
};

/* What a service program provides. */
struct service_callbacks {
    /* once per child, before the first accept (open databases here:
     * after fork); returns 0, or non-zero to exit (status 75, EX_TEMPFAIL,
     * which the master counts as a failed start) */
    int (*init)(int argc, char **argv, void *rock);
    /* one connection: fd is the connected socket (the callee must not
     * close it; service_main does); the peer address is given as text
     * ("unix", "1.2.3.4:port", "[::1]:port") */
    void (*serve)(int fd, const char *peer, void *rock);
    /* once before the child exits (close databases) */
    void (*done)(void *rock);
    void *rock;
};

/* The child's main loop: init, then repeatedly report READY, accept on
 * SERVICE_LISTEN_FD (EINTR and ECONNABORTED retried), report BUSY, serve,
 * close; leave after CYRUSDELIVER_MAXUSES connections (0 = no limit) or
 * CYRUSDELIVER_IDLETIMEOUT seconds without a connection (0 = never), or
 * on SIGTERM, reporting EXITING; then done.  Returns the exit status for
 * main() to return.  When fd 3 is not a listening socket (run by hand),
 * serves stdin/stdout once (fd 0) and returns. */
int service_main(int argc, char **argv, const struct service_callbacks *cb);

/* A service whose processes each hold several connections (lmtpd): one
 * poll() over the listening socket and every connection the process
 * holds; whichever connection has input is served (the callee serves its
 * whole commands and returns while it waits for the next one), so an idle
 * connection costs a descriptor, not a process.
 *
 *   - A process reports READY only while it holds no connection, BUSY
 *     while it holds one or more: the master keeps `prefork` processes
 *     without connections and starts more (up to maxchild) for new
 *     clients, so busy connections are spread over processes.
 *   - A process holding connections leaves a new client to the master
 *     (which forks a child for it) and to idle children while the
 *     master is not saturated (the shared page on fd 5); so below
 *     maxchild each client gets a process of its own, as with
 *     service_main.  Once it is saturated, a process holding n
 *     connections lets the client wait 10 ms (doubled for each connection
 *     beyond the first, at most 160 ms: the least loaded one takes it
 *     first) and then accepts it (up to max_conns).  Without the shared
 *     page it acts as if the master were saturated.  With every process at maxchild holding connections a
 *     new client is still greeted at once.
 *   - The master makes listening sockets non-blocking: a process that
 *     loses the race for a connection gets EAGAIN and goes back to its
 *     poll instead of waiting in accept() while its clients wait.
 *   - A connection silent for `timeout` seconds is ended (end() with
 *     SERVICE_END_TIMEOUT).  A process holding max_conns connections
 *     while a client waits on the listening socket ends the connection
 *     silent longest if it is evictable() and has been silent for
 *     idle_timeout seconds (SERVICE_END_IDLE), and takes the new one.
 *   - CYRUSDELIVER_MAXUSES counts connections accepted: at the limit the
 *     process accepts no more, lets a connection evictable() and
 *     silent for idle_timeout go (SERVICE_END_IDLE), and leaves once its
 *     last one ends;
 *     CYRUSDELIVER_IDLETIMEOUT counts time without any connection.
 *   - SIGTERM (or the master gone): the command in progress is finished;
 *     then every connection gets end(SERVICE_END_STOP) and the process
 *     leaves.  input(), open() and end() run with SIGTERM deliverable
 *     (the handler only sets service_stopping() and closes the listening
 *     socket), the rest of the loop with it blocked. */
enum service_end {
    SERVICE_END_TIMEOUT,     /* silent for `timeout` seconds */
    SERVICE_END_IDLE,        /* gave way to a waiting client */
    SERVICE_END_STOP         /* SIGTERM, or the master is gone */
};

struct service_mux_callbacks {
    /* as in struct service_callbacks; init may fill max_conns, timeout
     * and idle_timeout below (through its rock) from its configuration */
    int (*init)(int argc, char **argv, void *rock);
    /* run by hand (fd 3 is not a listening socket): the one session on
     * stdin, as service_callbacks.serve */
    void (*serve)(int fd, const char *peer, void *rock);
    /* a new connection (fd is the service's to close): greet it; the
     * connection's handle, or NULL when it is over already */
    void *(*open)(int fd, const char *peer, void *rock);
    /* the connection polled readable: serve its whole commands; 0 when
     * it waits for more, 1 when it is over (the callee freed its state;
     * the service closes fd) */
    int (*input)(void *conn, void *rock);
    /* 1 when conn may be ended to make room (no transaction open); NULL:
     * always */
    int (*evictable)(void *conn, void *rock);
    /* end a waiting connection: tell the peer why, free the state (the
     * service closes fd) */
    void (*end)(void *conn, enum service_end why, void *rock);
    void (*done)(void *rock);
    void *rock;
    int max_conns;           /* connections one process holds, >= 1 */
    int timeout;             /* seconds of silence; 0 = never */
    int idle_timeout;        /* seconds before giving way; 0 = never */
};

/* Like service_main(), for a multiplexing service (see above).  cb is
 * read again after init, which may change its limits. */
int service_main_mux(int argc, char **argv,
                     const struct service_mux_callbacks *cb);

/* A worker's command line, the same for lmtpd and imapd: -C FILE (else
 * $CYRUSDELIVER_CONF, else defconf) into *confpath_r; the one option
 * letter `flag` (lmtpd -a, imapd -s) sets *flag_r (flag 0: the program
 * has none, flag_r may be NULL: timsieved); -U uses and -T
 * idle-seconds (non-negative decimals) go to the environment that
 * service_main() reads (CYRUSDELIVER_MAXUSES, CYRUSDELIVER_IDLETIMEOUT).
 * -h or --help: usage(stdout), then -1 (main() exits 0).  0 to go on,
 * or 2 after usage(stderr) for anything else (extra arguments too). */
int service_parse_args(int argc, char **argv, char flag, int *flag_r,
                       const char *defconf, const char **confpath_r,
                       void (*usage)(FILE *out));

/* For serve(): when fd is a socket, call fn(fd, peer, rock).  When it is
 * not (the program run by hand with stdin/stdout on a pipe or a file),
 * make a socketpair, fork a child that copies stdin into it and its
 * output to stdout until the session ends, and call fn on the other end
 * (a protocol stream needs one socket for both directions). */
void service_serve_stdio(int fd, const char *peer,
                         void (*fn)(int fd, const char *peer, void *rock),
                         void *rock);

/* Set by service_main when SIGTERM arrived: a long serve() may poll it to
 * finish early at a clean point (it need not). */
int service_stopping(void);

#endif
