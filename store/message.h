/*
 * message.h - the read side of a stored message, for IMAP FETCH.
 *
 * message_parse() reads a message (RFC 5322 + MIME, RFC 2045/2046) from a
 * byte range once and builds its MIME tree; the other functions answer
 * FETCH items from that tree, writing IMAP syntax (RFC 3501 section 7.4.2)
 * into a struct buf, ready to send:
 *
 *   ENVELOPE             message_write_envelope()
 *   BODY / BODYSTRUCTURE message_write_body(), extended = 0 / 1
 *   BODY[section]<o.n>   message_write_section() (a literal), or
 *                        message_get_section() for the raw bytes
 *   BINARY[section]      message_get_binary() (RFC 3516: the section with
 *                        its Content-Transfer-Encoding undone)
 *   RFC822.SIZE          message_size()
 *
 * The parser never fails on malformed input: it degrades the way Cyrus and
 * Dovecot do (an unparsable Content-Type is text/plain; a multipart without
 * a boundary parameter is text/plain; a multipart whose boundary never
 * appears gets one empty text/plain part in BODYSTRUCTURE; a missing close
 * delimiter ends the last part at the end of the enclosing body; a header
 * without the blank separator line takes the whole range, the body is
 * empty; bare LF counts as a line end).  Nesting deeper than
 * MESSAGE_MAX_DEPTH and parts past MESSAGE_MAX_PARTS are not descended
 * into: such a multipart or message/rfc822 part is shown as text/plain.
 *
 * Memory: the message keeps pointers into the caller's bytes (e.g. an mmap
 * of the UID. file), which must stay valid and unchanged until
 * message_free().  Nothing here is shared between threads or processes;
 * a struct message may be used from one thread at a time.
 *
 * Conventions in the output:
 *  - strings are IMAP quoted strings, or literals {n}\r\n... when they
 *    contain CR, LF, 8-bit bytes, '"' or '\\'; NUL bytes are dropped from
 *    header-derived strings; an absent value is NIL;
 *  - header values are unfolded (CRLF before whitespace removed) and
 *    trimmed; RFC 2047 encoded words are passed on as they are;
 *  - MIME type, subtype, parameter names, encoding and disposition type
 *    are upper-cased (as Cyrus does); parameter values are as given;
 *  - body size is in octets of the stored part; lines is the number of
 *    LF bytes, plus one when the part ends in an unterminated line;
 *  - an address with no domain gets host "" (NIL is reserved for group
 *    syntax); a display name may come from a trailing comment
 *    ("a@b (Name)") when there is no phrase;
 *  - the BODYSTRUCTURE MD5 is always NIL; RFC 2231 parameter
 *    continuations are passed on undecoded (name*0, name*1*, ...).
 */
#ifndef STORE_MESSAGE_H
#define STORE_MESSAGE_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"

#define MESSAGE_MAX_DEPTH 50      /* nesting of multipart / message/rfc822 */
#define MESSAGE_MAX_PARTS 10000   /* MIME parts in one message */

/* Return codes. */
#define MESSAGE_OK       0
#define MESSAGE_NOMEM   (-1)   /* allocation failed, or the output buffer
                                * reached its maximum (buf_set_max) */
#define MESSAGE_BADARG  (-2)   /* a section or argument that cannot be
                                * honoured (NULL pointers, a field list
                                * without HEADER.FIELDS, ...) */
#define MESSAGE_UNKNOWN_CTE (-3)  /* message_get_binary(): a transfer
                                * encoding it cannot undo */

struct message;   /* a parsed message: opaque */

/* Parse `len` bytes at `base` (may be NULL when len is 0).  On success
 * *msg_r is a new message that the caller frees with message_free().
 * Returns MESSAGE_OK, MESSAGE_NOMEM, or MESSAGE_BADARG (base NULL with
 * len > 0); on error *msg_r is NULL.  Malformed input is never an error
 * (see above). */
int message_parse(const char *base, size_t len, struct message **msg_r);

/* Raw-text helpers shared with SEARCH: the start of the line after the
 * one at p (after its LF), or end; whether the line at p is empty (CRLF,
 * LF, or a lone CR at the end); the length of the header block at [p,
 * end), up to and including the first empty line, or everything when
 * there is none. */
const char *message_line_next(const char *p, const char *end);
int message_line_is_empty(const char *p, const char *end);
size_t message_header_length(const char *p, const char *end);

/* Free the message and set *msgp to NULL; NULL-safe. */
void message_free(struct message **msgp);

/* Size of the whole message, and of its header (up to and including the
 * blank line). */
size_t message_size(const struct message *msg);
size_t message_header_size(const struct message *msg);

/* Number of MIME parts in the tree (the message itself counts as one). */
size_t message_part_count(const struct message *msg);

/* Append the ENVELOPE of the message, "(date subject from ...)", to out.
 * MESSAGE_OK or MESSAGE_NOMEM (out may then hold a partial item; truncate
 * it back to its old length). */
int message_write_envelope(const struct message *msg, struct buf *out);

/* The addresses of an address-list header value (From, To, Cc, ...), as
 * the ENVELOPE parses them: fn is called once per address with its
 * display name (NULL when none; quoted strings unquoted, comments
 * dropped, encoded words left as they are), its local part and its
 * domain (empty when none), none NUL-terminated.  Group names are not
 * reported.  value may hold folding line breaks.  fn returns 0, or
 * nonzero to stop (then MESSAGE_NOMEM is returned).  Returns MESSAGE_OK,
 * MESSAGE_NOMEM, or MESSAGE_BADARG (fn NULL, value NULL with len > 0). */
