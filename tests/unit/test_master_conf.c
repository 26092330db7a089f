/*
 * test_master_conf.c - unit tests of master/master_conf.c, the cyrus.conf
 * reader: every key and its range, every error with its "FILE:LINE:" text,
 * warnings (captured by pointing stderr, where log_init(...,
 * LOG_TO_STDERR) sends them, at a file), quoting, comments, continuation
 * lines, CRLF, the listen forms, the helper functions, Debian's
 * /etc/cyrus.conf, and every truncated prefix and many one-byte mutations
 * of a valid file (each in a buffer of exactly its length, so that the
 * sanitizer build catches any read past the end).
 */
#include "config.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "master/master_conf.h"
#include "tests/testhelp.h"

static char *tmpdir;

/* ---- capturing stderr --------------------------------------------------- */

struct capture {
    int saved;
    char *path;
};

static void capture_begin(struct capture *c)
{
    int f;

    fflush(stderr);
    c->path = th_path(tmpdir, "stderr.txt");
    f = open(c->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(f >= 0);
    c->saved = dup(2);
    assert_true(c->saved >= 0);
    assert_true(dup2(f, 2) >= 0);
    close(f);
}

static char *capture_end(struct capture *c)
{
    struct buf b = BUF_INITIALIZER;
    char chunk[4096];
    ssize_t n;
    int f;

    fflush(stderr);
    assert_true(dup2(c->saved, 2) >= 0);
    close(c->saved);
    f = open(c->path, O_RDONLY);
    assert_true(f >= 0);
    while ((n = read(f, chunk, sizeof(chunk))) > 0)
        assert_int_equal(buf_append(&b, chunk, (size_t)n), 0);
    close(f);
    unlink(c->path);
    free(c->path);
    return buf_release(&b);
}

/* ---- loading helpers ---------------------------------------------------- */

/* Load (text, len) from memory under the name "t.conf" (copied into a
 * buffer of exactly len bytes).  *warn_r (if not NULL) gets the warnings. */
static int load_len(const char *text, size_t len, struct master_conf **conf_r,
                    char **error_r, char **warn_r)
{
    struct capture c;
    char *copy = malloc(len ? len : 1), *warn;
    int r;

    assert_non_null(copy);
    memcpy(copy, text, len);
    *conf_r = (struct master_conf *)(uintptr_t)0x1;    /* poisoned */
    *error_r = (char *)(uintptr_t)0x1;
    capture_begin(&c);
    r = master_conf_load_string("t.conf", copy, len, conf_r, error_r);
    warn = capture_end(&c);
    free(copy);
    if (warn_r)
        *warn_r = warn;
    else
        free(warn);
    if (r == 0) {
        assert_non_null(*conf_r);
        assert_null(*error_r);
    } else {
        assert_int_equal(r, -1);
        assert_null(*conf_r);
        assert_non_null(*error_r);
    }
    return r;
}

static int load(const char *text, struct master_conf **conf_r,
                char **error_r, char **warn_r)
{
    return load_len(text, strlen(text), conf_r, error_r, warn_r);
}

/* Load text that must succeed without warnings. */
static struct master_conf *load_ok(const char *text)
{
    struct master_conf *conf;
    char *error, *warn;

    if (load(text, &conf, &error, &warn) != 0) {
        print_error("unexpected error: %s\ntext:\n%s\n", error, text);
        fail();
    }
    if (warn[0] != '\0') {
        print_error("unexpected warning: %s\n", warn);
        fail();
    }
    free(warn);
    return conf;
}

/* Load text that must fail with exactly `expected` as the message. */
static void load_fails(const char *text, const char *expected)
{
    struct master_conf *conf;
    char *error;

    if (load(text, &conf, &error, NULL) == 0) {
        print_error("loaded, expected error: %s\ntext:\n%s\n", expected,
                    text);
        master_conf_free(&conf);
        fail();
    }
    if (strcmp(error, expected) != 0) {
        print_error("text:\n%s\nexpected: %s\n     got: %s\n", text,
                    expected, error);
        free(error);
        fail();
    }
    free(error);
}

/* Load text that must succeed with a warning containing `expected`. */
static struct master_conf *load_warns(const char *text, const char *expected)
{
    struct master_conf *conf;
    char *error, *warn;

    if (load(text, &conf, &error, &warn) != 0) {
        print_error("unexpected error: %s\n", error);
        fail();
    }
    if (!strstr(warn, expected)) {
        print_error("expected warning: %s\n got: %s\n", expected, warn);
        fail();
    }
    free(warn);
    return conf;
}

static const struct master_entry *must_find(const struct master_conf *conf,
                                            const char *name)
{
    const struct master_entry *e = master_conf_find(conf, name);

    if (!e) {
        print_error("no entry %s\n", name);
        fail();
    }
    return e;
}

/* A SERVICES section around one entry line. */
static char *service(const char *line)
{
    struct buf b = BUF_INITIALIZER;

    assert_int_equal(buf_printf(&b, "SERVICES {\n  %s\n}\n", line), 0);
    return buf_release(&b);
}

static void service_fails(const char *line, const char *expected_after_line2)
{
    char *text = service(line);
    struct buf b = BUF_INITIALIZER;

    buf_printf(&b, "t.conf:2: %s", expected_after_line2);
    load_fails(text, buf_cstring(&b));
    buf_free(&b);
    free(text);
}

static struct master_conf *service_ok(const char *line)
{
    char *text = service(line);
    struct master_conf *conf = load_ok(text);

    free(text);
    return conf;
}

/* ---- keys --------------------------------------------------------------- */

static void test_every_key(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;

    (void)state;
    conf = load_ok(
        "START {\n"
        "  recover cmd=\"ctl_cyrusdb -r\"\n"
        "}\n"
        "SERVICES {\n"
        "  lmtp cmd=\"lmtpd -v\" listen=\"127.0.0.1:2424\" proto=tcp4"
        " prefork=3 maxchild=40 maxforkrate=15 maxfds=1024 babysit=1"
        " maxuses=77 idletimeout=600 backlog=512\n"
        "}\n"
        "EVENTS {\n"
        "  checkpoint cmd=\"ctl_cyrusdb -c\" period=30\n"
        "  prune cmd=\"cyr_expire -E 3\" at=0401\n"
        "}\n"
        "DAEMON {\n"
        "  idled cmd=\"idled\"\n"
        "}\n");
    assert_int_equal(conf->nentries, 5);

    e = &conf->entries[0];
    assert_int_equal(e->section, MASTER_SECTION_START);
    assert_string_equal(e->name, "recover");
    assert_string_equal(e->cmd, "ctl_cyrusdb -r");
    assert_int_equal(e->line, 2);
    assert_null(e->listen);
    assert_null(e->proto);

    e = must_find(conf, "lmtp");
    assert_ptr_equal(e, &conf->entries[1]);
    assert_int_equal(e->section, MASTER_SECTION_SERVICES);
    assert_int_equal(e->line, 5);
    assert_string_equal(e->cmd, "lmtpd -v");
    assert_int_equal(e->listen_kind, MASTER_LISTEN_TCP);
    assert_string_equal(e->listen, "127.0.0.1:2424");
    assert_string_equal(e->listen_host, "127.0.0.1");
    assert_string_equal(e->listen_port, "2424");
    assert_string_equal(e->proto, "tcp4");
    assert_int_equal(e->prefork, 3);
    assert_int_equal(e->maxchild, 40);
    assert_int_equal(e->maxforkrate, 15);
    assert_int_equal(e->maxfds, 1024);
    assert_int_equal(e->babysit, 1);
    assert_int_equal(e->maxuses, 77);
    assert_int_equal(e->idletimeout, 600);
    assert_int_equal(e->backlog, 512);

    e = must_find(conf, "checkpoint");
    assert_int_equal(e->section, MASTER_SECTION_EVENTS);
    assert_int_equal(e->period, 30);
    assert_int_equal(e->at, -1);
    e = must_find(conf, "prune");
    assert_int_equal(e->period, 0);
    assert_int_equal(e->at, 401);
    assert_string_equal(e->cmd, "cyr_expire -E 3");

    e = must_find(conf, "idled");
    assert_int_equal(e->section, MASTER_SECTION_DAEMON);
    assert_string_equal(e->cmd, "idled");
    assert_int_equal(e->line, 12);
    master_conf_free(&conf);
    assert_null(conf);
    master_conf_free(&conf);            /* twice: harmless */
}

static void test_defaults(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;

    (void)state;
    conf = service_ok("imap cmd=imapd listen=1143");
    e = must_find(conf, "imap");
    assert_string_equal(e->cmd, "imapd");
    assert_string_equal(e->proto, "tcp");
    assert_int_equal(e->prefork, 0);
    assert_int_equal(e->maxchild, MASTER_MAXCHILD_CAP);
    assert_int_equal(e->maxforkrate, 0);
    assert_int_equal(e->maxfds, 256);
    assert_int_equal(e->babysit, 0);
    assert_int_equal(e->maxuses, 250);
    assert_int_equal(e->idletimeout, 0);
    assert_int_equal(e->backlog, 0);
    assert_int_equal(e->period, 0);
    assert_int_equal(e->at, -1);
    master_conf_free(&conf);

    /* maxchild=-1 (Cyrus's "unlimited") is the cap, too */
    conf = service_ok("imap cmd=imapd listen=1143 maxchild=-1 prefork=5");
    e = must_find(conf, "imap");
    assert_int_equal(e->maxchild, MASTER_MAXCHILD_CAP);
    assert_int_equal(e->prefork, 5);
    master_conf_free(&conf);

    /* an empty file and one with empty sections are valid */
    conf = load_ok("");
    assert_int_equal(conf->nentries, 0);
    master_conf_free(&conf);
    conf = load_ok("# nothing\n\nSTART {\n}\nSERVICES {\n}\nEVENTS {\n}\n"
                   "DAEMON {\n}\n");
    assert_int_equal(conf->nentries, 0);
    master_conf_free(&conf);
}

static void test_babysit(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;
    static const char *const on[] = { "1", "true", "yes", "on", "T", "y" };
    static const char *const off[] = { "0", "false", "no", "off", "F", "n" };
    char line[200];
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(on) / sizeof(on[0]); i++) {
        snprintf(line, sizeof(line), "s cmd=x listen=/tmp/s babysit=%s",
                 on[i]);
        conf = service_ok(line);
        e = must_find(conf, "s");
        assert_int_equal(e->babysit, 1);
        /* as Cyrus: babysit keeps one child and caps the fork rate */
        assert_int_equal(e->prefork, 1);
        assert_int_equal(e->maxforkrate, 10);
        master_conf_free(&conf);

        snprintf(line, sizeof(line), "s cmd=x listen=/tmp/s babysit=%s",
                 off[i]);
        conf = service_ok(line);
        e = must_find(conf, "s");
        assert_int_equal(e->babysit, 0);
        assert_int_equal(e->prefork, 0);
        assert_int_equal(e->maxforkrate, 0);
        master_conf_free(&conf);
    }
    /* explicit values win over babysit's */
    conf = service_ok("s cmd=x listen=/tmp/s babysit=1 prefork=4"
                      " maxforkrate=3");
    e = must_find(conf, "s");
    assert_int_equal(e->prefork, 4);
    assert_int_equal(e->maxforkrate, 3);
    master_conf_free(&conf);

    service_fails("s cmd=x listen=/tmp/s babysit=2",
                  "bad babysit \"2\" for entry s (0 or 1)");
    service_fails("s cmd=x listen=/tmp/s babysit=1 maxchild=0",
                  "prefork 1 > maxchild 0 for service s");
}

