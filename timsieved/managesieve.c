/*
 * managesieve.c - the ManageSieve session (RFC 5804): the greeting, the
 * command reader and one function per command.
 *
 * Reading.  A command is a line of at most MS_LINE_MAX bytes holding an
 * atom (the command name) and arguments: atoms (numbers), quoted strings
 * (at most MS_QUOTED_MAX bytes, escapes \\ and \" only) and literals
 * "{N+}" or "{N}" at the end of a line, followed by N bytes and the rest
 * of the command on the next line.  Both literal forms are read at once
 * (the server sends no continuation, as RFC 5804 has none).  Bounds:
 * MS_ARGS_MAX arguments; a literal longer than the largest script
 * allowed is read and thrown away when it is at most MS_DISCARD_MAX
 * bytes (answer NO (QUOTA/MAXSIZE)), else the connection ends with BYE;
 * an overlong line ends the connection with BYE (what followed it cannot
 * be told apart from a command).  A syntax error answers NO and skips
 * the rest of the command, literals included.  Nothing here exits the
 * process.
 *
 * Replies.  OK / NO / BYE with an optional response code in parentheses
 * and a human-readable string (quoted, or a literal when it holds a line
 * end or is long).
 *
 * State: not authenticated (CAPABILITY, STARTTLS, AUTHENTICATE, NOOP,
 * LOGOUT) -> authenticated (the script commands, UNAUTHENTICATE back).
 * Login names become internal user ids as in imapd (store/userid.h,
 * virtdomains); the user's scripts live in sievedir_user_path().
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "imapd/localdomain.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "lib/prot.h"
#include "lib/saslserver.h"
#include "lib/service.h"
#include "lib/strarray.h"
#include "sieve/sieve.h"
#include "store/mboxname.h"
#include "store/sievedir.h"
#include "store/store.h"
#include "store/userid.h"
#include "timsieved/managesieve.h"

#define MS_LINE_MAX     8192            /* one command line */
#define MS_QUOTED_MAX   1024            /* one quoted string (RFC 5804) */
#define MS_ARGS_MAX     8               /* words of one command */
#define MS_DISCARD_MAX  ((size_t)16 << 20) /* an oversized literal thrown
                                           away before the connection is
                                           given up */
#define MS_AUTH_MAX     65536           /* one AUTHENTICATE response */
#define MS_VERSION      "1.0"

struct managesieve_server {
    const struct imapconf *conf;
    struct tls_server *tls;
    int sasl_ok;
    int timeout;                 /* seconds, once authenticated */
    int prelogin_timeout;        /* seconds, before */
    size_t max_script;           /* bytes */
    long max_scripts;
    struct sieve_limits limits;
    struct strarray allowed;     /* extensions scripts may require */
    struct userid_policy policy;
};

enum ms_argtype { MS_ATOM, MS_STRING };

struct ms_arg {
    enum ms_argtype type;
    struct buf val;
};

struct ms_session {
    struct managesieve_server *srv;
    struct prot *p;
    const struct managesieve_conn *conn;
    struct saslserver *sasl;
    const char *canon_error;
    struct buf serverdomain;
    int serverdomain_known;
    char *userid;                /* NULL before authentication */
    struct buf dir;              /* the user's script directory */
    struct buf line;
    struct ms_arg args[MS_ARGS_MAX];
    size_t nargs;
    int quit;
    const char *end_reason;
};

/* ---- the server -------------------------------------------------------- */

int managesieve_server_new(const struct imapconf *conf,
                           struct tls_server *tls, int sasl_ok,
                           struct managesieve_server **srv_r)
{
    struct managesieve_server *srv;
    const char *err = NULL, *ext;
    long v;

    *srv_r = NULL;
    srv = calloc(1, sizeof(*srv));
    if (!srv) {
        log_error("timsieved: out of memory");
        return -1;
    }
    srv->conf = conf;
    srv->tls = tls;
    srv->sasl_ok = sasl_ok;
    v = imapconf_getint(conf, "timeout");
    srv->timeout = (int)((v > 0 ? v : 32) * 60);
    v = imapconf_getint(conf, "prelogin_timeout");
    srv->prelogin_timeout = (int)(v > 0 ? v : 60);
    v = imapconf_getint(conf, "sieve_maxscriptsize");
    srv->max_script = (size_t)(v > 0 ? v : 32) * 1024;
    v = imapconf_getint(conf, "sieve_maxscripts");
    srv->max_scripts = v > 0 ? v : 5;
    sieve_limits_default(&srv->limits);
    srv->limits.max_script_size = srv->max_script;
    ext = imapconf_getstring(conf, "sieve_extensions");
    if (ext && *ext) {
        struct strarray words = STRARRAY_INITIALIZER;

        if (strarray_split(&words, ext, " \t,") != 0) {
            free(srv);
            return -1;
        }
        for (size_t i = 0; i < words.count; i++) {
            if (!sieve_extension_supported(words.data[i]))
                log_warning("timsieved: unsupported Sieve extension "
                            "ignored key=<sieve_extensions> name=<%s>",
                            words.data[i]);
            else if (strarray_find(&srv->allowed, words.data[i]) < 0)
                strarray_append(&srv->allowed, words.data[i]);
        }
        strarray_fini(&words);
    } else {
        for (const char *const *e = sieve_extensions(); *e; e++)
            strarray_append(&srv->allowed, *e);
    }
    if (userid_policy_init(conf, &srv->policy, &err) != STORE_OK) {
        log_error("timsieved: bad configuration error=<%s>",
                  err ? err : "out of memory");
        strarray_fini(&srv->allowed);
        free(srv);
        return -1;
    }
    *srv_r = srv;
    return 0;
}

