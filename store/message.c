/*
 * message.c - parse a stored message into a MIME tree and answer IMAP
 * FETCH items (ENVELOPE, BODY, BODYSTRUCTURE, BODY[section]) from it.
 *
 * The tree holds offsets into the caller's bytes, never copies of them:
 * every part records its header range and its body range.  A part whose
 * Content-Type is message/rfc822 has an `encap` node for the encapsulated
 * message (its header and body); a multipart has a list of children, one
 * per body part between boundary delimiter lines.  The message itself is
 * the root node, a message node like any `encap`.
 *
 * Invariants: every range lies inside [base, base + len) and inside its
 * parent's body range, so no later step can read out of bounds; all
 * scanning is done by (pointer, end) cursors, never strlen() on message
 * bytes; recursion is bounded by MESSAGE_MAX_DEPTH and the node count by
 * MESSAGE_MAX_PARTS.  Header field values are re-read from the header
 * range when output needs them; only what the tree's shape depends on
 * (type, subtype, boundary) is parsed up front.
 */
#include "config.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "store/message.h"

struct part {
    size_t hdr_off, hdr_len;    /* header, blank line included */
    size_t body_off, body_len;
    char *type, *subtype;       /* upper-case */
    int default_ct;             /* no usable Content-Type: text/plain,
                                 * charset us-ascii */
    int multipart;              /* shown as a multipart */
    struct part *encap;         /* message/rfc822: the inner message */
    struct part *child, *next;  /* multipart children, in order */
    size_t nchildren;
};

struct message {
    const char *base;
    size_t len;
    size_t nparts;
    struct part *root;
};

/* ---- small helpers over (pointer, end) ---- */

static int is_wsp(int c) { return c == ' ' || c == '\t'; }

const char *message_line_next(const char *p, const char *end)
{
    const char *lf = memchr(p, '\n', (size_t)(end - p));
    return lf ? lf + 1 : end;
}

int message_line_is_empty(const char *p, const char *end)
{
    if (p < end && *p == '\n')
        return 1;
    if (p < end && *p == '\r' && (p + 1 == end || p[1] == '\n'))
        return 1;
    return 0;
}

size_t message_header_length(const char *p, const char *end)
{
    const char *q = p;
    while (q < end) {
        if (message_line_is_empty(q, end))
            return (size_t)(message_line_next(q, end) - p);
        q = message_line_next(q, end);
    }
    return (size_t)(end - p);
}

/* One header field: its name, raw value (folding kept, final line end
 * not) and the raw bytes of the whole field, line ends included. */
struct field {
    const char *name;
    size_t namelen;             /* 0: a line that is not a field */
    const char *value, *value_end;
    const char *raw, *raw_end;
};

/* Read the field at *pp inside [*pp, end); returns 0 at the end of the
 * header (end reached or the empty line). */
static int field_next(const char **pp, const char *end, struct field *f)
{
    const char *p = *pp, *q, *colon;

    if (p >= end || message_line_is_empty(p, end))
        return 0;
    f->raw = p;
    q = message_line_next(p, end);
    while (q < end && is_wsp(*q))
        q = message_line_next(q, end);
    f->raw_end = q;
    f->value_end = q;
    if (f->value_end > p && f->value_end[-1] == '\n')
        f->value_end--;
    if (f->value_end > p && f->value_end[-1] == '\r')
        f->value_end--;
    colon = memchr(p, ':', (size_t)(f->value_end - p));
    f->name = p;
    f->namelen = 0;
    f->value = f->value_end;
    if (colon && !is_wsp(*p)) {
        const char *ne = colon;
        while (ne > p && is_wsp(ne[-1]))
            ne--;
        if (memchr(p, '\n', (size_t)(ne - p)) == NULL) {
            f->namelen = (size_t)(ne - p);
            f->value = colon + 1;
        }
    }
    *pp = q;
    return 1;
}

static int name_eq(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    return alen == blen && strncasecmp(a, b, blen) == 0;
}

/* The unfolded, trimmed value of the first field `name` in the header
 * [p, p + len), into out (replaced).  1 found, 0 absent, -1 no memory.
 * NUL, CR and LF bytes are dropped. */
static int header_get(const char *p, size_t len, const char *name,
                      struct buf *out)
{
    const char *end = p + len, *s, *e;
    struct field f;

    buf_reset(out);
    while (field_next(&p, end, &f)) {
        if (f.namelen == 0 || !name_eq(f.name, f.namelen, name))
            continue;
        s = f.value;
        e = f.value_end;
        while (s < e && (is_wsp(*s) || *s == '\r' || *s == '\n'))
            s++;
        for (; s < e; s++) {
            if (*s == '\r' || *s == '\n' || *s == '\0')
                continue;
            if (buf_putc(out, (unsigned char)*s) < 0)
                return -1;
        }
        while (out->len > 0 && is_wsp(out->s[out->len - 1]))
            out->len--;
        return 1;
    }
    return 0;
}

static void upcase(char *s)
{
    for (; *s; s++)
        *s = (char)toupper((unsigned char)*s);
}

/* ---- MIME header grammar (RFC 2045): tokens, quoted strings, comments */

struct cursor {
    const char *p, *end;
};

/* Skip whitespace and (nested) comments. */
static void cfws_skip(struct cursor *c)
{
    while (c->p < c->end) {
        if (is_wsp(*c->p)) {
            c->p++;
        } else if (*c->p == '(') {
            int depth = 0;
            while (c->p < c->end) {
                if (*c->p == '\\' && c->p + 1 < c->end) {
                    c->p += 2;
                    continue;
                }
                if (*c->p == '(')
                    depth++;
                else if (*c->p == ')' && --depth == 0) {
                    c->p++;
                    break;
                }
                c->p++;
            }
        } else {
            break;
        }
    }
}

static int is_tspecial(int c)
{
    return c != 0 && strchr("()<>@,;:\\\"/[]?=", c) != NULL;
}

static int is_token_char(int c)
{
    return c > 0x20 && c != 0x7f && !is_tspecial(c);
}

/* A token at the cursor: its span, or length 0. */
static size_t token_get(struct cursor *c, const char **tok_r)
{
    const char *s;
    cfws_skip(c);
    s = c->p;
    while (c->p < c->end && is_token_char((unsigned char)*c->p))
        c->p++;
    *tok_r = s;
    return (size_t)(c->p - s);
}

/* A token or quoted string value, unescaped into out (replaced).
 * 1 read, 0 none there, -1 no memory. */
static int value_get(struct cursor *c, struct buf *out)
{
    buf_reset(out);
    cfws_skip(c);
    if (c->p < c->end && *c->p == '"') {
        c->p++;
        while (c->p < c->end && *c->p != '"') {
            if (*c->p == '\\' && c->p + 1 < c->end)
                c->p++;
            if (buf_putc(out, (unsigned char)*c->p) < 0)
                return -1;
            c->p++;
        }
        if (c->p < c->end)
            c->p++;
        return 1;
    } else {
        const char *t;
        size_t n = token_get(c, &t);
        if (n == 0)
            return 0;
        return buf_append(out, t, n) < 0 ? -1 : 1;
    }
}

