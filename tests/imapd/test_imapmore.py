#!/usr/bin/env python3
"""test_imapmore.py - QRESYNC (RFC 7162 section 3.2) end to end under the
real master: ENABLE QRESYNC, SELECT/EXAMINE (QRESYNC (...)) answering
VANISHED (EARLIER) and FETCH of what changed, UID FETCH (CHANGEDSINCE m
VANISHED), VANISHED instead of EXPUNGE, the CLOSED response code, and
the full answer once cleanup forgot expunges newer than the client's
modseq; and APPENDLIMIT (RFC 7889): the capability and STATUS item from
maxmessagesize, NO [TOOBIG] before the data; with the RFCs' examples'
shapes and their error cases.

One instance (see imaphelp.py), user alice, allowplaintext on,
maxmessagesize 4096.
The client is imaphelp.Raw: every response is checked against
imapgrammar.py.  After each bad input the session must go on (NOOP
answers OK) and at the end the master log must show no crashed worker.

Environment: see imaphelp.py.
"""
import os
import re
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import ImapInstance, Raw, check, run_imap_tests  # noqa: E402

ALICE, ALICE_PW = "alice", "s3cret-pw"
LIMIT = 4096

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("imapmore", conf={"allowplaintext": "yes",
                                           "maxmessagesize": str(LIMIT)},
                         tls=True, sasl=(ALICE, ALICE_PW))
        try:
            i.create("user.alice")
            i.write_cyrus_conf()
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def session(i):
    c = Raw(i.addr())
    c.line()
    r = c.cmd("L0", "LOGIN %s %s" % (ALICE, ALICE_PW))
    check(r[-1].startswith(b"L0 OK"), "LOGIN %r" % r)
    return c


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


def bad(c, tag, text):
    r = c.cmd(tag, text)
    check(r[-1].startswith(tag.encode() + b" BAD"),
          "%s should be BAD: %r" % (text, r))
    ok(c.cmd(tag + "n", "NOOP"), tag + "n")
    return r


def message(n):
    return (b"From: <ann@example.com>\r\nTo: alice@example.org\r\n"
            b"Subject: message %d\r\nMessage-ID: <q%d@example.com>\r\n\r\n"
            b"hello %d\r\n" % (n, n, n))


def qr_box(i, name, n):
    i.create("user.alice." + name)
    for k in range(1, n + 1):
        i.mbtool("deliver", "-m", name, ALICE, input=message(k))


def code(lines, name):
    for ln in lines:
        m = re.match(rb"\* OK \[%s (\d+)\]" % name.encode(), ln)
        if m:
            return int(m.group(1))
    raise AssertionError("no %s in %r" % (name, lines))


def vanished(lines, earlier=True):
    pfx = b"* VANISHED (EARLIER) " if earlier else b"* VANISHED "
    out = [ln[len(pfx):] for ln in lines if ln.startswith(pfx)]
    check(len(out) <= 1, "more than one VANISHED: %r" % lines)
    return out[0] if out else None


def fetches(lines):
    """{uid: line} of the untagged FETCH responses."""
    out = {}
    for ln in lines:
        m = re.match(rb"\* \d+ FETCH \(.*UID (\d+)", ln)
        if m:
            out[int(m.group(1))] = ln
    return out


