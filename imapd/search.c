/*
 * search.c - evaluate an IMAP SEARCH key tree over a session's view of a
 * mailbox (the contract is in search.h).
 *
 * The parsed tree is first compiled into a tree of nodes that carry what
 * each key needs ready for use: the folded needle of a string key, the
 * user-flag bit of a keyword, whether the node needs the message file.
 * Each message is then evaluated in at most two rounds with three-valued
 * logic: the first round answers every key that the index record and the
 * callbacks can answer and says "unknown" for keys that need the file;
 * only when the tree's value is still unknown is the file mapped and the
 * second round run.  The message's decoded header text and body text are
 * built on first use and kept until the next message, so the file is
 * opened and parsed at most once per message per search.
 *
 * Invariants: message bytes are scanned with (pointer, end) cursors only
 * (never strlen); every buffer grows through struct buf; MIME recursion
 * is bounded by SEARCH_MAX_DEPTH and the number of parts by
 * SEARCH_MAX_PARTS; nothing here depends on the message being well
 * formed.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "lib/utf8.h"
#include "imapd/search.h"
#include "store/mailbox.h"
#include "store/message.h"
#include "store/seen.h"
#include "store/store.h"

#define SEARCH_MAX_DEPTH 50
#define SEARCH_MAX_PARTS 10000

/* three-valued results; errors are negative store codes */
#define R_FALSE 0
#define R_TRUE 1
#define R_UNKNOWN 2

/* ---- UTF-8 and case folding ----------------------------------------- */

/* Simple case folding (Unicode CaseFolding.txt, status C and S) for
 * ASCII, Latin-1, Latin Extended-A, basic Greek and Cyrillic. */
static uint32_t fold_cp(uint32_t c)
{
    if (c < 0x80)
        return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c == 0xb5)
        return 0x3bc;
    if (c >= 0xc0 && c <= 0xde && c != 0xd7)
        return c + 32;
    if (c >= 0x100 && c <= 0x12f)
        return c | 1;
    if (c >= 0x132 && c <= 0x137)
        return c | 1;
    if (c >= 0x139 && c <= 0x148)
        return (c & 1) ? c + 1 : c;
    if (c >= 0x14a && c <= 0x177)
        return c | 1;
    if (c == 0x178)
        return 0xff;
    if (c >= 0x179 && c <= 0x17e)
        return (c & 1) ? c + 1 : c;
    if (c == 0x17f)
        return 's';
    if (c == 0x386)
        return 0x3ac;
    if (c >= 0x388 && c <= 0x38a)
        return c + 37;
    if (c == 0x38c)
        return 0x3cc;
    if (c == 0x38e || c == 0x38f)
        return c + 63;
    if (c >= 0x391 && c <= 0x3ab && c != 0x3a2)
        return c + 32;
    if (c == 0x3c2)
        return 0x3c3;
    if (c >= 0x400 && c <= 0x40f)
        return c + 80;
    if (c >= 0x410 && c <= 0x42f)
        return c + 32;
    return c;
}

int search_fold(const char *s, size_t len, struct buf *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0, n;
    uint32_t cp;

    while (i < len) {
        if (p[i] < 0x80) {
            /* fast path for runs of ASCII */
            size_t j = i;
            char tmp[256];
            size_t k = 0;

            while (j < len && p[j] < 0x80 && k < sizeof(tmp)) {
                unsigned char c = p[j++];
                tmp[k++] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
            }
            if (buf_append(out, tmp, k) < 0)
                return -1;
            i = j;
            continue;
        }
        if (utf8_decode(p + i, len - i, &cp, &n) < 0) {
            if (buf_putc(out, p[i]) < 0)
                return -1;
            i++;
            continue;
        }
        if (utf8_put(out, fold_cp(cp)) < 0)
            return -1;
        i += n;
    }
    return 0;
}

/* ---- charsets -------------------------------------------------------- */

enum cs { CS_UTF8 = 0, CS_LATIN1, CS_OTHER };

static int name_is(const char *s, size_t len, const char *name)
{
    return strlen(name) == len && strncasecmp(s, name, len) == 0;
}

static enum cs charset_kind(const char *s, size_t len)
{
    static const char *const utf8[] = {
        "utf-8", "utf8", "us-ascii", "ascii", "us", "ansi_x3.4-1968", NULL
    };
    static const char *const latin1[] = {
        "iso-8859-1", "iso8859-1", "iso_8859-1", "iso-ir-100", "latin1",
        "l1", "ibm819", "cp819", "iso_8859-1:1987", NULL
    };
    size_t i;

    if (len == 0)
        return CS_UTF8;
    for (i = 0; utf8[i]; i++)
        if (name_is(s, len, utf8[i]))
            return CS_UTF8;
    for (i = 0; latin1[i]; i++)
        if (name_is(s, len, latin1[i]))
            return CS_LATIN1;
    return CS_OTHER;
}

/* Append bytes in charset cs as UTF-8 (CS_OTHER: as they are); NUL
 * bytes are dropped. */
static int charset_append(enum cs cs, const char *s, size_t len,
                          struct buf *out)
{
    size_t i;

    if (len == 0)
        return 0;           /* s may be NULL (an empty encoded word) */
    if (cs != CS_LATIN1) {
        size_t start = 0;

        for (i = 0; i < len; i++) {
            if (s[i] == '\0') {
                if (buf_append(out, s + start, i - start) < 0)
                    return -1;
                start = i + 1;
            }
        }
        return buf_append(out, s + start, len - start);
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == 0)
            continue;
        if (utf8_put(out, c) < 0)
            return -1;
    }
    return 0;
}

/* ---- transfer encodings: store/message.h's decoders ------------------- */

/* ---- headers ---------------------------------------------------------- */

struct hfield {
    const char *name;
    size_t nlen;
    const char *val;        /* raw: folding line breaks still in */
    size_t vlen;
};

/* The next field of the header at *pp (up to end); 1 and *f, or 0 at the
 * end of the header.  Lines without a colon (and stray continuation
 * lines) are skipped. */
