#!/bin/sh
# test_package.sh - the Debian package installs, runs, is removed and
# purged as debian/ promises, in a throwaway root:
#   - the package is built from this tree's distribution files
#     (make distdir, then dpkg-buildpackage -us -uc -b), or taken from
#     CYRUSDELIVER_DEB=/path/cyrusdeliver_*.deb;
#   - the throwaway root is an overlay on / in a private mount and network
#     namespace (unshare -m -n): every write (dpkg's database, /etc, /usr,
#     /var) goes to a tmpfs that vanishes with the namespace, so the host's
#     packages, users and files are never touched, and nothing the test
#     installs stays installed;
#   - in it, with the user cyrus deleted first (in the throwaway root
#     only), `apt-get install ./cyrusdeliver_*.deb` creates the system
#     user cyrus (group mail, home /var/lib/cyrusdeliver, in group sasl),
#     /var/lib/cyrusdeliver and /var/spool/cyrusdeliver (cyrus:mail 0750),
#     the conffiles /etc/cyrusdeliver/{imapd,cyrus}.conf naming /var/lib and
#     /var/spool, and starts nothing (no systemd running: no master, no
#     socket);
#   - `systemd-analyze verify` passes on the installed unit;
#   - the installed master on the installed configuration, started as the
#     unit starts it (in the private network namespace: port 143 is
#     the namespace's own), takes a message over LMTP on
#     /run/cyrusdeliver/lmtp, survives SIGHUP and drains on SIGTERM;
#   - `apt-get remove` keeps configuration, databases and mail;
#     `apt-get purge` removes /etc/cyrusdeliver and keeps the mail, the
#     databases and the user;
#   - with systemd pretended to run (/run/systemd/system and a systemctl
#     that records its calls) and a policy-rc.d that denies (101), as in
#     a package build chroot, the install starts nothing; without the
#     policy-rc.d, deb-systemd-invoke does ask systemctl to start it (the
#     check can fail).
# Runs only with CYRUSDELIVER_PACKAGE_TEST=1, as root, with unshare,
# overlayfs and dpkg-buildpackage (or CYRUSDELIVER_DEB); else skipped
# (exit 77).  About 3 minutes, most of it the package build.
# Exit 0 pass, 1 fail.
set -u

: "${top_builddir:?top_builddir must be set}"
: "${top_srcdir:?top_srcdir must be set}"

skip() { echo "SKIP: $1"; exit 77; }
[ "${CYRUSDELIVER_PACKAGE_TEST:-}" = 1 ] ||
    skip "set CYRUSDELIVER_PACKAGE_TEST=1 to build the package and install it in a throwaway root"
[ "$(id -u)" -eq 0 ] || skip "needs root (mount namespace, overlay, chroot)"
for c in unshare chroot dpkg apt-get; do
    command -v $c >/dev/null 2>&1 || skip "$c not found"
done
if [ -z "${CYRUSDELIVER_DEB:-}" ]; then
    command -v dpkg-buildpackage >/dev/null 2>&1 ||
        skip "dpkg-buildpackage not found (scripts/deps.sh --package)"
fi
unshare -m -n --propagation private sh -c '
    d=$(mktemp -d) && mount -t tmpfs tmpfs "$d" &&
    mkdir "$d/u" "$d/w" "$d/m" &&
    mount -t overlay overlay -o lowerdir=/,upperdir="$d/u",workdir="$d/w" "$d/m"
    rc=$?; umount -l "$d" 2>/dev/null; rmdir "$d"; exit $rc' 2>/dev/null ||
    skip "no private mount and network namespace with an overlay on / here"

