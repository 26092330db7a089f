#!/usr/bin/env bash
# profile.sh - where the CPU of a no-sync LMTP delivery goes: system calls
# and instructions per delivery, and the server's CPU time per delivery,
# for our master + lmtpd with spool_sync: off (doc/bench/profile.md).
#
#   bench/profile.sh [-b BUILDDIR] [-t TEMPLATE] [-d DIR] [-o OUTDIR]
#                    [-n MSGS] [-r RUNS] [-x "strace callgrind cpu"]
#
#   -b DIR    our build directory (default $BENCH_BUILD, else ./build)
#   -t DIR    a server directory made by `bench/servers.sh setup ours DIR
#             spool_sync=off` (2,000 users); made in DIR/tpl-off when absent
#   -d DIR    where the runs go (default /var/tmp/profile: the real disk)
#   -o DIR    where the results go (default DIR/results)
#   -n MSGS   messages per run of strace and cpu (default 2000)
#   -r RUNS   runs of cpu (default 3; the median is printed)
#   -x LIST   what to measure (default all three):
#     strace    the master and every lmtpd under `strace -f -c` during one
#               run (mailbench lmtp -c 40 -n MSGS -m 2000, 13,870 bytes):
#               calls of each system call divided by MSGS
#     callgrind ONE lmtpd (lmtpunix prefork=1 maxchild=1) under valgrind
#               --tool=callgrind, 10 connections, once with 200 and once
#               with 1,200 deliveries: the difference of the two totals
#               divided by 1,000 is the instructions of one delivery
#               without the start-up (repeatable on a busy machine; the
#               two profiles stay in OUTDIR for callgrind_annotate)
#     cpu       RUNS runs of MSGS messages, 40 connections: msgs/s and the
#               CPU time of the server's processes (srv_cpu_ticks of
#               bench/servers.sh: utime + stime of each, reaped children
#               included, from /proc before and after the run) divided by
#               MSGS
#
# Run directories are not removed before the end: on ext4 without a
# journal, files created within minutes of many deletions in the same
# block group cost a scan of the deleted inodes each (doc/bench/profile.md),
# which would tax the next run.  Every process started is stopped by PID.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
top=$(dirname "$here")
base=/var/tmp/profile
tpl=
out=
msgs=2000
runs=3
what="strace callgrind cpu"
BENCH_BUILD=${BENCH_BUILD:-}

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 2; }
while getopts "b:t:d:o:n:r:x:h" opt; do
    case $opt in
    b) BENCH_BUILD=$OPTARG ;;
    t) tpl=$OPTARG ;;
    d) base=$OPTARG ;;
    o) out=$OPTARG ;;
    n) msgs=$OPTARG ;;
    r) runs=$OPTARG ;;
    x) what=$OPTARG ;;
    *) usage ;;
    esac
done
[[ -n $BENCH_BUILD ]] || BENCH_BUILD=$top/build
BENCH_BUILD=$(cd "$BENCH_BUILD" && pwd) || exit 2
export BENCH_BUILD BENCH_QUIET=1
# shellcheck source=bench/servers.sh
. "$here/servers.sh"
mailbench=$BENCH_BUILD/tools/mailbench
[[ -x $mailbench ]] || { echo "profile: no $mailbench (build first)" >&2; exit 2; }
mkdir -p "$base" || exit 2
base=$(cd "$base" && pwd)
[[ -n $out ]] || out=$base/results
mkdir -p "$out" || exit 2
has() { [[ " $what " == *" $1 "* ]]; }
log() { echo "profile: $*" >&2; }

if [[ -z $tpl ]]; then
    tpl=$base/tpl-off
    if [[ ! -f $tpl/bench.env ]]; then
        log "setting up $tpl (2,000 mailboxes)"
        srv_setup ours "$tpl" spool_sync=off || exit 1
    fi
fi
# the template's service commands name the build it was made with
tpl_build=$(sed -n 's|^ *lmtpunix cmd="\(.*\)/lmtpd/lmtpd".*|\1|p' "$tpl/cyrus.conf")
runs_made=()

# start runs in $(...), a subshell: the caller records the directory
# in runs_made itself, so that the end removes it
start() {   # NAME [sed expression for cyrus.conf] -> prints the directory
    local d=$base/run.$1.$$
    srv_clone "$tpl" "$d" >/dev/null || return 1
    [[ -n $tpl_build ]] && sed -i "s|$tpl_build/|$BENCH_BUILD/|g" "$d/cyrus.conf"
    [[ -n ${2:-} ]] && sed -i "$2" "$d/cyrus.conf"
    sync
    srv_start "$d" || return 1
    echo "$d"
}

