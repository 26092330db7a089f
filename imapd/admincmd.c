/*
 * admincmd.c - an admin deleting or renaming a user (see admincmd.h).
 *
 * Order: the mailboxes first (the user is gone once they are), then the
 * quota root, the seen state and the subscriptions.  A failure after the
 * mailboxes went is logged and reported in the OK text; what is left
 * (a quota root without mailboxes, a seen file) is harmless and mbtool
 * can remove it.  Renaming moves the mailboxes first, then the quota
 * root of the INBOX, the seen state and the subscriptions
 * (seen_rename_user() and subs_rename_user() can be rerun after a
 * crash).  Quota roots deeper in the tree keep their old names.
 */
#include "config.h"

#include <string.h>

#include "imapd/admincmd.h"
#include "imapd/imapcmd.h"
#include "imapd/quotacmd.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/seen.h"
#include "store/store.h"
#include "store/subs.h"

int admincmd_is_user_inbox(const char *name, struct buf *userid)
{
    struct buf uid = BUF_INITIALIZER, inbox = BUF_INITIALIZER;
    int is = 0;

    if (mboxname_userid(name, &uid)) {
        /* "user.U" exactly: the INBOX of U is the name itself */
        if (mboxname_user_inbox(buf_cstring(&uid), &inbox) == STORE_OK &&
            strcmp(buf_cstring(&inbox), name) == 0)
            is = 1;
    }
    if (is && userid) {
        buf_setcstr(userid, buf_cstring(&uid));
        for (size_t k = 0; k < userid->len; k++)
            if (userid->s[k] == '^')
                userid->s[k] = '.';
    }
    buf_free(&uid);
    buf_free(&inbox);
    return is;
}

void admincmd_delete_user(struct imap_session *s, const char *inbox)
{
    struct buf uid = BUF_INITIALIZER;
    struct quota_db *qdb = NULL;
    const char *left = NULL;
    int r;

    if (!admincmd_is_user_inbox(inbox, &uid)) {
        imap_reply_store_error(s, STORE_INTERNAL);
        goto out;
    }
    r = mboxlist_delete(imap_mboxlist(s), inbox, MBOXLIST_RECURSIVE);
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    r = quota_shared(imap_conf(s), &qdb);
    if (r == STORE_OK)
        r = quota_remove(qdb, inbox);
    if (r != STORE_OK && r != STORE_NOTFOUND) {
        log_error("imap: user deleted, quota root left root=<%s> "
                  "error=<%s>", inbox, store_strerror(r));
        left = " (its quota root is left)";
    }
    r = seen_delete_user(imap_conf(s), buf_cstring(&uid));
    if (r == STORE_OK || r == STORE_NOTFOUND)
        r = subs_delete_user(imap_conf(s), buf_cstring(&uid));
    if (r != STORE_OK && r != STORE_NOTFOUND) {
        log_error("imap: user deleted, seen state or subscriptions left "
                  "userid=<%s> error=<%s>", buf_cstring(&uid),
                  store_strerror(r));
        left = " (its seen state or subscriptions are left)";
    }
    log_info("imap: deleted user userid=<%s> mailbox=<%s> user=<%s>",
             buf_cstring(&uid), inbox, imap_userid(s));
    imap_reply(s, "OK", "DELETE completed: user deleted%s", left ? left : "");
out:
    buf_free(&uid);
}

void admincmd_rename_user(struct imap_session *s, const char *oldinbox,
                          const char *newinbox)
{
    struct buf olduid = BUF_INITIALIZER, newuid = BUF_INITIALIZER;
    struct quota_db *qdb = NULL;
    struct quota q;
    const char *left = NULL;
    int r, had_root = 0;

    if (!admincmd_is_user_inbox(oldinbox, &olduid) ||
        !admincmd_is_user_inbox(newinbox, &newuid)) {
        imap_reply(s, "NO", "[CANNOT] A user's INBOX can only be renamed "
                            "to another user's INBOX");
        goto out;
    }
    r = quota_shared(imap_conf(s), &qdb);
    if (r == STORE_OK)
        r = quota_get(qdb, oldinbox, &q);
    if (r == STORE_OK)
        had_root = 1;
    else if (r != STORE_NOTFOUND) {
        imap_reply_store_error(s, r);
        goto out;
    }
    r = mboxlist_rename(imap_mboxlist(s), oldinbox, newinbox, NULL);
    if (r != STORE_OK) {
        imap_reply_store_error(s, r);
        goto out;
    }
    if (had_root) {
        r = quota_shared(imap_conf(s), &qdb);
        if (r == STORE_OK)
            r = quota_remove(qdb, oldinbox);
        if (r == STORE_OK || r == STORE_NOTFOUND)
            r = quota_set(qdb, newinbox, q.storage_limit_kb,
                          q.message_limit);
        if (r == STORE_OK)
            r = quotacmd_recount(s, newinbox);
        if (r != STORE_OK) {
            log_error("imap: user renamed, quota root not moved root=<%s> "
                      "new=<%s> error=<%s>", oldinbox, newinbox,
                      store_strerror(r));
            left = " (its quota root was not moved)";
        }
    }
    r = seen_rename_user(imap_conf(s), buf_cstring(&olduid),
                         buf_cstring(&newuid));
    if (r == STORE_OK || r == STORE_NOTFOUND)
        r = subs_rename_user(imap_conf(s), buf_cstring(&olduid),
                             buf_cstring(&newuid));
    if (r != STORE_OK && r != STORE_NOTFOUND) {
        log_error("imap: user renamed, seen state or subscriptions not "
                  "moved userid=<%s> new=<%s> error=<%s>",
                  buf_cstring(&olduid), buf_cstring(&newuid),
                  store_strerror(r));
        left = " (its seen state or subscriptions were not moved)";
    }
    log_info("imap: renamed user userid=<%s> new=<%s> user=<%s>",
             buf_cstring(&olduid), buf_cstring(&newuid), imap_userid(s));
    imap_reply(s, "OK", "RENAME completed: user renamed%s",
               left ? left : "");
out:
    buf_free(&olduid);
    buf_free(&newuid);
}
