#!/usr/bin/env python3
"""test_imapappend.py - the APPEND family end to end under the real
master: MULTIAPPEND (RFC 3502) with its APPENDUID uid-set (RFC 4315),
all or nothing when a later message is over APPENDLIMIT, over quota,
over the keyword limit or when the client goes away in the middle of a
literal; CATENATE (RFC 4469) of TEXT literals and IMAP URLs (RFC 5092) of
parts of messages the user can read, with BADURL and TOOBIG; the APPEND
side of BINARY (RFC 3516): a literal8 ~{n} carrying a NUL, and a NUL in
a plain literal refused; UTF8 (~{n}) (RFC 6855) refused without ENABLE
UTF8=ACCEPT; a MULTIAPPEND written by Cyrus's imtest; and, under
strace, one sync round for a three-message MULTIAPPEND, as for one
message.

One instance (see imaphelp.py), users alice and bob, allowplaintext on,
maxmessagesize 4096.  Exchanges are exact (imaphelp.Raw sends the bytes
given, checks every response against imapgrammar.py); what an APPEND
left behind is checked from a second session (STATUS, UID FETCH) and in
the staging directories.  After each bad input the session must go on
(NOOP answers OK) and at the end the master log must show no crashed
worker.

Environment: see imaphelp.py.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (SERVERNAME, ImapInstance, Raw, check,  # noqa: E402
                      make_sasldb_extra, run_imap_tests, wait_until)
from testlib import Skip  # noqa: E402

ALICE, ALICE_PW = "alice", "s3cret-pw"
BOB, BOB_PW = "bob", "b0b-pw"
LIMIT = 4096
IMTEST = "/usr/lib/cyrus/bin/imtest"
STRACE = "/usr/bin/strace"

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("imapappend", conf={"allowplaintext": "yes",
                                             "maxmessagesize": str(LIMIT)},
                         tls=True, sasl=(ALICE, ALICE_PW))
        try:
            make_sasldb_extra(i, BOB, BOB_PW)
            i.create("user.alice")
            i.create("user.bob")
            i.write_cyrus_conf()
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def session(i, user=ALICE, pw=ALICE_PW):
    c = Raw(i.addr())
    c.line()
    r = c.cmd("L0", "LOGIN %s %s" % (user, pw))
    check(r[-1].startswith(b"L0 OK"), "LOGIN %r" % r)
    return c


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


def message(n, extra=b""):
    return (b"From: <ann@example.com>\r\nTo: alice@example.org\r\n"
            b"Subject: message %d\r\nMessage-ID: <ap%d@example.com>\r\n\r\n"
            b"hello %d\r\n" % (n, n, n) + extra)


def uidvalidity(c, box):
    r = ok(c.cmd("uv", "STATUS %s (UIDVALIDITY)" % box), "uv")
    m = re.search(rb"UIDVALIDITY (\d+)", r[0])
    check(m is not None, "STATUS: %r" % r)
    return int(m.group(1))


def count(i, box):
    """MESSAGES of box, from a new session of alice."""
    with session(i) as c:
        r = ok(c.cmd("s1", "STATUS %s (MESSAGES)" % box), "s1")
        m = re.search(rb"MESSAGES (\d+)", r[0])
        check(m is not None, "STATUS: %r" % r)
        return int(m.group(1))


def bodies(i, box):
    """{uid: (flags line, raw message)} of box, from a new session."""
    out = {}
    with session(i) as c:
        ok(c.cmd("x1", "EXAMINE %s" % box), "x1")
        r = ok(c.lcmd("x2", "UID FETCH 1:* (UID FLAGS INTERNALDATE "
                      "BODY.PEEK[])"), "x2")
        for resp in r[:-1]:
            m = re.match(rb"\* \d+ FETCH \((.*?)BODY\[\] \{(\d+)\}\r\n",
                         resp, re.S)
            if not m:
                continue
            head = m.group(1)
            n = int(m.group(2))
            data = resp[m.end():m.end() + n]
            uid = int(re.search(rb"UID (\d+)", head).group(1))
            out[uid] = (head, data)
    return out


def send_sync(c, data_and_next):
    """Send a literal's data (and what follows it); the continuation must
    come first."""
    ln = c.line()
    check(ln.startswith(b"+"), "no continuation: %r" % ln)
    c.send(data_and_next)


def no_stage_files(i):
    wait_until(lambda: not i.stage_files(), 30)
    check(not i.stage_files(), "staging files left: %r" % i.stage_files())


def test_capabilities():
    """MULTIAPPEND, CATENATE, BINARY and UTF8=ACCEPT are advertised."""
    i = inst()
    with session(i) as c:
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        caps = r[0].split()
        check(b"MULTIAPPEND" in caps and b"CATENATE" in caps,
              "capabilities: %r" % r[0])
        check(b"BINARY" in caps and b"UTF8=ACCEPT" in caps,
              "capabilities: %r" % r[0])


def test_multiappend_three():
    """Three messages in one APPEND (synchronizing, synchronizing with
    flags and keywords, LITERAL+ with a date): one tagged OK with
    APPENDUID uidvalidity 1:3; each message stored byte for byte with its
    flags; \\Seen of the first in the user's seen state."""
    i = inst()
    i.create("user.alice.MA")
    m1, m2, m3 = message(1), message(2, b"second\r\n"), message(3)
    with session(i) as c:
        uv = uidvalidity(c, "INBOX.MA")
        c.send(b"a1 APPEND INBOX.MA (\\Seen) {%d}\r\n" % len(m1))
        send_sync(c, m1 + b" (\\Flagged $Work) {%d}\r\n" % len(m2))
        send_sync(c, m2 + b' "07-Feb-1994 21:52:25 -0800" {%d+}\r\n'
                  % len(m3) + m3 + b"\r\n")
        r = c.until_tagged("a1")
        check(r == [b"a1 OK [APPENDUID %d 1:3] APPEND completed" % uv],
              "MULTIAPPEND answer: %r" % r)
        ok(c.cmd("n1", "NOOP"), "n1")
    got = bodies(i, "INBOX.MA")
    check(sorted(got) == [1, 2, 3], "uids: %r" % sorted(got))
    check(got[1][1] == m1 and got[2][1] == m2 and got[3][1] == m3,
          "bodies differ: %r" % got)
    check(b"\\Seen" in got[1][0] and b"\\Flagged" not in got[1][0],
          "flags 1: %r" % got[1][0])
    check(b"\\Flagged" in got[2][0] and b"$Work" in got[2][0]
          and b"\\Seen" not in got[2][0], "flags 2: %r" % got[2][0])
    check(b'INTERNALDATE "08-Feb-1994 05:52:25 +0000"' in got[3][0],
          "date 3: %r" % got[3][0])
    no_stage_files(i)


