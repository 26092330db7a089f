#!/usr/bin/env python3
"""test_xfer.py - placement and moves of users in the frontend tier
(tools/cyr_user.c, mbtool user-dump/user-load/user-mark/user-purge,
store/userstate.c), on the fixture of test_lmtp_proxy.py: a private
3-member etcd cluster holding the directory, two backends (a master
each with imapd and lmtpd -a on 127.0.0.1) and a frontend (a master with
imapd in imap_proxy mode and lmtpd in lmtp_proxy mode), everything on
loopback and stopped by PID.  cyr_user runs with the frontend's
imapd.conf; its xfer_command runs mbtool with each backend's
imapd.conf (the ssh-less form of "ssh %b mbtool").  The fixture is
tests/tierhelp.py's.

  create    cyr_user load counts mailboxes; create places a user on the
            backend with fewer mailboxes, with the INBOX, the autocreate
            folders (special use) and their subscriptions, and writes the
            record; a second create of the user is refused and changes
            nothing; a bad user id, an unknown backend, an unknown
            command are refused; a backend holding the INBOX already
            (no record) refuses and its mailbox is left alone; an
            explicit backend is honoured
  marks     a user marked "moving" on its backend: deliveries through the
            frontend and straight to the backend get 451 4.2.1, a DATA
            whose RCPT came before the mark 451 with nothing stored and
            the user's stamp unchanged (the purge of a move not refused
            by a delivery it turned away), a login at the backend NO [UNAVAILABLE], a session open
            (through the frontend) before the mark BYE at its next
            command; marked "moved": 451 4.2.1; unmarked, 250 again
  move      a user with messages in two folders, flags, keywords, \\Seen,
            an expunged message (a UID gap), internal dates, a folder of
            its own, subscriptions, a quota root and an active Sieve
            script is moved to the other backend: through the frontend
            every mailbox has the same UIDVALIDITY, UIDNEXT, UIDs,
            flags, internal dates and bytes, HIGHESTMODSEQ not lower, the
            same subscriptions and quota; the Sieve script is there and
            active; the old backend answers 451 4.2.1 for the user, NO
            [UNAVAILABLE] to a login, and holds none of its mailboxes;
            through the frontend (after directory_cache_ttl) 250 lands
            on the new backend; a move to where the user is already, and
            a move of a user without a record, fail
  move_undo a load that fails (the user has a mailbox on the target
            already): the record and the old backend are as before
            (mark lifted, 250), nothing was removed
  dups      a message stored on the old backend and delivered again
            after the move (an MTA retrying a lost 250) is a duplicate
            on the new backend, not a second copy; a message refused
            (451) after its duplicate record was written, retried after
            the move, is stored there, not taken for a duplicate
  move_lost_reply  the directory switch applied by etcd but answered
            with an error (a proxy in front of etcd answers 503 "request
            timed out" after passing the txn on): cyr_user reads the
            record back and finishes the move; nothing is undone
  big       a user with 10,000 messages moved while deliveries for it
            arrive through the frontend: each is 250 or 451, some are 451,
            every 250 is on the new backend at the end; UIDVALIDITY kept;
            the time is printed as a "# " line
  delete    cyr_user delete removes the mailboxes on the backend and the
            record

Skipped (exit 77) without /usr/bin/etcd.  XFER_TESTS picks tests by name
(later tests use the users of earlier ones).
"""
import imaplib
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, HERE, os.path.join(TESTS, "lmtpd"),
                os.path.join(TESTS, "conformance")]
from testlib import TOP_BUILDDIR, check, run_tests  # noqa: E402
from lmtphelp import (MBTOOL, Conn, dot_stuff, make_message,  # noqa: E402
                      transaction)
from imaphelp import IMAPD, ImapInstance, make_sasldb_extra  # noqa: E402
from test_cyrusdb_etcd import DBTOOL  # noqa: E402
from tierhelp import Backend, Tier, pw, usable  # noqa: E402

CYR_USER = os.path.join(TOP_BUILDDIR, "tools", "cyr_user")
PROXY_USER, PROXY_PW = "proxy", "pr0xy-pw"
USERS = ["erin", "frank", "gina", "big"]
TIER = None
WORK = None
B = {}
FRONT = None


