#!/usr/bin/env python3
"""test_imapload.py - many IMAP sessions on a few shared mailboxes while
lmtpd delivers into them; every untagged response is checked against a
client-side model of the selected mailbox.

A private master runs imapd and lmtpd.  Three folders of alice (L0, L1,
L2) are shared with bob and carol (ACL lrswite).  IMAPLOAD_SESSIONS
sessions (default 50; alice, bob and carol in turn) run for
IMAPLOAD_SECONDS (default 60): each selects one of the folders and draws
operations: FETCH (UID FLAGS of all, or a header of one message), STORE
of a keyword it invents (+FLAGS), APPEND with keywords it invents, STORE
\\Deleted + UID EXPUNGE of one message, SEARCH, NOOP, IDLE, and now and
then SELECT of another folder.  Beside them one LMTP client delivers to
the same folders without pause.  The keywords are mostly two per
session, now and then a new one: the folders' 128 keywords fill up, and
a STORE or APPEND of a new keyword is then refused with NO [LIMIT]
(counted as "limit"; anything else but OK is an error).

Every response is checked against the RFC 3501 grammar
(imapgrammar.validate) and against the session's model (the UID of each
message sequence number, as far as known):
  - * N EXISTS: N never below the model's count (it only shrinks by
    EXPUNGE); new messages are appended to the model;
  - * N EXPUNGE: 1 <= N <= count, the model loses message N;
  - * N FETCH: 1 <= N <= count; its UID equals the model's UID for N
    when known; UIDs strictly increase with the sequence number, and a
    message new to the session has a UID above every UID it saw before;
  - FETCH FLAGS: every keyword was announced before by a FLAGS or
    PERMANENTFLAGS response of this session's selected mailbox;
  - no keyword lost: a keyword whose STORE or APPEND (APPENDUID)
    completed before a FETCH command was sent is in that FETCH's FLAGS
    of the message (whichever session stored it);
  - UID SEARCH returns only UIDs of messages announced to the session.
The test fails on any error, printing the exchange that shows it, and
prints the number of operations of each kind.  It measures nothing: the
sessions run for a duration, the deadlines are generous.
"""
import os
import random
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imaphelp import (ConnectionClosed, ImapInstance, Raw,  # noqa: E402
                      make_sasldb_extra, run_imap_tests)
from testlib import check  # noqa: E402

USERS = [("alice", "al1ce-pw"), ("bob", "b0b-pw"), ("carol", "car0l-pw")]
FOLDERS = ["L0", "L1", "L2"]
SESSIONS = int(os.environ.get("IMAPLOAD_SESSIONS", "50"))
SECONDS = float(os.environ.get("IMAPLOAD_SECONDS", "60"))

RE_NUM = re.compile(rb"^\* (\d+) (EXISTS|EXPUNGE|RECENT|FETCH)\b")
RE_UID = re.compile(rb"\bUID (\d+)")
RE_FLAGS = re.compile(rb"\bFLAGS \(([^)]*)\)")


class Shared:
    """What all sessions share: the keywords stored with the time their
    command completed, the operation counts, the errors."""

    def __init__(self):
        self.lock = threading.Lock()
        self.stored = {}        # (folder, uid) -> {keyword: t_done}
        self.counts = {}
        self.errors = []

    def count(self, op):
        with self.lock:
            self.counts[op] = self.counts.get(op, 0) + 1

    def store(self, folder, uid, kws, how):
        """kws were stored on (folder, uid); how: the exchange."""
        t = time.monotonic()
        with self.lock:
            d = self.stored.setdefault((folder, uid), {})
            for k in kws:
                d.setdefault(k, (t, how))

    def required(self, folder, uid, t_sent):
        with self.lock:
            d = self.stored.get((folder, uid), {})
            return {k: h for k, (t, h) in d.items() if t < t_sent}


class ModelError(Exception):
    pass


