/*
 * flat.c - the flat text file format engine; see flat.h for the format.
 *
 * Invariants kept by this module:
 *   - every parse is bounded by the map: a line is only ever read between
 *     its start and its LF, and a file that does not end in LF, a line
 *     without TAB, or a bad escape gives FLAT_DAMAGED, never a read past
 *     the map;
 *   - the binary search only moves between line starts, so each step
 *     strictly shrinks the range and the search always ends;
 *   - the search, the check, the merge and the change set all use one
 *     order: cyrusdb_compare()'s order of the ENCODED keys (see flat.h);
 *   - flat_write_merged copies the lines it does not change byte for byte,
 *     so rewriting a file Cyrus wrote changes only the records touched.
 *
 * Crash safety is the caller's: it writes the merge into a new file,
 * fsyncs it and renames it over the old one (cyrusdb_flat.c).  A file is
 * never changed in place, which is also why a read-only map of it stays
 * valid and consistent for as long as it is mapped.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/flat.h"
#include "lib/fsutil.h"

/* ---- encoding ---------------------------------------------------------- */

/* The byte an escape sequence FF x stands for, or -1 when x is not one of
 * the sequences the encoder writes. */
static int flat_unescape(unsigned char x)
{
    switch (x) {
    case 0x80: return '\0';
    case 0x89: return '\t';
    case 0x8a: return '\n';
    case 0x8d: return '\r';
    case FLAT_ESCAPE: return FLAT_ESCAPE;
    default: return -1;
    }
}

/* Bytes that must never appear raw in an encoded string. */
static int flat_is_special(unsigned char c)
{
    return c == '\0' || c == '\t' || c == '\n' || c == '\r';
}

int flat_encode(struct buf *out, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i, run = 0;

    /* worst case doubles; ask once so the loop below never fails midway */
    if (len > SIZE_MAX / 2 - 1 || buf_ensure(out, 2 * len) < 0)
        return FLAT_SYSERR;
    for (i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (!flat_is_special(c) && c != FLAT_ESCAPE) {
            run++;
            continue;
        }
        if (run)
            buf_append(out, p + i - run, run);
        run = 0;
        buf_putc(out, FLAT_ESCAPE);
        buf_putc(out, c == FLAT_ESCAPE ? FLAT_ESCAPE : (c | 0x80));
    }
    if (run)
        buf_append(out, p + len - run, run);
    return FLAT_OK;
}

int flat_decode(struct buf *out, const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i, run = 0;

    if (buf_ensure(out, len) < 0)
        return FLAT_SYSERR;
    for (i = 0; i < len; i++) {
        unsigned char c = p[i];
        int d;
        if (flat_is_special(c))
            return FLAT_DAMAGED;
        if (c != FLAT_ESCAPE) {
            run++;
            continue;
        }
        if (run)
            buf_append(out, p + i - run, run);
        run = 0;
        if (i + 1 >= len || (d = flat_unescape(p[i + 1])) < 0)
            return FLAT_DAMAGED;
        buf_putc(out, d);
        i++;
    }
    if (run)
        buf_append(out, p + len - run, run);
    return FLAT_OK;
}

/* The byte order: plain, or (CYRUSDB_MBOXSORT) '.' before every other
 * byte -- cyrusdb_compare()'s, applied to encoded bytes. */
static inline int flat_rank(int flags, unsigned char c)
{
    if (flags & CYRUSDB_MBOXSORT)
        return c == '.' ? 0 : (int)c + 1;
    return c;
}

/* The encoding of a plain key, produced one byte at a time. */
struct flat_encoder {
    const unsigned char *p;
    size_t left;
    int pending;        /* second byte of an escape, or -1 */
};

static void flat_encoder_init(struct flat_encoder *e, const char *s, size_t len)
{
    e->p = (const unsigned char *)s;
    e->left = len;
    e->pending = -1;
}

static int flat_encoder_more(const struct flat_encoder *e)
{
    return e->pending >= 0 || e->left > 0;
}

