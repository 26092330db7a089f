/*
 * cyr_expire - scheduled upkeep, run from cyrus.conf's EVENTS as Cyrus's
 * cyr_expire is:
 *
 *   cyr_expire [-C imapd.conf] [-E AGE] [-X AGE] [-D AGE] [-b N] [-p MS] [-v]
 *
 *   -E AGE  prune duplicate-delivery records older than AGE
 *   -X AGE  remove expunged messages (files and index records): with
 *           expunge_mode: delayed those expunged more than AGE ago, with
 *           expunge_mode: immediate every one
 *   -D AGE  remove for good the mailboxes deleted (delete_mode: delayed,
 *           DELETED.NAME.HEXTIME) more than AGE ago
 *
 * AGE is Cyrus's duration: NUMBER with an optional unit d, h, m or s
 * (days when none).
 *
 * Bounded I/O: a mailbox is cleaned in batches of at most -b records (1000
 * by default); the mailbox lock is released after each batch and the
 * program sleeps -p milliseconds (20 by default) before the next one, so
 * deliveries into the mailbox wait for one batch at most (the duplicate
 * prune commits every 1000 records, duplicate.h).  The clock is the
 * current time, or for tests the value of CYRUSDELIVER_TEST_NOW (seconds
 * since the epoch).
 *
 * One log line per finished part (key=<value>) on stderr with -v, and
 * always a summary on stdout.  Exit status: 0 success, 1 some part
 * failed (message on stderr, the other parts still run), 2 usage error.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/privs.h"
#include "lib/strarray.h"
#include "store/duplicate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/store.h"

#define EXPIRE_DEFAULT_CONFIG IMAPCONF_DEFAULT_PATH
#define EXPIRE_EXIT_OK 0
#define EXPIRE_EXIT_FAIL 1
#define EXPIRE_EXIT_USAGE 2
#define EXPIRE_DEFAULT_BATCH 1000
#define EXPIRE_DEFAULT_PAUSE_MS 20
#define EXPIRE_MAX_DEFERRED 200   /* batches in a row an append blocks */
#define EXPIRE_MAX_AGE (100000LL * 86400)

static const char *expire_progname = "cyr_expire";
static const struct imapconf *expire_conf;

static void expire_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] [-E AGE] [-X AGE] [-D AGE] [-b N] [-p MS] [-v]\n"
"\n"
"Scheduled upkeep (Cyrus's cyr_expire), for cyrus.conf's EVENTS.\n"
"\n"
"  -C FILE   imapd.conf (default " EXPIRE_DEFAULT_CONFIG ")\n"
"  -E AGE    prune duplicate-delivery records older than AGE\n"
"  -X AGE    remove expunged messages: expunge_mode: delayed, those\n"
"            expunged more than AGE ago; immediate, all of them\n"
"  -D AGE    remove mailboxes deleted (delete_mode: delayed) more than\n"
"            AGE ago\n"
"  -b N      records removed per mailbox lock (default %d)\n"
"  -p MS     pause between batches, milliseconds (default %d)\n"
"  -v        log each part\n"
"  -h, --help  this text\n"
"\n"
"AGE: NUMBER with an optional unit d, h, m, s (days when none).\n",
            expire_progname, EXPIRE_DEFAULT_BATCH, EXPIRE_DEFAULT_PAUSE_MS);
}

static int expire_usage_error(const char *what)
{
    fprintf(stderr, "%s: %s (try --help)\n", expire_progname, what);
    return EXPIRE_EXIT_USAGE;
}

/* Cyrus's duration in seconds; -1 when malformed. */
static long long expire_age(const char *s)
{
    long long v = 0, unit = 86400;
    const char *p = s;

    if (!s || !*s)
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > 100000LL * 86400)
            return -1;
    }
    if (p == s)
        return -1;
    if (*p) {
        switch (*p) {
        case 'd': unit = 86400; break;
        case 'h': unit = 3600; break;
        case 'm': unit = 60; break;
        case 's': unit = 1; break;
        default: return -1;
        }
        if (p[1])
            return -1;
    }
    if (v * unit > EXPIRE_MAX_AGE)
        return -1;
    return v * unit;
}

static long long expire_parse_number(const char *s, long long max)
{
    char *end;
    long long v;

    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > max)
        return -1;
    return v;
}

static time_t expire_now(void)
{
    const char *e = getenv("CYRUSDELIVER_TEST_NOW");
    long long v;

    if (e && *e && (v = expire_parse_number(e, INT64_MAX / 2)) >= 0)
        return (time_t)v;
    return time(NULL);
}

