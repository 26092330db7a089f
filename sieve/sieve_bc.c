/*
 * sieve_bc.c - the stored compiled form of a script (format in
 * sieve_bc.h): the checked tree written flat, and read back with every
 * length, count, reference and node shape checked.
 */
#include "config.h"

#include <endian.h>
#include <regex.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/crc32c.h"
#include "sieve/sieve_bc.h"
#include "sieve/sieve_ext.h"
#include "sieve/sieve_tree.h"

static const unsigned char sieve_bc_magic[8] = {
    0x7f, 'S', 'I', 'E', 'V', 'B', 'C', '\n'
};

/* node flag bits */
enum {
    BCF_TEST_LIST = 1 << 0, BCF_HAS_BLOCK = 1 << 1, BCF_UNCHECKED = 1 << 2,
    BCF_HAS_MATCH = 1 << 3, BCF_HAS_CMP = 1 << 4, BCF_HAS_ADDR = 1 << 5,
    BCF_LAST = 1 << 6, BCF_ORIGZONE = 1 << 7, BCF_HAS_FLAGS = 1 << 8,
    BCF_COPY = 1 << 9, BCF_CREATE = 1 << 10, BCF_MIME = 1 << 11,
    BCF_ONCE = 1 << 12, BCF_OPTIONAL = 1 << 13, BCF_GLOBAL = 1 << 14,
    BCF_HAS_SECONDS = 1 << 15, BCF_OVER = 1 << 16
};
#define BCF_ALL ((1u << 17) - 1)

/* the node's flag of each bit (BCF_*), in bit order */
static const size_t bc_flag_off[] = {
    offsetof(struct sv_node, test_list), offsetof(struct sv_node, has_block),
    offsetof(struct sv_node, unchecked), offsetof(struct sv_node, has_match),
    offsetof(struct sv_node, has_comparator),
    offsetof(struct sv_node, has_addrpart), offsetof(struct sv_node, last),
    offsetof(struct sv_node, originalzone),
    offsetof(struct sv_node, has_flags), offsetof(struct sv_node, copy),
    offsetof(struct sv_node, create), offsetof(struct sv_node, mime),
    offsetof(struct sv_node, once), offsetof(struct sv_node, optional),
    offsetof(struct sv_node, global), offsetof(struct sv_node, has_seconds),
    offsetof(struct sv_node, over)
};

/* the node fields written only when not 0: bit i of the field mask */
enum {
    BCV_COMPARATOR, BCV_MATCH, BCV_RELOP, BCV_ADDRPART, BCV_BODY,
    BCV_MODIFIERS, BCV_INDEX, BCV_SECONDS, BCV_NUMBER,
    BCV_ZONE, BCV_SPECIALUSE, BCV_SUBJECT, BCV_FROM, BCV_HANDLE,
    BCV_HEADER, BCV_UNIQUEID,
    BCV_FLAGS, BCV_ADDRESSES, BCV_CONTENT,
    BCV_COUNT
};

/* string flag bits */
#define BCS_HAS_VAR 1u
#define BCS_REGEX   2u

/* the node fields that point into the node's arguments (BCV_ZONE and
 * after): the first string of an argument, or its whole list; stored as
 * 1 + the argument's index, the same table for writing and reading, in
 * BCV_* order (the decoder takes row k - BCV_ZONE for mask bit k) */
static const struct bc_ref {
    unsigned char k;      /* BCV_* */
    unsigned char list;   /* a const struct sv_strlist *, else sv_str * */
    size_t off;           /* offsetof(struct sv_node, field) */
} bc_refs[] = {
    { BCV_ZONE, 0, offsetof(struct sv_node, zone) },
    { BCV_SPECIALUSE, 0, offsetof(struct sv_node, specialuse) },
    { BCV_SUBJECT, 0, offsetof(struct sv_node, subject) },
    { BCV_FROM, 0, offsetof(struct sv_node, from) },
    { BCV_HANDLE, 0, offsetof(struct sv_node, handle) },
    { BCV_HEADER, 0, offsetof(struct sv_node, header) },
    { BCV_UNIQUEID, 0, offsetof(struct sv_node, uniqueid) },
    { BCV_FLAGS, 1, offsetof(struct sv_node, flags) },
    { BCV_ADDRESSES, 1, offsetof(struct sv_node, addresses) },
    { BCV_CONTENT, 1, offsetof(struct sv_node, content_types) },
};
#define BC_NREFS (sizeof(bc_refs) / sizeof(bc_refs[0]))

