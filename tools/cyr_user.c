/*
 * cyr_user - placement and moves of users in the frontend tier.
 *
 *   cyr_user [-C imapd.conf] where USER
 *   cyr_user [-C imapd.conf] load
 *   cyr_user [-C imapd.conf] create USER [BACKEND]
 *   cyr_user [-C imapd.conf] delete USER
 *   cyr_user [-C imapd.conf] move USER BACKEND
 *
 * Runs where the directory (directory_db, etcd for a tier) and the
 * backends' IMAP services (proxy_imap_backends) can be reached, with a
 * frontend's imapd.conf.  It speaks IMAP to the backends as
 * proxy_authname (an admin there: `admins` and `proxyservers`), over
 * STARTTLS when proxy_starttls is on (verified as the frontend does).
 *
 * create: the backend named, or the one with the fewest mailboxes (LIST
 *   "" "*" as admin on each); CREATE of the INBOX as admin; then, logged
 *   in as the user (proxy authorization), the autocreate_inbox_folders
 *   of this configuration (special uses from xlist-*) and SUBSCRIBE of
 *   each and of the INBOX; SETQUOTA when autocreate_quota > 0; then the
 *   directory record, created only when absent (a transaction that fails
 *   when the key exists: never two placements).  When the record cannot
 *   be written the INBOX is deleted again.
 * delete: DELETE of the INBOX as admin on the user's backend (the tree,
 *   quota root, seen state, subscriptions), then the record, removed only
 *   while it still names that backend.
 * move: runs xfer_command (mbtool on a backend) for both backends:
 *   `FROM user-dump USER | TO user-load USER` (the dump marks the user
 *   "moving" on FROM: 451 there from then on), then the record is
 *   changed from FROM to TO in one compare-and-swap transaction, then
 *   FROM marks the user "moved TO" and removes its copy (`user-purge -s
 *   STAMP`: only when nothing changed there since the dump).  A failure
 *   before the record changed undoes the load and the mark.
 *
 * Exit status: 0 done, 1 failed (message on stderr), 2 usage.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_etcd.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/netdial.h"
#include "lib/prot.h"
#include "lib/strarray.h"
#include "lib/tls.h"
#include "store/autocreate.h"
#include "store/directory.h"
#include "store/userid.h"

#define CYR_USER_EXIT_OK 0
#define CYR_USER_EXIT_FAIL 1
#define CYR_USER_EXIT_USAGE 2
#define CYR_USER_LINE_MAX 65536

static const char *cu_progname = "cyr_user";
static const struct imapconf *cu_conf;
static struct directory_peer *cu_peers;
static size_t cu_npeers;
static struct tls_client *cu_tls;
static struct userid_policy cu_policy;
static struct buf cu_user = BUF_INITIALIZER;

/* The internal user id of a command-line argument (userid_canon(), the
 * way lmtpd and imapd make it), in cu_user.  0, or -1 (said). */
static int cu_userid(const char *arg)
{
    const char *err = NULL;

    if (userid_canon(&cu_policy, arg, NULL, &cu_user, &err) != 0) {
        fprintf(stderr, "%s: not a user id: %s (%s)\n", cu_progname, arg,
                err ? err : "invalid");
        return -1;
    }
    return 0;
}

static void cu_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] COMMAND [ARGS]\n"
"\n"
"Placement and moves of users in the frontend tier (a frontend's\n"
"imapd.conf: directory_db, proxy_imap_backends, proxy_authname,\n"
"proxy_password, xfer_command).\n"
"\n"
"  where USER                 the backend the directory names\n"
"  load                       each backend's number of mailboxes\n"
"  create USER [BACKEND]      place USER on BACKEND (default: the one with\n"
"                             the fewest mailboxes) and write its record\n"
"  delete USER                remove USER's mailboxes and its record\n"
"  move USER BACKEND          move USER with all its mail to BACKEND\n"
"\n"
"  -C FILE   the imapd.conf (default %s)\n"
"Exit status: 0 done, 1 failed, 2 usage.\n",
            cu_progname, IMAPCONF_DEFAULT_PATH);
}

static int cu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int cu_fail(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: ", cu_progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CYR_USER_EXIT_FAIL;
}

/* ---- the directory --------------------------------------------------------- */