/* Every integer key: the bounds load, one past them does not. */
static void test_ranges(void **state)
{
    static const struct {
        const char *key;
        long min, max;
        size_t offset;
    } ints[] = {
        { "prefork", 0, MASTER_MAXCHILD_CAP,
          offsetof(struct master_entry, prefork) },
        { "maxchild", -1, MASTER_MAXCHILD_CAP,
          offsetof(struct master_entry, maxchild) },
        { "maxforkrate", 0, 10000, offsetof(struct master_entry, maxforkrate) },
        { "maxfds", 16, 65536, offsetof(struct master_entry, maxfds) },
        { "backlog", 1, 65535, offsetof(struct master_entry, backlog) },
        { "maxuses", 0, 1000000, offsetof(struct master_entry, maxuses) },
        { "idletimeout", 0, 86400,
          offsetof(struct master_entry, idletimeout) },
    };
    char line[300], msg[300];
    struct master_conf *conf;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        long v[2] = { ints[i].min, ints[i].max };
        long bad[2] = { ints[i].min - 1, ints[i].max + 1 };
        int j;

        for (j = 0; j < 2; j++) {
            const struct master_entry *e;
            int got;

            /* maxchild must stay >= prefork */
            snprintf(line, sizeof(line), "s cmd=x listen=/s %s=%ld%s",
                     ints[i].key, v[j],
                     strcmp(ints[i].key, "prefork") == 0
                     ? " maxchild=1000" : "");
            conf = service_ok(line);
            e = must_find(conf, "s");
            memcpy(&got, (const char *)e + ints[i].offset, sizeof(got));
            if (strcmp(ints[i].key, "maxchild") == 0 && v[j] == -1)
                assert_int_equal(got, MASTER_MAXCHILD_CAP);
            else
                assert_int_equal(got, v[j]);
            master_conf_free(&conf);

            snprintf(line, sizeof(line), "s cmd=x listen=/s %s=%ld",
                     ints[i].key, bad[j]);
            snprintf(msg, sizeof(msg), "bad %s \"%ld\" for entry s "
                     "(a number %ld..%ld)", ints[i].key, bad[j], ints[i].min,
                     ints[i].max);
            service_fails(line, msg);
        }
        /* not numbers */
        snprintf(line, sizeof(line), "s cmd=x listen=/s %s=12x", ints[i].key);
        snprintf(msg, sizeof(msg), "bad %s \"12x\" for entry s "
                 "(a number %ld..%ld)", ints[i].key, ints[i].min, ints[i].max);
        service_fails(line, msg);
        snprintf(line, sizeof(line), "s cmd=x listen=/s %s=", ints[i].key);
        snprintf(msg, sizeof(msg), "bad %s \"\" for entry s "
                 "(a number %ld..%ld)", ints[i].key, ints[i].min, ints[i].max);
        service_fails(line, msg);
        snprintf(line, sizeof(line), "s cmd=x listen=/s %s=99999999999999999999",
                 ints[i].key);
        snprintf(msg, sizeof(msg), "bad %s \"99999999999999999999\" for entry"
                 " s (a number %ld..%ld)", ints[i].key, ints[i].min,
                 ints[i].max);
        service_fails(line, msg);
    }
    service_fails("s cmd=x listen=/s prefork=-1",
                  "bad prefork \"-1\" for entry s (a number 0..1000)");
    service_fails("s cmd=x listen=/s maxchild=--1",
                  "bad maxchild \"--1\" for entry s (a number -1..1000)");
    service_fails("s cmd=x listen=/s maxchild=+5",
                  "bad maxchild \"+5\" for entry s (a number -1..1000)");
    /* quoted numbers are fine */
    conf = service_ok("s cmd=x listen=/s prefork=\"2\"");
    assert_int_equal(must_find(conf, "s")->prefork, 2);
    master_conf_free(&conf);
}