def test_multiappend_toobig_second():
    """The second message over APPENDLIMIT: a synchronizing literal is
    refused with NO [TOOBIG] before its data (no "+"), a LITERAL+ one
    after its data is dropped; a malformed second message is BAD; in
    every case the first message is not stored (checked from a second
    session) and the session goes on."""
    i = inst()
    i.create("user.alice.MB")
    m1 = message(1)
    big = message(2, b"y" * LIMIT)
    with session(i) as c:
        c.send(b"b1 APPEND INBOX.MB {%d}\r\n" % len(m1))
        send_sync(c, m1 + b" {%d}\r\n" % len(big))
        ln = c.line()
        check(ln.startswith(b"b1 NO [TOOBIG]"), "sync over: %r" % ln)
        ok(c.cmd("n1", "NOOP"), "n1")
        check(count(i, "INBOX.MB") == 0, "first message stored (sync)")
        c.send(b"b2 APPEND INBOX.MB {%d+}\r\n" % len(m1) + m1
               + b" {%d+}\r\n" % len(big) + big + b" {%d+}\r\n" % len(m1)
               + m1 + b"\r\n")
        r = c.until_tagged("b2")
        check(len(r) == 1 and r[0].startswith(b"b2 NO [TOOBIG]"),
              "nonsync over: %r" % r)
        ok(c.cmd("n2", "NOOP"), "n2")
    check(count(i, "INBOX.MB") == 0, "first message stored (nonsync)")
    # a malformed second message: BAD, the first not stored either
    with session(i) as c:
        c.send(b"b3 APPEND INBOX.MB {%d+}\r\n" % len(m1) + m1
               + b" (\\Seen junk {%d+}\r\n" % len(m1) + m1 + b"\r\n")
        r = c.until_tagged("b3")
        check(len(r) == 1 and r[0].startswith(b"b3 BAD "), "junk: %r" % r)
        ok(c.cmd("n3", "NOOP"), "n3")
    check(count(i, "INBOX.MB") == 0, "first message stored (junk)")
    no_stage_files(i)


