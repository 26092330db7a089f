/*
 * metrics.h - the counters every process publishes for the Prometheus
 * exporter (metricsd), through one shared file and no system call per
 * event.
 *
 * The file: CONFIGDIR/metrics.shm, created by the master at its start
 * when imapd.conf sets metrics_listen (a new file renamed over an old
 * one: counters restart with a master), mapped MAP_SHARED by every
 * worker (lmtpd, imapd: metrics_attach() in lib/service.c), by the master
 * and by metricsd.  Fixed layout (struct metrics_shm below), a header
 * with magic, version and size; a file of another layout is not used.
 *
 *   header    magic "CDM1", version, size, number of slots, seq
 *   services  per service of cyrus.conf: ready, busy, maxchild (gauges),
 *             forks, crashes (counters); written by the master only
 *   base      the counts of processes that have exited (folded)
 *   overflow  a slot shared by processes that found no free slot
 *             (atomic read-modify-write there)
 *   slots[]   one per living worker: pid (0 = free), then its counters
 *
 * A worker claims a free slot at start (compare-and-swap of its pid) and
 * writes only that slot, with relaxed atomic loads and stores: no lock,
 * no system call, no contention.  When the master reaps a worker it
 * folds the slot into base (metrics_reaped()) under a sequence counter
 * (odd while folding), zeroes it and frees it.  A reader (metricsd) sums
 * base + overflow + every slot and retries when seq was odd or moved, so
 * a fold is never counted twice or not at all, and every counter only
 * grows while the master runs.
 *
 * "ctl_cyrusdb -c" run by the master (START, EVENTS: its parent is
 * CYRUSDELIVER_MASTER_PID) claims a slot like a worker, for the time of
 * a checkpoint run and its failed files; run by hand it does not.
 *
 * Library code: nothing here exits; without a file (metrics off, a tool
 * run by hand) every counting call is a no-op test of one pointer.
 */
#ifndef LIB_METRICS_H
#define LIB_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

struct imapconf;

#define METRICS_MAGIC 0x43444d31u       /* "CDM1" */
#define METRICS_VERSION 3u
#define METRICS_SLOTS 256
#define METRICS_SERVICES 32
#define METRICS_SERVICE_NAME 32

/* plain counters of a slot */
enum metrics_counter {
    METRICS_LMTP_BYTES,          /* message bytes of each 250 */
    METRICS_DUPLICATES,          /* recipients suppressed as duplicates */
    METRICS_QUOTA_REFUSALS,      /* RCPT or delivery refused over quota */
    METRICS_IMAP_LOGINS_OK,
    METRICS_IMAP_LOGINS_FAILED,
    METRICS_DIRECTORY_CACHED,    /* directory lookups answered by the cache */
    METRICS_DIRECTORY_READS,     /* directory lookups that read the database
                                    (etcd: a linearizable read), failed
                                    ones included */
    METRICS_NCOUNTERS
};

/* the final replies of LMTP deliveries (per recipient after DATA/BDAT):
 * a fixed table of (code, enhanced code) pairs, the last entry "other" */
#define METRICS_NREPLIES 11
extern const char *const metrics_reply_code[METRICS_NREPLIES];
extern const char *const metrics_reply_enhanced[METRICS_NREPLIES];

/* histogram upper bounds in microseconds (+Inf is the count) */
#define METRICS_NBUCKETS 14
extern const uint64_t metrics_bucket_us[METRICS_NBUCKETS];

/* IMAP commands: the index is enum imapparse_cmdid (0 = unparsed) */
#define METRICS_NIMAPCMDS 64
extern const char *const metrics_imap_cmd[METRICS_NIMAPCMDS];

/* databases (by file name) and backends (registry names) of db errors */
#define METRICS_NDBS 6
#define METRICS_NBACKENDS 6
extern const char *const metrics_db_name[METRICS_NDBS];
extern const char *const metrics_backend_name[METRICS_NBACKENDS];

struct metrics_hist {
    uint64_t bucket[METRICS_NBUCKETS];  /* not cumulative */
    uint64_t count;
    uint64_t sum_us;
};

