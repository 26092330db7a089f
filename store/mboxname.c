/*
 * mboxname.c - mailbox names: validity, internal/external form, owners,
 * IMAP list patterns and spool directories.
 *
 * Invariants:
 *   - every name that leaves this module as "valid" satisfies all the rules
 *     of mboxname.h, so it can be used as a database key and, with each '.'
 *     turned into '/', as a relative path that never escapes its partition
 *     (no '/', no empty component, no "." or ".." component);
 *   - nothing here reads past MBOXNAME_MAX + 1 bytes of a name being
 *     checked, so an unterminated or huge input costs a bounded scan;
 *   - pattern matching is a dynamic programme over (pattern position, name
 *     position): O(|pattern| * |name|) time whatever the wildcards, never
 *     the exponential backtracking of a naive recursive matcher.
 * Pure functions: no I/O, no global state.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/mboxname.h"
#include "store/store.h"

/* The rules of mboxname.h, in one pass.  Byte rules are reported before
 * structural ones found later in the name. */
int mboxname_check(const char *name, const char **error_r)
{
    const char *err = NULL;
    size_t i, comp_start = 0, comp_carets = 0, dlen;

    if (error_r)
        *error_r = NULL;
    if (!name || name[0] == '\0') {
        err = "empty name";
        goto bad;
    }
    /* "DOMAIN!" prefix: the domain rules, already lower-case */
    for (dlen = 0; dlen <= MBOXNAME_MAX; dlen++)
        if (name[dlen] == '\0' || name[dlen] == '!')
            break;
    if (dlen <= MBOXNAME_MAX && name[dlen] == '!') {
        struct buf lower = BUF_INITIALIZER;
        int r = mboxname_domain_check(name, dlen, &lower, &err);

        if (r == STORE_OK && memcmp(lower.s, name, dlen) != 0) {
            err = "upper-case domain";
            r = STORE_BADNAME;
        }
        buf_free(&lower);
        if (r == STORE_NOMEM)
            return r;
        if (r != STORE_OK)
            goto bad;
        name += dlen + 1;
        if (name[0] == '\0') {
            err = "empty name";
            goto bad;
        }
    } else {
        dlen = 0;
    }
    for (i = 0;; i++) {
        unsigned char c = (unsigned char)name[i];

        if (i > MBOXNAME_MAX || (dlen && i + dlen + 1 > MBOXNAME_MAX)) {
            err = "name too long";
            goto bad;
        }
        if (c == '\0' || c == '.') {
            size_t clen = i - comp_start;

            if (clen == 0) {
                if (comp_start == 0)
                    err = "leading separator";
                else if (c == '\0')
                    err = "trailing separator";
                else
                    err = "empty component";
                /* "user." and "user..x": say what is missing */
                if (comp_start == sizeof(MBOXNAME_USER_PREFIX) - 1 &&
                    memcmp(name, MBOXNAME_USER_PREFIX, comp_start) == 0)
                    err = "empty user";
                goto bad;
            }
            if (clen > MBOXNAME_PART_MAX) {
                err = "component too long";
                goto bad;
            }
            if (comp_carets == clen) {
                err = "component of only '^'";
                goto bad;
            }
            if (c == '\0')
                break;
            comp_start = i + 1;
            comp_carets = 0;
            continue;
        }
        if (c < 0x20 || c == 0x7f) {
            err = "control byte";
            goto bad;
        }
        if (c >= 0x80) {
            err = "8-bit byte";
            goto bad;
        }
        if (c == '/') {
            err = "'/' in name";
            goto bad;
        }
        if (c == '*' || c == '%') {
            err = "wildcard in name";
            goto bad;
        }
        if (c == '!') {
            err = "'!' in name";
            goto bad;
        }
        if (c == '^')
            comp_carets++;
    }
    return STORE_OK;

bad:
    if (error_r)
        *error_r = err;
    return STORE_BADNAME;
}

static int mboxname_nomem(void)
{
    return errno == ENOMEM ? STORE_NOMEM : STORE_BADNAME;
}

