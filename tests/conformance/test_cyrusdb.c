/*
 * test_cyrusdb.c - the cyrusdb conformance suite.
 *
 * Every case runs once per backend of the registry (th_backends();
 * $TEST_BACKENDS narrows the list); each (case, backend) pair is one cmocka
 * test named "case/backend".  The cases only use the public API of
 * cyrusdb.h, so a backend that passes them behaves like every other one.
 *
 * Conventions of the suite:
 *   - output parameters are poisoned before every fetch (pointer set to a
 *     sentinel, length to 0xdeadbeef): success must set both, NOTFOUND must
 *     not report data;
 *   - foreach callbacks never assert (an assertion would longjmp across the
 *     backend's frames); they record what they saw and the case checks it
 *     afterwards;
 *   - the teardown of every case closes the handles, reopens every database
 *     file the case wrote and runs cyrusdb_consistent() on it;
 *   - "another reader" checks run in a fork()ed child with its own handle
 *     (fcntl locks are per process, so a second handle in this process would
 *     prove nothing); the child reports over a pipe and never touches cmocka;
 *   - key order is checked against the suite's own comparator (test_cmp),
 *     written from the documented rule rather than taken from cyrusdb.c.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "tests/testhelp.h"

/* ---- small helpers ---------------------------------------------------- */

#define POISON_LEN ((size_t)0xdeadbeef)
static const char test_poison_byte = 'P';
#define POISON_PTR (&test_poison_byte)

/* A (key, value) pair given by pointer and length; value NULL = absent. */
struct rec {
    const char *k;
    size_t kl;
    const char *v;
    size_t vl;
};

/* A byte-string literal with its length (NUL bytes included). */
#define S(lit) (lit), (sizeof(lit) - 1)
#define REC(key, val) { (key), sizeof(key) - 1, (val), sizeof(val) - 1 }

#define TEST_MAXFILES 48
#define TEST_MAXHANDLES 16
#define TEST_MAXPIDS 8

struct case_def;

/* Per-test state: one (case, backend) pair. */
struct tcase {
    const struct case_def *def;
    const char *backend;
    const struct cyrusdb_registry_entry *entry;
    char *dir;
    struct {
        char *path;
        const char *backend;
        int flags;
        int written;      /* opened successfully: check it in teardown */
    } files[TEST_MAXFILES];
    int nfiles;
    struct cyrusdb *handles[TEST_MAXHANDLES];
    pid_t pids[TEST_MAXPIDS];
};

struct case_def {
    const char *name;
    void (*fn)(struct tcase *tc);
    int once;             /* backend independent: run once, not per backend */
    int where;            /* CASE_ALL, CASE_FILES: about the file itself
                           * (skipped for backends that keep none, etcd),
                           * CASE_REMOTE: only for those */
};
enum { CASE_ALL = 0, CASE_FILES = 1, CASE_REMOTE = 2 };

struct param {
    const struct case_def *def;
    const char *backend;
    const char *name;
};

static void test_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

static void test_fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
    print_error("\n");
    _fail(file, line);
    abort();   /* not reached: _fail longjmps */
}

#define FAILF(...) test_fail_at(__FILE__, __LINE__, __VA_ARGS__)

/* A printable, bounded rendering of a byte string (for messages). */
static const char *test_show(const char *s, size_t len)
{
    static char bufs[4][200];
    static int which;
    char *out = bufs[which++ & 3];
    size_t i, o = 0;

    if (!s)
        return "(null)";
    for (i = 0; i < len && o < sizeof(bufs[0]) - 8; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, 8, "\\x%02x", c);
    }
    if (i < len)
        o += (size_t)snprintf(out + o, 8, "...");
    out[o] = '\0';
    return out;
}

/* Check a return code at the caller's line. */
static void rc_expect_at(const char *file, int line, const char *what,
                         int got, int want)
{
    if (got != want)
        test_fail_at(file, line, "%s returned %d (%s), expected %d (%s)",
                     what, got, cyrusdb_strerror(got), want,
                     cyrusdb_strerror(want));
}

#define RC(expr, want) rc_expect_at(__FILE__, __LINE__, #expr, (expr), (want))

static int test_sortflags;

static int test_rec_qsort_cmp(const void *pa, const void *pb)
{
    const struct rec *a = pa, *b = pb;
    return th_ref_compare(test_sortflags, a->k, a->kl, b->k, b->kl);
}

static void test_sort_recs(struct rec *recs, size_t n, int flags)
{
    test_sortflags = flags;
    qsort(recs, n, sizeof(*recs), test_rec_qsort_cmp);
}

static uint64_t test_hash(uint64_t h, const void *p, size_t len)
{
    const unsigned char *s = p;
    size_t i;

    for (i = 0; i < len; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h;
}

#define HASH_INIT 14695981039346656037ull

/* Deterministic shuffling for the many-keys case. */
static uint32_t test_rand(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    return x;
}

static void *test_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        abort();
    return p;
}

static char *test_memdup(const char *s, size_t len)
{
    char *p = test_xmalloc(len + 1);
    if (len)
        memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

/* ---- handles and files owned by a test --------------------------------- */

/* The path of file `name` in the test's directory, registered so that the
 * teardown checks it with `backend` and `flags` once it was opened. */
static const char *tc_file(struct tcase *tc, const char *name,
                           const char *backend, int flags)
{
    int i;
    char *path = th_path(tc->dir, name);

    for (i = 0; i < tc->nfiles; i++) {
        if (!strcmp(tc->files[i].path, path)) {
            free(path);
            return tc->files[i].path;
        }
    }
    if (tc->nfiles >= TEST_MAXFILES)
        FAILF("too many files in one test");
    tc->files[tc->nfiles].path = path;
    tc->files[tc->nfiles].backend = backend;
    tc->files[tc->nfiles].flags = flags & ~(CYRUSDB_CREATE | CYRUSDB_RDONLY);
    tc->files[tc->nfiles].written = 0;
    tc->nfiles++;
    return path;
}

static void tc_mark_written(struct tcase *tc, const char *path)
{
    int i;

    for (i = 0; i < tc->nfiles; i++)
        if (!strcmp(tc->files[i].path, path))
            tc->files[i].written = 1;
}

static struct cyrusdb *tc_open_as_at(const char *file, int line,
                                     struct tcase *tc, const char *backend,
                                     const char *path, int flags)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    int r, i;

    r = cyrusdb_open(backend, path, flags, &db, &err);
    if (r != CYRUSDB_OK)
        test_fail_at(file, line, "cyrusdb_open(%s, %s, 0x%x) returned %d (%s): %s",
                     backend, path, flags, r, cyrusdb_strerror(r),
                     err ? err : "(no error string)");
    if (!db)
        test_fail_at(file, line, "cyrusdb_open returned OK without a handle");
    if (!(flags & CYRUSDB_RDONLY))
        tc_mark_written(tc, path);
    for (i = 0; i < TEST_MAXHANDLES; i++) {
        if (!tc->handles[i]) {
            tc->handles[i] = db;
            return db;
        }
    }
    cyrusdb_close(&db);
    test_fail_at(file, line, "too many handles in one test");
}

#define tc_open_as(tc, be, path, flags) \
    tc_open_as_at(__FILE__, __LINE__, (tc), (be), (path), (flags))
#define tc_open(tc, path, flags) \
    tc_open_as_at(__FILE__, __LINE__, (tc), (tc)->backend, (path), (flags))

static void tc_close_at(const char *file, int line, struct tcase *tc,
                        struct cyrusdb **dbp)
{
    int i, r;

    for (i = 0; i < TEST_MAXHANDLES; i++)
        if (tc->handles[i] == *dbp)
            tc->handles[i] = NULL;
    r = cyrusdb_close(dbp);
    if (r != CYRUSDB_OK)
        test_fail_at(file, line, "cyrusdb_close returned %d (%s)", r,
                     cyrusdb_strerror(r));
    if (*dbp)
        test_fail_at(file, line, "cyrusdb_close did not clear the handle");
}

#define tc_close(tc, dbp) tc_close_at(__FILE__, __LINE__, (tc), (dbp))

static void consistent_at(const char *file, int line, struct cyrusdb *db,
                          const char *backend)
{
    int r = cyrusdb_consistent(db);

    if (r != CYRUSDB_OK)
        test_fail_at(file, line, "cyrusdb_consistent (%s) returned %d (%s)",
                     backend, r, cyrusdb_strerror(r));
}

#define CONSISTENT(tc, db) consistent_at(__FILE__, __LINE__, (db), (tc)->backend)

/* ---- fetch and walk checks --------------------------------------------- */

/* Fetch `key` and expect `val` (NULL: expect CYRUSDB_NOTFOUND). */
static void fetch_expect_at(const char *file, int line, struct cyrusdb *db,
                            const char *key, size_t keylen,
                            const char *val, size_t vallen,
                            struct cyrusdb_txn **tid, int lock)
{
    const char *data = POISON_PTR;
    size_t len = POISON_LEN;
    const char *fn = lock ? "fetchlock" : "fetch";
    int r;

    if (lock)
        r = cyrusdb_fetchlock(db, key, keylen, &data, &len, tid);
    else
        r = cyrusdb_fetch(db, key, keylen, &data, &len, tid);
    if (!val) {
        if (r != CYRUSDB_NOTFOUND)
            test_fail_at(file, line, "%s <%s>: returned %d (%s), expected NOTFOUND"
                         " (value %s)", fn, test_show(key, keylen), r,
                         cyrusdb_strerror(r),
                         r == CYRUSDB_OK ? test_show(data, len) : "-");
        if (data != POISON_PTR && data != NULL)
            test_fail_at(file, line, "%s <%s>: NOTFOUND but *data_r was set",
                         fn, test_show(key, keylen));
        if (len != POISON_LEN && len != 0)
            test_fail_at(file, line, "%s <%s>: NOTFOUND but *datalen_r=%zu",
                         fn, test_show(key, keylen), len);
        return;
    }
    if (r != CYRUSDB_OK)
        test_fail_at(file, line, "%s <%s>: returned %d (%s), expected OK",
                     fn, test_show(key, keylen), r, cyrusdb_strerror(r));
    if (data == POISON_PTR || len == POISON_LEN)
        test_fail_at(file, line, "%s <%s>: OK but the output was not set",
                     fn, test_show(key, keylen));
    if (len != vallen)
        test_fail_at(file, line, "%s <%s>: length %zu, expected %zu (got <%s>)",
                     fn, test_show(key, keylen), len, vallen,
                     data ? test_show(data, len) : "(null)");
    if (len && !data)
        test_fail_at(file, line, "%s <%s>: NULL data with length %zu",
                     fn, test_show(key, keylen), len);
    if (len && memcmp(data, val, len) != 0)
        test_fail_at(file, line, "%s <%s>: value <%s>, expected <%s>",
                     fn, test_show(key, keylen), test_show(data, len),
                     test_show(val, vallen));
}

static void fetch_none_at(const char *file, int line, struct cyrusdb *db,
                          const char *key, size_t keylen,
                          struct cyrusdb_txn **tid)
{
    fetch_expect_at(file, line, db, key, keylen, NULL, 0, tid, 0);
}

/* FETCH(db, key, keylen, val, vallen, tid); FETCH_NONE(db, key, keylen, tid)
 * (variadic so that S("...") can stand for a pointer and a length) */
#define FETCH(...) fetch_expect_at(__FILE__, __LINE__, __VA_ARGS__, 0)
#define FETCH_NONE(...) fetch_none_at(__FILE__, __LINE__, __VA_ARGS__)

/* What a foreach saw. */
struct walk {
    struct rec *recs;
    size_t n, alloc;
    size_t nfilter;           /* filter calls */
    size_t stop_at;           /* return stop_value at this callback (1-based; 0: never) */
    int stop_value;
    int filter_mod;           /* filter passes records whose key ends in a byte % filter_mod == 0 */
    struct rec *frecs;        /* keys the filter saw */
    size_t fn, falloc;
    const char *bad;          /* first problem seen by a callback */
};

static void walk_push(struct rec **recs, size_t *n, size_t *alloc,
                      const char *key, size_t keylen,
                      const char *data, size_t datalen)
{
    if (*n == *alloc) {
        *alloc = *alloc ? *alloc * 2 : 64;
        *recs = realloc(*recs, *alloc * sizeof(**recs));
        if (!*recs)
            abort();
    }
    (*recs)[*n].k = test_memdup(key, keylen);
    (*recs)[*n].kl = keylen;
    (*recs)[*n].v = test_memdup(data, datalen);
    (*recs)[*n].vl = datalen;
    (*n)++;
}

static const char *walk_check_args(const char *key, size_t keylen,
                                   const char *data, size_t datalen)
{
    if (!key)
        return "callback got a NULL key";
    if (keylen == 0)
        return "callback got an empty key";
    if (datalen == POISON_LEN || datalen > ((size_t)1 << 30))
        return "callback got an absurd data length";
    if (datalen && !data)
        return "callback got NULL data with a non-zero length";
    return NULL;
}

static int walk_filter(void *rock, const char *key, size_t keylen,
                       const char *data, size_t datalen)
{
    struct walk *w = rock;
    const char *bad = walk_check_args(key, keylen, data, datalen);

    if (bad) {
        if (!w->bad)
            w->bad = bad;
        return 0;
    }
    walk_push(&w->frecs, &w->fn, &w->falloc, key, keylen, data, datalen);
    w->nfilter++;
    return ((unsigned char)key[keylen - 1] % w->filter_mod) == 0;
}

static int walk_cb(void *rock, const char *key, size_t keylen,
                   const char *data, size_t datalen)
{
    struct walk *w = rock;
    const char *bad = walk_check_args(key, keylen, data, datalen);

    if (bad) {
        if (!w->bad)
            w->bad = bad;
        return 0;
    }
    walk_push(&w->recs, &w->n, &w->alloc, key, keylen, data, datalen);
    if (w->stop_at && w->n == w->stop_at)
        return w->stop_value;
    return 0;
}

static void walk_free(struct walk *w)
{
    size_t i;

    for (i = 0; i < w->n; i++) {
        free((char *)w->recs[i].k);
        free((char *)w->recs[i].v);
    }
    for (i = 0; i < w->fn; i++) {
        free((char *)w->frecs[i].k);
        free((char *)w->frecs[i].v);
    }
    free(w->recs);
    free(w->frecs);
    memset(w, 0, sizeof(*w));
}

/* Compare what a walk returned with the expected records, in order. */
static void recs_expect_at(const char *file, int line, const char *what,
                           const struct rec *got, size_t ngot,
                           const struct rec *want, size_t nwant)
{
    size_t i;

    for (i = 0; i < ngot && i < nwant; i++) {
        if (got[i].kl != want[i].kl || memcmp(got[i].k, want[i].k, got[i].kl))
            test_fail_at(file, line, "%s: record %zu has key <%s>, expected <%s>",
                         what, i, test_show(got[i].k, got[i].kl),
                         test_show(want[i].k, want[i].kl));
        if (got[i].vl != want[i].vl ||
            (got[i].vl && memcmp(got[i].v, want[i].v, got[i].vl)))
            test_fail_at(file, line, "%s: key <%s> has value <%s> (%zu bytes), "
                         "expected <%s> (%zu bytes)", what,
                         test_show(got[i].k, got[i].kl),
                         test_show(got[i].v, got[i].vl), got[i].vl,
                         test_show(want[i].v, want[i].vl), want[i].vl);
    }
    if (ngot != nwant)
        test_fail_at(file, line, "%s: %zu records, expected %zu (first extra/missing: <%s>)",
                     what, ngot, nwant,
                     ngot > nwant ? test_show(got[nwant].k, got[nwant].kl)
                                  : test_show(want[ngot].k, want[ngot].kl));
}

/* Walk `prefix` and expect exactly `want` (already in key order). */
static void walk_expect_at(const char *file, int line, struct cyrusdb *db,
                           const char *prefix, size_t prefixlen,
                           const struct rec *want, size_t nwant,
                           struct cyrusdb_txn **tid)
{
    struct walk w;
    char what[300];
    int r;

