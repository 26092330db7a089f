#!/usr/bin/env python3
"""test_cyr_expire.py - scheduled upkeep (tools/cyr_expire) against a
real master running lmtpd and imapd, with expunge_mode: delayed and
delete_mode: delayed:

- expunge_retention: a message expunged over IMAP keeps its file and
  record through `cyr_expire -X 2` run "1 day later" and loses both "3
  days later"; a message not expunged keeps them; with expunge_mode:
  immediate the same run "1 day later" removes it;
- duplicate_retention: `cyr_expire -E 2` keeps a delivery's duplicate
  record 1 day later and prunes it 3 days later (the same message is
  then delivered again instead of being suppressed);
- deleted_mailboxes: IMAP DELETE of a folder with a message moves it to
  DELETED.user.alice.Trash.HEX: LIST (and LIST of DELETED*) does not show
  it, mbtool list 'DELETED.*' does; `mbtool undelete` restores it and
  its message is read back over IMAP; deleted again, `cyr_expire -D 2`
  keeps it 1 day later and removes list entry and spool 3 days later;
- cleanup_during_delivery: a cleanup of thousands of expunged messages
  in one mailbox runs in several batches while LMTP keeps delivering
  into the same mailbox: every delivery succeeds, and none waits longer
  than a bound derived from the deliveries measured just before (50
  times their median, at least 5 s).

"N days later" is CYRUSDELIVER_TEST_NOW, the tool's test clock.
Environment: top_builddir, TEST_TMPDIR, EXPIRE_TESTS (names to run).
"""
import os
import re
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(TESTS_DIR, "imapd"),
                os.path.join(TESTS_DIR, "lmtpd"), TESTS_DIR]
from testlib import (MASTER, TOP_BUILDDIR, Fail, check,  # noqa: E402
                     drop_privileges, run_tests)
from lmtphelp import (LMTPD, MBTOOL, Conn, make_message,  # noqa: E402
                      read_index, transaction)
from imaphelp import (IMAPD, IMAP4, ImapInstance,  # noqa: E402
                      make_sasldb_extra, tls_context)

