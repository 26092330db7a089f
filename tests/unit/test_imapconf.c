/*
 * test_imapconf.c - unit tests of lib/imapconf.c: real files in a
 * temporary directory, warnings captured by pointing the process's stderr
 * (where log_init(..., LOG_TO_STDERR) sends them) at a file.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "tests/testhelp.h"

static char *tmpdir;
static char *confpath;      /* tmpdir/imapd.conf */

/* ---- capturing a file descriptor (stderr or stdout) --------------------- */

struct capture {
    int fd;         /* 1 or 2 */
    int saved;
    char *path;
};

static void capture_begin(struct capture *c, int fd)
{
    int f;

    fflush(stdout);
    fflush(stderr);
    c->fd = fd;
    c->path = th_path(tmpdir, fd == 1 ? "stdout.txt" : "stderr.txt");
    f = open(c->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(f >= 0);
    c->saved = dup(fd);
    assert_true(c->saved >= 0);
    assert_true(dup2(f, fd) >= 0);
    close(f);
}

/* Restore the descriptor; returns what was written (caller frees). */
static char *capture_end(struct capture *c)
{
    struct buf b = BUF_INITIALIZER;
    char chunk[4096];
    ssize_t n;
    int f;

    fflush(stdout);
    fflush(stderr);
    assert_true(dup2(c->saved, c->fd) >= 0);
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

/* ---- loading ------------------------------------------------------------ */

static void write_file(const char *path, const char *text, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    assert_int_equal(close(fd), 0);
}

/*
 * Write `text` to the configuration file and load it.  Returns the load's
 * result; *conf_r, *error_r as imapconf_load sets them; *warn_r (if not
 * NULL) receives everything logged meanwhile.
 */
static int load_len(const char *text, size_t len, struct imapconf **conf_r,
                    char **error_r, char **warn_r)
{
    struct capture c;
    char *warn;
    int r;

    write_file(confpath, text, len);
    *conf_r = (struct imapconf *)(uintptr_t)0x1;   /* poisoned */
    *error_r = (char *)(uintptr_t)0x1;
    capture_begin(&c, 2);
    r = imapconf_load(confpath, conf_r, error_r);
    warn = capture_end(&c);
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

static int load(const char *text, struct imapconf **conf_r, char **error_r,
                char **warn_r)
{
    return load_len(text, strlen(text), conf_r, error_r, warn_r);
}

/* Load text that must succeed without any warning. */
static struct imapconf *load_ok(const char *text)
{
    struct imapconf *conf;
    char *error, *warn;

    if (load(text, &conf, &error, &warn) != 0) {
        print_error("unexpected error: %s\n", error);
        fail();
    }
    assert_string_equal(warn, "");
    free(warn);
    return conf;
}

/* "PATH:LINE: " + rest, malloc'd. */
static char *where(unsigned line, const char *rest)
{
    char *s;

    assert_true(asprintf(&s, "%s:%u: %s", confpath, line, rest) > 0);
    return s;
}

/* Load text that must fail with an error starting "PATH:LINE: prefix". */
static void load_fails(const char *text, unsigned line, const char *prefix)
{
    struct imapconf *conf;
    char *error, *expect = where(line, prefix);

    if (load(text, &conf, &error, NULL) != -1) {
        print_error("no error for: %s\n", text);
        fail();
    }
    if (strncmp(error, expect, strlen(expect)) != 0) {
        print_error("error <%s> does not start with <%s>\n", error, expect);
        fail();
    }
    free(expect);
    free(error);
}

/* ---- setup -------------------------------------------------------------- */

static int group_setup(void **state)
{
    (void)state;
    log_init("test_imapconf", LOG_TO_STDERR);
    tmpdir = th_mkdtemp("imapconf");
    confpath = th_path(tmpdir, "imapd.conf");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    th_rmrf(tmpdir);
    free(tmpdir);
    free(confpath);
    return 0;
}

/* ---- the tests ---------------------------------------------------------- */

/* The keys the table must hold, with their documented defaults. */
static const struct {
    const char *key;
    enum imapconf_type type;
    const char *def;
} expected_keys[] = {
    { "configdirectory", IMAPCONF_STRING, IMAPCONF_DEFAULT_CONFIGDIR },
    { "defaultpartition", IMAPCONF_STRING, "default" },
    { "mboxlist_db", IMAPCONF_DBNAME, "skiplist" },
    { "duplicate_db", IMAPCONF_DBNAME, "skiplist" },
    { "seenstate_db", IMAPCONF_DBNAME, "skiplist" },
    { "subscription_db", IMAPCONF_DBNAME, "flat" },
    { "quota_db", IMAPCONF_DBNAME, "lmdb" },
    { "etcd_endpoints", IMAPCONF_STRING, "http://127.0.0.1:2379" },
    { "etcd_prefix", IMAPCONF_STRING, "/cyrusdeliver/" },
    { "etcd_timeout", IMAPCONF_INT, "5000" },
    { "etcd_cacert", IMAPCONF_STRING, "" },
    { "etcd_cert", IMAPCONF_STRING, "" },
    { "etcd_key", IMAPCONF_STRING, "" },
    { "hashimapspool", IMAPCONF_SWITCH, "no" },
    { "unixhierarchysep", IMAPCONF_SWITCH, "no" },
    { "duplicatesuppression", IMAPCONF_SWITCH, "yes" },
    { "maxmessagesize", IMAPCONF_INT, "0" },
    { "quotawarn", IMAPCONF_INT, "90" },
    { "lmtp_downcase_rcpt", IMAPCONF_SWITCH, "yes" },
    { "lmtp_over_quota_perm_failure", IMAPCONF_SWITCH, "no" },
    { "virtdomains", IMAPCONF_ENUM, "off" },
    { "defaultdomain", IMAPCONF_STRING, "" },
    { "admins", IMAPCONF_STRING, "" },
    { "servername", IMAPCONF_STRING, "" },
    { "allowplaintext", IMAPCONF_SWITCH, "no" },
    { "tls_server_cert", IMAPCONF_STRING, "" },
    { "tls_server_key", IMAPCONF_STRING, "" },
    { "cyrus_user", IMAPCONF_STRING, "cyrus" },
    { "stage_dirs", IMAPCONF_INT, "16" },
    { "spool_sync", IMAPCONF_ENUM, "journal" },
    { "journal_size", IMAPCONF_INT, "16777216" },
    { "spool_sync_flags", IMAPCONF_SWITCH, "no" },
    { "lmtp_bare_newlines", IMAPCONF_ENUM, "reject" },
    { "expunge_mode", IMAPCONF_ENUM, "immediate" },
    { "delete_mode", IMAPCONF_ENUM, "immediate" },
    { "maxheaderlines", IMAPCONF_INT, "1000" },
    { "lmtp_max_recipients", IMAPCONF_INT, "1000" },
    { "lmtp_timeout", IMAPCONF_INT, "300" },
    { "lmtp_max_idle", IMAPCONF_INT, "32" },
    { "lmtp_idle_timeout", IMAPCONF_INT, "10" },
    { "prelogin_timeout", IMAPCONF_INT, "60" },
    { "sievedir", IMAPCONF_STRING, "" },
    { "sieve_maxscriptsize", IMAPCONF_INT, "32" },
    { "sieve_maxscripts", IMAPCONF_INT, "5" },
    { "sieve_extensions", IMAPCONF_STRING, "" },
    { "sieve_globaldir", IMAPCONF_STRING, "" },
    { "timeout", IMAPCONF_INT, "32" },
    { "syslog_prefix", IMAPCONF_STRING, "" },
    { "log_file", IMAPCONF_STRING, "" },
    { "autocreate_quota", IMAPCONF_INT, "-1" },
    { "autocreate_post", IMAPCONF_SWITCH, "yes" },
    { "autocreate_users", IMAPCONF_STRING, "anyone" },
    { "autocreate_inbox_folders", IMAPCONF_STRING, "" },
    { "xlist-sent", IMAPCONF_STRING, "" },
    { "xlist-drafts", IMAPCONF_STRING, "" },
    { "xlist-trash", IMAPCONF_STRING, "" },
    { "xlist-junk", IMAPCONF_STRING, "" },
    { "xlist-archive", IMAPCONF_STRING, "" },
    { "xlist-all", IMAPCONF_STRING, "" },
    { "xlist-flagged", IMAPCONF_STRING, "" },
    { "sendmail", IMAPCONF_STRING, "/usr/sbin/sendmail" },
    { "smtp_backend", IMAPCONF_ENUM, "sendmail" },
    { "smtp_host", IMAPCONF_STRING, "localhost:587" },
    { "metrics_listen", IMAPCONF_STRING, "" },
    { "lmtp_proxy", IMAPCONF_SWITCH, "no" },
    { "imap_proxy", IMAPCONF_SWITCH, "no" },
    { "proxy_imap_backends", IMAPCONF_STRING, "" },
    { "proxy_authname", IMAPCONF_STRING, "proxy" },
    { "proxy_password", IMAPCONF_STRING, "" },
    { "proxy_starttls", IMAPCONF_SWITCH, "yes" },
    { "tls_client_ca_file", IMAPCONF_STRING, "" },
    { "proxyservers", IMAPCONF_STRING, "" },
    { "directory_db", IMAPCONF_DBNAME, "flat" },
    { "directory_db_path", IMAPCONF_STRING, "" },
    { "directory_cache_ttl", IMAPCONF_INT, "5" },
    { "directory_cache_watched_ttl", IMAPCONF_INT, "600" },
    { "proxy_backends", IMAPCONF_STRING, "" },
    { "proxy_timeout", IMAPCONF_INT, "60" },
    { "xfer_command", IMAPCONF_STRING, "" },
};
#define NEXPECTED (sizeof(expected_keys) / sizeof(expected_keys[0]))

static void check_defaults(const struct imapconf *conf)
{
    size_t i;

    for (i = 0; i < NEXPECTED; i++) {
        const char *key = expected_keys[i].key, *def = expected_keys[i].def;
        switch (expected_keys[i].type) {
        case IMAPCONF_STRING:
        case IMAPCONF_DBNAME:
        case IMAPCONF_ENUM:
            assert_string_equal(imapconf_getstring(conf, key), def);
            break;
        case IMAPCONF_INT:
            assert_int_equal(imapconf_getint(conf, key), atol(def));
            break;
        case IMAPCONF_SWITCH:
            assert_int_equal(imapconf_getswitch(conf, key),
                             !strcmp(def, "yes"));
            break;
        }
    }
    assert_int_equal(imapconf_getenum(conf, "virtdomains"), 0);
    assert_null(imapconf_partition(conf, "default"));
    assert_null(imapconf_getsasl(conf, "sasl_pwcheck_method"));
}

static void test_defaults(void **state)
{
    struct imapconf *conf;
    (void)state;

    conf = imapconf_defaults();
    assert_non_null(conf);
    check_defaults(conf);
    imapconf_free(&conf);
    assert_null(conf);
    imapconf_free(&conf);               /* NULL: no-op */

    /* an empty file, and one of only comments and blank lines */
    conf = load_ok("");
    check_defaults(conf);
    imapconf_free(&conf);
    conf = load_ok("# nothing here\n\n   \n\t\n#quotawarn: 5\n  # indented comment\n");
    check_defaults(conf);
    imapconf_free(&conf);
}

static void test_basic_syntax(void **state)
{
    struct imapconf *conf;
    (void)state;

    conf = load_ok(
        "# imapd.conf\n"
        "\n"
        "configdirectory: /srv/cyrus/config\n"
        "   servername:   mail.example.org   \n"
        "\tadmins:\tcyrus  admin\t\n"
        "syslog_prefix :pre\n"
        "tls_server_cert:/etc/ssl/a#b.pem\n"
        "tls_server_key:   \n"
        "QuotaWarn: 75\n"
        "maxmessagesize:\t1048576\n"
        "mboxlist_db: lmdb\n"
        "defaultpartition: spool2\n");
    assert_string_equal(imapconf_getstring(conf, "configdirectory"),
                        "/srv/cyrus/config");
    /* surrounding white space trimmed, inner white space kept */
    assert_string_equal(imapconf_getstring(conf, "servername"),
                        "mail.example.org");
    assert_string_equal(imapconf_getstring(conf, "admins"), "cyrus  admin");
    assert_string_equal(imapconf_getstring(conf, "syslog_prefix"), "pre");
    /* '#' inside a value is not a comment */
    assert_string_equal(imapconf_getstring(conf, "tls_server_cert"),
                        "/etc/ssl/a#b.pem");
    assert_string_equal(imapconf_getstring(conf, "tls_server_key"), "");
    /* keys ignore case */
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 75);
    assert_int_equal(imapconf_getint(conf, "maxmessagesize"), 1048576);
    assert_string_equal(imapconf_getstring(conf, "mboxlist_db"), "lmdb");
    assert_string_equal(imapconf_getstring(conf, "duplicate_db"), "skiplist");
    assert_string_equal(imapconf_getstring(conf, "defaultpartition"),
                        "spool2");
    imapconf_free(&conf);
}

static void test_last_line_without_newline(void **state)
{
    struct imapconf *conf = load_ok("quotawarn: 10\nallowplaintext: yes");
    (void)state;

    assert_int_equal(imapconf_getint(conf, "quotawarn"), 10);
    assert_int_equal(imapconf_getswitch(conf, "allowplaintext"), 1);
    imapconf_free(&conf);
}

static void test_boolean_spellings(void **state)
{
    static const struct {
        const char *word;
        int value;
    } words[] = {
        { "yes", 1 }, { "no", 0 }, { "on", 1 }, { "off", 0 },
        { "true", 1 }, { "false", 0 }, { "1", 1 }, { "0", 0 },
        { "YES", 1 }, { "No", 0 }, { "oN", 1 }, { "OFF", 0 },
        { "True", 1 }, { "FALSE", 0 },
    };
    static const char *const keys[] = {
        "allowplaintext", "duplicatesuppression", "hashimapspool",
        "unixhierarchysep", "lmtp_downcase_rcpt",
        "lmtp_over_quota_perm_failure",
    };
    size_t i, k;
    (void)state;

    for (k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        for (i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
            struct imapconf *conf;
            char *text;

            assert_true(asprintf(&text, "%s: %s\n", keys[k],
                                 words[i].word) > 0);
            conf = load_ok(text);
            if (imapconf_getswitch(conf, keys[k]) != words[i].value) {
                print_error("%s gave %d\n", text,
                            imapconf_getswitch(conf, keys[k]));
                fail();
            }
            imapconf_free(&conf);
            free(text);
        }
    }
}

static void test_bad_boolean(void **state)
{
    static const char *const bad[] = {
        "maybe", "2", "y", "n", "t", "f", "yess", "yes please", "enable",
        "-1", "o", "\"yes\"",
    };
    size_t i;
    (void)state;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *text;
        assert_true(asprintf(&text, "# first\nquotawarn: 5\n"
                             "allowplaintext: %s\n", bad[i]) > 0);
        load_fails(text, 3, "key allowplaintext: ");
        free(text);
    }
    /* an empty value is not a boolean either */
    load_fails("allowplaintext:\n", 1, "key allowplaintext: ");
    load_fails("\n\nhashimapspool:   \n", 3, "key hashimapspool: ");
}

static void test_ints(void **state)
{
    struct imapconf *conf;
    (void)state;

    conf = load_ok("quotawarn: 0\nmaxmessagesize: 9223372036854775807\n");
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 0);
    if (sizeof(long) == 8)
        assert_true(imapconf_getint(conf, "maxmessagesize") == 9223372036854775807L);
    imapconf_free(&conf);

    conf = load_ok("quotawarn: 100\n");
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 100);
    imapconf_free(&conf);
    conf = load_ok("quotawarn: +7\n");
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 7);
    imapconf_free(&conf);
    conf = load_ok("quotawarn: 007\n");          /* decimal, not octal */
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 7);
    imapconf_free(&conf);

    /* out of range */
    load_fails("quotawarn: 101\n", 1, "key quotawarn: '101' is out of range 0..100");
    load_fails("#\nquotawarn: -1\n", 2, "key quotawarn: '-1' is out of range");
    load_fails("maxmessagesize: -5\n", 1, "key maxmessagesize: '-5' is out of range");
    load_fails("maxmessagesize: 99999999999999999999999999\n", 1,
               "key maxmessagesize: '99999999999999999999999999' is out of range");

    /* not numbers */
    load_fails("quotawarn: abc\n", 1, "key quotawarn: 'abc' is not a decimal number");
    load_fails("quotawarn: 12abc\n", 1, "key quotawarn: ");
    load_fails("quotawarn: 0x10\n", 1, "key quotawarn: ");
    load_fails("quotawarn: 1.5\n", 1, "key quotawarn: ");
    load_fails("quotawarn: 5 0\n", 1, "key quotawarn: ");
    load_fails("quotawarn: - 5\n", 1, "key quotawarn: ");
    load_fails("quotawarn: \n", 1, "key quotawarn: ");
    load_fails("maxmessagesize: 10M\n", 1, "key maxmessagesize: ");

    /* the error names the right line after many good ones */
    {
        struct buf b = BUF_INITIALIZER;
        int i;
        for (i = 0; i < 40; i++)
            assert_int_equal(buf_printf(&b, "admins: u%d\n", i), 0);
        assert_int_equal(buf_appendcstr(&b, "quotawarn: lots\n"), 0);
        load_fails(buf_cstring(&b), 41, "key quotawarn: 'lots'");
        buf_free(&b);
    }
}

