/*
 * mbtool_xfer.c - dump and load of a whole user for moves between
 * backends (the format and the commands are in mbtool_xfer.h).
 *
 * The dump reads each mailbox under its exclusive lock, after waiting
 * for the appends in progress to finish (a delivery that passed RCPT
 * before the "moving" mark ends as a visible message or an aborted one,
 * never as one the dump misses while it is pending).  The load creates
 * the mailboxes with their UIDVALIDITY (mailbox_restore_counters()),
 * appends every message with its UID, internal date, flags and keywords
 * (a UID gap of the original is kept by raising uidnext first), raises
 * HIGHESTMODSEQ to the original's before the first message (so every
 * restored message has a modseq above anything a client saw: CONDSTORE
 * and QRESYNC clients resynchronize flags, never miss a change), and
 * ends with uidnext as the original's.  A load that fails removes what
 * it made.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/crc32c.h"
#include "lib/strarray.h"
#include "store/append.h"
#include "store/duplicate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/seen.h"
#include "store/sievedir.h"
#include "store/store.h"
#include "store/subs.h"
#include "store/userid.h"
#include "store/userstate.h"
#include "tools/mbtool_xfer.h"

#define XFER_MAGIC "CYRUSDELIVER-XFER 2"
#define XFER_MAGIC_V1 "CYRUSDELIVER-XFER 1"   /* read too: no DUPLICATE */
#define XFER_LINE_MAX 65536
#define XFER_BATCH 64             /* messages per append transaction */
#define XFER_PENDING_WAIT_MS 60000
#define XFER_SIEVE_MAX (1024 * 1024)

static int xfer_fail(const char *what, const char *name, int r)
{
    fprintf(stderr, "mbtool: %s %s: %s\n", what, name ? name : "",
            store_strerror(r));
    return 1;
}

/* ---- the user's mailboxes ----------------------------------------------- */

struct xfer_tree {
    struct strarray names, parts, acls, uses;
};

static void xfer_tree_fini(struct xfer_tree *t)
{
    strarray_fini(&t->names);
    strarray_fini(&t->parts);
    strarray_fini(&t->acls);
    strarray_fini(&t->uses);
}

static int xfer_tree_add(struct xfer_tree *t, const struct mboxlist_entry *e)
{
    if (strarray_append(&t->names, e->name) < 0 ||
        strarray_append(&t->parts, e->partition) < 0 ||
        strarray_append(&t->acls, e->acl ? e->acl : "") < 0 ||
        strarray_append(&t->uses, e->specialuse ? e->specialuse : "") < 0)
        return STORE_NOMEM;
    return 0;
}

static int xfer_tree_cb(void *rock, const struct mboxlist_entry *e)
{
    return xfer_tree_add(rock, e);
}

/* The INBOX (first, when it exists) and every mailbox below it. */
static int xfer_tree_collect(struct mboxlist *ml, const char *inbox,
                             struct xfer_tree *t)
{
    struct mboxlist_entry *e = NULL;
    struct buf pat = BUF_INITIALIZER;
    int r;

    r = mboxlist_lookup(ml, inbox, &e);
    if (r == STORE_OK) {
        r = xfer_tree_add(t, e);
        mboxlist_entry_free(&e);
    } else if (r == STORE_NOTFOUND) {
        r = STORE_OK;
    }
    if (r)
        return r;
    buf_printf(&pat, "%s.*", inbox);
    r = mboxlist_list(ml, buf_cstring(&pat), xfer_tree_cb, t);
    buf_free(&pat);
    return r;
}

/* The user's INBOX name from a user id given on the command line. */
static int xfer_inbox(const char *userid, struct buf *inbox)
{
    int r = userid_inbox(userid, inbox);

    if (r)
        xfer_fail("not a user id:", userid, r);
    return r;
}

/* The stamp of the mailboxes as they are (mbtool_xfer.h): every change a
 * purge could lose raises HIGHESTMODSEQ (a message made visible, a flag
 * change, an expunge); UIDNEXT is not in it, as a reservation aborted
 * after the dump (a delivery whose RCPT came before the "moving" mark,
 * turned away with 451 at DATA) consumes a UID and stores nothing. */
static int xfer_stamp(const struct imapconf *conf, const struct xfer_tree *t,
                      uint32_t *stamp_r)
{
    struct buf text = BUF_INITIALIZER;
    size_t i;
    int r = STORE_OK;

    for (i = 0; r == STORE_OK && i < t->names.count; i++) {
        struct mailbox *mb = NULL;
        const struct mailbox_header *h;

        r = mailbox_open(conf, t->names.data[i], t->parts.data[i], &mb);
        if (r == STORE_OK)
            r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
        if (r == STORE_OK) {
            h = mailbox_get_header(mb);
            buf_printf(&text, "%s %" PRIu64 "\n", t->names.data[i],
                       h->highestmodseq);
            mailbox_unlock(mb);
        }
        mailbox_close(&mb);
    }
    *stamp_r = crc32c(text.s ? text.s : "", text.len);
    buf_free(&text);
    return r;
}

/* ---- dump ---------------------------------------------------------------- */

