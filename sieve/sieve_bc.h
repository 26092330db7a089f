/*
 * sieve_bc.h - the stored compiled form of a Sieve script: the checked
 * tree of sieve_compile() written flat to a file beside the script
 * (NAME.bc next to NAME.script), so that delivery loads it instead of
 * parsing and checking the text again.
 *
 *   struct buf bc = BUF_INITIALIZER;
 *   sieve_compile(text, len, limits, allowed, &s, &err);
 *   sieve_bc_encode(s, text, len, allowed, &bc);     ... write bc ...
 *   later, with the script's current text at hand:
 *   r = sieve_bc_decode(bc.s, bc.len, text, len, limits, allowed, &s, &why);
 *   SIEVE_OK: s runs exactly as the compiled text would; SIEVE_EINVAL:
 *   the file is stale or damaged (why says which): compile the text.
 *
 * Format (version 4; integers little-endian; no pointers, so the bytes
 * mean the same wherever they are read or mapped):
 *
 *   offset size
 *      0    8   magic "\x7fSIEVBC\n"
 *      8    4   format version (SIEVE_BC_VERSION)
 *     12    4   header size (80)
 *     16    8   source size in bytes
 *     24    8   source hash (sieve_bc_hash(): 8 bytes a step)
 *     32    4   0 (reserved)
 *     36    4   extension set the script was checked against: bit i =
 *               sieve_ext_names[i] (sieve_ext.h) allowed
 *     40    4   max_nesting the script was checked under
 *     44    4   size hint: the bytes the loaded tree takes (measured by
 *               the encoder, which loads the form once; 0 none), so
 *               that the loader makes it in one allocation
 *     48    8   max_string_len the script was checked under
 *     56    4   payload size (the file is exactly 80 + this)
 *     60    4   CRC-32C of the payload, then of the size hint, then
 *               of the source's identity (64..79)
 *     64    8   the source's identity, set when the writer knew which
 *               file the text was read from (0 and 0: unknown): the
 *               file's inode number,
 *     72    8   and its modification time, in nanoseconds since the
 *               epoch (signed)
 *     80        payload
 *
 * The identity lets a loader that has stat()ed the script file (size,
 * inode, mtime) take the compiled form as current without reading the
 * text (sieve_bc_source()); one that has read the text checks the size
 * and hash instead.  The identity does not see an edit in place that
 * keeps the size and the mtime (cp -p, touch -r), nor one within the
 * file system's timestamp granularity of the writer's read: after such
 * an edit the old compiled form runs until the script is stored again.
 * Every writer of ours replaces a script by a rename (a new inode). 
 *
 * The payload is a sequence of unsigned LEB128 numbers ("n" below, at
 * most 10 bytes, 64 bits) and byte strings (n length, then the bytes):
 *
 *   script  = n count, string*     the require names
 *             n flags              bit 0: uses variables
 *             n count, node*       the top-level commands
 *   node    = n id, n line, n flags (bit 0 test list, 1 has block,
 *             2 unchecked, 3 has match, 4 has comparator, 5 has address
 *             part, 6 last, 7 originalzone, 8 has flags, 9 copy,
 *             10 create, 11 mime, 12 once, 13 optional, 14 global,
 *             15 has seconds, 16 over), string name only when the id
 *             is 0 or names no command or test (an unchecked command;
 *             the others take their name from the id),
 *             n field mask, then the fields whose bit is set (those not
 *             0, in this order): comparator, match, relop, address
 *             part, body transform, set modifiers, index, seconds,
 *             number; then references, 1 + the index of the argument
 *             whose first string is :zone, :specialuse, :subject, :from,
 *             :handle, :header, :uniqueid, and whose list is :flags,
 *             :addresses, :content,
 *             n count, arg*,
 *             n count, n arg index*          the positional arguments
 *             n count, node*                 the tests
 *             n count, node*                 the block
 *   arg     = n count, (string, n flags)*: the node's arguments that are
 *             not tags, in order, each a string list (flag bit 0: has a
 *             variable reference, bit 1: a :regex key compiled at load);
 *             a number is an empty list (its value is in the node's
 *             fields, as every tag's meaning is).  Version 3 also kept
 *             each argument's kind, line and list syntax, the tags and
 *             the numbers, and every node's name: what the checker had
 *             already turned into fields, read at every load.
 *
 * A loaded tree lives in a few large blocks (struct sv_chunk), not one
 * allocation per node and string, and :regex keys are compiled again.
 *
 * sieve_bc_decode() trusts nothing: every length and count is checked
 * against the bytes left, nesting is bounded, every reference must name
 * an argument of the right kind, every checked node must have the shape
 * of its command or test (sieve_check_shape()), and the CRC-32C of the
 * payload must match; anything else rejects the whole file.  A file
 * whose source size, hash, extension set or compile-time limits differ
 * from the caller's is stale and rejected the same way.
 */
