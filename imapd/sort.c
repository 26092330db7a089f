/*
 * sort.c - SORT and THREAD over a search result (the contract is in
 * sort.h).
 *
 * Flow: search_run() picks the messages (as message numbers); for each
 * one a struct sort_msg is filled with only what the criteria need (the
 * index record for ARRIVAL/SIZE, the header read with one pread() for
 * the rest); then qsort() with the criteria, or the threading.
 *
 * Threading keeps containers in one array, linked by index (parent,
 * first child, next sibling), and Message-IDs in a small hash table.
 * Recursion over threads is bounded: a container deeper than
 * SORT_MAX_DEPTH is cut loose as a root before anything recurses.
 *
 * Invariants: header bytes are scanned with (pointer, end) cursors; every
 * string is a struct buf or a malloc'd copy owned by its sort_msg.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "imapd/search.h"
#include "imapd/sort.h"
#include "lib/buf.h"
#include "store/mailbox.h"
#include "store/message.h"
#include "store/store.h"

#define SORT_MAX_HEADER (1024 * 1024)   /* header bytes read per message */
#define SORT_MAX_REFS 64                /* references kept per message */
#define SORT_MAX_DEPTH 1000             /* thread depth */

/* what the criteria need */
#define NEED_HEADER   0x01
#define NEED_DATE     0x02
#define NEED_SUBJECT  0x04
#define NEED_ADDR     0x08
#define NEED_REFS     0x10

struct sort_msg {
    uint32_t seq, uid;
    int64_t arrival;
    uint32_t size;
    int64_t sent;
    char *subject;          /* base subject, casemapped */
    int is_reply;
    char *from, *to, *cc;   /* addr-mailbox, casemapped */
    char *dfrom, *dto;      /* display names, casemapped */
    char *msgid;            /* "<...>" or NULL */
    char **refs;
    size_t nrefs;
};

static void sort_msg_free(struct sort_msg *m)
{
    free(m->subject);
    free(m->from);
    free(m->to);
    free(m->cc);
    free(m->dfrom);
    free(m->dto);
    free(m->msgid);
    for (size_t i = 0; i < m->nrefs; i++)
        free(m->refs[i]);
    free(m->refs);
}

/* ---- header fields --------------------------------------------------- */