/* Lock mb exclusively once no append is pending in it (waiting for the
 * deliveries in progress to finish). */
static int xfer_lock_settled(struct mailbox *mb)
{
    int waited = 0, r;

    for (;;) {
        const struct mailbox_header *h;

        r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
        if (r)
            return r;
        h = mailbox_get_header(mb);
        if (h->visible >= h->num_records || waited >= XFER_PENDING_WAIT_MS)
            return STORE_OK;
        mailbox_unlock(mb);
        usleep(50 * 1000);
        waited += 50;
    }
}

static int xfer_dump_mailbox(const struct imapconf *conf, FILE *out,
                             struct seen_db *seen, const struct xfer_tree *t,
                             size_t i, unsigned long *nmsgs)
{
    struct mailbox *mb = NULL;
    const struct mailbox_header *h;
    struct seen_data sd;
    char *copy = NULL;
    uint32_t recno;
    int r;

    memset(&sd, 0, sizeof(sd));
    r = mailbox_open(conf, t->names.data[i], t->parts.data[i], &mb);
    if (r == STORE_OK)
        r = xfer_lock_settled(mb);
    if (r)
        goto out;
    h = mailbox_get_header(mb);
    fprintf(out, "MAILBOX %s %" PRIu32 " %" PRIu32 " %" PRIu64 "\n",
            t->names.data[i], h->uidvalidity, h->uidnext, h->highestmodseq);
    fprintf(out, "ACL %s\nSPECIALUSE %s\n", t->acls.data[i],
            t->uses.data[i]);
    copy = malloc(65536);
    if (!copy) {
        r = STORE_NOMEM;
        goto unlock;
    }
    for (recno = 0; recno < h->visible; recno++) {
        struct mailbox_record rec;
        uint32_t left;
        int fd = -1, k;

        r = mailbox_read_record(mb, recno, &rec);
        if (r)
            goto unlock;
        if (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        fprintf(out, "MESSAGE %" PRIu32 " %" PRId64 " %u %" PRIu32, rec.uid,
                rec.internaldate, rec.flags & MAILBOX_SYSTEM_FLAGS,
                rec.size);
        for (k = 0; k < MAILBOX_USER_FLAGS; k++) {
            const char *kw;

            if (!(rec.user_flags[k / 32] & (1u << (k % 32))))
                continue;
            kw = mailbox_user_flag_name(mb, k);
            if (kw)
                fprintf(out, " %s", kw);
        }
        fputc('\n', out);
        r = mailbox_open_message(mb, rec.uid, &fd);
        if (r)
            goto unlock;
        for (left = rec.size; left > 0;) {
            ssize_t n = read(fd, copy, left < 65536 ? left : 65536);

            if (n <= 0) {
                close(fd);
                fprintf(stderr, "mbtool: %s uid %" PRIu32 ": message file "
                        "shorter than its record\n", t->names.data[i],
                        rec.uid);
                r = STORE_CORRUPT;
                goto unlock;
            }
            fwrite(copy, 1, (size_t)n, out);
            left -= (uint32_t)n;
        }
        close(fd);
        fputc('\n', out);
        (*nmsgs)++;
    }
    if (seen && seen_read(seen, mailbox_uniqueid(mb), &sd) == STORE_OK &&
        (sd.lastread || sd.lastuid || sd.lastchange || sd.seenuids.len))
        fprintf(out, "SEEN %lld %" PRIu32 " %lld %s\n",
                (long long)sd.lastread, sd.lastuid,
                (long long)sd.lastchange, buf_cstring(&sd.seenuids));
unlock:
    mailbox_unlock(mb);
out:
    free(copy);
    seen_data_free(&sd);
    mailbox_close(&mb);
    if (r)
        xfer_fail("cannot dump", t->names.data[i], r);
    return r;
}

static int xfer_dump_subs_cb(void *rock, const char *name)
{
    fprintf(rock, "SUBSCRIBE %s\n", name);
    return 0;
}

static int xfer_dump_sieve(const struct imapconf *conf, FILE *out,
                           const char *userid)
{
    struct buf dir = BUF_INITIALIZER, active = BUF_INITIALIZER;
    struct buf text = BUF_INITIALIZER;
    struct strarray names = STRARRAY_INITIALIZER;
    size_t i;
    int r;

    r = sievedir_user_path(conf, userid, &dir);
    if (r == SIEVEDIR_OK)
        r = sievedir_list(buf_cstring(&dir), &names, &active);
    for (i = 0; r == SIEVEDIR_OK && i < names.count; i++) {
        r = sievedir_get(buf_cstring(&dir), names.data[i], XFER_SIEVE_MAX,
                         &text);
        if (r != SIEVEDIR_OK)
            break;
        fprintf(out, "SIEVE %s %d %zu\n", names.data[i],
                strcmp(names.data[i], buf_cstring(&active)) == 0, text.len);
        fwrite(text.s ? text.s : "", 1, text.len, out);
        fputc('\n', out);
    }
    if (r != SIEVEDIR_OK)
        fprintf(stderr, "mbtool: cannot dump the Sieve scripts of %s: %s\n",
                userid, sievedir_strerror(r));
    buf_free(&dir);
    buf_free(&active);
    buf_free(&text);
    strarray_fini(&names);
    return r == SIEVEDIR_OK ? 0 : -1;
}

/* The duplicate-delivery records of the user's mailboxes, collected
 * first (the walk holds deliver.db's lock; the pipe to the loader may
 * not be drained at once). */
struct xfer_dups {
    const char *inbox;
    struct buf out;
    unsigned long n;
    int nomem;
};

static int xfer_dup_cb(void *rock, const char *id, size_t idlen,
                       const char *mailbox, size_t mboxlen, time_t when,
                       uint32_t uid, const struct duplicate_copy *copy)
{
    struct xfer_dups *x = rock;
    char name[600], hex[2 * DUPLICATE_GUID_LEN + 1];

    if (mboxlen >= sizeof(name))
        return 0;
    memcpy(name, mailbox, mboxlen);
    name[mboxlen] = '\0';
    if (!mboxname_is_self_or_child(x->inbox, name) ||
        memchr(name, ' ', mboxlen) || memchr(name, '\n', mboxlen))
        return 0;
    if (copy)
        duplicate_guid_hex(copy->guid, hex);
    if ((copy ? buf_printf(&x->out, "DUPLICATE %lld %" PRIu32 " %s %zu %"
                           PRIu32 " %s\n", (long long)when, uid, name,
                           idlen, copy->uidvalidity, hex)
              : buf_printf(&x->out, "DUPLICATE %lld %" PRIu32 " %s %zu\n",
                           (long long)when, uid, name, idlen)) < 0 ||
        buf_append(&x->out, id, idlen) < 0 || buf_putc(&x->out, '\n') < 0) {
        x->nomem = 1;
        return 1;
    }
    x->n++;
    return 0;
}

static int xfer_dump_dups(const struct imapconf *conf, FILE *out,
                          const char *inbox)
{
    struct duplicate_db *d = NULL;
    struct xfer_dups x;
    int r;

    memset(&x, 0, sizeof(x));
    x.inbox = inbox;
    r = duplicate_open(conf, &d);
    if (r == STORE_OK)
        r = duplicate_foreach(d, xfer_dup_cb, &x);
    duplicate_close(&d);
    if (r == STORE_OK && x.nomem)
        r = STORE_NOMEM;
    if (r == STORE_OK)
        fwrite(x.out.s ? x.out.s : "", 1, x.out.len, out);
    else
        xfer_fail("cannot read the duplicate-delivery records of", inbox,
                  r);
    buf_free(&x.out);
    return r == STORE_OK ? 0 : -1;
}

int mbtool_user_dump(const struct imapconf *conf, int argc, char **argv)
{
    struct xfer_tree t = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER,
                           STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    struct buf inbox = BUF_INITIALIZER;
    struct mboxlist *ml = NULL;
    struct quota_db *q = NULL;
    struct seen_db *seen = NULL;
    struct subs_db *subs = NULL;
    const char *userid;
    unsigned long nmsgs = 0;
    uint32_t stamp = 0;
    int mark = 1, ret = 1, r;
    size_t i;

    if (argc >= 2 && strcmp(argv[1], "-n") == 0) {
        mark = 0;
        argc--;
        argv++;
    }
    if (argc != 2) {
        fprintf(stderr, "mbtool: usage: user-dump [-n] USER\n");
        return 2;
    }
    userid = argv[1];
    if (xfer_inbox(userid, &inbox))
        goto out;
    if ((r = mboxlist_open(conf, &ml)) != STORE_OK) {
        xfer_fail("cannot open the mailbox list", NULL, r);
        goto out;
    }
    r = xfer_tree_collect(ml, buf_cstring(&inbox), &t);
    if (r == STORE_OK && t.names.count == 0)
        r = STORE_NOTFOUND;
    if (r) {
        xfer_fail("no mailboxes of", userid, r);
        goto out;
    }
    if (mark && (r = userstate_set(conf, userid, USERSTATE_MOVING, NULL))) {
        xfer_fail("cannot mark", userid, r);
        goto out;
    }
    if ((r = quota_open(conf, &q)) != STORE_OK ||
        (r = seen_open(conf, userid, &seen)) != STORE_OK ||
        (r = subs_open(conf, userid, &subs)) != STORE_OK) {
        xfer_fail("cannot open the databases of", userid, r);
        goto out;
    }
    printf("%s %s\n", XFER_MAGIC, userid);
    for (i = 0; i < t.names.count; i++) {
        struct quota qt;

        if (quota_get(q, t.names.data[i], &qt) == STORE_OK)
            printf("QUOTA %s %lld %lld\n", t.names.data[i],
                   qt.storage_limit_kb, qt.message_limit);
    }
    for (i = 0; i < t.names.count; i++)
        if (xfer_dump_mailbox(conf, stdout, seen, &t, i, &nmsgs))
            goto out;
    if ((r = subs_list(subs, "*", xfer_dump_subs_cb, stdout)) != STORE_OK) {
        xfer_fail("cannot read the subscriptions of", userid, r);
        goto out;
    }
    if (xfer_dump_sieve(conf, stdout, userid) ||
        xfer_dump_dups(conf, stdout, buf_cstring(&inbox)))
        goto out;
    if ((r = xfer_stamp(conf, &t, &stamp)) != STORE_OK) {
        xfer_fail("cannot stamp", userid, r);
        goto out;
    }
    printf("END %zu %lu %08" PRIx32 "\n", t.names.count, nmsgs, stamp);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "mbtool: write error: %s\n", strerror(errno));
        goto out;
    }
    ret = 0;
