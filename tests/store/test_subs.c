/*
 * test_subs.c - per-user subscriptions (store/subs.c) against every
 * cyrusdb backend: add twice, remove, remove of a name not subscribed,
 * refused names, listing by pattern in mailbox order ('.' before every
 * other byte), a callback that stops the walk or uses the handle, and
 * the rename and deletion of a user.
 *
 * List callbacks never assert: they record what they saw and the case
 * checks afterwards.
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
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/store.h"
#include "store/subs.h"
#include "tests/testhelp.h"

struct fx {
    const char *backend;
    char *dir;
    struct imapconf *conf;
    struct subs_db *s;
};

static void fx_init(struct fx *f, void **state)
{
    memset(f, 0, sizeof(*f));
    f->backend = *state;
    f->dir = th_mkdtemp("subs");
    assert_non_null(f->dir);
    f->conf = th_store_conf(f->dir, f->backend, NULL);
    assert_int_equal(subs_open(f->conf, "alice" TH_U, &f->s), STORE_OK);
    assert_non_null(f->s);
}

static void fx_done(struct fx *f)
{
    subs_close(&f->s);
    assert_null(f->s);
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
}

static int fx_exists(struct fx *f, const char *rel)
{
    struct stat st;
    char *p = th_path(f->dir, rel);
    int r = stat(p, &st) == 0;

    free(p);
    return r;
}

/* The names a list gave, joined with spaces. */
struct seen_names {
    struct buf out;
    int stop_after;      /* stop (return 42) after this many; 0 = never */
    int n;
    struct subs_db *s;   /* when set: remove each name from inside cb */
    int cb_errors;
};

static int list_cb(void *rock, const char *mailbox)
{
    struct seen_names *sn = rock;

    if (sn->out.len)
        buf_putc(&sn->out, ' ');
    buf_appendcstr(&sn->out, mailbox);
    sn->n++;
    if (sn->s && subs_remove(sn->s, mailbox) != STORE_OK)
        sn->cb_errors++;
    if (sn->stop_after && sn->n >= sn->stop_after)
        return 42;
    return 0;
}

static void expect_list(struct fx *f, const char *pattern, const char *want)
{
    struct seen_names sn;

    memset(&sn, 0, sizeof(sn));
    assert_int_equal(subs_list(f->s, pattern, list_cb, &sn), 0);
    if (strcmp(buf_cstring(&sn.out), want))
        fail_msg("list <%s>: got <%s>, want <%s>", pattern,
                 buf_cstring(&sn.out), want);
    buf_free(&sn.out);
}

static void test_add_remove(void **state)
{
    struct fx f;

    fx_init(&f, state);
    assert_true(fx_exists(&f, "conf/" TH_DPATH_H "user/a/alice.sub"));
    assert_int_equal(subs_is_subscribed(f.s, TH_D "user.alice.x"), 0);
    assert_int_equal(subs_add(f.s, TH_D "user.alice.x"), STORE_OK);
    assert_int_equal(subs_add(f.s, TH_D "user.alice.x"), STORE_OK);   /* twice */
    assert_int_equal(subs_is_subscribed(f.s, TH_D "user.alice.x"), 1);
    assert_int_equal(subs_is_subscribed(f.s, TH_D "user.alice"), 0);
    assert_int_equal(subs_is_subscribed(f.s, TH_D "user.alice.xy"), 0);
    /* a name that does not exist may be subscribed */
    assert_int_equal(subs_add(f.s, TH_D "shared.nowhere"), STORE_OK);
    expect_list(&f, "*", TH_D "shared.nowhere " TH_D "user.alice.x");

    assert_int_equal(subs_remove(f.s, TH_D "user.alice.x"), STORE_OK);
    assert_int_equal(subs_is_subscribed(f.s, TH_D "user.alice.x"), 0);
    assert_int_equal(subs_remove(f.s, TH_D "user.alice.x"), STORE_NOTFOUND);
    assert_int_equal(subs_remove(f.s, "never.there"), STORE_NOTFOUND);
    assert_int_equal(subs_remove(f.s, ""), STORE_NOTFOUND);

    /* refused names */
    assert_int_equal(subs_add(f.s, TH_D "user..x"), STORE_BADNAME);
    assert_int_equal(subs_add(f.s, ""), STORE_BADNAME);
    assert_int_equal(subs_add(f.s, TH_D "user.a\nb"), STORE_BADNAME);
    assert_int_equal(subs_add(f.s, "a/b"), STORE_BADNAME);
    expect_list(&f, "*", TH_D "shared.nowhere");

    /* survives a reopen */
    subs_close(&f.s);
    assert_int_equal(subs_open(f.conf, "alice" TH_U, &f.s), STORE_OK);
    assert_int_equal(subs_is_subscribed(f.s, TH_D "shared.nowhere"), 1);
    /* refused user ids */
    {
        struct subs_db *o = NULL;
        assert_int_equal(subs_open(f.conf, "", &o), STORE_BADNAME);
        assert_int_equal(subs_open(f.conf, "x/y", &o), STORE_BADNAME);
        assert_null(o);
    }
    fx_done(&f);
}

