/*
 * acl.c - Cyrus access control lists (RFC 4314 rights letters).
 *
 * An ACL string is a sequence of entries "IDENTIFIER<TAB>RIGHTS<TAB>".
 * Invariants of a well-formed string (acl_check): every identifier is
 * non-empty, holds no control byte (0x00..0x1f, 0x7f) and is not "-"
 * alone; every rights field holds only known letters (possibly none);
 * nothing follows the last TAB.  acl_set() only ever writes well-formed
 * strings, with rights in canonical order.
 * Pure functions, no I/O, no global state.
 */
#include "config.h"

#include <string.h>

#include "store/acl.h"

static const char acl_letters[] = "lrswipkxtea";

/* One letter -> its bits; 0 for an unknown letter. */
static int acl_letter_mask(char c)
{
    const char *p;

    switch (c) {
    case 'c':
        return ACL_CREATE | ACL_DELETEMBOX;
    case 'd':
        return ACL_DELETEMSG | ACL_EXPUNGE;
    case '\0':
        return 0;
    default:
        break;
    }
    p = strchr(acl_letters, c);
    if (!p)
        return 0;
    return 1 << (p - acl_letters);
}

/* Rights letters of (s, len) -> mask; -1 on an unknown letter. */
static int acl_parse_span(const char *s, size_t len, int *mask_r)
{
    int mask = 0;
    size_t i;

    for (i = 0; i < len; i++) {
        int m = acl_letter_mask(s[i]);

        if (!m)
            return -1;
        mask |= m;
    }
    *mask_r = mask;
    return 0;
}

int acl_parse_rights(const char *letters, int *mask_r)
{
    int mask = 0;

    if (!letters)
        return -1;
    if (acl_parse_span(letters, strlen(letters), &mask) < 0)
        return -1;
    if (mask_r)
        *mask_r = mask;
    return 0;
}

char *acl_rights_string(int mask, char out[12])
{
    size_t i, n = 0;

    for (i = 0; i < sizeof(acl_letters) - 1; i++)
        if (mask & (1 << i))
            out[n++] = acl_letters[i];
    out[n] = '\0';
    return out;
}

/* A valid identifier span: non-empty, no control byte, not "-" alone. */
static int acl_valid_id(const char *s, size_t len)
{
    size_t i;

    if (len == 0 || (len == 1 && s[0] == '-'))
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c < 0x20 || c == 0x7f)
            return 0;
    }
    return 1;
}

/* The entry parser: calls fn for each entry in order; stops at the first
 * malformed one (-1) or when fn returns non-zero (that value). */
typedef int acl_entry_fn(void *rock, const char *id, size_t idlen,
                         const char *rights, size_t rightslen, int mask);

static int acl_walk(const char *acl, acl_entry_fn *fn, void *rock)
{
    const char *p = acl;

    if (!acl)
        return 0;
    while (*p) {
        const char *id = p, *tab1, *rights, *tab2;
        int mask, r;

        tab1 = strchr(id, '\t');
        if (!tab1 || !acl_valid_id(id, (size_t)(tab1 - id)))
            return -1;
        rights = tab1 + 1;
        tab2 = strchr(rights, '\t');
        if (!tab2)
            return -1;
        if (acl_parse_span(rights, (size_t)(tab2 - rights), &mask) < 0)
            return -1;
        r = fn(rock, id, (size_t)(tab1 - id), rights,
               (size_t)(tab2 - rights), mask);
        if (r)
            return r;
        p = tab2 + 1;
    }
    return 0;
}

static int acl_nop(void *rock, const char *id, size_t idlen,
                   const char *rights, size_t rightslen, int mask)
{
    (void)rock; (void)id; (void)idlen; (void)rights; (void)rightslen;
    (void)mask;
    return 0;
}

int acl_check(const char *acl)
{
    return acl_walk(acl, acl_nop, NULL) == 0 ? 0 : -1;
}

struct acl_each_rock {
    acl_each_fn *fn;
    void *rock;
};

static int acl_each_entry(void *rock, const char *id, size_t idlen,
                          const char *rights, size_t rightslen, int mask)
{
    struct acl_each_rock *er = rock;

    (void)rights; (void)rightslen;
    return er->fn(er->rock, id, idlen, mask);
}

int acl_each(const char *acl, acl_each_fn *fn, void *rock)
{
    struct acl_each_rock er;

    er.fn = fn;
    er.rock = rock;
    return acl_walk(acl, acl_each_entry, &er);
}

struct acl_entry_rock {
    const char *id;
    size_t idlen;
    int mask;
};

