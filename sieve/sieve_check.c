/*
 * sieve_check.c - the checker: resolves the parser's generic tree into the
 * compiled form and refuses everything RFC 5228 and the extensions call
 * an error at compile time.
 *
 * One table row per command or test (name, id, extension, allowed tag
 * groups, positional signature, block/test shape) and one row per tagged
 * argument (name, group, argument kind, extension).  Extensions are
 * enabled by "require" (which must come first) and, within the block of
 * an "if ihave", by ihave; a block under a failed ihave is not checked
 * and raises a runtime error if ever reached.  Encoded characters
 * (RFC 5228 2.4.2.4) are decoded here, and strings that reference
 * variables are marked for run-time expansion.
 */
#include "config.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lib/utf8.h"
#include "sieve/sieve_tree.h"
#include "sieve/sieve_ext.h"

/* tag groups */
#define G_CMP        0x0001u
#define G_MATCH      0x0002u
#define G_ADDR       0x0004u
#define G_INDEX      0x0008u
#define G_ZONE       0x0010u
#define G_CZONE      0x0020u
#define G_FLAGS      0x0040u
#define G_COPY       0x0080u
#define G_CREATE     0x0100u
#define G_SPECIALUSE 0x0200u
#define G_BODY       0x0400u
#define G_VAC        0x0800u
#define G_SETMOD     0x1000u
#define G_INCL       0x2000u
#define G_DUP        0x4000u
#define G_SIZE       0x8000u
#define G_LAST      0x10000u
#define G_DELIDX    0x20000u

struct cmdspec {
    const char *name;
    int id;
    int ext;
    int is_test;
    unsigned tags;
    const char *pos;    /* s string, l list, n number; '?' before: the
                           next one is optional when one short; a final
                           'L': an optional trailing list */
    int tests;          /* 0 none, 1 one test, 2 a test list */
    int block;          /* 1: a block is required */
};

static const struct cmdspec cmds[] = {
    { "require", SV_C_REQUIRE, EXT_NONE, 0, 0, "l", 0, 0 },
    { "if", SV_C_IF, EXT_NONE, 0, 0, "", 1, 1 },
    { "elsif", SV_C_ELSIF, EXT_NONE, 0, 0, "", 1, 1 },
    { "else", SV_C_ELSE, EXT_NONE, 0, 0, "", 0, 1 },
    { "stop", SV_C_STOP, EXT_NONE, 0, 0, "", 0, 0 },
    { "keep", SV_C_KEEP, EXT_NONE, 0, G_FLAGS, "", 0, 0 },
    { "discard", SV_C_DISCARD, EXT_NONE, 0, 0, "", 0, 0 },
    { "redirect", SV_C_REDIRECT, EXT_NONE, 0, G_COPY, "s", 0, 0 },
    { "fileinto", SV_C_FILEINTO, EXT_FILEINTO, 0,
      G_FLAGS | G_COPY | G_CREATE | G_SPECIALUSE, "s", 0, 0 },
    { "reject", SV_C_REJECT, EXT_REJECT, 0, 0, "s", 0, 0 },
    { "ereject", SV_C_EREJECT, EXT_EREJECT, 0, 0, "s", 0, 0 },
    { "setflag", SV_C_SETFLAG, EXT_IMAP4FLAGS, 0, 0, "?sl", 0, 0 },
    { "addflag", SV_C_ADDFLAG, EXT_IMAP4FLAGS, 0, 0, "?sl", 0, 0 },
    { "removeflag", SV_C_REMOVEFLAG, EXT_IMAP4FLAGS, 0, 0, "?sl", 0, 0 },
    { "vacation", SV_C_VACATION, EXT_VACATION, 0, G_VAC, "s", 0, 0 },
    { "set", SV_C_SET, EXT_VARIABLES, 0, G_SETMOD, "ss", 0, 0 },
    { "addheader", SV_C_ADDHEADER, EXT_EDITHEADER, 0, G_LAST, "ss", 0, 0 },
    { "deleteheader", SV_C_DELETEHEADER, EXT_EDITHEADER, 0,
      G_DELIDX | G_CMP | G_MATCH, "sL", 0, 0 },
    { "include", SV_C_INCLUDE, EXT_INCLUDE, 0, G_INCL, "s", 0, 0 },
    { "return", SV_C_RETURN, EXT_INCLUDE, 0, 0, "", 0, 0 },
    { "global", SV_C_GLOBAL, EXT_INCLUDE, 0, 0, "l", 0, 0 },
    { "error", SV_C_ERROR, EXT_IHAVE, 0, 0, "s", 0, 0 },

    { "address", SV_T_ADDRESS, EXT_NONE, 1, G_CMP | G_MATCH | G_ADDR | G_INDEX,
      "ll", 0, 0 },
    { "envelope", SV_T_ENVELOPE, EXT_ENVELOPE, 1, G_CMP | G_MATCH | G_ADDR,
      "ll", 0, 0 },
    { "header", SV_T_HEADER, EXT_NONE, 1, G_CMP | G_MATCH | G_INDEX, "ll", 0, 0 },
    { "exists", SV_T_EXISTS, EXT_NONE, 1, 0, "l", 0, 0 },
    { "size", SV_T_SIZE, EXT_NONE, 1, G_SIZE, "n", 0, 0 },
    { "allof", SV_T_ALLOF, EXT_NONE, 1, 0, "", 2, 0 },
    { "anyof", SV_T_ANYOF, EXT_NONE, 1, 0, "", 2, 0 },
    { "not", SV_T_NOT, EXT_NONE, 1, 0, "", 1, 0 },
    { "true", SV_T_TRUE, EXT_NONE, 1, 0, "", 0, 0 },
    { "false", SV_T_FALSE, EXT_NONE, 1, 0, "", 0, 0 },
    { "hasflag", SV_T_HASFLAG, EXT_IMAP4FLAGS, 1, G_CMP | G_MATCH, "?ll", 0, 0 },
    { "body", SV_T_BODY, EXT_BODY, 1, G_CMP | G_MATCH | G_BODY, "l", 0, 0 },
    { "string", SV_T_STRING, EXT_VARIABLES, 1, G_CMP | G_MATCH, "ll", 0, 0 },
    { "mailboxexists", SV_T_MAILBOXEXISTS, EXT_MAILBOX, 1, 0, "l", 0, 0 },
    { "date", SV_T_DATE, EXT_DATE, 1, G_CMP | G_MATCH | G_ZONE | G_INDEX,
      "ssl", 0, 0 },
    { "currentdate", SV_T_CURRENTDATE, EXT_DATE, 1, G_CMP | G_MATCH | G_CZONE,
      "sl", 0, 0 },
    { "duplicate", SV_T_DUPLICATE, EXT_DUPLICATE, 1, G_DUP, "", 0, 0 },
    { "ihave", SV_T_IHAVE, EXT_IHAVE, 1, 0, "l", 0, 0 },
    { "environment", SV_T_ENVIRONMENT, EXT_ENVIRONMENT, 1, G_CMP | G_MATCH,
      "sl", 0, 0 },
};