base=${TEST_TMPDIR:-$top_builddir/tests/tmp}
mkdir -p "$base" || exit 1
tmp=$(mktemp -d "$base/package.XXXXXX") || exit 1
chmod 755 "$tmp"
cleanup() { [ -n "${KEEP:-}" ] || rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
unset MAKEFLAGS MFLAGS MAKELEVEL

# the host's state, compared at the end
host_state() {
    dpkg-query -W -f='${Status}\n' cyrusdeliver 2>/dev/null || echo "not known to dpkg"
    getent passwd cyrus || echo "no user cyrus"
    ls -ld /etc/cyrusdeliver /var/lib/cyrusdeliver /var/spool/cyrusdeliver 2>&1
}
host_state > "$tmp/host.before"

# 1. the package
if [ -n "${CYRUSDELIVER_DEB:-}" ]; then
    deb=$CYRUSDELIVER_DEB
else
    mkdir "$tmp/src"
    if ! make -s --no-print-directory -C "$top_builddir" distdir \
            distdir="$tmp/src/cyrusdeliver" > "$tmp/distdir.log" 2>&1; then
        echo "not ok - make distdir: $(tail -20 "$tmp/distdir.log")"
        exit 1
    fi
    if ! (cd "$tmp/src/cyrusdeliver" && dpkg-buildpackage -us -uc -b) \
            > "$tmp/build.log" 2>&1; then
        echo "not ok - dpkg-buildpackage: $(tail -30 "$tmp/build.log")"
        exit 1
    fi
    deb=$(ls "$tmp"/src/cyrusdeliver_*_*.deb 2>/dev/null | head -1)
fi
if ! [ -f "$deb" ]; then
    echo "not ok - no package: '$deb'"
    exit 1
fi
echo "# package: $deb"

# 2. the throwaway root and the checks in it
mkdir "$tmp/pkgtest"
cp "$deb" "$tmp/pkgtest/"
cat > "$tmp/pkgtest/inroot.sh" <<'INROOT'
set -u
pass=0 fail=0
ok()  { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; }
T=/root/pkgtest
deb=$(ls $T/cyrusdeliver_*.deb)
export DEBIAN_FRONTEND=noninteractive
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
apt() { apt-get -y -q -o Dpkg::Use-Pty=0 "$@"; }
mpid=

# the starting point: no cyrusdeliver, no user cyrus (a Cyrus package's
# user, if any, is deleted here, in the throwaway root only)
apt purge cyrusdeliver > $T/prepurge.log 2>&1
if getent passwd cyrus >/dev/null; then
    # (Cyrus's package registers its directories for cyrus in dpkg's
    # statoverride file, which dpkg refuses to read without the user)
    dpkg-statoverride --list | awk '$1 == "cyrus" { print $4 }' |
        while read -r p; do dpkg-statoverride --remove "$p"; done
    userdel cyrus
fi
getent passwd cyrus >/dev/null && bad "user cyrus could not be deleted"
[ -d /run/systemd/system ] && bad "/run/systemd/system exists: systemd would be asked to start"

# A: install
if apt install "$deb" > $T/install.log 2>&1; then
    ok "apt-get install ./$(basename "$deb")"
else
    bad "apt-get install: $(tail -20 $T/install.log)"
fi
pw=$(getent passwd cyrus)
mailgid=$(getent group mail | cut -d: -f3)
uid=$(echo "$pw" | cut -d: -f3)
if [ -n "$pw" ] && [ "$(echo "$pw" | cut -d: -f4)" = "$mailgid" ] &&
   [ "$uid" -lt 1000 ] && [ "$(echo "$pw" | cut -d: -f6)" = /var/lib/cyrusdeliver ]; then
    ok "system user created: $pw"
else
    bad "user cyrus: '$pw' (mail gid $mailgid)"
fi
if ! getent group sasl >/dev/null || id -nG cyrus | grep -qw sasl; then
    ok "cyrus in group sasl: $(id cyrus)"
else
    bad "cyrus not in group sasl: $(id cyrus)"
fi
for d in /var/lib/cyrusdeliver /var/spool/cyrusdeliver; do
    m=$(stat -c '%U:%G %a' $d 2>&1)
    [ "$m" = "cyrus:mail 750" ] && ok "$d $m" || bad "$d: $m"
done
conff=$(dpkg-query -W -f='${Conffiles}' cyrusdeliver)
if echo "$conff" | grep -q '/etc/cyrusdeliver/imapd.conf' &&
   echo "$conff" | grep -q '/etc/cyrusdeliver/cyrus.conf' &&
   grep -qx 'configdirectory: /var/lib/cyrusdeliver' /etc/cyrusdeliver/imapd.conf &&
   grep -qx 'partition-default: /var/spool/cyrusdeliver' /etc/cyrusdeliver/imapd.conf; then
    ok "conffiles /etc/cyrusdeliver/imapd.conf, cyrus.conf (/var/lib, /var/spool)"
else
    bad "conffiles: $conff"
fi
defcd=$(cyr_info -C /dev/null conf-all 2>&1 | sed -n 's/^configdirectory: //p')
[ "$defcd" = /var/lib/cyrusdeliver ] && ok "compiled-in configdirectory $defcd" ||
    bad "compiled-in configdirectory: '$defcd'"
if pgrep -f '^/usr/sbin/master' >/dev/null || [ -e /run/cyrusdeliver/lmtp ]; then
    bad "something was started: $(pgrep -af '^/usr/sbin/master') $(ls -l /run/cyrusdeliver 2>&1)"
else
    ok "nothing started (no systemd running)"
fi
if command -v systemd-analyze >/dev/null; then
    if systemd-analyze verify /lib/systemd/system/cyrusdeliver.service > $T/verify.log 2>&1; then
        ok "systemd-analyze verify cyrusdeliver.service"
    else
        bad "systemd-analyze verify: $(cat $T/verify.log)"
    fi
else
    echo "ok - # SKIP systemd-analyze not installed"
fi
if cyr_info -C /etc/cyrusdeliver/imapd.conf -M /etc/cyrusdeliver/cyrus.conf conf-lint \
        > $T/lint.log 2>&1; then
    ok "cyr_info conf-lint on the installed configuration"
else
    bad "conf-lint: $(cat $T/lint.log)"
fi

# the installed master as the unit starts it (RuntimeDirectory made here)
ip link set lo up 2>/dev/null
install -d -m 0755 /run/cyrusdeliver
mbtool -C /etc/cyrusdeliver/imapd.conf create user.pkgtest > $T/mbtool.log 2>&1 ||
    bad "mbtool create: $(cat $T/mbtool.log)"
echo 'metrics_listen: 127.0.0.1:9105' >> /etc/cyrusdeliver/imapd.conf
/usr/sbin/master -D -l -C /etc/cyrusdeliver/imapd.conf -M /etc/cyrusdeliver/cyrus.conf \
    -p /run/cyrusdeliver/master.pid -T 60 > $T/master.log 2>&1 &
mpid=$!
i=0
while [ $i -lt 600 ] && ! [ -S /run/cyrusdeliver/lmtp ]; do
    kill -0 $mpid 2>/dev/null || break
    sleep 0.1; i=$((i + 1))
done
python3 - <<'PY' > $T/lmtp.out 2>&1
import smtplib
with smtplib.LMTP("/run/cyrusdeliver/lmtp") as c:
    c.sendmail("a@example.org", ["pkgtest@example.org"],
               b"From: a@example.org\r\nSubject: package\r\n\r\nbody\r\n")
print("sent")
PY
if grep -q '^sent' $T/lmtp.out &&
   mbtool -C /etc/cyrusdeliver/imapd.conf info user.pkgtest 2>/dev/null | grep -q '^messages: 1$'; then
    ok "installed master: a message over /run/cyrusdeliver/lmtp is in user.pkgtest"
else
    bad "delivery: $(cat $T/lmtp.out) $(tail -20 $T/master.log)"
fi
python3 - <<'PY' > $T/metrics.out 2>&1
import time, urllib.request
end = time.time() + 60
while True:
    try:
        body = urllib.request.urlopen("http://127.0.0.1:9105/metrics", timeout=5).read().decode()
        break
    except OSError:
        if time.time() > end:
            raise
        time.sleep(0.2)
print("\n".join(l for l in body.splitlines() if l.startswith("cyrusdeliver_") and "lmtp" in l)[:2000])
PY
if grep -q '^cyrusdeliver_' $T/metrics.out; then
    ok "metrics_listen: metricsd serves /metrics ($(grep -c '^cyrusdeliver_' $T/metrics.out) lmtp lines)"
else
    bad "metrics: $(tail -5 $T/metrics.out)"
fi
install -d -o cyrus -g mail -m 0750 /var/spool/cyrusdeliver-backup
if cyr_hotbackup -C /etc/cyrusdeliver/imapd.conf /var/spool/cyrusdeliver-backup/b1 \
        > $T/backup.log 2>&1 &&
   [ "$(find /var/spool/cyrusdeliver-backup/b1 -type f -name '*.' | wc -l)" -ge 1 ]; then
    ok "cyr_hotbackup into /var/spool/cyrusdeliver-backup/b1 while the master runs"
else
    bad "cyr_hotbackup: $(tail -5 $T/backup.log)"
fi
rm -rf /var/spool/cyrusdeliver-backup
kill -HUP $mpid 2>/dev/null; sleep 1
kill -0 $mpid 2>/dev/null && ok "master alive after SIGHUP" || bad "master died on SIGHUP: $(tail $T/master.log)"
kill $mpid 2>/dev/null
i=0
while kill -0 $mpid 2>/dev/null && [ $i -lt 900 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 $mpid 2>/dev/null; then
    bad "master still running 90 s after SIGTERM"; kill -9 $mpid
else
    ok "master drained and stopped on SIGTERM"
fi
mpid=
msgs=$(find /var/spool/cyrusdeliver -type f -name '*.' | wc -l)

# remove keeps everything but the programs
if apt remove cyrusdeliver > $T/remove.log 2>&1 &&
   [ "$(dpkg-query -W -f='${Status}' cyrusdeliver)" = "deinstall ok config-files" ] &&
   ! [ -e /usr/sbin/master ] && [ -f /etc/cyrusdeliver/imapd.conf ] &&
   [ -f /var/lib/cyrusdeliver/mailboxes.db ] &&
   [ "$(find /var/spool/cyrusdeliver -type f -name '*.' | wc -l)" -eq "$msgs" ] && [ "$msgs" -ge 1 ]; then
    ok "remove: programs gone; configuration, databases and $msgs message file(s) kept"
else
    bad "remove: $(tail -5 $T/remove.log) $(ls -R /etc/cyrusdeliver /var/lib/cyrusdeliver 2>&1 | head)"
fi
if apt purge cyrusdeliver > $T/purge.log 2>&1 &&
   ! dpkg-query -W -f='${Status}' cyrusdeliver 2>/dev/null | grep -q installed &&
   ! [ -e /etc/cyrusdeliver ] && [ -f /var/lib/cyrusdeliver/mailboxes.db ] &&
   [ "$(find /var/spool/cyrusdeliver -type f -name '*.' | wc -l)" -eq "$msgs" ] &&
   getent passwd cyrus >/dev/null &&
   grep -q 'purge keeps /var/spool/cyrusdeliver' $T/purge.log; then
    ok "purge: /etc/cyrusdeliver gone; mail, databases and user cyrus kept, and it says so"
else
    bad "purge: $(tail -5 $T/purge.log) $(ls -ld /etc/cyrusdeliver /var/lib/cyrusdeliver 2>&1)"
fi
rm -rf /var/lib/cyrusdeliver /var/spool/cyrusdeliver

# B: as in a build chroot where systemd seems to run (/run/systemd/system,
# and a systemctl that records its calls): a policy-rc.d that says 101
# keeps the install from starting the unit; without it, the same install
# asks systemctl to start it (so the first check can fail)
mkdir -p /run/systemd/system
mv /usr/bin/systemctl /usr/bin/systemctl.real
cat > /usr/bin/systemctl <<'SH'
#!/bin/sh
echo "$*" >> /root/pkgtest/systemctl.calls
case " $* " in
*" is-enabled "*) echo enabled ;;
*" is-active "*) exit 3 ;;
esac
exit 0
SH
chmod 755 /usr/bin/systemctl
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
chmod 755 /usr/sbin/policy-rc.d
: > $T/systemctl.calls
apt install "$deb" > $T/install-policy.log 2>&1 || bad "install with policy-rc.d: $(tail $T/install-policy.log)"
cp $T/systemctl.calls $T/systemctl-policy.calls
if grep -q 'policy-rc.d returned 101' $T/install-policy.log &&
   grep -q 'daemon-reload' $T/systemctl.calls &&
   ! grep -Eq '(^| )(start|restart)( |$)' $T/systemctl.calls &&
   ! pgrep -f '^/usr/sbin/master' >/dev/null; then
    ok "policy-rc.d 101: the install starts nothing (systemctl calls: $(tr '\n' ';' < $T/systemctl.calls))"
