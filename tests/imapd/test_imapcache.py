#!/usr/bin/env python3
"""test_imapcache.py - what imapd keeps between commands gives way to
other processes' changes at the next command.

A session keeps, between commands, the user's seen state (reread only
when the seen file changed), the selected mailbox's rights (looked up
again only when the mailbox list changed) and its view of the index
(the closing update of a command skips the mailbox lock when the
index header's generation and the seen state are as at its last pass).
Each case changes what one of them depends on from elsewhere - another
session, lmtpd, or a tool writing the seen file directly - and checks
that the next command of the first session reports it:
  - \\Seen set and cleared by another session of the user, and by
    cyr_dbtool on the seen file (no index change at all: not told
    unasked, but a FETCH after the next command has it);
  - a flag stored and a message delivered while the session ran a
    command that locked the mailbox itself (FETCH): the closing update
    compares with its own last pass, not with that lock;
  - another session's flag change made just before or just after a
    STORE of the first session (whose own changes keep its view current
    only when nothing else changed the mailbox);
  - the selected mailbox's read right taken away by its owner;
and that message files are served whole whichever way they are read
(below 64 KiB in one read, from 64 KiB on mapped): FETCH BODY[] and
SEARCH BODY of messages around that size.

Environment: see imaphelp.py.
"""
import imaplib
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (ImapInstance, Raw, check, make_message,  # noqa: E402
                      make_sasldb_extra, run_imap_tests)
from testlib import TOP_BUILDDIR, drop_privileges  # noqa: E402

