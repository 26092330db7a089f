#!/usr/bin/env python3
"""test_master.py - the master process manager end to end.

Each test writes an imapd.conf and a cyrus.conf into its own temporary
directory under $TEST_TMPDIR (default /var/tmp), starts the real
$top_builddir/master/master in the foreground with its log on stderr
(redirected to a file), drives it with real clients over UNIX and TCP
sockets and with signals, then stops it by its PID (SIGTERM, SIGKILL after a
timeout) and checks that none of the processes it started is left (pgrep -P
while the master lives, then the recorded PIDs and every process carrying
the test's environment tag).  The services are tests/master/testsvc
(echo, slow SECS, exit, crash; mark/fail/daemon for START and DAEMON).

Environment: top_builddir (default "."), TEST_TMPDIR, MASTER_TESTS (space
separated test names, to run a subset).  Output: "PASS: name" / "FAIL: name"
/ "SKIP: name (why)" lines and a final "N passed, N failed" line; exit
status 0 only when nothing failed.  Python 3 standard library only.

EVENTS entries are not exercised here: their period/at granularity is a
minute, too slow for this suite.
"""
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from testlib import (MASTER, MASTERSTATUS, RUN_AS, TMPDIR,  # noqa: E402
                     TOP_BUILDDIR, Fail, MasterRun, Skip, alive, check,
                     chown_run_as, cmdline, connect_socket, free_port,
                     pgrep_children, proc_read, proc_stat, read_text,
                     root_stays, run_tests, run_threads, service_line,
                     wait_until)

SVCDIR = os.path.join(TOP_BUILDDIR, "tests", "master")
TESTSVC = os.path.join(SVCDIR, "testsvc")
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Deadline for an event that must happen (a child ready, a socket gone, a
# log line): generous, so that a slow or loaded machine (a sanitizer build
# running beside) waits longer instead of failing; a test that passes
# returns as soon as the event is seen.
EVENT_S = 60


def proc_start_s(pid):
    """When pid was forked, in seconds since boot (the kernel's start time
    of the process, in clock ticks), or None when it is gone."""
    data = proc_read(pid, "stat")
    if data is None:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19]) / CLK_TCK


def kv(key, value):
    """A regex for a log field key=value, also in the key=<value> form."""
    return r"\b%s=<?%s>?(?![\w.])" % (key, value)


# ---- clients -----------------------------------------------------------

class Client:
    """A line-oriented client of a testsvc service."""

    def __init__(self, addr, timeout=EVENT_S):
        self.sock = connect_socket(addr, timeout)
        self.buf = b""
        self.eof = False

    def settimeout(self, t):
        self.sock.settimeout(t)

    def readline(self):
        """One line with its newline, "" at EOF; socket.timeout when none
        came in time (what was read so far is kept for the next call)."""
        while b"\n" not in self.buf and not self.eof:
            data = self.sock.recv(4096)
            if data:
                self.buf += data
            else:
                self.eof = True
        i = self.buf.find(b"\n")
        if i < 0:
            line, self.buf = self.buf, b""
        else:
            line, self.buf = self.buf[:i + 1], self.buf[i + 1:]
        return line.decode(errors="replace")

    def send(self, line):
        self.sock.sendall(line.encode() + b"\n")

    def hello(self):
        line = self.readline()
        m = re.match(r"hello pid=(\d+)\n$", line)
        if not m:
            raise Fail("expected a hello line, got %r" % line)
        return int(m.group(1))

    def close(self):
        self.sock.close()


def echo_session(addr, text="ping", timeout=EVENT_S, pause=0.0):
    """Connect, read hello, send a line, read its echo, quit, read EOF.
    Returns the serving child's PID."""
    c = Client(addr, timeout)
    try:
        pid = c.hello()
        if pause:
            time.sleep(pause)
        c.send(text)
        got = c.readline()
        if got != "echo: %s\n" % text:
            raise Fail("expected echo of %r, got %r" % (text, got))
        c.send("quit")
        rest = c.readline()
        if rest != "":
            raise Fail("expected EOF after quit, got %r" % rest)
        return pid
    finally:
        c.close()


def connect_fails(addr, timeout=1.0):
    try:
        c = Client(addr, timeout)
    except (OSError, socket.timeout):
        return True
    c.close()
    return False


def have_ipv6():
    if not socket.has_ipv6:
        return False
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError:
        return False
    try:
        s.bind(("::1", 0))
        return True
    except OSError:
        return False
    finally:
        s.close()


# ---- the master under test -----------------------------------------------

