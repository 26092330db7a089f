#!/bin/sh
# test_tools.sh - the command-line tools end to end, on real files.
#
# cyr_dbtool (set/get/show/delete, the stdin form, -x escapes, -M order,
# batch that commits and batch that fails midway and leaves nothing,
# consistent, dump, checkpoint), cvt_cyrusdb for every ordered pair of
# backends with verification, ctl_cyrusdb -r and -c on a directory holding
# one database of each backend, and the error paths (missing file, wrong
# backend, unknown backend, usage errors).
#
# Environment: top_builddir (required), TEST_BACKENDS (space-separated, to
# narrow the backends; default all).  Exit 0 pass, 1 fail.
set -u

: "${top_builddir:?top_builddir must be set}"
T="$top_builddir/tools"
DBTOOL="$T/cyr_dbtool"
CVT="$T/cvt_cyrusdb"
CTL="$T/ctl_cyrusdb"
BENCH="$T/dbbench"
BACKENDS="${TEST_BACKENDS:-flat skiplist db3 db3-nosync lmdb}"

for p in "$DBTOOL" "$CVT" "$CTL" "$BENCH"; do
    if [ ! -x "$p" ]; then
        echo "missing $p (run make first)"
        echo "0 passed, 1 failed"
        exit 1
    fi
done

mkdir -p "$top_builddir/tests/tmp" || exit 1
tmp=$(mktemp -d "$top_builddir/tests/tmp/tools.XXXXXX") || exit 1
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
}

# run CMD...: run it, stdout in $OUT, stderr in $ERR, status in $rc
run() { "$@" >"$OUT" 2>"$ERR"; rc=$?; }

# expect STATUS DESCRIPTION CMD...
expect() {
    want=$1 desc=$2
    shift 2
    run "$@"
    if [ "$rc" -eq "$want" ]; then pass "$desc"; else fail "$desc (exit $rc, want $want)"; fi
}

# same_file FILE EXPECTED-TEXT DESCRIPTION: FILE holds exactly the text
same_text() {
    printf '%s' "$2" >"$tmp/expected"
    if cmp -s "$1" "$tmp/expected"; then pass "$3"
    else
        fail "$3"
        printf '%s\n' "    want: $(od -c "$tmp/expected" | head -3 | tr '\n' ' ')"
        printf '%s\n' "    got:  $(od -c "$1" | head -3 | tr '\n' ' ')"
    fi
}

# err_has TEXT DESCRIPTION: stderr of the last run mentions TEXT
err_has() {
    if grep -F -q -- "$1" "$ERR"; then pass "$2"; else fail "$2 (no \"$1\" on stderr)"; fi
}

NL='
'
TAB=$(printf '\t')

# ---- help and usage -------------------------------------------------------
for p in "$DBTOOL" "$CVT" "$CTL" "$BENCH"; do
    name=$(basename "$p")
    run "$p" --help
    if [ "$rc" -eq 0 ] && grep -q '^Usage:' "$OUT" && grep -q 'Exit status' "$OUT"; then
        pass "$name --help prints usage and exit status, exit 0"
    else
        fail "$name --help (exit $rc)"
    fi
