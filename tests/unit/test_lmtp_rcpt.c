/*
 * test_lmtp_rcpt.c - lmtpd/rcpt.c: the RFC 5321 path parser (quoted local
 * parts, source routes, the null path, refused forms, fed at every cut
 * length so that nothing reads past the end), the local part -> mailbox
 * name mapping (+detail, +shared.folder, lmtp_downcase_rcpt,
 * unixhierarchysep), and resolution against a real mailbox list, ACLs
 * and quotas made with the store functions in a temporary directory.
 * The resolution cases run once per cyrusdb backend.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <sys/stat.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lmtpd/rcpt.h"
#include "lmtpd/received.h"
#include "store/acl.h"
#include "store/mboxlist.h"
#include "store/quota.h"
#include "store/store.h"
#include "tests/testhelp.h"

/* ---- path syntax ------------------------------------------------------- */

/* Parse s (exactly strlen(s) bytes, copied to the heap so that ASan sees
 * any read past the end); expect success with the given parts. */
static void parse_ok(const char *s, int flags, const char *addr,
                     const char *local, const char *domain, size_t used)
{
    size_t len = strlen(s), got = 12345;
    char *copy = malloc(len ? len : 1);
    struct rcpt_path p;
    const char *err = NULL;

    assert_non_null(copy);
    memcpy(copy, s, len);
    rcpt_path_init(&p);
    if (rcpt_parse_path(copy, len, flags, &p, &got, &err) != 0)
        fail_msg("refused <%s>: %s", s, err);
    assert_string_equal(buf_cstring(&p.addr), addr);
    assert_string_equal(buf_cstring(&p.local), local);
    assert_string_equal(buf_cstring(&p.domain), domain);
    assert_int_equal(got, used);
    rcpt_path_free(&p);
    free(copy);
}

static void parse_bad(const char *s, int flags)
{
    size_t len = strlen(s);
    char *copy = malloc(len ? len : 1);
    struct rcpt_path p;
    const char *err = NULL;

    assert_non_null(copy);
    memcpy(copy, s, len);
    rcpt_path_init(&p);
    buf_setcstr(&p.addr, "poison");
    if (rcpt_parse_path(copy, len, flags, &p, NULL, &err) == 0)
        fail_msg("accepted <%s>", s);
    assert_non_null(err);
    assert_int_equal(p.addr.len, 0);
    assert_int_equal(p.local.len, 0);
    rcpt_path_free(&p);
    free(copy);
}

static void test_parse_plain(void **state)
{
    (void)state;
    parse_ok("<alice@example.org>", 0, "alice@example.org", "alice",
             "example.org", 19);
    parse_ok("<alice@example.org> SIZE=10", 0, "alice@example.org",
             "alice", "example.org", 19);
    parse_ok(" <bob>", 0, "bob", "bob", "", 6);
    parse_ok("<Alice.Smith+Lists@Example.ORG>", 0,
             "Alice.Smith+Lists@Example.ORG", "Alice.Smith+Lists",
             "Example.ORG", 31);
    parse_ok("<+shared.folder@example.org>", 0, "+shared.folder@example.org",
             "+shared.folder", "example.org", 28);
    parse_ok("<a!#$%&'*+-/=?^_`{|}~z@x>", 0, "a!#$%&'*+-/=?^_`{|}~z@x",
             "a!#$%&'*+-/=?^_`{|}~z", "x", 25);
    parse_ok("<u@[127.0.0.1]>", 0, "u@[127.0.0.1]", "u", "[127.0.0.1]", 15);
    parse_ok("<u@[IPv6:::1]>", 0, "u@[IPv6:::1]", "u", "[IPv6:::1]", 14);
    parse_ok("<u@my_host.example>", 0, "u@my_host.example", "u",
             "my_host.example", 19);
}

static void test_parse_quoted(void **state)
{
    (void)state;
    parse_ok("<\"john smith\"@example.org>", 0, "\"john smith\"@example.org",
             "john smith", "example.org", 26);
    parse_ok("<\"a\\\"b\\\\c\"@x>", 0, "\"a\\\"b\\\\c\"@x", "a\"b\\c", "x",
             13);
    /* a '>' inside quotes does not end the path */
    parse_ok("<\"a>b\"@x>", 0, "\"a>b\"@x", "a>b", "x", 9);
    parse_ok("<\"alice\">", 0, "\"alice\"", "alice", "", 9);
    parse_bad("<\"\"@x>", 0);                 /* empty quoted string */
    parse_bad("<\"abc@x>", 0);                /* unterminated */
    parse_bad("<\"a\tb\"@x>", 0);             /* control byte */
    parse_bad("<\"a\\\tb\"@x>", 0);           /* quoted control byte */
    parse_bad("<\"a\"b@x>", 0);               /* text after the quote */
}

