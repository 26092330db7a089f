#!/usr/bin/env python3
"""test_flagsync.py - which IMAP commands wait for the disk.

With imapd.conf's spool_sync_flags off (the default) a change of flags
(STORE, \\Seen) is not synced before its reply: the index record and
header go to the page cache, the seen file's commit is ordered but its
last fdatasync skipped.  An APPEND is still durable before its OK, an
EXPUNGE costs one sync of the index, and the flag changes a session left
unsynced are synced after its LOGOUT reply, when the session has been
idle for a second, and when it starts IDLE.  With spool_sync_flags: yes a STORE syncs the index
before its reply.  Each case traces the session's imapd with strace
(-y: the file of each descriptor) and counts the sync calls per file.

Environment: see imaphelp.py.
"""
import os
import re
import subprocess
import sys
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (ImapInstance, Raw, check, make_message,  # noqa: E402
                      run_imap_tests, wait_until)
from testlib import Skip  # noqa: E402

USER, PW = "fsuser", "fs-pw"
STRACE = "/usr/bin/strace"
SYNC_RE = re.compile(r"^(fsync|fdatasync|syncfs)\((\d+)<([^>]*)>")

_insts = {}


def inst(sync_flags="no"):
    if sync_flags not in _insts:
        i = ImapInstance("flagsync-" + sync_flags,
                         conf={"allowplaintext": "yes",
                               "spool_sync_flags": sync_flags},
                         sasl=(USER, PW))
        try:
            i.create("user." + USER)
            for n in range(12):
                i.mbtool("deliver", "-M", "user." + USER,
                         input=make_message(msgid="fs%d@test" % n))
            i.write_cyrus_conf(imaps=False, lmtp=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _insts[sync_flags] = i
    return _insts[sync_flags]


def session(i):
    c = Raw(i.addr())
    c.line()
    ok(c.cmd("L", "LOGIN %s %s" % (USER, PW)), "L")
    ok(c.cmd("S", "SELECT INBOX"), "S")
    return c


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


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


class Trace:
    """strace -y of one process: its sync calls (and, with io, its
    writes to sockets) while the trace runs."""

    def __init__(self, i, pid, io=False):
        if not os.access(STRACE, os.X_OK):
            raise Skip("%s not installed" % STRACE)
        self.out = os.path.join(i.dir, "strace.%d.%f" % (pid, time.time()))
        calls = "fsync,fdatasync,syncfs" + (",sendto,write" if io else "")
        self.p = subprocess.Popen([STRACE, "-qq", "-y", "-s", "200", "-e",
                                   "trace=" + calls, "-o", self.out,
                                   "-p", str(pid)], stderr=subprocess.PIPE)

        def traced():
            with open("/proc/%d/status" % pid) as f:
                m = re.search(r"^TracerPid:\s+(\d+)", f.read(), re.M)
            return m is not None and int(m.group(1)) == self.p.pid
        if not wait_until(lambda: traced() or self.p.poll() is not None,
                          60) or self.p.poll() is not None:
            raise Skip("strace cannot attach: %s"
                       % self.p.stderr.read().decode(errors="replace"))

    def lines(self):
        with open(self.out) as f:
            return [ln.rstrip("\n") for ln in f]

    def syncs(self):
        """[(call, file)] of the sync calls so far."""
        got = []
        for ln in self.lines():
            m = SYNC_RE.match(ln)
            if m:
                got.append((m.group(1), os.path.basename(m.group(3))))
        return got

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
        self.p.wait(timeout=60)
        got = self.syncs()
        os.unlink(self.out)
        return got


def traced(i, c, fn):
    t = Trace(i, worker_pid(i, c))
    try:
        fn()
    finally:
        got = t.stop()
    return got


def of(syncs, fname):
    return [s for s in syncs if s[1] == fname]


def append(c, tag, flags="(\\Seen)"):
    m = make_message(msgid="%s.%f@test" % (tag, time.time()))
    m = m if isinstance(m, bytes) else m.encode()
    c.send(b"%s APPEND INBOX %s {%d+}\r\n" % (tag.encode(), flags.encode(),
                                             len(m)) + m + b"\r\n")
    return ok(c.until_tagged(tag), tag)


def test_store_without_sync():
    """STORE of \\Flagged: no sync at all; of \\Seen: no sync of the
    index, at most one of the seen file (the ordered commit); EXPUNGE:
    one sync of the index; APPEND: synced before its OK, the seen file
    once (its \\Seen and the \\Recent claim are one write)."""
    i = inst()
    with session(i) as c:
        # the first flag change of the boot makes its stamp durable
        ok(c.cmd("w", "UID STORE 1 +FLAGS (\\Flagged \\Seen)"), "w")
        s = traced(i, c, lambda: ok(c.cmd("f", "UID STORE 2:3 +FLAGS "
                                          "(\\Flagged)"), "f"))
        check(s == [], "STORE \\Flagged: sync calls %r" % s)
        s = traced(i, c, lambda: ok(c.cmd("s", "UID STORE 4 +FLAGS "
                                          "(\\Seen)"), "s"))
        check(of(s, "cyrus.index") == [] and len(s) <= 1,
              "STORE \\Seen: sync calls %r" % s)
        ok(c.cmd("d", "UID STORE 5 +FLAGS.SILENT (\\Deleted)"), "d")
        s = traced(i, c, lambda: ok(c.cmd("e", "UID EXPUNGE 5"), "e"))
        check(len(of(s, "cyrus.index")) == 1 and len(s) == 1,
              "EXPUNGE: sync calls %r" % s)
        s = traced(i, c, lambda: append(c, "a"))
        check(len(s) >= 1, "APPEND: no sync call")
        # its \Seen and the \Recent claim of the new message: one write
        check(len([x for x in s if x[1].endswith(".seen")]) <= 1,
              "APPEND: seen file synced more than once: %r" % s)
        ok(c.cmd("z", "LOGOUT"), "z")


def test_logout_syncs_after_reply():
    """The flag changes a session left unsynced are synced when it logs
    out, after the LOGOUT reply has been sent."""
    i = inst()
    with session(i) as c:
        ok(c.cmd("f", "UID STORE 6 +FLAGS (\\Flagged)"), "f")
        t = Trace(i, worker_pid(i, c), io=True)
        try:
            ok(c.cmd("z", "LOGOUT"), "z")
            check(c.at_eof(), "connection open after LOGOUT")
            ok_ = wait_until(lambda: of(t.syncs(), "cyrus.index") or None,
                             30, 0.05)
            lines = t.lines()
        finally:
            t.stop()
    check(ok_, "no sync of the index at LOGOUT: %r" % lines)
    reply = [k for k, ln in enumerate(lines) if "LOGOUT completed" in ln]
    sync = [k for k, ln in enumerate(lines)
            if SYNC_RE.match(ln) and "cyrus.index" in ln]
    check(reply and sync and reply[0] < sync[0],
          "the sync comes after the reply: %r" % lines)


def test_idle_session_syncs():
    """A session that stays idle after a STORE syncs the index within
    about a second, without any command."""
    i = inst()
    with session(i) as c:
        t = Trace(i, worker_pid(i, c))
        try:
            t0 = time.monotonic()
            ok(c.cmd("f", "UID STORE 7 +FLAGS (\\Flagged)"), "f")
            got = wait_until(lambda: of(t.syncs(), "cyrus.index") or None,
                             30, 0.05)
            took = time.monotonic() - t0
            # and nothing more while idle: one sync per burst
            n = len(t.syncs())
            time.sleep(1.5)
            again = len(t.syncs())
        finally:
            t.stop()
        check(got, "no sync of the index while idle")
        check(took >= 0.9, "synced before the idle second: %.2f s" % took)
        check(again == n, "synced again while idle: %d then %d"
              % (n, again))
        ok(c.cmd("z", "LOGOUT"), "z")


def test_idle_command_syncs():
    """IDLE syncs the session's unsynced flag changes once it has sent
    its continuation (STORE and IDLE sent together: no idle second in
    between)."""
    i = inst()
    with session(i) as c:
        t = Trace(i, worker_pid(i, c), io=True)

        def synced_in_idle():
            lines = t.lines()
            cont = [k for k, ln in enumerate(lines) if "+ idling" in ln]
            return cont and any(SYNC_RE.match(ln) and "cyrus.index" in ln
                                for ln in lines[cont[0]:]) or None
        try:
            c.send(b"f UID STORE 8 +FLAGS (\\Flagged)\r\ni IDLE\r\n")
            ok(c.until_tagged("f"), "f")
            line = c.line()
            check(line.startswith(b"+"), "IDLE: %r" % line)
            got = wait_until(synced_in_idle, 30, 0.05)
            lines = t.lines()
        finally:
            t.stop()
        check(got, "no sync of the index in IDLE: %r" % lines)
        c.send(b"DONE\r\n")
        ok(c.until_tagged("i"), "i")
        ok(c.cmd("z", "LOGOUT"), "z")


def test_sync_flags_on():
    """spool_sync_flags: yes: a STORE syncs the index before its reply,
    and the seen file's commit is durable (two fdatasyncs)."""
    i = inst("yes")
    with session(i) as c:
        ok(c.cmd("w", "UID STORE 1 +FLAGS (\\Flagged)"), "w")
        s = traced(i, c, lambda: ok(c.cmd("f", "UID STORE 2 +FLAGS "
                                          "(\\Flagged)"), "f"))
        check(len(of(s, "cyrus.index")) >= 1,
              "STORE with spool_sync_flags: sync calls %r" % s)
        s = traced(i, c, lambda: ok(c.cmd("s", "UID STORE 3 +FLAGS "
                                          "(\\Seen)"), "s"))
        check(len([x for x in s if x[1].endswith(".seen")]) == 2,
              "STORE \\Seen with spool_sync_flags: sync calls %r" % s)
        ok(c.cmd("z", "LOGOUT"), "z")


def finish():
    for i in list(_insts.values()):
        check(not i.worker_trouble(),
              "worker trouble: %s" % i.worker_trouble())
        i.__exit__(None, None, None)
    _insts.clear()


if __name__ == "__main__":
    rc = run_imap_tests([
        test_store_without_sync,
        test_logout_syncs_after_reply,
        test_idle_session_syncs,
        test_idle_command_syncs,
        test_sync_flags_on,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
