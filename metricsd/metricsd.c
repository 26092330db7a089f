/*
 * metricsd - the Prometheus exporter: serves GET /metrics (text
 * exposition format 0.0.4) on imapd.conf's metrics_listen, from the
 * shared counters file (lib/metrics.h) and the group commit's shared
 * counters (store/commit.h).  The master runs it as a DAEMON child when
 * metrics_listen is set; it reads nothing but those two files, each
 * scrape.  One thread serves the requests (libmicrohttpd's internal
 * polling thread), the main thread waits for SIGTERM/SIGINT.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <microhttpd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "store/commit.h"

#define METRICSD_DEFAULT_CONF IMAPCONF_DEFAULT_PATH
#define P "cyrusdeliver_"

static struct imapconf *metricsd_conf;
static char metricsd_path[PATH_MAX];

static void usage(FILE *out, int code)
{
    fprintf(out,
"Usage: metricsd [-C imapd.conf] [-l]\n"
"\n"
"Serves the Prometheus metrics of the master's processes on imapd.conf's\n"
"metrics_listen (HOST:PORT).  The master runs it when that key is set.\n"
"  -C FILE   imapd.conf (default $CYRUSDELIVER_CONF, else "
METRICSD_DEFAULT_CONF ")\n"
"  -l        log to stderr\n"
"  -h, --help  this text\n");
    exit(code);
}

static void head(struct buf *b, const char *name, const char *type,
                 const char *help)
{
    buf_printf(b, "# HELP " P "%s %s\n# TYPE " P "%s %s\n", name, help,
               name, type);
}

static void hist(struct buf *b, const char *name, const char *labels,
                 const struct metrics_hist *h)
{
    uint64_t cum = 0;
    int i;

    for (i = 0; i < METRICS_NBUCKETS; i++) {
        cum += h->bucket[i];
        buf_printf(b, P "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels,
                   *labels ? "," : "", (double)metrics_bucket_us[i] / 1e6,
                   (unsigned long long)cum);
    }
    buf_printf(b, P "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels,
               *labels ? "," : "", (unsigned long long)h->count);
    buf_printf(b, P "%s_sum%s%s%s %.6f\n", name, *labels ? "{" : "", labels,
               *labels ? "}" : "", (double)h->sum_us / 1e6);
    buf_printf(b, P "%s_count%s%s%s %llu\n", name, *labels ? "{" : "",
               labels, *labels ? "}" : "", (unsigned long long)h->count);
}

/* The whole exposition into b; 0, or -1 (no consistent copy). */
static int metricsd_render(struct buf *b)
{
    static struct metrics_slot sum;
    static struct metrics_service sv[METRICS_SERVICES];
    const struct metrics_shm *shm = NULL;
    struct commit_shared_stats cs;
    char labels[128];
    int e, i, j, have_commit;

    e = metrics_open_read(metricsd_path, &shm);
    if (e) {
        log_error("metricsd: cannot map file=<%s> error=<%s>", metricsd_path,
                  e == EBADMSG ? "not a metrics file of this version"
                               : strerror(e));
        return -1;
    }
    e = metrics_sum(shm, &sum, sv);
    munmap((void *)shm, sizeof(*shm));
    if (e < 0)
        return -1;
    have_commit = commit_shared_stats(metricsd_conf, &cs) == 0;

    head(b, "lmtp_deliveries_total", "counter",
         "Final LMTP replies per recipient after DATA or BDAT, by reply "
         "code and enhanced status code.");
    for (i = 0; i < METRICS_NREPLIES; i++)
        buf_printf(b, P "lmtp_deliveries_total{code=\"%s\",enhanced=\"%s\"}"
                   " %llu\n", metrics_reply_code[i],
                   metrics_reply_enhanced[i],
                   (unsigned long long)sum.reply[i]);
    head(b, "lmtp_delivered_bytes_total", "counter",
         "Message bytes delivered, counted once per recipient answered 250.");
    buf_printf(b, P "lmtp_delivered_bytes_total %llu\n",
               (unsigned long long)sum.counter[METRICS_LMTP_BYTES]);
    head(b, "lmtp_delivery_duration_seconds", "histogram",
         "Time from a recipient's RCPT accepted to its final 250.");
    hist(b, "lmtp_delivery_duration_seconds", "", &sum.delivery);
    head(b, "duplicate_suppressions_total", "counter",
         "Recipients not delivered again: their message id was delivered "
         "to the mailbox before (duplicate suppression).");
    buf_printf(b, P "duplicate_suppressions_total %llu\n",
               (unsigned long long)sum.counter[METRICS_DUPLICATES]);
    head(b, "quota_refusals_total", "counter",
         "Recipients refused over quota (at RCPT or at delivery).");
    buf_printf(b, P "quota_refusals_total %llu\n",
               (unsigned long long)sum.counter[METRICS_QUOTA_REFUSALS]);

    head(b, "directory_lookups_total", "counter",
         "Lookups of a recipient's or login's backend in the directory "
         "(proxy mode), by where the answer came from: the worker's cache, "
         "or the directory database (etcd: a linearizable read).");
    buf_printf(b, P "directory_lookups_total{source=\"cache\"} %llu\n",
               (unsigned long long)sum.counter[METRICS_DIRECTORY_CACHED]);
    buf_printf(b, P "directory_lookups_total{source=\"database\"} %llu\n",
               (unsigned long long)sum.counter[METRICS_DIRECTORY_READS]);

    head(b, "commit_commits_total", "counter",
         "Commits that made message batches durable (every spool_sync "
         "mode).");
    buf_printf(b, P "commit_commits_total %llu\n",
               have_commit ? cs.commits : 0ULL);
    head(b, "commit_rounds_total", "counter",
         "Group commit rounds (one syncfs() shared by every commit that "
         "waited for it); commits per round = commits / rounds.");
    buf_printf(b, P "commit_rounds_total %llu\n",
               have_commit ? cs.rounds_started : 0ULL);
    head(b, "sync_calls_total", "counter",
         "Synchronisation system calls of the commit path, by call.");
    buf_printf(b, P "sync_calls_total{call=\"syncfs\"} %llu\n",
               have_commit ? cs.syncfs_calls : 0ULL);
    buf_printf(b, P "sync_calls_total{call=\"fsync_file\"} %llu\n",
               have_commit ? cs.file_syncs : 0ULL);
    buf_printf(b, P "sync_calls_total{call=\"fsync_dir\"} %llu\n",
               have_commit ? cs.dir_syncs : 0ULL);

    head(b, "imap_logins_total", "counter",
         "IMAP logins (LOGIN and AUTHENTICATE) by result.");
    buf_printf(b, P "imap_logins_total{result=\"ok\"} %llu\n",
               (unsigned long long)sum.counter[METRICS_IMAP_LOGINS_OK]);
    buf_printf(b, P "imap_logins_total{result=\"failed\"} %llu\n",
               (unsigned long long)sum.counter[METRICS_IMAP_LOGINS_FAILED]);
    head(b, "imap_commands_total", "counter",
         "IMAP commands completed, by command name.");
    for (i = 0; i < METRICS_NIMAPCMDS; i++) {
        if (i > 0 && strcmp(metrics_imap_cmd[i], "other") == 0)
            continue;
        buf_printf(b, P "imap_commands_total{command=\"%s\"} %llu\n",
                   metrics_imap_cmd[i],
                   (unsigned long long)sum.imap[i].count);
    }
    head(b, "imap_command_duration_seconds", "histogram",
         "Time from an IMAP command read to its tagged reply, by command.");
    for (i = 0; i < METRICS_NIMAPCMDS; i++) {
        if (i > 0 && strcmp(metrics_imap_cmd[i], "other") == 0)
            continue;
        snprintf(labels, sizeof(labels), "command=\"%s\"",
                 metrics_imap_cmd[i]);
        hist(b, "imap_command_duration_seconds", labels, &sum.imap[i]);
    }

    head(b, "db_errors_total", "counter",
         "Database errors (I/O, internal, full, bad format) by database and "
         "backend.");
    for (i = 0; i < METRICS_NDBS; i++)
        for (j = 0; j < METRICS_NBACKENDS; j++)
            buf_printf(b, P "db_errors_total{database=\"%s\",backend=\"%s\"}"
                       " %llu\n", metrics_db_name[i], metrics_backend_name[j],
                       (unsigned long long)sum.db_errors[i][j]);
    head(b, "db_checkpoint_duration_seconds", "histogram",
         "Time of one database checkpoint run (ctl_cyrusdb -c started by "
         "the master: every database of the store).");
    hist(b, "db_checkpoint_duration_seconds", "", &sum.checkpoint);
    head(b, "db_checkpoint_failures_total", "counter",
         "Database files whose checkpoint failed, by database.");
    for (i = 0; i < METRICS_NDBS; i++)
        buf_printf(b, P "db_checkpoint_failures_total{database=\"%s\"} "
                   "%llu\n", metrics_db_name[i],
                   (unsigned long long)sum.checkpoint_failures[i]);

    head(b, "service_ready", "gauge",
         "Children of a service waiting for a connection.");
    for (i = 0; i < METRICS_SERVICES; i++)
        if (sv[i].name[0])
            buf_printf(b, P "service_ready{service=\"%s\"} %u\n", sv[i].name,
                       sv[i].ready);
    head(b, "service_busy", "gauge",
         "Children of a service serving a connection.");
    for (i = 0; i < METRICS_SERVICES; i++)
        if (sv[i].name[0])
            buf_printf(b, P "service_busy{service=\"%s\"} %u\n", sv[i].name,
                       sv[i].busy);
    head(b, "service_maxchild", "gauge",
         "The maxchild limit of a service.");
    for (i = 0; i < METRICS_SERVICES; i++)
        if (sv[i].name[0])
            buf_printf(b, P "service_maxchild{service=\"%s\"} %u\n",
                       sv[i].name, sv[i].maxchild);
    head(b, "service_forks_total", "counter",
         "Children the master forked for a service.");
    for (i = 0; i < METRICS_SERVICES; i++)
        if (sv[i].name[0])
            buf_printf(b, P "service_forks_total{service=\"%s\"} %llu\n",
                       sv[i].name, (unsigned long long)sv[i].forks);
    head(b, "service_crashes_total", "counter",
         "Children of a service that died by a signal the master did not "
         "send, or exited non-zero without saying they were leaving.");
    for (i = 0; i < METRICS_SERVICES; i++)
        if (sv[i].name[0])
            buf_printf(b, P "service_crashes_total{service=\"%s\"} %llu\n",
                       sv[i].name, (unsigned long long)sv[i].crashes);
    return 0;
}

