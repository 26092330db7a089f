"""imapgrammar.py - a strict recursive-descent check of IMAP server
responses against the formal syntax of RFC 3501 section 9, with the
extensions imapd sends: UIDPLUS (RFC 4315) APPENDUID/COPYUID codes,
CONDSTORE (RFC 7162) HIGHESTMODSEQ/NOMODSEQ/MODIFIED codes, FETCH MODSEQ
and SEARCH (MODSEQ n), ENABLE (RFC 5161), ID (RFC 2971), NAMESPACE
(RFC 2342), ACL (RFC 4314: ACL, LISTRIGHTS, MYRIGHTS), QUOTA (RFC 9208:
QUOTA, QUOTAROOT), ESEARCH (RFC 4731, also as ESORT's answer, RFC 5267,
with RFC 5267's PARTIAL, ADDTO and REMOVEFROM),
SORT and THREAD (RFC 5256), QRESYNC (RFC 7162: VANISHED,
VANISHED (EARLIER)), LIST-EXTENDED (RFC 5258: mbox-list-extended
items such as CHILDINFO after the name), LIST-STATUS (RFC 5819, STATUS
lines), STATUS=SIZE (RFC 8438, a 63-bit number), BINARY (RFC 3516:
FETCH BINARY[...]<n> as nstring or literal8 ~{n}, BINARY.SIZE[...]), UTF-8
in quoted strings only when the caller says UTF8=ACCEPT (RFC 6855) is
enabled (validate(data, utf8=True)), and the RFC 5530 response codes (any atom code with optional text is grammatical).  As in
RFC 9051 the human-readable text after a status or continuation may be
empty.

validate(data) takes the raw bytes of one complete response (without its
final CRLF; literals inlined as {n} CRLF and n bytes) and returns None if
it is grammatical, else a message saying where and why it is not.
Python 3 standard library only.
"""

import re

MONTHS = (b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug",
          b"Sep", b"Oct", b"Nov", b"Dec")
ATOM_SPECIALS = set(b'(){ %*"\\]')
MAX32 = 2 ** 32 - 1
MAX63 = 2 ** 63 - 1


class Bad(Exception):
    pass


def _atom_char(c):
    return 0x20 < c < 0x7f and c not in ATOM_SPECIALS


def _astring_char(c):
    return _atom_char(c) or c == ord("]")