enum tagcode {
    TG_COMPARATOR, TG_IS, TG_CONTAINS, TG_MATCHES, TG_REGEX, TG_VALUE,
    TG_COUNT, TG_ALL, TG_LOCAL, TG_DOMAIN, TG_USER, TG_DETAIL, TG_INDEX,
    TG_LAST, TG_ZONE, TG_ORIGZONE, TG_FLAGS, TG_COPY, TG_CREATE,
    TG_SPECIALUSE, TG_RAW, TG_CONTENT, TG_TEXT, TG_DAYS, TG_SECONDS,
    TG_SUBJECT, TG_FROM, TG_ADDRESSES, TG_MIME, TG_HANDLE, TG_LOWER,
    TG_UPPER, TG_LOWERFIRST, TG_UPPERFIRST, TG_QUOTEWILDCARD, TG_QUOTEREGEX,
    TG_LENGTH, TG_PERSONAL, TG_GLOBAL, TG_ONCE, TG_OPTIONAL, TG_HEADER,
    TG_UNIQUEID, TG_OVER, TG_UNDER
};

struct tagspec {
    const char *name;
    unsigned group;
    char arg;           /* 's', 'l', 'n' or 0 */
    int ext;
    enum tagcode code;
};

static const struct tagspec tags[] = {
    { "comparator", G_CMP, 's', EXT_NONE, TG_COMPARATOR },
    { "is", G_MATCH, 0, EXT_NONE, TG_IS },
    { "contains", G_MATCH, 0, EXT_NONE, TG_CONTAINS },
    { "matches", G_MATCH, 0, EXT_NONE, TG_MATCHES },
    { "regex", G_MATCH, 0, EXT_REGEX, TG_REGEX },
    { "value", G_MATCH, 's', EXT_RELATIONAL, TG_VALUE },
    { "count", G_MATCH, 's', EXT_RELATIONAL, TG_COUNT },
    { "all", G_ADDR, 0, EXT_NONE, TG_ALL },
    { "localpart", G_ADDR, 0, EXT_NONE, TG_LOCAL },
    { "domain", G_ADDR, 0, EXT_NONE, TG_DOMAIN },
    { "user", G_ADDR, 0, EXT_SUBADDRESS, TG_USER },
    { "detail", G_ADDR, 0, EXT_SUBADDRESS, TG_DETAIL },
    { "index", G_INDEX, 'n', EXT_INDEX, TG_INDEX },
    { "last", G_INDEX, 0, EXT_INDEX, TG_LAST },
    { "index", G_DELIDX, 'n', EXT_EDITHEADER, TG_INDEX },
    { "last", G_DELIDX, 0, EXT_EDITHEADER, TG_LAST },
    { "last", G_LAST, 0, EXT_EDITHEADER, TG_LAST },
    { "last", G_DUP, 0, EXT_DUPLICATE, TG_LAST },
    { "zone", G_ZONE | G_CZONE, 's', EXT_DATE, TG_ZONE },
    { "originalzone", G_ZONE, 0, EXT_DATE, TG_ORIGZONE },
    { "flags", G_FLAGS, 'l', EXT_IMAP4FLAGS, TG_FLAGS },
    { "copy", G_COPY, 0, EXT_COPY, TG_COPY },
    { "create", G_CREATE, 0, EXT_MAILBOX, TG_CREATE },
    { "specialuse", G_SPECIALUSE, 's', EXT_SPECIALUSE, TG_SPECIALUSE },
    { "raw", G_BODY, 0, EXT_BODY, TG_RAW },
    { "content", G_BODY, 'l', EXT_BODY, TG_CONTENT },
    { "text", G_BODY, 0, EXT_BODY, TG_TEXT },
    { "days", G_VAC, 'n', EXT_VACATION, TG_DAYS },
    { "seconds", G_VAC, 'n', EXT_VACATION_SECONDS, TG_SECONDS },
    { "subject", G_VAC, 's', EXT_VACATION, TG_SUBJECT },
    { "from", G_VAC, 's', EXT_VACATION, TG_FROM },
    { "addresses", G_VAC, 'l', EXT_VACATION, TG_ADDRESSES },
    { "mime", G_VAC, 0, EXT_VACATION, TG_MIME },
    { "handle", G_VAC, 's', EXT_VACATION, TG_HANDLE },
    { "handle", G_DUP, 's', EXT_DUPLICATE, TG_HANDLE },
    { "header", G_DUP, 's', EXT_DUPLICATE, TG_HEADER },
    { "uniqueid", G_DUP, 's', EXT_DUPLICATE, TG_UNIQUEID },
    { "seconds", G_DUP, 'n', EXT_DUPLICATE, TG_SECONDS },
    { "lower", G_SETMOD, 0, EXT_VARIABLES, TG_LOWER },
    { "upper", G_SETMOD, 0, EXT_VARIABLES, TG_UPPER },
    { "lowerfirst", G_SETMOD, 0, EXT_VARIABLES, TG_LOWERFIRST },
    { "upperfirst", G_SETMOD, 0, EXT_VARIABLES, TG_UPPERFIRST },
    { "quotewildcard", G_SETMOD, 0, EXT_VARIABLES, TG_QUOTEWILDCARD },
    { "quoteregex", G_SETMOD, 0, EXT_REGEX, TG_QUOTEREGEX },
    { "length", G_SETMOD, 0, EXT_VARIABLES, TG_LENGTH },
    { "personal", G_INCL, 0, EXT_INCLUDE, TG_PERSONAL },
    { "global", G_INCL, 0, EXT_INCLUDE, TG_GLOBAL },
    { "once", G_INCL, 0, EXT_INCLUDE, TG_ONCE },
    { "optional", G_INCL, 0, EXT_INCLUDE, TG_OPTIONAL },
    { "over", G_SIZE, 0, EXT_NONE, TG_OVER },
    { "under", G_SIZE, 0, EXT_NONE, TG_UNDER },
};

