/*
 * cyrusdb_db3.c - the "db3" and "db3-nosync" cyrusdb backends: a Berkeley
 * DB 5.3 btree inside a transactional environment, laid out as Cyrus IMAP
 * lays out its Berkeley databases.
 *
 * On disk: FNAME is a Berkeley DB btree file (meta page magic 0x053162 at
 * byte 12, in the byte order of the machine that wrote it), with page
 * checksums.  Beside it, the directory DIR/db (DIR = the directory of FNAME)
 * is the environment: the write-ahead log (log.NNNNNNNNNN), the shared
 * regions (__db.001 ...: cache, locks, log buffer, transactions; files on
 * disk, so that every process using the databases of DIR shares them) and
 * __db.register (the processes that have the environment open).  All db3
 * databases of DIR share that one environment.  Files are opened by their
 * base name, the environment's data directory being "..", so the log names
 * them relative to DIR and the whole directory can be moved.
 *
 * Processes: a process opens the environment of a directory once and
 * counts its handles on it; the last close closes it.  Handles and the
 * environment belong to the process that opened them: after fork() the
 * child opens its own (an environment inherited from the parent is never
 * touched by the child).
 *
 * Transactions: a cyrusdb transaction is one Berkeley DB transaction; a
 * write with tid == NULL is a transaction of its own, retried a few times
 * when chosen as a deadlock victim.  Reads with tid == NULL (fetch, foreach,
 * dump, consistent) run in a snapshot transaction (MVCC, DB_TXN_SNAPSHOT):
 * they see the last committed state, take no locks, and so never block on
 * or deadlock with writers, including this handle's own open transaction.
 * fetchlock reads with DB_RMW, taking the write lock at once, so two
 * read-modify-write cycles on one key queue up instead of deadlocking.
 * Deadlocks are found by the lock manager at every blocked lock request
 * (set_lk_detect); a lock wait longer than DB3_LOCK_TIMEOUT also fails.
 * Both give CYRUSDB_AGAIN: with tid == NULL the transaction has been
 * aborted; with an explicit transaction the caller must abort it.
 *
 * Crash safety: Berkeley DB writes every change to the log before the page
 * it changes reaches FNAME (write-ahead logging), and a commit of "db3"
 * writes and fsyncs the log up to its commit record before it returns, so
 * a committed transaction survives any crash.  "db3-nosync" commits with
 * DB_TXN_WRITE_NOSYNC: the log is written to the kernel but not fsynced,
 * so the commit survives the death of the process (SIGKILL) but the last
 * commits may be lost if the machine goes down; write-ahead order still
 * holds (the log is forced before any data page is written), so recovery
 * always brings FNAME back to a consistent committed state.  DB_TXN_NOSYNC
 * was not chosen: it leaves the commit record in the shared log buffer,
 * lost even when only the process dies.  A handle opened with
 * CYRUSDB_NOSYNC behaves as "db3-nosync" whatever its name.  The choice is
 * made per transaction (DB_TXN_WRITE_NOSYNC or DB_TXN_SYNC at txn_begin),
 * never on the shared environment, so other handles and processes on the
 * same environment keep their durability; a synchronous commit flushes
 * the whole log, which makes earlier no-sync commits durable too.  After a crash, recovery (redo of
 * committed, undo of uncommitted changes from the log) is run by
 * db3_recover() (ctl_cyrusdb -r, before workers start).  A process that
 * dies while others keep working (a SIGKILLed worker) is handled without
 * stopping them: every open of a handle runs failchk, which releases the
 * dead process's locks and aborts its transaction (waking any process
 * blocked on those locks), and an environment open that finds the dead
 * process in __db.register does the same, or full recovery when failchk
 * cannot (DB_REGISTER | DB_FAILCHK | DB_RECOVER).  An environment that
 * needs recovery and cannot get it (DB_RUNRECOVERY) fails every call with
 * CYRUSDB_IOERROR and a log line naming ctl_cyrusdb -r.  Limitation: Berkeley
 * DB checks lock timeouts only when deadlock detection runs, so a process
 * blocked on a lock of a dead process waits until some process opens a
 * database of the directory or requests a conflicting lock.
 *
 * Opening and closing the environment (DIR/db/cyrusdb.lock).  Berkeley DB
 * 5.3 takes region mutexes (process-shared pthread mutexes) while it joins
 * or leaves an environment; a process SIGKILLed there leaves one held for
 * good.  DB_REGISTER notices the dead process, but with DB_FAILCHK it
 * first joins the regions to run failchk, blocks on that very mutex
 * before failchk can run, and every later opener queues up behind it.
 * Recovery (DB_RECOVER) takes no mutex: it removes and rebuilds the
 * regions.  So environment open and close are bracketed by a protocol of
 * fcntl locks on DIR/db/cyrusdb.lock (fcntl locks vanish with their
 * process, so a dead process can hold none of them):
 *   - byte 0, the gate: held exclusively around env->open and env->close;
 *   - byte 2, the mark: set to '1' on taking the gate and back to '0' on
 *     leaving it, so a holder of the gate that finds it '1' knows the
 *     previous holder died inside an open or close;
 *   - byte 1, users: held shared by every process for as long as it has
 *     the environment open.  A holder of the gate that can lock it
 *     exclusively (without waiting) knows that no live process has the
 *     environment open, and that none can join before it leaves the gate.
 * An opener that is alone opens with DB_REGISTER | DB_RECOVER and without
 * DB_FAILCHK: if some process died with the environment open (the
 * register says so) or inside an open or close (the mark says so; it then
 * removes __db.register to force it), Berkeley DB runs full recovery,
 * which joins no mutex, and nobody is there to disturb.  An opener that is
 * not alone and finds the mark set also opens without DB_FAILCHK: the
 * dead process is in the register, so Berkeley DB's register protocol
 * panics the environment of the live processes (their calls fail with
 * DB_RUNRECOVERY, mapped to CYRUSDB_IOERROR until they reopen) and
 * recovers.  Otherwise (not alone, mark clear) it opens with
 * DB_REGISTER | DB_FAILCHK | DB_RECOVER as described above, so a worker
 * killed outside the library disturbs nobody.  db3_recover takes the gate
 * too and refuses (CYRUSDB_LOCKED) when another process has the
 * environment open.  Limitation (Berkeley DB 5.3 has no way out of it): a
 * process killed inside the library while other processes keep the
 * environment open may leave a region mutex held; a live process that
 * then needs that mutex (even in env->close) blocks for good, and the
 * gate then makes later openers wait behind it.  Only stopping every
 * process and running ctl_cyrusdb -r clears that.
 *
 * Checkpoints (db3_checkpoint, db3_checkpoint_dir, and the close of a
 * writable handle when enough log has built up) write the cache to the
 * files and remove the log files no longer needed for recovery.
 */
#include "config.h"

#include <db.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_backends.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"

