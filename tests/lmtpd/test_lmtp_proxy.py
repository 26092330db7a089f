#!/usr/bin/env python3
"""test_lmtp_proxy.py - lmtpd as a frontend (lmtp_proxy: yes) in front of
two backends, with the user -> backend directory in a private 3-member
etcd cluster (test_cyrusdb_etcd.Cluster), everything on loopback and
stopped by PID:

  backends alpha and beta: a master each with imapd and lmtpd -a on
  their own 127.0.0.1 ports and directories; the frontend: a master with
  lmtpd (lmtp_proxy, directory_db: etcd) on a UNIX socket.  Users are
  placed with cyr_dbtool on the etcd directory.  The fixture is
  tests/tierhelp.py's, shared with test_imap_proxy.py and test_xfer.py.

  span            one message, recipients on both backends and one unknown
                  (550 5.1.1 at RCPT): every recipient gets its own 250
                  after DATA (python smtplib.LMTP), and each backend holds
                  the message byte for byte (read over IMAP) after its
                  own and the frontend's Received headers
  bdat            BDAT chunks in, the message relayed to both backends
  addresses       backends named by a UNIX socket path and by [::1]:port
  backend_replies the backend's own replies are relayed: a user placed
                  on a backend that has no mailbox for it (550 5.1.1
                  from the backend), a user over quota there (452 4.2.2),
                  beside one that gets 250
  pooled          one frontend worker, several transactions: one backend
                  connection is reused (RSET between), and a backend that
                  closed a kept connection is reconnected invisibly
  unknown_backend a record naming a backend the frontend does not know:
                  451 4.3.0 at RCPT and a log line; a damaged record too
  bad_config      a malformed proxy_backends: the worker refuses to start
                  and logs why
  garbage         backends that answer garbage (a python socket server)
                  or nothing at all: 451 4.4.0 / 451 4.4.2 for their
                  recipients, 250 for the others, the frontend stays up;
                  the silent one is then held down (451 4.4.1 at once)
  storm           500 messages over 10 connections (python threads)
                  through the frontend: the number of 250s equals the
                  messages found on the backends; messages/s through the
                  frontend and straight to a backend printed as "# "
  bench           only with PROXY_BENCH=N: tools/mailbench, N messages of
                  13,870 bytes at 10 connections, through the frontend
                  and straight to a backend, medians of 3 (printed)
  backend_down    one backend stopped: its recipients get 451 4.4.1, the
                  other's 250; started again, both get 250
  watch           a worker with a 300 s cache TTL sees a moved user at
                  once: the etcd watch drops the changed entry
  lookups         directory lookups counted in the frontend's metrics
                  (cyrusdeliver_directory_lookups_total{source}): after a
                  warm-up, N deliveries to known users (the 300 s cache)
                  read the database fewer than N/50 times and are answered
                  by the cache; a moved user is read again
  watched_ttl     directory_cache_ttl 1 s, directory_cache_watched_ttl
                  300 s: answers outlive the short TTL while the watch
                  is up (no read 2.5 s later), a move still comes through
  etcd_down       two of three etcd members stopped (no quorum, one
                  member still answering), then all: 451 4.4.3, never
                  250; the cluster started again: 250

Skipped (exit 77) without /usr/bin/etcd.  LMTP_TESTS picks tests by name
(the order above is kept; later tests assume the earlier placements).
"""
import imaplib
import json
import os
import smtplib
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, HERE, os.path.join(TESTS, "imapd"),
                os.path.join(TESTS, "conformance")]
from testlib import (Skip, check, free_port, read_text,  # noqa: E402
                     run_tests, service_line, wait_until)
from lmtphelp import (LMTPD, MBTOOL, Conn, Instance,  # noqa: E402
                      make_message, split_added_headers)
from imaphelp import IMAPD, make_sasldb_extra  # noqa: E402
from test_cyrusdb_etcd import DBTOOL  # noqa: E402
from tierhelp import (IPV6, Backend, Tier, directory_lookups,  # noqa: E402
                      pw, usable)

USERS = {"alice": "alpha", "bob": "alpha", "carol": "beta", "dave": "beta"}
TIER = None
CLUSTER = None
WORK = None
B = {}          # name -> Backend
FRONT = None
JUNK = None     # the garbage server


def new_backend(name, users):
    conf = {"allowplaintext": "yes", "sasl_mech_list": "PLAIN LOGIN"}
    b = Backend(name, conf=conf, sasl=(users[0], pw(users[0])))
    for u in users[1:]:
        make_sasldb_extra(b, u, pw(u))
    for u in users:
        b.create("user." + u)
    b.write_cyrus_conf()
    return TIER.start(b)


def dbtool(*args, stdin=None):
    return TIER.dbtool(*args, stdin=stdin)


def place(user, backend):
    TIER.place(user, backend)