static void test_dbnames(void **state)
{
    const struct cyrusdb_registry_entry *e;
    struct imapconf *conf;
    char *text, *error, *expect;
    (void)state;

    /* every registry name of a file backend is accepted for every *_db
     * key; a backend without files (etcd) is refused, naming the tools */
    for (e = cyrusdb_registry; e->name; e++) {
        if (e->nofile) {
            assert_true(asprintf(&text, "quota_db: %s\n", e->name) > 0);
            load_fails(text, 1, "key quota_db: database backend 'etcd' is for "
                       "cyr_dbtool and cvt_cyrusdb only");
            free(text);
            /* the frontend's directory may live there */
            assert_true(asprintf(&text, "directory_db: %s\n", e->name) > 0);
            conf = load_ok(text);
            assert_string_equal(imapconf_getstring(conf, "directory_db"),
                                e->name);
            imapconf_free(&conf);
            free(text);
            continue;
        }
        assert_true(asprintf(&text, "mboxlist_db: %s\nduplicate_db: %s\n"
                             "seenstate_db: %s\nsubscription_db: %s\n"
                             "quota_db: %s\n", e->name, e->name, e->name,
                             e->name, e->name) > 0);
        conf = load_ok(text);
        assert_string_equal(imapconf_getstring(conf, "mboxlist_db"), e->name);
        assert_string_equal(imapconf_getstring(conf, "duplicate_db"), e->name);
        assert_string_equal(imapconf_getstring(conf, "seenstate_db"), e->name);
        assert_string_equal(imapconf_getstring(conf, "subscription_db"), e->name);
        assert_string_equal(imapconf_getstring(conf, "quota_db"), e->name);
        imapconf_free(&conf);
        free(text);
    }

    /* names not in the registry; the error lists the known ones */
    load_fails("mboxlist_db: twoskip\n", 1,
               "key mboxlist_db: unknown database backend 'twoskip'");
    load_fails("\n\nquota_db: sql\n", 3, "key quota_db: ");
    load_fails("seenstate_db:\n", 1, "key seenstate_db: ");
    load_fails("duplicate_db: skiplist2\n", 1, "key duplicate_db: ");
    assert_int_equal(load("subscription_db: berkeleydb\n", &conf, &error,
                          NULL), -1);
    assert_non_null(strstr(error, cyrusdb_names()));
    expect = where(1, "key subscription_db: ");
    assert_memory_equal(error, expect, strlen(expect));
    free(expect);
    free(error);
}

