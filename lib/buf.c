/*
 * buf.c - growable byte buffer.  Invariant: once allocated, alloc > len, so
 * s[len] can always hold a NUL.  All growth goes through buf_ensure().
 * Appending bytes that lie inside the buffer itself is allowed.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/fmt.h"

/* The largest allowed len.  Kept below SIZE_MAX so that len + more + 1
 * (the spare NUL) cannot wrap even when max is set to SIZE_MAX. */
static size_t buf_limit(const struct buf *b)
{
    size_t limit = b->max ? b->max : BUF_DEFAULT_MAX;

    return limit < SIZE_MAX ? limit : SIZE_MAX - 1;
}

int buf_ensure(struct buf *b, size_t more)
{
    size_t limit = buf_limit(b);
    size_t need, newalloc;
    char *p;

    if (more > limit || b->len > limit - more) {
        errno = EOVERFLOW;
        return -1;
    }
    need = b->len + more + 1;          /* +1: the spare NUL; cannot overflow */
    if (need <= b->alloc)
        return 0;
    newalloc = b->alloc ? b->alloc : 64;
    while (newalloc < need) {
        if (newalloc > SIZE_MAX / 2) {
            newalloc = need;
            break;
        }
        newalloc *= 2;
    }
    if (newalloc > limit + 1)
        newalloc = limit + 1;
    p = realloc(b->s, newalloc);
    if (!p) {
        errno = ENOMEM;
        return -1;
    }
    b->s = p;
    b->alloc = newalloc;
    return 0;
}

void buf_set_max(struct buf *b, size_t max)
{
    b->max = max;
}

int buf_append(struct buf *b, const void *data, size_t len)
{
    uintptr_t d = (uintptr_t)data, base = (uintptr_t)b->s;

    /* data may lie inside the buffer itself (appending its own bytes, or
     * buf_setmap() from a piece of it): buf_ensure() may move the memory,
     * so re-find the bytes afterwards, and copy with memmove. */
    if (b->s && d >= base && d < base + b->alloc) {
        size_t off = (size_t)(d - base);

        if (buf_ensure(b, len) < 0)
            return -1;
        data = b->s + off;
    } else if (buf_ensure(b, len) < 0) {
        return -1;
    }
    if (len)
        memmove(b->s + b->len, data, len);
    b->len += len;
    return 0;
}

int buf_appendcstr(struct buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

int buf_putc(struct buf *b, int c)
{
    char ch = (char)c;
    return buf_append(b, &ch, 1);
}

int buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    size_t room;
    int n;

    /* first into the room there is (made 128 bytes at least when the
     * limit allows): one formatting pass instead of measuring first */
    if (b->alloc - b->len < 128)
        (void)buf_ensure(b, 127);
    room = b->alloc > b->len ? b->alloc - b->len : 0;
    va_copy(ap2, ap);
    n = room ? fmt_vsnprintf(b->s + b->len, room, fmt, ap2)
             : fmt_vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        if (room)
            b->s[b->len] = '\0';
        return -1;
    }
    if ((size_t)n < room && (size_t)n <= buf_limit(b) - b->len) {
        b->len += (size_t)n;   /* it fit */
        return 0;
    }
    if (room)
        b->s[b->len] = '\0';
    if (buf_ensure(b, (size_t)n) < 0)
        return -1;
    fmt_vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return r;
}

int buf_setmap(struct buf *b, const void *data, size_t len)
{
    size_t oldlen = b->len;

    b->len = 0;
    if (buf_append(b, data, len) < 0) {
        b->len = oldlen;
        return -1;
    }
    return 0;
}

int buf_setcstr(struct buf *b, const char *s)
{
    return buf_setmap(b, s, strlen(s));
}

void buf_truncate(struct buf *b, size_t len)
{
    if (len < b->len)
        b->len = len;
}

void buf_reset(struct buf *b)
{
    b->len = 0;
}

const char *buf_cstring(struct buf *b)
{
    if (!b->s)
        return "";
    b->s[b->len] = '\0';
    return b->s;
}

char *buf_release(struct buf *b)
{
    char *s;

    if (!b->s) {
        s = strdup("");
    } else {
        b->s[b->len] = '\0';
        s = b->s;
    }
    b->s = NULL;
    b->len = b->alloc = 0;
    return s;
}

void buf_free(struct buf *b)
{
    free(b->s);
    b->s = NULL;
    b->len = b->alloc = 0;
}