class Parser:
    def __init__(self, data, utf8=False):
        self.d = data
        self.i = 0
        self.utf8 = utf8

    # -- primitives ---------------------------------------------------
    def fail(self, why):
        raise Bad("at offset %d (%r): %s"
                  % (self.i, self.d[max(0, self.i - 20):self.i + 20], why))

    def peek(self, n=1):
        return self.d[self.i:self.i + n]

    def eof(self):
        return self.i >= len(self.d)

    def lit(self, s, ci=True):
        """Consume the exact token s (case-insensitive by default)."""
        got = self.d[self.i:self.i + len(s)]
        if (got.upper() if ci else got) != (s.upper() if ci else s):
            self.fail("expected %r" % s)
        self.i += len(s)

    def opt(self, s):
        if self.d[self.i:self.i + len(s)].upper() == s.upper():
            self.i += len(s)
            return True
        return False

    def sp(self):
        self.lit(b" ")

    def end(self):
        if not self.eof():
            self.fail("trailing data")

    def number(self, nz=False, maximum=MAX32):
        j = self.i
        while j < len(self.d) and 0x30 <= self.d[j] <= 0x39:
            j += 1
        if j == self.i:
            self.fail("expected a number")
        s = self.d[self.i:j]
        if nz and (s[0] == 0x30):
            self.fail("expected a non-zero number without leading zero")
        if int(s) > maximum:
            self.fail("number out of range")
        self.i = j
        return int(s)

    def atom(self):
        j = self.i
        while j < len(self.d) and _atom_char(self.d[j]):
            j += 1
        if j == self.i:
            self.fail("expected an atom")
        s, self.i = self.d[self.i:j], j
        return s

    def quoted(self):
        self.lit(b'"')
        out = bytearray()
        while True:
            if self.eof():
                self.fail("unterminated quoted string")
            c = self.d[self.i]
            if c == 0x22:
                self.i += 1
                if self.utf8:
                    try:
                        bytes(out).decode("utf-8")
                    except UnicodeDecodeError:
                        self.fail("invalid UTF-8 in quoted string")
                return bytes(out)
            if c == 0x5c:
                n = self.d[self.i + 1:self.i + 2]
                if n not in (b'"', b"\\"):
                    self.fail("bad escape in quoted string")
                out += n
                self.i += 2
                continue
            if c in (0x0d, 0x0a) or c == 0 or (c > 0x7f and not self.utf8):
                self.fail("bad character in quoted string")
            out.append(c)
            self.i += 1

    def literal(self):
        self.lit(b"{")
        n = self.number(maximum=MAX63)
        self.lit(b"}\r\n", ci=False)
        if self.i + n > len(self.d):
            self.fail("literal of %d octets runs past the response" % n)
        data = self.d[self.i:self.i + n]
        if b"\0" in data:
            self.fail("NUL in literal")
        self.i += n
        return data

    def literal8(self):
        self.lit(b"~{")
        n = self.number(maximum=MAX63)
        self.lit(b"}\r\n", ci=False)
        if self.i + n > len(self.d):
            self.fail("literal8 of %d octets runs past the response" % n)
        data = self.d[self.i:self.i + n]
        self.i += n
        return data

    def string(self):
        c = self.peek()
        if c == b'"':
            return self.quoted()
        if c == b"{":
            return self.literal()
        self.fail("expected a string")

    def is_nil(self):
        return (self.peek(3).upper() == b"NIL"
                and not (len(self.d) > self.i + 3
                         and _atom_char(self.d[self.i + 3])))

    def nstring(self):
        if self.is_nil():
            self.i += 3
            return None
        return self.string()

    def astring(self):
        if self.peek() in (b'"', b"{"):
            return self.string()
        j = self.i
        while j < len(self.d) and _astring_char(self.d[j]):
            j += 1
        if j == self.i:
            self.fail("expected an astring")
        s, self.i = self.d[self.i:j], j
        return s

    def text(self, stop=None):
        """*TEXT-CHAR up to the end (or stop); empty is allowed."""
        while not self.eof():
            c = self.d[self.i]
            if stop is not None and c == stop:
                break
            if c in (0, 0x0d, 0x0a) or c > 0x7f:
                self.fail("bad character in text")
            self.i += 1

    def plist(self, item, allow_empty=True):
        """"(" [item *(SP item)] ")"."""
        self.lit(b"(")
        if self.opt(b")"):
            if not allow_empty:
                self.fail("empty list")
            return
        item()
        while self.opt(b" "):
            item()
        self.lit(b")")

    def flag(self, perm=False):
        if self.opt(b"\\"):
            if perm and self.opt(b"*"):
                return
            self.atom()
        else:
            self.atom()

    def seq_set(self, star):
        def one():
            if star and self.opt(b"*"):
                return
            self.number(nz=True)
        while True:
            one()
            if self.opt(b":"):
                one()
            if not self.opt(b","):
                return

    # -- response ------------------------------------------------------
    def response(self):
        if self.opt(b"+"):
            # continue-req: "+" SP (resp-text / base64)
            if self.eof():
                self.fail("expected SP after +")
            self.sp()
            self.resp_text()
            return
        if self.opt(b"* "):
            self.untagged()
            return
        j = self.i
        while j < len(self.d) and _astring_char(self.d[j]) \
                and self.d[j] != 0x2b:
            j += 1
        if j == self.i:
            self.fail("expected a tag, \"*\" or \"+\"")
        self.i = j
        self.sp()
        w = self.atom().upper()
        if w not in (b"OK", b"NO", b"BAD"):
            self.i -= len(w)
            self.fail("tagged response must be OK, NO or BAD")
        self.sp()
        self.resp_text()

    def resp_text(self):
        if self.opt(b"["):
            self.resp_text_code()
            self.lit(b"]")
            if self.eof():
                return          # RFC 9051: text is optional
            self.sp()
        self.text()

    def resp_text_code(self):
        code = self.atom().upper()
        if code == b"BADCHARSET":
            if self.opt(b" "):
                self.plist(self.astring, allow_empty=False)
        elif code == b"CAPABILITY":
            self.capabilities()
        elif code == b"PERMANENTFLAGS":
            self.sp()
            self.plist(lambda: self.flag(perm=True))
        elif code in (b"UIDNEXT", b"UIDVALIDITY", b"UNSEEN"):
            self.sp()
            self.number(nz=True)
        elif code == b"APPENDUID":
            self.sp()
            self.number(nz=True)
            self.sp()
            self.seq_set(False)
        elif code == b"COPYUID":
            self.sp()
            self.number(nz=True)
            self.sp()
            self.seq_set(False)
            self.sp()
            self.seq_set(False)
        elif code == b"HIGHESTMODSEQ":
            self.sp()
            self.number(maximum=MAX63)
        elif code == b"MODIFIED":
            self.sp()
            self.seq_set(True)
        elif code in (b"ALERT", b"PARSE", b"READ-ONLY", b"READ-WRITE",
                      b"TRYCREATE", b"NOMODSEQ"):
            pass
        elif self.opt(b" "):
            start = self.i
            self.text(stop=ord("]"))
            if self.i == start:
                self.fail("empty response code text")

    def capabilities(self):
        caps = []
        while self.opt(b" "):
            caps.append(self.atom().upper())
        if b"IMAP4REV1" not in caps:
            self.fail("capability list without IMAP4rev1")

    def untagged(self):
        if self.peek().isdigit():
            self.number()
            self.sp()
            w = self.atom().upper()
            if w == b"FETCH":
                self.sp()
                self.msg_att()
            elif w not in (b"EXISTS", b"RECENT", b"EXPUNGE"):
                self.i -= len(w)
                self.fail("unknown message-data %r" % w)
            self.end()
            return
        w = self.atom().upper()
        if w in (b"OK", b"NO", b"BAD", b"BYE", b"PREAUTH"):
            self.sp()
            self.resp_text()
        elif w == b"CAPABILITY":
            self.capabilities()
        elif w in (b"LIST", b"LSUB"):
            self.sp()
            self.plist(lambda: (self.lit(b"\\"), self.atom()))
            self.sp()
            if self.is_nil():
                self.i += 3
            else:
                self.lit(b'"')
                c = self.peek()
                if c == b"\\":
                    self.i += 1
                    if self.peek() not in (b'"', b"\\"):
                        self.fail("bad escape in delimiter")
                    self.i += 1
                elif not c or c in b'"\r\n' or c[0] > 0x7f:
                    self.fail("bad hierarchy delimiter")
                else:
                    self.i += 1
                self.lit(b'"')
            self.sp()
            self.astring()
            if self.opt(b" "):
                # RFC 5258: mbox-list-extended
                self.plist(self.list_ext_item, allow_empty=True)
        elif w == b"STATUS":
            self.sp()
            self.astring()
            self.sp()

            def att():
                self.atom()
                self.sp()
                self.number(maximum=MAX63)
            self.plist(att)
        elif w == b"SEARCH":
            while self.opt(b" "):
                if self.opt(b"("):
                    self.lit(b"MODSEQ ")
                    self.number(maximum=MAX63)
                    self.lit(b")")
                    break
                self.number(nz=True)
        elif w == b"ESEARCH":
            self.esearch()
        elif w == b"SORT":
            while self.opt(b" "):
                if self.opt(b"("):
                    self.lit(b"MODSEQ ")
                    self.number(maximum=MAX63)
                    self.lit(b")")
                    break
                self.number(nz=True)
        elif w == b"THREAD":
            if self.opt(b" "):
                self.thread_list()
                while self.peek() == b"(":
                    self.thread_list()
        elif w == b"FLAGS":
            self.sp()
            self.plist(self.flag)
        elif w == b"ENABLED":
            while self.opt(b" "):
                self.atom()
        elif w == b"VANISHED":
            # RFC 7162 7: "VANISHED" [SP "(EARLIER)"] SP known-uids
            self.sp()
            if self.opt(b"("):
                self.lit(b"EARLIER")
                self.lit(b")")
                self.sp()
            self.seq_set(False)
        elif w == b"ID":
            self.sp()
            if self.is_nil():
                self.i += 3
            else:
                def pair():
                    self.string()
                    self.sp()
                    self.nstring()
                self.plist(pair, allow_empty=False)
        elif w == b"NAMESPACE":
            for k in range(3):
                self.sp()
                self.namespace()
        elif w == b"ACL":
            # RFC 4314: "ACL" SP mailbox *(SP identifier SP rights)
            self.sp()
            self.astring()
            while self.opt(b" "):
                self.astring()
                self.sp()
                self.rights()
        elif w == b"LISTRIGHTS":
            # mailbox SP identifier SP rights *(SP rights)
            self.sp()
            self.astring()
            self.sp()
            self.astring()
            self.sp()
            self.rights(allow_empty=True)
            while self.opt(b" "):
                self.rights()
        elif w == b"MYRIGHTS":
            self.sp()
            self.astring()
            self.sp()
            self.rights()
        elif w == b"QUOTA":
            # RFC 9208: quota-root-name SP "(" quota-resource *(SP ...) ")"
            self.sp()
            self.astring()
            self.sp()

            def resource():
                self.atom()
                self.sp()
                self.number(maximum=MAX63)
                self.sp()
                self.number(maximum=MAX63)
            self.plist(resource, allow_empty=False)
        elif w == b"QUOTAROOT":
            self.sp()
            self.astring()
            while self.opt(b" "):
                self.astring()
        else:
            self.i -= len(w)
            self.fail("unknown untagged response %r" % w)
        self.end()

    def rights(self, allow_empty=False):
        """RFC 4314 rights = astring of rights letters (a-z, 0-9); the
        required-rights field of LISTRIGHTS may be empty ("")."""
        start = self.i
        r = self.astring()
        if r is None:
            r = self.d[start:self.i].strip(b'"')
        if not r and not allow_empty:
            self.i = start
            self.fail("empty rights")
        if any(not (0x61 <= c <= 0x7a or 0x30 <= c <= 0x39) for c in r):
            self.i = start
            self.fail("rights must be lower-case letters or digits")

    def esearch(self):
        # [SP "(" "TAG" SP tag-string ")"] [SP "UID"] *(SP return-data)
        if self.peek(2) == b" (":
            self.i += 2
            self.lit(b"TAG ")
            self.string()
            self.lit(b")")
        if self.d[self.i:self.i + 4].upper() == b" UID" and \
                (self.i + 4 == len(self.d) or self.d[self.i + 4] == 0x20):
            self.i += 4
        seen = set()
        while self.opt(b" "):
            w = self.atom().upper()
            if w in seen and w not in (b"ADDTO", b"REMOVEFROM"):
                self.fail("repeated ESEARCH item %r" % w)
            seen.add(w)
            if b"ALL" in seen and b"PARTIAL" in seen:
                self.fail("ALL and PARTIAL together")
            self.sp()
            if w in (b"ADDTO", b"REMOVEFROM"):
                # RFC 5267: "(" context-position SP sequence-set
                # *(SP context-position SP sequence-set) ")"
                self.lit(b"(")
                while True:
                    self.number()
                    self.sp()
                    self.seq_set(False)
                    if not self.opt(b" "):
                        break
                self.lit(b")")
            elif w == b"PARTIAL":
                # RFC 5267 4.4: "(" nz-number ":" nz-number SP
                # (sequence-set / "NIL") ")"
                self.lit(b"(")
                self.number(nz=True)
                self.lit(b":")
                self.number(nz=True)
                self.sp()
                if not self.opt(b"NIL"):
                    self.seq_set(False)
                self.lit(b")")
            elif w in (b"MIN", b"MAX"):
                self.number(nz=True)
            elif w == b"ALL":
                self.seq_set(False)
            elif w == b"COUNT":
                self.number()
            elif w == b"MODSEQ":
                self.number(nz=True, maximum=MAX63)
            else:
                self.i -= len(w) + 1
                self.fail("unknown ESEARCH item %r" % w)

    def thread_list(self):
        # "(" (thread-members / thread-nested) ")"; thread-members =
        # nz-number *(SP nz-number) [SP thread-nested]; thread-nested =
        # 2*thread-list
        self.lit(b"(")
        if self.peek() == b"(":
            n = 0
            while self.peek() == b"(":
                self.thread_list()
                n += 1
            if n < 2:
                self.fail("thread-nested needs two thread-lists")
        else:
            self.number(nz=True)
            while self.opt(b" "):
                if self.peek() == b"(":
                    n = 0
                    while self.peek() == b"(":
                        self.thread_list()
                        n += 1
                    if n < 2:
                        self.fail("thread-nested needs two thread-lists")
                    break
                self.number(nz=True)
        self.lit(b")")

    def list_ext_item(self):
        """mbox-list-extended-item = tag SP tagged-ext-val (RFC 5258)."""
        self.astring()
        self.sp()
        if self.peek() == b"(":
            self.tagged_ext_comp_list()
        elif self.peek().isdigit():
            self.number(maximum=MAX63)
        else:
            self.astring()

    def tagged_ext_comp_list(self):
        """"(" [tagged-ext-comp] ")": astrings and nested lists."""
        def comp():
            if self.peek() == b"(":
                self.tagged_ext_comp_list()
            else:
                self.astring()
        self.plist(comp, allow_empty=True)

    def namespace(self):
        if self.is_nil():
            self.i += 3
            return
        self.lit(b"(")
        while True:
            self.lit(b"(")
            self.string()
            self.sp()
            if self.is_nil():
                self.i += 3
            else:
                d = self.quoted()
                if len(d) != 1:
                    self.fail("namespace delimiter must be one character")
            while self.opt(b" "):
                self.string()
                self.sp()
                self.plist(self.string, allow_empty=False)
            self.lit(b")")
            if self.opt(b")"):
                return

    # -- FETCH -----------------------------------------------------------
    def msg_att(self):
        self.plist(self.msg_att_item, allow_empty=False)

    def msg_att_item(self):
        j = self.i
        while j < len(self.d) and (self.d[j:j + 1].isalnum()
                                   or self.d[j] == 0x2e):
            j += 1
        if j == self.i:
            self.fail("expected a FETCH item name")
        name, self.i = self.d[self.i:j].upper(), j
        if name == b"FLAGS":
            self.sp()
            self.plist(self.flag)
        elif name == b"ENVELOPE":
            self.sp()
            self.envelope()
        elif name == b"INTERNALDATE":
            self.sp()
            self.date_time()
        elif name in (b"RFC822", b"RFC822.HEADER", b"RFC822.TEXT"):
            self.sp()
            self.nstring()
        elif name == b"RFC822.SIZE":
            self.sp()
            self.number()
        elif name == b"BODYSTRUCTURE":
            self.sp()
            self.body()
        elif name == b"BODY":
            if self.peek() == b"[":
                self.section()
                if self.opt(b"<"):
                    self.number()
                    self.lit(b">")
                self.sp()
                self.nstring()
            else:
                self.sp()
                self.body()
        elif name == b"BINARY":
            self.section_binary()
            if self.opt(b"<"):
                self.number()
                self.lit(b">")
            self.sp()
            if self.peek() == b"~":
                self.literal8()
            else:
                self.nstring()
        elif name == b"BINARY.SIZE":
            self.section_binary()
            self.sp()
            self.number()
        elif name == b"UID":
            self.sp()
            self.number(nz=True)
        elif name == b"MODSEQ":
            self.sp()
            self.lit(b"(")
            self.number(maximum=MAX63)
            self.lit(b")")
        else:
            self.i -= len(name)
            self.fail("unknown FETCH item %r" % name)

    def section_binary(self):
        self.lit(b"[")
        if self.opt(b"]"):
            return
        self.number(nz=True)
        while self.opt(b"."):
            self.number(nz=True)
        self.lit(b"]")

    def section(self):
        self.lit(b"[")
        if self.opt(b"]"):
            return
        if self.peek().isdigit():
            self.number(nz=True)
            while self.opt(b"."):
                if self.peek().isdigit():
                    self.number(nz=True)
                else:
                    if not self.opt(b"MIME"):
                        self.msgtext()
                    break
        else:
            self.msgtext()
        self.lit(b"]")

    def msgtext(self):
        if self.opt(b"HEADER.FIELDS"):
            self.opt(b".NOT")
            self.sp()
            self.plist(self.astring, allow_empty=False)
        elif not (self.opt(b"HEADER") or self.opt(b"TEXT")):
            self.fail("bad section")

    def date_time(self):
        self.lit(b'"')
        if self.opt(b" "):
            self.digits(1)
        else:
            self.digits(2)
        self.lit(b"-")
        if self.peek(3) not in MONTHS:
            self.fail("bad month")
        self.i += 3
        self.lit(b"-")
        self.digits(4)
        self.sp()
        self.digits(2)
        self.lit(b":")
        self.digits(2)
        self.lit(b":")
        self.digits(2)
        self.sp()
        if self.peek() not in (b"+", b"-"):
            self.fail("bad zone")
        self.i += 1
        self.digits(4)
        self.lit(b'"')

    def digits(self, n):
        s = self.peek(n)
        if len(s) != n or not s.isdigit():
            self.fail("expected %d digits" % n)
        self.i += n

    def envelope(self):
        self.lit(b"(")
        self.nstring()          # date
        self.sp()
        self.nstring()          # subject
        for k in range(6):      # from sender reply-to to cc bcc
            self.sp()
            if self.is_nil():
                self.i += 3
            else:
                self.lit(b"(")
                self.address()
                while self.peek() == b"(":
                    self.address()
                self.lit(b")")
        self.sp()
        self.nstring()          # in-reply-to
        self.sp()
        self.nstring()          # message-id
        self.lit(b")")

    def address(self):
        self.lit(b"(")
        for k in range(4):
            if k:
                self.sp()
            self.nstring()
        self.lit(b")")

    def body(self, depth=0):
        if depth > 100:
            self.fail("body nested too deeply")
        self.lit(b"(")
        if self.peek() == b"(":
            # body-type-mpart
            while self.peek() == b"(":
                self.body(depth + 1)
            self.sp()
            self.string()       # media-subtype
            if self.opt(b" "):
                self.fld_param()
                self.ext_tail()
        else:
            mtype = self.string().upper()
            self.sp()
            sub = self.string().upper()
            self.sp()
            self.fld_param()    # body-fields
            self.sp()
            self.nstring()      # id
            self.sp()
            self.nstring()      # description
            self.sp()
            self.string()       # encoding
            self.sp()
            self.number()       # octets
            if mtype == b"MESSAGE" and sub in (b"RFC822", b"GLOBAL"):
                self.sp()
                self.envelope()
                self.sp()
                self.body(depth + 1)
                self.sp()
                self.number()
            elif mtype == b"TEXT":
                self.sp()
                self.number()
            if self.opt(b" "):
                self.nstring()  # md5
                self.ext_tail()
        self.lit(b")")

    def ext_tail(self):
        """[SP dsp [SP lang [SP loc *(SP body-extension)]]]"""
        if not self.opt(b" "):
            return
        if self.is_nil():       # body-fld-dsp
            self.i += 3
        else:
            self.lit(b"(")
            self.string()
            self.sp()
            self.fld_param()
            self.lit(b")")
        if not self.opt(b" "):
            return
        if self.peek() == b"(":  # body-fld-lang
            self.plist(self.string, allow_empty=False)
        else:
            self.nstring()
        if not self.opt(b" "):
            return
        self.nstring()          # body-fld-loc
        while self.opt(b" "):
            self.body_extension()

    def body_extension(self, depth=0):
        if depth > 100:
            self.fail("body extension nested too deeply")
        if self.peek() == b"(":
            self.plist(lambda: self.body_extension(depth + 1),
                       allow_empty=False)
        elif self.peek().isdigit():
            self.number()
        else:
            self.nstring()

    def fld_param(self):
        if self.is_nil():
            self.i += 3
            return

        def pair():
            self.string()
            self.sp()
            self.string()
        self.plist(pair, allow_empty=False)


