/*
 * test_buf.c - unit tests of lib/buf.c: growth, the maximum, size overflow,
 * the spare NUL byte, NUL bytes inside the data, printf growth, and
 * handing the memory over (buf_release) or freeing it.
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

#include "lib/buf.h"
#include "tests/testhelp.h"

/* Under AddressSanitizer an allocation that cannot succeed aborts the
 * program unless told to return NULL as the C library does; the
 * out-of-memory test needs the NULL. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}

/* The invariant every test checks after every change. */
static void check_invariant(struct buf *b)
{
    if (!b->s) {
        assert_int_equal(b->len, 0);
        assert_int_equal(b->alloc, 0);
        return;
    }
    assert_true(b->alloc > b->len);
    if (b->max)
        assert_true(b->len <= b->max);
}

/* buf_cstring must terminate in place: no growth, same pointer. */
static void check_cstring_in_place(struct buf *b)
{
    char *before = b->s;
    size_t alloc = b->alloc;
    const char *c;

    if (!b->s)
        return;
    b->s[b->len] = 'X';     /* poison the spare byte */
    c = buf_cstring(b);
    assert_ptr_equal(c, before);
    assert_ptr_equal(b->s, before);
    assert_int_equal(b->alloc, alloc);
    assert_int_equal(c[b->len], '\0');
}

static void test_empty(void **state)
{
    struct buf b = BUF_INITIALIZER;
    const char *c;
    (void)state;

    c = buf_cstring(&b);
    assert_non_null(c);
    assert_string_equal(c, "");
    assert_null(b.s);           /* a view of an empty buffer allocates nothing */
    buf_truncate(&b, 10);
    buf_reset(&b);
    check_invariant(&b);
    assert_int_equal(buf_ensure(&b, 0), 0);
    assert_non_null(b.s);       /* room for the NUL at least */
    check_invariant(&b);
    assert_string_equal(buf_cstring(&b), "");
    buf_free(&b);
    check_invariant(&b);
}

static void test_append_kinds(void **state)
{
    struct buf b = BUF_INITIALIZER;
    (void)state;

    assert_int_equal(buf_append(&b, "abc", 3), 0);
    assert_int_equal(buf_appendcstr(&b, "def"), 0);
    assert_int_equal(buf_putc(&b, 'g'), 0);
    assert_int_equal(buf_putc(&b, 0x1ff), 0);     /* cut to a byte */
    assert_int_equal(buf_append(&b, NULL, 0), 0); /* nothing, no read */
    assert_int_equal(buf_appendcstr(&b, ""), 0);
    assert_int_equal(b.len, 8);
    assert_memory_equal(b.s, "abcdefg\xff", 8);
    check_invariant(&b);
    check_cstring_in_place(&b);
    assert_string_equal(buf_cstring(&b), "abcdefg\xff");
    buf_free(&b);
}

static void test_nul_inside(void **state)
{
    struct buf b = BUF_INITIALIZER;
    (void)state;

    assert_int_equal(buf_append(&b, "a\0b\0c", 5), 0);
    assert_int_equal(buf_putc(&b, '\0'), 0);
    assert_int_equal(b.len, 6);
    assert_memory_equal(b.s, "a\0b\0c\0", 6);
    /* the C-string view stops at the first NUL, len does not */
    assert_int_equal(strlen(buf_cstring(&b)), 1);
    assert_int_equal(b.len, 6);
    check_cstring_in_place(&b);
    assert_int_equal(buf_setmap(&b, "\0\0\0", 3), 0);
    assert_int_equal(b.len, 3);
    assert_memory_equal(b.s, "\0\0\0", 4);
    assert_int_equal(buf_printf(&b, "%c%s", 0, "z"), 0);
    assert_int_equal(b.len, 5);
    assert_memory_equal(b.s, "\0\0\0\0z", 6);
    buf_free(&b);
}

/* Many appends of every small size: the spare byte is always there. */
static void test_nul_spare(void **state)
{
    struct buf b = BUF_INITIALIZER;
    unsigned char data[300];
    unsigned char *expect;
    size_t total = 0, n;
    (void)state;

    th_fill(data, sizeof(data), 1);
    expect = malloc(300 * 301 / 2);
    assert_non_null(expect);
    for (n = 0; n < 300; n++) {
        assert_int_equal(buf_append(&b, data, n), 0);
        memcpy(expect + total, data, n);
        total += n;
        assert_int_equal(b.len, total);
        check_invariant(&b);
        check_cstring_in_place(&b);
    }
    assert_memory_equal(b.s, expect, total);
    /* after truncation the NUL goes to the new end */
    buf_truncate(&b, 17);
    assert_int_equal(b.len, 17);
    check_cstring_in_place(&b);
    assert_memory_equal(b.s, expect, 17);
    free(expect);
    buf_free(&b);
}

