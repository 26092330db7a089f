/*
 * store.c - error codes shared by the mailbox store, and the few helpers
 * its small databases (seen, subscriptions, quota, duplicate) share.
 *
 * The texts, the temporary/permanent split and the mappings from the
 * cyrusdb layer and from errno live here so that every module of the store
 * classifies the same failure the same way.  No state.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "store/mboxname.h"
#include "store/store.h"

const char *store_strerror(int r)
{
    switch (r) {
    case STORE_OK:             return "success";
    case STORE_NOTFOUND:       return "mailbox or record does not exist";
    case STORE_EXISTS:         return "mailbox or record already exists";
    case STORE_BADNAME:        return "invalid mailbox name";
    case STORE_BADPARTITION:   return "partition not configured";
    case STORE_PERMISSION:     return "permission denied";
    case STORE_OVERQUOTA:      return "over quota";
    case STORE_TOOBIG:         return "message too big";
    case STORE_BADMESSAGE:     return "message malformed";
    case STORE_BUSY:           return "resource busy, try again later";
    case STORE_IOERROR:        return "system I/O error";
    case STORE_NOSPACE:        return "no space left on device";
    case STORE_CORRUPT:        return "mailbox index corrupt, needs reconstruct";
    case STORE_NOMEM:          return "out of memory";
    case STORE_NOTIMPLEMENTED: return "operation not implemented";
    case STORE_INTERNAL:       return "internal error";
    default:                   return "unknown store error";
    }
}

int store_is_temporary(int r)
{
    switch (r) {
    case STORE_BUSY:
    case STORE_IOERROR:
    case STORE_NOSPACE:
    case STORE_CORRUPT:
    case STORE_NOMEM:
    case STORE_INTERNAL:
    case STORE_OVERQUOTA:
        return 1;
    case STORE_OK:
    case STORE_NOTFOUND:
    case STORE_EXISTS:
    case STORE_BADNAME:
    case STORE_BADPARTITION:
    case STORE_PERMISSION:
    case STORE_TOOBIG:
    case STORE_BADMESSAGE:
    case STORE_NOTIMPLEMENTED:
        return 0;
    default:
        /* An unknown code is a programming error: never bounce mail on it. */
        return 1;
    }
}

int store_from_cyrusdb(int r)
{
    switch (r) {
    case CYRUSDB_OK:
    case CYRUSDB_DONE:
        return STORE_OK;
    case CYRUSDB_NOTFOUND:
        return STORE_NOTFOUND;
    case CYRUSDB_EXISTS:
        return STORE_EXISTS;
    case CYRUSDB_AGAIN:
    case CYRUSDB_LOCKED:
        return STORE_BUSY;
    case CYRUSDB_FULL:
        return STORE_NOSPACE;
    default:
        return STORE_IOERROR;
    }
}

int store_from_errno(int e)
{
    switch (e) {
    case 0:
        return STORE_OK;
    case ENOSPC:
#ifdef EDQUOT
    case EDQUOT:
#endif
        return STORE_NOSPACE;
    case ENOMEM:
        return STORE_NOMEM;
    case ENOENT:
        return STORE_NOTFOUND;
    case EEXIST:
        return STORE_EXISTS;
    case EAGAIN:
#if defined(EWOULDBLOCK) && EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case EINTR:
        return STORE_BUSY;
    default:
        return STORE_IOERROR;
    }
}

/* ---- helpers ---------------------------------------------------------- */

