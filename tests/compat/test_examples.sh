#!/bin/sh
# test_examples.sh - the sample configuration files in doc/examples match
# what the code accepts:
#   - doc/examples/imapd.conf names every key the server knows (the list
#     comes from cyr_info conf-all, i.e. from the key table itself);
#   - with its paths moved into a scratch directory, the pair passes
#     cyr_info conf-lint without an error or a warning (no unknown key, a
#     cyrus.conf that parses, directories writable by cyrus_user);
#   - the master started on the pair (ports moved to loopback, no TLS
#     service) comes up, maps ctl_cyrusdb/lmtpd/imapd to ours, and a
#     message delivered over LMTP is in the mailbox.
# Exit 0 pass, 1 fail.
set -u

: "${top_builddir:?top_builddir must be set}"
: "${top_srcdir:?top_srcdir must be set}"
INFO="$top_builddir/tools/cyr_info"
MBTOOL="$top_builddir/tools/mbtool"
MASTER="$top_builddir/master/master"
EX="$top_srcdir/doc/examples"

pass=0 fail=0
ok()  { pass=$((pass + 1)); echo "ok - $1"; }
bad() { fail=$((fail + 1)); echo "not ok - $1"; }

base=${TEST_TMPDIR:-$top_builddir/tests/tmp}
mkdir -p "$base" || exit 1
tmp=$(mktemp -d "$base/examples.XXXXXX") || exit 1
chmod 755 "$tmp"
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

# 1. every key of the table is in the sample
missing=
for key in $("$INFO" -C /dev/null conf-all 2>/dev/null | sed -n 's/^\([a-z_][a-z0-9_-]*\):.*/\1/p'); do
    grep -Eq "^#?$key:" "$EX/imapd.conf" || missing="$missing $key"
done
nkeys=$("$INFO" -C /dev/null conf-all 2>/dev/null | grep -c ':')
if [ "$nkeys" -gt 20 ] && [ -z "$missing" ]; then
    ok "imapd.conf names all $nkeys keys"
else
    bad "imapd.conf lacks:$missing (keys listed: $nkeys)"
fi

# 2. conf-lint on the pair, paths moved
mkdir -p "$tmp/lib" "$tmp/spool" "$tmp/run"
sed -e "s|/var/lib/cyrusdeliver|$tmp/lib|g" -e "s|/var/spool/cyrusdeliver|$tmp/spool|g" \
    "$EX/imapd.conf" > "$tmp/imapd.conf"
printf 'sasl_sasldb_path: %s/sasldb2\n' "$tmp" >> "$tmp/imapd.conf"
if [ "$(id -u)" -eq 0 ]; then
    # the master started as root becomes cyrus and runs ctl_cyrusdb,
    # lmtpd and imapd from the build tree: when that user cannot reach
    # it (a checkout below a private mktemp directory) everything stays
    # root instead
    if id cyrus >/dev/null 2>&1 &&
       runuser -u cyrus -- test -x "$top_builddir/tools/ctl_cyrusdb"; then
        chown -R cyrus "$tmp"
    else
        echo "cyrus_user: root" >> "$tmp/imapd.conf"
    fi
else
    echo "cyrus_user: $(id -un)" >> "$tmp/imapd.conf"
fi
lmtpport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
imapport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sieveport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# the services as written, but on loopback ports of our own and without
# imaps (no certificate here)
sed -e "s|/run/cyrusdeliver|$tmp/run|g" \
    -e "s|listen=\"imap\"|listen=\"127.0.0.1:$imapport\"|" \
    -e "s|listen=\"sieve\"|listen=\"127.0.0.1:$sieveport\"|" \
    -e "/cmd=\"imapd -s\"/d" \
    "$EX/cyrus.conf" > "$tmp/cyrus.conf"
out=$("$INFO" -C "$tmp/imapd.conf" -M "$tmp/cyrus.conf" conf-lint 2>&1); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q ' 0 errors, 0 warnings$'; then
    ok "conf-lint: clean"
else
    bad "conf-lint: exit $rc: $out"
fi
out=$("$INFO" -C "$EX/imapd.conf" -M "$EX/cyrus.conf" conf-lint 2>&1)
if printf '%s\n' "$out" | grep -qi 'unknown key'; then
    bad "conf-lint on the samples as shipped warns of an unknown key: $out"
else
    ok "conf-lint on the samples as shipped: no unknown key"
fi

# 3. the master on the pair: up, and a delivery lands
"$MASTER" -D -l -C "$tmp/imapd.conf" -M "$tmp/cyrus.conf" -p "$tmp/master.pid" \
    -s "$tmp/master.status" > "$tmp/master.log" 2>&1 &
mpid=$!
i=0
while [ $i -lt 600 ] && ! [ -S "$tmp/run/lmtp" -a -s "$tmp/master.status" ]; do
    kill -0 "$mpid" 2>/dev/null || break
    sleep 0.1; i=$((i + 1))
done
if [ -S "$tmp/run/lmtp" ]; then
    ok "master up on the samples"
else
    bad "master not up on the samples: $(tail -20 "$tmp/master.log")"
fi
if grep -q 'ctl_cyrusdb.*-r' "$tmp/master.log" && ! grep -q 'skipped: \|refused' "$tmp/master.log"; then
    ok "recovery mapped, nothing skipped"
else
    bad "recovery not mapped or an entry skipped: $(grep 'ctl_cyrusdb\|skipped: \|refused' "$tmp/master.log")"
fi
"$MBTOOL" -C "$tmp/imapd.conf" create user.sample >/dev/null 2>&1
python3 - "$tmp/run/lmtp" <<'PY' > "$tmp/lmtp.out" 2>&1
import smtplib, sys
with smtplib.LMTP(sys.argv[1]) as c:
    c.ehlo_or_helo_if_needed()
    c.sendmail("a@example.org", ["sample@example.org"],
               b"From: a@example.org\r\nSubject: sample\r\n\r\nbody\r\n")
print("sent")
PY
if grep -q '^sent' "$tmp/lmtp.out" &&
   "$MBTOOL" -C "$tmp/imapd.conf" info user.sample 2>/dev/null | grep -q '^messages: 1$'; then
    ok "a delivery over LMTP is in the mailbox"
else
    bad "delivery: $(cat "$tmp/lmtp.out") / $("$MBTOOL" -C "$tmp/imapd.conf" info user.sample 2>&1)"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
