#!/usr/bin/env python3
"""test_imaplist.py - LIST-EXTENDED (RFC 5258), LIST-STATUS (RFC 5819),
SPECIAL-USE and CREATE-SPECIAL-USE (RFC 6154), STATUS=SIZE (RFC 8438)
and the INBOX autocreation (autocreate_* and xlist-* keys) end to end.

One master-run instance (imaphelp.py) with `unixhierarchysep: yes`, so
that names read as in RFC 5258's examples ("/"), and
`autocreate_quota: 0` with `autocreate_inbox_folders:
Sent|Drafts|Trash|Junk|Archive` and the xlist-* keys naming them.
Users: alice holds RFC 5258's fruit-and-vegetable hierarchy below her
INBOX, dave the hierarchy of its RECURSIVEMATCH example ("*2"), bob may
read one of alice's folders, carol has no INBOX until her first login.
Every response line read by the raw client is checked against the
grammar (imapgrammar.py, extended for these responses); imaplib and
curl are the other clients.

Environment: see imaphelp.py.
"""
import os
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, Conn, ImapInstance, Raw,  # noqa: E402
                      check, make_message, make_sasldb_extra,
                      run_imap_tests, tls_context, transaction)
from testlib import Skip  # noqa: E402

ALICE, ALICE_PW = "alice", "al1ce-pw"
BOB, BOB_PW = "bob", "b0b-pw"
CAROL, CAROL_PW = "carol", "c4rol-pw"
DAVE, DAVE_PW = "dave", "d4ve-pw"
ERIN, ERIN_PW = "erin", "er1n-pw"
CURL = shutil.which("curl") or "/usr/bin/curl"

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("imaplist", conf={
            "unixhierarchysep": "yes",
            "autocreate_quota": "0",
            "autocreate_users": "carol dave erin",
            "autocreate_inbox_folders": "Sent|Drafts|Trash|Junk|Archive",
            "xlist-sent": "Sent", "xlist-drafts": "Drafts",
            "xlist-trash": "Trash", "xlist-junk": "Junk",
            "xlist-archive": "Archive"},
            tls=True, sasl=(ALICE, ALICE_PW))
        try:
            for u, pw in ((BOB, BOB_PW), (CAROL, CAROL_PW), (DAVE, DAVE_PW),
                          (ERIN, ERIN_PW)):
                make_sasldb_extra(i, u, pw)
            for n in ("", ".Fruit", ".Fruit.Apple", ".Fruit.Banana",
                      ".Tofu", ".Vegetable", ".Vegetable.Broccoli",
                      ".Vegetable.Corn"):
                i.create("user.alice" + n)
            # dave's INBOX exists, so autocreate leaves him alone
            for n in ("", ".Foo2", ".Foo2.Bar1", ".Foo2.Bar2", ".Baz2",
                      ".Baz2.Bar2", ".Baz2.Bar22", ".Baz2.Bar222", ".Eps2",
                      ".Eps2.Mes3", ".Qux2.Bar2"):
                i.create("user.dave" + n)
            i.create("user.bob")
            i.write_cyrus_conf(imaps=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def raw_login(user, pw):
    c = Raw(inst().addr())
    c.line()
    c.starttls()
    r = c.cmd("l1", "LOGIN %s %s" % (user, pw))
    check(r[-1].startswith(b"l1 OK"), "LOGIN %s: %r" % (user, r))
    return c


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


RE_LINE = re.compile(rb'^\* (LIST|LSUB) \(([^)]*)\) "/" "((?:[^"\\]|\\.)*)"'
                     rb'(?: (.*))?$')


def lines_of(r, what="LIST"):
    """[(name, set(attrs), extdata or None)] of the LIST/LSUB lines."""
    out = []
    for ln in r:
        if not ln.startswith(b"* " + what.encode() + b" "):
            continue
        m = RE_LINE.match(ln)
        check(m is not None, "unexpected %s line %r" % (what, ln))
        out.append((m.group(3).decode(),
                    set(m.group(2).decode().split()),
                    m.group(4).decode() if m.group(4) else None))
    return out


def as_dict(r, what="LIST"):
    return {n: (a, x) for n, a, x in lines_of(r, what)}


def expect(r, want, what="LIST"):
    """want: {name: (attrs set, extdata or None)}; exactly these lines."""
    got = as_dict(r, what)
    check(len(lines_of(r, what)) == len(got), "a name twice: %r" % r)
    check(got == want, "%s:\n got  %r\n want %r" % (what, got, want))


CI = '("CHILDINFO" ("SUBSCRIBED"))'


# ---- tests ----------------------------------------------------------------

def test_capabilities():
    c = raw_login(ALICE, ALICE_PW)
    try:
        caps = ok(c.cmd("a1", "CAPABILITY"), "a1")[0].split()
        for cap in (b"LIST-EXTENDED", b"LIST-STATUS", b"SPECIAL-USE",
                    b"CREATE-SPECIAL-USE", b"STATUS=SIZE", b"CHILDREN"):
            check(cap in caps, "%r not advertised: %r" % (cap, caps))
        # LIST-MYRIGHTS (RFC 8440) needs ACL (RFC 4314): both or neither
        check((b"LIST-MYRIGHTS" in caps) == (b"ACL" in caps),
              "LIST-MYRIGHTS without ACL or the reverse: %r" % caps)
    finally:
        c.close()


def test_rfc5258_examples():
    """RFC 5258 section 5's examples 2, 3, 5 and 6, on alice's INBOX."""
    c = raw_login(ALICE, ALICE_PW)
    try:
        for n in ("INBOX", "INBOX/Fruit/Banana", "INBOX/Fruit/Peach",
                  "INBOX/Vegetable", "INBOX/Vegetable/Broccoli"):
            ok(c.cmd("s", "SUBSCRIBE %s" % n), "s")
        # example 2: the subscribed names, \NonExistent for Peach
        r = ok(c.cmd("A02", 'LIST (SUBSCRIBED) "" "INBOX/*"'), "A02")
        expect(r, {
            "INBOX/Fruit/Banana": ({"\\Subscribed", "\\HasNoChildren"},
                                   None),
            "INBOX/Fruit/Peach": ({"\\Subscribed", "\\NonExistent"}, None),
            "INBOX/Vegetable": ({"\\Subscribed", "\\HasChildren"}, None),
            "INBOX/Vegetable/Broccoli": ({"\\Subscribed",
                                          "\\HasNoChildren"}, None)})
        # example 3: RETURN (CHILDREN), no subscription state
        r = ok(c.cmd("A03", 'LIST () "" "INBOX/%" RETURN (CHILDREN)'),
               "A03")
        expect(r, {"INBOX/Fruit": ({"\\HasChildren"}, None),
                   "INBOX/Tofu": ({"\\HasNoChildren"}, None),
                   "INBOX/Vegetable": ({"\\HasChildren"}, None)})
        # RETURN (SUBSCRIBED) on a plain selection
        r = ok(c.cmd("A04", 'LIST "" "INBOX/%" RETURN (SUBSCRIBED)'), "A04")
        expect(r, {"INBOX/Fruit": ({"\\HasChildren"}, None),
                   "INBOX/Tofu": ({"\\HasNoChildren"}, None),
                   "INBOX/Vegetable": ({"\\HasChildren", "\\Subscribed"},
                                       None)})
        # example 5: RECURSIVEMATCH, CHILDINFO on the parents
        r = ok(c.cmd("A05", 'LIST (SUBSCRIBED RECURSIVEMATCH) "" "INBOX/%" '
                            'RETURN (CHILDREN)'), "A05")
        expect(r, {"INBOX/Fruit": ({"\\HasChildren"}, CI),
                   "INBOX/Vegetable": ({"\\Subscribed", "\\HasChildren"},
                                       CI)})
        # example 6: without RECURSIVEMATCH, '%' gives only what is
        # subscribed itself
        r = ok(c.cmd("A06", 'LIST (SUBSCRIBED) "" "INBOX/%"'), "A06")
        expect(r, {"INBOX/Vegetable": ({"\\Subscribed", "\\HasChildren"},
                                       None)})
        # REMOTE changes nothing here (no remote mailboxes)
        r1 = ok(c.cmd("A07", 'LIST (REMOTE) "" "INBOX/*"'), "A07")
        r2 = ok(c.cmd("A08", 'LIST () "" "INBOX/*"'), "A08")
        check(r1[:-1] == r2[:-1], "REMOTE %r vs %r" % (r1, r2))
        for n in ("INBOX", "INBOX/Fruit/Banana", "INBOX/Fruit/Peach",
                  "INBOX/Vegetable", "INBOX/Vegetable/Broccoli"):
            ok(c.cmd("u", "UNSUBSCRIBE %s" % n), "u")
    finally:
        c.close()


def test_rfc5258_recursivematch_star2():
    """RFC 5258 section 5's RECURSIVEMATCH example with "*2": a parent is
    listed with CHILDINFO only for a selected child no pattern matches."""
    c = raw_login(DAVE, DAVE_PW)
    try:
        for n in ("Foo2/Bar1", "Foo2/Bar2", "Baz2/Bar2", "Baz2/Bar22",
                  "Baz2/Bar222", "Eps2", "Eps2/Mes3", "Qux2/Bar2"):
            ok(c.cmd("s", "SUBSCRIBE INBOX/%s" % n), "s")
        r = ok(c.cmd("D03", 'LIST (RECURSIVEMATCH SUBSCRIBED) "INBOX/" '
                            '"*2"'), "D03")
        expect(r, {
            "INBOX/Foo2": ({"\\HasChildren"}, CI),
            "INBOX/Foo2/Bar2": ({"\\Subscribed", "\\HasNoChildren"}, None),
            "INBOX/Baz2/Bar2": ({"\\Subscribed", "\\HasNoChildren"}, None),
            "INBOX/Baz2/Bar22": ({"\\Subscribed", "\\HasNoChildren"}, None),
            "INBOX/Baz2/Bar222": ({"\\Subscribed", "\\HasNoChildren"},
                                  None),
            "INBOX/Eps2": ({"\\Subscribed", "\\HasChildren"}, CI),
            "INBOX/Qux2/Bar2": ({"\\Subscribed", "\\HasNoChildren"}, None)})
        # the order is the hierarchy's: every parent before its children
        names = [n for n, _, _ in lines_of(r)]
        check(names == sorted(names, key=lambda s: s.replace("/", "\x01")),
              "order %r" % names)
        # a level that is no mailbox: \NonExistent in the extended form,
        # \Noselect in RFC 3501's
        r = ok(c.cmd("D04", 'LIST () "" "INBOX/Q%"'), "D04")
        expect(r, {"INBOX/Qux2": ({"\\NonExistent", "\\HasChildren"},
                                  None)})
        r = ok(c.cmd("D05", 'LIST "" "INBOX/Q%"'), "D05")
        expect(r, {"INBOX/Qux2": ({"\\Noselect", "\\HasChildren"}, None)})
    finally:
        c.close()


def test_multiple_patterns():
    c = raw_login(ALICE, ALICE_PW)
    try:
        r = ok(c.cmd("m1", 'LIST "" ("INBOX" "INBOX/Fruit/%")'), "m1")
        expect(r, {"INBOX": ({"\\HasChildren"}, None),
                   "INBOX/Fruit/Apple": ({"\\HasNoChildren"}, None),
                   "INBOX/Fruit/Banana": ({"\\HasNoChildren"}, None)})
        # a mailbox matched by two patterns is listed once
        r = ok(c.cmd("m2", 'LIST "" ("INBOX/Fruit" "INBOX/F*" inbox/tofu)'),
               "m2")
        expect(r, {"INBOX/Fruit": ({"\\HasChildren"}, None),
                   "INBOX/Fruit/Apple": ({"\\HasNoChildren"}, None),
                   "INBOX/Fruit/Banana": ({"\\HasNoChildren"}, None)})
        # the reference goes before each pattern
        r = ok(c.cmd("m3", 'LIST "INBOX/" ("Tofu" "Vegetable")'), "m3")
        check(set(as_dict(r)) == {"INBOX/Tofu", "INBOX/Vegetable"},
              "reference + patterns %r" % r)
        # the root with an empty pattern, also in the extended form
        r = ok(c.cmd("m4", 'LIST () "" ""'), "m4")
        check(r[0] == b'* LIST (\\Noselect) "/" ""', "root %r" % r)
    finally:
        c.close()


def test_bad_list_forms():
    c = raw_login(ALICE, ALICE_PW)
    try:
        for tag, cmd in (
                ("b1", 'LIST (RECURSIVEMATCH) "" "*"'),
                ("b2", 'LIST (SPECIAL-USE RECURSIVEMATCH) "" "*"'),
                ("b3", 'LIST (BOGUS) "" "*"'),
                ("b4", 'LIST "" "*" RETURN (BOGUS)'),
                ("b6", 'LIST "" ()'),
                ("b7", 'LIST "" "*" RETURN (STATUS (FOO))'),
                ("b8", 'CREATE INBOX/x (USE (Sent))'),
                ("b9", 'CREATE INBOX/x (FOO (\\Sent))')):
            r = c.cmd(tag, cmd)
            check(r[-1].startswith(tag.encode() + b" BAD"), "%s: %r"
                  % (cmd, r))
        ok(c.cmd("n1", "NOOP"), "n1")
    finally:
        c.close()


def test_create_special_use():
    c = raw_login(ALICE, ALICE_PW)
    try:
        ok(c.cmd("c1", "CREATE INBOX/Sent (USE (\\Sent))"), "c1")
        # case-insensitive, stored once, canonical spelling
        ok(c.cmd("c2", "CREATE INBOX/Old (USE (\\archive \\Archive))"),
           "c2")
        r = c.cmd("c3", "CREATE INBOX/x (USE (\\Bogus))")
        check(r[-1].startswith(b"c3 NO [USEATTR]"), "unknown use %r" % r)
        r = c.cmd("c4", "CREATE INBOX/y (USE (\\Sent \\Bogus))")
        check(r[-1].startswith(b"c4 NO [USEATTR]"), "unknown use %r" % r)
        r = c.cmd("c5", "CREATE shared/z (USE (\\Sent))")
        check(r[-1].startswith(b"c5 NO [USEATTR]"), "not own %r" % r)
        ok(c.cmd("c6", "CREATE INBOX/Plain (USE ())"), "c6")
        r = ok(c.cmd("l1", 'LIST "" "INBOX/%"'), "l1")
        d = as_dict(r)
        check(d["INBOX/Sent"] == ({"\\HasNoChildren", "\\Sent"}, None),
              "Sent %r" % r)
        check(d["INBOX/Old"] == ({"\\HasNoChildren", "\\Archive"}, None),
              "Old %r" % r)
        check(d["INBOX/Plain"] == ({"\\HasNoChildren"}, None),
              "Plain %r" % r)
        check("INBOX/x" not in d and "INBOX/y" not in d, "refused %r" % r)
        # the SPECIAL-USE selection option and return option
        r = ok(c.cmd("l2", 'LIST (SPECIAL-USE) "" "*"'), "l2")
        expect(r, {"INBOX/Sent": ({"\\HasNoChildren", "\\Sent"}, None),
                   "INBOX/Old": ({"\\HasNoChildren", "\\Archive"}, None)})
        r = ok(c.cmd("l3", 'LIST "" "INBOX/Sent" RETURN (SPECIAL-USE)'),
               "l3")
        expect(r, {"INBOX/Sent": ({"\\HasNoChildren", "\\Sent"}, None)})
        # LSUB shows them too (Outlook reads them there)
        ok(c.cmd("s1", "SUBSCRIBE INBOX/Sent"), "s1")
        r = ok(c.cmd("l4", 'LSUB "" "INBOX/S*"'), "l4")
        expect(r, {"INBOX/Sent": ({"\\Sent"}, None)}, "LSUB")
        # RENAME keeps the use (it is in the mailbox list entry)
        ok(c.cmd("r1", "RENAME INBOX/Old INBOX/Older"), "r1")
        r = ok(c.cmd("l5", 'LIST "" "INBOX/Older"'), "l5")
        expect(r, {"INBOX/Older": ({"\\HasNoChildren", "\\Archive"},
                                   None)})
        # another user who may see the folder does not get its use
        inst().mbtool("setacl", "user.alice.Sent", "bob", "lr")
        b = raw_login(BOB, BOB_PW)
        try:
            r = ok(b.cmd("l6", 'LIST "" "user/alice/*"'), "l6")
            expect(r, {"user/alice/Sent": ({"\\HasNoChildren"}, None)})
            r = ok(b.cmd("l7", 'LIST (SPECIAL-USE) "" "*"'), "l7")
            expect(r, {})
        finally:
            b.close()
        ok(c.cmd("u1", "UNSUBSCRIBE INBOX/Sent"), "u1")
        for n in ("INBOX/Older", "INBOX/Plain"):
            ok(c.cmd("d", "DELETE %s" % n), "d")
    finally:
        c.close()


def test_list_status_and_size():
    i = inst()
    msg = make_message(subject="list-status")
    msg2 = make_message(subject="list-status two", body="x" * 300)
    c = raw_login(ALICE, ALICE_PW)
    try:
        for tag, m in (("p1", msg), ("p2", msg2)):
            c.send("%s APPEND INBOX/Tofu {%d+}\r\n" % (tag, len(m)))
            c.send(m + b"\r\n")
            ok(c.until_tagged(tag), tag)
        r = ok(c.cmd("s1", "STATUS INBOX/Tofu (MESSAGES SIZE)"), "s1")
        check(r[0] == b'* STATUS "INBOX/Tofu" (MESSAGES 2 SIZE %d)'
              % (len(msg) + len(msg2)), "STATUS SIZE %r" % r)
        r = ok(c.cmd("l1", 'LIST "" "INBOX/%" RETURN (STATUS (MESSAGES '
                           'UNSEEN SIZE))'), "l1")
        # one STATUS right after each LIST line of a mailbox
        names = []
        for k, ln in enumerate(r[:-1]):
            if ln.startswith(b"* LIST "):
                names.append(lines_of([ln])[0][0])
                nxt = r[k + 1]
                check(nxt.startswith(b'* STATUS "%s" (MESSAGES '
                                     % names[-1].encode()),
                      "no STATUS after %r: %r" % (ln, r))
        check("INBOX/Tofu" in names and "INBOX/Fruit" in names,
              "LIST-STATUS names %r" % r)
        check(b'* STATUS "INBOX/Tofu" (MESSAGES 2 UNSEEN 2 SIZE %d)'
              % (len(msg) + len(msg2)) in r, "Tofu's STATUS %r" % r)
        # nothing for a level that is no mailbox
        ok(c.cmd("s2", "SUBSCRIBE INBOX/Nothing"), "s2")
        r = ok(c.cmd("l2", 'LIST (SUBSCRIBED) "" "INBOX/Nothing" RETURN '
                           '(STATUS (MESSAGES))'), "l2")
        check(len(r) == 2 and b"\\NonExistent" in r[0], "no STATUS %r" % r)
        ok(c.cmd("s3", "UNSUBSCRIBE INBOX/Nothing"), "s3")
    finally:
        c.close()
    # a mailbox the user may see but not read gets no STATUS line
    i.mbtool("setacl", "user.alice.Tofu", "bob", "l")
    b = raw_login(BOB, BOB_PW)
    try:
        r = ok(b.cmd("l3", 'LIST "" "user/alice/Tofu" RETURN (STATUS '
                           '(MESSAGES))'), "l3")
        check(len(r) == 2 and r[0].startswith(b"* LIST "),
              "STATUS without r %r" % r)
    finally:
        b.close()


def test_list_myrights():
    """RETURN (MYRIGHTS): a MYRIGHTS line after each mailbox's LIST line
    when ACL is offered, else an explicit BAD."""
    i = inst()
    i.mbtool("setacl", "user.alice.Fruit", "bob", "lr")
    c = raw_login(BOB, BOB_PW)
    try:
        caps = ok(c.cmd("a1", "CAPABILITY"), "a1")[0].split()
        r = c.cmd("m1", 'LIST "" "user/alice/Fruit" RETURN (MYRIGHTS)')
        if b"LIST-MYRIGHTS" not in caps:
            check(r[-1].startswith(b"m1 BAD") and b"ACL" in r[-1],
                  "MYRIGHTS without ACL %r" % r)
            return
        ok(r, "m1")
        check(len(r) == 3 and r[0].startswith(b"* LIST ") and
              r[1] == b'* MYRIGHTS "user/alice/Fruit" "lr"', "%r" % r)
    finally:
        c.close()


def test_autocreate_inbox():
    """carol has no INBOX: the first login makes it with the folders of
    autocreate_inbox_folders, their special uses and subscriptions."""
    i = inst()
    c = raw_login(CAROL, CAROL_PW)
    try:
        r = ok(c.cmd("l1", 'LIST "" "*"'), "l1")
        want = {"INBOX": ({"\\HasChildren"}, None)}
        for n, u in (("Sent", "\\Sent"), ("Drafts", "\\Drafts"),
                     ("Trash", "\\Trash"), ("Junk", "\\Junk"),
                     ("Archive", "\\Archive")):
            want["INBOX/" + n] = ({"\\HasNoChildren", u}, None)
        expect(r, want)
        r = ok(c.cmd("l2", 'LSUB "" "*"'), "l2")
        check(set(as_dict(r, "LSUB")) == set(want), "subscribed %r" % r)
        r = ok(c.cmd("l3", 'LIST (SPECIAL-USE) "" "*" RETURN (SUBSCRIBED)'),
               "l3")
        check(as_dict(r)["INBOX/Sent"][0] ==
              {"\\HasNoChildren", "\\Sent", "\\Subscribed"}, "%r" % r)
        ok(c.cmd("d1", "DELETE INBOX/Junk"), "d1")
    finally:
        c.close()
    check("autocreate: created mailbox=<user.carol> user=<carol> "
          "folders=<5>" in i.log(), "autocreate log line")
    # the second login creates nothing (the INBOX exists)
    c = raw_login(CAROL, CAROL_PW)
    try:
        r = ok(c.cmd("l1", 'LIST "" "INBOX/Junk"'), "l1")
        check(len(r) == 1, "Junk came back %r" % r)
    finally:
        c.close()
    check(i.log().count("autocreate: created mailbox=<user.carol>") == 1,
          "autocreated twice")
    # bob is not in autocreate_users: his INBOX stays as the admin made it
    b = raw_login(BOB, BOB_PW)
    try:
        r = ok(b.cmd("l1", 'LIST "" "INBOX/*"'), "l1")
        check(len(r) == 1, "bob got folders %r" % r)
    finally:
        b.close()


def test_autocreate_on_delivery():
    """erin has no INBOX: an LMTP delivery makes it (autocreate_post), with
    the folders; a user outside autocreate_users stays unknown."""
    i = inst()
    msg = make_message(subject="first mail")
    i.lmtp_deliver(ERIN, msg)
    check("autocreate: created mailbox=<user.erin> user=<erin> "
          "folders=<5>" in i.log(), "autocreate log line (lmtpd)")
    c = raw_login(ERIN, ERIN_PW)
    try:
        r = ok(c.cmd("s1", "STATUS INBOX (MESSAGES)"), "s1")
        check(r[0] == b'* STATUS "INBOX" (MESSAGES 1)', "delivered %r" % r)
        r = ok(c.cmd("l1", 'LIST (SUBSCRIBED) "" "INBOX/Sent"'), "l1")
        expect(r, {"INBOX/Sent": ({"\\HasNoChildren", "\\Sent",
                                   "\\Subscribed"}, None)})
    finally:
        c.close()
    with Conn(i.unix_socket) as lc:
        lc.reply()
        _, rr, _, _ = transaction(lc, "sender@example.com", ["frank"], msg,
                                  lhlo="test.example.com")
        check(rr[0].code == 550, "frank not in autocreate_users: %r" % rr)
        lc.cmd("QUIT")
    r = i.mbtool("list", check_rc=False)
    check("user.frank" not in str(r), "frank's INBOX made: %r" % (r,))


def test_imaplib():
    m = IMAP4(*inst().addr(), timeout=20)
    try:
        m.starttls(tls_context())
        m.login(ALICE, ALICE_PW)
        typ, data = m._simple_command("CREATE", "INBOX/Drafts",
                                      "(USE (\\Drafts))")
        check(typ == "OK", "CREATE USE %s %r" % (typ, data))
        typ, data = m.list('(SPECIAL-USE) ""', "*")
        check(typ == "OK" and any(b'\\Drafts' in d and b'"INBOX/Drafts"' in d
                                  for d in data), "LIST %r" % data)
        typ, data = m.status("INBOX/Drafts", "(MESSAGES SIZE)")
        check(typ == "OK" and data[0] == b'"INBOX/Drafts" (MESSAGES 0 '
              b'SIZE 0)', "STATUS %r" % data)
        typ, data = m.list('""', '"INBOX/Drafts" RETURN (STATUS (UIDNEXT))')
        check(typ == "OK", "LIST-STATUS %r" % data)
        st = m.untagged_responses.get("STATUS")
        check(st and st[-1].startswith(b'"INBOX/Drafts" (UIDNEXT '),
              "STATUS of LIST-STATUS %r" % st)
        m.delete("INBOX/Drafts")
        m.logout()
    finally:
        try:
            m.shutdown()
        except OSError:
            pass


def curl(user, pw, command):
    """curl's IMAP client: LOGIN after STARTTLS, then `command`; curl
    shows the untagged responses named like the command."""
    r = subprocess.run(
        [CURL, "-s", "-S", "--ssl-reqd", "-k", "--max-time", "60",
         "-u", "%s:%s" % (user, pw),
         "imap://127.0.0.1:%d/" % inst().addr()[1], "-X", command],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
    out = r.stdout.decode(errors="replace")
    check(r.returncode == 0, "curl exit %d: %s" % (r.returncode, out))
    return out


def test_curl():
    """A real client sends the extended forms and reads the answers."""
    if not os.access(CURL, os.X_OK):
        raise Skip("curl not installed")
    inst()
    # dave's INBOX predates autocreate: no special use, no lines
    out = curl(DAVE, DAVE_PW, 'LIST (SPECIAL-USE) "" "*"')
    check("* LIST" not in out, "curl dave %r" % out)
    out = curl(CAROL, CAROL_PW,
               'LIST (SPECIAL-USE) "" "*" RETURN (STATUS (MESSAGES SIZE))')
    check('* LIST (\\HasNoChildren \\Sent) "/" "INBOX/Sent"' in out and
          '* LIST (\\HasNoChildren \\Drafts) "/" "INBOX/Drafts"' in out,
          "curl carol %r" % out)
    out = curl(CAROL, CAROL_PW, "STATUS INBOX/Sent (MESSAGES SIZE)")
    check('* STATUS "INBOX/Sent" (MESSAGES 0 SIZE 0)' in out,
          "curl STATUS %r" % out)


def test_no_worker_trouble():
    i = inst()
    check(not i.worker_trouble(), "worker trouble: %s" % i.worker_trouble())


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_capabilities,
        test_rfc5258_examples,
        test_rfc5258_recursivematch_star2,
        test_multiple_patterns,
        test_bad_list_forms,
        test_create_special_use,
        test_list_status_and_size,
        test_list_myrights,
        test_autocreate_inbox,
        test_autocreate_on_delivery,
        test_imaplib,
        test_curl,
        test_no_worker_trouble,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
