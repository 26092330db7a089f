/*
 * saslserver.c - server-side SASL through Cyrus SASL 2.1 (see
 * saslserver.h).
 *
 * Options: SASL asks for options (pwcheck_method, auxprop_plugin,
 * sasldb_path, mech_list, ...) through the SASL_CB_GETOPT callback; the
 * answer is imapd.conf's "sasl_" + option, or "not set" so that SASL uses
 * its default.  SASL's own log lines go through lib/log.h.
 *
 * Realms: the connection is made with serverFQDN = imapd.conf's
 * servername (when set; else SASL's idea of the host name) and no user
 * realm, so a login name without "@" is looked up in the realm
 * serverFQDN.  A sasldb user made with "saslpasswd2 -u REALM user" logs
 * in as "user" when REALM is the servername, and as "user@REALM" always.
 *
 * Security properties of each connection: no security layer (max_ssf 0,
 * maxbufsize 0), SASL_SEC_NOANONYMOUS always, SASL_SEC_NOPLAINTEXT unless
 * the connection is under TLS (tls_ssf > 0) or allowplaintext is on; the
 * TLS strength is given to SASL as SASL_SSF_EXTERNAL.
 *
 * User ids: with a canon function (saslserver_new_canon()) SASL's
 * canon_user callback hands every authentication and authorization id to
 * it first; what it returns is the id SASL checks the password for and
 * saslserver_user() reports (imapd's virtual domains: "alice" becomes
 * "alice@example.com" before sasldb looks alice up in realm
 * example.com).  A refusal fails the exchange like a wrong password.
 *
 * The exchange: base64 on the wire (sasl_decode64 / sasl_encode64).  An
 * initial response "=" is an empty one; a response "*" cancels.  When a
 * mechanism succeeds with final server data (SCRAM's server signature),
 * that data goes out as one more challenge and the (empty) answer to it
 * completes the exchange, as RFC 4954 section 4 requires for SMTP.
 */
#include "config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sasl/sasl.h>
#include <sasl/saslutil.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/saslserver.h"

enum saslserver_state {
    SASLSERVER_IDLE = 0,      /* no exchange running */
    SASLSERVER_STEPPING,      /* sasl_server_start said CONTINUE */
    SASLSERVER_FINAL,         /* success data sent; waiting for "" */
    SASLSERVER_AUTHED
};

struct saslserver {
    sasl_conn_t *conn;
    enum saslserver_state state;
    char *user;               /* after DONE */
    char *proxy;              /* after DONE, when the authentication id
                                 was another (a proxyservers entry) */
    char error[256];
    saslserver_canon_fn *canon;   /* NULL: SASL's own canonicalization */
    void *canon_rock;
    sasl_callback_t callbacks[3];
};

static const struct imapconf *saslserver_conf;
static int saslserver_ready;

/* SASL asks for "OPTION": answer with imapd.conf's "sasl_OPTION". */
static int saslserver_getopt(void *context, const char *plugin_name,
                             const char *option, const char **result,
                             unsigned *len)
{
    char key[256];
    const char *value;

    (void)context;
    (void)plugin_name;
    if (!saslserver_conf || !option)
        return SASL_FAIL;
    if ((size_t)snprintf(key, sizeof(key), "sasl_%s", option) >= sizeof(key))
        return SASL_FAIL;
    value = imapconf_getsasl(saslserver_conf, key);
    if (!value)
        return SASL_FAIL;
    *result = value;
    if (len)
        *len = (unsigned)strlen(value);
    return SASL_OK;
}

static int saslserver_log(void *context, int level, const char *message)
{
    char clean[512];

    (void)context;
    if (!message)
        return SASL_OK;
    log_sanitize(message, strlen(message), clean, sizeof(clean));
    switch (level) {
    case SASL_LOG_ERR:
        log_error("sasl: error=<%s>", clean);
        break;
    case SASL_LOG_FAIL:
    case SASL_LOG_NOTE:
        log_info("sasl: message=<%s>", clean);
        break;
    case SASL_LOG_WARN:
        log_warning("sasl: warning=<%s>", clean);
        break;
    case SASL_LOG_PASS:
        break;      /* may show passwords: never */
    default:
        log_debug("sasl: message=<%s>", clean);
        break;
    }
    return SASL_OK;
}

/* SASL's callback table wants int (*)(void); the detour through
 * void (*)(void) is the portable way to say the cast is deliberate. */
#define SASLSERVER_PROC(f) ((int (*)(void))(void (*)(void))(f))