done
expect 2 "cyr_dbtool without arguments is a usage error" "$DBTOOL"
expect 2 "cyr_dbtool with an unknown option is a usage error" "$DBTOOL" -Q "$tmp/x" flat show
expect 2 "cyr_dbtool unknown backend is a usage error" "$DBTOOL" -n "$tmp/x" nosuchdb show
err_has "nosuchdb" "unknown backend message names it"
err_has "skiplist" "unknown backend message lists the known backends"
expect 2 "cyr_dbtool unknown action is a usage error" "$DBTOOL" -n "$tmp/x" flat frobnicate
expect 2 "cyr_dbtool set with a key but no value is a usage error" "$DBTOOL" -n "$tmp/x" flat set onlykey
expect 2 "cyr_dbtool get with two keys is a usage error" "$DBTOOL" "$tmp/x" flat get a b
expect 2 "cyr_dbtool -x with a bad escape is a usage error" "$DBTOOL" -x -n "$tmp/x" flat set 'a\q' v
expect 2 "cyr_dbtool -x with a short \\x escape is a usage error" "$DBTOOL" -x -n "$tmp/x" flat set 'a\x4' v
if [ -e "$tmp/x" ]; then fail "usage errors created no file"; else pass "usage errors created no file"; fi
expect 2 "cvt_cyrusdb with three arguments is a usage error" "$CVT" a flat b
expect 2 "cvt_cyrusdb with an unknown backend is a usage error" "$CVT" "$tmp/a" flat "$tmp/b" nosuchdb
err_has "nosuchdb" "cvt_cyrusdb unknown backend message names it"
expect 2 "ctl_cyrusdb without -r or -c is a usage error" "$CTL" -d "$tmp"
expect 2 "ctl_cyrusdb with both -r and -c is a usage error" "$CTL" -d "$tmp" -r -c
expect 1 "ctl_cyrusdb on a missing directory fails" "$CTL" -d "$tmp/nodir" -r
err_has "$tmp/nodir" "ctl_cyrusdb names the missing directory"
expect 2 "dbbench with an unknown backend is a usage error" "$BENCH" -b nosuchdb
expect 2 "dbbench -n 0 is a usage error" "$BENCH" -n 0

