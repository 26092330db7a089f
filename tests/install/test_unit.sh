#!/bin/sh
# test_unit.sh - the package's systemd unit (debian/cyrusdeliver.service):
#   - `systemd-analyze verify` accepts it without a word (ExecStart pointed
#     at this build's master, the Documentation= pages at man/);
#   - reload is SIGHUP to the master; stop is SIGTERM to the master alone
#     (KillMode=mixed) with TimeoutStopSec longer than the master's drain
#     (-T), so the drain is not cut short;
#   - the hardened file system leaves writable what the package's
#     configuration writes: configdirectory and partition-default of
#     doc/examples/imapd.conf in ReadWritePaths, the master's pid file and
#     cyrus.conf's UNIX sockets under the RuntimeDirectory;
#   - `systemd-analyze security` prints its exposure score (reported,
#     not judged).
# Skipped (exit 77) where systemd-analyze is not installed (package
# systemd).  Needs no root and no running systemd.  Exit 0 pass, 1 fail.
set -u

: "${top_builddir:?top_builddir must be set}"
: "${top_srcdir:?top_srcdir must be set}"
UNIT="$top_srcdir/debian/cyrusdeliver.service"
EX="$top_srcdir/doc/examples"

command -v systemd-analyze >/dev/null 2>&1 ||
    { echo "SKIP: systemd-analyze not found (package systemd)"; exit 77; }

pass=0 fail=0
ok()  { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; }

base=${TEST_TMPDIR:-$top_builddir/tests/tmp}
mkdir -p "$base" || exit 1
tmp=$(mktemp -d "$base/unit.XXXXXX") || exit 1
chmod 755 "$tmp"
cleanup() { [ -n "${KEEP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# the value of KEY in the unit (the last one given)
key() { sed -n "s/^$1=//p" "$UNIT" | tail -1; }

# 1. systemd-analyze verify, silent
mkdir -p "$tmp/man/man8"
for p in "$top_srcdir"/man/*.8; do ln -s "$p" "$tmp/man/man8/"; done
sed "s|^ExecStart=/usr/sbin/master |ExecStart=$top_builddir/master/master |" \
    "$UNIT" > "$tmp/cyrusdeliver.service"
grep -q "^ExecStart=$top_builddir/master/master " "$tmp/cyrusdeliver.service" ||
    bad "ExecStart is not /usr/sbin/master: $(key ExecStart)"
if (cd "$tmp" && MANPATH="$tmp/man" systemd-analyze verify ./cyrusdeliver.service) \
        > "$tmp/verify.log" 2>&1 && ! [ -s "$tmp/verify.log" ]; then
    ok "systemd-analyze verify: no complaint"
else
    bad "systemd-analyze verify: $(cat "$tmp/verify.log")"
fi

# 2. reload and stop
[ "$(key Type)" = notify ] && ok "Type=notify" || bad "Type=$(key Type)"
case "$(key ExecReload)" in
*kill\ -HUP\ \$MAINPID) ok "ExecReload sends SIGHUP to the master" ;;
*) bad "ExecReload=$(key ExecReload)" ;;
esac
drain=$(key ExecStart | sed -n 's/.* -T \([0-9][0-9]*\).*/\1/p')
tstop=$(key TimeoutStopSec)
if [ "$(key KillMode)" = mixed ] && [ "$(key KillSignal)" = SIGTERM ] &&
   [ -n "$drain" ] && [ -n "$tstop" ] && [ "$tstop" -gt "$drain" ]; then
    ok "stop: SIGTERM to the master, TimeoutStopSec=$tstop > drain -T $drain"
else
    bad "stop: KillMode=$(key KillMode) KillSignal=$(key KillSignal) TimeoutStopSec=$tstop -T '$drain'"
fi

# 3. what the package's configuration writes is writable
rw=" $(key ReadWritePaths) "
rt=/run/$(key RuntimeDirectory)
[ "$(key ProtectSystem)" = strict ] && ok "ProtectSystem=strict" ||
    bad "ProtectSystem=$(key ProtectSystem)"
for k in configdirectory partition-default; do
    d=$(sed -n "s/^$k: *//p" "$EX/imapd.conf")
    case "$rw" in
    *" $d "*) ok "$k $d in ReadWritePaths" ;;
    *) bad "$k '$d' not in ReadWritePaths=$rw" ;;
    esac
done
pid=$(key ExecStart | sed -n 's/.* -p \([^ ]*\).*/\1/p')
case "$pid" in "$rt"/*) ok "pid file $pid in RuntimeDirectory $rt" ;;
*) bad "pid file '$pid' outside RuntimeDirectory $rt" ;; esac
socks=$(sed -n 's/.*listen="\(\/[^"]*\)".*/\1/p' "$EX/cyrus.conf")
[ -n "$socks" ] || bad "no UNIX socket in the sample cyrus.conf"
for s in $socks; do
    case "$s" in "$rt"/*) ok "socket $s in RuntimeDirectory" ;;
    *) bad "socket $s outside RuntimeDirectory $rt" ;; esac
done

# 4. the exposure score, for the record
if (cd "$tmp" && systemd-analyze security --offline=yes ./cyrusdeliver.service) \
        > "$tmp/security.log" 2>&1; then
    echo "# $(grep 'Overall exposure' "$tmp/security.log")"
else
    echo "# systemd-analyze security --offline: $(tail -1 "$tmp/security.log")"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