static sasl_callback_t saslserver_callbacks[] = {
    { SASL_CB_GETOPT, SASLSERVER_PROC(saslserver_getopt), NULL },
    { SASL_CB_LOG, SASLSERVER_PROC(saslserver_log), NULL },
    { SASL_CB_LIST_END, NULL, NULL }
};

int saslserver_init(const struct imapconf *conf, const char *appname)
{
    int r;

    saslserver_conf = conf;
    r = sasl_server_init(saslserver_callbacks, appname);
    if (r != SASL_OK) {
        log_error("sasl: sasl_server_init failed error=<%s>",
                  sasl_errstring(r, NULL, NULL));
        saslserver_ready = 0;
        return -1;
    }
    saslserver_ready = 1;
    return 0;
}

void saslserver_done(void)
{
    if (saslserver_ready)
        sasl_server_done();
    saslserver_ready = 0;
}

static void saslserver_seterror(struct saslserver *s, const char *what, int r)
{
    if (strncmp(s->error, "user id ", 8) == 0)
        return;     /* the canon function's reason says more */
    const char *detail = s->conn ? sasl_errdetail(s->conn) : NULL;

    snprintf(s->error, sizeof(s->error), "%s: %s", what,
             detail ? detail : sasl_errstring(r, NULL, NULL));
}

/* Security properties and external SSF for the connection's TLS state. */
static int saslserver_props(struct saslserver *s, int tls_ssf)
{
    sasl_security_properties_t props;
    sasl_ssf_t ssf = tls_ssf > 0 ? (sasl_ssf_t)tls_ssf : 0;
    int allowplain = saslserver_conf
        && imapconf_getswitch(saslserver_conf, "allowplaintext");
    int r;

    memset(&props, 0, sizeof(props));
    props.min_ssf = 0;
    props.max_ssf = 0;             /* no security layer: TLS protects */
    props.maxbufsize = 0;
    props.security_flags = SASL_SEC_NOANONYMOUS;
    if (tls_ssf <= 0 && !allowplain)
        props.security_flags |= SASL_SEC_NOPLAINTEXT;
    r = sasl_setprop(s->conn, SASL_SEC_PROPS, &props);
    if (r != SASL_OK) {
        saslserver_seterror(s, "sasl_setprop(SASL_SEC_PROPS)", r);
        return -1;
    }
    r = sasl_setprop(s->conn, SASL_SSF_EXTERNAL, &ssf);
    if (r != SASL_OK) {
        saslserver_seterror(s, "sasl_setprop(SASL_SSF_EXTERNAL)", r);
        return -1;
    }
    return 0;
}

/* SASL's canon_user callback: the caller's canon function, before SASL's
 * own canonicalization and before any password check. */
static int saslserver_canon_user(sasl_conn_t *conn, void *context,
                                 const char *in, unsigned inlen,
                                 unsigned flags, const char *user_realm,
                                 char *out, unsigned out_max,
                                 unsigned *out_len)
{
    struct saslserver *s = context;
    struct buf res = BUF_INITIALIZER;
    const char *err = NULL;

    (void)conn;
    (void)flags;
    (void)user_realm;
    if (!in || !out || !out_len)
        return SASL_BADPARAM;
    if (s->canon(s->canon_rock, in, inlen, &res, &err) != 0) {
        snprintf(s->error, sizeof(s->error), "user id refused: %s",
                 err ? err : "invalid");
        buf_free(&res);
        return SASL_BADAUTH;
    }
    if (res.len >= out_max) {
        snprintf(s->error, sizeof(s->error), "user id too long");
        buf_free(&res);
        return SASL_BUFOVER;
    }
    memcpy(out, res.s ? res.s : "", res.len);
    out[res.len] = '\0';
    *out_len = (unsigned)res.len;
    buf_free(&res);
    return SASL_OK;
}

/* Whether the authentication id (aid, alen) is one of imapd.conf's
 * proxyservers, each entry canonicalized as a login when s has a canon
 * function (as `admins` is). */
static int saslserver_may_proxy(struct saslserver *s, const char *aid,
                                unsigned alen)
{
    const char *list = saslserver_conf
        ? imapconf_getstring(saslserver_conf, "proxyservers") : NULL;
    const char *p = list ? list : "";
    int ok = 0;

    while (!ok && *p) {
        size_t n;

        p += strspn(p, " ,\t");
        n = strcspn(p, " ,\t");
        if (n) {
            struct buf e = BUF_INITIALIZER;
            const char *err = NULL;

            if (s->canon) {
                if (s->canon(s->canon_rock, p, n, &e, &err) != 0)
                    buf_reset(&e);
            } else {
                buf_append(&e, p, n);
            }
            ok = e.len == alen && alen && memcmp(e.s, aid, alen) == 0;
            buf_free(&e);
        }
        p += n;
    }
    return ok;
}

