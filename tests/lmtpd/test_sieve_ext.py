#!/usr/bin/env python3
"""test_sieve_ext.py - include (RFC 6609), editheader (RFC 5293) and
special-use (RFC 8579) in users' Sieve scripts at delivery.

A private master with lmtpd and the fake sendmail of
test_sieve_delivery.py.  Checked:

include: :personal scripts from the user's directory, :global ones from
SIEVEDIR/global and from `sieve_globaldir`, `global` variables shared
with the included scripts, `return`, :once, :optional; a missing
include, a loop (mutual, and the active script including itself) and a
chain deeper than the limit are runtime errors: implicit keep and a log
line; a changed included script is compiled again while the active
script, unchanged, is not.

editheader: addheader (first, :last) and deleteheader change the copy
stored for the recipient whose script edited it, the other recipients of
the same transaction get the original (sharing one file, the edited copy
a file of its own); a non-ASCII value is stored as RFC 2047 encoded
words; Received and Auto-Submitted are never deleted nor added; an
edit's place in the script decides which actions see it (fileinto :copy
before, the implicit keep after); a redirect sends the edited header; a
field over the size bound is not added (logged) and the mail is stored.

special-use: fileinto :specialuse files into the user's mailbox with
that use (an autocreated folder, given \\Junk by xlist-junk) even when
the named one exists; without such a mailbox the named one; with
:create the named one is created with the use (mbtool info shows it)
and is then found by its use; neither: INBOX and a log line.  A user
of a virtual domain: scripts from the domain's layout, special-use
within the domain.

Environment: see lmtphelp.py (top_builddir, TEST_TMPDIR, LMTP_TESTS,
LMTP_KEEP).
"""
import email
import email.header
import email.policy
import os
import re
import sys
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import check, chown_run_as  # noqa: E402
from lmtphelp import make_message, run_lmtp_tests  # noqa: E402
from test_sieve_delivery import SieveInstance, msgid, send  # noqa: E402


def put(inst, user, name, text):
    """Store text as user's script NAME (not activated)."""
    d = os.path.join(inst.sievedir, user[0].lower(), user)
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, name + ".script")
    with open(p + ".tmp", "w") as f:
        f.write(text)
    os.rename(p + ".tmp", p)
    return p


def put_global(directory, name, text):
    os.makedirs(directory, exist_ok=True)
    p = os.path.join(directory, name + ".script")
    with open(p + ".tmp", "w") as f:
        f.write(text)
    os.rename(p + ".tmp", p)
    chown_run_as(directory)
    return p


def header_names(raw):
    """The field names of a stored message, top to bottom."""
    head = raw.split(b"\r\n\r\n", 1)[0]
    return [l.split(b":", 1)[0].decode() for l in head.split(b"\r\n")
            if l and l[:1] not in (b" ", b"\t")]


def field(raw, name):
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    return msg.get_all(name) or []


def decoded(value):
    return str(email.header.make_header(email.header.decode_header(value)))


# ---- include ---------------------------------------------------------------

MAIN = r'''require ["include", "variables", "fileinto", "editheader"];
global "box";
set "box" "INBOX";
include :personal "setbox";
include :once :personal "setbox";
include :optional "absent";
include :global "gfile";
fileinto "${box}";
'''

SETBOX = r'''require ["include", "variables", "editheader"];
global "box";
set "box" "INBOX.work";
addheader "X-Once" "included";
'''

GFILE = r'''require ["include", "variables"];
global "box";
if header :contains "subject" "ret" { return; }
set "box" "INBOX.g";
'''


