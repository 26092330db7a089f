/*
 * sieve_msg.c - the message context over bytes in memory (see
 * sieve_msg.h).  Every scan is bounded by the message length; lines end
 * in LF or CRLF; a header without a blank line takes the whole message.
 */
#include "config.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sieve/sieve_msg.h"
#include "imapd/search.h"

void sieve_msg_init(struct sieve_msg *m, const char *base, size_t len)
{
    const char *p = base, *end = base + len;

    memset(m, 0, sizeof(*m));
    m->base = base;
    m->len = len;
    m->header_len = len;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *next = eol ? eol + 1 : end;
        if ((next - p == 1 && *p == '\n') ||
            (next - p == 2 && p[0] == '\r' && p[1] == '\n')) {
            m->header_len = (size_t)(next - base);
            break;
        }
        p = next;
    }
}

struct sieve_msg_field {
    const char *name;      /* in the message: up to the colon */
    size_t namelen;
    const char *value;     /* after the colon, to the field's end */
    size_t valuelen;
    char *raw;             /* unfolded and trimmed, made when asked for */
    char *dec;             /* ... and RFC 2047 decoded */
};

void sieve_msg_fini(struct sieve_msg *m)
{
    size_t i;

    for (i = 0; i < m->nfields; i++) {
        free(m->fields[i].raw);
        free(m->fields[i].dec);
    }
    free(m->fields);
    m->fields = NULL;
    m->nfields = 0;
    m->indexed = 0;
    free(m->view);
    m->view = NULL;
    m->view_len = m->view_cap = 0;
    m->nviews = 0;
    strarray_fini(&m->env_to);
    strarray_fini(&m->env_auth);
    strarray_fini(&m->mailboxes);
    strarray_fini(&m->duplicates);
    strarray_fini(&m->environment);
    strarray_fini(&m->script_names);
}

static int msg_envelope(void *rock, const char *part, struct strarray *v)
{
    struct sieve_msg *m = rock;
    size_t i;

    if (strcasecmp(part, "from") == 0) {
        if (m->env_from && strarray_append(v, m->env_from) < 0)
            return -1;
    } else if (strcasecmp(part, "to") == 0) {
        for (i = 0; i < m->env_to.count; i++)
            if (strarray_append(v, m->env_to.data[i]) < 0)
                return -1;
    } else if (strcasecmp(part, "auth") == 0) {
        for (i = 0; i < m->env_auth.count; i++)
            if (strarray_append(v, m->env_auth.data[i]) < 0)
                return -1;
    }
    return 0;
}

/* The field starting at p in [p, end): this line and its continuation
 * lines.  Returns its end; *colon_r the first colon in it or NULL. */
static const char *field_next(const char *p, const char *end,
                              const char **colon_r)
{
    const char *fs = p;

    for (;;) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        p = eol ? eol + 1 : end;
        if (p >= end || (*p != ' ' && *p != '\t'))
            break;
    }
    *colon_r = memchr(fs, ':', (size_t)(p - fs));
    return p;
}

/* A field value [vs, ve) unfolded (CR and LF dropped), RFC 2047 decoded
 * when asked, and trimmed of blanks at both ends, as a new string; NULL
 * when out of memory. */
static char *field_value(const char *vs, const char *ve, int decoded)
{
    size_t n = (size_t)(ve - vs), len = 0, a = 0, b, i;
    char *raw = malloc(n + 1), *val;
    int plain = 1;
    const char *q;

    if (!raw)
        return NULL;
    /* unfolded: the line ends dropped */
    for (q = vs; q < ve; q++)
        if (*q != '\r' && *q != '\n')
            raw[len++] = *q;
    raw[len] = '\0';
    /* the common value needs no decoding: no encoded word, no NUL */
    for (i = 0; i < len && plain; i++)
        if (raw[i] == '\0' ||
            (decoded && raw[i] == '=' && i + 1 < len && raw[i + 1] == '?'))
            plain = 0;
    if (plain) {
        while (a < len && (raw[a] == ' ' || raw[a] == '\t'))
            a++;
        b = len;
        while (b > a && (raw[b - 1] == ' ' || raw[b - 1] == '\t'))
            b--;
        if (a)
            memmove(raw, raw + a, b - a);
        raw[b - a] = '\0';
        return raw;
    }
    {
        struct buf v = BUF_INITIALIZER;
        const char *s = raw;

        b = len;
        if (decoded) {
            if (search_decode_header(raw, len, &v) < 0) {
                free(raw);
                buf_free(&v);
                return NULL;
            }
            s = v.s ? v.s : "";
            b = v.len;
        }
        while (a < b && (s[a] == ' ' || s[a] == '\t'))
            a++;
        while (b > a && (s[b - 1] == ' ' || s[b - 1] == '\t'))
            b--;
        val = strndup(s + a, b - a);
        buf_free(&v);
        free(raw);
        return val;
    }
}