/* the field of n that r names (for the decoder, which sets it) */
static const struct sv_str **bc_ref_str(struct sv_node *n,
                                        const struct bc_ref *r)
{
    return (const struct sv_str **)(void *)((char *)n + r->off);
}

static const struct sv_strlist **bc_ref_list(struct sv_node *n,
                                             const struct bc_ref *r)
{
    return (const struct sv_strlist **)(void *)((char *)n + r->off);
}

#define SIEVE_BC_MAX_DEPTH 256

/* ---- hashes ------------------------------------------------------------- */

/* eight bytes per step (read little-endian, so that the value is the
 * same on every host), a multiply and a shift to mix each in; the tail
 * zero-padded; the length first */
static inline uint64_t sieve_bc_word8(const unsigned char *b)
{
    uint64_t w;

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&w, b, 8);            /* one load */
#else
    w = (uint64_t)b[0] | (uint64_t)b[1] << 8 | (uint64_t)b[2] << 16 |
        (uint64_t)b[3] << 24 | (uint64_t)b[4] << 32 |
        (uint64_t)b[5] << 40 | (uint64_t)b[6] << 48 | (uint64_t)b[7] << 56;
#endif
    return w;
}

static uint64_t sieve_bc_word(const unsigned char *b, size_t n)
{
    uint64_t w = 0;
    size_t i;

    for (i = 0; i < n; i++)
        w |= (uint64_t)b[i] << (8 * i);
    return w;
}

uint64_t sieve_bc_hash(const char *p, size_t len)
{
    const uint64_t k = 0x9E3779B97F4A7C15ULL;
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = (uint64_t)len * k ^ 0x5349455642430002ULL;

    for (; len >= 8; b += 8, len -= 8) {
        h = (h ^ sieve_bc_word8(b)) * k;
        h ^= h >> 29;
    }
    if (len) {
        h = (h ^ sieve_bc_word(b, len)) * k;
        h ^= h >> 29;
    }
    return h;
}

uint32_t sieve_bc_extmask(const struct strarray *allowed)
{
    uint32_t m = 0;
    int i;

    for (i = 0; i < EXT_COUNT; i++)
        if (!allowed || i == EXT_CMP_OCTET || i == EXT_CMP_CASEMAP ||
            strarray_find(allowed, sieve_ext_names[i]) >= 0)
            m |= 1u << i;
    return m;
}

