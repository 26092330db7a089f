/*
 * quotacmd.c - RFC 9208 QUOTA commands (see quotacmd.h).
 *
 * Every quota access goes through the process's shared handle
 * (quota_shared()), the one the mailbox engine uses, so that imapd never
 * holds two handles on quotas.db.  SETQUOTA sets the root's limits
 * (quota_set(), usage kept) and then brings the usage of every mailbox
 * the root covers in line with its index header (quota_update_mailbox():
 * idempotent, moves a mailbox's usage over from the root that covered it
 * before), as mbtool quota set does.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "imapd/imapcmd.h"
#include "imapd/quotacmd.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "lib/prot.h"
#include "lib/strarray.h"
#include "store/acl.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/store.h"

/* A root's name as the client writes it; an astring. */
static void quotacmd_root_name(struct imap_session *s, const char *root,
                               struct buf *out)
{
    if (imap_to_external(s, root, out) != STORE_OK)
        buf_setcstr(out, root);
}

/* "* QUOTA root (STORAGE u l MESSAGE u l)" for the limited resources. */
static void quotacmd_send(struct imap_session *s, const char *root,
                          const struct quota *q)
{
    struct prot *p = imap_prot(s);
    struct buf ext = BUF_INITIALIZER;
    const char *sp = "";

    quotacmd_root_name(s, root, &ext);
    prot_puts(p, "* QUOTA ");
    imap_put_quoted(p, buf_cstring(&ext));
    prot_puts(p, " (");
    if (q->storage_limit_kb != QUOTA_UNLIMITED) {
        prot_printf(p, "STORAGE %llu %lld",
                    (unsigned long long)(q->used_bytes / 1024),
                    q->storage_limit_kb);
        sp = " ";
    }
    if (q->message_limit != QUOTA_UNLIMITED)
        prot_printf(p, "%sMESSAGE %llu %lld", sp,
                    (unsigned long long)q->used_messages, q->message_limit);
    prot_puts(p, ")\r\n");
    buf_free(&ext);
}

/* A root without any limit is no quota root for IMAP (RFC 9208's QUOTA
 * response lists at least one resource); mbtool can make one. */
static int quotacmd_limited(const struct quota *q)
{
    return q->storage_limit_kb != QUOTA_UNLIMITED ||
           q->message_limit != QUOTA_UNLIMITED;
}

/* May the session read the quota root `root`? */
static int quotacmd_may_read(struct imap_session *s, const char *root)
{
    struct mboxlist_entry *e = NULL;
    const char *inbox = imap_inbox(s);
    int r;

    if (imap_admin_for(s, root))
        return 1;
    if (*inbox && mboxname_is_self_or_child(inbox, root))
        return 1;
    r = imap_lookup(s, root, ACL_READ, &e);
    mboxlist_entry_free(&e);
    return r == STORE_OK;
}

void quotacmd_getquota(struct imap_session *s)
{
    struct buf root = BUF_INITIALIZER;
    struct quota_db *qdb = NULL;
    struct quota q;
    int r;

    if (imap_name_arg(s, 0, &root) != 0)
        goto out;
    if (!quotacmd_may_read(s, buf_cstring(&root))) {
        imap_reply(s, "NO", "[NONEXISTENT] No such quota root");
        goto out;
    }
    r = quota_shared(imap_conf(s), &qdb);
    if (r == STORE_OK)
        r = quota_get(qdb, buf_cstring(&root), &q);
    if (r == STORE_OK && !quotacmd_limited(&q))
        r = STORE_NOTFOUND;
    if (r == STORE_NOTFOUND) {
        imap_reply(s, "NO", "[NONEXISTENT] No such quota root");
        goto out;
    }
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    quotacmd_send(s, buf_cstring(&root), &q);
    imap_reply(s, "OK", "GETQUOTA completed");
out:
    buf_free(&root);
}

void quotacmd_getquotaroot(struct imap_session *s)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    struct buf name = BUF_INITIALIZER, root = BUF_INITIALIZER,
               ext = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct quota_db *qdb = NULL;
    struct prot *p = imap_prot(s);
    struct quota q;
    int r, found = 0;

    if (imap_name_arg(s, 0, &name) != 0)
        goto out;
    /* r, or an admin's l */
    r = imap_lookup(s, buf_cstring(&name),
                    imap_admin_for(s, buf_cstring(&name)) ? 0 : ACL_READ,
                    &e);
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    r = quota_shared(imap_conf(s), &qdb);
    if (r == STORE_OK) {
        r = quota_findroot(qdb, buf_cstring(&name), &root);
        if (r == STORE_OK) {
            r = quota_get(qdb, buf_cstring(&root), &q);
            found = r == STORE_OK && quotacmd_limited(&q);
        }
        if (r == STORE_NOTFOUND)
            r = STORE_OK;
    }
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    /* the mailbox as the client wrote it */
    prot_puts(p, "* QUOTAROOT ");
    imap_put_quoted(p, c->arg[0]);
    if (found) {
        quotacmd_root_name(s, buf_cstring(&root), &ext);
        prot_puts(p, " ");
        imap_put_quoted(p, buf_cstring(&ext));
    }
    prot_puts(p, "\r\n");
    if (found)
        quotacmd_send(s, buf_cstring(&root), &q);
    imap_reply(s, "OK", "GETQUOTAROOT completed");
out:
    mboxlist_entry_free(&e);
    buf_free(&name);
    buf_free(&root);
    buf_free(&ext);
}