def front_conf(backends):
    conf = TIER.directory_conf(ttl="1", timeout="1500")
    conf.update({
        "lmtp_proxy": "yes",
        "proxy_backends": " ".join("%s=%s" % kv for kv in backends),
        "proxy_timeout": "3",
    })
    return conf


def lmtp_client(sock=None):
    c = smtplib.LMTP(sock or FRONT.unix_socket, timeout=60)
    code, _ = c.ehlo("client.test")      # LHLO
    check(code == 250, "LHLO: %d" % code)
    return c


def deliver(rcpts, msg, sender="sender@example.org", sock=None):
    """One transaction through the frontend with smtplib.LMTP: ({rcpt:
    (code, text)} at RCPT, {rcpt: (code, text)} after DATA for the
    accepted ones)."""
    c = lmtp_client(sock)
    try:
        code, text = c.mail(sender)
        check(code == 250, "MAIL: %d %r" % (code, text))
        at_rcpt, ok = {}, []
        for r in rcpts:
            at_rcpt[r] = c.rcpt(r)
            if at_rcpt[r][0] == 250:
                ok.append(r)
        final = {}
        if ok:
            # smtplib reads the first reply; LMTP sends one per recipient
            final[ok[0]] = c.data(msg)
            for r in ok[1:]:
                final[r] = c.getreply()
        else:
            c.rset()
        return at_rcpt, final
    finally:
        try:
            c.quit()
        except (smtplib.SMTPException, OSError):
            pass


def reply_is(reply, code, enh):
    return reply[0] == code and reply[1].decode(errors="replace").startswith(enh)


def imap_messages(backend, user):
    """Every message of user's INBOX, read over IMAP (BODY.PEEK[])."""
    m = imaplib.IMAP4("127.0.0.1", backend.tcp_port, timeout=30)
    try:
        m.login(user, pw(user))
        typ, data = m.select("INBOX", readonly=True)
        check(typ == "OK", "SELECT %s: %r" % (user, data))
        n = int(data[0])
        out = []
        if n:
            typ, data = m.fetch("1:*", "(BODY.PEEK[])")
            check(typ == "OK", "FETCH: %r" % data)
            out = [d[1] for d in data if isinstance(d, tuple)]
        return out
    finally:
        try:
            m.logout()
        except (imaplib.IMAP4.error, OSError):
            pass


def strip_added(data, helo=b"client.test"):
    """A stored message -> what the frontend's client sent: the
    backend's Return-Path and Received, then the frontend's Received."""
    _, recv, rest = split_added_headers(data)
    check(b"LMTP" in b" ".join(recv), "backend Received: %r" % recv)
    lines = rest.split(b"\r\n")
    check(lines[0].startswith(b"Received: from " + helo),
          "the frontend's Received header is missing: %r" % rest[:200])
    i = 1
    while lines[i][:1] in (b" ", b"\t"):
        i += 1
    return b"\r\n".join(lines[i:])


def count_all():
    return {u: B[b].count("user." + u) for u, b in USERS.items()}


# ---- tests -----------------------------------------------------------------

def test_span():
    body = ("line one\r\n.leading dot\r\n..two dots\r\n\r\n" + "x" * 900 +
            "\r\n").encode()
    msg = make_message(msgid="span@test", subject="span", body=body)
    before = {u: len(imap_messages(B[b], u)) for u, b in USERS.items()}
    rcpts = ["alice@example.org", "carol@example.org", "bob@example.org",
             "nobody@example.org", "dave@example.org"]
    at_rcpt, final = deliver(rcpts, msg)
    check(reply_is(at_rcpt["nobody@example.org"], 550, "5.1.1"),
          "unknown user at RCPT: %r" % (at_rcpt["nobody@example.org"],))
    for r in rcpts:
        if r.startswith("nobody"):
            continue
        check(at_rcpt[r][0] == 250, "RCPT %s: %r" % (r, at_rcpt[r]))
        check(reply_is(final[r], 250, "2.1.5"), "%s after DATA: %r"
              % (r, final[r]))
    for u, b in USERS.items():
        got = imap_messages(B[b], u)
        check(len(got) == before[u] + 1, "%s on %s: %d messages, want %d"
              % (u, b, len(got), before[u] + 1))
        check(strip_added(got[-1]) == msg, "%s on %s: the message differs:"
              " %r" % (u, b, got[-1][-300:]))
    log = FRONT.log()
    check("backend=<alpha>" in log and "backend=<beta>" in log,
          "the frontend's recipient lines name the backends")


