#!/usr/bin/env python3
"""test_imapd.py - imapd end to end under the real master.

One instance: an "imap" listener on 127.0.0.1 (STARTTLS) and an "imaps"
one (imapd -s, implicit TLS), a self-signed certificate and a sasldb made
with saslpasswd2 in the servername's realm (users alice and bob),
`admins: admin`, allowplaintext off.  Clients: Python's imaplib and a raw
socket client that sends exactly the bytes given.  Mailboxes are set up
with the real tools/mbtool; messages are put in with `mbtool deliver`,
with APPEND, and through lmtpd (run by the same master on a UNIX socket)
for IDLE.  The message tests compare FETCH output byte for byte with the
spool files, and drive two sessions on one mailbox (STORE, EXPUNGE,
APPEND seen by the other on NOOP/CHECK/IDLE).

After the bad-input tests the session must go on (a NOOP answers OK),
and at the end the master log must show no crashed or failed worker
(nor a sanitizer report).  The last test SIGTERMs the master with an
idle client connected, which must get "* BYE Server shutting down".
log_lines_printable runs its own instance (allowplaintext on, lmtpd
beside imapd) and sends control and 8-bit bytes through every LMTP and
IMAP command that logs: each line of the master's log must stay
printable ASCII, with no forged line.

Environment: see imaphelp.py.
"""
import base64
import imaplib
import os
import re
import signal
import sys
import threading

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, IMAP4_SSL, SERVERNAME,  # noqa: E402
                      ImapInstance, Raw, ConnectionClosed, check, crc32c, make_sasldb_extra,
                      parse_list, run_imap_tests, tls_context, wait_until)
from testlib import Fail, alive  # noqa: E402

ALICE, ALICE_PW = "alice", "s3cret-pw"
BOB, BOB_PW = "bob", "b0b-pw"
ADMIN, ADMIN_PW = "admin", "adm1n-pw"
FLAG_DELETED = 1 << 2
FLAG_SEEN = 1 << 4

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("imapd", conf={"admins": ADMIN,
                                        "prelogin_timeout": "5",
                                        "sasl_mech_list": "PLAIN LOGIN "
                                        "SCRAM-SHA-1 SCRAM-SHA-256"},
                         tls=True, sasl=(ALICE, ALICE_PW))
        try:
            make_sasldb_extra(i, BOB, BOB_PW)
            make_sasldb_extra(i, ADMIN, ADMIN_PW)
            i.create("user.alice")
            i.create("user.alice.Sent")
            i.create("user.alice.Sent.2024")
            i.create("user.alice.Private")
            i.create("user.bob")
            i.create("user.bob.Secret")
            i.create("shared.closed", {"anyone": "lr"})
            i.create("shared.hidden")
            i.write_cyrus_conf()
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def login(user=ALICE, pw=ALICE_PW):
    """An imaplib session after STARTTLS and LOGIN."""
    m = IMAP4(*inst().addr(), timeout=20)
    m.starttls(tls_context())
    m.login(user, pw)
    return m


def close(m):
    """Drop an imaplib connection (after LOGOUT too)."""
    try:
        m.shutdown()
    except OSError:
        pass


def list_names(m, ref='""', pat="*"):
    typ, data = m.list(ref, pat)
    check(typ == "OK", "LIST %r %r: %s %r" % (ref, pat, typ, data))
    lines = [b"* LIST " + d for d in data if d is not None]
    return parse_list(lines)


def no_error(fn, *args):
    """Run an imaplib call that must answer NO; its text."""
    try:
        typ, data = fn(*args)
    except imaplib.IMAP4.error as e:
        return str(e)
    check(typ == "NO", "expected NO, got %s %r" % (typ, data))
    return b" ".join(d for d in data if d).decode()


# ---- tests ----------------------------------------------------------------

def test_greeting_capability():
    with Raw(inst().addr()) as c:
        g = c.line()
        m = re.match(rb"^\* OK \[CAPABILITY ([^\]]+)\] (\S+) cyrusdeliver "
                     rb"IMAP ready$", g)
        check(m is not None, "greeting %r" % g)
        check(m.group(2).decode() == SERVERNAME, "servername in %r" % g)
        caps = m.group(1).split()
        for cap in (b"IMAP4rev1", b"LITERAL+", b"SASL-IR", b"ID", b"ENABLE",
                    b"NAMESPACE", b"IDLE", b"UIDPLUS", b"MOVE",
                    b"CONDSTORE", b"UNSELECT", b"CHILDREN", b"STARTTLS",
                    b"LOGINDISABLED"):
            check(cap in caps, "%r not in greeting capabilities %r"
                  % (cap, caps))
        # plaintext mechanisms are not offered without TLS
        check(b"AUTH=PLAIN" not in caps, "AUTH=PLAIN offered without TLS")
        r = c.cmd("a1", "CAPABILITY")
        check(len(r) == 2 and r[0].startswith(b"* CAPABILITY IMAP4rev1 ")
              and r[1] == b"a1 OK CAPABILITY completed", "CAPABILITY %r" % r)
        r = c.cmd("a2", "NOOP")
        check(r == [b"a2 OK NOOP completed"], "NOOP %r" % r)
        r = c.cmd("a3", 'ID ("name" "test")')
        check(r[0].startswith(b'* ID ("name" "cyrusdeliver"')
              and r[1].startswith(b"a3 OK"), "ID %r" % r)
        # after STARTTLS: no STARTTLS, no LOGINDISABLED, AUTH=PLAIN
        c.starttls()
        r = c.cmd("a4", "CAPABILITY")
        caps = r[0].split()
        check(b"STARTTLS" not in caps and b"LOGINDISABLED" not in caps
              and b"AUTH=PLAIN" in caps, "capabilities under TLS %r" % r)


def test_login_refused_without_tls():
    m = IMAP4(*inst().addr(), timeout=20)
    try:
        text = no_error(m.login, ALICE, ALICE_PW)
        check("PRIVACYREQUIRED" in text, "LOGIN without TLS: %r" % text)
        # still not authenticated
        with Raw(inst().addr()) as c:
            c.line()
            r = c.cmd("a1", "LOGIN alice s3cret-pw")
            check(r[-1].startswith(b"a1 NO [PRIVACYREQUIRED]"), "%r" % r)
            r = c.cmd("a2", "LIST \"\" *")
            check(r[-1].startswith(b"a2 BAD"), "LIST before login %r" % r)
    finally:
        close(m)


def test_login_after_starttls():
    m = login()
    try:
        typ, data = m.noop()
        check(typ == "OK", "NOOP after login %r" % data)
        check(m.state == "AUTH", "imaplib state %s" % m.state)
        typ, data = m.logout()
        check(typ == "BYE", "LOGOUT %s %r" % (typ, data))
    finally:
        close(m)


def test_wrong_password():
    m = IMAP4(*inst().addr(), timeout=20)
    m.starttls(tls_context())
    try:
        text = no_error(m.login, ALICE, "wrong")
        check("AUTHENTICATIONFAILED" in text, "wrong password: %r" % text)
        text = no_error(m.login, "nosuchuser", "x")
        check("AUTHENTICATIONFAILED" in text, "unknown user: %r" % text)
        typ, _ = m.login(ALICE, ALICE_PW)
        check(typ == "OK", "login after failures")
        m.logout()
    finally:
        close(m)


def test_authenticate_plain_imaps():
    # imaps: TLS first, then AUTHENTICATE PLAIN by continuation (imaplib)
    m = IMAP4_SSL("127.0.0.1", inst().imaps_port,
                          ssl_context=tls_context(), timeout=20)
    try:
        typ, _ = m.authenticate(
            "PLAIN", lambda _: ("\0%s\0%s" % (BOB, BOB_PW)).encode())
        check(typ == "OK", "AUTHENTICATE PLAIN")
        check("INBOX" in list_names(m, '""', "INBOX"), "bob's INBOX")
        m.logout()
    finally:
        close(m)
    # SASL-IR, a cancelled exchange, a bad mechanism, bad base64
    with Raw(inst().addr()) as c:
        c.line()
        c.starttls()
        r = c.cmd("a1", "AUTHENTICATE NOSUCHMECH")
        check(r[-1].startswith(b"a1 NO"), "unknown mechanism %r" % r)
        c.send("a2 AUTHENTICATE PLAIN\r\n")
        check(c.line() == b"+ ", "continuation")
        c.send("*\r\n")
        r = c.until_tagged("a2")
        check(r[-1].startswith(b"a2 BAD"), "cancel %r" % r)
        c.send("a3 AUTHENTICATE PLAIN\r\n")
        c.line()
        c.send("!!!notbase64\r\n")
        r = c.until_tagged("a3")
        check(r[-1].startswith(b"a3 BAD"), "bad base64 %r" % r)
        ir = base64.b64encode(("\0%s\0%s" % (ALICE, ALICE_PW)).encode())
        r = c.cmd("a4", "AUTHENTICATE PLAIN " + ir.decode())
        check(r[-1].startswith(b"a4 OK [CAPABILITY IMAP4rev1"),
              "SASL-IR %r" % r)
        r = c.cmd("a5", "LOGIN alice s3cret-pw")
        check(r[-1].startswith(b"a5 BAD"), "second login %r" % r)


def scram_exchange(c, tag, mech, user, pw):
    """An RFC 5802 SCRAM client over AUTHENTICATE (hash from the mechanism
    name); checks the server's signature; the tagged response lines."""
    import hashlib
    import hmac
    hname = {"SCRAM-SHA-1": "sha1", "SCRAM-SHA-256": "sha256"}[mech]
    cnonce = base64.b64encode(os.urandom(18)).decode()
    first_bare = "n=%s,r=%s" % (user, cnonce)
    c.send("%s AUTHENTICATE %s\r\n" % (tag, mech))
    ln = c.line()
    check(ln == b"+ " or ln == b"+", "continuation %r" % ln)
    c.send(base64.b64encode(("n,," + first_bare).encode()) + b"\r\n")
    ln = c.line()
    check(ln.startswith(b"+ "), "server-first %r" % ln)
    server_first = base64.b64decode(ln[2:]).decode()
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    check(attrs["r"].startswith(cnonce), "nonce %r" % server_first)
    salted = hashlib.pbkdf2_hmac(hname, pw.encode(),
                                 base64.b64decode(attrs["s"]), int(attrs["i"]))
    final_wo = "c=biws,r=" + attrs["r"]
    auth_msg = ",".join((first_bare, server_first, final_wo)).encode()
    ckey = hmac.new(salted, b"Client Key", hname).digest()
    csig = hmac.new(hashlib.new(hname, ckey).digest(), auth_msg,
                    hname).digest()
    proof = bytes(a ^ b for a, b in zip(ckey, csig))
    c.send(base64.b64encode((final_wo + ",p=" +
                             base64.b64encode(proof).decode()).encode())
           + b"\r\n")
    ln = c.line()
    skey = hmac.new(salted, b"Server Key", hname).digest()
    want = "v=" + base64.b64encode(hmac.new(skey, auth_msg,
                                            hname).digest()).decode()
    if ln.startswith(b"+ "):
        check(base64.b64decode(ln[2:]).decode() == want,
              "server signature %r" % ln)
        c.send("\r\n")
        return c.until_tagged(tag)
    return [ln] if ln.startswith(tag.encode()) else [ln] + c.until_tagged(tag)


def test_authenticate_login_scram():
    """AUTHENTICATE LOGIN, and SCRAM where the installed Cyrus SASL has it
    (libsasl2-modules' libscram): a right password logs in and the
    server proves it knows the password too; a wrong one gets NO."""
    with Raw(inst().addr()) as c:
        c.line()
        c.starttls()
        r = c.cmd("c1", "CAPABILITY")
        caps = r[0].split()
        check(b"AUTH=LOGIN" in caps, "AUTH=LOGIN not offered %r" % r)
        c.send("l1 AUTHENTICATE LOGIN\r\n")
        for answer in (ALICE, ALICE_PW):
            ln = c.line()
            check(ln.startswith(b"+ "), "LOGIN prompt %r" % ln)
            c.send(base64.b64encode(answer.encode()) + b"\r\n")
        r = c.until_tagged("l1")
        check(r[-1].startswith(b"l1 OK"), "AUTHENTICATE LOGIN %r" % r)
    scram = [m for m in ("SCRAM-SHA-256", "SCRAM-SHA-1")
             if ("AUTH=" + m).encode() in caps]
    if os.path.exists("/usr/lib/x86_64-linux-gnu/sasl2/libscram.so"):
        check(scram, "libscram is installed but no SCRAM offered %r" % caps)
    for mech in scram:
        with Raw(inst().addr()) as c:
            c.line()
            c.starttls()
            r = scram_exchange(c, "s1", mech, BOB, BOB_PW)
            check(r[-1].startswith(b"s1 OK"), "%s %r" % (mech, r))
            r = ok(c.cmd("s2", "SELECT INBOX"), "s2")
        with Raw(inst().addr()) as c:
            c.line()
            c.starttls()
            c.send("w1 AUTHENTICATE %s\r\n" % mech)
            c.line()
            c.send(base64.b64encode(b"n,,n=bob,r=abcdefgh") + b"\r\n")
            ln = c.line()
            server_first = base64.b64decode(ln[2:]).decode()
            nonce = dict(kv.split("=", 1)
                         for kv in server_first.split(","))["r"]
            c.send(base64.b64encode(("c=biws,r=%s,p=%s" % (
                nonce, base64.b64encode(b"x" * 20).decode())).encode())
                + b"\r\n")
            r = c.until_tagged("w1")
            check(r[-1].startswith(b"w1 NO"), "wrong proof %r" % r)


