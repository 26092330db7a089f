/*
 * test_corrupt.c - damaged database files, every backend.
 *
 * For each backend (narrowed by $TEST_BACKENDS) a database with known
 * records is built and closed; then copies of it are damaged:
 *   truncate/<backend>:  cut at ~25 sizes from 0 to just below full;
 *   flip/<backend>:      one byte changed at 60 positions, header included;
 *   random/<backend>:    a file of random bytes;
 *   magic/<backend>:     this backend's magic followed by garbage.
 * Each damaged file is opened (without CYRUSDB_CREATE) in a forked child
 * under alarm(60) (a hang guard: the work takes milliseconds); the child
 * fetches every known key and a few deleted or never-written ones, walks
 * everything, runs cyrusdb_consistent(), and
 * reports what it saw through shared memory.  The parent judges:
 *
 *   always a failure: the child crashed (signal), hung (SIGALRM or the
 *   parent's timeout), or a call returned a code that is not a cyrusdb
 *   code; and, while consistent() says OK, a structurally impossible
 *   result: a walk out of key order or meeting a key twice, a key of 0 or
 *   more than 511 bytes, or a walk and fetch that disagree (the walk shows
 *   K=V and fetch(K) gives something else, or fetch finds a known key that
 *   a complete walk did not meet).
 *
 *   a failure for backends that promise it (the table below): returning a
 *   wrong value, a record that was deleted or never written, or losing a
 *   record, while every call said OK and consistent() said OK -- data that
 *   came back silently wrong.
 *
 * What each backend can promise, from its on-disk format:
 *   flat      no checksums and no header: a changed byte inside a key or
 *             value is a valid file with other data, and a cut right after
 *             a newline is a valid shorter file.  Promised: a cut anywhere
 *             else (a last line without its newline) is detected.
 *   skiplist  Cyrus skiplist 1.2 has no record checksums: a changed value
 *             byte is returned as is.  Lengths and pointers are checked,
 *             so only the structural guarantees are asserted.
 *   db3, db3-nosync
 *             opened with DB_CHKSUM: every page carries a checksum, so a
 *             changed value byte and every cut are promised to be detected.
 *   lmdb      LMDB keeps no checksums itself, but the adapter stores a
 *             CRC-32C over key and value after every value and checks it
 *             on every read: a changed byte inside a key or value is
 *             detected (value_checksums).  Cuts: only the structural
 *             guarantees (the structure check at open).
 * Silently wrong results on those backends are counted and printed, so a
 * regression in what is detected shows in the log.
 *
 * For db3 the database file and its environment (the db/ directory beside
 * it) belong together: every case gets a fresh copy of the directory
 * without Berkeley DB's region files (__db.*), and only the database file
 * is damaged.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/log.h"
#include "tests/testhelp.h"

#define CORR_RECORDS 100          /* known records "rec.NNNN" */
#define CORR_GONE 20              /* "gone.NNNN": written, then deleted */
#define CORR_VALUE_MAX 4096
#define CORR_TRUNCATIONS 20
#define CORR_FLIPS 60
#define CORR_PAGE 4096            /* page size of Berkeley DB and LMDB here */
#define CORR_PAGE_FLIPS 40        /* pages whose structure is aimed at */
#define CORR_CHILD_ALARM 60
#define CORR_DBNAME "test.db"
#define CORR_MAX_UNKNOWN 16

/* ---- what each backend promises ---------------------------------------- */

enum corr_trunc_promise {
    CORR_TRUNC_STRUCTURE = 0,   /* only the structural guarantees */
    CORR_TRUNC_UNLESS_LINE,     /* detected unless the cut follows a '\n' */
    CORR_TRUNC_ALWAYS           /* every cut is detected */
};

struct corr_promise {
    const char *format;
    int value_checksums;        /* every changed byte is detected */
    enum corr_trunc_promise trunc;
};

static const struct corr_promise corr_promises[] = {
    { .format = "flat",     .value_checksums = 0, .trunc = CORR_TRUNC_UNLESS_LINE },
    { .format = "skiplist", .value_checksums = 0, .trunc = CORR_TRUNC_STRUCTURE },
    { .format = "db3",      .value_checksums = 1, .trunc = CORR_TRUNC_ALWAYS },
    { .format = "lmdb",     .value_checksums = 1, .trunc = CORR_TRUNC_STRUCTURE },
};

/* $TEST_CORRUPT_STRICT=1 holds every backend to the strictest promise
 * (every changed byte and every cut detected): a report of what each one
 * would need to detect beyond what it promises. */
static const struct corr_promise *corr_promise_for(const char *backend)
{
    const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backend);
    static const struct corr_promise none = { .format = "?", .value_checksums = 0,
                                              .trunc = CORR_TRUNC_STRUCTURE };
    static const struct corr_promise strictest = { .format = "*", .value_checksums = 1,
                                                   .trunc = CORR_TRUNC_ALWAYS };
    const char *env = getenv("TEST_CORRUPT_STRICT");
    size_t i;

    if (env && *env == '1')
        return &strictest;

    for (i = 0; e && i < sizeof(corr_promises) / sizeof(corr_promises[0]); i++)
        if (!strcmp(corr_promises[i].format, e->format))
            return &corr_promises[i];
    return &none;
}

