/*
 * buf.h - a growable byte buffer, safe for untrusted input.
 *
 * Every growth goes through one function (buf_ensure) that checks for size
 * overflow and for the buffer's maximum, and always keeps one spare byte so
 * that buf_cstring() can NUL-terminate without growing.  The bytes may
 * contain NUL; `len` is the authority, never strlen().
 */
#ifndef LIB_BUF_H
#define LIB_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct buf {
    char *s;        /* the bytes; NULL while nothing was ever allocated */
    size_t len;     /* bytes in use */
    size_t alloc;   /* bytes allocated (always > len once allocated) */
    size_t max;     /* largest allowed len; 0 means BUF_DEFAULT_MAX */
};

#define BUF_INITIALIZER { NULL, 0, 0, 0 }
#define BUF_DEFAULT_MAX ((size_t)1 << 30)   /* 1 GiB */

/* Make room for `more` further bytes plus the spare NUL.  Returns 0, or -1
 * (errno EOVERFLOW / ENOMEM) when len + more would pass max or the
 * allocation fails; the buffer is then unchanged. */
int buf_ensure(struct buf *b, size_t more);

/* Set the largest allowed length (0 for the default). */
void buf_set_max(struct buf *b, size_t max);

/* Append bytes / a C string / one byte / printf output.  0 or -1 as
 * buf_ensure.  On -1 nothing is appended.  buf_append may be given bytes of
 * the same buffer; buf_printf arguments must not point into the buffer. */
int buf_append(struct buf *b, const void *data, size_t len);
int buf_appendcstr(struct buf *b, const char *s);
int buf_putc(struct buf *b, int c);
int buf_printf(struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int buf_vprintf(struct buf *b, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

/* Replace the contents. */
int buf_setmap(struct buf *b, const void *data, size_t len);
int buf_setcstr(struct buf *b, const char *s);

/* Cut to `len` bytes (no-op when already shorter). */
void buf_truncate(struct buf *b, size_t len);

/* Empty it, keeping the memory. */
void buf_reset(struct buf *b);

/* A NUL-terminated view of the contents (never NULL; "" when empty).
 * Valid until the next change to the buffer. */
const char *buf_cstring(struct buf *b);

/* Hand the memory to the caller (a NUL-terminated string the caller frees);
 * the buffer is left empty. */
char *buf_release(struct buf *b);

/* Free the memory and reset. */
void buf_free(struct buf *b);

#endif
