/*
 * qresync.c - VANISHED (EARLIER) of QRESYNC: see qresync.h.
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "imapd/qresync.h"
#include "store/store.h"

/* A uid-set being printed from ascending ranges, merging adjacent ones. */
struct qr_emit {
    struct buf *out;
    uint32_t lo, hi;
    int open;
};

static void qr_flush(struct qr_emit *e)
{
    if (!e->open)
        return;
    if (e->out->len)
        buf_putc(e->out, ',');
    if (e->lo == e->hi)
        buf_printf(e->out, "%u", (unsigned)e->lo);
    else
        buf_printf(e->out, "%u:%u", (unsigned)e->lo, (unsigned)e->hi);
    e->open = 0;
}

static void qr_add(struct qr_emit *e, uint32_t lo, uint32_t hi)
{
    if (e->open && e->hi != UINT32_MAX && lo <= e->hi + 1) {
        if (hi > e->hi)
            e->hi = hi;
        return;
    }
    qr_flush(e);
    e->lo = lo;
    e->hi = hi;
    e->open = 1;
}

void qresync_uidset(struct buf *out, const uint32_t *uids, size_t n)
{
    struct buf tmp = BUF_INITIALIZER;
    struct qr_emit e = { &tmp, 0, 0, 0 };

    for (size_t i = 0; i < n; i++)
        qr_add(&e, uids[i], uids[i]);
    qr_flush(&e);
    if (tmp.len)
        buf_append(out, tmp.s, tmp.len);
    buf_free(&tmp);
}

static int qr_cmp_range(const void *a, const void *b)
{
    const struct imapparse_range *x = a, *y = b;

    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* `only` as sorted, merged ranges with lo <= hi and "*" = star. */
static int qr_normalize(const struct imapparse_seqset *only, uint32_t star,
                        struct imapparse_range **r_r, size_t *n_r)
{
    struct imapparse_range *r;
    size_t n = 0;

    r = calloc(only->n ? only->n : 1, sizeof(*r));
    if (!r)
        return STORE_NOMEM;
    for (size_t i = 0; i < only->n; i++) {
        uint32_t lo = only->r[i].lo ? only->r[i].lo : star;
        uint32_t hi = only->r[i].hi ? only->r[i].hi : star;

        if (lo > hi) {
            uint32_t t = lo;

            lo = hi;
            hi = t;
        }
        if (lo == 0)
            continue;           /* "*" of an empty mailbox */
        r[n].lo = lo;
        r[n].hi = hi;
        n++;
    }
    qsort(r, n, sizeof(*r), qr_cmp_range);
    if (n > 1) {
        size_t w = 0;

        for (size_t i = 1; i < n; i++) {
            if (r[i].lo <= r[w].hi || r[i].lo - r[w].hi == 1) {
                if (r[i].hi > r[w].hi)
                    r[w].hi = r[i].hi;
            } else {
                r[++w] = r[i];
            }
        }
        n = w + 1;
    }
    *r_r = r;
    *n_r = n;
    return STORE_OK;
}

/* Emit [lo, hi] intersected with the ranges from *j on (ascending calls
 * with ascending lo: *j only moves forward). */
static void qr_add_limited(struct qr_emit *e, uint32_t lo, uint32_t hi,
                           const struct imapparse_range *r, size_t n,
                           size_t *j)
{
    if (!r) {
        qr_add(e, lo, hi);
        return;
    }
    while (*j < n && r[*j].hi < lo)
        (*j)++;
    for (size_t k = *j; k < n && r[k].lo <= hi; k++) {
        uint32_t a = r[k].lo > lo ? r[k].lo : lo;
        uint32_t b = r[k].hi < hi ? r[k].hi : hi;

        qr_add(e, a, b);
    }
}

int qresync_vanished(struct mailbox *mb, uint64_t modseq,
                     const struct imapparse_seqset *only, struct buf *out,
                     int *fallback_r)
{
    const struct mailbox_header *h = mailbox_get_header(mb);
    struct imapparse_range *lim = NULL;
    size_t nlim = 0, j = 0;
    struct qr_emit e = { out, 0, 0, 0 };
    uint32_t visible = h->visible, uidnext = h->uidnext, prev = 0;
    int full = modseq < h->deletedmodseq;
    int r = STORE_OK;

    buf_reset(out);
    if (fallback_r)
        *fallback_r = full;
    if (only) {
        r = qr_normalize(only, uidnext > 1 ? uidnext - 1 : 0, &lim, &nlim);
        if (r)
            return r;
    }
    for (uint32_t recno = 0; recno < visible; recno++) {
        struct mailbox_record rec;

        r = mailbox_read_record(mb, recno, &rec);
        if (r != STORE_OK)
            goto out;
        if (!full) {
            if ((rec.flags & MAILBOX_FLAG_EXPUNGED) && rec.modseq > modseq)
                qr_add_limited(&e, rec.uid, rec.uid, lim, nlim, &j);
            continue;
        }
        if (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        /* a live message: the UIDs between the previous one and it */
        if (rec.uid > prev + 1)
            qr_add_limited(&e, prev + 1, rec.uid - 1, lim, nlim, &j);
        prev = rec.uid;
    }
    if (full && uidnext > prev + 1)
        qr_add_limited(&e, prev + 1, uidnext - 1, lim, nlim, &j);
    qr_flush(&e);
out:
    free(lim);
    return r;
}
