#!/usr/bin/env python3
"""test_tier_storm.py - the frontend tier under a storm of mail and
faults, every machine of the tier a network namespace of its own on this
one host:

  TAG-br   a bridge (br0) that every other namespace's eth0 is a port of
  TAG-e0..e2  the etcd cluster holding the user -> backend directory
           (10.77.0.11-13:2379)
  TAG-ba, TAG-bb  backends alpha and beta: a master each with imapd
           (:143) and lmtpd -a (:2003), proxyservers: proxy
           (10.77.0.21, 10.77.0.22)
  TAG-fa, TAG-fb  two frontends: a master each with imapd (imap_proxy)
           and lmtpd -a (lmtp_proxy) (10.77.0.31, 10.77.0.32)
  TAG-pf   a private Postfix (its own config and queue directories;
           smtpd on 10.77.0.41:25) relaying test.example with the lmtp
           transport, half the users to each frontend (transport_maps)
  TAG-cl   the test itself (10.77.0.5): this program runs itself again
           inside it (`ip netns exec`), so that its SMTP and IMAP
           clients, etcdctl and cyr_user reach the tier

The addresses exist only inside those namespaces; nothing is added to
the host's interfaces.  Each server is started with `ip netns exec NS
...` and stopped by its PID; at the end (also after a failure) the outer
program kills what is left in the namespaces (`ip netns pids`: only our
processes can be there) and deletes them.

  storm    N messages (5,000; STORM_MESSAGES overrides; 1,500 in a
           sanitizer build, where every process runs several times
           slower) over 20 SMTP connections (python smtplib) into
           Postfix, 60 users on two backends, each message with a
           unique token.  While they flow (each fault starts once a
           fixed part of the storm is submitted, 10 %, 40 % and 60 %,
           and the submission waits there until the fault is in place,
           so every fault meets traffic at any machine speed):
             - backend alpha's master and workers are SIGKILLed under an
               IMAP session opened through frontend fa (IDLE): it ends
               with "* BYE"; alpha stays down 20 s and is started again;
               a new login through fa then works (FETCH, STORE, APPEND,
               IDLE seeing another session's APPEND)
             - the etcd leader (etcdctl endpoint status) is SIGKILLed,
               a new leader awaited, the member started again
             - frontend fb's route to the etcd members is cut for 10 s
               (a blackhole route in its namespace; Postfix still
               reaches it)
             - 50 users are moved between the backends (cyr_user move),
               a failed move retried after the faults
           Afterwards (postqueue -f once the faults are over) Postfix's
           queue drains to empty, nothing bounced; every token Postfix
           took is in its user's INBOX exactly once, byte for byte below
           the Return-Path and Received fields added on the way, read
           over IMAP through the frontends; no other message is there;
           `mbtool check -a` passes on both backends; no worker crashed
           other than by our SIGKILL, no sanitizer report.  Printed as
           "# " lines: messages sent, delivered, 451 replies logged by
           the frontends, moves done, time to drain.

A second copy fails the test, also one after the backend's SIGKILL: a
worker killed after its message is stored but before its 250 leaves a
duplicate record naming that copy (store/deliver.c writes the record
before it reserves the message, and believes one only when the copy it
names is committed), so the MTA's retry is a duplicate.

Needs root, `ip netns`, etcd and Postfix: skipped (exit 77) otherwise,
with the reason.  TIER_KEEP=1 keeps the directories.  Normal build:
about 1.5 minutes on a shared 2-core machine.
"""
import imaplib
import os
import re
import shutil
import signal
import smtplib
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, os.path.join(TESTS, "lmtpd"),
                os.path.join(TESTS, "imapd"),
                os.path.join(TESTS, "conformance")]
from testlib import (TMPDIR, TOP_BUILDDIR, Fail, alive,  # noqa: E402
                     check, chown_run_as, kill_all, read_text,
                     run_tests, service_line, wait_until)

ETCD = "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"
IP = shutil.which("ip") or "/usr/sbin/ip"
POSTFIX = shutil.which("postfix") or "/usr/sbin/postfix"
KEEP = os.environ.get("TIER_KEEP") == "1"
NET = "10.77.0."
NODES = {"e0": 11, "e1": 12, "e2": 13, "ba": 21, "bb": 22, "fa": 31,
         "fb": 32, "pf": 41, "cl": 5}


def sanitizer_build():
    """True when the programs under test were built with
    --enable-sanitizers (the build's Makefile says so)."""
    text = read_text(os.path.join(TOP_BUILDDIR, "Makefile"))
    return "-fsanitize=address" in text