static unsigned char flat_encoder_next(struct flat_encoder *e)
{
    unsigned char c;

    if (e->pending >= 0) {
        c = (unsigned char)e->pending;
        e->pending = -1;
        return c;
    }
    c = *e->p++;
    e->left--;
    if (flat_is_special(c) || c == FLAT_ESCAPE) {
        e->pending = c == FLAT_ESCAPE ? FLAT_ESCAPE : (c | 0x80);
        return FLAT_ESCAPE;
    }
    return c;
}

/* Check the encoded byte at e[j] given whether it follows an escape
 * byte; updates *in_escape.  0 or FLAT_DAMAGED. */
static int flat_check_enc_byte(const unsigned char *e, size_t len, size_t j,
                               int *in_escape)
{
    if (*in_escape) {
        *in_escape = 0;     /* validated with its escape byte */
        return 0;
    }
    if (flat_is_special(e[j]))
        return FLAT_DAMAGED;
    if (e[j] == FLAT_ESCAPE) {
        if (j + 1 >= len || flat_unescape(e[j + 1]) < 0)
            return FLAT_DAMAGED;
        *in_escape = 1;
    }
    return 0;
}

int flat_compare_encoded(int flags, const char *key, size_t keylen,
                         const char *enc, size_t enclen, int *cmp_r)
{
    const unsigned char *e = (const unsigned char *)enc;
    struct flat_encoder k;
    size_t j = 0;
    int in_escape = 0;

    flat_encoder_init(&k, key, keylen);
    while (flat_encoder_more(&k) && j < enclen) {
        int rk, re;

        if (flat_check_enc_byte(e, enclen, j, &in_escape) != 0)
            return FLAT_DAMAGED;
        rk = flat_rank(flags, flat_encoder_next(&k));
        re = flat_rank(flags, e[j]);
        if (rk != re) {
            *cmp_r = rk < re ? -1 : 1;
            return FLAT_OK;
        }
        j++;
    }
    if (flat_encoder_more(&k)) {
        *cmp_r = 1;
        return FLAT_OK;
    }
    /* the key ran out first: still refuse a damaged rest (keys are short) */
    *cmp_r = j < enclen ? -1 : 0;
    for (; j < enclen; j++)
        if (flat_check_enc_byte(e, enclen, j, &in_escape) != 0)
            return FLAT_DAMAGED;
    return FLAT_OK;
}

int flat_compare_keys(int flags, const char *a, size_t alen,
                      const char *b, size_t blen)
{
    struct flat_encoder ea, eb;

    flat_encoder_init(&ea, a, alen);
    flat_encoder_init(&eb, b, blen);
    while (flat_encoder_more(&ea) && flat_encoder_more(&eb)) {
        int ra = flat_rank(flags, flat_encoder_next(&ea));
        int rb = flat_rank(flags, flat_encoder_next(&eb));
        if (ra != rb)
            return ra < rb ? -1 : 1;
    }
    if (flat_encoder_more(&ea))
        return 1;
    return flat_encoder_more(&eb) ? -1 : 0;
}

/* Compare two encoded keys (already known to be valid). */
static int flat_compare_enc_enc(int flags, const char *a, size_t alen,
                                const char *b, size_t blen)
{
    size_t i, n = alen < blen ? alen : blen;

    for (i = 0; i < n; i++) {
        int ra = flat_rank(flags, (unsigned char)a[i]);
        int rb = flat_rank(flags, (unsigned char)b[i]);
        if (ra != rb)
            return ra < rb ? -1 : 1;
    }
    if (alen == blen)
        return 0;
    return alen < blen ? -1 : 1;
}

/* ---- maps ---------------------------------------------------------------- */

int flat_map_fd(int fd, size_t size, struct flat_map *map_r)
{
    void *p;

    map_r->base = NULL;
    map_r->size = 0;
    if (size == 0)
        return FLAT_OK;
    p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return FLAT_SYSERR;
    map_r->base = p;
    map_r->size = size;
    return FLAT_OK;
}

void flat_map_release(struct flat_map *map)
{
    if (map->base && map->size)
        munmap((void *)map->base, map->size);
    map->base = NULL;
    map->size = 0;
}

int flat_parse_line(const struct flat_map *map, size_t offset,
                    struct flat_record *rec_r)
{
    const char *start, *lf, *tab;
    size_t linelen;

