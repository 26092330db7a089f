/*
 * strarray.c - a growable array of owned C strings.
 *
 * Invariants: every data[i] for i < count is a string the array owns
 * (freed by strarray_remove() and strarray_fini()); once anything was added,
 * alloc > count and data[count] == NULL, so `data` can be walked like argv.
 * All growth goes through strarray_grow(), which checks for overflow.
 * A failed call leaves the array as it was.
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lib/buf.h"
#include "lib/strarray.h"

/* Make room for `more` further entries plus the NULL terminator. */
static int strarray_grow(struct strarray *sa, size_t more)
{
    size_t need, newalloc;
    char **p;

    if (more > SIZE_MAX / sizeof(char *) - 1 ||
        sa->count > SIZE_MAX / sizeof(char *) - 1 - more) {
        errno = EOVERFLOW;
        return -1;
    }
    need = sa->count + more + 1;
    if (need <= sa->alloc)
        return 0;
    newalloc = sa->alloc ? sa->alloc : 8;
    while (newalloc < need) {
        if (newalloc > SIZE_MAX / sizeof(char *) / 2) {
            newalloc = need;
            break;
        }
        newalloc *= 2;
    }
    p = realloc(sa->data, newalloc * sizeof(char *));
    if (!p) {
        errno = ENOMEM;
        return -1;
    }
    sa->data = p;
    sa->alloc = newalloc;
    return 0;
}

int strarray_appendm(struct strarray *sa, char *s)
{
    if (!s) {
        errno = EINVAL;
        return -1;
    }
    if (strarray_grow(sa, 1) < 0) {
        free(s);
        return -1;
    }
    sa->data[sa->count++] = s;
    sa->data[sa->count] = NULL;
    return 0;
}

int strarray_append(struct strarray *sa, const char *s)
{
    char *copy;

    if (!s) {
        errno = EINVAL;
        return -1;
    }
    copy = strdup(s);
    if (!copy)
        return -1;
    return strarray_appendm(sa, copy);
}

const char *strarray_nth(const struct strarray *sa, size_t i)
{
    if (i >= sa->count)
        return NULL;
    return sa->data[i];
}

long strarray_find(const struct strarray *sa, const char *s)
{
    size_t i;

    if (!s)
        return -1;
    for (i = 0; i < sa->count; i++)
        if (!strcmp(sa->data[i], s))
            return (long)i;
    return -1;
}

void strarray_remove(struct strarray *sa, size_t i)
{
    if (i >= sa->count)
        return;
    free(sa->data[i]);
    /* move the tail, including the NULL terminator, down by one */
    memmove(sa->data + i, sa->data + i + 1,
            (sa->count - i) * sizeof(char *));
    sa->count--;
}

static int strarray_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void strarray_sort(struct strarray *sa)
{
    if (sa->count > 1)
        qsort(sa->data, sa->count, sizeof(char *), strarray_cmp);
}

int strarray_split(struct strarray *sa, const char *s, const char *sep)
{
    size_t oldcount = sa->count;
    const char *p = s;

    if (!s || !sep) {
        errno = EINVAL;
        return -1;
    }
    while (*p) {
        size_t n;
        char *field;

        p += strspn(p, sep);
        n = strcspn(p, sep);
        if (!n)
            break;
        field = strndup(p, n);
        if (!field || strarray_appendm(sa, field) < 0)
            goto fail;
        p += n;
    }
    return 0;

fail:
    while (sa->count > oldcount)
        strarray_remove(sa, sa->count - 1);
    return -1;
}

char *strarray_join(const struct strarray *sa, const char *sep)
{
    struct buf b = BUF_INITIALIZER;
    size_t i;

    for (i = 0; i < sa->count; i++) {
        if ((i && sep && buf_appendcstr(&b, sep) < 0) ||
            buf_appendcstr(&b, sa->data[i]) < 0) {
            buf_free(&b);
            return NULL;
        }
    }
    return buf_release(&b);
}

void strarray_fini(struct strarray *sa)
{
    size_t i;

    for (i = 0; i < sa->count; i++)
        free(sa->data[i]);
    free(sa->data);
    sa->data = NULL;
    sa->count = sa->alloc = 0;
}
