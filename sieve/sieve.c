/*
 * sieve.c - the public entry points of the Sieve library that are not the
 * executor's: the extension registry, limits, sieve_compile(), the
 * script's life cycle and the text form of actions.
 *
 * sieve_compile() = sieve_parse() (text to generic tree) + sieve_check()
 * (resolve and refuse); on any failure nothing is returned and the
 * partial tree is freed.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "sieve/sieve_tree.h"
#include "sieve/sieve_ext.h"

const char *const sieve_ext_names[EXT_COUNT + 1] = {
    [EXT_FILEINTO] = "fileinto",
    [EXT_REJECT] = "reject",
    [EXT_EREJECT] = "ereject",
    [EXT_ENVELOPE] = "envelope",
    [EXT_IMAP4FLAGS] = "imap4flags",
    [EXT_COPY] = "copy",
    [EXT_SUBADDRESS] = "subaddress",
    [EXT_RELATIONAL] = "relational",
    [EXT_CMP_NUMERIC] = "comparator-i;ascii-numeric",
    [EXT_VACATION] = "vacation",
    [EXT_VACATION_SECONDS] = "vacation-seconds",
    [EXT_BODY] = "body",
    [EXT_VARIABLES] = "variables",
    [EXT_MAILBOX] = "mailbox",
    [EXT_DATE] = "date",
    [EXT_INDEX] = "index",
    [EXT_EDITHEADER] = "editheader",
    [EXT_DUPLICATE] = "duplicate",
    [EXT_IHAVE] = "ihave",
    [EXT_ENVIRONMENT] = "environment",
    [EXT_INCLUDE] = "include",
    [EXT_REGEX] = "regex",
    [EXT_SPECIALUSE] = "special-use",
    [EXT_ENCODED] = "encoded-character",
    [EXT_CMP_OCTET] = "comparator-i;octet",
    [EXT_CMP_CASEMAP] = "comparator-i;ascii-casemap",
    [EXT_COUNT] = NULL,
};

int sieve_ext_lookup(const char *name)
{
    int i;

    for (i = 0; i < EXT_COUNT; i++)
        if (strcmp(sieve_ext_names[i], name) == 0)
            return i;
    return -1;
}

const char *const *sieve_extensions(void)
{
    /* sieve_ext_names up to the always-present comparators */
    static const char *const list[] = {
        "fileinto", "reject", "ereject", "envelope", "imap4flags", "copy",
        "subaddress", "relational", "comparator-i;ascii-numeric", "vacation",
        "vacation-seconds", "body", "variables", "mailbox", "date", "index",
        "editheader", "duplicate", "ihave", "environment", "include",
        "regex", "special-use", "encoded-character", NULL
    };

    return list;
}

int sieve_extension_supported(const char *name)
{
    return name && sieve_ext_lookup(name) >= 0;
}

const char *sieve_strerror(int code)
{
    switch (code) {
    case SIEVE_OK: return "success";
    case SIEVE_ESYNTAX: return "invalid script";
    case SIEVE_ELIMIT: return "script limit exceeded";
    case SIEVE_ENOMEM: return "out of memory";
    case SIEVE_ERUNTIME: return "runtime error";
    case SIEVE_ETEMP: return "temporary failure";
    case SIEVE_EINVAL: return "invalid argument";
    default: return "unknown error";
    }
}

void sieve_limits_default(struct sieve_limits *l)
{
    l->max_script_size = 1 << 20;
    l->max_nesting = 32;
    l->max_string_len = 64 * 1024;
    l->max_actions = 64;
    l->max_redirects = 4;
    l->max_include_depth = 5;
    l->max_includes = 32;
    l->max_variables = 128;
    l->max_variable_len = 4096;
    l->max_match_len = 64 * 1024;
    l->max_match_steps = 10000000UL;
    l->max_headers = 1024;
    l->max_regex_cost = 1000000UL;
}

void sieve_limits_merge(struct sieve_limits *out,
                        const struct sieve_limits *in)
{
    sieve_limits_default(out);
    if (!in)
        return;
#define TAKE(f) if (in->f) out->f = in->f
    TAKE(max_script_size);
    TAKE(max_nesting);
    TAKE(max_string_len);
    TAKE(max_actions);
    TAKE(max_redirects);
    TAKE(max_include_depth);
    TAKE(max_includes);
    TAKE(max_variables);
    TAKE(max_variable_len);
    TAKE(max_match_len);
    TAKE(max_match_steps);
    TAKE(max_headers);
    TAKE(max_regex_cost);
#undef TAKE
}

void sieve_script_free(struct sieve_script **scriptp)
{
    struct sieve_script *s;
    size_t i;

    if (!scriptp || !*scriptp)
        return;
    s = *scriptp;
    if (s->chunks || s->regexes) {
        /* a loaded stored form: the tree lives in the chunks */
        while (s->regexes) {
            regfree(&s->regexes->re);
            s->regexes = s->regexes->next;
        }
        while (s->chunks) {
            struct sv_chunk *c = s->chunks;
            s->chunks = c->next;
            sv_chunk_release(c);
        }
    } else {
        for (i = 0; i < s->ncmds; i++)
            sieve_node_free(s->cmds[i]);
        free(s->cmds);
    }
    strarray_fini(&s->requires);
    free(s);
    *scriptp = NULL;
}

int sieve_compile(const char *text, size_t len,
                  const struct sieve_limits *limits,
                  const struct strarray *allowed,
                  struct sieve_script **script_r, struct buf *errmsg)
{
    struct sieve_script *s;
    int rc;