out:
    subs_close(&subs);
    seen_close(&seen);
    quota_close(&q);
    mboxlist_close(&ml);
    xfer_tree_fini(&t);
    buf_free(&inbox);
    return ret;
}

/* ---- purge --------------------------------------------------------------- */

/* Remove everything of the user here except the mark.  0 or -1 (said). */
static int xfer_purge(const struct imapconf *conf, struct mboxlist *ml,
                      const char *userid, const struct xfer_tree *t)
{
    struct quota_db *q = NULL;
    struct buf dir = BUF_INITIALIZER;
    struct strarray names = STRARRAY_INITIALIZER;
    size_t i;
    int r, bad = 0;

    /* children first, each for good (no DELETED. copy of a moved user) */
    for (i = t->names.count; i-- > 0;) {
        r = mboxlist_delete(ml, t->names.data[i], MBOXLIST_IMMEDIATE);
        if (r && r != STORE_NOTFOUND) {
            xfer_fail("cannot delete", t->names.data[i], r);
            bad = 1;
        }
    }
    if (quota_open(conf, &q) == STORE_OK) {
        for (i = 0; i < t->names.count; i++)
            (void)quota_remove(q, t->names.data[i]);
        quota_close(&q);
    }
    r = seen_delete_user(conf, userid);
    if (r && r != STORE_NOTFOUND)
        bad = 1;
    r = subs_delete_user(conf, userid);
    if (r && r != STORE_NOTFOUND)
        bad = 1;
    if (sievedir_user_path(conf, userid, &dir) == SIEVEDIR_OK &&
        sievedir_list(buf_cstring(&dir), &names, NULL) == SIEVEDIR_OK) {
        (void)sievedir_activate(buf_cstring(&dir), NULL);
        for (i = 0; i < names.count; i++)
            if (sievedir_delete(buf_cstring(&dir), names.data[i]) !=
                SIEVEDIR_OK)
                bad = 1;
        (void)rmdir(buf_cstring(&dir));
    }
    buf_free(&dir);
    strarray_fini(&names);
    if (bad)
        fprintf(stderr, "mbtool: %s: not everything could be removed\n",
                userid);
    return bad ? -1 : 0;
}