static enum MHD_Result metricsd_answer(void *cls,
                                       struct MHD_Connection *conn,
                                       const char *url, const char *method,
                                       const char *version,
                                       const char *upload, size_t *upload_len,
                                       void **state)
{
    struct MHD_Response *resp;
    struct buf b = BUF_INITIALIZER;
    enum MHD_Result ret;
    unsigned status = MHD_HTTP_OK;
    const char *type = "text/plain; version=0.0.4; charset=utf-8";

    (void)cls;
    (void)version;
    (void)upload;
    if (!*state) {          /* first call: headers only */
        *state = conn;
        return MHD_YES;
    }
    if (*upload_len) {
        *upload_len = 0;    /* a body is read and ignored */
        return MHD_YES;
    }
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        status = MHD_HTTP_METHOD_NOT_ALLOWED;
        buf_appendcstr(&b, "only GET\n");
    } else if (strcmp(url, "/metrics") != 0) {
        status = MHD_HTTP_NOT_FOUND;
        buf_appendcstr(&b, "see /metrics\n");
    } else if (metricsd_render(&b) < 0) {
        buf_reset(&b);
        status = MHD_HTTP_SERVICE_UNAVAILABLE;
        buf_appendcstr(&b, "metrics unavailable\n");
    }
    if (status != MHD_HTTP_OK)
        type = "text/plain; charset=utf-8";
    resp = MHD_create_response_from_buffer(b.len, (void *)buf_cstring(&b),
                                           MHD_RESPMEM_MUST_COPY);
    buf_free(&b);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", type);
    ret = MHD_queue_response(conn, status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* "HOST:PORT" or "[V6]:PORT" -> an address; 0 or -1 with *err_r. */
static int metricsd_address(const char *spec, struct sockaddr_storage *ss,
                            socklen_t *len_r, const char **err_r)
{
    char host[256];
    const char *colon, *h = spec, *port;
    size_t hl;
    struct addrinfo hints, *ai = NULL;
    int r;

    if (spec[0] == '[') {
        const char *close = strchr(spec, ']');
        if (!close || close[1] != ':') {
            *err_r = "expected [ADDRESS]:PORT";
            return -1;
        }
        h = spec + 1;
        hl = (size_t)(close - h);
        port = close + 2;
    } else {
        colon = strrchr(spec, ':');
        if (!colon) {
            *err_r = "expected HOST:PORT";
            return -1;
        }
        hl = (size_t)(colon - spec);
        port = colon + 1;
    }
    if (hl == 0 || hl >= sizeof(host) || !*port) {
        *err_r = "expected HOST:PORT";
        return -1;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    r = getaddrinfo(host, port, &hints, &ai);
    if (r != 0 || !ai) {
        *err_r = r ? gai_strerror(r) : "no address";
        return -1;
    }
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len_r = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *confpath = getenv("CYRUSDELIVER_CONF"), *listen, *err = NULL;
    struct sockaddr_storage ss;
    socklen_t sslen = 0;
    struct MHD_Daemon *d;
    char *cerr = NULL;
    sigset_t set;
    int opt, to_stderr = 0, sig = 0;

    while ((opt = getopt_long(argc, argv, "C:lh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': confpath = optarg; break;
        case 'l': to_stderr = 1; break;
        case 'h': usage(stdout, 0); break;
        default: usage(stderr, 64);
        }
    }
    if (optind != argc)
        usage(stderr, 64);
    if (!confpath || !*confpath)
        confpath = METRICSD_DEFAULT_CONF;
    log_init("metricsd", to_stderr ? LOG_TO_STDERR : log_worker_target());
    if (imapconf_load(confpath, &metricsd_conf, &cerr) != 0)
        log_fatal(78, "metricsd: cannot load the configuration file=<%s> "
                  "error=<%s>", confpath, cerr ? cerr : "out of memory");
    if (!to_stderr)
        imapconf_log_file(metricsd_conf);
    listen = imapconf_getstring(metricsd_conf, "metrics_listen");
    if (!listen || !*listen)
        log_fatal(78, "metricsd: metrics_listen is not set in file=<%s>",
                  confpath);
    if (metricsd_address(listen, &ss, &sslen, &err) < 0)
        log_fatal(78, "metricsd: bad metrics_listen=<%s> error=<%s>", listen,
                  err);
    if (metrics_path(metricsd_conf, metricsd_path, sizeof(metricsd_path)) < 0)
        log_fatal(78, "metricsd: no configdirectory in file=<%s>", confpath);

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);     /* the server thread too */
    signal(SIGPIPE, SIG_IGN);

    d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG
                         | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
                         0, NULL, NULL, metricsd_answer, NULL,
                         MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                         MHD_OPTION_CONNECTION_TIMEOUT, 30u,
                         MHD_OPTION_CONNECTION_LIMIT, 64u,
                         MHD_OPTION_END);
    if (!d)
        log_fatal(71, "metricsd: cannot listen on metrics_listen=<%s> "
                  "error=<%s>", listen, strerror(errno));
    log_info("metricsd: listening on address=<%s> file=<%s>", listen,
             metricsd_path);
    for (;;) {
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig != SIGHUP)
            break;
    }
    MHD_stop_daemon(d);
    log_info("metricsd: exiting signal=<%d>", sig);
    imapconf_free(&metricsd_conf);
    return 0;
}