def test_include():
    with SieveInstance("sv-inc", maxchild=1) as inst:
        for box in ("user.alice.work", "user.alice.g", "user.alice.other"):
            inst.create(box)
        gdir = os.path.join(inst.sievedir, "global")
        put_global(gdir, "gfile", GFILE)
        put(inst, "alice", "setbox", SETBOX)
        # the active script is read through its link
        main = os.path.join(os.path.dirname(inst.script("alice", MAIN)),
                            "defaultbc")
        inst.start()
        # the global script sets the box last
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="plain"))
        check(per[0].code == 250, "plain: %r" % per)
        got = inst.messages("user.alice.g")
        check(len(got) == 1, "not filed by the :global include: %r"
              % [len(inst.messages(b)) for b in
                 ("user.alice", "user.alice.work", "user.alice.g")])
        check(field(got[0], "X-Once") == ["included"],
              ":once included twice: %r" % field(got[0], "X-Once"))
        # return leaves the global script before its set
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="ret please"))
        check(per[0].code == 250, "ret: %r" % per)
        check(len(inst.messages("user.alice.work")) == 1,
              "return did not end the included script")
        log = inst.log()
        check(log.count("lmtp: sieve compiled script=<%s>" % main) == 1,
              "active script compiled %d times" %
              log.count("lmtp: sieve compiled script=<%s>" % main))
        # a changed included script is compiled again
        time.sleep(0.05)
        put(inst, "alice", "setbox", SETBOX.replace("INBOX.work",
                                                    "INBOX.other"))
        inst.mark_log()
        per = send(inst, ["alice@test.example"],
                   make_message(msgid(), subject="ret again"))
        check(per[0].code == 250, "changed: %r" % per)
        check(len(inst.messages("user.alice.other")) == 1,
              "the changed included script did not run (cache)")
        new = inst.new_log()
        check("setbox.script> result=<ok>" in new,
              "changed include not compiled again: %s" % new[-600:])
        check("compiled script=<%s>" % main not in new,
              "the unchanged active script was compiled again")

        # a missing include without :optional: runtime error, keep
        put(inst, "alice", "main", 'require "include";\n'
            'include "nothere";\ndiscard;\n')
        inst.mark_log()
        n = len(inst.messages("user.alice"))
        per = send(inst, ["alice@test.example"], make_message(msgid()))
        check(per[0].code == 250 and len(inst.messages("user.alice")) == n + 1,
              "missing include: %r" % per)
        check(re.search(r"sieve runtime error user=<alice> .*not found.*"
                        r"implicit keep", inst.new_log()),
              "no runtime error line for the missing include")


def test_include_loops_and_depth():
    with SieveInstance("sv-incloop", maxchild=1) as inst:
        gdir = inst.path("globalscripts")
        inst.write_imapd_conf({"sievedir": inst.sievedir,
                               "sendmail": inst.path("sendmail"),
                               "sieve_globaldir": gdir})
        put_global(gdir, "gping", 'require "include";\n'
                   'include :personal "pong";\n')
        put(inst, "bob", "ping", 'require "include";\ninclude "pong";\n')
        put(inst, "bob", "pong", 'require ["include", "fileinto"];\n'
            'if header :contains "subject" "global" {\n'
            '  fileinto "INBOX.x";\n} else {\n  include "ping";\n}\n')
        inst.script("bob", 'require ["include", "fileinto"];\n'
                    'include "ping";\ndiscard;\n')
        inst.start()
        per = send(inst, ["bob@test.example"], make_message(msgid()))
        check(per[0].code == 250, "loop: %r" % per)
        check(len(inst.messages("user.bob")) == 1, "loop: no implicit keep")
        check(re.search(r"sieve runtime error user=<bob> .*include loop.*"
                        r"implicit keep", inst.log()),
              "mutual loop not reported as a loop")
        # the active script including itself
        inst.script("bob", 'require "include";\ninclude "main";\n'
                    'discard;\n')
        inst.mark_log()
        per = send(inst, ["bob@test.example"], make_message(msgid()))
        check(per[0].code == 250 and len(inst.messages("user.bob")) == 2,
              "self include: %r" % per)
        check("include loop" in inst.new_log(), "self include not a loop")
        # :global from sieve_globaldir, which includes :personal back
        inst.create("user.bob.x")
        inst.script("bob", 'require "include";\ninclude :global "gping";\n'
                    'discard;\n')
        per = send(inst, ["bob@test.example"],
                   make_message(msgid(), subject="global"))
        check(per[0].code == 250 and len(inst.messages("user.bob.x")) == 1,
              "sieve_globaldir script not used: %r" % per)
        # a chain deeper than 5 levels
        for i in range(7):
            put(inst, "bob", "c%d" % i, 'require "include";\n'
                'include "c%d";\n' % (i + 1))
        put(inst, "bob", "c7", "discard;\n")
        inst.script("bob", 'require "include";\ninclude "c0";\n')
        inst.mark_log()
        n = len(inst.messages("user.bob"))
        per = send(inst, ["bob@test.example"], make_message(msgid()))
        check(per[0].code == 250 and len(inst.messages("user.bob")) == n + 1,
              "deep chain: %r" % per)
        check("deeper than 5 levels" in inst.new_log(),
              "depth limit not reported")