def test_bdat():
    # BDAT chunks (raw client: smtplib has no CHUNKING) with a message
    # that does not end in CRLF: each backend gets it with the CRLF the
    # DATA relay needs added, nothing else changed
    msg = make_message(msgid="bdat@test", body=b"a\r\n.b\r\nno newline")
    with Conn(FRONT.unix_socket) as c:
        c.reply()
        check(c.cmd("LHLO bdat.test").code == 250, "LHLO")
        check(c.cmd("MAIL FROM:<s@example.org>").code == 250, "MAIL")
        for r in ("bob@example.org", "dave@example.org"):
            check(c.cmd("RCPT TO:<%s>" % r).code == 250, "RCPT " + r)
        half = len(msg) // 2
        c.send(b"BDAT %d\r\n" % half + msg[:half])
        r = c.reply()
        check(r.code == 250, "BDAT: %r" % r)
        c.send(b"BDAT %d LAST\r\n" % (len(msg) - half) + msg[half:])
        per = c.replies(2)
        check(all(x.code == 250 and x.enh == "2.1.5" for x in per),
              "BDAT LAST through the frontend: %r" % per)
    for u in ("bob", "dave"):
        got = imap_messages(B[USERS[u]], u)[-1]
        check(strip_added(got, b"bdat.test") == msg + b"\r\n",
              "%s: %r" % (u, got[-80:]))


def test_addresses():
    # a backend named by the path of a UNIX socket, and by [::1]:port
    names = ["alphaunix"] + (["alpha6"] if IPV6 else [])
    try:
        for name in names:
            place("bob", name)
            before = B["alpha"].count("user.bob")
            mark = len(FRONT.log())

            def routed():
                _, final = deliver(["bob@example.org"],
                                   make_message(msgid="addr-%s@test" % name))
                check(reply_is(final["bob@example.org"], 250, "2.1.5"),
                      "bob through %s: %r" % (name, final))
                return ("rcpt=<bob@example.org> user=<bob> backend=<%s>"
                        % name) in FRONT.log()[mark:]
            # (the frontend's cached answer lasts directory_cache_ttl)
            check(wait_until(routed, 15, step=0.3), "bob never went "
                  "through backend %s" % name)
            check(B["alpha"].count("user.bob") > before,
                  "nothing stored through %s" % name)
        if not IPV6:
            print("# no IPv6 loopback: [::1] not tried")
    finally:
        place("bob", "alpha")


def test_backend_replies():
    # erin is placed on alpha, which has no mailbox for her; dave is
    # over quota on beta (a message over 1 KiB)
    place("erin", "alpha")
    B["beta"].quota("user.dave", 1)
    try:
        msg = make_message(msgid="replies@test", body=b"y" * 4000 + b"\r\n")
        rcpts = ["alice@example.org", "erin@example.org", "dave@example.org"]
        at_rcpt, final = deliver(rcpts, msg)
        for r in rcpts:
            check(at_rcpt[r][0] == 250, "RCPT %s at the frontend: %r"
                  % (r, at_rcpt[r]))
        check(reply_is(final["alice@example.org"], 250, "2.1.5"),
              "alice: %r" % (final["alice@example.org"],))
        check(reply_is(final["erin@example.org"], 550, "5.1.1"),
              "erin (no mailbox on alpha): %r" % (final["erin@example.org"],))
        check(reply_is(final["dave@example.org"], 452, "4.2.2"),
              "dave (over quota on beta): %r" % (final["dave@example.org"],))
    finally:
        B["beta"].mbtool("quota", "remove", "user.dave", check_rc=False)
        dbtool("directory", "etcd", "delete", "erin")


def client_ports(port):
    """Local ports of the established TCP connections to 127.0.0.1:port
    (from /proc/net/tcp)."""
    out = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            w = line.split()
            local, remote, st = w[1], w[2], w[3]
            if st == "01" and remote == "0100007F:%04X" % port:
                out.add(int(local.split(":")[1], 16))
    return out


def test_pooled():
    # the frontend has one worker: transactions of several sessions use
    # one connection per backend, kept between them (RSET first)
    seen = []
    for i in range(3):
        _, final = deliver(["alice@example.org"],
                           make_message(msgid="pool%d@test" % i))
        check(reply_is(final["alice@example.org"], 250, "2.1.5"),
              "pooled delivery %d: %r" % (i, final))
        seen.append(client_ports(B["alpha"].lmtp_port))
    check(len(seen[0]) == 1 and seen[0] == seen[1] == seen[2],
          "connections to alpha after each delivery: %r" % seen)
    # a backend restart closes the kept connection: the frontend
    # connects again, the client sees 250
    B["alpha"].stop()
    B["alpha"].start()
    _, final = deliver(["alice@example.org"], make_message(msgid="pool-r@test"))
    check(reply_is(final["alice@example.org"], 250, "2.1.5"),
          "after the backend restarted: %r" % (final,))
    check(client_ports(B["alpha"].lmtp_port) not in (set(), seen[0]),
          "no new connection to alpha after its restart")