else
    bad "policy-rc.d: $(grep -i policy $T/install-policy.log) calls: $(cat $T/systemctl.calls)"
fi
apt purge cyrusdeliver > $T/purge-policy.log 2>&1
rm -f /usr/sbin/policy-rc.d
: > $T/systemctl.calls
apt install "$deb" > $T/install-nopolicy.log 2>&1 || bad "install without policy-rc.d: $(tail $T/install-nopolicy.log)"
cp $T/systemctl.calls $T/systemctl-nopolicy.calls
if grep -Eq 'start cyrusdeliver.service' $T/systemctl.calls; then
    ok "without policy-rc.d the install asks systemctl to start the unit ($(grep start $T/systemctl.calls))"
else
    bad "without policy-rc.d no start was asked: $(cat $T/systemctl.calls)"
fi
apt purge cyrusdeliver > $T/purge-empty.log 2>&1
mv /usr/bin/systemctl.real /usr/bin/systemctl
rmdir /run/systemd/system
if ! [ -e /etc/cyrusdeliver ] && ! [ -e /var/lib/cyrusdeliver ] && ! [ -e /var/spool/cyrusdeliver ]; then
    ok "purge of an installation without mail removes its directories"
else
    bad "purge (no mail): $(ls -ld /etc/cyrusdeliver /var/lib/cyrusdeliver /var/spool/cyrusdeliver 2>&1)"
