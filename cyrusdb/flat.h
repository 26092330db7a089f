/*
 * flat.h - the flat text file format: one record a line, kept sorted.
 *
 * The format is Cyrus IMAP's "flat" cyrusdb format, byte for byte:
 *
 *     ENCODED-KEY <TAB> ENCODED-VALUE <LF>
 *
 * one line per record, lines sorted by key.  Encoding: the bytes NUL, TAB,
 * LF and CR are written as the two bytes 0xFF, (byte | 0x80) -- that is
 * FF 80, FF 89, FF 8A, FF 8D -- and the byte 0xFF itself as FF FF; every
 * other byte stands for itself.  An encoded string therefore never holds a
 * raw NUL, TAB, LF or CR, so the first TAB of a line ends the key and the LF
 * ends the record.
 *
 * Order: lines are sorted by the ENCODED key, compared as cyrusdb_compare()
 * compares bytes for the handle's flags (CYRUSDB_MBOXSORT: '.' before every
 * other byte; a proper prefix first).  That is Cyrus's own rule: Cyrus
 * binary-searches the encoded lines in mailbox order, so with MBOXSORT any
 * file of any keys is exactly the one Cyrus writes and Cyrus finds every
 * key in ours (without MBOXSORT the two agree for keys without '.').  It
 * equals cyrusdb_compare() of the plain keys except where a key holds NUL,
 * TAB, LF or CR: those encode as FF 80/89/8A/8D and so sort after every
 * byte but 0xFF (Cyrus's order: "k" < "k\001" < "k\0" < "k\377").  Walks
 * (foreach) still give the API's order: cyrusdb_flat.c sorts a walk's range
 * when it holds such a key.
 *
 * This module is the engine only: encoding, parsing and searching a
 * read-only map of a whole file, an in-memory sorted set of pending
 * changes, and writing the merge of a map and a change set.  Locking,
 * transactions and file replacement live in cyrusdb_flat.c.
 *
 * Return codes of this module (FLAT_*): FLAT_OK; FLAT_END (no more records);
 * FLAT_DAMAGED (the bytes break the format: the caller reports an I/O
 * error); FLAT_SYSERR (a system call or an allocation failed; errno says
 * which).
 */
#ifndef CYRUSDB_FLAT_H
#define CYRUSDB_FLAT_H

#include <stddef.h>

#include "lib/buf.h"

enum {
    FLAT_OK = 0,
    FLAT_END = 1,
    FLAT_DAMAGED = -1,
    FLAT_SYSERR = -2
};

/* The escape byte. */
#define FLAT_ESCAPE 0xff

/* ---- encoding ---------------------------------------------------------- */

/* Append the encoding of (s, len) to out.  FLAT_OK, or FLAT_SYSERR when the
 * buffer cannot grow (nothing useful is left in out then). */
int flat_encode(struct buf *out, const char *s, size_t len);

/* Append the decoding of the encoded bytes (s, len) to out.  FLAT_DAMAGED
 * for a raw NUL, TAB, LF or CR, an escape byte at the end, or an escape
 * followed by anything but 80, 89, 8A, 8D or FF; FLAT_SYSERR when the
 * buffer cannot grow. */
int flat_decode(struct buf *out, const char *s, size_t len);

/* The file order of two plain keys: the order of their encodings (see
 * above).  <0, 0, >0. */
int flat_compare_keys(int flags, const char *a, size_t alen,
                      const char *b, size_t blen);

/* Compare a plain key with an encoded one in the file order, without
 * allocating.  *cmp_r gets <0, 0 or >0 (key
 * before, equal to, after the decoded enc).  FLAT_OK or FLAT_DAMAGED when
 * enc is not a valid encoding (checked up to the first differing byte, and
 * to its end when key is a prefix of it). */
int flat_compare_encoded(int flags, const char *key, size_t keylen,
                         const char *enc, size_t enclen, int *cmp_r);

/* ---- a read-only map of a whole file ----------------------------------- */

struct flat_map {
    const char *base;   /* NULL when size is 0 */
    size_t size;
};

#define FLAT_MAP_INITIALIZER { NULL, 0 }

/* Map the first `size` bytes of fd read-only.  A size of 0 maps nothing.
 * FLAT_OK or FLAT_SYSERR.  The file must not be changed in place while it
 * is mapped (this format never does: files are replaced by rename). */