# ---- editheader ------------------------------------------------------------

EDIT = r'''require ["editheader", "index"];
addheader "X-Sieve-Tag" "tagged";
deleteheader :index 2 "X-Dup";
deleteheader :contains "X-Dup" "nomatch";
addheader :last "X-Long" "ääääääääääääääääääääääääääääääääääääääää und €  und €  und €  und €  und €  und €";
addheader :last "X-Note" "Grüße aus München, übermorgen";
deleteheader "X-Remove";
deleteheader "Received";
deleteheader "Auto-Submitted";
addheader "Received" "from nowhere";
'''

ORDER = r'''require ["editheader", "fileinto", "copy"];
fileinto :copy "INBOX.work";
addheader "X-After" "yes";
'''

FWD = r'''require ["editheader"];
addheader "X-Fwd" "edited";
deleteheader "X-Remove";
redirect "elsewhere@example.net";
'''


def test_editheader():
    with SieveInstance("sv-edit") as inst:
        inst.create("user.dave.work")
        inst.script("alice", EDIT)
        inst.script("dave", ORDER)
        inst.script("erin", FWD)
        inst.start()
        msg = make_message(msgid(), subject="edit me",
                           extra_headers=["X-Remove: gone",
                                          "X-Dup: one", "X-Dup: two",
                                          "Auto-Submitted: no"])
        per = send(inst, ["alice@test.example", "bob@test.example",
                          "carol@test.example", "dave@test.example",
                          "erin@test.example"], msg)
        check(all(r.code == 250 for r in per), "replies: %r" % per)
        a = inst.message_files("user.alice")
        b = inst.message_files("user.bob")
        c = inst.message_files("user.carol")
        check(len(a) == len(b) == len(c) == 1, "not stored once each")
        ra, rb = inst.messages("user.alice")[0], inst.messages("user.bob")[0]
        names = header_names(ra)
        check(names[0] == "X-Sieve-Tag", "addheader not first: %r" % names)
        check(names[-2:] == ["X-Long", "X-Note"],
              "addheader :last not last: %r" % names)
        check("X-Remove" not in names, "deleteheader did not delete")
        check(field(ra, "X-Dup") == ["one"], "deleteheader :index 2: %r"
              % field(ra, "X-Dup"))
        check(names.count("Received") == header_names(rb).count("Received")
              and "from nowhere" not in ra.decode("utf-8", "replace"),
              "Received fields changed: %r" % names)
        check(field(ra, "Auto-Submitted") == ["no"],
              "Auto-Submitted deleted: %r" % field(ra, "Auto-Submitted"))
        note = field(ra, "X-Note")
        check(len(note) == 1 and "=?UTF-8?B?" in note[0] and
              decoded(note[0]) == "Grüße aus München, übermorgen",
              "non-ASCII value not RFC 2047 encoded: %r" % note)
        long_ = field(ra, "X-Long")
        check(len(long_) == 1 and
              decoded(long_[0]) == 'ääääääääääääääääääääääääääääääääääääääää und €  und €  und €  und €  und €  und €',
              "long non-ASCII value: %r" % long_)
        check(all(len(l) <= 76 for l in ra.split(b"\r\n\r\n")[0]
                  .split(b"\r\n") if b"=?UTF-8?B?" in l),
              "lines with encoded words longer than 76 (RFC 2047 2)")
        check(all(b < 128 for b in ra.split(b"\r\n\r\n")[0]),
              "8-bit bytes in the edited header")
        check(ra.split(b"\r\n\r\n", 1)[1] == rb.split(b"\r\n\r\n", 1)[1],
              "body changed")
        # the others got the original, as one shared file
        check("X-Sieve-Tag" not in header_names(rb) and
              "X-Remove" in header_names(rb), "bob's copy was edited")
        ino = [os.stat(x[0][1]).st_ino for x in (a, b, c)]
        check(ino[1] == ino[2], "unedited copies are not one instance")
        check(ino[0] != ino[1], "the edited copy shares the original file")
        # an edit applies to the actions after it
        work = inst.messages("user.dave.work")
        kept = inst.messages("user.dave")
        check(len(work) == 1 and len(kept) == 1, "dave: %d %d"
              % (len(work), len(kept)))
        check(not field(work[0], "X-After") and
              field(kept[0], "X-After") == ["yes"],
              "edit order: work %r, keep %r" % (field(work[0], "X-After"),
                                                field(kept[0], "X-After")))
        # the redirect carries the edited header
        sent = inst.sent()
        check(len(sent) == 1, "sendmail calls: %r" % sent)
        body = sent[0][1]
        check(b"X-Fwd: edited" in body and b"X-Remove" not in body and
              b"Subject: edit me" in body,
              "redirected header not edited: %r" % body[:400])
        check(re.search(r'user=<alice> .*addheader "X-Sieve-Tag"', inst.log()),
              "edits not in the log line")

        # bounded: a field over 8 KiB is not added, the mail is stored
        big = "x" * 20000
        inst.script("alice", 'require ["editheader", "variables"];\n'
                    'addheader "X-Big" "%s";\naddheader "X-Small" "s";\n'
                    % " ".join([big[:60]] * 200))
        inst.mark_log()
        per = send(inst, ["alice@test.example"], make_message(msgid()))
        check(per[0].code == 250, "big: %r" % per)
        last = inst.messages("user.alice")[-1]
        check(not field(last, "X-Big") and field(last, "X-Small") == ["s"],
              "big field added or small one lost")
        check("(field too long)" in inst.new_log(), "limit not logged")


