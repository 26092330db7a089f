/*
 * session.c - the IMAP session engine: one connection from the greeting
 * to LOGOUT, over a struct prot, with commands read by imapparse.c.
 *
 * States (RFC 3501 section 3): not authenticated -> authenticated (LOGIN,
 * AUTHENTICATE) -> selected (SELECT, EXAMINE) -> logout.
 *
 * Implemented:
 *   any state      CAPABILITY, NOOP, LOGOUT, ID
 *   not authent.   STARTTLS (state and SASL reset after the handshake),
 *                  AUTHENTICATE (Cyrus SASL, SASL-IR), LOGIN (checked
 *                  through SASL PLAIN; refused with NO [PRIVACYREQUIRED]
 *                  without TLS unless allowplaintext: yes)
 *   authenticated  ENABLE (CONDSTORE), NAMESPACE, IDLE (waits for DONE),
 *                  LIST, LSUB, CREATE, DELETE, RENAME, SUBSCRIBE,
 *                  UNSUBSCRIBE, STATUS, SELECT, EXAMINE (FLAGS, EXISTS,
 *                  RECENT 0, UNSEEN, PERMANENTFLAGS, UIDVALIDITY, UIDNEXT,
 *                  HIGHESTMODSEQ; READ-WRITE / READ-ONLY)
 *   selected       CHECK, CLOSE (expunges \Deleted messages when
 *                  read-write and the user has e), UNSELECT
 * Answered "NO [CANNOT] ... not implemented yet": APPEND (a synchronizing
 * APPEND literal is refused before the client sends it; a LITERAL+ one is
 * read and dropped first), and in the selected state EXPUNGE, SEARCH,
 * FETCH, STORE, COPY, MOVE and their UID forms.  Outside the selected
 * state those answer "BAD No mailbox selected".  No untagged EXISTS /
 * EXPUNGE / FETCH updates are sent yet: NOOP and IDLE only answer.
 *
 * Names.  The client sees the user's own mailboxes as INBOX and
 * INBOX<sep>child ("user.U" and "user.U.child" inside), other users'
 * mailboxes as "user<sep>V..." and shared ones as they are; <sep> is '.'
 * or, with unixhierarchysep, '/' (store/mboxname.h converts).  A login
 * name holding '.' is '^' in mailbox names, as in Cyrus.
 *
 * Access.  Every mailbox operation looks the mailbox up and asks
 * acl_rights() with imapd.conf's `admins`: a mailbox without the l right
 * is reported as nonexistent (no leak of its existence); CREATE needs k
 * on the nearest existing ancestor (or a name below the user's own
 * INBOX when no ancestor exists), and the new mailbox inherits that
 * ancestor's ACL; DELETE needs x; RENAME needs x on the old name and
 * CREATE's right for the new one; STATUS needs r.  Admins pass every
 * check.
 *
 * Limits.  Command lines, literals and commands are bounded by the
 * parser (64 KiB line, 64 KiB literal, 1 MiB command); an oversized
 * synchronizing literal is refused before the client sends it.  The
 * autologout is imapd.conf's `timeout` (minutes).  SIGTERM (the master
 * stopping) is noticed while waiting for a command: "* BYE Server
 * shutting down".
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "imapd/imapparse.h"
#include "imapd/session.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/prot.h"
#include "lib/saslserver.h"
#include "lib/service.h"
#include "lib/strarray.h"
#include "store/acl.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/store.h"
#include "store/subs.h"

#define IMAP_AUTH_LINE_MAX 65536   /* one AUTHENTICATE response line */
#define IMAP_IDLE_LINE_MAX 1024    /* the line ending IDLE */
#define IMAP_DEFAULT_TIMEOUT 30    /* minutes, when the key is unset */

struct imap_server {
    const struct imapconf *conf;
    struct tls_server *tls;
    int sasl_ok;
    struct mboxlist *ml;         /* NULL until it opens */
    char servername[256];
    int timeout;                 /* seconds */
    int unixsep;
    char sep;
    int allowplaintext;
    const char *admins;
};

enum imap_state { IMAP_NOTAUTH = 0, IMAP_AUTH = 1, IMAP_SELECTED = 2 };

struct imap_session {
    struct imap_server *srv;
    struct prot *p;
    const struct imap_conn *conn;
    struct saslserver *sasl;
    enum imap_state state;
    char *userid;                /* after LOGIN / AUTHENTICATE */
    struct buf inbox;            /* "user.U" (empty when U cannot own one) */
    int admin;
    int condstore;               /* ENABLE CONDSTORE */
    struct mailbox *sel;         /* the selected mailbox (no lock held
                                    between commands) */
    int sel_readonly;            /* EXAMINE, or no write rights */
    int sel_rights;
    int quit;
    int append_refused;          /* the continuation callback refused an
                                    APPEND literal: answer NO */
    struct imapparse_cmd cmd;
    struct imapparse_options opts;
    struct buf line;
};

/* ---- server ---------------------------------------------------------- */

int imap_server_new(const struct imapconf *conf, struct tls_server *tls,
                    int sasl_ok, struct imap_server **srv_r)
{
    struct imap_server *srv;
    const char *name;
    long v;
    int r;

    *srv_r = NULL;
    srv = calloc(1, sizeof(*srv));
    if (!srv) {
        log_error("imap: out of memory");
        return -1;
    }
    srv->conf = conf;
    srv->tls = tls;
    srv->sasl_ok = sasl_ok;
    name = imapconf_getstring(conf, "servername");
    if (name && *name) {
        snprintf(srv->servername, sizeof(srv->servername), "%s", name);
    } else if (gethostname(srv->servername, sizeof(srv->servername) - 1) != 0
               || !srv->servername[0]) {
        snprintf(srv->servername, sizeof(srv->servername), "localhost");
    }
    srv->servername[sizeof(srv->servername) - 1] = '\0';
    v = imapconf_getint(conf, "timeout");
    srv->timeout = (int)((v > 0 ? v : IMAP_DEFAULT_TIMEOUT) * 60);
    srv->unixsep = imapconf_getswitch(conf, "unixhierarchysep");
    srv->sep = srv->unixsep ? '/' : '.';
    srv->allowplaintext = imapconf_getswitch(conf, "allowplaintext");
    srv->admins = imapconf_getstring(conf, "admins");
    r = mboxlist_open(conf, &srv->ml);
    if (r != STORE_OK) {
        log_error("imap: cannot open the mailbox list error=<%s> "
                  "(retried at the next command)", store_strerror(r));
        srv->ml = NULL;
    }
    *srv_r = srv;
    return 0;
}

void imap_server_free(struct imap_server **srvp)
{
    struct imap_server *srv = srvp ? *srvp : NULL;

    if (!srv)
        return;
    mboxlist_close(&srv->ml);
    free(srv);
    *srvp = NULL;
}

