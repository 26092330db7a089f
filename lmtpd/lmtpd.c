/*
 * lmtpd.c - the LMTP delivery worker: command line, and the callbacks
 * lib/service.h's service_main_mux() runs (init once per process; open,
 * input and end for the connections the process holds, several at a
 * time: lmtp_max_idle; done before exit).  The protocol is lmtp.c.
 *
 *   lmtpd [-C imapd.conf] [-a] [-U uses] [-T idlesecs]
 *
 * imapd.conf: -C, else $CYRUSDELIVER_CONF (the master sets it), else
 * /etc/imapd.conf.  -a: TCP clients need not authenticate.  -U / -T
 * override the master's maxuses / idle timeout for this worker.
 *
 * Trust: a connection on a UNIX socket (access is controlled by the
 * socket's directory) or on stdin is trusted; a TCP connection must AUTH
 * before MAIL unless -a.
 *
 * Run by hand (fd 3 is not a listening socket) lmtpd serves one session
 * on stdin/stdout.  The stream layer needs one socket for both
 * directions, so when stdin is not a socket a relay child copies stdin
 * into a socketpair and the replies out to stdout.
 */
#include "config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb_etcd.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "lib/prot.h"
#include "lib/saslserver.h"
#include "lib/service.h"
#include "lib/tls.h"
#include "lmtpd/lmtp.h"

#define LMTPD_DEFAULT_CONF IMAPCONF_DEFAULT_PATH

struct lmtpd_state {
    const char *confpath;
    int preauth;
    struct imapconf *conf;
    struct tls_server *tls;
    int sasl_ok;
    struct lmtp_server *srv;
    struct service_mux_callbacks *mux;   /* init sets its limits */
};

static void lmtpd_usage(FILE *out)
{
    fprintf(out,
"Usage: lmtpd [-C imapd.conf] [-a] [-U uses] [-T idlesecs]\n"
"\n"
"The LMTP delivery worker, started by the master for a SERVICES entry\n"
"(listening socket on fd 3); run by hand it serves one session on\n"
"stdin/stdout.\n"
"  -C FILE   imapd.conf (default $CYRUSDELIVER_CONF, else "
LMTPD_DEFAULT_CONF ")\n"
"  -a        preauthorized: the clients of this socket are trusted\n"
"  -U USES   leave after USES connections (0: never)\n"
"  -T SECS   leave after SECS seconds without a connection (0: never)\n"
"  -h, --help  this text\n");
}

static int lmtpd_init(int argc, char **argv, void *rock)
{
    struct lmtpd_state *ls = rock;
    char *err = NULL;

    (void)argc;
    (void)argv;
    if (imapconf_load(ls->confpath, &ls->conf, &err) != 0) {
        log_error("lmtpd: cannot load the configuration file=<%s> "
                  "error=<%s>", ls->confpath, err ? err : "out of memory");
        free(err);
        return 1;
    }
    imapconf_log_file(ls->conf);
    metrics_attach(ls->conf);
    if (cyrusdb_etcd_configure(ls->conf) != 0)   /* directory_db: etcd */
        return 1;
    if (tls_server_new(ls->conf, &ls->tls, &err) != 0) {
        log_info("lmtpd: STARTTLS not offered reason=<%s>",
                 err ? err : "out of memory");
        free(err);
        err = NULL;
        ls->tls = NULL;
    }
    ls->sasl_ok = saslserver_init(ls->conf, "lmtpd") == 0;
    if (lmtp_server_new(ls->conf, ls->tls, ls->sasl_ok, &ls->srv) != 0)
        return 1;
    ls->mux->max_conns = (int)imapconf_getint(ls->conf, "lmtp_max_idle");
    ls->mux->timeout = (int)imapconf_getint(ls->conf, "lmtp_timeout");
    ls->mux->idle_timeout = (int)imapconf_getint(ls->conf,
                                                 "lmtp_idle_timeout");
    return 0;
}

/* One connection a worker holds: what lmtp_session needs to outlive it. */
struct lmtpd_conn {
    struct lmtp_conn conn;
    char peer[128];
    char local[SASLSERVER_ADDRLEN], remote[SASLSERVER_ADDRLEN];
    struct prot *p;
    struct lmtp_session *s;
};

