#!/usr/bin/env python3
"""test_imapbinary.py - FETCH BINARY (RFC 3516) and UTF8=ACCEPT (RFC
6855) end to end under the real master, as exact exchanges.

BINARY: BINARY[part] of a base64 part holding NUL bytes is a literal8
~{n} with exactly the decoded bytes; BINARY.SIZE is the decoded length;
quoted-printable (soft line breaks, transport padding) is decoded and
sent as a literal; a partial <o.n> counts decoded bytes; an unknown
Content-Transfer-Encoding answers NO [UNKNOWN-CTE] (and does not set
\\Seen); BINARY.PEEK leaves \\Seen alone, BINARY sets it; a message/rfc822
part and BINARY[] are sent as stored; a part that does not exist is NIL
(size 0); malformed BINARY items are BAD and the session goes on.  A
message stored with NUL octets is sent by BODY[...] and RFC822* with
0x80 for each NUL (a literal holds no NUL), by BINARY[] as stored.

UTF8=ACCEPT: ENABLE UTF8=ACCEPT is answered "* ENABLED UTF8=ACCEPT";
then mailbox names are UTF-8 in CREATE/LIST/LSUB/STATUS/SELECT/RENAME,
while a session without ENABLE sees and uses the modified UTF-7 form;
SEARCH with CHARSET after ENABLE is BAD, SEARCH of a UTF-8 string
without CHARSET works; a name that is not valid UTF-8 is refused.
Python's imaplib does both as a real client (literal8, enable()).

One instance (see imaphelp.py), user alice, allowplaintext on.  The
client is imaphelp.Raw: every response is checked against
imapgrammar.py (UTF-8 in quoted strings only once enabled).  At the end
the master log must show no crashed worker.

Environment: see imaphelp.py.
"""
import base64
import os
import re
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, ImapInstance, Raw, check,  # noqa: E402
                      run_imap_tests)

