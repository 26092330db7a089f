/*
 * test_convert.c - converting a database from one backend to another
 * through the public API, for every ordered pair of backends (same -> same
 * included; th_backends(), narrowed by $TEST_BACKENDS).
 *
 * The conversion is the one a converter tool performs: walk the source with
 * cyrusdb_foreach() (tid NULL) and store every record into the target
 * inside one transaction, committed at the end.  The source holds awkward
 * records: NUL and escape-worthy bytes in keys and values, empty values, a
 * 1 MiB value, the longest key, and mailbox names whose order differs
 * between plain and CYRUSDB_MBOXSORT order.  Each pair is converted A -> B
 * -> A in both sort orders; the target walks must equal the expected,
 * independently sorted record list, and A -> B -> A must equal A.
 */
#include "config.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/log.h"
#include "tests/testhelp.h"

struct rec {
    const char *k;
    size_t kl;
    const char *v;
    size_t vl;
};

#define REC(key, val) { (key), sizeof(key) - 1, (val), sizeof(val) - 1 }

/* The fixed awkward records; a 1 MiB value, the 511-byte key and the
 * single-byte keys are added by cvt_records(). */
static const struct rec cvt_fixed[] = {
    REC("user.alice", "mailbox"),
    REC("user.alice.Sent", "child"),
    REC("user.alice.Sent.2024", "grandchild"),
    REC("user.alice-x", "sibling with a dash"),
    REC("user.alice2", "sibling with a digit"),
    REC("user.alice_y", "sibling with an underscore"),
    REC("user.alicf", "next name"),
    REC("user.bob", ""),
    REC("a", "plain"),
    REC("a\0", "nul at the end of the key"),
    REC("a\0b", "nul\0inside\0the\0value"),
    REC("a\0\0", "\0"),
    REC("\0", "\0\0"),
    REC("\0x", ""),
    REC("tab\tkey", "tab\tvalue"),
    REC("newline\nkey", "line\nbreaks\r\n"),
    REC("back\\slash", "\\x00 is not a NUL"),
    REC("\x7f\x80\xff", "\xff\xfe\xfd"),
    REC("empty", ""),
    REC("spaces in key ", " spaces in value "),
};
#define NFIXED (sizeof(cvt_fixed) / sizeof(cvt_fixed[0]))
#define NRECS (NFIXED + 3 + 20)

static void cvt_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

static void cvt_fail_at(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vprint_error(fmt, ap);
    va_end(ap);
    print_error("\n");
    _fail(file, line);
    abort();
}

#define FAILF(...) cvt_fail_at(__FILE__, __LINE__, __VA_ARGS__)

