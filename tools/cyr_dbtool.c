/*
 * cyr_dbtool.c - look at and change one cyrusdb database from the shell.
 *
 *   cyr_dbtool [-C imapd.conf] [-n] [-M] [-x] FILE BACKEND ACTION [ARGS]
 *
 * The command line follows Cyrus's cyr_dbtool (same argument order, same
 * "KEY<TAB>VALUE" output of show, same "KEY<TAB>VALUE" lines on stdin when
 * set/get/delete are given no key) so that scripts written for one work
 * with the other.  Differences: errors go to stderr and give exit status 1
 * (Cyrus prints an empty line for a missing key and exits 0); usage errors
 * exit 2; batch runs every line in one transaction and applies all of it or
 * nothing; -x reads and writes bytes as \xNN escapes.
 *
 * Started as root it acts as the owner of FILE's directory (lib/privs.c),
 * so that no file of a server becomes root's.  An existing FILE is checked
 * for its key order first (cyrusdb_detect_order()): one consistent only in
 * the other order is refused with "use -M" / "leave out -M" (exit 2).
 *
 * Invariant: a write action either commits completely or leaves the file
 * as it was; nothing is committed after an error.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_etcd.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/privs.h"

#define DBTOOL_EXIT_OK 0
#define DBTOOL_EXIT_ERROR 1
#define DBTOOL_EXIT_USAGE 2

#define DBTOOL_MAX_KEYLEN 511   /* cyrusdb's key limit */

static const char *dbtool_progname = "cyr_dbtool";

/* the options and the open database, for the action functions */
struct dbtool {
    const char *fname;
    const char *backend;
    struct cyrusdb *db;
    int escape;          /* -x: \xNN escapes in and out */
    int write_error;     /* a write to stdout failed */
};

static void dbtool_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] [-n] [-M] [-x] FILE BACKEND ACTION [ARGS]\n"
"\n"
"Look at or change the cyrusdb database FILE, written by BACKEND.\n"
"Backends: %s\n"
"\n"
"Actions:\n"
"  show [PREFIX]     print every record (whose key starts with PREFIX) as\n"
"                    KEY<TAB>VALUE, one per line, in key order\n"
"  get KEY           print the value of KEY\n"
"  set KEY VALUE     store VALUE under KEY (replacing any old value)\n"
"  delete KEY        remove KEY (an error if it is absent)\n"
"  get | set | delete  without KEY: read KEY<TAB>VALUE (or KEY) lines from\n"
"                    stdin, as Cyrus's cyr_dbtool does; set and delete apply\n"
"                    all lines in one transaction; blank lines are skipped\n"
"  batch             read commands from stdin, one per line, and run them all\n"
"                    in ONE transaction, committed at end of input; any\n"
"                    failure aborts everything and names the line:\n"
"                      set KEY VALUE     (VALUE is the rest of the line)\n"
"                      get KEY | delete KEY | show [PREFIX]\n"
"                                        (KEY, PREFIX: the rest of the line)\n"
"                    Fields are separated by one space, or by TABs when a TAB\n"
"                    follows the command word (set<TAB>KEY<TAB>VALUE), so that\n"
"                    keys may hold spaces.  Blank lines and lines starting\n"
"                    with # are skipped.  Command words may be upper case.\n"
"  consistent        check the whole file; prints \"Yes, consistent\" or\n"
"                    \"No, not consistent\" (exit 1)\n"
"  dump [LEVEL]      the backend's own dump: LEVEL 0 (default) one line per\n"
"                    record with bytes escaped, 1 adds the file's structure\n"
"  checkpoint        compact / checkpoint the file (alias: repack)\n"
"\n"
"Options:\n"
"  -C FILE   read this imapd.conf (checked for errors; nothing in it changes\n"
"            how FILE is found: give FILE's full name)\n"
"  -n        create FILE (and its directory) if it does not exist\n"
"  -M        mailbox-name order: '.' sorts before every other byte; use it\n"
"            for databases kept in that order (mailboxes.db, quotas.db,\n"
"            *.sub).  The order is not recorded in the file: an existing\n"
"            file is checked first, and one that is consistent only in\n"
"            the other order is refused with a message saying so (exit 2)\n"
"  -x        escapes: in keys, values and prefixes given on the command\n"
"            line or stdin, \\xNN is the byte with hex value NN and \\\\ is\n"
"            one backslash; output escapes bytes below 0x20, 0x7f, bytes\n"
"            from 0x80, and the backslash as \\xNN.  Without -x, bytes pass\n"
"            through unchanged (stdin lines still cannot hold a newline,\n"
"            nor a key a TAB).\n"
"  -h, --help  this text\n"
"\n"
"Started as root, the tool acts as the owner of FILE's directory (unless\n"
"that is root), so that no file of the server becomes root's.\n"
"Exit status: 0 success, 1 error (message on stderr), 2 usage error (also:\n"
"FILE is in the other key order, see -M).\n"
"Examples:\n"
"  %s -n /var/imap/test.db skiplist set user.alice \"some value\"\n"
"  %s /var/imap/test.db skiplist show user.\n"
"  printf 'set a 1\\ndelete b\\n' | %s /var/imap/test.db skiplist batch\n",
            dbtool_progname, cyrusdb_names(), dbtool_progname,
            dbtool_progname, dbtool_progname);
}