# ---- cyr_dbtool, per backend --------------------------------------------
for b in $BACKENDS; do
    d="$tmp/$b"
    mkdir -p "$d"
    db="$d/test.db"

    expect 1 "$b: opening a missing file without -n fails" "$DBTOOL" "$db" "$b" show
    err_has "$db" "$b: the missing-file message names the file"
    if [ -e "$db" ]; then fail "$b: a failed open created no file"; else pass "$b: a failed open created no file"; fi

    expect 0 "$b: set -n creates the database" "$DBTOOL" -n "$db" "$b" set user.b "value b"
    expect 0 "$b: set a key with spaces" "$DBTOOL" "$db" "$b" set "key with spaces" "value with  spaces"
    expect 0 "$b: set user.a" "$DBTOOL" "$db" "$b" set user.a 1
    expect 0 "$b: set an empty value" "$DBTOOL" "$db" "$b" set empty ""
    expect 0 "$b: set a key starting with a dash" "$DBTOOL" "$db" "$b" set -dash dashvalue
    expect 0 "$b: replace a value" "$DBTOOL" "$db" "$b" set user.a "a value"

    run "$DBTOOL" "$db" "$b" get "key with spaces"
    same_text "$OUT" "value with  spaces$NL" "$b: get prints the value"
    run "$DBTOOL" "$db" "$b" get empty
    same_text "$OUT" "$NL" "$b: get of an empty value prints an empty line"
    run "$DBTOOL" "$db" "$b" get user.a
    same_text "$OUT" "a value$NL" "$b: get sees the replaced value"

    run "$DBTOOL" "$db" "$b" show
    same_text "$OUT" "-dash${TAB}dashvalue${NL}empty${TAB}${NL}key with spaces${TAB}value with  spaces${NL}user.a${TAB}a value${NL}user.b${TAB}value b${NL}" \
        "$b: show prints every record as KEY<TAB>VALUE in key order"
    run "$DBTOOL" "$db" "$b" show user.
    same_text "$OUT" "user.a${TAB}a value${NL}user.b${TAB}value b${NL}" "$b: show PREFIX prints only that prefix"
    run "$DBTOOL" "$db" "$b" show nomatch
    if [ "$rc" -eq 0 ] && [ ! -s "$OUT" ]; then pass "$b: show of an unused prefix prints nothing"; else fail "$b: show of an unused prefix"; fi

    expect 1 "$b: get of a missing key fails" "$DBTOOL" "$db" "$b" get nosuchkey
    err_has "nosuchkey" "$b: the get message names the key"
    err_has "$db" "$b: the get message names the file"
    expect 0 "$b: delete" "$DBTOOL" "$db" "$b" delete user.b
    expect 1 "$b: get after delete fails" "$DBTOOL" "$db" "$b" get user.b
    expect 1 "$b: delete of a missing key fails" "$DBTOOL" "$db" "$b" delete user.b
    err_has "not found" "$b: the delete message says not found"

    # awkward bytes with -x: NUL, newline, TAB, CR, 0xff, backslash
    expect 0 "$b: set -x with escaped bytes" "$DBTOOL" -x "$db" "$b" set 'bin\x01\xff key' 'v\x00\x0a\x09\x0d\\\x5c\xffend'
    run "$DBTOOL" -x "$db" "$b" get 'bin\x01\xff key'
    same_text "$OUT" 'v\x00\x0a\x09\x0d\x5c\x5c\xffend'"$NL" "$b: get -x prints the bytes escaped"
    run "$DBTOOL" "$db" "$b" get "$(printf 'bin\001\377 key')"
    printf 'v\000\n\t\r\\\\\377end\n' >"$tmp/expected_raw"
    if cmp -s "$OUT" "$tmp/expected_raw"; then pass "$b: get without -x prints the raw bytes"; else fail "$b: get without -x prints the raw bytes"; fi
    run "$DBTOOL" -x "$db" "$b" show bin
    same_text "$OUT" 'bin\x01\xff key'"$TAB"'v\x00\x0a\x09\x0d\x5c\x5c\xffend'"$NL" "$b: show -x escapes keys and values"

    # Cyrus's stdin form
    printf 'stdin.k1\tv1\nstdin.k2\tv 2\twith tab\nstdin.k3\n' >"$tmp/in"
    expect 0 "$b: set reading KEY<TAB>VALUE lines from stdin" sh -c '"$1" "$2" "$3" set <"$4"' sh "$DBTOOL" "$db" "$b" "$tmp/in"
    run "$DBTOOL" "$db" "$b" show stdin.
    same_text "$OUT" "stdin.k1${TAB}v1${NL}stdin.k2${TAB}v 2${TAB}with tab${NL}stdin.k3${TAB}${NL}" "$b: the stdin form stored every line"
    printf 'stdin.k1\nstdin.nosuch\n' >"$tmp/in"
    expect 1 "$b: delete from stdin with a missing key fails" sh -c '"$1" "$2" "$3" delete <"$4"' sh "$DBTOOL" "$db" "$b" "$tmp/in"
    expect 0 "$b: ... and deleted nothing" "$DBTOOL" "$db" "$b" get stdin.k1

    # batch: one transaction that commits
    run "$DBTOOL" "$db" "$b" show
    cp "$OUT" "$tmp/before"
    printf '%s\n' "# a comment" "set batch.a 1" "" "SET batch.b two words" \
        "set${TAB}batch key${TAB}tab value" "delete stdin.k3" "get batch.b" \
        "show batch." >"$tmp/in"
    run sh -c '"$1" "$2" "$3" batch <"$4"' sh "$DBTOOL" "$db" "$b" "$tmp/in"
    if [ "$rc" -eq 0 ]; then pass "$b: batch succeeds"; else fail "$b: batch succeeds (exit $rc)"; fi
    same_text "$OUT" "two words${NL}batch.a${TAB}1${NL}batch.b${TAB}two words${NL}" \
        "$b: batch get and show see the batch's own changes"
    run "$DBTOOL" "$db" "$b" show batch
    same_text "$OUT" "batch key${TAB}tab value${NL}batch.a${TAB}1${NL}batch.b${TAB}two words${NL}" "$b: batch committed"
    expect 1 "$b: batch deleted stdin.k3" "$DBTOOL" "$db" "$b" get stdin.k3

    # batch that fails midway: nothing of it may remain
    run "$DBTOOL" "$db" "$b" show
    cp "$OUT" "$tmp/before"
    printf '%s\n' "set fail.a 1" "delete batch.a" "set fail.b 2" "delete no.such.key" "set fail.c 3" >"$tmp/in"
    run sh -c '"$1" "$2" "$3" batch <"$4"' sh "$DBTOOL" "$db" "$b" "$tmp/in"
    if [ "$rc" -eq 1 ]; then pass "$b: batch with a failing line exits 1"; else fail "$b: batch with a failing line exits 1 (exit $rc)"; fi
    err_has "line 4" "$b: the batch failure names the line"
    run "$DBTOOL" "$db" "$b" show
    if cmp -s "$OUT" "$tmp/before"; then pass "$b: the failed batch left the database unchanged"; else fail "$b: the failed batch left the database unchanged"; fi
    printf '%s\n' "set fail.a 1" "frobnicate x" >"$tmp/in"
    expect 1 "$b: batch with an unknown command fails" sh -c '"$1" "$2" "$3" batch <"$4"' sh "$DBTOOL" "$db" "$b" "$tmp/in"
    err_has "line 2" "$b: the unknown-command message names the line"
    expect 1 "$b: ... and fail.a was not stored" "$DBTOOL" "$db" "$b" get fail.a
    printf 'set fail.a 1\nset fail.b\n' >"$tmp/in"
    expect 1 "$b: batch set without a value fails" sh -c '"$1" "$2" "$3" batch <"$4"' sh "$DBTOOL" "$db" "$b" "$tmp/in"
    printf 'set -x\\x0a \\x00\\x0a\nget -x\\x0a\n' >"$tmp/in"
    run sh -c '"$1" -x "$2" "$3" batch <"$4"' sh "$DBTOOL" "$db" "$b" "$tmp/in"
    same_text "$OUT" '\x00\x0a'"$NL" "$b: batch -x decodes keys and values and escapes output"

    expect 0 "$b: consistent" "$DBTOOL" "$db" "$b" consistent
    same_text "$OUT" "Yes, consistent$NL" "$b: consistent says so"
    run "$DBTOOL" "$db" "$b" dump
    if [ "$rc" -eq 0 ] && grep -q '^user\.a' "$OUT"; then pass "$b: dump prints the records"; else fail "$b: dump prints the records (exit $rc)"; fi
    run "$DBTOOL" "$db" "$b" show
    cp "$OUT" "$tmp/before"
    expect 0 "$b: checkpoint" "$DBTOOL" "$db" "$b" checkpoint
    run "$DBTOOL" "$db" "$b" show
    if cmp -s "$OUT" "$tmp/before"; then pass "$b: checkpoint kept every record"; else fail "$b: checkpoint kept every record"; fi
    expect 0 "$b: consistent after checkpoint" "$DBTOOL" "$db" "$b" consistent

    # key order is unsigned byte order for every backend, whatever bytes
    # the keys hold (NUL, CR, DEL, 0xff sort by their value)
    printf 'set ord\\xff 4\nset ordz 5\nset ord\\x00a 1\nset orda 2\nset ord\\x7f 6\nset ord\\x0d 3\nset ord\\x80 7\n' >"$tmp/in"
    run sh -c '"$1" -x -n "$2" "$3" batch <"$4"' sh "$DBTOOL" "$d/order.db" "$b" "$tmp/in"
    run "$DBTOOL" -x "$d/order.db" "$b" show
    same_text "$OUT" "ord\\x00a${TAB}1${NL}ord\\x0d${TAB}3${NL}orda${TAB}2${NL}ordz${TAB}5${NL}ord\\x7f${TAB}6${NL}ord\\x80${TAB}7${NL}ord\\xff${TAB}4${NL}" \
        "$b: show walks keys with NUL, CR, DEL and high bytes in unsigned byte order"
    run "$DBTOOL" -x "$d/order.db" "$b" get 'ord\x00a'
    same_text "$OUT" "1$NL" "$b: get finds a key holding NUL among them"

    # mailbox order
    for k in user.a-b user.a.b user.a user.a.b.c; do
        "$DBTOOL" -M -n "$d/mbox.db" "$b" set "$k" x >/dev/null 2>&1
    done
    run "$DBTOOL" -M "$d/mbox.db" "$b" show
    same_text "$OUT" "user.a${TAB}x${NL}user.a.b${TAB}x${NL}user.a.b.c${TAB}x${NL}user.a-b${TAB}x${NL}" "$b: -M sorts '.' before every other byte"
    for k in user.a-b user.a.b user.a; do
        "$DBTOOL" -n "$d/plain.db" "$b" set "$k" x >/dev/null 2>&1
    done
    run "$DBTOOL" "$d/plain.db" "$b" show
    same_text "$OUT" "user.a${TAB}x${NL}user.a-b${TAB}x${NL}user.a.b${TAB}x${NL}" "$b: without -M the order is plain bytes"