static void lmtpd_conn_free(struct lmtpd_conn **cp)
{
    struct lmtpd_conn *c = *cp;

    if (!c)
        return;
    lmtp_session_free(&c->s);
    prot_free(&c->p);
    free(c);
    *cp = NULL;
}

static struct lmtpd_conn *lmtpd_conn_new(struct lmtpd_state *ls, int fd,
                                         const char *peer)
{
    struct lmtpd_conn *c = calloc(1, sizeof(*c));
    int tcp;

    if (!c || !(c->p = prot_new(fd))) {
        log_error("lmtpd: out of memory peer=<%s>", peer);
        free(c);
        return NULL;
    }
    snprintf(c->peer, sizeof(c->peer), "%s", peer);
    tcp = saslserver_sockaddrs(fd, c->local, c->remote);
    c->conn.peer = c->peer;
    c->conn.localaddr = c->local[0] ? c->local : NULL;
    c->conn.remoteaddr = c->remote[0] ? c->remote : NULL;
    c->conn.trusted = !tcp || ls->preauth;
    return c;
}

static void lmtpd_session_cb(int fd, const char *peer, void *rock)
{
    struct lmtpd_conn *c = lmtpd_conn_new(rock, fd, peer);
    struct lmtpd_state *ls = rock;

    if (!c)
        return;
    lmtp_serve(ls->srv, c->p, &c->conn);
    lmtpd_conn_free(&c);
}

/* Run by hand: one session on stdin/stdout through a relay (service.h) */
static void lmtpd_serve(int fd, const char *peer, void *rock)
{
    service_serve_stdio(fd, peer, lmtpd_session_cb, rock);
}

/* A new connection of the worker: greet it. */
static void *lmtpd_open(int fd, const char *peer, void *rock)
{
    struct lmtpd_state *ls = rock;
    struct lmtpd_conn *c = lmtpd_conn_new(ls, fd, peer);

    if (!c)
        return NULL;
    if (lmtp_session_new(ls->srv, c->p, &c->conn, &c->s) != 0) {
        lmtpd_conn_free(&c);
        return NULL;
    }
    return c;
}

static int lmtpd_input(void *conn, void *rock)
{
    struct lmtpd_conn *c = conn;

    (void)rock;
    if (lmtp_session_input(c->s) == LMTP_SESSION_IDLE)
        return 0;
    lmtpd_conn_free(&c);
    return 1;
}

static int lmtpd_evictable(void *conn, void *rock)
{
    const struct lmtpd_conn *c = conn;

    (void)rock;
    return !lmtp_session_in_transaction(c->s);
}

static void lmtpd_end(void *conn, enum service_end why, void *rock)
{
    struct lmtpd_conn *c = conn;

    (void)rock;
    lmtp_session_end(&c->s, why == SERVICE_END_TIMEOUT ? LMTP_END_TIMEOUT
                            : why == SERVICE_END_IDLE ? LMTP_END_IDLE
                            : LMTP_END_STOP);
    lmtpd_conn_free(&c);
}

static void lmtpd_done(void *rock)
{
    struct lmtpd_state *ls = rock;

    lmtp_server_free(&ls->srv);
    if (ls->sasl_ok)
        saslserver_done();
    ls->sasl_ok = 0;
    tls_server_free(&ls->tls);
    imapconf_free(&ls->conf);
}

int main(int argc, char **argv)
{
    struct lmtpd_state ls;
    struct service_mux_callbacks cb;
    int flag, status;

    memset(&ls, 0, sizeof(ls));
    log_init("lmtpd", log_worker_target());
    status = service_parse_args(argc, argv, 'a', &flag,
                                LMTPD_DEFAULT_CONF, &ls.confpath,
                                lmtpd_usage);
    if (status != 0)
        return status < 0 ? 0 : status;
    ls.preauth = flag;
    memset(&cb, 0, sizeof(cb));
    cb.init = lmtpd_init;
    cb.serve = lmtpd_serve;
    cb.open = lmtpd_open;
    cb.input = lmtpd_input;
    cb.evictable = lmtpd_evictable;
    cb.end = lmtpd_end;
    cb.done = lmtpd_done;
    cb.rock = &ls;
    cb.max_conns = 1;
    ls.mux = &cb;
    status = service_main_mux(argc, argv, &cb);
    if (status == 75)
        lmtpd_done(&ls);   /* init failed half way */
    return status;
}