def test_unknown_backend():
    place("frank", "nowhere")
    dbtool("directory", "etcd", "set", "gus", "bad name!")
    try:
        FRONT.mark_log()
        at_rcpt, final = deliver(["frank@example.org", "gus@example.org",
                                  "alice@example.org"],
                                 make_message(msgid="unknown-backend@test"))
        check(reply_is(at_rcpt["frank@example.org"], 451, "4.3.0"),
              "record naming an unknown backend: %r"
              % (at_rcpt["frank@example.org"],))
        check(reply_is(at_rcpt["gus@example.org"], 451, "4.3.0"),
              "damaged record: %r" % (at_rcpt["gus@example.org"],))
        check(reply_is(final["alice@example.org"], 250, "2.1.5"),
              "alice beside them: %r" % (final,))
        log = FRONT.new_log()
        check("names an unknown backend" in log and "backend=<nowhere>" in log,
              "no log line for the unknown backend: %s" % log[-800:])
        check("damaged directory record" in log, "no log line for the "
              "damaged record")
    finally:
        dbtool("directory", "etcd", "delete", "frank")
        dbtool("directory", "etcd", "delete", "gus")


def test_bad_config():
    # a malformed proxy_backends stops the frontend worker at start with
    # a line saying why (never a frontend that guesses)
    for bad, why in (("alpha", "without NAME=ADDRESS"),
                     ("a=1.2.3.4:1 a=1.2.3.4:2", "given twice"),
                     ("bad/name=1.2.3.4:1", "backend name")):
        conf = front_conf([])
        conf["proxy_backends"] = bad
        inst = Instance("front-bad", conf=conf)
        try:
            inst.write_cyrus_conf(prefork=0, maxchild=2)
            inst.start(ready=0)
            try:
                # the worker forked for it fails; nobody greets
                with Conn(inst.unix_socket, timeout=2) as c:
                    c.reply()
            except Exception:   # noqa: BLE001 - no greeting
                pass
            check(wait_until(lambda: "bad configuration for lmtp_proxy"
                             in inst.log() and why in inst.log(), 30),
                  "proxy_backends %r: %s" % (bad, inst.log()[-600:]))
        finally:
            inst.stop()
            inst.cleanup()


