/*
 * imapparse.c - the IMAP command parser (see imapparse.h).
 *
 * Two layers.  The lexer reads the command from the prot stream line by
 * line and turns everything after the command name into a flat token
 * array (atoms, quoted strings, literals, parentheses) kept in cmd->text;
 * it alone talks to the network, enforces the byte limits and knows how
 * to get back in sync after an error (resync()).  The grammar layer then
 * walks the tokens with a cursor and fills the structured arguments; it
 * never reads from the stream, so an error there needs no resync.
 *
 * Invariants:
 * - Every byte from the network is looked at through (pointer, length);
 *   token text is copied into cmd->text with a NUL after each token, and
 *   no token holds a NUL byte itself (refused while lexing).
 * - cmd->text does not grow after lexing, so pointers into it handed out
 *   by the grammar layer stay valid until the next imapparse_read().
 * - Everything else a command owns comes from its arena (a list of
 *   calloc'ed blocks), freed as a whole.
 * - Recursion (lists inside the search grammar) is bounded by max_depth.
 */
#include "config.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "imapd/imapparse.h"

/* ---- limits -------------------------------------------------------- */

struct limits {
    size_t max_line, max_literal, max_append, max_command, max_skip;
    size_t max_tokens;
    unsigned max_depth;
    imapparse_continue_fn *cont;
    void *rock;
};

static void limits_from(const struct imapparse_options *o, struct limits *l)
{
    static const struct imapparse_options none;

    if (!o)
        o = &none;
    l->max_line = o->max_line ? o->max_line : 65536;
    l->max_literal = o->max_literal ? o->max_literal : 65536;
    l->max_append = o->max_append ? o->max_append : (size_t)64 << 20;
    l->max_command = o->max_command ? o->max_command : (size_t)1 << 20;
    l->max_skip = o->max_skip ? o->max_skip : (size_t)16 << 20;
    l->max_tokens = o->max_tokens ? o->max_tokens : 100000;
    l->max_depth = o->max_depth ? o->max_depth : 32;
    l->cont = o->cont;
    l->rock = o->rock;
}

int imapparse_in_sync(int result)
{
    return result >= 0;
}

/* ---- the arena ----------------------------------------------------- */

struct arena_block {
    struct arena_block *next;
    max_align_t data[];
};

static void *arena_alloc(struct imapparse_cmd *cmd, size_t n, size_t size)
{
    struct arena_block *b;

    if (size && n > (SIZE_MAX - sizeof(*b)) / size)
        return NULL;
    b = calloc(1, sizeof(*b) + n * size + 1);
    if (!b)
        return NULL;
    b->next = cmd->arena;
    cmd->arena = b;
    return b->data;
}

static void arena_free(struct imapparse_cmd *cmd)
{
    struct arena_block *b = cmd->arena;

    while (b) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    cmd->arena = NULL;
}

/* ---- the command --------------------------------------------------- */

void imapparse_cmd_init(struct imapparse_cmd *cmd)
{
    memset(cmd, 0, sizeof(*cmd));
}

static void appst_free(struct imapparse_cmd *cmd);

void imapparse_cmd_free(struct imapparse_cmd *cmd)
{
    appst_free(cmd);
    arena_free(cmd);
    free(cmd->tokens);
    buf_free(&cmd->text);
    memset(cmd, 0, sizeof(*cmd));
}

/* Forget the previous command, keep the token memory. */
static void cmd_reset(struct imapparse_cmd *cmd)
{
    struct imapparse_token *tokens = cmd->tokens;
    size_t tokalloc = cmd->tokalloc;
    struct buf text = cmd->text;

    appst_free(cmd);
    arena_free(cmd);
    memset(cmd, 0, sizeof(*cmd));
    cmd->tokens = tokens;
    cmd->tokalloc = tokalloc;
    cmd->text = text;
    buf_reset(&cmd->text);
    buf_set_max(&cmd->text, 0);
}

static int cmd_error(struct imapparse_cmd *cmd, int r, const char *text)
{
    cmd->error = text;
    return r;
}

static int cmd_errorf(struct imapparse_cmd *cmd, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int cmd_errorf(struct imapparse_cmd *cmd, int r, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(cmd->errbuf, sizeof(cmd->errbuf), fmt, ap);
    va_end(ap);
    cmd->error = cmd->errbuf;
    return r;
}

/* ---- character classes --------------------------------------------- */

/* ATOM-CHAR: any CHAR except atom-specials ( ) { SP CTL % * " \ ] */
static int is_atom_char(unsigned char c)
{
    if (c <= 0x20 || c >= 0x7f)
        return 0;
    return !strchr("(){%*\"\\]", c);
}

/* ASTRING-CHAR = ATOM-CHAR / "]" */
static int is_astring_char(unsigned char c)
{
    return c == ']' || is_atom_char(c);
}

/* what the lexer accepts inside an atom-like token: the union of
 * ATOM-CHAR, "]" (astrings), "%" "*" (list-mailbox, sequence sets), "\"
 * (flags) and "[" ... the grammar layer checks the exact class */
static int is_lex_char(unsigned char c)
{
    if (c <= 0x20 || c >= 0x7f)
        return 0;
    return !strchr("(){\"", c);
}

static int all_chars(const char *s, size_t len, int (*ok)(unsigned char))
{
    size_t i;

    if (len == 0)
        return 0;
    for (i = 0; i < len; i++)
        if (!ok((unsigned char)s[i]))
            return 0;
    return 1;
}

/* ---- the lexer ----------------------------------------------------- */

struct lexer {
    struct prot *p;
    struct limits lim;
    struct imapparse_cmd *cmd;
    struct buf line;
    size_t pos;
    size_t used;            /* bytes of the command so far */
    int append;             /* the command is APPEND */
    unsigned depth;         /* open parentheses */
    int stopped;            /* lex_args() stopped before a data literal */
    size_t data_size;       /* ... of this size */
    int data_nonsync, data_binary;
    int truncated;          /* line was over the limit: its end unknown */
    int resynced;           /* resync() ran: the command is behind us */
};

static int map_prot(struct imapparse_cmd *cmd, int r)
{
    switch (r) {
    case PROT_EOF:
        return cmd_error(cmd, IMAPPARSE_EOF, "Connection closed");
    case PROT_TIMEOUT:
        return cmd_error(cmd, IMAPPARSE_TIMEOUT, "Autologout; idle for too long");
    case PROT_NOMEM:
        return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
    case PROT_INTERRUPTED:
        return cmd_error(cmd, IMAPPARSE_INTERRUPTED, "Interrupted");
    default:
        return cmd_error(cmd, IMAPPARSE_IOERROR, "Connection error");
    }
}

/* When the line ends in a literal header "{n}" / "{n+}": 1 and its size
 * and kind; else 0.  n must fit in 20 digits. */
static int trailing_literal(const struct buf *line, uint64_t *n_r,
                            int *nonsync_r)
{
    size_t end = line->len, i, digits = 0;
    uint64_t n = 0;
    const char *s = line->s;

    if (end < 3 || s[end - 1] != '}')
        return 0;
    end--;
    *nonsync_r = 0;
    if (s[end - 1] == '+') {
        *nonsync_r = 1;
        end--;
    }
    i = end;
    while (i > 0 && isdigit((unsigned char)s[i - 1]))
        i--;
    digits = end - i;
    if (digits == 0 || digits > 19 || i == 0 || s[i - 1] != '{')
        return 0;
    for (; i < end; i++)
        n = n * 10 + (uint64_t)(s[i] - '0');
    *n_r = n;
    return 1;
}

/* Drop the rest of an erroneous command, keeping result `r` and the
 * error text already set.  literal_done: the current line's trailing
 * literal has been read already (go straight to the next line). */
static int resync(struct lexer *lx, int r, int literal_done)
{
    size_t skipped = 0;
    const char *error = lx->cmd->error;

    if (lx->resynced || lx->truncated)
        return r;
    lx->resynced = 1;
    for (;;) {
        uint64_t n;
        int nonsync, pr;

        if (!literal_done) {
            if (!trailing_literal(&lx->line, &n, &nonsync) || !nonsync)
                return r;       /* end of the command */
            if (n > lx->lim.max_skip - skipped) {
                return cmd_errorf(lx->cmd, IMAPPARSE_DESYNC,
                                  "Literal of %llu bytes too large",
                                  (unsigned long long)n);
            }
            skipped += (size_t)n;
            pr = prot_read(lx->p, NULL, (size_t)n);
            if (pr != PROT_OK)
                return map_prot(lx->cmd, pr);
        }
        literal_done = 0;
        pr = prot_getline(lx->p, &lx->line, lx->lim.max_line, NULL);
        if (pr == PROT_TOOLONG)
            return r;           /* its end is unknown: give up there */
        if (pr != PROT_OK)
            return map_prot(lx->cmd, pr);
        lx->cmd->error = error;
    }
}

static int add_token(struct lexer *lx, enum imapparse_toktype type,
                     const char *data, size_t len, int glued)
{
    struct imapparse_cmd *cmd = lx->cmd;
    struct imapparse_token *t;

    if (cmd->ntokens >= lx->lim.max_tokens)
        return cmd_error(cmd, IMAPPARSE_TOOBIG, "Too many arguments");
    if (cmd->ntokens == cmd->tokalloc) {
        size_t na = cmd->tokalloc ? cmd->tokalloc * 2 : 32;
        struct imapparse_token *nt = realloc(cmd->tokens, na * sizeof(*nt));

        if (!nt)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        cmd->tokens = nt;
        cmd->tokalloc = na;
    }
    t = &cmd->tokens[cmd->ntokens];
    t->type = type;
    t->off = cmd->text.len;
    t->len = len;
    t->glued = glued;
    if ((len && buf_append(&cmd->text, data, len) < 0)
        || buf_putc(&cmd->text, '\0') < 0)
        return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
    cmd->ntokens++;
    return IMAPPARSE_OK;
}

/* A quoted string at lx->pos (the opening quote).  Its unescaped text is
 * appended as a token. */
static int lex_quoted(struct lexer *lx, int glued)
{
    struct imapparse_cmd *cmd = lx->cmd;
    const char *s = lx->line.s;
    size_t len = lx->line.len, i = lx->pos + 1;
    struct imapparse_token *t;
    int r;

    r = add_token(lx, IMAPPARSE_TOK_QUOTED, NULL, 0, glued);
    if (r != IMAPPARSE_OK)
        return r;
    t = &cmd->tokens[cmd->ntokens - 1];
    buf_truncate(&cmd->text, t->off);
    for (; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '"') {
            t->len = cmd->text.len - t->off;
            if (buf_putc(&cmd->text, '\0') < 0)
                return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
            lx->pos = i + 1;
            return IMAPPARSE_OK;
        }
        if (c == '\\') {
            if (i + 1 >= len || (s[i + 1] != '"' && s[i + 1] != '\\'))
                return cmd_error(cmd, IMAPPARSE_BAD,
                                 "Invalid escape in quoted string");
            c = (unsigned char)s[++i];
        } else if (c == '\0' || c == '\r') {
            return cmd_error(cmd, IMAPPARSE_BAD,
                             "Invalid character in quoted string");
        }
        if (buf_putc(&cmd->text, c) < 0)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
    }
    return cmd_error(cmd, IMAPPARSE_BAD, "Unterminated quoted string");
}

/* Next line of a command after literal data. */
static int next_line(struct lexer *lx)
{
    size_t left = lx->lim.max_command - lx->used;
    size_t max = left < lx->lim.max_line ? left : lx->lim.max_line;
    int r = prot_getline(lx->p, &lx->line, max, NULL);

    if (r == PROT_TOOLONG) {
        lx->truncated = 1;
        return cmd_error(lx->cmd, IMAPPARSE_TOOBIG,
                         max < lx->lim.max_line ? "Command too long"
                                                : "Line too long");
    }
    if (r != PROT_OK)
        return map_prot(lx->cmd, r);
    lx->used += lx->line.len + 2;
    lx->pos = 0;
    return IMAPPARSE_OK;
}

/* Let the client send a synchronizing literal: the callback, or
 * "+ Ready for more". */
static int send_continue(struct lexer *lx, size_t n, int append)
{
    const char *err = NULL;

    if (lx->lim.cont) {
        if (lx->lim.cont(lx->lim.rock, lx->p, n, append, &err) != 0)
            return cmd_error(lx->cmd, IMAPPARSE_REFUSED,
                             err ? err : "Literal refused");
        return IMAPPARSE_OK;
    }
    prot_puts(lx->p, "+ Ready for more\r\n");
    (void)prot_flush(lx->p);
    return IMAPPARSE_OK;
}

static int ieq(const char *s, size_t len, const char *word);

/* Whether a literal starting now is APPEND data (a message, a CATENATE
 * TEXT part, the literal8 of UTF8 (...)) rather than an argument: a
 * literal at the top level after the mailbox, one after the atom TEXT, one
 * right after "UTF8 (". */
static int append_data_here(const struct lexer *lx)
{
    const struct imapparse_cmd *cmd = lx->cmd;
    const struct imapparse_token *t;

    if (!lx->append || cmd->ntokens < 1)
        return 0;
    if (lx->depth == 0)
        return 1;
    t = &cmd->tokens[cmd->ntokens - 1];
    if (t->type == IMAPPARSE_TOK_ATOM && ieq(cmd->text.s + t->off, t->len,
                                             "TEXT"))
        return 1;
    if (t->type == IMAPPARSE_TOK_LPAREN && cmd->ntokens >= 2) {
        t = &cmd->tokens[cmd->ntokens - 2];
        if (t->type == IMAPPARSE_TOK_ATOM
            && ieq(cmd->text.s + t->off, t->len, "UTF8"))
            return 1;
    }
    return 0;
}

/* A literal header at lx->pos ("{" ... "}" ending the line; binary: a
 * literal8, lx->pos at its "~"): read the literal, or for APPEND data
 * stop before it (*stop_r = 1, a DATA token, lx->data_*). */