def test_list_and_acl():
    m = login()
    try:
        names = list_names(m)
        for n in ("INBOX", "INBOX.Sent", "INBOX.Sent.2024", "INBOX.Private",
                  "shared.closed"):
            check(n in names, "%s not in alice's LIST: %r" % (n, names))
        for n in names:
            check("bob" not in n and n != "shared.hidden",
                  "alice sees %s" % n)
        check("\\HasChildren" in names["INBOX"] and
              "\\HasChildren" in names["INBOX.Sent"] and
              "\\HasNoChildren" in names["INBOX.Sent.2024"],
              "child flags %r" % names)
        top = list_names(m, '""', "%")
        check(set(top) == {"INBOX", "shared"}, "LIST %% %r" % top)
        check("\\Noselect" in top["shared"], "shared is \\Noselect %r" % top)
        lvl = list_names(m, "INBOX.", "%")
        check(set(lvl) == {"INBOX.Sent", "INBOX.Private"},
              "LIST INBOX. %% %r" % lvl)
        lower = list_names(m, '""', "inbox")
        check(set(lower) == {"INBOX"}, "inbox in any case %r" % lower)
        typ, data = m.list('""', '""')
        check(typ == "OK" and data[0].startswith(b'(\\Noselect) "." '),
              "LIST \"\" \"\" %r" % data)
        # bob's mailboxes are not there for alice
        text = no_error(m.status, "user.bob.Secret", "(MESSAGES)")
        check("NONEXISTENT" in text, "STATUS of bob's mailbox: %r" % text)
        text = no_error(m.delete, "user.bob")
        check("NONEXISTENT" in text, "DELETE of bob's INBOX: %r" % text)
        text = no_error(m.create, "user.bob.Mine")
        check("NOPERM" in text, "CREATE in bob's tree: %r" % text)
        text = no_error(m.create, "toplevel")
        check("NOPERM" in text, "CREATE at top level: %r" % text)
        text = no_error(m.delete, "shared.closed")
        check("NOPERM" in text, "DELETE without x: %r" % text)
        m.logout()
    finally:
        close(m)


def test_create_delete_rename():
    m = login()
    try:
        typ, _ = m.create("INBOX.Work")
        check(typ == "OK", "CREATE INBOX.Work")
        check(inst().info("user.alice.Work"), "user.alice.Work on disk")
        text = no_error(m.create, "INBOX.Work")
        check("ALREADYEXISTS" in text, "second CREATE: %r" % text)
        typ, _ = m.create("INBOX.Work.Deep.")    # trailing separator dropped
        check(typ == "OK", "CREATE nested")
        typ, _ = m.rename("INBOX.Work", "INBOX.Done")
        check(typ == "OK", "RENAME")
        names = list_names(m, '""', "INBOX.*")
        check("INBOX.Done" in names and "INBOX.Done.Deep" in names
              and "INBOX.Work" not in names, "after RENAME %r" % names)
        text = no_error(m.rename, "INBOX.Done", "INBOX.Done.Below")
        check("CANNOT" in text, "RENAME below itself: %r" % text)
        text = no_error(m.rename, "INBOX.Nope", "INBOX.X")
        check("NONEXISTENT" in text, "RENAME of a missing one: %r" % text)
        text = no_error(m.rename, "INBOX.Done", "user.bob.Stolen")
        check("NOPERM" in text, "RENAME into bob's tree: %r" % text)
        text = no_error(m.delete, "INBOX")
        check("CANNOT" in text, "DELETE INBOX: %r" % text)
        text = no_error(m.create, "INBOX..bad")
        check("CANNOT" in text, "bad name: %r" % text)
        typ, _ = m.delete("INBOX.Done.Deep")
        check(typ == "OK", "DELETE child")
        typ, _ = m.delete("INBOX.Done")
        check(typ == "OK", "DELETE")
        text = no_error(m.delete, "INBOX.Done")
        check("NONEXISTENT" in text, "second DELETE: %r" % text)
        m.logout()
    finally:
        close(m)
    # the admin may create anywhere and delete others' mailboxes
    m = login(ADMIN, ADMIN_PW)
    try:
        typ, _ = m.create("shared.adminmade")
        check(typ == "OK", "admin CREATE")
        typ, _ = m.delete("shared.adminmade")
        check(typ == "OK", "admin DELETE")
        check("user.bob.Secret" in list_names(m, "user.", "*"),
              "admin sees bob's mailboxes")
        m.logout()
    finally:
        close(m)


def test_subscribe_lsub():
    m = login()
    try:
        for n in ("INBOX", "INBOX.Sent", "shared.closed"):
            typ, _ = m.subscribe(n)
            check(typ == "OK", "SUBSCRIBE %s" % n)
        typ, data = m.lsub('""', "*")
        check(typ == "OK", "LSUB")
        subs = parse_list([b"* LSUB " + d for d in data if d], "LSUB")
        check(set(subs) == {"INBOX", "INBOX.Sent", "shared.closed"},
              "LSUB %r" % subs)
        typ, _ = m.unsubscribe("INBOX.Sent")
        check(typ == "OK", "UNSUBSCRIBE")
        text = no_error(m.unsubscribe, "INBOX.Sent")
        check("NONEXISTENT" in text, "second UNSUBSCRIBE: %r" % text)
        typ, data = m.lsub('""', "INBOX*")
        subs = parse_list([b"* LSUB " + d for d in data if d], "LSUB")
        check(set(subs) == {"INBOX"}, "LSUB INBOX* %r" % subs)
        m.logout()
    finally:
        close(m)


def test_lsub_percent_parents():
    """LSUB with '%': a level above a subscribed name, not subscribed
    itself, is answered \\Noselect where the pattern stops at it (RFC
    3501 6.3.9); '*' lists only the subscribed names."""
    i = inst()
    i.create("user.alice.x.a.b")
    with Raw(i.addr()) as c:
        raw_login(c)
        ok(c.cmd("s1", "SUBSCRIBE INBOX.x.a.b"), "s1")
        r = c.cmd("s2", 'LSUB "" INBOX.x.%')
        check(r == [b'* LSUB (\\Noselect) "." "INBOX.x.a"',
                    b"s2 OK LSUB completed"], "LSUB INBOX.x.%% %r" % r)
        r = c.cmd("s3", 'LSUB "INBOX.x." %')
        check(r == [b'* LSUB (\\Noselect) "." "INBOX.x.a"',
                    b"s3 OK LSUB completed"], "LSUB INBOX.x. %% %r" % r)
        r = c.cmd("s4", 'LSUB "" INBOX.x.a.%')
        check(r == [b'* LSUB () "." "INBOX.x.a.b"',
                    b"s4 OK LSUB completed"], "LSUB INBOX.x.a.%% %r" % r)
        r = c.cmd("s5", 'LSUB "" INBOX.x.*')
        check(r == [b'* LSUB () "." "INBOX.x.a.b"',
                    b"s5 OK LSUB completed"], "LSUB INBOX.x.* %r" % r)
        r = c.cmd("s6", 'LSUB "" INBOX.y.%')
        check(r == [b"s6 OK LSUB completed"], "LSUB INBOX.y.%% %r" % r)
        ok(c.cmd("s7", "UNSUBSCRIBE INBOX.x.a.b"), "s7")
        r = c.cmd("s8", 'LSUB "" INBOX.x.%')
        check(r == [b"s8 OK LSUB completed"], "after UNSUBSCRIBE %r" % r)


def test_status():
    i = inst()
    msg = (b"From: a@example.com\r\nTo: alice@example.com\r\n"
           b"Subject: s\r\n\r\nbody\r\n")
    for _ in range(2):
        i.mbtool("deliver", "-m", "Private", "alice", input=msg)
    m = login()
    try:
        typ, data = m.status("INBOX.Private",
                             "(MESSAGES RECENT UIDNEXT UIDVALIDITY UNSEEN "
                             "HIGHESTMODSEQ)")
        check(typ == "OK", "STATUS %r" % data)
        mm = re.match(rb'^"INBOX\.Private" \(MESSAGES 2 RECENT 2 UIDNEXT 3 '
                      rb'UIDVALIDITY (\d+) UNSEEN 2 HIGHESTMODSEQ (\d+)\)$',
                      data[0])
        check(mm is not None and int(mm.group(1)) > 0, "STATUS %r" % data)
        typ, data = m.status("INBOX", "(MESSAGES)")
        check(typ == "OK" and data[0] == b'"INBOX" (MESSAGES 0)',
              "STATUS INBOX %r" % data)
        # every response imaplib read was checked against the grammar
        check(m.responses_checked >= 6, "grammar tee saw only %d responses"
              % m.responses_checked)
        text = no_error(m.status, "INBOX.NoSuch", "(MESSAGES)")
        check("NONEXISTENT" in text, "STATUS missing %r" % text)
        m.logout()
    finally:
        close(m)


def test_misc_authenticated():
    with Raw(inst().addr()) as c:
        c.line()
        c.starttls()
        r = c.cmd("a0", "LOGIN alice s3cret-pw")
        check(r[-1].startswith(b"a0 OK"), "%r" % r)
        r = c.cmd("a1", "NAMESPACE")
        check(r[0] == b'* NAMESPACE (("INBOX." ".")) (("user." ".")) '
              b'(("" "."))', "NAMESPACE %r" % r)
        r = c.cmd("a2", "ENABLE CONDSTORE")
        check(r[0] == b"* ENABLED CONDSTORE" and r[1].startswith(b"a2 OK"),
              "ENABLE %r" % r)
        c.send("a3 IDLE\r\n")
        check(c.line().startswith(b"+ "), "IDLE continuation")
        c.send("DONE\r\n")
        r = c.until_tagged("a3")
        check(r[-1].startswith(b"a3 OK"), "IDLE %r" % r)
        r = c.cmd("a5", "FETCH 1 FLAGS")
        check(r[-1].startswith(b"a5 BAD"), "FETCH unselected %r" % r)
        # APPEND to a missing mailbox, synchronizing literal: refused
        # before the data
        c.send("a6 APPEND INBOX.Missing {10}\r\n")
        r = c.until_tagged("a6")
        check(r[-1].startswith(b"a6 NO [TRYCREATE]"), "APPEND %r" % r)
        # LITERAL+: the data is read and dropped, the session stays in step
        c.send("a7 APPEND INBOX.Missing {10+}\r\n0123456789\r\n")
        r = c.until_tagged("a7")
        check(r[-1].startswith(b"a7 NO [TRYCREATE]"), "APPEND+ %r" % r)
        r = c.cmd("a8", "NOOP")
        check(r == [b"a8 OK NOOP completed"], "NOOP %r" % r)


def add_flags(directory, recno, bits):
    """Set system flag bits on record recno of DIR/cyrus.index in place,
    under the mailbox's exclusive lock, with the record's CRC-32C
    recomputed (what a STORE would leave; no counter changes)."""
    import fcntl
    import struct
    path = os.path.join(directory, "cyrus.index")
    with open(path, "r+b") as f:
        fcntl.lockf(f.fileno(), fcntl.LOCK_EX, 1, 0)
        try:
            off = 4096 + recno * 128
            f.seek(off)
            rec = bytearray(f.read(128))
            flags, = struct.unpack_from("<I", rec, 4)
            struct.pack_into("<I", rec, 4, flags | bits)
            struct.pack_into("<I", rec, 124, crc32c(bytes(rec[:124])))
            f.seek(off)
            f.write(rec)
            f.flush()
            os.fsync(f.fileno())
        finally:
            fcntl.lockf(f.fileno(), fcntl.LOCK_UN, 1, 0)