done

# wrong backend: every pair of distinct formats
for b in $BACKENDS; do
    for o in $BACKENDS; do
        [ "$b" = "$o" ] && continue
        case "$b/$o" in db3/db3-nosync|db3-nosync/db3) continue ;; esac
        # a copy under a neutral name, so that only the message can name $b
        cp "$tmp/$b/test.db" "$tmp/wrong.db"
        fmt=$b
        [ "$b" = db3-nosync ] && fmt=db3
        run "$DBTOOL" "$tmp/wrong.db" "$o" show
        if [ "$rc" -eq 1 ] && grep -q -- "$fmt" "$ERR" && grep -q -- "$o" "$ERR"; then
            pass "$b file opened as $o fails naming both"
        else
            fail "$b file opened as $o fails naming both (exit $rc)"
        fi
    done
done
case " $BACKENDS " in
*" db3 "*" db3-nosync "*)
    expect 0 "a db3 file opens as db3-nosync" "$DBTOOL" "$tmp/db3/test.db" db3-nosync get user.a ;;
esac
printf 'this is not a database\0\1\2\3' >"$tmp/junk"
expect 1 "a file of no known format is refused" "$DBTOOL" "$tmp/junk" skiplist show
err_has "$tmp/junk" "the refusal names the file"

# ---- cvt_cyrusdb, every ordered pair ---------------------------------------
# a source file per backend with awkward bytes
printf '%s\n' 'set cvt.a 1' 'set cvt.b\x00nul \x00\x01\x02' 'set cvt.c\xff \xff\xfe\x0a\x0d\x09' \
    'set cvt.empty ' 'set user.x.y mailbox' 'set user.x-y other' \
    'set cvt.\x00 nul' 'set cvt.\x0d cr' 'set cvt.\x80 high' >"$tmp/cvt.in"
