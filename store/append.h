/*
 * append.h - putting one message into one or more mailboxes, durably.
 *
 * The single path every delivery and IMAP APPEND takes:
 *
 *   append_stage_open()      staging file PARTITION/stage./NN/PID-SEQ-TIME
 *                            (NN = pid mod stage_dirs in lower-case hex,
 *                            at least two digits, so concurrent workers
 *                            write into different directories; created on
 *                            demand, mode 0750; files O_EXCL, mode 0600)
 *   append_stage_write() ... the message, streamed; size, header size and
 *                            SHA-1 digest computed on the way
 *   append_stage_close()     end of data
 *   append_begin()
 *   append_add()  per mailbox: quota check, then mailbox_append_reserve():
 *                            uid allocated, hard link, PENDING record
 *   append_commit()          ONE sync round for everything above (commit.h),
 *                            then mailbox_append_finish_many() for all the
 *                            reservations: the records become visible, and
 *                            quota learns of all of them in ONE transaction
 *   append_free(), append_stage_free()   the staging file is unlinked
 *
 * When append_commit() returns STORE_OK every message it covered is
 * durable and visible: that is when a front end may answer 250 / OK.
 * On any error before that, append_abort() cancels what was reserved.
 * Messages for mailboxes on another partition than the stage get their
 * own staging copy on that partition (single-instance store holds per
 * partition), made once per partition per stage.
 *
 * Lifetimes: a stage must stay alive (not append_stage_free()d) until
 * every transaction that added it has been committed, aborted or freed:
 * the transaction's sync round uses the stage's descriptors.  Likewise the
 * mailbox handles.  Stages and transactions are per process (create them
 * after fork()) and not thread-safe.
 *
 * Staging files of a process killed while delivering stay behind in
 * PARTITION/stage./NN (nothing refers to them); removing files there
 * older than a day is safe.
 */
#ifndef STORE_APPEND_H
#define STORE_APPEND_H

#include <stddef.h>
#include <stdint.h>

#include "lib/imapconf.h"
#include "store/mailbox.h"

struct append_stage;

/* Create a staging file on `partition` (NULL = defaultpartition).
 * STORE_OK, STORE_BADPARTITION, STORE_IOERROR, STORE_NOSPACE. */
int append_stage_open(const struct imapconf *conf, const char *partition,
                      struct append_stage **st_r);
/* Append message bytes (CRLF line ends expected; not checked here).
 * STORE_OK, STORE_TOOBIG (over 4 GiB - 1 or over maxmessagesize when that
 * is set; checked before anything of the call is taken), STORE_IOERROR,
 * STORE_NOSPACE.  Writes are buffered (64 KiB), so a disk error may
 * only show at a later write or at append_stage_close().  Every error is
 * sticky: later writes, close and append_add() return it again (a
 * message refused in part is never stored).  STORE_INTERNAL after
 * close. */
int append_stage_write(struct append_stage *st, const void *data, size_t len);
/* Let the stage take `extra` more bytes than maxmessagesize, for what
 * the server itself adds (lmtpd's Return-Path and Received headers), so
 * that the limit applies to the client's message alone.  Never beyond
 * 4 GiB - 1.  Call before writing. */
void append_stage_allow_extra(struct append_stage *st, size_t extra);
/* End of the message: writes what is buffered and finalizes size, header
 * size and digest (the staging file stays open, unsynced, for the commit
 * round).  The header size counts the bytes up to and including the first
 * empty line (CRLF CRLF or LF LF; a message starting with an empty line
 * has a header of that line); a message without an empty line is all
 * header.  STORE_OK, the sticky error of a write, STORE_IOERROR,
 * STORE_NOSPACE, STORE_INTERNAL when already closed. */
int append_stage_close(struct append_stage *st);
/* Size, header size and digest; meaningful after a successful
 * append_stage_close() (zeros before).  Owned by the stage. */
const struct mailbox_msginfo *append_stage_info(const struct append_stage *st);
/* The path of the staging file (owned by the stage; NULL when none), for
 * readers of the closed message (lmtpd's Sieve body test).  Read it, never
 * write it. */
const char *append_stage_path(const struct append_stage *st);
/* The whole closed message in memory when it fit in the stage's write
 * buffer (64 KiB; *len_r its size), else NULL: read append_stage_path().
 * Owned by the stage; read it, never write it. */
const void *append_stage_bytes(const struct append_stage *st, size_t *len_r);
/* A closed stage for a message already in the store (IMAP COPY): the
 * message file `msgpath` is hard-linked into the staging directory of
 * `partition` (NULL = defaultpartition) instead of being copied, and
 * `info` (the source record's size, header size and digest) is taken as
 * the stage's.  Message files are never changed after their commit, so
 * the link is the message.  STORE_OK, STORE_NOTFOUND (msgpath is gone:
 * expunged and cleaned up meanwhile), STORE_NOTIMPLEMENTED (no hard link
 * possible: another file system, EMLINK, ...; copy the bytes with
 * append_stage_open() instead), STORE_BADPARTITION, STORE_IOERROR,
 * STORE_NOSPACE, STORE_NOMEM. */
