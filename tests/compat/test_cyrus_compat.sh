#!/bin/sh
# test_cyrus_compat.sh - flat and skiplist files are byte-compatible with
# Cyrus IMAP 3.6 (Debian package cyrus-imapd, tools in /usr/lib/cyrus/bin).
#
# For each of flat and skiplist, both ways:
#   - Cyrus's cyr_dbtool writes records (keys out of order, spaces, NUL,
#     CR, TAB in values, bytes >= 0x80, empty values) and ours reads them:
#     `show` output is byte-identical, and ours finds the file consistent;
#   - ours writes (also newlines in values, which Cyrus's command line
#     cannot carry) and Cyrus's reads: identical `show`, Cyrus says
#     consistent; then Cyrus changes our file and ours reads the result;
#   - a checkpoint by either side is read by the other.
# And conversions: Cyrus's cvt_cyrusdb turns our skiplist into its flat and
# back; our cvt_cyrusdb converts Cyrus-written files, and Cyrus reads ours.
#
# Cyrus's tools take `-C imapd.conf` (which must set configdirectory) and
# absolute file names; `-n` creates; `set`/`get`/`delete` without a key read
# KEY<TAB>VALUE lines from stdin (the only way to pass NUL and other control
# bytes).  Run as root they switch to the user `cyrus`, so the test
# directory is handed to that user.  Exit 0 pass, 1 fail, 77 skip.
set -u

: "${top_builddir:?top_builddir must be set}"
CYRUS_BIN="${CYRUS_BIN:-/usr/lib/cyrus/bin}"
DBTOOL="$top_builddir/tools/cyr_dbtool"
CVT="$top_builddir/tools/cvt_cyrusdb"

if [ ! -x "$CYRUS_BIN/cyr_dbtool" ] || [ ! -x "$CYRUS_BIN/cvt_cyrusdb" ]; then
    echo "SKIP: Cyrus IMAP tools not found in $CYRUS_BIN (apt-get install cyrus-imapd)"
    exit 77
fi
for p in "$DBTOOL" "$CVT"; do
    if [ ! -x "$p" ]; then
        echo "missing $p (run make first)"
        echo "0 passed, 1 failed"
        exit 1
    fi
done
if [ "$(id -u)" -eq 0 ] && ! id cyrus >/dev/null 2>&1; then
    echo "SKIP: running as root but there is no user cyrus for Cyrus's tools to switch to"
    exit 77
fi

base=${TEST_TMPDIR:-$top_builddir/tests/tmp}
mkdir -p "$base" || exit 1
tmp=$(mktemp -d "$base/compat.XXXXXX") || exit 1
tmp=$(cd "$tmp" && pwd)     # Cyrus's tools want absolute names
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
trap 'rm -rf "$tmp"; exit 1' INT TERM HUP

conf="$tmp/imapd.conf"
mkdir -p "$tmp/config"
printf 'configdirectory: %s/config\n' "$tmp" >"$conf"

# hand files to the user Cyrus's tools run as
give() {
    if [ "$(id -u)" -eq 0 ]; then chown -R cyrus:mail "$tmp"; fi
}
give

cyr() { "$CYRUS_BIN/cyr_dbtool" -C "$conf" "$@"; }
cyr_cvt() { "$CYRUS_BIN/cvt_cyrusdb" -C "$conf" "$@"; }

# Can Cyrus's tool work here at all (it must reach the build tree as cyrus)?
if ! cyr -n "$tmp/probe.db" flat set probe 1 >/dev/null 2>&1 ||
   [ "$(cyr "$tmp/probe.db" flat get probe 2>/dev/null)" != 1 ]; then
    echo "SKIP: Cyrus's cyr_dbtool cannot write in $tmp (as user cyrus, every"
    echo "      directory above it must be searchable by that user)"
    exit 77
fi
rm -f "$tmp/probe.db"

passed=0
failed=0
pass() { passed=$((passed + 1)); echo "PASS: $1"; }
fail() { failed=$((failed + 1)); echo "FAIL: $1"; }

