/*
 * deliver.c - one message to a list of mailboxes (see deliver.h).
 *
 * Order of work for a message, and why:
 *   1. every recipient is looked up in the mailbox list (unknown: its own
 *      STORE_NOTFOUND) and checked against the duplicate database;
 *   2. the remaining ones are reserved in one append transaction (quota
 *      checked per mailbox);
 *   3. append_commit(): one sync round makes all of them durable and
 *      visible;
 *   4. only then the duplicate records are written, all recipients' in one
 *      transaction (one durable commit, not one per recipient), so a
 *      crash between 3 and 4 can at worst deliver a second copy later,
 *      never lose one.
 *
 * Open mailboxes are cached in the context (by unique id, so a mailbox
 * deleted and created again under the same name is not confused with the
 * old one), up to DELIVER_CACHE entries, oldest use evicted first.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "lib/log.h"
#include "store/deliver.h"
#include "store/duplicate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/store.h"
#include "store/userstate.h"

#define DELIVER_CACHE 64

struct deliver_cached {
    char *uniqueid;
    uint32_t hash;          /* of uniqueid: compared before the strings */
    struct mailbox *mb;
    unsigned long used;     /* tick of the last use */
};

struct deliver_ctx {
    const struct imapconf *conf;
    struct mboxlist *ml;
    struct duplicate_db *dup;      /* opened on first use */
    struct deliver_cached cache[DELIVER_CACHE];
    unsigned long tick;
};

int deliver_ctx_new(const struct imapconf *conf, struct deliver_ctx **ctx_r)
{
    struct deliver_ctx *ctx;
    int r;

    *ctx_r = NULL;
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return STORE_NOMEM;
    ctx->conf = conf;
    r = mboxlist_open(conf, &ctx->ml);
    if (r) {
        free(ctx);
        return r;
    }
    *ctx_r = ctx;
    return STORE_OK;
}

static void deliver_cache_drop(struct deliver_cached *c)
{
    if (c->mb)
        mailbox_close(&c->mb);
    free(c->uniqueid);
    memset(c, 0, sizeof(*c));
}

void deliver_ctx_free(struct deliver_ctx **ctxp)
{
    struct deliver_ctx *ctx = *ctxp;
    size_t i;

    if (!ctx)
        return;
    for (i = 0; i < DELIVER_CACHE; i++)
        deliver_cache_drop(&ctx->cache[i]);
    if (ctx->dup)
        duplicate_close(&ctx->dup);
    mboxlist_close(&ctx->ml);
    free(ctx);
    *ctxp = NULL;
}

