/*
 * cyr_info.c - what the configuration says, and whether it can work.
 *
 *   cyr_info [-C imapd.conf] [-M cyrus.conf] [-q] conf | conf-all | conf-lint
 *
 * conf prints every key the file sets, "key: value" sorted by key, in the
 * spirit of Postfix's "postconf -n"; conf-all every key the server knows
 * with the value in effect (the file's or the default); conf-lint checks
 * the configuration the way the server will use it, before it is started:
 *   - imapd.conf parses (a malformed value stops there);
 *   - keys the server does not know (typos, Cyrus keys not supported
 *     here) are named with their line (warnings: the server ignores them);
 *   - cyrus_user exists;
 *   - configdirectory and every partition exist, are directories and are
 *     writable by cyrus_user; relative paths are warned about (the master
 *     daemonizes into /);
 *   - defaultpartition names a configured partition;
 *   - every database file matches its configured backend (store/dbcheck.c,
 *     the same check ctl_cyrusdb -r makes at the master's start);
 *   - TLS certificate and key files, when set, exist;
 *   - defaultdomain, when set, is a valid domain (the servers refuse to
 *     start otherwise), and is not set in vain (virtdomains off);
 *   - cyrus.conf parses (master/master_conf.c, the master's own reader).
 * One line per finding, "error: ..." or "warning: ...", on stdout, with
 * "ok: ..." lines for what passed unless -q; a last line counts them.
 * Exit status: 0 no error (warnings allowed), 1 errors found, 2 usage.
 * Read-only: nothing is created or changed, as any user.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/privs.h"
#include "lib/strarray.h"
#include "master/master_conf.h"
#include "store/dbcheck.h"
#include "store/layout.h"
#include "store/store.h"
#include "store/userid.h"

#define INFO_DEFAULT_IMAPDCONF IMAPCONF_DEFAULT_PATH
#define INFO_DEFAULT_CYRUSCONF IMAPCONF_DEFAULT_CYRUSCONF
#define INFO_EXIT_OK 0
#define INFO_EXIT_ERRORS 1
#define INFO_EXIT_USAGE 2

static const char *info_progname = "cyr_info";

struct info_lint {
    const char *conffile;
    int quiet;
    unsigned errors, warnings;
};

static void info_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] [-M cyrus.conf] [-q] COMMAND\n"
"\n"
"Show or check the configuration.\n"
"  conf        every key imapd.conf sets, as \"key: value\", sorted (like\n"
"              Postfix's postconf -n)\n"
"  conf-all    every key the server knows, with the value in effect\n"
"  conf-lint   check the configuration before the server uses it: unknown\n"
"              keys, cyrus_user, configdirectory and partitions (exist,\n"
"              writable by cyrus_user), every database file against its\n"
"              configured backend, TLS files, cyrus.conf\n"
"\n"
"  -C FILE   imapd.conf (default " INFO_DEFAULT_IMAPDCONF ")\n"
"  -M FILE   cyrus.conf for conf-lint (default " INFO_DEFAULT_CYRUSCONF
", checked\n"
"            when it exists)\n"
"  -q        conf-lint: print only errors and warnings\n"
"  -h, --help  this text\n"
"Exit status: 0 fine (conf-lint: no errors; warnings allowed), 1 errors\n"
"found or the file unreadable, 2 usage error.\n",
            info_progname);
}

/* ---- conf, conf-all ----------------------------------------------------- */

struct info_show {
    int all;
    struct strarray lines;
};

static void info_collect(void *rock, const char *key, const char *value,
                         const char *def, unsigned long line)
{
    struct info_show *s = rock;
    struct buf b = BUF_INITIALIZER;

    (void)def;
    if (!s->all && line == 0)
        return;
    buf_printf(&b, "%s: %s", key, value);
    strarray_appendm(&s->lines, buf_release(&b));
}