# same A B DESC: files A and B are byte-identical and A is not empty
same() {
    if [ -s "$1" ] && cmp -s "$1" "$2"; then
        pass "$3"
    else
        fail "$3"
        # the first line that differs, from both files, as od -c shows it
        line=$(cmp "$1" "$2" 2>&1 | sed -n 's/.* line \([0-9]*\).*/\1/p')
        [ -n "$line" ] || line=1
        for same_f in "$1" "$2"; do
            printf '%s\n' "    $(basename "$same_f") ($(wc -l <"$same_f" 2>/dev/null) lines) line $line: $(sed -n "${line}p" "$same_f" 2>/dev/null | od -An -c | tr -s ' \n' ' ')"
        done
    fi
}

# status WANT DESC CMD...: CMD exits with WANT (output discarded)
status() {
    want=$1 desc=$2
    shift 2
    "$@" >"$tmp/status.out" 2>"$tmp/status.err"
    got=$?
    if [ "$got" -eq "$want" ]; then pass "$desc"
    else
        fail "$desc (exit $got, want $want)"
        sed -n '1,3s/^/    /p' "$tmp/status.err"
    fi
}

# Records Cyrus's command line can carry: KEY<TAB>VALUE lines on stdin
# hold any byte but newline (and TAB in keys).
printf 'k\001\377 z\tval\\ue\r\001\n' >"$tmp/awkward.in"
printf 'n\000ul\tv\000x\ty\n' >>"$tmp/awkward.in"
printf 'high\t\200\377\376\n' >>"$tmp/awkward.in"
printf 'tabs\ta\tb\t\tc\n' >>"$tmp/awkward.in"
printf 'A.upper\tcapital\n' >>"$tmp/awkward.in"

# The same sort of records for ours, as an escaped batch (plus newlines)
cat >"$tmp/ours.batch" <<'EOF'
set user.b value b
set user.a a value
set	key with spaces	value with  spaces
set empty 
set zz.last z
set k\x01\xff z val\x5cue\x0d\x01
set n\x00ul v\x00x\x09y
set high \x80\xff\xfe
set tabs a\x09b\x09\x09c
set lf.value line one\x0aline two\x0a
set cr.key\x0d cr
set A.upper capital
EOF

