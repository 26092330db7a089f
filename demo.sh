#!/usr/bin/env bash
# demo.sh - build the project and show it working.
# It builds everything, sets up a demo user with mbtool, delivers messages
# into the store the way a delivery agent does, shows the spool, the index
# and quota, damages and reconstructs an index, shows the cyrusdb tools on
# the databases, and then starts the system: the master with lmtpd on a
# UNIX socket and on TCP (127.0.0.1:${DEMO_LMTP_PORT:-2003}) and imapd on
# 127.0.0.1:${DEMO_IMAP_PORT:-1143}, delivers a message with a real LMTP
# client, reads it back with a real IMAP client (user demo, password
# demo-password, from a sasldb the script makes), and leaves the master
# running (the script prints how to stop it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/scripts/deps.sh"
cd "$here"
# one autoreconf at a time: a check.sh and a check.sh --sanitize (or the
# demo) started together on a fresh checkout share the generated files
exec 9>"$here/.autoreconf.lock"
flock 9
if [[ ! -x configure || configure.ac -nt configure || Makefile.am -nt configure ]]; then
  autoreconf -fi >/dev/null
fi
flock -u 9
exec 9>&-
mkdir -p build && cd build
[[ -f Makefile ]] || "$here/configure" -q --enable-werror
make -j"$(nproc)" >/dev/null
bin="$PWD/tools"

dir=${DEMO_DIR:-$(mktemp -d /var/tmp/cyrusdeliver-demo.XXXXXX)}
mkdir -p "$dir"
echo "demo directory: $dir"
run() { echo "\$ ${*/#$bin\//}"; "$@"; }

conf="$dir/imapd.conf"
mkdir -p "$dir/conf" "$dir/spool"
cat > "$conf" <<CONF
configdirectory: $dir/conf
partition-default: $dir/spool
servername: localhost
# IMAP logins: the demo user is in a sasldb; plaintext LOGIN is allowed
# because the demo listens on 127.0.0.1 only (use TLS anywhere else)
sasl_pwcheck_method: auxprop
sasl_auxprop_plugin: sasldb
sasl_sasldb_path: $dir/sasldb2
sasl_mech_list: PLAIN LOGIN
allowplaintext: yes
# the master, lmtpd and imapd log here (a site would use syslog)
log_file: $dir/cyrusdeliver.log
CONF
printf '%s' demo-password | saslpasswd2 -p -c -f "$dir/sasldb2" -u localhost demo
# run as root, the tools and the master become cyrus_user (cyrus): the
# directories are that user's from the start
if [[ $(id -u) -eq 0 ]]; then
  if getent passwd cyrus >/dev/null; then
    chmod 755 "$dir"
    chown -R cyrus "$dir"
  else
    echo "cyrus_user: root" >> "$conf"
  fi
fi
mb() { run "$bin/mbtool" -C "$conf" "$@"; }
# Started as root, the master and the admin tools run as cyrus_user
# (cyrus): make that system user if the machine has none (as Cyrus's
# package does: group mail, no login), and give it the demo's files.
give_files() {
  [[ $(id -u) -eq 0 ]] || return 0
  if ! getent passwd cyrus >/dev/null; then
    run useradd --system --gid mail --home-dir /var/lib/cyrusdeliver \
      --no-create-home --shell /usr/sbin/nologin --comment "cyrusdeliver mail system" cyrus
  fi
  chmod 755 "$dir"
  chown -R cyrus "$dir"
}
give_files

echo
echo "== a demo user with a folder, and a shared mailbox"
mb create user.demo
mb create user.demo.Sent
mb create shared.announce
mb list

echo
echo "== deliver a message (LF lines become CRLF), twice: the second is a duplicate"
msg="$dir/hello.eml"
printf 'From: Alice <alice@example.org>\nTo: demo@example.org\nSubject: Hello\nMessage-ID: <hello-1@example.org>\n\nHello from the demo.\n' > "$msg"
mb deliver -f "$msg" demo
mb deliver -f "$msg" demo
mb deliver -m Sent -M shared.announce -D -f "$msg" demo
mb info user.demo
echo "\$ ls $(dirname "$(find "$dir/spool" -path '*user/demo/1.')")"
ls "$(dirname "$(find "$dir/spool" -path '*user/demo/1.')")"

echo
echo "== quota: a 1 KiB root on the user; a bigger message is refused (exit 3: try later)"
mb quota set user.demo 1 none
{ printf 'Subject: big\n\n'; head -c 3000 /dev/zero | tr '\0' 'x'; echo; } > "$dir/big.eml"
mb deliver -f "$dir/big.eml" demo || echo "(exit $?)"

echo
echo "== a damaged index is found by check and rebuilt by reconstruct"
idx=$(find "$dir/spool" -path '*user/demo/cyrus.index')
printf '\377\377' | dd of="$idx" bs=1 seek=4100 conv=notrunc 2>/dev/null
mb check user.demo || echo "(exit $?)"
mb reconstruct user.demo
mb check user.demo

echo
echo "== the mailbox list itself, through the database tool (mailbox order: -M)"
run "$bin/cyr_dbtool" -C "$conf" -M "$dir/conf/mailboxes.db" skiplist show user.demo