i=0
while [ $i -lt 300 ]; do echo "set bulk.$i value-$i"; i=$((i + 1)); done >>"$tmp/cvt.in"
for a in $BACKENDS; do
    mkdir -p "$tmp/cvt"
    run sh -c '"$1" -x -n "$2" "$3" batch <"$4"' sh "$DBTOOL" "$tmp/cvt/src.$a" "$a" "$tmp/cvt.in"
    if [ "$rc" -ne 0 ]; then fail "cvt: making the $a source file"; continue; fi
    "$DBTOOL" -x "$tmp/cvt/src.$a" "$a" show >"$tmp/cvt/src.$a.show" 2>"$ERR"
    for c in $BACKENDS; do
        [ "$a" = "$c" ] && continue
        new="$tmp/cvt/new.$a.$c"
        run "$CVT" "$tmp/cvt/src.$a" "$a" "$new" "$c"
        if [ "$rc" -eq 0 ] && grep -q 'verified 309 records' "$OUT"; then
            pass "cvt_cyrusdb $a -> $c converts and verifies 309 records"
        else
            fail "cvt_cyrusdb $a -> $c (exit $rc: $(cat "$OUT"))"
            continue
        fi
        "$DBTOOL" -x "$new" "$c" show >"$tmp/cvt/show" 2>"$ERR"
        if cmp -s "$tmp/cvt/show" "$tmp/cvt/src.$a.show"; then
            pass "cvt_cyrusdb $a -> $c: the new file shows the same bytes"
        else
            fail "cvt_cyrusdb $a -> $c: the new file shows the same bytes"
        fi
    done