/* SASL's proxy policy: an authorization id other than the authentication
 * id only for the proxyservers (a frontend logging in for its user). */
static int saslserver_proxy_policy(sasl_conn_t *conn, void *context,
                                   const char *requested_user, unsigned rlen,
                                   const char *auth_identity, unsigned alen,
                                   const char *def_realm, unsigned urlen,
                                   struct propctx *propctx)
{
    struct saslserver *s = context;

    (void)def_realm;
    (void)urlen;
    (void)propctx;
    free(s->proxy);
    s->proxy = NULL;
    if (!requested_user || !auth_identity)
        return SASL_BADPARAM;
    if (rlen == alen && memcmp(requested_user, auth_identity, alen) == 0)
        return SASL_OK;
    if (saslserver_may_proxy(s, auth_identity, alen)) {
        s->proxy = strndup(auth_identity, alen);
        if (!s->proxy)
            return SASL_NOMEM;
        return SASL_OK;
    }
    snprintf(s->error, sizeof(s->error), "%.*s may not log in as %.*s "
             "(not in proxyservers)", (int)(alen > 100 ? 100 : alen),
             auth_identity, (int)(rlen > 100 ? 100 : rlen), requested_user);
    sasl_seterror(conn, SASL_NOLOG, "%s", s->error);
    return SASL_NOAUTHZ;
}

struct saslserver *saslserver_new(const char *service, const char *localaddr,
                                  const char *remoteaddr, int tls_ssf)
{
    return saslserver_new_canon(service, localaddr, remoteaddr, tls_ssf,
                                NULL, NULL);
}

struct saslserver *saslserver_new_canon(const char *service,
                                        const char *localaddr,
                                        const char *remoteaddr, int tls_ssf,
                                        saslserver_canon_fn *canon,
                                        void *rock)
{
    struct saslserver *s;
    const char *fqdn = NULL;
    int r;

    if (!saslserver_ready) {
        log_error("sasl: saslserver_new before a successful saslserver_init");
        return NULL;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        log_error("sasl: out of memory");
        return NULL;
    }
    if (saslserver_conf) {
        fqdn = imapconf_getstring(saslserver_conf, "servername");
        if (fqdn && !*fqdn)
            fqdn = NULL;
    }
    s->canon = canon;
    s->canon_rock = rock;
    {
        int n = 0;

        if (canon) {
            s->callbacks[n].id = SASL_CB_CANON_USER;
            s->callbacks[n].proc = SASLSERVER_PROC(saslserver_canon_user);
            s->callbacks[n].context = s;
            n++;
        }
        s->callbacks[n].id = SASL_CB_PROXY_POLICY;
        s->callbacks[n].proc = SASLSERVER_PROC(saslserver_proxy_policy);
        s->callbacks[n].context = s;
        n++;
        s->callbacks[n].id = SASL_CB_LIST_END;
    }
    r = sasl_server_new(service, fqdn, NULL, localaddr, remoteaddr,
                        s->callbacks, 0, &s->conn);
    if (r != SASL_OK) {
        log_error("sasl: sasl_server_new failed service=<%s> error=<%s>",
                  service, sasl_errstring(r, NULL, NULL));
        free(s);
        return NULL;
    }
    if (saslserver_props(s, tls_ssf) < 0) {
        log_error("sasl: cannot set properties error=<%s>", s->error);
        sasl_dispose(&s->conn);
        free(s);
        return NULL;
    }
    snprintf(s->error, sizeof(s->error), "no error");
    return s;
}

void saslserver_free(struct saslserver **sp)
{
    if (!sp || !*sp)
        return;
    if ((*sp)->conn)
        sasl_dispose(&(*sp)->conn);
    free((*sp)->user);
    free((*sp)->proxy);
    free(*sp);
    *sp = NULL;
}

int saslserver_set_tls(struct saslserver *s, int tls_ssf)
{
    return saslserver_props(s, tls_ssf);
}

int saslserver_mechs(struct saslserver *s, struct buf *out)
{
    const char *list = NULL;
    unsigned len = 0;
    int count = 0;
    int r;

    buf_reset(out);
    r = sasl_listmech(s->conn, NULL, "", " ", "", &list, &len, &count);
    if (r != SASL_OK || count <= 0 || !list || len == 0) {
        saslserver_seterror(s, "sasl_listmech", r);
        return -1;
    }
    if (buf_append(out, list, len) < 0)
        return -1;
    return 0;
}

