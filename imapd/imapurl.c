/*
 * imapurl.c - parsing the IMAP URLs of CATENATE (RFC 5092 subset; see
 * imapurl.h).  Input is a (pointer, length) pair from the network; every
 * read is bounded by it, and decoded text never holds a NUL (a %00 is
 * refused), so the strings handed back are safe C strings.
 */
#include "config.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "imapd/imapurl.h"

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decode [s, s+len) into a new string; NULL when malformed, a
 * %00, a raw control character or out of memory. */
static char *decode(const char *s, size_t len)
{
    char *out = malloc(len + 1), *o = out;
    size_t i;

    if (!out)
        return NULL;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '%') {
            int h, l;

            if (i + 2 >= len)
                goto bad;
            h = hexval((unsigned char)s[i + 1]);
            l = hexval((unsigned char)s[i + 2]);
            if (h < 0 || l < 0 || (h == 0 && l == 0))
                goto bad;
            *o++ = (char)(h * 16 + l);
            i += 2;
            continue;
        }
        if (c < 0x21 || c == 0x7f)
            goto bad;
        *o++ = (char)c;
    }
    *o = '\0';
    return out;
bad:
    free(out);
    return NULL;
}

/* Case-insensitive prefix test on a bounded string. */
static int has_prefix(const char *s, size_t len, const char *p)
{
    size_t n = strlen(p);

    return len >= n && strncasecmp(s, p, n) == 0;
}

/* A number of 1..10 digits fitting 32 bits; nz: not 0.  Consumes the
 * digits.  0 or -1. */
static int number(const char **s, const char *end, int nz, uint32_t *n_r)
{
    const char *p = *s;
    unsigned long long n = 0;

    if (p >= end || !isdigit((unsigned char)*p))
        return -1;
    while (p < end && isdigit((unsigned char)*p)) {
        n = n * 10 + (unsigned)(*p - '0');
        if (n > 0xffffffffULL)
            return -1;
        p++;
    }
    if (nz && n == 0)
        return -1;
    *s = p;
    *n_r = (uint32_t)n;
    return 0;
}

static int section_parse(const char *sec, struct imapurl *u)
{
    const char *p = sec, *end = sec + strlen(sec);

    u->kind = MESSAGE_SECTION_CONTENT;
    while (p < end && isdigit((unsigned char)*p)) {
        uint32_t n;

        if (u->npart == IMAPURL_MAX_PARTS || number(&p, end, 1, &n) < 0)
            return -1;
        u->part[u->npart++] = n;
        if (p == end)
            return 0;
        if (*p != '.' || p + 1 == end)
            return -1;
        p++;
    }
    if (strcasecmp(p, "HEADER") == 0)
        u->kind = MESSAGE_SECTION_HEADER;
    else if (strcasecmp(p, "TEXT") == 0)
        u->kind = MESSAGE_SECTION_TEXT;
    else if (strcasecmp(p, "MIME") == 0 && u->npart > 0)
        u->kind = MESSAGE_SECTION_MIME;
    else
        return -1;
    return 0;
}

/* From ";UID=" on: uid, section, partial. */
static int tail_parse(const char *p, const char *end, struct imapurl *u,
                      const char **error_r)
{
    if (!has_prefix(p, (size_t)(end - p), ";UID=")) {
        *error_r = "Missing ;UID=";
        return -1;
    }
    p += 5;
    if (number(&p, end, 1, &u->uid) < 0) {
        *error_r = "Invalid UID";
        return -1;
    }
    if (has_prefix(p, (size_t)(end - p), "/;SECTION=")) {
        const char *q;
        char *sec;
        int r;

        p += 10;
        q = p;
        while (q < end && *q != '/')
            q++;
        sec = decode(p, (size_t)(q - p));
        if (!sec) {
            *error_r = "Invalid SECTION";
            return -1;
        }
        r = section_parse(sec, u);
        free(sec);
        if (r < 0) {
            *error_r = "Unsupported or invalid SECTION";
            return -1;
        }
        u->section_set = 1;
        p = q;
    }
    if (has_prefix(p, (size_t)(end - p), "/;PARTIAL=")) {
        p += 10;
        if (number(&p, end, 0, &u->origin) < 0) {
            *error_r = "Invalid PARTIAL";
            return -1;
        }
        if (p < end && *p == '.') {
            p++;
            if (number(&p, end, 1, &u->count) < 0) {
                *error_r = "Invalid PARTIAL";
                return -1;
            }
        }
        u->partial = 1;
    }
    if (p != end) {
        *error_r = has_prefix(p, (size_t)(end - p), ";EXPIRE=")
                   || has_prefix(p, (size_t)(end - p), ";URLAUTH=")
                   ? "URLAUTH is not supported" : "Junk at the end of the URL";
        return -1;
    }
    return 0;
}

/* Where "/;UID=" starts in [p, end), or NULL. */
static const char *find_uid(const char *p, const char *end)
{
    for (; p + 6 <= end; p++)
        if (strncasecmp(p, "/;UID=", 6) == 0)
            return p;
    return NULL;
}

int imapurl_parse(const char *s, size_t len, struct imapurl *u,
                  const char **error_r)
{
    const char *p = s, *end = s + len, *uid, *ref_end;
    size_t i;

    memset(u, 0, sizeof(*u));
    *error_r = "Invalid URL";
    for (i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] == 0x7f)
            return -1;
    if (has_prefix(p, len, ";UID="))
        return tail_parse(p, end, u, error_r);
    if (has_prefix(p, len, "imap://")) {
        const char *auth = p + 7, *at = NULL, *slash, *colon;

        for (slash = auth; slash < end && *slash != '/'; slash++)
            if (*slash == '@')
                at = slash;
        if (slash == end)
            return -1;
        if (at) {
            const char *semi = memchr(auth, ';', (size_t)(at - auth));

            u->user = decode(auth, (size_t)((semi ? semi : at) - auth));
            if (!u->user || !*u->user)
                return -1;
            auth = at + 1;
        }
        colon = memchr(auth, ':', (size_t)(slash - auth));
        u->host = decode(auth, (size_t)((colon ? colon : slash) - auth));
        if (!u->host || !*u->host)
            return -1;
        if (colon) {
            const char *q = colon + 1;
            uint32_t port;

            if (number(&q, slash, 1, &port) < 0 || q != slash ||
                port > 65535)
                return -1;
            u->port = port;
        }
        p = slash;
    }
    if (p >= end || *p != '/')
        return -1;
    p++;
    uid = find_uid(p, end);
    if (!uid) {
        *error_r = "The URL names no message (;UID=)";
        return -1;
    }
    ref_end = uid;
    {
        const char *q;

        for (q = p; q + 13 <= uid; q++)
            if (strncasecmp(q, ";UIDVALIDITY=", 13) == 0)
                break;
        if (q + 13 <= uid) {
            const char *n = q + 13;

            if (number(&n, uid, 1, &u->uidvalidity) < 0 || n != uid) {
                *error_r = "Invalid UIDVALIDITY";
                return -1;
            }
            ref_end = q;
        }
    }
    u->mailbox = decode(p, (size_t)(ref_end - p));
    if (!u->mailbox || !*u->mailbox)
        return -1;
    return tail_parse(uid + 1, end, u, error_r);
}

void imapurl_fini(struct imapurl *u)
{
    free(u->user);
    free(u->host);
    free(u->mailbox);
    memset(u, 0, sizeof(*u));
}