static int info_show(const struct imapconf *conf, int all)
{
    struct info_show s = { .all = all, .lines = STRARRAY_INITIALIZER };
    size_t i;

    imapconf_foreach(conf, info_collect, &s);
    if (!all)
        strarray_sort(&s.lines);
    for (i = 0; i < s.lines.count; i++)
        printf("%s\n", s.lines.data[i]);
    strarray_fini(&s.lines);
    return fflush(stdout) == EOF ? INFO_EXIT_ERRORS : INFO_EXIT_OK;
}

/* ---- conf-lint ------------------------------------------------------------ */

static void info_say(struct info_lint *l, const char *kind, const char *fmt,
                     ...) __attribute__((format(printf, 3, 4)));

static void info_say(struct info_lint *l, const char *kind, const char *fmt,
                     ...)
{
    va_list ap;

    if (!strcmp(kind, "error"))
        l->errors++;
    else if (!strcmp(kind, "warning"))
        l->warnings++;
    else if (l->quiet)
        return;
    printf("%s: ", kind);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

/* Keys the reader does not know, from the file's text (the reader only
 * logs them). */
static void info_unknown_keys(struct info_lint *l, const char *path)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t cap = 0;
    unsigned long lineno = 0;
    unsigned found = 0;

    if (!f)
        return;
    while (getline(&line, &cap, f) >= 0) {
        char *p = line, *end;

        lineno++;
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p || *p == '#' || *p == '\n' || *p == '\r')
            continue;
        end = strchr(p, ':');
        if (!end)
            continue;
        while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        *end = '\0';
        if (!imapconf_is_known(p)) {
            info_say(l, "warning", "%s:%lu: unknown key %s (the server "
                     "ignores it: a typo, or a Cyrus key not supported "
                     "here)", path, lineno, p);
            found++;
        }
    }
    free(line);
    fclose(f);
    if (!found)
        info_say(l, "ok", "%s: every key is known", path);
}

/* A directory the server writes: exists, is one, cyrus_user may write. */
static void info_check_dir(struct info_lint *l, const char *what,
                           const char *dir, const char *user, int user_ok)
{
    const char *why = NULL;
    struct stat st;
    int r;

    if (!dir || !*dir) {
        info_say(l, "error", "%s is not set", what);
        return;
    }
    if (dir[0] != '/')
        info_say(l, "warning", "%s %s is a relative path: the master "
                 "daemonizes into /, so give the full path", what, dir);
    if (stat(dir, &st) < 0) {
        info_say(l, "error", "%s %s: %s (create it, owned by %s)", what, dir,
                 strerror(errno), user);
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        info_say(l, "error", "%s %s is not a directory", what, dir);
        return;
    }
    if (!user_ok) {
        info_say(l, "ok", "%s %s exists (write access not checked: no user "
                 "%s)", what, dir, user);
        return;
    }
    r = privs_user_can_write(user, dir, &why);
    if (r == 1)
        info_say(l, "ok", "%s %s is writable by %s", what, dir, user);
    else
        info_say(l, "error", "%s: %s (chown %s it)", what, why, user);
}

struct info_partitions {
    struct info_lint *l;
    const char *user;
    int user_ok;
    unsigned n;
};

static void info_partition(void *rock, const char *key, const char *value,
                           const char *def, unsigned long line)
{
    struct info_partitions *p = rock;
    struct buf what = BUF_INITIALIZER;

    (void)def;
    (void)line;
    if (strncmp(key, "partition-", 10) != 0)
        return;
    p->n++;
    buf_printf(&what, "partition %s", key + 10);
    info_check_dir(p->l, buf_cstring(&what), value, p->user, p->user_ok);
    buf_free(&what);
}

static void info_mismatch(void *rock, const struct dbcheck_mismatch *m)
{
    struct info_lint *l = rock;
    struct buf b = BUF_INITIALIZER;

    if (dbcheck_advice(m, l->conffile, NULL, &b) == 0)
        info_say(l, "error", "%s", buf_cstring(&b));
    buf_free(&b);
}

