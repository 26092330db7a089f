/*
 * search.h - the IMAP SEARCH evaluator (RFC 3501 section 6.4.4, with the
 * MODSEQ key of CONDSTORE, RFC 7162, OLDER/YOUNGER of WITHIN, RFC 5032,
 * and "$" of SEARCHRES, RFC 5182): runs a parsed key tree
 * (imapparse.h, struct imapparse_search) over the messages of a session's
 * view of an open mailbox and returns the matching message numbers or
 * UIDs in ascending order.
 *
 * Use, with the mailbox locked (shared is enough) by the caller for the
 * whole call, so that records and message files form one snapshot:
 *
 *     struct search_params sp = { .mb = mb, .uids = view, .nmsgs = n,
 *                                 .seen = my_seen, .rock = session,
 *                                 .utf8 = cmd.utf8, .return_uids = cmd.uid };
 *     struct search_result res = { 0 };
 *     r = search_run(&sp, cmd.search, &res);
 *     ... "* SEARCH" res.n numbers from res.nums, and, when res.has_modseq,
 *         " (MODSEQ res.highest_modseq)" (RFC 7162 3.1.5) ...
 *     search_result_free(&res);
 *
 * The view.  Message number i (1-based) is uids[i-1]; the array is the
 * session's view, ascending, and may still hold messages expunged by
 * others that the session has not yet reported (RFC 3501 forbids an
 * EXPUNGE response during SEARCH).  Such a message (its record gone or
 * marked expunged) keeps its number but never matches any key.  uids NULL
 * means the view is the visible, not expunged records of the mailbox in
 * order.  '*' in a sequence set is the number of messages in the view;
 * '*' in UID sets is the UID of the last message of the view (RFC 3501
 * 6.4.8); with an empty view '*' matches nothing.
 *
 * Per-user state the index does not hold is asked through callbacks:
 *  - seen(rock, uid): 1 when the user has seen the message (the seen-state
 *    database, store/seen.h); NULL: the record's MAILBOX_FLAG_SEEN bit.
 *    search_seen_set() is a ready callback over a seen_data sequence-set
 *    text (rock = the const char * set).
 *  - recent(rock, uid): 1 when \Recent in this session; NULL: none is.
 *  - keyword(rock, name, &bit): the user-flag bit (0..127) of a keyword,
 *    returning 0, or non-zero when the mailbox knows no such keyword;
 *    NULL: the mailbox's own name table (mailbox_user_flag(), no create).
 *    A keyword that is not defined is set on no message, so KEYWORD x
 *    matches nothing and UNKEYWORD x everything.
 *
 * Semantics of the keys:
 *  - Flags: ANSWERED DELETED DRAFT FLAGGED from the record's system flags,
 *    SEEN/UNSEEN through the seen callback, KEYWORD/UNKEYWORD through the
 *    user-flag bitmap; a KEYWORD naming a system flag ("\Flagged") is that
 *    flag.  NEW = RECENT and not SEEN, OLD = not RECENT.
 *  - BEFORE/ON/SINCE compare the day of the internal date in the server's
 *    local time zone (localtime_r, so TZ applies) with the given date.
 *  - SENTBEFORE/SENTON/SENTSINCE compare the date written in the Date:
 *    header (day, month, year as given; time and zone disregarded, as RFC
 *    3501 says); a missing or unparseable Date: header matches none of
 *    them (also not under NOT: NOT SENTON d matches it).
 *  - LARGER/SMALLER: RFC822.SIZE strictly greater / smaller.
 *  - OLDER n / YOUNGER n (WITHIN, RFC 5032): the internal date is at
 *    least n seconds before params.now / less than n seconds before it.
 *  - "$" as a sequence set or after UID (SEARCHRES, RFC 5182): the
 *    message's UID is in params.saved (whether numbers or UIDs).
 *  - MODSEQ n: the record's modseq >= n (the entry name and type are
 *    accepted and ignored: per-flag modseqs are not kept).
 *  - String keys match a case-insensitive substring.  Both sides are
 *    turned into UTF-8 and case-folded first: ASCII, Latin-1 Supplement,
 *    Latin Extended-A, basic Greek and basic Cyrillic letters fold (simple
 *    Unicode case folding: "Ä" = "ä", "Straße" does NOT match "STRASSE");
 *    no Unicode normalization (a precomposed letter does not match its
 *    decomposed form).  Other code points compare as they are.  With
 *    CHARSET US-ASCII (utf8 = 0) the string is taken byte for byte, with
 *    8-bit bytes read as UTF-8 where valid.  The empty string matches
 *    every message that has the field (HEADER) or text (all others).
 *  - FROM TO CC BCC SUBJECT HEADER look in the top-level header's fields
 *    of that name (every occurrence); values are unfolded and RFC 2047
 *    encoded words (B and Q; charsets UTF-8, US-ASCII, ISO-8859-1 and
 *    its aliases) are decoded before matching, whitespace between two
 *    encoded words dropped.  An encoded word in another charset, or a
 *    malformed one, is matched as the raw text.  8-bit header bytes are
 *    taken as UTF-8.
 *  - BODY looks in the decoded text of the body: every leaf part of type "text"
 *    (a part without Content-Type counts as text/plain), with its
 *    Content-Transfer-Encoding (base64, quoted-printable) undone and its
 *    charset (UTF-8, US-ASCII, ISO-8859-1 and aliases; others and absent:
 *    bytes as they are) converted to UTF-8; the header of an attached
 *    message/rfc822 part belongs to the body text.  Non-text parts are
 *    not searched.  A match never spans two parts.  TEXT = the decoded
 *    top-level header or BODY.
 *
 * Cost: every message is first tested with the keys answered from the
 * index record and the callbacks (flags, sizes, dates, uid, numbers,
 * modseq); the message file is opened, mapped and parsed only when the
 * outcome still depends on a key that needs it, and at most once per
 * message per search (the decoded header and body are kept for the rest
 * of that message's keys).  A message file that is missing counts as an
 * empty message for those keys (logged); MIME nesting is followed to
 * depth 50 and 10,000 parts, and malformed MIME degrades to text.
 *
 * Memory: the result's array is malloc'd; free it with
 * search_result_free().  Nothing is kept between calls; one thread per
 * call.
 */
