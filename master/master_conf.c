/*
 * master_conf.c - the cyrus.conf reader.
 *
 * The whole file is read into memory (at most MASTER_CONF_MAX_BYTES) and
 * parsed with a (pointer, length) cursor; nothing relies on a terminating
 * NUL, and a NUL byte anywhere is an error.  The lexer cuts the text into
 * logical lines (a '\' followed by nothing but blanks up to the end of the
 * physical line joins the next one) of words; '#' outside double quotes
 * starts a comment that runs to the end of the physical line; '{' and '}'
 * are words of their own when they start a word.  A line is then either a
 * section header ("NAME {"), a closing "}", or an entry
 * ("name key=value ...").
 *
 * Invariants: a struct master_conf handed out holds only entries that
 * passed every check (known section, cmd present, values in range, listen
 * well formed, names unique as documented in master_conf.h); every string
 * in it is an owned NUL-terminated copy.  On error nothing stays allocated
 * and the message says "FILE:LINE: what".  Library code: never exits.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "master/master_conf.h"

#define MASTER_CONF_MAX_BYTES   (1024 * 1024)
#define MASTER_CONF_MAX_ENTRIES 4096
#define MASTER_CONF_MAX_WORDS   64      /* words on one logical line */
#define MASTER_CONF_MAX_NAME    64      /* entry names, port names */
#define MASTER_CONF_MAX_VALUE   4096    /* any value */

enum word_kind { WORD_TEXT, WORD_LBRACE, WORD_RBRACE };

struct word {
    enum word_kind kind;
    const char *s;
    size_t len;
    unsigned long line;
};

struct parser {
    const char *name;           /* file name for messages */
    const char *p, *end;        /* the cursor */
    unsigned long line;         /* physical line of *p */
    struct buf error;           /* set once, on the first error */
    int failed;
    struct master_conf *conf;
    size_t alloc;
};

static const struct {
    const char *name;
    enum master_section section;
} sections[] = {
    { "START", MASTER_SECTION_START },
    { "SERVICES", MASTER_SECTION_SERVICES },
    { "EVENTS", MASTER_SECTION_EVENTS },
    { "DAEMON", MASTER_SECTION_DAEMON },
};

static const char *section_name(enum master_section s)
{
    size_t i;

    for (i = 0; i < sizeof(sections) / sizeof(sections[0]); i++)
        if (sections[i].section == s)
            return sections[i].name;
    return "?";
}

/* ---- messages ----------------------------------------------------------- */

static void parse_error(struct parser *ps, unsigned long line,
                        const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void parse_error(struct parser *ps, unsigned long line,
                        const char *fmt, ...)
{
    va_list ap;

    if (ps->failed)
        return;
    ps->failed = 1;
    buf_reset(&ps->error);
    buf_printf(&ps->error, "%s:%lu: ", ps->name, line);
    va_start(ap, fmt);
    buf_vprintf(&ps->error, fmt, ap);
    va_end(ap);
}

/* (s, len) made printable for a message: at most 80 bytes, control and
 * non-ASCII bytes shown as '?'. */
static const char *shown(const char *s, size_t len, char *out, size_t outlen)
{
    return log_sanitize(s, len, out, outlen);
}

#define SHOWN(s, len) shown((s), (len), (char[81]){0}, 81)

/* ---- lexer -------------------------------------------------------------- */

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

/* At a '\': does only blank space follow up to the end of the physical
 * line (or of the text)?  Then this is a continuation; *next_r is set to
 * the newline (or the end). */
static int is_continuation(const struct parser *ps, const char *p,
                           const char **next_r)
{
    const char *q = p + 1;

    while (q < ps->end && is_blank(*q))
        q++;
    if (q < ps->end && *q != '\n')
        return 0;
    *next_r = q;
    return 1;
}

/* Read one logical line into words[].  Returns 1 with *nwords_r (maybe 0
 * for a blank line), 0 at the end of the text (no words), -1 on error. */
static int lex_line(struct parser *ps, struct word *words, size_t *nwords_r)
{
    size_t n = 0;
    const char *next;

    *nwords_r = 0;
    if (ps->p >= ps->end)
        return 0;
    while (ps->p < ps->end) {
        char c = *ps->p;

        if (c == '\n') {
            ps->p++;
            ps->line++;
            break;
        }
        if (is_blank(c)) {
            ps->p++;
            continue;
        }
        if (c == '\\' && is_continuation(ps, ps->p, &next)) {
            ps->p = next;
            if (ps->p < ps->end) {      /* the newline */
                ps->p++;
                ps->line++;
            }
            continue;
        }
        if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n')
                ps->p++;
            continue;
        }
        if (n == MASTER_CONF_MAX_WORDS) {
            parse_error(ps, ps->line, "too many words on one line (at most %d)",
                        MASTER_CONF_MAX_WORDS);
            return -1;
        }
        words[n].s = ps->p;
        words[n].line = ps->line;
        if (c == '{' || c == '}') {
            words[n].kind = c == '{' ? WORD_LBRACE : WORD_RBRACE;
            words[n].len = 1;
            ps->p++;
            n++;
            continue;
        }
        words[n].kind = WORD_TEXT;
        {
            int inquote = 0;
            unsigned long qline = 0;

            while (ps->p < ps->end) {
                c = *ps->p;
                if (inquote) {
                    if (c == '\n')
                        break;
                    if (c == '"')
                        inquote = 0;
                    ps->p++;
                    continue;
                }
                if (c == '"') {
                    inquote = 1;
                    qline = ps->line;
                    ps->p++;
                    continue;
                }
                if (c == '\n' || is_blank(c) || c == '#')
                    break;
                if (c == '\\' && is_continuation(ps, ps->p, &next))
                    break;
                ps->p++;
            }
            if (inquote) {
                parse_error(ps, qline, "unterminated quote");
                return -1;
            }
        }
        words[n].len = (size_t)(ps->p - words[n].s);
        n++;
    }
    *nwords_r = n;
    return 1;
}

