#!/usr/bin/env python3
"""test_lmtp_crash.py - lmtpd workers SIGKILLed during a delivery storm.

A master runs lmtpd (prefork 5, maxchild 20).  20 client threads deliver
2,000 messages over the UNIX socket, each with a unique Message-ID and the
SHA-256 of its body in a header (X-Body-SHA256); some go to two mailboxes.
Every 250 a client receives is recorded per (message, mailbox).  A killer
thread SIGKILLs a random worker (a busy one when there is one, never one
still starting) every 50-100 ms.  Clients reconnect and retry a message
whose connection died or that got a 4xx, for the recipients not yet
acknowledged, as an MTA does.

Afterwards (master still running): every message acknowledged with 250
for a mailbox is in that mailbox (at least once) and complete (its body
hash matches); every message the index shows is complete (file size and
SHA-1 equal to its record, body hash equal to its header); `mbtool check`
passes for every mailbox; no staging file of a dead worker is taken for
a message; the master has replaced the killed workers (prefork ready in
its status file) and a new connection delivers.

master_killed_restart: the master itself (lmtpd over UNIX and TCP, imapd
over TCP with one IMAP session open) is SIGKILLed a fifth into a storm of
8 clients and started again at once.  The new master must come up without
any manual step, the clients (half UNIX, half TCP) finish, every 250 is
stored, the open IMAP session is closed by its orphaned imapd, and every
worker of the old generation (PIDs recorded before the kill) is gone
within 60 s.

Environment: see lmtphelp.py; CRASH_MESSAGES (default 2000),
MASTERKILL_MESSAGES (default 1200).
"""
import base64
import hashlib
import os
import random
import re
import signal
import socket
import sys
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import (TOP_BUILDDIR, Fail, alive, check,  # noqa: E402
                     cmdline, connect_socket, free_port, kill_all,
                     run_threads, service_line, wait_until)
from lmtphelp import (Conn, ConnectionClosed, Instance,  # noqa: E402
                      dot_stuff, header_value, make_message, run_lmtp_tests)

NMSG = int(os.environ.get("CRASH_MESSAGES") or "2000")
NCLIENTS = 20
NBOX = 10
PREFORK, MAXCHILD = 5, 20
DEADLINE = 600          # seconds after which the storm has hung
KILL_MESSAGES = int(os.environ.get("MASTERKILL_MESSAGES") or "1200")
IMAPD = os.path.join(TOP_BUILDDIR, "imapd", "imapd")


def box_of(i):
    return "c%02d" % (i % NBOX)


def rcpts_of(i):
    r = [box_of(i)]
    if i % 7 == 0:
        r.append("c%02d" % ((i + 3) % NBOX))
    return r


_messages = {}


def message_of(i):
    """Message i (the same bytes on every attempt): 200..24,000 bytes of
    base64 lines from a generator seeded with i."""
    if i in _messages:
        return _messages[i]
    rnd = random.Random(i)
    n = rnd.randint(200, 24000)
    raw = base64.b64encode(rnd.getrandbits(8 * n).to_bytes(n, "little"))
    lines = [raw[k:k + 76] for k in range(0, len(raw), 76)]
    body = b"%d\r\n" % i + b"\r\n".join(lines) + b"\r\n"
    digest = hashlib.sha256(body).hexdigest()
    msg = make_message("crash.%d.%d@test.example" % (os.getpid(), i),
                       subject="crash %d" % i, body=body,
                       extra_headers=["X-Body-SHA256: %s" % digest])
    _messages[i] = msg
    return msg


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.acked = {}          # (i, box) -> True
        self.ack_times = []      # monotonic time of each 250
        self.attempts = 0
        self.conn_errors = 0
        self.tempfails = 0
        self.other = []


def deliver_one(conn, i, rcpts):
    """One transaction on an open connection: {rcpt: reply code}."""
    out = b"MAIL FROM:<storm@example.org>\r\n"
    out += b"".join(b"RCPT TO:<%s>\r\n" % r.encode() for r in rcpts)
    out += b"DATA\r\n"
    conn.send(out)
    mr = conn.reply()
    rr = [conn.reply() for _ in rcpts]
    dr = conn.reply()
    result = {}
    if mr.code != 250:
        return {r: mr.code for r in rcpts}
    for r, rep in zip(rcpts, rr):
        if rep.code != 250:
            result[r] = rep.code
    ok = [r for r, rep in zip(rcpts, rr) if rep.code == 250]
    if dr.code != 354:
        for r in ok:
            result[r] = dr.code
        return result
    conn.send(dot_stuff(message_of(i)))
    for r in ok:
        result[r] = conn.reply().code
    return result