/* the fields of a header block [p, end): name -> values */
static int header_scan(const char *p, const char *end, const char *name,
                       int decoded, struct strarray *out)
{
    size_t nlen = strlen(name);

    while (p < end) {
        const char *fs = p, *colon;
        char *val;

        p = field_next(p, end, &colon);
        if (!colon || (size_t)(colon - fs) != nlen ||
            strncasecmp(fs, name, nlen) != 0)
            continue;
        val = field_value(colon + 1, p, decoded);
        if (!val || strarray_appendm(out, val) < 0)
            return -1;
    }
    return 0;
}

/* The index of the header's fields (names and value spans only).  0 or
 * -1 (out of memory). */
static int header_index(struct sieve_msg *m)
{
    const char *p = m->base, *end = m->base + m->header_len;
    size_t cap = 0;

    m->nfields = 0;   /* a retry after a failure starts over */
    while (p < end) {
        const char *fs = p, *colon;
        struct sieve_msg_field *f;

        p = field_next(p, end, &colon);
        if (!colon)
            continue;
        if (m->nfields == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            struct sieve_msg_field *nf =
                realloc(m->fields, ncap * sizeof(*nf));

            if (!nf)
                return -1;
            m->fields = nf;
            cap = ncap;
        }
        f = &m->fields[m->nfields++];
        memset(f, 0, sizeof(*f));
        f->name = fs;
        f->namelen = (size_t)(colon - fs);
        f->value = colon + 1;
        f->valuelen = (size_t)(p - (colon + 1));
    }
    m->indexed = 1;
    return 0;
}

/* a field name equal to name (nlen bytes) whatever the case: the first
 * bytes can differ only in the case bit, checked before the call */
static int name_is(const char *f, const char *name, size_t nlen)
{
    return nlen == 0 || (((f[0] ^ name[0]) & ~0x20) == 0 &&
                         strncasecmp(f, name, nlen) == 0);
}

static int msg_header(void *rock, const char *name, int decoded,
                      struct strarray *out)
{
    struct sieve_msg *m = rock;
    size_t nlen = strlen(name), i;

    if (!m->indexed && header_index(m) < 0)
        return -1;
    for (i = 0; i < m->nfields; i++) {
        struct sieve_msg_field *f = &m->fields[i];
        char **v = decoded ? &f->dec : &f->raw;

        if (f->namelen != nlen || !name_is(f->name, name, nlen))
            continue;
        if (!*v) {
            *v = field_value(f->value, f->value + f->valuelen, decoded);
            if (!*v)
                return -1;
        }
        if (strarray_append(out, *v) < 0)
            return -1;
    }
    return 0;
}

/* msg_header()'s decoded values, pointing into the index (each value
 * decoded once, kept until sieve_msg_fini()); a name asked for again
 * gets its earlier answer (the header is not edited here: a script's
 * edits are applied by the library, which then does not ask) */
static int msg_header_view(void *rock, const char *name,
                           const char *const **values_r, size_t *n_r)
{
    struct sieve_msg *m = rock;
    struct sieve_msg_view *w = NULL;
    size_t nlen = strlen(name), i, start, n = 0;

    *values_r = NULL;
    *n_r = 0;
    for (i = 0; i < m->nviews; i++)
        if (m->views[i].namelen == nlen &&
            name_is(m->views[i].name, name, nlen)) {
            if (m->views[i].n) {
                *values_r = (const char *const *)m->view + m->views[i].start;
                *n_r = m->views[i].n;
            }
            return 0;
        }
    if (!m->indexed && header_index(m) < 0)
        return -1;
    if (nlen < sizeof(w->name)) {   /* a longer one is not kept */
        if (m->nviews == SIEVE_MSG_VIEWS)
            m->nviews = m->view_len = 0;
        w = &m->views[m->nviews];
    }
    start = m->view_len;   /* after the kept ones */
    for (i = 0; i < m->nfields; i++) {
        struct sieve_msg_field *f = &m->fields[i];

        if (f->namelen != nlen || !name_is(f->name, name, nlen))
            continue;
        if (!f->dec) {
            f->dec = field_value(f->value, f->value + f->valuelen, 1);
            if (!f->dec)
                return -1;
        }
        if (start + n == m->view_cap) {
            size_t cap = m->view_cap ? 2 * m->view_cap : 16;
            const char **v = realloc(m->view, cap * sizeof(*v));

            if (!v)
                return -1;
            m->view = v;
            m->view_cap = cap;
        }
        m->view[start + n++] = f->dec;
    }
    if (w) {
        memcpy(w->name, name, nlen);
        w->namelen = nlen;
        w->start = start;
        w->n = n;
        m->nviews++;
        m->view_len = start + n;
    }
    if (n) {
        *values_r = (const char *const *)m->view + start;
        *n_r = n;
    }
    return 0;
}