static int lex_literal(struct lexer *lx, int glued, int binary, int *stop_r)
{
    struct imapparse_cmd *cmd = lx->cmd;
    uint64_t n;
    int nonsync, r;
    size_t limit, before;

    if (binary)
        lx->pos++;
    /* "{" digits ["+"] "}" must be all that is left of the line */
    {
        size_t i = lx->pos + 1;

        while (i < lx->line.len && isdigit((unsigned char)lx->line.s[i]))
            i++;
        if (i < lx->line.len && lx->line.s[i] == '+')
            i++;
        if (!trailing_literal(&lx->line, &n, &nonsync)
            || i + 1 != lx->line.len || lx->line.s[i] != '}')
            return cmd_error(cmd, IMAPPARSE_BAD, "Invalid literal");
    }

    /* APPEND data: checked and announced by the event parser once the
     * arguments before it are known to be good */
    if (append_data_here(lx)) {
        if (n > SIZE_MAX)
            n = SIZE_MAX;
        r = add_token(lx, IMAPPARSE_TOK_DATA, NULL, 0, glued);
        if (r != IMAPPARSE_OK)
            return r;
        lx->data_size = (size_t)n;
        lx->data_nonsync = nonsync;
        lx->data_binary = binary;
        lx->stopped = 1;
        *stop_r = 1;
        return IMAPPARSE_OK;
    }
    if (binary)
        return cmd_error(cmd, IMAPPARSE_BAD, "literal8 not allowed here");

    limit = lx->lim.max_literal;
    if (n > limit)
        return cmd_errorf(cmd, IMAPPARSE_TOOBIG,
                          "Literal too large (limit %zu bytes)", limit);
    if (n > lx->lim.max_command - lx->used)
        return cmd_error(cmd, IMAPPARSE_TOOBIG, "Command too long");
    if (!nonsync) {
        r = send_continue(lx, (size_t)n, 0);
        if (r != IMAPPARSE_OK)
            return r;
    }
    lx->used += (size_t)n;
    r = add_token(lx, IMAPPARSE_TOK_LITERAL, NULL, 0, glued);
    if (r != IMAPPARSE_OK)
        return r;
    before = cmd->text.len - 1;         /* the token's NUL */
    buf_truncate(&cmd->text, before);
    r = prot_read(lx->p, &cmd->text, (size_t)n);
    if (r != PROT_OK)
        return map_prot(cmd, r);
    cmd->tokens[cmd->ntokens - 1].len = (size_t)n;
    if (buf_putc(&cmd->text, '\0') < 0)
        return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
    if (memchr(cmd->text.s + before, '\0', (size_t)n)) {
        cmd->error = "NUL in literal";
        return resync(lx, IMAPPARSE_BAD, 1);
    }
    return next_line(lx);
}

/* Everything after the command name, from lx->pos (just after it). */
static int lex_args(struct lexer *lx)
{
    struct imapparse_cmd *cmd = lx->cmd;
    int after_token = 1;        /* the command name, or a literal */
    int after_rparen = 0;
    int glued = 0;

    for (;;) {
        const char *s = lx->line.s;
        size_t len = lx->line.len;
        unsigned char c;
        int r = IMAPPARSE_OK, stop = 0;

        if (lx->pos >= len) {
            if (lx->depth > 0)
                return cmd_error(cmd, IMAPPARSE_BAD,
                                 "Missing ')' in argument list");
            return IMAPPARSE_OK;
        }
        c = (unsigned char)s[lx->pos];
        glued = 0;
        if (c == ' ') {
            if (!after_token || lx->pos + 1 >= len
                || s[lx->pos + 1] == ' ' || s[lx->pos + 1] == ')')
                return cmd_error(cmd, IMAPPARSE_BAD, "Unexpected space");
            lx->pos++;
            after_token = 0;
            after_rparen = 0;
            continue;
        }
        if (after_token && c != ')') {
            if (after_rparen && c == ']')
                glued = 1;      /* BODY[HEADER.FIELDS (A B)]<0.10> */
            else
                return cmd_error(cmd, IMAPPARSE_BAD,
                                 "Missing space between arguments");
        }
        after_rparen = 0;
        switch (c) {
        case '(':
            if (++lx->depth > lx->lim.max_depth)
                return cmd_error(cmd, IMAPPARSE_TOOBIG,
                                 "Lists nested too deeply");
            r = add_token(lx, IMAPPARSE_TOK_LPAREN, "(", 1, 0);
            lx->pos++;
            after_token = 0;
            break;
        case ')':
            if (lx->depth == 0)
                return cmd_error(cmd, IMAPPARSE_BAD, "Unexpected ')'");
            lx->depth--;
            r = add_token(lx, IMAPPARSE_TOK_RPAREN, ")", 1, 0);
            lx->pos++;
            after_token = 1;
            after_rparen = 1;
            break;
        case '"':
            r = lex_quoted(lx, 0);
            after_token = 1;
            break;
        case '~':
            if (!lx->append || lx->pos + 1 >= len || s[lx->pos + 1] != '{')
                goto atom;
            /* FALLTHROUGH */
        case '{':
            r = lex_literal(lx, 0, c == '~', &stop);
            after_token = 1;
            if (r == IMAPPARSE_OK && stop)
                return IMAPPARSE_OK;
            if (r != IMAPPARSE_OK)
                return r;
            continue;
        default:
        atom: {
            size_t start = lx->pos;

            while (lx->pos < len && s[lx->pos] != ' ' && s[lx->pos] != ')') {
                if (!is_lex_char((unsigned char)s[lx->pos]))
                    return cmd_error(cmd, IMAPPARSE_BAD,
                                     s[lx->pos] == '(' || s[lx->pos] == '"'
                                     || s[lx->pos] == '{'
                                     ? "Missing space between arguments"
                                     : "Invalid character in argument");
                lx->pos++;
            }
            r = add_token(lx, IMAPPARSE_TOK_ATOM, s + start, lx->pos - start,
                          glued);
            after_token = 1;
            break;
        }
        }
        if (r != IMAPPARSE_OK)
            return r;
    }
}

/* ---- number and string helpers ------------------------------------- */

/* A decimal number of 1..20 digits not above max.  0 or -1. */
static int parse_u64(const char *s, size_t len, uint64_t max, uint64_t *n_r)
{
    uint64_t n = 0;
    size_t i;

    if (len == 0 || len > 20)
        return -1;
    for (i = 0; i < len; i++) {
        unsigned d;

        if (!isdigit((unsigned char)s[i]))
            return -1;
        d = (unsigned)(s[i] - '0');
        if (n > (max - d) / 10)
            return -1;
        n = n * 10 + d;
    }
    *n_r = n;
    return 0;
}

static void upcase(char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++)
        s[i] = (char)toupper((unsigned char)s[i]);
}

static int ieq(const char *s, size_t len, const char *word)
{
    return strlen(word) == len && strncasecmp(s, word, len) == 0;
}

/* ---- sequence sets and dates --------------------------------------- */

static int seq_number(const char *s, size_t len, uint32_t *n_r)
{
    uint64_t n;

    if (len == 1 && s[0] == '*') {
        *n_r = 0;
        return 0;
    }
    if (len == 0 || s[0] == '0' || parse_u64(s, len, UINT32_MAX, &n) < 0)
        return -1;
    *n_r = (uint32_t)n;
    return 0;
}

int imapparse_seqset_parse(const char *s, size_t len,
                           struct imapparse_seqset *set)
{
    size_t i, n = 1, k = 0, start = 0;

    set->n = 0;
    set->r = NULL;
    if (len == 0)
        return -1;
    for (i = 0; i < len; i++)
        if (s[i] == ',')
            n++;
    set->r = calloc(n, sizeof(*set->r));
    if (!set->r)
        return -1;
    for (i = 0; i <= len; i++) {
        if (i == len || s[i] == ',') {
            const char *item = s + start;
            size_t ilen = i - start;
            const char *colon = memchr(item, ':', ilen);
            struct imapparse_range *rg = &set->r[k];

            if (colon) {
                size_t l1 = (size_t)(colon - item);
                if (seq_number(item, l1, &rg->lo) < 0
                    || seq_number(colon + 1, ilen - l1 - 1, &rg->hi) < 0)
                    goto bad;
            } else {
                if (seq_number(item, ilen, &rg->lo) < 0)
                    goto bad;
                rg->hi = rg->lo;
            }
            k++;
            start = i + 1;
        }
    }
    set->n = k;
    return 0;
bad:
    free(set->r);
    set->r = NULL;
    set->n = 0;
    return -1;
}

int imapparse_seqset_contains(const struct imapparse_seqset *set,
                              uint32_t num, uint32_t max)
{
    size_t i;

    for (i = 0; i < set->n; i++) {
        uint32_t lo = set->r[i].lo ? set->r[i].lo : max;
        uint32_t hi = set->r[i].hi ? set->r[i].hi : max;

        if (lo > hi) {
            uint32_t t = lo;
            lo = hi;
            hi = t;
        }
        if (lo == 0)
            continue;   /* "*" with an empty mailbox */
        if (num >= lo && num <= hi)
            return 1;
    }
    return 0;
}

static const char *const month_names[12] = {
    "Jan", "Feb", "Mar", "Apr", "May", "Jun",
    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"
};

static int leap(int y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int month_days(int y, int m)
{
    static const int d[12] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };

    return m == 2 && leap(y) ? 29 : d[m - 1];
}

/* "d-Mon-yyyy" / "dd-Mon-yyyy" at s; sets *used_r to the bytes taken. */
static int date_text(const char *s, size_t len, struct imapparse_date *d,
                     size_t *used_r)
{
    size_t i = 0, digits = 0;
    int day = 0, m, year = 0;

    if (i < len && s[i] == ' ')         /* date-day-fixed " 1" */
        i++;
    while (i < len && isdigit((unsigned char)s[i]) && digits < 2) {
        day = day * 10 + (s[i++] - '0');
        digits++;
    }
    if (digits == 0 || i + 9 > len || s[i] != '-' || s[i + 4] != '-')
        return -1;
    for (m = 0; m < 12; m++)
        if (strncasecmp(s + i + 1, month_names[m], 3) == 0)
            break;
    if (m == 12)
        return -1;
    i += 5;
    for (digits = 0; digits < 4; digits++, i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        year = year * 10 + (s[i] - '0');
    }
    if (year < 1 || day < 1 || day > month_days(year, m + 1))
        return -1;
    d->year = year;
    d->mon = m + 1;
    d->mday = day;
    *used_r = i;
    return 0;
}

int imapparse_date_parse(const char *s, size_t len,
                         struct imapparse_date *date)
{
    size_t used;

    if (len >= 2 && s[0] == '"' && s[len - 1] == '"') {
        s++;
        len -= 2;
    }
    if (len == 0 || s[0] == ' ')
        return -1;
    if (date_text(s, len, date, &used) < 0 || used != len)
        return -1;
    return 0;
}

long imapparse_date_days(const struct imapparse_date *d)
{
    /* days from 1970-01-01 (proleptic Gregorian) */
    long y = d->year - (d->mon <= 2);
    long era = (y >= 0 ? y : y - 399) / 400;
    long yoe = y - era * 400;
    long mp = (d->mon + 9) % 12;
    long doy = (153 * mp + 2) / 5 + d->mday - 1;
    long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;

    return era * 146097 + doe - 719468;
}

int imapparse_datetime_parse(const char *s, size_t len, time_t *t_r)
{
    struct imapparse_date d;
    size_t i;
    int hh, mm, ss, zone, sign;
    const char *t;

    if (date_text(s, len, &d, &i) < 0)
        return -1;
    /* SP hh:mm:ss SP (+|-)hhmm */
    if (len - i != 15)
        return -1;
    t = s + i;
    if (t[0] != ' ' || t[3] != ':' || t[6] != ':' || t[9] != ' '
        || (t[10] != '+' && t[10] != '-'))
        return -1;
    {
        static const int pos[] = { 1, 2, 4, 5, 7, 8, 11, 12, 13, 14 };
        size_t k;

        for (k = 0; k < sizeof(pos) / sizeof(pos[0]); k++)
            if (!isdigit((unsigned char)t[pos[k]]))
                return -1;
    }
    hh = (t[1] - '0') * 10 + (t[2] - '0');
    mm = (t[4] - '0') * 10 + (t[5] - '0');
    ss = (t[7] - '0') * 10 + (t[8] - '0');
    sign = t[10] == '-' ? -1 : 1;
    zone = ((t[11] - '0') * 10 + (t[12] - '0')) * 60
           + (t[13] - '0') * 10 + (t[14] - '0');
    if (hh > 23 || mm > 59 || ss > 60 || (t[13] - '0') > 5)
        return -1;
    *t_r = (time_t)imapparse_date_days(&d) * 86400
           + hh * 3600 + mm * 60 + ss - sign * zone * 60;
    return 0;
}

/* ---- the grammar layer: a cursor over the tokens ------------------- */

struct cur {
    struct imapparse_cmd *cmd;
    size_t i;
    unsigned depth, max_depth;
};

static const struct imapparse_token *peek(struct cur *c)
{
    return c->i < c->cmd->ntokens ? &c->cmd->tokens[c->i] : NULL;
}

static char *tok_text(struct cur *c, const struct imapparse_token *t)
{
    return c->cmd->text.s + t->off;
}

static int at_end(struct cur *c)
{
    return c->i >= c->cmd->ntokens;
}

static int peek_type(struct cur *c, enum imapparse_toktype type)
{
    const struct imapparse_token *t = peek(c);

    return t && t->type == type;
}

static int expect_end(struct cur *c)
{
    if (!at_end(c))
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Unexpected extra arguments");
    return IMAPPARSE_OK;
}

static int expect_type(struct cur *c, enum imapparse_toktype type,
                       const char *what)
{
    if (!peek_type(c, type))
        return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Missing %s", what);
    c->i++;
    return IMAPPARSE_OK;
}

/* An atom token (ATOM-CHARs only when strict). */
static int get_atom(struct cur *c, char **s_r, size_t *len_r,
                    const char *what)
{
    const struct imapparse_token *t = peek(c);

    if (!t || t->type != IMAPPARSE_TOK_ATOM)
        return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Missing %s", what);
    *s_r = tok_text(c, t);
    *len_r = t->len;
    c->i++;
    return IMAPPARSE_OK;
}

/* astring = 1*ASTRING-CHAR / string */
static int get_astring(struct cur *c, char **s_r, size_t *len_r,
                       const char *what)
{
    const struct imapparse_token *t = peek(c);

    if (!t || t->type == IMAPPARSE_TOK_LPAREN
        || t->type == IMAPPARSE_TOK_RPAREN)
        return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Missing %s", what);
    if (t->type == IMAPPARSE_TOK_ATOM
        && !all_chars(tok_text(c, t), t->len, is_astring_char))
        return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Invalid characters in %s",
                          what);
    *s_r = tok_text(c, t);
    *len_r = t->len;
    c->i++;
    return IMAPPARSE_OK;
}