for be in flat skiplist; do
    d="$tmp/$be"
    mkdir -p "$d"
    give

    # ---- Cyrus writes, ours reads -------------------------------------------
    cf="$d/cyrus.db"
    ok=1
    cyr -n "$cf" "$be" set user.b "value b" >/dev/null 2>&1 || ok=0
    cyr "$cf" "$be" set user.a "a value" >/dev/null 2>&1 || ok=0
    cyr "$cf" "$be" set "key with spaces" "value with  spaces" >/dev/null 2>&1 || ok=0
    cyr "$cf" "$be" set empty "" >/dev/null 2>&1 || ok=0
    cyr "$cf" "$be" set zz.last z >/dev/null 2>&1 || ok=0
    cyr "$cf" "$be" set <"$tmp/awkward.in" >/dev/null 2>&1 || ok=0
    cyr "$cf" "$be" set doomed "to be deleted" >/dev/null 2>&1 || ok=0
    cyr "$cf" "$be" delete doomed >/dev/null 2>&1 || ok=0
    if [ $ok -eq 1 ]; then pass "$be: Cyrus's cyr_dbtool writes a test file"; else fail "$be: Cyrus's cyr_dbtool writes a test file"; fi

    cyr "$cf" "$be" show >"$d/cyrus.show" 2>/dev/null
    if [ "$(wc -l <"$d/cyrus.show")" -eq 10 ]; then pass "$be: Cyrus shows 10 records of its own file"
    else fail "$be: Cyrus shows 10 records of its own file ($(wc -l <"$d/cyrus.show"))"; fi
    "$DBTOOL" "$cf" "$be" show >"$d/ours.show" 2>"$d/err"
    same "$d/ours.show" "$d/cyrus.show" "$be: our show of Cyrus's file is byte-identical to Cyrus's show"
    "$DBTOOL" "$cf" "$be" show user. >"$d/ours.show" 2>"$d/err"
    cyr "$cf" "$be" show user. >"$d/cyrus.show" 2>/dev/null
    same "$d/ours.show" "$d/cyrus.show" "$be: show PREFIX of Cyrus's file is identical"
    status 0 "$be: ours finds Cyrus's file consistent" "$DBTOOL" "$cf" "$be" consistent
    got=$("$DBTOOL" -x "$cf" "$be" get 'n\x00ul' 2>/dev/null)
    if [ "$got" = 'v\x00x\x09y' ]; then pass "$be: ours gets a NUL-holding key written by Cyrus"
    else fail "$be: ours gets a NUL-holding key written by Cyrus (got '$got')"; fi
    if [ "$be" = skiplist ]; then
        # the file ends with Cyrus's log of commits; a repack by Cyrus
        # gives a file with no log, read again by ours
        cyr "$cf" "$be" repack >/dev/null 2>&1
        cyr "$cf" "$be" show >"$d/cyrus.show" 2>/dev/null
        "$DBTOOL" "$cf" "$be" show >"$d/ours.show" 2>"$d/err"
        same "$d/ours.show" "$d/cyrus.show" "$be: ours reads a file repacked by Cyrus"
    fi

    # an empty database made by Cyrus
    cyr -n "$d/cyrus-empty.db" "$be" show >/dev/null 2>&1
    if [ -e "$d/cyrus-empty.db" ]; then
        "$DBTOOL" "$d/cyrus-empty.db" "$be" show >"$d/ours.show" 2>"$d/err"
        if [ $? -eq 0 ] && [ ! -s "$d/ours.show" ]; then pass "$be: ours reads an empty database made by Cyrus"
        else fail "$be: ours reads an empty database made by Cyrus"; fi
    else
        fail "$be: Cyrus made an empty database"
    fi

    # ---- ours writes, Cyrus reads ---------------------------------------------
    of="$d/ours.db"
    status 0 "$be: ours writes a test file" sh -c '"$1" -x -n "$2" "$3" batch <"$4"' sh "$DBTOOL" "$of" "$be" "$tmp/ours.batch"
    "$DBTOOL" "$of" "$be" set doomed "to be deleted" >/dev/null 2>&1
    "$DBTOOL" "$of" "$be" delete doomed >/dev/null 2>&1
    give
    "$DBTOOL" "$of" "$be" show >"$d/ours.show" 2>"$d/err"
    if [ "$(grep -c . "$d/ours.show")" -ge 12 ]; then pass "$be: ours shows its records"; else fail "$be: ours shows its records"; fi
    cyr "$of" "$be" show >"$d/cyrus.show" 2>/dev/null
    same "$d/cyrus.show" "$d/ours.show" "$be: Cyrus's show of our file is byte-identical to ours"
    got=$(cyr "$of" "$be" consistent 2>/dev/null)
    if [ "$got" = "Yes, consistent" ]; then pass "$be: Cyrus finds our file consistent"; else fail "$be: Cyrus finds our file consistent ($got)"; fi
    got=$(cyr "$of" "$be" get "key with spaces" 2>/dev/null)
    if [ "$got" = "value with  spaces" ]; then pass "$be: Cyrus gets a value from our file"; else fail "$be: Cyrus gets a value from our file ($got)"; fi

    # Cyrus changes our file; ours reads the result
    cyr "$of" "$be" set user.c "added by cyrus" >/dev/null 2>&1
    cyr "$of" "$be" delete user.a >/dev/null 2>&1
    cyr "$of" "$be" set zz.last "replaced by cyrus" >/dev/null 2>&1
    cyr "$of" "$be" show >"$d/cyrus.show" 2>/dev/null
    "$DBTOOL" "$of" "$be" show >"$d/ours.show" 2>"$d/err"
    same "$d/ours.show" "$d/cyrus.show" "$be: ours reads our file after Cyrus changed it"
    if grep -q "^user.c	added by cyrus\$" "$d/ours.show" && ! grep -q '^user.a	' "$d/ours.show"; then
        pass "$be: Cyrus's set and delete show in our reading"
    else
        fail "$be: Cyrus's set and delete show in our reading"
    fi
    status 0 "$be: ours finds the file consistent after Cyrus's changes" "$DBTOOL" "$of" "$be" consistent

    # our checkpoint, read by Cyrus
    status 0 "$be: our checkpoint" "$DBTOOL" "$of" "$be" checkpoint
    give
    cyr "$of" "$be" show >"$d/cyrus.show" 2>/dev/null
    same "$d/cyrus.show" "$d/ours.show" "$be: Cyrus reads our file after our checkpoint"
    got=$(cyr "$of" "$be" consistent 2>/dev/null)
    if [ "$got" = "Yes, consistent" ]; then pass "$be: Cyrus finds our checkpointed file consistent"; else fail "$be: Cyrus finds our checkpointed file consistent ($got)"; fi

    # an empty database made by ours
    "$DBTOOL" -n "$d/ours-empty.db" "$be" show >/dev/null 2>&1
    give
    got=$(cyr "$d/ours-empty.db" "$be" show 2>/dev/null | wc -c)
    if [ -e "$d/ours-empty.db" ] && [ "$got" -eq 0 ] &&
       [ "$(cyr "$d/ours-empty.db" "$be" consistent 2>/dev/null)" = "Yes, consistent" ]; then
        pass "$be: Cyrus reads an empty database made by ours"
    else
        fail "$be: Cyrus reads an empty database made by ours"
    fi

    # Keys with bytes >= 0x80 and control bytes.  Cyrus orders skiplist
    # files by signed chars and flat files by their escaped form (NUL, TAB,
    # LF, CR and 0xff become two bytes starting with 0xff), and its walks
    # follow the file, so for such keys its walk order is not plain unsigned
    # byte order.  Ours keeps the file in Cyrus's order but walks in the
    # API's order (cyrusdb_compare: unsigned bytes), so the two walks differ
    # by design.  Checked apart:
    #   - every key is found by the other side (the files are usable),
    #   - the same records are shown (as sets),
    #   - ours shows them in unsigned byte order (high.api, written out by
    #     hand: sort(1) cannot order lines by key alone when a key is a
    #     prefix of another or holds bytes below TAB),
    #   - both sides find the file consistent.
    hc="$d/cyrus-high.db"
    ho="$d/ours-high.db"
    printf 'a\t1\n\377z\t2\n\200\t3\nb\t4\n\177\t5\nn\000ul\t6\nne\t7\n\rk\t8\n' >"$d/high.in"
    printf 'a\n\377z\n\200\nb\n\177\nn\000ul\nne\n\rk\n' >"$d/high.keys"
    printf '1\n2\n3\n4\n5\n6\n7\n8\n' >"$d/high.values"
    printf '\rk\t8\na\t1\nb\t4\nn\000ul\t6\nne\t7\n\177\t5\n\200\t3\n\377z\t2\n' >"$d/high.api"
    cyr -n "$hc" "$be" set <"$d/high.in" >/dev/null 2>&1
    sh -c '"$1" -n "$2" "$3" set <"$4"' sh "$DBTOOL" "$ho" "$be" "$d/high.in" >/dev/null 2>&1
    give
    for side in cyrus ours; do
        if [ $side = cyrus ]; then hf=$hc; who="written by Cyrus"; else hf=$ho; who="written by ours"; fi
        "$DBTOOL" "$hf" "$be" get <"$d/high.keys" >"$d/ours.get" 2>"$d/err"
        same "$d/ours.get" "$d/high.values" "$be: high/control-byte keys $who: ours finds every key"
        cyr "$hf" "$be" get <"$d/high.keys" >"$d/cyrus.get" 2>/dev/null
        same "$d/cyrus.get" "$d/high.values" "$be: high/control-byte keys $who: Cyrus finds every key"
        cyr "$hf" "$be" show >"$d/cyrus.show" 2>/dev/null
        "$DBTOOL" "$hf" "$be" show >"$d/ours.show" 2>"$d/err"
        LC_ALL=C sort "$d/cyrus.show" >"$d/cyrus.sorted"
        LC_ALL=C sort "$d/ours.show" >"$d/ours.sorted"
        same "$d/ours.sorted" "$d/cyrus.sorted" "$be: high/control-byte keys $who: both show the same records"
        same "$d/ours.show" "$d/high.api" "$be: high/control-byte keys $who: ours walks them in unsigned byte order"
        status 0 "$be: high/control-byte keys $who: ours finds the file consistent" "$DBTOOL" "$hf" "$be" consistent
        got=$(cyr "$hf" "$be" consistent 2>/dev/null)
        if [ "$got" = "Yes, consistent" ]; then pass "$be: high/control-byte keys $who: Cyrus finds the file consistent"
        else fail "$be: high/control-byte keys $who: Cyrus finds the file consistent ($got)"; fi
    done
