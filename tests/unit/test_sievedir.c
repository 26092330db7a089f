/*
 * test_sievedir.c - unit tests of store/sievedir.c: the script layout
 * (SIEVEDIR/H/USER, SIEVEDIR/domain/DH/DOMAIN/H/USER, the hash letter
 * with 'q' for non-letters, '^' written as '.', the default SIEVEDIR
 * under configdirectory) and the names it refuses.
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "store/sievedir.h"

static struct imapconf *conf_of(const char *text)
{
    struct imapconf *conf = NULL;
    char *err = NULL;

    assert_int_equal(imapconf_load_string("test", text, strlen(text), &conf,
                                          &err), 0);
    free(err);
    assert_non_null(conf);
    return conf;
}

static void expect_path(struct imapconf *conf, const char *userid,
                        const char *want)
{
    struct buf out = BUF_INITIALIZER;

    assert_int_equal(sievedir_user_path(conf, userid, &out), 0);
    assert_string_equal(buf_cstring(&out), want);
    buf_free(&out);
}

static void test_layout(void **state)
{
    struct imapconf *conf = conf_of("sievedir: /s\n");
    struct buf out = BUF_INITIALIZER;
    (void)state;

    expect_path(conf, "alice", "/s/a/alice");
    expect_path(conf, "Bob", "/s/b/Bob");
    expect_path(conf, "1user", "/s/q/1user");
    expect_path(conf, "_x", "/s/q/_x");
    expect_path(conf, "a^b", "/s/a/a.b");
    expect_path(conf, "alice@example.com", "/s/domain/e/example.com/a/alice");
    expect_path(conf, "zed@9.example", "/s/domain/q/9.example/z/zed");
    assert_int_equal(sievedir_active_path(conf, "alice@example.com", &out),
                     0);
    assert_string_equal(buf_cstring(&out),
                        "/s/domain/e/example.com/a/alice/defaultbc");
    buf_free(&out);
    imapconf_free(&conf);

    conf = conf_of("configdirectory: /var/cd\n");
    expect_path(conf, "alice", "/var/cd/sieve/a/alice");
    imapconf_free(&conf);
}

static void test_refused(void **state)
{
    struct imapconf *conf = conf_of("sievedir: /s\n");
    struct buf out = BUF_INITIALIZER;
    const char *bad[] = { "", "..", ".", "a/b", "@example.com", "alice@",
                          "alice@..", "alice@a/b", NULL };
    size_t i;
    (void)state;

    for (i = 0; bad[i]; i++) {
        buf_setcstr(&out, "x");
        assert_int_equal(sievedir_user_path(conf, bad[i], &out), SIEVEDIR_BADNAME);
        assert_int_equal(out.len, 0);
        assert_int_equal(sievedir_active_path(conf, bad[i], &out), SIEVEDIR_BADNAME);
    }
    assert_int_equal(sievedir_user_path(conf, NULL, &out), SIEVEDIR_BADNAME);
    buf_free(&out);
    imapconf_free(&conf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_refused),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