#ifndef SIEVE_SIEVE_BC_H
#define SIEVE_SIEVE_BC_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/strarray.h"
#include "sieve/sieve.h"

#define SIEVE_BC_VERSION 4
#define SIEVE_BC_HEADER 80
#define SIEVE_BC_SUFFIX ".bc"

/* Append the stored form of script s, compiled from text[0..len) with
 * the extension list allowed (NULL: all) to out.  SIEVE_OK, SIEVE_ENOMEM,
 * SIEVE_EINVAL (s NULL). */
int sieve_bc_encode(const struct sieve_script *s, const char *text,
                    size_t len, const struct strarray *allowed,
                    struct buf *out);

/* Load the stored form data[0..len) for the script whose current text
 * is text[0..textlen), to be run under limits (NULL: defaults) with the
 * extension list allowed (NULL: all).  SIEVE_OK with *script_r set;
 * SIEVE_EINVAL when the file is stale, of another version or damaged,
 * *why_r a constant text ("stale: source changed", "corrupt: ...");
 * SIEVE_ENOMEM. */
int sieve_bc_decode(const void *data, size_t len, const char *text,
                    size_t textlen, const struct sieve_limits *limits,
                    const struct strarray *allowed,
                    struct sieve_script **script_r, const char **why_r);

/* The same for a caller that knows the text's size and hash
 * (sieve_bc_hash()) and the extension mask (sieve_bc_extmask()) already:
 * the text itself is not read again. */
int sieve_bc_decode_known(const void *data, size_t len, size_t textlen,
                          uint64_t texthash, uint32_t extmask,
                          const struct sieve_limits *limits,
                          struct sieve_script **script_r,
                          const char **why_r);

/* The hash of a script's text (the header's source hash; version 1 had
 * FNV-1a 64, a byte a step): eight bytes a step, each read
 * little-endian, mixed by a multiply and a shift.  Not a cryptographic
 * hash: equal texts have equal hashes, the converse is checked by the
 * caller where it matters (lmtpd compares the bytes). */
uint64_t sieve_bc_hash(const char *text, size_t len);

/* The checksum of the stored form file (its header, then len bytes of
 * payload), header field 60: the CRC-32C of the payload, then of the
 * size hint and of the source identity, so that no byte of them changes
 * unnoticed. */
uint32_t sieve_bc_checksum(const void *file, size_t len);

/* Set the source identity of the stored form file[0..len) (a whole
 * file as sieve_bc_encode() wrote it; the checksum is made again):
 * the inode number and the mtime (ns since the epoch) of the file its
 * text was read from.  0, or -1 when file is not a stored form. */
int sieve_bc_set_source(void *file, size_t len, uint64_t ino,
                        int64_t mtime_ns);

/* The header of the stored form file[0..len), read without checking the
 * payload (sieve_bc_decode_known() does that): 0 with the text's size
 * and hash and the source identity (0 and 0: unknown) when the header is
 * of this version and the length matches, else -1. */
int sieve_bc_source(const void *file, size_t len, uint64_t *textlen,
                    uint64_t *texthash, uint64_t *ino, int64_t *mtime_ns);

/* The header's extension mask for the list allowed (NULL: all). */
uint32_t sieve_bc_extmask(const struct strarray *allowed);

#endif
