/*
 * testhelp.h - helpers shared by the cmocka test programs.
 */
#ifndef TESTS_TESTHELP_H
#define TESTS_TESTHELP_H

#include <stddef.h>

/* A fresh empty directory under $TEST_TMPDIR (default: tests/tmp in the
 * build tree, i.e. on the real disk, not tmpfs).  The caller frees the
 * string; th_rmrf() removes the tree. */
char *th_mkdtemp(const char *tag);

/* Remove a directory tree (like rm -rf). */
void th_rmrf(const char *path);

/* dir + "/" + name, malloc'd. */
char *th_path(const char *dir, const char *name);

/* The backend names every conformance case runs against, NULL-terminated:
 * the distinct rows of the cyrusdb registry (aliases such as "berkeley"
 * left out).  $TEST_BACKENDS (space-separated) narrows the list. */
const char *const *th_backends(void);

/* Fill buf with len deterministic pseudo-random bytes from seed. */
void th_fill(void *buf, size_t len, unsigned seed);

#endif
