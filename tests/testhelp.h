/*
 * testhelp.h - helpers shared by the cmocka test programs.
 */
#ifndef TESTS_TESTHELP_H
#define TESTS_TESTHELP_H

#include <stddef.h>

/* A fresh empty directory under $TEST_TMPDIR (default: tests/tmp in the
 * build tree, i.e. on the real disk, not tmpfs).  The caller frees the
 * string; th_rmrf() removes the tree. */
char *th_mkdtemp(const char *tag);

/* Remove a directory tree (like rm -rf). */
void th_rmrf(const char *path);

/* dir + "/" + name, malloc'd. */
char *th_path(const char *dir, const char *name);

/* The backend names every conformance case runs against, NULL-terminated:
 * the distinct rows of the cyrusdb registry (aliases such as "berkeley"
 * left out).  $TEST_BACKENDS (space-separated) narrows the list. */
const char *const *th_backends(void);

/* Fill buf with len deterministic pseudo-random bytes from seed. */
void th_fill(void *buf, size_t len, unsigned seed);

/* The documented key order, written independently of cyrusdb.c so that
 * the suites check the backends against the contract, not against the
 * code: bytes compare unsigned; with CYRUSDB_MBOXSORT '.' ranks below every
 * other byte; a proper prefix sorts first. */
int th_ref_compare(int flags, const char *a, size_t alen,
                   const char *b, size_t blen);

/* Monotonic time in seconds. */
double th_now(void);

/* Sleep `us` microseconds (monotonic clock; resumed after signals). */
void th_sleep_us(double us);

/* The median of v[0..n-1] (n > 0; v is left as it was): the measure the
 * crash tests scale their kill delays by, so that one slow or fast
 * sample does not move the whole schedule. */
double th_median(const double *v, size_t n);

/* The most recent TH_TIMING_SAMPLES durations of one kind (an open, a
 * commit), measured while a test runs: a schedule that scales by their
 * median follows the machine when its load changes. */
#define TH_TIMING_SAMPLES 9
struct th_timing {
    double v[TH_TIMING_SAMPLES];
    size_t n, next;
};
#define TH_TIMING_INIT { { 0 }, 0, 0 }
void th_timing_add(struct th_timing *t, double seconds);
double th_timing_median(const struct th_timing *t);   /* 0 while empty */

/* The stretch of a kill schedule: the factor its delays (already scaled
 * by measured durations) are multiplied by, so that kills keep landing on
 * both sides of the event the test is about (inside the first open, or
 * after it) whatever the speed of the machine does during the run.
 * th_stretch_note() records on which side a kill landed; every
 * TH_STRETCH_BLOCK kills, the factor doubles when fewer than a tenth of
 * the last 2 * TH_STRETCH_BLOCK landed after the event, and halves when
 * fewer than a tenth landed before it (between 1/1024 and 1024). */
#define TH_STRETCH_BLOCK 10
struct th_stretch {
    double factor;
    unsigned before[2], after[2], n;
};
#define TH_STRETCH_INIT { 1.0, { 0, 0 }, { 0, 0 }, 0 }
void th_stretch_note(struct th_stretch *s, int after);

/* In a forked child: give the crash signals back their default action.
 * cmocka catches them in the test runner, and a child that crashed would
 * otherwise jump back into the runner and run the rest of the suite. */
void th_child_signals(void);

/* "exit N" / "signal N (name)" for a wait status, in buf; returns buf. */
const char *th_status_text(int status, char *buf, size_t len);

/* A decimal counter value: 1..18 digits, nothing else; -1 if malformed. */
long th_parse_long(const char *data, size_t len);

/* One case of a suite that runs once per backend: the test function gets
 * the backend name as its initial *state. */
struct th_case {
    const char *name;
    void (*fn)(void **state);
};

/* Run every case against every backend of th_backends() as a cmocka group
 * named `group`; tests are named "CASE/BACKEND".  Returns cmocka's result
 * (the number of failed tests), or 1 when out of memory. */
int th_run_per_backend(const char *group, const struct th_case *cases,
                       size_t ncases);

/* A store fixture: dir/conf (configdirectory) and dir/spool
 * (partition-default) are created, and every *_db key (mboxlist_db,
 * duplicate_db, seenstate_db, subscription_db, quota_db) names `backend`.
 * `extra` (may be NULL) is further imapd.conf text appended, e.g.
 * "partition-other: /x\nhashimapspool: yes\n".  The configuration file
 * is written to dir/imapd.conf (for tools), then loaded; the test fails
 * when it does not load.  Free with imapconf_free(). */
struct imapconf;
struct imapconf *th_store_conf(const char *dir, const char *backend,
                               const char *extra);
/* The same with "virtdomains: on" and a defaultdomain added. */
struct imapconf *th_store_conf_vd(const char *dir, const char *backend,
                                  const char *extra);

/* Virtual domains in the store suites: each suite is built twice, once as
 * it is and once with -DTH_DOMAIN='"example.com"' (the *_vd programs).
 * Its mailbox names are written TH_D "user.alice", which is
 * "example.com!user.alice" in the second build, TH_U the suffix of its
 * user ids ("@example.com"), TH_DPATH / TH_DPATH_H the directories the
 * domain adds to spool and per-user paths, and every fixture there runs
 * with
 * "virtdomains: on".  So every case of the store runs a second time with
 * all its mailboxes in a virtual domain, for every backend. */
#ifdef TH_DOMAIN
#define TH_D TH_DOMAIN "!"
#define TH_U "@" TH_DOMAIN
#define TH_DPATH "domain/" TH_DOMAIN "/"          /* spool, not hashed */
#define TH_DPATH_H "domain/e/" TH_DOMAIN "/"      /* hashed; per user */
#define th_store_conf th_store_conf_vd
#else
#define TH_D ""
#define TH_U ""
#define TH_DPATH ""
#define TH_DPATH_H ""
#endif

#endif
