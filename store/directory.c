/*
 * directory.c - the user -> backend map of the frontend tier (see
 * directory.h).
 *
 * The cache is a hash table of chained entries (user id, backend name or
 * none, when it was read on the monotonic clock).  An entry lives
 * directory_cache_ttl seconds; while the watch below is up, an entry
 * naming a backend lives directory_cache_watched_ttl instead (the watch
 * drops it when its record changes, so in steady state a delivery reads
 * nothing).  "No such user" always keeps the short life: were a watch
 * silently cut off, a new user would otherwise be refused with a
 * permanent 550 for a long time, while a stale backend name only costs
 * a 451 from the old backend, which knows the user left
 * (store/userstate.h).  An expired entry is never answered from: it is looked up again, and when that read fails the
 * answer is DIRECTORY_UNAVAILABLE.  When the table holds
 * DIRECTORY_CACHE_MAX entries it is emptied (its only cost is the reads
 * that refill it).  The database handle is opened lazily and closed
 * after a read error, so that a cluster or a file that comes back is
 * picked up by the next lookup.
 *
 * With etcd (and a TTL) a thread of the process watches the directory's
 * keys (cyrusdb_etcd_watch) from the first successful open on.  The
 * thread touches nothing but a queue under a mutex: the keys that
 * changed, and "flush everything" when a watch (re)starts (changes
 * while no watch was in place may have been missed).  Each lookup
 * first applies the queue to the cache, so a change reaches the cache
 * within the watch's latency; an answer read before a change is dropped
 * because the change's event is queued after that read and applied at
 * the next lookup.  When the watch fails, every entry falls back to the
 * short life at once (counted from its read).  The watch's connection
 * has TCP keepalives of a few seconds (cyrusdb/etcd.c), so a cut link
 * ends it instead of leaving it silently deaf.  The thread logs nothing; the lookups log when the
 * watch starts and when it fails (once per streak).
 */
#include "config.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_etcd.h"
#include "lib/buf.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "lib/strarray.h"
#include "store/directory.h"

#define DIRECTORY_BUCKETS 4096

struct directory_entry {
    struct directory_entry *next;
    uint64_t read_ms;               /* 0: unusable, read it again */
    char *backend;                  /* NULL: the user has no record */
    char userid[];
};

struct directory {
    const struct imapconf *conf;
    char *backend;                  /* cyrusdb backend name */
    char *path;                     /* database file name */
    uint64_t ttl_ms;
    uint64_t watched_ttl_ms;        /* a backend's name, watch up */
    int watching;                   /* the watch is up (main thread) */
    struct cyrusdb *db;             /* NULL until opened */
    int failing;                    /* in a streak of failures (logged) */
    struct directory_entry *buckets[DIRECTORY_BUCKETS];
    size_t count;
    char answer[DIRECTORY_NAME_MAX + 1];
    char bad[DIRECTORY_NAME_MAX * 4 + 16];
    /* the watch (etcd only); the fields below `mu` are under it */
    int watch_wanted;
    int thread_started;
    pthread_t thread;
    pthread_mutex_t mu;
    int stop;
    int flush_pending;
    struct strarray changed;
    int watch_up;                   /* the thread's view */
    const char *watch_why;          /* why the last watch ended */
    int logged_up;                  /* the main thread's log state */
};

static uint64_t directory_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* FNV-1a */
static size_t directory_hash(const char *s)
{
    uint32_t h = 2166136261u;

    while (*s) {
        h ^= (unsigned char)*s++;
        h *= 16777619u;
    }
    return h % DIRECTORY_BUCKETS;
}