class JunkServer:
    """A tiny LMTP impostor on 127.0.0.1: mode "garbage" greets, then
    answers every line with non-LMTP text; "badgreet" sends junk at once;
    "silent" accepts and never answers; "flaky" see flaky()."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.mode = "garbage"
        self.conns = []
        self.stop = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def serve(self, c, mode):
        try:
            if mode == "silent":
                while not self.stop and c.recv(65536):
                    pass
                return
            if mode == "badgreet":
                c.sendall(b"HELLO I AM NOT LMTP\r\n")
                time.sleep(0.5)
                return
            c.sendall(b"220 junk ready\r\n")
            f = c.makefile("rb")
            if mode == "flaky":
                self.flaky(c, f)
                return
            while not self.stop:
                line = f.readline()
                if not line:
                    return
                if line.upper().startswith(b"LHLO"):
                    c.sendall(b"250-junk\r\n250 PIPELINING\r\n")
                else:
                    c.sendall(b"what is this \x01\x02 garbage\r\n")
        except OSError:
            pass
        finally:
            c.close()

    def flaky(self, c, f):
        """A plain LMTP server that takes every message (and throws it
        away) but answers RSET with 421 and closes, as a backend does
        that gave up an idle connection just as it was reused."""
        rcpts = 0
        while not self.stop:
            line = f.readline()
            if not line:
                return
            cmd = line[:4].upper()
            if cmd == b"LHLO":
                c.sendall(b"250-flaky\r\n250 PIPELINING\r\n")
            elif cmd == b"RSET":
                c.sendall(b"421 4.4.2 flaky closing\r\n")
                return
            elif cmd == b"MAIL":
                rcpts = 0
                c.sendall(b"250 2.1.0 ok\r\n")
            elif cmd == b"RCPT":
                rcpts += 1
                c.sendall(b"250 2.1.5 ok\r\n")
            elif cmd == b"DATA":
                c.sendall(b"354 go\r\n")
                while f.readline() not in (b".\r\n", b""):
                    pass
                c.sendall(b"250 2.1.5 flaky stored\r\n" * rcpts)
            else:
                c.sendall(b"502 5.5.1 no\r\n")

    def run(self):
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.conns.append(c)
            threading.Thread(target=self.serve, args=(c, self.mode),
                             daemon=True).start()

    def close(self):
        self.stop = True
        self.thread.join(5)
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
        self.sock.close()


def test_garbage():
    place("gina", "junk")
    try:
        for mode, enh in (("garbage", "4.4.0"), ("badgreet", "4.4.0"),
                          ("silent", "4.4.2")):
            JUNK.mode = mode
            FRONT.mark_log()
            at_rcpt, final = deliver(["alice@example.org", "gina@example.org",
                                      "carol@example.org"],
                                     make_message(msgid="junk-%s@test" % mode))
            check(at_rcpt["gina@example.org"][0] == 250,
                  "gina at RCPT: %r" % (at_rcpt["gina@example.org"],))
            check(reply_is(final["gina@example.org"], 451, enh),
                  "%s backend: gina got %r, want 451 %s"
                  % (mode, final["gina@example.org"], enh))
            for r in ("alice@example.org", "carol@example.org"):
                check(reply_is(final[r], 250, "2.1.5"), "%s beside a %s "
                      "backend: %r" % (r, mode, final[r]))
            check("backend failed backend=<junk>" in FRONT.new_log(),
                  "no log line for the %s backend" % mode)
        # the silent backend timed out: for a while it is not tried again,
        # its recipients get 451 4.4.1 at once instead of another wait
        check("backend held down after a timeout backend=<junk>"
              in FRONT.log(), "no hold-down line for the silent backend")
        _, final = deliver(["gina@example.org", "alice@example.org"],
                           make_message(msgid="junk-held@test"))
        check(reply_is(final["gina@example.org"], 451, "4.4.1"),
              "right after the timeout gina got %r, want 451 4.4.1 (held "
              "down, not tried)" % (final["gina@example.org"],))
        check(reply_is(final["alice@example.org"], 250, "2.1.5"),
              "alice beside the held-down backend: %r" % (final,))
        check(FRONT.running() and not FRONT.worker_trouble(),
              "the frontend: %s" % FRONT.worker_trouble())
        # a backend that answers the RSET of a kept connection with 421:
        # the frontend connects again, the client never sees it
        time.sleep(5.5)      # past the hold-down
        JUNK.mode = "flaky"
        for i in range(3):
            _, final = deliver(["gina@example.org"],
                               make_message(msgid="flaky%d@test" % i))
            check(final["gina@example.org"] == (250, b"2.1.5 flaky stored"),
                  "flaky backend, delivery %d: %r" % (i, final))
        check(FRONT.log().count("backend closed a kept connection, "
                                "reconnecting backend=<junk>") >= 2,
              "no reconnection after the 421 to RSET")
    finally:
        dbtool("directory", "etcd", "delete", "gina")


def storm(target, n, conns, rcpt_of):
    """n messages over conns threads with smtplib.LMTP to target (a UNIX
    socket path or (host, port)); returns (number of 250s, seconds)."""
    lock = threading.Lock()
    ok = [0]
    errors = []
    counter = [0]

    def worker():
        try:
            if isinstance(target, tuple):
                c = smtplib.LMTP(target[0], target[1], timeout=120)
            else:
                c = smtplib.LMTP(target, timeout=120)
            c.ehlo("storm.test")
            while True:
                with lock:
                    i = counter[0]
                    counter[0] += 1
                if i >= n:
                    break
                rcpt = rcpt_of(i)
                msg = make_message(msgid="storm-%s-%d@test" % (id(target), i),
                                   subject="storm %d" % i,
                                   body=b"z" * 2000 + b"\r\n")
                c.mail("storm@example.org")
                code, _ = c.rcpt(rcpt)
                if code != 250:
                    c.rset()
                    continue
                code, _ = c.data(msg)
                if code == 250:
                    with lock:
                        ok[0] += 1
            c.quit()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker) for _ in range(conns)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    dt = time.monotonic() - t0
    check(not errors, "storm clients: %s" % errors[:3])
    return ok[0], dt


def test_storm():
    users = sorted(USERS)
    before = count_all()
    ok, dt = storm(FRONT.many_socket, 500, 10,
                   lambda i: users[i % len(users)] + "@example.org")
    after = count_all()
    found = sum(after.values()) - sum(before.values())
    check(ok == found, "%d 250s through the frontend, %d messages found on "
          "the backends" % (ok, found))
    check(ok > 0, "no message went through")
    print("# through the frontend: %d messages, 10 connections, %.1f s, "
          "%.0f messages/s" % (ok, dt, ok / dt))
    # the same straight to one backend's lmtpd, for comparison
    before_a = B["alpha"].count("user.alice") + B["alpha"].count("user.bob")
    ok2, dt2 = storm(("127.0.0.1", B["alpha"].lmtp_port), 500, 10,
                     lambda i: ("alice", "bob")[i % 2] + "@example.org")
    after_a = B["alpha"].count("user.alice") + B["alpha"].count("user.bob")
    check(ok2 == after_a - before_a, "direct: %d 250s, %d found"
          % (ok2, after_a - before_a))
    print("# straight to backend alpha: %d messages, 10 connections, %.1f s, "
          "%.0f messages/s" % (ok2, dt2, ok2 / dt2))


METRICSD = os.path.join(os.environ.get("top_builddir") or ".", "metricsd",
                        "metricsd")
MAILBENCH = os.path.join(os.environ.get("top_builddir") or ".", "tools",
                         "mailbench")


def mailbench(target, n, tag):
    out = os.path.join(WORK, "bench-%s.json" % tag)
    p = subprocess.run([MAILBENCH, "lmtp", "--lmtp", target, "-n", str(n),
                        "-c", "10", "-m", "10", "-s", "13870", "-q",
                        "--json", out, "--label", tag],
                       capture_output=True, timeout=1200)
    check(p.returncode == 0, "mailbench %s: %r %r" % (tag, p.stdout[-500:],
                                                     p.stderr[-500:]))
    with open(out) as f:
        res = json.load(f)
    check(res["delivered_msgs"] == n and res["failed_msgs"] == 0,
          "mailbench %s: %r" % (tag, res))
    return res["msgs_per_s"]


def test_bench():
    # PROXY_BENCH=N (messages per run): messages/s of 13,870-byte
    # messages at 10 connections (tools/mailbench) through the frontend
    # and straight to backend alpha, users u0001..u0010 all on alpha;
    # medians of 3 runs, alternating
    n = int(os.environ.get("PROXY_BENCH") or 0)
    if n <= 0:
        raise Skip("set PROXY_BENCH=messages per run to measure")
    for i in range(1, 11):
        u = "u%04d" % i
        B["alpha"].create("user." + u)
        place(u, "alpha")
    front, direct = [], []
    for _ in range(3):
        front.append(mailbench("unix:" + FRONT.many_socket, n, "frontend"))
        direct.append(mailbench(B["alpha"].lmtp_addr(), n, "direct"))
    front.sort()
    direct.sort()
    print("# bench: 10 connections, %d messages of 13870 bytes per run, "
          "median of 3: through the frontend %.0f msgs/s (runs %s), "
          "straight to the backend %.0f msgs/s (runs %s)"
          % (n, front[1], " ".join("%.0f" % x for x in front), direct[1],
             " ".join("%.0f" % x for x in direct)))


def test_backend_down():
    B["beta"].stop()
    try:
        at_rcpt, final = deliver(["alice@example.org", "carol@example.org",
                                  "dave@example.org"],
                                 make_message(msgid="down@test"))
        check(reply_is(final["alice@example.org"], 250, "2.1.5"),
              "alice with beta down: %r" % (final,))
        for r in ("carol@example.org", "dave@example.org"):
            check(reply_is(final[r], 451, "4.4.1"), "%s with beta down: %r"
                  % (r, final[r]))
    finally:
        B["beta"].start()
    _, final = deliver(["alice@example.org", "carol@example.org"],
                       make_message(msgid="up-again@test"))
    check(all(reply_is(v, 250, "2.1.5") for v in final.values()),
          "beta back: %r" % (final,))


def test_watch():
    # lmtpwatch's cache would keep an answer for 300 s: the etcd watch
    # brings a change of the record within moments (beta has no mailbox
    # for alice, so her mail there gets beta's own 550 5.1.1)
    def reply():
        _, final = deliver(["alice@example.org"],
                           make_message(msgid="watch@test"),
                           sock=FRONT.watch_socket)
        return final["alice@example.org"]
    check(reply_is(reply(), 250, "2.1.5"), "alice before the move")
    try:
        place("alice", "beta")
        t0 = time.monotonic()
        # (at most 50 connections: the worker's maxuses, 250, would
        # otherwise start a new process with an empty cache)
        check(wait_until(lambda: reply_is(reply(), 550, "5.1.1"), 10,
                         step=0.2),
              "the change of alice's record was not seen in 10 s "
              "(directory_cache_ttl is 300)")
        print("# a changed record was in force after %.2f s"
              % (time.monotonic() - t0))
    finally:
        place("alice", "alpha")
    check(wait_until(lambda: reply_is(reply(), 250, "2.1.5"), 10, step=0.2),
          "alice's record set back was not seen in 10 s")
    check("watching the directory for changes" in FRONT.log(),
          "no log line for the watch")


def lookup_one(c, user, msgid):
    """One transaction to user over client c: the RCPT reply when it was
    refused, else the DATA reply."""
    code, text = c.mail("lookups@example.org")
    check(code == 250, "MAIL: %d %r" % (code, text))
    rep = c.rcpt(user + "@example.org")
    if rep[0] != 250:
        c.rset()
        return rep
    return c.data(make_message(msgid=msgid))


def lookup_counters():
    """(cache answers, database reads) of the frontend's workers."""
    v = directory_lookups(FRONT.metrics_port)
    check(v is not None, "metricsd does not answer")
    return v