# ---- special-use -----------------------------------------------------------

SPECIAL = r'''require ["fileinto", "special-use", "mailbox"];
if header :contains "subject" "junk" {
    fileinto :specialuse "\\Junk" "INBOX.Other";
} elsif header :contains "subject" "archive" {
    fileinto :specialuse "\\Archive" :create "INBOX.Arch";
} elsif header :contains "subject" "drafts" {
    fileinto :specialuse "\\Drafts" "INBOX.Missing";
} elsif header :contains "subject" "findarch" {
    fileinto :specialuse "\\Archive" "INBOX.Other";
} elsif header :contains "subject" "named" {
    fileinto :specialuse "\\Sent" "INBOX.Other";
}
'''


def test_specialuse():
    conf = {"autocreate_quota": "0", "autocreate_inbox_folders": "Spam",
            "xlist-junk": "Spam"}
    with SieveInstance("sv-su", conf=conf) as inst:
        inst.script("gina", SPECIAL)
        inst.start()
        per = send(inst, ["gina@test.example"],
                   make_message(msgid(), subject="junk 1"))
        check(per[0].code == 250, "junk: %r" % per)
        info = inst.mbtool("info", "user.gina.Spam")[1]
        check("specialuse: \\Junk" in info, "autocreate: %s" % info)
        check(len(inst.messages("user.gina.Spam")) == 1,
              "not filed into the \\Junk mailbox")
        # the mailbox of that use wins over the named one
        inst.create("user.gina.Other")
        per = send(inst, ["gina@test.example"],
                   make_message(msgid(), subject="junk 2"))
        check(per[0].code == 250 and
              len(inst.messages("user.gina.Spam")) == 2 and
              len(inst.messages("user.gina.Other")) == 0,
              "named mailbox used although a \\Junk one exists")
        # no mailbox of the use: the named one
        per = send(inst, ["gina@test.example"],
                   make_message(msgid(), subject="named"))
        check(per[0].code == 250 and
              len(inst.messages("user.gina.Other")) == 1,
              "no fallback to the named mailbox")
        # :create makes the named mailbox with the use ...
        per = send(inst, ["gina@test.example"],
                   make_message(msgid(), subject="archive 1"))
        check(per[0].code == 250 and
              len(inst.messages("user.gina.Arch")) == 1, "archive 1")
        info = inst.mbtool("info", "user.gina.Arch")[1]
        check("specialuse: \\Archive" in info,
              ":create without the use: %s" % info)
        # ... which is then found by its use
        per = send(inst, ["gina@test.example"],
                   make_message(msgid(), subject="findarch"))
        check(per[0].code == 250 and
              len(inst.messages("user.gina.Arch")) == 2 and
              len(inst.messages("user.gina.Other")) == 1,
              "created \\Archive mailbox not found by its use")
        # neither: INBOX and a log line
        inst.mark_log()
        n = len(inst.messages("user.gina"))
        per = send(inst, ["gina@test.example"],
                   make_message(msgid(), subject="drafts"))
        check(per[0].code == 250 and
              len(inst.messages("user.gina")) == n + 1, "drafts")
        check("fileinto target missing" in inst.new_log(),
              "missing target not logged")