int append_stage_link(const struct imapconf *conf, const char *partition,
                      const char *msgpath, const struct mailbox_msginfo *info,
                      struct append_stage **st_r);
/* Close and unlink the staging file(s) and free; sets *stp NULL (no-op
 * when NULL).  The mailboxes' hard links keep the message. */
void append_stage_free(struct append_stage **stp);

struct append_txn;

/* A new, empty transaction.  STORE_OK or STORE_NOMEM.  The quota
 * database is opened on the transaction's first quota check and closed by
 * append_free(). */
int append_begin(const struct imapconf *conf, struct append_txn **t_r);

#define APPEND_IGNORE_QUOTA 1
/* append_add_keywords(): a keyword that cannot be defined (beyond the
 * mailbox's 128, or not an atom) fails the call (STORE_OVERQUOTA,
 * STORE_BADNAME) instead of being left out */
#define APPEND_KEYWORDS_STRICT 2

/* Reserve the message in mailbox mb (an open, unlocked handle the caller
 * keeps open until append_free()).  internaldate 0 = now.  sysflags: IMAP
 * system flags to set (bits outside MAILBOX_SYSTEM_FLAGS: STORE_INTERNAL).
 * Checks quota first unless APPEND_IGNORE_QUOTA: the root covering mb
 * must take the message's size and one more message (STORE_OVERQUOTA); a
 * mailbox no root covers passes.  The check is advisory as in Cyrus:
 * reservations not yet committed (of this or other processes) are not
 * counted, so concurrent deliveries may pass a limit by a little.  The
 * stage must be closed (else STORE_INTERNAL, or its sticky error).  A
 * mailbox on another partition than the stage gets the stage's copy on
 * that partition (made now if needed: STORE_BADPARTITION, STORE_IOERROR,
 * STORE_NOSPACE).  The same mailbox may be added several times (one uid
 * each).  STORE_OK and *uid_r (may be NULL), or an error and *uid_r = 0
 * (the txn stays usable for other mailboxes; nothing was reserved in mb):
 * also mailbox_append_reserve()'s errors, STORE_NOMEM. */
int append_add(struct append_txn *t, struct mailbox *mb,
               struct append_stage *st, int64_t internaldate,
               uint32_t sysflags, int flags, uint32_t *uid_r);

/* append_add() with keywords (IMAP APPEND and COPY): defined in mb as
 * needed and set on the reserved record, so that append_commit() makes
 * the message visible with them, never without (see
 * mailbox_append_reserve_keywords()). */
int append_add_keywords(struct append_txn *t, struct mailbox *mb,
                        struct append_stage *st, int64_t internaldate,
                        uint32_t sysflags, const char *const *keywords,
                        size_t nkeywords, int flags, uint32_t *uid_r);

/* The quota check of append_add() for several messages at once (IMAP
 * MULTIAPPEND): the root covering mb must take `bytes` and `messages`
 * more.  STORE_OK (also when no root covers mb), STORE_OVERQUOTA, or the
 * quota database's error (logged).  The caller then adds the messages
 * with APPEND_IGNORE_QUOTA.  Advisory as append_add()'s check. */
int append_check_quota(struct append_txn *t, struct mailbox *mb,
                       uint64_t bytes, uint64_t messages);

/* One sync round, then every reserved record made visible.  STORE_OK, or
 * the sync's error, after which every reservation has been cancelled (the
 * caller answers 4xx).  Nothing reserved: STORE_OK without a round.  If
 * making one record visible fails (mailbox_append_finish_many(): an I/O
 * error on that index), that reservation is cancelled, the others still become
 * visible, and the first such error is returned: the caller answers 4xx
 * for all and a retry may store a second copy in the other mailboxes,
 * never lose one.  Afterwards the txn is empty and can take new
 * append_add() calls. */
int append_commit(struct append_txn *t);

/* Cancel every reservation not yet committed (the uids are not reused);
 * the txn is empty afterwards and can be used again. */
void append_abort(struct append_txn *t);

/* Free (aborting first if needed); sets *tp NULL. */
void append_free(struct append_txn **tp);

/* Remove the staging files a killed writer left on `partition` (NULL =
 * defaultpartition): those whose writer process no longer exists, and any
 * older than max_age seconds.  A staging file is never needed after its
 * writer is gone (the mailboxes hold their own hard links), so removing it
 * only frees space.  Files not named PID-SEQ-TIME are left alone.
 * *removed_r (may be NULL) gets the count.  STORE_OK, STORE_BADPARTITION,
 * STORE_IOERROR. */
int append_stage_cleanup(const struct imapconf *conf, const char *partition,
                         long max_age, unsigned long *removed_r);

#endif
