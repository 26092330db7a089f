#!/usr/bin/env python3
"""test_vdomain_upgrade.py - turning virtual domains on for an existing,
domain-less installation.

A master with imapd and lmtpd runs with virtdomains off (the default):
users alice and bob, alice's folder Sent (plus-addressable), a shared
folder, a quota root on alice; mail delivered over LMTP, one message
marked \\Seen and Sent subscribed over IMAP.  The master is stopped, the
configuration changed to `virtdomains: userid` with `defaultdomain:
main.example` (and, in a second round, `virtdomains: on`), and started
again: every old mailbox must still receive (recipients without a
domain, and with the defaultdomain, reach the same mailboxes as before)
and read (over IMAP, every message byte for byte as in the spool, the
old \\Seen flag and the subscription still there, the quota root still
counting the old and new mail).  A recipient of another domain is
refused with 550 5.1.1 and reaches none of them.

Environment: see imaphelp.py.
"""
import os
import re
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, Conn, ImapInstance, check,  # noqa: E402
                      make_message, make_sasldb_extra, run_imap_tests,
                      tls_context, transaction)

ALICE, ALICE_PW = "alice", "al1ce-pw"
BOB, BOB_PW = "bob", "b0b-pw"
DEFAULT = "main.example"
_seq = [0]


def deliver(inst, rcpt, expect=250):
    """One message over LMTP; returns its bytes (or the RCPT reply)."""
    _seq[0] += 1
    mid = "up.%d.%d@test.example" % (os.getpid(), _seq[0])
    msg = make_message(mid, subject="upgrade %d" % _seq[0], to=rcpt,
                       body=b"message %d to %s\r\n" % (_seq[0],
                                                      rcpt.encode()))
    with Conn(inst.unix_socket) as c:
        c.reply()
        mr, rr, dr, per = transaction(c, "sender@example.net", [rcpt], msg,
                                      lhlo="client.example")
        check(len(rr) == 1 and rr[0].code == expect, "RCPT %s: %r, "
              "expected %d" % (rcpt, rr, expect))
        if expect == 250:
            check(len(per) == 1 and per[0].code == 250, "DATA %s: %r"
                  % (rcpt, per))
        c.cmd("QUIT")
    return msg if expect == 250 else rr[0]


def login(inst, user, pw):
    m = IMAP4(*inst.addr(), timeout=20)
    m.starttls(tls_context())
    typ, data = m.login(user, pw)
    check(typ == "OK", "LOGIN %s: %r" % (user, data))
    return m


def close(m):
    """Drop an imaplib connection (after LOGOUT too)."""
    try:
        m.shutdown()
    except OSError:
        pass


def fetch_all(m, mailbox):
    """{uid: (flags, bytes)} of a mailbox, read with BODY.PEEK[]."""
    typ, data = m.select(mailbox, readonly=True)
    check(typ == "OK", "SELECT %s: %r" % (mailbox, data))
    n = int(data[0])
    out = {}
    if n == 0:
        return out
    typ, data = m.fetch("1:*", "(UID FLAGS BODY.PEEK[])")
    check(typ == "OK", "FETCH %s: %r" % (mailbox, data))
    for item in data:
        if not isinstance(item, tuple):
            continue
        head = item[0].decode()
        uid = int(re.search(r"UID (\d+)", head).group(1))
        flags = re.search(r"FLAGS \(([^)]*)\)", head).group(1).split()
        out[uid] = (set(flags), item[1])
    return out


def check_mailbox(inst, m, imapname, internal):
    """Every message imapd serves equals its spool file, and the spool
    holds no other; returns {uid: (flags, bytes)}."""
    got = fetch_all(m, imapname)
    files = inst.message_files(internal)
    check(sorted(got) == [u for u, _ in files], "%s: IMAP uids %s, spool "
          "%s" % (imapname, sorted(got), [u for u, _ in files]))
    for uid, path in files:
        with open(path, "rb") as f:
            check(got[uid][1] == f.read(), "%s uid %d: IMAP bytes differ "
                  "from the spool" % (imapname, uid))
    return got


def bodies(got):
    return [data.split(b"\r\n\r\n", 1)[1] for _, (_, data) in
            sorted(got.items())]


def body_of(msg):
    return msg.split(b"\r\n\r\n", 1)[1]


