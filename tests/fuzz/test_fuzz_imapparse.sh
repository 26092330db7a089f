#!/usr/bin/env bash
# test_fuzz_imapparse.sh - fuzz the IMAP command parser (fuzz_imapparse.c) for a bounded
# time from the seeds in tests/fuzz/corpus/imapparse; see fuzzrun.sh.
exec bash "$(dirname "$0")/fuzzrun.sh" imapparse