static void info_check_file(struct info_lint *l, const struct imapconf *conf,
                            const char *key)
{
    const char *path = imapconf_getstring(conf, key);

    if (!path || !*path)
        return;
    if (access(path, R_OK) < 0)
        info_say(l, "error", "%s %s: %s", key, path, strerror(errno));
    else
        info_say(l, "ok", "%s %s is readable", key, path);
}

static int info_lint(const struct imapconf *conf, const char *conffile,
                     const char *cyrusconf, int cyrusconf_given, int quiet)
{
    struct info_lint l = { .conffile = conffile, .quiet = quiet,
                           .errors = 0, .warnings = 0 };
    struct info_partitions parts;
    const char *user = imapconf_getstring(conf, "cyrus_user");
    const char *defpart = imapconf_getstring(conf, "defaultpartition");
    struct stat st;
    int user_ok, n;

    info_say(&l, "ok", "%s parses", conffile);
    info_unknown_keys(&l, conffile);

    if (!user || !*user)
        user = "cyrus";
    user_ok = getpwnam(user) != NULL;
    if (user_ok)
        info_say(&l, "ok", "cyrus_user %s exists", user);
    else
        info_say(&l, "error", "cyrus_user is \"%s\", and there is no such "
                 "user: the master started as root stops (create the user, "
                 "or set cyrus_user)", user);

    info_check_dir(&l, "configdirectory",
                   imapconf_getstring(conf, "configdirectory"), user,
                   user_ok);
    parts.l = &l;
    parts.user = user;
    parts.user_ok = user_ok;
    parts.n = 0;
    imapconf_foreach(conf, info_partition, &parts);
    if (parts.n == 0)
        info_say(&l, "error", "no partition-NAME key: mailboxes have "
                 "nowhere to go (e.g. \"partition-default: "
                 IMAPCONF_SUGGESTED_PARTITION "\")");
    else if (defpart && *defpart && !imapconf_partition(conf, defpart))
        info_say(&l, "error", "defaultpartition is \"%s\", but there is no "
                 "partition-%s key", defpart, defpart);

    n = dbcheck_backends(conf, info_mismatch, &l);
    if (n == 0)
        info_say(&l, "ok", "every database file matches its configured "
                 "backend");
    else if (n < 0)
        info_say(&l, "error", "the database files could not be checked");

    {
        /* the store's on-disk versions (store/layout.h) */
        const char *cd = imapconf_getstring(conf, "configdirectory");
        const char *lerr = NULL;
        int v = 0;

        if (cd && *cd) {
            if (layout_read(cd, &v, &lerr) != LAYOUT_OK)
                info_say(&l, "error", "%s", lerr ? lerr : "layout");
            else if (v > LAYOUT_VERSION)
                info_say(&l, "error", "%s/%s says layout %d; this build "
                         "knows layouts up to %d: the master's start "
                         "(ctl_cyrusdb -r) refuses it", cd, LAYOUT_FNAME, v,
                         LAYOUT_VERSION);
            else if (v == 0)
                info_say(&l, "ok", "no %s/%s yet: layout 1, written by the "
                         "next ctl_cyrusdb -r (this build: layout %d, index "
                         "%d, skiplist %s)", cd, LAYOUT_FNAME, LAYOUT_VERSION,
                         LAYOUT_INDEX_VERSION, LAYOUT_SKIPLIST_VERSION);
            else
                info_say(&l, "ok", "layout %d (%s/%s; this build: layout %d, "
                         "index %d, skiplist %s)", v, cd, LAYOUT_FNAME,
                         LAYOUT_VERSION, LAYOUT_INDEX_VERSION,
                         LAYOUT_SKIPLIST_VERSION);
        }
    }

    info_check_file(&l, conf, "tls_server_cert");
    info_check_file(&l, conf, "tls_server_key");

    {
        /* the servers refuse to start with a bad defaultdomain */
        struct userid_policy pol;
        const char *why = NULL;
        const char *dd = imapconf_getstring(conf, "defaultdomain");

        if (userid_policy_init(conf, &pol, &why) != STORE_OK) {
            info_say(&l, "error", "defaultdomain is \"%s\": %s (a domain "
                     "name of at least two labels, as example.com)",
                     dd ? dd : "", why ? why : "out of memory");
        } else {
            if (pol.virtdomains == USERID_VIRTDOMAINS_OFF && dd && *dd)
                info_say(&l, "warning", "defaultdomain is set but "
                         "virtdomains is off: it has no effect");
            else
                info_say(&l, "ok", "virtdomains %s%s%s",
                         imapconf_getstring(conf, "virtdomains"),
                         dd && *dd ? ", defaultdomain " : "",
                         dd && *dd ? pol.defaultdomain : "");
            userid_policy_free(&pol);
        }
    }

    if (cyrusconf_given || stat(cyrusconf, &st) == 0) {
        struct master_conf *mc = NULL;
        char *err = NULL;

        if (master_conf_load(cyrusconf, &mc, &err) < 0)
            info_say(&l, "error", "%s", err ? err : cyrusconf);
        else
            info_say(&l, "ok", "%s parses", cyrusconf);
        free(err);
        master_conf_free(&mc);
    }

    printf("%s: %u error%s, %u warning%s\n", info_progname, l.errors,
           l.errors == 1 ? "" : "s", l.warnings, l.warnings == 1 ? "" : "s");
    if (fflush(stdout) == EOF)
        return INFO_EXIT_ERRORS;
    return l.errors ? INFO_EXIT_ERRORS : INFO_EXIT_OK;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *conffile = INFO_DEFAULT_IMAPDCONF;
    const char *cyrusconf = INFO_DEFAULT_CYRUSCONF, *cmd;
    struct imapconf *conf = NULL;
    char *err = NULL;
    int opt, quiet = 0, cyrusconf_given = 0, ret;

    if (argv[0])
        info_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1
                                              : argv[0];
    log_init(info_progname, LOG_TO_STDERR);
    while ((opt = getopt_long(argc, argv, "+C:M:qh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': conffile = optarg; break;
        case 'M': cyrusconf = optarg; cyrusconf_given = 1; break;
        case 'q': quiet = 1; break;
        case 'h': info_usage(stdout); return INFO_EXIT_OK;
        default:
            fprintf(stderr, "Try '%s --help' for more information.\n",
                    info_progname);
            return INFO_EXIT_USAGE;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "%s: %s\nTry '%s --help' for more information.\n",
                info_progname, optind == argc ? "no command" : "one command only",
                info_progname);
        return INFO_EXIT_USAGE;
    }
    cmd = argv[optind];
    if (strcmp(cmd, "conf") && strcmp(cmd, "conf-all") &&
        strcmp(cmd, "conf-lint")) {
        fprintf(stderr, "%s: unknown command \"%s\" (conf, conf-all, "
                "conf-lint)\n", info_progname, cmd);
        return INFO_EXIT_USAGE;
    }

    /* the reader's own warnings (unknown keys) are reported by conf-lint
     * with its findings; the other commands show them on stderr */
    if (!strcmp(cmd, "conf-lint"))
        log_init(info_progname, LOG_TO_NONE);
    if (imapconf_load(conffile, &conf, &err) < 0) {
        if (!strcmp(cmd, "conf-lint")) {
            printf("error: %s\n%s: 1 error, 0 warnings\n", err ? err : conffile,
                   info_progname);
        } else {
            fprintf(stderr, "%s: %s\n", info_progname, err ? err : conffile);
        }
        free(err);
        return INFO_EXIT_ERRORS;
    }
    log_init(info_progname, LOG_TO_STDERR);

    if (!strcmp(cmd, "conf-lint"))
        ret = info_lint(conf, conffile, cyrusconf, cyrusconf_given, quiet);
    else
        ret = info_show(conf, !strcmp(cmd, "conf-all"));
    imapconf_free(&conf);
    return ret;
}