/* A mailbox name: "INBOX" in any case (and the INBOX. prefix of its
 * children) is upper-cased in place. */
static int get_mailbox(struct cur *c, int which)
{
    char *s;
    size_t len;
    int r = get_astring(c, &s, &len, "mailbox name");

    if (r != IMAPPARSE_OK)
        return r;
    if (ieq(s, len, "INBOX") || (len > 6 && strncasecmp(s, "INBOX.", 6) == 0))
        upcase(s, 5);
    c->cmd->arg[which] = s;
    c->cmd->arg_len[which] = len;
    return IMAPPARSE_OK;
}

/* list-mailbox = 1*list-char / string (list-char adds % * ]) */
static int lexchar_list(unsigned char ch)
{
    return ch == '%' || ch == '*' || is_astring_char(ch);
}

static int get_list_mailbox(struct cur *c, int which)
{
    const struct imapparse_token *t = peek(c);

    if (!t || t->type == IMAPPARSE_TOK_LPAREN
        || t->type == IMAPPARSE_TOK_RPAREN)
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing mailbox pattern");
    if (t->type == IMAPPARSE_TOK_ATOM
        && !all_chars(tok_text(c, t), t->len, lexchar_list))
        return cmd_error(c->cmd, IMAPPARSE_BAD,
                         "Invalid characters in mailbox pattern");
    c->cmd->arg[which] = tok_text(c, t);
    c->cmd->arg_len[which] = t->len;
    c->i++;
    return IMAPPARSE_OK;
}

static int get_seqset(struct cur *c, struct imapparse_seqset *set)
{
    char *s;
    size_t len;
    struct imapparse_seqset tmp;
    int r = get_atom(c, &s, &len, "sequence set");

    if (r != IMAPPARSE_OK)
        return r;
    if (len == 1 && s[0] == '$') {
        set->n = 0;
        set->r = NULL;
        set->saved = 1;
        return IMAPPARSE_OK;
    }
    if (imapparse_seqset_parse(s, len, &tmp) < 0)
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid sequence set");
    set->r = arena_alloc(c->cmd, tmp.n, sizeof(*tmp.r));
    if (!set->r) {
        free(tmp.r);
        return cmd_error(c->cmd, IMAPPARSE_NOMEM, "Out of memory");
    }
    memcpy(set->r, tmp.r, tmp.n * sizeof(*tmp.r));
    set->n = tmp.n;
    free(tmp.r);
    return IMAPPARSE_OK;
}

static int is_seqset_text(const char *s, size_t len)
{
    size_t i;

    if (len == 1 && s[0] == '$')
        return 1;

    for (i = 0; i < len; i++)
        if (!isdigit((unsigned char)s[i]) && !strchr("*:,", s[i]))
            return 0;
    return len > 0;
}

/* flag = "\" atom / keyword(atom) */
static int valid_flag(const char *s, size_t len)
{
    if (len > 0 && s[0] == '\\') {
        s++;
        len--;
    }
    return all_chars(s, len, is_atom_char);
}

/* Append one string to a list being built in the arena (grows by
 * doubling: old blocks stay in the arena until the command is freed). */
static int list_push(struct imapparse_cmd *cmd, struct imapparse_strlist *l,
                     size_t *alloc, const char *s)
{
    if (l->n == *alloc) {
        size_t na = *alloc ? *alloc * 2 : 8;
        const char **ns = arena_alloc(cmd, na, sizeof(*ns));

        if (!ns)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        if (l->n)
            memcpy(ns, l->s, l->n * sizeof(*ns));
        l->s = ns;
        *alloc = na;
    }
    l->s[l->n++] = s;
    return IMAPPARSE_OK;
}

/* "(" [flag *(SP flag)] ")" */
static int get_flag_list(struct cur *c, struct imapparse_strlist *flags)
{
    size_t alloc = 0;
    int r = expect_type(c, IMAPPARSE_TOK_LPAREN, "flag list");

    if (r != IMAPPARSE_OK)
        return r;
    while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
        const struct imapparse_token *t = peek(c);

        if (!t)
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing ')'");
        if (t->type != IMAPPARSE_TOK_ATOM || !valid_flag(tok_text(c, t), t->len))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid flag");
        r = list_push(c->cmd, flags, &alloc, tok_text(c, t));
        if (r != IMAPPARSE_OK)
            return r;
        c->i++;
    }
    c->i++;
    return IMAPPARSE_OK;
}

/* ---- FETCH --------------------------------------------------------- */

static const struct {
    const char *name;
    enum imapparse_fetch_kind kind;
} fetch_names[] = {
    { "FLAGS", IMAPPARSE_FETCH_FLAGS },
    { "INTERNALDATE", IMAPPARSE_FETCH_INTERNALDATE },
    { "RFC822.SIZE", IMAPPARSE_FETCH_RFC822_SIZE },
    { "ENVELOPE", IMAPPARSE_FETCH_ENVELOPE },
    { "BODY", IMAPPARSE_FETCH_BODY },
    { "BODYSTRUCTURE", IMAPPARSE_FETCH_BODYSTRUCTURE },
    { "UID", IMAPPARSE_FETCH_UID },
    { "RFC822", IMAPPARSE_FETCH_RFC822 },
    { "RFC822.HEADER", IMAPPARSE_FETCH_RFC822_HEADER },
    { "RFC822.TEXT", IMAPPARSE_FETCH_RFC822_TEXT },
    { "MODSEQ", IMAPPARSE_FETCH_MODSEQ },
};

/* header-fld-name = astring; field names are printable ASCII without
 * SP and ":" (RFC 5322 ftext) */
static int valid_field(const char *s, size_t len)
{
    size_t i;

    if (len == 0)
        return 0;
    for (i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f
            || s[i] == ':')
            return 0;
    return 1;
}

/* section-spec text (between the brackets, without a header list) */
static int parse_section(struct imapparse_cmd *cmd,
                         struct imapparse_fetch_att *a, const char *s,
                         size_t len, int *wants_list_r)
{
    size_t i = 0;

    *wants_list_r = 0;
    while (i < len && isdigit((unsigned char)s[i])) {
        size_t start = i;
        uint64_t n;

        while (i < len && isdigit((unsigned char)s[i]))
            i++;
        if (s[start] == '0' || parse_u64(s + start, i - start, UINT32_MAX, &n) < 0)
            return cmd_error(cmd, IMAPPARSE_BAD, "Invalid section part number");
        if (a->nparts == IMAPPARSE_MAX_PARTS)
            return cmd_error(cmd, IMAPPARSE_BAD, "Section nested too deeply");
        a->parts[a->nparts++] = (uint32_t)n;
        if (i == len)
            break;
        if (s[i] != '.')
            return cmd_error(cmd, IMAPPARSE_BAD, "Invalid section");
        i++;
        if (i == len)
            return cmd_error(cmd, IMAPPARSE_BAD, "Invalid section");
    }
    s += i;
    len -= i;
    if (len == 0)
        a->text = IMAPPARSE_SECTION_ALL;
    else if (ieq(s, len, "HEADER"))
        a->text = IMAPPARSE_SECTION_HEADER;
    else if (ieq(s, len, "TEXT"))
        a->text = IMAPPARSE_SECTION_TEXT;
    else if (ieq(s, len, "MIME") && a->nparts > 0)
        a->text = IMAPPARSE_SECTION_MIME;
    else if (ieq(s, len, "HEADER.FIELDS")) {
        a->text = IMAPPARSE_SECTION_HEADER_FIELDS;
        *wants_list_r = 1;
    } else if (ieq(s, len, "HEADER.FIELDS.NOT")) {
        a->text = IMAPPARSE_SECTION_HEADER_FIELDS_NOT;
        *wants_list_r = 1;
    } else
        return cmd_error(cmd, IMAPPARSE_BAD, "Invalid section");
    return IMAPPARSE_OK;
}

/* "<" number "." nz-number ">" or nothing */
static int parse_partial(struct imapparse_cmd *cmd,
                         struct imapparse_fetch_att *a, const char *s,
                         size_t len)
{
    const char *dot;
    uint64_t o, n;

    if (len == 0)
        return IMAPPARSE_OK;
    if (len < 5 || s[0] != '<' || s[len - 1] != '>'
        || !(dot = memchr(s, '.', len))
        || parse_u64(s + 1, (size_t)(dot - s - 1), UINT32_MAX, &o) < 0
        || parse_u64(dot + 1, (size_t)(s + len - 1 - dot - 1), UINT32_MAX,
                     &n) < 0
        || n == 0)
        return cmd_error(cmd, IMAPPARSE_BAD, "Invalid partial range");
    a->partial = 1;
    a->origin = (uint32_t)o;
    a->count = (uint32_t)n;
    return IMAPPARSE_OK;
}

/* BODY[...] / BODY.PEEK[...]; t is the atom, already upper-cased */
static int parse_body_section(struct cur *c, struct imapparse_fetch_att *a,
                              char *s, size_t len)
{
    struct imapparse_cmd *cmd = c->cmd;
    struct buf norm = BUF_INITIALIZER;
    size_t pre = strncmp(s, "BODY.PEEK[", 10) == 0 ? 10 : 5;
    char *close = memchr(s + pre, ']', len - pre);
    char *after;
    size_t afterlen, alloc = 0, k;
    int wants_list, r;

    a->kind = IMAPPARSE_FETCH_SECTION;
    a->peek = pre == 10;
    r = parse_section(cmd, a, s + pre,
                      close ? (size_t)(close - s) - pre : len - pre,
                      &wants_list);
    if (r != IMAPPARSE_OK)
        return r;
    if (wants_list != !close)
        return cmd_error(cmd, IMAPPARSE_BAD,
                         wants_list ? "Missing header field list"
                                    : "Invalid section");
    if (close) {
        after = close + 1;
        afterlen = len - (size_t)(after - s);
    } else {
        const struct imapparse_token *t;

        r = expect_type(c, IMAPPARSE_TOK_LPAREN, "header field list");
        if (r != IMAPPARSE_OK)
            return r;
        while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
            char *f;
            size_t flen;

            r = get_astring(c, &f, &flen, "header field name");
            if (r != IMAPPARSE_OK)
                return r;
            if (!valid_field(f, flen))
                return cmd_error(cmd, IMAPPARSE_BAD,
                                 "Invalid header field name");
            r = list_push(cmd, &a->fields, &alloc, f);
            if (r != IMAPPARSE_OK)
                return r;
        }
        c->i++;
        if (a->fields.n == 0)
            return cmd_error(cmd, IMAPPARSE_BAD, "Empty header field list");
        t = peek(c);
        if (!t || t->type != IMAPPARSE_TOK_ATOM || !t->glued)
            return cmd_error(cmd, IMAPPARSE_BAD, "Missing ']' after section");
        after = tok_text(c, t) + 1;
        afterlen = t->len - 1;
        upcase(after, afterlen);
        c->i++;
    }
    r = parse_partial(cmd, a, after, afterlen);
    if (r != IMAPPARSE_OK)
        return r;

    /* the normalized section text for the response */
    for (k = 0; k < a->nparts; k++)
        (void)buf_printf(&norm, "%s%u", k ? "." : "", (unsigned)a->parts[k]);
    if (a->text != IMAPPARSE_SECTION_ALL) {
        static const char *const names[] = {
            "", "HEADER", "HEADER.FIELDS", "HEADER.FIELDS.NOT", "TEXT", "MIME"
        };
        if (a->nparts)
            (void)buf_putc(&norm, '.');
        (void)buf_appendcstr(&norm, names[a->text]);
    }
    if (a->fields.n) {
        (void)buf_appendcstr(&norm, " (");
        for (k = 0; k < a->fields.n; k++) {
            size_t at = norm.len;

            (void)buf_appendcstr(&norm, a->fields.s[k]);
            if (norm.s)
                upcase(norm.s + at, norm.len - at);
            if (k + 1 < a->fields.n)
                (void)buf_putc(&norm, ' ');
        }
        (void)buf_putc(&norm, ')');
    }
    {
        char *sec = arena_alloc(cmd, norm.len + 1, 1);

        if (!sec) {
            buf_free(&norm);
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        }
        if (norm.len)
            memcpy(sec, norm.s, norm.len);
        a->section = sec;
    }
    buf_free(&norm);
    return IMAPPARSE_OK;
}

/* BINARY[...]<partial> / BINARY.PEEK[...]<partial> / BINARY.SIZE[...]
 * (RFC 3516): section-binary = "[" [section-part] "]"; s is the atom,
 * upper-cased */
static int parse_binary_section(struct cur *c, struct imapparse_fetch_att *a,
                                char *s, size_t len)
{
    struct imapparse_cmd *cmd = c->cmd;
    size_t pre, seclen, k;
    char *close, *after, *sec;
    int wants_list, r;

    if (strncmp(s, "BINARY.PEEK[", 12) == 0) {
        pre = 12;
        a->kind = IMAPPARSE_FETCH_BINARY;
        a->peek = 1;
    } else if (strncmp(s, "BINARY.SIZE[", 12) == 0) {
        pre = 12;
        a->kind = IMAPPARSE_FETCH_BINARY_SIZE;
    } else {
        pre = 7;
        a->kind = IMAPPARSE_FETCH_BINARY;
    }
    close = memchr(s + pre, ']', len - pre);
    if (!close)
        return cmd_error(cmd, IMAPPARSE_BAD, "Missing ']' after section");
    seclen = (size_t)(close - s) - pre;
    for (k = 0; k < seclen; k++)
        if (!isdigit((unsigned char)s[pre + k]) && s[pre + k] != '.')
            return cmd_error(cmd, IMAPPARSE_BAD,
                             "Invalid binary section (part numbers only)");
    r = parse_section(cmd, a, s + pre, seclen, &wants_list);
    if (r != IMAPPARSE_OK)
        return r;
    if (a->text != IMAPPARSE_SECTION_ALL)
        return cmd_error(cmd, IMAPPARSE_BAD,
                         "Invalid binary section (part numbers only)");
    after = close + 1;
    if (a->kind == IMAPPARSE_FETCH_BINARY_SIZE) {
        if (after != s + len)
            return cmd_error(cmd, IMAPPARSE_BAD,
                             "BINARY.SIZE takes no partial range");
    } else {
        r = parse_partial(cmd, a, after, len - (size_t)(after - s));
        if (r != IMAPPARSE_OK)
            return r;
    }
    sec = arena_alloc(cmd, seclen + 1, 1);
    if (!sec)
        return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
    if (seclen)
        memcpy(sec, s + pre, seclen);
    sec[seclen] = '\0';
    a->section = sec;
    return IMAPPARSE_OK;
}