    memset(&w, 0, sizeof(w));
    r = cyrusdb_foreach(db, prefix, prefixlen, NULL, walk_cb, &w, tid);
    snprintf(what, sizeof(what), "foreach prefix <%s>",
             test_show(prefix, prefixlen));
    if (r != CYRUSDB_OK) {
        walk_free(&w);
        test_fail_at(file, line, "%s returned %d (%s)", what, r,
                     cyrusdb_strerror(r));
    }
    if (w.bad) {
        const char *bad = w.bad;
        walk_free(&w);
        test_fail_at(file, line, "%s: %s", what, bad);
    }
    recs_expect_at(file, line, what, w.recs, w.n, want, nwant);
    walk_free(&w);
}

/* WALK(db, prefix, prefixlen, want, nwant, tid) */
#define WALK(...) walk_expect_at(__FILE__, __LINE__, __VA_ARGS__)

/* Store every record with tid (NULL: one transaction each). */
static void store_all_at(const char *file, int line, struct cyrusdb *db,
                         const struct rec *recs, size_t n,
                         struct cyrusdb_txn **tid)
{
    size_t i;

    for (i = 0; i < n; i++) {
        int r = cyrusdb_store(db, recs[i].k, recs[i].kl, recs[i].v, recs[i].vl, tid);
        if (r != CYRUSDB_OK)
            test_fail_at(file, line, "store <%s> returned %d (%s)",
                         test_show(recs[i].k, recs[i].kl), r, cyrusdb_strerror(r));
    }
}

#define STORE_ALL(db, recs, n, tid) \
    store_all_at(__FILE__, __LINE__, (db), (recs), (n), (tid))

/* Fetch every record; also the key with a byte appended ('.', NUL, 'z')
 * and the key minus its last byte, which must be absent unless they are
 * records themselves. */
static void fetch_all_at(const char *file, int line, struct cyrusdb *db,
                         const struct rec *recs, size_t n,
                         struct cyrusdb_txn **tid)
{
    static const char extra[3] = { '.', '\0', 'z' };
    char k[520];
    size_t i, j, x;

    for (i = 0; i < n; i++) {
        fetch_expect_at(file, line, db, recs[i].k, recs[i].kl, recs[i].v,
                        recs[i].vl, tid, 0);
        for (x = 0; x < 4 && recs[i].kl < 511; x++) {
            size_t kl = recs[i].kl;
            const struct rec *hit = NULL;
            memcpy(k, recs[i].k, kl);
            if (x < 3)
                k[kl++] = extra[x];
            else if (--kl == 0)
                continue;
            for (j = 0; j < n; j++)
                if (recs[j].kl == kl && !memcmp(recs[j].k, k, kl))
                    hit = &recs[j];
            fetch_expect_at(file, line, db, k, kl, hit ? hit->v : NULL,
                            hit ? hit->vl : 0, tid, 0);
        }
    }
}

#define FETCH_ALL(db, recs, n, tid) \
    fetch_all_at(__FILE__, __LINE__, (db), (recs), (n), (tid))

/* ---- a reader in another process ---------------------------------------- */

/*
 * The child opens its own handle on `path`, fetches each of `keys` and walks
 * the whole database (tid NULL), and writes one line per key and one for the
 * walk to a pipe.  The parent builds the expected text from its model with
 * the same functions and compares.  A child blocked by the parent's write
 * lock simply has not answered yet.
 */
struct probe {
    pid_t pid;
    int fd;
    struct buf out;
    int done;
};

static void probe_line(struct buf *b, int r, const char *data, size_t len)
{
    if (r != CYRUSDB_OK)
        buf_printf(b, "fetch %d\n", r);
    else
        buf_printf(b, "fetch ok %zu %016llx\n", len,
                   (unsigned long long)test_hash(HASH_INIT, data, len));
}

struct probe_walk {
    size_t n;
    uint64_t h;
};

static int probe_walk_cb(void *rock, const char *key, size_t keylen,
                         const char *data, size_t datalen)
{
    struct probe_walk *pw = rock;
    uint64_t lens[2];

    lens[0] = keylen;
    lens[1] = datalen;
    pw->h = test_hash(pw->h, lens, sizeof(lens));
    pw->h = test_hash(pw->h, key, keylen);
    pw->h = test_hash(pw->h, data, datalen);
    pw->n++;
    return 0;
}

static void probe_walk_line(struct buf *b, int r, const struct probe_walk *pw)
{
    if (r != CYRUSDB_OK)
        buf_printf(b, "walk %d\n", r);
    else
        buf_printf(b, "walk ok %zu %016llx\n", pw->n, (unsigned long long)pw->h);
}

/* Expected probe output for a model: `model` sorted, `keys` probed. */
static void probe_expect(struct buf *b, const struct rec *model, size_t nmodel,
                         const struct rec *keys, size_t nkeys)
{
    struct probe_walk pw = { 0, HASH_INIT };
    size_t i, j;

    buf_reset(b);
    for (i = 0; i < nkeys; i++) {
        for (j = 0; j < nmodel; j++)
            if (model[j].kl == keys[i].kl && !memcmp(model[j].k, keys[i].k, keys[i].kl))
                break;
        if (j < nmodel)
            probe_line(b, CYRUSDB_OK, model[j].v, model[j].vl);
        else
            probe_line(b, CYRUSDB_NOTFOUND, NULL, 0);
    }
    for (j = 0; j < nmodel; j++)
        probe_walk_cb(&pw, model[j].k, model[j].kl, model[j].v, model[j].vl);
    probe_walk_line(b, CYRUSDB_OK, &pw);
}

static void probe_child(int fd, const char *backend, const char *path,
                        int flags, const struct rec *keys, size_t nkeys)
{
    static const int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS };
    struct buf b = BUF_INITIALIZER;
    struct cyrusdb *db = NULL;
    struct probe_walk pw = { 0, HASH_INIT };
    const char *err = NULL;
    size_t i;
    int r;

    /* cmocka's handlers would resume the test run in this process */
    for (i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        signal(sigs[i], SIG_DFL);
    alarm(60);
    r = cyrusdb_open(backend, path, flags & ~CYRUSDB_CREATE, &db, &err);
    if (r != CYRUSDB_OK) {
        buf_printf(&b, "open %d %s\n", r, err ? err : "");
    } else {
        for (i = 0; i < nkeys; i++) {
            const char *data = NULL;
            size_t len = 0;
            r = cyrusdb_fetch(db, keys[i].k, keys[i].kl, &data, &len, NULL);
            probe_line(&b, r, data, len);
        }
        r = cyrusdb_foreach(db, NULL, 0, NULL, probe_walk_cb, &pw, NULL);
        probe_walk_line(&b, r, &pw);
        r = cyrusdb_close(&db);
        if (r != CYRUSDB_OK)
            buf_printf(&b, "close %d\n", r);
    }
    if (b.len && write(fd, b.s, b.len) != (ssize_t)b.len)
        _exit(3);
    _exit(0);
}

