/*
 * sort.h - SORT (RFC 5256, with DISPLAYFROM/DISPLAYTO of RFC 5957) and
 * THREAD (RFC 5256: ORDEREDSUBJECT and REFERENCES) over the messages a
 * search key selects in a session's view of a mailbox.
 *
 * Use, with the mailbox locked (shared) by the caller for the whole call,
 * as for search_run() (search.h; sp->uids must be given, the view):
 *
 *     struct sort_result res = { 0 };
 *     r = sort_run(&sp, cmd.search, cmd.sort, cmd.nsort, &res);
 *     ... "* SORT" res.n numbers from res.nums (UIDs when
 *         sp.return_uids) ...
 *     sort_result_free(&res);
 *
 *     struct buf out = BUF_INITIALIZER;
 *     r = sort_thread(&sp, cmd.search, cmd.thread_alg, &out);
 *     ... out holds "* THREAD (...)(...)\r\n" ...
 *
 * What is compared (RFC 5256 section 3):
 *  - ARRIVAL the internal date; SIZE the RFC822.SIZE; DATE the sent
 *    date: the Date: header as UTC (its zone applied), or the internal
 *    date when there is none or it does not parse.
 *  - FROM / TO / CC: the local part (addr-mailbox) of the field's first
 *    address; DISPLAYFROM / DISPLAYTO: its display name with RFC 2047
 *    words decoded, or "local@domain" when it has none (RFC 5957).  A
 *    missing field or address is the empty string.
 *  - SUBJECT: the base subject (RFC 5256 section 2.1: encoded words
 *    decoded, whitespace runs made one space, "Re:", "Fw:", "Fwd:",
 *    "[blob]" prefixes, "(fwd)" trailers and "[fwd: ...]" wrappers
 *    removed).
 *  - Strings compare with i;ascii-casemap (ASCII letters folded to upper
 *    case, then octet by octet); the charset argument is accepted (UTF-8
 *    or US-ASCII) and changes nothing in the comparison.
 *  - REVERSE turns one criterion around; ties after all criteria go by
 *    message number, ascending.
 *
 * THREAD ORDEREDSUBJECT groups by base subject; in each group the
 * earliest message (sent date, then number) is the parent of the
 * others; threads are ordered by their first message.  THREAD
 * REFERENCES is the algorithm of RFC 5256 section 3 (Message-ID,
 * References or else In-Reply-To; dummy containers pruned; roots with
 * the same base subject merged; siblings and threads by sent date).  A
 * message whose Message-ID is missing or used before counts as having
 * none.  Bounds: 64 references per message (the last ones); thread
 * depth is cut at 1000 (deeper parts become threads of their own).
 *
 * Cost: the index record answers ARRIVAL and SIZE; for the other keys
 * and THREAD only the header of each selected message is read (its
 * header_size bytes, at most 1 MiB), once per command.
 *
 * Errors as search_run(): STORE_OK, STORE_NOMEM, STORE_IOERROR,
 * STORE_CORRUPT, STORE_INTERNAL.  A message file that is missing counts
 * as a message with an empty header.
 */
#ifndef IMAPD_SORT_H
#define IMAPD_SORT_H

#include <stddef.h>
#include <stdint.h>

#include "imapd/imapparse.h"
#include "imapd/search.h"
#include "lib/buf.h"

struct sort_result {
    uint32_t *nums;             /* in sort order: message numbers or UIDs */
    size_t n;
    int has_modseq;             /* the key tree holds a MODSEQ key */
    uint64_t highest_modseq;    /* among the matches */
};

int sort_run(const struct search_params *sp,
             const struct imapparse_search *key,
             const struct imapparse_sortcrit *crit, size_t ncrit,
             struct sort_result *res_r);

void sort_result_free(struct sort_result *res);

/* The THREAD response line (with CRLF) appended to out. */
int sort_thread(const struct search_params *sp,
                const struct imapparse_search *key,
                enum imapparse_thread_alg alg, struct buf *out);

/* Exposed for tests: the base subject of a Subject: value (raw, may be
 * folded and hold encoded words) into out (reset first), not case
 * folded; *is_reply_r (may be NULL) 1 when a reply/forward marker was
 * removed.  0, or -1 out of memory. */
int sort_base_subject(const char *s, size_t len, struct buf *out,
                      int *is_reply_r);

/* Exposed for tests: an RFC 5322 date-time to UTC seconds.  0, or -1
 * when it does not parse. */
int sort_parse_datetime(const char *s, size_t len, int64_t *t_r);

#endif
