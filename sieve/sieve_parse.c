/*
 * sieve_parse.c - the lexer and parser of Sieve (RFC 5228 section 8):
 * script text to a generic tree of commands and tests.
 *
 * The lexer walks a (pointer, length) cursor and never reads past the
 * end; the parser is recursive descent whose depth is bounded by
 * max_nesting (blocks and test lists both count), so no script can
 * exhaust the stack.  Strings are kept as written apart from the quoting
 * (quoted-string escapes removed, multi-line dot-stuffing undone);
 * encoded characters and variables are the checker's business.  Numbers
 * take the K/M/G quantifiers (x 2^10, 2^20, 2^30) and must fit in 63 bits.
 */
#include "config.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sieve/sieve_tree.h"

enum tok { T_EOF, T_IDENT, T_TAG, T_NUM, T_STR, T_LBRACK, T_RBRACK,
           T_LPAREN, T_RPAREN, T_COMMA, T_SEMI, T_LBRACE, T_RBRACE, T_ERR };

struct lexer {
    const char *p, *end;
    unsigned line;
    const struct sieve_limits *lim;
    struct buf *errmsg;
    int rc;                  /* first error code */
    /* current token */
    enum tok t;
    unsigned tline;
    struct buf text;         /* IDENT / TAG name, STR bytes */
    unsigned long long num;
    unsigned depth;
};

