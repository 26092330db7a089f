/*
 * utf8.h - strict UTF-8 (RFC 3629) decoding and encoding, shared by the
 * IMAP search (charset conversion and case folding), LMTP's SMTPUTF8
 * addresses and the Sieve interpreter's encoded characters.
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

#endif
