/*
 * test_sievedir.c - unit tests of store/sievedir.c: the script layout
 * (SIEVEDIR/H/USER, SIEVEDIR/domain/DH/DOMAIN/H/USER, the hash letter
 * with 'q' for non-letters, '^' written as '.', the default SIEVEDIR
 * under configdirectory), the names it refuses, and the source a stored
 * compiled form names (the script file: inode, mtime, size).
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "sieve/sieve.h"
#include "sieve/sieve_bc.h"
#include "store/sievedir.h"
#include "tests/testhelp.h"

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

/* a compiled form names its script file as its source: stored after the
 * script (the text found in NAME.script), or with the caller's stat;
 * not when NAME.script holds another text; sievedir_ensure_bc() stores
 * again a current form that does not name the file (after its mtime
 * changed), and leaves one that does */
static void test_bc_source(void **state)
{
    char *dir = th_mkdtemp("sievedir");
    const char *text = "require \"fileinto\";\nfileinto \"A\";\n";
    const char *other = "keep;\n";
    struct sieve_script *s = NULL;
    struct buf err = BUF_INITIALIZER;
    int stored = -1;
    struct buf bc = BUF_INITIALIZER, bc2 = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct stat st;
    struct timespec ts[2];
    (void)state;

    assert_non_null(dir);
    assert_int_equal(sieve_compile(text, strlen(text), NULL, NULL, &s, NULL),
                     SIEVE_OK);
    assert_int_equal(sievedir_put(dir, "main", text, strlen(text)),
                     SIEVEDIR_OK);
    assert_int_equal(sievedir_script_path(dir, "main", &path), SIEVEDIR_OK);
    assert_int_equal(stat(buf_cstring(&path), &st), 0);
    /* found by reading NAME.script */
    assert_int_equal(sievedir_store_bc(dir, "main", s, text, strlen(text),
                                       NULL, NULL, 0), SIEVEDIR_OK);
    assert_int_equal(sievedir_get_bc(dir, "main", 0, &bc), SIEVEDIR_OK);
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 1);
    /* another file (inode), mtime or size is not the source */
    st.st_ino++;
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 0);
    st.st_ino--;
    st.st_mtim.tv_nsec ^= 1;
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 0);
    st.st_mtim.tv_nsec ^= 1;
    st.st_size++;
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 0);
    st.st_size--;
    /* NAME.script holds another text: no source */
    assert_int_equal(sievedir_put(dir, "main", other, strlen(other)),
                     SIEVEDIR_OK);
    assert_int_equal(sievedir_store_bc(dir, "main", s, text, strlen(text),
                                       NULL, NULL, 0), SIEVEDIR_OK);
    assert_int_equal(sievedir_get_bc(dir, "main", 0, &bc), SIEVEDIR_OK);
    assert_int_equal(stat(buf_cstring(&path), &st), 0);
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 0);
    /* the caller's stat (of the file it read the text from), whatever
     * NAME.script holds now */
    assert_int_equal(sievedir_put(dir, "main", text, strlen(text)),
                     SIEVEDIR_OK);
    assert_int_equal(stat(buf_cstring(&path), &st), 0);
    assert_int_equal(sievedir_put(dir, "main", other, strlen(other)),
                     SIEVEDIR_OK);
    assert_int_equal(sievedir_store_bc(dir, "main", s, text, strlen(text),
                                       NULL, &st, 0), SIEVEDIR_OK);
    assert_int_equal(sievedir_get_bc(dir, "main", 0, &bc), SIEVEDIR_OK);
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 1);

    /* ensure_bc: a current form whose source is another mtime is stored
     * again naming the file; then left alone */
    assert_int_equal(sievedir_put(dir, "main", text, strlen(text)),
                     SIEVEDIR_OK);
    assert_int_equal(sievedir_ensure_bc(dir, "main", NULL, NULL, 0, &stored,
                                        NULL),
                     SIEVEDIR_OK);
    assert_int_equal(stored, 1);
    assert_int_equal(stat(buf_cstring(&path), &st), 0);
    assert_int_equal(sievedir_get_bc(dir, "main", 0, &bc), SIEVEDIR_OK);
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 1);
    ts[0] = st.st_atim;
    ts[1] = st.st_mtim;
    ts[1].tv_sec += 5;
    assert_int_equal(utimensat(AT_FDCWD, buf_cstring(&path), ts, 0), 0);
    assert_int_equal(stat(buf_cstring(&path), &st), 0);
    assert_int_equal(sievedir_bc_is_source(bc.s, bc.len, &st), 0);
    assert_int_equal(sievedir_ensure_bc(dir, "main", NULL, NULL, 0, &stored,
                                        NULL),
                     SIEVEDIR_OK);
    assert_int_equal(stored, 1);
    assert_int_equal(sievedir_get_bc(dir, "main", 0, &bc2), SIEVEDIR_OK);
    assert_int_equal(sievedir_bc_is_source(bc2.s, bc2.len, &st), 1);
    assert_int_equal(bc2.len, bc.len);
    assert_memory_equal(bc2.s + SIEVE_BC_HEADER, bc.s + SIEVE_BC_HEADER,
                        bc.len - SIEVE_BC_HEADER);
    assert_int_equal(sievedir_ensure_bc(dir, "main", NULL, NULL, 0, &stored,
                                        NULL),
                     SIEVEDIR_OK);
    assert_int_equal(stored, 0);
    assert_int_equal(sievedir_get_bc(dir, "main", 0, &bc), SIEVEDIR_OK);
    assert_int_equal(bc.len, bc2.len);
    assert_memory_equal(bc.s, bc2.s, bc.len);

    /* a text that does not compile: not stored, the compiler's reason */
    assert_int_equal(sievedir_put(dir, "broken", "keep;\nfileint \"x\";\n",
                                  19), SIEVEDIR_OK);
    assert_int_equal(sievedir_ensure_bc(dir, "broken", NULL, NULL, 0,
                                        &stored, &err), SIEVEDIR_BADNAME);
    assert_int_equal(stored, 0);
    assert_non_null(strstr(buf_cstring(&err), "line 2"));
    assert_int_equal(sievedir_delete(dir, "broken"), SIEVEDIR_OK);
    buf_free(&err);

    assert_int_equal(sievedir_delete(dir, "main"), SIEVEDIR_OK);
    th_rmrf(dir);
    free(dir);
    sieve_script_free(&s);
    buf_free(&bc);
    buf_free(&bc2);
    buf_free(&path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_bc_source),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