def test_multiappend_quota_and_keywords():
    """Each message alone fits the quota, the three together do not: NO
    [OVERQUOTA] and none stored; a batch whose second message brings the
    129th keyword: NO [LIMIT] and none stored; 201 messages in one APPEND:
    NO [LIMIT] and none stored."""
    i = inst()
    i.create("user.alice.MQ")
    i.quota("user.alice.MQ", 100000, 2)
    m = [message(k) for k in (1, 2, 3)]
    with session(i) as c:
        c.send(b"q1 APPEND INBOX.MQ" + b"".join(
            b" {%d+}\r\n" % len(x) + x for x in m) + b"\r\n")
        r = c.until_tagged("q1")
        check(r[-1].startswith(b"q1 NO [OVERQUOTA]"), "quota: %r" % r)
        ok(c.cmd("n1", "NOOP"), "n1")
    check(count(i, "INBOX.MQ") == 0, "messages stored over quota")
    i.create("user.alice.MK")
    kws = " ".join("$k%d" % k for k in range(129)).encode()
    with session(i) as c:
        c.send(b"k1 APPEND INBOX.MK {%d+}\r\n" % len(m[0]) + m[0]
               + b" (%s) {%d+}\r\n" % (kws, len(m[1])) + m[1] + b"\r\n")
        r = c.until_tagged("k1")
        check(r[-1].startswith(b"k1 NO [LIMIT]"), "keywords: %r" % r)
        ok(c.cmd("n2", "NOOP"), "n2")
    check(count(i, "INBOX.MK") == 0, "messages stored over the keyword "
          "limit")
    # more messages than one APPEND takes (200): NO [LIMIT], none stored
    with session(i) as c:
        c.send(b"k2 APPEND INBOX.MK" + b"".join(
            b" {%d+}\r\n" % len(m[0]) + m[0] for _ in range(201)) + b"\r\n")
        r = c.until_tagged("k2")
        check(r[-1].startswith(b"k2 NO [LIMIT]"), "201 messages: %r" % r)
        ok(c.cmd("n3", "NOOP"), "n3")
    check(count(i, "INBOX.MK") == 0, "messages of a batch over the "
          "message limit stored")
    no_stage_files(i)


def test_multiappend_disconnect():
    """The client goes away in the middle of the second literal: once the
    server has ended that session, no message of the batch is visible
    and no staging file is left."""
    i = inst()
    i.create("user.alice.MD")
    m1 = message(1)
    i.mark_log()
    c = session(i)
    c.send(b"d1 APPEND INBOX.MD {%d+}\r\n" % len(m1) + m1
           + b" {2000+}\r\n" + b"z" * 700)
    c.close()
    check(wait_until(lambda: re.search(r"imap: session end user=<alice>.*"
                                       r"reason=<disconnect>", i.new_log())
                     is not None, 60),
          "the session did not end: %s" % i.new_log()[-800:])
    check(count(i, "INBOX.MD") == 0, "a message of the broken batch is "
          "visible")
    no_stage_files(i)