typedef int message_address_fn(void *rock, const char *name, size_t namelen,
                               const char *mailbox, size_t mailboxlen,
                               const char *host, size_t hostlen);
int message_addresses(const char *value, size_t len, message_address_fn *fn,
                      void *rock);

/* Append the body structure: extended != 0 for BODYSTRUCTURE (with the
 * extension data), 0 for BODY.  Returns as message_write_envelope(). */
int message_write_body(const struct message *msg, int extended,
                       struct buf *out);

/* A FETCH section (RFC 3501 6.4.5): part numbers (each >= 1) then the kind
 * of text.  npart == 0 means the whole message.  The field names of
 * HEADER.FIELDS[.NOT] compare case-insensitively. */
enum message_section_kind {
    MESSAGE_SECTION_CONTENT = 0,      /* BODY[] / BODY[1.2]: the part */
    MESSAGE_SECTION_HEADER,           /* [HEADER] / [n.HEADER] */
    MESSAGE_SECTION_HEADER_FIELDS,    /* [HEADER.FIELDS (a b)] */
    MESSAGE_SECTION_HEADER_FIELDS_NOT,/* [HEADER.FIELDS.NOT (a b)] */
    MESSAGE_SECTION_TEXT,             /* [TEXT] / [n.TEXT] */
    MESSAGE_SECTION_MIME              /* [n.MIME]; needs npart >= 1 */
};

struct message_section {
    const uint32_t *part;             /* part numbers, npart of them */
    size_t npart;
    enum message_section_kind kind;
    const char *const *fields;        /* NUL-terminated names, nfields */
    size_t nfields;
};

/* Append the raw bytes of a section to out.  Part numbering follows RFC
 * 3501: the parts of a multipart are numbered from 1; a non-multipart
 * message (or encapsulated message) has only part 1, its body; after a
 * message/rfc822 part, further numbers address the encapsulated message.
 * HEADER, HEADER.FIELDS[.NOT] and TEXT after part numbers need a
 * message/rfc822 part.  A section that does not exist appends nothing and
 * is not an error (IMAP answers the empty string).  HEADER.FIELDS[.NOT]
 * output is the matching field lines as stored (folding kept) followed by
 * a blank line.  Returns MESSAGE_OK, MESSAGE_NOMEM, or MESSAGE_BADARG
 * (MIME with npart == 0, an unknown kind, fields missing). */
int message_get_section(const struct message *msg,
                        const struct message_section *sec, struct buf *out);

/* Append a section as an IMAP literal "{n}\r\n<bytes>", cut to the partial
 * range: `origin` octets skipped, at most `count` octets sent (count
 * SIZE_MAX for the whole rest).  An origin past the end gives "{0}\r\n".
 * A literal holds no NUL (RFC 3501 9): each NUL octet of the section is
 * sent as 0x80, one for one, so n and the offsets are those of the
 * stored bytes (message_get_section() and BINARY keep the NULs).
 * The "BODY[...]<origin>" label is the caller's.  Returns as
 * message_get_section(). */
int message_write_section(const struct message *msg,
                          const struct message_section *sec,
                          size_t origin, size_t count, struct buf *out);

/* BINARY[part] (RFC 3516): append the content of the section the part
 * numbers name (as message_get_section() with MESSAGE_SECTION_CONTENT)
 * with its Content-Transfer-Encoding undone.  The encoding is read from
 * the part's MIME header as BODYSTRUCTURE shows it: absent, empty,
 * "7bit", "8bit" and "binary" send the bytes as stored; "base64" and
 * "quoted-printable" (any case) are decoded (message_decode_base64(),
 * message_decode_qp()); anything else is MESSAGE_UNKNOWN_CTE with
 * nothing appended.  A multipart or message/rfc822 part may only have
 * an identity encoding (RFC 2045 6.4): it is sent as stored (the parts
 * inside are not decoded), and another encoding on it is
 * MESSAGE_UNKNOWN_CTE.  npart == 0 (BINARY[]) is the whole message as
 * stored: a message has no transfer encoding of its own.  *exists_r (may
 * be NULL) is 1 when the section exists, 0 when it does not (nothing
 * appended, MESSAGE_OK: IMAP answers NIL).  Returns MESSAGE_OK,
 * MESSAGE_UNKNOWN_CTE, MESSAGE_NOMEM, or MESSAGE_BADARG (NULL msg or
 * out, part NULL with npart > 0). */
int message_get_binary(const struct message *msg, const uint32_t *part,
                       size_t npart, struct buf *out, int *exists_r);

/* Transfer decoding (RFC 2045 6.7 and 6.8), appending to out.  Base64:
 * bytes outside the alphabet (line breaks) are skipped, '=' ends the
 * data, a trailing partial quantum is dropped.  Quoted-printable: "=XX"
 * (either case) is the byte, "=" before the line end (after optional
 * white space) is a soft line break, white space before a hard line
 * end is dropped (transport padding, rule 3), a malformed "=" is kept
 * as it is; line ends (CRLF or LF) are kept as they are.  MESSAGE_OK or
 * MESSAGE_NOMEM. */
int message_decode_base64(const char *s, size_t len, struct buf *out);
int message_decode_qp(const char *s, size_t len, struct buf *out);
/* RFC 2047's Q encoding of an encoded word's text ('_' is a space, =XX a
 * byte, a malformed '=' kept as it is), appended to out. */
int message_decode_q(const char *s, size_t len, struct buf *out);

/* Append `len` bytes as an IMAP string (quoted, or a literal when needed,
 * see above); data NULL writes NIL.  MESSAGE_OK or MESSAGE_NOMEM. */
int message_write_nstring(struct buf *out, const char *data, size_t len);

#endif