int flat_map_fd(int fd, size_t size, struct flat_map *map_r);

/* Unmap; leaves an empty map.  Safe on an empty map. */
void flat_map_release(struct flat_map *map);

/* One line of a map, as spans of encoded bytes pointing into the map. */
struct flat_record {
    size_t offset;      /* where the line starts */
    const char *key;    /* encoded key (no TAB) */
    size_t keylen;
    const char *val;    /* encoded value (up to, without, the LF) */
    size_t vallen;
    size_t next;        /* offset of the following line */
};

/* Parse the line at `offset` (which must be a line start).  FLAT_OK,
 * FLAT_END when offset is at or past the end, FLAT_DAMAGED for a line
 * without LF, without TAB or with an empty key.  The escapes are not
 * checked here (flat_decode does). */
int flat_parse_line(const struct flat_map *map, size_t offset,
                    struct flat_record *rec_r);

/* Binary search for key in the file order.  *offset_r gets
 * the start of the line holding key (*found_r = 1) or of the first line
 * with a greater key, map->size when none (*found_r = 0).  FLAT_OK or
 * FLAT_DAMAGED when a line it had to read is malformed.  O(log n) lines. */
int flat_search(const struct flat_map *map, int flags,
                const char *key, size_t keylen,
                size_t *offset_r, int *found_r);

/* Check every line: well formed, valid escapes, non-empty keys strictly
 * increasing in the file order.  FLAT_OK, FLAT_DAMAGED with
 * the offset of the bad line in *offset_r and a constant reason in
 * *why_r, or FLAT_SYSERR.  *count_r (may be NULL) gets the record count. */
int flat_check(const struct flat_map *map, int flags, size_t *count_r,
               size_t *offset_r, const char **why_r);

/* ---- a sorted set of pending changes ------------------------------------ */

/* One pending change: a new value, or a deletion.  Read-only for callers;
 * the fields after `deleted` are private. */
struct flat_change {
    char *key;
    size_t keylen;
    char *val;          /* NULL for an empty value or a deletion */
    size_t vallen;
    int deleted;
    int level;
    struct flat_change *next[];
};

struct flat_changes;

/* A new empty set in the file order for flags (flat_compare_keys).  NULL on ENOMEM. */
struct flat_changes *flat_changes_new(int flags);

/* Free the set and every change; sets *csp to NULL. */
void flat_changes_free(struct flat_changes **csp);

/* Record a store (deleted == 0) or a deletion (deleted != 0, val ignored)
 * of key, replacing an earlier change of the same key.  The bytes are
 * copied.  FLAT_OK or FLAT_SYSERR (ENOMEM); on failure an earlier change
 * of the key is left as it was. */
int flat_changes_put(struct flat_changes *cs, const char *key, size_t keylen,
                     const char *val, size_t vallen, int deleted);

/* The change of exactly key, or NULL. */
const struct flat_change *flat_changes_find(const struct flat_changes *cs,
                                            const char *key, size_t keylen);

/* The first change with a key >= key (strict == 0) or > key (strict != 0);
 * key == NULL: the first change.  NULL when none. */
const struct flat_change *flat_changes_seek(const struct flat_changes *cs,
                                            const char *key, size_t keylen,
                                            int strict);

/* The change after c, or NULL. */
const struct flat_change *flat_changes_next(const struct flat_change *c);

/* Number of changes held (deletions included). */
size_t flat_changes_count(const struct flat_changes *cs);

/* ---- writing ------------------------------------------------------------ */

/* Write to fd (at its current position) the records of map with the
 * changes of cs applied (cs may be NULL), in order.  Lines of map that no
 * change touches are copied byte for byte.  FLAT_OK; FLAT_DAMAGED when a
 * line of map is malformed; FLAT_SYSERR when writing fails (errno: ENOSPC,
 * EDQUOT, EIO, ...).  Nothing is synced here. */
int flat_write_merged(int fd, const struct flat_map *map, int flags,
                      const struct flat_changes *cs);

/* Write one record line (encoded key, TAB, encoded value, LF) to out. */
int flat_format_record(struct buf *out, const char *key, size_t keylen,
                       const char *val, size_t vallen);

#endif