/* ---- values ------------------------------------------------------------- */

/* A decimal integer: optional '-' (only when min < 0), 1..10 digits. */
static int parse_int(const char *s, size_t len, long min, long max,
                     int *out_r)
{
    long long v = 0;
    int neg = 0;
    size_t i = 0;

    if (len > 0 && s[0] == '-' && min < 0) {
        neg = 1;
        i = 1;
    }
    if (i == len || len - i > 10)
        return -1;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (neg)
        v = -v;
    if (v < min || v > max)
        return -1;
    *out_r = (int)v;
    return 0;
}

static int lower_eq(const char *s, size_t len, const char *lit)
{
    return strlen(lit) == len && strncasecmp(s, lit, len) == 0;
}

/* Cyrus's switch words. */
static int parse_switch(const char *s, size_t len, int *out_r)
{
    static const char *const on[] = { "1", "t", "true", "y", "yes", "on" };
    static const char *const off[] = { "0", "f", "false", "n", "no", "off" };
    size_t i;

    for (i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
        if (lower_eq(s, len, on[i])) {
            *out_r = 1;
            return 0;
        }
        if (lower_eq(s, len, off[i])) {
            *out_r = 0;
            return 0;
        }
    }
    return -1;
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
        || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static int is_host_char(char c)
{
    return is_name_char(c) || c == '.';
}

/* Split e->listen into kind/host/port.  0, or -1 with *why_r. */
static int parse_listen(struct master_entry *e, const char **why_r)
{
    const char *s = e->listen;
    size_t len = strlen(s);     /* our own copy, NUL-terminated */
    const char *host = NULL, *port;
    size_t hostlen = 0, portlen, i;
    int bracketed = 0, digits = 1;

    if (len == 0) {
        *why_r = "empty";
        return -1;
    }
    if (s[0] == '/') {
        if (len >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            *why_r = "UNIX socket path too long";
            return -1;
        }
        e->listen_kind = MASTER_LISTEN_UNIX;
        e->listen_host = strdup(s);
        return e->listen_host ? 0 : (*why_r = "out of memory", -1);
    }
    e->listen_kind = MASTER_LISTEN_TCP;
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);

        if (!close) {
            *why_r = "missing ]";
            return -1;
        }
        host = s + 1;
        hostlen = (size_t)(close - host);
        if (close + 1 == s + len || close[1] != ':') {
            *why_r = "expected :port after ]";
            return -1;
        }
        port = close + 2;
        bracketed = 1;
    } else {
        const char *colon = memchr(s, ':', len);

        if (colon) {
            if (memchr(colon + 1, ':', len - (size_t)(colon + 1 - s))) {
                *why_r = "IPv6 addresses need brackets: [addr]:port";
                return -1;
            }
            host = s;
            hostlen = (size_t)(colon - s);
            port = colon + 1;
        } else {
            port = s;
        }
    }
    portlen = len - (size_t)(port - s);

    /* the port: 1..65535 or a service name */
    if (portlen == 0) {
        *why_r = "missing port";
        return -1;
    }
    if (portlen > MASTER_CONF_MAX_NAME) {
        *why_r = "port too long";
        return -1;
    }
    for (i = 0; i < portlen; i++) {
        if (!is_host_char(port[i])) {
            *why_r = "bad character in port";
            return -1;
        }
        if (port[i] < '0' || port[i] > '9')
            digits = 0;
    }
    if (digits) {
        int pn;

        if (parse_int(port, portlen, 1, 65535, &pn) < 0) {
            *why_r = "port out of range 1..65535";
            return -1;
        }
    }

    /* the host */
    if (host) {
        char tmp[256];

        if (hostlen == 0) {
            *why_r = "empty host";
            return -1;
        }
        if (hostlen >= sizeof(tmp)) {
            *why_r = "host too long";
            return -1;
        }
        memcpy(tmp, host, hostlen);
        tmp[hostlen] = '\0';
        if (bracketed) {
            struct in6_addr a6;

            if (inet_pton(AF_INET6, tmp, &a6) != 1) {
                *why_r = "not an IPv6 address inside [ ]";
                return -1;
            }
            if (e->proto && strcmp(e->proto, "tcp4") == 0) {
                *why_r = "IPv6 address with proto tcp4";
                return -1;
            }
        } else if (hostlen == 1 && host[0] == '*') {
            host = NULL;        /* any address */
        } else {
            struct in_addr a4;

            for (i = 0; i < hostlen; i++) {
                if (!is_host_char(host[i])) {
                    *why_r = "bad character in host";
                    return -1;
                }
            }
            if (inet_pton(AF_INET, tmp, &a4) == 1 && e->proto
                && strcmp(e->proto, "tcp6") == 0) {
                *why_r = "IPv4 address with proto tcp6";
                return -1;
            }
        }
        if (host) {
            e->listen_host = strndup(host, hostlen);
            if (!e->listen_host) {
                *why_r = "out of memory";
                return -1;
            }
        }
    }
    e->listen_port = strndup(port, portlen);
    if (!e->listen_port) {
        *why_r = "out of memory";
        return -1;
    }
    return 0;
}