def run(cmd, timeout=60, check_rc=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    out = p.stdout.decode(errors="replace")
    if check_rc and p.returncode != 0:
        raise Fail("%s: exit %d: %s" % (" ".join(cmd), p.returncode, out))
    return p.returncode, out


# ---- the outer program: namespaces ----------------------------------------

def ns_name(tag, node):
    return "%s-%s" % (tag, node)


def net_up(tag):
    """The bridge namespace and one namespace per node, each with eth0
    on the bridge and its 10.77.0.X/24; loopback up everywhere."""
    br = ns_name(tag, "br")
    run([IP, "netns", "add", br])
    run([IP, "-n", br, "link", "set", "lo", "up"])
    run([IP, "-n", br, "link", "add", "br0", "type", "bridge"])
    run([IP, "-n", br, "link", "set", "br0", "up"])
    for node, host in NODES.items():
        ns = ns_name(tag, node)
        run([IP, "netns", "add", ns])
        # created inside the bridge's namespace, the peer straight in
        # the node's: never a name in the host's namespace
        run([IP, "-n", br, "link", "add", "p" + node, "type", "veth",
             "peer", "name", "eth0", "netns", ns])
        run([IP, "-n", br, "link", "set", "p" + node, "master", "br0"])
        run([IP, "-n", br, "link", "set", "p" + node, "up"])
        run([IP, "-n", ns, "link", "set", "lo", "up"])
        run([IP, "-n", ns, "addr", "add", "%s%d/24" % (NET, host), "dev",
             "eth0"])
        run([IP, "-n", ns, "link", "set", "eth0", "up"])


def net_down(tag):
    """Kill whatever still runs in our namespaces (by PID: only what
    this test started can be there), then delete them.  Returns the
    PIDs that had to be killed."""
    killed = []
    names = [ns_name(tag, n) for n in list(NODES) + ["br"]]
    for ns in names:
        _, out = run([IP, "netns", "pids", ns], check_rc=False)
        pids = [int(x) for x in out.split() if x.isdigit()]
        kill_all(pids)
        killed += pids
    for ns in names:
        for _ in range(20):
            rc, _ = run([IP, "netns", "del", ns], check_rc=False)
            if rc == 0 or not os.path.exists("/run/netns/" + ns):
                break
            time.sleep(0.2)
    return killed


def outer():
    if os.geteuid() != 0:
        print("SKIP: storm (needs root: network namespaces, Postfix)")
        return 77
    for prog, what in ((ETCD, "etcd"), (ETCDCTL, "etcdctl"),
                       (POSTFIX, "postfix"), (IP, "ip")):
        if not os.access(prog, os.X_OK):
            print("SKIP: storm (no %s at %s)" % (what, prog))
            return 77
    try:
        import pwd
        pwd.getpwnam("postfix")
    except KeyError:
        print("SKIP: storm (no user postfix)")
        return 77
    tag = "st%d" % (os.getpid() % 100000)
    rc, out = run([IP, "netns", "add", tag + "-probe"], check_rc=False)
    if rc != 0:
        print("SKIP: storm (ip netns unavailable: %s)" % out.strip())
        return 77
    run([IP, "netns", "del", tag + "-probe"], check_rc=False)

    def on_term(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)
    inner = None
    rc = 1
    try:
        net_up(tag)
        inner = subprocess.Popen([IP, "netns", "exec", ns_name(tag, "cl"),
                                  sys.executable, os.path.abspath(__file__),
                                  "--inner", tag],
                                 env=dict(os.environ, PYTHONUNBUFFERED="1"))
        rc = inner.wait(3600)
    except BaseException as e:  # noqa: BLE001 - cleaned up below
        print("FAIL: storm: %r" % (e,))
        if inner and inner.poll() is None:
            inner.send_signal(signal.SIGTERM)
            try:
                inner.wait(60)
            except subprocess.TimeoutExpired:
                inner.kill()
                inner.wait()
        rc = 1
    finally:
        killed = net_down(tag)
        if killed:
            print("# killed left in the namespaces: %s" % killed)
            if rc == 0:
                print("FAIL: teardown (processes left in the namespaces)")
                rc = 1
        left = [n for n in os.listdir("/run/netns") if n.startswith(tag)] \
            if os.path.isdir("/run/netns") else []
        if left:
            print("FAIL: teardown (namespaces left: %s)" % left)
            rc = 1
    return rc


# ---- the inner program: the tier -------------------------------------------

from lmtphelp import LMTPD, MBTOOL, make_message  # noqa: E402
from imaphelp import IMAPD, ImapInstance  # noqa: E402
from test_cyrusdb_etcd import DBTOOL, Cluster  # noqa: E402

CYR_USER = os.path.join(TOP_BUILDDIR, "tools", "cyr_user")
DOMAIN = "test.example"
PROXY_USER, PROXY_PW = "proxy", "pr0xy-pw"
NUSERS = 60
USERS = ["s%02d" % i for i in range(NUSERS)]
READERS = {"ra": "alpha", "rb": "beta"}
NMOVES = 50
NCONN = 20
SAN = sanitizer_build()
NMSG = int(os.environ.get("STORM_MESSAGES") or (1500 if SAN else 5000))
PREFIX = "/tierstorm-%d/" % os.getpid()
TAG = None
WORK = None
CLUSTER = None
B = {}          # alpha/beta -> backend
F = {}          # fa/fb -> frontend
PF = None
SASLDB = None
STATS = {}


def pw(user):
    return "pw-" + user


def ns(node):
    return ns_name(TAG, node)


def addr(node):
    return NET + str(NODES[node])


def home(i):
    """The backend user USERS[i] starts on."""
    return "alpha" if i % 2 == 0 else "beta"


class NetCluster(Cluster):
    """The 3 etcd members, each in its namespace on port 2379/2380."""

    NODES = ["e0", "e1", "e2"]

    def __init__(self, root):
        self.root = root
        self.token = "tierstorm-%d" % os.getpid()
        self.members = [{"name": "m%d" % i, "node": n, "proc": None}
                        for i, n in enumerate(self.NODES)]
        self.initial = ",".join("%s=http://%s:2380" % (m["name"],
                                                       addr(m["node"]))
                                for m in self.members)

    def url(self, m):
        return "http://%s:2379" % addr(m["node"])

    def start(self):
        for m in self.members:
            self.start_member(m)

    def start_member(self, m):
        ddir = os.path.join(self.root, m["name"])
        log = open(os.path.join(self.root, m["name"] + ".log"), "ab")
        peer = "http://%s:2380" % addr(m["node"])
        m["proc"] = subprocess.Popen(
            [IP, "netns", "exec", ns(m["node"]), ETCD, "--name", m["name"],
             "--data-dir", ddir,
             "--listen-client-urls", self.url(m),
             "--advertise-client-urls", self.url(m),
             "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer,
             "--initial-cluster", self.initial,
             "--initial-cluster-state", "new",
             "--initial-cluster-token", self.token],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()


class NsInstance(ImapInstance):
    """A master (imapd + lmtpd -a on TCP) started in namespace NODE."""

    def __init__(self, name, node, conf, lmtp_max=60, imap_max=30):
        self.node = node
        self.lmtp_max = lmtp_max
        self.imap_max = imap_max
        full = {"allowplaintext": "yes",
                "sasl_pwcheck_method": "auxprop",
                "sasl_auxprop_plugin": "sasldb",
                "sasl_sasldb_path": SASLDB,
                "sasl_mech_list": "PLAIN LOGIN",
                "lmtp_max_recipients": "1000"}
        full.update(conf)
        super().__init__(name, conf=full)
        self.write_cyrus_conf()

    def write_cyrus_conf(self, **_):
        a = addr(self.node)
        self.tcp_port = 143
        self.lmtp_port = 2003
        lines = [service_line("imap", "imapd", "%s:143" % a, prefork=1,
                              maxchild=self.imap_max),
                 service_line("lmtp", LMTPD + " -a", "%s:2003" % a,
                              prefork=2, maxchild=self.lmtp_max)]
        with open(self.cyrus_conf, "w") as f:
            f.write("SERVICES {\n" + "".join(lines) + "}\n")
        return self

    def spawn(self, cmd):
        super().spawn([IP, "netns", "exec", ns(self.node)] + cmd)

    def addr(self):
        return (addr(self.node), 143)

    def kill_tree(self):
        """SIGKILL the master and every process it started."""
        pids = [self.pid] + self.children()
        from testlib import tagged_processes
        pids += tagged_processes(self.TAG_VAR, self.dir)
        kill_all(sorted(set(pids)))
        self.proc.wait()
        wait_until(lambda: not [p for p in pids if alive(p)], 30)
        # the next start() must not take the dead master's status file
        # for the new one's
        for f in (self.statusfile, self.pidfile):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass


def backend_conf():
    return {"admins": PROXY_USER, "proxyservers": PROXY_USER}


def front_conf():
    return {
        "imap_proxy": "yes",
        "lmtp_proxy": "yes",
        "directory_db": "etcd",
        "directory_db_path": "directory",
        "directory_cache_ttl": "2",
        "etcd_endpoints": CLUSTER.endpoints(),
        "etcd_prefix": PREFIX,
        "etcd_timeout": "2000",
        "proxy_imap_backends": "alpha=%s:143 beta=%s:143"
                               % (addr("ba"), addr("bb")),
        "proxy_backends": "alpha=%s:2003 beta=%s:2003"
                          % (addr("ba"), addr("bb")),
        "proxy_authname": PROXY_USER,
        "proxy_password": PROXY_PW,
        "proxy_starttls": "no",
        "proxy_timeout": "60",
        "xfer_command": "%s -C %s/%%b.conf" % (MBTOOL, WORK),
    }


def dbtool(*args, stdin=None):
    conf = os.path.join(WORK, "dir.conf")
    p = subprocess.run([DBTOOL, "-C", conf] + list(args), input=stdin,
                       capture_output=True, timeout=120)
    check(p.returncode == 0, "cyr_dbtool %s: %r" % (args, p.stderr))
    return p


def make_sasldb():
    """One sasldb for every instance: the proxy user and every user."""
    for u, p in [(PROXY_USER, PROXY_PW)] + [(u, pw(u)) for u in
                                           USERS + list(READERS)]:
        r = subprocess.run(["saslpasswd2", "-p", "-c", "-f", SASLDB, "-u",
                            "test.example", u], input=p.encode() + b"\n",
                           capture_output=True, timeout=30)
        check(r.returncode == 0, "saslpasswd2: %r" % r.stdout)
    chown_run_as(SASLDB)
    os.chmod(SASLDB, 0o640)


# ---- Postfix -----------------------------------------------------------------

def new_postfix():
    from test_postfix import Postfix, MASTER_CF

    class NsPostfix(Postfix):
        def run(self, *args, timeout=120):
            from test_postfix import TOOL_ENV
            r = subprocess.run([IP, "netns", "exec", ns("pf"), POSTFIX,
                                "-c", self.confdir] + list(args),
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout,
                               env=TOOL_ENV)
            return r.returncode, r.stdout.decode(errors="replace")

        # postqueue reads main.cf too: inet_interfaces must be local
        def tool(self, *args):
            from test_postfix import POSTQUEUE, TOOL_ENV
            r = subprocess.run([IP, "netns", "exec", ns("pf"), POSTQUEUE,
                                "-c", self.confdir] + list(args),
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=120,
                               env=TOOL_ENV)
            return r.stdout.decode(errors="replace")

        def queue_listing(self):
            return self.tool("-p")

        def flush(self):
            self.tool("-f")

        def smtp_ready(self):
            try:
                s = smtplib.SMTP(addr("pf"), 25, timeout=5)
            except OSError:
                return False
            try:
                s.quit()
            except smtplib.SMTPException:
                pass
            return True

    base = os.path.join(WORK, "postfix")
    os.makedirs(base)
    tmap = os.path.join(base, "transport")
    with open(tmap, "w") as f:
        for i, u in enumerate(USERS):
            f.write("%s@%s lmtp:inet:%s:2003\n"
                    % (u, DOMAIN, addr("fa" if i % 2 == 0 else "fb")))
    pf = NsPostfix(base, "/nonexistent", extra={
        "inet_interfaces": addr("pf"),
        "mynetworks": NET + "0/24",
        "relay_domains": DOMAIN,
        "relay_transport": "lmtp:inet:%s:2003" % addr("fa"),
        "transport_maps": "texthash:" + tmap,
        "lmtp_destination_concurrency_limit": "10",
        "default_process_limit": "60",
        "syslog_name": "postfix-tierstorm",
        # a deferred message is retried within seconds, never held back
        # for long as a dead destination
        "lmtp_connect_timeout": "10s",
    })
    with open(os.path.join(pf.confdir, "master.cf"), "w") as f:
        f.write(MASTER_CF.format(listen="%s:25" % addr("pf")))
    return pf


# ---- messages -----------------------------------------------------------------

def token(i):
    return "tok-%d-%06d" % (os.getpid(), i)


def owner(i):
    return USERS[i % NUSERS]


def message(i):
    u = owner(i)
    body = ("storm message %d\r\ntoken %s\r\n" % (i, token(i))
            + ".a line with a leading dot\r\n"
            + "x" * (i % 900) + "\r\n").encode()
    return make_message(msgid="%s@storm.example" % token(i),
                        subject="storm %d" % i, to="%s@%s" % (u, DOMAIN),
                        body=body,
                        extra_headers=["X-Storm-Token: " + token(i)])


ADDED = (b"return-path:", b"received:")


def strip_added(data):
    """The stored message without the fields added on the way (the
    backend's Return-Path, the Received fields of the backend, the
    frontend and Postfix), all at the top."""
    lines = data.split(b"\r\n")
    i = 0
    while i < len(lines) and lines[i].lower().startswith(ADDED):
        i += 1
        while i < len(lines) and lines[i][:1] in (b" ", b"\t"):
            i += 1
    return b"\r\n".join(lines[i:])


class Storm:
    """NMSG messages over NCONN SMTP connections into Postfix."""

    def __init__(self):
        self.lock = threading.Lock()
        self.next = 0
        self.accepted = set()
        self.refused = []
        self.errors = []
        self.threads = [threading.Thread(target=self.worker)
                        for _ in range(NCONN)]
        # message index -> an event the submission waits for there: the
        # next part of the storm goes out only once the fault for it is
        # in place, so every fault meets traffic at any machine speed
        self.gates = {}

    def gate(self, frac):
        ev = threading.Event()
        self.gates[int(frac * NMSG)] = ev
        return ev

    def open_gates(self):
        for ev in self.gates.values():
            ev.set()

    def submitted(self):
        with self.lock:
            return len(self.accepted) + len(self.refused)

    def worker(self):
        s = None
        try:
            while True:
                with self.lock:
                    i = self.next
                    self.next += 1
                if i >= NMSG:
                    break
                for at, ev in self.gates.items():
                    if i >= at and not ev.wait(1800):
                        raise Fail("message %d: gate %d never opened"
                                   % (i, at))
                for attempt in range(10):
                    try:
                        if s is None:
                            s = smtplib.SMTP(addr("pf"), 25, timeout=120)
                            s.ehlo("submit.storm.example")
                        s.sendmail("sender@storm.example",
                                   ["%s@%s" % (owner(i), DOMAIN)],
                                   message(i))
                        with self.lock:
                            self.accepted.add(i)
                        break
                    except smtplib.SMTPRecipientsRefused as e:
                        with self.lock:
                            self.refused.append((i, repr(e)))
                        break
                    except (smtplib.SMTPServerDisconnected, OSError):
                        s = None
                        time.sleep(0.2 * (attempt + 1))
                else:
                    raise Fail("message %d could not be submitted" % i)
            if s is not None:
                s.quit()
        except Exception as e:  # noqa: BLE001 - reported by the test
            with self.lock:
                self.errors.append(repr(e))

    def start(self):
        for t in self.threads:
            t.start()

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(1, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads)


# ---- IMAP through a frontend -------------------------------------------------

class Session:
    """A raw IMAP session through a frontend (so that a BYE and the end
    of the stream are seen as they come)."""

    def __init__(self, node, user, timeout=60):
        self.sock = socket.create_connection((addr(node), 143),
                                             timeout=timeout)
        self.buf = b""
        self.tagn = 0
        greeting = self.line()
        check(greeting.startswith(b"* OK"), "greeting: %r" % greeting)
        r = self.cmd('LOGIN %s "%s"' % (user, pw(user)))
        check(r[-1].split()[1] == b"OK", "LOGIN %s through %s: %r"
              % (user, node, r[-3:]))

    def _recv(self):
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("connection closed")
        self.buf += data

    def line(self):
        while b"\r\n" not in self.buf:
            self._recv()
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def read(self, n):
        while len(self.buf) < n:
            self._recv()
        d, self.buf = self.buf[:n], self.buf[n:]
        return d

    def send(self, data):
        self.sock.sendall(data)

    def response(self):
        """One response with its literals (bytes)."""
        out = b""
        while True:
            ln = self.line()
            out += ln
            m = re.search(rb"\{(\d+)\}$", ln)
            if not m:
                return out
            out += b"\r\n" + self.read(int(m.group(1)))

    def cmd(self, text, literal=None):
        self.tagn += 1
        tag = b"t%d" % self.tagn
        if literal is not None:
            self.send(tag + b" " + text.encode() + b" {%d}\r\n" % len(literal))
            r = self.line()
            check(r.startswith(b"+"), "no continuation: %r" % r)
            self.send(literal + b"\r\n")
        else:
            self.send(tag + b" " + text.encode() + b"\r\n")
        out = []
        while True:
            r = self.response()
            out.append(r)
            if r.startswith(tag + b" "):
                return out

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def fetch_all(node, user):
    """Every message of user's INBOX through frontend node (imaplib)."""
    m = imaplib.IMAP4(addr(node), 143, timeout=120)
    try:
        typ, data = m.login(user, pw(user))
        check(typ == "OK", "LOGIN %s: %r" % (user, data))
        typ, data = m.select("INBOX", readonly=True)
        check(typ == "OK", "SELECT %s: %r" % (user, data))
        out = []
        if int(data[0]):
            typ, data = m.fetch("1:*", "(BODY.PEEK[])")
            check(typ == "OK", "FETCH %s: %r" % (user, data))
            out = [d[1] for d in data if isinstance(d, tuple)]
        return out
    finally:
        try:
            m.logout()
        except (imaplib.IMAP4.error, OSError):
            pass


def imap_workout(node, user):
    """Login through node as user: APPEND, FETCH (byte for byte), STORE,
    and IDLE seeing a second session's APPEND."""
    msg = make_message(msgid="append-%d@storm.example" % time.time_ns(),
                       subject="appended")
    s = Session(node, user)
    s2 = None
    try:
        r = s.cmd("SELECT INBOX")
        check(r[-1].split()[1] == b"OK", "SELECT: %r" % r[-2:])
        r = s.cmd("APPEND INBOX (\\Flagged)", literal=msg)
        check(r[-1].split()[1] == b"OK", "APPEND: %r" % r)
        r = s.cmd("NOOP")
        r = s.cmd("UID SEARCH HEADER Subject appended")
        uids = [ln for ln in r if ln.startswith(b"* SEARCH")][0].split()[2:]
        check(uids, "the APPENDed message is not found: %r" % r)
        uid = uids[-1].decode()
        r = s.cmd("UID FETCH %s (FLAGS BODY.PEEK[])" % uid)
        check(any(msg in x for x in r), "FETCH of the APPENDed message "
              "differs: %r" % r[-2:])
        r = s.cmd("UID STORE %s +FLAGS (\\Seen $Storm)" % uid)
        check(r[-1].split()[1] == b"OK" and b"$Storm" in b" ".join(r),
              "STORE: %r" % r)
        # IDLE: another session's APPEND is an EXISTS here
        s.tagn += 1
        s.send(b"t%d IDLE\r\n" % s.tagn)
        check(s.line().startswith(b"+"), "IDLE continuation")
        s2 = Session(node, user)
        r = s2.cmd("APPEND INBOX ()", literal=msg.replace(b"appended",
                                                          b"second"))
        check(r[-1].split()[1] == b"OK", "second APPEND: %r" % r)
        s.sock.settimeout(60)
        ln = s.line()
        while not ln.endswith(b" EXISTS"):
            ln = s.line()
        s.send(b"DONE\r\n")
        while not ln.startswith(b"t%d " % s.tagn):
            ln = s.line()
        check(b" OK" in ln, "IDLE end: %r" % ln)
        s.cmd("LOGOUT")
    finally:
        s.close()
        if s2:
            s2.close()


# ---- the faults --------------------------------------------------------------

class Faults:
    def __init__(self, storm):
        self.storm = storm
        self.errors = []
        self.notes = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.main)
        # (the fraction of the storm submitted before each fault)
        self.g_backend = storm.gate(0.1)
        self.g_leader = storm.gate(0.4)
        self.g_cut = storm.gate(0.6)

    def wait_progress(self, ev):
        at = [k for k, v in self.storm.gates.items() if v is ev][0]
        wait_until(lambda: self.storm.submitted() >= at
                   or self.storm.errors, 3600, 0.1)

    def main(self):
        try:
            self.wait_progress(self.g_backend)
            self.kill_backend()
            self.wait_progress(self.g_leader)
            self.kill_leader()
            self.wait_progress(self.g_cut)
            self.cut_etcd()
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))
        finally:
            self.storm.open_gates()
            self.done.set()

    def kill_backend(self):
        b = B["alpha"]
        s = Session("fa", "ra")
        try:
            r = s.cmd("SELECT INBOX")
            check(r[-1].split()[1] == b"OK", "SELECT before the kill: %r" % r)
            s.tagn += 1
            s.send(b"t%d IDLE\r\n" % s.tagn)
            check(s.line().startswith(b"+"), "IDLE before the kill")
            b.ignore_sigkill = True
            t0 = time.monotonic()
            b.kill_tree()
            self.g_backend.set()
            self.notes.append("backend alpha killed at %d messages submitted"
                              % self.storm.submitted())
            s.sock.settimeout(60)
            got = []
            try:
                while True:
                    ln = s.line()
                    got.append(ln)
                    if ln.startswith(b"* BYE"):
                        break
            except (EOFError, OSError) as e:
                raise Fail("the session through fa ended without * BYE "
                           "(%r): %r" % (e, got))
            # then the end of the stream
            try:
                while True:
                    s._recv()
            except EOFError:
                pass
            STATS["bye"] = got[-1].decode(errors="replace")
        finally:
            s.close()
        # a login for a user of alpha while it is down: refused, no hang
        m = imaplib.IMAP4(addr("fa"), 143, timeout=120)
        try:
            m.login("ra", pw("ra"))
            raise Fail("LOGIN of a user of the dead backend succeeded")
        except imaplib.IMAP4.error as e:
            check("UNAVAILABLE" in str(e), "LOGIN with alpha down: %r" % e)
        finally:
            try:
                m.logout()
            except (imaplib.IMAP4.error, OSError):
                pass
        time.sleep(max(0, 20 - (time.monotonic() - t0)))
        b.start(timeout=300)
        self.notes.append("backend alpha back after %.1f s"
                          % (time.monotonic() - t0))
        # a new login through the frontend works: the whole workout
        check(wait_until(lambda: self.try_workout("fa", "ra"), 120, 1),
              "no working login through fa for a user of alpha after it "
              "came back: %s" % self.last_workout)
        imap_workout("fb", "rb")

    last_workout = None

    def try_workout(self, node, user):
        try:
            imap_workout(node, user)
            return True
        except (Fail, OSError, EOFError, IndexError) as e:
            self.last_workout = repr(e)
            return False

    def kill_leader(self):
        leader = CLUSTER.leader(120)
        check(leader, "no etcd leader to kill")
        CLUSTER.kill(leader)
        self.g_leader.set()
        t0 = time.monotonic()
        self.notes.append("etcd leader %s killed at %d messages submitted"
                          % (leader["name"], self.storm.submitted()))
        new = CLUSTER.leader(120, exclude=leader)
        check(new, "no new etcd leader within 120 s")
        self.notes.append("new etcd leader %s after %.1f s"
                          % (new["name"], time.monotonic() - t0))
        CLUSTER.start_member(leader)
        check(CLUSTER.leader(120), "the cluster did not settle after the "
              "old leader came back")

    def cut_etcd(self):
        routes = ["%s/32" % addr(n) for n in ("e0", "e1", "e2")]
        for r in routes:
            run([IP, "-n", ns("fb"), "route", "add", "blackhole", r])
        self.notes.append("fb cut from etcd at %d messages submitted"
                          % self.storm.submitted())
        self.g_cut.set()
        try:
            time.sleep(10)
        finally:
            for r in routes:
                run([IP, "-n", ns("fb"), "route", "del", "blackhole", r],
                    check_rc=False)