static int fetch_push(struct cur *c, size_t *alloc,
                      struct imapparse_fetch_att **a_r)
{
    struct imapparse_fetch *f = &c->cmd->fetch;

    if (f->n == *alloc) {
        size_t na = *alloc ? *alloc * 2 : 8;
        struct imapparse_fetch_att *n = arena_alloc(c->cmd, na, sizeof(*n));

        if (!n)
            return cmd_error(c->cmd, IMAPPARSE_NOMEM, "Out of memory");
        if (f->n)
            memcpy(n, f->atts, f->n * sizeof(*n));
        f->atts = n;
        *alloc = na;
    }
    *a_r = &f->atts[f->n++];
    memset(*a_r, 0, sizeof(**a_r));
    return IMAPPARSE_OK;
}

static int parse_fetch_att(struct cur *c, size_t *alloc, int alone)
{
    static const enum imapparse_fetch_kind fast[] = {
        IMAPPARSE_FETCH_FLAGS, IMAPPARSE_FETCH_INTERNALDATE,
        IMAPPARSE_FETCH_RFC822_SIZE, IMAPPARSE_FETCH_ENVELOPE,
        IMAPPARSE_FETCH_BODY
    };
    struct imapparse_fetch_att *a;
    char *s;
    size_t len, k, nmacro = 0;
    int r = get_atom(c, &s, &len, "fetch attribute");

    if (r != IMAPPARSE_OK)
        return r;
    upcase(s, len);
    if (strcmp(s, "ALL") == 0)
        nmacro = 4;
    else if (strcmp(s, "FAST") == 0)
        nmacro = 3;
    else if (strcmp(s, "FULL") == 0)
        nmacro = 5;
    if (nmacro) {
        if (!alone)
            return cmd_errorf(c->cmd, IMAPPARSE_BAD,
                              "%s is not allowed in a list", s);
        for (k = 0; k < nmacro; k++) {
            r = fetch_push(c, alloc, &a);
            if (r != IMAPPARSE_OK)
                return r;
            a->kind = fast[k];
        }
        return IMAPPARSE_OK;
    }
    r = fetch_push(c, alloc, &a);
    if (r != IMAPPARSE_OK)
        return r;
    for (k = 0; k < sizeof(fetch_names) / sizeof(fetch_names[0]); k++) {
        if (strcmp(s, fetch_names[k].name) == 0) {
            a->kind = fetch_names[k].kind;
            return IMAPPARSE_OK;
        }
    }
    if (strncmp(s, "BODY[", 5) == 0 || strncmp(s, "BODY.PEEK[", 10) == 0)
        return parse_body_section(c, a, s, len);
    if (strncmp(s, "BINARY[", 7) == 0 || strncmp(s, "BINARY.PEEK[", 12) == 0
        || strncmp(s, "BINARY.SIZE[", 12) == 0)
        return parse_binary_section(c, a, s, len);
    return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Invalid fetch attribute %.40s",
                      s);
}

/* SP "(" modifier *(SP modifier) ")", CHANGEDSINCE or UNCHANGEDSINCE */
static int parse_modifiers(struct cur *c, const char *name, int *set_r,
                           uint64_t *value_r, uint64_t min)
{
    int r = expect_type(c, IMAPPARSE_TOK_LPAREN, "modifier list");

    if (r != IMAPPARSE_OK)
        return r;
    do {
        char *s, *v;
        size_t len, vlen;
        uint64_t n;

        r = get_atom(c, &s, &len, "modifier");
        if (r != IMAPPARSE_OK)
            return r;
        if (!ieq(s, len, name))
            return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Unknown modifier %.40s",
                              s);
        if (*set_r)
            return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Repeated %s", name);
        r = get_atom(c, &v, &vlen, "mod-sequence value");
        if (r != IMAPPARSE_OK)
            return r;
        if (parse_u64(v, vlen, INT64_MAX, &n) < 0 || n < min)
            return cmd_error(c->cmd, IMAPPARSE_BAD,
                             "Invalid mod-sequence value");
        *set_r = 1;
        *value_r = n;
    } while (!peek_type(c, IMAPPARSE_TOK_RPAREN) && !at_end(c));
    return expect_type(c, IMAPPARSE_TOK_RPAREN, "')'");
}

/* FETCH's SP "(" (CHANGEDSINCE n / VANISHED) *(SP ...) ")"; VANISHED
 * (RFC 7162 3.2.6) only with CHANGEDSINCE (the session checks UID) */
static int parse_fetch_modifiers(struct cur *c, struct imapparse_fetch *f)
{
    int r = expect_type(c, IMAPPARSE_TOK_LPAREN, "modifier list");

    if (r != IMAPPARSE_OK)
        return r;
    do {
        char *s, *v;
        size_t len, vlen;
        uint64_t n;

        r = get_atom(c, &s, &len, "modifier");
        if (r != IMAPPARSE_OK)
            return r;
        if (ieq(s, len, "VANISHED")) {
            if (f->vanished)
                return cmd_error(c->cmd, IMAPPARSE_BAD, "Repeated VANISHED");
            f->vanished = 1;
            continue;
        }
        if (!ieq(s, len, "CHANGEDSINCE"))
            return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Unknown modifier %.40s",
                              s);
        if (f->changedsince_set)
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Repeated CHANGEDSINCE");
        r = get_atom(c, &v, &vlen, "mod-sequence value");
        if (r != IMAPPARSE_OK)
            return r;
        if (parse_u64(v, vlen, INT64_MAX, &n) < 0 || n < 1)
            return cmd_error(c->cmd, IMAPPARSE_BAD,
                             "Invalid mod-sequence value");
        f->changedsince_set = 1;
        f->changedsince = n;
    } while (!peek_type(c, IMAPPARSE_TOK_RPAREN) && !at_end(c));
    r = expect_type(c, IMAPPARSE_TOK_RPAREN, "')'");
    if (r != IMAPPARSE_OK)
        return r;
    if (f->vanished && !f->changedsince_set)
        return cmd_error(c->cmd, IMAPPARSE_BAD,
                         "VANISHED without CHANGEDSINCE");
    return IMAPPARSE_OK;
}

static int parse_fetch(struct cur *c)
{
    struct imapparse_fetch *f = &c->cmd->fetch;
    size_t alloc = 0;
    int r = get_seqset(c, &c->cmd->set);

    if (r != IMAPPARSE_OK)
        return r;
    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        c->i++;
        while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
            r = parse_fetch_att(c, &alloc, 0);
            if (r != IMAPPARSE_OK)
                return r;
        }
        c->i++;
        if (f->n == 0)
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Empty fetch list");
    } else {
        r = parse_fetch_att(c, &alloc, 1);
        if (r != IMAPPARSE_OK)
            return r;
    }
    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        r = parse_fetch_modifiers(c, f);
        if (r != IMAPPARSE_OK)
            return r;
    }
    return expect_end(c);
}

/* ---- STORE --------------------------------------------------------- */

static int parse_store(struct cur *c)
{
    struct imapparse_store *st = &c->cmd->store;
    char *s;
    size_t len, alloc = 0;
    int r = get_seqset(c, &c->cmd->set);

    if (r != IMAPPARSE_OK)
        return r;
    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        r = parse_modifiers(c, "UNCHANGEDSINCE", &st->unchangedsince_set,
                            &st->unchangedsince, 0);
        if (r != IMAPPARSE_OK)
            return r;
    }
    r = get_atom(c, &s, &len, "store item");
    if (r != IMAPPARSE_OK)
        return r;
    upcase(s, len);
    if (s[0] == '+' || s[0] == '-') {
        st->op = s[0] == '+' ? IMAPPARSE_STORE_ADD : IMAPPARSE_STORE_REMOVE;
        s++;
        len--;
    }
    if (ieq(s, len, "FLAGS.SILENT"))
        st->silent = 1;
    else if (!ieq(s, len, "FLAGS"))
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid store item");
    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        r = get_flag_list(c, &st->flags);
        if (r != IMAPPARSE_OK)
            return r;
        return expect_end(c);
    }
    if (at_end(c))
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing flags");
    while (!at_end(c)) {
        const struct imapparse_token *t = peek(c);

        if (t->type != IMAPPARSE_TOK_ATOM || !valid_flag(tok_text(c, t), t->len))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid flag");
        r = list_push(c->cmd, &st->flags, &alloc, tok_text(c, t));
        if (r != IMAPPARSE_OK)
            return r;
        c->i++;
    }
    return IMAPPARSE_OK;
}

/* ---- SEARCH -------------------------------------------------------- */

enum sarg { SA_NONE, SA_STRING, SA_DATE, SA_NUMBER, SA_NZNUMBER,
            SA_KEYWORD };

static const struct {
    const char *name;
    enum imapparse_skey key;
    enum sarg arg;
    const char *flag;           /* for FLAG/UNFLAG keys */
} search_keys[] = {
    { "ALL", IMAPPARSE_S_ALL, SA_NONE, NULL },
    { "ANSWERED", IMAPPARSE_S_FLAG, SA_NONE, "\\Answered" },
    { "DELETED", IMAPPARSE_S_FLAG, SA_NONE, "\\Deleted" },
    { "DRAFT", IMAPPARSE_S_FLAG, SA_NONE, "\\Draft" },
    { "FLAGGED", IMAPPARSE_S_FLAG, SA_NONE, "\\Flagged" },
    { "SEEN", IMAPPARSE_S_FLAG, SA_NONE, "\\Seen" },
    { "KEYWORD", IMAPPARSE_S_FLAG, SA_KEYWORD, NULL },
    { "UNANSWERED", IMAPPARSE_S_UNFLAG, SA_NONE, "\\Answered" },
    { "UNDELETED", IMAPPARSE_S_UNFLAG, SA_NONE, "\\Deleted" },
    { "UNDRAFT", IMAPPARSE_S_UNFLAG, SA_NONE, "\\Draft" },
    { "UNFLAGGED", IMAPPARSE_S_UNFLAG, SA_NONE, "\\Flagged" },
    { "UNSEEN", IMAPPARSE_S_UNFLAG, SA_NONE, "\\Seen" },
    { "UNKEYWORD", IMAPPARSE_S_UNFLAG, SA_KEYWORD, NULL },
    { "NEW", IMAPPARSE_S_NEW, SA_NONE, NULL },
    { "OLD", IMAPPARSE_S_OLD, SA_NONE, NULL },
    { "RECENT", IMAPPARSE_S_RECENT, SA_NONE, NULL },
    { "BCC", IMAPPARSE_S_BCC, SA_STRING, NULL },
    { "CC", IMAPPARSE_S_CC, SA_STRING, NULL },
    { "FROM", IMAPPARSE_S_FROM, SA_STRING, NULL },
    { "TO", IMAPPARSE_S_TO, SA_STRING, NULL },
    { "SUBJECT", IMAPPARSE_S_SUBJECT, SA_STRING, NULL },
    { "BODY", IMAPPARSE_S_BODY, SA_STRING, NULL },
    { "TEXT", IMAPPARSE_S_TEXT, SA_STRING, NULL },
    { "BEFORE", IMAPPARSE_S_BEFORE, SA_DATE, NULL },
    { "ON", IMAPPARSE_S_ON, SA_DATE, NULL },
    { "SINCE", IMAPPARSE_S_SINCE, SA_DATE, NULL },
    { "SENTBEFORE", IMAPPARSE_S_SENTBEFORE, SA_DATE, NULL },
    { "SENTON", IMAPPARSE_S_SENTON, SA_DATE, NULL },
    { "SENTSINCE", IMAPPARSE_S_SENTSINCE, SA_DATE, NULL },
    { "LARGER", IMAPPARSE_S_LARGER, SA_NUMBER, NULL },
    { "SMALLER", IMAPPARSE_S_SMALLER, SA_NUMBER, NULL },
    { "OLDER", IMAPPARSE_S_OLDER, SA_NZNUMBER, NULL },
    { "YOUNGER", IMAPPARSE_S_YOUNGER, SA_NZNUMBER, NULL },
};

static int parse_search_key(struct cur *c, struct imapparse_search **k_r);

static struct imapparse_search *snew(struct cur *c, enum imapparse_skey key)
{
    struct imapparse_search *k = arena_alloc(c->cmd, 1, sizeof(*k));

    if (k)
        k->key = key;
    return k;
}

static int add_child(struct cur *c, struct imapparse_search *parent,
                     struct imapparse_search *child, size_t *alloc)
{
    if (parent->nchildren == *alloc) {
        size_t na = *alloc ? *alloc * 2 : 4;
        struct imapparse_search **n = arena_alloc(c->cmd, na, sizeof(*n));

        if (!n)
            return cmd_error(c->cmd, IMAPPARSE_NOMEM, "Out of memory");
        if (parent->nchildren)
            memcpy(n, parent->children, parent->nchildren * sizeof(*n));
        parent->children = n;
        *alloc = na;
    }
    parent->children[parent->nchildren++] = child;
    return IMAPPARSE_OK;
}

/* keys until ")" (inner) or the end (top level), at least one */
static int parse_search_list(struct cur *c, struct imapparse_search **k_r,
                             int inner)
{
    struct imapparse_search *and = snew(c, IMAPPARSE_S_AND);
    size_t alloc = 0;
    int r;

    if (!and)
        return cmd_error(c->cmd, IMAPPARSE_NOMEM, "Out of memory");
    for (;;) {
        struct imapparse_search *k;

        if (inner ? peek_type(c, IMAPPARSE_TOK_RPAREN) : at_end(c))
            break;
        if (at_end(c))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing ')'");
        r = parse_search_key(c, &k);
        if (r != IMAPPARSE_OK)
            return r;
        r = add_child(c, and, k, &alloc);
        if (r != IMAPPARSE_OK)
            return r;
    }
    if (and->nchildren == 0)
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing search key");
    if (inner)
        c->i++;
    *k_r = and;
    return IMAPPARSE_OK;
}