/* Growth to a megabyte in pieces, contents intact. */
static void test_growth_large(void **state)
{
    struct buf b = BUF_INITIALIZER;
    size_t total = 1 << 20, piece = 4093, done = 0;
    unsigned char *data = malloc(total);
    (void)state;

    assert_non_null(data);
    th_fill(data, total, 7);
    while (done < total) {
        size_t n = total - done < piece ? total - done : piece;
        assert_int_equal(buf_append(&b, data + done, n), 0);
        done += n;
        check_invariant(&b);
    }
    assert_int_equal(b.len, total);
    assert_memory_equal(b.s, data, total);
    /* growth is geometric, not one byte at a time */
    assert_true(b.alloc < 4 * total);
    check_cstring_in_place(&b);
    free(data);
    buf_free(&b);
}

/* The maximum is reachable exactly and never passed; a refused call
 * changes nothing. */
static void test_max(void **state)
{
    struct buf b = BUF_INITIALIZER;
    char big[200];
    char *before;
    (void)state;

    memset(big, 'm', sizeof(big));
    buf_set_max(&b, 100);
    assert_int_equal(buf_append(&b, big, 60), 0);
    errno = 0;
    assert_int_equal(buf_append(&b, big, 41), -1);
    assert_int_equal(errno, EOVERFLOW);
    assert_int_equal(b.len, 60);
    assert_int_equal(buf_append(&b, big, 40), 0);
    assert_int_equal(b.len, 100);
    assert_true(b.alloc <= 101);      /* never allocates past max + NUL */
    check_invariant(&b);
    check_cstring_in_place(&b);

    before = b.s;
    errno = 0;
    assert_int_equal(buf_putc(&b, 'x'), -1);
    assert_int_equal(errno, EOVERFLOW);
    assert_int_equal(buf_appendcstr(&b, "x"), -1);
    assert_int_equal(buf_printf(&b, "%d", 1), -1);
    assert_int_equal(buf_ensure(&b, 1), -1);
    assert_int_equal(buf_ensure(&b, 0), 0);
    assert_int_equal(buf_append(&b, "", 0), 0);
    assert_int_equal(b.len, 100);
    assert_ptr_equal(b.s, before);
    assert_memory_equal(b.s, big, 100);
    check_cstring_in_place(&b);

    /* setmap past max fails and keeps the old contents */
    errno = 0;
    assert_int_equal(buf_setmap(&b, big, 101), -1);
    assert_int_equal(errno, EOVERFLOW);
    assert_int_equal(b.len, 100);
    assert_memory_equal(b.s, big, 100);
    assert_int_equal(buf_setcstr(&b, "short"), 0);
    assert_string_equal(buf_cstring(&b), "short");

    /* a tiny max */
    buf_free(&b);
    buf_set_max(&b, 1);
    assert_int_equal(buf_putc(&b, 'a'), 0);
    assert_int_equal(buf_putc(&b, 'b'), -1);
    assert_int_equal(b.len, 1);
    assert_int_equal(b.alloc, 2);
    assert_string_equal(buf_cstring(&b), "a");
    buf_free(&b);

    /* max 0 means the default */
    buf_set_max(&b, 0);
    errno = 0;
    assert_int_equal(buf_ensure(&b, BUF_DEFAULT_MAX + 1), -1);
    assert_int_equal(errno, EOVERFLOW);
    assert_null(b.s);
    buf_free(&b);
}

/* Lowering the max below the current length refuses further growth. */
static void test_max_lowered(void **state)
{
    struct buf b = BUF_INITIALIZER;
    (void)state;

    assert_int_equal(buf_setcstr(&b, "0123456789"), 0);
    buf_set_max(&b, 5);
    assert_int_equal(buf_putc(&b, 'x'), -1);
    assert_int_equal(buf_ensure(&b, 0), -1);
    assert_int_equal(b.len, 10);
    assert_string_equal(buf_cstring(&b), "0123456789");
    /* shrinking within the max works again */
    assert_int_equal(buf_setcstr(&b, "abc"), 0);
    assert_int_equal(buf_putc(&b, 'd'), 0);
    assert_string_equal(buf_cstring(&b), "abcd");
    buf_free(&b);
}

/* Sizes that would wrap size_t arithmetic are refused before any copy:
 * `data` here is far shorter than the length passed, so an unchecked
 * memcpy would crash (or be caught by the sanitizers). */