#define DB3_ENV_SUBDIR "db"                /* environment: DIR/db */
#define DB3_CACHE_BYTES (8u * 1024 * 1024) /* shared cache per environment */
#define DB3_LOG_MAX (4u * 1024 * 1024)     /* size of one log file */
#define DB3_LOCK_TIMEOUT 15000000u         /* us a lock request may wait */
#define DB3_THREADS 1024u                  /* processes tracked for failchk */
#define DB3_LK_MAX 20000u                  /* locks, lock objects, lockers */
#define DB3_RETRIES 8                      /* tid == NULL deadlock retries */
#define DB3_AUTO_CHECKPOINT_KB 1024u       /* checkpoint at close past this */
#define DB3_FILE_MODE 0644
#define DB3_DIR_MODE 0755
#define DB3_MAX_KEY 512                    /* keys are at most 511 bytes */
#define DB3_GATE_FILE "cyrusdb.lock"       /* in DIR/db: see "Opening" above */
#define DB3_GATE_BYTE 0                    /* exclusive around env open/close */
#define DB3_USERS_BYTE 1                   /* shared while the env is open */
#define DB3_MARK_BYTE 2                    /* '1' while an open/close runs */

/* One open environment of this process (one per directory). */
struct db3_env {
    struct db3_env *next;
    char *home;            /* absolute path of DIR/db */
    DB_ENV *env;
    int gatefd;            /* DIR/db/cyrusdb.lock, holding our users lock */
    pid_t pid;             /* the process that opened it */
    int refcount;          /* handles using it (and directory calls) */
    int txns_open;         /* explicit transactions open on its handles */
    int dead;              /* DB_RUNRECOVERY seen: no new handles */
};

/* The transaction a handle has open: handed out as struct cyrusdb_txn *. */
struct db3_txn {
    DB_TXN *txn;           /* NULL when none is open */
};

struct db3_db {
    struct cyrusdb hdr;    /* must be first: cyrusdb.c fills it */
    char *fname;
    int flags;             /* open flags */
    int variant;           /* CYRUSDB_VARIANT_NOSYNC or 0 */
    pid_t pid;             /* the process that opened it */
    struct db3_env *env;
    DB *db;
    struct db3_txn txn;    /* the handle's explicit transaction */
    int deadlock;          /* the last AGAIN was a deadlock (retryable) */
    DBT fetchval;          /* value returned by fetch (DB_DBT_REALLOC) */
    struct buf eachkey;    /* record handed to foreach callbacks */
    struct buf eachval;
};

static struct db3_env *db3_envs;   /* this process's open environments */

/* ---- messages and errors --------------------------------------------- */

static void db3_errcall(const DB_ENV *env, const char *prefix, const char *msg)
{
    (void)env;
    log_error("db3: berkeley db error home=<%s> error=<%s>",
              prefix ? prefix : "", msg);
}

static void db3_msgcall(const DB_ENV *env, const char *msg)
{
    (void)env;
    log_info("db3: berkeley db message=<%s>", msg);
}

/* Map a Berkeley DB or errno code to a cyrusdb code, logging what needs
 * it.  DB_NOTFOUND and DB_KEYEXIST are the caller's to interpret first. */
static int db3_map(struct db3_db *h, const char *fname, int ret, const char *what)
{
    if (h)
        h->deadlock = 0;
    switch (ret) {
    case 0:
        return CYRUSDB_OK;
    case DB_NOTFOUND:
        return CYRUSDB_NOTFOUND;
    case DB_KEYEXIST:
        return CYRUSDB_EXISTS;
    case DB_LOCK_DEADLOCK:
        if (h)
            h->deadlock = 1;
        log_debug("db3: deadlock op=<%s> file=<%s>", what, fname);
        return CYRUSDB_AGAIN;
    case DB_LOCK_NOTGRANTED:
        log_warning("db3: lock not granted (held too long or by this "
                    "process's other handle) op=<%s> file=<%s>", what, fname);
        /* the holder may be a dead process: release what it held */
        if (h && h->env && !h->env->dead &&
            h->env->env->failchk(h->env->env, 0) == DB_RUNRECOVERY)
            return db3_map(h, fname, DB_RUNRECOVERY, "failchk");
        return CYRUSDB_AGAIN;
    case ENOSPC:
#ifdef EDQUOT
    case EDQUOT:
#endif
        log_error("db3: %s failed file=<%s> error=<%s>", what, fname,
                  db_strerror(ret));
        return CYRUSDB_FULL;
    case DB_RUNRECOVERY:
        if (h && h->env)
            h->env->dead = 1;
        log_error("db3: %s failed file=<%s> error=<%s> "
                  "action=<database environment needs recovery: "
                  "run ctl_cyrusdb -r while no other process uses it>",
                  what, fname, db_strerror(ret));
        return CYRUSDB_IOERROR;
    default:
        log_error("db3: %s failed file=<%s> error=<%s>", what, fname,
                  db_strerror(ret));
        return CYRUSDB_IOERROR;
    }
}

/* ---- environments ---------------------------------------------------- */

/* For failchk: is the process that used the environment still there? */
static int db3_isalive(DB_ENV *env, pid_t pid, db_threadid_t tid, u_int32_t flags)
{
    (void)env;
    (void)tid;
    (void)flags;
    return kill(pid, 0) == 0 || errno == EPERM;
}

/* Create a DB_ENV handle configured as every opener must configure it. */
static int db3_env_create(const char *home, DB_ENV **env_r)
{
    DB_ENV *env = NULL;
    int ret;

    *env_r = NULL;
    if ((ret = db_env_create(&env, 0)) != 0)
        return ret;
    env->set_errcall(env, db3_errcall);
    env->set_msgcall(env, db3_msgcall);
    env->set_errpfx(env, home);   /* kept as a pointer: home must outlive env */
    if ((ret = env->set_data_dir(env, "..")) != 0 ||
        (ret = env->set_cachesize(env, 0, DB3_CACHE_BYTES, 1)) != 0 ||
        (ret = env->set_lg_max(env, DB3_LOG_MAX)) != 0 ||
        (ret = env->set_lk_detect(env, DB_LOCK_DEFAULT)) != 0 ||
        (ret = env->set_lk_max_locks(env, DB3_LK_MAX)) != 0 ||
        (ret = env->set_lk_max_objects(env, DB3_LK_MAX)) != 0 ||
        (ret = env->set_lk_max_lockers(env, DB3_LK_MAX)) != 0 ||
        (ret = env->set_timeout(env, DB3_LOCK_TIMEOUT, DB_SET_LOCK_TIMEOUT)) != 0 ||
        (ret = env->set_thread_count(env, DB3_THREADS)) != 0 ||
        (ret = env->set_isalive(env, db3_isalive)) != 0) {
        env->close(env, 0);
        return ret;
    }
    *env_r = env;
    return 0;
}

#define DB3_ENV_FLAGS \
    (DB_CREATE | DB_INIT_TXN | DB_INIT_LOCK | DB_INIT_LOG | DB_INIT_MPOOL)