/* ---- the known records ----------------------------------------------------- */

static size_t corr_key(char *buf, unsigned i)
{
    return (size_t)snprintf(buf, 32, "rec.%04u", i);
}

static size_t corr_gone_key(char *buf, unsigned i)
{
    return (size_t)snprintf(buf, 32, "gone.%04u", i);
}

/* Final generation of record i: some are overwritten in a second commit. */
static unsigned corr_gen(unsigned i)
{
    return i % 9 == 4 ? 1 : 0;
}

/* Value of record i, generation gen: some empty, some bigger than a
 * Berkeley DB / LMDB page holds inline, pseudo-random bytes with NULs. */
static size_t corr_value(char *buf, unsigned i, unsigned gen)
{
    size_t len;

    if (i % 13 == 0)
        len = 0;
    else if (i % 10 == 3)
        len = 2500 + (i * 7) % 1000;
    else
        len = 10 + (i * 37) % 150;
    th_fill(buf, len, i * 31 + gen + 1);
    return len;
}

/* ---- child-side helpers ------------------------------------------------- */

static void corr_child_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void corr_child_note(const char *fmt, ...)
{
    va_list ap;

    if (!getenv("TEST_VERBOSE"))
        return;
    fprintf(stderr, "corrupt[%ld]: ", (long)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static int corr_build(const char *backend, const char *fname, int records)
{
    struct cyrusdb *db = NULL;
    struct cyrusdb_txn *tid = NULL;
    const char *err = NULL;
    char key[32], val[CORR_VALUE_MAX];
    size_t kl, vl;
    unsigned i;
    int r;

    r = cyrusdb_open(backend, fname, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT, &db, &err);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "corrupt: build: open %s: %s (%s)\n", fname, cyrusdb_strerror(r),
                err ? err : "");
        return 1;
    }
    /* first commit: every record at generation 0, and the doomed ones */
    for (i = 0; i < (unsigned)records && r == CYRUSDB_OK; i++) {
        kl = corr_key(key, i);
        vl = corr_value(val, i, 0);
        r = cyrusdb_store(db, key, kl, val, vl, &tid);
    }
    for (i = 0; i < CORR_GONE && r == CYRUSDB_OK; i++) {
        kl = corr_gone_key(key, i);
        vl = corr_value(val, i + 1000, 0);
        r = cyrusdb_store(db, key, kl, val, vl, &tid);
    }
    if (r == CYRUSDB_OK)
        r = cyrusdb_commit(db, tid);
    else if (tid)
        cyrusdb_abort(db, tid);
    tid = NULL;
    /* compact what is there so far, where the backend can */
    if (r == CYRUSDB_OK) {
        r = cyrusdb_checkpoint(db);
        if (r == CYRUSDB_NOTIMPLEMENTED)
            r = CYRUSDB_OK;
    }
    /* second commit (left in the log of log-structured formats):
     * overwrite some records, delete the doomed ones */
    for (i = 0; i < (unsigned)records && r == CYRUSDB_OK; i++) {
        if (!corr_gen(i))
            continue;
        kl = corr_key(key, i);
        vl = corr_value(val, i, corr_gen(i));
        r = cyrusdb_store(db, key, kl, val, vl, &tid);
    }
    for (i = 0; i < CORR_GONE && r == CYRUSDB_OK; i++) {
        kl = corr_gone_key(key, i);
        r = cyrusdb_delete(db, key, kl, &tid, 0);
    }
    if (r == CYRUSDB_OK)
        r = cyrusdb_commit(db, tid);
    else if (tid)
        cyrusdb_abort(db, tid);
    if (r == CYRUSDB_OK)
        r = cyrusdb_consistent(db);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "corrupt: build %s: %s\n", fname, cyrusdb_strerror(r));
        cyrusdb_close(&db);
        return 1;
    }
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "corrupt: build: close: %s\n", cyrusdb_strerror(r));
        return 1;
    }
    return 0;
}

/* What the child saw, handed to the parent through MAP_SHARED memory. */
struct corr_result {
    int stage;           /* 1 opened, 2 fetched, 3 walked, 4 checked, 5 closed */
    int open_r;
    int fetch_ok, fetch_wrong, fetch_missing, fetch_err;
    int ghost_ok;        /* a deleted / never-written key fetched OK */
    int bad_code;        /* a return value that is no cyrusdb code, or a
                          * fetch OK without sane data */
    int walk_r, walk_n;
    int walk_order;      /* out of order or repeated */
    int walk_badkey;     /* key length 0 or > 511 */
    int walk_unknown;    /* a key that was never written or was deleted */
    int walk_wrongval;   /* a known key with a wrong value */
    int walk_missing;    /* known keys absent from a complete walk */
    int disagree;        /* walk and fetch disagree */
    int consistent_r;
    char first[240];     /* the first structural problem, for the message */
};