def client(inst, ids, stats, stop_at, addr=None):
    conn = None
    if addr is None:
        addr = inst.unix_socket
    try:
        for i in ids:
            pending = rcpts_of(i)
            backoff = 0.02
            while pending:
                if time.monotonic() > stop_at:
                    raise Fail("deadline: message %d not delivered" % i)
                with stats.lock:
                    stats.attempts += 1
                try:
                    if conn is None:
                        conn = Conn(addr, timeout=30)
                        g = conn.reply()
                        if g.code != 220:
                            raise ConnectionClosed("greeting %r" % g)
                        if conn.cmd("LHLO storm.example").code != 250:
                            raise ConnectionClosed("LHLO refused")
                    res = deliver_one(conn, i, pending)
                except (ConnectionClosed, OSError, socket.timeout):
                    with stats.lock:
                        stats.conn_errors += 1
                    if conn is not None:
                        conn.close()
                    conn = None
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 0.5)
                    continue
                left = []
                for r in pending:
                    code = res[r]
                    if code == 250:
                        with stats.lock:
                            stats.acked[(i, r)] = True
                            stats.ack_times.append(time.monotonic())
                    elif 400 <= code < 500:
                        with stats.lock:
                            stats.tempfails += 1
                        left.append(r)
                    else:
                        with stats.lock:
                            stats.other.append((i, r, code))
                pending = left
                if pending:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 0.5)
        if conn is not None:
            try:
                conn.cmd("QUIT")
            except (ConnectionClosed, OSError, socket.timeout):
                pass
    except Exception as e:  # noqa: BLE001 - reported by the test
        with stats.lock:
            stats.other.append(("client", repr(e)))
    finally:
        if conn is not None:
            conn.close()


def killer(inst, stop, kills):
    rnd = random.Random(4711)
    while not stop.wait(rnd.uniform(0.05, 0.1)):
        busy = inst.child_pids("lmtpunix", state="busy")
        ready = inst.child_pids("lmtpunix", state="ready")
        pool = busy if busy and rnd.random() < 0.85 else ready
        if not pool:
            continue
        pid = rnd.choice(pool)
        # the master's status lists a worker until it has reaped it: one
        # killed already (or exited on its own) is a zombie until then,
        # and a SIGKILL to it succeeds without killing anything
        if pid in kills or not alive(pid):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)
        except ProcessLookupError:
            pass


def body_ok(data):
    """(message index or None, body hash matches)."""
    subject = header_value(data, "Subject") or ""
    m = re.match(r"crash (\d+)$", subject)
    want = header_value(data, "X-Body-SHA256")
    parts = data.split(b"\r\n\r\n", 1)
    if len(parts) != 2 or not want:
        return (int(m.group(1)) if m else None), False
    return (int(m.group(1)) if m else None), \
        hashlib.sha256(parts[1]).hexdigest() == want