done
set -- $BACKENDS
if [ $# -ge 2 ]; then
    a=$1 c=$2
    new="$tmp/cvt/new.$a.$c"
    if [ -e "$new" ]; then
        cksum <"$new" >"$tmp/ck1"
        expect 1 "cvt_cyrusdb refuses an existing new file" "$CVT" "$tmp/cvt/src.$a" "$a" "$new" "$c"
        err_has "$new" "the refusal names the new file"
        cksum <"$new" >"$tmp/ck2"
        if cmp -s "$tmp/ck1" "$tmp/ck2"; then pass "the refused new file is untouched"; else fail "the refused new file is untouched"; fi
        expect 0 "cvt_cyrusdb -f replaces an existing new file" "$CVT" -f "$tmp/cvt/src.$a" "$a" "$new" "$c"
    fi
    expect 1 "cvt_cyrusdb refuses to convert a file onto itself" "$CVT" -f "$tmp/cvt/src.$a" "$a" "$tmp/cvt/src.$a" "$c"
    expect 1 "cvt_cyrusdb with a missing old file fails" "$CVT" "$tmp/cvt/nosuch" "$a" "$tmp/cvt/never" "$c"
    err_has "$tmp/cvt/nosuch" "the message names the missing file"
    if [ -e "$tmp/cvt/never" ]; then fail "no new file after a failed open"; else pass "no new file after a failed open"; fi
    expect 1 "cvt_cyrusdb with the wrong old backend fails" "$CVT" "$tmp/cvt/src.$a" "$c" "$tmp/cvt/never" "$a"
    if [ -e "$tmp/cvt/never" ]; then fail "no new file after a wrong backend"; else pass "no new file after a wrong backend"; fi
fi
# verification failure: flat files written by hand with a repeated key and
# with lines out of order; flat walks the lines as they stand, so the copy
# differs from what the old file walks and looks up; the new file must go
case " $BACKENDS " in
*" flat "*)
    printf 'a\t1\na\t2\nb\t3\n' >"$tmp/cvt/dup.flat"
    printf 'b\t1\na\t2\nc\t3\n' >"$tmp/cvt/disorder.flat"
    for src in dup disorder; do
        for c in $BACKENDS; do
            [ "$c" = flat ] && continue
            run "$CVT" "$tmp/cvt/$src.flat" flat "$tmp/cvt/bad.$src.$c" "$c"
            if [ "$rc" -eq 1 ] && [ ! -e "$tmp/cvt/bad.$src.$c" ] && [ ! -e "$tmp/cvt/bad.$src.$c-lock" ] &&
               grep -q "verify\|failed" "$ERR" && grep -q "removed" "$ERR"; then
                pass "cvt_cyrusdb: a $src flat file fails verification into $c and the new file is removed"
            else
                fail "cvt_cyrusdb: a $src flat file fails verification into $c and the new file is removed (exit $rc)"
            fi
        done
    done ;;
esac
# a plain-order skiplist given with -M: its key order is checked before
# anything is copied; refused as a usage error, saying which order it is
# in, and no new file is made
case " $BACKENDS " in
*" skiplist "*)
    for c in $BACKENDS; do
        [ "$c" = skiplist ] && continue
        run "$CVT" -M "$tmp/cvt/src.skiplist" skiplist "$tmp/cvt/bad.M.$c" "$c"
        if [ "$rc" -eq 2 ] && [ ! -e "$tmp/cvt/bad.M.$c" ] && [ ! -e "$tmp/cvt/bad.M.$c-lock" ] &&
           grep -q "in byte order.*leave out -M" "$ERR"; then
            pass "cvt_cyrusdb -M on a plain-order skiplist is refused (byte order: leave out -M), no $c file made"
        else
            fail "cvt_cyrusdb -M on a plain-order skiplist is refused, no $c file made (exit $rc)"
        fi
    done ;;
esac

# ---- ctl_cyrusdb -------------------------------------------------------------
cdir="$tmp/ctl"
mkdir -p "$cdir"
n=0
for b in $BACKENDS; do
    "$DBTOOL" -n "$cdir/$b.db" "$b" set "ctl.key" "value of $b" >/dev/null 2>"$ERR" &&
        "$DBTOOL" "$cdir/$b.db" "$b" set "ctl.key2" "second" >/dev/null 2>"$ERR" &&
        n=$((n + 1))
done
printf '\241\002\213\015twoskip file\0\0\0\0rest' >"$cdir/foreign.db"
run "$CTL" -d "$cdir" -r
if [ "$rc" -eq 0 ]; then pass "ctl_cyrusdb -r on a directory with every backend"; else fail "ctl_cyrusdb -r (exit $rc)"; fi
for b in $BACKENDS; do
    if grep -q "^$cdir/$b.db: .*recovered, consistent" "$OUT"; then pass "ctl_cyrusdb -r reports $b.db recovered and consistent"
    else fail "ctl_cyrusdb -r reports $b.db recovered and consistent"; fi
    run2=$("$DBTOOL" "$cdir/$b.db" "$b" get ctl.key 2>/dev/null)
    if [ "$run2" = "value of $b" ]; then pass "$b.db readable after ctl_cyrusdb -r"; else fail "$b.db readable after ctl_cyrusdb -r"; fi
