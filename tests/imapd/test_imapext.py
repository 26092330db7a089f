#!/usr/bin/env python3
"""test_imapext.py - imapd's protocol extensions end to end under the
real master: COMPRESS=DEFLATE (RFC 4978), ESEARCH (RFC 4731), SEARCHRES
(RFC 5182), WITHIN (RFC 5032), SORT and THREAD (RFC 5256) with
SORT=DISPLAY (RFC 5957) and ESORT (RFC 5267), with the RFCs' examples
as cases.

One instance (see imaphelp.py): an "imap" listener with STARTTLS and an
"imaps" one, allowplaintext on (so that compression is also tried on a
plain connection), users alice and bob.  The client is a raw socket
client (imaphelp.Raw) that, after COMPRESS, deflates what it sends and
inflates what it reads with Python's zlib (raw deflate, as the RFC
says); every response is checked against imapgrammar.py.  imaplib runs
alongside to show that clients not using the extensions see nothing new.

After each bad input the session must go on (NOOP answers OK) and at
the end the master log must show no crashed worker.

Environment: see imaphelp.py.
"""
import imaplib
import re
import shutil
import subprocess
import sys
import os
import time
import zlib

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, ImapInstance, Raw, ConnectionClosed,  # noqa: E402
                      check, make_sasldb_extra, run_imap_tests, tls_context)
from testlib import Skip  # noqa: E402

