#!/usr/bin/env python3
"""test_lmtpd.py - lmtpd end to end under the real master.

One instance ("main": UNIX socket, TCP with AUTH required, TCP with -a;
a self-signed certificate; a sasldb made with saslpasswd2;
maxmessagesize 100000; lmtp_timeout 10) serves most tests; a second one
("strict") has lmtp_over_quota_perm_failure: yes, lmtp_bare_newlines: fix
and maxheaderlines: 20.  Clients: Python's smtplib.LMTP, a raw socket
client that sends exactly the bytes given (pipelining, bad input), and
swaks (UNIX socket, TCP, STARTTLS, AUTH PLAIN).  Delivered messages are
read back from the spool files (PARTITION/user/NAME/UID.).

After every bad-input test a new connection must deliver a message, the
workers that served before must still be alive, and the master log must
show no crashed or failed worker (nor a sanitizer report).

Environment: see lmtphelp.py (top_builddir, TEST_TMPDIR, LMTP_TESTS,
LMTP_KEEP).
"""
import os
import re
import smtplib
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import (RUN_AS, Fail, Skip, check,  # noqa: E402
                     chown_run_as, drop_privileges, wait_until)
from lmtphelp import (LMTPD, SERVERNAME, Conn,  # noqa: E402
                      ConnectionClosed, Instance, dot_stuff, header_value,
                      make_message, run_lmtp_tests, split_added_headers,
                      transaction)

MAXSIZE = 100000
MAXRCPT = 1000
TIMEOUT = 10
SASL_USER, SASL_PASS = "alice", "s3cret-pw"
USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "gina", "hank",
         "ivan", "quser"]

_main = None
_seq = [0]


def uniq(prefix="m"):
    _seq[0] += 1
    return "%s.%d.%d.%d@test.example" % (prefix, os.getpid(), _seq[0],
                                         int(time.time() * 1000))


def main_instance():
    """The shared instance, started on first use."""
    global _main
    if _main is None:
        inst = Instance("main", conf={
            "maxmessagesize": str(MAXSIZE),
            "lmtp_timeout": str(TIMEOUT),
        }, tls=True, sasl=(SASL_USER, SASL_PASS))
        try:
            for u in USERS:
                inst.create("user." + u)
            inst.create("user.alice.Lists", {"anyone": "p"})
            inst.create("user.alice.Private")
            inst.create("shared.news", {"anyone": "p"})
            inst.create("shared.closed", {"anyone": "lr"})
            inst.quota("user.quser", 2)
            inst.write_cyrus_conf(unix=True, tcp=True, tcp_preauth=True,
                                  prefork=1, maxchild=10)
            inst.start()
        except BaseException:
            inst.stop()
            inst.cleanup()
            raise
        _main = inst
    return _main


class Survives:
    """with Survives(inst): ... -- afterwards a new connection delivers a
    message, the workers alive before are alive still, and the master log
    has no crashed worker."""

    def __init__(self, inst):
        self.inst = inst

    def __enter__(self):
        self.inst.mark_log()
        self.pids = self.inst.child_pids("lmtpunix")
        return self

    def __exit__(self, etype, exc, tb):
        if etype is not None:
            return False
        inst = self.inst
        before = inst.count("user.erin")
        msgid = uniq("after")
        with Conn(inst.unix_socket) as c:
            check(c.reply().code == 220, "no greeting on a new connection")
            _, rr, _, dr = transaction(c, "s@example.org", ["erin"],
                                       make_message(msgid), lhlo="x.example")
            check([r.code for r in rr] == [250] and
                  [r.code for r in dr] == [250],
                  "delivery on a new connection failed: %r %r" % (rr, dr))
        check(inst.count("user.erin") == before + 1,
              "the delivery after the bad input stored nothing")
        dead = [p for p in self.pids if not os.path.exists("/proc/%d" % p)]
        trouble = inst.worker_trouble()
        check(not trouble, "worker trouble: %s" % " | ".join(trouble[:3]))
        check(not dead, "workers %s that served before died" % dead)
        return False


def connect(inst, addr=None, lhlo="client.example"):
    c = Conn(addr or inst.unix_socket)
    g = c.reply()
    check(g.code == 220, "greeting: %r" % g)
    if lhlo:
        r = c.cmd("LHLO %s" % lhlo)
        check(r.code == 250, "LHLO: %r" % r)
    return c


def codes(replies):
    return [r.code for r in replies]


# ---- protocol ---------------------------------------------------------------

def test_greeting_and_commands():
    inst = main_instance()
    with Conn(inst.unix_socket) as c:
        g = c.reply()
        check(g.code == 220 and SERVERNAME in g.text and "LMTP" in g.text,
              "greeting %r" % g)
        c.expect("HELO client.example", 500, "5.5.1",
                 "HELO: %r (LMTP wants LHLO: 500 5.5.1)")
        c.expect("EHLO client.example", 500, "5.5.1", "EHLO: %r")
        r = c.cmd("LHLO client.example")
        check(r.code == 250 and r.lines[0].startswith(SERVERNAME),
              "LHLO: %r" % r)
        ext = [l.split()[0].upper() for l in r.lines[1:] if l.split()]
        for e in ("PIPELINING", "8BITMIME", "ENHANCEDSTATUSCODES",
                  "CHUNKING", "SIZE"):
            check(e in ext, "LHLO does not advertise %s: %r" % (e, r))
        size = [l for l in r.lines[1:] if l.upper().startswith("SIZE")]
        check(size and size[0].split()[1:] == [str(MAXSIZE)],
              "SIZE not from maxmessagesize: %r" % size)
        c.expect("NOOP", 250, "2.0.0", "NOOP: %r")
        c.expect("VRFY alice", 252, "2.5.0", "VRFY: %r")
        c.expect("VRFY nosuchuser", 252, None,
                 "VRFY of an unknown user leaks: %r")
        c.expect("HELP", 214, None, "HELP: %r")
        c.expect("RSET", 250, "2.0.0", "RSET: %r")
        c.expect("QUIT", 221, "2.0.0", "QUIT: %r")
        check(c.at_eof(), "connection still open after QUIT")


def test_multi_rcpt_replies():
    """smtplib.LMTP: recipients known and unknown, one DATA reply per
    accepted recipient in RCPT order, one file linked into each mailbox."""
    inst = main_instance()
    before = {u: inst.count("user." + u) for u in ("alice", "bob", "carol")}
    msgid = uniq("multi")
    msg = make_message(msgid, subject="multi")
    lm = smtplib.LMTP(inst.unix_socket, timeout=30)
    try:
        code, _ = lm.ehlo("client.example")
        check(code == 250, "LHLO via smtplib: %d" % code)
        check(lm.has_extn("pipelining") and lm.has_extn("enhancedstatuscodes"),
              "extensions %r" % lm.esmtp_features)
        code, _ = lm.mail("sender@example.org")
        check(code == 250, "MAIL: %d" % code)
        rcpts = ["alice", "nobody", "bob@test.example", "<@relay.example:"
                 "Carol@test.example>", "no.such.user@test.example"]
        got = []
        for r in rcpts:
            if r.startswith("<"):
                lm.putcmd("rcpt", "TO:%s" % r)
                got.append(lm.getreply())
            else:
                got.append(lm.rcpt(r))
        want = [250, 550, 250, 250, 550]
        check([g[0] for g in got] == want, "RCPT replies %r, expected %r"
              % (got, want))
        for g in (got[1], got[4]):
            check(g[1].startswith(b"5.1.1"), "unknown user: %r" % (g,))
        lm.putcmd("data")
        code, text = lm.getreply()
        check(code == 354, "DATA: %d %r" % (code, text))
        lm.send(dot_stuff(msg))
        replies = [lm.getreply() for _ in range(3)]
        check([r[0] for r in replies] == [250, 250, 250],
              "per-recipient DATA replies %r" % replies)
        for r in replies:
            check(r[1].startswith(b"2.1.5"), "DATA reply %r" % (r,))
        code, _ = lm.noop()
        check(code == 250, "NOOP after DATA: %d (an extra reply queued?)"
              % code)
        lm.quit()
    finally:
        lm.close()
    paths = {}
    for u in ("alice", "bob", "carol"):
        files = inst.message_files("user." + u)
        check(len(files) == before[u] + 1, "user.%s has %d messages, "
              "expected %d" % (u, len(files), before[u] + 1))
        with open(files[-1][1], "rb") as f:
            data = f.read()
        check(header_value(data, "Message-ID") == "<%s>" % msgid,
              "user.%s: newest message is not ours" % u)
        paths[u] = files[-1][1]
    inodes = {os.stat(p).st_ino for p in paths.values()}
    check(len(inodes) == 1, "the message was written %d times, not once "
          "and linked into each mailbox" % len(inodes))


def test_pipelined_commands():
    """Everything up to DATA in one write, then the message and QUIT in
    another: every reply, in order."""
    inst = main_instance()
    before = (inst.count("user.bob"), inst.count("user.carol"))
    msgid = uniq("pipe")
    with Conn(inst.unix_socket) as c:
        c.send(b"LHLO pipe.example\r\nMAIL FROM:<p@example.org>\r\n"
               b"RCPT TO:<bob>\r\nRCPT TO:<ghost>\r\nRCPT TO:<carol>\r\n"
               b"NOOP\r\nDATA\r\n")
        rs = c.replies(8)
        check(codes(rs) == [220, 250, 250, 250, 550, 250, 250, 354],
              "pipelined replies %r" % rs)
        c.send(dot_stuff(make_message(msgid)) + b"QUIT\r\n")
        rs = c.replies(3)
        check(codes(rs) == [250, 250, 221], "after DATA: %r" % rs)
        check(c.at_eof(), "open after QUIT")
    check((inst.count("user.bob"), inst.count("user.carol"))
          == (before[0] + 1, before[1] + 1), "not delivered to both")
    # two whole transactions in one write
    with Conn(inst.unix_socket) as c:
        m1, m2 = make_message(uniq("p1")), make_message(uniq("p2"))
        c.send(b"LHLO pipe.example\r\n"
               b"MAIL FROM:<p@example.org>\r\nRCPT TO:<bob>\r\nDATA\r\n"
               + dot_stuff(m1) +
               b"MAIL FROM:<p@example.org>\r\nRCPT TO:<bob>\r\nDATA\r\n"
               + dot_stuff(m2) + b"QUIT\r\n")
        rs = c.replies(11)
        check(codes(rs) == [220, 250, 250, 250, 354, 250,
                            250, 250, 354, 250, 221],
              "two pipelined transactions: %r" % rs)
    check(inst.count("user.bob") == before[0] + 3, "bob: %d messages"
          % inst.count("user.bob"))


