#!/usr/bin/env python3
"""test_vdomain.py - virtual domains on the delivery side, end to end.

Two domains with the same local parts (alice, bob, postmaster) plus the
domain-less users of the defaultdomain (main.example), under each
`virtdomains` value (off, userid, on), behind a real master and lmtpd:
every LMTP delivery must land in exactly the right mailbox (each message
carries a token naming its recipient; the spool of every mailbox is read
back, file against index record, and must hold exactly its own
messages, byte for byte after the two headers lmtpd adds), with plus
addressing, +shared.folder@DOMAIN, quota per domain user and unknown
domains or users refused with 550 5.1.1.  Domain-like garbage gets a
clear 5xx and never creates or reaches a mailbox (the mailbox list and
the spool tree are compared before and after), and the worker that
served it goes on delivering.  mbtool takes both name forms, lists and
filters by domain and deletes a whole domain.  A bad defaultdomain stops
lmtpd, mbtool and cyr_info conf-lint with a clear message.

Environment: see lmtphelp.py (top_builddir, TEST_TMPDIR, LMTP_TESTS,
LMTP_KEEP).
"""
import os
import subprocess
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import (TOP_BUILDDIR, check, chown_run_as,  # noqa: E402
                     wait_until)
from lmtphelp import (Conn, Instance, make_message,  # noqa: E402
                      run_lmtp_tests, split_added_headers, transaction)

DOMAINS = ["example.com", "example.org"]
DEFAULT = "main.example"
LOCALS = ["alice", "bob", "postmaster"]
CYR_INFO = os.path.join(TOP_BUILDDIR, "tools", "cyr_info")
_seq = [0]


def token(rcpt):
    _seq[0] += 1
    return "tok-%d-%d-%s" % (os.getpid(), _seq[0], rcpt)


def setup(mode):
    """An instance under virtdomains `mode` with every mailbox of the
    test: domain-less users, the same users in both domains, a folder
    that takes plus-addressed mail and a shared folder per place."""
    inst = Instance("vd-" + mode, conf={"virtdomains": mode,
                                        "defaultdomain": DEFAULT})
    try:
        for loc in LOCALS:
            inst.create("user." + loc)
            for d in DOMAINS:
                inst.create("%s!user.%s" % (d, loc))
        inst.create("user.alice.lists", {"anyone": "p"})
        inst.create("example.org!user.alice.lists", {"anyone": "p"})
        inst.create("shared.news", {"anyone": "p"})
        inst.create("example.com!shared.news", {"anyone": "p"})
        inst.create("example.com!user.small")
        inst.quota("example.com!user.small", 1)
        inst.create("user.small")
        inst.write_cyrus_conf(prefork=1, maxchild=10)
        inst.start()
    except BaseException:
        inst.stop()
        inst.cleanup()
        raise
    return inst


def all_mailboxes(inst):
    _, out, _ = inst.mbtool("list")
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


def spool_tree(inst):
    out = []
    for dirpath, dirs, files in os.walk(inst.partition):
        if {"stage.", "journal."} & set(dirpath.split(os.sep)):
            continue
        out.append(dirpath)
        out.extend(os.path.join(dirpath, f) for f in files)
    return sorted(out)


def deliver(inst, rcpt, expect=250):
    """One message to rcpt over LMTP; returns (token, message bytes) or
    the refusing reply."""
    tok = token(rcpt)
    msg = make_message(tok + "@test.example", subject=tok, to=rcpt,
                       body=("for %s\r\n" % tok).encode())
    with Conn(inst.unix_socket) as c:
        c.reply()
        mr, rr, dr, per = transaction(c, "sender@example.net", [rcpt], msg,
                                      lhlo="client.example")
        check(mr.code == 250, "MAIL: %r" % mr)
        check(len(rr) == 1, "RCPT replies: %r" % rr)
        if expect != 250:
            check(rr[0].code == expect, "RCPT %s: %r, expected %d"
                  % (rcpt, rr[0], expect))
            c.cmd("QUIT")
            return rr[0]
        check(rr[0].code == 250, "RCPT %s: %r" % (rcpt, rr[0]))
        check(len(per) == 1 and per[0].code == 250,
              "DATA for %s: %r %r" % (rcpt, dr, per))
        c.cmd("QUIT")
    return tok, msg