static int header_next(const char **pp, const char *end, struct hfield *f)
{
    const char *p = *pp;

    while (p < end && !message_line_is_empty(p, end)) {
        const char *eol = message_line_next(p, end);
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        const char *q, *vend;

        if (*p == ' ' || *p == '\t' || !colon) {
            p = eol;
            continue;
        }
        f->name = p;
        f->nlen = (size_t)(colon - p);
        while (f->nlen && (p[f->nlen - 1] == ' ' || p[f->nlen - 1] == '\t'))
            f->nlen--;
        /* continuation lines */
        q = eol;
        while (q < end && (*q == ' ' || *q == '\t'))
            q = message_line_next(q, end);
        vend = q;
        while (vend > colon + 1 && (vend[-1] == '\n' || vend[-1] == '\r'))
            vend--;
        f->val = colon + 1;
        f->vlen = (size_t)(vend - (colon + 1));
        *pp = q;
        return 1;
    }
    *pp = end;
    return 0;
}

/* Decode one encoded word at s (starting "=?"): 0 and its length in
 * *wlen_r with the UTF-8 text appended to out, 1 when the charset is
 * unknown (nothing appended), -1 when it is no encoded word, -2 out of
 * memory. */
static int ew_decode(const char *s, size_t len, size_t *wlen_r,
                     struct buf *out, struct buf *tmp)
{
    size_t i = 2, cs_start = 2, cs_len, text_start, text_len;
    const char *star;
    int enc;
    enum cs cs;

    while (i < len && s[i] != '?' && s[i] > ' ' && s[i] < 0x7f && i < 80)
        i++;
    if (i >= len || s[i] != '?' || i == cs_start)
        return -1;
    cs_len = i - cs_start;
    i++;
    if (i + 1 >= len || s[i + 1] != '?')
        return -1;
    enc = toupper((unsigned char)s[i]);
    if (enc != 'B' && enc != 'Q')
        return -1;
    i += 2;
    text_start = i;
    while (i < len && s[i] != '?' && s[i] > ' ' && s[i] < 0x7f)
        i++;
    if (i + 1 >= len || s[i] != '?' || s[i + 1] != '=')
        return -1;
    text_len = i - text_start;
    *wlen_r = i + 2;
    /* RFC 2231 language suffix: charset*lang */
    star = memchr(s + cs_start, '*', cs_len);
    if (star)
        cs_len = (size_t)(star - (s + cs_start));
    cs = charset_kind(s + cs_start, cs_len);
    if (cs == CS_OTHER)
        return 1;
    buf_reset(tmp);
    if ((enc == 'B' ? message_decode_base64(s + text_start, text_len, tmp)
                    : message_decode_q(s + text_start, text_len, tmp)) < 0)
        return -2;
    if (charset_append(cs, tmp->s, tmp->len, out) < 0)
        return -2;
    return 0;
}

int search_decode_header(const char *s, size_t len, struct buf *out)
{
    struct buf tmp = BUF_INITIALIZER;
    size_t i = 0, ws_mark = 0;
    int prev_ew = 0, have_ws = 0, r = 0;

    /* leading white space */
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'
                       || s[i] == '\n'))
        i++;
    while (i < len) {
        char c = s[i];

        if (c == '\r' || c == '\n') {
            i++;
            continue;
        }
        if (c == '=' && i + 1 < len && s[i + 1] == '?') {
            size_t wlen = 0, mark = out->len;
            int d = ew_decode(s + i, len - i, &wlen, out, &tmp);

            if (d == -2) {
                r = -1;
                break;
            }
            if (d == 0) {
                /* white space between two encoded words is dropped */
                if (prev_ew && have_ws && ws_mark <= mark) {
                    memmove(out->s + ws_mark, out->s + mark, out->len - mark);
                    out->len -= mark - ws_mark;
                }
                i += wlen;
                prev_ew = 1;
                have_ws = 0;
                continue;
            }
            if (d == 1) {
                /* unknown charset: the word as it is */
                if (buf_append(out, s + i, wlen) < 0) {
                    r = -1;
                    break;
                }
                i += wlen;
                prev_ew = 0;
                have_ws = 0;
                continue;
            }
        }
        if (c == ' ' || c == '\t') {
            if (!have_ws) {
                ws_mark = out->len;
                have_ws = 1;
            }
        } else {
            prev_ew = 0;
            have_ws = 0;
        }
        if (c != '\0' && buf_putc(out, c) < 0) {
            r = -1;
            break;
        }
        i++;
    }
    /* trailing white space */
    while (r == 0 && out->len && (out->s[out->len - 1] == ' '
                                  || out->s[out->len - 1] == '\t'))
        out->len--;
    if (out->s)
        out->s[out->len] = '\0';
    buf_free(&tmp);
    return r;
}

/* ---- Date: header ----------------------------------------------------- */

static const char *skip_cfws(const char *p, const char *end)
{
    int depth = 0;

    while (p < end) {
        if (*p == '(') {
            depth++;
        } else if (*p == ')' && depth > 0) {
            depth--;
        } else if (*p == '\\' && depth > 0 && p + 1 < end) {
            p++;
        } else if (depth == 0 && *p != ' ' && *p != '\t' && *p != '\r'
                   && *p != '\n') {
            break;
        }
        p++;
    }
    return p;
}