/* base64 text -> bytes in raw.  0 or -1 (not base64). */
static int saslserver_decode(const char *b64, struct buf *raw)
{
    size_t inlen = strlen(b64);
    unsigned outlen = 0;

    buf_reset(raw);
    if (inlen > (1u << 24))
        return -1;
    if (buf_ensure(raw, inlen + 1) < 0)
        return -1;
    if (sasl_decode64(b64, (unsigned)inlen, raw->s, (unsigned)(inlen + 1),
                      &outlen) != SASL_OK)
        return -1;
    raw->len = outlen;
    return 0;
}

/* bytes -> base64 text in out.  0 or -1. */
static int saslserver_encode(const char *data, unsigned len, struct buf *out)
{
    size_t need = ((size_t)len + 2) / 3 * 4 + 1;
    unsigned outlen = 0;

    buf_reset(out);
    if (len == 0)
        return 0;
    if (buf_ensure(out, need) < 0)
        return -1;
    if (sasl_encode64(data, len, out->s, (unsigned)need, &outlen) != SASL_OK)
        return -1;
    out->len = outlen;
    return 0;
}

static int saslserver_authed(struct saslserver *s)
{
    const void *v = NULL;
    int r = sasl_getprop(s->conn, SASL_USERNAME, &v);

    if (r != SASL_OK || !v) {
        saslserver_seterror(s, "sasl_getprop(SASL_USERNAME)", r);
        s->state = SASLSERVER_IDLE;
        return SASLSERVER_ERROR;
    }
    free(s->user);
    s->user = strdup(v);
    if (!s->user) {
        snprintf(s->error, sizeof(s->error), "out of memory");
        s->state = SASLSERVER_IDLE;
        return SASLSERVER_ERROR;
    }
    s->state = SASLSERVER_AUTHED;
    return SASLSERVER_DONE;
}

/* Map a sasl_server_start/step result. */
static int saslserver_result(struct saslserver *s, int r, const char *what,
                             const char *out, unsigned outlen,
                             struct buf *challenge)
{
    switch (r) {
    case SASL_OK:
        if (out && outlen > 0) {
            /* success data: one more round (RFC 4954 section 4) */
            if (saslserver_encode(out, outlen, challenge) < 0) {
                snprintf(s->error, sizeof(s->error), "base64 encoding failed");
                s->state = SASLSERVER_IDLE;
                return SASLSERVER_ERROR;
            }
            s->state = SASLSERVER_FINAL;
            return SASLSERVER_CONTINUE;
        }
        return saslserver_authed(s);
    case SASL_CONTINUE:
        if (saslserver_encode(out, out ? outlen : 0, challenge) < 0) {
            snprintf(s->error, sizeof(s->error), "base64 encoding failed");
            s->state = SASLSERVER_IDLE;
            return SASLSERVER_ERROR;
        }
        s->state = SASLSERVER_STEPPING;
        return SASLSERVER_CONTINUE;
    default:
        break;
    }
    saslserver_seterror(s, what, r);
    s->state = SASLSERVER_IDLE;
    switch (r) {
    case SASL_NOMECH:
    case SASL_TOOWEAK:
    case SASL_ENCRYPT:
        return SASLSERVER_NOMECH;
    case SASL_BADAUTH:
    case SASL_NOUSER:
    case SASL_NOAUTHZ:
    case SASL_EXPIRED:
    case SASL_DISABLED:
    case SASL_NOVERIFY:
    case SASL_BADPROT:
    case SASL_BADPARAM:
    case SASL_BADVERS:
    case SASL_WRONGMECH:
    case SASL_UNAVAIL:
    case SASL_TRANS:
        return SASLSERVER_FAIL;
    default:
        return SASLSERVER_ERROR;
    }
}