ALICE_PW, BOB_PW = "al1ce-pw", "b0b-pw"
CYR_DBTOOL = os.path.join(TOP_BUILDDIR, "tools", "cyr_dbtool")
RE_FETCH = re.compile(rb"^\* (\d+) FETCH \(.*FLAGS \(([^)]*)\)")

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("imapcache", conf={"allowplaintext": "yes"},
                         sasl=("alice", ALICE_PW))
        try:
            make_sasldb_extra(i, "bob", BOB_PW)
            i.create("user.alice")
            i.create("user.alice.Shared")
            i.create("user.bob")
            for n in range(3):
                i.mbtool("deliver", "-M", "user.alice",
                         input=make_message(msgid="c%d@test" % n))
                i.mbtool("deliver", "-M", "user.alice.Shared",
                         input=make_message(msgid="s%d@test" % n))
            i.write_cyrus_conf(imaps=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def session(user="alice", pw=ALICE_PW):
    c = Raw(inst().addr())
    c.line()
    r = c.cmd("L0", "LOGIN %s %s" % (user, pw))
    check(r[-1].startswith(b"L0 OK"), "LOGIN %s: %r" % (user, r))
    return c


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


def flags_of(r, num):
    """The FLAGS of message num in the last FETCH response of r, or None."""
    found = None
    for ln in r:
        m = RE_FETCH.match(ln)
        if m and int(m.group(1)) == num:
            found = m.group(2).split()
    return found


def seen_file(user):
    return os.path.join(inst().confdir, "user", user[0], user + ".seen")


def dbtool(*args):
    r = subprocess.run([CYR_DBTOOL, "-C", inst().imapd_conf] + list(args),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       preexec_fn=drop_privileges, timeout=60)
    check(r.returncode == 0, "cyr_dbtool %s: %r" % (args, r))
    return r.stdout.decode()


def test_seen_from_elsewhere():
    a = session()
    b = session()
    try:
        ok(a.cmd("a1", "SELECT INBOX"), "a1")
        r = ok(a.cmd("a2", "FETCH 1:3 FLAGS"), "a2")
        check(b"\\Seen" not in flags_of(r, 2), "seen at start: %r" % r)
        ok(b.cmd("b1", "SELECT INBOX"), "b1")
        ok(b.cmd("b2", "STORE 2 +FLAGS.SILENT (\\Seen)"), "b2")
        r = ok(a.cmd("a3", "FETCH 2 FLAGS"), "a3")
        check(b"\\Seen" in flags_of(r, 2), "other session's \\Seen: %r" % r)
        ok(b.cmd("b3", "STORE 2 -FLAGS.SILENT (\\Seen)"), "b3")
        r = ok(a.cmd("a4", "NOOP"), "a4")
        check(flags_of(r, 2) is not None and
              b"\\Seen" not in flags_of(r, 2),
              "other session's -\\Seen not told: %r" % r)
        ok(b.cmd("b4", "STORE 1 +FLAGS.SILENT (\\Seen)"), "b4")
        r = ok(a.cmd("a5", "NOOP"), "a5")
        check(flags_of(r, 1) is not None and b"\\Seen" in flags_of(r, 1),
              "other session's +\\Seen not told: %r" % r)
        # the seen file alone changes (no index write): uid 3 seen too
        path = seen_file("alice")
        lines = [ln for ln in dbtool(path, "skiplist", "show").splitlines()
                 if ln]
        check(len(lines) == 1, "seen records: %r" % lines)
        key, value = lines[0].split("\t", 1)
        fields = value.split(" ")
        check(len(fields) == 5 and fields[4] == "1", "seen value %r" % value)
        fields[4] = "1,3"
        dbtool(path, "skiplist", "set", key, " ".join(fields))
        # (a change of the seen file alone raises no modseq: it is not
        # told unasked, but the FETCH after the next command has it)
        ok(a.cmd("a6", "NOOP"), "a6")
        r = ok(a.cmd("a7", "FETCH 1:3 FLAGS"), "a7")
        check([b"\\Seen" in flags_of(r, n) for n in (1, 2, 3)]
              == [True, False, True], "flags after: %r" % r)
        ok(b.cmd("b5", "STORE 1:3 -FLAGS.SILENT (\\Seen)"), "b5")
    finally:
        a.close()
        b.close()


def test_changes_during_own_lock():
    a = session()
    b = session()
    try:
        ok(a.cmd("a1", "SELECT INBOX"), "a1")
        ok(b.cmd("b1", "SELECT INBOX"), "b1")
        ok(a.cmd("a2", "NOOP"), "a2")
        # b flags message 1; a's FETCH of message 2 locks the index after
        # the change: its closing update must still tell message 1
        ok(b.cmd("b2", "STORE 1 +FLAGS.SILENT (\\Flagged)"), "b2")
        r = ok(a.cmd("a3", "FETCH 2 (UID)"), "a3")
        r += ok(a.cmd("a4", "NOOP"), "a4")
        check(flags_of(r, 1) is not None and
              b"\\Flagged" in flags_of(r, 1),
              "flag stored meanwhile not told: %r" % r)
        # a delivery, then a FETCH: EXISTS
        n_before = 3
        for ln in ok(a.cmd("a5", "NOOP"), "a5"):
            m = re.match(rb"^\* (\d+) EXISTS", ln)
            if m:
                n_before = int(m.group(1))
        inst().mbtool("deliver", "-M", "user.alice",
                      input=make_message(msgid="late@test"))
        r = ok(a.cmd("a6", "FETCH 1 (UID)"), "a6")
        r += ok(a.cmd("a7", "NOOP"), "a7")
        check(("* %d EXISTS" % (n_before + 1)).encode() in r,
              "delivery not told: %r" % r)
        ok(b.cmd("b3", "STORE 1 -FLAGS.SILENT (\\Flagged)"), "b3")
    finally:
        a.close()
        b.close()


def test_own_store():
    """A STORE keeps the view current only when nothing else changed the
    mailbox since its last pass: another session's change made before the
    STORE is told with its reply, one made after it with the next
    command, and the STORE's own silent change is not told back."""
    a = session()
    b = session()
    try:
        ok(a.cmd("a1", "SELECT INBOX"), "a1")
        ok(b.cmd("b1", "SELECT INBOX"), "b1")
        ok(a.cmd("a2", "NOOP"), "a2")
        ok(b.cmd("b2", "STORE 2 +FLAGS.SILENT (\\Draft)"), "b2")
        r = ok(a.cmd("a3", "STORE 1 +FLAGS.SILENT (\\Answered)"), "a3")
        check(flags_of(r, 2) is not None and b"\\Draft" in flags_of(r, 2),
              "change before the STORE not told with it: %r" % r)
        r = ok(a.cmd("a4", "STORE 1 -FLAGS.SILENT (\\Answered)"), "a4")
        r += ok(a.cmd("a5", "NOOP"), "a5")
        check(flags_of(r, 1) is None and flags_of(r, 2) is None,
              "own silent change told back: %r" % r)
        ok(b.cmd("b3", "STORE 2 -FLAGS.SILENT (\\Draft)"), "b3")
        r = ok(a.cmd("a6", "NOOP"), "a6")
        check(flags_of(r, 2) is not None and
              b"\\Draft" not in flags_of(r, 2),
              "change after the STORE not told: %r" % r)
    finally:
        a.close()
        b.close()


def test_rights_revoked():
    a = session()
    b = session("bob", BOB_PW)
    try:
        ok(a.cmd("a1", "SETACL INBOX.Shared bob lrs"), "a1")
        ok(b.cmd("b1", "SELECT user.alice.Shared"), "b1")
        for k in range(3):      # rights kept over several commands
            ok(b.cmd("b2%d" % k, "FETCH 1 FLAGS"), "b2%d" % k)
        ok(a.cmd("a2", "SETACL INBOX.Shared bob -r"), "a2")
        r = b.cmd("b3", "FETCH 1 FLAGS")
        check(r[-1].startswith(b"b3 NO") and
              any(ln.startswith(b"* OK [CLOSED]") for ln in r),
              "FETCH after losing r: %r" % r)
        ok(a.cmd("a3", "DELETEACL INBOX.Shared bob"), "a3")
    finally:
        a.close()
        b.close()


def big_message(size, marker):
    head = ("From: a@example.com\r\nTo: b@example.com\r\n"
            "Subject: size %d\r\nMessage-ID: <%s@test>\r\n\r\n"
            % (size, marker)).encode()
    tail = ("%s\r\n" % marker).encode()
    fill = size - len(head) - len(tail)
    lines = []
    while fill > 0:
        n = min(fill, 78)
        if n >= 3:
            lines.append(b"x" * (n - 2) + b"\r\n")
        else:
            lines.append(b"\r\n"[:n] if n == 2 else b" ")
        fill -= n
    msg = head + b"".join(lines) + tail
    check(len(msg) == size, "message size %d != %d" % (len(msg), size))
    return msg


def test_message_sizes():
    host, port = inst().addr()
    c = imaplib.IMAP4(host, port)
    try:
        c.login("alice", ALICE_PW)
        c.create("INBOX.Sizes")
        msgs = {}
        for size in (65535, 65536, 65537, 200000):
            marker = "endmark%d" % size
            msgs[marker] = big_message(size, marker)
            typ, resp = c.append("INBOX.Sizes", None, None, msgs[marker])
            check(typ == "OK", "APPEND %d: %s %r" % (size, typ, resp))
        typ, _ = c.select("INBOX.Sizes")
        check(typ == "OK", "SELECT INBOX.Sizes")
        for n, (marker, msg) in enumerate(msgs.items(), 1):
            typ, data = c.fetch(str(n), "(BODY.PEEK[])")
            check(typ == "OK" and data[0][1] == msg,
                  "FETCH %d: %d bytes, want %d" % (n, len(data[0][1]),
                                                   len(msg)))
            typ, data = c.search(None, "BODY", marker)
            check(typ == "OK" and data[0].split() == [str(n).encode()],
                  "SEARCH BODY %s: %r" % (marker, data))
        c.close()
        c.delete("INBOX.Sizes")
        c.logout()
    finally:
        try:
            c.shutdown()
        except Exception:  # noqa: BLE001
            pass


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_seen_from_elsewhere,
        test_changes_during_own_lock,
        test_own_store,
        test_rights_revoked,
        test_message_sizes,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
