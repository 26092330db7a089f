#!/usr/bin/env python3
"""test_admin_tools.py - the tools an admin types first, against a real
master with lmtpd where it matters:

- root_tool_then_master: mbtool run as root (as an admin does) becomes
  cyrus_user, so the master started as root (it becomes cyrus_user too)
  delivers to the mailbox it made: 250 and the message in the spool;
  a cyrus_user that does not exist is refused, saying so;
- help: every program the build installs (bin_PROGRAMS of Makefile.am)
  answers --help and -h with a usage text on stdout and exit 0;
- masterstatus_conf: `masterstatus -C imapd.conf` finds the running
  master's status file (the master was started with -s elsewhere) and
  prints times as dates with their age, not epoch seconds;
- dbtool_order: cyr_dbtool on a mailbox-order file without -M says so
  ("use -M") instead of calling it damaged, for every backend; a really
  damaged file is still reported damaged;
- backend_mismatch: mboxlist_db changed to lmdb over a skiplist
  mailboxes.db: the master's START (ctl_cyrusdb -r) fails, the master
  exits non-zero, and its log names the file, both backends and the
  cvt_cyrusdb command; that command, run as given, fixes it;
- cyr_info: conf (set keys only, sorted), conf-all, and conf-lint on a
  good configuration (exit 0) and on each kind of error (exit 1).

The root-only parts skip when not run as root, or when user cyrus cannot
reach the build tree (testlib.RUN_AS).  Environment: top_builddir,
top_srcdir, TEST_TMPDIR, ADMIN_TESTS (names to run).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(TESTS_DIR, "lmtpd"), TESTS_DIR]
from testlib import (MASTER, MASTERSTATUS, RUN_AS, TMPDIR,  # noqa: E402
                     TOP_BUILDDIR, Fail, Skip, check, chown_run_as,
                     run_tests, wait_until)
from lmtphelp import (LMTPD, LMTPD_DIR, MBTOOL, Conn,  # noqa: E402
                      Instance, make_message, transaction)

TOP_SRCDIR = os.path.abspath(os.environ.get("top_srcdir")
                             or os.path.join(HERE, "..", ".."))
TOOLS = os.path.join(TOP_BUILDDIR, "tools")
DBTOOL = os.path.join(TOOLS, "cyr_dbtool")
CTL = os.path.join(TOOLS, "ctl_cyrusdb")
CYR_INFO = os.path.join(TOOLS, "cyr_info")


def run(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120, **kw)
    return (r.returncode, r.stdout.decode(errors="replace"),
            r.stderr.decode(errors="replace"))


def scratch(name):
    os.makedirs(TMPDIR, exist_ok=True)
    d = tempfile.mkdtemp(prefix="admin-%s." % name, dir=TMPDIR)
    os.chmod(d, 0o755)
    return d


def deliver_one(inst, user, msgid):
    """One message to user over the instance's UNIX socket: the reply
    codes of RCPT and of the message."""
    with Conn(inst.unix_socket) as c:
        check(c.reply().code == 220, "no LMTP greeting")
        _, rr, _, dr = transaction(c, "admin@example.org", [user],
                                   make_message(msgid), lhlo="x.example")
        return [r.code for r in rr], [r.code for r in dr], dr


# ---- 1. a tool run as root, then the master ---------------------------------

def test_root_tool_then_master():
    if os.geteuid() != 0:
        raise Skip("needs root: the tool must start as root")
    if RUN_AS is None:
        raise Skip("no user cyrus that can reach the build tree")
    # cyrus_user is the default (cyrus): the directories are its own, as
    # an admin sets them up; the tool itself runs as root
    with Instance("roottool") as inst:
        code, out, err = run([MBTOOL, "-C", inst.imapd_conf, "create",
                              "user.bob"])
        check(code == 0, "mbtool create as root: exit %d %s%s"
              % (code, out, err))
        inst.write_cyrus_conf()
        inst.start()
        rcpt, data, dr = deliver_one(inst, "bob", "root-tool@example.org")
        check(rcpt == [250] and data == [250], "delivery to bob: RCPT %s, "
              "DATA %r" % (rcpt, dr))
        msgs = inst.messages("user.bob")
        check(len(msgs) == 1 and b"root-tool@example.org" in msgs[0],
              "user.bob holds %d messages" % len(msgs))
        for p in (os.path.join(inst.confdir, "mailboxes.db"),
                  inst.mailbox_dir("user.bob")):
            st = os.stat(p)
            check(st.st_uid == RUN_AS.pw_uid, "%s is owned by uid %d, not "
                  "by cyrus_user (%d)" % (p, st.st_uid, RUN_AS.pw_uid))

    # a cyrus_user that does not exist: refused before anything is made
    d = scratch("nouser")
    try:
        conf = os.path.join(d, "imapd.conf")
        with open(conf, "w") as f:
            f.write("configdirectory: %s/conf\npartition-default: %s/spool\n"
                    "cyrus_user: nosuchuser-cyrusdeliver\n" % (d, d))
        code, out, err = run([MBTOOL, "-C", conf, "create", "user.bob"])
        check(code == 1, "unknown cyrus_user: exit %d" % code)
        check("nosuchuser-cyrusdeliver" in err and "does not exist" in err
              and "cyrus_user" in err,
              "unknown cyrus_user: message %r" % err)
        check(not os.path.exists(os.path.join(d, "conf")),
              "something was created for an unknown cyrus_user")
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---- 2. --help and -h ------------------------------------------------------

def installed_programs():
    """The programs Makefile.am installs (bin/sbin/(pkg)libexec _PROGRAMS)."""
    with open(os.path.join(TOP_SRCDIR, "Makefile.am")) as f:
        text = f.read().replace("\\\n", " ")
    progs = []
    for m in re.finditer(r"^(?:bin|sbin|libexec|pkglibexec)_PROGRAMS\s*\+?=(.*)$",
                         text, re.M):
        progs += m.group(1).split()
    return progs


def test_help():
    progs = installed_programs()
    check(len(progs) >= 10, "only %d programs found in Makefile.am: %s"
          % (len(progs), progs))
    bad = []
    for prog in progs:
        path = os.path.join(TOP_BUILDDIR, prog)
        if not os.access(path, os.X_OK):
            bad.append("%s: not built" % prog)
            continue
        for flag in ("--help", "-h"):
            code, out, err = run([path, flag], stdin=subprocess.DEVNULL)
            if code != 0 or "usage" not in out.lower():
                bad.append("%s %s: exit %d, usage on stdout: %s"
                           % (prog, flag, code, "usage" in out.lower()))
    check(not bad, "; ".join(bad))


# ---- 3. masterstatus -C ------------------------------------------------------

EPOCH = re.compile(r"\b1[5-9]\d{8}\b")
ISO = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}, \d+s ago")


def test_masterstatus_conf():
    with Instance("mstatus") as inst:
        inst.write_cyrus_conf()
        inst.start()
        # the master writes DIR/master.status (-s); configdirectory is
        # DIR/conf: the tool must find the file of the master that reads
        # this imapd.conf; run from elsewhere
        check(not os.path.exists(os.path.join(inst.confdir,
                                              "master.status")),
              "a status file in configdirectory: the test proves nothing")
        code, out, err = run([MASTERSTATUS, "-C", inst.imapd_conf], cwd="/")
        check(code == 0, "masterstatus -C: exit %d: %s" % (code, err))
        check("lmtpunix" in out, "no service in:\n%s" % out)
        check(inst.statusfile in out, "the status file used is not named:"
              "\n%s" % out)
        check(ISO.search(out), "no readable time (date and age) in:\n%s"
              % out)
        check(not EPOCH.search(out), "epoch seconds in:\n%s" % out)
        # children's ages are durations
        check(re.search(r"\bready\s+\d+\s+\d+s\b", out),
              "no child age as a duration in:\n%s" % out)


# ---- 4. cyr_dbtool and the key order ---------------------------------------

ORDER_KEYS = ["user.a", "user.a.b", "user.a-b", "user.ab", "user.b"]


def test_dbtool_order():
    d = scratch("order")
    try:
        for be in ("skiplist", "flat", "lmdb", "db3"):
            f = os.path.join(d, "mailboxes-%s.db" % be)
            lines = "".join("set %s v-%s\n" % (k, k) for k in ORDER_KEYS)
            code, _, err = run([DBTOOL, "-n", "-M", f, be, "batch"],
                               input=lines.encode())
            check(code == 0, "%s: making the file: %s" % (be, err))
            code, out, err = run([DBTOOL, "-M", f, be, "consistent"])
            check(code == 0 and "Yes, consistent" in out,
                  "%s -M consistent: exit %d %s%s" % (be, code, out, err))
            for action in (["consistent"], ["show"], ["get", "user.a.b"]):
                code, out, err = run([DBTOOL, f, be] + action)
                check(code == 2, "%s %s without -M: exit %d"
                      % (be, action[0], code))
                check("mailbox order" in err and "use -M" in err,
                      "%s %s without -M: %r" % (be, action[0], err))
                check("damaged" not in err and "not consistent" not in out,
                      "%s %s without -M still says damaged: %s%s"
                      % (be, action[0], out, err))
        # a damaged skiplist is still called damaged: the last key made
        # smaller than every other one is out of order in both orders
        f = os.path.join(d, "mailboxes-skiplist.db")
        with open(f, "rb") as fh:
            data = fh.read()
        check(b"user.b" in data, "key user.b not found in the skiplist file")
        with open(f, "wb") as fh:
            fh.write(data.replace(b"user.b", b"user.!"))
        code, out, err = run([DBTOOL, f, "skiplist", "consistent"])
        check(code == 1 and "No, not consistent" in out,
              "damaged skiplist: exit %d %s%s" % (code, out, err))
        check("use -M" not in err, "damaged skiplist taken for one in "
              "mailbox order: %s" % err)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---- 5. a backend changed without conversion -----------------------------------

def write_start_conf(inst):
    with open(inst.cyrus_conf, "w") as f:
        f.write('START {\n  recover cmd="%s -C %s -r"\n}\n'
                'SERVICES {\n  lmtpunix cmd="lmtpd" listen="%s" prefork=1\n}\n'
                % (CTL, inst.imapd_conf, inst.unix_socket))


def test_backend_mismatch():
    with Instance("mismatch") as inst:
        inst.create("user.bob")     # skiplist, the default
        mbdb = os.path.join(inst.confdir, "mailboxes.db")
        with open(inst.imapd_conf, "a") as f:
            f.write("mboxlist_db: lmdb\n")
        write_start_conf(inst)
        inst.spawn([MASTER, "-D", "-l", "-C", inst.imapd_conf, "-M",
                    inst.cyrus_conf, "-S", LMTPD_DIR, "-s", inst.statusfile])
        try:
            rc = inst.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise Fail("the master kept running over a mismatched "
                       "mailboxes.db")
        inst.rc = rc
        inst.proc = None
        log = inst.log()
        check(rc != 0, "master exit status %d" % rc)
        check("START failed" in log, "no START failure in the log")
        m = re.search(r"ctl_cyrusdb: (%s is in skiplist format, but "
                      r"mboxlist_db is lmdb.*)" % re.escape(mbdb), log)
        check(m, "no message naming the file and both backends:\n%s"
              % log[-1500:])
        msg = m.group(1)
        cmd = re.search(r"convert it \([^)]*\): (.*?)  -- or set", msg)
        check(cmd and "cvt_cyrusdb" in cmd.group(1) and " -M " in
              cmd.group(1), "no cvt_cyrusdb command with -M in: %s" % msg)
        # the command, as given (run as root it acts as the file's owner)
        r = subprocess.run(cmd.group(1), shell=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=120)
        check(r.returncode == 0, "the advised command failed: %s"
              % r.stdout.decode(errors="replace"))
        inst.start()
        rcpt, data, dr = deliver_one(inst, "bob", "after-cvt@example.org")
        check(rcpt == [250] and data == [250], "delivery after the "
              "conversion: RCPT %s, DATA %r" % (rcpt, dr))


# ---- 6. cyr_info --------------------------------------------------------------

def info(conf, *args):
    return run([CYR_INFO, "-C", conf] + list(args))


def test_cyr_info():
    d = scratch("info")
    try:
        confdir, spool = os.path.join(d, "conf"), os.path.join(d, "spool")
        for p in (confdir, spool):
            os.mkdir(p)
            chown_run_as(p)
        conf = os.path.join(d, "imapd.conf")
        cyrusconf = os.path.join(d, "cyrus.conf")
        base = ("configdirectory: %s\npartition-default: %s\n"
                "lmtp_timeout: 600\n" % (confdir, spool))
        if os.geteuid() == 0 and RUN_AS is None:
            base += "cyrus_user: root\n"

        def write(extra="", cyrus='SERVICES {\n  lmtp cmd="lmtpd" '
                  'listen="/tmp/x.sock"\n}\n'):
            with open(conf, "w") as f:
                f.write(base + extra)
            with open(cyrusconf, "w") as f:
                f.write(cyrus)

        write()
        code, out, err = info(conf, "conf")
        lines = out.splitlines()
        check(code == 0 and lines == sorted(lines) and
              "lmtp_timeout: 600" in lines and
              not any(x.startswith("maxheaderlines") for x in lines),
              "conf: exit %d:\n%s%s" % (code, out, err))
        code, out, _ = info(conf, "conf-all")
        check(code == 0 and "maxheaderlines: 1000" in out.splitlines()
              and "lmtp_timeout: 600" in out.splitlines(),
              "conf-all: exit %d:\n%s" % (code, out))

        code, out, err = info(conf, "-M", cyrusconf, "conf-lint")
        check(code == 0 and "0 errors, 0 warnings" in out,
              "conf-lint of a good configuration: exit %d:\n%s%s"
              % (code, out, err))

        # each kind of finding
        cases = [
            ("unknown key", "partiton-default: /x\n", None, 0,
             r"warning: .*imapd.conf:\d+: unknown key partiton-default"),
            ("missing configdirectory", "configdirectory: %s/nodir\n" % d,
             None, 1, r"error: configdirectory .*nodir: No such file"),
            ("defaultpartition", "defaultpartition: other\n", None, 1,
             r"error: defaultpartition is \"other\""),
            ("unknown cyrus_user", "cyrus_user: nosuchuser-cyrusdeliver\n",
             None, 1, r"error: cyrus_user is \"nosuchuser-cyrusdeliver\""),
            ("broken cyrus.conf", "", "SERVICES {\n", 1,
             r"error: .*cyrus.conf:\d+"),
            ("malformed imapd.conf", "lmtp_timeout: soon\n", None, 1,
             r"error: .*imapd.conf:\d+: key lmtp_timeout"),
        ]
        if os.geteuid() == 0 and RUN_AS is not None:
            ro = os.path.join(d, "rootonly")
            os.mkdir(ro, 0o755)
            cases.append(("partition not writable by cyrus_user",
                          "partition-other: %s\n" % ro, None, 1,
                          r"error: partition other: .*rootonly: user cyrus "
                          r"may not write there"))
        for name, extra, cyrus, want, pattern in cases:
            if cyrus is None:
                write(extra)
            else:
                write(extra, cyrus)
            code, out, err = info(conf, "-M", cyrusconf, "conf-lint")
            check(code == want and re.search(pattern, out),
                  "conf-lint, %s: exit %d (want %d), /%s/ in:\n%s%s"
                  % (name, code, want, pattern, out, err))

        # a database file that does not match its backend
        write()
        code, _, err = run([DBTOOL, "-n", "-M",
                            os.path.join(confdir, "mailboxes.db"),
                            "skiplist", "set", "user.x", "v"])
        check(code == 0, "making mailboxes.db: %s" % err)
        write("mboxlist_db: lmdb\n")
        code, out, err = info(conf, "-M", cyrusconf, "conf-lint")
        check(code == 1 and re.search(r"error: .*mailboxes.db is in skiplist "
                                      r"format, but mboxlist_db is lmdb.*"
                                      r"cvt_cyrusdb", out),
              "conf-lint, backend mismatch: exit %d:\n%s%s" % (code, out, err))
    finally:
        shutil.rmtree(d, ignore_errors=True)


TESTS = [
    test_root_tool_then_master,
    test_help,
    test_masterstatus_conf,
    test_dbtool_order,
    test_backend_mismatch,
    test_cyr_info,
]

if __name__ == "__main__":
    sys.exit(run_tests(TESTS, "ADMIN_TESTS",
                       (MASTER, LMTPD, MBTOOL, MASTERSTATUS, DBTOOL, CTL,
                        CYR_INFO)))