def test_select_examine_close():
    i = inst()
    i.create("user.alice.Sel")
    for n in range(3):
        i.mbtool("deliver", "-D", "-m", "Sel", "alice",
                 input=b"Subject: %d\r\n\r\nbody\r\n" % n)
    d = i.mailbox_dir("user.alice.Sel")
    # the index's shared \Seen bit is not the user's \Seen
    add_flags(d, 1, FLAG_SEEN)
    add_flags(d, 2, FLAG_DELETED)
    with Raw(i.addr()) as c:
        c.line()
        c.starttls()
        c.cmd("a0", "LOGIN alice s3cret-pw")
        r = c.cmd("s0", "SELECT INBOX.Sel")
        check(r[-1].startswith(b"s0 OK") and
              b"* OK [UNSEEN 1] First unseen" in r, "SELECT %r" % r)
        r = c.cmd("s1", "STORE 1 +FLAGS.SILENT (\\Seen)")
        check(r == [b"s1 OK STORE completed"], "STORE %r" % r)
        r = c.cmd("a1", "EXAMINE INBOX.Sel")
        text = b"\n".join(r)
        for want in (rb"^\* FLAGS \(\\Answered \\Flagged \\Deleted "
                     rb"\\Seen \\Draft\)$",
                     rb"^\* 3 EXISTS$", rb"^\* 0 RECENT$",
                     rb"^\* OK \[UNSEEN 2\] ", rb"^\* OK \[UIDVALIDITY \d+\]",
                     rb"^\* OK \[UIDNEXT 4\]", rb"^\* OK \[HIGHESTMODSEQ \d+\]",
                     rb"^\* OK \[PERMANENTFLAGS \(\)\]",
                     rb"^a1 OK \[READ-ONLY\] EXAMINE completed$"):
            check(re.search(want, text, re.M), "EXAMINE: %r not in %r"
                  % (want, r))
        r = c.cmd("a2", "FETCH 1 FLAGS")
        check(r == [b"* 1 FETCH (FLAGS (\\Seen))", b"a2 OK FETCH completed"],
              "FETCH %r" % r)
        r = c.cmd("a3", "CLOSE")       # read-only: nothing expunged
        check(r[-1].startswith(b"a3 OK"), "CLOSE %r" % r)
        r = c.cmd("a4", "FETCH 1 FLAGS")
        check(r[-1].startswith(b"a4 BAD"), "FETCH after CLOSE %r" % r)
        r = c.cmd("a5", "SELECT INBOX.Sel")
        check(r[-1].startswith(b"a5 OK [READ-WRITE]") and b"* 3 EXISTS" in r
              and any(ln.startswith(b"* OK [PERMANENTFLAGS (") and b"\\*"
                      in ln for ln in r), "SELECT %r" % r)
        r = c.cmd("a6", "UNSELECT")
        check(r[-1].startswith(b"a6 OK"), "UNSELECT %r" % r)
        r = c.cmd("a7", "STATUS INBOX.Sel (MESSAGES)")
        check(r[0] == b'* STATUS "INBOX.Sel" (MESSAGES 3)', "%r" % r)
        r = c.cmd("a8", "SELECT INBOX.Sel")
        r = c.cmd("a9", "CLOSE")       # read-write: \Deleted expunged
        check(r[-1].startswith(b"a9 OK"), "CLOSE %r" % r)
        r = c.cmd("a10", "STATUS INBOX.Sel (MESSAGES UNSEEN)")
        check(r[0] == b'* STATUS "INBOX.Sel" (MESSAGES 2 UNSEEN 1)', "%r" % r)
        # a failed SELECT leaves the client unselected
        r = c.cmd("b1", "SELECT INBOX.Sel")
        r = c.cmd("b2", "SELECT user.bob.Secret")
        check(r[-1].startswith(b"b2 NO [NONEXISTENT]"), "%r" % r)
        r = c.cmd("b3", "CHECK")
        check(r[-1].startswith(b"b3 BAD"), "CHECK unselected %r" % r)
    i.mbtool("check", "user.alice.Sel")


def test_bad_input():
    with Raw(inst().addr()) as c:
        c.line()
        for tag, line in (("b1", "FROB"), ("b2", "LOGIN"),
                          ("b3", "NOOP extra"), ("b4", 'LOGIN "unterminated'),
                          ("b5", "CREATE a b")):
            r = c.cmd(tag, line)
            check(len(r) == 1 and r[0].startswith(tag.encode() + b" BAD ")
                  and len(r[0]) > len(tag) + 6, "%s: %r" % (line, r))
        c.send("\r\n")
        r = c.line()
        check(r.startswith(b"* BAD"), "empty line %r" % r)
        # an over-long line
        c.send("b6 NOOP " + "x" * 70000 + "\r\n")
        r = c.line()
        check(r.startswith(b"* BAD") or r.startswith(b"b6 BAD"),
              "long line %r" % r[:100])
        # a literal over the limit is refused before the client sends it
        c.send("b7 LOGIN {100000}\r\n")
        r = c.line()
        check(r.startswith(b"b7 BAD") and b"too large" in r.lower(),
              "big literal %r" % r)
        # a literal within the limit is accepted with "+"
        c.send("b8 LOGIN {5}\r\n")
        check(c.line().startswith(b"+ "), "continuation")
        c.send("alice {3}\r\n")
        check(c.line().startswith(b"+ "), "continuation 2")
        c.send("pwd\r\n")
        r = c.until_tagged("b8")
        check(r[-1].startswith(b"b8 NO [PRIVACYREQUIRED]"), "%r" % r)
        r = c.cmd("b9", "NOOP")
        check(r == [b"b9 OK NOOP completed"], "session alive %r" % r)
        r = c.cmd("b10", "LOGOUT")
        check(r[0].startswith(b"* BYE") and r[1] == b"b10 OK LOGOUT completed",
              "LOGOUT %r" % r)
        check(c.at_eof(), "connection closed after LOGOUT")
    check(not inst().worker_trouble(inst().log()), "worker trouble: %r"
          % inst().worker_trouble(inst().log()))


def test_sigterm_idle_client():
    i = inst()
    with Raw(i.addr()) as c:
        c.line()
        r = c.cmd("s1", "NOOP")
        check(r[-1].startswith(b"s1 OK"), "%r" % r)
        global _inst
        _inst = None
        try:
            i.proc.send_signal(15)
            got = []
            try:
                while True:
                    got.append(c.line())
            except (ConnectionClosed, OSError):
                pass
            check(b"* BYE Server shutting down" in got,
                  "no BYE at shutdown: %r" % got)
            check(wait_until(lambda: not i.running(), 60), "master running")
        finally:
            i.__exit__(None, None, None)


# ---- messages: FETCH, STORE, EXPUNGE, APPEND, COPY, MOVE, IDLE ----------

MULTI = (b"From: Ann Example <ann@example.com>\r\n"
         b"To: alice@example.com, Bob <bob@example.net>\r\n"
         b"Subject: multi part\r\n"
         b"Date: Thu, 21 Nov 2024 12:00:00 +0000\r\n"
         b"Message-ID: <m1@example.com>\r\n"
         b"MIME-Version: 1.0\r\n"
         b"Content-Type: multipart/mixed; boundary=\"XX\"\r\n"
         b"\r\n"
         b"preamble\r\n"
         b"--XX\r\n"
         b"Content-Type: text/plain; charset=us-ascii\r\n"
         b"\r\n"
         b"first part\r\n"
         b"--XX\r\n"
         b"Content-Type: text/html\r\n"
         b"Content-Transfer-Encoding: 7bit\r\n"
         b"\r\n"
         b"<p>second</p>\r\n"
         b"--XX--\r\n")


def raw_login(c, user="alice", pw=ALICE_PW):
    c.line()
    c.starttls()
    r = c.cmd("L0", "LOGIN %s %s" % (user, pw))
    check(r[-1].startswith(b"L0 OK"), "LOGIN %r" % r)


def literal_of(resp, label):
    """The bytes of `label {n}` inside one FETCH response."""
    i = resp.find(label + b" {")
    check(i >= 0, "%r not in %r" % (label, resp[:300]))
    j = resp.index(b"}\r\n", i)
    n = int(resp[i + len(label) + 2:j])
    return resp[j + 3:j + 3 + n]


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


def test_fetch():
    i = inst()
    i.create("user.alice.Fetch")
    i.mbtool("deliver", "-m", "Fetch", "alice", input=MULTI)
    d = i.mailbox_dir("user.alice.Fetch")
    with open(os.path.join(d, "1."), "rb") as f:
        spool = f.read()
    hdr_end = spool.index(b"\r\n\r\n") + 4
    with Raw(i.addr()) as c:
        raw_login(c)
        ok(c.cmd("a1", "SELECT INBOX.Fetch"), "a1")
        r = ok(c.lcmd("a2", "FETCH 1 (BODY.PEEK[] RFC822.SIZE FLAGS UID "
                            "INTERNALDATE)"), "a2")
        check(len(r) == 2, "one FETCH response %r" % r)
        check(literal_of(r[0], b"BODY[]") == spool, "BODY[] != spool file")
        check(b"RFC822.SIZE %d" % len(spool) in r[0], "size %r" % r[0])
        check(b"FLAGS (\\Recent)" in r[0] and b"UID 1" in r[0], "%r" % r[0])
        check(re.search(rb'INTERNALDATE "\d\d-[A-Z][a-z]{2}-\d{4} '
                        rb'\d\d:\d\d:\d\d [+-]\d{4}"', r[0]), "%r" % r[0])
        # partials
        r = ok(c.lcmd("a3", "FETCH 1 (BODY.PEEK[]<0.10> "
                            "BODY.PEEK[TEXT]<5.8>)"), "a3")
        check(literal_of(r[0], b"BODY[]<0>") == spool[:10], "%r" % r[0])
        check(literal_of(r[0], b"BODY[TEXT]<5>") ==
              spool[hdr_end + 5:hdr_end + 13], "%r" % r[0])
        r = ok(c.lcmd("a4", "FETCH 1 (BODY.PEEK[]<99999.5>)"), "a4")
        check(b"BODY[]<99999> {0}" in r[0] or b'BODY[]<99999> ""' in r[0],
              "origin past the end %r" % r[0])
        # sections
        r = ok(c.lcmd("a5", "FETCH 1 (BODY.PEEK[1] BODY.PEEK[2.MIME] "
                            "BODY.PEEK[HEADER.FIELDS (Subject)] "
                            "RFC822.HEADER)"), "a5")
        check(literal_of(r[0], b"BODY[1]") == b"first part", "%r" % r[0])
        check(literal_of(r[0], b"BODY[2.MIME]").startswith(
            b"Content-Type: text/html\r\n"), "%r" % r[0])
        check(literal_of(r[0], b"BODY[HEADER.FIELDS (SUBJECT)]") ==
              b"Subject: multi part\r\n\r\n", "%r" % r[0])
        check(literal_of(r[0], b"RFC822.HEADER") == spool[:hdr_end],
              "%r" % r[0])
        r = ok(c.lcmd("a6", "FETCH 1 (ENVELOPE BODYSTRUCTURE BODY)"), "a6")
        check(b'"multi part"' in r[0] and b'"<m1@example.com>"' in r[0] and
              b'(("Ann Example" NIL "ann" "example.com"))' in r[0],
              "ENVELOPE %r" % r[0])
        check(re.search(rb'BODYSTRUCTURE \(\("TEXT" "PLAIN" \("CHARSET" '
                        rb'"us-ascii"\) NIL NIL "7BIT" 10 1 .*\)\("TEXT" '
                        rb'"HTML" NIL NIL NIL "7BIT" 13 1.*\) "MIXED" '
                        rb'\("BOUNDARY" "XX"\)', r[0]), "BS %r" % r[0])
        check(b"FLAGS" not in r[0], "no \\Seen from ENVELOPE %r" % r[0])
        ok(c.cmd("a7", "FETCH 1 ALL"), "a7")
        ok(c.cmd("a8", "FETCH 1 FAST"), "a8")
        ok(c.lcmd("a9", "FETCH 1 FULL"), "a9")
        r = ok(c.cmd("b1", "FETCH 1 FLAGS"), "b1")
        check(b"FLAGS (\\Recent)" in r[0], "peek kept unseen %r" % r)
        # EXAMINE: a body fetch sets nothing
        ok(c.cmd("b2", "EXAMINE INBOX.Fetch"), "b2")
        r = c.cmd("b2a", "STORE 1 +FLAGS (\\Flagged)")
        check(r[-1].startswith(b"b2a NO"), "STORE read-only %r" % r)
        r = c.cmd("b2b", "EXPUNGE")
        check(r[-1].startswith(b"b2b NO"), "EXPUNGE read-only %r" % r)
        r = ok(c.lcmd("b3", "FETCH 1 BODY[TEXT]"), "b3")
        check(b"FLAGS" not in r[0], "read-only fetch %r" % r)
        # RFC822.TEXT without PEEK sets \Seen and reports FLAGS
        ok(c.cmd("b4", "SELECT INBOX.Fetch"), "b4")
        r = ok(c.lcmd("b5", "FETCH 1 RFC822.TEXT"), "b5")
        check(literal_of(r[0], b"RFC822.TEXT") == spool[hdr_end:]
              and b"FLAGS (\\Seen)" in r[0], "RFC822.TEXT %r" % r)
        r = ok(c.lcmd("b6", "UID FETCH 1:* (RFC822 MODSEQ)"), "b6")
        check(literal_of(r[0], b"RFC822") == spool and b"UID 1" in r[0]
              and re.search(rb"MODSEQ \(\d+\)", r[0]), "%r" % r)
        r = c.cmd("b7", "FETCH 5 FLAGS")
        check(r[-1].startswith(b"b7 BAD"), "bad number %r" % r)
        r = c.cmd("b8", "UID FETCH 5:7 FLAGS")
        check(r == [b"b8 OK UID FETCH completed"], "no such uid %r" % r)
        r = ok(c.cmd("b9", "SEARCH ALL"), "b9")
        check(r[0] == b"* SEARCH 1", "SEARCH ALL %r" % r)
    # imaplib understands the responses
    m = login()
    try:
        m.select("INBOX.Fetch", readonly=True)
        typ, data = m.fetch("1", "(BODY.PEEK[] FLAGS)")
        check(typ == "OK" and data[0][1] == spool, "imaplib %r" % data[:1])
        m.logout()
    finally:
        close(m)