def cyr_user(*args, rc=0):
    p = subprocess.run([CYR_USER, "-C", FRONT.imapd_conf] + list(args),
                       capture_output=True, timeout=600)
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    if rc is not None:
        check(p.returncode == rc, "cyr_user %s: exit %d (want %d): %s%s"
              % (" ".join(args), p.returncode, rc, out, err))
    return p.returncode, out, err


def where(user):
    return cyr_user("where", user)[1].strip()


def lmtp(addr, user, msg):
    """One LMTP transaction for user at addr: the RCPT reply, and the
    final reply when RCPT was accepted."""
    with Conn(addr) as c:
        c.reply()
        mr, rr, dr, per = transaction(c, "sender@example.org", [user], msg,
                                      lhlo="client.test")
        check(mr.code == 250, "MAIL: %r" % mr)
        c.cmd("QUIT")
    return rr[0], (per[0] if per else None)


def front_deliver(user, msg):
    return lmtp(FRONT.unix_socket, user, msg)


def backend_deliver(name, user, msg):
    return lmtp(("127.0.0.1", B[name].lmtp_port), user, msg)


def login(user, inst=None):
    inst = inst or FRONT
    m = imaplib.IMAP4("127.0.0.1", inst.tcp_port, timeout=60)
    typ, data = m.login(user, pw(user))
    check(typ == "OK", "LOGIN %s: %r" % (user, data))
    return m


def close(m):
    try:
        m.logout()
    except Exception:  # noqa: BLE001
        pass


def login_refused(user, inst):
    m = imaplib.IMAP4("127.0.0.1", inst.tcp_port, timeout=60)
    try:
        m.login(user, pw(user))
    except imaplib.IMAP4.error as e:
        return str(e)
    finally:
        close(m)
    raise AssertionError("LOGIN %s at %s succeeded" % (user, inst.name))


def mailboxes(name, user):
    """user's mailboxes on backend name (mbtool list: name -> fields)."""
    _, out, _ = B[name].mbtool("list", "user.%s*" % user)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def state(user):
    """Everything IMAP shows of user through the frontend."""
    m = login(user)
    try:
        st = {}
        typ, data = m.list('""', "*")
        check(typ == "OK", "LIST: %r" % data)
        names = sorted(re.search(rb'"([^"]*)"$', d).group(1).decode()
                       if d.endswith(b'"') else d.split()[-1].decode()
                       for d in data if d)
        typ, data = m.lsub('""', "*")
        st["lsub"] = sorted(d.split()[-1].decode().strip('"')
                            for d in data if d)
        typ, data = m.getquotaroot("INBOX")
        st["quota"] = [d for d in data[1:] if d] if typ == "OK" else typ
        for n in names:
            typ, data = m.status('"%s"' % n,
                                 "(UIDVALIDITY UIDNEXT MESSAGES "
                                 "HIGHESTMODSEQ)")
            check(typ == "OK", "STATUS %s: %r" % (n, data))
            s = data[0].decode()
            vals = dict(re.findall(r"([A-Z]+) (\d+)", s))
            typ, data = m.select('"%s"' % n, readonly=True)
            check(typ == "OK", "SELECT %s: %r" % (n, data))
            msgs = []
            if int(data[0]) > 0:
                typ, data = m.uid("FETCH", "1:*",
                                  "(UID FLAGS INTERNALDATE BODY.PEEK[])")
                check(typ == "OK", "FETCH: %r" % data)
                for d in data:
                    if isinstance(d, tuple):
                        meta = d[0].decode()
                        uid = int(re.search(r"UID (\d+)", meta).group(1))
                        flags = sorted(re.search(r"FLAGS \(([^)]*)\)",
                                                 meta).group(1).split())
                        date = re.search(r'INTERNALDATE "([^"]+)"',
                                         meta).group(1)
                        msgs.append((uid, flags, date, d[1]))
            st[n] = {"uidvalidity": vals["UIDVALIDITY"],
                     "uidnext": vals["UIDNEXT"],
                     "modseq": int(vals["HIGHESTMODSEQ"]),
                     "messages": sorted(msgs)}
        return st
    finally:
        close(m)


# ---- tests -----------------------------------------------------------------