static void expire_pause(long ms)
{
    struct timespec ts;

    if (ms <= 0)
        return;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- -E ---- */

static int expire_duplicates(long long age, time_t now)
{
    struct duplicate_db *d;
    unsigned long pruned = 0, kept = 0;
    int r;

    r = duplicate_open(expire_conf, &d);
    if (r == STORE_OK) {
        /* duplicate_prune_at() counts whole days */
        r = duplicate_prune_at(d, 0, now - (time_t)age, &pruned, &kept);
        duplicate_close(&d);
    }
    if (r != STORE_OK) {
        fprintf(stderr, "%s: cannot prune the duplicate database: %s\n",
                expire_progname, store_strerror(r));
        return -1;
    }
    log_info("expire: duplicates pruned=<%lu> kept=<%lu>", pruned, kept);
    printf("duplicate records: %lu pruned, %lu kept\n", pruned, kept);
    return 0;
}

/* ---- -X ---- */

struct expire_names {
    struct strarray names;
    struct strarray partitions;
};

static int expire_collect_cb(void *rock, const struct mboxlist_entry *e)
{
    struct expire_names *n = rock;

    strarray_append(&n->names, e->name);
    strarray_append(&n->partitions, e->partition);
    return 0;
}

/* Clean one mailbox in batches; adds what was removed to *removed_r. */
static int expire_mailbox(const char *name, const char *part,
                          int64_t before, uint32_t batch, long pause_ms,
                          unsigned long *removed_r, unsigned long *batches_r)
{
    struct mailbox *mb = NULL;
    int r, r2, more, deferred = 0;

    r = mailbox_open(expire_conf, name, part, &mb);
    if (r != STORE_OK)
        return r;
    do {
        uint32_t removed = 0;

        more = 0;
        r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
        if (r != STORE_OK)
            break;
        r = mailbox_cleanup_batch(mb, before, batch, &removed, &more);
        r2 = mailbox_unlock(mb);
        if (r == STORE_OK)
            r = r2;
        if (more == 2) {
            /* appends in progress: the same records again after a pause;
             * a mailbox that never pauses is left for the next run */
            if (++deferred > EXPIRE_MAX_DEFERRED) {
                log_info("expire: compaction deferred mailbox=<%s> "
                         "reason=<appends in progress>", name);
                break;
            }
        } else {
            deferred = 0;
            *removed_r += removed;
            if (removed)
                (*batches_r)++;
        }
        if (r == STORE_OK && more)
            expire_pause(pause_ms > 0 ? pause_ms : 1);
    } while (r == STORE_OK && more);
    mailbox_close(&mb);
    return r;
}

static int expire_expunged(long long age, time_t now, uint32_t batch,
                           long pause_ms)
{
    struct expire_names n = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    struct mboxlist *ml;
    unsigned long removed = 0, batches = 0;
    int64_t before = 0;
    int delayed, r, failed = 0;
    size_t i;

    delayed = strcmp(imapconf_getstring(expire_conf, "expunge_mode"),
                     "delayed") == 0;
    if (delayed)
        before = (int64_t)now - age;
    r = mboxlist_open(expire_conf, &ml);
    if (r == STORE_OK) {
        r = mboxlist_list(ml, "*", expire_collect_cb, &n);
        mboxlist_close(&ml);
    }
    if (r != STORE_OK) {
        fprintf(stderr, "%s: cannot list the mailboxes: %s\n",
                expire_progname, store_strerror(r));
        failed = 1;
    }
    for (i = 0; r == STORE_OK && i < n.names.count; i++) {
        int r1 = expire_mailbox(n.names.data[i], n.partitions.data[i],
                                before, batch, pause_ms, &removed,
                                &batches);

        if (r1 != STORE_OK && r1 != STORE_NOTFOUND) {
            fprintf(stderr, "%s: cannot clean up %s: %s\n", expire_progname,
                    n.names.data[i], store_strerror(r1));
            failed = 1;
        }
    }
    log_info("expire: expunged mode=<%s> age=<%llds> mailboxes=<%zu> "
             "removed=<%lu> batches=<%lu>", delayed ? "delayed" : "immediate",
             delayed ? age : 0LL, n.names.count, removed, batches);
    printf("expunged messages: %lu removed from %zu mailboxes\n", removed,
           n.names.count);
    strarray_fini(&n.names);
    strarray_fini(&n.partitions);
    return failed ? -1 : 0;
}

/* ---- -D ---- */

static int expire_deleted(long long age, time_t now)
{
    struct expire_names n = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER };
    static const char *const patterns[] = { MBOXLIST_DELETED_PREFIX ".*",
                                            "*!" MBOXLIST_DELETED_PREFIX
                                            ".*" };
    struct mboxlist *ml;
    unsigned long removed = 0, kept = 0;
    char top[MBOXNAME_MAX + 1] = "";
    int r, failed = 0;
    size_t i;

    r = mboxlist_open(expire_conf, &ml);
    if (r != STORE_OK) {
        fprintf(stderr, "%s: cannot open the mailbox list: %s\n",
                expire_progname, store_strerror(r));
        return -1;
    }
    for (i = 0; r == STORE_OK && i < 2; i++)
        r = mboxlist_list(ml, patterns[i], expire_collect_cb, &n);
    if (r != STORE_OK) {
        fprintf(stderr, "%s: cannot list the deleted mailboxes: %s\n",
                expire_progname, store_strerror(r));
        failed = 1;
    }
    for (i = 0; r == STORE_OK && i < n.names.count; i++) {
        const char *name = n.names.data[i];
        size_t tl = strlen(top);
        time_t when;
        int r1;

        /* the children of a deleted mailbox (listed right after it) go
         * with it: only the top of each deleted tree carries the time */
        if (tl && strncmp(name, top, tl) == 0 && name[tl] == '.')
            continue;
        if (mboxlist_deleted_parse(name, NULL, &when) != STORE_OK)
            continue;
        snprintf(top, sizeof(top), "%s", name);
        if ((long long)when > (long long)now - age) {
            kept++;
            continue;
        }
        r1 = mboxlist_delete(ml, name, MBOXLIST_RECURSIVE |
                                       MBOXLIST_IMMEDIATE);
        if (r1 == STORE_OK) {
            removed++;
        } else if (r1 != STORE_NOTFOUND) {
            fprintf(stderr, "%s: cannot remove %s: %s\n", expire_progname,
                    name, store_strerror(r1));
            failed = 1;
        }
    }
    mboxlist_close(&ml);
    log_info("expire: deleted mailboxes age=<%llds> removed=<%lu> "
             "kept=<%lu>", age, removed, kept);
    printf("deleted mailboxes: %lu removed, %lu kept\n", removed, kept);
    strarray_fini(&n.names);
    strarray_fini(&n.partitions);
    return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = EXPIRE_DEFAULT_CONFIG;
    long long age_e = -1, age_x = -1, age_d = -1, batch =
        EXPIRE_DEFAULT_BATCH, pause_ms = EXPIRE_DEFAULT_PAUSE_MS;
    struct imapconf *conf = NULL;
    char *err = NULL;
    const char *perr = NULL;
    struct stat st;
    time_t now;
    int opt, verbose = 0, failed = 0;

    if (argv[0])
        expire_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1
                                                : argv[0];
    log_init(expire_progname, LOG_TO_STDERR);
    while ((opt = getopt_long(argc, argv, "C:E:X:D:b:p:vh", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'C': config = optarg; break;
        case 'E':
            if ((age_e = expire_age(optarg)) < 0)
                return expire_usage_error("bad age for -E");
            break;
        case 'X':
            if ((age_x = expire_age(optarg)) < 0)
                return expire_usage_error("bad age for -X");
            break;
        case 'D':
            if ((age_d = expire_age(optarg)) < 0)
                return expire_usage_error("bad age for -D");
            break;
        case 'b':
            if ((batch = expire_parse_number(optarg, 1000000)) < 1)
                return expire_usage_error("bad batch size for -b");
            break;
        case 'p':
            if ((pause_ms = expire_parse_number(optarg, 60000)) < 0)
                return expire_usage_error("bad pause for -p");
            break;
        case 'v': verbose = 1; break;
        case 'h': expire_usage(stdout); return EXPIRE_EXIT_OK;
        default: return expire_usage_error("unknown option");
        }
    }
    if (optind < argc)
        return expire_usage_error("unexpected argument");
    if (age_e < 0 && age_x < 0 && age_d < 0)
        return expire_usage_error("nothing to do: give -E, -X or -D");
    log_set_info(verbose);
    if (stat(config, &st) < 0) {
        fprintf(stderr, "%s: %s: %s\n", expire_progname, config,
                strerror(errno));
        return EXPIRE_EXIT_FAIL;
    }
    if (imapconf_load(config, &conf, &err) != 0) {
        fprintf(stderr, "%s: %s\n", expire_progname,
                err ? err : "out of memory");
        free(err);
        return EXPIRE_EXIT_FAIL;
    }
    if (privs_drop_to_cyrus_user(conf, &perr) != PRIVS_OK) {
        fprintf(stderr, "%s: %s\n", expire_progname, perr);
        imapconf_free(&conf);
        return EXPIRE_EXIT_FAIL;
    }
    expire_conf = conf;
    now = expire_now();
    if (age_e >= 0 && expire_duplicates(age_e, now) < 0)
        failed = 1;
    if (age_d >= 0 && expire_deleted(age_d, now) < 0)
        failed = 1;
    if (age_x >= 0 && expire_expunged(age_x, now, (uint32_t)batch,
                                      (long)pause_ms) < 0)
        failed = 1;
    imapconf_free(&conf);
    return failed ? EXPIRE_EXIT_FAIL : EXPIRE_EXIT_OK;
}
