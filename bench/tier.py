#!/usr/bin/env python3
"""tier.py - the frontend tier's benchmark (bench/run.sh -x tier; the
figures in doc/bench/tier.md).

    TEST_TMPDIR=DIR top_builddir=BUILD python3 bench/tier.py [-r RUNS]
        [-n MSGS] [-c CONNS] [-s BYTES] [-u USERS] [-M MOVEMSGS]
        [-R MOVERUNS] [--json FILE]

The fixture of the tier's tests (tests/tierhelp.py), every process on
loopback, started by us and stopped by PID: a private 3-member etcd
cluster holding the directory, backend alpha (a master with lmtpd -a on
127.0.0.1 and imapd) holding USERS users u0001.. (all placed on alpha),
backend beta (only the target of the moves), and a frontend (a master
with lmtpd in lmtp_proxy mode on a UNIX socket, the directory in etcd,
metricsd for its counters).  The frontend has two LMTP services: the
defaults (directory_cache_ttl 5 s, directory_cache_watched_ttl 600 s: an
answer naming a backend lives 600 s while the etcd watch is up) and one
where every answer lives 5 s, watch or not (the etcd watch keeps both
current).

1. Throughput: tools/mailbench, MSGS messages of BYTES bytes over CONNS
   connections to the USERS users, through each frontend service and
   straight to alpha's lmtpd (the address the frontend relays to);
   first untimed warm-up runs (one for the backend; for each frontend
   service until its directory reads stop falling, at most 8: the
   caches are per worker), then RUNS rounds, the targets' order rotated
   round by round.  Per target: messages/s and the DELIVERY p99
   (RCPT to the final 250, ms) as medians, and for the frontend the
   directory lookups per delivery from its metrics
   (cyrusdeliver_directory_lookups_total{source}: database reads and
   cache answers over the run's delivered messages).
2. Moves: MOVERUNS times, a new user (cyr_user create, on alpha) gets
   MOVEMSGS messages of BYTES bytes straight at alpha (mailbench, 10
   connections), then `cyr_user move USER beta` is timed (wall clock,
   and the seconds cyr_user reports).

Prints a Markdown section (tables, the load average, the command) on
stdout; progress on stderr.  Exit status 0, or 1 when a run failed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TOP, "tests"))
import tierhelp  # noqa: E402,F401 - puts the tests' folders on sys.path
from testlib import (TOP_BUILDDIR, free_port, read_text,  # noqa: E402
                     service_line, wait_until)
from lmtphelp import LMTPD, MBTOOL, Instance  # noqa: E402
from imaphelp import make_sasldb_extra  # noqa: E402
from tierhelp import Backend, Tier, directory_lookups  # noqa: E402

MAILBENCH = os.path.join(TOP_BUILDDIR, "tools", "mailbench")
METRICSD = os.path.join(TOP_BUILDDIR, "metricsd", "metricsd")
CYR_USER = os.path.join(TOP_BUILDDIR, "tools", "cyr_user")
PROXY_USER, PROXY_PW = "proxy", "pr0xy-pw"


def log(msg):
    print("tier: " + msg, file=sys.stderr, flush=True)


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def mailbench(work, target, n, conns, size, users, tag, seed, fmt=None):
    out = os.path.join(work, "mb-%s-%d.json" % (tag, seed))
    cmd = [MAILBENCH, "lmtp", "--lmtp", target, "-n", str(n), "-c",
           str(conns), "-m", str(users), "-s", str(size), "-q", "--json",
           out, "--label", tag, "--seed", str(seed)]
    if fmt:
        cmd += ["--user", fmt]
    p = subprocess.run(cmd, capture_output=True, timeout=3600)
    if p.returncode != 0 or not os.path.exists(out):
        raise RuntimeError("mailbench %s: exit %d: %s %s"
                           % (tag, p.returncode, p.stdout[-400:],
                              p.stderr[-400:]))
    with open(out) as f:
        res = json.load(f)
    if res["delivered_msgs"] != n or res["failed_msgs"]:
        raise RuntimeError("mailbench %s: %d of %d delivered, %d failed"
                           % (tag, res["delivered_msgs"], n,
                              res["failed_msgs"]))
    return res


def backend(name, users, movers):
    conf = {"allowplaintext": "yes", "sasl_mech_list": "PLAIN LOGIN",
            "admins": PROXY_USER, "proxyservers": PROXY_USER}
    b = Backend(name, conf=conf, sasl=(PROXY_USER, PROXY_PW))
    for u in movers:        # cyr_user logs in as them (by proxy)
        make_sasldb_extra(b, u, "pw-" + u)
    for u in users:
        b.create("user." + u)
    b.write_cyrus_conf(prefork=5, maxchild=100)
    return b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-r", "--runs", type=int, default=3)
    ap.add_argument("-n", "--msgs", type=int, default=4000)
    ap.add_argument("-c", "--conns", type=int, default=40)
    ap.add_argument("-s", "--size", type=int, default=13870)
    ap.add_argument("-u", "--users", type=int, default=100)
    ap.add_argument("-M", "--move-msgs", type=int, default=10000)
    ap.add_argument("-R", "--move-runs", type=int, default=3)
    ap.add_argument("--json", help="all figures as JSON into this file")
    a = ap.parse_args()
    for prog in (MAILBENCH, METRICSD, CYR_USER, LMTPD, MBTOOL):
        if not os.access(prog, os.X_OK):
            log("missing %s (build first)" % prog)
            return 1
    users = ["u%04d" % i for i in range(1, a.users + 1)]
    load0 = read_text("/proc/loadavg").split()[:3]
    tier = Tier("tierbench", "tierbench.", mode=0o755)
    insts = []
    rc = 1
    try:
        if not tier.start_cluster():
            return 1
        tier.place_all({u: "alpha" for u in users})
        log("backends: creating %d mailboxes" % len(users))
        movers = ["m1v%d" % k for k in range(1, a.move_runs + 1)]
        alpha = backend("alpha", users, movers)
        insts.append(alpha)
        tier.start(alpha)
        beta = backend("beta", [], movers)
        insts.append(beta)
        tier.start(beta)
        for n, b in (("alpha", alpha), ("beta", beta)):
            os.symlink(b.imapd_conf, os.path.join(tier.work, n + ".conf"))
        metrics_port = free_port()
        conf = tier.directory_conf(ttl="5", timeout="3000", watched_ttl="")
        conf.update({
            "lmtp_proxy": "yes",
            "proxy_backends": "alpha=%s beta=%s" % (alpha.lmtp_addr(),
                                                    beta.lmtp_addr()),
            "proxy_timeout": "120",
            "metrics_listen": "127.0.0.1:%d" % metrics_port,
            # cyr_user's keys (it runs with this file)
            "allowplaintext": "yes",
            "proxy_imap_backends": "alpha=127.0.0.1:%d beta=127.0.0.1:%d"
                                   % (alpha.tcp_port, beta.tcp_port),
            "proxy_authname": PROXY_USER,
            "proxy_password": PROXY_PW,
            "proxy_starttls": "no",
            "xfer_command": "%s -C %s/%%b.conf" % (MBTOOL, tier.work),
        })
        front = Instance("front", conf=conf)
        insts.insert(0, front)
        long_conf = front.path("imapd-long.conf")
        with open(long_conf, "w") as f:
            f.write(read_text(front.imapd_conf)
                    + "directory_cache_watched_ttl: 5\n")
        long_sock = front.path("long.sock")
        front.write_cyrus_conf(unix=True, prefork=5, maxchild=50,
                               extra=service_line(
                                   "lmtplong", LMTPD + " -C " + long_conf,
                                   long_sock, prefork=5, maxchild=50))
        with open(front.cyrus_conf, "a") as f:
            f.write('DAEMON {\n  metricsd cmd="%s"\n}\n' % METRICSD)
        tier.start(front)
        if not wait_until(lambda: directory_lookups(metrics_port), 60,
                          step=0.1):
            raise RuntimeError("the frontend's metricsd does not answer")

        targets = [("frontend, defaults (TTL 5 s, 600 s watched)",
                    "unix:" + front.unix_socket, True),
                   ("frontend, TTL 5 s watched or not", "unix:" + long_sock,
                    True),
                   ("backend (no frontend)", alpha.lmtp_addr(), False)]
        res = {t[0]: [] for t in targets}
        warm = {}
        seed = 1
        # warm-up: the caches are per worker, so a cold frontend reads
        # about workers x users records; runs until a run reads fewer
        # than 1 in 200 deliveries, or no fewer than the run before
        # (a short TTL keeps reading), at most 8
        for name, target, is_front in targets:
            warm[name] = []
            for _ in range(8 if is_front else 1):
                before = directory_lookups(metrics_port)
                mailbench(tier.work, target, a.msgs, a.conns, a.size,
                          a.users, "warmup", seed)
                seed += 1
                if not is_front:
                    break
                reads = directory_lookups(metrics_port)[1] - before[1]
                log("warm-up %s: %d etcd reads" % (name, reads))
                prev = warm[name][-1] if warm[name] else None
                warm[name].append(reads)
                if reads < a.msgs / 200 or (prev is not None
                                            and reads >= 0.8 * prev):
                    break
        for r in range(a.runs):
            order = targets[r % 3:] + targets[:r % 3]
            for name, target, is_front in order:
                before = directory_lookups(metrics_port)
                j = mailbench(tier.work, target, a.msgs, a.conns, a.size,
                              a.users, "run", seed)
                seed += 1
                after = directory_lookups(metrics_port)
                row = {"msgs_per_s": j["msgs_per_s"],
                       "p99_ms": j["latency_ms"]["DELIVERY"]["p99"],
                       "load1": j.get("host", {}).get("load1")}
                if is_front:
                    row["reads"] = after[1] - before[1]
                    row["cached"] = after[0] - before[0]
                    row["reads_per_msg"] = row["reads"] / j["delivered_msgs"]
                res[name].append(row)
                log("round %d %s: %.0f msgs/s, p99 %.1f ms%s"
                    % (r + 1, name, row["msgs_per_s"], row["p99_ms"],
                       ", %d etcd reads" % row["reads"] if is_front else ""))

        moves = []
        for k in range(1, a.move_runs + 1):
            user = "m1v%d" % k     # mailbench's --user m%dv<k>, mailbox 1
            p = subprocess.run([CYR_USER, "-C", front.imapd_conf, "create",
                                user, "alpha"], capture_output=True,
                               timeout=120)
            if p.returncode != 0:
                raise RuntimeError("cyr_user create: %r" % p.stderr)
            log("move %d: %d messages into %s" % (k, a.move_msgs, user))
            mailbench(tier.work, alpha.lmtp_addr(), a.move_msgs, 10, a.size,
                      1, "fill", seed, fmt="m%%dv%d" % k)
            seed += 1
            subprocess.run(["sync"])
            t0 = time.monotonic()
            p = subprocess.run([CYR_USER, "-C", front.imapd_conf, "move",
                                user, "beta"], capture_output=True,
                               timeout=3600)
            dt = time.monotonic() - t0
            out = p.stdout.decode(errors="replace").strip()
            if p.returncode != 0:
                raise RuntimeError("cyr_user move: %s %r" % (out, p.stderr))
            moves.append({"seconds": dt, "cyr_user": out})
            log("move %d: %.2f s: %s" % (k, dt, out))
        rc = 0
    except Exception as e:  # noqa: BLE001 - reported, then torn down
        log("failed: %s" % e)
    finally:
        rc = tier.finish(rc, insts, loglines=20)
    if rc != 0:
        return rc

    load1 = read_text("/proc/loadavg").split()[:3]
    p = print
    p("Load average %s at the start, %s at the end (1, 5, 15 min); %d CPUs."
      % (" ".join(load0), " ".join(load1), os.cpu_count()))
    p("")
    p("| target (%d connections, %d messages of %d bytes to %d users) | "
      "msgs/s | range | DELIVERY p99 ms | etcd reads / delivery | "
      "cache answers / delivery |" % (a.conns, a.msgs, a.size, a.users))
    p("|---|---:|---:|---:|---:|---:|")
    direct = med(r["msgs_per_s"] for r in res[targets[2][0]])
    for name, _, is_front in targets:
        rs = res[name]
        rates = [r["msgs_per_s"] for r in rs]
        reads = ("%.4f (%s)" % (med(r["reads_per_msg"] for r in rs),
                                " ".join(str(r["reads"]) for r in rs))
                 if is_front else "-")
        cached = ("%.2f" % med(r["cached"] / a.msgs for r in rs)
                  if is_front else "-")
        ratio = (" (%.2fx)" % (med(rates) / direct)) if is_front and direct \
            else ""
        p("| %s | %.0f%s | %.0f-%.0f | %.1f | %s | %s |"
          % (name, med(rates), ratio, min(rates), max(rates),
             med(r["p99_ms"] for r in rs), reads, cached))
    p("")
    p("Medians of %d interleaved runs; (Nx) = through the frontend over "
      "straight to the backend; etcd reads: the median per delivery (each "
      "run's count in brackets).  Before them, warm-up runs of the same "
      "size (not counted) read the directory this often: %s."
      % (a.runs, "; ".join("%s: %s" % (n, " ".join(str(x) for x in w))
                          for n, w in warm.items() if w)))
    if moves:
        p("")
        ms = [m["seconds"] for m in moves]
        p("| cyr_user move | seconds (median) | runs | messages/s |")
        p("|---|---:|---:|---:|")
        p("| %d messages of %d bytes, alpha to beta | %.1f | %s | %.0f |"
          % (a.move_msgs, a.size, med(ms), " ".join("%.1f" % x for x in ms),
             a.move_msgs / med(ms)))
        p("")
        p("cyr_user's own line (last run): `%s`" % moves[-1]["cyr_user"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load_start": load0, "load_end": load1,
                       "args": vars(a), "throughput": res,
                       "warmup_reads": warm, "moves": moves},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
