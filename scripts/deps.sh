#!/usr/bin/env bash
# deps.sh - install the Debian packages the project builds and tests with.
# Installs only what is missing; as root it runs apt-get, otherwise it names
# the packages and stops.  Package installs never start system services:
# a policy-rc.d that forbids them is in place for the duration.
#
#   scripts/deps.sh [--bench]
#
# --bench: also what the benchmark suite (bench/run.sh) needs: Dovecot's
# core and LMTP server, gnuplot, perf; and the dovecot-imapd package
# downloaded (apt-get download, NOT installed: it conflicts with
# cyrus-imapd) into $BENCH_CACHE (default /var/cache/mailbench), where
# bench/servers.sh unpacks it privately.
set -euo pipefail

bench=no
for arg in "$@"; do
  case $arg in
  --bench) bench=yes ;;
  *) echo "usage: scripts/deps.sh [--bench]" >&2; exit 2 ;;
  esac
done
bench_cache=${BENCH_CACHE:-/var/cache/mailbench}

packages=(
  build-essential autoconf automake libtool pkg-config   # the build
  libdb5.3-dev db5.3-util liblmdb-dev lmdb-utils           # cyrusdb engines
  libssl-dev libsasl2-dev                                  # TLS and SASL
  libcmocka-dev                                            # unit tests
  cyrus-imapd cyrus-clients                                # compatibility tests against Cyrus 3.6
  python3                                                  # integration tests
  clang                                                    # the fuzz target (libFuzzer)
  isync                                                    # mbsync, an IMAP client for the sync tests
  swaks libnet-ssleay-perl postfix                         # LMTP client (with TLS), upstream MTA
  sasl2-bin libsasl2-modules openssl strace                # sasldb, certificates, the benchmark's sync counts
  gnuplot-nox                                              # mailbench --plot (tested by check.sh)
)
if [[ $bench == yes ]]; then
  packages+=(dovecot-core dovecot-lmtpd linux-perf)   # bench/run.sh: the peers, plots, profiles
fi

# the dovecot-imapd .deb of the installed dovecot-core's version, if not there
bench_deb_missing() {
  [[ $bench == yes ]] || return 1
  local f
  for f in "$bench_cache"/dovecot-imapd_*.deb; do
    [[ -f $f ]] && return 1
  done
  return 0
}

bench_download() {
  bench_deb_missing || return 0
  if [[ $(id -u) -ne 0 && ! -w $(dirname "$bench_cache") && ! -w $bench_cache ]]; then
    echo "deps: as root, run: mkdir -p $bench_cache && cd $bench_cache && apt-get download dovecot-imapd" >&2
    return 1
  fi
  mkdir -p "$bench_cache"
  echo "deps: downloading dovecot-imapd (not installed) into $bench_cache"
  (cd "$bench_cache" && apt-get download -q dovecot-imapd)
}

missing=()
for p in "${packages[@]}"; do
  [[ $p == \#* ]] && continue
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  bench_download
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "deps: missing Debian packages: ${missing[*]}" >&2
  echo "deps: as root, run: apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
made_policy=no
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  made_policy=yes
fi
trap '[[ $made_policy == yes ]] && rm -f "$policy"' EXIT
apt-get update -q
# postfix: only its programs are wanted (tests run private instances)
echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
apt-get install -y -q --no-install-recommends "${missing[@]}"
bench_download