static int is_wsp(int c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The value of the first field `name` in the header [p, end): *v_r and
 * *vlen_r (folding kept), 1; or 0 when absent. */
static int header_field(const char *p, const char *end, const char *name,
                        const char **v_r, size_t *vlen_r)
{
    size_t nlen = strlen(name);

    while (p < end) {
        const char *line = p, *colon, *v, *e;

        if (*p == '\r' || *p == '\n')
            return 0;                       /* the empty line */
        p = message_line_next(p, end);
        while (p < end && (*p == ' ' || *p == '\t'))
            p = message_line_next(p, end);  /* continuation lines */
        colon = memchr(line, ':', (size_t)(p - line));
        if (!colon || (size_t)(colon - line) != nlen
            || strncasecmp(line, name, nlen) != 0)
            continue;
        v = colon + 1;
        e = p;
        while (v < e && is_wsp((unsigned char)*v))
            v++;
        while (e > v && is_wsp((unsigned char)e[-1]))
            e--;
        *v_r = v;
        *vlen_r = (size_t)(e - v);
        return 1;
    }
    return 0;
}

/* ASCII upper case in place (i;ascii-casemap). */
static void casemap(char *s)
{
    for (; *s; s++)
        if (*s >= 'a' && *s <= 'z')
            *s = (char)(*s - 'a' + 'A');
}

static char *dup_casemapped(const char *s, size_t len)
{
    char *d = malloc(len + 1);

    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    casemap(d);
    return d;
}

/* ---- base subject (RFC 5256 section 2.1) ----------------------------- */

/* subj-blob = "[" *BLOBCHAR "]" *WSP at s[i]: its length, or 0. */
static size_t subj_blob(const char *s, size_t len, size_t i)
{
    size_t j;

    if (i >= len || s[i] != '[')
        return 0;
    for (j = i + 1; j < len && s[j] != '[' && s[j] != ']'; j++)
        ;
    if (j >= len || s[j] != ']')
        return 0;
    j++;
    while (j < len && s[j] == ' ')
        j++;
    return j - i;
}

/* subj-leader's subj-refwd after any blobs, at the start: its length, or
 * 0.  ("re" / "fw" / "fwd") *WSP [subj-blob] ":" */
static size_t subj_refwd_leader(const char *s, size_t len)
{
    size_t i = 0, b;

    while ((b = subj_blob(s, len, i)) > 0)
        i += b;
    if (i + 2 <= len && strncasecmp(s + i, "re", 2) == 0)
        i += 2;
    else if (i + 3 <= len && strncasecmp(s + i, "fwd", 3) == 0)
        i += 3;
    else if (i + 2 <= len && strncasecmp(s + i, "fw", 2) == 0)
        i += 2;
    else
        return 0;
    while (i < len && s[i] == ' ')
        i++;
    i += subj_blob(s, len, i);
    if (i < len && s[i] == ':')
        return i + 1;
    return 0;
}

int sort_base_subject(const char *raw, size_t rawlen, struct buf *out,
                      int *is_reply_r)
{
    struct buf dec = BUF_INITIALIZER;
    const char *s;
    size_t start = 0, len, i;
    int reply = 0, changed;

    buf_reset(out);
    if (search_decode_header(raw, rawlen, &dec) < 0) {
        buf_free(&dec);
        return -1;
    }
    /* (1) whitespace runs become one space */
    for (i = 0; i < dec.len; i++) {
        unsigned char c = (unsigned char)dec.s[i];

        if (is_wsp(c)) {
            if (out->len && out->s[out->len - 1] != ' '
                && buf_putc(out, ' ') < 0)
                goto nomem;
        } else if (buf_putc(out, c) < 0) {
            goto nomem;
        }
    }
    buf_free(&dec);
    s = out->s ? out->s : "";
    len = out->len;
    do {
        changed = 0;
        /* (2) trailers: "(fwd)" and whitespace */
        for (;;) {
            if (len > start && s[len - 1] == ' ') {
                len--;
            } else if (len - start >= 5
                       && strncasecmp(s + len - 5, "(fwd)", 5) == 0) {
                len -= 5;
                reply = 1;
            } else {
                break;
            }
        }
        /* (3) leaders and (4) a blob, repeated */
        for (;;) {
            size_t n;

            if (start < len && s[start] == ' ') {
                start++;
                continue;
            }
            n = subj_refwd_leader(s + start, len - start);
            if (n) {
                start += n;
                reply = 1;
                continue;
            }
            n = subj_blob(s, len, start);
            if (n && start + n < len) {
                start += n;
                continue;
            }
            break;
        }
        /* (6) "[fwd:" ... "]" */
        if (len - start >= 6 && strncasecmp(s + start, "[fwd:", 5) == 0
            && s[len - 1] == ']') {
            start += 5;
            len--;
            reply = 1;
            changed = 1;
        }
    } while (changed);
    if (start > 0)
        memmove(out->s, out->s + start, len - start);
    buf_truncate(out, len - start);
    if (is_reply_r)
        *is_reply_r = reply;
    return 0;
nomem:
    buf_free(&dec);
    return -1;
}

/* ---- dates ----------------------------------------------------------- */

static const char *skip_cfws(const char *p, const char *end)
{
    int depth = 0;

    while (p < end) {
        if (*p == '(') {
            depth++;
        } else if (*p == ')' && depth) {
            depth--;
        } else if (!depth && !is_wsp((unsigned char)*p)) {
            break;
        }
        p++;
    }
    return p;
}

static int read_num(const char **pp, const char *end, int maxdigits,
                    int *n_r)
{
    const char *p = *pp;
    int n = 0, d = 0;

    while (p < end && *p >= '0' && *p <= '9' && d < maxdigits) {
        n = n * 10 + (*p - '0');
        p++;
        d++;
    }
    if (d == 0)
        return -1;
    *pp = p;
    *n_r = n;
    return d;
}

int sort_parse_datetime(const char *s, size_t len, int64_t *t_r)
{
    static const char months[] = "janfebmaraprmayjunjulaugsepoctnovdec";
    static const struct {
        const char *name;
        int minutes;
    } zones[] = {
        { "UT", 0 }, { "GMT", 0 }, { "Z", 0 }, { "EST", -300 },
        { "EDT", -240 }, { "CST", -360 }, { "CDT", -300 }, { "MST", -420 },
        { "MDT", -360 }, { "PST", -480 }, { "PDT", -420 },
    };
    const char *p = s, *end = s + len;
    struct imapparse_date d;
    int day, year, hh, mm, ss = 0, digits, zone = 0;
    size_t i;

    p = skip_cfws(p, end);
    /* [day-of-week ","] */
    if (p < end && ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z'))) {
        while (p < end && *p != ',')
            p++;
        if (p >= end)
            return -1;
        p++;
        p = skip_cfws(p, end);
    }
    if (read_num(&p, end, 2, &day) < 0)
        return -1;
    p = skip_cfws(p, end);
    if (end - p < 3)
        return -1;
    for (i = 0; i < 12; i++)
        if (strncasecmp(p, months + 3 * i, 3) == 0)
            break;
    if (i == 12)
        return -1;
    d.mon = (int)i + 1;
    p += 3;
    p = skip_cfws(p, end);
    digits = read_num(&p, end, 4, &year);
    if (digits < 0)
        return -1;
    if (digits == 2)
        year += year < 50 ? 2000 : 1900;
    else if (digits == 3)
        year += 1900;
    p = skip_cfws(p, end);
    if (read_num(&p, end, 2, &hh) < 0 || p >= end || *p != ':')
        return -1;
    p++;
    if (read_num(&p, end, 2, &mm) < 0)
        return -1;
    if (p < end && *p == ':') {
        p++;
        if (read_num(&p, end, 2, &ss) < 0)
            return -1;
    }
    p = skip_cfws(p, end);
    if (p < end && (*p == '+' || *p == '-')) {
        int sign = *p == '-' ? -1 : 1, z;

        p++;
        if (read_num(&p, end, 4, &z) != 4)
            return -1;
        zone = sign * ((z / 100) * 60 + z % 100);
    } else if (p < end) {
        for (i = 0; i < sizeof(zones) / sizeof(zones[0]); i++) {
            size_t zl = strlen(zones[i].name);

            if ((size_t)(end - p) >= zl
                && strncasecmp(p, zones[i].name, zl) == 0) {
                zone = zones[i].minutes;
                break;
            }
        }
        /* other (military, unknown) zones count as UTC (RFC 5322 4.3) */
    }
    if (day < 1 || day > 31 || year < 1 || year > 9999 || hh > 23
        || mm > 59 || ss > 60)
        return -1;
    d.year = year;
    d.mday = day;
    *t_r = (int64_t)imapparse_date_days(&d) * 86400 + hh * 3600 + mm * 60
           + ss - (int64_t)zone * 60;
    return 0;
}

/* ---- addresses ------------------------------------------------------- */

struct first_addr {
    int found;
    struct buf name, mailbox, host;
};

static int first_addr_cb(void *rock, const char *name, size_t namelen,
                         const char *mailbox, size_t mailboxlen,
                         const char *host, size_t hostlen)
{
    struct first_addr *fa = rock;

    fa->found = 1;
    if (name)
        buf_append(&fa->name, name, namelen);
    buf_append(&fa->mailbox, mailbox, mailboxlen);
    buf_append(&fa->host, host, hostlen);
    return 1;               /* the first one is enough */
}

/* mailbox_r: the first address's local part; display_r (may be NULL):
 * its decoded display name or "local@host".  Both casemapped. */
static int addr_keys(const char *v, size_t vlen, char **mailbox_r,
                     char **display_r)
{
    struct first_addr fa;
    struct buf disp = BUF_INITIALIZER;
    int r = 0;

    memset(&fa, 0, sizeof(fa));
    if (v)
        (void)message_addresses(v, vlen, first_addr_cb, &fa);
    *mailbox_r = dup_casemapped(fa.mailbox.s ? fa.mailbox.s : "",
                                fa.mailbox.len);
    if (!*mailbox_r)
        r = -1;
    if (display_r) {
        if (fa.name.len) {
            if (search_decode_header(fa.name.s, fa.name.len, &disp) < 0)
                r = -1;
        }
        if (disp.len == 0 && fa.found) {
            buf_append(&disp, fa.mailbox.s ? fa.mailbox.s : "",
                       fa.mailbox.len);
            if (fa.host.len) {
                buf_putc(&disp, '@');
                buf_append(&disp, fa.host.s, fa.host.len);
            }
        }
        *display_r = dup_casemapped(disp.s ? disp.s : "", disp.len);
        if (!*display_r)
            r = -1;
    }
    buf_free(&fa.name);
    buf_free(&fa.mailbox);
    buf_free(&fa.host);
    buf_free(&disp);
    return r;
}

/* ---- message ids ----------------------------------------------------- */

/* The next "<...>" of [*pp, end): a malloc'd copy, NULL when none (or
 * out of memory: *nomem_r set). */
static char *next_msgid(const char **pp, const char *end, int *nomem_r)
{
    const char *p = *pp, *lt, *gt;
    char *id;
    size_t n = 0;

    lt = memchr(p, '<', (size_t)(end - p));
    if (!lt) {
        *pp = end;
        return NULL;
    }
    gt = memchr(lt, '>', (size_t)(end - lt));
    if (!gt) {
        *pp = end;
        return NULL;
    }
    *pp = gt + 1;
    id = malloc((size_t)(gt - lt) + 2);
    if (!id) {
        *nomem_r = 1;
        return NULL;
    }
    for (p = lt; p <= gt; p++)
        if (!is_wsp((unsigned char)*p))
            id[n++] = *p;       /* folding inside an id is not part of it */
    id[n] = '\0';
    return id;
}

static int refs_collect(struct sort_msg *m, const char *v, size_t vlen)
{
    const char *p = v, *end = v + vlen;
    int nomem = 0;

    while (p < end) {
        char *id = next_msgid(&p, end, &nomem);

        if (!id)
            break;
        if (m->nrefs == SORT_MAX_REFS) {
            /* keep the last ones: the parent is the last */
            free(m->refs[0]);
            memmove(m->refs, m->refs + 1,
                    (SORT_MAX_REFS - 1) * sizeof(*m->refs));
            m->nrefs--;
        }
        if (!m->refs) {
            m->refs = calloc(SORT_MAX_REFS, sizeof(*m->refs));
            if (!m->refs) {
                free(id);
                return -1;
            }
        }
        m->refs[m->nrefs++] = id;
    }
    return nomem ? -1 : 0;
}

/* ---- loading --------------------------------------------------------- */

/* The header of a message (its first header_size bytes, bounded) into
 * hdr: STORE_OK (empty when the file is missing) or STORE_IOERROR. */
static int read_header(struct mailbox *mb, const struct mailbox_record *rec,
                       struct buf *hdr)
{
    size_t want = rec->header_size, got = 0;
    int fd, r;

    buf_reset(hdr);
    if (want > SORT_MAX_HEADER)
        want = SORT_MAX_HEADER;
    r = mailbox_open_message(mb, rec->uid, &fd);
    if (r == STORE_NOTFOUND)
        return STORE_OK;
    if (r != STORE_OK)
        return r;
    if (buf_ensure(hdr, want + 1) < 0) {
        close(fd);
        return STORE_NOMEM;
    }
    while (got < want) {
        ssize_t n = pread(fd, hdr->s + got, want - got, (off_t)got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            close(fd);
            return STORE_IOERROR;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    hdr->len = got;
    return STORE_OK;
}

static int load_msg(const struct search_params *sp, struct sort_msg *m,
                    int need, struct buf *hdr, struct buf *tmp)
{
    struct mailbox_record rec;
    uint32_t recno;
    const char *v, *end;
    size_t vlen;
    int r;

    r = mailbox_find_uid(sp->mb, m->uid, &recno);
    if (r == STORE_OK)
        r = mailbox_read_record(sp->mb, recno, &rec);
    if (r == STORE_NOTFOUND) {
        memset(&rec, 0, sizeof(rec));
        rec.uid = m->uid;
    } else if (r != STORE_OK) {
        return r;
    }
    m->arrival = rec.internaldate;
    m->size = rec.size;
    m->sent = m->arrival;
    if (!(need & NEED_HEADER))
        return STORE_OK;
    if (r == STORE_OK) {
        r = read_header(sp->mb, &rec, hdr);
        if (r != STORE_OK)
            return r;
    } else {
        buf_reset(hdr);
    }
    v = hdr->s ? hdr->s : "";
    end = v + hdr->len;
    if (need & NEED_DATE) {
        int64_t t;

        if (header_field(hdr->s, end, "date", &v, &vlen)
            && sort_parse_datetime(v, vlen, &t) == 0)
            m->sent = t;
    }
    if (need & NEED_SUBJECT) {
        if (!header_field(hdr->s, end, "subject", &v, &vlen)) {
            v = "";
            vlen = 0;
        }
        if (sort_base_subject(v, vlen, tmp, &m->is_reply) < 0)
            return STORE_NOMEM;
        m->subject = dup_casemapped(tmp->s ? tmp->s : "", tmp->len);
        if (!m->subject)
            return STORE_NOMEM;
    }
    if (need & NEED_ADDR) {
        static const char *const names[3] = { "from", "to", "cc" };

        for (int i = 0; i < 3; i++) {
            int found = header_field(hdr->s, end, names[i], &v, &vlen);

            r = addr_keys(found ? v : NULL, found ? vlen : 0,
                          i == 0 ? &m->from : i == 1 ? &m->to : &m->cc,
                          i == 0 ? &m->dfrom : i == 1 ? &m->dto : NULL);
            if (r < 0)
                return STORE_NOMEM;
        }
    }
    if (need & NEED_REFS) {
        const char *p;
        int nomem = 0;

        if (header_field(hdr->s, end, "message-id", &v, &vlen)) {
            p = v;
            m->msgid = next_msgid(&p, v + vlen, &nomem);
        }
        if (header_field(hdr->s, end, "references", &v, &vlen)) {
            if (refs_collect(m, v, vlen) < 0)
                nomem = 1;
        }
        if (m->nrefs == 0
            && header_field(hdr->s, end, "in-reply-to", &v, &vlen)) {
            char *id;

            p = v;
            id = next_msgid(&p, v + vlen, &nomem);
            if (id) {
                m->refs = calloc(SORT_MAX_REFS, sizeof(*m->refs));
                if (!m->refs) {
                    free(id);
                    return STORE_NOMEM;
                }
                m->refs[m->nrefs++] = id;
            }
        }
        if (nomem)
            return STORE_NOMEM;
    }
    return STORE_OK;
}

/* Search, then load the matches: *msgs_r (n_r of them, in number
 * order). */
static int sort_load(const struct search_params *sp,
                     const struct imapparse_search *key, int need,
                     struct sort_msg **msgs_r, size_t *n_r,
                     struct search_result *res)
{
    struct search_params p = *sp;
    struct sort_msg *msgs;
    struct buf hdr = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    size_t i;
    int r;

    *msgs_r = NULL;
    *n_r = 0;
    if (!sp->uids)
        return STORE_INTERNAL;
    p.return_uids = 0;
    r = search_run(&p, key, res);
    if (r != STORE_OK)
        return r;
    msgs = calloc(res->n ? res->n : 1, sizeof(*msgs));
    if (!msgs)
        return STORE_NOMEM;
    for (i = 0; i < res->n; i++) {
        msgs[i].seq = res->nums[i];
        msgs[i].uid = sp->uids[res->nums[i] - 1];
        r = load_msg(sp, &msgs[i], need, &hdr, &tmp);
        if (r != STORE_OK) {
            for (size_t j = 0; j <= i; j++)
                sort_msg_free(&msgs[j]);
            free(msgs);
            buf_free(&hdr);
            buf_free(&tmp);
            return r;
        }
    }
    buf_free(&hdr);
    buf_free(&tmp);
    *msgs_r = msgs;
    *n_r = res->n;
    return STORE_OK;
}

static void sort_msgs_free(struct sort_msg *msgs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sort_msg_free(&msgs[i]);
    free(msgs);
}

/* ---- SORT ------------------------------------------------------------ */

static int cmp_i64(int64_t a, int64_t b)
{
    return a < b ? -1 : a > b;
}

static int cmp_str(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "");
}

/* qsort has no rock: the criteria of the running sort (one thread per
 * call, as search.h says). */
static const struct imapparse_sortcrit *sort_crit;
static size_t sort_ncrit;

static int sort_compare(const void *va, const void *vb)
{
    const struct sort_msg *a = va, *b = vb;

    for (size_t i = 0; i < sort_ncrit; i++) {
        int c = 0;

        switch (sort_crit[i].key) {
        case IMAPPARSE_SORT_ARRIVAL: c = cmp_i64(a->arrival, b->arrival); break;
        case IMAPPARSE_SORT_SIZE: c = cmp_i64(a->size, b->size); break;
        case IMAPPARSE_SORT_DATE: c = cmp_i64(a->sent, b->sent); break;
        case IMAPPARSE_SORT_SUBJECT: c = cmp_str(a->subject, b->subject); break;
        case IMAPPARSE_SORT_FROM: c = cmp_str(a->from, b->from); break;
        case IMAPPARSE_SORT_TO: c = cmp_str(a->to, b->to); break;
        case IMAPPARSE_SORT_CC: c = cmp_str(a->cc, b->cc); break;
        case IMAPPARSE_SORT_DISPLAYFROM: c = cmp_str(a->dfrom, b->dfrom); break;
        case IMAPPARSE_SORT_DISPLAYTO: c = cmp_str(a->dto, b->dto); break;
        }
        if (c)
            return sort_crit[i].reverse ? -c : c;
    }
    return cmp_i64(a->seq, b->seq);
}

int sort_run(const struct search_params *sp,
             const struct imapparse_search *key,
             const struct imapparse_sortcrit *crit, size_t ncrit,
             struct sort_result *res_r)
{
    struct search_result sres;
    struct sort_msg *msgs = NULL;
    size_t n = 0, i;
    int need = 0, r;

    memset(res_r, 0, sizeof(*res_r));
    memset(&sres, 0, sizeof(sres));
    if (!sp || !crit || ncrit == 0)
        return STORE_INTERNAL;
    for (i = 0; i < ncrit; i++) {
        switch (crit[i].key) {
        case IMAPPARSE_SORT_ARRIVAL:
        case IMAPPARSE_SORT_SIZE:
            break;
        case IMAPPARSE_SORT_DATE:
            need |= NEED_HEADER | NEED_DATE;
            break;
        case IMAPPARSE_SORT_SUBJECT:
            need |= NEED_HEADER | NEED_SUBJECT;
            break;
        default:
            need |= NEED_HEADER | NEED_ADDR;
            break;
        }
    }
    r = sort_load(sp, key, need, &msgs, &n, &sres);
    if (r != STORE_OK) {
        search_result_free(&sres);
        return r;
    }
    sort_crit = crit;
    sort_ncrit = ncrit;
    if (n > 1)
        qsort(msgs, n, sizeof(*msgs), sort_compare);
    sort_crit = NULL;
    sort_ncrit = 0;
    res_r->nums = sres.nums;        /* reuse: same count */
    sres.nums = NULL;
    for (i = 0; i < n; i++)
        res_r->nums[i] = sp->return_uids ? msgs[i].uid : msgs[i].seq;
    res_r->n = n;
    res_r->has_modseq = sres.has_modseq;
    res_r->highest_modseq = sres.highest_modseq;
    search_result_free(&sres);
    sort_msgs_free(msgs, n);
    return STORE_OK;
}

void sort_result_free(struct sort_result *res)
{
    if (!res)
        return;
    free(res->nums);
    memset(res, 0, sizeof(*res));
}

/* ---- THREAD ---------------------------------------------------------- */

struct cont {
    struct sort_msg *msg;   /* NULL: a dummy */
    int parent, child, next;
};

struct threader {
    struct cont *c;
    size_t n, alloc;
    /* Message-ID -> container */
    const char **keys;
    int *vals;
    size_t hsize;
    int return_uids;
};

static int cont_new(struct threader *t)
{
    if (t->n == t->alloc) {
        size_t na = t->alloc ? t->alloc * 2 : 64;
        struct cont *nc = realloc(t->c, na * sizeof(*nc));

        if (!nc)
            return -1;
        t->c = nc;
        t->alloc = na;
    }
    t->c[t->n].msg = NULL;
    t->c[t->n].parent = t->c[t->n].child = t->c[t->n].next = -1;
    return (int)t->n++;
}

static size_t id_hash(const char *s)
{
    size_t h = 2166136261u;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The slot of id in the table (found or the empty one to use). */
static size_t id_slot(struct threader *t, const char *id)
{
    size_t i = id_hash(id) & (t->hsize - 1);

    while (t->keys[i] && strcmp(t->keys[i], id) != 0)
        i = (i + 1) & (t->hsize - 1);
    return i;
}

/* The container of id, made (a dummy) when new; -1 out of memory. */
static int id_get(struct threader *t, const char *id)
{
    size_t i = id_slot(t, id);
    int c;

    if (t->keys[i])
        return t->vals[i];
    c = cont_new(t);
    if (c < 0)
        return -1;
    t->keys[i] = id;
    t->vals[i] = c;
    return c;
}

/* Is a a descendant of (or) b? */
static int is_under(const struct threader *t, int a, int b)
{
    for (; a >= 0; a = t->c[a].parent)
        if (a == b)
            return 1;
    return 0;
}

static void unlink_child(struct threader *t, int c)
{
    int p = t->c[c].parent, *pp;

    if (p < 0)
        return;
    for (pp = &t->c[p].child; *pp >= 0; pp = &t->c[*pp].next) {
        if (*pp == c) {
            *pp = t->c[c].next;
            break;
        }
    }
    t->c[c].parent = -1;
    t->c[c].next = -1;
}

/* Make c the last child of p. */
static void link_child(struct threader *t, int p, int c)
{
    int *pp;

    for (pp = &t->c[p].child; *pp >= 0; pp = &t->c[*pp].next)
        ;
    *pp = c;
    t->c[c].parent = p;
    t->c[c].next = -1;
}

/* (1) containers and links from Message-ID and References. */
static int thread_build(struct threader *t, struct sort_msg *msgs, size_t n)
{
    size_t i, k;

    /* room for every id the messages hold, half full at most */
    {
        size_t ids = 0;

        for (i = 0; i < n; i++)
            ids += 1 + msgs[i].nrefs;
        t->hsize = 64;
        while (t->hsize < ids * 2)
            t->hsize *= 2;
    }
    t->keys = calloc(t->hsize, sizeof(*t->keys));
    t->vals = calloc(t->hsize, sizeof(*t->vals));
    if (!t->keys || !t->vals)
        return -1;
    for (i = 0; i < n; i++) {
        struct sort_msg *m = &msgs[i];
        int mc = -1, prev = -1;

        /* (A) the message's container */
        if (m->msgid) {
            mc = id_get(t, m->msgid);
            if (mc < 0)
                return -1;
            if (t->c[mc].msg)
                mc = -2;            /* a duplicate id: as if it had none */
        }
        if (mc < 0) {
            mc = cont_new(t);
            if (mc < 0)
                return -1;
        }
        t->c[mc].msg = m;
        /* (B) link the references in order */
        for (k = 0; k < m->nrefs; k++) {
            int rc = id_get(t, m->refs[k]);

            if (rc < 0)
                return -1;
            if (prev >= 0 && rc != prev && t->c[rc].parent < 0
                && !is_under(t, prev, rc))
                link_child(t, prev, rc);
            prev = rc;
        }
        /* (C) the last reference is the parent */
        if (prev >= 0 && (prev == mc || is_under(t, prev, mc)))
            prev = -1;
        if (t->c[mc].parent != prev) {
            unlink_child(t, mc);
            if (prev >= 0)
                link_child(t, prev, mc);
        }
    }
    return 0;
}

/* Depth cut: a container SORT_MAX_DEPTH below its root becomes a root, so
 * that the recursive steps stay shallow.  Iterative. */
static int thread_cut_depth(struct threader *t)
{
    int *depth = malloc((t->n ? t->n : 1) * sizeof(*depth));
    int *path = malloc((t->n ? t->n : 1) * sizeof(*path));
    size_t i;

    if (!depth || !path) {
        free(depth);
        free(path);
        return -1;
    }
    for (i = 0; i < t->n; i++)
        depth[i] = -1;
    for (i = 0; i < t->n; i++) {
        size_t np = 0;
        int c = (int)i, d;

        while (c >= 0 && depth[c] < 0) {
            path[np++] = c;
            c = t->c[c].parent;
        }
        d = c >= 0 ? depth[c] : -1;
        while (np > 0) {
            c = path[--np];
            d++;
            if (d >= SORT_MAX_DEPTH) {
                unlink_child(t, c);
                d = 0;
            }
            depth[c] = d;
        }
    }
    free(depth);
    free(path);
    return 0;
}

/* (4) prune dummies in the sibling list starting at first (children
 * first); the new first.  Recursion depth < SORT_MAX_DEPTH. */
static int thread_prune(struct threader *t, int first, int parent)
{
    int head = -1, *tail = &head, c, next;

    for (c = first; c >= 0; c = next) {
        int kids = 0, k;

        next = t->c[c].next;
        t->c[c].child = thread_prune(t, t->c[c].child, c);
        for (k = t->c[c].child; k >= 0; k = t->c[k].next)
            kids++;
        if (!t->c[c].msg && kids == 0)
            continue;
        if (!t->c[c].msg && (parent >= 0 || kids == 1)) {
            /* splice the children in at this level */
            for (k = t->c[c].child; k >= 0; k = t->c[k].next) {
                t->c[k].parent = parent;
                *tail = k;
                tail = &t->c[k].next;
            }
            continue;
        }
        t->c[c].parent = parent;
        *tail = c;
        tail = &t->c[c].next;
    }
    *tail = -1;
    return head;
}

/* The message that stands for a container (itself, or a dummy's first
 * child's). */
static const struct sort_msg *cont_msg(const struct threader *t, int c)
{
    while (c >= 0 && !t->c[c].msg)
        c = t->c[c].child;
    return c >= 0 ? t->c[c].msg : NULL;
}

static const struct threader *thread_cmp_t;

static int thread_cmp(const void *va, const void *vb)
{
    const struct sort_msg *a = cont_msg(thread_cmp_t, *(const int *)va);
    const struct sort_msg *b = cont_msg(thread_cmp_t, *(const int *)vb);
    int c;

    if (!a || !b)
        return (a != NULL) - (b != NULL);
    c = cmp_i64(a->sent, b->sent);
    return c ? c : cmp_i64(a->seq, b->seq);
}

/* Sort a sibling list by sent date (children first, so that a dummy is
 * placed by its earliest child); the new first, -1 for an empty list. */
static int thread_sort(struct threader *t, int first, int *nomem)
{
    int *v, n = 0, c, i;

    for (c = first; c >= 0; c = t->c[c].next) {
        t->c[c].child = thread_sort(t, t->c[c].child, nomem);
        n++;
    }
    if (n < 2)
        return first;
    v = malloc((size_t)n * sizeof(*v));
    if (!v) {
        *nomem = 1;
        return first;
    }
    for (c = first, i = 0; c >= 0; c = t->c[c].next)
        v[i++] = c;
    thread_cmp_t = t;
    qsort(v, (size_t)n, sizeof(*v), thread_cmp);
    thread_cmp_t = NULL;
    for (i = 0; i < n; i++)
        t->c[v[i]].next = i + 1 < n ? v[i + 1] : -1;
    first = v[0];
    free(v);
    return first;
}

/* (5) merge roots with the same base subject; returns the new first
 * root. */
static int thread_group(struct threader *t, int first)
{
    const char **keys;
    int *vals;
    size_t hsize = 64, nroots = 0, i;
    int c, next, head = -1, *tail = &head;

    for (c = first; c >= 0; c = t->c[c].next)
        nroots++;
    while (hsize < nroots * 2)
        hsize *= 2;
    keys = calloc(hsize, sizeof(*keys));
    vals = calloc(hsize, sizeof(*vals));
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return -2;
    }
#define SUBJ_SLOT(s) \
    for (i = id_hash(s) & (hsize - 1); keys[i] && strcmp(keys[i], (s)); \
         i = (i + 1) & (hsize - 1))
    /* (B) the table: per subject the best container */
    for (c = first; c >= 0; c = t->c[c].next) {
        const struct sort_msg *m = cont_msg(t, c);
        int old;

        if (!m || !m->subject || !m->subject[0])
            continue;
        SUBJ_SLOT(m->subject)
            ;
        if (!keys[i]) {
            keys[i] = m->subject;
            vals[i] = c;
            continue;
        }
        old = vals[i];
        if ((t->c[old].msg && !t->c[c].msg)
            || (t->c[old].msg && t->c[c].msg && t->c[old].msg->is_reply
                && !t->c[c].msg->is_reply))
            vals[i] = c;
    }
    /* (C) merge */
    for (c = first; c >= 0; c = next) {
        const struct sort_msg *m = cont_msg(t, c);
        int old, k, knext;

        next = t->c[c].next;
        t->c[c].next = -1;
        if (m && m->subject && m->subject[0]) {
            SUBJ_SLOT(m->subject)
                ;
            old = vals[i];
        } else {
            old = c;
        }
        if (old == c || (!t->c[c].msg && t->c[old].msg)) {
            *tail = c;
            tail = &t->c[c].next;
            continue;
        }
        if (!t->c[old].msg && !t->c[c].msg) {
            for (k = t->c[c].child; k >= 0; k = knext) {
                knext = t->c[k].next;
                link_child(t, old, k);
            }
            t->c[c].child = -1;
        } else if (!t->c[old].msg
                   || (t->c[c].msg->is_reply && !t->c[old].msg->is_reply)) {
            link_child(t, old, c);
        } else {
            /* a new dummy in old's place, with old and c below it; old
             * is in the output list already (it came first: a later one
             * would have replaced c in the table only as a better,
             * non-reply match, handled above) */
            int d, *pp;

            for (pp = &head; *pp >= 0 && *pp != old; pp = &t->c[*pp].next)
                ;
            if (*pp != old) {
                *tail = c;              /* not expected: keep c a root */
                tail = &t->c[c].next;
                continue;
            }
            d = cont_new(t);
            if (d < 0) {
                free(keys);
                free(vals);
                return -2;
            }
            t->c[d].next = t->c[old].next;
            *pp = d;
            if (tail == &t->c[old].next)
                tail = &t->c[d].next;
            t->c[old].next = -1;
            t->c[old].parent = -1;
            link_child(t, d, old);
            link_child(t, d, c);
            vals[i] = d;
        }
    }
#undef SUBJ_SLOT
    *tail = -1;
    free(keys);
    free(vals);
    return head;
}

static void thread_write_members(const struct threader *t, int c,
                                 struct buf *out);

/* "(" members ")" of a thread or a branch */
static void thread_write(const struct threader *t, int c, struct buf *out)
{
    buf_putc(out, '(');
    thread_write_members(t, c, out);
    buf_putc(out, ')');
}

static void thread_write_members(const struct threader *t, int c,
                                 struct buf *out)
{
    int kids = 0, k;

    for (k = t->c[c].child; k >= 0; k = t->c[k].next)
        kids++;
    if (t->c[c].msg) {
        const struct sort_msg *m = t->c[c].msg;

        buf_printf(out, "%u", (unsigned)(t->return_uids ? m->uid : m->seq));
        if (kids == 0)
            return;
        buf_putc(out, ' ');
    }
    if (kids == 1 && t->c[c].msg) {
        thread_write_members(t, t->c[c].child, out);
        return;
    }
    for (k = t->c[c].child; k >= 0; k = t->c[k].next)
        thread_write(t, k, out);
}

static int thread_orderedsubject(struct sort_msg *msgs, size_t n,
                                 int return_uids, struct buf *out);

int sort_thread(const struct search_params *sp,
                const struct imapparse_search *key,
                enum imapparse_thread_alg alg, struct buf *out)
{
    struct search_result sres;
    struct sort_msg *msgs = NULL;
    struct threader t;
    size_t n = 0, i;
    int r, first = -1, nomem = 0;

    memset(&sres, 0, sizeof(sres));
    memset(&t, 0, sizeof(t));
    if (!sp || !out)
        return STORE_INTERNAL;
    r = sort_load(sp, key, NEED_HEADER | NEED_DATE | NEED_SUBJECT |
                  (alg == IMAPPARSE_THREAD_REFERENCES ? NEED_REFS : 0),
                  &msgs, &n, &sres);
    search_result_free(&sres);
    if (r != STORE_OK)
        return r;
    if (alg == IMAPPARSE_THREAD_ORDEREDSUBJECT) {
        r = thread_orderedsubject(msgs, n, sp->return_uids, out);
        sort_msgs_free(msgs, n);
        return r;
    }
    t.return_uids = sp->return_uids;
    r = STORE_NOMEM;
    if (thread_build(&t, msgs, n) < 0 || thread_cut_depth(&t) < 0)
        goto out;
    /* (2) the root set, in container order */
    {
        int *tail = &first;

        for (i = 0; i < t.n; i++) {
            if (t.c[i].parent < 0) {
                *tail = (int)i;
                tail = &t.c[i].next;
            }
        }
        *tail = -1;
    }
    /* (3) the id table is not needed any more */
    free(t.keys);
    free(t.vals);
    t.keys = NULL;
    t.vals = NULL;
    first = thread_prune(&t, first, -1);
    first = thread_group(&t, first);
    if (first == -2)
        goto out;
    first = thread_sort(&t, first, &nomem);
    if (nomem)
        goto out;
    buf_appendcstr(out, "* THREAD");
    if (first >= 0)
        buf_putc(out, ' ');
    for (int c = first; c >= 0; c = t.c[c].next)
        thread_write(&t, c, out);
    buf_appendcstr(out, "\r\n");
    r = STORE_OK;
out:
    free(t.keys);
    free(t.vals);
    free(t.c);
    sort_msgs_free(msgs, n);
    return r;
}

static int subject_date_cmp(const void *va, const void *vb)
{
    const struct sort_msg *a = va, *b = vb;
    int c = cmp_str(a->subject, b->subject);

    if (c)
        return c;
    c = cmp_i64(a->sent, b->sent);
    return c ? c : cmp_i64(a->seq, b->seq);
}

struct osub_group {
    size_t start, n;
};

static const struct sort_msg *osub_msgs;

static int osub_group_cmp(const void *va, const void *vb)
{
    const struct sort_msg *a = &osub_msgs[((const struct osub_group *)va)
                                          ->start];
    const struct sort_msg *b = &osub_msgs[((const struct osub_group *)vb)
                                          ->start];
    int c = cmp_i64(a->sent, b->sent);

    return c ? c : cmp_i64(a->seq, b->seq);
}

static int thread_orderedsubject(struct sort_msg *msgs, size_t n,
                                 int return_uids, struct buf *out)
{
    struct osub_group *g;
    size_t ng = 0, i, k;

    if (n > 1)
        qsort(msgs, n, sizeof(*msgs), subject_date_cmp);
    g = malloc((n ? n : 1) * sizeof(*g));
    if (!g)
        return STORE_NOMEM;
    for (i = 0; i < n; i++) {
        if (i == 0 || cmp_str(msgs[i].subject, msgs[i - 1].subject) != 0) {
            g[ng].start = i;
            g[ng].n = 0;
            ng++;
        }
        g[ng - 1].n++;
    }
    osub_msgs = msgs;
    if (ng > 1)
        qsort(g, ng, sizeof(*g), osub_group_cmp);
    osub_msgs = NULL;
    buf_appendcstr(out, "* THREAD");
    if (ng)
        buf_putc(out, ' ');
    for (i = 0; i < ng; i++) {
        const struct sort_msg *m = &msgs[g[i].start];

        buf_printf(out, "(%u", (unsigned)(return_uids ? m->uid : m->seq));
        if (g[i].n == 2) {
            m++;
            buf_printf(out, " %u", (unsigned)(return_uids ? m->uid : m->seq));
        } else if (g[i].n > 2) {
            buf_putc(out, ' ');
            for (k = 1; k < g[i].n; k++) {
                m = &msgs[g[i].start + k];
                buf_printf(out, "(%u)",
                           (unsigned)(return_uids ? m->uid : m->seq));
            }
        }
        buf_putc(out, ')');
    }
    buf_appendcstr(out, "\r\n");
    free(g);
    return STORE_OK;
}