/* FNV-1a of a unique id. */
static uint32_t deliver_hash(const char *s)
{
    uint32_t h = 2166136261u;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* An open handle for the mailbox of `entry`, from the cache or opened. */
static int deliver_get_mailbox(struct deliver_ctx *ctx,
                               const struct mboxlist_entry *entry,
                               struct mailbox **mb_r)
{
    struct deliver_cached *c, *victim = NULL;
    uint32_t h = deliver_hash(entry->uniqueid);
    size_t i;
    int r;

    ctx->tick++;
    for (i = 0; i < DELIVER_CACHE; i++) {
        c = &ctx->cache[i];
        if (c->mb && c->hash == h &&
            strcmp(c->uniqueid, entry->uniqueid) == 0 &&
            strcmp(mailbox_name(c->mb), entry->name) == 0 &&
            strcmp(mailbox_partition(c->mb), entry->partition) == 0) {
            c->used = ctx->tick;
            *mb_r = c->mb;
            return STORE_OK;
        }
        if (!victim || !c->mb || (victim->mb && c->used < victim->used))
            victim = c;
    }
    deliver_cache_drop(victim);
    victim->uniqueid = strdup(entry->uniqueid);
    if (!victim->uniqueid)
        return STORE_NOMEM;
    victim->hash = h;
    r = mailbox_open(ctx->conf, entry->name, entry->partition, &victim->mb);
    if (r) {
        deliver_cache_drop(victim);
        return r;
    }
    victim->used = ctx->tick;
    *mb_r = victim->mb;
    return STORE_OK;
}

static int deliver_dup_open(struct deliver_ctx *ctx)
{
    if (ctx->dup)
        return STORE_OK;
    return duplicate_open(ctx->conf, &ctx->dup);
}

struct mboxlist *deliver_mboxlist(struct deliver_ctx *ctx)
{
    return ctx->ml;
}

int deliver_duplicate_db(struct deliver_ctx *ctx, struct duplicate_db **d_r)
{
    int r = deliver_dup_open(ctx);

    *d_r = r == STORE_OK ? ctx->dup : NULL;
    return r;
}

/* 1 when the user of a reserved recipient's mailbox is marked as moving
 * or moved (logged). */
static int deliver_moving(struct deliver_ctx *ctx,
                          const struct deliver_rcpt *rcpts,
                          const unsigned char *reserved, size_t nrcpts)
{
    struct buf userid = BUF_INITIALIZER;
    size_t i, k;
    int moving = 0;

    for (i = 0; !moving && i < nrcpts; i++) {
        if (!reserved[i] || !mboxname_userid(rcpts[i].mailbox, &userid))
            continue;
        for (k = 0; k < userid.len; k++)
            if (userid.s[k] == '^')
                userid.s[k] = '.';
        if (userstate_get(ctx->conf, buf_cstring(&userid), NULL) !=
            USERSTATE_HERE) {
            log_info("deliver: user marked moving after RCPT user=<%s> "
                     "mailbox=<%s>", buf_cstring(&userid),
                     rcpts[i].mailbox);
            moving = 1;
        }
    }
    buf_free(&userid);
    return moving;
}

int deliver_message(struct deliver_ctx *ctx, struct append_stage *st,
                    const char *msgid, size_t msgidlen,
                    struct deliver_rcpt *rcpts, size_t nrcpts, int flags)
{
    struct append_txn *txn = NULL;
    struct mboxlist_entry *entry = NULL;
    struct mailbox *mb;
    int dupcheck, r, any = 0, aflags;
    size_t i, j;
    time_t now = time(NULL);
    unsigned char *reserved;

    reserved = calloc(nrcpts ? nrcpts : 1, 1);
    if (!reserved)
        return STORE_NOMEM;
    dupcheck = !(flags & DELIVER_NO_DUPCHECK) && msgid && msgidlen &&
               imapconf_getswitch(ctx->conf, "duplicatesuppression");
    aflags = (flags & DELIVER_IGNORE_QUOTA) ? APPEND_IGNORE_QUOTA : 0;
    for (i = 0; i < nrcpts; i++) {
        rcpts[i].result = STORE_OK;
        rcpts[i].duplicate = 0;
        rcpts[i].uid = 0;
    }
    if (dupcheck && (r = deliver_dup_open(ctx)) != STORE_OK) {
        log_error("deliver: duplicate database unavailable error=<%s>",
                  store_strerror(r));
        goto fail_all;
    }
    r = append_begin(ctx->conf, &txn);
    if (r)
        goto fail_all;

    for (i = 0; i < nrcpts; i++) {
        struct deliver_rcpt *rc = &rcpts[i];

        for (j = 0; j < i; j++)
            if (strcmp(rcpts[j].mailbox, rc->mailbox) == 0)
                break;
        if (j < i)
            continue;   /* same mailbox twice: filled in after commit */
        r = mboxlist_lookup(ctx->ml, rc->mailbox, &entry);
        if (r) {
            rc->result = r;
            continue;
        }
        if (dupcheck) {
            time_t when;

            r = duplicate_check(ctx->dup, msgid, msgidlen, rc->mailbox,
                                &when, NULL);
            if (r == STORE_OK) {
                rc->duplicate = 1;
                mboxlist_entry_free(&entry);
                continue;
            }
            if (r != STORE_NOTFOUND) {
                rc->result = r;
                mboxlist_entry_free(&entry);
                continue;
            }
        }
        r = deliver_get_mailbox(ctx, entry, &mb);
        mboxlist_entry_free(&entry);
        if (r) {
            rc->result = r;
            continue;
        }
        if (rc->nkeywords)
            r = append_add_keywords(txn, mb, rc->stage ? rc->stage : st,
                                    (int64_t)now,
                                    rc->sysflags, rc->keywords,
                                    rc->nkeywords, aflags, &rc->uid);
        else
            r = append_add(txn, mb, rc->stage ? rc->stage : st,
                           (int64_t)now, rc->sysflags, aflags, &rc->uid);
        if (r) {
            rc->result = r;
            continue;
        }
        reserved[i] = 1;
        any = 1;
    }

    /* the user of a recipient marked "moving" after its RCPT: the dump
     * of the move waits for these reservations, so the mark is either
     * seen here or the commit is in the dump (store/userstate.h) */
    if (any && deliver_moving(ctx, rcpts, reserved, nrcpts)) {
        append_abort(txn);
        for (i = 0; i < nrcpts; i++)
            if (reserved[i]) {
                rcpts[i].result = STORE_BUSY;
                rcpts[i].uid = 0;
                reserved[i] = 0;
            }
        any = 0;
    }
    if (any) {
        r = append_commit(txn);
        if (r) {
            for (i = 0; i < nrcpts; i++)
                if (reserved[i]) {
                    rcpts[i].result = r;
                    rcpts[i].uid = 0;
                }
        } else if (dupcheck) {
            /* one transaction for every recipient: one durable commit */
            const char **names = calloc(nrcpts, sizeof(*names));
            uint32_t *uids = calloc(nrcpts, sizeof(*uids));
            size_t n = 0;

            if (!names || !uids) {
                r = STORE_NOMEM;
            } else {
                for (i = 0; i < nrcpts; i++)
                    if (reserved[i]) {
                        names[n] = rcpts[i].mailbox;
                        uids[n++] = rcpts[i].uid;
                    }
                r = duplicate_mark_many(ctx->dup, msgid, msgidlen, names,
                                        uids, n, now);
            }
            if (r)   /* the mail is stored: only suppression suffers */
                log_warning("deliver: duplicate records not written "
                            "recipients=<%lu> error=<%s>", (unsigned long)n,
                            store_strerror(r));
            free(names);
            free(uids);
        }
    }
    append_free(&txn);

    /* repeated recipients get the first one's outcome */
    for (i = 0; i < nrcpts; i++)
        for (j = 0; j < i; j++)
            if (strcmp(rcpts[j].mailbox, rcpts[i].mailbox) == 0) {
                rcpts[i].result = rcpts[j].result;
                rcpts[i].duplicate = rcpts[j].duplicate;
                rcpts[i].uid = rcpts[j].uid;
                break;
            }
    free(reserved);
    return STORE_OK;

fail_all:
    for (i = 0; i < nrcpts; i++)
        rcpts[i].result = r;
    free(reserved);
    return r;
}

/* Is line (p, len) the start of field `name` (case-insensitive) followed
 * by optional blanks and ':'?  Returns the offset after the ':' or 0. */
static size_t deliver_field_start(const char *p, size_t len, const char *name)
{
    size_t n = strlen(name), i;

    if (len <= n || strncasecmp(p, name, n) != 0)
        return 0;
    for (i = n; i < len && (p[i] == ' ' || p[i] == '\t'); i++)
        ;
    if (i < len && p[i] == ':')
        return i + 1;
    return 0;
}

int deliver_find_msgid(const char *hdr, size_t len, struct buf *id)
{
    size_t pos = 0, eol, start, end, vstart;
    int found = 0;

    buf_reset(id);
    while (pos < len) {
        /* the line [pos, eol) without its line end */
        for (eol = pos; eol < len && hdr[eol] != '\n'; eol++)
            ;
        end = eol;
        if (end > pos && hdr[end - 1] == '\r')
            end--;
        if (end == pos)
            break;   /* the empty line: end of the header */
        if (!found && (start = deliver_field_start(hdr + pos, end - pos,
                                                   "Message-ID")) != 0) {
            found = 1;
            vstart = pos + start;
            if (buf_append(id, hdr + vstart, end - vstart) != 0)
                return 0;
        } else if (found == 1 && (hdr[pos] == ' ' || hdr[pos] == '\t')) {
            if (buf_append(id, hdr + pos, end - pos) != 0)   /* folded */
                return 0;
        } else if (found == 1) {
            found = 2;   /* the field ended */
        }
        pos = eol < len ? eol + 1 : len;
    }
    if (!found)
        return 0;
    /* trim white space at both ends */
    start = 0;
    while (start < id->len && (id->s[start] == ' ' || id->s[start] == '\t'))
        start++;
    end = id->len;
    while (end > start && (id->s[end - 1] == ' ' || id->s[end - 1] == '\t'))
        end--;
    if (end == start) {
        buf_reset(id);
        return 0;
    }
    memmove(id->s, id->s + start, end - start);
    buf_truncate(id, end - start);
    return 1;
}