static int acl_entry_match(void *rock, const char *id, size_t idlen,
                           int mask)
{
    struct acl_entry_rock *er = rock;

    if (idlen == er->idlen && memcmp(id, er->id, idlen) == 0)
        er->mask |= mask;
    return 0;
}

int acl_entry_rights(const char *acl, const char *identifier)
{
    struct acl_entry_rock er;

    if (!identifier)
        return 0;
    er.id = identifier;
    er.idlen = strlen(identifier);
    er.mask = 0;
    if (acl_each(acl, acl_entry_match, &er) != 0)
        return -1;
    return er.mask;
}

struct acl_rights_rock {
    const char *userid;
    size_t userlen;
    int pos;
    int neg;
};

static int acl_id_is(const char *id, size_t idlen, const char *s,
                     size_t slen)
{
    return idlen == slen && memcmp(id, s, slen) == 0;
}

static int acl_rights_entry(void *rock, const char *id, size_t idlen,
                            const char *rights, size_t rightslen, int mask)
{
    struct acl_rights_rock *rr = rock;
    int *acc = &rr->pos;

    (void)rights; (void)rightslen;
    if (id[0] == '-') {
        acc = &rr->neg;
        id++;
        idlen--;
    }
    if (acl_id_is(id, idlen, "anyone", 6) ||
        (rr->userid && acl_id_is(id, idlen, rr->userid, rr->userlen)))
        *acc |= mask;
    return 0;
}

/* Is userid a word of the space/tab/comma-separated list? */
static int acl_is_admin(const char *admins, const char *userid)
{
    size_t ulen;
    const char *p;

    if (!admins || !userid || !userid[0])
        return 0;
    ulen = strlen(userid);
    p = admins;
    while (*p) {
        size_t n;

        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        n = strcspn(p, " \t,");
        if (n == ulen && memcmp(p, userid, n) == 0)
            return 1;
        p += n;
    }
    return 0;
}

int acl_rights(const char *acl, const char *userid, const char *admins)
{
    struct acl_rights_rock rr;
    int rights = 0;

    rr.userid = userid;
    rr.userlen = userid ? strlen(userid) : 0;
    rr.pos = 0;
    rr.neg = 0;
    if (acl_walk(acl, acl_rights_entry, &rr) == 0)
        rights = rr.pos & ~rr.neg;
    if (acl_is_admin(admins, userid))
        rights |= ACL_LOOKUP | ACL_ADMIN | ACL_CREATE | ACL_DELETEMBOX;
    return rights & ACL_ALL;
}

struct acl_set_rock {
    const char *id;
    size_t idlen;
    int mask;
    int done;
    struct buf *out;
    int nomem;
};

static int acl_put_entry(struct acl_set_rock *sr, const char *id,
                         size_t idlen, int mask)
{
    char letters[12];

    acl_rights_string(mask, letters);
    if (buf_append(sr->out, id, idlen) < 0 || buf_putc(sr->out, '\t') < 0 ||
        buf_appendcstr(sr->out, letters) < 0 || buf_putc(sr->out, '\t') < 0) {
        sr->nomem = 1;
        return -1;
    }
    return 0;
}

static int acl_set_entry(void *rock, const char *id, size_t idlen,
                         const char *rights, size_t rightslen, int mask)
{
    struct acl_set_rock *sr = rock;

    (void)rights; (void)rightslen;
    if (acl_id_is(id, idlen, sr->id, sr->idlen)) {
        /* the first entry of the identifier takes the new rights in its
         * place; later duplicates go */
        if (sr->done || sr->mask == 0)
            return 0;
        sr->done = 1;
        return acl_put_entry(sr, id, idlen, sr->mask) < 0 ? 2 : 0;
    }
    return acl_put_entry(sr, id, idlen, mask) < 0 ? 2 : 0;
}

int acl_set(const char *acl, const char *identifier, int mask,
            struct buf *out)
{
    struct acl_set_rock sr;

    if (!identifier || !out || (mask & ~ACL_ALL))
        return -1;
    sr.id = identifier;
    sr.idlen = strlen(identifier);
    if (!acl_valid_id(identifier, sr.idlen))
        return -1;
    if (acl_check(acl) < 0)
        return -1;
    sr.mask = mask;
    sr.done = 0;
    sr.out = out;
    sr.nomem = 0;
    buf_reset(out);
    if (acl_walk(acl, acl_set_entry, &sr) != 0 ||
        (!sr.done && mask != 0 &&
         acl_put_entry(&sr, identifier, sr.idlen, mask) < 0)) {
        buf_reset(out);
        return -1;
    }
    /* an empty result still has a valid (empty) C string */
    buf_cstring(out);
    return 0;
}