class Master(MasterRun):
    """One master with its own directory; use as a context manager: leaving
    it stops the master and checks that nothing it started remains."""

    TAG_VAR = "MASTER_TEST_TAG"

    def __init__(self, name):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="master-%s." % name, dir=TMPDIR)
        self.confdir = self.path("conf")
        os.mkdir(self.confdir)
        self.imapd_conf = self.path("imapd.conf")
        self.cyrus_conf = self.path("cyrus.conf")
        self.logfile = self.path("master.log")
        self.statusfile = self.path("master.status")
        self.pidfile = self.path("master.pid")
        with open(self.imapd_conf, "w") as f:
            f.write("configdirectory: %s\n" % self.confdir)
            if root_stays():
                f.write("cyrus_user: root\n")
        # started as root the master becomes cyrus_user (default
        # "cyrus"): that user must own the test's directory
        for d in (self.dir, self.confdir):
            chown_run_as(d)
        self.proc = None
        self.rc = None
        self.seen_children = set()

    def write_conf(self, text):
        tmp = self.cyrus_conf + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, self.cyrus_conf)

    def start(self, wait=True, args=()):
        self.spawn([MASTER, "-D", "-l", "-C", self.imapd_conf, "-M",
                    self.cyrus_conf, "-p", self.pidfile, "-S", SVCDIR,
                    "-s", self.statusfile, "-T", "10"] + list(args))
        if wait:
            ok = wait_until(lambda: self.proc.poll() is not None
                            or "master" in self.status(), EVENT_S)
            if self.proc.poll() is not None:
                raise Fail("master exited at start with status %s"
                           % self.proc.returncode)
            check(ok, "no status file %s %d s after start"
                  % (self.statusfile, EVENT_S))
        return self

    def wait_exit(self, timeout):
        try:
            self.rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.rc

    def wait_ready(self, name, n, timeout=EVENT_S):
        ok = wait_until(lambda: (self.svc_int(name, "ready") or 0) >= n,
                        timeout)
        check(ok, "service %s: fewer than %d ready children after %g s "
              "(status: %s)" % (name, n, timeout, self.service(name)))

    def cpu_ticks(self):
        st = proc_stat(self.pid)
        return st[2] if st else 0

    def stop(self):
        """SIGTERM, SIGKILL after 12 s; returns a list of problems."""
        problems = []
        if self.proc is None:
            # a test that ran masters itself (run_master): what they
            # started, found by the environment tag
            return self.leftovers(3)
        if self.running():
            self.seen_children.update(pgrep_children(self.pid))
            self.seen_children.update(self.child_pids())
            self.proc.send_signal(signal.SIGTERM)
            if self.wait_exit(EVENT_S) is None:
                problems.append("master did not exit %d s after SIGTERM"
                                % EVENT_S)
                self.proc.kill()
                self.wait_exit(5)
        else:
            self.wait_exit(5)
        return problems + self.leftovers(EVENT_S / 2)

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        problems = self.stop()
        if etype is not None:
            tail = self.log().splitlines()[-25:]
            for line in tail:
                print("#   log: %s" % line)
        log = self.log()
        for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
            if bad in log:
                problems.append("sanitizer report in the master's log")
                if etype is None:
                    for line in log.splitlines()[-40:]:
                        print("#   log: %s" % line)
                break
        shutil.rmtree(self.dir, ignore_errors=True)
        if etype is None and problems:
            raise Fail("; ".join(problems))
        return False


def services_conf(*lines, start=(), daemon=(), events=()):
    text = ""
    if start:
        text += "START {\n" + "".join(start) + "}\n"
    text += "SERVICES {\n" + "".join(lines) + "}\n"
    if events:
        text += "EVENTS {\n" + "".join(events) + "}\n"
    if daemon:
        text += "DAEMON {\n" + "".join(daemon) + "}\n"
    return text


def stop_checked(m, expect_rc=0):
    """Stop m by SIGTERM now and check it exits with expect_rc and that its
    children (pgrep -P before, recorded PIDs after) are gone."""
    before = pgrep_children(m.pid)
    problems = m.stop()
    check(not problems, "; ".join(problems))
    check(m.rc == expect_rc, "master exit status %s, expected %d"
          % (m.rc, expect_rc))
    left = [p for p in before if alive(p)]
    check(not left, "children left: %s" % left)


# ---- tests -------------------------------------------------------------

def test_prefork_ready_at_start():
    with Master("prefork") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=3, maxchild=6)))
        m.start()
        m.wait_ready("echo", 3)
        mode = os.stat(sock).st_mode
        check(stat.S_ISSOCK(mode) and mode & 0o777 == 0o777,
              "UNIX socket mode %o, expected a socket with 0777" % mode)
        kids = pgrep_children(m.pid)
        check(len(kids) == 3, "pgrep -P %d: %d children, expected the 3 "
              "preforked: %s" % (m.pid, len(kids), kids))
        ready = m.child_pids("echo", "ready")
        check(sorted(ready) == sorted(kids),
              "status file ready children %s differ from pgrep %s"
              % (ready, kids))
        if RUN_AS is not None:
            for p in [m.pid] + kids:
                uid = os.stat("/proc/%d" % p).st_uid
                check(uid == RUN_AS.pw_uid, "process %d runs as uid %d, "
                      "not as cyrus (%d)" % (p, uid, RUN_AS.pw_uid))
        pid = echo_session(sock)
        check(pid in kids, "served by %d, not one of the preforked %s"
              % (pid, kids))
        check(wait_until(lambda: (m.svc_int("echo", "served") or 0) >= 1,
                         EVENT_S),
              "status file never counted the served connection: %s"
              % m.service("echo"))
        stop_checked(m)


def test_maxchild_50_clients():
    nclients, maxchild = 50, 10
    with Master("maxchild") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=2, maxchild=maxchild)))
        m.start()
        m.wait_ready("echo", 2)

        samples = {"max_procs": 0, "max_total": 0, "n": 0}
        stop_sampling = threading.Event()

        def sampler():
            while not stop_sampling.is_set():
                n = len(m.children())
                t = m.svc_int("echo", "total") or 0
                samples["max_procs"] = max(samples["max_procs"], n)
                samples["max_total"] = max(samples["max_total"], t)
                samples["n"] += 1
                time.sleep(0.02)

        results, errors = [], []
        lock = threading.Lock()
        barrier = threading.Barrier(nclients)

        def client(i):
            try:
                barrier.wait(10)
                pid = echo_session(sock, "ping %d" % i, timeout=EVENT_S,
                                   pause=0.2)
                with lock:
                    results.append(pid)
            except Exception as e:  # noqa: BLE001 - any failure counts
                with lock:
                    errors.append("client %d: %r" % (i, e))

        th = threading.Thread(target=sampler)
        th.start()
        cpu0, t0 = m.cpu_ticks(), time.monotonic()
        clients = [threading.Thread(target=client, args=(i,))
                   for i in range(nclients)]
        run_threads(clients, 40)
        wall = time.monotonic() - t0
        cpu = (m.cpu_ticks() - cpu0) / CLK_TCK
        stop_sampling.set()
        th.join()

        check(not errors, "%d clients failed: %s"
              % (len(errors), "; ".join(errors[:5])))
        check(len(results) == nclients, "%d of %d clients served"
              % (len(results), nclients))
        check(samples["n"] >= 10, "only %d samples" % samples["n"])
        check(samples["max_procs"] <= maxchild,
              "%d child processes seen (maxchild=%d)"
              % (samples["max_procs"], maxchild))
        check(samples["max_total"] <= maxchild,
              "status file total reached %d (maxchild=%d)"
              % (samples["max_total"], maxchild))
        check(len(set(results)) <= maxchild,
              "%d distinct children served (maxchild=%d)"
              % (len(set(results)), maxchild))
        check(samples["max_procs"] >= 5,
              "the master never grew beyond %d children under load"
              % samples["max_procs"])
        # 50 clients x 0.2 s / 10 children >= 1 s of waiting clients; a
        # master polling a readable socket it cannot serve burns it all.
        check(cpu <= 0.05 + 0.25 * wall,
              "master used %.2f s CPU in %.2f s: busy loop?" % (cpu, wall))
        print("#   maxchild: %d clients in %.2f s, master cpu %.2f s, "
              "max children %d, %d samples"
              % (nclients, wall, cpu, samples["max_procs"], samples["n"]))
        stop_checked(m)


