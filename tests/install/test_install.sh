#!/bin/sh
# test_install.sh - `make install DESTDIR=...` puts each program where it
# belongs and the installed programs work from there:
#   - sbin: master and the admin tools; pkglibexecdir: lmtpd, imapd,
#     timsieved;
#     bin: the load and bench tools; man8: every page; nothing else in
#     bin or sbin;
#   - the installed master names the compiled-in pkglibexecdir as the
#     place it looks for workers (-h);
#   - the installed master, started from DESTDIR on the sample
#     configuration (bare "lmtpd" in cyrus.conf, -S the installed
#     pkglibexecdir), runs the installed lmtpd and a message delivered
#     over LMTP is in the mailbox;
#   - as root, with the DESTDIR tree mounted on the prefix in a private
#     mount namespace, the installed master without -S runs lmtpd from
#     the compiled-in pkglibexecdir;
#   - `make uninstall DESTDIR=...` leaves no file behind.
# Needs no root.  Exit 0 pass, 1 fail.
set -u

: "${top_builddir:?top_builddir must be set}"
: "${top_srcdir:?top_srcdir must be set}"
EX="$top_srcdir/doc/examples"

pass=0 fail=0
ok()  { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; }

base=${TEST_TMPDIR:-$top_builddir/tests/tmp}
mkdir -p "$base" || exit 1
tmp=$(mktemp -d "$base/install.XXXXXX") || exit 1
chmod 755 "$tmp"
dest="$tmp/dest"
mpid=
cleanup() {
    if [ -n "$mpid" ] && kill -0 "$mpid" 2>/dev/null; then
        kill "$mpid"
        i=0
        while kill -0 "$mpid" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$mpid" 2>/dev/null
    fi
    [ -n "${KEEP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# the nested makes are makes of their own (no jobserver, no -w of ours)
unset MAKEFLAGS MFLAGS MAKELEVEL

# an installation directory as this build's Makefile has it
makevar() {
    printf 'print-var:\n\t@echo $(%s)\n' "$1" |
        make -s --no-print-directory -C "$top_builddir" -f Makefile -f - print-var
}
bindir=$(makevar bindir)
sbindir=$(makevar sbindir)
libexec=$(makevar pkglibexecdir)
man8dir=$(makevar man8dir)
case "$bindir:$sbindir:$libexec:$man8dir" in
/*:/*:/*:/*) ;;
*) bad "installation directories from the Makefile: '$bindir' '$sbindir' '$libexec' '$man8dir'"
   echo "$pass passed, $fail failed"; exit 1 ;;
esac

# 1. the layout
if make -s --no-print-directory -C "$top_builddir" install DESTDIR="$dest" \
        > "$tmp/install.log" 2>&1; then
    ok "make install DESTDIR"
else
    bad "make install DESTDIR: $(tail -20 "$tmp/install.log")"
fi
layout_ok=yes
for f in "$sbindir/master" "$sbindir/mbtool" "$sbindir/cyr_dbtool" \
         "$sbindir/cvt_cyrusdb" "$sbindir/ctl_cyrusdb" "$sbindir/cyr_info" \
         "$sbindir/masterstatus" "$sbindir/cyr_hotbackup" "$sbindir/cyr_expire" \
         "$sbindir/sievec" "$sbindir/cyr_user" \
         "$libexec/lmtpd" "$libexec/imapd" "$libexec/metricsd" \
         "$libexec/timsieved" \
         "$bindir/mailbench" "$bindir/dbbench" "$bindir/appendbench" \
         "$bindir/disksync"; do
    if ! [ -f "$dest$f" ] || ! [ -x "$dest$f" ]; then
        bad "not installed (executable): $f"
        layout_ok=no
    fi
done
for page in "$top_srcdir"/man/*.8; do
    name=$(basename "$page")
    if ! [ -f "$dest$man8dir/$name" ]; then
        bad "man page not installed: $man8dir/$name"
        layout_ok=no
    fi
done
# nothing more in bin and sbin than the above, no worker there
nbin=$(ls "$dest$bindir" 2>/dev/null | wc -l)
nsbin=$(ls "$dest$sbindir" 2>/dev/null | wc -l)
if [ "$nbin" -ne 4 ] || [ "$nsbin" -ne 11 ]; then
    bad "bin has $nbin files (4 expected), sbin $nsbin (11 expected): $(ls "$dest$bindir" "$dest$sbindir" 2>&1 | tr '\n' ' ')"
    layout_ok=no
fi
[ $layout_ok = yes ] && ok "layout: sbin, $libexec, bin, man8"

# 2. the master knows where the workers are installed
if "$dest$sbindir/master" -h 2>&1 | grep -qF "$libexec"; then
    ok "master -h names $libexec"
else
    bad "master -h does not name $libexec: $("$dest$sbindir/master" -h 2>&1)"
fi

# 2b. every program's default configuration is SYSCONFDIR/cyrusdeliver/,
# never Cyrus's /etc/imapd.conf
sysconfdir=$(makevar sysconfdir)
for p in "$sbindir/master" "$sbindir/mbtool" "$sbindir/cyr_info" "$sbindir/ctl_cyrusdb"; do
    if "$dest$p" -h 2>&1 | grep -qF "$sysconfdir/cyrusdeliver/imapd.conf"; then
        ok "$(basename "$p") -h names $sysconfdir/cyrusdeliver/imapd.conf"
    else
        bad "$(basename "$p") -h does not name $sysconfdir/cyrusdeliver/imapd.conf: $("$dest$p" -h 2>&1 | head -5)"
    fi
done

# 2c. the default configdirectory follows configure's localstatedir
# (LOCALSTATEDIR/lib/cyrusdeliver; /var/lib/cyrusdeliver in the package),
# and so does the partition cyr_info suggests when none is set.  Only a
# build whose localstatedir is not /var can tell a compiled-in
# localstatedir from a hard-coded /var: ./configure's default
# (PREFIX/var) and make distcheck's are not /var.
localstatedir=$(makevar localstatedir)
defcd=$("$dest$sbindir/cyr_info" -C /dev/null conf-all 2>&1 |
        sed -n 's/^configdirectory: //p')
if [ "$defcd" = "$localstatedir/lib/cyrusdeliver" ]; then
    ok "default configdirectory is $localstatedir/lib/cyrusdeliver"
else
    bad "default configdirectory is '$defcd', not $localstatedir/lib/cyrusdeliver"
fi
: > "$tmp/empty.conf"
if "$dest$sbindir/cyr_info" -C "$tmp/empty.conf" -M /dev/null conf-lint 2>&1 |
        grep -qF "partition-default: $localstatedir/spool/cyrusdeliver"; then
    ok "conf-lint suggests partition-default: $localstatedir/spool/cyrusdeliver"
else
    bad "conf-lint without a partition: $("$dest$sbindir/cyr_info" -C "$tmp/empty.conf" -M /dev/null conf-lint 2>&1 | head -5)"
fi
[ "$localstatedir" != /var ] ||
    echo "ok - # SKIP localstatedir is /var: a hard-coded /var would pass too"

# 3. the installed master runs the installed lmtpd for a bare "lmtpd"
mkdir -p "$tmp/lib" "$tmp/spool" "$tmp/run"
sed -e "s|/var/lib/cyrusdeliver|$tmp/lib|g" -e "s|/var/spool/cyrusdeliver|$tmp/spool|g" \
    "$EX/imapd.conf" > "$tmp/imapd.conf"
printf 'sasl_sasldb_path: %s/sasldb2\n' "$tmp" >> "$tmp/imapd.conf"
if [ "$(id -u)" -eq 0 ]; then
    if id cyrus >/dev/null 2>&1; then
        chown -R cyrus "$tmp/lib" "$tmp/spool" "$tmp/run"
    else
        echo "cyrus_user: root" >> "$tmp/imapd.conf"
    fi
else
    echo "cyrus_user: $(id -un)" >> "$tmp/imapd.conf"
fi
# LMTP on a UNIX socket only: no port taken (the IMAP and ManageSieve
# services of the sample listen on every address, so they go)
sed -e "s|/run/cyrusdeliver|$tmp/run|g" -e '/cmd="imapd/d' \
    -e '/cmd="timsieved/d' "$EX/cyrus.conf" > "$tmp/cyrus.conf"
grep -q 'listen="[a-z]' "$tmp/cyrus.conf" &&
    bad "the trimmed sample cyrus.conf still listens on a network port"
grep -q 'cmd="lmtpd"' "$tmp/cyrus.conf" || bad "the sample cyrus.conf has no bare lmtpd"
# PATH without the build tree: the worker can only come from -S
PATH=/usr/bin:/bin "$dest$sbindir/master" -D -l -C "$tmp/imapd.conf" -M "$tmp/cyrus.conf" \
    -S "$dest$libexec" -p "$tmp/master.pid" -s "$tmp/master.status" \
    > "$tmp/master.log" 2>&1 &
mpid=$!
i=0
while [ $i -lt 600 ] && ! [ -S "$tmp/run/lmtp" -a -s "$tmp/master.status" ]; do
    kill -0 "$mpid" 2>/dev/null || break
    sleep 0.1; i=$((i + 1))
done
if [ -S "$tmp/run/lmtp" ] && grep -qF "runs=<$dest$libexec/lmtpd " "$tmp/master.log"; then
    ok "installed master up, lmtpd from $libexec"
else
    bad "installed master: $(tail -20 "$tmp/master.log")"
fi
"$dest$sbindir/mbtool" -C "$tmp/imapd.conf" create user.inst >/dev/null 2>&1
python3 - "$tmp/run/lmtp" <<'PY' > "$tmp/lmtp.out" 2>&1
import smtplib, sys
with smtplib.LMTP(sys.argv[1]) as c:
    c.ehlo_or_helo_if_needed()
    c.sendmail("a@example.org", ["inst@example.org"],
               b"From: a@example.org\r\nSubject: installed\r\n\r\nbody\r\n")
print("sent")
PY
if grep -q '^sent' "$tmp/lmtp.out" &&
   "$dest$sbindir/mbtool" -C "$tmp/imapd.conf" info user.inst 2>/dev/null | grep -q '^messages: 1$'; then
    ok "a delivery through the installed lmtpd is in the mailbox"
else
    bad "delivery: $(cat "$tmp/lmtp.out") / $("$dest$sbindir/mbtool" -C "$tmp/imapd.conf" info user.inst 2>&1)"
fi
kill "$mpid"
i=0
while kill -0 "$mpid" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$mpid" 2>/dev/null; then
    bad "installed master still running 60 s after SIGTERM"
else
    ok "installed master stopped on SIGTERM"
    mpid=
fi

# 4. without -S, the installed master finds the workers where they were
# installed (the compiled-in pkglibexecdir): run it in a private mount
# namespace where the DESTDIR tree is mounted on the prefix itself (root,
# unshare(1), an existing prefix directory; else skipped)
prefix=$(makevar prefix)
case "$libexec" in "$prefix"/*) under_prefix=yes ;; *) under_prefix=no ;; esac
if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null 2>&1 ||
   ! [ -d "$prefix" ] || [ $under_prefix = no ]; then
    echo "ok - # SKIP the compiled-in pkglibexecdir (needs root, unshare and an existing $prefix)"
elif ! unshare -m --propagation private true 2>/dev/null; then
    echo "ok - # SKIP the compiled-in pkglibexecdir (no mount namespace here)"
else
    rm -f "$tmp/master.log"
    PATH=/usr/bin:/bin unshare -m --propagation private sh -c \
        'mount --bind "$1" "$2" && shift 2 && exec "$@"' sh "$dest$prefix" "$prefix" \
        "$sbindir/master" -D -l -C "$tmp/imapd.conf" -M "$tmp/cyrus.conf" \
        -p "$tmp/master.pid" -s "$tmp/master.status" > "$tmp/master.log" 2>&1 &
    mpid=$!
    i=0
    while [ $i -lt 600 ] && ! grep -q 'master: started' "$tmp/master.log" 2>/dev/null; do
        kill -0 "$mpid" 2>/dev/null || break
        sleep 0.1; i=$((i + 1))
    done
    if grep -qF "runs=<$libexec/lmtpd " "$tmp/master.log" &&
       grep -q 'master: started' "$tmp/master.log"; then
        ok "installed master without -S runs $libexec/lmtpd"
    else
        bad "installed master without -S: $(tail -20 "$tmp/master.log")"
    fi
    kill "$mpid" 2>/dev/null
    i=0
    while kill -0 "$mpid" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 "$mpid" 2>/dev/null || mpid=
fi

# 5. uninstall leaves no file
make -s --no-print-directory -C "$top_builddir" uninstall DESTDIR="$dest" > "$tmp/uninstall.log" 2>&1
left=$(find "$dest" -type f 2>/dev/null)
if [ -z "$left" ]; then
    ok "make uninstall DESTDIR leaves no file"
else
    bad "left after uninstall: $left"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