static void test_prefork_maxchild(void **state)
{
    struct master_conf *conf;

    (void)state;
    service_fails("imap cmd=imapd listen=143 prefork=5 maxchild=2",
                  "prefork 5 > maxchild 2 for service imap");
    conf = service_ok("imap cmd=imapd listen=143 prefork=2 maxchild=2");
    assert_int_equal(must_find(conf, "imap")->maxchild, 2);
    master_conf_free(&conf);
    conf = service_ok("imap cmd=imapd listen=143 prefork=0 maxchild=0");
    assert_int_equal(must_find(conf, "imap")->maxchild, 0);
    master_conf_free(&conf);
}

static void test_events(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;
    static const struct { const char *at; int v; } good[] = {
        { "0000", 0 }, { "2359", 2359 }, { "0401", 401 }, { "1230", 1230 },
        { "5", 5 }, { "130", 130 },
    };
    static const char *const bad[] = {
        "2400", "0060", "1299", "12345", "ab", "", "-1", "0959x", "00000",
    };
    char text[200], msg[200];
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        snprintf(text, sizeof(text), "EVENTS {\n  e cmd=x at=%s\n}\n",
                 good[i].at);
        conf = load_ok(text);
        e = must_find(conf, "e");
        assert_int_equal(e->at, good[i].v);
        assert_int_equal(e->period, 0);
        master_conf_free(&conf);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(text, sizeof(text), "EVENTS {\n  e cmd=x at=%s\n}\n",
                 bad[i]);
        snprintf(msg, sizeof(msg), "t.conf:2: bad at \"%s\" for entry e "
                 "(HHMM, 0000..2359)", bad[i]);
        load_fails(text, msg);
    }
    conf = load_ok("EVENTS {\n e cmd=x period=1\n f cmd=y period=525600\n}\n");
    assert_int_equal(must_find(conf, "e")->period, 1);
    assert_int_equal(must_find(conf, "f")->period, 525600);
    assert_int_equal(must_find(conf, "f")->at, -1);
    master_conf_free(&conf);
    load_fails("EVENTS {\n e cmd=x period=0\n}\n",
               "t.conf:2: bad period \"0\" for entry e (a number 1..525600)");
    load_fails("EVENTS {\n e cmd=x period=525601\n}\n",
               "t.conf:2: bad period \"525601\" for entry e "
               "(a number 1..525600)");
    load_fails("EVENTS {\n e cmd=x period=5 at=0100\n}\n",
               "t.conf:2: both period and at given for event e");
    load_fails("EVENTS {\n\n e cmd=x\n}\n",
               "t.conf:3: missing period or at for event e");
}

static void test_unknown_keys_warn(void **state)
{
    struct master_conf *conf;

    (void)state;
    conf = load_warns("SERVICES {\n"
                      "  imap cmd=imapd listen=143 colour=\"blue\" prefork=1\n"
                      "}\n",
                      "t.conf:2: unknown key colour in SERVICES entry imap, "
                      "ignored");
    assert_int_equal(must_find(conf, "imap")->prefork, 1);
    master_conf_free(&conf);
    /* a known key in a section it does not belong to */
    conf = load_warns("START {\n  r cmd=x listen=/s\n}\n",
                      "t.conf:2: unknown key listen in START entry r, "
                      "ignored");
    assert_null(must_find(conf, "r")->listen);
    master_conf_free(&conf);
    conf = load_warns("DAEMON {\n  d cmd=x wait=y\n}\n",
                      "t.conf:2: unknown key wait in DAEMON entry d, ignored");
    master_conf_free(&conf);
    conf = load_warns("EVENTS {\n  e cmd=x period=5 prefork=2\n}\n",
                      "t.conf:2: unknown key prefork in EVENTS entry e, "
                      "ignored");
    master_conf_free(&conf);
    /* the line of a continued key */
    conf = load_warns("SERVICES {\n  imap cmd=imapd \\\n  listen=143 \\\n"
                      "  foo=1\n}\n",
                      "t.conf:4: unknown key foo in SERVICES entry imap");
    master_conf_free(&conf);
}

/* ---- errors ------------------------------------------------------------- */