/* the value of parameter `param` in a Content-Type value, or NULL */
static char *ct_param(const char *ct, const char *param)
{
    size_t plen = strlen(param);
    const char *p = ct;

    while ((p = strchr(p, ';')) != NULL) {
        p++;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncasecmp(p, param, plen) == 0 && p[plen] == '=') {
            const char *v = p + plen + 1, *e;
            if (*v == '"') {
                v++;
                e = strchr(v, '"');
                if (!e)
                    e = v + strlen(v);
            } else {
                e = v;
                while (*e && *e != ';' && *e != ' ' && *e != '\t')
                    e++;
            }
            return strndup(v, (size_t)(e - v));
        }
    }
    return NULL;
}

static void ct_type(const char *ct, char *out, size_t outlen)
{
    size_t i = 0;

    while (*ct == ' ')
        ct++;
    while (*ct && *ct != ';' && *ct != ' ' && i + 1 < outlen) {
        out[i++] = (char)tolower((unsigned char)*ct);
        ct++;
    }
    out[i] = '\0';
    if (!out[0])
        strcpy(out, "text/plain");
}

static int b64val(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

static int hexv(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static int decode_body(const char *s, size_t len, const char *cte,
                       struct buf *out)
{
    size_t i;

    if (cte && strcasecmp(cte, "base64") == 0) {
        unsigned acc = 0;
        int bits = 0;
        for (i = 0; i < len; i++) {
            int v = b64val((unsigned char)s[i]);
            if (v < 0)
                continue;
            acc = (acc << 6) | (unsigned)v;
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                if (buf_putc(out, (int)((acc >> bits) & 0xff)) < 0)
                    return -1;
            }
        }
        return 0;
    }
    if (cte && strcasecmp(cte, "quoted-printable") == 0) {
        for (i = 0; i < len; i++) {
            if (s[i] == '=' && i + 2 < len + 0 && hexv((unsigned char)s[i + 1]) >= 0 &&
                hexv((unsigned char)s[i + 2]) >= 0) {
                if (buf_putc(out, hexv((unsigned char)s[i + 1]) * 16 +
                                  hexv((unsigned char)s[i + 2])) < 0)
                    return -1;
                i += 2;
            } else if (s[i] == '=' && (i + 1 == len || s[i + 1] == '\r' ||
                                       s[i + 1] == '\n')) {
                /* soft line break */
                if (i + 1 < len && s[i + 1] == '\r')
                    i++;
                if (i + 1 < len && s[i + 1] == '\n')
                    i++;
            } else if (buf_putc(out, s[i]) < 0) {
                return -1;
            }
        }
        return 0;
    }
    return buf_append(out, s, len);
}

/* does part type `type` match one of the :content types? */
static int type_wanted(const char *type, const struct strarray *types)
{
    size_t i;

    if (!types)     /* :text */
        return strncmp(type, "text/", 5) == 0;
    for (i = 0; i < types->count; i++) {
        const char *t = types->data[i];
        if (!*t)
            return 1;
        if (strchr(t, '/') ? strcasecmp(t, type) == 0
                           : (strncasecmp(t, type, strlen(t)) == 0 &&
                              type[strlen(t)] == '/'))
            return 1;
    }
    return 0;
}

/* one entity [p, end): header then body; depth bounds the recursion */
static int entity_parts(const char *p, const char *end, const
                        struct strarray *types, struct strarray *out,
                        int depth)
{
    struct sieve_msg sub;
    struct strarray ct = STRARRAY_INITIALIZER, cte = STRARRAY_INITIALIZER;
    char type[128];
    const char *body;
    int rc = 0;

    sieve_msg_init(&sub, p, (size_t)(end - p));
    if (header_scan(p, p + sub.header_len, "Content-Type", 0, &ct) < 0 ||
        header_scan(p, p + sub.header_len, "Content-Transfer-Encoding", 0,
                    &cte) < 0) {
        rc = -1;
        goto out;
    }
    ct_type(ct.count ? ct.data[0] : "", type, sizeof(type));
    body = p + sub.header_len;
    if (strncmp(type, "multipart/", 10) == 0 && depth < 4) {
        char *bnd = ct_param(ct.data[0], "boundary");
        size_t blen;
        const char *q = body, *part = NULL;
        if (!bnd)
            goto leaf;
        blen = strlen(bnd);
        while (q < end) {
            const char *eol = memchr(q, '\n', (size_t)(end - q));
            const char *next = eol ? eol + 1 : end;
            if (next - q >= (long)(2 + blen) && q[0] == '-' && q[1] == '-' &&
                memcmp(q + 2, bnd, blen) == 0) {
                if (part) {
                    const char *pe = q;
                    if (pe > part && pe[-1] == '\n') pe--;
                    if (pe > part && pe[-1] == '\r') pe--;
                    if (entity_parts(part, pe, types, out, depth + 1) < 0) {
                        free(bnd);
                        rc = -1;
                        goto out;
                    }
                }
                if (next - q >= (long)(4 + blen) && q[2 + blen] == '-' &&
                    q[3 + blen] == '-')
                    break;
                part = next;
            }
            q = next;
        }
        free(bnd);
        goto out;
    }
leaf:
    if (type_wanted(type, types)) {
        struct buf b = BUF_INITIALIZER;
        if (decode_body(body, (size_t)(end - body),
                        cte.count ? cte.data[0] : NULL, &b) < 0 ||
            strarray_appendm(out, buf_release(&b)) < 0)
            rc = -1;
        buf_free(&b);
    }
out:
    strarray_fini(&ct);
    strarray_fini(&cte);
    return rc;
}

static int msg_body(void *rock, enum sieve_body_transform tr,
                    const struct strarray *types, struct strarray *out)
{
    struct sieve_msg *m = rock;

    if (tr == SIEVE_BODY_RAW) {
        char *s = strndup(m->base + m->header_len, m->len - m->header_len);
        return strarray_appendm(out, s);
    }
    return entity_parts(m->base, m->base + m->len,
                        tr == SIEVE_BODY_TEXT ? NULL : types, out, 0);
}

static int msg_mailbox_exists(void *rock, const char *mailbox)
{
    struct sieve_msg *m = rock;

    return strarray_find(&m->mailboxes, mailbox) >= 0;
}

static int msg_duplicate(void *rock, const char *id)
{
    struct sieve_msg *m = rock;

    return strarray_find(&m->duplicates, id) >= 0;
}

static int msg_environment(void *rock, const char *name, struct buf *value)
{
    struct sieve_msg *m = rock;
    size_t i, n = strlen(name);

    for (i = 0; i < m->environment.count; i++) {
        const char *e = m->environment.data[i];
        if (strncasecmp(e, name, n) == 0 && e[n] == '=') {
            buf_setcstr(value, e + n + 1);
            return 1;
        }
    }
    return 0;
}

static int msg_include(void *rock, int global, const char *name,
                       const struct sieve_script **script_r,
                       struct buf *errmsg)
{
    struct sieve_msg *m = rock;
    long i = strarray_find(&m->script_names, name);

    (void)global;
    (void)errmsg;
    if (i < 0 || !m->scripts || !m->scripts[i])
        return 0;
    *script_r = m->scripts[i];
    return 1;
}

void sieve_msg_ctx(struct sieve_msg *m, struct sieve_message_ctx *ctx)
{
    memset(ctx, 0, sizeof(*ctx));
    ctx->rock = m;
    ctx->envelope = msg_envelope;
    ctx->header = msg_header;
    ctx->header_view = msg_header_view;
    ctx->body = msg_body;
    ctx->size = m->len;
    ctx->now = m->now;
    ctx->zone_minutes = m->zone_minutes;
    ctx->mailbox_exists = msg_mailbox_exists;
    ctx->duplicate_check = msg_duplicate;
    ctx->environment = msg_environment;
    ctx->include = msg_include;
    ctx->subaddress_sep = '+';
}
