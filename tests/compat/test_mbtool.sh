#!/bin/sh
# test_mbtool.sh - the mailbox admin tool end to end, once per backend:
# create / list / info / setacl / rename with children / delete, delivery
# of a message file (LF lines) to users, folders and mailboxes with
# duplicate suppression and its override, unknown recipients, quota set /
# show / refusal / remove, check, a damaged index found by check and
# repaired by reconstruct, cleanup, prune, and every usage error path.
# Ends with a tiny appendbench run.
#
# Environment: top_builddir (required), TEST_BACKENDS (space-separated, to
# narrow the backends; default all), TEST_TMPDIR (scratch space, default
# the build tree).  Exit 0 pass, 1 fail.
set -u

: "${top_builddir:?top_builddir must be set}"
MBTOOL="$top_builddir/tools/mbtool"
BENCH="$top_builddir/tools/appendbench"
BACKENDS="${TEST_BACKENDS:-flat skiplist db3 db3-nosync lmdb}"

for p in "$MBTOOL" "$BENCH"; do
    if [ ! -x "$p" ]; then
        echo "missing $p (run make first)"
        echo "0 passed, 1 failed"
        exit 1
    fi
done

scratch="${TEST_TMPDIR:-$top_builddir/tests/tmp}"
mkdir -p "$scratch" || exit 1
tmp=$(mktemp -d "$scratch/mbtool.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'rm -rf "$tmp"; exit 1' INT TERM HUP

passed=0
failed=0
OUT="$tmp/out"
ERR="$tmp/err"
rc=0

pass() { passed=$((passed + 1)); echo "PASS: $1"; }
fail() {
    failed=$((failed + 1))
    echo "FAIL: $1"
    if [ -s "$ERR" ]; then sed -n '1,5s/^/    stderr: /p' "$ERR"; fi
    if [ -s "$OUT" ]; then sed -n '1,5s/^/    stdout: /p' "$OUT"; fi
}
run() { "$@" >"$OUT" 2>"$ERR"; rc=$?; }
# expect STATUS DESCRIPTION CMD...
expect() {
    want=$1 desc=$2
    shift 2
    run "$@"
    if [ "$rc" -eq "$want" ]; then pass "$desc"; else fail "$desc (exit $rc, want $want)"; fi
}
# expect_out STATUS REGEX DESCRIPTION CMD...: status and a line of stdout+stderr
expect_out() {
    want=$1 re=$2 desc=$3
    shift 3
    run "$@"
    if [ "$rc" -eq "$want" ] && cat "$OUT" "$ERR" | grep -q -- "$re"; then
        pass "$desc"
    else
        fail "$desc (exit $rc, want $want and /$re/)"
    fi
}

msg="$tmp/msg.txt"
printf 'From: Carol <carol@example.org>\nTo: alice@example.org\nSubject: hello\nMessage-ID: <m1@example.org>\n\nHello Alice.\nSecond line.\n' >"$msg"
big="$tmp/big.txt"
{ printf 'Subject: big\nMessage-ID: <big@example.org>\n\n'; i=0; while [ $i -lt 40 ]; do printf '%0100d\n' $i; i=$((i + 1)); done; } >"$big"

for b in $BACKENDS; do
    d="$tmp/$b"
    mkdir -p "$d/conf" "$d/spool"
    conf="$d/imapd.conf"
    printf 'configdirectory: %s/conf\npartition-default: %s/spool\nmboxlist_db: %s\nduplicate_db: %s\nseenstate_db: %s\nsubscription_db: %s\nquota_db: %s\n' \
        "$d" "$d" "$b" "$b" "$b" "$b" "$b" >"$conf"
    # run as root, mbtool becomes cyrus_user (tested with a master in
    # test_admin_tools.py); this private directory stays root's
    if [ "$(id -u)" -eq 0 ]; then echo "cyrus_user: root" >>"$conf"; fi
    M="$MBTOOL -C $conf"

    # ---- create, list, info, setacl
    expect_out 0 "user.alice: created uniqueid=" "$b: create user.alice" $M create user.alice
    expect 0 "$b: create user.alice.Sent" $M create user.alice.Sent
    expect 0 "$b: create user.bob" $M create user.bob
    expect 0 "$b: create user.bob.Trash" $M create user.bob.Trash
    expect 0 "$b: create shared.news" $M create shared.news
    expect_out 1 "cannot create user.alice" "$b: create an existing mailbox fails" $M create user.alice
    for bad in 'user..x' '.user' 'user.' 'a/b' 'user.al*' 'x%y'; do
        expect_out 1 "cannot create" "$b: refuse name '$bad'" $M create "$bad"
    done
    expect_out 1 "cannot create" "$b: refuse an unknown partition" $M create user.carol nopart
    run $M list
    if [ "$rc" -eq 0 ] && [ "$(cut -d' ' -f1 "$OUT" | tr '\n' ' ')" = "shared.news user.alice user.alice.Sent user.bob user.bob.Trash " ]; then
        pass "$b: list shows every mailbox in mailbox order"
    else
        fail "$b: list (exit $rc)"
    fi
    run $M list 'user.%'
    if [ "$rc" -eq 0 ] && [ "$(cut -d' ' -f1 "$OUT" | tr '\n' ' ')" = "user.alice user.bob " ]; then
        pass "$b: list with % stops at the separator"
    else
        fail "$b: list user.% (exit $rc)"
    fi
    expect_out 0 "^acl: alice=lrswipkxtea" "$b: info shows the owner's ACL" $M info user.alice
    expect 0 "$b: setacl anyone p" $M setacl user.alice.Sent anyone p
    expect_out 0 "anyone=p" "$b: info shows the new ACL entry" $M info user.alice.Sent
    expect 0 "$b: setacl anyone none removes it" $M setacl user.alice.Sent anyone none
    run $M info user.alice.Sent
    if [ "$rc" -eq 0 ] && ! grep -q anyone "$OUT"; then pass "$b: the entry is gone"; else fail "$b: setacl none"; fi
    expect 2 "$b: setacl with unknown rights letters" $M setacl user.alice anyone lrz

    # ---- deliver
    expect_out 0 "user.alice: delivered uid=1" "$b: deliver to alice" $M deliver -f "$msg" alice
    expect_out 0 "user.alice: duplicate" "$b: the same Message-ID again is suppressed" $M deliver -f "$msg" alice
    expect_out 0 "user.alice: delivered uid=2" "$b: -D delivers it again" $M deliver -D -f "$msg" alice
    run $M deliver -f "$msg" alice bob
    if [ "$rc" -eq 0 ] && grep -q "user.alice: duplicate" "$OUT" && grep -q "user.bob: delivered uid=1" "$OUT"; then
        pass "$b: one message, two users: new one delivered, the other suppressed"
    else
        fail "$b: deliver to alice and bob (exit $rc)"
    fi
    expect_out 0 "user.alice.Sent: delivered uid=1" "$b: -m FOLDER delivers into the folder" $M deliver -D -m Sent -f "$msg" alice
    expect_out 0 "user.bob: delivered uid=2" "$b: -m with a missing folder falls back to the INBOX" $M deliver -D -m Nope -f "$msg" bob
    expect_out 0 "shared.news: delivered uid=1" "$b: -M delivers to a shared mailbox" $M deliver -M shared.news < "$msg"
    expect_out 4 "user.nobody: not delivered" "$b: an unknown user fails permanently" $M deliver -f "$msg" nobody
    expect 2 "$b: deliver without a recipient" $M deliver -f "$msg"
    expect_out 1 "nonexistent" "$b: deliver from a missing file" $M deliver -f "$tmp/nonexistent" alice
    # the stored message has CRLF line ends and the body intact
    f=$(find "$d/spool" -path '*user/alice/1.' | head -1)
    if [ -n "$f" ] && [ "$(tr -d '\r' <"$f")" = "$(cat "$msg")" ] && [ "$(tr -cd '\r' <"$f" | wc -c)" -eq "$(wc -l <"$msg")" ]; then
        pass "$b: the message file is the message with CRLF line ends"
    else
        fail "$b: message file content ($f)"
    fi
    expect_out 0 "^messages: 2" "$b: info counts alice's messages" $M info user.alice

    # ---- quota
    expect_out 0 "user.alice storage=" "$b: quota set on alice counts her usage" $M quota set user.alice 2 none
    expect_out 0 "messages=3 " "$b: quota covers the folder too (2 + 1 messages)" $M quota show user.alice
    expect_out 3 "user.alice: not delivered" "$b: a message over the storage quota is refused (temporary)" $M deliver -f "$big" alice
    expect_out 0 "user.alice: delivered" "$b: -q ignores quota" $M deliver -q -f "$big" alice
    expect_out 0 "^user.alice storage=" "$b: quota show lists the roots" $M quota show
    expect 0 "$b: quota remove" $M quota remove user.alice
    expect_out 1 "no quota root" "$b: the removed root is gone" $M quota show user.alice
    expect 2 "$b: quota set with a bad limit" $M quota set user.alice ten none

    # ---- check, damage, reconstruct, cleanup
    expect_out 0 "user.alice: ok" "$b: check passes" $M check -r user.alice
    idx=$(find "$d/spool" -path '*user/alice/cyrus.index' | head -1)
    printf '\377\377\377\377' | dd of="$idx" bs=1 seek=4100 conv=notrunc 2>/dev/null
    expect 1 "$b: check finds the damaged record" $M check user.alice
    expect_out 0 "reconstructed" "$b: reconstruct rebuilds the index" $M reconstruct user.alice
    expect_out 0 "user.alice: ok" "$b: check passes after reconstruct" $M check user.alice
    expect_out 0 "^messages: 3" "$b: every message is back" $M info user.alice
    expect_out 0 "cleaned up" "$b: cleanup" $M cleanup user.alice
    run $M cleanup -a
    if [ "$rc" -eq 0 ] && grep -q "^user.bob: cleaned up" "$OUT" && grep -q "^shared.news: cleaned up" "$OUT" && grep -q "^user.alice.Sent: cleaned up" "$OUT"; then
        pass "$b: cleanup -a does every mailbox"
    else
        fail "$b: cleanup -a (exit $rc)"
    fi
    expect_out 0 "^shared.news: ok" "$b: check -a does every mailbox" $M check -a
    expect 2 "$b: cleanup -a takes no name" $M cleanup -a user.alice
    expect_out 0 "pruned" "$b: prune" $M prune 0

    # ---- leftover staging files: a dead writer's go, a live one's stay
    sdir="$d/spool/stage./00"
    mkdir -p "$sdir"
    sleep 60 & live=$!
    sh -c 'exit 0' & dead=$!
    wait $dead
    : >"$sdir/$dead-1-1"; : >"$sdir/$live-1-1"; : >"$sdir/notours"
    run $M stage-cleanup
    if [ "$rc" -eq 0 ] && grep -q "removed: 1" "$OUT" && [ ! -e "$sdir/$dead-1-1" ] && [ -e "$sdir/$live-1-1" ] && [ -e "$sdir/notours" ]; then
        pass "$b: stage-cleanup removes only a dead writer's staging file"
    else
        fail "$b: stage-cleanup (exit $rc)"
    fi
    kill $live; wait $live 2>/dev/null
    rm -f "$sdir/$live-1-1" "$sdir/notours"
    expect_out 1 "cannot clean" "$b: stage-cleanup of an unknown partition" $M stage-cleanup nopart

    # ---- rename and delete
    expect_out 0 "renamed" "$b: rename user.bob with its children" $M rename user.bob user.robert
    run $M list 'user.robert*'
    if [ "$rc" -eq 0 ] && [ "$(cut -d' ' -f1 "$OUT" | tr '\n' ' ')" = "user.robert user.robert.Trash " ] && grep -q "^user.robert default messages=2 " "$OUT"; then
        pass "$b: the renamed tree has its messages"
    else
        fail "$b: list after rename (exit $rc)"
    fi
    expect_out 1 "cannot rename" "$b: rename onto an existing mailbox fails" $M rename user.robert user.alice
    expect_out 1 "cannot rename" "$b: rename of a missing mailbox fails" $M rename user.bob user.x
    expect 0 "$b: delete -r user.robert" $M delete -r user.robert
    run $M list 'user.robert*'
    if [ "$rc" -eq 0 ] && [ ! -s "$OUT" ]; then pass "$b: the deleted tree is gone"; else fail "$b: list after delete"; fi
    if find "$d/spool" -path '*user/robert*' | grep -q .; then fail "$b: spool of the deleted tree removed"; else pass "$b: spool of the deleted tree removed"; fi
    expect_out 1 "cannot delete" "$b: delete of a missing mailbox fails" $M delete user.robert
done

# ---- ctl_cyrusdb also recovers the per-user databases in CONFIGDIR/user/H/
CTL="$top_builddir/tools/ctl_cyrusdb"
DBTOOL="$top_builddir/tools/cyr_dbtool"
mkdir -p "$d/conf/user/a"
# (in the backends $conf names: ctl_cyrusdb -r refuses files that do not
# match their configured backend)
"$DBTOOL" -n "$d/conf/user/a/alice.seen" "$b" set k v >/dev/null 2>&1
"$DBTOOL" -n -M "$d/conf/user/a/alice.sub" "$b" set user.alice "" >/dev/null 2>&1
run "$CTL" -C "$conf" -r
if [ "$rc" -eq 0 ] && grep -q "user/a/alice.seen: [a-z0-9]*: recovered" "$OUT" && grep -q "user/a/alice.sub: [a-z0-9]*: recovered" "$OUT" && grep -q "mailboxes.db: " "$OUT"; then
    pass "ctl_cyrusdb -r covers mailboxes.db and the per-user databases"
else
    fail "ctl_cyrusdb -r per-user databases (exit $rc)"
fi

# ---- usage errors
expect 2 "no command" "$MBTOOL" -C "$conf"
expect 2 "unknown command" "$MBTOOL" -C "$conf" frobnicate
expect 2 "create without a name" "$MBTOOL" -C "$conf" create
expect_out 1 "nonexistent.conf" "a missing config file is named" "$MBTOOL" -C "$tmp/nonexistent.conf" list
printf 'configdirectory: %s/conf\nmboxlist_db: nosuchdb\n' "$tmp" >"$tmp/bad.conf"
expect_out 1 "bad.conf:2" "a malformed config names file and line" "$MBTOOL" -C "$tmp/bad.conf" list
expect_out 0 "deliver" "-h prints the usage" "$MBTOOL" -h

# ---- appendbench, a tiny run
b1=$(echo $BACKENDS | cut -d' ' -f1)
run "$BENCH" -m "$b1" -D "$b1" -Q "$b1" -p 1,2 -R 1,3 -n 5 -u 5 -r 1 -d "$tmp" --markdown
if [ "$rc" -eq 0 ] && grep -q "^| mboxlist_db=$b1 " "$OUT" && grep -q "quota=$b1 | 2 | 3 | " "$OUT" && ! grep -q failed "$OUT"; then
    pass "appendbench runs a small table"
else
    fail "appendbench runs a small table (exit $rc)"
fi
if ls "$tmp" | grep -q '^appendbench\.'; then fail "appendbench removed its directories"; else pass "appendbench removed its directories"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