struct checker {
    struct sieve_script *s;
    const struct strarray *allowed;
    struct buf *errmsg;
    int rc;
    unsigned char enabled[EXT_COUNT];
    unsigned long regex_cost;     /* of the keys compiled so far */
};

static int cerr(struct checker *c, unsigned line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int cerr(struct checker *c, unsigned line, const char *fmt, ...)
{
    va_list ap;

    if (c->rc != SIEVE_OK)
        return -1;
    c->rc = SIEVE_ESYNTAX;
    if (c->errmsg) {
        buf_reset(c->errmsg);
        buf_printf(c->errmsg, "line %u: ", line);
        va_start(ap, fmt);
        buf_vprintf(c->errmsg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int nomem(struct checker *c, unsigned line)
{
    if (c->rc == SIEVE_OK) {
        c->rc = SIEVE_ENOMEM;
        if (c->errmsg) {
            buf_reset(c->errmsg);
            buf_printf(c->errmsg, "line %u: out of memory", line);
        }
    }
    return -1;
}

/* ---- encoded characters (RFC 5228 2.4.2.4) ---------------------------- */

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* try to decode one "${hex:...}" / "${unicode:...}" at s[i]; returns the
 * bytes consumed (0 when it is not a valid encoded character, which
 * then stays as written), -1 on a bad Unicode code point (an error) */
static long decode_one(const char *s, size_t len, size_t i, struct buf *out)
{
    size_t j, k;
    int unicode;

    if (i + 2 >= len || s[i] != '$' || s[i + 1] != '{')
        return 0;
    j = i + 2;
    if (len - j >= 4 && strncasecmp(s + j, "hex:", 4) == 0) {
        unicode = 0;
        j += 4;
    } else if (len - j >= 8 && strncasecmp(s + j, "unicode:", 8) == 0) {
        unicode = 1;
        j += 8;
    } else {
        return 0;
    }
    /* validate first: blank* hex-pair-seq blank* "}" */
    {
        size_t p = j;
        int seen = 0;
        for (;;) {
            while (p < len && (s[p] == ' ' || s[p] == '\t' || s[p] == '\r' ||
                               s[p] == '\n'))
                p++;
            if (p < len && s[p] == '}')
                break;
            k = p;
            while (p < len && hexval((unsigned char)s[p]) >= 0)
                p++;
            if (p == k)
                return 0;
            if (!unicode && p - k > 2)     /* hex-pair = 1*2HEXDIG */
                return 0;
            if (p < len && s[p] != '}' && s[p] != ' ' && s[p] != '\t' &&
                s[p] != '\r' && s[p] != '\n')
                return 0;
            if (unicode && p - k > 8)
                return 0;
            seen = 1;
        }
        if (!seen)
            return 0;
        k = p;    /* the '}' */
    }
    while (j < k) {
        unsigned long v;
        size_t st;
        while (j < k && (s[j] == ' ' || s[j] == '\t' || s[j] == '\r' ||
                         s[j] == '\n'))
            j++;
        if (j >= k)
            break;
        st = j;
        if (!unicode) {
            v = 0;
            while (j < k && hexval((unsigned char)s[j]) >= 0)
                v = v * 16 + (unsigned long)hexval((unsigned char)s[j++]);
            if (buf_putc(out, (int)v) < 0)
                return -2;
        } else {
            v = 0;
            while (j < k && hexval((unsigned char)s[j]) >= 0)
                v = v * 16 + (unsigned long)hexval((unsigned char)s[j++]);
            if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
                return -1;
            if (utf8_put(out, (uint32_t)v) < 0)
                return -2;
        }
        (void)st;
    }
    return (long)(k + 1 - i);
}

static int decode_encoded(struct checker *c, struct sv_str *str,
                          unsigned line)
{
    struct buf out = BUF_INITIALIZER;
    size_t i = 0;

    if (!memchr(str->s, '$', str->len))
        return 0;
    while (i < str->len) {
        long n = decode_one(str->s, str->len, i, &out);
        if (n == -1) {
            buf_free(&out);
            return cerr(c, line, "invalid Unicode character in encoded "
                        "character");
        }
        if (n == -2) {
            buf_free(&out);
            return nomem(c, line);
        }
        if (n == 0) {
            if (buf_putc(&out, str->s[i]) < 0) {
                buf_free(&out);
                return nomem(c, line);
            }
            i++;
        } else {
            i += (size_t)n;
        }
    }
    free(str->s);
    str->len = out.len;
    str->s = buf_release(&out);
    return str->s ? 0 : nomem(c, line);
}

/* ---- helpers ------------------------------------------------------------ */

static int ext_allowed(struct checker *c, int ext)
{
    if (ext < 0)
        return 0;
    if (!c->allowed)
        return 1;
    return strarray_find(c->allowed, sieve_ext_names[ext]) >= 0 ||
           ext == EXT_CMP_OCTET || ext == EXT_CMP_CASEMAP;
}

static int valid_varname(const char *s, size_t len, int allow_ns)
{
    size_t i;
    int start = 1;

    if (len == 0)
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '.' && allow_ns && !start) {
            start = 1;
            continue;
        }
        if (start && isdigit(ch))
            return 0;
        if (!(isalnum(ch) || ch == '_'))
            return 0;
        start = 0;
    }
    return !start;
}

static int valid_header_name(const char *s, size_t len)
{
    size_t i;

    if (len == 0)
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch <= 32 || ch >= 127 || ch == ':')
            return 0;
    }
    return 1;
}