/* The mailbox list, opening it when an earlier open failed. */
static struct mboxlist *imap_ml(struct imap_server *srv)
{
    if (!srv->ml) {
        int r = mboxlist_open(srv->conf, &srv->ml);

        if (r != STORE_OK) {
            log_error("imap: cannot open the mailbox list error=<%s>",
                      store_strerror(r));
            srv->ml = NULL;
        }
    }
    return srv->ml;
}

/* ---- replies --------------------------------------------------------- */

static const char *imap_tag(const struct imap_session *s)
{
    return s->cmd.tag ? s->cmd.tag : "*";
}

static void imap_tagged(struct imap_session *s, const char *status,
                        const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void imap_tagged(struct imap_session *s, const char *status,
                        const char *fmt, ...)
{
    struct buf b = BUF_INITIALIZER;
    va_list ap;

    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    prot_printf(s->p, "%s %s %s\r\n", imap_tag(s), status,
                b.s ? buf_cstring(&b) : "");
    buf_free(&b);
}

/* A quoted string (names are printable US-ASCII by mboxname_check). */
static void imap_quoted(struct prot *p, const char *str)
{
    prot_puts(p, "\"");
    for (; *str; str++) {
        if (*str == '"' || *str == '\\')
            prot_puts(p, "\\");
        prot_write(p, str, 1);
    }
    prot_puts(p, "\"");
}

/* The NO for a store error. */
static void imap_store_no(struct imap_session *s, int r)
{
    const char *code;

    switch (r) {
    case STORE_NOTFOUND: code = "[NONEXISTENT] "; break;
    case STORE_EXISTS: code = "[ALREADYEXISTS] "; break;
    case STORE_BADNAME: code = "[CANNOT] "; break;
    case STORE_PERMISSION: code = "[NOPERM] "; break;
    case STORE_OVERQUOTA: code = "[OVERQUOTA] "; break;
    case STORE_NOTIMPLEMENTED: code = "[CANNOT] "; break;
    case STORE_INTERNAL: code = "[SERVERBUG] "; break;
    default: code = "[UNAVAILABLE] "; break;
    }
    imap_tagged(s, "NO", "%s%s", code, store_strerror(r));
}

static void imap_capabilities(struct imap_session *s, struct buf *out)
{
    struct buf mechs = BUF_INITIALIZER;

    buf_reset(out);
    buf_appendcstr(out, "IMAP4rev1 LITERAL+ SASL-IR ID ENABLE NAMESPACE "
                        "IDLE UIDPLUS MOVE CONDSTORE");
    if (s->state == IMAP_NOTAUTH) {
        if (s->srv->tls && !prot_is_tls(s->p))
            buf_appendcstr(out, " STARTTLS");
        if (s->sasl && saslserver_mechs(s->sasl, &mechs) == 0 && mechs.len) {
            struct strarray words = STRARRAY_INITIALIZER;

            strarray_split(&words, buf_cstring(&mechs), " ");
            for (size_t i = 0; i < words.count; i++)
                buf_printf(out, " AUTH=%s", words.data[i]);
            strarray_fini(&words);
        }
        if (!prot_is_tls(s->p) && !s->srv->allowplaintext)
            buf_appendcstr(out, " LOGINDISABLED");
    }
    buf_free(&mechs);
}

/* ---- names ----------------------------------------------------------- */

/* Client name -> internal name into out.  STORE_OK or STORE_BADNAME with
 * *err_r. */
static int imap_to_internal(struct imap_session *s, const char *ext,
                            struct buf *out, const char **err_r)
{
    char sep = s->srv->sep;
    struct buf tmp = BUF_INITIALIZER;
    int r;

    *err_r = NULL;
    buf_reset(out);
    if (strncasecmp(ext, "INBOX", 5) == 0 &&
        (ext[5] == '\0' || ext[5] == sep)) {
        if (!s->inbox.len) {
            *err_r = "this login has no INBOX";
            return STORE_BADNAME;
        }
        buf_setcstr(out, buf_cstring(&s->inbox));
        if (ext[5] == '\0')
            return STORE_OK;
        r = mboxname_to_internal(ext + 6, s->srv->unixsep, &tmp, err_r);
        if (r == STORE_OK) {
            buf_putc(out, '.');
            buf_append(out, tmp.s, tmp.len);
            r = mboxname_check(buf_cstring(out), err_r);
        }
        buf_free(&tmp);
        if (r != STORE_OK)
            buf_reset(out);
        return r;
    }
    return mboxname_to_internal(ext, s->srv->unixsep, out, err_r);
}

/* Internal name -> client name into out.  STORE_OK or STORE_BADNAME. */
static int imap_to_external(struct imap_session *s, const char *name,
                            struct buf *out)
{
    size_t il = s->inbox.len;

    buf_reset(out);
    if (il && mboxname_is_self_or_child(buf_cstring(&s->inbox), name)) {
        struct buf tmp = BUF_INITIALIZER;
        int r;

        buf_setcstr(out, "INBOX");
        if (name[il] == '\0')
            return STORE_OK;
        r = mboxname_to_external(name + il + 1, s->srv->unixsep, &tmp);
        if (r == STORE_OK) {
            buf_putc(out, s->srv->sep);
            buf_append(out, tmp.s, tmp.len);
        }
        buf_free(&tmp);
        return r;
    }
    return mboxname_to_external(name, s->srv->unixsep, out);
}

static int imap_rights(struct imap_session *s, const char *acl)
{
    return acl_rights(acl, s->userid, s->srv->admins);
}

/* Look a mailbox up for an operation needing `need` rights.  STORE_OK
 * and *e_r; STORE_NOTFOUND also when the user lacks l; STORE_PERMISSION
 * when l is there and need is not. */
static int imap_lookup(struct imap_session *s, const char *name, int need,
                       struct mboxlist_entry **e_r)
{
    struct mboxlist *ml = imap_ml(s->srv);
    int r, rights;

    *e_r = NULL;
    if (!ml)
        return STORE_IOERROR;
    r = mboxlist_lookup(ml, name, e_r);
    if (r != STORE_OK)
        return r;
    rights = imap_rights(s, (*e_r)->acl);
    if (!(rights & ACL_LOOKUP)) {
        mboxlist_entry_free(e_r);
        return STORE_NOTFOUND;
    }
    if ((rights & need) != need) {
        mboxlist_entry_free(e_r);
        return STORE_PERMISSION;
    }
    return STORE_OK;
}

/* May the user create `name`?  STORE_OK with the ACL the new mailbox gets
 * in acl (empty = the store's default for the name), STORE_PERMISSION,
 * or a lookup error. */
static int imap_may_create(struct imap_session *s, const char *name,
                           struct buf *acl)
{
    struct mboxlist *ml = imap_ml(s->srv);
    struct buf parent = BUF_INITIALIZER;
    char *dot;
    int r = STORE_PERMISSION;

    buf_reset(acl);
    if (!ml)
        return STORE_IOERROR;
    buf_setcstr(&parent, name);
    while ((dot = strrchr(buf_cstring(&parent), '.')) != NULL) {
        struct mboxlist_entry *e = NULL;
        int lr;

        buf_truncate(&parent, (size_t)(dot - parent.s));
        lr = mboxlist_lookup(ml, buf_cstring(&parent), &e);
        if (lr == STORE_NOTFOUND)
            continue;
        if (lr != STORE_OK) {
            r = lr;
            goto out;
        }
        if (s->admin || (imap_rights(s, e->acl) & ACL_CREATE)) {
            buf_setcstr(acl, e->acl ? e->acl : "");
            r = STORE_OK;
        }
        mboxlist_entry_free(&e);
        goto out;
    }
    /* no ancestor exists */
    if (s->admin || (s->inbox.len &&
                     mboxname_is_self_or_child(buf_cstring(&s->inbox), name) &&
                     strcmp(name, buf_cstring(&s->inbox)) != 0))
        r = STORE_OK;
out:
    buf_free(&parent);
    return r;
}

/* The name argument without one trailing separator ("foo/" -> "foo"). */
static const char *imap_strip_sep(struct imap_session *s, const char *ext,
                                  struct buf *tmp)
{
    size_t n = strlen(ext);

    if (n > 1 && ext[n - 1] == s->srv->sep) {
        buf_setmap(tmp, ext, n - 1);
        return buf_cstring(tmp);
    }
    return ext;
}

/* ---- authentication -------------------------------------------------- */

static void imap_sasl_reset(struct imap_session *s)
{
    saslserver_free(&s->sasl);
    if (s->srv->sasl_ok)
        s->sasl = saslserver_new("imap", s->conn->localaddr,
                                 s->conn->remoteaddr, prot_tls_ssf(s->p));
}

/* The state after a successful authentication. */
static int imap_login_done(struct imap_session *s, const char *user,
                           const char *mech)
{
    struct buf uid = BUF_INITIALIZER;

    s->userid = strdup(user);
    if (!s->userid)
        return -1;
    /* '.' of a login name is '^' in mailbox names */
    buf_setcstr(&uid, user);
    for (size_t i = 0; i < uid.len; i++)
        if (uid.s[i] == '.')
            uid.s[i] = '^';
    if (mboxname_user_inbox(buf_cstring(&uid), &s->inbox) != STORE_OK)
        buf_reset(&s->inbox);
    buf_free(&uid);
    s->admin = (acl_rights("", s->userid, s->srv->admins) & ACL_ADMIN) != 0;
    s->state = IMAP_AUTH;
    log_info("imap: login user=<%s> mech=<%s> peer=<%s> tls=<%s>%s",
             s->userid, mech, s->conn->peer,
             prot_tls_info(s->p) ? prot_tls_info(s->p) : "none",
             s->admin ? " admin=<yes>" : "");
    return 0;
}

static void imap_auth_ok(struct imap_session *s)
{
    struct buf caps = BUF_INITIALIZER;

    imap_capabilities(s, &caps);
    imap_tagged(s, "OK", "[CAPABILITY %s] Success (%s)", buf_cstring(&caps),
                prot_is_tls(s->p) ? "tls protection" : "no protection");
    buf_free(&caps);
}

static void imap_cmd_authenticate(struct imap_session *s)
{
    const char *mech = s->cmd.arg[0];
    struct buf chal = BUF_INITIALIZER;
    int r;

    if (!s->sasl) {
        imap_tagged(s, "NO", "[UNAVAILABLE] Authentication not available");
        return;
    }
    r = saslserver_start(s->sasl, mech, s->cmd.arg[1], &chal);
    while (r == SASLSERVER_CONTINUE) {
        int gr;

        prot_printf(s->p, "+ %s\r\n", buf_cstring(&chal));
        if (prot_flush(s->p) != PROT_OK) {
            s->quit = 1;
            goto out;
        }
        gr = prot_getline(s->p, &s->line, IMAP_AUTH_LINE_MAX, NULL);
        if (gr == PROT_TOOLONG) {
            imap_tagged(s, "BAD", "Authentication line too long");
            imap_sasl_reset(s);
            goto out;
        }
        if (gr == PROT_TIMEOUT)
            prot_puts(s->p, "* BYE Autologout; idle for too long\r\n");
        if (gr != PROT_OK) {
            s->quit = 1;
            goto out;
        }
        if (memchr(buf_cstring(&s->line), '\0', s->line.len)) {
            r = SASLSERVER_BADB64;
            break;
        }
        r = saslserver_step(s->sasl, buf_cstring(&s->line), &chal);
    }
    if (r == SASLSERVER_DONE && saslserver_user(s->sasl)) {
        if (imap_login_done(s, saslserver_user(s->sasl), mech) != 0) {
            imap_tagged(s, "NO", "[UNAVAILABLE] Out of memory");
            imap_sasl_reset(s);
            goto out;
        }
        imap_auth_ok(s);
        goto out;
    }
    switch (r) {
    case SASLSERVER_FAIL:
        imap_tagged(s, "NO", "[AUTHENTICATIONFAILED] Authentication failed");
        break;
    case SASLSERVER_NOMECH:
        imap_tagged(s, "NO", "%sMechanism not available%s",
                    prot_is_tls(s->p) ? "" : "[PRIVACYREQUIRED] ",
                    prot_is_tls(s->p) ? "" : " without TLS");
        break;
    case SASLSERVER_BADB64:
        imap_tagged(s, "BAD", "Cannot decode the response");
        break;
    case SASLSERVER_CANCEL:
        imap_tagged(s, "BAD", "Authentication cancelled");
        break;
    default:
        imap_tagged(s, "NO", "[UNAVAILABLE] Temporary authentication "
                             "failure");
        break;
    }
    log_info("imap: authentication failed mech=<%s> peer=<%s> error=<%s>",
             mech, s->conn->peer,
             saslserver_error(s->sasl) ? saslserver_error(s->sasl) : "");
    imap_sasl_reset(s);
out:
    buf_free(&chal);
}

static void imap_base64(const unsigned char *in, size_t len, struct buf *out)
{
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i;

    buf_reset(out);
    for (i = 0; i + 2 < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 |
                     in[i + 2];

        buf_putc(out, tab[v >> 18]);
        buf_putc(out, tab[(v >> 12) & 63]);
        buf_putc(out, tab[(v >> 6) & 63]);
        buf_putc(out, tab[v & 63]);
    }
    if (i < len) {
        uint32_t v = (uint32_t)in[i] << 16;

        if (i + 1 < len)
            v |= (uint32_t)in[i + 1] << 8;
        buf_putc(out, tab[v >> 18]);
        buf_putc(out, tab[(v >> 12) & 63]);
        buf_putc(out, i + 1 < len ? tab[(v >> 6) & 63] : '=');
        buf_putc(out, '=');
    }
}

static void imap_cmd_login(struct imap_session *s)
{
    struct buf blob = BUF_INITIALIZER, b64 = BUF_INITIALIZER,
               chal = BUF_INITIALIZER;
    int r;

    if (!prot_is_tls(s->p) && !s->srv->allowplaintext) {
        imap_tagged(s, "NO", "[PRIVACYREQUIRED] Plaintext login is not "
                             "allowed without TLS: use STARTTLS first");
        return;
    }
    if (!s->sasl) {
        imap_tagged(s, "NO", "[UNAVAILABLE] Authentication not available");
        return;
    }
    buf_putc(&blob, '\0');
    buf_appendcstr(&blob, s->cmd.arg[0]);
    buf_putc(&blob, '\0');
    buf_appendcstr(&blob, s->cmd.arg[1]);
    imap_base64((const unsigned char *)blob.s, blob.len, &b64);
    memset(blob.s, 0, blob.len);
    r = saslserver_start(s->sasl, "PLAIN", buf_cstring(&b64), &chal);
    memset(b64.s, 0, b64.len);
    if (r == SASLSERVER_DONE && saslserver_user(s->sasl)) {
        if (imap_login_done(s, saslserver_user(s->sasl), "LOGIN") != 0) {
            imap_tagged(s, "NO", "[UNAVAILABLE] Out of memory");
            imap_sasl_reset(s);
        } else {
            imap_auth_ok(s);
        }
    } else {
        if (r == SASLSERVER_FAIL || r == SASLSERVER_CONTINUE)
            imap_tagged(s, "NO", "[AUTHENTICATIONFAILED] Authentication "
                                 "failed");
        else
            imap_tagged(s, "NO", "[UNAVAILABLE] Temporary authentication "
                                 "failure");
        log_info("imap: login failed peer=<%s> error=<%s>", s->conn->peer,
                 saslserver_error(s->sasl) ? saslserver_error(s->sasl) : "");
        imap_sasl_reset(s);
    }
    buf_free(&blob);
    buf_free(&b64);
    buf_free(&chal);
}

static void imap_cmd_starttls(struct imap_session *s)
{
    size_t discarded = 0;

    if (!s->srv->tls) {
        imap_tagged(s, "NO", "[UNAVAILABLE] STARTTLS not available");
        return;
    }
    if (prot_is_tls(s->p)) {
        imap_tagged(s, "BAD", "TLS already active");
        return;
    }
    imap_tagged(s, "OK", "Begin TLS negotiation now");
    if (prot_starttls(s->p, s->srv->tls, &discarded) != PROT_OK) {
        log_info("imap: TLS handshake failed peer=<%s> error=<%s>",
                 s->conn->peer, prot_error(s->p));
        s->quit = 1;
        return;
    }
    if (discarded)
        log_warning("imap: bytes sent before the TLS handshake discarded "
                    "peer=<%s> bytes=<%lu>", s->conn->peer,
                    (unsigned long)discarded);
    /* forget everything learnt before the handshake */
    imap_sasl_reset(s);
}

/* ---- LIST / LSUB ----------------------------------------------------- */

struct imap_list_rock {
    struct imap_session *s;
    struct strarray names;       /* visible mailboxes, internal, walk order */
    struct strarray ext;         /* the same, client form */
};

static int imap_list_collect(void *rock, const struct mboxlist_entry *e)
{
    struct imap_list_rock *lr = rock;
    struct buf ext = BUF_INITIALIZER;

    if (!(imap_rights(lr->s, e->acl) & ACL_LOOKUP))
        return 0;
    if (imap_to_external(lr->s, e->name, &ext) == STORE_OK &&
        strarray_append(&lr->names, e->name) == 0 &&
        strarray_append(&lr->ext, buf_cstring(&ext)) != 0)
        strarray_remove(&lr->names, lr->names.count - 1);
    buf_free(&ext);
    return 0;
}

/* reference + pattern, with a leading INBOX upper-cased */
static void imap_list_pattern(struct imap_session *s, struct buf *pat)
{
    char sep = s->srv->sep;

    buf_setcstr(pat, s->cmd.arg[0]);
    buf_appendcstr(pat, s->cmd.arg[1]);
    if (pat->len >= 5 && strncasecmp(pat->s, "INBOX", 5) == 0 &&
        (pat->len == 5 || pat->s[5] == sep))
        memcpy(pat->s, "INBOX", 5);
}

static void imap_list_line(struct imap_session *s, const char *what,
                           const char *flags, const char *name)
{
    prot_printf(s->p, "* %s (%s) \"%s\" ", what, flags,
                s->srv->sep == '/' ? "/" : ".");
    imap_quoted(s->p, name);
    prot_puts(s->p, "\r\n");
}

static void imap_cmd_list(struct imap_session *s)
{
    struct imap_list_rock lr;
    struct strarray shown = STRARRAY_INITIALIZER;
    struct buf pat = BUF_INITIALIZER, anc = BUF_INITIALIZER;
    struct mboxlist *ml = imap_ml(s->srv);
    char sep = s->srv->sep;
    int r, pct;

    if (s->cmd.arg[1][0] == '\0') {
        /* the hierarchy delimiter and the root of the reference */
        imap_list_line(s, "LIST", "\\Noselect", "");
        imap_tagged(s, "OK", "LIST completed");
        return;
    }
    if (!ml) {
        imap_store_no(s, STORE_IOERROR);
        return;
    }
    memset(&lr, 0, sizeof(lr));
    lr.s = s;
    r = mboxlist_list(ml, "*", imap_list_collect, &lr);
    if (r != STORE_OK) {
        imap_store_no(s, r);
        goto out;
    }
    imap_list_pattern(s, &pat);
    pct = strchr(buf_cstring(&pat), '%') != NULL;
    for (size_t i = 0; i < lr.ext.count; i++) {
        const char *ext = lr.ext.data[i];
        int children;

        /* levels above a visible mailbox that are not themselves visible
         * mailboxes, when the pattern stops at them ('%') */
        if (pct) {
            for (const char *c = strchr(ext, sep); c; c = strchr(c + 1, sep)) {
                buf_setmap(&anc, ext, (size_t)(c - ext));
                if (strarray_find(&lr.ext, buf_cstring(&anc)) >= 0 ||
                    strarray_find(&shown, buf_cstring(&anc)) >= 0)
                    continue;
                if (mboxname_match(buf_cstring(&pat), buf_cstring(&anc),
                                   sep)) {
                    imap_list_line(s, "LIST", "\\Noselect \\HasChildren",
                                   buf_cstring(&anc));
                    strarray_append(&shown, buf_cstring(&anc));
                }
            }
        }
        if (!mboxname_match(buf_cstring(&pat), ext, sep))
            continue;
        /* in mailbox order a mailbox's descendants follow it at once */
        children = i + 1 < lr.names.count &&
                   mboxname_is_self_or_child(lr.names.data[i],
                                             lr.names.data[i + 1]);
        imap_list_line(s, "LIST",
                       children ? "\\HasChildren" : "\\HasNoChildren", ext);
    }
    imap_tagged(s, "OK", "LIST completed");
out:
    strarray_fini(&lr.names);
    strarray_fini(&lr.ext);
    strarray_fini(&shown);
    buf_free(&pat);
    buf_free(&anc);
}

struct imap_lsub_rock {
    struct imap_session *s;
    const char *pattern;
};

static int imap_lsub_one(void *rock, const char *mailbox)
{
    struct imap_lsub_rock *lr = rock;
    struct imap_session *s = lr->s;
    struct mboxlist_entry *e = NULL;
    struct buf ext = BUF_INITIALIZER;
    int visible;

    if (imap_to_external(s, mailbox, &ext) != STORE_OK)
        goto out;
    if (!mboxname_match(lr->pattern, buf_cstring(&ext), s->srv->sep))
        goto out;
    visible = imap_lookup(s, mailbox, 0, &e) == STORE_OK;
    mboxlist_entry_free(&e);
    imap_list_line(s, "LSUB", visible ? "" : "\\Noselect",
                   buf_cstring(&ext));
out:
    buf_free(&ext);
    return 0;
}

static int imap_subs_open(struct imap_session *s, struct subs_db **sub_r)
{
    int r = subs_open(s->srv->conf, s->userid, sub_r);

    if (r != STORE_OK)
        log_error("imap: cannot open subscriptions user=<%s> error=<%s>",
                  s->userid, store_strerror(r));
    return r;
}

static void imap_cmd_lsub(struct imap_session *s)
{
    struct imap_lsub_rock lr;
    struct subs_db *sub = NULL;
    struct buf pat = BUF_INITIALIZER;
    int r;

    if (s->cmd.arg[1][0] == '\0') {
        imap_list_line(s, "LSUB", "\\Noselect", "");
        imap_tagged(s, "OK", "LSUB completed");
        return;
    }
    r = imap_subs_open(s, &sub);
    if (r != STORE_OK) {
        imap_store_no(s, r);
        return;
    }
    imap_list_pattern(s, &pat);
    lr.s = s;
    lr.pattern = buf_cstring(&pat);
    r = subs_list(sub, "*", imap_lsub_one, &lr);
    if (r != STORE_OK)
        imap_store_no(s, r);
    else
        imap_tagged(s, "OK", "LSUB completed");
    subs_close(&sub);
    buf_free(&pat);
}

/* ---- mailbox management ---------------------------------------------- */

/* Convert cmd.arg[i]; on failure answer NO and return -1. */
static int imap_name_arg(struct imap_session *s, int i, struct buf *out)
{
    struct buf tmp = BUF_INITIALIZER;
    const char *err = NULL;
    int r;

    r = imap_to_internal(s, imap_strip_sep(s, s->cmd.arg[i], &tmp), out,
                         &err);
    buf_free(&tmp);
    if (r != STORE_OK) {
        imap_tagged(s, "NO", "[CANNOT] Invalid mailbox name: %s",
                    err ? err : store_strerror(r));
        return -1;
    }
    return 0;
}

static void imap_cmd_create(struct imap_session *s)
{
    struct buf name = BUF_INITIALIZER, acl = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    int r;

    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    if (!imap_ml(s->srv)) {
        imap_store_no(s, STORE_IOERROR);
        goto out;
    }
    /* an existing mailbox the user can see is "already exists"; one
     * hidden from the user is a permission problem, like any other */
    r = imap_lookup(s, buf_cstring(&name), 0, &e);
    mboxlist_entry_free(&e);
    if (r == STORE_OK) {
        imap_tagged(s, "NO", "[ALREADYEXISTS] Mailbox already exists");
        goto out;
    }
    r = imap_may_create(s, buf_cstring(&name), &acl);
    if (r == STORE_OK)
        r = mboxlist_create(s->srv->ml, buf_cstring(&name), NULL,
                            acl.len ? buf_cstring(&acl) : NULL, NULL);
    if (r == STORE_PERMISSION) {
        imap_tagged(s, "NO", "[NOPERM] Permission denied");
    } else if (r == STORE_EXISTS) {
        imap_tagged(s, "NO", "[NOPERM] Permission denied");
    } else if (r != STORE_OK) {
        imap_store_no(s, r);
    } else {
        log_info("imap: created mailbox=<%s> user=<%s>", buf_cstring(&name),
                 s->userid);
        imap_tagged(s, "OK", "CREATE completed");
    }
out:
    buf_free(&name);
    buf_free(&acl);
}

static void imap_cmd_delete(struct imap_session *s)
{
    struct buf name = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    int r;

    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    if (s->inbox.len && strcmp(buf_cstring(&name),
                               buf_cstring(&s->inbox)) == 0) {
        imap_tagged(s, "NO", "[CANNOT] INBOX cannot be deleted");
        goto out;
    }
    r = imap_lookup(s, buf_cstring(&name), ACL_DELETEMBOX, &e);
    mboxlist_entry_free(&e);
    if (r == STORE_OK)
        r = mboxlist_delete(s->srv->ml, buf_cstring(&name), 0);
    if (r != STORE_OK) {
        imap_store_no(s, r);
    } else {
        log_info("imap: deleted mailbox=<%s> user=<%s>", buf_cstring(&name),
                 s->userid);
        imap_tagged(s, "OK", "DELETE completed");
    }
out:
    buf_free(&name);
}

static void imap_cmd_rename(struct imap_session *s)
{
    struct buf oldn = BUF_INITIALIZER, newn = BUF_INITIALIZER,
               acl = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    int r;

    if (imap_name_arg(s, 0, &oldn) != 0 || imap_name_arg(s, 1, &newn) != 0)
        goto out;
    if (s->inbox.len && strcmp(buf_cstring(&oldn),
                               buf_cstring(&s->inbox)) == 0) {
        imap_tagged(s, "NO", "[CANNOT] Renaming INBOX is not implemented "
                             "yet");
        goto out;
    }
    if (mboxname_is_self_or_child(buf_cstring(&oldn), buf_cstring(&newn))) {
        imap_tagged(s, "NO", "[CANNOT] Cannot rename a mailbox to itself "
                             "or below itself");
        goto out;
    }
    r = imap_lookup(s, buf_cstring(&oldn), ACL_DELETEMBOX, &e);
    mboxlist_entry_free(&e);
    if (r != STORE_OK) {
        imap_store_no(s, r);
        goto out;
    }
    r = imap_lookup(s, buf_cstring(&newn), 0, &e);
    mboxlist_entry_free(&e);
    if (r == STORE_OK) {
        imap_tagged(s, "NO", "[ALREADYEXISTS] Mailbox already exists");
        goto out;
    }
    r = imap_may_create(s, buf_cstring(&newn), &acl);
    if (r == STORE_OK)
        r = mboxlist_rename(s->srv->ml, buf_cstring(&oldn),
                            buf_cstring(&newn), NULL);
    if (r == STORE_PERMISSION || r == STORE_EXISTS) {
        imap_tagged(s, "NO", "[NOPERM] Permission denied");
    } else if (r != STORE_OK) {
        imap_store_no(s, r);
    } else {
        log_info("imap: renamed mailbox=<%s> new=<%s> user=<%s>",
                 buf_cstring(&oldn), buf_cstring(&newn), s->userid);
        imap_tagged(s, "OK", "RENAME completed");
    }
out:
    buf_free(&oldn);
    buf_free(&newn);
    buf_free(&acl);
}

static void imap_cmd_subscribe(struct imap_session *s, int add)
{
    struct buf name = BUF_INITIALIZER;
    struct subs_db *sub = NULL;
    int r;

    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    r = imap_subs_open(s, &sub);
    if (r == STORE_OK)
        r = add ? subs_add(sub, buf_cstring(&name))
                : subs_remove(sub, buf_cstring(&name));
    subs_close(&sub);
    if (r == STORE_NOTFOUND && !add)
        imap_tagged(s, "NO", "[NONEXISTENT] Not subscribed to that mailbox");
    else if (r != STORE_OK)
        imap_store_no(s, r);
    else
        imap_tagged(s, "OK", "%s completed", add ? "SUBSCRIBE"
                                                 : "UNSUBSCRIBE");
out:
    buf_free(&name);
}

static void imap_cmd_status(struct imap_session *s)
{
    struct buf name = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct mailbox *mb = NULL;
    struct mailbox_header h;
    uint32_t unseen = 0;
    int r, locked = 0;

    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    r = imap_lookup(s, buf_cstring(&name), ACL_READ, &e);
    if (r == STORE_OK)
        r = mailbox_open(s->srv->conf, e->name, e->partition, &mb);
    if (r == STORE_OK)
        r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        locked = 1;
        h = *mailbox_get_header(mb);
        for (uint32_t i = 0; i < h.visible && r == STORE_OK; i++) {
            struct mailbox_record rec;

            r = mailbox_read_record(mb, i, &rec);
            if (r == STORE_OK &&
                !(rec.flags & (MAILBOX_FLAG_EXPUNGED |
                               MAILBOX_FLAG_ABORTED)) &&
                !(rec.flags & MAILBOX_FLAG_SEEN))
                unseen++;
        }
    }
    if (locked)
        mailbox_unlock(mb);
    mailbox_close(&mb);
    if (r != STORE_OK) {
        imap_store_no(s, r);
        goto out;
    }
    /* the name as the client gave it */
    prot_puts(s->p, "* STATUS ");
    imap_quoted(s->p, s->cmd.arg[0]);
    prot_puts(s->p, " (");
    for (size_t i = 0; i < s->cmd.status.n; i++) {
        if (i)
            prot_puts(s->p, " ");
        switch (s->cmd.status.items[i]) {
        case IMAPPARSE_STATUS_MESSAGES:
            prot_printf(s->p, "MESSAGES %u", (unsigned)h.exists);
            break;
        case IMAPPARSE_STATUS_RECENT:
            prot_puts(s->p, "RECENT 0");
            break;
        case IMAPPARSE_STATUS_UIDNEXT:
            prot_printf(s->p, "UIDNEXT %u", (unsigned)h.uidnext);
            break;
        case IMAPPARSE_STATUS_UIDVALIDITY:
            prot_printf(s->p, "UIDVALIDITY %u", (unsigned)h.uidvalidity);
            break;
        case IMAPPARSE_STATUS_UNSEEN:
            prot_printf(s->p, "UNSEEN %u", (unsigned)unseen);
            break;
        case IMAPPARSE_STATUS_HIGHESTMODSEQ:
            /* RFC 7162: at least 1 once CONDSTORE is in use */
            prot_printf(s->p, "HIGHESTMODSEQ %llu",
                        (unsigned long long)(h.highestmodseq ?
                                             h.highestmodseq : 1));
            break;
        }
    }
    prot_puts(s->p, ")\r\n");
    imap_tagged(s, "OK", "STATUS completed");
out:
    mboxlist_entry_free(&e);
    buf_free(&name);
}


