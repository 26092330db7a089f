#!/usr/bin/env bash
# lmtpstorm.sh - lmtpd delivery throughput under a mail storm, measured
# with Postfix's load generator smtp-source speaking LMTP over the UNIX
# socket of a private master + lmtpd.  A benchmark, not a test (not run by
# `make check`).
#
#   tests/bench/lmtpstorm.sh [-n MSGS] [-l BYTES] [-c "CONC..."]
#                            [-m "MODE..."] [-r RUNS] [-1] [-k] [-S]
#                            [-b BUILDDIR] [-d DIR]
#
#   -n MSGS   messages per run (default 2000)
#   -l BYTES  smtp-source -l: payload bytes per message (default 13870;
#             smtp-source adds about 130 bytes of headers)
#   -c LIST   concurrent connections (smtp-source -s), default
#             "1 10 20 40 100"
#   -m LIST   spool_sync modes, default "group file off" (off is UNSAFE:
#             no sync at all; the ceiling the disk allows)
#   -r RUNS   runs per cell, the median is reported (default 3)
#   -1        every message to one mailbox (user.user) instead of one
#             mailbox per message (smtp-source -N: 1user, 2user, ...)
#   -k        one connection per message (smtp-source without -d); by
#             default each connection carries many messages, as an MTA's
#             connection cache does
#   -S        skip the extra run per cell that counts sync system calls
#   -b DIR    build directory (default $top_builddir, else ./build)
#   -d DIR    where the data goes (default $TEST_TMPDIR, else /var/tmp:
#             the real disk, never tmpfs)
#
# Every run gets a fresh copy of a spool with the recipients' mailboxes
# (made once with mbtool), its own imapd.conf (spool_sync MODE) and
# cyrus.conf (lmtpunix: prefork=10 maxchild=100), and its own master,
# stopped by PID afterwards.  The rate is stored messages (counted with
# mbtool list afterwards, which must equal MSGS) divided by the wall time
# of smtp-source.  Syncs per message: an extra, untimed run per cell with
# the master (and so every lmtpd) under `strace -f`, counting fsync,
# fdatasync and syncfs calls, each divided by the messages stored (the
# databases' own syncs -- mailbox list, duplicate and quota databases --
# are in these counts too).
#
# Output: a markdown table on stdout; progress on stderr.
set -euo pipefail

msgs=2000
bytes=13870
concs="1 10 20 40 100"
modes="group file off"
runs=3
spread=yes
keepalive=yes
count_syncs=yes
build=${top_builddir:-}
base=${TEST_TMPDIR:-/var/tmp}
prefork=10
maxchild=100

usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while getopts "n:l:c:m:r:1kSb:d:h" opt; do
    case $opt in
    n) msgs=$OPTARG ;;
    l) bytes=$OPTARG ;;
    c) concs=$OPTARG ;;
    m) modes=$OPTARG ;;
    r) runs=$OPTARG ;;
    1) spread=no ;;
    k) keepalive=no ;;
    S) count_syncs=no ;;
    b) build=$OPTARG ;;
    d) base=$OPTARG ;;
    *) usage ;;
    esac
done
[[ -n $build ]] || build=$(pwd)/build
build=$(cd "$build" && pwd)
master=$build/master/master
mbtool=$build/tools/mbtool
for p in "$master" "$build/lmtpd/lmtpd" "$mbtool"; do
    [[ -x $p ]] || { echo "lmtpstorm: missing $p (build first, or -b)" >&2; exit 1; }
done
command -v smtp-source >/dev/null || { echo "lmtpstorm: smtp-source not found (Debian package postfix)" >&2; exit 1; }
if [[ $count_syncs == yes ]] && ! command -v strace >/dev/null; then
    echo "lmtpstorm: strace not found: syncs not counted" >&2
    count_syncs=no
fi
for c in $concs; do
    if ((c > maxchild)); then
        echo "lmtpstorm: $c connections exceed maxchild=$maxchild" >&2; exit 2
    fi
done