/* The external form of a domain-less name (already checked), appended. */
static int mboxname_append_external(const char *name, int unixsep,
                                    struct buf *out)
{
    size_t i, len = strlen(name);

    if (buf_ensure(out, len) < 0)
        return mboxname_nomem();
    for (i = 0; i < len; i++) {
        char c = name[i];

        if (unixsep) {
            if (c == '.')
                c = '/';
            else if (c == '^')
                c = '.';
        }
        buf_putc(out, c);   /* room ensured above */
    }
    return STORE_OK;
}

int mboxname_to_external(const char *name, int unixsep, struct buf *out)
{
    buf_reset(out);
    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    return mboxname_to_external_for(name, unixsep, NULL, 1, out);
}

int mboxname_to_internal(const char *ext, int unixsep, struct buf *out,
                         const char **error_r)
{
    size_t i, len;

    if (error_r)
        *error_r = NULL;
    buf_reset(out);
    if (!ext || ext[0] == '\0') {
        if (error_r)
            *error_r = "empty name";
        return STORE_BADNAME;
    }
    len = strnlen(ext, MBOXNAME_MAX + 1);
    if (len > MBOXNAME_MAX) {
        if (error_r)
            *error_r = "name too long";
        return STORE_BADNAME;
    }
    if (buf_ensure(out, len) < 0)
        return mboxname_nomem();
    for (i = 0; i < len; i++) {
        char c = ext[i];

        if (unixsep) {
            if (c == '^') {
                /* '^' is the internal spelling of an external '.':
                 * accepting it would give two external names one
                 * internal name */
                buf_reset(out);
                if (error_r)
                    *error_r = "'^' in name";
                return STORE_BADNAME;
            }
            if (c == '/')
                c = '.';
            else if (c == '.')
                c = '^';
        } else if (c == '/') {
            buf_reset(out);
            if (error_r)
                *error_r = "'/' in name";
            return STORE_BADNAME;
        }
        if (c == '!') {
            /* the domain separator is never written by a client */
            buf_reset(out);
            if (error_r)
                *error_r = "'!' in name";
            return STORE_BADNAME;
        }
        buf_putc(out, c);
    }
    if (mboxname_check(buf_cstring(out), error_r) != STORE_OK) {
        buf_reset(out);
        return STORE_BADNAME;
    }
    return STORE_OK;
}

int mboxname_userid(const char *name, struct buf *userid)
{
    const size_t plen = sizeof(MBOXNAME_USER_PREFIX) - 1;
    const char *domain;
    size_t n, dlen = 0;

    if (userid)
        buf_reset(userid);
    if (!name)
        return 0;
    domain = mboxname_domain(name, &dlen, &name);
    if (strncmp(name, MBOXNAME_USER_PREFIX, plen) != 0)
        return 0;
    for (n = 0; n <= MBOXNAME_MAX; n++) {
        char c = name[plen + n];

        if (c == '\0' || c == '.')
            break;
    }
    if (n == 0 || n > MBOXNAME_MAX)
        return 0;
    if (userid && buf_setmap(userid, name + plen, n) < 0)
        return 0;
    if (userid && domain &&
        (buf_putc(userid, '@') < 0 || buf_append(userid, domain, dlen) < 0)) {
        buf_reset(userid);
        return 0;
    }
    return 1;
}

int mboxname_user_inbox(const char *userid, struct buf *out)
{
    size_t len, llen;
    const char *at;

    buf_reset(out);
    if (!userid || userid[0] == '\0')
        return STORE_BADNAME;
    len = strnlen(userid, MBOXNAME_MAX + 1);
    if (len > MBOXNAME_MAX)
        return STORE_BADNAME;
    at = memchr(userid, '@', len);
    llen = at ? (size_t)(at - userid) : len;
    if (llen == 0 || memchr(userid, '.', llen) || memchr(userid, '!', len))
        return STORE_BADNAME;
    if (at) {
        /* "alice@D" -> "D!user.alice" */
        if (buf_append(out, at + 1, len - llen - 1) < 0 ||
            buf_putc(out, '!') < 0) {
            int r = mboxname_nomem();

            buf_reset(out);
            return r;
        }
    }
    if (buf_appendcstr(out, MBOXNAME_USER_PREFIX) < 0 ||
        buf_append(out, userid, llen) < 0) {
        int r = mboxname_nomem();

        buf_reset(out);
        return r;
    }
    if (mboxname_check(buf_cstring(out), NULL) != STORE_OK) {
        buf_reset(out);
        return STORE_BADNAME;
    }
    return STORE_OK;
}