def deliver_multipart(i, box):
    """A multipart message in box (through lmtpd); its raw bytes."""
    msg = (b"From: <ann@example.com>\r\nTo: alice@example.org\r\n"
           b"Subject: parts\r\nMessage-ID: <parts@example.com>\r\n"
           b"MIME-Version: 1.0\r\n"
           b"Content-Type: multipart/mixed; boundary=\"XX\"\r\n\r\n"
           b"--XX\r\nContent-Type: text/plain\r\n\r\nfirst part\r\n"
           b"--XX\r\nContent-Type: text/plain; name=\"b.txt\"\r\n\r\n"
           b"second part, line 1\r\nsecond part, line 2\r\n"
           b"--XX--\r\n")
    i.mbtool("deliver", "-m", box, ALICE, input=msg)
    return msg


def test_catenate():
    """CATENATE of TEXT + URL of part 2 of an existing message + TEXT,
    in the absolute-path form with UIDVALIDITY and in the imap:// form
    (user and host of this server, part 2's MIME header): the new message
    is exactly those bytes; CATENATE and a plain literal in one
    MULTIAPPEND give one APPENDUID set."""
    i = inst()
    i.create("user.alice.CS")
    i.create("user.alice.CD")
    deliver_multipart(i, "CS")
    part2 = b"second part, line 1\r\nsecond part, line 2"
    mime2 = b"Content-Type: text/plain; name=\"b.txt\"\r\n\r\n"
    head = (b"From: <alice@example.org>\r\nSubject: forward\r\n\r\n"
            b"Here it is:\r\n")
    tail = b"\r\n-- \r\nalice\r\n"
    plain = message(7)
    with session(i) as c:
        uv = uidvalidity(c, "INBOX.CS")
        dv = uidvalidity(c, "INBOX.CD")
        url1 = "/INBOX.CS;UIDVALIDITY=%d/;UID=1/;SECTION=2" % uv
        url2 = "imap://%s@%s/INBOX.CS/;UID=1/;SECTION=2.MIME" % (ALICE,
                                                                 SERVERNAME)
        c.send(b"t1 APPEND INBOX.CD (\\Draft) CATENATE (TEXT {%d}\r\n"
               % len(head))
        send_sync(c, head + b' URL "%s" URL %s TEXT {%d+}\r\n'
                  % (url1.encode(), url2.encode(), len(tail)) + tail
                  + b") {%d+}\r\n" % len(plain) + plain + b"\r\n")
        r = c.until_tagged("t1")
        check(r == [b"t1 OK [APPENDUID %d 1:2] APPEND completed" % dv],
              "CATENATE answer: %r" % r)
        ok(c.cmd("n1", "NOOP"), "n1")
    got = bodies(i, "INBOX.CD")
    want = head + part2 + mime2 + tail
    check(got[1][1] == want, "catenated message differs:\n%r\n%r"
          % (got[1][1], want))
    check(b"\\Draft" in got[1][0], "flags: %r" % got[1][0])
    check(got[2][1] == plain, "second message: %r" % got[2][1])
    # a relative URL names a message of the selected mailbox
    with session(i) as c:
        ok(c.cmd("s1", "SELECT INBOX.CS"), "s1")
        c.send(b"t2 APPEND INBOX.CD CATENATE (URL \";UID=1/;SECTION=1\" "
               b"TEXT {2+}\r\n\r\n)\r\n")
        r = c.until_tagged("t2")
        check(r[-1] == b"t2 OK [APPENDUID %d 3] APPEND completed" % dv,
              "relative URL: %r" % r)
    check(bodies(i, "INBOX.CD")[3][1] == b"first part\r\n",
          "relative URL's part")
    no_stage_files(i)


