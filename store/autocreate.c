/*
 * autocreate.c - a user's INBOX and standard folders made at the first
 * use (autocreate.h).  The order is INBOX first, then the folders, then
 * the subscriptions: a crash in between leaves an INBOX without some
 * folders or subscriptions, which the user can make; it never leaves
 * folders without their INBOX (the next login would not complete them,
 * as the INBOX exists).
 */
#include "config.h"

#include <string.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "lib/strarray.h"
#include "store/autocreate.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/store.h"
#include "store/subs.h"

static const struct {
    const char *key;
    const char *use;
} autocreate_xlist[] = {
    { "xlist-all", "\\All" },
    { "xlist-archive", "\\Archive" },
    { "xlist-drafts", "\\Drafts" },
    { "xlist-flagged", "\\Flagged" },
    { "xlist-junk", "\\Junk" },
    { "xlist-sent", "\\Sent" },
    { "xlist-trash", "\\Trash" },
};

const char *autocreate_specialuse(const struct imapconf *conf,
                                  const char *folder)
{
    for (size_t i = 0; i < sizeof(autocreate_xlist) /
                           sizeof(autocreate_xlist[0]); i++) {
        const char *v = imapconf_getstring(conf, autocreate_xlist[i].key);

        if (v && *v && strcmp(v, folder) == 0)
            return autocreate_xlist[i].use;
    }
    return "";
}

/* Is userid in autocreate_users? */
static int autocreate_user_ok(const struct imapconf *conf,
                              const char *userid)
{
    struct strarray who = STRARRAY_INITIALIZER;
    const char *users = imapconf_getstring(conf, "autocreate_users");
    int ok = 0;

    if (!users)
        return 0;
    if (strarray_split(&who, users, " \t,") != 0)
        return 0;
    for (size_t i = 0; i < who.count && !ok; i++)
        ok = strcmp(who.data[i], "anyone") == 0 ||
             strcmp(who.data[i], userid) == 0;
    strarray_fini(&who);
    return ok;
}

static void autocreate_subscribe(const struct imapconf *conf,
                                 const char *userid,
                                 const struct strarray *names)
{
    struct subs_db *sub = NULL;
    int r = subs_open(conf, userid, &sub);

    for (size_t i = 0; r == STORE_OK && i < names->count; i++)
        r = subs_add(sub, names->data[i]);
    subs_close(&sub);
    if (r != STORE_OK)
        log_warning("autocreate: cannot subscribe user=<%s> error=<%s>",
                    userid, store_strerror(r));
}

int autocreate_inbox(const struct imapconf *conf, struct mboxlist *ml,
                     const char *userid, const char *inbox, int *created_r)
{
    struct mboxlist_entry *e = NULL;
    struct strarray folders = STRARRAY_INITIALIZER;
    struct strarray made = STRARRAY_INITIALIZER;
    struct buf name = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    long qlimit = imapconf_getint(conf, "autocreate_quota");
    const char *list;
    int r;

    if (created_r)
        *created_r = 0;
    if (qlimit < 0 || !inbox || !*inbox || !autocreate_user_ok(conf, userid))
        return STORE_OK;
    r = mboxlist_lookup(ml, inbox, &e);
    mboxlist_entry_free(&e);
    if (r != STORE_NOTFOUND)
        return r;
    r = mboxlist_create(ml, inbox, NULL, NULL, NULL);
    if (r == STORE_EXISTS)
        return STORE_OK;   /* another session was first */
    if (r != STORE_OK) {
        log_error("autocreate: cannot create mailbox=<%s> user=<%s> "
                  "error=<%s>", inbox, userid, store_strerror(r));
        return r;
    }
    if (created_r)
        *created_r = 1;
    strarray_append(&made, inbox);
    if (qlimit > 0) {
        struct quota_db *q = NULL;
        int qr = quota_shared(conf, &q);

        if (qr == STORE_OK)
            qr = quota_set(q, inbox, qlimit, QUOTA_UNLIMITED);
        if (qr != STORE_OK)
            log_warning("autocreate: cannot set quota root=<%s> "
                        "error=<%s>", inbox, store_strerror(qr));
    }

    list = imapconf_getstring(conf, "autocreate_inbox_folders");
    if (list && *list)
        strarray_split(&folders, list, "|");
    for (size_t i = 0; i < folders.count; i++) {
        const char *f = folders.data[i], *err = NULL, *use;
        size_t n;

        while (*f == ' ' || *f == '\t')
            f++;
        n = strlen(f);
        while (n && (f[n - 1] == ' ' || f[n - 1] == '\t'))
            n--;
        if (!n)
            continue;
        buf_setmap(&tmp, f, n);
        use = autocreate_specialuse(conf, buf_cstring(&tmp));
        r = mboxname_to_internal(buf_cstring(&tmp),
                                 imapconf_getswitch(conf, "unixhierarchysep"),
                                 &name, &err);
        if (r == STORE_OK) {
            struct buf full = BUF_INITIALIZER;

            buf_setcstr(&full, inbox);
            buf_putc(&full, '.');
            buf_append(&full, name.s, name.len);
            r = mboxlist_create_special(ml, buf_cstring(&full), NULL, NULL,
                                        use, NULL);
            if (r == STORE_OK || r == STORE_EXISTS)
                strarray_append(&made, buf_cstring(&full));
            buf_free(&full);
        }
        if (r != STORE_OK && r != STORE_EXISTS)
            log_warning("autocreate: cannot create folder=<%s> user=<%s> "
                        "error=<%s>", buf_cstring(&tmp), userid,
                        err ? err : store_strerror(r));
    }
    autocreate_subscribe(conf, userid, &made);
    log_info("autocreate: created mailbox=<%s> user=<%s> folders=<%zu>",
             inbox, userid, made.count - 1);
    strarray_fini(&folders);
    strarray_fini(&made);
    buf_free(&name);
    buf_free(&tmp);
    return STORE_OK;
}