/* ---- entries ------------------------------------------------------------ */

enum key_type { KEY_STRING, KEY_INT, KEY_SWITCH, KEY_PROTO, KEY_AT };

#define IN_START    (1u << MASTER_SECTION_START)
#define IN_SERVICES (1u << MASTER_SECTION_SERVICES)
#define IN_EVENTS   (1u << MASTER_SECTION_EVENTS)
#define IN_DAEMON   (1u << MASTER_SECTION_DAEMON)
#define IN_ALL      (IN_START | IN_SERVICES | IN_EVENTS | IN_DAEMON)

static const struct key {
    const char *name;
    unsigned sections;
    enum key_type type;
    long min, max;
    size_t offset;
} keys[] = {
    { "cmd", IN_ALL, KEY_STRING, 0, 0, offsetof(struct master_entry, cmd) },
    { "listen", IN_SERVICES, KEY_STRING, 0, 0,
      offsetof(struct master_entry, listen) },
    { "proto", IN_SERVICES, KEY_PROTO, 0, 0,
      offsetof(struct master_entry, proto) },
    { "prefork", IN_SERVICES, KEY_INT, 0, MASTER_MAXCHILD_CAP,
      offsetof(struct master_entry, prefork) },
    { "maxchild", IN_SERVICES, KEY_INT, -1, MASTER_MAXCHILD_CAP,
      offsetof(struct master_entry, maxchild) },
    { "maxforkrate", IN_SERVICES, KEY_INT, 0, 10000,
      offsetof(struct master_entry, maxforkrate) },
    { "maxfds", IN_SERVICES, KEY_INT, 16, 65536,
      offsetof(struct master_entry, maxfds) },
    { "babysit", IN_SERVICES, KEY_SWITCH, 0, 1,
      offsetof(struct master_entry, babysit) },
    { "maxuses", IN_SERVICES, KEY_INT, 0, 1000000,
      offsetof(struct master_entry, maxuses) },
    { "idletimeout", IN_SERVICES, KEY_INT, 0, 86400,
      offsetof(struct master_entry, idletimeout) },
    { "backlog", IN_SERVICES, KEY_INT, 1, 65535,
      offsetof(struct master_entry, backlog) },
    { "period", IN_EVENTS, KEY_INT, 1, 525600,
      offsetof(struct master_entry, period) },
    { "at", IN_EVENTS, KEY_AT, 0, 2359, offsetof(struct master_entry, at) },
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static void entry_fini(struct master_entry *e)
{
    free(e->name);
    free(e->cmd);
    free(e->listen);
    free(e->listen_host);
    free(e->listen_port);
    free(e->proto);
    memset(e, 0, sizeof(*e));
}

static void entry_defaults(struct master_entry *e, enum master_section sec)
{
    memset(e, 0, sizeof(*e));
    e->section = sec;
    e->prefork = 0;
    e->maxchild = -1;
    e->maxforkrate = 0;
    e->maxfds = 256;
    e->babysit = 0;
    e->maxuses = 250;
    e->idletimeout = 0;
    e->backlog = 0;            /* the system maximum (somaxconn) */
    e->period = 0;
    e->at = -1;
}

/* Store one key=value; 0 or -1 (error set). */
static int entry_set(struct parser *ps, struct master_entry *e,
                     const struct key *k, const struct word *w,
                     const char *val, size_t vlen)
{
    void *field = (char *)e + k->offset;
    int v;

    switch (k->type) {
    case KEY_STRING:
        if (vlen > MASTER_CONF_MAX_VALUE) {
            parse_error(ps, w->line, "%s value too long for entry %s "
                        "(at most %d bytes)", k->name, e->name,
                        MASTER_CONF_MAX_VALUE);
            return -1;
        }
        *(char **)field = strndup(val, vlen);
        if (!*(char **)field) {
            parse_error(ps, w->line, "out of memory");
            return -1;
        }
        return 0;
    case KEY_PROTO:
        if (lower_eq(val, vlen, "tcp") || lower_eq(val, vlen, "tcp4")
            || lower_eq(val, vlen, "tcp6")
            || lower_eq(val, vlen, "udp") || lower_eq(val, vlen, "udp4")
            || lower_eq(val, vlen, "udp6")) {
            char *p = strndup(val, vlen), *q;

            if (!p) {
                parse_error(ps, w->line, "out of memory");
                return -1;
            }
            for (q = p; *q; q++)
                if (*q >= 'A' && *q <= 'Z')
                    *q = (char)(*q - 'A' + 'a');
            free(e->proto);
            e->proto = p;
            return 0;
        }
        parse_error(ps, w->line, "bad proto \"%s\" for entry %s "
                    "(tcp, tcp4 or tcp6)", SHOWN(val, vlen), e->name);
        return -1;
    case KEY_SWITCH:
        if (parse_switch(val, vlen, &v) < 0) {
            parse_error(ps, w->line, "bad %s \"%s\" for entry %s (0 or 1)",
                        k->name, SHOWN(val, vlen), e->name);
            return -1;
        }
        *(int *)field = v;
        return 0;
    case KEY_INT:
        if (parse_int(val, vlen, k->min, k->max, &v) < 0) {
            parse_error(ps, w->line, "bad %s \"%s\" for entry %s "
                        "(a number %ld..%ld)", k->name, SHOWN(val, vlen),
                        e->name, k->min, k->max);
            return -1;
        }
        *(int *)field = v;
        return 0;
    case KEY_AT:
        if (vlen < 1 || vlen > 4 || parse_int(val, vlen, 0, 2359, &v) < 0
            || v % 100 >= 60) {
            parse_error(ps, w->line, "bad at \"%s\" for entry %s "
                        "(HHMM, 0000..2359)", SHOWN(val, vlen), e->name);
            return -1;
        }
        *(int *)field = v;
        return 0;
    }
    return -1;
}

/* Parse words[1..n) of an entry into e (whose name is set). */
static int entry_parse_keys(struct parser *ps, struct master_entry *e,
                            const struct word *words, size_t n)
{
    unsigned long seen = 0;
    size_t i, k;

    for (i = 1; i < n; i++) {
        const struct word *w = &words[i];
        const char *eq, *val;
        size_t klen, vlen;

        if (w->kind != WORD_TEXT) {
            parse_error(ps, w->line, "unexpected %c in entry %s",
                        w->kind == WORD_LBRACE ? '{' : '}', e->name);
            return -1;
        }
        eq = memchr(w->s, '=', w->len);
        if (!eq || eq == w->s) {
            parse_error(ps, w->line, "expected key=value in entry %s, "
                        "got \"%s\"", e->name, SHOWN(w->s, w->len));
            return -1;
        }
        klen = (size_t)(eq - w->s);
        for (k = 0; k < klen; k++) {
            char c = w->s[k];

            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                  || (c >= '0' && c <= '9') || c == '_')) {
                parse_error(ps, w->line, "bad key \"%s\" in entry %s",
                            SHOWN(w->s, klen), e->name);
                return -1;
            }
        }
        val = eq + 1;
        vlen = w->len - klen - 1;
        if (vlen > 0 && val[0] == '"') {
            /* the lexer saw the closing quote; it must end the word */
            const char *close = memchr(val + 1, '"', vlen - 1);

            if (!close || close != val + vlen - 1) {
                parse_error(ps, w->line, "text after the closing quote of "
                            "%s in entry %s", SHOWN(w->s, klen), e->name);
                return -1;
            }
            val++;
            vlen -= 2;
        } else if (memchr(val, '"', vlen)) {
            parse_error(ps, w->line, "quote inside the unquoted value of "
                        "%s in entry %s (quote the whole value)",
                        SHOWN(w->s, klen), e->name);
            return -1;
        }
        for (k = 0; k < NKEYS; k++)
            if (strlen(keys[k].name) == klen
                && memcmp(keys[k].name, w->s, klen) == 0)
                break;
        if (k == NKEYS || !(keys[k].sections & (1u << e->section))) {
            log_warning("%s:%lu: unknown key %s in %s entry %s, ignored",
                        ps->name, w->line, SHOWN(w->s, klen),
                        section_name(e->section), e->name);
            continue;
        }
        if (seen & (1ul << k)) {
            parse_error(ps, w->line, "key %s given twice in entry %s",
                        keys[k].name, e->name);
            return -1;
        }
        seen |= 1ul << k;
        if (entry_set(ps, e, &keys[k], w, val, vlen) < 0)
            return -1;
    }
    return 0;
}