static int parse_search_key(struct cur *c, struct imapparse_search **k_r)
{
    struct imapparse_cmd *cmd = c->cmd;
    const struct imapparse_token *t = peek(c);
    struct imapparse_search *k;
    char *s;
    size_t len, i;
    int r;

    if (!t)
        return cmd_error(cmd, IMAPPARSE_BAD, "Missing search key");
    if (++c->depth > c->max_depth)
        return cmd_error(cmd, IMAPPARSE_TOOBIG, "Search keys nested too deeply");
    if (t->type == IMAPPARSE_TOK_LPAREN) {
        c->i++;
        r = parse_search_list(c, k_r, 1);
        c->depth--;
        return r;
    }
    if (t->type != IMAPPARSE_TOK_ATOM)
        return cmd_error(cmd, IMAPPARSE_BAD, "Invalid search key");
    s = tok_text(c, t);
    len = t->len;
    if (is_seqset_text(s, len)) {
        k = snew(c, IMAPPARSE_S_SEQSET);
        if (!k)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        r = get_seqset(c, &k->set);
        goto done;
    }
    c->i++;
    upcase(s, len);
    if (strcmp(s, "NOT") == 0 || strcmp(s, "OR") == 0) {
        int n = s[0] == 'N' ? 1 : 2, j;
        size_t alloc = 0;

        k = snew(c, n == 1 ? IMAPPARSE_S_NOT : IMAPPARSE_S_OR);
        if (!k)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        for (j = 0; j < n; j++) {
            struct imapparse_search *sub;

            r = parse_search_key(c, &sub);
            if (r != IMAPPARSE_OK)
                return r;
            r = add_child(c, k, sub, &alloc);
            if (r != IMAPPARSE_OK)
                return r;
        }
        r = IMAPPARSE_OK;
        goto done;
    }
    if (strcmp(s, "UID") == 0) {
        k = snew(c, IMAPPARSE_S_UID);
        if (!k)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        r = get_seqset(c, &k->set);
        goto done;
    }
    if (strcmp(s, "HEADER") == 0) {
        char *f, *v;
        size_t flen, vlen;

        k = snew(c, IMAPPARSE_S_HEADER);
        if (!k)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        r = get_astring(c, &f, &flen, "header field name");
        if (r == IMAPPARSE_OK && !valid_field(f, flen))
            r = cmd_error(cmd, IMAPPARSE_BAD, "Invalid header field name");
        if (r == IMAPPARSE_OK)
            r = get_astring(c, &v, &vlen, "search string");
        if (r == IMAPPARSE_OK) {
            k->field = f;
            k->str = v;
            k->str_len = vlen;
        }
        goto done;
    }
    if (strcmp(s, "MODSEQ") == 0) {
        char *v;
        size_t vlen;
        uint64_t n;

        k = snew(c, IMAPPARSE_S_MODSEQ);
        if (!k)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        if (peek_type(c, IMAPPARSE_TOK_QUOTED)) {
            /* entry-name SP entry-type-req */
            k->field = tok_text(c, peek(c));
            c->i++;
            r = get_atom(c, &v, &vlen, "entry type");
            if (r != IMAPPARSE_OK)
                return r;
            if (!ieq(v, vlen, "priv") && !ieq(v, vlen, "shared")
                && !ieq(v, vlen, "all"))
                return cmd_error(cmd, IMAPPARSE_BAD, "Invalid entry type");
            k->str = v;
            k->str_len = vlen;
        }
        r = get_atom(c, &v, &vlen, "mod-sequence value");
        if (r == IMAPPARSE_OK) {
            if (parse_u64(v, vlen, INT64_MAX, &n) < 0)
                r = cmd_error(cmd, IMAPPARSE_BAD,
                              "Invalid mod-sequence value");
            else
                k->number = n;
        }
        goto done;
    }
    for (i = 0; i < sizeof(search_keys) / sizeof(search_keys[0]); i++)
        if (strcmp(s, search_keys[i].name) == 0)
            break;
    if (i == sizeof(search_keys) / sizeof(search_keys[0]))
        return cmd_errorf(cmd, IMAPPARSE_BAD, "Invalid search key %.40s", s);
    k = snew(c, search_keys[i].key);
    if (!k)
        return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
    k->flag = search_keys[i].flag;
    r = IMAPPARSE_OK;
    switch (search_keys[i].arg) {
    case SA_NONE:
        break;
    case SA_KEYWORD: {
        char *v = NULL;
        size_t vlen = 0;

        r = get_atom(c, &v, &vlen, "keyword");
        if (r == IMAPPARSE_OK && !all_chars(v, vlen, is_atom_char))
            r = cmd_error(cmd, IMAPPARSE_BAD, "Invalid keyword");
        if (r == IMAPPARSE_OK)
            k->flag = v;
        break;
    }
    case SA_STRING: {
        char *v = NULL;
        size_t vlen = 0;

        r = get_astring(c, &v, &vlen, "search string");
        if (r == IMAPPARSE_OK) {
            k->str = v;
            k->str_len = vlen;
        }
        break;
    }
    case SA_DATE: {
        const struct imapparse_token *d = peek(c);

        if (!d || (d->type != IMAPPARSE_TOK_ATOM
                   && d->type != IMAPPARSE_TOK_QUOTED)
            || imapparse_date_parse(tok_text(c, d), d->len, &k->date) < 0)
            r = cmd_error(cmd, IMAPPARSE_BAD, "Invalid search date");
        else
            c->i++;
        break;
    }
    case SA_NUMBER:
    case SA_NZNUMBER: {
        char *v;
        size_t vlen;

        r = get_atom(c, &v, &vlen, "number");
        if (r == IMAPPARSE_OK
            && (parse_u64(v, vlen, UINT32_MAX, &k->number) < 0
                || (search_keys[i].arg == SA_NZNUMBER && k->number == 0)))
            r = cmd_error(cmd, IMAPPARSE_BAD, "Invalid number");
        break;
    }
    }
done:
    c->depth--;
    if (r != IMAPPARSE_OK)
        return r;
    *k_r = k;
    return IMAPPARSE_OK;
}

/* A charset name: UTF-8 (utf8 = 1) or US-ASCII; another is
 * IMAPPARSE_BADCHARSET. */
static int parse_charset(struct cur *c)
{
    char *cs;
    size_t cslen;
    int r = get_astring(c, &cs, &cslen, "charset");

    if (r != IMAPPARSE_OK)
        return r;
    if (ieq(cs, cslen, "UTF-8"))
        c->cmd->utf8 = 1;
    else if (!ieq(cs, cslen, "US-ASCII"))
        return cmd_errorf(c->cmd, IMAPPARSE_BADCHARSET,
                          "Unsupported charset %.40s", cs);
    return IMAPPARSE_OK;
}

/* PARTIAL's argument (RFC 5267 4.4): nz-number ":" nz-number, the lower
 * first in cmd->partial_lo/hi whichever way it was written.  0 or -1. */
static int partial_range(struct imapparse_cmd *cmd, const char *s,
                         size_t len)
{
    const char *colon = memchr(s, ':', len);
    uint32_t a, b;

    if (!colon ||
        seq_number(s, (size_t)(colon - s), &a) < 0 || a == 0 ||
        seq_number(colon + 1, len - (size_t)(colon - s) - 1, &b) < 0 ||
        b == 0)
        return -1;
    cmd->partial_lo = a < b ? a : b;
    cmd->partial_hi = a < b ? b : a;
    return 0;
}

/* search-return-opts (RFC 4731, RFC 5182, RFC 5267 4.4): RETURN (opt
 * ...), each of MIN MAX ALL COUNT SAVE PARTIAL at most once, not both
 * ALL and PARTIAL; "()" means ALL. */
static int parse_search_return(struct cur *c)
{
    static const struct {
        const char *name;
        unsigned bit;
    } opts[] = {
        { "MIN", IMAPPARSE_RET_MIN }, { "MAX", IMAPPARSE_RET_MAX },
        { "ALL", IMAPPARSE_RET_ALL }, { "COUNT", IMAPPARSE_RET_COUNT },
        { "SAVE", IMAPPARSE_RET_SAVE },
        { "PARTIAL", IMAPPARSE_RET_PARTIAL },
    };
    struct imapparse_cmd *cmd = c->cmd;
    int r;

    r = expect_type(c, IMAPPARSE_TOK_LPAREN, "'(' after RETURN");
    if (r != IMAPPARSE_OK)
        return r;
    cmd->esearch = 1;
    while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
        char *w;
        size_t wlen, i;

        if (at_end(c))
            return cmd_error(cmd, IMAPPARSE_BAD, "Missing ')'");
        r = get_atom(c, &w, &wlen, "return option");
        if (r != IMAPPARSE_OK)
            return r;
        for (i = 0; i < sizeof(opts) / sizeof(opts[0]); i++)
            if (ieq(w, wlen, opts[i].name))
                break;
        if (i == sizeof(opts) / sizeof(opts[0]))
            return cmd_errorf(cmd, IMAPPARSE_BAD,
                              "Unknown search return option %.40s", w);
        if (cmd->search_ret & opts[i].bit)
            return cmd_errorf(cmd, IMAPPARSE_BAD,
                              "Repeated search return option %.40s", w);
        cmd->search_ret |= opts[i].bit;
        if (opts[i].bit == IMAPPARSE_RET_PARTIAL) {
            r = get_atom(c, &w, &wlen, "PARTIAL range");
            if (r != IMAPPARSE_OK)
                return r;
            if (partial_range(cmd, w, wlen) < 0)
                return cmd_errorf(cmd, IMAPPARSE_BAD,
                                  "Invalid PARTIAL range %.40s", w);
        }
    }
    if ((cmd->search_ret & IMAPPARSE_RET_ALL) &&
        (cmd->search_ret & IMAPPARSE_RET_PARTIAL))
        return cmd_error(cmd, IMAPPARSE_BAD,
                         "ALL and PARTIAL exclude each other");
    c->i++;
    if (cmd->search_ret == 0)
        cmd->search_ret = IMAPPARSE_RET_ALL;
    return IMAPPARSE_OK;
}

static int parse_search(struct cur *c)
{
    const struct imapparse_token *t = peek(c);

    if (t && t->type == IMAPPARSE_TOK_ATOM
        && ieq(tok_text(c, t), t->len, "RETURN")) {
        int r;

        c->i++;
        r = parse_search_return(c);
        if (r != IMAPPARSE_OK)
            return r;
        t = peek(c);
    }

    if (t && t->type == IMAPPARSE_TOK_ATOM
        && ieq(tok_text(c, t), t->len, "CHARSET")) {
        int r;

        c->i++;
        c->cmd->charset_set = 1;
        r = parse_charset(c);
        if (r != IMAPPARSE_OK)
            return r;
    }
    return parse_search_list(c, &c->cmd->search, 0);
}

