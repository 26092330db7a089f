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
 *   authenticated  ENABLE (CONDSTORE, QRESYNC, UTF8=ACCEPT: RFC 6855 UTF-8
 *                  mailbox names, kept as modified UTF-7 in the store,
 *                  see imap_to_internal()), NAMESPACE, IDLE (waits for DONE),
 *                  COMPRESS DEFLATE (RFC 4978, lib/prot.h),
 *                  LIST, LSUB (list.c: LIST-EXTENDED, LIST-STATUS,
 *                  SPECIAL-USE), CREATE (CREATE-SPECIAL-USE), DELETE,
 *                  RENAME, SUBSCRIBE,
 *                  UNSUBSCRIBE, STATUS (STATUS=SIZE), SELECT, EXAMINE
 *                  (FLAGS, EXISTS,
 *                  RECENT 0, UNSEEN, PERMANENTFLAGS, UIDVALIDITY, UIDNEXT,
 *                  HIGHESTMODSEQ; READ-WRITE / READ-ONLY; QRESYNC's
 *                  VANISHED (EARLIER) and FETCH, qresync.h; CLOSED)
 *                  ACL (aclcmd.c), QUOTA (quotacmd.c), an admin's DELETE
 *                  of a user's INBOX (admincmd.c), through imapcmd.h
 *   selected       CHECK, CLOSE (expunges \Deleted messages when
 *                  read-write and the user has e), UNSELECT, FETCH (with
 *                  RFC 3516's BINARY items; the capability waits for
 *                  BINARY APPEND), STORE,
 *                  EXPUNGE, COPY, MOVE, SEARCH (ESEARCH, SEARCHRES,
 *                  WITHIN, RFC 5267 PARTIAL), SORT (SORT=DISPLAY, ESORT,
 *                  PARTIAL), THREAD
 *                  (imapd/sort.c) and their UID forms;
 *                  APPEND in the authenticated and selected states
 *                  (imapd/appendcmd.c; APPENDLIMIT: maxmessagesize, NO [TOOBIG] before
 *                  the data; MULTIAPPEND and CATENATE in one append
 *                  transaction; literal8 and UTF8 (...) data)
 * Outside the selected state the selected-state commands answer "BAD No
 * mailbox selected".
 *
 * The client's view.  In the selected state s->msgs holds, per sequence
 * number, the uid and the flags and modseq the client was last told of.
 * Before every tagged OK/NO in that state imap_update() compares the
 * index with it (under the shared lock) and sends FLAGS (new keywords),
 * FETCH FLAGS, EXPUNGE (descending) and EXISTS; during FETCH, STORE and
 * SEARCH (not their UID forms) expunged messages stay in the view marked
 * gone (RFC 3501 7.4.1).  IDLE polls cyrus.index's stat data every
 * 250 ms (a SIGALRM timer interrupts the wait for DONE) and sends the
 * updates as they happen.
 *
 * Locks and durability.  Reads take the mailbox's shared lock, changes
 * the exclusive one (mailbox_rewrite_record(): an expunge durable at
 * mailbox_unlock(), a flag change only with spool_sync_flags; else
 * synced by mailbox_flush() when the client has sent nothing for a
 * second (imap_idle_flush()), at IDLE, at close and after the LOGOUT
 * reply, or by the mailbox's next sync; mailbox.h); responses are built in memory and written after the
 * lock is released, so a client slow to read holds no lock.  APPEND,
 * COPY and MOVE put messages in through store/append.h (staging file,
 * append_add(), one append_commit()), like lmtpd; an APPEND's messages
 * are staged while the client sends and reserved only at the end of the
 * command, so no lock is held across client reads either.
 *
 * \Seen is per user (store/seen.h; Cyrus's non-shared-seen mailboxes):
 * SELECT/EXAMINE read the user's record of the mailbox (keyed by its
 * unique id) into s->seen, and every record read for the client's view
 * gets its \Seen bit from that set (imap_rec_seen()), never from the
 * index, whose own \Seen bit imapd leaves alone.  FETCH (body without
 * PEEK), STORE, APPEND and COPY change the set and write it back before
 * the command answers; each update rereads it, so another session of
 * the same user shows its \Seen changes as FETCH FLAGS.  The record is
 * read, changed and written without a lock across the three steps: two
 * sessions of one user changing \Seen at once may lose one change.
 * A \Seen change moves the message's modseq (STORE, FETCH), so
 * CHANGEDSINCE and QRESYNC see it.
 *
 * Names.  The client sees the user's own mailboxes as INBOX and
 * INBOX<sep>child ("user.U" and "user.U.child" inside), other users'
 * mailboxes as "user<sep>V..." and shared ones as they are; <sep> is '.'
 * or, with unixhierarchysep, '/' (store/mboxname.h converts).  A login
 * name holding '.' is '^' in mailbox names, as in Cyrus.
 *
 * Virtual domains (store/userid.h, man/imapd.8).  The login name becomes
 * the internal user id ("alice", "alice@example.com") in SASL's
 * canon_user callback, before the password check (imap_sasl_canon();
 * with virtdomains on, a name without a domain takes the domain of the
 * local address's name, imapd/localdomain.h).  The session's names are
 * those of the user's domain: "user.bob" of alice@example.com is
 * example.com!user.bob; other domains are invisible and cannot be named,
 * except by a global admin (a domain-less userid in `admins`), who sees
 * them as "user.bob@example.org".  imap_reachable() checks every looked
 * up and created name on top of the translation.
 *
 * Access.  Every mailbox operation looks the mailbox up and asks
 * acl_rights() with imapd.conf's `admins`: a mailbox without the l right
 * is reported as nonexistent (no leak of its existence); CREATE needs k
 * on the nearest existing ancestor (or a name below the user's own
 * INBOX when no ancestor exists), and the new mailbox inherits that
 * ancestor's ACL; DELETE needs x; RENAME needs x on the old name and
 * CREATE's right for the new one; STATUS needs r.  Admins get their
 * rights (acl.h) where they administer: a global admin everywhere, an
 * admin "admin@D" in domain D only (imap_admin_for()).
 *
 * Limits.  Command lines, literals and commands are bounded by the
 * parser (64 KiB line, 64 KiB literal, 1 MiB command); an oversized
 * synchronizing literal is refused before the client sends it.  The
 * autologout is imapd.conf's `timeout` (minutes) once the client has
 * logged in, `prelogin_timeout` (seconds) before.  SIGTERM (the master
 * stopping) is noticed while waiting for a command: "* BYE Server
 * shutting down".
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "imapd/aclcmd.h"
#include "imapd/appendcmd.h"
#include "imapd/admincmd.h"
#include "store/userstate.h"
#include "imapd/imapcmd.h"
#include "imapd/imapparse.h"
#include "imapd/imapurl.h"
#include "imapd/list.h"
#include "imapd/localdomain.h"
#include "imapd/qresync.h"
#include "imapd/proxy.h"
#include "imapd/quotacmd.h"
#include "imapd/search.h"
#include "imapd/session.h"
#include "imapd/sort.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "lib/prot.h"
#include "lib/saslserver.h"
#include "lib/service.h"
#include "lib/strarray.h"
#include "lib/utf8.h"
#include "store/acl.h"
#include "store/append.h"
#include "store/idlenotify.h"
#include "store/autocreate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/message.h"
#include "store/seen.h"
#include "store/store.h"
#include "store/subs.h"
#include "store/userid.h"

#define IMAP_AUTH_LINE_MAX 65536   /* one AUTHENTICATE response line */
#define IMAP_IDLE_LINE_MAX 1024    /* the line ending IDLE */
#define IMAP_DEFAULT_TIMEOUT 30    /* minutes, when the key is unset */

struct imap_server {
    const struct imapconf *conf;
    struct tls_server *tls;
    int sasl_ok;
    struct mboxlist *ml;         /* NULL until it opens */
    char servername[256];
    int timeout;                 /* seconds, once logged in */
    int prelogin_timeout;        /* seconds, before */
    int unixsep;
    char sep;
    int allowplaintext;
    char *admins;                /* `admins`, each entry canonicalized as
                                    a login (userid_canon) */
    struct userid_policy policy; /* virtdomains, defaultdomain */
    struct imap_proxy *proxy;    /* imap_proxy: yes (a frontend), else
                                    NULL */
};

enum imap_state { IMAP_NOTAUTH = 0, IMAP_AUTH = 1, IMAP_SELECTED = 2 };

/* One message of the client's view of the selected mailbox: sequence
 * number = index + 1.  flags/uflags/modseq are what the client was last
 * told (or would have seen), to notice other sessions' changes. */
struct imap_msg {
    uint32_t uid;
    uint32_t flags;                         /* system flags */
    uint32_t uflags[MAILBOX_USER_FLAGS / 32];
    uint64_t modseq;
    int gone;                               /* expunged, EXPUNGE not sent
                                               yet (RFC 3501 7.4.1) */
    int recent;                             /* \Recent in this session */
};

struct imap_session {
    struct imap_server *srv;
    struct prot *p;
    const struct imap_conn *conn;
    struct saslserver *sasl;
    enum imap_state state;
    char *userid;                /* after LOGIN / AUTHENTICATE: internal
                                    form, "alice" or "alice@example.com" */
    const char *domain;          /* the userid's domain, NULL for none */
    struct buf inbox;            /* "user.U" or "D!user.U" (empty when U
                                    cannot own one) */
    int admin;                   /* in `admins`: a global admin (domain-
                                    less userid) or the admin of domain */
    int global_admin;            /* admin of every domain */
    int serverdomain_known;      /* serverdomain looked up (virtdomains on) */
    struct buf serverdomain;     /* the local address's domain, or empty */
    const char *canon_error;     /* why the last login name was refused */
    int condstore;               /* ENABLE CONDSTORE */
    int qresync;                 /* ENABLE QRESYNC (condstore too):
                                    VANISHED instead of EXPUNGE */
    int utf8_accept;             /* ENABLE UTF8=ACCEPT (RFC 6855): names
                                    are UTF-8 both ways, quoted strings
                                    must be valid UTF-8, SEARCH takes no
                                    CHARSET; for APPEND's UTF8 (~{n}) */
    struct mailbox *sel;         /* the selected mailbox (no lock held
                                    between commands) */
    int sel_readonly;            /* EXAMINE, or no write rights */
    int sel_rights;
    /* the mailbox list as sel_rights was read from it: while it is
     * unchanged, the rights are too (imap_sel_rights_refresh()) */
    int sel_rights_known;
    struct cyrusdb_stamp sel_rights_stamp;
    int quit;
    struct mailbox *logout_mb;   /* LOGOUT: the mailbox it left, closed
                                  * (its flag changes synced) only after
                                  * the reply has gone out */
    int append_refused;          /* the continuation callback refused an
                                    APPEND literal: answer NO (1) or BAD
                                    (2) */
    char errbuf[128];            /* the continuation callback's text */
    struct appendcmd *app;       /* the APPEND whose data is being read */
    struct imap_msg *msgs;       /* the client's view of the mailbox */
    size_t nmsgs, msgalloc;
    uint32_t lastuid;            /* highest uid in the view */
    int in_update;               /* imap_update() running */
    /* the index as the view last matched it (imap_reconcile): when the
     * header still says the same, no record changed and none is read */
    int view_known;
    uint64_t view_hms;
    uint32_t view_visible, view_uidnext, view_compactions, view_uidvalidity;
    int view_condstore, view_gone;
    int no_expunge;              /* the command may not see EXPUNGE */
    struct stat ist;             /* cyrus.index at the last update */
    int nkeywords;               /* keywords the client was told of */
    struct seen_db *seendb;      /* the user's seen file (opened at the
                                    first use, closed at the end) */
    int sel_useseen;             /* \Seen of s->sel is in s->seen (else
                                    the index bit: no unique id) */
    struct seen_data seen;       /* the user's seen state of s->sel */
    struct buf seen_prev;        /* imap_update(): s->seen before the reload */
    struct mailbox_version view_version;  /* the index at the last pass */
    struct imap_seen_chg *seenchg;  /* changes to s->seen not yet written */
    size_t nseenchg, seenchg_alloc;
    uint32_t recent_base;        /* read-only view: uids above it were
                                    \Recent at SELECT (not claimed) */
    int recent_new;              /* messages came into the view: claim
                                    them, then send RECENT */
    uint32_t claim_from, claim_upto;  /* uids (claim_from, claim_upto]
                                    claimed as \Recent by this session's
                                    APPEND/COPY into s->sel, not yet in the
                                    view (claim_upto 0: none) */
    uint32_t *saved;             /* "$" (SEARCHRES): UIDs, ascending */
    size_t nsaved;
    struct imapparse_range *saved_ranges;  /* "$" of the current command */
    struct imapparse_cmd cmd;
    struct imapparse_options opts;
    struct buf line;
    /* for the session's end line */
    const char *end_reason;      /* logout, autologout, shutdown, error;
                                    NULL: disconnect */
    unsigned long ncommands;     /* commands read (also refused ones) */
    unsigned long nappended;     /* APPENDs stored */
    unsigned long nfetched;      /* FETCH responses that read a message */
    unsigned long nexpunged;     /* messages expunged (EXPUNGE, CLOSE,
                                    MOVE) */
};

/* One \Seen change of a session, replayed on the stored state. */
struct imap_seen_chg {
    uint32_t uid;
    int add;
};

/* ---- server ---------------------------------------------------------- */

/* `admins` with each entry canonicalized as a login is (no server
 * domain: an entry without "@domain" is a global admin), so that
 * "admin@DEFAULTDOMAIN" is "admin" and a domain is lower-cased.  An entry
 * that is no valid user id is logged and left out.  0, or -1 out of
 * memory. */
static int imap_admins_canon(struct imap_server *srv, const char *admins)
{
    struct buf out = BUF_INITIALIZER, one = BUF_INITIALIZER,
               canon = BUF_INITIALIZER;
    const char *p = admins ? admins : "";

    while (*p) {
        size_t n = strcspn(p, " \t,");
        const char *err = NULL;

        if (n > 0) {
            buf_setmap(&one, p, n);
            if (userid_canon(&srv->policy, buf_cstring(&one), NULL, &canon,
                             &err) == STORE_OK) {
                if (out.len)
                    buf_putc(&out, ' ');
                buf_append(&out, canon.s, canon.len);
            } else {
                log_warning("imap: admins entry ignored entry=<%s> "
                            "error=<%s>", buf_cstring(&one),
                            err ? err : "invalid user id");
            }
        }
        p += n;
        if (*p)
            p++;
    }
    buf_free(&one);
    buf_free(&canon);
    srv->admins = buf_release(&out);
    if (!srv->admins)
        srv->admins = strdup("");
    return srv->admins ? 0 : -1;
}

int imap_server_new(const struct imapconf *conf, struct tls_server *tls,
                    int sasl_ok, struct imap_server **srv_r)
{
    struct imap_server *srv;
    const char *err = NULL;
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
    imapconf_servername(conf, srv->servername, sizeof(srv->servername));
    v = imapconf_getint(conf, "timeout");
    srv->timeout = (int)((v > 0 ? v : IMAP_DEFAULT_TIMEOUT) * 60);
    v = imapconf_getint(conf, "prelogin_timeout");
    srv->prelogin_timeout = (int)(v > 0 ? v : 60);
    srv->unixsep = imapconf_getswitch(conf, "unixhierarchysep");
    srv->sep = srv->unixsep ? '/' : '.';
    srv->allowplaintext = imapconf_getswitch(conf, "allowplaintext");
    if (userid_policy_init(conf, &srv->policy, &err) != STORE_OK) {
        log_error("imap: virtual domains error=<%s>",
                  err ? err : "bad configuration");
        free(srv);
        return -1;
    }
    if (imap_admins_canon(srv, imapconf_getstring(conf, "admins")) != 0) {
        log_error("imap: out of memory");
        userid_policy_free(&srv->policy);
        free(srv);
        return -1;
    }
    if (imapconf_getswitch(conf, "imap_proxy")) {
        /* a frontend: no mailbox here, every session is a backend's */
        if (imap_proxy_new(conf, &srv->proxy, &err) != 0) {
            log_error("imap: imap_proxy error=<%s>", err);
            imap_server_free(&srv);
            return -1;
        }
        *srv_r = srv;
        return 0;
    }
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
    imap_proxy_free(&srv->proxy);
    userid_policy_free(&srv->policy);
    free(srv->admins);
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
static void imap_update(struct imap_session *s);
static size_t imap_recent_mark(struct imap_session *s);
static void imap_flags_lines(struct imap_session *s, struct buf *out);
static void imap_permflags_line(struct imap_session *s, struct buf *out);

static void imap_tagged(struct imap_session *s, const char *status,
                        const char *fmt, ...)
{
    struct buf b = BUF_INITIALIZER;
    va_list ap;

    /* the selected mailbox's news go before a command's completion */
    if (s->state == IMAP_SELECTED && s->sel && !s->in_update &&
        strcmp(status, "BAD") != 0)
        imap_update(s);
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
    case STORE_TOOBIG: code = "[TOOBIG] "; break;
    case STORE_NOTIMPLEMENTED: code = "[CANNOT] "; break;
    case STORE_INTERNAL: code = "[SERVERBUG] "; break;
    default: code = "[UNAVAILABLE] "; break;
    }
    imap_tagged(s, "NO", "%s%s", code, store_strerror(r));
}

/* RFC 8440's LIST-MYRIGHTS needs the ACL extension (RFC 4314): it is
 * offered, and LIST RETURN (MYRIGHTS) accepted, when this build answers
 * the ACL commands (aclcmd.c), as it does. */
#define IMAP_HAVE_ACL 1

#define IMAP_APPEND_MAX ((size_t)64 << 20)   /* the parser's default */

/* The largest message APPEND takes (RFC 7889 APPENDLIMIT): maxmessagesize
 * when set and smaller than the parser's bound on a message literal. */
static size_t imap_appendlimit(const struct imap_server *srv)
{
    long long v = imapconf_getint(srv->conf, "maxmessagesize");

    if (v > 0 && (unsigned long long)v < IMAP_APPEND_MAX)
        return (size_t)v;
    return IMAP_APPEND_MAX;
}

static void imap_capabilities(struct imap_session *s, struct buf *out)
{
    struct buf mechs = BUF_INITIALIZER;

    buf_reset(out);
    buf_appendcstr(out, "IMAP4rev1 LITERAL+ SASL-IR ID ENABLE NAMESPACE "
                        "IDLE UIDPLUS MOVE CONDSTORE QRESYNC UNSELECT CHILDREN "
                        "ESEARCH SEARCHRES WITHIN SORT SORT=DISPLAY ESORT "
                        "THREAD=ORDEREDSUBJECT THREAD=REFERENCES "
                        "LIST-EXTENDED LIST-STATUS SPECIAL-USE "
                        "CREATE-SPECIAL-USE STATUS=SIZE UTF8=ACCEPT "
                        "MULTIAPPEND CATENATE BINARY");
    buf_printf(out, " APPENDLIMIT=%zu", imap_appendlimit(s->srv));
    if (IMAP_HAVE_ACL)
        buf_appendcstr(out, " LIST-MYRIGHTS");
    /* command families of their own files */
    buf_appendcstr(out, " " ACLCMD_CAPABILITIES " " QUOTACMD_CAPABILITIES);
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
    } else if (!prot_is_compressed(s->p)) {
        buf_appendcstr(out, " COMPRESS=DEFLATE");
    }
    buf_free(&mechs);
}

/* ---- names ----------------------------------------------------------- */

/* Is internal name `name` in the user's domain (both domain-less, or
 * the same domain)? */
static int imap_in_domain(const struct imap_session *s, const char *name)
{
    size_t dlen = 0;
    const char *rest = NULL;
    const char *d = mboxname_domain(name, &dlen, &rest);

    if (!s->domain)
        return d == NULL;
    return d && dlen == strlen(s->domain) && memcmp(d, s->domain, dlen) == 0;
}

/* Are internal names a and b in the same domain (or both domain-less)? */
static int imap_same_domain(const char *a, const char *b)
{
    size_t la = 0, lb = 0;
    const char *ra = NULL, *rb = NULL;
    const char *da = mboxname_domain(a, &la, &ra);
    const char *db = mboxname_domain(b, &lb, &rb);

    if (!da || !db)
        return !da && !db;
    return la == lb && memcmp(da, db, la) == 0;
}

/* May the session use its admin rights on `name`?  A global admin
 * everywhere, a domain's admin in its domain only. */
int imap_admin_for(const struct imap_session *s, const char *name)
{
    if (!s->admin)
        return 0;
    return s->global_admin || imap_in_domain(s, name);
}

/* May the session reach `name` at all?  Its own domain; every domain for
 * a global admin.  Names of other domains are reported as nonexistent. */
int imap_reachable(const struct imap_session *s, const char *name)
{
    return s->global_admin || imap_in_domain(s, name);
}

/* Client name -> internal name into out.  STORE_OK or STORE_BADNAME with
 * *err_r.  A user's names land in its own domain ("INBOX" and
 * "user<sep>bob" of alice@example.com are example.com!user.alice and
 * example.com!user.bob); only a global admin reaches another domain, by
 * "user<sep>bob@example.org" (store/mboxname.h). */
static int imap_to_internal_ascii(struct imap_session *s, const char *ext,
                                  struct buf *out, const char **err_r)
{
    char sep = s->srv->sep;
    struct buf tmp = BUF_INITIALIZER;
    int r;

    *err_r = NULL;
    buf_reset(out);
    if (strchr(ext, '!')) {
        *err_r = "'!' in name";
        return STORE_BADNAME;
    }
    if (strncasecmp(ext, "INBOX", 5) == 0 &&
        (ext[5] == '\0' || ext[5] == sep)) {
        if (!s->inbox.len) {
            *err_r = "this login has no INBOX";
            return STORE_BADNAME;
        }
        buf_setcstr(out, buf_cstring(&s->inbox));
        if (ext[5] == '\0')
            return STORE_OK;
        if (s->srv->policy.virtdomains && strchr(ext, '@')) {
            *err_r = "'@' in name";
            return STORE_BADNAME;
        }
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
    if (s->srv->policy.virtdomains == USERID_VIRTDOMAINS_OFF)
        return mboxname_to_internal(ext, s->srv->unixsep, out, err_r);
    if (s->global_admin && *s->srv->policy.defaultdomain) {
        /* "NAME@DEFAULTDOMAIN" is the domain-less NAME */
        const char *at = strrchr(ext, '@');

        if (at && strcasecmp(at + 1, s->srv->policy.defaultdomain) == 0) {
            buf_setmap(&tmp, ext, (size_t)(at - ext));
            r = mboxname_to_internal(buf_cstring(&tmp), s->srv->unixsep,
                                     out, err_r);
            buf_free(&tmp);
            return r;
        }
    }
    return mboxname_to_internal_for(ext, s->srv->unixsep, s->domain,
                                    s->global_admin, out, err_r);
}

/* imap_to_internal_ascii() of a name as the client writes it: after
 * ENABLE UTF8=ACCEPT a UTF-8 name, turned into the modified UTF-7 the
 * store keeps (RFC 6855 3: "Entw\xc3\xbcrfe" is "Entw&APw-rfe" inside, as a
 * client without UTF8=ACCEPT writes it); a name that is not valid UTF-8
 * or holds a control character is STORE_BADNAME. */
int imap_to_internal(struct imap_session *s, const char *ext,
                     struct buf *out, const char **err_r)
{
    struct buf m7 = BUF_INITIALIZER;
    int r;

    if (!s->utf8_accept)
        return imap_to_internal_ascii(s, ext, out, err_r);
    r = utf8_to_mutf7(ext, strlen(ext), &m7);
    if (r != 0) {
        buf_free(&m7);
        buf_reset(out);
        *err_r = r == -2 ? "out of memory" : "invalid UTF-8 in name";
        return r == -2 ? STORE_NOMEM : STORE_BADNAME;
    }
    r = imap_to_internal_ascii(s, buf_cstring(&m7), out, err_r);
    buf_free(&m7);
    return r;
}

/* Internal name -> client name into out: imap_to_external_ascii(), and
 * after ENABLE UTF8=ACCEPT its modified UTF-7 as UTF-8.  A stored name
 * that is no canonical modified UTF-7 ("AT&T", written by a client that
 * did not encode it) is sent as it is. */
static int imap_to_external_ascii(struct imap_session *s, const char *name,
                                  struct buf *out);

int imap_to_external(struct imap_session *s, const char *name,
                     struct buf *out)
{
    struct buf u8 = BUF_INITIALIZER;
    int r = imap_to_external_ascii(s, name, out);

    if (r != STORE_OK || !s->utf8_accept || out->len == 0 ||
        !memchr(out->s, '&', out->len))
        return r;
    if (utf8_from_mutf7(out->s, out->len, &u8) == 0)
        buf_setmap(out, u8.s, u8.len);
    buf_free(&u8);
    return r;
}

/* Internal name -> client name into out.  STORE_OK, or STORE_BADNAME (a
 * name the session cannot see: another domain's for all but a global
 * admin). */
static int imap_to_external_ascii(struct imap_session *s, const char *name,
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
    if (s->srv->policy.virtdomains == USERID_VIRTDOMAINS_OFF)
        return mboxname_to_external(name, s->srv->unixsep, out);
    return mboxname_to_external_for(name, s->srv->unixsep, s->domain,
                                    s->global_admin, out);
}

/* The session's rights on mailbox `name` with ACL `acl`: `admins` count
 * only where the user administers (imap_admin_for). */
int imap_rights(struct imap_session *s, const char *name,
                       const char *acl)
{
    return acl_rights(acl, s->userid,
                      imap_admin_for(s, name) ? s->srv->admins : NULL);
}

/* Look a mailbox up for an operation needing `need` rights.  STORE_OK
 * and *e_r; STORE_NOTFOUND also when the user lacks l; STORE_PERMISSION
 * when l is there and need is not. */
int imap_lookup(struct imap_session *s, const char *name, int need,
                       struct mboxlist_entry **e_r)
{
    struct mboxlist *ml = imap_ml(s->srv);
    int r, rights;

    *e_r = NULL;
    if (!ml)
        return STORE_IOERROR;
    if (!imap_reachable(s, name))
        return STORE_NOTFOUND;
    r = mboxlist_lookup(ml, name, e_r);
    if (r != STORE_OK)
        return r;
    rights = imap_rights(s, name, (*e_r)->acl);
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
    const char *rest = name;
    size_t dlen = 0, base;
    char *dot;
    int r = STORE_PERMISSION;

    buf_reset(acl);
    if (!ml)
        return STORE_IOERROR;
    if (!imap_reachable(s, name))
        return STORE_PERMISSION;
    /* ancestors stay in the name's domain: "D!user.a" -> "D!user" */
    (void)mboxname_domain(name, &dlen, &rest);
    base = (size_t)(rest - name);
    buf_setcstr(&parent, name);
    while ((dot = strrchr(buf_cstring(&parent), '.')) != NULL &&
           (size_t)(dot - parent.s) > base) {
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
        if (imap_rights(s, e->name, e->acl) & ACL_CREATE) {
            buf_setcstr(acl, e->acl ? e->acl : "");
            r = STORE_OK;
        }
        mboxlist_entry_free(&e);
        goto out;
    }
    /* no ancestor exists */
    if (imap_admin_for(s, name) || (s->inbox.len &&
                     mboxname_is_self_or_child(buf_cstring(&s->inbox), name) &&
                     strcmp(name, buf_cstring(&s->inbox)) != 0))
        r = STORE_OK;
out:
    buf_free(&parent);
    return r;
}

/* The name argument without one trailing separator ("foo/" -> "foo"). */
const char *imap_strip_sep(struct imap_session *s, const char *ext,
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

/* The domain of the local address the client connected to, for
 * `virtdomains: on` (localdomain.h), looked up once per connection; NULL
 * when there is none or it is no valid domain name. */
static const char *imap_serverdomain(struct imap_session *s)
{
    if (!s->serverdomain_known) {
        struct buf raw = BUF_INITIALIZER;
        const char *err = NULL;

        s->serverdomain_known = 1;
        buf_reset(&s->serverdomain);
        if (localdomain_lookup(s->conn->fd, &raw) == 0 &&
            mboxname_domain_check(raw.s, raw.len, &s->serverdomain,
                                  &err) != STORE_OK) {
            log_info("imap: local address name gives no domain "
                     "domain=<%s> error=<%s>", buf_cstring(&raw),
                     err ? err : "invalid");
            buf_reset(&s->serverdomain);
        }
        buf_free(&raw);
    }
    return s->serverdomain.len ? buf_cstring(&s->serverdomain) : NULL;
}

/* SASL's canon function (saslserver_new_canon): a login name becomes the
 * internal user id (store/userid.h) before the password is checked, so
 * "alice@Example.COM" is checked (and logged in) as "alice@example.com"
 * and, with `virtdomains: on`, "alice" as "alice@SERVERDOMAIN".
 *
 * A name that is no valid user id is noted in s->canon_error and handed
 * back as it came (NUL bytes as '?'): the exchange goes on, and whatever
 * SASL says, the login is refused with "Invalid user name".  Failing
 * here instead would make SASL's LOGIN mechanism leak the password
 * buffer it allocated before canonicalizing. */
static const char *imap_sasl_serverdomain(void *rock)
{
    return imap_serverdomain(rock);
}

static int imap_sasl_canon(void *rock, const char *in, size_t len,
                         struct buf *out, const char **error_r)
{
    struct imap_session *s = rock;

    return userid_canon_login(&s->srv->policy, in, len,
                              imap_sasl_serverdomain, s, out,
                              &s->canon_error, error_r);
}

static void imap_sasl_reset(struct imap_session *s)
{
    saslserver_free(&s->sasl);
    if (s->srv->sasl_ok)
        s->sasl = saslserver_new_canon("imap", s->conn->localaddr,
                                       s->conn->remoteaddr,
                                       prot_tls_ssf(s->p), imap_sasl_canon,
                                       s);
}

/* The state after a successful authentication. */
/* The text of the tagged NO for imap_login_done()'s failure r. */
static const char *imap_login_refusal(int r)
{
    return r == -2 ? "[UNAVAILABLE] Mailbox is being moved to another "
                     "server, try again later"
                   : "[UNAVAILABLE] Out of memory";
}

/* 1 (logged) when a move takes user away from this backend or took it
 * (store/userstate.h); admins are never held back. */
static int imap_user_moved(struct imap_session *s, const char *user)
{
    struct buf where = BUF_INITIALIZER;
    enum userstate st;

    if (acl_rights("", user, s->srv->admins) & ACL_ADMIN)
        return 0;
    st = userstate_get(s->srv->conf, user, &where);
    if (st != USERSTATE_HERE)
        log_info("imap: user is %s user=<%s> backend=<%s> peer=<%s>",
                 userstate_name(st), user, buf_cstring(&where),
                 s->conn->peer);
    buf_free(&where);
    return st != USERSTATE_HERE;
}

/* The state after a successful authentication: 0, -1 out of memory, -2
 * the user is being moved away or has moved (no session here). */
static int imap_login_done(struct imap_session *s, const char *user,
                           const char *mech)
{
    if (imap_user_moved(s, user))
        return -2;
    /* the user id as SASL reports it went through imap_sasl_canon() */
    s->userid = strdup(user);
    if (!s->userid)
        return -1;
    s->domain = userid_domain(s->userid);
    /* "D!user.U", a '.' of the login name being '^' */
    if (userid_inbox(s->userid, &s->inbox) != STORE_OK)
        buf_reset(&s->inbox);
    s->admin = (acl_rights("", s->userid, s->srv->admins) & ACL_ADMIN) != 0;
    s->global_admin = s->admin && !s->domain;
    s->state = IMAP_AUTH;
    metrics_count(METRICS_IMAP_LOGINS_OK, 1);
    /* autocreate_quota: the INBOX at the first login, not for admins,
     * as in Cyrus (a failure is logged; the session goes on without an
     * INBOX, as before) */
    if (s->inbox.len && !s->admin && imap_ml(s->srv))
        (void)autocreate_inbox(s->srv->conf, s->srv->ml, s->userid,
                               buf_cstring(&s->inbox), NULL);
    prot_settimeout(s->p, s->srv->timeout);    /* the autologout from now */
    log_info("imap: login user=<%s> mech=<%s> peer=<%s> tls=<%s>%s%s%s%s",
             s->userid, mech, s->conn->peer,
             prot_tls_info(s->p) ? prot_tls_info(s->p) : "none",
             s->global_admin ? " admin=<yes>" :
             s->admin ? " admin=<domain>" : "",
             saslserver_proxy(s->sasl) ? " proxy=<" : "",
             saslserver_proxy(s->sasl) ? saslserver_proxy(s->sasl) : "",
             saslserver_proxy(s->sasl) ? ">" : "");
    return 0;
}

/* A frontend (imap_proxy): the user is authenticated here; open the
 * session on the user's backend and relay it to its end (imapd/proxy.h).
 * A backend that cannot be reached fails the login with NO, and the
 * client may try again. */
static void imap_proxy_login(struct imap_session *s, const char *mech)
{
    struct buf caps = BUF_INITIALIZER, reply = BUF_INITIALIZER;
    const char *user = saslserver_user(s->sasl), *backend = NULL;

    if (imap_proxy_open(s->srv->proxy, user, &caps, &backend, &reply) != 0) {
        imap_tagged(s, "NO", "%s", buf_cstring(&reply));
        metrics_count(METRICS_IMAP_LOGINS_FAILED, 1);
        imap_sasl_reset(s);
        goto out;
    }
    s->userid = strdup(user);
    if (!s->userid) {
        imap_tagged(s, "NO", "[UNAVAILABLE] Out of memory");
        imap_sasl_reset(s);
        goto out;
    }
    s->state = IMAP_AUTH;
    metrics_count(METRICS_IMAP_LOGINS_OK, 1);
    log_info("imap: login user=<%s> mech=<%s> peer=<%s> tls=<%s> "
             "backend=<%s>", s->userid, mech, s->conn->peer,
             prot_tls_info(s->p) ? prot_tls_info(s->p) : "none", backend);
    imap_tagged(s, "OK", "[CAPABILITY %s] Success (%s)", buf_cstring(&caps),
                prot_is_tls(s->p) ? "tls protection" : "no protection");
    if (prot_flush(s->p) != PROT_OK)
        s->end_reason = "disconnect";
    else
        s->end_reason = imap_proxy_relay(s->srv->proxy, s->p, s->conn->fd,
                                         s->srv->timeout);
    s->quit = 1;
out:
    buf_free(&caps);
    buf_free(&reply);
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
    s->canon_error = NULL;
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
        if (gr == PROT_TIMEOUT) {
            prot_puts(s->p, "* BYE Autologout; idle for too long\r\n");
            s->end_reason = "autologout";
        }
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
    if (r == SASLSERVER_DONE && s->canon_error) {
        imap_tagged(s, "NO", "[AUTHENTICATIONFAILED] Invalid user name: %s",
                    s->canon_error);
        metrics_count(METRICS_IMAP_LOGINS_FAILED, 1);
        log_info("imap: authentication refused mech=<%s> peer=<%s> "
                 "error=<invalid user name: %s>", mech, s->conn->peer,
                 s->canon_error);
        imap_sasl_reset(s);
        goto out;
    }
    if (r == SASLSERVER_DONE && saslserver_user(s->sasl) && s->srv->proxy) {
        imap_proxy_login(s, mech);
        goto out;
    }
    if (r == SASLSERVER_DONE && saslserver_user(s->sasl)) {
        int lr = imap_login_done(s, saslserver_user(s->sasl), mech);

        if (lr != 0) {
            imap_tagged(s, "NO", "%s", imap_login_refusal(lr));
            imap_sasl_reset(s);
            goto out;
        }
        imap_auth_ok(s);
        goto out;
    }
    switch (r) {
    case SASLSERVER_FAIL:
        metrics_count(METRICS_IMAP_LOGINS_FAILED, 1);
        if (s->canon_error)
            imap_tagged(s, "NO", "[AUTHENTICATIONFAILED] Invalid user "
                                 "name: %s", s->canon_error);
        else
            imap_tagged(s, "NO", "[AUTHENTICATIONFAILED] Authentication "
                                 "failed");
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
    log_info("imap: authentication failed mech=<%s> peer=<%s> error=<%s%s>",
             mech, s->conn->peer,
             s->canon_error ? "invalid user name: " : "",
             s->canon_error ? s->canon_error :
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
    s->canon_error = NULL;
    r = saslserver_start(s->sasl, "PLAIN", buf_cstring(&b64), &chal);
    memset(b64.s, 0, b64.len);
    if (r == SASLSERVER_DONE && !s->canon_error && saslserver_user(s->sasl)
        && s->srv->proxy) {
        imap_proxy_login(s, "LOGIN");
    } else if (r == SASLSERVER_DONE && !s->canon_error &&
               saslserver_user(s->sasl)) {
        int lr = imap_login_done(s, saslserver_user(s->sasl), "LOGIN");

        if (lr != 0) {
            imap_tagged(s, "NO", "%s", imap_login_refusal(lr));
            imap_sasl_reset(s);
        } else {
            imap_auth_ok(s);
        }
    } else {
        if ((r == SASLSERVER_FAIL || r == SASLSERVER_DONE) && s->canon_error)
            imap_tagged(s, "NO", "[AUTHENTICATIONFAILED] Invalid user "
                                 "name: %s", s->canon_error);
        else if (r == SASLSERVER_FAIL || r == SASLSERVER_CONTINUE)
            imap_tagged(s, "NO", "[AUTHENTICATIONFAILED] Authentication "
                                 "failed");
        else
            imap_tagged(s, "NO", "[UNAVAILABLE] Temporary authentication "
                                 "failure");
        metrics_count(METRICS_IMAP_LOGINS_FAILED, 1);
        log_info("imap: login failed peer=<%s> error=<%s%s>", s->conn->peer,
                 s->canon_error ? "invalid user name: " : "",
                 s->canon_error ? s->canon_error :
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

/* COMPRESS DEFLATE (RFC 4978): the OK goes out plain, everything after
 * it is deflated both ways (lib/prot.h); under TLS, inside TLS. */
static void imap_cmd_compress(struct imap_session *s)
{
    if (strcmp(s->cmd.arg[0], "DEFLATE") != 0) {
        imap_tagged(s, "BAD", "Unknown compression mechanism");
        return;
    }
    if (prot_is_compressed(s->p)) {
        imap_tagged(s, "NO", "[COMPRESSIONACTIVE] DEFLATE active already");
        return;
    }
    imap_tagged(s, "OK", "DEFLATE active");
    if (prot_compress_start(s->p) != PROT_OK) {
        log_error("imap: cannot start compression peer=<%s> error=<%s>",
                  s->conn->peer, prot_error(s->p));
        s->quit = 1;
        return;
    }
    log_info("imap: compression user=<%s> peer=<%s> mech=<DEFLATE>",
             s->userid ? s->userid : "", s->conn->peer);
}

/* ---- LIST / LSUB (list.c) -------------------------------------------- */

static int imap_cb_to_external(void *rock, const char *name, struct buf *out)
{
    return imap_to_external(rock, name, out);
}

static int imap_cb_visible(void *rock, const char *name, const char *acl)
{
    struct imap_session *s = rock;

    return imap_reachable(s, name) &&
           (imap_rights(s, name, acl) & ACL_LOOKUP) != 0;
}

static int imap_status_send(struct imap_session *s, const char *ext,
                            const char *name,
                            const struct imapparse_status *items);

static int imap_cb_status(void *rock, const char *ext, const char *name,
                          const struct imapparse_status *items)
{
    return imap_status_send(rock, ext, name, items);
}

/* "* MYRIGHTS name rights": the session's rights, as acl.h writes them */
static void imap_cb_myrights(void *rock, const char *ext, const char *name,
                             const char *acl)
{
    struct imap_session *s = rock;
    char letters[12];

    prot_puts(s->p, "* MYRIGHTS ");
    imap_quoted(s->p, ext);
    prot_printf(s->p, " \"%s\"\r\n",
                acl_rights_string(imap_rights(s, name, acl), letters));
}

static void imap_cb_tagged(void *rock, const char *status, const char *text)
{
    imap_tagged(rock, status, "%s", text);
}

static void imap_cb_store_no(void *rock, int r)
{
    imap_store_no(rock, r);
}

static void imap_list_session(struct imap_session *s,
                              struct imaplist_session *ls)
{
    memset(ls, 0, sizeof(*ls));
    ls->rock = s;
    ls->p = s->p;
    ls->conf = s->srv->conf;
    ls->userid = s->userid;
    ls->inbox = buf_cstring(&s->inbox);
    ls->sep = s->srv->sep;
    ls->to_external = imap_cb_to_external;
    ls->visible = imap_cb_visible;
    ls->status = imap_cb_status;
    ls->myrights = imap_cb_myrights;
    ls->tagged = imap_cb_tagged;
    ls->store_no = imap_cb_store_no;
}

static void imap_cmd_list(struct imap_session *s, int lsub)
{
    struct imaplist_session ls;

    if (!lsub && (s->cmd.list.ret & IMAPPARSE_LRET_MYRIGHTS) &&
        !IMAP_HAVE_ACL) {
        imap_tagged(s, "BAD", "RETURN (MYRIGHTS) needs the ACL extension, "
                              "not offered");
        return;
    }
    imap_list_session(s, &ls);
    if (lsub)
        imaplist_cmd_lsub(&ls, imap_ml(s->srv), &s->cmd);
    else
        imaplist_cmd_list(&ls, imap_ml(s->srv), &s->cmd);
}

static int imap_subs_open(struct imap_session *s, struct subs_db **sub_r)
{
    int r = subs_open(s->srv->conf, s->userid, sub_r);

    if (r != STORE_OK)
        log_error("imap: cannot open subscriptions user=<%s> error=<%s>",
                  s->userid, store_strerror(r));
    return r;
}

/* ---- mailbox management ---------------------------------------------- */

/* Convert cmd.arg[i]; on failure answer NO and return -1. */
int imap_name_arg(struct imap_session *s, int i, struct buf *out)
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
    struct buf uses = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    const char *bad = NULL;
    int r;

    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    /* CREATE-SPECIAL-USE (RFC 6154 3): known attributes, on the user's
     * own mailboxes only (list.h says why) */
    if (s->cmd.use_set &&
        imaplist_specialuse_list(&s->cmd.use, &uses, &bad) != 0) {
        imap_tagged(s, "NO", "[USEATTR] Unsupported special-use attribute "
                             "%.40s", bad);
        goto out;
    }
    if (uses.len && !(s->inbox.len &&
                      mboxname_is_self_or_child(buf_cstring(&s->inbox),
                                                buf_cstring(&name)))) {
        imap_tagged(s, "NO", "[USEATTR] Special use is only for mailboxes "
                             "below your INBOX");
        goto out;
    }
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
        r = mboxlist_create_special(s->srv->ml, buf_cstring(&name), NULL,
                                    acl.len ? buf_cstring(&acl) : NULL,
                                    uses.len ? buf_cstring(&uses) : NULL,
                                    NULL);
    if (r == STORE_PERMISSION) {
        imap_tagged(s, "NO", "[NOPERM] Permission denied");
    } else if (r == STORE_EXISTS) {
        imap_tagged(s, "NO", "[NOPERM] Permission denied");
    } else if (r != STORE_OK) {
        imap_store_no(s, r);
    } else {
        struct buf owner = BUF_INITIALIZER;

        log_info("imap: created mailbox=<%s> user=<%s> specialuse=<%s>",
                 buf_cstring(&name), s->userid, buf_cstring(&uses));
        /* a user placed here again (it had moved away) is here now */
        if (admincmd_is_user_inbox(buf_cstring(&name), &owner))
            (void)userstate_set(s->srv->conf, buf_cstring(&owner),
                                USERSTATE_HERE, NULL);
        buf_free(&owner);
        imap_tagged(s, "OK", "CREATE completed");
    }
out:
    buf_free(&name);
    buf_free(&acl);
    buf_free(&uses);
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
    if (r == STORE_OK && imap_admin_for(s, buf_cstring(&name)) &&
        admincmd_is_user_inbox(buf_cstring(&name), NULL)) {
        /* an admin deleting a user's INBOX deletes the user */
        admincmd_delete_user(s, buf_cstring(&name));
        goto out;
    }
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
    if (!imap_same_domain(buf_cstring(&oldn), buf_cstring(&newn))) {
        imap_tagged(s, "NO", "[CANNOT] Cannot rename a mailbox into "
                             "another domain");
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
    if (r == STORE_OK && imap_admin_for(s, buf_cstring(&oldn)) &&
        admincmd_is_user_inbox(buf_cstring(&oldn), NULL)) {
        /* an admin renaming a user's INBOX renames the user */
        admincmd_rename_user(s, buf_cstring(&oldn), buf_cstring(&newn));
        goto out;
    }
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

/* ---- seen state ------------------------------------------------------ */

/* The user's seen file, opened at the first use. */
static int imap_seendb(struct imap_session *s, struct seen_db **db_r)
{
    int r = STORE_OK;

    if (!s->seendb)
        r = seen_open(s->srv->conf, s->userid, &s->seendb);
    if (r != STORE_OK) {
        log_error("imap: cannot open the seen state user=<%s> error=<%s>",
                  s->userid, store_strerror(r));
        s->seendb = NULL;
    }
    *db_r = s->seendb;
    return r;
}

/* Read the user's seen state of the mailbox with unique id `uniqueid`
 * into *d.  A value that does not parse counts as nothing seen. */
static int imap_seen_read(struct imap_session *s, const char *uniqueid,
                          struct seen_data *d)
{
    struct seen_db *db;
    int r = imap_seendb(s, &db);

    if (r == STORE_OK)
        r = seen_read(db, uniqueid, d);
    if (r == STORE_CORRUPT)
        r = STORE_OK;           /* logged; *d is zeroed */
    return r;
}

/* Reread s->seen from the seen file (another session of the user may
 * have changed it); changes not yet written are forgotten.  On error the
 * old state stays (logged). */
static int imap_seen_reload(struct imap_session *s)
{
    int r;

    s->nseenchg = 0;
    if (!s->sel_useseen)
        return STORE_OK;
    r = imap_seen_read(s, mailbox_uniqueid(s->sel), &s->seen);
    if (r != STORE_OK)
        log_error("imap: cannot read the seen state user=<%s> mailbox=<%s> "
                  "error=<%s>", s->userid, mailbox_name(s->sel),
                  store_strerror(r));
    return r;
}

/* seen_update() callback: replay the session's changes on the state as
 * stored now, so that another session's changes made meanwhile stay. */
static int imap_seen_replay(struct seen_data *d, void *rock)
{
    struct imap_session *s = rock;
    int r = STORE_OK;

    for (size_t k = 0; k < s->nseenchg && r == STORE_OK; k++)
        r = seen_set_update(&d->seenuids, s->seenchg[k].uid,
                            s->seenchg[k].add);
    d->lastchange = time(NULL);
    return r;
}

/* Write the session's \Seen changes (imap_seen_set()) to the seen file in
 * one locked read-modify-write, and take the result as s->seen. */
static int imap_seen_write(struct imap_session *s)
{
    struct seen_db *db;
    int r = imap_seendb(s, &db);

    if (r == STORE_OK)
        r = seen_update(db, mailbox_uniqueid(s->sel), imap_seen_replay, s,
                        &s->seen);
    s->nseenchg = 0;
    if (r != STORE_OK)
        log_error("imap: cannot write the seen state user=<%s> "
                  "mailbox=<%s> error=<%s>", s->userid,
                  mailbox_name(s->sel), store_strerror(r));
    return r;
}

/* Does mailbox mb keep \Seen in the seen state (it has a unique id)? */
int imap_mb_useseen(struct mailbox *mb)
{
    const char *u = mailbox_uniqueid(mb);

    return u && *u;
}

struct imap_seen_uids {
    const uint32_t *uids;
    size_t n;
    uint32_t claim;     /* in: claim \Recent up to this uid (0: no) */
    uint32_t from;      /* out: the watermark before a claim made */
    int claimed;
};

/* seen_update() callback: add the uids; with u->claim also move the
 * \Recent watermark up to it (imap_recent_claim_cb's claim, made in the
 * same write). */
static int imap_seen_adduids(struct seen_data *d, void *rock)
{
    struct imap_seen_uids *u = rock;
    int r = STORE_OK;

    for (size_t k = 0; k < u->n && r == STORE_OK; k++)
        r = seen_set_update(&d->seenuids, u->uids[k], 1);
    d->lastchange = time(NULL);
    u->claimed = 0;
    if (r == STORE_OK && u->claim > d->lastuid) {
        u->from = d->lastuid;
        d->lastuid = u->claim;
        u->claimed = 1;
    }
    return r;
}

/* Add uids[0..n-1] to the user's seen state of mb (APPEND and COPY with
 * \Seen).  Logged on error: the messages are in, only \Seen is lost.
 * Into the selected mailbox of a read-write session the same write
 * claims the new messages as \Recent (the claim the update before the
 * reply would make with a second write of the seen file): the range
 * claimed is kept for imap_recent_mark(). */
void imap_seen_add_uids(struct imap_session *s, struct mailbox *mb,
                        const uint32_t *uids, size_t n)
{
    struct imap_seen_uids u = { uids, n, 0, 0, 0 };
    struct seen_db *db;
    int r;

    if (n == 0)
        return;
    if (mb == s->sel && s->sel_useseen && !s->sel_readonly) {
        for (size_t k = 0; k < n; k++)
            if (uids[k] > u.claim)
                u.claim = uids[k];
    }
    r = imap_seendb(s, &db);
    if (r == STORE_OK)
        r = seen_update(db, mailbox_uniqueid(mb), imap_seen_adduids, &u,
                        NULL);
    if (r != STORE_OK) {
        log_error("imap: \\Seen of new messages lost user=<%s> "
                  "mailbox=<%s> error=<%s>", s->userid, mailbox_name(mb),
                  store_strerror(r));
        return;
    }
    if (u.claimed) {
        /* ranges merge only when nobody claimed in between */
        if (s->claim_upto == 0 || s->claim_upto < u.from)
            s->claim_from = u.from;
        s->claim_upto = u.claim;
    }
}

/* The record's flags as this user sees them: \Seen from the seen state. */
static void imap_rec_seen(struct imap_session *s, struct mailbox_record *rec)
{
    if (!s->sel_useseen)
        return;
    rec->flags &= ~(uint32_t)MAILBOX_FLAG_SEEN;
    if (seen_set_contains(buf_cstring(&s->seen.seenuids), rec->uid))
        rec->flags |= MAILBOX_FLAG_SEEN;
}

/* Set (add != 0) or clear uid's \Seen in s->seen, and note the change
 * for imap_seen_write(). */
static int imap_seen_set(struct imap_session *s, uint32_t uid, int add)
{
    int r;

    if (s->nseenchg == s->seenchg_alloc) {
        size_t na = s->seenchg_alloc ? s->seenchg_alloc * 2 : 16;
        struct imap_seen_chg *nc = realloc(s->seenchg, na * sizeof(*nc));

        if (!nc)
            return STORE_NOMEM;
        s->seenchg = nc;
        s->seenchg_alloc = na;
    }
    r = seen_set_update(&s->seen.seenuids, uid, add);
    if (r == STORE_CORRUPT) {
        buf_reset(&s->seen.seenuids);   /* unreadable: start afresh */
        r = seen_set_update(&s->seen.seenuids, uid, add);
    }
    if (r == STORE_OK) {
        s->seenchg[s->nseenchg].uid = uid;
        s->seenchg[s->nseenchg].add = add;
        s->nseenchg++;
    }
    return r;
}

/* Write "* STATUS ext (items)" for mailbox `name` (internal): needs the
 * r right.  STORE_OK, or a store code with nothing written. */
static int imap_status_send(struct imap_session *s, const char *ext,
                            const char *name,
                            const struct imapparse_status *items)
{
    struct mboxlist_entry *e = NULL;
    struct mailbox *mb = NULL;
    struct mailbox_header h;
    struct seen_data sd = { 0, 0, 0, BUF_INITIALIZER };
    uint32_t unseen = 0, recent = 0, deleted = 0;
    uint64_t deleted_bytes = 0;     /* DELETED-STORAGE (RFC 9208) */
    uint64_t size = 0;              /* SIZE (RFC 8438) */
    int r, locked = 0, useseen = 0;

    r = imap_lookup(s, name, ACL_READ, &e);
    if (r == STORE_OK)
        r = mailbox_open(s->srv->conf, e->name, e->partition, &mb);
    if (r == STORE_OK && mailbox_uniqueid(mb) && *mailbox_uniqueid(mb)) {
        useseen = 1;
        r = imap_seen_read(s, mailbox_uniqueid(mb), &sd);
    }
    if (r == STORE_OK)
        r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        locked = 1;
        h = *mailbox_get_header(mb);
        for (uint32_t i = 0; i < h.visible && r == STORE_OK; i++) {
            struct mailbox_record rec;

            r = mailbox_read_record(mb, i, &rec);
            if (r != STORE_OK ||
                (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED)))
                continue;
            if (rec.flags & MAILBOX_FLAG_DELETED) {
                deleted++;
                deleted_bytes += rec.size;
            }
            size += rec.size;
            /* \Recent: not yet seen by a read-write SELECT of the user */
            if (useseen && rec.uid > sd.lastuid)
                recent++;
            if (!(useseen ? seen_set_contains(buf_cstring(&sd.seenuids),
                                              rec.uid) != 0
                          : (rec.flags & MAILBOX_FLAG_SEEN) != 0))
                unseen++;
        }
    }
    if (locked)
        mailbox_unlock(mb);
    mailbox_close(&mb);
    seen_data_free(&sd);
    mboxlist_entry_free(&e);
    if (r != STORE_OK)
        return r;
    prot_puts(s->p, "* STATUS ");
    imap_quoted(s->p, ext);
    prot_puts(s->p, " (");
    for (size_t i = 0; i < items->n; i++) {
        if (i)
            prot_puts(s->p, " ");
        switch (items->items[i]) {
        case IMAPPARSE_STATUS_MESSAGES:
            prot_printf(s->p, "MESSAGES %u", (unsigned)h.exists);
            break;
        case IMAPPARSE_STATUS_RECENT:
            prot_printf(s->p, "RECENT %u", (unsigned)recent);
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
        case IMAPPARSE_STATUS_DELETED:
            prot_printf(s->p, "DELETED %u", (unsigned)deleted);
            break;
        case IMAPPARSE_STATUS_DELETED_STORAGE:
            /* KiB, the unit of STORAGE */
            prot_printf(s->p, "DELETED-STORAGE %llu",
                        (unsigned long long)(deleted_bytes / 1024));
            break;
        case IMAPPARSE_STATUS_SIZE:
            /* RFC 8438: the sum of the messages' RFC822.SIZE */
            prot_printf(s->p, "SIZE %llu", (unsigned long long)size);
            break;
        case IMAPPARSE_STATUS_APPENDLIMIT:
            /* RFC 7889: the same for every mailbox */
            prot_printf(s->p, "APPENDLIMIT %zu", imap_appendlimit(s->srv));
            break;
        }
    }
    prot_puts(s->p, ")\r\n");
    return STORE_OK;
}

static void imap_cmd_status(struct imap_session *s)
{
    struct buf name = BUF_INITIALIZER;
    int r;

    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    /* the name as the client gave it */
    r = imap_status_send(s, s->cmd.arg[0], buf_cstring(&name),
                         &s->cmd.status);
    if (r != STORE_OK)
        imap_store_no(s, r);
    else
        imap_tagged(s, "OK", "STATUS completed");
out:
    buf_free(&name);
}


/* ---- selected state -------------------------------------------------- */

/* Leave the selected state.  expunge: CLOSE's silent expunge of the
 * \Deleted messages (only when read-write and the user has e). */
static int imap_unselect(struct imap_session *s, int expunge)
{
    int r = STORE_OK;
    unsigned long gone = 0;

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
                    gone++;
                }
            }
            {
                int ur = mailbox_unlock(s->sel);

                if (r == STORE_OK)
                    r = ur;
                if (r == STORE_OK)
                    s->nexpunged += gone;
            }
        }
    }
    mailbox_close(&s->sel);
    seen_data_free(&s->seen);
    s->sel_useseen = 0;
    free(s->saved);
    s->saved = NULL;
    s->nsaved = 0;
    free(s->msgs);
    s->msgs = NULL;
    s->nmsgs = s->msgalloc = 0;
    s->lastuid = 0;
    s->view_known = 0;
    s->state = IMAP_AUTH;
    return r;
}

/* Append a record to the client's view.  0, or -1 out of memory. */
static int imap_msgs_push(struct imap_session *s,
                          const struct mailbox_record *rec)
{
    struct imap_msg *m;

    if (s->nmsgs == s->msgalloc) {
        size_t n = s->msgalloc ? s->msgalloc * 2 : 64;
        struct imap_msg *nm = realloc(s->msgs, n * sizeof(*nm));

        if (!nm)
            return -1;
        s->msgs = nm;
        s->msgalloc = n;
    }
    m = &s->msgs[s->nmsgs++];
    memset(m, 0, sizeof(*m));
    m->uid = rec->uid;
    m->flags = rec->flags & MAILBOX_SYSTEM_FLAGS;
    memcpy(m->uflags, rec->user_flags, sizeof(m->uflags));
    m->modseq = rec->modseq;
    if (rec->uid > s->lastuid)
        s->lastuid = rec->uid;
    return 0;
}

static void imap_send_flags(struct imap_session *s, size_t seq,
                            const struct mailbox_record *rec,
                            struct buf *out);

static void imap_cmd_select(struct imap_session *s, int examine)
{
    struct buf name = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct mailbox_header h;
    uint32_t firstunseen = 0, seq = 0;
    const struct imapparse_qresync *q = &s->cmd.qresync;
    struct buf qr = BUF_INITIALIZER, qrfetch = BUF_INITIALIZER;
    int r, rights = 0, locked = 0, resync = 0;

    /* RFC 7162 3.2.5: QRESYNC only once enabled */
    if (q->set && !s->qresync) {
        imap_tagged(s, "BAD", "QRESYNC not enabled");
        return;
    }
    /* a failed SELECT leaves the client unselected (RFC 3501 6.3.1); the
     * end of the previous mailbox's responses is marked (RFC 7162
     * 3.2.11) */
    if (s->sel)
        prot_puts(s->p, "* OK [CLOSED] Previous mailbox closed\r\n");
    imap_unselect(s, 0);
    if (q->set)
        s->condstore = 1;
    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    r = imap_lookup(s, buf_cstring(&name), ACL_READ, &e);
    if (r == STORE_OK) {
        rights = imap_rights(s, e->name, e->acl);
        r = mailbox_open(s->srv->conf, e->name, e->partition, &s->sel);
    }
    if (r == STORE_OK) {
        struct buf ipath = BUF_INITIALIZER;

        buf_printf(&ipath, "%s/%s", mailbox_dir(s->sel),
                   MAILBOX_INDEX_FNAME);
        if (stat(buf_cstring(&ipath), &s->ist) != 0)
            memset(&s->ist, 0, sizeof(s->ist));
        buf_free(&ipath);
        if (mailbox_uniqueid(s->sel) && *mailbox_uniqueid(s->sel)) {
            s->sel_useseen = 1;
            r = imap_seen_read(s, mailbox_uniqueid(s->sel), &s->seen);
        }
    }
    if (r == STORE_OK) {
        r = mailbox_lock(s->sel, MAILBOX_LOCK_SHARED);
    }
    if (r == STORE_OK) {
        locked = 1;
        h = *mailbox_get_header(s->sel);
        /* a resynchronization against the same uidvalidity: what vanished
         * and what changed since the client's modseq */
        resync = q->set && q->uidvalidity == h.uidvalidity;
        if (resync)
            r = qresync_vanished(s->sel, q->modseq,
                                 q->has_known_uids ? &q->known_uids : NULL,
                                 &qr, NULL);
        for (uint32_t i = 0; i < h.visible && r == STORE_OK; i++) {
            struct mailbox_record rec;

            r = mailbox_read_record(s->sel, i, &rec);
            if (r != STORE_OK ||
                (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED)))
                continue;
            seq++;
            imap_rec_seen(s, &rec);
            if (!firstunseen && !(rec.flags & MAILBOX_FLAG_SEEN))
                firstunseen = seq;
            if (resync && rec.modseq > q->modseq)
                imap_send_flags(s, seq, &rec, &qrfetch);
            if (imap_msgs_push(s, &rec) != 0)
                r = STORE_NOMEM;
        }
    }
    if (r == STORE_OK) {
        struct buf fl = BUF_INITIALIZER;

        imap_flags_lines(s, &fl);
        prot_write(s->p, fl.s, fl.len);
        buf_free(&fl);
    }
    if (locked)
        mailbox_unlock(s->sel);
    if (r != STORE_OK) {
        imap_unselect(s, 0);
        imap_store_no(s, r);
        goto out;
    }
    s->sel_rights = rights;
    s->sel_rights_known = 0;
    s->sel_readonly = examine ||
        !(rights & (ACL_SEEN | ACL_WRITE | ACL_DELETEMSG | ACL_EXPUNGE |
                    ACL_INSERT));
    if (s->cmd.condstore)
        s->condstore = 1;
    {
        struct buf pf = BUF_INITIALIZER;

        imap_permflags_line(s, &pf);
        prot_write(s->p, pf.s, pf.len);
        buf_free(&pf);
    }
    s->recent_base = s->seen.lastuid;
    s->claim_upto = 0;
    prot_printf(s->p, "* %zu EXISTS\r\n", s->nmsgs);
    prot_printf(s->p, "* %zu RECENT\r\n", imap_recent_mark(s));
    if (firstunseen)
        prot_printf(s->p, "* OK [UNSEEN %u] First unseen\r\n",
                    (unsigned)firstunseen);
    prot_printf(s->p, "* OK [UIDVALIDITY %u] Ok\r\n",
                (unsigned)h.uidvalidity);
    prot_printf(s->p, "* OK [UIDNEXT %u] Ok\r\n", (unsigned)h.uidnext);
    prot_printf(s->p, "* OK [HIGHESTMODSEQ %llu] Ok\r\n",
                (unsigned long long)(h.highestmodseq ? h.highestmodseq
                                                     : 1));
    if (resync && qr.len)
        prot_printf(s->p, "* VANISHED (EARLIER) %s\r\n", buf_cstring(&qr));
    if (resync && qrfetch.len)
        prot_write(s->p, qrfetch.s, qrfetch.len);
    s->state = IMAP_SELECTED;
    imap_tagged(s, "OK", "[%s] %s completed",
                s->sel_readonly ? "READ-ONLY" : "READ-WRITE",
                examine ? "EXAMINE" : "SELECT");
out:
    buf_free(&qr);
    buf_free(&qrfetch);
    mboxlist_entry_free(&e);
    buf_free(&name);
}

/* ---- the client's view and its updates ------------------------------- */

/* stat() of the selected mailbox's cyrus.index into st (zeroed on error). */
static void imap_index_stat(struct imap_session *s, struct stat *st)
{
    struct buf path = BUF_INITIALIZER;

    buf_printf(&path, "%s/%s", mailbox_dir(s->sel), MAILBOX_INDEX_FNAME);
    if (stat(buf_cstring(&path), st) != 0)
        memset(st, 0, sizeof(*st));
    buf_free(&path);
}

/* Has cyrus.index changed since the last update?  (Every change writes
 * the file: its mtime moves; cleanup replaces it: its inode changes.) */
static int imap_index_changed(struct imap_session *s)
{
    struct stat st;

    imap_index_stat(s, &st);
    return st.st_ino != s->ist.st_ino || st.st_dev != s->ist.st_dev ||
           st.st_size != s->ist.st_size ||
           st.st_mtim.tv_sec != s->ist.st_mtim.tv_sec ||
           st.st_mtim.tv_nsec != s->ist.st_mtim.tv_nsec;
}

/* The view entry of uid (binary search: the view is in uid order), or
 * NULL. */
static struct imap_msg *imap_msg_find(const struct imap_session *s,
                                      uint32_t uid)
{
    size_t lo = 0, hi = s->nmsgs;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (s->msgs[mid].uid == uid)
            return &s->msgs[mid];
        if (s->msgs[mid].uid < uid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Is uid \Recent in this session? */
static int imap_uid_recent(const struct imap_session *s, uint32_t uid)
{
    const struct imap_msg *m = imap_msg_find(s, uid);

    return m && m->recent;
}

/* search_params.recent callback (rock = the session). */
static int imap_search_recent(void *rock, uint32_t uid)
{
    return imap_uid_recent(rock, uid);
}

/* search_params.seen callback (rock = the session). */
static int imap_search_seen(void *rock, uint32_t uid)
{
    struct imap_session *s = rock;

    return seen_set_contains(buf_cstring(&s->seen.seenuids), uid) != 0;
}

struct imap_recent_claim {
    uint32_t upto;      /* in: the highest uid of the view */
    uint32_t from;      /* out: the user's watermark before the claim */
};

/* seen_update() callback: move the user's \Recent watermark (the seen
 * state's LASTUID) up to c->upto; SEEN_UPDATE_UNCHANGED when another
 * session already has them. */
static int imap_recent_claim_cb(struct seen_data *d, void *rock)
{
    struct imap_recent_claim *c = rock;

    c->from = d->lastuid;
    if (c->upto <= d->lastuid)
        return SEEN_UPDATE_UNCHANGED;
    d->lastuid = c->upto;
    return STORE_OK;
}

/* \Recent (RFC 3501 2.3.2): a message is \Recent in the first session
 * of the user that sees it in a read-write SELECT.  The claim is the
 * seen state's LASTUID, moved up under the seen file's lock, so that two
 * sessions never both get a message as \Recent.  A read-only view shows
 * as \Recent what is above the watermark it found at SELECT and claims
 * nothing.  Marks the view's entries; the number of \Recent messages. */
static size_t imap_recent_mark(struct imap_session *s)
{
    uint32_t from = s->recent_base, upto = UINT32_MAX;
    size_t n = 0;

    uint32_t cfrom = s->claim_from, cupto = s->claim_upto;

    s->recent_new = 0;
    s->claim_upto = 0;
    if (!s->sel_useseen)
        return 0;
    if (!s->sel_readonly && cupto && s->lastuid <= cupto) {
        /* everything new is at most what this session's APPEND or COPY
         * claimed already: nothing to write */
        from = cfrom;
        upto = cupto;
    } else if (!s->sel_readonly) {
        struct imap_recent_claim c = { s->lastuid, 0 };
        struct seen_db *db;
        int r = imap_seendb(s, &db);

        if (r == STORE_OK)
            r = seen_update(db, mailbox_uniqueid(s->sel),
                            imap_recent_claim_cb, &c, NULL);
        if (r != STORE_OK) {
            log_error("imap: cannot record \\Recent user=<%s> "
                      "mailbox=<%s> error=<%s>", s->userid,
                      mailbox_name(s->sel), store_strerror(r));
            from = s->lastuid;      /* nothing is claimed */
        } else {
            from = c.from;
            upto = c.upto;
        }
    }
    for (size_t i = 0; i < s->nmsgs; i++) {
        struct imap_msg *m = &s->msgs[i];

        if ((m->uid > from && m->uid <= upto) ||
            (cupto && m->uid > cfrom && m->uid <= cupto))
            m->recent = 1;
        if (m->recent && !m->gone)
            n++;
    }
    return n;
}

/* "(\Seen kw ...)" of a message's flags into out. */
static void imap_flags_text(struct imap_session *s,
                            const struct mailbox_record *rec,
                            struct buf *out)
{
    uint32_t flags = rec->flags;
    const uint32_t *uflags = rec->user_flags;
    static const struct { uint32_t bit; const char *name; } sys[] = {
        { MAILBOX_FLAG_ANSWERED, "\\Answered" },
        { MAILBOX_FLAG_FLAGGED, "\\Flagged" },
        { MAILBOX_FLAG_DELETED, "\\Deleted" },
        { MAILBOX_FLAG_SEEN, "\\Seen" },
        { MAILBOX_FLAG_DRAFT, "\\Draft" },
    };
    int first = 1;

    buf_putc(out, '(');
    for (size_t i = 0; i < sizeof(sys) / sizeof(sys[0]); i++) {
        if (flags & sys[i].bit) {
            if (!first)
                buf_putc(out, ' ');
            buf_appendcstr(out, sys[i].name);
            first = 0;
        }
    }
    if (imap_uid_recent(s, rec->uid)) {
        if (!first)
            buf_putc(out, ' ');
        buf_appendcstr(out, "\\Recent");
        first = 0;
    }
    for (int i = 0; i < MAILBOX_USER_FLAGS; i++) {
        const char *name;

        if (!(uflags[i / 32] & (1u << (i % 32))))
            continue;
        name = mailbox_user_flag_name(s->sel, i);
        if (!name)
            continue;
        if (!first)
            buf_putc(out, ' ');
        buf_appendcstr(out, name);
        first = 0;
    }
    buf_putc(out, ')');
}

/* Remember what the client was told about message m. */
static void imap_msg_told(struct imap_msg *m, const struct mailbox_record *rec)
{
    m->flags = rec->flags & MAILBOX_SYSTEM_FLAGS;
    memcpy(m->uflags, rec->user_flags, sizeof(m->uflags));
    m->modseq = rec->modseq;
}

/* "* seq FETCH (FLAGS (...) UID u [MODSEQ (m)])" */
static void imap_send_flags(struct imap_session *s, size_t seq,
                            const struct mailbox_record *rec,
                            struct buf *out)
{
    buf_printf(out, "* %zu FETCH (FLAGS ", seq);
    imap_flags_text(s, rec, out);
    buf_printf(out, " UID %u", (unsigned)rec->uid);
    if (s->condstore)
        buf_printf(out, " MODSEQ (%llu)", (unsigned long long)rec->modseq);
    buf_appendcstr(out, ")\r\n");
}

/* The FLAGS line (SELECT, and when a keyword was defined: RFC 3501
 * 7.2.6); remembers how many keywords the client now knows. */
static void imap_flags_lines(struct imap_session *s, struct buf *out)
{
    int n = 0;

    buf_appendcstr(out, "* FLAGS (\\Answered \\Flagged \\Deleted \\Seen "
                        "\\Draft");
    for (int i = 0; i < MAILBOX_USER_FLAGS; i++) {
        const char *f = mailbox_user_flag_name(s->sel, i);

        if (f) {
            buf_printf(out, " %s", f);
            n++;
        }
    }
    buf_appendcstr(out, ")\r\n");
    s->nkeywords = n;
}

/* The PERMANENTFLAGS line for the selected mailbox and the user's rights
 * there (the keywords defined and \* with the w right). */
static void imap_permflags_line(struct imap_session *s, struct buf *out)
{
    uint32_t rights = s->sel_rights;
    size_t start;

    if (s->sel_readonly) {
        buf_appendcstr(out, "* OK [PERMANENTFLAGS ()] Read-only mailbox\r\n");
        return;
    }
    /* flags separated by single spaces, none at the end (RFC 3501
     * flag-perm list) */
    buf_appendcstr(out, "* OK [PERMANENTFLAGS (");
    start = out->len;
    if (rights & ACL_WRITE)
        buf_appendcstr(out, " \\Answered \\Flagged \\Draft");
    if (rights & ACL_DELETEMSG)
        buf_appendcstr(out, " \\Deleted");
    if (rights & ACL_SEEN)
        buf_appendcstr(out, " \\Seen");
    if (rights & ACL_WRITE) {
        for (int i = 0; i < MAILBOX_USER_FLAGS; i++) {
            const char *f = mailbox_user_flag_name(s->sel, i);

            if (f)
                buf_printf(out, " %s", f);
        }
        buf_appendcstr(out, " \\*");
    }
    if (out->len > start) {
        /* drop the leading space */
        memmove(out->s + start, out->s + start + 1, out->len - start - 1);
        out->len--;
    }
    buf_appendcstr(out, ")] Ok\r\n");
}

/* Under a lock of s->sel, before any response that may name a keyword:
 * when keywords were defined since the client was last told, FLAGS and
 * PERMANENTFLAGS into out, so that no FETCH FLAGS names a keyword the
 * client has not seen announced. */
static void imap_keywords_announce(struct imap_session *s, struct buf *out)
{
    int nkw = 0;

    for (int k = 0; k < MAILBOX_USER_FLAGS; k++)
        if (mailbox_user_flag_name(s->sel, k))
            nkw++;
    if (nkw != s->nkeywords) {
        imap_flags_lines(s, out);
        imap_permflags_line(s, out);
    }
}

/* Under a lock of s->sel: compare the index with the client's view and
 * put into out FLAGS when keywords were defined, FETCH FLAGS for changed
 * messages, EXPUNGE for removed ones (when allow_expunge; else they stay
 * in the view, marked gone) and EXISTS for new ones.  (Written to the
 * client after the lock is released: a slow reader holds no lock.) */
/* Every change of a record (flags, \Seen, expunge) raises the index's
 * highest modseq, and every append its visible prefix: a header (h, read
 * under a lock of s->sel) as it was at the last pass means a view that
 * still matches the index. */
static int imap_view_matches(const struct imap_session *s,
                             const struct mailbox_header *h)
{
    return s->view_known && h->highestmodseq == s->view_hms &&
           h->visible == s->view_visible && h->uidnext == s->view_uidnext &&
           h->compactions == s->view_compactions &&
           h->uidvalidity == s->view_uidvalidity &&
           s->condstore == s->view_condstore;
}

static int imap_reconcile(struct imap_session *s, int allow_expunge,
                          struct buf *out)
{
    const struct mailbox_header *h = mailbox_get_header(s->sel);
    uint32_t visible = h->visible;
    size_t i = 0, oldn = s->nmsgs;
    int r = STORE_OK;

    imap_keywords_announce(s, out);

    /* a matching view needs no pass, unless expunges are still to be
     * told */
    if (imap_view_matches(s, h) && !(s->view_gone && allow_expunge)) {
        mailbox_version(s->sel, &s->view_version);
        return STORE_OK;
    }

    for (uint32_t recno = 0; recno < visible; recno++) {
        struct mailbox_record rec;

        r = mailbox_read_record(s->sel, recno, &rec);
        if (r != STORE_OK)
            return r;
        if (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        imap_rec_seen(s, &rec);
        /* view entries with smaller uids are gone */
        while (i < oldn && s->msgs[i].uid < rec.uid)
            s->msgs[i++].gone = 1;
        if (i < oldn && s->msgs[i].uid == rec.uid) {
            struct imap_msg *m = &s->msgs[i];

            if (!m->gone &&
                (m->flags != (rec.flags & MAILBOX_SYSTEM_FLAGS) ||
                 memcmp(m->uflags, rec.user_flags, sizeof(m->uflags)) != 0 ||
                 (s->condstore && m->modseq != rec.modseq))) {
                imap_send_flags(s, i + 1, &rec, out);
                imap_msg_told(m, &rec);
            }
            i++;
        } else if (rec.uid > s->lastuid) {
            if (imap_msgs_push(s, &rec) != 0)
                return STORE_NOMEM;
            s->recent_new = 1;
        }
    }
    while (i < oldn)
        s->msgs[i++].gone = 1;
    if (allow_expunge) {
        size_t n = s->nmsgs, w;

        if (s->qresync) {
            /* RFC 7162 3.2.10: one VANISHED with the UIDs */
            uint32_t *uids = malloc((oldn ? oldn : 1) * sizeof(*uids));
            size_t nu = 0;

            if (!uids)
                return STORE_NOMEM;
            for (size_t k = 0; k < oldn; k++)
                if (s->msgs[k].gone)
                    uids[nu++] = s->msgs[k].uid;
            if (nu) {
                buf_appendcstr(out, "* VANISHED ");
                qresync_uidset(out, uids, nu);
                buf_appendcstr(out, "\r\n");
            }
            free(uids);
        } else {
            /* descending: each number is right when its line is read */
            for (size_t k = oldn; k-- > 0;)
                if (s->msgs[k].gone)
                    buf_printf(out, "* %zu EXPUNGE\r\n", k + 1);
        }
        for (w = 0, i = 0; i < n; i++)
            if (!s->msgs[i].gone)
                s->msgs[w++] = s->msgs[i];
        s->nmsgs = w;
        if (n != oldn || w != oldn)
            buf_printf(out, "* %zu EXISTS\r\n", s->nmsgs);
    } else if (s->nmsgs != oldn) {
        buf_printf(out, "* %zu EXISTS\r\n", s->nmsgs);
    }
    s->view_gone = 0;
    for (i = 0; i < s->nmsgs && !s->view_gone; i++)
        s->view_gone = s->msgs[i].gone;
    s->view_known = 1;
    mailbox_version(s->sel, &s->view_version);
    s->view_hms = h->highestmodseq;
    s->view_visible = visible;
    s->view_uidnext = h->uidnext;
    s->view_compactions = h->compactions;
    s->view_uidvalidity = h->uidvalidity;
    s->view_condstore = s->condstore;
    return r;
}

/* Tell the client what changed in the selected mailbox (before a tagged
 * reply, on NOOP/CHECK/IDLE).  Errors are logged, not answered. */
static void imap_update(struct imap_session *s)
{
    struct buf out = BUF_INITIALIZER;
    int r, quiet;

    if (s->state != IMAP_SELECTED || !s->sel || s->in_update)
        return;
    s->in_update = 1;
    imap_index_stat(s, &s->ist);
    /* the view needs no pass when nothing it depends on moved: the index
     * (header generation, without the lock), the user's \Seen (the seen
     * state as reread now, and no local change it forgets), expunges
     * still to be told, the CONDSTORE mode */
    quiet = s->view_known && s->nseenchg == 0 &&
            !(s->view_gone && !s->no_expunge) &&
            s->condstore == s->view_condstore;
    if (quiet && s->sel_useseen)
        buf_setcstr(&s->seen_prev, buf_cstring(&s->seen.seenuids));
    imap_seen_reload(s);
    if (quiet && s->sel_useseen &&
        (s->seen.seenuids.len != s->seen_prev.len ||
         memcmp(buf_cstring(&s->seen.seenuids), buf_cstring(&s->seen_prev),
                s->seen_prev.len) != 0))
        quiet = 0;
    if (quiet && mailbox_unchanged(s->sel, &s->ist, &s->view_version)) {
        r = STORE_OK;
    } else {
        r = mailbox_lock(s->sel, MAILBOX_LOCK_SHARED);
        if (r == STORE_OK) {
            r = imap_reconcile(s, !s->no_expunge, &out);
            mailbox_unlock(s->sel);
        }
    }
    /* new messages: \Recent to this session if no other has them (the
     * claim takes the seen file's lock, never under the mailbox lock) */
    if (s->recent_new)
        buf_printf(&out, "* %zu RECENT\r\n", imap_recent_mark(s));
    if (out.len)
        prot_write(s->p, out.s, out.len);
    buf_free(&out);
    if (r != STORE_OK)
        log_error("imap: mailbox update failed mailbox=<%s> error=<%s>",
                  mailbox_name(s->sel), store_strerror(r));
    s->in_update = 0;
}

/* ---- message sets ---------------------------------------------------- */

/* Is the command's set valid for the view?  A message number beyond the
 * view, or "*" in an empty mailbox, is BAD (answered here: -1). */
static int imap_check_set(struct imap_session *s)
{
    const struct imapparse_seqset *set = &s->cmd.set;

    if (s->cmd.uid)
        return 0;
    for (size_t i = 0; i < set->n; i++) {
        uint32_t lo = set->r[i].lo, hi = set->r[i].hi;

        if (lo > s->nmsgs || hi > s->nmsgs ||
            ((lo == 0 || hi == 0) && s->nmsgs == 0)) {
            imap_tagged(s, "BAD", "Invalid message sequence number");
            return -1;
        }
    }
    return 0;
}

/* Is view entry i in the command's set (message numbers or UIDs)? */
static int imap_in_set(struct imap_session *s,
                       const struct imapparse_seqset *set, size_t i)
{
    if (s->cmd.uid)
        return imapparse_seqset_contains(set, s->msgs[i].uid, s->lastuid);
    return imapparse_seqset_contains(set, (uint32_t)(i + 1),
                                     (uint32_t)s->nmsgs);
}

/* Append a number to a compact set text ("1:3,7") being built; *prev is
 * the last number added (0 at the start), *run whether a range is open. */
void imap_set_add(struct buf *out, uint32_t n, uint32_t *prev,
                  int *run)
{
    if (*prev && n == *prev + 1) {
        *run = 1;
    } else {
        if (*run)
            buf_printf(out, ":%u", (unsigned)*prev);
        *run = 0;
        if (out->len)
            buf_putc(out, ',');
        buf_printf(out, "%u", (unsigned)n);
    }
    *prev = n;
}

void imap_set_end(struct buf *out, uint32_t prev, int run)
{
    if (run)
        buf_printf(out, ":%u", (unsigned)prev);
}

/* Find and read the record of a uid under the lock: STORE_OK, or
 * STORE_NOTFOUND when it is gone (also when expunged). */
int imap_read_uid(struct imap_session *s, struct mailbox *mb,
                  uint32_t uid, uint32_t *recno_r,
                  struct mailbox_record *rec)
{
    int r = mailbox_find_uid(mb, uid, recno_r);

    if (r == STORE_OK)
        r = mailbox_read_record(mb, *recno_r, rec);
    (void)s;
    if (r == STORE_OK &&
        (rec->flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED)))
        r = STORE_NOTFOUND;
    return r;
}

/* ---- FETCH ----------------------------------------------------------- */

/* A message file mapped read-only and parsed. */
int imap_msgfile_open(struct mailbox *mb, uint32_t uid,
                      struct imap_msgfile *mf)
{
    struct stat st;
    ssize_t n;
    int r;

    memset(mf, 0, sizeof(*mf));
    mf->fd = -1;
    r = mailbox_open_message(mb, uid, &mf->fd);
    if (r != STORE_OK)
        return r;
    /* one read: a regular file's read is short only at its end */
    mf->base = malloc(IMAP_MSGFILE_READ);
    if (!mf->base) {
        r = STORE_NOMEM;
        goto fail;
    }
    do
        n = pread(mf->fd, mf->base, IMAP_MSGFILE_READ, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        goto ioerr;
    if (n < IMAP_MSGFILE_READ) {
        mf->len = (size_t)n;
    } else {
        free(mf->base);
        mf->base = NULL;
        if (fstat(mf->fd, &st) != 0)
            goto ioerr;
        mf->len = (size_t)st.st_size;
        if (mf->len) {
            mf->base = mmap(NULL, mf->len, PROT_READ, MAP_SHARED, mf->fd,
                            0);
            if (mf->base == MAP_FAILED) {
                mf->base = NULL;
                goto ioerr;
            }
            mf->mapped = 1;
        }
    }
    if (message_parse(mf->base, mf->len, &mf->msg) != MESSAGE_OK) {
        r = STORE_NOMEM;
        goto fail;
    }
    return STORE_OK;
ioerr:
    r = STORE_IOERROR;
fail:
    if (mf->mapped)
        munmap(mf->base, mf->len);
    else
        free(mf->base);
    close(mf->fd);
    memset(mf, 0, sizeof(*mf));
    mf->fd = -1;
    return r;
}

void imap_msgfile_close(struct imap_msgfile *mf)
{
    message_free(&mf->msg);
    if (mf->mapped)
        munmap(mf->base, mf->len);
    else
        free(mf->base);
    if (mf->fd >= 0)
        close(mf->fd);
    memset(mf, 0, sizeof(*mf));
    mf->fd = -1;
}

static int imap_att_needs_msg(const struct imapparse_fetch_att *a)
{
    switch (a->kind) {
    case IMAPPARSE_FETCH_ENVELOPE:
    case IMAPPARSE_FETCH_BODY:
    case IMAPPARSE_FETCH_BODYSTRUCTURE:
    case IMAPPARSE_FETCH_RFC822:
    case IMAPPARSE_FETCH_RFC822_HEADER:
    case IMAPPARSE_FETCH_RFC822_TEXT:
    case IMAPPARSE_FETCH_SECTION:
    case IMAPPARSE_FETCH_BINARY:
    case IMAPPARSE_FETCH_BINARY_SIZE:
        return 1;
    default:
        return 0;
    }
}

static int imap_att_sets_seen(const struct imapparse_fetch_att *a)
{
    return ((a->kind == IMAPPARSE_FETCH_SECTION ||
             a->kind == IMAPPARSE_FETCH_BINARY) && !a->peek) ||
           a->kind == IMAPPARSE_FETCH_RFC822 ||
           a->kind == IMAPPARSE_FETCH_RFC822_TEXT;
}

/* imap_fetch_att()'s answer for a BINARY item whose transfer encoding
 * cannot be undone (RFC 3516: NO [UNKNOWN-CTE]); no STORE_* code. */
#define IMAP_UNKNOWN_CTE (-100)

/* BINARY[...]<o> and BINARY.SIZE[...] (RFC 3516) into out.  The data is
 * a literal8 ~{n} when the bytes sent hold NUL, else a literal; NIL (size
 * 0) for a section that does not exist. */
static int imap_fetch_binary(const struct imapparse_fetch_att *a,
                             const struct message *msg, struct buf *out)
{
    struct buf dec = BUF_INITIALIZER;
    int exists = 0;
    int r = message_get_binary(msg, a->parts, a->nparts, &dec, &exists);

    if (r == MESSAGE_OK && a->kind == IMAPPARSE_FETCH_BINARY_SIZE) {
        buf_printf(out, "BINARY.SIZE[%s] %zu", a->section, dec.len);
    } else if (r == MESSAGE_OK) {
        size_t origin = a->partial ? a->origin : 0, n = 0;

        buf_printf(out, "BINARY[%s]", a->section);
        if (a->partial)
            buf_printf(out, "<%u>", (unsigned)a->origin);
        if (!exists) {
            buf_appendcstr(out, " NIL");
        } else {
            if (origin < dec.len) {
                n = dec.len - origin;
                if (a->partial && a->count < n)
                    n = a->count;
            }
            if (buf_printf(out, " %s{%zu}\r\n",
                           n && memchr(dec.s + origin, '\0', n) ? "~" : "",
                           n) < 0 ||
                (n && buf_append(out, dec.s + origin, n) < 0))
                r = MESSAGE_NOMEM;
        }
    }
    buf_free(&dec);
    return r;
}

/* One FETCH item into out. */
static int imap_fetch_att(struct imap_session *s,
                          const struct imapparse_fetch_att *a,
                          const struct mailbox_record *rec,
                          const struct imap_msgfile *mf, struct buf *out)
{
    static const char *const mon[] = { "Jan", "Feb", "Mar", "Apr", "May",
        "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };
    struct message_section sec;
    time_t t;
    struct tm tm;
    int r = MESSAGE_OK;

    memset(&sec, 0, sizeof(sec));
    switch (a->kind) {
    case IMAPPARSE_FETCH_FLAGS:
        buf_appendcstr(out, "FLAGS ");
        imap_flags_text(s, rec, out);
        break;
    case IMAPPARSE_FETCH_INTERNALDATE:
        t = (time_t)rec->internaldate;
        if (!gmtime_r(&t, &tm))
            memset(&tm, 0, sizeof(tm));
        buf_printf(out, "INTERNALDATE \"%02d-%s-%04d %02d:%02d:%02d +0000\"",
                   tm.tm_mday, mon[tm.tm_mon % 12], tm.tm_year + 1900,
                   tm.tm_hour, tm.tm_min, tm.tm_sec);
        break;
    case IMAPPARSE_FETCH_RFC822_SIZE:
        buf_printf(out, "RFC822.SIZE %u", (unsigned)rec->size);
        break;
    case IMAPPARSE_FETCH_UID:
        buf_printf(out, "UID %u", (unsigned)rec->uid);
        break;
    case IMAPPARSE_FETCH_MODSEQ:
        buf_printf(out, "MODSEQ (%llu)", (unsigned long long)rec->modseq);
        break;
    case IMAPPARSE_FETCH_ENVELOPE:
        buf_appendcstr(out, "ENVELOPE ");
        r = message_write_envelope(mf->msg, out);
        break;
    case IMAPPARSE_FETCH_BODY:
        buf_appendcstr(out, "BODY ");
        r = message_write_body(mf->msg, 0, out);
        break;
    case IMAPPARSE_FETCH_BODYSTRUCTURE:
        buf_appendcstr(out, "BODYSTRUCTURE ");
        r = message_write_body(mf->msg, 1, out);
        break;
    case IMAPPARSE_FETCH_RFC822:
        buf_appendcstr(out, "RFC822 ");
        sec.kind = MESSAGE_SECTION_CONTENT;
        r = message_write_section(mf->msg, &sec, 0, SIZE_MAX, out);
        break;
    case IMAPPARSE_FETCH_RFC822_HEADER:
        buf_appendcstr(out, "RFC822.HEADER ");
        sec.kind = MESSAGE_SECTION_HEADER;
        r = message_write_section(mf->msg, &sec, 0, SIZE_MAX, out);
        break;
    case IMAPPARSE_FETCH_RFC822_TEXT:
        buf_appendcstr(out, "RFC822.TEXT ");
        sec.kind = MESSAGE_SECTION_TEXT;
        r = message_write_section(mf->msg, &sec, 0, SIZE_MAX, out);
        break;
    case IMAPPARSE_FETCH_SECTION:
        sec.part = a->parts;
        sec.npart = a->nparts;
        switch (a->text) {
        case IMAPPARSE_SECTION_HEADER:
            sec.kind = MESSAGE_SECTION_HEADER; break;
        case IMAPPARSE_SECTION_HEADER_FIELDS:
            sec.kind = MESSAGE_SECTION_HEADER_FIELDS; break;
        case IMAPPARSE_SECTION_HEADER_FIELDS_NOT:
            sec.kind = MESSAGE_SECTION_HEADER_FIELDS_NOT; break;
        case IMAPPARSE_SECTION_TEXT:
            sec.kind = MESSAGE_SECTION_TEXT; break;
        case IMAPPARSE_SECTION_MIME:
            sec.kind = MESSAGE_SECTION_MIME; break;
        default:
            sec.kind = MESSAGE_SECTION_CONTENT; break;
        }
        sec.fields = a->fields.s;
        sec.nfields = a->fields.n;
        buf_printf(out, "BODY[%s]", a->section ? a->section : "");
        if (a->partial)
            buf_printf(out, "<%u>", (unsigned)a->origin);
        buf_putc(out, ' ');
        r = message_write_section(mf->msg, &sec,
                                  a->partial ? a->origin : 0,
                                  a->partial ? a->count : SIZE_MAX, out);
        break;
    case IMAPPARSE_FETCH_BINARY:
    case IMAPPARSE_FETCH_BINARY_SIZE:
        r = imap_fetch_binary(a, mf->msg, out);
        break;
    }
    return r == MESSAGE_OK ? STORE_OK
           : r == MESSAGE_UNKNOWN_CTE ? IMAP_UNKNOWN_CTE
           : r == MESSAGE_NOMEM ? STORE_NOMEM : STORE_BADMESSAGE;
}

/* May message uid be answered for every BINARY item of the FETCH that
 * sets \Seen?  0 when one of them names a transfer encoding that cannot
 * be undone (the command fails for it: its \Seen stays as it was), else
 * 1 (also when the file cannot be read: the second phase reports it). */
static int imap_binary_decodable(struct imap_session *s, uint32_t uid)
{
    const struct imapparse_fetch *f = &s->cmd.fetch;
    struct imap_msgfile mf;
    struct buf tmp = BUF_INITIALIZER;
    int ok = 1;

    if (imap_msgfile_open(s->sel, uid, &mf) != STORE_OK)
        return 1;
    for (size_t k = 0; k < f->n && ok; k++) {
        const struct imapparse_fetch_att *a = &f->atts[k];

        if (a->kind != IMAPPARSE_FETCH_BINARY || a->peek)
            continue;
        buf_reset(&tmp);
        if (message_get_binary(mf.msg, a->parts, a->nparts, &tmp, NULL) ==
            MESSAGE_UNKNOWN_CTE)
            ok = 0;
    }
    buf_free(&tmp);
    imap_msgfile_close(&mf);
    return ok;
}

/* One message a FETCH answers for, collected under the lock. */
struct imap_fetch_item {
    size_t idx;                     /* into s->msgs */
    int markseen;                   /* \Seen set by this FETCH */
    struct mailbox_record rec;
};

/* FETCH in two phases: under the lock (exclusive when a body fetch sets
 * \Seen) the records are read and \Seen set; after it, the message
 * files are mapped and the responses written, so that a client slow to
 * read holds no lock.  A file removed meanwhile (another session
 * expunged the message and cleanup ran) is left out, and the command
 * answers NO. */
static void imap_cmd_fetch(struct imap_session *s)
{
    const struct imapparse_fetch *f = &s->cmd.fetch;
    int needmsg = 0, setseen = 0, wantflags = 0, wantuid = 0;
    int wantmodseq = 0, failed = 0, seenchanged = 0, r, ur;
    int binseen = 0, unknown_cte = 0;
    struct imap_fetch_item *items = NULL;
    size_t nitems = 0;
    struct buf out = BUF_INITIALIZER;

    if (imap_check_set(s) != 0)
        return;
    /* RFC 7162 3.2.6: VANISHED is for UID FETCH once QRESYNC is on */
    if (f->vanished && !s->cmd.uid) {
        imap_tagged(s, "BAD", "VANISHED needs UID FETCH");
        return;
    }
    if (f->vanished && !s->qresync) {
        imap_tagged(s, "BAD", "QRESYNC not enabled");
        return;
    }
    for (size_t k = 0; k < f->n; k++) {
        const struct imapparse_fetch_att *a = &f->atts[k];

        needmsg |= imap_att_needs_msg(a);
        setseen |= imap_att_sets_seen(a);
        wantflags |= a->kind == IMAPPARSE_FETCH_FLAGS;
        wantuid |= a->kind == IMAPPARSE_FETCH_UID;
        wantmodseq |= a->kind == IMAPPARSE_FETCH_MODSEQ;
        binseen |= a->kind == IMAPPARSE_FETCH_BINARY && !a->peek;
    }
    if (wantmodseq || f->changedsince_set)
        s->condstore = 1;       /* CONDSTORE-enabling (RFC 7162 3.1) */
    if (s->sel_readonly || !(s->sel_rights & ACL_SEEN))
        setseen = 0;
    items = calloc(s->nmsgs ? s->nmsgs : 1, sizeof(*items));
    if (!items) {
        imap_store_no(s, STORE_NOMEM);
        return;
    }
    /* changes start from the stored state (another session of the user
     * may have changed it) */
    if (setseen && s->sel_useseen && imap_seen_reload(s) != STORE_OK) {
        free(items);
        imap_store_no(s, STORE_IOERROR);
        return;
    }
    r = mailbox_lock(s->sel, setseen ? MAILBOX_LOCK_EXCLUSIVE
                                     : MAILBOX_LOCK_SHARED);
    if (r != STORE_OK) {
        free(items);
        imap_store_no(s, r);
        return;
    }
    /* keywords defined by others since the last update: announced before
     * a FETCH response names them */
    imap_keywords_announce(s, &out);
    if (f->vanished) {
        struct buf v = BUF_INITIALIZER;

        r = qresync_vanished(s->sel, f->changedsince, &s->cmd.set, &v, NULL);
        if (r == STORE_OK && v.len)
            buf_printf(&out, "* VANISHED (EARLIER) %s\r\n", buf_cstring(&v));
        buf_free(&v);
    }
    for (size_t i = 0; i < s->nmsgs && r == STORE_OK; i++) {
        struct imap_fetch_item *it = &items[nitems];
        uint32_t recno, idxseen;
        int rr, markseen;

        if (s->msgs[i].gone || !imap_in_set(s, &s->cmd.set, i))
            continue;
        rr = imap_read_uid(s, s->sel, s->msgs[i].uid, &recno, &it->rec);
        if (rr == STORE_NOTFOUND)
            continue;           /* expunged meanwhile: nothing to send */
        if (rr != STORE_OK) {
            r = rr;
            break;
        }
        if (f->changedsince_set && it->rec.modseq <= f->changedsince)
            continue;
        it->idx = i;
        idxseen = it->rec.flags & MAILBOX_FLAG_SEEN;
        imap_rec_seen(s, &it->rec);
        markseen = setseen && !(it->rec.flags & MAILBOX_FLAG_SEEN);
        if (markseen && binseen && !imap_binary_decodable(s, it->rec.uid))
            markseen = 0;
        if (markseen && s->sel_useseen) {
            struct mailbox_record raw = it->rec;

            r = imap_seen_set(s, it->rec.uid, 1);
            /* the modseq moves with the user's \Seen (see STORE); the
             * index's own \Seen bit stays as it was */
            raw.flags = (raw.flags & ~(uint32_t)MAILBOX_FLAG_SEEN) | idxseen;
            if (r == STORE_OK)
                r = mailbox_rewrite_record(s->sel, recno, &raw);
            if (r == STORE_OK)
                r = mailbox_read_record(s->sel, recno, &it->rec);
            it->rec.flags |= MAILBOX_FLAG_SEEN;
            it->markseen = 1;
            seenchanged = 1;
        } else if (markseen) {
            it->rec.flags |= MAILBOX_FLAG_SEEN;
            r = mailbox_rewrite_record(s->sel, recno, &it->rec);
            if (r == STORE_OK)
                r = mailbox_read_record(s->sel, recno, &it->rec);
            it->markseen = 1;
        }
        nitems++;
    }
    ur = mailbox_unlock(s->sel);
    if (r == STORE_OK)
        r = ur;
    if (r == STORE_OK && seenchanged)
        r = imap_seen_write(s);
    else if (seenchanged)
        imap_seen_reload(s);    /* forget the unwritten change */
    if (out.len)
        prot_write(s->p, out.s, out.len);
    for (size_t n = 0; n < nitems && r == STORE_OK; n++) {
        struct imap_fetch_item *it = &items[n];
        struct imap_msg *m = &s->msgs[it->idx];
        struct imap_msgfile mf;
        int rr;

        memset(&mf, 0, sizeof(mf));
        mf.fd = -1;
        if (needmsg) {
            rr = imap_msgfile_open(s->sel, m->uid, &mf);
            if (rr != STORE_OK) {
                log_error("imap: cannot read message mailbox=<%s> uid=<%u> "
                          "error=<%s>", mailbox_name(s->sel),
                          (unsigned)m->uid, store_strerror(rr));
                failed = 1;
                continue;
            }
        }
        buf_reset(&out);
        buf_printf(&out, "* %zu FETCH (", it->idx + 1);
        if (s->cmd.uid && !wantuid)
            buf_printf(&out, "UID %u ", (unsigned)it->rec.uid);
        for (size_t k = 0; k < f->n && r == STORE_OK; k++) {
            if (k)
                buf_putc(&out, ' ');
            r = imap_fetch_att(s, &f->atts[k], &it->rec, &mf, &out);
        }
        if (r == IMAP_UNKNOWN_CTE) {
            /* RFC 3516 4.3: the command fails; this message's response
             * is not sent */
            unknown_cte = 1;
            r = STORE_OK;
            imap_msgfile_close(&mf);
            continue;
        }
        if (it->markseen && !wantflags) {
            buf_appendcstr(&out, " FLAGS ");
            imap_flags_text(s, &it->rec, &out);
        }
        /* RFC 7162 3.2: MODSEQ with CHANGEDSINCE, and with FLAGS once
         * CONDSTORE is on */
        if (!wantmodseq && (f->changedsince_set ||
                            (s->condstore && (wantflags || it->markseen))))
            buf_printf(&out, " MODSEQ (%llu)",
                       (unsigned long long)it->rec.modseq);
        buf_appendcstr(&out, ")\r\n");
        imap_msgfile_close(&mf);
        if (r == STORE_OK) {
            if (needmsg)
                s->nfetched++;
            prot_write(s->p, out.s, out.len);
            if (it->markseen || wantflags)
                imap_msg_told(m, &it->rec);
        }
    }
    free(items);
    buf_free(&out);
    s->no_expunge = !s->cmd.uid;
    if (r != STORE_OK)
        imap_store_no(s, r);
    else if (unknown_cte)
        imap_tagged(s, "NO", "[UNKNOWN-CTE] Cannot undo the "
                             "Content-Transfer-Encoding of a section");
    else if (failed)
        imap_tagged(s, "NO", "[UNAVAILABLE] Some messages could not be "
                             "read");
    else
        imap_tagged(s, "OK", "%s completed", s->cmd.name);
    s->no_expunge = 0;
}

/* ---- STORE ----------------------------------------------------------- */

/* Flags of a STORE/APPEND list into system bits and user flag bits.
 * create: define new keywords (the exclusive lock is held).  0, or -1
 * with *err_r (a BAD text when *bad_r, else a NO text). */
static int imap_flag_list(struct imap_session *s, struct mailbox *mb,
                          const struct imapparse_strlist *l, int create,
                          uint32_t *sys_r, uint32_t *user_r, int *bad_r,
                          const char **err_r)
{
    static const struct { const char *name; uint32_t bit; } sys[] = {
        { "\\Answered", MAILBOX_FLAG_ANSWERED },
        { "\\Flagged", MAILBOX_FLAG_FLAGGED },
        { "\\Deleted", MAILBOX_FLAG_DELETED },
        { "\\Seen", MAILBOX_FLAG_SEEN },
        { "\\Draft", MAILBOX_FLAG_DRAFT },
    };

    (void)s;
    *sys_r = 0;
    *bad_r = 0;
    memset(user_r, 0, sizeof(uint32_t) * (MAILBOX_USER_FLAGS / 32));
    for (size_t i = 0; i < l->n; i++) {
        const char *f = l->s[i];
        size_t k;
        int num, r;

        if (f[0] == '\\') {
            for (k = 0; k < sizeof(sys) / sizeof(sys[0]); k++)
                if (strcasecmp(f, sys[k].name) == 0)
                    break;
            if (k == sizeof(sys) / sizeof(sys[0])) {
                if (strcasecmp(f, "\\Recent") == 0)
                    continue;   /* not settable; ignored */
                *bad_r = 1;
                *err_r = "Invalid system flag";
                return -1;
            }
            *sys_r |= sys[k].bit;
            continue;
        }
        r = mailbox_user_flag(mb, f, create, &num);
        if (r == STORE_NOTFOUND && !create)
            continue;
        if (r == STORE_BADNAME) {
            *bad_r = 1;
            *err_r = "Invalid keyword";
            return -1;
        }
        if (r == STORE_OVERQUOTA) {
            *err_r = "[LIMIT] Too many keywords in this mailbox";
            return -1;
        }
        if (r != STORE_OK) {
            *err_r = "[UNAVAILABLE] Cannot define the keyword";
            return -1;
        }
        user_r[num / 32] |= 1u << (num % 32);
    }
    return 0;
}

/* The system flags the user may change in the selected mailbox. */
static uint32_t imap_changeable(struct imap_session *s)
{
    uint32_t m = 0;

    if (s->sel_rights & ACL_SEEN)
        m |= MAILBOX_FLAG_SEEN;
    if (s->sel_rights & ACL_DELETEMSG)
        m |= MAILBOX_FLAG_DELETED;
    if (s->sel_rights & ACL_WRITE)
        m |= MAILBOX_FLAG_ANSWERED | MAILBOX_FLAG_FLAGGED |
             MAILBOX_FLAG_DRAFT;
    return m;
}

static void imap_cmd_store(struct imap_session *s)
{
    const struct imapparse_store *st = &s->cmd.store;
    uint32_t sys, user[MAILBOX_USER_FLAGS / 32], changeable;
    struct buf modified = BUF_INITIALIZER, resp = BUF_INITIALIZER;
    uint32_t mprev = 0;
    int mrun = 0, bad = 0, r, ur, seenchanged = 0;
    const char *err = NULL;
    uint64_t newhms;
    int kwok, viewcur;

    if (imap_check_set(s) != 0)
        return;
    if (s->sel_readonly) {
        imap_tagged(s, "NO", "[READ-ONLY] Mailbox is read-only");
        return;
    }
    if (st->unchangedsince_set)
        s->condstore = 1;
    changeable = imap_changeable(s);
    kwok = (s->sel_rights & ACL_WRITE) != 0;
    /* changes start from the stored seen state */
    if (s->sel_useseen && imap_seen_reload(s) != STORE_OK) {
        imap_store_no(s, STORE_IOERROR);
        return;
    }
    r = mailbox_lock(s->sel, MAILBOX_LOCK_EXCLUSIVE);
    if (r != STORE_OK) {
        imap_store_no(s, r);
        return;
    }
    /* nothing changed since the view's last pass: this STORE's own
     * changes (each told to the view below) keep it current */
    viewcur = imap_view_matches(s, mailbox_get_header(s->sel));
    if (imap_flag_list(s, s->sel, &st->flags,
                       st->op != IMAPPARSE_STORE_REMOVE && kwok, &sys, user,
                       &bad, &err) != 0) {
        mailbox_unlock(s->sel);
        imap_tagged(s, bad ? "BAD" : "NO", "%s", err);
        return;
    }
    if (sys & ~changeable) {
        mailbox_unlock(s->sel);
        imap_tagged(s, "NO", "[NOPERM] Permission denied for these flags");
        return;
    }
    /* a keyword just defined is announced before the FETCH responses */
    imap_keywords_announce(s, &resp);
    for (size_t i = 0; i < s->nmsgs && r == STORE_OK; i++) {
        struct imap_msg *m = &s->msgs[i];
        struct mailbox_record rec, old;
        uint32_t recno, idxseen;
        int rr, recseen;

        if (m->gone || !imap_in_set(s, &s->cmd.set, i))
            continue;
        rr = imap_read_uid(s, s->sel, m->uid, &recno, &rec);
        if (rr == STORE_NOTFOUND)
            continue;
        if (rr != STORE_OK) {
            r = rr;
            break;
        }
        if (st->unchangedsince_set && rec.modseq > st->unchangedsince) {
            imap_set_add(&modified, s->cmd.uid ? m->uid : (uint32_t)(i + 1),
                         &mprev, &mrun);
            continue;
        }
        /* the index's own \Seen bit is kept; the user's is in s->seen */
        idxseen = rec.flags & MAILBOX_FLAG_SEEN;
        imap_rec_seen(s, &rec);
        old = rec;
        switch (st->op) {
        case IMAPPARSE_STORE_ADD:
            rec.flags |= sys;
            for (int k = 0; k < MAILBOX_USER_FLAGS / 32; k++)
                rec.user_flags[k] |= user[k];
            break;
        case IMAPPARSE_STORE_REMOVE:
            rec.flags &= ~sys;
            if (kwok)
                for (int k = 0; k < MAILBOX_USER_FLAGS / 32; k++)
                    rec.user_flags[k] &= ~user[k];
            break;
        default:
            rec.flags = (rec.flags & ~changeable) | sys;
            if (kwok)
                memcpy(rec.user_flags, user, sizeof(user));
            break;
        }
        recseen = 0;
        if (s->sel_useseen) {
            uint32_t seen = rec.flags & MAILBOX_FLAG_SEEN;

            if (seen != (old.flags & MAILBOX_FLAG_SEEN)) {
                r = imap_seen_set(s, rec.uid, seen != 0);
                if (r != STORE_OK)
                    break;
                seenchanged = 1;
                recseen = 1;
            }
            rec.flags = (rec.flags & ~(uint32_t)MAILBOX_FLAG_SEEN) | idxseen;
            old.flags = (old.flags & ~(uint32_t)MAILBOX_FLAG_SEEN) | idxseen;
        }
        /* a change of the user's \Seen moves the message's modseq too
         * (the record is rewritten with its flags as they were), so that
         * CONDSTORE clients and the user's other sessions learn of it */
        if (recseen || rec.flags != old.flags ||
            memcmp(rec.user_flags, old.user_flags,
                   sizeof(rec.user_flags)) != 0) {
            r = mailbox_rewrite_record(s->sel, recno, &rec);
            if (r == STORE_OK)
                r = mailbox_read_record(s->sel, recno, &rec);
            if (r != STORE_OK)
                break;
        }
        imap_rec_seen(s, &rec);
        if (!st->silent || (s->condstore && rec.modseq != old.modseq)) {
            if (st->silent) {
                buf_printf(&resp, "* %zu FETCH (UID %u MODSEQ (%llu))\r\n",
                           i + 1, (unsigned)rec.uid,
                           (unsigned long long)rec.modseq);
            } else {
                imap_send_flags(s, i + 1, &rec, &resp);
            }
        }
        imap_msg_told(m, &rec);
    }
    newhms = mailbox_get_header(s->sel)->highestmodseq;
    ur = mailbox_unlock(s->sel);
    if (r == STORE_OK)
        r = ur;
    /* the view is the index as this unlock wrote it: the update before
     * the tagged reply sees the same generation and makes no pass, unless
     * another process changed the mailbox in between */
    if (viewcur && r == STORE_OK) {
        s->view_hms = newhms;
        mailbox_version(s->sel, &s->view_version);
    }
    /* the seen state goes to its file after the index's changes: written
     * even when a later message failed, like those changes */
    if (seenchanged) {
        int sr = imap_seen_write(s);

        if (r == STORE_OK)
            r = sr;
        if (sr != STORE_OK)
            imap_seen_reload(s);
    }
    if (resp.len)
        prot_write(s->p, resp.s, resp.len);
    buf_free(&resp);
    imap_set_end(&modified, mprev, mrun);
    s->no_expunge = !s->cmd.uid;
    if (r != STORE_OK)
        imap_store_no(s, r);
    else if (modified.len)
        imap_tagged(s, "OK", "[MODIFIED %s] Conditional STORE failed",
                    buf_cstring(&modified));
    else
        imap_tagged(s, "OK", "%s completed", s->cmd.name);
    s->no_expunge = 0;
    buf_free(&modified);
}

/* ---- EXPUNGE --------------------------------------------------------- */

/* Mark \Deleted messages expunged: all of them (uidset NULL) or those of
 * the view in uidset.  Under no lock; takes the exclusive one. */
static int imap_expunge(struct imap_session *s,
                        const struct imapparse_seqset *uidset)
{
    uint32_t visible;
    unsigned long gone = 0;
    int r, ur;

    r = mailbox_lock(s->sel, MAILBOX_LOCK_EXCLUSIVE);
    if (r != STORE_OK)
        return r;
    visible = mailbox_get_header(s->sel)->visible;
    for (uint32_t recno = 0; recno < visible && r == STORE_OK; recno++) {
        struct mailbox_record rec;

        r = mailbox_read_record(s->sel, recno, &rec);
        if (r != STORE_OK)
            break;
        if (!(rec.flags & MAILBOX_FLAG_DELETED) ||
            (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED)))
            continue;
        if (uidset && (rec.uid > s->lastuid ||
                       !imapparse_seqset_contains(uidset, rec.uid,
                                                  s->lastuid)))
            continue;
        rec.flags |= MAILBOX_FLAG_EXPUNGED;
        r = mailbox_rewrite_record(s->sel, recno, &rec);
        gone++;
    }
    ur = mailbox_unlock(s->sel);
    if (r == STORE_OK && ur == STORE_OK)
        s->nexpunged += gone;
    return r == STORE_OK ? ur : r;
}

/* SEARCH RETURN (SAVE): keep the result as "$" (RFC 5182), as UIDs;
 * with MIN and/or MAX but neither ALL nor COUNT only those; with PARTIAL
 * (RFC 9394 3.2) only the messages of its range.  Out of memory leaves
 * "$" empty. */
static void imap_search_save(struct imap_session *s,
                             const struct search_result *res)
{
    unsigned ret = s->cmd.search_ret;
    int ends_only = (ret & (IMAPPARSE_RET_MIN | IMAPPARSE_RET_MAX)) &&
                    !(ret & (IMAPPARSE_RET_ALL | IMAPPARSE_RET_COUNT |
                             IMAPPARSE_RET_PARTIAL));
    size_t n = 0, first = 0, count = res->n;

    free(s->saved);
    s->saved = NULL;
    s->nsaved = 0;
    if (res->n == 0)
        return;
    s->saved = malloc(res->n * sizeof(*s->saved));
    if (!s->saved)
        return;
    if (ret & IMAPPARSE_RET_PARTIAL)
        search_partial_slice(res->n, s->cmd.partial_lo, s->cmd.partial_hi,
                             &first, &count);
    for (size_t i = 0; i < res->n; i++) {
        uint32_t v = res->nums[i];

        if (ends_only &&
            !((i == 0 && (ret & IMAPPARSE_RET_MIN)) ||
              (i == res->n - 1 && (ret & IMAPPARSE_RET_MAX))))
            continue;
        if (i < first || i - first >= count)
            continue;
        if (!s->cmd.uid) {
            if (v == 0 || v > s->nmsgs)
                continue;
            v = s->msgs[v - 1].uid;
        }
        s->saved[n++] = v;
    }
    s->nsaved = n;
}

/* A SEARCH RETURN (SAVE) the parser refused (BAD, BADCHARSET) empties
 * "$" as a failed one does (RFC 5182 2.1). */
static void imap_search_refused(struct imap_session *s)
{
    if (s->cmd.id == IMAPPARSE_CMD_SEARCH &&
        (s->cmd.search_ret & IMAPPARSE_RET_SAVE)) {
        free(s->saved);
        s->saved = NULL;
        s->nsaved = 0;
    }
}

/* "$" as the command's set: the saved UIDs, or for a command on message
 * numbers the numbers of those still in the view.  0, or -1 out of
 * memory. */
static int imap_saved_subst(struct imap_session *s)
{
    struct imapparse_seqset *set = &s->cmd.set;
    size_t n = 0;

    free(s->saved_ranges);
    s->saved_ranges = NULL;
    if (!set->saved)
        return 0;
    s->saved_ranges = malloc((s->nsaved ? s->nsaved : 1) *
                             sizeof(*s->saved_ranges));
    if (!s->saved_ranges)
        return -1;
    for (size_t i = 0; i < s->nsaved; i++) {
        uint32_t v = s->saved[i];

        if (!s->cmd.uid) {
            const struct imap_msg *m = imap_msg_find(s, v);

            if (!m)
                continue;
            v = (uint32_t)(m - s->msgs) + 1;
        }
        s->saved_ranges[n].lo = s->saved_ranges[n].hi = v;
        n++;
    }
    set->r = s->saved_ranges;
    set->n = n;
    set->saved = 0;
    return 0;
}

/* SEARCH / UID SEARCH (imapd/search.c does the matching): the view's
 * uids in sequence order go to the evaluator under the shared lock, the
 * answer is written after the unlock.  With a MODSEQ key the answer ends
 * in (MODSEQ n) and CONDSTORE is on from then (RFC 7162 3.1.5).  With
 * RETURN (...) the answer is one ESEARCH response (RFC 4731; none for
 * RETURN (SAVE) alone) and SAVE keeps the result as "$" (RFC 5182). */
static void imap_cmd_search(struct imap_session *s)
{
    struct imapparse_cmd *c = &s->cmd;
    struct search_params sp;
    struct search_result res;
    uint32_t *uids;
    size_t i;
    int r;

    /* RFC 6855 3: after ENABLE UTF8=ACCEPT strings are UTF-8, and a
     * CHARSET is a conflicting label */
    if (s->utf8_accept && c->charset_set) {
        imap_search_refused(s);
        imap_tagged(s, "BAD", "SEARCH takes no CHARSET after ENABLE "
                              "UTF8=ACCEPT");
        return;
    }

    memset(&res, 0, sizeof(res));
    uids = malloc((s->nmsgs ? s->nmsgs : 1) * sizeof(*uids));
    if (!uids) {
        imap_store_no(s, STORE_NOMEM);
        return;
    }
    for (i = 0; i < s->nmsgs; i++)
        uids[i] = s->msgs[i].uid;
    memset(&sp, 0, sizeof(sp));
    sp.mb = s->sel;
    sp.uids = uids;
    sp.nmsgs = (uint32_t)s->nmsgs;
    sp.utf8 = c->utf8 || s->utf8_accept;
    sp.return_uids = c->uid;
    sp.rock = s;
    sp.recent = imap_search_recent;
    sp.saved = s->saved;
    sp.nsaved = s->nsaved;
    if (s->sel_useseen)
        sp.seen = imap_search_seen;
    r = mailbox_lock(s->sel, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        r = search_run(&sp, c->search, &res);
        mailbox_unlock(s->sel);
    }
    free(uids);
    if (r != STORE_OK) {
        search_result_free(&res);
        if (c->search_ret & IMAPPARSE_RET_SAVE) {
            free(s->saved);     /* a failed SAVE empties "$" */
            s->saved = NULL;
            s->nsaved = 0;
        }
        imap_store_no(s, r);
        return;
    }
    if (res.has_modseq)
        s->condstore = 1;
    if (c->search_ret & IMAPPARSE_RET_SAVE)
        imap_search_save(s, &res);
    if (c->esearch) {
        unsigned ret = c->search_ret & ~(unsigned)IMAPPARSE_RET_SAVE;

        if (ret) {
            struct buf b = BUF_INITIALIZER;

            search_esearch(&b, c->tag, c->uid, ret, res.nums, res.n,
                           res.has_modseq, res.highest_modseq,
                           c->partial_lo, c->partial_hi);
            prot_write(s->p, b.s, b.len);
            buf_free(&b);
        }
    } else {
        prot_puts(s->p, "* SEARCH");
        for (i = 0; i < res.n; i++)
            prot_printf(s->p, " %lu", (unsigned long)res.nums[i]);
        if (res.has_modseq && res.n)
            prot_printf(s->p, " (MODSEQ %llu)",
                        (unsigned long long)res.highest_modseq);
        prot_puts(s->p, "\r\n");
    }
    search_result_free(&res);
    /* SEARCH: no expunges may be reported with its reply */
    s->no_expunge = !c->uid;
    imap_tagged(s, "OK", "%s completed", c->uid ? "UID SEARCH" : "SEARCH");
    s->no_expunge = 0;
}

/* The view and callbacks of SEARCH for SORT and THREAD: *uids_r is
 * malloc'd (free it).  0, or -1 out of memory (answered). */
static int imap_sort_params(struct imap_session *s, struct search_params *sp,
                            uint32_t **uids_r)
{
    uint32_t *uids = malloc((s->nmsgs ? s->nmsgs : 1) * sizeof(*uids));

    if (!uids) {
        imap_store_no(s, STORE_NOMEM);
        return -1;
    }
    for (size_t i = 0; i < s->nmsgs; i++)
        uids[i] = s->msgs[i].uid;
    memset(sp, 0, sizeof(*sp));
    sp->mb = s->sel;
    sp->uids = uids;
    sp->nmsgs = (uint32_t)s->nmsgs;
    sp->utf8 = s->cmd.utf8;
    sp->return_uids = s->cmd.uid;
    sp->rock = s;
    sp->recent = imap_search_recent;
    sp->saved = s->saved;
    sp->nsaved = s->nsaved;
    if (s->sel_useseen)
        sp->seen = imap_search_seen;
    *uids_r = uids;
    return 0;
}

/* SORT / UID SORT (imapd/sort.c): "* SORT n ..." in sort order, or with
 * RETURN (...) one ESEARCH response (ESORT, RFC 5267). */
static void imap_cmd_sort(struct imap_session *s)
{
    struct imapparse_cmd *c = &s->cmd;
    struct search_params sp;
    struct sort_result res;
    struct buf b = BUF_INITIALIZER;
    uint32_t *uids;
    int r;

    memset(&res, 0, sizeof(res));
    if (imap_sort_params(s, &sp, &uids) < 0)
        return;
    r = mailbox_lock(s->sel, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        r = sort_run(&sp, c->search, c->sort, c->nsort, &res);
        mailbox_unlock(s->sel);
    }
    free(uids);
    if (r != STORE_OK) {
        sort_result_free(&res);
        imap_store_no(s, r);
        return;
    }
    if (res.has_modseq)
        s->condstore = 1;
    if (c->esearch) {
        search_esearch(&b, c->tag, c->uid, c->search_ret, res.nums, res.n,
                       res.has_modseq, res.highest_modseq, c->partial_lo,
                       c->partial_hi);
    } else {
        buf_appendcstr(&b, "* SORT");
        for (size_t i = 0; i < res.n; i++)
            buf_printf(&b, " %lu", (unsigned long)res.nums[i]);
        if (res.has_modseq && res.n)
            buf_printf(&b, " (MODSEQ %llu)",
                       (unsigned long long)res.highest_modseq);
        buf_appendcstr(&b, "\r\n");
    }
    prot_write(s->p, b.s, b.len);
    buf_free(&b);
    sort_result_free(&res);
    s->no_expunge = !c->uid;
    imap_tagged(s, "OK", "%s completed", c->uid ? "UID SORT" : "SORT");
    s->no_expunge = 0;
}

/* THREAD / UID THREAD (imapd/sort.c). */
static void imap_cmd_thread(struct imap_session *s)
{
    struct imapparse_cmd *c = &s->cmd;
    struct search_params sp;
    struct buf b = BUF_INITIALIZER;
    uint32_t *uids;
    int r;

    if (imap_sort_params(s, &sp, &uids) < 0)
        return;
    r = mailbox_lock(s->sel, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK) {
        r = sort_thread(&sp, c->search, c->thread_alg, &b);
        mailbox_unlock(s->sel);
    }
    free(uids);
    if (r != STORE_OK) {
        buf_free(&b);
        imap_store_no(s, r);
        return;
    }
    prot_write(s->p, b.s, b.len);
    buf_free(&b);
    s->no_expunge = !c->uid;
    imap_tagged(s, "OK", "%s completed", c->uid ? "UID THREAD" : "THREAD");
    s->no_expunge = 0;
}

static void imap_cmd_expunge(struct imap_session *s)
{
    int r;

    if (s->sel_readonly) {
        imap_tagged(s, "NO", "[READ-ONLY] Mailbox is read-only");
        return;
    }
    if (!(s->sel_rights & ACL_EXPUNGE)) {
        imap_tagged(s, "NO", "[NOPERM] Permission denied");
        return;
    }
    r = imap_expunge(s, s->cmd.uid ? &s->cmd.set : NULL);
    if (r != STORE_OK)
        imap_store_no(s, r);
    else
        imap_tagged(s, "OK", "%s completed", s->cmd.name);
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

    /* QRESYNC implies CONDSTORE (RFC 7162 3.2.3); each is reported when
     * this command turned it on */
    for (size_t i = 0; i < s->cmd.words.n; i++) {
        if (strcasecmp(s->cmd.words.s[i], "QRESYNC") == 0 && !s->qresync) {
            s->qresync = 1;
            enabled |= 2;
            if (!s->condstore)
                enabled |= 1;
            s->condstore = 1;
        }
        if (strcasecmp(s->cmd.words.s[i], "CONDSTORE") == 0 &&
            !s->condstore) {
            s->condstore = 1;
            enabled |= 1;
        }
        /* RFC 6855 3: in the authenticated state only; in the selected
         * state it is not enabled (and not reported) */
        if (strcasecmp(s->cmd.words.s[i], "UTF8=ACCEPT") == 0 &&
            !s->utf8_accept && s->state == IMAP_AUTH) {
            s->utf8_accept = 1;
            enabled |= 4;
        }
    }
    prot_printf(s->p, "* ENABLED%s%s%s\r\n",
                (enabled & 1) ? " CONDSTORE" : "",
                (enabled & 2) ? " QRESYNC" : "",
                (enabled & 4) ? " UTF8=ACCEPT" : "");
    imap_tagged(s, "OK", "ENABLE completed");
}

static void imap_cmd_id(struct imap_session *s)
{
    prot_printf(s->p, "* ID (\"name\" \"cyrusdeliver\" \"version\" \"%s\")"
                      "\r\n", PACKAGE_VERSION);
    imap_tagged(s, "OK", "ID completed");
}

/* IDLE.  While a mailbox is selected the wait for DONE also watches a
 * notification socket (store/idlenotify.h): whoever changes the mailbox
 * sends it a datagram, which makes the wait ask imap_idle_check(); that
 * stats cyrus.index, and a change ends the wait for an update (EXISTS /
 * EXPUNGE / FETCH), after which the wait goes on.  Nothing wakes an idle
 * session while nothing changes, except a SIGALRM every
 * IMAP_IDLE_SAFETY_S (a safety net).  Without a notification slot the
 * timer ticks every IMAP_IDLE_POLL_MS instead (polling, as before).  The
 * part of the DONE line read before an interruption is kept. */
#define IMAP_IDLE_POLL_MS 250
#define IMAP_IDLE_SAFETY_S 30

static struct imap_session *imap_idle_session;

static void imap_idle_alarm(int sig)
{
    (void)sig;      /* only there to interrupt poll() */
}

static struct idlenotify_watch *imap_idle_watch;

static int imap_idle_check(void)
{
    struct imap_session *s = imap_idle_session;

    if (service_stopping())
        return 1;
    if (imap_idle_watch)
        idlenotify_drain(imap_idle_watch);
    return s && s->state == IMAP_SELECTED && s->sel &&
           imap_index_changed(s);
}

/* The periodic look at the index: every IMAP_IDLE_POLL_MS without push
 * notification, every IMAP_IDLE_SAFETY_S with it (a safety net for a
 * lost datagram), off when ms is 0. */
static void imap_idle_timer(long ms)
{
    struct itimerval it;

    memset(&it, 0, sizeof(it));
    it.it_interval.tv_sec = ms / 1000;
    it.it_interval.tv_usec = (ms % 1000) * 1000;
    it.it_value = it.it_interval;
    setitimer(ITIMER_REAL, &it, NULL);
}

static int imap_sel_rights_refresh(struct imap_session *s);

static void imap_cmd_idle(struct imap_session *s)
{
    struct sigaction sa, old;
    struct buf acc = BUF_INITIALIZER;
    int r, polling = s->state == IMAP_SELECTED && s->sel;
    long period = IMAP_IDLE_POLL_MS;

    /* the watch begins before the last look (imap_update), so no change
     * falls between them */
    if (polling &&
        idlenotify_watch(s->srv->conf, mailbox_dir(s->sel),
                         &imap_idle_watch) >= 0) {
        prot_set_wakefd(s->p, idlenotify_fd(imap_idle_watch));
        period = IMAP_IDLE_SAFETY_S * 1000L;
    }
    imap_update(s);
    prot_puts(s->p, "+ idling\r\n");
    if (prot_flush(s->p) != PROT_OK) {
        prot_set_wakefd(s->p, -1);
        idlenotify_unwatch(&imap_idle_watch);
        s->quit = 1;
        return;
    }
    if (s->sel)
        mailbox_flush(s->sel);   /* an idling session's flag changes */
    if (polling) {
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = imap_idle_alarm;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;        /* no SA_RESTART: poll() returns EINTR */
        sigaction(SIGALRM, &sa, &old);
        imap_idle_session = s;
    }
    for (;;) {
        if (polling)
            imap_idle_timer(period);
        prot_set_interrupt(s->p, polling ? imap_idle_check
                                         : service_stopping);
        r = prot_getline(s->p, &s->line, IMAP_IDLE_LINE_MAX, NULL);
        prot_set_interrupt(s->p, NULL);
        if (polling)
            imap_idle_timer(0);
        if (r == PROT_INTERRUPTED && !service_stopping()) {
            buf_append(&acc, s->line.s, s->line.len);
            if (acc.len > IMAP_IDLE_LINE_MAX) {
                r = PROT_TOOLONG;
                break;
            }
            /* news of a mailbox the user may still read only */
            (void)imap_sel_rights_refresh(s);
            if (s->state == IMAP_SELECTED)
                imap_update(s);
            if (prot_flush(s->p) != PROT_OK) {
                r = PROT_IOERROR;
                break;
            }
            if (s->state != IMAP_SELECTED) {
                /* closed: wait for DONE without polling */
                imap_idle_timer(0);
                sigaction(SIGALRM, &old, NULL);
                imap_idle_session = NULL;
                polling = 0;
            }
            continue;
        }
        if (r == PROT_OK) {
            buf_append(&acc, s->line.s, s->line.len);
            buf_setmap(&s->line, acc.s ? acc.s : "", acc.len);
        }
        break;
    }
    if (polling) {
        sigaction(SIGALRM, &old, NULL);
        imap_idle_session = NULL;
        prot_set_wakefd(s->p, -1);
        idlenotify_unwatch(&imap_idle_watch);
    }
    buf_free(&acc);
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
        s->end_reason = "shutdown";
        s->quit = 1;
        break;
    case PROT_TIMEOUT:
        prot_puts(s->p, "* BYE Autologout; idle for too long\r\n");
        s->end_reason = "autologout";
        s->quit = 1;
        break;
    default:
        s->quit = 1;
        break;
    }
}

/* ---- APPEND, COPY, MOVE ---------------------------------------------- */

/* The keywords of a flag list (the names not starting with a
 * backslash) into out. */
void imap_keyword_names(const char *const *names, size_t n,
                        struct strarray *out)
{
    for (size_t i = 0; i < n; i++)
        if (names[i][0] != '\\')
            strarray_append(out, names[i]);
}

/* System flags of an APPEND flag list (unknown \flags ignored). */
uint32_t imap_sysflags_of(const struct imapparse_strlist *l)
{
    uint32_t f = 0;

    for (size_t i = 0; i < l->n; i++) {
        const char *n = l->s[i];

        if (strcasecmp(n, "\\Answered") == 0) f |= MAILBOX_FLAG_ANSWERED;
        else if (strcasecmp(n, "\\Flagged") == 0) f |= MAILBOX_FLAG_FLAGGED;
        else if (strcasecmp(n, "\\Deleted") == 0) f |= MAILBOX_FLAG_DELETED;
        else if (strcasecmp(n, "\\Seen") == 0) f |= MAILBOX_FLAG_SEEN;
        else if (strcasecmp(n, "\\Draft") == 0) f |= MAILBOX_FLAG_DRAFT;
    }
    return f;
}

/* The system flags a user with `rights` may set on a new message. */
uint32_t imap_settable(int rights)
{
    uint32_t m = 0;

    if (rights & ACL_SEEN)
        m |= MAILBOX_FLAG_SEEN;
    if (rights & ACL_DELETEMSG)
        m |= MAILBOX_FLAG_DELETED;
    if (rights & ACL_WRITE)
        m |= MAILBOX_FLAG_ANSWERED | MAILBOX_FLAG_FLAGGED |
             MAILBOX_FLAG_DRAFT;
    return m;
}

/* The destination of APPEND/COPY/MOVE (cmd.arg[0]): looked up with the
 * i right and opened.  STORE_OK, or an error answered here (NO
 * [TRYCREATE] for a missing mailbox) when answer is set. */
int imap_dest_open(struct imap_session *s, int answer,
                   struct mboxlist_entry **e_r, struct mailbox **mb_r)
{
    struct buf name = BUF_INITIALIZER;
    const char *err = NULL;
    struct buf tmp = BUF_INITIALIZER;
    int r;

    *mb_r = NULL;
    *e_r = NULL;
    r = imap_to_internal(s, imap_strip_sep(s, s->cmd.arg[0], &tmp), &name,
                         &err);
    buf_free(&tmp);
    if (r != STORE_OK) {
        if (answer)
            imap_tagged(s, "NO", "[CANNOT] Invalid mailbox name: %s",
                        err ? err : store_strerror(r));
        buf_free(&name);
        return r;
    }
    r = imap_lookup(s, buf_cstring(&name), ACL_INSERT, e_r);
    if (r == STORE_OK)
        r = mailbox_open(s->srv->conf, (*e_r)->name, (*e_r)->partition,
                         mb_r);
    if (r != STORE_OK) {
        mboxlist_entry_free(e_r);
        if (answer) {
            if (r == STORE_NOTFOUND)
                imap_tagged(s, "NO", "[TRYCREATE] Mailbox does not exist");
            else
                imap_store_no(s, r);
        }
    }
    buf_free(&name);
    return r;
}

/* Whether mb has all its keywords in use and one of kws is not among
 * them: after STORE_OVERQUOTA from a strict append, the keyword limit
 * refused it (the quota check comes first and leaves keywords alone). */
int imap_keywords_undefined(struct mailbox *mb,
                            const struct strarray *kws)
{
    int num;

    if (!mb)
        return 0;
    for (num = 0; num < MAILBOX_USER_FLAGS; num++)
        if (!mailbox_user_flag_name(mb, num))
            return 0;
    for (size_t i = 0; i < kws->count; i++)
        if (mailbox_user_flag(mb, kws->data[i], 0, &num) != STORE_OK)
            return 1;
    return 0;
}

/* A stage for message `rec` of the selected mailbox on `partition`: a
 * hard link of its file (single-instance store, no bytes copied), or a
 * copy of the bytes when the file system refuses the link. */
static int imap_stage_copy(struct imap_session *s,
                           const struct mailbox_record *rec,
                           const char *partition, struct append_stage **st_r)
{
    char data[65536];
    struct buf path = BUF_INITIALIZER;
    struct mailbox_msginfo info;
    int fd = -1, r;

    *st_r = NULL;
    memset(&info, 0, sizeof(info));
    info.size = rec->size;
    info.header_size = rec->header_size;
    memcpy(info.digest, rec->digest, sizeof(info.digest));
    mailbox_message_path(s->sel, rec->uid, &path);
    r = append_stage_link(s->srv->conf, partition, buf_cstring(&path), &info,
                          st_r);
    buf_free(&path);
    if (r != STORE_NOTIMPLEMENTED)
        return r;
    r = mailbox_open_message(s->sel, rec->uid, &fd);
    if (r == STORE_OK)
        r = append_stage_open(s->srv->conf, partition, st_r);
    while (r == STORE_OK) {
        ssize_t n = read(fd, data, sizeof(data));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            r = STORE_IOERROR;
        else if (n == 0)
            break;
        else
            r = append_stage_write(*st_r, data, (size_t)n);
    }
    if (r == STORE_OK)
        r = append_stage_close(*st_r);
    if (fd >= 0)
        close(fd);
    if (r != STORE_OK)
        append_stage_free(st_r);
    return r;
}

/* COPY / MOVE (RFC 6851) and their UID forms: every message goes through
 * the append path (one commit round for all), with its flags and
 * internal date; MOVE then expunges the sources. */
static void imap_cmd_copy(struct imap_session *s, int move)
{
    struct mboxlist_entry *e = NULL;
    struct mailbox *dst = NULL;
    struct append_txn *t = NULL;
    struct append_stage **stages = NULL;
    struct mailbox_record *recs = NULL;
    uint32_t *newuids = NULL, *seenuids = NULL;
    size_t n = 0;
    struct buf srcset = BUF_INITIALIZER, dstset = BUF_INITIALIZER;
    struct buf names = BUF_INITIALIZER;
    struct strarray kws = STRARRAY_INITIALIZER;
    uint32_t sprev = 0, dprev = 0, uidvalidity = 0;
    int srun = 0, drun = 0, r, rights, dstseen;

    if (imap_check_set(s) != 0)
        return;
    if (move && (s->sel_readonly || !(s->sel_rights & ACL_EXPUNGE) ||
                 !(s->sel_rights & ACL_DELETEMSG))) {
        imap_tagged(s, "NO", "[NOPERM] Cannot remove messages from this "
                             "mailbox");
        return;
    }
    if (imap_dest_open(s, 1, &e, &dst) != STORE_OK)
        return;
    rights = imap_rights(s, e->name, e->acl);
    dstseen = imap_mb_useseen(dst);
    /* the messages, in uid order */
    recs = calloc(s->nmsgs ? s->nmsgs : 1, sizeof(*recs));
    newuids = calloc(s->nmsgs ? s->nmsgs : 1, sizeof(*newuids));
    seenuids = calloc(s->nmsgs ? s->nmsgs : 1, sizeof(*seenuids));
    stages = calloc(s->nmsgs ? s->nmsgs : 1, sizeof(*stages));
    if (!recs || !newuids || !seenuids || !stages) {
        r = STORE_NOMEM;
        goto fail;
    }
    r = mailbox_lock(s->sel, MAILBOX_LOCK_SHARED);
    if (r != STORE_OK)
        goto fail;
    for (size_t i = 0; i < s->nmsgs && r == STORE_OK; i++) {
        uint32_t recno;
        int rr;

        if (s->msgs[i].gone || !imap_in_set(s, &s->cmd.set, i))
            continue;
        rr = imap_read_uid(s, s->sel, s->msgs[i].uid, &recno, &recs[n]);
        if (rr == STORE_OK)
            imap_rec_seen(s, &recs[n++]);
        else if (rr != STORE_NOTFOUND)
            r = rr;
    }
    mailbox_unlock(s->sel);
    if (r != STORE_OK)
        goto fail;
    if (n == 0) {
        /* RFC 3501: an empty set copies nothing */
        imap_tagged(s, "OK", "%s completed (no messages)", s->cmd.name);
        goto out;
    }
    r = append_begin(s->srv->conf, &t);
    for (size_t k = 0; k < n && r == STORE_OK; k++) {
        r = imap_stage_copy(s, &recs[k], e->partition, &stages[k]);
        if (r == STORE_OK) {
            uint32_t fl = recs[k].flags & MAILBOX_SYSTEM_FLAGS &
                          imap_settable(rights);

            /* the user's \Seen goes to the seen state of dst */
            if (dstseen && (fl & MAILBOX_FLAG_SEEN))
                fl &= ~(uint32_t)MAILBOX_FLAG_SEEN;
            else
                recs[k].flags &= ~(uint32_t)MAILBOX_FLAG_SEEN;
            /* the keywords, by name, in the same commit (copies of
             * the names: defining one may reload the handle's) */
            strarray_fini(&kws);
            for (int b = 0; (rights & ACL_WRITE) && b < MAILBOX_USER_FLAGS;
                 b++) {
                const char *nm;

                if (!(recs[k].user_flags[b / 32] & (1u << (b % 32))))
                    continue;
                nm = mailbox_user_flag_name(s->sel, b);
                if (nm)
                    strarray_append(&kws, nm);
            }
            r = append_add_keywords(t, dst, stages[k], recs[k].internaldate,
                                    fl, (const char *const *)kws.data,
                                    (size_t)kws.count,
                                    APPEND_KEYWORDS_STRICT, &newuids[k]);
        }
    }
    if (r == STORE_OK)
        r = append_commit(t);
    else if (t)
        append_abort(t);
    if (r != STORE_OK)
        goto fail;
    if (dstseen) {
        size_t ns = 0;

        /* the new uids of the messages copied with \Seen */
        for (size_t k = 0; k < n; k++)
            if (recs[k].flags & MAILBOX_FLAG_SEEN)
                seenuids[ns++] = newuids[k];
        imap_seen_add_uids(s, dst, seenuids, ns);
    }
    uidvalidity = mailbox_get_header(dst)->uidvalidity;
    for (size_t k = 0; k < n; k++) {
        imap_set_add(&srcset, recs[k].uid, &sprev, &srun);
        imap_set_add(&dstset, newuids[k], &dprev, &drun);
    }
    imap_set_end(&srcset, sprev, srun);
    imap_set_end(&dstset, dprev, drun);
    if (!move) {
        imap_tagged(s, "OK", "[COPYUID %u %s %s] %s completed",
                    (unsigned)uidvalidity, buf_cstring(&srcset),
                    buf_cstring(&dstset), s->cmd.name);
        goto out;
    }
    /* MOVE: expunge the sources */
    r = mailbox_lock(s->sel, MAILBOX_LOCK_EXCLUSIVE);
    if (r == STORE_OK) {
        unsigned long gone = 0;
        int ur;

        for (size_t k = 0; k < n && r == STORE_OK; k++) {
            struct mailbox_record rec;
            uint32_t recno;
            int rr = imap_read_uid(s, s->sel, recs[k].uid, &recno, &rec);

            if (rr == STORE_NOTFOUND)
                continue;
            r = rr;
            if (r == STORE_OK) {
                rec.flags |= MAILBOX_FLAG_EXPUNGED;
                r = mailbox_rewrite_record(s->sel, recno, &rec);
                gone++;
            }
        }
        ur = mailbox_unlock(s->sel);
        if (r == STORE_OK)
            r = ur;
        if (r == STORE_OK)
            s->nexpunged += gone;
    }
    prot_printf(s->p, "* OK [COPYUID %u %s %s] Moved\r\n",
                (unsigned)uidvalidity, buf_cstring(&srcset),
                buf_cstring(&dstset));
    if (r != STORE_OK) {
        imap_store_no(s, r);
        goto out;
    }
    imap_tagged(s, "OK", "%s completed", s->cmd.name);
    goto out;
fail:
    if (r == STORE_NOTFOUND)
        imap_tagged(s, "NO", "[EXPUNGEISSUED] Some messages were expunged");
    else if (r == STORE_OVERQUOTA && imap_keywords_undefined(dst, &kws))
        /* a keyword of the last message tried (kws) has no room in dst:
         * nothing is copied (never a copy without its keywords) */
        imap_tagged(s, "NO", "[LIMIT] Too many keywords in this mailbox");
    else
        imap_store_no(s, r);
out:
    append_free(&t);
    for (size_t k = 0; stages && k < n; k++)
        append_stage_free(&stages[k]);
    free(stages);
    free(recs);
    free(newuids);
    free(seenuids);
    buf_free(&srcset);
    buf_free(&dstset);
    buf_free(&names);
    strarray_fini(&kws);
    mailbox_close(&dst);
    mboxlist_entry_free(&e);
}

/* ---- dispatch -------------------------------------------------------- */

/* The selected mailbox's rights as its ACL says now (an ACL change by
 * any session or process takes effect at the next command).  Without r
 * the mailbox is closed ("* OK [CLOSED]") and a command of the selected
 * state answers NO [NOPERM] (returns 1: answered).  A lookup that fails
 * leaves the rights as they were. */
static int imap_sel_rights_refresh(struct imap_session *s)
{
    struct mboxlist *ml = imap_ml(s->srv);
    struct mboxlist_entry *e = NULL;
    struct cyrusdb_stamp now;
    int rights, id = s->cmd.id;

    if (!ml || !s->sel)
        return 0;
    if (s->sel_rights_known && mboxlist_stamp(ml, 1, &now) == STORE_OK &&
        cyrusdb_stamp_equal(&now, &s->sel_rights_stamp))
        return 0;       /* no entry changed: neither did the ACL */
    s->sel_rights_known = 0;
    if (mboxlist_lookup(ml, mailbox_name(s->sel), &e) != STORE_OK)
        return 0;
    if (mailbox_uniqueid(s->sel) && e->uniqueid &&
        strcmp(mailbox_uniqueid(s->sel), e->uniqueid) != 0) {
        mboxlist_entry_free(&e);
        return 0;
    }
    rights = imap_rights(s, e->name, e->acl);
    mboxlist_entry_free(&e);
    if (rights & ACL_READ) {
        s->sel_rights = rights;
        s->sel_rights_known =
            mboxlist_stamp(ml, 0, &s->sel_rights_stamp) == STORE_OK;
        return 0;
    }
    log_info("imap: read right revoked, mailbox closed mailbox=<%s> "
             "user=<%s>", mailbox_name(s->sel), s->userid);
    imap_unselect(s, 0);
    s->state = IMAP_AUTH;
    prot_puts(s->p, "* OK [CLOSED] Access to the selected mailbox was "
                    "revoked\r\n");
    if (id == IMAPPARSE_CMD_CLOSE || id == IMAPPARSE_CMD_UNSELECT) {
        imap_tagged(s, "OK", "%s completed (the mailbox was closed)",
                    id == IMAPPARSE_CMD_CLOSE ? "CLOSE" : "UNSELECT");
        return 1;
    }
    if (id == IMAPPARSE_CMD_CHECK || id == IMAPPARSE_CMD_EXPUNGE ||
        id == IMAPPARSE_CMD_SEARCH || id == IMAPPARSE_CMD_FETCH ||
        id == IMAPPARSE_CMD_STORE || id == IMAPPARSE_CMD_COPY ||
        id == IMAPPARSE_CMD_MOVE) {
        imap_tagged(s, "NO", "[NOPERM] Access to the selected mailbox was "
                             "revoked");
        return 1;
    }
    return 0;
}

static int imap_continue(void *rock, struct prot *p, size_t size, int append,
                         const char **error_r)
{
    struct imap_session *s = rock;

    if (append && s->app) {
        /* the second and later data literals of an APPEND */
        int refused = appendcmd_more(s->app, &s->cmd, s->utf8_accept, size,
                                     error_r);

        if (refused) {
            s->append_refused = refused;
            return -1;
        }
    } else if (append) {
        struct mboxlist_entry *e = NULL;
        struct mailbox *mb = NULL;
        int r;

        if (s->state == IMAP_NOTAUTH) {
            s->append_refused = 1;
            *error_r = "Please log in first";
            return -1;
        }
        if (s->cmd.append.utf8 && !s->utf8_accept) {
            s->append_refused = 2;
            *error_r = "UTF8 message data needs ENABLE UTF8=ACCEPT";
            return -1;
        }
        /* a missing or forbidden mailbox is refused before the data */
        r = imap_dest_open(s, 0, &e, &mb);
        mailbox_close(&mb);
        mboxlist_entry_free(&e);
        if (r != STORE_OK) {
            s->append_refused = 1;
            snprintf(s->errbuf, sizeof(s->errbuf), "%s%s",
                     r == STORE_NOTFOUND ? "[TRYCREATE] "
                     : r == STORE_PERMISSION ? "[NOPERM] "
                     : r == STORE_BADNAME ? "[CANNOT] " : "[UNAVAILABLE] ",
                     r == STORE_NOTFOUND ? "Mailbox does not exist"
                                         : store_strerror(r));
            *error_r = s->errbuf;
            return -1;
        }
    }
    prot_puts(p, "+ Ready for more\r\n");
    if (prot_flush(p) != PROT_OK) {
        *error_r = "Write failed";
        return -1;
    }
    return 0;
}

/* After ENABLE UTF8=ACCEPT: is every quoted string of the command
 * well-formed UTF-8 (RFC 6855 3: the server rejects one that is not)?
 * APPEND is not checked here: its message literal follows (its mailbox
 * name is checked when it is turned into the internal name). */
static int imap_quoted_utf8_ok(const struct imap_session *s)
{
    const struct imapparse_cmd *c = &s->cmd;

    if (!s->utf8_accept || c->id == IMAPPARSE_CMD_APPEND)
        return 1;
    for (size_t k = 0; k < c->ntokens; k++) {
        const struct imapparse_token *t = &c->tokens[k];
        const unsigned char *q = (const unsigned char *)c->text.s + t->off;
        size_t i = 0, n;
        uint32_t cp;

        if (t->type != IMAPPARSE_TOK_QUOTED)
            continue;
        while (i < t->len) {
            if (utf8_decode(q + i, t->len - i, &cp, &n) < 0)
                return 0;
            i += n;
        }
    }
    return 1;
}

static void imap_command(struct imap_session *s)
{
    struct imapparse_cmd *c = &s->cmd;
    struct buf caps = BUF_INITIALIZER;

    /* a move took the user away: no more commands here */
    if (s->state != IMAP_NOTAUTH && s->userid && !s->admin &&
        imap_user_moved(s, s->userid)) {
        imap_unselect(s, 0);
        prot_puts(s->p, "* BYE [UNAVAILABLE] Mailbox moved to another "
                        "server, log in again\r\n");
        s->end_reason = "moved";
        s->quit = 1;
        return;
    }
    /* ACL changes reach the selected mailbox before any command */
    if (s->state == IMAP_SELECTED && imap_sel_rights_refresh(s))
        return;
    if (!imap_quoted_utf8_ok(s)) {
        imap_search_refused(s);
        imap_tagged(s, "BAD", "Invalid UTF-8 in a quoted string");
        return;
    }
    /* any state */
    switch (c->id) {
    case IMAPPARSE_CMD_CAPABILITY:
        imap_capabilities(s, &caps);
        prot_printf(s->p, "* CAPABILITY %s\r\n", buf_cstring(&caps));
        buf_free(&caps);
        imap_tagged(s, "OK", "CAPABILITY completed");
        return;
    case IMAPPARSE_CMD_NOOP:
        /* the selected mailbox's news come with the tagged reply */
        imap_tagged(s, "OK", "NOOP completed");
        return;
    case IMAPPARSE_CMD_LOGOUT:
        /* a second reference keeps the mailbox open past the unselect:
         * its unsynced flag changes are synced after the reply */
        if (s->sel && mailbox_unsynced(s->sel) &&
            mailbox_open(s->srv->conf, mailbox_name(s->sel),
                         mailbox_partition(s->sel),
                         &s->logout_mb) != STORE_OK)
            s->logout_mb = NULL;
        imap_unselect(s, 0);
        prot_printf(s->p, "* BYE %s LOGOUT received\r\n",
                    s->srv->servername);
        imap_tagged(s, "OK", "LOGOUT completed");
        s->end_reason = "logout";
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
        case IMAPPARSE_CMD_APPEND: {
            /* LITERAL+ data: drop it to stay in sync (a synchronizing
             * literal is refused by imap_continue()) */
            int pr = IMAPPARSE_OK;

            while (pr == IMAPPARSE_OK &&
                   c->append.event != IMAPPARSE_APPEND_END) {
                if ((c->append.event == IMAPPARSE_APPEND_MESSAGE ||
                     c->append.event == IMAPPARSE_APPEND_TEXT) &&
                    c->append.size &&
                    prot_read(s->p, NULL, c->append.size) != PROT_OK) {
                    s->quit = 1;
                    return;
                }
                pr = imapparse_append_next(s->p, &s->opts, c);
            }
            if (!imapparse_in_sync(pr)) {
                s->quit = 1;
                return;
            }
            imap_tagged(s, "BAD", "Please log in first");
            return;
        }
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
    case IMAPPARSE_CMD_COMPRESS:
        imap_cmd_compress(s);
        break;
    case IMAPPARSE_CMD_LIST:
        imap_cmd_list(s, 0);
        break;
    case IMAPPARSE_CMD_LSUB:
        imap_cmd_list(s, 1);
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
    case IMAPPARSE_CMD_SETACL: aclcmd_setacl(s); break;
    case IMAPPARSE_CMD_DELETEACL: aclcmd_deleteacl(s); break;
    case IMAPPARSE_CMD_GETACL: aclcmd_getacl(s); break;
    case IMAPPARSE_CMD_LISTRIGHTS: aclcmd_listrights(s); break;
    case IMAPPARSE_CMD_MYRIGHTS: aclcmd_myrights(s); break;
    case IMAPPARSE_CMD_GETQUOTA: quotacmd_getquota(s); break;
    case IMAPPARSE_CMD_GETQUOTAROOT: quotacmd_getquotaroot(s); break;
    case IMAPPARSE_CMD_SETQUOTA: quotacmd_setquota(s); break;
    case IMAPPARSE_CMD_APPEND:
        appendcmd_append(s);
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
    case IMAPPARSE_CMD_SORT:
    case IMAPPARSE_CMD_THREAD:
    case IMAPPARSE_CMD_FETCH:
    case IMAPPARSE_CMD_STORE:
    case IMAPPARSE_CMD_COPY:
    case IMAPPARSE_CMD_MOVE:
        if (s->state != IMAP_SELECTED) {
            imap_tagged(s, "BAD", "No mailbox selected");
        } else if (imap_saved_subst(s) != 0) {
            imap_store_no(s, STORE_NOMEM);
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
        } else if (c->id == IMAPPARSE_CMD_FETCH) {
            imap_cmd_fetch(s);
        } else if (c->id == IMAPPARSE_CMD_STORE) {
            imap_cmd_store(s);
        } else if (c->id == IMAPPARSE_CMD_EXPUNGE) {
            imap_cmd_expunge(s);
        } else if (c->id == IMAPPARSE_CMD_COPY) {
            imap_cmd_copy(s, 0);
        } else if (c->id == IMAPPARSE_CMD_MOVE) {
            imap_cmd_copy(s, 1);
        } else if (c->id == IMAPPARSE_CMD_SORT) {
            imap_cmd_sort(s);
        } else if (c->id == IMAPPARSE_CMD_THREAD) {
            imap_cmd_thread(s);
        } else {
            imap_cmd_search(s);
        }
        break;
    default:
        imap_tagged(s, "BAD", "Unrecognized command");
        break;
    }
}

/* The session's end line:
 *   imap: session end user=<U> peer=<P> reason=<R> duration=<S.mmm>
 *   commands=<N> bytes_in=<N> bytes_out=<N> appended=<N> fetched=<N>
 *   expunged=<N>
 * user=<> before a login. */
static void imap_log_end(struct imap_session *s, uint64_t t_start)
{
    uint64_t now = metrics_now_us();
    uint64_t us = now > t_start ? now - t_start : 0;

    log_info("imap: session end user=<%s> peer=<%s> reason=<%s> "
             "duration=<%llu.%03llu> commands=<%lu> bytes_in=<%llu> "
             "bytes_out=<%llu> appended=<%lu> fetched=<%lu> expunged=<%lu>",
             s->userid ? s->userid : "", s->conn->peer,
             s->end_reason ? s->end_reason : "disconnect",
             (unsigned long long)(us / 1000000),
             (unsigned long long)(us / 1000 % 1000), s->ncommands,
             prot_bytes_in(s->p), prot_bytes_out(s->p), s->nappended,
             s->nfetched, s->nexpunged);
}

/* Flag changes the session left unsynced in its selected mailbox
 * (mailbox.h) are synced when the client sends nothing for a second:
 * a burst of STOREs costs no sync, an idle session's changes do not wait
 * for the mailbox's next commit round.  Waits at most that second; the
 * command that arrives meanwhile is read as usual. */
#define IMAP_FLUSH_DELAY_MS 1000
static void imap_idle_flush(struct imap_session *s)
{
    struct pollfd pfd;

    if (!s->sel || !mailbox_unsynced(s->sel) || s->conn->fd < 0 ||
        prot_line_ready(s->p))
        return;
    pfd.fd = s->conn->fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, IMAP_FLUSH_DELAY_MS) == 0)
        mailbox_flush(s->sel);
}

void imap_serve(struct imap_server *srv, struct prot *p,
                const struct imap_conn *conn)
{
    struct imap_session s;
    struct buf caps = BUF_INITIALIZER;
    uint64_t t_start;
    int r;

    memset(&s, 0, sizeof(s));
    s.srv = srv;
    s.p = p;
    s.conn = conn;
    s.opts.cont = imap_continue;
    s.opts.rock = &s;
    /* a message over the limit is refused before its data */
    s.opts.max_append = imap_appendlimit(srv);
    imapparse_cmd_init(&s.cmd);
    t_start = metrics_now_us();
    prot_settimeout(p, srv->prelogin_timeout);
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
        imap_idle_flush(&s);
        if (service_stopping()) {
            prot_puts(p, "* BYE Server shutting down\r\n");
            s.end_reason = "shutdown";
            break;
        }
        s.append_refused = 0;
        /* an idle client does not hold up a shutdown */
        prot_set_interrupt(p, service_stopping);
        r = imapparse_read(p, &s.opts, &s.cmd);
        prot_set_interrupt(p, NULL);
        switch (r) {
        case IMAPPARSE_OK: {
            uint64_t t0 = metrics_now_us();

            s.ncommands++;
            imap_command(&s);
            metrics_imap_command((int)s.cmd.id, t0);
            break;
        }
        case IMAPPARSE_BAD:
        case IMAPPARSE_TOOBIG:
            s.ncommands++;
            imap_search_refused(&s);
            /* RFC 7889: a message over APPENDLIMIT is NO [TOOBIG] */
            if (r == IMAPPARSE_TOOBIG && s.cmd.id == IMAPPARSE_CMD_APPEND &&
                (s.cmd.append.event == IMAPPARSE_APPEND_MESSAGE ||
                 s.cmd.append.event == IMAPPARSE_APPEND_TEXT) &&
                s.cmd.append.size > s.opts.max_append)
                imap_tagged(&s, "NO", "[TOOBIG] %s", s.cmd.error);
            else
                imap_tagged(&s, "BAD", "%s", s.cmd.error);
            break;
        case IMAPPARSE_REFUSED:
            s.ncommands++;
            if (s.append_refused == 1 && s.state != IMAP_NOTAUTH)
                imap_tagged(&s, "NO", "%s", s.cmd.error);
            else
                imap_tagged(&s, "BAD", "%s", s.cmd.error);
            break;
        case IMAPPARSE_BADCHARSET:
            s.ncommands++;
            imap_search_refused(&s);
            if (s.utf8_accept && s.cmd.id == IMAPPARSE_CMD_SEARCH)
                imap_tagged(&s, "BAD", "SEARCH takes no CHARSET after "
                                       "ENABLE UTF8=ACCEPT");
            else
                imap_tagged(&s, "NO", "[BADCHARSET (US-ASCII UTF-8)] %s",
                            s.cmd.error);
            break;
        case IMAPPARSE_TIMEOUT:
            prot_puts(p, "* BYE Autologout; idle for too long\r\n");
            s.end_reason = "autologout";
            s.quit = 1;
            break;
        case IMAPPARSE_INTERRUPTED:
            prot_puts(p, "* BYE Server shutting down\r\n");
            s.end_reason = "shutdown";
            s.quit = 1;
            break;
        case IMAPPARSE_DESYNC:
        case IMAPPARSE_NOMEM:
            prot_printf(p, "* BYE %s\r\n", s.cmd.error ? s.cmd.error
                                                       : "Protocol error");
            s.end_reason = "error";
            s.quit = 1;
            break;
        default:        /* EOF, IOERROR */
            s.quit = 1;
            break;
        }
    }
    prot_flush(p);
    mailbox_close(&s.logout_mb);
    imap_log_end(&s, t_start);
out:
    imap_unselect(&s, 0);
    seen_close(&s.seendb);
    free(s.seenchg);
    buf_free(&s.seen_prev);
    free(s.saved_ranges);
    imapparse_cmd_free(&s.cmd);
    buf_free(&s.line);
    buf_free(&s.inbox);
    buf_free(&s.serverdomain);
    free(s.userid);
    saslserver_free(&s.sasl);
}

/* ---- for the command family files (imapcmd.h) ------------------------ */

const struct imapparse_cmd *imap_cmd_args(const struct imap_session *s)
{
    return &s->cmd;
}

struct prot *imap_prot(const struct imap_session *s)
{
    return s->p;
}

const struct imapconf *imap_conf(const struct imap_session *s)
{
    return s->srv->conf;
}

const struct userid_policy *imap_policy(const struct imap_session *s)
{
    return &s->srv->policy;
}

const char *imap_userid(const struct imap_session *s)
{
    return s->userid ? s->userid : "";
}

const char *imap_user_domain(const struct imap_session *s)
{
    return s->domain;
}

struct mboxlist *imap_mboxlist(struct imap_session *s)
{
    return imap_ml(s->srv);
}

void imap_reply(struct imap_session *s, const char *status,
                const char *fmt, ...)
{
    struct buf b = BUF_INITIALIZER;
    va_list ap;

    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    imap_tagged(s, status, "%s", b.s ? buf_cstring(&b) : "");
    buf_free(&b);
}

void imap_reply_store_error(struct imap_session *s, int r)
{
    imap_store_no(s, r);
}

size_t imap_append_limit(const struct imap_session *s)
{
    return imap_appendlimit(s->srv);
}

int imap_append_next(struct imap_session *s)
{
    return imapparse_append_next(s->p, &s->opts, &s->cmd);
}

void imap_set_append(struct imap_session *s, struct appendcmd *a)
{
    s->app = a;
}

int imap_append_refused(const struct imap_session *s)
{
    return s->append_refused;
}

size_t imap_max_append(const struct imap_session *s)
{
    return s->opts.max_append;
}

void imap_count_appended(struct imap_session *s, size_t n)
{
    s->nappended += n;
}

void imap_end_session(struct imap_session *s, const char *reason)
{
    if (reason)
        s->end_reason = reason;
    s->quit = 1;
}

int imap_utf8_accepted(const struct imap_session *s)
{
    return s->utf8_accept;
}

const char *imap_servername(const struct imap_session *s)
{
    return s->srv->servername;
}

struct mailbox *imap_selected_mailbox(const struct imap_session *s)
{
    return s->state == IMAP_SELECTED ? s->sel : NULL;
}

void imap_put_quoted(struct prot *p, const char *str)
{
    imap_quoted(p, str);
}

const char *imap_admins(const struct imap_session *s)
{
    return s->srv->admins;
}

const char *imap_inbox(const struct imap_session *s)
{
    return s->inbox.len ? buf_cstring((struct buf *)&s->inbox) : "";
}