static void test_enum(void **state)
{
    struct imapconf *conf;
    (void)state;

    conf = load_ok("virtdomains: userid\n");
    assert_string_equal(imapconf_getstring(conf, "virtdomains"), "userid");
    assert_int_equal(imapconf_getenum(conf, "virtdomains"), 1);
    imapconf_free(&conf);
    conf = load_ok("virtdomains: ON\n");         /* canonical spelling */
    assert_string_equal(imapconf_getstring(conf, "virtdomains"), "on");
    assert_int_equal(imapconf_getenum(conf, "virtdomains"), 2);
    imapconf_free(&conf);
    conf = load_ok("virtdomains: off\n");
    assert_int_equal(imapconf_getenum(conf, "virtdomains"), 0);
    imapconf_free(&conf);

    load_fails("virtdomains: yes\n", 1,
               "key virtdomains: 'yes' is not one of: off userid on");
    load_fails("#\n#\n#\nvirtdomains: domain\n", 4, "key virtdomains: ");
    load_fails("virtdomains:\n", 1, "key virtdomains: ");
}

/* imapconf_foreach(): every table key once, with value, default and
 * line; then the partition and sasl keys of the file. */
struct walk {
    char seen[4096];
    int ntable, nextra;
};

static void walk_cb(void *rock, const char *key, const char *value,
                    const char *def, unsigned long line)
{
    struct walk *w = rock;
    size_t n = strlen(w->seen);

    if (def)
        w->ntable++;
    else
        w->nextra++;
    if (line)
        snprintf(w->seen + n, sizeof(w->seen) - n, "%s=%s@%lu;", key, value,
                 line);
}