static int leap_year(int y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

int search_parse_date(const char *s, size_t len,
                      struct imapparse_date *date_r)
{
    static const char months[] = "janfebmaraprmayjunjulaugsepoctnovdec";
    static const int mdays[12] = { 31, 29, 31, 30, 31, 30,
                                   31, 31, 30, 31, 30, 31 };
    const char *p = s, *end = s + len, *q;
    int day = 0, mon = -1, year = 0, nd, i;

    p = skip_cfws(p, end);
    /* day-of-week "," */
    q = p;
    while (q < end && isalpha((unsigned char)*q))
        q++;
    if (q > p) {
        p = skip_cfws(q, end);
        if (p >= end || *p != ',')
            return -1;
        p = skip_cfws(p + 1, end);
    }
    for (nd = 0; p < end && isdigit((unsigned char)*p) && nd < 3; nd++, p++)
        day = day * 10 + (*p - '0');
    if (nd == 0 || nd > 2)
        return -1;
    p = skip_cfws(p, end);
    if (end - p < 3)
        return -1;
    for (i = 0; i < 12; i++)
        if (strncasecmp(p, months + 3 * i, 3) == 0)
            mon = i;
    if (mon < 0)
        return -1;
    p += 3;
    if (p < end && isalpha((unsigned char)*p))
        return -1;
    p = skip_cfws(p, end);
    for (nd = 0; p < end && isdigit((unsigned char)*p) && nd < 5; nd++, p++)
        year = year * 10 + (*p - '0');
    if (nd < 2 || nd > 4)
        return -1;
    if (nd == 2)
        year += year < 50 ? 2000 : 1900;
    else if (nd == 3)
        year += 1900;
    if (year < 1 || day < 1 || day > mdays[mon]
        || (mon == 1 && day == 29 && !leap_year(year)))
        return -1;
    /* the time must follow (hh:mm), even though it is disregarded */
    p = skip_cfws(p, end);
    if (end - p < 4 || !isdigit((unsigned char)p[0]))
        return -1;
    date_r->year = year;
    date_r->mon = mon + 1;
    date_r->mday = day;
    return 0;
}

/* ---- substring match ------------------------------------------------- */

static int contains(const char *h, size_t hl, const char *n, size_t nl)
{
    const char *p, *last;

    if (nl == 0)
        return 1;
    if (!h || nl > hl)
        return 0;
    p = h;
    last = h + (hl - nl);
    while (p <= last) {
        p = memchr(p, n[0], (size_t)(last - p) + 1);
        if (!p)
            return 0;
        if (memcmp(p, n, nl) == 0)
            return 1;
        p++;
    }
    return 0;
}

/* ---- the compiled tree ------------------------------------------------ */

enum flagkind { FK_SYSTEM, FK_SEEN, FK_RECENT, FK_USER, FK_NONE };

struct node {
    const struct imapparse_search *k;
    size_t n;
    struct node *kids;
    int needs_file;         /* this node or a descendant needs the file */
    struct buf needle;      /* string keys: folded */
    enum flagkind fk;       /* flag keys */
    uint32_t sysflag;
    int bit;                /* FK_USER */
    long days;              /* date keys */
};

struct ctx {
    const struct search_params *sp;
    uint32_t max_seq, max_uid;
    int has_modseq;
    time_t now;             /* for OLDER / YOUNGER */
};

static void node_free(struct node *nd)
{
    size_t i;

    for (i = 0; i < nd->n; i++)
        node_free(&nd->kids[i]);
    free(nd->kids);
    buf_free(&nd->needle);
}

static int flag_resolve(struct ctx *c, struct node *nd)
{
    static const struct {
        const char *name;
        uint32_t bit;
    } sys[] = {
        { "\\Answered", MAILBOX_FLAG_ANSWERED },
        { "\\Flagged", MAILBOX_FLAG_FLAGGED },
        { "\\Deleted", MAILBOX_FLAG_DELETED },
        { "\\Draft", MAILBOX_FLAG_DRAFT },
    };
    const char *f = nd->k->flag;
    size_t i;
    int bit = -1, r;

    nd->fk = FK_NONE;
    if (!f)
        return STORE_INTERNAL;
    if (f[0] == '\\') {
        for (i = 0; i < sizeof(sys) / sizeof(sys[0]); i++) {
            if (strcasecmp(f, sys[i].name) == 0) {
                nd->fk = FK_SYSTEM;
                nd->sysflag = sys[i].bit;
            }
        }
        if (strcasecmp(f, "\\Seen") == 0)
            nd->fk = FK_SEEN;
        else if (strcasecmp(f, "\\Recent") == 0)
            nd->fk = FK_RECENT;
        return STORE_OK;
    }
    if (c->sp->keyword) {
        if (c->sp->keyword(c->sp->rock, f, &bit) == 0 && bit >= 0
            && bit < MAILBOX_USER_FLAGS) {
            nd->fk = FK_USER;
            nd->bit = bit;
        }
        return STORE_OK;
    }
    r = mailbox_user_flag(c->sp->mb, f, 0, &bit);
    if (r == STORE_OK && bit >= 0 && bit < MAILBOX_USER_FLAGS) {
        nd->fk = FK_USER;
        nd->bit = bit;
        return STORE_OK;
    }
    if (r == STORE_OK || r == STORE_NOTFOUND || r == STORE_BADNAME)
        return STORE_OK;
    return r;
}

static int compile(struct ctx *c, const struct imapparse_search *k,
                   struct node *nd)
{
    size_t i;
    int r;

    memset(nd, 0, sizeof(*nd));
    nd->k = k;
    if (!k)
        return STORE_INTERNAL;
    switch (k->key) {
    case IMAPPARSE_S_AND:
    case IMAPPARSE_S_OR:
    case IMAPPARSE_S_NOT:
        if ((k->key == IMAPPARSE_S_OR && k->nchildren != 2)
            || (k->key == IMAPPARSE_S_NOT && k->nchildren != 1)
            || (k->nchildren && !k->children))
            return STORE_INTERNAL;
        if (k->nchildren) {
            nd->kids = calloc(k->nchildren, sizeof(*nd->kids));
            if (!nd->kids)
                return STORE_NOMEM;
        }
        for (i = 0; i < k->nchildren; i++) {
            nd->n = i + 1;
            r = compile(c, k->children[i], &nd->kids[i]);
            if (r != STORE_OK)
                return r;
            nd->needs_file |= nd->kids[i].needs_file;
        }
        return STORE_OK;
    case IMAPPARSE_S_ALL:
    case IMAPPARSE_S_SEQSET:
    case IMAPPARSE_S_UID:
    case IMAPPARSE_S_NEW:
    case IMAPPARSE_S_OLD:
    case IMAPPARSE_S_RECENT:
    case IMAPPARSE_S_LARGER:
    case IMAPPARSE_S_SMALLER:
    case IMAPPARSE_S_OLDER:
    case IMAPPARSE_S_YOUNGER:
        return STORE_OK;
    case IMAPPARSE_S_MODSEQ:
        c->has_modseq = 1;
        return STORE_OK;
    case IMAPPARSE_S_FLAG:
    case IMAPPARSE_S_UNFLAG:
        return flag_resolve(c, nd);
    case IMAPPARSE_S_BEFORE:
    case IMAPPARSE_S_ON:
    case IMAPPARSE_S_SINCE:
        nd->days = imapparse_date_days(&k->date);
        return STORE_OK;
    case IMAPPARSE_S_SENTBEFORE:
    case IMAPPARSE_S_SENTON:
    case IMAPPARSE_S_SENTSINCE:
        nd->days = imapparse_date_days(&k->date);
        nd->needs_file = 1;
        return STORE_OK;
    case IMAPPARSE_S_HEADER:
        if (!k->field)
            return STORE_INTERNAL;
        /* fall through */
    case IMAPPARSE_S_BCC:
    case IMAPPARSE_S_CC:
    case IMAPPARSE_S_FROM:
    case IMAPPARSE_S_TO:
    case IMAPPARSE_S_SUBJECT:
    case IMAPPARSE_S_BODY:
    case IMAPPARSE_S_TEXT:
        nd->needs_file = 1;
        if (!k->str && k->str_len)
            return STORE_INTERNAL;
        if (k->str && search_fold(k->str, k->str_len, &nd->needle) < 0)
            return STORE_NOMEM;
        return STORE_OK;
    }
    return STORE_INTERNAL;
}

/* ---- one message ------------------------------------------------------ */

#define MSG_READ 65536

struct msg {
    uint32_t seq, uid;
    struct mailbox_record rec;
    int seen, recent;       /* -1 until asked */
    int have_days;
    long days;              /* internal date, local day */
    /* the file */
    int loaded;
    void *map;
    size_t maplen;
    char *rbuf;             /* MSG_READ bytes, kept from message to message:
                             * a file shorter is read, not mapped */
    const char *base;
    size_t len, hdr_len;
    int have_hdrtext, have_body, have_sent;
    int sent_ok;
    struct imapparse_date sent;
    struct buf hdrtext;     /* decoded, folded "name: value" NUL ... */
    struct buf body;        /* decoded, folded text parts NUL ... */
    struct buf tmp1, tmp2;
    size_t nparts;
};

static void msg_release(struct msg *m)
{
    if (m->map)
        munmap(m->map, m->maplen);
    m->map = NULL;
    m->maplen = 0;
    m->base = NULL;
    m->len = m->hdr_len = 0;
    m->loaded = m->have_hdrtext = m->have_body = m->have_sent = 0;
    buf_reset(&m->hdrtext);
    buf_reset(&m->body);
}

static int msg_load(struct ctx *c, struct msg *m)
{
    struct stat sb;
    int fd = -1, r;

    if (m->loaded)
        return STORE_OK;
    m->loaded = 1;
    r = mailbox_open_message(c->sp->mb, m->uid, &fd);
    if (r == STORE_NOTFOUND) {
        log_warning("search: message file missing mailbox=<%s> uid=<%u>",
                    mailbox_name(c->sp->mb), m->uid);
        return STORE_OK;
    }
    if (r != STORE_OK)
        return r;
    /* the usual message: one read (short only at the end of a regular
     * file), no fstat, mmap and munmap */
    if (!m->rbuf)
        m->rbuf = malloc(MSG_READ);
    if (m->rbuf) {
        ssize_t n;

        do
            n = pread(fd, m->rbuf, MSG_READ, 0);
        while (n < 0 && errno == EINTR);
        if (n < 0) {
            log_error("search: read failed mailbox=<%s> uid=<%u> error=<%s>",
                      mailbox_name(c->sp->mb), m->uid, strerror(errno));
            close(fd);
            return STORE_IOERROR;
        }
        if (n < MSG_READ) {
            close(fd);
            if (n > 0) {
                m->base = m->rbuf;
                m->len = (size_t)n;
                m->hdr_len = message_header_length(m->base,
                                                   m->base + m->len);
            }
            return STORE_OK;
        }
    }
    if (fstat(fd, &sb) < 0) {
        log_error("search: fstat failed mailbox=<%s> uid=<%u> error=<%s>",
                  mailbox_name(c->sp->mb), m->uid, strerror(errno));
        close(fd);
        return STORE_IOERROR;
    }
    if (sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);

        if (p == MAP_FAILED) {
            int e = errno;

            log_error("search: mmap failed mailbox=<%s> uid=<%u> error=<%s>",
                      mailbox_name(c->sp->mb), m->uid, strerror(e));
            close(fd);
            return e == ENOMEM ? STORE_NOMEM : STORE_IOERROR;
        }
        m->map = p;
        m->maplen = (size_t)sb.st_size;
        m->base = p;
        m->len = (size_t)sb.st_size;
        m->hdr_len = message_header_length(m->base, m->base + m->len);
    }
    close(fd);
    return STORE_OK;
}