def validate(data, utf8=False):
    """None if data (one response, literals inlined) is grammatical, else
    why not.  utf8: UTF8=ACCEPT is enabled (UTF-8 in quoted strings)."""
    if isinstance(data, str):
        data = data.encode()
    p = Parser(data, utf8)
    try:
        p.response()
        p.end()
    except Bad as e:
        return str(e)
    return None


def validate_greeting(data, utf8=False):
    """The greeting: "*" SP (resp-cond-auth / resp-cond-bye)."""
    if isinstance(data, str):
        data = data.encode()
    if not (data[:5].upper() in (b"* OK ", b"* BYE")
            or data[:10].upper() == b"* PREAUTH "):
        return "greeting must be * OK, * PREAUTH or * BYE: %r" % data[:40]
    return validate(data, utf8)


class Assembler:
    """Joins response lines (split at CRLF) back into whole responses:
    feed() each line; it returns the complete response (literals inlined)
    once the line ends it, else None."""

    def __init__(self):
        self.cur = None
        self.need = 0

    def feed(self, line):
        if self.cur is None:
            self.cur = line
            return self._tail()
        chunk = line + b"\r\n"
        if len(chunk) <= self.need:
            self.cur += chunk
            self.need -= len(chunk)
            return None         # literal continues (or ended with CRLF)
        # the literal ends inside this line; the response goes on after it
        self.cur += line if self.need <= len(line) else chunk
        self.need = 0
        return self._tail()

    def _tail(self):
        m = re.search(rb"\{(\d+)\}$", self.cur)
        if m and not self.cur.startswith(b"+"):
            self.need = int(m.group(1))
            self.cur += b"\r\n"
            return None
        out, self.cur = self.cur, None
        return out