/* Checks across keys, listen parsing.  Returns 1 to keep the entry, 0 to
 * drop it (with a warning), -1 on error. */
static int entry_finish(struct parser *ps, struct master_entry *e)
{
    const char *why = NULL;
    int maxchild;

    if (!e->cmd) {
        parse_error(ps, e->line, "missing cmd for entry %s", e->name);
        return -1;
    }
    {
        char **argv = master_conf_split_cmd(e->cmd);

        if (!argv) {
            parse_error(ps, e->line, "empty or malformed cmd for entry %s",
                        e->name);
            return -1;
        }
        master_conf_argv_free(argv);
    }
    if (e->section == MASTER_SECTION_EVENTS) {
        if (e->period > 0 && e->at >= 0) {
            parse_error(ps, e->line, "both period and at given for event %s",
                        e->name);
            return -1;
        }
        if (e->period == 0 && e->at < 0) {
            parse_error(ps, e->line, "missing period or at for event %s",
                        e->name);
            return -1;
        }
    }
    if (e->section != MASTER_SECTION_SERVICES)
        return 1;

    if (!e->listen) {
        parse_error(ps, e->line, "missing listen for service %s", e->name);
        return -1;
    }
    if (!e->proto) {
        e->proto = strdup("tcp");
        if (!e->proto) {
            parse_error(ps, e->line, "out of memory");
            return -1;
        }
    }
    if (e->babysit) {           /* as Cyrus: keep one child, cap the rate */
        if (e->prefork < 1)
            e->prefork = 1;
        if (e->maxforkrate == 0)
            e->maxforkrate = 10;
    }
    maxchild = e->maxchild < 0 ? MASTER_MAXCHILD_CAP : e->maxchild;
    if (e->prefork > maxchild) {
        parse_error(ps, e->line, "prefork %d > maxchild %d for service %s",
                    e->prefork, maxchild, e->name);
        return -1;
    }
    e->maxchild = maxchild;
    if (parse_listen(e, &why) < 0) {
        parse_error(ps, e->line, "bad listen address \"%s\" for service %s: "
                    "%s", SHOWN(e->listen, strlen(e->listen)), e->name, why);
        return -1;
    }
    if (e->proto[0] == 'u') {
        log_warning("%s:%lu: proto %s is not supported (service %s), "
                    "entry ignored", ps->name, e->line, e->proto, e->name);
        return 0;
    }
    return 1;
}