static void test_size_overflow(void **state)
{
    struct buf b = BUF_INITIALIZER;
    size_t maxes[] = { 0, 1000, SIZE_MAX / 2, SIZE_MAX - 1, SIZE_MAX };
    size_t i;
    (void)state;

    for (i = 0; i < sizeof(maxes) / sizeof(maxes[0]); i++) {
        buf_set_max(&b, maxes[i]);
        assert_int_equal(buf_setcstr(&b, "0123456789"), 0);

        errno = 0;
        assert_int_equal(buf_ensure(&b, SIZE_MAX), -1);
        assert_int_equal(errno, EOVERFLOW);
        errno = 0;
        assert_int_equal(buf_ensure(&b, SIZE_MAX - 10), -1);
        assert_int_equal(errno, EOVERFLOW);
        errno = 0;
        assert_int_equal(buf_ensure(&b, SIZE_MAX - 9), -1);
        assert_int_equal(errno, EOVERFLOW);
        assert_int_equal(buf_append(&b, "x", SIZE_MAX), -1);
        assert_int_equal(buf_append(&b, "x", SIZE_MAX - 10), -1);
        assert_int_equal(buf_append(&b, "x", SIZE_MAX - 5), -1);
        assert_int_equal(buf_setmap(&b, "x", SIZE_MAX), -1);

        assert_int_equal(b.len, 10);
        assert_string_equal(buf_cstring(&b), "0123456789");
        check_invariant(&b);
        buf_free(&b);
    }
}

/* An allocation that fails leaves the buffer as it was, errno ENOMEM. */
static void test_out_of_memory(void **state)
{
    struct buf b = BUF_INITIALIZER;
    char *before;
    size_t alloc;
    (void)state;

    buf_set_max(&b, SIZE_MAX - 1);
    assert_int_equal(buf_setcstr(&b, "keep me"), 0);
    before = b.s;
    alloc = b.alloc;
    errno = 0;
    /* far beyond what any allocator grants (more than PTRDIFF_MAX) */
    assert_int_equal(buf_ensure(&b, SIZE_MAX / 2 + 10), -1);
    assert_int_equal(errno, ENOMEM);
    assert_ptr_equal(b.s, before);
    assert_int_equal(b.alloc, alloc);
    assert_int_equal(b.len, 7);
    assert_string_equal(buf_cstring(&b), "keep me");
    assert_int_equal(buf_putc(&b, '!'), 0);
    assert_string_equal(buf_cstring(&b), "keep me!");
    buf_free(&b);
}

static int call_vprintf(struct buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int call_vprintf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    int r;

    va_start(ap, fmt);
    r = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return r;
}

static void test_printf_growth(void **state)
{
    struct buf b = BUF_INITIALIZER;
    char *expect, *big;
    size_t i;
    (void)state;

    assert_int_equal(buf_printf(&b, "%s", ""), 0);
    assert_int_equal(b.len, 0);
    check_invariant(&b);
    assert_int_equal(buf_printf(&b, "n=%d s=%s", 42, "x"), 0);
    assert_string_equal(buf_cstring(&b), "n=42 s=x");

    /* one call far larger than the first allocation */
    assert_int_equal(buf_printf(&b, "%0*d", 10000, 7), 0);
    assert_int_equal(b.len, 8 + 10000);
    assert_int_equal(b.s[8], '0');
    assert_int_equal(b.s[8 + 9998], '0');
    assert_int_equal(b.s[8 + 9999], '7');
    check_invariant(&b);
    check_cstring_in_place(&b);

    /* many calls, each crossing allocation boundaries, via vprintf too */
    buf_reset(&b);
    big = malloc(5001);
    expect = malloc(50 * 5010 + 1);
    assert_non_null(big);
    assert_non_null(expect);
    memset(big, 'q', 5000);
    big[5000] = '\0';
    expect[0] = '\0';
    for (i = 0; i < 50; i++) {
        char head[32];
        snprintf(head, sizeof(head), "[%zu]", i);
        strcat(expect, head);
        strcat(expect, big + i);
        if (i % 2)
            assert_int_equal(buf_printf(&b, "[%zu]%s", i, big + i), 0);
        else
            assert_int_equal(call_vprintf(&b, "[%zu]%s", i, big + i), 0);
        check_invariant(&b);
    }
    assert_int_equal(b.len, strlen(expect));
    assert_string_equal(buf_cstring(&b), expect);
    free(big);
    free(expect);

    /* printf against the maximum: exact fit succeeds, one over fails */
    buf_free(&b);
    buf_set_max(&b, 20);
    assert_int_equal(buf_printf(&b, "%s", "0123456789"), 0);
    errno = 0;
    assert_int_equal(call_vprintf(&b, "%s!", "0123456789"), -1);
    assert_int_equal(errno, EOVERFLOW);
    assert_string_equal(buf_cstring(&b), "0123456789");
    assert_int_equal(buf_printf(&b, "%010d", 5), 0);
    assert_int_equal(b.len, 20);
    assert_string_equal(buf_cstring(&b), "01234567890000000005");
    check_invariant(&b);
    buf_free(&b);
}