def test_sigkill_child_replaced():
    with Master("sigkill") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=2, maxchild=4)))
        m.start()
        m.wait_ready("echo", 2)
        before = m.child_pids("echo")
        victim = before[0]
        os.kill(victim, signal.SIGKILL)
        ok = wait_until(lambda: victim not in m.child_pids("echo")
                        and (m.svc_int("echo", "ready") or 0) >= 2
                        and len(m.children()) == 2, EVENT_S)
        check(ok, "killed child %d not replaced: status %s, children %s"
              % (victim, m.child_pids("echo"), m.children()))
        pat = re.compile(kv("pid", victim) + r".*crashed.*"
                         + kv("signal", 9))
        check(wait_until(lambda: pat.search(m.log()), EVENT_S),
              "no 'pid=%d ... crashed signal=9' in the log" % victim)
        check("SIGKILL" in m.log() or "Killed" in m.log(),
              "the signal name is not logged")
        echo_session(sock)
        stop_checked(m)


def test_crash_logged():
    with Master("crash") as m:
        sock = m.path("crash.sock")
        m.write_conf(services_conf(service_line(
            "crash", "testsvc crash", sock, prefork=1, maxchild=2)))
        m.start()
        m.wait_ready("crash", 1)
        c = Client(sock)
        try:
            victim = c.hello()
            rest = c.readline()
        finally:
            c.close()
        check(rest == "", "expected the connection to end, got %r" % rest)
        pat = re.compile(kv("service", "crash") + ".*" + kv("pid", victim)
                         + r".*crashed.*" + kv("signal", 11))
        check(wait_until(lambda: pat.search(m.log()), EVENT_S),
              "no 'service=crash pid=%d crashed signal=11' in the log"
              % victim)
        ok = wait_until(lambda: (m.svc_int("crash", "ready") or 0) >= 1
                        and victim not in m.child_pids("crash"), EVENT_S)
        check(ok, "crashed child not replaced: %s" % m.service("crash"))
        stop_checked(m)


def test_exit_at_once_backed_off():
    """Five failed starts in a row back the service off for 1 s, then 2 s,
    then 4 s.  Checked on the order of the master's own log lines and on
    lower bounds of elapsed time only, so a slow machine cannot fail it."""
    with Master("backoff") as m:
        bad, good = m.path("bad.sock"), m.path("echo.sock")
        m.write_conf(services_conf(
            service_line("bad", "testsvc exit", bad, prefork=1, maxchild=5),
            service_line("echo", "testsvc echo", good, prefork=1)))
        exit_re = re.compile(kv("service", "bad") + ".*?" + kv("pid", r"\d+")
                             + r".*(?:exited|crashed)")
        t0 = time.monotonic()
        m.start()
        max_backoff = [0]

        def backed_off(seconds):
            b = m.svc_int("bad", "backoff") or 0
            max_backoff[0] = max(max_backoff[0], b)
            return re.search(kv("service", "bad") + r".*backing off "
                             + kv("seconds", seconds), m.log())
        # the third backoff (4 s) follows the 7th failed start, which the
        # master may fork only 1 + 2 s after the 5th failure
        check(wait_until(lambda: backed_off(4), EVENT_S + 3, 0.05),
              "no 'service=bad backing off seconds=<4>' in the log %d s "
              "after start: %s" % (EVENT_S + 3, m.log()[-600:]))
        took = time.monotonic() - t0
        log = m.log()
        lines = log.splitlines()

        def exits_before(seconds):
            n = 0
            for line in lines:
                if re.search(r"backing off " + kv("seconds", seconds), line) \
                        and re.search(kv("service", "bad"), line):
                    return n
                if exit_re.search(line):
                    n += 1
            return None
        n1, n2, n4 = exits_before(1), exits_before(2), exits_before(4)
        print("#   backoff: failed starts before backing off 1/2/4 s: "
              "%s/%s/%s, %.2f s after start" % (n1, n2, n4, took))
        check((n1, n2, n4) == (5, 6, 7), "failed starts logged before the "
              "backoffs of 1, 2 and 4 s: %s, %s and %s, expected 5, 6 and 7"
              % (n1, n2, n4))
        # each start after a backoff waited for it: 1 s, then 2 s
        check(took >= 3.0, "backoff of 4 s reached %.2f s after start: the "
              "1 s and 2 s backoffs were not waited for" % took)
        check(max_backoff[0] > 0, "the status file never showed a backoff")
        check(re.search(kv("service", "bad") + ".*" + kv("status", 1),
                        log),
              "the exit status of the failing child is not logged")
        # the rest of the master is unaffected
        echo_session(good)
        stop_checked(m)