int mbtool_user_purge(const struct imapconf *conf, int argc, char **argv)
{
    struct xfer_tree t = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER,
                           STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    struct buf inbox = BUF_INITIALIZER;
    struct mboxlist *ml = NULL;
    const char *want = NULL;
    int ret = 1, r;

    if (argc >= 3 && strcmp(argv[1], "-s") == 0) {
        want = argv[2];
        argc -= 2;
        argv += 2;
    }
    if (argc != 2) {
        fprintf(stderr, "mbtool: usage: user-purge [-s STAMP] USER\n");
        return 2;
    }
    if (xfer_inbox(argv[1], &inbox))
        goto out;
    if ((r = mboxlist_open(conf, &ml)) != STORE_OK ||
        (r = xfer_tree_collect(ml, buf_cstring(&inbox), &t)) != STORE_OK) {
        xfer_fail("cannot list the mailboxes of", argv[1], r);
        goto out;
    }
    if (want) {
        uint32_t stamp = 0;
        char have[16];

        if ((r = xfer_stamp(conf, &t, &stamp)) != STORE_OK) {
            xfer_fail("cannot stamp", argv[1], r);
            goto out;
        }
        snprintf(have, sizeof(have), "%08" PRIx32, stamp);
        if (strcmp(have, want) != 0) {
            fprintf(stderr, "mbtool: the mailboxes of %s changed since the "
                    "dump (stamp %s, dump %s): not removed\n", argv[1], have,
                    want);
            goto out;
        }
    }
    if (xfer_purge(conf, ml, argv[1], &t) == 0)
        ret = 0;
out:
    mboxlist_close(&ml);
    xfer_tree_fini(&t);
    buf_free(&inbox);
    return ret;
}

int mbtool_user_stamp(const struct imapconf *conf, int argc, char **argv)
{
    struct xfer_tree t = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER,
                           STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    struct buf inbox = BUF_INITIALIZER;
    struct mboxlist *ml = NULL;
    uint32_t stamp = 0;
    int ret = 1, r;

    if (argc != 2) {
        fprintf(stderr, "mbtool: usage: user-stamp USER\n");
        return 2;
    }
    if (xfer_inbox(argv[1], &inbox))
        goto out;
    if ((r = mboxlist_open(conf, &ml)) != STORE_OK ||
        (r = xfer_tree_collect(ml, buf_cstring(&inbox), &t)) != STORE_OK ||
        (r = xfer_stamp(conf, &t, &stamp)) != STORE_OK) {
        xfer_fail("cannot stamp", argv[1], r);
        goto out;
    }
    printf("%08" PRIx32 "\n", stamp);
    ret = 0;
out:
    mboxlist_close(&ml);
    xfer_tree_fini(&t);
    buf_free(&inbox);
    return ret;
}