static void probe_start_at(const char *file, int line, struct tcase *tc,
                           struct probe *p, const char *path, int flags,
                           const struct rec *keys, size_t nkeys)
{
    int fds[2], i;

    memset(p, 0, sizeof(*p));
    if (pipe(fds) < 0)
        test_fail_at(file, line, "pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    p->pid = fork();
    if (p->pid < 0)
        test_fail_at(file, line, "fork: %s", strerror(errno));
    if (p->pid == 0) {
        close(fds[0]);
        probe_child(fds[1], tc->backend, path, flags, keys, nkeys);
    }
    close(fds[1]);
    p->fd = fds[0];
    for (i = 0; i < TEST_MAXPIDS; i++) {
        if (!tc->pids[i]) {
            tc->pids[i] = p->pid;
            break;
        }
    }
}

#define PROBE_START(tc, p, path, flags, keys, n) \
    probe_start_at(__FILE__, __LINE__, (tc), (p), (path), (flags), (keys), (n))

static long test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Collect the child's answer for up to timeout_ms; 1 when it finished. */
static int probe_wait_at(const char *file, int line, struct tcase *tc,
                         struct probe *p, int timeout_ms)
{
    long end = test_now_ms() + timeout_ms;
    char chunk[4096];
    int status, i;

    while (!p->done) {
        struct pollfd pfd = { .fd = p->fd, .events = POLLIN, .revents = 0 };
        long left = end - test_now_ms();
        ssize_t n;
        int pr;

        if (left <= 0)
            return 0;
        pr = poll(&pfd, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            test_fail_at(file, line, "poll: %s", strerror(errno));
        if (pr == 0)
            return 0;
        n = read(p->fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            test_fail_at(file, line, "read: %s", strerror(errno));
        if (n == 0) {
            p->done = 1;
            break;
        }
        buf_append(&p->out, chunk, (size_t)n);
    }
    close(p->fd);
    p->fd = -1;
    while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR)
        ;
    for (i = 0; i < TEST_MAXPIDS; i++)
        if (tc->pids[i] == p->pid)
            tc->pids[i] = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        test_fail_at(file, line, "reader process failed (status 0x%x), said: %s",
                     status, buf_cstring(&p->out));
    return 1;
}

#define PROBE_WAIT(tc, p, ms) probe_wait_at(__FILE__, __LINE__, (tc), (p), (ms))

/* Check a finished probe against the model and free it. */
static void probe_check_at(const char *file, int line, struct probe *p,
                           const char *what, const struct rec *model,
                           size_t nmodel, const struct rec *keys, size_t nkeys)
{
    struct buf want = BUF_INITIALIZER;

    probe_expect(&want, model, nmodel, keys, nkeys);
    if (strcmp(buf_cstring(&want), buf_cstring(&p->out)) != 0) {
        print_error("%s: another process saw:\n%sexpected:\n%s", what,
                    buf_cstring(&p->out), buf_cstring(&want));
        buf_free(&want);
        buf_free(&p->out);
        _fail(file, line);
    }
    buf_free(&want);
    buf_free(&p->out);
}

#define PROBE_CHECK(p, what, model, nm, keys, nk) \
    probe_check_at(__FILE__, __LINE__, (p), (what), (model), (nm), (keys), (nk))

/* Run a reader in another process to completion and check it. */
static void reader_expect_at(const char *file, int line, struct tcase *tc,
                             const char *path, int flags, const char *what,
                             const struct rec *model, size_t nmodel,
                             const struct rec *keys, size_t nkeys)
{
    struct probe p;

    probe_start_at(file, line, tc, &p, path, flags, keys, nkeys);
    if (!probe_wait_at(file, line, tc, &p, 30000))
        test_fail_at(file, line, "%s: the reader process did not answer in 30 s "
                     "although no transaction is open", what);
    probe_check_at(file, line, &p, what, model, nmodel, keys, nkeys);
}

#define READER_EXPECT(tc, path, flags, what, model, nm, keys, nk) \
    reader_expect_at(__FILE__, __LINE__, (tc), (path), (flags), (what), \
                     (model), (nm), (keys), (nk))

/* A writer in another process: runs `ops` on its own handle, each in its
 * own transaction (tid NULL): 's' store, 'd' delete, 'k' checkpoint. */
struct op {
    char kind;
    struct rec r;
};

static void writer_run_at(const char *file, int line, struct tcase *tc,
                          const char *path, int flags,
                          const struct op *ops, size_t nops)
{
    static const int sigs[] = { SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGSYS };
    struct probe p;
    int fds[2], i;

    memset(&p, 0, sizeof(p));
    if (pipe(fds) < 0)
        test_fail_at(file, line, "pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    p.pid = fork();
    if (p.pid < 0)
        test_fail_at(file, line, "fork: %s", strerror(errno));
    if (p.pid == 0) {
        struct buf b = BUF_INITIALIZER;
        struct cyrusdb *db = NULL;
        const char *err = NULL;
        size_t j;
        int r;

        close(fds[0]);
        for (j = 0; j < sizeof(sigs) / sizeof(sigs[0]); j++)
            signal(sigs[j], SIG_DFL);
        alarm(60);
        r = cyrusdb_open(tc->backend, path, flags & ~CYRUSDB_CREATE, &db, &err);
        if (r != CYRUSDB_OK) {
            buf_printf(&b, "writer: open: %d %s", r, err ? err : "");
        } else {
            for (j = 0; j < nops && !b.len; j++) {
                const struct op *o = &ops[j];
                if (o->kind == 's')
                    r = cyrusdb_store(db, o->r.k, o->r.kl, o->r.v, o->r.vl, NULL);
                else if (o->kind == 'd')
                    r = cyrusdb_delete(db, o->r.k, o->r.kl, NULL, 0);
                else
                    r = cyrusdb_checkpoint(db);
                if (r != CYRUSDB_OK)
                    buf_printf(&b, "writer: op %zu (%c <%s>): %d (%s)", j, o->kind,
                               o->kind == 'k' ? "" : test_show(o->r.k, o->r.kl),
                               r, cyrusdb_strerror(r));
            }
            r = cyrusdb_close(&db);
            if (r != CYRUSDB_OK && !b.len)
                buf_printf(&b, "writer: close: %d (%s)", r, cyrusdb_strerror(r));
        }
        if (b.len && write(fds[1], b.s, b.len) != (ssize_t)b.len)
            _exit(3);
        _exit(b.len ? 1 : 0);
    }
    close(fds[1]);
    p.fd = fds[0];
    for (i = 0; i < TEST_MAXPIDS; i++) {
        if (!tc->pids[i]) {
            tc->pids[i] = p.pid;
            break;
        }
    }
    if (!probe_wait_at(file, line, tc, &p, 30000))
        test_fail_at(file, line, "the writer process did not finish in 30 s");
    buf_free(&p.out);
}

#define WRITER_RUN(tc, path, flags, ops, n) \
    writer_run_at(__FILE__, __LINE__, (tc), (path), (flags), (ops), (n))

/* ---- the cases ---------------------------------------------------------- */

static void case_crud(struct tcase *tc)
{
    const char *path = tc_file(tc, "crud.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    static const struct rec after[] = {
        REC("alpha", "1"), REC("beta", "second value"), REC("gamma", "3"),
    };

    FETCH_NONE(db, S("key"), NULL);
    WALK(db, NULL, 0, NULL, 0, NULL);
    RC(cyrusdb_create(db, S("key"), S("value one"), NULL), CYRUSDB_OK);
    FETCH(db, S("key"), S("value one"), NULL);
    RC(cyrusdb_store(db, S("key"), S("the second, longer value"), NULL), CYRUSDB_OK);
    FETCH(db, S("key"), S("the second, longer value"), NULL);
    RC(cyrusdb_store(db, S("key"), S("3"), NULL), CYRUSDB_OK);
    FETCH(db, S("key"), S("3"), NULL);
    RC(cyrusdb_delete(db, S("key"), NULL, 0), CYRUSDB_OK);
    FETCH_NONE(db, S("key"), NULL);
    WALK(db, NULL, 0, NULL, 0, NULL);

    RC(cyrusdb_store(db, S("gamma"), S("3"), NULL), CYRUSDB_OK);
    RC(cyrusdb_create(db, S("alpha"), S("1"), NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("beta"), S("2"), NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("beta"), S("second value"), NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("delta"), S("4"), NULL), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("delta"), NULL, 0), CYRUSDB_OK);
    WALK(db, NULL, 0, after, 3, NULL);
    CONSISTENT(tc, db);
    tc_close(tc, &db);

    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, after, 3, NULL);
    FETCH(db, S("beta"), S("second value"), NULL);
    FETCH_NONE(db, S("delta"), NULL);
    FETCH_NONE(db, S("key"), NULL);
    /* a fetch must not be confused by keys that share a prefix */
    FETCH_NONE(db, S("alph"), NULL);
    FETCH_NONE(db, S("alphaa"), NULL);
    CONSISTENT(tc, db);
}

/* Keys with NUL and other awkward bytes, in both sort orders. */
static void case_binary_keys(struct tcase *tc)
{
    static const struct rec base[] = {
        REC("a", "plain a"),
        REC("a\0", "a-nul"),
        REC("a\0b", "a-nul-b\0with\0nuls"),
        REC("a\0\0", "\0"),
        REC("\0", "\0\0\0"),
        REC("\0\0", "nul nul"),
        REC("b", ""),
        REC("a.", "a dot"),
        REC("a.b", "a dot b"),
        REC("a-b", "a dash b"),
        REC("tab\there", "v\tv"),
        REC("nl\nhere", "v\nv\r\n"),
        REC("back\\slash", "\\\\"),
        REC("\xff\xfe", "\x80\x81"),
        REC("\x7f", "del"),
        REC("\x01\x02\x03", "low"),
    };
    enum { NB = sizeof(base) / sizeof(base[0]) };
    static const int flagset[2] = { 0, CYRUSDB_MBOXSORT };
    /* the orders written out by hand, indices into base */
    static const int plain[NB] = { 4, 5, 15, 0, 1, 3, 2, 9, 7, 8, 6, 12, 11, 10, 14, 13 };
    static const int mbox[NB] = { 4, 5, 15, 0, 7, 8, 1, 3, 2, 9, 6, 12, 11, 10, 14, 13 };
    int f;

    for (f = 0; f < 2; f++) {
        int flags = flagset[f];
        const int *order = f ? mbox : plain;
        char name[32];
        const char *path;
        struct cyrusdb *db;
        struct rec sorted[NB + 256], bytes[256];
        char keys1[256], vals1[256][3];
        struct rec prefixed[3];
        size_t i, n;

        snprintf(name, sizeof(name), "bin%d.db", f);
        path = tc_file(tc, name, tc->backend, flags);
        db = tc_open(tc, path, CYRUSDB_CREATE | flags);

        for (i = 0; i < NB; i++)
            sorted[i] = base[order[i]];
        /* the hand-written order agrees with the documented rule */
        for (i = 1; i < NB; i++)
            assert_true(th_ref_compare(flags, sorted[i - 1].k, sorted[i - 1].kl,
                                 sorted[i].k, sorted[i].kl) < 0);
        /* store in an order unrelated to the sort order */
        for (i = 0; i < NB; i++) {
            size_t j = (i * 7) % NB;
            RC(cyrusdb_store(db, base[j].k, base[j].kl, base[j].v, base[j].vl, NULL),
               CYRUSDB_OK);
        }
        FETCH_ALL(db, base, NB, NULL);
        FETCH_NONE(db, S("a\0b\0"), NULL);
        FETCH_NONE(db, S("\0\0\0"), NULL);
        WALK(db, NULL, 0, sorted, NB, NULL);
        /* prefix "a\0" holds exactly the three NUL-continued keys */
        n = 0;
        for (i = 0; i < NB; i++)
            if (sorted[i].kl >= 2 && !memcmp(sorted[i].k, "a\0", 2))
                prefixed[n++] = sorted[i];
        assert_int_equal(n, 3);
        WALK(db, S("a\0"), prefixed, n, NULL);

        /* every single byte as a key */
        for (i = 0; i < 256; i++) {
            keys1[i] = (char)i;
            vals1[i][0] = (char)i;
            vals1[i][1] = '\0';
            vals1[i][2] = (char)(255 - i);
            bytes[i].k = &keys1[i];
            bytes[i].kl = 1;
            bytes[i].v = vals1[i];
            bytes[i].vl = 3;
        }
        {
            struct cyrusdb_txn *tid = NULL;
            for (i = 0; i < 256; i++) {
                size_t j = (i * 97) % 256;
                RC(cyrusdb_store(db, bytes[j].k, 1, bytes[j].v, 3, &tid), CYRUSDB_OK);
            }
            assert_non_null(tid);
            RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
        }
        /* the full expected set: base keys + single bytes (the single-byte
         * keys "a", "b", "\0" and "\x7f" replace the base values) */
        n = 0;
        for (i = 0; i < NB; i++)
            if (base[i].kl != 1)
                sorted[n++] = base[i];
        for (i = 0; i < 256; i++)
            sorted[n++] = bytes[i];
        test_sort_recs(sorted, n, flags);
        WALK(db, NULL, 0, sorted, n, NULL);
        FETCH_ALL(db, sorted, n, NULL);
        CONSISTENT(tc, db);
        tc_close(tc, &db);

        db = tc_open(tc, path, flags);
        WALK(db, NULL, 0, sorted, n, NULL);
        FETCH_ALL(db, sorted, n, NULL);
        FETCH(db, S("a\0b"), S("a-nul-b\0with\0nuls"), NULL);
        FETCH(db, S("\0"), "\0\0\xff", 3, NULL);
        CONSISTENT(tc, db);
        tc_close(tc, &db);
    }
}

/* Key length limits: 1..511 bytes. */
static void case_key_limits(struct tcase *tc)
{
    const char *path = tc_file(tc, "keys.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    char k511[511], k512[512];
    struct rec want[2];

    th_fill(k511, sizeof(k511), 5);
    k511[0] = 'k';
    k511[100] = '\0';
    memcpy(k512, k511, sizeof(k511));
    k512[511] = 'x';
    RC(cyrusdb_store(db, k511, sizeof(k511), S("max"), NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, k512, sizeof(k512), S("too long"), NULL), CYRUSDB_INTERNAL);
    RC(cyrusdb_store(db, "", 0, S("empty key"), NULL), CYRUSDB_INTERNAL);
    RC(cyrusdb_store(db, S("k"), S("short"), NULL), CYRUSDB_OK);
    FETCH(db, k511, sizeof(k511), S("max"), NULL);
    FETCH_NONE(db, k512, sizeof(k512), NULL);
    FETCH_NONE(db, k511, 510, NULL);
    want[0].k = "k"; want[0].kl = 1; want[0].v = "short"; want[0].vl = 5;
    want[1].k = k511; want[1].kl = sizeof(k511); want[1].v = "max"; want[1].vl = 3;
    WALK(db, NULL, 0, want, 2, NULL);
    WALK(db, k511, sizeof(k511), want + 1, 1, NULL);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    FETCH(db, k511, sizeof(k511), S("max"), NULL);
    WALK(db, NULL, 0, want, 2, NULL);
}

static void case_empty_values(struct tcase *tc)
{
    const char *path = tc_file(tc, "empty.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    static const struct rec want[] = {
        REC("e1", ""), REC("e2", ""), REC("e3", ""), REC("n1", "\0"), REC("x", "x"),
    };

    RC(cyrusdb_store(db, S("e1"), "", 0, NULL), CYRUSDB_OK);
    RC(cyrusdb_create(db, S("e2"), NULL, 0, NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("n1"), S("\0"), NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("x"), S("x"), NULL), CYRUSDB_OK);
    FETCH(db, S("e1"), "", 0, NULL);
    FETCH(db, S("e2"), "", 0, NULL);
    FETCH(db, S("n1"), S("\0"), NULL);
    /* empty -> non-empty -> empty again */
    RC(cyrusdb_store(db, S("e3"), S("not yet empty"), NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("e3"), "", 0, NULL), CYRUSDB_OK);
    FETCH(db, S("e3"), "", 0, NULL);
    /* an empty value still exists: create fails, delete works */
    RC(cyrusdb_create(db, S("e1"), S("other"), NULL), CYRUSDB_EXISTS);
    FETCH(db, S("e1"), "", 0, NULL);
    WALK(db, NULL, 0, want, 5, NULL);
    /* inside a transaction */
    RC(cyrusdb_store(db, S("t1"), "", 0, &tid), CYRUSDB_OK);
    FETCH(db, S("t1"), "", 0, &tid);
    RC(cyrusdb_delete(db, S("t1"), &tid, 0), CYRUSDB_OK);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, want, 5, NULL);
    FETCH(db, S("e2"), "", 0, NULL);
    FETCH_NONE(db, S("t1"), NULL);
}

static void case_big_value(struct tcase *tc)
{
    const size_t mib = (size_t)1 << 20;
    const char *path = tc_file(tc, "big.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    char *big = test_xmalloc(mib + 1);
    char *big2 = test_xmalloc(mib);
    struct rec want[3];
    size_t i;

    th_fill(big, mib + 1, 42);
    /* the second one is full of the bytes text formats must escape */
    for (i = 0; i < mib; i++)
        big2[i] = "\0\n\t\\\r\xff"[i % 6];
    RC(cyrusdb_store(db, S("big"), big, mib, NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("small"), S("s"), NULL), CYRUSDB_OK);
    FETCH(db, S("big"), big, mib, NULL);
    RC(cyrusdb_store(db, S("big2"), big2, mib, &tid), CYRUSDB_OK);
    FETCH(db, S("big2"), big2, mib, &tid);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    FETCH(db, S("big2"), big2, mib, NULL);
    want[0].k = "big"; want[0].kl = 3; want[0].v = big; want[0].vl = mib;
    want[1].k = "big2"; want[1].kl = 4; want[1].v = big2; want[1].vl = mib;
    want[2].k = "small"; want[2].kl = 5; want[2].v = "s"; want[2].vl = 1;
    WALK(db, NULL, 0, want, 3, NULL);
    tc_close(tc, &db);

    db = tc_open(tc, path, 0);
    FETCH(db, S("big"), big, mib, NULL);
    FETCH(db, S("big2"), big2, mib, NULL);
    WALK(db, NULL, 0, want, 3, NULL);
    /* grow by one byte, then shrink, then grow back */
    RC(cyrusdb_store(db, S("big"), big, mib + 1, NULL), CYRUSDB_OK);
    FETCH(db, S("big"), big, mib + 1, NULL);
    RC(cyrusdb_store(db, S("big2"), S("tiny"), NULL), CYRUSDB_OK);
    FETCH(db, S("big2"), S("tiny"), NULL);
    CONSISTENT(tc, db);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    FETCH(db, S("big"), big, mib + 1, NULL);
    FETCH(db, S("big2"), S("tiny"), NULL);
    FETCH(db, S("small"), S("s"), NULL);
    free(big);
    free(big2);
}

/* 100,000 keys stored in random order come back in order. */
#define MANY_KEYS 100000
#define MANY_TXNS 10

static size_t many_key(char *out, size_t outlen, unsigned i)
{
    static const char seps[] = ".-_";
    return (size_t)snprintf(out, outlen, "u%u%c%u", i % 1000, seps[i % 3], i);
}

struct many_walk {
    int flags;
    size_t n;
    char prev[64];
    size_t prevlen;
    unsigned char *seen;
    const char *bad;
    char badkey[64];
};

static int many_cb(void *rock, const char *key, size_t keylen,
                   const char *data, size_t datalen)
{
    struct many_walk *w = rock;
    char want[64], vbuf[32], copy[64];
    unsigned i;
    size_t wl, vl;
    const char *p;

    if (w->bad)
        return 0;
    if (!key || keylen == 0 || keylen >= sizeof(w->prev)) {
        w->bad = "bad key pointer or length";
        return 0;
    }
    if (w->n && th_ref_compare(w->flags, w->prev, w->prevlen, key, keylen) >= 0) {
        w->bad = "keys out of order (this key came after a greater or equal one)";
        snprintf(w->badkey, sizeof(w->badkey), "%.*s after %.*s", (int)keylen,
                 key, (int)w->prevlen, w->prev);
        return 0;
    }
    memcpy(w->prev, key, keylen);
    w->prevlen = keylen;
    /* the number after the separator is the key's index */
    memcpy(copy, key, keylen);
    copy[keylen] = '\0';
    p = copy + 1;
    while (*p >= '0' && *p <= '9')
        p++;
    i = *p ? (unsigned)strtoul(p + 1, NULL, 10) : MANY_KEYS;
    wl = many_key(want, sizeof(want), i);
    if (i >= MANY_KEYS || wl != keylen || memcmp(want, key, keylen) || w->seen[i]) {
        w->bad = "unexpected or repeated key";
        snprintf(w->badkey, sizeof(w->badkey), "%.*s", (int)keylen, key);
        return 0;
    }
    w->seen[i] = 1;
    vl = (size_t)snprintf(vbuf, sizeof(vbuf), "value-%u", i * 7);
    if (datalen != vl || memcmp(data, vbuf, vl)) {
        w->bad = "wrong value";
        snprintf(w->badkey, sizeof(w->badkey), "%.*s", (int)keylen, key);
        return 0;
    }
    w->n++;
    return 0;
}

static void many_walk_check(struct cyrusdb *db, int flags)
{
    struct many_walk w;
    int r;

    memset(&w, 0, sizeof(w));
    w.flags = flags;
    w.seen = calloc(MANY_KEYS, 1);
    assert_non_null(w.seen);
    r = cyrusdb_foreach(db, NULL, 0, NULL, many_cb, &w, NULL);
    free(w.seen);
    RC(r, CYRUSDB_OK);
    if (w.bad)
        FAILF("walk over %d keys: %s: <%s>", MANY_KEYS, w.bad, w.badkey);
    assert_int_equal(w.n, MANY_KEYS);
}

static void case_many_keys(struct tcase *tc)
{
    const int flags = CYRUSDB_MBOXSORT;
    const char *path = tc_file(tc, "many.db", tc->backend, flags);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | flags);
    unsigned *perm = test_xmalloc(MANY_KEYS * sizeof(*perm));
    uint32_t seed = 12345;
    unsigned i, t;
    char key[64], val[32];

    for (i = 0; i < MANY_KEYS; i++)
        perm[i] = i;
    for (i = MANY_KEYS - 1; i > 0; i--) {
        unsigned j = test_rand(&seed) % (i + 1);
        unsigned x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    for (t = 0; t < MANY_TXNS; t++) {
        struct cyrusdb_txn *tid = NULL;
        for (i = t * (MANY_KEYS / MANY_TXNS); i < (t + 1) * (MANY_KEYS / MANY_TXNS); i++) {
            size_t kl = many_key(key, sizeof(key), perm[i]);
            size_t vl = (size_t)snprintf(val, sizeof(val), "value-%u", perm[i] * 7);
            int r = cyrusdb_store(db, key, kl, val, vl, &tid);
            if (r != CYRUSDB_OK) {
                free(perm);
                FAILF("store #%u <%s> returned %d (%s)", i, key, r, cyrusdb_strerror(r));
            }
        }
        assert_non_null(tid);
        RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    }
    free(perm);
    many_walk_check(db, flags);
    {
        size_t kl = many_key(key, sizeof(key), 77777);
        FETCH(db, key, kl, "value-544439", 12, NULL);
    }
    /* a sample by fetch, present and absent neighbours */
    for (i = 0; i < MANY_KEYS; i += 97) {
        size_t kl = many_key(key, sizeof(key), i);
        size_t vl = (size_t)snprintf(val, sizeof(val), "value-%u", i * 7);
        FETCH(db, key, kl, val, vl, NULL);
        key[kl] = '.';
        FETCH_NONE(db, key, kl + 1, NULL);
        key[kl] = '\0';
        FETCH_NONE(db, key, kl + 1, NULL);
    }
    tc_close(tc, &db);
    db = tc_open(tc, path, flags);
    many_walk_check(db, flags);
}

/* The mailbox-name set for the prefix cases, in both orders. */
static const struct rec mbox_recs[] = {
    REC("user.al", "0"),
    REC("user.alic", "1"),
    REC("user.alice", "2"),
    REC("user.alice.Sent", "3"),
    REC("user.alice.Sent.old", "4"),
    REC("user.alice.Trash", "5"),
    REC("user.alice-x", "6"),
    REC("user.alice2", "7"),
    REC("user.alicf", "8"),
    REC("user.bob", "9"),
    REC("user.bob.Sent", "10"),
    REC("usera", "11"),
};
#define NMBOX (sizeof(mbox_recs) / sizeof(mbox_recs[0]))

/* indices into mbox_recs, written by hand */
static const int mbox_order_plain[NMBOX] = { 0, 1, 2, 6, 3, 4, 5, 7, 8, 9, 10, 11 };
static const int mbox_order_mbox[NMBOX] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 };

static size_t mbox_pick(struct rec *out, const int *order, const char *prefix)
{
    size_t i, n = 0, pl = strlen(prefix);

    for (i = 0; i < NMBOX; i++) {
        const struct rec *r = &mbox_recs[order[i]];
        if (r->kl >= pl && !memcmp(r->k, prefix, pl))
            out[n++] = *r;
    }
    return n;
}

static void case_prefix_walk(struct tcase *tc)
{
    int f;

    for (f = 0; f < 2; f++) {
        int flags = f ? CYRUSDB_MBOXSORT : 0;
        const int *order = f ? mbox_order_mbox : mbox_order_plain;
        const char *path = tc_file(tc, f ? "mbox.db" : "plain.db", tc->backend, flags);
        struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | flags);
        struct cyrusdb_txn *tid = NULL;
        struct rec want[NMBOX];
        size_t i, n;
        int round;

        for (i = 1; i < NMBOX; i++)
            assert_true(th_ref_compare(flags, mbox_recs[order[i - 1]].k, mbox_recs[order[i - 1]].kl,
                                 mbox_recs[order[i]].k, mbox_recs[order[i]].kl) < 0);
        for (i = 0; i < NMBOX; i++) {
            const struct rec *r = &mbox_recs[(i * 5) % NMBOX];
            RC(cyrusdb_store(db, r->k, r->kl, r->v, r->vl, &tid), CYRUSDB_OK);
        }
        RC(cyrusdb_commit(db, tid), CYRUSDB_OK);

        for (round = 0; round < 2; round++) {
            n = mbox_pick(want, order, "");
            WALK(db, NULL, 0, want, n, NULL);
            WALK(db, "", 0, want, n, NULL);
            n = mbox_pick(want, order, "u");
            WALK(db, S("u"), want, n, NULL);
            n = mbox_pick(want, order, "user.alice");
            assert_int_equal(n, 6);
            WALK(db, S("user.alice"), want, n, NULL);
            if (flags & CYRUSDB_MBOXSORT) {
                /* the mailbox and its children come together, first */
                assert_memory_equal(want[0].k, "user.alice", 10);
                assert_int_equal(want[0].kl, 10);
                for (i = 1; i < 4; i++)
                    assert_int_equal(want[i].k[10], '.');
            }
            n = mbox_pick(want, order, "user.alice.");
            assert_int_equal(n, 3);
            WALK(db, S("user.alice."), want, n, NULL);
            n = mbox_pick(want, order, "user.bob");
            assert_int_equal(n, 2);
            WALK(db, S("user.bob"), want, n, NULL);
            n = mbox_pick(want, order, "user.alice.Sent.old");
            assert_int_equal(n, 1);
            WALK(db, S("user.alice.Sent.old"), want, n, NULL);
            WALK(db, S("user.alice.Sent.old.x"), NULL, 0, NULL);
            WALK(db, S("user.carol"), NULL, 0, NULL);
            n = mbox_pick(want, order, "user.b");
            assert_int_equal(n, 2);
            WALK(db, S("user.b"), want, n, NULL);
            n = mbox_pick(want, order, "");
            FETCH_ALL(db, want, n, NULL);
            CONSISTENT(tc, db);
            tc_close(tc, &db);
            db = tc_open(tc, path, flags);
        }
        tc_close(tc, &db);
    }
}