/* fcntl lock (F_RDLCK, F_WRLCK, F_UNLCK) of one byte of the gate file. */
static int db3_gate_lock(int fd, short type, off_t byte, int wait)
{
    struct flock fl;
    int r;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = byte;
    fl.l_len = 1;
    do {
        r = fcntl(fd, wait ? F_SETLKW : F_SETLK, &fl);
    } while (r < 0 && errno == EINTR);
    return r;
}

/* Set or clear the mark that an environment open or close is under way. */
static int db3_gate_mark(int fd, int on)
{
    char c = on ? '1' : '0';

    return pwrite(fd, &c, 1, DB3_MARK_BYTE) == 1 ? 0 : -1;
}

/* Open DIR/db/cyrusdb.lock; -1 (logged) on failure.  One descriptor per
 * environment and process: closing any descriptor of the file would drop
 * every fcntl lock the process holds on it. */
static int db3_gate_open(const char *home)
{
    char *path = malloc(strlen(home) + sizeof("/" DB3_GATE_FILE));
    int fd;

    if (!path)
        return -1;
    strcpy(path, home);
    strcat(path, "/" DB3_GATE_FILE);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, DB3_FILE_MODE);
    if (fd < 0)
        log_error("db3: cannot open file=<%s> error=<%s>", path, strerror(errno));
    free(path);
    return fd;
}

/* Take the gate (waiting for it).  *dirty_r: the mark was left set, i.e.
 * the previous holder of the gate died inside an environment open or
 * close.  Then set the mark for ourselves. */
static int db3_gate_enter(int fd, const char *home, int *dirty_r)
{
    char c = '0';

    *dirty_r = 0;
    if (db3_gate_lock(fd, F_WRLCK, DB3_GATE_BYTE, 1) < 0 ||
        pread(fd, &c, 1, DB3_MARK_BYTE) < 0 || db3_gate_mark(fd, 1) < 0) {
        log_error("db3: cannot take the open gate home=<%s> error=<%s>",
                  home, strerror(errno));
        db3_gate_lock(fd, F_UNLCK, DB3_GATE_BYTE, 0);
        return -1;
    }
    *dirty_r = c == '1';
    return 0;
}

/* Clear the mark and release the gate (the descriptor stays open). */
static void db3_gate_leave(int fd, const char *home)
{
    if (db3_gate_mark(fd, 0) < 0 ||
        db3_gate_lock(fd, F_UNLCK, DB3_GATE_BYTE, 0) < 0)
        log_error("db3: cannot release the open gate home=<%s> error=<%s>",
                  home, strerror(errno));
}

/* Holding the gate: does no other live process have the environment
 * open?  On success we hold the users byte exclusively (the caller turns
 * that into a shared lock or drops it). */
static int db3_gate_alone(int fd)
{
    return db3_gate_lock(fd, F_WRLCK, DB3_USERS_BYTE, 0) == 0;
}

/* Remove DIR/db/__db.register: the next DB_REGISTER open then runs
 * recovery.  Only while holding the gate and alone. */
static void db3_register_remove(const char *home)
{
    char *reg = malloc(strlen(home) + sizeof("/__db.register"));

    if (!reg)
        return;
    strcpy(reg, home);
    strcat(reg, "/__db.register");
    if (unlink(reg) < 0 && errno != ENOENT)
        log_warning("db3: cannot remove file=<%s> error=<%s>",
                    reg, strerror(errno));
    free(reg);
}

