/*
 * rcpt.c - LMTP paths and recipient -> mailbox resolution (see rcpt.h).
 *
 * The parser walks a (pointer, length) cursor and never reads past the
 * end or relies on a NUL terminator: the bytes come from the network.
 * Everything it accepts is printable ASCII, so what it hands back can go
 * into headers and logs as it is.
 *
 * Resolution reads the mailbox list (its own handle, beside the one in
 * store/deliver.c: both are read-only uses of the same file, which every
 * backend allows in one process) and the process's shared quota handle.
 * A database error is never mistaken for "unknown user": it is
 * RCPT_TEMPFAIL, which the front end answers with 4xx.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/utf8.h"
#include "lmtpd/rcpt.h"
#include "store/acl.h"
#include "store/autocreate.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/store.h"
#include "store/userid.h"

void rcpt_path_init(struct rcpt_path *p)
{
    memset(p, 0, sizeof(*p));
}

void rcpt_path_free(struct rcpt_path *p)
{
    buf_free(&p->addr);
    buf_free(&p->local);
    buf_free(&p->domain);
}

static int rcpt_is_atext(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-/=?^_`{|}~", c) != NULL;
}

/* The length of a well-formed UTF-8 character above U+007F at s[i]
 * before end, or 0. */
static size_t rcpt_utf8_len(const char *s, size_t i, size_t end)
{
    uint32_t cp;
    size_t n;

    if (utf8_decode((const unsigned char *)s + i, end - i, &cp, &n) != 0 ||
        cp < 0x80)
        return 0;
    return n;
}