def lookup_warm(c, users, tag):
    """Rounds of deliveries over users until one reads nothing from the
    directory (the watch's start empties the cache once); the number of
    messages sent."""
    i = 0
    for _ in range(20):
        before = lookup_counters()
        for u in users:
            r = lookup_one(c, u, "%s-%d@test" % (tag, i))
            i += 1
            check(r[0] == 250, "warm-up %s: %r" % (u, r))
        if lookup_counters()[1] == before[1]:
            return i
        time.sleep(0.2)
    check(False, "every warm-up round read the directory: %r"
          % (lookup_counters(),))
    return i


def test_lookups():
    # every delivery looks its recipient up; with lmtpwatch's 300 s
    # cache (kept current by the watch) only new and changed users are
    # read from etcd, which the frontend's metrics show
    n = 400
    users = sorted(USERS)
    c = lmtp_client(FRONT.watch_socket)

    def one(user, i):
        return lookup_one(c, user, "lookups-%d@test" % i)
    counters = lookup_counters

    try:
        i = lookup_warm(c, users, "lookups")
        before = counters()
        for k in range(n):
            u = users[k % len(users)]
            r = one(u, i)
            i += 1
            check(r[0] == 250, "delivery %d to %s: %r" % (k, u, r))
        after = counters()
        reads = after[1] - before[1]
        cached = after[0] - before[0]
        print("# %d deliveries to known users: %d directory lookups from "
              "the cache, %d reads of the database" % (n, cached, reads))
        check(cached >= n, "%d lookups answered by the cache for %d "
              "deliveries" % (cached, n))
        check(reads < n / 50, "%d reads of the directory database for %d "
              "deliveries to known users (the cache should answer)"
              % (reads, n))
        # a moved user: the watch drops the entry, the next lookup reads
        # the record again (beta has no mailbox for alice: 550 5.1.1)
        place("alice", "beta")
        check(wait_until(lambda: reply_is(one("alice", i), 550, "5.1.1"), 10,
                         step=0.2),
              "alice's move was not seen in 10 s")
        check(counters()[1] > after[1], "the moved user was not read again "
              "from the directory: %r then %r" % (after, counters()))
    finally:
        try:
            c.quit()
        except (smtplib.SMTPException, OSError):
            pass
        place("alice", "alpha")