def test_enable_and_errors():
    """QRESYNC is advertised; ENABLE QRESYNC reports CONDSTORE and
    QRESYNC once; QRESYNC parameters before ENABLE, VANISHED without
    UID, without CHANGEDSINCE or without ENABLE, and malformed QRESYNC
    parameters are BAD, and the session goes on."""
    i = inst()
    qr_box(i, "QE", 2)
    with session(i) as c:
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        check(b" QRESYNC" in r[0], "no QRESYNC: %r" % r)
        ok(c.cmd("s0", "SELECT INBOX.QE"), "s0")
        bad(c, "f0", "UID FETCH 1:* FLAGS (CHANGEDSINCE 1 VANISHED)")
        bad(c, "s1", "SELECT INBOX.QE (QRESYNC (1 1))")
        r = ok(c.cmd("e1", "ENABLE QRESYNC"), "e1")
        check(r[0] == b"* ENABLED CONDSTORE QRESYNC", "ENABLE: %r" % r)
        r = ok(c.cmd("e2", "ENABLE QRESYNC CONDSTORE"), "e2")
        check(r[0] == b"* ENABLED", "ENABLE again: %r" % r)
        ok(c.cmd("s2", "SELECT INBOX.QE"), "s2")
        for k, text in enumerate([
                "FETCH 1:* FLAGS (CHANGEDSINCE 1 VANISHED)",
                "UID FETCH 1:* FLAGS (VANISHED)",
                "UID FETCH 1:* FLAGS (CHANGEDSINCE 1 VANISHED VANISHED)",
                "UID FETCH 1:* FLAGS (CHANGEDSINCE 0 VANISHED)",
                "SELECT INBOX.QE (QRESYNC (0 1))",
                "SELECT INBOX.QE (QRESYNC (1))",
                "SELECT INBOX.QE (QRESYNC (1 0))",
                "SELECT INBOX.QE (QRESYNC (1 1 1:*))",
                "SELECT INBOX.QE (QRESYNC (1 1 0:3))",
                "SELECT INBOX.QE (QRESYNC (1 1 1:3 (1:2)))",
                "SELECT INBOX.QE (QRESYNC (1 1 1:3 (1:2 1:2 3)))",
                "SELECT INBOX.QE (QRESYNC 1 1)",
                "SELECT INBOX.QE (QRESYNC (1 1) QRESYNC (1 1))",
                "SELECT INBOX.QE (QRESYNC (x 1))"]):
            bad(c, "b%d" % k, text)
        ok(c.cmd("l1", "LOGOUT"), "l1")