static int corr_code_ok(int r)
{
    return r == CYRUSDB_OK || r == CYRUSDB_DONE ||
           (r <= CYRUSDB_IOERROR && r >= CYRUSDB_BADFORMAT);
}

struct corr_known {
    int fetch_r;
    char *val;           /* fetched value (malloc'd) when fetch_r == OK */
    size_t len;
    int walked;
};

struct corr_walk {
    struct corr_result *res;
    struct corr_known *known;
    int records;
    char prev[600];
    size_t prevlen;
    int have_prev;
    char val[CORR_VALUE_MAX];
    /* unknown keys met, to fetch afterwards */
    int nunknown;
    char *ukey[CORR_MAX_UNKNOWN];
    size_t ukeylen[CORR_MAX_UNKNOWN];
    char *uval[CORR_MAX_UNKNOWN];
    size_t uvallen[CORR_MAX_UNKNOWN];
};

static void corr_first(struct corr_result *res, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void corr_first(struct corr_result *res, const char *fmt, ...)
{
    va_list ap;

    if (res->first[0])
        return;
    va_start(ap, fmt);
    vsnprintf(res->first, sizeof(res->first), fmt, ap);
    va_end(ap);
}

/* Index of a known key "rec.NNNN" (NNNN < records), else -1. */
static int corr_known_index(const char *key, size_t keylen, int records)
{
    unsigned i = 0;
    size_t p;

    if (keylen != 8 || memcmp(key, "rec.", 4) != 0)
        return -1;
    for (p = 4; p < 8; p++) {
        if (key[p] < '0' || key[p] > '9')
            return -1;
        i = i * 10 + (unsigned)(key[p] - '0');
    }
    return i < (unsigned)records ? (int)i : -1;
}

static int corr_walk_cb(void *rock, const char *key, size_t keylen,
                        const char *data, size_t datalen)
{
    struct corr_walk *w = rock;
    struct corr_result *res = w->res;
    int i;

    res->walk_n++;
    if (res->walk_n > 100000) {
        corr_first(res, "walk goes on past 100000 records");
        res->walk_order++;
        return 1;
    }
    if (!key || keylen == 0 || keylen > 511 || (datalen && !data) || datalen > (64u << 20)) {
        res->walk_badkey++;
        corr_first(res, "walk handed out a key of %zu bytes / value of %zu bytes",
                   keylen, datalen);
        return 0;
    }
    if (w->have_prev && cyrusdb_compare(0, w->prev, w->prevlen, key, keylen) >= 0) {
        res->walk_order++;
        corr_first(res, "walk out of order or repeated at \"%.*s\"",
                   (int)(keylen < 40 ? keylen : 40), key);
    }
    memcpy(w->prev, key, keylen);
    w->prevlen = keylen;
    w->have_prev = 1;

    i = corr_known_index(key, keylen, w->records);
    if (i < 0) {
        res->walk_unknown++;
        if (w->nunknown < CORR_MAX_UNKNOWN) {
            int u = w->nunknown++;
            w->ukey[u] = malloc(keylen);
            w->uval[u] = malloc(datalen ? datalen : 1);
            if (w->ukey[u] && w->uval[u]) {
                memcpy(w->ukey[u], key, keylen);
                if (datalen)
                    memcpy(w->uval[u], data, datalen);
            }
            w->ukeylen[u] = keylen;
            w->uvallen[u] = datalen;
        }
        return 0;
    }
    if (w->known[i].walked) {
        res->walk_order++;
        corr_first(res, "walk met rec.%04d twice", i);
    }
    w->known[i].walked = 1;
    {
        size_t vl = corr_value(w->val, (unsigned)i, corr_gen((unsigned)i));
        if (datalen != vl || (vl && memcmp(data, w->val, vl) != 0))
            res->walk_wrongval++;
    }
    /* the walk must show what fetch showed */
    if (w->known[i].fetch_r == CYRUSDB_OK) {
        if (datalen != w->known[i].len ||
            (datalen && memcmp(data, w->known[i].val, datalen) != 0)) {
            res->disagree++;
            corr_first(res, "walk and fetch give rec.%04d different values", i);
        }
    } else if (w->known[i].fetch_r == CYRUSDB_NOTFOUND) {
        res->disagree++;
        corr_first(res, "walk meets rec.%04d, fetch says NOTFOUND", i);
    }
    return 0;
}

/* The child: open the damaged file and look at everything. */
static int corr_probe(const char *backend, const char *fname, int records,
                      struct corr_result *res)
{
    struct cyrusdb *db = NULL;
    struct corr_known *known;
    struct corr_walk *w;
    const char *err = NULL, *data;
    char key[32], val[CORR_VALUE_MAX];
    size_t len, kl, vl;
    int i, r;

    alarm(CORR_CHILD_ALARM);
    memset(res, 0, sizeof(*res));
    r = cyrusdb_open(backend, fname, 0, &db, &err);
    res->open_r = r;
    if (!corr_code_ok(r))
        res->bad_code++;
    if (r != CYRUSDB_OK) {
        corr_child_note("open %s: %s (%s)", fname, cyrusdb_strerror(r), err ? err : "");
        return 0;
    }
    res->stage = 1;
    known = calloc((size_t)records, sizeof(*known));
    w = calloc(1, sizeof(*w));
    if (!known || !w)
        return 2;

    for (i = 0; i < records; i++) {
        kl = corr_key(key, (unsigned)i);
        data = NULL;
        len = 0;
        r = cyrusdb_fetch(db, key, kl, &data, &len, NULL);
        known[i].fetch_r = r;
        if (!corr_code_ok(r))
            res->bad_code++;
        if (r == CYRUSDB_OK) {
            if ((len && !data) || len > (64u << 20)) {
                res->bad_code++;
                known[i].fetch_r = CYRUSDB_INTERNAL;
                continue;
            }
            known[i].val = malloc(len ? len : 1);
            if (!known[i].val)
                return 2;
            if (len)
                memcpy(known[i].val, data, len);
            known[i].len = len;
            vl = corr_value(val, (unsigned)i, corr_gen((unsigned)i));
            if (len == vl && (vl == 0 || memcmp(data, val, vl) == 0))
                res->fetch_ok++;
            else
                res->fetch_wrong++;
        } else if (r == CYRUSDB_NOTFOUND) {
            res->fetch_missing++;
        } else {
            res->fetch_err++;
        }
    }
    /* deleted and never-written keys must not come back */
    for (i = 0; i < CORR_GONE + 3; i++) {
        if (i < CORR_GONE)
            kl = corr_gone_key(key, (unsigned)i);
        else
            kl = corr_key(key, (unsigned)(records + i));
        r = cyrusdb_fetch(db, key, kl, &data, &len, NULL);
        if (!corr_code_ok(r))
            res->bad_code++;
        if (r == CYRUSDB_OK)
            res->ghost_ok++;
    }
    res->stage = 2;

    w->res = res;
    w->known = known;
    w->records = records;
    r = cyrusdb_foreach(db, NULL, 0, NULL, corr_walk_cb, w, NULL);
    res->walk_r = r;
    if (!corr_code_ok(r))
        res->bad_code++;
    if (r == CYRUSDB_OK) {
        for (i = 0; i < records; i++) {
            if (known[i].walked)
                continue;
            res->walk_missing++;
            if (known[i].fetch_r == CYRUSDB_OK) {
                res->disagree++;
                corr_first(res, "fetch finds rec.%04d, a complete walk does not", i);
            }
        }
    }
    /* what the walk showed beyond the known keys, fetch must show too */
    for (i = 0; i < w->nunknown; i++) {
        if (!w->ukey[i] || !w->uval[i])
            continue;
        r = cyrusdb_fetch(db, w->ukey[i], w->ukeylen[i], &data, &len, NULL);
        if (!corr_code_ok(r))
            res->bad_code++;
        if (r == CYRUSDB_OK &&
            (len != w->uvallen[i] || (len && memcmp(data, w->uval[i], len) != 0))) {
            res->disagree++;
            corr_first(res, "walk and fetch give an unexpected key different values");
        } else if (r == CYRUSDB_NOTFOUND) {
            res->disagree++;
            corr_first(res, "walk meets key \"%.*s\", fetch says NOTFOUND",
                       (int)(w->ukeylen[i] < 40 ? w->ukeylen[i] : 40), w->ukey[i]);
        }
        free(w->ukey[i]);
        free(w->uval[i]);
    }
    res->stage = 3;

    res->consistent_r = cyrusdb_consistent(db);
    if (!corr_code_ok(res->consistent_r))
        res->bad_code++;
    res->stage = 4;
    r = cyrusdb_close(&db);
    if (!corr_code_ok(r))
        res->bad_code++;
    res->stage = 5;
    for (i = 0; i < records; i++)
        free(known[i].val);
    free(known);
    free(w);
    return 0;
}

/* ---- parent-side helpers ---------------------------------------------------- */

/* Run fn in a child, wait up to limit seconds.  Returns the wait status
 * (a SIGKILL status if the parent had to kill it). */
static int corr_run_child(int (*fn)(const char *, const char *, int, struct corr_result *),
                          const char *backend, const char *fname, int records,
                          struct corr_result *res, double limit)
{
    struct timespec start, now;
    int status = 0;
    pid_t pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        return 0x7f00;
    if (pid == 0) {
        int rc;

        th_child_signals();
        if (!getenv("TEST_VERBOSE"))
            log_init("test_corrupt", LOG_TO_NONE);   /* errors provoked on purpose */
        rc = fn(backend, fname, records, res);
        fflush(stderr);
        _exit(rc);
    }
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return status;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - start.tv_sec) +
            (double)(now.tv_nsec - start.tv_nsec) / 1e9 > limit) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return status;
        }
        usleep(1000);
    }
}