def test_badurl_and_toobig():
    """BADURL for a wrong UIDVALIDITY, a mailbox of another user, a uid
    that does not exist, another server, another user in the URL, URLAUTH
    and junk; TOOBIG when the parts together pass APPENDLIMIT; in every
    case nothing of the batch is stored and the session goes on."""
    i = inst()
    i.create("user.alice.BS")
    i.create("user.alice.BD")
    deliver_multipart(i, "BS")
    big = b"x" * (LIMIT - 100)
    with session(i) as c:
        uv = uidvalidity(c, "INBOX.BS")
        plain = message(1)
        cases = [
            "/INBOX.BS;UIDVALIDITY=%d/;UID=1" % (uv + 1),
            "/user.bob;UIDVALIDITY=1/;UID=1",
            "/INBOX.BS/;UID=99",
            "imap://elsewhere.example/INBOX.BS/;UID=1",
            "imap://bob@%s/INBOX.BS/;UID=1" % SERVERNAME,
            "/INBOX.BS/;UID=1/;URLAUTH=anonymous:internal:0123",
            "/INBOX.BS/;UID=1/;SECTION=7",
            "INBOX.BS/;UID=1",
        ]
        for k, url in enumerate(cases):
            tag = b"u%d" % k
            c.send(tag + b" APPEND INBOX.BD {%d+}\r\n" % len(plain) + plain
                   + b' CATENATE (TEXT {1+}\r\nx URL "%s")\r\n'
                   % url.encode())
            r = c.until_tagged(tag.decode())
            check(len(r) == 1 and r[0].startswith(tag + b" NO [BADURL "),
                  "%s: %r" % (url, r))
            if k == 0:
                check(r[0].startswith(b"%s NO [BADURL %s] " %
                                      (tag, url.encode())),
                      "BADURL code: %r" % r)
            ok(c.cmd("n%d" % k, "NOOP"), "n%d" % k)
        # TEXT parts over the limit: NO [TOOBIG], the second part refused
        # before its data
        c.send(b"v1 APPEND INBOX.BD CATENATE (TEXT {%d+}\r\n" % len(big)
               + big + b" TEXT {%d}\r\n" % len(big))
        ln = c.line()
        check(ln.startswith(b"v1 NO [TOOBIG]"), "TOOBIG: %r" % ln)
        ok(c.cmd("n9", "NOOP"), "n9")
        # ... and a URL's part that passes it
        c.send(b"v2 APPEND INBOX.BD CATENATE (TEXT {%d+}\r\n" % len(big)
               + big + b' URL "/INBOX.BS/;UID=1" URL "/INBOX.BS/;UID=1")'
               b"\r\n")
        r = c.until_tagged("v2")
        check(r[-1].startswith(b"v2 NO [TOOBIG]"), "TOOBIG url: %r" % r)
        ok(c.cmd("n10", "NOOP"), "n10")
    check(count(i, "INBOX.BD") == 0, "a message of a failed batch stored")
    no_stage_files(i)


def test_literal8_and_nul():
    """A literal8 ~{n} (and ~{n+}) carries a NUL into the store byte for
    byte; a NUL in a plain literal is BAD and stores nothing, also as the
    second message of a MULTIAPPEND; literal8 elsewhere is BAD."""
    i = inst()
    i.create("user.alice.L8")
    m1 = message(1, b"bin\x00ary\r\n")
    with session(i) as c:
        uv = uidvalidity(c, "INBOX.L8")
        c.send(b"b1 APPEND INBOX.L8 ~{%d}\r\n" % len(m1))
        send_sync(c, m1 + b" ~{%d+}\r\n" % len(m1) + m1 + b"\r\n")
        r = c.until_tagged("b1")
        check(r == [b"b1 OK [APPENDUID %d 1:2] APPEND completed" % uv],
              "literal8: %r" % r)
        r = ok(c.cmd("b2", "STATUS INBOX.L8 (MESSAGES)"), "b2")
        check(r[0].endswith(b"(MESSAGES 2)"), "%r" % r)
        plain = message(3)
        c.send(b"b3 APPEND INBOX.L8 {%d+}\r\n" % len(plain) + plain
               + b" {%d+}\r\n" % len(m1) + m1 + b"\r\n")
        r = c.until_tagged("b3")
        check(len(r) == 1 and r[0].startswith(b"b3 BAD ") and b"NUL" in r[0],
              "NUL in a literal: %r" % r)
        ok(c.cmd("n3", "NOOP"), "n3")
        # literal8 outside APPEND: BAD, its data dropped
        c.send(b"b4 FETCH 1 ~{2+}\r\nab\r\n")
        r = c.until_tagged("b4")
        check(r[-1].startswith(b"b4 BAD"), "literal8 in FETCH: %r" % r)
        ok(c.cmd("n4", "NOOP"), "n4")
    # the spool's files (FETCH of binary content is BINARY's other half)
    got = i.messages("user.alice.L8")
    check(got == [m1, m1], "stored: %r" % got)
    no_stage_files(i)


