#!/usr/bin/env python3
"""test_lmtp_idle.py - idle LMTP clients do not hold lmtpd workers.

A worker holds up to lmtp_max_idle connections and serves whichever has
a command; the master counts a worker holding connections as busy and
starts another for new clients while below maxchild.  So with maxchild N
and 2N clients that connect and say nothing (or say LHLO and nothing, or
finish a transaction and idle), a real MTA is greeted and delivers at
once; a storm over more persistent connections than maxchild is not held
up by lmtp_timeout; silent connections still get 421 after lmtp_timeout
and at SIGTERM; lmtp_idle_timeout makes a full worker's longest idle
connection (no transaction open) give way to a waiting client; STARTTLS,
AUTH and pipelined sessions work side by side in one worker
(maxchild=1).  And the UNIX socket's listen backlog follows the system's
maximum: 200 simultaneous connects, none refused.

Times: only the issue's own bound (a delivery within 1 s of connecting,
while the idle clients are held) and lower bounds on timeouts are
checked; everything else waits for events with generous deadlines.

Environment: see lmtphelp.py (top_builddir, TEST_TMPDIR, LMTP_TESTS,
LMTP_KEEP).
"""
import base64
import errno
import os
import re
import signal
import smtplib
import socket
import ssl
import sys
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import Fail, check, wait_until  # noqa: E402
from lmtphelp import (Conn, ConnectionClosed, Instance,  # noqa: E402
                      make_message, run_lmtp_tests, transaction)

SASL_USER, SASL_PASS = "alice", "s3cret-pw"
_seq = [0]


def uniq(prefix="m"):
    _seq[0] += 1
    return "%s.%d.%d@test.example" % (prefix, os.getpid(), _seq[0])


def greet(addr, timeout=30.0):
    """A connection whose greeting was read (the client says nothing)."""
    c = Conn(addr, timeout)
    r = c.reply()
    check(r.code == 220, "greeting %r" % r)
    return c


def closes_all(conns):
    for c in conns:
        c.close()


def lmtp_deliver(addr, rcpt, tag, timeout=60):
    """smtplib.LMTP: connect, LHLO, one message to rcpt; returns the
    seconds from before the connect to the 250 after DATA."""
    t0 = time.monotonic()
    if isinstance(addr, str):
        cl = smtplib.LMTP(addr, timeout=timeout)
    else:
        cl = smtplib.LMTP(addr[0], addr[1], timeout=timeout)
    try:
        refused = cl.sendmail("mta@example.org", [rcpt],
                              make_message(uniq(tag)))
        took = time.monotonic() - t0
        check(not refused, "refused: %r" % refused)
    finally:
        try:
            cl.quit()
        except (smtplib.SMTPException, OSError):
            pass
    return took


# ---- 1: 2 x maxchild idle clients, then a real MTA ---------------------------

def test_idle_clients_do_not_block():
    n = 3
    with Instance("idle", conf={"lmtp_timeout": "120"}) as inst:
        inst.create("user.idle")
        inst.write_cyrus_conf(unix=True, tcp_preauth=True, prefork=1,
                              maxchild=n)
        inst.start()
        tcp = inst.tcp_addr(preauth=True)
        held = []
        try:
            # one that finished a transaction and stays
            c = greet(tcp)
            _, rr, _, dr = transaction(c, "a@example.org", ["idle"],
                                       make_message(uniq("first")),
                                       lhlo="done.example")
            check([r.code for r in dr] == [250], "first delivery %r" % dr)
            held.append(c)
            # 2N that said LHLO and then nothing (TCP and UNIX)
            for i in range(2 * n):
                c = greet(tcp if i % 2 else inst.unix_socket)
                check(c.cmd("LHLO quiet.example").code == 250, "LHLO")
                held.append(c)
            # 2N that say nothing at all (their greeting is read, so they
            # are known to be held by a worker)
            for i in range(2 * n):
                held.append(greet(tcp if i % 2 else inst.unix_socket))
            total = inst.svc_int("lmtpa", "total") + \
                inst.svc_int("lmtpunix", "total")
            check(total <= 2 * n, "more workers than maxchild: %d" % total)
            for addr in (tcp, inst.unix_socket):
                took = lmtp_deliver(addr, "idle@test.example", "real")
                print("#   %s: delivery with %d idle clients held: %.3f s"
                      % ("tcp" if addr == tcp else "unix", len(held), took))
                check(took < 1.0, "delivery took %.2f s with %d idle "
                      "clients (maxchild %d)" % (took, len(held), n))
            check(inst.count("user.idle") == 3, "count %d"
                  % inst.count("user.idle"))
            # the idle ones are still there and answer
            for c in held:
                check(c.cmd("NOOP").code == 250, "an idle client lost")
        finally:
            closes_all(held)


