/*
 * sieve_exec.c - the executor: walks a compiled script for one message and
 * one recipient and collects actions.
 *
 * Invariants: the script is never modified (executions may run in
 * parallel); every string with variables is expanded into a scratch
 * buffer; every loop over message data is bounded (max_headers values per
 * name, max_match_len bytes per :matches/:regex value, max_match_steps in
 * all); the action list only grows through add_action(), which enforces
 * max_actions.  On a runtime error the collected actions are dropped and
 * replaced by one implicit keep (RFC 5228 2.10.6); on a temporary failure
 * of a callback the list is left empty.
 */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "sieve/sieve_tree.h"
#include "sieve/sieve_ext.h"
#include "store/message.h"

/* most scripts on the include stack, whatever max_include_depth says */
#define SIEVE_INCLUDE_STACK 64

struct var {
    char *name;     /* lower-case */
    char *value;
};

struct scope {
    struct var *v;
    size_t n;
};

struct hedit {
    char *name;
    struct strarray raw;
    struct strarray dec;
};

struct frame {
    const struct sieve_script *s;
    struct scope locals;
    struct strarray globals;   /* names declared global here */
    int returned;
};

#define EXEC_ADDR_MEMO 8

struct exec {
    const struct sieve_limits *lim;
    const struct sieve_message_ctx *ctx;
    struct sieve_actions *acts;
    struct buf *errmsg;
    int rc;
    int keep_cancelled;
    struct strarray flags;       /* imap4flags' internal variable */
    struct strarray matchvars;
    struct scope globals;
    unsigned long steps;
    unsigned nredirects, nincludes, depth;
    struct hedit *edits;
    size_t nedits;
    struct strarray once;
    /* the scripts being executed, outermost first: an include of one of
     * them is a loop (RFC 6609 3.2); depth is bounded, so is this */
    const struct sieve_script *stack[SIEVE_INCLUDE_STACK];
    size_t nstack;
    int stopped;
    time_t now;
    /* address parts of recently parsed header values: scripts test the
     * same From/To in many rules, and a parse is a pure function of the
     * value and the part */
    struct addr_memo {
        char *value;
        int part;
        struct strarray parts;
    } addr_memo[EXEC_ADDR_MEMO];
    unsigned addr_memo_next;
};

#define HALT(ex) ((ex)->rc != SIEVE_OK || (ex)->stopped)