    if (offset >= map->size)
        return FLAT_END;
    start = map->base + offset;
    lf = memchr(start, '\n', map->size - offset);
    if (!lf)
        return FLAT_DAMAGED;
    linelen = (size_t)(lf - start);
    tab = memchr(start, '\t', linelen);
    if (!tab || tab == start)
        return FLAT_DAMAGED;
    rec_r->offset = offset;
    rec_r->key = start;
    rec_r->keylen = (size_t)(tab - start);
    rec_r->val = tab + 1;
    rec_r->vallen = (size_t)(lf - tab - 1);
    rec_r->next = offset + linelen + 1;
    return FLAT_OK;
}

int flat_search(const struct flat_map *map, int flags,
                const char *key, size_t keylen,
                size_t *offset_r, int *found_r)
{
    size_t lo = 0, hi = map->size;

    /* lo and hi are always line starts (or the end); the answer lies in
     * [lo, hi]. */
    *found_r = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        size_t start = lo;
        const char *nl;
        struct flat_record rec;
        int r, cmp;

        if (mid > lo) {
            nl = memrchr(map->base + lo, '\n', mid - lo);
            if (nl)
                start = (size_t)(nl - map->base) + 1;
        }
        r = flat_parse_line(map, start, &rec);
        if (r != FLAT_OK)
            return FLAT_DAMAGED;
        if (rec.next > hi)
            return FLAT_DAMAGED;   /* cannot happen for a line start */
        r = flat_compare_encoded(flags, key, keylen, rec.key, rec.keylen, &cmp);
        if (r != FLAT_OK)
            return r;
        if (cmp == 0) {
            *offset_r = start;
            *found_r = 1;
            return FLAT_OK;
        }
        if (cmp < 0)
            hi = start;
        else
            lo = rec.next;
    }
    *offset_r = lo;
    return FLAT_OK;
}

int flat_check(const struct flat_map *map, int flags, size_t *count_r,
               size_t *offset_r, const char **why_r)
{
    struct buf scratch = BUF_INITIALIZER;
    struct flat_record prev = { 0, NULL, 0, NULL, 0, 0 };
    size_t offset = 0, count = 0;
    int have_prev = 0;
    int ret = FLAT_OK;

    *why_r = NULL;
    while (offset < map->size) {
        struct flat_record rec;
        int r = flat_parse_line(map, offset, &rec);

        if (r != FLAT_OK) {
            *why_r = memchr(map->base + offset, '\n', map->size - offset)
                     ? "line without TAB or with an empty key"
                     : "last line does not end with LF";
            ret = FLAT_DAMAGED;
            break;
        }
        buf_reset(&scratch);
        r = flat_decode(&scratch, rec.key, rec.keylen);
        if (r == FLAT_OK) {
            buf_reset(&scratch);
            r = flat_decode(&scratch, rec.val, rec.vallen);
        }
        if (r != FLAT_OK) {
            *why_r = r == FLAT_DAMAGED ? "bad escape or raw control byte"
                                       : "out of memory";
            ret = r;
            break;
        }
        if (have_prev && flat_compare_enc_enc(flags, prev.key, prev.keylen,
                                              rec.key, rec.keylen) >= 0) {
            *why_r = "keys out of order or repeated";
            ret = FLAT_DAMAGED;
            break;
        }
        prev = rec;
        have_prev = 1;
        count++;
        offset = rec.next;
    }
    *offset_r = offset;
    if (count_r)
        *count_r = count;
    buf_free(&scratch);
    return ret;
}

/* ---- pending changes: an in-memory skip list -------------------------------
 * Inserts and updates only; a deletion is a change too (a tombstone), so
 * nodes are never unlinked before the whole set is freed.  That keeps a
 * node pointer valid while a foreach callback adds further changes. */

#define FLAT_CS_MAXLEVEL 24

struct flat_changes {
    int flags;
    int level;               /* highest level in use, >= 1 */
    size_t count;
    uint32_t rng;
    struct flat_change *head;  /* sentinel with FLAT_CS_MAXLEVEL links */
};