static void test_foreach_and_known(void **state)
{
    struct imapconf *conf;
    struct walk w;
    char *error, *warn;
    (void)state;

    assert_int_equal(load("lmtp_timeout: 600\nallowplaintext: on\n"
                          "Partition-Spool2: /x\nmboxlist_db: lmdb\n"
                          "sasl_mech_list: PLAIN\n", &conf, &error, &warn), 0);
    memset(&w, 0, sizeof(w));
    imapconf_foreach(conf, walk_cb, &w);
    /* the value as the server reads it, and the line that set it */
    assert_non_null(strstr(w.seen, "lmtp_timeout=600@1;"));
    assert_non_null(strstr(w.seen, "allowplaintext=yes@2;"));
    assert_non_null(strstr(w.seen, "mboxlist_db=lmdb@4;"));
    assert_non_null(strstr(w.seen, "partition-spool2=/x@3;"));
    assert_non_null(strstr(w.seen, "sasl_mech_list=PLAIN@5;"));
    /* keys not in the file are walked too, with line 0 */
    assert_null(strstr(w.seen, "maxheaderlines"));
    assert_true(w.ntable > 20);
    assert_int_equal(w.nextra, 2);
    free(warn);
    imapconf_free(&conf);

    assert_int_equal(imapconf_is_known("configdirectory"), 1);
    assert_int_equal(imapconf_is_known("ConfigDirectory"), 1);
    assert_int_equal(imapconf_is_known("partition-news"), 1);
    assert_int_equal(imapconf_is_known("sasl_anything"), 1);
    assert_int_equal(imapconf_is_known("partition-"), 0);
    assert_int_equal(imapconf_is_known("partiton-default"), 0);
    assert_int_equal(imapconf_is_known("sieveusehomedir"), 0);
    assert_int_equal(imapconf_is_known(""), 0);
}