class Mover:
    """Moves NMOVES users (s00..s49) to the other backend, one after
    the other, from the moment the storm starts; a failed move is noted
    and retried after the others."""

    def __init__(self, storm):
        self.storm = storm
        self.done = 0
        self.failed = []
        self.where = {u: home(i) for i, u in enumerate(USERS)}
        self.errors = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.main)

    def move(self, u):
        to = "beta" if self.where[u] == "alpha" else "alpha"
        p = subprocess.run([CYR_USER, "-C", F["fa"].imapd_conf, "move", u,
                            to], capture_output=True, timeout=600)
        if p.returncode == 0:
            self.where[u] = to
            self.done += 1
            return True
        err = p.stderr.decode(errors="replace").strip()
        self.failed.append("%s: %s" % (u, err))
        # where is the user now?  (a failure must leave one home)
        w = subprocess.run([CYR_USER, "-C", F["fa"].imapd_conf, "where",
                            u], capture_output=True, timeout=120)
        if w.returncode == 0:
            self.where[u] = w.stdout.decode().strip()
        return False

    def main(self):
        try:
            wait_until(lambda: self.storm.submitted() >= 0.02 * NMSG, 3600,
                       0.1)
            moves_left = list(USERS[:NMOVES])
            deadline = time.monotonic() + 1800
            while moves_left and time.monotonic() < deadline:
                u = moves_left.pop(0)
                if not self.move(u):
                    moves_left.append(u)
                    time.sleep(1)
        except Exception as e:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(e))