def check_placement(inst, expected):
    """expected: {mailbox: [(token, message)]}: every mailbox of the
    instance holds exactly those messages (original bytes after the
    Return-Path and Received lmtpd adds) and nothing else."""
    for name in all_mailboxes(inst):
        got = inst.messages(name)
        want = expected.get(name, [])
        check(len(got) == len(want), "%s holds %d messages, expected %d "
              "(%s)" % (name, len(got), len(want),
                        [t for t, _ in want]))
        for data, (tok, msg) in zip(got, want):
            _, _, rest = split_added_headers(data)
            check(rest == msg, "%s: message %s differs from what was "
                  "sent:\n%r\nvs\n%r" % (name, tok, rest[:200], msg[:200]))


def run_placement(mode):
    inst = setup(mode)
    with inst:
        expected = {}

        def expect(rcpt, mailbox):
            expected.setdefault(mailbox, []).append(deliver(inst, rcpt))

        for loc in LOCALS:
            for d in DOMAINS:
                expect("%s@%s" % (loc, d), "%s!user.%s" % (d, loc)
                       if mode != "off" else "user." + loc)
            expect("%s@%s" % (loc, DEFAULT), "user." + loc)
            expect(loc, "user." + loc)
        # case of the domain never matters; lmtp_downcase_rcpt: the user
        expect("ALICE@Example.ORG", "example.org!user.alice"
               if mode != "off" else "user.alice")
        # plus addressing lands in the folder of the right domain only
        expect("alice+lists@example.org", "example.org!user.alice.lists"
               if mode != "off" else "user.alice.lists")
        expect("alice+lists@example.com", "example.com!user.alice"
               if mode != "off" else "user.alice.lists")
        expect("alice+lists@" + DEFAULT, "user.alice.lists")
        # shared folders per domain
        expect("+shared.news@example.com", "example.com!shared.news"
               if mode != "off" else "shared.news")
        expect("+shared.news@" + DEFAULT, "shared.news")
        if mode != "off":
            # unknown domain, unknown user, missing shared folder: 5.1.1
            for rcpt in ("alice@example.net", "carol@example.com",
                         "+shared.news@example.org",
                         "small@example.org"):
                r = deliver(inst, rcpt, expect=550)
                check("5.1.1" in r.text, "%s: %r" % (rcpt, r))
        # quota of the domain user, not of the domain-less namesake
        big = make_message(token("q") + "@test.example",
                           body=b"x" * 3000 + b"\r\n")
        rcpts = ["small"] if mode == "off" else ["small@example.com",
                                                  "small"]
        with Conn(inst.unix_socket) as c:
            c.reply()
            mr, rr, dr, per = transaction(
                c, "s@example.net", rcpts, big, lhlo="client.example",
                mail_params=" SIZE=%d" % len(big))
            check([r.code for r in rr] == [452] * (len(rcpts) - 1) + [250]
                  and len(per) == 1 and per[0].code == 250,
                  "quota per domain user: %r %r" % (rr, per))
            expected.setdefault("user.small", []).append((None, big))
            c.cmd("QUIT")
        check_placement(inst, expected)


def test_placement_off():
    run_placement("off")


def test_placement_userid():
    run_placement("userid")


def test_placement_on():
    run_placement("on")


BAD_RCPTS = [
    # (address, expected code or None for any 5xx)
    ("alice@", None),
    ("alice@.", None),
    ("alice@a..b", None),
    ("alice@[127.0.0.1]", 550),
    ("alice@localhost", 550),
    ("alice@-bad.example", None),
    ("alice@" + "a" * 63 + "." + ".".join(["b" * 60] * 4), 550),
    ("alice@" + ".".join(["c" * 50] * 6), 550),     # 305 bytes
    ("al!ce@example.com", 550),
    ("alice@exa!mple.com", None),
    ("example.com!user.alice@example.org", 550),
    ("a/b@example.com", 550),
    ("alice@exa/mple.com", None),
    ("+example.com!shared.news@example.org", 550),
    ("+shared/news@example.com", 550),
    ("alice+x!y@example.org", 250),       # a bad detail: the INBOX
    ("alice@example.com!user.bob", None),
]