# ---- 2: a storm over 2 x maxchild persistent connections ---------------------

def test_persistent_storm():
    conns, per = 20, 15
    with Instance("storm", conf={"lmtp_timeout": "120"}) as inst:
        inst.create("user.storm")
        inst.write_cyrus_conf(prefork=1, maxchild=10)
        inst.start()
        waits, errors = [], []
        lock = threading.Lock()
        all_connected = threading.Barrier(conns, timeout=60)
        all_done = threading.Barrier(conns, timeout=120)

        def client(i):
            try:
                t0 = time.monotonic()
                cl = smtplib.LMTP(inst.unix_socket, timeout=60)
                with lock:
                    waits.append(time.monotonic() - t0)
                try:
                    all_connected.wait()    # every connection open at once
                    for k in range(per):
                        refused = cl.sendmail("s@example.org",
                                              ["storm@test.example"],
                                              make_message(uniq("st")))
                        if refused:
                            raise Fail("refused %r" % refused)
                    all_done.wait()         # stay open until all are done
                finally:
                    try:
                        cl.quit()
                    except (smtplib.SMTPException, OSError):
                        pass
            except Exception as e:          # reported below
                with lock:
                    errors.append("client %d: %r" % (i, e))

        t0 = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,))
                   for i in range(conns)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        took = time.monotonic() - t0
        check(not any(t.is_alive() for t in threads), "clients hung")
        print("#   %d messages over %d connections (maxchild 10): %.2f s, "
              "longest wait for a greeting %.2f s"
              % (conns * per, conns, took, max(waits or [0])))
        check(not errors, "clients failed: %s" % "; ".join(errors[:3]))
        check(len(waits) == conns and max(waits) < 10, "a connection "
              "waited %.1f s for its greeting" % max(waits or [0]))
        check(inst.count("user.storm") == conns * per, "stored %d of %d"
              % (inst.count("user.storm"), conns * per))


# ---- 3: timeouts and SIGTERM still reach multiplexed idle clients ------------

def test_timeout_sigterm_idle_timeout():
    tmo = 10
    with Instance("tmo", conf={"lmtp_timeout": str(tmo),
                               "lmtp_max_idle": "3",
                               "lmtp_idle_timeout": "2"}) as inst:
        inst.create("user.tmo")
        inst.write_cyrus_conf(prefork=1, maxchild=1)
        inst.start(drain=60)
        # lmtp_timeout: a silent client and one after LHLO get 421 4.4.2;
        # one that keeps talking in the same worker does not
        t0 = time.monotonic()
        silent = greet(inst.unix_socket, timeout=tmo + 90)
        lhlo = greet(inst.unix_socket, timeout=tmo + 90)
        check(lhlo.cmd("LHLO l.example").code == 250, "LHLO")
        busy = greet(inst.unix_socket)
        end = time.monotonic() + tmo + 4
        while time.monotonic() < end:
            check(busy.cmd("NOOP").code == 250, "NOOP")
            time.sleep(1)
        for name, c in (("silent", silent), ("after LHLO", lhlo)):
            try:
                r = c.reply()
            except (ConnectionClosed, socket.timeout) as e:
                raise Fail("%s client: no 421: %r" % (name, e))
            took = time.monotonic() - t0
            check(r.code == 421 and r.enh == "4.4.2", "%s: %r" % (name, r))
            check(took >= tmo - 0.5, "%s: 421 after %.1f s < lmtp_timeout"
                  % (name, took))
            check(c.at_eof(), "%s: open after 421" % name)
            c.close()
        check(busy.cmd("NOOP").code == 250, "the talking client was closed")

        # lmtp_idle_timeout: the worker is full (3); a new client waits
        # until the longest silent connection without a transaction gives
        # way; one inside a transaction is kept
        intx = busy
        check(intx.cmd("LHLO t.example").code == 250, "LHLO")
        check(intx.cmd("MAIL FROM:<t@example.org>").code == 250, "MAIL")
        idle1 = greet(inst.unix_socket)
        idle2 = greet(inst.unix_socket)
        newc = greet(inst.unix_socket, timeout=60)
        r = idle1.reply()
        check(r.code == 421 and r.enh == "4.4.2", "evicted client: %r" % r)
        check(idle1.at_eof(), "open after 421")
        idle1.close()
        check(newc.cmd("NOOP").code == 250, "new client")
        check(intx.cmd("RCPT TO:<tmo>").code == 250,
              "the client inside a transaction lost its transaction")

        # SIGTERM: every idle client of the worker gets 421 4.3.2 at once
        t0 = time.monotonic()
        inst.proc.send_signal(signal.SIGTERM)
        for name, c in (("idle", idle2), ("new", newc),
                        ("mid-transaction", intx)):
            c.settimeout(30)
            r = c.reply()
            check(r.code == 421 and r.enh == "4.3.2",
                  "%s client at SIGTERM: %r" % (name, r))
            check(c.at_eof(), "%s: open after 421" % name)
            c.close()
        rc = inst.proc.wait(90)
        check(rc == 0, "master exit status %d" % rc)
        check(time.monotonic() - t0 < 30, "drain took %.1f s"
              % (time.monotonic() - t0))
        check(inst.count("user.tmo") == 0, "a message was stored")