/* A limit of SETQUOTA: digits (the parser checked), at most max. */
static int quotacmd_limit(const char *text, long long max, long long *v_r)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(text, &end, 10);
    if (errno || *end || v > (unsigned long long)max)
        return -1;
    *v_r = (long long)v;
    return 0;
}

static int quotacmd_collect(void *rock, const struct mboxlist_entry *e)
{
    struct strarray *names = rock;

    strarray_append(names, e->name);
    strarray_append(names, e->partition);
    return 0;
}

int quotacmd_recount(struct imap_session *s, const char *root)
{
    struct quota_db *qdb = NULL;
    struct strarray names = STRARRAY_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct buf pat = BUF_INITIALIZER;
    struct mboxlist *ml = imap_mboxlist(s);
    int r;

    if (!ml)
        return STORE_IOERROR;
    r = mboxlist_lookup(ml, root, &e);
    if (r == STORE_OK) {
        strarray_append(&names, e->name);
        strarray_append(&names, e->partition);
    }
    mboxlist_entry_free(&e);
    if (r == STORE_OK || r == STORE_NOTFOUND) {
        buf_printf(&pat, "%s.*", root);
        r = mboxlist_list(ml, buf_cstring(&pat), quotacmd_collect, &names);
    }
    for (size_t i = 0; r == STORE_OK && i + 1 < names.count; i += 2) {
        struct mailbox *mb = NULL;
        const struct mailbox_header *h;
        uint64_t used = 0, exists = 0;

        r = mailbox_open(imap_conf(s), names.data[i], names.data[i + 1],
                         &mb);
        if (r == STORE_OK)
            r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
        if (r == STORE_OK) {
            h = mailbox_get_header(mb);
            used = h->quota_used;
            exists = h->exists;
            r = mailbox_unlock(mb);
        }
        mailbox_close(&mb);
        if (r == STORE_NOTFOUND) {
            r = STORE_OK;       /* deleted meanwhile */
            continue;
        }
        /* the mailbox engine may have reopened the shared handle */
        if (r == STORE_OK)
            r = quota_shared(imap_conf(s), &qdb);
        if (r == STORE_OK)
            r = quota_update_mailbox(qdb, names.data[i], used, exists);
        if (r != STORE_OK)
            log_error("imap: quota recount failed mailbox=<%s> error=<%s>",
                      names.data[i], store_strerror(r));
    }
    strarray_fini(&names);
    buf_free(&pat);
    return r;
}

void quotacmd_setquota(struct imap_session *s)
{
    const struct imapparse_cmd *c = imap_cmd_args(s);
    struct buf root = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    struct quota_db *qdb = NULL;
    long long storage = QUOTA_UNLIMITED, messages = QUOTA_UNLIMITED;
    int seen_storage = 0, seen_message = 0, r;
    struct quota q;

    if (imap_name_arg(s, 0, &root) != 0)
        goto out;
    for (size_t i = 0; i + 1 < c->words.n; i += 2) {
        const char *res = c->words.s[i], *val = c->words.s[i + 1];

        if (strcasecmp(res, "STORAGE") == 0 && !seen_storage) {
            seen_storage = 1;
            if (quotacmd_limit(val, QUOTA_STORAGE_MAX_KB, &storage) != 0) {
                imap_reply(s, "BAD", "STORAGE limit out of range");
                goto out;
            }
        } else if (strcasecmp(res, "MESSAGE") == 0 && !seen_message) {
            seen_message = 1;
            if (quotacmd_limit(val, QUOTA_MESSAGE_MAX, &messages) != 0) {
                imap_reply(s, "BAD", "MESSAGE limit out of range");
                goto out;
            }
        } else if (strcasecmp(res, "STORAGE") == 0 ||
                   strcasecmp(res, "MESSAGE") == 0) {
            imap_reply(s, "BAD", "Resource %s given twice",
                       strcasecmp(res, "STORAGE") == 0 ? "STORAGE"
                                                       : "MESSAGE");
            goto out;
        } else {
            imap_reply(s, "NO", "[CANNOT] Unsupported quota resource "
                                "(STORAGE and MESSAGE are)");
            goto out;
        }
    }
    if (!imap_admin_for(s, buf_cstring(&root))) {
        imap_reply(s, "NO", "[NOPERM] Only admins may set quotas");
        goto out;
    }
    r = imap_lookup(s, buf_cstring(&root), 0, &e);
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    r = quota_shared(imap_conf(s), &qdb);
    if (r == STORE_OK && storage == QUOTA_UNLIMITED &&
        messages == QUOTA_UNLIMITED) {
        r = quota_remove(qdb, buf_cstring(&root));
        if (r == STORE_NOTFOUND)
            r = STORE_OK;
        if (r == STORE_OK) {
            log_info("imap: quota removed root=<%s> user=<%s>",
                     buf_cstring(&root), imap_userid(s));
            imap_reply(s, "OK", "SETQUOTA completed (quota root removed)");
            goto out;
        }
    }
    if (r == STORE_OK)
        r = quota_set(qdb, buf_cstring(&root), storage, messages);
    if (r == STORE_OK)
        r = quotacmd_recount(s, buf_cstring(&root));
    if (r == STORE_OK)
        r = quota_shared(imap_conf(s), &qdb);
    if (r == STORE_OK)
        r = quota_get(qdb, buf_cstring(&root), &q);
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    log_info("imap: quota set root=<%s> storage_kb=<%lld> messages=<%lld> "
             "user=<%s>", buf_cstring(&root), storage, messages,
             imap_userid(s));
    quotacmd_send(s, buf_cstring(&root), &q);
    imap_reply(s, "OK", "SETQUOTA completed");
out:
    mboxlist_entry_free(&e);
    buf_free(&root);
}
