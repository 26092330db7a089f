#!/usr/bin/env python3
"""test_imapext.py - imapd's protocol extensions end to end under the
real master: COMPRESS=DEFLATE (RFC 4978), ESEARCH (RFC 4731), SEARCHRES
(RFC 5182) and WITHIN (RFC 5032).

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
import sys
import os
import time
import zlib

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, ImapInstance, Raw, ConnectionClosed,  # noqa: E402
                      check, make_sasldb_extra, run_imap_tests, tls_context)

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
            data = self.zout.compress(data) + self.zout.flush(zlib.Z_SYNC_FLUSH)
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
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
