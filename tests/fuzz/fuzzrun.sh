#!/usr/bin/env bash
# fuzzrun.sh NAME - what every test_fuzz_NAME.sh runs: build the
# libFuzzer target tests/fuzz/fuzz_NAME.c with clang (ASan + UBSan built
# in, linked with every source library, so a target may use any of them)
# and run it for a bounded time ($FUZZ_SECONDS, default 30) from the seed
# corpus in tests/fuzz/corpus/NAME, after replaying every seed once.
# New inputs the fuzzer finds go to a scratch directory, not into the
# checkout; a crash leaves its reproducer there and fails the test.
#
# The target is compiled from the sources with clang, independent of the
# build it runs in.  In the sanitizer build it is skipped (exit 77): the
# fuzzer carries its own sanitizers, and running it twice per CI run would
# only double the time.
set -euo pipefail
name=$1
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
builddir=${top_builddir:-.}
seconds=${FUZZ_SECONDS:-30}

if grep -q '^SAN_CFLAGS = .*fsanitize' "$builddir/Makefile" 2>/dev/null; then
  echo "SKIP: fuzzing runs in the normal build only"
  exit 77
fi
clang=$(command -v clang-14 || command -v clang || true)
if [[ -z $clang ]]; then
  echo "FAIL: clang not found (Debian package clang)"
  echo "0 passed, 1 failed"
  exit 1
fi

work=$(mktemp -d "${TEST_TMPDIR:-/var/tmp}/fuzz-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
cp "$srcdir"/tests/fuzz/corpus/$name/* "$work/corpus/"

cd "$srcdir"
"$clang" -g -O1 -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -I. -I"$builddir" \
  tests/fuzz/fuzz_$name.c sieve/*.c imapd/search.c imapd/imapparse.c \
  lib/*.c cyrusdb/*.c store/*.c \
  -ldb-5.3 -llmdb -lsasl2 -lssl -lcrypto -lz -lcurl -ljansson -o "$work/fuzz_$name"

fail=0
# every seed once, then a bounded run
if ! "$work/fuzz_$name" -runs=0 "$srcdir"/tests/fuzz/corpus/$name \
     > "$work/replay.log" 2>&1; then
  echo "FAIL: replaying the seed corpus"; tail -30 "$work/replay.log"; fail=1
else
  echo "PASS: seed corpus replayed ($(ls "$srcdir"/tests/fuzz/corpus/$name | wc -l) inputs)"
fi
if ! "$work/fuzz_$name" -max_total_time="$seconds" -rss_limit_mb=1024 \
     -artifact_prefix="$work/artifacts/" -print_final_stats=1 \
     "$work/corpus" > "$work/fuzz.log" 2>&1; then
  echo "FAIL: the fuzzer found a problem:"; tail -40 "$work/fuzz.log"
  ls -l "$work/artifacts"
  trap - EXIT
  echo "# inputs kept in $work"
  fail=1
else
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/fuzz.log")
  cov=$(grep -o 'cov: [0-9]*' "$work/fuzz.log" | tail -1)
  echo "PASS: ${seconds} s of fuzzing, ${runs:-?} inputs, ${cov:-cov: ?}, no crash"
fi
if ((fail)); then
  echo "$((2 - fail)) passed, $fail failed"
  exit 1
fi
echo "2 passed, 0 failed"