ALICE, ALICE_PW = "alice", "s3cret-pw"

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("imapbinary", conf={"allowplaintext": "yes"},
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


# ---- BINARY -----------------------------------------------------------

PAYLOAD = bytes(range(256)) * 2 + b"\0end"          # NUL bytes inside
QP_BODY = b"caf=C3=A9 =3D ok   \r\nsoft=\r\nbreak=20\r\nlast"
QP_DECODED = b"caf\xc3\xa9 = ok\r\nsoftbreak \r\nlast"
INNER = (b"From: <bob@example.com>\r\nSubject: inner\r\n\r\n"
         b"inner body\r\n")


def b64lines(data):
    enc = base64.b64encode(data)
    return b"\r\n".join(enc[k:k + 76] for k in range(0, len(enc), 76))


MULTI = (b"From: <ann@example.com>\r\nTo: alice@example.org\r\n"
         b"Subject: binary parts\r\nMIME-Version: 1.0\r\n"
         b"Content-Type: multipart/mixed; boundary=\"b1\"\r\n\r\n"
         b"--b1\r\nContent-Type: application/octet-stream\r\n"
         b"Content-Transfer-Encoding: BASE64\r\n\r\n"
         + b64lines(PAYLOAD) + b"\r\n"
         b"--b1\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Transfer-Encoding: quoted-printable\r\n\r\n"
         + QP_BODY + b"\r\n"
         b"--b1\r\nContent-Type: application/octet-stream\r\n"
         b"Content-Transfer-Encoding: x-uuencode\r\n\r\n"
         b"begin 644 x\r\n+2&5L;&\\`\r\n`\r\nend\r\n"
         b"--b1\r\nContent-Type: message/rfc822\r\n\r\n" + INNER +
         b"--b1--\r\n")

SINGLE_BODY = b"just one part\0with a NUL\r\n"
SINGLE = (b"From: <ann@example.com>\r\nTo: alice@example.org\r\n"
          b"Subject: single\r\nMIME-Version: 1.0\r\n"
          b"Content-Type: application/octet-stream\r\n"
          b"Content-Transfer-Encoding: base64\r\n\r\n"
          + b64lines(SINGLE_BODY) + b"\r\n")


def binary_box(i, name):
    i.create("user.alice." + name)
    for m in (MULTI, SINGLE):
        i.mbtool("deliver", "-m", name, ALICE, input=m)


def fetch1(c, tag, text):
    """The responses of one FETCH (literals inline), the tagged last."""
    return c.lcmd(tag, text)


def flags(c, tag, n):
    r = ok(c.cmd(tag, "FETCH %d (FLAGS)" % n), tag)
    m = re.match(rb"\* %d FETCH \(FLAGS \(([^)]*)\)\)" % n, r[0])
    check(m is not None, "FLAGS: %r" % r)
    return m.group(1).split()


def test_binary_base64_nul():
    """BINARY.PEEK[1] of a base64 part with NUL bytes: a literal8 with
    exactly the decoded bytes; BINARY.SIZE[1] is their number."""
    i = inst()
    binary_box(i, "B64")
    with session(i) as c:
        ok(c.cmd("s1", "SELECT INBOX.B64"), "s1")
        r = ok(fetch1(c, "f1", "FETCH 1 (BINARY.PEEK[1])"), "f1")
        want = (b"* 1 FETCH (BINARY[1] ~{%d}\r\n" % len(PAYLOAD) + PAYLOAD
                + b")")
        check(r[0] == want, "BINARY[1]: %r" % r[0][:80])
        r = ok(c.cmd("f2", "FETCH 1 (BINARY.SIZE[1])"), "f2")
        check(r[0] == b"* 1 FETCH (BINARY.SIZE[1] %d)" % len(PAYLOAD),
              "BINARY.SIZE[1]: %r" % r)
        # a single-part message: part 1 is its body, decoded
        r = ok(fetch1(c, "f3", "UID FETCH 2 (BINARY.PEEK[1] "
                                "BINARY.SIZE[1])"), "f3")
        want = (b"* 2 FETCH (UID 2 BINARY[1] ~{%d}\r\n" % len(SINGLE_BODY)
                + SINGLE_BODY + b" BINARY.SIZE[1] %d)" % len(SINGLE_BODY))
        check(r[0] == want, "single part: %r" % r[0])
        ok(c.cmd("l1", "LOGOUT"), "l1")


NUL_MSG = (b"From: <ann@example.com>\r\nSubject: nul\0here\r\n\r\n"
           b"line\0one\r\n\0\r\n")


def test_body_with_nul():
    """A message stored with NUL octets (APPEND of a literal8): BODY[],
    BODY[TEXT], BODY[HEADER.FIELDS], a partial BODY[]<o.n>, RFC822,
    RFC822.HEADER and RFC822.TEXT are literals (no literal8 outside
    BINARY, RFC 3516 4.3) with each NUL sent as 0x80, octet for octet,
    so the sizes match RFC822.SIZE; BINARY[] sends the stored bytes,
    NULs included, as a literal8.  Every response passes imapgrammar.py,
    which refuses a NUL in a literal."""
    i = inst()
    i.create("user.alice.NUL")
    x = NUL_MSG.replace(b"\0", b"\x80")
    hdr_len = NUL_MSG.index(b"\r\n\r\n") + 4
    with session(i) as c:
        c.send(b"a1 APPEND INBOX.NUL ~{%d+}\r\n" % len(NUL_MSG) + NUL_MSG
               + b"\r\n")
        r = c.until_tagged("a1")
        check(r[-1].startswith(b"a1 OK"), "APPEND: %r" % r)
        ok(c.cmd("s1", "SELECT INBOX.NUL"), "s1")
        cases = [
            ("BODY.PEEK[]", b"BODY[] {%d}\r\n" % len(x) + x),
            ("BODY.PEEK[TEXT]", b"BODY[TEXT] {%d}\r\n" % (len(x) - hdr_len)
             + x[hdr_len:]),
            ("BODY.PEEK[HEADER.FIELDS (SUBJECT)]",
             b"BODY[HEADER.FIELDS (SUBJECT)] {21}\r\n"
             b"Subject: nul\x80here\r\n\r\n"),
            ("BODY.PEEK[]<%d.6>" % (hdr_len + 2),
             b"BODY[]<%d> {6}\r\n" % (hdr_len + 2) +
             x[hdr_len + 2:hdr_len + 8]),
            ("RFC822.HEADER", b"RFC822.HEADER {%d}\r\n" % hdr_len
             + x[:hdr_len]),
            ("RFC822.SIZE", b"RFC822.SIZE %d" % len(NUL_MSG)),
            ("BINARY.PEEK[]", b"BINARY[] ~{%d}\r\n" % len(NUL_MSG)
             + NUL_MSG),
            ("RFC822.TEXT", b"RFC822.TEXT {%d}\r\n" % (len(x) - hdr_len)
             + x[hdr_len:]),
            ("RFC822", b"RFC822 {%d}\r\n" % len(x) + x),
        ]
        for n, (item, want) in enumerate(cases):
            tag = "f%d" % n
            r = ok(fetch1(c, tag, "FETCH 1 (%s)" % item), tag)
            # RFC822(.TEXT) set \Seen: its FLAGS come along once
            got = re.sub(rb" FLAGS \([^)]*\)\)$", b")", r[0])
            check(got == b"* 1 FETCH (" + want + b")",
                  "%s: %r, want %r" % (item, r[0], want))
        ok(c.cmd("l1", "LOGOUT"), "l1")
    check(i.messages("user.alice.NUL") == [NUL_MSG], "stored bytes changed")


def test_binary_qp_and_partial():
    """Quoted-printable is decoded (no NUL: a plain literal); a partial
    range counts decoded bytes and is a literal8 only when the bytes
    sent hold NUL."""
    i = inst()
    binary_box(i, "QP")
    with session(i) as c:
        ok(c.cmd("s1", "EXAMINE INBOX.QP"), "s1")
        r = ok(fetch1(c, "f1", "FETCH 1 (BINARY.PEEK[2] BINARY.SIZE[2])"),
               "f1")
        want = (b"* 1 FETCH (BINARY[2] {%d}\r\n" % len(QP_DECODED)
                + QP_DECODED + b" BINARY.SIZE[2] %d)" % len(QP_DECODED))
        check(r[0] == want, "quoted-printable: %r" % r[0])
        r = ok(fetch1(c, "f2", "FETCH 1 (BINARY.PEEK[1]<0.10>)"), "f2")
        check(r[0] == b"* 1 FETCH (BINARY[1]<0> ~{10}\r\n" + PAYLOAD[:10]
              + b")", "partial <0.10>: %r" % r[0])
        r = ok(fetch1(c, "f3", "FETCH 1 (BINARY.PEEK[1]<5.10>)"), "f3")
        check(r[0] == b"* 1 FETCH (BINARY[1]<5> {10}\r\n" + PAYLOAD[5:15]
              + b")", "partial <5.10>: %r" % r[0])
        r = ok(fetch1(c, "f4", "FETCH 1 (BINARY.PEEK[2]<4.1000>)"), "f4")
        check(r[0] == b"* 1 FETCH (BINARY[2]<4> {%d}\r\n"
              % (len(QP_DECODED) - 4) + QP_DECODED[4:] + b")",
              "partial past the end: %r" % r[0])
        r = ok(fetch1(c, "f5", "FETCH 1 (BINARY.PEEK[2]<9999.5>)"), "f5")
        check(r[0] == b"* 1 FETCH (BINARY[2]<9999> {0}\r\n)",
              "origin past the end: %r" % r[0])
        ok(c.cmd("l1", "LOGOUT"), "l1")


def test_binary_unknown_cte():
    """An encoding the server cannot undo: NO [UNKNOWN-CTE] and no FETCH
    response for the message; with BINARY (not PEEK) its \\Seen is not
    set; BINARY.SIZE fails the same way; the session goes on."""
    i = inst()
    binary_box(i, "CTE")
    with session(i) as c:
        ok(c.cmd("s1", "SELECT INBOX.CTE"), "s1")
        for tag, item in (("u1", "BINARY.PEEK[3]"), ("u2", "BINARY[3]"),
                          ("u3", "BINARY.SIZE[3]")):
            r = fetch1(c, tag, "FETCH 1 (%s)" % item)
            check(len(r) == 1 and r[0].startswith(
                  tag.encode() + b" NO [UNKNOWN-CTE] "),
                  "%s: %r" % (item, r))
        check(b"\\Seen" not in flags(c, "g1", 1),
              "a failed BINARY[3] set \\Seen")
        # the other message of the set is still answered
        r = fetch1(c, "u4", "FETCH 1:2 (BINARY.SIZE[1] BINARY.SIZE[3])")
        check(r[-1].startswith(b"u4 NO [UNKNOWN-CTE]"), "u4: %r" % r)
        check(r[:-1] == [b"* 2 FETCH (BINARY.SIZE[1] %d BINARY.SIZE[3] 0)"
                         % len(SINGLE_BODY)], "u4: %r" % r)
        ok(c.cmd("n1", "NOOP"), "n1")
        ok(c.cmd("l1", "LOGOUT"), "l1")


def test_binary_seen():
    """BINARY.PEEK does not set \\Seen; BINARY does (and the response
    says so with FLAGS)."""
    i = inst()
    binary_box(i, "SEEN")
    with session(i) as c:
        ok(c.cmd("s1", "SELECT INBOX.SEEN"), "s1")
        ok(fetch1(c, "f1", "FETCH 1 (BINARY.PEEK[2])"), "f1")
        ok(c.cmd("f2", "FETCH 1 (BINARY.SIZE[1])"), "f2")
        check(b"\\Seen" not in flags(c, "g1", 1), "BINARY.PEEK set \\Seen")
        r = ok(fetch1(c, "f3", "FETCH 1 (BINARY[2])"), "f3")
        check(r[0] == b"* 1 FETCH (BINARY[2] {%d}\r\n" % len(QP_DECODED)
              + QP_DECODED + b" FLAGS (\\Seen \\Recent))",
              "BINARY[2]: %r" % r[0])
        check(b"\\Seen" in flags(c, "g2", 1), "BINARY did not set \\Seen")
        ok(c.cmd("l1", "LOGOUT"), "l1")


def test_binary_composite_and_missing():
    """A message/rfc822 part and BINARY[] are sent as stored (a message
    has only an identity encoding); a part that does not exist is NIL
    with size 0; malformed BINARY items are BAD."""
    i = inst()
    binary_box(i, "COMP")
    with session(i) as c:
        ok(c.cmd("s1", "EXAMINE INBOX.COMP"), "s1")
        r = ok(fetch1(c, "f1", "FETCH 1 (BINARY.PEEK[4] BINARY.SIZE[4])"),
               "f1")
        # the part ends before the CRLF of the delimiter line
        inner = INNER[:-2]
        check(r[0] == b"* 1 FETCH (BINARY[4] {%d}\r\n" % len(inner) + inner
              + b" BINARY.SIZE[4] %d)" % len(inner), "[4]: %r" % r[0])
        r = ok(fetch1(c, "f2", "FETCH 1 (BINARY.PEEK[] BINARY.SIZE[])"),
               "f2")
        check(r[0] == b"* 1 FETCH (BINARY[] {%d}\r\n" % len(MULTI) + MULTI
              + b" BINARY.SIZE[] %d)" % len(MULTI), "[]: %r" % r[0][:80])
        r = ok(fetch1(c, "f3", "FETCH 1 (BINARY.PEEK[9] BINARY.SIZE[9] "
                                "BINARY.PEEK[4.1])"), "f3")
        check(r[0] == b"* 1 FETCH (BINARY[9] NIL BINARY.SIZE[9] 0 "
              b"BINARY[4.1] {10}\r\ninner body)", "missing: %r" % r[0])
        for n, item in enumerate(("BINARY[1.TEXT]", "BINARY[1.MIME]",
                                  "BINARY[HEADER]", "BINARY[0]",
                                  "BINARY.SIZE[1]<0.5>", "BINARY[1",
                                  "BINARY.PEEK[1]<5>", "BINARY[1.]")):
            bad(c, "b%d" % n, "FETCH 1 (%s)" % item)
        ok(c.cmd("l1", "LOGOUT"), "l1")


# ---- UTF8=ACCEPT ------------------------------------------------------

def utf8_session(i):
    c = session(i)
    r = ok(c.cmd("e0", "ENABLE UTF8=ACCEPT"), "e0")
    check(r == [b"* ENABLED UTF8=ACCEPT", r[-1]], "ENABLE: %r" % r)
    c.utf8 = True           # from now on UTF-8 in quoted strings is fine
    return c


def lines(r, what):
    return sorted(ln for ln in r if ln.startswith(what))


def test_utf8_names():
    """After ENABLE UTF8=ACCEPT names are UTF-8 in CREATE, LIST, LSUB,
    STATUS, SELECT, RENAME and SUBSCRIBE; a session without it sees and
    uses the modified UTF-7 form the store keeps; the two are different
    names for a UTF-8 session ("&" is itself there)."""
    i = inst()
    with session(i) as c:
        r = ok(c.cmd("c1", "CAPABILITY"), "c1")
        check(b" UTF8=ACCEPT" in r[0], "no UTF8=ACCEPT: %r" % r)
    with utf8_session(i) as u, session(i) as a:
        ok(u.cmd("u1", 'CREATE "INBOX.Entwürfe"'), "u1")
        ok(u.cmd("u2", 'CREATE "INBOX.R&D"'), "u2")
        ok(u.cmd("u3", 'CREATE "INBOX.Ünï"'), "u3")
        ok(u.cmd("u3b", 'CREATE "INBOX.Ünï.😀"'), "u3b")
        r = ok(u.cmd("u4", 'LIST "" ("INBOX.Entw*" "INBOX.R&D" '
                           '"INBOX.Ünï*")'), "u4")
        check(lines(r, b"* LIST") == sorted([
            '* LIST (\\HasNoChildren) "." "INBOX.Entwürfe"'.encode(),
            b'* LIST (\\HasNoChildren) "." "INBOX.R&D"',
            '* LIST (\\HasChildren) "." "INBOX.Ünï"'.encode(),
            '* LIST (\\HasNoChildren) "." "INBOX.Ünï.😀"'.encode()]),
            "UTF-8 LIST: %r" % r)
        r = ok(a.cmd("a1", 'LIST "" ("INBOX.Entw*" "INBOX.R&-D" '
                           '"INBOX.&ANw-n&AO8-*")'), "a1")
        check(lines(r, b"* LIST") == sorted([
            b'* LIST (\\HasNoChildren) "." "INBOX.Entw&APw-rfe"',
            b'* LIST (\\HasNoChildren) "." "INBOX.R&-D"',
            b'* LIST (\\HasChildren) "." "INBOX.&ANw-n&AO8-"',
            b'* LIST (\\HasNoChildren) "." "INBOX.&ANw-n&AO8-.&2D3eAA-"']),
            "modified UTF-7 LIST: %r" % r)
        # a pattern in UTF-8
        r = ok(u.cmd("u5", 'LIST "INBOX." "Ünï.%"'), "u5")
        check(lines(r, b"* LIST") == [
            '* LIST (\\HasNoChildren) "." "INBOX.Ünï.😀"'.encode()],
            "UTF-8 pattern: %r" % r)
        r = ok(u.cmd("u6", 'STATUS "INBOX.Entwürfe" (MESSAGES)'), "u6")
        check(r[0] == '* STATUS "INBOX.Entwürfe" (MESSAGES 0)'.encode(),
              "STATUS: %r" % r)
        r = ok(a.cmd("a2", 'STATUS "INBOX.Entw&APw-rfe" (MESSAGES)'), "a2")
        check(r[0] == b'* STATUS "INBOX.Entw&APw-rfe" (MESSAGES 0)',
              "STATUS mUTF-7: %r" % r)
        # SELECT by either form, each in its own session
        ok(u.cmd("u7", 'SELECT "INBOX.Entwürfe"'), "u7")
        ok(a.cmd("a3", 'SELECT "INBOX.Entw&APw-rfe"'), "a3")
        ok(u.cmd("u8", "CLOSE"), "u8")
        ok(a.cmd("a4", "CLOSE"), "a4")
        # in the UTF-8 session the modified UTF-7 spelling is another name
        r = u.cmd("u9", 'SELECT "INBOX.Entw&APw-rfe"')
        check(r[-1].startswith(b"u9 NO [NONEXISTENT]"), "u9: %r" % r)
        # 8-bit names are refused without ENABLE
        r = a.cmd("a5", 'CREATE "INBOX.Grüße"')
        check(r[-1].startswith(b"a5 NO [CANNOT]"), "a5: %r" % r)
        # RENAME and SUBSCRIBE/LSUB in UTF-8
        ok(u.cmd("r1", 'RENAME "INBOX.Entwürfe" "INBOX.Brouillons été"'),
           "r1")
        ok(u.cmd("r2", 'SUBSCRIBE "INBOX.Brouillons été"'), "r2")
        r = ok(u.cmd("r3", 'LSUB "" "INBOX.B*"'), "r3")
        check(lines(r, b"* LSUB") == [
            '* LSUB () "." "INBOX.Brouillons été"'.encode()],
            "UTF-8 LSUB: %r" % r)
        r = ok(a.cmd("r4", 'LSUB "" "INBOX.B*"'), "r4")
        check(lines(r, b"* LSUB") == [
            b'* LSUB () "." "INBOX.Brouillons &AOk-t&AOk-"'],
            "modified UTF-7 LSUB: %r" % r)
        ok(a.cmd("r5", 'SELECT "INBOX.Brouillons &AOk-t&AOk-"'), "r5")
        # names that are not UTF-8: a literal is NO, a quoted string BAD
        u.send(b"x1 CREATE {11+}\r\nINBOX.b\xffad\r\n")
        r = u.until_tagged("x1")
        check(r[-1].startswith(b"x1 NO [CANNOT]"), "x1: %r" % r)
        u.send(b'x2 CREATE "INBOX.b\xc3ad"\r\n')
        r = u.until_tagged("x2")
        check(r[-1].startswith(b"x2 BAD"), "x2: %r" % r)
        r = u.cmd("x3", 'CREATE "INBOX.tab\x7f"')
        check(r[-1].startswith(b"x3 NO [CANNOT]"), "x3: %r" % r)
        ok(u.cmd("x4", "NOOP"), "x4")
        ok(u.cmd("l1", "LOGOUT"), "l1")
        ok(a.cmd("l2", "LOGOUT"), "l2")


def test_utf8_enable_selected():
    """ENABLE UTF8=ACCEPT is for the authenticated state: in the selected
    state it is not enabled, and names stay modified UTF-7."""
    i = inst()
    i.create("user.alice.Caf&AOk-")
    with session(i) as c:
        ok(c.cmd("s1", "SELECT INBOX"), "s1")
        r = ok(c.cmd("e1", "ENABLE UTF8=ACCEPT"), "e1")
        check(r[0] == b"* ENABLED", "ENABLE in selected: %r" % r)
        r = ok(c.cmd("l1", 'LIST "" "INBOX.Caf*"'), "l1")
        check(lines(r, b"* LIST") == [
            b'* LIST (\\HasNoChildren) "." "INBOX.Caf&AOk-"'], "%r" % r)
        ok(c.cmd("c1", "CLOSE"), "c1")
        r = ok(c.cmd("e2", "ENABLE UTF8=ACCEPT CONDSTORE"), "e2")
        check(r[0] == b"* ENABLED CONDSTORE UTF8=ACCEPT", "%r" % r)
        c.utf8 = True
        r = ok(c.cmd("e3", "ENABLE UTF8=ACCEPT"), "e3")
        check(r[0] == b"* ENABLED", "enabled twice: %r" % r)
        r = ok(c.cmd("l2", 'LIST "" "INBOX.Caf*"'), "l2")
        check(lines(r, b"* LIST") == [
            '* LIST (\\HasNoChildren) "." "INBOX.Café"'.encode()], "%r" % r)
        ok(c.cmd("l3", "LOGOUT"), "l3")


UMSG = ("From: <ann@example.com>\r\nTo: alice@example.org\r\n"
        "Subject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\nMIME-Version: 1.0\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        "Content-Transfer-Encoding: 8bit\r\n\r\n"
        "Schöne Grüße aus Köln\r\n").encode()


def test_utf8_search():
    """After ENABLE UTF8=ACCEPT: SEARCH of UTF-8 strings without CHARSET
    finds them; any CHARSET (known or not) is BAD (RFC 6855 3); without
    ENABLE, SEARCH CHARSET UTF-8 works as before."""
    i = inst()
    i.create("user.alice.U8")
    i.mbtool("deliver", "-m", "U8", ALICE, input=UMSG)
    with utf8_session(i) as u:
        ok(u.cmd("s1", 'EXAMINE "INBOX.U8"'), "s1")
        r = ok(u.cmd("q1", 'SEARCH SUBJECT "grüße"'), "q1")
        check(r[0] == b"* SEARCH 1", "SUBJECT: %r" % r)
        r = ok(u.cmd("q2", 'SEARCH BODY "KÖLN"'), "q2")
        check(r[0] == b"* SEARCH 1", "BODY: %r" % r)
        r = ok(u.cmd("q3", 'UID SEARCH TEXT "Grüße aus"'), "q3")
        check(r[0] == b"* SEARCH 1", "TEXT: %r" % r)
        for tag, text in (("b1", 'SEARCH CHARSET UTF-8 SUBJECT "grüße"'),
                          ("b2", "SEARCH CHARSET US-ASCII ALL"),
                          ("b3", "SEARCH CHARSET KOI8-R ALL"),
                          ("b4", 'SEARCH RETURN (COUNT) CHARSET UTF-8 ALL')):
            bad(u, tag, text)
        ok(u.cmd("l1", "LOGOUT"), "l1")
    with session(i) as a:
        ok(a.cmd("s1", 'EXAMINE "INBOX.U8"'), "s1")
        word = "grüße".encode()
        a.send(b"q1 SEARCH CHARSET UTF-8 SUBJECT {%d+}\r\n%s\r\n"
               % (len(word), word))
        r = a.until_tagged("q1")
        check(r == [b"* SEARCH 1", r[-1]] and r[-1].startswith(b"q1 OK"),
              "CHARSET UTF-8 without ENABLE: %r" % r)
        r = a.cmd("q2", "SEARCH CHARSET KOI8-R ALL")
        check(r[-1].startswith(b"q2 NO [BADCHARSET"), "q2: %r" % r)
        ok(a.cmd("l1", "LOGOUT"), "l1")


def test_imaplib():
    """Python's imaplib as a real client: FETCH BINARY.PEEK of the base64
    part arrives as the exact decoded bytes (imaplib reads the literal8);
    after imaplib's enable("UTF8=ACCEPT") it creates, lists and selects a
    UTF-8 name."""
    i = inst()
    binary_box(i, "LIB")
    m = IMAP4(*i.addr())
    try:
        m.login(ALICE, ALICE_PW)
        typ, data = m.select('"INBOX.LIB"', readonly=True)
        check(typ == "OK", "select: %r %r" % (typ, data))
        typ, data = m.fetch("1", "(BINARY.PEEK[1] BINARY.SIZE[1])")
        check(typ == "OK" and data[0] == (b"1 (BINARY[1] ~{%d}"
                                          % len(PAYLOAD), PAYLOAD)
              and data[1] == b" BINARY.SIZE[1] %d)" % len(PAYLOAD),
              "imaplib BINARY: %r" % (data,))
        m.close()
        typ, data = m.enable("UTF8=ACCEPT")
        check(typ == "OK", "enable: %r %r" % (typ, data))
        m.grammar_utf8 = True
        typ, data = m.create('"INBOX.Straße"')
        check(typ == "OK", "create: %r %r" % (typ, data))
        typ, data = m.list('""', '"INBOX.Stra*"')
        check(typ == "OK" and data == [
            '(\\HasNoChildren) "." "INBOX.Straße"'.encode()],
            "imaplib LIST: %r" % (data,))
        typ, data = m.select('"INBOX.Straße"')
        check(typ == "OK", "select UTF-8: %r %r" % (typ, data))
        m.logout()
    finally:
        if m.state != "LOGOUT":
            m.shutdown()


def finish():
    global _inst
    if _inst is not None:
        check(not _inst.worker_trouble(),
              "worker trouble: %s" % _inst.worker_trouble())
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_binary_base64_nul,
        test_body_with_nul,
        test_binary_qp_and_partial,
        test_binary_unknown_cte,
        test_binary_seen,
        test_binary_composite_and_missing,
        test_utf8_names,
        test_utf8_enable_selected,
        test_utf8_search,
        test_imaplib,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
