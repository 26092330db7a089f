#!/usr/bin/env python3
"""test_powerloss.py - simulated power loss during an LMTP delivery storm,
once per spool_sync mode.

For each mode (POWERLOSS_MODES, default "file group journal off"; a mode the
server's imapd.conf does not know is skipped with a message):

 1. A private master with lmtpd, its configuration directory (every
    database) and its spool under ROOT, mailboxes made with mbtool; then
    sync(1) and a snapshot of ROOT (powerloss.take_snapshot).
 2. The master started again under tests/crash/lossyfs.so (LD_PRELOAD,
    inherited by ctl_cyrusdb -r of START and every lmtpd), which logs
    every change below ROOT and every sync.  CLIENTS client threads
    deliver messages with unique Message-IDs over LMTP, some to two or
    three mailboxes; each 250 is recorded per (message, mailbox) with the
    log's size when the client read it.  Once MESSAGES messages are
    acknowledged (the storm in full flow, whatever the speed), the
    master and every process it started are SIGSTOPped (none runs on
    while the others die) and SIGKILLed, by PID.
 3. Power cuts: the end of the log and CUTS-1 earlier points, spread over
    the acknowledgements (the history up to a point is the records before
    it; a 250 counts at a cut when the client had it before that point).
    For each cut and each policy of dropping the unsynced operations
    (none kept, a random subset with torn writes, a random prefix; see
    powerloss.py, seed printed), the image is built into ROOT (emptied)
    and a fresh master WITHOUT the preload starts on it (START runs
    ctl_cyrusdb -r).  One probe message is delivered to every mailbox
    (the exclusive lock runs the mailbox recovery; it must succeed), then:
    every message acknowledged before the cut is in every mailbox it was
    acknowledged for, byte for byte (after the Return-Path and Received
    lines lmtpd adds); every visible message is whole (size and SHA-1 of
    its record, and exactly a message that was sent); `mbtool check -a`
    passes; no worker crashed.
    At the end of the log one more image keeps every unsynced operation
    (the kernel's state): nothing may be lost there in any mode, a check
    of the simulator itself.
 4. file, group and journal must show no loss and no damage.  off must show
    losses (the test of the test: a simulator that finds nothing for a
    mode that syncs nothing is broken), and is reported as such.

Environment: see ../lmtpd/lmtphelp.py; POWERLOSS_MODES, POWERLOSS_SEED
(default: random, printed), POWERLOSS_MESSAGES (200), POWERLOSS_CUTS (5),
POWERLOSS_CLIENTS (6), POWERLOSS_STRICT=0 (a mailbox that needs
reconstruct after the cut is only a NOTE instead of a failure, see
TORN_TAIL),
POWERLOSS_KEEP=1 (keep the directories: log, snapshot, manifest.json and
a copy of every image that failed), POWERLOSS_JOURNAL_SIZE (journal_size
in the server's imapd.conf, e.g. 1048576: with 1 MiB segments a storm
switches segments and runs checkpoints).
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "lmtpd"),
                os.path.dirname(HERE)]
from testlib import (TMPDIR, TOP_BUILDDIR, Fail, Skip,  # noqa: E402
                     check, kill_all, run_tests, tagged_processes,
                     wait_until)
from lmtphelp import (LMTPD, MASTER, MBTOOL, Conn, ConnectionClosed,  # noqa
                      Instance, dot_stuff, header_value, make_message,
                      split_added_headers, transaction)
import powerloss  # noqa: E402
from powercut import PowerCutMixin  # noqa: E402

SHIM = os.path.join(TOP_BUILDDIR, "tests", "crash", "lossyfs.so")
CTL_CYRUSDB = os.path.join(TOP_BUILDDIR, "tools", "ctl_cyrusdb")
MODES = (os.environ.get("POWERLOSS_MODES") or "file group journal off").split()
SEED = os.environ.get("POWERLOSS_SEED") or str(random.randrange(10 ** 9))
MESSAGES = int(os.environ.get("POWERLOSS_MESSAGES") or "200")
CUTS = int(os.environ.get("POWERLOSS_CUTS") or "5")
CLIENTS = int(os.environ.get("POWERLOSS_CLIENTS") or "6")
KEEP = os.environ.get("POWERLOSS_KEEP") == "1"
JOURNAL_SIZE = os.environ.get("POWERLOSS_JOURNAL_SIZE") or ""
DROP_POLICIES = ("none", "subset", "prefix")
NBOX = 6
BOXES = ["p%d" % k for k in range(NBOX)]
# not recorded, not in the image: commit.shm (group commit's shared
# state, written through MAP_SHARED, rebuilt after a reboot: boot id),
# its replacement commit.shm.PID.new, metrics.shm (counters, MAP_SHARED),
# LMDB's lock files FILE-lock (reader table, MAP_SHARED, rebuilt by the
# first opener)
EXCLUDE = ("commit.shm", "metrics.shm", "-lock")
DEADLINE = 300
STRICT = os.environ.get("POWERLOSS_STRICT") != "0"
# mailbox.c's recovery refuses (STORE_CORRUPT, 451) an index whose
# unsynced tail holds a damaged record before intact ones.  A power cut
# can leave exactly that: two reservations appended, unsynced, in one
# 4 KiB page, written back torn at a 512-byte sector boundary (the later
# record's sector on disk, the earlier one's not).  Neither was
# acknowledged, so nothing is lost, but the mailbox takes no mail until
# `mbtool reconstruct`, and reconstruct (which builds records from the
# files) then shows the torn message files of those unacknowledged
# deliveries as messages.  The test runs reconstruct, still requires
# every acknowledged message byte for byte, counts the rest, prints a
# NOTE, and fails on it unless POWERLOSS_STRICT=0 (recovery now makes
# such a record an aborted placeholder, so it should not happen); every
# other refusal
# or damaged message fails.
TORN_TAIL = r"damaged record before intact ones mailbox=<user\.([^>]+)>"


def rcpts_of(i):
    r = [BOXES[i % NBOX]]
    if i % 3 == 0:
        r.append(BOXES[(i + 1) % NBOX])
    if i % 5 == 0:
        r.append(BOXES[(i + 3) % NBOX])
    return list(dict.fromkeys(r))


_messages = {}


def message_of(tag, i):
    """Message i of a run: 300..20,000 bytes, unique Message-ID."""
    key = (tag, i)
    if key not in _messages:
        rnd = random.Random("%s/%d" % (tag, i))
        n = rnd.randint(300, 20000)
        line = b"%d " % i
        body = b"".join(line + b"%064x\r\n" % rnd.getrandbits(256)
                        for _ in range(max(1, n // 72)))
        _messages[key] = make_message("pl.%s.%d@test.example" % (tag, i),
                                      subject="powerloss %d" % i, body=body)
    return _messages[key]


class PlInstance(PowerCutMixin, Instance):
    """An lmtp Instance whose configuration directory and spool lie in
    ROOT, and whose master may run with extra environment."""

    def __init__(self, name, mode):
        super().__init__(name)
        self.root = self.path("root")
        os.mkdir(self.root)
        shutil.rmtree(self.confdir)
        shutil.rmtree(self.partition)
        self.confdir = os.path.join(self.root, "conf")
        self.partition = os.path.join(self.root, "spool")
        self.extra_env = {}
        self.mode = mode
        conf = {"spool_sync": mode}
        if JOURNAL_SIZE:
            conf["journal_size"] = JOURNAL_SIZE
        self.write_imapd_conf(conf)
        self.make_dirs()

    def write_conf(self):
        self.write_cyrus_conf(prefork=2, maxchild=CLIENTS + 4)
        with open(self.cyrus_conf) as f:
            text = f.read()
        with open(self.cyrus_conf, "w") as f:
            f.write('START {\n  recover cmd="%s -C %s -r"\n}\n'
                    % (CTL_CYRUSDB, self.imapd_conf)
                    + text)


def mode_known(inst):
    r = subprocess.run([MBTOOL, "-C", inst.imapd_conf, "list"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=60)
    err = r.stderr.decode(errors="replace")
    return not ("spool_sync" in err and "not one of" in err), err.strip()


# ---- the storm --------------------------------------------------------------

class Storm:
    def __init__(self, inst, tag, logpath):
        self.inst, self.tag, self.logpath = inst, tag, logpath
        self.lock = threading.Lock()
        self.acked = {}            # (i, box) -> log size when the 250 came
        self.stop = threading.Event()
        self.errors = []
        self.next = 0

    def take(self):
        with self.lock:
            i = self.next
            self.next += 1
            return i

    def client(self):
        conn = None
        try:
            while not self.stop.is_set():
                if conn is None:
                    conn = Conn(self.inst.unix_socket, timeout=60)
                    check(conn.reply().code == 220, "greeting")
                    check(conn.cmd("LHLO storm").code == 250, "LHLO")
                i = self.take()
                rcpts = rcpts_of(i)
                out = b"MAIL FROM:<storm@example.org>\r\n"
                out += b"".join(b"RCPT TO:<%s>\r\n" % r.encode()
                                for r in rcpts)
                out += b"DATA\r\n"
                conn.send(out)
                mr = conn.reply()
                rr = [conn.reply() for _ in rcpts]
                dr = conn.reply()
                check(mr.code == 250 and all(r.code == 250 for r in rr)
                      and dr.code == 354, "MAIL/RCPT/DATA: %r %r %r"
                      % (mr, rr, dr))
                conn.send(dot_stuff(message_of(self.tag, i)))
                reps = [conn.reply() for _ in rcpts]
                size = os.stat(self.logpath).st_size
                with self.lock:
                    for r, rep in zip(rcpts, reps):
                        if rep.code == 250:
                            self.acked[(i, r)] = size
                        else:
                            self.errors.append("%d %s: %r" % (i, r, rep))
        except (ConnectionClosed, OSError):
            if not self.stop.is_set():
                self.errors.append("connection lost before the cut")
        except Fail as e:
            if not self.stop.is_set():
                self.errors.append(str(e))
        finally:
            if conn:
                conn.close()

    def messages_acked(self):
        with self.lock:
            return len(set(i for i, _ in self.acked))


# ---- one image --------------------------------------------------------------

def probe(inst, tag, boxes, n):
    """Deliver probe n to each of boxes: [(box, replies)] of those that
    did not get 250."""
    failed = []
    with Conn(inst.unix_socket, timeout=60) as c:
        c.reply()
        c.cmd("LHLO probe")
        for b in boxes:
            msg = make_message("probe.%s.%s.%d@test.example" % (tag, b, n),
                               subject="probe")
            _, rr, _, per = transaction(c, "probe@example.org", [b], msg)
            if not (per and per[0].code == 250):
                failed.append((b, (rr, per)))
    return failed


def verify_image(inst, tag, acked):
    """Start a master on ROOT (as built), probe, check.  Returns
    (lost, bad, reconstructed, exposed): lists of descriptions, the
    mailboxes that needed `mbtool reconstruct` (see TORN_TAIL), and the
    damaged messages that reconstruct made visible in them."""
    lost, bad, reconstructed, exposed = [], [], [], []
    inst.extra_env = {}
    inst.mark_log()
    try:
        inst.start(ready=1, timeout=60)
    except Fail as e:
        return lost, ["the master did not start on the image: %s" % e], \
            [], []
    try:
        failed = probe(inst, tag, BOXES, 1)
        torn = set(re.findall(TORN_TAIL, inst.new_log()))
        for b, replies in failed:
            if b not in torn:
                bad.append("probe delivery to %s after recovery: %r"
                           % (b, replies))
                continue
            rc, out, err = inst.mbtool("reconstruct", "user." + b,
                                       check_rc=False)
            if rc != 0:
                bad.append("mbtool reconstruct user.%s: %s%s"
                           % (b, out, err))
                continue
            reconstructed.append(b)
        for b, replies in probe(inst, tag, reconstructed, 2):
            bad.append("probe delivery to %s after reconstruct: %r"
                       % (b, replies))
        present = {}
        for b in BOXES:
            try:
                files = inst.message_files("user." + b)
            except Fail as e:
                bad.append("user.%s: %s" % (b, e))
                continue
            # what reconstruct made visible is reported apart
            sink = exposed if b in reconstructed else bad
            for uid, p in files:
                with open(p, "rb") as f:
                    data = f.read()
                try:
                    _, _, rest = split_added_headers(data)
                except Fail:
                    sink.append("user.%s uid %d: not a stored message: %r"
                                % (b, uid, data[:40]))
                    continue
                mid = header_value(rest, "Message-ID") or ""
                if mid.startswith("<probe."):
                    continue
                try:
                    i = int(mid.strip("<>").split(".")[2].split("@")[0])
                except (IndexError, ValueError):
                    sink.append("user.%s uid %d: unknown message %r"
                               % (b, uid, data[:40]))
                    continue
                if rest != message_of(tag, i):
                    sink.append("user.%s uid %d: message %d differs from "
                               "what was sent (%d bytes stored, %d sent)"
                               % (b, uid, i, len(rest),
                                  len(message_of(tag, i))))
                    continue
                present.setdefault((i, b), uid)
        for (i, b) in sorted(acked):
            if (i, b) not in present:
                lost.append("message %d acknowledged for %s" % (i, b))
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
    return lost, bad, reconstructed, exposed


# ---- one mode ---------------------------------------------------------------

def run_mode(mode):
    """Returns (number of images, images with a loss, losses, damage
    list, self-check problems)."""
    tag = "%s%s" % (mode, SEED)
    inst = PlInstance("powerloss-%s" % mode, mode)
    try:
        known, err = mode_known(inst)
        if not known:
            raise Skip("spool_sync=%s is not a mode of this server (%s)"
                       % (mode, err))
        for b in BOXES:
            inst.create("user." + b)
        inst.write_conf()
        # once without the preload: START's recovery writes the version
        # file, workers their shared files; then the snapshot
        inst.start(ready=1)
        check(inst.stop() == [], "first start and stop")
        subprocess.run(["sync"], check=True, timeout=120)
        snapdir = inst.path("snapshot")
        manifest = powerloss.take_snapshot(inst.root, snapdir, EXCLUDE)
        if KEEP:
            with open(inst.path("manifest.json"), "w") as f:
                json.dump({"root": inst.root, "manifest": manifest}, f)
        logpath = inst.path("ops.log")
        # a sanitizer build: libasan is then not first in the list
        asan = os.environ.get("ASAN_OPTIONS", "")
        inst.extra_env = {"LD_PRELOAD": SHIM, "LOSSYFS_ROOT": inst.root,
                          "LOSSYFS_LOG": logpath,
                          "LOSSYFS_EXCLUDE": ":".join(EXCLUDE),
                          "ASAN_OPTIONS": (asan + ":" if asan else "")
                          + "verify_asan_link_order=0"}
        inst.ignore_sigkill = True
        inst.start(ready=2)
        storm = Storm(inst, tag, logpath)
        threads = [threading.Thread(target=storm.client)
                   for _ in range(CLIENTS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        ok = wait_until(lambda: storm.messages_acked() >= MESSAGES
                        or storm.errors, DEADLINE, 0.005)
        storm.stop.set()      # connections die from here on: no error
        inst.power_cut()
        for t in threads:
            t.join(60)
        took = time.monotonic() - t0
        check(not storm.errors, "storm: %s" % storm.errors[:3])
        check(ok, "only %d messages acknowledged in %d s"
              % (storm.messages_acked(), DEADLINE))
        trouble = inst.worker_trouble(inst.log())
        check(not trouble, "worker trouble under lossyfs.so: %s"
              % " | ".join(trouble[:3]))
        recs = powerloss.read_log(logpath)
        end = recs[-1].end
        offs = sorted(storm.acked.values())
        print("# %s: %d messages, %d deliveries acknowledged in %.1f s; "
              "log %d records, %.1f MB" % (mode, storm.messages_acked(),
                                           len(storm.acked), took, len(recs),
                                           end / 1e6))
        rng = random.Random("%s/cuts" % tag)
        ends = [r.end for r in recs if r.end >= offs[0]]
        cuts = []
        for k in range(CUTS - 1):
            # between the (k/CUTS) and ((k+1)/CUTS) quantiles of the acks
            lo = offs[len(offs) * k // CUTS]
            hi = offs[min(len(offs) - 1, len(offs) * (k + 1) // CUTS)]
            cand = [e for e in ends if lo <= e <= hi] or [hi]
            cuts.append(rng.choice(cand))
        cuts.append(end)
        images = lossy = nlost = nrecon = nexposed = 0
        damage, selfcheck = [], []
        for cut in cuts:
            acked = [k for k, s in storm.acked.items() if s <= cut]
            pols = DROP_POLICIES + (("all",) if cut == end else ())
            hist = powerloss.history_at(inst.root, snapdir, manifest, recs,
                                        cut)
            for w in hist.warnings[:3]:
                print("#   replay warning: %s" % w)
            nd, nu = hist.counts()
            for k, pol in enumerate(pols):
                rng2 = random.Random("%s/%d/%s" % (tag, cut, pol))
                shutil.rmtree(inst.root)
                summary = powerloss.build_image(hist, pol, rng2, inst.root)
                inst.chown_tree(inst.root)
                lost, bad, recon, exposed = verify_image(inst, tag, acked)
                nrecon += len(recon)
                nexposed += len(exposed)
                images += 1
                print("#   cut at %d/%d (%d acked, %d durable ops, %d "
                      "unsynced) %s: kept %d torn %d -> %d lost%s"
                      % (cut, end, len(acked), nd, nu, pol, summary["kept"],
                         summary["torn"], len(lost),
                         (", damage: %s" % bad[0]) if bad else ""))
                if recon:
                    print("#     torn index tail, mbtool reconstruct "
                          "needed: %s" % " ".join(recon))
                for x in exposed[:3]:
                    print("#     made visible by reconstruct: %s" % x)
                for x in lost[:3]:
                    print("#     lost: %s" % x)
                if lost:
                    lossy += 1
                    nlost += len(lost)
                if KEEP and (lost or bad):
                    kept = inst.path("image-%d-%s" % (cut, pol))
                    shutil.copytree(inst.root, kept, symlinks=True)
                    print("#     image kept in %s" % kept)
                if pol == "all" and (lost or bad):
                    selfcheck.append("cut %d, every unsynced operation "
                                     "kept: %d lost, %s" % (cut, len(lost),
                                                            bad[:2]))
                damage += ["cut %d %s: %s" % (cut, pol, x) for x in bad]
        return images, lossy, nlost, damage, selfcheck, nrecon, nexposed
    finally:
        try:
            if inst.proc is not None:
                inst.power_cut()
        finally:
            left = tagged_processes(inst.TAG_VAR, inst.dir)
            kill_all(left)
            if not KEEP:
                inst.cleanup()
            else:
                print("# kept %s" % inst.dir)


# ---- the simulator on a scripted history -----------------------------------

SCRIPT = r"""
import os, sys
r = sys.argv[1]
def put(path, data, off=None):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
    if off is None:
        os.write(fd, data)
    else:
        os.pwrite(fd, data, off)
    return fd