static void test_errors(void **state)
{
    static const struct { const char *text, *msg; } cases[] = {
        { "FOO {\n}\n", "t.conf:1: unknown section FOO" },
        { "\n\nSERVICE {\n}\n", "t.conf:3: unknown section SERVICE" },
        { "imap cmd=imapd listen=143\n", "t.conf:1: line outside a section" },
        { "# c\nSERVICES\n{\n}\n", "t.conf:2: expected { after SERVICES" },
        { "}\n", "t.conf:1: unexpected } outside a section" },
        { "{\n", "t.conf:1: { without a section name" },
        { "START { r cmd=x }\n",
          "t.conf:1: text after { (entries go on lines of their own)" },
        { "START {\n r cmd=x\n} x\n", "t.conf:3: text after }" },
        { "START {\n r cmd=x\n", "t.conf:1: section START not closed "
          "(missing })" },
        { "START {\n r cmd=x\nSERVICES {\n}\n",
          "t.conf:3: missing } before section SERVICES" },
        { "START {\n r cmd=x\nDAEMON{\n}\n",
          "t.conf:3: missing } before section DAEMON" },
        { "START {\n r cmd=\"x\n}\n", "t.conf:2: unterminated quote" },
        { "START {\n r cmd=\"x", "t.conf:2: unterminated quote" },
        { "START {\n r cmd=x \\\n  foo=\"bar\n}\n",
          "t.conf:3: unterminated quote" },
        { "START {\n r\n}\n", "t.conf:2: missing cmd for entry r" },
        { "START {\n r cmd=\n}\n",
          "t.conf:2: empty or malformed cmd for entry r" },
        { "START {\n r cmd=\"  \"\n}\n",
          "t.conf:2: empty or malformed cmd for entry r" },
        { "DAEMON {\n d listen=x\n}\n", "t.conf:2: missing cmd for entry d" },
        { "SERVICES {\n s cmd=x\n}\n",
          "t.conf:2: missing listen for service s" },
        { "SERVICES {\n s cmd=x listen=1 cmd=y\n}\n",
          "t.conf:2: key cmd given twice in entry s" },
        { "SERVICES {\n s cmd=x listen\n}\n",
          "t.conf:2: expected key=value in entry s, got \"listen\"" },
        { "SERVICES {\n s cmd=x =5\n}\n",
          "t.conf:2: expected key=value in entry s, got \"=5\"" },
        { "SERVICES {\n s cmd=x li.sten=5\n}\n",
          "t.conf:2: bad key \"li.sten\" in entry s" },
        { "SERVICES {\n s cmd=\"x\"y listen=1\n}\n",
          "t.conf:2: text after the closing quote of cmd in entry s" },
        { "SERVICES {\n s cmd=x\"y\" listen=1\n}\n",
          "t.conf:2: quote inside the unquoted value of cmd in entry s "
          "(quote the whole value)" },
        { "SERVICES {\n s cmd=x listen=1 {\n}\n",
          "t.conf:2: unexpected { in entry s" },
        { "SERVICES {\n s cmd=x listen=1 }\n}\n",
          "t.conf:2: unexpected } in entry s" },
        { "SERVICES {\n {\n}\n", "t.conf:2: unexpected {" },
        { "SERVICES {\n im.ap cmd=x listen=1\n}\n",
          "t.conf:2: bad entry name \"im.ap\" (letters, digits, - and _, "
          "at most 64)" },
        { "SERVICES {\n \"imap\" cmd=x listen=1\n}\n",
          "t.conf:2: bad entry name \"\"imap\"\" (letters, digits, - and _, "
          "at most 64)" },
        { "SERVICES {\n s cmd=x listen=1 proto=udp7\n}\n",
          "t.conf:2: bad proto \"udp7\" for entry s (tcp, tcp4 or tcp6)" },
        { "SERVICES {\n s cmd=x listen=1 proto=\n}\n",
          "t.conf:2: bad proto \"\" for entry s (tcp, tcp4 or tcp6)" },
        { "SERVICES {\n imap cmd=x listen=1\n imap cmd=y listen=2\n}\n",
          "t.conf:3: entry name imap given twice (first at line 2)" },
        { "SERVICES {\n xyz cmd=x listen=1\n}\nDAEMON {\n xyz cmd=y\n}\n",
          "t.conf:5: entry name xyz given twice (first at line 2)" },
        { "EVENTS {\n xyz cmd=x period=5\n}\nDAEMON {\n xyz cmd=y\n}\n",
          "t.conf:5: entry name xyz given twice (first at line 2)" },
        { "START {\n xyz cmd=x\n xyz cmd=y\n}\n",
          "t.conf:3: entry name xyz given twice (first at line 2)" },
        { "START {\n r cmd=x\n}\nSTART {\n r cmd=y\n}\n",
          "t.conf:5: entry name r given twice (first at line 2)" },
    };
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        load_fails(cases[i].text, cases[i].msg);
}

static void test_nul_and_limits(void **state)
{
    static const char with_nul[] = "START {\n r cmd=x\n s cmd=y\0z\n}\n";
    struct master_conf *conf;
    struct buf b = BUF_INITIALIZER;
    char *error;
    size_t i;

    (void)state;
    assert_int_equal(load_len(with_nul, sizeof(with_nul) - 1, &conf, &error,
                              NULL), -1);
    assert_string_equal(error, "t.conf:3: NUL byte in the file");
    free(error);
    assert_int_equal(load_len("\0", 1, &conf, &error, NULL), -1);
    assert_string_equal(error, "t.conf:1: NUL byte in the file");
    free(error);

    /* too many words on one line */
    buf_appendcstr(&b, "SERVICES {\n s cmd=x listen=1");
    for (i = 0; i < 70; i++)
        buf_printf(&b, " k%zu=1", i);
    buf_appendcstr(&b, "\n}\n");
    load_fails(buf_cstring(&b),
               "t.conf:2: too many words on one line (at most 64)");

    /* an overlong value */
    buf_reset(&b);
    buf_appendcstr(&b, "START {\n r cmd=\"");
    for (i = 0; i < 5000; i++)
        buf_putc(&b, 'a');
    buf_appendcstr(&b, "\"\n}\n");
    load_fails(buf_cstring(&b), "t.conf:2: cmd value too long for entry r "
               "(at most 4096 bytes)");

    /* an overlong name */
    buf_reset(&b);
    buf_appendcstr(&b, "START {\n ");
    for (i = 0; i < 65; i++)
        buf_putc(&b, 'n');
    buf_appendcstr(&b, " cmd=x\n}\n");
    {
        char *msg = NULL;
        struct buf m = BUF_INITIALIZER;

        buf_appendcstr(&m, "t.conf:2: bad entry name \"");
        for (i = 0; i < 65; i++)
            buf_putc(&m, 'n');
        buf_appendcstr(&m, "\" (letters, digits, - and _, at most 64)");
        msg = buf_release(&m);
        load_fails(buf_cstring(&b), msg);
        free(msg);
    }
    /* non-ASCII bytes are shown sanitized */
    load_fails("F\x01\xffO {\n}\n", "t.conf:1: unknown section F??O");

    /* more than 1 MiB */
    buf_reset(&b);
    while (b.len <= 1024 * 1024)
        buf_appendcstr(&b, "# padding padding padding padding padding\n");
    assert_int_equal(load_len(b.s, b.len, &conf, &error, NULL), -1);
    assert_string_equal(error, "t.conf:1: file too large (more than "
                        "1048576 bytes)");
    free(error);

    /* the same through a file */
    {
        char *path = th_path(tmpdir, "big.conf");
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        struct buf m = BUF_INITIALIZER;

        assert_true(fd >= 0);
        assert_int_equal(write(fd, b.s, b.len), (ssize_t)b.len);
        close(fd);
        assert_int_equal(master_conf_load(path, &conf, &error), -1);
        assert_null(conf);
        buf_printf(&m, "%s: file too large (more than 1048576 bytes)", path);
        assert_string_equal(error, buf_cstring(&m));
        buf_free(&m);
        free(error);
        unlink(path);
        free(path);
    }

    /* at most 4096 entries */
    buf_reset(&b);
    buf_appendcstr(&b, "START {\n");
    for (i = 0; i < 4097; i++)
        buf_printf(&b, "r%zu cmd=x\n", i);
    buf_appendcstr(&b, "}\n");
    load_fails(buf_cstring(&b), "t.conf:4098: too many entries (at most 4096)");
    buf_truncate(&b, b.len - strlen("r4096 cmd=x\n}\n"));
    buf_appendcstr(&b, "}\n");
    assert_int_equal(load(buf_cstring(&b), &conf, &error, NULL), 0);
    assert_int_equal(conf->nentries, 4096);
    master_conf_free(&conf);
    buf_free(&b);
}

