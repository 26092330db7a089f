#!/usr/bin/env bash
# servers.sh - set up, start and stop the mail servers of the benchmark
# suite, each PRIVATELY: its own configuration files and data directory
# (on the real disk unless a directory on tmpfs is given), listeners on a
# UNIX socket and on 127.0.0.1 only, every process started by us and
# stopped by PID.  System-wide services and /etc are never touched.
#
# Servers:
#   ours     our master with lmtpd (UNIX socket + 127.0.0.1:PORT, -a) and
#            imapd (127.0.0.1:PORT), from a build directory
#   cyrus    Cyrus IMAP 3.6 from Debian (/usr/lib/cyrus/bin): master,
#            lmtpd (UNIX socket), imapd (127.0.0.1:PORT)
#   dovecot  Dovecot 2.3 from Debian: dovecot-core + dovecot-lmtpd
#            installed, imap/imap-login from the dovecot-imapd .deb
#            unpacked privately (it conflicts with cyrus-imapd)
#
# Listen backlog: Cyrus's master gets -l 128 (our master's default; its
# own default of 32 drops connections when 100 clients connect at once).
#
# Every server keeps its DEFAULT durability: ours spool_sync journal,
# Cyrus's fsyncs (skiplist/twoskip, message files, index), Dovecot's
# mail_fsync=optimized.  Users u0001..uN (BENCH_USERS, default 2000) log
# in with the password "pw"; recipients uNNNN@example.com land in that
# user's INBOX.
#
# As a library:  . bench/servers.sh
#   srv_setup SERVER DIR [KEY=VALUE...]   configs + data + mailboxes in DIR
#   srv_clone SRCDIR DSTDIR               a fresh copy of a set-up DIR
#   srv_start DIR                         start; waits until LMTP and IMAP answer
#   srv_stop DIR                          stop by PID, check nothing is left
#                                         (1: something is left; 2: stopped,
#                                         but a worker of ours crashed)
#   srv_lmtp DIR / srv_lmtp_tcp DIR / srv_imap DIR   targets for clients
#   srv_version SERVER                    one line: name and version
#   srv_count DIR USER                    messages in USER's INBOX (via IMAP)
# As a command:
#   bench/servers.sh setup SERVER DIR [KEY=VALUE...]
#   bench/servers.sh start|stop|status DIR
#   bench/servers.sh clone SRCDIR DSTDIR | remove DIR
#   bench/servers.sh version SERVER
#   bench/servers.sh count DIR USER | count-all DIR   (messages, over IMAP)
#
# KEY=VALUE for ours: prefork=N maxchild=N (lmtpunix service; defaults 5
# and 20), imap_prefork=N imap_maxchild=N, partition=DIR (the spool's
# directory, e.g. on tmpfs), build=DIR (another build directory than
# BENCH_BUILD, e.g. the code before a change), and any imapd.conf key (duplicate_db=lmdb
# mboxlist_db=lmdb spool_sync=off stage_dirs=1 ...).  For cyrus:
# prefork=N maxchild=N (defaults 0 and 20, Debian's /etc/cyrus.conf) and
# imapd.conf keys.  For dovecot: format=sdbox
# (default) | mdbox | maildir, and any dovecot.conf top-level key.  For
# every server: sieve=filing|filing-own|vacation gives every user that
# active Sieve script (srv_sieve_text), put in with the server's own
# means, and a counting `sendmail` in DIR; srv_sieve_check DIR counts
# the messages, the flagged ones and the replies after a run.  With
# smtp=sink (and sieve=...) the replies go over SMTP instead, to an
# smtp-sink of the server's own on 127.0.0.1:PORT, started and stopped
# with the server and counting what it gets (DIR/sink.out): ours and
# Cyrus with `smtp_backend: host` + `smtp_host: 127.0.0.1:PORT`, Dovecot
# with `submission_host`; each server keeps one connection per process
# or opens one per reply as it does on its own.
#
# Environment: BENCH_BUILD (our build directory, default ./build),
# BENCH_USERS (2000), BENCH_CACHE (/var/cache/mailbench: the
# dovecot-imapd .deb), BENCH_QUIET=1 (no progress on stderr).

BENCH_USERS=${BENCH_USERS:-2000}
SMTP_SINK=${SMTP_SINK:-$(command -v smtp-sink || echo /usr/sbin/smtp-sink)}
BENCH_CACHE=${BENCH_CACHE:-/var/cache/mailbench}
BENCH_SERVERNAME=bench.example
BENCH_DOMAIN=example.com
BENCH_PASSWORD=pw
BENCH_ADMIN=benchadmin
CYRUS_BIN=${CYRUS_BIN:-/usr/lib/cyrus/bin}

srv_log() { [[ ${BENCH_QUIET:-0} == 1 ]] || echo "servers: $*" >&2; }
srv_die() { echo "servers: $*" >&2; return 1; }

srv_build_dir() {
    local b=${BENCH_BUILD:-}
    [[ -n $b ]] || b=${top_builddir:-$(pwd)/build}
    (cd "$b" 2>/dev/null && pwd) || srv_die "no build directory $b (set BENCH_BUILD)"
}

# A free TCP port on 127.0.0.1 (the kernel picks it).
srv_free_port() {
    python3 -c 'import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Read DIR/bench.env into srv_* variables (SERVER LMTP LMTP_TCP IMAP PIDFILE ...).
srv_env() {
    local d=$1
    [[ -f $d/bench.env ]] || { srv_die "$d is not a set-up server directory"; return 1; }
    # shellcheck disable=SC1091
    . "$d/bench.env"
}

srv_lmtp() { (srv_env "$1" && echo "$LMTP"); }
srv_lmtp_tcp() { (srv_env "$1" && echo "$LMTP_TCP"); }
srv_imap() { (srv_env "$1" && echo "$IMAP"); }
srv_server() { (srv_env "$1" && echo "$SERVER"); }

srv_version() {
    case $1 in
    ours)
        local b; b=$(srv_build_dir) || return 1
        local v
        v=$(sed -n 's/^#define PACKAGE_VERSION "\(.*\)"/\1/p' "$b/config.h" 2>/dev/null)
        local rev
        rev=$(git -C "$(dirname "${BASH_SOURCE[0]}")/.." rev-parse --short HEAD 2>/dev/null || echo unknown)
        echo "ours ${v:-?} (git $rev)" ;;
    cyrus) echo "cyrus-imapd $(dpkg-query -W -f='${Version}' cyrus-imapd 2>/dev/null || echo '?')" ;;
    dovecot) echo "dovecot $(dovecot --version 2>/dev/null || echo '?') (dovecot-core $(dpkg-query -W -f='${Version}' dovecot-core 2>/dev/null), imap from $(basename "$(srv_dovecot_deb 2>/dev/null || echo none)"))" ;;
    *) srv_die "unknown server $1" ;;
    esac
}