# Started as root the master becomes cyrus_user: the data must be its.
run_as=()
owner=
if [[ $(id -u) -eq 0 ]]; then
    if id cyrus >/dev/null 2>&1; then
        owner=cyrus
        run_as=(setpriv --reuid=cyrus --regid="$(id -g cyrus)" --clear-groups)
    fi
fi

work=$(mktemp -d "$base/lmtpstorm.XXXXXX")
chmod 755 "$work"
master_pid=
tracer_pid=
cleanup() {
    if [[ -n $master_pid ]] && kill -0 "$master_pid" 2>/dev/null; then
        kill -TERM "$master_pid" 2>/dev/null || true
        sleep 1
        kill -KILL "$master_pid" 2>/dev/null || true
    fi
    if [[ -n $tracer_pid ]]; then wait "$tracer_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

write_conf() {   # DIR MODE
    local d=$1 mode=$2
    {
        echo "configdirectory: $d/conf"
        echo "partition-default: $d/spool"
        echo "servername: storm.example"
        echo "spool_sync: $mode"
        [[ $(id -u) -eq 0 && -z $owner ]] && echo "cyrus_user: root"
    } > "$d/imapd.conf"
    cat > "$d/cyrus.conf" <<EOF
SERVICES {
  lmtpunix cmd="lmtpd" listen="$d/lmtp.sock" prefork=$prefork maxchild=$maxchild
}
EOF
}

# The template spool: the recipients' mailboxes, made once.
template=$work/template
mkdir -p "$template/conf" "$template/spool"
write_conf "$template" group
[[ -n $owner ]] && chown -R "$owner" "$template"
if [[ $spread == yes ]]; then
    nbox=$msgs
    echo "lmtpstorm: creating $nbox mailboxes (1user..${nbox}user)..." >&2
    for ((i = 1; i <= nbox; i++)); do
        "${run_as[@]}" "$mbtool" -C "$template/imapd.conf" create "user.${i}user" >/dev/null
    done
else
    nbox=1
    "${run_as[@]}" "$mbtool" -C "$template/imapd.conf" create user.user >/dev/null
fi

# median and range of a list of numbers
stats() {
    printf '%s\n' "$@" | sort -g | awk '
        { v[NR] = $1 }
        END {
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.0f %.0f-%.0f\n", m, v[1], v[NR]
        }'
}

start_master() {   # DIR [strace-output]
    local d=$1 trace=${2:-}
    local cmd=("$master" -D -l -C "$d/imapd.conf" -M "$d/cyrus.conf"
               -p "$d/master.pid" -S "$build/lmtpd" -s "$d/master.status")
    if [[ -n $trace ]]; then
        strace -f -qq -e trace=fsync,fdatasync,syncfs -o "$trace" \
            "${cmd[@]}" >"$d/master.log" 2>&1 &
        tracer_pid=$!
    else
        "${cmd[@]}" >"$d/master.log" 2>&1 &
        tracer_pid=
    fi
    local i
    master_pid=
    for ((i = 0; i < 300; i++)); do
        if [[ -f $d/master.pid ]]; then master_pid=$(cat "$d/master.pid"); fi
        if [[ -n $master_pid && -f $d/master.status ]] &&
           awk -v n=$prefork '$1 == "service" { for (i = 2; i <= NF; i++)
                 if ($i ~ /^ready=/ && substr($i, 7) + 0 >= n) ok = 1 }
                 END { exit !ok }' "$d/master.status"; then
            return 0
        fi
        sleep 0.1
    done
    echo "lmtpstorm: master did not start; log:" >&2
    tail -20 "$d/master.log" >&2
    [[ -n $master_pid ]] && kill -TERM "$master_pid" 2>/dev/null
    exit 1
}

stop_master() {   # DIR
    local d=$1 i
    kill -TERM "$master_pid"
    for ((i = 0; i < 300; i++)); do
        kill -0 "$master_pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$master_pid" 2>/dev/null; then
        echo "lmtpstorm: master $master_pid did not stop; killed" >&2
        kill -KILL "$master_pid" 2>/dev/null || true
    fi
    if [[ -n $tracer_pid ]]; then wait "$tracer_pid" 2>/dev/null || true; fi
    wait 2>/dev/null || true
    master_pid=
    tracer_pid=
    if grep -E 'crashed signal=|exited status=<?[1-9]|AddressSanitizer' "$d/master.log" >&2; then
        echo "lmtpstorm: a worker failed (above)" >&2
        exit 1
    fi
}