def test_resync_two_sessions():
    """While A is offline B changes flags and expunges; A resynchronizes
    in one SELECT (QRESYNC ...): VANISHED (EARLIER) with exactly the UIDs
    expunged since A's modseq (not the one expunged before), FETCH of
    the changed message, nothing for the others.  B, with QRESYNC on,
    hears VANISHED; a session without it EXPUNGE.  UID FETCH (CHANGEDSINCE
    VANISHED) tells the same; a wrong UIDVALIDITY gets neither; a new
    SELECT first says CLOSED."""
    i = inst()
    qr_box(i, "QR", 10)
    with session(i) as b:
        ok(b.cmd("b1", "SELECT INBOX.QR"), "b1")
        ok(b.cmd("b2", "STORE 1 +FLAGS.SILENT (\\Deleted)"), "b2")
        ok(b.cmd("b3", "EXPUNGE"), "b3")      # uid 1: before A's modseq
    with session(i) as a:
        ok(a.cmd("a1", "ENABLE QRESYNC"), "a1")
        r = ok(a.cmd("a2", "SELECT INBOX.QR"), "a2")
        uv, m0 = code(r, "UIDVALIDITY"), code(r, "HIGHESTMODSEQ")
        check(vanished(r) is None, "plain SELECT with VANISHED: %r" % r)
        ok(a.cmd("a3", "LOGOUT"), "a3")
    with session(i) as b, session(i) as plain:
        ok(b.cmd("b0", "ENABLE QRESYNC"), "b0")
        ok(b.cmd("b1", "SELECT INBOX.QR"), "b1")
        ok(plain.cmd("p1", "SELECT INBOX.QR"), "p1")
        ok(b.cmd("b2", "UID STORE 4 +FLAGS.SILENT (\\Flagged)"), "b2")
        # the user's \Seen (per user, outside the index) counts too
        ok(b.cmd("b2s", "UID FETCH 8 BODY[TEXT]"), "b2s")
        ok(b.cmd("b3", "UID STORE 3,5 +FLAGS.SILENT (\\Deleted)"), "b3")
        r = ok(b.cmd("b4", "EXPUNGE"), "b4")
        check(vanished(r, earlier=False) == b"3,5" and
              not any(ln.endswith(b" EXPUNGE") for ln in r),
              "EXPUNGE with QRESYNC: %r" % r)
        r = ok(plain.cmd("p2", "NOOP"), "p2")
        check([ln for ln in r if ln.endswith(b"EXPUNGE")] ==
              [b"* 4 EXPUNGE", b"* 2 EXPUNGE"] and
              vanished(r, earlier=False) is None,
              "EXPUNGE without QRESYNC: %r" % r)
    with session(i) as a:
        ok(a.cmd("a1", "ENABLE QRESYNC"), "a1")
        r = ok(a.cmd("a2", "SELECT INBOX.QR (QRESYNC (%d %d 1:10))"
                     % (uv, m0)), "a2")
        check(vanished(r) == b"3,5", "VANISHED (EARLIER): %r" % r)
        f = fetches(r)
        check(list(f) == [4, 8] and b"\\Flagged" in f[4] and
              b"\\Seen" in f[8] and
              re.search(rb"MODSEQ \(\d+\)", f[4]) and
              f[4].startswith(b"* 2 FETCH"), "FETCH: %r" % r)
        # order as in RFC 7162's example: VANISHED, FETCH, tagged OK
        kinds = [ln.split()[1] for ln in r[:-1]
                 if b"VANISHED" in ln or b" FETCH " in ln]
        check(kinds == [b"VANISHED", b"2", b"5"], "order: %r" % r)
        # the same without known-uids, and through UID FETCH
        r = ok(a.cmd("a3", "EXAMINE INBOX.QR (QRESYNC (%d %d))"
                     % (uv, m0)), "a3")
        check(r[0] == b"* OK [CLOSED] Previous mailbox closed",
              "CLOSED first: %r" % r)
        check(vanished(r) == b"3,5" and list(fetches(r)) == [4, 8],
              "EXAMINE QRESYNC: %r" % r)
        r = ok(a.cmd("a4", "UID FETCH 1:* (FLAGS) (CHANGEDSINCE %d VANISHED)"
                     % m0), "a4")
        check(vanished(r) == b"3,5" and list(fetches(r)) == [4, 8],
              "UID FETCH VANISHED: %r" % r)
        r = ok(a.cmd("a5", "UID FETCH 4:10 (FLAGS) (CHANGEDSINCE %d VANISHED)"
                     % m0), "a5")
        check(vanished(r) == b"5", "UID FETCH 4:10: %r" % r)
        # known-uids limit the answer; the sequence match is accepted
        r = ok(a.cmd("a6", "SELECT INBOX.QR (QRESYNC (%d %d 4:10 (1:2 2:3)))"
                     % (uv, m0)), "a6")
        check(vanished(r) == b"5", "known-uids: %r" % r)
        # up to date: nothing to tell
        r = ok(a.cmd("a7", "SELECT INBOX.QR (QRESYNC (%d %d))"
                     % (uv, code(r, "HIGHESTMODSEQ"))), "a7")
        check(vanished(r) is None and not fetches(r), "no change: %r" % r)
        # another UIDVALIDITY: a plain SELECT
        r = ok(a.cmd("a8", "SELECT INBOX.QR (QRESYNC (%d %d))"
                     % (uv + 1, m0)), "a8")
        check(vanished(r) is None and not fetches(r), "wrong uv: %r" % r)
        ok(a.cmd("a9", "LOGOUT"), "a9")