# ---- the test ----------------------------------------------------------------

def log_count(text, pattern):
    return len(re.findall(pattern, text))


def test_storm():
    storm = Storm()
    faults = Faults(storm)
    mover = Mover(storm)
    marks = {n: len(i.log()) for n, i in F.items()}
    t0 = time.monotonic()
    storm.start()
    faults.thread.start()
    mover.thread.start()
    check(storm.join(3600), "the submission did not end in an hour")
    t_submit = time.monotonic() - t0
    faults.thread.join(1800)
    check(not faults.thread.is_alive(), "the faults did not end")
    check(not faults.errors, "faults: %s" % faults.errors)
    check(not storm.errors, "submission: %s" % storm.errors[:3])
    check(not storm.refused, "Postfix refused %d recipients, e.g. %s"
          % (len(storm.refused), storm.refused[:2]))
    t_faults = time.monotonic()
    PF.flush()
    # the queue drains: no deadline on speed, only on progress
    last = [None, time.monotonic()]

    def drained():
        listing = PF.queue_listing()
        if "Mail queue is empty" in listing:
            return True
        if listing != last[0]:
            last[0] = listing
            last[1] = time.monotonic()
        if time.monotonic() - last[1] > 30:
            PF.flush()
            last[1] = time.monotonic()
        return False
    ok = wait_until(drained, 900, 1)
    t_drain = time.monotonic() - t_faults
    check(ok, "Postfix's queue did not drain in 900 s after the faults: %s"
          % PF.queue_listing()[-1500:])
    mover.thread.join(1800)
    check(not mover.errors, "moves: %s" % mover.errors)
    check(mover.done == NMOVES, "%d of %d moves done; failures: %s"
          % (mover.done, NMOVES, mover.failed[:5]))
    t_total = time.monotonic() - t0

    log = PF.log()
    bounced = re.findall(r".*status=(?:bounced|expired).*", log)
    check(not bounced, "Postfix bounced %d messages, e.g. %s"
          % (len(bounced), bounced[:2]))
    sent = log_count(log, r"relay=10\.77\.0\.3[12]\[[^]]*\]:2003,.*"
                          r"status=sent")
    deferred = log_count(log, r"status=deferred")

    # every token once, in its user's INBOX, byte for byte
    seen = {}
    twice = []
    for n, u in enumerate(USERS):
        for data in fetch_all("fa" if n % 2 == 0 else "fb", u):
            m = re.search(rb"^X-Storm-Token: (\S+)\r$", data, re.M)
            check(m, "%s holds a message without a token: %r"
                  % (u, data[:300]))
            tok = m.group(1).decode()
            i = int(tok.rsplit("-", 1)[1])
            check(tok == token(i), "a foreign token %s" % tok)
            check(owner(i) == u, "token %s (for %s) in %s's INBOX"
                  % (tok, owner(i), u))
            if i in seen:
                twice.append(i)
            seen[i] = True
            check(strip_added(data) == message(i), "message %d differs: "
                  "%r" % (i, strip_added(data)[:400]))
    # exactly once, also across the backend's SIGKILL
    check(not twice, "messages stored more than once: %s"
          % [token(i) for i in twice[:10]])
    blog = "".join(b.log() for b in B.values())
    dups = len(re.findall(r"lmtp: recipient [^\n]*msgid=<<[^>\n]*@storm"
                          r"\.example>>[^\n]*status=<duplicate>", blog))
    recovered = len(re.findall(r"deliver: duplicate record names a copy "
                               r"never stored", blog))
    missing = sorted(storm.accepted - set(seen))
    check(not missing, "%d accepted messages are not in their mailboxes, "
          "e.g. %s" % (len(missing), [token(i) for i in missing[:5]]))
    check(sent == len(storm.accepted), "Postfix logged %d deliveries for "
          "%d messages" % (sent, len(storm.accepted)))
    for name, b in B.items():
        _, out, err = b.mbtool("check", "-a")
    # the frontends' 451s (at RCPT and after DATA)
    n451 = {n: log_count(i.log()[marks[n]:], r"reply=<451")
            for n, i in F.items()}
    for note in faults.notes:
        print("# " + note)
    print("# BYE at the client when alpha was killed: %s" % STATS.get("bye"))
    print("# messages sent: %d (%d connections), submitted in %.1f s"
          % (len(storm.accepted), NCONN, t_submit))
    print("# messages delivered: %d (Postfix status=sent %d, deferrals %d)"
          % (len(seen), sent, deferred))
    print("# retries the backends suppressed as duplicates: %d; records "
          "naming a copy never stored (delivered): %d" % (dups, recovered))
    print("# 451 replies logged by the frontends: fa %d, fb %d"
          % (n451["fa"], n451["fb"]))
    print("# moves done: %d (failed attempts retried: %d%s)"
          % (mover.done, len(mover.failed),
             ("; e.g. " + mover.failed[0][:200]) if mover.failed else ""))
    print("# time to drain after the faults: %.1f s; whole storm %.1f s"
          % (t_drain, t_total))


