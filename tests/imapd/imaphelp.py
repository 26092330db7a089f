"""imaphelp.py - what the imapd tests share: a private master running
imapd (a plain "imap" listener with STARTTLS and an "imaps" listener
with implicit TLS, both on 127.0.0.1) with its own imapd.conf, mailbox
list and spool, built on lmtphelp.Instance (configuration, certificate,
sasldb, mbtool, log checks, cleanup); a raw IMAP client that sends
exactly the bytes given and reads every response line; and the runner.

Environment: top_builddir, TEST_TMPDIR (see ../testlib.py), IMAP_TESTS
(space separated test names: run only those), LMTP_KEEP=1 (keep the
temporary directories).  Python 3 standard library only.
"""
import imaplib
import os
import re
import socket
import ssl
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, os.path.join(TESTS, "lmtpd")]
from testlib import (MASTER, TOP_BUILDDIR, Fail, check,  # noqa: E402
                     free_port, run_tests, service_line, wait_until)
from lmtphelp import (LMTPD, MBTOOL, SERVERNAME, Conn,  # noqa: E402,F401
                      Instance, crc32c, make_message, make_sasldb,
                      transaction)
from imapgrammar import Assembler, validate, validate_greeting  # noqa: E402

IMAPD_DIR = os.path.join(TOP_BUILDDIR, "imapd")
IMAPD = os.path.join(IMAPD_DIR, "imapd")


class ImapInstance(Instance):
    """A master + imapd.  Use as a context manager (see lmtphelp)."""

    TAG_VAR = "IMAP_TEST_TAG"

    def write_cyrus_conf(self, prefork=1, maxchild=10, imaps=True,
                         lmtp=True):
        self.tcp_port = free_port()
        lines = [service_line("imap", "imapd", "127.0.0.1:%d"
                              % self.tcp_port, prefork=prefork,
                              maxchild=maxchild)]
        if lmtp:
            # lmtpd in the same master, on a UNIX socket (trusted)
            lines.append(service_line("lmtpunix", LMTPD, self.unix_socket,
                                      prefork=0, maxchild=maxchild))
        if imaps:
            self.imaps_port = free_port()
            lines.append(service_line("imaps", "imapd -s", "127.0.0.1:%d"
                                      % self.imaps_port, prefork=0,
                                      maxchild=maxchild))
        with open(self.cyrus_conf, "w") as f:
            f.write("SERVICES {\n" + "".join(lines) + "}\n")
        return self

    def start(self, ready=1, timeout=60):
        self.spawn([MASTER, "-D", "-l", "-C", self.imapd_conf, "-M",
                    self.cyrus_conf, "-p", self.pidfile, "-S", IMAPD_DIR,
                    "-s", self.statusfile, "-T", "10"])
        ok = wait_until(lambda: not self.running()
                        or (self.svc_int("imap", "ready") or 0) >= ready,
                        timeout)
        if not self.running():
            raise Fail("master exited at start with status %s: %s"
                       % (self.proc.returncode, self.log()[-600:]))
        check(ok, "imap: fewer than %d ready children %d s after start "
              "(log: %s)" % (ready, timeout, self.log()[-600:]))
        return self

    def addr(self):
        return ("127.0.0.1", self.tcp_port)

    def lmtp_deliver(self, user, message, folder=None):
        """Deliver one message to user (user+folder) through lmtpd."""
        rcpt = user + ("+" + folder if folder else "")
        with Conn(self.unix_socket) as c:
            c.reply()
            mr, rr, dr, per = transaction(c, "sender@example.com", [rcpt],
                                          message, lhlo="test.example.com")
            check(len(per) == 1 and per[0].code == 250,
                  "LMTP delivery to %s: %r %r %r %r" % (rcpt, mr, rr, dr,
                                                        per))
            c.cmd("QUIT")


class _GrammarTee:
    """Mixin for imaplib.IMAP4 / IMAP4_SSL: every byte imaplib reads from
    the server (lines and literals) is also cut into whole responses,
    each checked against the RFC 3501 grammar (imapgrammar.py), the first
    as a greeting; a malformed one fails the test at once."""

    def _tee(self, data):
        if not hasattr(self, "_gbuf"):
            self._gbuf = b""
            self._gneed = 0
            self._gcur = b""
            self._ggreeted = False
            self.responses_checked = 0
        self._gbuf += data
        while True:
            if self._gneed:
                take = min(self._gneed, len(self._gbuf))
                self._gcur += self._gbuf[:take]
                self._gbuf = self._gbuf[take:]
                self._gneed -= take
                if self._gneed:
                    return
            i = self._gbuf.find(b"\r\n")
            if i < 0:
                return
            line, self._gbuf = self._gbuf[:i], self._gbuf[i + 2:]
            self._gcur += line
            m = re.search(rb"\{(\d+)\+?\}$", line)
            if m and not self._gcur.startswith(b"+"):
                self._gneed = int(m.group(1))
                self._gcur += b"\r\n"
                continue
            resp, self._gcur = self._gcur, b""
            # grammar_utf8: the test enabled UTF8=ACCEPT (RFC 6855)
            utf8 = getattr(self, "grammar_utf8", False)
            if self._ggreeted:
                why = validate(resp, utf8)
            else:
                why = validate_greeting(resp, utf8)
                self._ggreeted = True
            self.responses_checked += 1
            check(why is None, "imaplib: response violates the IMAP "
                  "grammar: %s\nresponse: %r" % (why, resp[:500]))

    def readline(self):
        line = super().readline()
        self._tee(line)
        return line

    def read(self, size):
        data = super().read(size)
        self._tee(data)
        return data


