/*
 * imapd.c - the IMAP worker: command line, and the callbacks
 * lib/service.h's service_main() runs (init once per process, serve once
 * per connection, done before exit).  The protocol is session.c.
 *
 *   imapd [-C imapd.conf] [-s] [-U uses] [-T idlesecs]
 *
 * imapd.conf: -C, else $CYRUSDELIVER_CONF (the master sets it), else
 * /etc/imapd.conf.  -s: implicit TLS (an imaps listener): the TLS
 * handshake comes before the greeting.  -U / -T override the master's
 * maxuses / idle timeout for this worker.
 *
 * Run by hand (fd 3 is not a listening socket) imapd serves one session
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
#include "imapd/session.h"

#define IMAPD_DEFAULT_CONF IMAPCONF_DEFAULT_PATH

struct imapd_state {
    const char *confpath;
    int implicit_tls;
    struct imapconf *conf;
    struct tls_server *tls;
    int sasl_ok;
    struct imap_server *srv;
};

static void imapd_usage(FILE *out)
{
    fprintf(out,
"Usage: imapd [-C imapd.conf] [-s] [-U uses] [-T idlesecs]\n"
"\n"
"The IMAP worker, started by the master for a SERVICES entry (listening\n"
"socket on fd 3); run by hand it serves one session on stdin/stdout.\n"
"  -C FILE   imapd.conf (default $CYRUSDELIVER_CONF, else "
IMAPD_DEFAULT_CONF ")\n"
"  -s        implicit TLS (imaps): TLS starts before the greeting\n"
"  -U USES   leave after USES connections (0: never)\n"
"  -T SECS   leave after SECS seconds without a connection (0: never)\n"
"  -h, --help  this text\n");
}

static int imapd_init(int argc, char **argv, void *rock)
{
    struct imapd_state *ls = rock;
    char *err = NULL;

    (void)argc;
    (void)argv;
    if (imapconf_load(ls->confpath, &ls->conf, &err) != 0) {
        log_error("imapd: cannot load the configuration file=<%s> "
                  "error=<%s>", ls->confpath, err ? err : "out of memory");
        free(err);
        return 1;
    }
    imapconf_log_file(ls->conf);
    metrics_attach(ls->conf);
    if (cyrusdb_etcd_configure(ls->conf) != 0)   /* directory_db: etcd */
        return 1;
    if (tls_server_new(ls->conf, &ls->tls, &err) != 0) {
        log_info("imapd: STARTTLS not offered reason=<%s>",
                 err ? err : "out of memory");
        free(err);
        err = NULL;
        ls->tls = NULL;
    }
    ls->sasl_ok = saslserver_init(ls->conf, "imapd") == 0;
    if (imap_server_new(ls->conf, ls->tls, ls->sasl_ok, &ls->srv) != 0)
        return 1;
    return 0;
}

static void imapd_session(struct imapd_state *ls, int fd, const char *peer)
{
    char local[SASLSERVER_ADDRLEN], remote[SASLSERVER_ADDRLEN];
    struct imap_conn conn;
    struct prot *p;

    memset(&conn, 0, sizeof(conn));
    (void)saslserver_sockaddrs(fd, local, remote);
    conn.peer = peer;
    conn.localaddr = local[0] ? local : NULL;
    conn.remoteaddr = remote[0] ? remote : NULL;
    conn.implicit_tls = ls->implicit_tls;
    conn.fd = fd;

    p = prot_new(fd);
    if (!p) {
        log_error("imapd: out of memory peer=<%s>", peer);
        return;
    }
    imap_serve(ls->srv, p, &conn);
    prot_free(&p);
}

static void imapd_session_cb(int fd, const char *peer, void *rock)
{
    imapd_session(rock, fd, peer);
}

/* One connection; run by hand, stdin/stdout through a relay (service.h) */
static void imapd_serve(int fd, const char *peer, void *rock)
{
    service_serve_stdio(fd, peer, imapd_session_cb, rock);
}

static void imapd_done(void *rock)
{
    struct imapd_state *ls = rock;

    imap_server_free(&ls->srv);
    if (ls->sasl_ok)
        saslserver_done();
    ls->sasl_ok = 0;
    tls_server_free(&ls->tls);
    imapconf_free(&ls->conf);
}

int main(int argc, char **argv)
{
    struct imapd_state ls;
    struct service_callbacks cb;
    int flag, status;

    memset(&ls, 0, sizeof(ls));
    log_init("imapd", log_worker_target());
    status = service_parse_args(argc, argv, 's', &flag,
                                IMAPD_DEFAULT_CONF, &ls.confpath,
                                imapd_usage);
    if (status != 0)
        return status < 0 ? 0 : status;
    ls.implicit_tls = flag;
    memset(&cb, 0, sizeof(cb));
    cb.init = imapd_init;
    cb.serve = imapd_serve;
    cb.done = imapd_done;
    cb.rock = &ls;
    status = service_main(argc, argv, &cb);
    if (status == 75)
        imapd_done(&ls);   /* init failed half way */
    return status;
}
