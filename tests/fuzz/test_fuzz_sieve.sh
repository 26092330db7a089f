#!/usr/bin/env bash
# test_fuzz_sieve.sh - fuzz the Sieve library (fuzz_sieve.c) for a bounded
# time from the seeds in tests/fuzz/corpus/sieve; see fuzzrun.sh.
exec bash "$(dirname "$0")/fuzzrun.sh" sieve