int store_parse_u64(const char *p, size_t len, uint64_t max, uint64_t *v_r)
{
    uint64_t v = 0;
    size_t i;

    if (!p || len == 0 || len > 20)
        return -1;
    if (p[0] == '0' && len > 1)
        return -1;
    for (i = 0; i < len; i++) {
        unsigned d;
        if (p[i] < '0' || p[i] > '9')
            return -1;
        d = (unsigned)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (v > max)
        return -1;
    *v_r = v;
    return 0;
}

int store_user_path(const struct imapconf *conf, const char *userid,
                    const char *suffix, struct buf *path)
{
    const char *confdir = imapconf_getstring(conf, "configdirectory");
    char safe[64];
    struct buf inbox = BUF_INITIALIZER;
    const char *at;
    size_t len, llen, i;
    char h;

    len = userid ? strnlen(userid, STORE_USERID_MAX + 1) : 0;
    if (len == 0 || len > STORE_USERID_MAX || !strcmp(userid, ".") ||
        !strcmp(userid, "..")) {
        log_error("store: user id refused userid=<%s> reason=<%s>",
                  userid ? log_sanitize(userid, len, safe, sizeof(safe)) : "",
                  len == 0 ? "empty" : len > STORE_USERID_MAX ? "too long"
                                                             : "dot name");
        return STORE_BADNAME;
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)userid[i];
        if (c == '/' || c < 0x20 || c == 0x7f) {
            log_error("store: user id refused userid=<%s> reason=<%s>",
                      log_sanitize(userid, len, safe, sizeof(safe)),
                      c == '/' ? "slash" : "control byte");
            return STORE_BADNAME;
        }
    }
    if (!confdir || !*confdir) {
        log_error("store: configdirectory is not set");
        return STORE_IOERROR;
    }
    /* "alice@D": the file lives under the domain's directory */
    at = memchr(userid, '@', len);
    llen = at ? (size_t)(at - userid) : len;
    if (at) {
        struct buf lower = BUF_INITIALIZER;
        const char *why = NULL;
        size_t dlen = len - llen - 1;

        if (mboxname_domain_check(at + 1, dlen, &lower, &why) != STORE_OK ||
            memcmp(lower.s, at + 1, dlen) != 0 || llen == 0) {
            buf_free(&lower);
            log_error("store: user id refused userid=<%s> reason=<%s>",
                      log_sanitize(userid, len, safe, sizeof(safe)),
                      llen == 0 ? "empty local part"
                                : why ? why : "upper-case domain");
            return STORE_BADNAME;
        }
        buf_free(&lower);
    }
    if (buf_setcstr(&inbox, MBOXNAME_USER_PREFIX) < 0 ||
        buf_append(&inbox, userid, llen) < 0) {
        buf_free(&inbox);
        return STORE_NOMEM;
    }
    h = mboxname_hash_letter(buf_cstring(&inbox));
    buf_free(&inbox);
    buf_reset(path);
    if (buf_printf(path, "%s/", confdir) < 0)
        return STORE_NOMEM;
    if (at && (buf_printf(path, "domain/%c/",
                          mboxname_domain_hash_letter(at + 1)) < 0 ||
               buf_append(path, at + 1, len - llen - 1) < 0 ||
               buf_putc(path, '/') < 0))
        return STORE_NOMEM;
    if (buf_printf(path, "user/%c/", h) < 0 ||
        buf_append(path, userid, llen) < 0 ||
        buf_printf(path, ".%s", suffix) < 0)
        return STORE_NOMEM;
    return STORE_OK;
}

int store_db_unlink(const char *fname)
{
    static const char *const siblings[] = { "-lock", NULL };
    struct buf other = BUF_INITIALIZER;
    int r = STORE_OK, i;

    if (unlink(fname) < 0) {
        int e = errno;
        if (e == ENOENT)
            return STORE_NOTFOUND;
        log_error("store: unlink failed file=<%s> error=<%s>", fname,
                  strerror(e));
        return store_from_errno(e);
    }
    for (i = 0; siblings[i]; i++) {
        buf_reset(&other);
        if (buf_printf(&other, "%s%s", fname, siblings[i]) < 0) {
            r = STORE_NOMEM;
            break;
        }
        if (unlink(buf_cstring(&other)) < 0 && errno != ENOENT) {
            log_error("store: unlink failed file=<%s> error=<%s>",
                      buf_cstring(&other), strerror(errno));
            r = STORE_IOERROR;
        }
    }
    buf_free(&other);
    return r;
}

struct store_copy_rock {
    struct cyrusdb *to;
    struct cyrusdb_txn *tid;
    int dbr;
    store_rekey_fn *rekey;
    void *rekey_rock;
    struct buf key;
    int nomem;
};

static int store_copy_cb(void *rock, const char *key, size_t keylen,
                         const char *data, size_t datalen)
{
    struct store_copy_rock *cr = rock;

    if (cr->rekey) {
        if (buf_setmap(&cr->key, key, keylen) < 0 ||
            cr->rekey(cr->rekey_rock, key, keylen, &cr->key) < 0 ||
            cr->key.len == 0) {
            cr->nomem = 1;
            return 1;
        }
        key = cr->key.s;
        keylen = cr->key.len;
    }
    cr->dbr = cyrusdb_store(cr->to, key, keylen, data, datalen, &cr->tid);
    return cr->dbr != CYRUSDB_OK;
}

