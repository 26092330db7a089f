/*
 * qresync.h - the expunged-UID side of QRESYNC (RFC 7162 section 3.2):
 * which UIDs of a mailbox vanished since a client's mod-sequence, as the
 * uid-set text of a "* VANISHED (EARLIER)" response.
 *
 * What the index can tell.  An expunge keeps the message's record, flagged
 * MAILBOX_FLAG_EXPUNGED, with modseq = the expunge's modseq, until
 * cleanup (cyr_expire, mbtool cleanup) compacts it away; the index header
 * keeps deletedmodseq, the highest modseq of a record compacted away
 * (store/mailbox.h).  So for a client's modseq m:
 *   m >= deletedmodseq: every expunge after m is still a record: the
 *     answer is exactly the expunged records with modseq > m;
 *   m <  deletedmodseq: some expunges after m are forgotten: the answer is
 *     every UID below UIDNEXT that has no live message, which RFC 7162
 *     3.2.5.2 allows (a client ignores UIDs it never knew).
 * Both are limited to the client's known UIDs (SELECT's known-uids, UID
 * FETCH's set) when given.
 */
#ifndef IMAPD_QRESYNC_H
#define IMAPD_QRESYNC_H

#include <stdint.h>

#include "imapd/imapparse.h"
#include "lib/buf.h"
#include "store/mailbox.h"

/* Under a lock (shared or exclusive) of mb: put into out (reset first)
 * the uid-set ("3,5:9") of the UIDs vanished since modseq, limited to
 * `only` when not NULL ("*" in it is uidnext - 1; "$" sets must have been
 * substituted); empty when none.  *fallback_r (may be NULL) gets 1 when
 * the answer is the full one (modseq older than deletedmodseq).
 * STORE_OK, STORE_NOMEM, or the error of reading a record. */
int qresync_vanished(struct mailbox *mb, uint64_t modseq,
                     const struct imapparse_seqset *only, struct buf *out,
                     int *fallback_r);

/* Append to out the uid-set of n ascending UIDs ("1:3,7"), no separator
 * before it. */
void qresync_uidset(struct buf *out, const uint32_t *uids, size_t n);

#endif