/* ---- selected state -------------------------------------------------- */

/* Leave the selected state.  expunge: CLOSE's silent expunge of the
 * \Deleted messages (only when read-write and the user has e). */
static int imap_unselect(struct imap_session *s, int expunge)
{
    int r = STORE_OK;

    if (!s->sel)
        return STORE_OK;
    if (expunge && !s->sel_readonly && (s->sel_rights & ACL_EXPUNGE)) {
        r = mailbox_lock(s->sel, MAILBOX_LOCK_EXCLUSIVE);
        if (r == STORE_OK) {
            const struct mailbox_header *h = mailbox_get_header(s->sel);
            uint32_t n = h->visible;

            for (uint32_t i = 0; i < n && r == STORE_OK; i++) {
                struct mailbox_record rec;

                r = mailbox_read_record(s->sel, i, &rec);
                if (r != STORE_OK)
                    break;
                if ((rec.flags & MAILBOX_FLAG_DELETED) &&
                    !(rec.flags & (MAILBOX_FLAG_EXPUNGED |
                                   MAILBOX_FLAG_ABORTED))) {
                    rec.flags |= MAILBOX_FLAG_EXPUNGED;
                    r = mailbox_rewrite_record(s->sel, i, &rec);
                }
            }
            {
                int ur = mailbox_unlock(s->sel);

                if (r == STORE_OK)
                    r = ur;
            }
        }
    }
    mailbox_close(&s->sel);
    s->state = IMAP_AUTH;
    return r;
}

