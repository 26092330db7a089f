/*
 * lmtp_sieve.h - running each recipient's active Sieve script at
 * delivery (Sieve decides, the store acts).
 *
 * For a recipient whose mailbox is a user's (INBOX or a +detail folder),
 * the active script (store/sievedir.h: SIEVEDIR/.../USER/defaultbc) is
 * compiled once per process and cached by the script file's (device,
 * inode, size, mtime, ctime): up to LMTP_SIEVE_FILES files remembered
 * and LMTP_SIEVE_CACHE compiled texts held, older ones evicted by a
 * clock (second chance); files holding the same bytes share one compiled
 * script (compiled scripts are immutable, so sharing is safe).  A new
 * text is held only once used again (a probation slot of one, and the
 * hashes of the last texts made: see "Admission" in lmtp_sieve.c).  A
 * delivery to a user whose script is cached and unchanged costs one
 * stat() of the link, no open and no read.  The script runs
 * against the staged message with that recipient's envelope.  The
 * result is turned into:
 *   - local targets (keep, fileinto: mailbox, system flags, keywords)
 *     that the caller adds to the ONE deliver_message() call of the
 *     message (one append transaction, one durable commit for every
 *     recipient and folder: Sieve adds no syncs);
 *   - outgoing messages (redirect, vacation), handed to the `sendmail`
 *     program here, before the local commit; a failure makes the whole
 *     recipient a temporary failure (nothing of it is stored, the MTA
 *     retries; a redirect or vacation already sent is remembered in
 *     deliver.db and not sent twice);
 *   - a refusal text for reject and ereject (answered 550 5.7.1 at the
 *     end of DATA: LMTP has per-recipient replies, RFC 5429 2.1);
 *   - duplicate marks (RFC 7352), written after a successful commit with
 *     lmtp_sieve_commit().
 * include (RFC 6609) reads NAME.script of the user's directory or of the
 * global one (sieve_globaldir, default SIEVEDIR/global) through the same
 * cache; a changed included script is compiled again at the next
 * delivery.  editheader (RFC 5293): a target stored after header edits
 * carries a stage of its own (the edited copy, owned by the result), to
 * be stored by the same deliver_message() call, so other recipients keep
 * sharing the original file.  special-use (RFC 8579): fileinto
 * :specialuse goes to the user's mailbox with that use first.
 * A compile or runtime error of the script is an implicit keep and a log
 * line.  One log line per recipient names the script and its actions.
 */
#ifndef LMTPD_LMTP_SIEVE_H
#define LMTPD_LMTP_SIEVE_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/strarray.h"
#include "store/append.h"
#include "store/deliver.h"

#define LMTP_SIEVE_CACHE 256     /* compiled texts held per process */
#define LMTP_SIEVE_FILES 8192     /* script files remembered per process */

struct lmtp_sieve;

/* Per process.  conf must outlive it; dctx gives the mailbox list and
 * deliver.db handles (it must outlive it too).  0, or -1 (no memory). */
int lmtp_sieve_new(const struct imapconf *conf, struct deliver_ctx *dctx,
                   struct lmtp_sieve **ls_r);
void lmtp_sieve_free(struct lmtp_sieve **lsp);

/* One message, for every recipient. */
struct lmtp_sieve_msg {
    const char *sender;        /* reverse path without <>, "" null */
    struct append_stage *st;   /* closed stage */
    const char *msgid;         /* Message-ID or NULL */
    const char *servername;
    /* private: the message (the stage's buffer, or the staging file
     * mapped when mapped is set) */
    const void *map;
    size_t maplen;
    int mapped;
};

struct lmtp_sieve_target {
    char *mailbox;
    uint32_t sysflags;
    struct strarray keywords;
    struct append_stage *stage;   /* the message as this recipient's
                                     script edited it (editheader), owned
                                     by the result; NULL: the original */
};

enum lmtp_sieve_outcome {
    LMTP_SIEVE_NONE = 0,   /* no active script: deliver as usual */
    LMTP_SIEVE_DONE,       /* targets (maybe none) hold what to store */
    LMTP_SIEVE_REJECT,     /* answer 550 5.7.1 with `reason` */
    LMTP_SIEVE_TEMPFAIL    /* answer 451 4.x (sendmail failed, database) */
};

struct lmtp_sieve_result {
    enum lmtp_sieve_outcome outcome;
    struct lmtp_sieve_target *targets;
    size_t ntargets;
    char *reason;               /* REJECT: one line, printable */
    char *userid;
    struct strarray dupmarks;   /* "id" of duplicate actions ... */
    unsigned long *dupsecs;     /* ... and their seconds */
    struct append_stage **stages; /* edited copies of the message (closed
                                     stages), freed by
                                     lmtp_sieve_result_fini() */
    size_t nstages;
};

/* Run the recipient's script.  rcpt: the envelope recipient as written
 * (user+detail@domain); mailbox: where the message goes without a script
 * (the resolved INBOX or +detail folder; the keep target).  Fills *res
 * (which the caller releases with lmtp_sieve_result_fini()).  Logs one
 * line when a script ran. */
void lmtp_sieve_run(struct lmtp_sieve *ls, struct lmtp_sieve_msg *m,
                    const char *rcpt, const char *mailbox,
                    struct lmtp_sieve_result *res);

/* After the recipient's targets were committed: write its duplicate
 * marks. */
void lmtp_sieve_commit(struct lmtp_sieve *ls,
                       const struct lmtp_sieve_result *res);

void lmtp_sieve_result_fini(struct lmtp_sieve_result *res);
/* Unmap what lmtp_sieve_run() mapped of the message. */
void lmtp_sieve_msg_fini(struct lmtp_sieve_msg *m);

/* Scripts compiled by this process (for tests through the log). */
unsigned long lmtp_sieve_compiles(const struct lmtp_sieve *ls);

/* Compiled forms (NAME.bc) loaded instead of compiling. */
unsigned long lmtp_sieve_bcloads(const struct lmtp_sieve *ls);

#endif