int mbtool_user_mark(const struct imapconf *conf, int argc, char **argv)
{
    enum userstate st;
    int r;

    if (argc < 3 || argc > 4) {
        fprintf(stderr, "mbtool: usage: user-mark USER here|moving|"
                "moved BACKEND\n");
        return 2;
    }
    if (strcmp(argv[2], "here") == 0 && argc == 3)
        st = USERSTATE_HERE;
    else if (strcmp(argv[2], "moving") == 0 && argc == 3)
        st = USERSTATE_MOVING;
    else if (strcmp(argv[2], "moved") == 0 && argc == 4)
        st = USERSTATE_MOVED;
    else {
        fprintf(stderr, "mbtool: usage: user-mark USER here|moving|"
                "moved BACKEND\n");
        return 2;
    }
    r = userstate_set(conf, argv[1], st, argc == 4 ? argv[3] : NULL);
    return r ? xfer_fail("cannot mark", argv[1], r) : 0;
}

/* ---- load ---------------------------------------------------------------- */

struct xfer_load {
    const struct imapconf *conf;
    FILE *in;
    const char *userid;
    struct buf inbox;
    struct mboxlist *ml;
    struct quota_db *q;
    struct seen_db *seen;
    struct subs_db *subs;
    struct duplicate_db *dup;      /* opened at the first DUPLICATE */
    struct buf line;
    unsigned long lineno;
    /* the mailbox being loaded */
    struct mailbox *mb;
    char *name;
    struct buf uniqueid;
    uint32_t uidnext;          /* the original's, set at the end */
    uint32_t next;             /* the UID the next append gets */
    struct append_txn *txn;
    struct append_stage *stages[XFER_BATCH];
    size_t nstages;
    unsigned long nmailboxes, nmsgs;
    char *copy;
};

static int xfer_load_error(struct xfer_load *L, const char *what)
{
    fprintf(stderr, "mbtool: dump line %lu: %s\n", L->lineno, what);
    return -1;
}

/* The next line (without LF) into L->line: 0, or -1 at EOF / too long. */
static int xfer_getline(struct xfer_load *L)
{
    int c;

    buf_reset(&L->line);
    L->lineno++;
    while ((c = getc(L->in)) != EOF && c != '\n') {
        if (L->line.len >= XFER_LINE_MAX)
            return xfer_load_error(L, "line too long");
        buf_putc(&L->line, c);
    }
    if (c == EOF)
        return xfer_load_error(L, "unexpected end of the dump");
    buf_cstring(&L->line);
    return 0;
}

static int xfer_commit_batch(struct xfer_load *L)
{
    size_t i;
    int r = STORE_OK;

    if (L->nstages)
        r = append_commit(L->txn);
    for (i = 0; i < L->nstages; i++)
        append_stage_free(&L->stages[i]);
    L->nstages = 0;
    if (r)
        xfer_fail("cannot store the messages of", L->name, r);
    return r ? -1 : 0;
}

static int xfer_counters(struct xfer_load *L, uint32_t uidvalidity,
                         uint32_t uidnext, uint64_t modseq)
{
    int r = mailbox_lock(L->mb, MAILBOX_LOCK_EXCLUSIVE);

    if (r == STORE_OK) {
        r = mailbox_restore_counters(L->mb, uidvalidity, uidnext, modseq);
        int ur = mailbox_unlock(L->mb);
        if (r == STORE_OK)
            r = ur;
    }
    if (r)
        xfer_fail("cannot set the counters of", L->name, r);
    return r ? -1 : 0;
}

/* The mailbox being loaded is complete. */
static int xfer_finish_mailbox(struct xfer_load *L)
{
    int r = 0;

    if (!L->mb)
        return 0;
    r = xfer_commit_batch(L);
    if (r == 0)
        r = xfer_counters(L, 0, L->uidnext, 0);
    mailbox_close(&L->mb);
    free(L->name);
    L->name = NULL;
    return r;
}

/* "MAILBOX NAME UIDVALIDITY UIDNEXT HIGHESTMODSEQ", then ACL and
 * SPECIALUSE lines. */