def test_maxuses_retires():
    """maxuses=1: the worker's one client inside a transaction keeps its
    place past lmtp_idle_timeout; a new client goes to a new worker; once
    the transaction is over the old client is let go after
    lmtp_idle_timeout (421 4.4.2) and the old worker leaves."""
    with Instance("uses", conf={"lmtp_idle_timeout": "1",
                                "lmtp_timeout": "60"}) as inst:
        inst.create("user.uses")
        with open(inst.cyrus_conf, "w") as f:
            f.write("SERVICES {\n  lmtpunix cmd=\"lmtpd\" listen=\"%s\" "
                    "prefork=1 maxchild=3 maxuses=1\n}\n"
                    % inst.unix_socket)
        inst.start()
        first = set(inst.child_pids("lmtpunix"))
        check(len(first) == 1, "workers at start: %r" % first)
        a = greet(inst.unix_socket, timeout=60)
        check(a.cmd("LHLO a.example").code == 250, "LHLO")
        check(a.cmd("MAIL FROM:<a@example.org>").code == 250, "MAIL")
        c = greet(inst.unix_socket, timeout=60)
        _, _, _, dr = transaction(c, "c@example.org", ["uses"],
                                  make_message(uniq("c")), lhlo="c.example")
        check([x.code for x in dr] == [250], "c: %r" % dr)
        c.close()               # (its worker, at maxuses too, would let
                                # it go after lmtp_idle_timeout)
        time.sleep(2)           # past lmtp_idle_timeout, inside MAIL
        check(a.cmd("RCPT TO:<uses>").code == 250, "RCPT after the wait")
        check(a.cmd("DATA").code == 354, "DATA")
        a.send(make_message(uniq("a")) + b".\r\n")
        check(a.reply().code == 250, "a's delivery")
        a.settimeout(60)
        r = a.reply()
        check(r.code == 421 and r.enh == "4.4.2" and "Idle" in r.text,
              "idle client of the retiring worker: %r" % r)
        check(a.at_eof(), "open after 421")
        a.close()
        gone = wait_until(lambda: not (first & set(inst.child_pids(
            "lmtpunix"))), 60)
        check(gone, "the worker past maxuses did not leave: %r"
              % inst.child_pids("lmtpunix"))
        check(inst.count("user.uses") == 2, "count %d"
              % inst.count("user.uses"))


# ---- 4: TLS, AUTH and pipelining side by side in one worker ------------------

