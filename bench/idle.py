#!/usr/bin/env python3
"""idle.py - what idle IMAP IDLE sessions cost, and how soon they hear of
a delivery.

    top_builddir=BUILD bench/idle.py [-n SESSIONS] [-u USERS] [-s SECONDS]
                                     [-d DELIVERIES] [-r RUNS]

A private master (imapd on 127.0.0.1, lmtpd on a UNIX socket, the build's
binaries) with USERS mailboxes; SESSIONS plain-text sessions (LOGIN,
SELECT INBOX, IDLE) spread over the users.  Then, while nothing happens,
the CPU time (user + system, from /proc) of the master and every child
over SECONDS, and the voluntary context switches (wake-ups) of the
children; then DELIVERIES messages over LMTP, one at a time, each to a
random user, timed from the start of the LMTP transaction to the first
"* N EXISTS" on one of that user's sessions.  RUNS times (default 3);
medians are printed as a table, one line per run before it.

Compare two builds by running it with each top_builddir, e.g. before and
after a change; bench/run.sh -x idle does this for the current build.
"""
import argparse
import os
import random
import resource
import select
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(HERE), "tests", "imapd")]
from imaphelp import ImapInstance, make_sasldb_extra  # noqa: E402
from lmtphelp import make_message  # noqa: E402
from testlib import children_of, proc_stat  # noqa: E402

PW = "idle-pw"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    """utime + stime of pid in clock ticks (0 when it is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def switches(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for ln in f:
                if ln.startswith("voluntary_ctxt_switches:"):
                    return int(ln.split()[1])
    except OSError:
        pass
    return 0


class Session:
    def __init__(self, addr, user):
        self.user = user
        deadline = time.monotonic() + 60
        while True:             # the listener may not be there yet
            try:
                self.sock = socket.create_connection(addr, timeout=120)
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.buf = b""

    def line(self):
        while b"\r\n" not in self.buf:
            d = self.sock.recv(65536)
            if not d:
                raise EOFError("server closed the connection")
            self.buf += d
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def cmd(self, tag, text):
        self.sock.sendall(("%s %s\r\n" % (tag, text)).encode())
        while True:
            ln = self.line()
            if ln.startswith(tag.encode() + b" "):
                if not ln.startswith(tag.encode() + b" OK"):
                    raise RuntimeError("%s: %r" % (text, ln))
                return

    def idle(self):
        self.cmd("a", "LOGIN %s %s" % (self.user, PW))
        self.cmd("b", "SELECT INBOX")
        self.sock.sendall(b"c IDLE\r\n")
        while not self.line().startswith(b"+"):
            pass


def one_run(args, seq):
    users = ["iu%03d" % k for k in range(args.users)]
    inst = ImapInstance("idlebench", conf={"allowplaintext": "yes",
                                           "duplicatesuppression": "no"},
                        sasl=(users[0], PW))
    sessions = []
    try:
        for u in users[1:]:
            make_sasldb_extra(inst, u, PW)
        for u in users:
            inst.create("user." + u)
        inst.write_cyrus_conf(prefork=0, maxchild=-1 if args.sessions + 20
                              > 1000 else args.sessions + 20,
                              imaps=False)
        inst.start(ready=0)
        by_user = {u: [] for u in users}
        for k in range(args.sessions):
            s = Session(inst.addr(), users[k % len(users)])
            s.idle()
            sessions.append(s)
            by_user[s.user].append(s)
        time.sleep(2)                       # settle
        pids = [inst.proc.pid] + children_of(inst.proc.pid,
                                             include_zombies=False)
        c0 = sum(cpu_ticks(p) for p in pids)
        w0 = sum(switches(p) for p in pids[1:])
        t0 = time.monotonic()
        time.sleep(args.seconds)
        el = time.monotonic() - t0
        c1 = sum(cpu_ticks(p) for p in pids)
        w1 = sum(switches(p) for p in pids[1:])
        cpu_ms_s = (c1 - c0) * 1000.0 / TICK / el
        wakes_s = (w1 - w0) / el
        lat = []
        for d in range(args.deliveries):
            u = random.choice(users)
            socks = {s.sock: s for s in by_user[u]}
            t = time.monotonic()
            inst.lmtp_deliver(u, make_message("idle.%d.%d.%d@bench"
                                              % (os.getpid(), seq, d)))
            acked = time.monotonic()
            got = None
            deadline = t + 60
            while got is None and time.monotonic() < deadline:
                r, _, _ = select.select(list(socks), [], [], 1)
                for sk in r:
                    s = socks[sk]
                    ln = s.line()
                    if ln.endswith(b" EXISTS"):
                        got = time.monotonic()
            if got is None:
                raise RuntimeError("no EXISTS within 60 s of a delivery")
            lat.append(((got - t) * 1000.0, (got - acked) * 1000.0))
            # drain what the other sessions of u were told (RECENT too)
            time.sleep(0.05)
            for s in by_user[u]:
                s.sock.setblocking(False)
                try:
                    while True:
                        d2 = s.sock.recv(65536)
                        if not d2:
                            break
                except BlockingIOError:
                    pass
                s.sock.setblocking(True)
                s.buf = b""
        full = sorted(x[0] for x in lat)
        after = sorted(x[1] for x in lat)
        return cpu_ms_s, wakes_s, statistics.median(full), \
            full[int(0.9 * (len(full) - 1))], statistics.median(after)
    finally:
        for s in sessions:
            try:
                s.sock.close()
            except OSError:
                pass
        inst.stop()
        inst.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--sessions", type=int, default=1000)
    ap.add_argument("-u", "--users", type=int, default=100)
    ap.add_argument("-s", "--seconds", type=float, default=20)
    ap.add_argument("-d", "--deliveries", type=int, default=20)
    ap.add_argument("-r", "--runs", type=int, default=3)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, args.sessions + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    rows = []
    for k in range(args.runs):
        row = one_run(args, k)
        rows.append(row)
        print("run %d: cpu %.1f ms/s, wake-ups %.0f/s, EXISTS median %.1f "
              "ms p90 %.1f ms from the LMTP start, %.1f ms after the 250"
              % ((k + 1,) + row), file=sys.stderr)
    med = [statistics.median(r[i] for r in rows) for i in range(5)]
    print("| idle IDLE sessions | server CPU (ms per s) | wake-ups per s "
          "| LMTP start -> EXISTS median (ms) | p90 (ms) "
          "| 250 -> EXISTS median (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    print("| %d | %.1f | %.0f | %.1f | %.1f | %.1f |"
          % ((args.sessions,) + tuple(med)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
