#!/usr/bin/env bash
# deps.sh - install the Debian packages the project needs, in four groups:
#
#   scripts/deps.sh            build and run (what ./demo.sh needs)
#   scripts/deps.sh --test     also what the tests need (./check.sh, CI)
#   scripts/deps.sh --bench    also what the benchmark suite needs (bench/run.sh)
#   scripts/deps.sh --package  also what building the Debian package needs
#                              (dpkg-buildpackage -us -uc -b; lintian)
#   scripts/deps.sh --list [--test|--bench|--package]   print the packages and stop
#
# Installs only what is missing; as root it runs apt-get, otherwise it
# names the packages and stops.  Three promises to the admin whose machine
# this is:
#   - nothing is removed: apt-get runs with --no-remove, so an install that
#     would take a package away (Postfix replacing exim4, say) stops instead;
#   - Postfix (tests only) is left out when another mail transport agent is
#     installed, and the tests that need it say they were skipped;
#   - packages installed here never start a service: a policy-rc.d forbids
#     it during the install, and the services of packages this script
#     installed itself (cyrus-common's cyrus-imapd, postfix, dovecot,
#     prometheus, etcd-server) are
#     disabled at boot, so a test-only install never becomes a running
#     rival server after the next reboot.  Services of packages that were
#     already installed are not touched.  Roundcube (tests only) is
#     installed without a web server (no recommends: no apache2), and
#     debconf tells it to configure none and no system database.
#
# --bench also downloads the dovecot-imapd package (apt-get download, NOT
# installed: it conflicts with cyrus-imapd) into $BENCH_CACHE (default
# /var/cache/mailbench), where bench/servers.sh unpacks it privately.
set -euo pipefail

group=run
list=no
package=no
for arg in "$@"; do
  case $arg in
  --test)  [[ $group == bench ]] || group=test ;;
  --bench) group=bench ;;
  --package) package=yes ;;
  --list)  list=yes ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/deps.sh [--test|--bench] [--package] [--list]" >&2; exit 2 ;;
  esac
done
bench_cache=${BENCH_CACHE:-/var/cache/mailbench}

# build and run: the compiler and autotools, the engines and libraries the
# programs link (libmicrohttpd: metricsd; libsystemd: the master's
# readiness notification), saslpasswd2 and the SASL mechanisms (the demo's
# login), python3 (the demo's LMTP and IMAP client)
packages=(
  build-essential autoconf automake libtool pkg-config
  libdb5.3-dev liblmdb-dev libssl-dev libsasl2-dev libmicrohttpd-dev libsystemd-dev
  zlib1g-dev libcurl4-openssl-dev libjansson-dev
  sasl2-bin libsasl2-modules python3
)
# tests: cmocka, the engines' own tools, Cyrus 3.6's tools (byte compatibility) and
# imtest, cyradm, clang (libFuzzer), mbsync, swaks, Postfix (upstream MTA and
# smtp-source/smtp-sink), openssl (certificates), strace, gnuplot,
# prometheus (promtool and a private Prometheus scraping metricsd),
# sieve-connect (a ManageSieve client for timsieved), Pigeonhole's
# sieve-test (dovecot-sieve, with dovecot-core named so that its service
# is disabled at boot like the others: the Sieve corpus's reference)
# etcd (a private 3-member cluster for the cyrusdb etcd backend)
# Roundcube with its managesieve plugin, PHP's CLI (its built-in web
# server serves a private Roundcube; no Apache) and headless Chromium
# driven by Selenium (tests/webmail/test_roundcube.py)
test_packages=(
  libcmocka-dev
  db5.3-util lmdb-utils
  cyrus-common cyrus-clients
  cyrus-admin
  clang isync offlineimap swaks libnet-ssleay-perl postfix
  openssl strace gnuplot-nox prometheus
  sieve-connect dovecot-core dovecot-sieve
  etcd-server etcd-client
  roundcube-core roundcube-sqlite3 roundcube-plugins php-cli php-sqlite3
  chromium chromium-driver python3-selenium
)
# benchmarks: the peers (Cyrus's imapd, Dovecot's LMTP) and perf
bench_packages=(cyrus-imapd dovecot-core dovecot-lmtpd linux-perf)

# the Debian package: debhelper (dh, compat 13) and lintian
package_packages=(debhelper lintian)

case $group in
  test)  packages+=("${test_packages[@]}") ;;
  bench) packages+=("${test_packages[@]}" "${bench_packages[@]}") ;;
esac
[[ $package == no ]] || packages+=("${package_packages[@]}")

installed() {
  [[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true) == "install ok installed" ]]
}

# an installed package other than postfix that provides mail-transport-agent
other_mta() {
  dpkg-query -W -f='${Package}\t${Status}\t${Provides}\n' 2>/dev/null |
    awk -F'\t' '$2 == "install ok installed" && $1 != "postfix" &&
                $3 ~ /(^|[ ,])mail-transport-agent([ ,(]|$)/ && !found { print $1; found = 1 }'
}

missing=()
skipped_postfix=
for p in "${packages[@]}"; do
  installed "$p" && continue
  if [[ $p == postfix ]]; then
    mta=$(other_mta)
    if [[ -n $mta ]]; then
      skipped_postfix=$mta
      continue
    fi
  fi
  missing+=("$p")
done

if [[ $list == yes ]]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
if [[ -n $skipped_postfix ]]; then
  echo "deps: not installing postfix: it would replace the installed mail transport agent ($skipped_postfix); the Postfix tests will be skipped" >&2
fi

bench_deb_missing() {
  [[ $group == bench ]] || return 1
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

if ((${#missing[@]} == 0)); then
  bench_download
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "deps: missing Debian packages: ${missing[*]}" >&2
  echo "deps: as root, run: apt-get update && apt-get install --no-remove --no-install-recommends -y ${missing[*]}" >&2
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
# roundcube-core: only its code is wanted (the test serves a private copy
# with php -S): no web server configured or restarted, no system database
# (with --no-install-recommends it pulls no apache2 service, only
# apache2-bin through php's first alternative, which has no service)
if [[ " ${missing[*]} " == *" roundcube-core "* ]]; then
  debconf-set-selections <<'EOF'
roundcube-core roundcube/reconfigure-webserver multiselect
roundcube-core roundcube/restart-webserver boolean false
roundcube-core roundcube/dbconfig-install boolean false
EOF
fi
apt-get install -y -q --no-install-recommends --no-remove "${missing[@]}"

# the services of what was installed here stay off at boot
for p in "${missing[@]}"; do
  [[ " ${test_packages[*]} ${bench_packages[*]} " == *" $p "* ]] || continue
  installed "$p" || continue
  while IFS= read -r unit; do
    name=$(basename "$unit")
    echo "deps: $p: $name disabled at boot (installed for tests or benchmarks only)"
    if command -v deb-systemd-helper >/dev/null; then
      deb-systemd-helper disable "$name" >/dev/null 2>&1 || true
    fi
    if command -v systemctl >/dev/null; then
      systemctl disable "$name" >/dev/null 2>&1 || true
    fi
  done < <(dpkg -L "$p" 2>/dev/null | grep -E '^/(usr/)?lib/systemd/system/[^/]+\.(service|socket)$' || true)
  while IFS= read -r script; do
    update-rc.d "$(basename "$script")" disable >/dev/null 2>&1 || true
  done < <(dpkg -L "$p" 2>/dev/null | grep -E '^/etc/init\.d/[^/]+$' || true)
done
bench_download