/* RFC 5228 5.1: the address test is for headers that hold addresses */
static const char *const address_headers[] = {
    "from", "sender", "to", "cc", "bcc", "reply-to", "resent-from",
    "resent-sender", "resent-to", "resent-cc", "resent-bcc",
    "resent-reply-to", "return-path", "delivered-to", "errors-to",
    "envelope-to", "x-original-to", "original-recipient",
    "disposition-notification-to", "mail-followup-to", "mail-reply-to",
    "apparently-to", NULL
};

int sieve_check_address_header(const char *name)
{
    size_t i;

    for (i = 0; address_headers[i]; i++)
        if (strcasecmp(address_headers[i], name) == 0)
            return 1;
    return 0;
}

static const char *date_parts[] = {
    "year", "month", "day", "date", "julian", "hour", "minute", "second",
    "time", "iso8601", "std11", "zone", "weekday", NULL
};

static int valid_zone(const char *s, size_t len)
{
    size_t i;

    if (len != 5 || (s[0] != '+' && s[0] != '-'))
        return 0;
    for (i = 1; i < 5; i++)
        if (!isdigit((unsigned char)s[i]))
            return 0;
    return (s[1] - '0') * 10 + (s[2] - '0') <= 23 &&
           (s[3] - '0') * 10 + (s[4] - '0') <= 59;
}

static int check_node(struct checker *c, struct sv_node *n, int in_test);
static int ihave_value(struct checker *c, const struct sv_node *t);

static int check_commands(struct checker *c, struct sv_node **v, size_t nv,
                          int toplevel);

static void mark_unchecked(struct sv_node **v, size_t nv)
{
    size_t i;

    for (i = 0; i < nv; i++)
        v[i]->unchecked = 1;
}

static int strlist_walk(struct checker *c, struct sv_strlist *sl,
                        unsigned line)
{
    size_t i;

    for (i = 0; i < sl->n; i++) {
        if (c->enabled[EXT_ENCODED] &&
            decode_encoded(c, &sl->v[i], line) < 0)
            return -1;
        if (c->enabled[EXT_VARIABLES] &&
            strstr(sl->v[i].s, "${") != NULL)
            sl->v[i].has_var = 1;
    }
    return 0;
}

static int set_match(struct checker *c, struct sv_node *n, unsigned line,
                     int match)
{
    if (n->has_match)
        return cerr(c, line, "more than one match type for %s", n->name);
    n->has_match = 1;
    n->match = match;
    return 0;
}

static int regex_compile_key(struct checker *c, struct sv_node *n,
                             struct sv_str *k, unsigned line)
{
    int rc;
    int flags = REG_EXTENDED;
    unsigned long cost;
    const char *why;

    /* a key with variables is checked again once expanded (sieve_exec) */
    why = sieve_regex_refusal(k->s, k->len, k->has_var ? ULONG_MAX :
                              c->s->limits.max_regex_cost, &cost);
    if (why && !k->has_var && cost > c->s->limits.max_regex_cost)
        return cerr(c, line, "regular expression \"%s\" refused: %s "
                    "(cost %lu, limit %lu)", k->s, why, cost,
                    c->s->limits.max_regex_cost);
    if (why)
        return cerr(c, line, "regular expression \"%s\" refused: %s",
                    k->s, why);
    if (k->has_var)
        return 0;
    c->regex_cost += cost;
    if (c->regex_cost > c->s->limits.max_regex_cost)
        return cerr(c, line, "the regular expressions of the script are "
                    "too large together (cost %lu, limit %lu)",
                    c->regex_cost, c->s->limits.max_regex_cost);
    if (n->comparator == SV_CMP_CASEMAP)
        flags |= REG_ICASE;
    k->re = calloc(1, sizeof(*k->re));
    if (!k->re)
        return nomem(c, line);
    rc = regcomp(k->re, k->s, flags);
    if (rc != 0) {
        char eb[128];
        regerror(rc, k->re, eb, sizeof(eb));
        free(k->re);
        k->re = NULL;
        return cerr(c, line, "invalid regular expression \"%s\": %s",
                    k->s, eb);
    }
    return 0;
}

