/*
 * no-cmocka.h - forced into every test when configure found no cmocka, so
 * that `make check` stops with one clear message instead of a missing
 * header.  The programs themselves build without cmocka.
 */
#error "cmocka is not installed: run scripts/deps.sh --test (libcmocka-dev), then ./configure again (./check.sh does both)"