int mboxname_is_self_or_child(const char *parent, const char *name)
{
    size_t plen;

    if (!parent || !name)
        return 0;
    plen = strlen(parent);
    if (strncmp(parent, name, plen) != 0)
        return 0;
    return name[plen] == '\0' || name[plen] == '.';
}

/*
 * The matcher.  reach[j] says whether the pattern prefix handled so far
 * can match the first j bytes of the name.  Each pattern byte turns the
 * row into the next one in O(|name|):
 *   literal c: next[j+1] = reach[j] && name[j] == c
 *   '*':       next[j]   = reach[0] || ... || reach[j]
 *   '%':       next[j]   = reach[j] || (next[j-1] && name[j-1] != sep)
 * Runs of wildcards collapse first ("**" = "*", "%*" = "*%" = "*",
 * "%%" = "%"), and a pattern with more literal bytes than the name has
 * cannot match, so the work is at most about 2 * |name|^2 steps.
 */
#define MBOXNAME_MATCH_STACK 512

int mboxname_match(const char *pattern, const char *name, char sep)
{
    size_t plen, nlen, literals = 0, i, j;
    unsigned char stack_rows[2 * (MBOXNAME_MATCH_STACK + 1)];
    unsigned char *reach, *next, *heap = NULL;
    int any, result;

    if (!pattern || !name)
        return 0;
    plen = strlen(pattern);
    nlen = strlen(name);

    for (i = 0; i < plen; i++)
        if (pattern[i] != '*' && pattern[i] != '%')
            literals++;
    if (literals > nlen)
        return 0;
    if (literals == plen)   /* no wildcard */
        return plen == nlen && memcmp(pattern, name, plen) == 0;

    if (nlen <= MBOXNAME_MATCH_STACK) {
        reach = stack_rows;
    } else {
        heap = malloc(2 * (nlen + 1));
        if (!heap)
            return 0;
        reach = heap;
    }
    next = reach + nlen + 1;

    memset(reach, 0, nlen + 1);
    reach[0] = 1;
    for (i = 0; i < plen; i++) {
        char p = pattern[i];

        if (p == '*' || p == '%') {
            /* collapse the run of wildcards starting here */
            int star = 0;

            while (i < plen && (pattern[i] == '*' || pattern[i] == '%')) {
                if (pattern[i] == '*')
                    star = 1;
                i++;
            }
            i--;   /* the loop's i++ moves past the run */
            any = 0;
            if (star) {
                for (j = 0; j <= nlen; j++) {
                    any |= reach[j];
                    next[j] = (unsigned char)any;
                }
            } else {
                next[0] = reach[0];
                any = next[0];
                for (j = 1; j <= nlen; j++) {
                    next[j] = reach[j] ||
                              (next[j - 1] && name[j - 1] != sep);
                    any |= next[j];
                }
            }
        } else {
            any = 0;
            next[0] = 0;
            for (j = 0; j < nlen; j++) {
                next[j + 1] = reach[j] && name[j] == p;
                any |= next[j + 1];
            }
        }
        {
            unsigned char *t = reach;

            reach = next;
            next = t;
        }
        if (!any)
            break;
    }
    result = (i >= plen) && reach[nlen];
    free(heap);
    return result;
}

char mboxname_hash_letter(const char *name)
{
    const size_t plen = sizeof(MBOXNAME_USER_PREFIX) - 1;
    unsigned char c;
    size_t dlen;

    if (!name)
        return 'q';
    (void)mboxname_domain(name, &dlen, &name);
    if (strncmp(name, MBOXNAME_USER_PREFIX, plen) == 0 && name[plen] != '\0')
        c = (unsigned char)name[plen];
    else
        c = (unsigned char)name[0];
    if (c >= 'A' && c <= 'Z')
        c = (unsigned char)(c - 'A' + 'a');
    if (c < 'a' || c > 'z')
        return 'q';
    return (char)c;
}

