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
    size_t i, comp_start = 0, comp_carets = 0;

    if (error_r)
        *error_r = NULL;
    if (!name || name[0] == '\0') {
        err = "empty name";
        goto bad;
    }
    for (i = 0;; i++) {
        unsigned char c = (unsigned char)name[i];

        if (i > MBOXNAME_MAX) {
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

int mboxname_to_external(const char *name, int unixsep, struct buf *out)
{
    size_t i, len;

    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    len = strlen(name);   /* bounded: the check saw the NUL */
    buf_reset(out);
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
    size_t n;

    if (userid)
        buf_reset(userid);
    if (!name || strncmp(name, MBOXNAME_USER_PREFIX, plen) != 0)
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
    return 1;
}

int mboxname_user_inbox(const char *userid, struct buf *out)
{
    buf_reset(out);
    if (!userid || userid[0] == '\0' ||
        memchr(userid, '.', strnlen(userid, MBOXNAME_MAX + 1)))
        return STORE_BADNAME;
    if (buf_appendcstr(out, MBOXNAME_USER_PREFIX) < 0 ||
        buf_appendcstr(out, userid) < 0) {
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

    if (!name)
        return 'q';
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

int mboxname_spool_dir(const char *root, const char *name, int hashed,
                       struct buf *out)
{
    size_t rlen, nlen, i;

    buf_reset(out);
    if (!root || root[0] == '\0')
        return STORE_BADNAME;
    if (mboxname_check(name, NULL) != STORE_OK)
        return STORE_BADNAME;
    rlen = strlen(root);
    nlen = strlen(name);
    /* "ROOT/" "H/" NAME */
    if (buf_ensure(out, rlen + 3 + nlen) < 0)
        return mboxname_nomem();
    buf_append(out, root, rlen);
    if (root[rlen - 1] != '/')
        buf_putc(out, '/');
    if (hashed) {
        buf_putc(out, mboxname_hash_letter(name));
        buf_putc(out, '/');
    }
    for (i = 0; i < nlen; i++)
        buf_putc(out, name[i] == '.' ? '/' : name[i]);
    return STORE_OK;
}
