#!/usr/bin/env python3
"""test_sieve_delivery.py - users' Sieve scripts run by lmtpd at delivery.

A private master with lmtpd; the test places each user's script in the
script layout (SIEVEDIR/H/USER/NAME.script, the active one the symlink
defaultbc) and points the `sendmail` key at a fake sendmail of its own (a
shell script that appends its arguments and its input to a file, and
exits with the status held in a control file).  Checked: fileinto with
and without :create, imap4flags flags on the stored record, discard,
keep + fileinto stored as one file (same inode: single instance),
redirect (arrives at sendmail with the trace header; a redirect loop and
a repeated delivery do not send again), sendmail failures (451, nothing
stored, then 250 on the retry), vacation (once per sender and period;
never to lists, bulk, auto-submitted mail, the null sender), reject and
ereject (550 5.7.1 with the reason), three recipients with three
different scripts in one transaction, runtime and compile errors
(implicit keep), duplicatesuppression with fileinto targets, the
compiled-script cache (an unchanged script is compiled once per worker,
a changed one again; users with the same text share one; a cached
script costs one stat, no open or read, and a message within the
stage's buffer is not read back; more texts than the cache holds are
evicted and compiled again, never while running), and workers
SIGKILLed while delivering with scripts (no acknowledged message lost,
nothing partial visible).

Environment: see lmtphelp.py (top_builddir, TEST_TMPDIR, LMTP_TESTS,
LMTP_KEEP).
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import (Skip, check, children_of, chown_run_as,  # noqa: E402
                     cmdline, proc_read, wait_until)
from lmtphelp import (Conn, Instance, make_message, read_index,  # noqa: E402
                      run_lmtp_tests, transaction)

FLAG_FLAGGED = 1 << 1
FLAG_SEEN = 1 << 4
USERS = ["alice", "bob", "carol", "dave", "erin", "frank"]
_seq = [0]

FAKE_SENDMAIL = r"""#!/bin/sh
# the test's sendmail: arguments and input appended to OUT
OUT=%(out)s
ls -l /proc/$$/fd >> "$OUT.fds" 2>&1
{
  echo "==== ARGV: $*"
  cat
  echo "==== END"
} >> "$OUT"
if [ -f %(fail)s.slow ]; then sleep 90; fi
if [ -f %(fail)s ]; then exit 75; fi
exit 0
"""


def msgid():
    _seq[0] += 1
    return "sv-%d-%d-%f@test.example" % (os.getpid(), _seq[0], time.time())


class SieveInstance(Instance):
    def __init__(self, name, conf=None, prefork=1, maxchild=10):
        self.sievedir = None
        Instance.__init__(self, name, conf=conf)
        self.sievedir = self.path("sieve")
        os.mkdir(self.sievedir)
        chown_run_as(self.sievedir)
        self.mail_out = self.path("sendmail.out")
        self.fail_file = self.path("sendmail.fail")
        fake = self.path("sendmail")
        with open(fake, "w") as f:
            f.write(FAKE_SENDMAIL % {"out": self.mail_out,
                                     "fail": self.fail_file})
        os.chmod(fake, 0o755)
        for p in (self.mail_out, self.mail_out + ".fds"):
            open(p, "w").close()
            chown_run_as(p)
            os.chmod(p, 0o666)
        extra = {"sievedir": self.sievedir, "sendmail": fake}
        extra.update(conf or {})
        self.write_imapd_conf(extra)
        for u in USERS:
            self.create("user." + u)
        self.write_cyrus_conf(prefork=prefork, maxchild=maxchild)

    def script(self, user, text, name="main"):
        """Install text as user's active script NAME."""
        d = os.path.join(self.sievedir, user[0].lower(), user)
        os.makedirs(d, exist_ok=True)
        # lmtpd (the run-as user) writes the compiled form NAME.bc there
        chown_run_as(os.path.dirname(d))
        chown_run_as(d)
        p = os.path.join(d, name + ".script")
        tmp = p + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, p)
        link = os.path.join(d, "defaultbc")
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(name + ".script", link)
        return p

    def sent(self):
        """[(argv, message bytes)] handed to the fake sendmail."""
        with open(self.mail_out, "rb") as f:
            data = f.read()
        out = []
        for m in re.finditer(rb"==== ARGV: ([^\n]*)\n(.*?)==== END\n", data,
                             re.S):
            out.append((m.group(1).decode(), m.group(2)))
        return out


def send(inst, rcpts, msg, sender="sender@example.net"):
    """One transaction; returns the per-recipient replies (RCPTs must be
    accepted)."""
    with Conn(inst.unix_socket) as c:
        c.reply()
        mr, rr, dr, per = transaction(c, sender, rcpts, msg,
                                      lhlo="client.example")
        check(mr.code == 250, "MAIL: %r" % mr)
        check(all(r.code == 250 for r in rr), "RCPT: %r" % rr)
        check(dr is not None and dr.code == 354, "DATA: %r" % dr)
        c.cmd("QUIT")
    return per


def flags_of(inst, mailbox):
    _, records = read_index(inst.mailbox_dir(mailbox))
    return [r["flags"] for r in records]


def exists(inst, name):
    rc, _, _ = inst.mbtool("info", name, check_rc=False)
    return rc == 0


FILING = r'''require ["fileinto", "mailbox", "imap4flags"];
if header :contains "subject" "work" {
    fileinto :flags ["\\Seen", "\\Flagged", "$Work"] "INBOX.work";
} elsif header :contains "subject" "newfolder" {
    fileinto :create "INBOX.made";
} elsif header :contains "subject" "missing" {
    fileinto "INBOX.nothere";
} elsif header :contains "subject" "both" {
    keep;
    fileinto "INBOX.work";
} elsif header :contains "subject" "trash" {
    discard;
}
'''


