/*
 * metrics.c - the shared counters file: creation (master), slots
 * (workers), folding (master), consistent sums (metricsd).  See
 * metrics.h for the layout and the argument.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/metrics.h"

#define METRICS_FNAME "metrics.shm"

const char *const metrics_reply_code[METRICS_NREPLIES] = {
    "250", "451", "452", "452", "452", "550", "550", "552", "552", "554",
    "other"
};
const char *const metrics_reply_enhanced[METRICS_NREPLIES] = {
    "2.1.5", "4.3.0", "4.3.1", "4.2.2", "4.5.3", "5.1.1", "5.7.1", "5.2.2",
    "5.3.4", "5.6.0", "other"
};

/* 0.5 ms .. 10 s */
const uint64_t metrics_bucket_us[METRICS_NBUCKETS] = {
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000, 5000000, 10000000
};

/* enum imapparse_cmdid order (tests/unit/test_imapparse checks it) */
const char *const metrics_imap_cmd[METRICS_NIMAPCMDS] = {
    "other", "CAPABILITY", "NOOP", "LOGOUT", "ID", "ENABLE", "STARTTLS",
    "AUTHENTICATE", "LOGIN", "SELECT", "EXAMINE", "CREATE", "DELETE",
    "RENAME", "SUBSCRIBE", "UNSUBSCRIBE", "LIST", "LSUB", "STATUS", "APPEND",
    "NAMESPACE", "IDLE", "COMPRESS", "CHECK", "CLOSE", "UNSELECT",
    "EXPUNGE", "SEARCH", "SORT", "THREAD", "FETCH", "STORE", "COPY", "MOVE",
    "SETACL", "DELETEACL", "GETACL", "LISTRIGHTS", "MYRIGHTS", "GETQUOTA",
    "GETQUOTAROOT", "SETQUOTA", "other", "other", "other", "other",
    "other", "other", "other", "other", "other", "other", "other", "other",
    "other", "other", "other", "other", "other", "other", "other", "other",
    "other", "other"
};

const char *const metrics_db_name[METRICS_NDBS] = {
    "mailboxes", "deliver", "quotas", "seen", "subscriptions", "other"
};
const char *const metrics_backend_name[METRICS_NBACKENDS] = {
    "flat", "skiplist", "db3", "db3-nosync", "lmdb", "other"
};

struct metrics_slot *metrics_slot;
int metrics_slot_shared;

static struct metrics_shm *metrics_map;      /* worker or master, writable */
static pid_t metrics_map_pid;

int metrics_path(const struct imapconf *conf, char *path, size_t len)
{
    const char *dir = conf ? imapconf_getstring(conf, "configdirectory")
                           : NULL;

    if (!dir || !*dir)
        return -1;
    if (snprintf(path, len, "%s/%s", dir, METRICS_FNAME) >= (int)len)
        return -1;
    return 0;
}

int metrics_enabled(const struct imapconf *conf)
{
    const char *l = conf ? imapconf_getstring(conf, "metrics_listen") : NULL;

    return l && *l;
}

static int metrics_valid(const struct metrics_shm *shm, size_t size)
{
    return size == sizeof(*shm)
        && __atomic_load_n(&shm->magic, __ATOMIC_ACQUIRE) == METRICS_MAGIC
        && shm->version == METRICS_VERSION && shm->size == sizeof(*shm)
        && shm->nslots == METRICS_SLOTS;
}

/* Map path (read-write or read-only); 0 or an errno value. */
static int metrics_map_file(const char *path, int writable,
                            struct metrics_shm **shm_r)
{
    struct stat st;
    void *p;
    int fd;

    fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
    if (fd < 0)
        return errno;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return e;
    }
    if ((size_t)st.st_size != sizeof(struct metrics_shm)) {
        close(fd);
        return EBADMSG;
    }
    p = mmap(NULL, sizeof(struct metrics_shm),
             PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return errno;
    if (!metrics_valid(p, (size_t)st.st_size)) {
        munmap(p, sizeof(struct metrics_shm));
        return EBADMSG;
    }
    *shm_r = p;
    return 0;
}