def test_utf8_append():
    """UTF8 (~{n}) before ENABLE UTF8=ACCEPT: BAD, nothing stored, the
    session goes on.  After ENABLE UTF8=ACCEPT both forms (LITERAL+ and
    synchronizing) store the message byte for byte, UTF-8 header
    included, in a mailbox named in UTF-8."""
    i = inst()
    i.create("user.alice.U8")
    m = message(1)
    with session(i) as c:
        c.send(b"u1 APPEND INBOX.U8 UTF8 (~{%d+}\r\n" % len(m) + m
               + b")\r\n")
        r = c.until_tagged("u1")
        check(len(r) == 1 and r[0].startswith(b"u1 BAD ")
              and b"UTF8=ACCEPT" in r[0], "UTF8: %r" % r)
        c.send(b"u2 APPEND INBOX.U8 UTF8 (~{%d}\r\n" % len(m))
        ln = c.line()
        check(ln.startswith(b"u2 BAD "), "UTF8 sync: %r" % ln)
        ok(c.cmd("n1", "NOOP"), "n1")
    check(count(i, "INBOX.U8") == 0, "UTF8 message stored")
    i.create("user.alice.Entw&APw-rfe")
    m8 = (b"Subject: =?utf-8?q?gr=C3=BC=C3=9Fe?= gr\xc3\xbc\xc3\x9fe\r\n"
          b"From: j\xc3\xb6rg@example.com\r\n\r\nK\xc3\xb6rper\r\n")
    with session(i) as c:
        r = ok(c.cmd("e1", "ENABLE UTF8=ACCEPT"), "e1")
        check(any(b"* ENABLED" in x and b"UTF8=ACCEPT" in x for x in r),
              "ENABLE: %r" % r)
        c.send(b'u3 APPEND "INBOX.Entw\xc3\xbcrfe" UTF8 (~{%d+}\r\n'
               % len(m8) + m8 + b")\r\n")
        r = c.until_tagged("u3")
        check(r[-1].startswith(b"u3 OK [APPENDUID "), "UTF8 after ENABLE: %r"
              % r)
        c.send(b'u4 APPEND "INBOX.Entw\xc3\xbcrfe" UTF8 (~{%d}\r\n'
               % len(m8))
        ln = c.line()
        check(ln.startswith(b"+"), "UTF8 sync after ENABLE: %r" % ln)
        c.send(m8 + b")\r\n")
        r = c.until_tagged("u4")
        check(r[-1].startswith(b"u4 OK [APPENDUID "), "UTF8 sync: %r" % r)
    got = i.messages("user.alice.Entw&APw-rfe")
    check(got == [m8, m8], "UTF8 messages stored: %r" % got)