/* ---- syntax ------------------------------------------------------------- */

static void test_quoting_and_comments(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;

    (void)state;
    conf = load_ok(
        "# a comment line\n"
        "   # an indented one\n"
        "START { # a comment after the brace\n"
        "  r cmd=\"echo # not a comment\"   # but this is\n"
        "  q cmd=plain#comment right after an unquoted value\n"
        "  p cmd=\"a  b\tc\" # tabs and spaces kept inside quotes\n"
        "  # a comment inside a section\n"
        "} # after the brace\n"
        "SERVICES {\n"
        "\tlmtp\tcmd=\"lmtpd\"\tlisten=\"/run/lmtp sock\"\t\n"
        "  x cmd='single' listen=1\n"
        "}\n");
    e = must_find(conf, "r");
    assert_string_equal(e->cmd, "echo # not a comment");
    e = must_find(conf, "q");
    assert_string_equal(e->cmd, "plain");
    e = must_find(conf, "p");
    assert_string_equal(e->cmd, "a  b\tc");
    e = must_find(conf, "lmtp");
    assert_string_equal(e->listen, "/run/lmtp sock");
    assert_string_equal(e->listen_host, "/run/lmtp sock");
    /* single quotes are ordinary characters, as in Cyrus */
    e = must_find(conf, "x");
    assert_string_equal(e->cmd, "'single'");
    assert_int_equal(conf->nentries, 5);
    master_conf_free(&conf);

    /* section names ignore case; no newline at the end of the file */
    conf = load_ok("services{\n s cmd=x listen=1\n}");
    assert_int_equal(must_find(conf, "s")->section, MASTER_SECTION_SERVICES);
    master_conf_free(&conf);
    /* names with - and _ and digits */
    conf = load_ok("DAEMON {\n a-b_9 cmd=x\n}\n");
    assert_non_null(master_conf_find(conf, "a-b_9"));
    master_conf_free(&conf);
    /* "{" on the header line apart from the name, quoted empty value */
    conf = load_ok("START    {   \n r cmd=x\n   }   \n");
    master_conf_free(&conf);
}

static void test_continuation(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;

    (void)state;
    conf = load_ok(
        "SERVICES {\n"
        "  imap cmd=\"imapd -U 30\" \\\n"
        "       listen=143 \\   \n"         /* blanks after the backslash */
        "       prefork=2\\\n"              /* backslash ends a value */
        "       maxchild=9\n"
        "  pop cmd=pop3d listen=110\n"
        "  odd cmd=a\\b listen=/tmp/x\\y\n"      /* backslash inside: a char */
        "}\n");
    e = must_find(conf, "imap");
    assert_int_equal(e->line, 2);
    assert_string_equal(e->cmd, "imapd -U 30");
    assert_string_equal(e->listen, "143");
    assert_int_equal(e->prefork, 2);
    assert_int_equal(e->maxchild, 9);
    e = must_find(conf, "pop");
    assert_int_equal(e->line, 6);
    e = must_find(conf, "odd");
    assert_string_equal(e->cmd, "a\\b");
    master_conf_free(&conf);

    /* a backslash at the very end of the text */
    conf = load_ok("START {\n r cmd=x\n} \\");
    master_conf_free(&conf);
    /* a backslash inside quotes does not continue */
    load_fails("START {\n r cmd=\"x \\\n y\"\n}\n",
               "t.conf:2: unterminated quote");
}

static void test_crlf(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;

    (void)state;
    conf = load_ok("# dos\r\nSTART {\r\n r cmd=\"ctl -r\"\r\n}\r\n"
                   "SERVICES {\r\n"
                   "  lmtp cmd=lmtpd \\\r\n listen=/run/lmtp\r\n"
                   "  imap cmd=imapd listen=143 # comment\r\n"
                   "}\r\n");
    e = must_find(conf, "r");
    assert_string_equal(e->cmd, "ctl -r");
    e = must_find(conf, "lmtp");
    assert_string_equal(e->listen, "/run/lmtp");
    assert_int_equal(e->line, 6);
    e = must_find(conf, "imap");
    assert_string_equal(e->listen_port, "143");
    assert_int_equal(e->line, 8);
    master_conf_free(&conf);
    load_fails("START {\r\n r cmd=\"x\r\n}\r\n", "t.conf:2: unterminated quote");
}

/* ---- listen ------------------------------------------------------------- */