static void imap_cmd_select(struct imap_session *s, int examine)
{
    struct buf name = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct mailbox_header h;
    uint32_t firstunseen = 0, seq = 0;
    int r, rights = 0, locked = 0;

    /* a failed SELECT leaves the client unselected (RFC 3501 6.3.1) */
    imap_unselect(s, 0);
    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    r = imap_lookup(s, buf_cstring(&name), ACL_READ, &e);
    if (r == STORE_OK) {
        rights = imap_rights(s, e->acl);
        r = mailbox_open(s->srv->conf, e->name, e->partition, &s->sel);
    }
    if (r == STORE_OK)
        r = mailbox_lock(s->sel, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        locked = 1;
        h = *mailbox_get_header(s->sel);
        for (uint32_t i = 0; i < h.visible && r == STORE_OK; i++) {
            struct mailbox_record rec;

            r = mailbox_read_record(s->sel, i, &rec);
            if (r != STORE_OK ||
                (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED)))
                continue;
            seq++;
            if (!firstunseen && !(rec.flags & MAILBOX_FLAG_SEEN))
                firstunseen = seq;
        }
    }
    if (r == STORE_OK) {
        prot_puts(s->p, "* FLAGS (\\Answered \\Flagged \\Deleted \\Seen "
                        "\\Draft");
        for (int i = 0; i < MAILBOX_USER_FLAGS; i++) {
            const char *f = mailbox_user_flag_name(s->sel, i);

            if (f)
                prot_printf(s->p, " %s", f);
        }
        prot_puts(s->p, ")\r\n");
    }
    if (locked)
        mailbox_unlock(s->sel);
    if (r != STORE_OK) {
        mailbox_close(&s->sel);
        imap_store_no(s, r);
        goto out;
    }
    s->sel_rights = rights;
    s->sel_readonly = examine ||
        !(rights & (ACL_SEEN | ACL_WRITE | ACL_DELETEMSG | ACL_EXPUNGE |
                    ACL_INSERT));
    if (s->cmd.condstore)
        s->condstore = 1;
    if (s->sel_readonly)
        prot_puts(s->p, "* OK [PERMANENTFLAGS ()] Read-only mailbox\r\n");
    else
        prot_printf(s->p, "* OK [PERMANENTFLAGS (%s%s%s%s)] Ok\r\n",
                    (rights & ACL_WRITE) ? "\\Answered \\Flagged \\Draft "
                                         : "",
                    (rights & ACL_DELETEMSG) ? "\\Deleted " : "",
                    (rights & ACL_SEEN) ? "\\Seen " : "",
                    (rights & ACL_WRITE) ? "\\*" : "");
    prot_printf(s->p, "* %u EXISTS\r\n", (unsigned)h.exists);
    prot_puts(s->p, "* 0 RECENT\r\n");
    if (firstunseen)
        prot_printf(s->p, "* OK [UNSEEN %u] First unseen\r\n",
                    (unsigned)firstunseen);
    prot_printf(s->p, "* OK [UIDVALIDITY %u] Ok\r\n",
                (unsigned)h.uidvalidity);
    prot_printf(s->p, "* OK [UIDNEXT %u] Ok\r\n", (unsigned)h.uidnext);
    prot_printf(s->p, "* OK [HIGHESTMODSEQ %llu] Ok\r\n",
                (unsigned long long)(h.highestmodseq ? h.highestmodseq
                                                     : 1));
    s->state = IMAP_SELECTED;
    imap_tagged(s, "OK", "[%s] %s completed",
                s->sel_readonly ? "READ-ONLY" : "READ-WRITE",
                examine ? "EXAMINE" : "SELECT");
