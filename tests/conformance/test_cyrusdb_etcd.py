#!/usr/bin/env python3
"""test_cyrusdb_etcd.py - the cyrusdb "etcd" backend against a private
3-member etcd cluster on 127.0.0.1 (free ports, data under $TEST_TMPDIR,
every member started and stopped by PID):

  conformance  the cyrusdb conformance suite (test_cyrusdb) with
               TEST_BACKENDS=etcd
  dbtool       cyr_dbtool set / get / show / delete against the cluster
  convert      cvt_cyrusdb flat -> etcd -> flat, byte order and mailbox
               order: the dumps and the files are byte-identical
  leader_kill  the leader is killed while a client stores and reads back:
               every answer is either right or an I/O error (never "not
               found" for a stored key, never an old value), and once a
               new leader is elected every operation succeeds
  garbage      endpoints that answer junk (not JSON, JSON that is not
               etcd's, HTTP 500, nothing at all) give I/O errors, no crash
               and no data; with a good endpoint behind, reads go on
  latency      rough fetch and store latency, printed as "# " notes

Skipped (exit 77) when /usr/bin/etcd or etcdctl is missing.  Names of
tests in $ETCD_TESTS run only those.
"""
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import (TMPDIR, TOP_BUILDDIR, Fail, Skip, check, free_port,  # noqa: E402
                     read_text, run_tests, wait_until)

ETCD = "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"
DBTOOL = os.path.join(TOP_BUILDDIR, "tools", "cyr_dbtool")
CVT = os.path.join(TOP_BUILDDIR, "tools", "cvt_cyrusdb")
SUITE = os.path.join(TOP_BUILDDIR, "tests", "conformance", "test_cyrusdb")