static void lex_error(struct lexer *lx, int rc, unsigned line,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void lex_error(struct lexer *lx, int rc, unsigned line,
                      const char *fmt, ...)
{
    va_list ap;

    if (lx->rc != SIEVE_OK)
        return;
    lx->rc = rc;
    if (!lx->errmsg)
        return;
    buf_reset(lx->errmsg);
    buf_printf(lx->errmsg, "line %u: ", line);
    va_start(ap, fmt);
    buf_vprintf(lx->errmsg, fmt, ap);
    va_end(ap);
}

static int is_alpha_(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* skip whitespace and comments; 0, or -1 on an unterminated comment */
static int lex_skip(struct lexer *lx)
{
    while (lx->p < lx->end) {
        char c = *lx->p;
        if (c == '\n') {
            lx->line++;
            lx->p++;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            lx->p++;
        } else if (c == '#') {
            while (lx->p < lx->end && *lx->p != '\n')
                lx->p++;
        } else if (c == '/' && lx->p + 1 < lx->end && lx->p[1] == '*') {
            unsigned start = lx->line;
            lx->p += 2;
            for (;;) {
                if (lx->p + 1 >= lx->end) {
                    lex_error(lx, SIEVE_ESYNTAX, start,
                              "unterminated comment");
                    return -1;
                }
                if (*lx->p == '*' && lx->p[1] == '/') {
                    lx->p += 2;
                    break;
                }
                if (*lx->p == '\n')
                    lx->line++;
                lx->p++;
            }
        } else {
            break;
        }
    }
    return 0;
}

static int lex_strappend(struct lexer *lx, const char *s, size_t n)
{
    if (lx->text.len + n > lx->lim->max_string_len) {
        lex_error(lx, SIEVE_ELIMIT, lx->tline,
                  "string longer than %zu bytes", lx->lim->max_string_len);
        return -1;
    }
    if (buf_append(&lx->text, s, n) < 0) {
        lex_error(lx, SIEVE_ENOMEM, lx->tline, "out of memory");
        return -1;
    }
    return 0;
}

/* multi-line string: after "text:" */
static int lex_multiline(struct lexer *lx)
{
    /* rest of the "text:" line: whitespace, then a hash comment or CRLF */
    while (lx->p < lx->end && (*lx->p == ' ' || *lx->p == '\t'))
        lx->p++;
    if (lx->p < lx->end && *lx->p == '#') {
        while (lx->p < lx->end && *lx->p != '\n')
            lx->p++;
    }
    if (lx->p < lx->end && *lx->p == '\r')
        lx->p++;
    if (lx->p >= lx->end || *lx->p != '\n') {
        lex_error(lx, SIEVE_ESYNTAX, lx->line,
                  "text: must be followed by a line break");
        return -1;
    }
    lx->p++;
    lx->line++;
    for (;;) {
        const char *eol = memchr(lx->p, '\n', (size_t)(lx->end - lx->p));
        const char *ls = lx->p, *le;
        if (!eol) {
            lex_error(lx, SIEVE_ESYNTAX, lx->tline,
                      "unterminated multi-line string");
            return -1;
        }
        le = eol;
        if (le > ls && le[-1] == '\r')
            le--;
        lx->p = eol + 1;
        lx->line++;
        if (le - ls == 1 && ls[0] == '.')
            return 0;
        if (ls < le && ls[0] == '.' && le - ls >= 2 && ls[1] == '.')
            ls++;
        if (lex_strappend(lx, ls, (size_t)(le - ls)) < 0 ||
            lex_strappend(lx, "\r\n", 2) < 0)
            return -1;
    }
}

static int lex_next(struct lexer *lx)
{
    char c;

    buf_reset(&lx->text);
    if (lex_skip(lx) < 0)
        return lx->t = T_ERR;
    lx->tline = lx->line;
    if (lx->p >= lx->end)
        return lx->t = T_EOF;
    c = *lx->p;
    switch (c) {
    case '[': lx->p++; return lx->t = T_LBRACK;
    case ']': lx->p++; return lx->t = T_RBRACK;
    case '(': lx->p++; return lx->t = T_LPAREN;
    case ')': lx->p++; return lx->t = T_RPAREN;
    case ',': lx->p++; return lx->t = T_COMMA;
    case ';': lx->p++; return lx->t = T_SEMI;
    case '{': lx->p++; return lx->t = T_LBRACE;
    case '}': lx->p++; return lx->t = T_RBRACE;
    default: break;
    }
    if (c == '"') {
        lx->p++;
        for (;;) {
            const char *s = lx->p;
            while (lx->p < lx->end && *lx->p != '"' && *lx->p != '\\' &&
                   *lx->p != '\0') {
                if (*lx->p == '\n')
                    lx->line++;
                lx->p++;
            }
            if (lex_strappend(lx, s, (size_t)(lx->p - s)) < 0)
                return lx->t = T_ERR;
            if (lx->p >= lx->end) {
                lex_error(lx, SIEVE_ESYNTAX, lx->tline,
                          "unterminated string");
                return lx->t = T_ERR;
            }
            if (*lx->p == '\0') {
                lex_error(lx, SIEVE_ESYNTAX, lx->line, "NUL byte in string");
                return lx->t = T_ERR;
            }
            if (*lx->p == '"') {
                lx->p++;
                return lx->t = T_STR;
            }
            /* backslash: the next byte stands for itself */
            lx->p++;
            if (lx->p >= lx->end) {
                lex_error(lx, SIEVE_ESYNTAX, lx->tline,
                          "unterminated string");
                return lx->t = T_ERR;
            }
            if (*lx->p == '\n')
                lx->line++;
            if (lex_strappend(lx, lx->p, 1) < 0)
                return lx->t = T_ERR;
            lx->p++;
        }
    }
    if (is_digit(c)) {
        unsigned long long v = 0, mul = 1;
        while (lx->p < lx->end && is_digit(*lx->p)) {
            unsigned d = (unsigned)(*lx->p - '0');
            if (v > ((unsigned long long)INT64_MAX - d) / 10) {
                lex_error(lx, SIEVE_ESYNTAX, lx->line, "number too large");
                return lx->t = T_ERR;
            }
            v = v * 10 + d;
            lx->p++;
        }
        if (lx->p < lx->end) {
            switch (*lx->p) {
            case 'k': case 'K': mul = 1ULL << 10; lx->p++; break;
            case 'm': case 'M': mul = 1ULL << 20; lx->p++; break;
            case 'g': case 'G': mul = 1ULL << 30; lx->p++; break;
            default: break;
            }
        }
        if (v > (unsigned long long)INT64_MAX / mul) {
            lex_error(lx, SIEVE_ESYNTAX, lx->line, "number too large");
            return lx->t = T_ERR;
        }
        if (lx->p < lx->end && (is_alpha_(*lx->p) || is_digit(*lx->p))) {
            lex_error(lx, SIEVE_ESYNTAX, lx->line, "bad number");
            return lx->t = T_ERR;
        }
        lx->num = v * mul;
        return lx->t = T_NUM;
    }
    if (c == ':' || is_alpha_(c)) {
        enum tok t = T_IDENT;
        const char *s;
        if (c == ':') {
            t = T_TAG;
            lx->p++;
            if (lx->p >= lx->end || !is_alpha_(*lx->p)) {
                lex_error(lx, SIEVE_ESYNTAX, lx->line,
                          "':' must be followed by an identifier");
                return lx->t = T_ERR;
            }
        }
        s = lx->p;
        while (lx->p < lx->end && (is_alpha_(*lx->p) || is_digit(*lx->p)))
            lx->p++;
        if (lx->p - s > 256) {
            lex_error(lx, SIEVE_ESYNTAX, lx->line, "identifier too long");
            return lx->t = T_ERR;
        }
        if (t == T_IDENT && lx->p - s == 4 && strncasecmp(s, "text", 4) == 0 &&
            lx->p < lx->end && *lx->p == ':') {
            lx->p++;
            if (lex_multiline(lx) < 0)
                return lx->t = T_ERR;
            return lx->t = T_STR;
        }
        if (buf_append(&lx->text, s, (size_t)(lx->p - s)) < 0) {
            lex_error(lx, SIEVE_ENOMEM, lx->line, "out of memory");
            return lx->t = T_ERR;
        }
        return lx->t = t;
    }
    if (c == '\0')
        lex_error(lx, SIEVE_ESYNTAX, lx->line, "NUL byte in script");
    else if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f)
        lex_error(lx, SIEVE_ESYNTAX, lx->line, "unexpected byte 0x%02x",
                  (unsigned char)c);
    else
        lex_error(lx, SIEVE_ESYNTAX, lx->line, "unexpected character '%c'",
                  c);
    return lx->t = T_ERR;
}

static const char *tok_name(enum tok t)
{
    switch (t) {
    case T_EOF: return "end of script";
    case T_IDENT: return "identifier";
    case T_TAG: return "tagged argument";
    case T_NUM: return "number";
    case T_STR: return "string";
    case T_LBRACK: return "'['";
    case T_RBRACK: return "']'";
    case T_LPAREN: return "'('";
    case T_RPAREN: return "')'";
    case T_COMMA: return "','";
    case T_SEMI: return "';'";
    case T_LBRACE: return "'{'";
    case T_RBRACE: return "'}'";
    default: return "error";
    }
}

static void unexpected(struct lexer *lx, const char *want)
{
    if (lx->t == T_ERR)
        return;
    lex_error(lx, SIEVE_ESYNTAX, lx->tline, "expected %s, found %s", want,
              tok_name(lx->t));
}

/* ---- tree ------------------------------------------------------------ */

static void strlist_free(struct sv_strlist *sl)
{
    size_t i;

    for (i = 0; i < sl->n; i++) {
        free(sl->v[i].s);
        if (sl->v[i].re) {
            regfree(sl->v[i].re);
            free(sl->v[i].re);
        }
    }
    free(sl->v);
    sl->v = NULL;
    sl->n = 0;
}

void sieve_node_free(struct sv_node *n)
{
    size_t i;

    if (!n)
        return;
    for (i = 0; i < n->nargs; i++) {
        free(n->args[i].tag);
        strlist_free(&n->args[i].sl);
    }
    free(n->args);
    for (i = 0; i < n->ntests; i++)
        sieve_node_free(n->tests[i]);
    free(n->tests);
    for (i = 0; i < n->nblock; i++)
        sieve_node_free(n->block[i]);
    free(n->block);
    free(n->name);
    free(n);
}

static int push_node(struct lexer *lx, struct sv_node ***v, size_t *n,
                     struct sv_node *x)
{
    struct sv_node **nv = realloc(*v, (*n + 1) * sizeof(*nv));
    if (!nv) {
        lex_error(lx, SIEVE_ENOMEM, lx->tline, "out of memory");
        sieve_node_free(x);
        return -1;
    }
    nv[(*n)++] = x;
    *v = nv;
    return 0;
}

static int strlist_push(struct lexer *lx, struct sv_strlist *sl)
{
    struct sv_str *nv = realloc(sl->v, (sl->n + 1) * sizeof(*nv));
    char *copy;

    if (!nv) {
        lex_error(lx, SIEVE_ENOMEM, lx->tline, "out of memory");
        return -1;
    }
    sl->v = nv;
    copy = malloc(lx->text.len + 1);
    if (!copy) {
        lex_error(lx, SIEVE_ENOMEM, lx->tline, "out of memory");
        return -1;
    }
    if (lx->text.len)
        memcpy(copy, lx->text.s, lx->text.len);
    copy[lx->text.len] = '\0';
    memset(&sl->v[sl->n], 0, sizeof(sl->v[sl->n]));
    sl->v[sl->n].s = copy;
    sl->v[sl->n].len = lx->text.len;
    sl->n++;
    return 0;
}

static struct sv_node *parse_test(struct lexer *lx);

static int deeper(struct lexer *lx)
{
    if (++lx->depth > lx->lim->max_nesting) {
        lex_error(lx, SIEVE_ELIMIT, lx->tline,
                  "nesting deeper than %u", lx->lim->max_nesting);
        return -1;
    }
    return 0;
}

/* arguments of a command or test, then an optional test / test list.
 * The current token is the first one after the identifier. */
static int parse_arguments(struct lexer *lx, struct sv_node *n, int is_test)
{
    for (;;) {
        struct sv_arg a;
        struct sv_arg *na;

        memset(&a, 0, sizeof(a));
        a.line = lx->tline;
        if (lx->t == T_NUM) {
            a.kind = SV_ARG_NUM;
            a.num = lx->num;
            lex_next(lx);
        } else if (lx->t == T_TAG) {
            a.kind = SV_ARG_TAG;
            a.tag = strdup(buf_cstring(&lx->text));
            if (!a.tag) {
                lex_error(lx, SIEVE_ENOMEM, lx->tline, "out of memory");
                return -1;
            }
            lex_next(lx);
        } else if (lx->t == T_STR) {
            a.kind = SV_ARG_STRLIST;
            if (strlist_push(lx, &a.sl) < 0)
                return -1;
            lex_next(lx);
        } else if (lx->t == T_LBRACK) {
            a.kind = SV_ARG_STRLIST;
            a.is_list = 1;
            for (;;) {
                lex_next(lx);
                if (lx->t != T_STR) {
                    unexpected(lx, "string in string list");
                    strlist_free(&a.sl);
                    return -1;
                }
                if (strlist_push(lx, &a.sl) < 0) {
                    strlist_free(&a.sl);
                    return -1;
                }
                lex_next(lx);
                if (lx->t == T_RBRACK)
                    break;
                if (lx->t != T_COMMA) {
                    unexpected(lx, "',' or ']'");
                    strlist_free(&a.sl);
                    return -1;
                }
            }
            lex_next(lx);
        } else {
            break;
        }
        na = realloc(n->args, (n->nargs + 1) * sizeof(*na));
        if (!na) {
            free(a.tag);
            strlist_free(&a.sl);
            lex_error(lx, SIEVE_ENOMEM, lx->tline, "out of memory");
            return -1;
        }
        n->args = na;
        n->args[n->nargs++] = a;
    }
    if (lx->t == T_ERR)
        return -1;
    if (lx->t == T_IDENT) {
        struct sv_node *t;
        if (deeper(lx) < 0)
            return -1;
        t = parse_test(lx);
        lx->depth--;
        if (!t)
            return -1;
        if (push_node(lx, &n->tests, &n->ntests, t) < 0)
            return -1;
    } else if (lx->t == T_LPAREN) {
        n->test_list = 1;
        if (deeper(lx) < 0)
            return -1;
        for (;;) {
            struct sv_node *t;
            lex_next(lx);
            if (lx->t != T_IDENT) {
                unexpected(lx, "test");
                return -1;
            }
            t = parse_test(lx);
            if (!t)
                return -1;
            if (push_node(lx, &n->tests, &n->ntests, t) < 0)
                return -1;
            if (lx->t == T_RPAREN)
                break;
            if (lx->t != T_COMMA) {
                unexpected(lx, "',' or ')'");
                return -1;
            }
        }
        lx->depth--;
        lex_next(lx);
    }
    (void)is_test;
    return lx->t == T_ERR ? -1 : 0;
}

static struct sv_node *new_node(struct lexer *lx)
{
    struct sv_node *n = calloc(1, sizeof(*n));

    if (!n || !(n->name = strdup(buf_cstring(&lx->text)))) {
        free(n);
        lex_error(lx, SIEVE_ENOMEM, lx->tline, "out of memory");
        return NULL;
    }
    n->line = lx->tline;
    return n;
}

/* current token: the test's identifier */
static struct sv_node *parse_test(struct lexer *lx)
{
    struct sv_node *n = new_node(lx);

    if (!n)
        return NULL;
    lex_next(lx);
    if (parse_arguments(lx, n, 1) < 0) {
        sieve_node_free(n);
        return NULL;
    }
    return n;
}

static int parse_commands(struct lexer *lx, struct sv_node ***v, size_t *nv,
                          int in_block);

/* current token: the command's identifier */
static struct sv_node *parse_command(struct lexer *lx)
{
    struct sv_node *n = new_node(lx);

    if (!n)
        return NULL;
    lex_next(lx);
    if (parse_arguments(lx, n, 0) < 0)
        goto fail;
    if (lx->t == T_SEMI) {
        lex_next(lx);
    } else if (lx->t == T_LBRACE) {
        n->has_block = 1;
        if (deeper(lx) < 0)
            goto fail;
        lex_next(lx);
        if (parse_commands(lx, &n->block, &n->nblock, 1) < 0)
            goto fail;
        lx->depth--;
        lex_next(lx);      /* past '}' */
    } else {
        unexpected(lx, "';' or '{'");
        goto fail;
    }
    if (lx->t == T_ERR)
        goto fail;
    return n;
fail:
    sieve_node_free(n);
    return NULL;
}

static int parse_commands(struct lexer *lx, struct sv_node ***v, size_t *nv,
                          int in_block)
{
    for (;;) {
        struct sv_node *n;
        if (lx->t == T_ERR)
            return -1;
        if (lx->t == T_EOF) {
            if (in_block) {
                unexpected(lx, "'}'");
                return -1;
            }
            return 0;
        }
        if (lx->t == T_RBRACE) {
            if (!in_block) {
                unexpected(lx, "command");
                return -1;
            }
            return 0;
        }
        if (lx->t != T_IDENT) {
            unexpected(lx, "command");
            return -1;
        }
        n = parse_command(lx);
        if (!n)
            return -1;
        if (push_node(lx, v, nv, n) < 0)
            return -1;
    }
}

int sieve_parse(const char *text, size_t len, const struct sieve_limits *l,
                struct sv_node ***cmds_r, size_t *ncmds_r,
                struct buf *errmsg)
{
    struct lexer lx;
    struct sv_node **v = NULL;
    size_t n = 0, i;

    memset(&lx, 0, sizeof(lx));
    lx.p = text;
    lx.end = text + len;
    lx.line = 1;
    lx.lim = l;
    lx.errmsg = errmsg;
    lx.rc = SIEVE_OK;
    lex_next(&lx);
    if (parse_commands(&lx, &v, &n, 0) < 0 || lx.rc != SIEVE_OK) {
        if (lx.rc == SIEVE_OK)
            lex_error(&lx, SIEVE_ESYNTAX, lx.tline, "syntax error");
        for (i = 0; i < n; i++)
            sieve_node_free(v[i]);
        free(v);
        buf_free(&lx.text);
        return lx.rc;
    }
    buf_free(&lx.text);
    *cmds_r = v;
    *ncmds_r = n;
    return SIEVE_OK;
}
