/*
 * deliver.c - one message to a list of mailboxes (see deliver.h).
 *
 * Order of work for a message, and why:
 *   1. every recipient is looked up in the mailbox list (unknown: its own
 *      STORE_NOTFOUND) and checked against the duplicate database;
 *   2. the duplicate records of the remaining ones are written, all in
 *      one transaction (deliver.db is no-sync: no sync added), each
 *      naming the copy about to be stored: the mailbox's uidvalidity, its
 *      uidnext (the lowest uid the copy can get) and the message's SHA-1;
 *   3. they are reserved in one append transaction (quota checked per
 *      mailbox);
 *   4. append_commit(): one sync round makes all of them durable and
 *      visible; then the front end answers 250.
 *
 * Exactly once.  A record of the long form is believed only when its copy
 * is found: a committed record of that SHA-1 at or above the named uid
 * (deliver_copy_stored(), run only on a record hit, which is rare, under
 * the mailbox's exclusive lock, whose recovery first settles a dead
 * writer's reservation the way it stays: committed when its file is
 * complete, else aborted; journal replay ran at START).  So a worker
 * killed
 *   - before 2 stored and recorded nothing: the retry delivers;
 *   - between 2 and 4, or during 4: the retry finds the record; recovery
 *     committed the copy (-> duplicate) or aborted it (-> delivered);
 *   - after 4, before its 250: the record names a committed copy, the
 *     retry is a duplicate;
 * one copy in every case, and a failed commit or reservation (4xx) leaves
 * a record whose copy is aborted or absent, which suppresses nothing.  A
 * copy expunged since still counts as delivered while its record is in
 * the index (cleanup removes expunged records only after their age); a
 * uid a lost reservation left and that was given again holds another
 * SHA-1.  Records of the short form (Sieve, older versions) count
 * without a look; a move carries each record in its own form (it keeps
 * UIDVALIDITY, UIDs and bytes).  A lost record (a crash of the machine: deliver.db is
 * not synced) can still let a second copy through, never lose one.
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
#include <signal.h>
#include <time.h>
#include <unistd.h>

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

/* ---- the copy a duplicate record names -------------------------------- */

/* Is the copy c, which a duplicate record of an earlier attempt names
 * (written just before that attempt reserved it: c->uid is the mailbox's
 * uidnext then, the lowest uid the copy can have), stored in mb for good?
 * Looked up under the exclusive lock, whose recovery first settles every
 * append of a dead process the way it will stay (committed when its
 * message file is complete, else aborted; with spool_sync: journal the
 * journal was replayed at START, so the index holds what replay keeps):
 * a record with uid >= c->uid and c's SHA-1 that is committed (expunged
 * since or not: a message the user deleted is still delivered).
 * STORE_OK: stored, or the mailbox was created again since (other
 * uidvalidity: the record counts, as a short one); STORE_NOTFOUND: that
 * attempt stored nothing (its reservation was aborted or never made);
 * STORE_BUSY: a live process is still appending it; or a lock or read
 * error. */
static int deliver_copy_stored(struct mailbox *mb,
                               const struct duplicate_copy *c)
{
    const struct mailbox_header *h;
    struct mailbox_record rec;
    uint32_t lo, hi, mid;
    int r, busy = 0;

    r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
    if (r)
        return r;
    h = mailbox_get_header(mb);
    if (h->uidvalidity != c->uidvalidity) {
        mailbox_unlock(mb);
        return STORE_OK;
    }
    /* records are in increasing uid order: the first with uid >= c->uid */
    lo = 0;
    hi = h->num_records;
    while (lo < hi && r == STORE_OK) {
        mid = lo + (hi - lo) / 2;
        r = mailbox_read_record(mb, mid, &rec);
        if (r == STORE_OK && rec.uid < c->uid)
            lo = mid + 1;
        else
            hi = mid;
    }
    r = r == STORE_OK ? STORE_NOTFOUND : r;
    for (; lo < h->num_records && r == STORE_NOTFOUND; lo++) {
        r = mailbox_read_record(mb, lo, &rec);
        if (r == STORE_OK &&
            (memcmp(rec.digest, c->guid, DUPLICATE_GUID_LEN) != 0 ||
             (rec.flags & MAILBOX_FLAG_ABORTED)))
            r = STORE_NOTFOUND;
        else if (r == STORE_OK && (rec.flags & MAILBOX_FLAG_PENDING)) {
            busy = 1;           /* a live appender: settled later */
            r = STORE_NOTFOUND;
        }
    }
    mailbox_unlock(mb);
    return r == STORE_NOTFOUND && busy ? STORE_BUSY : r;
}

/* ---- for tests ---------------------------------------------------------- */

static int deliver_die_point;

void deliver_test_die_at(int point)
{
    deliver_die_point = point;
}