/* Find or open this process's environment at `home` and count a user. */
static int db3_env_get(const char *home, struct db3_env **env_r,
                       const char **error_r)
{
    struct db3_env *e;
    DB_ENV *env = NULL;
    pid_t pid = getpid();
    u_int32_t oflags;
    int ret, fd, dirty, alone;

    *env_r = NULL;
    for (e = db3_envs; e; e = e->next) {
        if (e->pid != pid || strcmp(e->home, home) != 0)
            continue;
        if (e->dead) {
            *error_r = "database environment needs recovery (run ctl_cyrusdb -r)";
            log_error("db3: environment unusable home=<%s> "
                      "action=<close all handles and run ctl_cyrusdb -r>", home);
            return CYRUSDB_IOERROR;
        }
        e->refcount++;
        *env_r = e;
        return CYRUSDB_OK;
    }

    if (mkdir(home, DB3_DIR_MODE) < 0 && errno != EEXIST) {
        log_error("db3: cannot create environment dir=<%s> error=<%s>",
                  home, strerror(errno));
        *error_r = "cannot create the database environment directory";
        return errno == ENOSPC ? CYRUSDB_FULL : CYRUSDB_IOERROR;
    }
    if ((ret = db3_env_create(home, &env)) != 0) {
        *error_r = "cannot create a database environment handle";
        return db3_map(NULL, home, ret, "env_create");
    }
    fd = db3_gate_open(home);
    if (fd < 0 || db3_gate_enter(fd, home, &dirty) < 0) {
        if (fd >= 0)
            close(fd);
        env->close(env, 0);
        *error_r = "cannot lock the database environment";
        return CYRUSDB_IOERROR;
    }
    alone = db3_gate_alone(fd);
    /* See "Opening" at the top of this file. */
    oflags = DB3_ENV_FLAGS | DB_REGISTER | DB_RECOVER;
    if (dirty && alone) {
        log_warning("db3: a process died while opening or closing the "
                    "environment home=<%s> action=<recovery>", home);
        db3_register_remove(home);
    } else if (dirty) {
        log_warning("db3: a process died while opening or closing the "
                    "environment home=<%s> action=<recovery; other processes "
                    "must reopen their databases>", home);
    } else if (!alone) {
        oflags |= DB_FAILCHK;
    }
    ret = env->open(env, home, oflags, DB3_FILE_MODE);
    if (ret == 0 && db3_gate_lock(fd, F_RDLCK, DB3_USERS_BYTE, 1) < 0) {
        log_error("db3: cannot lock the environment home=<%s> error=<%s>",
                  home, strerror(errno));
        ret = EIO;
    }
    if (ret != 0) {
        env->close(env, 0);
        db3_gate_leave(fd, home);
        close(fd);   /* drops the users byte too, if we held it */
        *error_r = ret == DB_RUNRECOVERY
            ? "database environment needs recovery (run ctl_cyrusdb -r)"
            : "cannot open the database environment";
        return db3_map(NULL, home, ret, "env_open");
    }

    e = calloc(1, sizeof(*e));
    if (!e || !(e->home = strdup(home))) {
        free(e);
        env->close(env, 0);
        db3_gate_leave(fd, home);
        close(fd);
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    db3_gate_leave(fd, home);
    env->set_errpfx(env, e->home);
    e->env = env;
    e->gatefd = fd;
    e->pid = pid;
    e->refcount = 1;
    e->next = db3_envs;
    db3_envs = e;
    *env_r = e;
    return CYRUSDB_OK;
}

/* Drop a user; the last one closes the environment. */
static void db3_env_put(struct db3_env *e)
{
    struct db3_env **pp;
    int ret;

    if (--e->refcount > 0)
        return;
    for (pp = &db3_envs; *pp; pp = &(*pp)->next) {
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    }
    if (e->pid == getpid()) {
        /* under the gate, so that dying inside close is noticed */
        int dirty, gated = db3_gate_enter(e->gatefd, e->home, &dirty) == 0;

        if (e->dead)   /* recovered under us: wait on none of its mutexes */
            e->env->set_flags(e->env, DB_NOLOCKING, 1);
        ret = e->env->close(e->env, 0);
        if (ret != 0 && !e->dead)
            log_error("db3: closing environment failed home=<%s> error=<%s>",
                      e->home, db_strerror(ret));
        db3_gate_lock(e->gatefd, F_UNLCK, DB3_USERS_BYTE, 0);
        if (gated)
            db3_gate_leave(e->gatefd, e->home);
    }
    close(e->gatefd);   /* a child's copy holds no lock: closing drops none */
    free(e->home);
    free(e);
}

/* Is this process using the environment at `home`? */
static struct db3_env *db3_env_find(const char *home)
{
    struct db3_env *e;

    for (e = db3_envs; e; e = e->next)
        if (e->pid == getpid() && !strcmp(e->home, home))
            return e;
    return NULL;
}

/* DIR/db for a directory, made absolute; malloc'd, NULL on failure. */
static char *db3_env_home(const char *dir)
{
    char *abs = realpath(dir, NULL);
    char *home;

    if (!abs)
        return NULL;
    home = malloc(strlen(abs) + sizeof("/" DB3_ENV_SUBDIR));
    if (home) {
        strcpy(home, abs);
        strcat(home, "/" DB3_ENV_SUBDIR);
    }
    free(abs);
    return home;
}

/* checkpoint and remove the log files recovery no longer needs */
static int db3_env_checkpoint(DB_ENV *env, unsigned kbyte, const char *name,
                              struct db3_db *h)
{
    int ret = env->txn_checkpoint(env, kbyte, 0, 0);

    if (ret == 0)
        ret = env->log_archive(env, NULL, DB_ARCH_REMOVE);
    return db3_map(h, name, ret, "checkpoint");
}

/* ---- whole-directory calls ------------------------------------------- */

static int db3_recover(const char *dir, int variant)
{
    char *home;
    struct stat st;
    DB_ENV *env = NULL;
    int ret, r, fd, dirty;

    (void)variant;
    home = db3_env_home(dir);
    if (!home)
        return errno == ENOENT ? CYRUSDB_OK : CYRUSDB_IOERROR;
    if (stat(home, &st) < 0 || !S_ISDIR(st.st_mode)) {
        free(home);   /* no environment: nothing of ours to recover */
        return CYRUSDB_OK;
    }
    if (db3_env_find(home)) {
        log_error("db3: recovery refused home=<%s> "
                  "error=<environment open in this process>", home);
        free(home);
        return CYRUSDB_LOCKED;
    }
    fd = db3_gate_open(home);
    if (fd < 0 || db3_gate_enter(fd, home, &dirty) < 0) {
        if (fd >= 0)
            close(fd);
        free(home);
        return CYRUSDB_IOERROR;
    }
    if (!db3_gate_alone(fd)) {
        /* rebuilding the regions under a live process is never safe */
        log_error("db3: recovery refused home=<%s> "
                  "error=<environment open in another process>", home);
        db3_gate_leave(fd, home);
        close(fd);
        free(home);
        return CYRUSDB_LOCKED;
    }
    /* Unconditional recovery: rebuild the regions, replay the log. */
    if ((ret = db3_env_create(home, &env)) == 0) {
        ret = env->open(env, home, DB3_ENV_FLAGS | DB_RECOVER, DB3_FILE_MODE);
        if (ret == 0)
            ret = env->txn_checkpoint(env, 0, 0, 0);
        if (ret == 0)
            ret = env->log_archive(env, NULL, DB_ARCH_REMOVE);
        env->close(env, 0);
    }
    r = db3_map(NULL, home, ret, "recover");
    if (r == CYRUSDB_OK) {
        /* The register lists the processes of before the recovery; they
         * are gone (recovery runs alone), so start it afresh. */
        db3_register_remove(home);
        log_info("db3: recovered environment home=<%s>", home);
    }
    /* a failed recovery leaves the mark set: the next opener recovers */
    if (r == CYRUSDB_OK)
        db3_gate_leave(fd, home);
    close(fd);
    free(home);
    return r;
}

static int db3_checkpoint_dir(const char *dir, int variant)
{
    struct db3_env *e;
    const char *err = NULL;
    char *home;
    struct stat st;
    int r;

    (void)variant;
    home = db3_env_home(dir);
    if (!home)
        return errno == ENOENT ? CYRUSDB_OK : CYRUSDB_IOERROR;
    if (stat(home, &st) < 0 || !S_ISDIR(st.st_mode)) {
        free(home);
        return CYRUSDB_OK;
    }
    r = db3_env_get(home, &e, &err);
    if (r == CYRUSDB_OK) {
        r = db3_env_checkpoint(e->env, 0, home, NULL);
        db3_env_put(e);
    }
    free(home);
    return r;
}

/* ---- format detection and key order ---------------------------------- */

/* A btree meta page: magic 0x053162 at byte 12, either byte order. */
static int db3_detect(const char *head, size_t len)
{
    const unsigned char *p = (const unsigned char *)head + 12;
    unsigned long le, be;

    if (len < 16)
        return 0;
    le = (unsigned long)p[0] | (unsigned long)p[1] << 8 |
         (unsigned long)p[2] << 16 | (unsigned long)p[3] << 24;
    be = (unsigned long)p[3] | (unsigned long)p[2] << 8 |
         (unsigned long)p[1] << 16 | (unsigned long)p[0] << 24;
    return le == 0x053162UL || be == 0x053162UL;
}

/* bt_compare for CYRUSDB_MBOXSORT files; set before every DB->open. */
static int db3_mbox_compare(DB *db, const DBT *a, const DBT *b)
{
    (void)db;
    return cyrusdb_compare(CYRUSDB_MBOXSORT, a->data, a->size,
                           b->data, b->size);
}

/* ---- transactions ---------------------------------------------------- */

/* How a data call got its transaction (see db3_txn_enter). */
enum db3_txn_kind {
    DB3_TXN_AUTO_READ,    /* tid == NULL read: a snapshot txn of its own */
    DB3_TXN_AUTO_WRITE,   /* tid == NULL write: a write txn of its own */
    DB3_TXN_BEGUN,        /* *tid was NULL: the handle's txn, begun now */
    DB3_TXN_GIVEN         /* *tid is the handle's open txn */
};

static int db3_txn_begin(struct db3_db *h, int snapshot, DB_TXN **txn_r)
{
    u_int32_t fl;
    int ret;

    if (snapshot) {
        fl = DB_TXN_SNAPSHOT;
    } else {
        fl = ((h->variant & CYRUSDB_VARIANT_NOSYNC) ||
              (h->flags & CYRUSDB_NOSYNC))
            ? DB_TXN_WRITE_NOSYNC : DB_TXN_SYNC;
        /* Another handle of this process has a transaction open: its locks
         * cannot be released while we wait, so do not wait for locks. */
        if (h->env->txns_open > 0)
            fl |= DB_TXN_NOWAIT;
    }
    *txn_r = NULL;
    ret = h->env->env->txn_begin(h->env->env, NULL, txn_r, fl);
    return db3_map(h, h->fname, ret, "txn_begin");
}

static int db3_txn_abort(struct db3_db *h, DB_TXN *txn)
{
    int ret = txn->abort(txn);

    return db3_map(h, h->fname, ret, "abort");
}

/* Is this handle usable by this process? */
static int db3_check_pid(struct db3_db *h)
{
    if (h->pid != getpid()) {
        log_error("db3: handle used in a process that did not open it "
                  "file=<%s>", h->fname);
        return CYRUSDB_INTERNAL;
    }
    return CYRUSDB_OK;
}

/* Find or begin the transaction a data call runs in. */
static int db3_txn_enter(struct db3_db *h, struct cyrusdb_txn **tid, int write,
                         DB_TXN **txn_r, enum db3_txn_kind *kind_r)
{
    int r;

    *txn_r = NULL;
    if ((r = db3_check_pid(h)) != CYRUSDB_OK)
        return r;
    if (!tid) {
        if (write && h->txn.txn)
            return CYRUSDB_LOCKED;
        *kind_r = write ? DB3_TXN_AUTO_WRITE : DB3_TXN_AUTO_READ;
        return db3_txn_begin(h, !write, txn_r);
    }
    if (!*tid) {
        if (h->txn.txn)
            return CYRUSDB_LOCKED;
        if ((r = db3_txn_begin(h, 0, &h->txn.txn)) != CYRUSDB_OK) {
            h->txn.txn = NULL;
            return r;
        }
        h->env->txns_open++;
        *tid = (struct cyrusdb_txn *)&h->txn;
        *kind_r = DB3_TXN_BEGUN;
        *txn_r = h->txn.txn;
        return CYRUSDB_OK;
    }
    if (*tid != (struct cyrusdb_txn *)&h->txn || !h->txn.txn)
        return CYRUSDB_INTERNAL;
    *kind_r = DB3_TXN_GIVEN;
    *txn_r = h->txn.txn;
    return CYRUSDB_OK;
}

/* End what db3_txn_enter began, given the call's result r. */
static int db3_txn_leave(struct db3_db *h, struct cyrusdb_txn **tid,
                         DB_TXN *txn, enum db3_txn_kind kind, int r)
{
    int r2;

    switch (kind) {
    case DB3_TXN_AUTO_READ:
        r2 = db3_map(h, h->fname, txn->commit(txn, 0), "commit");
        return r2 != CYRUSDB_OK && r >= 0 ? r2 : r;
    case DB3_TXN_AUTO_WRITE:
        if (r == CYRUSDB_OK)
            return db3_map(h, h->fname, txn->commit(txn, 0), "commit");
        db3_txn_abort(h, txn);
        return r;
    case DB3_TXN_BEGUN:
        /* a failure in the call that began it: do not hand it back */
        if (r < 0 && r != CYRUSDB_NOTFOUND && r != CYRUSDB_EXISTS) {
            h->txn.txn = NULL;
            h->env->txns_open--;
            *tid = NULL;
            db3_txn_abort(h, txn);
        }
        return r;
    case DB3_TXN_GIVEN:
        break;
    }
    return r;
}

static int db3_commit(struct cyrusdb *db, struct cyrusdb_txn *tid)
{
    struct db3_db *h = (struct db3_db *)db;
    DB_TXN *txn;
    int r;

    if ((r = db3_check_pid(h)) != CYRUSDB_OK)
        return r;
    if (tid != (struct cyrusdb_txn *)&h->txn || !h->txn.txn)
        return CYRUSDB_INTERNAL;
    txn = h->txn.txn;
    h->txn.txn = NULL;
    h->env->txns_open--;
    return db3_map(h, h->fname, txn->commit(txn, 0), "commit");
}

static int db3_abort(struct cyrusdb *db, struct cyrusdb_txn *tid)
{
    struct db3_db *h = (struct db3_db *)db;
    DB_TXN *txn;
    int r;

    if ((r = db3_check_pid(h)) != CYRUSDB_OK)
        return r;
    if (tid != (struct cyrusdb_txn *)&h->txn || !h->txn.txn)
        return CYRUSDB_INTERNAL;
    txn = h->txn.txn;
    h->txn.txn = NULL;
    h->env->txns_open--;
    return db3_txn_abort(h, txn);
}

/* ---- data calls ------------------------------------------------------ */

enum db3_op_kind { DB3_FETCH, DB3_FETCHLOCK, DB3_CREATE, DB3_STORE, DB3_DELETE };

struct db3_op {
    enum db3_op_kind kind;
    const char *key;
    size_t keylen;
    const char *data;
    size_t datalen;
    const char **data_r;
    size_t *datalen_r;
    int force;
};

static void db3_dbt(DBT *d, const void *data, size_t len)
{
    memset(d, 0, sizeof(*d));
    d->data = (void *)(size_t)data;   /* Berkeley DB does not write it */
    d->size = (u_int32_t)len;
}

/* One key operation inside txn. */
static int db3_op_run(struct db3_db *h, DB_TXN *txn, const struct db3_op *op)
{
    DBT k, v;
    int ret;

    db3_dbt(&k, op->key, op->keylen);
    switch (op->kind) {
    case DB3_FETCH:
    case DB3_FETCHLOCK:
        h->fetchval.flags = DB_DBT_REALLOC;
        ret = h->db->get(h->db, txn, &k, &h->fetchval,
                         op->kind == DB3_FETCHLOCK ? DB_RMW : 0);
        if (ret == DB_NOTFOUND)
            return CYRUSDB_NOTFOUND;
        if (ret != 0)
            return db3_map(h, h->fname, ret, "fetch");
        if (op->data_r)
            *op->data_r = h->fetchval.size ? (const char *)h->fetchval.data : "";
        if (op->datalen_r)
            *op->datalen_r = h->fetchval.size;
        return CYRUSDB_OK;
    case DB3_CREATE:
    case DB3_STORE:
        if (op->datalen > UINT32_MAX)
            return CYRUSDB_FULL;
        db3_dbt(&v, op->data, op->datalen);
        ret = h->db->put(h->db, txn, &k, &v,
                         op->kind == DB3_CREATE ? DB_NOOVERWRITE : 0);
        if (ret == DB_KEYEXIST)
            return CYRUSDB_EXISTS;
        return db3_map(h, h->fname, ret, "store");
    case DB3_DELETE:
        ret = h->db->del(h->db, txn, &k, 0);
        if (ret == DB_NOTFOUND)
            return op->force ? CYRUSDB_OK : CYRUSDB_NOTFOUND;
        return db3_map(h, h->fname, ret, "delete");
    }
    return CYRUSDB_INTERNAL;
}

/* Run a key operation in the transaction tid asks for; a transaction of
 * its own is retried when it was chosen as a deadlock victim. */
static int db3_op(struct db3_db *h, struct cyrusdb_txn **tid,
                  const struct db3_op *op)
{
    int write = op->kind != DB3_FETCH;
    enum db3_txn_kind kind;
    DB_TXN *txn;
    int attempt, r;

    if (op->data_r)
        *op->data_r = NULL;
    if (op->datalen_r)
        *op->datalen_r = 0;
    for (attempt = 0;; attempt++) {
        r = db3_txn_enter(h, tid, write, &txn, &kind);
        if (r != CYRUSDB_OK)
            return r;
        r = db3_op_run(h, txn, op);
        r = db3_txn_leave(h, tid, txn, kind, r);
        if (r == CYRUSDB_AGAIN && h->deadlock && attempt < DB3_RETRIES &&
            (kind == DB3_TXN_AUTO_READ || kind == DB3_TXN_AUTO_WRITE)) {
            usleep((useconds_t)(1000 * (attempt + 1)));
            continue;
        }
        return r;
    }
}

static int db3_fetch(struct cyrusdb *db, const char *key, size_t keylen,
                     const char **data_r, size_t *datalen_r,
                     struct cyrusdb_txn **tid)
{
    struct db3_op op = { .kind = DB3_FETCH, .key = key, .keylen = keylen,
                         .data_r = data_r, .datalen_r = datalen_r };

    return db3_op((struct db3_db *)db, tid, &op);
}

static int db3_fetchlock(struct cyrusdb *db, const char *key, size_t keylen,
                         const char **data_r, size_t *datalen_r,
                         struct cyrusdb_txn **tid)
{
    struct db3_op op = { .kind = DB3_FETCHLOCK, .key = key, .keylen = keylen,
                         .data_r = data_r, .datalen_r = datalen_r };

    return db3_op((struct db3_db *)db, tid, &op);
}

static int db3_create(struct cyrusdb *db, const char *key, size_t keylen,
                      const char *data, size_t datalen, struct cyrusdb_txn **tid)
{
    struct db3_op op = { .kind = DB3_CREATE, .key = key, .keylen = keylen,
                         .data = data, .datalen = datalen };

    return db3_op((struct db3_db *)db, tid, &op);
}

static int db3_store(struct cyrusdb *db, const char *key, size_t keylen,
                     const char *data, size_t datalen, struct cyrusdb_txn **tid)
{
    struct db3_op op = { .kind = DB3_STORE, .key = key, .keylen = keylen,
                         .data = data, .datalen = datalen };

    return db3_op((struct db3_db *)db, tid, &op);
}

static int db3_delete(struct cyrusdb *db, const char *key, size_t keylen,
                      struct cyrusdb_txn **tid, int force)
{
    struct db3_op op = { .kind = DB3_DELETE, .key = key, .keylen = keylen,
                         .force = force };

    return db3_op((struct db3_db *)db, tid, &op);
}

/* The first record after `last` (or at/after the prefix when first), in a
 * fresh cursor closed again before returning: the callback may then change
 * the database freely.  The record is copied into the handle's buffers. */
static int db3_foreach_step(struct db3_db *h, DB_TXN *txn, int first,
                            const char *prefix, size_t prefixlen,
                            const struct buf *last)
{
    DBC *cursor = NULL;
    DBT k, v;
    int ret, ret2;

    ret = h->db->cursor(h->db, txn, &cursor, 0);
    if (ret != 0)
        return db3_map(h, h->fname, ret, "cursor");
    memset(&v, 0, sizeof(v));
    if (first && prefixlen == 0) {
        memset(&k, 0, sizeof(k));
        ret = cursor->get(cursor, &k, &v, DB_FIRST);
    } else {
        if (first)
            db3_dbt(&k, prefix, prefixlen);
        else
            db3_dbt(&k, last->s, last->len);
        ret = cursor->get(cursor, &k, &v, DB_SET_RANGE);
        if (ret == 0 && !first && k.size == last->len &&
            !memcmp(k.data, last->s, last->len))
            ret = cursor->get(cursor, &k, &v, DB_NEXT);
    }
    if (ret == 0) {
        if (buf_setmap(&h->eachkey, k.data, k.size) < 0 ||
            buf_setmap(&h->eachval, v.data, v.size) < 0)
            ret = ENOMEM;
    }
    ret2 = cursor->c_close(cursor);
    if (ret == 0)
        ret = ret2;
    if (ret == DB_NOTFOUND)
        return CYRUSDB_DONE;
    return db3_map(h, h->fname, ret, "foreach");
}

static int db3_foreach(struct cyrusdb *db, const char *prefix, size_t prefixlen,
                       cyrusdb_filter_fn *filter, cyrusdb_cb_fn *cb, void *rock,
                       struct cyrusdb_txn **tid)
{
    struct db3_db *h = (struct db3_db *)db;
    struct buf last = BUF_INITIALIZER;
    enum db3_txn_kind kind;
    DB_TXN *txn;
    int first = 1;
    int r;

    r = db3_txn_enter(h, tid, 0, &txn, &kind);
    if (r != CYRUSDB_OK)
        return r;
    for (;;) {
        const char *key, *val;
        size_t keylen, vallen;

        r = db3_foreach_step(h, txn, first, prefix, prefixlen, &last);
        if (r == CYRUSDB_DONE) {
            r = CYRUSDB_OK;
            break;
        }
        if (r != CYRUSDB_OK)
            break;
        first = 0;
        key = buf_cstring(&h->eachkey);
        keylen = h->eachkey.len;
        val = buf_cstring(&h->eachval);
        vallen = h->eachval.len;
        if (!cyrusdb_has_prefix(key, keylen, prefix, prefixlen))
            break;
        if (buf_setmap(&last, key, keylen) < 0) {
            r = CYRUSDB_INTERNAL;
            break;
        }
        if (filter && !filter(rock, key, keylen, val, vallen))
            continue;
        r = cb(rock, key, keylen, val, vallen);
        if (r != 0)
            break;
    }
    buf_free(&last);
    return db3_txn_leave(h, tid, txn, kind, r);
}

/* ---- open / close ---------------------------------------------------- */

static int db3_open_db(struct db3_db *h, const char *base, int flags,
                       const char **error_r)
{
    u_int32_t oflags = DB_AUTO_COMMIT | DB_MULTIVERSION;
    int attempt, ret = 0;

    if (flags & CYRUSDB_RDONLY)
        oflags |= DB_RDONLY;
    else if (flags & CYRUSDB_CREATE)
        oflags |= DB_CREATE;
    for (attempt = 0; attempt <= DB3_RETRIES; attempt++) {
        DB *db = NULL;

        if ((ret = db_create(&db, h->env->env, 0)) != 0)
            break;
        if ((ret = db->set_flags(db, DB_CHKSUM)) != 0 ||
            ((flags & CYRUSDB_MBOXSORT) &&
             (ret = db->set_bt_compare(db, db3_mbox_compare)) != 0)) {
            db->close(db, 0);
            break;
        }
        ret = db->open(db, NULL, base, NULL, DB_BTREE, oflags, DB3_FILE_MODE);
        if (ret == 0) {
            h->db = db;
            return CYRUSDB_OK;
        }
        db->close(db, 0);
        if (ret != DB_LOCK_DEADLOCK)
            break;
        usleep((useconds_t)(1000 * (attempt + 1)));
    }
    switch (ret) {
    case ENOENT:
        *error_r = "no such database file";
        return CYRUSDB_NOTFOUND;
    case EINVAL:
        *error_r = "not a Berkeley DB btree file";
        log_error("db3: open failed file=<%s> error=<%s>", h->fname,
                  db_strerror(ret));
        return CYRUSDB_BADFORMAT;
    default:
        *error_r = "cannot open the Berkeley DB file";
        return db3_map(h, h->fname, ret, "open");
    }
}

static void db3_free(struct db3_db *h)
{
    if (h->fetchval.data)
        free(h->fetchval.data);
    buf_free(&h->eachkey);
    buf_free(&h->eachval);
    free(h->fname);
    free(h);
}

static int db3_open(const char *fname, int flags, int variant,
                    struct cyrusdb **db_r, const char **error_r)
{
    struct db3_db *h = NULL;
    const char *slash, *base;
    char *dir = NULL, *home = NULL;
    struct stat st;
    int r, ret;

    *db_r = NULL;
    *error_r = NULL;
    slash = strrchr(fname, '/');
    base = slash ? slash + 1 : fname;
    if (!*base) {
        *error_r = "no file name";
        return CYRUSDB_INTERNAL;
    }
    if ((flags & CYRUSDB_CREATE) && !(flags & CYRUSDB_RDONLY) &&
        fs_mkdir_parent(fname, DB3_DIR_MODE) < 0) {
        log_error("db3: cannot create directory file=<%s> error=<%s>",
                  fname, strerror(errno));
        *error_r = "cannot create the database directory";
        return errno == ENOSPC ? CYRUSDB_FULL : CYRUSDB_IOERROR;
    }
    if (stat(fname, &st) < 0) {
        if (errno != ENOENT) {
            *error_r = "cannot stat the database file";
            return CYRUSDB_IOERROR;
        }
        if (!(flags & CYRUSDB_CREATE) || (flags & CYRUSDB_RDONLY)) {
            *error_r = "no such database file";
            return CYRUSDB_NOTFOUND;
        }
    } else if (!S_ISREG(st.st_mode)) {
        *error_r = "not a regular file";
        return CYRUSDB_BADFORMAT;
    } else if (st.st_size == 0) {
        /* A Berkeley DB file is never empty once created: an empty file is
         * taken as a new database only when the caller asks to create one;
         * otherwise it is a file cut to nothing, and opening it as an empty
         * database would lose every record silently. */
        if (!(flags & CYRUSDB_CREATE) || (flags & CYRUSDB_RDONLY)) {
            *error_r = "empty file: not a Berkeley DB database (truncated?)";
            return CYRUSDB_IOERROR;
        }
        if (unlink(fname) < 0 && errno != ENOENT) {
            *error_r = "cannot replace the empty file";
            return CYRUSDB_IOERROR;
        }
        flags |= CYRUSDB_CREATE;
    }

    if (slash == fname)
        dir = strdup("/");
    else if (slash)
        dir = strndup(fname, (size_t)(slash - fname));
    else
        dir = strdup(".");
    h = calloc(1, sizeof(*h));
    if (!dir || !h || !(h->fname = strdup(fname))) {
        free(dir);
        free(h);
        *error_r = "out of memory";
        return CYRUSDB_INTERNAL;
    }
    h->flags = flags;
    h->variant = variant;
    h->pid = getpid();
    home = db3_env_home(dir);
    free(dir);
    if (!home) {
        *error_r = "cannot resolve the database directory";
        db3_free(h);
        return CYRUSDB_IOERROR;
    }
    r = db3_env_get(home, &h->env, error_r);
    free(home);
    if (r != CYRUSDB_OK) {
        db3_free(h);
        return r;
    }
    /* Free what processes that died inside a transaction still hold
     * (locks, transactions): a process blocked on such a lock wakes up. */
    ret = h->env->env->failchk(h->env->env, 0);
    if (ret != 0) {
        *error_r = "database environment needs recovery (run ctl_cyrusdb -r)";
        r = db3_map(h, h->fname, ret, "failchk");
        db3_env_put(h->env);
        db3_free(h);
        return r;
    }
    r = db3_open_db(h, base, flags, error_r);
    if (r != CYRUSDB_OK) {
        db3_env_put(h->env);
        db3_free(h);
        return r;
    }
    *db_r = &h->hdr;
    return CYRUSDB_OK;
}

static int db3_close(struct cyrusdb *db)
{
    struct db3_db *h = (struct db3_db *)db;
    int r = CYRUSDB_OK, r2, ret;

    if (h->pid != getpid()) {
        /* inherited across fork(): the parent's; touch nothing shared */
        db3_free(h);
        return CYRUSDB_OK;
    }
    if (h->txn.txn)
        r = db3_abort(db, (struct cyrusdb_txn *)&h->txn);
    if (!(h->flags & (CYRUSDB_RDONLY | CYRUSDB_NOCOMPACT)) && !h->env->dead) {
        r2 = db3_env_checkpoint(h->env->env, DB3_AUTO_CHECKPOINT_KB,
                                h->fname, h);
        if (r == CYRUSDB_OK)
            r = r2;
    }
    ret = h->db->close(h->db, 0);
    if (ret != 0 && !h->env->dead) {
        r2 = db3_map(h, h->fname, ret, "close");
        if (r == CYRUSDB_OK)
            r = r2;
    }
    db3_env_put(h->env);
    db3_free(h);
    return r;
}

/* ---- whole-file calls ------------------------------------------------ */

/* Print bytes, escaping what is not plain printable ASCII. */
static void db3_dump_bytes(FILE *out, const unsigned char *p, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        if (p[i] < 0x20 || p[i] >= 0x7f || p[i] == '\\')
            fprintf(out, "\\x%02x", p[i]);
        else
            fputc(p[i], out);
    }
}

