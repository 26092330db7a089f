#!/usr/bin/env python3
"""test_flagloss.py - simulated power loss after IMAP flag changes,
expunges and appends that were not all synced.

With spool_sync_flags off (the default) a STORE is answered before its
index change is on disk (store/mailbox.c, FLAG CHANGES).  The contract:
a power loss may undo the last flag changes, never an acknowledged
APPEND or EXPUNGE, and the index stays consistent.

 1. A private master (imapd, START runs ctl_cyrusdb -r) with its
    configuration directory and spool under ROOT, one mailbox of
    MESSAGES messages; sync(1) and a snapshot of ROOT.
 2. The master again under tests/crash/lossyfs.so (every change below
    ROOT and every sync logged), CYRUSDELIVER_BOOT_ID=one.  One IMAP
    session: rounds of STORE +FLAGS (\\Flagged) (also \\Seen), and every
    few rounds an APPEND, or a STORE \\Deleted and UID EXPUNGE; each OK
    is noted with the log's size when it came.  Halfway an EXPUNGE is
    the barrier: it syncs the index, so every flag change answered
    before it must survive any cut after it.  Then every process is
    stopped and killed (the power cut).
 3. For several cuts and each policy of dropping the unsynced writes
    (powerloss.py), the image is built and a master WITHOUT the preload
    starts on it as after a reboot (CYRUSDELIVER_BOOT_ID=two).  An APPEND
    (the exclusive lock runs the recovery) must succeed, then: every
    APPEND acknowledged before the cut is there, no message whose
    EXPUNGE was acknowledged is, every flag covered by a sync before the
    cut is set, `mbtool check -a` passes (counters,
    highestmodseq at least every record's modseq).
At the end of the log an image that keeps every unsynced write (the
kernel's state) must also have every flag answered.

Environment: see ../lmtpd/lmtphelp.py; FLAGLOSS_SEED (default random,
printed), FLAGLOSS_KEEP=1 (keep the directories).
"""
import os
import random
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "lmtpd"),
                os.path.join(os.path.dirname(HERE), "imapd"),
                os.path.dirname(HERE)]
from testlib import (TOP_BUILDDIR, Fail, Skip,  # noqa: E402
                     check, kill_all, run_tests, tagged_processes)
from imaphelp import ImapInstance, Raw, make_message  # noqa: E402
import powerloss  # noqa: E402
from powercut import PowerCutMixin  # noqa: E402

SHIM = os.path.join(TOP_BUILDDIR, "tests", "crash", "lossyfs.so")
CTL_CYRUSDB = os.path.join(TOP_BUILDDIR, "tools", "ctl_cyrusdb")
SEED = os.environ.get("FLAGLOSS_SEED") or str(random.randrange(10 ** 9))
KEEP = os.environ.get("FLAGLOSS_KEEP") == "1"
EXCLUDE = ("commit.shm", "metrics.shm", "-lock")
USER, PW = "fl", "fl-pw"
MESSAGES = 40
ROUNDS = 36
POLICIES = ("none", "subset", "prefix")
FETCH_RE = re.compile(rb"^\* \d+ FETCH \((.*)\)")


class FlInstance(PowerCutMixin, ImapInstance):
    """imapd whose configuration directory and spool lie in ROOT, and
    whose master may run with extra environment."""

    def __init__(self, name):
        super().__init__(name, conf={"allowplaintext": "yes"},
                         sasl=(USER, PW))
        self.root = self.path("root")
        os.mkdir(self.root)
        shutil.rmtree(self.confdir)
        shutil.rmtree(self.partition)
        self.confdir = os.path.join(self.root, "conf")
        self.partition = os.path.join(self.root, "spool")
        self.extra_env = {}
        self.write_imapd_conf({"allowplaintext": "yes"})
        self.make_dirs()

    def write_conf(self):
        self.write_cyrus_conf(imaps=False, lmtp=False, prefork=1,
                              maxchild=4)
        with open(self.cyrus_conf) as f:
            text = f.read()
        with open(self.cyrus_conf, "w") as f:
            f.write('START {\n  recover cmd="%s -C %s -r"\n}\n'
                    % (CTL_CYRUSDB, self.imapd_conf) + text)

    def spawn(self, cmd):
        # a status file of the last master would say "ready" at once
        if os.path.exists(self.statusfile):
            os.unlink(self.statusfile)
        super().spawn(cmd)