/* SORT [RETURN (...)] (criteria) charset search-keys (RFC 5256, 5267) */
static int parse_sort(struct cur *c)
{
    static const struct {
        const char *name;
        enum imapparse_sortkey key;
    } keys[] = {
        { "ARRIVAL", IMAPPARSE_SORT_ARRIVAL }, { "CC", IMAPPARSE_SORT_CC },
        { "DATE", IMAPPARSE_SORT_DATE }, { "FROM", IMAPPARSE_SORT_FROM },
        { "SIZE", IMAPPARSE_SORT_SIZE }, { "SUBJECT", IMAPPARSE_SORT_SUBJECT },
        { "TO", IMAPPARSE_SORT_TO },
        { "DISPLAYFROM", IMAPPARSE_SORT_DISPLAYFROM },
        { "DISPLAYTO", IMAPPARSE_SORT_DISPLAYTO },
    };
    struct imapparse_cmd *cmd = c->cmd;
    const struct imapparse_token *t = peek(c);
    int r, reverse = 0;

    if (t && t->type == IMAPPARSE_TOK_ATOM
        && ieq(tok_text(c, t), t->len, "RETURN")) {
        c->i++;
        r = parse_search_return(c);
        if (r != IMAPPARSE_OK)
            return r;
        if (cmd->search_ret & IMAPPARSE_RET_SAVE)
            return cmd_error(cmd, IMAPPARSE_BAD,
                             "SAVE is not a SORT return option");
    }
    r = expect_type(c, IMAPPARSE_TOK_LPAREN, "sort criteria");
    if (r != IMAPPARSE_OK)
        return r;
    for (;;) {
        char *w;
        size_t wlen, i;

        if (peek_type(c, IMAPPARSE_TOK_RPAREN) && !reverse
            && cmd->nsort > 0)
            break;
        r = get_atom(c, &w, &wlen, "sort criterion");
        if (r != IMAPPARSE_OK)
            return r;
        if (!reverse && ieq(w, wlen, "REVERSE")) {
            reverse = 1;
            continue;
        }
        for (i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
            if (ieq(w, wlen, keys[i].name))
                break;
        if (i == sizeof(keys) / sizeof(keys[0]))
            return cmd_errorf(cmd, IMAPPARSE_BAD,
                              "Unknown sort criterion %.40s", w);
        if (cmd->nsort == IMAPPARSE_MAX_SORT)
            return cmd_error(cmd, IMAPPARSE_TOOBIG, "Too many sort criteria");
        cmd->sort[cmd->nsort].key = keys[i].key;
        cmd->sort[cmd->nsort].reverse = reverse;
        cmd->nsort++;
        reverse = 0;
    }
    c->i++;
    r = parse_charset(c);
    if (r != IMAPPARSE_OK)
        return r;
    return parse_search_list(c, &cmd->search, 0);
}

/* THREAD algorithm charset search-keys (RFC 5256) */
static int parse_thread(struct cur *c)
{
    struct imapparse_cmd *cmd = c->cmd;
    char *w;
    size_t wlen;
    int r = get_atom(c, &w, &wlen, "thread algorithm");

    if (r != IMAPPARSE_OK)
        return r;
    if (ieq(w, wlen, "ORDEREDSUBJECT"))
        cmd->thread_alg = IMAPPARSE_THREAD_ORDEREDSUBJECT;
    else if (ieq(w, wlen, "REFERENCES"))
        cmd->thread_alg = IMAPPARSE_THREAD_REFERENCES;
    else
        return cmd_errorf(cmd, IMAPPARSE_BAD,
                          "Unknown thread algorithm %.40s", w);
    r = parse_charset(c);
    if (r != IMAPPARSE_OK)
        return r;
    return parse_search_list(c, &cmd->search, 0);
}

/* ---- STATUS, SELECT, APPEND, ID, ENABLE ------------------------------ */

/* "(" status-att *(SP status-att) ")" into st */
static int parse_status_items(struct cur *c, struct imapparse_status *st)
{
    static const struct {
        const char *name;
        enum imapparse_status_item item;
    } items[] = {
        { "MESSAGES", IMAPPARSE_STATUS_MESSAGES },
        { "RECENT", IMAPPARSE_STATUS_RECENT },
        { "UIDNEXT", IMAPPARSE_STATUS_UIDNEXT },
        { "UIDVALIDITY", IMAPPARSE_STATUS_UIDVALIDITY },
        { "UNSEEN", IMAPPARSE_STATUS_UNSEEN },
        { "HIGHESTMODSEQ", IMAPPARSE_STATUS_HIGHESTMODSEQ },
        { "DELETED", IMAPPARSE_STATUS_DELETED },
        { "DELETED-STORAGE", IMAPPARSE_STATUS_DELETED_STORAGE },
        { "SIZE", IMAPPARSE_STATUS_SIZE },
        { "APPENDLIMIT", IMAPPARSE_STATUS_APPENDLIMIT },
    };
    int r = expect_type(c, IMAPPARSE_TOK_LPAREN, "status item list");

    if (r != IMAPPARSE_OK)
        return r;
    do {
        char *s;
        size_t len, i, j;

        r = get_atom(c, &s, &len, "status item");
        if (r != IMAPPARSE_OK)
            return r;
        for (i = 0; i < sizeof(items) / sizeof(items[0]); i++)
            if (ieq(s, len, items[i].name))
                break;
        if (i == sizeof(items) / sizeof(items[0]))
            return cmd_errorf(c->cmd, IMAPPARSE_BAD,
                              "Invalid status item %.40s", s);
        for (j = 0; j < st->n; j++)
            if (st->items[j] == items[i].item)
                return cmd_error(c->cmd, IMAPPARSE_BAD,
                                 "Repeated status item");
        st->items[st->n++] = items[i].item;
    } while (!peek_type(c, IMAPPARSE_TOK_RPAREN));
    c->i++;
    return IMAPPARSE_OK;
}

static int parse_status(struct cur *c)
{
    int r = get_mailbox(c, 0);

    if (r == IMAPPARSE_OK)
        r = parse_status_items(c, &c->cmd->status);
    if (r != IMAPPARSE_OK)
        return r;
    return expect_end(c);
}

/* A word of an option list: an atom. */
static int option_word(struct cur *c, const char *what, char **s_r,
                       size_t *len_r)
{
    return get_atom(c, s_r, len_r, what);
}

/* LIST [SP "(" [sel-opt *(SP sel-opt)] ")"] SP mailbox SP
 *      (list-mailbox / "(" list-mailbox *(SP list-mailbox) ")")
 *      [SP "RETURN" SP "(" [ret-opt *(SP ret-opt)] ")"]   (RFC 5258) */
static int parse_list(struct cur *c)
{
    struct imapparse_cmd *cmd = c->cmd;
    struct imapparse_list *l = &cmd->list;
    size_t alloc = 0;
    char *s;
    size_t len;
    int r;

    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        l->extended = 1;
        c->i++;
        while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
            r = option_word(c, "selection option", &s, &len);
            if (r != IMAPPARSE_OK)
                return r;
            if (ieq(s, len, "SUBSCRIBED"))
                l->select |= IMAPPARSE_LSEL_SUBSCRIBED;
            else if (ieq(s, len, "REMOTE"))
                l->select |= IMAPPARSE_LSEL_REMOTE;
            else if (ieq(s, len, "RECURSIVEMATCH"))
                l->select |= IMAPPARSE_LSEL_RECURSIVEMATCH;
            else if (ieq(s, len, "SPECIAL-USE"))
                l->select |= IMAPPARSE_LSEL_SPECIALUSE;
            else
                return cmd_errorf(cmd, IMAPPARSE_BAD,
                                  "Unknown selection option %.40s", s);
        }
        c->i++;
        /* RFC 5258 3: RECURSIVEMATCH only with an option it modifies;
         * of ours only SUBSCRIBED (RFC 6154 6: not SPECIAL-USE) */
        if ((l->select & IMAPPARSE_LSEL_RECURSIVEMATCH) &&
            !(l->select & IMAPPARSE_LSEL_SUBSCRIBED))
            return cmd_error(cmd, IMAPPARSE_BAD,
                             "RECURSIVEMATCH needs SUBSCRIBED");
    }
    r = get_astring(c, &s, &len, "reference name");
    if (r != IMAPPARSE_OK)
        return r;
    cmd->arg[0] = s;
    cmd->arg_len[0] = len;
    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        l->extended = 1;
        c->i++;
        do {
            r = get_list_mailbox(c, 1);
            if (r == IMAPPARSE_OK)
                r = list_push(cmd, &l->patterns, &alloc, cmd->arg[1]);
            if (r != IMAPPARSE_OK)
                return r;
        } while (!peek_type(c, IMAPPARSE_TOK_RPAREN));
        c->i++;
        cmd->arg[1] = l->patterns.s[0];
        cmd->arg_len[1] = strlen(cmd->arg[1]);
    } else {
        r = get_list_mailbox(c, 1);
        if (r == IMAPPARSE_OK)
            r = list_push(cmd, &l->patterns, &alloc, cmd->arg[1]);
        if (r != IMAPPARSE_OK)
            return r;
    }
    if (at_end(c))
        return IMAPPARSE_OK;
    r = option_word(c, "RETURN", &s, &len);
    if (r != IMAPPARSE_OK)
        return r;
    if (!ieq(s, len, "RETURN"))
        return cmd_error(cmd, IMAPPARSE_BAD, "Unexpected extra arguments");
    l->extended = 1;
    r = expect_type(c, IMAPPARSE_TOK_LPAREN, "return option list");
    if (r != IMAPPARSE_OK)
        return r;
    while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
        r = option_word(c, "return option", &s, &len);
        if (r != IMAPPARSE_OK)
            return r;
        if (ieq(s, len, "SUBSCRIBED")) {
            l->ret |= IMAPPARSE_LRET_SUBSCRIBED;
        } else if (ieq(s, len, "CHILDREN")) {
            l->ret |= IMAPPARSE_LRET_CHILDREN;
        } else if (ieq(s, len, "SPECIAL-USE")) {
            l->ret |= IMAPPARSE_LRET_SPECIALUSE;
        } else if (ieq(s, len, "MYRIGHTS")) {
            l->ret |= IMAPPARSE_LRET_MYRIGHTS;
        } else if (ieq(s, len, "STATUS")) {
            if (l->ret & IMAPPARSE_LRET_STATUS)
                return cmd_error(cmd, IMAPPARSE_BAD,
                                 "Repeated STATUS return option");
            l->ret |= IMAPPARSE_LRET_STATUS;
            r = parse_status_items(c, &l->status);
            if (r != IMAPPARSE_OK)
                return r;
        } else {
            return cmd_errorf(cmd, IMAPPARSE_BAD,
                              "Unknown return option %.40s", s);
        }
    }
    c->i++;
    return expect_end(c);
}

/* CREATE mailbox [SP "(" "USE" SP "(" [use-attr *(SP use-attr)] ")" ")"]
 * (RFC 6154 CREATE-SPECIAL-USE) */
static int parse_create(struct cur *c)
{
    struct imapparse_cmd *cmd = c->cmd;
    size_t alloc = 0;
    int r = get_mailbox(c, 0);

    if (r != IMAPPARSE_OK)
        return r;
    if (!peek_type(c, IMAPPARSE_TOK_LPAREN))
        return expect_end(c);
    c->i++;
    while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
        char *s;
        size_t len;

        r = option_word(c, "create parameter", &s, &len);
        if (r != IMAPPARSE_OK)
            return r;
        if (!ieq(s, len, "USE"))
            return cmd_errorf(cmd, IMAPPARSE_BAD,
                              "Unknown create parameter %.40s", s);
        if (cmd->use_set)
            return cmd_error(cmd, IMAPPARSE_BAD, "Repeated USE");
        cmd->use_set = 1;
        r = expect_type(c, IMAPPARSE_TOK_LPAREN, "use attribute list");
        if (r != IMAPPARSE_OK)
            return r;
        while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
            const struct imapparse_token *t = peek(c);

            if (!t)
                return cmd_error(cmd, IMAPPARSE_BAD, "Missing ')'");
            if (t->type != IMAPPARSE_TOK_ATOM || t->len < 2 ||
                tok_text(c, t)[0] != '\\' ||
                !valid_flag(tok_text(c, t), t->len))
                return cmd_error(cmd, IMAPPARSE_BAD,
                                 "Invalid use attribute");
            r = list_push(cmd, &cmd->use, &alloc, tok_text(c, t));
            if (r != IMAPPARSE_OK)
                return r;
            c->i++;
        }
        c->i++;
    }
    c->i++;
    return expect_end(c);
}

/* A uid set of QRESYNC: numbers only, no "*" or "$". */
static int get_uidset(struct cur *c, struct imapparse_seqset *set,
                      const char *what)
{
    int r;
    size_t i;

    if (peek_type(c, IMAPPARSE_TOK_ATOM)) {
        const struct imapparse_token *t = &c->cmd->tokens[c->i];

        if (memchr(tok_text(c, t), '*', t->len) ||
            memchr(tok_text(c, t), '$', t->len))
            return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Invalid %s", what);
    }
    r = get_seqset(c, set);
    if (r != IMAPPARSE_OK)
        return r;
    for (i = 0; i < set->n; i++)
        if (set->r[i].lo == 0 || set->r[i].hi == 0)
            return cmd_errorf(c->cmd, IMAPPARSE_BAD, "Invalid %s", what);
    return IMAPPARSE_OK;
}

/* RFC 7162 3.2.5: "(" uidvalidity SP mod-sequence-value [SP known-uids]
 * [SP "(" known-sequence-set SP known-uid-set ")"] ")" after QRESYNC */
static int parse_qresync(struct cur *c)
{
    struct imapparse_qresync *q = &c->cmd->qresync;
    char *v;
    size_t vlen;
    uint64_t n;
    int r;

    if (q->set)
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Repeated QRESYNC");
    r = expect_type(c, IMAPPARSE_TOK_LPAREN, "QRESYNC parameters");
    if (r != IMAPPARSE_OK)
        return r;
    r = get_atom(c, &v, &vlen, "uidvalidity");
    if (r != IMAPPARSE_OK)
        return r;
    if (parse_u64(v, vlen, UINT32_MAX, &n) < 0 || n == 0)
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid uidvalidity");
    q->uidvalidity = (uint32_t)n;
    r = get_atom(c, &v, &vlen, "mod-sequence value");
    if (r != IMAPPARSE_OK)
        return r;
    if (parse_u64(v, vlen, INT64_MAX, &n) < 0 || n == 0)
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid mod-sequence value");
    q->modseq = n;
    if (peek_type(c, IMAPPARSE_TOK_ATOM)) {
        r = get_uidset(c, &q->known_uids, "known-uids");
        if (r != IMAPPARSE_OK)
            return r;
        q->has_known_uids = 1;
    }
    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        c->i++;
        r = get_uidset(c, &q->match_seqs, "known-sequence-set");
        if (r == IMAPPARSE_OK)
            r = get_uidset(c, &q->match_uids, "known-uid-set");
        if (r != IMAPPARSE_OK)
            return r;
        r = expect_type(c, IMAPPARSE_TOK_RPAREN, "')'");
        if (r != IMAPPARSE_OK)
            return r;
        q->has_match = 1;
    }
    r = expect_type(c, IMAPPARSE_TOK_RPAREN, "')'");
    if (r != IMAPPARSE_OK)
        return r;
    q->set = 1;
    return IMAPPARSE_OK;
}

static int parse_select(struct cur *c)
{
    int r = get_mailbox(c, 0);

    if (r != IMAPPARSE_OK)
        return r;
    if (peek_type(c, IMAPPARSE_TOK_LPAREN)) {
        c->i++;
        while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
            char *s;
            size_t len;

            r = get_atom(c, &s, &len, "select parameter");
            if (r != IMAPPARSE_OK)
                return r;
            if (ieq(s, len, "QRESYNC")) {
                r = parse_qresync(c);
                if (r != IMAPPARSE_OK)
                    return r;
                continue;
            }
            if (!ieq(s, len, "CONDSTORE"))
                return cmd_errorf(c->cmd, IMAPPARSE_BAD,
                                  "Unknown select parameter %.40s", s);
            c->cmd->condstore = 1;
        }
        c->i++;
    }
    return expect_end(c);
}

/* APPEND's arguments before its first event: the mailbox.  The rest is
 * parsed event by event (append_event()). */
static int parse_append(struct cur *c)
{
    return get_mailbox(c, 0);
}

/* ---- APPEND events ---------------------------------------------------
 *
 * The tokens of an APPEND grow line by line: lex_args() stops before each
 * data literal (a DATA token ends the tokens so far), the caller reads
 * the data, and the next line is lexed onto the same token list.  The
 * cursor `i` walks them through this grammar (RFC 3502, 4469, 3516,
 * 6855):
 *
 *   append-message = [SP flag-list] [SP date-time] SP append-data
 *   append-data    = literal / literal8 / "UTF8" SP "(" literal8 ")"
 *                    / "CATENATE" SP "(" cat-part *(SP cat-part) ")"
 *   cat-part       = "TEXT" SP (literal / literal8) / "URL" SP astring
 */

enum { AS_MSG, AS_CAT, AS_UTF8_CLOSE, AS_DONE };

struct appst {
    struct lexer lx;
    size_t i;               /* the next token to interpret */
    int state;              /* AS_* */
    unsigned nparts;        /* parts of the current CATENATE */
};

/* A copy in the arena: the token text of an APPEND moves as later lines
 * are lexed, what the caller holds must not.  NULL out of memory. */
