#!/usr/bin/env bash
# test_fuzz_sievebc.sh - fuzz the stored compiled form of Sieve scripts (fuzz_sievebc.c) for a bounded
# time from the seeds in tests/fuzz/corpus/sievebc; see fuzzrun.sh.
exec bash "$(dirname "$0")/fuzzrun.sh" sievebc
