/*
 * fmt.h - printf formatting without the C library's printf machinery for
 * the conversions the servers' hot paths use (log lines, paths, keys).
 */
#ifndef LIB_FMT_H
#define LIB_FMT_H

#include <stdarg.h>
#include <stddef.h>

/* vsnprintf(), with its result for every format: at most outlen - 1
 * bytes written and a NUL (nothing when outlen is 0; out may then be
 * NULL), the length of the whole output returned (-1 on error), a NUL
 * from %c written and counted.  %s, %.*s, %c, %d, %i, %u, %x with l, ll,
 * z or j and a width of zeros as in %03llu, and %%, are made here; any
 * other format goes to vsnprintf(). */
int fmt_vsnprintf(char *out, size_t outlen, const char *fmt, va_list ap);

/* fmt_vsnprintf() with arguments: snprintf(). */
int fmt_snprintf(char *out, size_t outlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