def test_bad_input():
    inst = setup("userid")
    with inst:
        before_list = all_mailboxes(inst)
        before_tree = spool_tree(inst)
        inst.mark_log()
        with Conn(inst.unix_socket) as c:
            c.reply()
            check(c.cmd("LHLO client.example").code == 250, "LHLO")
            check(c.cmd("MAIL FROM:<s@example.net>").code == 250, "MAIL")
            for rcpt, code in BAD_RCPTS:
                r = c.cmd("RCPT TO:<%s>" % rcpt)
                if code is None:
                    check(500 <= r.code < 600, "RCPT %r: %r" % (rcpt, r))
                else:
                    check(r.code == code, "RCPT %r: %r, expected %d"
                          % (rcpt, r, code))
                if r.code != 250:
                    check(len(r.text) > 10, "RCPT %r: no reason given: "
                          "%r" % (rcpt, r))
            check(c.cmd("RSET").code == 250, "RSET")
            c.cmd("QUIT")
        # the only accepted one went to example.org's alice, and nothing
        # was created anywhere
        tok, msg = deliver(inst, "bob@example.org")
        got = inst.messages("example.org!user.bob")
        check(len(got) == 1 and split_added_headers(got[0])[2] == msg,
              "the worker delivers after the bad input")
        check(all_mailboxes(inst) == before_list, "the mailbox list "
              "changed: %s" % (set(all_mailboxes(inst)) ^ set(before_list)))
        after = [p for p in spool_tree(inst) if p not in before_tree]
        allowed = inst.mailbox_dir("example.org!user.bob")
        stray = [p for p in after if not p.startswith(allowed + os.sep)]
        check(not stray, "new spool entries outside the recipient's "
              "mailbox: %s" % stray)
        check(not inst.worker_trouble(), "worker trouble: %s"
              % inst.worker_trouble())