typedef int (*param_fn)(void *rock, const char *name, size_t namelen,
                        const struct buf *value);

/* Parse "type[/subtype] *(; name=value)" in [s, s + len).  type_r and
 * subtype_r (subtype_r NULL: no subtype expected) get malloc'd upper-case
 * copies; fn is called for each parameter.  Returns 0, 1 when the value
 * is malformed (no valid type), -1 no memory. */
static int mime_value_parse(const char *s, size_t len, char **type_r,
                            char **subtype_r, param_fn fn, void *rock)
{
    struct cursor c = { s, s + len };
    const char *t, *st = NULL, *pn;
    size_t tn, stn = 0, pnn;
    struct buf val = BUF_INITIALIZER;
    int r = 0;

    *type_r = NULL;
    if (subtype_r)
        *subtype_r = NULL;
    tn = token_get(&c, &t);
    if (tn == 0)
        return 1;
    if (subtype_r) {
        cfws_skip(&c);
        if (c.p >= c.end || *c.p != '/')
            return 1;
        c.p++;
        stn = token_get(&c, &st);
        if (stn == 0)
            return 1;
    }
    *type_r = strndup(t, tn);
    if (subtype_r)
        *subtype_r = strndup(st, stn);
    if (*type_r == NULL || (subtype_r && *subtype_r == NULL)) {
        r = -1;
        goto fail;
    }
    upcase(*type_r);
    if (subtype_r)
        upcase(*subtype_r);
    for (;;) {
        cfws_skip(&c);
        if (c.p >= c.end || *c.p != ';')
            break;
        c.p++;
        pnn = token_get(&c, &pn);
        if (pnn == 0)
            continue;           /* ";;" or a trailing ";" */
        cfws_skip(&c);
        if (c.p >= c.end || *c.p != '=')
            break;              /* malformed parameter: stop here */
        c.p++;
        r = value_get(&c, &val);
        if (r < 0)
            goto fail;
        if (r == 0)
            break;
        r = fn ? fn(rock, pn, pnn, &val) : 0;
        if (r < 0)
            goto fail;
    }
    buf_free(&val);
    return 0;
fail:
    buf_free(&val);
    free(*type_r);
    *type_r = NULL;
    if (subtype_r) {
        free(*subtype_r);
        *subtype_r = NULL;
    }
    return r;
}

/* ---- parsing the tree ---- */

struct parse_ctx {
    struct message *msg;
    struct buf scratch;
};

struct boundary_rock {
    char *boundary;
};

static int boundary_cb(void *rock, const char *name, size_t namelen,
                       const struct buf *value)
{
    struct boundary_rock *br = rock;
    if (br->boundary == NULL && name_eq(name, namelen, "boundary")
        && value->len > 0) {
        br->boundary = strndup(value->s, value->len);
        if (br->boundary == NULL)
            return -1;
    }
    return 0;
}

static struct part *part_parse(struct parse_ctx *pc, size_t off, size_t len,
                               int depth, int in_digest);

static void part_free(struct part *part)
{
    while (part) {
        struct part *next = part->next, *c = part->child;
        while (c) {
            struct part *cn = c->next;
            c->next = NULL;
            part_free(c);
            c = cn;
        }
        part_free(part->encap);
        free(part->type);
        free(part->subtype);
        free(part);
        part = next;
    }
}

/* Is the line at p a delimiter for boundary b?  *close_r set for the
 * close delimiter.  Text after the boundary may only be whitespace. */
static int delimiter_at(const char *p, const char *end, const char *b,
                        size_t blen, int *close_r)
{
    const char *q;
    if ((size_t)(end - p) < 2 + blen || p[0] != '-' || p[1] != '-'
        || memcmp(p + 2, b, blen) != 0)
        return 0;
    q = p + 2 + blen;
    *close_r = 0;
    if (end - q >= 2 && q[0] == '-' && q[1] == '-') {
        *close_r = 1;
        q += 2;
    }
    while (q < end && *q != '\n') {
        if (!is_wsp(*q) && *q != '\r')
            return 0;
        q++;
    }
    return 1;
}

static int multipart_split(struct parse_ctx *pc, struct part *mp,
                           const char *boundary, int depth)
{
    const char *base = pc->msg->base;
    const char *s = base + mp->body_off, *end = s + mp->body_len;
    const char *p = s, *ps = NULL;
    size_t blen = strlen(boundary);
    int digest = strcmp(mp->subtype, "DIGEST") == 0;
    struct part **tail = &mp->child;

    for (;;) {
        int close = 0, at_delim = 0;
        const char *pe = end;
        if (p < end)
            at_delim = delimiter_at(p, end, boundary, blen, &close);
        if (p >= end || at_delim) {
            if (ps != NULL) {
                struct part *child;
                if (at_delim) {
                    pe = p;
                    if (pe > ps && pe[-1] == '\n')
                        pe--;
                    if (pe > ps && pe[-1] == '\r')
                        pe--;
                }
                if (pc->msg->nparts >= MESSAGE_MAX_PARTS)
                    return 0;
                child = part_parse(pc, (size_t)(ps - base),
                                   (size_t)(pe - ps), depth + 1, digest);
                if (child == NULL)
                    return -1;
                *tail = child;
                tail = &child->next;
                mp->nchildren++;
                ps = NULL;
            }
            if (p >= end || close)
                return 0;
            ps = message_line_next(p, end);
        }
        p = message_line_next(p, end);
    }
}

