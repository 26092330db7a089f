/*
 * proxy.c - imapd as a frontend (see proxy.h).
 *
 * Opening: directory lookup, connect (proxy_timeout), greeting, STARTTLS
 * (proxy_starttls), AUTHENTICATE PLAIN with the user as authorization id
 * (the two-step form, so that a backend without SASL-IR works too), the
 * capability list from the tagged OK's CAPABILITY code or a CAPABILITY
 * command.  Every wait is bounded by proxy_timeout; every failure is one
 * log line "imap: proxy failed ..." with the step and the reason.
 *
 * Relaying: both streams go through prot (TLS on either side); what one
 * side has buffered is written to the other, then the process waits in
 * one ppoll() on both sockets, with every signal blocked from the check
 * of service_stopping() until the wait has begun (as prot's own waits),
 * so a shutdown ends the session at once and nothing wakes the process
 * periodically.  The relay looks at the bytes only to notice the
 * backend's "* BYE" at the start of a line (then the backend's close is
 * the normal end) and a COMPRESS command from the client (after which
 * the frontend cannot add a readable BYE of its own and adds none).
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <sasl/sasl.h>
#include <sasl/saslutil.h>

#include "imapd/proxy.h"
#include "lib/log.h"
#include "lib/netdial.h"
#include "lib/prot.h"
#include "lib/service.h"
#include "lib/tls.h"
#include "store/directory.h"

#define PROXY_LINE_MAX 16384
#define PROXY_CHUNK 65536

#define R_NODIR "[UNAVAILABLE] Mail directory not reachable, try again later"
#define R_NOUSER "[UNAVAILABLE] No mail server known for this user"
#define R_NOBACKEND "[UNAVAILABLE] Mail server not reachable, try again later"

struct imap_proxy {
    const struct imapconf *conf;
    struct directory *dir;
    struct directory_peer *peers;
    size_t npeers;
    struct tls_client *tls;         /* NULL: proxy_starttls off */
    int timeout;
    const char *authname, *password;
    /* the open session */
    int fd;
    struct prot *p;
    const char *name, *addr;
    struct buf line;
    int bye_match;                  /* bytes of "* BYE" matched at the
                                       start of a line; -1 = not at one */
    int saw_bye;
    int compress_match;             /* bytes of "COMPRESS" matched */
    int compressed;
};

int imap_proxy_new(const struct imapconf *conf, struct imap_proxy **px_r,
                   const char **error_r)
{
    struct imap_proxy *px = calloc(1, sizeof(*px));

    *px_r = NULL;
    if (!px) {
        *error_r = "out of memory";
        return -1;
    }
    px->conf = conf;
    px->fd = -1;
    px->timeout = (int)imapconf_getint(conf, "proxy_timeout");
    px->authname = imapconf_getstring(conf, "proxy_authname");
    px->password = imapconf_getstring(conf, "proxy_password");
    if (directory_peers_parse(imapconf_getstring(conf, "proxy_imap_backends"),
                              &px->peers, &px->npeers, error_r) != 0)
        goto fail;
    if (px->npeers == 0) {
        *error_r = "proxy_imap_backends names no backend";
        goto fail;
    }
    if (!px->authname || !*px->authname) {
        *error_r = "proxy_authname is empty";
        goto fail;
    }
    if (directory_new(conf, &px->dir, error_r) != 0)
        goto fail;
    if (imapconf_getswitch(conf, "proxy_starttls")) {
        char *err = NULL;

        if (tls_client_new(imapconf_getstring(conf, "tls_client_ca_file"),
                           &px->tls, &err) != 0) {
            log_error("imap: proxy TLS client error=<%s>",
                      err ? err : "out of memory");
            free(err);
            *error_r = "cannot make the TLS client context (see the log)";
            goto fail;
        }
    }
    *px_r = px;
    return 0;
fail:
    imap_proxy_free(&px);
    return -1;
}

static void proxy_close(struct imap_proxy *px)
{
    prot_free(&px->p);
    if (px->fd >= 0)
        close(px->fd);
    px->fd = -1;
}

void imap_proxy_free(struct imap_proxy **pxp)
{
    struct imap_proxy *px = *pxp;

    if (!px)
        return;
    proxy_close(px);
    directory_free(&px->dir);
    directory_peers_free(px->peers, px->npeers);
    tls_client_free(&px->tls);
    buf_free(&px->line);
    free(px);
    *pxp = NULL;
}

/* ---- opening ------------------------------------------------------------ */

