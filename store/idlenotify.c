/*
 * idlenotify.c - push notification of mailbox changes to IDLE sessions
 * (see idlenotify.h).
 *
 * CONFIGDIR/idle.shm, struct idle_shm: magic, version, the table's
 * random id (in every socket name), a high-water mark (slots at or past
 * it were never used: writers stop there) and the slots.  A slot is
 * { pid, hash, seq }: pid 0 = free.  It is claimed with a compare-and-
 * swap of pid 0 -> own pid, then hash and seq are stored; it is freed by
 * storing pid 0 (the owner), or by a compare-and-swap of the seen pid ->
 * 0 (a writer whose datagram found no socket).  A reader may see a slot
 * between those steps with a stale hash or seq: at worst a datagram goes
 * to a session that did not need it, or to no one; a session never
 * relies on a datagram for correctness, only for promptness.
 *
 * The socket of a watch: AF_UNIX SOCK_DGRAM bound to the abstract name
 * "\0cyrusdeliver-idle-ID-PID-SEQ" (ID the table's, SEQ counts the
 * process's watches), non-blocking, close-on-exec.
 *
 * Creation: open(O_CREAT, 0600), an exclusive fcntl lock, and if the file
 * is short or its magic or version is wrong it is (re)initialised under
 * the lock; then the lock is dropped and the file mapped.  The table
 * holds no durable state: losing it loses only wake-ups of sessions idle
 * at that moment, which then wait for their next (polled) check.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "store/idlenotify.h"

#define IDLE_SHM_NAME "idle.shm"
#define IDLE_SHM_MAGIC 0x49444c45u      /* "IDLE" */
#define IDLE_SHM_VERSION 1u

struct idle_slot {
    int32_t pid;            /* 0 = free */
    uint32_t hash;          /* of the watched spool directory */
    uint32_t seq;           /* the owner's watch number */
    uint32_t pad;
};

struct idle_shm {
    uint32_t magic;
    uint32_t version;
    uint32_t nslots;
    uint32_t hwm;           /* slots [hwm, nslots) were never claimed */
    uint64_t id;            /* random: part of every socket name */
    uint64_t pad;
    struct idle_slot slots[IDLENOTIFY_SLOTS];
};

struct idlenotify_watch {
    int fd;
    uint32_t slot;
    uint32_t seq;
    uint32_t hash;
};

/* The mapping of this process (one configdirectory per process). */
static struct idle_shm *idle_map;
static char *idle_map_dir;
static int idle_map_failed;
static uint32_t idle_seq;
static unsigned long long idle_sent, idle_freed;

static uint32_t idle_hash(const char *s)
{
    uint32_t h = 2166136261u;       /* FNV-1a */

    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h ? h : 1;
}

static int idle_lock(int fd, short type)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    while (fcntl(fd, F_SETLKW, &fl) < 0)
        if (errno != EINTR)
            return -1;
    return 0;
}

static int idle_init_file(int fd)
{
    struct idle_shm *h;
    struct stat st;
    int ok = 0;

    if (fstat(fd, &st) == 0 && (size_t)st.st_size == sizeof(struct idle_shm)) {
        struct idle_shm head;

        if (pread(fd, &head, offsetof(struct idle_shm, slots), 0) ==
                (ssize_t)offsetof(struct idle_shm, slots) &&
            head.magic == IDLE_SHM_MAGIC && head.version == IDLE_SHM_VERSION &&
            head.nslots == IDLENOTIFY_SLOTS && head.hwm <= IDLENOTIFY_SLOTS)
            return 0;
    }
    h = calloc(1, sizeof(*h));
    if (!h)
        return -1;
    h->magic = IDLE_SHM_MAGIC;
    h->version = IDLE_SHM_VERSION;
    h->nslots = IDLENOTIFY_SLOTS;
    if (getrandom(&h->id, sizeof(h->id), 0) != (ssize_t)sizeof(h->id))
        h->id = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    if (ftruncate(fd, 0) == 0 &&
        pwrite(fd, h, sizeof(*h), 0) == (ssize_t)sizeof(*h))
        ok = 1;
    free(h);
    return ok ? 0 : -1;
}