static struct part *part_parse(struct parse_ctx *pc, size_t off, size_t len,
                               int depth, int in_digest)
{
    struct message *msg = pc->msg;
    const char *p = msg->base + off;
    struct part *part;
    struct boundary_rock br = { NULL };
    int r;

    part = calloc(1, sizeof(*part));
    if (part == NULL)
        goto nomem;
    msg->nparts++;
    part->hdr_off = off;
    part->hdr_len = message_header_length(p, p + len);
    part->body_off = off + part->hdr_len;
    part->body_len = len - part->hdr_len;

    r = header_get(p, part->hdr_len, "Content-Type", &pc->scratch);
    if (r < 0)
        goto nomem;
    if (r > 0) {
        r = mime_value_parse(pc->scratch.s, pc->scratch.len, &part->type,
                             &part->subtype, boundary_cb, &br);
        if (r < 0)
            goto nomem;
    }
    if (part->type == NULL) {
        part->type = strdup(in_digest ? "MESSAGE" : "TEXT");
        part->subtype = strdup(in_digest ? "RFC822" : "PLAIN");
        part->default_ct = !in_digest;
        if (part->type == NULL || part->subtype == NULL)
            goto nomem;
    }

    if (strcmp(part->type, "MULTIPART") == 0 || (strcmp(part->type,
        "MESSAGE") == 0 && strcmp(part->subtype, "RFC822") == 0)) {
        int multi = part->type[0] == 'M' && part->type[1] == 'U';
        if (depth >= MESSAGE_MAX_DEPTH
            || msg->nparts >= MESSAGE_MAX_PARTS
            || (multi && br.boundary == NULL)) {
            /* not descended into: shown as text/plain */
            free(part->type);
            free(part->subtype);
            part->type = strdup("TEXT");
            part->subtype = strdup("PLAIN");
            part->default_ct = 1;
            if (part->type == NULL || part->subtype == NULL)
                goto nomem;
        } else if (multi) {
            part->multipart = 1;
            if (multipart_split(pc, part, br.boundary, depth) < 0)
                goto nomem;
        } else {
            part->encap = part_parse(pc, part->body_off, part->body_len,
                                     depth + 1, 0);
            if (part->encap == NULL)
                goto nomem;
        }
    }
    free(br.boundary);
    return part;

nomem:
    free(br.boundary);
    part_free(part);
    return NULL;
}

/* ---- the message ---- */

int message_parse(const char *base, size_t len, struct message **msg_r)
{
    struct parse_ctx pc = { NULL, BUF_INITIALIZER };
    struct message *msg;

    *msg_r = NULL;
    if (base == NULL && len > 0)
        return MESSAGE_BADARG;
    msg = calloc(1, sizeof(*msg));
    if (msg == NULL)
        return MESSAGE_NOMEM;
    msg->base = base ? base : "";
    msg->len = len;
    pc.msg = msg;
    msg->root = part_parse(&pc, 0, len, 0, 0);
    buf_free(&pc.scratch);
    if (msg->root == NULL) {
        free(msg);
        return MESSAGE_NOMEM;
    }
    *msg_r = msg;
    return MESSAGE_OK;
}

void message_free(struct message **msgp)
{
    if (msgp == NULL || *msgp == NULL)
        return;
    part_free((*msgp)->root);
    free(*msgp);
    *msgp = NULL;
}

size_t message_size(const struct message *msg)
{
    return msg->len;
}

size_t message_header_size(const struct message *msg)
{
    return msg->root->hdr_len;
}

size_t message_part_count(const struct message *msg)
{
    return msg->nparts;
}

/* ---- IMAP strings ---- */

int message_write_nstring(struct buf *out, const char *data, size_t len)
{
    size_t i;
    int literal = 0;

    if (data == NULL)
        return buf_appendcstr(out, "NIL") < 0 ? MESSAGE_NOMEM : MESSAGE_OK;
    if (memchr(data, '\0', len) != NULL) {
        struct buf clean = BUF_INITIALIZER;
        int r = MESSAGE_OK;
        for (i = 0; i < len && r == MESSAGE_OK; i++)
            if (data[i] != '\0' && buf_putc(&clean, (unsigned char)data[i]) < 0)
                r = MESSAGE_NOMEM;
        if (r == MESSAGE_OK)
            r = message_write_nstring(out, clean.s ? clean.s : "", clean.len);
        buf_free(&clean);
        return r;
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)data[i];
        if (c == '\r' || c == '\n' || c >= 0x80 || c == '"' || c == '\\') {
            literal = 1;
            break;
        }
    }
    if (literal) {
        if (buf_printf(out, "{%zu}\r\n", len) < 0
            || buf_append(out, data, len) < 0)
            return MESSAGE_NOMEM;
        return MESSAGE_OK;
    }
    if (buf_putc(out, '"') < 0 || buf_append(out, data, len) < 0
        || buf_putc(out, '"') < 0)
        return MESSAGE_NOMEM;
    return MESSAGE_OK;
}

static int put(struct buf *out, const char *s)
{
    return buf_appendcstr(out, s) < 0 ? MESSAGE_NOMEM : MESSAGE_OK;
}

static int put_cstring(struct buf *out, const char *s)
{
    return message_write_nstring(out, s, s ? strlen(s) : 0);
}

static int put_buf(struct buf *out, const struct buf *b)
{
    return message_write_nstring(out, b->s ? b->s : "", b->len);
}

/* The header field `name` of a part as an nstring (NIL when absent). */
static int put_field(struct buf *out, const struct message *msg,
                     const struct part *part, const char *name)
{
    struct buf v = BUF_INITIALIZER;
    int r = header_get(msg->base + part->hdr_off, part->hdr_len, name, &v);
    if (r < 0)
        r = MESSAGE_NOMEM;
    else if (r == 0)
        r = put(out, "NIL");
    else
        r = put_buf(out, &v);
    buf_free(&v);
    return r;
}

/* ---- addresses (RFC 5322 3.4, with the obsolete forms tolerated) ---- */

enum tok_kind { TOK_ATOM, TOK_QSTR, TOK_COMMENT, TOK_DLIT, TOK_SPECIAL };

struct tok {
    enum tok_kind kind;
    const char *p;              /* for QSTR/COMMENT: inside the delimiters */
    size_t len;
    int space_before;
};

/* the tokens of a field: the first TOKLIST_INLINE in the struct (a
 * field's addresses rarely need more), the rest on the heap */
#define TOKLIST_INLINE 24

struct toklist {
    struct tok *t;              /* `inline` or the heap */
    size_t n, alloc;
    struct tok inline_t[TOKLIST_INLINE];
};

static void toklist_init(struct toklist *tl)
{
    tl->t = tl->inline_t;
    tl->n = 0;
    tl->alloc = TOKLIST_INLINE;
}

static void toklist_fini(struct toklist *tl)
{
    if (tl->t != tl->inline_t)
        free(tl->t);
    toklist_init(tl);
}

#define ADDR_MAX_TOKENS 100000

static int tok_add(struct toklist *tl, enum tok_kind kind, const char *p,
                   size_t len, int space)
{
    if (tl->n == tl->alloc) {
        size_t na = tl->alloc * 2;
        struct tok *nt;
        if (na > ADDR_MAX_TOKENS)
            return 1;
        if (tl->t == tl->inline_t) {
            nt = malloc(na * sizeof(*nt));
            if (nt != NULL)
                memcpy(nt, tl->t, tl->n * sizeof(*nt));
        } else {
            nt = realloc(tl->t, na * sizeof(*nt));
        }
        if (nt == NULL)
            return -1;
        tl->t = nt;
        tl->alloc = na;
    }
    tl->t[tl->n].kind = kind;
    tl->t[tl->n].p = p;
    tl->t[tl->n].len = len;
    tl->t[tl->n].space_before = space;
    tl->n++;
    return 0;
}

/* Split an unfolded header value into tokens.  -1 no memory; too many
 * tokens just end the list. */