static int corr_run_build(const char *backend, const char *fname, int records,
                          struct corr_result *res)
{
    (void)res;
    return corr_build(backend, fname, records);
}

static int corr_copy_file(const char *from, const char *to)
{
    char buf[65536];
    int in, out, rc = 0;
    ssize_t n;

    in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) {
        close(in);
        return -1;
    }
    while ((n = read(in, buf, sizeof(buf))) > 0) {
        if (write(out, buf, (size_t)n) != n) {
            rc = -1;
            break;
        }
    }
    if (n < 0)
        rc = -1;
    close(in);
    if (close(out) < 0)
        rc = -1;
    return rc;
}

/* Copy a directory tree, leaving out Berkeley DB region files (__db.*),
 * which describe processes, not data. */
static int corr_copy_tree(const char *from, const char *to)
{
    DIR *d;
    struct dirent *de;
    int rc = 0;

    if (mkdir(to, 0700) < 0 && errno != EEXIST)
        return -1;
    d = opendir(from);
    if (!d)
        return -1;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        char *src, *dst;
        struct stat st;

        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !strncmp(de->d_name, "__db.", 5))
            continue;
        src = th_path(from, de->d_name);
        dst = th_path(to, de->d_name);
        if (lstat(src, &st) < 0)
            rc = -1;
        else if (S_ISDIR(st.st_mode))
            rc = corr_copy_tree(src, dst);
        else if (S_ISREG(st.st_mode))
            rc = corr_copy_file(src, dst);
        free(src);
        free(dst);
    }
    closedir(d);
    return rc;
}