struct metrics_slot {
    int32_t pid;                        /* 0 = free */
    uint32_t pad;
    uint64_t counter[METRICS_NCOUNTERS];
    uint64_t reply[METRICS_NREPLIES];
    struct metrics_hist delivery;       /* RCPT accepted -> 250 sent */
    struct metrics_hist imap[METRICS_NIMAPCMDS];
    uint64_t db_errors[METRICS_NDBS][METRICS_NBACKENDS];
    struct metrics_hist checkpoint;     /* one "ctl_cyrusdb -c" run */
    uint64_t checkpoint_failures[METRICS_NDBS];     /* failed files */
};

struct metrics_service {
    char name[METRICS_SERVICE_NAME];    /* "" = unused */
    uint32_t ready, busy, maxchild, pad;
    uint64_t forks, crashes;
};

struct metrics_shm {
    uint32_t magic;                     /* stored last at creation */
    uint32_t version;
    uint32_t size;                      /* sizeof(struct metrics_shm) */
    uint32_t nslots;
    uint64_t seq;                       /* odd while the master folds */
    uint64_t created;                   /* epoch seconds */
    struct metrics_service services[METRICS_SERVICES];
    struct metrics_slot base;
    struct metrics_slot overflow;
    struct metrics_slot slots[METRICS_SLOTS];
};

/* The worker's slot (NULL: metrics off) and whether it is shared. */
extern struct metrics_slot *metrics_slot;
extern int metrics_slot_shared;

/* CONFIGDIR/metrics.shm into path; -1 when it does not fit or there is
 * no configdirectory. */
int metrics_path(const struct imapconf *conf, char *path, size_t len);

/* 1 when imapd.conf sets metrics_listen (non-empty). */
int metrics_enabled(const struct imapconf *conf);

/* Worker: map the file and claim a slot (the overflow slot when none is
 * free).  Nothing (and 0) when metrics are off or the file is missing;
 * -1 (logged once) when the file is unusable. */
int metrics_attach(const struct imapconf *conf);

/* Master: create a new file (temporary file, renamed over the old one)
 * and map it.  0, or -1 logged. */
int metrics_create(const struct imapconf *conf);

/* Master: a child was reaped: fold its slot into base and free it. */
void metrics_reaped(pid_t pid);

/* Master: the state of service i (0 <= i < METRICS_SERVICES); a NULL
 * name clears the entry. */
void metrics_service_set(int i, const char *name, unsigned ready,
                         unsigned busy, unsigned maxchild,
                         unsigned long forks, unsigned long crashes);

/* Master: unmap (the file stays for metricsd until the next start). */
void metrics_detach(void);

/* Reader: map the file read-only.  0, or an errno value. */
int metrics_open_read(const char *path, const struct metrics_shm **shm_r);

/* Reader: a consistent sum of base, overflow and every slot into *sum
 * (the services are copied into services[]).  0, or -1 when no
 * consistent copy could be had (the master folds without end). */
int metrics_sum(const struct metrics_shm *shm, struct metrics_slot *sum,
                struct metrics_service services[METRICS_SERVICES]);

/* ---- counting (workers) ---------------------------------------------- */

static inline void metrics_add64(uint64_t *p, uint64_t v)
{
    if (metrics_slot_shared)
        __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    else
        __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v,
                         __ATOMIC_RELAXED);
}

static inline void metrics_count(enum metrics_counter c, uint64_t v)
{
    if (metrics_slot)
        metrics_add64(&metrics_slot->counter[c], v);
}

/* Monotonic clock in microseconds (vDSO: no system call). */
static inline uint64_t metrics_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void metrics_observe(struct metrics_hist *h, uint64_t us);

/* One final LMTP reply (its text "NNN X.Y.Z ..."): counted by code, and
 * for a 250 the bytes and the time since rcpt_us (metrics_now_us() when
 * the RCPT was accepted); quota refusals (x.2.2) counted too. */
void metrics_lmtp_final(const char *reply, uint64_t rcpt_us, uint64_t size);

/* One IMAP command (enum imapparse_cmdid) that began at start_us. */
void metrics_imap_command(int id, uint64_t start_us);

/* One database error (a negative CYRUSDB_* code other than NOTFOUND,
 * EXISTS, AGAIN) on a database of that index (metrics_db_index) and
 * backend name. */
void metrics_db_error(int db, const char *backend);

/* The database index of a file name (by its base name). */
int metrics_db_index(const char *fname);

#endif