int metrics_attach(const struct imapconf *conf)
{
    char path[PATH_MAX];
    struct metrics_shm *shm;
    int32_t self = (int32_t)getpid(), zero;
    int e, i;

    if (metrics_map && metrics_map_pid == getpid())
        return 0;
    metrics_slot = NULL;
    metrics_slot_shared = 0;
    metrics_map = NULL;
    if (!metrics_enabled(conf) || metrics_path(conf, path, sizeof(path)) < 0)
        return 0;
    e = metrics_map_file(path, 1, &shm);
    if (e == ENOENT)
        return 0;
    if (e) {
        log_warning("metrics: shared file unusable file=<%s> error=<%s>",
                    path, e == EBADMSG ? "not a metrics file of this version"
                                       : strerror(e));
        return -1;
    }
    metrics_map = shm;
    metrics_map_pid = getpid();
    for (i = 0; i < METRICS_SLOTS; i++) {
        zero = 0;
        if (__atomic_compare_exchange_n(&shm->slots[i].pid, &zero, self, 0,
                                        __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            metrics_slot = &shm->slots[i];
            return 0;
        }
    }
    metrics_slot = &shm->overflow;
    metrics_slot_shared = 1;
    return 0;
}

int metrics_create(const struct imapconf *conf)
{
    char path[PATH_MAX], tmp[PATH_MAX + 16];
    struct metrics_shm *shm;
    void *p;
    int fd;

    metrics_detach();
    if (metrics_path(conf, path, sizeof(path)) < 0) {
        log_error("metrics: no configdirectory for the shared file");
        return -1;
    }
    snprintf(tmp, sizeof(tmp), "%s.%ld", path, (long)getpid());
    fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_error("metrics: cannot create file=<%s> error=<%s>", tmp,
                  strerror(errno));
        return -1;
    }
    if (ftruncate(fd, sizeof(struct metrics_shm)) < 0) {
        log_error("metrics: cannot size file=<%s> error=<%s>", tmp,
                  strerror(errno));
        close(fd);
        unlink(tmp);
        return -1;
    }
    p = mmap(NULL, sizeof(struct metrics_shm), PROT_READ | PROT_WRITE,
             MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        log_error("metrics: cannot map file=<%s> error=<%s>", tmp,
                  strerror(errno));
        unlink(tmp);
        return -1;
    }
    shm = p;        /* zero-filled by ftruncate */
    shm->version = METRICS_VERSION;
    shm->size = sizeof(*shm);
    shm->nslots = METRICS_SLOTS;
    shm->created = (uint64_t)time(NULL);
    __atomic_store_n(&shm->magic, METRICS_MAGIC, __ATOMIC_RELEASE);
    if (rename(tmp, path) < 0) {
        log_error("metrics: cannot rename file=<%s> to=<%s> error=<%s>", tmp,
                  path, strerror(errno));
        munmap(p, sizeof(*shm));
        unlink(tmp);
        return -1;
    }
    metrics_map = shm;
    metrics_map_pid = getpid();
    return 0;
}

static void metrics_fold_hist(struct metrics_hist *to,
                              const struct metrics_hist *from)
{
    int i;

    for (i = 0; i < METRICS_NBUCKETS; i++)
        to->bucket[i] += __atomic_load_n(&from->bucket[i], __ATOMIC_RELAXED);
    to->count += __atomic_load_n(&from->count, __ATOMIC_RELAXED);
    to->sum_us += __atomic_load_n(&from->sum_us, __ATOMIC_RELAXED);
}