def test_create():
    _, out, _ = cyr_user("load")
    counts = dict((l.split()[0], int(l.split()[1]))
                  for l in out.splitlines())
    check(set(counts) == {"alpha", "beta"} and
          counts["alpha"] > counts["beta"], "load: %r" % counts)
    _, out, _ = cyr_user("create", "erin")
    check(out.strip() == "erin beta", "create erin: %r" % out)
    check(where("erin") == "beta", "erin's record: %r" % where("erin"))
    check(mailboxes("beta", "erin") ==
          ["user.erin", "user.erin.Sent", "user.erin.Trash"],
          "erin on beta: %r" % mailboxes("beta", "erin"))
    check(mailboxes("alpha", "erin") == [], "erin on alpha too")
    # never twice
    _, _, err = cyr_user("create", "erin", "alpha", rc=1)
    check("placed already" in err, "second create: %r" % err)
    check(where("erin") == "beta" and mailboxes("alpha", "erin") == [],
          "the second create changed something")
    # bad input: a clear error, nothing placed
    _, _, err = cyr_user("create", "bad user", rc=1)
    check("not a user id" in err, "bad user id: %r" % err)
    _, _, err = cyr_user("create", "frank", "gamma", rc=1)
    check("no backend gamma" in err, "unknown backend: %r" % err)
    cyr_user("where", "frank", rc=1)
    cyr_user("frobnicate", rc=2)
    # a backend that has the INBOX already (no record): refused, and the
    # mailbox there is left alone
    B["alpha"].mbtool("create", "user.gina")
    _, _, err = cyr_user("create", "gina", "alpha", rc=1)
    check("CREATE" in err, "create over an existing INBOX: %r" % err)
    check(mailboxes("alpha", "gina") == ["user.gina"], "alpha's user.gina "
          "touched: %r" % mailboxes("alpha", "gina"))
    cyr_user("where", "gina", rc=1)
    B["alpha"].mbtool("delete", "user.gina")
    # explicit backend
    cyr_user("create", "frank", "alpha")
    check(where("frank") == "alpha", "frank: %r" % where("frank"))
    cyr_user("create", "gina", "beta")
    # the special uses and subscriptions, seen through the frontend
    m = login("erin")
    try:
        typ, data = m.list('""', "*")
        text = b" ".join(data).decode()
        check("\\Sent" in text and "\\Trash" in text, "LIST: %r" % data)
        typ, data = m.lsub('""', "*")
        subs = sorted(d.split()[-1].decode().strip('"') for d in data)
        check(subs == ["INBOX", "INBOX.Sent", "INBOX.Trash"],
              "subscriptions: %r" % subs)
    finally:
        close(m)
    r, final = front_deliver("erin", make_message(msgid="c1@test"))
    check(r.code == 250 and final.code == 250, "delivery: %r %r" % (r, final))


def test_marks():
    m = login("gina")          # a session on beta through the frontend
    try:
        B["beta"].mbtool("user-mark", "gina", "moving")
        r, final = front_deliver("gina", make_message(msgid="m1@test"))
        check(final and final.code == 451 and "4.2.1" in str(final),
              "frontend, moving: %r %r" % (r, final))
        r, _ = backend_deliver("beta", "gina", make_message(msgid="m2@test"))
        check(r.code == 451 and "4.2.1" in str(r),
              "backend, moving: %r" % r)
        text = login_refused("gina", B["beta"])
        check("UNAVAILABLE" in text, "login at the backend: %r" % text)
        try:
            typ, data = m.select("INBOX")
            raise AssertionError("command after the mark: %r %r"
                                 % (typ, data))
        except imaplib.IMAP4.abort as e:
            check("UNAVAILABLE" in str(e) or "moved" in str(e).lower(),
                  "BYE: %r" % e)
        # a delivery whose RCPT was accepted before the mark: its DATA
        # gets 451, nothing is stored (the dump could have missed it)
        n0 = B["beta"].count("user.gina")
        with Conn(("127.0.0.1", B["beta"].lmtp_port)) as c:
            c.reply()
            B["beta"].mbtool("user-mark", "gina", "here")
            check(c.cmd("LHLO client.test").code == 250, "LHLO")
            check(c.cmd("MAIL FROM:<s@example.org>").code == 250, "MAIL")
            r = c.cmd("RCPT TO:<gina>")
            check(r.code == 250, "RCPT before the mark: %r" % r)
            B["beta"].mbtool("user-mark", "gina", "moving")
            stamp = B["beta"].mbtool("user-stamp", "gina")[1].strip()
            check(c.cmd("DATA").code == 354, "DATA")
            c.send(dot_stuff(make_message(msgid="race@test")))
            r = c.replies(1)[0]
            check(r.code == 451, "DATA after the mark: %r" % r)
        check(B["beta"].count("user.gina") == n0, "stored after the mark")
        # the reservation it aborted consumed a UID but stored nothing: a
        # dump's stamp taken before still holds (the move's purge of the
        # old copy is not refused by a delivery it turned away)
        after = B["beta"].mbtool("user-stamp", "gina")[1].strip()
        check(re.fullmatch(r"[0-9a-f]{8}", stamp) and after == stamp,
              "stamp changed by an aborted delivery: %r -> %r"
              % (stamp, after))
        B["beta"].mbtool("user-mark", "gina", "moved", "alpha")
        r, _ = backend_deliver("beta", "gina", make_message(msgid="m3@test"))
        check(r.code == 451 and "4.2.1" in str(r), "moved: %r" % r)
    finally:
        close(m)
        B["beta"].mbtool("user-mark", "gina", "here")
    r, final = front_deliver("gina", make_message(msgid="m4@test"))
    check(r.code == 250 and final.code == 250, "unmarked: %r %r"
          % (r, final))


