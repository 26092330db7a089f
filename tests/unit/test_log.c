/*
 * test_log.c - unit tests of lib/log.c: log_escape (what is kept, what is
 * escaped, a cut never splits an escape) and the emitter (a line to
 * stderr whose %s carries CR, LF, other controls, 8-bit bytes and a NUL
 * comes out as one line of printable ASCII; an overlong line is cut;
 * held lines go out together at the release, in order, and a child's at
 * once); log_vformat and fmt_vsnprintf against vsnprintf.
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/fmt.h"
#include "lib/log.h"
#include "lib/procid.h"

static void expect_escape(const char *in, size_t len, const char *want)
{
    char out[256];
    size_t n;

    memset(out, 'Z', sizeof(out));         /* poison */
    n = log_escape(in, len, out, sizeof(out));
    assert_string_equal(out, want);
    assert_int_equal(n, strlen(want));
}

#define ESC(lit, want) expect_escape((lit), sizeof(lit) - 1, (want))

static void test_escape(void **state)
{
    (void)state;
    ESC("", "");
    ESC("plain text <a@b> key=<v> ~!", "plain text <a@b> key=<v> ~!");
    ESC("a\r\nb", "a\\r\\nb");
    ESC("tab\there", "tab\\there");
    ESC("\x01\x1b[31m\x7f", "\\x01\\x1b[31m\\x7f");
    ESC("caf\xc3\xa9", "caf\\xc3\\xa9");
    ESC("nul\0after", "nul\\x00after");
    ESC("back\\slash", "back\\slash");
}

static void test_escape_cut(void **state)
{
    char out[8];
    size_t n;

    (void)state;
    /* "ab" + "\r" needs 4 + NUL: fits in 8 */
    n = log_escape("ab\rcd", 5, out, sizeof(out));
    assert_string_equal(out, "ab\\rcd");
    assert_int_equal(n, 6);
    /* "\xff" needs 4: after "abc", 8 bytes hold it and the NUL, 7 not */
    n = log_escape("abc\xff", 4, out, sizeof(out));
    assert_string_equal(out, "abc\\xff");
    assert_int_equal(n, 7);
    n = log_escape("abc\xff", 4, out, 7);
    assert_string_equal(out, "abc");
    assert_int_equal(n, 3);
    n = log_escape("abcd", 4, out, 1);
    assert_string_equal(out, "");
    assert_int_equal(n, 0);
    assert_int_equal(log_escape("abcd", 4, out, 0), 0);
}

/* Run f with stderr going to a file; returns what was written. */
static char *capture_stderr(void (*f)(void), size_t *len_r)
{
    char path[] = "/tmp/test_log.XXXXXX";
    int fd = mkstemp(path), saved;
    FILE *fp;
    char *data;
    long size;

    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    saved = dup(2);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    f();
    fflush(stderr);
    assert_int_equal(dup2(saved, 2), 2);
    close(saved);
    fp = fdopen(fd, "rb");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    size = ftell(fp);
    assert_true(size >= 0);
    rewind(fp);
    data = malloc((size_t)size + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)size, fp), (size_t)size);
    data[size] = '\0';
    fclose(fp);
    *len_r = (size_t)size;
    return data;
}

static void emit_hostile(void)
{
    static const char user[] =
        "eve\r\nlmtpd[1]: info: lmtp: authenticated user=<root>\x1b[2J\xff";

    log_init("test_log", LOG_TO_STDERR);
    log_info("auth failed user=<%s> byte=<%c> end", user, 0);
}

static void check_one_clean_line(const char *data, size_t len)
{
    size_t i;

    assert_true(len > 0);
    assert_int_equal(data[len - 1], '\n');
    for (i = 0; i + 1 < len; i++)
        assert_true((unsigned char)data[i] >= 0x20 &&
                    (unsigned char)data[i] < 0x7f);
}

static void test_emit_escapes(void **state)
{
    size_t len;
    char *data;

    (void)state;
    data = capture_stderr(emit_hostile, &len);
    check_one_clean_line(data, len);
    assert_non_null(strstr(data, "info: auth failed user=<eve\\r\\nlmtpd[1]: "
                           "info: lmtp: authenticated user=<root>"
                           "\\x1b[2J\\xff> byte=<\\x00> end\n"));
    free(data);
}