static void test_parse_route_null(void **state)
{
    (void)state;
    parse_ok("<@relay.example:alice@example.org>", 0, "alice@example.org",
             "alice", "example.org", 34);
    parse_ok("<@a.example,@b.example:bob@c.example>", 0, "bob@c.example",
             "bob", "c.example", 37);
    parse_ok("<>", RCPT_ALLOW_NULL, "", "", "", 2);
    parse_ok("<> BODY=8BITMIME", RCPT_ALLOW_NULL, "", "", "", 2);
    parse_bad("<>", 0);                       /* not for RCPT */
    parse_bad("<@a.example:>", 0);            /* route without mailbox */
    parse_bad("<@a.example,b.example:u@x>", 0);
    parse_bad("<@a.example u@x>", 0);
    parse_bad("<@:u@x>", 0);
}

/* SMTPUTF8 (RFC 6531 3.3): well-formed UTF-8 in local parts, quoted
 * strings and domain labels; malformed UTF-8 still refused. */
static void test_parse_utf8(void **state)
{
    (void)state;
    parse_ok("<al\303\251@x>", RCPT_UTF8, "al\303\251@x", "al\303\251", "x",
             8);
    parse_ok("<\344\275\240\345\245\275@\344\276\213\345\255\220.example>",
             RCPT_UTF8,
             "\344\275\240\345\245\275@\344\276\213\345\255\220.example",
             "\344\275\240\345\245\275",
             "\344\276\213\345\255\220.example", 23);
    parse_ok("<\"j\303\266rg m\"@x>", RCPT_UTF8, "\"j\303\266rg m\"@x",
             "j\303\266rg m", "x", 13);
    parse_ok("<u@\360\237\230\200.x>", RCPT_UTF8, "u@\360\237\230\200.x", "u",
             "\360\237\230\200.x", 10);
    parse_bad("<al\351@x>", RCPT_UTF8);          /* Latin-1, not UTF-8 */
    parse_bad("<a\300\201@x>", RCPT_UTF8);       /* overlong */
    parse_bad("<a\355\240\200@x>", RCPT_UTF8);   /* a surrogate */
    parse_bad("<a\364\220\200\200@x>", RCPT_UTF8); /* above U+10FFFF */
    parse_bad("<a\303@x>", RCPT_UTF8);           /* truncated */
    parse_bad("<\"a\303\"@x>", RCPT_UTF8);      /* truncated, quoted */
    parse_bad("<u@x\377y>", RCPT_UTF8);
}

static void test_parse_refused(void **state)
{
    char big[RCPT_PATH_MAX + 16];

    (void)state;
    parse_bad("", 0);
    parse_bad("alice@example.org", 0);        /* brackets required */
    parse_bad("<alice@example.org", 0);
    parse_bad("<alice@>", 0);
    parse_bad("<@example.org>", 0);
    parse_bad("<alice@exa mple.org>", 0);
    parse_bad("<ali ce@example.org>", 0);
    parse_bad("<.alice@x>", 0);
    parse_bad("<alice.@x>", 0);
    parse_bad("<al..ice@x>", 0);
    parse_bad("<alice@x..org>", 0);
    parse_bad("<alice@.x>", 0);
    parse_bad("<alice@x.>", 0);
    parse_bad("<alice@[1.2.3.4>", 0);
    parse_bad("<alice@[]>", 0);
    parse_bad("<a@b@c>", 0);
    parse_bad("<al\303\251@x>", 0);           /* 8-bit */
    parse_bad("<al\303\251@x>", RCPT_ALLOW_NULL);
    parse_bad("<al\001ce@x>", 0);
    parse_bad("<(comment)alice@x>", 0);
    /* a path over the limit */
    big[0] = '<';
    memset(big + 1, 'a', RCPT_PATH_MAX + 1);
    big[RCPT_PATH_MAX + 2] = '>';
    big[RCPT_PATH_MAX + 3] = '\0';
    parse_bad(big, 0);
    /* exactly at the limit is fine */
    big[RCPT_PATH_MAX + 1] = '>';
    big[RCPT_PATH_MAX + 2] = '\0';
    {
        struct rcpt_path p;
        size_t used;

        rcpt_path_init(&p);
        assert_int_equal(rcpt_parse_path(big, RCPT_PATH_MAX + 2, 0, &p, &used,
                                         NULL), 0);
        assert_int_equal(p.local.len, RCPT_PATH_MAX);
        rcpt_path_free(&p);
    }
}