/* The table of conf's configdirectory, mapped once per process. */
static struct idle_shm *idle_shm_get(const struct imapconf *conf)
{
    const char *dir = imapconf_getstring(conf, "configdirectory");
    char path[4096];
    void *p;
    int fd;

    if (!dir)
        return NULL;
    if (idle_map && idle_map_dir && strcmp(idle_map_dir, dir) == 0)
        return idle_map;
    if (idle_map_failed)
        return NULL;
    if (idle_map) {            /* another configdirectory: remap */
        munmap(idle_map, sizeof(*idle_map));
        idle_map = NULL;
        free(idle_map_dir);
        idle_map_dir = NULL;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, IDLE_SHM_NAME);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        goto fail;
    if (idle_lock(fd, F_WRLCK) < 0 || idle_init_file(fd) < 0) {
        close(fd);
        goto fail;
    }
    p = mmap(NULL, sizeof(struct idle_shm), PROT_READ | PROT_WRITE,
             MAP_SHARED, fd, 0);
    (void)idle_lock(fd, F_UNLCK);
    close(fd);
    if (p == MAP_FAILED)
        goto fail;
    idle_map = p;
    idle_map_dir = strdup(dir);
    if (!idle_map_dir) {
        munmap(p, sizeof(struct idle_shm));
        idle_map = NULL;
        goto fail;
    }
    return idle_map;
fail:
    log_warning("idle: no push notification for IDLE, sessions poll "
                "path=<%s> error=<%s>", path, strerror(errno));
    idle_map_failed = 1;
    return NULL;
}

static socklen_t idle_addr(const struct idle_shm *h, int32_t pid,
                           uint32_t seq, struct sockaddr_un *sa)
{
    int n;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
                 "cyrusdeliver-idle-%016llx-%ld-%lu",
                 (unsigned long long)h->id, (long)pid, (unsigned long)seq);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

int idlenotify_watch(const struct imapconf *conf, const char *dir,
                     struct idlenotify_watch **w_r)
{
    struct idle_shm *h = idle_shm_get(conf);
    struct idlenotify_watch *w;
    struct sockaddr_un sa;
    socklen_t len;
    int32_t me = (int32_t)getpid();
    uint32_t i;