class Cluster:
    """Three etcd members on loopback; stop() kills each by its PID."""

    def __init__(self, root):
        self.root = root
        self.token = "cyrusdeliver-test-%d" % os.getpid()
        self.members = []
        for i in range(3):
            self.members.append({"name": "m%d" % i, "client": free_port(),
                                 "peer": free_port(), "proc": None})
        self.initial = ",".join("%s=http://127.0.0.1:%d" % (m["name"], m["peer"])
                                for m in self.members)

    def url(self, m):
        return "http://127.0.0.1:%d" % m["client"]

    def endpoints(self, first=None):
        ms = sorted(self.members, key=lambda m: m is not first)
        return ",".join(self.url(m) for m in ms)

    def start(self):
        for m in self.members:
            ddir = os.path.join(self.root, m["name"])
            log = open(os.path.join(self.root, m["name"] + ".log"), "wb")
            m["proc"] = subprocess.Popen(
                [ETCD, "--name", m["name"], "--data-dir", ddir,
                 "--listen-client-urls", self.url(m),
                 "--advertise-client-urls", self.url(m),
                 "--listen-peer-urls", "http://127.0.0.1:%d" % m["peer"],
                 "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % m["peer"],
                 "--initial-cluster", self.initial,
                 "--initial-cluster-state", "new",
                 "--initial-cluster-token", self.token,
                 # cyrusdb transactions and values are bigger than etcd's
                 # defaults (128 operations, 1.5 MiB per request)
                 "--max-txn-ops", "20000",
                 "--max-request-bytes", str(16 << 20)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()

    def status(self, m):
        """(is_leader, leader_id) from etcdctl, or None."""
        try:
            out = subprocess.run(
                [ETCDCTL, "--endpoints", self.url(m), "endpoint", "status",
                 "-w", "json", "--command-timeout=2s"],
                env=dict(os.environ, ETCDCTL_API="3"), capture_output=True,
                timeout=10).stdout
            st = json.loads(out)[0]["Status"]
            return st["header"]["member_id"] == st["leader"], st["leader"]
        except (subprocess.SubprocessError, ValueError, KeyError, IndexError,
                TypeError):
            return None

    def leader(self, timeout=60, exclude=None):
        """The member that is leader, agreed on by every live member."""
        def find():
            live = [m for m in self.members
                    if m["proc"] and m["proc"].poll() is None and m is not exclude]
            sts = [(m, self.status(m)) for m in live]
            if not sts or any(s is None for _, s in sts):
                return None
            if len({s[1] for _, s in sts}) != 1 or not sts[0][1][1]:
                return None
            leaders = [m for m, s in sts if s[0]]
            return leaders[0] if len(leaders) == 1 else None
        return wait_until(find, timeout, step=0.2)

    def kill(self, m):
        if m["proc"] and m["proc"].poll() is None:
            m["proc"].send_signal(signal.SIGKILL)
            m["proc"].wait()

    def stop(self):
        for m in self.members:
            p = m["proc"]
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for m in self.members:
            p = m["proc"]
            if p:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.send_signal(signal.SIGKILL)
                    p.wait()


CLUSTER = None
WORK = None


# A request to a healthy cluster gets this long: a loaded shared machine
# (the sanitizer build beside other tests' fsync storms) can hold an etcd
# member's WAL fsync for seconds, and a write that times out is an I/O
# error, not retried.  Tests of failing members give their own timeout.
HEALTHY_TIMEOUT_MS = 30000


def conf_file(name, endpoints, timeout_ms=HEALTHY_TIMEOUT_MS, prefix=None):
    path = os.path.join(WORK, name + ".conf")
    with open(path, "w") as f:
        f.write("etcd_endpoints: %s\n" % endpoints)
        f.write("etcd_timeout: %d\n" % timeout_ms)
        f.write("etcd_prefix: %s\n" % (prefix or "/cyrusdeliver-test-%d/" % os.getpid()))
    return path


def dbtool(conf, *args, stdin=None, timeout=60):
    p = subprocess.run([DBTOOL, "-C", conf] + list(args), input=stdin,
                       capture_output=True, timeout=timeout)
    check(p.returncode >= 0, "cyr_dbtool %s died of signal %d: %s"
          % (args, -p.returncode, p.stderr))
    return p


def test_conformance():
    env = dict(os.environ, TEST_BACKENDS="etcd",
               TEST_ETCD_ENDPOINTS=CLUSTER.endpoints(),
               TEST_ETCD_PREFIX="/cyrusdeliver-suite-%d/" % os.getpid(),
               TEST_ETCD_TIMEOUT=str(HEALTHY_TIMEOUT_MS),
               TEST_LOG="1")
    p = subprocess.run([SUITE], env=env, capture_output=True, timeout=1200)
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    ran = [ln for ln in out.splitlines() if ln.startswith("[       OK ]")]
    print("# conformance: %d cases passed against the cluster" % len(ran))
    # on a failure, what the etcd client logged (why a request failed)
    # beside the suite's own lines
    etcd_lines = [ln for ln in err.splitlines() if "etcd" in ln]
    check(p.returncode == 0 and ran, "test_cyrusdb with TEST_BACKENDS=etcd:\n"
          + out[-3000:] + "\n" + err[-1500:] + "\n# etcd log lines:\n"
          + "\n".join(etcd_lines[-20:]))


def test_dbtool():
    conf = conf_file("dbtool", CLUSTER.endpoints())
    db = "/srv/mail/dbtool.db"
    p = dbtool(conf, db, "etcd", "get", "k")
    check(p.returncode == 1 and b"no such database" in p.stderr,
          "missing database: %r" % (p.stderr,))
    check(dbtool(conf, "-n", db, "etcd", "set", "user.alice", "1 default").returncode == 0,
          "set failed")
    p = dbtool(conf, db, "etcd", "set", stdin=b"user.bob\t2 default\nuser.carol\t3 x\n")
    check(p.returncode == 0, "set from stdin: %r" % (p.stderr,))
    p = dbtool(conf, db, "etcd", "get", "user.bob")
    check(p.stdout == b"2 default\n", "get: %r" % (p.stdout,))
    p = dbtool(conf, db, "etcd", "show")
    check(p.stdout == b"user.alice\t1 default\nuser.bob\t2 default\nuser.carol\t3 x\n",
          "show: %r" % (p.stdout,))
    p = dbtool(conf, db, "etcd", "show", "user.b")
    check(p.stdout == b"user.bob\t2 default\n", "show prefix: %r" % (p.stdout,))
    check(dbtool(conf, db, "etcd", "delete", "user.bob").returncode == 0, "delete")
    p = dbtool(conf, db, "etcd", "get", "user.bob")
    check(p.returncode == 1 and b"not found" in p.stderr, "get deleted: %r" % (p.stderr,))
    p = dbtool(conf, db, "etcd", "consistent")
    check(p.returncode == 0, "consistent: %r %r" % (p.stdout, p.stderr))
    # what is in etcd: the marker and the records under the prefix
    out = subprocess.run([ETCDCTL, "--endpoints", CLUSTER.endpoints(), "get",
                          "--prefix", "/cyrusdeliver-test-%d/srv/mail/dbtool.db/" % os.getpid(),
                          "--keys-only"], env=dict(os.environ, ETCDCTL_API="3"),
                         capture_output=True, timeout=30).stdout.split()
    check(len(out) == 3 and out[1].endswith(b"/user.alice"),
          "etcd keys: %r" % (out,))


def convert_round(mbox):
    flag = ["-M"] if mbox else []
    tag = "mbox" if mbox else "raw"
    conf = conf_file("cvt", CLUSTER.endpoints())
    src = os.path.join(WORK, "src-%s.db" % tag)
    back = os.path.join(WORK, "back-%s.db" % tag)
    lines = []
    for i in range(600):
        lines.append("user.u%03d\t%d default" % (i, i))
        lines.append("user.u%03d.Sent\t%d x" % (i, i))
        lines.append("user.u%03d-x\t\\x00\\x01bin\\xff%d" % (i, i))
    p = subprocess.run([DBTOOL, "-x", "-n"] + flag + [src, "flat", "set"],
                       input=("\n".join(lines) + "\n").encode(), capture_output=True)
    check(p.returncode == 0, "fill flat: %r" % (p.stderr,))
    name = "/cvt/%s-%d.db" % (tag, time.monotonic_ns())
    p = subprocess.run([CVT, "-C", conf] + flag + [src, "flat", name, "etcd"],
                       capture_output=True, timeout=300)
    check(p.returncode == 0, "flat -> etcd: %r" % (p.stderr,))
    p = subprocess.run([CVT, "-C", conf] + flag + [name, "etcd", back, "flat"],
                       capture_output=True, timeout=300)
    check(p.returncode == 0, "etcd -> flat: %r" % (p.stderr,))
    d1 = dbtool(conf, *(flag + [src, "flat", "dump"])).stdout
    d2 = dbtool(conf, *(flag + [name, "etcd", "dump"])).stdout
    d3 = dbtool(conf, *(flag + [back, "flat", "dump"])).stdout
    check(d1.count(b"\n") == 1800, "flat dump has %d lines" % d1.count(b"\n"))
    check(d1 == d2, "etcd dump differs from the flat one (%s order)" % tag)
    check(d1 == d3, "dump after the round trip differs (%s order)" % tag)
    with open(src, "rb") as a, open(back, "rb") as b:
        check(a.read() == b.read(), "flat files differ after the round trip (%s)" % tag)


def test_convert():
    convert_round(False)
    convert_round(True)


def test_leader_kill():
    leader = CLUSTER.leader()
    check(leader, "no leader")
    # the leader first in the list: after it dies, the client moves on.
    # The requests around the kill get 2 s (an I/O error there is
    # allowed); the seed before and the read after get the healthy
    # cluster's time, which a loaded machine may need.
    conf = conf_file("kill", CLUSTER.endpoints(first=leader), timeout_ms=2000)
    healthy = conf_file("kill-healthy", CLUSTER.endpoints())
    db = "/kill/db-%d" % time.monotonic_ns()
    check(dbtool(healthy, "-n", db, "etcd", "set", "seed", "0").returncode == 0, "seed")
    known = {}        # key -> value surely stored
    maybe = {}        # key -> value whose store ended in an I/O error
    ok = errors = 0
    killed_at = None
    t_end = time.monotonic() + 300
    i = 0
    recovered = 0
    while time.monotonic() < t_end:
        i += 1
        if i == 15:
            CLUSTER.kill(leader)
            killed_at = i
        key = "k%d" % (i % 7)
        val = "v%d" % i
        p = dbtool(conf, db, "etcd", "set", key, val)
        if p.returncode == 0:
            known[key] = val
            maybe.pop(key, None)
            ok += 1
        else:
            check(b"I/O error" in p.stderr, "set failed without an I/O error: %r" % (p.stderr,))
            maybe[key] = val
            errors += 1
        p = dbtool(conf, db, "etcd", "get", key)
        if p.returncode == 0:
            got = p.stdout.decode().rstrip("\n")
            allowed = {known.get(key), maybe.get(key)}
            check(got in allowed, "get %s = %r, expected one of %r" % (key, got, allowed))
            known[key] = got
            maybe.pop(key, None)
            ok += 1
        else:
            check(b"I/O error" in p.stderr,
                  "get failed without an I/O error (wrong answer?): %r" % (p.stderr,))
            errors += 1
        if killed_at and i > killed_at and p.returncode == 0:
            recovered += 1
            if recovered >= 10:
                break
    check(recovered >= 10, "no 10 good reads after the leader was killed "
          "(ok %d, errors %d)" % (ok, errors))
    new = CLUSTER.leader(exclude=leader)
    check(new and new is not leader, "no new leader")
    p = dbtool(healthy, db, "etcd", "show")
    check(p.returncode == 0, "show after failover: %r" % (p.stderr,))
    print("# leader_kill: %d operations answered, %d I/O errors around the "
          "failover, new leader %s" % (ok, errors, new["name"]))


class Junk(http.server.BaseHTTPRequestHandler):
    mode = "text"
    release = threading.Event()   # set when the test ends

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(n)
        if Junk.mode == "hang":
            # no answer before the client's timeout, however long: the
            # connection is held until the test ends
            Junk.release.wait(300)
            return
        body, status = {
            "text": (b"<html>hello</html>\x00\xff", 200),
            "json": (b'{"kvs": "nope", "count": 7}', 200),
            "badkv": (b'{"header":{"revision":"5"},"kvs":[{"key":"!!!","value":3}]}', 200),
            "500": (b'{"error":"etcdserver: no leader","code":14}', 503),
        }[Junk.mode]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_garbage():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Junk)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    fake = "http://127.0.0.1:%d" % srv.server_address[1]
    try:
        good = conf_file("good", CLUSTER.endpoints())
        db = "/garbage/db"
        check(dbtool(good, "-n", db, "etcd", "set", "k", "v").returncode == 0, "seed")
        # A junk answer comes at once: the healthy cluster's timeout.  A
        # member that hangs is given up after the timeout, which then is
        # also all the good member behind it gets: 1 s where nothing good
        # is behind, 10 s where a loaded machine's etcd must answer.
        only = conf_file("junk", fake)
        both = conf_file("both", fake + "," + CLUSTER.endpoints())
        only_hang = conf_file("junk-hang", fake, timeout_ms=1000)
        both_hang = conf_file("both-hang", fake + "," + CLUSTER.endpoints(),
                              timeout_ms=10000)
        for mode in ("text", "json", "badkv", "500", "hang"):
            Junk.mode = mode
            if mode == "hang":
                only, both = only_hang, both_hang
            for action in (["get", "k"], ["show"], ["set", "k", "w"]):
                p = dbtool(only, db, "etcd", *action)
                check(p.returncode == 1 and b"I/O error" in p.stderr,
                      "%s answer, %s: rc %d %r" % (mode, action[0], p.returncode, p.stderr))
                check(p.stderr.count(b"etcd: request failed") == 1,
                      "%s answer, %s: failures not logged once: %r"
                      % (mode, action[0], p.stderr))
                check(b"not found" not in p.stderr and p.stdout == b"",
                      "%s answer, %s: data or not found: %r %r"
                      % (mode, action[0], p.stdout, p.stderr))
            p = dbtool(both, db, "etcd", "get", "k")
            check(p.returncode == 0 and p.stdout == b"v\n",
                  "%s answer first, a good member behind: %r" % (mode, p.stderr))
        p = dbtool(good, db, "etcd", "get", "k")
        check(p.stdout == b"v\n", "the junk changed the data: %r" % (p.stdout,))
    finally:
        Junk.release.set()
        srv.shutdown()
        srv.server_close()


def test_latency():
    conf = conf_file("lat", CLUSTER.endpoints())
    db = "/latency/db"
    n = 40
    batch_get = "".join("get k%d\n" % (i % 5) for i in range(n)).encode()
    check(dbtool(conf, "-n", db, "etcd", "set",
                 stdin=b"".join(b"k%d\tvalue\n" % i for i in range(5))).returncode == 0, "seed")

    def timed(args, stdin=None):
        t0 = time.monotonic()
        p = dbtool(conf, *args, stdin=stdin)
        check(p.returncode == 0, "%r: %r" % (args, p.stderr))
        return time.monotonic() - t0
    # one process, n fetches in one transaction vs one fetch: the difference
    # is (n - 1) fetches
    t1 = min(timed([db, "etcd", "batch"], b"get k0\n") for _ in range(3))
    tn = min(timed([db, "etcd", "batch"], batch_get) for _ in range(3))
    # one process that stores vs one that fetches: same start and open
    g1 = min(timed([db, "etcd", "get", "k0"]) for _ in range(7))
    s1 = min(timed([db, "etcd", "set", "s", "x"]) for _ in range(7))
    fetch = (tn - t1) / (n - 1)
    print("# latency (rough, process timings): fetch ~%.2f ms (linearizable "
          "range), store ~%.2f ms (one put, committed on a quorum)"
          % (fetch * 1000, (s1 - g1 + fetch) * 1000))


def main():
    global CLUSTER, WORK
    if not os.access(ETCD, os.X_OK) or not os.access(ETCDCTL, os.X_OK):
        print("SKIP: all (no %s or etcdctl: scripts/deps.sh --test installs "
              "etcd-server and etcd-client)" % ETCD)
        return 77
    WORK = tempfile.mkdtemp(prefix="etcd.", dir=TMPDIR)
    CLUSTER = Cluster(WORK)
    try:
        CLUSTER.start()
        if not CLUSTER.leader(90):
            for m in CLUSTER.members:
                print("# %s log:\n%s" % (m["name"], read_text(
                    os.path.join(WORK, m["name"] + ".log"))[-2000:]))
            print("FAIL: setup (the cluster elected no leader in 90 s)")
            return 1
        tests = [test_conformance, test_dbtool, test_convert, test_garbage,
                 test_latency, test_leader_kill]
        rc = run_tests(tests, "ETCD_TESTS", [DBTOOL, CVT, SUITE])
    finally:
        CLUSTER.stop()
    left = [m["name"] for m in CLUSTER.members if m["proc"] and m["proc"].poll() is None]
    if left:
        print("FAIL: members still running: %s" % left)
        return 1
    if rc == 0:
        shutil.rmtree(WORK, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