static int cu_dir_open(struct cyrusdb **db_r)
{
    const char *backend = imapconf_getstring(cu_conf, "directory_db");
    const char *path = imapconf_getstring(cu_conf, "directory_db_path");
    struct buf b = BUF_INITIALIZER;
    const char *err = NULL;
    int r;

    if (!path || !*path) {
        buf_printf(&b, "%s/directory.db",
                   imapconf_getstring(cu_conf, "configdirectory"));
        path = buf_cstring(&b);
    }
    r = cyrusdb_open(backend, path, CYRUSDB_CREATE, db_r, &err);
    if (r != CYRUSDB_OK)
        cu_fail("cannot open the directory %s: %s", path,
                err ? err : cyrusdb_strerror(r));
    buf_free(&b);
    return r == CYRUSDB_OK ? 0 : -1;
}

/* The record of userid into out: 1 found, 0 none, -1 error (said). */
static int cu_dir_get(const char *userid, struct buf *out)
{
    struct cyrusdb *db = NULL;
    const char *data;
    size_t len;
    int r, ret = -1;

    if (cu_dir_open(&db))
        return -1;
    r = cyrusdb_fetch(db, userid, strlen(userid), &data, &len, NULL);
    if (r == CYRUSDB_OK) {
        buf_setmap(out, data, len);
        ret = 1;
    } else if (r == CYRUSDB_NOTFOUND) {
        ret = 0;
    } else {
        cu_fail("cannot read the directory: %s", cyrusdb_strerror(r));
    }
    cyrusdb_close(&db);
    return ret;
}

/* After a commit of cu_dir_cas() that failed with an unknown outcome:
 * read the record again (for up to CU_OUTCOME_TRIES tries) and decide.
 * 0: it holds value (the write went through), -1: it holds expect (it
 * did not), -2: still unknown (unreadable, or something else). */
#define CU_OUTCOME_TRIES 10

static int cu_dir_outcome(const char *userid, const char *expect,
                          const char *value)
{
    struct buf b = BUF_INITIALIZER;
    int i, r = -1;

    for (i = 0; i < CU_OUTCOME_TRIES; i++) {
        if (i)
            sleep(1);
        r = cu_dir_get(userid, &b);
        if (r < 0)
            continue;
        if (value ? (r == 1 && strcmp(buf_cstring(&b), value) == 0)
                  : r == 0) {
            fprintf(stderr, "%s: the write went through after all: the "
                    "record of %s is %s\n", cu_progname, userid,
                    value ? value : "gone");
            r = 0;
        } else if (expect ? (r == 1 &&
                             strcmp(buf_cstring(&b), expect) == 0)
                          : r == 0) {
            r = -1;
        } else {
            r = -2;
        }
        buf_free(&b);
        return r;
    }
    buf_free(&b);
    return -2;
}

/* Compare and swap the record of userid: it must be `expect` (NULL:
 * absent); it becomes `value` (NULL: removed).  One transaction (etcd:
 * one txn whose compares are what was read).  0, -1 (not written;
 * said), or -2: the commit failed without saying whether it was applied
 * and the record could not be read back to tell (said): the caller must
 * not undo anything that rests on either answer. */
static int cu_dir_cas(const char *userid, const char *expect,
                      const char *value)
{
    struct cyrusdb *db = NULL;
    struct cyrusdb_txn *tid = NULL;
    const char *data = NULL;
    size_t len = 0;
    int r, ret = -1;

    if (cu_dir_open(&db))
        return -1;
    r = cyrusdb_fetchlock(db, userid, strlen(userid), &data, &len, &tid);
    if (r != CYRUSDB_OK && r != CYRUSDB_NOTFOUND) {
        cu_fail("cannot read the directory: %s", cyrusdb_strerror(r));
        goto out;
    }
    if (expect ? (r != CYRUSDB_OK || len != strlen(expect) ||
                  memcmp(data, expect, len) != 0)
               : r != CYRUSDB_NOTFOUND) {
        cu_fail("the directory record of %s is not %s%s: nothing changed",
                userid, expect ? "" : "absent", expect ? expect : "");
        goto out;
    }
    if (value)
        r = cyrusdb_store(db, userid, strlen(userid), value, strlen(value),
                          &tid);
    else
        r = cyrusdb_delete(db, userid, strlen(userid), &tid, 0);
    if (r == CYRUSDB_OK) {
        r = cyrusdb_commit(db, tid);
        tid = NULL;
    }
    if (r != CYRUSDB_OK) {
        cu_fail("cannot write the directory record of %s: %s%s", userid,
                cyrusdb_strerror(r), r == CYRUSDB_AGAIN
                ? " (changed meanwhile)" : "");
        if (!tid && r != CYRUSDB_AGAIN) {
            /* a commit that failed this way may have been applied (etcd:
             * no answer, or a proposal that timed out): look */
            cyrusdb_close(&db);
            ret = cu_dir_outcome(userid, expect, value);
        }
        goto out;
    }
    ret = 0;
out:
    if (tid)
        cyrusdb_abort(db, tid);
    cyrusdb_close(&db);
    return ret;
}