def dsync(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
fd = put(r + "/e", b"eee")          # both name and data by syncfs
os.link(r + "/e", r + "/e2")
os.rename(r + "/e2", r + "/e3")
os.unlink(r + "/old")
os.syncfs(fd) if hasattr(os, "syncfs") else os.sync()
os.close(fd)
fd = put(r + "/a", b"one")         # data synced, name only by dsync(r)
os.fsync(fd)
dsync(r)
os.pwrite(fd, b"TWO" * 200, 3)      # unsynced, 600 bytes over 2 sectors
os.close(fd)
fd = put(r + "/b", b"bbb")          # file synced, its name never
os.fsync(fd)
os.close(fd)
os.mkdir(r + "/d")                  # d's entry never synced (r not again)
fd = put(r + "/d/c", b"ccc")
os.fsync(fd)
dsync(r + "/d")
os.close(fd)
os.rename(r + "/e3", r + "/e4")     # unsynced rename
fd = put(r + "/a", b"x", 5000)      # unsynced extension of a
os.close(fd)
"""


def test_simulator():
    """The disk model on a scripted history (lossyfs.so under a Python
    child): what survives with every unsynced operation dropped, and with
    every one kept."""
    tmp = tempfile.mkdtemp(prefix="powerloss-sim.", dir=TMPDIR)
    try:
        root = os.path.join(tmp, "root")
        os.mkdir(root)
        with open(os.path.join(root, "old"), "w") as f:
            f.write("old")
        manifest = powerloss.take_snapshot(root, os.path.join(tmp, "snap"))
        logpath = os.path.join(tmp, "ops.log")
        env = dict(os.environ, LD_PRELOAD=SHIM, LOSSYFS_ROOT=root,
                   LOSSYFS_LOG=logpath)
        r = subprocess.run([sys.executable, "-c", SCRIPT, root], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60)
        check(r.returncode == 0, "script: %s" % r.stdout.decode()[-500:])
        recs = powerloss.read_log(logpath)
        hist = powerloss.history_at(root, os.path.join(tmp, "snap"),
                                    manifest, recs, recs[-1].end)
        check(not hist.warnings, "replay warnings: %s" % hist.warnings)

        def image(policy, seed=0):
            out = os.path.join(tmp, "img-%s-%d" % (policy, seed))
            powerloss.build_image(hist, policy, random.Random(seed), out)
            tree = {}
            for dirpath, dirs, files in os.walk(out):
                for fn in files:
                    p = os.path.join(dirpath, fn)
                    with open(p, "rb") as f:
                        tree[os.path.relpath(p, out)] = f.read()
                for d in dirs:
                    tree[os.path.relpath(os.path.join(dirpath, d), out)] = \
                        "dir"
            return tree
        none = image("none")
        check(none == {"a": b"one", "e": b"eee", "e3": b"eee"},
              "nothing unsynced kept: %r" % none)
        full = image("all")
        a = b"one" + b"TWO" * 200
        want = {"a": a + bytes(5000 - len(a)) + b"x", "b": b"bbb",
                "d": "dir", "d/c": b"ccc", "e": b"eee", "e4": b"eee"}
        check(full == want, "everything kept: %r" % {
            k: (v[:20] if isinstance(v, bytes) else v)
            for k, v in full.items()})
        # subset: the two sectors of the unsynced write to a are each
        # old or new, never anything else
        seen = set()
        for seed in range(40):
            img = image("subset", seed)
            got = img.get("a", b"")[:603]
            s1 = got[3:512] == a[3:512]
            s2 = got[512:603] == a[512:603]
            check(s1 or got[3:512] in (b"", bytes(len(got[3:512]))),
                  "sector 0 of a: %r" % got[:40])
            seen.add((s1, s2))
            check(img.get("d/c") is None or "d" in img, "d/c without d")
        check(len(seen) >= 3, "torn writes never torn: %s" % seen)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_mode_test(mode):
    def t():
        (images, lossy, nlost, damage, selfcheck, nrecon,
         nexposed) = run_mode(mode)
        check(not selfcheck, "the simulator itself is wrong (seed %s): %s"
              % (SEED, selfcheck[:2]))
        if mode == "off":
            # the check of the check: syncing nothing must lose mail
            check(nlost > 0, "spool_sync=off lost nothing in %d images: "
                  "the simulator cannot see a loss (seed %s)"
                  % (images, SEED))
            print("# off: %d of %d images lost %d acknowledged deliveries "
                  "(expected: off syncs nothing)" % (lossy, images, nlost))
            return
        check(nlost == 0 and not damage, "spool_sync=%s (seed %s): %d "
              "acknowledged deliveries lost in %d of %d images; damage: %s"
              % (mode, SEED, nlost, lossy, images, damage[:3]))
        if nrecon:
            print("# NOTE: %s: %d mailbox(es) refused delivery after "
                  "recovery (torn index tail) until mbtool reconstruct, "
                  "which then showed %d damaged unacknowledged "
                  "message(s); nothing acknowledged was lost"
                  % (mode, nrecon, nexposed))
            check(not STRICT, "%d mailbox(es) needed "
                  "reconstruct (seed %s)" % (nrecon, SEED))
    t.__name__ = "test_%s" % mode
    return t


def main():
    print("# seed %s (POWERLOSS_SEED=%s reruns it)" % (SEED, SEED))
    if not os.path.exists(SHIM):
        print("FAIL: setup (missing %s: run make check)" % SHIM)
        print("0 passed, 1 failed")
        return 1
    tests = [test_simulator] + [make_mode_test(m) for m in MODES]
    return run_tests(tests, "POWERLOSS_TESTS", (MASTER, LMTPD, MBTOOL,
                                                CTL_CYRUSDB))


if __name__ == "__main__":
    sys.exit(main())
