/*
 * deliver.h - one message to a list of mailboxes: the work a delivery
 * agent (lmtpd, mbtool deliver, the append benchmark) does per message.
 *
 * For each recipient mailbox: look it up in the mailbox list, skip it
 * when duplicate suppression finds (Message-ID, mailbox) delivered before,
 * write the duplicate records, each naming the copy about to be stored
 * (lowest uid, uidvalidity, SHA-1), check quota and reserve the message
 * (append_add), then one durable commit for all of them (append_commit).  A record is
 * believed only when the copy it names is found committed in its mailbox
 * (or was expunged since), so a record of mail that was never stored
 * suppresses nothing, and mail stored by a process killed before its 250
 * is not stored twice.  Each recipient gets its own result.  Just before the
 * commit, a recipient whose user is marked moving or moved
 * (store/userstate.h: a move began after its RCPT) cancels the whole
 * transaction: every reserved recipient gets STORE_BUSY.
 *
 * A context keeps the per-process handles (mailbox list, duplicate
 * database, open mailboxes) between messages; create it after fork().
 */
#ifndef STORE_DELIVER_H
#define STORE_DELIVER_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "store/append.h"

struct deliver_ctx;

/* STORE_OK, STORE_IOERROR (a database did not open), STORE_NOMEM. */
int deliver_ctx_new(const struct imapconf *conf, struct deliver_ctx **ctx_r);
void deliver_ctx_free(struct deliver_ctx **ctxp);

struct deliver_rcpt {
    const char *mailbox;   /* in: internal mailbox name */
    int result;            /* out: STORE_OK, or the error for this one */
    int duplicate;         /* out: 1 when suppressed as a duplicate
                              (result is STORE_OK, nothing stored) */
    uint32_t uid;          /* out: the uid given, when stored */
    uint32_t sysflags;     /* in: IMAP system flags to set (0: none) */
    const char *const *keywords;  /* in: keywords to set, or NULL */
    size_t nkeywords;
    struct append_stage *stage;   /* in: a closed stage to store for this
                                     recipient instead of the message's
                                     (lmtpd's editheader: its own copy),
                                     in the same transaction; NULL: the
                                     message's */
};

#define DELIVER_IGNORE_QUOTA 1   /* as Cyrus deliver -q */
#define DELIVER_NO_DUPCHECK  2   /* ignore duplicatesuppression */

/* The context's mailbox list handle (lmtpd's Sieve: mailboxexists,
 * fileinto :create), and its deliver.db handle, opened on first use
 * (STORE_OK with *d_r, or duplicate_open()'s error): other users of
 * deliver.db in the process share it, never open a second handle. */
struct mboxlist;
struct duplicate_db;
struct mboxlist *deliver_mboxlist(struct deliver_ctx *ctx);
int deliver_duplicate_db(struct deliver_ctx *ctx, struct duplicate_db **d_r);

/* Deliver the staged message (closed with append_stage_close()) to every
 * recipient.  msgid (may be NULL/0) is the Message-ID for duplicate
 * suppression, which applies when `duplicatesuppression` is on and
 * DELIVER_NO_DUPCHECK is not given.  A recipient listed twice is stored
 * once (the second gets the first's result and its flags are not
 * added).  sysflags and keywords (Sieve's imap4flags) are set on the
 * stored record, visible with it at the commit.  Returns STORE_OK when the
 * call itself worked (look at each rcpt's result), or an error that
 * applies to all (then every result is that error). */
int deliver_message(struct deliver_ctx *ctx, struct append_stage *st,
                    const char *msgid, size_t msgidlen,
                    struct deliver_rcpt *rcpts, size_t nrcpts, int flags);

/* ---- for tests ---- */

#define DELIVER_DIE_AFTER_MARK    1  /* records written, nothing reserved */
#define DELIVER_DIE_BEFORE_COMMIT 2  /* reserved, before the commit */
#define DELIVER_DIE_AFTER_COMMIT  3  /* committed, before returning (the
                                        250 a front end would send) */
/* point != 0: deliver_message() of this process kills the process
 * (SIGKILL) when it reaches that point, as a worker killed there; 0: off
 * (the default; nothing but tests calls this). */
void deliver_test_die_at(int point);

/* Find the Message-ID field in a message header (hdr, len: the header
 * bytes, or the whole message; the search stops at the first empty line).
 * The field name matches case-insensitively, folded continuation lines are
 * joined, surrounding white space dropped; the value is copied into id.
 * Returns 1 when found with a non-empty value, 0 otherwise. */
int deliver_find_msgid(const char *hdr, size_t len, struct buf *id);

#endif
