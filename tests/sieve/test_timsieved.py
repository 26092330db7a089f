#!/usr/bin/env python3
"""test_timsieved.py - the ManageSieve server (RFC 5804) run by a private
master, with raw sessions and with real clients.

One instance (tests/imapd/imaphelp.py): imapd on 127.0.0.1 and a "sieve"
service written as Cyrus writes it (cmd="timsieved": the master maps it
to ours), a self-signed certificate, a sasldb with two users (cmd="timsieved -U
50": the mapping keeps -U, which timsieved accepts),
allowplaintext off, sieve_maxscripts 4, sieve_maxscriptsize 2 (KiB),
prelogin_timeout 5.

- raw sessions: the greeting and capabilities before and after STARTTLS,
  AUTHENTICATE PLAIN (initial response, challenge/response, cancel,
  wrong password, no PLAIN without TLS), every command and its error
  codes (NONEXISTENT, ACTIVE, ALREADYEXISTS, QUOTA/MAXSCRIPTS,
  QUOTA/MAXSIZE), both literal forms, the RFC 5804 examples, bad syntax,
  an overlong line, oversized literals, the prelogin timeout; the worker
  survives each (a new session works) and the log shows no crash;
- the files: SIEVEDIR/H/USER/NAME.script and the defaultbc symlink,
  domain users under SIEVEDIR/domain/DH/DOMAIN/H/USER (mbtool sieve);
- sieve-connect (Debian) over STARTTLS + PLAIN, trusting the test's
  certificate with --tlscafile: upload, list, activate, download (same
  bytes), deactivate, delete, and a bad script refused with its line;
- Cyrus's sivtest (cyrus-clients) when installed;
- the master's SIGTERM: an idle session gets BYE (the last test).

Environment: see ../imapd/imaphelp.py (SIEVE_TESTS picks tests).
"""
import base64
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "imapd"))
from imaphelp import (IMAPD, MBTOOL, ImapInstance,  # noqa: E402
                      make_sasldb_extra, service_line)
from testlib import (MASTER, TOP_BUILDDIR, Fail, Skip, check,  # noqa: E402
                     free_port, run_tests, wait_until)

TIMSIEVED = os.path.join(TOP_BUILDDIR, "timsieved", "timsieved")
SIEVE_CONNECT = shutil.which("sieve-connect") or "/usr/bin/sieve-connect"
SIVTEST = "/usr/lib/cyrus/bin/sivtest"
USER, PASSWORD = "tess", "t3ss-pw"
USER2, PASSWORD2 = "Quentin", "qu-pw"

GOOD = (b'require ["fileinto"];\r\n'
        b'if header :contains "Subject" "[list]" {\r\n'
        b'    fileinto "INBOX.list";\r\n}\r\n')
BAD = b'require "fileinto";\r\nkeep;\r\nfileint "x";\r\n'

_inst = None


class SieveInstance(ImapInstance):
    def write_cyrus_conf(self):
        self.tcp_port = free_port()
        self.sieve_port = free_port()
        lines = [service_line("imap", "imapd", "127.0.0.1:%d"
                              % self.tcp_port, prefork=0, maxchild=5),
                 service_line("sieve", "timsieved -U 50", "127.0.0.1:%d"
                              % self.sieve_port, prefork=1, maxchild=10)]
        with open(self.cyrus_conf, "w") as f:
            f.write("SERVICES {\n" + "".join(lines) + "}\n")
        return self

    def start(self, timeout=60):
        self.spawn([MASTER, "-D", "-l", "-C", self.imapd_conf, "-M",
                    self.cyrus_conf, "-p", self.pidfile, "-s",
                    self.statusfile, "-T", "10"])
        ok = wait_until(lambda: not self.running()
                        or (self.svc_int("sieve", "ready") or 0) >= 1,
                        timeout)
        if not self.running():
            raise Fail("master exited at start: %s" % self.log()[-600:])
        check(ok, "sieve: no ready child %d s after start (log: %s)"
              % (timeout, self.log()[-600:]))
        return self

    def sieve_addr(self):
        return ("127.0.0.1", self.sieve_port)

    def sievedir(self):
        return os.path.join(self.confdir, "sieve")


def inst():
    global _inst
    if _inst is None:
        i = SieveInstance("timsieved", tls=True, sasl=(USER, PASSWORD),
                          conf={"sieve_maxscripts": "4",
                                "sieve_maxscriptsize": "2",
                                "prelogin_timeout": "5",
                                "virtdomains": "userid"})
        try:
            make_sasldb_extra(i, USER2, PASSWORD2)
            i.write_cyrus_conf()
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