static void proxy_fail_log(struct imap_proxy *px, const char *userid,
                           const char *step, const char *error)
{
    log_warning("imap: proxy failed user=<%s> backend=<%s> address=<%s> "
                "step=<%s> error=<%s>", userid, px->name ? px->name : "",
                px->addr ? px->addr : "", step, error);
}

/* The next line from the backend into px->line.  0, or -1 with *why_r. */
static int proxy_getline(struct imap_proxy *px, const char **why_r)
{
    int r = prot_getline(px->p, &px->line, PROXY_LINE_MAX, NULL);

    if (r == PROT_OK)
        return 0;
    *why_r = r == PROT_EOF ? "connection closed"
             : r == PROT_TIMEOUT ? "timeout"
             : r == PROT_TOOLONG ? "line too long"
             : prot_error(px->p);
    return -1;
}

/* The sanitized text of px->line for a log line. */
static const char *proxy_line_text(struct imap_proxy *px)
{
    size_t i;

    if (px->line.len > 200)
        buf_truncate(&px->line, 200);
    for (i = 0; i < px->line.len; i++)
        if ((unsigned char)px->line.s[i] < 32 || px->line.s[i] == 127)
            px->line.s[i] = '?';
    return buf_cstring(&px->line);
}

/* If line is "* CAPABILITY ..." or carries "[CAPABILITY ...]", the list
 * into caps. */
static void proxy_take_caps(const char *line, struct buf *caps)
{
    const char *c, *end;

    if (strncasecmp(line, "* CAPABILITY ", 13) == 0) {
        buf_reset(caps);
        buf_appendcstr(caps, line + 13);
        return;
    }
    c = strstr(line, "[CAPABILITY ");
    if (c && (end = strchr(c, ']')) != NULL) {
        buf_reset(caps);
        buf_append(caps, c + 12, (size_t)(end - c - 12));
    }
}

/* Read through the reply to TAG: 0 for a tagged OK, 1 for a
 * continuation when cont is set, -1 with *why_r (static, or px->line's
 * text) for anything else.  Untagged capability lists go to caps when
 * caps is not NULL. */
static int proxy_reply(struct imap_proxy *px, const char *tag, int cont,
                       struct buf *caps, const char **why_r)
{
    size_t taglen = strlen(tag);

    for (;;) {
        const char *l;

        if (proxy_getline(px, why_r) != 0)
            return -1;
        l = buf_cstring(&px->line);
        if (strncmp(l, tag, taglen) == 0 && l[taglen] == ' ') {
            if (strncasecmp(l + taglen + 1, "OK", 2) == 0) {
                if (caps)
                    proxy_take_caps(l, caps);
                return 0;
            }
            *why_r = proxy_line_text(px);
            return -1;
        }
        if (l[0] == '+') {
            if (cont)
                return 1;
            *why_r = "unexpected continuation request";
            return -1;
        }
        if (caps)
            proxy_take_caps(l, caps);
    }
}

/* Send "TAG CMD" and read through its tagged reply (proxy_reply()). */
static int proxy_command(struct imap_proxy *px, const char *tag,
                         const char *cmd, struct buf *caps,
                         const char **why_r)
{
    prot_printf(px->p, "%s %s\r\n", tag, cmd);
    if (prot_flush(px->p) != PROT_OK) {
        *why_r = prot_error(px->p);
        return -1;
    }
    return proxy_reply(px, tag, 0, caps, why_r);
}

/* AUTHENTICATE PLAIN as authname for userid (two steps). */
static int proxy_authenticate(struct imap_proxy *px, const char *userid,
                              struct buf *caps, const char **why_r)
{
    struct buf blob = BUF_INITIALIZER;
    char *b64 = NULL;
    unsigned b64len = 0;
    int r = -1;

    buf_appendcstr(&blob, userid);
    buf_putc(&blob, '\0');
    buf_appendcstr(&blob, px->authname);
    buf_putc(&blob, '\0');
    buf_appendcstr(&blob, px->password ? px->password : "");
    b64 = malloc(blob.len * 4 / 3 + 8);
    if (!b64 || sasl_encode64(blob.s, (unsigned)blob.len, b64,
                              (unsigned)(blob.len * 4 / 3 + 8),
                              &b64len) != SASL_OK) {
        *why_r = "out of memory";
        goto out;
    }
    prot_puts(px->p, "P2 AUTHENTICATE PLAIN\r\n");
    if (prot_flush(px->p) != PROT_OK) {
        *why_r = prot_error(px->p);
        goto out;
    }
    switch (proxy_reply(px, "P2", 1, NULL, why_r)) {
    case 1:
        break;
    case 0:
        *why_r = "authenticated before the PLAIN response";
        goto out;
    default:
        goto out;
    }
    prot_write(px->p, b64, b64len);
    prot_puts(px->p, "\r\n");
    if (prot_flush(px->p) != PROT_OK) {
        *why_r = prot_error(px->p);
        goto out;
    }
    /* PLAIN has one step: a second continuation is an error */
    r = proxy_reply(px, "P2", 0, caps, why_r);
out:
    if (blob.s)
        memset(blob.s, 0, blob.len);
    if (b64)
        memset(b64, 0, b64len);
    free(b64);
    buf_free(&blob);
    return r;
}