static char *corr_read_file(const char *fname, size_t *len_r)
{
    struct stat st;
    char *p;
    int fd = open(fname, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) < 0 || !(p = malloc((size_t)st.st_size + 1))) {
        close(fd);
        return NULL;
    }
    if (st.st_size && read(fd, p, (size_t)st.st_size) != (ssize_t)st.st_size) {
        free(p);
        close(fd);
        return NULL;
    }
    close(fd);
    *len_r = (size_t)st.st_size;
    return p;
}

static int corr_write_file(const char *fname, const char *data, size_t len)
{
    int fd = open(fname, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int rc = 0;

    if (fd < 0)
        return -1;
    if (len && write(fd, data, len) != (ssize_t)len)
        rc = -1;
    if (close(fd) < 0)
        rc = -1;
    return rc;
}

/* Per-test context: the pristine database and the tallies. */
struct corr_ctx {
    const char *backend;
    const struct corr_promise *promise;
    char *top;              /* temp dir of the whole test */
    char *pristine;         /* top/pristine: the built database */
    char *pristine_db;
    char *orig;             /* the pristine database file's bytes */
    size_t origlen;
    int records;
    struct corr_result *res;
    int cases;
    int refused, clean, errors, detected, silent_wrong, silent_missing;
    char failure[1024];
    int failures;
};

static void corr_fail(struct corr_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void corr_fail(struct corr_ctx *c, const char *fmt, ...)
{
    va_list ap;
    char line[900];

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stdout, "FAIL %s: %s\n", c->backend, line);
    fflush(stdout);
    if (!c->failures++)
        snprintf(c->failure, sizeof(c->failure), "%s: %s", c->backend, line);
}

static int corr_setup(struct corr_ctx *c, const char *backend, int records)
{
    char sbuf[64];
    int status;

    memset(c, 0, sizeof(*c));
    c->backend = backend;
    c->promise = corr_promise_for(backend);
    c->records = records;
    c->top = th_mkdtemp("corrupt");
    c->pristine = th_path(c->top, "pristine");
    c->pristine_db = th_path(c->pristine, CORR_DBNAME);
    c->res = mmap(NULL, sizeof(*c->res), PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (c->res == MAP_FAILED) {
        c->res = NULL;
        corr_fail(c, "mmap: %s", strerror(errno));
        return -1;
    }
    if (mkdir(c->pristine, 0700) < 0) {
        corr_fail(c, "mkdir: %s", strerror(errno));
        return -1;
    }
    status = corr_run_child(corr_run_build, backend, c->pristine_db, records, c->res, 60);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        corr_fail(c, "building the database failed (%s)",
                  th_status_text(status, sbuf, sizeof(sbuf)));
        return -1;
    }
    c->orig = corr_read_file(c->pristine_db, &c->origlen);
    if (!c->orig || c->origlen == 0) {
        corr_fail(c, "cannot read back %s", c->pristine_db);
        return -1;
    }
    return 0;
}

static void corr_teardown(struct corr_ctx *c)
{
    if (c->res)
        munmap(c->res, sizeof(*c->res));
    if (c->top && getenv("TEST_KEEP"))   /* keep the files to look at */
        printf("kept %s\n", c->top);
    else if (c->top)
        th_rmrf(c->top);
    free(c->top);
    free(c->pristine);
    free(c->pristine_db);
    free(c->orig);
}

/* Judge one damaged file.  what: "cut at 123" etc.  strict_missing: a lost
 * record without any error counts as silently wrong data that the backend
 * promised to detect (trunc promise); strict_value: changed or resurrected
 * data must be detected (value_checksums). */
static void corr_judge(struct corr_ctx *c, const char *what, int status,
                       int strict_missing, int strict_value)
{
    const struct corr_result *res = c->res;
    char sbuf[64];
    int saw_error, undetected;

    c->cases++;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        corr_fail(c, "%s: the child died: %s, after stage %d (1 open, 2 fetch, 3 walk, "
                  "4 consistent, 5 close)", what,
                  th_status_text(status, sbuf, sizeof(sbuf)), res->stage);
        return;
    }
    if (res->bad_code) {
        corr_fail(c, "%s: a call returned a value that is no cyrusdb code, or OK "
                  "without sane data (%d times)", what, res->bad_code);
        return;
    }
    if (res->open_r != CYRUSDB_OK) {
        c->refused++;
        return;
    }
    saw_error = res->fetch_err || (res->walk_r != CYRUSDB_OK) ||
                res->consistent_r != CYRUSDB_OK;
    undetected = !saw_error;
    if (undetected && (res->walk_order || res->walk_badkey || res->disagree)) {
        corr_fail(c, "%s: consistent() says OK but the results are impossible: %s "
                  "(order %d, bad keys %d, walk/fetch disagree %d)", what,
                  res->first[0] ? res->first : "?", res->walk_order, res->walk_badkey,
                  res->disagree);
        return;
    }
    if (res->consistent_r != CYRUSDB_OK)
        c->detected++;
    else if (saw_error)
        c->errors++;
    if (!undetected)
        return;
    if (res->fetch_wrong || res->walk_wrongval || res->walk_unknown || res->ghost_ok) {
        c->silent_wrong++;
        if (strict_value) {
            corr_fail(c, "%s: silently returned wrong data: %d wrong values, %d unknown "
                      "keys in the walk, %d deleted keys back, and consistent() says OK",
                      what, res->fetch_wrong, res->walk_unknown, res->ghost_ok);
            return;
        }
    } else if (res->fetch_missing || res->walk_missing) {
        c->silent_missing++;
        if (strict_missing) {
            corr_fail(c, "%s: silently lost %d records: every call and consistent() "
                      "said OK", what, res->fetch_missing);
            return;
        }
    } else {
        c->clean++;
    }
}

