/*
 * crc32c.h - CRC-32C (Castagnoli), the checksum of the storage formats
 * (lmdb records, mailbox index headers and records).
 *
 * Usage: crc = crc32c_update(CRC32C_INIT, p, n); ... ;
 *        sum = crc32c_final(crc);   or simply sum = crc32c(p, n).
 * Thread-safe: the tables are built once, on first use, and any race
 * writes the same values.
 */
#ifndef LIB_CRC32C_H
#define LIB_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#define CRC32C_INIT 0xFFFFFFFFu

/* Continue a CRC over p[0..len) (crc without the final inversion). */
uint32_t crc32c_update(uint32_t crc, const void *p, size_t len);

/* The same with the tables only, never the processor's CRC32 instruction
 * (crc32c_update() uses it where there is one): for the tests. */
uint32_t crc32c_update_portable(uint32_t crc, const void *p, size_t len);

/* The final inversion. */
static inline uint32_t crc32c_final(uint32_t crc) { return crc ^ 0xFFFFFFFFu; }

/* The CRC-32C of one buffer (crc32c("123456789", 9) == 0xE3069283). */
uint32_t crc32c(const void *p, size_t len);

#endif