stored() {   # DIR
    "${run_as[@]}" "$mbtool" -C "$1/imapd.conf" list | awk '
        { for (i = 1; i <= NF; i++) if ($i ~ /^messages=/) n += substr($i, 10) }
        END { print n + 0 }'
}

# one_run MODE CONC [strace-output]: sets run_rate and run_stored
run_rate=0
run_stored=0
one_run() {
    local mode=$1 conc=$2 trace=${3:-}
    local d=$work/run
    rm -rf "$d"
    cp -a "$template" "$d"
    write_conf "$d" "$mode"
    [[ -n $owner ]] && chown "$owner" "$d" "$d/imapd.conf" "$d/cyrus.conf"
    start_master "$d" "$trace"
    local opts=(-L -s "$conc" -m "$msgs" -l "$bytes" -f storm@example.org
                -t user@storm.example -M storm-client.example)
    [[ $keepalive == yes ]] && opts+=(-d)
    [[ $spread == yes ]] && opts+=(-N)
    local t0 t1
    t0=$(date +%s.%N)
    if ! smtp-source "${opts[@]}" "unix:$d/lmtp.sock" >"$d/smtp-source.out" 2>&1; then
        echo "lmtpstorm: smtp-source failed:" >&2
        tail -5 "$d/smtp-source.out" >&2
        stop_master "$d"
        exit 1
    fi
    t1=$(date +%s.%N)
    stop_master "$d"
    run_stored=$(stored "$d")
    if [[ $run_stored -ne $msgs ]]; then
        echo "lmtpstorm: $mode/$conc: $run_stored of $msgs messages stored" >&2
    fi
    run_rate=$(awk -v n="$run_stored" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", n / (b - a) }')
    rm -rf "$d"
}

# syncs_per_msg MODE CONC: sets sync_f, sync_d, sync_fs: fsync, fdatasync
# and syncfs calls per stored message
sync_f=- sync_d=- sync_fs=-
syncs_per_msg() {
    local out=$work/strace.out
    rm -f "$out"
    one_run "$1" "$2" "$out"
    local per
    per() {
        local n
        n=$(grep -v resumed "$out" | grep -cE "(^|[^a-z_])$1\\(" || true)
        awk -v a="$n" -v n="$run_stored" 'BEGIN { if (n > 0) printf "%.2f", a / n; else print "-" }'
    }
    sync_f=$(per fsync)
    sync_d=$(per fdatasync)
    sync_fs=$(per syncfs)
    rm -f "$out"
}

fs=$(stat -f -c %T "$work")
echo "lmtpstorm: $msgs messages of $bytes payload bytes per run, $runs runs per cell," \
     "data in $work ($fs), $(nproc) CPUs, $(uname -r)" >&2

echo "| spool_sync | connections | msgs/s (median of $runs) | range | fsync/msg | fdatasync/msg | syncfs/msg |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for mode in $modes; do
    for conc in $concs; do
        rates=()
        for ((r = 1; r <= runs; r++)); do
            one_run "$mode" "$conc"
            rates+=("$run_rate")
            echo "lmtpstorm: $mode conc=$conc run $r: $run_rate msgs/s" >&2
        done
        read -r med range < <(stats "${rates[@]}")
        sync_f=- sync_d=- sync_fs=-
        [[ $count_syncs == yes ]] && syncs_per_msg "$mode" "$conc"
        echo "| $mode | $conc | $med | $range | $sync_f | $sync_d | $sync_fs |"
    done
done
echo
echo "$msgs messages per run ($bytes-byte payload, smtp-source -L$([[ $keepalive == yes ]] && echo ' -d')$([[ $spread == yes ]] && echo ' -N, one mailbox per message' || echo ', one mailbox')), lmtpunix prefork=$prefork maxchild=$maxchild, $fs at $base, $(nproc) CPUs."