def test_maxforkrate():
    rate, nclients = 4, 16
    with Master("forkrate") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=0, maxchild=nclients,
            maxuses=1, maxforkrate=rate)))
        m.start()
        hellos, errors = [], []
        lock = threading.Lock()

        def client(i):
            try:
                c = Client(sock)
                try:
                    pid = c.hello()
                    # when the master forked it, by the kernel's clock (the
                    # child waits for our quit, so it is still there): a
                    # hello itself may come late on a loaded machine
                    forked = proc_start_s(pid)
                    with lock:
                        hellos.append((forked, pid))
                    c.send("quit")
                    c.readline()
                finally:
                    c.close()
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append("client %d: %r" % (i, e))

        t0 = time.clock_gettime(time.CLOCK_BOOTTIME)   # the kernel's clock
        ts = [threading.Thread(target=client, args=(i,))
              for i in range(nclients)]
        run_threads(ts, EVENT_S)
        check(not errors, "clients failed: %s" % "; ".join(errors[:5]))
        check(len(hellos) == nclients, "%d of %d served"
              % (len(hellos), nclients))
        pids = set(p for _, p in hellos)
        check(len(pids) == nclients, "maxuses=1 but only %d distinct "
              "children served %d connections" % (len(pids), nclients))
        check(None not in [t for t, _ in hellos],
              "a child was gone before its start time was read")
        times = sorted(t for t, _ in hellos)
        worst = max(sum(1 for u in times if t <= u < t + 1.0)
                    for t in times)
        span = times[-1] - t0
        print("#   maxforkrate=%d: %d forks in %.2f s, at most %d in a "
              "second" % (rate, nclients, span, worst))
        # the master keeps every 1-second window at `rate` forks; one more
        # is allowed for the kernel's clock ticks and for the master being
        # held up between reading its clock and forking
        check(worst <= rate + 1, "%d forks within one second with "
              "maxforkrate=%d" % (worst, rate))
        check(span >= (nclients - 2 * rate) / rate - 0.5,
              "%d forks took only %.2f s with maxforkrate=%d"
              % (nclients, span, rate))
        stop_checked(m)


def test_maxuses_replaced():
    with Master("maxuses") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=1, maxchild=1,
            maxuses=3)))
        m.start()
        m.wait_ready("echo", 1)
        first = [echo_session(sock) for _ in range(3)]
        check(len(set(first)) == 1, "maxchild=1 but served by %s" % first)
        p = first[0]
        nxt = echo_session(sock)
        check(nxt != p, "child %d served a 4th connection with maxuses=3"
              % p)
        check(wait_until(lambda: not alive(p), EVENT_S),
              "child %d still alive %d s after its 3 uses" % (p, EVENT_S))
        log = m.log()
        check(not re.search(kv("pid", p) + r".*crashed", log),
              "a child leaving after maxuses was logged as a crash")
        check(re.search(kv("pid", p) + r".*exited.*" + kv("status", 0),
                        log),
              "no 'pid=%d exited status=0' in the log" % p)
        again = echo_session(sock)
        check(again == nxt, "the replacement %d did not serve again (%d)"
              % (nxt, again))
        stop_checked(m)


def test_idletimeout():
    with Master("idle") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=0, maxchild=3,
            idletimeout=1)))
        m.start()
        p = echo_session(sock)
        check(alive(p), "child %d gone at once" % p)
        check(wait_until(lambda: not alive(p), EVENT_S, 0.1),
              "child %d still there %d s after idletimeout=1" % (p, EVENT_S))
        check(wait_until(lambda: m.children() == [], EVENT_S),
              "children left with prefork=0 after idle: %s" % m.children())
        check(not re.search(kv("pid", p) + r".*crashed", m.log()),
              "an idle child leaving was logged as a crash")
        q = echo_session(sock)
        check(q != p, "served again by the idle-expired child")
        stop_checked(m)


def test_sighup_reload():
    with Master("sighup") as m:
        sa, sb, sc = m.path("a.sock"), m.path("b.sock"), m.path("c.sock")
        m.write_conf(services_conf(
            service_line("alpha", "testsvc echo", sa, prefork=1, maxchild=5),
            service_line("beta", "testsvc slow 1.5", sb, prefork=1,
                         maxchild=2)))
        m.start()
        m.wait_ready("alpha", 1)
        m.wait_ready("beta", 1)
        check(connect_fails(sc), "c.sock answers before it is configured")
        slow = Client(sb)
        try:
            beta_pid = slow.hello()
            m.write_conf(services_conf(
                service_line("alpha", "testsvc echo", sa, prefork=1,
                             maxchild=2),
                service_line("gamma", "testsvc echo", sc, prefork=1)))
            os.kill(m.pid, signal.SIGHUP)
            # added
            check(wait_until(lambda: os.path.exists(sc), EVENT_S),
                  "gamma's socket not created after SIGHUP")
            echo_session(sc)
            # removed: no new connections; the one in progress completes
            check(wait_until(lambda: connect_fails(sb, 0.5), EVENT_S, 0.1),
                  "beta's socket still accepts connections after its "
                  "removal")
            done = slow.readline()
            check(done == "done\n", "connection in progress on the removed "
                  "service got %r, expected 'done'" % done)
        finally:
            slow.close()
        check(wait_until(lambda: not alive(beta_pid), EVENT_S),
              "child %d of the removed service still running" % beta_pid)
        check(wait_until(lambda: m.service("beta") is None, EVENT_S),
              "removed service still in the status file")
        # changed: maxchild 5 -> 2
        check(wait_until(lambda: m.svc_int("alpha", "maxchild") == 2,
                         EVENT_S),
              "alpha maxchild not 2 after reload: %s" % m.service("alpha"))
        held = [Client(sa) for _ in range(3)]
        try:
            # two are served (however long that takes here); the third
            # must not be, within three times as long as the two took
            t_conn = time.monotonic()
            hello_in = set()
            while len(hello_in) < 2 and time.monotonic() < t_conn + EVENT_S:
                r, _, _ = select.select([c.sock for c in held
                                         if c.sock not in hello_in],
                                        [], [], 0.1)
                hello_in.update(r)
            grace = max(1.5, 3 * (time.monotonic() - t_conn))
            rest = [c.sock for c in held if c.sock not in hello_in]
            if rest:
                r, _, _ = select.select(rest, [], [], grace)
                hello_in.update(r)
            got = []
            for c in held:
                got.append(c.hello() if c.sock in hello_in else None)
            served = [p for p in got if p is not None]
            check(len(served) == 2, "with maxchild=2, %d of 3 concurrent "
                  "clients were served (%s)" % (len(served), got))
            alpha_kids = [c for c in m.child_pids("alpha")]
            check(len(alpha_kids) <= 2, "alpha runs %d children"
                  % len(alpha_kids))
            # free one: the waiting client is served next
            held[got.index(served[0])].send("quit")
            waiting = held[got.index(None)]
            waiting.settimeout(EVENT_S)
            check(waiting.hello() > 0, "waiting client not served")
        finally:
            for c in held:
                c.close()
        echo_session(sa)
        # a broken cyrus.conf on reload: logged, the old one stays
        m.write_conf(services_conf(
            service_line("alpha", "testsvc echo", sa, prefork=1),
            service_line("delta", "testsvc echo", m.path("d.sock"),
                         maxchild="x")))
        os.kill(m.pid, signal.SIGHUP)
        check(wait_until(lambda: "cyrus.conf:3" in m.log(), EVENT_S),
              "a malformed cyrus.conf on SIGHUP is not reported with its "
              "line")
        time.sleep(0.2)
        check(m.running(), "master died on a malformed cyrus.conf at "
              "SIGHUP")
        echo_session(sa)
        echo_session(sc)
        check(not os.path.exists(m.path("d.sock")),
              "the malformed configuration was applied")
        stop_checked(m)


