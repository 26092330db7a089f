/*
 * utf8.h - strict UTF-8 (RFC 3629) decoding and encoding, shared by the
 * IMAP search (charset conversion and case folding), LMTP's SMTPUTF8
 * addresses and the Sieve interpreter's encoded characters; and IMAP's
 * modified UTF-7 for mailbox names (RFC 3501 5.1.3), which imapd turns
 * into UTF-8 and back once a client has enabled UTF8=ACCEPT (RFC 6855).
 * Pure functions, no allocation but the caller's struct buf.
 */
#ifndef LIB_UTF8_H
#define LIB_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"

/* Decode one character at s[0 .. len) (len >= 1): its code point into
 * *cp_r and its length in bytes into *n_r, 0; or -1 when the bytes there
 * are not well-formed UTF-8 (an overlong form, a surrogate, a value above
 * U+10FFFF, a bad or missing continuation byte). */
int utf8_decode(const unsigned char *s, size_t len, uint32_t *cp_r,
                size_t *n_r);

/* Append code point cp (at most U+10FFFF) as UTF-8 to out: buf_append's
 * result. */
int utf8_put(struct buf *out, uint32_t cp);

/* UTF-8 text s[0 .. len) -> modified UTF-7, appended to out: printable
 * US-ASCII but '&' stands for itself, '&' is "&-", every other run of
 * characters is '&' + the modified base64 (',' for '/', no padding) of
 * its UTF-16 + '-'.  The result is the one canonical spelling, so equal
 * names stay equal.  0; -1 when s is not well-formed UTF-8 or holds a
 * control character (U+0000..U+001F, U+007F..U+009F: RFC 5198
 * Net-Unicode has none), out then holding part of the result; -2 when
 * out cannot grow. */
int utf8_to_mutf7(const char *s, size_t len, struct buf *out);

/* Modified UTF-7 s[0 .. len) -> UTF-8, appended to out.  Strict: only
 * printable US-ASCII bytes; a base64 run must decode to whole UTF-16
 * units (surrogates paired), end in '-', have zero padding bits, hold at
 * least one character, none of them printable US-ASCII or a control
 * character, and not directly follow another run.  0; -1 for anything
 * else (out then holding part of the result); -2 when out cannot grow. */
int utf8_from_mutf7(const char *s, size_t len, struct buf *out);

#endif