out:
    mboxlist_entry_free(&e);
    buf_free(&name);
}

/* ---- other commands -------------------------------------------------- */

static void imap_cmd_namespace(struct imap_session *s)
{
    const char *sep = s->srv->sep == '/' ? "/" : ".";

    prot_printf(s->p, "* NAMESPACE ((\"INBOX%s\" \"%s\")) "
                      "((\"user%s\" \"%s\")) ((\"\" \"%s\"))\r\n",
                sep, sep, sep, sep, sep);
    imap_tagged(s, "OK", "NAMESPACE completed");
}

static void imap_cmd_enable(struct imap_session *s)
{
    int enabled = 0;

    for (size_t i = 0; i < s->cmd.words.n; i++) {
        if (strcasecmp(s->cmd.words.s[i], "CONDSTORE") == 0 &&
            !s->condstore) {
            s->condstore = 1;
            enabled = 1;
        }
    }
    prot_printf(s->p, "* ENABLED%s\r\n", enabled ? " CONDSTORE" : "");
    imap_tagged(s, "OK", "ENABLE completed");
}

static void imap_cmd_id(struct imap_session *s)
{
    prot_printf(s->p, "* ID (\"name\" \"cyrusdeliver\" \"version\" \"%s\")"
                      "\r\n", PACKAGE_VERSION);
    imap_tagged(s, "OK", "ID completed");
}