/* Whether two entries may not share a name: same section, or both are
 * long-lived (SERVICES, EVENTS, DAEMON: the status output and reloads key
 * on the name).  START commands run once, so Debian's cyrus.conf may name
 * a START entry like an EVENTS one. */
static int names_clash(enum master_section a, enum master_section b)
{
    return a == b
        || (a != MASTER_SECTION_START && b != MASTER_SECTION_START);
}

static int parse_entry(struct parser *ps, enum master_section sec,
                       const struct word *words, size_t n)
{
    struct master_entry e;
    const struct word *nw = &words[0];
    size_t i;
    int rc;

    if (nw->kind != WORD_TEXT) {
        parse_error(ps, nw->line, "unexpected {");
        return -1;
    }
    if ((n >= 2 && words[1].kind == WORD_LBRACE)
        || (nw->len > 1 && nw->s[nw->len - 1] == '{')) {
        parse_error(ps, nw->line, "missing } before section %s",
                    SHOWN(nw->s, nw->s[nw->len - 1] == '{' ? nw->len - 1
                          : nw->len));
        return -1;
    }
    for (i = 0; i < nw->len; i++)
        if (!is_name_char(nw->s[i]))
            break;
    if (i < nw->len || nw->len > MASTER_CONF_MAX_NAME) {
        parse_error(ps, nw->line, "bad entry name \"%s\" (letters, digits, "
                    "- and _, at most %d)", SHOWN(nw->s, nw->len),
                    MASTER_CONF_MAX_NAME);
        return -1;
    }
    entry_defaults(&e, sec);
    e.line = nw->line;
    e.name = strndup(nw->s, nw->len);
    if (!e.name) {
        parse_error(ps, nw->line, "out of memory");
        return -1;
    }
    if (entry_parse_keys(ps, &e, words, n) < 0
        || (rc = entry_finish(ps, &e)) < 0) {
        entry_fini(&e);
        return -1;
    }
    if (rc == 0) {
        entry_fini(&e);
        return 0;
    }
    for (i = 0; i < ps->conf->nentries; i++) {
        const struct master_entry *o = &ps->conf->entries[i];

        if (strcmp(o->name, e.name) == 0
            && names_clash(o->section, e.section)) {
            parse_error(ps, e.line, "entry name %s given twice (first at "
                        "line %lu)", e.name, o->line);
            entry_fini(&e);
            return -1;
        }
    }
    if (ps->conf->nentries == MASTER_CONF_MAX_ENTRIES) {
        parse_error(ps, e.line, "too many entries (at most %d)",
                    MASTER_CONF_MAX_ENTRIES);
        entry_fini(&e);
        return -1;
    }
    if (ps->conf->nentries == ps->alloc) {
        size_t na = ps->alloc ? ps->alloc * 2 : 16;
        struct master_entry *ne = realloc(ps->conf->entries,
                                          na * sizeof(*ne));

        if (!ne) {
            parse_error(ps, e.line, "out of memory");
            entry_fini(&e);
            return -1;
        }
        ps->conf->entries = ne;
        ps->alloc = na;
    }
    ps->conf->entries[ps->conf->nentries++] = e;
    return 0;
}