static void test_listen_forms(void **state)
{
    static const struct {
        const char *listen, *proto;
        enum master_listen_kind kind;
        const char *host, *port;
    } good[] = {
        { "/run/cyrus/socket/lmtp", NULL, MASTER_LISTEN_UNIX,
          "/run/cyrus/socket/lmtp", NULL },
        { "127.0.0.1:2424", NULL, MASTER_LISTEN_TCP, "127.0.0.1", "2424" },
        { "localhost:lmtp", NULL, MASTER_LISTEN_TCP, "localhost", "lmtp" },
        { "mail.example.org:smtp", "tcp6", MASTER_LISTEN_TCP,
          "mail.example.org", "smtp" },
        { "[::1]:2424", NULL, MASTER_LISTEN_TCP, "::1", "2424" },
        { "[::]:24", "tcp6", MASTER_LISTEN_TCP, "::", "24" },
        { "[::ffff:127.0.0.1]:24", NULL, MASTER_LISTEN_TCP,
          "::ffff:127.0.0.1", "24" },
        { "2424", NULL, MASTER_LISTEN_TCP, NULL, "2424" },
        { "65535", "tcp4", MASTER_LISTEN_TCP, NULL, "65535" },
        { "lmtp", NULL, MASTER_LISTEN_TCP, NULL, "lmtp" },
        { "imaps", "tcp6", MASTER_LISTEN_TCP, NULL, "imaps" },
        { "*:143", NULL, MASTER_LISTEN_TCP, NULL, "143" },
        { "0.0.0.0:143", "tcp4", MASTER_LISTEN_TCP, "0.0.0.0", "143" },
    };
    static const struct { const char *listen, *proto, *why; } bad[] = {
        { "", NULL, "empty" },
        { "[::1]", NULL, "expected :port after ]" },
        { "[::1]24", NULL, "expected :port after ]" },
        { "[::1:24", NULL, "missing ]" },
        { "[1.2.3.4]:24", NULL, "not an IPv6 address inside [ ]" },
        { "[]:24", NULL, "empty host" },
        { "::1:24", NULL, "IPv6 addresses need brackets: [addr]:port" },
        { "host:", NULL, "missing port" },
        { ":24", NULL, "empty host" },
        { "[::1]:", NULL, "missing port" },
        { "0", NULL, "port out of range 1..65535" },
        { "65536", NULL, "port out of range 1..65535" },
        { "host:99999", NULL, "port out of range 1..65535" },
        { "run/lmtp", NULL, "bad character in port" },
        { "ho st:24", NULL, "bad character in host" },
        { "host:l!mtp", NULL, "bad character in port" },
        { "[::1]:24", "tcp4", "IPv6 address with proto tcp4" },
        { "127.0.0.1:24", "tcp6", "IPv4 address with proto tcp6" },
        { "h:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
          NULL, "port too long" },
        { "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh"
          "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh"
          "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh"
          "hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh"
          ":24", NULL, "host too long" },
        { "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
          "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
          NULL, "UNIX socket path too long" },
    };
    char line[400], msg[400];
    struct master_conf *conf;
    const struct master_entry *e;
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        snprintf(line, sizeof(line), "s cmd=x listen=\"%s\"%s%s",
                 good[i].listen, good[i].proto ? " proto=" : "",
                 good[i].proto ? good[i].proto : "");
        conf = service_ok(line);
        e = must_find(conf, "s");
        assert_int_equal(e->listen_kind, good[i].kind);
        assert_string_equal(e->listen, good[i].listen);
        if (good[i].host)
            assert_string_equal(e->listen_host, good[i].host);
        else
            assert_null(e->listen_host);
        if (good[i].port)
            assert_string_equal(e->listen_port, good[i].port);
        else
            assert_null(e->listen_port);
        assert_string_equal(e->proto, good[i].proto ? good[i].proto : "tcp");
        master_conf_free(&conf);
    }
    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(line, sizeof(line), "s cmd=x listen=\"%s\"%s%s",
                 bad[i].listen, bad[i].proto ? " proto=" : "",
                 bad[i].proto ? bad[i].proto : "");
        snprintf(msg, sizeof(msg), "bad listen address \"%.80s\" for service "
                 "s: %s", bad[i].listen, bad[i].why);
        service_fails(line, msg);
    }
    /* 107 bytes is the longest path that fits sun_path with its NUL */
    {
        char path[110];

        memset(path, 'p', 107);
        path[0] = '/';
        path[107] = '\0';
        snprintf(line, sizeof(line), "s cmd=x listen=%s", path);
        conf = service_ok(line);
        assert_string_equal(must_find(conf, "s")->listen_host, path);
        master_conf_free(&conf);
    }
}

static void test_proto(void **state)
{
    static const char *const ok[] = { "tcp", "tcp4", "tcp6", "TCP6" };
    struct master_conf *conf;
    char line[200];
    size_t i;

    (void)state;
    for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        snprintf(line, sizeof(line), "s cmd=x listen=24 proto=\"%s\"", ok[i]);
        conf = service_ok(line);
        assert_int_equal(strcasecmp(must_find(conf, "s")->proto, ok[i]), 0);
        assert_int_equal(must_find(conf, "s")->proto[0], 't');
        master_conf_free(&conf);
    }
    /* udp is Cyrus's but not ours: the entry is dropped with a warning,
     * so that a stock cyrus.conf (notifyd) still loads */
    conf = load_warns("SERVICES {\n"
                      "  imap cmd=imapd listen=143\n"
                      "  notify cmd=notifyd listen=/run/notify proto=udp\n"
                      "  n6 cmd=notifyd listen=99 proto=udp6\n"
                      "}\n",
                      "t.conf:3: proto udp is not supported (service notify),"
                      " entry ignored");
    assert_int_equal(conf->nentries, 1);
    assert_null(master_conf_find(conf, "notify"));
    assert_null(master_conf_find(conf, "n6"));
    master_conf_free(&conf);
    /* a dropped entry still has to be well formed */
    service_fails("n cmd=x listen=\"::1:4\" proto=udp",
                  "bad listen address \"::1:4\" for service n: IPv6 "
                  "addresses need brackets: [addr]:port");
}

/* ---- the helpers -------------------------------------------------------- */

static void check_argv(const char *cmd, const char *const *want)
{
    char **argv = master_conf_split_cmd(cmd);
    size_t i;

    assert_non_null(argv);
    for (i = 0; want[i]; i++) {
        assert_non_null(argv[i]);
        assert_string_equal(argv[i], want[i]);
    }
    assert_null(argv[i]);
    master_conf_argv_free(argv);
}

static void test_split_cmd(void **state)
{
    (void)state;
    check_argv("lmtpd", (const char *const[]){ "lmtpd", NULL });
    check_argv("  imapd  -U 30\t-s ",
               (const char *const[]){ "imapd", "-U", "30", "-s", NULL });
    check_argv("sh -c \"echo hi there\" x",
               (const char *const[]){ "sh", "-c", "echo hi there", "x",
                                      NULL });
    check_argv("a\"b c\"d", (const char *const[]){ "ab cd", NULL });
    check_argv("x \"\" y", (const char *const[]){ "x", "", "y", NULL });
    check_argv("/usr/sbin/cyrus ctl_cyrusdb -r",
               (const char *const[]){ "/usr/sbin/cyrus", "ctl_cyrusdb", "-r",
                                      NULL });
    {
        /* many words: the array grows */
        struct buf b = BUF_INITIALIZER;
        char **argv;
        size_t i;

        for (i = 0; i < 100; i++)
            buf_printf(&b, "w%zu ", i);
        argv = master_conf_split_cmd(buf_cstring(&b));
        assert_non_null(argv);
        for (i = 0; i < 100; i++) {
            char w[16];

            snprintf(w, sizeof(w), "w%zu", i);
            assert_string_equal(argv[i], w);
        }
        assert_null(argv[100]);
        master_conf_argv_free(argv);
        buf_free(&b);
    }
    assert_null(master_conf_split_cmd("a \"b c"));
    assert_null(master_conf_split_cmd(""));
    assert_null(master_conf_split_cmd("   \t "));
    assert_null(master_conf_split_cmd(NULL));
    master_conf_argv_free(NULL);
}