if has strace; then
    command -v strace >/dev/null || { echo "profile: strace not found" >&2; exit 2; }
    d=$(start strace) || exit 1
    runs_made+=("$d")
    m=$(cat "$d/master.pid")
    # shellcheck disable=SC2046
    strace -f -c -o "$out/strace.txt" -p "$m" $(pgrep -P "$m" | sed 's/^/-p /') 2>/dev/null &
    spid=$!
    sleep 1
    "$mailbench" lmtp --lmtp "$(srv_lmtp "$d")" -c 40 -n "$msgs" -m 2000 -q \
        --json "$out/strace.json" > "$out/strace.mailbench.txt" 2>&1
    kill -INT "$spid"; wait "$spid"
    srv_stop "$d" || exit 1
    echo "system calls per delivery ($msgs deliveries, strace -f -c):"
    # columns: % time, seconds, usecs/call, calls, [errors,] syscall
    awk -v n="$msgs" '$1 ~ /^[0-9.]+$/ && NF >= 5 && ($4 / n >= 0.05 || $NF == "total") {
            printf "  %-16s %7.2f\n", $NF, $4 / n }' "$out/strace.txt" | sort -k2,2nr
fi

if has callgrind; then
    command -v valgrind >/dev/null || { echo "profile: valgrind not found" >&2; exit 2; }
    mkdir -p "$out/callgrind"
    chmod 777 "$out/callgrind"   # the worker runs as the server's user
    total() { callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'; }
    for n in 200 1200; do
        f=$out/callgrind/lmtpd.$n.out
        rm -f "$f"
        d=$(start "cg$n" "s|lmtpunix cmd=\"\([^\"]*\)\" \(listen=\"[^\"]*\"\) prefork=[0-9]* maxchild=[0-9]*|lmtpunix cmd=\"$(command -v valgrind) --tool=callgrind --callgrind-out-file=$f \1\" \2 prefork=1 maxchild=1|") || exit 1
        runs_made+=("$d")
        "$mailbench" lmtp --lmtp "$(srv_lmtp "$d")" -c 10 -n "$n" -m 2000 -q --timeout 300 \
            --json "$out/callgrind/mailbench.$n.json" > "$out/callgrind/mailbench.$n.txt" 2>&1
        srv_stop "$d" || exit 1
    done
    a=$(total "$out/callgrind/lmtpd.200.out") b=$(total "$out/callgrind/lmtpd.1200.out")
    echo "instructions per delivery (callgrind, (I(1200) - I(200)) / 1000): $(( (b - a) / 1000 ))"
fi

if has cpu; then
    hz=$(getconf CLK_TCK)
    for ((r = 1; r <= runs; r++)); do
        d=$(start "cpu$r") || exit 1
        runs_made+=("$d")
        sleep 1
        read -r u s < <(srv_cpu_ticks "$d"); t0=$((u + s))
        "$mailbench" lmtp --lmtp "$(srv_lmtp "$d")" -c 40 -n "$msgs" -m 2000 -q \
            --json "$out/cpu.$r.json" > "$out/cpu.$r.txt" 2>&1
        read -r u s < <(srv_cpu_ticks "$d"); t1=$((u + s))
        srv_stop "$d" || exit 1
        python3 - "$out/cpu.$r.json" "$((t1 - t0))" "$hz" "$msgs" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["server_cpu_us_per_msg"] = int(sys.argv[2]) * 1e6 / int(sys.argv[3]) / int(sys.argv[4])
json.dump(j, open(sys.argv[1], "w"))
PY
    done
    python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
js = [json.load(open("%s/cpu.%d.json" % (sys.argv[1], r))) for r in range(1, int(sys.argv[2]) + 1)]
print("msgs/s median %.0f (%s); server CPU per delivery median %.0f us (%s); errors %s" % (
    statistics.median(j["msgs_per_s"] for j in js), " ".join("%.0f" % j["msgs_per_s"] for j in js),
    statistics.median(j["server_cpu_us_per_msg"] for j in js),
    " ".join("%.0f" % j["server_cpu_us_per_msg"] for j in js), sum(j["error_total"] for j in js)))
PY
fi

for d in "${runs_made[@]}"; do rm -rf "$d"; done
exit 0