/* Callback return values stop the walk; the filter skips records. */
static void case_walk_stop_filter(struct tcase *tc)
{
    const int flags = CYRUSDB_MBOXSORT;
    const char *path = tc_file(tc, "stop.db", tc->backend, flags);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | flags);
    struct cyrusdb_txn *tid = NULL;
    struct rec all[NMBOX], sub[NMBOX];
    struct walk w;
    size_t n, i, nsub;
    static const int stops[] = { 7, CYRUSDB_DONE, -42 };
    int s;

    STORE_ALL(db, mbox_recs, NMBOX, NULL);
    n = mbox_pick(all, mbox_order_mbox, "");

    for (s = 0; s < 3; s++) {
        memset(&w, 0, sizeof(w));
        w.stop_at = 3;
        w.stop_value = stops[s];
        RC(cyrusdb_foreach(db, NULL, 0, NULL, walk_cb, &w, NULL), stops[s]);
        assert_null(w.bad);
        recs_expect_at(__FILE__, __LINE__, "stopped walk", w.recs, w.n, all, 3);
        walk_free(&w);
    }
    /* stop at the first record of a prefix */
    memset(&w, 0, sizeof(w));
    w.stop_at = 1;
    w.stop_value = 99;
    RC(cyrusdb_foreach(db, S("user.alice."), NULL, walk_cb, &w, NULL), 99);
    nsub = mbox_pick(sub, mbox_order_mbox, "user.alice.");
    recs_expect_at(__FILE__, __LINE__, "stopped prefix walk", w.recs, w.n, sub, 1);
    walk_free(&w);
    /* stop at the last record: the return value still comes back */
    memset(&w, 0, sizeof(w));
    w.stop_at = nsub;
    w.stop_value = 5;
    RC(cyrusdb_foreach(db, S("user.alice."), NULL, walk_cb, &w, NULL), 5);
    recs_expect_at(__FILE__, __LINE__, "walk stopped at its end", w.recs, w.n, sub, nsub);
    walk_free(&w);

    /* filter: passes keys whose last byte is even */
    memset(&w, 0, sizeof(w));
    w.filter_mod = 2;
    RC(cyrusdb_foreach(db, NULL, 0, walk_filter, walk_cb, &w, NULL), CYRUSDB_OK);
    assert_null(w.bad);
    recs_expect_at(__FILE__, __LINE__, "filter saw", w.frecs, w.fn, all, n);
    nsub = 0;
    for (i = 0; i < n; i++)
        if ((unsigned char)all[i].k[all[i].kl - 1] % 2 == 0)
            sub[nsub++] = all[i];
    assert_true(nsub > 0 && nsub < n);
    recs_expect_at(__FILE__, __LINE__, "filtered walk", w.recs, w.n, sub, nsub);
    walk_free(&w);

    /* filter and stop together; inside a transaction */
    memset(&w, 0, sizeof(w));
    w.filter_mod = 2;
    w.stop_at = 2;
    w.stop_value = 3;
    RC(cyrusdb_store(db, S("user.zz"), S("z"), &tid), CYRUSDB_OK);
    RC(cyrusdb_foreach(db, NULL, 0, walk_filter, walk_cb, &w, &tid), 3);
    recs_expect_at(__FILE__, __LINE__, "filtered stopped walk", w.recs, w.n, sub, 2);
    walk_free(&w);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    FETCH(db, S("user.zz"), S("z"), NULL);
}

/* The transaction cases share this setup. */
static const struct rec txn_base[] = { REC("a", "1"), REC("b", "2"), REC("d", "4") };
static const struct rec txn_after[] = { REC("a", "10"), REC("c", "3"), REC("d", "4") };
static const struct rec txn_keys[] = {
    REC("a", ""), REC("b", ""), REC("c", ""), REC("d", ""), REC("e", ""),
};
#define NKEYS (sizeof(txn_keys) / sizeof(txn_keys[0]))

/* Change txn_base into txn_after inside *tid; check it sees its own writes. */
static void txn_changes(struct cyrusdb *db, struct cyrusdb_txn **tid)
{
    RC(cyrusdb_store(db, S("a"), S("10"), tid), CYRUSDB_OK);
    assert_non_null(*tid);
    RC(cyrusdb_create(db, S("c"), S("3"), tid), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("b"), tid, 0), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("e"), S("temporary"), tid), CYRUSDB_OK);
    FETCH(db, S("e"), S("temporary"), tid);
    RC(cyrusdb_delete(db, S("e"), tid, 0), CYRUSDB_OK);
    FETCH(db, S("a"), S("10"), tid);
    FETCH_NONE(db, S("b"), tid);
    FETCH(db, S("c"), S("3"), tid);
    FETCH_NONE(db, S("e"), tid);
    WALK(db, NULL, 0, txn_after, 3, tid);
}

static void case_commit(struct tcase *tc)
{
    const char *path = tc_file(tc, "commit.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;

    STORE_ALL(db, txn_base, 3, NULL);
    txn_changes(db, &tid);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, txn_after, 3, NULL);
    FETCH_NONE(db, S("b"), NULL);
    READER_EXPECT(tc, path, 0, "after commit", txn_after, 3, txn_keys, NKEYS);
    /* a second transaction on the same handle */
    RC(cyrusdb_store(db, S("f"), S("6"), &tid), CYRUSDB_OK);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    FETCH(db, S("f"), S("6"), NULL);
    RC(cyrusdb_delete(db, S("f"), NULL, 0), CYRUSDB_OK);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, txn_after, 3, NULL);
}

static void case_abort(struct tcase *tc)
{
    const char *path = tc_file(tc, "abort.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;

    STORE_ALL(db, txn_base, 3, NULL);
    txn_changes(db, &tid);
    RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, txn_base, 3, NULL);
    FETCH(db, S("a"), S("1"), NULL);
    FETCH(db, S("b"), S("2"), NULL);
    FETCH_NONE(db, S("c"), NULL);
    READER_EXPECT(tc, path, 0, "after abort", txn_base, 3, txn_keys, NKEYS);
    /* the handle is usable after an abort */
    RC(cyrusdb_store(db, S("z"), S("26"), NULL), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("z"), NULL, 0), CYRUSDB_OK);
    /* a transaction that only read (fetchlock) aborts cleanly too */
    fetch_expect_at(__FILE__, __LINE__, db, S("a"), S("1"), &tid, 1);
    RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, txn_base, 3, NULL);
    /* close with an open transaction aborts it */
    txn_changes(db, &tid);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, txn_base, 3, NULL);
    READER_EXPECT(tc, path, 0, "after close with a transaction open",
                  txn_base, 3, txn_keys, NKEYS);
    CONSISTENT(tc, db);
}

/* Another process never sees uncommitted writes. */
static void case_isolation(struct tcase *tc)
{
    const char *path = tc_file(tc, "iso.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    struct probe p;
    int answered, grace_ms;
    long t0;

    STORE_ALL(db, txn_base, 3, NULL);
    /* how long a reader takes here when nothing is in its way: the grace
     * below, ten times that (at least 500 ms), lets a reader that does
     * not wait for the writer answer on a slow or loaded machine too */
    t0 = test_now_ms();
    PROBE_START(tc, &p, path, 0, txn_keys, NKEYS);
    if (!PROBE_WAIT(tc, &p, 30000))
        FAILF("a reader with no transaction open did not answer in 30 s");
    PROBE_CHECK(&p, "reader before the transaction", txn_base, 3, txn_keys, NKEYS);
    grace_ms = (int)(10 * (test_now_ms() - t0));
    if (grace_ms < 500)
        grace_ms = 500;
    txn_changes(db, &tid);
    PROBE_START(tc, &p, path, 0, txn_keys, NKEYS);
    /* the reader either answers at once with the committed state or waits
     * for the write lock; give it time to get there */
    answered = PROBE_WAIT(tc, &p, grace_ms);
    if (getenv("TEST_VERBOSE"))
        print_message("%s: a reader %s\n", tc->backend,
                      answered ? "answered while a transaction was open"
                               : "waited for the writer's lock");
    FETCH(db, S("a"), S("10"), &tid);
    RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    if (!answered && !PROBE_WAIT(tc, &p, 30000))
        FAILF("the reader was still blocked 30 s after the writer aborted");
    PROBE_CHECK(&p, answered ? "reader during a transaction"
                             : "reader blocked by a transaction",
                txn_base, 3, txn_keys, NKEYS);

    /* the same again, with a commit: a reader that answered while the
     * transaction was open must have seen the old state */
    txn_changes(db, &tid);
    PROBE_START(tc, &p, path, 0, txn_keys, NKEYS);
    answered = PROBE_WAIT(tc, &p, grace_ms);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    if (answered)
        PROBE_CHECK(&p, "reader during a transaction", txn_base, 3, txn_keys, NKEYS);
    else if (!PROBE_WAIT(tc, &p, 30000))
        FAILF("the reader was still blocked 30 s after the writer committed");
    else
        PROBE_CHECK(&p, "reader blocked until commit", txn_after, 3, txn_keys, NKEYS);
    READER_EXPECT(tc, path, 0, "after commit", txn_after, 3, txn_keys, NKEYS);
}

/* Misuse of transactions is refused. */
static void case_txn_misuse(struct tcase *tc)
{
    const char *path = tc_file(tc, "mis.db", tc->backend, 0);
    const char *path2 = tc_file(tc, "other.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb *db2 = tc_open(tc, path2, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL, *tid2 = NULL;

    STORE_ALL(db, txn_base, 3, NULL);
    RC(cyrusdb_store(db, S("x"), S("in txn"), &tid), CYRUSDB_OK);
    /* a write without the tid while the handle is in a transaction */
    RC(cyrusdb_store(db, S("y"), S("outside"), NULL), CYRUSDB_LOCKED);
    RC(cyrusdb_delete(db, S("a"), NULL, 0), CYRUSDB_LOCKED);
    /* the transaction of another handle */
    RC(cyrusdb_store(db2, S("q"), S("other"), &tid2), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("y"), S("foreign"), &tid2), CYRUSDB_INTERNAL);
    RC(cyrusdb_abort(db2, tid2), CYRUSDB_OK);
    RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, txn_base, 3, NULL);
    WALK(db2, NULL, 0, NULL, 0, NULL);
    /* a missing tid pointer for fetchlock, and NULL transactions */
    {
        const char *data = POISON_PTR;
        size_t len = POISON_LEN;
        RC(cyrusdb_fetchlock(db, S("a"), &data, &len, NULL), CYRUSDB_INTERNAL);
    }
    RC(cyrusdb_commit(db, NULL), CYRUSDB_INTERNAL);
    RC(cyrusdb_abort(db, NULL), CYRUSDB_INTERNAL);
    /* the handle still works */
    RC(cyrusdb_store(db, S("x"), S("after"), NULL), CYRUSDB_OK);
    FETCH(db, S("x"), S("after"), NULL);
}

static void case_create_exists(struct tcase *tc)
{
    const char *path = tc_file(tc, "exists.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;

    RC(cyrusdb_create(db, S("k"), S("original"), NULL), CYRUSDB_OK);
    RC(cyrusdb_create(db, S("k"), S("replacement"), NULL), CYRUSDB_EXISTS);
    FETCH(db, S("k"), S("original"), NULL);
    RC(cyrusdb_create(db, S("k"), "", 0, NULL), CYRUSDB_EXISTS);
    FETCH(db, S("k"), S("original"), NULL);
    /* inside a transaction, also for a key created in it */
    RC(cyrusdb_create(db, S("n"), S("new"), &tid), CYRUSDB_OK);
    RC(cyrusdb_create(db, S("n"), S("again"), &tid), CYRUSDB_EXISTS);
    RC(cyrusdb_create(db, S("k"), S("in txn"), &tid), CYRUSDB_EXISTS);
    FETCH(db, S("k"), S("original"), &tid);
    FETCH(db, S("n"), S("new"), &tid);
    RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    FETCH_NONE(db, S("n"), NULL);
    /* a key deleted in the transaction can be created again in it */
    RC(cyrusdb_delete(db, S("k"), &tid, 0), CYRUSDB_OK);
    RC(cyrusdb_create(db, S("k"), S("recreated"), &tid), CYRUSDB_OK);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    FETCH(db, S("k"), S("recreated"), NULL);
    FETCH_NONE(db, S("n"), NULL);
}

static void case_delete_missing(struct tcase *tc)
{
    const char *path = tc_file(tc, "del.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    static const struct rec want[] = { REC("a", "1"), REC("c", "3") };

    RC(cyrusdb_delete(db, S("nothing"), NULL, 0), CYRUSDB_NOTFOUND);
    RC(cyrusdb_delete(db, S("nothing"), NULL, 1), CYRUSDB_OK);
    STORE_ALL(db, want, 2, NULL);
    RC(cyrusdb_delete(db, S("b"), NULL, 0), CYRUSDB_NOTFOUND);
    RC(cyrusdb_delete(db, S("b"), NULL, 1), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("a\0"), NULL, 0), CYRUSDB_NOTFOUND);
    RC(cyrusdb_delete(db, S("aa"), NULL, 0), CYRUSDB_NOTFOUND);
    WALK(db, NULL, 0, want, 2, NULL);
    /* forced delete of a missing key inside a transaction, then commit */
    RC(cyrusdb_store(db, S("t"), S("tmp"), &tid), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("b"), &tid, 1), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("t"), &tid, 0), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("t"), &tid, 1), CYRUSDB_OK);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    /* not forced inside a transaction, then abort */
    RC(cyrusdb_delete(db, S("b"), &tid, 0), CYRUSDB_NOTFOUND);
    if (tid)
        RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, want, 2, NULL);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, want, 2, NULL);
}

/* A callback that renames user.a.* to user.b.* with the walk's tid. */
struct rename_rock {
    struct cyrusdb *db;
    struct cyrusdb_txn **tid;
    int r;
    size_t calls;
    const char *bad;
};