/* tagged arguments, then positional ones against spec->pos */
static int check_args(struct checker *c, struct sv_node *n,
                      const struct cmdspec *spec)
{
    size_t i;
    int seen_pos = 0;
    unsigned setmod_levels = 0;
    int has_days = 0, has_zone = 0, has_addrpart_user = 0;
    int has_index = 0, has_last = 0, has_header = 0, has_size = 0;
    int has_body = 0, has_incl_loc = 0;
    const struct sv_str *cmpname = NULL;
    const struct sv_str *relname = NULL;
    size_t npos = 0;
    const struct sv_strlist *pos[4];
    char kinds[4];

    n->comparator = SV_CMP_CASEMAP;
    n->match = SV_MATCH_IS;
    n->addrpart = SV_ADDR_ALL;
    n->body_transform = SIEVE_BODY_TEXT;
    for (i = 0; i < n->nargs; i++) {
        struct sv_arg *a = &n->args[i];
        const struct tagspec *t = NULL;
        int known = 0;
        size_t k;

        if (a->kind == SV_ARG_STRLIST &&
            strlist_walk(c, &a->sl, a->line) < 0)
            return -1;
        if (a->kind != SV_ARG_TAG) {
            if (npos >= 3)
                return cerr(c, a->line, "too many arguments for %s",
                            n->name);
            pos[npos] = &a->sl;
            kinds[npos] = a->kind == SV_ARG_NUM ? 'n' : 'l';
            if (a->kind == SV_ARG_NUM)
                n->number = a->num;
            if (a->kind == SV_ARG_STRLIST && !a->is_list && a->sl.n == 1)
                kinds[npos] = 's';
            npos++;
            seen_pos = 1;
            continue;
        }
        if (seen_pos)
            return cerr(c, a->line, "tagged argument :%s after positional "
                        "arguments of %s", a->tag, n->name);
        for (k = 0; k < sizeof(tags) / sizeof(tags[0]); k++) {
            if (strcasecmp(tags[k].name, a->tag) != 0)
                continue;
            known = 1;
            if (tags[k].group & spec->tags) {
                t = &tags[k];
                break;
            }
        }
        if (!t)
            return cerr(c, a->line, "%s tagged argument :%s for %s",
                        known ? "unexpected" : "unknown", a->tag, n->name);
        if (t->ext != EXT_NONE && !c->enabled[t->ext])
            return cerr(c, a->line, ":%s needs require \"%s\"", t->name,
                        sieve_ext_names[t->ext]);
        /* the tag's own argument */
        if (t->arg) {
            struct sv_arg *b = i + 1 < n->nargs ? &n->args[i + 1] : NULL;
            if (!b || b->kind == SV_ARG_TAG ||
                (t->arg == 'n') != (b->kind == SV_ARG_NUM) ||
                (t->arg == 's' && (b->is_list || b->sl.n != 1)))
                return cerr(c, a->line, ":%s needs a %s argument", t->name,
                            t->arg == 'n' ? "number" :
                            t->arg == 's' ? "string" : "string list");
            if (b->kind == SV_ARG_STRLIST &&
                strlist_walk(c, &b->sl, b->line) < 0)
                return -1;
            i++;
        }
        {
            struct sv_arg *b = t->arg ? &n->args[i] : NULL;
            const struct sv_str *bs = b && b->kind == SV_ARG_STRLIST ?
                                      &b->sl.v[0] : NULL;
            switch (t->code) {
            case TG_COMPARATOR:
                if (n->has_comparator)
                    return cerr(c, a->line, "more than one comparator");
                n->has_comparator = 1;
                cmpname = bs;
                break;
            case TG_IS: if (set_match(c, n, a->line, SV_MATCH_IS)) return -1;
                break;
            case TG_CONTAINS:
                if (set_match(c, n, a->line, SV_MATCH_CONTAINS)) return -1;
                break;
            case TG_MATCHES:
                if (set_match(c, n, a->line, SV_MATCH_MATCHES)) return -1;
                break;
            case TG_REGEX:
                if (set_match(c, n, a->line, SV_MATCH_REGEX)) return -1;
                break;
            case TG_VALUE: case TG_COUNT:
                if (set_match(c, n, a->line, t->code == TG_VALUE ?
                              SV_MATCH_VALUE : SV_MATCH_COUNT))
                    return -1;
                relname = bs;
                break;
            case TG_ALL: case TG_LOCAL: case TG_DOMAIN: case TG_USER:
            case TG_DETAIL:
                if (n->has_addrpart)
                    return cerr(c, a->line, "more than one address part");
                n->has_addrpart = 1;
                n->addrpart = t->code == TG_ALL ? SV_ADDR_ALL :
                              t->code == TG_LOCAL ? SV_ADDR_LOCAL :
                              t->code == TG_DOMAIN ? SV_ADDR_DOMAIN :
                              t->code == TG_USER ? SV_ADDR_USER :
                              SV_ADDR_DETAIL;
                has_addrpart_user = 1;
                break;
            case TG_INDEX:
                if (has_index++)
                    return cerr(c, a->line, ":index given twice");
                if (b->num == 0)
                    return cerr(c, a->line, ":index must be 1 or more");
                n->index = b->num;
                break;
            case TG_LAST:
                if (has_last++)
                    return cerr(c, a->line, ":last given twice");
                n->last = 1;
                break;
            case TG_ZONE: case TG_ORIGZONE:
                if (has_zone++)
                    return cerr(c, a->line, ":zone and :originalzone "
                                "exclude each other");
                if (t->code == TG_ORIGZONE) {
                    n->originalzone = 1;
                } else {
                    if (!bs->has_var && !valid_zone(bs->s, bs->len))
                        return cerr(c, a->line, "invalid :zone \"%s\"",
                                    bs->s);
                    n->zone = bs;
                }
                break;
            case TG_FLAGS:
                if (n->has_flags++)
                    return cerr(c, a->line, ":flags given twice");
                n->flags = &b->sl;
                break;
            case TG_COPY:
                if (n->copy++)
                    return cerr(c, a->line, ":copy given twice");
                break;
            case TG_CREATE:
                if (n->create++)
                    return cerr(c, a->line, ":create given twice");
                break;
            case TG_SPECIALUSE:
                if (n->specialuse)
                    return cerr(c, a->line, ":specialuse given twice");
                if (!bs->has_var && (bs->len < 2 || bs->s[0] != '\\'))
                    return cerr(c, a->line, "invalid special-use flag "
                                "\"%s\"", bs->s);
                n->specialuse = bs;
                break;
            case TG_RAW: case TG_CONTENT: case TG_TEXT:
                if (has_body++)
                    return cerr(c, a->line, "more than one body transform");
                n->body_transform = t->code == TG_RAW ? SIEVE_BODY_RAW :
                                    t->code == TG_TEXT ? SIEVE_BODY_TEXT :
                                    SIEVE_BODY_CONTENT;
                if (t->code == TG_CONTENT)
                    n->content_types = &b->sl;
                break;
            case TG_DAYS: case TG_SECONDS:
                if (has_days++)
                    return cerr(c, a->line, t->group == G_DUP ?
                                ":seconds given twice" :
                                ":days and :seconds exclude each other");
                n->has_seconds = 1;
                /* RFC 5230 4.1: at least one day; RFC 6131 allows
                 * :seconds 0 (reply every time) */
                n->seconds = t->code == TG_SECONDS ? b->num :
                             b->num == 0 ? 86400ULL :
                             b->num > 3650 ? 3650 * 86400ULL :
                             b->num * 86400ULL;
                break;
            case TG_SUBJECT:
                if (n->subject) return cerr(c, a->line, ":subject twice");
                n->subject = bs;
                break;
            case TG_FROM:
                if (n->from) return cerr(c, a->line, ":from twice");
                n->from = bs;
                break;
            case TG_ADDRESSES:
                if (n->addresses) return cerr(c, a->line, ":addresses twice");
                n->addresses = &b->sl;
                break;
            case TG_MIME:
                if (n->mime++) return cerr(c, a->line, ":mime twice");
                break;
            case TG_HANDLE:
                if (n->handle) return cerr(c, a->line, ":handle twice");
                n->handle = bs;
                break;
            case TG_HEADER: case TG_UNIQUEID:
                if (has_header++)
                    return cerr(c, a->line, ":header and :uniqueid "
                                "exclude each other");
                if (t->code == TG_HEADER) {
                    if (!bs->has_var && !valid_header_name(bs->s, bs->len))
                        return cerr(c, a->line, "invalid header name \"%s\"",
                                    bs->s);
                    n->header = bs;
                } else {
                    n->uniqueid = bs;
                }
                break;
            case TG_LOWER: case TG_UPPER: case TG_LOWERFIRST:
            case TG_UPPERFIRST: case TG_QUOTEWILDCARD: case TG_QUOTEREGEX:
            case TG_LENGTH: {
                unsigned bit, level;
                switch (t->code) {
                case TG_LOWER: bit = SV_MOD_LOWER; level = 1; break;
                case TG_UPPER: bit = SV_MOD_UPPER; level = 1; break;
                case TG_LOWERFIRST: bit = SV_MOD_LOWERFIRST; level = 2; break;
                case TG_UPPERFIRST: bit = SV_MOD_UPPERFIRST; level = 2; break;
                case TG_QUOTEWILDCARD:
                    bit = SV_MOD_QUOTEWILDCARD; level = 4; break;
                case TG_QUOTEREGEX: bit = SV_MOD_QUOTEREGEX; level = 4; break;
                default: bit = SV_MOD_LENGTH; level = 8; break;
                }
                if (setmod_levels & level)
                    return cerr(c, a->line, "two modifiers of the same "
                                "precedence for set");
                setmod_levels |= level;
                n->modifiers |= bit;
                break;
            }
            case TG_PERSONAL: case TG_GLOBAL:
                if (has_incl_loc++)
                    return cerr(c, a->line, ":personal and :global exclude "
                                "each other");
                n->global = t->code == TG_GLOBAL;
                break;
            case TG_ONCE:
                if (n->once++) return cerr(c, a->line, ":once twice");
                break;
            case TG_OPTIONAL:
                if (n->optional++) return cerr(c, a->line, ":optional twice");
                break;
            case TG_OVER: case TG_UNDER:
                if (has_size++)
                    return cerr(c, a->line, "size takes one of :over and "
                                ":under");
                n->over = t->code == TG_OVER;
                break;
            }
        }
    }
    (void)has_addrpart_user;

    /* positional signature */
    {
        const char *sig = spec->pos;
        size_t want = 0, optional = 0, j = 0, p = 0;
        int trailing = 0;
        const char *q;
        char expect[4];

        for (q = sig; *q; q++) {
            if (*q == '?') { optional = 1; continue; }
            if (*q == 'L') { trailing = 1; expect[want++] = 'l'; continue; }
            expect[want++] = *q;
        }
        if (optional && npos == want - 1)
            j = 1;
        else if (trailing && npos == want - 1)
            want--;
        if (npos + j != want)
            return cerr(c, n->line, "%s takes %zu argument%s, not %zu",
                        n->name, want - j, want - j == 1 ? "" : "s", npos);
        for (; j < want; j++, p++) {
            char e = expect[j], g = kinds[p];
            if (e == 'n' && g != 'n')
                return cerr(c, n->line, "argument %zu of %s must be a "
                            "number", p + 1, n->name);
            if (e != 'n' && g == 'n')
                return cerr(c, n->line, "argument %zu of %s must be a "
                            "string%s", p + 1, n->name,
                            e == 'l' ? " list" : "");
            if (e == 's' && g != 's')
                return cerr(c, n->line, "argument %zu of %s must be a "
                            "string, not a list", p + 1, n->name);
            n->pos[n->npos++] = pos[p];
        }
    }

    /* the comparator and relational operator */
    if (cmpname) {
        if (strcasecmp(cmpname->s, "i;octet") == 0)
            n->comparator = SV_CMP_OCTET;
        else if (strcasecmp(cmpname->s, "i;ascii-casemap") == 0)
            n->comparator = SV_CMP_CASEMAP;
        else if (strcasecmp(cmpname->s, "i;ascii-numeric") == 0 &&
                 c->enabled[EXT_CMP_NUMERIC])
            n->comparator = SV_CMP_NUMERIC;
        else if (strcasecmp(cmpname->s, "i;ascii-numeric") == 0)
            return cerr(c, n->line, "comparator \"i;ascii-numeric\" needs "
                        "require \"comparator-i;ascii-numeric\"");
        else
            return cerr(c, n->line, "unknown comparator \"%s\"", cmpname->s);
        if (n->comparator == SV_CMP_NUMERIC &&
            (n->match == SV_MATCH_CONTAINS || n->match == SV_MATCH_MATCHES ||
             n->match == SV_MATCH_REGEX))
            return cerr(c, n->line, "comparator \"i;ascii-numeric\" does "
                        "not support substring matches");
    }
    if (relname) {
        static const char *ops[] = { "gt", "ge", "lt", "le", "eq", "ne" };
        size_t k;
        for (k = 0; k < 6; k++)
            if (strcasecmp(relname->s, ops[k]) == 0)
                break;
        if (k == 6)
            return cerr(c, n->line, "invalid relational operator \"%s\"",
                        relname->s);
        n->relop = (int)k;
    }
    if (n->last && !has_index && (spec->tags & G_INDEX))
        return cerr(c, n->line, ":last needs :index");
    if (n->last && !has_index && (spec->tags & G_DELIDX))
        return cerr(c, n->line, ":last needs :index");
    if (spec->id == SV_T_SIZE && !has_size)
        return cerr(c, n->line, "size needs :over or :under");
    return 0;
}