static void dbtool_usage_error(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

static void dbtool_usage_error(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: ", dbtool_progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s --help' for more information.\n",
            dbtool_progname);
    exit(DBTOOL_EXIT_USAGE);
}

/* ---- escapes ----------------------------------------------------------- */

static int dbtool_hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode (s, len) into out: raw copy, or \xNN / \\ escapes when `escape`.
 * Returns 0, or -1 with a reason in *why_r. */
static int dbtool_decode(const char *s, size_t len, int escape,
                         struct buf *out, const char **why_r)
{
    size_t i;

    buf_reset(out);
    if (!escape) {
        if (buf_append(out, s, len) < 0)
            goto nomem;
        return 0;
    }
    for (i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (c == '\\') {
            if (i + 1 < len && s[i + 1] == '\\') {
                c = '\\';
                i++;
            } else if (i + 3 < len && (s[i + 1] == 'x' || s[i + 1] == 'X') &&
                       dbtool_hexval((unsigned char)s[i + 2]) >= 0 &&
                       dbtool_hexval((unsigned char)s[i + 3]) >= 0) {
                c = dbtool_hexval((unsigned char)s[i + 2]) * 16 +
                    dbtool_hexval((unsigned char)s[i + 3]);
                i += 3;
            } else {
                *why_r = "bad escape (use \\xNN with two hex digits, or \\\\)";
                return -1;
            }
        }
        if (buf_putc(out, c) < 0)
            goto nomem;
    }
    return 0;
nomem:
    *why_r = "out of memory";
    return -1;
}

/* Write (s, len) to stdout, raw or escaped. */
static void dbtool_put(struct dbtool *t, const char *s, size_t len)
{
    size_t i;

    if (!t->escape) {
        if (len && fwrite(s, 1, len, stdout) != len)
            t->write_error = 1;
        return;
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\\' || c >= 0x80) {
            if (printf("\\x%02x", c) < 0)
                t->write_error = 1;
        } else if (putchar(c) == EOF) {
            t->write_error = 1;
        }
    }
}

/* For messages: the key with bytes escaped as -x writes them, cut after
 * 100 bytes. */
static const char *dbtool_showkey(const char *key, size_t keylen)
{
    static char out[512];
    size_t i, n = 0;

    for (i = 0; i < keylen && i < 100; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c < 0x20 || c >= 0x7f || c == '\\')
            n += (size_t)snprintf(out + n, sizeof(out) - n, "\\x%02x", c);
        else
            out[n++] = (char)c;
    }
    if (i < keylen) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
    return out;
}