static int addr_tokenize(const char *p, const char *end, struct toklist *tl)
{
    int space = 0, r = 0;
    while (p < end && r == 0) {
        const char *s = p;
        if (is_wsp(*p)) {
            space = 1;
            p++;
            continue;
        }
        if (*p == '"' || *p == '(' || *p == '[') {
            char close = *p == '"' ? '"' : *p == '(' ? ')' : ']';
            int depth = 1;
            p++;
            while (p < end) {
                if (*p == '\\' && p + 1 < end) {
                    p += 2;
                    continue;
                }
                if (close == ')' && *p == '(')
                    depth++;
                else if (*p == close && --depth == 0)
                    break;
                p++;
            }
            if (*s == '[') {
                if (p < end)
                    p++;
                r = tok_add(tl, TOK_DLIT, s, (size_t)(p - s), space);
            } else {
                r = tok_add(tl, *s == '"' ? TOK_QSTR : TOK_COMMENT, s + 1,
                            (size_t)(p - s - 1), space);
                if (p < end)
                    p++;
            }
        } else if (strchr("<>@,;:.", *p) != NULL) {
            p++;
            r = tok_add(tl, TOK_SPECIAL, s, 1, space);
        } else {
            while (p < end && !is_wsp(*p)
                   && strchr("\"()[]<>@,;:.\\", *p) == NULL)
                p++;
            if (p == s)
                p++;            /* a lone backslash or ']' */
            r = tok_add(tl, TOK_ATOM, s, (size_t)(p - s), space);
        }
        space = 0;
    }
    return r < 0 ? -1 : 0;
}

static int tok_is(const struct tok *t, char c)
{
    return t->kind == TOK_SPECIAL && t->p[0] == c;
}

/* Append the text of a quoted string or comment, unescaped. */
static int unescape_append(struct buf *b, const char *p, size_t len)
{
    size_t i;
    for (i = 0; i < len; i++) {
        if (p[i] == '\\' && i + 1 < len)
            i++;
        if (buf_putc(b, (unsigned char)p[i]) < 0)
            return -1;
    }
    return 0;
}

/* A display name from tokens [i, j): words joined by single spaces where
 * the original had whitespace; comments left out. */
