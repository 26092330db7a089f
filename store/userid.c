/*
 * userid.c - user ids and virtual domains (see userid.h).
 *
 * Invariants:
 *   - a user id leaving userid_canon() has a valid local part, at most one
 *     '@', and after it a lower-case domain that passed
 *     mboxname_domain_check() and differs from the defaultdomain; so
 *     userid_inbox() of it is a valid mailbox name of exactly that domain
 *     and no other;
 *   - raw input is scanned with bounded lengths; nothing here does I/O.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/mboxname.h"
#include "store/store.h"
#include "store/userid.h"

/* Longest raw user id looked at: a local part, '@', a domain. */
#define USERID_RAW_MAX (MBOXNAME_PART_MAX + 1 + MBOXNAME_DOMAIN_MAX)

int userid_policy_init(const struct imapconf *conf, struct userid_policy *p,
                       const char **error_r)
{
    struct buf lower = BUF_INITIALIZER;
    const char *dd = imapconf_getstring(conf, "defaultdomain");
    const char *err = NULL;
    int r;

    if (error_r)
        *error_r = NULL;
    p->virtdomains = imapconf_getenum(conf, "virtdomains");
    p->defaultdomain = NULL;
    if (dd && dd[0] != '\0') {
        r = mboxname_domain_check(dd, strlen(dd), &lower, &err);
        if (r != STORE_OK) {
            buf_free(&lower);
            if (error_r)
                *error_r = err;
            return r;
        }
        p->defaultdomain = buf_release(&lower);
    } else {
        p->defaultdomain = strdup("");
    }
    if (!p->defaultdomain)
        return STORE_NOMEM;
    return STORE_OK;
}

void userid_policy_free(struct userid_policy *p)
{
    if (!p)
        return;
    free(p->defaultdomain);
    p->defaultdomain = NULL;
}

static int userid_is_default(const struct userid_policy *p, const char *d,
                             size_t len)
{
    return len > 0 && d && p->defaultdomain &&
           strlen(p->defaultdomain) == len &&
           memcmp(p->defaultdomain, d, len) == 0;
}

/* The local part rules of userid.h. */
static const char *userid_local_check(const char *s, size_t len)
{
    size_t i;

    if (len == 0)
        return "empty local part";
    if (len > MBOXNAME_PART_MAX)
        return "user id too long";
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c <= 0x20 || c == 0x7f)
            return "control byte or space in user id";
        if (c >= 0x80)
            return "8-bit byte in user id";
        if (c == '!')
            return "'!' in user id";
        if (c == '/')
            return "'/' in user id";
        if (c == '^')
            return "'^' in user id";
        if (c == '*' || c == '%')
            return "wildcard in user id";
    }
    return NULL;
}

int userid_canon(const struct userid_policy *p, const char *raw,
                 const char *serverdomain, struct buf *out,
                 const char **error_r)
{
    struct buf domain = BUF_INITIALIZER;
    const char *err = NULL, *at;
    size_t len, llen;
    int r = STORE_BADNAME;

    if (error_r)
        *error_r = NULL;
    buf_reset(out);
    if (!raw || raw[0] == '\0') {
        err = "empty user id";
        goto done;
    }
    len = strnlen(raw, USERID_RAW_MAX + 1);
    if (len > USERID_RAW_MAX) {
        err = "user id too long";
        goto done;
    }
    at = memchr(raw, '@', len);
    llen = at ? (size_t)(at - raw) : len;
    if (at && memchr(at + 1, '@', len - llen - 1)) {
        err = "'@' in local part";
        goto done;
    }
    if ((err = userid_local_check(raw, llen)) != NULL)
        goto done;
    if (at) {
        r = mboxname_domain_check(at + 1, len - llen - 1, &domain, &err);
        if (r != STORE_OK)
            goto done;
    } else if (p->virtdomains == USERID_VIRTDOMAINS_ON && serverdomain) {
        /* a server domain that is no valid domain (a one-label host
         * name, say) counts as unknown: the default namespace */
        if (mboxname_domain_check(serverdomain,
                                  strnlen(serverdomain,
                                          MBOXNAME_DOMAIN_MAX + 1),
                                  &domain, NULL) == STORE_NOMEM) {
            r = STORE_NOMEM;
            goto done;
        }
    }
    if (p->virtdomains == USERID_VIRTDOMAINS_OFF ||
        userid_is_default(p, domain.s, domain.len))
        buf_reset(&domain);
    if (buf_append(out, raw, llen) < 0 ||
        (domain.len > 0 &&
         (buf_putc(out, '@') < 0 ||
          buf_append(out, domain.s, domain.len) < 0))) {
        r = errno == ENOMEM ? STORE_NOMEM : STORE_BADNAME;
        err = "user id too long";
        goto done;
    }
    r = STORE_OK;

done:
    if (r != STORE_OK) {
        buf_reset(out);
        if (error_r)
            *error_r = err;
    }
    buf_free(&domain);
    return r;
}

const char *userid_domain(const char *userid)
{
    const char *at;

    if (!userid)
        return NULL;
    at = strchr(userid, '@');
    return at ? at + 1 : NULL;
}

int userid_inbox(const char *userid, struct buf *out)
{
    struct buf tmp = BUF_INITIALIZER;
    const char *at;
    size_t i, llen, len;
    int r;

    buf_reset(out);
    if (!userid || userid[0] == '\0')
        return STORE_BADNAME;
    len = strnlen(userid, USERID_RAW_MAX + 1);
    if (len > USERID_RAW_MAX)
        return STORE_BADNAME;
    at = memchr(userid, '@', len);
    llen = at ? (size_t)(at - userid) : len;
    if (userid_local_check(userid, llen) != NULL)
        return STORE_BADNAME;
    if (buf_append(&tmp, userid, len) < 0) {
        buf_free(&tmp);
        return errno == ENOMEM ? STORE_NOMEM : STORE_BADNAME;
    }
    /* '.' of a user id is '^' in mailbox names */
    for (i = 0; i < llen; i++)
        if (tmp.s[i] == '.')
            tmp.s[i] = '^';
    r = mboxname_user_inbox(buf_cstring(&tmp), out);
    buf_free(&tmp);
    return r;
}

int userid_canon_login(const struct userid_policy *p, const char *in,
                       size_t len, const char *(*serverdomain)(void *rock),
                       void *rock, struct buf *out, const char **canon_error,
                       const char **error_r)
{
    struct buf raw = BUF_INITIALIZER;
    const char *sd = NULL, *err = NULL;
    int r;

    *error_r = NULL;
    if (buf_setmap(&raw, in, len) < 0) {
        *error_r = "out of memory";
        return -1;
    }
    if (memchr(in, '\0', len)) {
        err = "NUL in user id";
        for (size_t i = 0; i < raw.len; i++)
            if (raw.s[i] == '\0')
                raw.s[i] = '?';
    } else {
        if (p->virtdomains == USERID_VIRTDOMAINS_ON && serverdomain &&
            !memchr(in, '@', len))
            sd = serverdomain(rock);
        r = userid_canon(p, buf_cstring(&raw), sd, out, &err);
        if (r == STORE_NOMEM) {
            buf_free(&raw);
            *error_r = "out of memory";
            return -1;
        }
        if (r == STORE_OK) {
            buf_free(&raw);
            return 0;
        }
    }
    *canon_error = err ? err : "invalid user id";
    r = buf_setmap(out, raw.s, raw.len);
    buf_free(&raw);
    if (r < 0) {
        *error_r = "out of memory";
        return -1;
    }
    return 0;
}