static int rt_error(struct exec *ex, unsigned line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int rt_error(struct exec *ex, unsigned line, const char *fmt, ...)
{
    va_list ap;

    if (ex->rc != SIEVE_OK)
        return -1;
    ex->rc = SIEVE_ERUNTIME;
    if (ex->errmsg) {
        buf_reset(ex->errmsg);
        buf_printf(ex->errmsg, "line %u: ", line);
        va_start(ap, fmt);
        buf_vprintf(ex->errmsg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int rt_nomem(struct exec *ex)
{
    if (ex->rc == SIEVE_OK || ex->rc == SIEVE_ERUNTIME)
        ex->rc = SIEVE_ENOMEM;
    return -1;
}

static int rt_temp(struct exec *ex, unsigned line, const char *what)
{
    if (ex->rc == SIEVE_OK) {
        ex->rc = SIEVE_ETEMP;
        if (ex->errmsg) {
            buf_reset(ex->errmsg);
            buf_printf(ex->errmsg, "line %u: temporary failure: %s", line,
                       what);
        }
    }
    return -1;
}

/* ---- variables ---------------------------------------------------------- */

static struct var *scope_find(struct scope *sc, const char *name)
{
    size_t i;

    for (i = 0; i < sc->n; i++)
        if (strcasecmp(sc->v[i].name, name) == 0)
            return &sc->v[i];
    return NULL;
}

static void scope_fini(struct scope *sc)
{
    size_t i;

    for (i = 0; i < sc->n; i++) {
        free(sc->v[i].name);
        free(sc->v[i].value);
    }
    free(sc->v);
    sc->v = NULL;
    sc->n = 0;
}

static struct scope *scope_of(struct exec *ex, struct frame *fr,
                              const char **name)
{
    if (strncasecmp(*name, "global.", 7) == 0) {
        *name += 7;
        return &ex->globals;
    }
    if (strarray_find(&fr->globals, *name) >= 0)
        return &ex->globals;
    {
        size_t i;
        for (i = 0; i < fr->globals.count; i++)
            if (strcasecmp(fr->globals.data[i], *name) == 0)
                return &ex->globals;
    }
    return &fr->locals;
}

static const char *var_get(struct exec *ex, struct frame *fr,
                           const char *name)
{
    struct scope *sc = scope_of(ex, fr, &name);
    struct var *v = scope_find(sc, name);

    return v ? v->value : "";
}

/* cut to max bytes on a UTF-8 character boundary */
static size_t utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
        max--;
    return max;
}

static int var_set(struct exec *ex, struct frame *fr, unsigned line,
                   const char *name, const char *value, size_t len)
{
    struct scope *sc = scope_of(ex, fr, &name);
    struct var *v = scope_find(sc, name);
    char *copy;

    len = utf8_cut(value, len, ex->lim->max_variable_len);
    copy = strndup(value, len);
    if (!copy)
        return rt_nomem(ex);
    if (!v) {
        struct var *nv;
        char *nm;
        size_t i;
        if (sc->n >= ex->lim->max_variables) {
            free(copy);
            return rt_error(ex, line, "more than %u variables",
                            ex->lim->max_variables);
        }
        nv = realloc(sc->v, (sc->n + 1) * sizeof(*nv));
        nm = strdup(name);
        if (!nv || !nm) {
            if (nv)
                sc->v = nv;
            free(nm);
            free(copy);
            return rt_nomem(ex);
        }
        for (i = 0; nm[i]; i++)
            nm[i] = (char)tolower((unsigned char)nm[i]);
        sc->v = nv;
        v = &sc->v[sc->n++];
        v->name = nm;
        v->value = NULL;
    }
    free(v->value);
    v->value = copy;
    return 0;
}

/* expand ${...} references (RFC 5229 3) */
static int expand(struct exec *ex, struct frame *fr, const struct sv_str *str,
                  struct buf *out)
{
    size_t i = 0;

    buf_reset(out);
    if (!str->has_var)
        return buf_append(out, str->s, str->len) < 0 ? rt_nomem(ex) : 0;
    while (i < str->len) {
        if (str->s[i] == '$' && i + 1 < str->len && str->s[i + 1] == '{') {
            size_t j = i + 2, k;
            int digits = 1, ok = 1, start = 1;
            while (j < str->len && str->s[j] != '}' && j - i < 260) {
                unsigned char ch = (unsigned char)str->s[j];
                if (!isdigit(ch))
                    digits = 0;
                if (!(isalnum(ch) || ch == '_' || ch == '.'))
                    ok = 0;
                if (ch == '.') {
                    if (start)
                        ok = 0;
                    start = 1;
                } else {
                    start = 0;
                }
                j++;
            }
            if (j < str->len && str->s[j] == '}' && j > i + 2 && ok &&
                !start) {
                char name[260];
                k = j - (i + 2);
                memcpy(name, str->s + i + 2, k);
                name[k] = '\0';
                if (digits) {
                    unsigned long n = strtoul(name, NULL, 10);
                    const char *v = n < ex->matchvars.count ?
                                    ex->matchvars.data[n] : "";
                    if (buf_appendcstr(out, v) < 0)
                        return rt_nomem(ex);
                    i = j + 1;
                    continue;
                }
                if (!isdigit((unsigned char)name[0]) &&
                    (!strchr(name, '.') ||
                     strncasecmp(name, "global.", 7) == 0)) {
                    if (buf_appendcstr(out, var_get(ex, fr, name)) < 0)
                        return rt_nomem(ex);
                    i = j + 1;
                    continue;
                }
            }
        }
        if (buf_putc(out, str->s[i]) < 0)
            return rt_nomem(ex);
        i++;
    }
    return 0;
}

/* expand into a new malloc'd string */
static char *expand_dup(struct exec *ex, struct frame *fr,
                        const struct sv_str *str)
{
    struct buf b = BUF_INITIALIZER;
    char *r;

    if (expand(ex, fr, str, &b) < 0) {
        buf_free(&b);
        return NULL;
    }
    buf_cstring(&b);
    r = buf_release(&b);
    if (!r)
        r = strdup("");
    if (!r)
        rt_nomem(ex);
    return r;
}

static int expand_list(struct exec *ex, struct frame *fr,
                       const struct sv_strlist *sl, struct strarray *out)
{
    size_t i;

    for (i = 0; i < sl->n; i++) {
        char *s = expand_dup(ex, fr, &sl->v[i]);
        if (!s)
            return -1;
        if (strarray_appendm(out, s) < 0)
            return rt_nomem(ex);
    }
    return 0;
}

/* ---- actions ------------------------------------------------------------ */

static struct sieve_action *add_action(struct exec *ex, unsigned line,
                                       enum sieve_action_type type)
{
    struct sieve_actions *a = ex->acts;
    struct sieve_action *act;

    /* the implicit keep (line 0) is always room for */
    if (line != 0 && a->count >= ex->lim->max_actions) {
        rt_error(ex, line, "more than %u actions", ex->lim->max_actions);
        return NULL;
    }
    if (a->count == a->alloc) {
        size_t n = a->alloc ? a->alloc * 2 : 8;
        struct sieve_action *nv = realloc(a->v, n * sizeof(*nv));
        if (!nv) {
            rt_nomem(ex);
            return NULL;
        }
        a->v = nv;
        a->alloc = n;
    }
    act = &a->v[a->count++];
    memset(act, 0, sizeof(*act));
    act->type = type;
    act->line = line;
    return act;
}

static struct sieve_action *find_action(struct exec *ex,
                                        enum sieve_action_type type,
                                        const char *mailbox)
{
    size_t i;

    for (i = 0; i < ex->acts->count; i++) {
        struct sieve_action *a = &ex->acts->v[i];
        if (a->type != type)
            continue;
        if (!mailbox)
            return a;
        if (type == SIEVE_ACTION_FILEINTO && strcmp(a->mailbox, mailbox) == 0)
            return a;
        if (type == SIEVE_ACTION_REDIRECT &&
            strcasecmp(a->address, mailbox) == 0)
            return a;
    }
    return NULL;
}

/* add flags (space-separated words) to a set, case-insensitively unique */
/* one flag into the set unless it is there (case-insensitively) */
static int flags_add_one(struct strarray *set, const char *flag)
{
    size_t j;

    for (j = 0; j < set->count; j++)
        if (strcasecmp(set->data[j], flag) == 0)
            return 0;
    return strarray_append(set, flag);
}

static int flags_add(struct strarray *set, const char *s)
{
    struct strarray words = STRARRAY_INITIALIZER;
    size_t i;

    if (*s && !strpbrk(s, " \t\r\n"))
        return flags_add_one(set, s);   /* one flag: no split */
    if (strarray_split(&words, s, " \t\r\n") < 0)
        return -1;
    for (i = 0; i < words.count; i++)
        if (flags_add_one(set, words.data[i]) < 0) {
            strarray_fini(&words);
            return -1;
        }
    strarray_fini(&words);
    return 0;
}

static void flags_remove(struct strarray *set, const char *s)
{
    struct strarray words = STRARRAY_INITIALIZER;
    size_t i, j;

    if (strarray_split(&words, s, " \t\r\n") < 0)
        return;
    for (i = 0; i < words.count; i++)
        for (j = 0; j < set->count; j++)
            if (strcasecmp(set->data[j], words.data[i]) == 0) {
                strarray_remove(set, j);
                break;
            }
    strarray_fini(&words);
}

/* the flags a keep / fileinto stores: :flags given, or the internal
 * variable */
static int action_flags(struct exec *ex, struct frame *fr,
                        const struct sv_node *n, struct strarray *out)
{
    size_t i;

    if (n->has_flags) {
        struct strarray l = STRARRAY_INITIALIZER;

        for (i = 0; i < n->flags->n && !n->flags->v[i].has_var; i++)
            ;
        if (i == n->flags->n) {
            /* no variables: the strings as they are, not copied first */
            for (i = 0; i < n->flags->n; i++)
                if (flags_add(out, n->flags->v[i].s) < 0)
                    return rt_nomem(ex);
            return 0;
        }
        if (expand_list(ex, fr, n->flags, &l) < 0) {
            strarray_fini(&l);
            return -1;
        }
        for (i = 0; i < l.count; i++)
            if (flags_add(out, l.data[i]) < 0) {
                strarray_fini(&l);
                return rt_nomem(ex);
            }
        strarray_fini(&l);
        return 0;
    }
    for (i = 0; i < ex->flags.count; i++)
        if (flags_add(out, ex->flags.data[i]) < 0)
            return rt_nomem(ex);
    return 0;
}

static int has_conflict_with_reject(struct exec *ex)
{
    size_t i;

    for (i = 0; i < ex->acts->count; i++) {
        enum sieve_action_type t = ex->acts->v[i].type;
        if ((t == SIEVE_ACTION_KEEP && !ex->acts->v[i].implicit) ||
            t == SIEVE_ACTION_FILEINTO || t == SIEVE_ACTION_REDIRECT ||
            t == SIEVE_ACTION_VACATION)
            return 1;
    }
    return 0;
}

/* ---- the message -------------------------------------------------------- */

static struct hedit *edit_find(struct exec *ex, const char *name)
{
    size_t i;

    for (i = 0; i < ex->nedits; i++)
        if (strcasecmp(ex->edits[i].name, name) == 0)
            return &ex->edits[i];
    return NULL;
}

static int fetch_header(struct exec *ex, unsigned line, const char *name,
                        int decoded, struct strarray *out)
{
    struct hedit *e = edit_find(ex, name);
    int rc;

    if (e) {
        const struct strarray *src = decoded ? &e->dec : &e->raw;
        size_t i;
        for (i = 0; i < src->count; i++)
            if (strarray_append(out, src->data[i]) < 0)
                return rt_nomem(ex);
        return 0;
    }
    if (!ex->ctx->header)
        return 0;
    rc = ex->ctx->header(ex->ctx->rock, name, decoded, out);
    if (rc < 0)
        return rt_temp(ex, line, "header");
    while (out->count > ex->lim->max_headers)
        strarray_remove(out, out->count - 1);
    return 0;
}

static struct hedit *edit_open(struct exec *ex, unsigned line,
                               const char *name)
{
    struct hedit *e = edit_find(ex, name), *nv;
    struct strarray raw = STRARRAY_INITIALIZER, dec = STRARRAY_INITIALIZER;
    char *nm;

    if (e)
        return e;
    /* the values as the message has them, before this name's first edit */
    if (fetch_header(ex, line, name, 0, &raw) < 0 ||
        fetch_header(ex, line, name, 1, &dec) < 0)
        goto fail;
    while (dec.count < raw.count)
        if (strarray_append(&dec, raw.data[dec.count]) < 0)
            goto nomem;
    while (dec.count > raw.count)
        strarray_remove(&dec, dec.count - 1);
    nv = realloc(ex->edits, (ex->nedits + 1) * sizeof(*nv));
    if (!nv)
        goto nomem;
    ex->edits = nv;
    nm = strdup(name);
    if (!nm)
        goto nomem;
    e = &ex->edits[ex->nedits++];
    e->name = nm;
    e->raw = raw;
    e->dec = dec;
    return e;
nomem:
    rt_nomem(ex);
fail:
    strarray_fini(&raw);
    strarray_fini(&dec);
    return NULL;
}

/* ---- tests -------------------------------------------------------------- */

struct addrpart_rock {
    struct exec *ex;
    int part;
    char sep;
    struct strarray *out;
    int nomem;
};

static int addr_part(struct addrpart_rock *r, const char *local,
                     size_t llen, const char *host, size_t hlen)
{
    /* the part is a (a, alen) piece, then '@' and (b, blen) for :all:
     * one allocation of its size */
    const char *a = local, *b = host, *sep;
    size_t alen = llen, blen = 0, at = 0;
    char *str;

    switch (r->part) {
    case SV_ADDR_ALL:
        if (hlen) {
            at = 1;
            blen = hlen;
        }
        break;
    case SV_ADDR_LOCAL:
        break;
    case SV_ADDR_DOMAIN:
        if (!hlen && !llen)
            return 0;
        a = host;
        alen = hlen;
        break;
    case SV_ADDR_USER:
        sep = memchr(local, r->sep, llen);
        if (sep)
            alen = (size_t)(sep - local);
        break;
    case SV_ADDR_DETAIL:
        sep = memchr(local, r->sep, llen);
        if (!sep)
            return 0;
        a = sep + 1;
        alen = llen - (size_t)(sep + 1 - local);
        break;
    default:
        alen = 0;
        break;
    }
    str = malloc(alen + at + blen + 1);
    if (!str) {
        r->nomem = 1;
        return 0;
    }
    if (alen)
        memcpy(str, a, alen);
    if (at)
        str[alen] = '@';
    if (blen)
        memcpy(str + alen + at, b, blen);
    str[alen + at + blen] = '\0';
    if (strarray_appendm(r->out, str) < 0)
        r->nomem = 1;
    return 0;
}

static int addr_cb(void *rock, const char *name, size_t namelen,
                   const char *mailbox, size_t mailboxlen, const char *host,
                   size_t hostlen)
{
    (void)name;
    (void)namelen;
    return addr_part(rock, mailbox, mailboxlen, host, hostlen);
}

/* the address parts of an address-list value, parsed once per execution
 * for each value and part (struct exec's addr_memo): read only, valid
 * until the next call; NULL on error (ex->rc set) */
static const struct strarray *addr_memo_get(struct exec *ex,
                                            const char *value, int part)
{
    struct addrpart_rock r;
    struct addr_memo *m = NULL;
    size_t i;

    for (i = 0; i < EXEC_ADDR_MEMO; i++)
        if (ex->addr_memo[i].value && ex->addr_memo[i].part == part &&
            strcmp(ex->addr_memo[i].value, value) == 0) {
            m = &ex->addr_memo[i];
            break;
        }
    if (!m) {
        m = &ex->addr_memo[ex->addr_memo_next++ % EXEC_ADDR_MEMO];
        free(m->value);
        strarray_fini(&m->parts);
        m->part = part;
        m->value = strdup(value);
        if (!m->value) {
            rt_nomem(ex);
            return NULL;
        }
        r.ex = ex;
        r.part = part;
        r.sep = ex->ctx->subaddress_sep ? ex->ctx->subaddress_sep : '+';
        r.out = &m->parts;
        r.nomem = 0;
        if (message_addresses(value, strlen(value), addr_cb, &r) !=
                MESSAGE_OK || r.nomem) {
            free(m->value);
            m->value = NULL;
            strarray_fini(&m->parts);
            rt_nomem(ex);
            return NULL;
        }
    }
    return &m->parts;
}

/* append the address parts of an address-list value */
static int value_addresses(struct exec *ex, const char *value, int part,
                           struct strarray *out)
{
    const struct strarray *parts = addr_memo_get(ex, value, part);
    size_t i;

    if (!parts)
        return -1;
    for (i = 0; i < parts->count; i++)
        if (strarray_append(out, parts->data[i]) < 0)
            return rt_nomem(ex);
    return 0;
}

static int match_values(struct exec *ex, struct frame *fr,
                        const struct sv_node *n, const struct strarray *vals,
                        const struct sv_strlist *keys);

/* The common header or address test (one header name without variables,
 * no :index, not edited by the script): its decoded values borrowed from
 * the message context into *view (read only, never freed; valid until the
 * next header lookup).  1 done, 0 not this case, -1 error. */
static int header_view(struct exec *ex, const struct sv_node *n,
                       const struct sv_strlist *names, struct strarray *view)
{
    const char *const *v;
    size_t nv;

    if (!ex->ctx->header_view || names->n != 1 || names->v[0].has_var ||
        n->index || edit_find(ex, names->v[0].s))
        return 0;
    if (ex->ctx->header_view(ex->ctx->rock, names->v[0].s, &v, &nv) < 0)
        return rt_temp(ex, n->line, "header");
    memset(view, 0, sizeof(*view));
    view->data = (char **)v;
    view->count = nv < ex->lim->max_headers ? nv : ex->lim->max_headers;
    return 1;
}

/* the header values a header/address/date test looks at, :index applied */
static int test_header_values(struct exec *ex, struct frame *fr,
                              const struct sv_node *n,
                              const struct sv_strlist *names,
                              struct strarray *out)
{
    size_t i;
    struct buf nb = BUF_INITIALIZER;

    for (i = 0; i < names->n; i++) {
        struct strarray vals = STRARRAY_INITIALIZER;
        const char *name = names->v[i].s;
        size_t k;
        if (names->v[i].has_var) {
            if (expand(ex, fr, &names->v[i], &nb) < 0) {
                buf_free(&nb);
                return -1;
            }
            name = buf_cstring(&nb);
            /* address: a name made at run time that holds no addresses
             * has no values (a constant one was refused at compile
             * time) */
            if (n->id == SV_T_ADDRESS && !sieve_check_address_header(name))
                continue;
        }
        if (!n->index && out->count == 0) {
            /* the common case: straight into out, no copy */
            if (fetch_header(ex, n->line, name, 1, out) < 0) {
                buf_free(&nb);
                return -1;
            }
            continue;
        }
        if (fetch_header(ex, n->line, name, 1, &vals) < 0) {
            strarray_fini(&vals);
            buf_free(&nb);
            return -1;
        }
        if (n->index) {
            size_t idx = n->index;
            if (idx <= vals.count) {
                size_t pick = n->last ? vals.count - idx : idx - 1;
                if (strarray_append(out, vals.data[pick]) < 0)
                    goto nomem;
            }
        } else {
            for (k = 0; k < vals.count; k++)
                if (strarray_append(out, vals.data[k]) < 0)
                    goto nomem;
        }
        strarray_fini(&vals);
        continue;
nomem:
        strarray_fini(&vals);
        buf_free(&nb);
        return rt_nomem(ex);
    }
    buf_free(&nb);
    return 0;
}

/* keys of a test used without a copy when none has a variable */
#define MATCH_FIXED_KEYS 16

static int match_values(struct exec *ex, struct frame *fr,
                        const struct sv_node *n, const struct strarray *vals,
                        const struct sv_strlist *keys)
{
    struct buf kb = BUF_INITIALIZER;
    struct sv_matchctx mc;
    size_t i, k;
    int r = 0;

    memset(&mc, 0, sizeof(mc));
    mc.steps = &ex->steps;
    mc.max_steps = ex->lim->max_match_steps;
    mc.max_len = ex->lim->max_match_len;
    if (fr->s->uses_variables &&
        (n->match == SV_MATCH_MATCHES || n->match == SV_MATCH_REGEX))
        mc.vars = &ex->matchvars;
    if (n->match == SV_MATCH_COUNT) {
        char num[32];
        snprintf(num, sizeof(num), "%zu", vals->count);
        for (k = 0; k < keys->n && r == 0; k++) {
            if (expand(ex, fr, &keys->v[k], &kb) < 0) {
                buf_free(&kb);
                return -1;
            }
            r = sieve_relop_holds(n->relop,
                                  sieve_cmp_order(n->comparator, num,
                                                  strlen(num), kb.s ? kb.s : "",
                                                  kb.len));
        }
        buf_free(&kb);
        return r;
    }
    buf_free(&kb);
    {
        /* the keys expanded, and their regexes compiled, once; keys
         * without variables (their regexes compiled with the script) are
         * used as they are, without a copy */
        struct strarray kx = STRARRAY_INITIALIZER;
        regex_t *rx = NULL;
        const char *kfix[MATCH_FIXED_KEYS];
        const regex_t *rfix[MATCH_FIXED_KEYS];
        const char *const *kd = kfix;
        const regex_t **re = rfix;
        size_t nrx = 0, nk = keys->n;
        int fixed = keys->n <= MATCH_FIXED_KEYS;

        for (k = 0; k < keys->n && fixed; k++)
            if (keys->v[k].has_var ||
                (n->match == SV_MATCH_REGEX && !keys->v[k].re))
                fixed = 0;
        if (fixed) {
            for (k = 0; k < keys->n; k++) {
                kfix[k] = keys->v[k].s;
                rfix[k] = keys->v[k].re;
            }
        } else {
            re = calloc(keys->n + 1, sizeof(*re));
            if (!re)
                return rt_nomem(ex);
            if (n->match == SV_MATCH_REGEX) {
                rx = calloc(keys->n + 1, sizeof(*rx));
                if (!rx) {
                    free(re);
                    return rt_nomem(ex);
                }
            }
            for (k = 0; k < keys->n && ex->rc == SIEVE_OK; k++) {
                char *key = expand_dup(ex, fr, &keys->v[k]);
                if (!key || strarray_appendm(&kx, key) < 0) {
                    rt_nomem(ex);
                    break;
                }
                re[k] = keys->v[k].re;
                if (n->match == SV_MATCH_REGEX && !re[k]) {
                    int flags = REG_EXTENDED;
                    unsigned long cost;
                    const char *why;

                    if (n->comparator == SV_CMP_CASEMAP)
                        flags |= REG_ICASE;
                    why = sieve_regex_refusal(key, strlen(key),
                                              ex->lim->max_regex_cost,
                                              &cost);
                    ex->steps += strlen(key) + 1 + (why ? 0 : cost);
                    if (why) {
                        rt_error(ex, n->line, "regular expression \"%s\" "
                                 "refused: %s", key, why);
                        break;
                    }
                    if (regcomp(&rx[nrx], key, flags) != 0) {
                        rt_error(ex, n->line, "invalid regular expression "
                                 "\"%s\"", key);
                        break;
                    }
                    re[k] = &rx[nrx++];
                }
            }
            kd = (const char *const *)kx.data;
            nk = kx.count;
        }
        for (i = 0; i < vals->count && r == 0 && ex->rc == SIEVE_OK; i++) {
            const char *v = vals->data[i];
            size_t vlen = strlen(v);
            for (k = 0; k < nk && r == 0; k++) {
                r = sieve_match(&mc, n->comparator, n->match, n->relop, v,
                                vlen, kd[k], strlen(kd[k]), re[k]);
                if (r < 0) {
                    if (mc.error == 1)
                        rt_error(ex, n->line, "match limit passed (%lu "
                                 "steps)", ex->lim->max_match_steps);
                    else if (mc.error == 2)
                        rt_error(ex, n->line, "value longer than %zu "
                                 "bytes for :regex", ex->lim->max_match_len);
                    else
                        rt_nomem(ex);
                }
            }
        }
        if (!fixed) {
            while (nrx > 0)
                regfree(&rx[--nrx]);
            free(rx);
            free(re);
            strarray_fini(&kx);
        }
    }
    return ex->rc == SIEVE_OK ? r : -1;
}

/* ---- dates (RFC 5260) ------------------------------------------------- */

static long long days_from_civil(long long y, unsigned m, unsigned d)
{
    long long era;
    unsigned yoe, doy, doe;

    y -= m <= 2;
    era = (y >= 0 ? y : y - 399) / 400;
    yoe = (unsigned)(y - era * 400);
    doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (long long)doe - 719468;
}

static void civil_from_days(long long z, long long *y, unsigned *m,
                            unsigned *d)
{
    long long era;
    unsigned doe, yoe, doy, mp;

    z += 719468;
    era = (z >= 0 ? z : z - 146096) / 146097;
    doe = (unsigned)(z - era * 146097);
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    *y = (long long)yoe + era * 400;
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y += *m <= 2;
}

static const char *const month_names[] = {
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
    "nov", "dec"
};

/* parse an RFC 5322 date-time: seconds since the epoch and zone minutes;
 * 0 or -1 */
static int parse_date(const char *s, long long *t_r, int *zone_r)
{
    const char *p = s;
    long day, year, hh, mm, ss = 0;
    unsigned mon;
    int zone = 0;
    char *e;

    while (*p == ' ' || *p == '\t')
        p++;
    if (isalpha((unsigned char)*p)) {     /* day-of-week */
        while (isalpha((unsigned char)*p))
            p++;
        while (*p == ' ')
            p++;
        if (*p != ',')
            return -1;
        p++;
    }
    day = strtol(p, &e, 10);
    if (e == p || day < 1 || day > 31)
        return -1;
    p = e;
    while (*p == ' ' || *p == '\t')
        p++;
    for (mon = 0; mon < 12; mon++)
        if (strncasecmp(p, month_names[mon], 3) == 0)
            break;
    if (mon == 12)
        return -1;
    p += 3;
    while (*p == ' ' || *p == '\t')
        p++;
    year = strtol(p, &e, 10);
    if (e == p || e - p > 4)
        return -1;
    if (e - p <= 2)
        year += year < 50 ? 2000 : 1900;
    else if (e - p == 3)
        year += 1900;
    p = e;
    while (*p == ' ' || *p == '\t')
        p++;
    hh = strtol(p, &e, 10);
    if (e == p || *e != ':' || hh > 23)
        return -1;
    p = e + 1;
    mm = strtol(p, &e, 10);
    if (e == p || mm > 59)
        return -1;
    p = e;
    if (*p == ':') {
        p++;
        ss = strtol(p, &e, 10);
        if (e == p || ss > 60)
            return -1;
        p = e;
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if ((*p == '+' || *p == '-') && isdigit((unsigned char)p[1]) &&
        isdigit((unsigned char)p[2]) && isdigit((unsigned char)p[3]) &&
        isdigit((unsigned char)p[4])) {
        zone = ((p[1] - '0') * 10 + (p[2] - '0')) * 60 +
               (p[3] - '0') * 10 + (p[4] - '0');
        if (*p == '-')
            zone = -zone;
    } else {
        static const struct { const char *n; int z; } zn[] = {
            { "UT", 0 }, { "GMT", 0 }, { "EST", -300 }, { "EDT", -240 },
            { "CST", -360 }, { "CDT", -300 }, { "MST", -420 },
            { "MDT", -360 }, { "PST", -480 }, { "PDT", -420 }, { NULL, 0 }
        };
        size_t i;
        for (i = 0; zn[i].n; i++)
            if (strncasecmp(p, zn[i].n, strlen(zn[i].n)) == 0)
                zone = zn[i].z;
    }
    *t_r = days_from_civil(year, mon + 1, (unsigned)day) * 86400LL +
           hh * 3600 + mm * 60 + ss - zone * 60LL;
    *zone_r = zone;
    return 0;
}

static int parse_zone(const char *z)
{
    int v = ((z[1] - '0') * 10 + (z[2] - '0')) * 60 +
            (z[3] - '0') * 10 + (z[4] - '0');
    return z[0] == '-' ? -v : v;
}

/* the date part of time t seen in zone (minutes east of UTC) */
static void date_part(long long t, int zone, const char *part,
                      struct buf *out)
{
    long long lt = t + zone * 60LL, days, y;
    unsigned m, d;
    long sod;
    int az = zone < 0 ? -zone : zone;
    static const char *const wd[] = { "Sun", "Mon", "Tue", "Wed", "Thu",
                                      "Fri", "Sat" };
    static const char *const mn[] = { "Jan", "Feb", "Mar", "Apr", "May",
        "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };

    days = lt >= 0 ? lt / 86400 : -((-lt + 86399) / 86400);
    sod = (long)(lt - days * 86400);
    civil_from_days(days, &y, &m, &d);
    buf_reset(out);
    if (!strcasecmp(part, "year"))
        buf_printf(out, "%04lld", y);
    else if (!strcasecmp(part, "month"))
        buf_printf(out, "%02u", m);
    else if (!strcasecmp(part, "day"))
        buf_printf(out, "%02u", d);
    else if (!strcasecmp(part, "date"))
        buf_printf(out, "%04lld-%02u-%02u", y, m, d);
    else if (!strcasecmp(part, "julian"))
        buf_printf(out, "%lld", days + 40587);
    else if (!strcasecmp(part, "hour"))
        buf_printf(out, "%02ld", sod / 3600);
    else if (!strcasecmp(part, "minute"))
        buf_printf(out, "%02ld", sod / 60 % 60);
    else if (!strcasecmp(part, "second"))
        buf_printf(out, "%02ld", sod % 60);
    else if (!strcasecmp(part, "time"))
        buf_printf(out, "%02ld:%02ld:%02ld", sod / 3600, sod / 60 % 60,
                   sod % 60);
    else if (!strcasecmp(part, "iso8601"))
        buf_printf(out, "%04lld-%02u-%02uT%02ld:%02ld:%02ld%c%02d:%02d", y, m,
                   d, sod / 3600, sod / 60 % 60, sod % 60,
                   zone < 0 ? '-' : '+', az / 60, az % 60);
    else if (!strcasecmp(part, "std11"))
        buf_printf(out, "%s, %02u %s %04lld %02ld:%02ld:%02ld %c%02d%02d",
                   wd[((days % 7) + 11) % 7], d, mn[m - 1], y, sod / 3600,
                   sod / 60 % 60, sod % 60, zone < 0 ? '-' : '+', az / 60,
                   az % 60);
    else if (!strcasecmp(part, "zone"))
        buf_printf(out, "%c%02d%02d", zone < 0 ? '-' : '+', az / 60, az % 60);
    else if (!strcasecmp(part, "weekday"))
        buf_printf(out, "%lld", ((days % 7) + 11) % 7);
}

static int test_date(struct exec *ex, struct frame *fr,
                     const struct sv_node *n)
{
    struct strarray vals = STRARRAY_INITIALIZER;
    struct strarray parts = STRARRAY_INITIALIZER;
    struct buf b = BUF_INITIALIZER, pb = BUF_INITIALIZER;
    int zone = ex->ctx->zone_minutes, r;
    size_t i;
    const struct sv_strlist *keys = n->pos[n->npos - 1];

    if (n->zone) {
        if (expand(ex, fr, n->zone, &b) < 0)
            goto fail;
        if (b.len != 5 || (b.s[0] != '+' && b.s[0] != '-')) {
            /* RFC 5260 4.1: an invalid zone at run time: local zone */
        } else {
            zone = parse_zone(b.s);
        }
    }
    if (n->id == SV_T_CURRENTDATE) {
        if (expand(ex, fr, &n->pos[0]->v[0], &pb) < 0)
            goto fail;
        date_part((long long)ex->now, zone, buf_cstring(&pb), &b);
        if (strarray_append(&parts, buf_cstring(&b)) < 0)
            goto nomem;
    } else {
        struct sv_strlist one;
        one.v = (struct sv_str *)&n->pos[0]->v[0];
        one.n = 1;
        if (test_header_values(ex, fr, n, &one, &vals) < 0)
            goto fail;
        if (expand(ex, fr, &n->pos[1]->v[0], &pb) < 0)
            goto fail;
        for (i = 0; i < vals.count; i++) {
            long long t;
            int hz, z = zone;
            /* the date is after the last ';' for Received */
            const char *v = strrchr(vals.data[i], ';');
            v = v ? v + 1 : vals.data[i];
            if (parse_date(v, &t, &hz) < 0)
                continue;
            if (n->originalzone)
                z = hz;
            date_part(t, z, buf_cstring(&pb), &b);
            if (strarray_append(&parts, buf_cstring(&b)) < 0)
                goto nomem;
        }
    }
    r = match_values(ex, fr, n, &parts, keys);
    strarray_fini(&vals);
    strarray_fini(&parts);
    buf_free(&b);
    buf_free(&pb);
    return r;
nomem:
    rt_nomem(ex);
fail:
    strarray_fini(&vals);
    strarray_fini(&parts);
    buf_free(&b);
    buf_free(&pb);
    return -1;
}

static int eval_test(struct exec *ex, struct frame *fr,
                     const struct sv_node *n);

static int test_duplicate(struct exec *ex, struct frame *fr,
                          const struct sv_node *n)
{
    struct buf id = BUF_INITIALIZER, v = BUF_INITIALIZER;
    struct sieve_action *a;
    int r = 0;

    if (n->handle) {
        if (expand(ex, fr, n->handle, &v) < 0)
            goto fail;
    }
    buf_printf(&id, "%zu:", v.len);
    buf_append(&id, v.s ? v.s : "", v.len);
    if (n->uniqueid) {
        if (expand(ex, fr, n->uniqueid, &v) < 0)
            goto fail;
    } else {
        struct strarray vals = STRARRAY_INITIALIZER;
        const char *h = "Message-ID";
        if (n->header) {
            if (expand(ex, fr, n->header, &v) < 0)
                goto fail;
            h = buf_cstring(&v);
        }
        if (fetch_header(ex, n->line, h, 0, &vals) < 0) {
            strarray_fini(&vals);
            goto fail;
        }
        if (vals.count == 0) {
            strarray_fini(&vals);
            goto out;      /* nothing to compare: not a duplicate */
        }
        buf_setcstr(&v, vals.data[0]);
        strarray_fini(&vals);
    }
    buf_append(&id, v.s ? v.s : "", v.len);
    buf_cstring(&id);
    if (ex->ctx->duplicate_check) {
        r = ex->ctx->duplicate_check(ex->ctx->rock, buf_cstring(&id));
        if (r < 0) {
            rt_temp(ex, n->line, "duplicate");
            goto fail;
        }
    }
    /* a second test of the same id in one execution sees the first */
    {
        size_t i;
        for (i = 0; i < ex->acts->count; i++)
            if (ex->acts->v[i].type == SIEVE_ACTION_DUPLICATE &&
                strcmp(ex->acts->v[i].text, buf_cstring(&id)) == 0)
                r = 1;
    }
    if (r == 0 || n->last) {
        a = add_action(ex, n->line, SIEVE_ACTION_DUPLICATE);
        if (!a)
            goto fail;
        a->text = strdup(buf_cstring(&id));
        a->seconds = n->has_seconds ? n->seconds : 7 * 86400;
        if (!a->text) {
            rt_nomem(ex);
            goto fail;
        }
    }
out:
    buf_free(&id);
    buf_free(&v);
    return r > 0;
fail:
    buf_free(&id);
    buf_free(&v);
    return -1;
}

static int eval_test(struct exec *ex, struct frame *fr,
                     const struct sv_node *n)
{
    struct strarray vals = STRARRAY_INITIALIZER;
    struct buf b = BUF_INITIALIZER;
    size_t i;
    int r = -1;

    if (HALT(ex))
        return -1;
    if (n->unchecked)
        return rt_error(ex, n->line, "test \"%s\" is not supported",
                        n->name);
    switch (n->id) {
    case SV_T_TRUE:
        return 1;
    case SV_T_FALSE:
        return 0;
    case SV_T_NOT:
        r = eval_test(ex, fr, n->tests[0]);
        return r < 0 ? -1 : !r;
    case SV_T_ALLOF:
        for (i = 0; i < n->ntests; i++) {
            r = eval_test(ex, fr, n->tests[i]);
            if (r <= 0)
                return r;
        }
        return 1;
    case SV_T_ANYOF:
        for (i = 0; i < n->ntests; i++) {
            r = eval_test(ex, fr, n->tests[i]);
            if (r != 0)
                return r;
        }
        return 0;
    case SV_T_SIZE:
        return n->over ? ex->ctx->size > n->number
                       : ex->ctx->size < n->number;
    case SV_T_EXISTS:
        for (i = 0; i < n->pos[0]->n; i++) {
            strarray_fini(&vals);
            if (expand(ex, fr, &n->pos[0]->v[i], &b) < 0 ||
                fetch_header(ex, n->line, buf_cstring(&b), 0, &vals) < 0)
                goto out;
            if (vals.count == 0) {
                r = 0;
                goto out;
            }
        }
        r = 1;
        goto out;
    case SV_T_HEADER: {
        struct strarray view;
        int bv = header_view(ex, n, n->pos[0], &view);

        if (bv < 0)
            goto out;
        if (bv) {
            r = match_values(ex, fr, n, &view, n->pos[1]);
            goto out;
        }
        if (test_header_values(ex, fr, n, n->pos[0], &vals) < 0)
            goto out;
        r = match_values(ex, fr, n, &vals, n->pos[1]);
        goto out;
    }
    case SV_T_ADDRESS: {
        struct strarray hv = STRARRAY_INITIALIZER;
        int bv = header_view(ex, n, n->pos[0], &hv);

        if (bv < 0)
            goto out;
        if (!bv && test_header_values(ex, fr, n, n->pos[0], &hv) < 0) {
            strarray_fini(&hv);
            goto out;
        }
        if (hv.count == 1) {
            /* one header value (the common case): its memoized parts
             * matched as they are, no copy */
            const struct strarray *parts =
                addr_memo_get(ex, hv.data[0], n->addrpart);
            if (!bv)
                strarray_fini(&hv);
            if (parts)
                r = match_values(ex, fr, n, parts, n->pos[1]);
            goto out;
        }
        for (i = 0; i < hv.count; i++)
            if (value_addresses(ex, hv.data[i], n->addrpart, &vals) < 0)
                break;
        if (!bv)
            strarray_fini(&hv);
        if (ex->rc != SIEVE_OK)
            goto out;
        r = match_values(ex, fr, n, &vals, n->pos[1]);
        goto out;
    }
    case SV_T_ENVELOPE:
        for (i = 0; i < n->pos[0]->n; i++) {
            struct strarray ev = STRARRAY_INITIALIZER;
            size_t k;
            if (expand(ex, fr, &n->pos[0]->v[i], &b) < 0)
                goto out;
            if (ex->ctx->envelope &&
                ex->ctx->envelope(ex->ctx->rock, buf_cstring(&b), &ev) < 0) {
                strarray_fini(&ev);
                rt_temp(ex, n->line, "envelope");
                goto out;
            }
            for (k = 0; k < ev.count; k++) {
                const char *a = ev.data[k], *at = strrchr(a, '@');
                struct addrpart_rock ar;
                if (a[0] == '\0') {
                    /* the null reverse path matches "" with :all only */
                    if (n->addrpart == SV_ADDR_ALL)
                        strarray_append(&vals, "");
                    continue;
                }
                ar.ex = ex;
                ar.part = n->addrpart;
                ar.sep = ex->ctx->subaddress_sep ? ex->ctx->subaddress_sep
                                                 : '+';
                ar.out = &vals;
                ar.nomem = 0;
                addr_part(&ar, a, at ? (size_t)(at - a) : strlen(a),
                          at ? at + 1 : "", at ? strlen(at + 1) : 0);
            }
            strarray_fini(&ev);
        }
        r = match_values(ex, fr, n, &vals, n->pos[1]);
        goto out;
    case SV_T_HASFLAG: {
        struct strarray keys = STRARRAY_INITIALIZER;
        struct sv_strlist kl;
        struct sv_str *ks;
        if (n->npos == 2) {
            for (i = 0; i < n->pos[0]->n; i++) {
                if (expand(ex, fr, &n->pos[0]->v[i], &b) < 0 ||
                    flags_add(&vals, var_get(ex, fr, buf_cstring(&b))) < 0)
                    goto out;
            }
        } else {
            for (i = 0; i < ex->flags.count; i++)
                flags_add(&vals, ex->flags.data[i]);
        }
        /* every key word is a flag */
        if (expand_list(ex, fr, n->pos[n->npos - 1], &keys) < 0) {
            strarray_fini(&keys);
            goto out;
        }
        {
            struct strarray words = STRARRAY_INITIALIZER;
            for (i = 0; i < keys.count; i++)
                if (n->match == SV_MATCH_COUNT)
                    strarray_append(&words, keys.data[i]);
                else
                    flags_add(&words, keys.data[i]);
            strarray_fini(&keys);
            keys = words;
        }
        ks = calloc(keys.count + 1, sizeof(*ks));
        if (!ks) {
            strarray_fini(&keys);
            rt_nomem(ex);
            goto out;
        }
        for (i = 0; i < keys.count; i++) {
            ks[i].s = keys.data[i];
            ks[i].len = strlen(keys.data[i]);
        }
        kl.v = ks;
        kl.n = keys.count;
        r = match_values(ex, fr, n, &vals, &kl);
        free(ks);
        strarray_fini(&keys);
        goto out;
    }
    case SV_T_BODY: {
        struct strarray types = STRARRAY_INITIALIZER;
        if (n->body_transform == SIEVE_BODY_CONTENT &&
            expand_list(ex, fr, n->content_types, &types) < 0) {
            strarray_fini(&types);
            goto out;
        }
        if (ex->ctx->body &&
            ex->ctx->body(ex->ctx->rock, n->body_transform,
                          n->body_transform == SIEVE_BODY_CONTENT ? &types
                                                                  : NULL,
                          &vals) < 0) {
            strarray_fini(&types);
            rt_temp(ex, n->line, "body");
            goto out;
        }
        strarray_fini(&types);
        r = match_values(ex, fr, n, &vals, n->pos[0]);
        goto out;
    }
    case SV_T_STRING: {
        struct strarray src = STRARRAY_INITIALIZER;
        if (expand_list(ex, fr, n->pos[0], &src) < 0) {
            strarray_fini(&src);
            goto out;
        }
        for (i = 0; i < src.count; i++)
            if (n->match != SV_MATCH_COUNT || src.data[i][0])
                strarray_append(&vals, src.data[i]);
        strarray_fini(&src);
        r = match_values(ex, fr, n, &vals, n->pos[1]);
        goto out;
    }
    case SV_T_MAILBOXEXISTS:
        for (i = 0; i < n->pos[0]->n; i++) {
            int e = 0;
            if (expand(ex, fr, &n->pos[0]->v[i], &b) < 0)
                goto out;
            if (ex->ctx->mailbox_exists)
                e = ex->ctx->mailbox_exists(ex->ctx->rock, buf_cstring(&b));
            if (e < 0) {
                rt_temp(ex, n->line, "mailboxexists");
                goto out;
            }
            if (e == 0) {
                r = 0;
                goto out;
            }
        }
        r = 1;
        goto out;
    case SV_T_DATE: case SV_T_CURRENTDATE:
        return test_date(ex, fr, n);
    case SV_T_DUPLICATE:
        return test_duplicate(ex, fr, n);
    case SV_T_IHAVE:
        return n->number != 0;
    case SV_T_ENVIRONMENT: {
        int e = 0;
        struct buf val = BUF_INITIALIZER;
        if (expand(ex, fr, &n->pos[0]->v[0], &b) < 0)
            goto out;
        if (ex->ctx->environment)
            e = ex->ctx->environment(ex->ctx->rock, buf_cstring(&b), &val);
        if (e < 0) {
            buf_free(&val);
            rt_temp(ex, n->line, "environment");
            goto out;
        }
        if (e == 0) {
            if (strcasecmp(buf_cstring(&b), "name") == 0) {
                buf_setcstr(&val, PACKAGE_NAME);
                e = 1;
            } else if (strcasecmp(buf_cstring(&b), "version") == 0) {
                buf_setcstr(&val, PACKAGE_VERSION);
                e = 1;
            }
        }
        if (e == 1)
            strarray_append(&vals, buf_cstring(&val));
        buf_free(&val);
        r = match_values(ex, fr, n, &vals, n->pos[1]);
        goto out;
    }
    default:
        return rt_error(ex, n->line, "test \"%s\" cannot run", n->name);
    }
out:
    if (vals.data)   /* most tests borrow their values: nothing to free */
        strarray_fini(&vals);
    if (b.s)
        buf_free(&b);
    if (ex->rc != SIEVE_OK)
        return -1;
    return r;
}

/* ---- commands ----------------------------------------------------------- */

static int exec_block(struct exec *ex, struct frame *fr,
                      struct sv_node *const *v, size_t nv);

static int run_script(struct exec *ex, const struct sieve_script *s,
                      struct frame *parent);

static int cmd_set(struct exec *ex, struct frame *fr, const struct sv_node *n)
{
    struct buf val = BUF_INITIALIZER;
    size_t i;
    unsigned m = n->modifiers;
    int r;

    if (expand(ex, fr, &n->pos[1]->v[0], &val) < 0) {
        buf_free(&val);
        return -1;
    }
    buf_cstring(&val);
    if (m & (SV_MOD_LOWER | SV_MOD_UPPER))
        for (i = 0; i < val.len; i++)
            val.s[i] = (char)((m & SV_MOD_LOWER) ?
                              tolower((unsigned char)val.s[i]) :
                              toupper((unsigned char)val.s[i]));
    if ((m & (SV_MOD_LOWERFIRST | SV_MOD_UPPERFIRST)) && val.len)
        val.s[0] = (char)((m & SV_MOD_LOWERFIRST) ?
                          tolower((unsigned char)val.s[0]) :
                          toupper((unsigned char)val.s[0]));
    if (m & (SV_MOD_QUOTEWILDCARD | SV_MOD_QUOTEREGEX)) {
        struct buf q = BUF_INITIALIZER;
        const char *special = (m & SV_MOD_QUOTEWILDCARD) ? "*?\\"
                                                        : "*?\\.^$[]()|{}+";
        for (i = 0; i < val.len; i++) {
            if (strchr(special, val.s[i]) && val.s[i])
                buf_putc(&q, '\\');
            buf_putc(&q, val.s[i]);
        }
        buf_free(&val);
        val = q;
    }
    if (m & SV_MOD_LENGTH) {
        size_t chars = 0;
        for (i = 0; i < val.len; i++)
            if (((unsigned char)val.s[i] & 0xc0) != 0x80)
                chars++;
        buf_reset(&val);
        buf_printf(&val, "%zu", chars);
    }
    r = var_set(ex, fr, n->line, n->pos[0]->v[0].s, val.s ? val.s : "",
                val.len);
    buf_free(&val);
    return r;
}

static int cmd_flags(struct exec *ex, struct frame *fr,
                     const struct sv_node *n)
{
    struct strarray set = STRARRAY_INITIALIZER, l = STRARRAY_INITIALIZER;
    struct buf vn = BUF_INITIALIZER;
    size_t i;
    int usevar = n->npos == 2;

    if (usevar) {
        if (expand(ex, fr, &n->pos[0]->v[0], &vn) < 0)
            goto fail;
        flags_add(&set, var_get(ex, fr, buf_cstring(&vn)));
    } else {
        for (i = 0; i < ex->flags.count; i++)
            flags_add(&set, ex->flags.data[i]);
    }
    if (expand_list(ex, fr, n->pos[n->npos - 1], &l) < 0)
        goto fail;
    if (n->id == SV_C_SETFLAG)
        strarray_fini(&set);
    for (i = 0; i < l.count; i++) {
        if (n->id == SV_C_REMOVEFLAG)
            flags_remove(&set, l.data[i]);
        else if (flags_add(&set, l.data[i]) < 0)
            goto nomem;
    }
    if (usevar) {
        char *j = strarray_join(&set, " ");
        if (!j)
            goto nomem;
        if (var_set(ex, fr, n->line, buf_cstring(&vn), j, strlen(j)) < 0) {
            free(j);
            goto fail;
        }
        free(j);
        strarray_fini(&set);
    } else {
        strarray_fini(&ex->flags);
        ex->flags = set;
    }
    strarray_fini(&l);
    buf_free(&vn);
    return 0;
nomem:
    rt_nomem(ex);
fail:
    strarray_fini(&set);
    strarray_fini(&l);
    buf_free(&vn);
    return -1;
}

static int protected_header(const char *name)
{
    return strcasecmp(name, "received") == 0 ||
           strcasecmp(name, "auto-submitted") == 0;
}

static int valid_field_name(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if ((unsigned char)*s <= 32 || (unsigned char)*s >= 127 || *s == ':')
            return 0;
    return 1;
}

/* put a copy of s first */
static int prepend(struct strarray *sa, const char *s)
{
    size_t i;

    if (strarray_append(sa, s) < 0)
        return -1;
    for (i = sa->count - 1; i > 0; i--) {
        char *t = sa->data[i];
        sa->data[i] = sa->data[i - 1];
        sa->data[i - 1] = t;
    }
    return 0;
}

static int cmd_addheader(struct exec *ex, struct frame *fr,
                         const struct sv_node *n)
{
    char *name = expand_dup(ex, fr, &n->pos[0]->v[0]);
    char *value = name ? expand_dup(ex, fr, &n->pos[1]->v[0]) : NULL;
    struct hedit *e;
    struct sieve_action *a;

    if (!name || !value)
        goto fail;
    if (!valid_field_name(name)) {
        rt_error(ex, n->line, "addheader: invalid header name \"%s\"", name);
        goto fail;
    }
    if (protected_header(name)) {
        free(name);
        free(value);
        return 0;
    }
    e = edit_open(ex, n->line, name);
    if (!e)
        goto fail;
    if (n->last) {
        if (strarray_append(&e->raw, value) < 0 ||
            strarray_append(&e->dec, value) < 0)
            goto nomem;
    } else if (prepend(&e->raw, value) < 0 || prepend(&e->dec, value) < 0) {
        goto nomem;
    }
    a = add_action(ex, n->line, SIEVE_ACTION_ADDHEADER);
    if (!a)
        goto fail;
    a->name = name;
    a->text = value;
    a->last = (unsigned)n->last;
    return 0;
nomem:
    rt_nomem(ex);
fail:
    free(name);
    free(value);
    return -1;
}

static int cmd_deleteheader(struct exec *ex, struct frame *fr,
                            const struct sv_node *n)
{
    char *name = expand_dup(ex, fr, &n->pos[0]->v[0]);
    struct hedit *e;
    size_t i, count, first = 0, lastx;
    unsigned char *del = NULL;

    if (!name)
        return -1;
    if (!valid_field_name(name)) {
        rt_error(ex, n->line, "deleteheader: invalid header name \"%s\"",
                 name);
        goto fail;
    }
    if (protected_header(name)) {
        free(name);
        return 0;
    }
    e = edit_open(ex, n->line, name);
    if (!e)
        goto fail;
    count = e->raw.count;
    if (count == 0) {
        free(name);
        return 0;
    }
    del = calloc(count, 1);
    if (!del) {
        rt_nomem(ex);
        goto fail;
    }
    lastx = count;
    if (n->index) {
        if (n->index > count) {
            free(del);
            free(name);
            return 0;
        }
        first = n->last ? count - n->index : n->index - 1;
        lastx = first + 1;
    }
    for (i = first; i < lastx; i++) {
        if (n->npos == 2) {
            struct strarray one = STRARRAY_INITIALIZER;
            int r;
            strarray_append(&one, e->dec.data[i]);
            r = match_values(ex, fr, n, &one, n->pos[1]);
            strarray_fini(&one);
            if (r < 0)
                goto fail;
            del[i] = (unsigned char)r;
        } else {
            del[i] = 1;
        }
    }
    /* bottom to top, so each index stays valid for the caller */
    for (i = count; i-- > 0;) {
        struct sieve_action *a;
        if (!del[i])
            continue;
        a = add_action(ex, n->line, SIEVE_ACTION_DELETEHEADER);
        if (!a)
            goto fail;
        a->name = strdup(name);
        if (!a->name) {
            rt_nomem(ex);
            goto fail;
        }
        a->index = (unsigned)(i + 1);
        strarray_remove(&e->raw, i);
        strarray_remove(&e->dec, i);
    }
    free(del);
    free(name);
    return 0;
fail:
    free(del);
    free(name);
    return -1;
}

static int cmd_vacation(struct exec *ex, struct frame *fr,
                        const struct sv_node *n)
{
    struct sieve_action *a;
    struct buf h = BUF_INITIALIZER;
    unsigned long long secs;
    unsigned long hash = 5381;
    size_t i;

    if (find_action(ex, SIEVE_ACTION_VACATION, NULL))
        return rt_error(ex, n->line, "vacation given twice");
    if (find_action(ex, SIEVE_ACTION_REJECT, NULL) ||
        find_action(ex, SIEVE_ACTION_EREJECT, NULL))
        return rt_error(ex, n->line, "vacation conflicts with reject");
    a = add_action(ex, n->line, SIEVE_ACTION_VACATION);
    if (!a)
        return -1;
    a->text = expand_dup(ex, fr, &n->pos[0]->v[0]);
    if (!a->text)
        return -1;
    if (n->subject && !(a->subject = expand_dup(ex, fr, n->subject)))
        return -1;
    if (n->from && !(a->from = expand_dup(ex, fr, n->from)))
        return -1;
    if (n->addresses && expand_list(ex, fr, n->addresses, &a->addresses) < 0)
        return -1;
    a->mime = (unsigned)n->mime;
    secs = n->has_seconds ? n->seconds : 7 * 86400ULL;
    /* RFC 5230 4.1: at least one day, unless :seconds (RFC 6131 allows 0) */
    if (secs > 90 * 86400ULL)
        secs = 90 * 86400ULL;
    a->seconds = (unsigned long)secs;
    if (n->handle) {
        a->handle = expand_dup(ex, fr, n->handle);
        if (!a->handle)
            return -1;
    } else {
        /* RFC 5230 4.2: a handle made of the arguments */
        buf_printf(&h, "%s\n%s\n%s\n%d", a->text,
                   a->subject ? a->subject : "", a->from ? a->from : "",
                   a->mime);
        for (i = 0; i < h.len; i++)
            hash = hash * 33 + (unsigned char)h.s[i];
        buf_reset(&h);
        buf_printf(&h, "vacation-%016lx", hash);
        a->handle = buf_release(&h);
        if (!a->handle)
            return rt_nomem(ex);
    }
    buf_free(&h);
    return 0;
}

static int cmd_include(struct exec *ex, struct frame *fr,
                       const struct sv_node *n)
{
    const struct sieve_script *inc = NULL;
    struct buf name = BUF_INITIALIZER, err = BUF_INITIALIZER,
               key = BUF_INITIALIZER;
    int r = 0;

    if (expand(ex, fr, &n->pos[0]->v[0], &name) < 0)
        goto fail;
    if (name.len == 0 || memchr(name.s, '/', name.len)) {
        rt_error(ex, n->line, "include: invalid script name \"%s\"",
                 buf_cstring(&name));
        goto fail;
    }
    buf_printf(&key, "%c:%s", n->global ? 'g' : 'p', buf_cstring(&name));
    if (n->once && strarray_find(&ex->once, buf_cstring(&key)) >= 0)
        goto done;
    if (ex->depth + 1 > ex->lim->max_include_depth) {
        rt_error(ex, n->line, "include: deeper than %u levels",
                 ex->lim->max_include_depth);
        goto fail;
    }
    if (++ex->nincludes > ex->lim->max_includes) {
        rt_error(ex, n->line, "include: more than %u includes",
                 ex->lim->max_includes);
        goto fail;
    }
    if (ex->ctx->include)
        r = ex->ctx->include(ex->ctx->rock, n->global, buf_cstring(&name),
                             &inc, &err);
    if (r < 0) {
        rt_temp(ex, n->line, "include");
        goto fail;
    }
    if (r == 0 || !inc) {
        if (err.len) {
            rt_error(ex, n->line, "include \"%s\": %s", buf_cstring(&name),
                     buf_cstring(&err));
            goto fail;
        }
        if (n->optional)
            goto done;
        rt_error(ex, n->line, "include: script \"%s\" not found",
                 buf_cstring(&name));
        goto fail;
    }
    {
        size_t i;

        for (i = 0; i < ex->nstack; i++)
            if (ex->stack[i] == inc) {
                rt_error(ex, n->line, "include loop: \"%s\" is already "
                         "being executed", buf_cstring(&name));
                goto fail;
            }
        if (ex->nstack >= SIEVE_INCLUDE_STACK) {
            rt_error(ex, n->line, "include: deeper than %u levels",
                     SIEVE_INCLUDE_STACK - 1);
            goto fail;
        }
    }
    /* every include counts for a later :once (RFC 6609 3.2: "only if it
     * has not already been included at any other point") */
    if (strarray_find(&ex->once, buf_cstring(&key)) < 0 &&
        strarray_append(&ex->once, buf_cstring(&key)) < 0) {
        rt_nomem(ex);
        goto fail;
    }
    ex->depth++;
    r = run_script(ex, inc, fr);
    ex->depth--;
    if (r < 0)
        goto fail;
done:
    buf_free(&name);
    buf_free(&err);
    buf_free(&key);
    return 0;
fail:
    buf_free(&name);
    buf_free(&err);
    buf_free(&key);
    return -1;
}

static int exec_command(struct exec *ex, struct frame *fr,
                        const struct sv_node *n)
{
    struct sieve_action *a;
    char *s;
    size_t i;

    if (n->unchecked)
        return rt_error(ex, n->line, "command \"%s\" is not supported",
                        n->name);
    switch (n->id) {
    case SV_C_REQUIRE:
        return 0;
    case SV_C_STOP:
        ex->stopped = 1;
        return 0;
    case SV_C_RETURN:
        fr->returned = 1;
        return 0;
    case SV_C_KEEP:
        a = find_action(ex, SIEVE_ACTION_KEEP, NULL);
        if (!a) {
            a = add_action(ex, n->line, SIEVE_ACTION_KEEP);
            if (!a)
                return -1;
        }
        ex->keep_cancelled = 1;
        return action_flags(ex, fr, n, &a->flags);
    case SV_C_DISCARD:
        ex->keep_cancelled = 1;
        if (!find_action(ex, SIEVE_ACTION_DISCARD, NULL) &&
            !add_action(ex, n->line, SIEVE_ACTION_DISCARD))
            return -1;
        return 0;
    case SV_C_FILEINTO:
        s = expand_dup(ex, fr, &n->pos[0]->v[0]);
        if (!s)
            return -1;
        if (!n->copy)
            ex->keep_cancelled = 1;
        a = find_action(ex, SIEVE_ACTION_FILEINTO, s);
        if (a) {
            free(s);
            a->copy = a->copy && n->copy;
        } else {
            a = add_action(ex, n->line, SIEVE_ACTION_FILEINTO);
            if (!a) {
                free(s);
                return -1;
            }
            a->mailbox = s;
            a->copy = (unsigned)n->copy;
        }
        a->create |= (unsigned)n->create;
        if (n->specialuse && !a->specialuse &&
            !(a->specialuse = expand_dup(ex, fr, n->specialuse)))
            return -1;
        return action_flags(ex, fr, n, &a->flags);
    case SV_C_REDIRECT: {
        const char *at;
        s = expand_dup(ex, fr, &n->pos[0]->v[0]);
        if (!s)
            return -1;
        at = strrchr(s, '@');
        if (!at || at == s || !at[1] || strpbrk(s, " \t\r\n<>,\"")) {
            rt_error(ex, n->line, "redirect: invalid address \"%s\"", s);
            free(s);
            return -1;
        }
        if (!n->copy)
            ex->keep_cancelled = 1;
        if (find_action(ex, SIEVE_ACTION_REDIRECT, s)) {
            free(s);
            return 0;
        }
        if (++ex->nredirects > ex->lim->max_redirects) {
            free(s);
            return rt_error(ex, n->line, "more than %u redirects",
                            ex->lim->max_redirects);
        }
        a = add_action(ex, n->line, SIEVE_ACTION_REDIRECT);
        if (!a) {
            free(s);
            return -1;
        }
        a->address = s;
        a->copy = (unsigned)n->copy;
        return 0;
    }
    case SV_C_REJECT: case SV_C_EREJECT:
        if (find_action(ex, SIEVE_ACTION_REJECT, NULL) ||
            find_action(ex, SIEVE_ACTION_EREJECT, NULL))
            return 0;
        if (has_conflict_with_reject(ex))
            return rt_error(ex, n->line, "%s conflicts with an earlier "
                            "keep, fileinto, redirect or vacation", n->name);
        ex->keep_cancelled = 1;
        a = add_action(ex, n->line, n->id == SV_C_REJECT ?
                       SIEVE_ACTION_REJECT : SIEVE_ACTION_EREJECT);
        if (!a)
            return -1;
        a->text = expand_dup(ex, fr, &n->pos[0]->v[0]);
        return a->text ? 0 : -1;
    case SV_C_SETFLAG: case SV_C_ADDFLAG: case SV_C_REMOVEFLAG:
        return cmd_flags(ex, fr, n);
    case SV_C_VACATION:
        return cmd_vacation(ex, fr, n);
    case SV_C_SET:
        return cmd_set(ex, fr, n);
    case SV_C_ADDHEADER:
        return cmd_addheader(ex, fr, n);
    case SV_C_DELETEHEADER:
        return cmd_deleteheader(ex, fr, n);
    case SV_C_INCLUDE:
        return cmd_include(ex, fr, n);
    case SV_C_GLOBAL:
        for (i = 0; i < n->pos[0]->n; i++)
            if (strarray_append(&fr->globals, n->pos[0]->v[i].s) < 0)
                return rt_nomem(ex);
        return 0;
    case SV_C_ERROR:
        s = expand_dup(ex, fr, &n->pos[0]->v[0]);
        if (!s)
            return -1;
        rt_error(ex, n->line, "error: %s", s);
        free(s);
        return -1;
    default:
        return rt_error(ex, n->line, "command \"%s\" cannot run", n->name);
    }
}

static int exec_block(struct exec *ex, struct frame *fr,
                      struct sv_node *const *v, size_t nv)
{
    size_t i;
    int chain_done = 0;

    for (i = 0; i < nv && !HALT(ex) && !fr->returned; i++) {
        const struct sv_node *n = v[i];
        int r;

        if (n->id == SV_C_IF || n->id == SV_C_ELSIF) {
            if (n->id == SV_C_IF)
                chain_done = 0;
            if (chain_done)
                continue;
            r = eval_test(ex, fr, n->tests[0]);
            if (r < 0)
                return -1;
            if (r) {
                chain_done = 1;
                if (exec_block(ex, fr, n->block, n->nblock) < 0)
                    return -1;
            }
            continue;
        }
        if (n->id == SV_C_ELSE) {
            if (!chain_done && exec_block(ex, fr, n->block, n->nblock) < 0)
                return -1;
            chain_done = 1;
            continue;
        }
        if (exec_command(ex, fr, n) < 0)
            return -1;
    }
    return ex->rc == SIEVE_OK ? 0 : -1;
}

static int run_script(struct exec *ex, const struct sieve_script *s,
                      struct frame *parent)
{
    struct frame fr;
    int r, pushed;

    (void)parent;
    memset(&fr, 0, sizeof(fr));
    fr.s = s;
    pushed = ex->nstack < SIEVE_INCLUDE_STACK;   /* cmd_include() checked */
    if (pushed)
        ex->stack[ex->nstack++] = s;
    r = exec_block(ex, &fr, s->cmds, s->ncmds);
    if (pushed)
        ex->nstack--;
    scope_fini(&fr.locals);
    strarray_fini(&fr.globals);
    return r;
}

static void action_clear(struct sieve_action *a)
{
    free(a->mailbox);
    free(a->specialuse);
    strarray_fini(&a->flags);
    free(a->address);
    free(a->text);
    free(a->name);
    strarray_fini(&a->addresses);
    free(a->subject);
    free(a->from);
    free(a->handle);
}

void sieve_actions_fini(struct sieve_actions *acts)
{
    size_t i;

    if (!acts)
        return;
    for (i = 0; i < acts->count; i++)
        action_clear(&acts->v[i]);
    free(acts->v);
    acts->v = NULL;
    acts->count = acts->alloc = 0;
}

static void truncate_actions(struct sieve_actions *acts, size_t count)
{
    while (acts->count > count)
        action_clear(&acts->v[--acts->count]);
}

int sieve_execute(const struct sieve_script *script,
                  const struct sieve_message_ctx *ctx,
                  struct sieve_actions *acts, struct buf *errmsg)
{
    struct exec ex;
    size_t start, i;
    int r;

    if (errmsg)
        buf_reset(errmsg);
    if (!script || !ctx || !acts)
        return SIEVE_EINVAL;
    memset(&ex, 0, sizeof(ex));
    ex.lim = &script->limits;
    ex.ctx = ctx;
    ex.acts = acts;
    ex.errmsg = errmsg;
    ex.rc = SIEVE_OK;
    ex.now = ctx->now ? ctx->now : time(NULL);
    start = acts->count;
    r = run_script(&ex, script, NULL);
    (void)r;
    if (ex.rc == SIEVE_OK && !ex.keep_cancelled) {
        struct sieve_action *a = add_action(&ex, 0, SIEVE_ACTION_KEEP);
        if (a) {
            a->implicit = 1;
            for (i = 0; i < ex.flags.count; i++)
                if (strarray_append(&a->flags, ex.flags.data[i]) < 0)
                    rt_nomem(&ex);
        }
    }
    if (ex.rc == SIEVE_ERUNTIME) {
        struct sieve_action *a;
        truncate_actions(acts, start);
        if (acts->count == acts->alloc) {
            struct sieve_action *nv = realloc(acts->v,
                                              (acts->alloc + 1) * sizeof(*nv));
            if (!nv) {
                ex.rc = SIEVE_ENOMEM;
                goto done;
            }
            acts->v = nv;
            acts->alloc++;
        }
        a = &acts->v[acts->count++];
        memset(a, 0, sizeof(*a));
        a->type = SIEVE_ACTION_KEEP;
        a->implicit = 1;
    } else if (ex.rc != SIEVE_OK) {
        truncate_actions(acts, start);
    }
done:
    for (i = 0; i < ex.nedits; i++) {
        free(ex.edits[i].name);
        strarray_fini(&ex.edits[i].raw);
        strarray_fini(&ex.edits[i].dec);
    }
    free(ex.edits);
    for (i = 0; i < EXEC_ADDR_MEMO; i++) {
        if (!ex.addr_memo[i].value && !ex.addr_memo[i].parts.data)
            continue;   /* never used */
        free(ex.addr_memo[i].value);
        strarray_fini(&ex.addr_memo[i].parts);
    }
    strarray_fini(&ex.flags);
    strarray_fini(&ex.matchvars);
    strarray_fini(&ex.once);
    scope_fini(&ex.globals);
    if (ex.rc == SIEVE_ENOMEM && errmsg) {
        buf_reset(errmsg);
        buf_appendcstr(errmsg, "out of memory");
    }
    return ex.rc;
}