def test_sigterm_drains():
    with Master("sigterm") as m:
        ss, se = m.path("slow.sock"), m.path("echo.sock")
        m.write_conf(services_conf(
            service_line("slow", "testsvc slow 2", ss, prefork=1),
            service_line("echo", "testsvc echo", se, prefork=2)))
        m.start()
        m.wait_ready("slow", 1)
        m.wait_ready("echo", 2)
        kids = pgrep_children(m.pid)
        check(len(kids) == 3, "expected 3 children, pgrep -P says %s" % kids)
        c = Client(ss)
        try:
            c.hello()
            t0 = time.monotonic()
            os.kill(m.pid, signal.SIGTERM)
            check(wait_until(lambda: not os.path.exists(se)
                             and not os.path.exists(ss), EVENT_S),
                  "UNIX socket files not removed on SIGTERM")
            check(connect_fails(se), "echo still accepts after SIGTERM")
            done = c.readline()
            check(done == "done\n", "slow connection got %r during the "
                  "drain, expected 'done'" % done)
        finally:
            c.close()
        rc = m.wait_exit(EVENT_S)
        took = time.monotonic() - t0
        check(rc is not None, "master still running %d s after SIGTERM"
              % EVENT_S)
        check(rc == 0, "master exit status %s after SIGTERM" % rc)
        check(took >= 1.5, "master exited %.2f s after SIGTERM, before the "
              "2 s connection finished" % took)
        left = [p for p in kids if alive(p)]
        check(not left, "children left after the drain: %s" % left)
        check(not os.path.exists(m.pidfile), "pidfile left after exit")


def test_sigint_stops():
    with Master("sigint") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(
            service_line("echo", "testsvc echo", sock, prefork=2)))
        m.start()
        m.wait_ready("echo", 2)
        kids = pgrep_children(m.pid)
        echo_session(sock)
        os.kill(m.pid, signal.SIGINT)
        rc = m.wait_exit(EVENT_S)
        check(rc == 0, "exit status %s %d s after SIGINT" % (rc, EVENT_S))
        check(not os.path.exists(sock), "socket file left after SIGINT")
        check(wait_until(lambda: not [p for p in kids if alive(p)], EVENT_S),
              "children alive after SIGINT: %s"
              % [p for p in kids if alive(p)])


def test_sigquit_immediate():
    with Master("sigquit") as m:
        ss = m.path("slow.sock")
        m.write_conf(services_conf(
            service_line("slow", "testsvc slow 20", ss, prefork=2)))
        m.start()
        m.wait_ready("slow", 2)
        kids = pgrep_children(m.pid)
        c = Client(ss)
        try:
            c.hello()
            t0 = time.monotonic()
            os.kill(m.pid, signal.SIGQUIT)
            # immediate: the master does not wait for the connection,
            # which lasts 20 s; half of that is a bound no loaded machine
            # reaches
            rc = m.wait_exit(10)
            took = time.monotonic() - t0
            check(rc is not None, "master still running 10 s after SIGQUIT "
                  "(waiting for the 20 s connection?)")
            check(took < 10, "SIGQUIT took %.2f s" % took)
            check(rc == 0, "exit status %s after SIGQUIT" % rc)
            rest = c.readline()
            check(rest == "", "connection got %r after SIGQUIT" % rest)
        finally:
            c.close()
        check(wait_until(lambda: not [p for p in kids if alive(p)], EVENT_S),
              "children alive after SIGQUIT: %s"
              % [p for p in kids if alive(p)])


def test_start_runs_first():
    with Master("start") as m:
        sock, marker = m.path("echo.sock"), m.path("marker")
        m.write_conf(services_conf(
            service_line("echo", "testsvc echo", sock, prefork=1),
            start=['  recover cmd="%s mark %s 0.7"\n' % (TESTSVC, marker)]))
        m.start(wait=False)
        t0 = time.monotonic()
        # the socket may be opened before START runs (privileged ports are
        # bound before the master drops root), but no service child may
        # run and no connection be served until the START command is done
        early = []

        def sample():
            if not os.path.exists(marker):
                early.extend(p for p in m.children()
                             if "testsvc echo" in cmdline(p))
            return os.path.exists(sock) or not m.running()
        seen = wait_until(sample, EVENT_S, 0.005)
        check(m.running(), "master exited: %s" % m.log()[-300:])
        check(seen, "service socket not created %d s after start" % EVENT_S)
        # the path appears at bind(), listen() follows at once: a
        # connect between the two (a master descheduled there) is
        # refused, so that one answer is tried again
        c = None
        for _ in range(100):
            try:
                c = Client(sock)
                break
            except ConnectionRefusedError:
                time.sleep(0.01)
        check(c is not None, "the service socket refused every connection")
        try:
            pid = c.hello()
            check(os.path.exists(marker), "connection served by %d %.2f s "
                  "after start, before the START command finished"
                  % (pid, time.monotonic() - t0))
        finally:
            c.close()
        check(not early, "service children %s ran before the START command "
              "finished" % sorted(set(early)))
        with open(marker) as f:
            check(f.read() == "ok\n", "marker content")
        echo_session(sock)
        stop_checked(m)