/* Every prefix of valid paths is parsed without reading past its end
 * (ASan checks the heap copy), and only the whole one is accepted. */
static void test_parse_prefixes(void **state)
{
    static const char *const paths[] = {
        "<@r.example,@s.example:\"q\\\"x\"@[10.0.0.1]>",
        "<alice+box@example.org>",
        "<>",
    };
    size_t k, cut;

    (void)state;
    for (k = 0; k < sizeof(paths) / sizeof(paths[0]); k++) {
        size_t len = strlen(paths[k]);

        for (cut = 0; cut <= len; cut++) {
            char *copy = malloc(cut ? cut : 1);
            struct rcpt_path p;
            int r;

            assert_non_null(copy);
            memcpy(copy, paths[k], cut);
            rcpt_path_init(&p);
            r = rcpt_parse_path(copy, cut, RCPT_ALLOW_NULL, &p, NULL, NULL);
            assert_int_equal(r, cut == len ? 0 : -1);
            rcpt_path_free(&p);
            free(copy);
        }
    }
}

/* ---- local part -> names ----------------------------------------------- */

static struct imapconf *conf_text(const char *text)
{
    struct imapconf *conf = NULL;
    char *err = NULL;

    if (imapconf_load_string("test", text, strlen(text), &conf, &err) != 0)
        fail_msg("conf: %s", err ? err : "?");
    return conf;
}

static void names_ok(const struct imapconf *conf, const char *local,
                     const char *inbox, const char *folder)
{
    struct buf in = BUF_INITIALIZER, fo = BUF_INITIALIZER;
    const char *err = NULL;

    buf_setcstr(&fo, "poison");
    if (rcpt_mailbox_names(conf, NULL, local, strlen(local), "", 0, &in, &fo,
                           &err) != 0)
        fail_msg("refused %s: %s", local, err);
    assert_string_equal(buf_cstring(&in), inbox);
    assert_string_equal(buf_cstring(&fo), folder);
    buf_free(&in);
    buf_free(&fo);
}

static void names_bad(const struct imapconf *conf, const char *local)
{
    struct buf in = BUF_INITIALIZER, fo = BUF_INITIALIZER;
    const char *err = NULL;

    buf_setcstr(&in, "poison");
    if (rcpt_mailbox_names(conf, NULL, local, strlen(local), "", 0, &in, &fo,
                           &err) == 0)
        fail_msg("accepted %s -> %s", local, buf_cstring(&in));
    assert_non_null(err);
    assert_int_equal(in.len, 0);
    buf_free(&in);
    buf_free(&fo);
}

static void test_names_dotsep(void **state)
{
    struct imapconf *conf = conf_text("lmtp_downcase_rcpt: yes\n");

    (void)state;
    names_ok(conf, "alice", "user.alice", "");
    names_ok(conf, "Alice", "user.alice", "");
    names_ok(conf, "ALICE+Lists", "user.alice", "user.alice.Lists");
    names_ok(conf, "alice+lists.2024", "user.alice", "user.alice.lists.2024");
    names_ok(conf, "alice+", "user.alice", "");
    /* a detail naming no valid folder means the INBOX */
    names_ok(conf, "alice+a/b", "user.alice", "");
    names_ok(conf, "alice+.x", "user.alice", "");
    names_ok(conf, "alice+x+y", "user.alice", "user.alice.x+y");
    names_ok(conf, "+shared.folder", "shared.folder", "");
    names_ok(conf, "+Shared", "Shared", "");
    names_bad(conf, "");
    names_bad(conf, "+");
    names_bad(conf, "john.smith");            /* '.' needs unixhierarchysep */
    names_bad(conf, "a/b");
    names_bad(conf, "a^b");
    names_bad(conf, "+user.bob");             /* not a way into user mail */
    names_bad(conf, "+user");
    names_bad(conf, "+shared..x");
    names_bad(conf, "+a*b");
    imapconf_free(&conf);
}