static const char *cvt_show(const char *s, size_t len)
{
    static char bufs[2][160];
    static int which;
    char *out = bufs[which++ & 1];
    size_t i, o = 0;

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

static int cvt_sortflags;

static int cvt_qsort_cmp(const void *pa, const void *pb)
{
    const struct rec *a = pa, *b = pb;
    return th_ref_compare(cvt_sortflags, a->k, a->kl, b->k, b->kl);
}

/* Storage for the generated records. */
struct cvt_data {
    struct rec recs[NRECS];
    size_t n;
    char *big;
    char longkey[511];
    char single[20][2];
    char singleval[20][4];
};

static void cvt_records(struct cvt_data *d, int flags)
{
    const size_t mib = (size_t)1 << 20;
    size_t i;

    memset(d, 0, sizeof(*d));
    for (i = 0; i < NFIXED; i++)
        d->recs[d->n++] = cvt_fixed[i];
    d->big = malloc(mib);
    assert_non_null(d->big);
    th_fill(d->big, mib, 99);
    d->recs[d->n].k = "big";
    d->recs[d->n].kl = 3;
    d->recs[d->n].v = d->big;
    d->recs[d->n].vl = mib;
    d->n++;
    th_fill(d->longkey, sizeof(d->longkey), 7);
    memcpy(d->longkey, "long.", 5);
    d->recs[d->n].k = d->longkey;
    d->recs[d->n].kl = sizeof(d->longkey);
    d->recs[d->n].v = "longest key";
    d->recs[d->n].vl = 11;
    d->n++;
    d->recs[d->n].k = "user.alice.Trash";
    d->recs[d->n].kl = 16;
    d->recs[d->n].v = d->big + 1000;     /* a value with arbitrary bytes */
    d->recs[d->n].vl = 4000;
    d->n++;
    /* single-byte keys around the interesting bytes */
    for (i = 0; i < 20; i++) {
        static const unsigned char bytes[20] = {
            0x01, 0x09, 0x0a, 0x0d, 0x1f, 0x20, 0x2d, 0x2e, 0x2f, 0x30,
            0x5c, 0x5f, 0x7e, 0x7f, 0x80, 0xc3, 0xfe, 0xff, 0x3d, 0x22,
        };
        d->single[i][0] = (char)bytes[i];
        d->singleval[i][0] = (char)bytes[i];
        d->singleval[i][1] = '\0';
        d->singleval[i][2] = (char)~bytes[i];
        d->recs[d->n].k = d->single[i];
        d->recs[d->n].kl = 1;
        d->recs[d->n].v = d->singleval[i];
        d->recs[d->n].vl = 3;
        d->n++;
    }
    assert_int_equal(d->n, NRECS);
    cvt_sortflags = flags;
    qsort(d->recs, d->n, sizeof(d->recs[0]), cvt_qsort_cmp);
    for (i = 1; i < d->n; i++)
        assert_true(th_ref_compare(flags, d->recs[i - 1].k, d->recs[i - 1].kl,
                            d->recs[i].k, d->recs[i].kl) < 0);
}

/* ---- the conversion ------------------------------------------------------ */

struct cvt_rock {
    struct cyrusdb *dst;
    struct cyrusdb_txn **tid;
    size_t n;
    int r;
};

static int cvt_store_cb(void *rock, const char *key, size_t keylen,
                        const char *data, size_t datalen)
{
    struct cvt_rock *cr = rock;
    int r = cyrusdb_store(cr->dst, key, keylen, data, datalen, cr->tid);

    if (r != CYRUSDB_OK) {
        cr->r = r;
        return r;
    }
    cr->n++;
    return 0;
}

/* Copy every record of src into dst in one transaction.  Returns the
 * number of records copied, or fails the test. */
static size_t cvt_convert_at(const char *file, int line,
                             struct cyrusdb *src, struct cyrusdb *dst)
{
    struct cyrusdb_txn *tid = NULL;
    struct cvt_rock cr = { dst, &tid, 0, CYRUSDB_OK };
    int r;

    r = cyrusdb_foreach(src, NULL, 0, NULL, cvt_store_cb, &cr, NULL);
    if (r != CYRUSDB_OK || cr.r != CYRUSDB_OK) {
        if (tid)
            cyrusdb_abort(dst, tid);
        cvt_fail_at(file, line, "conversion walk returned %d (%s), store %d (%s)",
                    r, cyrusdb_strerror(r), cr.r, cyrusdb_strerror(cr.r));
    }
    if (tid) {
        r = cyrusdb_commit(dst, tid);
        if (r != CYRUSDB_OK)
            cvt_fail_at(file, line, "conversion commit returned %d (%s)",
                        r, cyrusdb_strerror(r));
    } else if (cr.n) {
        cvt_fail_at(file, line, "records were stored but no transaction came back");
    }
    return cr.n;
}

#define CONVERT(src, dst) cvt_convert_at(__FILE__, __LINE__, (src), (dst))

/* ---- checking a database against the expected records ---------------------- */

struct cvt_walk {
    const struct rec *want;
    size_t nwant;
    size_t n;
    char what[400];
};

static int cvt_check_cb(void *rock, const char *key, size_t keylen,
                        const char *data, size_t datalen)
{
    struct cvt_walk *w = rock;
    const struct rec *e;

    if (w->what[0])
        return 0;
    if (w->n >= w->nwant) {
        snprintf(w->what, sizeof(w->what), "extra record <%s>", cvt_show(key, keylen));
        return 0;
    }
    e = &w->want[w->n];
    if (keylen != e->kl || memcmp(key, e->k, keylen)) {
        snprintf(w->what, sizeof(w->what), "record %zu has key <%s>, expected <%s>",
                 w->n, cvt_show(key, keylen), cvt_show(e->k, e->kl));
        return 0;
    }
    if (datalen != e->vl || (datalen && (!data || memcmp(data, e->v, datalen)))) {
        snprintf(w->what, sizeof(w->what), "key <%s>: value of %zu bytes <%s>, "
                 "expected %zu bytes <%s>", cvt_show(key, keylen), datalen,
                 data ? cvt_show(data, datalen) : "(null)", e->vl,
                 cvt_show(e->v, e->vl));
        return 0;
    }
    w->n++;
    return 0;
}

static void cvt_expect_at(const char *file, int line, struct cyrusdb *db,
                          const char *label, const struct rec *want, size_t nwant)
{
    struct cvt_walk w;
    size_t i;
    int r;

    memset(&w, 0, sizeof(w));
    w.want = want;
    w.nwant = nwant;
    r = cyrusdb_foreach(db, NULL, 0, NULL, cvt_check_cb, &w, NULL);
    if (r != CYRUSDB_OK)
        cvt_fail_at(file, line, "%s: foreach returned %d (%s)", label, r,
                    cyrusdb_strerror(r));
    if (w.what[0])
        cvt_fail_at(file, line, "%s: %s", label, w.what);
    if (w.n != nwant)
        cvt_fail_at(file, line, "%s: %zu records, expected %zu", label, w.n, nwant);
    /* and each one by fetch */
    for (i = 0; i < nwant; i++) {
        const char *data = NULL;
        size_t len = 0;
        r = cyrusdb_fetch(db, want[i].k, want[i].kl, &data, &len, NULL);
        if (r != CYRUSDB_OK || len != want[i].vl ||
            (len && memcmp(data, want[i].v, len)))
            cvt_fail_at(file, line, "%s: fetch <%s> returned %d, %zu bytes",
                        label, cvt_show(want[i].k, want[i].kl), r,
                        r == CYRUSDB_OK ? len : 0);
    }
    r = cyrusdb_consistent(db);
    if (r != CYRUSDB_OK)
        cvt_fail_at(file, line, "%s: consistent returned %d (%s)", label, r,
                    cyrusdb_strerror(r));
}

#define EXPECT_DB(db, label, want, n) \
    cvt_expect_at(__FILE__, __LINE__, (db), (label), (want), (n))

/* ---- the test ------------------------------------------------------------ */

struct cvt_pair {
    const char *from;
    const char *to;
    char *name;
};

struct cvt_state {
    const struct cvt_pair *pair;
    char *dir;
    struct cyrusdb *dbs[3];
    struct cvt_data data;
};

static struct cyrusdb *cvt_open_at(const char *file, int line, struct cvt_state *st,
                                   int slot, const char *backend,
                                   const char *path, int flags)
{
    const char *err = NULL;
    int r = cyrusdb_open(backend, path, flags, &st->dbs[slot], &err);

    if (r != CYRUSDB_OK)
        cvt_fail_at(file, line, "open %s as %s: %d (%s): %s", path, backend, r,
                    cyrusdb_strerror(r), err ? err : "");
    return st->dbs[slot];
}

#define OPEN(st, slot, be, path, flags) \
    cvt_open_at(__FILE__, __LINE__, (st), (slot), (be), (path), (flags))

static void cvt_close(struct cvt_state *st, int slot)
{
    int r = cyrusdb_close(&st->dbs[slot]);
    if (r != CYRUSDB_OK)
        FAILF("close: %d (%s)", r, cyrusdb_strerror(r));
}

static void cvt_detect_at(const char *file, int line, const char *path,
                          const char *backend)
{
    const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backend);
    const char *fmt = NULL;
    int r = cyrusdb_detect(path, &fmt);

    if (r != CYRUSDB_OK || !e || strcmp(fmt, e->format))
        cvt_fail_at(file, line, "detect %s: %d (%s), format %s, expected %s",
                    path, r, cyrusdb_strerror(r), fmt ? fmt : "-",
                    e ? e->format : "?");
}