static int dbtool_check_key(const struct buf *key, const char **why_r)
{
    if (key->len == 0) {
        *why_r = "empty key";
        return -1;
    }
    if (key->len > DBTOOL_MAX_KEYLEN) {
        *why_r = "key longer than 511 bytes";
        return -1;
    }
    return 0;
}

/* ---- actions ------------------------------------------------------------ */

static int dbtool_print_cb(void *rock, const char *key, size_t keylen,
                           const char *data, size_t datalen)
{
    struct dbtool *t = rock;

    dbtool_put(t, key, keylen);
    if (putchar('\t') == EOF)
        t->write_error = 1;
    dbtool_put(t, data, datalen);
    if (putchar('\n') == EOF)
        t->write_error = 1;
    return t->write_error ? CYRUSDB_IOERROR : 0;
}

static void dbtool_report(const struct dbtool *t, const char *what, int r)
{
    fprintf(stderr, "%s: %s: %s: %s\n", dbtool_progname, t->fname, what,
            cyrusdb_strerror(r));
}

static int dbtool_show(struct dbtool *t, const struct buf *prefix,
                       struct cyrusdb_txn **tid)
{
    int r = cyrusdb_foreach(t->db, prefix->s, prefix->len, NULL,
                            dbtool_print_cb, t, tid);
    if (r != CYRUSDB_OK && !t->write_error)
        dbtool_report(t, "show", r);
    return r;
}

static int dbtool_get(struct dbtool *t, const struct buf *key,
                      struct cyrusdb_txn **tid)
{
    const char *data = NULL;
    size_t datalen = 0;
    int r = cyrusdb_fetch(t->db, key->s, key->len, &data, &datalen, tid);

    if (r == CYRUSDB_OK) {
        dbtool_put(t, data, datalen);
        if (putchar('\n') == EOF)
            t->write_error = 1;
    } else {
        fprintf(stderr, "%s: %s: get key <%s>: %s\n", dbtool_progname,
                t->fname, dbtool_showkey(key->s, key->len),
                cyrusdb_strerror(r));
    }
    return r;
}

static int dbtool_set(struct dbtool *t, const struct buf *key,
                      const struct buf *val, struct cyrusdb_txn **tid)
{
    int r = cyrusdb_store(t->db, key->s, key->len, val->s ? val->s : "",
                          val->len, tid);
    if (r != CYRUSDB_OK)
        fprintf(stderr, "%s: %s: set key <%s>: %s\n", dbtool_progname,
                t->fname, dbtool_showkey(key->s, key->len),
                cyrusdb_strerror(r));
    return r;
}

static int dbtool_delete(struct dbtool *t, const struct buf *key,
                         struct cyrusdb_txn **tid)
{
    int r = cyrusdb_delete(t->db, key->s, key->len, tid, 0);
    if (r != CYRUSDB_OK)
        fprintf(stderr, "%s: %s: delete key <%s>: %s\n", dbtool_progname,
                t->fname, dbtool_showkey(key->s, key->len),
                cyrusdb_strerror(r));
    return r;
}

/* End a transaction: commit if all went well, else abort. */
static int dbtool_finish(struct dbtool *t, struct cyrusdb_txn *tid, int failed)
{
    int r;

    if (!tid)
        return failed ? CYRUSDB_INTERNAL : CYRUSDB_OK;
    if (failed) {
        r = cyrusdb_abort(t->db, tid);
        if (r != CYRUSDB_OK)
            dbtool_report(t, "abort", r);
        return CYRUSDB_INTERNAL;
    }
    r = cyrusdb_commit(t->db, tid);
    if (r != CYRUSDB_OK)
        dbtool_report(t, "commit", r);
    return r;
}

/* Read one line from stdin without its newline.  Returns its length, or -1
 * at end of input. */
static ssize_t dbtool_getline(char **line, size_t *cap)
{
    ssize_t n = getline(line, cap, stdin);

    if (n <= 0)
        return -1;
    if ((*line)[n - 1] == '\n')
        n--;
    return n;
}

