#!/usr/bin/env python3
"""test_vdomain.py - imapd with virtual domains (virtdomains: userid, on,
off), end to end under the real master, with lmtpd beside it.

Two domains with the same local parts, example.com and example.org
(alice, bob, postmaster in each), domain-less users (alice, carol, the
global admin `admin`) and `defaultdomain: example.net` (alice@example.net
is the domain-less alice).  Every user has a password of its own in the
sasldb (realm = its domain, the servername's realm for domain-less
users), so a login that reached the wrong user would fail.  `admins:
admin dadmin@example.com`: a global admin and example.com's admin.

- userid: each login sees only its own domain (LIST, LSUB, STATUS,
  SELECT); LMTP deliveries to alice@example.com, alice@example.org,
  alice, alice@EXAMPLE.NET land only in the right INBOX, byte-checked
  over IMAP; names of another domain are refused or nonexistent for
  every command, and nothing is created outside the user's domain; ACL
  identifiers are per domain; example.com's admin administers
  example.com only, the global admin every domain; quota is per domain
  user; domain-like garbage in a login or a mailbox name gets NO and the
  session goes on.
- on: the master listens on 127.0.0.1..5; a preload library
  (fakehosts.so) gives 127.0.0.2 the name imap.example.com, 127.0.0.3
  MX.EXAMPLE.ORG, 127.0.0.4 mail.example.net (the default domain),
  127.0.0.5 the one-label "mailhost", and 127.0.0.1 none: a login without
  a domain takes the domain after the first label of the name, and the
  password is checked for that user.
- off: the domain of a login is dropped (alice@example.com is alice),
  garbage is still refused.

Environment: see imaphelp.py.
"""
import base64
import imaplib
import os
import smtplib
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, LMTPD, SERVERNAME, TOP_BUILDDIR,  # noqa: E402
                      ImapInstance, Raw, check, make_message, make_sasldb,
                      parse_list, run_imap_tests, service_line, free_port)

DOMAINS = ("example.com", "example.org")
LOCALS = ("alice", "bob", "postmaster")
PLAIN_USERS = ("alice", "carol", "admin")
DEFAULT = "example.net"
FAKEHOSTS = os.path.join(TOP_BUILDDIR, "tests", "imapd", "fakehosts.so")


def pw(userid):
    return "pw-" + userid


def sasl_users(i):
    for d in DOMAINS:
        for u in LOCALS:
            make_sasldb(i.sasldb, u, pw(u + "@" + d), [d])
    make_sasldb(i.sasldb, "dadmin", pw("dadmin@example.com"),
                ["example.com"])
    for u in PLAIN_USERS:
        if u != "alice":
            make_sasldb(i.sasldb, u, pw(u), [SERVERNAME])


def mailboxes(i):
    for pre in ("",) + tuple(d + "!" for d in DOMAINS):
        i.create(pre + "user.alice")
        i.create(pre + "user.alice.Sent")
        i.create(pre + "shared.news", {"anyone": "lrs"})
    for d in DOMAINS:
        for u in ("bob", "postmaster"):
            i.create(d + "!user." + u)
    i.create("user.carol")
    # a message only in each shared.news, to tell them apart
    for pre, tag in (("", "nodomain"), ("example.com!", "example.com"),
                     ("example.org!", "example.org")):
        i.mbtool("deliver", "-M", pre + "shared.news",
                 input=make_message(msgid="news-%s@test" % tag,
                                    subject="news " + tag))


def new_instance(name, mode, extra=None):
    conf = {"virtdomains": mode, "defaultdomain": DEFAULT,
            "admins": "admin dadmin@example.com", "allowplaintext": "yes",
            "sasl_mech_list": "PLAIN LOGIN"}
    conf.update(extra or {})
    i = ImapInstance(name, conf=conf, sasl=("alice", pw("alice")))
    try:
        sasl_users(i)
        mailboxes(i)
    except BaseException:
        i.cleanup()
        raise
    return i