def test_search():
    """SEARCH and UID SEARCH over messages delivered by mbtool: flags,
    header and body keys, sizes, OR/NOT, sequence sets, CHARSET UTF-8, an
    encoded-word subject, a bad charset, CONDSTORE's MODSEQ."""
    i = inst()
    i.create("user.alice.Search")
    msgs = [
        b"From: Ann <ann@example.com>\r\nTo: bob@example.org\r\n"
        b"Subject: quarterly report\r\nDate: Mon, 4 Nov 2024 10:00:00 +0000"
        b"\r\nMessage-ID: <s1@example.com>\r\n\r\nnumbers inside\r\n",
        b"From: Carl <carl@example.net>\r\nTo: ann@example.com\r\n"
        b"Subject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe?=\r\n"
        b"Date: Tue, 5 Nov 2024 10:00:00 +0000\r\n"
        b"Message-ID: <s2@example.com>\r\n\r\n" + b"long body\r\n" * 400,
        b"From: Ann <ann@example.com>\r\nTo: carl@example.net\r\n"
        b"Subject: lunch\r\nDate: Wed, 6 Nov 2024 10:00:00 +0000\r\n"
        b"Message-ID: <s3@example.com>\r\n\r\nsee you at noon\r\n",
    ]
    for m in msgs:
        i.mbtool("deliver", "-m", "Search", "alice", input=m)
    with Raw(i.addr()) as c:
        raw_login(c)
        ok(c.cmd("s1", "SELECT INBOX.Search"), "s1")
        ok(c.cmd("s2", "STORE 3 +FLAGS (\\Flagged)"), "s2")
        cases = [
            ("SEARCH ALL", b"* SEARCH 1 2 3"),
            ("SEARCH FROM ann", b"* SEARCH 1 3"),
            ("SEARCH SUBJECT REPORT", b"* SEARCH 1"),
            ("SEARCH BODY noon", b"* SEARCH 3"),
            ("SEARCH TEXT numbers", b"* SEARCH 1"),
            ("SEARCH FLAGGED", b"* SEARCH 3"),
            ("SEARCH UNFLAGGED NOT FROM carl", b"* SEARCH 1"),
            ("SEARCH OR SUBJECT lunch LARGER 2000", b"* SEARCH 2 3"),
            ("SEARCH 2:* SENTSINCE 5-Nov-2024", b"* SEARCH 2 3"),
            ("SEARCH SENTBEFORE 5-Nov-2024", b"* SEARCH 1"),
            ("SEARCH HEADER Message-ID s2@", b"* SEARCH 2"),
            ("UID SEARCH FROM carl", b"* SEARCH 2"),
            ("SEARCH SUBJECT nothing-like-this", b"* SEARCH"),
        ]
        for n, (cmd, want) in enumerate(cases):
            tag = "t%d" % n
            r = ok(c.cmd(tag, cmd), tag)
            check(r[0] == want, "%s: %r, want %r" % (cmd, r, want))
        # 8-bit search text travels as a literal (LITERAL+ here); the
        # encoded-word subject is decoded and case-folded before matching
        word = "GR\u00dc\u00dfE".encode("utf-8")
        c.send(b"u0 SEARCH CHARSET UTF-8 SUBJECT {%d+}\r\n%s\r\n"
               % (len(word), word))
        r = c.until_tagged("u0")
        check(r[0] == b"* SEARCH 2" and r[-1].startswith(b"u0 OK"),
              "UTF-8 literal search %r" % r)
        r = c.cmd("u1", "SEARCH CHARSET KOI8-R SUBJECT x")
        check(r[-1].startswith(b"u1 NO [BADCHARSET"), "bad charset %r" % r)
        r = ok(c.cmd("u2", "SEARCH MODSEQ 1"), "u2")
        check(re.match(rb"\* SEARCH 1 2 3 \(MODSEQ \d+\)$", r[0]),
              "MODSEQ search %r" % r)
    m = login()
    try:
        m.select("INBOX.Search", readonly=True)
        typ, data = m.search(None, "FROM", "ann")
        check(typ == "OK" and data == [b"1 3"], "imaplib search %r" % data)
        m.logout()
    finally:
        close(m)


def test_search_addresses():
    """FROM/TO/CC/BCC match the parsed addresses of the ENVELOPE (RFC
    3501 6.4.4) as well as the field text: comments inside an address,
    a folded quoted display name, an encoded-word name."""
    i = inst()
    i.create("user.alice.SearchAddr")
    msgs = [
        b"From: <user-from (comment)@ (comment) domain.org>\r\n"
        b"To: \"Dora\r\n Quoted\" <dora @ example.net>\r\n"
        b"Subject: one\r\n\r\nbody\r\n",
        b"From: =?UTF-8?Q?J=C3=B6rg?= <joerg@example.de>\r\n"
        b"Cc: list: carl (Carl C) @ example.org, ann@example.com;\r\n"
        b"Bcc: x.y(c)@(c)z.example\r\n"
        b"Subject: two\r\n\r\nbody\r\n",
    ]
    for m in msgs:
        i.mbtool("deliver", "-m", "SearchAddr", "alice", input=m)
    with Raw(i.addr()) as c:
        raw_login(c)
        ok(c.cmd("a1", "SELECT INBOX.SearchAddr"), "a1")
        r = ok(c.cmd("a2", "FETCH 1 ENVELOPE"), "a2")
        check(b'((NIL NIL "user-from" "domain.org"))' in r[0],
              "ENVELOPE %r" % r[0])
        cases = [
            ("SEARCH FROM user-from@domain.org", b"* SEARCH 1"),
            ("SEARCH FROM USER-FROM@DOMAIN.ORG", b"* SEARCH 1"),
            ("SEARCH FROM comment", b"* SEARCH 1"),      # the field text
            ("SEARCH TO dora@example.net", b"* SEARCH 1"),
            ('SEARCH TO "Dora Quoted"', b"* SEARCH 1"),
            ("SEARCH CC carl@example.org", b"* SEARCH 2"),
            ("SEARCH CC ann@example.com", b"* SEARCH 2"),
            ("SEARCH BCC x.y@z.example", b"* SEARCH 2"),
            ("SEARCH NOT BCC x.y@z.example", b"* SEARCH 1"),
            ("SEARCH FROM joerg@example.de", b"* SEARCH 2"),
            ("SEARCH TO user-from@domain.org", b"* SEARCH"),
            ("UID SEARCH OR FROM user-from@domain.org CC carl@example.org",
             b"* SEARCH 1 2"),
        ]
        for n, (cmd, want) in enumerate(cases):
            tag = "t%d" % n
            r = ok(c.cmd(tag, cmd), tag)
            check(r[0] == want, "%s: %r, want %r" % (cmd, r, want))
        word = "J\u00d6RG".encode("utf-8")
        c.send(b"u0 SEARCH CHARSET UTF-8 FROM {%d+}\r\n%s\r\n"
               % (len(word), word))
        r = c.until_tagged("u0")
        check(r[0] == b"* SEARCH 2" and r[-1].startswith(b"u0 OK"),
              "encoded-word display name %r" % r)


def test_store_expunge_two_sessions():
    i = inst()
    i.create("user.alice.Two")
    for n in range(4):
        i.mbtool("deliver", "-D", "-m", "Two", "alice",
                 input=b"Subject: %d\r\n\r\nbody %d\r\n" % (n, n))
    with Raw(i.addr()) as a, Raw(i.addr()) as b:
        raw_login(a)
        raw_login(b)
        ok(a.cmd("a1", "SELECT INBOX.Two"), "a1")
        ok(b.cmd("b1", "SELECT INBOX.Two"), "b1")
        r = ok(a.cmd("a2", "STORE 1 +FLAGS (\\Flagged)"), "a2")
        check(re.match(rb"^\* 1 FETCH \(FLAGS \(\\Flagged \\Recent\) UID 1\)$",
                       r[0]), "STORE %r" % r)
        r = ok(b.cmd("b2", "NOOP"), "b2")
        check(r[0] == b"* 1 FETCH (FLAGS (\\Flagged) UID 1)", "NOOP %r" % r)
        r = ok(a.cmd("a3", "STORE 2 +FLAGS.SILENT (\\Deleted)"), "a3")
        check(len(r) == 1, ".SILENT %r" % r)
        # a new keyword is announced (FLAGS, PERMANENTFLAGS) before the
        # FETCH response that names it
        r = ok(a.cmd("a4", "UID STORE 1 FLAGS (\\Seen $Work)"), "a4")
        check(r == [b"* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft "
                    b"$Work)",
                    b"* OK [PERMANENTFLAGS (\\Answered \\Flagged \\Draft "
                    b"\\Deleted \\Seen $Work \\*)] Ok",
                    b"* 1 FETCH (FLAGS (\\Seen \\Recent $Work) UID 1)",
                    b"a4 OK UID STORE completed"], "%r" % r)
        r = ok(a.cmd("a5", "STORE 1 -FLAGS ($Work)"), "a5")
        check(r[0] == b"* 1 FETCH (FLAGS (\\Seen \\Recent) UID 1)", "%r" % r)
        # the other session learns of the new keyword and the changes
        r = ok(b.cmd("b2a", "NOOP"), "b2a")
        check(any(ln.startswith(b"* FLAGS (") and b"$Work" in ln
                  for ln in r) and
              b"* 1 FETCH (FLAGS (\\Seen) UID 1)" in r, "NOOP %r" % r)
        r = a.cmd("a6", "STORE 1 +FLAGS (\\Bogus)")
        check(r[-1].startswith(b"a6 BAD"), "bad flag %r" % r)
        # CONDSTORE
        r = ok(a.cmd("a7", "FETCH 1 (MODSEQ)"), "a7")
        ms = int(re.search(rb"MODSEQ \((\d+)\)", r[0]).group(1))
        r = ok(a.cmd("a8", "STORE 1,3 (UNCHANGEDSINCE %d) +FLAGS (\\Answered)"
                     % (ms - 1)), "a8")
        check(b"[MODIFIED 1]" in r[-1] and any(ln.startswith(b"* 3 FETCH")
                                               for ln in r), "%r" % r)
        # EXPUNGE: reported to the expunger at once, to the other session
        # not during FETCH, then on NOOP
        r = ok(a.cmd("a9", "EXPUNGE"), "a9")
        check(b"* 2 EXPUNGE" in r, "EXPUNGE %r" % r)
        r = ok(b.cmd("b3", "FETCH 1:4 FLAGS"), "b3")
        check(not any(b"EXPUNGE" in ln for ln in r), "during FETCH %r" % r)
        r = ok(b.cmd("b4", "NOOP"), "b4")
        check(b"* 2 EXPUNGE" in r, "NOOP after expunge %r" % r)
        r = ok(b.cmd("b5", "FETCH 1:* UID"), "b5")
        check([ln.split(b" FETCH")[0] for ln in r[:-1]] ==
              [b"* 1", b"* 2", b"* 3"] and b"UID 4" in r[2], "%r" % r)
        # UID EXPUNGE removes only the uids given
        ok(a.cmd("a10", "STORE 1:3 +FLAGS.SILENT (\\Deleted)"), "a10")
        r = ok(a.cmd("a11", "UID EXPUNGE 3"), "a11")
        check(b"* 2 EXPUNGE" in r and not any(ln.startswith(b"* 1 EXPUNGE")
                                              for ln in r), "%r" % r)
        r = ok(b.cmd("b6", "CHECK"), "b6")
        check(b"* 2 EXPUNGE" in r, "CHECK %r" % r)
        r = ok(a.cmd("a12", "STATUS INBOX.Two (MESSAGES)"), "a12")
        check(b"(MESSAGES 2)" in r[0], "%r" % r)
    i.mbtool("check", "user.alice.Two")


class KeywordTracker:
    """Client-side check of one session's responses: every keyword a
    FETCH FLAGS names must have been announced by an earlier FLAGS."""

    FETCH_FLAGS = re.compile(rb"^\* \d+ FETCH \(.*?FLAGS \(([^)]*)\)")

    def __init__(self, name):
        self.name = name
        self.known = None       # until the SELECT's FLAGS
        self.fetches = 0

    def feed(self, lines):
        for ln in lines:
            if ln.startswith(b"* FLAGS ("):
                self.known = set(ln[len(b"* FLAGS ("):-1].split())
                continue
            m = self.FETCH_FLAGS.match(ln)
            if not m:
                continue
            self.fetches += 1
            kws = {f for f in m.group(1).split() if not f.startswith(b"\\")}
            check(self.known is not None and kws <= self.known,
                  "%s: FETCH names keywords %r not announced by FLAGS "
                  "(known %r): %r" % (self.name, sorted(kws - (self.known
                                                              or set())),
                                      sorted(self.known or ()), ln))
        return lines