def test_start_failure_stops():
    with Master("startfail") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(
            service_line("echo", "testsvc echo", sock, prefork=1),
            start=['  recoverdb cmd="%s fail"\n' % TESTSVC]))
        m.start(wait=False)
        rc = m.wait_exit(EVENT_S)
        check(rc is not None, "master still running %d s after a failing "
              "START command" % EVENT_S)
        check(rc != 0, "master exit status 0 after a failing START")
        log = m.log()
        check("recoverdb" in log or "testsvc fail" in log,
              "the message does not name the failing START command: %r"
              % log[-400:])
        check("failing on purpose" in log or "status=3" in log
              or "status 3" in log or "exit" in log,
              "the failure itself is not reported: %r" % log[-400:])
        check(not os.path.exists(sock), "a service socket was opened "
              "although START failed")


def test_malformed_conf():
    cases = [
        # (name, text, expected line)
        ("missing listen", 'SERVICES {\n  ok cmd="testsvc echo" '
         'listen="{d}/ok.sock"\n  bad cmd="testsvc echo" prefork=1\n}\n', 3),
        ("unterminated quote", '# comment\nSERVICES {\n'
         '  bad cmd="testsvc echo listen=x\n}\n', 3),
        ("bad number", 'SERVICES {\n\n\n  bad cmd="testsvc echo" '
         'listen="{d}/b.sock" maxchild=ten\n}\n', 4),
        ("line outside a section", 'bogus cmd="x"\nSERVICES {\n}\n', 1),
    ]
    for what, text, line in cases:
        with Master("malformed") as m:
            m.write_conf(text.replace("{d}", m.dir))
            m.start(wait=False)
            rc = m.wait_exit(EVENT_S)
            check(rc is not None, "%s: master still running" % what)
            check(rc != 0, "%s: exit status 0" % what)
            want = "%s:%d" % (m.cyrus_conf, line)
            check(want in m.log() or "cyrus.conf:%d:" % line in m.log(),
                  "%s: no %s in the message: %r" % (what, want,
                                                    m.log()[-300:]))
            check(not os.path.exists(m.path("ok.sock")),
                  "%s: a socket was opened" % what)


def test_unknown_option_warns():
    with Master("unknown") as m:
        sock = m.path("echo.sock")
        m.write_conf("# services\nSERVICES {\n" + service_line(
            "echo", "testsvc echo", sock, prefork=1, frobnicate=7) + "}\n")
        m.start()
        log = m.log()
        check(re.search(r"cyrus\.conf:3\b.*frobnicate|frobnicate.*"
                        r"cyrus\.conf:3\b", log),
              "no warning naming cyrus.conf:3 and the key: %r" % log[-300:])
        echo_session(sock)
        stop_checked(m)


def test_tcp_ipv4():
    with Master("tcp4") as m:
        p1, p2 = free_port(), free_port()
        m.write_conf(services_conf(
            service_line("echo4", "testsvc echo", "127.0.0.1:%d" % p1,
                         proto="tcp4", prefork=1),
            service_line("echoany", "testsvc echo", "%d" % p2, proto="tcp4",
                         prefork=0, backlog=16)))
        m.start()
        m.wait_ready("echo4", 1)
        echo_session(("127.0.0.1", p1))
        echo_session(("127.0.0.1", p2))
        stop_checked(m)
        check(connect_fails(("127.0.0.1", p1)), "port still open after exit")


def test_tcp_ipv6():
    if not have_ipv6():
        raise Skip("no IPv6 loopback")
    with Master("tcp6") as m:
        p1, p2 = free_port(socket.AF_INET6, "::1"), free_port()
        m.write_conf(services_conf(
            service_line("echo6", "testsvc echo", "[::1]:%d" % p1,
                         proto="tcp6", prefork=1),
            service_line("dual", "testsvc echo", "%d" % p2, proto="tcp")))
        m.start()
        m.wait_ready("echo6", 1)
        echo_session(("::1", p1))
        echo_session(("::1", p2))
        echo_session(("127.0.0.1", p2))
        stop_checked(m)


def test_daemon_kept_running():
    with Master("daemon") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(
            service_line("echo", "testsvc echo", sock, prefork=1),
            daemon=['  keeper cmd="testsvc daemon"\n']))
        m.start()

        def daemons():
            # "testsvc daemon" by its arguments: the echo service's own
            # command line names this test's directory, master-daemon.*
            return [p for p in m.children()
                    if cmdline(p).split()[1:2] == ["daemon"]]
        first = wait_until(daemons, EVENT_S)
        check(first and len(first) == 1, "DAEMON not running: %s" % first)
        os.kill(first[0], signal.SIGKILL)
        again = wait_until(lambda: [p for p in daemons()
                                    if p != first[0]], EVENT_S, 0.05)
        check(again, "DAEMON not restarted after SIGKILL")
        stop_checked(m)


def test_events_scheduled():
    """EVENTS: a period= event runs at start and is next due period minutes
    later; an at=HHMM event is due at the next local HH:MM (read from the
    status file's event lines; waiting whole minutes would be too slow)."""
    with Master("events") as m:
        sock, marker = m.path("echo.sock"), m.path("ev-marker")
        at = time.localtime(time.time() + 180)
        hhmm = "%02d%02d" % (at.tm_hour, at.tm_min)
        m.write_conf(services_conf(
            service_line("echo", "testsvc echo", sock, prefork=1),
            events=['  checkpoint cmd="%s mark %s 0" period=5\n'
                    % (TESTSVC, marker),
                    '  nightly cmd="%s mark %s 0" at=%s\n'
                    % (TESTSVC, m.path("never"), hhmm)]))
        t0 = time.time()
        m.start()
        check(wait_until(lambda: os.path.exists(marker), EVENT_S),
              "period event did not run at start")
        t1 = time.time()

        def event_lines():
            try:
                with open(m.statusfile, errors="replace") as f:
                    return {w[1]: dict(x.split("=", 1) for x in w[2:]
                                       if "=" in x)
                            for w in (l.split() for l in f)
                            if len(w) > 1 and w[0] == "event"}
            except OSError:
                return {}

        def both_waiting():
            # the line written after the run: the one before it (due at
            # the start, so at or before t1) may still be in the file
            # when the marker appears, on a loaded machine
            ev = event_lines()
            cp = ev.get("checkpoint", {})
            return (cp.get("state") == "waiting" and
                    cp.get("next", "").isdigit() and int(cp["next"]) > t1
                    and "nightly" in ev) and ev
        ev = wait_until(both_waiting, EVENT_S)
        check(ev, "event lines missing from the status file")
        # it ran between t0 (before the start) and t1 (its marker seen):
        # next due 300 s after that, however long the start took
        due = int(ev["checkpoint"]["next"])
        check(int(t0) + 300 - 1 <= due <= t1 + 300 + 1,
              "period=5 event next due at %d, expected 300 s after it ran "
              "(between %d and %d)" % (due, int(t0) + 300, int(t1) + 300))
        want = time.mktime((at.tm_year, at.tm_mon, at.tm_mday, at.tm_hour,
                            at.tm_min, 0, 0, 0, -1))
        due = int(ev["nightly"]["next"])
        check(abs(due - want) <= 2, "at=%s event next due %d, expected %d"
              % (hhmm, due, int(want)))
        check(not os.path.exists(m.path("never")),
              "at= event ran before its time")
        stop_checked(m)