/* per-command checks after the arguments */
static int check_specific(struct checker *c, struct sv_node *n)
{
    size_t i;

    switch (n->id) {
    case SV_T_HEADER: case SV_T_ADDRESS: case SV_T_EXISTS: case SV_T_DATE:
        for (i = 0; i < n->pos[0]->n; i++) {
            const struct sv_str *h = &n->pos[0]->v[i];
            if (!h->has_var && !valid_header_name(h->s, h->len))
                return cerr(c, n->line, "invalid header name \"%s\"", h->s);
            if (n->id == SV_T_ADDRESS && !h->has_var &&
                !sieve_check_address_header(h->s))
                return cerr(c, n->line, "header \"%s\" holds no addresses "
                            "(address test)", h->s);
        }
        break;
    case SV_C_ADDHEADER: case SV_C_DELETEHEADER: {
        const struct sv_str *h = &n->pos[0]->v[0];
        if (!h->has_var && !valid_header_name(h->s, h->len))
            return cerr(c, n->line, "invalid header name \"%s\"", h->s);
        break;
    }
    case SV_T_ENVELOPE:
        for (i = 0; i < n->pos[0]->n; i++) {
            const struct sv_str *h = &n->pos[0]->v[i];
            if (!h->has_var && strcasecmp(h->s, "from") != 0 &&
                strcasecmp(h->s, "to") != 0 && strcasecmp(h->s, "auth") != 0)
                return cerr(c, n->line, "unknown envelope part \"%s\"",
                            h->s);
        }
        break;
    case SV_C_SET: {
        const struct sv_str *v = &n->pos[0]->v[0];
        if (!valid_varname(v->s, v->len, 0))
            return cerr(c, n->line, "invalid variable name \"%s\"", v->s);
        break;
    }
    case SV_C_GLOBAL:
        if (!c->enabled[EXT_VARIABLES])
            return cerr(c, n->line, "global needs require \"variables\"");
        /* fall through */
    case SV_C_SETFLAG: case SV_C_ADDFLAG: case SV_C_REMOVEFLAG:
    case SV_T_HASFLAG:
        if ((n->id == SV_C_GLOBAL || n->npos == 2) &&
            !c->enabled[EXT_VARIABLES])
            return cerr(c, n->line, "a variable name needs require "
                        "\"variables\"");
        if (n->id == SV_C_GLOBAL || n->npos == 2) {
            const struct sv_strlist *vl = n->pos[0];
            for (i = 0; i < vl->n; i++)
                if (!valid_varname(vl->v[i].s, vl->v[i].len, 0))
                    return cerr(c, n->line, "invalid variable name \"%s\"",
                                vl->v[i].s);
        }
        break;
    case SV_T_CURRENTDATE:
        break;
    case SV_C_REDIRECT: {
        const struct sv_str *v = &n->pos[0]->v[0];
        const char *at = strrchr(v->s, '@');
        if (!v->has_var && (!at || at == v->s || !at[1] ||
                            strpbrk(v->s, " \t\r\n<>,\"") ||
                            strlen(v->s) != v->len))
            return cerr(c, n->line, "redirect: invalid address \"%s\"",
                        v->s);
        break;
    }
    case SV_C_INCLUDE: {
        const struct sv_str *v = &n->pos[0]->v[0];
        if (!v->has_var && (v->len == 0 || memchr(v->s, '/', v->len)))
            return cerr(c, n->line, "invalid script name \"%s\"", v->s);
        break;
    }
    default:
        break;
    }
    if (n->id == SV_T_DATE || n->id == SV_T_CURRENTDATE) {
        const struct sv_str *dp = &n->pos[n->id == SV_T_DATE ? 1 : 0]->v[0];
        size_t k;
        if (!dp->has_var) {
            for (k = 0; date_parts[k]; k++)
                if (strcasecmp(date_parts[k], dp->s) == 0)
                    break;
            if (!date_parts[k])
                return cerr(c, n->line, "unknown date part \"%s\"", dp->s);
        }
    }
    if (n->has_match && n->match == SV_MATCH_REGEX) {
        const struct sv_strlist *keys = n->pos[n->npos - 1];
        if (n->id == SV_C_DELETEHEADER && n->npos < 2)
            return cerr(c, n->line, ":regex without value patterns");
        for (i = 0; i < keys->n; i++)
            if (regex_compile_key(c, n, (struct sv_str *)&keys->v[i],
                                  n->line) < 0)
                return -1;
    }
    return 0;
}