def test_keyword_announced_before_use():
    """A keyword defined by STORE is announced with FLAGS and
    PERMANENTFLAGS before any FETCH response names it: in the session
    that stored it and in another session, whether that one learns of it
    from a FETCH or from its updates; then under concurrent STOREs of new
    keywords from several sessions while another polls with NOOP and
    FETCH, no FETCH FLAGS of any session names a keyword its FLAGS did
    not announce."""
    i = inst()
    i.create("user.alice.Kw")
    for n in range(6):
        i.mbtool("deliver", "-D", "-m", "Kw", "alice",
                 input=b"Subject: %d\r\n\r\nbody %d\r\n" % (n, n))
    base = (b"* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft%s)",
            b"* OK [PERMANENTFLAGS (\\Answered \\Flagged \\Draft \\Deleted "
            b"\\Seen%s \\*)] Ok")
    with Raw(i.addr()) as a, Raw(i.addr()) as b:
        raw_login(a)
        raw_login(b)
        ok(a.cmd("a1", "SELECT INBOX.Kw"), "a1")
        ok(b.cmd("b1", "SELECT INBOX.Kw"), "b1")
        r = ok(a.cmd("a2", "STORE 1 +FLAGS ($one)"), "a2")
        check(r == [base[0] % b" $one", base[1] % b" $one",
                    b"* 1 FETCH (FLAGS (\\Recent $one) UID 1)",
                    b"a2 OK STORE completed"], "STORE $one %r" % r)
        # b asks for the flags before any update told it of $one
        r = ok(b.cmd("b2", "FETCH 1 FLAGS"), "b2")
        check(r == [base[0] % b" $one", base[1] % b" $one",
                    b"* 1 FETCH (FLAGS ($one))",
                    b"b2 OK FETCH completed"], "FETCH after $one %r" % r)
        r = ok(a.cmd("a3", "STORE 2 +FLAGS.SILENT ($two)"), "a3")
        check(r == [base[0] % b" $one $two", base[1] % b" $one $two",
                    b"a3 OK STORE completed"], "STORE.SILENT $two %r" % r)
        # b learns of $two from its update: FLAGS first
        r = ok(b.cmd("b3", "NOOP"), "b3")
        check(r == [base[0] % b" $one $two", base[1] % b" $one $two",
                    b"* 2 FETCH (FLAGS ($two) UID 2)",
                    b"b3 OK NOOP completed"], "NOOP after $two %r" % r)

    # concurrent load
    writers, rounds = 4, 8
    errors = []
    done = threading.Event()

    def writer(w):
        try:
            with Raw(i.addr()) as c:
                raw_login(c)
                kt = KeywordTracker("writer %d" % w)
                kt.feed(ok(c.cmd("s", "SELECT INBOX.Kw"), "s"))
                for n in range(rounds):
                    tag = "w%d" % n
                    kt.feed(ok(c.cmd(tag, "STORE %d +FLAGS ($w%d_%d)"
                                     % (n % 6 + 1, w, n)), tag))
                    if n % 3 == 2:
                        kt.feed(ok(c.cmd(tag + "f", "FETCH 1:* FLAGS"),
                                   tag + "f"))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with Raw(i.addr()) as p:
        raw_login(p)
        poll = KeywordTracker("poller")
        poll.feed(ok(p.cmd("p0", "SELECT INBOX.Kw"), "p0"))
        threads = [threading.Thread(target=writer, args=(w,))
                   for w in range(writers)]
        for t in threads:
            t.start()
        n = 0
        while any(t.is_alive() for t in threads):
            tag = "p%d" % n
            poll.feed(ok(p.cmd(tag, "NOOP" if n % 2 else "FETCH 1:6 FLAGS"),
                         tag))
            n += 1
        for t in threads:
            t.join(60)
        done.set()
        check(not errors, "writers: %r" % errors[:3])
        poll.feed(ok(p.cmd("pz", "FETCH 1:* FLAGS"), "pz"))
        want = {b"$w%d_%d" % (w, k) for w in range(writers)
                for k in range(rounds)}
        check(want <= poll.known, "keywords missing from FLAGS: %r"
              % sorted(want - poll.known))
        check(poll.fetches > 0 and n > 2, "the poller saw no FETCH")


def test_append_keywords_one_commit():
    """APPEND and COPY put a message's keywords into the one commit that
    makes it visible: another session never sees it without them (no
    later FETCH FLAGS for it), none are lost, under concurrent APPENDs of
    new keywords from several sessions while another session polls."""
    i = inst()
    i.create("user.alice.AppKw")
    i.create("user.alice.AppKw2")
    with Raw(i.addr()) as a, Raw(i.addr()) as b:
        raw_login(a)
        raw_login(b)
        ok(b.cmd("b1", "SELECT INBOX.AppKw"), "b1")
        msg = b"Subject: kw $first\r\n\r\nbody\r\n"
        a.send(b"a1 APPEND INBOX.AppKw ($first \\Flagged) {%d+}\r\n%s\r\n"
               % (len(msg), msg))
        r = ok(a.until_tagged("a1"), "a1")
        check(re.match(rb"^a1 OK \[APPENDUID \d+ 1\] APPEND completed$",
                       r[-1]), "APPEND %r" % r)
        r = ok(b.cmd("b2", "NOOP"), "b2")
        check(r == [b"* FLAGS (\\Answered \\Flagged \\Deleted \\Seen "
                    b"\\Draft $first)",
                    b"* OK [PERMANENTFLAGS (\\Answered \\Flagged \\Draft "
                    b"\\Deleted \\Seen $first \\*)] Ok",
                    b"* 1 EXISTS", b"* 1 RECENT", b"b2 OK NOOP completed"],
              "NOOP after APPEND %r" % r)
        r = ok(b.cmd("b3", "FETCH 1 FLAGS"), "b3")
        check(r == [b"* 1 FETCH (FLAGS (\\Flagged \\Recent $first))",
                    b"b3 OK FETCH completed"], "FETCH %r" % r)
        # COPY carries the keyword by name into the other mailbox
        r = ok(b.cmd("b4", "COPY 1 INBOX.AppKw2"), "b4")
        ok(a.cmd("a2", "EXAMINE INBOX.AppKw2"), "a2")
        r = ok(a.cmd("a3", "FETCH 1 FLAGS"), "a3")
        check(r == [b"* 1 FETCH (FLAGS (\\Flagged \\Recent $first))",
                    b"a3 OK FETCH completed"], "FETCH copy %r" % r)

    writers, rounds = 4, 8
    errors = []
    env = re.compile(rb'^\* (\d+) FETCH \(FLAGS \(([^)]*)\) '
                     rb'ENVELOPE \(NIL "kw ([^"]*)"')

    def appender(w):
        try:
            with Raw(i.addr()) as c:
                raw_login(c)
                ok(c.cmd("e", "EXAMINE INBOX.AppKw"), "e")
                for n in range(rounds):
                    kws = b"$a%d_%d $all" % (w, n)
                    body = b"Subject: kw %s\r\n\r\nbody %d %d\r\n" % (
                        kws, w, n)
                    tag = "w%d" % n
                    c.send(b"%s APPEND INBOX.AppKw (%s) {%d+}\r\n%s\r\n"
                           % (tag.encode(), kws, len(body), body))
                    ok(c.until_tagged(tag), tag)
                    if n % 2:
                        tag = "c%d" % n
                        ok(c.cmd(tag, "UID COPY 1:* INBOX.AppKw2"), tag)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def look(lines, tracker, seen):
        tracker.feed(lines)
        for ln in lines:
            if b" FETCH (" not in ln:
                continue
            m = env.match(ln)
            check(m is not None, "a FETCH FLAGS not asked for (the "
                  "message's flags changed after it became visible): %r"
                  % ln)
            want = set(m.group(3).split())
            have = set(m.group(2).split())
            check(want <= have, "message %s seen without its keywords: "
                  "%r" % (m.group(1).decode(), ln))
            seen.add(m.group(3))

    with Raw(i.addr()) as p:
        raw_login(p)
        tracker = KeywordTracker("poller")
        seen = set()
        look(ok(p.cmd("p0", "SELECT INBOX.AppKw"), "p0"), tracker, seen)
        threads = [threading.Thread(target=appender, args=(w,))
                   for w in range(writers)]
        for t in threads:
            t.start()
        n = 0
        while any(t.is_alive() for t in threads) or n < 2:
            tag = "p%d" % n
            look(ok(p.cmd(tag, "NOOP"), tag), tracker, seen)
            tag = "q%d" % n
            look(ok(p.cmd(tag, "FETCH 1:* (FLAGS ENVELOPE)"), tag),
                 tracker, seen)
            n += 1
        for t in threads:
            t.join(60)
        check(not errors, "appenders: %r" % errors[:3])
        # a NOOP first: an append that ended after the loop's last NOOP
        # is announced (EXISTS) only at the end of the next command, so
        # "1:*" of a FETCH sent before that does not reach it yet
        look(ok(p.cmd("py", "NOOP"), "py"), tracker, seen)
        look(ok(p.cmd("pz", "FETCH 1:* (FLAGS ENVELOPE)"), "pz"),
             tracker, seen)
        check(len(seen) == writers * rounds + 1,
              "%d messages seen, want %d" % (len(seen), writers * rounds + 1))
        # the copies too: every one with its keywords
        look(ok(p.cmd("r0", "EXAMINE INBOX.AppKw2"), "r0"), tracker, set())
        copies = set()
        look(ok(p.cmd("r1", "FETCH 1:* (FLAGS ENVELOPE)"), "r1"),
             tracker, copies)
        check(len(copies) > 1, "copies %r" % copies)


def index_flags(directory, recno):
    """The system flag bits of record recno of DIR/cyrus.index."""
    import struct
    with open(os.path.join(directory, "cyrus.index"), "rb") as f:
        f.seek(4096 + recno * 128)
        return struct.unpack_from("<I", f.read(128), 4)[0]


def test_append_keyword_limit():
    """An APPEND, COPY or MOVE with a keyword the mailbox cannot define
    (all 128 in use) is refused with NO [LIMIT], as a STORE of it is, and
    adds no message: never OK with the keyword silently left out.
    Keywords already defined still go in."""
    i = inst()
    i.create("user.alice.KwFull")
    i.create("user.alice.KwSrc")
    i.mbtool("deliver", "-D", "-m", "KwSrc", "alice",
             input=b"Subject: src\r\n\r\nbody\r\n")
    i.mbtool("deliver", "-D", "-m", "KwFull", "alice",
             input=b"Subject: full\r\n\r\nbody\r\n")
    with Raw(i.addr()) as a:
        raw_login(a)
        ok(a.cmd("a1", "SELECT INBOX.KwFull"), "a1")
        ok(a.cmd("a2", "STORE 1 +FLAGS.SILENT (%s)"
                 % " ".join("kw%d" % k for k in range(128))), "a2")
        r = a.cmd("a3", "STORE 1 +FLAGS.SILENT (kw128)")
        check(r[-1] == b"a3 NO [LIMIT] Too many keywords in this mailbox",
              "STORE of a 129th keyword %r" % r)
        msg = b"Subject: more\r\n\r\nbody\r\n"
        a.send(b"a4 APPEND INBOX.KwFull (kw128 \\Flagged) {%d+}\r\n%s\r\n"
               % (len(msg), msg))
        r = a.until_tagged("a4")
        check(r[-1] == b"a4 NO [LIMIT] Too many keywords in this mailbox",
              "APPEND with a 129th keyword %r" % r)
        r = ok(a.cmd("a5", "STATUS INBOX.KwFull (MESSAGES)"), "a5")
        check(b"(MESSAGES 1)" in r[0], "a refused APPEND added: %r" % r)
        a.send(b"a6 APPEND INBOX.KwFull (kw7) {%d+}\r\n%s\r\n"
               % (len(msg), msg))
        r = ok(a.until_tagged("a6"), "a6")
        r = ok(a.cmd("a7", "FETCH 2 (FLAGS)"), "a7")
        check(any(re.match(rb"^\* 2 FETCH \(FLAGS \(.*\bkw7\b", ln)
                  for ln in r), "APPEND of a defined keyword %r" % r)
        # COPY and MOVE of a message with a keyword KwFull lacks: refused,
        # nothing copied, the source stays
        ok(a.cmd("a8", "SELECT INBOX.KwSrc"), "a8")
        ok(a.cmd("a9", "STORE 1 +FLAGS.SILENT (other)"), "a9")
        for tag, cmd in (("b1", "COPY"), ("b2", "MOVE")):
            r = a.cmd(tag, "%s 1 INBOX.KwFull" % cmd)
            check(r[-1] == b"%s NO [LIMIT] Too many keywords in this "
                  b"mailbox" % tag.encode(), "%s %r" % (cmd, r))
        r = ok(a.cmd("b3", "STATUS INBOX.KwFull (MESSAGES)"), "b3")
        check(b"(MESSAGES 2)" in r[0], "a refused COPY added: %r" % r)
        r = ok(a.cmd("b4", "FETCH 1 (FLAGS)"), "b4")
        check(r[0].startswith(b"* 1 FETCH (FLAGS (") and b"other" in r[0],
              "MOVE source %r" % r)
    i.mbtool("check", "user.alice.KwFull")
    i.mbtool("check", "user.alice.KwSrc")