/* Does a field named `name` hold the needle? (R_TRUE / R_FALSE / error) */
static int match_field(struct msg *m, const char *name, size_t nlen,
                       const struct buf *needle)
{
    const char *p = m->base, *end = m->base + m->hdr_len;
    struct hfield f;

    if (!m->base)
        return R_FALSE;
    while (header_next(&p, end, &f)) {
        if (f.nlen != nlen || strncasecmp(f.name, name, nlen) != 0)
            continue;
        if (needle->len == 0)
            return R_TRUE;
        buf_reset(&m->tmp1);
        buf_reset(&m->tmp2);
        if (search_decode_header(f.val, f.vlen, &m->tmp1) < 0
            || search_fold(m->tmp1.s, m->tmp1.len, &m->tmp2) < 0)
            return -STORE_NOMEM;
        if (contains(m->tmp2.s, m->tmp2.len, needle->s, needle->len))
            return R_TRUE;
    }
    return R_FALSE;
}

struct addr_match {
    struct msg *m;
    const struct buf *needle;
    struct buf cand, fold;
    int found;
};

/* Does the needle occur in text once decoded and folded? (1, 0, -1) */
static int addr_try(struct addr_match *am, const char *s, size_t len,
                    int decode)
{
    buf_reset(&am->cand);
    buf_reset(&am->fold);
    if (decode) {
        if (search_decode_header(s, len, &am->cand) < 0)
            return -1;
        s = am->cand.s;
        len = am->cand.len;
    }
    if (search_fold(s, len, &am->fold) < 0)
        return -1;
    return contains(am->fold.s, am->fold.len, am->needle->s,
                    am->needle->len);
}

static int addr_cb(void *rock, const char *name, size_t namelen,
                   const char *mailbox, size_t mailboxlen,
                   const char *host, size_t hostlen)
{
    struct addr_match *am = rock;
    struct buf a = BUF_INITIALIZER;
    int r;

    if (am->found)
        return 0;
    if (name && (r = addr_try(am, name, namelen, 1)) != 0) {
        am->found = r > 0;
        return r < 0;
    }
    /* mailbox@host, as it would be written without comments */
    if (buf_append(&a, mailbox, mailboxlen) < 0
        || (hostlen && (buf_putc(&a, '@') < 0
                        || buf_append(&a, host, hostlen) < 0))) {
        buf_free(&a);
        return 1;
    }
    r = addr_try(am, a.s ? a.s : "", a.len, 0);
    buf_free(&a);
    if (r > 0)
        am->found = 1;
    return r < 0;
}