static int find_section(const char *s, size_t len, enum master_section *sec_r)
{
    size_t i;

    for (i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
        if (lower_eq(s, len, sections[i].name)) {
            *sec_r = sections[i].section;
            return 0;
        }
    }
    return -1;
}

/* A line outside any section: "NAME {" or "NAME{". */
static int parse_header(struct parser *ps, const struct word *words, size_t n,
                        enum master_section *sec_r)
{
    const struct word *w = &words[0];
    size_t namelen;
    int brace;

    if (w->kind == WORD_RBRACE) {
        parse_error(ps, w->line, "unexpected } outside a section");
        return -1;
    }
    if (w->kind == WORD_LBRACE) {
        parse_error(ps, w->line, "{ without a section name");
        return -1;
    }
    namelen = w->len;
    brace = namelen > 1 && w->s[namelen - 1] == '{';
    if (brace)
        namelen--;
    if (!brace && n >= 2 && words[1].kind == WORD_LBRACE)
        brace = 2;
    if (!brace) {
        enum master_section dummy;

        if (n == 1 && find_section(w->s, namelen, &dummy) == 0)
            parse_error(ps, w->line, "expected { after %s",
                        SHOWN(w->s, namelen));
        else
            parse_error(ps, w->line, "line outside a section");
        return -1;
    }
    if (find_section(w->s, namelen, sec_r) < 0) {
        parse_error(ps, w->line, "unknown section %s", SHOWN(w->s, namelen));
        return -1;
    }
    if ((size_t)(brace == 2 ? 2 : 1) < n) {
        parse_error(ps, w->line, "text after { (entries go on lines of "
                    "their own)");
        return -1;
    }
    return 0;
}

