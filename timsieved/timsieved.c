/*
 * timsieved.c - the ManageSieve worker (RFC 5804): command line, and the
 * callbacks lib/service.h's service_main() runs (init once per process,
 * serve once per connection, done before exit).  The protocol is
 * managesieve.c; the scripts' storage store/sievedir.c.
 *
 *   timsieved [-C imapd.conf] [-U uses] [-T idlesecs]
 *
 * imapd.conf: -C, else $CYRUSDELIVER_CONF (the master sets it), else
 * /etc/imapd.conf.  -U / -T override the master's maxuses / idle timeout
 * for this worker.  Run by hand (fd 3 is not a listening socket) it
 * serves one session on stdin/stdout, through a relay as imapd does.
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

#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "lib/prot.h"
#include "lib/saslserver.h"
#include "lib/service.h"
#include "lib/tls.h"
#include "timsieved/managesieve.h"

#define TIMSIEVED_DEFAULT_CONF IMAPCONF_DEFAULT_PATH

struct timsieved_state {
    const char *confpath;
    struct imapconf *conf;
    struct tls_server *tls;
    int sasl_ok;
    struct managesieve_server *srv;
};

static void timsieved_usage(FILE *out)
{
    fprintf(out,
"Usage: timsieved [-C imapd.conf] [-U uses] [-T idlesecs]\n"
"\n"
"The ManageSieve worker (RFC 5804), started by the master for a SERVICES\n"
"entry (listening socket on fd 3); run by hand it serves one session on\n"
"stdin/stdout.\n"
"  -C FILE   imapd.conf (default $CYRUSDELIVER_CONF, else "
TIMSIEVED_DEFAULT_CONF ")\n"
"  -U USES   leave after USES connections (0: never)\n"
"  -T SECS   leave after SECS seconds without a connection (0: never)\n"
"  -h, --help  this text\n");
}

static int timsieved_init(int argc, char **argv, void *rock)
{
    struct timsieved_state *ls = rock;
    char *err = NULL;

    (void)argc;
    (void)argv;
    if (imapconf_load(ls->confpath, &ls->conf, &err) != 0) {
        log_error("timsieved: cannot load the configuration file=<%s> "
                  "error=<%s>", ls->confpath, err ? err : "out of memory");
        free(err);
        return 1;
    }
    imapconf_log_file(ls->conf);
    metrics_attach(ls->conf);
    if (tls_server_new(ls->conf, &ls->tls, &err) != 0) {
        log_info("timsieved: STARTTLS not offered reason=<%s>",
                 err ? err : "out of memory");
        free(err);
        err = NULL;
        ls->tls = NULL;
    }
    ls->sasl_ok = saslserver_init(ls->conf, "timsieved") == 0;
    if (managesieve_server_new(ls->conf, ls->tls, ls->sasl_ok,
                               &ls->srv) != 0)
        return 1;
    return 0;
}

static void timsieved_session(struct timsieved_state *ls, int fd,
                              const char *peer)
{
    char local[SASLSERVER_ADDRLEN], remote[SASLSERVER_ADDRLEN];
    struct managesieve_conn conn;
    struct prot *p;

    memset(&conn, 0, sizeof(conn));
    (void)saslserver_sockaddrs(fd, local, remote);
    conn.peer = peer;
    conn.localaddr = local[0] ? local : NULL;
    conn.remoteaddr = remote[0] ? remote : NULL;
    conn.fd = fd;

    p = prot_new(fd);
    if (!p) {
        log_error("timsieved: out of memory peer=<%s>", peer);
        return;
    }
    managesieve_serve(ls->srv, p, &conn);
    prot_free(&p);
}

static void timsieved_session_cb(int fd, const char *peer, void *rock)
{
    timsieved_session(rock, fd, peer);
}

/* One connection; run by hand, stdin/stdout through a relay (service.h) */
static void timsieved_serve(int fd, const char *peer, void *rock)
{
    service_serve_stdio(fd, peer, timsieved_session_cb, rock);
}

static void timsieved_done(void *rock)
{
    struct timsieved_state *ls = rock;

    managesieve_server_free(&ls->srv);
    if (ls->sasl_ok)
        saslserver_done();
    ls->sasl_ok = 0;
    tls_server_free(&ls->tls);
    imapconf_free(&ls->conf);
}

int main(int argc, char **argv)
{
    struct timsieved_state ls;
    struct service_callbacks cb;
    int status;

    memset(&ls, 0, sizeof(ls));
    log_init("timsieved", log_worker_target());
    status = service_parse_args(argc, argv, 0, NULL,
                                TIMSIEVED_DEFAULT_CONF, &ls.confpath,
                                timsieved_usage);
    if (status != 0)
        return status < 0 ? 0 : status;
    memset(&cb, 0, sizeof(cb));
    cb.init = timsieved_init;
    cb.serve = timsieved_serve;
    cb.done = timsieved_done;
    cb.rock = &ls;
    status = service_main(argc, argv, &cb);
    if (status == 75)
        timsieved_done(&ls);   /* init failed half way */
    return status;
}