static int xfer_load_mailbox(struct xfer_load *L)
{
    char name[600], *acl = NULL, *uses = NULL;
    unsigned long uv, un;
    unsigned long long hm;
    struct mboxlist_entry *e = NULL;
    int r, ret = -1;

    if (sscanf(buf_cstring(&L->line), "MAILBOX %599s %lu %lu %llu", name,
               &uv, &un, &hm) != 4 || uv == 0 || uv > UINT32_MAX ||
        un == 0 || un > UINT32_MAX)
        return xfer_load_error(L, "malformed MAILBOX line");
    if (!mboxname_is_self_or_child(buf_cstring(&L->inbox), name))
        return xfer_load_error(L, "a mailbox of another user");
    if (xfer_getline(L) || strncmp(buf_cstring(&L->line), "ACL ", 4) != 0)
        return xfer_load_error(L, "ACL line expected");
    acl = strdup(buf_cstring(&L->line) + 4);
    if (xfer_getline(L) ||
        strncmp(buf_cstring(&L->line), "SPECIALUSE ", 11) != 0) {
        free(acl);
        return xfer_load_error(L, "SPECIALUSE line expected");
    }
    uses = strdup(buf_cstring(&L->line) + 11);
    if (!acl || !uses) {
        xfer_fail("out of memory", NULL, STORE_NOMEM);
        goto out;
    }
    r = mboxlist_create_special(L->ml, name, NULL, *acl ? acl : NULL,
                                *uses ? uses : NULL, NULL);
    if (r == STORE_OK)
        r = mboxlist_lookup(L->ml, name, &e);
    if (r == STORE_OK)
        r = mailbox_open(L->conf, name, e->partition, &L->mb);
    if (r) {
        xfer_fail("cannot create", name, r);
        goto out;
    }
    L->name = strdup(name);
    buf_setcstr(&L->uniqueid, e->uniqueid);
    L->uidnext = (uint32_t)un;
    L->next = 1;
    L->nmailboxes++;
    if (!L->name || xfer_counters(L, (uint32_t)uv, 0, hm))
        goto out;
    ret = 0;
out:
    mboxlist_entry_free(&e);
    free(acl);
    free(uses);
    return ret;
}

/* Read size bytes of the dump and the LF after them into a new stage. */
static int xfer_read_stage(struct xfer_load *L, uint64_t size,
                           struct append_stage **st_r)
{
    int r = append_stage_open(L->conf, mailbox_partition(L->mb), st_r);

    while (r == STORE_OK && size > 0) {
        size_t want = size < 65536 ? (size_t)size : 65536;
        size_t n = fread(L->copy, 1, want, L->in);

        if (n == 0)
            return xfer_load_error(L, "message cut short");
        r = append_stage_write(*st_r, L->copy, n);
        size -= n;
    }
    if (r == STORE_OK)
        r = append_stage_close(*st_r);
    if (r) {
        xfer_fail("cannot stage a message of", L->name, r);
        return -1;
    }
    if (getc(L->in) != '\n')
        return xfer_load_error(L, "LF expected after the message");
    return 0;
}

/* "MESSAGE UID INTERNALDATE SYSFLAGS SIZE [KEYWORD ...]" and the bytes. */
static int xfer_load_message(struct xfer_load *L)
{
    struct strarray words = STRARRAY_INITIALIZER;
    unsigned long uid, flags, size;
    long long date;
    uint32_t got = 0;
    char *end;
    int r, ret = -1;

    if (!L->mb)
        return xfer_load_error(L, "MESSAGE outside a mailbox");
    if (strarray_split(&words, buf_cstring(&L->line) + 8, " ") < 0 ||
        words.count < 4)
        goto bad;
    errno = 0;
    uid = strtoul(words.data[0], &end, 10);
    if (*end || uid == 0 || uid > UINT32_MAX)
        goto bad;
    date = strtoll(words.data[1], &end, 10);
    if (*end)
        goto bad;
    flags = strtoul(words.data[2], &end, 10);
    if (*end || (flags & ~(unsigned long)MAILBOX_SYSTEM_FLAGS))
        goto bad;
    size = strtoul(words.data[3], &end, 10);
    if (*end || errno || size > UINT32_MAX)
        goto bad;
    if (uid < L->next || uid >= L->uidnext) {
        xfer_load_error(L, "UID out of order");
        goto out;
    }
    if (uid != L->next) {
        /* a gap of the original (expunged messages) */
        if (xfer_commit_batch(L) || xfer_counters(L, 0, (uint32_t)uid, 0))
            goto out;
    }
    if (xfer_read_stage(L, size, &L->stages[L->nstages]) != 0) {
        append_stage_free(&L->stages[L->nstages]);
        goto out;
    }
    L->nstages++;
    r = append_add_keywords(L->txn, L->mb, L->stages[L->nstages - 1],
                            date, (uint32_t)flags,
                            (const char *const *)words.data + 4,
                            words.count - 4,
                            APPEND_IGNORE_QUOTA | APPEND_KEYWORDS_STRICT,
                            &got);
    if (r) {
        xfer_fail("cannot append to", L->name, r);
        goto out;
    }
    if (got != uid) {
        fprintf(stderr, "mbtool: %s: message got UID %" PRIu32 ", not %lu\n",
                L->name, got, uid);
        goto out;
    }
    L->next = (uint32_t)uid + 1;
    L->nmsgs++;
    if (L->nstages == XFER_BATCH && xfer_commit_batch(L))
        goto out;
    ret = 0;
    goto out;
bad:
    xfer_load_error(L, "malformed MESSAGE line");
out:
    strarray_fini(&words);
    return ret;
}

