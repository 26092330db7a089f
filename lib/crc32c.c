/*
 * crc32c.c - CRC-32C (Castagnoli polynomial, reflected), slicing-by-8.
 *
 * crc32c_table[0] is the classic byte-at-a-time table; crc32c_table[j][i]
 * is the CRC of byte i followed by j zero bytes, so eight input bytes are
 * folded per step.  Bytes are read one at a time: alignment and host byte
 * order do not matter.
 *
 * On x86-64 processors with SSE4.2 (asked once, __builtin_cpu_supports),
 * crc32c_update() uses the CRC32 instruction instead, eight bytes per
 * instruction (about ten times the tables' speed: a journal record of a
 * 14 KB message is summed in about a microsecond); both give the same
 * values (tests/unit/test_crc32c.c compares them).
 */
#include "config.h"

#include "lib/crc32c.h"

#define CRC32C_POLY 0x82F63B78u

static uint32_t crc32c_table[8][256];
static volatile int crc32c_ready;

static void crc32c_init(void)
{
    uint32_t i, c;
    int j, k;

    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (i = 0; i < 256; i++)
        for (j = 1; j < 8; j++) {
            c = crc32c_table[j - 1][i];
            crc32c_table[j][i] = (c >> 8) ^ crc32c_table[0][c & 0xffu];
        }
    crc32c_ready = 1;
}

uint32_t crc32c_update_portable(uint32_t crc, const void *p, size_t len)
{
    const unsigned char *b = p;

    if (!crc32c_ready)
        crc32c_init();
    for (; len >= 8; len -= 8, b += 8) {
        crc ^= (uint32_t)b[0] | (uint32_t)b[1] << 8 |
               (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        crc = crc32c_table[7][crc & 0xffu] ^
              crc32c_table[6][(crc >> 8) & 0xffu] ^
              crc32c_table[5][(crc >> 16) & 0xffu] ^
              crc32c_table[4][crc >> 24] ^
              crc32c_table[3][b[4]] ^ crc32c_table[2][b[5]] ^
              crc32c_table[1][b[6]] ^ crc32c_table[0][b[7]];
    }
    while (len--)
        crc = crc32c_table[0][(crc ^ *b++) & 0xffu] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <string.h>

__attribute__((target("sse4.2")))
static uint32_t crc32c_update_sse42(uint32_t crc, const void *p, size_t len)
{
    const unsigned char *b = p;
    uint64_t c = crc, w;

    for (; len >= 8; len -= 8, b += 8) {
        memcpy(&w, b, 8);       /* little-endian host: the bytes in order */
        c = __builtin_ia32_crc32di(c, w);
    }
    crc = (uint32_t)c;
    while (len--)
        crc = __builtin_ia32_crc32qi(crc, *b++);
    return crc;
}

static int crc32c_hw = -1;      /* -1: not asked yet; a race asks twice */

uint32_t crc32c_update(uint32_t crc, const void *p, size_t len)
{
    if (crc32c_hw < 0) {
        __builtin_cpu_init();
        crc32c_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    return crc32c_hw ? crc32c_update_sse42(crc, p, len)
                     : crc32c_update_portable(crc, p, len);
}
#else
uint32_t crc32c_update(uint32_t crc, const void *p, size_t len)
{
    return crc32c_update_portable(crc, p, len);
}
#endif

uint32_t crc32c(const void *p, size_t len)
{
    return crc32c_final(crc32c_update(CRC32C_INIT, p, len));
}