SIEVE = b'require ["fileinto"];\r\nif header :contains "subject" "x" ' \
        b'{ fileinto "INBOX.Trash"; }\r\n'


def test_move():
    for i in range(5):
        r, final = front_deliver("erin", make_message(
            msgid="mv%d@test" % i, subject="move %d" % i,
            body="body %d\r\n" % i))
        check(final and final.code == 250, "delivery %d: %r" % (i, final))
    m = login("erin")
    try:
        typ, _ = m.append("INBOX.Sent", "(\\Seen $Sent)",
                          imaplib.Time2Internaldate(1_600_000_000),
                          make_message(msgid="sent@test", subject="sent"))
        check(typ == "OK", "APPEND")
        m.create("INBOX.Projects")
        m.subscribe("INBOX.Projects")
        m.unsubscribe("INBOX.Trash")
        m.select("INBOX")
        m.store("2", "+FLAGS", "(\\Flagged \\Seen)")
        m.store("3", "+FLAGS", "($Label1 \\Answered)")
        m.store("4", "+FLAGS", "(\\Seen)")
        m.store("1,6", "+FLAGS", "(\\Deleted)")
        m.expunge()
    finally:
        close(m)
    B["beta"].mbtool("quota", "set", "user.erin", "50000", "none")
    sieve = os.path.join(WORK, "erin.sieve")
    with open(sieve, "wb") as f:
        f.write(SIEVE)
    os.chmod(sieve, 0o644)
    B["beta"].mbtool("sieve", "put", "erin", "main", sieve)
    B["beta"].mbtool("sieve", "activate", "erin", "main")
    before = state("erin")
    uids = [x[0] for x in before["INBOX"]["messages"]]
    check(uids == [2, 3, 4, 5] and before["INBOX"]["uidnext"] == "7",
          "UIDs before the move: %r" % before["INBOX"])

    _, out, _ = cyr_user("move", "erin", "alpha")
    check(out.startswith("moved erin from beta to alpha"), "move: %r" % out)
    check(where("erin") == "alpha", "record: %r" % where("erin"))
    # the old backend knows the user left
    check(mailboxes("beta", "erin") == [], "beta still has %r"
          % mailboxes("beta", "erin"))
    r, _ = backend_deliver("beta", "erin", make_message(msgid="old@test"))
    check(r.code == 451 and "4.2.1" in str(r), "old backend: %r" % r)
    text = login_refused("erin", B["beta"])
    check("UNAVAILABLE" in text, "login at the old backend: %r" % text)

    time.sleep(1.2)            # past the frontend's directory_cache_ttl
    after = state("erin")
    check(set(after) == set(before), "mailboxes: %r vs %r"
          % (sorted(after), sorted(before)))
    for k in before:
        if k in ("lsub", "quota"):
            check(after[k] == before[k], "%s: %r, before %r"
                  % (k, after[k], before[k]))
            continue
        a, b = after[k], before[k]
        for f in ("uidvalidity", "uidnext"):
            check(a[f] == b[f], "%s %s: %s, before %s" % (k, f, a[f], b[f]))
        check(a["modseq"] >= b["modseq"], "%s modseq went back" % k)
        check(a["messages"] == b["messages"], "%s messages: %r, before %r"
              % (k, [x[:3] for x in a["messages"]],
                 [x[:3] for x in b["messages"]]))
    _, out, _ = B["alpha"].mbtool("sieve", "list", "erin")
    check(re.search(r"^main.*active", out, re.M), "sieve list: %r" % out)
    _, out, _ = B["alpha"].mbtool("sieve", "get", "erin", "main")
    check(out.encode() == SIEVE, "sieve text: %r" % out)
    # through the frontend now: 250, on alpha
    n0 = len(after["INBOX"]["messages"])
    r, final = front_deliver("erin", make_message(msgid="new@test",
                                                  subject="after"))
    check(r.code == 250 and final.code == 250, "after the move: %r %r"
          % (r, final))
    _, out, _ = B["alpha"].mbtool("info", "user.erin")
    check(("exists=%d" % (n0 + 1)) in out.replace(" ", "") or
          str(n0 + 1) in out, "alpha's INBOX: %r" % out)
    # refusals
    _, _, err = cyr_user("move", "erin", "alpha", rc=1)
    check("already" in err, "move to the same backend: %r" % err)
    cyr_user("move", "nobody", "alpha", rc=1)