#define DETECT(path, be) cvt_detect_at(__FILE__, __LINE__, (path), (be))

static void test_convert_pair(void **state)
{
    struct cvt_state *st = *state;
    const char *a = st->pair->from, *b = st->pair->to;
    int f;

    for (f = 0; f < 2; f++) {
        const int flags = f ? CYRUSDB_MBOXSORT : 0;
        char name[64];
        char *pa, *pb, *pa2, *pe, *pe2;
        struct cyrusdb *src, *dst, *back;
        struct cyrusdb_txn *tid = NULL;
        size_t i;

        cvt_records(&st->data, flags);
        snprintf(name, sizeof(name), "src-%d.db", f);
        pa = th_path(st->dir, name);
        snprintf(name, sizeof(name), "dst-%d.db", f);
        pb = th_path(st->dir, name);
        snprintf(name, sizeof(name), "back-%d.db", f);
        pa2 = th_path(st->dir, name);
        snprintf(name, sizeof(name), "empty-%d.db", f);
        pe = th_path(st->dir, name);
        snprintf(name, sizeof(name), "empty-dst-%d.db", f);
        pe2 = th_path(st->dir, name);

        /* fill the source in scrambled order, in one transaction */
        src = OPEN(st, 0, a, pa, CYRUSDB_CREATE | flags);
        for (i = 0; i < st->data.n; i++) {
            const struct rec *r = &st->data.recs[(i * 7) % st->data.n];
            int rc = cyrusdb_store(src, r->k, r->kl, r->v, r->vl, &tid);
            if (rc != CYRUSDB_OK)
                FAILF("fill %s: store <%s>: %d (%s)", a, cvt_show(r->k, r->kl),
                      rc, cyrusdb_strerror(rc));
        }
        assert_int_equal(NRECS % 7 != 0, 1);   /* (i * 7) % n is a permutation */
        assert_int_equal(cyrusdb_commit(src, tid), CYRUSDB_OK);
        EXPECT_DB(src, "source", st->data.recs, st->data.n);

        /* A -> B */
        dst = OPEN(st, 1, b, pb, CYRUSDB_CREATE | flags);
        assert_int_equal(CONVERT(src, dst), st->data.n);
        EXPECT_DB(dst, "converted", st->data.recs, st->data.n);
        cvt_close(st, 1);
        DETECT(pb, b);
        /* B -> A, from a fresh handle on the converted file */
        dst = OPEN(st, 1, b, pb, flags);
        back = OPEN(st, 2, a, pa2, CYRUSDB_CREATE | flags);
        assert_int_equal(CONVERT(dst, back), st->data.n);
        cvt_close(st, 2);
        cvt_close(st, 1);
        back = OPEN(st, 2, a, pa2, flags);
        EXPECT_DB(back, "converted back", st->data.recs, st->data.n);
        DETECT(pa2, a);
        /* the source was left alone */
        EXPECT_DB(src, "source after conversion", st->data.recs, st->data.n);
        cvt_close(st, 2);
        cvt_close(st, 0);

        /* an empty database converts to an empty database */
        src = OPEN(st, 0, a, pe, CYRUSDB_CREATE | flags);
        dst = OPEN(st, 1, b, pe2, CYRUSDB_CREATE | flags);
        assert_int_equal(CONVERT(src, dst), 0);
        EXPECT_DB(dst, "converted empty", NULL, 0);
        cvt_close(st, 1);
        cvt_close(st, 0);
        dst = OPEN(st, 1, b, pe2, flags);
        EXPECT_DB(dst, "converted empty, reopened", NULL, 0);
        cvt_close(st, 1);

        free(st->data.big);
        st->data.big = NULL;
        free(pa);
        free(pb);
        free(pa2);
        free(pe);
        free(pe2);
    }
}