def test_fileinto_flags_create_discard():
    with SieveInstance("sv-file") as inst:
        inst.create("user.alice.work")
        inst.script("alice", FILING)
        inst.start()
        inst.mark_log()
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="work item"))
        check(per[0].code == 250, "work: %r" % per)
        check(len(inst.messages("user.alice.work")) == 1
              and len(inst.messages("user.alice")) == 0,
              "fileinto INBOX.work did not file")
        fl = flags_of(inst, "user.alice.work")[-1]
        check(fl & FLAG_SEEN and fl & FLAG_FLAGGED,
              "flags not set on the record: %#x" % fl)
        with open(os.path.join(inst.mailbox_dir("user.alice.work"),
                               "cyrus.header"), "rb") as f:
            check(b"$Work" in f.read(), "keyword $Work not defined")
        # :create makes the folder
        check(not exists(inst, "user.alice.made"), "made exists early")
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="newfolder"))
        check(per[0].code == 250, "create: %r" % per)
        check(exists(inst, "user.alice.made")
              and len(inst.messages("user.alice.made")) == 1,
              "fileinto :create did not create and file")
        # without :create a missing folder means INBOX and a log line
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="missing"))
        check(per[0].code == 250, "missing: %r" % per)
        check(not exists(inst, "user.alice.nothere"),
              "folder created without :create")
        check(len(inst.messages("user.alice")) == 1, "not in INBOX")
        check("fileinto target missing" in inst.new_log(),
              "no log line for the missing folder")
        # keep + fileinto: one file, linked twice
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="both"))
        check(per[0].code == 250, "both: %r" % per)
        a = inst.message_files("user.alice")[-1][1]
        b = inst.message_files("user.alice.work")[-1][1]
        check(os.stat(a).st_ino == os.stat(b).st_ino,
              "keep + fileinto are not one instance")
        check(len(inst.messages("user.alice")) == 2, "keep missing")
        # discard stores nothing and answers 250
        before = len(inst.messages("user.alice"))
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="trash"))
        check(per[0].code == 250, "discard: %r" % per)
        check(len(inst.messages("user.alice")) == before,
              "discarded message stored")
        check(re.search(r"lmtp: sieve rcpt=<alice@test.example> "
                        r"user=<alice> script=<main.script> result=<ok> "
                        r"loaded=<\d+> actions=<discard>", inst.new_log()),
              "no per-recipient sieve log line")


def test_redirect_and_loops():
    with SieveInstance("sv-redir") as inst:
        inst.script("bob", 'redirect "elsewhere@example.net";\n')
        inst.start()
        mid = msgid()
        msg = make_message(mid, subject="fwd me", to="bob@test.example")
        per = send(inst, ["bob@test.example"], msg)
        check(per[0].code == 250, "redirect: %r" % per)
        sent = inst.sent()
        check(len(sent) == 1, "sendmail calls: %r" % sent)
        argv, body = sent[0]
        check(argv == "-i -f sender@example.net -- elsewhere@example.net",
              "sendmail argv: %r" % argv)
        check(body.startswith(b"X-Sieve-Redirected-By: bob@test.example")
              and b"Subject: fwd me" in body,
              "redirected message: %r" % body[:300])
        check(len(inst.messages("user.bob")) == 0, "redirect kept a copy")
        with open(inst.mail_out + ".fds") as f:
            fds = f.read()
        check("socket:" not in fds, "sendmail inherited sockets: %s" % fds)
        # the same message again (the MTA retried): not sent twice
        per = send(inst, ["bob@test.example"], msg)
        check(per[0].code == 250 and len(inst.sent()) == 1,
              "repeated delivery redirected again: %r" % inst.sent())
        # a message that already went through bob's redirect: a loop
        looped = make_message(msgid(), subject="loop",
                              extra_headers=["X-Sieve-Redirected-By: "
                                             "bob@test.example"])
        per = send(inst, ["bob@test.example"], looped)
        check(per[0].code == 250 and len(inst.sent()) == 1,
              "loop not stopped: %r" % inst.sent())
        check("(loop)" in inst.log(), "loop not logged")
        # sendmail fails: 451 and nothing stored; the retry works
        open(inst.fail_file, "w").close()
        inst.script("bob", 'require "copy";\n'
                    'redirect :copy "elsewhere@example.net";\n')
        msg2 = make_message(msgid(), subject="retry me")
        per = send(inst, ["bob@test.example"], msg2)
        check(per[0].code == 451, "sendmail failure answered %r" % per)
        check(len(inst.messages("user.bob")) == 0,
              "stored although the recipient got 451")
        os.unlink(inst.fail_file)
        n = len(inst.sent())
        per = send(inst, ["bob@test.example"], msg2)
        check(per[0].code == 250, "retry: %r" % per)
        check(len(inst.messages("user.bob")) == 1, ":copy not kept")
        check(len(inst.sent()) == n + 1, "retry not redirected")


