/*
 * fmt.c - printf formatting for the conversions the hot paths use.
 *
 * glibc's vsnprintf() costs some 1,000 instructions for a path of two
 * %s and 4,000 for a log line of several: a stream set up per call and
 * the general conversion machinery.  A delivery formats some twenty
 * paths, keys and log lines, so that was a twentieth of its instructions.
 * fmt_vsnprintf() makes the conversions these use by hand and hands
 * anything else (a flag or a width other than a number's %0N with N < 10,
 * a precision other than %.*s, another conversion) with the whole format
 * to vsnprintf(), so every printf format still works.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "lib/fmt.h"

/* v in decimal or hex, written backwards to end; its length */
static size_t fmt_num(char *end, unsigned long long v, int hex)
{
    static const char digits[] = "0123456789abcdef";
    char *p = end;

    do {
        *--p = digits[hex ? v & 15 : v % 10];
        v = hex ? v >> 4 : v / 10;
    } while (v);
    return (size_t)(end - p);
}

int fmt_vsnprintf(char *out, size_t outlen, const char *fmt, va_list ap)
{
    va_list aq;
    /* written: bytes in out; total: bytes of the whole output */
    size_t written = 0, total = 0, room = outlen ? outlen - 1 : 0, len;
    const char *p = fmt, *s;
    char num[24];

    va_copy(aq, ap);
    while (*p) {
        unsigned long long u = 0;
        int prec = -1, mod = 0, neg = 0, zeros = 0;
        const char *pct = strchr(p, '%');

        if (pct != p) {   /* the literal text before the next % */
            s = p;
            len = pct ? (size_t)(pct - p) : strlen(p);
            p += len;
            goto put;
        }
        p++;
        if (p[0] == '.' && p[1] == '*' && p[2] == 's') {
            prec = va_arg(aq, int);
            p += 2;
        } else if (p[0] == '0' && p[1] >= '1' && p[1] <= '9' &&
                   (p[2] < '0' || p[2] > '9')) {
            zeros = p[1] - '0';   /* %03llu: a number's width, zeros */
            p += 2;
        }
        /* the length modifier: 1 long, 2 long long, 3 size_t, 4 intmax_t */
        if (p[0] == 'l' && p[1] == 'l') {
            mod = 2;
            p += 2;
        } else if (*p == 'l' || *p == 'z' || *p == 'j') {
            mod = *p == 'l' ? 1 : *p == 'z' ? 3 : 4;
            p++;
        }
        if (zeros && *p != 'd' && *p != 'i' && *p != 'u' && *p != 'x')
            goto libc;
        switch (*p) {
        case '%':
            if (mod || prec >= 0)
                goto libc;
            s = "%";
            len = 1;
            break;
        case 's':
            if (mod)
                goto libc;
            s = va_arg(aq, const char *);
            if (!s)   /* as glibc prints it */
                s = prec < 0 || prec >= 6 ? "(null)" : "";
            len = prec >= 0 ? strnlen(s, (size_t)prec) : strlen(s);
            break;
        case 'c':
            if (mod || prec >= 0)
                goto libc;
            num[0] = (char)va_arg(aq, int);
            s = num;
            len = 1;
            break;
        case 'd':
        case 'i':
            if (prec >= 0)
                goto libc;
            {
                long long v = mod == 0 ? va_arg(aq, int)
                            : mod == 1 ? va_arg(aq, long)
                            : mod == 2 ? va_arg(aq, long long)
                            : mod == 3 ? (long long)va_arg(aq, ssize_t)
                                       : (long long)va_arg(aq, intmax_t);
                neg = v < 0;
                u = neg ? 0ULL - (unsigned long long)v
                        : (unsigned long long)v;
            }
            goto number;
        case 'u':
        case 'x':
            if (prec >= 0)
                goto libc;
            u = mod == 0 ? va_arg(aq, unsigned)
              : mod == 1 ? va_arg(aq, unsigned long)
              : mod == 2 ? va_arg(aq, unsigned long long)
              : mod == 3 ? (unsigned long long)va_arg(aq, size_t)
                         : (unsigned long long)va_arg(aq, uintmax_t);
        number:
            {
                char *q;

                len = fmt_num(num + sizeof(num), u, *p == 'x');
                q = num + sizeof(num) - len;
                for (; (int)len + neg < zeros; len++)
                    *--q = '0';
                if (neg) {
                    *--q = '-';
                    len++;
                }
                s = q;
            }
            break;
        default:
            goto libc;
        }
        p++;
    put:
        if (written < room) {
            size_t n = len < room - written ? len : room - written;

            memcpy(out + written, s, n);
            written += n;
        }
        total += len;
        if (total > INT_MAX) {
            va_end(aq);
            if (outlen)
                out[written] = '\0';
            errno = EOVERFLOW;
            return -1;
        }
    }
    va_end(aq);
    if (outlen)
        out[written] = '\0';
    return (int)total;

libc:
    va_end(aq);
    return vsnprintf(out, outlen, fmt, ap);
}

int fmt_snprintf(char *out, size_t outlen, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = fmt_vsnprintf(out, outlen, fmt, ap);
    va_end(ap);
    return r;
}