static int cvt_setup(void **state)
{
    struct cvt_state *st = calloc(1, sizeof(*st));

    if (!st)
        return -1;
    st->pair = *state;
    if (!cyrusdb_lookup(st->pair->from) || !cyrusdb_lookup(st->pair->to)) {
        print_error("unknown backend in $TEST_BACKENDS\n");
        free(st);
        return -1;
    }
    st->dir = th_mkdtemp("cvt");
    *state = st;
    alarm(300);
    return 0;
}

static int cvt_teardown(void **state)
{
    struct cvt_state *st = *state;
    int i;

    alarm(0);
    for (i = 0; i < 3; i++)
        if (st->dbs[i])
            cyrusdb_close(&st->dbs[i]);
    free(st->data.big);
    th_rmrf(st->dir);
    free(st->dir);
    free(st);
    return 0;
}

int main(void)
{
    const char *const *backends = th_backends();
    struct CMUnitTest *tests;
    struct cvt_pair *pairs;
    size_t nb = 0, i, j, n = 0;
    int rc;

    log_init("test_convert", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    while (backends[nb])
        nb++;
    tests = calloc(nb * nb + 1, sizeof(*tests));
    pairs = calloc(nb * nb + 1, sizeof(*pairs));
    if (!tests || !pairs)
        return 1;
    for (i = 0; i < nb; i++) {
        for (j = 0; j < nb; j++) {
            pairs[n].from = backends[i];
            pairs[n].to = backends[j];
            if (asprintf(&pairs[n].name, "convert/%s->%s", backends[i], backends[j]) < 0)
                return 1;
            tests[n].name = pairs[n].name;
            tests[n].test_func = test_convert_pair;
            tests[n].setup_func = cvt_setup;
            tests[n].teardown_func = cvt_teardown;
            tests[n].initial_state = &pairs[n];
            n++;
        }
    }
    rc = _cmocka_run_group_tests("cyrusdb conversion", tests, n, NULL, NULL);
    for (i = 0; i < n; i++)
        free(pairs[i].name);
    free(tests);
    free(pairs);
    return rc;
}