static int rename_cb(void *rock, const char *key, size_t keylen,
                     const char *data, size_t datalen)
{
    struct rename_rock *rr = rock;
    char nk[600], nd[600];
    const char *got = NULL;
    size_t gotlen = 0;
    int r;

    rr->calls++;
    if (keylen < 7 || keylen > 500 || datalen > 500 || memcmp(key, "user.a.", 7)) {
        rr->bad = "callback for a key outside the prefix";
        return -1000;
    }
    /* copy: the key and data become invalid at the next call */
    memcpy(nk, key, keylen);
    nk[5] = 'b';
    memcpy(nd, data, datalen);
    if (!*rr->tid) {
        rr->bad = "the walk's transaction was not handed back before the callback";
    }
    r = cyrusdb_delete(rr->db, key, keylen, rr->tid, 0);
    if (r == CYRUSDB_OK)
        r = cyrusdb_create(rr->db, nk, keylen, nd, datalen, rr->tid);
    if (r == CYRUSDB_OK) {
        r = cyrusdb_fetch(rr->db, nk, keylen, &got, &gotlen, rr->tid);
        if (r == CYRUSDB_OK && (gotlen != datalen || memcmp(got, nd, datalen)))
            rr->bad = "fetch inside the callback returned the wrong value";
    }
    if (r != CYRUSDB_OK) {
        rr->r = r;
        return -1001;
    }
    return 0;
}

/* Deletes the record after each visited one ("k00".."k19"). */
struct skip_rock {
    struct cyrusdb *db;
    struct cyrusdb_txn **tid;
    char seen[32][4];
    size_t n;
    int r;
};

static int skip_cb(void *rock, const char *key, size_t keylen,
                   const char *data, size_t datalen)
{
    struct skip_rock *sr = rock;
    char next[16];
    int r;

    (void)data;
    (void)datalen;
    if (sr->n >= 32 || keylen != 3)
        return -2000;
    memcpy(sr->seen[sr->n++], key, 3);
    snprintf(next, sizeof(next), "k%02d", (key[1] - '0') * 10 + (key[2] - '0') + 1);
    r = cyrusdb_delete(sr->db, next, 3, sr->tid, 1);
    /* and replace the current record's value */
    if (r == CYRUSDB_OK)
        r = cyrusdb_store(sr->db, key, 3, "visited", 7, sr->tid);
    if (r != CYRUSDB_OK) {
        sr->r = r;
        return -2001;
    }
    return 0;
}

static void case_foreach_modify(struct tcase *tc)
{
    const int flags = CYRUSDB_MBOXSORT;
    const char *path = tc_file(tc, "ren.db", tc->backend, flags);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | flags);
    struct cyrusdb_txn *tid = NULL;
    struct rename_rock rr;
    struct skip_rock sr;
    static const struct rec before[] = {
        REC("user.a", "A"), REC("user.a.Drafts", "d"), REC("user.a.Sent", "s"),
        REC("user.a.Sent.2020", "s20"), REC("user.a.Trash", ""), REC("user.a.x\0y", "nul"),
        REC("user.a-z", "not a child"), REC("user.aa.x", "other user"),
        REC("user.c.x", "c"),
    };
    static const struct rec after[] = {
        REC("user.a", "A"), REC("user.a-z", "not a child"), REC("user.aa.x", "other user"),
        REC("user.b.Drafts", "d"), REC("user.b.Sent", "s"), REC("user.b.Sent.2020", "s20"),
        REC("user.b.Trash", ""), REC("user.b.x\0y", "nul"), REC("user.c.x", "c"),
    };
    enum { NREC = sizeof(before) / sizeof(before[0]) };
    struct rec sorted[NREC];
    size_t i;

    STORE_ALL(db, before, NREC, NULL);
    memcpy(sorted, after, sizeof(after));
    test_sort_recs(sorted, NREC, flags);

    /* the walk begins the transaction (tid points at NULL) */
    memset(&rr, 0, sizeof(rr));
    rr.db = db;
    rr.tid = &tid;
    RC(cyrusdb_foreach(db, S("user.a."), NULL, rename_cb, &rr, &tid), CYRUSDB_OK);
    if (rr.bad)
        FAILF("rename walk: %s", rr.bad);
    RC(rr.r, CYRUSDB_OK);
    assert_int_equal(rr.calls, 5);
    assert_non_null(tid);
    WALK(db, NULL, 0, sorted, NREC, &tid);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, sorted, NREC, NULL);
    tc_close(tc, &db);
    db = tc_open(tc, path, flags);
    WALK(db, NULL, 0, sorted, NREC, NULL);

    /* rename back, in a transaction begun before the walk, then abort */
    RC(cyrusdb_store(db, S("marker"), S("m"), &tid), CYRUSDB_OK);
    memset(&rr, 0, sizeof(rr));
    rr.db = db;
    rr.tid = &tid;
    /* (rename_cb maps user.a. -> user.b.; walk user.a. again: nothing left) */
    RC(cyrusdb_foreach(db, S("user.a."), NULL, rename_cb, &rr, &tid), CYRUSDB_OK);
    assert_int_equal(rr.calls, 0);
    RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    FETCH_NONE(db, S("marker"), NULL);

    /* deleting the next record from the callback: it is not visited */
    for (i = 0; i < 20; i++) {
        char k[24];
        snprintf(k, sizeof(k), "k%02zu", i);
        RC(cyrusdb_store(db, k, 3, "orig", 4, NULL), CYRUSDB_OK);
    }
    memset(&sr, 0, sizeof(sr));
    sr.db = db;
    sr.tid = &tid;
    RC(cyrusdb_foreach(db, S("k"), NULL, skip_cb, &sr, &tid), CYRUSDB_OK);
    RC(sr.r, CYRUSDB_OK);
    assert_int_equal(sr.n, 10);
    for (i = 0; i < sr.n; i++) {
        char k[24];
        snprintf(k, sizeof(k), "k%02zu", i * 2);
        assert_memory_equal(sr.seen[i], k, 3);
    }
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    for (i = 0; i < 20; i++) {
        char k[24];
        snprintf(k, sizeof(k), "k%02zu", i);
        if (i % 2)
            FETCH_NONE(db, k, 3, NULL);
        else
            FETCH(db, k, 3, "visited", 7, NULL);
    }
    CONSISTENT(tc, db);
}

static void case_fetchlock(struct tcase *tc)
{
    const char *path = tc_file(tc, "lock.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    static const struct rec want[] = { REC("counter", "2"), REC("new", "created") };

    /* missing key: NOTFOUND, but the transaction is begun */
    fetch_expect_at(__FILE__, __LINE__, db, S("new"), NULL, 0, &tid, 1);
    if (!tid)
        FAILF("fetchlock of a missing key did not begin the transaction");
    RC(cyrusdb_store(db, S("new"), S("created"), &tid), CYRUSDB_OK);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    FETCH(db, S("new"), S("created"), NULL);

    /* read-modify-write of an existing key */
    RC(cyrusdb_store(db, S("counter"), S("1"), NULL), CYRUSDB_OK);
    fetch_expect_at(__FILE__, __LINE__, db, S("counter"), S("1"), &tid, 1);
    assert_non_null(tid);
    fetch_expect_at(__FILE__, __LINE__, db, S("new"), S("created"), &tid, 1);
    RC(cyrusdb_store(db, S("counter"), S("2"), &tid), CYRUSDB_OK);
    fetch_expect_at(__FILE__, __LINE__, db, S("counter"), S("2"), &tid, 1);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, want, 2, NULL);
    READER_EXPECT(tc, path, 0, "after fetchlock commit", want, 2, want, 2);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, want, 2, NULL);
}

static void case_open_missing(struct tcase *tc)
{
    char *missing = th_path(tc->dir, "missing.db");
    char *nodir = th_path(tc->dir, "no/such/dir/x.db");
    const char *deep = tc_file(tc, "new/sub/dir/x.db", tc->backend, 0);
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    struct stat st;
    int r1, r2, r3;

    r1 = cyrusdb_open(tc->backend, missing, 0, &db, &err);
    assert_null(db);
    r2 = cyrusdb_open(tc->backend, nodir, 0, &db, &err);
    assert_null(db);
    r3 = cyrusdb_open(tc->backend, missing, CYRUSDB_RDONLY, &db, &err);
    assert_null(db);
    free(nodir);
    RC(r1, CYRUSDB_NOTFOUND);
    RC(r2, CYRUSDB_NOTFOUND);
    RC(r3, CYRUSDB_NOTFOUND);
    /* and nothing was created */
    r1 = stat(missing, &st);
    free(missing);
    assert_int_equal(r1, -1);

    /* CREATE makes the missing parent directories */
    db = tc_open(tc, deep, CYRUSDB_CREATE);
    RC(cyrusdb_store(db, S("k"), S("v"), NULL), CYRUSDB_OK);
    tc_close(tc, &db);
    assert_int_equal(stat(deep, &st), 0);
    db = tc_open(tc, deep, 0);
    FETCH(db, S("k"), S("v"), NULL);
}

/* An existing empty file is a new empty database for flat and skiplist;
 * the other backends may refuse it, with an error code. */
static void case_empty_file(struct tcase *tc)
{
    const char *path;
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    int fd, r;

    path = tc_file(tc, "zero.db", tc->backend, 0);
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    assert_true(fd >= 0);
    close(fd);
    if (strcmp(tc->entry->format, "flat") && strcmp(tc->entry->format, "skiplist")) {
        r = cyrusdb_open(tc->backend, path, 0, &db, &err);
        if (r != CYRUSDB_OK) {
            assert_null(db);
            assert_true(r < 0);
            if (getenv("TEST_VERBOSE"))
                print_message("%s refuses an empty file: %d (%s): %s\n", tc->backend,
                              r, cyrusdb_strerror(r), err ? err : "");
            return;
        }
        /* accepted: then it is an empty, working database */
        cyrusdb_close(&db);
    }
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, NULL, 0, NULL);
    FETCH_NONE(db, S("k"), NULL);
    RC(cyrusdb_store(db, S("k"), S("v"), NULL), CYRUSDB_OK);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    FETCH(db, S("k"), S("v"), NULL);
}

static char *test_slurp(const char *path, size_t *len_r)
{
    FILE *f = fopen(path, "rb");
    struct buf b = BUF_INITIALIZER;
    char chunk[65536];
    size_t n;

    if (!f)
        return NULL;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        buf_append(&b, chunk, n);
    fclose(f);
    *len_r = b.len;
    return buf_release(&b);
}

static void case_readonly(struct tcase *tc)
{
    const char *path = tc_file(tc, "ro.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb *ro;
    struct cyrusdb_txn *tid = NULL;
    static const struct rec want[] = { REC("a", "1"), REC("b", "2") };
    char *before, *after;
    size_t blen = 0, alen = 0;

    STORE_ALL(db, want, 2, NULL);
    tc_close(tc, &db);
    before = test_slurp(path, &blen);
    assert_non_null(before);

    ro = tc_open(tc, path, CYRUSDB_RDONLY);
    FETCH(ro, S("a"), S("1"), NULL);
    FETCH_NONE(ro, S("c"), NULL);
    WALK(ro, NULL, 0, want, 2, NULL);
    RC(cyrusdb_store(ro, S("c"), S("3"), NULL), CYRUSDB_READONLY);
    RC(cyrusdb_create(ro, S("c"), S("3"), NULL), CYRUSDB_READONLY);
    RC(cyrusdb_delete(ro, S("a"), NULL, 0), CYRUSDB_READONLY);
    RC(cyrusdb_delete(ro, S("a"), NULL, 1), CYRUSDB_READONLY);
    RC(cyrusdb_store(ro, S("c"), S("3"), &tid), CYRUSDB_READONLY);
    assert_null(tid);
    {
        const char *data = POISON_PTR;
        size_t len = POISON_LEN;
        RC(cyrusdb_fetchlock(ro, S("a"), &data, &len, &tid), CYRUSDB_READONLY);
        assert_null(tid);
    }
    RC(cyrusdb_checkpoint(ro), CYRUSDB_READONLY);
    WALK(ro, NULL, 0, want, 2, NULL);
    CONSISTENT(tc, ro);
    tc_close(tc, &ro);

    after = test_slurp(path, &alen);
    assert_non_null(after);
    if (alen != blen || memcmp(before, after, alen)) {
        free(before);
        free(after);
        FAILF("a read-only handle changed the database file");
    }
    free(before);
    free(after);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, want, 2, NULL);
}

/* A file written by one backend, opened with every other. */
static void case_bad_format(struct tcase *tc)
{
    const char *const *others = th_backends();
    const char *path = tc_file(tc, "fmt.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    size_t i;

    RC(cyrusdb_store(db, S("k"), S("v"), NULL), CYRUSDB_OK);
    tc_close(tc, &db);
    for (i = 0; others[i]; i++) {
        const struct cyrusdb_registry_entry *e = cyrusdb_lookup(others[i]);
        struct cyrusdb *odb = NULL;
        const char *err = NULL;
        int r;

        assert_non_null(e);
        if (!strcmp(e->format, tc->entry->format)) {
            /* same format (db3 and db3-nosync): opens fine */
            odb = tc_open_as(tc, others[i], path, 0);
            FETCH(odb, S("k"), S("v"), NULL);
            tc_close(tc, &odb);
            continue;
        }
        r = cyrusdb_open(others[i], path, 0, &odb, &err);
        if (r != CYRUSDB_BADFORMAT) {
            if (odb)
                cyrusdb_close(&odb);
            FAILF("a %s file opened as %s: returned %d (%s), expected BADFORMAT",
                  tc->backend, others[i], r, cyrusdb_strerror(r));
        }
        assert_null(odb);
        if (!err || !strstr(err, tc->entry->format) || !strstr(err, others[i]))
            FAILF("a %s file opened as %s: the error <%s> does not name both",
                  tc->backend, others[i], err ? err : "(null)");
        /* not even with CREATE or RDONLY */
        RC(cyrusdb_open(others[i], path, CYRUSDB_CREATE, &odb, &err), CYRUSDB_BADFORMAT);
        RC(cyrusdb_open(others[i], path, CYRUSDB_RDONLY, &odb, &err), CYRUSDB_BADFORMAT);
    }
    /* the file is unharmed */
    db = tc_open(tc, path, 0);
    FETCH(db, S("k"), S("v"), NULL);
}

static void case_detect(struct tcase *tc)
{
    const char *path = tc_file(tc, "det.db", tc->backend, 0);
    const char *path2 = tc_file(tc, "det-empty.db", tc->backend, 0);
    char *missing = th_path(tc->dir, "none.db");
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    const char *fmt = NULL;
    int r;

    RC(cyrusdb_store(db, S("k"), S("v"), NULL), CYRUSDB_OK);
    tc_close(tc, &db);
    RC(cyrusdb_detect(path, &fmt), CYRUSDB_OK);
    assert_string_equal(fmt, tc->entry->format);
    /* a database created and closed without records */
    db = tc_open(tc, path2, CYRUSDB_CREATE);
    tc_close(tc, &db);
    fmt = NULL;
    RC(cyrusdb_detect(path2, &fmt), CYRUSDB_OK);
    assert_string_equal(fmt, tc->entry->format);
    r = cyrusdb_detect(missing, &fmt);
    free(missing);
    RC(r, CYRUSDB_NOTFOUND);
}

static void case_checkpoint(struct tcase *tc)
{
    const int flags = CYRUSDB_MBOXSORT;
    const char *path = tc_file(tc, "ckpt.db", tc->backend, flags);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | flags);
    struct cyrusdb_txn *tid = NULL;
    struct rec *model;
    char (*keys)[32], (*vals)[64];
    size_t i, n = 0;
    const size_t total = 2000;

    model = test_xmalloc(total * sizeof(*model));
    keys = test_xmalloc(total * sizeof(*keys));
    vals = test_xmalloc(total * sizeof(*vals));
    for (i = 0; i < total; i++) {
        size_t kl = (size_t)snprintf(keys[i], sizeof(keys[i]), "user.u%zu.f%zu", i % 37, i);
        size_t vl = (size_t)snprintf(vals[i], sizeof(vals[i]), "v%zu", i);
        RC(cyrusdb_store(db, keys[i], kl, "old", 3, &tid), CYRUSDB_OK);
        /* a third deleted, a third replaced, a third kept */
        if (i % 3 == 0) {
            RC(cyrusdb_delete(db, keys[i], kl, &tid, 0), CYRUSDB_OK);
            continue;
        }
        if (i % 3 == 1) {
            vals[i][vl] = '\0';
            vals[i][vl + 1] = 'x';
            vl += 2;
            RC(cyrusdb_store(db, keys[i], kl, vals[i], vl, &tid), CYRUSDB_OK);
        } else {
            memcpy(vals[i], "old", 3);
            vl = 3;
        }
        model[n].k = keys[i];
        model[n].kl = kl;
        model[n].v = vals[i];
        model[n].vl = vl;
        n++;
        if (i % 500 == 499) {
            RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
            tid = NULL;
        }
    }
    if (tid)
        RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    test_sort_recs(model, n, flags);
    WALK(db, NULL, 0, model, n, NULL);
    RC(cyrusdb_checkpoint(db), CYRUSDB_OK);
    WALK(db, NULL, 0, model, n, NULL);
    CONSISTENT(tc, db);
    /* writes after the checkpoint land in the new file */
    RC(cyrusdb_delete(db, model[0].k, model[0].kl, NULL, 0), CYRUSDB_OK);
    RC(cyrusdb_checkpoint(db), CYRUSDB_OK);
    RC(cyrusdb_store(db, model[0].k, model[0].kl, model[0].v, model[0].vl, NULL),
       CYRUSDB_OK);
    WALK(db, NULL, 0, model, n, NULL);
    READER_EXPECT(tc, path, flags, "after checkpoint", model, n, model, 3);
    tc_close(tc, &db);
    db = tc_open(tc, path, flags);
    WALK(db, NULL, 0, model, n, NULL);
    free(model);
    free(keys);
    free(vals);
}