int directory_valid_name(const char *s, size_t len)
{
    size_t i;

    if (len == 0 || len > DIRECTORY_NAME_MAX)
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

int directory_new(const struct imapconf *conf, struct directory **dir_r,
                  const char **error_r)
{
    struct directory *dir;
    const char *backend = imapconf_getstring(conf, "directory_db");
    const char *path = imapconf_getstring(conf, "directory_db_path");
    struct buf b = BUF_INITIALIZER;
    long ttl = imapconf_getint(conf, "directory_cache_ttl");
    long wttl = imapconf_getint(conf, "directory_cache_watched_ttl");

    *dir_r = NULL;
    if (!cyrusdb_lookup(backend)) {
        *error_r = "directory_db names no known database backend";
        return -1;
    }
    dir = calloc(1, sizeof(*dir));
    if (!dir) {
        *error_r = "out of memory";
        return -1;
    }
    if (!path || !*path) {
        buf_printf(&b, "%s/directory.db",
                   imapconf_getstring(conf, "configdirectory"));
        path = buf_cstring(&b);
    }
    dir->conf = conf;
    dir->backend = strdup(backend);
    dir->path = strdup(path);
    buf_free(&b);
    dir->ttl_ms = ttl > 0 ? (uint64_t)ttl * 1000 : 0;
    dir->watched_ttl_ms = wttl > ttl ? (uint64_t)wttl * 1000 : dir->ttl_ms;
    dir->watch_wanted = strcmp(backend, "etcd") == 0 && dir->ttl_ms > 0;
    pthread_mutex_init(&dir->mu, NULL);
    if (!dir->backend || !dir->path) {
        directory_free(&dir);
        *error_r = "out of memory";
        return -1;
    }
    *dir_r = dir;
    return 0;
}

void directory_flush(struct directory *dir)
{
    size_t i;

    for (i = 0; i < DIRECTORY_BUCKETS; i++) {
        struct directory_entry *e = dir->buckets[i], *next;

        for (; e; e = next) {
            next = e->next;
            free(e->backend);
            free(e);
        }
        dir->buckets[i] = NULL;
    }
    dir->count = 0;
}

void directory_free(struct directory **dirp)
{
    struct directory *dir = *dirp;

    if (!dir)
        return;
    if (dir->thread_started) {
        pthread_mutex_lock(&dir->mu);
        dir->stop = 1;
        pthread_mutex_unlock(&dir->mu);
        pthread_join(dir->thread, NULL);
    }
    strarray_fini(&dir->changed);
    pthread_mutex_destroy(&dir->mu);
    directory_flush(dir);
    if (dir->db)
        cyrusdb_close(&dir->db);
    free(dir->backend);
    free(dir->path);
    free(dir);
    *dirp = NULL;
}

/* The cached entry of userid, or NULL. */
static struct directory_entry *directory_cached(struct directory *dir,
                                                const char *userid,
                                                size_t bucket)
{
    struct directory_entry *e;

    for (e = dir->buckets[bucket]; e; e = e->next)
        if (strcmp(e->userid, userid) == 0)
            return e;
    return NULL;
}

/* ---- the watch ---------------------------------------------------------- */

static void directory_watch_event(void *rock, int created, const char *key,
                                  size_t keylen)
{
    struct directory *dir = rock;

    pthread_mutex_lock(&dir->mu);
    if (created) {
        dir->flush_pending = 1;
        dir->watch_up = 1;
        dir->watch_why = NULL;
    } else if (!dir->flush_pending) {
        char *k = strndup(key, keylen);

        /* no memory for the key: forget everything instead */
        if (!k || strarray_appendm(&dir->changed, k) < 0)
            dir->flush_pending = 1;
    }
    pthread_mutex_unlock(&dir->mu);
}

static int directory_watch_stop(void *rock)
{
    struct directory *dir = rock;
    int stop;

    pthread_mutex_lock(&dir->mu);
    stop = dir->stop;
    pthread_mutex_unlock(&dir->mu);
    return stop;
}

static void *directory_watch_main(void *rock)
{
    struct directory *dir = rock;
    unsigned backoff_ms = 100, waited;

    while (!directory_watch_stop(dir)) {
        const char *why = NULL;

        if (cyrusdb_etcd_watch(dir->path, directory_watch_event,
                               directory_watch_stop, dir, &why) == 0)
            break;
        pthread_mutex_lock(&dir->mu);
        if (dir->watch_up)
            backoff_ms = 100;    /* it worked for a while */
        dir->watch_up = 0;
        dir->watch_why = why ? why : "failed";
        pthread_mutex_unlock(&dir->mu);
        for (waited = 0; waited < backoff_ms; waited += 50) {
            struct timespec ts = { 0, 50 * 1000000L };

            if (directory_watch_stop(dir))
                return NULL;
            nanosleep(&ts, NULL);
        }
        if (backoff_ms < 5000)
            backoff_ms *= 2;
    }
    return NULL;
}

static void directory_unlink(struct directory *dir, const char *userid)
{
    size_t bucket = directory_hash(userid);
    struct directory_entry **ep = &dir->buckets[bucket];

    for (; *ep; ep = &(*ep)->next) {
        struct directory_entry *e = *ep;

        if (strcmp(e->userid, userid) == 0) {
            *ep = e->next;
            free(e->backend);
            free(e);
            dir->count--;
            return;
        }
    }
}

/* Apply what the watch reported; log its state changes. */
static void directory_watch_apply(struct directory *dir)
{
    const char *why;
    int up;
    size_t i;

    if (!dir->thread_started)
        return;
    pthread_mutex_lock(&dir->mu);
    if (dir->flush_pending) {
        directory_flush(dir);
        dir->flush_pending = 0;
    } else {
        for (i = 0; i < dir->changed.count; i++)
            directory_unlink(dir, dir->changed.data[i]);
    }
    while (dir->changed.count)
        strarray_remove(&dir->changed, dir->changed.count - 1);
    up = dir->watch_up;
    why = dir->watch_why;
    pthread_mutex_unlock(&dir->mu);
    dir->watching = up;
    if (up && dir->logged_up != 1) {
        log_info("directory: watching the directory for changes "
                 "path=<%s>", dir->path);
        dir->logged_up = 1;
    } else if (!up && why && dir->logged_up != -1) {
        log_warning("directory: the watch on the directory failed "
                    "path=<%s> error=<%s>; changes are seen within "
                    "directory_cache_ttl meanwhile", dir->path, why);
        dir->logged_up = -1;
    }
}

/* Start the watch thread (once the database opened: libcurl is set up). */
static void directory_watch_start(struct directory *dir)
{
    if (!dir->watch_wanted || dir->thread_started)
        return;
    if (pthread_create(&dir->thread, NULL, directory_watch_main, dir) != 0) {
        log_warning("directory: cannot start the watch thread; changes are "
                    "seen within directory_cache_ttl");
        dir->watch_wanted = 0;
        return;
    }
    dir->thread_started = 1;
}

/* Remember an answer (backend NULL: not found); out of memory only
 * means no caching. */
static void directory_remember(struct directory *dir, const char *userid,
                               size_t bucket, const char *backend)
{
    struct directory_entry *e = directory_cached(dir, userid, bucket);

    if (dir->ttl_ms == 0)
        return;
    if (!e) {
        size_t n = strlen(userid);

        if (dir->count >= DIRECTORY_CACHE_MAX)
            directory_flush(dir);
        e = calloc(1, sizeof(*e) + n + 1);
        if (!e)
            return;
        memcpy(e->userid, userid, n + 1);
        e->next = dir->buckets[bucket];
        dir->buckets[bucket] = e;
        dir->count++;
    }
    free(e->backend);
    e->backend = backend ? strdup(backend) : NULL;
    if (backend && !e->backend) {
        e->read_ms = 0;      /* unusable: looked up again */
        return;
    }
    e->read_ms = directory_now_ms();
}

/* True when e may still be answered from (the header comment). */
static int directory_fresh(const struct directory *dir,
                           const struct directory_entry *e)
{
    uint64_t life = e->backend && dir->watching ? dir->watched_ttl_ms
                                                : dir->ttl_ms;

    return e->read_ms != 0 && directory_now_ms() < e->read_ms + life;
}

static void directory_failed(struct directory *dir, const char *what, int r)
{
    if (!dir->failing)
        log_error("directory: cannot read the directory database "
                  "backend=<%s> path=<%s> step=<%s> error=<%s>; its "
                  "recipients get 451 until it answers", dir->backend,
                  dir->path, what, cyrusdb_strerror(r));
    dir->failing = 1;
}

enum directory_result directory_lookup(struct directory *dir,
                                       const char *userid,
                                       const char **backend_r)
{
    size_t bucket = directory_hash(userid);
    struct directory_entry *e = directory_cached(dir, userid, bucket);
    const char *data = NULL;
    size_t datalen = 0;
    int r;

    *backend_r = NULL;
    directory_watch_apply(dir);
    e = directory_cached(dir, userid, bucket);
    if (e && directory_fresh(dir, e)) {
        metrics_count(METRICS_DIRECTORY_CACHED, 1);
        if (!e->backend)
            return DIRECTORY_NOTFOUND;
        snprintf(dir->answer, sizeof(dir->answer), "%s", e->backend);
        *backend_r = dir->answer;
        return DIRECTORY_OK;
    }
    metrics_count(METRICS_DIRECTORY_READS, 1);
    if (!dir->db) {
        r = cyrusdb_open(dir->backend, dir->path, CYRUSDB_RDONLY, &dir->db,
                         NULL);
        if (r != CYRUSDB_OK) {
            dir->db = NULL;
            directory_failed(dir, "open", r);
            return DIRECTORY_UNAVAILABLE;
        }
        directory_watch_start(dir);
    }
    r = cyrusdb_fetch(dir->db, userid, strlen(userid), &data, &datalen,
                      NULL);
    if (r != CYRUSDB_OK && r != CYRUSDB_NOTFOUND) {
        directory_failed(dir, "fetch", r);
        cyrusdb_close(&dir->db);
        return DIRECTORY_UNAVAILABLE;
    }
    if (dir->failing)
        log_info("directory: the directory database answers again "
                 "backend=<%s> path=<%s>", dir->backend, dir->path);
    dir->failing = 0;
    if (r == CYRUSDB_NOTFOUND) {
        directory_remember(dir, userid, bucket, NULL);
        return DIRECTORY_NOTFOUND;
    }
    if (!directory_valid_name(data, datalen)) {
        log_sanitize(data, datalen > DIRECTORY_NAME_MAX * 2
                               ? DIRECTORY_NAME_MAX * 2 : datalen,
                     dir->bad, sizeof(dir->bad));
        *backend_r = dir->bad;
        return DIRECTORY_BADRECORD;
    }
    memcpy(dir->answer, data, datalen);
    dir->answer[datalen] = '\0';
    directory_remember(dir, userid, bucket, dir->answer);
    *backend_r = dir->answer;
    return DIRECTORY_OK;
}

/* ---- the frontends' backend lists ---------------------------------- */

int directory_peers_find(const struct directory_peer *peers, size_t n,
                         const char *name)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (strcmp(peers[i].name, name) == 0)
            return (int)i;
    return -1;
}