def login(inst):
    c = Raw(inst.addr(), timeout=60)
    c.line()
    r = c.cmd("L", "LOGIN %s %s" % (USER, PW))
    check(r[-1].startswith(b"L OK"), "LOGIN: %r" % r)
    r = c.cmd("S", "SELECT INBOX")
    check(r[-1].startswith(b"S OK"), "SELECT: %r" % r)
    return c


def ok(r, tag):
    check(r[-1].startswith(tag.encode() + b" OK"), "%s: %r" % (tag, r))
    return r


def append(c, tag, msgid):
    m = make_message(msgid=msgid)
    m = m if isinstance(m, bytes) else m.encode()
    c.send(b"%s APPEND INBOX {%d+}\r\n" % (tag.encode(), len(m)) + m
           + b"\r\n")
    return ok(c.until_tagged(tag), tag)


def state(c):
    """{uid: (flags text, message-id)} of the selected mailbox."""
    r = ok(c.cmd("F", "UID FETCH 1:* (UID FLAGS BODY.PEEK[HEADER.FIELDS "
                      "(MESSAGE-ID)])"), "F")
    got = {}
    text = b"\n".join(r)
    for m in re.finditer(rb"UID (\d+) FLAGS \(([^)]*)\) BODY\[HEADER\."
                         rb"FIELDS \(MESSAGE-ID\)\] \{\d+\}\r?\n?"
                         rb"(?:Message-I[dD]: *<([^>]*)>)?", text):
        got[int(m.group(1))] = (m.group(2).decode(),
                                (m.group(3) or b"").decode())
    return got


def run_session(inst, logpath):
    """The session of step 2: a list of (kind, what, log size), and the
    session, still open."""
    def size():
        return os.stat(logpath).st_size
    events = []
    rnd = random.Random("%s/ops" % SEED)
    c = login(inst)
    n = 0
    nexp = 1
    for k in range(ROUNDS):
        uid = MESSAGES - k       # each STORE changes something
        flag = "\\Flagged" if k % 2 else "\\Seen"
        n += 1
        ok(c.cmd("f%d" % n, "UID STORE %d +FLAGS (%s)" % (uid, flag)),
           "f%d" % n)
        events.append(("flag", (uid, flag), size()))
        if k == ROUNDS // 2 or rnd.random() < 0.2:
            n += 1
            ok(c.cmd("d%d" % n, "UID STORE %d +FLAGS.SILENT (\\Deleted)"
                     % nexp), "d%d" % n)
            n += 1
            ok(c.cmd("e%d" % n, "UID EXPUNGE %d" % nexp), "e%d" % n)
            events.append(("expunged", nexp, size()))
            nexp += 1
        elif rnd.random() < 0.3:
            n += 1
            msgid = "fl.%s.%d@test" % (SEED, n)
            append(c, "a%d" % n, msgid)
            events.append(("appended", msgid, size()))
    # left open: closing the mailbox would sync what the cut should find
    return events, c


def verify(inst, events, cut, everything):
    """Problems of the image in ROOT."""
    bad = []
    inst.extra_env = {"CYRUSDELIVER_BOOT_ID": "two"}
    inst.mark_log()
    try:
        inst.start(ready=1, timeout=60)
    except Fail as e:
        return ["the master did not start on the image: %s" % e]
    try:
        c = login(inst)
        try:
            append(c, "P", "probe.%d@test" % cut)
        except Fail as e:
            bad.append("APPEND after the restart: %s" % e)
        st = state(c)
        c.close()
        ids = set(v[1] for v in st.values())
        barrier = max([s for kind, _, s in events
                       if kind == "expunged" and s <= cut] or [-1])
        # a STORE of \Seen commits to the seen file (whose next commit's
        # sync carries the one before) only while its message is there
        gone_at = dict((what, s) for kind, what, s in events
                       if kind == "expunged")
        for kind, what, s in events:
            if s > cut:
                continue
            if kind == "appended" and what not in ids:
                bad.append("APPEND acknowledged, message lost: %s" % what)
            elif kind == "expunged" and what in st:
                bad.append("EXPUNGE acknowledged, uid %d back" % what)
            elif kind == "flag" and (everything or (
                    s <= barrier if what[1] != "\\Seen" else
                    any(k2 == "flag" and w2[1] == "\\Seen" and s < s2 <= cut
                        and gone_at.get(w2[0], s2 + 1) > s2
                        for k2, w2, s2 in events))):
                uid, flag = what
                if uid in st and flag not in st[uid][0].split():
                    bad.append("%s on uid %d answered before a sync that "
                               "covers it (or kept) and lost: %r"
                               % (flag, uid, st[uid][0]))
        rc, out, err = inst.mbtool("check", "-a", check_rc=False)
        if rc != 0:
            bad.append("mbtool check -a: exit %d: %s%s"
                       % (rc, out[-300:], err[-300:]))
    finally:
        problems = inst.stop()
        trouble = inst.worker_trouble()
        if problems:
            bad.append("stop: %s" % "; ".join(problems))
        if trouble:
            bad.append("worker trouble: %s" % " | ".join(trouble[:3]))
    return bad