static int phrase_join(const struct toklist *tl, size_t i, size_t j,
                       struct buf *b)
{
    buf_reset(b);
    for (; i < j; i++) {
        const struct tok *t = &tl->t[i];
        if (t->kind == TOK_COMMENT)
            continue;
        if (t->space_before && b->len > 0 && buf_putc(b, ' ') < 0)
            return -1;
        if (t->kind == TOK_QSTR) {
            if (unescape_append(b, t->p, t->len) < 0)
                return -1;
        } else if (buf_append(b, t->p, t->len) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Raw text of tokens [i, j) without whitespace or comments (local parts,
 * domains, routes); quoted strings keep their quotes. */
static int raw_join(const struct toklist *tl, size_t i, size_t j,
                    struct buf *b)
{
    buf_reset(b);
    for (; i < j; i++) {
        const struct tok *t = &tl->t[i];
        if (t->kind == TOK_COMMENT)
            continue;
        if (t->kind == TOK_QSTR) {
            if (buf_putc(b, '"') < 0 || buf_append(b, t->p, t->len) < 0
                || buf_putc(b, '"') < 0)
                return -1;
        } else if (buf_append(b, t->p, t->len) < 0) {
            return -1;
        }
    }
    return 0;
}

struct addr_out {
    struct buf *out;
    size_t count;               /* addresses written */
    struct buf name, route, mailbox, host;
    message_address_fn *fn;     /* not NULL: report, do not write */
    void *rock;
};

/* Write one address; NULL members are NIL. */
static int addr_emit(struct addr_out *ao, const struct buf *name,
                     const struct buf *route, const struct buf *mailbox,
                     const struct buf *host)
{
    const struct buf *f[4] = { name, route, mailbox, host };
    int i;
    if (ao->fn) {
        ao->count++;
        if (mailbox == NULL || host == NULL)
            return MESSAGE_OK;          /* group start or end */
        return ao->fn(ao->rock, name ? name->s : NULL, name ? name->len : 0,
                      mailbox->s ? mailbox->s : "", mailbox->len,
                      host->s ? host->s : "", host->len)
               ? MESSAGE_NOMEM : MESSAGE_OK;
    }
    if (put(ao->out, ao->count == 0 ? "((" : "(") != MESSAGE_OK)
        return MESSAGE_NOMEM;
    for (i = 0; i < 4; i++) {
        if (i > 0 && put(ao->out, " ") != MESSAGE_OK)
            return MESSAGE_NOMEM;
        if ((f[i] ? put_buf(ao->out, f[i]) : put(ao->out, "NIL"))
            != MESSAGE_OK)
            return MESSAGE_NOMEM;
    }
    ao->count++;
    return put(ao->out, ")");
}

/* Index of the first token in [i, n) that is one of the specials in set,
 * or n. */
static size_t tok_find(const struct toklist *tl, size_t i, const char *set)
{
    for (; i < tl->n; i++)
        if (tl->t[i].kind == TOK_SPECIAL && strchr(set, tl->t[i].p[0]))
            return i;
    return tl->n;
}

static int addr_list_tokens(struct addr_out *ao, const struct toklist *tl)
{
    size_t i = 0, j, k, n = tl->n;
    int in_group = 0, r;

    while (i < n) {
        const struct tok *t = &tl->t[i];
        if (tok_is(t, ',') || t->kind == TOK_COMMENT || tok_is(t, '>')) {
            i++;
            continue;
        }
        if (tok_is(t, ';')) {
            if (in_group && addr_emit(ao, NULL, NULL, NULL, NULL))
                return MESSAGE_NOMEM;
            in_group = 0;
            i++;
            continue;
        }
        j = tok_find(tl, i, "<:@,;");
        if (j < n && tok_is(&tl->t[j], ':') && !in_group) {
            /* group start */
            if (phrase_join(tl, i, j, &ao->mailbox) < 0
                || addr_emit(ao, NULL, NULL, &ao->mailbox, NULL))
                return MESSAGE_NOMEM;
            in_group = 1;
            i = j + 1;
            continue;
        }
        if (j < n && tok_is(&tl->t[j], ':'))
            j = tok_find(tl, j + 1, "<@,;"); /* stray ':' in a group */
        if (j < n && tok_is(&tl->t[j], '<')) {
            size_t e = tok_find(tl, j + 1, ">"), at, rs = j + 1;
            int have_route = 0;
            if (phrase_join(tl, i, j, &ao->name) < 0)
                return MESSAGE_NOMEM;
            buf_reset(&ao->route);
            if (rs < e && tok_is(&tl->t[rs], '@')) {
                size_t colon = tok_find(tl, rs, ":>");
                if (colon < e) {
                    if (raw_join(tl, rs, colon, &ao->route) < 0)
                        return MESSAGE_NOMEM;
                    have_route = 1;
                    rs = colon + 1;
                }
            }
            at = tok_find(tl, rs, "@>");
            if (at > e)
                at = e;
            if (raw_join(tl, rs, at, &ao->mailbox) < 0
                || raw_join(tl, at < e ? at + 1 : e, e, &ao->host) < 0)
                return MESSAGE_NOMEM;
            r = addr_emit(ao, ao->name.len ? &ao->name : NULL,
                          have_route ? &ao->route : NULL, &ao->mailbox,
                          &ao->host);
            if (r)
                return r;
            i = tok_find(tl, e, ",;");
            continue;
        }
        if (j < n && tok_is(&tl->t[j], '@')) {
            size_t e = tok_find(tl, j + 1, ",;<");
            int have_name = 0;
            if (raw_join(tl, i, j, &ao->mailbox) < 0
                || raw_join(tl, j + 1, e, &ao->host) < 0)
                return MESSAGE_NOMEM;
            buf_reset(&ao->name);
            for (k = i; k < e; k++) {
                if (tl->t[k].kind == TOK_COMMENT && tl->t[k].len > 0) {
                    if (unescape_append(&ao->name, tl->t[k].p,
                                        tl->t[k].len) < 0)
                        return MESSAGE_NOMEM;
                    have_name = 1;
                    break;
                }
            }
            r = addr_emit(ao, have_name ? &ao->name : NULL, NULL,
                          &ao->mailbox, &ao->host);
            if (r)
                return r;
            i = tok_find(tl, e, ",;");
            continue;
        }
        /* a bare word list up to ',' / ';' / end: a mailbox without a
         * domain */
        if (raw_join(tl, i, j, &ao->mailbox) < 0)
            return MESSAGE_NOMEM;
        buf_reset(&ao->host);
        if (ao->mailbox.len > 0
            && addr_emit(ao, NULL, NULL, &ao->mailbox, &ao->host))
            return MESSAGE_NOMEM;
        i = j;
    }
    if (in_group && addr_emit(ao, NULL, NULL, NULL, NULL))
        return MESSAGE_NOMEM;
    return MESSAGE_OK;
}

/* Write the address list of header `name`: "(addr...)" and 1 in
 * *written, or nothing and 0 when the field is absent or holds no
 * address. */
static int put_addresses(struct buf *out, const struct message *msg,
                         const struct part *part, const char *name,
                         int *written)
{
    struct buf v = BUF_INITIALIZER;
    struct toklist tl;
    struct addr_out ao = { out, 0, BUF_INITIALIZER, BUF_INITIALIZER,
                           BUF_INITIALIZER, BUF_INITIALIZER, NULL, NULL };
    int r;

    toklist_init(&tl);
    *written = 0;
    r = header_get(msg->base + part->hdr_off, part->hdr_len, name, &v);
    if (r <= 0) {
        r = r < 0 ? MESSAGE_NOMEM : MESSAGE_OK;
        goto done;
    }
    if (addr_tokenize(v.s, v.s + v.len, &tl) < 0) {
        r = MESSAGE_NOMEM;
        goto done;
    }
    r = addr_list_tokens(&ao, &tl);
    if (r == MESSAGE_OK && ao.count > 0) {
        r = put(out, ")");
        *written = 1;
    }
done:
    toklist_fini(&tl);
    buf_free(&v);
    buf_free(&ao.name);
    buf_free(&ao.route);
    buf_free(&ao.mailbox);
    buf_free(&ao.host);
    return r;
}

int message_addresses(const char *value, size_t len, message_address_fn *fn,
                      void *rock)
{
    struct buf v = BUF_INITIALIZER;
    struct toklist tl;
    struct addr_out ao = { NULL, 0, BUF_INITIALIZER, BUF_INITIALIZER,
                           BUF_INITIALIZER, BUF_INITIALIZER, fn, rock };
    const char *p = value;
    size_t i, plen = len;
    int r = MESSAGE_OK;

    if (fn == NULL || (value == NULL && len > 0))
        return MESSAGE_BADARG;
    toklist_init(&tl);
    /* unfold as header_get() does: CR, LF and NUL left out (a value
     * without them, an unfolded one, is read where it is) */
    for (i = 0; i < len; i++)
        if (value[i] == '\r' || value[i] == '\n' || value[i] == '\0')
            break;
    if (i < len) {
        if (buf_append(&v, value, i) < 0) {
            r = MESSAGE_NOMEM;
            goto done;
        }
        for (; i < len; i++) {
            if (value[i] == '\r' || value[i] == '\n' || value[i] == '\0')
                continue;
            if (buf_putc(&v, (unsigned char)value[i]) < 0) {
                r = MESSAGE_NOMEM;
                goto done;
            }
        }
        p = v.s;
        plen = v.len;
    }
    if (plen > 0 && addr_tokenize(p, p + plen, &tl) < 0) {
        r = MESSAGE_NOMEM;
        goto done;
    }
    r = addr_list_tokens(&ao, &tl);
done:
    toklist_fini(&tl);
    buf_free(&v);
    buf_free(&ao.name);
    buf_free(&ao.route);
    buf_free(&ao.mailbox);
    buf_free(&ao.host);
    return r;
}

/* ---- ENVELOPE ---- */

static int put_envelope(struct buf *out, const struct message *msg,
                        const struct part *mp)
{
    static const char *const addrs[] = {
        "From", "Sender", "Reply-To", "To", "Cc", "Bcc"
    };
    struct buf from = BUF_INITIALIZER;
    size_t i, mark;
    int r, written, have_from;

    if ((r = put(out, "(")) || (r = put_field(out, msg, mp, "Date"))
        || (r = put(out, " ")) || (r = put_field(out, msg, mp, "Subject")))
        goto done;
    r = put_addresses(&from, msg, mp, "From", &have_from);
    if (r)
        goto done;
    for (i = 0; i < sizeof(addrs) / sizeof(addrs[0]); i++) {
        if ((r = put(out, " ")))
            goto done;
        if (i == 0) {
            r = have_from ? (buf_append(out, from.s, from.len) < 0
                             ? MESSAGE_NOMEM : MESSAGE_OK)
                          : put(out, "NIL");
            if (r)
                goto done;
            continue;
        }
        mark = out->len;
        if ((r = put_addresses(out, msg, mp, addrs[i], &written)))
            goto done;
        if (!written) {
            buf_truncate(out, mark);
            if (i <= 2 && have_from)
                r = buf_append(out, from.s, from.len) < 0
                    ? MESSAGE_NOMEM : MESSAGE_OK;
            else
                r = put(out, "NIL");
            if (r)
                goto done;
        }
    }
    if ((r = put(out, " ")) || (r = put_field(out, msg, mp, "In-Reply-To"))
        || (r = put(out, " "))
        || (r = put_field(out, msg, mp, "Message-ID")))
        goto done;
    r = put(out, ")");
done:
    buf_free(&from);
    return r;
}

int message_write_envelope(const struct message *msg, struct buf *out)
{
    return put_envelope(out, msg, msg->root);
}

/* ---- BODY / BODYSTRUCTURE ---- */

struct param_out {
    struct buf *out;
    size_t count;
};

static int param_cb(void *rock, const char *name, size_t namelen,
                    const struct buf *value)
{
    struct param_out *po = rock;
    char *n = strndup(name, namelen);
    int r;
    if (n == NULL)
        return -1;
    upcase(n);
    r = put(po->out, po->count == 0 ? "(" : " ");
    if (r == MESSAGE_OK)
        r = put_cstring(po->out, n);
    if (r == MESSAGE_OK)
        r = put(po->out, " ");
    if (r == MESSAGE_OK)
        r = put_buf(po->out, value);
    free(n);
    po->count++;
    return r == MESSAGE_OK ? 0 : -1;
}

/* The parameters of a MIME header value: "(NAME value ...)" or NIL.
 * When type_r is not NULL it gets the value's (upper-case) type, or NULL
 * when the value does not parse; the caller frees it. */
static int put_params(struct buf *out, const char *s, size_t len,
                      int with_subtype, char **type_r)
{
    struct param_out po = { out, 0 };
    char *type = NULL, *subtype = NULL;
    int r;

    r = mime_value_parse(s, len, &type, with_subtype ? &subtype : NULL,
                         param_cb, &po);
    free(subtype);
    if (r < 0) {
        free(type);
        return MESSAGE_NOMEM;
    }
    if (type_r)
        *type_r = type;
    else
        free(type);
    if (po.count > 0)
        return put(out, ")");
    return put(out, "NIL");
}

/* Content-Disposition: "(TYPE params)" or NIL. */
static int put_disposition(struct buf *out, const struct message *msg,
                           const struct part *part)
{
    struct buf v = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    char *type = NULL;
    int r = header_get(msg->base + part->hdr_off, part->hdr_len,
                       "Content-Disposition", &v);
    if (r <= 0) {
        r = r < 0 ? MESSAGE_NOMEM : put(out, "NIL");
        goto done;
    }
    r = put_params(&tmp, v.s, v.len, 0, &type);
    if (r)
        goto done;
    if (type == NULL) {
        r = put(out, "NIL");
        goto done;
    }
    if ((r = put(out, "(")) || (r = put_cstring(out, type))
        || (r = put(out, " ")))
        goto done;
    r = buf_append(out, tmp.s, tmp.len) < 0 ? MESSAGE_NOMEM : put(out, ")");
done:
    free(type);
    buf_free(&v);
    buf_free(&tmp);
    return r;
}

/* Content-Language: a list of tags, or NIL. */
static int put_language(struct buf *out, const struct message *msg,
                        const struct part *part)
{
    struct buf v = BUF_INITIALIZER;
    struct cursor c;
    size_t count = 0;
    int r = header_get(msg->base + part->hdr_off, part->hdr_len,
                       "Content-Language", &v);
    if (r <= 0) {
        r = r < 0 ? MESSAGE_NOMEM : put(out, "NIL");
        goto done;
    }
    c.p = v.s;
    c.end = v.s + v.len;
    r = MESSAGE_OK;
    while (r == MESSAGE_OK) {
        const char *t;
        size_t n = token_get(&c, &t);
        if (n > 0) {
            r = put(out, count == 0 ? "(" : " ");
            if (r == MESSAGE_OK)
                r = message_write_nstring(out, t, n);
            count++;
        }
        cfws_skip(&c);
        if (c.p >= c.end)
            break;
        c.p++;                  /* ',' or a stray byte */
    }
    if (r == MESSAGE_OK)
        r = put(out, count ? ")" : "NIL");
done:
    buf_free(&v);
    return r;
}

static size_t count_lines(const char *p, size_t len)
{
    size_t n = 0, i;
    for (i = 0; i < len; i++)
        if (p[i] == '\n')
            n++;
    if (len > 0 && p[len - 1] != '\n')
        n++;
    return n;
}

static int put_part(struct buf *out, const struct message *msg,
                    const struct part *part, int ext);

/* Extension data after a part's fields: disposition, language, location. */
static int put_ext_tail(struct buf *out, const struct message *msg,
                        const struct part *part)
{
    int r;
    if ((r = put(out, " ")) || (r = put_disposition(out, msg, part))
        || (r = put(out, " ")) || (r = put_language(out, msg, part))
        || (r = put(out, " ")))
        return r;
    return put_field(out, msg, part, "Content-Location");
}

static int put_ct_params(struct buf *out, const struct message *msg,
                         const struct part *part)
{
    struct buf v = BUF_INITIALIZER;
    int r;
    if (part->default_ct)
        return put(out, "(\"CHARSET\" \"US-ASCII\")");
    r = header_get(msg->base + part->hdr_off, part->hdr_len,
                   "Content-Type", &v);
    if (r < 0)
        r = MESSAGE_NOMEM;
    else if (r == 0)
        r = put(out, "NIL");
    else
        r = put_params(out, v.s, v.len, 1, NULL);
    buf_free(&v);
    return r;
}

static int put_encoding(struct buf *out, const struct message *msg,
                        const struct part *part)
{
    struct buf v = BUF_INITIALIZER;
    struct cursor c;
    const char *t;
    size_t n = 0;
    char *e;
    int r = header_get(msg->base + part->hdr_off, part->hdr_len,
                       "Content-Transfer-Encoding", &v);
    if (r < 0)
        goto nomem;
    if (r > 0) {
        c.p = v.s;
        c.end = v.s + v.len;
        n = token_get(&c, &t);
    }
    if (n == 0) {
        buf_free(&v);
        return put(out, "\"7BIT\"");
    }
    e = strndup(t, n);
    if (e == NULL)
        goto nomem;
    upcase(e);
    r = put_cstring(out, e);
    free(e);
    buf_free(&v);
    return r;
nomem:
    buf_free(&v);
    return MESSAGE_NOMEM;
}

static int put_part(struct buf *out, const struct message *msg,
                    const struct part *part, int ext)
{
    const struct part *c;
    int r;

    if ((r = put(out, "(")))
        return r;
    if (part->multipart) {
        if (part->child == NULL) {
            r = put(out, ext ? "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\")"
                    " NIL NIL \"7BIT\" 0 0 NIL NIL NIL NIL)"
                    : "(\"TEXT\" \"PLAIN\" (\"CHARSET\" \"US-ASCII\")"
                    " NIL NIL \"7BIT\" 0 0)");
            if (r)
                return r;
        }
        for (c = part->child; c; c = c->next)
            if ((r = put_part(out, msg, c, ext)))
                return r;
        if ((r = put(out, " ")) || (r = put_cstring(out, part->subtype)))
            return r;
        if (ext && ((r = put(out, " ")) || (r = put_ct_params(out, msg, part))
                    || (r = put_ext_tail(out, msg, part))))
            return r;
        return put(out, ")");
    }
    if ((r = put_cstring(out, part->type)) || (r = put(out, " "))
        || (r = put_cstring(out, part->subtype)) || (r = put(out, " "))
        || (r = put_ct_params(out, msg, part)) || (r = put(out, " "))
        || (r = put_field(out, msg, part, "Content-ID"))
        || (r = put(out, " "))
        || (r = put_field(out, msg, part, "Content-Description"))
        || (r = put(out, " ")) || (r = put_encoding(out, msg, part)))
        return r;
    if (buf_printf(out, " %zu", part->body_len) < 0)
        return MESSAGE_NOMEM;
    if (part->encap) {
        if ((r = put(out, " ")) || (r = put_envelope(out, msg, part->encap))
            || (r = put(out, " "))
            || (r = put_part(out, msg, part->encap, ext)))
            return r;
    }
    if (part->encap || strcmp(part->type, "TEXT") == 0) {
        if (buf_printf(out, " %zu", count_lines(msg->base + part->body_off,
                                                part->body_len)) < 0)
            return MESSAGE_NOMEM;
    }
    if (ext && ((r = put(out, " NIL")) || (r = put_ext_tail(out, msg, part))))
        return r;
    return put(out, ")");
}

int message_write_body(const struct message *msg, int extended,
                       struct buf *out)
{
    return put_part(out, msg, msg->root, extended);
}

/* ---- sections ---- */

/* Follow the part numbers; returns the part they name, or NULL when there
 * is no such part.  Part 1 of a non-multipart (encapsulated) message is
 * that message's own node: its body is the section's content and its
 * header the part's MIME header. */
static const struct part *section_resolve(const struct message *msg,
                                          const uint32_t *num, size_t n)
{
    const struct part *ctx = msg->root, *node = NULL;
    size_t i;

    for (i = 0; i < n; i++) {
        if (ctx->multipart) {
            uint32_t k;
            node = ctx->child;
            for (k = 1; node && k < num[i]; k++)
                node = node->next;
            if (num[i] == 0 || node == NULL)
                return NULL;
        } else if (num[i] == 1) {
            node = ctx;         /* part 1 of a non-multipart message */
        } else {
            return NULL;
        }
        if (i + 1 < n) {
            if (node->encap && node != ctx)
                ctx = node->encap;
            else if (node->multipart && node != ctx)
                ctx = node;
            else if (node == ctx && node->encap)
                ctx = node->encap;
            else
                return NULL;
        }
    }
    return node;
}

static int fields_match(const struct message_section *sec, const char *name,
                        size_t len)
{
    size_t i;
    for (i = 0; i < sec->nfields; i++)
        if (sec->fields[i] && name_eq(name, len, sec->fields[i]))
            return 1;
    return 0;
}

static int header_fields(const struct message *msg, const struct part *mp,
                         const struct message_section *sec, int want,
                         struct buf *out)
{
    const char *p = msg->base + mp->hdr_off, *end = p + mp->hdr_len;
    struct field f;

    while (field_next(&p, end, &f)) {
        int match = f.namelen > 0 && fields_match(sec, f.name, f.namelen);
        if (match != want)
            continue;
        if (buf_append(out, f.raw, (size_t)(f.raw_end - f.raw)) < 0)
            return MESSAGE_NOMEM;
        /* a last line without its line end still ends with CRLF */
        if (f.raw_end == f.raw || f.raw_end[-1] != '\n')
            if (buf_appendcstr(out, "\r\n") < 0)
                return MESSAGE_NOMEM;
    }
    return put(out, "\r\n");
}

int message_get_section(const struct message *msg,
                        const struct message_section *sec, struct buf *out)
{
    const struct part *node, *mp;

    if (msg == NULL || sec == NULL || out == NULL
        || (sec->npart > 0 && sec->part == NULL))
        return MESSAGE_BADARG;
    if ((sec->kind == MESSAGE_SECTION_HEADER_FIELDS
         || sec->kind == MESSAGE_SECTION_HEADER_FIELDS_NOT)
        && sec->nfields > 0 && sec->fields == NULL)
        return MESSAGE_BADARG;
    if (sec->kind == MESSAGE_SECTION_MIME && sec->npart == 0)
        return MESSAGE_BADARG;
    if (sec->kind > MESSAGE_SECTION_MIME)
        return MESSAGE_BADARG;

    if (sec->npart == 0) {
        node = msg->root;
        mp = msg->root;
    } else {
        node = section_resolve(msg, sec->part, sec->npart);
        if (node == NULL)
            return MESSAGE_OK;
        mp = node->encap;       /* for HEADER / TEXT */
    }

    switch (sec->kind) {
    case MESSAGE_SECTION_CONTENT:
        if (sec->npart == 0)
            return buf_append(out, msg->base, msg->len) < 0
                   ? MESSAGE_NOMEM : MESSAGE_OK;
        return buf_append(out, msg->base + node->body_off, node->body_len) < 0
               ? MESSAGE_NOMEM : MESSAGE_OK;
    case MESSAGE_SECTION_MIME:
        return buf_append(out, msg->base + node->hdr_off, node->hdr_len) < 0
               ? MESSAGE_NOMEM : MESSAGE_OK;
    case MESSAGE_SECTION_HEADER:
        if (mp == NULL)
            return MESSAGE_OK;
        return buf_append(out, msg->base + mp->hdr_off, mp->hdr_len) < 0
               ? MESSAGE_NOMEM : MESSAGE_OK;
    case MESSAGE_SECTION_TEXT:
        if (mp == NULL)
            return MESSAGE_OK;
        return buf_append(out, msg->base + mp->body_off, mp->body_len) < 0
               ? MESSAGE_NOMEM : MESSAGE_OK;
    case MESSAGE_SECTION_HEADER_FIELDS:
    case MESSAGE_SECTION_HEADER_FIELDS_NOT:
        if (mp == NULL)
            return MESSAGE_OK;
        return header_fields(msg, mp, sec,
                             sec->kind == MESSAGE_SECTION_HEADER_FIELDS, out);
    }
    return MESSAGE_BADARG;
}

int message_write_section(const struct message *msg,
                          const struct message_section *sec,
                          size_t origin, size_t count, struct buf *out)
{
    struct buf tmp = BUF_INITIALIZER;
    size_t n = 0;
    int r = message_get_section(msg, sec, &tmp);

    if (r == MESSAGE_OK) {
        if (origin < tmp.len) {
            n = tmp.len - origin;
            if (count < n)
                n = count;
        }
        if (buf_printf(out, "{%zu}\r\n", n) < 0
            || (n > 0 && buf_append(out, tmp.s + origin, n) < 0)) {
            r = MESSAGE_NOMEM;
        } else {
            /* RFC 3501 9 (and RFC 9051 9): no NUL in a literal; the
             * octets stay where they are, so sizes and partial
             * offsets keep their meaning (BINARY sends them as they
             * are, in a literal8) */
            char *p = out->s + out->len - n, *end = out->s + out->len;

            while ((p = memchr(p, '\0', (size_t)(end - p))) != NULL)
                *p++ = (char)0x80;
        }
    }
    buf_free(&tmp);
    return r;
}

/* ---- BINARY (RFC 3516): transfer decoding ---- */

static int b64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

int message_decode_base64(const char *s, size_t len, struct buf *out)
{
    uint32_t acc = 0;
    int bits = 0;
    size_t i;

    for (i = 0; i < len; i++) {
        int v;

        if (s[i] == '=')
            break;
        v = b64_value((unsigned char)s[i]);
        if (v < 0)
            continue;
        acc = ((acc << 6) | (uint32_t)v) & 0xffffff;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (buf_putc(out, (int)((acc >> bits) & 0xff)) < 0)
                return MESSAGE_NOMEM;
        }
    }
    return MESSAGE_OK;
}

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

int message_decode_q(const char *s, size_t len, struct buf *out)
{
    size_t i = 0;

    while (i < len) {
        unsigned char c = (unsigned char)s[i];

        if (c == '=' && i + 2 < len && hex_value((unsigned char)s[i + 1]) >= 0
            && hex_value((unsigned char)s[i + 2]) >= 0) {
            c = (unsigned char)(hex_value((unsigned char)s[i + 1]) * 16
                                + hex_value((unsigned char)s[i + 2]));
            i += 2;
        } else if (c == '_') {
            c = ' ';
        }
        if (buf_putc(out, c) < 0)
            return MESSAGE_NOMEM;
        i++;
    }
    return MESSAGE_OK;
}

int message_decode_qp(const char *s, size_t len, struct buf *out)
{
    size_t i = 0, keep = out->len;   /* bytes before keep are not padding */

    while (i < len) {
        unsigned char c = (unsigned char)s[i];

        if (c == '=') {
            size_t j = i + 1;

            if (i + 2 < len && hex_value((unsigned char)s[i + 1]) >= 0
                && hex_value((unsigned char)s[i + 2]) >= 0) {
                if (buf_putc(out, hex_value((unsigned char)s[i + 1]) * 16
                                  + hex_value((unsigned char)s[i + 2])) < 0)
                    return MESSAGE_NOMEM;
                keep = out->len;
                i += 3;
                continue;
            }
            /* a soft line break: '=', transport padding, the line end */
            while (j < len && (s[j] == ' ' || s[j] == '\t'))
                j++;
            if (j + 1 < len && s[j] == '\r' && s[j + 1] == '\n') {
                i = j + 2;
                keep = out->len;
                continue;
            }
            if (j < len && s[j] == '\n') {
                i = j + 1;
                keep = out->len;
                continue;
            }
            if (j == len) {
                i = j;
                continue;
            }
            /* a malformed '=' stays as it is */
        } else if (c == '\n' || (c == '\r' && i + 1 < len
                                 && s[i + 1] == '\n')) {
            /* a hard line break: white space before it was added in
             * transport (RFC 2045 6.7 rule 3) */
            while (out->len > keep && (out->s[out->len - 1] == ' '
                                       || out->s[out->len - 1] == '\t'))
                out->len--;
            if (c == '\r') {
                if (buf_append(out, "\r\n", 2) < 0)
                    return MESSAGE_NOMEM;
                i += 2;
            } else {
                if (buf_putc(out, '\n') < 0)
                    return MESSAGE_NOMEM;
                i++;
            }
            keep = out->len;
            continue;
        }
        if (buf_putc(out, c) < 0)
            return MESSAGE_NOMEM;
        i++;
    }
    while (out->len > keep && (out->s[out->len - 1] == ' '
                               || out->s[out->len - 1] == '\t'))
        out->len--;
    return MESSAGE_OK;
}

/* The Content-Transfer-Encoding of a part: 0 identity (absent, 7bit,
 * 8bit, binary), 1 base64, 2 quoted-printable, -1 unknown, -2 out of
 * memory. */
static int part_cte(const struct message *msg, const struct part *part)
{
    struct buf v = BUF_INITIALIZER;
    struct cursor c;
    const char *t = NULL;
    size_t n = 0;
    int r = header_get(msg->base + part->hdr_off, part->hdr_len,
                       "Content-Transfer-Encoding", &v);

    if (r < 0) {
        buf_free(&v);
        return -2;
    }
    if (r > 0) {
        /* as BODYSTRUCTURE shows it: the first token, 7BIT when none */
        c.p = v.s;
        c.end = v.s + v.len;
        n = token_get(&c, &t);
    }
    if (n == 0 || name_eq(t, n, "7bit") || name_eq(t, n, "8bit")
        || name_eq(t, n, "binary"))
        r = 0;
    else if (name_eq(t, n, "base64"))
        r = 1;
    else if (name_eq(t, n, "quoted-printable"))
        r = 2;
    else
        r = -1;
    buf_free(&v);
    return r;
}

int message_get_binary(const struct message *msg, const uint32_t *part,
                       size_t npart, struct buf *out, int *exists_r)
{
    const struct part *node;
    const char *body;
    int cte;

    if (exists_r)
        *exists_r = 0;
    if (msg == NULL || out == NULL || (npart > 0 && part == NULL))
        return MESSAGE_BADARG;
    if (npart == 0) {
        /* the whole message: a message has no transfer encoding of its
         * own, it is sent as stored */
        if (exists_r)
            *exists_r = 1;
        return buf_append(out, msg->base, msg->len) < 0 ? MESSAGE_NOMEM
                                                       : MESSAGE_OK;
    }
    node = section_resolve(msg, part, npart);
    if (node == NULL)
        return MESSAGE_OK;
    if (exists_r)
        *exists_r = 1;
    cte = part_cte(msg, node);
    if (cte == -2)
        return MESSAGE_NOMEM;
    /* a multipart or message/rfc822 part may only have an identity
     * encoding (RFC 2045 6.4): it is sent as stored, the parts inside
     * it are not decoded */
    if (cte < 0 || ((node->multipart || node->encap) && cte != 0))
        return MESSAGE_UNKNOWN_CTE;
    body = msg->base + node->body_off;
    if (cte == 1)
        return message_decode_base64(body, node->body_len, out);
    if (cte == 2)
        return message_decode_qp(body, node->body_len, out);
    return buf_append(out, body, node->body_len) < 0 ? MESSAGE_NOMEM
                                                     : MESSAGE_OK;
}