def test_tls_auth_pipelining_one_worker():
    with Instance("mux", tls=True, sasl=(SASL_USER, SASL_PASS),
                  conf={"lmtp_timeout": "60"}) as inst:
        inst.create("user.mux")
        inst.write_cyrus_conf(unix=True, tcp=True, prefork=1, maxchild=1)
        inst.start()
        tcp = inst.tcp_addr()
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        good = base64.b64encode(b"\0" + SASL_USER.encode() + b"\0"
                                + SASL_PASS.encode())
        held = []
        try:
            a = greet(tcp)                  # STARTTLS, then idles
            held.append(a)
            check(a.cmd("LHLO a.example").code == 250, "LHLO a")
            check(a.cmd("STARTTLS").code == 220, "STARTTLS a")
            a.starttls(ctx)
            b = greet(tcp)                  # STARTTLS + AUTH, then idles
            held.append(b)
            check(b.cmd("LHLO b.example").code == 250, "LHLO b")
            check(b.cmd("STARTTLS").code == 220, "STARTTLS b")
            b.starttls(ctx)
            check(b.cmd("LHLO b.example").code == 250, "LHLO b under TLS")
            r = b.cmd(b"AUTH PLAIN " + good)
            check(r.code == 235, "AUTH b: %r" % r)
            c = greet(tcp)                  # plain text, AUTH over 2 lines
            held.append(c)
            check(c.cmd("LHLO c.example").code == 250, "LHLO c")
            check(a.cmd("LHLO a.example").code == 250, "LHLO a under TLS")
            # interleaved: each one's state is its own
            check(c.cmd("MAIL FROM:<c@example.org>").code == 530,
                  "MAIL without AUTH on c")
            r = a.cmd("AUTH PLAIN")
            check(r.code == 334, "AUTH a step 1: %r" % r)
            r = a.cmd(good)
            check(r.code == 235, "AUTH a step 2: %r" % r)
            msgs = [make_message(uniq("mux")) for _ in range(4)]
            # pipelined under TLS: a whole transaction in one write
            payload = (b"MAIL FROM:<b@example.org>\r\nRCPT TO:<mux>\r\n"
                       b"DATA\r\n" + msgs[0] + b".\r\n"
                       b"MAIL FROM:<b@example.org>\r\nRCPT TO:<mux>\r\n"
                       b"DATA\r\n" + msgs[1] + b".\r\nNOOP\r\n")
            b.send(payload)
            rs = b.replies(9)
            check([x.code for x in rs] == [250, 250, 354, 250,
                                          250, 250, 354, 250, 250],
                  "pipelined under TLS: %r" % rs)
            _, _, _, dr = transaction(a, "a@example.org", ["mux"], msgs[2])
            check([x.code for x in dr] == [250], "a's delivery %r" % dr)
            # pipelined in plain text on the UNIX socket meanwhile
            u = greet(inst.unix_socket)
            held.append(u)
            u.send(b"LHLO u.example\r\nMAIL FROM:<u@example.org>\r\n"
                   b"RCPT TO:<mux>\r\nDATA\r\n" + msgs[3] + b".\r\n")
            rs = u.replies(5)
            check([x.code for x in rs] == [250, 250, 250, 354, 250],
                  "pipelined on UNIX: %r" % rs)
            check(b.cmd("NOOP").code == 250, "b after the others")
            check(inst.svc_int("lmtp", "total") == 1, "more than one "
                  "worker: %r" % inst.service("lmtp"))
            check(inst.count("user.mux") == 4, "stored %d of 4"
                  % inst.count("user.mux"))
            for x in (a, b, c, u):
                check(x.cmd("QUIT").code == 221, "QUIT")
        finally:
            closes_all(held)


# ---- the UNIX socket's backlog -------------------------------------------------

def somaxconn():
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return socket.SOMAXCONN


def test_unix_backlog():
    """No worker accepts (maxchild=0): 200 simultaneous non-blocking
    connects all wait in the backlog, none refused with EAGAIN (when the
    system's maximum is below 200, exactly the ones beyond it are)."""
    with Instance("backlog") as inst:
        inst.write_cyrus_conf(prefork=0, maxchild=0)
        inst.start(ready=0)
        check(wait_until(lambda: os.path.exists(inst.unix_socket), 30),
              "no socket")
        socks, refused = [], 0
        try:
            for _ in range(200):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                socks.append(s)
                try:
                    s.connect(inst.unix_socket)
                except BlockingIOError:
                    refused += 1
                except OSError as e:
                    if e.errno != errno.EAGAIN:
                        raise
                    refused += 1
        finally:
            closes_all(socks)
        limit = somaxconn()
        allowed = max(0, 200 - (limit + 1))
        print("#   200 connects, somaxconn %d: %d refused" % (limit, refused))
        check(refused <= allowed, "%d of 200 connects refused with EAGAIN "
              "(somaxconn %d)" % (refused, limit))


TESTS = [
    test_idle_clients_do_not_block,
    test_persistent_storm,
    test_timeout_sigterm_idle_timeout,
    test_maxuses_retires,
    test_tls_auth_pipelining_one_worker,
    test_unix_backlog,
]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