static void test_unknown_key_warns(void **state)
{
    struct imapconf *conf;
    char *error, *warn, *expect;
    (void)state;

    assert_int_equal(load("quotawarn: 50\n# c\nfrobnicate: 1\n"
                          "lmtp_fuzzy_mailbox_match: yes\nallowplaintext: yes\n",
                          &conf, &error, &warn), 0);
    /* still loaded, before and after the unknown key */
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 50);
    assert_int_equal(imapconf_getswitch(conf, "allowplaintext"), 1);
    expect = where(3, "unknown key frobnicate");
    assert_non_null(strstr(warn, expect));
    assert_non_null(strstr(warn, "warning"));
    free(expect);
    expect = where(4, "unknown key lmtp_fuzzy_mailbox_match");
    assert_non_null(strstr(warn, expect));
    free(expect);
    free(warn);
    imapconf_free(&conf);

    /* a bare prefix is not a partition or sasl key: unknown */
    assert_int_equal(load("partition-: /x\nsasl_: y\n", &conf, &error, &warn),
                     0);
    expect = where(1, "unknown key partition-");
    assert_non_null(strstr(warn, expect));
    free(expect);
    expect = where(2, "unknown key sasl_");
    assert_non_null(strstr(warn, expect));
    free(expect);
    free(warn);
    imapconf_free(&conf);
}