def test_sigkill_storm():
    with Instance("crash") as inst:
        boxes = ["c%02d" % k for k in range(NBOX)]
        for b in boxes:
            inst.create("user." + b)
        inst.write_cyrus_conf(prefork=PREFORK, maxchild=MAXCHILD)
        inst.start(ready=PREFORK)
        inst.ignore_sigkill = True
        stats = Stats()
        stop, kills = threading.Event(), []
        t0 = time.monotonic()
        stop_at = t0 + DEADLINE
        threads = [threading.Thread(target=client, args=(
            inst, range(k, NMSG, NCLIENTS), stats, stop_at))
            for k in range(NCLIENTS)]
        kt = threading.Thread(target=killer, args=(inst, stop, kills))
        kt.start()
        run_threads(threads, DEADLINE + 60)
        stop.set()
        kt.join(10)
        took = time.monotonic() - t0
        want = sum(len(rcpts_of(i)) for i in range(NMSG))
        print("#   %d messages (%d deliveries) in %.1f s: %d workers "
              "killed, %d transaction attempts, %d broken connections, "
              "%d 4xx" % (NMSG, want, took, len(kills), stats.attempts,
                          stats.conn_errors, stats.tempfails))
        check(not stats.other, "unexpected results: %s" % stats.other[:5])
        check(len(stats.acked) == want, "%d of %d deliveries acknowledged"
              % (len(stats.acked), want))
        check(len(kills) >= min(10, max(1, NMSG // 100)),
              "only %d workers killed: the storm was too "
              "short to test anything" % len(kills))

        # the master replaced the killed workers
        check(wait_until(lambda: (inst.svc_int("lmtpunix", "ready") or 0)
                         >= PREFORK, 60),
              "fewer than %d ready workers after the storm: %s"
              % (PREFORK, inst.status().get("services")))
        crashed = len(re.findall(r"crashed signal=<?9", inst.log()))
        check(crashed >= len(kills) * 0.9, "master logged %d crashes for "
              "%d kills" % (crashed, len(kills)))

        # every mailbox checks; every visible message is complete
        found = {}
        for b in boxes:
            rc, out, err = inst.mbtool("check", "user." + b, check_rc=False)
            check(rc == 0, "mbtool check user.%s: %s%s" % (b, out, err))
            for data in inst.messages("user." + b):   # checks size, SHA-1
                i, ok = body_ok(data)
                check(i is not None, "user.%s: a message that is not "
                      "ours: %r" % (b, data[:400]))
                check(ok, "user.%s: message %d is incomplete (body hash)"
                      % (b, i))
                found[(i, b)] = found.get((i, b), 0) + 1
        missing = [k for k in stats.acked if k not in found]
        check(not missing, "%d acknowledged deliveries missing, e.g. %s"
              % (len(missing), missing[:5]))
        dups = sum(1 for n in found.values() if n > 1)
        extra = [k for k in found if k not in stats.acked]
        stale = sum(inst.count("user." + b) for b in boxes) - \
            sum(found.values())
        print("#   %d visible deliveries, %d stored twice (acknowledgement "
              "lost to a kill), %d not acknowledged, %d dead workers' "
              "files outside the index" % (sum(found.values()), dups,
                                           len(extra), stale))

        # a fresh delivery after the storm
        with Conn(inst.unix_socket) as c:
            check(c.reply().code == 220, "greeting after the storm")
            c.cmd("LHLO after.example")
            res = deliver_one(c, NMSG, ["c00"])
            check(res == {"c00": 250}, "delivery after the storm: %r" % res)
        # the SIGKILLs were ours; any other crash or failure is trouble
        inst.ignore_sigkill = True
        trouble = inst.worker_trouble(inst.log())
        check(not trouble, "other worker trouble: %s" % trouble[:3])


def imap_greeting(addr, timeout=10.0):
    """A connection to imapd that has read the greeting and then just
    stays open (a session in progress)."""
    sock = connect_socket(addr, timeout)
    data = b""
    while b"\r\n" not in data:
        got = sock.recv(4096)
        if not got:
            break
        data += got
    if not data.startswith(b"* OK"):
        sock.close()
        raise Fail("imapd greeting: %r" % data[:200])
    return sock


def closed_by_server(sock, timeout):
    """True when the server closes sock within timeout seconds."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except socket.timeout:
        return False
    except OSError:
        return True
    return True


def test_master_killed_restart():
    """SIGKILL the master in an LMTP storm, start a new one at once: the
    old generation's workers notice, finish the connection in progress
    and leave; the new master gets the addresses (TCP and UNIX) without
    any manual step; every acknowledged message is stored."""
    nmsg, nclients = KILL_MESSAGES, 8
    with Instance("masterkill") as inst:
        boxes = ["c%02d" % k for k in range(NBOX)]
        for b in boxes:
            inst.create("user." + b)
        imap_port = free_port()
        imap_line = service_line("imap", IMAPD, "127.0.0.1:%d" % imap_port,
                                 prefork=2, maxchild=5)
        inst.write_cyrus_conf(tcp_preauth=True, prefork=3, maxchild=10,
                              extra=imap_line)
        inst.start(ready=3)
        inst.ignore_sigkill = True
        check(wait_until(lambda: (inst.svc_int("imap", "ready") or 0)
                         >= 2, 15), "imapd not ready: %s"
              % inst.service("imap"))
        imap_sess = imap_greeting(("127.0.0.1", imap_port))
        old = []
        try:
            stats = Stats()
            t0 = time.monotonic()
            stop_at = t0 + DEADLINE
            addrs = [inst.unix_socket, inst.tcp_addr(preauth=True)]
            threads = [threading.Thread(target=client, args=(
                inst, range(k, nmsg, nclients), stats, stop_at,
                addrs[k % 2])) for k in range(nclients)]
            for t in threads:
                t.start()
            check(wait_until(lambda: len(stats.acked) >= nmsg // 5
                             or not any(t.is_alive() for t in threads),
                             DEADLINE),
                  "the storm made no progress")
            # the old generation: every child of the master right now
            old_master = inst.pid
            old = sorted(set(inst.children()) | set(inst.child_pids()))
            old = [p for p in old if alive(p)]
            inst.proc.kill()
            inst.proc.wait(10)
            killed_at = time.monotonic()
            acked_before = len(stats.acked)
            check(acked_before < sum(len(rcpts_of(i)) for i in range(nmsg)),
                  "the storm ended before the master was killed")
            inst.start(ready=1, timeout=60)
            up_at = time.monotonic()
            started = up_at - killed_at
            for t in threads:
                t.join(max(1.0, stop_at + 30 - time.monotonic()))
            check(not any(t.is_alive() for t in threads),
                  "clients still running after the deadline")
            want = sum(len(rcpts_of(i)) for i in range(nmsg))
            with stats.lock:
                after = sorted(x for x in stats.ack_times if x > up_at)
            print("#   master %d killed after %d of %d deliveries, old "
                  "workers %s; new master up in %.1f s; first delivery "
                  "after that in %s s, %d in all; %d broken connections, "
                  "%d 4xx" % (old_master, acked_before, want, old, started,
                              "%.1f" % (after[0] - up_at) if after else "-",
                              len(after), stats.conn_errors,
                              stats.tempfails))
            check(not stats.other, "unexpected results: %s"
                  % stats.other[:5])
            check(len(stats.acked) == want, "%d of %d deliveries "
                  "acknowledged" % (len(stats.acked), want))
            check(after and after[0] - up_at < 60, "the storm did not "
                  "resume within 60 s of the new master's start")
            # the old generation leaves: idle workers at once, busy ones
            # after their connection (the IMAP session gets its BYE)
            check(closed_by_server(imap_sess, 60), "the old imapd kept "
                  "its session open 60 s after its master died")
            wait_until(lambda: not [p for p in old if alive(p)], 60)
            gone = [p for p in old if alive(p)]
            check(not gone, "old workers still running 60 s after their "
                  "master was killed: %s" % ", ".join(
                      "%d(%s)" % (p, cmdline(p)) for p in gone))

            found = {}
            for b in boxes:
                rc, out, err = inst.mbtool("check", "user." + b,
                                           check_rc=False)
                check(rc == 0, "mbtool check user.%s: %s%s" % (b, out, err))
                for data in inst.messages("user." + b):
                    i, ok = body_ok(data)
                    check(i is not None and ok, "user.%s: a message that "
                          "is not ours or incomplete" % b)
                    found[(i, b)] = True
            missing = [k for k in stats.acked if k not in found]
            check(not missing, "%d acknowledged deliveries missing, e.g. %s"
                  % (len(missing), missing[:5]))
            # the new generation serves both addresses and imapd
            for addr in addrs:
                with Conn(addr) as c:
                    check(c.reply().code == 220, "greeting from the new "
                          "master's lmtpd at %s" % (addr,))
                    c.cmd("LHLO after.example")
                    res = deliver_one(c, nmsg, ["c00"])
                    check(res == {"c00": 250}, "delivery after the restart "
                          "at %s: %r" % (addr, res))
            imap_greeting(("127.0.0.1", imap_port)).close()
        finally:
            imap_sess.close()
            kill_all([p for p in old if alive(p)])


TESTS = [test_sigkill_storm, test_master_killed_restart]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