def test_mbtool_domains():
    inst = Instance("vd-mbtool", conf={"virtdomains": "userid",
                                       "defaultdomain": DEFAULT,
                                       "unixhierarchysep": "yes"})
    with inst:
        # both forms of a name
        inst.mbtool("create", "example.com!user.alice")
        inst.mbtool("create", "user/alice/Sent@example.com")
        inst.mbtool("create", "user/bob@Example.ORG")
        inst.mbtool("create", "user/carol@" + DEFAULT)
        inst.mbtool("create", "example.com!shared.news")
        inst.mbtool("create", "user.alice")
        names = all_mailboxes(inst)
        check(names == ["example.com!shared.news", "example.com!user.alice",
                        "example.com!user.alice.Sent",
                        "example.org!user.bob", "user.alice", "user.carol"],
              "mbtool list: %s" % names)
        info = inst.info("user/alice/Sent@example.com")
        check(info.get("name") == "example.com!user.alice.Sent" and
              info.get("directory") == inst.mailbox_dir(
                  "example.com!user.alice.Sent"), "info: %s" % info)
        check(info.get("acl") == "alice@example.com=lrswipkxtea",
              "the owner of a domain user's folder: %s" % info)
        # garbage names are refused
        for bad in ("user/x@a..b", "user/x@[1.2.3.4]", "Example.com!user.x",
                    "user/x!y@example.com", "x.y!user.a!b"):
            rc, out, err = inst.mbtool("create", bad, check_rc=False)
            check(rc != 0, "mbtool create %r accepted: %s" % (bad, out))
        check(all_mailboxes(inst) == names, "a bad create changed the list")
        # list by domain
        _, out, _ = inst.mbtool("list", "-d", "EXAMPLE.com")
        got = [ln.split()[0] for ln in out.splitlines()]
        check(got == ["example.com!shared.news", "example.com!user.alice",
                      "example.com!user.alice.Sent"], "list -d: %s" % got)
        _, out, _ = inst.mbtool("list", "-d", "example.com", "user.%")
        got = [ln.split()[0] for ln in out.splitlines()]
        check(got == ["example.com!user.alice"], "list -d PAT: %s" % got)
        _, out, _ = inst.mbtool("domains")
        check(out.split("\n")[:2] == ["example.com mailboxes=3",
                                      "example.org mailboxes=1"],
              "domains: %r" % out)
        # quota with both forms; deliver to a domain user
        inst.mbtool("quota", "set", "user/alice@example.com", "100", "none")
        inst.mbtool("deliver", "alice@example.com", "alice",
                    input=make_message("mb1@test.example"))
        check(len(inst.messages("example.com!user.alice")) == 1 and
              len(inst.messages("user.alice")) == 1, "mbtool deliver")
        _, out, _ = inst.mbtool("quota", "show", "example.com!user.alice")
        check("messages=1" in out, "quota of the domain user: %s" % out)
        # delete a whole domain: mailboxes, quota roots, user files, dirs
        seen_dir = os.path.join(inst.confdir, "domain", "e", "example.com")
        os.makedirs(os.path.join(seen_dir, "user", "a"), exist_ok=True)
        with open(os.path.join(seen_dir, "user", "a", "alice.seen"),
                  "w") as f:
            f.write("")
        for dirpath, _, files in os.walk(os.path.join(inst.confdir,
                                                      "domain")):
            chown_run_as(dirpath)
            for fn in files:
                chown_run_as(os.path.join(dirpath, fn))
        _, out, _ = inst.mbtool("delete-domain", "example.com")
        check("mailboxes=3" in out and "quota_roots=1" in out and
              "users=1" in out,
              "delete-domain: %s" % out)
        check(all_mailboxes(inst) == ["example.org!user.bob", "user.alice",
                                      "user.carol"],
              "after delete-domain: %s" % all_mailboxes(inst))
        check(not os.path.exists(seen_dir), "per-user files left: %s"
              % seen_dir)
        check(not os.path.exists(os.path.join(inst.partition, "domain",
                                              "example.com")),
              "spool of the domain left")
        rc, _, err = inst.mbtool("quota", "show", "example.com!user.alice",
                                 check_rc=False)
        check(rc != 0, "quota root of the deleted domain left")
        check(len(inst.messages("user.alice")) == 1, "other users intact")
        rc, _, err = inst.mbtool("delete-domain", "a..b", check_rc=False)
        check(rc != 0 and "bad domain" in err, "delete-domain a..b: %s"
              % err)


def test_bad_defaultdomain_refused():
    """A defaultdomain that is no domain stops the programs at start with
    a message naming it, instead of being ignored."""
    inst = Instance("vd-badconf", conf={"virtdomains": "userid",
                                        "defaultdomain": "not_a_domain"})
    try:
        rc, out, err = inst.mbtool("list", check_rc=False)
        check(rc == 1 and "defaultdomain" in err, "mbtool: %d %s" % (rc, err))
        r = subprocess.run([CYR_INFO, "-C", inst.imapd_conf, "conf-lint"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        text = r.stdout.decode(errors="replace")
        check(r.returncode == 1 and "error: defaultdomain" in text,
              "conf-lint: %s" % text)
        inst.write_cyrus_conf(prefork=0, maxchild=2)
        inst.start(ready=0)
        # a worker started for a connection stops at once and says why
        try:
            with Conn(inst.unix_socket, timeout=10) as c:
                c.reply()
        except Exception:   # noqa: BLE001 - closed without a greeting
            pass
        ok = wait_until(lambda: "key=<defaultdomain>" in inst.log(), 30)
        check(ok, "lmtpd did not refuse the configuration: %s"
              % inst.log()[-600:])
    finally:
        inst.stop()
        inst.cleanup()
    # virtdomains takes only its three words
    inst = Instance("vd-badconf2", conf={"virtdomains": "yes"})
    try:
        rc, out, err = inst.mbtool("list", check_rc=False)
        check(rc == 1 and "virtdomains" in err and "off userid on" in err,
              "virtdomains: yes: %d %s" % (rc, err))
    finally:
        inst.cleanup()


TESTS = [
    test_placement_off,
    test_placement_userid,
    test_placement_on,
    test_bad_input,
    test_mbtool_domains,
    test_bad_defaultdomain_refused,
]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