static char *arena_dup(struct imapparse_cmd *cmd, const char *s, size_t len)
{
    char *d = arena_alloc(cmd, len + 1, 1);

    if (d) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

static void appst_free(struct imapparse_cmd *cmd)
{
    struct appst *as = cmd->appst;

    if (!as)
        return;
    buf_free(&as->lx.line);
    free(as);
    cmd->appst = NULL;
}

/* A data literal is next: announce it (limit, continuation).  The DATA
 * token is the last one lexed. */
static int append_data(struct appst *as, enum imapparse_append_event ev)
{
    struct lexer *lx = &as->lx;
    struct imapparse_append *ap = &lx->cmd->append;

    ap->event = ev;
    ap->size = lx->data_size;
    ap->nonsync = lx->data_nonsync;
    ap->binary = lx->data_binary;
    if (ap->size > lx->lim.max_append)
        return cmd_errorf(lx->cmd, IMAPPARSE_TOOBIG,
                          "%s too large (limit %zu bytes)",
                          ev == IMAPPARSE_APPEND_TEXT ? "TEXT part"
                                                      : "Message",
                          lx->lim.max_append);
    if (!ap->nonsync)
        return send_continue(lx, ap->size, 1);
    return IMAPPARSE_OK;
}

/* Interpret tokens up to the next event.  end_only: the next event must
 * be END (imapparse_append_end()). */
static int append_event(struct appst *as, int end_only)
{
    struct lexer *lx = &as->lx;
    struct imapparse_cmd *cmd = lx->cmd;
    struct imapparse_append *ap = &cmd->append;
    struct cur c;
    const struct imapparse_token *t;
    int r, opts = 0;

    memset(&c, 0, sizeof(c));
    c.cmd = cmd;
    c.max_depth = lx->lim.max_depth;
    for (;;) {
        c.i = as->i;
        if (c.i >= cmd->ntokens) {
            if (lx->stopped) {
                /* the caller has read the data: on to the next line */
                lx->stopped = 0;
                r = next_line(lx);
                if (r == IMAPPARSE_OK)
                    r = lex_args(lx);
                if (r != IMAPPARSE_OK)
                    return r;
                continue;
            }
            if (as->state == AS_MSG && !opts && ap->nmsg > 0) {
                ap->event = IMAPPARSE_APPEND_END;
                as->state = AS_DONE;
                return IMAPPARSE_OK;
            }
            return cmd_error(cmd, IMAPPARSE_BAD,
                             as->state == AS_CAT ? "Missing ')' after CATENATE"
                             : "Missing message literal");
        }
        t = peek(&c);
        if (end_only && as->state == AS_MSG)
            return cmd_error(cmd, IMAPPARSE_BAD, "Junk after message literal");
        switch (as->state) {
        case AS_MSG:
            if (!opts) {
                /* a new message */
                memset(&ap->flags, 0, sizeof(ap->flags));
                ap->flags_set = ap->date_set = ap->utf8 = 0;
                ap->date = 0;
                opts = 1;
            }
            if (t->type == IMAPPARSE_TOK_LPAREN && !ap->flags_set
                && !ap->date_set) {
                r = get_flag_list(&c, &ap->flags);
                if (r != IMAPPARSE_OK)
                    return r;
                for (size_t k = 0; k < ap->flags.n; k++) {
                    ap->flags.s[k] = arena_dup(cmd, ap->flags.s[k],
                                               strlen(ap->flags.s[k]));
                    if (!ap->flags.s[k])
                        return cmd_error(cmd, IMAPPARSE_NOMEM,
                                         "Out of memory");
                }
                ap->flags_set = 1;
                as->i = c.i;
                continue;
            }
            if (t->type == IMAPPARSE_TOK_QUOTED && !ap->date_set) {
                if (imapparse_datetime_parse(tok_text(&c, t), t->len,
                                             &ap->date) < 0)
                    return cmd_error(cmd, IMAPPARSE_BAD, "Invalid date-time");
                ap->date_set = 1;
                as->i++;
                continue;
            }
            if (t->type == IMAPPARSE_TOK_DATA) {
                as->i++;
                ap->nmsg++;
                return append_data(as, IMAPPARSE_APPEND_MESSAGE);
            }
            if (t->type == IMAPPARSE_TOK_ATOM
                && ieq(tok_text(&c, t), t->len, "CATENATE")
                && as->i + 1 < cmd->ntokens
                && cmd->tokens[as->i + 1].type == IMAPPARSE_TOK_LPAREN) {
                if (as->i + 2 < cmd->ntokens
                    && cmd->tokens[as->i + 2].type == IMAPPARSE_TOK_RPAREN)
                    return cmd_error(cmd, IMAPPARSE_BAD,
                                     "Empty CATENATE list");
                as->i += 2;
                as->state = AS_CAT;
                as->nparts = 0;
                ap->nmsg++;
                ap->event = IMAPPARSE_APPEND_CATENATE;
                return IMAPPARSE_OK;
            }
            if (t->type == IMAPPARSE_TOK_ATOM
                && ieq(tok_text(&c, t), t->len, "UTF8")
                && as->i + 2 < cmd->ntokens
                && cmd->tokens[as->i + 1].type == IMAPPARSE_TOK_LPAREN
                && cmd->tokens[as->i + 2].type == IMAPPARSE_TOK_DATA) {
                if (!lx->data_binary)
                    return cmd_error(cmd, IMAPPARSE_BAD,
                                     "UTF8 data must be a literal8");
                as->i += 3;
                as->state = AS_UTF8_CLOSE;
                ap->utf8 = 1;
                ap->nmsg++;
                return append_data(as, IMAPPARSE_APPEND_MESSAGE);
            }
            return cmd_error(cmd, IMAPPARSE_BAD,
                             ap->nmsg ? "Invalid message after message "
                                        "literal"
                                      : "Invalid APPEND arguments");
        case AS_UTF8_CLOSE:
            if (t->type != IMAPPARSE_TOK_RPAREN)
                return cmd_error(cmd, IMAPPARSE_BAD, "Missing ')' after UTF8");
            as->i++;
            as->state = AS_MSG;
            continue;
        case AS_CAT:
            if (t->type == IMAPPARSE_TOK_RPAREN) {
                if (as->nparts == 0)
                    return cmd_error(cmd, IMAPPARSE_BAD,
                                     "Empty CATENATE list");
                as->i++;
                as->state = AS_MSG;
                ap->event = IMAPPARSE_APPEND_CATEND;
                return IMAPPARSE_OK;
            }
            if (t->type == IMAPPARSE_TOK_ATOM
                && ieq(tok_text(&c, t), t->len, "TEXT")
                && as->i + 1 < cmd->ntokens
                && cmd->tokens[as->i + 1].type == IMAPPARSE_TOK_DATA) {
                as->i += 2;
                as->nparts++;
                return append_data(as, IMAPPARSE_APPEND_TEXT);
            }
            if (t->type == IMAPPARSE_TOK_ATOM
                && ieq(tok_text(&c, t), t->len, "URL")) {
                char *u;
                size_t ulen;

                c.i++;
                r = get_astring(&c, &u, &ulen, "URL");
                if (r != IMAPPARSE_OK)
                    return r;
                as->i = c.i;
                as->nparts++;
                u = arena_dup(cmd, u, ulen);
                if (!u)
                    return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
                ap->url = u;
                ap->url_len = ulen;
                ap->event = IMAPPARSE_APPEND_URL;
                return IMAPPARSE_OK;
            }
            return cmd_error(cmd, IMAPPARSE_BAD, "Invalid CATENATE part");
        default:
            return cmd_error(cmd, IMAPPARSE_BAD, "No APPEND in progress");
        }
    }
}

/* One step of an APPEND in progress, with the error handling of
 * imapparse_read(): an error drops the rest of the command. */
static int append_step(struct prot *p, const struct imapparse_options *opts,
                       struct imapparse_cmd *cmd, int end_only)
{
    struct appst *as = cmd->appst;
    int r;

    if (!as || as->state == AS_DONE)
        return cmd_error(cmd, IMAPPARSE_BAD, "No APPEND in progress");
    as->lx.p = p;
    limits_from(opts, &as->lx.lim);
    r = append_event(as, end_only);
    if (r > 0)
        r = resync(&as->lx, r, 0);
    if (r != IMAPPARSE_OK)
        appst_free(cmd);
    return r;
}

int imapparse_append_next(struct prot *p, const struct imapparse_options *opts,
                          struct imapparse_cmd *cmd)
{
    return append_step(p, opts, cmd, 0);
}

static int parse_id(struct cur *c)
{
    struct imapparse_id *id = &c->cmd->idparams;
    const struct imapparse_token *t = peek(c);
    size_t alloc = 0;
    int r;

    if (t && t->type == IMAPPARSE_TOK_ATOM && ieq(tok_text(c, t), t->len, "NIL")) {
        c->i++;
        id->nil = 1;
        return expect_end(c);
    }
    r = expect_type(c, IMAPPARSE_TOK_LPAREN, "ID parameter list");
    if (r != IMAPPARSE_OK)
        return r;
    while (!peek_type(c, IMAPPARSE_TOK_RPAREN)) {
        const struct imapparse_token *f = peek(c), *v;

        if (!f || (f->type != IMAPPARSE_TOK_QUOTED
                   && f->type != IMAPPARSE_TOK_LITERAL))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid ID field name");
        c->i++;
        v = peek(c);
        if (!v || v->type == IMAPPARSE_TOK_LPAREN
            || v->type == IMAPPARSE_TOK_RPAREN
            || (v->type == IMAPPARSE_TOK_ATOM
                && !ieq(tok_text(c, v), v->len, "NIL")))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid ID value");
        c->i++;
        if (id->n == 30)
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Too many ID fields");
        if (f->len > 30 || (v->type != IMAPPARSE_TOK_ATOM && v->len > 1024))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "ID field too long");
        if (id->n == alloc) {
            const char **nf, **nv;

            alloc = alloc ? alloc * 2 : 8;
            nf = arena_alloc(c->cmd, alloc, sizeof(*nf));
            nv = arena_alloc(c->cmd, alloc, sizeof(*nv));
            if (!nf || !nv)
                return cmd_error(c->cmd, IMAPPARSE_NOMEM, "Out of memory");
            if (id->n) {
                memcpy(nf, id->field, id->n * sizeof(*nf));
                memcpy(nv, id->value, id->n * sizeof(*nv));
            }
            id->field = nf;
            id->value = nv;
        }
        id->field[id->n] = tok_text(c, f);
        id->value[id->n] = v->type == IMAPPARSE_TOK_ATOM ? NULL : tok_text(c, v);
        id->n++;
    }
    c->i++;
    return expect_end(c);
}

static int parse_enable(struct cur *c)
{
    size_t alloc = 0;

    if (at_end(c))
        return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing capability");
    while (!at_end(c)) {
        char *s;
        size_t len;
        int r = get_atom(c, &s, &len, "capability");

        if (r == IMAPPARSE_OK && !all_chars(s, len, is_atom_char))
            r = cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid capability");
        if (r == IMAPPARSE_OK)
            r = list_push(c->cmd, &c->cmd->words, &alloc, s);
        if (r != IMAPPARSE_OK)
            return r;
    }
    return IMAPPARSE_OK;
}

static int parse_authenticate(struct cur *c)
{
    char *s;
    size_t len;
    int r = get_atom(c, &s, &len, "authentication mechanism");

    if (r == IMAPPARSE_OK && !all_chars(s, len, is_atom_char))
        r = cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid mechanism name");
    if (r != IMAPPARSE_OK)
        return r;
    upcase(s, len);
    c->cmd->arg[0] = s;
    c->cmd->arg_len[0] = len;
    if (!at_end(c)) {
        /* SASL-IR: base64 or "=" */
        size_t i;

        r = get_atom(c, &s, &len, "initial response");
        if (r != IMAPPARSE_OK)
            return r;
        for (i = 0; i < len; i++)
            if (!isalnum((unsigned char)s[i]) && !strchr("+/=", s[i]))
                return cmd_error(c->cmd, IMAPPARSE_BAD,
                                 "Invalid initial response");
        c->cmd->arg[1] = s;
        c->cmd->arg_len[1] = len;
    }
    return expect_end(c);
}

/* ---- commands ------------------------------------------------------ */

enum argspec {
    A_NONE,         /* no arguments */
    A_MAILBOX,      /* mailbox */
    A_MAILBOX2,     /* mailbox mailbox (RENAME) */
    A_LOGIN,        /* astring astring */
    A_LIST,         /* mailbox list-mailbox */
    A_SET_MAILBOX,  /* sequence-set mailbox (COPY, MOVE) */
    A_MAILBOX_ID,   /* mailbox astring (DELETEACL, LISTRIGHTS) */
    A_MAILBOX_ID2,  /* mailbox astring astring (SETACL) */
    A_ATOM_UP,      /* one atom, upper-cased into arg[0] (COMPRESS) */
    A_CUSTOM
};