static void imap_cmd_idle(struct imap_session *s)
{
    int r;

    prot_puts(s->p, "+ idling\r\n");
    if (prot_flush(s->p) != PROT_OK) {
        s->quit = 1;
        return;
    }
    prot_set_interrupt(s->p, service_stopping);
    r = prot_getline(s->p, &s->line, IMAP_IDLE_LINE_MAX, NULL);
    prot_set_interrupt(s->p, NULL);
    switch (r) {
    case PROT_OK:
        if (strcasecmp(buf_cstring(&s->line), "DONE") == 0)
            imap_tagged(s, "OK", "IDLE terminated");
        else
            imap_tagged(s, "BAD", "Expected DONE to end IDLE");
        break;
    case PROT_TOOLONG:
        imap_tagged(s, "BAD", "Expected DONE to end IDLE");
        break;
    case PROT_INTERRUPTED:
        prot_puts(s->p, "* BYE Server shutting down\r\n");
        s->quit = 1;
        break;
    case PROT_TIMEOUT:
        prot_puts(s->p, "* BYE Autologout; idle for too long\r\n");
        s->quit = 1;
        break;
    default:
        s->quit = 1;
        break;
    }
}

/* APPEND: the message literal is read and dropped (a synchronizing one
 * was refused by imap_continue before the client sent it). */