static void test_names_unixsep(void **state)
{
    struct imapconf *conf = conf_text("unixhierarchysep: yes\n"
                                      "lmtp_downcase_rcpt: no\n");

    (void)state;
    names_ok(conf, "John.Smith", "user.John^Smith", "");
    names_ok(conf, "john.smith+Lists/2024.q1", "user.john^smith",
             "user.john^smith.Lists.2024^q1");
    names_ok(conf, "+shared/folder", "shared.folder", "");
    names_ok(conf, "+shared.folder", "shared^folder", "");
    names_bad(conf, "a/b");
    names_bad(conf, "a^b");
    names_bad(conf, "+user/bob");
    imapconf_free(&conf);
}

/* ---- resolution against a real store ------------------------------------ */

struct fixture {
    char *dir;
    struct imapconf *conf;
    struct rcpt_ctx *ctx;
};

static void make_box(struct mboxlist *ml, const char *name, const char *who,
                     const char *rights, const char *owner)
{
    struct buf acl = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    int mask;

    if (owner) {
        assert_int_equal(acl_parse_rights("lrswipkxtea", &mask), 0);
        assert_int_equal(acl_set(NULL, owner, mask, &tmp), 0);
    }
    if (who) {
        assert_int_equal(acl_parse_rights(rights, &mask), 0);
        assert_int_equal(acl_set(buf_cstring(&tmp), who, mask, &acl), 0);
    } else {
        buf_setcstr(&acl, buf_cstring(&tmp));
    }
    assert_int_equal(mboxlist_create(ml, name, NULL, buf_cstring(&acl), NULL),
                     STORE_OK);
    buf_free(&acl);
    buf_free(&tmp);
}

static void fixture_up(struct fixture *f, const char *backend,
                       const char *extra)
{
    struct mboxlist *ml = NULL;
    struct quota_db *q = NULL;

    f->dir = th_mkdtemp("lmtp_rcpt");
    f->conf = th_store_conf(f->dir, backend, extra);
    assert_int_equal(mboxlist_open(f->conf, &ml), STORE_OK);
    assert_int_equal(mboxlist_create(ml, "user.alice", NULL, NULL, NULL),
                     STORE_OK);
    make_box(ml, "user.alice.lists", "anyone", "p", "alice");
    make_box(ml, "user.alice.private", NULL, NULL, "alice");
    make_box(ml, "shared.folder", "anyone", "lp", NULL);
    make_box(ml, "shared.closed", "anyone", "lr", NULL);
    make_box(ml, "shared.hidden", NULL, NULL, NULL);
    assert_int_equal(mboxlist_create(ml, "user.full", NULL, NULL, NULL),
                     STORE_OK);
    assert_int_equal(mboxlist_create(ml, "user.small", NULL, NULL, NULL),
                     STORE_OK);
    mboxlist_close(&ml);
    assert_int_equal(quota_shared(f->conf, &q), STORE_OK);
    assert_int_equal(quota_set(q, "user.full", QUOTA_UNLIMITED, 0), STORE_OK);
    assert_int_equal(quota_set(q, "user.small", 10, QUOTA_UNLIMITED),
                     STORE_OK);
    assert_int_equal(rcpt_ctx_new(f->conf, &f->ctx), STORE_OK);
}

static void fixture_down(struct fixture *f)
{
    rcpt_ctx_free(&f->ctx);
    assert_null(f->ctx);
    quota_shared_close();
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
}

static void resolve_is(struct fixture *f, const char *local, uint64_t size,
                       enum rcpt_result want, const char *mailbox)
{
    struct buf mb = BUF_INITIALIZER;
    enum rcpt_result got;

    const char *at = strrchr(local, '@');
    size_t llen = at ? (size_t)(at - local) : strlen(local);

    buf_setcstr(&mb, "poison");
    got = rcpt_resolve(f->ctx, local, llen, at ? at + 1 : "",
                       at ? strlen(at + 1) : 0, size, &mb, NULL);
    if (got != want)
        fail_msg("%s: result %d, want %d", local, (int)got, (int)want);
    assert_string_equal(buf_cstring(&mb), mailbox);
    buf_free(&mb);
}