static void emit_long(void)
{
    char big[5000];

    memset(big, 0xff, sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    log_init("test_log", LOG_TO_STDERR);
    log_warning("%s", big);
}

static void test_emit_long(void **state)
{
    size_t len;
    char *data, *p;

    (void)state;
    data = capture_stderr(emit_long, &len);
    check_one_clean_line(data, len);
    /* 2047 bytes formatted, each escaped in full */
    p = strstr(data, "warning: ");
    assert_non_null(p);
    p += strlen("warning: ");
    assert_int_equal(strlen(p), 2047 * 4 + 1);
    free(data);
}

static void emit_prefixed(void)
{
    log_init("/usr/libexec/lmtpd", LOG_TO_STDERR);
    log_set_prefix("cyrus");
    log_info("one");
    log_set_prefix("other");        /* a second prefix replaces the first */
    log_info("two");
    log_set_prefix("");             /* and none puts the plain name back */
    log_info("three");
}

static void test_prefix(void **state)
{
    size_t len;
    char *data;

    (void)state;
    data = capture_stderr(emit_prefixed, &len);
    assert_non_null(strstr(data, "cyrus/lmtpd["));
    assert_non_null(strstr(data, "]: info: one\n"));
    assert_non_null(strstr(data, "\nother/lmtpd["));
    assert_null(strstr(data, "other/cyrus"));
    assert_non_null(strstr(data, "\nlmtpd["));
    assert_non_null(strstr(data, "]: info: three\n"));
    free(data);
}

/* stderr's size so far (the capture's file) */
static long stderr_size(void)
{
    off_t end = lseek(2, 0, SEEK_END);

    return (long)end;
}

static void emit_held(void)
{
    long before;
    pid_t pid;
    int status;
    char big[3000];

    log_init("test_log", LOG_TO_STDERR);
    log_hold();
    before = stderr_size();
    log_info("held one");
    log_warning("held two");
    /* nothing written while held */
    assert_int_equal(stderr_size(), before);
    /* a child forked meanwhile writes its line at once */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        log_info("child line");
        _exit(stderr_size() > before ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    before = stderr_size();
    /* more than the 16 KiB held: the earlier lines go out first */
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    for (int i = 0; i < 8; i++)
        log_info("big %d %s", i, big);
    assert_true(stderr_size() > before);
    log_info("held last");
    log_release();
    log_info("after release");
}

static void test_hold(void **state)
{
    size_t len;
    char *data, *one, *two, *child, *b0, *b7, *last, *after;

    (void)state;
    data = capture_stderr(emit_held, &len);
    one = strstr(data, "info: held one\n");
    two = strstr(data, "warning: held two\n");
    child = strstr(data, "info: child line\n");
    b0 = strstr(data, "info: big 0 ");
    b7 = strstr(data, "info: big 7 ");
    last = strstr(data, "info: held last\n");
    after = strstr(data, "info: after release\n");
    assert_non_null(one);
    assert_non_null(two);
    assert_non_null(child);
    assert_non_null(b0);
    assert_non_null(b7);
    assert_non_null(last);
    assert_non_null(after);
    /* the child's line first (written at once), then the held ones in
     * order, then the line after the release */
    assert_true(child < one && one < two && two < b0 && b0 < b7 &&
                b7 < last && last < after);
    free(data);
}

/* log_vformat gives what vsnprintf gives, for the conversions it makes
 * itself and for those it hands on, cut or not */
static void __attribute__((format(printf, 2, 3)))
expect_format(size_t outlen, const char *fmt, ...)
{
    char got[512], want[512], full[512];
    va_list ap, aq, ar;
    size_t n;
    int r, f;

    assert_true(outlen <= sizeof(got));
    memset(got, 'Z', sizeof(got));
    memset(want, 'Z', sizeof(want));
    memset(full, 'Z', sizeof(full));
    va_start(ap, fmt);
    va_copy(aq, ap);
    va_copy(ar, ap);
    n = log_vformat(got, outlen, fmt, ap);
    r = vsnprintf(want, outlen, fmt, aq);
    f = fmt_vsnprintf(outlen ? full : NULL, outlen, fmt, ar);
    va_end(ar);
    va_end(aq);
    va_end(ap);
    assert_true(r >= 0);
    /* fmt_vsnprintf: vsnprintf's result, the whole length returned */
    assert_int_equal(f, r);
    if (outlen)
        assert_memory_equal(full, want, (size_t)r < outlen ? (size_t)r + 1
                                                           : outlen);
    if (outlen < sizeof(full))
        assert_int_equal(full[outlen], 'Z');   /* nothing past outlen */
    if (!outlen) {
        assert_int_equal(n, 0);
        return;
    }
    assert_int_equal(n, (size_t)r < outlen ? (size_t)r : outlen - 1);
    assert_memory_equal(got, want, n + 1);   /* the NUL too */
    assert_int_equal(got[n + 1], 'Z');      /* nothing past it */
}

static void test_format(void **state)
{
    static const size_t lens[] = { 512, 40, 17, 9, 2, 1, 0 };
    const char *volatile nul = NULL;   /* glibc's "(null)" */
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        size_t l = lens[i];

        expect_format(l, "plain text, no conversion");
        expect_format(l, "lmtp: sieve rcpt=<%s> user=<%s> script=<%s> "
                      "result=<%s> loaded=<%lu> actions=<%s>",
                      "u1@example.org", "u1", "bench.script", "ok", 0UL,
                      "fileinto \"INBOX\"");
        expect_format(l, "%d %i %u %x", -17, 2147483647, 4294967295U,
                      0xbeefU);
        expect_format(l, "%d|%ld|%lld", (int)(-2147483647 - 1),
                      -9223372036854775807L - 1,
                      -9223372036854775807LL - 1);
        expect_format(l, "%lu %llu %zu %zd %jd %ju %lx", 1UL << 40,
                      18446744073709551615ULL, (size_t)12345,
                      (ssize_t)-5, (intmax_t)-7, (uintmax_t)8,
                      0xdeadbeefUL);
        expect_format(l, "%d%d%u", 0, 0, 0U);
        expect_format(l, "delay=<%llu.%03llu> %03d %05d %02x %01u %09lu",
                      12ULL, 7ULL, -4, -31, 0xaU, 0U, 123456789UL);
        expect_format(l, "%03llu %02d %04i", 12345ULL, 100, -12345);
        /* the Received header's id (lmtp.c) */
        expect_format(l, "id %lx%05lx%04lx;", 0x6a3f2c1bUL, 0x1f2UL,
                      0xfffffUL & 0xffffUL);
        expect_format(l, "[IPv6:%.*s]", 3, "::1]:25");
        expect_format(l, "a%cb%cc", 'x', 0);   /* a NUL kept, counted */
        expect_format(l, "<%.*s><%.*s><%.*s>", 3, "abcdef", 0, "abc", -1,
                      "whole");
        expect_format(l, "100%% of %s%%", "it");
        expect_format(l, "[%s] [%.*s] [%.*s]", nul, 3, nul, 6, nul);
        expect_format(l, "%s", "");
        /* handed to vsnprintf: flags, widths, precisions, conversions */
        expect_format(l, "%5d|%-6s|%08.3f|%hhu|%010x|%.2d", 42, "ab", 3.25,
                      (unsigned char)200, 10U, 7);
        expect_format(l, "before %s then %p", "x", (void *)&l);
        expect_format(l, "%s %s %s %s %s %s %s %s", "one", "two", "three",
                      "four", "five", "six", "seven", "eight");
    }
    {
        char out[16];

        assert_int_equal(fmt_snprintf(out, sizeof(out), " uid=<%u>", 42U), 9);
        assert_string_equal(out, " uid=<42>");
        assert_int_equal(fmt_snprintf(out, sizeof(out), " mailbox=<%.*s>",
                                      256, "user.someone.long"), 28);
        assert_string_equal(out, " mailbox=<user.");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape),
        cmocka_unit_test(test_escape_cut),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_emit_escapes),
        cmocka_unit_test(test_emit_long),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_hold),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