def inner(tag):
    global TAG, WORK, CLUSTER, PF, SASLDB
    TAG = tag

    def on_term(signum, frame):
        raise KeyboardInterrupt("signal %d" % signum)
    signal.signal(signal.SIGTERM, on_term)
    for prog in (LMTPD, IMAPD, MBTOOL, DBTOOL, CYR_USER):
        if not os.access(prog, os.X_OK):
            print("FAIL: setup (missing %s)" % prog)
            return 1
    WORK = tempfile.mkdtemp(prefix="tierstorm.", dir=TMPDIR)
    os.chmod(WORK, 0o755)
    chown_run_as(WORK)
    SASLDB = os.path.join(WORK, "sasldb2")
    CLUSTER = NetCluster(WORK)
    rc = 1
    problems = []
    print("# %d messages%s" % (NMSG, " (sanitizer build)" if SAN else ""))
    try:
        CLUSTER.start()
        check(CLUSTER.leader(120), "the etcd cluster elected no leader")
        with open(os.path.join(WORK, "dir.conf"), "w") as f:
            f.write("etcd_endpoints: %s\netcd_prefix: %s\netcd_timeout: "
                    "5000\n" % (CLUSTER.endpoints(), PREFIX))
        make_sasldb()
        for name, node in (("alpha", "ba"), ("beta", "bb")):
            B[name] = NsInstance(name, node, backend_conf())
            os.symlink(B[name].imapd_conf, os.path.join(WORK, name + ".conf"))
        placed = [(u, home(i)) for i, u in enumerate(USERS)] + \
            list(READERS.items())
        for u, b in placed:
            B[b].create("user." + u)
        dbtool("-n", "directory", "etcd", "set", placed[0][0], placed[0][1])
        dbtool("directory", "etcd", "set",
               stdin="".join("%s\t%s\n" % p for p in placed).encode())
        for b in B.values():
            try:
                b.start(timeout=300)
            except BaseException:
                b.stop()
                raise
        for node in ("fa", "fb"):
            F[node] = NsInstance("front-" + node, node, front_conf(),
                                 lmtp_max=30, imap_max=20)
            try:
                F[node].start(timeout=300)
            except BaseException:
                F[node].stop()
                raise
        PF = new_postfix()
        PF.start()
        rc = run_tests([test_storm], "TIER_TESTS", [LMTPD, IMAPD])
    except BaseException as e:  # noqa: BLE001
        print("FAIL: setup: %r" % (e,))
        rc = 1
    finally:
        if PF is not None:
            problems += PF.stop()
            if rc != 0:
                print("# postfix log, last lines:")
                for line in PF.log().splitlines()[-10:]:
                    print("#   " + line)
        for inst in list(F.values()) + list(B.values()):
            problems += inst.stop()
            trouble = inst.worker_trouble(inst.log())
            if trouble:
                problems.append("%s: %s" % (inst.name,
                                            " | ".join(trouble[:3])))
            if rc != 0:
                print("# %s log (%s), last lines:" % (inst.name, inst.dir))
                for line in inst.log().splitlines()[-12:]:
                    print("#   " + line)
        CLUSTER.stop()
    if problems:
        print("FAIL: teardown: %s" % "; ".join(problems))
        rc = 1
    if rc == 0 and not KEEP:
        for inst in list(F.values()) + list(B.values()):
            inst.cleanup()
        shutil.rmtree(WORK, ignore_errors=True)
    else:
        print("# kept: %s" % WORK)
    return rc


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        sys.exit(inner(sys.argv[2]))
    sys.exit(outer())