    if (errmsg)
        buf_reset(errmsg);
    if (!script_r)
        return SIEVE_EINVAL;
    *script_r = NULL;
    if (!text && len > 0)
        return SIEVE_EINVAL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return SIEVE_ENOMEM;
    sieve_limits_merge(&s->limits, limits);
    if (len > s->limits.max_script_size) {
        if (errmsg)
            buf_printf(errmsg, "line 1: script larger than %zu bytes",
                       s->limits.max_script_size);
        free(s);
        return SIEVE_ELIMIT;
    }
    if (len > 0 && memchr(text, '\0', len)) {
        /* anywhere, comments and multi-line strings included */
        const char *nul = memchr(text, '\0', len), *p;
        unsigned line = 1;
        for (p = text; p < nul; p++)
            line += *p == '\n';
        if (errmsg)
            buf_printf(errmsg, "line %u: NUL byte in script", line);
        free(s);
        return SIEVE_ESYNTAX;
    }
    rc = sieve_parse(text ? text : "", len, &s->limits, &s->cmds, &s->ncmds,
                     errmsg);
    if (rc == SIEVE_OK)
        rc = sieve_check(s, allowed, errmsg);
    if (rc != SIEVE_OK) {
        sieve_script_free(&s);
        return rc;
    }
    *script_r = s;
    return SIEVE_OK;
}

const struct strarray *sieve_script_requires(const struct sieve_script *s)
{
    return s ? &s->requires : NULL;
}

/* ---- the text form of actions ------------------------------------------ */

/* note a failed append; the output goes on (cut) */
#define P(call) do { if ((call) < 0) rc = -1; } while (0)

static int put_quoted(struct buf *out, const char *s)
{
    int rc = 0;

    P(buf_putc(out, ' '));
    P(buf_putc(out, '"'));
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            P(buf_putc(out, '\\'));
        if (*s == '\r')
            continue;
        if (*s == '\n') {
            P(buf_appendcstr(out, "\\n"));
            continue;
        }
        P(buf_putc(out, *s));
    }
    P(buf_putc(out, '"'));
    return rc;
}

static int put_list(struct buf *out, const struct strarray *sa)
{
    size_t i;
    int rc = 0;

    P(buf_appendcstr(out, " ["));
    for (i = 0; i < sa->count; i++) {
        if (i)
            P(buf_putc(out, ','));
        P(put_quoted(out, sa->data[i]));
    }
    P(buf_appendcstr(out, " ]"));
    return rc;
}

int sieve_actions_format(const struct sieve_actions *acts, struct buf *out)
{
    size_t i;
    int rc = 0;

    for (i = 0; i < acts->count; i++) {
        const struct sieve_action *a = &acts->v[i];
        switch (a->type) {
        case SIEVE_ACTION_KEEP:
            P(buf_appendcstr(out, a->implicit ? "keep implicit" : "keep"));
            if (a->flags.count) {
                P(buf_appendcstr(out, " :flags"));
                P(put_list(out, &a->flags));
            }
            break;
        case SIEVE_ACTION_DISCARD:
            P(buf_appendcstr(out, "discard"));
            break;
        case SIEVE_ACTION_FILEINTO:
            P(buf_appendcstr(out, "fileinto"));
            if (a->create)
                P(buf_appendcstr(out, " :create"));
            if (a->copy)
                P(buf_appendcstr(out, " :copy"));
            if (a->specialuse) {
                P(buf_appendcstr(out, " :specialuse"));
                P(put_quoted(out, a->specialuse));
            }
            if (a->flags.count) {
                P(buf_appendcstr(out, " :flags"));
                P(put_list(out, &a->flags));
            }
            P(put_quoted(out, a->mailbox));
            break;
        case SIEVE_ACTION_REDIRECT:
            P(buf_appendcstr(out, "redirect"));
            if (a->copy)
                P(buf_appendcstr(out, " :copy"));
            P(put_quoted(out, a->address));
            break;
        case SIEVE_ACTION_REJECT:
        case SIEVE_ACTION_EREJECT:
            P(buf_appendcstr(out, a->type == SIEVE_ACTION_REJECT ? "reject"
                                                               : "ereject"));
            P(put_quoted(out, a->text));
            break;
        case SIEVE_ACTION_VACATION:
            P(buf_appendcstr(out, "vacation"));
            if (a->seconds % 86400 == 0)
                P(buf_printf(out, " :days %lu", a->seconds / 86400));
            else
                P(buf_printf(out, " :seconds %lu", a->seconds));
            if (a->subject) {
                P(buf_appendcstr(out, " :subject"));
                P(put_quoted(out, a->subject));
            }
            if (a->from) {
                P(buf_appendcstr(out, " :from"));
                P(put_quoted(out, a->from));
            }
            if (a->addresses.count) {
                P(buf_appendcstr(out, " :addresses"));
                P(put_list(out, &a->addresses));
            }
            if (a->mime)
                P(buf_appendcstr(out, " :mime"));
            P(put_quoted(out, a->text));
            break;
        case SIEVE_ACTION_ADDHEADER:
            P(buf_appendcstr(out, "addheader"));
            if (a->last)
                P(buf_appendcstr(out, " :last"));
            P(put_quoted(out, a->name));
            P(put_quoted(out, a->text));
            break;
        case SIEVE_ACTION_DELETEHEADER:
            P(buf_appendcstr(out, "deleteheader"));
            P(put_quoted(out, a->name));
            P(buf_printf(out, " %u", a->index));
            break;
        case SIEVE_ACTION_DUPLICATE:
            P(buf_appendcstr(out, "duplicate"));
            P(put_quoted(out, a->text));
            P(buf_printf(out, " %lu", a->seconds));
            break;
        }
        P(buf_putc(out, '\n'));
    }
    return rc;
}
