#!/usr/bin/env python3
"""test_aclquota.py - imapd's ACL (RFC 4314), QUOTA (RFC 9208) and admin
commands end to end under the real master.

One instance (allowplaintext: yes, `admins: admin`, users alice, bob,
admin in a sasldb) and, for identifiers with virtual domains, a second
one with `virtdomains: userid`.  Raw sessions send the RFC's examples and
error cases and check every response against the grammar
(imapgrammar.py); the results are checked with mbtool too.  Two sessions
at once show an ACL change taking effect in a session that has the
mailbox selected.

Environment: see imaphelp.py.
"""
import os
import re
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (ImapInstance, Raw, check, make_message,  # noqa: E402
                      make_sasldb, make_sasldb_extra, run_imap_tests)

ALICE_PW, BOB_PW, ADMIN_PW = "al1ce-pw", "b0b-pw", "adm1n-pw"
CAPS = (b"ACL", b"RIGHTS=kxte", b"QUOTA", b"QUOTA=RES-STORAGE",
        b"QUOTA=RES-MESSAGE", b"QUOTASET")

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("aclquota", conf={"admins": "admin",
                                           "allowplaintext": "yes"},
                         sasl=("alice", ALICE_PW))
        try:
            make_sasldb_extra(i, "bob", BOB_PW)
            make_sasldb_extra(i, "admin", ADMIN_PW)
            i.create("user.alice")
            i.create("user.alice.Shared")
            i.create("user.bob")
            i.create("shared.news", {"anyone": "lr"})
            i.write_cyrus_conf(imaps=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def session(user="alice", pw=ALICE_PW, i=None):
    c = Raw((i or inst()).addr())
    c.line()
    r = c.cmd("L0", "LOGIN %s %s" % (user, pw))
    check(r[-1].startswith(b"L0 OK"), "LOGIN %s: %r" % (user, r))
    return c


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


def no(r, tag, code=None):
    check(r[-1].startswith(tag.encode() + b" NO"), "%s: want NO: %r"
          % (tag, r))
    if code:
        check(b"[" + code.encode() + b"]" in r[-1], "%s: want [%s]: %r"
              % (tag, code, r))
    return r


def bad(r, tag):
    check(r[-1].startswith(tag.encode() + b" BAD"), "%s: want BAD: %r"
          % (tag, r))
    return r


def untagged(r, word):
    return [ln for ln in r if ln.startswith(b"* " + word + b" ")]


def acl_of(i, name):
    """{identifier: rights} of a mailbox as mbtool info shows it."""
    acl = i.info(name).get("acl", "")
    return dict(kv.split("=", 1) for kv in acl.split() if "=" in kv)


def mailbox_list(i):
    _, out, _ = i.mbtool("list")
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


# ---- tests ----------------------------------------------------------------

def test_capabilities():
    c = Raw(inst().addr())
    try:
        greeting = c.line()
        for cap in CAPS:
            check(b" " + cap + b" " in greeting or
                  greeting.endswith(b" " + cap), "greeting lacks %r: %r"
                  % (cap, greeting))
        check(b"RIGHTS=kxten" not in greeting, "n is not a right here")
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        for cap in CAPS:
            check(cap in r[0].split(), "CAPABILITY lacks %r" % cap)
        # before login the ACL/QUOTA commands want a login
        bad(c.cmd("c2", "GETACL INBOX"), "c2")
        bad(c.cmd("c3", "GETQUOTAROOT INBOX"), "c3")
    finally:
        c.close()


def test_acl_owner_commands():
    i = inst()
    c = session()
    try:
        r = ok(c.cmd("a1", "MYRIGHTS INBOX"), "a1")
        check(untagged(r, b"MYRIGHTS") == [b"* MYRIGHTS INBOX "
                                           b"lrswipkxtecda"], "%r" % r)
        r = ok(c.cmd("a2", "GETACL INBOX"), "a2")
        check(untagged(r, b"ACL") == [b"* ACL INBOX alice lrswipkxtecda"],
              "GETACL %r" % r)
        # RFC 4314 3.1 example forms: replace, +, -
        ok(c.cmd("a3", "SETACL INBOX bob lr"), "a3")
        check(acl_of(i, "user.alice").get("bob") == "lr",
              "mbtool: %r" % acl_of(i, "user.alice"))
        ok(c.cmd("a4", 'SETACL INBOX bob "+is"'), "a4")
        ok(c.cmd("a5", "SETACL INBOX bob -l"), "a5")
        r = ok(c.cmd("a6", "GETACL INBOX"), "a6")
        check(untagged(r, b"ACL") == [b"* ACL INBOX alice lrswipkxtecda "
                                      b"bob rsi"], "GETACL %r" % r)
        # obsolete c and d (RFC 4314 2.1.1): c = k x, d = t e
        ok(c.cmd("a7", "SETACL INBOX.Shared bob lrcd"), "a7")
        check(acl_of(i, "user.alice.Shared").get("bob") == "lrkxte",
              "c/d expanded: %r" % acl_of(i, "user.alice.Shared"))
        r = ok(c.cmd("a8", "GETACL INBOX.Shared"), "a8")
        check(b" bob lrkxtecd" in untagged(r, b"ACL")[0], "%r" % r)
        # anyone, in any case; quoted and literal identifiers
        ok(c.cmd("a9", 'SETACL INBOX.Shared "ANYONE" l'), "a9")
        check(acl_of(i, "user.alice.Shared").get("anyone") == "l",
              "anyone: %r" % acl_of(i, "user.alice.Shared"))
        c.send("a10 SETACL INBOX.Shared {5+}\r\ncarol lr\r\n")
        ok(c.until_tagged("a10"), "a10")
        check(acl_of(i, "user.alice.Shared").get("carol") == "lr",
              "literal id: %r" % acl_of(i, "user.alice.Shared"))
        # DELETEACL; SETACL with "" removes too
        ok(c.cmd("a11", "DELETEACL INBOX.Shared carol"), "a11")
        ok(c.cmd("a12", 'SETACL INBOX.Shared anyone ""'), "a12")
        acl = acl_of(i, "user.alice.Shared")
        check("carol" not in acl and "anyone" not in acl, "removed: %r"
              % acl)
        # LISTRIGHTS: no right is tied to an ordinary user
        r = ok(c.cmd("a13", "LISTRIGHTS INBOX bob"), "a13")
        check(untagged(r, b"LISTRIGHTS") == [
            b'* LISTRIGHTS INBOX bob "" l r s w i p k x t e a c d'],
            "LISTRIGHTS %r" % r)
        # an admin's l k x a cannot be taken away
        r = ok(c.cmd("a14", "LISTRIGHTS INBOX admin"), "a14")
        check(untagged(r, b"LISTRIGHTS") == [
            b"* LISTRIGHTS INBOX admin lkxca r s w i p t e d"],
            "LISTRIGHTS admin %r" % r)
        # errors: unknown rights are BAD (RFC 4314 3.1), bad ids NO
        bad(c.cmd("e1", "SETACL INBOX bob lrz"), "e1")
        bad(c.cmd("e2", "SETACL INBOX bob lr0"), "e2")
        bad(c.cmd("e3", "SETACL INBOX bob"), "e3")
        bad(c.cmd("e4", "GETACL"), "e4")
        bad(c.cmd("e5", "MYRIGHTS INBOX extra"), "e5")
        no(c.cmd("e6", 'SETACL INBOX "b\\"x@" l'), "e6")
        no(c.cmd("e7", "SETACL INBOX - l"), "e7")
        no(c.cmd("e8", "GETACL INBOX.Nope"), "e8", "NONEXISTENT")
        check(acl_of(i, "user.alice").get("bob") == "rsi",
              "errors changed nothing: %r" % acl_of(i, "user.alice"))
        ok(c.cmd("n1", "NOOP"), "n1")
        ok(c.cmd("a15", "DELETEACL INBOX bob"), "a15")
        ok(c.cmd("a16", "DELETEACL INBOX.Shared bob"), "a16")
    finally:
        c.close()


def test_acl_permissions():
    i = inst()
    a = session()
    b = session("bob", BOB_PW)
    try:
        # no right at all: the mailbox does not exist for bob
        for tag, cmd in (("p1", "GETACL user.alice"),
                         ("p2", "MYRIGHTS user.alice"),
                         ("p3", "SETACL user.alice bob lrswipkxtea"),
                         ("p4", "LISTRIGHTS user.alice bob"),
                         ("p5", "DELETEACL user.alice alice")):
            no(b.cmd(tag, cmd), tag, "NONEXISTENT")
        # l r: MYRIGHTS works, the a-commands are NOPERM
        ok(a.cmd("p6", "SETACL INBOX bob lr"), "p6")
        r = ok(b.cmd("p7", "MYRIGHTS user.alice"), "p7")
        check(untagged(r, b"MYRIGHTS") == [b"* MYRIGHTS user.alice lr"],
              "%r" % r)
        no(b.cmd("p8", "GETACL user.alice"), "p8", "NOPERM")
        no(b.cmd("p9", "SETACL user.alice bob lrswipkxtea"), "p9", "NOPERM")
        no(b.cmd("p10", "LISTRIGHTS user.alice bob"), "p10", "NOPERM")
        check(acl_of(i, "user.alice").get("bob") == "lr", "unchanged")
        # a: bob may change the ACL
        ok(a.cmd("p11", "SETACL INBOX bob +a"), "p11")
        ok(b.cmd("p12", "SETACL user.alice anyone l"), "p12")
        r = ok(b.cmd("p13", "GETACL user.alice"), "p13")
        check(b" anyone l" in untagged(r, b"ACL")[0], "%r" % r)
        # negative rights (RFC 4314 2.2): -bob takes r away from bob
        ok(a.cmd("p14", "SETACL INBOX -bob r"), "p14")
        r = ok(b.cmd("p15", "MYRIGHTS user.alice"), "p15")
        check(untagged(r, b"MYRIGHTS") == [b"* MYRIGHTS user.alice la"],
              "negative rights: %r" % r)
        no(b.cmd("p16", "SELECT user.alice"), "p16")
        check(acl_of(i, "user.alice").get("-bob") == "r", "mbtool -bob")
        ok(a.cmd("p17", "DELETEACL INBOX -bob"), "p17")
        ok(a.cmd("p18", "DELETEACL INBOX bob"), "p18")
        ok(a.cmd("p19", "DELETEACL INBOX anyone"), "p19")
        no(b.cmd("p20", "MYRIGHTS user.alice"), "p20", "NONEXISTENT")
    finally:
        a.close()
        b.close()
    # an admin changes anyone's ACL
    m = session("admin", ADMIN_PW)
    try:
        r = ok(m.cmd("p21", "MYRIGHTS user.bob"), "p21")
        check(untagged(r, b"MYRIGHTS") == [b"* MYRIGHTS user.bob lkxca"],
              "admin's own rights: %r" % r)
        ok(m.cmd("p22", "SETACL user.bob alice lr"), "p22")
        check(acl_of(i, "user.bob").get("alice") == "lr", "admin SETACL")
        ok(m.cmd("p23", "DELETEACL user.bob alice"), "p23")
        # an 8-bit identifier mbtool stored comes back as a literal
        i.mbtool("setacl", "user.bob", "j\u00f6rg", "lr")
        r = m.lcmd("p24", "GETACL user.bob")
        check(r[-1].startswith(b"p24 OK") and
              b' {5}\r\nj\xc3\xb6rg lr' in r[0], "GETACL %r" % r)
        i.mbtool("setacl", "user.bob", "j\u00f6rg", "none")
    finally:
        m.close()


def test_acl_change_seen_by_selected_session():
    i = inst()
    for n in range(2):
        i.mbtool("deliver", "-M", "user.alice.Shared",
                 input=make_message(msgid="acl%d@test" % n))
    a = session()
    b = session("bob", BOB_PW)
    try:
        ok(a.cmd("s1", "SETACL INBOX.Shared bob lrs"), "s1")
        ok(b.cmd("s2", "SELECT user.alice.Shared"), "s2")
        # without w bob may not set \Flagged
        no(b.cmd("s3", "STORE 1 +FLAGS (\\Flagged)"), "s3", "NOPERM")
        r = ok(b.cmd("s4", "FETCH 1 FLAGS"), "s4")
        check(b"\\Flagged" not in r[0], "flagged without w: %r" % r)
        # alice grants w: bob's next STORE has it, no reselect
        ok(a.cmd("s5", "SETACL INBOX.Shared bob +w"), "s5")
        r = ok(b.cmd("s6", "STORE 1 +FLAGS (\\Flagged)"), "s6")
        check(b"\\Flagged" in r[0], "w granted while selected: %r" % r)
        # alice takes r away: even a NOOP finds the mailbox closed (no
        # more news of a mailbox bob may not read)
        ok(a.cmd("s7", "SETACL INBOX.Shared bob -r"), "s7")
        i.mbtool("deliver", "-M", "user.alice.Shared",
                 input=make_message(msgid="acl-late@test"))
        r = ok(b.cmd("s7b", "NOOP"), "s7b")
        check(any(ln.startswith(b"* OK [CLOSED]") for ln in r) and
              not untagged(r, b"3"), "NOOP after losing r: %r" % r)
        bad(b.cmd("s7c", "FETCH 1 FLAGS"), "s7c")    # no mailbox selected
        # again, now with a command of the selected state
        ok(a.cmd("s7d", "SETACL INBOX.Shared bob +r"), "s7d")
        ok(b.cmd("s7e", "SELECT user.alice.Shared"), "s7e")
        ok(a.cmd("s7f", "SETACL INBOX.Shared bob -r"), "s7f")
        r = no(b.cmd("s8", "FETCH 1:* FLAGS"), "s8", "NOPERM")
        check(any(ln.startswith(b"* OK [CLOSED]") for ln in r),
              "no CLOSED: %r" % r)
        check(not untagged(r, b"1"), "a FETCH after losing r: %r" % r)
        bad(b.cmd("s9", "FETCH 1 FLAGS"), "s9")    # no mailbox selected
        ok(b.cmd("s10", "NOOP"), "s10")
        no(b.cmd("s11", "SELECT user.alice.Shared"), "s11")
        # in IDLE: the next change of the mailbox finds the right gone and
        # closes the mailbox instead of reporting the new message
        ok(a.cmd("s12", "SETACL INBOX.Shared bob +r"), "s12")
        ok(b.cmd("s13", "SELECT user.alice.Shared"), "s13")
        b.send("s14 IDLE\r\n")
        check(b.line().startswith(b"+ "), "IDLE continuation")
        ok(a.cmd("s15", "SETACL INBOX.Shared bob -r"), "s15")
        i.mbtool("deliver", "-M", "user.alice.Shared",
                 input=make_message(msgid="acl-idle@test"))
        first = b.line()
        check(first.startswith(b"* OK [CLOSED]"), "IDLE after losing r: "
              "%r" % first)
        b.send("DONE\r\n")
        r = ok(b.until_tagged("s14"), "s14")
        check(not [ln for ln in r if b"EXISTS" in ln], "EXISTS leaked %r"
              % r)
        ok(a.cmd("s16", "DELETEACL INBOX.Shared bob"), "s16")
    finally:
        a.close()
        b.close()


def quota_show(i, root):
    rc, out, err = i.mbtool("quota", "show", root, check_rc=False)
    return rc, out.strip()


def test_quota():
    i = inst()
    for n in range(3):
        i.mbtool("deliver", "-M", "user.bob",
                 input=make_message(msgid="q%d@test" % n, body="x" * 3000))
    m = session("admin", ADMIN_PW)
    b = session("bob", BOB_PW)
    try:
        # RFC 9208 examples; usage counted from the mailboxes already there
        r = ok(m.cmd("q1", "SETQUOTA user.bob (STORAGE 512 MESSAGE 4)"), "q1")
        q = untagged(r, b"QUOTA")
        check(len(q) == 1 and re.match(
            rb'^\* QUOTA "user\.bob" \(STORAGE (\d+) 512 MESSAGE 3 4\)$',
            q[0]), "SETQUOTA answer %r" % r)
        kib = int(re.search(rb"STORAGE (\d+)", q[0]).group(1))
        check(8 <= kib <= 12, "usage of 3 x 3 KB: %d KiB" % kib)
        # an admin (l k x a, no r) reads any mailbox's quota root
        r = ok(m.cmd("q1b", "GETQUOTAROOT user.bob"), "q1b")
        check(untagged(r, b"QUOTAROOT") == [b'* QUOTAROOT "user.bob" '
                                            b'"user.bob"'], "%r" % r)
        rc, out = quota_show(i, "user.bob")
        check(rc == 0 and "/512 KiB" in out and "messages=3/4" in out,
              "mbtool quota show: %r" % out)
        r = ok(b.cmd("q2", "GETQUOTAROOT INBOX"), "q2")
        check(untagged(r, b"QUOTAROOT") == [b'* QUOTAROOT "INBOX" "INBOX"'],
              "QUOTAROOT %r" % r)
        check(untagged(r, b"QUOTA") == [
            b'* QUOTA "INBOX" (STORAGE %d 512 MESSAGE 3 4)' % kib],
            "QUOTA %r" % r)
        r = ok(b.cmd("q3", "GETQUOTA INBOX"), "q3")
        check(len(untagged(r, b"QUOTA")) == 1, "%r" % r)
        # the message limit is enforced: one more fits, then OVERQUOTA
        msg = make_message(msgid="q-app@test")
        b.send("q4 APPEND INBOX {%d+}\r\n" % len(msg) + msg.decode()
               + "\r\n")
        ok(b.until_tagged("q4"), "q4")
        b.send("q5 APPEND INBOX {%d+}\r\n" % len(msg) + msg.decode()
               + "\r\n")
        no(b.until_tagged("q5"), "q5", "OVERQUOTA")
        # STATUS DELETED and DELETED-STORAGE (RFC 9208 4.2, KiB)
        ok(b.cmd("q5b", "SELECT INBOX"), "q5b")
        r = ok(b.cmd("q5c", "STATUS INBOX (DELETED DELETED-STORAGE)"), "q5c")
        check(untagged(r, b"STATUS") == [b'* STATUS "INBOX" (DELETED 0 '
                                         b'DELETED-STORAGE 0)'], "%r" % r)
        ok(b.cmd("q5d", "STORE 1:2 +FLAGS.SILENT (\\Deleted)"), "q5d")
        r = ok(b.cmd("q5e", "STATUS INBOX (MESSAGES DELETED "
                            "DELETED-STORAGE)"), "q5e")
        m2 = re.match(rb'^\* STATUS "INBOX" \(MESSAGES 4 DELETED 2 '
                      rb'DELETED-STORAGE (\d+)\)$',
                      untagged(r, b"STATUS")[0])
        check(m2 and 5 <= int(m2.group(1)) <= 7, "STATUS %r" % r)
        ok(b.cmd("q5f", "STORE 1:2 -FLAGS.SILENT (\\Deleted)"), "q5f")
        ok(b.cmd("q5g", "UNSELECT"), "q5g")
        # only a resource with a limit is listed
        r = ok(m.cmd("q6", "SETQUOTA user.bob (storage 100)"), "q6")
        check(re.match(rb'^\* QUOTA "user\.bob" \(STORAGE \d+ 100\)$',
                       untagged(r, b"QUOTA")[0]), "%r" % r)
        # users may not set quotas, nor read others'
        no(b.cmd("q7", "SETQUOTA INBOX (STORAGE 99999)"), "q7", "NOPERM")
        a = session()
        try:
            no(a.cmd("q8", "GETQUOTA user.bob"), "q8", "NONEXISTENT")
            no(a.cmd("q9", "GETQUOTAROOT user.bob"), "q9", "NONEXISTENT")
            r = ok(a.cmd("q10", "GETQUOTAROOT INBOX"), "q10")
            check(untagged(r, b"QUOTAROOT") == [b'* QUOTAROOT "INBOX"'] and
                  not untagged(r, b"QUOTA"), "no root: %r" % r)
        finally:
            a.close()
        # errors
        no(m.cmd("e1", "SETQUOTA user.bob (FOO 1)"), "e1", "CANNOT")
        bad(m.cmd("e2", "SETQUOTA user.bob (STORAGE x)"), "e2")
        bad(m.cmd("e3", "SETQUOTA user.bob (STORAGE)"), "e3")
        bad(m.cmd("e4", "SETQUOTA user.bob STORAGE 1"), "e4")
        bad(m.cmd("e5", "SETQUOTA user.bob (STORAGE 1 STORAGE 2)"), "e5")
        bad(m.cmd("e6", "SETQUOTA user.bob (STORAGE 99999999999999999999)"),
            "e6")
        no(m.cmd("e7", "SETQUOTA user.nobody (STORAGE 1)"), "e7",
           "NONEXISTENT")
        no(m.cmd("e8", "GETQUOTA user.alice"), "e8", "NONEXISTENT")
        rc, out = quota_show(i, "user.bob")
        check("/100 KiB" in out and "messages=4 (no limit)" in out,
              "errors changed nothing: %r" % out)
        # "()" removes the root (cyradm "setquota MAILBOX none")
        ok(m.cmd("q11", "SETQUOTA user.bob ()"), "q11")
        rc, out = quota_show(i, "user.bob")
        check(rc != 0, "root still there: %r" % out)
        no(m.cmd("q12", "GETQUOTA user.bob"), "q12", "NONEXISTENT")
    finally:
        m.close()
        b.close()


def test_admin_user_lifecycle():
    i = inst()
    m = session("admin", ADMIN_PW)
    try:
        ok(m.cmd("u1", "CREATE user.carol"), "u1")
        check(acl_of(i, "user.carol").get("carol") == "lrswipkxtea",
              "owner rights %r" % acl_of(i, "user.carol"))
        ok(m.cmd("u2", "CREATE user.carol.Sub"), "u2")
        ok(m.cmd("u3", "CREATE user.carol.Sub.Deep"), "u3")
        ok(m.cmd("u4", "RENAME user.carol.Sub user.carol.Moved"), "u4")
        names = mailbox_list(i)
        check("user.carol.Moved.Deep" in names and
              "user.carol.Sub" not in names, "after RENAME %r" % names)
        ok(m.cmd("u5", "SETQUOTA user.carol (STORAGE 1000)"), "u5")
        # deleting a user's INBOX deletes the user
        ok(m.cmd("u6", "DELETE user.carol"), "u6")
        names = mailbox_list(i)
        check(not [n for n in names if n.startswith("user.carol")],
              "carol's tree left: %r" % names)
        rc, out = quota_show(i, "user.carol")
        check(rc != 0, "quota root left: %r" % out)
        no(m.cmd("u7", "DELETE user.carol"), "u7", "NONEXISTENT")
        # renaming a user's INBOX renames the user, quota root included
        ok(m.cmd("r1", "CREATE user.dan"), "r1")
        ok(m.cmd("r2", "CREATE user.dan.Sub"), "r2")
        i.mbtool("deliver", "-M", "user.dan",
                 input=make_message(msgid="dan@test"))
        ok(m.cmd("r3", "SETQUOTA user.dan (MESSAGE 50)"), "r3")
        no(m.cmd("r4", "RENAME user.dan shared.dan"), "r4", "CANNOT")
        ok(m.cmd("r5", "RENAME user.dan user.eve"), "r5")
        names = mailbox_list(i)
        check("user.eve" in names and "user.eve.Sub" in names and
              not [n for n in names if n.startswith("user.dan")],
              "user rename: %r" % names)
        rc, out = quota_show(i, "user.eve")
        check(rc == 0 and "messages=1/50" in out, "quota moved: %r" % out)
        rc, out = quota_show(i, "user.dan")
        check(rc != 0, "old root left: %r" % out)
        ok(m.cmd("r6", "DELETE user.eve"), "r6")
        # a subfolder alone is deleted alone
        ok(m.cmd("u8", "CREATE user.bob.Keep"), "u8")
        ok(m.cmd("u9", "CREATE user.bob.Gone"), "u9")
        ok(m.cmd("u10", "DELETE user.bob.Gone"), "u10")
        names = mailbox_list(i)
        check("user.bob" in names and "user.bob.Keep" in names and
              "user.bob.Gone" not in names, "%r" % names)
    finally:
        m.close()
    # a user with x on another user's INBOX does not delete the user
    b = session("bob", BOB_PW)
    try:
        no(b.cmd("u11", "DELETE user.alice"), "u11", "NONEXISTENT")
    finally:
        b.close()


def test_vdomain_identifiers():
    conf = {"virtdomains": "userid", "admins": "admin",
            "allowplaintext": "yes"}
    with ImapInstance("aclquota-vd", conf=conf,
                      sasl=("admin", ADMIN_PW)) as i:
        make_sasldb(i.sasldb, "erin", "erin-pw", ["example.com"])
        i.create("example.com!user.erin")
        i.write_cyrus_conf(imaps=False, lmtp=False)
        i.start()
        m = session("admin", ADMIN_PW, i=i)
        e = None
        try:
            ok(m.cmd("v1", 'CREATE "user.dave@example.com"'), "v1")
            check("example.com!user.dave" in mailbox_list(i), "created")
            check(acl_of(i, "example.com!user.dave").get(
                "dave@example.com") == "lrswipkxtea", "owner id in full")
            # a bare identifier on a domain's mailbox is that domain's user
            ok(m.cmd("v2", 'SETACL "user.dave@example.com" erin lr'), "v2")
            check(acl_of(i, "example.com!user.dave").get(
                "erin@example.com") == "lr", "%r" % acl_of(
                i, "example.com!user.dave"))
            r = ok(m.cmd("v3", 'GETACL "user.dave@example.com"'), "v3")
            check(untagged(r, b"ACL") == [
                b"* ACL user.dave@example.com dave@example.com "
                b"lrswipkxtecda erin@example.com lr"], "%r" % r)
            e = session("erin@example.com", "erin-pw", i=i)
            r = ok(e.cmd("v4", "MYRIGHTS user.dave"), "v4")
            check(untagged(r, b"MYRIGHTS") == [b"* MYRIGHTS user.dave lr"],
                  "%r" % r)
            ok(m.cmd("v5", 'SETQUOTA "user.dave@example.com" (MESSAGE 5)'),
               "v5")
            r = ok(m.cmd("v6", 'GETQUOTA "user.dave@example.com"'), "v6")
            check(untagged(r, b"QUOTA") == [
                b'* QUOTA "user.dave@example.com" (MESSAGE 0 5)'], "%r" % r)
            ok(m.cmd("v7", 'DELETE "user.dave@example.com"'), "v7")
            check("example.com!user.dave" not in mailbox_list(i), "deleted")
            rc, out = quota_show(i, "example.com!user.dave")
            check(rc != 0, "quota root left %r" % out)
        finally:
            m.close()
            if e:
                e.close()


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_capabilities,
        test_acl_owner_commands,
        test_acl_permissions,
        test_acl_change_seen_by_selected_session,
        test_quota,
        test_admin_user_lifecycle,
        test_vdomain_identifiers,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