def test_move_undo():
    # frank is on alpha; beta has a stray mailbox of frank's
    B["beta"].mbtool("create", "user.frank")
    before = B["alpha"].mbtool("list", "user.frank*")[1]
    _, _, err = cyr_user("move", "frank", "beta", rc=1)
    check("undone" in err, "failed move: %r" % err)
    check(where("frank") == "alpha", "record changed")
    check(B["alpha"].mbtool("list", "user.frank*")[1] == before,
          "alpha's mailboxes of frank changed")
    r, final = front_deliver("frank", make_message(msgid="u@test"))
    check(r.code == 250 and final.code == 250, "mark not lifted: %r" % r)
    B["beta"].mbtool("delete", "user.frank")


def test_dups():
    # a message stored on the old backend whose 250 was lost (the MTA
    # retries it) must not be stored again on the new one: the move
    # carries the duplicate-delivery records of the user's mailboxes
    msg = make_message(msgid="dup-across-move@test", subject="dup")
    r, final = backend_deliver("alpha", "frank", msg)
    check(final and final.code == 250, "first delivery: %r %r" % (r, final))
    # a delivery refused after its duplicate record was written (the
    # user marked moving between RCPT and DATA): the record names a copy
    # that was never stored, and the move must not make it read as
    # delivered on the new backend
    refused = make_message(msgid="refused-before-move@test")
    n0 = B["alpha"].count("user.frank")
    with Conn(("127.0.0.1", B["alpha"].lmtp_port)) as c:
        c.reply()
        check(c.cmd("LHLO client.test").code == 250, "LHLO")
        check(c.cmd("MAIL FROM:<s@example.org>").code == 250, "MAIL")
        r = c.cmd("RCPT TO:<frank>")
        check(r.code == 250, "RCPT before the mark: %r" % r)
        B["alpha"].mbtool("user-mark", "frank", "moving")
        check(c.cmd("DATA").code == 354, "DATA")
        c.send(dot_stuff(refused))
        r = c.replies(1)[0]
        check(r.code == 451, "DATA after the mark: %r" % r)
    B["alpha"].mbtool("user-mark", "frank", "here")
    check(B["alpha"].count("user.frank") == n0, "stored after the mark")
    cyr_user("move", "frank", "beta")
    n = B["beta"].count("user.frank")
    r, final = backend_deliver("beta", "frank", msg)
    check(final and final.code == 250, "the retry: %r %r" % (r, final))
    check(B["beta"].count("user.frank") == n, "the retried message was "
          "stored a second time after the move (%d messages, were %d)"
          % (B["beta"].count("user.frank"), n))
    # and a new message is stored as ever
    r, final = backend_deliver("beta", "frank",
                               make_message(msgid="after-dup@test"))
    check(final and final.code == 250 and
          B["beta"].count("user.frank") == n + 1, "a new message: %r" % final)
    # the refused one's retry is stored, not taken for a duplicate
    r, final = backend_deliver("beta", "frank", refused)
    check(final and final.code == 250 and
          B["beta"].count("user.frank") == n + 2,
          "the retry of a message refused before the move: %r, %d "
          "messages (want %d)" % (final, B["beta"].count("user.frank"),
                                  n + 2))