static struct flat_change *flat_change_alloc(int level, size_t keylen)
{
    struct flat_change *c;
    size_t links = (size_t)level * sizeof(struct flat_change *);

    c = calloc(1, sizeof(*c) + links + keylen + 1);
    if (!c)
        return NULL;
    c->level = level;
    c->key = (char *)c + sizeof(*c) + links;
    c->keylen = keylen;
    return c;
}

struct flat_changes *flat_changes_new(int flags)
{
    struct flat_changes *cs = calloc(1, sizeof(*cs));

    if (!cs)
        return NULL;
    cs->head = flat_change_alloc(FLAT_CS_MAXLEVEL, 0);
    if (!cs->head) {
        free(cs);
        return NULL;
    }
    cs->flags = flags;
    cs->level = 1;
    cs->rng = (uint32_t)(uintptr_t)cs ^ (uint32_t)getpid() ^ 0x9e3779b9u;
    if (!cs->rng)
        cs->rng = 1;
    return cs;
}

void flat_changes_free(struct flat_changes **csp)
{
    struct flat_changes *cs = *csp;
    struct flat_change *c, *next;

    if (!cs)
        return;
    *csp = NULL;
    for (c = cs->head->next[0]; c; c = next) {
        next = c->next[0];
        free(c->val);
        free(c);
    }
    free(cs->head);
    free(cs);
}

static int flat_changes_randlevel(struct flat_changes *cs)
{
    int level = 1;

    for (;;) {
        cs->rng ^= cs->rng << 13;
        cs->rng ^= cs->rng >> 17;
        cs->rng ^= cs->rng << 5;
        if ((cs->rng & 3) != 0 || level >= FLAT_CS_MAXLEVEL)
            return level;
        level++;
    }
}

/* Fill update[] with, per level, the last node whose key is < key
 * (strict == 0) or <= key (strict != 0). */
static void flat_changes_path(const struct flat_changes *cs,
                              const char *key, size_t keylen, int strict,
                              struct flat_change **update)
{
    struct flat_change *x = cs->head;
    int i;

    for (i = cs->level - 1; i >= 0; i--) {
        for (;;) {
            struct flat_change *n = x->next[i];
            int cmp;
            if (!n)
                break;
            cmp = flat_compare_keys(cs->flags, n->key, n->keylen, key, keylen);
            if (cmp < 0 || (strict && cmp == 0))
                x = n;
            else
                break;
        }
        if (update)
            update[i] = x;
    }
    if (update)
        for (i = cs->level; i < FLAT_CS_MAXLEVEL; i++)
            update[i] = cs->head;
}

int flat_changes_put(struct flat_changes *cs, const char *key, size_t keylen,
                     const char *val, size_t vallen, int deleted)
{
    struct flat_change *update[FLAT_CS_MAXLEVEL];
    struct flat_change *c;
    char *copy = NULL;
    int level, i;

    if (!deleted && vallen) {
        copy = malloc(vallen);
        if (!copy) {
            errno = ENOMEM;
            return FLAT_SYSERR;
        }
        memcpy(copy, val, vallen);
    }
    flat_changes_path(cs, key, keylen, 0, update);
    c = update[0]->next[0];
    if (c && flat_compare_keys(cs->flags, c->key, c->keylen, key, keylen) == 0) {
        free(c->val);
        c->val = copy;
        c->vallen = deleted ? 0 : vallen;
        c->deleted = deleted != 0;
        return FLAT_OK;
    }
    level = flat_changes_randlevel(cs);
    c = flat_change_alloc(level, keylen);
    if (!c) {
        free(copy);
        errno = ENOMEM;
        return FLAT_SYSERR;
    }
    memcpy(c->key, key, keylen);
    c->val = copy;
    c->vallen = deleted ? 0 : vallen;
    c->deleted = deleted != 0;
    if (level > cs->level)
        cs->level = level;
    for (i = 0; i < level; i++) {
        c->next[i] = update[i]->next[i];
        update[i]->next[i] = c;
    }
    cs->count++;
    return FLAT_OK;
}