static void test_list(void **state)
{
    static const char *const names[] = {
        TH_D "user.alice", TH_D "user.alice.Sent", TH_D "user.alice-b", TH_D "user.alice.Sent.2019",
        TH_D "user.alicea", TH_D "user.alice.Drafts", TH_D "shared.news", TH_D "user.bob",
        TH_D "user.alice.A b", NULL
    };
    struct fx f;
    struct seen_names sn;
    int i;

    fx_init(&f, state);
    for (i = 0; names[i]; i++)
        assert_int_equal(subs_add(f.s, names[i]), STORE_OK);
    /* mailbox order: '.' sorts before every other byte (' ' and '-'
     * included), so a folder's children follow it directly */
    expect_list(&f, "*",
                TH_D "shared.news " TH_D "user.alice " TH_D "user.alice.A b " TH_D "user.alice.Drafts "
                TH_D "user.alice.Sent " TH_D "user.alice.Sent.2019 " TH_D "user.alice-b "
                TH_D "user.alicea " TH_D "user.bob");
    expect_list(&f, TH_D "user.alice.*",
                TH_D "user.alice.A b " TH_D "user.alice.Drafts " TH_D "user.alice.Sent "
                TH_D "user.alice.Sent.2019");
    expect_list(&f, TH_D "user.alice.%",
                TH_D "user.alice.A b " TH_D "user.alice.Drafts " TH_D "user.alice.Sent");
    expect_list(&f, TH_D "user.alice*",
                TH_D "user.alice " TH_D "user.alice.A b " TH_D "user.alice.Drafts "
                TH_D "user.alice.Sent " TH_D "user.alice.Sent.2019 " TH_D "user.alice-b "
                TH_D "user.alicea");
    expect_list(&f, TH_D "user.alice%",
                TH_D "user.alice " TH_D "user.alice-b " TH_D "user.alicea");
    expect_list(&f, TH_D "user.%", TH_D "user.alice " TH_D "user.alice-b " TH_D "user.alicea " TH_D "user.bob");
    expect_list(&f, "%", "");
    expect_list(&f, "*.Sent", TH_D "user.alice.Sent");
    expect_list(&f, TH_D "user.alice", TH_D "user.alice");
    expect_list(&f, TH_D "user.alic", "");
    expect_list(&f, "nothing.*", "");

    /* the callback's value stops the walk and is returned */
    memset(&sn, 0, sizeof(sn));
    sn.stop_after = 2;
    assert_int_equal(subs_list(f.s, TH_D "user.alice.*", list_cb, &sn), 42);
    assert_string_equal(buf_cstring(&sn.out),
                        TH_D "user.alice.A b " TH_D "user.alice.Drafts");
    buf_free(&sn.out);

    /* the callback may use the handle */
    memset(&sn, 0, sizeof(sn));
    sn.s = f.s;
    assert_int_equal(subs_list(f.s, TH_D "user.alice.Sent*", list_cb, &sn), 0);
    assert_int_equal(sn.n, 2);
    assert_int_equal(sn.cb_errors, 0);
    buf_free(&sn.out);
    expect_list(&f, TH_D "user.alice.*", TH_D "user.alice.A b " TH_D "user.alice.Drafts");
    fx_done(&f);
}

static void test_users(void **state)
{
    struct fx f;
    struct subs_db *o = NULL;

    fx_init(&f, state);
    assert_int_equal(subs_add(f.s, TH_D "user.alice"), STORE_OK);
    assert_int_equal(subs_add(f.s, TH_D "user.alice.Sent"), STORE_OK);
    assert_int_equal(subs_add(f.s, TH_D "user.alicea.x"), STORE_OK);
    assert_int_equal(subs_add(f.s, TH_D "user.bob.shared"), STORE_OK);
    assert_int_equal(subs_add(f.s, TH_D "shared.news"), STORE_OK);
    subs_close(&f.s);

    /* rename: the file moves and alice's own folders follow her */
    assert_int_equal(subs_rename_user(f.conf, "alice" TH_U, "zoe" TH_U), STORE_OK);
    assert_false(fx_exists(&f, "conf/" TH_DPATH_H "user/a/alice.sub"));
    assert_true(fx_exists(&f, "conf/" TH_DPATH_H "user/z/zoe.sub"));
    assert_int_equal(subs_open(f.conf, "zoe" TH_U, &f.s), STORE_OK);
    expect_list(&f, "*",
                TH_D "shared.news " TH_D "user.alicea.x " TH_D "user.bob.shared " TH_D "user.zoe "
                TH_D "user.zoe.Sent");
    subs_close(&f.s);
    assert_int_equal(subs_rename_user(f.conf, "alice" TH_U, "zoe" TH_U),
                     STORE_NOTFOUND);
    assert_int_equal(subs_rename_user(f.conf, "zoe" TH_U, "a/b"), STORE_BADNAME);

    /* another user's file is separate */
    assert_int_equal(subs_open(f.conf, "yann", &o), STORE_OK);
    assert_int_equal(subs_is_subscribed(o, TH_D "shared.news"), 0);
    subs_close(&o);

    /* delete */
    assert_int_equal(subs_delete_user(f.conf, "zoe" TH_U), STORE_OK);
    assert_false(fx_exists(&f, "conf/" TH_DPATH_H "user/z/zoe.sub"));
    assert_false(fx_exists(&f, "conf/" TH_DPATH_H "user/z/zoe.sub-lock"));
    assert_int_equal(subs_delete_user(f.conf, "zoe" TH_U), STORE_NOTFOUND);
    assert_int_equal(subs_open(f.conf, "zoe" TH_U, &f.s), STORE_OK);
    expect_list(&f, "*", "");
    fx_done(&f);
}

static const struct th_case cases[] = {
    { "add_remove", test_add_remove },
    { "list", test_list },
    { "users", test_users },
};

int main(void)
{
    log_init("test_subs", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    return th_run_per_backend("subs", cases, sizeof(cases) / sizeof(cases[0]));
}