static const struct {
    const char *name;
    enum imapparse_cmdid id;
    enum argspec args;
    int uid_ok;
} commands[] = {
    { "CAPABILITY", IMAPPARSE_CMD_CAPABILITY, A_NONE, 0 },
    { "NOOP", IMAPPARSE_CMD_NOOP, A_NONE, 0 },
    { "LOGOUT", IMAPPARSE_CMD_LOGOUT, A_NONE, 0 },
    { "ID", IMAPPARSE_CMD_ID, A_CUSTOM, 0 },
    { "ENABLE", IMAPPARSE_CMD_ENABLE, A_CUSTOM, 0 },
    { "STARTTLS", IMAPPARSE_CMD_STARTTLS, A_NONE, 0 },
    { "AUTHENTICATE", IMAPPARSE_CMD_AUTHENTICATE, A_CUSTOM, 0 },
    { "LOGIN", IMAPPARSE_CMD_LOGIN, A_LOGIN, 0 },
    { "SELECT", IMAPPARSE_CMD_SELECT, A_CUSTOM, 0 },
    { "EXAMINE", IMAPPARSE_CMD_EXAMINE, A_CUSTOM, 0 },
    { "CREATE", IMAPPARSE_CMD_CREATE, A_CUSTOM, 0 },
    { "DELETE", IMAPPARSE_CMD_DELETE, A_MAILBOX, 0 },
    { "RENAME", IMAPPARSE_CMD_RENAME, A_MAILBOX2, 0 },
    { "SUBSCRIBE", IMAPPARSE_CMD_SUBSCRIBE, A_MAILBOX, 0 },
    { "UNSUBSCRIBE", IMAPPARSE_CMD_UNSUBSCRIBE, A_MAILBOX, 0 },
    { "LIST", IMAPPARSE_CMD_LIST, A_CUSTOM, 0 },
    { "LSUB", IMAPPARSE_CMD_LSUB, A_LIST, 0 },
    { "STATUS", IMAPPARSE_CMD_STATUS, A_CUSTOM, 0 },
    { "APPEND", IMAPPARSE_CMD_APPEND, A_CUSTOM, 0 },
    { "NAMESPACE", IMAPPARSE_CMD_NAMESPACE, A_NONE, 0 },
    { "IDLE", IMAPPARSE_CMD_IDLE, A_NONE, 0 },
    { "COMPRESS", IMAPPARSE_CMD_COMPRESS, A_ATOM_UP, 0 },
    { "CHECK", IMAPPARSE_CMD_CHECK, A_NONE, 0 },
    { "CLOSE", IMAPPARSE_CMD_CLOSE, A_NONE, 0 },
    { "UNSELECT", IMAPPARSE_CMD_UNSELECT, A_NONE, 0 },
    { "EXPUNGE", IMAPPARSE_CMD_EXPUNGE, A_CUSTOM, 1 },
    { "SEARCH", IMAPPARSE_CMD_SEARCH, A_CUSTOM, 1 },
    { "SORT", IMAPPARSE_CMD_SORT, A_CUSTOM, 1 },
    { "THREAD", IMAPPARSE_CMD_THREAD, A_CUSTOM, 1 },
    { "FETCH", IMAPPARSE_CMD_FETCH, A_CUSTOM, 1 },
    { "STORE", IMAPPARSE_CMD_STORE, A_CUSTOM, 1 },
    { "COPY", IMAPPARSE_CMD_COPY, A_SET_MAILBOX, 1 },
    { "MOVE", IMAPPARSE_CMD_MOVE, A_SET_MAILBOX, 1 },
    { "SETACL", IMAPPARSE_CMD_SETACL, A_MAILBOX_ID2, 0 },
    { "DELETEACL", IMAPPARSE_CMD_DELETEACL, A_MAILBOX_ID, 0 },
    { "GETACL", IMAPPARSE_CMD_GETACL, A_MAILBOX, 0 },
    { "LISTRIGHTS", IMAPPARSE_CMD_LISTRIGHTS, A_MAILBOX_ID, 0 },
    { "MYRIGHTS", IMAPPARSE_CMD_MYRIGHTS, A_MAILBOX, 0 },
    { "GETQUOTA", IMAPPARSE_CMD_GETQUOTA, A_MAILBOX, 0 },
    { "GETQUOTAROOT", IMAPPARSE_CMD_GETQUOTAROOT, A_MAILBOX, 0 },
    { "SETQUOTA", IMAPPARSE_CMD_SETQUOTA, A_CUSTOM, 0 },
};

const char *imapparse_cmd_name(int id)
{
    size_t i;

    for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if ((int)commands[i].id == id)
            return commands[i].name;
    return NULL;
}

/* mailbox astring [astring]: the astrings into cmd->words */
static int parse_mailbox_ids(struct cur *c, int n)
{
    size_t alloc = 0;
    int r = get_mailbox(c, 0);

    for (int k = 0; k < n && r == IMAPPARSE_OK; k++) {
        char *s;
        size_t len;

        r = get_astring(c, &s, &len, k == 0 ? "identifier" : "rights");
        if (r == IMAPPARSE_OK)
            r = list_push(c->cmd, &c->cmd->words, &alloc, s);
    }
    return r;
}

/* SETQUOTA quota-root "(" [setquota-resource *(SP setquota-resource)] ")"
 * with setquota-resource = resource-name SP resource-limit (RFC 9208):
 * names are atoms, limits digits; both into cmd->words. */
static int parse_setquota(struct cur *c)
{
    size_t alloc = 0;
    int r = get_mailbox(c, 0);

    if (r == IMAPPARSE_OK)
        r = expect_type(c, IMAPPARSE_TOK_LPAREN, "resource list");
    while (r == IMAPPARSE_OK && !peek_type(c, IMAPPARSE_TOK_RPAREN)) {
        char *s;
        size_t len;

        if (at_end(c))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing ')'");
        r = get_atom(c, &s, &len, "resource name");
        if (r == IMAPPARSE_OK && !all_chars(s, len, is_atom_char))
            r = cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid resource name");
        if (r == IMAPPARSE_OK)
            r = list_push(c->cmd, &c->cmd->words, &alloc, s);
        if (r != IMAPPARSE_OK)
            return r;
        if (peek_type(c, IMAPPARSE_TOK_RPAREN) || at_end(c))
            return cmd_error(c->cmd, IMAPPARSE_BAD, "Missing resource limit");
        r = get_atom(c, &s, &len, "resource limit");
        if (r == IMAPPARSE_OK && (len == 0 || len > 20 ||
                                  strspn(s, "0123456789") != len))
            r = cmd_error(c->cmd, IMAPPARSE_BAD, "Invalid resource limit");
        if (r == IMAPPARSE_OK)
            r = list_push(c->cmd, &c->cmd->words, &alloc, s);
    }
    if (r != IMAPPARSE_OK)
        return r;
    c->i++;
    return expect_end(c);
}

static int parse_args(struct cur *c, enum argspec spec)
{
    struct imapparse_cmd *cmd = c->cmd;
    char *s;
    size_t len;
    int r = IMAPPARSE_OK;

    switch (spec) {
    case A_NONE:
        break;
    case A_MAILBOX:
        r = get_mailbox(c, 0);
        break;
    case A_MAILBOX2:
        r = get_mailbox(c, 0);
        if (r == IMAPPARSE_OK)
            r = get_mailbox(c, 1);
        break;
    case A_LOGIN:
        r = get_astring(c, &s, &len, "user name");
        if (r != IMAPPARSE_OK)
            return r;
        cmd->arg[0] = s;
        cmd->arg_len[0] = len;
        r = get_astring(c, &s, &len, "password");
        if (r != IMAPPARSE_OK)
            return r;
        cmd->arg[1] = s;
        cmd->arg_len[1] = len;
        break;
    case A_LIST:
        r = get_astring(c, &s, &len, "reference name");
        if (r != IMAPPARSE_OK)
            return r;
        cmd->arg[0] = s;
        cmd->arg_len[0] = len;
        r = get_list_mailbox(c, 1);
        break;
    case A_SET_MAILBOX:
        r = get_seqset(c, &cmd->set);
        if (r == IMAPPARSE_OK)
            r = get_mailbox(c, 0);
        break;
    case A_MAILBOX_ID:
    case A_MAILBOX_ID2:
        r = parse_mailbox_ids(c, spec == A_MAILBOX_ID ? 1 : 2);
        break;
    case A_ATOM_UP:
        r = get_atom(c, &s, &len, "argument");
        if (r != IMAPPARSE_OK)
            return r;
        upcase(s, len);
        cmd->arg[0] = s;
        cmd->arg_len[0] = len;
        break;
    case A_CUSTOM:
        switch (cmd->id) {
        case IMAPPARSE_CMD_ID:
            return parse_id(c);
        case IMAPPARSE_CMD_ENABLE:
            return parse_enable(c);
        case IMAPPARSE_CMD_AUTHENTICATE:
            return parse_authenticate(c);
        case IMAPPARSE_CMD_SELECT:
        case IMAPPARSE_CMD_EXAMINE:
            return parse_select(c);
        case IMAPPARSE_CMD_STATUS:
            return parse_status(c);
        case IMAPPARSE_CMD_LIST:
            return parse_list(c);
        case IMAPPARSE_CMD_CREATE:
            return parse_create(c);
        case IMAPPARSE_CMD_APPEND:
            return parse_append(c);
        case IMAPPARSE_CMD_EXPUNGE:
            if (cmd->uid) {
                r = get_seqset(c, &cmd->set);
                if (r != IMAPPARSE_OK)
                    return r;
            }
            break;
        case IMAPPARSE_CMD_SEARCH:
            return parse_search(c);
        case IMAPPARSE_CMD_SORT:
            return parse_sort(c);
        case IMAPPARSE_CMD_THREAD:
            return parse_thread(c);
        case IMAPPARSE_CMD_FETCH:
            return parse_fetch(c);
        case IMAPPARSE_CMD_STORE:
            return parse_store(c);
        case IMAPPARSE_CMD_SETQUOTA:
            return parse_setquota(c);
        default:
            return cmd_error(cmd, IMAPPARSE_BAD, "Unrecognized command");
        }
        break;
    }
    if (r != IMAPPARSE_OK)
        return r;
    return expect_end(c);
}

/* tag = 1*<any ASTRING-CHAR except "+"> */
static int tag_char(unsigned char c)
{
    return c != '+' && is_astring_char(c);
}

/* Copy a word of the first line into the arena. */
static char *line_word(struct imapparse_cmd *cmd, const char *s, size_t len)
{
    char *w = arena_alloc(cmd, len + 1, 1);

    if (w)
        memcpy(w, s, len);
    return w;
}

/* tag SP name [SP "UID" name]: the command head of the first line. */
static int parse_head(struct lexer *lx, size_t *cmdidx_r)
{
    struct imapparse_cmd *cmd = lx->cmd;
    const char *s = lx->line.s;
    size_t len = lx->line.len, i = 0, k;
    char *name;
    int pass;

    while (i < len && s[i] != ' ')
        i++;
    if (!all_chars(s, i, tag_char))
        return cmd_error(cmd, IMAPPARSE_BAD, "Invalid tag");
    cmd->tag = line_word(cmd, s, i);
    if (!cmd->tag)
        return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
    for (pass = 0; pass < 2; pass++) {
        size_t start;

        if (i >= len || s[i] != ' ' || i + 1 >= len)
            return cmd_error(cmd, IMAPPARSE_BAD, "Missing command");
        start = ++i;
        while (i < len && isalpha((unsigned char)s[i]))
            i++;
        if (i == start || (i < len && s[i] != ' '))
            return cmd_error(cmd, IMAPPARSE_BAD, "Invalid command name");
        name = line_word(cmd, s + start, i - start);
        if (!name)
            return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
        upcase(name, i - start);
        if (pass == 0 && strcmp(name, "UID") == 0) {
            cmd->uid = 1;
            continue;
        }
        if (cmd->uid) {
            char *full = arena_alloc(cmd, i - start + 5, 1);

            if (!full)
                return cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
            memcpy(full, "UID ", 4);
            memcpy(full + 4, name, i - start);
            cmd->name = full;
        } else {
            cmd->name = name;
        }
        break;
    }
    lx->pos = i;
    for (k = 0; k < sizeof(commands) / sizeof(commands[0]); k++) {
        if (strcmp(name, commands[k].name) == 0) {
            if (cmd->uid && !commands[k].uid_ok)
                return cmd_errorf(cmd, IMAPPARSE_BAD,
                                  "Invalid UID command %.40s", name);
            cmd->id = commands[k].id;
            *cmdidx_r = k;
            return IMAPPARSE_OK;
        }
    }
    return cmd_errorf(cmd, IMAPPARSE_BAD, "Unrecognized command %.40s", name);
}

int imapparse_read(struct prot *p, const struct imapparse_options *opts,
                   struct imapparse_cmd *cmd)
{
    struct lexer lx;
    struct cur c;
    size_t idx = 0;
    int r;

    memset(&lx, 0, sizeof(lx));
    limits_from(opts, &lx.lim);
    lx.p = p;
    lx.cmd = cmd;
    cmd_reset(cmd);
    buf_set_max(&cmd->text, lx.lim.max_command + 64);

    r = prot_getline(p, &lx.line, lx.lim.max_line, NULL);
    if (r == PROT_TOOLONG) {
        /* answer with the tag when it was readable */
        size_t i = 0;

        while (i < lx.line.len && lx.line.s[i] != ' ')
            i++;
        if (i < lx.line.len && all_chars(lx.line.s, i, tag_char))
            cmd->tag = line_word(cmd, lx.line.s, i);
        r = cmd_error(cmd, IMAPPARSE_TOOBIG, "Line too long");
        goto out;
    }
    if (r != PROT_OK) {
        r = map_prot(cmd, r);
        goto out;
    }
    lx.used = lx.line.len + 2;
    if (lx.line.len == 0) {
        r = cmd_error(cmd, IMAPPARSE_BAD, "Empty command line");
        goto out;
    }
    r = parse_head(&lx, &idx);
    if (r == IMAPPARSE_OK) {
        lx.append = cmd->id == IMAPPARSE_CMD_APPEND;
        r = lex_args(&lx);
    }
    if (r > 0) {
        r = resync(&lx, r, 0);
        goto out;
    }
    if (r != IMAPPARSE_OK)
        goto out;

    memset(&c, 0, sizeof(c));
    c.cmd = cmd;
    c.max_depth = lx.lim.max_depth;
    r = parse_args(&c, commands[idx].args);
    if (cmd->id == IMAPPARSE_CMD_APPEND && r == IMAPPARSE_OK) {
        /* the first event; the lexer lives on between events */
        struct appst *as = calloc(1, sizeof(*as));

        if (!as) {
            r = cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
            goto out;
        }
        cmd->arg[0] = arena_dup(cmd, cmd->arg[0], cmd->arg_len[0]);
        if (!cmd->arg[0]) {
            free(as);
            r = cmd_error(cmd, IMAPPARSE_NOMEM, "Out of memory");
            goto out;
        }
        as->lx = lx;
        as->i = c.i;
        as->state = AS_MSG;
        memset(&lx.line, 0, sizeof(lx.line));
        cmd->appst = as;
        r = append_step(p, opts, cmd, 0);
        goto out;
    }
    if (r > 0 && cmd->id == IMAPPARSE_CMD_APPEND)
        r = resync(&lx, r, 0);      /* drops a {n+} message */
out:
    buf_free(&lx.line);
    return r;
}

int imapparse_append_end(struct prot *p, const struct imapparse_options *opts,
                         struct imapparse_cmd *cmd)
{
    return append_step(p, opts, cmd, 1);
}