def test_tests_see_message():
    """subaddress on the envelope, body (read from the staged file),
    environment and mailboxexists."""
    with SieveInstance("sv-tests") as inst:
        inst.create("user.frank.exists")
        inst.script("frank", 'require ["fileinto", "body", "subaddress", '
                    '"envelope", "environment", "mailbox"];\n'
                    'if envelope :detail "to" "lists" '
                    '{ fileinto :create "INBOX.lists"; }\n'
                    'elsif body :text :contains "secret-word" '
                    '{ fileinto :create "INBOX.body"; }\n'
                    'elsif allof (environment :is "host" "test.example", '
                    'environment :is "name" "cyrusdeliver", '
                    'environment :is "phase" "during", '
                    'mailboxexists "INBOX.exists") '
                    '{ fileinto "INBOX.exists"; }\n')
        inst.start()
        send(inst, ["frank+lists@test.example"], make_message(msgid()))
        send(inst, ["frank@test.example"],
             make_message(msgid(), body=b"a\r\nthe secret-word here\r\n"))
        send(inst, ["frank@test.example"], make_message(msgid()))
        for box in ("user.frank.lists", "user.frank.body",
                    "user.frank.exists"):
            check(len(inst.messages(box)) == 1, "%s: %d messages"
                  % (box, len(inst.messages(box))))
        check(len(inst.messages("user.frank")) == 0, "INBOX got one")


def test_sendmail_timeout():
    """A sendmail that hangs is killed after lmtp_timeout: the recipient
    gets 451 in time, nothing is stored, the worker goes on."""
    with SieveInstance("sv-slow", conf={"lmtp_timeout": "10"}) as inst:
        inst.script("bob", 'require "copy";\n'
                    'redirect :copy "elsewhere@example.net";\n')
        inst.start()
        open(inst.fail_file + ".slow", "w").close()
        t0 = time.time()
        per = send(inst, ["bob@test.example"], make_message(msgid()))
        took = time.time() - t0
        check(per[0].code == 451, "hung sendmail answered %r" % per)
        check(took < 40, "451 after %.1f s" % took)
        check(len(inst.messages("user.bob")) == 0, "stored with 451")
        check("reason=<timeout>" in inst.log(), "timeout not logged")
        os.unlink(inst.fail_file + ".slow")
        per = send(inst, ["bob@test.example"], make_message(msgid()))
        check(per[0].code == 250 and len(inst.messages("user.bob")) == 1,
              "after the timeout: %r" % per)


VACATION = '''require "vacation";
vacation :days 1 :subject "Away" "I am away.";
'''


def test_vacation():
    with SieveInstance("sv-vac") as inst:
        inst.script("carol", VACATION)
        inst.start()
        to = "carol@test.example"
        mid = msgid()
        per = send(inst, [to], make_message(mid, subject="hi", to=to),
                   sender="friend@example.net")
        check(per[0].code == 250, "vacation: %r" % per)
        sent = inst.sent()
        check(len(sent) == 1, "vacation not sent: %r" % sent)
        argv, body = sent[0]
        check(argv == "-i -f <> -- friend@example.net", "argv %r" % argv)
        for want in (b"Auto-Submitted: auto-replied",
                     b"In-Reply-To: <" + mid.encode() + b">",
                     b"Subject: Away", b"To: <friend@example.net>",
                     b"I am away."):
            check(want in body, "reply lacks %r: %r" % (want, body[:600]))
        check(len(inst.messages("user.carol")) == 1, "vacation lost keep")
        # same sender within :days: no second reply
        send(inst, [to], make_message(msgid(), to=to),
             sender="friend@example.net")
        check(len(inst.sent()) == 1, "second reply within :days")
        # another sender: answered
        send(inst, [to], make_message(msgid(), to=to),
             sender="other@example.net")
        check(len(inst.sent()) == 2, "other sender not answered")
        # never to lists, bulk, auto-submitted mail, the null sender,
        # nor mail not addressed to the user
        cases = [
            ("l1@example.net", ["List-Id: <x.example.net>"], to),
            ("l2@example.net", ["Precedence: bulk"], to),
            ("l3@example.net", ["Auto-Submitted: auto-generated"], to),
            ("", [], to),
            ("l4@example.net", [], "someone@else.example"),
            ("owner-list@example.net", [], to),
        ]
        for sender, hdrs, hto in cases:
            per = send(inst, [to], make_message(msgid(), extra_headers=hdrs,
                                                to=hto), sender=sender)
            check(per[0].code == 250, "%r: %r" % (sender, per))
            check(len(inst.sent()) == 2, "vacation answered %r %r: %r"
                  % (sender, hdrs, inst.sent()[-1][0]))
        # :seconds 1 (vacation-seconds): answered again after it passed
        inst.script("carol", 'require ["vacation-seconds"];\n'
                    'vacation :seconds 1 "back soon";\n')
        send(inst, [to], make_message(msgid(), to=to),
             sender="quick@example.net")
        check(len(inst.sent()) == 3, "vacation :seconds not sent")
        time.sleep(2.1)
        send(inst, [to], make_message(msgid(), to=to),
             sender="quick@example.net")
        check(len(inst.sent()) == 4, "vacation not sent after :seconds")


def test_reject_ereject():
    with SieveInstance("sv-rej") as inst:
        inst.script("dave", 'require "reject";\nreject "no thanks";\n')
        inst.script("erin", 'require "ereject";\n'
                    'ereject "go away\r\n250 ok \u00e9t\u00e9";\n')
        inst.start()
        per = send(inst, ["dave@test.example", "erin@test.example",
                          "frank@test.example"],
                   make_message(msgid()))
        check(per[0].code == 550 and per[0].enh == "5.7.1"
              and "no thanks" in per[0].text, "reject: %r" % per[0])
        check(per[1].code == 550 and "go away" in per[1].text
              and len(per[1].lines) == 1
              and all(32 <= ord(ch) < 127 for ch in per[1].text),
              "ereject: %r" % per[1])
        check(per[2].code == 250, "frank: %r" % per[2])
        check(len(inst.messages("user.dave")) == 0
              and len(inst.messages("user.erin")) == 0
              and len(inst.messages("user.frank")) == 1,
              "reject stored something")
        check(len(inst.sent()) == 0, "reject sent mail")