/* Make a fresh copy of the pristine directory holding `data` as the
 * database file, run the probe in a child, judge, and remove the copy. */
static void corr_case(struct corr_ctx *c, const char *what, const char *data, size_t len,
                      int strict_missing, int strict_value)
{
    char name[32];
    char *casedir, *casedb;
    int status;

    snprintf(name, sizeof(name), "case%d", c->cases);
    casedir = th_path(c->top, name);
    casedb = th_path(casedir, CORR_DBNAME);
    if (corr_copy_tree(c->pristine, casedir) < 0 || corr_write_file(casedb, data, len) < 0) {
        corr_fail(c, "%s: cannot prepare the copy: %s", what, strerror(errno));
    } else {
        status = corr_run_child(corr_probe, c->backend, casedb, c->records, c->res,
                                CORR_CHILD_ALARM + 5);
        corr_judge(c, what, status, strict_missing, strict_value);
    }
    th_rmrf(casedir);
    free(casedir);
    free(casedb);
}

static void corr_summary(struct corr_ctx *c, const char *test, double secs)
{
    printf("%s backend=<%s> cases=%d open_refused=%d errors=%d consistent_detected=%d "
           "clean=%d silent_wrong=%d silent_missing=%d failures=%d file_bytes=%zu "
           "elapsed=%.2fs\n", test, c->backend, c->cases, c->refused, c->errors,
           c->detected, c->clean, c->silent_wrong, c->silent_missing, c->failures,
           c->origlen, secs);
    fflush(stdout);
}

/* ---- the cases ------------------------------------------------------------- */

static void test_truncate(void **state)
{
    const char *backend = *state;
    struct corr_ctx c;
    double t0 = th_now();
    size_t cuts[CORR_TRUNCATIONS + 8];
    int ncut = 0, k;
    char what[64];

    if (corr_setup(&c, backend, CORR_RECORDS) == 0) {
        /* 0, then evenly up to full, plus a few cuts near the ends */
        for (k = 0; k < CORR_TRUNCATIONS; k++)
            cuts[ncut++] = c.origlen * (size_t)k / CORR_TRUNCATIONS;
        cuts[ncut++] = 1;
        cuts[ncut++] = c.origlen > 16 ? 16 : 1;
        cuts[ncut++] = c.origlen > 100 ? 100 : 1;
        cuts[ncut++] = c.origlen > 4096 ? 4096 : c.origlen / 2;
        cuts[ncut++] = c.origlen - 1;
        cuts[ncut++] = c.origlen > 10 ? c.origlen - 10 : 0;
        for (k = 0; k < ncut; k++) {
            int strict = 0;

            switch (c.promise->trunc) {
            case CORR_TRUNC_ALWAYS:
                strict = 1;      /* a file cut to nothing included */
                break;
            case CORR_TRUNC_UNLESS_LINE:
                strict = cuts[k] > 0 && c.orig[cuts[k] - 1] != '\n';
                break;
            case CORR_TRUNC_STRUCTURE:
                break;
            }
            snprintf(what, sizeof(what), "cut at %zu of %zu", cuts[k], c.origlen);
            corr_case(&c, what, c.orig, cuts[k], strict, c.promise->value_checksums);
        }
        corr_summary(&c, "truncate", th_now() - t0);
    }
    corr_teardown(&c);
    if (c.failures)
        fail_msg("%s (%d failures in all)", c.failure, c.failures);
}