static void test_resolve(void **state)
{
    struct fixture f;

    fixture_up(&f, *state, NULL);
    resolve_is(&f, "alice", 0, RCPT_OK, "user.alice");
    resolve_is(&f, "ALICE", 0, RCPT_OK, "user.alice");
    /* a folder where anyone may post */
    resolve_is(&f, "alice+lists", 100, RCPT_OK, "user.alice.lists");
    /* the detail is not lower-cased: no such folder, so the INBOX */
    resolve_is(&f, "alice+Lists", 0, RCPT_OK, "user.alice");
    /* a folder without p for anyone, and a missing one: the INBOX */
    resolve_is(&f, "alice+private", 0, RCPT_OK, "user.alice");
    resolve_is(&f, "alice+nothing", 0, RCPT_OK, "user.alice");
    resolve_is(&f, "nobody", 0, RCPT_UNKNOWN, "");
    resolve_is(&f, "nobody+lists", 0, RCPT_UNKNOWN, "");
    resolve_is(&f, "alice.smith", 0, RCPT_UNKNOWN, "");
    /* shared mailboxes */
    resolve_is(&f, "+shared.folder", 0, RCPT_OK, "shared.folder");
    resolve_is(&f, "+shared.closed", 0, RCPT_NOPOST, "");
    resolve_is(&f, "+shared.hidden", 0, RCPT_UNKNOWN, "");
    resolve_is(&f, "+shared.missing", 0, RCPT_UNKNOWN, "");
    resolve_is(&f, "+user.alice", 0, RCPT_UNKNOWN, "");
    /* quota: a message limit of 0 refuses anything; 10 KiB of storage
     * takes 10240 bytes and not one more */
    resolve_is(&f, "full", 0, RCPT_OVERQUOTA, "");
    resolve_is(&f, "small", 0, RCPT_OK, "user.small");
    resolve_is(&f, "small", 10240, RCPT_OK, "user.small");
    resolve_is(&f, "small", 10241, RCPT_OVERQUOTA, "");
    fixture_down(&f);
}

static void test_resolve_options(void **state)
{
    struct fixture f;

    fixture_up(&f, *state, "lmtp_downcase_rcpt: no\n");
    resolve_is(&f, "alice", 0, RCPT_OK, "user.alice");
    resolve_is(&f, "Alice", 0, RCPT_UNKNOWN, "");
    fixture_down(&f);

    fixture_up(&f, *state, "unixhierarchysep: yes\n");
    resolve_is(&f, "+shared/folder", 0, RCPT_OK, "shared.folder");
    resolve_is(&f, "+shared.folder", 0, RCPT_UNKNOWN, "");
    resolve_is(&f, "alice+lists", 0, RCPT_OK, "user.alice.lists");
    fixture_down(&f);
}

/* Virtual domains: the same local parts in two domains, the default
 * domain, shared folders and quota per domain. */
static void domain_boxes(struct fixture *f)
{
    static const char *const doms[] = { "example.com!", "example.org!" };
    struct mboxlist *ml = NULL;
    struct quota_db *q = NULL;
    struct buf n = BUF_INITIALIZER, owner = BUF_INITIALIZER;
    size_t i;

    rcpt_ctx_free(&f->ctx);
    assert_int_equal(mboxlist_open(f->conf, &ml), STORE_OK);
    for (i = 0; i < 2; i++) {
        buf_reset(&owner);
        buf_printf(&owner, "alice@%.*s", (int)strlen(doms[i]) - 1, doms[i]);
        buf_reset(&n);
        buf_printf(&n, "%suser.alice", doms[i]);
        assert_int_equal(mboxlist_create(ml, buf_cstring(&n), NULL, NULL,
                                         NULL), STORE_OK);
        buf_reset(&n);
        buf_printf(&n, "%suser.alice.lists", doms[i]);
        make_box(ml, buf_cstring(&n), "anyone", "p", buf_cstring(&owner));
        buf_reset(&n);
        buf_printf(&n, "%suser.postmaster", doms[i]);
        assert_int_equal(mboxlist_create(ml, buf_cstring(&n), NULL, NULL,
                                         NULL), STORE_OK);
    }
    make_box(ml, "example.com!shared.news", "anyone", "lp", NULL);
    assert_int_equal(mboxlist_create(ml, "example.com!user.small", NULL,
                                     NULL, NULL), STORE_OK);
    mboxlist_close(&ml);
    assert_int_equal(quota_shared(f->conf, &q), STORE_OK);
    assert_int_equal(quota_set(q, "example.com!user.small", 1,
                               QUOTA_UNLIMITED), STORE_OK);
    assert_int_equal(rcpt_ctx_new(f->conf, &f->ctx), STORE_OK);
    buf_free(&n);
    buf_free(&owner);
}