static void dump_escape(struct buf *b, const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\\' || c >= 0x80)
            buf_printf(b, "\\x%02x", c);
        else
            buf_putc(b, c);
    }
}

static void case_dump(struct tcase *tc)
{
    const char *path = tc_file(tc, "dump.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    static const struct rec recs[] = {
        REC("user.alice", "plain value"),
        REC("bin\0key", "v\0\t\n\\\x7f\x80\xff"),
        REC("empty", ""),
        REC("back\\slash", "tab\there"),
    };
    enum { NR = sizeof(recs) / sizeof(recs[0]) };
    struct rec sorted[NR];
    struct buf want = BUF_INITIALIZER;
    char *out = NULL;
    size_t outlen = 0, i;
    FILE *f;
    int r;

    STORE_ALL(db, recs, NR, NULL);
    memcpy(sorted, recs, sizeof(recs));
    test_sort_recs(sorted, NR, 0);
    for (i = 0; i < NR; i++) {
        dump_escape(&want, sorted[i].k, sorted[i].kl);
        buf_putc(&want, '\t');
        dump_escape(&want, sorted[i].v, sorted[i].vl);
        buf_putc(&want, '\n');
    }
    f = open_memstream(&out, &outlen);
    assert_non_null(f);
    r = cyrusdb_dump(db, f, 0);
    fclose(f);
    if (r != CYRUSDB_OK) {
        free(out);
        buf_free(&want);
        FAILF("dump returned %d (%s)", r, cyrusdb_strerror(r));
    }
    if (outlen != want.len || memcmp(out, want.s, outlen)) {
        print_error("dump detail 0 printed:\n%s\nexpected:\n%s\n", out,
                    buf_cstring(&want));
        free(out);
        buf_free(&want);
        fail();
    }
    free(out);
    out = NULL;
    buf_free(&want);
    /* detail 1 works and mentions the records' keys somewhere */
    f = open_memstream(&out, &outlen);
    assert_non_null(f);
    r = cyrusdb_dump(db, f, 1);
    fclose(f);
    if (r != CYRUSDB_OK) {
        free(out);
        FAILF("dump detail 1 returned %d (%s)", r, cyrusdb_strerror(r));
    }
    free(out);
}

/* A random mix of operations, committed or aborted, checked against a
 * model after every transaction and every reopen. */
struct model {
    struct rec r[64];
    char keys[64][16];
    char vals[64][300];
    int present[64];
};

static size_t model_snapshot(const struct model *m, struct rec *out, int flags)
{
    size_t i, n = 0;

    for (i = 0; i < 64; i++)
        if (m->present[i])
            out[n++] = m->r[i];
    test_sort_recs(out, n, flags);
    return n;
}

static void case_random_ops(struct tcase *tc)
{
    int f;

    for (f = 0; f < 2; f++) {
        const int flags = f ? CYRUSDB_MBOXSORT : 0;
        const char *path = tc_file(tc, f ? "rand-mbox.db" : "rand.db", tc->backend, flags);
        struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | flags);
        struct model *m = calloc(1, sizeof(*m));
        struct model *saved = calloc(1, sizeof(*saved));
        struct rec snap[64];
        uint32_t seed = 777 + (uint32_t)f;
        size_t i, n;
        int t;

        assert_non_null(m);
        assert_non_null(saved);
        for (i = 0; i < 64; i++) {
            static const char *const stems[] = { "user.x", "user.x.", "user.x-", "k\0", "" };
            const char *stem = stems[i % 5];
            size_t sl = i % 5 == 3 ? 2 : strlen(stem);
            memcpy(m->keys[i], stem, sl);
            m->keys[i][sl] = (char)('A' + i / 5);
            m->r[i].k = m->keys[i];
            m->r[i].kl = sl + 1;
            m->r[i].v = m->vals[i];
        }
        for (t = 0; t < 40; t++) {
            struct cyrusdb_txn *tid = NULL;
            int nops = 1 + (int)(test_rand(&seed) % 12);
            int abort_it = test_rand(&seed) % 4 == 0;
            int op;

            memcpy(saved, m, sizeof(*m));
            for (op = 0; op < nops; op++) {
                size_t k = test_rand(&seed) % 64;
                uint32_t what = test_rand(&seed) % 4;
                struct rec *rr = &m->r[k];
                if (what < 2) {
                    size_t vl = test_rand(&seed) % 300;
                    char tmp[300];
                    th_fill(tmp, vl, test_rand(&seed));
                    if (what == 0) {
                        RC(cyrusdb_store(db, rr->k, rr->kl, tmp, vl, &tid), CYRUSDB_OK);
                    } else if (!m->present[k]) {
                        /* (create of an existing key is an error that
                         * requires an abort: create_exists covers it) */
                        RC(cyrusdb_create(db, rr->k, rr->kl, tmp, vl, &tid), CYRUSDB_OK);
                    } else {
                        continue;
                    }
                    memcpy(m->vals[k], tmp, vl);
                    rr->vl = vl;
                    m->present[k] = 1;
                } else if (what == 2) {
                    RC(cyrusdb_delete(db, rr->k, rr->kl, &tid, 1), CYRUSDB_OK);
                    m->present[k] = 0;
                } else if (m->present[k]) {
                    FETCH(db, rr->k, rr->kl, rr->v, rr->vl, &tid);
                } else {
                    FETCH_NONE(db, rr->k, rr->kl, &tid);
                }
            }
            n = model_snapshot(m, snap, flags);
            if (tid)
                WALK(db, NULL, 0, snap, n, &tid);
            if (tid && abort_it) {
                RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
                memcpy(m, saved, sizeof(*m));
            } else if (tid) {
                RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
            }
            n = model_snapshot(m, snap, flags);
            WALK(db, NULL, 0, snap, n, NULL);
            if (t % 10 == 9) {
                CONSISTENT(tc, db);
                tc_close(tc, &db);
                db = tc_open(tc, path, flags);
                WALK(db, NULL, 0, snap, n, NULL);
            }
        }
        /* prefix walks of the final state */
        {
            static const char *const prefixes[] = { "user.x", "user.x.", "user.x-", "k" };
            size_t p;
            for (p = 0; p < 4; p++) {
                struct rec sub[64];
                size_t pl = strlen(prefixes[p]), j, ns = 0;
                for (j = 0; j < n; j++)
                    if (snap[j].kl >= pl && !memcmp(snap[j].k, prefixes[p], pl))
                        sub[ns++] = snap[j];
                WALK(db, prefixes[p], pl, sub, ns, NULL);
            }
        }
        READER_EXPECT(tc, path, flags, "random final state", snap, n, snap, n < 5 ? n : 5);
        tc_close(tc, &db);
        free(m);
        free(saved);
    }
}

/* A long-lived handle sees what other processes commit, also across their
 * checkpoints (file replaced, grown, repacked), and its own later writes
 * keep those changes. */
static void case_other_writer(struct tcase *tc)
{
    const size_t mib = (size_t)1 << 20;
    const int flags = CYRUSDB_MBOXSORT;
    const char *path = tc_file(tc, "other.db", tc->backend, flags);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | flags);
    char *big = test_xmalloc(mib);
    struct rec model[8];
    struct cyrusdb_txn *tid = NULL;
    size_t n;

    th_fill(big, mib, 31);
    RC(cyrusdb_store(db, S("a"), S("1"), NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("b"), S("2"), NULL), CYRUSDB_OK);
    FETCH(db, S("a"), S("1"), NULL);
    {
        static const struct rec ab[] = { REC("a", "1"), REC("b", "2") };
        WALK(db, NULL, 0, ab, 2, NULL);
    }
    {
        struct op ops[] = {
            { 's', REC("c", "3") },
            { 's', REC("a", "11") },
            { 'd', REC("b", "") },
            { 's', { "big", 3, big, mib } },
            { 'k', REC("x", "") },
            { 's', REC("user.x", "after the checkpoint") },
        };
        WRITER_RUN(tc, path, flags, ops, 6);
    }
    n = 0;
    model[n++] = (struct rec)REC("a", "11");
    model[n++] = (struct rec){ "big", 3, big, mib };
    model[n++] = (struct rec)REC("c", "3");
    model[n++] = (struct rec)REC("user.x", "after the checkpoint");
    /* the same handle, never reopened */
    FETCH(db, S("a"), S("11"), NULL);
    FETCH_NONE(db, S("b"), NULL);
    FETCH(db, S("big"), big, mib, NULL);
    WALK(db, NULL, 0, model, n, NULL);
    /* our own write must not drop the other process's changes */
    RC(cyrusdb_store(db, S("d"), S("4"), NULL), CYRUSDB_OK);
    model[n++] = (struct rec)REC("d", "4");
    test_sort_recs(model, n, flags);
    WALK(db, NULL, 0, model, n, NULL);
    READER_EXPECT(tc, path, flags, "after writes from two processes", model, n, model, n);
    {
        struct op ops[] = {
            { 'k', REC("x", "") },
            { 's', REC("e", "5") },
            { 'd', REC("big", "") },
            { 'k', REC("x", "") },
        };
        WRITER_RUN(tc, path, flags, ops, 4);
    }
    n = 0;
    model[n++] = (struct rec)REC("a", "11");
    model[n++] = (struct rec)REC("c", "3");
    model[n++] = (struct rec)REC("d", "4");
    model[n++] = (struct rec)REC("e", "5");
    model[n++] = (struct rec)REC("user.x", "after the checkpoint");
    FETCH(db, S("e"), S("5"), NULL);
    FETCH_NONE(db, S("big"), NULL);
    WALK(db, NULL, 0, model, n, NULL);
    /* a transaction begun after the other process's changes */
    RC(cyrusdb_store(db, S("f"), S("6"), &tid), CYRUSDB_OK);
    FETCH(db, S("e"), S("5"), &tid);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    model[n++] = (struct rec)REC("f", "6");
    test_sort_recs(model, n, flags);
    READER_EXPECT(tc, path, flags, "after the last commit", model, n, model, n);
    CONSISTENT(tc, db);
    free(big);
}

/* Data returned by fetch stays valid until the next call on the handle,
 * even when another process rewrites the record meanwhile. */
static void case_data_stable(struct tcase *tc)
{
    const size_t len = 6000;
    const char *path = tc_file(tc, "stable.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    char *orig = test_xmalloc(len), *other = test_xmalloc(len * 8);
    const char *data = POISON_PTR;
    size_t datalen = POISON_LEN;
    struct op ops[41];
    size_t i, nops = 0;

    th_fill(orig, len, 1);
    th_fill(other, len * 8, 2);
    RC(cyrusdb_store(db, S("k"), orig, len, NULL), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("j"), orig, 10, NULL), CYRUSDB_OK);
    RC(cyrusdb_fetch(db, S("k"), &data, &datalen, NULL), CYRUSDB_OK);
    assert_int_equal(datalen, len);
    /* another process replaces it many times, with filler around it */
    for (i = 0; i < 10; i++) {
        char *fk = test_xmalloc(8);
        snprintf(fk, 8, "f%zu", i);
        ops[nops].kind = 's';
        ops[nops].r = (struct rec){ "k", 1, other + i * 500, len };
        nops++;
        ops[nops].kind = 's';
        ops[nops].r = (struct rec){ fk, strlen(fk), other + i * 700, len };
        nops++;
        ops[nops].kind = 'd';
        ops[nops].r = (struct rec){ fk, strlen(fk), NULL, 0 };
        nops++;
        if (i % 4 == 3) {
            ops[nops].kind = 'k';
            ops[nops].r = (struct rec){ NULL, 0, NULL, 0 };
            nops++;
        }
    }
    WRITER_RUN(tc, path, 0, ops, nops);
    for (i = 0; i < nops; i++)
        if (ops[i].kind == 's' && ops[i].r.k[0] == 'f')
            free((char *)ops[i].r.k);
    if (memcmp(data, orig, len) != 0) {
        free(orig);
        free(other);
        FAILF("the value returned by fetch changed before the next call on the handle");
    }
    /* the next call sees the new value */
    FETCH(db, S("k"), other + 9 * 500, len, NULL);
    free(orig);
    free(other);
}