class LostReplyProxy:
    """An HTTP proxy in front of one etcd member: everything is passed
    on, but the first /v3/kv/txn, once etcd applied it, is answered with
    the error etcd gives for a proposal whose outcome it does not know
    (503, "request timed out"): a commit with an unknown outcome."""

    def __init__(self, target):
        import http.client
        import http.server
        import threading
        proxy = self
        self.dropped = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get(
                    "Content-Length") or 0))
                c = http.client.HTTPConnection(target[0], target[1],
                                               timeout=30)
                c.request("POST", self.path, body,
                          {"Content-Type": "application/json"})
                resp = c.getresponse()
                data = resp.read()
                status = resp.status
                c.close()
                if self.path.endswith("/kv/txn") and not proxy.dropped:
                    proxy.dropped += 1
                    status = 503
                    data = b'{"error":"etcdserver: request timed out",' \
                           b'"code":14,"message":"etcdserver: request ' \
                           b'timed out"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def test_move_lost_reply():
    # the directory switch is applied by etcd but its answer is an error
    # (the leader lost, a timeout): cyr_user must read the record back
    # and finish the move, never undo it (that would leave the record
    # naming a backend whose copy it removed)
    m = TIER.cluster.members[0]
    proxy = LostReplyProxy(("127.0.0.1", m["client"]))
    conf = os.path.join(WORK, "lostreply.conf")
    with open(FRONT.imapd_conf) as f:
        text = f.read()
    with open(conf, "w") as f:
        f.write(re.sub(r"(?m)^etcd_endpoints: .*$",
                       "etcd_endpoints: http://127.0.0.1:%d" % proxy.port,
                       text))
    try:
        check(where("gina") == "beta", "gina: %r" % where("gina"))
        p = subprocess.run([CYR_USER, "-C", conf, "move", "gina", "alpha"],
                           capture_output=True, timeout=600)
        err = p.stderr.decode(errors="replace")
        check(proxy.dropped == 1, "the proxy saw no directory write")
        check(where("gina") == "alpha", "record: %r" % where("gina"))
        check(mailboxes("alpha", "gina") and
              mailboxes("beta", "gina") == [],
              "after a switch with a lost answer: alpha %r, beta %r (%s)"
              % (mailboxes("alpha", "gina"), mailboxes("beta", "gina"),
                 err))
        check(p.returncode == 0 and "went through" in err,
              "cyr_user: exit %d: %s" % (p.returncode, err))
    finally:
        proxy.close()
    r, final = front_deliver("gina", make_message(msgid="lost@test"))
    check(final and final.code == 250, "gina after the move: %r %r"
          % (r, final))