char mboxname_domain_hash_letter(const char *domain)
{
    unsigned char c = domain ? (unsigned char)domain[0] : 0;

    if (c >= 'A' && c <= 'Z')
        c = (unsigned char)(c - 'A' + 'a');
    if (c < 'a' || c > 'z')
        return 'q';
    return (char)c;
}

int mboxname_spool_dir(const char *root, const char *name, int hashed,
                       struct buf *out)
{
    size_t rlen, nlen, dlen, i;
    const char *domain, *rest;

    buf_reset(out);
    if (!root || root[0] == '\0')
        return STORE_BADNAME;
    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    domain = mboxname_domain(name, &dlen, &rest);
    rlen = strlen(root);
    nlen = strlen(rest);
    /* "ROOT/" ["domain/" "H/" DOMAIN "/"] "H/" NAME */
    if (buf_ensure(out, rlen + 3 + nlen + (domain ? dlen + 10 : 0)) < 0)
        return mboxname_nomem();
    buf_append(out, root, rlen);
    if (root[rlen - 1] != '/')
        buf_putc(out, '/');
    if (domain) {
        buf_append(out, "domain/", 7);
        if (hashed) {
            buf_putc(out, mboxname_domain_hash_letter(domain));
            buf_putc(out, '/');
        }
        buf_append(out, domain, dlen);
        buf_putc(out, '/');
    }
    if (hashed) {
        buf_putc(out, mboxname_hash_letter(rest));
        buf_putc(out, '/');
    }
    for (i = 0; i < nlen; i++)
        buf_putc(out, rest[i] == '.' ? '/' : rest[i]);
    return STORE_OK;
}

/* ---- virtual domains -------------------------------------------------- */

int mboxname_domain_check(const char *d, size_t len, struct buf *lower_r,
                          const char **error_r)
{
    const char *err = NULL;
    size_t i, label_start = 0, labels = 0;

    if (error_r)
        *error_r = NULL;
    if (lower_r)
        buf_reset(lower_r);
    if (!d || len == 0) {
        err = "empty domain";
        goto bad;
    }
    if (len > MBOXNAME_DOMAIN_MAX) {
        err = "domain too long";
        goto bad;
    }
    if (d[0] == '[') {
        err = "address literal as domain";
        goto bad;
    }
    for (i = 0; i <= len; i++) {
        unsigned char c = i < len ? (unsigned char)d[i] : '.';

        if (c == '.') {
            size_t llen = i - label_start;

            if (llen == 0) {
                err = "empty domain label";
                goto bad;
            }
            if (llen > MBOXNAME_DOMAIN_LABEL_MAX) {
                err = "domain label too long";
                goto bad;
            }
            if (d[label_start] == '-' || d[i - 1] == '-') {
                err = "domain label begins or ends with '-'";
                goto bad;
            }
            labels++;
            label_start = i + 1;
            continue;
        }
        if (c >= 'A' && c <= 'Z')
            continue;
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')
            continue;
        err = "bad byte in domain";
        goto bad;
    }
    if (labels < 2) {
        err = "domain of one label";
        goto bad;
    }
    if (lower_r) {
        if (buf_ensure(lower_r, len) < 0)
            return mboxname_nomem();
        for (i = 0; i < len; i++) {
            char c = d[i];

            buf_putc(lower_r,
                     c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c);
        }
    }
    return STORE_OK;

bad:
    if (error_r)
        *error_r = err;
    return STORE_BADNAME;
}

const char *mboxname_domain(const char *name, size_t *len_r,
                            const char **rest_r)
{
    size_t i;

    if (len_r)
        *len_r = 0;
    if (rest_r)
        *rest_r = name;
    if (!name)
        return NULL;
    for (i = 0; i <= MBOXNAME_MAX; i++) {
        if (name[i] == '\0')
            return NULL;
        if (name[i] == '!')
            break;
    }
    if (i > MBOXNAME_MAX || i == 0)
        return NULL;
    if (len_r)
        *len_r = i;
    if (rest_r)
        *rest_r = name + i + 1;
    return name;
}