#ifndef IMAPD_SEARCH_H
#define IMAPD_SEARCH_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "lib/buf.h"

#include "imapd/imapparse.h"
#include "store/mailbox.h"

typedef int search_flag_fn(void *rock, uint32_t uid);
typedef int search_keyword_fn(void *rock, const char *name, int *bit_r);

struct search_params {
    struct mailbox *mb;         /* open and locked by the caller */
    const uint32_t *uids;       /* the view, ascending; NULL: see above */
    uint32_t nmsgs;             /* entries of uids (ignored when NULL) */
    search_flag_fn *seen;       /* NULL: the record's \Seen bit */
    search_flag_fn *recent;     /* NULL: nothing is \Recent */
    search_keyword_fn *keyword; /* NULL: the mailbox's keyword table */
    void *rock;                 /* passed to the callbacks */
    int utf8;                   /* SEARCH CHARSET UTF-8 was given */
    int return_uids;            /* UID SEARCH: nums are UIDs */
    const uint32_t *saved;      /* "$" (SEARCHRES): UIDs, ascending */
    size_t nsaved;
    time_t now;                 /* OLDER/YOUNGER's "now"; 0: time() */
};

struct search_result {
    uint32_t *nums;             /* ascending message numbers or UIDs */
    size_t n;
    int has_modseq;             /* the tree holds a MODSEQ key */
    uint64_t highest_modseq;    /* highest modseq among the matches (0
                                   when none matched) */
};

/* Run the search.  STORE_OK and *res_r filled (the caller has zeroed it
 * or freed it before); on error *res_r is empty.  Errors: STORE_NOMEM,
 * STORE_IOERROR (a record or message file could not be read: other than
 * missing), STORE_CORRUPT (a record's checksum failed), STORE_INTERNAL
 * (NULL arguments, the mailbox not locked, a key kind this evaluator does
 * not know). */
int search_run(const struct search_params *sp,
               const struct imapparse_search *key,
               struct search_result *res_r);

void search_result_free(struct search_result *res);

/* A seen callback over a sequence-set text (struct seen_data's
 * seenuids); rock is the const char * set.  Returns seen_set_contains(). */
int search_seen_set(void *rock, uint32_t uid);

/* A sequence-set text of nums appended to out: runs of consecutive
 * ascending numbers become "lo:hi", the rest is kept in the given order
 * ("1:3,7,5"); nothing for n = 0. */
void search_set_text(struct buf *out, const uint32_t *nums, size_t n);

/* An ESEARCH response line (RFC 4731 section 3.1; with CRLF) appended to
 * out: "* ESEARCH (TAG "tag") UID MIN a MAX b ALL set COUNT n MODSEQ m"
 * with what ret (IMAPPARSE_RET_*) asks for.  nums: the result, ascending
 * for SEARCH, in sort order for SORT (ESORT, RFC 5267: MIN and MAX are
 * then the first and the last in that order, ALL keeps the order).  MIN,
 * MAX, ALL and MODSEQ are left out when nothing matched (COUNT 0 stays);
 * tag NULL: no correlator; MODSEQ only with has_modseq.  PARTIAL (RFC
 * 5267 4.4, with IMAPPARSE_RET_PARTIAL): "PARTIAL (lo:hi set)" holding the
 * lo-th to the hi-th of nums (from 1, in their order), "NIL" for the set
 * when the result has fewer than lo; it is there also when nothing
 * matched. */
void search_esearch(struct buf *out, const char *tag, int uid, unsigned ret,
                    const uint32_t *nums, size_t n, int has_modseq,
                    uint64_t modseq, uint32_t partial_lo,
                    uint32_t partial_hi);

/* The slice of a result of n that PARTIAL lo:hi (1 <= lo <= hi) names:
 * *first_r its index, *count_r its length (0 when n < lo). */
void search_partial_slice(size_t n, uint32_t lo, uint32_t hi,
                          size_t *first_r, size_t *count_r);

/* Exposed for tests and for other string matching in imapd: */

/* Append the case-folded UTF-8 form of `len` bytes of UTF-8 text to out
 * (invalid bytes copied as they are).  0, or -1 when out of memory. */
int search_fold(const char *s, size_t len, struct buf *out);

/* Append a header value with folding line breaks removed and RFC 2047
 * encoded words decoded to UTF-8 (see above).  0 or -1 (out of memory). */
int search_decode_header(const char *s, size_t len, struct buf *out);

/* The date of an RFC 5322 Date: value (day-of-week, comments, time and
 * zone tolerated and disregarded; two- and three-digit years as RFC 5322
 * 4.3 says).  0 and *date_r, or -1 when unparseable. */
int search_parse_date(const char *s, size_t len,
                      struct imapparse_date *date_r);

#endif