/* Walk every record in a snapshot: dump them or check their order. */
static int db3_walk(struct db3_db *h, FILE *out, unsigned long *count_r)
{
    DB_TXN *txn = NULL;
    DBC *cursor = NULL;
    struct buf prev = BUF_INITIALIZER;
    unsigned long count = 0;
    DBT k, v;
    int ret, r;

    if ((r = db3_check_pid(h)) != CYRUSDB_OK)
        return r;
    if ((r = db3_txn_begin(h, 1, &txn)) != CYRUSDB_OK)
        return r;
    ret = h->db->cursor(h->db, txn, &cursor, 0);
    if (ret != 0) {
        txn->abort(txn);
        return db3_map(h, h->fname, ret, "cursor");
    }
    r = CYRUSDB_OK;
    for (;;) {
        memset(&k, 0, sizeof(k));
        memset(&v, 0, sizeof(v));
        ret = cursor->get(cursor, &k, &v, DB_NEXT);
        if (ret == DB_NOTFOUND) {
            ret = 0;
            break;
        }
        if (ret != 0)
            break;
        count++;
        if (out) {
            db3_dump_bytes(out, k.data, k.size);
            fputc('\t', out);
            db3_dump_bytes(out, v.data, v.size);
            fputc('\n', out);
            continue;
        }
        if (k.size == 0) {
            log_error("db3: inconsistent file=<%s> error=<empty key> "
                      "record=<%lu>", h->fname, count);
            r = CYRUSDB_IOERROR;
            break;
        }
        if (count > 1 &&
            cyrusdb_compare(h->flags, prev.s, prev.len, k.data, k.size) >= 0) {
            log_error("db3: inconsistent file=<%s> error=<keys out of order "
                      "(file written with another key order?)> record=<%lu>",
                      h->fname, count);
            r = CYRUSDB_IOERROR;
            break;
        }
        if (buf_setmap(&prev, k.data, k.size) < 0) {
            r = CYRUSDB_INTERNAL;
            break;
        }
    }
    buf_free(&prev);
    if (ret != 0)
        r = db3_map(h, h->fname, ret, out ? "dump" : "consistent");
    ret = cursor->c_close(cursor);
    if (ret != 0 && r == CYRUSDB_OK)
        r = db3_map(h, h->fname, ret, "cursor close");
    ret = txn->commit(txn, 0);
    if (ret != 0 && r == CYRUSDB_OK)
        r = db3_map(h, h->fname, ret, "commit");
    if (count_r)
        *count_r = count;
    return r;
}