/* A read call with tid pointing at NULL begins a write transaction too. */
static void case_read_begins_txn(struct tcase *tc)
{
    const char *path = tc_file(tc, "rtx.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb_txn *tid = NULL;
    struct walk w;
    static const struct rec want[] = { REC("a", "1"), REC("b", "2") };

    RC(cyrusdb_store(db, S("a"), S("1"), NULL), CYRUSDB_OK);
    FETCH_NONE(db, S("missing"), &tid);
    if (!tid)
        FAILF("fetch with tid pointing at NULL did not begin a transaction");
    RC(cyrusdb_store(db, S("b"), S("2"), &tid), CYRUSDB_OK);
    RC(cyrusdb_store(db, S("c"), S("3"), NULL), CYRUSDB_LOCKED);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, want, 2, NULL);
    /* a walk over nothing still hands back its transaction */
    memset(&w, 0, sizeof(w));
    RC(cyrusdb_foreach(db, S("zzz"), NULL, walk_cb, &w, &tid), CYRUSDB_OK);
    assert_int_equal(w.n, 0);
    walk_free(&w);
    if (!tid)
        FAILF("foreach with tid pointing at NULL did not begin a transaction");
    RC(cyrusdb_delete(db, S("a"), &tid, 0), CYRUSDB_OK);
    RC(cyrusdb_abort(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, want, 2, NULL);
    READER_EXPECT(tc, path, 0, "after a read-begun transaction", want, 2, want, 2);
}

/* A backend without files (etcd): a missing database is NOTFOUND without
 * CREATE (also read-only) and nothing is made; CREATE makes it. */
static void case_remote_open(struct tcase *tc)
{
    char *missing = th_path(tc->dir, "missing.db");
    const char *made = tc_file(tc, "made.db", tc->backend, 0);
    struct cyrusdb *db = NULL;
    const char *err = NULL;

    RC(cyrusdb_open(tc->backend, missing, 0, &db, &err), CYRUSDB_NOTFOUND);
    assert_null(db);
    RC(cyrusdb_open(tc->backend, missing, CYRUSDB_RDONLY, &db, &err),
       CYRUSDB_NOTFOUND);
    RC(cyrusdb_open(tc->backend, missing, CYRUSDB_RDONLY | CYRUSDB_CREATE, &db,
                    &err), CYRUSDB_NOTFOUND);
    RC(cyrusdb_open(tc->backend, missing, 0, &db, &err), CYRUSDB_NOTFOUND);
    free(missing);
    db = tc_open(tc, made, CYRUSDB_CREATE);
    RC(cyrusdb_store(db, S("k"), S("v"), NULL), CYRUSDB_OK);
    tc_close(tc, &db);
    db = tc_open(tc, made, CYRUSDB_RDONLY);
    FETCH(db, S("k"), S("v"), NULL);
    WALK(db, NULL, 0, ((const struct rec[]){ REC("k", "v") }), 1, NULL);
}

/* Optimistic transactions: a commit whose reads changed meanwhile fails
 * with CYRUSDB_AGAIN and writes nothing; an unrelated change does not
 * disturb it.  Two handles of one process suffice: nothing is locked. */
static void case_remote_conflict(struct tcase *tc)
{
    const char *path = tc_file(tc, "conflict.db", tc->backend, 0);
    struct cyrusdb *a = tc_open(tc, path, CYRUSDB_CREATE);
    struct cyrusdb *b = tc_open(tc, path, 0);
    struct cyrusdb_txn *tid = NULL;
    static const struct rec base[] = { REC("k", "1"), REC("u", "x") };
    static const struct rec won[] = { REC("k", "b"), REC("u", "y") };
    static const struct rec walked[] = { REC("k", "b"), REC("p.1", "new"),
                                         REC("u", "y") };
    struct walk w;

    STORE_ALL(a, base, 2, NULL);
    /* a changed key that the transaction fetched */
    FETCH(a, S("k"), S("1"), &tid);
    RC(cyrusdb_store(a, S("k"), S("a"), &tid), CYRUSDB_OK);
    RC(cyrusdb_store(a, S("j"), S("side effect"), &tid), CYRUSDB_OK);
    RC(cyrusdb_store(b, S("k"), S("b"), NULL), CYRUSDB_OK);
    RC(cyrusdb_commit(a, tid), CYRUSDB_AGAIN);
    tid = NULL;
    FETCH(b, S("k"), S("b"), NULL);
    FETCH_NONE(b, S("j"), NULL);
    /* a key the transaction saw absent, created meanwhile */
    FETCH_NONE(a, S("n"), &tid);
    RC(cyrusdb_store(a, S("n"), S("a"), &tid), CYRUSDB_OK);
    RC(cyrusdb_create(b, S("n"), S("b"), NULL), CYRUSDB_OK);
    RC(cyrusdb_commit(a, tid), CYRUSDB_AGAIN);
    tid = NULL;
    FETCH(b, S("n"), S("b"), NULL);
    RC(cyrusdb_delete(b, S("n"), NULL, 0), CYRUSDB_OK);
    /* a key deleted meanwhile */
    FETCH(a, S("u"), S("x"), &tid);
    RC(cyrusdb_store(a, S("j"), S("side effect"), &tid), CYRUSDB_OK);
    RC(cyrusdb_delete(b, S("u"), NULL, 0), CYRUSDB_OK);
    RC(cyrusdb_commit(a, tid), CYRUSDB_AGAIN);
    tid = NULL;
    FETCH_NONE(b, S("j"), NULL);
    RC(cyrusdb_store(b, S("u"), S("y"), NULL), CYRUSDB_OK);
    /* a walk, and a key inserted into the walked range meanwhile */
    memset(&w, 0, sizeof(w));
    RC(cyrusdb_foreach(a, S("p."), NULL, walk_cb, &w, &tid), CYRUSDB_OK);
    assert_int_equal(w.n, 0);
    walk_free(&w);
    RC(cyrusdb_store(a, S("p.count"), S("0"), &tid), CYRUSDB_OK);
    RC(cyrusdb_store(b, S("p.1"), S("new"), NULL), CYRUSDB_OK);
    RC(cyrusdb_commit(a, tid), CYRUSDB_AGAIN);
    tid = NULL;
    WALK(b, NULL, 0, walked, 3, NULL);
    /* a change outside what the transaction read does not disturb it */
    RC(cyrusdb_delete(b, S("p.1"), NULL, 0), CYRUSDB_OK);
    FETCH(a, S("k"), S("b"), &tid);
    RC(cyrusdb_store(a, S("k"), S("b"), &tid), CYRUSDB_OK);
    RC(cyrusdb_store(b, S("other"), S("z"), NULL), CYRUSDB_OK);
    RC(cyrusdb_delete(b, S("other"), NULL, 0), CYRUSDB_OK);
    RC(cyrusdb_commit(a, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(b, NULL, 0, won, 2, NULL);
}

/* The comparison function itself (backend independent). */
static void case_compare(struct tcase *tc)
{
    static const char *const mbox_sorted[] = {
        "user.alice", "user.alice.Sent", "user.alice.Sent.x", "user.alice-x",
        "user.alice2", "user.alicf",
    };
    size_t i, j;

    (void)tc;
    for (i = 0; i < 6; i++) {
        for (j = 0; j < 6; j++) {
            int want = i < j ? -1 : i > j ? 1 : 0;
            int got = cyrusdb_compare(CYRUSDB_MBOXSORT, mbox_sorted[i], strlen(mbox_sorted[i]),
                                      mbox_sorted[j], strlen(mbox_sorted[j]));
            if ((got > 0) - (got < 0) != want)
                FAILF("cyrusdb_compare(MBOXSORT, %s, %s) = %d", mbox_sorted[i],
                      mbox_sorted[j], got);
        }
    }
    assert_true(cyrusdb_compare(0, S("user.alice-x"), S("user.alice.Sent")) < 0);
    assert_true(cyrusdb_compare(0, S("a"), S("a\0")) < 0);
    assert_true(cyrusdb_compare(0, S("a\0"), S("a\0b")) < 0);
    assert_true(cyrusdb_compare(0, S("a\0b"), S("ab")) < 0);
    assert_true(cyrusdb_compare(0, S("\x7f"), S("\x80")) < 0);
    assert_true(cyrusdb_compare(CYRUSDB_MBOXSORT, S("a."), S("a\0")) < 0);
    assert_true(cyrusdb_compare(CYRUSDB_MBOXSORT, S("\xff"), S("\xff.")) < 0);
    assert_int_equal(cyrusdb_compare(CYRUSDB_MBOXSORT, S("a.b"), S("a.b")), 0);
    assert_true(cyrusdb_has_prefix(S("user.alice.Sent"), S("user.alice.")));
    assert_false(cyrusdb_has_prefix(S("user.alice"), S("user.alice.")));
    assert_true(cyrusdb_has_prefix(S("x"), "", 0));
}

/* ---- the runner ---------------------------------------------------------- */

/* ---- CYRUSDB_NOSYNC ------------------------------------------------------- */

/* n records "TAG-NNNN" -> "value-NNNN" (keys in every order sorted). */
struct ns_recs {
    struct rec *recs;
    char (*keys)[24];
    char (*vals)[24];
    size_t n;
};

static void ns_recs_make(struct ns_recs *r, const char *tag, size_t n)
{
    size_t i;

    r->recs = test_xmalloc(n * sizeof(*r->recs));
    r->keys = test_xmalloc(n * sizeof(*r->keys));
    r->vals = test_xmalloc(n * sizeof(*r->vals));
    r->n = n;
    for (i = 0; i < n; i++) {
        r->recs[i].k = r->keys[i];
        r->recs[i].kl = (size_t)snprintf(r->keys[i], sizeof(r->keys[i]), "%s-%04zu", tag, i);
        r->recs[i].v = r->vals[i];
        r->recs[i].vl = (size_t)snprintf(r->vals[i], sizeof(r->vals[i]), "value-%04zu", i);
    }
}

static void ns_recs_free(struct ns_recs *r)
{
    free(r->recs);
    free(r->keys);
    free(r->vals);
}

/* Commits of a NOSYNC handle are seen at once by other handles and other
 * processes, durable or not, and mix with a durable handle's commits. */
static void case_nosync_visible(struct tcase *tc)
{
    static const struct rec final[] = {
        REC("a", "10"), REC("b", "durable"), REC("c", "3"), REC("d", "4"),
        REC("e", "nosync"),
    };
    const char *path = tc_file(tc, "nosync.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | CYRUSDB_NOSYNC);
    struct cyrusdb *other;
    struct cyrusdb_txn *tid = NULL;

    STORE_ALL(db, txn_base, 3, NULL);
    txn_changes(db, &tid);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    WALK(db, NULL, 0, txn_after, 3, NULL);
    READER_EXPECT(tc, path, 0, "durable reader after a NOSYNC commit",
                  txn_after, 3, txn_keys, NKEYS);
    READER_EXPECT(tc, path, CYRUSDB_NOSYNC, "NOSYNC reader after a NOSYNC commit",
                  txn_after, 3, txn_keys, NKEYS);
    /* a durable handle in this process: sees the commit; commits of the
     * two handles interleave (lmdb shares one environment between them) */
    other = tc_open(tc, path, 0);
    WALK(other, NULL, 0, txn_after, 3, NULL);
    RC(cyrusdb_store(other, S("b"), S("durable"), NULL), CYRUSDB_OK);
    FETCH(db, S("b"), S("durable"), NULL);
    RC(cyrusdb_store(db, S("e"), S("nosync"), &tid), CYRUSDB_OK);
    RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
    tid = NULL;
    FETCH(other, S("e"), S("nosync"), NULL);
    tc_close(tc, &other);
    READER_EXPECT(tc, path, 0, "reader after mixed commits", final, 5,
                  txn_keys, NKEYS);
    tc_close(tc, &db);
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, final, 5, NULL);
    CONSISTENT(tc, db);
}

/* A writer SIGKILLed right after its NOSYNC commits loses none of them
 * (they are in the page cache). */
static void case_nosync_killed(struct tcase *tc)
{
    const char *path = tc_file(tc, "killed.db", tc->backend, 0);
    struct ns_recs r;
    struct cyrusdb *db;
    char text[64];
    pid_t pid;
    int status, i;

    ns_recs_make(&r, "killed", 40);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        FAILF("fork: %s", strerror(errno));
    if (pid == 0) {
        struct cyrusdb *cdb = NULL;
        struct cyrusdb_txn *tid = NULL;
        size_t j;

        th_child_signals();
        alarm(60);
        if (cyrusdb_open(tc->backend, path, CYRUSDB_CREATE | CYRUSDB_NOSYNC,
                         &cdb, NULL) != CYRUSDB_OK)
            _exit(10);
        /* 30 commits of one write each, then one of 10 writes */
        for (j = 0; j < 30; j++)
            if (cyrusdb_store(cdb, r.recs[j].k, r.recs[j].kl, r.recs[j].v,
                              r.recs[j].vl, NULL) != CYRUSDB_OK)
                _exit(11);
        for (; j < r.n; j++)
            if (cyrusdb_store(cdb, r.recs[j].k, r.recs[j].kl, r.recs[j].v,
                              r.recs[j].vl, &tid) != CYRUSDB_OK)
                _exit(12);
        if (cyrusdb_commit(cdb, tid) != CYRUSDB_OK)
            _exit(13);
        kill(getpid(), SIGKILL);
        _exit(14);
    }
    for (i = 0; i < TEST_MAXPIDS; i++) {
        if (!tc->pids[i]) {
            tc->pids[i] = pid;
            break;
        }
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    for (i = 0; i < TEST_MAXPIDS; i++)
        if (tc->pids[i] == pid)
            tc->pids[i] = 0;
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
        FAILF("the writer should have been killed after its commits: %s",
              th_status_text(status, text, sizeof(text)));
    db = tc_open(tc, path, 0);
    WALK(db, NULL, 0, r.recs, r.n, NULL);
    CONSISTENT(tc, db);
    READER_EXPECT(tc, path, 0, "after the NOSYNC writer was killed", r.recs,
                  r.n, r.recs, 3);
    tc_close(tc, &db);
    /* and the file goes on taking NOSYNC writes */
    db = tc_open(tc, path, CYRUSDB_NOSYNC);
    RC(cyrusdb_store(db, S("after"), S("kill"), NULL), CYRUSDB_OK);
    FETCH(db, S("after"), S("kill"), NULL);
    RC(cyrusdb_delete(db, S("after"), NULL, 0), CYRUSDB_OK);
    WALK(db, NULL, 0, r.recs, r.n, NULL);
    ns_recs_free(&r);
}

/* checkpoint() works on a NOSYNC handle, before and after more writes. */
static void case_nosync_checkpoint(struct tcase *tc)
{
    const char *path = tc_file(tc, "nsckpt.db", tc->backend, 0);
    struct cyrusdb *db = tc_open(tc, path, CYRUSDB_CREATE | CYRUSDB_NOSYNC);
    struct cyrusdb_txn *tid = NULL;
    struct ns_recs r;
    size_t i;

    ns_recs_make(&r, "ckpt", 600);
    for (i = 0; i < r.n; i++) {
        RC(cyrusdb_store(db, r.recs[i].k, r.recs[i].kl, "old", 3, &tid), CYRUSDB_OK);
        RC(cyrusdb_store(db, r.recs[i].k, r.recs[i].kl, r.recs[i].v, r.recs[i].vl,
                         &tid), CYRUSDB_OK);
        if (i % 100 == 99) {
            RC(cyrusdb_commit(db, tid), CYRUSDB_OK);
            tid = NULL;
        }
    }
    /* deletes leave garbage for the checkpoint to drop */
    RC(cyrusdb_store(db, S("zz-gone"), S("x"), NULL), CYRUSDB_OK);
    RC(cyrusdb_delete(db, S("zz-gone"), NULL, 0), CYRUSDB_OK);
    RC(cyrusdb_checkpoint(db), CYRUSDB_OK);
    WALK(db, NULL, 0, r.recs, r.n, NULL);
    CONSISTENT(tc, db);
    /* writes after the checkpoint, then another one */
    RC(cyrusdb_delete(db, r.recs[0].k, r.recs[0].kl, NULL, 0), CYRUSDB_OK);
    RC(cyrusdb_checkpoint(db), CYRUSDB_OK);
    FETCH_NONE(db, r.recs[0].k, r.recs[0].kl, NULL);
    RC(cyrusdb_store(db, r.recs[0].k, r.recs[0].kl, r.recs[0].v, r.recs[0].vl,
                     NULL), CYRUSDB_OK);
    WALK(db, NULL, 0, r.recs, r.n, NULL);
    READER_EXPECT(tc, path, 0, "after a NOSYNC checkpoint", r.recs, r.n,
                  r.recs, 3);
    tc_close(tc, &db);
    db = tc_open(tc, path, CYRUSDB_NOSYNC);
    WALK(db, NULL, 0, r.recs, r.n, NULL);
    CONSISTENT(tc, db);
    ns_recs_free(&r);
}

/*
 * No fsync/fdatasync per commit: the commit loop runs in a child process
 * (this program re-executed with --commit-loop) under
 * `strace -f -c -e trace=<the sync calls>`, once with CYRUSDB_NOSYNC; once
 * without it, to show that the count sees syncs at all; and once with a
 * NOSYNC and a durable handle taking turns in one process, which must
 * cost what the durable commits alone cost (the flag belongs to the
 * handle, also where lmdb shares one environment).  Without
 * strace the loops still run and their data is checked; only the count is
 * skipped (with a message).
 */
#define NS_LOOP_COMMITS 200
#define NS_LOOP_MAX_SYNCS 10     /* open/close/recovery of the engines */
#define NS_SYNC_CALLS "trace=fsync,fdatasync,sync_file_range,msync,syncfs,sync"

static char *ns_find_strace(void)
{
    const char *path = getenv("PATH");
    char *copy, *dir, *save = NULL, *found = NULL;

    if (!path || !*path)
        path = "/usr/bin:/bin";
    copy = test_memdup(path, strlen(path));
    for (dir = strtok_r(copy, ":", &save); dir && !found;
         dir = strtok_r(NULL, ":", &save)) {
        char *p = th_path(*dir ? dir : ".", "strace");
        if (access(p, X_OK) == 0)
            found = p;
        else
            free(p);
    }
    free(copy);
    return found;
}

/* One commit of "KEY-NNNN" -> "value-NNNN" through db. */
static int ns_commit_one(struct cyrusdb *db, const char *tag, int i)
{
    struct cyrusdb_txn *tid = NULL;
    char key[32], val[32];
    int kl = snprintf(key, sizeof(key), "%s-%04d", tag, i);
    int vl = snprintf(val, sizeof(val), "value-%04d", i);
    int r = cyrusdb_store(db, key, (size_t)kl, val, (size_t)vl, &tid);

    if (r == CYRUSDB_OK)
        r = cyrusdb_commit(db, tid);
    else if (tid)
        cyrusdb_abort(db, tid);
    if (r != CYRUSDB_OK)
        fprintf(stderr, "commit loop: commit %s %d: %s\n", tag, i,
                cyrusdb_strerror(r));
    return r;
}

/* The child's side (argv: --commit-loop BACKEND PATH FLAGS N TAG): open,
 * N commits of one store each with keys "TAG-NNNN", close.  FLAGS -1:
 * two handles in this process, one with CYRUSDB_NOSYNC and one without,
 * taking turns (keys "TAG-n-NNNN" and "TAG-d-NNNN").  Exit status 0 when
 * all went well. */
static int ns_commit_loop(int argc, char **argv)
{
    struct cyrusdb *db = NULL, *durable = NULL;
    const char *err = NULL;
    char tag_n[24], tag_d[24];
    int flags, n, i, r, mixed;

    if (argc != 7)
        return 2;
    flags = atoi(argv[4]);
    n = atoi(argv[5]);
    mixed = flags == -1;
    log_init("test_cyrusdb", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    r = cyrusdb_open(argv[2], argv[3], mixed ? CYRUSDB_NOSYNC : flags, &db, &err);
    if (r == CYRUSDB_OK && mixed)
        r = cyrusdb_open(argv[2], argv[3], 0, &durable, &err);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "commit loop: open: %s\n", err ? err : cyrusdb_strerror(r));
        return 3;
    }
    snprintf(tag_n, sizeof(tag_n), "%s-n", argv[6]);
    snprintf(tag_d, sizeof(tag_d), "%s-d", argv[6]);
    for (i = 0; i < n; i++) {
        if (ns_commit_one(db, mixed ? tag_n : argv[6], i) != CYRUSDB_OK)
            return 4;
        if (mixed && ns_commit_one(durable, tag_d, i) != CYRUSDB_OK)
            return 4;
    }
    if (mixed && cyrusdb_close(&durable) != CYRUSDB_OK)
        return 5;
    return cyrusdb_close(&db) == CYRUSDB_OK ? 0 : 5;
}

/* Sum the "calls" column of strace -c output (strace leaves the file
 * empty when no traced call was made); -1 when it is missing. */
static long ns_parse_strace(const char *file)
{
    FILE *f = fopen(file, "r");
    char line[256];
    long total = 0;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        char *tok[8], *save = NULL, *t;
        int nt = 0;

        for (t = strtok_r(line, " \t\n", &save); t && nt < 8;
             t = strtok_r(NULL, " \t\n", &save))
            tok[nt++] = t;
        if (nt >= 5 && nt <= 6 && strcmp(tok[nt - 1], "total") != 0 &&
            strspn(tok[0], "0123456789.") == strlen(tok[0]))
            total += atol(tok[3]);
    }
    fclose(f);
    return total;
}

/* Run the commit loop (under strace when given); the number of sync calls,
 * or -1 without strace. */
static long ns_run_loop(struct tcase *tc, const char *strace, const char *exe,
                        const char *path, int flags, const char *tag)
{
    char *out = th_path(tc->dir, tag);
    char flagstr[16], nstr[16], text[64];
    long count = -1;
    pid_t pid;
    int status, i;

    snprintf(flagstr, sizeof(flagstr), "%d", flags);
    snprintf(nstr, sizeof(nstr), "%d", NS_LOOP_COMMITS);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        FAILF("fork: %s", strerror(errno));
    if (pid == 0) {
        th_child_signals();
        if (strace) {
            /* LeakSanitizer cannot run under ptrace (sanitizer builds) */
            const char *old = getenv("ASAN_OPTIONS");
            char opts[1024];

            snprintf(opts, sizeof(opts), "%s%sdetect_leaks=0", old ? old : "",
                     old && *old ? ":" : "");
            setenv("ASAN_OPTIONS", opts, 1);
        }
        if (strace)
            execl(strace, "strace", "-f", "-qq", "-c", "-e", NS_SYNC_CALLS,
                  "-o", out, exe, "--commit-loop", tc->backend, path, flagstr,
                  nstr, tag, (char *)NULL);
        else
            execl(exe, exe, "--commit-loop", tc->backend, path, flagstr, nstr,
                  tag, (char *)NULL);
        _exit(127);
    }
    for (i = 0; i < TEST_MAXPIDS; i++) {
        if (!tc->pids[i]) {
            tc->pids[i] = pid;
            break;
        }
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    for (i = 0; i < TEST_MAXPIDS; i++)
        if (tc->pids[i] == pid)
            tc->pids[i] = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        FAILF("commit loop (%s, flags 0x%x) failed: %s", tag, (unsigned)flags,
              th_status_text(status, text, sizeof(text)));
    if (strace) {
        count = ns_parse_strace(out);
        if (count < 0)
            FAILF("cannot read the strace summary %s", out);
    }
    free(out);
    return count;
}

static void case_nosync_syncs(struct tcase *tc)
{
    const char *path = tc_file(tc, "syncs.db", tc->backend, 0);
    char *strace = ns_find_strace();
    char exe[4096];
    ssize_t len;
    struct cyrusdb *db;
    struct ns_recs a, b;
    long nosync, durable = -1, mixed = -1;
    int nosync_variant = (tc->entry->variant & CYRUSDB_VARIANT_NOSYNC) != 0;
    size_t i;

    len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (len <= 0)
        FAILF("readlink /proc/self/exe: %s", strerror(errno));
    exe[len] = '\0';
    /* the file exists before the counted runs: creation syncs once */
    db = tc_open(tc, path, CYRUSDB_CREATE);
    RC(cyrusdb_store(db, S("created"), S("1"), NULL), CYRUSDB_OK);
    tc_close(tc, &db);

    nosync = ns_run_loop(tc, strace, exe, path, CYRUSDB_NOSYNC, "nosync");
    if (!nosync_variant) {
        durable = ns_run_loop(tc, strace, exe, path, 0, "durable");
        /* a NOSYNC and a durable handle in one process (lmdb: one shared
         * environment) each keep their own behaviour */
        mixed = ns_run_loop(tc, strace, exe, path, -1, "mixed");
    } else {
        (void)ns_run_loop(tc, NULL, exe, path, 0, "durable");
    }

    /* every commit of both loops is there */
    ns_recs_make(&a, "nosync", NS_LOOP_COMMITS);
    ns_recs_make(&b, "durable", NS_LOOP_COMMITS);
    db = tc_open(tc, path, 0);
    for (i = 0; i < NS_LOOP_COMMITS; i++) {
        FETCH(db, a.recs[i].k, a.recs[i].kl, a.recs[i].v, a.recs[i].vl, NULL);
        FETCH(db, b.recs[i].k, b.recs[i].kl, b.recs[i].v, b.recs[i].vl, NULL);
    }
    ns_recs_free(&a);
    ns_recs_free(&b);
    if (!nosync_variant) {
        ns_recs_make(&a, "mixed-n", NS_LOOP_COMMITS);
        ns_recs_make(&b, "mixed-d", NS_LOOP_COMMITS);
        for (i = 0; i < NS_LOOP_COMMITS; i++) {
            FETCH(db, a.recs[i].k, a.recs[i].kl, a.recs[i].v, a.recs[i].vl, NULL);
            FETCH(db, b.recs[i].k, b.recs[i].kl, b.recs[i].v, b.recs[i].vl, NULL);
        }
        ns_recs_free(&a);
        ns_recs_free(&b);
    }
    CONSISTENT(tc, db);

    if (!strace) {
        print_message("nosync_syncs/%s: strace not found in PATH: the sync "
                      "count is not checked (the loops ran and their data is "
                      "there)\n", tc->backend);
        return;
    }
    print_message("nosync_syncs/%s: %d commits: %ld sync calls with "
                  "CYRUSDB_NOSYNC, %ld without, %ld for both handles "
                  "taking turns in one process%s\n", tc->backend,
                  NS_LOOP_COMMITS, nosync, durable, mixed,
                  nosync_variant ? " (not counted: a no-sync variant)" : "");
    free(strace);
    if (nosync > NS_LOOP_MAX_SYNCS)
        FAILF("%d NOSYNC commits issued %ld sync calls (at most %d expected: "
              "none per commit)", NS_LOOP_COMMITS, nosync, NS_LOOP_MAX_SYNCS);
    if (!nosync_variant && durable < NS_LOOP_COMMITS)
        FAILF("%d durable commits issued only %ld sync calls: the count "
              "does not see the syncs", NS_LOOP_COMMITS, durable);
    if (!nosync_variant && mixed < NS_LOOP_COMMITS)
        FAILF("a durable handle beside a NOSYNC one in the same process "
              "issued %ld sync calls for %d commits: it lost its durability",
              mixed, NS_LOOP_COMMITS);
    if (!nosync_variant && mixed > durable + NS_LOOP_MAX_SYNCS)
        FAILF("%d NOSYNC commits taking turns with durable ones added "
              "%ld sync calls", NS_LOOP_COMMITS, mixed - durable);
}

static const struct case_def test_cases[] = {
    { "compare", case_compare, 1, CASE_ALL },
    { "crud", case_crud, 0, CASE_ALL },
    { "binary_keys", case_binary_keys, 0, CASE_ALL },
    { "key_limits", case_key_limits, 0, CASE_ALL },
    { "empty_values", case_empty_values, 0, CASE_ALL },
    { "big_value", case_big_value, 0, CASE_ALL },
    { "many_keys", case_many_keys, 0, CASE_ALL },
    { "prefix_walk", case_prefix_walk, 0, CASE_ALL },
    { "walk_stop_filter", case_walk_stop_filter, 0, CASE_ALL },
    { "commit", case_commit, 0, CASE_ALL },
    { "abort", case_abort, 0, CASE_ALL },
    { "isolation", case_isolation, 0, CASE_ALL },
    { "txn_misuse", case_txn_misuse, 0, CASE_ALL },
    { "create_exists", case_create_exists, 0, CASE_ALL },
    { "delete_missing", case_delete_missing, 0, CASE_ALL },
    { "foreach_modify", case_foreach_modify, 0, CASE_ALL },
    { "fetchlock", case_fetchlock, 0, CASE_ALL },
    { "open_missing", case_open_missing, 0, CASE_FILES },
    { "empty_file", case_empty_file, 0, CASE_FILES },
    { "readonly", case_readonly, 0, CASE_FILES },
    { "bad_format", case_bad_format, 0, CASE_FILES },
    { "detect", case_detect, 0, CASE_FILES },
    { "checkpoint", case_checkpoint, 0, CASE_ALL },
    { "dump", case_dump, 0, CASE_ALL },
    { "random_ops", case_random_ops, 0, CASE_ALL },
    { "other_writer", case_other_writer, 0, CASE_ALL },
    { "data_stable", case_data_stable, 0, CASE_ALL },
    { "read_begins_txn", case_read_begins_txn, 0, CASE_ALL },
    { "nosync_visible", case_nosync_visible, 0, CASE_ALL },
    { "nosync_killed", case_nosync_killed, 0, CASE_ALL },
    { "nosync_checkpoint", case_nosync_checkpoint, 0, CASE_ALL },
    { "nosync_syncs", case_nosync_syncs, 0, CASE_FILES },
    { "remote_open", case_remote_open, 0, CASE_REMOTE },
    { "remote_conflict", case_remote_conflict, 0, CASE_REMOTE },
};

static const char *test_current;

static void test_on_alarm(int sig)
{
    static const char msg1[] = "\ntest_cyrusdb: timeout in ";
    (void)sig;
    if (write(2, msg1, sizeof(msg1) - 1) < 0 || !test_current ||
        write(2, test_current, strlen(test_current)) < 0 || write(2, "\n", 1) < 0)
        _exit(2);
    _exit(2);
}

static int test_setup(void **state)
{
    const struct param *p = *state;
    struct tcase *tc = calloc(1, sizeof(*tc));

    if (!tc)
        return -1;
    tc->def = p->def;
    tc->backend = p->backend;
    tc->entry = cyrusdb_lookup(p->backend);
    if (!tc->entry) {
        print_error("unknown backend %s in $TEST_BACKENDS\n", p->backend);
        free(tc);
        return -1;
    }
    tc->dir = th_mkdtemp("conf");
    *state = tc;
    test_current = p->name;
    alarm(300);
    return 0;
}

static void test_run(void **state)
{
    struct tcase *tc = *state;
    tc->def->fn(tc);
}

static int test_teardown(void **state)
{
    struct tcase *tc = *state;
    int i, failed = 0;

    alarm(0);
    for (i = 0; i < TEST_MAXPIDS; i++) {
        if (tc->pids[i] > 0) {
            int status;
            kill(tc->pids[i], SIGKILL);
            while (waitpid(tc->pids[i], &status, 0) < 0 && errno == EINTR)
                ;
        }
    }
    for (i = 0; i < TEST_MAXHANDLES; i++)
        if (tc->handles[i])
            cyrusdb_close(&tc->handles[i]);
    /* every file the case wrote must still be consistent */
    for (i = 0; i < tc->nfiles; i++) {
        struct cyrusdb *db = NULL;
        const char *err = NULL;
        struct stat st;
        int r;

        if (tc->files[i].written && stat(tc->files[i].path, &st) == 0) {
            r = cyrusdb_open(tc->files[i].backend, tc->files[i].path,
                             tc->files[i].flags, &db, &err);
            if (r == CYRUSDB_OK) {
                r = cyrusdb_consistent(db);
                cyrusdb_close(&db);
                if (r != CYRUSDB_OK) {
                    print_error("teardown: %s: consistent returned %d (%s)\n",
                                tc->files[i].path, r, cyrusdb_strerror(r));
                    failed = 1;
                }
            } else {
                print_error("teardown: %s: reopen as %s returned %d (%s): %s\n",
                            tc->files[i].path, tc->files[i].backend, r,
                            cyrusdb_strerror(r), err ? err : "");
                failed = 1;
            }
        }
        free(tc->files[i].path);
    }
    if (!failed)
        th_rmrf(tc->dir);
    else
        print_error("teardown: files kept in %s\n", tc->dir);
    free(tc->dir);
    free(tc);
    return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *const *backends;
    const size_t ncases = sizeof(test_cases) / sizeof(test_cases[0]);
    struct CMUnitTest *tests;
    struct param *params;
    size_t nb = 0, i, j, n = 0;
    int rc;

    /* the child side of case_nosync_syncs */
    if (argc > 1 && !strcmp(argv[1], "--commit-loop"))
        return ns_commit_loop(argc, argv);
    backends = th_backends();
    log_init("test_cyrusdb", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    signal(SIGALRM, test_on_alarm);
    signal(SIGPIPE, SIG_IGN);
    while (backends[nb])
        nb++;
    tests = calloc(ncases * (nb + 1), sizeof(*tests));
    params = calloc(ncases * (nb + 1), sizeof(*params));
    if (!tests || !params)
        return 1;
    for (i = 0; i < ncases; i++) {
        for (j = 0; j < (test_cases[i].once ? 1 : nb); j++) {
            const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backends[j]);
            char *name;

            if (!test_cases[i].once && e &&
                ((e->nofile && test_cases[i].where == CASE_FILES) ||
                 (!e->nofile && test_cases[i].where == CASE_REMOTE)))
                continue;   /* not about this kind of backend */
            params[n].def = &test_cases[i];
            params[n].backend = test_cases[i].once ? (nb ? backends[0] : "flat")
                                                   : backends[j];
            if (asprintf(&name, "%s/%s", test_cases[i].name,
                         test_cases[i].once ? "all" : backends[j]) < 0)
                return 1;
            tests[n].name = name;
            params[n].name = name;
            tests[n].test_func = test_run;
            tests[n].setup_func = test_setup;
            tests[n].teardown_func = test_teardown;
            tests[n].initial_state = &params[n];
            n++;
        }
    }
    rc = _cmocka_run_group_tests("cyrusdb conformance", tests, n, NULL, NULL);
    for (i = 0; i < n; i++)
        free((char *)tests[i].name);
    free(tests);
    free(params);
    return rc;
}