done

# ---- conversions -----------------------------------------------------------
c="$tmp/cvt"
mkdir -p "$c"
give
src="$tmp/skiplist/ours.db"
"$DBTOOL" "$src" skiplist show >"$c/src.show" 2>/dev/null

status 0 "Cyrus's cvt_cyrusdb converts our skiplist to its flat" cyr_cvt "$src" skiplist "$c/cyrus.flat" flat
status 0 "Cyrus's cvt_cyrusdb converts that flat back to skiplist" cyr_cvt "$c/cyrus.flat" flat "$c/cyrus.skip" skiplist
"$DBTOOL" "$c/cyrus.flat" flat show >"$c/show" 2>/dev/null
same "$c/show" "$c/src.show" "ours reads Cyrus's flat made from our skiplist: identical"
"$DBTOOL" "$c/cyrus.skip" skiplist show >"$c/show" 2>/dev/null
same "$c/show" "$c/src.show" "ours reads Cyrus's skiplist made from that flat: identical"
status 0 "ours finds Cyrus's converted skiplist consistent" "$DBTOOL" "$c/cyrus.skip" skiplist consistent

# our cvt_cyrusdb on Cyrus-written files, and Cyrus reads the results
for pair in "flat skiplist" "skiplist flat"; do
    set -- $pair
    from=$1 to=$2
    cf="$tmp/$from/cyrus.db"
    cyr "$cf" "$from" show >"$c/cyrus.$from.show" 2>/dev/null
    out=$("$CVT" "$cf" "$from" "$c/ours.$to" "$to" 2>&1)
    if [ $? -eq 0 ] && echo "$out" | grep -q "verified 10 records"; then
        pass "our cvt_cyrusdb converts Cyrus's $from to $to and verifies 10 records"
    else
        fail "our cvt_cyrusdb converts Cyrus's $from to $to ($out)"
    fi
    give
    cyr "$c/ours.$to" "$to" show >"$c/show" 2>/dev/null
    same "$c/show" "$c/cyrus.$from.show" "Cyrus reads our $to converted from its $from: identical"
    got=$(cyr "$c/ours.$to" "$to" consistent 2>/dev/null)
    if [ "$got" = "Yes, consistent" ]; then pass "Cyrus finds our converted $to consistent"; else fail "Cyrus finds our converted $to consistent ($got)"; fi
done

# Cyrus's cvt_cyrusdb from a skiplist written and changed by both sides
"$DBTOOL" "$tmp/flat/ours.db" flat show >"$c/flat.show" 2>/dev/null
status 0 "Cyrus's cvt_cyrusdb converts our flat to its skiplist" cyr_cvt "$tmp/flat/ours.db" flat "$c/cyrus2.skip" skiplist
"$DBTOOL" "$c/cyrus2.skip" skiplist show >"$c/show" 2>/dev/null
same "$c/show" "$c/flat.show" "ours reads Cyrus's skiplist made from our flat: identical"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