static void imap_cmd_append(struct imap_session *s)
{
    int r = PROT_OK;

    if (s->cmd.append.size)
        r = prot_read(s->p, NULL, s->cmd.append.size);
    if (r != PROT_OK) {
        s->quit = 1;
        return;
    }
    r = imapparse_append_end(s->p, &s->opts, &s->cmd);
    if (!imapparse_in_sync(r)) {
        s->quit = 1;
        return;
    }
    imap_tagged(s, "NO", "[CANNOT] APPEND is not implemented yet");
}

/* ---- dispatch -------------------------------------------------------- */

static int imap_continue(void *rock, struct prot *p, size_t size, int append,
                         const char **error_r)
{
    struct imap_session *s = rock;

    (void)size;
    if (append) {
        s->append_refused = 1;
        *error_r = s->state == IMAP_NOTAUTH
                       ? "Please log in first"
                       : "[CANNOT] APPEND is not implemented yet";
        return -1;
    }
    prot_puts(p, "+ Ready for more\r\n");
    if (prot_flush(p) != PROT_OK) {
        *error_r = "Write failed";
        return -1;
    }
    return 0;
}

static void imap_command(struct imap_session *s)
{
    struct imapparse_cmd *c = &s->cmd;
    struct buf caps = BUF_INITIALIZER;

    /* any state */
    switch (c->id) {
    case IMAPPARSE_CMD_CAPABILITY:
        imap_capabilities(s, &caps);
        prot_printf(s->p, "* CAPABILITY %s\r\n", buf_cstring(&caps));
        buf_free(&caps);
        imap_tagged(s, "OK", "CAPABILITY completed");
        return;
    case IMAPPARSE_CMD_NOOP:
        imap_tagged(s, "OK", "NOOP completed");
        return;
    case IMAPPARSE_CMD_LOGOUT:
        imap_unselect(s, 0);
        prot_printf(s->p, "* BYE %s LOGOUT received\r\n",
                    s->srv->servername);
        imap_tagged(s, "OK", "LOGOUT completed");
        s->quit = 1;
        return;
    case IMAPPARSE_CMD_ID:
        imap_cmd_id(s);
        return;
    default:
        break;
    }

    if (s->state == IMAP_NOTAUTH) {
        switch (c->id) {
        case IMAPPARSE_CMD_STARTTLS:
            imap_cmd_starttls(s);
            return;
        case IMAPPARSE_CMD_AUTHENTICATE:
            imap_cmd_authenticate(s);
            return;
        case IMAPPARSE_CMD_LOGIN:
            imap_cmd_login(s);
            return;
        case IMAPPARSE_CMD_APPEND:
            /* a LITERAL+ message: drop it to stay in sync */
            if (c->append.size &&
                prot_read(s->p, NULL, c->append.size) != PROT_OK) {
                s->quit = 1;
                return;
            }
            if (!imapparse_in_sync(imapparse_append_end(s->p, &s->opts,
                                                        c))) {
                s->quit = 1;
                return;
            }
            imap_tagged(s, "BAD", "Please log in first");
            return;
        default:
            imap_tagged(s, "BAD", "Please log in first");
            return;
        }
    }

    switch (c->id) {
    case IMAPPARSE_CMD_STARTTLS:
    case IMAPPARSE_CMD_AUTHENTICATE:
    case IMAPPARSE_CMD_LOGIN:
        imap_tagged(s, "BAD", "Already authenticated");
        break;
    case IMAPPARSE_CMD_ENABLE:
        imap_cmd_enable(s);
        break;
    case IMAPPARSE_CMD_NAMESPACE:
        imap_cmd_namespace(s);
        break;
    case IMAPPARSE_CMD_IDLE:
        imap_cmd_idle(s);
        break;
    case IMAPPARSE_CMD_LIST:
        imap_cmd_list(s);
        break;
    case IMAPPARSE_CMD_LSUB:
        imap_cmd_lsub(s);
        break;
    case IMAPPARSE_CMD_CREATE:
        imap_cmd_create(s);
        break;
    case IMAPPARSE_CMD_DELETE:
        imap_cmd_delete(s);
        break;
    case IMAPPARSE_CMD_RENAME:
        imap_cmd_rename(s);
        break;
    case IMAPPARSE_CMD_SUBSCRIBE:
        imap_cmd_subscribe(s, 1);
        break;
    case IMAPPARSE_CMD_UNSUBSCRIBE:
        imap_cmd_subscribe(s, 0);
        break;
    case IMAPPARSE_CMD_STATUS:
        imap_cmd_status(s);
        break;
    case IMAPPARSE_CMD_APPEND:
        imap_cmd_append(s);
        break;
    case IMAPPARSE_CMD_SELECT:
        imap_cmd_select(s, 0);
        break;
    case IMAPPARSE_CMD_EXAMINE:
        imap_cmd_select(s, 1);
        break;
    case IMAPPARSE_CMD_CHECK:
    case IMAPPARSE_CMD_CLOSE:
    case IMAPPARSE_CMD_UNSELECT:
    case IMAPPARSE_CMD_EXPUNGE:
    case IMAPPARSE_CMD_SEARCH:
    case IMAPPARSE_CMD_FETCH:
    case IMAPPARSE_CMD_STORE:
    case IMAPPARSE_CMD_COPY:
    case IMAPPARSE_CMD_MOVE:
        if (s->state != IMAP_SELECTED) {
            imap_tagged(s, "BAD", "No mailbox selected");
        } else if (c->id == IMAPPARSE_CMD_CHECK) {
            /* every change is durable when its command completes */
            imap_tagged(s, "OK", "CHECK completed");
        } else if (c->id == IMAPPARSE_CMD_CLOSE ||
                   c->id == IMAPPARSE_CMD_UNSELECT) {
            int r = imap_unselect(s, c->id == IMAPPARSE_CMD_CLOSE);

            if (r != STORE_OK)
                imap_store_no(s, r);
            else
                imap_tagged(s, "OK", "%s completed",
                            c->id == IMAPPARSE_CMD_CLOSE ? "CLOSE"
                                                         : "UNSELECT");
        } else {
            imap_tagged(s, "NO", "[CANNOT] %s is not implemented yet",
                        c->name ? c->name : "command");
        }
        break;
    default:
        imap_tagged(s, "BAD", "Unrecognized command");
        break;
    }
}