def test_dots_and_8bit_byte_exact():
    inst = main_instance()
    msgid = uniq("dots")
    body = (b".leading dot\r\n..two dots\r\n.\r\n. \r\n \r\n"
            b"8-bit: \xe4\xf6\xfc \xc3\xa4 \xff\x80\x81\r\n"
            b"\r\n\r\n" + b"x" * 990 + b"\r\n" + b"...\r\nend\r\n")
    msg = make_message(msgid, body=body)
    # an 8-bit header too
    msg = msg.replace(b"\r\n\r\n", b"\r\nX-Eight: \xe9t\xe9\r\n\r\n", 1)
    with connect(inst, lhlo="dots.example") as c:
        mr, rr, dr, res = transaction(c, "dots@example.org", ["dave"], msg,
                                      mail_params=" BODY=8BITMIME")
        check(mr.code == 250, "MAIL BODY=8BITMIME: %r" % mr)
        check(codes(res) == [250], "delivery: %r %r %r" % (rr, dr, res))
    files = inst.messages("user.dave")
    check(files, "nothing stored")
    rp, recv, rest = split_added_headers(files[-1])
    check(rp == b"Return-Path: <dots@example.org>", "Return-Path %r" % rp)
    check(rest == msg, "the message differs from what was sent "
          "(first difference at byte %d: %r vs %r)"
          % (next((i for i in range(min(len(rest), len(msg)))
                   if rest[i] != msg[i]), min(len(rest), len(msg))),
             rest[:80], msg[:80]))
    text = b" ".join(x.strip() for x in recv).decode(errors="replace")
    check(re.match(r"Received: from dots\.example \(", text),
          "Received does not start with the LHLO name: %r" % text)
    check(re.search(r"\bby %s\b" % re.escape(SERVERNAME), text)
          and re.search(r"\bwith LMTP\w*\b", text)
          and re.search(r";\s*\w{3}, \d{1,2} \w{3} \d{4} ", text),
          "Received header incomplete: %r" % text)
    long_lines = [x for x in recv if len(x) > 78]
    check(not long_lines, "Received not folded at 78 columns: %r"
          % long_lines)


def test_duplicate_suppression():
    inst = main_instance()
    before = {u: inst.count("user." + u) for u in ("frank", "gina")}
    msgid = uniq("dup")
    for i in range(2):
        with connect(inst) as c:
            _, rr, _, res = transaction(c, "d@example.org", ["frank"],
                                        make_message(msgid,
                                                     subject="dup %d" % i))
            check(codes(rr) == [250] and codes(res) == [250],
                  "attempt %d: %r %r" % (i + 1, rr, res))
    check(inst.count("user.frank") == before["frank"] + 1,
          "Message-ID delivered %d times to frank"
          % (inst.count("user.frank") - before["frank"]))
    # the key is Message-ID + mailbox: another mailbox still gets it,
    # and frank gets a different Message-ID
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "d@example.org", ["frank", "gina"],
                                    make_message(msgid))
        check(codes(res) == [250, 250], "frank+gina: %r" % res)
        _, rr, _, res = transaction(c, "d@example.org", ["frank"],
                                    make_message(uniq("dup2")))
        check(codes(res) == [250], "new id: %r" % res)
    check(inst.count("user.gina") == before["gina"] + 1, "gina did not get "
          "the message that frank had")
    check(inst.count("user.frank") == before["frank"] + 2,
          "frank: %d new messages, expected 2"
          % (inst.count("user.frank") - before["frank"]))
    # the same mailbox twice in one transaction: two replies, one copy
    n0 = inst.count("user.gina")
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "d@example.org",
                                    ["gina", "GINA@test.example"],
                                    make_message(uniq("twice")))
        check(codes(rr) == [250, 250] and codes(res) == [250, 250],
              "one mailbox twice: %r %r" % (rr, res))
    check(inst.count("user.gina") == n0 + 1, "one mailbox named twice in "
          "a transaction got %d copies of one Message-ID"
          % (inst.count("user.gina") - n0))
    # without a Message-ID nothing is suppressed
    n0 = inst.count("user.gina")
    for _ in range(2):
        with connect(inst) as c:
            _, rr, _, res = transaction(c, "d@example.org", ["gina"],
                                        make_message(None))
            check(codes(res) == [250], "no Message-ID: %r" % res)
    check(inst.count("user.gina") == n0 + 2, "messages without Message-ID "
          "were suppressed")


def test_plus_addressing():
    inst = main_instance()
    boxes = ["user.alice", "user.alice.Lists", "user.alice.Private",
             "shared.news", "shared.closed"]
    before = {b: inst.count(b) for b in boxes}
    cases = [("alice+Lists", "user.alice.Lists"),
             ("ALICE+Lists@test.example", "user.alice.Lists"),
             ("alice+Private", "user.alice"),      # no 'p' for anyone
             ("alice+nosuchfolder", "user.alice"),
             ("+shared.news@test.example", "shared.news")]
    want = dict(before)
    for rcpt, box in cases:
        with connect(inst) as c:
            _, rr, _, res = transaction(c, "plus@example.org", [rcpt],
                                        make_message(uniq("plus")))
            check(codes(rr) == [250] and codes(res) == [250],
                  "%s: %r %r" % (rcpt, rr, res))
        want[box] += 1
        got = {b: inst.count(b) for b in boxes}
        check(got == want, "after %s: counts %r, expected %r (into %s)"
              % (rcpt, got, want, box))
    # a shared mailbox that does not allow posting
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "plus@example.org",
                                    ["+shared.closed"],
                                    make_message(uniq("closed")))
        check((rr and rr[0].code >= 500) or
              (res and res[0].code >= 500),
              "+shared.closed (no p right): %r %r" % (rr, res))
    check(inst.count("shared.closed") == before["shared.closed"],
          "delivered into a shared mailbox without the p right")


def test_hostile_recipients():
    """Recipient spellings that might escape the user's INBOX or the ACL:
    refused or delivered to the INBOX, never into another mailbox."""
    inst = main_instance()
    boxes = ["user.alice", "user.alice.Lists", "user.alice.Private",
             "user.bob", "shared.news", "shared.closed"]
    before = {b: inst.count(b) for b in boxes}
    cases = ["alice.Private", "alice.Private@test.example",
             "+user.alice.Private", "+user.alice", "alice/Private",
             "../alice", "alice+../bob", "alice+Private.x", "%", "*",
             "alice+", "+", "\"alice\"@test.example", "alice@",
             "user.alice", "bob+user.alice.Private", "alice\x7f",
             "+shared", "+shared.closed.x", "a" * 300]
    with Survives(inst), connect(inst) as c:
        results = []
        for rcpt in cases:
            r = c.cmd("MAIL FROM:<h@example.org>")
            check(r.code == 250, "MAIL: %r" % r)
            r = c.cmd(b"RCPT TO:<" + rcpt.encode("latin-1") + b">")
            results.append((rcpt, r.code))
            if r.code == 250:
                check(c.cmd("DATA").code == 354, "DATA")
                c.send(dot_stuff(make_message(uniq("hostile"))))
                d = c.reply()
                results[-1] = (rcpt, r.code, d.code)
            else:
                check(400 <= r.code < 600, "RCPT %r: %r" % (rcpt, r))
            c.cmd("RSET")
    after = {b: inst.count(b) for b in boxes}
    delivered = [x for x in results if len(x) == 3 and x[2] == 250]
    for b in boxes:
        if b in ("user.alice", "user.bob"):
            continue
        check(after[b] == before[b], "%s got %d messages from the "
              "recipients %r" % (b, after[b] - before[b], delivered))
    extra = sum(after[b] - before[b] for b in ("user.alice", "user.bob"))
    check(extra == len(delivered), "%d accepted, %d in INBOXes: %r"
          % (len(delivered), extra, results))
    print("#   hostile recipients: %d refused, %d delivered to an INBOX (%s)"
          % (len(results) - len(delivered), len(delivered),
             ", ".join(x[0] for x in delivered)))


def test_over_quota():
    inst = main_instance()
    big = make_message(uniq("q"), body=b"q" * 78 + b"\r\n" * 1 +
                       (b"z" * 78 + b"\r\n") * 60)
    before = inst.count("user.quser")
    with connect(inst) as c:
        # at RCPT, from SIZE=
        mr, rr, _, res = transaction(c, "q@example.org", ["quser", "hank"],
                                     big, mail_params=" SIZE=%d" % len(big))
        check(mr.code == 250, "MAIL SIZE=: %r" % mr)
        check(rr[0].code == 452 and rr[0].enh == "4.2.2",
              "over quota at RCPT (SIZE=%d, quota 2 KiB): %r"
              % (len(big), rr[0]))
        check(codes(res) == [250], "hank: %r" % res)
        # at DATA, without SIZE=
        _, rr, _, res = transaction(c, "q@example.org", ["hank", "quser"],
                                    make_message(uniq("q2"),
                                                 body=big.split(
                                                     b"\r\n\r\n", 1)[1]))
        check(codes(rr) == [250, 250], "RCPT without SIZE: %r" % rr)
        check(codes(res)[:1] == [250] and len(res) == 2
              and res[1].code == 452 and res[1].enh == "4.2.2",
              "DATA over quota: %r" % res)
        # a small one fits
        _, rr, _, res = transaction(c, "q@example.org", ["quser"],
                                    make_message(uniq("q3")))
        check(codes(res) == [250], "small message under quota: %r %r"
              % (rr, res))
    check(inst.count("user.quser") == before + 1, "user.quser: %d new "
          "messages, expected 1" % (inst.count("user.quser") - before))
    # a message-count limit
    inst.create("user.qcount")
    inst.quota("user.qcount", "none", 1)
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "q@example.org", ["qcount"],
                                    make_message(uniq("qc1")))
        check(codes(res) == [250], "first message under a limit of 1: %r %r"
              % (rr, res))
        _, rr, _, res = transaction(c, "q@example.org", ["qcount"],
                                    make_message(uniq("qc2")))
        got = [r for r in rr + res if r.code != 250]
        check(got and got[0].code == 452 and got[0].enh == "4.2.2",
              "second message over a message-count limit of 1: %r %r"
              % (rr, res))
    check(inst.count("user.qcount") == 1, "user.qcount has %d messages"
          % inst.count("user.qcount"))