/*
 * Cyrus's stdin form: "get", "set", "delete" with no key read
 * KEY<TAB>VALUE lines (KEY ends at the first TAB or the end of the line).
 * set and delete run in one transaction.
 */
static int dbtool_stdin_action(struct dbtool *t, const char *action)
{
    struct buf key = BUF_INITIALIZER, val = BUF_INITIALIZER;
    struct cyrusdb_txn *tid = NULL;
    int is_get = !strcmp(action, "get");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int failed = 0;

    while (!failed && (n = dbtool_getline(&line, &cap)) >= 0) {
        const char *tab = memchr(line, '\t', (size_t)n);
        size_t keylen = tab ? (size_t)(tab - line) : (size_t)n;
        const char *why = NULL;

        lineno++;
        if (n == 0)
            continue;       /* blank lines are skipped */
        if (dbtool_decode(line, keylen, t->escape, &key, &why) < 0 ||
            (tab && dbtool_decode(tab + 1, (size_t)n - keylen - 1, t->escape,
                                  &val, &why) < 0) ||
            dbtool_check_key(&key, &why) < 0) {
            fprintf(stderr, "%s: stdin line %ld: %s\n", dbtool_progname,
                    lineno, why);
            failed = 1;
            break;
        }
        if (!tab)
            buf_reset(&val);
        if (is_get)
            failed = dbtool_get(t, &key, NULL) != CYRUSDB_OK;
        else if (!strcmp(action, "set"))
            failed = dbtool_set(t, &key, &val, &tid) != CYRUSDB_OK;
        else
            failed = dbtool_delete(t, &key, &tid) != CYRUSDB_OK;
        if (failed)
            fprintf(stderr, "%s: stdin line %ld failed%s\n", dbtool_progname,
                    lineno, is_get ? "" : "; nothing was changed");
    }
    free(line);
    buf_free(&key);
    buf_free(&val);
    if (dbtool_finish(t, tid, failed) != CYRUSDB_OK)
        return DBTOOL_EXIT_ERROR;
    return DBTOOL_EXIT_OK;
}

/*
 * Split a batch line after its command word.  Fields: when a TAB follows
 * the command word, TAB-separated; else space-separated.  The last field
 * wanted takes the rest of the line.  Returns the number of fields found
 * (at most `want`).
 */
static int dbtool_split(const char *s, size_t len, int want,
                        const char **field, size_t *flen)
{
    char sep;
    size_t i = 0;
    int n = 0;

    while (i < len && s[i] != ' ' && s[i] != '\t')
        i++;
    if (i == len)
        return 0;
    sep = s[i];
    i++;
    while (n < want) {
        size_t start = i;
        if (n == want - 1) {
            i = len;
        } else {
            while (i < len && s[i] != sep)
                i++;
        }
        field[n] = s + start;
        flen[n] = i - start;
        n++;
        if (i >= len)
            break;
        i++;    /* the separator */
    }
    return n;
}