static void test_duplicate_last_wins(void **state)
{
    struct imapconf *conf;
    char *error, *warn, *expect;
    (void)state;

    assert_int_equal(load("quotawarn: 10\nadmins: a\nquotawarn: 20\n"
                          "partition-p: /one\npartition-P: /two\n"
                          "sasl_x: 1\nsasl_x: 2\n",
                          &conf, &error, &warn), 0);
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 20);
    assert_string_equal(imapconf_partition(conf, "p"), "/two");
    assert_string_equal(imapconf_getsasl(conf, "sasl_x"), "2");
    expect = where(3, "key quotawarn given again (first on line 1)");
    assert_non_null(strstr(warn, expect));
    free(expect);
    expect = where(5, "key partition-p given again (first on line 4)");
    assert_non_null(strstr(warn, expect));
    free(expect);
    expect = where(7, "key sasl_x given again (first on line 6)");
    assert_non_null(strstr(warn, expect));
    free(expect);
    free(warn);
    imapconf_free(&conf);

    /* a bad value in a duplicate is still an error */
    load_fails("quotawarn: 10\nquotawarn: x\n", 2, "key quotawarn: ");
}

static void test_malformed_lines(void **state)
{
    (void)state;

    load_fails("quotawarn: 5\nquotawarn 50\n", 2, "malformed line (no colon)");
    load_fails("just words\n", 1, "malformed line (no colon)");
    load_fails("\n\n: value\n", 3, "malformed line (no key");
    load_fails("  :\n", 1, "malformed line (no key");
    load_fails("my key: x\n", 1, "malformed line (invalid key 'my key'");
    load_fails("quota.warn: 5\n", 1, "malformed line (invalid key");
    load_fails("key\x01: 5\n", 1, "malformed line (invalid key 'key?'");
    /* a NUL byte would silently cut the value short: refused */
    {
        struct imapconf *conf;
        char *error, *expect = where(2, "NUL byte in line");
        static const char text[] = "quotawarn: 5\nadmins: ro\0ot\n";
        assert_int_equal(load_len(text, sizeof(text) - 1, &conf, &error,
                                  NULL), -1);
        assert_string_equal(error, expect);
        free(expect);
        free(error);
    }
}

static void test_partitions(void **state)
{
    struct imapconf *conf;
    (void)state;

    conf = load_ok("partition-default: /var/spool/imap\n"
                   "partition-Archive : /srv/archive\n"
                   "partition-a-b_c9: /x y/z\n"
                   "defaultpartition: archive\n");
    assert_string_equal(imapconf_partition(conf, "default"), "/var/spool/imap");
    assert_string_equal(imapconf_partition(conf, "archive"), "/srv/archive");
    assert_string_equal(imapconf_partition(conf, "ARCHIVE"), "/srv/archive");
    assert_string_equal(imapconf_partition(conf, "a-b_c9"), "/x y/z");
    assert_null(imapconf_partition(conf, "nothere"));
    assert_null(imapconf_partition(conf, ""));
    assert_null(imapconf_partition(conf, "archiv"));
    assert_string_equal(imapconf_getstring(conf,
                        "defaultpartition"), "archive");
    /* a partition is not a sasl key */
    assert_null(imapconf_getsasl(conf, "partition-default"));
    imapconf_free(&conf);

    load_fails("partition-default:\n", 1, "key partition-default: empty path");
}