static void deliver_maybe_die(int point)
{
    if (deliver_die_point == point)
        kill(getpid(), SIGKILL);
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

/* The duplicate records of the recipients about to be reserved (cand),
 * each naming its copy, in one transaction (logged on failure: only
 * suppression suffers). */
static void deliver_mark(struct deliver_ctx *ctx, const char *msgid,
                         size_t msgidlen, const struct deliver_rcpt *rcpts,
                         const unsigned char *cand,
                         const struct duplicate_copy *copies, size_t nrcpts,
                         time_t now)
{
    const char **names = calloc(nrcpts, sizeof(*names));
    struct duplicate_copy *c = calloc(nrcpts, sizeof(*c));
    size_t i, n = 0;
    int r;

    if (!names || !c) {
        r = STORE_NOMEM;
    } else {
        for (i = 0; i < nrcpts; i++)
            if (cand[i]) {
                names[n] = rcpts[i].mailbox;
                c[n++] = copies[i];
            }
        r = n ? duplicate_mark_copies(ctx->dup, msgid, msgidlen, names, c,
                                      n, now)
              : STORE_OK;
    }
    if (r)
        log_warning("deliver: duplicate records not written "
                    "recipients=<%lu> error=<%s>", (unsigned long)n,
                    store_strerror(r));
    free(names);
    free(c);
}

int deliver_message(struct deliver_ctx *ctx, struct append_stage *st,
                    const char *msgid, size_t msgidlen,
                    struct deliver_rcpt *rcpts, size_t nrcpts, int flags)
{
    struct append_txn *txn = NULL;
    struct mboxlist_entry **entries;
    struct duplicate_copy copy, *copies;
    struct mailbox *mb;
    int dupcheck, r, any = 0, aflags, named;
    size_t i, j, nalloc = nrcpts ? nrcpts : 1;
    time_t now = time(NULL);
    unsigned char *reserved, *cand;

    reserved = calloc(nalloc, 1);
    cand = calloc(nalloc, 1);
    copies = calloc(nalloc, sizeof(*copies));
    entries = calloc(nalloc, sizeof(*entries));
    if (!reserved || !cand || !copies || !entries) {
        r = STORE_NOMEM;
        goto fail_all;
    }
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

    /* 1: look up, check for duplicates */
    for (i = 0; i < nrcpts; i++) {
        struct deliver_rcpt *rc = &rcpts[i];

        for (j = 0; j < i; j++)
            if (strcmp(rcpts[j].mailbox, rc->mailbox) == 0)
                break;
        if (j < i)
            continue;   /* same mailbox twice: filled in after commit */
        r = mboxlist_lookup(ctx->ml, rc->mailbox, &entries[i]);
        if (r) {
            rc->result = r;
            continue;
        }
        named = 0;
        if (dupcheck) {
            time_t when;

            r = duplicate_check_copy(ctx->dup, msgid, msgidlen, rc->mailbox,
                                     &when, &named, &copy);
            if (r == STORE_OK && !named) {
                rc->duplicate = 1;      /* a record of the short form */
                continue;
            }
            if (r != STORE_OK && r != STORE_NOTFOUND) {
                rc->result = r;
                continue;
            }
            if (r == STORE_NOTFOUND)
                named = 0;
        }
        r = deliver_get_mailbox(ctx, entries[i], &mb);
        if (r) {
            rc->result = r;
            continue;
        }
        if (named) {
            /* a record hit (rare): believed once its copy is found */
            r = deliver_copy_stored(mb, &copy);
            if (r == STORE_OK) {
                rc->duplicate = 1;
                continue;
            }
            if (r != STORE_NOTFOUND) {
                rc->result = r;
                continue;
            }
            log_info("deliver: duplicate record names a copy never stored, "
                     "delivering mailbox=<%s> uid=<%u>", rc->mailbox,
                     copy.uid);
        }
        /* the copy about to be reserved: its uid will be >= uidnext (the
         * handle's header is as of its last lock, and uidnext only
         * grows) */
        copies[i].uid = mailbox_get_header(mb)->uidnext;
        copies[i].uidvalidity = mailbox_get_header(mb)->uidvalidity;
        memcpy(copies[i].guid,
               append_stage_info(rc->stage ? rc->stage : st)->digest,
               DUPLICATE_GUID_LEN);
        cand[i] = 1;
    }

    /* 2: the records, before anything is reserved */
    if (dupcheck)
        deliver_mark(ctx, msgid, msgidlen, rcpts, cand, copies, nrcpts,
                     now);
    deliver_maybe_die(DELIVER_DIE_AFTER_MARK);

    /* 3: reserve */
    for (i = 0; i < nrcpts; i++) {
        struct deliver_rcpt *rc = &rcpts[i];

        if (!cand[i])
            continue;
        r = deliver_get_mailbox(ctx, entries[i], &mb);
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

    /* 4: commit */
    if (any) {
        deliver_maybe_die(DELIVER_DIE_BEFORE_COMMIT);
        r = append_commit(txn);
        if (r) {
            for (i = 0; i < nrcpts; i++)
                if (reserved[i]) {
                    rcpts[i].result = r;
                    rcpts[i].uid = 0;
                }
        } else {
            deliver_maybe_die(DELIVER_DIE_AFTER_COMMIT);
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
    r = STORE_OK;
    goto out;

fail_all:
    for (i = 0; i < nrcpts; i++)
        rcpts[i].result = r;
out:
    if (entries)
        for (i = 0; i < nrcpts; i++)
            mboxlist_entry_free(&entries[i]);
    free(entries);
    free(reserved);
    free(cand);
    free(copies);
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
