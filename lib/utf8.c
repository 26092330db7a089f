/*
 * utf8.c - strict UTF-8 (see utf8.h).
 */
#include "config.h"

#include "lib/utf8.h"

int utf8_decode(const unsigned char *s, size_t len, uint32_t *cp_r,
                size_t *n_r)
{
    uint32_t cp;
    size_t n, i;

    if (len == 0)
        return -1;
    if (s[0] < 0x80) {
        *cp_r = s[0];
        *n_r = 1;
        return 0;
    }
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n = 2;
        cp = s[0] & 0x1f;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n = 3;
        cp = s[0] & 0x0f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n = 4;
        cp = s[0] & 0x07;
    } else {
        return -1;
    }
    if (len < n)
        return -1;
    for (i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return -1;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))
        || (cp >= 0xd800 && cp <= 0xdfff))
        return -1;
    *cp_r = cp;
    *n_r = n;
    return 0;
}

int utf8_put(struct buf *out, uint32_t cp)
{
    char b[4];
    size_t n;

    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (char)(0xf0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    return buf_append(out, b, n);
}

/* ---- modified UTF-7 (RFC 3501 5.1.3) ---- */

static const char mb64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+,";

static int mb64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == ',')
        return 63;
    return -1;
}

static int is_control(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f);
}

int utf8_to_mutf7(const char *s, size_t len, struct buf *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;

    while (i < len) {
        uint32_t acc = 0;
        int bits = 0;

        if (p[i] >= 0x20 && p[i] <= 0x7e) {
            if (buf_append(out, p[i] == '&' ? "&-" : (const char *)p + i,
                           p[i] == '&' ? 2 : 1) < 0)
                return -2;
            i++;
            continue;
        }
        if (p[i] < 0x80)
            return -1;          /* a control byte */
        if (buf_putc(out, '&') < 0)
            return -2;
        while (i < len && p[i] >= 0x80) {
            uint32_t cp, unit[2];
            size_t n, nu, k;

            if (utf8_decode(p + i, len - i, &cp, &n) < 0 || is_control(cp))
                return -1;
            i += n;
            if (cp >= 0x10000) {
                unit[0] = 0xd800 | ((cp - 0x10000) >> 10);
                unit[1] = 0xdc00 | ((cp - 0x10000) & 0x3ff);
                nu = 2;
            } else {
                unit[0] = cp;
                nu = 1;
            }
            for (k = 0; k < nu; k++) {
                acc = (acc << 16) | unit[k];
                bits += 16;
                while (bits >= 6) {
                    bits -= 6;
                    if (buf_putc(out, mb64[(acc >> bits) & 0x3f]) < 0)
                        return -2;
                }
                acc &= (1u << bits) - 1;
            }
        }
        if (bits > 0 && buf_putc(out, mb64[(acc << (6 - bits)) & 0x3f]) < 0)
            return -2;
        if (buf_putc(out, '-') < 0)
            return -2;
    }
    return 0;
}

int utf8_from_mutf7(const char *s, size_t len, struct buf *out)
{
    size_t i = 0;
    int after_run = 0;

    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        uint32_t acc = 0, high = 0;
        int bits = 0;
        size_t nchars = 0;

        if (c < 0x20 || c > 0x7e)
            return -1;
        if (c != '&') {
            if (buf_putc(out, c) < 0)
                return -2;
            i++;
            after_run = 0;
            continue;
        }
        i++;
        if (i < len && s[i] == '-') {
            if (buf_putc(out, '&') < 0)
                return -2;
            i++;
            after_run = 0;
            continue;
        }
        if (after_run)
            return -1;          /* two runs in a row: not canonical */
        for (;;) {
            int v;

            if (i >= len)
                return -1;      /* no closing '-' */
            c = (unsigned char)s[i++];
            if (c == '-')
                break;
            v = mb64_value(c);
            if (v < 0)
                return -1;
            acc = (acc << 6) | (uint32_t)v;
            bits += 6;
            if (bits >= 16) {
                uint32_t unit, cp;

                bits -= 16;
                unit = (acc >> bits) & 0xffff;
                acc &= (1u << bits) - 1;
                if (high) {
                    if (unit < 0xdc00 || unit > 0xdfff)
                        return -1;
                    cp = 0x10000 + ((high - 0xd800) << 10) + (unit - 0xdc00);
                    high = 0;
                } else if (unit >= 0xd800 && unit <= 0xdbff) {
                    high = unit;
                    continue;
                } else if (unit >= 0xdc00 && unit <= 0xdfff) {
                    return -1;
                } else {
                    cp = unit;
                }
                if ((cp >= 0x20 && cp <= 0x7e) || is_control(cp))
                    return -1;  /* must be written directly / none */
                if (utf8_put(out, cp) < 0)
                    return -2;
                nchars++;
            }
        }
        if (high || bits >= 6 || acc != 0 || nchars == 0)
            return -1;
        after_run = 1;
    }
    return 0;
}