def test_watched_ttl():
    # lmtpwttl: directory_cache_ttl 1 s, directory_cache_watched_ttl
    # 300 s.  While the watch is up an answer outlives the short TTL
    # (a round 2.5 s after the last read reads nothing); a changed
    # record still comes through the watch at once
    users = sorted(USERS)
    c = lmtp_client(FRONT.wttl_socket)

    def one(user, i):
        return lookup_one(c, user, "wttl-%d@test" % i)

    def reads():
        return lookup_counters()[1]

    try:
        i = lookup_warm(c, users, "wttl")
        time.sleep(2.5)             # past directory_cache_ttl
        before = reads()
        for u in users:
            r = one(u, i)
            i += 1
            check(r[0] == 250, "%s after 2.5 s: %r" % (u, r))
        got = reads() - before
        print("# %d deliveries 2.5 s after the last read (TTL 1 s, "
              "watched 300 s): %d reads" % (len(users), got))
        check(got == 0, "%d reads of the directory for %d users whose "
              "answers the watch keeps current (directory_cache_watched_ttl "
              "ignored?)" % (got, len(users)))
        place("alice", "beta")
        check(wait_until(lambda: reply_is(one("alice", i), 550, "5.1.1"), 10,
                         step=0.2),
              "alice's move was not seen in 10 s")
    finally:
        try:
            c.quit()
        except (smtplib.SMTPException, OSError):
            pass
        place("alice", "alpha")


def test_etcd_down():
    # first the quorum goes: one member still answers, but a
    # linearizable read cannot be served, so no answer is a guess
    for m in CLUSTER.members[:2]:
        CLUSTER.kill(m)
    time.sleep(1.5)        # past directory_cache_ttl
    try:
        at_rcpt, final = deliver(["alice@example.org", "carol@example.org"],
                                 make_message(msgid="etcd-noquorum@test"))
        for r, rep in at_rcpt.items():
            check(reply_is(rep, 451, "4.4.3"), "%s without an etcd quorum: "
                  "%r" % (r, rep))
        check(not final, "a reply after DATA without a quorum: %r" % final)
        # then every member
        CLUSTER.kill(CLUSTER.members[2])
        for _ in range(2):
            at_rcpt, final = deliver(["alice@example.org",
                                      "carol@example.org"],
                                     make_message(msgid="etcd-down@test"))
            for r, rep in at_rcpt.items():
                check(reply_is(rep, 451, "4.4.3"), "%s with etcd down: %r"
                      % (r, rep))
            check(not final, "a reply after DATA with etcd down: %r" % final)
        check("cannot read the directory database" in FRONT.log(),
              "no log line for the directory failure")
    finally:
        for m in CLUSTER.members:
            CLUSTER.kill(m)
        CLUSTER.start()
        check(CLUSTER.leader(90), "the cluster elected no leader again")

    def works():
        at_rcpt, final = deliver(["alice@example.org"],
                                 make_message(msgid="etcd-up@test"))
        return final and reply_is(final["alice@example.org"], 250, "2.1.5")
    check(wait_until(works, 60, step=1), "no 250 after etcd came back")