static int xfer_load_seen(struct xfer_load *L)
{
    struct seen_data sd;
    long long lastread, lastchange;
    unsigned long lastuid;
    int n = 0, r;

    if (!L->mb)
        return xfer_load_error(L, "SEEN outside a mailbox");
    memset(&sd, 0, sizeof(sd));
    if (sscanf(buf_cstring(&L->line), "SEEN %lld %lu %lld %n", &lastread,
               &lastuid, &lastchange, &n) != 3 || n == 0 ||
        lastuid > UINT32_MAX)
        return xfer_load_error(L, "malformed SEEN line");
    sd.lastread = (time_t)lastread;
    sd.lastuid = (uint32_t)lastuid;
    sd.lastchange = (time_t)lastchange;
    buf_setcstr(&sd.seenuids, buf_cstring(&L->line) + n);
    r = seen_write(L->seen, buf_cstring(&L->uniqueid), &sd);
    seen_data_free(&sd);
    if (r) {
        xfer_fail("cannot write the seen state of", L->name, r);
        return -1;
    }
    return 0;
}

static int xfer_load_quota(struct xfer_load *L)
{
    char root[600];
    long long kb, msgs;
    int r;

    if (sscanf(buf_cstring(&L->line), "QUOTA %599s %lld %lld", root, &kb,
               &msgs) != 3)
        return xfer_load_error(L, "malformed QUOTA line");
    if (!mboxname_is_self_or_child(buf_cstring(&L->inbox), root))
        return xfer_load_error(L, "a quota root of another user");
    r = quota_set(L->q, root, kb, msgs);
    if (r) {
        xfer_fail("cannot set the quota of", root, r);
        return -1;
    }
    return 0;
}

static int xfer_load_sieve(struct xfer_load *L)
{
    char name[600];
    int active;
    unsigned long size;
    struct buf dir = BUF_INITIALIZER, text = BUF_INITIALIZER;
    int r = -1;

    if (sscanf(buf_cstring(&L->line), "SIEVE %599s %d %lu", name, &active,
               &size) != 3 || size > XFER_SIEVE_MAX)
        return xfer_load_error(L, "malformed SIEVE line");
    if (buf_ensure(&text, size + 1) < 0 ||
        fread(text.s, 1, size, L->in) != size || getc(L->in) != '\n') {
        xfer_load_error(L, "Sieve script cut short");
        goto out;
    }
    text.len = size;
    if (sievedir_user_path(L->conf, L->userid, &dir) != SIEVEDIR_OK ||
        sievedir_put(buf_cstring(&dir), name, text.s, text.len) !=
            SIEVEDIR_OK ||
        (active && sievedir_activate(buf_cstring(&dir), name) !=
            SIEVEDIR_OK)) {
        fprintf(stderr, "mbtool: cannot store Sieve script %s\n", name);
        goto out;
    }
    r = 0;
out:
    buf_free(&dir);
    buf_free(&text);
    return r;
}

/* DUPLICATE TIME UID MAILBOX IDLEN [UIDVALIDITY GUID], the id's bytes,
 * LF: recorded here (the uid stays valid: a move keeps every UID, the
 * UIDVALIDITY and the bytes, hence the GUID, so a record naming its copy
 * is checked against the moved mailbox as against the old one). */
static int xfer_load_dup(struct xfer_load *L)
{
    char name[600], id[DUPLICATE_ID_MAX + 1], hex[2 * DUPLICATE_GUID_LEN + 2];
    struct duplicate_copy copy;
    long long when;
    unsigned long uid, uidvalidity = 0;
    size_t idlen;
    int r, n;

    n = sscanf(buf_cstring(&L->line), "DUPLICATE %lld %lu %599s %zu %lu %41s",
               &when, &uid, name, &idlen, &uidvalidity, hex);
    if ((n != 4 && n != 6) || when < 0 ||
        uid > UINT32_MAX || idlen == 0 || idlen > DUPLICATE_ID_MAX ||
        (n == 6 && (uidvalidity > UINT32_MAX ||
                    duplicate_guid_parse(hex, strlen(hex), copy.guid) < 0)))
        return xfer_load_error(L, "malformed DUPLICATE line");
    if (!mboxname_is_self_or_child(buf_cstring(&L->inbox), name))
        return xfer_load_error(L, "a DUPLICATE record of another user");
    if (fread(id, 1, idlen, L->in) != idlen || getc(L->in) != '\n')
        return xfer_load_error(L, "DUPLICATE record cut short");
    if (!L->dup && (r = duplicate_open(L->conf, &L->dup)) != STORE_OK) {
        xfer_fail("cannot open the duplicate-delivery database", NULL, r);
        return -1;
    }
    if (n == 6) {
        const char *names[1] = { name };

        copy.uid = (uint32_t)uid;
        copy.uidvalidity = (uint32_t)uidvalidity;
        r = duplicate_mark_copies(L->dup, id, idlen, names, &copy, 1,
                                  (time_t)when);
    } else {
        r = duplicate_mark(L->dup, id, idlen, name, (time_t)when,
                           (uint32_t)uid);
    }
    if (r) {
        xfer_fail("cannot record a delivery of", name, r);
        return -1;
    }
    return 0;
}