class Session:
    def __init__(self, sh, addr, n, deadline):
        self.sh = sh
        self.addr = addr
        self.n = n
        self.user, self.pw = USERS[n % len(USERS)]
        self.deadline = deadline
        self.rng = random.Random(n * 7919 + 1)
        self.kwno = 0
        self.tagno = 0
        self.log = []           # the last lines sent and received
        self.folder = None
        self.uids = []          # model: UID of message n at [n-1], or None
        self.floor = []         # a UID of message n must be above [n-1]
        self.maxuid = 0
        self.announced = set()

    def mbox(self, folder):
        return ("INBOX." if self.user == "alice" else "user.alice.") + folder

    def note(self, who, data):
        self.log.append(b"%s %s" % (who, data[:300]))
        del self.log[:-40]

    def fail(self, why):
        raise ModelError("session %d (%s, folder %s): %s\nlast exchange:\n%s"
                         % (self.n, self.user, self.folder, why,
                            b"\n".join(self.log).decode(errors="replace")))

    def keyword(self):
        """Mostly one of the session's two keywords, now and then a new
        one: the mailbox's 128 keywords fill up, then new ones are refused
        with NO [LIMIT] while the old ones still work."""
        self.kwno += 1
        if self.rng.random() < 0.05:
            return "K%d_%d" % (self.n, self.kwno)
        return "K%d_%d" % (self.n, self.kwno % 2)

    def refused_limit(self, r):
        """A NO [LIMIT] (too many keywords): accepted, counted."""
        if r.split(b" ", 2)[1:2] == [b"NO"] and b"[LIMIT]" in r:
            self.sh.count("limit")
            return True
        return False

    # ---- the model -----------------------------------------------------
    def set_uid(self, seq, uid):
        cur = self.uids[seq - 1]
        if cur is not None:
            if cur != uid:
                self.fail("message %d has UID %d, the model says %d"
                          % (seq, uid, cur))
            return
        before = [u for u in self.uids[:seq - 1] if u is not None]
        after = [u for u in self.uids[seq:] if u is not None]
        if (before and before[-1] >= uid) or (after and after[0] <= uid):
            self.fail("UID %d of message %d breaks the order %r"
                      % (uid, seq, self.uids))
        if uid <= self.floor[seq - 1]:
            # a message announced by EXISTS while selected is new
            self.fail("new message %d has UID %d, not above %d seen before"
                      % (seq, uid, self.floor[seq - 1]))
        self.uids[seq - 1] = uid
        self.maxuid = max(self.maxuid, uid)

    def untagged(self, r, t_sent, fetched):
        m = RE_NUM.match(r)
        if m:
            num, what = int(m.group(1)), m.group(2)
            if what == b"EXISTS":
                if num < len(self.uids):
                    self.fail("EXISTS %d below the %d messages known"
                              % (num, len(self.uids)))
                self.floor.extend([self.maxuid] * (num - len(self.uids)))
                self.uids.extend([None] * (num - len(self.uids)))
            elif what == b"EXPUNGE":
                if not 1 <= num <= len(self.uids):
                    self.fail("EXPUNGE %d of %d messages"
                              % (num, len(self.uids)))
                del self.uids[num - 1]
                del self.floor[num - 1]
            elif what == b"FETCH":
                if not 1 <= num <= len(self.uids):
                    self.fail("FETCH of message %d of %d"
                              % (num, len(self.uids)))
                head = r.split(b"\r\n", 1)[0]
                mu = RE_UID.search(head)
                if mu:
                    self.set_uid(num, int(mu.group(1)))
                mf = RE_FLAGS.search(head)
                if mf:
                    flags = set(mf.group(1).decode().split())
                    kws = {f for f in flags if not f.startswith("\\")}
                    if not kws <= self.announced:
                        self.fail("keywords %s in FETCH before any FLAGS "
                                  "response announced them"
                                  % sorted(kws - self.announced))
                    uid = self.uids[num - 1]
                    if uid is not None:
                        fetched.append((uid, flags))
            return
        if r.startswith(b"* SEARCH"):
            # UIDs the model does not know must fit in the messages
            # announced (EXISTS) whose UIDs it has not learnt yet
            unknown = {int(v) for v in r.split()[2:]} - set(self.uids)
            if len(unknown) > self.uids.count(None):
                self.fail("UID SEARCH gave UIDs %s, not of the %d messages "
                          "announced" % (sorted(unknown), len(self.uids)))
        elif r.startswith(b"* FLAGS ("):
            self.announced |= set(r[9:r.index(b")")].decode().split())
        elif r.startswith(b"* OK [PERMANENTFLAGS ("):
            s = r[len(b"* OK [PERMANENTFLAGS ("):]
            self.announced |= set(s[:s.index(b")")].decode().split())

    # ---- commands ---------------------------------------------------------
    def command(self, text, literal=None):
        """Send a command (with a synchronizing literal when given), read
        and check every response up to the tagged one; returns (tagged
        line, untagged responses)."""
        self.tagno += 1
        tag = b"t%d" % self.tagno
        t_sent = time.monotonic()
        line = tag + b" " + text.encode()
        self.note(b"C:", line)
        fetched = []
        untagged = []
        if literal is not None:
            line += b" {%d}" % len(literal)
            self.c.send(line + b"\r\n")
            while True:
                r = self.c.response()
                self.note(b"S:", r)
                if r.startswith(b"+"):
                    break
                if r.startswith(tag + b" "):
                    return r, untagged
                untagged.append(r)
                self.untagged(r, t_sent, fetched)
            self.c.send(literal + b"\r\n")
        else:
            self.c.send(line + b"\r\n")
        while True:
            r = self.c.response()
            self.note(b"S:", r)
            if r.startswith(tag + b" "):
                break
            if r.startswith(b"* "):
                untagged.append(r)
                self.untagged(r, t_sent, fetched)
        # no keyword lost: those stored before this command was sent
        for uid, flags in fetched:
            want = self.sh.required(self.folder, uid, t_sent)
            lost = sorted(set(want) - flags)
            if lost:
                self.fail("UID %d lost keywords %s (FLAGS %s); stored by: %s"
                          % (uid, lost, sorted(flags), want[lost[0]]))
        return r, untagged

    def ok(self, r, what):
        if not r[0].split(b" ", 2)[1:2] == [b"OK"]:
            self.fail("%s: %r" % (what, r[0]))
        return r

    def select(self, folder):
        self.folder = folder
        self.uids = []
        self.floor = []
        self.maxuid = 0
        self.announced = set()
        self.ok(self.command("SELECT %s" % self.mbox(folder)), "SELECT")
        self.floor = [0] * len(self.uids)
        if self.uids:
            self.ok(self.command("FETCH 1:* (UID FLAGS)"), "FETCH")
        self.sh.count("select")

    def pick(self):
        """A message of the model with a known UID: (seq, uid) or None."""
        known = [(i + 1, u) for i, u in enumerate(self.uids) if u is not None]
        return self.rng.choice(known) if known else None

    def op(self):
        x = self.rng.random()
        if x < 0.2:
            if self.uids:
                self.ok(self.command("FETCH 1:* (UID FLAGS)"), "FETCH")
                self.sh.count("fetch")
        elif x < 0.3:
            p = self.pick()
            if p:
                self.ok(self.command("UID FETCH %d (UID FLAGS BODY.PEEK"
                                     "[HEADER.FIELDS (SUBJECT)])" % p[1]),
                        "UID FETCH")
                self.sh.count("fetch")
        elif x < 0.5:
            p = self.pick()
            if p:
                kws = [self.keyword() for _ in range(self.rng.randint(1, 2))]
                r, _ = self.command("UID STORE %d +FLAGS (%s)"
                                    % (p[1], " ".join(kws)))
                if not self.refused_limit(r):
                    self.ok((r,), "STORE")
                    self.sh.store(self.folder, p[1], kws,
                                  "session %d: %s" % (self.n, self.log[-1]))
                    self.sh.count("store")
        elif x < 0.65:
            kws = [self.keyword() for _ in range(self.rng.randint(1, 3))]
            msg = (b"From: s%d@example.com\r\nSubject: append %d\r\n\r\n"
                   b"body\r\n" % (self.n, self.kwno))
            r, _ = self.command("APPEND %s (%s)" % (self.mbox(self.folder),
                                                     " ".join(kws)),
                                literal=msg)
            if self.refused_limit(r):
                return
            self.ok((r,), "APPEND")
            m = re.search(rb"\[APPENDUID \d+ (\d+)\]", r)
            if not m:
                self.fail("APPEND without APPENDUID: %r" % r)
            self.sh.store(self.folder, int(m.group(1)), kws,
                          "session %d: %s" % (self.n, b" | ".join(
                              self.log[-6:])))
            self.sh.count("append")
        elif x < 0.72:
            p = self.pick()
            if p:
                self.ok(self.command("UID STORE %d +FLAGS.SILENT (\\Deleted)"
                                     % p[1]), "STORE \\Deleted")
                self.ok(self.command("UID EXPUNGE %d" % p[1]), "UID EXPUNGE")
                if p[1] in self.uids:
                    self.fail("UID EXPUNGE %d: the message is still there"
                              % p[1])
                self.sh.count("expunge")
        elif x < 0.82:
            r, unt = self.command("UID SEARCH %s" % self.rng.choice(
                ["ALL", "UNSEEN", "KEYWORD K%d_%d" % (self.n, self.kwno),
                 "SUBJECT append"]))
            self.ok((r,), "SEARCH")
            self.sh.count("search")
        elif x < 0.92:
            self.ok(self.command("NOOP"), "NOOP")
            self.sh.count("noop")
        elif x < 0.97:
            self.idle()
        else:
            self.select(self.rng.choice(FOLDERS))

    def idle(self):
        self.tagno += 1
        tag = b"t%d" % self.tagno
        fetched = []
        self.c.send(tag + b" IDLE\r\n")
        self.note(b"C:", tag + b" IDLE")
        r = self.c.response()
        self.note(b"S:", r)
        while not r.startswith(b"+"):
            if r.startswith(tag + b" "):
                self.fail("IDLE refused: %r" % r)
            self.untagged(r, 0, fetched)
            r = self.c.response()
            self.note(b"S:", r)
        # updates arrive while idle (lmtpd delivers all the time)
        end = time.monotonic() + self.rng.uniform(0.05, 0.5)
        self.c.sock.settimeout(0.1)
        try:
            while time.monotonic() < end:
                try:
                    r = self.c.response()
                except OSError:
                    continue
                self.note(b"S:", r)
                self.untagged(r, 0, fetched)
        finally:
            self.c.sock.settimeout(120)
        self.c.send(b"DONE\r\n")
        self.note(b"C:", b"DONE")
        while True:
            r = self.c.response()
            self.note(b"S:", r)
            if r.startswith(tag + b" "):
                break
            self.untagged(r, 0, fetched)
        self.ok((r,), "IDLE")
        self.sh.count("idle")

    def run(self):
        try:
            with Raw(self.addr, timeout=120) as c:
                self.c = c
                c.line()
                c.starttls()
                r = c.cmd("L", "LOGIN %s %s" % (self.user, self.pw))
                if not r[-1].startswith(b"L OK"):
                    self.fail("LOGIN: %r" % r)
                self.sh.count("login")
                self.select(FOLDERS[self.n % len(FOLDERS)])
                while time.monotonic() < self.deadline:
                    self.op()
                self.command("LOGOUT")
        except ModelError as e:
            with self.sh.lock:
                self.sh.errors.append(str(e))
        except (ConnectionClosed, OSError, Exception) as e:  # noqa: BLE001
            with self.sh.lock:
                self.sh.errors.append(
                    "session %d: %r\nlast exchange:\n%s"
                    % (self.n, e, b"\n".join(self.log).decode(
                        errors="replace")))