SELFTEST_GOOD = [
    b"* OK [CAPABILITY IMAP4rev1 LITERAL+ UIDPLUS] server ready",
    b"+ ",
    b"+ Ready for literal data",
    b"a1 OK [READ-WRITE] Completed",
    b"a2 NO [TRYCREATE] Mailbox does not exist",
    b"a3 NO [BADCHARSET (UTF-8 US-ASCII)] unsupported charset",
    b"a4 OK [APPENDUID 38505 3955] APPEND completed",
    b"a5 OK [COPYUID 38505 304,319:320 3956:3958] Done",
    b"a6 OK [MODIFIED 7,9] Conditional STORE failed",
    b"a7 NO [OVERQUOTA] Over quota",
    b"* OK [HIGHESTMODSEQ 715194045007] Highest",
    b"* OK [PERMANENTFLAGS (\\Deleted \\Seen \\*)] Limited",
    b"* CAPABILITY IMAP4rev1 STARTTLS AUTH=PLAIN",
    b'* LIST (\\Noselect \\HasChildren) "/" ~/Mail/foo',
    b'* LIST () NIL "a \\"b\\""',
    b'* LSUB () "." {3}\r\nfoo',
    b"* STATUS blurdybloop (MESSAGES 231 UIDNEXT 44292)",
    b"* STATUS INBOX (MESSAGES 3 SIZE 9007199254740993)",
    b'* LIST (\\Subscribed \\NonExistent) "/" "Fruit/Peach"',
    b'* LIST () "/" "Foo" ("CHILDINFO" ("SUBSCRIBED"))',
    b'* LIST (\\Sent \\HasNoChildren) "." "INBOX.Sent"',
    b'* LIST () "/" "x" ("OLDNAME" ("y") "X-EXT" (a (b c)))',
    b'* MYRIGHTS "INBOX/Sent" "lrswipkxtea"',
    b"* SEARCH 2 84 882 (MODSEQ 917162500)",
    b"* SEARCH",
    b'* ESEARCH (TAG "A282") MIN 2 COUNT 3',
    b'* ESEARCH (TAG "A283") ALL 2,10:11',
    b'* ESEARCH (TAG "A285") UID MIN 7 MAX 3800',
    b'* ESEARCH (TAG "A286") COUNT 15',
    b'* ESEARCH (TAG "a") UID ALL 1:3 MODSEQ 917162500',
    b'* ESEARCH (TAG "A284")',
    b"* ESEARCH COUNT 0",
    b'* ESEARCH (TAG "A1") UID PARTIAL (1:100 200:250,300) COUNT 60',
    b'* ESEARCH (TAG "A2") PARTIAL (501:1000 NIL)',
    b'* ESEARCH (TAG "B01") UID ADDTO (0 32768:32769)',
    b'* ESEARCH (TAG "C01") UID ADDTO (1 2733 1 2732) REMOVEFROM (0 5)',
    b"* SORT 2 84 882",
    b"* SORT",
    b"* THREAD (2)(3 6 (4 23)(44 7 96))",
    b"* THREAD ((3)(5))",
    b"* THREAD",
    b"* FLAGS (\\Answered \\Flagged \\Deleted \\Seen \\Draft $Forwarded)",
    b"* 23 EXISTS",
    b"* 0 RECENT",
    b"* ENABLED CONDSTORE",
    b'* ID ("name" "Cyrus" "version" NIL)',
    b'* NAMESPACE (("" "/")) NIL (("shared/" "/"))',
    b'* 12 FETCH (FLAGS (\\Seen) INTERNALDATE " 7-Feb-1994 21:52:25 -0800"'
    b' RFC822.SIZE 4286 UID 7 MODSEQ (12121231000))',
    b'* 12 FETCH (ENVELOPE ("Wed, 17 Jul 1996 02:23:25 -0700 (PDT)" '
    b'"IMAP4rev1 WG mtg summary and minutes" (("Terry Gray" NIL "gray" '
    b'"cac.washington.edu")) NIL NIL ((NIL NIL "imap" "cac.washington.edu"))'
    b' ((NIL NIL "undisclosed" NIL)(NIL NIL NIL NIL)) NIL NIL '
    b'"<B27397-0100000@cac.washington.edu>"))',
    b'* 12 FETCH (BODYSTRUCTURE (("TEXT" "PLAIN" ("CHARSET" "US-ASCII") NIL'
    b' NIL "7BIT" 1152 23 NIL NIL NIL NIL)("MESSAGE" "RFC822" NIL NIL NIL '
    b'"7BIT" 100 (NIL NIL NIL NIL NIL NIL NIL NIL NIL NIL) ("TEXT" "PLAIN" '
    b'NIL NIL NIL "7BIT" 3 1) 5) "MIXED" ("BOUNDARY" "x") ("inline" NIL) '
    b'("en" "de") "loc" 1 (2 "x")))',
    b'* 1 FETCH (BODY[HEADER.FIELDS (FROM SUBJECT)]<0> {5}\r\nab\r\n\r UID 1)',
    b'* 1 FETCH (BODY[1.2.MIME] NIL BODY[] "")',
    b"* ACL INBOX Fred rwipslxetad -Fred wetd",
    b'* ACL "a b"',
    b'* LISTRIGHTS ~/Mail/saved smith la r swicdkxte',
    b'* LISTRIGHTS INBOX anyone "" l r s',
    b"* MYRIGHTS INBOX rwiptsldaex",
    b'* QUOTA "" (STORAGE 10 512)',
    b"* QUOTA user.a (STORAGE 0 100 MESSAGE 3 1000)",
    b'* QUOTAROOT INBOX ""',
    b"* QUOTAROOT comp.mail.mime",
    b"a1 OK [CLOSED] Closed",
    b"* VANISHED (EARLIER) 41,43:116,118,120:211,214:540",
    b"* VANISHED 405,407,410,425",
    b'* 1 FETCH (BINARY[1] ~{3}\r\na\0b BINARY.SIZE[1] 3 UID 1)',
    b'* 1 FETCH (BINARY[1.2]<0> {2}\r\nab BINARY[] NIL BINARY[3] "")',
    b"a1 NO [UNKNOWN-CTE] Cannot decode",
]
SELFTEST_BAD = [
    b'* 12 FETCH (FLAGS (\\Seen) UID 7',
    b'* 12 FETCH (FLAGS (\\Seen)) UID 7)',
    b'* 12 FETCH (INTERNALDATE "7-Feb-1994 21:52:25 -0800")',
    b'* 12 FETCH (BODY[] {10}\r\nshort)',
    b"a1 FOO done",
    b"* CAPABILITY STARTTLS",
    b'* LIST (\\Noselect) "//" foo',
    b"* SEARCH 0",
    b'* ESEARCH (TAG "a") MIN 0',
    b'* ESEARCH (TAG "a") COUNT 1 COUNT 2',
    b'* ESEARCH (TAG "a") FOO 1',
    b'* ESEARCH (TAG "a") PARTIAL (0:5 1)',
    b'* ESEARCH (TAG "a") PARTIAL (1:5)',
    b'* ESEARCH (TAG "a") PARTIAL 1:5 1',
    b'* ESEARCH (TAG "a") ALL 1 PARTIAL (1:5 1)',
    b'* ESEARCH (TAG "a") ADDTO ()',
    b'* ESEARCH (TAG "a") ADDTO (1)',
    b'* ESEARCH (TAG "a") REMOVEFROM (0 *)',
    b"* SORT 0",
    b"* THREAD (2)(3 (4))",
    b"* THREAD ((3))",
    b"* THREAD ()",
    b"* OK [UIDNEXT abc] x",
    b"* OK [PERMANENTFLAGS (\\Seen )] Ok",
    b"* OK [UIDVALIDITY 0] x",
    b'* ID ("name")',
    b"a1 OK [READ-WRITE]trailing",
    b"* 3 EXISTS extra",
    b'* LIST () "/" "a\rb"',
    b'* LIST () "/" "Foo" ("CHILDINFO")',
    b'* LIST () "/" "Foo" ("CHILDINFO" ("SUBSCRIBED")',
    b'* LIST () "/" "Foo" CHILDINFO',
    b"* STATUS x (SIZE)",
    b"",
    b"* ACL INBOX Fred",
    b"* ACL INBOX Fred RW",
    b'* MYRIGHTS INBOX ""',
    b"* QUOTA root ()",
    b"* QUOTA root (STORAGE 10)",
    b"* QUOTAROOT",
    b"* VANISHED",
    b"* VANISHED (EARLIER)",
    b"* VANISHED (LATER) 1",
    b"* VANISHED 1:*",
    b"* VANISHED 0",
    b'* 1 FETCH (BINARY[1] {3}\r\na\0b)',
    b'* 1 FETCH (BINARY[1.TEXT] "")',
    b'* 1 FETCH (BINARY.SIZE[1]<0> 3)',
    b'* LIST () "." "Entw\xc3\xbcrfe"',
]


def selftest():
    for r in SELFTEST_GOOD:
        why = validate(r)
        if why is not None:
            raise AssertionError("valid response rejected: %r: %s"
                                 % (r, why))
    for r in SELFTEST_BAD:
        if validate(r) is None:
            raise AssertionError("invalid response accepted: %r" % r)
    if validate(b'* LIST () "." "Entw\xc3\xbcrfe"', utf8=True) is not None:
        raise AssertionError("UTF-8 quoted string refused with utf8")
    if validate(b'* LIST () "." "Entw\xfcrfe"', utf8=True) is None:
        raise AssertionError("invalid UTF-8 accepted")
    a = Assembler()
    got = [a.feed(x) for x in (b"* 1 FETCH (BODY[] {7}", b"ab", b"c) UID 1)")]
    if got != [None, None, b"* 1 FETCH (BODY[] {7}\r\nab\r\nc) UID 1)"]:
        raise AssertionError("Assembler: %r" % got)


selftest()