static int parse_text(struct parser *ps, const char *text, size_t len)
{
    struct word words[MASTER_CONF_MAX_WORDS];
    const char *nul;
    int in_section = 0;
    enum master_section sec = MASTER_SECTION_START;
    unsigned long section_line = 0;
    size_t n;
    int rc;

    nul = memchr(text, '\0', len);
    if (nul) {
        unsigned long line = 1;
        const char *q;

        for (q = text; q < nul; q++)
            if (*q == '\n')
                line++;
        parse_error(ps, line, "NUL byte in the file");
        return -1;
    }
    ps->p = text;
    ps->end = text + len;
    ps->line = 1;
    while ((rc = lex_line(ps, words, &n)) > 0) {
        if (n == 0)
            continue;
        if (!in_section) {
            if (parse_header(ps, words, n, &sec) < 0)
                return -1;
            in_section = 1;
            section_line = words[0].line;
            continue;
        }
        if (words[0].kind == WORD_RBRACE) {
            if (n > 1) {
                parse_error(ps, words[1].line, "text after }");
                return -1;
            }
            in_section = 0;
            continue;
        }
        if (parse_entry(ps, sec, words, n) < 0)
            return -1;
    }
    if (rc < 0)
        return -1;
    if (in_section) {
        parse_error(ps, section_line, "section %s not closed (missing })",
                    section_name(sec));
        return -1;
    }
    return 0;
}

/* ---- public ------------------------------------------------------------- */

int master_conf_load_string(const char *name, const char *text, size_t len,
                            struct master_conf **conf_r, char **error_r)
{
    struct parser ps;

    *conf_r = NULL;
    if (error_r)
        *error_r = NULL;
    memset(&ps, 0, sizeof(ps));
    ps.name = name ? name : "cyrus.conf";
    ps.conf = calloc(1, sizeof(*ps.conf));
    if (!ps.conf) {
        if (error_r)
            *error_r = strdup("out of memory");
        return -1;
    }
    if (len > MASTER_CONF_MAX_BYTES) {
        parse_error(&ps, 1, "file too large (more than %d bytes)",
                    MASTER_CONF_MAX_BYTES);
    } else if (text == NULL && len > 0) {
        parse_error(&ps, 1, "no text");
    } else {
        parse_text(&ps, text ? text : "", len);
    }
    if (ps.failed) {
        if (error_r) {
            *error_r = buf_release(&ps.error);
            if (!*error_r)
                *error_r = strdup("out of memory");
        }
        buf_free(&ps.error);
        master_conf_free(&ps.conf);
        return -1;
    }
    buf_free(&ps.error);
    *conf_r = ps.conf;
    return 0;
}

static char *errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *errorf(const char *fmt, ...)
{
    struct buf b = BUF_INITIALIZER;
    va_list ap;
    char *s;

    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    s = buf_release(&b);
    return s ? s : strdup("out of memory");
}

int master_conf_load(const char *path, struct master_conf **conf_r,
                     char **error_r)
{
    struct buf text = BUF_INITIALIZER;
    char chunk[8192];
    ssize_t got;
    int fd, rc;

    *conf_r = NULL;
    if (error_r)
        *error_r = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (error_r)
            *error_r = errorf("%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    for (;;) {
        got = read(fd, chunk, sizeof(chunk));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;

            close(fd);
            buf_free(&text);
            if (error_r)
                *error_r = errorf("%s: cannot read: %s", path, strerror(e));
            return -1;
        }
        if (got == 0)
            break;
        if (text.len + (size_t)got > MASTER_CONF_MAX_BYTES) {
            close(fd);
            buf_free(&text);
            if (error_r)
                *error_r = errorf("%s: file too large (more than %d bytes)",
                                  path, MASTER_CONF_MAX_BYTES);
            return -1;
        }
        if (buf_append(&text, chunk, (size_t)got) < 0) {
            close(fd);
            buf_free(&text);
            if (error_r)
                *error_r = errorf("%s: out of memory", path);
            return -1;
        }
    }
    close(fd);
    rc = master_conf_load_string(path, text.s, text.len, conf_r, error_r);
    buf_free(&text);
    return rc;
}