static int dbtool_batch(struct dbtool *t)
{
    struct buf key = BUF_INITIALIZER, val = BUF_INITIALIZER;
    struct cyrusdb_txn *tid = NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long lineno = 0;
    int failed = 0, r;

    while ((n = dbtool_getline(&line, &cap)) >= 0) {
        const char *field[2];
        size_t flen[2], cmdlen = 0;
        const char *why = NULL;
        int nf;

        lineno++;
        if (n == 0 || line[0] == '#')
            continue;
        while (cmdlen < (size_t)n && line[cmdlen] != ' ' && line[cmdlen] != '\t')
            cmdlen++;

#define DBTOOL_IS(word) (cmdlen == strlen(word) && !strncasecmp(line, word, cmdlen))
        if (DBTOOL_IS("set")) {
            nf = dbtool_split(line, (size_t)n, 2, field, flen);
            if (nf < 2) {
                why = "set needs KEY and VALUE";
            } else if (dbtool_decode(field[0], flen[0], t->escape, &key, &why) == 0 &&
                       dbtool_check_key(&key, &why) == 0 &&
                       dbtool_decode(field[1], flen[1], t->escape, &val, &why) == 0) {
                failed = dbtool_set(t, &key, &val, &tid) != CYRUSDB_OK;
            }
        } else if (DBTOOL_IS("get") || DBTOOL_IS("delete")) {
            int is_get = DBTOOL_IS("get");
            nf = dbtool_split(line, (size_t)n, 1, field, flen);
            if (nf < 1) {
                why = is_get ? "get needs KEY" : "delete needs KEY";
            } else if (dbtool_decode(field[0], flen[0], t->escape, &key, &why) == 0 &&
                       dbtool_check_key(&key, &why) == 0) {
                if (is_get)
                    failed = dbtool_get(t, &key, &tid) != CYRUSDB_OK;
                else
                    failed = dbtool_delete(t, &key, &tid) != CYRUSDB_OK;
            }
        } else if (DBTOOL_IS("show")) {
            nf = dbtool_split(line, (size_t)n, 1, field, flen);
            if (dbtool_decode(nf ? field[0] : "", nf ? flen[0] : 0, t->escape,
                              &key, &why) == 0)
                failed = dbtool_show(t, &key, &tid) != CYRUSDB_OK;
        } else {
            why = "unknown command (use set, get, delete or show)";
        }
#undef DBTOOL_IS
        if (why) {
            fprintf(stderr, "%s: %s: batch line %ld: %s\n", dbtool_progname,
                    t->fname, lineno, why);
            failed = 1;
        }
        if (failed)
            break;
    }
    free(line);
    buf_free(&key);
    buf_free(&val);
    r = dbtool_finish(t, tid, failed);
    if (failed) {
        fprintf(stderr, "%s: %s: batch failed at line %ld; aborted, nothing "
                "was committed\n", dbtool_progname, t->fname, lineno);
        return DBTOOL_EXIT_ERROR;
    }
    if (r != CYRUSDB_OK)
        return DBTOOL_EXIT_ERROR;
    return DBTOOL_EXIT_OK;
}

/* ---- main --------------------------------------------------------------- */

struct dbtool_action {
    const char *name;
    int min_args, max_args;   /* arguments after the action word */
    int writes;               /* opens the file for writing */
};

