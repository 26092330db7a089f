#!/usr/bin/env bash
# demo.sh - build the project and show it working.
# Today the system is its mailbox store and storage layer with their tools:
# this script builds everything, sets up a demo user with mbtool, delivers
# messages into the store the way a delivery agent does, shows the spool,
# the index and quota, damages and reconstructs an index, then shows the
# cyrusdb tools on the databases.  As lmtpd, imapd and the master land,
# this script will start them instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/scripts/deps.sh"
cd "$here"
if [[ ! -x configure || configure.ac -nt configure || Makefile.am -nt configure ]]; then
  autoreconf -fi >/dev/null
fi
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
CONF
mb() { run "$bin/mbtool" -C "$conf" "$@"; }

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
echo "demo done; files are in $dir (remove with: rm -rf $dir)"