_inst = None


def inst():
    """The virtdomains: userid instance."""
    global _inst
    if _inst is None:
        i = new_instance("vd-userid", "userid")
        try:
            i.write_cyrus_conf(imaps=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def login(user, password=None, addr=None, i=None):
    m = IMAP4(*(addr or (i or inst()).addr()), timeout=20)
    m.login(user, password if password is not None else pw(user))
    return m


def close(m):
    try:
        m.logout()
    except (imaplib.IMAP4.error, OSError):
        pass


def list_names(m, pat="*"):
    typ, data = m.list('""', pat)
    check(typ == "OK", "LIST %r: %s %r" % (pat, typ, data))
    return set(parse_list([b"* LIST " + d for d in data if d]))


def lsub_names(m):
    typ, data = m.lsub('""', "*")
    check(typ == "OK", "LSUB: %s %r" % (typ, data))
    return set(parse_list([b"* LSUB " + d for d in data if d], "LSUB"))


def fetch_all(m, mailbox="INBOX"):
    """[message bytes] of a mailbox, in uid order (read-only)."""
    typ, data = m.select('"%s"' % mailbox, readonly=True)
    check(typ == "OK", "EXAMINE %s: %s %r" % (mailbox, typ, data))
    typ, data = m.uid("FETCH", "1:*", "(RFC822.SIZE BODY.PEEK[])")
    check(typ == "OK", "FETCH: %s %r" % (typ, data))
    out = []
    for d in data:
        if isinstance(d, tuple):
            size = int(d[0].split(b"RFC822.SIZE ")[1].split()[0])
            check(size == len(d[1]), "RFC822.SIZE %d but %d bytes"
                  % (size, len(d[1])))
            out.append(d[1])
    m.close()
    return out


def no_text(fn, *args):
    """An imaplib call that must answer NO: its text."""
    try:
        typ, data = fn(*args)
    except imaplib.IMAP4.error as e:
        return str(e)
    check(typ == "NO", "expected NO, got %s %r" % (typ, data))
    return b" ".join(d for d in data if d).decode()


def mailbox_list(i):
    _, out, _ = i.mbtool("list")
    return sorted(line.split()[0] for line in out.splitlines() if line)


def lmtp_deliver(i, rcpts, message):
    """Deliver over LMTP (smtplib.LMTP on lmtpd's UNIX socket): {rcpt:
    (code, text)} for the refused ones."""
    c = smtplib.LMTP(i.unix_socket)
    try:
        return c.sendmail("sender@example.org", rcpts, message)
    finally:
        c.quit()


# ---- virtdomains: userid ---------------------------------------------------

def test_userid_logins():
    # every user with its own password; the name is what it logged in as
    for d in DOMAINS:
        for u in LOCALS:
            close(login(u + "@" + d))
            # the same local part with another domain's password: refused
            other = DOMAINS[1] if d == DOMAINS[0] else DOMAINS[0]
            text = no_text(IMAP4(*inst().addr(), timeout=20).login,
                           u + "@" + d, pw(u + "@" + other))
            check("AUTHENTICATIONFAILED" in text, "%s@%s with %s's password: "
                  "%s" % (u, d, other, text))
    close(login("alice"))
    # AUTHENTICATE PLAIN the same way (user and authorization id)
    for authz in ("", "bob@EXAMPLE.org"):
        m = IMAP4(*inst().addr(), timeout=20)
        typ, data = m.authenticate("PLAIN", lambda _: (
            "%s\0bob@example.org\0%s" % (authz, pw("bob@example.org"))
        ).encode())
        check(typ == "OK", "AUTHENTICATE PLAIN bob@example.org: %r" % data)
        check(list_names(m) == {"INBOX", "shared.news"}, "bob@example.org")
        close(m)
    # the domain is lower-cased; the default domain is the domain-less
    # user (checked with the domain-less alice's password)
    close(login("alice@EXAMPLE.com", pw("alice@example.com")))
    close(login("alice@Example.NET", pw("alice")))
    text = no_text(IMAP4(*inst().addr(), timeout=20).login, "alice",
                   pw("alice@example.com"))
    check("AUTHENTICATIONFAILED" in text, "alice with example.com's "
          "password: %s" % text)
    log = inst().log()
    for who in ("alice@example.com", "bob@example.org", "alice"):
        check("login user=<%s> mech=<LOGIN>" % who in log,
              "no login of %s logged" % who)
    check("user=<alice@Example.NET>" not in log and
          "user=<alice@example.net>" not in log,
          "the default domain was not stripped")


def test_userid_list_per_domain():
    want = {"INBOX", "INBOX.Sent", "shared.news"}
    for who in ("alice@example.com", "alice@example.org", "alice"):
        m = login(who)
        try:
            names = list_names(m)
            check(names == want, "LIST * of %s: %r" % (who, sorted(names)))
            check(list_names(m, "%") == {"INBOX", "shared"},
                  "LIST %% of %s: %r" % (who, list_names(m, "%")))
            typ, data = m.namespace()
            check(typ == "OK" and data[0] ==
                  b'(("INBOX." ".")) (("user." ".")) (("" "."))',
                  "NAMESPACE of %s: %r" % (who, data))
            # shared.news is the domain's own
            tag = who.split("@")[1] if "@" in who else "nodomain"
            msgs = fetch_all(m, "shared.news")
            check(len(msgs) == 1 and b"<news-%s@test>" % tag.encode()
                  in msgs[0], "shared.news of %s: %r" % (who, msgs))
            typ, data = m.subscribe("INBOX.Sent")
            check(typ == "OK", "SUBSCRIBE: %r" % data)
            check(lsub_names(m) == {"INBOX.Sent"}, "LSUB of %s: %r"
                  % (who, lsub_names(m)))
        finally:
            close(m)
    # bob@example.com's own mailboxes only
    m = login("bob@example.com")
    try:
        names = list_names(m)
        check(names == {"INBOX", "shared.news"}, "LIST of bob@example.com: "
              "%r" % sorted(names))
    finally:
        close(m)
    # subscriptions are per (user, domain): one each, not three
    m = login("alice@example.org")
    try:
        typ, data = m.unsubscribe("INBOX.Sent")
        check(typ == "OK", "UNSUBSCRIBE %r" % data)
        check(lsub_names(m) == set(), "LSUB after UNSUBSCRIBE %r"
              % lsub_names(m))
    finally:
        close(m)
    m = login("alice@example.com")
    try:
        check(lsub_names(m) == {"INBOX.Sent"}, "alice@example.com lost her "
              "subscription with alice@example.org's: %r" % lsub_names(m))
    finally:
        close(m)


def test_userid_lmtp_byte_checked():
    i = inst()
    sent = {}
    for rcpt, owner in (("alice@example.com", "alice@example.com"),
                        ("alice@example.org", "alice@example.org"),
                        ("alice", "alice"),
                        ("alice@EXAMPLE.NET", "alice"),
                        ("bob@example.com", "bob@example.com"),
                        ("postmaster@example.org", "postmaster@example.org")):
        msg = make_message(msgid="lmtp-%s@test" % rcpt.lower(),
                           subject="for " + rcpt,
                           body="only for %s\r\n" % rcpt)
        refused = lmtp_deliver(i, [rcpt], msg)
        check(not refused, "LMTP to %s refused: %r" % (rcpt, refused))
        sent.setdefault(owner, []).append(msg)
    # one message to both alices of the two domains at once
    msg = make_message(msgid="both@test", body="both\r\n")
    check(not lmtp_deliver(i, ["alice@example.com", "alice@example.org"],
                           msg), "LMTP to two domains")
    for owner in ("alice@example.com", "alice@example.org"):
        sent[owner].append(msg)
    for owner in ("alice@example.com", "alice@example.org", "alice",
                  "bob@example.com", "postmaster@example.org",
                  "bob@example.org", "postmaster@example.com"):
        m = login(owner)
        try:
            got = fetch_all(m)
        finally:
            close(m)
        want = sent.get(owner, [])
        check(len(got) == len(want), "INBOX of %s: %d messages, want %d"
              % (owner, len(got), len(want)))
        for g, w in zip(got, want):
            # lmtpd puts Return-Path and Received before the message
            check(g.endswith(w) and g.startswith(b"Return-Path: "),
                  "INBOX of %s holds %r, want ...%r" % (owner, g[:300], w))


def test_userid_cross_domain_refused():
    i = inst()
    before = mailbox_list(i)
    m = login("alice@example.com")
    try:
        for name in ("user.alice@example.org", "user/alice@example.org",
                     "shared.news@example.org", "example.org!user.alice",
                     "INBOX.Sent@example.org", "user.bob@example.org"):
            for fn, args in ((m.select, ('"%s"' % name,)),
                             (m.status, ('"%s"' % name, "(MESSAGES)")),
                             (m.create, ('"%s"' % name,)),
                             (m.delete, ('"%s"' % name,)),
                             (m.rename, ("INBOX.Sent", '"%s"' % name)),
                             (m.subscribe, ('"%s"' % name,)),
                             (m.append, ('"%s"' % name, None, None,
                                         make_message()))):
                text = no_text(fn, *args)
                check("invalid mailbox name" in text.lower(), "%s %s: %s"
                      % (fn.__name__, name, text))
        # a name without a domain is the user's own domain's: user.bob is
        # example.com's bob, whose INBOX alice may not see
        text = no_text(m.select, "user.bob")
        check("NONEXISTENT" in text, "SELECT user.bob: %s" % text)
        # the domain-less alice's mailboxes cannot be named at all
        check(list_names(m, "*@*") == set(), "LIST *@*")
        typ, _ = m.select("shared.news", readonly=True)
        check(typ == "OK", "EXAMINE shared.news")
        text = no_text(m.copy, "1:*", '"shared.news@example.org"')
        check("Invalid mailbox name" in text, "COPY: %s" % text)
        m.close()
    finally:
        close(m)
    # the domain-less alice cannot reach a domain either
    m = login("alice")
    try:
        for name in ("user.alice@example.com", "example.com!user.alice"):
            text = no_text(m.select, '"%s"' % name)
            check("Invalid mailbox name" in text, "SELECT %s: %s"
                  % (name, text))
        typ, _ = m.create("INBOX.Mine")
        check(typ == "OK", "CREATE INBOX.Mine")
    finally:
        close(m)
    after = mailbox_list(i)
    check(sorted(set(after) - set(before)) == ["user.alice.Mine"],
          "mailboxes created: %r" % (set(after) - set(before)))
    i.mbtool("delete", "user.alice.Mine")


def test_userid_acl_identifiers():
    i = inst()
    i.create("example.com!user.alice.Project",
             {"bob@example.com": "lr", "bob": "lr"})
    i.create("example.org!user.alice.Project")
    for who, visible in (("bob@example.com", True),
                         ("bob@example.org", False),
                         ("postmaster@example.com", False)):
        m = login(who)
        try:
            names = list_names(m, "user.*")
            check(("user.alice.Project" in names) == visible,
                  "%s: LIST user.*: %r" % (who, names))
            typ, data = m.status("user.alice.Project", "(MESSAGES)")
            check((typ == "OK") == visible, "%s: STATUS: %s %r"
                  % (who, typ, data))
        finally:
            close(m)
    # the entry "bob" (a domain-less user id) is not example.com's bob:
    # without "bob@example.com" he sees nothing
    i.mbtool("setacl", "example.com!user.alice.Project", "bob@example.com",
             "none")
    m = login("bob@example.com")
    try:
        check(list_names(m, "user.*") == set(), "bob@example.com after "
              "his entry was removed")
    finally:
        close(m)
    i.mbtool("delete", "example.com!user.alice.Project")
    i.mbtool("delete", "example.org!user.alice.Project")


def test_userid_domain_admin():
    i = inst()
    m = login("dadmin@example.com")
    try:
        names = list_names(m)
        check(names == {"user.alice", "user.alice.Sent", "user.bob",
                        "user.postmaster", "shared.news"},
              "LIST of example.com's admin: %r" % sorted(names))
        typ, data = m.create("user.newbie")
        check(typ == "OK", "CREATE user.newbie: %r" % data)
        typ, data = m.create("user.bob.Archive")
        check(typ == "OK", "CREATE user.bob.Archive: %r" % data)
        check({"example.com!user.newbie", "example.com!user.bob.Archive"}
              <= set(mailbox_list(i)), "not created in example.com")
        typ, data = m.delete("user.bob.Archive")
        check(typ == "OK", "DELETE user.bob.Archive: %r" % data)
        typ, data = m.delete("user.newbie")
        check(typ == "OK", "DELETE user.newbie: %r" % data)
        # no rights anywhere else, not even by the global admin's syntax
        for name in ("user.bob@example.org", "user.alice@example.net"):
            text = no_text(m.select, '"%s"' % name)
            check("Invalid mailbox name" in text, "SELECT %s: %s"
                  % (name, text))
        before = mailbox_list(i)
        text = no_text(m.create, '"user.x@example.org"')
        check("Invalid mailbox name" in text, "CREATE: %s" % text)
        check(mailbox_list(i) == before, "a mailbox was created")
    finally:
        close(m)
    check("admin=<domain>" in i.log(), "the domain admin's login")
    # a user of example.org of the same name is nobody's admin
    make_sasldb(i.sasldb, "dadmin", pw("dadmin@example.org"),
                ["example.org"])
    m = login("dadmin@example.org")
    try:
        check(list_names(m) == {"shared.news"}, "dadmin@example.org")
        text = no_text(m.create, "user.newbie")
        check("NOPERM" in text, "CREATE by dadmin@example.org: %s" % text)
    finally:
        close(m)


def test_userid_global_admin():
    i = inst()
    m = login("admin")
    try:
        names = list_names(m)
        for n in ("user.alice", "user.carol", "shared.news",
                  "user.alice@example.com", "user.alice.Sent@example.org",
                  "user.bob@example.org", "shared.news@example.com"):
            check(n in names, "%s not in the global admin's LIST: %r"
                  % (n, sorted(names)))
        # byte for byte the same message as its owner reads
        typ, data = m.select('"shared.news@example.org"', readonly=True)
        check(typ == "OK", "SELECT shared.news@example.org: %r" % data)
        typ, data = m.fetch("1", "(BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
        check(b"news-example.org@test" in data[0][1], "wrong mailbox: %r"
              % data)
        m.close()
        typ, data = m.create('"user.zed@example.org"')
        check(typ == "OK", "CREATE user.zed@example.org: %r" % data)
        check("example.org!user.zed" in mailbox_list(i), "not created in "
              "the domain")
        # "@DEFAULTDOMAIN" is the domain-less name
        typ, data = m.create('"user.carol.Old@EXAMPLE.NET"')
        check(typ == "OK", "CREATE user.carol.Old@EXAMPLE.NET: %r" % data)
        check("user.carol.Old" in mailbox_list(i), "user.carol.Old")
        typ, data = m.delete('"user.carol.Old"')
        check(typ == "OK", "DELETE user.carol.Old: %r" % data)
        text = no_text(m.rename, '"user.zed@example.org"',
                       '"user.zed@example.com"')
        check("another domain" in text, "RENAME across domains: %s" % text)
        typ, data = m.delete('"user.zed@example.org"')
        check(typ == "OK", "DELETE: %r" % data)
    finally:
        close(m)


def test_userid_quota_per_domain_user():
    i = inst()
    i.quota("example.com!user.alice", 1)
    try:
        big = make_message(msgid="big@test", body=b"x" * 3000 + b"\r\n")
        m = login("alice@example.com")
        try:
            text = no_text(m.append, "INBOX", None, None, big)
            check("OVERQUOTA" in text, "APPEND over quota: %s" % text)
        finally:
            close(m)
        for who in ("alice@example.org", "alice"):
            m = login(who)
            try:
                typ, data = m.append("INBOX.Sent", None, None, big)
                check(typ == "OK", "APPEND of %s: %r" % (who, data))
            finally:
                close(m)
        refused = lmtp_deliver(i, ["alice@example.com", "alice@example.org"],
                               big)
        check(list(refused) == ["alice@example.com"] and
              refused["alice@example.com"][0] in (452, 552),
              "LMTP over quota: %r" % refused)
    finally:
        i.mbtool("quota", "remove", "example.com!user.alice")


BAD_LOGINS = ["alice@", "alice@.", "alice@a..b", "alice@[127.0.0.1]",
              "alice@" + "a" * 300 + ".com",
              "alice@" + ".".join(["abcdefghi"] * 30),
              "al!ce@example.com", "alice@exa!mple.com",
              "al/ice@example.com", "alice@exa/mple.com",
              "alice@example.com@example.org", "@example.com",
              "alice@-example.com", "alice@example.com."]


def test_userid_bad_logins():
    i = inst()
    before = mailbox_list(i)
    with Raw(i.addr()) as c:
        c.line()
        for n, name in enumerate(BAD_LOGINS):
            r = c.cmd("b%d" % n, 'LOGIN "%s" "x"' % name)
            check(r[-1].startswith(b"b%d NO [AUTHENTICATIONFAILED] Invalid "
                                   b"user name: " % n),
                  "LOGIN %r: %r" % (name, r))
            r = c.cmd("n%d" % n, "NOOP")
            check(r[-1] == b"n%d OK NOOP completed" % n, "NOOP %r" % r)
        # a name SASL knows (a sasldb realm "a..b") is refused all the same
        make_sasldb(i.sasldb, "alice", "pw-bad-realm", ["a..b"])
        for n, how in enumerate(('LOGIN "alice@a..b" "pw-bad-realm"',
                                 "AUTHENTICATE PLAIN " + base64.b64encode(
                                     b"\0alice@a..b\0pw-bad-realm").decode())):
            r = c.cmd("k%d" % n, how)
            check(r[-1] == b"k%d NO [AUTHENTICATIONFAILED] Invalid user "
                  b"name: empty domain label" % n, "%s: %r" % (how, r))
        # and the session goes on to a good login
        r = c.cmd("ok", 'LOGIN "alice@example.org" "%s"'
                  % pw("alice@example.org"))
        check(r[-1].startswith(b"ok OK"), "good LOGIN after bad ones %r" % r)
    check(mailbox_list(i) == before, "bad logins changed the mailboxes")


def test_userid_bad_names():
    i = inst()
    before = mailbox_list(i)
    m = login("alice@example.com")
    try:
        for name in ("INBOX.a!b", "INBOX/x", "a!b", "example.com!user.bob",
                     "INBOX.x@example.org", "user.x@", "user.x@a..b",
                     "user.x@[127.0.0.1]", "shared.x@.",
                     "INBOX.x@" + "a" * 300 + ".com"):
            for fn, args in ((m.create, ('"%s"' % name,)),
                             (m.select, ('"%s"' % name,))):
                text = no_text(fn, *args)
                check("Invalid mailbox name" in text, "%s %r: %s"
                      % (fn.__name__, name, text))
        typ, _ = m.noop()
        check(typ == "OK", "NOOP after bad names")
    finally:
        close(m)
    check(mailbox_list(i) == before, "bad names created %r"
          % (set(mailbox_list(i)) - set(before)))


def test_userid_unixsep():
    """unixhierarchysep: '/' separates, '.' is a byte of a name, and a
    domain is still only '@' at the end (global admin) or the login's."""
    i = new_instance("vd-unixsep", "userid", {"unixhierarchysep": "yes"})
    with i:
        i.create("example.com!user.alice.a^b")
        i.write_cyrus_conf(imaps=False)
        i.start()
        m = login("alice@example.com", None, None, i)
        try:
            names = list_names(m)
            check(names == {"INBOX", "INBOX/Sent", "INBOX/a.b",
                            "shared/news"}, "LIST: %r" % sorted(names))
            for name in ("user/alice@example.org", "INBOX/x@example.org",
                         "user/alice/Sent@example.org"):
                text = no_text(m.select, '"%s"' % name)
                check("Invalid mailbox name" in text, "SELECT %s: %s"
                      % (name, text))
        finally:
            close(m)
        m = login("admin", None, None, i)
        try:
            names = list_names(m)
            for n in ("user/alice", "user/alice@example.com",
                      "user/alice/Sent@example.com",
                      "user/alice/a.b@example.com",
                      "shared/news@example.org"):
                check(n in names, "%s not in %r" % (n, sorted(names)))
            typ, data = m.create('"user/alice/a.b/c@example.com"')
            check(typ == "OK", "CREATE user/alice/a.b/c@example.com: %r"
                  % data)
            check("example.com!user.alice.a^b.c" in mailbox_list(i),
                  "created as %r" % mailbox_list(i))
        finally:
            close(m)


# ---- virtdomains: on --------------------------------------------------------

HOSTS = {"127.0.0.2": "imap.example.com", "127.0.0.3": "MX.EXAMPLE.ORG",
         "127.0.0.4": "mail.example.net", "127.0.0.5": "mailhost"}


def test_on_serverdomain():
    check(os.path.exists(FAKEHOSTS), "%s not built (make check builds it)"
          % FAKEHOSTS)
    i = new_instance("vd-on", "on")
    with i:
        hosts = i.path("hosts")
        with open(hosts, "w") as f:
            for a, n in HOSTS.items():
                f.write("%s %s\n" % (a, n))
        ports = {}
        lines = []
        for k, addr in enumerate(["127.0.0.1"] + sorted(HOSTS)):
            ports[addr] = free_port()
            lines.append(service_line("imap" if k == 0 else "imap%d" % k,
                                      "imapd", "%s:%d" % (addr, ports[addr]),
                                      prefork=1 if k == 0 else 0,
                                      maxchild=5))
        lines.append(service_line("lmtpunix", LMTPD, i.unix_socket,
                                  prefork=0, maxchild=5))
        with open(i.cyrus_conf, "w") as f:
            f.write("SERVICES {\n" + "".join(lines) + "}\n")
        i.tcp_port = ports["127.0.0.1"]
        saved = {k: os.environ.get(k) for k in ("LD_PRELOAD",
                                                "FAKEHOSTS_FILE",
                                                "ASAN_OPTIONS")}
        os.environ["LD_PRELOAD"] = FAKEHOSTS
        os.environ["FAKEHOSTS_FILE"] = hosts
        # the sanitizer runtime need not come first in a preloaded list
        os.environ["ASAN_OPTIONS"] = ":".join(
            x for x in (saved["ASAN_OPTIONS"], "verify_asan_link_order=0")
            if x)
        try:
            i.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        # deliveries to tell the INBOXes apart
        for rcpt in ("alice@example.com", "alice@example.org", "alice"):
            refused = lmtp_deliver(i, [rcpt], make_message(
                msgid="on-%s@test" % rcpt, body="for %s\r\n" % rcpt))
            check(not refused, "LMTP %s: %r" % (rcpt, refused))
        for addr, owner in (("127.0.0.1", "alice"),
                            ("127.0.0.2", "alice@example.com"),
                            ("127.0.0.3", "alice@example.org"),
                            ("127.0.0.4", "alice"),
                            ("127.0.0.5", "alice")):
            m = login("alice", pw(owner), (addr, ports[addr]), i)
            try:
                msgs = fetch_all(m)
                check(len(msgs) == 1 and (b"<on-%s@test>" % owner.encode())
                      in msgs[0], "alice on %s: %r" % (addr, msgs))
            finally:
                close(m)
            check("login user=<%s> mech=<LOGIN> peer=<%s" % (owner, addr)
                  in i.log() or "login user=<%s> mech=<LOGIN>" % owner
                  in i.log(), "login of %s not logged" % owner)
        # the password is checked for the user of the server's domain
        for addr, wrong in (("127.0.0.2", "alice"),
                            ("127.0.0.2", "alice@example.org"),
                            ("127.0.0.3", "alice@example.com")):
            text = no_text(IMAP4(addr, ports[addr], timeout=20).login,
                           "alice", pw(wrong))
            check("AUTHENTICATIONFAILED" in text, "alice on %s with %s's "
                  "password: %s" % (addr, wrong, text))
        # carol exists only without a domain: not on example.com's address
        text = no_text(IMAP4("127.0.0.2", ports["127.0.0.2"],
                             timeout=20).login, "carol", pw("carol"))
        check("AUTHENTICATIONFAILED" in text, "carol on 127.0.0.2: %s" % text)
        # an explicit domain wins over the address's
        m = login("alice@example.org", None,
                  ("127.0.0.2", ports["127.0.0.2"]), i)
        try:
            msgs = fetch_all(m)
            check(len(msgs) == 1 and b"<on-alice@example.org@test>"
                  in msgs[0], "alice@example.org on 127.0.0.2: %r" % msgs)
        finally:
            close(m)


# ---- virtdomains: off -------------------------------------------------------

def test_off_domain_dropped():
    i = new_instance("vd-off", "off")
    with i:
        i.write_cyrus_conf(imaps=False)
        i.start()
        refused = lmtp_deliver(i, ["alice@example.com"], make_message(
            msgid="off@test", body="off\r\n"))
        check(not refused, "LMTP: %r" % refused)
        for who in ("alice", "alice@example.com", "alice@EXAMPLE.ORG"):
            # always the domain-less alice, with her password
            m = login(who, pw("alice"), None, i)
            try:
                names = list_names(m)
                check(names == {"INBOX", "INBOX.Sent", "shared.news"},
                      "LIST of %s: %r" % (who, sorted(names)))
                msgs = fetch_all(m)
                check(len(msgs) == 1 and b"<off@test>" in msgs[0],
                      "INBOX of %s: %r" % (who, msgs))
            finally:
                close(m)
        check("login user=<alice@" not in i.log(), "a domain was kept")
        with Raw(i.addr()) as c:
            c.line()
            for n, name in enumerate(("alice@a..b", "alice@",
                                      "alice@[127.0.0.1]")):
                r = c.cmd("b%d" % n, 'LOGIN "%s" "x"' % name)
                check(r[-1].startswith(b"b%d NO [AUTHENTICATIONFAILED] "
                                       b"Invalid user name" % n),
                      "LOGIN %r: %r" % (name, r))


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_userid_logins,
        test_userid_list_per_domain,
        test_userid_lmtp_byte_checked,
        test_userid_cross_domain_refused,
        test_userid_acl_identifiers,
        test_userid_domain_admin,
        test_userid_global_admin,
        test_userid_quota_per_domain_user,
        test_userid_bad_logins,
        test_userid_bad_names,
        test_userid_unixsep,
        test_on_serverdomain,
        test_off_domain_dropped,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