static int rcpt_is_ldh(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* A domain at s[*i] up to end: sub-domains of letters, digits, '-' and
 * '_' separated by single dots, or an address literal "[...]" of
 * printable bytes other than '[', '\\', ']'.  Advances *i; 0 or -1. */
static int rcpt_parse_domain(const char *s, size_t end, size_t *i,
                             int utf8)
{
    size_t j = *i;

    if (j < end && s[j] == '[') {
        size_t start = ++j;

        while (j < end && s[j] != ']') {
            unsigned char c = (unsigned char)s[j];
            if (c < 33 || c > 126 || c == '[' || c == '\\')
                return -1;
            j++;
        }
        if (j >= end || j == start)
            return -1;
        *i = j + 1;
        return 0;
    }
    for (;;) {
        size_t start = j;

        for (;;) {
            size_t n;

            if (j < end && rcpt_is_ldh((unsigned char)s[j]))
                j++;
            else if (utf8 && j < end && (n = rcpt_utf8_len(s, j, end)) > 0)
                j += n;                     /* a U-label (RFC 6531 3.3) */
            else
                break;
        }
        if (j == start)
            return -1;           /* empty label */
        if (j < end && s[j] == '.') {
            j++;
            continue;
        }
        break;
    }
    *i = j;
    return 0;
}

int rcpt_parse_path(const char *s, size_t len, int flags, struct rcpt_path *p,
                    size_t *used_r, const char **error_r)
{
    size_t i = 0, end, addr_start;
    const char *err = "syntax error in address";
    int utf8 = (flags & RCPT_UTF8) != 0;

    buf_reset(&p->addr);
    buf_reset(&p->local);
    buf_reset(&p->domain);
    while (i < len && s[i] == ' ')
        i++;
    if (i >= len || s[i] != '<') {
        err = "address must be enclosed in <>";
        goto fail;
    }
    i++;
    /* the closing bracket bounds everything below; a '>' inside a quoted
     * local part is allowed, so find the end by scanning with quotes */
    {
        size_t j = i;
        int inq = 0;

        while (j < len) {
            char c = s[j];
            if (inq) {
                if (c == '\\' && j + 1 < len)
                    j++;
                else if (c == '"')
                    inq = 0;
            } else if (c == '"') {
                inq = 1;
            } else if (c == '>') {
                break;
            }
            j++;
        }
        if (j >= len) {
            err = "missing >";
            goto fail;
        }
        end = j;
    }
    if (end - i > RCPT_PATH_MAX) {
        err = "address too long";
        goto fail;
    }
    if (end == i) {
        if (!(flags & RCPT_ALLOW_NULL)) {
            err = "null address not allowed here";
            goto fail;
        }
        goto done;
    }
    /* optional source route: @dom,@dom: (ignored, RFC 5321 4.1.2) */
    if (s[i] == '@') {
        for (;;) {
            if (i >= end || s[i] != '@')
                goto fail;
            i++;
            if (rcpt_parse_domain(s, end, &i, utf8) != 0)
                goto fail;
            if (i < end && s[i] == ',') {
                i++;
                continue;
            }
            if (i < end && s[i] == ':') {
                i++;
                break;
            }
            goto fail;
        }
    }
    addr_start = i;
    /* local part */
    if (i < end && s[i] == '"') {
        i++;
        for (;;) {
            unsigned char c;

            if (i >= end) {
                err = "unterminated quoted string";
                goto fail;
            }
            c = (unsigned char)s[i];
            if (c == '"')
                break;
            if (c == '\\') {
                if (i + 1 >= end)
                    goto fail;
                c = (unsigned char)s[++i];
                if (c < 32 || c > 126) {
                    err = "control or 8-bit byte in address";
                    goto fail;
                }
            } else if (c > 127 && utf8 && rcpt_utf8_len(s, i, end) > 0) {
                size_t n = rcpt_utf8_len(s, i, end);

                if (buf_append(&p->local, s + i, n) != 0)
                    goto nomem;
                i += n;
                continue;
            } else if (c < 32 || c > 126) {
                err = utf8 && c > 127 ? "invalid UTF-8 in address"
                                      : "control or 8-bit byte in address";
                goto fail;
            }
            if (buf_putc(&p->local, c) != 0)
                goto nomem;
            i++;
        }
        i++;   /* closing quote */
        if (p->local.len == 0) {
            err = "empty local part";
            goto fail;
        }
    } else {
        size_t start = i;

        for (;;) {
            size_t atom = i;

            for (;;) {
                size_t n;

                if (i < end && rcpt_is_atext((unsigned char)s[i]))
                    i++;
                else if (utf8 && i < end &&
                         (n = rcpt_utf8_len(s, i, end)) > 0)
                    i += n;                 /* RFC 6531 3.3 atext */
                else
                    break;
            }
            if (i == atom) {
                if (i < end && utf8 && (unsigned char)s[i] > 127)
                    err = "invalid UTF-8 in address";
                else if (i < end && ((unsigned char)s[i] < 32 ||
                                     (unsigned char)s[i] > 126))
                    err = "control or 8-bit byte in address";
                else if (i == start)
                    err = "empty local part";
                goto fail;
            }
            if (i < end && s[i] == '.') {
                i++;
                continue;
            }
            break;
        }
        if (buf_append(&p->local, s + start, i - start) != 0)
            goto nomem;
    }
    if (i < end) {
        size_t dstart;

        if (s[i] != '@')
            goto fail;
        dstart = ++i;
        if (rcpt_parse_domain(s, end, &i, utf8) != 0 || i != end) {
            err = "bad domain in address";
            goto fail;
        }
        if (buf_append(&p->domain, s + dstart, end - dstart) != 0)
            goto nomem;
    }
    if (buf_append(&p->addr, s + addr_start, end - addr_start) != 0)
        goto nomem;
done:
    if (used_r)
        *used_r = end + 1;
    buf_cstring(&p->addr);
    buf_cstring(&p->local);
    buf_cstring(&p->domain);
    return 0;
nomem:
    err = "out of memory";
fail:
    buf_reset(&p->addr);
    buf_reset(&p->local);
    buf_reset(&p->domain);
    if (error_r)
        *error_r = err;
    return -1;
}

/* The domain part of a recipient under the policy: into *domain_r the
 * lower-cased domain of the recipient's namespace, or "" for the default
 * (domain-less) one.  0, or -1 with *error_r. */
static int rcpt_domain(const struct userid_policy *policy, const char *domain,
                       size_t domainlen, struct buf *domain_r,
                       const char **error_r)
{
    buf_reset(domain_r);
    if (!policy || policy->virtdomains == USERID_VIRTDOMAINS_OFF ||
        domainlen == 0)
        return 0;   /* off: the MTA decided the domain is local */
    if (mboxname_domain_check(domain, domainlen, domain_r, error_r) !=
        STORE_OK) {
        buf_reset(domain_r);
        return -1;
    }
    if (policy->defaultdomain &&
        strcmp(buf_cstring(domain_r), policy->defaultdomain) == 0)
        buf_reset(domain_r);
    return 0;
}

int rcpt_mailbox_names(const struct imapconf *conf,
                       const struct userid_policy *policy, const char *local,
                       size_t locallen, const char *domain, size_t domainlen,
                       struct buf *inbox_r, struct buf *folder_r,
                       const char **error_r)
{
    int unixsep = imapconf_getswitch(conf, "unixhierarchysep");
    int downcase = imapconf_getswitch(conf, "lmtp_downcase_rcpt");
    const char *plus = memchr(local, '+', locallen);
    size_t userlen = plus ? (size_t)(plus - local) : locallen;
    const char *detail = plus ? plus + 1 : NULL;
    size_t detaillen = plus ? locallen - userlen - 1 : 0;
    struct buf tmp = BUF_INITIALIZER, dom = BUF_INITIALIZER;
    const char *err = NULL;
    int rc = -1;
    size_t i;

    buf_reset(inbox_r);
    if (folder_r)
        buf_reset(folder_r);
    if (rcpt_domain(policy, domain, domainlen, &dom, &err) != 0) {
        rc = RCPT_NAMES_BADDOMAIN;
        goto fail;
    }
    if (locallen == 0 || memchr(local, '\0', locallen)) {
        err = "empty local part";
        goto fail;
    }
    if (detaillen > MBOXNAME_MAX || userlen > MBOXNAME_PART_MAX) {
        err = "name too long";
        goto fail;
    }
    if (userlen == 0) {
        /* +shared.folder: the detail names a shared mailbox of the
         * recipient's domain */
        if (detaillen == 0) {
            err = "empty user";
            goto fail;
        }
        if (buf_append(&tmp, detail, detaillen) != 0 ||
            mboxname_to_internal_for(buf_cstring(&tmp), unixsep,
                                     buf_cstring(&dom), 0, inbox_r,
                                     &err) != STORE_OK)
            goto fail;
        {
            const char *rest;

            (void)mboxname_domain(buf_cstring(inbox_r), NULL, &rest);
            if (mboxname_is_self_or_child("user", rest)) {
                err = "shared address names a user mailbox";
                goto fail;
            }
        }
        buf_free(&tmp);
        buf_free(&dom);
        return 0;
    }
    for (i = 0; i < userlen; i++) {
        char c = local[i];

        if (downcase && c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c == '/' || c == '^') {
            err = "'/' or '^' in user";
            goto fail;
        }
        if (c == '!') {
            err = "'!' in user";
            goto fail;
        }
        if (c == '.') {
            if (!unixsep) {
                err = "'.' in user";
                goto fail;
            }
            c = '^';
        }
        if (buf_putc(&tmp, c) != 0) {
            err = "out of memory";
            goto fail;
        }
    }
    if (dom.len > 0 &&
        (buf_putc(&tmp, '@') != 0 || buf_append(&tmp, dom.s, dom.len) != 0)) {
        err = "out of memory";
        goto fail;
    }
    if (mboxname_user_inbox(buf_cstring(&tmp), inbox_r) != STORE_OK) {
        err = "not a valid user";
        goto fail;
    }
    if (folder_r && detaillen > 0) {
        struct buf d = BUF_INITIALIZER;

        /* a detail that names no valid folder simply means the INBOX */
        buf_reset(&tmp);
        if (buf_append(&tmp, detail, detaillen) == 0 &&
            mboxname_to_internal(buf_cstring(&tmp), unixsep, &d,
                                 NULL) == STORE_OK &&
            buf_printf(folder_r, "%s.%s", buf_cstring(inbox_r),
                       buf_cstring(&d)) == 0 &&
            mboxname_check(buf_cstring(folder_r), NULL) == STORE_OK) {
            /* folder_r holds it */
        } else {
            buf_reset(folder_r);
        }
        buf_free(&d);
    }
    buf_free(&tmp);
    buf_free(&dom);
    return 0;

fail:
    buf_free(&tmp);
    buf_free(&dom);
    buf_reset(inbox_r);
    if (folder_r)
        buf_reset(folder_r);
    if (error_r)
        *error_r = err ? err : "invalid mailbox name";
    return rc;
}

struct rcpt_ctx {
    const struct imapconf *conf;
    struct userid_policy policy;
    struct mboxlist *ml;
};

int rcpt_ctx_new(const struct imapconf *conf, struct rcpt_ctx **ctx_r)
{
    struct rcpt_ctx *ctx;
    const char *err = NULL;
    int r;

    *ctx_r = NULL;
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return STORE_NOMEM;
    ctx->conf = conf;
    r = userid_policy_init(conf, &ctx->policy, &err);
    if (r != STORE_OK) {
        log_error("lmtp: bad defaultdomain error=<%s>",
                  err ? err : store_strerror(r));
        free(ctx);
        return r;
    }
    r = mboxlist_open(conf, &ctx->ml);
    if (r) {
        userid_policy_free(&ctx->policy);
        free(ctx);
        return r;
    }
    *ctx_r = ctx;
    return STORE_OK;
}

void rcpt_ctx_free(struct rcpt_ctx **ctxp)
{
    struct rcpt_ctx *ctx = *ctxp;

    if (!ctx)
        return;
    mboxlist_close(&ctx->ml);
    userid_policy_free(&ctx->policy);
    free(ctx);
    *ctxp = NULL;
}

/* Look `name` up: 1 = exists (and *post_r = "anyone" may post),
 * 0 = does not exist, -1 = database trouble. */
static int rcpt_lookup(struct rcpt_ctx *ctx, const char *name, int *post_r,
                       int *lookup_r)
{
    struct mboxlist_entry *e = NULL;
    int r, rights;

    r = mboxlist_lookup(ctx->ml, name, &e);
    if (r == STORE_NOTFOUND || r == STORE_BADNAME)
        return 0;
    if (r != STORE_OK) {
        log_warning("lmtp: mailbox lookup failed mailbox=<%s> error=<%s>",
                    name, store_strerror(r));
        return -1;
    }
    rights = acl_rights(e->acl, NULL, NULL);
    if (post_r)
        *post_r = (rights & ACL_POST) != 0;
    if (lookup_r)
        *lookup_r = (rights & ACL_LOOKUP) != 0;
    mboxlist_entry_free(&e);
    return 1;
}

/* autocreate_post (with autocreate_quota >= 0): make the missing INBOX
 * `inbox` of its owner (store/autocreate.h) before the delivery.  0 made
 * (or made meanwhile by another process), 1 nothing to do, -1 trouble
 * (logged by autocreate). */
static int rcpt_autocreate(struct rcpt_ctx *ctx, const char *inbox)
{
    struct buf userid = BUF_INITIALIZER;
    int r, created = 0;

    if (!imapconf_getswitch(ctx->conf, "autocreate_post") ||
        imapconf_getint(ctx->conf, "autocreate_quota") < 0 ||
        !mboxname_userid(inbox, &userid)) {
        buf_free(&userid);
        return 1;
    }
    /* the owner's login name: '^' in a mailbox name stands for '.' */
    for (size_t k = 0; k < userid.len; k++)
        if (userid.s[k] == '^')
            userid.s[k] = '.';
    r = autocreate_inbox(ctx->conf, ctx->ml, buf_cstring(&userid), inbox,
                         &created);
    buf_free(&userid);
    if (r != STORE_OK)
        return -1;
    return rcpt_lookup(ctx, inbox, NULL, NULL) == 1 ? 0 : 1;
}

enum rcpt_result rcpt_resolve(struct rcpt_ctx *ctx, const char *local,
                              size_t locallen, const char *domain,
                              size_t domainlen, uint64_t size,
                              struct buf *mailbox_r, const char **error_r)
{
    struct buf folder = BUF_INITIALIZER;
    struct quota_db *q = NULL;
    enum rcpt_result res = RCPT_OK;
    int post = 0, lookup = 0, r;

    buf_reset(mailbox_r);
    if (error_r)
        *error_r = NULL;
    r = rcpt_mailbox_names(ctx->conf, &ctx->policy, local, locallen, domain,
                           domainlen, mailbox_r, &folder, error_r);
    if (r != 0) {
        res = r == RCPT_NAMES_BADDOMAIN ? RCPT_BADDOMAIN : RCPT_UNKNOWN;
        goto out;
    }
    if (local[0] == '+') {
        /* a shared mailbox: it must exist and take posts */
        r = rcpt_lookup(ctx, buf_cstring(mailbox_r), &post, &lookup);
        if (r < 0) { res = RCPT_TEMPFAIL; goto out; }
        if (r == 0) { res = RCPT_UNKNOWN; goto out; }
        if (!post) {
            /* do not reveal a mailbox anyone cannot even see */
            res = lookup ? RCPT_NOPOST : RCPT_UNKNOWN;
            goto out;
        }
    } else {
        if (folder.len > 0) {
            r = rcpt_lookup(ctx, buf_cstring(&folder), &post, NULL);
            if (r < 0) { res = RCPT_TEMPFAIL; goto out; }
            if (r == 1 && post) {
                if (buf_setmap(mailbox_r, folder.s, folder.len) != 0) {
                    res = RCPT_TEMPFAIL;
                    goto out;
                }
                goto quota;
            }
        }
        r = rcpt_lookup(ctx, buf_cstring(mailbox_r), NULL, NULL);
        if (r < 0) { res = RCPT_TEMPFAIL; goto out; }
        if (r == 0) {
            r = rcpt_autocreate(ctx, buf_cstring(mailbox_r));
            if (r < 0) { res = RCPT_TEMPFAIL; goto out; }
            if (r > 0) { res = RCPT_UNKNOWN; goto out; }
        }
    }
quota:
    r = quota_shared(ctx->conf, &q);
    if (r == STORE_OK)
        r = quota_check(q, buf_cstring(mailbox_r), size ? size : 1, 1, NULL);
    if (r == STORE_OVERQUOTA) {
        res = RCPT_OVERQUOTA;
    } else if (r != STORE_OK) {
        log_warning("lmtp: quota check failed mailbox=<%s> error=<%s>",
                    buf_cstring(mailbox_r), store_strerror(r));
        res = RCPT_TEMPFAIL;
    }
out:
    buf_free(&folder);
    if (res != RCPT_OK)
        buf_reset(mailbox_r);
    else
        buf_cstring(mailbox_r);
    return res;
}