int imap_proxy_open(struct imap_proxy *px, const char *userid,
                    struct buf *caps, const char **backend_r,
                    struct buf *reply)
{
    const char *name = NULL, *why = NULL, *step;
    char host[256];
    int i;

    proxy_close(px);
    px->name = px->addr = NULL;
    buf_reset(caps);
    buf_reset(reply);
    switch (directory_lookup(px->dir, userid, &name)) {
    case DIRECTORY_OK:
        break;
    case DIRECTORY_NOTFOUND:
        log_info("imap: proxy: no directory record user=<%s>", userid);
        buf_appendcstr(reply, R_NOUSER);
        return -1;
    case DIRECTORY_BADRECORD:
        log_warning("imap: proxy: damaged directory record user=<%s> "
                    "record=<%s>", userid, name ? name : "");
        buf_appendcstr(reply, R_NOBACKEND);
        return -1;
    default:                        /* logged by the directory */
        buf_appendcstr(reply, R_NODIR);
        return -1;
    }
    i = directory_peers_find(px->peers, px->npeers, name);
    if (i < 0) {
        log_warning("imap: proxy: the directory names an unknown backend "
                    "user=<%s> backend=<%s> (not in proxy_imap_backends)",
                    userid, name);
        buf_appendcstr(reply, R_NOBACKEND);
        return -1;
    }
    px->name = px->peers[i].name;
    px->addr = px->peers[i].addr;

    step = "connect";
    px->fd = net_dial(px->addr, px->timeout, &why);
    if (px->fd < 0)
        goto fail;
    px->p = prot_new(px->fd);
    if (!px->p) {
        why = "out of memory";
        goto fail;
    }
    prot_settimeout(px->p, px->timeout);
    step = "greeting";
    if (proxy_getline(px, &why) != 0)
        goto fail;
    if (strncasecmp(buf_cstring(&px->line), "* OK", 4) != 0) {
        why = proxy_line_text(px);
        goto fail;
    }
    proxy_take_caps(buf_cstring(&px->line), caps);
    if (px->tls) {
        step = "starttls";
        if (proxy_command(px, "P1", "STARTTLS", NULL, &why) != 0)
            goto fail;
        net_dial_host(px->addr, host, sizeof(host));
        if (prot_starttls_client(px->p, px->tls, host) != PROT_OK) {
            why = prot_error(px->p);
            goto fail;
        }
    }
    step = "authenticate";
    buf_reset(caps);
    if (proxy_authenticate(px, userid, caps, &why) != 0)
        goto fail;
    if (caps->len == 0) {
        step = "capability";
        if (proxy_command(px, "P3", "CAPABILITY", caps, &why) != 0)
            goto fail;
    }
    if (caps->len == 0)
        buf_appendcstr(caps, "IMAP4rev1");
    px->bye_match = 0;
    px->saw_bye = 0;
    px->compress_match = 0;
    px->compressed = 0;
    *backend_r = px->name;
    log_info("imap: proxy session user=<%s> backend=<%s> address=<%s> "
             "tls=<%s>", userid, px->name, px->addr,
             prot_tls_info(px->p) ? prot_tls_info(px->p) : "none");
    return 0;

fail:
    proxy_fail_log(px, userid, step, why ? why : "unknown");
    proxy_close(px);
    buf_appendcstr(reply, R_NOBACKEND);
    return -1;
}

/* ---- relaying ----------------------------------------------------------- */

/* Watch the backend's bytes for "* BYE" at the start of a line. */
static void proxy_scan_backend(struct imap_proxy *px, const char *s, size_t n)
{
    static const char bye[] = "* BYE";
    size_t i;

    for (i = 0; i < n && !px->saw_bye; i++) {
        if (px->bye_match >= 0) {
            if (s[i] == bye[px->bye_match]) {
                if (++px->bye_match == (int)sizeof(bye) - 1)
                    px->saw_bye = 1;
            } else {
                px->bye_match = -1;
            }
        }
        if (s[i] == '\n')
            px->bye_match = 0;
    }
}