static void test_sasl_keys(void **state)
{
    struct imapconf *conf;
    (void)state;

    conf = load_ok("sasl_pwcheck_method: saslauthd\n"
                   "sasl_mech_list: PLAIN LOGIN\n"
                   "sasl_empty:\n"
                   "SASL_Upper: Value Kept\n"
                   "sasl_anything_at_all_here: 42\n");
    assert_string_equal(imapconf_getsasl(conf, "sasl_pwcheck_method"),
                        "saslauthd");
    assert_string_equal(imapconf_getsasl(conf, "sasl_mech_list"),
                        "PLAIN LOGIN");
    assert_string_equal(imapconf_getsasl(conf, "sasl_empty"), "");
    assert_string_equal(imapconf_getsasl(conf, "sasl_upper"), "Value Kept");
    assert_string_equal(imapconf_getsasl(conf, "sasl_anything_at_all_here"),
                        "42");
    assert_null(imapconf_getsasl(conf, "sasl_unset"));
    assert_null(imapconf_getsasl(conf, "quotawarn"));
    assert_null(imapconf_getsasl(conf, "mech_list"));
    assert_null(imapconf_getsasl(conf, NULL));
    imapconf_free(&conf);
}

static void test_long_lines(void **state)
{
    struct buf text = BUF_INITIALIZER;
    struct imapconf *conf;
    char *value, *error;
    size_t n = 100 * 1024, i;
    (void)state;

    value = malloc(n + 1);
    assert_non_null(value);
    for (i = 0; i < n; i++)
        value[i] = (char)('a' + i % 26);
    value[n] = '\0';

    assert_int_equal(buf_printf(&text, "# %s\n", value), 0);   /* comment */
    assert_int_equal(buf_printf(&text, "admins: %s\n", value), 0);
    assert_int_equal(buf_printf(&text, "sasl_long: %s\r\n", value), 0);
    assert_int_equal(buf_printf(&text, "partition-big:   %s  \n", value), 0);
    assert_int_equal(buf_appendcstr(&text, "quotawarn: 33\n"), 0);
    conf = load_ok(buf_cstring(&text));
    assert_int_equal(strlen(imapconf_getstring(conf, "admins")), n);
    assert_string_equal(imapconf_getstring(conf, "admins"), value);
    assert_string_equal(imapconf_getsasl(conf, "sasl_long"), value);
    assert_string_equal(imapconf_partition(conf, "big"), value);
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 33);
    imapconf_free(&conf);

    /* a bad value after long lines: the right line, and the quoted value
     * in the message is cut short */
    assert_int_equal(buf_printf(&text, "maxmessagesize: %s\n", value), 0);
    assert_int_equal(load(buf_cstring(&text), &conf, &error, NULL), -1);
    {
        char *expect = where(6, "key maxmessagesize: 'abcdefghij");
        assert_memory_equal(error, expect, strlen(expect));
        assert_true(strlen(error) < 300);
        free(expect);
    }
    free(error);
    free(value);
    buf_free(&text);
}

static void test_crlf(void **state)
{
    struct imapconf *conf;
    (void)state;

    conf = load_ok("# comment\r\n"
                   "\r\n"
                   "allowplaintext: yes\r\n"
                   "quotawarn: 42\r\n"
                   "mboxlist_db: flat\r\n"
                   "servername: host.example\r\n"
                   "virtdomains: userid\r\n"
                   "partition-default: /p\r\n"
                   "sasl_mech_list: PLAIN\r\n");
    assert_int_equal(imapconf_getswitch(conf, "allowplaintext"), 1);
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 42);
    assert_string_equal(imapconf_getstring(conf, "mboxlist_db"), "flat");
    assert_string_equal(imapconf_getstring(conf, "servername"), "host.example");
    assert_int_equal(imapconf_getenum(conf, "virtdomains"), 1);
    assert_string_equal(imapconf_partition(conf, "default"), "/p");
    assert_string_equal(imapconf_getsasl(conf, "sasl_mech_list"), "PLAIN");
    imapconf_free(&conf);

    load_fails("quotawarn: 1\r\nquotawarn: 1x\r\n", 2, "key quotawarn: '1x'");
}

static void test_missing_file(void **state)
{
    struct imapconf *conf = (struct imapconf *)(uintptr_t)0x1;
    char *error = NULL, *path, *expect;
    (void)state;

    path = th_path(tmpdir, "does-not-exist.conf");
    assert_int_equal(imapconf_load(path, &conf, &error), -1);
    assert_null(conf);
    assert_non_null(error);
    assert_true(asprintf(&expect, "%s: cannot open: %s", path,
                         strerror(ENOENT)) > 0);
    assert_string_equal(error, expect);
    free(expect);
    free(error);
    free(path);

    /* a directory cannot be read as a file */
    error = NULL;
    assert_int_equal(imapconf_load(tmpdir, &conf, &error), -1);
    assert_null(conf);
    assert_non_null(error);
    assert_memory_equal(error, tmpdir, strlen(tmpdir));
    free(error);

    /* error_r may be NULL */
    assert_int_equal(imapconf_load(tmpdir, &conf, NULL), -1);
    assert_null(conf);
}

