/*
 * test_strarray.c - unit tests of lib/strarray.c.
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/strarray.h"

/* Invariants: data NULL-terminated once allocated, alloc > count. */
static void check_invariant(const struct strarray *sa)
{
    size_t i;

    if (!sa->data) {
        assert_int_equal(sa->count, 0);
        assert_int_equal(sa->alloc, 0);
        return;
    }
    assert_true(sa->alloc > sa->count);
    assert_null(sa->data[sa->count]);
    for (i = 0; i < sa->count; i++)
        assert_non_null(sa->data[i]);
}

static void test_empty(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char *j;
    (void)state;

    assert_null(strarray_nth(&sa, 0));
    assert_int_equal(strarray_find(&sa, "x"), -1);
    strarray_remove(&sa, 0);
    strarray_sort(&sa);
    j = strarray_join(&sa, ",");
    assert_non_null(j);
    assert_string_equal(j, "");
    free(j);
    check_invariant(&sa);
    strarray_fini(&sa);
    strarray_fini(&sa);
    check_invariant(&sa);
}

static void test_append_copies(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char src[16] = "alpha";
    (void)state;

    assert_int_equal(strarray_append(&sa, src), 0);
    strcpy(src, "changed");          /* the array kept its own copy */
    assert_string_equal(strarray_nth(&sa, 0), "alpha");
    assert_ptr_not_equal(strarray_nth(&sa, 0), src);
    assert_int_equal(strarray_append(&sa, ""), 0);
    assert_int_equal(sa.count, 2);
    assert_string_equal(strarray_nth(&sa, 1), "");
    assert_null(strarray_nth(&sa, 2));
    assert_null(strarray_nth(&sa, SIZE_MAX));
    check_invariant(&sa);

    errno = 0;
    assert_int_equal(strarray_append(&sa, NULL), -1);
    assert_int_equal(sa.count, 2);
    check_invariant(&sa);
    strarray_fini(&sa);
}

static void test_appendm_owns(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char *s = strdup("mine");
    (void)state;

    assert_non_null(s);
    assert_int_equal(strarray_appendm(&sa, s), 0);
    assert_ptr_equal(strarray_nth(&sa, 0), s);   /* no copy */
    /* NULL (a failed strdup) is refused, array unchanged */
    assert_int_equal(strarray_appendm(&sa, NULL), -1);
    assert_int_equal(sa.count, 1);
    check_invariant(&sa);
    strarray_fini(&sa);                 /* frees s: the sanitizer checks */
}

static void test_many(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char name[32];
    size_t i;
    (void)state;

    for (i = 0; i < 10000; i++) {
        snprintf(name, sizeof(name), "item%zu", i);
        assert_int_equal(strarray_append(&sa, name), 0);
        if (i % 997 == 0)
            check_invariant(&sa);
    }
    assert_int_equal(sa.count, 10000);
    check_invariant(&sa);
    for (i = 0; i < 10000; i += 333) {
        snprintf(name, sizeof(name), "item%zu", i);
        assert_string_equal(strarray_nth(&sa, i), name);
        assert_int_equal(strarray_find(&sa, name), (long)i);
    }
    assert_int_equal(strarray_find(&sa, "item10000"), -1);
    strarray_fini(&sa);
    check_invariant(&sa);
}

static void test_find_first(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    (void)state;

    assert_int_equal(strarray_append(&sa, "a"), 0);
    assert_int_equal(strarray_append(&sa, "b"), 0);
    assert_int_equal(strarray_append(&sa, "a"), 0);
    assert_int_equal(strarray_find(&sa, "a"), 0);
    assert_int_equal(strarray_find(&sa, "b"), 1);
    assert_int_equal(strarray_find(&sa, "A"), -1);   /* exact match */
    assert_int_equal(strarray_find(&sa, ""), -1);
    assert_int_equal(strarray_find(&sa, NULL), -1);
    strarray_fini(&sa);
}