/* ---- IMAP to a backend ------------------------------------------------------ */

struct cu_imap {
    int fd;
    struct prot *p;
    struct buf line;
    unsigned tag;
    const char *backend;
};

static void cu_imap_close(struct cu_imap *c)
{
    if (c->p && c->fd >= 0) {
        prot_puts(c->p, "Z LOGOUT\r\n");
        prot_flush(c->p);
    }
    prot_free(&c->p);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    buf_free(&c->line);
}

/* The next response line into c->line, literals included (their bytes
 * replace "{N}").  0 or -1 (said). */
static int cu_imap_getline(struct cu_imap *c)
{
    struct buf part = BUF_INITIALIZER;
    int r;

    buf_reset(&c->line);
    for (;;) {
        size_t n;
        unsigned long lit;
        char *open;

        r = prot_getline(c->p, &part, CYR_USER_LINE_MAX, NULL);
        if (r != PROT_OK) {
            buf_free(&part);
            return cu_fail("backend %s: %s", c->backend,
                           r == PROT_EOF ? "connection closed"
                           : r == PROT_TIMEOUT ? "timeout"
                           : prot_error(c->p));
        }
        /* prot_getline leaves the CRLF out */
        n = part.len;
        buf_cstring(&part);
        if (n && part.s[n - 1] == '}' && (open = strrchr(part.s, '{')) &&
            (lit = strtoul(open + 1, NULL, 10)) <= CYR_USER_LINE_MAX) {
            buf_append(&c->line, part.s, (size_t)(open - part.s));
            buf_reset(&part);
            if (lit && prot_read(c->p, &part, lit) != PROT_OK) {
                buf_free(&part);
                return cu_fail("backend %s: literal cut short", c->backend);
            }
            buf_append(&c->line, part.s, part.len);
            continue;
        }
        buf_append(&c->line, part.s, part.len);
        buf_free(&part);
        buf_cstring(&c->line);
        return 0;
    }
}

/* Send a command and read through its tagged reply.  Untagged lines
 * starting with `count_prefix` are counted into *count.  0 for OK; -1
 * otherwise (said, with the reply). */