/* to += from, every counter (pid and pad left alone) */
static void metrics_fold(struct metrics_slot *to,
                         const struct metrics_slot *from)
{
    int i, j;

    for (i = 0; i < METRICS_NCOUNTERS; i++)
        to->counter[i] += __atomic_load_n(&from->counter[i],
                                          __ATOMIC_RELAXED);
    for (i = 0; i < METRICS_NREPLIES; i++)
        to->reply[i] += __atomic_load_n(&from->reply[i], __ATOMIC_RELAXED);
    metrics_fold_hist(&to->delivery, &from->delivery);
    for (i = 0; i < METRICS_NIMAPCMDS; i++)
        metrics_fold_hist(&to->imap[i], &from->imap[i]);
    for (i = 0; i < METRICS_NDBS; i++)
        for (j = 0; j < METRICS_NBACKENDS; j++)
            to->db_errors[i][j] += __atomic_load_n(&from->db_errors[i][j],
                                                   __ATOMIC_RELAXED);
    metrics_fold_hist(&to->checkpoint, &from->checkpoint);
    for (i = 0; i < METRICS_NDBS; i++)
        to->checkpoint_failures[i] += __atomic_load_n(
            &from->checkpoint_failures[i], __ATOMIC_RELAXED);
}

void metrics_reaped(pid_t pid)
{
    struct metrics_shm *shm = metrics_map;
    int i;

    if (!shm || pid <= 0)
        return;
    for (i = 0; i < METRICS_SLOTS; i++) {
        struct metrics_slot *sl = &shm->slots[i];

        if (__atomic_load_n(&sl->pid, __ATOMIC_ACQUIRE) != (int32_t)pid)
            continue;
        __atomic_add_fetch(&shm->seq, 1, __ATOMIC_SEQ_CST);     /* odd */
        metrics_fold(&shm->base, sl);
        memset((char *)sl + offsetof(struct metrics_slot, counter), 0,
               sizeof(*sl) - offsetof(struct metrics_slot, counter));
        __atomic_add_fetch(&shm->seq, 1, __ATOMIC_SEQ_CST);     /* even */
        __atomic_store_n(&sl->pid, 0, __ATOMIC_RELEASE);
        return;
    }
}

void metrics_service_set(int i, const char *name, unsigned ready,
                         unsigned busy, unsigned maxchild,
                         unsigned long forks, unsigned long crashes)
{
    struct metrics_service *sv;

    if (!metrics_map || i < 0 || i >= METRICS_SERVICES)
        return;
    sv = &metrics_map->services[i];
    if (!name) {
        memset(sv, 0, sizeof(*sv));
        return;
    }
    if (strncmp(sv->name, name, sizeof(sv->name)) != 0) {
        memset(sv, 0, sizeof(*sv));
        snprintf(sv->name, sizeof(sv->name), "%s", name);
    }
    __atomic_store_n(&sv->ready, ready, __ATOMIC_RELAXED);
    __atomic_store_n(&sv->busy, busy, __ATOMIC_RELAXED);
    __atomic_store_n(&sv->maxchild, maxchild, __ATOMIC_RELAXED);
    __atomic_store_n(&sv->forks, forks, __ATOMIC_RELAXED);
    __atomic_store_n(&sv->crashes, crashes, __ATOMIC_RELAXED);
}

void metrics_detach(void)
{
    if (metrics_map)
        munmap(metrics_map, sizeof(*metrics_map));
    metrics_map = NULL;
    metrics_slot = NULL;
    metrics_slot_shared = 0;
}

int metrics_open_read(const char *path, const struct metrics_shm **shm_r)
{
    struct metrics_shm *shm;
    int e = metrics_map_file(path, 0, &shm);

    if (!e)
        *shm_r = shm;
    return e;
}

int metrics_sum(const struct metrics_shm *shm, struct metrics_slot *sum,
                struct metrics_service services[METRICS_SERVICES])
{
    int tries, i;