echo
echo "== the same list converted to every other backend, and verified"
mkdir -p "$dir/copy"
for b in flat db3 db3-nosync lmdb; do
  run "$bin/cvt_cyrusdb" -M "$dir/conf/mailboxes.db" skiplist "$dir/copy/mailboxes-$b.db" "$b"
done
run "$bin/cyr_dbtool" -M "$dir/copy/mailboxes-lmdb.db" lmdb get shared.announce

echo
echo "== opening a file with the wrong backend is refused, naming both"
"$bin/cyr_dbtool" "$dir/conf/mailboxes.db" lmdb show || true

echo
echo "== recovery and checkpoint of the whole directory (the master runs -r at start)"
run "$bin/ctl_cyrusdb" -C "$conf" -r
run "$bin/ctl_cyrusdb" -C "$conf" -c

echo
echo "== the system: master with lmtpd and imapd (cyrus.conf), a delivery over LMTP, read over IMAP"
port=${DEMO_LMTP_PORT:-2003}
imapport=${DEMO_IMAP_PORT:-1143}
mb quota remove user.demo
mb setacl user.demo.Sent anyone p
mkdir -p "$dir/socket"
cat > "$dir/cyrus.conf" <<CONF
START {
  recover cmd="$bin/ctl_cyrusdb -C $conf -r"
}
SERVICES {
  lmtpunix cmd="$PWD/lmtpd/lmtpd" listen="$dir/socket/lmtp" prefork=5 maxchild=20
  lmtp     cmd="$PWD/lmtpd/lmtpd -a" listen="127.0.0.1:$port" prefork=1 maxchild=10
  imap     cmd="$PWD/imapd/imapd" listen="127.0.0.1:$imapport" prefork=2 maxchild=20
}
EVENTS {
  checkpoint cmd="$bin/ctl_cyrusdb -C $conf -c" period=30
  delprune   cmd="$bin/mbtool -C $conf prune 3" at=0400
}
CONF
# the master and the admin tools, started as root, run as cyrus_user
give_files
if ! run "$PWD/master/master" -C "$conf" -M "$dir/cyrus.conf" -p "$dir/master.pid" -s "$dir/master.status"; then
  echo "demo: the master did not start (its reason is above); if another demo holds the ports," >&2
  echo "demo: stop it (kill \$(cat OTHERDIR/master.pid)) or set DEMO_LMTP_PORT and DEMO_IMAP_PORT" >&2
  exit 1
fi
for _ in $(seq 50); do [[ -S $dir/socket/lmtp && -s $dir/master.status ]] && break; sleep 0.1; done
sleep 0.5
run "$bin/masterstatus" -C "$conf"
echo "\$ python3 smtplib.LMTP -> $dir/socket/lmtp"
python3 - "$dir/socket/lmtp" <<'PY'
import smtplib, sys
msg = (b"From: Bob <bob@example.org>\r\nTo: demo@example.org\r\n"
       b"Subject: over LMTP\r\nMessage-ID: <lmtp-demo-1@example.org>\r\n\r\n"
       b"Delivered by lmtpd.\r\n")
with smtplib.LMTP(sys.argv[1]) as c:
    c.ehlo_or_helo_if_needed()
    c.mail("bob@example.org")
    for r in ("demo@example.org", "nobody@example.org"):
        print("RCPT", r, "->", *c.rcpt(r))
    c.putcmd("data")
    print("DATA ->", *c.getreply())
    c.send(msg + b".\r\n")
    print("demo@example.org ->", *c.getreply())
PY
if command -v swaks >/dev/null; then
  run swaks --silent 2 --protocol LMTP --server 127.0.0.1 --port "$port" \
    --from alice@example.org --to demo+Sent@example.org \
    --header "Subject: over LMTP on TCP, with swaks" || true
fi
mb info user.demo
mb info user.demo.Sent
echo "\$ python3 imaplib -> 127.0.0.1:$imapport (user demo)"
python3 - "$imapport" <<'PY'
import imaplib, sys
m = imaplib.IMAP4("127.0.0.1", int(sys.argv[1]))
m.login("demo", "demo-password")
for box in ("INBOX", "INBOX.Sent"):
    typ, data = m.select(box, readonly=True)
    print("%s: %s messages" % (box, data[0].decode()))
    typ, data = m.fetch("1:*", "(UID BODY.PEEK[HEADER.FIELDS (SUBJECT FROM)])")
    for item in data:
        if isinstance(item, tuple):
            hdr = item[1].decode(errors="replace").strip().replace("\r\n", " | ")
            print("  %s  %s" % (item[0].decode().split(" (")[0], hdr))
m.select("INBOX", readonly=True)
typ, data = m.search(None, "FROM", "bob")
print("SEARCH FROM bob in INBOX ->", data[0].decode() or "(none)")
m.logout()
PY

echo
echo "demo done; files are in $dir"
echo "the master is still running (pid $(cat "$dir/master.pid")): deliver with"
echo "  swaks --protocol LMTP --socket $dir/socket/lmtp --to demo@example.org"
echo "read with any IMAP client on 127.0.0.1:$imapport, user demo, password demo-password"
echo "its log: $dir/cyrusdeliver.log"
echo "stop it with: kill \$(cat $dir/master.pid)   then remove the files: rm -rf $dir"
