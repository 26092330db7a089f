/*
 * test_procid.c - procid_get() answers getpid() in the parent and, after
 * fork(), in the child (which must not inherit the parent's value).
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/procid.h"

static void test_procid_parent_and_child(void **state)
{
    pid_t child, parent;
    int status, gen;
    (void)state;

    parent = procid_get();
    assert_int_equal(parent, getpid());
    assert_int_equal(procid_get(), parent);   /* remembered */
    /* two generations: a child's child forgets its parent's value too */
    for (gen = 0; gen < 2; gen++) {
        child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            pid_t mine = procid_get();

            if (mine != getpid() || mine == parent)
                _exit(1);
            if (gen == 1) {
                pid_t grandchild = fork();

                if (grandchild < 0)
                    _exit(3);
                if (grandchild == 0)
                    _exit(procid_get() == getpid() && procid_get() != mine
                          ? 0 : 4);
                if (waitpid(grandchild, &status, 0) != grandchild ||
                    !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    _exit(5);
            }
            _exit(procid_get() == getpid() ? 0 : 2);
        }
        assert_int_equal(waitpid(child, &status, 0), child);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(procid_get(), getpid());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_procid_parent_and_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
