#!/usr/bin/env bash
# check.sh - build the project and run every test.
#   ./check.sh              normal build in ./build (-Wall -Wextra -Werror)
#   ./check.sh --sanitize   the same tests in ./build-san with ASan + UBSan
# Prints each test program's cmocka summary and a closing
# "N passed, N failed" line; exits non-zero if anything failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/scripts/deps.sh" --test

build="$here/build"
confopts=(--enable-werror)
if [[ ${1:-} == --sanitize ]]; then
  build="$here/build-san"
  confopts+=(--enable-sanitizers)
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi

cd "$here"
# one autoreconf at a time: a check.sh and a check.sh --sanitize (or the
# demo) started together on a fresh checkout share the generated files
exec 9>"$here/.autoreconf.lock"
flock 9
if [[ ! -x configure || configure.ac -nt configure || Makefile.am -nt configure ]]; then
  autoreconf -fi
fi
flock -u 9
exec 9>&-
mkdir -p "$build"
cd "$build"
# a build configured before cmocka was installed (by ./demo.sh) is
# configured again now that the tests can be built
if [[ -f Makefile ]] && grep -q 'no-cmocka\.h' Makefile && pkg-config --exists cmocka; then
  rm -f Makefile
fi
[[ -f Makefile ]] || "$here/configure" -q "${confopts[@]}"
make -j"$(nproc)" >/dev/null

# Test files go to a scratch directory on the real disk (not tmpfs) that
# any user can reach: the compatibility tests run Cyrus's own tools, which
# switch to the user cyrus, and the checkout may sit below a private
# directory.
export TEST_TMPDIR
TEST_TMPDIR=$(mktemp -d /var/tmp/cyrusdeliver-check.XXXXXX)
chmod 755 "$TEST_TMPDIR"
trap 'rm -rf "$TEST_TMPDIR"' EXIT

rc=0
make -j"$(nproc)" check >make-check.out 2>&1 || rc=$?

# Summaries: cmocka's lines from each test program's log, then totals.
passed=0 failed=0 skipped=0
failed_logs=()
while IFS= read -r log; do
  name=${log%.log}
  res=$(sed -n 's/^:test-result: //p' "${name}.trs" 2>/dev/null | head -1)
  echo "== ${name#./}: ${res:-UNKNOWN}"
  grep -E '^\[ *(=+|PASSED|FAILED|SKIPPED) *\]' "$log" || true
  grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" || true
  case $res in
    PASS) p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
          s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
          sp=$(sed -n 's/^\([0-9]*\) passed, [0-9]* failed.*/\1/p' "$log" | tail -1)
          ss=$(sed -n 's/^# \([0-9]*\) skipped$/\1/p' "$log" | tail -1)
          passed=$((passed + ${p:-0} + ${sp:-0}))
          skipped=$((skipped + ${s:-0} + ${ss:-0})) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    *)    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -1)
          sf=$(sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p' "$log" | tail -1)
          n=$(( ${f:-0} + ${sf:-0} ))
          failed=$((failed + (n > 0 ? n : 1)))
          failed_logs+=("$log")
          echo "---- ${name#./}: last lines of its log:"
          tail -40 "$log" ;;
  esac
done < <(find . -path ./tests/tmp -prune -o -name 'test_*.log' -print | sort)

if [[ $rc -ne 0 ]]; then
  grep -E '^(FAIL|ERROR|XPASS):' make-check.out || tail -30 make-check.out
fi
# the failures' own lines once more at the end, where a shortened
# output (a CI excerpt) still shows why
for log in "${failed_logs[@]}"; do
  echo "---- ${log#./}: its failures:"
  grep -E '^(FAIL|not ok|\[  FAILED  \]|\[  ERROR   \])' "$log" | head -20 | cut -c1-400 || true
done
echo "check: build=${build#$here/}"
echo "${passed} passed, ${failed} failed, ${skipped} skipped"
exit $rc