int saslserver_start(struct saslserver *s, const char *mech,
                     const char *initial_b64, struct buf *challenge)
{
    struct buf raw = BUF_INITIALIZER;
    const char *in = NULL;
    unsigned inlen = 0;
    const char *out = NULL;
    unsigned outlen = 0;
    int r;

    buf_reset(challenge);
    if (s->state == SASLSERVER_AUTHED) {
        /* SASL cannot run a second exchange on an authenticated
         * connection (and RFC 4954 forbids it: 503) */
        snprintf(s->error, sizeof(s->error), "already authenticated");
        return SASLSERVER_ERROR;
    }
    s->state = SASLSERVER_IDLE;
    snprintf(s->error, sizeof(s->error), "no error");
    if (!mech || !*mech) {
        snprintf(s->error, sizeof(s->error), "no mechanism given");
        return SASLSERVER_NOMECH;
    }
    if (initial_b64) {
        if (strcmp(initial_b64, "*") == 0) {
            snprintf(s->error, sizeof(s->error), "cancelled by the client");
            return SASLSERVER_CANCEL;
        }
        if (strcmp(initial_b64, "=") == 0) {
            in = "";
            inlen = 0;
        } else {
            if (saslserver_decode(initial_b64, &raw) < 0) {
                buf_free(&raw);
                snprintf(s->error, sizeof(s->error),
                         "initial response is not base64");
                return SASLSERVER_BADB64;
            }
            in = buf_cstring(&raw);
            inlen = (unsigned)raw.len;
        }
    }
    r = sasl_server_start(s->conn, mech, in, inlen, &out, &outlen);
    r = saslserver_result(s, r, "sasl_server_start", out, outlen, challenge);
    buf_free(&raw);
    return r;
}

int saslserver_step(struct saslserver *s, const char *response_b64,
                    struct buf *challenge)
{
    struct buf raw = BUF_INITIALIZER;
    const char *out = NULL;
    unsigned outlen = 0;
    int r;

    buf_reset(challenge);
    if (s->state != SASLSERVER_STEPPING && s->state != SASLSERVER_FINAL) {
        snprintf(s->error, sizeof(s->error), "no authentication in progress");
        return SASLSERVER_ERROR;
    }
    if (!response_b64 || strcmp(response_b64, "*") == 0) {
        s->state = SASLSERVER_IDLE;
        snprintf(s->error, sizeof(s->error), "cancelled by the client");
        return SASLSERVER_CANCEL;
    }
    if (saslserver_decode(response_b64, &raw) < 0) {
        buf_free(&raw);
        s->state = SASLSERVER_IDLE;
        snprintf(s->error, sizeof(s->error), "response is not base64");
        return SASLSERVER_BADB64;
    }
    if (s->state == SASLSERVER_FINAL) {
        /* the answer to the success data must be empty */
        if (raw.len != 0) {
            buf_free(&raw);
            s->state = SASLSERVER_IDLE;
            snprintf(s->error, sizeof(s->error),
                     "non-empty response after the final challenge");
            return SASLSERVER_FAIL;
        }
        buf_free(&raw);
        return saslserver_authed(s);
    }
    r = sasl_server_step(s->conn, buf_cstring(&raw), (unsigned)raw.len,
                         &out, &outlen);
    r = saslserver_result(s, r, "sasl_server_step", out, outlen, challenge);
    buf_free(&raw);
    return r;
}

const char *saslserver_user(const struct saslserver *s)
{
    return s->state == SASLSERVER_AUTHED ? s->user : NULL;
}

const char *saslserver_proxy(const struct saslserver *s)
{
    return s && s->state == SASLSERVER_AUTHED ? s->proxy : NULL;
}

const char *saslserver_error(const struct saslserver *s)
{
    return s->error;
}

/* "a.b.c.d;port" of a socket address, or "" */
static void saslserver_addr(const struct sockaddr_storage *ss, char *out)
{
    char host[INET6_ADDRSTRLEN];

    out[0] = '\0';
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ss;

        if (inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host)))
            snprintf(out, SASLSERVER_ADDRLEN, "%s;%u", host,
                     (unsigned)ntohs(sin->sin_port));
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ss;

        if (inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof(host)))
            snprintf(out, SASLSERVER_ADDRLEN, "%s;%u", host,
                     (unsigned)ntohs(sin6->sin6_port));
    }
}

int saslserver_sockaddrs(int fd, char *local, char *remote)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    int tcp;

    local[0] = remote[0] = '\0';
    memset(&ss, 0, sizeof(ss));
    tcp = getsockname(fd, (struct sockaddr *)&ss, &sslen) == 0 &&
          (ss.ss_family == AF_INET || ss.ss_family == AF_INET6);
    if (!tcp)
        return 0;
    saslserver_addr(&ss, local);
    sslen = sizeof(ss);
    memset(&ss, 0, sizeof(ss));
    if (getpeername(fd, (struct sockaddr *)&ss, &sslen) == 0)
        saslserver_addr(&ss, remote);
    return 1;
}
