#!/usr/bin/env python3
"""imaplat.py - per-command latency and system calls of one IMAP session
against a private master + imapd from a build directory (no other load).

  top_builddir=BUILD TEST_TMPDIR=DIR python3 bench/imaplat.py [-n N]
      [--strace] [--conf KEY=VALUE]...

One user with 50 messages; N rounds of: UID STORE +FLAGS (\\Seen), UID
STORE -FLAGS (\\Seen), UID STORE +FLAGS.SILENT (\\Flagged), APPEND with
(\\Seen), UID STORE +FLAGS.SILENT (\\Deleted) + UID EXPUNGE, UID FETCH
of the headers; prints the median and 90th percentile of each command in
milliseconds.  --strace: the session's worker runs under `strace -f -c
-p` and the counts per command kind are printed (each kind run alone,
N times).
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "imapd"))
from imaphelp import ImapInstance, Raw, make_message  # noqa: E402

PW = "pw-lat"
MSG = make_message(msgid="append@test", body="appended\r\n" * 20)
MSG = MSG if isinstance(MSG, bytes) else MSG.encode()


def session(inst):
    c = Raw(inst.addr())
    c.line()
    r = c.cmd("L", "LOGIN lat %s" % PW)
    assert r[-1].startswith(b"L OK"), r
    r = c.cmd("S", "SELECT INBOX")
    assert r[-1].startswith(b"S OK"), r
    return c


class Ops:
    def __init__(self, c):
        self.c = c
        self.n = 0
        self.uid = 1

    def cmd(self, text):
        self.n += 1
        t = "T%d" % self.n
        r = self.c.cmd(t, text)
        assert r[-1].startswith(t.encode() + b" OK"), (text, r)
        return r

    def append(self):
        self.n += 1
        t = "T%d" % self.n
        self.c.send(("%s APPEND INBOX (\\Seen) {%d}\r\n" % (t, len(MSG)))
                    .encode())
        line = self.c.line()
        assert line.startswith(b"+"), line
        self.c.send(MSG + b"\r\n")
        r = self.c.until_tagged(t)
        assert r[-1].startswith(t.encode() + b" OK"), r

    def expunge(self):
        self.cmd("UID STORE %d +FLAGS.SILENT (\\Deleted)" % self.uid)
        self.cmd("UID EXPUNGE %d" % self.uid)
        self.uid += 1


KINDS = {
    "store_seen": lambda o: (o.cmd("UID STORE 40 +FLAGS (\\Seen)"),
                             o.cmd("UID STORE 40 -FLAGS (\\Seen)")),
    "store_flagged": lambda o: (o.cmd("UID STORE 41 +FLAGS.SILENT (\\Flagged)"),
                                o.cmd("UID STORE 41 -FLAGS.SILENT (\\Flagged)")),
    "append": lambda o: o.append(),
    "expunge": lambda o: o.expunge(),
    "fetch": lambda o: o.cmd("UID FETCH 45 (FLAGS BODY.PEEK[HEADER])"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--strace", action="store_true")
    ap.add_argument("--trace", action="store_true",
                    help="with --strace: keep a full trace per kind")
    ap.add_argument("--conf", action="append", default=[])
    a = ap.parse_args()
    conf = {"allowplaintext": "yes"}
    for kv in a.conf:
        k, v = kv.split("=", 1)
        conf[k] = v
    inst = ImapInstance("imaplat", conf=conf, sasl=("lat", PW))
    try:
        inst.create("user.lat")
        for n in range(2 * a.n + 50):
            inst.mbtool("deliver", "-M", "user.lat",
                        input=make_message(msgid="m%d@test" % n))
        inst.write_cyrus_conf(imaps=False, lmtp=False, prefork=1)
        inst.start()
        for kind, fn in KINDS.items():
            c = session(inst)
            o = Ops(c)
            fn(o)    # warm up
            tr = None
            if a.strace:
                pids = subprocess.run(["pgrep", "-P", str(inst.proc.pid)],
                                      capture_output=True, text=True).stdout
                # the worker serving this session: the one with a TCP peer
                out = os.path.join(inst.dir if hasattr(inst, "dir") else
                                   os.environ["TEST_TMPDIR"],
                                   "strace-%s.txt" % kind)
                args = ["strace", "-f", "-o", out] + (
                    ["-c"] if not a.trace else ["-T", "-e",
                    "trace=fsync,fdatasync,syncfs,openat,unlink,unlinkat,"
                    "rename,pwrite64,fcntl,write,newfstatat,fstat,pread64,mmap,munmap,close,read,sendto,recvfrom,poll"])
                for p in pids.split():
                    args += ["-p", p]
                tr = subprocess.Popen(args, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            lat = []
            for _ in range(a.n):
                t0 = time.perf_counter()
                fn(o)
                lat.append((time.perf_counter() - t0) * 1000)
            if tr:
                tr.send_signal(signal.SIGINT)
                tr.wait()
            c.cmd("Z", "LOGOUT")
            c.close()
            lat.sort()
            print("%-14s median %7.3f ms  p90 %7.3f ms" %
                  (kind, statistics.median(lat),
                   lat[int(len(lat) * 0.9) - 1]))
            if tr and a.trace:
                print("    trace in", out)
            elif tr:
                with open(out) as f:
                    for line in f:
                        w = line.split()
                        if len(w) >= 5 and w[-1] in (
                                "fdatasync", "fsync", "syncfs", "unlinkat",
                                "openat", "newfstatat", "pwrite64", "pread64",
                                "fcntl"):
                            calls = int(w[3])
                            print("    %-12s %6.1f per op" % (w[-1],
                                                             calls / a.n))
    finally:
        inst.stop()
        inst.cleanup()


main()