def test_resync_after_cleanup():
    """Once cleanup compacted expunged records away, a client whose
    modseq is older than the newest one removed gets every UID below
    UIDNEXT without a message (the one expunged before its modseq too,
    as RFC 7162 allows), limited to its known UIDs; one newer than that
    gets the exact answer."""
    i = inst()
    qr_box(i, "QC", 8)
    with session(i) as a:
        ok(a.cmd("a0", "ENABLE QRESYNC"), "a0")
        ok(a.cmd("a1", "SELECT INBOX.QC"), "a1")
        ok(a.cmd("a2", "UID STORE 2 +FLAGS.SILENT (\\Deleted)"), "a2")
        ok(a.cmd("a3", "EXPUNGE"), "a3")
        r = ok(a.cmd("a4", "NOOP"), "a4")
        r = ok(a.cmd("a5", "SELECT INBOX.QC"), "a5")
        uv, m0 = code(r, "UIDVALIDITY"), code(r, "HIGHESTMODSEQ")
        ok(a.cmd("a6", "UID STORE 6,7 +FLAGS.SILENT (\\Deleted)"), "a6")
        ok(a.cmd("a7", "EXPUNGE"), "a7")
        r = ok(a.cmd("a8", "UID FETCH 1:* (FLAGS) (CHANGEDSINCE %d VANISHED)"
                     % m0), "a8")
        check(vanished(r) == b"6:7", "before cleanup: %r" % r)
        ok(a.cmd("a9", "UNSELECT"), "a9")
        i.mbtool("cleanup", "user.alice.QC")
        r = ok(a.cmd("b1", "SELECT INBOX.QC (QRESYNC (%d %d))"
                     % (uv, m0)), "b1")
        check(vanished(r) == b"2,6:7", "after cleanup: %r" % r)
        m1 = code(r, "HIGHESTMODSEQ")
        r = ok(a.cmd("b2", "SELECT INBOX.QC (QRESYNC (%d %d 3:8))"
                     % (uv, m0)), "b2")
        check(vanished(r) == b"6:7", "after cleanup, known-uids: %r" % r)
        r = ok(a.cmd("b3", "UID FETCH 5:* (FLAGS) (CHANGEDSINCE %d VANISHED)"
                     % m0), "b3")
        check(vanished(r) == b"6:7", "UID FETCH after cleanup: %r" % r)
        # a modseq not older than the forgotten expunges: exact again
        ok(a.cmd("b4", "UID STORE 3 +FLAGS.SILENT (\\Deleted)"), "b4")
        ok(a.cmd("b5", "EXPUNGE"), "b5")
        r = ok(a.cmd("b6", "SELECT INBOX.QC (QRESYNC (%d %d))"
                     % (uv, m1)), "b6")
        check(vanished(r) == b"3", "exact after cleanup: %r" % r)
        ok(a.cmd("b7", "LOGOUT"), "b7")


def appended(c, tag, data, nonsync=False):
    """APPEND INBOX with a literal of data; the tagged reply line."""
    if nonsync:
        c.send(b"%s APPEND INBOX {%d+}\r\n" % (tag.encode(), len(data))
               + data + b"\r\n")
        return c.until_tagged(tag)[-1]
    c.send(b"%s APPEND INBOX {%d}\r\n" % (tag.encode(), len(data)))
    ln = c.line()
    if not ln.startswith(b"+"):
        return ln
    c.send(data + b"\r\n")
    return c.until_tagged(tag)[-1]


def test_appendlimit():
    """APPENDLIMIT=maxmessagesize in the capabilities and as STATUS
    APPENDLIMIT; a message of exactly the limit is stored; one byte
    more is NO [TOOBIG] before the data (synchronizing literal, no
    continuation) or after dropping it ({n+}); the session goes on."""
    i = inst()
    with session(i) as c:
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        check(b" APPENDLIMIT=%d" % LIMIT in r[0], "no APPENDLIMIT: %r" % r)
        r = ok(c.cmd("s1", "STATUS INBOX (APPENDLIMIT MESSAGES)"), "s1")
        check(re.match(rb'\* STATUS "INBOX" \(APPENDLIMIT %d MESSAGES \d+\)$'
                       % LIMIT, r[0]), "STATUS: %r" % r)
        body = message(99)
        exact = body + b"x" * (LIMIT - len(body) - 2) + b"\r\n"
        check(len(exact) == LIMIT, "test message size")
        ln = appended(c, "a1", exact)
        check(ln.startswith(b"a1 OK"), "APPEND of the limit: %r" % ln)
        big = exact + b"y"
        c.send(b"a2 APPEND INBOX {%d}\r\n" % len(big))
        ln = c.line()           # no "+": refused before the data
        check(ln.startswith(b"a2 NO [TOOBIG]"), "APPEND over: %r" % ln)
        ok(c.cmd("n2", "NOOP"), "n2")
        ln = appended(c, "a3", big, nonsync=True)
        check(ln.startswith(b"a3 NO [TOOBIG]"), "APPEND {n+} over: %r" % ln)
        ok(c.cmd("n3", "NOOP"), "n3")
        r = ok(c.cmd("s2", "STATUS INBOX (MESSAGES)"), "s2")
        check(r[0] == b"* STATUS \"INBOX\" (MESSAGES 1)", "stored: %r" % r)
        ok(c.cmd("l1", "LOGOUT"), "l1")


def finish():
    global _inst
    if _inst is not None:
        check(not _inst.worker_trouble(),
              "worker trouble: %s" % _inst.worker_trouble())
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_enable_and_errors,
        test_resync_two_sessions,
        test_resync_after_cleanup,
        test_appendlimit,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