static void test_flip(void **state)
{
    const char *backend = *state;
    static const unsigned char masks[] = { 0x01, 0x80, 0xff, 0x10, 0x55, 0x04 };
    static const size_t head[] = { 0, 1, 3, 4, 8, 12, 13, 16, 17, 20, 24, 28, 32, 40, 48, 64 };
    struct corr_ctx c;
    double t0 = th_now();
    char what[96];
    char *copy;
    size_t *pos, npos = 0, pages, p, i;
    int k, n;

    if (corr_setup(&c, backend, CORR_RECORDS) == 0) {
        copy = malloc(c.origlen);
        pos = malloc((CORR_FLIPS + 3 * CORR_PAGE_FLIPS) * sizeof(*pos));
        if (!copy || !pos) {
            corr_teardown(&c);
            fail_msg("malloc");
        }
        /* the header, then the rest spread evenly (off page boundaries) */
        n = (int)(sizeof(head) / sizeof(head[0]));
        for (k = 0; k < CORR_FLIPS; k++) {
            if (k < n)
                pos[npos] = head[k];
            else
                pos[npos] = 64 + (c.origlen - 64) * (size_t)(k - n) /
                            (size_t)(CORR_FLIPS - n) + (size_t)(k * 7) % 61;
            if (pos[npos] < c.origlen)
                npos++;
        }
        /* aimed at the structure of page-based files: in each page its
         * header, the slot array after it, and the node data at its end */
        pages = c.origlen / CORR_PAGE;
        for (p = 0; p < pages && p < CORR_PAGE_FLIPS; p++) {
            pos[npos++] = p * CORR_PAGE + (p * 7) % 40;
            pos[npos++] = p * CORR_PAGE + 40 + (p * 11) % 24;
            pos[npos++] = p * CORR_PAGE + CORR_PAGE - 1 - (p * 13) % 64;
        }
        for (i = 0; i < npos; i++) {
            unsigned char mask = masks[i % sizeof(masks)];

            memcpy(copy, c.orig, c.origlen);
            copy[pos[i]] = (char)(copy[pos[i]] ^ mask);
            snprintf(what, sizeof(what), "byte %zu of %zu xor 0x%02x (0x%02x -> 0x%02x)",
                     pos[i], c.origlen, mask, (unsigned char)c.orig[pos[i]],
                     (unsigned char)copy[pos[i]]);
            corr_case(&c, what, copy, c.origlen, c.promise->value_checksums,
                      c.promise->value_checksums);
        }
        free(copy);
        free(pos);
        corr_summary(&c, "flip", th_now() - t0);
    }
    corr_teardown(&c);
    if (c.failures)
        fail_msg("%s (%d failures in all)", c.failure, c.failures);
}

/* A file of random bytes: the detector must not claim it for a binary
 * format, and opening it with this backend must fail cleanly (or, for the
 * format the detector did name, at least not crash or hang). */
static void test_random(void **state)
{
    const char *backend = *state;
    const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backend);
    struct corr_ctx c;
    char what[64];
    char *data, *dir, *fname;
    const char *format = NULL;
    size_t len = 16384;
    int r, dr, seed;

    memset(&c, 0, sizeof(c));
    c.backend = backend;
    c.top = th_mkdtemp("corrupt");
    c.res = mmap(NULL, sizeof(*c.res), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(c.res != MAP_FAILED);
    data = malloc(len);
    assert_non_null(data);
    assert_non_null(e);
    for (seed = 1; seed <= 3; seed++) {
        snprintf(what, sizeof(what), "random%d", seed);
        dir = th_path(c.top, what);
        fname = th_path(dir, CORR_DBNAME);
        mkdir(dir, 0700);
        th_fill(data, len, (unsigned)seed * 1000003u);
        if (seed == 3)
            memset(data, 0, 4096);      /* a zeroed first page */
        corr_write_file(fname, data, len);
        dr = cyrusdb_detect(fname, &format);
        if (dr == CYRUSDB_OK && strcmp(format, "flat") != 0)
            corr_fail(&c, "%s: cyrusdb_detect() calls random bytes a %s file", what, format);
        r = corr_run_child(corr_probe, backend, fname, CORR_RECORDS, c.res,
                           CORR_CHILD_ALARM + 5);
        c.cases++;
        if (!WIFEXITED(r) || WEXITSTATUS(r) != 0) {
            char sbuf[64];
            corr_fail(&c, "%s: the child died: %s, after stage %d", what,
                      th_status_text(r, sbuf, sizeof(sbuf)), c.res->stage);
        } else if (c.res->open_r == CYRUSDB_OK && strcmp(e->format, "flat") != 0) {
            corr_fail(&c, "%s: a file of random bytes opened as %s", what, backend);
        } else if (c.res->open_r == CYRUSDB_OK &&
                   (c.res->fetch_ok || c.res->fetch_wrong || c.res->ghost_ok)) {
            corr_fail(&c, "%s: a file of random bytes returned known keys", what);
        } else if (!corr_code_ok(c.res->open_r) || c.res->bad_code) {
            corr_fail(&c, "%s: a call returned a value that is no cyrusdb code", what);
        }
        printf("random backend=<%s> file=%s detect=<%s> open=<%s>\n", backend, what,
               dr == CYRUSDB_OK ? format : cyrusdb_strerror(dr),
               cyrusdb_strerror(c.res->open_r));
        th_rmrf(dir);
        free(dir);
        free(fname);
    }
    free(data);
    corr_teardown(&c);
    if (c.failures)
        fail_msg("%s (%d failures in all)", c.failure, c.failures);
}