static int cu_imap_cmd(struct cu_imap *c, const char *count_prefix,
                       unsigned long *count, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int cu_imap_cmd(struct cu_imap *c, const char *count_prefix,
                       unsigned long *count, const char *fmt, ...)
{
    char tag[16];
    struct buf cmd = BUF_INITIALIZER;
    va_list ap;
    size_t tl;

    snprintf(tag, sizeof(tag), "U%u", ++c->tag);
    tl = strlen(tag);
    va_start(ap, fmt);
    buf_vprintf(&cmd, fmt, ap);
    va_end(ap);
    prot_printf(c->p, "%s %s\r\n", tag, buf_cstring(&cmd));
    if (prot_flush(c->p) != PROT_OK) {
        buf_free(&cmd);
        return cu_fail("backend %s: %s", c->backend, prot_error(c->p));
    }
    for (;;) {
        const char *l;

        if (cu_imap_getline(c)) {
            buf_free(&cmd);
            return -1;
        }
        l = buf_cstring(&c->line);
        if (strncmp(l, tag, tl) == 0 && l[tl] == ' ') {
            int ok = strncasecmp(l + tl + 1, "OK", 2) == 0;

            if (!ok)
                cu_fail("backend %s: %s: %s", c->backend, buf_cstring(&cmd),
                        l + tl + 1);
            buf_free(&cmd);
            return ok ? 0 : -1;
        }
        if (count_prefix && count &&
            strncasecmp(l, count_prefix, strlen(count_prefix)) == 0)
            (*count)++;
    }
}

/* An IMAP quoted string of s into out. */
static void cu_quote(struct buf *out, const char *s)
{
    buf_putc(out, '"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            buf_putc(out, '\\');
        buf_putc(out, *s);
    }
    buf_putc(out, '"');
}

/* Connect to backend `name` and authenticate as proxy_authname, for
 * authzid (NULL: as itself, the admin).  0 or -1 (said). */
static int cu_imap_open(struct cu_imap *c, const char *name,
                        const char *authzid)
{
    const char *authname = imapconf_getstring(cu_conf, "proxy_authname");
    const char *password = imapconf_getstring(cu_conf, "proxy_password");
    int timeout = (int)imapconf_getint(cu_conf, "proxy_timeout");
    struct buf blob = BUF_INITIALIZER, b64 = BUF_INITIALIZER;
    const char *why = NULL;
    char host[256];
    int i, ret = -1;
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t k;

    memset(c, 0, sizeof(*c));
    c->fd = -1;
    c->backend = name;
    i = directory_peers_find(cu_peers, cu_npeers, name);
    if (i < 0)
        return cu_fail("no backend %s in proxy_imap_backends", name);
    c->fd = net_dial(cu_peers[i].addr, timeout > 0 ? timeout : 30, &why);
    if (c->fd < 0)
        return cu_fail("backend %s (%s): %s", name, cu_peers[i].addr, why);
    c->p = prot_new(c->fd);
    if (!c->p)
        return cu_fail("out of memory");
    prot_settimeout(c->p, timeout > 0 ? timeout * 4 : 120);
    if (cu_imap_getline(c))
        return -1;
    if (strncasecmp(buf_cstring(&c->line), "* OK", 4) != 0)
        return cu_fail("backend %s: greeting %s", name,
                       buf_cstring(&c->line));
    if (cu_tls) {
        if (cu_imap_cmd(c, NULL, NULL, "STARTTLS"))
            return -1;
        net_dial_host(cu_peers[i].addr, host, sizeof(host));
        if (prot_starttls_client(c->p, cu_tls, host) != PROT_OK)
            return cu_fail("backend %s: TLS: %s", name, prot_error(c->p));
    }
    /* AUTHENTICATE PLAIN with the initial response (SASL-IR) */
    buf_appendcstr(&blob, authzid ? authzid : "");
    buf_putc(&blob, '\0');
    buf_appendcstr(&blob, authname ? authname : "");
    buf_putc(&blob, '\0');
    buf_appendcstr(&blob, password ? password : "");
    for (k = 0; k < blob.len; k += 3) {
        unsigned v = (unsigned)(unsigned char)blob.s[k] << 16;

        if (k + 1 < blob.len)
            v |= (unsigned)(unsigned char)blob.s[k + 1] << 8;
        if (k + 2 < blob.len)
            v |= (unsigned char)blob.s[k + 2];
        buf_putc(&b64, tab[v >> 18]);
        buf_putc(&b64, tab[(v >> 12) & 63]);
        buf_putc(&b64, k + 1 < blob.len ? tab[(v >> 6) & 63] : '=');
        buf_putc(&b64, k + 2 < blob.len ? tab[v & 63] : '=');
    }
    ret = cu_imap_cmd(c, NULL, NULL, "AUTHENTICATE PLAIN %s",
                      buf_cstring(&b64));
    if (blob.s)
        memset(blob.s, 0, blob.len);
    if (b64.s)
        memset(b64.s, 0, b64.len);
    buf_free(&blob);
    buf_free(&b64);
    return ret;
}

/* The user's INBOX as an admin writes it: "user" SEP userid; with '.'
 * as the separator a '.' of the local part is written '^' (the part
 * after '@' is the domain, kept). */
static void cu_inbox_name(const char *userid, struct buf *out)
{
    int unixsep = imapconf_getswitch(cu_conf, "unixhierarchysep");
    const char *at = strchr(userid, '@'), *p;

    buf_reset(out);
    buf_printf(out, "user%c", unixsep ? '/' : '.');
    for (p = userid; *p; p++)
        buf_putc(out, !unixsep && *p == '.' && (!at || p < at) ? '^' : *p);
}

/* ---- commands ---------------------------------------------------------------- */

static int cu_where(int argc, char **argv)
{
    struct buf b = BUF_INITIALIZER;
    int r;

    if (argc != 2)
        return cu_fail("usage: where USER"), CYR_USER_EXIT_USAGE;
    if (cu_userid(argv[1]))
        return CYR_USER_EXIT_FAIL;
    r = cu_dir_get(buf_cstring(&cu_user), &b);
    if (r == 1)
        printf("%s\n", buf_cstring(&b));
    else if (r == 0)
        cu_fail("%s has no directory record", argv[1]);
    buf_free(&b);
    return r == 1 ? CYR_USER_EXIT_OK : CYR_USER_EXIT_FAIL;
}

/* The number of mailboxes of backend i: 0 and *n_r, or -1 (said). */
static int cu_count(size_t i, unsigned long *n_r)
{
    struct cu_imap c;
    int r;

    *n_r = 0;
    r = cu_imap_open(&c, cu_peers[i].name, NULL);
    if (r == 0)
        r = cu_imap_cmd(&c, "* LIST ", n_r, "LIST \"\" \"*\"");
    cu_imap_close(&c);
    return r;
}

static int cu_load(int argc, char **argv)
{
    size_t i;
    int bad = 0;

    (void)argv;
    if (argc != 1)
        return cu_fail("usage: load"), CYR_USER_EXIT_USAGE;
    for (i = 0; i < cu_npeers; i++) {
        unsigned long n;

        if (cu_count(i, &n) == 0)
            printf("%s %lu\n", cu_peers[i].name, n);
        else
            bad = 1;
    }
    return bad ? CYR_USER_EXIT_FAIL : CYR_USER_EXIT_OK;
}

/* The autocreate folders, subscriptions and quota of a new user. */
static int cu_create_folders(const char *backend, const char *userid)
{
    const char *folders = imapconf_getstring(cu_conf,
                                             "autocreate_inbox_folders");
    long quota = imapconf_getint(cu_conf, "autocreate_quota");
    int unixsep = imapconf_getswitch(cu_conf, "unixhierarchysep");
    struct strarray names = STRARRAY_INITIALIZER;
    struct buf name = BUF_INITIALIZER, inbox = BUF_INITIALIZER;
    struct cu_imap c;
    size_t i;
    int r;

    r = cu_imap_open(&c, backend, userid);
    if (r == 0 && folders && *folders)
        strarray_split(&names, folders, "|");
    for (i = 0; r == 0 && i < names.count; i++) {
        const char *use = autocreate_specialuse(cu_conf, names.data[i]);
        struct buf f = BUF_INITIALIZER;

        if (!*names.data[i])
            continue;
        buf_printf(&f, "INBOX%c%s", unixsep ? '/' : '.', names.data[i]);
        buf_reset(&name);
        cu_quote(&name, buf_cstring(&f));
        buf_free(&f);
        if (*use)
            r = cu_imap_cmd(&c, NULL, NULL, "CREATE %s (USE (%s))",
                            buf_cstring(&name), use);
        else
            r = cu_imap_cmd(&c, NULL, NULL, "CREATE %s", buf_cstring(&name));
        if (r == 0)
            r = cu_imap_cmd(&c, NULL, NULL, "SUBSCRIBE %s",
                            buf_cstring(&name));
    }
    if (r == 0)
        r = cu_imap_cmd(&c, NULL, NULL, "SUBSCRIBE INBOX");
    cu_imap_close(&c);
    if (r == 0 && quota > 0) {
        r = cu_imap_open(&c, backend, NULL);
        cu_inbox_name(userid, &inbox);
        buf_reset(&name);
        cu_quote(&name, buf_cstring(&inbox));
        if (r == 0)
            r = cu_imap_cmd(&c, NULL, NULL, "SETQUOTA %s (STORAGE %ld)",
                            buf_cstring(&name), quota);
        cu_imap_close(&c);
    }
    strarray_fini(&names);
    buf_free(&name);
    buf_free(&inbox);
    return r;
}

/* DELETE of the user's INBOX on backend as admin. */
static int cu_delete_inbox(const char *backend, const char *userid)
{
    struct buf inbox = BUF_INITIALIZER, q = BUF_INITIALIZER;
    struct cu_imap c;
    int r;

    cu_inbox_name(userid, &inbox);
    cu_quote(&q, buf_cstring(&inbox));
    r = cu_imap_open(&c, backend, NULL);
    if (r == 0)
        r = cu_imap_cmd(&c, NULL, NULL, "DELETE %s", buf_cstring(&q));
    cu_imap_close(&c);
    buf_free(&inbox);
    buf_free(&q);
    return r;
}

static int cu_create(int argc, char **argv)
{
    struct buf b = BUF_INITIALIZER, inbox = BUF_INITIALIZER;
    struct buf q = BUF_INITIALIZER;
    const char *userid, *backend = NULL;
    unsigned long best = 0;
    struct cu_imap c;
    size_t i;
    int r;

    if (argc < 2 || argc > 3)
        return cu_fail("usage: create USER [BACKEND]"), CYR_USER_EXIT_USAGE;
    if (cu_userid(argv[1]))
        return CYR_USER_EXIT_FAIL;
    userid = buf_cstring(&cu_user);
    r = cu_dir_get(userid, &b);
    if (r != 0) {
        if (r == 1)
            cu_fail("%s is placed already (on %s)", userid,
                    buf_cstring(&b));
        buf_free(&b);
        return CYR_USER_EXIT_FAIL;
    }
    if (argc == 3) {
        backend = argv[2];
        if (directory_peers_find(cu_peers, cu_npeers, backend) < 0)
            return cu_fail("no backend %s in proxy_imap_backends", backend);
    } else {
        for (i = 0; i < cu_npeers; i++) {
            unsigned long n;

            if (cu_count(i, &n) != 0)
                return CYR_USER_EXIT_FAIL;
            if (!backend || n < best) {
                backend = cu_peers[i].name;
                best = n;
            }
        }
    }
    cu_inbox_name(userid, &inbox);
    cu_quote(&q, buf_cstring(&inbox));
    r = cu_imap_open(&c, backend, NULL);
    if (r == 0)
        r = cu_imap_cmd(&c, NULL, NULL, "CREATE %s", buf_cstring(&q));
    cu_imap_close(&c);
    /* from here on the INBOX is ours: a failure deletes it again (an
     * INBOX that existed before made CREATE fail and is never touched) */
    if (r == 0) {
        r = cu_create_folders(backend, userid) != 0 ? -1
            : cu_dir_cas(userid, NULL, backend);
        if (r == -2)
            cu_fail("the record of %s may name %s or nothing: its INBOX "
                    "there is kept (cyr_user where %s)", userid, backend,
                    userid);
        else if (r != 0)
            (void)cu_delete_inbox(backend, userid);
    }
    if (r == 0)
        printf("%s %s\n", userid, backend);
    buf_free(&b);
    buf_free(&inbox);
    buf_free(&q);
    return r == 0 ? CYR_USER_EXIT_OK : CYR_USER_EXIT_FAIL;
}

static int cu_delete(int argc, char **argv)
{
    struct buf b = BUF_INITIALIZER;
    int r;

    if (argc != 2)
        return cu_fail("usage: delete USER"), CYR_USER_EXIT_USAGE;
    if (cu_userid(argv[1]))
        return CYR_USER_EXIT_FAIL;
    r = cu_dir_get(buf_cstring(&cu_user), &b);
    if (r != 1) {
        if (r == 0)
            cu_fail("%s has no directory record", buf_cstring(&cu_user));
        buf_free(&b);
        return CYR_USER_EXIT_FAIL;
    }
    r = cu_delete_inbox(buf_cstring(&b), buf_cstring(&cu_user));
    if (r == 0)
        r = cu_dir_cas(buf_cstring(&cu_user), buf_cstring(&b), NULL);
    buf_free(&b);
    return r == 0 ? CYR_USER_EXIT_OK : CYR_USER_EXIT_FAIL;
}

/* ---- move ------------------------------------------------------------------ */

/* xfer_command for backend, then " ARGS 'userid'". */
static int cu_xfer_cmd(const char *backend, const char *args,
                       const char *userid, struct buf *out)
{
    const char *t = imapconf_getstring(cu_conf, "xfer_command");
    const char *s;

    buf_reset(out);
    if (!t || !*t)
        return cu_fail("xfer_command is not set");
    for (s = t; *s; s++) {
        if (s[0] == '%' && s[1] == 'b') {
            buf_appendcstr(out, backend);   /* a valid name: shell-safe */
            s++;
        } else {
            buf_putc(out, *s);
        }
    }
    buf_printf(out, " %s '", args);
    for (s = userid; *s; s++) {
        if (*s == '\'')
            buf_appendcstr(out, "'\\''");
        else
            buf_putc(out, *s);
    }
    buf_putc(out, '\'');
    return 0;
}

/* Run a shell command with stdin from in_fd (-1: /dev/null as given) and
 * stdout to out_fd (-1: inherited).  The child's pid. */
static pid_t cu_spawn(const char *cmd, int in_fd, int out_fd, int close_fd)
{
    pid_t pid = fork();

    if (pid == 0) {
        if (in_fd >= 0 && dup2(in_fd, 0) < 0)
            _exit(127);
        if (out_fd >= 0 && dup2(out_fd, 1) < 0)
            _exit(127);
        if (close_fd >= 0)
            close(close_fd);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int cu_wait(pid_t pid)
{
    int st;

    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Run cmd to completion; its stdout into out when not NULL.  Exit code. */
static int cu_run(const char *cmd, struct buf *out)
{
    int p[2];
    pid_t pid;
    char chunk[4096];
    ssize_t n;

    if (!out) {
        pid = cu_spawn(cmd, -1, -1, -1);
        return pid < 0 ? -1 : cu_wait(pid);
    }
    if (pipe(p) < 0)
        return -1;
    pid = cu_spawn(cmd, -1, p[1], p[0]);
    close(p[1]);
    while ((n = read(p[0], chunk, sizeof(chunk))) > 0)
        buf_append(out, chunk, (size_t)n);
    close(p[0]);
    return pid < 0 ? -1 : cu_wait(pid);
}

static int cu_move(int argc, char **argv)
{
    struct buf from = BUF_INITIALIZER, dump = BUF_INITIALIZER;
    struct buf load = BUF_INITIALIZER, out = BUF_INITIALIZER;
    struct buf cmd = BUF_INITIALIZER, args = BUF_INITIALIZER;
    const char *userid, *to, *st;
    char stamp[16] = "";
    struct timespec t0, ts, t1;
    int p[2], rd, rl, r, ret = CYR_USER_EXIT_FAIL;
    pid_t pd, pl;

    if (argc != 3)
        return cu_fail("usage: move USER BACKEND"), CYR_USER_EXIT_USAGE;
    if (cu_userid(argv[1]))
        return CYR_USER_EXIT_FAIL;
    userid = buf_cstring(&cu_user);
    to = argv[2];
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (directory_peers_find(cu_peers, cu_npeers, to) < 0)
        return cu_fail("no backend %s in proxy_imap_backends", to);
    r = cu_dir_get(userid, &from);
    if (r != 1) {
        if (r == 0)
            cu_fail("%s has no directory record", userid);
        goto out;
    }
    if (strcmp(buf_cstring(&from), to) == 0) {
        cu_fail("%s is on %s already", userid, to);
        goto out;
    }
    if (!directory_valid_name(from.s, from.len)) {
        cu_fail("damaged directory record of %s", userid);
        goto out;
    }
    if (cu_xfer_cmd(buf_cstring(&from), "user-dump", userid, &dump) ||
        cu_xfer_cmd(to, "user-load", userid, &load))
        goto out;
    /* FROM user-dump | TO user-load */
    if (pipe(p) < 0) {
        cu_fail("pipe: %s", strerror(errno));
        goto out;
    }
    {
        int lo[2];

        if (pipe(lo) < 0) {
            close(p[0]);
            close(p[1]);
            cu_fail("pipe: %s", strerror(errno));
            goto out;
        }
        pd = cu_spawn(buf_cstring(&dump), -1, p[1], p[0]);
        pl = cu_spawn(buf_cstring(&load), p[0], lo[1], p[1]);
        close(p[0]);
        close(p[1]);
        close(lo[1]);
        {
            char chunk[4096];
            ssize_t n;

            while ((n = read(lo[0], chunk, sizeof(chunk))) > 0)
                buf_append(&out, chunk, (size_t)n);
        }
        close(lo[0]);
        rd = pd < 0 ? -1 : cu_wait(pd);
        rl = pl < 0 ? -1 : cu_wait(pl);
    }
    st = strstr(buf_cstring(&out), " stamp=");
    if (rd != 0 || rl != 0 || !st ||
        sscanf(st, " stamp=%15s", stamp) != 1) {
        cu_fail("the copy of %s from %s to %s failed (dump exit %d, load "
                "exit %d): undone", userid, buf_cstring(&from), to, rd, rl);
        goto undo;
    }
    /* the switch: every frontend's next lookup after its cache sends here */
    r = cu_dir_cas(userid, buf_cstring(&from), to);
    if (r == -2) {
        /* either answer may hold: undoing could leave the record naming
         * a backend without the mail; FROM stays "moving" (its mail gets
         * 451 and waits at the MTA), both copies stay */
        cu_fail("the record of %s may name %s or %s: nothing undone; %s "
                "stays marked moving on %s and its copy on %s is kept "
                "(cyr_user where %s, then mbtool user-mark / user-purge "
                "there)", userid, buf_cstring(&from), to, userid,
                buf_cstring(&from), to, userid);
        goto out;
    }
    if (r != 0)
        goto undo;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (cu_xfer_cmd(buf_cstring(&from), "user-mark", userid, &cmd) == 0) {
        buf_printf(&cmd, " moved %s", to);
        if (cu_run(buf_cstring(&cmd), NULL) != 0)
            cu_fail("warning: %s is not marked moved on %s (it stays "
                    "\"moving\": deliveries there still get 451)", userid,
                    buf_cstring(&from));
    }
    buf_reset(&args);
    buf_printf(&args, "user-purge -s %s", stamp);
    if (cu_xfer_cmd(buf_cstring(&from), buf_cstring(&args), userid,
                    &cmd) == 0 && cu_run(buf_cstring(&cmd), NULL) != 0)
        cu_fail("warning: the old copy of %s on %s was not removed (see "
                "above); remove it with mbtool user-purge there", userid,
                buf_cstring(&from));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    {
        const char *counts = strstr(buf_cstring(&out), "mailboxes=");
        size_t clen = counts ? strcspn(counts, "\n") : 0;

        printf("moved %s from %s to %s: %.*s switched=%.3f seconds=%.3f\n",
               userid, buf_cstring(&from), to, (int)clen,
               counts ? counts : "",
               (double)(ts.tv_sec - t0.tv_sec) +
               (double)(ts.tv_nsec - t0.tv_nsec) / 1e9,
               (double)(t1.tv_sec - t0.tv_sec) +
               (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    }
    ret = CYR_USER_EXIT_OK;
    goto out;
undo:
    /* the record still names FROM: remove TO's copy, lift FROM's mark */
    if (rl == 0 && cu_xfer_cmd(to, "user-purge", userid, &cmd) == 0)
        (void)cu_run(buf_cstring(&cmd), NULL);
    if (cu_xfer_cmd(buf_cstring(&from), "user-mark", userid, &cmd) == 0) {
        buf_appendcstr(&cmd, " here");
        (void)cu_run(buf_cstring(&cmd), NULL);
    }
out:
    buf_free(&from);
    buf_free(&dump);
    buf_free(&load);
    buf_free(&out);
    buf_free(&cmd);
    buf_free(&args);
    return ret;
}

int main(int argc, char **argv)
{
    static const struct option cu_longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = IMAPCONF_DEFAULT_PATH, *cmd, *err = NULL;
    struct imapconf *conf = NULL;
    char *cerr = NULL;
    int opt, ret;

    if (argv[0])
        cu_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1
                                            : argv[0];
    log_init(cu_progname, LOG_TO_STDERR);
    log_set_info(0);
    signal(SIGPIPE, SIG_IGN);
    while ((opt = getopt_long(argc, argv, "+C:h", cu_longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': config = optarg; break;
        case 'h': cu_usage(stdout); return CYR_USER_EXIT_OK;
        default: cu_usage(stderr); return CYR_USER_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        cu_usage(stderr);
        return CYR_USER_EXIT_USAGE;
    }
    cmd = argv[optind];
    if (imapconf_load(config, &conf, &cerr) != 0) {
        fprintf(stderr, "%s: %s\n", cu_progname,
                cerr ? cerr : "out of memory");
        free(cerr);
        return CYR_USER_EXIT_FAIL;
    }
    cu_conf = conf;
    cyrusdb_etcd_configure(conf);
    if (userid_policy_init(conf, &cu_policy, &err) != 0) {
        fprintf(stderr, "%s: bad defaultdomain: %s\n", cu_progname,
                err ? err : "out of memory");
        imapconf_free(&conf);
        return CYR_USER_EXIT_FAIL;
    }
    if (directory_peers_parse(imapconf_getstring(conf, "proxy_imap_backends"),
                              &cu_peers, &cu_npeers, &err) != 0) {
        fprintf(stderr, "%s: proxy_imap_backends: %s\n", cu_progname, err);
        imapconf_free(&conf);
        return CYR_USER_EXIT_FAIL;
    }
    if (imapconf_getswitch(conf, "proxy_starttls")) {
        char *terr = NULL;

        if (tls_client_new(imapconf_getstring(conf, "tls_client_ca_file"),
                           &cu_tls, &terr) != 0) {
            fprintf(stderr, "%s: TLS client: %s\n", cu_progname,
                    terr ? terr : "out of memory");
            free(terr);
            imapconf_free(&conf);
            return CYR_USER_EXIT_FAIL;
        }
    }
    argc -= optind;
    argv += optind;
    if (strcmp(cmd, "where") == 0)
        ret = cu_where(argc, argv);
    else if (strcmp(cmd, "load") == 0)
        ret = cu_load(argc, argv);
    else if (strcmp(cmd, "create") == 0)
        ret = cu_create(argc, argv);
    else if (strcmp(cmd, "delete") == 0)
        ret = cu_delete(argc, argv);
    else if (strcmp(cmd, "move") == 0)
        ret = cu_move(argc, argv);
    else {
        fprintf(stderr, "%s: unknown command \"%s\"\n", cu_progname, cmd);
        ret = CYR_USER_EXIT_USAGE;
    }
    tls_client_free(&cu_tls);
    directory_peers_free(cu_peers, cu_npeers);
    userid_policy_free(&cu_policy);
    buf_free(&cu_user);
    imapconf_free(&conf);
    return ret;
}
