#!/usr/bin/env bash
# demo.sh - build the project and show it working.
# Today the system is its storage layer (cyrusdb) and the tools around it:
# this script builds everything, then keeps a small mailbox list in each
# backend, converts between them, recovers and checks the directory, and
# prints what it did.  As lmtpd, imapd and the master land, this script
# will start them instead.
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
cat > "$conf" <<CONF
configdirectory: $dir
mboxlist_db: skiplist
CONF

echo
echo "== a mailbox list in skiplist, sorted in mailbox order (-M)"
run "$bin/cyr_dbtool" -C "$conf" -n -M "$dir/mailboxes.db" skiplist batch <<'BATCH'
set user.alice 0 default alice lrswipkxtecda
set user.alice.Sent 0 default alice lrswipkxtecda
set user.alice-old 0 default alice lrswipkxtecda
set user.bob 0 default bob lrswipkxtecda
BATCH
run "$bin/cyr_dbtool" -C "$conf" -M "$dir/mailboxes.db" skiplist show user.alice

echo
echo "== the same list converted to every other backend, and verified"
for b in flat db3 db3-nosync lmdb; do
  run "$bin/cvt_cyrusdb" -M "$dir/mailboxes.db" skiplist "$dir/mailboxes-$b.db" "$b"
done
run "$bin/cyr_dbtool" -M "$dir/mailboxes-lmdb.db" lmdb get user.bob

echo
echo "== opening a file with the wrong backend is refused, naming both"
"$bin/cyr_dbtool" "$dir/mailboxes.db" lmdb show || true

echo
echo "== recovery and checkpoint of the whole directory (the master runs -r at start)"
run "$bin/ctl_cyrusdb" -C "$conf" -r
run "$bin/ctl_cyrusdb" -C "$conf" -c

echo
echo "demo done; files are in $dir (remove with: rm -rf $dir)"