def test_event_stopped_at_shutdown():
    """An EVENTS child still running when the master shuts down ends by
    the master's SIGTERM: logged as stopped, not as a crash (a slow
    checkpoint at a test's end read as worker trouble)."""
    with Master("evstop") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(
            service_line("echo", "testsvc echo", sock, prefork=1),
            events=['  longjob cmd="/bin/sleep 120" period=30\n']))
        m.start()
        check(wait_until(lambda: "event=<longjob> started pid=" in m.log(),
                         EVENT_S), "the event did not start")
        stop_checked(m)
        log = m.log()
        check(re.search(r"event=<longjob> pid=<\d+> stopped signal=<15>",
                        log), "no 'stopped signal=<15>' line: %s"
              % log[-600:])
        check("crashed" not in log,
              "the stop was logged as a crash: %s" % log[-600:])


def test_masterstatus_tool():
    with Master("mstatus") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(
            service_line("echo", "testsvc echo", sock, prefork=2),
            service_line("other", "testsvc echo", m.path("o.sock"),
                         prefork=1)))
        m.start()
        m.wait_ready("echo", 2)
        m.wait_ready("other", 1)
        echo_session(sock)
        r = subprocess.run([MASTERSTATUS, "-s", m.statusfile],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=10)
        out = r.stdout.decode(errors="replace")
        check(r.returncode == 0, "masterstatus exit %d: %s"
              % (r.returncode, r.stderr[-300:]))
        for name in ("echo", "other"):
            check(re.search(r"\b%s\b" % name, out),
                  "service %s missing from:\n%s" % (name, out))
        for pid in m.child_pids():
            check(re.search(r"\b%d\b" % pid, out),
                  "child %d missing from:\n%s" % (pid, out))
        check("ready" in out, "no child state in:\n%s" % out)
        # missing file
        r = subprocess.run([MASTERSTATUS, "-s", m.path("nosuch")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=10)
        check(r.returncode == 1, "missing file: exit %d" % r.returncode)
        check(r.stderr.strip() or r.stdout.strip(),
              "missing file: no message")
        stop_checked(m)
        # stale file: the master is gone
        with open(m.statusfile, "w") as f:
            f.write("master pid=1 started=1\n")
        old = time.time() - 60
        os.utime(m.statusfile, (old, old))
        r = subprocess.run([MASTERSTATUS, "-s", m.statusfile],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=10)
        msg = (r.stdout + r.stderr).decode(errors="replace")
        check(r.returncode == 1 and "not running" in msg,
              "stale file: exit %d %r" % (r.returncode, msg))


# ---- start-up errors, a second master, where log lines go ---------------

def master_cmd(m, *args, foreground=False, log_stderr=False):
    """The master's command line for m without -D/-l unless asked."""
    cmd = [MASTER, "-C", m.imapd_conf, "-M", m.cyrus_conf, "-p", m.pidfile,
           "-S", SVCDIR, "-s", m.statusfile, "-T", "10"]
    if foreground:
        cmd.append("-D")
    if log_stderr:
        cmd.append("-l")
    return cmd + list(args)


def run_master(m, cmd, timeout=60):
    """Run cmd (a master that is expected to end: it fails, or detaches)
    tagged like m's processes; returns (exit status, stderr text)."""
    env = dict(os.environ)
    env[m.TAG_VAR] = m.dir
    errfile = m.path("stderr.%d" % len(os.listdir(m.dir)))
    # a file, not a pipe: a detached master logging to stderr keeps it
    with open(errfile, "wb") as err:
        try:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=err,
                               env=env, cwd=m.dir, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Fail("%s still running after %d s"
                       % (" ".join(cmd), timeout))
    return r.returncode, read_text(errfile)


def stop_daemon(m, pid):
    """SIGTERM a detached master by pid, wait for it and for everything it
    started (by the environment tag)."""
    if alive(pid):
        os.kill(pid, signal.SIGTERM)
    gone = wait_until(lambda: not alive(pid), 15)
    problems = [] if gone else ["daemon %d alive 15 s after SIGTERM" % pid]
    if not gone:
        os.kill(pid, signal.SIGKILL)
    return problems + m.leftovers(5)


def read_pid(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or "0")
    except (OSError, ValueError):
        return 0


def have_syslog():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.connect("/dev/log")
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_port_in_use_reported():
    """A port held by someone else: the master, detached or not, exits
    non-zero soon and says why on stderr (no syslog needed), and removes
    nothing of the holder's."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen(5)
    port = holder.getsockname()[1]
    try:
        for foreground in (False, True):
            with Master("inuse") as m:
                m.write_conf(services_conf(service_line(
                    "busyport", "testsvc echo", "127.0.0.1:%d" % port,
                    prefork=1)))
                t0 = time.monotonic()
                rc, err = run_master(m, master_cmd(m, foreground=foreground),
                                     timeout=60)
                took = time.monotonic() - t0
                what = "foreground" if foreground else "daemon"
                check(rc != 0, "%s: exit status 0 with the port in use "
                      "(stderr %r)" % (what, err))
                check("busyport" in err and
                      re.search(r"(?i)address (already )?in use", err),
                      "%s: stderr does not say the address is in use: %r"
                      % (what, err))
                check(took < 30, "%s: took %.1f s to fail" % (what, took))
                check(not os.path.exists(m.pidfile), "%s: pidfile left "
                      "behind" % what)
                problems = m.leftovers(3)
                check(not problems, "; ".join(problems))
    finally:
        holder.close()


def test_daemon_started_and_stopped():
    """Without -D the command returns 0 once the daemon is up; the daemon
    serves, writes its pidfile and stops on SIGTERM."""
    with Master("detach") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=1)))
        pid = 0
        try:
            rc, err = run_master(m, master_cmd(m, log_stderr=True),
                                 timeout=30)
            pid = read_pid(m.pidfile)
            check(rc == 0, "exit status %d: %r" % (rc, err))
            check(pid > 0 and alive(pid), "no running daemon in the "
                  "pidfile (%d)" % pid)
            check("master: started" in err, "the start is not reported on "
                  "stderr: %r" % err)
            echo_session(sock)
        finally:
            pid = pid or read_pid(m.pidfile)
            problems = stop_daemon(m, pid) if pid > 0 else m.leftovers(3)
        check(not problems, "; ".join(problems))
        check(not os.path.exists(m.pidfile), "pidfile left after SIGTERM")


def test_second_master_refused():
    """A second master on the same pidfile says which master runs; one on
    another pidfile but the same UNIX socket says the address is in use;
    neither takes the socket away: the first master still serves."""
    with Master("first") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=1)))
        m.start()
        m.wait_ready("echo", 1)
        ino = os.stat(sock).st_ino
        for foreground in (False, True):
            rc, err = run_master(m, master_cmd(m, foreground=foreground),
                                 timeout=30)
            check(rc != 0, "second master: exit status 0")
            check(re.search(r"another master runs with pid=<?%d\b" % m.pid,
                            err), "second master: stderr does not name the "
                  "running one (pid %d): %r" % (m.pid, err))
        check(read_pid(m.pidfile) == m.pid, "the pidfile no longer names "
              "the running master")
        other = master_cmd(m, foreground=True)
        other[other.index("-p") + 1] = m.path("other.pid")
        other[other.index("-s") + 1] = m.path("other.status")
        rc, err = run_master(m, other, timeout=30)
        check(rc != 0, "master on another pidfile: exit status 0")
        check(re.search(r"(?i)address (already )?in use", err) and
              "echo" in err, "master on another pidfile: stderr does not "
              "say the socket is in use: %r" % err)
        check(os.path.exists(sock) and os.stat(sock).st_ino == ino,
              "the running master's socket was removed or replaced")
        check(m.running(), "the first master died")
        echo_session(sock)
        stop_checked(m)


def test_socket_path_not_a_socket():
    """A regular file where the UNIX socket should be is left alone and
    the start fails naming it."""
    with Master("notsock") as m:
        path = m.path("echo.sock")
        with open(path, "w") as f:
            f.write("precious\n")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", path, prefork=1)))
        rc, err = run_master(m, master_cmd(m, foreground=True), timeout=30)
        check(rc != 0, "exit status 0")
        check("not a socket" in err, "stderr: %r" % err)
        with open(path) as f:
            check(f.read() == "precious\n", "the file was changed")


def test_log_file():
    """log_file: the master's lines go to that file (one line per event,
    with a time stamp, program and pid), not to stderr."""
    with Master("logfile") as m:
        logf = m.path("cyrus.log")
        with open(m.imapd_conf, "a") as f:
            f.write("log_file: %s\n" % logf)
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=1)))
        m.spawn(master_cmd(m, foreground=True))
        check(wait_until(lambda: "master: started" in read_text(logf), 10),
              "no start line in log_file: %r / stderr %r"
              % (read_text(logf), m.log()))
        echo_session(sock)
        text = read_text(logf)
        check(re.search(r"(?m)^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} "
                        r"master\[%d\]: info: service=<echo> listening"
                        % m.pid, text), "unexpected line format: %r"
              % text[:400])
        check("master: started" not in m.log(), "the lines went to stderr "
              "as well: %r" % m.log())
        stop_checked(m)
        check("master: exiting" in read_text(logf), "no exit line")


def test_no_syslog_falls_back_to_stderr():
    """Without a syslog socket (/dev/log) and without log_file, a master
    asked to use syslog writes its lines to stderr and says so."""
    if have_syslog():
        raise Skip("/dev/log accepts connections on this machine")
    with Master("nosyslog") as m:
        sock = m.path("echo.sock")
        m.write_conf(services_conf(service_line(
            "echo", "testsvc echo", sock, prefork=1)))
        m.spawn(master_cmd(m, foreground=True))
        check(wait_until(lambda: "master: started" in m.log(), 10),
              "no start line on stderr: %r" % m.log())
        check("/dev/log" in m.log(), "no word about the missing syslog: %r"
              % m.log())
        echo_session(sock)
        stop_checked(m)


TESTS = [
    test_events_scheduled,
    test_event_stopped_at_shutdown,
    test_prefork_ready_at_start,
    test_maxchild_50_clients,
    test_sigkill_child_replaced,
    test_crash_logged,
    test_exit_at_once_backed_off,
    test_maxforkrate,
    test_maxuses_replaced,
    test_idletimeout,
    test_sighup_reload,
    test_sigterm_drains,
    test_sigint_stops,
    test_sigquit_immediate,
    test_start_runs_first,
    test_start_failure_stops,
    test_malformed_conf,
    test_unknown_option_warns,
    test_tcp_ipv4,
    test_tcp_ipv6,
    test_daemon_kept_running,
    test_masterstatus_tool,
    test_port_in_use_reported,
    test_daemon_started_and_stopped,
    test_second_master_refused,
    test_socket_path_not_a_socket,
    test_log_file,
    test_no_syslog_falls_back_to_stderr,
]


def main():
    return run_tests(TESTS, "MASTER_TESTS", (MASTER, TESTSVC, MASTERSTATUS))


if __name__ == "__main__":
    sys.exit(main())