def deliverer(i, sh, stop):
    """lmtpd delivers to alice's folders until stop is set."""
    k = 0
    while not stop.is_set():
        folder = FOLDERS[k % len(FOLDERS)]
        k += 1
        try:
            i.lmtp_deliver("alice", b"From: lmtp@example.com\r\nSubject: "
                           b"lmtp %d\r\n\r\nbody %d\r\n" % (k, k), folder)
            sh.count("lmtp")
        except Exception as e:  # noqa: BLE001 - reported as an error
            with sh.lock:
                sh.errors.append("LMTP delivery %d: %r" % (k, e))
            return


def test_imap_load():
    sh = Shared()
    i = ImapInstance("imapload", conf={"admins": "admin"}, tls=True,
                     sasl=USERS[0])
    with i:
        for u, pw in USERS[1:]:
            make_sasldb_extra(i, u, pw)
        i.create("user.alice")
        for f in FOLDERS:
            i.create("user.alice." + f, {"bob": "lrswite",
                                         "carol": "lrswite"})
        for k in range(20):
            for f in FOLDERS:
                i.mbtool("deliver", "-D", "-m", f, "alice",
                         input=b"Subject: seed %d\r\n\r\nbody\r\n" % k)
        i.write_cyrus_conf(prefork=2, maxchild=SESSIONS + 10, imaps=False)
        i.start()
        stop = threading.Event()
        lm = threading.Thread(target=deliverer, args=(i, sh, stop))
        deadline = time.monotonic() + SECONDS
        ts = [threading.Thread(target=Session(sh, i.addr(), n,
                                              deadline).run)
              for n in range(SESSIONS)]
        lm.start()
        for t in ts:
            t.start()
        for t in ts:
            # generous: a session ends after its last command
            t.join(SECONDS + 600)
        stop.set()
        lm.join(300)
        check(not any(t.is_alive() for t in ts) and not lm.is_alive(),
              "sessions still running %.0f s after the end"
              % (SECONDS + 600))
        ops = ", ".join("%s %d" % kv for kv in sorted(sh.counts.items()))
        print("imapload: %d sessions, %.0f s: %s; errors %d"
              % (SESSIONS, SECONDS, ops, len(sh.errors)))
        for e in sh.errors[:5]:
            print("ERROR: " + e)
        for e in sh.errors[5:]:
            print("ERROR: " + e.split("\n", 1)[0])
        check(not sh.errors, "%d consistency errors (first above)"
              % len(sh.errors))
        for f in FOLDERS:
            i.mbtool("check", "user.alice." + f)


if __name__ == "__main__":
    sys.exit(run_imap_tests([test_imap_load]))