def test_three_users_own_scripts():
    """Each recipient's own script, with its own envelope: alice files,
    bob redirects, carol answers and keeps: all in one transaction."""
    with SieveInstance("sv-three") as inst:
        inst.create("user.alice.work")
        inst.create("user.carol.work")
        inst.script("alice", 'require ["fileinto", "envelope"];\n'
                    'if envelope :localpart :is "to" "alice" '
                    '{ fileinto "INBOX.work"; }\n')
        inst.script("bob", 'require "envelope";\n'
                    'if envelope :localpart :is "to" "bob" '
                    '{ redirect "bob@elsewhere.example"; }\n')
        inst.script("carol", 'require ["vacation", "envelope"];\n'
                    'if envelope :localpart :is "to" "carol" '
                    '{ vacation :addresses ["alice@test.example"] '
                    '"carol away"; }\n')
        inst.start()
        inst.mark_log()
        per = send(inst, ["alice@test.example", "bob@test.example",
                          "carol@test.example"],
                   make_message(msgid(), to="alice@test.example"))
        check([r.code for r in per] == [250, 250, 250], "%r" % per)
        check(len(inst.messages("user.alice.work")) == 1
              and len(inst.messages("user.alice")) == 0, "alice")
        check(len(inst.messages("user.bob")) == 0, "bob kept")
        check(len(inst.messages("user.carol")) == 1
              and len(inst.messages("user.carol.work")) == 0, "carol")
        sent = inst.sent()
        check(sorted(a.split()[-1] for a, _ in sent)
              == ["bob@elsewhere.example", "sender@example.net"],
              "sendmail got %r" % [a for a, _ in sent])
        a = inst.message_files("user.alice.work")[0][1]
        c = inst.message_files("user.carol")[0][1]
        check(os.stat(a).st_ino == os.stat(c).st_ino,
              "recipients' copies are not one instance")
        log = inst.new_log()
        for u, act in (("alice", 'fileinto "user.alice.work"'),
                       ("bob", "redirect"), ("carol", "vacation (sent)")):
            check(re.search(r"sieve rcpt=<%s@test.example> user=<%s> "
                            r"[^\n]*%s" % (u, u, re.escape(act)), log),
                  "log line of %s: %s" % (u, log[-1500:]))


def test_errors_keep():
    with SieveInstance("sv-err") as inst:
        inst.create("user.alice.work")
        inst.script("alice", 'require ["fileinto", "variables"];\n'
                    'set "a" "not an address";\n'
                    'fileinto "INBOX.work";\n'
                    'redirect "${a}";\n')
        inst.script("bob", 'if header :is "subject" { keep; }\n')
        inst.start()
        per = send(inst, ["alice@test.example", "bob@test.example"],
                   make_message(msgid()))
        check([r.code for r in per] == [250, 250], "%r" % per)
        check(len(inst.messages("user.alice")) == 1
              and len(inst.messages("user.alice.work")) == 0,
              "runtime error: not an implicit keep")
        check(len(inst.messages("user.bob")) == 1,
              "compile error: not an implicit keep")
        log = inst.log()
        check("sieve runtime error user=<alice>" in log, "runtime log")
        check("sieve script does not compile user=<bob>" in log,
              "compile log")


def test_duplicatesuppression():
    with SieveInstance("sv-dup") as inst:
        inst.create("user.alice.work")
        inst.script("alice", FILING)
        inst.start()
        msg = make_message(msgid(), subject="work again")
        for _ in range(2):
            per = send(inst, ["alice@test.example"], msg)
            check(per[0].code == 250, "%r" % per)
        check(len(inst.messages("user.alice.work")) == 1,
              "duplicate filed twice")
        check("status=<duplicate>" in inst.log(), "not a duplicate")
        # the same message-id, a different folder: stored
        inst.script("alice", 'require "fileinto";\n'
                    'fileinto "INBOX";\n')
        per = send(inst, ["alice@test.example"], msg)
        check(per[0].code == 250 and len(inst.messages("user.alice")) == 1,
              "other folder suppressed")


def test_compiled_cache():
    # one worker: the cache is per process
    with SieveInstance("sv-cache", maxchild=1) as inst:
        inst.create("user.alice.work")
        inst.script("alice", 'require "fileinto";\nfileinto "INBOX.work";\n')
        inst.start()
        for _ in range(4):
            send(inst, ["alice@test.example"], make_message(msgid()))
        n = inst.log().count("lmtp: sieve compiled")
        check(n == 1, "unchanged script compiled %d times" % n)
        check(len(inst.messages("user.alice.work")) == 4, "not filed")
        time.sleep(0.05)
        inst.script("alice", "keep;\n# changed\n")
        send(inst, ["alice@test.example"], make_message(msgid()))
        check(inst.log().count("lmtp: sieve compiled") == 2,
              "changed script not compiled again")
        check(len(inst.messages("user.alice")) == 1,
              "the changed script did not run")
        send(inst, ["alice@test.example"], make_message(msgid()))
        check(inst.log().count("lmtp: sieve compiled") == 2,
              "recompiled without change")