void directory_peers_free(struct directory_peer *peers, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        free(peers[i].name);
        free(peers[i].addr);
    }
    free(peers);
}

int directory_peers_parse(const char *list, struct directory_peer **peers_r,
                          size_t *n_r, const char **error_r)
{
    struct directory_peer *peers = NULL;
    size_t n = 0;
    const char *s = list ? list : "";

    *peers_r = NULL;
    *n_r = 0;
    for (;;) {
        size_t len, nlen;
        const char *eq;
        struct directory_peer *np;

        s += strspn(s, " \t,");
        len = strcspn(s, " \t,");
        if (len == 0)
            break;
        eq = memchr(s, '=', len);
        if (!eq) {
            *error_r = "an entry without NAME=ADDRESS";
            goto fail;
        }
        nlen = (size_t)(eq - s);
        if (!directory_valid_name(s, nlen)) {
            *error_r = "a backend name that is not 1-64 letters, digits, "
                       "'.', '_', '-'";
            goto fail;
        }
        if (len - nlen - 1 == 0) {
            *error_r = "an entry with an empty address";
            goto fail;
        }
        np = realloc(peers, (n + 1) * sizeof(*np));
        if (!np) {
            *error_r = "out of memory";
            goto fail;
        }
        peers = np;
        peers[n].name = strndup(s, nlen);
        peers[n].addr = strndup(eq + 1, len - nlen - 1);
        n++;
        if (!peers[n - 1].name || !peers[n - 1].addr) {
            *error_r = "out of memory";
            goto fail;
        }
        if (directory_peers_find(peers, n - 1, peers[n - 1].name) >= 0) {
            *error_r = "a backend name given twice";
            goto fail;
        }
        s += len;
    }
    *peers_r = peers;
    *n_r = n;
    return 0;
fail:
    directory_peers_free(peers, n);
    return -1;
}