static void test_resolve_domains(void **state)
{
    static const char *const modes[] = { "userid", "on" };
    struct buf extra = BUF_INITIALIZER;
    struct fixture f;
    size_t m;

    for (m = 0; m < 2; m++) {
        buf_reset(&extra);
        buf_printf(&extra, "virtdomains: %s\ndefaultdomain: main.example\n",
                   modes[m]);
        fixture_up(&f, *state, buf_cstring(&extra));
        domain_boxes(&f);
        /* each domain's user, never another's */
        resolve_is(&f, "alice@example.com", 0, RCPT_OK,
                   "example.com!user.alice");
        resolve_is(&f, "ALICE@EXAMPLE.ORG", 0, RCPT_OK,
                   "example.org!user.alice");
        resolve_is(&f, "postmaster@example.org", 0, RCPT_OK,
                   "example.org!user.postmaster");
        resolve_is(&f, "alice+lists@example.org", 0, RCPT_OK,
                   "example.org!user.alice.lists");
        resolve_is(&f, "alice+nothing@example.com", 0, RCPT_OK,
                   "example.com!user.alice");
        /* the default domain and no domain: the domain-less users */
        resolve_is(&f, "alice@main.example", 0, RCPT_OK, "user.alice");
        resolve_is(&f, "alice@Main.Example", 0, RCPT_OK, "user.alice");
        resolve_is(&f, "alice", 0, RCPT_OK, "user.alice");
        resolve_is(&f, "alice+lists@main.example", 0, RCPT_OK,
                   "user.alice.lists");
        /* unknown domain or user */
        resolve_is(&f, "alice@example.net", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "small@example.org", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "postmaster", 0, RCPT_UNKNOWN, "");
        /* shared folders per domain */
        resolve_is(&f, "+shared.news@example.com", 0, RCPT_OK,
                   "example.com!shared.news");
        resolve_is(&f, "+shared.news@example.org", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "+shared.folder@example.com", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "+shared.folder@main.example", 0, RCPT_OK,
                   "shared.folder");
        resolve_is(&f, "+user.alice@example.com", 0, RCPT_UNKNOWN, "");
        /* quota of the domain user */
        resolve_is(&f, "small@example.com", 1024, RCPT_OK,
                   "example.com!user.small");
        resolve_is(&f, "small@example.com", 1025, RCPT_OVERQUOTA, "");
        resolve_is(&f, "small", 10241, RCPT_OVERQUOTA, "");
        /* garbage never reaches a mailbox */
        resolve_is(&f, "alice@[127.0.0.1]", 0, RCPT_BADDOMAIN, "");
        resolve_is(&f, "alice@localhost", 0, RCPT_BADDOMAIN, "");
        resolve_is(&f, "alice@a..b", 0, RCPT_BADDOMAIN, "");
        resolve_is(&f, "alice@.", 0, RCPT_BADDOMAIN, "");
        resolve_is(&f, "alice@-x.com", 0, RCPT_BADDOMAIN, "");
        resolve_is(&f, "example.com!user.alice", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "a!b@example.com", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "+example.com!shared.news", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "+shared/news@example.com", 0, RCPT_UNKNOWN, "");
        resolve_is(&f, "alice/x@example.com", 0, RCPT_UNKNOWN, "");
        fixture_down(&f);
    }

    /* off: the domain is ignored, as Cyrus */
    fixture_up(&f, *state, "virtdomains: off\n");
    domain_boxes(&f);
    resolve_is(&f, "alice@example.com", 0, RCPT_OK, "user.alice");
    resolve_is(&f, "alice@[127.0.0.1]", 0, RCPT_OK, "user.alice");
    resolve_is(&f, "+shared.folder@example.com", 0, RCPT_OK,
               "shared.folder");
    resolve_is(&f, "example.com!user.alice", 0, RCPT_UNKNOWN, "");
    resolve_is(&f, "+example.com!shared.news", 0, RCPT_UNKNOWN, "");
    fixture_down(&f);
    buf_free(&extra);
}

/* Database trouble is a temporary failure, never "unknown user" nor a
 * silent pass: the quota database is replaced by a directory, which no
 * backend can open. */