/* The btree's own statistics (a full traversal of its pages). */
static int db3_stat(struct db3_db *h, DB_BTREE_STAT **stat_r)
{
    DB_TXN *txn = NULL;
    int ret, r;

    *stat_r = NULL;
    if ((r = db3_txn_begin(h, 1, &txn)) != CYRUSDB_OK)
        return r;
    ret = h->db->stat(h->db, txn, stat_r, 0);
    if (ret == 0) {
        ret = txn->commit(txn, 0);
    } else {
        txn->abort(txn);
    }
    if (ret != 0) {
        free(*stat_r);
        *stat_r = NULL;
    }
    return db3_map(h, h->fname, ret, "stat");
}

static int db3_dump(struct cyrusdb *db, FILE *out, int detail)
{
    struct db3_db *h = (struct db3_db *)db;
    DB_BTREE_STAT *st = NULL;
    int r;

    if ((r = db3_check_pid(h)) != CYRUSDB_OK)
        return r;
    if (detail) {
        if ((r = db3_stat(h, &st)) != CYRUSDB_OK)
            return r;
        fprintf(out, "# db3 btree file=%s records=%lu pagesize=%lu "
                "levels=%lu internal_pages=%lu leaf_pages=%lu "
                "overflow_pages=%lu free_pages=%lu order=%s\n",
                h->fname, (unsigned long)st->bt_ndata,
                (unsigned long)st->bt_pagesize, (unsigned long)st->bt_levels,
                (unsigned long)st->bt_int_pg, (unsigned long)st->bt_leaf_pg,
                (unsigned long)st->bt_over_pg, (unsigned long)st->bt_free,
                (h->flags & CYRUSDB_MBOXSORT) ? "mailbox" : "bytes");
        free(st);
    }
    r = db3_walk(h, out, NULL);
    if (r == CYRUSDB_OK && fflush(out) == EOF)
        r = CYRUSDB_IOERROR;
    return r;
}