def test_domain_user():
    """A user of a virtual domain: :personal scripts from the domain's
    script layout, the global directory shared, special-use within the
    domain's mailboxes."""
    conf = {"virtdomains": "userid", "defaultdomain": "test.example"}
    with SieveInstance("sv-dom", conf=conf) as inst:
        inst.create("example.com!user.hank")
        inst.create("user.hank")
        d = os.path.join(inst.sievedir, "domain", "e", "example.com", "h",
                         "hank")
        os.makedirs(d)
        with open(os.path.join(d, "arch.script"), "w") as f:
            f.write('require ["fileinto", "special-use", "mailbox"];\n'
                    'fileinto :specialuse "\\\\Archive" :create '
                    '"INBOX.Arch";\n')
        with open(os.path.join(d, "main.script"), "w") as f:
            f.write('require "include";\ninclude :personal "arch";\n')
        os.symlink("main.script", os.path.join(d, "defaultbc"))
        for root, dirs, files in os.walk(inst.sievedir):
            for n in dirs + files:
                chown_run_as(os.path.join(root, n))
        # the domain-less hank has a folder of the same name
        inst.create("user.hank.Arch")
        inst.start()
        per = send(inst, ["hank@example.com"], make_message(msgid()))
        check(per[0].code == 250, "first: %r" % per)
        info = inst.mbtool("info", "example.com!user.hank.Arch")[1]
        check("specialuse: \\Archive" in info, "not created with the "
              "use: %s" % info)
        # found by its use again; the domain-less namesake never used
        per = send(inst, ["hank@example.com"], make_message(msgid()))
        check(per[0].code == 250 and
              len(inst.messages("example.com!user.hank.Arch")) == 2 and
              len(inst.messages("user.hank.Arch")) == 0,
              "domain user's special-use mailbox")


TESTS = [
    test_include,
    test_include_loops_and_depth,
    test_editheader,
    test_specialuse,
    test_domain_user,
]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