static void test_resolve_dberror(void **state)
{
    struct fixture f;
    char *path;

    fixture_up(&f, *state, NULL);
    rcpt_ctx_free(&f.ctx);
    quota_shared_close();
    path = th_path(f.dir, "conf/" QUOTA_FNAME);
    th_rmrf(path);
    assert_int_equal(mkdir(path, 0755), 0);
    free(path);
    assert_int_equal(rcpt_ctx_new(f.conf, &f.ctx), STORE_OK);
    resolve_is(&f, "nobody", 0, RCPT_UNKNOWN, "");
    resolve_is(&f, "alice", 0, RCPT_TEMPFAIL, "");
    resolve_is(&f, "+shared.folder", 0, RCPT_TEMPFAIL, "");
    fixture_down(&f);
}


/* received_queue_id(): the topmost Received field's id clause. */
static void test_received_qid(void **state)
{
    static const struct {
        const char *hdr, *qid;
    } cases[] = {
        { "Received: from a (a [192.0.2.1])\r\n\tby mx (Postfix) with "
          "LMTP id 4ABC123\r\n\tfor <b@x>; Thu, 1 Jan 2024\r\n"
          "Received: by r with ESMTP id OLDER;\r\n\r\n", "4ABC123" },
        { "received: by mx with ESMTP id 4XyZ.9-1_a; date\r\n", "4XyZ.9-1_a" },
        { "Subject: id 5\r\nReceived: by mx id Q1\r\n", "Q1" },
        { "Received: from id.example (ID x) by mx id\r\n Q2;\r\n", "Q2" },
        { "Received: from x (id y) by mx; date\r\n"
          "Received: by r id Q3\r\n", "" },
        { "Received: by mx id \x01" "bad\r\n", "" },
        { "Received: by mx id Q4(comment)\r\n", "Q4" },
        { "Subject: x\r\n\r\nReceived: by mx id BODY\r\n", "" },
        { "X-Received: by mx id NOT\r\n", "" },
        { "", "" },
    };
    char out[RECEIVED_QID_MAX + 1];
    size_t i, cut;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t len = strlen(cases[i].hdr);
        int r;

        memset(out, 'X', sizeof(out));
        r = received_queue_id(cases[i].hdr, len, out, sizeof(out));
        assert_string_equal(out, cases[i].qid);
        assert_int_equal(r, cases[i].qid[0] != '\0');
        /* every cut: nothing read past the end (a heap copy for ASan) */
        for (cut = 0; cut <= len; cut++) {
            char *copy = malloc(cut ? cut : 1);

            assert_non_null(copy);
            memcpy(copy, cases[i].hdr, cut);
            received_queue_id(copy, cut, out, sizeof(out));
            free(copy);
        }
    }
    /* a long id is cut at RECEIVED_QID_MAX, a small out too */
    {
        char hdr[300];

        snprintf(hdr, sizeof(hdr), "Received: by mx id %0200d\r\n", 7);
        assert_int_equal(received_queue_id(hdr, strlen(hdr), out,
                                           sizeof(out)), 1);
        assert_int_equal(strlen(out), RECEIVED_QID_MAX);
        assert_int_equal(received_queue_id(hdr, strlen(hdr), out, 4), 1);
        assert_string_equal(out, "000");
    }
}

int main(void)
{
    static const struct th_case cases[] = {
        { "resolve", test_resolve },
        { "resolve_options", test_resolve_options },
        { "resolve_domains", test_resolve_domains },
        { "resolve_dberror", test_resolve_dberror },
    };
    const struct CMUnitTest plain[] = {
        cmocka_unit_test(test_parse_plain),
        cmocka_unit_test(test_parse_utf8),
        cmocka_unit_test(test_parse_quoted),
        cmocka_unit_test(test_parse_route_null),
        cmocka_unit_test(test_parse_refused),
        cmocka_unit_test(test_parse_prefixes),
        cmocka_unit_test(test_names_dotsep),
        cmocka_unit_test(test_names_unixsep),
        cmocka_unit_test(test_received_qid),
    };
    int failed;

    log_init("test_lmtp_rcpt", LOG_TO_NONE);
    failed = cmocka_run_group_tests_name("lmtp_rcpt_parse", plain, NULL, NULL);
    failed += th_run_per_backend("lmtp_rcpt", cases,
                                 sizeof(cases) / sizeof(cases[0]));
    return failed;
}