fi

echo "$pass passed, $fail failed (in the throwaway root)"
[ $fail -eq 0 ]
INROOT

unshare -m -n --propagation private sh -c '
    set -e
    t=$1
    mkdir "$t/ov"
    mount -t tmpfs -o size=2g tmpfs "$t/ov"
    mkdir "$t/ov/u" "$t/ov/w" "$t/ov/root"
    mount -t overlay overlay -o lowerdir=/,upperdir="$t/ov/u",workdir="$t/ov/w" "$t/ov/root"
    r=$t/ov/root
    mount --rbind /dev "$r/dev"
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount -t tmpfs tmpfs "$r/tmp"
    mkdir -p "$r/root/pkgtest"
    cp "$t"/pkgtest/* "$r/root/pkgtest/"
    set +e
    chroot "$r" /bin/sh /root/pkgtest/inroot.sh
    rc=$?
    cp -r "$r/root/pkgtest" "$t/logs" 2>/dev/null
    exit $rc' sh "$tmp" > "$tmp/inroot.out" 2>&1
rc=$?
cat "$tmp/inroot.out"

# 3. the host is as it was
host_state > "$tmp/host.after"
if cmp -s "$tmp/host.before" "$tmp/host.after"; then
    echo "ok - the host's package database, user cyrus and directories are unchanged"
else
    echo "not ok - the host changed: $(diff "$tmp/host.before" "$tmp/host.after")"
    rc=1
fi
[ $rc -eq 0 ] && grep -q ' passed, 0 failed' "$tmp/inroot.out"