def test_big():
    n = 10000
    cyr_user("create", "big", "beta")
    msg = make_message(msgid=None, subject="big",
                       body=("line of text %d\r\n" * 20) % tuple(range(20)))
    with Conn(("127.0.0.1", B["beta"].lmtp_port), timeout=120) as c:
        c.reply()
        r = c.cmd("LHLO client.test")
        for i in range(n):
            mr, rr, dr, per = transaction(c, "s@example.org", ["big"], msg)
            check(per and per[0].code == 250, "delivery %d: %r" % (i, per))
        c.cmd("QUIT")
    info_before = B["beta"].mbtool("info", "user.big")[1]
    t0 = time.monotonic()
    move = subprocess.Popen([CYR_USER, "-C", FRONT.imapd_conf, "move", "big",
                             "alpha"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    # deliveries through the frontend while it runs, and until one lands
    # on alpha: each is 250 (stored, on beta before the mark or on alpha
    # after the switch) or 451, and every 250 is on alpha at the end
    acked = refused = 0
    t = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if t is None and move.poll() is not None:
            t = time.monotonic() - t0
        r, final = front_deliver("big", make_message(
            msgid="during-%d@test" % (acked + refused)))
        code = final.code if r.code == 250 and final else r.code
        check(code in (250, 451), "delivery during the move: %r %r"
              % (r, final))
        if code == 250:
            acked += 1
        else:
            refused += 1
        if code == 250 and t is not None:
            break
        if code == 451:
            time.sleep(0.05)
    out, err = move.communicate(timeout=600)
    out = out.decode(errors="replace")
    check(move.returncode == 0, "move: %s%s" % (out, err.decode()))
    check(refused > 0, "no delivery was refused during the move")
    print("# move of a user with %d messages (%d bytes each) from beta to "
          "alpha: %.2f s (%.0f messages/s), deliveries through the frontend "
          "meanwhile: %d refused (451), %d stored; cyr_user: %s"
          % (n, len(msg), t, n / t, refused, acked, out.strip()))
    _, out, _ = B["alpha"].mbtool("list", "user.big")
    info_after = B["alpha"].mbtool("info", "user.big")[1]

    def field(text, name):
        return re.search(r"^%s: (\d+)$" % name, text, re.M).group(1)
    # the UIDs of the dump, then the deliveries after the switch
    for f, want in (("uidvalidity", field(info_before, "uidvalidity")),
                    ("messages", str(n + acked))):
        check(field(info_after, f) == want, "alpha's user.big %s: %s, want "
              "%s" % (f, field(info_after, f), want))
    check(mailboxes("beta", "big") == [], "beta kept big; cyr_user said: "
          "%s %s" % (out, err.decode(errors="replace")))


def test_delete():
    cyr_user("delete", "erin")
    rc, _, _ = cyr_user("where", "erin", rc=1)
    check(mailboxes("alpha", "erin") == [], "alpha kept erin: %r"
          % mailboxes("alpha", "erin"))
    time.sleep(1.2)            # past the frontend's directory_cache_ttl
    r, final = front_deliver("erin", make_message(msgid="gone@test"))
    check(r.code == 550, "deleted user: %r %r" % (r, final))
    cyr_user("delete", "erin", rc=1)


# ---- setup -----------------------------------------------------------------

def new_backend(name):
    conf = {"allowplaintext": "yes", "sasl_mech_list": "PLAIN LOGIN",
            "admins": PROXY_USER, "proxyservers": PROXY_USER}
    b = Backend(name, conf=conf, sasl=(PROXY_USER, PROXY_PW))
    for u in USERS:
        make_sasldb_extra(b, u, pw(u))
    b.write_cyrus_conf()
    TIER.start(b)
    os.symlink(b.imapd_conf, os.path.join(WORK, name + ".conf"))
    return b


def main():
    global TIER, WORK, FRONT
    rc = usable([IMAPD, DBTOOL, CYR_USER, MBTOOL])
    if rc is not None:
        return rc
    TIER = Tier("xfertest", "xfer.", mode=0o755)
    WORK = TIER.work
    rc = 1
    try:
        if not TIER.start_cluster():
            return 1
        B["alpha"] = new_backend("alpha")
        B["beta"] = new_backend("beta")
        for i in range(3):            # alpha is the busier backend
            B["alpha"].mbtool("create", "user.filler%d" % i)
        conf = TIER.directory_conf(ttl="1", timeout="3000")
        conf.update({
            "imap_proxy": "yes",
            "lmtp_proxy": "yes",
            "allowplaintext": "yes",
            "proxy_imap_backends": " ".join(
                "%s=127.0.0.1:%d" % (n, b.tcp_port) for n, b in B.items()),
            "proxy_backends": " ".join(
                "%s=127.0.0.1:%d" % (n, b.lmtp_port) for n, b in B.items()),
            "proxy_authname": PROXY_USER,
            "proxy_password": PROXY_PW,
            "proxy_starttls": "no",
            "proxy_timeout": "10",
            "autocreate_inbox_folders": "Sent|Trash",
            "xlist-sent": "Sent",
            "xlist-trash": "Trash",
            "xfer_command": "%s -C %s/%%b.conf" % (MBTOOL, WORK),
        })
        FRONT = ImapInstance("front", conf=conf, sasl=(USERS[0], pw(USERS[0])))
        for u in USERS[1:]:
            make_sasldb_extra(FRONT, u, pw(u))
        FRONT.write_cyrus_conf(imaps=False, lmtp=True)
        FRONT.start()
        tests = [test_create, test_marks, test_move, test_move_undo,
                 test_dups, test_move_lost_reply, test_big, test_delete]
        rc = run_tests(tests, "XFER_TESTS", [IMAPD, DBTOOL, CYR_USER])
    finally:
        rc = TIER.finish(rc, [FRONT] + list(B.values()), loglines=15)
    return rc


if __name__ == "__main__":
    sys.exit(main())