def run_upgrade(mode):
    conf = {"admins": "admin"}
    inst = ImapInstance("vd-upgrade-" + mode, conf=conf, tls=True,
                        sasl=(ALICE, ALICE_PW))
    with inst:
        make_sasldb_extra(inst, BOB, BOB_PW)
        inst.create("user.alice")
        inst.create("user.alice.Sent", {"anyone": "p"})
        inst.create("user.bob")
        inst.create("shared.news", {"anyone": "lrp"})
        inst.quota("user.alice", 1000)
        inst.write_cyrus_conf()
        inst.start()
        # --- the old, domain-less installation at work
        want = {"user.alice": [], "user.alice.Sent": [], "user.bob": [],
                "shared.news": []}
        want["user.alice"].append(deliver(inst, "alice"))
        want["user.alice"].append(deliver(inst, "alice@old.example"))
        want["user.alice.Sent"].append(deliver(inst, "alice+Sent"))
        want["user.bob"].append(deliver(inst, "bob@whatever.example"))
        want["shared.news"].append(deliver(inst, "+shared.news"))
        m = login(inst, ALICE, ALICE_PW)
        try:
            m.select("INBOX")
            typ, _ = m.store("1", "+FLAGS", "(\\Seen)")
            check(typ == "OK", "STORE \\Seen")
            typ, _ = m.subscribe("INBOX.Sent")
            check(typ == "OK", "SUBSCRIBE")
            m.logout()
        finally:
            close(m)
        check(inst.stop() == [], "master stop")
        _, quota_before, _ = inst.mbtool("quota", "show", "user.alice")

        # --- virtual domains on, same data
        conf.update({"virtdomains": mode, "defaultdomain": DEFAULT})
        inst.write_imapd_conf(conf)
        inst.start()
        want["user.alice"].append(deliver(inst, "alice"))
        want["user.alice"].append(deliver(inst, "alice@" + DEFAULT))
        want["user.alice"].append(deliver(inst, "ALICE@MAIN.Example"))
        want["user.alice.Sent"].append(deliver(inst, "alice+Sent@" +
                                               DEFAULT))
        want["user.bob"].append(deliver(inst, "bob@" + DEFAULT))
        want["shared.news"].append(deliver(inst, "+shared.news@" + DEFAULT))
        # another domain is another namespace: nothing there
        r = deliver(inst, "alice@old.example", expect=550)
        check(r.enh == "5.1.1", "alice@old.example: %r" % r)
        r = deliver(inst, "+shared.news@old.example", expect=550)
        for name, msgs in want.items():
            check(len(inst.messages(name)) == len(msgs), "%s: %d messages, "
                  "expected %d" % (name, len(inst.messages(name)),
                                   len(msgs)))
        # every old mailbox reads, byte for byte
        m = login(inst, ALICE, ALICE_PW)
        try:
            got = check_mailbox(inst, m, "INBOX", "user.alice")
            check(bodies(got) == [body_of(x) for x in want["user.alice"]],
                  "INBOX bodies")
            check("\\Seen" in got[min(got)][0], "the old \\Seen flag: %s"
                  % got[min(got)][0])
            check(all("\\Seen" not in f for u, (f, _) in got.items()
                      if u != min(got)), "new mail is unseen")
            got = check_mailbox(inst, m, "INBOX.Sent", "user.alice.Sent")
            check(bodies(got) == [body_of(x) for x in
                                  want["user.alice.Sent"]], "Sent bodies")
            got = check_mailbox(inst, m, "shared.news", "shared.news")
            check(bodies(got) == [body_of(x) for x in want["shared.news"]],
                  "shared.news bodies")
            typ, data = m.lsub('""', "*")
            check(typ == "OK" and any(b"INBOX.Sent" in d for d in data
                                      if d), "LSUB: %r" % data)
            m.logout()
        finally:
            close(m)
        m = login(inst, BOB, BOB_PW)
        try:
            got = check_mailbox(inst, m, "INBOX", "user.bob")
            check(bodies(got) == [body_of(x) for x in want["user.bob"]],
                  "bob's bodies")
            m.logout()
        finally:
            close(m)
        _, quota_after, _ = inst.mbtool("quota", "show", "user.alice")
        before = int(re.search(r"messages=(\d+)", quota_before).group(1))
        after = int(re.search(r"messages=(\d+)", quota_after).group(1))
        check(before == 3 and after == 3 + 4, "quota root user.alice: "
              "%s -> %s" % (quota_before.strip(), quota_after.strip()))
        # no domain directory appeared anywhere
        for top in (inst.partition, inst.confdir):
            check(not os.path.exists(os.path.join(top, "domain")),
                  "a domain directory under %s" % top)


def test_upgrade_to_userid():
    run_upgrade("userid")


def test_upgrade_to_on():
    run_upgrade("on")


TESTS = [test_upgrade_to_userid, test_upgrade_to_on]

if __name__ == "__main__":
    sys.exit(run_imap_tests(TESTS))