static void test_remove(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char *j;
    (void)state;

    assert_int_equal(strarray_split(&sa, "a b c d e", " "), 0);
    strarray_remove(&sa, 0);            /* first */
    strarray_remove(&sa, 3);            /* last */
    strarray_remove(&sa, 1);            /* middle */
    strarray_remove(&sa, 2);            /* out of range: no-op */
    strarray_remove(&sa, SIZE_MAX);
    check_invariant(&sa);
    j = strarray_join(&sa, ",");
    assert_string_equal(j, "b,d");
    free(j);
    strarray_remove(&sa, 1);
    strarray_remove(&sa, 0);
    assert_int_equal(sa.count, 0);
    check_invariant(&sa);
    /* reusable after emptying */
    assert_int_equal(strarray_append(&sa, "z"), 0);
    assert_string_equal(strarray_nth(&sa, 0), "z");
    check_invariant(&sa);
    strarray_fini(&sa);
}

static void test_sort(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char *j;
    (void)state;

    assert_int_equal(strarray_split(&sa, "pear apple Zebra banana apple 10 9",
                                    " "), 0);
    strarray_sort(&sa);
    check_invariant(&sa);
    j = strarray_join(&sa, " ");
    /* strcmp order: bytes, so digits < upper case < lower case */
    assert_string_equal(j, "10 9 Zebra apple apple banana pear");
    free(j);
    strarray_fini(&sa);

    assert_int_equal(strarray_append(&sa, "only"), 0);
    strarray_sort(&sa);
    assert_string_equal(strarray_nth(&sa, 0), "only");
    strarray_fini(&sa);
}

static void test_split(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char *j;
    (void)state;

    /* several separator bytes, runs of them and ends: empty fields dropped */
    assert_int_equal(strarray_split(&sa, ",,a, b;;c ,", ", ;"), 0);
    assert_int_equal(sa.count, 3);
    assert_string_equal(strarray_nth(&sa, 0), "a");
    assert_string_equal(strarray_nth(&sa, 1), "b");
    assert_string_equal(strarray_nth(&sa, 2), "c");
    check_invariant(&sa);

    /* appends to what is there */
    assert_int_equal(strarray_split(&sa, "d", " "), 0);
    assert_int_equal(sa.count, 4);
    assert_string_equal(strarray_nth(&sa, 3), "d");

    /* nothing but separators, or nothing at all: no fields */
    assert_int_equal(strarray_split(&sa, " ,, ", ", "), 0);
    assert_int_equal(strarray_split(&sa, "", ", "), 0);
    assert_int_equal(sa.count, 4);

    /* empty separator set: the whole string is one field */
    assert_int_equal(strarray_split(&sa, "x y", ""), 0);
    assert_int_equal(sa.count, 5);
    assert_string_equal(strarray_nth(&sa, 4), "x y");

    j = strarray_join(&sa, "|");
    assert_string_equal(j, "a|b|c|d|x y");
    free(j);

    assert_int_equal(strarray_split(&sa, NULL, " "), -1);
    assert_int_equal(sa.count, 5);
    check_invariant(&sa);
    strarray_fini(&sa);
}

static void test_join(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char *j;
    (void)state;

    assert_int_equal(strarray_append(&sa, "one"), 0);
    j = strarray_join(&sa, ", ");
    assert_string_equal(j, "one");
    free(j);
    assert_int_equal(strarray_append(&sa, ""), 0);
    assert_int_equal(strarray_append(&sa, "three"), 0);
    j = strarray_join(&sa, ", ");
    assert_string_equal(j, "one, , three");
    free(j);
    j = strarray_join(&sa, "");
    assert_string_equal(j, "onethree");
    free(j);
    j = strarray_join(&sa, NULL);       /* NULL separator: none */
    assert_string_equal(j, "onethree");
    free(j);
    strarray_fini(&sa);
}

/* data is walkable like argv */
static void test_argv_walk(void **state)
{
    struct strarray sa = STRARRAY_INITIALIZER;
    char **p;
    size_t n = 0;
    (void)state;

    assert_int_equal(strarray_split(&sa, "x y z", " "), 0);
    for (p = sa.data; *p; p++)
        n++;
    assert_int_equal(n, 3);
    strarray_remove(&sa, 1);
    n = 0;
    for (p = sa.data; *p; p++)
        n++;
    assert_int_equal(n, 2);
    assert_string_equal(sa.data[1], "z");
    strarray_fini(&sa);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_append_copies),
        cmocka_unit_test(test_appendm_owns),
        cmocka_unit_test(test_many),
        cmocka_unit_test(test_find_first),
        cmocka_unit_test(test_remove),
        cmocka_unit_test(test_sort),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_join),
        cmocka_unit_test(test_argv_walk),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