def test_maxmessagesize():
    inst = main_instance()
    before = {u: inst.count("user." + u) for u in ("ivan", "hank")}
    with Survives(inst), connect(inst) as c:
        r = c.cmd("MAIL FROM:<s@example.org> SIZE=%d" % (MAXSIZE + 1))
        check(r.code == 552 and r.enh == "5.3.4", "SIZE over: %r" % r)
        r = c.cmd("MAIL FROM:<s@example.org> SIZE=%d" % (MAXSIZE // 2))
        check(r.code == 250, "SIZE under: %r" % r)
        check(c.cmd("RSET").code == 250, "RSET")
        body = (b"y" * 98 + b"\r\n") * 1500      # 150,000 bytes
        _, rr, _, res = transaction(c, "s@example.org", ["ivan", "hank"],
                                    make_message(uniq("big"), body=body))
        check(codes(rr) == [250, 250], "RCPT: %r" % rr)
        check(codes(res) == [552, 552] and all(r.enh == "5.3.4"
                                              for r in res),
              "over-size DATA: %r" % res)
        _, rr, _, res = transaction(c, "s@example.org", ["ivan"],
                                    make_message(uniq("small")))
        check(codes(res) == [250], "same session after the refusal: %r"
              % res)
    check(inst.count("user.hank") == before["hank"], "over-size stored")
    check(inst.count("user.ivan") == before["ivan"] + 1, "ivan: %d new"
          % (inst.count("user.ivan") - before["ivan"]))


def test_bdat_chunking():
    inst = main_instance()
    before = {u: inst.count("user." + u) for u in ("gina", "hank")}
    msgid = uniq("bdat")
    msg = make_message(msgid, body=b".dot line stays\r\n..two\r\n"
                       b"\xc3\xa9\r\n" + b"b" * 5000 + b"\r\n.\r\nend\r\n")
    cut1, cut2 = 37, len(msg) - 100
    chunks = [msg[:cut1], msg[cut1:cut2], msg[cut2:]]
    with Survives(inst), connect(inst) as c:
        check(c.cmd("MAIL FROM:<b@example.org> BODY=8BITMIME").code == 250,
              "MAIL")
        check(codes([c.cmd("RCPT TO:<gina>"), c.cmd("RCPT TO:<hank>")])
              == [250, 250], "RCPT")
        c.send(b"BDAT %d\r\n" % len(chunks[0]) + chunks[0])
        r = c.reply()
        check(r.code == 250, "BDAT chunk 1: %r" % r)
        # the rest pipelined, the last chunk with LAST
        c.send(b"BDAT %d\r\n" % len(chunks[1]) + chunks[1] +
               b"BDAT %d LAST\r\n" % len(chunks[2]) + chunks[2])
        rs = c.replies(3)
        check(codes(rs) == [250, 250, 250], "BDAT 2 + LAST: %r" % rs)
        # BDAT 0 LAST ends a message too; DATA after BDAT is refused
        msg2 = make_message(uniq("bdat0"))
        c.send(b"MAIL FROM:<b@example.org>\r\nRCPT TO:<gina>\r\n"
               b"BDAT %d\r\n" % len(msg2) + msg2 + b"BDAT 0 LAST\r\n")
        rs = c.replies(4)
        check(codes(rs) == [250, 250, 250, 250], "BDAT + BDAT 0 LAST: %r"
              % rs)
        c.send(b"MAIL FROM:<b@example.org>\r\nRCPT TO:<gina>\r\n"
               b"BDAT 5\r\nabcde")
        check(codes(c.replies(3)) == [250, 250, 250], "BDAT 5")
        r = c.cmd("DATA")
        check(r.code == 503, "DATA after BDAT: %r" % r)
        check(c.cmd("RSET").code == 250, "RSET after BDAT")
    got = inst.messages("user.hank")[-1]
    _, _, rest = split_added_headers(got)
    check(rest == msg, "BDAT message differs: %r..." % rest[:100])
    check(inst.count("user.gina") == before["gina"] + 2, "gina: %d new"
          % (inst.count("user.gina") - before["gina"]))
    check(inst.count("user.hank") == before["hank"] + 1, "hank")


def vm_hwm_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def test_oversize_streams():
    """A 32 MB message over maxmessagesize is read to its end and
    refused without being held in memory (the serving worker's peak RSS
    grows by much less than the message), and the session goes on."""
    inst = main_instance()
    with Survives(inst), connect(inst) as c:
        c.send(b"MAIL FROM:<big@example.org>\r\nRCPT TO:<ivan>\r\nDATA\r\n")
        check(codes(c.replies(3)) == [250, 250, 354], "set-up")
        wait_until(lambda: len(inst.child_pids("lmtpunix", state="busy"))
                   == 1, 30)
        busy = inst.child_pids("lmtpunix", state="busy")
        hwm0 = vm_hwm_kb(busy[0]) if len(busy) == 1 else None
        line = b"B" * 1022 + b"\r\n"
        chunk = line * 1024                        # 1 MiB
        c.send(make_message(uniq("huge"), body=b"start\r\n"))
        for _ in range(32):
            c.send(chunk)
        c.send(b".\r\n")
        r = c.reply()
        check(r.code == 552 and r.enh == "5.3.4", "32 MB message: %r" % r)
        check(c.cmd("NOOP").code == 250, "NOOP after the refusal")
        if hwm0 is not None:
            grew = vm_hwm_kb(busy[0]) - hwm0
            print("#   worker peak RSS grew by %d KiB while reading 32 MiB"
                  % grew)
            check(grew < 8 * 1024, "the worker's peak RSS grew by %d KiB "
                  "while reading a 32 MiB message it refuses" % grew)


def test_mail_parameters():
    inst = main_instance()
    before = inst.count("user.ivan")
    with connect(inst) as c:
        r = c.cmd("MAIL FROM:<p@example.org> BODY=7BIT AUTH=<> SIZE=100")
        check(r.code == 250, "MAIL with BODY=7BIT AUTH=<> SIZE=: %r" % r)
        c.cmd("RSET")
        r = c.cmd("MAIL FROM:<p@example.org> BODY=8BITMIME")
        check(r.code == 250, "BODY=8BITMIME: %r" % r)
        c.cmd("RSET")
        r = c.cmd("MAIL FROM:<p@example.org> FROBNICATE=yes")
        check(500 <= r.code < 600, "unknown MAIL parameter: %r" % r)
        r = c.cmd("MAIL FROM:<p@example.org> SIZE=abc")
        check(500 <= r.code < 600, "SIZE=abc: %r" % r)
        c.cmd("RSET")
        # the null reverse path
        _, rr, _, res = transaction(c, "", ["ivan"],
                                    make_message(uniq("null")))
        check(codes(res) == [250], "MAIL FROM:<>: %r %r" % (rr, res))
    data = inst.messages("user.ivan")
    check(len(data) == before + 1, "not delivered")
    rp, _, _ = split_added_headers(data[-1])
    check(rp == b"Return-Path: <>", "Return-Path for the null sender: %r"
          % rp)


def test_mailbox_removed_before_data():
    inst = main_instance()
    inst.create("user.gone")
    with connect(inst) as c:
        check(c.cmd("MAIL FROM:<r@example.org>").code == 250, "MAIL")
        check(c.cmd("RCPT TO:<gone>").code == 250, "RCPT gone")
        check(c.cmd("RCPT TO:<hank>").code == 250, "RCPT hank")
        inst.mbtool("delete", "user.gone")
        check(c.cmd("DATA").code == 354, "DATA")
        c.send(dot_stuff(make_message(uniq("gone"))))
        rs = c.replies(2)
        check(rs[0].code == 550 and rs[0].enh == "5.1.1",
              "mailbox removed after RCPT: %r" % rs[0])
        check(rs[1].code == 250, "the other recipient: %r" % rs[1])


def test_store_failure_is_4xx():
    """A delivery the store cannot make (the mailbox directory is not
    writable for the server) is answered 4xx, never 250, and nothing is
    visible; once fixed, the same message is delivered."""
    if os.geteuid() == 0 and RUN_AS is None:
        raise Skip("the servers run as root: permissions do not bind")
    inst = main_instance()
    d = inst.mailbox_dir("user.hank")
    before = inst.count("user.hank")
    msg = make_message(uniq("eacces"))
    mode = os.stat(d).st_mode & 0o7777
    os.chmod(d, 0o500)
    try:
        with Survives(inst), connect(inst) as c:
            _, rr, _, res = transaction(c, "t@example.org", ["hank"], msg)
            got = (rr[0] if rr and rr[0].code != 250 else
                   (res[0] if res else None))
            check(got is not None and got.code == 451
                  and got.enh == "4.3.0", "unwritable mailbox: RCPT %r "
                  "DATA %r (451 4.3.0 expected)" % (rr, res))
    finally:
        os.chmod(d, mode)
    check(inst.count("user.hank") == before, "a file appeared anyway")
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "t@example.org", ["hank"], msg)
        check(codes(res) == [250], "after the repair: %r %r" % (rr, res))
    check(inst.count("user.hank") == before + 1, "not delivered after the "
          "repair (a duplicate record left by the failed attempt?)")


# ---- bad input ----------------------------------------------------------------

def test_long_command_line():
    inst = main_instance()
    with Survives(inst), connect(inst) as c:
        c.send(b"NOOP " + b"x" * 100000 + b"\r\nNOOP\r\n")
        rs = c.replies(2)
        check(rs[0].code == 500 and rs[0].enh == "5.5.2",
              "100,000-byte line: %r" % rs[0])
        check(rs[1].code == 250, "NOOP after the long line: %r "
              "(one reply per line expected)" % rs[1])
        # inside a transaction the session stays in sync
        check(c.cmd("MAIL FROM:<l@example.org>").code == 250, "MAIL")
        r = c.cmd(b"RCPT TO:<" + b"a" * 100000 + b"@test.example>")
        check(r.code == 500, "long RCPT: %r" % r)
        r = c.cmd("RCPT TO:<erin>")
        check(r.code == 250, "RCPT after the long one: %r" % r)
        r = c.cmd("DATA")
        check(r.code == 354, "DATA: %r" % r)
        c.send(dot_stuff(make_message(uniq("afterlong"))))
        r = c.reply()
        check(r.code == 250, "delivery after the long RCPT: %r" % r)
        check(c.cmd("NOOP").code == 250, "NOOP")
    # a long text line inside DATA: refused at the end, in sync after
    with Survives(inst), connect(inst) as c:
        before = inst.count("user.erin")
        body = b"ok\r\n" + b"L" * 100000 + b"\r\nok\r\n"
        _, rr, _, res = transaction(c, "l@example.org", ["erin"],
                                    make_message(uniq("longdata"),
                                                 body=body))
        check(codes(res) == [554] and res[0].enh == "5.6.0",
              "100,000-byte line in DATA: %r" % res)
        check(c.cmd("NOOP").code == 250, "NOOP after the long DATA line")
        check(inst.count("user.erin") == before, "stored anyway")


def _data_refused(inst, body, what, rcpts=("erin", "hank")):
    before = {r: inst.count("user." + r) for r in rcpts}
    with Survives(inst), connect(inst) as c:
        c.send(b"MAIL FROM:<bad@example.org>\r\n" +
               b"".join(b"RCPT TO:<%s>\r\n" % r.encode() for r in rcpts) +
               b"DATA\r\n")
        rs = c.replies(2 + len(rcpts))
        check(codes(rs) == [250] * (1 + len(rcpts)) + [354], "%s: %r"
              % (what, rs))
        c.send(body + b"\r\n.\r\n")
        rs = c.replies(len(rcpts))
        check(all(r.code == 554 and r.enh == "5.6.0" for r in rs),
              "%s: %r (554 5.6.0 for each recipient expected)" % (what, rs))
        r = c.cmd("NOOP")
        check(r.code == 250, "%s: NOOP after the refusal: %r" % (what, r))
    after = {r: inst.count("user." + r) for r in rcpts}
    # Survives delivered one to erin afterwards
    before["erin"] += 1
    check(after == before, "%s: stored anyway (%r -> %r)"
          % (what, before, after))
    return rs


def test_bare_lf_refused():
    rs = _data_refused(main_instance(),
                       b"Subject: lf\r\n\r\nline one\nline two\r\nthree",
                       "bare LF")
    check("bare" in rs[0].text.lower(), "reply does not name the bare "
          "newline: %r" % rs[0])
    _data_refused(main_instance(), b"Subject: cr\r\n\r\nline\rone\r\n",
                  "bare CR")


def test_bare_lf_command():
    """A command line ending in a bare LF is not run (500 5.5.2): the
    transaction is untouched and the session goes on."""
    inst = main_instance()
    before = inst.count("user.erin")
    with connect(inst) as c:
        c.send(b"MAIL FROM:<p@example.org>\n")
        r = c.reply()
        check(r.code == 500 and r.enh == "5.5.2",
              "MAIL with a bare LF: %r" % r)
        r = c.cmd("RCPT TO:<erin>")
        check(r.code == 503, "the bare-LF MAIL was run: %r" % r)
        check(c.cmd("MAIL FROM:<p@example.org>").code == 250, "MAIL")
        c.send(b"RCPT TO:<erin>\nRCPT TO:<hank>\r\n")
        r1, r2 = c.replies(2)
        check(r1.code == 500 and r2.code == 250,
              "RCPT, bare LF then CRLF: %r %r" % (r1, r2))
        r = c.cmd("DATA")
        check(r.code == 354, "DATA: %r" % r)
        c.send(dot_stuff(make_message(uniq("barecmd"))))
        rs = c.replies(1)
        check(codes(rs) == [250], "one recipient only: %r" % rs)
    check(inst.count("user.erin") == before,
          "erin got a message from a bare-LF RCPT")


# ---- SMTP smuggling: only <CRLF>.<CRLF> ends DATA ----------------------------

# End-of-data look-alikes (RFC 5321 4.1.1.4 allows only <CRLF>.<CRLF>) and
# what lmtp_bare_newlines: fix stores for each: the bare newlines become
# CRLF and the lone dot is doubled, so the stored message has no line that
# is only "."
SMUGGLE_SEQS = [
    (b"\n.\n", b"\r\n..\r\n"),
    (b"\n.\r\n", b"\r\n..\r\n"),
    (b"\r\n.\n", b"\r\n..\r\n"),
    (b"\r.\r", b"\r\n..\r\n"),
]
SMUGGLED = (b"MAIL FROM:<evil@example.org>\r\nRCPT TO:<frank>\r\n"
            b"DATA\r\nFrom: <ceo@example.org>\r\nSubject: smuggled\r\n"
            b"\r\nsmuggled body\r\n")


def replies_to_eof(c, what):
    """Every reply until the server closes the connection."""
    out = []
    c.settimeout(30)
    while True:
        try:
            out.append(c.reply())
        except ConnectionClosed:
            return out
        except socket.timeout:
            raise Fail("%s: no end of the connection 30 s after QUIT "
                       "(replies so far %r)" % (what, out))


def smuggle_session(inst, payload, what):
    """MAIL, RCPT erin, DATA, then payload (which carries its own end)
    and QUIT in one write: every reply after the 354."""
    with connect(inst) as c:
        c.send(b"MAIL FROM:<s@example.org>\r\nRCPT TO:<erin>\r\nDATA\r\n")
        check(codes(c.replies(3)) == [250, 250, 354], "%s: set-up" % what)
        c.send(payload + b"QUIT\r\n")
        return replies_to_eof(c, what)


def smuggle_instance(mode):
    inst = Instance("smuggle-" + mode, conf={"lmtp_bare_newlines": mode,
                                             "lmtp_timeout": "60"})
    try:
        inst.create("user.erin")
        inst.create("user.frank")
        inst.write_cyrus_conf(prefork=1, maxchild=4)
        inst.start()
    except BaseException:
        inst.stop()
        inst.cleanup()
        raise
    return inst


def check_no_lone_dot(data, what):
    lines = data.split(b"\r\n")
    check(b"." not in lines, "%s: a stored line is a lone \".\"" % what)
    check(b"\r" not in b"".join(lines) and b"\n" not in b"".join(lines),
          "%s: a bare CR or LF was stored" % what)


def _smuggling(mode):
    with smuggle_instance(mode) as inst:
        want_code = 250 if mode == "fix" else 554
        stored = 0
        cases = [(seq, fixed, b"") for seq, fixed in SMUGGLE_SEQS]
        # a line over 64 KiB ending in a bare LF, then ".\r\n": refused
        # for its length in both modes, and still no end of the message
        cases.append((b"\r\n" + b"x" * 70000 + b"\n.\r\n", None, b""))
        for seq, fixed, _ in cases:
            what = "%s %r" % (mode, seq[-8:])
            head = make_message(uniq("smug"), subject="first")
            first = head + b"first body" + seq
            payload = first + SMUGGLED + b".\r\n"
            rs = smuggle_session(inst, payload, what)
            code = want_code if fixed is not None else 554
            check(codes(rs) == [code, 221], "%s: replies after the 354 %r "
                  "(%d for the one message, then 221 expected: anything "
                  "more is a smuggled command answered)" % (what, rs, code))
            if code == 554:
                check(rs[0].enh == "5.6.0", "%s: %r" % (what, rs[0]))
            if code == 250:
                stored += 1
            check(inst.count("user.frank") == 0, "%s: the smuggled message "
                  "was stored" % what)
            check(inst.count("user.erin") == stored, "%s: user.erin has %d "
                  "messages, %d expected" % (what, inst.count("user.erin"),
                                             stored))
            if code == 250:
                got = inst.messages("user.erin")[-1]
                _, _, rest = split_added_headers(got)
                want = head + b"first body" + fixed + SMUGGLED
                check(rest == want, "%s: stored %r, expected %r"
                      % (what, rest[-200:], want[-200:]))
                check_no_lone_dot(got, what)
        # dot-stuffing counts only after a real CRLF
        what = "%s dot-stuffing" % mode
        head = make_message(uniq("stuff"))
        rs = smuggle_session(inst, head + b"a\n..b\r\n..c\r\n.\r\n", what)
        check(codes(rs) == [want_code, 221], "%s: %r" % (what, rs))
        if mode == "fix":
            stored += 1
            _, _, rest = split_added_headers(inst.messages("user.erin")[-1])
            check(rest == head + b"a\r\n..b\r\n.c\r\n", "%s: stored %r"
                  % (what, rest[-40:]))
        # BDAT is length-delimited: the same bytes in a chunk are data
        for seq, _ in SMUGGLE_SEQS + [(b"\r\n.\r\n", None)]:
            what = "%s BDAT %r" % (mode, seq)
            head = make_message(uniq("bdatsmug"))
            chunk = head + b"first body" + seq + SMUGGLED
            with connect(inst) as c:
                c.send(b"MAIL FROM:<s@example.org>\r\nRCPT TO:<erin>\r\n"
                       b"BDAT %d LAST\r\n" % len(chunk) + chunk +
                       b"QUIT\r\n")
                rs = replies_to_eof(c, what)
            bare = seq != b"\r\n.\r\n"
            code = 554 if bare and mode == "reject" else 250
            check(codes(rs) == [250, 250, code, 221], "%s: %r" % (what, rs))
            if code == 250:
                stored += 1
                _, _, rest = split_added_headers(
                    inst.messages("user.erin")[-1])
                want = head + b"first body\r\n.\r\n" + SMUGGLED
                check(rest == want, "%s: stored %r, expected %r"
                      % (what, rest[-120:], want[-120:]))
            check(inst.count("user.erin") == stored and
                  inst.count("user.frank") == 0, "%s: counts %d %d" %
                  (what, inst.count("user.erin"), inst.count("user.frank")))
        trouble = inst.worker_trouble(inst.log())
        check(not trouble, "worker trouble: %s" % " | ".join(trouble[:3]))


def test_smuggling_reject():
    """lmtp_bare_newlines: reject: <LF>.<LF>, <LF>.<CRLF>, <CRLF>.<LF>,
    <CR>.<CR> inside DATA end nothing: the message is refused (554 5.6.0)
    at the real <CRLF>.<CRLF>, the commands after the look-alike are not
    answered, nothing is stored; BDAT chunks are data."""
    _smuggling("reject")


def test_smuggling_fix():
    """lmtp_bare_newlines: fix: the same look-alikes are data; the one
    message is stored with CRLF lines and the lone dot doubled; the
    commands after it are message text, never executed."""
    _smuggling("fix")


def test_nul_refused():
    rs = _data_refused(main_instance(),
                       b"Subject: nul\r\n\r\nbefore\x00after\r\n", "NUL")
    check("nul" in rs[0].text.lower(), "reply does not name NUL: %r" % rs[0])


def test_disconnect_inside_data():
    inst = main_instance()
    with Survives(inst):
        before = inst.count("user.erin")
        for cut in ("headers", "body"):
            c = connect(inst)
            c.send(b"MAIL FROM:<dc@example.org>\r\nRCPT TO:<erin>\r\n"
                   b"DATA\r\n")
            check(codes(c.replies(3)) == [250, 250, 354], "set-up")
            msg = make_message(uniq("dc"), body=b"z" * 20000 + b"\r\n")
            c.send(msg[:40] if cut == "headers" else msg)
            time.sleep(0.2)
            c.close()
        # the workers saw the disconnects (none is busy any more), however
        # long that took here; only then is "not stored" a finding
        check(wait_until(lambda: not inst.child_pids("lmtpunix",
                                                      state="busy"), 60),
              "a worker still busy 60 s after its client disconnected")
        check(inst.count("user.erin") == before, "a message cut inside "
              "DATA was stored")
        left = wait_until(lambda: not inst.stage_files(), 60) or \
            inst.stage_files()
        check(left is True, "staging files left: %s" % left)


def test_unknown_and_out_of_order():
    inst = main_instance()
    with Survives(inst), Conn(inst.unix_socket) as c:
        check(c.reply().code == 220, "greeting")
        c.expect("MAIL FROM:<o@example.org>", 503, "5.5.1",
                 "MAIL before LHLO: %r")
        c.expect("FROBNICATE now", 500, "5.5.2", "unknown command: %r")
        check(c.cmd("LHLO o.example").code == 250, "LHLO")
        c.expect("RCPT TO:<erin>", 503, "5.5.1", "RCPT before MAIL: %r")
        c.expect("DATA", 503, None, "DATA before MAIL: %r")
        c.expect("MAIL TO:<x@example.org>", 501, "5.5.4", "MAIL syntax: %r")
        c.expect("MAIL FROM:<o@example.org>", 250, None, "MAIL: %r")
        c.expect("MAIL FROM:<o@example.org>", 503, None,
                 "second MAIL in a transaction: %r")
        c.expect("RCPT TO:", 501, None, "RCPT without address: %r")
        c.expect("RCPT TO:<nobody>", 550, None, "unknown: %r")
        c.expect("DATA", 503, "5.5.1",
                 "DATA without an accepted recipient: %r")
        # the chunk of a refused BDAT is still read (RFC 3030 4.2)
        c.send(b"BDAT 3 LAST\r\nabcNOOP\r\n")
        rs = c.replies(2)
        check(rs[0].code == 503, "BDAT without a recipient: %r" % rs[0])
        check(rs[1].code == 250, "the refused BDAT's chunk was not "
              "consumed: NOOP got %r" % rs[1])
        check(c.cmd("RSET").code == 250, "RSET")
        _, rr, _, res = transaction(c, "o@example.org", ["erin"],
                                    make_message(uniq("ooo")))
        check(codes(res) == [250], "a transaction after the errors: %r %r"
              % (rr, res))


def test_too_many_recipients():
    """10,000 RCPTs in one transaction, written by one thread while
    another reads the replies (neither side can block the other)."""
    inst = main_instance()
    n = 10000
    rcpts = ["alice", "bob", "carol", "gina", "hank"]
    with Survives(inst), connect(inst) as c:
        c.settimeout(60)
        out = [b"MAIL FROM:<many@example.org>\r\n"]
        out += [b"RCPT TO:<%s>\r\n" % rcpts[i % len(rcpts)].encode()
                for i in range(n)]
        out.append(b"RSET\r\n")
        errors = []

        def writer():
            try:
                c.send(b"".join(out))
            except OSError as e:
                errors.append(e)
        t0 = time.monotonic()
        th = threading.Thread(target=writer)
        th.start()
        try:
            rs = c.replies(n + 2)
        finally:
            th.join(60)
        took = time.monotonic() - t0
        check(not errors, "writer: %r" % errors)
        check(rs[0].code == 250, "MAIL: %r" % rs[0])
        rc = rs[1:n + 1]
        ok = [r for r in rc[:MAXRCPT] if r.code != 250]
        check(not ok, "among the first %d RCPTs %d refused, e.g. %r"
              % (MAXRCPT, len(ok), ok[:2]))
        bad = [r for r in rc[MAXRCPT:] if not (r.code == 452
                                               and r.enh == "4.5.3")]
        check(not bad, "%d of the RCPTs past %d not 452 4.5.3, e.g. %r"
              % (len(bad), MAXRCPT, bad[:2]))
        check(rs[-1].code == 250, "RSET: %r" % rs[-1])
        print("#   10,000 RCPTs answered in %.2f s" % took)


def test_timeout_421():
    inst = main_instance()
    # t0 before the connection: the server's timer starts later, so the
    # time measured is never shorter than the one the server waited
    t0 = time.monotonic()
    with connect(inst) as c:
        c.settimeout(TIMEOUT + 90)
        try:
            r = c.reply()
        except (ConnectionClosed, socket.timeout) as e:
            raise Fail("no 421 after %.1f s of silence: %r"
                       % (time.monotonic() - t0, e))
        took = time.monotonic() - t0
        check(r.code == 421 and r.enh == "4.4.2", "timeout reply %r" % r)
        # not before lmtp_timeout; after it, within a margin a loaded
        # machine cannot exceed but far below the default of 300 s
        check(TIMEOUT - 0.5 <= took <= TIMEOUT + 60, "421 after %.1f s "
              "with lmtp_timeout %d" % (took, TIMEOUT))
        check(c.at_eof(), "still open after 421")


def test_run_by_hand():
    """lmtpd with stdin/stdout (fd 3 not a socket) serves one session."""
    inst = main_instance()
    before = inst.count("user.ivan")
    msg = make_message(uniq("hand"))
    script = (b"LHLO hand.example\r\nMAIL FROM:<h@example.org>\r\n"
              b"RCPT TO:<ivan>\r\nDATA\r\n" + dot_stuff(msg) + b"QUIT\r\n")
    r = subprocess.run([LMTPD, "-C", inst.imapd_conf], input=script,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       preexec_fn=drop_privileges, timeout=60)
    out = r.stdout.decode(errors="replace")
    codes_seen = re.findall(r"^(\d{3}) ", out, re.M)
    check(codes_seen == ["220", "250", "250", "250", "354", "250", "221"],
          "replies %r (stderr %r)" % (codes_seen, r.stderr[-300:]))
    check(r.returncode == 0, "exit status %d" % r.returncode)
    check(inst.count("user.ivan") == before + 1, "not delivered")


# ---- TCP, swaks, STARTTLS, AUTH ----------------------------------------------

def swaks(*args, timeout=60):
    r = subprocess.run(["swaks", "--timeout", "30", "--from",
                        "swaks@example.org", "--helo", "swaks.example"]
                       + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace")


def test_smtputf8():
    """SMTPUTF8 (RFC 6531): offered at LHLO; a UTF-8 sender is refused
    with 553 5.6.7 unless MAIL carries SMTPUTF8; with it the message is
    stored byte for byte and the Received field says UTF8LMTP; malformed
    UTF-8 is a 501; an unknown UTF-8 recipient is a plain 550 5.1.1.
    Python's smtplib sends SMTPUTF8 the way MTAs do."""
    inst = main_instance()
    sender = "j\u00f6rg@\u4f8b\u5b50.example"
    before = inst.count("user.ivan")
    with connect(inst, lhlo=None) as c:
        r = c.cmd("LHLO client.example")
        ext = [l.split()[0].upper() for l in r.lines[1:] if l.split()]
        check("SMTPUTF8" in ext, "LHLO does not offer SMTPUTF8: %r" % r)
        r = c.cmd(("MAIL FROM:<%s>" % sender).encode())
        check(r.code == 553 and r.enh == "5.6.7",
              "UTF-8 sender without SMTPUTF8: %r" % r)
        r = c.cmd(b"MAIL FROM:<p@example.org> SMTPUTF8=yes")
        check(r.code == 501, "SMTPUTF8 with a value: %r" % r)
        r = c.cmd(b"MAIL FROM:<p@example.org>")
        check(r.code == 250, "MAIL: %r" % r)
        r = c.cmd("RCPT TO:<\u00fcser@example.org>".encode())
        check(r.code == 553 and r.enh == "5.6.7",
              "UTF-8 recipient without SMTPUTF8: %r" % r)
        c.cmd("RSET")
        r = c.cmd(b"MAIL FROM:<j\xf6rg@example.org> SMTPUTF8")
        check(r.code == 501, "Latin-1 sender with SMTPUTF8: %r" % r)
        r = c.cmd(b"MAIL FROM:<a\xc3@example.org> SMTPUTF8")
        check(r.code == 501, "truncated UTF-8 with SMTPUTF8: %r" % r)
        r = c.cmd(("MAIL FROM:<%s> SMTPUTF8 BODY=8BITMIME" % sender).encode())
        check(r.code == 250, "UTF-8 sender with SMTPUTF8: %r" % r)
        r = c.cmd("RCPT TO:<\u00fcnknown@example.org>".encode())
        check(r.code == 550 and r.enh == "5.1.1",
              "unknown UTF-8 recipient: %r" % r)
        r = c.cmd(b"RCPT TO:<ivan@example.org>")
        check(r.code == 250, "RCPT: %r" % r)
        r = c.cmd(b"DATA")
        check(r.code == 354, "DATA: %r" % r)
        msgid = uniq("utf8")
        body = ("Subject: Gr\u00fc\u00dfe \u4f60\u597d\r\n"
                "From: <%s>\r\nMessage-ID: <%s>\r\n\r\n"
                "\u00e9t\u00e9\r\n" % (sender, msgid)).encode()
        c.send(dot_stuff(body))
        r = c.reply()
        check(r.code == 250, "UTF-8 message: %r" % r)
        check(c.cmd("NOOP").code == 250, "session lost after SMTPUTF8")
    data = find_by_header(inst, "user.ivan", "Message-ID", "<%s>" % msgid)
    check(data is not None, "the SMTPUTF8 message was not stored")
    rp, recv, rest = split_added_headers(data)
    check(rp == ("Return-Path: <%s>" % sender).encode(),
          "Return-Path: %r" % rp)
    check(re.search(rb"\swith\s+UTF8LMTP\s", b" ".join(recv)),
          "Received without UTF8LMTP: %r" % recv)
    check(rest.endswith(body) or body in data, "bytes changed: %r" % data)
    # smtplib: mail_options SMTPUTF8 as an MTA sends it
    lm = smtplib.LMTP(inst.unix_socket)
    try:
        msgid2 = uniq("utf8lib")
        body2 = ("From: <%s>\r\nMessage-ID: <%s>\r\n\r\n\u00e9\r\n"
                 % (sender, msgid2)).encode()
        refused = lm.sendmail(sender, ["ivan@example.org"], body2,
                              mail_options=["SMTPUTF8", "BODY=8BITMIME"])
        check(not refused, "smtplib SMTPUTF8 refused: %r" % refused)
    finally:
        lm.quit()
    check(find_by_header(inst, "user.ivan", "Message-ID", "<%s>" % msgid2)
          is not None, "smtplib's SMTPUTF8 message not stored")
    check(inst.count("user.ivan") == before + 2, "message count")


def find_by_header(inst, box, name, value):
    for data in inst.messages(box):
        if header_value(data, name) == value:
            return data
    return None


def test_swaks_unix_socket():
    inst = main_instance()
    tag = uniq("swu")
    rc, out = swaks("--socket", inst.unix_socket, "--protocol", "LMTP",
                    "--to", "bob@test.example,nobody@test.example",
                    "--header", "X-Test-Id: %s" % tag)
    check(re.search(r"(?m)^<\S*\s+550 5\.1\.1", out), "no 550 5.1.1 for the "
          "unknown recipient:\n%s" % out[-1500:])
    check(find_by_header(inst, "user.bob", "X-Test-Id", tag),
          "swaks over the UNIX socket: not delivered (rc %d):\n%s"
          % (rc, out[-1500:]))


def test_tcp_requires_auth():
    inst = main_instance()
    with connect(inst, inst.tcp_addr()) as c:
        r = c.cmd("MAIL FROM:<t@example.org>")
        check(r.code == 530 and r.enh == "5.7.0", "MAIL without AUTH over "
              "TCP: %r" % r)
        r = c.cmd("LHLO again.example")
        ext = " ".join(r.lines[1:]).upper()
        check("STARTTLS" in ext, "STARTTLS not advertised: %r" % r)
        check(not re.search(r"AUTH\b.*\bPLAIN", ext),
              "AUTH PLAIN offered without TLS (allowplaintext: no): %r" % r)
    tag = uniq("swt")
    rc, out = swaks("--server", "127.0.0.1", "--port", str(inst.tcp_port),
                    "--protocol", "LMTP", "--to", "carol@test.example",
                    "--header", "X-Test-Id: %s" % tag)
    check(rc != 0 and re.search(r"(?m)^<\S*\s+530", out),
          "swaks over TCP without AUTH: rc %d, no 530:\n%s"
          % (rc, out[-1500:]))
    check(not find_by_header(inst, "user.carol", "X-Test-Id", tag),
          "delivered without AUTH")


def test_swaks_tcp_preauth():
    inst = main_instance()
    tag = uniq("swa")
    rc, out = swaks("--server", "127.0.0.1", "--port",
                    str(inst.tcp_preauth_port), "--protocol", "LMTP",
                    "--to", "carol@test.example",
                    "--header", "X-Test-Id: %s" % tag)
    check(rc == 0, "swaks over TCP to lmtpd -a: rc %d:\n%s"
          % (rc, out[-1500:]))
    check(find_by_header(inst, "user.carol", "X-Test-Id", tag),
          "swaks over TCP (-a): not delivered")


def test_starttls_auth_plain():
    r = subprocess.run(["swaks", "--support"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=30)
    tls = [l for l in r.stdout.decode(errors="replace").splitlines()
           if " TLS " in l]
    check(tls and "TLS supported" in tls[0], "swaks cannot do TLS (Debian "
          "package libnet-ssleay-perl missing?): %s" % tls)
    inst = main_instance()
    addr = ("127.0.0.1", inst.tcp_port)
    # STARTTLS by hand: the extensions change
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with connect(inst, addr) as c:
        r = c.cmd("STARTTLS")
        check(r.code == 220, "STARTTLS: %r" % r)
        c.starttls(ctx)
        r = c.cmd("LHLO tls.example")
        ext = " ".join(r.lines[1:]).upper()
        check(r.code == 250 and "STARTTLS" not in ext,
              "STARTTLS advertised again under TLS: %r" % r)
        check(re.search(r"AUTH\b.*\bPLAIN", ext), "AUTH PLAIN not offered "
              "under TLS: %r" % r)
        r = c.cmd("MAIL FROM:<t@example.org>")
        check(r.code == 530, "MAIL under TLS without AUTH: %r" % r)
    # AUTH by hand: bad base64, wrong password, right one, AUTH again
    import base64
    with connect(inst, addr) as c:
        check(c.cmd("STARTTLS").code == 220, "STARTTLS")
        c.starttls(ctx)
        check(c.cmd("LHLO tls.example").code == 250, "LHLO under TLS")
        r = c.cmd("AUTH PLAIN !!notbase64!!")
        check(r.code == 501, "AUTH PLAIN with bad base64: %r" % r)
        bad = base64.b64encode(b"\0" + SASL_USER.encode() + b"\0nope")
        r = c.cmd(b"AUTH PLAIN " + bad)
        check(r.code == 535 and r.enh == "5.7.8", "wrong password: %r" % r)
        r = c.cmd("AUTH PLAIN")
        check(r.code == 334, "AUTH PLAIN without initial response: %r" % r)
        r = c.cmd("*")
        check(r.code == 501, "AUTH cancelled with *: %r" % r)
        good = base64.b64encode(b"\0" + SASL_USER.encode() + b"\0"
                                + SASL_PASS.encode())
        r = c.cmd(b"AUTH PLAIN " + good)
        check(r.code == 235, "right password: %r" % r)
        r = c.cmd(b"AUTH PLAIN " + good)
        check(r.code == 503, "second AUTH: %r" % r)
        _, rr, _, res = transaction(c, "a@example.org", ["dave"],
                                    make_message(uniq("rawauth")))
        check(codes(res) == [250], "delivery after AUTH: %r %r" % (rr, res))
    # plaintext pipelined behind STARTTLS must not be executed under TLS
    with connect(inst, addr) as c:
        c.send(b"STARTTLS\r\nLHLO injected.example\r\n")
        r = c.reply()
        check(r.code == 220, "STARTTLS: %r" % r)
        try:
            c.starttls(ctx)
        except (ssl.SSLError, OSError):
            pass            # the server fed the bytes to TLS: refused
        else:
            c.settimeout(30)
            r = c.cmd("NOOP")
            check(r.code == 250 and len(r.lines) == 1,
                  "the command sent in plaintext behind STARTTLS was "
                  "answered under TLS: %r" % r)

    def swaks_tls_auth(mech, tag):
        """swaks: STARTTLS, AUTH mech as SASL_USER, a message to dave
        with X-Test-Id: tag; (exit status, output)."""
        return swaks("--server", "127.0.0.1", "--port",
                     str(inst.tcp_port), "--protocol", "LMTP", "-tls",
                     "-a", mech, "-au", SASL_USER, "-ap", SASL_PASS,
                     "--to", "dave@test.example",
                     "--header", "X-Test-Id: %s" % tag)

    # swaks: STARTTLS + AUTH LOGIN
    tag = uniq("swlogin")
    rc, out = swaks_tls_auth("LOGIN", tag)
    check(rc == 0 and find_by_header(inst, "user.dave", "X-Test-Id", tag),
          "swaks STARTTLS + AUTH LOGIN: rc %d:\n%s" % (rc, out[-1500:]))
    # swaks: STARTTLS + AUTH PLAIN, right password
    tag = uniq("swtls")
    rc, out = swaks_tls_auth("PLAIN", tag)
    check(rc == 0, "swaks STARTTLS + AUTH PLAIN: rc %d:\n%s"
          % (rc, out[-2000:]))
    check(re.search(r"(?m)^<\S*\s+235", out), "no 235 for AUTH:\n%s" % out[-1500:])
    data = find_by_header(inst, "user.dave", "X-Test-Id", tag)
    check(data, "swaks STARTTLS + AUTH: not delivered")
    _, recv, _ = split_added_headers(data)
    text = b" ".join(x.strip() for x in recv).decode(errors="replace")
    check(re.search(r"\bwith LMTPSA\b", text), "Received does not say "
          "LMTPSA (TLS + AUTH): %r" % text)
    # wrong password: 535, nothing delivered
    tag = uniq("swbad")
    rc, out = swaks("--server", "127.0.0.1", "--port", str(inst.tcp_port),
                    "--protocol", "LMTP", "-tls", "-a", "PLAIN",
                    "-au", SASL_USER, "-ap", "wrong-" + SASL_PASS,
                    "--to", "dave@test.example",
                    "--header", "X-Test-Id: %s" % tag)
    check(rc != 0 and re.search(r"(?m)^<\S*\s+535", out),
          "wrong password: rc %d, no 535:\n%s" % (rc, out[-1500:]))
    check(not find_by_header(inst, "user.dave", "X-Test-Id", tag),
          "delivered with a wrong password")
    # unknown user: 535 too
    rc, out = swaks("--server", "127.0.0.1", "--port", str(inst.tcp_port),
                    "--protocol", "LMTP", "-tls", "-a", "PLAIN",
                    "-au", "mallory", "-ap", SASL_PASS,
                    "--to", "dave@test.example", "--quit-after", "AUTH")
    check(re.search(r"(?m)^<\S*\s+535", out), "unknown SASL user: no 535:\n%s"
          % out[-1500:])


def test_sigterm_idle_clients():
    """SIGTERM to the master while clients sit idle (one between
    transactions, one after MAIL and RCPT): each gets 421 4.3.2 at once,
    nothing half-done is stored, and the master exits 0 long before its
    drain timeout (60 s here, so that a loaded machine is far from it)."""
    with Instance("term") as inst:
        inst.create("user.term")
        inst.write_cyrus_conf(prefork=2, maxchild=4)
        inst.start(ready=2, drain=60)
        idle = connect(inst)
        midtxn = connect(inst)
        check(midtxn.cmd("MAIL FROM:<t@example.org>").code == 250,
              "MAIL refused")
        check(midtxn.cmd("RCPT TO:<term@example.org>").code == 250,
              "RCPT refused")
        t0 = time.monotonic()
        inst.proc.send_signal(signal.SIGTERM)
        for name, c in (("idle", idle), ("mid-transaction", midtxn)):
            c.settimeout(30)
            r = c.reply()
            check(r.code == 421 and r.enh == "4.3.2",
                  "%s client got %r instead of 421 4.3.2" % (name, r))
            check(c.at_eof(), "%s client: connection not closed after 421"
                  % name)
            c.close()
        rc = inst.proc.wait(90)
        took = time.monotonic() - t0
        print("#   SIGTERM with 2 idle clients: master exited %d after "
              "%.2f s" % (rc, took))
        check(rc == 0, "master exit status %d" % rc)
        check(took < 30, "master took %.1f s to stop (drain timeout 60 s)"
              % took)
        check(inst.count("user.term") == 0, "a message of the "
              "interrupted transaction was stored")
        check("crashed" not in inst.log(), "a worker crashed or was "
              "killed: %s" % inst.log()[-800:])


def test_damaged_mailbox_list():
    """mailboxes.db overwritten with garbage before the start: the worker
    still comes up, RCPT answers 451 4.3.0 (never 250, never a dropped
    connection) and the log says why; once the file is good again the
    same worker delivers."""
    with Instance("dmgdb") as inst:
        inst.create("user.dmg")
        db = os.path.join(inst.confdir, "mailboxes.db")
        with open(db, "rb") as f:
            good = f.read()
        with open(db, "r+b") as f:
            f.write(b"\x5a" * len(good))
        inst.write_cyrus_conf(prefork=1, maxchild=1)
        inst.start()
        msg = make_message(uniq("dmg"))
        with connect(inst) as c:
            mr, rr, dr, res = transaction(c, "d@example.org", ["dmg"], msg)
            check(mr.code == 250 and len(rr) == 1 and rr[0].code == 451
                  and rr[0].enh == "4.3.0",
                  "damaged mailbox list: MAIL %r RCPT %r" % (mr, rr))
            check(c.cmd("RSET").code == 250, "session gone after 451")
            with open(db, "wb") as f:
                f.write(good)
            _, rr, _, res = transaction(c, "d@example.org", ["dmg"], msg)
            check(codes(rr) == [250] and codes(res) == [250],
                  "after the repair: RCPT %r DATA %r" % (rr, res))
        check(inst.count("user.dmg") == 1, "%d messages stored, want 1"
              % inst.count("user.dmg"))
        check("cannot open the mailbox list" in inst.log(),
              "no log line about the damaged mailbox list")
        check("crashed" not in inst.log() and "backing off" not in
              inst.log(), "workers died: %s" % inst.log()[-800:])


def test_full_disk():
    """The spool's file system fills up (a 1 MiB tmpfs mounted on the
    partition): the delivery that does not fit gets 452 4.3.1, never 250;
    every message acknowledged before is complete; the worker goes on
    serving; the mailbox checks; with space again delivery works."""
    if os.geteuid() != 0:
        raise Skip("needs root to mount a small tmpfs")
    with Instance("full") as inst:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755",
                            "tmpfs", inst.partition],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            raise Skip("cannot mount a tmpfs: %s"
                       % r.stdout.decode(errors="replace").strip())
        try:
            chown_run_as(inst.partition)
            inst.create("user.full")
            inst.write_cyrus_conf(prefork=1, maxchild=2)
            inst.start()
            acked, refused = {}, None
            with connect(inst) as c:
                for i in range(60):
                    mid = uniq("full")
                    body = (b"%04d " % i + b"f" * 73 + b"\r\n") * 640
                    msg = make_message(mid, body=body)
                    mr, rr, dr, res = transaction(c, "f@example.org",
                                                  ["full"], msg)
                    check(mr.code == 250 and codes(rr) == [250]
                          and dr is not None and dr.code == 354,
                          "MAIL/RCPT/DATA %d: %r %r %r" % (i, mr, rr, dr))
                    if res[0].code == 250:
                        acked[mid] = body
                        continue
                    refused = res[0]
                    break
                check(refused is not None, "60 x 50 KB all accepted on a "
                      "1 MiB file system")
                print("#   full disk: %d messages accepted, then %r"
                      % (len(acked), refused))
                check(refused.code == 452 and refused.enh == "4.3.1",
                      "full disk answered %r, not 452 4.3.1" % refused)
                check(c.cmd("NOOP").code == 250, "session gone after the "
                      "full-disk reply")
            stored = inst.messages("user.full")
            check(len(stored) == len(acked), "%d acknowledged, %d stored"
                  % (len(acked), len(stored)))
            for m in stored:
                mid = header_value(m, "Message-ID")
                key = mid.strip("<>") if mid else None
                check(key in acked and m.endswith(acked[key]),
                      "stored message %r incomplete or not acknowledged"
                      % key)
            rc, out, err = inst.mbtool("check", "user.full",
                                       check_rc=False)
            check(rc == 0, "mbtool check after the full disk: %s%s"
                  % (out, err))
            subprocess.run(["mount", "-o", "remount,size=8m",
                            inst.partition], check=True)
            with connect(inst) as c:
                _, rr, _, res = transaction(c, "f@example.org", ["full"],
                                            make_message(uniq("full")))
                check(codes(res) == [250], "no delivery after space came "
                      "back: %r" % res)
        finally:
            inst.stop()
            subprocess.run(["umount", inst.partition])


# ---- the second instance ---------------------------------------------------

def test_strict_instance():
    """lmtp_over_quota_perm_failure: yes -> 552 5.2.2; lmtp_bare_newlines:
    fix -> bare LF stored as CRLF; maxheaderlines: 20 -> 554 5.6.0."""
    with Instance("strict", conf={"lmtp_over_quota_perm_failure": "yes",
                                  "lmtp_bare_newlines": "fix",
                                  "maxheaderlines": "20"}) as inst:
        inst.create("user.quser")
        inst.create("user.fix")
        inst.quota("user.quser", 1)
        inst.write_cyrus_conf(prefork=1, maxchild=4)
        inst.start()
        big = make_message(uniq("pq"), body=(b"p" * 78 + b"\r\n") * 40)
        with connect(inst) as c:
            _, rr, _, _ = transaction(c, "q@example.org", ["quser"], big,
                                      mail_params=" SIZE=%d" % len(big))
            check(rr and rr[0].code == 552 and rr[0].enh == "5.2.2",
                  "over quota at RCPT with perm failure: %r" % rr)
            c.cmd("RSET")
            _, rr, _, res = transaction(c, "q@example.org", ["quser"], big)
            check(codes(rr) == [250] and codes(res) == [552]
                  and res[0].enh == "5.2.2", "over quota at DATA: %r %r"
                  % (rr, res))
            body = b"one\ntwo\r\nthree\nfour\r\n"
            msg = make_message(uniq("fix"), body=body)
            _, rr, _, res = transaction(c, "f@example.org", ["fix"], msg)
            check(codes(res) == [250], "bare LF with fix: %r" % res)
            hdrs = ["X-H%d: v" % i for i in range(30)]
            _, rr, _, res = transaction(c, "f@example.org", ["fix"],
                                        make_message(uniq("hdr"),
                                                     extra_headers=hdrs))
            check(codes(res) == [554] and res[0].enh == "5.6.0",
                  "35 header lines with maxheaderlines 20: %r" % res)
        check(inst.count("user.quser") == 0, "over-quota stored")
        msgs = inst.messages("user.fix")
        check(len(msgs) == 1, "user.fix has %d messages" % len(msgs))
        _, _, rest = split_added_headers(msgs[0])
        check(rest == msg.replace(b"one\ntwo", b"one\r\ntwo")
              .replace(b"three\nfour", b"three\r\nfour"),
              "bare LF not turned into CRLF: %r" % rest[-40:])


def test_main_instance_stops_clean():
    """Last: the shared instance stops by SIGTERM, nothing left behind,
    no worker crashed during the whole run, every mailbox checks."""
    global _main
    inst = main_instance()
    _main = None
    try:
        for box in ["user." + u for u in USERS] + ["user.alice.Lists",
                                                    "shared.news"]:
            rc, out, err = inst.mbtool("check", box, check_rc=False)
            check(rc == 0, "mbtool check %s: %s%s" % (box, out, err))
        check(not inst.stage_files(), "staging files left: %s"
              % inst.stage_files()[:5])
    finally:
        problems = inst.stop()
        trouble = inst.worker_trouble(inst.log())
        if not problems and not trouble:
            inst.cleanup()
    check(not problems, "; ".join(problems))
    check(not trouble, "worker trouble in the log: %s"
          % " | ".join(trouble[:5]))


def rcpt_lines(inst, rcpt, deadline=20, n=1):
    """The "lmtp: recipient" lines for rcpt (as written in RCPT) in the
    log since mark_log(), as dicts of their key=<value> fields; waits
    for n of them."""
    def find():
        got = []
        for line in inst.new_log().splitlines():
            if "lmtp: recipient " in line and "rcpt=<%s>" % rcpt in line:
                f = dict(re.findall(r" (\w+)=<((?:[^<>]|<[^<>]*>)*)>",
                                    line))
                f["_line"] = line
                got.append(f)
        return got if len(got) >= n else None
    got = wait_until(find, deadline)
    check(got, "no recipient line for %s: %r" % (rcpt, inst.new_log()[-800:]))
    return got


def test_journald_prefixes():
    """Under systemd (JOURNAL_STREAM names the device and inode of the
    stream stderr is), every stderr line starts with its syslog priority,
    "<6>" info, "<4>" warning, as sd-daemon(3) prefixes do; the rest of
    the line is unchanged.  Here stderr is the log file, so JOURNAL_STREAM
    gets its device and inode."""
    inst = Instance("journal", conf={"no_such_key_at_all": "1"})
    with inst:
        inst.create("user.alice")
        inst.write_cyrus_conf(prefork=1, maxchild=2)
        open(inst.logfile, "ab").close()
        st = os.stat(inst.logfile)
        old = os.environ.get("JOURNAL_STREAM")
        os.environ["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
        try:
            inst.start()
        finally:
            if old is None:
                del os.environ["JOURNAL_STREAM"]
            else:
                os.environ["JOURNAL_STREAM"] = old
        msgid = uniq("journal")
        with connect(inst) as c:
            _, rr, _, dr = transaction(c, "s@example.org", ["alice"],
                                       make_message(msgid))
            check(codes(dr) == [250], "delivery: %r" % dr)
        got = wait_until(lambda: [l for l in inst.log().splitlines()
                                  if msgid in l and "lmtp: delivery " in l],
                         10)
        check(got and re.match(r"^<6>lmtpd\[\d+\]: info: lmtp: delivery ",
                               got[0]), "delivery line: %r" % got)
        lines = [l for l in inst.log().splitlines() if l.strip()]
        check(any(re.match(r"^<6>master\[\d+\]: info: master: started ", l)
                  for l in lines), "master's start line: %r" % lines[:5])
        check(any(re.match(r"^<4>\S+\[\d+\]: warning: .*no_such_key", l)
                  for l in lines), "no <4> warning for the unknown key: %r"
              % [l for l in lines if "no_such_key" in l])
        bad = [l for l in lines if not re.match(r"^<[0-7]>\S+\[\d+\]: ", l)]
        check(not bad, "lines without a priority prefix: %r" % bad[:3])


def test_delivery_log_line():
    """One line per recipient with qid (from the topmost Received),
    msgid, sender, rcpt, mailbox, uid, size, status, reply and delay; a
    duplicate and an over-quota recipient say so; no Received, no qid."""
    inst = main_instance()
    msgid = uniq("logline")
    received = ["Received: from client.example (client.example "
                "[192.0.2.1])", "\tby mx.example (Postfix) with LMTP id "
                "4ABC123", "\tfor <bob@test.example>; Thu, 21 Nov 2024 "
                "12:00:00 +0000",
                "Received: by relay.example with ESMTP id OLDER99;"
                " Thu, 21 Nov 2024 11:00:00 +0000"]
    # the Received fields first, as an MTA prepends them
    body = make_message(msgid)
    message = ("\r\n".join(received) + "\r\n").encode() + body
    inst.mark_log()
    before = inst.count("user.bob")
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "logger@example.org",
                                    ["bob@test.example"], message)
        check(codes(res) == [250], "delivery: %r %r" % (rr, res))
    f = rcpt_lines(inst, "bob@test.example")[0]
    uids = [uid for uid, _ in inst.message_files("user.bob")]
    check(inst.count("user.bob") == before + 1, "not stored")
    want = {"qid": "4ABC123", "msgid": "<%s>" % msgid,
            "sender": "logger@example.org", "rcpt": "bob@test.example",
            "mailbox": "user.bob", "uid": str(uids[-1]),
            "status": "delivered", "reply": "250 2.1.5"}
    for k, v in want.items():
        check(f.get(k) == v, "%s=<%s>, expected <%s>: %s"
              % (k, f.get(k), v, f["_line"]))
    check(f.get("size") and int(f["size"]) >= len(message),
          "size: %s" % f["_line"])
    check(re.match(r"^\d+\.\d{3}$", f.get("delay", "")),
          "delay: %s" % f["_line"])
    # the same message again: a duplicate
    inst.mark_log()
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "logger@example.org",
                                    ["bob@test.example"], message)
        check(codes(res) == [250], "duplicate: %r" % res)
    f = rcpt_lines(inst, "bob@test.example")[0]
    check(f.get("status") == "duplicate" and f.get("reply") == "250 2.1.5"
          and "uid" not in f and f.get("qid") == "4ABC123",
          "duplicate: %s" % f["_line"])
    # over quota: at DATA (no SIZE=) and at RCPT (SIZE=)
    big = make_message(uniq("logq"), body=(b"z" * 78 + b"\r\n") * 60)
    inst.mark_log()
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "logger@example.org",
                                    ["quser@test.example"], big)
        check(codes(rr) == [250] and codes(res) == [452],
              "over quota at DATA: %r %r" % (rr, res))
        _, rr, _, res = transaction(c, "logger@example.org",
                                    ["quser@test.example"], big,
                                    mail_params=" SIZE=%d" % len(big))
        check(codes(rr) == [452], "over quota at RCPT: %r" % rr)
    lines = rcpt_lines(inst, "quser@test.example", n=2)
    for f in lines:
        check(f.get("status") == "overquota" and
              f.get("reply") == "452 4.2.2" and "uid" not in f,
              "over quota: %s" % f["_line"])
    check("msgid" in lines[0] and "msgid" not in lines[1],
          "msgid at DATA, none at RCPT: %r" % [l["_line"] for l in lines])
    # no Received: no qid
    inst.mark_log()
    with connect(inst) as c:
        _, rr, _, res = transaction(c, "logger@example.org",
                                    ["carol@test.example"],
                                    make_message(uniq("noqid")))
        check(codes(res) == [250], "delivery: %r" % res)
    f = rcpt_lines(inst, "carol@test.example")[0]
    check("qid" not in f and f.get("status") == "delivered",
          "no Received but: %s" % f["_line"])
    # an unknown user, refused at RCPT
    inst.mark_log()
    with connect(inst) as c:
        c.expect("MAIL FROM:<logger@example.org>", 250)
        c.expect("RCPT TO:<nosuch@test.example>", 550, "5.1.1")
    f = rcpt_lines(inst, "nosuch@test.example")[0]
    check(f.get("status") == "refused" and f.get("reply") == "550 5.1.1",
          "unknown user: %s" % f["_line"])