ALICE, ALICE_PW = "alice", "s3cret-pw"
BOB, BOB_PW = "bob", "b0b-pw"

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("imapext", conf={"allowplaintext": "yes"},
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


class ZRaw(Raw):
    """Raw, and after compress() every byte both ways goes through raw
    deflate: what is sent is compressed and sync-flushed per send()."""

    def __init__(self, addr, timeout=20.0, implicit_tls=False):
        super().__init__(addr, timeout)
        if implicit_tls:
            self.sock = tls_context().wrap_socket(
                self.sock, server_hostname="localhost")
        self.zout = self.zin = None
        self.wire_in = 0

    def _recv(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionClosed("connection closed by the server")
        self.wire_in += len(data)
        if self.zin is not None:
            data = self.zin.decompress(data)
        self.buf += data

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        if self.zout is not None:
            data = (self.zout.compress(data)
                    + self.zout.flush(zlib.Z_SYNC_FLUSH))
        self.sock.sendall(data)

    def compress(self, tag="z", pipeline=None):
        """COMPRESS DEFLATE; with pipeline, that command goes compressed
        in the same packet as the COMPRESS line, before the OK arrives.
        The tagged reply of COMPRESS (read uncompressed)."""
        zout = zlib.compressobj(6, zlib.DEFLATED, -15)
        line = ("%s COMPRESS DEFLATE\r\n" % tag).encode()
        extra = b""
        if pipeline:
            extra = zout.compress(pipeline.encode()) + \
                zout.flush(zlib.Z_SYNC_FLUSH)
        self.sock.sendall(line + extra)
        # the OK comes uncompressed; anything after it is compressed: read
        # byte by byte up to the end of the OK line
        got = self.buf
        while b"\r\n" not in got:
            b = self.sock.recv(1)
            if not b:
                raise ConnectionClosed("closed during COMPRESS")
            got += b
        ok, rest = got.split(b"\r\n", 1)
        self.zout = zout
        self.zin = zlib.decompressobj(-15)
        self.buf = self.zin.decompress(rest) if rest else b""
        return ok


def login(c, user=ALICE, pw=ALICE_PW, tls=True):
    c.line()
    if tls:
        c.starttls()
    r = c.cmd("L0", "LOGIN %s %s" % (user, pw))
    check(r[-1].startswith(b"L0 OK"), "LOGIN %r" % r)
    return r


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


def caps_of(lines):
    for ln in lines:
        m = re.search(rb"CAPABILITY ([^\]]+)", ln)
        if m:
            return m.group(1).split()
    return []


def deliver(i, user, folder, msgs):
    for m in msgs:
        if folder:
            i.mbtool("deliver", "-m", folder, user, input=m)
        else:
            i.mbtool("deliver", user, input=m)


def message(n, size=0, subject=None, date=None, frm="ann@example.com"):
    body = b"".join(b"line %d of message %d, some text to deflate\r\n"
                    % (k, n) for k in range(size))
    return (b"From: <%s>\r\nTo: bob@example.org\r\nSubject: %s\r\n"
            b"Date: %s\r\nMessage-ID: <m%d@example.com>\r\n\r\n"
            % (frm.encode(), (subject or "message %d" % n).encode(),
               (date or "Mon, 4 Nov 2024 10:00:00 +0000").encode(), n)
            + b"hello\r\n" + body)


# ---- COMPRESS ----------------------------------------------------------

def test_compress_capability_states():
    """COMPRESS=DEFLATE is offered after login only, and no longer once
    compression is on; COMPRESS before login is BAD; an unknown mechanism
    is BAD; a second COMPRESS is NO [COMPRESSIONACTIVE]."""
    i = inst()
    with ZRaw(i.addr()) as c:
        g = c.line()
        check(b"COMPRESS=DEFLATE" not in g, "offered before login: %r" % g)
        r = c.cmd("a0", "COMPRESS DEFLATE")
        check(r[-1].startswith(b"a0 BAD"), "COMPRESS before login %r" % r)
        c.starttls()
        r = c.cmd("L0", "LOGIN %s %s" % (ALICE, ALICE_PW))
        check(b"COMPRESS=DEFLATE" in caps_of(r), "LOGIN caps %r" % r)
        r = c.cmd("a1", "COMPRESS GZIP")
        check(r[-1].startswith(b"a1 BAD"), "COMPRESS GZIP %r" % r)
        r = c.cmd("a2", "COMPRESS")
        check(r[-1].startswith(b"a2 BAD"), "COMPRESS without arg %r" % r)
        okline = c.compress("a3")
        check(okline.startswith(b"a3 OK"), "COMPRESS %r" % okline)
        r = ok(c.cmd("a4", "CAPABILITY"), "a4")
        check(b"COMPRESS=DEFLATE" not in caps_of(r) and
              b"IMAP4rev1" in caps_of(r), "caps under compression %r" % r)
        r = c.cmd("a5", "COMPRESS DEFLATE")
        check(r[-1].startswith(b"a5 NO [COMPRESSIONACTIVE]"),
              "second COMPRESS %r" % r)
        ok(c.cmd("a6", "NOOP"), "a6")
        ok(c.cmd("a7", "LOGOUT"), "a7")


def test_compress_tls_and_plain():
    """Under TLS (STARTTLS and imaps) and on a plain connection: a
    command pipelined compressed right behind COMPRESS is answered; a
    large FETCH comes back deflated (fewer bytes on the wire than the
    message) and byte for byte; APPEND of a literal through the
    compressed stream stores exactly those bytes."""
    i = inst()
    i.create("user.alice.Z")
    big = message(1, size=3000)
    deliver(i, ALICE, "Z", [big])
    for mode in ("starttls", "plain", "imaps"):
        if mode == "imaps":
            c = ZRaw(("127.0.0.1", i.imaps_port), implicit_tls=True)
            c.line()
            ok(c.cmd("L0", "LOGIN %s %s" % (ALICE, ALICE_PW)), "L0")
        else:
            c = ZRaw(i.addr())
            login(c, tls=(mode == "starttls"))
        with c:
            okline = c.compress("z1", pipeline="p1 SELECT INBOX.Z\r\n")
            check(okline.startswith(b"z1 OK"), "%s: COMPRESS %r"
                  % (mode, okline))
            ok(c.until_tagged("p1"), "p1")
            before = c.wire_in
            r = c.lcmd("f1", "FETCH 1 BODY.PEEK[]")
            ok(r, "f1")
            m = re.search(rb"BODY\[\] \{(\d+)\}\r\n", r[0])
            check(m is not None, "%s: FETCH %r" % (mode, r[0][:200]))
            body = r[0][m.end():m.end() + int(m.group(1))]
            check(body == big, "%s: FETCH body differs" % mode)
            wire = c.wire_in - before
            check(wire < len(big) // 3, "%s: %d bytes on the wire for a "
                  "%d byte message: not compressed" % (mode, wire, len(big)))
            data = b"Subject: appended\r\n\r\n" + b"z" * 5000 + b"\r\n"
            c.send(b"ap APPEND INBOX.Z {%d+}\r\n" % len(data) + data + b"\r\n")
            ok(c.until_tagged("ap"), "ap")
            r = c.lcmd("f2", "FETCH 2 BODY.PEEK[]")
            ok(r, "f2")
            m = re.search(rb"BODY\[\] \{(\d+)\}\r\n", r[0])
            check(m is not None and
                  r[0][m.end():m.end() + int(m.group(1))] == data,
                  "%s: appended message differs" % mode)
            ok(c.cmd("d1", "STORE 2 +FLAGS (\\Deleted)"), "d1")
            ok(c.cmd("d2", "EXPUNGE"), "d2")
            ok(c.cmd("lo", "LOGOUT"), "lo")
    log = i.log()
    check(re.search(r"imap: compression user=<alice> .*mech=<DEFLATE>", log),
          "no compression log line")


def test_compress_starttls_refused_after():
    """STARTTLS is no longer possible under compression (and is refused
    anyway once logged in); the session goes on."""
    i = inst()
    with ZRaw(i.addr()) as c:
        login(c, tls=False)
        check(c.compress("z1").startswith(b"z1 OK"), "COMPRESS")
        r = c.cmd("s1", "STARTTLS")
        check(r[-1].startswith(b"s1 BAD"), "STARTTLS under compression %r"
              % r)
        ok(c.cmd("n1", "NOOP"), "n1")


def test_compress_bomb_and_garbage():
    """A line that inflates to 8 MiB (a few KiB compressed) is answered
    BAD (line too long) and the session lives; a literal announced bigger
    than the limit is refused; garbage that is no deflate data ends that
    session only: the worker survives and serves the next client."""
    i = inst()
    with ZRaw(i.addr()) as c:
        login(c)
        check(c.compress("z1").startswith(b"z1 OK"), "COMPRESS")
        line = b"b1 NOOP " + b"A" * (8 << 20) + b"\r\n"
        comp = c.zout.compress(line) + c.zout.flush(zlib.Z_SYNC_FLUSH)
        check(len(comp) < 64 * 1024, "bomb too big: %d" % len(comp))
        c.sock.sendall(comp)
        r = c.until_tagged("b1")
        check(r[-1].startswith(b"b1 BAD"), "bomb line %r" % r)
        ok(c.cmd("n1", "NOOP"), "n1")
        # a synchronizing literal over the limit is refused before sending
        r = c.cmd("b2", "SEARCH SUBJECT {100000000}")
        check(r[-1].startswith(b"b2 BAD") or r[-1].startswith(b"b2 NO"),
              "big literal %r" % r)
        ok(c.cmd("n2", "NOOP"), "n2")
    with ZRaw(i.addr()) as c:
        login(c)
        check(c.compress("z1").startswith(b"z1 OK"), "COMPRESS")
        c.sock.sendall(b"\xff\xfe\xfd this is not deflate data\r\n" * 4)
        check(c.at_eof(30), "server kept a connection with corrupt "
              "compressed data")
    with ZRaw(i.addr()) as c:
        login(c)
        ok(c.cmd("n3", "NOOP"), "n3")
    check(not i.worker_trouble(), "worker trouble: %s" % i.worker_trouble())


def test_compress_idle():
    """IDLE under compression: the "+ idling" and DONE's OK travel
    deflated (each flush is a sync flush, so nothing waits in zlib)."""
    i = inst()
    with ZRaw(i.addr()) as c:
        login(c)
        check(c.compress("z1").startswith(b"z1 OK"), "COMPRESS")
        ok(c.cmd("s1", "SELECT INBOX"), "s1")
        c.send("i1 IDLE\r\n")
        ln = c.line()
        check(ln.startswith(b"+"), "IDLE continuation %r" % ln)
        deliver(i, ALICE, None, [message(99)])
        seen = False
        deadline = time.time() + 20
        while time.time() < deadline and not seen:
            ln = c.line()
            seen = ln.endswith(b"EXISTS")
        check(seen, "no EXISTS during IDLE under compression")
        c.send("DONE\r\n")
        ok(c.until_tagged("i1"), "i1")


def test_imaplib_unaffected():
    """imaplib (which never sends COMPRESS) works as before."""
    i = inst()
    m = IMAP4(*i.addr(), timeout=20)
    try:
        m.starttls(tls_context())
        typ, data = m.login(ALICE, ALICE_PW)
        check(typ == "OK", "login %r" % data)
        typ, data = m.capability()
        check(typ == "OK" and b"COMPRESS=DEFLATE" in data[0].split(),
              "capabilities after login %r" % data)
        typ, data = m.select("INBOX")
        check(typ == "OK", "select %r" % data)
        m.logout()
    except imaplib.IMAP4.error as e:
        check(False, "imaplib: %s" % e)
    finally:
        try:
            m.shutdown()
        except OSError:
            pass


# ---- ESEARCH, SEARCHRES, WITHIN ------------------------------------------

def esearch_box(i, name):
    """11 messages; 2, 5, 10 and 11 flagged, 5 from Smith (the RFC 4731
    section 3.1 examples' shape)."""
    i.create("user.alice." + name)
    deliver(i, ALICE, name,
            [message(n, frm="smith@example.com" if n == 5
                     else "ann@example.com") for n in range(1, 12)])


def test_esearch_rfc4731():
    """The RFC 4731 examples: MIN COUNT, RETURN () = ALL as a compact
    set, no match (only the correlator), UID MIN MAX, COUNT alone; plain
    SEARCH unchanged; bad RETURN options are BAD and the session goes
    on."""
    i = inst()
    esearch_box(i, "ES")
    with ZRaw(i.addr()) as c:
        login(c)
        ok(c.cmd("s1", "SELECT INBOX.ES"), "s1")
        ok(c.cmd("s2", "STORE 2,5,10:11 +FLAGS (\\Flagged)"), "s2")
        crit = 'FLAGGED SINCE 1-Feb-1994 NOT FROM "Smith"'
        cases = [
            ("A282", "SEARCH RETURN (MIN COUNT) " + crit,
             b'* ESEARCH (TAG "A282") MIN 2 COUNT 3'),
            ("A283", "SEARCH RETURN () " + crit,
             b'* ESEARCH (TAG "A283") ALL 2,10:11'),
            ("A284", "SEARCH RETURN (MIN) SUBJECT nothing-like-it",
             b'* ESEARCH (TAG "A284")'),
            ("A285", "UID SEARCH RETURN (MIN MAX) 1:5000",
             b'* ESEARCH (TAG "A285") UID MIN 1 MAX 11'),
            ("A286", "SEARCH RETURN (COUNT) UNDELETED",
             b'* ESEARCH (TAG "A286") COUNT 11'),
            ("A287", "SEARCH RETURN (COUNT) SUBJECT nothing-like-it",
             b'* ESEARCH (TAG "A287") COUNT 0'),
            ("A288", "SEARCH RETURN (ALL MIN MAX COUNT) FLAGGED",
             b'* ESEARCH (TAG "A288") MIN 2 MAX 11 ALL 2,5,10:11 COUNT 4'),
            ("A289", "SEARCH FLAGGED", b"* SEARCH 2 5 10 11"),
            ("A290", "UID SEARCH RETURN (ALL) CHARSET UTF-8 FROM smith",
             b'* ESEARCH (TAG "A290") UID ALL 5'),
        ]
        for tag, cmd, want in cases:
            r = ok(c.cmd(tag, cmd), tag)
            check(len(r) == 2 and r[0] == want, "%s: %r, want %r"
                  % (cmd, r, want))
        r = ok(c.cmd("m1", "SEARCH RETURN (MAX) MODSEQ 1"), "m1")
        check(re.match(rb'\* ESEARCH \(TAG "m1"\) MAX 11 MODSEQ \d+$', r[0]),
              "ESEARCH with MODSEQ %r" % r)
        for n, bad in enumerate(["SEARCH RETURN (FOO) ALL",
                                 "SEARCH RETURN MIN ALL",
                                 "SEARCH RETURN (MIN MIN) ALL",
                                 "SEARCH RETURN (MIN",
                                 "SEARCH RETURN (MIN)"]):
            tag = "b%d" % n
            r = c.cmd(tag, bad)
            check(r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (bad, r))
        ok(c.cmd("n1", "NOOP"), "n1")
    m = IMAP4(*i.addr(), timeout=20)
    try:
        m.starttls(tls_context())
        m.login(ALICE, ALICE_PW)
        m.select("INBOX.ES", readonly=True)
        typ, data = m.search(None, "FLAGGED")
        check(typ == "OK" and data == [b"2 5 10 11"], "imaplib %r" % data)
        m.logout()
    finally:
        try:
            m.shutdown()
        except OSError:
            pass


def test_searchres_rfc5182():
    """SAVE and "$": RETURN (SAVE) alone answers no ESEARCH; FETCH $,
    STORE $, UID FETCH $, SEARCH $ (intersection with a new search),
    UID SEARCH UID $; with MIN/MAX only those are saved; an expunged
    message leaves "$"; SELECT empties it; "$" mixed into a set is
    BAD."""
    i = inst()
    esearch_box(i, "SR")
    with ZRaw(i.addr()) as c:
        login(c)
        ok(c.cmd("s1", "SELECT INBOX.SR"), "s1")
        ok(c.cmd("s2", "STORE 2,5,10:11 +FLAGS.SILENT (\\Flagged)"), "s2")
        r = ok(c.cmd("A282", 'SEARCH RETURN (SAVE) FLAGGED SINCE '
                     '1-Feb-1994 NOT FROM "Smith"'), "A282")
        check(len(r) == 1, "RETURN (SAVE) answered %r" % r)
        r = ok(c.cmd("A283", "FETCH $ (UID)"), "A283")
        check(r[:-1] == [b"* 2 FETCH (UID 2)", b"* 10 FETCH (UID 10)",
                         b"* 11 FETCH (UID 11)"], "FETCH $ %r" % r)
        r = ok(c.cmd("A284", "UID FETCH $ (FLAGS)"), "A284")
        check(len(r) == 4, "UID FETCH $ %r" % r)
        r = ok(c.cmd("A285", "SEARCH $ NOT UID 10"), "A285")
        check(r[0] == b"* SEARCH 2 11", "SEARCH $ %r" % r)
        r = ok(c.cmd("A286", "UID SEARCH UID $"), "A286")
        check(r[0] == b"* SEARCH 2 10 11", "UID SEARCH UID $ %r" % r)
        # SAVE combined with ALL: answered and saved
        r = ok(c.cmd("A287", "SEARCH RETURN (SAVE ALL) $ SMALLER 100000"),
               "A287")
        check(r[0] == b'* ESEARCH (TAG "A287") ALL 2,10:11', "%r" % r)
        # SAVE with MIN MAX only: the two ends are saved
        r = ok(c.cmd("A288", "SEARCH RETURN (SAVE MIN MAX) FLAGGED"),
               "A288")
        check(r[0] == b'* ESEARCH (TAG "A288") MIN 2 MAX 11', "%r" % r)
        r = ok(c.cmd("A289", "SEARCH $"), "A289")
        check(r[0] == b"* SEARCH 2 11", "SAVE MIN MAX %r" % r)
        ok(c.cmd("A290", "STORE $ +FLAGS (\\Deleted)"), "A290")
        r = ok(c.cmd("A291", "SEARCH DELETED"), "A291")
        check(r[0] == b"* SEARCH 2 11", "STORE $ %r" % r)
        # expunge 2 and 11: "$" becomes empty; numbers moved on
        ok(c.cmd("A292", "EXPUNGE"), "A292")
        r = ok(c.cmd("A293", "SEARCH $"), "A293")
        check(r[0] == b"* SEARCH", "$ after EXPUNGE %r" % r)
        r = ok(c.cmd("A294", "FETCH $ (UID)"), "A294")
        check(len(r) == 1, "FETCH of empty $ %r" % r)
        ok(c.cmd("A295", "UID SEARCH RETURN (SAVE) UID 5:10"), "A295")
        r = ok(c.cmd("A296", "FETCH $ (UID)"), "A296")
        check([x.split(b" FETCH")[0] for x in r[:-1]] ==
              [b"* 4", b"* 5", b"* 6", b"* 7", b"* 8", b"* 9"],
              "FETCH $ after UID SAVE %r" % r)
        for n, bad in enumerate(["FETCH $,1 (UID)", "FETCH $:3 (UID)"]):
            tag = "b%d" % n
            r = c.cmd(tag, bad)
            check(r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (bad, r))
        # a SAVE refused by the parser empties "$" too
        for n, bad in enumerate(["SEARCH RETURN (SAVE) CHARSET KOI8-R ALL",
                                 "SEARCH RETURN (SAVE) NOSUCHKEY"]):
            ok(c.cmd("r%d" % n, "SEARCH RETURN (SAVE) ALL"), "r%d" % n)
            tag = "f%d" % n
            r = c.cmd(tag, bad)
            check(r[-1].startswith(tag.encode() + b" NO") or
                  r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (bad, r))
            r = ok(c.cmd("g%d" % n, "SEARCH $"), "g%d" % n)
            check(r[0] == b"* SEARCH", "$ after %s: %r" % (bad, r))
        ok(c.cmd("r9", "SEARCH RETURN (SAVE) ALL"), "r9")
        ok(c.cmd("s3", "SELECT INBOX.SR"), "s3")
        r = ok(c.cmd("A297", "SEARCH $"), "A297")
        check(r[0] == b"* SEARCH", "$ after SELECT %r" % r)


def test_partial_rfc5267():
    """RETURN (PARTIAL lo:hi) (RFC 5267 4.4) on SEARCH, UID SEARCH and
    SORT: the lo-th to hi-th of the result (SORT: in sort order), a
    reversed range as the same range, a range past the end NIL, MIN MAX
    COUNT still of the whole result; with SAVE only the range is saved;
    ALL with PARTIAL, a zero, a missing or malformed range and a repeated
    PARTIAL are BAD and the session goes on.  CONTEXT=SEARCH and
    CONTEXT=SORT are not offered (no UPDATE)."""
    i = inst()
    esearch_box(i, "PA")
    sort_box(i, "PS")
    with ZRaw(i.addr()) as c:
        login(c)
        ok(c.cmd("s1", "SELECT INBOX.PA"), "s1")
        ok(c.cmd("s2", "STORE 2,5,10:11 +FLAGS.SILENT (\\Flagged)"), "s2")
        ok(c.cmd("s3", "STORE 1 +FLAGS.SILENT (\\Deleted)"), "s3")
        ok(c.cmd("s4", "EXPUNGE"), "s4")      # numbers 1..10, UIDs 2..11
        cases = [
            ("p1", "SEARCH RETURN (PARTIAL 1:3) ALL",
             b'* ESEARCH (TAG "p1") PARTIAL (1:3 1:3)'),
            ("p2", "UID SEARCH RETURN (PARTIAL 2:4) ALL",
             b'* ESEARCH (TAG "p2") UID PARTIAL (2:4 3:5)'),
            ("p3", "SEARCH RETURN (PARTIAL 3:2) FLAGGED",
             b'* ESEARCH (TAG "p3") PARTIAL (2:3 4,9)'),
            ("p4", "SEARCH RETURN (PARTIAL 3:100 COUNT MIN MAX) FLAGGED",
             b'* ESEARCH (TAG "p4") MIN 1 MAX 10 PARTIAL (3:100 9:10)'
             b' COUNT 4'),
            ("p5", "SEARCH RETURN (PARTIAL 5:9) FLAGGED",
             b'* ESEARCH (TAG "p5") PARTIAL (5:9 NIL)'),
            ("p6", "SEARCH RETURN (PARTIAL 1:10) SUBJECT nothing-like-it",
             b'* ESEARCH (TAG "p6") PARTIAL (1:10 NIL)'),
            ("p7", "UID SEARCH RETURN (PARTIAL 4294967295:10) ALL",
             b'* ESEARCH (TAG "p7") UID PARTIAL (10:4294967295 11)'),
        ]
        for tag, cmd, want in cases:
            r = ok(c.cmd(tag, cmd), tag)
            check(len(r) == 2 and r[0] == want, "%s: %r, want %r"
                  % (cmd, r, want))
        # SAVE with PARTIAL keeps only the range
        r = ok(c.cmd("v1", "SEARCH RETURN (SAVE PARTIAL 2:3) FLAGGED"), "v1")
        check(r[0] == b'* ESEARCH (TAG "v1") PARTIAL (2:3 4,9)', "%r" % r)
        r = ok(c.cmd("v2", "UID SEARCH UID $"), "v2")
        check(r[0] == b"* SEARCH 5 10", "SAVE PARTIAL %r" % r)
        for n, bad in enumerate(["SEARCH RETURN (ALL PARTIAL 1:2) ALL",
                                 "SEARCH RETURN (PARTIAL 1:2 ALL) ALL",
                                 "SEARCH RETURN (PARTIAL 0:5) ALL",
                                 "SEARCH RETURN (PARTIAL 1) ALL",
                                 "SEARCH RETURN (PARTIAL 1:*) ALL",
                                 "SEARCH RETURN (PARTIAL -1:5) ALL",
                                 "SEARCH RETURN (PARTIAL) ALL",
                                 "SEARCH RETURN (PARTIAL 1:2 PARTIAL 3:4) "
                                 "ALL",
                                 "SEARCH RETURN (PARTIAL 1:4294967296) ALL",
                                 "SEARCH RETURN (UPDATE) ALL",
                                 "SORT RETURN (ALL PARTIAL 1:2) (DATE) "
                                 "UTF-8 ALL"]):
            tag = "b%d" % n
            r = c.cmd(tag, bad)
            check(r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (bad, r))
            ok(c.cmd("n%d" % n, "NOOP"), "n%d" % n)
        # ESORT: positions in the sort order (SORT (DATE) is 8 6 2 1 3 4
        # 5 7, UIDs 9 7 3 2 4 5 6 8)
        ok(c.cmd("s5", "SELECT INBOX.PS"), "s5")
        ok(c.cmd("s6", "STORE 1 +FLAGS.SILENT (\\Deleted)"), "s6")
        ok(c.cmd("s7", "EXPUNGE"), "s7")
        r = ok(c.cmd("e1", "SORT RETURN (PARTIAL 2:5 MIN) (DATE) UTF-8 "
                     "ALL"), "e1")
        check(r[0] == b'* ESEARCH (TAG "e1") MIN 8 PARTIAL (2:5 6,2,1,3)',
              "ESORT PARTIAL %r" % r)
        r = ok(c.cmd("e2", "UID SORT RETURN (PARTIAL 6:20) (DATE) UTF-8 "
                     "ALL"), "e2")
        check(r[0] == b'* ESEARCH (TAG "e2") UID PARTIAL (6:20 5:6,8)',
              "UID ESORT PARTIAL %r" % r)
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        for cap in (b"CONTEXT=SEARCH", b"CONTEXT=SORT"):
            check(cap not in caps_of(r), "%s offered: %r" % (cap, r))


def test_within_rfc5032():
    """OLDER / YOUNGER on the internal date: one message appended with a
    date in 2020, one now."""
    i = inst()
    i.create("user.alice.W")
    with ZRaw(i.addr()) as c:
        login(c)
        old = message(1)
        c.send(b'a1 APPEND INBOX.W "01-Jan-2020 00:00:00 +0000" {%d+}\r\n'
               % len(old) + old + b"\r\n")
        ok(c.until_tagged("a1"), "a1")
        new = message(2)
        c.send(b"a2 APPEND INBOX.W {%d+}\r\n" % len(new) + new + b"\r\n")
        ok(c.until_tagged("a2"), "a2")
        ok(c.cmd("s1", "SELECT INBOX.W"), "s1")
        cases = [("SEARCH YOUNGER 259200", b"* SEARCH 2"),
                 ("SEARCH OLDER 259200", b"* SEARCH 1"),
                 ("SEARCH OLDER 3600 YOUNGER 1000000000", b"* SEARCH 1"),
                 ("UID SEARCH RETURN (COUNT) YOUNGER 3600",
                  b'* ESEARCH (TAG "t3") UID COUNT 1'),
                 ("SEARCH NOT OLDER 3600", b"* SEARCH 2")]
        for n, (cmd, want) in enumerate(cases):
            tag = "t%d" % n
            r = ok(c.cmd(tag, cmd), tag)
            check(r[0] == want, "%s: %r, want %r" % (cmd, r, want))
        for n, bad in enumerate(["SEARCH OLDER 0", "SEARCH YOUNGER",
                                 "SEARCH OLDER -5"]):
            tag = "b%d" % n
            r = c.cmd(tag, bad)
            check(r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (bad, r))
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        for cap in (b"ESEARCH", b"SEARCHRES", b"WITHIN"):
            check(cap in caps_of(r), "%s not offered: %r" % (cap, r))


# ---- SORT, ESORT, THREAD ---------------------------------------------------

SORT_MSGS = [
    # (subject, from, date or None, message-id, extra headers)
    ("=?UTF-8?Q?Re=3A_lunch_plans?=", "Zed <zed@x.example>",
     "Tue, 5 Nov 2024 10:00:00 +0000", "<a2@x>", ["In-Reply-To: <a1@x>"]),
    ("lunch plans", "amy@x.example", "Mon, 4 Nov 2024 10:00:00 +0000",
     "<a1@x>", []),
    ("[list] Report", "Bob Builder <bob@x.example>",
     "Wed, 6 Nov 2024 09:00:00 +0100", "<b1@x>", ["Cc: zz@x.example"]),
    ("Fwd: lunch plans (fwd)", "carl@x.example",
     "Wed, 6 Nov 2024 08:30:00 +0000", "<c1@x>", []),
    ("Re: [list] report", "=?UTF-8?Q?=C3=84nne?= <anne@x.example>",
     "Thu, 7 Nov 2024 10:00:00 +0000", "<b2@x>",
     ["References: <b1@x>", "Cc: aa@x.example"]),
    ("re: re: Report", "Dave <dave@x.example>",
     "3 Nov 2024 10:00 GMT", "<b3@x>", ["References: <b1@x>\r\n <b2@x>"]),
    ("unrelated", "eve@x.example", None, "<d1@x>",
     ["References: <m1@x> <m2@x>"]),
    ("another", "Fay <fay@x.example>", "Fri, 1 Nov 2024 10:00:00 +0000",
     "<e1@x>", ["References: <m1@x>"]),
]


def sort_box(i, name):
    """The messages above as 1..8, UIDs 2..9 (a first message is
    expunged, so that numbers and UIDs differ)."""
    i.create("user.alice." + name)
    deliver(i, ALICE, name, [message(0)])
    for subj, frm, date, mid, extra in SORT_MSGS:
        hdr = ["From: %s" % frm, "To: bob@example.org",
               "Subject: %s" % subj, "Message-ID: %s" % mid] + extra
        if date:
            hdr.append("Date: %s" % date)
        deliver(i, ALICE, name,
                [("\r\n".join(hdr) + "\r\n\r\nbody\r\n").encode()])


def test_sort_rfc5256():
    """SORT on every criterion (DATE with time zones and a message
    without Date:, SUBJECT with encoded words and Re:/Fwd:/[blob]/(fwd),
    FROM/CC local parts, DISPLAYFROM with a decoded display name,
    REVERSE, several keys), UID SORT, a search key and "$" with SORT,
    ESORT's RETURN (MIN MAX ALL COUNT) in sort order; bad SORT commands
    are BAD (or NO [BADCHARSET]) and the session goes on."""
    i = inst()
    sort_box(i, "Sort")
    with ZRaw(i.addr()) as c:
        login(c)
        ok(c.cmd("s0", "SELECT INBOX.Sort"), "s0")
        ok(c.cmd("s1", "STORE 1 +FLAGS.SILENT (\\Deleted)"), "s1")
        ok(c.cmd("s2", "EXPUNGE"), "s2")
        cases = [
            ("SORT (DATE) UTF-8 ALL", b"* SORT 8 6 2 1 3 4 5 7"),
            ("SORT (REVERSE DATE) UTF-8 ALL", b"* SORT 7 5 4 3 1 2 6 8"),
            ("SORT (SUBJECT) UTF-8 ALL", b"* SORT 8 1 2 4 3 5 6 7"),
            ("SORT (SUBJECT REVERSE DATE) US-ASCII ALL",
             b"* SORT 8 4 1 2 5 3 6 7"),
            ("SORT (FROM) UTF-8 ALL", b"* SORT 2 5 3 4 6 7 8 1"),
            ("SORT (DISPLAYFROM) UTF-8 ALL", b"* SORT 2 3 4 6 7 8 1 5"),
            ("SORT (CC) UTF-8 ALL", b"* SORT 1 2 4 6 7 8 5 3"),
            ("SORT (ARRIVAL) UTF-8 ALL", b"* SORT 1 2 3 4 5 6 7 8"),
            ("SORT (TO DATE) UTF-8 ALL", b"* SORT 8 6 2 1 3 4 5 7"),
            ("UID SORT (DATE) UTF-8 ALL", b"* SORT 9 7 3 2 4 5 6 8"),
            ("SORT (DATE) UTF-8 SUBJECT lunch", b"* SORT 2 1 4"),
            ("SORT (DATE) UTF-8 SUBJECT nothing-like-it", b"* SORT"),
        ]
        for n, (cmd, want) in enumerate(cases):
            tag = "t%d" % n
            r = ok(c.cmd(tag, cmd), tag)
            check(len(r) == 2 and r[0] == want, "%s: %r, want %r"
                  % (cmd, r, want))
        ok(c.cmd("v1", "SEARCH RETURN (SAVE) FROM carl"), "v1")
        r = ok(c.cmd("v2", "SORT (DATE) UTF-8 OR $ SUBJECT report"), "v2")
        check(r[0] == b"* SORT 6 3 4 5", "SORT with $ %r" % r)
        r = ok(c.cmd("e1", "SORT RETURN (MIN MAX COUNT ALL) (DATE) UTF-8 "
                     "ALL"), "e1")
        check(r[0] == b'* ESEARCH (TAG "e1") MIN 8 MAX 7 ALL 8,6,2,1,3:5,7'
              b" COUNT 8", "ESORT %r" % r)
        r = ok(c.cmd("e2", "UID SORT RETURN () (REVERSE DATE) UTF-8 "
                     "ALL"), "e2")
        check(r[0] == b'* ESEARCH (TAG "e2") UID ALL 8,6,5,4,2:3,7,9',
              "ESORT UID %r" % r)
        r = ok(c.cmd("e3", "SORT RETURN (COUNT) (DATE) UTF-8 SUBJECT "
                     "nothing-like-it"), "e3")
        check(r[0] == b'* ESEARCH (TAG "e3") COUNT 0', "ESORT none %r" % r)
        for n, bad in enumerate(["SORT (FOO) UTF-8 ALL", "SORT () UTF-8 ALL",
                                 "SORT DATE UTF-8 ALL",
                                 "SORT (REVERSE) UTF-8 ALL",
                                 "SORT (REVERSE REVERSE DATE) UTF-8 ALL",
                                 "SORT RETURN (SAVE) (DATE) UTF-8 ALL",
                                 "SORT (DATE) UTF-8",
                                 "SORT (DATE"]):
            tag = "b%d" % n
            r = c.cmd(tag, bad)
            check(r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (bad, r))
        r = c.cmd("b9", "SORT (DATE) KOI8-R ALL")
        check(r[-1].startswith(b"b9 NO [BADCHARSET"), "charset %r" % r)
        ok(c.cmd("n1", "NOOP"), "n1")
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        for cap in (b"SORT", b"SORT=DISPLAY", b"ESORT",
                    b"THREAD=ORDEREDSUBJECT", b"THREAD=REFERENCES"):
            check(cap in caps_of(r), "%s not offered: %r" % (cap, r))


def test_thread_rfc5256():
    """THREAD REFERENCES (In-Reply-To and References, dummy parents
    pruned or kept at the root, a forward merged by base subject under
    its original, siblings by sent date) and ORDEREDSUBJECT, as numbers
    and as UIDs, with a search key; a bad algorithm is BAD."""
    i = inst()
    sort_box(i, "Thread")
    with ZRaw(i.addr()) as c:
        login(c)
        ok(c.cmd("s0", "SELECT INBOX.Thread"), "s0")
        ok(c.cmd("s1", "STORE 1 +FLAGS.SILENT (\\Deleted)"), "s1")
        ok(c.cmd("s2", "EXPUNGE"), "s2")
        cases = [
            ("THREAD REFERENCES UTF-8 ALL",
             b"* THREAD ((8)(7))(2 (1)(4))(3 5 6)"),
            ("UID THREAD REFERENCES UTF-8 ALL",
             b"* THREAD ((9)(8))(3 (2)(5))(4 6 7)"),
            ("THREAD ORDEREDSUBJECT UTF-8 ALL",
             b"* THREAD (8)(6 (3)(5))(2 (1)(4))(7)"),
            ("UID THREAD ORDEREDSUBJECT US-ASCII ALL",
             b"* THREAD (9)(7 (4)(6))(3 (2)(5))(8)"),
            ("THREAD REFERENCES UTF-8 SUBJECT report", b"* THREAD (3 5 6)"),
            ("THREAD REFERENCES UTF-8 NOT SUBJECT lunch NOT FROM fay",
             b"* THREAD (3 5 6)(7)"),
            ("THREAD ORDEREDSUBJECT UTF-8 SUBJECT lunch NOT UID 5",
             b"* THREAD (2 1)"),
            ("THREAD REFERENCES UTF-8 SUBJECT nothing-like-it",
             b"* THREAD"),
        ]
        for n, (cmd, want) in enumerate(cases):
            tag = "t%d" % n
            r = ok(c.cmd(tag, cmd), tag)
            check(len(r) == 2 and r[0] == want, "%s: %r, want %r"
                  % (cmd, r, want))
        for n, bad in enumerate(["THREAD FOO UTF-8 ALL",
                                 "THREAD REFERENCES UTF-8",
                                 "THREAD"]):
            tag = "b%d" % n
            r = c.cmd(tag, bad)
            check(r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (bad, r))
        r = c.cmd("b9", "THREAD REFERENCES ISO-2022-JP ALL")
        check(r[-1].startswith(b"b9 NO [BADCHARSET"), "charset %r" % r)
        ok(c.cmd("n1", "NOOP"), "n1")


def test_curl_sort_esearch():
    """curl (which never compresses) over STARTTLS: a custom SORT and an
    ESEARCH in a selected mailbox come back as sent by imapd."""
    curl = shutil.which("curl")
    if not curl:
        raise Skip("curl not installed")
    i = inst()
    i.create("user.alice.Curl")
    deliver(i, ALICE, "Curl", [message(n, subject="s%d" % (3 - n))
                               for n in range(3)])
    url = "imap://127.0.0.1:%d/INBOX.Curl" % i.tcp_port
    for req, want in (("SORT (SUBJECT) UTF-8 ALL", "* SORT 3 2 1"),
                      ("SEARCH RETURN (MIN COUNT) ALL",
                       '* ESEARCH (TAG "')):
        r = subprocess.run([curl, "-s", "-S", "--ssl-reqd", "-k",
                            "--max-time", "60", "-u",
                            "%s:%s" % (ALICE, ALICE_PW), "-X", req, url],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=120)
        out = r.stdout.decode(errors="replace")
        check(r.returncode == 0 and want in out, "curl %s: exit %d: %s"
              % (req, r.returncode, out))
    check("MIN 1 COUNT 3" in out, "curl ESEARCH: %s" % out)


def finish():
    global _inst
    if _inst is not None:
        check(not _inst.worker_trouble(),
              "worker trouble: %s" % _inst.worker_trouble())
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_compress_capability_states,
        test_compress_tls_and_plain,
        test_compress_starttls_refused_after,
        test_compress_bomb_and_garbage,
        test_compress_idle,
        test_imaplib_unaffected,
        test_esearch_rfc4731,
        test_searchres_rfc5182,
        test_partial_rfc5267,
        test_within_rfc5032,
        test_sort_rfc5256,
        test_thread_rfc5256,
        test_curl_sort_esearch,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