# The users' names, one per line.
srv_users() { seq -f 'u%04g' 1 "$BENCH_USERS"; }

# A sasldb (Berkeley DB hash, the format of Debian's libsasl2) with every
# user's and the admin's password in realm $BENCH_SERVERNAME, written in
# one go with db5.3_load (saslpasswd2 per user costs ~25 ms: 50 s for
# 2,000 users).  One user is then checked with sasldblistusers2.
srv_make_sasldb() {   # FILE
    local f=$1
    rm -f "$f"
    { printf 'VERSION=3\nformat=print\ntype=hash\nHEADER=END\n'
      { srv_users; echo "$BENCH_ADMIN"; } | awk -v r="$BENCH_SERVERNAME" -v p="$BENCH_PASSWORD" \
          '{ printf " %s\\00%s\\00userPassword\n %s\n", $1, r, p }'
      echo DATA=END; } | db5.3_load "$f" || { srv_die "db5.3_load failed"; return 1; }
    sasldblistusers2 -f "$f" 2>/dev/null | grep "^u0001@$BENCH_SERVERNAME:" >/dev/null ||
        { srv_die "sasldb $f does not list u0001"; return 1; }
    chmod 640 "$f"
}

# Wait until an LMTP (220) or IMAP (* OK) server answers at TARGET
# (a socket path or host:port); TIMEOUT seconds.
srv_probe() {   # TARGET KIND(lmtp|imap) TIMEOUT [PID]
    python3 - "$@" <<'PY'
import os, socket, sys, time
target, kind, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
pid = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else 0
want = b"220" if kind == "lmtp" else b"* OK"
end = time.time() + timeout
last = "no answer"
while time.time() < end:
    if pid:
        try:
            os.kill(pid, 0)
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    raise ProcessLookupError
        except (ProcessLookupError, FileNotFoundError):
            print("%s %s: the server (pid %d) exited" % (kind, target, pid), file=sys.stderr)
            sys.exit(1)
    try:
        if target.startswith("/"):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2); s.connect(target)
        else:
            h, p = target.rsplit(":", 1)
            s = socket.create_connection((h, int(p)), timeout=2)
        line = s.recv(512)
        s.sendall(b"QUIT\r\n" if kind == "lmtp" else b"a LOGOUT\r\n")
        s.close()
        if line.startswith(want):
            sys.exit(0)
        last = repr(line[:80])
    except OSError as e:
        last = str(e)
    time.sleep(0.1)
print("%s %s: %s" % (kind, target, last), file=sys.stderr)
sys.exit(1)
PY
}