int store_db_copy(const char *backend, int flags, const char *from,
                  const char *to, store_rekey_fn *rekey, void *rekey_rock)
{
    struct cyrusdb *src = NULL;
    struct store_copy_rock cr = { NULL, NULL, CYRUSDB_OK, rekey, rekey_rock,
                                  BUF_INITIALIZER, 0 };
    int r;

    flags &= CYRUSDB_MBOXSORT;
    r = cyrusdb_open(backend, from, flags, &src, NULL);
    if (r != CYRUSDB_OK)
        return store_from_cyrusdb(r);
    r = cyrusdb_open(backend, to, flags | CYRUSDB_CREATE, &cr.to, NULL);
    if (r != CYRUSDB_OK) {
        cyrusdb_close(&src);
        return r == CYRUSDB_NOTFOUND ? STORE_IOERROR : store_from_cyrusdb(r);
    }
    r = cyrusdb_foreach(src, NULL, 0, NULL, store_copy_cb, &cr, NULL);
    buf_free(&cr.key);
    if (cr.nomem) {
        if (cr.tid)
            cyrusdb_abort(cr.to, cr.tid);
        cyrusdb_close(&cr.to);
        cyrusdb_close(&src);
        return STORE_NOMEM;
    }
    if (r != CYRUSDB_OK) {
        if (r > 0)
            r = cr.dbr;
        log_error("store: copy failed from=<%s> to=<%s> error=<%s>", from, to,
                  cyrusdb_strerror(r));
        if (cr.tid)
            cyrusdb_abort(cr.to, cr.tid);
    } else if (cr.tid) {
        r = cyrusdb_commit(cr.to, cr.tid);
        if (r != CYRUSDB_OK)
            log_error("store: copy commit failed to=<%s> error=<%s>", to,
                      cyrusdb_strerror(r));
    }
    cyrusdb_close(&cr.to);
    cyrusdb_close(&src);
    if (r != CYRUSDB_OK)
        return r == CYRUSDB_NOTFOUND ? STORE_IOERROR : store_from_cyrusdb(r);
    return STORE_OK;
}

/* ---- per-user databases --------------------------------------------- */

int store_user_db_open(const struct imapconf *conf, const char *userid,
                       const char *suffix, const char *backend_key, int flags,
                       struct cyrusdb **db_r, char **fname_r)
{
    const char *backend = imapconf_getstring(conf, backend_key);
    struct buf path = BUF_INITIALIZER;
    int r;

    *db_r = NULL;
    *fname_r = NULL;
    if (!backend)
        return STORE_IOERROR;
    r = store_user_path(conf, userid, suffix, &path);
    /* the directories made durable: the database's creation syncs only
     * the directory it is in */
    if (r == STORE_OK &&
        fs_mkdir_parent_synced(buf_cstring(&path), 0755) < 0) {
        log_error("store: mkdir failed file=<%s> error=<%s>",
                  buf_cstring(&path), strerror(errno));
        r = STORE_IOERROR;
    }
    if (r == STORE_OK) {
        r = cyrusdb_open(backend, buf_cstring(&path), CYRUSDB_CREATE | flags,
                         db_r, NULL);
        if (r != CYRUSDB_OK) {
            *db_r = NULL;
            r = r == CYRUSDB_NOTFOUND ? STORE_IOERROR : store_from_cyrusdb(r);
        }
    }
    if (r == STORE_OK)
        *fname_r = buf_release(&path);
    buf_free(&path);
    return r;
}

int store_user_db_delete(const struct imapconf *conf, const char *userid,
                         const char *suffix)
{
    struct buf path = BUF_INITIALIZER;
    int r;

    r = store_user_path(conf, userid, suffix, &path);
    if (r == STORE_OK)
        r = store_db_unlink(buf_cstring(&path));
    buf_free(&path);
    return r;
}

int store_user_db_rename(const struct imapconf *conf, const char *olduser,
                         const char *newuser, const char *suffix,
                         const char *backend_key, int flags,
                         store_rekey_fn *rekey, void *rekey_rock)
{
    const char *backend = imapconf_getstring(conf, backend_key);
    struct buf from = BUF_INITIALIZER, to = BUF_INITIALIZER;
    int r;

    r = store_user_path(conf, olduser, suffix, &from);
    if (r == STORE_OK)
        r = store_user_path(conf, newuser, suffix, &to);
    if (r == STORE_OK && !strcmp(buf_cstring(&from), buf_cstring(&to)))
        goto out;    /* same user: nothing to do */
    if (r == STORE_OK && fs_mkdir_parent(buf_cstring(&to), 0755) < 0) {
        log_error("store: mkdir failed file=<%s> error=<%s>",
                  buf_cstring(&to), strerror(errno));
        r = STORE_IOERROR;
    }
    if (r == STORE_OK)
        r = store_db_copy(backend, flags, buf_cstring(&from),
                          buf_cstring(&to), rekey, rekey_rock);
    if (r == STORE_OK)
        r = store_db_unlink(buf_cstring(&from));
    if (r == STORE_OK)
        log_info("store: user database renamed from=<%s> to=<%s>",
                 buf_cstring(&from), buf_cstring(&to));
out:
    buf_free(&from);
    buf_free(&to);
    return r;
}