int mboxname_to_external_for(const char *name, int unixsep,
                             const char *userdomain, int global_admin,
                             struct buf *out)
{
    const char *domain, *rest;
    size_t dlen;
    int r;

    buf_reset(out);
    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    domain = mboxname_domain(name, &dlen, &rest);
    if (userdomain && userdomain[0] == '\0')
        userdomain = NULL;
    if (!domain && !userdomain)
        return mboxname_append_external(rest, unixsep, out);
    if (domain && userdomain && strlen(userdomain) == dlen &&
        memcmp(domain, userdomain, dlen) == 0)
        return mboxname_append_external(rest, unixsep, out);
    /* another domain (or the default one seen from a domain): only a
     * global admin sees it, as REST@DOMAIN */
    if (!global_admin || !domain)
        return STORE_BADNAME;
    r = mboxname_append_external(rest, unixsep, out);
    if (r == STORE_OK &&
        (buf_putc(out, '@') < 0 || buf_append(out, domain, dlen) < 0))
        r = mboxname_nomem();
    if (r != STORE_OK)
        buf_reset(out);
    return r;
}

int mboxname_to_internal_for(const char *ext, int unixsep,
                             const char *userdomain, int global_admin,
                             struct buf *out, const char **error_r)
{
    struct buf rest = BUF_INITIALIZER, domain = BUF_INITIALIZER;
    const char *at, *err = NULL;
    size_t len;
    int r;

    if (error_r)
        *error_r = NULL;
    buf_reset(out);
    if (!ext || ext[0] == '\0') {
        if (error_r)
            *error_r = "empty name";
        return STORE_BADNAME;
    }
    len = strnlen(ext, MBOXNAME_MAX + 1);
    if (len > MBOXNAME_MAX) {
        if (error_r)
            *error_r = "name too long";
        return STORE_BADNAME;
    }
    if (userdomain && userdomain[0] == '\0')
        userdomain = NULL;
    at = memchr(ext, '@', len);
    if (at) {
        if (!global_admin) {
            if (error_r)
                *error_r = "'@' in name";
            return STORE_BADNAME;
        }
        /* the last '@' starts the domain */
        while (memchr(at + 1, '@', len - (size_t)(at + 1 - ext)))
            at = memchr(at + 1, '@', len - (size_t)(at + 1 - ext));
        r = mboxname_domain_check(at + 1, len - (size_t)(at + 1 - ext),
                                  &domain, &err);
        if (r == STORE_OK && buf_setmap(&rest, ext, (size_t)(at - ext)) < 0)
            r = mboxname_nomem();
    } else {
        r = buf_setmap(&rest, ext, len) < 0 ? mboxname_nomem() : STORE_OK;
        if (r == STORE_OK && userdomain &&
            buf_setcstr(&domain, userdomain) < 0)
            r = mboxname_nomem();
    }
    if (r == STORE_OK && memchr(rest.s ? rest.s : "", '@', rest.len)) {
        err = "'@' in name";
        r = STORE_BADNAME;
    }
    if (r == STORE_OK)
        r = mboxname_to_internal(buf_cstring(&rest), unixsep, out, &err);
    if (r == STORE_OK && domain.len > 0) {
        struct buf full = BUF_INITIALIZER;

        if (buf_printf(&full, "%s!%s", buf_cstring(&domain),
                       buf_cstring(out)) < 0) {
            r = mboxname_nomem();
        } else if (mboxname_check(buf_cstring(&full), &err) != STORE_OK) {
            r = STORE_BADNAME;
        } else {
            buf_free(out);
            *out = full;
            full = (struct buf)BUF_INITIALIZER;
        }
        buf_free(&full);
    }
    if (r != STORE_OK) {
        buf_reset(out);
        if (error_r)
            *error_r = err;
    }
    buf_free(&rest);
    buf_free(&domain);
    return r;
}