def test_log_file():
    """log_file in imapd.conf: lmtpd's lines (here a delivery) go to that
    file, one line each with a time stamp, not to stderr."""
    inst = Instance("logfile")
    logf = inst.path("cyrus.log")
    inst.write_imapd_conf({"log_file": logf})
    with inst:
        inst.create("user.alice")
        inst.write_cyrus_conf(prefork=1, maxchild=2)
        inst.start()
        msgid = uniq("logfile")
        with connect(inst) as c:
            _, rr, _, dr = transaction(c, "s@example.org", ["alice"],
                                       make_message(msgid))
            check(codes(dr) == [250], "delivery: %r" % dr)

        def lines():
            try:
                with open(logf, errors="replace") as f:
                    return [l for l in f
                            if msgid in l and "lmtp: delivery " in l]
            except OSError:
                return []
        got = wait_until(lines, 10)
        check(got and re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
                               r"[+-]\d{4} lmtpd\[\d+\]: info: lmtp: "
                               r"delivery ", got[0]),
              "no delivery line in log_file: %r" % got)
        check(msgid not in inst.log(), "the line went to stderr too")


TESTS = [
    test_greeting_and_commands,
    test_multi_rcpt_replies,
    test_pipelined_commands,
    test_dots_and_8bit_byte_exact,
    test_duplicate_suppression,
    test_plus_addressing,
    test_hostile_recipients,
    test_over_quota,
    test_maxmessagesize,
    test_oversize_streams,
    test_mail_parameters,
    test_smtputf8,
    test_mailbox_removed_before_data,
    test_store_failure_is_4xx,
    test_bdat_chunking,
    test_long_command_line,
    test_bare_lf_refused,
    test_bare_lf_command,
    test_smuggling_reject,
    test_smuggling_fix,
    test_nul_refused,
    test_disconnect_inside_data,
    test_unknown_and_out_of_order,
    test_too_many_recipients,
    test_run_by_hand,
    test_swaks_unix_socket,
    test_tcp_requires_auth,
    test_swaks_tcp_preauth,
    test_starttls_auth_plain,
    test_timeout_421,
    test_sigterm_idle_clients,
    test_full_disk,
    test_damaged_mailbox_list,
    test_strict_instance,
    test_log_file,
    test_delivery_log_line,
    test_journald_prefixes,
    test_main_instance_stops_clean,
]


def main():
    try:
        return run_lmtp_tests(TESTS)
    finally:
        if _main is not None:       # a subset run: stop and remove it
            _main.stop()
            _main.cleanup()


if __name__ == "__main__":
    sys.exit(main())