    for (tries = 0; tries < 1000; tries++) {
        uint64_t s1 = __atomic_load_n(&shm->seq, __ATOMIC_SEQ_CST), s2;

        if (s1 & 1) {
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
            continue;
        }
        memset(sum, 0, sizeof(*sum));
        metrics_fold(sum, &shm->base);
        metrics_fold(sum, &shm->overflow);
        for (i = 0; i < METRICS_SLOTS; i++)
            metrics_fold(sum, &shm->slots[i]);
        s2 = __atomic_load_n(&shm->seq, __ATOMIC_SEQ_CST);
        if (s1 != s2)
            continue;
        for (i = 0; i < METRICS_SERVICES; i++) {
            memcpy(services[i].name, shm->services[i].name,
                   sizeof(services[i].name));
            services[i].name[sizeof(services[i].name) - 1] = '\0';
            services[i].ready = __atomic_load_n(&shm->services[i].ready,
                                                __ATOMIC_RELAXED);
            services[i].busy = __atomic_load_n(&shm->services[i].busy,
                                               __ATOMIC_RELAXED);
            services[i].maxchild = __atomic_load_n(
                &shm->services[i].maxchild, __ATOMIC_RELAXED);
            services[i].forks = __atomic_load_n(&shm->services[i].forks,
                                                __ATOMIC_RELAXED);
            services[i].crashes = __atomic_load_n(
                &shm->services[i].crashes, __ATOMIC_RELAXED);
        }
        return 0;
    }
    return -1;
}

/* ---- counting ---------------------------------------------------------- */

void metrics_observe(struct metrics_hist *h, uint64_t us)
{
    int i;

    for (i = 0; i < METRICS_NBUCKETS; i++)
        if (us <= metrics_bucket_us[i])
            break;
    if (i < METRICS_NBUCKETS)
        metrics_add64(&h->bucket[i], 1);
    metrics_add64(&h->sum_us, us);
    metrics_add64(&h->count, 1);
}

void metrics_lmtp_final(const char *reply, uint64_t rcpt_us, uint64_t size)
{
    size_t elen;
    const char *enh;
    int i;

    if (!metrics_slot || !reply)
        return;
    enh = strchr(reply, ' ');
    enh = enh ? enh + 1 : "";
    elen = strcspn(enh, " ");
    for (i = 0; i < METRICS_NREPLIES - 1; i++)
        if (strncmp(reply, metrics_reply_code[i], 3) == 0
            && strlen(metrics_reply_enhanced[i]) == elen
            && strncmp(enh, metrics_reply_enhanced[i], elen) == 0)
            break;
    metrics_add64(&metrics_slot->reply[i], 1);
    if (i == 0) {
        uint64_t now = metrics_now_us();

        metrics_add64(&metrics_slot->counter[METRICS_LMTP_BYTES], size);
        metrics_observe(&metrics_slot->delivery,
                        now > rcpt_us ? now - rcpt_us : 0);
    } else if (elen == 5 && strncmp(enh + 1, ".2.2", 4) == 0) {
        metrics_add64(&metrics_slot->counter[METRICS_QUOTA_REFUSALS], 1);
    }
}

void metrics_imap_command(int id, uint64_t start_us)
{
    uint64_t now;

    if (!metrics_slot)
        return;
    if (id < 0 || id >= METRICS_NIMAPCMDS)
        id = 0;
    now = metrics_now_us();
    metrics_observe(&metrics_slot->imap[id],
                    now > start_us ? now - start_us : 0);
}

int metrics_db_index(const char *fname)
{
    const char *b = fname ? strrchr(fname, '/') : NULL;
    size_t n;

    b = b ? b + 1 : (fname ? fname : "");
    n = strlen(b);
    if (strcmp(b, "mailboxes.db") == 0) return 0;
    if (strcmp(b, "deliver.db") == 0) return 1;
    if (strcmp(b, "quotas.db") == 0) return 2;
    if (n > 5 && strcmp(b + n - 5, ".seen") == 0) return 3;
    if (n > 4 && strcmp(b + n - 4, ".sub") == 0) return 4;
    return METRICS_NDBS - 1;
}

void metrics_db_error(int db, const char *backend)
{
    int b;

    if (!metrics_slot)
        return;
    if (db < 0 || db >= METRICS_NDBS)
        db = METRICS_NDBS - 1;
    for (b = 0; b < METRICS_NBACKENDS - 1; b++)
        if (backend && strcmp(backend, metrics_backend_name[b]) == 0)
            break;
    metrics_add64(&metrics_slot->db_errors[db][b], 1);
}