void managesieve_server_free(struct managesieve_server **srvp)
{
    struct managesieve_server *srv = *srvp;

    if (!srv)
        return;
    userid_policy_free(&srv->policy);
    strarray_fini(&srv->allowed);
    free(srv);
    *srvp = NULL;
}

/* ---- replies ------------------------------------------------------------ */

/* A string as RFC 5804 wants it: quoted when short and free of line
 * ends and NULs, else a literal. */
static void ms_string(struct prot *p, const char *s, size_t len)
{
    int quoted = len <= MS_QUOTED_MAX;

    for (size_t i = 0; quoted && i < len; i++)
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
            quoted = 0;
    if (!quoted) {
        prot_printf(p, "{%lu}\r\n", (unsigned long)len);
        prot_write(p, s, len);
        return;
    }
    prot_write(p, "\"", 1);
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '"' || s[i] == '\\')
            prot_write(p, "\\", 1);
        prot_write(p, s + i, 1);
    }
    prot_write(p, "\"", 1);
}

static void ms_cstring(struct prot *p, const char *s)
{
    ms_string(p, s, strlen(s));
}

/* "OK", "NO" or "BYE", an optional code (without parentheses) and a
 * text. */
static void ms_reply(struct ms_session *s, const char *status,
                     const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void ms_reply(struct ms_session *s, const char *status,
                     const char *code, const char *fmt, ...)
{
    struct buf text = BUF_INITIALIZER;
    va_list ap;

    prot_puts(s->p, status);
    if (code)
        prot_printf(s->p, " (%s)", code);
    if (fmt) {
        va_start(ap, fmt);
        buf_vprintf(&text, fmt, ap);
        va_end(ap);
        prot_puts(s->p, " ");
        ms_string(s->p, text.s ? text.s : "", text.len);
    }
    prot_puts(s->p, "\r\n");
    buf_free(&text);
}

static void ms_capabilities(struct ms_session *s)
{
    struct buf mechs = BUF_INITIALIZER;
    char *list;

    prot_puts(s->p, "\"IMPLEMENTATION\" \"cyrusdeliver\"\r\n");
    if (!s->userid) {
        if (s->sasl && saslserver_mechs(s->sasl, &mechs) != 0)
            buf_reset(&mechs);
        prot_puts(s->p, "\"SASL\" ");
        ms_string(s->p, mechs.s ? mechs.s : "", mechs.len);
        prot_puts(s->p, "\r\n");
    }
    list = strarray_join(&s->srv->allowed, " ");
    prot_puts(s->p, "\"SIEVE\" ");
    ms_cstring(s->p, list ? list : "");
    prot_puts(s->p, "\r\n");
    free(list);
    if (s->srv->tls && !prot_is_tls(s->p) && !s->userid)
        prot_puts(s->p, "\"STARTTLS\"\r\n");
    if (s->srv->limits.max_redirects)
        prot_printf(s->p, "\"MAXREDIRECTS\" \"%u\"\r\n",
                    s->srv->limits.max_redirects);
    if (s->userid) {
        prot_puts(s->p, "\"OWNER\" ");
        ms_cstring(s->p, s->userid);
        prot_puts(s->p, "\r\n");
    }
    prot_puts(s->p, "\"VERSION\" \"" MS_VERSION "\"\r\n");
    buf_free(&mechs);
}

/* ---- reading commands -------------------------------------------------- */

enum ms_read {
    MS_READ_OK = 0,
    MS_READ_SYNTAX = 1,     /* answered NO; go on with the next command */
    MS_READ_END = 2         /* the connection ends (BYE sent if useful) */
};

/* The end of the connection after a failed read r. */
static enum ms_read ms_read_failed(struct ms_session *s, int r)
{
    switch (r) {
    case PROT_TIMEOUT:
        ms_reply(s, "BYE", NULL, "Idle for too long");
        s->end_reason = "timeout";
        break;
    case PROT_INTERRUPTED:
        ms_reply(s, "BYE", NULL, "Server shutting down");
        s->end_reason = "shutdown";
        break;
    case PROT_TOOLONG:
        ms_reply(s, "BYE", NULL, "Line too long");
        s->end_reason = "line too long";
        break;
    case PROT_EOF:
        s->end_reason = "disconnected";
        break;
    default:
        s->end_reason = "I/O error";
        break;
    }
    s->quit = 1;
    return MS_READ_END;
}

/* A literal marker "{N}" or "{N+}" ending line[pos..len): its size into
 * *n_r.  1 when it is one, 0 when not. */
static int ms_literal_marker(const char *line, size_t pos, size_t len,
                             unsigned long long *n_r)
{
    unsigned long long n = 0;
    size_t i = pos + 1;

    if (pos >= len || line[pos] != '{' || line[len - 1] != '}')
        return 0;
    if (i >= len - 1 || line[i] < '0' || line[i] > '9')
        return 0;
    for (; i < len - 1 && line[i] >= '0' && line[i] <= '9'; i++) {
        if (n > (1ULL << 40))
            n = 1ULL << 41;     /* absurd: keep it absurd, no overflow */
        else
            n = n * 10 + (unsigned long long)(line[i] - '0');
    }
    if (i < len - 1 && line[i] == '+')
        i++;
    if (i != len - 1)
        return 0;
    *n_r = n;
    return 1;
}

/* Read a literal of n bytes into out, or throw it away (out NULL). */
static enum ms_read ms_literal(struct ms_session *s, unsigned long long n,
                               struct buf *out)
{
    int r = prot_read(s->p, out, (size_t)n);

    if (r != PROT_OK)
        return ms_read_failed(s, r);
    return MS_READ_OK;
}

/* After a syntax error in s->line: skip what belongs to the command
 * (literals announced at line ends and the lines after them). */
static enum ms_read ms_skip_command(struct ms_session *s)
{
    for (;;) {
        unsigned long long n;
        const char *ln = buf_cstring(&s->line);
        const char *brace = memrchr(ln, '{', s->line.len);
        int r;

        if (!brace || !ms_literal_marker(ln, (size_t)(brace - ln),
                                         s->line.len, &n))
            return MS_READ_OK;
        if (n > MS_DISCARD_MAX) {
            ms_reply(s, "BYE", NULL, "Literal too big");
            s->end_reason = "literal too big";
            s->quit = 1;
            return MS_READ_END;
        }
        if (ms_literal(s, n, NULL) != MS_READ_OK)
            return MS_READ_END;
        r = prot_getline(s->p, &s->line, MS_LINE_MAX, NULL);
        if (r != PROT_OK)
            return ms_read_failed(s, r);
    }
}

static enum ms_read ms_syntax(struct ms_session *s, const char *code,
                              const char *why)
{
    enum ms_read r = ms_skip_command(s);

    if (r != MS_READ_OK)
        return r;
    ms_reply(s, "NO", code, "%s", why);
    return MS_READ_SYNTAX;
}

static int ms_atom_char(unsigned char c)
{
    return c > 0x20 && c < 0x7f && c != '"' && c != '{' && c != '}' &&
           c != '(' && c != ')' && c != '\\';
}

/* One command into s->args (interruptible: the wait for it ends when
 * the master stops us; it is a command, not an AUTHENTICATE response:
 * its first word is an atom).  maxlit: the largest literal kept. */
static enum ms_read ms_read_command(struct ms_session *s, int interruptible,
                                    size_t maxlit)
{
    size_t pos = 0;
    int r;

    for (size_t i = 0; i < s->nargs; i++)
        buf_reset(&s->args[i].val);
    s->nargs = 0;
    if (interruptible)
        prot_set_interrupt(s->p, service_stopping);
    r = prot_getline(s->p, &s->line, MS_LINE_MAX, NULL);
    prot_set_interrupt(s->p, NULL);
    if (r != PROT_OK)
        return ms_read_failed(s, r);
    for (;;) {
        const char *ln = buf_cstring(&s->line);
        size_t len = s->line.len;
        struct ms_arg *a;
        unsigned long long n;

        while (pos < len && ln[pos] == ' ')
            pos++;
        if (pos == len)
            break;
        if (s->nargs == MS_ARGS_MAX)
            return ms_syntax(s, NULL, "Too many arguments");
        a = &s->args[s->nargs];
        buf_reset(&a->val);
        if (ln[pos] == '"') {
            a->type = MS_STRING;
            for (pos++; pos < len && ln[pos] != '"'; pos++) {
                if (ln[pos] == '\\') {
                    pos++;
                    if (pos == len || (ln[pos] != '\\' && ln[pos] != '"'))
                        return ms_syntax(s, NULL, "Invalid escape in a "
                                                  "quoted string");
                }
                if (ln[pos] == '\0')
                    return ms_syntax(s, NULL, "NUL in a quoted string");
                if (a->val.len >= MS_QUOTED_MAX)
                    return ms_syntax(s, NULL, "Quoted string too long "
                                              "(use a literal)");
                buf_putc(&a->val, ln[pos]);
            }
            if (pos == len)
                return ms_syntax(s, NULL, "Unterminated quoted string");
            pos++;
            if (pos < len && ln[pos] != ' ')
                return ms_syntax(s, NULL, "Missing space after a string");
            buf_cstring(&a->val);
            s->nargs++;
        } else if (ln[pos] == '{') {
            if (!ms_literal_marker(ln, pos, len, &n))
                return ms_syntax(s, NULL, "Invalid literal");
            a->type = MS_STRING;
            if (n > maxlit) {
                if (n > MS_DISCARD_MAX) {
                    ms_reply(s, "BYE", "QUOTA/MAXSIZE", "Literal too big");
                    s->end_reason = "literal too big";
                    s->quit = 1;
                    return MS_READ_END;
                }
                return ms_syntax(s, "QUOTA/MAXSIZE", "Literal too big");
            }
            if (ms_literal(s, n, &a->val) != MS_READ_OK)
                return MS_READ_END;
            buf_cstring(&a->val);
            s->nargs++;
            r = prot_getline(s->p, &s->line, MS_LINE_MAX, NULL);
            if (r != PROT_OK)
                return ms_read_failed(s, r);
            pos = 0;
            if (s->line.len && s->line.s[0] != ' ')
                return ms_syntax(s, NULL, "Missing space after a literal");
        } else {
            size_t start = pos;

            while (pos < len && ms_atom_char((unsigned char)ln[pos]))
                pos++;
            if (pos == start || (pos < len && ln[pos] != ' '))
                return ms_syntax(s, NULL, "Invalid character in an atom");
            a->type = MS_ATOM;
            buf_setmap(&a->val, ln + start, pos - start);
            s->nargs++;
        }
    }
    if (s->nargs == 0)
        return ms_syntax(s, NULL, "Empty command");
    if (interruptible && s->args[0].type != MS_ATOM)
        return ms_syntax(s, NULL, "A command starts with its name");
    return MS_READ_OK;
}

/* The arguments after the name: exactly `min` to `max` strings. */
static int ms_want_strings(struct ms_session *s, size_t min, size_t max)
{
    size_t n = s->nargs - 1;

    if (n < min || n > max) {
        ms_reply(s, "NO", NULL, "Wrong number of arguments");
        return -1;
    }
    for (size_t i = 1; i < s->nargs; i++)
        if (s->args[i].type != MS_STRING) {
            ms_reply(s, "NO", NULL, "Argument %lu must be a string",
                     (unsigned long)i);
            return -1;
        }
    return 0;
}

static const char *ms_arg(struct ms_session *s, size_t i)
{
    return buf_cstring(&s->args[i].val);
}

/* A script name argument: valid, else NO. */
static int ms_name_ok(struct ms_session *s, size_t i)
{
    if (!sievedir_name_valid(s->args[i].val.s, s->args[i].val.len) ||
        memchr(s->args[i].val.s, '\0', s->args[i].val.len)) {
        ms_reply(s, "NO", NULL, "Invalid script name");
        return 0;
    }
    return 1;
}

/* ---- authentication ---------------------------------------------------- */

static const char *ms_serverdomain(struct ms_session *s)
{
    if (!s->serverdomain_known) {
        struct buf raw = BUF_INITIALIZER;
        const char *err = NULL;

        s->serverdomain_known = 1;
        buf_reset(&s->serverdomain);
        if (s->conn->fd >= 0 && localdomain_lookup(s->conn->fd, &raw) == 0
            && mboxname_domain_check(raw.s, raw.len, &s->serverdomain,
                                     &err) != STORE_OK)
            buf_reset(&s->serverdomain);
        buf_free(&raw);
    }
    return s->serverdomain.len ? buf_cstring(&s->serverdomain) : NULL;
}

/* SASL's canon function: the login name becomes the internal user id
 * before the password check (as imapd's).  A name that is no valid user
 * id is noted in s->canon_error and passed on unchanged: the login is
 * then refused whatever SASL says. */
static const char *ms_sasl_serverdomain(void *rock)
{
    return ms_serverdomain(rock);
}

static int ms_sasl_canon(void *rock, const char *in, size_t len,
                         struct buf *out, const char **error_r)
{
    struct ms_session *s = rock;

    return userid_canon_login(&s->srv->policy, in, len,
                              ms_sasl_serverdomain, s, out,
                              &s->canon_error, error_r);
}

static void ms_sasl_reset(struct ms_session *s)
{
    saslserver_free(&s->sasl);
    if (s->srv->sasl_ok)
        s->sasl = saslserver_new_canon("sieve", s->conn->localaddr,
                                       s->conn->remoteaddr,
                                       prot_tls_ssf(s->p), ms_sasl_canon,
                                       s);
}

static int ms_login(struct ms_session *s, const char *user, const char *mech)
{
    int r;

    r = sievedir_user_path(s->srv->conf, user, &s->dir);
    if (r != SIEVEDIR_OK) {
        log_warning("timsieved: no script directory for the user "
                    "user=<%s> error=<%s>", user, sievedir_strerror(r));
        return -1;
    }
    s->userid = strdup(user);
    if (!s->userid)
        return -1;
    prot_settimeout(s->p, s->srv->timeout);
    log_info("timsieved: login user=<%s> mech=<%s> peer=<%s> tls=<%s>",
             s->userid, mech, s->conn->peer,
             prot_tls_info(s->p) ? prot_tls_info(s->p) : "none");
    return 0;
}

static void ms_cmd_authenticate(struct ms_session *s)
{
    struct buf chal = BUF_INITIALIZER, mech = BUF_INITIALIZER;
    const char *init = NULL;
    int r;

    if (ms_want_strings(s, 1, 2) != 0)
        return;
    if (s->userid) {
        ms_reply(s, "NO", NULL, "Already authenticated");
        return;
    }
    if (!s->sasl) {
        ms_reply(s, "NO", "TRANSITION-NEEDED", "Authentication not "
                 "available");
        return;
    }
    buf_setcstr(&mech, ms_arg(s, 1));
    if (s->nargs == 3)
        init = s->args[2].val.len ? ms_arg(s, 2) : "=";
    s->canon_error = NULL;
    r = saslserver_start(s->sasl, buf_cstring(&mech), init, &chal);
    while (r == SASLSERVER_CONTINUE) {
        enum ms_read rr;

        ms_string(s->p, chal.s ? chal.s : "", chal.len);
        prot_puts(s->p, "\r\n");
        if (prot_flush(s->p) != PROT_OK) {
            s->quit = 1;
            goto out;
        }
        rr = ms_read_command(s, 0, MS_AUTH_MAX);
        if (rr == MS_READ_END)
            goto out;
        if (rr == MS_READ_SYNTAX) {
            ms_sasl_reset(s);
            goto out;
        }
        /* the response is one string; a bare "*" atom cancels too */
        if (s->nargs != 1 ||
            memchr(s->args[0].val.s, '\0', s->args[0].val.len)) {
            r = SASLSERVER_BADB64;
            break;
        }
        r = saslserver_step(s->sasl, ms_arg(s, 0), &chal);
    }
    if (r == SASLSERVER_DONE && !s->canon_error && saslserver_user(s->sasl)) {
        if (ms_login(s, saslserver_user(s->sasl), buf_cstring(&mech)) != 0) {
            ms_reply(s, "NO", "TRYLATER", "Cannot log in now");
            ms_sasl_reset(s);
        } else {
            ms_reply(s, "OK", NULL, "Logged in");
        }
        goto out;
    }
    switch (r) {
    case SASLSERVER_DONE:
    case SASLSERVER_FAIL:
        if (s->canon_error)
            ms_reply(s, "NO", NULL, "Invalid user name: %s",
                     s->canon_error);
        else
            ms_reply(s, "NO", NULL, "Authentication failed");
        break;
    case SASLSERVER_NOMECH:
        if (prot_is_tls(s->p))
            ms_reply(s, "NO", NULL, "Mechanism not available");
        else
            ms_reply(s, "NO", "ENCRYPT-NEEDED", "Mechanism not available "
                     "without TLS");
        break;
    case SASLSERVER_BADB64:
        ms_reply(s, "NO", NULL, "Cannot decode the response");
        break;
    case SASLSERVER_CANCEL:
        ms_reply(s, "NO", NULL, "Authentication cancelled");
        break;
    default:
        ms_reply(s, "NO", "TRYLATER", "Temporary authentication failure");
        break;
    }
    log_info("timsieved: authentication failed mech=<%s> peer=<%s> "
             "error=<%s%s>", buf_cstring(&mech), s->conn->peer,
             s->canon_error ? "invalid user name: " : "",
             s->canon_error ? s->canon_error :
             saslserver_error(s->sasl) ? saslserver_error(s->sasl) : "");
    ms_sasl_reset(s);
out:
    buf_free(&chal);
    buf_free(&mech);
}

static void ms_cmd_starttls(struct ms_session *s)
{
    size_t discarded = 0;

    if (s->nargs != 1) {
        ms_reply(s, "NO", NULL, "STARTTLS takes no arguments");
        return;
    }
    if (!s->srv->tls) {
        ms_reply(s, "NO", NULL, "STARTTLS not available");
        return;
    }
    if (prot_is_tls(s->p) || s->userid) {
        ms_reply(s, "NO", NULL, "TLS not allowed now");
        return;
    }
    ms_reply(s, "OK", NULL, "Begin TLS negotiation now");
    if (prot_starttls(s->p, s->srv->tls, &discarded) != PROT_OK) {
        log_info("timsieved: TLS handshake failed peer=<%s> error=<%s>",
                 s->conn->peer, prot_error(s->p));
        s->end_reason = "TLS handshake failed";
        s->quit = 1;
        return;
    }
    if (discarded)
        log_warning("timsieved: bytes sent before the TLS handshake "
                    "discarded peer=<%s> bytes=<%lu>", s->conn->peer,
                    (unsigned long)discarded);
    ms_sasl_reset(s);
    /* RFC 5804 2.2: the capabilities again, then OK */
    ms_capabilities(s);
    ms_reply(s, "OK", NULL, "TLS active");
}

/* ---- scripts ---------------------------------------------------------- */

static void ms_store_error(struct ms_session *s, const char *what, int r)
{
    switch (r) {
    case SIEVEDIR_NOTFOUND:
        ms_reply(s, "NO", "NONEXISTENT", "There is no such script");
        break;
    case SIEVEDIR_EXISTS:
        ms_reply(s, "NO", "ALREADYEXISTS", "A script of that name exists");
        break;
    case SIEVEDIR_ACTIVE:
        ms_reply(s, "NO", "ACTIVE", "The script is active");
        break;
    case SIEVEDIR_BADNAME:
        ms_reply(s, "NO", NULL, "Invalid script name");
        break;
    default:
        log_error("timsieved: %s failed user=<%s> dir=<%s> error=<%s: %s>",
                  what, s->userid, buf_cstring(&s->dir),
                  sievedir_strerror(r), strerror(errno));
        ms_reply(s, "NO", "TRYLATER", "Server error, try again later");
        break;
    }
}

/* Would one more script named `name` pass sieve_maxscripts?  1 yes, 0 no
 * (NO sent), -1 error (NO sent). */
static int ms_room_for(struct ms_session *s, const char *name)
{
    struct buf path = BUF_INITIALIZER;
    long n;
    int exists;

    if (sievedir_script_path(buf_cstring(&s->dir), name, &path) !=
        SIEVEDIR_OK) {
        buf_free(&path);
        ms_reply(s, "NO", NULL, "Invalid script name");
        return -1;
    }
    exists = access(buf_cstring(&path), F_OK) == 0;
    buf_free(&path);
    if (exists)
        return 1;
    n = sievedir_count(buf_cstring(&s->dir));
    if (n < 0) {
        ms_store_error(s, "count", (int)n);
        return -1;
    }
    if (n >= s->srv->max_scripts) {
        ms_reply(s, "NO", "QUOTA/MAXSCRIPTS", "Too many scripts (at most "
                 "%ld)", s->srv->max_scripts);
        return 0;
    }
    return 1;
}

/* Compile the script text; NO with the reason when it is not valid.
 * script_r (may be NULL): the compiled script on success. */
static int ms_compile_ok(struct ms_session *s, const struct buf *text,
                         struct sieve_script **script_r)
{
    struct sieve_script *script = NULL;
    struct buf err = BUF_INITIALIZER;
    int r;

    r = sieve_compile(text->s ? text->s : "", text->len, &s->srv->limits,
                      &s->srv->allowed, &script, &err);
    if (script_r)
        *script_r = script;
    else
        sieve_script_free(&script);
    if (r == SIEVE_OK) {
        buf_free(&err);
        return 1;
    }
    if (r == SIEVE_ENOMEM)
        ms_reply(s, "NO", "TRYLATER", "Out of memory");
    else if (r == SIEVE_ELIMIT && text->len > s->srv->max_script)
        ms_reply(s, "NO", "QUOTA/MAXSIZE", "Script too big");
    else
        ms_reply(s, "NO", NULL, "%s", err.len ? buf_cstring(&err)
                                              : sieve_strerror(r));
    buf_free(&err);
    return 0;
}

static void ms_cmd_havespace(struct ms_session *s)
{
    const char *num;
    unsigned long long size = 0;

    if (s->nargs != 3 || s->args[1].type != MS_STRING ||
        s->args[2].type != MS_ATOM) {
        ms_reply(s, "NO", NULL, "HAVESPACE takes a name and a number");
        return;
    }
    num = ms_arg(s, 2);
    for (const char *c = num; *c; c++) {
        if (*c < '0' || *c > '9' || size > 0xffffffffULL) {
            ms_reply(s, "NO", NULL, "Invalid number");
            return;
        }
        size = size * 10 + (unsigned long long)(*c - '0');
    }
    if (!ms_name_ok(s, 1))
        return;
    if (size > s->srv->max_script) {
        ms_reply(s, "NO", "QUOTA/MAXSIZE", "Script too big (at most %lu "
                 "bytes)", (unsigned long)s->srv->max_script);
        return;
    }
    if (ms_room_for(s, ms_arg(s, 1)) == 1)
        ms_reply(s, "OK", NULL, NULL);
}

/* Store the compiled form of script `name` beside it (NAME.bc), durable
 * as the script is; a failure is logged, not answered (lmtpd compiles
 * the text when the compiled form is missing or stale). */
static void ms_store_bc(struct ms_session *s, const char *name,
                        const struct sieve_script *script, const char *text,
                        size_t len)
{
    int r = sievedir_store_bc(buf_cstring(&s->dir), name, script, text, len,
                              &s->srv->allowed, NULL, 1);

    if (r != SIEVEDIR_OK)
        log_warning("timsieved: compiled script not stored user=<%s> "
                    "name=<%s> error=<%s: %s>", s->userid, name,
                    sievedir_strerror(r), strerror(errno));
}

static void ms_cmd_putscript(struct ms_session *s)
{
    struct sieve_script *script = NULL;
    const char *name;
    int r;

    if (ms_want_strings(s, 2, 2) != 0 || !ms_name_ok(s, 1))
        return;
    name = ms_arg(s, 1);
    if (s->args[2].val.len > s->srv->max_script) {
        ms_reply(s, "NO", "QUOTA/MAXSIZE", "Script too big (at most %lu "
                 "bytes)", (unsigned long)s->srv->max_script);
        return;
    }
    if (!ms_compile_ok(s, &s->args[2].val, &script))
        return;
    if (ms_room_for(s, name) != 1) {
        sieve_script_free(&script);
        return;
    }
    r = sievedir_put(buf_cstring(&s->dir), name, s->args[2].val.s,
                     s->args[2].val.len);
    if (r != SIEVEDIR_OK) {
        sieve_script_free(&script);
        ms_store_error(s, "putscript", r);
        return;
    }
    ms_store_bc(s, name, script, s->args[2].val.s, s->args[2].val.len);
    sieve_script_free(&script);
    log_info("timsieved: script stored user=<%s> name=<%s> size=<%lu>",
             s->userid, name, (unsigned long)s->args[2].val.len);
    ms_reply(s, "OK", NULL, NULL);
}

static void ms_cmd_checkscript(struct ms_session *s)
{
    if (ms_want_strings(s, 1, 1) != 0)
        return;
    if (s->args[1].val.len > s->srv->max_script) {
        ms_reply(s, "NO", "QUOTA/MAXSIZE", "Script too big");
        return;
    }
    if (ms_compile_ok(s, &s->args[1].val, NULL))
        ms_reply(s, "OK", NULL, NULL);
}

static void ms_cmd_listscripts(struct ms_session *s)
{
    struct strarray names = STRARRAY_INITIALIZER;
    struct buf active = BUF_INITIALIZER;
    int r;

    if (s->nargs != 1) {
        ms_reply(s, "NO", NULL, "LISTSCRIPTS takes no arguments");
        return;
    }
    r = sievedir_list(buf_cstring(&s->dir), &names, &active);
    if (r != SIEVEDIR_OK) {
        ms_store_error(s, "listscripts", r);
    } else {
        for (size_t i = 0; i < names.count; i++) {
            ms_cstring(s->p, names.data[i]);
            if (active.len &&
                strcmp(names.data[i], buf_cstring(&active)) == 0)
                prot_puts(s->p, " ACTIVE");
            prot_puts(s->p, "\r\n");
        }
        ms_reply(s, "OK", NULL, NULL);
    }
    strarray_fini(&names);
    buf_free(&active);
}

static void ms_cmd_setactive(struct ms_session *s)
{
    const char *name;
    int r;

    if (ms_want_strings(s, 1, 1) != 0)
        return;
    name = ms_arg(s, 1);
    if (*name && !ms_name_ok(s, 1))
        return;
    r = sievedir_activate(buf_cstring(&s->dir), name);
    if (r != SIEVEDIR_OK) {
        ms_store_error(s, "setactive", r);
        return;
    }
    /* scripts stored before there was a compiled form, or changed
     * behind our back: the compiled form of the one to run is current */
    if (*name && (r = sievedir_ensure_bc(buf_cstring(&s->dir), name,
                                         &s->srv->limits, &s->srv->allowed,
                                         1, NULL, NULL)) != SIEVEDIR_OK)
        log_warning("timsieved: compiled script not stored user=<%s> "
                    "name=<%s> error=<%s>", s->userid, name,
                    sievedir_strerror(r));
    log_info("timsieved: active script set user=<%s> name=<%s>",
             s->userid, *name ? name : "(none)");
    ms_reply(s, "OK", NULL, NULL);
}

static void ms_cmd_getscript(struct ms_session *s)
{
    struct buf text = BUF_INITIALIZER;
    int r;

    if (ms_want_strings(s, 1, 1) != 0 || !ms_name_ok(s, 1))
        return;
    r = sievedir_get(buf_cstring(&s->dir), ms_arg(s, 1), 0, &text);
    if (r != SIEVEDIR_OK) {
        ms_store_error(s, "getscript", r);
    } else {
        prot_printf(s->p, "{%lu}\r\n", (unsigned long)text.len);
        prot_write(s->p, text.s ? text.s : "", text.len);
        prot_puts(s->p, "\r\n");
        ms_reply(s, "OK", NULL, NULL);
    }
    buf_free(&text);
}

static void ms_cmd_deletescript(struct ms_session *s)
{
    int r;

    if (ms_want_strings(s, 1, 1) != 0 || !ms_name_ok(s, 1))
        return;
    r = sievedir_delete(buf_cstring(&s->dir), ms_arg(s, 1));
    if (r != SIEVEDIR_OK) {
        ms_store_error(s, "deletescript", r);
        return;
    }
    log_info("timsieved: script deleted user=<%s> name=<%s>", s->userid,
             ms_arg(s, 1));
    ms_reply(s, "OK", NULL, NULL);
}

static void ms_cmd_renamescript(struct ms_session *s)
{
    int r;

    if (ms_want_strings(s, 2, 2) != 0 || !ms_name_ok(s, 1) ||
        !ms_name_ok(s, 2))
        return;
    r = sievedir_rename(buf_cstring(&s->dir), ms_arg(s, 1), ms_arg(s, 2));
    if (r != SIEVEDIR_OK) {
        ms_store_error(s, "renamescript", r);
        return;
    }
    log_info("timsieved: script renamed user=<%s> name=<%s> new=<%s>",
             s->userid, ms_arg(s, 1), ms_arg(s, 2));
    ms_reply(s, "OK", NULL, NULL);
}

static void ms_cmd_noop(struct ms_session *s)
{
    if (ms_want_strings(s, 0, 1) != 0)
        return;
    if (s->nargs == 2) {
        prot_puts(s->p, "OK (TAG ");
        ms_string(s->p, s->args[1].val.s, s->args[1].val.len);
        prot_puts(s->p, ") \"Done\"\r\n");
    } else {
        ms_reply(s, "OK", NULL, "Done");
    }
}

static void ms_cmd_unauthenticate(struct ms_session *s)
{
    if (s->nargs != 1) {
        ms_reply(s, "NO", NULL, "UNAUTHENTICATE takes no arguments");
        return;
    }
    log_info("timsieved: unauthenticate user=<%s> peer=<%s>", s->userid,
             s->conn->peer);
    free(s->userid);
    s->userid = NULL;
    buf_reset(&s->dir);
    prot_settimeout(s->p, s->srv->prelogin_timeout);
    ms_sasl_reset(s);
    ms_reply(s, "OK", NULL, NULL);
}

/* ---- the command table ------------------------------------------------ */

struct ms_command {
    const char *name;
    int auth;                    /* 1: authenticated state only */
    void (*fn)(struct ms_session *s);
};

static void ms_cmd_capability(struct ms_session *s)
{
    if (s->nargs != 1) {
        ms_reply(s, "NO", NULL, "CAPABILITY takes no arguments");
        return;
    }
    ms_capabilities(s);
    ms_reply(s, "OK", NULL, NULL);
}

static void ms_cmd_logout(struct ms_session *s)
{
    ms_reply(s, "OK", NULL, "Logout complete");
    s->end_reason = "logout";
    s->quit = 1;
}

static const struct ms_command ms_commands[] = {
    { "CAPABILITY", 0, ms_cmd_capability },
    { "STARTTLS", 0, ms_cmd_starttls },
    { "AUTHENTICATE", 0, ms_cmd_authenticate },
    { "LOGOUT", 0, ms_cmd_logout },
    { "NOOP", 0, ms_cmd_noop },
    { "HAVESPACE", 1, ms_cmd_havespace },
    { "PUTSCRIPT", 1, ms_cmd_putscript },
    { "CHECKSCRIPT", 1, ms_cmd_checkscript },
    { "LISTSCRIPTS", 1, ms_cmd_listscripts },
    { "SETACTIVE", 1, ms_cmd_setactive },
    { "GETSCRIPT", 1, ms_cmd_getscript },
    { "DELETESCRIPT", 1, ms_cmd_deletescript },
    { "RENAMESCRIPT", 1, ms_cmd_renamescript },
    { "UNAUTHENTICATE", 1, ms_cmd_unauthenticate },
};

static void ms_dispatch(struct ms_session *s)
{
    const char *name = ms_arg(s, 0);

    for (size_t i = 0; i < sizeof(ms_commands) / sizeof(ms_commands[0]);
         i++) {
        if (strcasecmp(name, ms_commands[i].name) != 0)
            continue;
        if (ms_commands[i].auth && !s->userid) {
            ms_reply(s, "NO", NULL, "Authenticate first");
            return;
        }
        ms_commands[i].fn(s);
        return;
    }
    ms_reply(s, "NO", NULL, "Unknown command");
}

void managesieve_serve(struct managesieve_server *srv, struct prot *p,
                       const struct managesieve_conn *conn)
{
    struct ms_session s;

    memset(&s, 0, sizeof(s));
    s.srv = srv;
    s.p = p;
    s.conn = conn;
    prot_settimeout(p, srv->prelogin_timeout);
    ms_sasl_reset(&s);
    log_info("timsieved: connect peer=<%s>", conn->peer);
    ms_capabilities(&s);
    ms_reply(&s, "OK", NULL, "cyrusdeliver ManageSieve ready");
    while (!s.quit) {
        if (prot_flush(p) != PROT_OK) {
            s.end_reason = "I/O error";
            break;
        }
        if (service_stopping()) {
            ms_reply(&s, "BYE", NULL, "Server shutting down");
            s.end_reason = "shutdown";
            break;
        }
        /* a script literal may be a little larger than the limit: the
         * command answers QUOTA/MAXSIZE itself */
        if (ms_read_command(&s, 1, s.userid ? srv->max_script + 1
                                            : MS_AUTH_MAX) != MS_READ_OK)
            continue;
        ms_dispatch(&s);
    }
    prot_flush(p);
    log_info("timsieved: disconnect peer=<%s> user=<%s> reason=<%s>",
             conn->peer, s.userid ? s.userid : "", s.end_reason ?
             s.end_reason : "closed");
    saslserver_free(&s.sasl);
    free(s.userid);
    buf_free(&s.dir);
    buf_free(&s.line);
    buf_free(&s.serverdomain);
    for (size_t i = 0; i < MS_ARGS_MAX; i++)
        buf_free(&s.args[i].val);
}
