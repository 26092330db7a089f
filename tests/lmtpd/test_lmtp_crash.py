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

Environment: see lmtphelp.py; CRASH_MESSAGES (default 2000).
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
from testlib import Fail, check, run_threads, wait_until  # noqa: E402
from lmtphelp import (Conn, ConnectionClosed, Instance,  # noqa: E402
                      dot_stuff, header_value, make_message, run_lmtp_tests)

NMSG = int(os.environ.get("CRASH_MESSAGES") or "2000")
NCLIENTS = 20
NBOX = 10
PREFORK, MAXCHILD = 5, 20
DEADLINE = 600          # seconds after which the storm has hung


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


def client(inst, ids, stats, stop_at):
    conn = None
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
                        conn = Conn(inst.unix_socket, timeout=30)
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

TESTS = [test_sigkill_storm]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