static const struct cmdspec *find_spec(const char *name)
{
    size_t i;

    for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (strcasecmp(cmds[i].name, name) == 0)
            return &cmds[i];
    return NULL;
}

static int check_node(struct checker *c, struct sv_node *n, int in_test)
{
    const struct cmdspec *spec = find_spec(n->name);
    size_t i;

    if (!spec || spec->is_test != in_test) {
        if (spec && in_test)
            return cerr(c, n->line, "%s is a command, not a test", n->name);
        if (spec)
            return cerr(c, n->line, "%s is a test, not a command", n->name);
        return cerr(c, n->line, "unknown %s \"%s\"",
                    in_test ? "test" : "command", n->name);
    }
    if (spec->ext != EXT_NONE && !c->enabled[spec->ext])
        return cerr(c, n->line, "%s needs require \"%s\"", n->name,
                    sieve_ext_names[spec->ext]);
    n->id = spec->id;
    if (check_args(c, n, spec) < 0)
        return -1;
    /* tests */
    if (spec->tests == 0 && n->ntests > 0)
        return cerr(c, n->line, "%s takes no test", n->name);
    if (spec->tests == 1 && (n->ntests != 1 || n->test_list))
        return cerr(c, n->line, "%s needs one test", n->name);
    if (spec->tests == 2 && (!n->test_list || n->ntests == 0))
        return cerr(c, n->line, "%s needs a test list", n->name);
    if (!in_test) {
        if (spec->block && !n->has_block)
            return cerr(c, n->line, "%s needs a block", n->name);
        if (!spec->block && n->has_block)
            return cerr(c, n->line, "%s takes no block", n->name);
    }
    for (i = 0; i < n->ntests; i++)
        if (check_node(c, n->tests[i], 1) < 0)
            return -1;
    if (n->id == SV_T_IHAVE)
        n->number = (unsigned long long)ihave_value(c, n);
    return check_specific(c, n);
}