static void test_set_truncate_reset(void **state)
{
    struct buf b = BUF_INITIALIZER;
    char *mem;
    size_t alloc;
    (void)state;

    assert_int_equal(buf_setcstr(&b, "hello world"), 0);
    assert_int_equal(buf_setmap(&b, "bye", 3), 0);
    assert_int_equal(b.len, 3);
    assert_string_equal(buf_cstring(&b), "bye");
    buf_truncate(&b, 100);              /* longer: no-op */
    assert_int_equal(b.len, 3);
    buf_truncate(&b, 1);
    assert_string_equal(buf_cstring(&b), "b");
    mem = b.s;
    alloc = b.alloc;
    buf_reset(&b);
    assert_int_equal(b.len, 0);
    assert_ptr_equal(b.s, mem);         /* memory kept */
    assert_int_equal(b.alloc, alloc);
    assert_string_equal(buf_cstring(&b), "");
    assert_int_equal(buf_setmap(&b, "", 0), 0);
    assert_string_equal(buf_cstring(&b), "");
    buf_free(&b);
}

/* Appending a buffer's own bytes to itself, across a reallocation, and
 * replacing the contents by a piece of themselves. */
static void test_self_reference(void **state)
{
    struct buf b = BUF_INITIALIZER;
    size_t i;
    (void)state;

    assert_int_equal(buf_setcstr(&b, "ab"), 0);
    for (i = 0; i < 12; i++) {
        assert_int_equal(buf_append(&b, b.s, b.len), 0);
        check_invariant(&b);
    }
    assert_int_equal(b.len, 2u << 12);
    for (i = 0; i < b.len; i++)
        assert_int_equal(b.s[i], i % 2 ? 'b' : 'a');

    assert_int_equal(buf_setcstr(&b, "0123456789"), 0);
    assert_int_equal(buf_setmap(&b, b.s + 3, 5), 0);
    assert_string_equal(buf_cstring(&b), "34567");
    assert_int_equal(buf_appendcstr(&b, buf_cstring(&b)), 0);
    assert_string_equal(buf_cstring(&b), "3456734567");
    buf_free(&b);
}

static void test_release(void **state)
{
    struct buf b = BUF_INITIALIZER;
    char *s;
    (void)state;

    /* never allocated: a fresh "" the caller frees */
    s = buf_release(&b);
    assert_non_null(s);
    assert_string_equal(s, "");
    free(s);
    check_invariant(&b);

    /* contents with NUL inside: all bytes plus the terminator */
    assert_int_equal(buf_append(&b, "x\0y", 3), 0);
    s = buf_release(&b);
    assert_memory_equal(s, "x\0y\0", 4);
    assert_null(b.s);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.alloc, 0);
    free(s);

    /* reusable afterwards, and a full allocation is terminated */
    buf_set_max(&b, 8);
    assert_int_equal(buf_append(&b, "12345678", 8), 0);
    assert_int_equal(b.alloc, 9);
    s = buf_release(&b);
    assert_string_equal(s, "12345678");
    free(s);
    assert_int_equal(buf_setcstr(&b, "again"), 0);
    assert_string_equal(buf_cstring(&b), "again");
    buf_free(&b);
}

static void test_free_reuse(void **state)
{
    struct buf b = BUF_INITIALIZER;
    (void)state;

    buf_free(&b);                       /* never allocated */
    check_invariant(&b);
    assert_int_equal(buf_setcstr(&b, "data"), 0);
    buf_free(&b);
    assert_null(b.s);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.alloc, 0);
    buf_free(&b);                       /* twice */
    assert_string_equal(buf_cstring(&b), "");
    assert_int_equal(buf_putc(&b, 'z'), 0);
    assert_string_equal(buf_cstring(&b), "z");
    buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_append_kinds),
        cmocka_unit_test(test_nul_inside),
        cmocka_unit_test(test_nul_spare),
        cmocka_unit_test(test_growth_large),
        cmocka_unit_test(test_max),
        cmocka_unit_test(test_max_lowered),
        cmocka_unit_test(test_size_overflow),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_printf_growth),
        cmocka_unit_test(test_set_truncate_reset),
        cmocka_unit_test(test_self_reference),
        cmocka_unit_test(test_release),
        cmocka_unit_test(test_free_reuse),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
