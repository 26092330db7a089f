#!/usr/bin/env python3
"""test_backup.py - cyr_hotbackup: a consistent copy of a running server.

storm: a master with lmtpd and imapd; LMTP client threads deliver to
four mailboxes without pause while cyr_hotbackup runs, and a hook inside
the backup (run for each mailbox between the mailbox list copy and the
mailbox's own copy) delivers one more message, so deliveries overlap
the backup whatever the machine's speed.  The backup is restored into a
fresh directory: ctl_cyrusdb -r and mbtool check pass on every mailbox,
every message acknowledged (250) before the backup started is there
byte for byte, and a master on the restored copy serves one over IMAP.

wrong_order: the same check on a backup made in the wrong order
(--test-order=files-first: message files listed before the index is
read, with a delivery in between) must fail: the check can see an
inconsistent backup.

refusals: --help; a non-empty DESTDIR; a restore into a configuration
that already has a mailbox list; a restore from an incomplete backup.

Environment: see ../imapd/imaphelp.py.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "imapd"))
from imaphelp import (IMAP4, Conn, ImapInstance, check,  # noqa: E402
                      make_message, run_imap_tests, tls_context,
                      transaction)
from lmtphelp import header_value, read_index  # noqa: E402
from testlib import (TMPDIR, TOP_BUILDDIR, Fail, chown_run_as,  # noqa: E402
                     drop_privileges, wait_until)

CYR_HOTBACKUP = os.path.join(TOP_BUILDDIR, "tools", "cyr_hotbackup")
CTL_CYRUSDB = os.path.join(TOP_BUILDDIR, "tools", "ctl_cyrusdb")
USER, PW = "alice", "al1ce-pw"
RCPTS = {"alice": "user.alice", "bob": "user.bob", "carol": "user.carol",
         "+shared.news": "shared.news"}

HOOK = r'''
import os, socket, sys, time
sock, tag = sys.argv[1], sys.argv[2]
box = os.environ["CYR_HOTBACKUP_MAILBOX"]
rcpt = box[5:] if box.startswith("user.") else "+" + box
mid = "hook.%s.%s.%d@test.example" % (tag, box, os.getpid())


class Temp(Exception):
    pass


def attempt():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(sock)
    f = s.makefile("rb")

    def reply():
        while True:
            line = f.readline()
            if not line:
                raise Temp("connection closed")
            if line[3:4] != b"-":
                return line

    def cmd(text, code):
        if text is not None:
            s.sendall(text + b"\r\n")
        line = reply()
        if line.startswith(b"4"):
            raise Temp("%r: %r" % (text, line))   # an MTA would retry
        if not line.startswith(code):
            sys.exit("%r: %r" % (text, line))
    try:
        cmd(None, b"220")
        cmd(b"LHLO hook.example", b"250")
        cmd(b"MAIL FROM:<hook@example.org>", b"250")
        cmd(b"RCPT TO:<" + rcpt.encode() + b">", b"250")
        cmd(b"DATA", b"354")
        cmd(b"Message-ID: <" + mid.encode() + b">\r\nSubject: hook\r\n\r\n"
            b"delivered inside the backup\r\n.", b"250")
        s.sendall(b"QUIT\r\n")
    finally:
        s.close()


for n in range(20):
    try:
        attempt()
        sys.exit(0)
    except (Temp, OSError) as e:
        sys.stderr.write("hook: try %d: %s\n" % (n + 1, e))
        time.sleep(0.5)
sys.exit("hook: no delivery to %s after 20 tries" % box)
'''


def run(cmd, check_rc=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       preexec_fn=drop_privileges, timeout=300)
    out = r.stdout.decode(errors="replace")
    err = r.stderr.decode(errors="replace")
    if check_rc and r.returncode != 0:
        raise Fail("%s: exit %d: %s%s" % (" ".join(cmd), r.returncode,
                                          out[-800:], err[-800:]))
    return r.returncode, out, err


NEW_DIRS = []


def remove_new_dirs():
    for d in NEW_DIRS:
        shutil.rmtree(d, ignore_errors=True)


def new_dir(name):
    d = tempfile.mkdtemp(prefix="backup-%s." % name, dir=TMPDIR)
    NEW_DIRS.append(d)
    os.chmod(d, 0o755)
    chown_run_as(d)
    return d


def setup(inst):
    for name in RCPTS.values():
        inst.create(name)
    inst.mbtool("setacl", "shared.news", "anyone", "lrp")


def hook_script(inst, tag):
    path = inst.path("hook.py")
    with open(path, "w") as f:
        f.write(HOOK)
    return "python3 %s %s %s" % (path, inst.unix_socket, tag)


class Storm:
    """Threads delivering over LMTP until stopped; acks is a list of
    (monotonic time of the 250, mailbox, message bytes)."""

    def __init__(self, inst, threads=4):
        self.inst = inst
        self.stop = threading.Event()
        self.acks = []
        self.errors = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.loop, args=(i,))
                        for i in range(threads)]

    def loop(self, n):
        rcpts = sorted(RCPTS)
        seq = 0
        try:
            with Conn(self.inst.unix_socket) as c:
                c.reply()
                r = c.cmd("LHLO storm.example")
                check(r.code == 250, "LHLO: %r" % r)
                while not self.stop.is_set():
                    seq += 1
                    rcpt = rcpts[(n + seq) % len(rcpts)]
                    mid = "storm.%d.%d@test.example" % (n, seq)
                    msg = make_message(mid, subject="storm %d %d" % (n, seq),
                                       body=b"storm message %d/%d\r\n%s\r\n"
                                       % (n, seq, os.urandom(64).hex()
                                          .encode()))
                    mr, rr, dr, per = transaction(c, "s@example.org", [rcpt],
                                                  msg)
                    check(len(per) == 1 and per[0].code == 250,
                          "storm %s: %r %r %r" % (rcpt, mr, rr, per))
                    with self.lock:
                        self.acks.append((time.monotonic(), RCPTS[rcpt],
                                          msg))
                c.cmd("QUIT")
        except Exception as e:      # reported by the test
            self.errors.append(repr(e))

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        for t in self.threads:
            t.join(120)
        return False


def restore(backup_dir, name):
    """A fresh instance with the backup restored into it; returns it (not
    started)."""
    inst = ImapInstance(name, conf={"admins": "admin"}, tls=True,
                        sasl=(USER, PW))
    run([CYR_HOTBACKUP, "-q", "-C", inst.imapd_conf, "--restore", backup_dir])
    return inst


def stored_by_msgid(inst):
    """{message-id: (mailbox, bytes)} of every committed message."""
    out = {}
    for name in RCPTS.values():
        for data in inst.messages(name):
            out[header_value(data, "Message-ID")] = (name, data)
    return out


def verify(inst, acked):
    """ctl_cyrusdb -r, mbtool check on every mailbox, every message of
    acked (mailbox, bytes) stored byte for byte.  Fail otherwise."""
    run([CTL_CYRUSDB, "-q", "-C", inst.imapd_conf, "-r"])
    for name in RCPTS.values():
        rc, out, err = inst.mbtool("check", name, check_rc=False)
        check(rc == 0, "mbtool check %s on the restored copy: %s%s"
              % (name, out, err))
    stored = stored_by_msgid(inst)
    for name, msg in acked:
        mid = header_value(msg, "Message-ID")
        check(mid in stored, "%s: message %s acknowledged before the backup "
              "is missing from the restored copy" % (name, mid))
        box, data = stored[mid]
        check(box == name and data.endswith(msg), "%s: message %s differs "
              "in the restored copy" % (name, mid))
    return stored


def test_storm():
    inst = ImapInstance("backup-storm", conf={"admins": "admin"}, tls=True,
                        sasl=(USER, PW))
    with inst:
        setup(inst)
        inst.write_cyrus_conf(maxchild=12)
        inst.start()
        backup_dir = os.path.join(new_dir("dest"), "b")
        with Storm(inst) as storm:
            check(wait_until(lambda: len(storm.acks) >= 40 or storm.errors,
                             120), "the storm delivered only %d messages in "
                  "120 s" % len(storm.acks))
            check(not storm.errors, "storm: %s" % storm.errors[:3])
            t0 = time.monotonic()
            _, out, err = run([CYR_HOTBACKUP, "-C", inst.imapd_conf,
                               "--test-hook", hook_script(inst, "ok"),
                               backup_dir])
            check("test hook exited" not in err,
                  "a hook delivery failed: %s" % err[-800:])
            t1 = time.monotonic()
            n_end = len(storm.acks)
            # some more after the backup, then stop
            wait_until(lambda: len(storm.acks) >= n_end + 10 or storm.errors,
                       60)
        check(not storm.errors, "storm: %s" % storm.errors[:3])
        check("backup done" in out, "cyr_hotbackup output: %s" % out[-400:])
        before = [(box, msg) for t, box, msg in storm.acks if t < t0]
        during = [1 for t, _, _ in storm.acks if t0 <= t <= t1]
        sys.stdout.write("# %d messages acknowledged before the backup, "
                         "%d during it (plus %d by the hook), %d in all\n"
                         % (len(before), len(during), len(RCPTS),
                            len(storm.acks)))
        check(inst.stop() == [], "master stop")

    rinst = restore(backup_dir, "backup-restored")
    with rinst:
        stored = verify(rinst, before)
        # the hook delivered to each mailbox just before its copy
        hooked = sorted(stored[m][0] for m in stored
                        if m.startswith("<hook.ok."))
        check(hooked == sorted(RCPTS.values()), "the messages delivered "
              "inside the backup (between the list copy and each mailbox's "
              "copy) must all be there: %s" % hooked)
        # a master on the restored copy serves a message over IMAP
        rinst.write_cyrus_conf()
        rinst.start()
        box, msg = next((b, m) for b, m in before if b == "user.alice")
        m = IMAP4(*rinst.addr(), timeout=20)
        try:
            m.starttls(tls_context())
            typ, data = m.login(USER, PW)
            check(typ == "OK", "LOGIN: %r" % data)
            typ, data = m.select("INBOX", readonly=True)
            check(typ == "OK", "SELECT: %r" % data)
            mid = header_value(msg, "Message-ID")
            typ, data = m.uid("SEARCH", None, "HEADER", "Message-ID", mid)
            check(typ == "OK" and data[0], "SEARCH %s: %r" % (mid, data))
            uid = data[0].split()[0].decode()
            typ, data = m.uid("FETCH", uid, "(BODY.PEEK[])")
            check(typ == "OK" and isinstance(data[0], tuple)
                  and data[0][1].endswith(msg), "FETCH over IMAP on the "
                  "restored copy: %r" % (data[:1],))
            m.logout()
        finally:
            try:
                m.shutdown()
            except OSError:
                pass


def test_wrong_order():
    inst = ImapInstance("backup-wrong", conf={"admins": "admin"}, tls=True,
                        sasl=(USER, PW))
    with inst:
        setup(inst)
        inst.write_cyrus_conf()
        inst.start()
        acked = []
        for i in range(3):
            msg = make_message("w.%d@test.example" % i, body=b"m %d\r\n" % i)
            inst.lmtp_deliver("alice", msg)
            acked.append(("user.alice", msg))
        good = os.path.join(new_dir("good"), "b")
        bad = os.path.join(new_dir("bad"), "b")
        run([CYR_HOTBACKUP, "-q", "-C", inst.imapd_conf, "--test-hook",
             hook_script(inst, "good"), good])
        run([CYR_HOTBACKUP, "-q", "-C", inst.imapd_conf, "--test-order",
             "files-first", "--test-hook", hook_script(inst, "bad"), bad])
        check(inst.stop() == [], "master stop")
    with restore(good, "backup-good") as r:
        verify(r, acked)
    with restore(bad, "backup-bad") as r:
        try:
            verify(r, acked)
        except Fail as e:
            sys.stdout.write("# the wrong order is caught: %s\n"
                             % str(e)[:200])
        else:
            raise Fail("the check passed a backup made in the wrong order "
                       "(message files before the index)")


def test_backends():
    """Backup and restore with every database on each backend."""
    for backend in ("skiplist", "flat", "db3", "lmdb"):
        conf = {k: backend for k in ("mboxlist_db", "duplicate_db",
                                     "quota_db", "seenstate_db",
                                     "subscription_db")}
        inst = ImapInstance("backup-" + backend, conf=conf)
        with inst:
            setup(inst)
            inst.quota("user.alice", 1000)
            inst.write_cyrus_conf()
            inst.start()
            acked = []
            for rcpt, box in sorted(RCPTS.items()):
                msg = make_message("%s.%s@test.example" % (backend, box),
                                   body=b"to %s\r\n" % box.encode())
                inst.lmtp_deliver(rcpt, msg)
                acked.append((box, msg))
            b = os.path.join(new_dir(backend), "b")
            run([CYR_HOTBACKUP, "-q", "-C", inst.imapd_conf, b])
            check(inst.stop() == [], "master stop")
        r = ImapInstance("restored-" + backend, conf=conf)
        with r:
            run([CYR_HOTBACKUP, "-q", "-C", r.imapd_conf, "--restore", b])
            verify(r, acked)
            _, out, _ = r.mbtool("quota", "show", "user.alice")
            check("messages=1" in out, "%s: restored quota: %s"
                  % (backend, out))


def test_refusals():
    rc, out, _ = run([CYR_HOTBACKUP, "--help"])
    check("--restore" in out and "DESTDIR" in out, "--help: %s" % out)
    rc, _, err = run([CYR_HOTBACKUP], check_rc=False)
    check(rc == 2, "no DESTDIR: exit %d" % rc)
    inst = ImapInstance("backup-refuse")
    with inst:
        inst.create("user.alice")
        full = new_dir("full")
        with open(os.path.join(full, "x"), "w") as f:
            f.write("x")
        rc, _, err = run([CYR_HOTBACKUP, "-C", inst.imapd_conf, full],
                         check_rc=False)
        check(rc == 1 and "not empty" in err, "non-empty DESTDIR: %d %s"
              % (rc, err))
        b = os.path.join(new_dir("ok"), "b")
        run([CYR_HOTBACKUP, "-q", "-C", inst.imapd_conf, b])
        rc, _, err = run([CYR_HOTBACKUP, "-C", inst.imapd_conf, "--restore", b],
                         check_rc=False)
        check(rc == 1 and "fresh" in err, "restore over a mailbox list: "
              "%d %s" % (rc, err))
        os.unlink(os.path.join(b, "cyrusdeliver-backup"))
        other = ImapInstance("backup-refuse2")
        with other:
            rc, _, err = run([CYR_HOTBACKUP, "-C", other.imapd_conf,
                              "--restore", b], check_rc=False)
            check(rc == 1 and "not a complete backup" in err,
                  "restore of an incomplete backup: %d %s" % (rc, err))


def test_layout():
    """CONFIGDIR/cyrusdeliver.version: written when missing, a newer one
    refused by ctl_cyrusdb -r and by the master's START, reported by
    cyr_info conf-lint."""
    cyr_info = os.path.join(TOP_BUILDDIR, "tools", "cyr_info")
    inst = ImapInstance("layout")
    with inst:
        vfile = os.path.join(inst.confdir, "cyrusdeliver.version")
        inst.create("user.alice")      # a store from before the file
        check(not os.path.exists(vfile), "the version file exists early")
        rc, out, err = run([cyr_info, "-C", inst.imapd_conf, "-M",
                            inst.cyrus_conf, "conf-lint"], check_rc=False)
        check("layout 1, written by the next ctl_cyrusdb -r" in out,
              "conf-lint without a version file: %s" % out)
        _, out, _ = run([CTL_CYRUSDB, "-C", inst.imapd_conf, "-r"])
        check("version file written" in out, "ctl_cyrusdb -r: %s" % out)
        with open(vfile) as f:
            text = f.read()
        check("layout 1\n" in text.splitlines(True), "version file: %r"
              % text)
        # the index version it records is the one mailbox.c writes
        h, _ = read_index(inst.mailbox_dir("user.alice"))
        check("index %d\n" % h["version"] in text.splitlines(True),
              "version file %r, cyrus.index version %d" % (text,
                                                          h["version"]))
        rc, out, err = run([cyr_info, "-C", inst.imapd_conf, "-M",
                            inst.cyrus_conf, "conf-lint"], check_rc=False)
        check("ok: layout 1 (" in out and "index 1" in out,
              "conf-lint: %s" % out)
        # from the future
        with open(vfile, "w") as f:
            f.write("layout 7\nindex 3\n")
        rc, out, err = run([CTL_CYRUSDB, "-C", inst.imapd_conf, "-r"],
                           check_rc=False)
        check(rc == 1 and "says layout 7" in err and "up to 1" in err,
              "ctl_cyrusdb -r on layout 7: exit %d: %s%s" % (rc, out, err))
        rc, out, err = run([cyr_info, "-C", inst.imapd_conf, "-M",
                            inst.cyrus_conf, "conf-lint"], check_rc=False)
        check(rc == 1 and "says layout 7" in out, "conf-lint on layout 7: "
              "%d %s" % (rc, out))
        # the master's START stops the start
        inst.write_cyrus_conf()
        with open(inst.cyrus_conf) as f:
            conf = f.read()
        with open(inst.cyrus_conf, "w") as f:
            f.write('START {\n  recover cmd="ctl_cyrusdb -r"\n}\n' + conf)
        try:
            inst.start(timeout=30)
        except Fail:
            pass
        else:
            raise Fail("the master started on a layout-7 store")
        check("says layout 7" in inst.log(), "master log: %s"
              % inst.log()[-600:])
        inst.proc.wait(10)
        inst.proc = None
        with open(vfile, "w") as f:
            f.write("garbage\n")
        rc, out, err = run([CTL_CYRUSDB, "-C", inst.imapd_conf, "-r"],
                           check_rc=False)
        check(rc == 1 and "damaged" in err, "ctl_cyrusdb -r on a damaged "
              "version file: %d %s" % (rc, err))


if __name__ == "__main__":
    try:
        rc = run_imap_tests([test_refusals, test_layout, test_backends,
                             test_wrong_order, test_storm])
    finally:
        remove_new_dirs()
    sys.exit(rc)