def worker_pid(i, c):
    """The pid of the imapd serving Raw session c (ss -p)."""
    lport = c.sock.getsockname()[1]
    r = subprocess.run(["ss", "-tnpH", "state", "established",
                        "( sport = :%d and dport = :%d )"
                        % (i.tcp_port, lport)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    m = re.search(rb"pid=(\d+)", r.stdout)
    if not m:
        raise Skip("ss shows no process for the session: %r" % r.stdout)
    return int(m.group(1))


def sync_calls(pid, fn):
    """The fsync/fdatasync/syncfs calls process pid makes while fn() runs
    (strace attached first: /proc/PID/status names it as tracer)."""
    out = os.path.join(inst().dir, "strace.%d" % pid)
    p = subprocess.Popen([STRACE, "-qq", "-e",
                          "trace=fsync,fdatasync,syncfs", "-o", out,
                          "-p", str(pid)], stderr=subprocess.PIPE)
    try:
        def traced():
            with open("/proc/%d/status" % pid) as f:
                m = re.search(r"^TracerPid:\s+(\d+)", f.read(), re.M)
            return m is not None and int(m.group(1)) == p.pid
        if not wait_until(lambda: traced() or p.poll() is not None, 60) \
                or p.poll() is not None:
            raise Skip("strace cannot attach: %s"
                       % p.stderr.read().decode(errors="replace"))
        fn()
    finally:
        if p.poll() is None:
            p.terminate()
        p.wait(timeout=60)
    with open(out) as f:
        calls = [ln for ln in f if re.match(r"(fsync|fdatasync|syncfs)\(",
                                            ln)]
    os.unlink(out)
    return calls


def test_one_sync_round():
    """A MULTIAPPEND of three messages makes the same sync calls as an
    APPEND of one (spool_sync group: one syncfs per commit round): the
    batch is one commit, not one per message."""
    if not os.access(STRACE, os.X_OK):
        raise Skip("%s not installed" % STRACE)
    i = inst()
    i.create("user.alice.SY")
    m = [message(k) for k in (1, 2, 3, 4)]
    with session(i) as c:
        pid = worker_pid(i, c)

        def one(tag="y1"):
            c.send(b"%s APPEND INBOX.SY {%d+}\r\n" % (tag.encode(),
                                                       len(m[0])) + m[0]
                   + b"\r\n")
            ok(c.until_tagged(tag), tag)

        def three():
            c.send(b"y2 APPEND INBOX.SY" + b"".join(
                b" {%d+}\r\n" % len(x) + x for x in m[1:]) + b"\r\n")
            r = ok(c.until_tagged("y2"), "y2")
            check(b"[APPENDUID " in r[-1] and b" 3:5]" in r[-1],
                  "y2: %r" % r)
        one("y0")       # first-use work (databases opened) out of the way
        s1 = sync_calls(pid, one)
        s3 = sync_calls(pid, three)
    if not any(x.startswith("syncfs(") for x in s1):
        raise Skip("no group commit round here (fallback?): %r" % s1)
    check(len(s3) == len(s1), "sync calls: one message %d %r, three "
          "messages %d %r" % (len(s1), s1, len(s3), s3))
    check(count(i, "INBOX.SY") == 5, "messages stored")


def test_imtest_multiappend():
    """Cyrus's imtest sends a scripted MULTIAPPEND (LITERAL+ literals, as
    imtest passes a command file through): two messages, one APPENDUID."""
    if not os.access(IMTEST, os.X_OK):
        raise Skip("%s not installed (package cyrus-clients)" % IMTEST)
    i = inst()
    i.create("user.alice.IT")
    m1, m2 = message(1), message(2)
    tmp = tempfile.mkdtemp(prefix="imtest.", dir=i.dir)
    cmds = os.path.join(tmp, "commands")
    with open(cmds, "wb") as f:
        f.write(b"a01 APPEND INBOX.IT {%d+}\r\n" % len(m1) + m1
                + b" (\\Flagged) {%d+}\r\n" % len(m2) + m2 + b"\r\n"
                b"a02 LOGOUT\r\n")
    r = subprocess.run([IMTEST, "-t", "", "-m", "PLAIN", "-a", ALICE,
                        "-w", ALICE_PW, "-p", str(i.tcp_port), "-f", cmds,
                        "127.0.0.1"], env=dict(os.environ, HOME=tmp),
                       input=b"", stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    out = r.stdout.decode(errors="replace")
    shutil.rmtree(tmp, ignore_errors=True)
    check(re.search(r"^a01 OK \[APPENDUID \d+ 1:2\] APPEND completed", out,
                    re.M) is not None, "imtest: %s" % out)
    got = bodies(i, "INBOX.IT")
    check(got[1][1] == m1 and got[2][1] == m2 and b"\\Flagged" in got[2][0],
          "stored: %r" % got)


def finish():
    global _inst
    if _inst is not None:
        check(not _inst.worker_trouble(),
              "worker trouble: %s" % _inst.worker_trouble())
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_capabilities,
        test_multiappend_three,
        test_multiappend_toobig_second,
        test_multiappend_quota_and_keywords,
        test_multiappend_disconnect,
        test_catenate,
        test_badurl_and_toobig,
        test_literal8_and_nul,
        test_utf8_append,
        test_imtest_multiappend,
        test_one_sync_round,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