/* This backend's magic (the shortest head of a real file that the
 * detector still recognises) followed by garbage: detected as this
 * format, refused by every other format, and opened by this backend
 * without a crash or hang (an error, or an empty/odd but ordered walk). */
static void test_magic(void **state)
{
    static const size_t prefixes[] = { 4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 96, 128,
                                       256, 512, 1024, 4096 };
    const char *backend = *state;
    const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backend), *o;
    const char *format = NULL;
    struct corr_ctx c;
    char *dir, *fname, *data;
    size_t len, plen = 0, i;
    int r, status;
    char sbuf[64];

    assert_non_null(e);
    if (corr_setup(&c, backend, 10) == 0) {
        len = c.origlen < 16384 ? 16384 : c.origlen;
        data = malloc(len);
        assert_non_null(data);
        dir = th_path(c.top, "magic");
        fname = th_path(dir, CORR_DBNAME);
        mkdir(dir, 0700);
        for (i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
            plen = prefixes[i] < c.origlen ? prefixes[i] : c.origlen;
            memcpy(data, c.orig, plen);
            th_fill(data + plen, len - plen, 4242);
            corr_write_file(fname, data, len);
            r = cyrusdb_detect(fname, &format);
            if (r == CYRUSDB_OK && !strcmp(format, e->format))
                break;
            plen = 0;
        }
        if (plen == 0) {
            /* flat has no magic: its head followed by binary garbage is
             * not recognised, and that is right */
            if (strcmp(e->format, "flat") != 0)
                corr_fail(&c, "no head of a real %s file up to 4096 bytes, followed by "
                          "garbage, is detected as %s", backend, e->format);
            printf("magic backend=<%s> no magic (the head plus garbage is not detected "
                   "as %s)\n", backend, e->format);
        } else {
            printf("magic backend=<%s> magic_len<=%zu file_bytes=%zu\n", backend, plen, len);
            /* every other format must refuse it */
            for (o = cyrusdb_registry; o->name; o++) {
                /* a backend that keeps no file (etcd) never reads it */
                if (!strcmp(o->format, e->format) || o->nofile)
                    continue;
                status = corr_run_child(corr_probe, o->name, fname, 10, c.res,
                                        CORR_CHILD_ALARM + 5);
                c.cases++;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    corr_fail(&c, "%s magic + garbage opened as %s: the child died: %s",
                              backend, o->name, th_status_text(status, sbuf, sizeof(sbuf)));
                else if (c.res->open_r != CYRUSDB_BADFORMAT)
                    corr_fail(&c, "%s magic + garbage opened as %s: %s, expected BADFORMAT",
                              backend, o->name, cyrusdb_strerror(c.res->open_r));
            }
            /* its own backend: no crash, no hang, no impossible result */
            status = corr_run_child(corr_probe, backend, fname, 10, c.res,
                                    CORR_CHILD_ALARM + 5);
            corr_judge(&c, "magic + garbage", status, 0, 0);
            printf("magic backend=<%s> own_open=<%s> consistent=<%s>\n", backend,
                   cyrusdb_strerror(c.res->open_r),
                   c.res->open_r == CYRUSDB_OK ? cyrusdb_strerror(c.res->consistent_r) : "-");
            if (c.res->open_r == CYRUSDB_OK && c.res->consistent_r == CYRUSDB_OK &&
                c.res->fetch_ok + c.res->fetch_wrong > 0)
                corr_fail(&c, "magic + garbage: %d known records read back and "
                          "consistent() says OK", c.res->fetch_ok + c.res->fetch_wrong);
        }
        free(data);
        free(dir);
        free(fname);
    }
    corr_teardown(&c);
    if (c.failures)
        fail_msg("%s (%d failures in all)", c.failure, c.failures);
}

int main(void)
{
    static const struct th_case cases[] = {
        { "truncate", test_truncate },
        { "flip", test_flip },
        { "random", test_random },
        { "magic", test_magic },
    };

    log_init("test_corrupt", LOG_TO_STDERR);
    return th_run_per_backend("corrupt", cases, sizeof(cases) / sizeof(cases[0]));
}