def test_seen_per_user():
    """\\Seen is per user (the seen-state database), not the index's."""
    i = inst()
    i.create("user.alice.Shared", {"bob": "lrs"})
    for n in range(3):
        i.mbtool("deliver", "-D", "-m", "Shared", "alice",
                 input=b"Subject: %d\r\n\r\nbody %d\r\n" % (n, n))
    d = i.mailbox_dir("user.alice.Shared")
    with Raw(i.addr()) as a, Raw(i.addr()) as b:
        raw_login(a)
        raw_login(b, "bob", BOB_PW)
        r = ok(a.cmd("a1", "SELECT INBOX.Shared"), "a1")
        check(b"* OK [UNSEEN 1] First unseen" in r, "SELECT %r" % r)
        r = ok(b.cmd("b1", "SELECT user.alice.Shared"), "b1")
        check(b"READ-WRITE" in r[-1] and b"\\Seen" in
              next(ln for ln in r if b"PERMANENTFLAGS" in ln), "%r" % r)
        # a body fetch sets alice's \Seen, STORE another
        r = ok(a.cmd("a2", "FETCH 1 BODY[TEXT]"), "a2")
        check(b"FLAGS (\\Seen \\Recent)" in b"".join(r), "FETCH BODY %r" % r)
        r = ok(a.cmd("a3", "STORE 2 +FLAGS (\\Seen \\Flagged)"), "a3")
        check(r[0] == b"* 2 FETCH (FLAGS (\\Flagged \\Seen \\Recent) UID 2)",
              "STORE %r" % r)
        # the index's shared \Seen bit stays clear
        check(not index_flags(d, 0) & FLAG_SEEN and
              not index_flags(d, 1) & FLAG_SEEN, "index \\Seen set")
        # bob: \Flagged (shared) shows on NOOP, alice's \Seen does not;
        # \Recent is per user, so bob's first session has them too
        r = ok(b.cmd("b2", "NOOP"), "b2")
        check(r[:-1] == [b"* 2 FETCH (FLAGS (\\Flagged \\Recent) UID 2)"],
              "bob NOOP %r" % r)
        r = ok(b.cmd("b3", "FETCH 1:3 FLAGS"), "b3")
        check(r[:-1] == [b"* 1 FETCH (FLAGS (\\Recent))",
                         b"* 2 FETCH (FLAGS (\\Flagged \\Recent))",
                         b"* 3 FETCH (FLAGS (\\Recent))"], "bob FETCH %r" % r)
        r = ok(b.cmd("b4", "SEARCH UNSEEN"), "b4")
        check(r[0] == b"* SEARCH 1 2 3", "bob SEARCH %r" % r)
        r = ok(b.cmd("b5", "STORE 3 +FLAGS (\\Seen)"), "b5")
        check(r[0] == b"* 3 FETCH (FLAGS (\\Seen \\Recent) UID 3)", "%r" % r)
        # and bob's \Seen does not show for alice
        r = ok(a.cmd("a4", "NOOP"), "a4")
        check(len(r) == 1, "alice NOOP %r" % r)
        r = ok(a.cmd("a5", "SEARCH SEEN"), "a5")
        check(r[0] == b"* SEARCH 1 2", "alice SEARCH %r" % r)
        r = ok(b.cmd("b6", "STATUS user.alice.Shared (UNSEEN)"), "b6")
        check(b"(UNSEEN 2)" in r[0], "bob STATUS %r" % r)
    # a new session reads the state back from the seen database
    with Raw(i.addr()) as a:
        raw_login(a)
        r = ok(a.cmd("c1", "STATUS INBOX.Shared (UNSEEN MESSAGES)"), "c1")
        check(b"UNSEEN 1" in r[0], "STATUS %r" % r)
        r = ok(a.cmd("c2", "EXAMINE INBOX.Shared"), "c2")
        check(b"* OK [UNSEEN 3] First unseen" in r, "EXAMINE %r" % r)
        r = ok(a.cmd("c3", "FETCH 1:3 FLAGS"), "c3")
        check(r[:-1] == [b"* 1 FETCH (FLAGS (\\Seen))",
                         b"* 2 FETCH (FLAGS (\\Flagged \\Seen))",
                         b"* 3 FETCH (FLAGS ())"], "FETCH %r" % r)
        # EXAMINE: a body fetch marks nothing
        r = ok(a.cmd("c4", "FETCH 3 BODY[TEXT]"), "c4")
        check(b"FLAGS" not in b"".join(r), "read-only FETCH %r" % r)
        r = ok(a.cmd("c5", "SELECT INBOX.Shared"), "c5")
        check(b"* OK [UNSEEN 3] First unseen" in r, "SELECT %r" % r)
        r = ok(a.cmd("c6", "STORE 1 -FLAGS.SILENT (\\Seen)"), "c6")
        r = ok(a.cmd("c7", "SEARCH UNSEEN"), "c7")
        check(r[0] == b"* SEARCH 1 3", "SEARCH %r" % r)
    with Raw(i.addr()) as b:
        raw_login(b, "bob", BOB_PW)
        r = ok(b.cmd("d1", "EXAMINE user.alice.Shared"), "d1")
        check(b"* OK [UNSEEN 1] First unseen" in r, "bob EXAMINE %r" % r)
        r = ok(b.cmd("d2", "FETCH 3 FLAGS"), "d2")
        check(r[0] == b"* 3 FETCH (FLAGS (\\Seen))", "bob FETCH %r" % r)
    i.mbtool("check", "user.alice.Shared")


def test_recent():
    """\\Recent (RFC 3501 2.3.2): the first read-write session of the user
    to see a message gets it as \\Recent, no other; EXAMINE shows without
    claiming; STATUS counts what no session has claimed yet."""
    i = inst()
    i.create("user.alice.Rec")
    for n in range(2):
        i.mbtool("deliver", "-D", "-m", "Rec", "alice",
                 input=b"Subject: r%d\r\n\r\nbody\r\n" % n)
    with Raw(i.addr()) as a, Raw(i.addr()) as b, Raw(i.addr()) as x:
        raw_login(a)
        raw_login(b)
        raw_login(x)
        r = ok(x.cmd("x1", "STATUS INBOX.Rec (MESSAGES RECENT)"), "x1")
        check(r[0] == b'* STATUS "INBOX.Rec" (MESSAGES 2 RECENT 2)',
              "STATUS %r" % r)
        r = ok(x.cmd("x2", "EXAMINE INBOX.Rec"), "x2")
        check(b"* 2 RECENT" in r, "EXAMINE shows \\Recent %r" % r)
        r = ok(a.cmd("a1", "SELECT INBOX.Rec"), "a1")
        check(b"* 2 RECENT" in r, "first SELECT %r" % r)
        r = ok(b.cmd("b1", "SELECT INBOX.Rec"), "b1")
        check(b"* 0 RECENT" in r, "second SELECT %r" % r)
        r = ok(a.cmd("a2", "FETCH 1:2 FLAGS"), "a2")
        check(r[:-1] == [b"* 1 FETCH (FLAGS (\\Recent))",
                         b"* 2 FETCH (FLAGS (\\Recent))"], "%r" % r)
        r = ok(b.cmd("b2", "FETCH 1:2 FLAGS"), "b2")
        check(r[:-1] == [b"* 1 FETCH (FLAGS ())",
                         b"* 2 FETCH (FLAGS ())"], "%r" % r)
        r = ok(a.cmd("a3", "SEARCH RECENT"), "a3")
        check(r[0] == b"* SEARCH 1 2", "%r" % r)
        ok(a.cmd("a4", "STORE 1 +FLAGS.SILENT (\\Seen)"), "a4")
        r = ok(a.cmd("a5", "SEARCH NEW"), "a5")
        check(r[0] == b"* SEARCH 2", "%r" % r)
        r = ok(b.cmd("b3", "SEARCH OLD"), "b3")
        check(r[0] == b"* SEARCH 1 2", "%r" % r)
        r = ok(x.cmd("x3", "STATUS INBOX.Rec (RECENT)"), "x3")
        check(r[0] == b'* STATUS "INBOX.Rec" (RECENT 0)', "%r" % r)
        # a new message: the session that hears of it first claims it
        i.mbtool("deliver", "-D", "-m", "Rec", "alice",
                 input=b"Subject: r2\r\n\r\nbody\r\n")
        r = ok(b.cmd("b4", "NOOP"), "b4")
        check(r[:-1] == [b"* 3 EXISTS", b"* 1 RECENT"], "b NOOP %r" % r)
        r = ok(a.cmd("a6", "NOOP"), "a6")
        check(r[:-1] == [b"* 3 EXISTS", b"* 2 RECENT"], "a NOOP %r" % r)
        r = ok(b.cmd("b5", "FETCH 3 FLAGS"), "b5")
        check(r[0] == b"* 3 FETCH (FLAGS (\\Recent))", "%r" % r)
        r = ok(a.cmd("a7", "SEARCH RECENT"), "a7")
        check(r[0] == b"* SEARCH 1 2", "%r" % r)
        # an APPEND with \Seen into the selected mailbox claims in the
        # same write as its \Seen: what it appended and what arrived
        # before it unseen by any session
        i.mbtool("deliver", "-D", "-m", "Rec", "alice",
                 input=b"Subject: r3\r\n\r\nbody\r\n")
        msg = b"Subject: r4\r\n\r\nappended\r\n"
        r = ok(a.cmd("a8", "APPEND INBOX.Rec (\\Seen) {%d+}\r\n%s"
                     % (len(msg), msg.decode())), "a8")
        check(b"* 5 EXISTS" in r and b"* 4 RECENT" in r,
              "a's APPEND reply %r" % r)
        r = ok(b.cmd("b6", "NOOP"), "b6")
        check(r[:-1] == [b"* 5 EXISTS", b"* 1 RECENT"], "b NOOP %r" % r)
        r = ok(a.cmd("a9", "FETCH 4:5 FLAGS"), "a9")
        check(r[:-1] == [b"* 4 FETCH (FLAGS (\\Recent))",
                         b"* 5 FETCH (FLAGS (\\Seen \\Recent))"], "%r" % r)
        # from a read-only session: nothing claimed; b hears of it first
        msg = b"Subject: r5\r\n\r\nappended\r\n"
        ok(x.cmd("x4", "APPEND INBOX.Rec (\\Seen) {%d+}\r\n%s"
                 % (len(msg), msg.decode())), "x4")
        r = ok(b.cmd("b7", "NOOP"), "b7")
        check(r[:-1] == [b"* 6 EXISTS", b"* 2 RECENT"], "b NOOP %r" % r)
        r = ok(a.cmd("a10", "SEARCH RECENT"), "a10")
        check(r[0] == b"* SEARCH 1 2 4 5", "%r" % r)
    i.mbtool("check", "user.alice.Rec")