/* Watch the client's bytes for a COMPRESS command (any case). */
static void proxy_scan_client(struct imap_proxy *px, const char *s, size_t n)
{
    static const char word[] = "COMPRESS";
    size_t i;

    for (i = 0; i < n && !px->compressed; i++) {
        int c = s[i] >= 'a' && s[i] <= 'z' ? s[i] - 32 : s[i];

        if (c == word[px->compress_match]) {
            if (++px->compress_match == (int)sizeof(word) - 1)
                px->compressed = 1;
        } else {
            px->compress_match = c == word[0] ? 1 : 0;
        }
    }
}

/* Copy one read's worth from -> to.  0; 1 when from ended or failed; 2
 * when writing to failed. */
static int proxy_copy(struct imap_proxy *px, struct prot *from,
                      struct prot *to, int from_backend, struct buf *b)
{
    size_t n = 0;

    buf_reset(b);
    if (prot_read_some(from, b, PROXY_CHUNK, &n) != PROT_OK)
        return 1;
    if (from_backend)
        proxy_scan_backend(px, b->s, b->len);
    else
        proxy_scan_client(px, b->s, b->len);
    prot_write(to, b->s, b->len);
    return prot_flush(to) == PROT_OK ? 0 : 2;
}

const char *imap_proxy_relay(struct imap_proxy *px, struct prot *client,
                             int client_fd, int timeout)
{
    struct buf b = BUF_INITIALIZER;
    const char *reason = NULL, *bye = NULL;
    time_t last = time(NULL);

    if (!px->p) {
        buf_free(&b);
        return "error";
    }
    /* waits are ppoll's; reads after it only finish TLS records */
    prot_settimeout(client, px->timeout);
    prot_settimeout(px->p, px->timeout);
    while (!reason) {
        struct pollfd pfd[2];
        struct timespec ts;
        sigset_t all, orig;
        long left;
        int r;

        /* what either side has buffered first: ppoll cannot see it */
        while (!reason && prot_pending(client)) {
            r = proxy_copy(px, client, px->p, 0, &b);
            if (r)
                reason = r == 1 ? "disconnect" : "backend";
        }
        while (!reason && prot_pending(px->p)) {
            r = proxy_copy(px, px->p, client, 1, &b);
            if (r)
                reason = r == 1 ? (px->saw_bye ? "logout" : "backend")
                                : "disconnect";
        }
        if (reason)
            break;
        left = (long)timeout - (long)(time(NULL) - last);
        if (left <= 0) {
            reason = "autologout";
            bye = "* BYE Autologout; idle for too long\r\n";
            break;
        }
        pfd[0].fd = client_fd;
        pfd[0].events = POLLIN;
        pfd[1].fd = px->fd;
        pfd[1].events = POLLIN;
        ts.tv_sec = left;
        ts.tv_nsec = 0;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &orig);
        if (service_stopping()) {
            pthread_sigmask(SIG_SETMASK, &orig, NULL);
            reason = "shutdown";
            bye = "* BYE Server shutting down\r\n";
            break;
        }
        r = ppoll(pfd, 2, &ts, &orig);
        pthread_sigmask(SIG_SETMASK, &orig, NULL);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            log_error("imap: proxy ppoll error=<%s>", strerror(errno));
            reason = "error";
            break;
        }
        if (r == 0)
            continue;                   /* the time check above ends it */
        last = time(NULL);
        if (pfd[1].revents) {
            r = proxy_copy(px, px->p, client, 1, &b);
            if (r)
                reason = r == 1 ? (px->saw_bye ? "logout" : "backend")
                                : "disconnect";
        }
        if (!reason && pfd[0].revents) {
            r = proxy_copy(px, client, px->p, 0, &b);
            if (r)
                reason = r == 1 ? (px->saw_bye ? "logout" : "disconnect")
                                : "backend";
        }
    }
    if (strcmp(reason, "backend") == 0) {
        log_warning("imap: proxy: backend connection lost backend=<%s> "
                    "address=<%s> error=<%s>", px->name, px->addr,
                    prot_error(px->p) ? prot_error(px->p) : "closed");
        bye = "* BYE Mail server connection lost\r\n";
    }
    if (bye && !px->compressed) {
        prot_puts(client, bye);
        (void)prot_flush(client);
    }
    if (strcmp(reason, "disconnect") == 0 || !strcmp(reason, "autologout")
        || !strcmp(reason, "shutdown")) {
        /* the backend's session ends with ours */
        if (!px->compressed)
            prot_puts(px->p, "P9 LOGOUT\r\n");
        (void)prot_flush(px->p);
    }
    proxy_close(px);
    buf_free(&b);
    return reason;
}