/* Does an address field named `name` hold the needle, in its text or in
 * one of its parsed addresses (display name, or mailbox@host)?  RFC 3501
 * 6.4.4 defines FROM, TO, CC and BCC on the envelope's addresses, whose
 * text may differ from the field's (comments, folding, quoting). */
static int match_address_field(struct msg *m, const char *name, size_t nlen,
                               const struct buf *needle)
{
    const char *p = m->base, *end = m->base + m->hdr_len;
    struct hfield f;
    struct addr_match am;
    int r = match_field(m, name, nlen, needle);

    if (r != R_FALSE || !m->base)
        return r;
    memset(&am, 0, sizeof(am));
    am.m = m;
    am.needle = needle;
    r = R_FALSE;
    while (header_next(&p, end, &f)) {
        if (f.nlen != nlen || strncasecmp(f.name, name, nlen) != 0)
            continue;
        if (message_addresses(f.val, f.vlen, addr_cb, &am) == MESSAGE_NOMEM
            && !am.found) {
            r = -STORE_NOMEM;
            break;
        }
        if (am.found) {
            r = R_TRUE;
            break;
        }
    }
    buf_free(&am.cand);
    buf_free(&am.fold);
    return r;
}

/* Append the decoded, folded text of a header block to out, each field
 * as "name: value" followed by NUL. */
static int header_text(struct msg *m, const char *p, const char *end,
                       struct buf *out)
{
    struct hfield f;

    while (header_next(&p, end, &f)) {
        buf_reset(&m->tmp1);
        if (buf_append(&m->tmp1, f.name, f.nlen) < 0
            || buf_append(&m->tmp1, ": ", 2) < 0
            || search_decode_header(f.val, f.vlen, &m->tmp1) < 0
            || search_fold(m->tmp1.s, m->tmp1.len, out) < 0
            || buf_putc(out, '\0') < 0)
            return -1;
    }
    return 0;
}

/* ---- MIME walk for BODY / TEXT ---------------------------------------- */

struct ctype {
    const char *type, *sub, *boundary, *charset;
    size_t tlen, slen, blen, clen;
};

static int is_tspecial(int c)
{
    return c <= ' ' || c >= 0x7f || strchr("()<>@,;:\\\"/[]?=", c) != NULL;
}

static const char *token(const char *p, const char *end, size_t *len_r)
{
    const char *q = p;

    while (q < end && !is_tspecial((unsigned char)*q))
        q++;
    *len_r = (size_t)(q - p);
    return q;
}

/* Parse a Content-Type value (raw, folding allowed). */
static void ctype_parse(const char *p, const char *end, struct ctype *ct)
{
    memset(ct, 0, sizeof(*ct));
    p = skip_cfws(p, end);
    ct->type = p;
    p = token(p, end, &ct->tlen);
    p = skip_cfws(p, end);
    if (p >= end || *p != '/' || ct->tlen == 0) {
        ct->tlen = 0;
        return;
    }
    p = skip_cfws(p + 1, end);
    ct->sub = p;
    p = token(p, end, &ct->slen);
    if (ct->slen == 0) {
        ct->tlen = 0;
        return;
    }
    for (;;) {
        const char *name, *val;
        size_t nlen, vlen;

        p = skip_cfws(p, end);
        if (p >= end || *p != ';')
            return;
        p = skip_cfws(p + 1, end);
        name = p;
        p = token(p, end, &nlen);
        p = skip_cfws(p, end);
        if (nlen == 0 || p >= end || *p != '=')
            return;
        p = skip_cfws(p + 1, end);
        if (p < end && *p == '"') {
            /* quoted string; backslash escapes left in (rare in
             * boundaries and charsets) */
            val = ++p;
            while (p < end && *p != '"') {
                if (*p == '\\' && p + 1 < end)
                    p++;
                p++;
            }
            vlen = (size_t)(p - val);
            if (p < end)
                p++;
        } else {
            val = p;
            p = token(p, end, &vlen);
        }
        if (name_is(name, nlen, "boundary")) {
            ct->boundary = val;
            ct->blen = vlen;
        } else if (name_is(name, nlen, "charset")) {
            ct->charset = val;
            ct->clen = vlen;
        }
    }
}

static int walk_part(struct msg *m, const char *p, const char *end,
                     int depth, int digest);

/* Each body part of a multipart body [p, end) with boundary b. */
static int walk_multipart(struct msg *m, const char *p, const char *end,
                          const char *b, size_t blen, int depth, int digest)
{
    const char *part = NULL, *line = p;

    while (line < end) {
        const char *next = message_line_next(line, end);

        if (end - line >= (ptrdiff_t)(2 + blen) && line[0] == '-'
            && line[1] == '-' && memcmp(line + 2, b, blen) == 0) {
            const char *after = line + 2 + blen;
            int close = end - after >= 2 && after[0] == '-' && after[1] == '-';

            if (close)
                after += 2;
            while (after < end && (*after == ' ' || *after == '\t'))
                after++;
            if (after == end || *after == '\r' || *after == '\n') {
                if (part) {
                    /* the line break before the delimiter belongs to it */
                    const char *pend = line;

                    if (pend > part && pend[-1] == '\n')
                        pend--;
                    if (pend > part && pend[-1] == '\r')
                        pend--;
                    if (pend < part)
                        pend = part;
                    if (walk_part(m, part, pend, depth + 1, digest) < 0)
                        return -1;
                }
                if (close)
                    return 0;
                part = next;
            }
        }
        line = next;
    }
    if (part && part < end)
        return walk_part(m, part, end, depth + 1, digest);
    return 0;
}