const struct flat_change *flat_changes_seek(const struct flat_changes *cs,
                                            const char *key, size_t keylen,
                                            int strict)
{
    struct flat_change *update[FLAT_CS_MAXLEVEL];

    if (!key)
        return cs->head->next[0];
    flat_changes_path(cs, key, keylen, strict, update);
    return update[0]->next[0];
}

const struct flat_change *flat_changes_find(const struct flat_changes *cs,
                                            const char *key, size_t keylen)
{
    const struct flat_change *c = flat_changes_seek(cs, key, keylen, 0);

    if (c && flat_compare_keys(cs->flags, c->key, c->keylen, key, keylen) == 0)
        return c;
    return NULL;
}

const struct flat_change *flat_changes_next(const struct flat_change *c)
{
    return c ? c->next[0] : NULL;
}

size_t flat_changes_count(const struct flat_changes *cs)
{
    return cs ? cs->count : 0;
}

/* ---- writing ---------------------------------------------------------------- */

#define FLAT_WRITE_CHUNK (256 * 1024)

int flat_format_record(struct buf *out, const char *key, size_t keylen,
                       const char *val, size_t vallen)
{
    if (flat_encode(out, key, keylen) != FLAT_OK ||
        buf_putc(out, '\t') < 0 ||
        flat_encode(out, val, vallen) != FLAT_OK ||
        buf_putc(out, '\n') < 0)
        return FLAT_SYSERR;
    return FLAT_OK;
}

/* Write out when the buffer is full enough (or always, when force). */
static int flat_flush(int fd, struct buf *out, int force)
{
    if (out->len == 0 || (!force && out->len < FLAT_WRITE_CHUNK))
        return FLAT_OK;
    if (fs_write_all(fd, out->s, out->len) < 0)
        return FLAT_SYSERR;
    buf_reset(out);
    return FLAT_OK;
}

int flat_write_merged(int fd, const struct flat_map *map, int flags,
                      const struct flat_changes *cs)
{
    struct buf out = BUF_INITIALIZER;
    const struct flat_change *c = cs ? flat_changes_seek(cs, NULL, 0, 0) : NULL;
    size_t offset = 0, checked = 0;
    struct flat_record prev;
    int have_prev = 0;
    int r = FLAT_OK;

    for (;;) {
        struct flat_record rec;
        int have_line, cmp;

        r = flat_parse_line(map, offset, &rec);
        if (r == FLAT_DAMAGED)
            break;
        have_line = r == FLAT_OK;
        r = FLAT_OK;
        /* The merge is only right if the file is in this handle's order
         * (the order is not recorded in the file): a file opened with the
         * other CYRUSDB_MBOXSORT setting is refused, not rewritten. */
        if (have_line && offset >= checked) {
            if (have_prev && flat_compare_enc_enc(flags, prev.key, prev.keylen,
                                                  rec.key, rec.keylen) >= 0) {
                r = FLAT_DAMAGED;
                break;
            }
            prev = rec;
            have_prev = 1;
            checked = rec.next;
        }
        if (!have_line && !c)
            break;
        if (!have_line) {
            cmp = -1;
        } else if (!c) {
            cmp = 1;
        } else {
            r = flat_compare_encoded(flags, c->key, c->keylen,
                                     rec.key, rec.keylen, &cmp);
            if (r != FLAT_OK)
                break;
        }
        if (cmp > 0) {
            /* the file's line comes first and is unchanged: copy it */
            if (buf_append(&out, map->base + rec.offset,
                           rec.next - rec.offset) < 0) {
                r = FLAT_SYSERR;
                break;
            }
            offset = rec.next;
        } else {
            /* the change replaces (cmp == 0) or precedes the line */
            if (!c->deleted &&
                flat_format_record(&out, c->key, c->keylen,
                                   c->val ? c->val : "", c->vallen) != FLAT_OK) {
                r = FLAT_SYSERR;
                break;
            }
            if (cmp == 0)
                offset = rec.next;
            c = flat_changes_next(c);
        }
        if ((r = flat_flush(fd, &out, 0)) != FLAT_OK)
            break;
    }
    if (r == FLAT_OK)
        r = flat_flush(fd, &out, 1);
    buf_free(&out);
    return r;
}