    *w_r = NULL;
    if (!h || !dir)
        return -1;
    w = calloc(1, sizeof(*w));
    if (!w)
        return -1;
    w->seq = ++idle_seq;
    w->hash = idle_hash(dir);
    w->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    len = idle_addr(h, me, w->seq, &sa);
    if (w->fd < 0 || bind(w->fd, (struct sockaddr *)&sa, len) < 0) {
        log_warning("idle: cannot make a notification socket error=<%s>",
                    strerror(errno));
        goto fail;
    }
    for (i = 0; i < IDLENOTIFY_SLOTS; i++) {
        int32_t zero = 0;

        if (__atomic_load_n(&h->slots[i].pid, __ATOMIC_RELAXED) != 0)
            continue;
        if (!__atomic_compare_exchange_n(&h->slots[i].pid, &zero, me, 0,
                                         __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
            continue;
        __atomic_store_n(&h->slots[i].seq, w->seq, __ATOMIC_RELAXED);
        __atomic_store_n(&h->slots[i].hash, w->hash, __ATOMIC_RELEASE);
        /* raise the high-water mark to cover slot i */
        {
            uint32_t hwm = __atomic_load_n(&h->hwm, __ATOMIC_RELAXED);

            while (hwm < i + 1 &&
                   !__atomic_compare_exchange_n(&h->hwm, &hwm, i + 1, 0,
                                                __ATOMIC_ACQ_REL,
                                                __ATOMIC_RELAXED))
                ;
        }
        w->slot = i;
        *w_r = w;
        return w->fd;
    }
    log_warning("idle: all %d notification slots in use, the session "
                "polls", IDLENOTIFY_SLOTS);
fail:
    if (w->fd >= 0)
        close(w->fd);
    free(w);
    return -1;
}

int idlenotify_fd(const struct idlenotify_watch *w)
{
    return w ? w->fd : -1;
}

int idlenotify_drain(struct idlenotify_watch *w)
{
    char b[64];
    int n = 0;

    if (!w)
        return 0;
    while (recv(w->fd, b, sizeof(b), MSG_DONTWAIT) >= 0)
        n++;
    /* a writer that mistook the slot for a dead one's may have freed it:
     * take it back (or another), so that wake-ups go on */
    if (idle_map) {
        struct idle_slot *sl = &idle_map->slots[w->slot];
        int32_t zero = 0, me = (int32_t)getpid();

        if (__atomic_load_n(&sl->pid, __ATOMIC_ACQUIRE) != me &&
            __atomic_compare_exchange_n(&sl->pid, &zero, me, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            __atomic_store_n(&sl->seq, w->seq, __ATOMIC_RELAXED);
            __atomic_store_n(&sl->hash, w->hash, __ATOMIC_RELEASE);
        }
    }
    return n;
}

void idlenotify_unwatch(struct idlenotify_watch **wp)
{
    struct idlenotify_watch *w = *wp;

    if (!w)
        return;
    if (idle_map) {
        struct idle_slot *sl = &idle_map->slots[w->slot];
        int32_t me = (int32_t)getpid();

        if (__atomic_load_n(&sl->pid, __ATOMIC_ACQUIRE) == me &&
            __atomic_load_n(&sl->seq, __ATOMIC_RELAXED) == w->seq) {
            __atomic_store_n(&sl->hash, 0, __ATOMIC_RELAXED);
            __atomic_compare_exchange_n(&sl->pid, &me, 0, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
        }
    }
    close(w->fd);
    free(w);
    *wp = NULL;
}

void idlenotify_changed(const struct imapconf *conf, const char *dir)
{
    struct idle_shm *h;
    uint32_t hash, hwm, i;
    int fd = -1;

    if (!dir || !conf)
        return;
    h = idle_shm_get(conf);
    if (!h)
        return;
    hwm = __atomic_load_n(&h->hwm, __ATOMIC_ACQUIRE);
    if (hwm > IDLENOTIFY_SLOTS)
        hwm = IDLENOTIFY_SLOTS;
    hash = idle_hash(dir);
    for (i = 0; i < hwm; i++) {
        struct idle_slot *sl = &h->slots[i];
        struct sockaddr_un sa;
        socklen_t len;
        int32_t pid = __atomic_load_n(&sl->pid, __ATOMIC_ACQUIRE);

        if (pid == 0 || __atomic_load_n(&sl->hash, __ATOMIC_ACQUIRE) != hash)
            continue;
        if (fd < 0) {
            fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        0);
            if (fd < 0)
                return;
        }
        len = idle_addr(h, pid, __atomic_load_n(&sl->seq, __ATOMIC_RELAXED),
                        &sa);
        if (sendto(fd, "!", 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                   (struct sockaddr *)&sa, len) == 1) {
            idle_sent++;
        } else if (errno == ECONNREFUSED || errno == ENOENT) {
            /* nobody bound: the session is gone without freeing it */
            if (__atomic_compare_exchange_n(&sl->pid, &pid, 0, 0,
                                            __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
                idle_freed++;
        }
        /* EAGAIN: its queue is full, so a wake-up is pending anyway */
    }
    if (fd >= 0)
        close(fd);
}

void idlenotify_counters(unsigned long long *sent_r,
                         unsigned long long *freed_r)
{
    if (sent_r)
        *sent_r = idle_sent;
    if (freed_r)
        *freed_r = idle_freed;
}