static void test_load_string(void **state)
{
    struct imapconf *conf;
    char *error = NULL;
    static const char text[] = "quotawarn: 12\nallowplaintext: on\nbad";
    (void)state;

    /* the length is the authority: the last line is left out here */
    assert_int_equal(imapconf_load_string("mem", text, sizeof(text) - 5,
                                          &conf, &error), 0);
    assert_null(error);
    assert_int_equal(imapconf_getint(conf, "quotawarn"), 12);
    assert_int_equal(imapconf_getswitch(conf, "allowplaintext"), 1);
    imapconf_free(&conf);

    assert_int_equal(imapconf_load_string("mem", text, sizeof(text) - 1,
                                          &conf, &error), -1);
    assert_null(conf);
    assert_string_equal(error, "mem:3: malformed line (no colon); "
                        "expected \"key: value\"");
    free(error);
}

static void test_getter_misuse(void **state)
{
    struct imapconf *conf = imapconf_defaults();
    struct capture c;
    char *logged;
    const char *s;
    long n;
    int sw, en;
    (void)state;

    assert_non_null(conf);
    capture_begin(&c, 2);
    s = imapconf_getstring(conf, "quotawarn");         /* an int */
    n = imapconf_getint(conf, "servername");           /* a string */
    sw = imapconf_getswitch(conf, "no_such_key");
    en = imapconf_getenum(conf, "allowplaintext");
    logged = capture_end(&c);
    assert_null(s);
    assert_int_equal(n, 0);
    assert_int_equal(sw, 0);
    assert_int_equal(en, 0);
    assert_non_null(strstr(logged, "key=<quotawarn> type=<int>"));
    assert_non_null(strstr(logged, "key=<servername> type=<string>"));
    assert_non_null(strstr(logged, "key=<no_such_key>"));
    assert_non_null(strstr(logged, "key=<allowplaintext> type=<switch>"));
    free(logged);
    imapconf_free(&conf);
}

static void test_print_table(void **state)
{
    struct capture c;
    struct imapconf *conf;
    char *out, *line;
    size_t i, nlines = 0;
    (void)state;

    capture_begin(&c, 1);
    imapconf_print_table();
    out = capture_end(&c);

    /* every key, with its default, in the documented form */
    for (i = 0; i < NEXPECTED; i++) {
        char *expect;
        assert_true(asprintf(&expect, "\n%s: %s  # ", expected_keys[i].key,
                             expected_keys[i].def) > 0);
        if (!strstr(out, expect) &&
            strncmp(out, expect + 1, strlen(expect + 1)) != 0) {
            print_error("missing <%s> in:\n%s\n", expect + 1, out);
            fail();
        }
        free(expect);
    }
    assert_non_null(strstr(out, "quotawarn: 90  # "));
    assert_non_null(strstr(out, "(0..100)"));
    assert_non_null(strstr(out, "(one of: off userid on)"));
    assert_non_null(strstr(out, cyrusdb_names()));
    assert_non_null(strstr(out, "\npartition-NAME:"));
    assert_non_null(strstr(out, "\nsasl_*:"));
    /* each line has a description */
    for (line = out; *line; line = strchr(line, '\n') + 1) {
        char *nl = strchr(line, '\n');
        assert_non_null(nl);
        *nl = '\0';
        assert_non_null(strstr(line, ": "));
        assert_non_null(strstr(line, "  # "));
        *nl = '\n';
        nlines++;
    }
    assert_int_equal(nlines, NEXPECTED + 2);
    free(out);

    /* and the defaults printed are what imapconf_defaults() holds */
    conf = imapconf_defaults();
    check_defaults(conf);
    imapconf_free(&conf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_basic_syntax),
        cmocka_unit_test(test_last_line_without_newline),
        cmocka_unit_test(test_boolean_spellings),
        cmocka_unit_test(test_bad_boolean),
        cmocka_unit_test(test_ints),
        cmocka_unit_test(test_dbnames),
        cmocka_unit_test(test_enum),
        cmocka_unit_test(test_unknown_key_warns),
        cmocka_unit_test(test_duplicate_last_wins),
        cmocka_unit_test(test_malformed_lines),
        cmocka_unit_test(test_partitions),
        cmocka_unit_test(test_sasl_keys),
        cmocka_unit_test(test_long_lines),
        cmocka_unit_test(test_crlf),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_load_string),
        cmocka_unit_test(test_getter_misuse),
        cmocka_unit_test(test_print_table),
        cmocka_unit_test(test_foreach_and_known),
    };

    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