/* the value an "ihave" test will have (it is static), or -1 when the test
 * is not a plain ihave */
static int ihave_value(struct checker *c, const struct sv_node *t)
{
    const struct sv_strlist *l = t->pos[0];
    size_t i;

    for (i = 0; i < l->n; i++) {
        int e = sieve_ext_lookup(l->v[i].s);
        if (e < 0 || !ext_allowed(c, e))
            return 0;
    }
    return 1;
}

static int check_commands(struct checker *c, struct sv_node **v, size_t nv,
                          int toplevel)
{
    size_t i;
    int prev_if = 0, in_requires = toplevel;

    for (i = 0; i < nv; i++) {
        struct sv_node *n = v[i];
        const struct cmdspec *spec = find_spec(n->name);
        int is_require = spec && spec->id == SV_C_REQUIRE;

        if (is_require) {
            size_t k;
            if (!in_requires)
                return cerr(c, n->line, "require must come before other "
                            "commands");
            if (check_node(c, n, 0) < 0)
                return -1;
            for (k = 0; k < n->pos[0]->n; k++) {
                const char *name = n->pos[0]->v[k].s;
                int e = sieve_ext_lookup(name);
                if (e < 0 || !ext_allowed(c, e))
                    return cerr(c, n->line, "unsupported extension \"%s\"",
                                name);
                c->enabled[e] = 1;
                if (e == EXT_VACATION_SECONDS)
                    c->enabled[EXT_VACATION] = 1;
                if (strarray_find(&c->s->requires, name) < 0 &&
                    strarray_append(&c->s->requires, name) < 0)
                    return nomem(c, n->line);
            }
            if (c->enabled[EXT_VARIABLES])
                c->s->uses_variables = 1;
            continue;
        }
        in_requires = 0;
        if (spec && (spec->id == SV_C_ELSIF || spec->id == SV_C_ELSE) &&
            !prev_if)
            return cerr(c, n->line, "%s without if", n->name);
        if (check_node(c, n, 0) < 0)
            return -1;
        prev_if = n->id == SV_C_IF || n->id == SV_C_ELSIF;
        if (n->has_block) {
            int ih = -1;
            unsigned char saved[EXT_COUNT];
            if ((n->id == SV_C_IF || n->id == SV_C_ELSIF) &&
                n->tests[0]->id == SV_T_IHAVE)
                ih = ihave_value(c, n->tests[0]);
            if (ih == 0) {
                mark_unchecked(n->block, n->nblock);
                continue;
            }
            memcpy(saved, c->enabled, sizeof(saved));
            if (ih == 1) {
                const struct sv_strlist *l = n->tests[0]->pos[0];
                size_t k;
                for (k = 0; k < l->n; k++)
                    c->enabled[sieve_ext_lookup(l->v[k].s)] = 1;
            }
            if (check_commands(c, n->block, n->nblock, 0) < 0)
                return -1;
            memcpy(c->enabled, saved, sizeof(saved));
        }
    }
    return 0;
}

int sieve_check(struct sieve_script *s, const struct strarray *allowed,
                struct buf *errmsg)
{
    struct checker c;

    memset(&c, 0, sizeof(c));
    c.s = s;
    c.allowed = allowed;
    c.errmsg = errmsg;
    c.rc = SIEVE_OK;
    c.enabled[EXT_CMP_OCTET] = c.enabled[EXT_CMP_CASEMAP] = 1;
    if (check_commands(&c, s->cmds, s->ncmds, 1) < 0 && c.rc == SIEVE_OK)
        c.rc = SIEVE_ESYNTAX;
    return c.rc;
}

/* the table row of each id (built on first use; a race writes the same
 * values) */
static const struct cmdspec *spec_by_id(int id)
{
    static const struct cmdspec *index[SV_T_VALID_EXT_LIST + 1];
    static int built;
    size_t i;

    if (!built) {
        for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
            index[cmds[i].id] = &cmds[i];
        built = 1;
    }
    return id > 0 && id <= SV_T_VALID_EXT_LIST ? index[id] : NULL;
}

const char *sieve_node_name(int id)
{
    const struct cmdspec *spec = spec_by_id(id);

    return spec ? spec->name : NULL;
}

int sieve_check_shape(const struct sv_node *n, int in_test)
{
    const struct cmdspec *spec = spec_by_id(n->id);
    const char *q;
    char expect[4];
    size_t i, want = 0, j = 0;
    int optional = 0, trailing = 0;

    if (!spec || spec->is_test != in_test)
        return -1;
    for (q = spec->pos; *q; q++) {
        if (*q == '?') { optional = 1; continue; }
        if (*q == 'L') { trailing = 1; expect[want++] = 'l'; continue; }
        expect[want++] = *q;
    }
    if (n->npos == want)
        j = 0;
    else if (optional && n->npos + 1 == want)
        j = 1;
    else if (trailing && n->npos + 1 == want)
        want--;
    else
        return -1;
    for (i = 0; j < want; i++, j++) {
        if (!n->pos[i])
            return -1;
        if (expect[j] == 's' && n->pos[i]->n != 1)
            return -1;
    }
    if ((spec->tests == 0 && n->ntests != 0) ||
        (spec->tests == 1 && n->ntests != 1) ||
        (spec->tests == 2 && n->ntests == 0))
        return -1;
    if (in_test ? n->has_block || n->nblock :
        spec->block != !!n->has_block || (!n->has_block && n->nblock))
        return -1;
    /* the enumerations are bytes from 0 (the first of each) */
    if (n->comparator > SV_CMP_NUMERIC || n->match > SV_MATCH_COUNT ||
        n->relop > SV_REL_NE || n->addrpart > SV_ADDR_DETAIL ||
        n->body_transform > SIEVE_BODY_TEXT)
        return -1;
    if ((n->has_flags && !n->flags) ||
        (n->body_transform == SIEVE_BODY_CONTENT && !n->content_types))
        return -1;
    return 0;
}