const struct master_entry *master_conf_find(const struct master_conf *conf,
                                            const char *name)
{
    const struct master_entry *start = NULL;
    size_t i;

    if (!conf || !name)
        return NULL;
    for (i = 0; i < conf->nentries; i++) {
        if (strcmp(conf->entries[i].name, name) != 0)
            continue;
        if (conf->entries[i].section != MASTER_SECTION_START)
            return &conf->entries[i];
        if (!start)
            start = &conf->entries[i];
    }
    return start;
}

static int str_differs(const char *a, const char *b)
{
    if (!a || !b)
        return a != b;
    return strcmp(a, b) != 0;
}

int master_conf_listen_differs(const struct master_entry *a,
                               const struct master_entry *b)
{
    if (a->listen_kind != b->listen_kind)
        return 1;
    if (str_differs(a->listen, b->listen))
        return 1;
    return str_differs(a->proto, b->proto);
}

char **master_conf_split_cmd(const char *cmd)
{
    char **argv = NULL, **nv;
    size_t argc = 0, alloc = 0;
    struct buf word = BUF_INITIALIZER;
    const char *p;

    if (!cmd)
        return NULL;
    p = cmd;
    for (;;) {
        int inquote = 0, have = 0;

        while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
            p++;
        if (*p == '\0')
            break;
        buf_reset(&word);
        for (; *p; p++) {
            if (*p == '"') {
                inquote = !inquote;
                have = 1;
                continue;
            }
            if (!inquote && (*p == ' ' || *p == '\t' || *p == '\r'
                             || *p == '\n'))
                break;
            if (buf_putc(&word, *p) < 0)
                goto fail;
            have = 1;
        }
        if (inquote)
            goto fail;
        if (!have)
            continue;
        if (argc + 2 > alloc) {
            size_t na = alloc ? alloc * 2 : 8;

            nv = realloc(argv, na * sizeof(*nv));
            if (!nv)
                goto fail;
            argv = nv;
            alloc = na;
        }
        argv[argc] = strdup(buf_cstring(&word));
        if (!argv[argc])
            goto fail;
        argv[++argc] = NULL;
    }
    buf_free(&word);
    if (argc == 0) {
        free(argv);
        return NULL;
    }
    return argv;

fail:
    buf_free(&word);
    if (argv) {
        argv[argc] = NULL;
        master_conf_argv_free(argv);
    }
    return NULL;
}

void master_conf_argv_free(char **argv)
{
    size_t i;

    if (!argv)
        return;
    for (i = 0; argv[i]; i++)
        free(argv[i]);
    free(argv);
}

void master_conf_remove(struct master_conf *conf, size_t i)
{
    if (!conf || i >= conf->nentries)
        return;
    entry_fini(&conf->entries[i]);
    memmove(&conf->entries[i], &conf->entries[i + 1],
            (conf->nentries - i - 1) * sizeof(conf->entries[0]));
    conf->nentries--;
}

static char *dup_or_null(const char *s, int *failed)
{
    char *r;

    if (!s)
        return NULL;
    r = strdup(s);
    if (!r)
        *failed = 1;
    return r;
}

int master_conf_insert_copy(struct master_conf *conf, size_t i,
                            const char *name, const char *cmd)
{
    struct master_entry e, *ne;
    int failed = 0;

    if (!conf || i >= conf->nentries || !name || !cmd)
        return -1;
    /* the array may have been allocated to exactly nentries: grow by one */
    ne = realloc(conf->entries, (conf->nentries + 1) * sizeof(*ne));
    if (!ne)
        return -1;
    conf->entries = ne;
    e = conf->entries[i];
    e.name = dup_or_null(name, &failed);
    e.cmd = dup_or_null(cmd, &failed);
    e.listen = dup_or_null(e.listen, &failed);
    e.listen_host = dup_or_null(e.listen_host, &failed);
    e.listen_port = dup_or_null(e.listen_port, &failed);
    e.proto = dup_or_null(e.proto, &failed);
    if (failed) {
        entry_fini(&e);
        return -1;
    }
    memmove(&conf->entries[i + 2], &conf->entries[i + 1],
            (conf->nentries - i - 1) * sizeof(conf->entries[0]));
    conf->entries[i + 1] = e;
    conf->nentries++;
    return 0;
}

void master_conf_free(struct master_conf **confp)
{
    size_t i;

    if (!confp || !*confp)
        return;
    for (i = 0; i < (*confp)->nentries; i++)
        entry_fini(&(*confp)->entries[i]);
    free((*confp)->entries);
    free(*confp);
    *confp = NULL;
}