/* Append the searchable text of the MIME entity [p, end) to m->body. */
static int walk_part(struct msg *m, const char *p, const char *end,
                     int depth, int digest)
{
    size_t hlen = message_header_length(p, end);
    const char *body = p + hlen;
    const char *hp = p;
    struct hfield f;
    struct ctype ct;
    const char *cte = NULL;
    size_t ctelen = 0;
    int have_ct = 0;
    enum cs cs;

    if (depth > SEARCH_MAX_DEPTH || ++m->nparts > SEARCH_MAX_PARTS)
        return 0;
    memset(&ct, 0, sizeof(ct));
    while (header_next(&hp, p + hlen, &f)) {
        if (!have_ct && name_is(f.name, f.nlen, "content-type")) {
            ctype_parse(f.val, f.val + f.vlen, &ct);
            have_ct = ct.tlen > 0;
        } else if (!cte && name_is(f.name, f.nlen,
                                   "content-transfer-encoding")) {
            const char *q = skip_cfws(f.val, f.val + f.vlen);

            cte = q;
            token(q, f.val + f.vlen, &ctelen);
        }
    }
    if (!have_ct) {
        ct.type = digest ? "message" : "text";
        ct.tlen = strlen(ct.type);
        ct.sub = digest ? "rfc822" : "plain";
        ct.slen = strlen(ct.sub);
    }
    if (name_is(ct.type, ct.tlen, "multipart")) {
        if (ct.boundary && ct.blen > 0 && ct.blen <= 200)
            return walk_multipart(m, body, end, ct.boundary, ct.blen, depth,
                                  name_is(ct.sub, ct.slen, "digest"));
        /* no boundary: taken as text/plain */
        ct.type = "text";
        ct.tlen = 4;
    }
    if (name_is(ct.type, ct.tlen, "message")
        && name_is(ct.sub, ct.slen, "rfc822")) {
        const char *inner = body;
        size_t ih = message_header_length(inner, end);

        if (header_text(m, inner, inner + ih, &m->body) < 0)
            return -1;
        return walk_part(m, inner, end, depth + 1, 0) < 0 ? -1 : 0;
    }
    if (!name_is(ct.type, ct.tlen, "text"))
        return 0;
    buf_reset(&m->tmp1);
    if (cte && name_is(cte, ctelen, "base64")) {
        if (message_decode_base64(body, (size_t)(end - body), &m->tmp1) < 0)
            return -1;
    } else if (cte && name_is(cte, ctelen, "quoted-printable")) {
        if (message_decode_qp(body, (size_t)(end - body), &m->tmp1) < 0)
            return -1;
    } else if (buf_append(&m->tmp1, body, (size_t)(end - body)) < 0) {
        return -1;
    }
    cs = ct.charset ? charset_kind(ct.charset, ct.clen) : CS_UTF8;
    buf_reset(&m->tmp2);
    if (charset_append(cs, m->tmp1.s, m->tmp1.len, &m->tmp2) < 0
        || search_fold(m->tmp2.s, m->tmp2.len, &m->body) < 0
        || buf_putc(&m->body, '\0') < 0)
        return -1;
    return 0;
}

static int msg_body(struct msg *m)
{
    if (m->have_body)
        return STORE_OK;
    m->have_body = 1;
    buf_reset(&m->body);
    m->nparts = 0;
    if (!m->base)
        return STORE_OK;
    if (walk_part(m, m->base, m->base + m->len, 0, 0) < 0)
        return STORE_NOMEM;
    return STORE_OK;
}

static int msg_hdrtext(struct msg *m)
{
    if (m->have_hdrtext)
        return STORE_OK;
    m->have_hdrtext = 1;
    buf_reset(&m->hdrtext);
    if (!m->base)
        return STORE_OK;
    if (header_text(m, m->base, m->base + m->hdr_len, &m->hdrtext) < 0)
        return STORE_NOMEM;
    return STORE_OK;
}

static void msg_sent(struct msg *m)
{
    const char *p = m->base, *end = m->base + m->hdr_len;
    struct hfield f;

    if (m->have_sent)
        return;
    m->have_sent = 1;
    m->sent_ok = 0;
    if (!m->base)
        return;
    while (header_next(&p, end, &f)) {
        if (name_is(f.name, f.nlen, "date")) {
            m->sent_ok = search_parse_date(f.val, f.vlen, &m->sent) == 0;
            return;     /* the first Date: field counts */
        }
    }
}

/* ---- evaluation ----------------------------------------------------- */

static int msg_seen(struct ctx *c, struct msg *m)
{
    if (m->seen < 0)
        m->seen = c->sp->seen ? (c->sp->seen(c->sp->rock, m->uid) != 0)
                              : ((m->rec.flags & MAILBOX_FLAG_SEEN) != 0);
    return m->seen;
}

static int msg_recent(struct ctx *c, struct msg *m)
{
    if (m->recent < 0)
        m->recent = c->sp->recent ? (c->sp->recent(c->sp->rock, m->uid) != 0)
                                  : 0;
    return m->recent;
}

static long msg_days(struct msg *m)
{
    if (!m->have_days) {
        time_t t = (time_t)m->rec.internaldate;
        struct tm tm;
        struct imapparse_date d;

        memset(&tm, 0, sizeof(tm));
        if (!localtime_r(&t, &tm)) {
            m->days = (long)(m->rec.internaldate / 86400);
        } else {
            d.year = tm.tm_year + 1900;
            d.mon = tm.tm_mon + 1;
            d.mday = tm.tm_mday;
            m->days = imapparse_date_days(&d);
        }
        m->have_days = 1;
    }
    return m->days;
}

static int has_flag(struct ctx *c, struct msg *m, const struct node *nd)
{
    switch (nd->fk) {
    case FK_SYSTEM:
        return (m->rec.flags & nd->sysflag) != 0;
    case FK_SEEN:
        return msg_seen(c, m);
    case FK_RECENT:
        return msg_recent(c, m);
    case FK_USER:
        return (m->rec.user_flags[nd->bit / 32] >> (nd->bit % 32)) & 1;
    case FK_NONE:
        break;
    }
    return 0;
}

static const char *string_field(enum imapparse_skey key)
{
    switch (key) {
    case IMAPPARSE_S_BCC: return "bcc";
    case IMAPPARSE_S_CC: return "cc";
    case IMAPPARSE_S_FROM: return "from";
    case IMAPPARSE_S_TO: return "to";
    case IMAPPARSE_S_SUBJECT: return "subject";
    default: return NULL;
    }
}