static const struct dbtool_action dbtool_actions[] = {
    { .name = "show",       .min_args = 0, .max_args = 1, .writes = 0 },
    { .name = "get",        .min_args = 0, .max_args = 1, .writes = 0 },
    { .name = "set",        .min_args = 0, .max_args = 2, .writes = 1 },
    { .name = "delete",     .min_args = 0, .max_args = 1, .writes = 1 },
    { .name = "batch",      .min_args = 0, .max_args = 0, .writes = 1 },
    { .name = "consistent", .min_args = 0, .max_args = 0, .writes = 0 },
    { .name = "dump",       .min_args = 0, .max_args = 1, .writes = 0 },
    { .name = "checkpoint", .min_args = 0, .max_args = 0, .writes = 1 },
    { .name = "repack",     .min_args = 0, .max_args = 0, .writes = 1 },
    { .name = NULL, .min_args = 0, .max_args = 0, .writes = 0 }
};

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { "create", no_argument, NULL, 'n' },
        { "mboxsort", no_argument, NULL, 'M' },
        { "escape", no_argument, NULL, 'x' },
        { NULL, 0, NULL, 0 }
    };
    struct dbtool t = { .fname = NULL, .backend = NULL, .db = NULL,
                        .escape = 0, .write_error = 0 };
    const struct dbtool_action *act;
    const char *config = NULL, *action, *err = NULL, *why = NULL;
    struct buf key = BUF_INITIALIZER, val = BUF_INITIALIZER;
    int flags = 0, opt, nargs, r, ret = DBTOOL_EXIT_OK;
    char **args;

    log_init(argv[0], LOG_TO_STDERR);
    if (argv[0] && strrchr(argv[0], '/'))
        dbtool_progname = strrchr(argv[0], '/') + 1;
    else if (argv[0])
        dbtool_progname = argv[0];

    /* '+': options end at FILE, so keys may start with '-' */
    while ((opt = getopt_long(argc, argv, "+C:nMxh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': config = optarg; break;
        case 'n': flags |= CYRUSDB_CREATE; break;
        case 'M': flags |= CYRUSDB_MBOXSORT; break;
        case 'x': t.escape = 1; break;
        case 'h': dbtool_usage(stdout); return DBTOOL_EXIT_OK;
        default:
            fprintf(stderr, "Try '%s --help' for more information.\n",
                    dbtool_progname);
            return DBTOOL_EXIT_USAGE;
        }
    }
    if (argc - optind < 3)
        dbtool_usage_error("%s", "need FILE BACKEND ACTION");
    t.fname = argv[optind];
    t.backend = argv[optind + 1];
    action = argv[optind + 2];
    args = argv + optind + 3;
    nargs = argc - optind - 3;

    if (!cyrusdb_lookup(t.backend)) {
        fprintf(stderr, "%s: unknown backend \"%s\" (known: %s)\n",
                dbtool_progname, t.backend, cyrusdb_names());
        return DBTOOL_EXIT_USAGE;
    }
    for (act = dbtool_actions; act->name; act++)
        if (!strcmp(act->name, action))
            break;
    if (!act->name)
        dbtool_usage_error("unknown action \"%s\"", action);
    if (nargs < act->min_args || nargs > act->max_args)
        dbtool_usage_error("wrong number of arguments for %s", action);
    if (!strcmp(action, "set") && nargs == 1)
        dbtool_usage_error("%s", "set needs KEY and VALUE (or neither, to read "
                           "KEY<TAB>VALUE lines from stdin)");

    /* decode the command line's key / prefix and value */
    if (nargs >= 1) {
        if (dbtool_decode(args[0], strlen(args[0]), t.escape, &key, &why) < 0)
            dbtool_usage_error("%s", why);
        if (strcmp(action, "show") && strcmp(action, "dump") &&
            dbtool_check_key(&key, &why) < 0)
            dbtool_usage_error("%s", why);
    }
    if (nargs >= 2 &&
        dbtool_decode(args[1], strlen(args[1]), t.escape, &val, &why) < 0)
        dbtool_usage_error("%s", why);

    if (config) {
        struct imapconf *conf = NULL;
        char *cerr = NULL;
        if (imapconf_load(config, &conf, &cerr) < 0) {
            fprintf(stderr, "%s: %s\n", dbtool_progname,
                    cerr ? cerr : config);
            free(cerr);
            return DBTOOL_EXIT_ERROR;
        }
        cyrusdb_etcd_configure(conf);
        imapconf_free(&conf);
    }

    /* started as root: act as the owner of the file's directory, so that
     * nothing (the file, a lock file beside it) becomes root's */
    if (privs_drop_to_owner(t.fname, &err) != PRIVS_OK) {
        fprintf(stderr, "%s: %s\n", dbtool_progname, err);
        buf_free(&key);
        buf_free(&val);
        return DBTOOL_EXIT_ERROR;
    }

    /* a file in the other key order reads as damaged and misleads get
     * and set: find its order first (a damaged file is left to the
     * action, which reports the damage) */
    if (access(t.fname, F_OK) == 0) {
        int order = 0;
        if (cyrusdb_detect_order(t.backend, t.fname, flags, &order)
                == CYRUSDB_OK && order != (flags & CYRUSDB_MBOXSORT)) {
            if (order)
                fprintf(stderr, "%s: %s: this file is in mailbox order "
                        "(consistent with -M, not without it): use -M\n",
                        dbtool_progname, t.fname);
            else
                fprintf(stderr, "%s: %s: this file is in byte order "
                        "(consistent without -M, not with it): leave out "
                        "-M\n", dbtool_progname, t.fname);
            buf_free(&key);
            buf_free(&val);
            return DBTOOL_EXIT_USAGE;
        }
    }

    if (!act->writes && !(flags & CYRUSDB_CREATE))
        flags |= CYRUSDB_RDONLY;
    r = cyrusdb_open(t.backend, t.fname, flags, &t.db, &err);
    if (r != CYRUSDB_OK) {
        if (err && *err)
            fprintf(stderr, "%s: %s\n", dbtool_progname, err);
        else
            fprintf(stderr, "%s: %s: cannot open as %s: %s\n", dbtool_progname,
                    t.fname, t.backend, cyrusdb_strerror(r));
        if (r == CYRUSDB_NOTFOUND)
            fprintf(stderr, "%s: (use -n to create a new database)\n",
                    dbtool_progname);
        buf_free(&key);
        buf_free(&val);
        return DBTOOL_EXIT_ERROR;
    }

    if (!strcmp(action, "show")) {
        if (dbtool_show(&t, &key, NULL) != CYRUSDB_OK)
            ret = DBTOOL_EXIT_ERROR;
    } else if ((!strcmp(action, "get") || !strcmp(action, "set") ||
                !strcmp(action, "delete")) && nargs == 0) {
        ret = dbtool_stdin_action(&t, action);
    } else if (!strcmp(action, "get")) {
        if (dbtool_get(&t, &key, NULL) != CYRUSDB_OK)
            ret = DBTOOL_EXIT_ERROR;
    } else if (!strcmp(action, "set")) {
        if (dbtool_set(&t, &key, &val, NULL) != CYRUSDB_OK)
            ret = DBTOOL_EXIT_ERROR;
    } else if (!strcmp(action, "delete")) {
        if (dbtool_delete(&t, &key, NULL) != CYRUSDB_OK)
            ret = DBTOOL_EXIT_ERROR;
    } else if (!strcmp(action, "batch")) {
        ret = dbtool_batch(&t);
    } else if (!strcmp(action, "consistent")) {
        r = cyrusdb_consistent(t.db);
        if (r == CYRUSDB_OK) {
            printf("Yes, consistent\n");
        } else {
            printf("No, not consistent\n");
            dbtool_report(&t, "consistent", r);
            ret = DBTOOL_EXIT_ERROR;
        }
    } else if (!strcmp(action, "dump")) {
        long level = 0;
        if (nargs == 1) {
            char *end;
            errno = 0;
            level = strtol(args[0], &end, 10);
            if (errno || *end || end == args[0] || level < 0 || level > INT_MAX)
                dbtool_usage_error("dump LEVEL must be 0 or 1, not \"%s\"", args[0]);
        }
        fflush(stdout);
        r = cyrusdb_dump(t.db, stdout, (int)level);
        if (r != CYRUSDB_OK) {
            dbtool_report(&t, "dump", r);
            ret = DBTOOL_EXIT_ERROR;
        }
    } else {    /* checkpoint, repack */
        r = cyrusdb_checkpoint(t.db);
        if (r != CYRUSDB_OK) {
            dbtool_report(&t, "checkpoint", r);
            ret = DBTOOL_EXIT_ERROR;
        }
    }

    r = cyrusdb_close(&t.db);
    if (r != CYRUSDB_OK) {
        dbtool_report(&t, "close", r);
        ret = DBTOOL_EXIT_ERROR;
    }
    buf_free(&key);
    buf_free(&val);
    if (fflush(stdout) == EOF || ferror(stdout))
        t.write_error = 1;
    if (t.write_error) {
        fprintf(stderr, "%s: error writing to stdout: %s\n", dbtool_progname,
                strerror(errno));
        ret = DBTOOL_EXIT_ERROR;
    }
    return ret;
}