static void test_listen_differs(void **state)
{
    struct master_conf *a, *b;

    (void)state;
    a = load_ok("SERVICES {\n"
                " s1 cmd=x listen=143 prefork=1\n"
                " s2 cmd=x listen=143\n"
                " s3 cmd=x listen=/run/a\n"
                " s4 cmd=x listen=143 proto=tcp4\n"
                "}\n");
    b = load_ok("SERVICES {\n"
                " s1 cmd=y listen=143 prefork=5 maxchild=9 maxfds=99\n"
                " s2 cmd=x listen=144\n"
                " s3 cmd=x listen=/run/b\n"
                " s4 cmd=x listen=143 proto=tcp6\n"
                "}\n");
    /* only limits and cmd differ */
    assert_int_equal(master_conf_listen_differs(must_find(a, "s1"),
                                                must_find(b, "s1")), 0);
    assert_int_equal(master_conf_listen_differs(must_find(a, "s1"),
                                                must_find(a, "s1")), 0);
    assert_int_equal(master_conf_listen_differs(must_find(a, "s1"),
                                                must_find(a, "s2")), 0);
    /* port, path, proto, kind */
    assert_int_equal(master_conf_listen_differs(must_find(a, "s2"),
                                                must_find(b, "s2")), 1);
    assert_int_equal(master_conf_listen_differs(must_find(a, "s3"),
                                                must_find(b, "s3")), 1);
    assert_int_equal(master_conf_listen_differs(must_find(a, "s4"),
                                                must_find(b, "s4")), 1);
    assert_int_equal(master_conf_listen_differs(must_find(a, "s1"),
                                                must_find(a, "s4")), 1);
    assert_int_equal(master_conf_listen_differs(must_find(a, "s1"),
                                                must_find(a, "s3")), 1);
    /* entries without listen (other sections) */
    master_conf_free(&b);
    b = load_ok("START {\n r cmd=x\n}\nDAEMON {\n d cmd=y\n}\n");
    assert_int_equal(master_conf_listen_differs(must_find(b, "r"),
                                                must_find(b, "d")), 0);
    assert_int_equal(master_conf_listen_differs(must_find(b, "r"),
                                                must_find(a, "s1")), 1);
    assert_int_equal(master_conf_listen_differs(must_find(a, "s3"),
                                                must_find(b, "d")), 1);
    master_conf_free(&a);
    master_conf_free(&b);
}

static void test_remove_insert(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;

    (void)state;
    conf = load_ok("SERVICES {\n imap cmd=imapd listen=127.0.0.1:143 "
                   "maxchild=7\n}\n"
                   "EVENTS {\n a cmd=\"x -E 3\" at=0401\n"
                   " b cmd=y period=5\n}\n");
    assert_int_equal(conf->nentries, 3);
    /* a copy right after its original, every string its own */
    assert_int_equal(master_conf_insert_copy(conf, 0, "imap2", "imapd -s"), 0);
    assert_int_equal(master_conf_insert_copy(conf, 2, "a-cleanup", "z"), 0);
    assert_int_equal(conf->nentries, 5);
    e = &conf->entries[1];
    assert_string_equal(e->name, "imap2");
    assert_string_equal(e->cmd, "imapd -s");
    assert_string_equal(e->listen, "127.0.0.1:143");
    assert_ptr_not_equal(e->listen, conf->entries[0].listen);
    assert_string_equal(e->listen_host, "127.0.0.1");
    assert_string_equal(e->proto, "tcp");
    assert_int_equal(e->maxchild, 7);
    assert_int_equal(e->line, 2);
    e = &conf->entries[3];
    assert_string_equal(e->name, "a-cleanup");
    assert_int_equal(e->section, MASTER_SECTION_EVENTS);
    assert_int_equal(e->at, 401);
    assert_null(e->listen);
    assert_string_equal(conf->entries[4].name, "b");
    assert_int_equal(master_conf_insert_copy(conf, 5, "x", "y"), -1);
    assert_int_equal(master_conf_insert_copy(conf, 0, NULL, "y"), -1);
    assert_int_equal(conf->nentries, 5);
    /* removal keeps the order of the rest */
    master_conf_remove(conf, 0);
    master_conf_remove(conf, 2);
    master_conf_remove(conf, 9);
    assert_int_equal(conf->nentries, 3);
    assert_string_equal(conf->entries[0].name, "imap2");
    assert_string_equal(conf->entries[1].name, "a");
    assert_string_equal(conf->entries[2].name, "b");
    assert_null(master_conf_find(conf, "a-cleanup"));
    master_conf_remove(conf, 2);
    master_conf_remove(conf, 1);
    master_conf_remove(conf, 0);
    assert_int_equal(conf->nentries, 0);
    master_conf_remove(conf, 0);
    master_conf_free(&conf);
}

static void test_find(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;

    (void)state;
    /* Debian names a START entry like an EVENTS one: allowed; find
     * prefers the long-lived entry */
    conf = load_ok("START {\n delprune cmd=\"expire -E 3\"\n only cmd=x\n}\n"
                   "EVENTS {\n delprune cmd=\"expire -E 3\" at=0401\n}\n"
                   "SERVICES {\n imap cmd=imapd listen=143\n}\n");
    assert_int_equal(conf->nentries, 4);
    e = must_find(conf, "delprune");
    assert_int_equal(e->section, MASTER_SECTION_EVENTS);
    assert_int_equal(e->line, 6);
    e = must_find(conf, "only");
    assert_int_equal(e->section, MASTER_SECTION_START);
    e = must_find(conf, "imap");
    assert_int_equal(e->section, MASTER_SECTION_SERVICES);
    assert_null(master_conf_find(conf, "IMAP"));
    assert_null(master_conf_find(conf, "ima"));
    assert_null(master_conf_find(conf, ""));
    assert_null(master_conf_find(conf, NULL));
    assert_null(master_conf_find(NULL, "imap"));
    master_conf_free(&conf);
    /* the other order too */
    conf = load_ok("EVENTS {\n p cmd=x period=5\n}\nSTART {\n p cmd=y\n}\n");
    assert_int_equal(must_find(conf, "p")->section, MASTER_SECTION_EVENTS);
    master_conf_free(&conf);
}

/* ---- real files --------------------------------------------------------- */

static void test_load_file(void **state)
{
    static const char text[] =
        "SERVICES {\n  lmtpunix cmd=\"lmtpd\" listen=\"/run/cyrus/socket/lmtp\""
        " prefork=0 maxchild=20\n}\n";
    char *path = th_path(tmpdir, "cyrus.conf");
    struct master_conf *conf;
    const struct master_entry *e;
    char *error;
    int fd;

    (void)state;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, sizeof(text) - 1),
                     (ssize_t)(sizeof(text) - 1));
    close(fd);
    assert_int_equal(master_conf_load(path, &conf, &error), 0);
    assert_null(error);
    /* the Cyrus 3.6 example line */
    e = must_find(conf, "lmtpunix");
    assert_string_equal(e->cmd, "lmtpd");
    assert_int_equal(e->listen_kind, MASTER_LISTEN_UNIX);
    assert_string_equal(e->listen_host, "/run/cyrus/socket/lmtp");
    assert_int_equal(e->prefork, 0);
    assert_int_equal(e->maxchild, 20);
    master_conf_free(&conf);

    /* errors name the file */
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "\n\nBOGUS {\n}\n", 12), 12);
    close(fd);
    assert_int_equal(master_conf_load(path, &conf, &error), -1);
    assert_null(conf);
    {
        struct buf b = BUF_INITIALIZER;

        buf_printf(&b, "%s:3: unknown section BOGUS", path);
        assert_string_equal(error, buf_cstring(&b));
        buf_free(&b);
    }
    free(error);
    unlink(path);
    assert_int_equal(master_conf_load(path, &conf, &error), -1);
    assert_null(conf);
    assert_non_null(strstr(error, "cannot open: No such file or directory"));
    assert_memory_equal(error, path, strlen(path));
    free(error);
    /* a directory: open works, read does not */
    assert_int_equal(master_conf_load(tmpdir, &conf, &error), -1);
    assert_null(conf);
    assert_non_null(strstr(error, ": cannot read: Is a directory"));
    free(error);
    free(path);
}

