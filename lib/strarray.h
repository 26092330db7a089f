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

/* Append a copy of s.  Returns 0, or -1 on allocation failure. */
int strarray_append(struct strarray *sa, const char *s);
/* Append s itself (the array takes ownership). */
int strarray_appendm(struct strarray *sa, char *s);
/* The i-th string, or NULL when out of range. */
const char *strarray_nth(const struct strarray *sa, size_t i);
/* Index of the first string equal to s, or -1. */
long strarray_find(const struct strarray *sa, const char *s);
/* Remove entry i (freeing it), keeping order. */
void strarray_remove(struct strarray *sa, size_t i);
/* Sort in strcmp order. */
void strarray_sort(struct strarray *sa);
/* Split s at any byte of sep (empty fields dropped) into a new array
 * appended to sa.  Returns 0 or -1. */
int strarray_split(struct strarray *sa, const char *s, const char *sep);
/* Join with sep into a new string the caller frees (NULL on failure). */
char *strarray_join(const struct strarray *sa, const char *sep);
/* Free every string and the array; leave it empty. */
void strarray_fini(struct strarray *sa);

#endif