class IMAP4(_GrammarTee, imaplib.IMAP4):
    """imaplib.IMAP4 with every server response grammar-checked."""


class IMAP4_SSL(_GrammarTee, imaplib.IMAP4_SSL):
    """imaplib.IMAP4_SSL with every server response grammar-checked."""


class ConnectionClosed(Exception):
    pass


class Raw:
    """A raw IMAP client: send() bytes as given, line() one response line
    (bytes, without CRLF), until_tagged(tag) every line up to and
    including the tagged one.  Every response read is checked against
    the RFC 3501 grammar (imapgrammar.py), the first one as a greeting;
    a malformed one is a test failure."""

    def __init__(self, addr, timeout=20.0):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.buf = b""
        self.asm = Assembler()
        self.greeted = False
        self.utf8 = False       # set after ENABLE UTF8=ACCEPT (RFC 6855)

    def _check(self, resp):
        if self.greeted:
            why = validate(resp, self.utf8)
        else:
            why = validate_greeting(resp, self.utf8)
            self.greeted = True
        check(why is None, "response violates the IMAP grammar: %s\n"
              "response: %r" % (why, resp))

    def _recv(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionClosed("connection closed by the server")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._recv()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def line(self):
        line = self._line()
        resp = self.asm.feed(line)
        if resp is not None:
            self._check(resp)
        return line

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def until_tagged(self, tag):
        out = []
        t = tag.encode() + b" "
        while True:
            ln = self.line()
            out.append(ln)
            if ln.startswith(t):
                return out

    def cmd(self, tag, text):
        self.send("%s %s\r\n" % (tag, text))
        return self.until_tagged(tag)

    def _read(self, n):
        while len(self.buf) < n:
            self._recv()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def response(self):
        """One response with its literals: the line, and for each {n} at
        its end the n bytes and the rest of the response, verbatim."""
        out = b""
        while True:
            ln = self._line()
            out += ln
            m = re.search(rb"\{(\d+)\}$", ln)
            if not m or out.startswith(b"+"):
                self._check(out)
                return out
            out += b"\r\n" + self._read(int(m.group(1)))

    def lcmd(self, tag, text):
        """cmd() for responses that may hold literals (see response())."""
        self.send("%s %s\r\n" % (tag, text))
        out = []
        t = tag.encode() + b" "
        while True:
            r = self.response()
            out.append(r)
            if r.startswith(t):
                return out

    def starttls(self, tag="st"):
        r = self.cmd(tag, "STARTTLS")
        check(r[-1].startswith(tag.encode() + b" OK"), "STARTTLS: %r" % r)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")
        self.buf = b""

    def at_eof(self, timeout=30.0):
        self.sock.settimeout(timeout)
        try:
            while True:
                self._recv()
        except ConnectionClosed:
            return True
        except (socket.timeout, OSError):
            return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def make_sasldb_extra(instance, user, password):
    """Add user to the instance's sasldb, in the servername's realm."""
    make_sasldb(instance.sasldb, user, password, [SERVERNAME])


def tls_context():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


# RFC 3501 grammar of the response lines the tests look at
RE_LIST = re.compile(rb'^\* (LIST|LSUB) \(((?:\\[A-Za-z]+ ?)*)\) '
                     rb'(?:"[./]"|NIL) ("(?:[^"\\\r\n]|\\["\\])*"|[^ ()"]+)$')


def parse_list(lines, what="LIST"):
    """{name: set(flags)} from LIST/LSUB lines; Fail on a malformed one."""
    out = {}
    for ln in lines:
        if not ln.startswith(b"* " + what.encode()):
            continue
        m = RE_LIST.match(ln)
        check(m is not None, "malformed %s line %r" % (what, ln))
        name = m.group(3)
        if name.startswith(b'"'):
            name = re.sub(rb'\\(.)', rb'\1', name[1:-1])
        out[name.decode()] = set(m.group(2).split())
        out[name.decode()] = {f.decode() for f in out[name.decode()]}
    return out


def run_imap_tests(tests):
    return run_tests(tests, "IMAP_TESTS", (MASTER, IMAPD, MBTOOL, LMTPD))