void imap_serve(struct imap_server *srv, struct prot *p,
                const struct imap_conn *conn)
{
    struct imap_session s;
    struct buf caps = BUF_INITIALIZER;
    int r;

    memset(&s, 0, sizeof(s));
    s.srv = srv;
    s.p = p;
    s.conn = conn;
    s.opts.cont = imap_continue;
    s.opts.rock = &s;
    imapparse_cmd_init(&s.cmd);
    prot_settimeout(p, srv->timeout);
    log_debug("imap: connection peer=<%s>", conn->peer);

    if (conn->implicit_tls) {
        if (!srv->tls) {
            log_error("imap: implicit TLS asked (-s) but TLS is not "
                      "configured peer=<%s>", conn->peer);
            goto out;
        }
        if (prot_starttls(p, srv->tls, NULL) != PROT_OK) {
            log_info("imap: TLS handshake failed peer=<%s> error=<%s>",
                     conn->peer, prot_error(p));
            goto out;
        }
    }
    imap_sasl_reset(&s);
    imap_capabilities(&s, &caps);
    prot_printf(p, "* OK [CAPABILITY %s] %s cyrusdeliver IMAP ready\r\n",
                buf_cstring(&caps), srv->servername);
    buf_free(&caps);

    while (!s.quit) {
        if (!prot_pending(p) && prot_flush(p) != PROT_OK)
            break;
        if (service_stopping()) {
            prot_puts(p, "* BYE Server shutting down\r\n");
            break;
        }
        s.append_refused = 0;
        /* an idle client does not hold up a shutdown */
        prot_set_interrupt(p, service_stopping);
        r = imapparse_read(p, &s.opts, &s.cmd);
        prot_set_interrupt(p, NULL);
        switch (r) {
        case IMAPPARSE_OK:
            imap_command(&s);
            break;
        case IMAPPARSE_BAD:
        case IMAPPARSE_TOOBIG:
            imap_tagged(&s, "BAD", "%s", s.cmd.error);
            break;
        case IMAPPARSE_REFUSED:
            if (s.append_refused && s.state == IMAP_AUTH)
                imap_tagged(&s, "NO", "%s", s.cmd.error);
            else
                imap_tagged(&s, "BAD", "%s", s.cmd.error);
            break;
        case IMAPPARSE_BADCHARSET:
            imap_tagged(&s, "NO", "[BADCHARSET (US-ASCII UTF-8)] %s",
                        s.cmd.error);
            break;
        case IMAPPARSE_TIMEOUT:
            prot_puts(p, "* BYE Autologout; idle for too long\r\n");
            s.quit = 1;
            break;
        case IMAPPARSE_INTERRUPTED:
            prot_puts(p, "* BYE Server shutting down\r\n");
            s.quit = 1;
            break;
        case IMAPPARSE_DESYNC:
        case IMAPPARSE_NOMEM:
            prot_printf(p, "* BYE %s\r\n", s.cmd.error ? s.cmd.error
                                                       : "Protocol error");
            s.quit = 1;
            break;
        default:        /* EOF, IOERROR */
            s.quit = 1;
            break;
        }
    }
    prot_flush(p);
    if (s.userid)
        log_info("imap: logout user=<%s> peer=<%s>", s.userid, conn->peer);
out:
    imap_unselect(&s, 0);
    imapparse_cmd_free(&s.cmd);
    buf_free(&s.line);
    buf_free(&s.inbox);
    free(s.userid);
    saslserver_free(&s.sasl);
}