def test_compiled_shared():
    """Users whose script files hold the same text share one compiled
    script in a worker; a user whose text differs gets its own, and each
    still runs its own script."""
    with SieveInstance("sv-share", maxchild=1) as inst:
        text = 'require "fileinto";\nfileinto "INBOX.work";\n'
        for u in ("alice", "bob", "carol"):
            inst.create("user.%s.work" % u)
            inst.script(u, text)
        inst.start()
        for u in ("alice", "bob", "carol"):
            send(inst, ["%s@test.example" % u], make_message(msgid()))
        n = inst.log().count("lmtp: sieve compiled")
        check(n == 1, "three copies of one text compiled %d times" % n)
        for u in ("alice", "bob", "carol"):
            check(len(inst.messages("user.%s.work" % u)) == 1,
                  "%s: not filed" % u)
        inst.script("carol", text + "# carol's own\nkeep;\n")
        send(inst, ["carol@test.example"], make_message(msgid()))
        send(inst, ["bob@test.example"], make_message(msgid()))
        check(inst.log().count("lmtp: sieve compiled") == 2,
              "a different text not compiled on its own")
        check(len(inst.messages("user.carol")) == 1 and
              len(inst.messages("user.carol.work")) == 2,
              "carol's new script did not run")
        check(len(inst.messages("user.bob.work")) == 2 and
              len(inst.messages("user.bob")) == 0,
              "bob's script changed with carol's")


def test_compiled_probation():
    """A user's own text, new to the worker, waits in a probation slot of
    one: the next new text drops it (its memory is the next tree's), a
    text used again while there is kept, and a text made before is kept
    at once when it comes back (loaded from its compiled form, not
    compiled again)."""
    with SieveInstance("sv-probation", maxchild=1) as inst:
        for u in ("alice", "bob", "carol"):
            inst.create("user.%s.work" % u)
            inst.script(u, 'require "fileinto";\n# %s\n'
                           'fileinto "INBOX.work";\n' % u)
        inst.start()

        def deliver(u):
            per = send(inst, ["%s@test.example" % u], make_message(msgid()))
            check(per[0].code == 250, "%s: %r" % (u, per))

        def counts():
            log = inst.log()
            return (log.count("lmtp: sieve compiled"),
                    loads_of(log))

        deliver("alice")    # alice's text on probation
        deliver("bob")      # bob's takes the slot: alice's dropped
        check(counts() == (2, 0), "compiles, loads: %r" % (counts(),))
        deliver("alice")    # made before: loaded again, and kept
        check(counts() == (2, 1), "alice's dropped text not loaded "
              "again from its compiled form: %r" % (counts(),))
        deliver("alice")
        deliver("bob")      # used again on probation: kept
        deliver("carol")    # a new text: bob's stays
        deliver("bob")
        deliver("alice")
        check(counts() == (3, 1), "a kept text was loaded again: %r"
              % (counts(),))
        for u, n in (("alice", 4), ("bob", 3), ("carol", 1)):
            got = len(inst.messages("user.%s.work" % u))
            check(got == n, "%s: %d filed, not %d" % (u, got, n))


def loads_of(log):
    """Compiled forms (NAME.bc) loaded, by the recipients' "sieve" lines
    (loaded=<N>: the recipient's script and its includes)."""
    return sum(int(n) for n in
               re.findall(r"lmtp: sieve rcpt=<[^>]*> .*?loaded=<(\d+)>", log))


def _restart(inst):
    problems = inst.stop()
    check(not problems, "; ".join(problems))
    inst.start()


def test_compiled_form():
    """A script stored by mbtool sieve has its compiled form beside it
    (NAME.bc); lmtpd loads that instead of parsing the text (no "sieve
    compiled" line, loaded=<N> on the recipient's "sieve" line).  A text changed behind our
    back (the .bc stale) is compiled and its new rules run, and the .bc
    is rewritten and used by the next worker; a damaged .bc is refused,
    the text runs, the file is repaired; an include loads its own .bc."""
    with SieveInstance("sv-bc", maxchild=1) as inst:
        inst.create("user.alice.work")
        inst.create("user.alice.other")
        d = os.path.join(inst.sievedir, "a", "alice")
        src = inst.path("main.sieve")
        with open(src, "w") as f:
            f.write('require ["fileinto", "include"];\n'
                    'include :personal "sub";\n'
                    'fileinto "INBOX.work";\n')
        sub = inst.path("sub.sieve")
        with open(sub, "w") as f:
            f.write('require "imap4flags";\naddflag "\\\\Flagged";\n')
        inst.mbtool("sieve", "put", "alice", "sub", sub)
        inst.mbtool("sieve", "put", "alice", "main", src)
        inst.mbtool("sieve", "activate", "alice", "main")
        bc = os.path.join(d, "main.bc")
        check(os.path.exists(bc) and os.path.exists(os.path.join(d, "sub.bc")),
              "mbtool sieve put wrote no compiled form: %r" % os.listdir(d))
        inst.start()
        for _ in range(3):
            per = send(inst, ["alice@test.example"], make_message(msgid()))
            check(per[0].code == 250, "%r" % per)
        log = inst.log()
        check(log.count("lmtp: sieve compiled") == 0,
              "a stored script was parsed: %s" % log[-800:])
        check(loads_of(log) == 2,
              "compiled forms not loaded (main and sub): %s" % log[-800:])
        check(len(inst.messages("user.alice.work")) == 3, "not filed")
        check(all(f & FLAG_FLAGGED for f in flags_of(inst, "user.alice.work")),
              "the included script did not run")

        # changed behind our back: the new text runs, the .bc is rewritten
        before = open(bc, "rb").read()
        time.sleep(0.05)
        inst.script("alice", 'require "fileinto";\nfileinto "INBOX.other";\n')
        per = send(inst, ["alice@test.example"], make_message(msgid()))
        check(per[0].code == 250, "%r" % per)
        check(len(inst.messages("user.alice.other")) == 1,
              "the changed text did not run")
        log = inst.log()
        check("reason=<stale: source changed>" in log,
              "stale compiled form not reported: %s" % log[-800:])
        check(log.count("lmtp: sieve compiled") == 1, "not compiled once")
        after = open(bc, "rb").read()
        check(after != before, "stale compiled form not rewritten")
        _restart(inst)
        inst.mark_log()
        send(inst, ["alice@test.example"], make_message(msgid()))
        check(len(inst.messages("user.alice.other")) == 2, "not filed")
        check("lmtp: sieve compiled" not in inst.new_log() and
              loads_of(inst.new_log()) == 1,
              "the rewritten compiled form was not used: %s"
              % inst.new_log()[-800:])

        # damaged (one bit of the payload): refused, the text runs, repaired
        data = bytearray(after)
        data[len(data) - 3] ^= 0x10
        with open(bc, "wb") as f:
            f.write(data)
        _restart(inst)
        inst.mark_log()
        send(inst, ["alice@test.example"], make_message(msgid()))
        check(len(inst.messages("user.alice.other")) == 3, "not filed")
        new = inst.new_log()
        check("reason=<corrupt: checksum mismatch>" in new and
              new.count("lmtp: sieve compiled") == 1,
              "damaged compiled form not refused: %s" % new[-800:])
        check(open(bc, "rb").read() == after, "damaged form not repaired")
        check(not inst.worker_trouble(), "worker trouble")