static void test_debian(void **state)
{
    struct master_conf *conf;
    const struct master_entry *e;
    struct capture c;
    char *error, *warn;
    int r;

    (void)state;
    if (access("/etc/cyrus.conf", R_OK) != 0) {
        print_message("skipped: /etc/cyrus.conf is absent\n");
        skip();
    }
    capture_begin(&c);
    r = master_conf_load("/etc/cyrus.conf", &conf, &error);
    warn = capture_end(&c);
    if (r != 0) {
        print_error("/etc/cyrus.conf: %s\n", error);
        fail();
    }
    print_message("/etc/cyrus.conf: %zu entries; warnings:\n%s",
                  conf->nentries, warn);
    /* every SERVICES entry has a parsed listen */
    {
        size_t i;

        for (i = 0; i < conf->nentries; i++) {
            e = &conf->entries[i];
            assert_non_null(e->cmd);
            if (e->section == MASTER_SECTION_SERVICES) {
                assert_non_null(e->listen);
                assert_non_null(e->proto);
                assert_true(e->listen_kind == MASTER_LISTEN_UNIX
                            || e->listen_port != NULL);
            }
        }
    }
    /* the entries of Debian's stock file, when it is unmodified */
    e = master_conf_find(conf, "lmtpunix");
    if (e) {
        assert_int_equal(e->listen_kind, MASTER_LISTEN_UNIX);
        assert_string_equal(e->cmd, "lmtpd");
    }
    e = master_conf_find(conf, "sieve");
    if (e && strcmp(e->listen, "localhost:sieve") == 0) {
        assert_string_equal(e->listen_host, "localhost");
        assert_string_equal(e->listen_port, "sieve");
    }
    e = master_conf_find(conf, "checkpoint");
    if (e)
        assert_int_equal(e->section, MASTER_SECTION_EVENTS);
    if (strstr(warn, "notifyd") || strstr(warn, "service notify"))
        assert_null(master_conf_find(conf, "notify"));
    free(warn);
    master_conf_free(&conf);
}

/* ---- robustness --------------------------------------------------------- */

static const char valid_file[] =
    "# a cyrus.conf using every construct\n"
    "START {\n"
    "  recover cmd=\"ctl_cyrusdb -r\"   # comment\n"
    "}\n"
    "SERVICES {\n"
    "  imap cmd=\"imapd -U 30\" listen=\"imap\" prefork=0 maxchild=100\n"
    "  lmtp cmd=lmtpd listen=\"[::1]:2424\" proto=tcp6 prefork=1 \\\n"
    "       maxchild=20 maxforkrate=5 maxfds=512 babysit=true\r\n"
    "  lmtpunix cmd=\"lmtpd\" listen=\"/run/cyrus/socket/lmtp\" prefork=0"
    " maxchild=20 backlog=64 maxuses=10 idletimeout=60\n"
    "  sieve cmd=\"timsieved\" listen=\"localhost:sieve\" colour=red\n"
    "  notify cmd=\"notifyd\" listen=\"/run/notify\" proto=\"udp\"\n"
    "}\n"
    "EVENTS {\n"
    "  checkpoint cmd=\"ctl_cyrusdb -c\" period=30\n"
    "  delprune cmd=\"cyr_expire -E 3\" at=0401\n"
    "}\n"
    "DAEMON {\n"
    "  idled cmd=\"idled\"\n"
    "}\n";

static void check_result(int r, struct master_conf *conf, char *error,
                         size_t len)
{
    if (r == 0) {
        assert_non_null(conf);
        assert_null(error);
        assert_true(conf->nentries <= 10);
        master_conf_free(&conf);
    } else {
        assert_int_equal(r, -1);
        assert_null(conf);
        assert_non_null(error);
        if (strncmp(error, "t.conf:", 7) != 0) {
            print_error("len %zu: bad error text %s\n", len, error);
            fail();
        }
        free(error);
    }
}

static void test_truncated_prefixes(void **state)
{
    size_t len, full = sizeof(valid_file) - 1;
    struct master_conf *conf;
    char *error;
    int r, loaded = 0, failed = 0;

    (void)state;
    log_init("test_master_conf", LOG_TO_NONE);
    /* the whole file loads */
    r = master_conf_load_string("t.conf", valid_file, full, &conf, &error);
    assert_int_equal(r, 0);
    assert_int_equal(conf->nentries, 8);
    master_conf_free(&conf);
    for (len = 0; len <= full; len++) {
        char *copy = malloc(len ? len : 1);

        assert_non_null(copy);
        memcpy(copy, valid_file, len);
        r = master_conf_load_string("t.conf", copy, len, &conf, &error);
        if (r == 0)
            loaded++;
        else
            failed++;
        check_result(r, conf, error, len);
        free(copy);
    }
    /* both outcomes occur: the test is not vacuous */
    assert_true(loaded > 0);
    assert_true(failed > 0);
    log_init("test_master_conf", LOG_TO_STDERR);
}

/* Each byte replaced by each of a few troublesome ones. */
static void test_mutations(void **state)
{
    static const char repl[] = { '"', '\\', '{', '}', '#', '\n', '=', '\0',
                                 ' ', '\r', '\xff', '[' };
    size_t full = sizeof(valid_file) - 1, i, j;
    struct master_conf *conf;
    char *error;
    int r;

    (void)state;
    log_init("test_master_conf", LOG_TO_NONE);
    for (i = 0; i < full; i++) {
        for (j = 0; j < sizeof(repl); j++) {
            char *copy = malloc(full);

            assert_non_null(copy);
            memcpy(copy, valid_file, full);
            copy[i] = repl[j];
            r = master_conf_load_string("t.conf", copy, full, &conf, &error);
            check_result(r, conf, error, full);
            free(copy);
        }
    }
    log_init("test_master_conf", LOG_TO_STDERR);
}

static int group_setup(void **state)
{
    (void)state;
    log_init("test_master_conf", LOG_TO_STDERR);
    tmpdir = th_mkdtemp("master_conf");
    return tmpdir ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    th_rmrf(tmpdir);
    free(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_key),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_babysit),
        cmocka_unit_test(test_ranges),
        cmocka_unit_test(test_prefork_maxchild),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_unknown_keys_warn),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_nul_and_limits),
        cmocka_unit_test(test_quoting_and_comments),
        cmocka_unit_test(test_continuation),
        cmocka_unit_test(test_crlf),
        cmocka_unit_test(test_listen_forms),
        cmocka_unit_test(test_proto),
        cmocka_unit_test(test_split_cmd),
        cmocka_unit_test(test_listen_differs),
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_remove_insert),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_debian),
        cmocka_unit_test(test_truncated_prefixes),
        cmocka_unit_test(test_mutations),
    };

    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