CYR_EXPIRE = os.path.join(TOP_BUILDDIR, "tools", "cyr_expire")
ALICE, ALICE_PW = "alice", "s3cret-pw"
DAY = 86400
FLAG_EXPUNGED = 1 << 16

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("expire", conf={"expunge_mode": "delayed",
                                         "delete_mode": "delayed",
                                         "sasl_mech_list": "PLAIN LOGIN"},
                         tls=True, sasl=(ALICE, ALICE_PW))
        try:
            i.create("user.alice")
            i.write_cyrus_conf(imaps=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def login():
    m = IMAP4(*inst().addr(), timeout=30)
    m.starttls(tls_context())
    m.login(ALICE, ALICE_PW)
    return m


def logout(m):
    try:
        m.logout()
    except Exception:
        pass


def expire(*args, days_later=0, conf=None):
    """Run cyr_expire as the server's user with the clock days_later
    days ahead: (exit status, stdout, stderr)."""
    env = dict(os.environ)
    env["CYRUSDELIVER_TEST_NOW"] = str(int(time.time() + days_later * DAY))
    r = subprocess.run([CYR_EXPIRE, "-C", conf or inst().imapd_conf, "-v"]
                       + list(args), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env,
                       preexec_fn=drop_privileges, timeout=600)
    out = (r.returncode, r.stdout.decode(errors="replace"),
           r.stderr.decode(errors="replace"))
    check(out[0] == 0, "cyr_expire %s: exit %d: %s %s" % (args, *out))
    return out


def spool(*parts):
    return os.path.join(inst().partition, "user", "alice", *parts)


def deliver(folder, msgid, subject="expire", body=None):
    """One message to alice (+folder) over LMTP: the data reply code."""
    rcpt = ALICE + ("+" + folder if folder else "")
    with Conn(inst().unix_socket) as c:
        c.reply()
        _, rr, _, per = transaction(c, "sender@example.com", [rcpt],
                                    make_message(msgid, subject=subject,
                                                 body=body),
                                    lhlo="test.example.com")
        c.cmd("QUIT")
    return per[0].code if per else rr[0].code


def expunge_all(m, folder):
    typ, _ = m.select(folder)
    check(typ == "OK", "SELECT %s: %s" % (folder, typ))
    typ, _ = m.store("1:*", "+FLAGS.SILENT", "(\\Deleted)")
    check(typ == "OK", "STORE: %s" % typ)
    typ, _ = m.expunge()
    check(typ == "OK", "EXPUNGE: %s" % typ)


def uids_in_index(directory):
    """{uid: expunged?} of every record of the index."""
    h, recs = read_index(directory)
    return {r["uid"]: bool(r["flags"] & FLAG_EXPUNGED)
            for r in recs[:h["num_records"]]}


# ---- 1. expunged messages ---------------------------------------------------

def test_expunge_retention():
    inst().create("user.alice.Old", {"anyone": "p"})
    check(deliver("Old", "old-1@test") == 250, "delivery 1")
    m = login()
    try:
        expunge_all(m, "INBOX.Old")
    finally:
        logout(m)
    check(deliver("Old", "old-2@test") == 250, "delivery 2")
    d = spool("Old")
    check(os.path.exists(os.path.join(d, "1.")), "file 1 gone at expunge")

    expire("-X", "2", days_later=1)
    check(os.path.exists(os.path.join(d, "1.")),
          "message expunged 1 day ago removed by -X 2")
    check(uids_in_index(d).get(1) is True, "record 1 not kept expunged: %r"
          % uids_in_index(d))

    rc, out, err = expire("-X", "2", days_later=3)
    check(not os.path.exists(os.path.join(d, "1.")),
          "message expunged 3 days ago kept by -X 2 (%s)" % out)
    check(1 not in uids_in_index(d), "record 1 still in the index")
    check(os.path.exists(os.path.join(d, "2.")) and
          uids_in_index(d).get(2) is False, "message 2 touched")
    check("removed=<1>" in err, "no removed=<1> in %r" % err)

    # expunge_mode: immediate (the default): no retention
    m = login()
    try:
        expunge_all(m, "INBOX.Old")
    finally:
        logout(m)
    conf = os.path.join(inst().dir, "immediate.conf")
    with open(inst().imapd_conf) as f:
        text = f.read().replace("expunge_mode: delayed",
                                "expunge_mode: immediate")
    with open(conf, "w") as f:
        f.write(text)
    os.chmod(conf, 0o644)
    expire("-X", "2", days_later=1, conf=conf)
    check(not os.path.exists(os.path.join(d, "2.")),
          "expunge_mode: immediate kept a message expunged 1 day ago")


# ---- 2. duplicate records ---------------------------------------------------

def test_duplicate_retention():
    inst().create("user.alice.Dup", {"anyone": "p"})
    check(deliver("Dup", "dup-1@test") == 250, "first delivery")
    check(deliver("Dup", "dup-1@test") == 250, "second delivery")
    _, recs = read_index(spool("Dup"))
    check(len(recs) == 1, "the duplicate was not suppressed: %d records"
          % len(recs))
    rc, out, _ = expire("-E", "2", days_later=1)
    check(re.search(r"duplicate records: 0 pruned, [1-9]", out),
          "a record 1 day old was pruned by -E 2: %r" % out)
    check(deliver("Dup", "dup-1@test") == 250, "third delivery")
    _, recs = read_index(spool("Dup"))
    check(len(recs) == 1, "suppression lost after -E 2 one day later")
    rc, out, _ = expire("-E", "2", days_later=3)
    check(re.search(r"duplicate records: [1-9]\d* pruned", out),
          "a record 3 days old was kept by -E 2: %r" % out)
    check(deliver("Dup", "dup-1@test") == 250, "fourth delivery")
    _, recs = read_index(spool("Dup"))
    check(len(recs) == 2, "after the prune the message was suppressed "
          "still: %d records" % len(recs))


# ---- 3. deleted mailboxes ---------------------------------------------------

def list_names(m, pat="*"):
    typ, data = m.list('""', pat)
    check(typ == "OK", "LIST: %s %r" % (typ, data))
    return [d.decode() for d in data if d]


def deleted_entries():
    _, out, _ = inst().mbtool("list", "DELETED.*")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_deleted_mailboxes():
    inst().create("user.alice.Trash", {"anyone": "p"})
    body = b"kept through a delete\r\n"
    check(deliver("Trash", "trash-1@test", body=body) == 250, "delivery")
    m = login()
    try:
        typ, data = m.delete("INBOX.Trash")
        check(typ == "OK", "DELETE: %s %r" % (typ, data))
        names = list_names(m)
        check(not any("Trash" in n or "DELETED" in n for n in names),
              "LIST shows the deleted mailbox: %r" % names)
        names = list_names(m, "DELETED*")
        check(not names, "LIST DELETED* shows %r" % names)
    finally:
        logout(m)
    dl = deleted_entries()
    check(len(dl) == 1 and re.match(r"DELETED\.user\.alice\.Trash\."
                                    r"[0-9A-F]{8,}$", dl[0]),
          "mbtool list DELETED.*: %r" % dl)

    inst().mbtool("undelete", "user.alice.Trash")
    check(not deleted_entries(), "still in DELETED. after undelete")
    m = login()
    try:
        typ, data = m.select("INBOX.Trash")
        check(typ == "OK" and data[0] == b"1", "SELECT after undelete: %s "
              "%r" % (typ, data))
        typ, data = m.fetch("1", "(BODY[TEXT])")
        check(typ == "OK" and data[0][1] == body, "FETCH after undelete: "
              "%r" % data)
        m.close()
        typ, _ = m.delete("INBOX.Trash")
        check(typ == "OK", "second DELETE: %s" % typ)
    finally:
        logout(m)
    dl = deleted_entries()
    check(len(dl) == 1, "after the second DELETE: %r" % dl)
    _, out, _ = expire("-D", "2", days_later=1)
    check(deleted_entries() == dl, "-D 2 removed a mailbox deleted 1 day "
          "ago: %s" % out)
    _, out, _ = expire("-D", "2", days_later=3)
    check(not deleted_entries(), "-D 2 kept a mailbox deleted 3 days ago: "
          "%s" % out)
    check(not os.path.exists(os.path.join(inst().partition, "DELETED",
                                          "user", "alice")),
          "the spool of the removed mailbox is left")


# ---- 4. a big cleanup while LMTP delivers -----------------------------------

BULK = 3000
BATCH = 200


def test_cleanup_during_delivery():
    inst().create("user.alice.Bulk", {"anyone": "p"})
    msg = make_message("bulk@test", subject="bulk")
    with Conn(inst().unix_socket) as c:
        c.reply()
        c.cmd("LHLO test.example.com")
        for i in range(BULK):
            # one connection, many transactions; no Message-ID suppression
            # (every message has the same id: duplicate suppression is
            # per mailbox, so tag each one)
            _, rr, _, per = transaction(
                c, "s@example.com", [ALICE + "+Bulk"],
                msg.replace(b"bulk@test", b"bulk-%d@test" % i))
            check(per and per[0].code == 250, "bulk delivery %d" % i)
        c.cmd("QUIT")
    m = login()
    try:
        expunge_all(m, "INBOX.Bulk")
    finally:
        logout(m)

    def one(i):
        t0 = time.monotonic()
        code = deliver("Bulk", "live-%d@test" % i)
        return code, time.monotonic() - t0

    base = [one(i) for i in range(20)]
    check(all(c == 250 for c, _ in base), "baseline deliveries failed")
    bound = max(5.0, 50 * statistics.median(t for _, t in base))

    env = dict(os.environ)
    p = subprocess.Popen([CYR_EXPIRE, "-C", inst().imapd_conf, "-v", "-X",
                          "0", "-b", str(BATCH), "-p", "20"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, preexec_fn=drop_privileges)
    results = []
    stop = threading.Event()

    def loop():
        i = 100
        while not stop.is_set():
            results.append(one(i))
            i += 1

    t = threading.Thread(target=loop)
    t.start()
    try:
        out, err = p.communicate(timeout=600)
    finally:
        stop.set()
        t.join(120)
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err.decode(errors="replace")
    check(p.returncode == 0, "cyr_expire: exit %d %s" % (p.returncode, err))
    worst = max((s for _, s in results), default=0.0)
    print("# baseline median %.4f s, bound %.2f s; %d deliveries during the"
          " cleanup, worst %.4f s" % (statistics.median(
              s for _, s in base), bound, len(results), worst))
    check(results, "no delivery ran during the cleanup")
    check(all(c == 250 for c, _ in results), "a delivery failed during "
          "the cleanup: %r" % [c for c, _ in results if c != 250][:5])
    check(worst < bound, "a delivery waited %.2f s (bound %.2f s)"
          % (worst, bound))
    mt = re.search(r"removed=<(\d+)> batches=<(\d+)>", err)
    check(mt, "no summary line: %r" % err[-500:])
    removed, batches = int(mt.group(1)), int(mt.group(2))
    check(removed == BULK, "removed %d, expected %d: %s" % (removed, BULK,
                                                            err[-1500:]))
    check(batches >= BULK // BATCH, "%d batches for %d records of at most "
          "%d" % (batches, BULK, BATCH))
    left = [f for f in os.listdir(spool("Bulk")) if f.endswith(".")]
    check(len(left) == len(base) + len(results),
          "%d message files left, expected %d" % (len(left), len(base)
                                                  + len(results)))


def main():
    try:
        return run_tests([test_expunge_retention, test_duplicate_retention,
                          test_deleted_mailboxes,
                          test_cleanup_during_delivery],
                         "EXPIRE_TESTS",
                         [MASTER, MBTOOL, LMTPD, IMAPD, CYR_EXPIRE])
    finally:
        if _inst is not None:
            try:
                _inst.stop()
            finally:
                _inst.cleanup()


if __name__ == "__main__":
    sys.exit(main())