def test_compiled_form_alone():
    """A compiled form that names its text file as its source (the
    inode, mtime and size mbtool sieve put saw) is loaded without
    opening the text.  A text whose mtime changed (the same bytes) is
    read once and its compiled form stored again naming it, and then
    read no more.  An edit in place that keeps the size and the mtime
    is not seen (lmtpd(8) says so) until the mtime changes."""
    with SieveInstance("sv-alone", prefork=1, maxchild=1) as inst:
        inst.create("user.alice.aaaa")
        inst.create("user.alice.bbbb")
        d = os.path.join(inst.sievedir, "a", "alice")
        src = inst.path("main.sieve")
        with open(src, "w") as f:
            f.write('require "fileinto";\nfileinto "INBOX.aaaa";\n')
        inst.mbtool("sieve", "put", "alice", "main", src)
        inst.mbtool("sieve", "activate", "alice", "main")
        text = os.path.join(d, "main.script")
        bc = os.path.join(d, "main.bc")
        inst.start()

        def traced_send():
            p, out = _strace(inst, _worker(inst), "openat,open")
            try:
                send(inst, ["alice@test.example"], make_message(msgid()))
            finally:
                lines = _strace_stop(p, out)
            return ([ln for ln in lines if text in ln],
                    [ln for ln in lines if bc in ln])

        opened, bcs = traced_send()
        check(not opened, "the text was opened: %s" % opened)
        check(bcs, "the compiled form was not read")
        check(len(inst.messages("user.alice.aaaa")) == 1, "not filed")

        # the same bytes, a new mtime: read once, the form stored again
        st = os.stat(text)
        before = open(bc, "rb").read()
        os.utime(text, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        _restart(inst)
        inst.mark_log()
        opened, _ = traced_send()
        check(opened, "a text with a new mtime was not read")
        check("lmtp: sieve compiled" not in inst.new_log(),
              "a current compiled form was compiled again")
        check(open(bc, "rb").read() != before,
              "the compiled form was not stored again for its source")
        _restart(inst)
        opened, _ = traced_send()
        check(not opened, "the text was opened again: %s" % opened)
        check(len(inst.messages("user.alice.aaaa")) == 3, "not filed")

        # an edit in place keeping the size and the mtime: not seen
        st = os.stat(text)
        with open(text, "r+") as f:
            f.write('require "fileinto";\nfileinto "INBOX.bbbb";\n')
        os.utime(text, ns=(st.st_atime_ns, st.st_mtime_ns))
        check(os.stat(text).st_size == st.st_size, "size changed")
        send(inst, ["alice@test.example"], make_message(msgid()))
        check(len(inst.messages("user.alice.aaaa")) == 4,
              "the compiled form did not run")
        # its mtime changed: the new text runs
        os.utime(text, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
        send(inst, ["alice@test.example"], make_message(msgid()))
        check(len(inst.messages("user.alice.bbbb")) == 1,
              "the edited text did not run")
        check(not inst.worker_trouble(), "worker trouble")


STRACE = "/usr/bin/strace"


def _worker(inst):
    """The one lmtpd of a prefork=1 maxchild=1 instance."""
    pids = []

    def found():
        pids[:] = [p for p in children_of(inst.proc.pid, False)
                   if "lmtpd" in cmdline(p)]
        return len(pids) == 1
    check(wait_until(found, 30), "no single lmtpd worker: %r" % pids)
    return pids[0]


def _strace(inst, pid, calls):
    """strace -y of pid for calls, attached when this returns."""
    if not os.access(STRACE, os.X_OK):
        raise Skip("%s not installed" % STRACE)
    out = inst.path("strace.%d.%f" % (pid, time.time()))
    p = subprocess.Popen([STRACE, "-qq", "-y", "-s", "300", "-e",
                          "trace=" + calls, "-o", out, "-p", str(pid)],
                         stderr=subprocess.PIPE)

    def attached():
        m = re.search(r"^TracerPid:\s+(\d+)",
                      (proc_read(pid, "status") or b"").decode(), re.M)
        return m is not None and int(m.group(1)) == p.pid
    if not wait_until(lambda: attached() or p.poll() is not None, 60) or \
            p.poll() is not None:
        raise Skip("strace cannot attach: %s"
                   % p.stderr.read().decode(errors="replace"))
    return p, out


def _strace_stop(p, out):
    if p.poll() is None:
        p.terminate()
    p.wait(timeout=60)
    with open(out) as f:
        lines = f.read().splitlines()
    os.unlink(out)
    return lines


def test_cached_lookup():
    """A delivery to a user whose script is cached and unchanged opens
    and reads no script file (one stat through the link) and reads no
    staged file for a message that fits the stage's buffer; a larger
    message is read from the staging file (its body test still sees its
    end).  A renamed active script is logged under its new name."""
    with SieveInstance("sv-lookup", prefork=1, maxchild=1) as inst:
        inst.create("user.alice.work")
        inst.create("user.alice.body")
        inst.script("alice", 'require ["fileinto", "body"];\n'
                    'if body :text :contains "tail-word" '
                    '{ fileinto "INBOX.body"; stop; }\n'
                    'fileinto "INBOX.work";\n')
        inst.start()
        send(inst, ["alice@test.example"], make_message(msgid()))
        pid = _worker(inst)
        p, out = _strace(inst, pid, "openat,open,readlink,mmap,stat,"
                                    "newfstatat")
        try:
            send(inst, ["alice@test.example"],
                 make_message(msgid(), body=b"short\r\ntail-word\r\n"))
        finally:
            lines = _strace_stop(p, out)
        script_d = os.path.join(inst.sievedir, "a", "alice")
        opened = [ln for ln in lines if ("openat(" in ln or "open(" in ln or
                                         "readlink(" in ln) and
                  (script_d in ln or "/stage./" in ln and "O_RDONLY" in ln)]
        check(not opened, "a cached script or the staged message was "
              "opened: %s" % opened)
        check(any("stat" in ln and "defaultbc" in ln for ln in lines),
              "the link was not looked at: %s" % lines[-20:])
        check(len(inst.messages("user.alice.body")) == 1,
              "the body test did not see the message")

        # over the stage's 64 KiB buffer: read from the staging file
        big = b"".join(b"line %06d of a long body\r\n" % i
                       for i in range(4000)) + b"tail-word\r\n"
        check(len(big) > 70000, "message not large")
        send(inst, ["alice@test.example"], make_message(msgid(), body=big))
        check(len(inst.messages("user.alice.body")) == 2,
              "the body test did not see the end of a large message")
        check(len(inst.messages("user.alice.work")) == 1, "not filed")

        # renamed: the same file under a new name (ctime changes)
        d = script_d
        os.rename(os.path.join(d, "main.script"),
                  os.path.join(d, "renamed.script"))
        os.unlink(os.path.join(d, "defaultbc"))
        os.symlink("renamed.script", os.path.join(d, "defaultbc"))
        inst.mark_log()
        send(inst, ["alice@test.example"], make_message(msgid()))
        check("script=<renamed.script>" in inst.new_log(),
              "the new name is not logged: %s" % inst.new_log()[-600:])
        check(len(inst.messages("user.alice.work")) == 2, "not filed")
        check(not inst.worker_trouble(), "worker trouble")


def test_cache_bound():
    """More distinct compiled texts than the cache holds (256): nine
    users whose active scripts (one text) each include 31 scripts of
    their own, 280 texts.  Every execution runs its own scripts (an entry
    of the running execution is never evicted), a second round loads
    again what was evicted (from its stored compiled form), and the worker stays up."""
    users = USERS + ["gina", "hank", "ivan"]
    nincl = 31
    texts = len(users) * nincl + 1
    with SieveInstance("sv-bound", prefork=1, maxchild=1) as inst:
        for u in users[len(USERS):]:
            inst.create("user." + u)
        for u in users:
            inst.create("user.%s.work" % u)
            d = os.path.join(inst.sievedir, u[0], u)
            text = 'require ["include", "fileinto", "imap4flags"];\n'
            for i in range(nincl):
                text += 'include :personal "s%d";\n' % i
            text += 'if hasflag "\\\\Flagged" { fileinto "INBOX.work"; }\n'
            inst.script(u, text)
            for i in range(nincl):
                last = i == nincl - 1
                with open(os.path.join(d, "s%d.script" % i), "w") as f:
                    f.write('require "imap4flags";\n# %s %d\n%s\n'
                            % (u, i, 'addflag "\\\\Flagged";' if last
                               else 'keep;'))
            chown_run_as(d)
            for n in os.listdir(d):
                chown_run_as(os.path.join(d, n))
        inst.start()
        for rnd in (1, 2):
            for u in users:
                per = send(inst, ["%s@test.example" % u],
                           make_message(msgid()))
                check(per[0].code == 250, "%s: %r" % (u, per))
            compiled = inst.log().count("lmtp: sieve compiled")
            if rnd == 1:
                # the active scripts share one text
                check(compiled == texts, "round 1 compiled %d texts, not %d"
                      % (compiled, texts))
        # an evicted text comes back from its stored compiled form
        loaded = loads_of(inst.log())
        check(compiled == texts and loaded > 0,
              "nothing evicted with %d texts (compiled %d, loaded %d)"
              % (texts, compiled, loaded))
        for u in users:
            work = inst.messages("user.%s.work" % u)
            check(len(work) == 2, "%s: %d filed, not 2 (its included "
                  "scripts did not all run)" % (u, len(work)))
            check(all(f & FLAG_FLAGGED for f in
                      flags_of(inst, "user.%s.work" % u)),
                  "%s: the last included script did not run" % u)
        check(not inst.worker_trouble(), "worker trouble")


CRASH_SCRIPTS = {
    "alice": 'require "fileinto";\nfileinto "INBOX.work";\n',
    "bob": 'require "copy";\nredirect :copy "bob@elsewhere.example";\n',
    "carol": 'require "vacation";\nvacation :days 1 "away";\n',
}


def crash_whereabouts(inst, box, tokens):
    """Where the tokens acknowledged for box are instead, as text for a
    failure message: other mailboxes' visible messages, every record of
    box's index (beyond the visible prefix too: pending, or resolved
    behind a pending one), and the master log lines naming them."""
    if not tokens:
        return ""
    out = []
    for other in ("user.alice", "user.alice.work", "user.bob", "user.carol"):
        for uid, p in inst.message_files(other):
            with open(p, "rb") as f:
                data = f.read()
            for t in tokens:
                if re.search(rb"Subject: " + t.encode() + rb"\r\n", data):
                    out.append("%s visible in %s uid %d" % (t, other, uid))
    d = inst.mailbox_dir(box)
    h, records = read_index(d)
    out.append("%s index: num_records=%d visible=%d exists=%d uidnext=%d"
               % (box, h["num_records"], h["visible"], h["exists"],
                  h["uidnext"]))
    for i, rec in enumerate(records):
        try:
            with open(os.path.join(d, "%d." % rec["uid"]), "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        for t in tokens:
            if re.search(rb"Subject: " + t.encode() + rb"\r\n", data):
                out.append("%s in %s record %d uid %d flags=0x%x%s"
                           % (t, box, i, rec["uid"], rec["flags"],
                              "" if i < h["visible"] else
                              " (beyond the visible prefix)"))
    if h["visible"] < len(records):
        out.append("%s records beyond visible: %s" % (box, [
            (i, r["uid"], "0x%x" % r["flags"])
            for i, r in enumerate(records) if i >= h["visible"]][:8]))
    log = inst.log().splitlines()
    for t in tokens:
        out.extend("log: " + line for line in log if t + "@" in line)
    user = box.split(".")[1]
    out.extend("log: " + line for line in log
               if ("user=<%s>" % user in line or "/%s>" % user in line)
               and ("keep implicit" in line or "into INBOX" in line
                    or "error" in line))
    out.extend("log: " + line for line in log
               if "mailbox: recovered" in line)
    return "\n# " + "\n# ".join(out[:60])


def test_crash_during_sieve_deliveries():
    """Workers SIGKILLed while delivering to users with fileinto,
    redirect and vacation scripts: every 250 is in the store, no message
    is partial."""
    with SieveInstance("sv-crash", prefork=2, maxchild=6) as inst:
        inst.ignore_sigkill = True
        inst.create("user.alice.work")
        for u, text in CRASH_SCRIPTS.items():
            inst.script(u, text)
        inst.start(ready=2)
        acked = {}
        lock = threading.Lock()
        stop = threading.Event()
        rcpts = ["alice@test.example", "bob@test.example",
                 "carol@test.example"]
        body = (b"x" * 70 + b"\r\n") * 400

        def client(k):
            i = 0
            while not stop.is_set():
                i += 1
                tok = "crash-%d-%d" % (k, i)
                msg = make_message(tok + "@test.example", subject=tok,
                                   body=body)
                try:
                    with Conn(inst.unix_socket, timeout=30) as c:
                        c.reply()
                        _, rr, dr, per = transaction(
                            c, "s%d@example.net" % k, rcpts, msg,
                            lhlo="crash.example")
                        for r, rep in zip(rcpts, per):
                            if rep.code == 250:
                                with lock:
                                    acked.setdefault(r, set()).add(tok)
                except Exception:   # noqa: BLE001 - the worker was killed
                    pass

        threads = [threading.Thread(target=client, args=(k,))
                   for k in range(3)]
        for t in threads:
            t.start()
        kills = 0
        deadline = time.time() + 60
        while kills < 12 and time.time() < deadline:
            time.sleep(0.15)
            busy = inst.children()
            if busy:
                try:
                    os.kill(busy[kills % len(busy)], signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass
        stop.set()
        for t in threads:
            t.join(60)
        check(kills > 0, "no worker was killed")
        check(sum(len(v) for v in acked.values()) > 0,
              "no delivery was acknowledged at all")
        where = {"alice@test.example": "user.alice.work",
                 "bob@test.example": "user.bob",
                 "carol@test.example": "user.carol"}
        for r, box in where.items():
            # what a reader sees: its look (a shared lock, as SELECT
            # takes) settles what a killed worker left in front of
            # acknowledged appends
            inst.mbtool("info", box)
            stored = set()
            for m in inst.messages(box):   # checks size and SHA-1 too
                mm = re.search(rb"Subject: (crash-\d+-\d+)", m)
                check(mm is not None, "%s: a message without subject" % box)
                stored.add(mm.group(1).decode())
            lost = acked.get(r, set()) - stored
            check(not lost, "%s: acknowledged but not stored: %s%s"
                  % (box, sorted(lost)[:5],
                     crash_whereabouts(inst, box, sorted(lost)[:5])))
        check(wait_until(lambda: inst.status().get("services", {})
                         .get("lmtpunix", {}).get("ready") not in
                         (None, "0"), 30),
              "no lmtpd ready after the kills")


TESTS = [
    test_fileinto_flags_create_discard,
    test_redirect_and_loops,
    test_tests_see_message,
    test_sendmail_timeout,
    test_vacation,
    test_reject_ereject,
    test_three_users_own_scripts,
    test_errors_keep,
    test_duplicatesuppression,
    test_compiled_cache,
    test_compiled_shared,
    test_compiled_probation,
    test_crash_during_sieve_deliveries,
    test_compiled_form,
    test_compiled_form_alone,
    test_cached_lookup,
    test_cache_bound,
]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
