/*
 * strarray.h - a growable array of owned C strings.
 */
#ifndef LIB_STRARRAY_H
#define LIB_STRARRAY_H

#include <stddef.h>

struct strarray {
    char **data;     /* NULL-terminated once anything was added */
    size_t count;
    size_t alloc;
};

#define STRARRAY_INITIALIZER { NULL, 0, 0 }

/* Append a copy of s.  Returns 0, or -1 on allocation failure or when s is
 * NULL; the array is then unchanged. */
int strarray_append(struct strarray *sa, const char *s);
/* Append s itself (the array takes ownership, even on failure: s is freed
 * when -1 is returned).  -1 also for s == NULL, so that
 * strarray_appendm(sa, strdup(x)) needs no separate check. */
int strarray_appendm(struct strarray *sa, char *s);
/* The i-th string, or NULL when out of range. */
const char *strarray_nth(const struct strarray *sa, size_t i);
/* Index of the first string equal to s, or -1. */
long strarray_find(const struct strarray *sa, const char *s);
/* Remove entry i (freeing it), keeping order.  No-op when out of range. */
void strarray_remove(struct strarray *sa, size_t i);
/* Sort in strcmp order. */
void strarray_sort(struct strarray *sa);
/* Split s at any byte of sep (empty fields dropped) and append the fields
 * to sa.  Returns 0, or -1 on allocation failure with sa unchanged. */
int strarray_split(struct strarray *sa, const char *s, const char *sep);
/* Join with sep into a new string the caller frees (NULL on failure).
 * An empty array gives "". */
char *strarray_join(const struct strarray *sa, const char *sep);
/* Free every string and the array; leave it empty. */
void strarray_fini(struct strarray *sa);

#endif