/* Berkeley DB's own verifier over the file on disk, read through a
 * private cache: page checksums, page structure, key order.  The shared
 * cache is written to the file first (a checkpoint); a writer in another
 * process may still change pages while the verifier reads them, so a
 * failure is confirmed by a second pass before it is reported. */
static int db3_verify_file(struct db3_db *h)
{
    int attempt, ret = 0;

    for (attempt = 0; attempt < 2; attempt++) {
        DB *vdb = NULL;

        ret = h->env->env->txn_checkpoint(h->env->env, 0, 0, 0);
        if (ret != 0)
            return db3_map(h, h->fname, ret, "checkpoint");
        if ((ret = db_create(&vdb, NULL, 0)) != 0)
            return db3_map(h, h->fname, ret, "verify");
        vdb->set_errcall(vdb, db3_errcall);
        vdb->set_errpfx(vdb, h->fname);
        if ((h->flags & CYRUSDB_MBOXSORT) &&
            (ret = vdb->set_bt_compare(vdb, db3_mbox_compare)) != 0) {
            vdb->close(vdb, 0);
            return db3_map(h, h->fname, ret, "verify");
        }
        /* verify() destroys the handle whatever it returns */
        ret = vdb->verify(vdb, h->fname, NULL, NULL, 0);
        if (ret == 0)
            return CYRUSDB_OK;
    }
    log_error("db3: inconsistent file=<%s> error=<verify: %s>", h->fname,
              db_strerror(ret));
    return CYRUSDB_IOERROR;
}