done
if grep -q "^$cdir/foreign.db: twoskip: .*skipped" "$OUT"; then pass "ctl_cyrusdb -r skips a twoskip file"; else fail "ctl_cyrusdb -r skips a twoskip file"; fi
if grep -q "$n databases done" "$OUT"; then pass "ctl_cyrusdb -r counts $n databases"; else fail "ctl_cyrusdb -r counts $n databases: $(tail -1 "$OUT")"; fi

run "$CTL" -d "$cdir" -c
cp "$OUT" "$tmp/ctl.out"
if [ "$rc" -eq 0 ]; then pass "ctl_cyrusdb -c on a directory with every backend"; else fail "ctl_cyrusdb -c (exit $rc)"; fi
for b in $BACKENDS; do
    if grep -q "^$cdir/$b.db: .*\(checkpointed\|nothing to checkpoint\)" "$tmp/ctl.out"; then pass "ctl_cyrusdb -c reports $b.db"
    else fail "ctl_cyrusdb -c reports $b.db"; fi
    run "$DBTOOL" "$cdir/$b.db" "$b" show
    same_text "$OUT" "ctl.key${TAB}value of $b${NL}ctl.key2${TAB}second${NL}" "$b.db intact after ctl_cyrusdb -c"
done
printf 'configdirectory: %s\n' "$cdir" >"$tmp/imapd.conf"
# run as root, ctl_cyrusdb -C becomes cyrus_user (tested with a master in
# test_admin_tools.py); this private directory stays root's
if [ "$(id -u)" -eq 0 ]; then echo "cyrus_user: root" >>"$tmp/imapd.conf"; fi
run "$CTL" -C "$tmp/imapd.conf" -q -r
if [ "$rc" -eq 0 ] && [ ! -s "$OUT" ]; then pass "ctl_cyrusdb -C finds configdirectory; -q prints nothing"; else fail "ctl_cyrusdb -C -q -r (exit $rc)"; fi
printf 'configdirectory: %s\nmboxlist_db: nosuchdb\n' "$cdir" >"$tmp/bad.conf"
expect 1 "ctl_cyrusdb with a bad imapd.conf fails" "$CTL" -C "$tmp/bad.conf" -r
err_has "bad.conf" "the config error names the file"
set -- $BACKENDS
b=$1
expect 1 "cyr_dbtool with a bad imapd.conf fails" "$DBTOOL" -C "$tmp/bad.conf" "$cdir/$b.db" "$b" show
err_has "bad.conf" "the config error names the file"
# a damaged database makes ctl_cyrusdb -r fail but the others are still done
case " $BACKENDS " in
*" skiplist "*)
    cp "$cdir/skiplist.db" "$cdir/zz-damaged.db"
    # keep the magic, make the header's numbers absurd
    printf '\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377\377' |
        dd of="$cdir/zz-damaged.db" bs=1 seek=20 conv=notrunc 2>/dev/null
    run "$CTL" -d "$cdir" -r
    if [ "$rc" -eq 1 ] && grep -q "zz-damaged.db" "$ERR" && grep -q "^$cdir/lmdb.db\|^$cdir/skiplist.db" "$OUT"; then
        pass "ctl_cyrusdb -r fails on a damaged skiplist, names it, and does the others"
    else
        fail "ctl_cyrusdb -r on a damaged skiplist (exit $rc)"
    fi
    rm -f "$cdir/zz-damaged.db" ;;
esac

# ---- dbbench, a tiny run ---------------------------------------------------
run "$BENCH" -q -b "$b" -n 20 -k 200 -r 1 -d "$tmp" --markdown
if [ "$rc" -eq 0 ] && grep -q '^- machine: nproc=' "$OUT" && grep -q "^| $b " "$OUT" && ! grep -q ERR "$OUT"; then
    pass "dbbench runs a small $b table"
else
    fail "dbbench runs a small $b table (exit $rc)"
fi
if ls "$tmp" | grep -q '^dbbench\.'; then fail "dbbench removed its directory"; else pass "dbbench removed its directory"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
