/*
 * test_fsutil.c - fs_stat_id() and fs_fstat_id(): the identity and size
 * of a file, a directory and a descriptor as stat() and fstat() report
 * them, the times left zero (they are not asked for), and the errors of
 * stat() for a missing path and a closed descriptor.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/fsutil.h"
#include "tests/testhelp.h"

static void assert_same_id(const struct stat *a, const struct stat *b)
{
    assert_true(a->st_dev == b->st_dev);
    assert_true(a->st_ino == b->st_ino);
    assert_int_equal(a->st_mode, b->st_mode);
    assert_int_equal(a->st_nlink, b->st_nlink);
    assert_int_equal(a->st_uid, b->st_uid);
    assert_int_equal(a->st_gid, b->st_gid);
    assert_int_equal(a->st_size, b->st_size);
    assert_int_equal(a->st_blocks, b->st_blocks);
}

static void assert_no_times(const struct stat *st)
{
    assert_int_equal(st->st_mtim.tv_sec, 0);
    assert_int_equal(st->st_mtim.tv_nsec, 0);
    assert_int_equal(st->st_ctim.tv_sec, 0);
    assert_int_equal(st->st_atim.tv_sec, 0);
}

static void test_stat_id_file_dir_fd(void **state)
{
    char *dir = th_mkdtemp("fsutil"), *f = th_path(dir, "file"),
         *l = th_path(dir, "link");
    struct stat want, got;
    int fd;
    (void)state;

    fd = open(f, O_RDWR | O_CREAT | O_EXCL, 0640);
    assert_true(fd >= 0);
    assert_int_equal(fs_write_all(fd, "0123456789", 10), 0);
    assert_int_equal(link(f, l), 0);        /* nlink 2 */

    assert_int_equal(stat(f, &want), 0);
    memset(&got, 0x5a, sizeof(got));
    assert_int_equal(fs_stat_id(f, &got), 0);
    assert_same_id(&got, &want);
    assert_int_equal(got.st_size, 10);
    assert_int_equal(got.st_nlink, 2);
    assert_no_times(&got);

    memset(&got, 0x5a, sizeof(got));
    assert_int_equal(fs_fstat_id(fd, &got), 0);
    assert_same_id(&got, &want);
    assert_no_times(&got);

    /* the size follows the file */
    assert_int_equal(fs_pwrite_all(fd, "x", 1, 4095), 0);
    assert_int_equal(fs_fstat_id(fd, &got), 0);
    assert_int_equal(got.st_size, 4096);

    assert_int_equal(stat(dir, &want), 0);
    assert_int_equal(fs_stat_id(dir, &got), 0);
    assert_same_id(&got, &want);
    assert_true(S_ISDIR(got.st_mode));

    assert_int_equal(close(fd), 0);
    th_rmrf(dir);
    free(l);
    free(f);
    free(dir);
}

static void test_stat_id_errors(void **state)
{
    char *dir = th_mkdtemp("fsutil"), *f = th_path(dir, "missing");
    struct stat got;
    int fd;
    (void)state;

    errno = 0;
    assert_int_equal(fs_stat_id(f, &got), -1);
    assert_int_equal(errno, ENOENT);

    fd = open(dir, O_RDONLY | O_DIRECTORY);
    assert_true(fd >= 0);
    assert_int_equal(close(fd), 0);
    errno = 0;
    assert_int_equal(fs_fstat_id(fd, &got), -1);
    assert_int_equal(errno, EBADF);

    th_rmrf(dir);
    free(f);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stat_id_file_dir_fd),
        cmocka_unit_test(test_stat_id_errors),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