def test_seen_concurrent_sessions():
    """Two sessions of one user set \\Seen on different messages at the
    same time: none of the changes is lost (the seen state is changed by
    a locked read-modify-write), and the user's \\Seen moves the
    message's modseq, so the other session learns of it (CONDSTORE)."""
    import threading
    i = inst()
    i.create("user.alice.Conc")
    n = 40
    for k in range(n):
        i.mbtool("deliver", "-D", "-m", "Conc", "alice",
                 input=b"Subject: c%d\r\n\r\nbody\r\n" % k)
    errors = []
    with Raw(i.addr()) as a, Raw(i.addr()) as b:
        raw_login(a)
        raw_login(b)
        ok(a.cmd("a1", "SELECT INBOX.Conc (CONDSTORE)"), "a1")
        ok(b.cmd("b1", "SELECT INBOX.Conc (CONDSTORE)"), "b1")
        r = ok(a.cmd("a2", "FETCH 1 (MODSEQ)"), "a2")
        ms0 = int(re.search(rb"MODSEQ \((\d+)\)", r[0]).group(1))

        def run(c, tag, first):
            try:
                for k in range(first, n + 1, 2):
                    r = c.cmd("%s%d" % (tag, k),
                              "STORE %d +FLAGS.SILENT (\\Seen)" % k)
                    if not r[-1].startswith(b"%s%d OK" % (tag.encode(), k)):
                        errors.append(r)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
        ts = [threading.Thread(target=run, args=(a, "p", 1)),
              threading.Thread(target=run, args=(b, "q", 2))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        check(not errors, "STORE failed %r" % errors[:3])
        r = ok(a.cmd("a3", "FETCH 1 (MODSEQ)"), "a3")
        ms1 = int(re.search(rb"MODSEQ \((\d+)\)", r[-2]).group(1))
        check(ms1 > ms0, "\\Seen did not move the modseq (%d, %d)"
              % (ms0, ms1))
        # a CONDSTORE client of the user learns of a \Seen change made
        # by another session through CHANGEDSINCE
        ok(a.cmd("a4", "STORE 1 -FLAGS.SILENT (\\Seen)"), "a4")
        r = ok(b.cmd("b2", "FETCH 1:* (FLAGS) (CHANGEDSINCE %d)" % ms1),
               "b2")
        check(any(re.match(rb"^\* 1 FETCH \(.*FLAGS \(\)", ln)
                  for ln in r), "CHANGEDSINCE %r" % r[:4])
        ok(b.cmd("b3", "STORE 1 +FLAGS.SILENT (\\Seen)"), "b3")
    with Raw(i.addr()) as c:
        raw_login(c)
        r = ok(c.cmd("c1", "STATUS INBOX.Conc (MESSAGES UNSEEN)"), "c1")
        check(r[0] == b'* STATUS "INBOX.Conc" (MESSAGES %d UNSEEN 0)' % n,
              "a \\Seen change was lost: %r" % r)


def test_autologout():
    """A client that does not log in is logged out after prelogin_timeout
    (5 s here); a logged-in one is not (its timer is `timeout`, 30
    minutes at least), and both timers are checked in the same wait."""
    import time
    i = inst()
    # t0 before the connection: the server's timer starts later, so the
    # time measured is never shorter than the one the server waited
    t0 = time.monotonic()
    with Raw(i.addr()) as u, Raw(i.addr()) as a:
        raw_login(a)
        greeting = u.line()
        check(greeting.startswith(b"* OK"), "greeting %r" % greeting)
        u.sock.settimeout(90)
        ln = u.line()
        waited = time.monotonic() - t0
        check(ln == b"* BYE Autologout; idle for too long",
              "unauthenticated client got %r" % ln)
        # not before prelogin_timeout; after it, within a margin no loaded
        # machine reaches but far below `timeout` (30 minutes)
        check(4.5 <= waited <= 65.0, "autologout after %.1f s" % waited)
        try:
            rest = u.line()
        except ConnectionClosed:
            rest = None
        check(not rest, "connection stays open after BYE: %r" % rest)
        time.sleep(max(0.0, 6.0 - (time.monotonic() - t0)))
        r = ok(a.cmd("a1", "NOOP"), "a1")
        check(r == [b"a1 OK NOOP completed"], "logged-in session %r" % r)


def session_end_line(i, port, since=0, deadline=20):
    """The "imap: session end" line of the session whose client port is
    port (waited for: the worker logs it as the session ends).  Only the
    log after offset since is searched, so an older session that used
    the same client port cannot match."""
    pat = re.compile(r"imap: session end .*peer=<[^>]*:%d>.*" % port)

    def find():
        m = pat.search(i.log()[since:])
        return m.group(0) if m else None
    line = wait_until(find, deadline)
    check(line, "no session end line for client port %d: %r"
          % (port, i.log()[-800:]))
    return line


def end_fields(line):
    return dict(re.findall(r"(\w+)=<([^>]*)>", line))


def test_session_end_line():
    """At LOGOUT one line tells the session's user, peer, reason,
    duration, commands, bytes in and out, and the messages appended,
    fetched and expunged; a dropped connection says reason=<disconnect>,
    an idle one reason=<autologout>."""
    i = inst()
    i.create("user.bob.LogEnd")
    msg = b"Subject: x\r\n\r\nbody\r\n"
    since = len(i.log())
    with Raw(i.addr()) as c:
        port = c.sock.getsockname()[1]
        raw_login(c, BOB, BOB_PW)                       # STARTTLS, LOGIN
        for t in ("a1", "a2"):
            c.send("%s APPEND INBOX.LogEnd {%d+}\r\n" % (t, len(msg))
                   + msg.decode() + "\r\n")
            ok(c.until_tagged(t), t)
        ok(c.cmd("s1", "SELECT INBOX.LogEnd"), "s1")
        ok(c.lcmd("f1", "FETCH 1:2 BODY.PEEK[]"), "f1")
        ok(c.cmd("f2", "FETCH 1:2 FLAGS"), "f2")        # reads no message
        ok(c.cmd("st", "STORE 1 +FLAGS.SILENT (\\Deleted)"), "st")
        ok(c.cmd("e1", "EXPUNGE"), "e1")
        c.cmd("x1", "FOO")                              # BAD counts too
        ok(c.cmd("lo", "LOGOUT"), "lo")
    f = end_fields(session_end_line(i, port, since))
    check(f.get("user") == BOB and f.get("reason") == "logout",
          "user/reason: %r" % f)
    check(f.get("peer", "").endswith(":%d" % port), "peer: %r" % f)
    check(f.get("commands") == "11", "commands (STARTTLS, LOGIN, 2 APPEND, "
          "SELECT, 2 FETCH, STORE, EXPUNGE, FOO, LOGOUT): %r" % f)
    check(f.get("appended") == "2" and f.get("fetched") == "2" and
          f.get("expunged") == "1", "appended/fetched/expunged: %r" % f)
    check(re.match(r"^\d+\.\d{3}$", f.get("duration", "")),
          "duration: %r" % f)
    check(int(f.get("bytes_in", "0")) > 2 * len(msg) and
          int(f.get("bytes_out", "0")) > 2 * len(msg),
          "bytes in/out: %r" % f)
    # a client that just goes away
    since = len(i.log())
    with Raw(i.addr()) as c:
        port = c.sock.getsockname()[1]
        raw_login(c, BOB, BOB_PW)
    f = end_fields(session_end_line(i, port, since))
    check(f.get("reason") == "disconnect" and f.get("user") == BOB,
          "dropped connection: %r" % f)
    # idle past prelogin_timeout (5 s): autologout, no user yet
    since = len(i.log())
    with Raw(i.addr()) as c:
        port = c.sock.getsockname()[1]
        c.line()
        c.sock.settimeout(90)
        check(c.line() == b"* BYE Autologout; idle for too long",
              "no autologout")
    f = end_fields(session_end_line(i, port, since))
    check(f.get("reason") == "autologout" and f.get("user") == "" and
          f.get("commands") == "0", "autologout: %r" % f)


def test_append():
    i = inst()
    i.create("user.alice.App")
    msg = b"Subject: appended\r\nFrom: a@example.com\r\n\r\nline 1\r\n"
    m = login()
    try:
        typ, data = m.append("INBOX.App", "(\\Seen $Label)",
                             imaplib.Time2Internaldate(1700000000), msg)
        check(typ == "OK" and re.match(rb"^\[APPENDUID \d+ 1\]", data[0]),
              "APPEND %r" % data)
        typ, data = m.select("INBOX.App")
        check(typ == "OK" and data[0] == b"1", "SELECT %r" % data)
        typ, data = m.fetch("1", "(BODY.PEEK[] FLAGS INTERNALDATE)")
        check(typ == "OK" and data[0][1] == msg, "FETCH %r" % data)
        text = data[0][0] + data[1]
        check(b"\\Seen" in text and b"$Label" in text and
              b'"14-Nov-2023 22:13:20 +0000"' in text, "%r" % data)
        # another session's APPEND shows as EXISTS on NOOP
        with Raw(i.addr()) as c:
            raw_login(c)
            c.send("x1 APPEND INBOX.App {%d+}\r\n" % len(msg) + msg.decode()
                   + "\r\n")
            r = c.until_tagged("x1")
            check(re.match(rb"^x1 OK \[APPENDUID \d+ 2\]", r[-1]),
                  "LITERAL+ %r" % r)
            c.send("x2 APPEND INBOX.NoSuch {5}\r\n")
            r = c.until_tagged("x2")
            check(r[-1].startswith(b"x2 NO [TRYCREATE]"), "%r" % r)
            c.send("x3 APPEND INBOX.NoSuch {5+}\r\nabcde\r\n")
            r = c.until_tagged("x3")
            check(r[-1].startswith(b"x3 NO [TRYCREATE]"), "%r" % r)
            r = c.cmd("x4", "NOOP")
            check(r == [b"x4 OK NOOP completed"], "%r" % r)
        typ, data = m.noop()
        # over quota
        i.create("user.alice.Small")
        i.quota("user.alice.Small", 1)
        qtyp, qdata = m.append("INBOX.Small", None, None,
                               b"Subject: big\r\n\r\n" + b"x" * 3000
                               + b"\r\n")
        check(qtyp == "NO" and b"[OVERQUOTA]" in qdata[0], "quota %r"
              % qdata)
        exists = m.untagged_responses.get("EXISTS", [])
        check(typ == "OK" and exists[-1:] == [b"2"],
              "EXISTS after APPEND %r" % m.untagged_responses)
        m.logout()
    finally:
        close(m)
    i.mbtool("check", "user.alice.App")


def test_copy_move():
    i = inst()
    i.create("user.alice.Src")
    i.create("user.alice.Dst")
    for n in range(3):
        i.mbtool("deliver", "-D", "-m", "Src", "alice",
                 input=b"Subject: c%d\r\n\r\nbody %d\r\n" % (n, n))
    with Raw(i.addr()) as c:
        raw_login(c)
        ok(c.cmd("a1", "SELECT INBOX.Src"), "a1")
        ok(c.cmd("a2", "STORE 2 +FLAGS ($Kw \\Flagged)"), "a2")
        r = ok(c.cmd("a3", "COPY 1:2 INBOX.Dst"), "a3")
        m = re.match(rb"^a3 OK \[COPYUID (\d+) 1:2 1:2\]", r[-1])
        check(m is not None, "COPY %r" % r)
        # single-instance store: the copy is a hard link of the source
        for uid in (1, 2):
            a = os.stat(os.path.join(i.mailbox_dir("user.alice.Src"),
                                     "%d." % uid))
            b = os.stat(os.path.join(i.mailbox_dir("user.alice.Dst"),
                                     "%d." % uid))
            check(a.st_ino == b.st_ino and a.st_nlink == 2,
                  "uid %d: copy is not a hard link (inodes %d %d, "
                  "links %d)" % (uid, a.st_ino, b.st_ino, a.st_nlink))
        r = c.cmd("a4", "COPY 1 INBOX.Nope")
        check(r[-1].startswith(b"a4 NO [TRYCREATE]"), "%r" % r)
        r = ok(c.cmd("a5", "UID MOVE 2:3 INBOX.Dst"), "a5")
        check(any(re.match(rb"^\* OK \[COPYUID \d+ 2:3 3:4\]", ln)
                  for ln in r) and b"* 3 EXPUNGE" in r and
              b"* 2 EXPUNGE" in r, "MOVE %r" % r)
        r = ok(c.cmd("a6", "FETCH 1:* UID"), "a6")
        check(len(r) == 2 and b"UID 1" in r[0], "after MOVE %r" % r)
        r = ok(c.cmd("a6b", "UID COPY 1 INBOX.Dst"), "a6b")
        check(re.match(rb"^a6b OK \[COPYUID \d+ 1 5\]", r[-1]),
              "UID COPY %r" % r)
        ok(c.cmd("a7", "SELECT INBOX.Dst"), "a7")
        r = ok(c.lcmd("a8", "FETCH 1:4 (FLAGS BODY.PEEK[HEADER.FIELDS "
                            "(SUBJECT)])"), "a8")
        subj = [literal_of(x, b"BODY[HEADER.FIELDS (SUBJECT)]")
                for x in r[:-1]]
        check(subj == [b"Subject: c0\r\n\r\n", b"Subject: c1\r\n\r\n",
                       b"Subject: c1\r\n\r\n", b"Subject: c2\r\n\r\n"],
              "copied %r" % subj)
        check(b"$Kw" in r[1] and b"\\Flagged" in r[1] and b"$Kw" in r[2],
              "flags copied %r" % r)
    i.mbtool("check", "user.alice.Src")
    i.mbtool("check", "user.alice.Dst")


def test_idle_sees_lmtp_delivery():
    import time
    i = inst()
    with Raw(i.addr()) as c:
        raw_login(c, "bob", BOB_PW)
        r = ok(c.cmd("i1", "SELECT INBOX"), "i1")
        n = int([ln for ln in r if ln.endswith(b" EXISTS")][0].split()[1])
        c.send("i2 IDLE\r\n")
        check(c.line().startswith(b"+ "), "IDLE continuation")
        t0 = time.monotonic()
        i.lmtp_deliver("bob", MULTI)
        delivered = time.monotonic()
        c.sock.settimeout(60)
        ln = c.line()
        seen = time.monotonic()
        check(ln == b"* %d EXISTS" % (n + 1), "IDLE got %r" % ln)
        # IDLE looks every 250 ms: the news comes within a few looks, and
        # a loaded machine, as slow as the delivery just measured, may
        # stretch that (a session that only told at DONE would not tell)
        bound = 1.0 + 10 * (delivered - t0)
        check(seen - delivered < bound, "EXISTS %.2f s after the delivery "
              "(%.2f s after IDLE; bound %.2f s from a delivery of %.2f s)"
              % (seen - delivered, seen - t0, bound, delivered - t0))
        ln = c.line()
        check(re.match(rb"^\* [1-9]\d* RECENT$", ln), "IDLE got %r" % ln)
        # a flag change by another session shows too
        with Raw(i.addr()) as o:
            raw_login(o, "bob", BOB_PW)
            ok(o.cmd("o1", "SELECT INBOX"), "o1")
            ok(o.cmd("o2", "STORE %d +FLAGS.SILENT (\\Flagged)" % (n + 1)),
               "o2")
        ln = c.line()
        check(ln.startswith(b"* %d FETCH (FLAGS (\\Flagged \\Recent)"
                            % (n + 1)),
              "IDLE flags %r" % ln)
        c.send("DONE\r\n")
        r = c.until_tagged("i2")
        check(r[-1] == b"i2 OK IDLE terminated", "%r" % r)


def idle_slots(i):
    """The live slots of CONFIGDIR/idle.shm: {pid: (hash, seq)}, and the
    pids of all claimed slots (live or not)."""
    import struct
    with open(os.path.join(i.confdir, "idle.shm"), "rb") as f:
        data = f.read()
    magic, version, nslots, hwm = struct.unpack_from("<IIII", data, 0)
    check(magic == 0x49444c45 and version == 1, "idle.shm header %r"
          % data[:16])
    claimed = {}
    for k in range(hwm):
        pid, h, seq, _ = struct.unpack_from("<iIII", data, 32 + 16 * k)
        if pid:
            claimed[pid] = (h, seq)
    return claimed


def proc_switches(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("voluntary_ctxt_switches:"):
                return int(ln.split()[1])
    raise Fail("no voluntary_ctxt_switches for %d" % pid)


def test_idle_push():
    """IDLE is woken by the writer, not by a timer: an idling session's
    process sleeps (no wake-ups in 3 s while nothing changes), a delivery
    reaches it as EXISTS, and a session killed while idling leaves a slot
    that the next writer to its mailbox frees."""
    import time
    i = inst()
    with Raw(i.addr()) as c:
        raw_login(c, "bob", BOB_PW)
        r = ok(c.cmd("p1", "SELECT INBOX"), "p1")
        n = int([ln for ln in r if ln.endswith(b" EXISTS")][0].split()[1])
        before = set(idle_slots(i)) if os.path.exists(
            os.path.join(i.confdir, "idle.shm")) else set()
        c.send("p2 IDLE\r\n")
        check(c.line().startswith(b"+ "), "IDLE continuation")
        new = [p for p in idle_slots(i) if p not in before and alive(p)]
        check(len(new) == 1, "one new notification slot expected: %r"
              % new)
        pid = new[0]
        # asleep: a polling session would wake 12 times in 3 s
        sw0 = proc_switches(pid)
        time.sleep(3)
        sw1 = proc_switches(pid)
        check(sw1 - sw0 <= 2, "the idling imapd woke %d times in 3 s "
              "with nothing to report" % (sw1 - sw0))
        t0 = time.monotonic()
        i.lmtp_deliver("bob", MULTI.replace(b"<m1@", b"<push1@"))
        c.sock.settimeout(60)
        ln = c.line()
        check(ln == b"* %d EXISTS" % (n + 1), "IDLE got %r" % ln)
        print("note: EXISTS %.1f ms after the delivery began"
              % ((time.monotonic() - t0) * 1000))
        c.line()                                # * n RECENT
        c.send("DONE\r\n")
        r = c.until_tagged("p2")
        check(r[-1] == b"p2 OK IDLE terminated", "%r" % r)
        check(pid not in idle_slots(i), "the slot outlived the IDLE")
    # a session killed while idling leaves its slot: made here by hand
    # (killing a worker would count as a crash), with the pid of a process
    # that has ended; the next writer to the mailbox finds no socket there
    # and frees the slot
    import struct
    import subprocess
    dead = subprocess.Popen(["true"])
    dead.wait()
    h = 2166136261
    for b in os.path.join(i.dir, "spool", "user", "bob").encode():
        h = ((h ^ b) * 16777619) & 0xffffffff
    path = os.path.join(i.confdir, "idle.shm")
    with open(path, "r+b") as f:
        hwm = struct.unpack_from("<I", f.read(16), 12)[0]
        f.seek(32 + 16 * hwm)
        f.write(struct.pack("<iIII", dead.pid, h, 7, 0))
        f.seek(12)
        f.write(struct.pack("<I", hwm + 1))
    check(dead.pid in idle_slots(i), "the hand-made slot is not there")
    i.lmtp_deliver("bob", MULTI.replace(b"<m1@", b"<push2@"))
    left = idle_slots(i)
    check(dead.pid not in left, "a dead session's slot was not freed by "
          "the next delivery (%r)" % left)


# ---- client bytes in the log ------------------------------------------------

# What a client tries to get into a log line: a line end and a forged line
# after it, terminal escapes, other controls, 8-bit bytes.
HOSTILE = (b"eve\r\nmaster[1]: info: FAKE-LINE\r\rimapd[1]: error: FAKE-CR"
           b"\x1b[2J\x07\x01\x7f\xc3\xa9\xff")


def _lit(data):
    """An IMAP literal (LITERAL+: no continuation wait)."""
    return b"{%d+}\r\n" % len(data) + data


def _lmtp_hostile(i):
    """Every LMTP command that logs, fed HOSTILE bytes."""
    from lmtphelp import Conn
    h = HOSTILE.replace(b"\r\n", b"").replace(b"\r", b"")   # one line each
    b64 = base64.b64encode
    with Conn(i.unix_socket) as c:
        c.reply()
        c.send(b"XYZZY" + h + b"\r\n")
        c.reply()
        c.send(b"LHLO " + h + b"\r\n")
        c.reply()
        # SASL: the user names (with CR and LF: base64 carries them)
        for mech, ir in ((b"PLAIN", b"\0" + HOSTILE + b"\0pw"),
                         (b"PLAIN", HOSTILE + b"\0" + HOSTILE + b"\0pw"),
                         (b"PL\x01AIN\xff", b"\0eve\0pw"),
                         # SASL echoes an unknown mechanism in its error
                         # text; a bare CR stays inside an LMTP line
                         (b"X\rlmtpd[1]:FAKE-MECH\x1b[2J\x7f\xff",
                          b"\0eve\0pw")):
            c.send(b"AUTH " + mech + b" " + b64(ir) + b"\r\n")
            c.reply()
        c.send(b"AUTH LOGIN\r\n")
        if c.reply().code == 334:
            c.send(b64(HOSTILE) + b"\r\n")
            if c.reply().code == 334:
                c.send(b64(b"pw\r\n\xff") + b"\r\n")
                c.reply()
        c.send(b"AUTH PLAIN\r\n")
        if c.reply().code == 334:
            c.send(b"not base64 " + h + b"\r\n")
            c.reply()
        # addresses, delivered and failed
        for rcpt in (b"<" + h + b">", b"<\"" + h + b"\"@test.example>",
                     b"<nosuch" + h + b"@test.example>"):
            c.send(b"MAIL FROM:<\"" + h + b"\"@example.org>\r\n"
                   b"RCPT TO:" + rcpt + b"\r\nRSET\r\n")
            c.replies(3)
        c.send(b"MAIL FROM:<s@example.org>\r\n"
               b"RCPT TO:<alice>\r\nDATA\r\n")
        c.replies(3)
        c.send(b"Message-ID: <" + h + b"@x>\r\nSubject: " + h +
               b"\r\n\r\nbody\r\n.\r\n")
        c.reply()
    # a message cut inside DATA (the sender is logged)
    with Conn(i.unix_socket) as c:
        c.reply()
        c.send(b"LHLO x\r\nMAIL FROM:<cut@example.org>\r\n"
               b"RCPT TO:<alice>\r\nDATA\r\n")
        c.replies(4)
        c.send(b"Subject: cut\r\n\r\npart")


def _imap_hostile(i):
    """Every IMAP command that logs, fed HOSTILE bytes."""
    b64 = base64.b64encode
    with Raw(i.addr()) as c:
        c.line()
        c.send(b"x1 XYZZY" + HOSTILE.replace(b"\r", b"").replace(b"\n", b"")
               + b"\r\n")
        c.until_tagged("x1")
        c.send(b"x2 LOGIN " + _lit(HOSTILE) + b" " + _lit(b"pw\xff\r\n")
               + b"\r\n")
        c.until_tagged("x2")
        c.send(b"x3 LOGIN alice " + _lit(b"wrong\r\n\xff") + b"\r\n")
        c.until_tagged("x3")
        c.send(b"x4 AUTHENTICATE PLAIN " + b64(b"\0" + HOSTILE + b"\0pw")
               + b"\r\n")
        c.until_tagged("x4")
        c.send(b"x5 AUTHENTICATE PLAIN " + b64(HOSTILE + b"\0alice\0"
                                               + ALICE_PW.encode()) + b"\r\n")
        c.until_tagged("x5")
        c.send(b"x6 AUTHENTICATE LOGIN\r\n")
        if c.line().startswith(b"+"):
            c.send(b64(HOSTILE) + b"\r\n")
            if c.line().startswith(b"+"):
                c.send(b64(b"pw") + b"\r\n")
        c.until_tagged("x6")
        c.send(b"x7 AUTHENTICATE X\xffY\r\n")
        c.until_tagged("x7")
        c.send(b"x8 ID (\"name\" " + _lit(HOSTILE) + b")\r\n")
        c.until_tagged("x8")
        c.send(b"x9 LOGIN alice " + ALICE_PW.encode() + b"\r\n")
        r = c.until_tagged("x9")
        check(r[-1].startswith(b"x9 OK"), "LOGIN alice: %r" % r)
        h = _lit(HOSTILE)
        for n, cmd in enumerate((
                b"SELECT " + h, b"EXAMINE " + h, b"CREATE " + h,
                b"CREATE " + _lit(b"ok" + HOSTILE.replace(b"\r", b"")
                                  .replace(b"\n", b"")),
                b"CREATE " + _lit(b"fine\xc3\xa9"),
                b"DELETE " + h, b"RENAME " + h + b" " + h,
                b"RENAME INBOX " + h, b"SUBSCRIBE " + h,
                b"UNSUBSCRIBE " + h, b"STATUS " + h + b" (MESSAGES)",
                b"APPEND " + h + b" " + _lit(b"Subject: x\r\n\r\nx\r\n"),
                b"LIST " + h + b" " + h, b"SELECT INBOX",
                b"COPY 1:* " + h, b"MOVE 1:* " + h,
                b"STORE 1:* +FLAGS (" + HOSTILE.replace(b"\r", b"")
                .replace(b"\n", b"") + b")",
                b"SEARCH HEADER " + h + b" " + h, b"FROB" + h,
                b"ENABLE " + HOSTILE.replace(b"\r", b"").replace(b"\n", b""),
                )):
            tag = "y%d" % n
            c.send(tag.encode() + b" " + cmd + b"\r\n")
            c.until_tagged(tag)
        c.send(b"z LOGOUT\r\n")
        c.until_tagged("z")


def test_log_lines_printable():
    """Client bytes (CR, LF, a forged line, escapes, 8-bit) sent through
    every LMTP and IMAP command that logs: every line of the master's log
    (stderr of master -D -l and its children) is printable ASCII, and no
    forged line appears."""
    i = ImapInstance("logsafe", conf={"allowplaintext": "yes"},
                     tls=True, sasl=(ALICE, ALICE_PW))
    with i:
        i.create("user.alice")
        i.write_cyrus_conf(imaps=False)
        i.start()
        _lmtp_hostile(i)
        _imap_hostile(i)
        # the cut LMTP session and the last IMAP one have logged
        wait_until(lambda: b"message not received" in _log_bytes(i), 10)
        data = _log_bytes(i)
        check(b"authentication failed" in data and b"login failed" in data,
              "the hostile sessions logged nothing: %r" % data[-500:])
        bad = [ln for ln in data.split(b"\n")
               if any(b < 0x20 or b > 0x7e for b in ln)]
        check(not bad, "%d log lines with bytes outside printable ASCII, "
              "first: %r" % (len(bad), bad[:3]))
        # a CR ends a line for a terminal or a syslog reader as LF does
        forged = [ln for ln in re.split(rb"[\r\n]", data) if b"FAKE-" in ln
                  and not re.match(rb"^(lmtpd|imapd)\[\d+\]: "
                                   rb"(info|warning|error): (lmtp|imap|sasl)"
                                   rb": ", ln)]
        check(not forged, "forged log lines: %r" % forged[:3])
        check(b"FAKE-MECH" in data, "the unknown mechanism was not logged")


def _uidvalidity_round(c, tag, name):
    """CREATE name, its UIDVALIDITY from STATUS, DELETE name."""
    ok(c.cmd(tag + "c", "CREATE " + name), tag + "c")
    r = ok(c.cmd(tag + "s", "STATUS %s (UIDVALIDITY UIDNEXT)" % name),
           tag + "s")
    m = re.match(rb'^\* STATUS "?%s"? \(UIDVALIDITY (\d+) UIDNEXT 1\)$'
                 % re.escape(name.encode()), r[0])
    check(m is not None, "STATUS %r" % r)
    ok(c.cmd(tag + "d", "DELETE " + name), tag + "d")
    return int(m.group(1))


def test_uidvalidity_never_repeats():
    """A name deleted and created again, many times within a second and
    across a restart of the server, gets a new, larger UIDVALIDITY each
    time (RFC 3501 2.3.1.1): otherwise UID 1 of the new mailbox would name
    a different message under the same UIDVALIDITY."""
    i = ImapInstance("uidval", conf={"allowplaintext": "yes"},
                     tls=True, sasl=(ALICE, ALICE_PW))
    with i:
        i.create("user.alice")
        i.write_cyrus_conf(imaps=False)
        i.start()
        seen = []
        with Raw(i.addr()) as c:
            c.line()
            ok(c.cmd("L0", "LOGIN alice " + ALICE_PW), "L0")
            for n in range(20):
                seen.append(_uidvalidity_round(c, "u%d" % n, "INBOX.uv"))
            # another name draws from the same sequence
            seen.append(_uidvalidity_round(c, "w0", "INBOX.other"))
        check(all(a < b for a, b in zip(seen, seen[1:])),
              "UIDVALIDITY not strictly increasing: %r" % seen)
        check(not i.stop(), "master stop")
        if os.path.exists(i.statusfile):
            os.unlink(i.statusfile)
        i.start()
        with Raw(i.addr()) as c:
            c.line()
            ok(c.cmd("L0", "LOGIN alice " + ALICE_PW), "L0")
            after = _uidvalidity_round(c, "r0", "INBOX.uv")
        check(after > seen[-1], "UIDVALIDITY after a restart %d, before "
              "%d" % (after, seen[-1]))


def _log_bytes(i):
    with open(i.logfile, "rb") as f:
        return f.read()


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_greeting_capability,
        test_login_refused_without_tls,
        test_login_after_starttls,
        test_wrong_password,
        test_authenticate_plain_imaps,
        test_authenticate_login_scram,
        test_list_and_acl,
        test_create_delete_rename,
        test_subscribe_lsub,
        test_lsub_percent_parents,
        test_status,
        test_misc_authenticated,
        test_select_examine_close,
        test_fetch,
        test_search,
        test_search_addresses,
        test_store_expunge_two_sessions,
        test_keyword_announced_before_use,
        test_append_keywords_one_commit,
        test_append_keyword_limit,
        test_seen_per_user,
        test_recent,
        test_seen_concurrent_sessions,
        test_autologout,
        test_session_end_line,
        test_append,
        test_copy_move,
        test_idle_sees_lmtp_delivery,
        test_idle_push,
        test_bad_input,
        test_sigterm_idle_client,
        test_log_lines_printable,
        test_uidvalidity_never_repeats,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