def test_flagloss():
    if not os.path.exists(SHIM):
        raise Skip("%s not built" % SHIM)
    print("# seed %s" % SEED)
    inst = FlInstance("flagloss")
    try:
        inst.create("user." + USER)
        for n in range(MESSAGES):
            inst.mbtool("deliver", "-M", "user." + USER,
                        input=make_message(msgid="m%d@test" % n))
        inst.write_conf()
        inst.extra_env = {"CYRUSDELIVER_BOOT_ID": "one"}
        inst.start(ready=1)
        check(inst.stop() == [], "first start and stop")
        subprocess.run(["sync"], check=True, timeout=120)
        snapdir = inst.path("snapshot")
        manifest = powerloss.take_snapshot(inst.root, snapdir, EXCLUDE)
        logpath = inst.path("ops.log")
        asan = os.environ.get("ASAN_OPTIONS", "")
        inst.extra_env = {"LD_PRELOAD": SHIM, "LOSSYFS_ROOT": inst.root,
                          "LOSSYFS_LOG": logpath,
                          "LOSSYFS_EXCLUDE": ":".join(EXCLUDE),
                          "CYRUSDELIVER_BOOT_ID": "one",
                          "ASAN_OPTIONS": (asan + ":" if asan else "")
                          + "verify_asan_link_order=0"}
        inst.ignore_sigkill = True
        inst.start(ready=1)
        events, c = run_session(inst, logpath)
        inst.power_cut()
        c.close()
        recs = powerloss.read_log(logpath)
        end = recs[-1].end
        ends = [r.end for r in recs]
        rng = random.Random("%s/cuts" % SEED)
        exp = [s for kind, _, s in events if kind == "expunged"]
        # just before and just after a barrier, random points, the end
        cuts = set([end])
        for s in exp[:2] + exp[-1:]:
            cuts.add(max([e for e in ends if e < s] or [ends[0]]))
            cuts.add(s)
        for _ in range(6):
            cuts.add(rng.choice(ends))
        # right after STOREs answered (their writes unsynced)
        flags = [s for kind, _, s in events if kind == "flag"]
        for _ in range(8):
            cuts.add(rng.choice(flags))
        problems = []
        images = 0
        for cut in sorted(cuts):
            hist = powerloss.history_at(inst.root, snapdir, manifest, recs,
                                        cut)
            for pol in POLICIES + (("all",) if cut == end else ()):
                rng2 = random.Random("%s/%d/%s" % (SEED, cut, pol))
                shutil.rmtree(inst.root)
                powerloss.build_image(hist, pol, rng2, inst.root)
                inst.chown_tree(inst.root)
                bad = verify(inst, events, cut, pol == "all")
                images += 1
                for b in bad:
                    problems.append("cut %d/%d %s: %s" % (cut, end, pol, b))
                    if KEEP:
                        kept = inst.path("image-%d-%s" % (cut, pol))
                        if not os.path.exists(kept):
                            shutil.copytree(inst.root, kept, symlinks=True)
        print("# %d events, %d images, %d problems"
              % (len(events), images, len(problems)))
        check(not problems, "\n".join(problems[:10]))
    finally:
        try:
            if inst.proc is not None:
                inst.power_cut()
        finally:
            kill_all(tagged_processes(inst.TAG_VAR, inst.dir))
            if not KEEP:
                inst.cleanup()
            else:
                print("# kept %s" % inst.dir)


if __name__ == "__main__":
    sys.exit(run_tests([test_flagloss], "FLAGLOSS_TESTS",
                       [os.path.join(TOP_BUILDDIR, "master", "master")]))
