/*
 * append.h - putting one message into one or more mailboxes, durably.
 *
 * The single path every delivery and IMAP APPEND takes:
 *
 *   append_stage_open()      staging file PARTITION/stage./NN/PID-SEQ
 *                            (NN = pid mod stage_dirs, so concurrent
 *                            workers write into different directories)
 *   append_stage_write() ... the message, streamed; size, header size and
 *                            SHA-1 digest computed on the way
 *   append_stage_close()     end of data
 *   append_begin()
 *   append_add()  per mailbox: quota check, then mailbox_append_reserve():
 *                            uid allocated, hard link, PENDING record
 *   append_commit()          ONE sync round for everything above (commit.h),
 *                            then mailbox_append_finish() per mailbox: the
 *                            records become visible
 *   append_free(), append_stage_free()   the staging file is unlinked
 *
 * When append_commit() returns STORE_OK every message it covered is
 * durable and visible: that is when a front end may answer 250 / OK.
 * On any error before that, append_abort() cancels what was reserved.
 * Messages for mailboxes on another partition than the stage get their
 * own staging copy on that partition (single-instance store holds per
 * partition).
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
 * is set), STORE_IOERROR, STORE_NOSPACE. */
int append_stage_write(struct append_stage *st, const void *data, size_t len);
/* End of the message: finalizes size, header size and digest. */
int append_stage_close(struct append_stage *st);
const struct mailbox_msginfo *append_stage_info(const struct append_stage *st);
/* Unlink the staging file(s) and free; sets *stp NULL. */
void append_stage_free(struct append_stage **stp);

struct append_txn;

int append_begin(const struct imapconf *conf, struct append_txn **t_r);

#define APPEND_IGNORE_QUOTA 1

/* Reserve the message in mailbox mb (an open, unlocked handle the caller
 * keeps open until append_free()).  internaldate 0 = now.  sysflags: IMAP
 * system flags to set.  Checks quota first unless APPEND_IGNORE_QUOTA
 * (STORE_OVERQUOTA).  STORE_OK and *uid_r (may be NULL), or an error (the
 * txn stays usable for other mailboxes; nothing was reserved in mb). */
int append_add(struct append_txn *t, struct mailbox *mb,
               struct append_stage *st, int64_t internaldate,
               uint32_t sysflags, int flags, uint32_t *uid_r);

/* One sync round, then every reserved record made visible.  STORE_OK, or
 * the sync's error, after which every reservation has been cancelled (the
 * caller answers 4xx). */
int append_commit(struct append_txn *t);

/* Cancel every reservation not yet committed. */
void append_abort(struct append_txn *t);

/* Free (aborting first if needed); sets *tp NULL. */
void append_free(struct append_txn **tp);

#endif