static void put_le(unsigned char *p, uint64_t v, int n)
{
    int i;

    for (i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* n (at most 8) bytes little-endian: they fill the low bytes of v's
 * memory, which le64toh() reads as little-endian on any host */
static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;

    memcpy(&v, p, (size_t)n);
    return le64toh(v);
}

uint32_t sieve_bc_checksum(const void *file, size_t len)
{
    const unsigned char *h = file;
    uint32_t c = crc32c_update(CRC32C_INIT, h + SIEVE_BC_HEADER, len);

    c = crc32c_update(c, h + 44, 4);
    return crc32c_final(crc32c_update(c, h + 64, 16));
}

/* the header is of this version and says the file's length */
static int bc_header_ok(const unsigned char *h, size_t len)
{
    return len >= SIEVE_BC_HEADER && memcmp(h, sieve_bc_magic, 8) == 0 &&
           get_le(h + 8, 4) == SIEVE_BC_VERSION &&
           get_le(h + 12, 4) == SIEVE_BC_HEADER &&
           get_le(h + 56, 4) == len - SIEVE_BC_HEADER;
}

int sieve_bc_set_source(void *file, size_t len, uint64_t ino,
                        int64_t mtime_ns)
{
    unsigned char *h = file;

    if (!h || !bc_header_ok(h, len))
        return -1;
    put_le(h + 64, ino, 8);
    put_le(h + 72, (uint64_t)mtime_ns, 8);
    put_le(h + 60, sieve_bc_checksum(h, len - SIEVE_BC_HEADER), 4);
    return 0;
}

int sieve_bc_source(const void *file, size_t len, uint64_t *textlen,
                    uint64_t *texthash, uint64_t *ino, int64_t *mtime_ns)
{
    const unsigned char *h = file;

    if (!h || !bc_header_ok(h, len))
        return -1;
    *textlen = get_le(h + 16, 8);
    *texthash = get_le(h + 24, 8);
    *ino = get_le(h + 64, 8);
    *mtime_ns = (int64_t)get_le(h + 72, 8);
    return 0;
}

/* ---- encoding ----------------------------------------------------------- */

struct enc {
    struct buf *out;
    int rc;
};

static void enc_num(struct enc *e, uint64_t v)
{
    unsigned char b[10];
    int n = 0;

    do {
        b[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v)
            b[n] |= 0x80;
        n++;
    } while (v);
    if (buf_append(e->out, (const char *)b, (size_t)n) < 0)
        e->rc = SIEVE_ENOMEM;
}

static void enc_bytes(struct enc *e, const char *s, size_t len)
{
    enc_num(e, len);
    if (len && buf_append(e->out, s, len) < 0)
        e->rc = SIEVE_ENOMEM;
}

/* The stored arguments are the positional ones (the tags were resolved
 * into the node's fields by the checker), each as a string list: a number
 * (size's limit, in the node's number) as an empty one, which a
 * positional reference may name.  The index of argument i among them: */
static uint64_t enc_argindex(const struct sv_node *n, size_t i)
{
    uint64_t k = 0;
    size_t j;

    for (j = 0; j < i; j++)
        if (n->args[j].kind != SV_ARG_TAG)
            k++;
    return k;
}

/* 0 or 1 + the stored index of the argument whose string list is sl */
static uint64_t enc_listref(const struct sv_node *n,
                            const struct sv_strlist *sl)
{
    size_t i;

    if (!sl)
        return 0;
    for (i = 0; i < n->nargs; i++)
        if (n->args[i].kind != SV_ARG_TAG && &n->args[i].sl == sl)
            return enc_argindex(n, i) + 1;
    return 0;
}

static uint64_t enc_strref(const struct sv_node *n, const struct sv_str *s)
{
    size_t i;

    if (!s)
        return 0;
    for (i = 0; i < n->nargs; i++)
        if (n->args[i].kind == SV_ARG_STRLIST && n->args[i].sl.n &&
            &n->args[i].sl.v[0] == s)
            return enc_argindex(n, i) + 1;
    return 0;
}

static void enc_node(struct enc *e, const struct sv_node *n)
{
    uint64_t f = 0;
    size_t i, k;

    f |= n->test_list ? BCF_TEST_LIST : 0;
    f |= n->has_block ? BCF_HAS_BLOCK : 0;
    f |= n->unchecked ? BCF_UNCHECKED : 0;
    f |= n->has_match ? BCF_HAS_MATCH : 0;
    f |= n->has_comparator ? BCF_HAS_CMP : 0;
    f |= n->has_addrpart ? BCF_HAS_ADDR : 0;
    f |= n->last ? BCF_LAST : 0;
    f |= n->originalzone ? BCF_ORIGZONE : 0;
    f |= n->has_flags ? BCF_HAS_FLAGS : 0;
    f |= n->copy ? BCF_COPY : 0;
    f |= n->create ? BCF_CREATE : 0;
    f |= n->mime ? BCF_MIME : 0;
    f |= n->once ? BCF_ONCE : 0;
    f |= n->optional ? BCF_OPTIONAL : 0;
    f |= n->global ? BCF_GLOBAL : 0;
    f |= n->has_seconds ? BCF_HAS_SECONDS : 0;
    f |= n->over ? BCF_OVER : 0;
    {
        uint64_t v[BCV_COUNT], mask = 0;
        int k2;
        size_t ri;

        v[BCV_COMPARATOR] = (uint64_t)n->comparator;
        v[BCV_MATCH] = (uint64_t)n->match;
        v[BCV_RELOP] = (uint64_t)n->relop;
        v[BCV_ADDRPART] = (uint64_t)n->addrpart;
        v[BCV_BODY] = (uint64_t)n->body_transform;
        v[BCV_MODIFIERS] = n->modifiers;
        v[BCV_INDEX] = n->index;
        v[BCV_SECONDS] = n->seconds;
        v[BCV_NUMBER] = n->number;
        for (ri = 0; ri < BC_NREFS; ri++) {
            const struct bc_ref *r = &bc_refs[ri];
            const char *at = (const char *)n + r->off;
            const struct sv_strlist *sl;
            const struct sv_str *str;
            if (r->list) {
                memcpy(&sl, at, sizeof(sl));
                v[r->k] = enc_listref(n, sl);
            } else {
                memcpy(&str, at, sizeof(str));
                v[r->k] = enc_strref(n, str);
            }
        }
        for (k2 = 0; k2 < BCV_COUNT; k2++)
            if (v[k2])
                mask |= 1u << k2;
        enc_num(e, (uint64_t)n->id);
        enc_num(e, n->line);
        enc_num(e, f);
        /* a command or test the checker knows is named by its id */
        if (n->id == 0 || !sieve_node_name(n->id))
            enc_bytes(e, n->name ? n->name : "", n->name ? strlen(n->name)
                                                         : 0);
        enc_num(e, mask);
        for (k2 = 0; k2 < BCV_COUNT; k2++)
            if (v[k2])
                enc_num(e, v[k2]);
    }
    enc_num(e, enc_argindex(n, n->nargs));
    for (i = 0; i < n->nargs; i++) {
        const struct sv_arg *a = &n->args[i];
        if (a->kind == SV_ARG_TAG)
            continue;
        enc_num(e, a->sl.n);   /* 0 for a number */
        for (k = 0; k < a->sl.n; k++) {
            enc_bytes(e, a->sl.v[k].s, a->sl.v[k].len);
            enc_num(e, (a->sl.v[k].has_var ? BCS_HAS_VAR : 0) |
                       (a->sl.v[k].re ? BCS_REGEX : 0));
        }
    }
    enc_num(e, n->npos);
    for (i = 0; i < n->npos; i++) {
        uint64_t r = enc_listref(n, n->pos[i]);
        if (r == 0)
            e->rc = SIEVE_EINVAL;
        enc_num(e, r - 1);
    }
    enc_num(e, n->ntests);
    for (i = 0; i < n->ntests; i++)
        enc_node(e, n->tests[i]);
    enc_num(e, n->nblock);
    for (i = 0; i < n->nblock; i++)
        enc_node(e, n->block[i]);
}

int sieve_bc_encode(const struct sieve_script *s, const char *text,
                    size_t len, const struct strarray *allowed,
                    struct buf *out)
{
    struct enc e;
    unsigned char h[SIEVE_BC_HEADER], *f;
    struct sieve_script *t = NULL;
    const struct sv_chunk *c;
    uint64_t used = 0;
    size_t start, i;

    if (!s || !out || (!text && len))
        return SIEVE_EINVAL;
    if (!text)
        text = "";
    start = out->len;
    memset(h, 0, sizeof(h));
    if (buf_append(out, (const char *)h, sizeof(h)) < 0)
        return SIEVE_ENOMEM;
    e.out = out;
    e.rc = SIEVE_OK;
    enc_num(&e, s->requires.count);
    for (i = 0; i < s->requires.count; i++)
        enc_bytes(&e, s->requires.data[i], strlen(s->requires.data[i]));
    enc_num(&e, s->uses_variables ? 1 : 0);
    enc_num(&e, s->ncmds);
    for (i = 0; i < s->ncmds; i++)
        enc_node(&e, s->cmds[i]);
    if (e.rc == SIEVE_OK && out->len - start - SIEVE_BC_HEADER > UINT32_MAX)
        e.rc = SIEVE_ELIMIT;
    if (e.rc != SIEVE_OK) {
        out->len = start;
        return e.rc;
    }
    memcpy(h, sieve_bc_magic, 8);
    put_le(h + 8, SIEVE_BC_VERSION, 4);
    put_le(h + 12, SIEVE_BC_HEADER, 4);
    put_le(h + 16, len, 8);
    put_le(h + 24, sieve_bc_hash(text, len), 8);
    put_le(h + 36, sieve_bc_extmask(allowed), 4);
    put_le(h + 40, s->limits.max_nesting, 4);
    put_le(h + 48, s->limits.max_string_len, 8);
    put_le(h + 56, out->len - start - SIEVE_BC_HEADER, 4);
    f = (unsigned char *)out->s + start;
    memcpy(f, h, sizeof(h));
    put_le(f + 60, sieve_bc_checksum(f, out->len - start - SIEVE_BC_HEADER),
           4);
    /* the size hint: what loading this form takes, measured by loading
     * it once (a form that does not load keeps hint 0) */
    if (sieve_bc_decode_known(f, out->len - start, len, get_le(h + 24, 8),
                              get_le(h + 36, 4), &s->limits, &t,
                              NULL) == SIEVE_OK) {
        for (c = t->chunks; c; c = c->next)
            used += c->used;
        sieve_script_free(&t);
        if (used <= UINT32_MAX) {
            put_le(f + 44, used, 4);
            put_le(f + 60, sieve_bc_checksum(f, out->len - start -
                                                    SIEVE_BC_HEADER), 4);
        }
    }
    return SIEVE_OK;
}

/* ---- decoding ----------------------------------------------------------- */

struct dec {
    const unsigned char *p, *end;
    struct sieve_script *s;       /* its chunks hold the tree */
    size_t chunk_size;            /* of the next chunk */
    const char *why;
    int rc;
    unsigned long regex_cost;     /* of the keys compiled so far */
};

static int dec_fail(struct dec *d, const char *why)
{
    if (d->rc == SIEVE_OK) {
        d->rc = SIEVE_EINVAL;
        d->why = why;
    }
    return -1;
}

static int dec_nomem(struct dec *d)
{
    if (d->rc == SIEVE_OK) {
        d->rc = SIEVE_ENOMEM;
        d->why = "out of memory";
    }
    return -1;
}

#define DEC_ALIGN 16
#define DEC_CHUNK_HEAD \
    ((sizeof(struct sv_chunk) + DEC_ALIGN - 1) & ~(size_t)(DEC_ALIGN - 1))

/* the block kept from the last tree freed (sv_chunk_release) */
static __thread struct sv_chunk *bc_spare;

void sv_chunk_release(struct sv_chunk *c)
{
    if (!c)
        return;
    if (c->cap > SV_CHUNK_KEEP || (bc_spare && bc_spare->cap >= c->cap)) {
        free(c);
        return;
    }
    free(bc_spare);
    bc_spare = c;
}

/* a new chunk of at least n bytes at the head of the list, zeroed (one
 * wide clear of the block the size hint makes just large enough costs
 * less than a short clear per node and array): the kept block when it is
 * large enough, else a new one; NULL when out of memory */
static struct sv_chunk *dec_chunk_new(struct dec *d, size_t n)
{
    size_t size = d->chunk_size > n ? d->chunk_size : n;
    struct sv_chunk *c = bc_spare;

    if (c && c->cap >= size) {
        bc_spare = NULL;
        memset((char *)c + DEC_CHUNK_HEAD, 0, size);
    } else {
        c = calloc(1, DEC_CHUNK_HEAD + size);
        if (!c) {
            dec_nomem(d);
            return NULL;
        }
        c->cap = size;
    }
    c->size = size;
    c->used = 0;
    c->next = d->s->chunks;
    d->s->chunks = c;
    if (d->chunk_size < (1u << 20))
        d->chunk_size *= 2;
    return c;
}

/* n zeroed bytes from the script's chunks, NULL when out of memory */
static inline void *dec_alloc(struct dec *d, size_t n)
{
    struct sv_chunk *c = d->s->chunks;
    void *p;

    n = (n + DEC_ALIGN - 1) & ~(size_t)(DEC_ALIGN - 1);
    if (__builtin_expect(!c || c->size - c->used < n, 0) &&
        !(c = dec_chunk_new(d, n)))
        return NULL;
    p = (char *)c + DEC_CHUNK_HEAD + c->used;
    c->used += n;
    return p;
}

static int dec_num_slow(struct dec *d, uint64_t *v)
{
    uint64_t r = 0;
    int shift = 0;

    for (;;) {
        unsigned char b;
        if (d->p >= d->end)
            return dec_fail(d, "corrupt: truncated number");
        b = *d->p++;
        if (shift == 63 && (b & 0x7e))
            return dec_fail(d, "corrupt: number too large");
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
        if (shift > 63)
            return dec_fail(d, "corrupt: number too long");
    }
    *v = r;
    return 0;
}

static inline int dec_num(struct dec *d, uint64_t *v)
{
    if (d->p < d->end && !(*d->p & 0x80)) {
        *v = *d->p++;
        return 0;
    }
    return dec_num_slow(d, v);
}

/* a number at most max */
static inline int dec_small(struct dec *d, uint64_t max, uint64_t *v)
{
    if (dec_num(d, v) < 0)
        return -1;
    if (*v > max)
        return dec_fail(d, "corrupt: value out of range");
    return 0;
}

/* a count of items of at least one byte each: no more than the bytes
 * left, so that no allocation is larger than the file */
static inline int dec_count(struct dec *d, size_t *n)
{
    uint64_t v;

    if (dec_num(d, &v) < 0)
        return -1;
    if (v > (uint64_t)(d->end - d->p))
        return dec_fail(d, "corrupt: count beyond the end");
    *n = (size_t)v;
    return 0;
}

/* a string, a NUL-terminated copy into *s_r */
static int dec_bytes(struct dec *d, char **s_r, size_t *len_r)
{
    size_t len;
    char *s;

    if (dec_count(d, &len) < 0)
        return -1;
    s = dec_alloc(d, len + 1);
    if (!s)
        return -1;
    memcpy(s, d->p, len);
    s[len] = '\0';
    d->p += len;
    *s_r = s;
    if (len_r)
        *len_r = len;
    return 0;
}

static int dec_node(struct dec *d, struct sv_node **n_r, int depth,
                    int in_test, int checked);

static int dec_nodes(struct dec *d, struct sv_node ***v_r, size_t *n_r,
                     int depth, int in_test, int checked)
{
    size_t n, i;
    struct sv_node **v;

    *v_r = NULL;
    *n_r = 0;
    if (dec_count(d, &n) < 0)
        return -1;
    if (n == 0)
        return 0;
    v = dec_alloc(d, n * sizeof(*v));
    if (!v)
        return -1;
    for (i = 0; i < n; i++)
        if (dec_node(d, &v[i], depth + 1, in_test, checked) < 0)
            return -1;
    *v_r = v;
    *n_r = n;
    return 0;
}

static int dec_regex(struct dec *d, struct sv_str *s, int casemap)
{
    struct sv_regex *r;
    int flags = REG_EXTENDED | (casemap ? REG_ICASE : 0);
    unsigned long cost;

    if (s->has_var || strlen(s->s) != s->len)
        return dec_fail(d, "corrupt: bad regex key");
    /* refused or over the limit: a limit lowered since the compile (the
     * text is compiled again and says why) */
    if (sieve_regex_refusal(s->s, s->len, d->s->limits.max_regex_cost,
                            &cost) ||
        (d->regex_cost += cost) > d->s->limits.max_regex_cost)
        return dec_fail(d, "stale: a regex key over max_regex_cost");
    r = dec_alloc(d, sizeof(*r));
    if (!r)
        return -1;
    if (regcomp(&r->re, s->s, flags) != 0)
        return dec_fail(d, "corrupt: regex does not compile");
    r->next = d->s->regexes;
    d->s->regexes = r;
    s->re = &r->re;
    return 0;
}

static int dec_args(struct dec *d, struct sv_node *n, int casemap)
{
    size_t i, k;
    uint64_t v;

    if (dec_count(d, &n->nargs) < 0)
        return -1;
    if (n->nargs == 0)
        return 0;
    n->args = dec_alloc(d, n->nargs * sizeof(*n->args));
    if (!n->args)
        return -1;
    for (i = 0; i < n->nargs; i++) {
        struct sv_arg *a = &n->args[i];
        a->kind = SV_ARG_STRLIST;
        if (dec_count(d, &k) < 0)
            return -1;
        if (k == 0)
            continue;
        a->sl.v = dec_alloc(d, k * sizeof(*a->sl.v));
        if (!a->sl.v)
            return -1;
        for (a->sl.n = 0; a->sl.n < k; a->sl.n++) {
            struct sv_str *s = &a->sl.v[a->sl.n];
            if (dec_bytes(d, &s->s, &s->len) < 0 ||
                dec_small(d, BCS_HAS_VAR | BCS_REGEX, &v) < 0)
                return -1;
            s->has_var = (v & BCS_HAS_VAR) != 0;
            if ((v & BCS_REGEX) && dec_regex(d, s, casemap) < 0)
                return -1;
        }
    }
    return 0;
}

/* a reference (1 + index) to an argument: its list, or its first string */
static int dec_ref(struct dec *d, struct sv_node *n, uint64_t v,
                   const struct sv_strlist **sl_r, const struct sv_str **s_r)
{
    const struct sv_arg *a;

    if (v == 0 || v > n->nargs)
        return dec_fail(d, "corrupt: bad argument reference");
    a = &n->args[v - 1];
    if (a->kind != SV_ARG_STRLIST)
        return dec_fail(d, "corrupt: bad argument reference");
    if (s_r) {
        if (a->sl.n < 1)
            return dec_fail(d, "corrupt: bad string reference");
        *s_r = &a->sl.v[0];
    } else {
        *sl_r = &a->sl;
    }
    return 0;
}

static int dec_node(struct dec *d, struct sv_node **n_r, int depth,
                    int in_test, int checked)
{
    static const uint64_t max[BCV_COUNT] = {
        [BCV_COMPARATOR] = SV_CMP_NUMERIC, [BCV_MATCH] = SV_MATCH_COUNT,
        [BCV_RELOP] = SV_REL_NE, [BCV_ADDRPART] = SV_ADDR_DETAIL,
        [BCV_BODY] = SIEVE_BODY_TEXT, [BCV_MODIFIERS] = UINT32_MAX,
        [BCV_INDEX] = UINT64_MAX, [BCV_SECONDS] = UINT64_MAX,
        [BCV_NUMBER] = UINT64_MAX,
        [BCV_ZONE] = UINT64_MAX, [BCV_SPECIALUSE] = UINT64_MAX,
        [BCV_SUBJECT] = UINT64_MAX, [BCV_FROM] = UINT64_MAX,
        [BCV_HANDLE] = UINT64_MAX, [BCV_HEADER] = UINT64_MAX,
        [BCV_UNIQUEID] = UINT64_MAX, [BCV_FLAGS] = UINT64_MAX,
        [BCV_ADDRESSES] = UINT64_MAX, [BCV_CONTENT] = UINT64_MAX,
    };
    struct sv_node *n;
    uint64_t v, f, mask, have, val[BCV_COUNT];
    size_t i, npos;
    int k;

    *n_r = NULL;
    if (depth > SIEVE_BC_MAX_DEPTH)
        return dec_fail(d, "corrupt: nesting too deep");
    n = dec_alloc(d, sizeof(*n));
    if (!n)
        return -1;
    *n_r = n;
    if (dec_small(d, 1000, &v) < 0)
        return -1;
    n->id = (int)v;
    if (dec_small(d, UINT32_MAX, &v) < 0)
        return -1;
    n->line = (unsigned)v;
    if (dec_small(d, BCF_ALL, &f) < 0)
        return -1;
    /* the node is zeroed: only the flags that are set are written */
    for (; f; f &= f - 1)
        *((unsigned char *)n + bc_flag_off[__builtin_ctzll(f)]) = 1;
    n->name = n->id ? (char *)sieve_node_name(n->id) : NULL;
    if (!n->name && dec_bytes(d, &n->name, NULL) < 0)
        return -1;
    if (dec_small(d, (1u << BCV_COUNT) - 1, &mask) < 0)
        return -1;
    /* the fields present, in order: the set bits of the mask; the node
     * is zeroed, so only those are written (a reference is kept in val[]
     * until the arguments it names are decoded; val[] is read only at
     * the mask's bits, never cleared) */
    have = mask;
    for (; mask; mask &= mask - 1) {
        k = __builtin_ctzll(mask);
        if (dec_small(d, max[k], &v) < 0)
            return -1;
        if (v == 0)
            return dec_fail(d, "corrupt: a field given as 0");
        switch (k) {
        case BCV_COMPARATOR: n->comparator = (unsigned char)v; break;
        case BCV_MATCH: n->match = (unsigned char)v; break;
        case BCV_RELOP: n->relop = (unsigned char)v; break;
        case BCV_ADDRPART: n->addrpart = (unsigned char)v; break;
        case BCV_BODY: n->body_transform = (unsigned char)v; break;
        case BCV_MODIFIERS: n->modifiers = (unsigned)v; break;
        case BCV_INDEX: n->index = v; break;
        case BCV_SECONDS: n->seconds = v; break;
        case BCV_NUMBER: n->number = v; break;
        default: val[k] = v; break;
        }
    }
    if (dec_args(d, n, n->comparator == SV_CMP_CASEMAP) < 0)
        return -1;
    /* the references present: bc_refs[] is in BCV_* order from BCV_ZONE */
    for (mask = have >> BCV_ZONE; mask; mask &= mask - 1) {
        const struct bc_ref *r = &bc_refs[__builtin_ctzll(mask)];
        if (dec_ref(d, n, val[r->k], r->list ? bc_ref_list(n, r) : NULL,
                    r->list ? NULL : bc_ref_str(n, r)) < 0)
            return -1;
    }
    if (dec_small(d, 3, &v) < 0)
        return -1;
    npos = (size_t)v;
    for (i = 0; i < npos; i++) {
        if (dec_small(d, n->nargs ? n->nargs - 1 : 0, &v) < 0)
            return -1;
        if (n->nargs == 0)
            return dec_fail(d, "corrupt: bad positional argument");
        n->pos[n->npos++] = &n->args[v].sl;
    }
    /* an unchecked command (under an ihave that failed at check time) is
     * one the parser made and the checker never resolved: id 0, so that
     * the executor stops at it (a runtime error) and never looks at its
     * arguments or children, which are not checked here either */
    if (checked && n->unchecked && (n->id != 0 || in_test))
        return dec_fail(d, "corrupt: bad unchecked command");
    checked = checked && !n->unchecked;
    if (dec_nodes(d, &n->tests, &n->ntests, depth, 1, checked) < 0 ||
        dec_nodes(d, &n->block, &n->nblock, depth, 0, checked) < 0)
        return -1;
    if (checked && sieve_check_shape(n, in_test) < 0)
        return dec_fail(d, "corrupt: node of the wrong shape");
    return 0;
}

int sieve_bc_decode(const void *data, size_t len, const char *text,
                    size_t textlen, const struct sieve_limits *limits,
                    const struct strarray *allowed,
                    struct sieve_script **script_r, const char **why_r)
{
    const char *dummy;

    if (!why_r)
        why_r = &dummy;
    *why_r = NULL;
    if (!text && textlen) {
        *why_r = "invalid arguments";
        return SIEVE_EINVAL;
    }
    return sieve_bc_decode_known(data, len, textlen,
                                 sieve_bc_hash(text ? text : "", textlen),
                                 sieve_bc_extmask(allowed), limits,
                                 script_r, why_r);
}

int sieve_bc_decode_known(const void *data, size_t len, size_t textlen,
                          uint64_t texthash, uint32_t extmask,
                          const struct sieve_limits *limits,
                          struct sieve_script **script_r,
                          const char **why_r)
{
    const unsigned char *h = data;
    struct sieve_script *s;
    struct dec d;
    size_t i, n;
    uint64_t v, hint;
    const char *dummy;

    if (!why_r)
        why_r = &dummy;
    *why_r = NULL;
    if (!script_r || (!data && len)) {
        *why_r = "invalid arguments";
        return SIEVE_EINVAL;
    }
    *script_r = NULL;
    if (len < SIEVE_BC_HEADER || memcmp(h, sieve_bc_magic, 8) != 0) {
        *why_r = "corrupt: not a compiled Sieve script";
        return SIEVE_EINVAL;
    }
    if (get_le(h + 8, 4) != SIEVE_BC_VERSION ||
        get_le(h + 12, 4) != SIEVE_BC_HEADER) {
        *why_r = "stale: another format version";
        return SIEVE_EINVAL;
    }
    if (get_le(h + 56, 4) != len - SIEVE_BC_HEADER) {
        *why_r = "corrupt: wrong length";
        return SIEVE_EINVAL;
    }
    /* the cheap staleness checks first: a stale file is not summed */
    if (get_le(h + 16, 8) != textlen || get_le(h + 24, 8) != texthash) {
        *why_r = "stale: source changed";
        return SIEVE_EINVAL;
    }
    if (get_le(h + 60, 4) !=
        sieve_bc_checksum(h, len - SIEVE_BC_HEADER)) {
        *why_r = "corrupt: checksum mismatch";
        return SIEVE_EINVAL;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        *why_r = "out of memory";
        return SIEVE_ENOMEM;
    }
    sieve_limits_merge(&s->limits, limits);
    if (get_le(h + 32, 4) != 0 ||
        get_le(h + 36, 4) != extmask ||
        get_le(h + 40, 4) != s->limits.max_nesting ||
        get_le(h + 48, 8) != s->limits.max_string_len) {
        free(s);
        *why_r = "stale: extensions or limits changed";
        return SIEVE_EINVAL;
    }
    if (textlen > s->limits.max_script_size) {
        free(s);
        *why_r = "stale: script over the size limit";
        return SIEVE_EINVAL;
    }
    d.p = h + SIEVE_BC_HEADER;
    d.end = h + len;
    d.s = s;
    /* one allocation for the whole tree: the size the encoder measured
     * (a hint: a wrong one costs only another chunk, and one beyond any
     * tree this payload could make is not taken), else an estimate (the
     * tree takes about 14 times the bytes of its flat form) */
    hint = get_le(h + 44, 4);
    d.chunk_size = hint && hint <= 64 * (uint64_t)len + 65536
                       ? (size_t)hint
                       : 16 * (len - SIEVE_BC_HEADER) + 1024;
    d.why = NULL;
    d.rc = SIEVE_OK;
    d.regex_cost = 0;
    if (dec_count(&d, &n) == 0) {
        for (i = 0; i < n; i++) {
            char *name;
            size_t nlen;
            if (dec_bytes(&d, &name, &nlen) < 0)
                break;
            if (sieve_ext_lookup(name) < 0) {
                dec_fail(&d, "corrupt: unknown extension");
                break;
            }
            if (strarray_append(&s->requires, name) < 0) {
                dec_nomem(&d);
                break;
            }
        }
    }
    if (d.rc == SIEVE_OK && dec_small(&d, 1, &v) == 0) {
        s->uses_variables = (int)v;
        if (dec_nodes(&d, &s->cmds, &s->ncmds, 0, 0, 1) == 0 &&
            d.p != d.end)
            dec_fail(&d, "corrupt: bytes after the script");
    }
    if (d.rc != SIEVE_OK) {
        sieve_script_free(&s);
        *why_r = d.why;
        return d.rc;
    }
    *script_r = s;
    return SIEVE_OK;
}