/* Is uid in the saved result ("$", ascending)? */
static int saved_contains(const struct search_params *sp, uint32_t uid)
{
    size_t lo = 0, hi = sp->nsaved;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;

        if (sp->saved[mid] == uid)
            return 1;
        if (sp->saved[mid] < uid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/* R_FALSE, R_TRUE, R_UNKNOWN (file keys when !file), or -STORE_x. */
static int eval(struct ctx *c, struct msg *m, const struct node *nd, int file)
{
    const struct imapparse_search *k = nd->k;
    size_t i;
    int r, unknown;

    if (nd->needs_file && !file && k->key != IMAPPARSE_S_AND
        && k->key != IMAPPARSE_S_OR && k->key != IMAPPARSE_S_NOT)
        return R_UNKNOWN;
    switch (k->key) {
    case IMAPPARSE_S_AND:
        unknown = 0;
        for (i = 0; i < nd->n; i++) {
            r = eval(c, m, &nd->kids[i], file);
            if (r < 0 || r == R_FALSE)
                return r;
            if (r == R_UNKNOWN)
                unknown = 1;
        }
        return unknown ? R_UNKNOWN : R_TRUE;
    case IMAPPARSE_S_OR:
        unknown = 0;
        for (i = 0; i < nd->n; i++) {
            r = eval(c, m, &nd->kids[i], file);
            if (r < 0 || r == R_TRUE)
                return r;
            if (r == R_UNKNOWN)
                unknown = 1;
        }
        return unknown ? R_UNKNOWN : R_FALSE;
    case IMAPPARSE_S_NOT:
        r = eval(c, m, &nd->kids[0], file);
        if (r == R_TRUE)
            return R_FALSE;
        if (r == R_FALSE)
            return R_TRUE;
        return r;
    case IMAPPARSE_S_ALL:
        return R_TRUE;
    case IMAPPARSE_S_SEQSET:
        if (k->set.saved)
            return saved_contains(c->sp, m->uid);
        return imapparse_seqset_contains(&k->set, m->seq, c->max_seq);
    case IMAPPARSE_S_UID:
        if (k->set.saved)
            return saved_contains(c->sp, m->uid);
        return imapparse_seqset_contains(&k->set, m->uid, c->max_uid);
    case IMAPPARSE_S_OLDER:
        /* at least that many seconds old; YOUNGER is its complement */
        return (int64_t)m->rec.internaldate
               <= (int64_t)c->now - (int64_t)k->number;
    case IMAPPARSE_S_YOUNGER:
        return (int64_t)m->rec.internaldate
               > (int64_t)c->now - (int64_t)k->number;
    case IMAPPARSE_S_FLAG:
        return has_flag(c, m, nd);
    case IMAPPARSE_S_UNFLAG:
        return !has_flag(c, m, nd);
    case IMAPPARSE_S_NEW:
        return msg_recent(c, m) && !msg_seen(c, m);
    case IMAPPARSE_S_OLD:
        return !msg_recent(c, m);
    case IMAPPARSE_S_RECENT:
        return msg_recent(c, m);
    case IMAPPARSE_S_BEFORE:
        return msg_days(m) < nd->days;
    case IMAPPARSE_S_ON:
        return msg_days(m) == nd->days;
    case IMAPPARSE_S_SINCE:
        return msg_days(m) >= nd->days;
    case IMAPPARSE_S_LARGER:
        return (uint64_t)m->rec.size > k->number;
    case IMAPPARSE_S_SMALLER:
        return (uint64_t)m->rec.size < k->number;
    case IMAPPARSE_S_MODSEQ:
        return m->rec.modseq >= k->number;
    case IMAPPARSE_S_SENTBEFORE:
    case IMAPPARSE_S_SENTON:
    case IMAPPARSE_S_SENTSINCE: {
        long d;

        if ((r = msg_load(c, m)) != STORE_OK)
            return -r;
        msg_sent(m);
        if (!m->sent_ok)
            return R_FALSE;
        d = imapparse_date_days(&m->sent);
        if (k->key == IMAPPARSE_S_SENTBEFORE)
            return d < nd->days;
        if (k->key == IMAPPARSE_S_SENTON)
            return d == nd->days;
        return d >= nd->days;
    }
    case IMAPPARSE_S_BCC:
    case IMAPPARSE_S_CC:
    case IMAPPARSE_S_FROM:
    case IMAPPARSE_S_TO:
    case IMAPPARSE_S_SUBJECT: {
        const char *name = string_field(k->key);

        if ((r = msg_load(c, m)) != STORE_OK)
            return -r;
        if (k->key == IMAPPARSE_S_SUBJECT)
            return match_field(m, name, strlen(name), &nd->needle);
        return match_address_field(m, name, strlen(name), &nd->needle);
    }
    case IMAPPARSE_S_HEADER:
        if ((r = msg_load(c, m)) != STORE_OK)
            return -r;
        return match_field(m, k->field, strlen(k->field), &nd->needle);
    case IMAPPARSE_S_TEXT:
        if ((r = msg_load(c, m)) != STORE_OK)
            return -r;
        if (nd->needle.len == 0)
            return R_TRUE;
        if ((r = msg_hdrtext(m)) != STORE_OK)
            return -r;
        if (contains(m->hdrtext.s, m->hdrtext.len, nd->needle.s,
                     nd->needle.len))
            return R_TRUE;
        /* fall through to the body */
    /* FALLTHROUGH */
    case IMAPPARSE_S_BODY:
        if ((r = msg_load(c, m)) != STORE_OK)
            return -r;
        if (nd->needle.len == 0)
            return R_TRUE;
        if ((r = msg_body(m)) != STORE_OK)
            return -r;
        return contains(m->body.s, m->body.len, nd->needle.s,
                        nd->needle.len);
    }
    return -STORE_INTERNAL;
}

/* ---- the driver ------------------------------------------------------- */

static int result_add(struct search_result *res, size_t *alloc, uint32_t num)
{
    if (res->n == *alloc) {
        size_t na = *alloc ? *alloc * 2 : 64;
        uint32_t *n = realloc(res->nums, na * sizeof(*n));

        if (!n)
            return STORE_NOMEM;
        res->nums = n;
        *alloc = na;
    }
    res->nums[res->n++] = num;
    return STORE_OK;
}

/* The record of a view entry: STORE_OK (present), STORE_NOTFOUND (gone
 * or expunged), or an error. */
static int view_record(struct mailbox *mb, uint32_t uid,
                       struct mailbox_record *rec)
{
    uint32_t recno;
    int r;

    r = mailbox_find_uid(mb, uid, &recno);
    if (r != STORE_OK)
        return r;
    r = mailbox_read_record(mb, recno, rec);
    if (r != STORE_OK)
        return r;
    if (rec->uid != uid
        || (rec->flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED)))
        return STORE_NOTFOUND;
    return STORE_OK;
}

int search_run(const struct search_params *sp,
               const struct imapparse_search *key,
               struct search_result *res_r)
{
    struct ctx c;
    struct node root;
    struct msg m;
    uint32_t *own = NULL, *own_recno = NULL;
    const uint32_t *uids;
    uint32_t n = 0, i;
    size_t alloc = 0;
    int r;

    if (!res_r)
        return STORE_INTERNAL;
    memset(res_r, 0, sizeof(*res_r));
    if (!sp || !sp->mb || !key)
        return STORE_INTERNAL;
    memset(&c, 0, sizeof(c));
    memset(&m, 0, sizeof(m));
    memset(&root, 0, sizeof(root));
    c.sp = sp;
    c.now = sp->now ? sp->now : time(NULL);

    /* the view */
    if (sp->uids) {
        uids = sp->uids;
        n = sp->nmsgs;
    } else {
        const struct mailbox_header *h = mailbox_get_header(sp->mb);
        uint32_t visible = h ? h->visible : 0;

        if (visible) {
            own = malloc((size_t)visible * sizeof(*own));
            own_recno = malloc((size_t)visible * sizeof(*own_recno));
            if (!own || !own_recno) {
                free(own);
                free(own_recno);
                return STORE_NOMEM;
            }
        }
        for (i = 0; i < visible; i++) {
            r = mailbox_read_record(sp->mb, i, &m.rec);
            if (r != STORE_OK) {
                free(own);
                free(own_recno);
                return r;
            }
            if (m.rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
                continue;
            own_recno[n] = i;
            own[n++] = m.rec.uid;
        }
        uids = own;
    }
    c.max_seq = n;
    c.max_uid = n ? uids[n - 1] : 0;

    r = compile(&c, key, &root);
    if (r != STORE_OK)
        goto out;
    res_r->has_modseq = c.has_modseq;

    for (i = 0; i < n; i++) {
        int v;

        msg_release(&m);
        m.seq = i + 1;
        m.uid = uids[i];
        m.seen = m.recent = -1;
        m.have_days = 0;
        if (own_recno)
            r = mailbox_read_record(sp->mb, own_recno[i], &m.rec);
        else
            r = view_record(sp->mb, m.uid, &m.rec);
        if (r == STORE_NOTFOUND)
            continue;
        if (r != STORE_OK)
            goto out;
        v = eval(&c, &m, &root, 0);
        if (v == R_UNKNOWN)
            v = eval(&c, &m, &root, 1);
        if (v < 0) {
            r = -v;
            goto out;
        }
        if (v == R_TRUE) {
            r = result_add(res_r, &alloc, sp->return_uids ? m.uid : m.seq);
            if (r != STORE_OK)
                goto out;
            if (m.rec.modseq > res_r->highest_modseq)
                res_r->highest_modseq = m.rec.modseq;
        }
    }
    r = STORE_OK;

out:
    msg_release(&m);
    free(m.rbuf);
    buf_free(&m.hdrtext);
    buf_free(&m.body);
    buf_free(&m.tmp1);
    buf_free(&m.tmp2);
    node_free(&root);
    free(own);
    free(own_recno);
    if (r != STORE_OK)
        search_result_free(res_r);
    return r;
}

void search_result_free(struct search_result *res)
{
    if (!res)
        return;
    free(res->nums);
    memset(res, 0, sizeof(*res));
}

int search_seen_set(void *rock, uint32_t uid)
{
    return rock ? seen_set_contains((const char *)rock, uid) : 0;
}

void search_set_text(struct buf *out, const uint32_t *nums, size_t n)
{
    size_t i = 0;

    while (i < n) {
        size_t j = i;

        while (j + 1 < n && nums[j + 1] == nums[j] + 1)
            j++;
        if (i > 0)
            buf_putc(out, ',');
        if (j > i)
            buf_printf(out, "%u:%u", (unsigned)nums[i], (unsigned)nums[j]);
        else
            buf_printf(out, "%u", (unsigned)nums[i]);
        i = j + 1;
    }
}

void search_partial_slice(size_t n, uint32_t lo, uint32_t hi,
                          size_t *first_r, size_t *count_r)
{
    *first_r = 0;
    *count_r = 0;
    if (lo == 0 || lo > hi || lo > n)
        return;
    *first_r = lo - 1;
    *count_r = (hi < n ? hi : n) - (lo - 1);
}

void search_esearch(struct buf *out, const char *tag, int uid, unsigned ret,
                    const uint32_t *nums, size_t n, int has_modseq,
                    uint64_t modseq, uint32_t partial_lo,
                    uint32_t partial_hi)
{
    buf_appendcstr(out, "* ESEARCH");
    if (tag)
        buf_printf(out, " (TAG \"%s\")", tag);
    if (uid)
        buf_appendcstr(out, " UID");
    /* the first and the last of the result: in a SORT result those of
     * the sort order (ESORT) */
    if (n > 0 && (ret & IMAPPARSE_RET_MIN))
        buf_printf(out, " MIN %u", (unsigned)nums[0]);
    if (n > 0 && (ret & IMAPPARSE_RET_MAX))
        buf_printf(out, " MAX %u", (unsigned)nums[n - 1]);
    if (n > 0 && (ret & IMAPPARSE_RET_ALL)) {
        buf_appendcstr(out, " ALL ");
        search_set_text(out, nums, n);
    }
    if (ret & IMAPPARSE_RET_PARTIAL) {
        size_t first, count;

        /* positions partial_lo..partial_hi (from 1) of the result */
        search_partial_slice(n, partial_lo, partial_hi, &first, &count);
        buf_printf(out, " PARTIAL (%u:%u ", (unsigned)partial_lo,
                   (unsigned)partial_hi);
        if (count > 0)
            search_set_text(out, nums + first, count);
        else
            buf_appendcstr(out, "NIL");
        buf_putc(out, ')');
    }
    if (ret & IMAPPARSE_RET_COUNT)
        buf_printf(out, " COUNT %lu", (unsigned long)n);
    if (has_modseq && n > 0)
        buf_printf(out, " MODSEQ %llu", (unsigned long long)modseq);
    buf_appendcstr(out, "\r\n");
}