class Closed(Exception):
    pass


class MS:
    """A raw ManageSieve client: send() bytes as given; response() reads
    up to and including the OK/NO/BYE line: (data items, status, code,
    text)."""

    def __init__(self, addr, timeout=20.0):
        self.sock = socket.create_connection(addr, timeout=timeout)
        self.buf = b""

    def _recv(self):
        data = self.sock.recv(65536)
        if not data:
            raise Closed("connection closed by the server")
        self.buf += data

    def line(self):
        while b"\r\n" not in self.buf:
            self._recv()
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln

    def read(self, n):
        while len(self.buf) < n:
            self._recv()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def item(self):
        """One line with its literals inlined."""
        ln = self.line()
        while True:
            m = re.search(rb"\{(\d+)\}$", ln)
            if not m:
                return ln
            ln = ln[:m.start()] + b"{}" + self.read(int(m.group(1)))
            ln += b"\x00" + self.line()

    def response(self):
        items = []
        while True:
            it = self.item()
            m = re.match(rb'^(OK|NO|BYE)(?: \(([^)]*)\))?(?: (.*))?$', it,
                         re.S)
            if m:
                text = m.group(3) or b""
                if text.startswith(b'"'):
                    text = re.sub(rb'\\(.)', rb'\1', text[1:-1])
                elif text.startswith(b"{}"):
                    text = text[2:].split(b"\x00")[0]
                return (items, m.group(1).decode(),
                        (m.group(2) or b"").decode(), text.decode())
            items.append(it)

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def cmd(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.send(data + b"\r\n")
        return self.response()

    def starttls(self, cafile=None):
        r = self.cmd("STARTTLS")
        check(r[1] == "OK", "STARTTLS: %r" % (r,))
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        self.sock = ctx.wrap_socket(self.sock, server_hostname="localhost")
        self.buf = b""
        return self.response()      # the capabilities again

    def auth_plain(self, user, password):
        blob = base64.b64encode(b"\0" + user.encode() + b"\0"
                                + password.encode()).decode()
        return self.cmd('AUTHENTICATE "PLAIN" "%s"' % blob)

    def at_eof(self, timeout=30.0):
        self.sock.settimeout(timeout)
        try:
            while True:
                self._recv()
        except Closed:
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


def caps(items):
    out = {}
    for it in items:
        m = re.match(rb'^"([^"]*)"(?: "([^"]*)")?$', it)
        check(m is not None, "malformed capability line %r" % it)
        out[m.group(1).decode()] = (m.group(2) or b"").decode()
    return out


def session(user=USER, password=PASSWORD):
    """A logged-in session over STARTTLS."""
    c = MS(inst().sieve_addr())
    g = c.response()
    check(g[1] == "OK", "greeting: %r" % (g,))
    c.starttls()
    r = c.auth_plain(user, password)
    check(r[1] == "OK", "AUTHENTICATE PLAIN: %r" % (r,))
    return c


def lit(data):
    return b"{%d+}\r\n" % len(data) + data


def user_dir(user):
    return os.path.join(inst().sievedir(), user[0].lower(), user)


def clean(c):
    """Remove every script of the session's user."""
    c.cmd('SETACTIVE ""')
    items, st, _, _ = c.cmd("LISTSCRIPTS")
    for it in items:
        name = re.match(rb'^"([^"]*)"', it).group(1).decode()
        check(c.cmd('DELETESCRIPT "%s"' % name)[1] == "OK", "delete")


def no_trouble():
    t = inst().worker_trouble()
    check(not t, "worker trouble: %s" % t)


# ---- tests -----------------------------------------------------------------

def test_greeting_and_starttls():
    with MS(inst().sieve_addr()) as c:
        items, st, code, text = c.response()
        check(st == "OK", "greeting status %r" % st)
        cp = caps(items)
        check(cp.get("IMPLEMENTATION") == "cyrusdeliver", "impl %r" % cp)
        check(cp.get("VERSION") == "1.0", "VERSION: %r" % cp)
        check("STARTTLS" in cp, "no STARTTLS before TLS: %r" % cp)
        check("PLAIN" not in cp.get("SASL", "").split(),
              "PLAIN offered without TLS: %r" % cp)
        check(cp.get("MAXREDIRECTS") == "4", "MAXREDIRECTS: %r" % cp)
        sieve = cp.get("SIEVE", "").split()
        for ext in ("fileinto", "vacation", "variables", "envelope"):
            check(ext in sieve, "SIEVE lacks %s: %r" % (ext, sieve))
        # PLAIN refused without TLS, with ENCRYPT-NEEDED
        r = c.auth_plain(USER, PASSWORD)
        check(r[1] == "NO" and r[2] == "ENCRYPT-NEEDED",
              "PLAIN without TLS: %r" % (r,))
        items, st, _, _ = c.starttls()
        cp = caps(items)
        check(st == "OK" and "STARTTLS" not in cp and
              "PLAIN" in cp.get("SASL", "").split(),
              "capabilities after STARTTLS: %r %r" % (st, cp))
        r = c.cmd("STARTTLS")
        check(r[1] == "NO", "second STARTTLS: %r" % (r,))
        r = c.auth_plain(USER, PASSWORD)
        check(r[1] == "OK", "PLAIN after TLS: %r" % (r,))
        items, st, _, _ = c.cmd("CAPABILITY")
        cp = caps(items)
        check(st == "OK" and cp.get("OWNER") == USER and "SASL" not in cp,
              "capabilities after login: %r" % cp)
        r = c.cmd("LOGOUT")
        check(r[1] == "OK", "LOGOUT: %r" % (r,))
        check(c.at_eof(), "connection open after LOGOUT")
    check(re.search(r"timsieved: login user=<%s> mech=<PLAIN> peer=<127"
                    r"\.0\.0\.1:\d+> tls=<TLSv1\.[23] " % USER,
                    inst().log()), "no login line in the log")
    check(re.search(r"SERVICES entry=<sieve> cmd=<timsieved -U 50> "
                    r"runs=<\S*/timsieved/timsieved -C \S+ -U 50>",
                    inst().log()), "Cyrus's timsieved not mapped to ours")


def test_authenticate_forms():
    with MS(inst().sieve_addr()) as c:
        c.response()
        c.starttls()
        r = c.auth_plain(USER, "wrong")
        check(r[1] == "NO", "wrong password: %r" % (r,))
        # no initial response: an empty challenge, then the response
        c.send(b'AUTHENTICATE "PLAIN"\r\n')
        check(c.line() == b'""', "challenge")
        c.send(b'"*"\r\n')
        r = c.response()
        check(r[1] == "NO", "cancel: %r" % (r,))
        c.send(b'AUTHENTICATE "PLAIN"\r\n')
        check(c.line() == b'""', "challenge")
        blob = base64.b64encode(b"\0%s\0%s" % (USER2.encode(),
                                               PASSWORD2.encode()))
        c.send(b"{%d+}\r\n%s\r\n" % (len(blob), blob))
        r = c.response()
        check(r[1] == "OK", "PLAIN with a literal response: %r" % (r,))
        r = c.auth_plain(USER2, PASSWORD2)
        check(r[1] == "NO", "second AUTHENTICATE: %r" % (r,))
        r = c.cmd("UNAUTHENTICATE")
        check(r[1] == "OK", "UNAUTHENTICATE: %r" % (r,))
        r = c.cmd("LISTSCRIPTS")
        check(r[1] == "NO", "LISTSCRIPTS after UNAUTHENTICATE: %r" % (r,))
        r = c.auth_plain(USER, PASSWORD)
        check(r[1] == "OK", "login again: %r" % (r,))


def test_script_commands():
    with session() as c:
        clean(c)
        # PUTSCRIPT with both literal forms, HAVESPACE, LISTSCRIPTS
        r = c.cmd(b'HAVESPACE "main" %d' % len(GOOD))
        check(r[1] == "OK", "HAVESPACE: %r" % (r,))
        r = c.cmd(b'PUTSCRIPT "main" ' + lit(GOOD))
        check(r[1] == "OK", "PUTSCRIPT {n+}: %r" % (r,))
        c.send(b'PUTSCRIPT "other" {%d}\r\n%s\r\n' % (len(GOOD), GOOD))
        r = c.response()
        check(r[1] == "OK", "PUTSCRIPT {n}: %r" % (r,))
        items, st, _, _ = c.cmd("LISTSCRIPTS")
        check(st == "OK" and sorted(items) == [b'"main"', b'"other"'],
              "LISTSCRIPTS: %r" % items)
        # the compiled form beside each script (sieve_bc.h)
        d = user_dir(USER)
        for n in ("main", "other"):
            with open(os.path.join(d, n + ".bc"), "rb") as f:
                check(f.read(8) == b"\x7fSIEVBC\n",
                      "%s.bc: not a compiled form" % n)
        # SETACTIVE writes a missing one (a script stored before)
        os.unlink(os.path.join(d, "main.bc"))
        # SETACTIVE, the link
        r = c.cmd('SETACTIVE "nosuch"')
        check(r[1] == "NO" and r[2] == "NONEXISTENT", "SETACTIVE: %r"
              % (r,))
        r = c.cmd('SETACTIVE "main"')
        check(r[1] == "OK", "SETACTIVE: %r" % (r,))
        d = user_dir(USER)
        link = os.path.join(d, "defaultbc")
        check(os.readlink(link) == "main.script", "defaultbc -> %r"
              % os.readlink(link))
        with open(os.path.join(d, "main.script"), "rb") as f:
            check(f.read() == GOOD, "file content differs")
        check(os.path.exists(os.path.join(d, "main.bc")),
              "SETACTIVE did not write the compiled form")
        items, st, _, _ = c.cmd("LISTSCRIPTS")
        check(b'"main" ACTIVE' in items and b'"other"' in items,
              "ACTIVE mark: %r" % items)
        # GETSCRIPT: the same bytes, as a literal
        items, st, _, _ = c.cmd('GETSCRIPT "main"')
        check(st == "OK" and items == [b"{}" + GOOD + b"\x00"],
              "GETSCRIPT: %r" % items)
        r = c.cmd('GETSCRIPT "nosuch"')
        check(r[1] == "NO" and r[2] == "NONEXISTENT", "GETSCRIPT: %r" % (r,))
        # DELETESCRIPT of the active one, of a missing one
        r = c.cmd('DELETESCRIPT "main"')
        check(r[1] == "NO" and r[2] == "ACTIVE", "DELETE active: %r" % (r,))
        r = c.cmd('DELETESCRIPT "nosuch"')
        check(r[1] == "NO" and r[2] == "NONEXISTENT", "DELETE: %r" % (r,))
        # RENAMESCRIPT: taken name, missing one, the active one moves
        r = c.cmd('RENAMESCRIPT "main" "other"')
        check(r[1] == "NO" and r[2] == "ALREADYEXISTS", "RENAME: %r" % (r,))
        r = c.cmd('RENAMESCRIPT "nosuch" "x"')
        check(r[1] == "NO" and r[2] == "NONEXISTENT", "RENAME: %r" % (r,))
        r = c.cmd('RENAMESCRIPT "main" "renamed"')
        check(r[1] == "OK", "RENAME: %r" % (r,))
        check(os.readlink(link) == "renamed.script" and
              not os.path.exists(os.path.join(d, "main.script")),
              "rename of the active script: link %r" % os.readlink(link))
        check(os.path.exists(os.path.join(d, "renamed.bc")) and
              not os.path.exists(os.path.join(d, "main.bc")),
              "the compiled form did not follow the rename")
        # SETACTIVE "" removes the link; then the delete works
        r = c.cmd('SETACTIVE ""')
        check(r[1] == "OK" and not os.path.lexists(link),
              "SETACTIVE \"\": %r" % (r,))
        r = c.cmd('DELETESCRIPT "renamed"')
        check(r[1] == "OK" and
              not os.path.exists(os.path.join(d, "renamed.script")) and
              not os.path.exists(os.path.join(d, "renamed.bc")),
              "DELETESCRIPT: %r" % (r,))
        # NOOP with a tag, case-insensitive names
        r = c.cmd('noop "STARTTLS-SYNC-42"')
        check(r[1] == "OK" and r[2] == 'TAG "STARTTLS-SYNC-42"',
              "NOOP tag: %r" % (r,))
        clean(c)
    no_trouble()


def test_bad_scripts_refused():
    with session() as c:
        clean(c)
        r = c.cmd(b'PUTSCRIPT "bad" ' + lit(BAD))
        check(r[1] == "NO" and r[3].startswith("line 3:") and
              "fileint" in r[3], "bad script: %r" % (r,))
        check(not os.path.exists(os.path.join(user_dir(USER),
                                              "bad.script")),
              "a refused script was stored")
        r = c.cmd(b"CHECKSCRIPT " + lit(BAD))
        check(r[1] == "NO" and r[3].startswith("line 3:"), "CHECKSCRIPT: %r"
              % (r,))
        r = c.cmd(b"CHECKSCRIPT " + lit(GOOD))
        check(r[1] == "OK", "CHECKSCRIPT good: %r" % (r,))
        # an extension not supported
        r = c.cmd(b"CHECKSCRIPT " + lit(b'require "notify";\r\n'))
        check(r[1] == "NO" and "line 1" in r[3], "unknown ext: %r" % (r,))
        items, st, _, _ = c.cmd("LISTSCRIPTS")
        check(items == [], "LISTSCRIPTS after refusals: %r" % items)


INCLUDING = (b'require ["include", "fileinto", "editheader", "special-use"];\r\n'
             b'include :personal "notyet";\r\n'
             b'include :optional :global "absent";\r\n'
             b'addheader "X-Filtered" "yes";\r\n'
             b'fileinto :specialuse "\\\\Junk" "Spam";\r\n')


def test_include_scripts():
    """Scripts that include others are accepted whether the included
    scripts exist or not (a missing one is a runtime error, RFC 6609
    3.2), and the SIEVE capability offers include, editheader and
    special-use."""
    with session() as c:
        clean(c)
        items, st, _, _ = c.cmd("CAPABILITY")
        exts = caps(items).get("SIEVE", "").split()
        for e in ("include", "editheader", "special-use"):
            check(e in exts, "SIEVE capability lacks %s: %r" % (e, exts))
        r = c.cmd(b"CHECKSCRIPT " + lit(INCLUDING))
        check(r[1] == "OK", "CHECKSCRIPT with include: %r" % (r,))
        r = c.cmd(b'PUTSCRIPT "main" ' + lit(INCLUDING))
        check(r[1] == "OK", "PUTSCRIPT with include: %r" % (r,))
        r = c.cmd(b'PUTSCRIPT "notyet" ' + lit(b'require "include";\r\n'
                                                b'return;\r\n'))
        check(r[1] == "OK", "PUTSCRIPT included: %r" % (r,))
        check(c.cmd('SETACTIVE "main"')[1] == "OK", "SETACTIVE")
        # include's name is checked at compile time where it is constant
        r = c.cmd(b"CHECKSCRIPT " + lit(b'require "include";\r\n'
                                        b'include "a/b";\r\n'))
        check(r[1] == "NO" and "line 2" in r[3], "bad name: %r" % (r,))
        clean(c)
    no_trouble()


def test_quotas():
    with session() as c:
        clean(c)
        big = b"keep;\r\n" + b"#" * 2100 + b"\r\n"
        r = c.cmd('HAVESPACE "x" 999999')
        check(r[1] == "NO" and r[2] == "QUOTA/MAXSIZE", "HAVESPACE: %r"
              % (r,))
        r = c.cmd(b'PUTSCRIPT "big" ' + lit(big))
        check(r[1] == "NO" and r[2] == "QUOTA/MAXSIZE", "big: %r" % (r,))
        for n in range(4):
            r = c.cmd(b'PUTSCRIPT "s%d" ' % n + lit(b"keep;\r\n"))
            check(r[1] == "OK", "PUTSCRIPT s%d: %r" % (n, r))
        r = c.cmd(b'PUTSCRIPT "s4" ' + lit(b"keep;\r\n"))
        check(r[1] == "NO" and r[2] == "QUOTA/MAXSCRIPTS", "5th: %r" % (r,))
        r = c.cmd('HAVESPACE "s4" 10')
        check(r[1] == "NO" and r[2] == "QUOTA/MAXSCRIPTS", "HAVESPACE: %r"
              % (r,))
        # replacing one is no new script
        r = c.cmd('HAVESPACE "s0" 10')
        check(r[1] == "OK", "HAVESPACE existing: %r" % (r,))
        r = c.cmd(b'PUTSCRIPT "s0" ' + lit(b"discard;\r\n"))
        check(r[1] == "OK", "replace: %r" % (r,))
        clean(c)


def test_syntax_and_limits():
    with session() as c:
        for bad, what in ((b"FROBNICATE", "unknown command"),
                          (b'PUTSCRIPT "x', "unterminated string"),
                          (b'GETSCRIPT "a" "b"', "too many arguments"),
                          (b"GETSCRIPT abc", "atom for a string"),
                          (b'GETSCRIPT "a/b"', "slash in a name"),
                          (b'GETSCRIPT ".hidden"', "dot name"),
                          (b'HAVESPACE "x" 12a', "bad number"),
                          (b'PUTSCRIPT "x" {3+}x', "literal not at end"),
                          (b'"quoted first"', "no command name")):
            r = c.cmd(bad)
            check(r[1] == "NO", "%s: %r" % (what, r))
        # a literal bigger than any script: read, thrown away, NO
        junk = b"x" * 100000
        r = c.cmd(b'PUTSCRIPT "x" ' + lit(junk))
        check(r[1] == "NO" and r[2] == "QUOTA/MAXSIZE", "big literal: %r"
              % (r,))
        # a syntax error before a literal: the literal is skipped too
        r = c.cmd(b'GETSCRIPT "a\\q" ' + lit(b"NOOP\r\n"))
        check(r[1] == "NO", "bad escape: %r" % (r,))
        r = c.cmd("NOOP")
        check(r[1] == "OK", "session after errors: %r" % (r,))
    # an absurd literal ends the session with BYE
    with session() as c:
        c.send(b'PUTSCRIPT "x" {99999999999+}\r\n')
        r = c.response()
        check(r[1] == "BYE", "absurd literal: %r" % (r,))
        check(c.at_eof(), "open after BYE")
    # an overlong line: BYE, the worker lives on
    with MS(inst().sieve_addr()) as c:
        c.response()
        c.send(b"NOOP " + b"a" * 20000 + b"\r\n")
        r = c.response()
        check(r[1] == "BYE" and "too long" in r[3], "long line: %r" % (r,))
    with session() as c:
        check(c.cmd("NOOP")[1] == "OK", "a new session after the errors")
    no_trouble()


def test_byte_at_a_time():
    """A command and its literal arriving one byte per write."""
    with session() as c:
        clean(c)
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for b in b'PUTSCRIPT "slow" ' + lit(GOOD) + b"\r\n":
            c.send(bytes([b]))
        r = c.response()
        check(r[1] == "OK", "PUTSCRIPT byte by byte: %r" % (r,))
        items, st, _, _ = c.cmd('GETSCRIPT "slow"')
        check(items == [b"{}" + GOOD + b"\x00"], "GETSCRIPT: %r" % items)
        clean(c)


def test_prelogin_timeout():
    t0 = time.monotonic()
    with MS(inst().sieve_addr(), timeout=60) as c:
        c.response()
        r = c.response()
        check(r[1] == "BYE" and "Idle" in r[3], "timeout: %r" % (r,))
    check(time.monotonic() - t0 >= 4.5, "BYE came too early")


def test_rfc5804_examples():
    """The exchanges of RFC 5804 sections 2.6 to 2.11, adapted."""
    with session() as c:
        clean(c)
        script = (b'#comment\r\nInvalidSieveCommand;\r\n')
        r = c.cmd(b'Putscript "foo" ' + lit(script))
        check(r[1] == "NO" and r[3].startswith("line 2:"),
              "2.6 invalid script: %r" % (r,))
        r = c.cmd(b'Putscript "mysievescript" ' + lit(GOOD))
        check(r[1] == "OK", "2.6: %r" % (r,))
        r = c.cmd(b'Putscript "myforwards" ' + lit(
            b'redirect "111@example.net";\r\n'))
        check(r[1] == "OK", "2.6: %r" % (r,))
        r = c.cmd('Setactive "mysievescript"')
        check(r[1] == "OK", "2.8: %r" % (r,))
        items, st, _, _ = c.cmd("Listscripts")
        check(sorted(items) == [b'"myforwards"',
                                b'"mysievescript" ACTIVE'],
              "2.7: %r" % items)
        r = c.cmd('DeleteScript "mysievescript"')
        check(r[1] == "NO" and r[2] == "ACTIVE", "2.10: %r" % (r,))
        r = c.cmd('Renamescript "myforwards" "mysievescript"')
        check(r[1] == "NO" and r[2] == "ALREADYEXISTS", "2.11.1: %r" % (r,))
        r = c.cmd('Renamescript "myforwards" "foo"')
        check(r[1] == "OK", "2.11.1: %r" % (r,))
        clean(c)


def test_layout_domain_users():
    """mbtool sieve, as the admin, on a domain user and a user whose name
    does not start with a letter: the files where Cyrus has them."""
    i = inst()
    src = os.path.join(i.dir, "vac.siv")
    with open(src, "wb") as f:
        f.write(GOOD)
    for user, rel in (("alice@Example.COM",
                       "domain/e/example.com/a/alice"),
                      ("1bob", "q/1bob"), (USER2, "q/Quentin")):
        out = i.mbtool("sieve", "put", user, "vac", src)
        i.mbtool("sieve", "activate", user, "vac")
        d = os.path.join(i.sievedir(), rel)
        check(os.readlink(os.path.join(d, "defaultbc")) == "vac.script",
              "%s: no link in %s (%r)" % (user, d, out))
        lst = i.mbtool("sieve", "list", user)
        check("vac active" in str(lst), "mbtool sieve list: %r" % (lst,))
        i.mbtool("sieve", "deactivate", user)
        i.mbtool("sieve", "delete", user, "vac")
        check(not os.path.exists(os.path.join(d, "vac.script")),
              "mbtool sieve delete")
    # a bad script is refused by mbtool too
    with open(src, "wb") as f:
        f.write(BAD)
    r = i.mbtool("sieve", "put", USER, "bad", src, check_rc=False)
    check("line 3" in str(r), "mbtool put of a bad script: %r" % (r,))


def _compiled(out):
    m = re.search(r"sieve compile: (\d+) scripts of (\d+) users: (\d+) "
                  r"stored again, (\d+) current, (\d+) failed", out)
    check(m, "mbtool sieve compile printed no counts: %r" % (out,))
    return tuple(int(x) for x in m.groups())


def test_compile_all():
    """mbtool sieve compile stores again every compiled form that is
    missing or damaged, in every user's directory (domain users too),
    leaves current ones alone, and names a script that does not compile
    (exit 1); with a user, that user's scripts only."""
    i = inst()
    src = os.path.join(i.dir, "cmp.siv")
    with open(src, "wb") as f:
        f.write(GOOD)
    dirs = {}
    for user, rel in (("carol@Example.COM", "domain/e/example.com/c/carol"),
                      ("2dan", "q/2dan"), ("erin", "e/erin")):
        i.mbtool("sieve", "put", user, "cmp", src)
        i.mbtool("sieve", "activate", user, "cmp")
        dirs[user] = os.path.join(i.sievedir(), rel)
        check(os.path.exists(os.path.join(dirs[user], "cmp.bc")),
              "%s: no compiled form after put" % user)
    rc, out, err = i.mbtool("sieve", "compile")
    scripts, users, stored, current, failed = _compiled(out)
    check(rc == 0 and failed == 0 and stored == 0 and current == scripts
          and scripts >= 3 and users >= 3,
          "all current: rc %d %r %r" % (rc, out, err))
    # one form gone, one damaged: both stored again, the rest current
    os.unlink(os.path.join(dirs["carol@Example.COM"], "cmp.bc"))
    bad_bc = os.path.join(dirs["2dan"], "cmp.bc")
    with open(bad_bc, "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 16)
    rc, out, err = i.mbtool("sieve", "compile")
    n = _compiled(out)
    check(rc == 0 and n[2] == 2 and n[3] == scripts - 2 and n[4] == 0,
          "after a loss and a damage: rc %d %r %r" % (rc, out, err))
    for user in dirs:
        check(os.path.exists(os.path.join(dirs[user], "cmp.bc")),
              "%s: no compiled form after compile" % user)
    rc, out, err = i.mbtool("sieve", "compile")
    check(_compiled(out)[2] == 0, "a second compile stored again: %r" % (out,))
    # one user only
    os.unlink(os.path.join(dirs["erin"], "cmp.bc"))
    rc, out, err = i.mbtool("sieve", "compile", "erin")
    check(rc == 0 and _compiled(out) == (1, 1, 1, 0, 0),
          "compile erin: rc %d %r %r" % (rc, out, err))
    # a text that does not compile (written past mbtool and timsieved):
    # named with the compiler's line and reason, exit 1, the rest done
    badpath = os.path.join(dirs["erin"], "broken.script")
    with open(badpath, "wb") as f:
        f.write(BAD)
    try:
        rc, out, err = i.mbtool("sieve", "compile", check_rc=False)
        n = _compiled(out)
        check(rc != 0 and n[4] == 1 and n[0] == scripts + 1
              and "broken" in err and "line 3" in err,
              "a broken text: rc %d %r %r" % (rc, out, err))
    finally:
        os.unlink(badpath)
    for user in dirs:
        i.mbtool("sieve", "deactivate", user)
        i.mbtool("sieve", "delete", user, "cmp")


def _sc(args, password=PASSWORD, user=USER, timeout=60):
    i = inst()
    cmd = [SIEVE_CONNECT, "--4", "--server", "localhost", "--port",
           str(i.sieve_port), "--user", user, "--authmech", "PLAIN",
           "--tlscafile", i.cert, "--noclearauth", "--passwordfd", "0"]
    r = subprocess.run(cmd + args, input=(password + "\n").encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, cwd=i.dir)
    return r.returncode, r.stdout.decode(errors="replace")


def test_sieve_connect():
    if not os.access(SIEVE_CONNECT, os.X_OK):
        raise Skip("sieve-connect not installed")
    i = inst()
    with session() as c:
        clean(c)
    local = os.path.join(i.dir, "up.siv")
    with open(local, "wb") as f:
        f.write(GOOD)
    rc, out = _sc(["--localsieve", local, "--remotesieve", "filters",
                   "--upload"])
    check(rc == 0, "upload: rc %d: %s" % (rc, out))
    rc, out = _sc(["--remotesieve", "filters", "--activate"])
    check(rc == 0, "activate: rc %d: %s" % (rc, out))
    rc, out = _sc(["--list"])
    check(rc == 0 and re.search(r'^"filters" ACTIVE$', out, re.M),
          "list: rc %d: %s" % (rc, out))
    down = os.path.join(i.dir, "down.siv")
    rc, out = _sc(["--localsieve", down, "--remotesieve", "filters",
                   "--download"])
    with open(down, "rb") as f:
        check(rc == 0 and f.read() == GOOD, "download: rc %d: %s"
              % (rc, out))
    d = user_dir(USER)
    check(os.readlink(os.path.join(d, "defaultbc")) == "filters.script",
          "link after sieve-connect")
    rc, out = _sc(["--deactivate"])
    check(rc == 0 and not os.path.lexists(os.path.join(d, "defaultbc")),
          "deactivate: rc %d: %s" % (rc, out))
    rc, out = _sc(["--remotesieve", "filters", "--delete"])
    check(rc == 0 and not os.path.exists(os.path.join(d, "filters.script")),
          "delete: rc %d: %s" % (rc, out))
    # a bad script: refused, the line number shown
    with open(local, "wb") as f:
        f.write(BAD)
    rc, out = _sc(["--localsieve", local, "--remotesieve", "bad",
                   "--upload"])
    check(rc != 0 and "line 3" in out, "bad upload: rc %d: %s" % (rc, out))
    check(not os.path.exists(os.path.join(d, "bad.script")),
          "bad script stored")
    # TLS was used and verified against the test's certificate
    check(re.search(r"timsieved: login user=<%s> mech=<PLAIN> .*tls=<TLS"
                    % USER, i.log()), "sieve-connect login not over TLS")
    no_trouble()


def test_sivtest():
    if not os.access(SIVTEST, os.X_OK):
        raise Skip("sivtest (cyrus-clients) not installed")
    i = inst()
    cmd = [SIVTEST, "-t", "", "-a", USER, "-u", USER, "-w", PASSWORD,
           "-m", "PLAIN", "-p", str(i.sieve_port), "127.0.0.1"]
    r = subprocess.run(cmd, input=b"LISTSCRIPTS\r\nLOGOUT\r\n",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    out = r.stdout.decode(errors="replace")
    check("Authenticated" in out and "OK" in out, "sivtest: %s" % out)


def test_shutdown():
    """The master's SIGTERM reaches an idle logged-in session as BYE
    (the last test: it stops the instance)."""
    import signal
    with session() as c:
        check(c.cmd("NOOP")[1] == "OK", "NOOP")
        inst().proc.send_signal(signal.SIGTERM)
        r = c.response()
        check(r[1] == "BYE" and "shutting down" in r[3],
              "SIGTERM: %r" % (r,))
        check(c.at_eof(), "open after BYE")
    problems = inst().stop()
    check(not problems, "stop: %s" % problems)


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_tests([
        test_greeting_and_starttls,
        test_authenticate_forms,
        test_script_commands,
        test_bad_scripts_refused,
        test_include_scripts,
        test_quotas,
        test_syntax_and_limits,
        test_byte_at_a_time,
        test_prelogin_timeout,
        test_rfc5804_examples,
        test_layout_domain_users, test_compile_all,
        test_sieve_connect,
        test_sivtest,
        test_shutdown,
    ], "SIEVE_TESTS", (MASTER, TIMSIEVED, IMAPD, MBTOOL))
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