/* Walk every record through the shared cache, checking that keys are
 * non-empty and strictly in this handle's order (a file opened with the
 * other key order fails); compare the count of records seen with the
 * btree's own count from a full page traversal; then verify the file on
 * disk (db3_verify_file). */
static int db3_consistent(struct cyrusdb *db)
{
    struct db3_db *h = (struct db3_db *)db;
    DB_BTREE_STAT *st = NULL;
    unsigned long count = 0;
    int r;

    if ((r = db3_walk(h, NULL, &count)) != CYRUSDB_OK)
        return r;
    if ((r = db3_stat(h, &st)) != CYRUSDB_OK)
        return r;
    if ((unsigned long)st->bt_ndata != count) {
        log_error("db3: inconsistent file=<%s> error=<record count %lu, "
                  "btree says %lu>", h->fname, count,
                  (unsigned long)st->bt_ndata);
        r = CYRUSDB_IOERROR;
    }
    free(st);
    if (r == CYRUSDB_OK)
        r = db3_verify_file(h);
    return r;
}

static int db3_checkpoint(struct cyrusdb *db)
{
    struct db3_db *h = (struct db3_db *)db;
    int r;

    if ((r = db3_check_pid(h)) != CYRUSDB_OK)
        return r;
    return db3_env_checkpoint(h->env->env, 0, h->fname, h);
}

const struct cyrusdb_backend cyrusdb_db3 = {
    .name = "db3",
    .recover = db3_recover,
    .checkpoint_dir = db3_checkpoint_dir,
    .detect = db3_detect,
    .open = db3_open,
    .close = db3_close,
    .fetch = db3_fetch,
    .fetchlock = db3_fetchlock,
    .foreach = db3_foreach,
    .create = db3_create,
    .store = db3_store,
    .delete = db3_delete,
    .commit = db3_commit,
    .abort = db3_abort,
    .dump = db3_dump,
    .consistent = db3_consistent,
    .checkpoint = db3_checkpoint,
};