# ---- setup -----------------------------------------------------------------

def main():
    global TIER, CLUSTER, WORK, FRONT, JUNK
    rc = usable([LMTPD, IMAPD, MBTOOL, DBTOOL])
    if rc is not None:
        return rc
    TIER = Tier("proxytest", "proxy.")
    CLUSTER, WORK = TIER.cluster, TIER.work
    rc = 1
    try:
        if not TIER.start_cluster():
            return 1
        TIER.place_all(USERS)
        B["alpha"] = new_backend("alpha", ["alice", "bob"])
        B["beta"] = new_backend("beta", ["carol", "dave"])
        JUNK = JunkServer()
        conf = front_conf(
            [("alpha", B["alpha"].lmtp_addr()), ("beta", B["beta"].lmtp_addr()),
             ("junk", "127.0.0.1:%d" % JUNK.port),
             ("alphaunix", B["alpha"].unix_socket)]
            + ([("alpha6", "[::1]:%d" % B["alpha"].lmtp6_port)] if IPV6
               else []))
        metrics_port = free_port()
        conf["metrics_listen"] = "127.0.0.1:%d" % metrics_port
        FRONT = Instance("front", conf=conf)
        FRONT.metrics_port = metrics_port
        # lmtpunix has one worker (the pooled test sees its pool);
        # lmtpmany as many as a storm asks for, and a generous
        # proxy_timeout: a backend slow to commit is no failure there
        FRONT.many_socket = FRONT.path("many.sock")
        many_conf = FRONT.path("imapd-many.conf")
        with open(many_conf, "w") as f:
            f.write(read_text(FRONT.imapd_conf).replace(
                "proxy_timeout: 3\n", "proxy_timeout: 120\n"))
        # lmtpwatch: a cache TTL of 300 s, only the watch keeps it current
        FRONT.watch_socket = FRONT.path("watch.sock")
        watch_conf = FRONT.path("imapd-watch.conf")
        with open(watch_conf, "w") as f:
            f.write(read_text(FRONT.imapd_conf).replace(
                "directory_cache_ttl: 1\n", "directory_cache_ttl: 300\n"))
        # lmtpwttl: answers live 1 s, but 300 s while the watch is up
        FRONT.wttl_socket = FRONT.path("wttl.sock")
        wttl_conf = FRONT.path("imapd-wttl.conf")
        with open(wttl_conf, "w") as f:
            f.write(read_text(FRONT.imapd_conf).replace(
                "directory_cache_watched_ttl: 1\n",
                "directory_cache_watched_ttl: 300\n"))
        FRONT.write_cyrus_conf(unix=True, prefork=1, maxchild=1,
                               extra=service_line("lmtpmany", LMTPD + " -C " +
                                                  many_conf,
                                                  FRONT.many_socket,
                                                  prefork=2, maxchild=20)
                               + service_line("lmtpwatch", LMTPD + " -C " +
                                              watch_conf, FRONT.watch_socket,
                                              prefork=0, maxchild=1)
                               + service_line("lmtpwttl", LMTPD + " -C " +
                                              wttl_conf, FRONT.wttl_socket,
                                              prefork=0, maxchild=1))
        # metricsd named by its path (the master's own DAEMON entry would
        # look for it beside the -S directory, lmtpd/)
        with open(FRONT.cyrus_conf, "a") as f:
            f.write('DAEMON {\n  metricsd cmd="%s"\n}\n' % METRICSD)
        FRONT.start()
        check(wait_until(lambda: directory_lookups(metrics_port) is not None,
                         60, step=0.1),
              "the frontend's metricsd does not answer on 127.0.0.1:%d"
              % metrics_port)
        tests = [test_span, test_bdat, test_addresses, test_backend_replies, test_pooled,
                 test_unknown_backend, test_bad_config, test_garbage, test_storm,
                 test_bench, test_backend_down, test_watch, test_lookups,
                 test_watched_ttl, test_etcd_down]
        rc = run_tests(tests, "LMTP_TESTS", [LMTPD, IMAPD, MBTOOL, DBTOOL])
    finally:
        rc = TIER.finish(rc, [FRONT] + list(B.values()),
                         before_cluster=JUNK.close if JUNK else None)
    return rc


if __name__ == "__main__":
    sys.exit(main())
