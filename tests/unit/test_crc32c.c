/*
 * test_crc32c.c - the CRC-32C of the storage formats against published
 * check values (RFC 3720 B.4, and the common "123456789" check), and
 * incremental updates against one-shot sums over every split point.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "lib/crc32c.h"
#include "tests/testhelp.h"

static void test_check_values(void **state)
{
    unsigned char buf[32];
    int i;

    (void)state;
    assert_int_equal(crc32c("123456789", 9), 0xE3069283u);
    assert_int_equal(crc32c("", 0), 0);
    /* RFC 3720 B.4: 32 bytes of zeros, of ones, increasing, decreasing */
    memset(buf, 0, sizeof(buf));
    assert_int_equal(crc32c(buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof(buf));
    assert_int_equal(crc32c(buf, 32), 0x62A8AB43u);
    for (i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    assert_int_equal(crc32c(buf, 32), 0x46DD794Eu);
    for (i = 0; i < 32; i++)
        buf[i] = (unsigned char)(31 - i);
    assert_int_equal(crc32c(buf, 32), 0x113FDB5Cu);
}

static void test_incremental(void **state)
{
    unsigned char buf[300];
    uint32_t whole, crc;
    size_t cut;

    (void)state;
    th_fill(buf, sizeof(buf), 7);
    whole = crc32c(buf, sizeof(buf));
    for (cut = 0; cut <= sizeof(buf); cut++) {
        crc = crc32c_update(CRC32C_INIT, buf, cut);
        crc = crc32c_update(crc, buf + cut, sizeof(buf) - cut);
        assert_int_equal(crc32c_final(crc), whole);
    }
    /* every single-bit flip changes the sum */
    for (cut = 0; cut < sizeof(buf) * 8; cut += 13) {
        buf[cut / 8] ^= (unsigned char)(1u << (cut % 8));
        assert_int_not_equal(crc32c(buf, sizeof(buf)), whole);
        buf[cut / 8] ^= (unsigned char)(1u << (cut % 8));
    }
}

/* crc32c_update() (the CRC32 instruction where the processor has it)
 * against the tables, at every length up to 100 and every alignment, and
 * over 20,000 bytes */
static void test_fast_path(void **state)
{
    static unsigned char buf[20000 + 8];
    size_t len, al;

    (void)state;
    th_fill(buf, sizeof(buf), 11);
    for (al = 0; al < 8; al++)
        for (len = 0; len <= 100; len++)
            assert_int_equal(crc32c_update(CRC32C_INIT, buf + al, len),
                             crc32c_update_portable(CRC32C_INIT, buf + al,
                                                    len));
    assert_int_equal(crc32c_update(0x12345678u, buf + 3, 20000),
                     crc32c_update_portable(0x12345678u, buf + 3, 20000));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_values),
        cmocka_unit_test(test_incremental),
        cmocka_unit_test(test_fast_path),
    };

    return cmocka_run_group_tests_name("crc32c", tests, NULL, NULL);
}