static int xfer_load_all(struct xfer_load *L, char *stamp_r)
{
    const char *l;
    char hdr[600], hdr1[600];

    if (xfer_getline(L))
        return -1;
    snprintf(hdr, sizeof(hdr), "%s %s", XFER_MAGIC, L->userid);
    snprintf(hdr1, sizeof(hdr1), "%s %s", XFER_MAGIC_V1, L->userid);
    if (strcmp(buf_cstring(&L->line), hdr) != 0 &&
        strcmp(buf_cstring(&L->line), hdr1) != 0)
        return xfer_load_error(L, "not a dump of this user (or version)");
    for (;;) {
        int r;

        if (xfer_getline(L))
            return -1;
        l = buf_cstring(&L->line);
        if (strncmp(l, "MESSAGE ", 8) == 0)
            r = xfer_load_message(L);
        else if (strncmp(l, "MAILBOX ", 8) == 0)
            r = xfer_finish_mailbox(L) ? -1 : xfer_load_mailbox(L);
        else if (strncmp(l, "SEEN ", 5) == 0)
            r = xfer_load_seen(L);
        else if (strncmp(l, "QUOTA ", 6) == 0)
            r = xfer_load_quota(L);
        else if (strncmp(l, "SUBSCRIBE ", 10) == 0) {
            r = subs_add(L->subs, l + 10);
            if (r)
                xfer_fail("cannot subscribe", l + 10, r);
            r = r ? -1 : 0;
        } else if (strncmp(l, "SIEVE ", 6) == 0)
            r = xfer_finish_mailbox(L) ? -1 : xfer_load_sieve(L);
        else if (strncmp(l, "DUPLICATE ", 10) == 0)
            r = xfer_finish_mailbox(L) ? -1 : xfer_load_dup(L);
        else if (strncmp(l, "END ", 4) == 0) {
            unsigned long nm, nmsg;

            if (xfer_finish_mailbox(L))
                return -1;
            if (sscanf(l, "END %lu %lu %15s", &nm, &nmsg, stamp_r) != 3)
                return xfer_load_error(L, "malformed END line");
            if (nm != L->nmailboxes || nmsg != L->nmsgs)
                return xfer_load_error(L, "the counts of END differ");
            return 0;
        } else
            r = xfer_load_error(L, "unknown line");
        if (r)
            return -1;
    }
}

int mbtool_user_load(const struct imapconf *conf, int argc, char **argv)
{
    struct xfer_load L;
    struct xfer_tree t = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER,
                           STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    char stamp[16] = "";
    int ret = 1, r;

    if (argc != 2) {
        fprintf(stderr, "mbtool: usage: user-load USER < DUMP\n");
        return 2;
    }
    memset(&L, 0, sizeof(L));
    L.conf = conf;
    L.in = stdin;
    L.userid = argv[1];
    if (xfer_inbox(L.userid, &L.inbox))
        goto out;
    if ((r = mboxlist_open(conf, &L.ml)) != STORE_OK ||
        (r = xfer_tree_collect(L.ml, buf_cstring(&L.inbox), &t)) !=
            STORE_OK) {
        xfer_fail("cannot read the mailbox list", NULL, r);
        goto out;
    }
    if (t.names.count) {
        fprintf(stderr, "mbtool: %s has mailboxes here already: not "
                "loaded\n", L.userid);
        goto out;
    }
    L.copy = malloc(65536);
    if (!L.copy || (r = quota_open(conf, &L.q)) != STORE_OK ||
        (r = seen_open(conf, L.userid, &L.seen)) != STORE_OK ||
        (r = subs_open(conf, L.userid, &L.subs)) != STORE_OK ||
        (r = append_begin(conf, &L.txn)) != STORE_OK) {
        xfer_fail("cannot open the databases of", L.userid,
                  L.copy ? r : STORE_NOMEM);
        goto out;
    }
    if (xfer_load_all(&L, stamp) == 0) {
        ret = 0;
    } else {
        /* nothing half-made stays behind */
        append_abort(L.txn);
        xfer_commit_batch(&L);
        mailbox_close(&L.mb);
    }
    append_free(&L.txn);
    subs_close(&L.subs);
    seen_close(&L.seen);
    if (ret != 0) {
        xfer_tree_fini(&t);
        memset(&t, 0, sizeof(t));
        if (xfer_tree_collect(L.ml, buf_cstring(&L.inbox), &t) == STORE_OK)
            (void)xfer_purge(conf, L.ml, L.userid, &t);
        goto out;
    }
    r = userstate_set(conf, L.userid, USERSTATE_HERE, NULL);
    if (r) {
        xfer_fail("cannot clear the mark of", L.userid, r);
        ret = 1;
        goto out;
    }
    printf("loaded %s mailboxes=%lu messages=%lu stamp=%s\n", L.userid,
           L.nmailboxes, L.nmsgs, stamp);
out:
    append_free(&L.txn);
    subs_close(&L.subs);
    seen_close(&L.seen);
    quota_close(&L.q);
    duplicate_close(&L.dup);
    mailbox_close(&L.mb);
    mboxlist_close(&L.ml);
    free(L.name);
    free(L.copy);
    buf_free(&L.line);
    buf_free(&L.inbox);
    buf_free(&L.uniqueid);
    xfer_tree_fini(&t);
    return fflush(stdout) == 0 ? ret : 1;
}