# Processes carrying BENCH_SERVER_TAG=DIR in their environment (every
# process a server of DIR started, whoever its parent is by now).
srv_tagged() {   # DIR
    local f pid
    for f in $(grep -lzxF "BENCH_SERVER_TAG=$1" /proc/[0-9]*/environ 2>/dev/null); do
        pid=${f#/proc/}; pid=${pid%/environ}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] || echo "$pid"
    done
}

# The CPU time of DIR's server so far, in clock ticks: "USER SYSTEM", the
# sums over its processes (srv_tagged) of utime + cutime and stime +
# cstime.  A process reaped by another of the server's is in its parent's
# c-times, one still running in its own, so the difference of two calls
# is what the server used between them, whatever exited meanwhile; the
# load tool and the smtp-sink carry no tag and are not counted.
srv_cpu_ticks() {   # DIR
    local pid u=0 s=0 a b
    for pid in $(srv_tagged "$1"); do
        read -r a b < <(awk '{ sub(/^.*\) /, ""); print $12 + $14, $13 + $15 }' \
            "/proc/$pid/stat" 2>/dev/null)
        [[ -n ${b:-} ]] || continue
        u=$((u + a)); s=$((s + b))
    done
    echo "$u $s"
}

# Run as the data's owner (the server's unprivileged user) when root.
srv_as_owner() {
    if [[ -n ${OWNER:-} && $(id -u) -eq 0 ]]; then
        setpriv --reuid="$OWNER" --regid="$(id -g "$OWNER")" --clear-groups "$@"
    else
        "$@"
    fi
}

# Split KEY=VALUE arguments: srv_kv_special gets the keys in $1 (space
# separated); the rest go to srv_kv_rest as "KEY: VALUE" lines.
srv_parse_kv() {   # "SPECIAL KEYS" KEY=VALUE...
    local special=" $1 " kv k; shift
    srv_kv_rest=()
    declare -gA srv_kv=()
    for kv in "$@"; do
        [[ $kv == *=* ]] || { srv_die "not KEY=VALUE: $kv"; return 1; }
        k=${kv%%=*}
        if [[ $special == *" $k "* ]]; then srv_kv[$k]=${kv#*=}
        else srv_kv_rest+=("$k: ${kv#*=}"); fi
    done
}

# smtp=sink: check it can be had, and choose the sink's port (SINKPORT).
srv_sink_setup() {   # VALUE
    SINKPORT=
    [[ -z ${1:-} ]] && return 0
    [[ $1 == sink ]] || { srv_die "smtp=$1: only smtp=sink"; return 1; }
    [[ -n ${srv_kv[sieve]:-} ]] || { srv_die "smtp=sink needs sieve=..."; return 1; }
    [[ -x $SMTP_SINK ]] || { srv_die "smtp=sink: no smtp-sink (Debian package postfix)"; return 1; }
    SINKPORT=$(srv_free_port)
}

# Start the server's smtp-sink (if it has one) and wait until it answers;
# -c writes its counters (mesg=N) to DIR/sink.out after every message.
srv_sink_start() {   # DIR
    local d=$1 port i user=()
    port=$(srv_env "$d" && echo "${SINK_PORT:-}") || return 1
    [[ -n $port ]] || return 0
    [[ $(id -u) -eq 0 ]] && user=(-u nobody)
    : > "$d/sink.out"
    "$SMTP_SINK" -c "${user[@]}" -h sink.bench.invalid "127.0.0.1:$port" 256 \
        >"$d/sink.out" 2>"$d/sink.err" </dev/null &
    echo $! > "$d/sink.pid"
    for ((i = 0; i < 100; i++)); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        kill -0 "$(cat "$d/sink.pid")" 2>/dev/null || break
        sleep 0.1
    done
    srv_die "smtp-sink on 127.0.0.1:$port did not start: $(cat "$d/sink.err")"
    srv_sink_stop "$d"
    return 1
}

srv_sink_stop() {   # DIR
    local d=$1 pid i
    [[ -s $d/sink.pid ]] || return 0
    pid=$(cat "$d/sink.pid")
    kill -TERM "$pid" 2>/dev/null
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    rm -f "$d/sink.pid"
    return 0
}

# Messages the server's smtp-sink has received (0 without one).
srv_sink_count() {   # DIR
    local n=0
    [[ -f $1/sink.out ]] &&
        n=$(tr '\r' '\n' < "$1/sink.out" | sed -n 's/.*mesg=\([0-9]*\).*/\1/p' | tail -1)
    echo "${n:-0}"
}

# Create DIR (absolute) and refuse one that already holds a server.
srv_newdir() {
    local d=$1
    [[ $d == /* ]] || { srv_die "$d: an absolute directory please"; return 1; }
    [[ -e $d/bench.env ]] && { srv_die "$d already holds a server (stop it and remove it first)"; return 1; }
    mkdir -p "$d" && chmod 755 "$d"
}

# --- ours -------------------------------------------------------------

srv_setup_ours() {   # DIR KEY=VALUE...
    local d=$1; shift
    local b p
    srv_parse_kv "prefork maxchild imap_prefork imap_maxchild partition sieve build smtp" "$@" || return 1
    srv_sink_setup "${srv_kv[smtp]:-}" || return 1
    if [[ -n ${srv_kv[build]:-} ]]; then
        b=$(cd "${srv_kv[build]}" 2>/dev/null && pwd) || { srv_die "no build directory ${srv_kv[build]}"; return 1; }
    else
        b=$(srv_build_dir) || return 1
    fi
    for p in master/master lmtpd/lmtpd imapd/imapd tools/mbtool; do
        [[ -x $b/$p ]] || { srv_die "missing $b/$p (build first, or set BENCH_BUILD)"; return 1; }
    done
    local prefork=${srv_kv[prefork]:-5} maxchild=${srv_kv[maxchild]:-20}
    local iprefork=${srv_kv[imap_prefork]:-2} imaxchild=${srv_kv[imap_maxchild]:-250}
    local partition=$d/spool
    [[ -n ${srv_kv[partition]:-} ]] && partition=${srv_kv[partition]%/}/$(basename "$d")
    mkdir -p "$d/conf" "$d/socket" "$partition"
    OWNER=
    if [[ $(id -u) -eq 0 ]] && id cyrus >/dev/null 2>&1; then OWNER=cyrus; fi
    {
        echo "configdirectory: $d/conf"
        echo "partition-default: $partition"
        echo "servername: $BENCH_SERVERNAME"
        echo "admins: $BENCH_ADMIN"
        echo "allowplaintext: yes"
        echo "sasl_pwcheck_method: auxprop"
        echo "sasl_auxprop_plugin: sasldb"
        echo "sasl_sasldb_path: $d/sasldb2"
        echo "sasl_mech_list: PLAIN LOGIN"
        [[ $(id -u) -eq 0 && -z $OWNER ]] && echo "cyrus_user: root"
        if [[ -n ${srv_kv[sieve]:-} ]]; then
            echo "sievedir: $d/sieve"
            echo "sendmail: $d/sendmail"
        fi
        if [[ -n $SINKPORT ]]; then
            echo "smtp_backend: host"
            echo "smtp_host: 127.0.0.1:$SINKPORT"
        fi
        ((${#srv_kv_rest[@]})) && printf '%s\n' "${srv_kv_rest[@]}"
    } > "$d/imapd.conf"
    if [[ -n ${srv_kv[sieve]:-} ]]; then
        srv_sieve_scripts "$d" "${srv_kv[sieve]}" "$b" || return 1
    fi
    local lport iport
    lport=$(srv_free_port) iport=$(srv_free_port)
    # START as in a real cyrus.conf: recovery (and, with spool_sync:
    # journal, the journal made or replayed) before the services
    cat > "$d/cyrus.conf" <<EOF
START {
  recover cmd="$b/tools/ctl_cyrusdb -C $d/imapd.conf -r"
}
SERVICES {
  lmtpunix cmd="$b/lmtpd/lmtpd" listen="$d/socket/lmtp" prefork=$prefork maxchild=$maxchild
  lmtp     cmd="$b/lmtpd/lmtpd -a" listen="127.0.0.1:$lport" prefork=0 maxchild=$maxchild
  imap     cmd="$b/imapd/imapd" listen="127.0.0.1:$iport" prefork=$iprefork maxchild=$imaxchild
}
EOF
    cat > "$d/bench.env" <<EOF
SERVER=ours
LMTP=$d/socket/lmtp
LMTP_TCP=127.0.0.1:$lport
IMAP=127.0.0.1:$iport
PIDFILE=$d/master.pid
LOG=$d/master.log
OWNER=$OWNER
PARTITION=$partition
BUILD=$b
EOF
    [[ -n $SINKPORT ]] && echo "SINK_PORT=$SINKPORT" >> "$d/bench.env"
    srv_make_sasldb "$d/sasldb2" || return 1
    if [[ -n $OWNER ]]; then
        chown -R "$OWNER:$(id -gn "$OWNER")" "$d" "$partition"
    fi
    # the mailboxes: 16 mbtool processes at a time (each create syncs)
    srv_log "ours: creating $BENCH_USERS mailboxes in $d"
    local as=(env)
    [[ -n $OWNER ]] && as=(setpriv --reuid="$OWNER" --regid="$(id -g "$OWNER")" --clear-groups)
    srv_users | sed 's/^/user./' |
        MBTOOL=$b/tools/mbtool CONF=$d/imapd.conf xargs -P 16 -n 50 "${as[@]}" \
            sh -c 'for m; do "$MBTOOL" -C "$CONF" create "$m" >/dev/null || exit 255; done' sh ||
        { srv_die "ours: mbtool create failed"; return 1; }
    local n
    n=$(srv_as_owner "$b/tools/mbtool" -C "$d/imapd.conf" list 'user.*' | wc -l)
    [[ $n -eq $BENCH_USERS ]] || { srv_die "ours: $n of $BENCH_USERS mailboxes created"; return 1; }
}

# The benchmark's Sieve script of KIND, the same for every server; @USER@
# stands for the user's name (uNNNN), replaced per user:
# filing: 20 rules, the same text for every user; the first 19 do not
#   match the load's messages (so each is evaluated), the 20th matches
#   every one of them ("mailbench message" in the Subject) and files it
#   into INBOX flagged \Flagged, so that a run can check that the script
#   ran (srv_sieve_check);
# filing-own: the same rules, but rule 18 names the user, so that every
#   user's text is different (nothing shared between users' scripts);
# vacation: an auto-reply to each message (the load gives each message
#   a sender of its own, mailbench --from-each: one reply per message,
#   however many a user gets), with the user's
#   address in :addresses as webmail filter editors write it (Cyrus's
#   lmtpd answers only mail whose To/Cc names the envelope recipient as
#   it sees it, the bare user name here, or one of :addresses).
srv_sieve_text() {   # KIND
    local i text
    case $1 in
    filing|filing-own)
        text='require ["fileinto", "imap4flags"];'$'\n'
        for ((i = 1; i <= 19; i++)); do
            if ((i % 2)); then
                text+="if header :contains \"subject\" \"topic-$i\" { fileinto \"INBOX\"; stop; }"$'\n'
            elif [[ $1 == filing-own && $i == 18 ]]; then
                text+="if address :is \"from\" \"boss-of-@USER@@lists.example\" { addflag \"\\\\Seen\"; }"$'\n'
            else
                text+="if address :is \"from\" \"list-$i@lists.example\" { addflag \"\\\\Seen\"; }"$'\n'
            fi
        done
        text+='if header :contains "subject" "mailbench message" { fileinto :flags "\\Flagged" "INBOX"; stop; }'$'\n' ;;
    vacation)
        text='require "vacation";'$'\n''vacation :days 1 :addresses ["@USER@@'"$BENCH_DOMAIN"'"] :subject "away" "I am away.";'$'\n' ;;
    *) srv_die "sieve=$1: filing, filing-own or vacation"; return 1 ;;
    esac
    printf '%s' "$text"
}

# The `sendmail` every server's Sieve hands its replies to: reads the
# message, counts it (one line in DIR/sendmail.count), drops it.  Ours
# and Dovecot write the message on its standard input (`sendmail -i -f
# FROM -- TO`); Cyrus 3.6 speaks SMTP to `sendmail -bs`, answered here
# by a minimal SMTP dialogue (220, 250 to every command, 354 after DATA
# until ".", 221 at QUIT).
srv_sieve_sendmail() {   # DIR
    cat > "$1/sendmail" <<'EOF'
#!/bin/bash
count=${0%/*}/sendmail.count
case " $* " in
*" -bs "*)
    printf '220 bench ESMTP\r\n'
    while IFS= read -r line; do
        line=${line%$'\r'}
        case ${line^^} in
        EHLO*) printf '250-bench\r\n250 8BITMIME\r\n' ;;
        DATA)
            printf '354 go on\r\n'
            while IFS= read -r line && [[ ${line%$'\r'} != . ]]; do :; done
            echo x >> "$count"
            printf '250 2.0.0 ok\r\n' ;;
        QUIT) printf '221 2.0.0 bye\r\n'; exit 0 ;;
        *) printf '250 2.0.0 ok\r\n' ;;
        esac
    done ;;
*)
    cat > /dev/null
    echo x >> "$count" ;;
esac
exit 0
EOF
    chmod 755 "$1/sendmail"
    : > "$1/sendmail.count"
    chmod 666 "$1/sendmail.count"
}

# Every user's active Sieve script of KIND in the layout lmtpd reads
# (SIEVEDIR/H/USER/NAME.script, defaultbc the link to it), stored with
# the build's own admin tool (`mbtool sieve put` + `activate`, which
# also store the compiled form NAME.bc when the build has one), as
# timsieved would.
srv_sieve_scripts() {   # DIR KIND BUILD
    local d=$1 kind=$2 b=$3 text u
    text=$(srv_sieve_text "$kind") || return 1
    srv_sieve_sendmail "$d"
    mkdir -p "$d/sieve"
    [[ -n $OWNER ]] && chown "$OWNER:$(id -gn "$OWNER")" "$d" "$d/conf" "$d/sieve"
    srv_users | while read -r u; do
        printf '%s\n' "${text//@USER@/$u}" |
            "$b/tools/mbtool" -C "$d/imapd.conf" sieve put "$u" bench ||
            { srv_die "mbtool sieve put $u failed"; return 1; }
        "$b/tools/mbtool" -C "$d/imapd.conf" sieve activate "$u" bench ||
            { srv_die "mbtool sieve activate $u failed"; return 1; }
    done || return 1
    [[ -n $OWNER ]] && chown -R "$OWNER:$(id -gn "$OWNER")" "$d/sieve"
    return 0
}

# Sieve checks after a run of DIR: "MESSAGES FLAGGED REPLIES" over every
# user's INBOX (IMAP, 8 sessions at a time) and DIR/sendmail.count.
srv_sieve_check() {   # DIR
    local replies=0
    [[ -f $1/sendmail.count ]] && replies=$(wc -l < "$1/sendmail.count")
    replies=$((replies + $(srv_sink_count "$1")))
    python3 - "$(srv_imap "$1")" "$BENCH_PASSWORD" "$BENCH_USERS" "$replies" <<'PY'
import imaplib, re, sys
from concurrent.futures import ThreadPoolExecutor
host, port = sys.argv[1].rsplit(":", 1)
def one(i):
    im = imaplib.IMAP4(host, int(port))
    im.login("u%04d" % i, sys.argv[2])
    typ, data = im.select("INBOX", readonly=True)
    n = int(data[0])
    typ, data = im.search(None, "FLAGGED")
    f = len(data[0].split()) if data and data[0] else 0
    im.logout()
    return n, f
with ThreadPoolExecutor(8) as ex:
    r = list(ex.map(one, range(1, int(sys.argv[3]) + 1)))
print(sum(x[0] for x in r), sum(x[1] for x in r), sys.argv[4])
PY
}

srv_start_ours() {   # DIR
    local d=$1 b=${BUILD:-}
    [[ -n $b ]] || b=$(srv_build_dir) || return 1
    rm -f "$d/master.pid" "$d/master.status"
    BENCH_SERVER_TAG=$d "$b/master/master" -D -l -C "$d/imapd.conf" -M "$d/cyrus.conf" \
        -p "$d/master.pid" -s "$d/master.status" -T 10 >>"$d/master.log" 2>&1 </dev/null &
    echo $! > "$d/master.pid.launch"
}

# --- Cyrus IMAP 3.6 ----------------------------------------------------

srv_setup_cyrus() {   # DIR KEY=VALUE...
    local d=$1; shift
    local p
    for p in master lmtpd imapd ctl_cyrusdb; do
        [[ -x $CYRUS_BIN/$p ]] || { srv_die "missing $CYRUS_BIN/$p (Debian package cyrus-imapd)"; return 1; }
    done
    [[ $(id -u) -eq 0 ]] || { srv_die "cyrus: run as root (its master becomes the cyrus user)"; return 1; }
    srv_parse_kv "prefork maxchild imap_prefork imap_maxchild partition sieve smtp" "$@" || return 1
    srv_sink_setup "${srv_kv[smtp]:-}" || return 1
    local prefork=${srv_kv[prefork]:-0} maxchild=${srv_kv[maxchild]:-20}
    local iprefork=${srv_kv[imap_prefork]:-2} imaxchild=${srv_kv[imap_maxchild]:-250}
    local partition=$d/spool
    [[ -n ${srv_kv[partition]:-} ]] && partition=${srv_kv[partition]%/}/$(basename "$d")
    OWNER=cyrus
    mkdir -p "$d/conf/socket" "$d/socket" "$d/tmp" "$partition"
    local c=$d/imapd.conf
    {
        echo "configdirectory: $d/conf"
        echo "partition-default: $partition"
        echo "servername: $BENCH_SERVERNAME"
        echo "admins: $BENCH_ADMIN"
        echo "allowplaintext: yes"
        echo "sasl_pwcheck_method: auxprop"
        echo "sasl_auxprop_plugin: sasldb"
        echo "sasl_sasldb_path: $d/sasldb2"
        echo "sasl_mech_list: PLAIN LOGIN"
        # private sockets and scratch space instead of /run/cyrus, /tmp
        echo "idlesocket: $d/socket/idle"
        echo "notifysocket: $d/socket/notify"
        echo "lmtpsocket: $d/socket/lmtp"
        echo "temp_path: $d/tmp"
        echo "syslog_prefix: cyrus-bench"
        if [[ -n ${srv_kv[sieve]:-} ]]; then
            echo "sievedir: $d/sieve"
            echo "sendmail: $d/sendmail"
        fi
        if [[ -n $SINKPORT ]]; then
            echo "smtp_backend: host"
            echo "smtp_host: 127.0.0.1:$SINKPORT"
        fi
        ((${#srv_kv_rest[@]})) && printf '%s\n' "${srv_kv_rest[@]}"
    } > "$c"
    local lport iport sport sieveline=
    lport=$(srv_free_port) iport=$(srv_free_port) sport=$(srv_free_port)
    [[ -n ${srv_kv[sieve]:-} ]] &&
        sieveline="  sieve    cmd=\"$CYRUS_BIN/timsieved -C $c\" listen=\"127.0.0.1:$sport\" prefork=0 maxchild=20"
    # its master does not hand -C to the children: every cmd names it
    cat > "$d/cyrus.conf" <<EOF
START {
  recover cmd="$CYRUS_BIN/ctl_cyrusdb -C $c -r"
}
SERVICES {
  imap     cmd="$CYRUS_BIN/imapd -C $c" listen="127.0.0.1:$iport" prefork=$iprefork maxchild=$imaxchild
  lmtpunix cmd="$CYRUS_BIN/lmtpd -C $c" listen="$d/socket/lmtp" prefork=$prefork maxchild=$maxchild
  lmtp     cmd="$CYRUS_BIN/lmtpd -a -C $c" listen="127.0.0.1:$lport" prefork=0 maxchild=$maxchild
$sieveline
}
EVENTS {
  checkpoint cmd="$CYRUS_BIN/ctl_cyrusdb -C $c -c" period=30
}
EOF
    cat > "$d/bench.env" <<EOF
SERVER=cyrus
LMTP=$d/socket/lmtp
LMTP_TCP=127.0.0.1:$lport
IMAP=127.0.0.1:$iport
PIDFILE=$d/master.pid
LOG=$d/master.log
OWNER=$OWNER
PARTITION=$partition
EOF
    [[ -n $SINKPORT ]] && echo "SINK_PORT=$SINKPORT" >> "$d/bench.env"
    srv_make_sasldb "$d/sasldb2" || return 1
    chown -R cyrus:mail "$d" "$partition"
    srv_start "$d" || return 1
    srv_log "cyrus: creating $BENCH_USERS mailboxes over IMAP as $BENCH_ADMIN"
    local ok=0
    python3 - "$(srv_imap "$d")" "$BENCH_ADMIN" "$BENCH_PASSWORD" "$BENCH_USERS" <<'PY' && ok=1
import imaplib, sys
host, port = sys.argv[1].rsplit(":", 1)
im = imaplib.IMAP4(host, int(port))
im.login(sys.argv[2], sys.argv[3])
typ, data = im.list('""', '""')
sep = data[0].decode().split('"')[1] if data and data[0] else "."
n = int(sys.argv[4])
for i in range(1, n + 1):
    name = "user%su%04d" % (sep, i)
    typ, resp = im.create(name)
    if typ != "OK":
        sys.exit("CREATE %s: %s %r" % (name, typ, resp))
typ, data = im.list('""', "user%s%%" % sep)
if len(data) != n:
    sys.exit("LIST shows %d of %d mailboxes" % (len(data), n))
im.logout()
PY
    if ((ok)) && [[ -n ${srv_kv[sieve]:-} ]]; then
        srv_sieve_scripts_cyrus "$d" "${srv_kv[sieve]}" "$sport" || ok=0
    fi
    srv_stop "$d" || return 1
    ((ok)) || { srv_die "cyrus: creating the mailboxes or scripts failed"; return 1; }
}

# Every user's active script of KIND, put in through Cyrus's own
# timsieved (ManageSieve: AUTHENTICATE PLAIN as the user, PUTSCRIPT, which
# compiles the bytecode, and SETACTIVE, 8 sessions at a time), so that
# the files land where Cyrus's lmtpd looks for them (with 3.6's uuid
# mailbox paths, SIEVEDIR/uuid/...); its sievec checks the text first.
srv_sieve_scripts_cyrus() {   # DIR KIND SIEVEPORT
    local d=$1 kind=$2 port=$3 ok=0
    [[ -x $CYRUS_BIN/sievec ]] || { srv_die "missing $CYRUS_BIN/sievec"; return 1; }
    srv_sieve_text "$kind" > "$d/bench.sieve.in" || return 1
    cp "$d/bench.sieve.in" "$d/bench.sieve"
    chown cyrus:mail "$d/bench.sieve"
    sed -i 's/@USER@/u0001/g' "$d/bench.sieve"   # the check only
    srv_as_owner "$CYRUS_BIN/sievec" -C "$d/imapd.conf" "$d/bench.sieve" "$d/tmp/bench.bc" ||
        { srv_die "cyrus: sievec refused the $kind script"; return 1; }
    srv_sieve_sendmail "$d"
    srv_log "cyrus: uploading the $kind script for $BENCH_USERS users through timsieved"
    python3 - "127.0.0.1:$port" "$BENCH_PASSWORD" "$BENCH_USERS" "$d/bench.sieve.in" <<'PY' && ok=1
import base64, socket, sys
from concurrent.futures import ThreadPoolExecutor
host, port = sys.argv[1].rsplit(":", 1)
script = open(sys.argv[4], "rb").read()
def lines(f):
    out = []
    while True:
        ln = f.readline()
        if not ln:
            raise SystemExit("timsieved closed the connection")
        out.append(ln)
        if ln.startswith((b"OK", b"NO", b"BYE")):
            if not ln.startswith(b"OK"):
                raise SystemExit("timsieved: %r" % out[-3:])
            return out
def one(i):
    user = "u%04d" % i
    text = script.replace(b"@USER@", user.encode()).replace(b"\n", b"\r\n")
    s = socket.create_connection((host, int(port)), timeout=30)
    f = s.makefile("rb")
    lines(f)
    cred = base64.b64encode(b"\0" + user.encode() + b"\0" + sys.argv[2].encode())
    s.sendall(b'AUTHENTICATE "PLAIN" "' + cred + b'"\r\n'); lines(f)
    s.sendall(b'PUTSCRIPT "bench" {%d+}\r\n' % len(text) + text + b"\r\n"); lines(f)
    s.sendall(b'SETACTIVE "bench"\r\n'); lines(f)
    s.sendall(b"LOGOUT\r\n")
    s.close()
with ThreadPoolExecutor(8) as ex:
    list(ex.map(one, range(1, int(sys.argv[3]) + 1)))
PY
    ((ok)) || { srv_die "cyrus: uploading the scripts failed"; return 1; }
    local n
    n=$(find "$d/sieve" -name defaultbc | wc -l)
    [[ $n -eq $BENCH_USERS ]] || { srv_die "cyrus: $n of $BENCH_USERS active scripts"; return 1; }
}

srv_start_cyrus() {   # DIR
    local d=$1
    rm -f "$d/master.pid"
    BENCH_SERVER_TAG=$d "$CYRUS_BIN/master" -C "$d/imapd.conf" -M "$d/cyrus.conf" -l 128 \
        -p "$d/master.pid" -L "$d/master.log" </dev/null >/dev/null 2>&1 &
    echo $! > "$d/master.pid.launch"
}

# --- Dovecot 2.3 --------------------------------------------------------

srv_dovecot_deb() {
    local f
    for f in "$BENCH_CACHE"/dovecot-imapd_*.deb; do
        [[ -f $f ]] && { echo "$f"; return 0; }
    done
    srv_die "no dovecot-imapd .deb in $BENCH_CACHE (scripts/deps.sh --bench downloads it)"
}

# The dovecot-imapd binaries, unpacked once into the cache next to the .deb
# (never installed: the package conflicts with cyrus-imapd).
srv_dovecot_imap_dir() {
    local deb x
    deb=$(srv_dovecot_deb) || return 1
    x=$BENCH_CACHE/$(basename "$deb" .deb)
    if [[ ! -x $x/usr/lib/dovecot/imap-login ]]; then
        rm -rf "$x.tmp" && mkdir -p "$x.tmp" && dpkg -x "$deb" "$x.tmp" && mv "$x.tmp" "$x" ||
            { srv_die "dpkg -x $deb failed"; return 1; }
    fi
    echo "$x/usr/lib/dovecot"
}

srv_setup_dovecot() {   # DIR KEY=VALUE...
    local d=$1; shift
    command -v dovecot >/dev/null || { srv_die "dovecot not installed (dovecot-core)"; return 1; }
    [[ -x /usr/lib/dovecot/lmtp ]] || { srv_die "dovecot lmtp not installed (dovecot-lmtpd)"; return 1; }
    [[ $(id -u) -eq 0 ]] || { srv_die "dovecot: run as root (its master drops to dovecot/dovenull, mail as user mail)"; return 1; }
    local x
    x=$(srv_dovecot_imap_dir) || return 1
    srv_parse_kv "format partition sieve smtp" "$@" || return 1
    srv_sink_setup "${srv_kv[smtp]:-}" || return 1
    local format=${srv_kv[format]:-sdbox}
    local mail=$d/mail
    [[ -n ${srv_kv[partition]:-} ]] && mail=${srv_kv[partition]%/}/$(basename "$d")
    case $format in sdbox|mdbox|maildir) ;; *) srv_die "dovecot: format sdbox, mdbox or maildir"; return 1 ;; esac
    OWNER=mail
    mkdir -p "$d/run" "$d/state" "$mail"
    local iport
    iport=$(srv_free_port)
    cat > "$d/dovecot.conf" <<EOF
# private Dovecot instance of the benchmark suite: nothing from /etc/dovecot
base_dir = $d/run
state_dir = $d/state
instance_name = bench-$(basename "$d")
log_path = $d/dovecot.log
protocols = imap lmtp
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
# recipient u0001@example.com and login u0001 are the same user u0001
auth_username_format = %Ln
default_internal_user = dovecot
default_login_user = dovenull
first_valid_uid = $(id -u mail)
last_valid_uid = $(id -u mail)
mail_location = $format:~/$format
import_environment = TZ CORE_OUTOFMEM CORE_ERROR BENCH_SERVER_TAG
namespace inbox {
  inbox = yes
  separator = /
}
passdb {
  driver = static
  args = password=$BENCH_PASSWORD
}
userdb {
  driver = static
  args = uid=mail gid=mail home=$mail/%n allow_all_users=yes
}
# logins in "high-performance mode" (a login process serves many
# clients, imap processes are reused: every user is uid mail): only the
# suite's verification logs in 2,000 users per run; delivery durability
# is untouched
service imap-login {
  executable = $x/imap-login
  service_count = 0
  process_min_avail = 2
  inet_listener imap {
    address = 127.0.0.1
    port = $iport
  }
  inet_listener imaps {
    port = 0
  }
}
service imap {
  executable = $x/imap
  service_count = 0
}
service imap-hibernate {
  executable = $x/imap-hibernate
}
service imap-urlauth {
  executable = $x/imap-urlauth
}
service imap-urlauth-login {
  executable = $x/imap-urlauth-login
}
service imap-urlauth-worker {
  executable = $x/imap-urlauth-worker
}
service lmtp {
  unix_listener lmtp {
    mode = 0666
  }
}
EOF
    if [[ -n ${srv_kv[sieve]:-} ]]; then
        # Pigeonhole at delivery: the user's active script ~/.dovecot.sieve
        cat >> "$d/dovecot.conf" <<EOF
sendmail_path = $d/sendmail
protocol lmtp {
  mail_plugins = \$mail_plugins sieve
}
plugin {
  sieve = file:~/sieve;active=~/.dovecot.sieve
}
EOF
    fi
    [[ -n $SINKPORT ]] && echo "submission_host = 127.0.0.1:$SINKPORT" >> "$d/dovecot.conf"
    ((${#srv_kv_rest[@]})) && printf '%s\n' "${srv_kv_rest[@]}" | sed 's/: / = /' >> "$d/dovecot.conf"
    cat > "$d/bench.env" <<EOF
SERVER=dovecot
LMTP=$d/run/lmtp
LMTP_TCP=
IMAP=127.0.0.1:$iport
PIDFILE=$d/master.pid
LOG=$d/dovecot.log
OWNER=$OWNER
PARTITION=$mail
EOF
    [[ -n $SINKPORT ]] && echo "SINK_PORT=$SINKPORT" >> "$d/bench.env"
    chown mail:mail "$mail"
    doveconf -c "$d/dovecot.conf" -n >/dev/null 2>"$d/doveconf.err" ||
        { srv_die "dovecot: config refused: $(cat "$d/doveconf.err")"; return 1; }
    # every INBOX made now (a login + STATUS each) so that a run starts
    # with existing mailboxes, as with the other servers
    srv_start "$d" || return 1
    srv_log "dovecot: creating $BENCH_USERS INBOXes ($format) by logging in"
    local ok=0
    python3 - "$(srv_imap "$d")" "$BENCH_PASSWORD" "$BENCH_USERS" <<'PY' && ok=1
import imaplib, sys
from concurrent.futures import ThreadPoolExecutor
host, port = sys.argv[1].rsplit(":", 1)
def make(i):
    im = imaplib.IMAP4(host, int(port))
    im.login("u%04d" % i, sys.argv[2])
    typ, data = im.select("INBOX")   # SELECT creates INBOX (STATUS does not)
    if typ != "OK":
        raise SystemExit("SELECT u%04d: %s %r" % (i, typ, data))
    im.logout()
with ThreadPoolExecutor(8) as ex:
    list(ex.map(make, range(1, int(sys.argv[3]) + 1)))
PY
    srv_stop "$d" || return 1
    ((ok)) || { srv_die "dovecot: creating the INBOXes failed"; return 1; }
    if [[ -n ${srv_kv[sieve]:-} ]]; then
        srv_sieve_scripts_dovecot "$d" "$mail" "${srv_kv[sieve]}" || return 1
    fi
}

# Every user's active script of KIND for Pigeonhole: HOME/sieve/bench.sieve,
# HOME/.dovecot.sieve the link to it, compiled beforehand with Pigeonhole's
# sievec (bench.svbin beside it, as a first delivery would leave it).
srv_sieve_scripts_dovecot() {   # DIR MAILDIR KIND
    local d=$1 mail=$2 kind=$3 text u
    command -v sievec >/dev/null || { srv_die "dovecot: no sievec (dovecot-sieve)"; return 1; }
    text=$(srv_sieve_text "$kind") || return 1
    srv_sieve_sendmail "$d"
    srv_users | while read -r u; do
        mkdir -p "$mail/$u/sieve"
        printf '%s\n' "${text//@USER@/$u}" > "$mail/$u/sieve/bench.sieve"
        ln -s sieve/bench.sieve "$mail/$u/.dovecot.sieve"
    done
    chown -R mail:mail "$mail"
    srv_log "dovecot: compiling the $kind script for $BENCH_USERS users (sievec)"
    srv_users | sed "s|^\(.*\)|$mail/\1/sieve/bench.sieve|" |
        xargs -P 4 -n 50 setpriv --reuid=mail --regid=mail --clear-groups \
            sh -c 'for f; do sievec -c "$0" "$f" || exit 255; done' "$d/dovecot.conf" ||
        { srv_die "dovecot: sievec refused the $kind script"; return 1; }
    local n
    n=$(find "$mail" -name bench.svbin | wc -l)
    [[ $n -eq $BENCH_USERS ]] || { srv_die "dovecot: $n of $BENCH_USERS scripts compiled"; return 1; }
}

srv_start_dovecot() {   # DIR
    local d=$1
    rm -f "$d/master.pid"
    BENCH_SERVER_TAG=$d dovecot -F -c "$d/dovecot.conf" </dev/null >>"$d/dovecot.log" 2>&1 &
    echo $! > "$d/master.pid.launch"
}

# --- common -------------------------------------------------------------

srv_setup() {   # SERVER DIR KEY=VALUE...
    local s=$1 d=${2%/}
    shift 2 || { srv_die "usage: srv_setup SERVER DIR [KEY=VALUE...]"; return 1; }
    srv_newdir "$d" || return 1
    case $s in
    ours|cyrus|dovecot) ( set -o pipefail; "srv_setup_$s" "$d" "$@" ) ;;
    *) srv_die "unknown server $s (ours, cyrus, dovecot)" ;;
    esac
    local rc=$?
    sync
    return $rc
}

# A fresh copy of a set-up (stopped) server directory: same ports,
# paths rewritten.
srv_clone() {   # SRC DST
    local s=${1%/} t=${2%/}
    (
        srv_env "$s" || exit 1
        [[ -f $s/master.pid ]] && kill -0 "$(cat "$s/master.pid")" 2>/dev/null &&
            { srv_die "$s is running"; exit 1; }
        srv_newdir "$t" || exit 1
        if [[ $SERVER == ours && -d $s/sieve ]]; then
            # everything but sieve/, which is linked below: a copy of it
            # removed again freed some 8,000 inodes just before the run,
            # and on ext4 without a journal (this machine's disk) every
            # file created in the next minute (one per delivery) skips
            # over them (doc/bench/sieve.md, "The clone's deletions")
            find "$s" -mindepth 1 -maxdepth 1 ! -name sieve \
                -exec cp -a -t "$t" {} + || exit 1
            chmod --reference="$s" "$t" &&
                chown --reference="$s" "$t" || exit 1
        else
            rmdir "$t"
            cp -a "$s" "$t" || exit 1
        fi
        local np=
        if [[ $PARTITION != "$s"/* ]]; then
            np=$(dirname "$PARTITION")/$(basename "$t")
            rm -rf "$np"
            cp -a "$PARTITION" "$np" || exit 1
        fi
        # our Sieve scripts as hard links: a script keeps its inode, as
        # on a site where it was stored in place, so that lmtpd takes the
        # compiled form that names the script file as its source without
        # reading the text (lmtpd(8)); a copy gives every file a new
        # inode, and lmtpd would store each user's compiled form again at
        # the first delivery, work a site does once after a restore.
        # Every writer of ours replaces a script file by a rename, so
        # nothing in the clone writes through the links.
        if [[ $SERVER == ours && -d $s/sieve ]]; then
            cp -al "$s/sieve" "$t/sieve" || exit 1
        fi
        rm -f "$t"/master.pid* "$t"/master.status "$t"/*.log
        local f
        for f in "$t"/imapd.conf "$t"/cyrus.conf "$t"/dovecot.conf "$t"/bench.env; do
            [[ -f $f ]] || continue
            if [[ -n $np ]]; then sed -i "s|$PARTITION|$np|g" "$f"; fi
            sed -i "s|$s/|$t/|g; s|=$s\$|=$t|; s|bench-$(basename "$s")\$|bench-$(basename "$t")|" "$f"
        done
    )
}

srv_start() {   # DIR
    local d=${1%/}
    (
        srv_env "$d" || exit 1
        if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            srv_die "$SERVER in $d is running already"; exit 1
        fi
        srv_sink_start "$d" || exit 1
        "srv_start_$SERVER" "$d"
        local ok=1
        local pid
        pid=$(cat "$d/master.pid.launch" 2>/dev/null || cat "$PIDFILE")
        srv_probe "$LMTP" lmtp 30 "$pid" && srv_probe "$IMAP" imap 30 "$pid" || ok=0
        if [[ $SERVER == ours && $ok == 1 ]]; then
            # wait for the prefork children too (as the status file says)
            local i
            for ((i = 0; i < 100; i++)); do
                awk '$1 == "service" && $2 == "lmtpunix" { for (i = 3; i <= NF; i++) if ($i ~ /^ready=/ && substr($i, 7) + 0 >= 1) ok = 1 } END { exit !ok }' \
                    "$d/master.status" 2>/dev/null && break
                sleep 0.1
            done
        fi
        # the PID is the one of the process we started (the server's own
        # pid file, if any, names the same process: all run in the foreground)
        mv -f "$d/master.pid.launch" "$PIDFILE"
        if ((!ok)); then
            srv_die "$SERVER in $d did not answer; log $LOG:"
            tail -20 "$LOG" >&2 2>/dev/null
            srv_stop "$d"
            exit 1
        fi
        srv_log "$SERVER started in $d (pid $(cat "$PIDFILE"), lmtp $LMTP, imap $IMAP)"
    )
}

srv_stop() {   # DIR
    local d=${1%/}
    (
        srv_env "$d" || exit 1
        local pid= i left
        [[ -s $PIDFILE ]] && pid=$(head -1 "$PIDFILE")
        [[ -z $pid && -s $d/master.pid.launch ]] && pid=$(cat "$d/master.pid.launch")
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null
            for ((i = 0; i < 200; i++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            if kill -0 "$pid" 2>/dev/null; then
                srv_log "$SERVER master $pid did not stop in 20 s: killed"
                kill -KILL "$pid" 2>/dev/null
            fi
        fi
        # children still draining, then anything else the server started
        for ((i = 0; i < 50; i++)); do
            left=$(srv_tagged "$d")
            [[ -z $left ]] && break
            sleep 0.1
        done
        if [[ -n $left ]]; then
            srv_log "$SERVER in $d: killing what is left: $(echo $left)"
            kill -KILL $left 2>/dev/null
            sleep 0.2
            left=$(srv_tagged "$d")
            if [[ -n $left ]]; then srv_die "$SERVER in $d: still running: $(echo $left)"; exit 1; fi
        fi
        rm -f "$PIDFILE" "$d/master.pid.launch"
        srv_sink_stop "$d"
        if [[ $SERVER == ours ]] && grep -E 'crashed signal=|AddressSanitizer' "$LOG" >&2; then
            srv_die "ours: stopped, but a worker crashed or was killed (log $LOG)"; exit 2
        fi
        exit 0
    )
}

# Remove a stopped server directory (and its partition elsewhere).
srv_remove() {   # DIR
    local d=${1%/}
    (
        srv_env "$d" || exit 1
        if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            srv_die "$d: running; stop it first"; exit 1
        fi
        [[ $PARTITION != "$d"/* ]] && rm -rf "$PARTITION"
        rm -rf "$d"
    )
}

# Messages in USER's INBOX, over IMAP (for mailbench --verify cmd:).
srv_count() {   # DIR USER
    python3 - "$(srv_imap "$1")" "$2" "$BENCH_PASSWORD" <<'PY'
import imaplib, re, sys
host, port = sys.argv[1].rsplit(":", 1)
im = imaplib.IMAP4(host, int(port))
im.login(sys.argv[2], sys.argv[3])
typ, data = im.status("INBOX", "(MESSAGES)")
print(re.search(rb"MESSAGES (\d+)", data[0]).group(1).decode())
im.logout()
PY
}

# Messages in every user's INBOX, summed (one IMAP connection per user).
srv_count_all() {   # DIR
    python3 - "$(srv_imap "$1")" "$BENCH_PASSWORD" "$BENCH_USERS" <<'PY'
import imaplib, re, sys
host, port = sys.argv[1].rsplit(":", 1)
total = 0
for i in range(1, int(sys.argv[3]) + 1):
    im = imaplib.IMAP4(host, int(port))
    im.login("u%04d" % i, sys.argv[2])
    typ, data = im.status("INBOX", "(MESSAGES)")
    total += int(re.search(rb"MESSAGES (\d+)", data[0]).group(1))
    im.logout()
print(total)
PY
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    set -uo pipefail
    usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 2; }
    [[ $# -ge 1 ]] || usage
    cmd=$1; shift
    case $cmd in
    setup) [[ $# -ge 2 ]] || usage; srv_setup "$@" ;;
    start) [[ $# -eq 1 ]] || usage; srv_start "$1" ;;
    stop) [[ $# -eq 1 ]] || usage; srv_stop "$1" ;;
    clone) [[ $# -eq 2 ]] || usage; srv_clone "$1" "$2" ;;
    remove) [[ $# -eq 1 ]] || usage; srv_remove "$1" ;;
    version) [[ $# -eq 1 ]] || usage; srv_version "$1" ;;
    count) [[ $# -eq 2 ]] || usage; srv_count "$1" "$2" ;;
    count-all) [[ $# -eq 1 ]] || usage; srv_count_all "$1" ;;
    status)
        [[ $# -eq 1 ]] || usage
        ( srv_env "$1" || exit 1
          if [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
              echo "$SERVER running pid=$(cat "$PIDFILE") lmtp=$LMTP imap=$IMAP"
          else
              echo "$SERVER stopped lmtp=$LMTP imap=$IMAP"; exit 3
          fi ) ;;
    *) usage ;;
    esac
fi
