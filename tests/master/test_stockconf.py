#!/usr/bin/env python3
"""test_stockconf.py - the master with Cyrus's stock configuration files.

Debian's /etc/cyrus.conf and /etc/imapd.conf (package cyrus-common), with
only their paths changed (configdirectory, partitions and other paths into
the test's directory, listen addresses to free 127.0.0.1 ports and UNIX
sockets there, plus sasl_sasldb_path for a private sasldb), run by the real
master in the foreground with its log captured:

- recovery ran: "/usr/sbin/cyrus ctl_cyrusdb -r" became our ctl_cyrusdb
  with -C and its log line is there, and the checkpoint event ran ours;
- START and EVENTS entries of Cyrus programs with no equivalent
  (tls_prune) are skipped with one warning each;
- SERVICES pop3, nntp and http are refused with one warning each and
  nothing listens on their ports; sieve (cmd="timsieved") runs our
  timsieved, which greets as a ManageSieve server;
- imap and lmtp work: a message delivered over LMTP (smtplib.LMTP) is read
  over IMAP (imaplib), in the hashed spool Debian's hashimapspool asks for;
- every unknown imapd.conf key is warned exactly once in the whole log,
  although several workers and tools read the file.

test_stock_fixture uses copies kept in tests/master (debian-cyrus.conf,
debian-imapd.conf); test_stock_installed the files of the installed package
(skipped when cyrus-common is not installed).  test_mapping_forms checks
the other spellings of Cyrus's commands (bare names, Cyrus's directory,
nice, options), test_tools_warn that a tool run by hand still warns.

Environment: top_builddir, TEST_TMPDIR (see ../testlib.py), STOCK_TESTS
(space separated test names: run only those), LMTP_KEEP=1 (keep the
temporary directories).  Python 3 standard library only.
"""
import imaplib
import os
import re
import signal
import smtplib
import socket
import subprocess
import sys
import threading

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, os.path.join(TESTS, "lmtpd")]
from testlib import (MASTER, TOP_BUILDDIR, Fail, Skip, check,  # noqa: E402
                     drop_privileges, free_port, root_stays, run_tests,
                     wait_until)
from lmtphelp import MBTOOL, Instance, make_message, make_sasldb  # noqa: E402

FIXTURE_CYRUS = os.path.join(HERE, "debian-cyrus.conf")
FIXTURE_IMAPD = os.path.join(HERE, "debian-imapd.conf")
CTL_CYRUSDB = os.path.join(TOP_BUILDDIR, "tools", "ctl_cyrusdb")
IMAPD = os.path.join(TOP_BUILDDIR, "imapd", "imapd")
LMTPD = os.path.join(TOP_BUILDDIR, "lmtpd", "lmtpd")
ALICE, ALICE_PW = "alice", "alice-secret"
REFUSED = ("pop3", "nntp", "http")


def count(pattern, text):
    return len(re.findall(pattern, text, re.M))


class StockInstance(Instance):
    """A master run with stock files; no -S: our programs are found next
    to the master (the build tree's siblings), as an installed master finds
    them in its own directory."""

    TAG_VAR = "STOCK_TEST_TAG"

    def setup(self, cyrus_text, imapd_text):
        self.addrs = {}
        self.sasldb = self.path("sasldb2")
        realms = sorted({socket.gethostname(), socket.getfqdn(),
                         "localhost"})
        make_sasldb(self.sasldb, ALICE, ALICE_PW, realms)
        with open(self.imapd_conf, "w") as f:
            f.write(self.stock_imapd(imapd_text))
        with open(self.cyrus_conf, "w") as f:
            f.write(self.stock_cyrus(cyrus_text))

    def stock_imapd(self, text):
        """Only paths changed: every value that is an absolute path."""
        out = []
        for line in text.splitlines():
            m = re.match(r"([A-Za-z0-9_-]+)(\s*:\s*)(/.*)$", line)
            if m:
                key = m.group(1).lower()
                if key == "configdirectory":
                    new = self.confdir
                elif key == "partition-default":
                    new = self.partition
                else:
                    new = self.path("cyrus-" + key)
                line = m.group(1) + m.group(2) + new
            out.append(line)
        out.append("sasl_sasldb_path: %s" % self.sasldb)
        if root_stays():
            out.append("cyrus_user: root")
        return "\n".join(out) + "\n"

    def stock_cyrus(self, text):
        """Only listen addresses changed: UNIX sockets into the test's
        directory, the rest to free loopback ports."""
        out = []
        for line in text.splitlines():
            m = re.match(r'(\s*)([A-Za-z0-9_-]+)(\s.*?\blisten=)'
                         r'("[^"]*"|\S+)(.*)$', line)
            if m and not line.lstrip().startswith("#"):
                old = m.group(4).strip('"')
                if old.startswith("/"):
                    addr = self.path(os.path.basename(old))
                    listen = addr
                else:
                    addr = ("127.0.0.1", free_port())
                    listen = "%s:%d" % addr
                self.addrs[m.group(2)] = addr
                line = '%s%s%s"%s"%s' % (m.group(1), m.group(2), m.group(3),
                                         listen, m.group(5))
            out.append(line)
        return "\n".join(out) + "\n"

    def start(self, ready=0, timeout=30):
        self.spawn([MASTER, "-D", "-l", "-C", self.imapd_conf, "-M",
                    self.cyrus_conf, "-p", self.pidfile, "-s",
                    self.statusfile, "-T", "10"])
        ok = wait_until(lambda: not self.running()
                        or "master: started" in self.log(), timeout)
        if not self.running():
            raise Fail("master exited at start with status %s: %s"
                       % (self.proc.returncode, self.log()[-1500:]))
        check(ok, "master not started %d s after start (log: %s)"
              % (timeout, self.log()[-800:]))
        return self


def refused(addr):
    """True when a TCP connect is refused (nothing listens)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(addr)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        s.close()
    return False


def imap_read(addr, results, i):
    """One IMAP session: LOGIN (plain text, as Debian's allowplaintext
    allows), SELECT INBOX, FETCH 1; the message into results[i]."""
    try:
        m = imaplib.IMAP4(addr[0], addr[1], timeout=30)
        try:
            m.login(ALICE, ALICE_PW)
            typ, data = m.select("INBOX")
            check(typ == "OK", "SELECT: %r" % data)
            typ, data = m.fetch("1", "(BODY.PEEK[])")
            check(typ == "OK" and data and isinstance(data[0], tuple),
                  "FETCH: %r" % (data,))
            results[i] = data[0][1]
            results["barrier"].wait(60)     # keep the sessions overlapping
            m.logout()
        finally:
            try:
                m.shutdown()
            except OSError:
                pass
    except Exception as e:  # noqa: BLE001 - reported by the caller
        results[i] = e
        try:
            results["barrier"].abort()
        except threading.BrokenBarrierError:
            pass


def run_stock(name, cyrus_path, imapd_path):
    with open(cyrus_path) as f:
        cyrus_text = f.read()
    with open(imapd_path) as f:
        imapd_text = f.read()
    with StockInstance(name) as inst:
        inst.setup(cyrus_text, imapd_text)
        inst.mbtool("create", "user.%s" % ALICE)
        for svc in ("imap", "lmtpunix", "sieve") + REFUSED:
            check(svc in inst.addrs, "stock cyrus.conf has no %s entry"
                  % svc)
        inst.start()

        # recovery: Cyrus's command became ours, and ours ran
        log = inst.log()
        conf = re.escape(inst.imapd_conf)
        check(re.search(r"START entry=<recover> cmd=</usr/sbin/cyrus "
                        r"ctl_cyrusdb -r> runs=<\S*/tools/ctl_cyrusdb -C "
                        + conf + r" -r>", log),
              "recover not mapped to our ctl_cyrusdb: %s" % log[-2000:])
        check("ctl_cyrusdb: recovery dir=<%s>" % inst.confdir in log,
              "no line of our ctl_cyrusdb's recovery in the log")
        ok = wait_until(lambda: "ctl_cyrusdb: checkpoint dir=<%s>"
                        % inst.confdir in inst.log(), 30)
        check(ok, "the checkpoint event did not run our ctl_cyrusdb")

        # Cyrus programs with no equivalent: one warning per entry
        for sec in ("START", "EVENTS"):
            n = count(r"warning: .*%s entry=<tlsprune> .*skipped: Cyrus's "
                      r"tls_prune has no equivalent" % sec, log)
            check(n == 1, "%s tlsprune: %d warnings, expected 1" % (sec, n))
        check(not re.search(r"(running|started).*tls_prune", log),
              "tls_prune was run")

        # services with no program of ours: refused, nothing listens
        status = inst.status().get("services", {})
        for svc in REFUSED:
            n = count(r"warning: .*SERVICES entry=<%s> .*refused, no "
                      r"socket opened" % svc, log)
            check(n == 1, "%s: %d warnings, expected 1" % (svc, n))
            check(svc not in status, "%s in the status file" % svc)
            check(refused(inst.addrs[svc]), "%s: port %d not refused"
                  % (svc, inst.addrs[svc][1]))
        for svc in ("imap", "lmtpunix", "sieve"):
            check(svc in status, "%s not in the status file: %s"
                  % (svc, status))
        check(re.search(r"SERVICES entry=<sieve> cmd=<timsieved> "
                        r"runs=<\S*/timsieved/timsieved -C " + conf + ">",
                        log), "sieve not mapped to our timsieved: %s"
              % log[-2000:])
        with socket.create_connection(inst.addrs["sieve"], timeout=30) as sc:
            greet = b""
            while b"\r\nOK" not in greet:
                data = sc.recv(4096)
                check(data, "timsieved closed before its greeting: %r"
                      % greet)
                greet += data
            check(greet.startswith(b'"IMPLEMENTATION" "cyrusdeliver"'),
                  "sieve greeting: %r" % greet[:300])

        # LMTP in, IMAP out (upper case recipient: lmtp_downcase_rcpt)
        msg = make_message(msgid="stock-1@test", subject="stock conf",
                           body=b"delivered with Debian's files\r\n")
        lm = smtplib.LMTP(inst.addrs["lmtpunix"], timeout=30)
        try:
            refusedr = lm.sendmail("sender@example.org", [ALICE.upper()],
                                   msg)
            check(not refusedr, "LMTP refused: %r" % refusedr)
            lm.quit()
        finally:
            lm.close()
        hashed = os.path.join(inst.partition, ALICE[0], "user", ALICE)
        check(os.path.isdir(hashed), "no hashed spool directory %s "
              "(hashimapspool: true)" % hashed)
        nsess = 3
        results = {"barrier": threading.Barrier(nsess)}
        threads = [threading.Thread(target=imap_read,
                                    args=(inst.addrs["imap"], results, i))
                   for i in range(nsess)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        for i in range(nsess):
            got = results.get(i)
            if isinstance(got, Exception):
                raise Fail("IMAP session %d: %r" % (i, got))
            check(isinstance(got, bytes) and got.endswith(msg),
                  "IMAP session %d read %r" % (i, got))
        # the sessions overlapped, so there were as many imapd workers
        # (they stay after logout: maxuses 30, no idle timeout)
        total = inst.svc_int("imap", "total") or 0
        check(total >= nsess, "imap workers: %d, expected %d"
              % (total, nsess))

        # every unknown key warned once in the whole log
        wait_until(lambda: "event=<checkpoint> pid=" in inst.log()
                   and "exited" in inst.log(), 30)
        log = inst.log()
        keys = re.findall(r"imapd\.conf:\d+: unknown key (\S+)", log)
        check(keys, "no unknown-key warning at all: %s" % log[:1500])
        check("lmtpsocket" in keys, "lmtpsocket not warned about")
        for k in set(keys):
            n = keys.count(k)
            check(n == 1, "unknown key %s warned %d times" % (k, n))
        for k in re.findall(r"(?m)^([a-z_]+)\s*:", imapd_text):
            if k in ("configdirectory", "defaultpartition",
                     "partition-default", "hashimapspool",
                     "unixhierarchysep", "lmtp_downcase_rcpt",
                     "allowplaintext", "syslog_prefix"):
                check(k not in keys, "supported key %s warned about" % k)

        # a reload maps the same way: the services keep running, the
        # refused ones stay closed
        inst.mark_log()
        inst.proc.send_signal(signal.SIGHUP)
        ok = wait_until(lambda: "SERVICES entry=<sieve>" in inst.new_log()
                        and "EVENTS entry=<expungeprune> cmd=" in
                        inst.new_log(), 30)
        check(ok, "no mapping after SIGHUP: %s" % inst.new_log()[-1500:])
        check("service=<imap> stopping" not in inst.new_log(),
              "the reload restarted imap: %s" % inst.new_log()[-1500:])
        for svc in REFUSED:
            check(refused(inst.addrs[svc]), "%s listens after SIGHUP" % svc)
        results = {"barrier": threading.Barrier(1)}
        imap_read(inst.addrs["imap"], results, 0)
        check(isinstance(results[0], bytes) and results[0].endswith(msg),
              "IMAP after SIGHUP: %r" % (results[0],))


def test_stock_fixture():
    """Debian's stock files as kept in tests/master."""
    run_stock("fixture", FIXTURE_CYRUS, FIXTURE_IMAPD)


def test_stock_installed():
    """The installed package's files, when there are any."""
    for p in ("/etc/cyrus.conf", "/etc/imapd.conf"):
        if not os.path.isfile(p):
            raise Skip("%s missing: package cyrus-common (cyrus-imapd) is "
                       "not installed" % p)
    run_stock("installed", "/etc/cyrus.conf", "/etc/imapd.conf")


def test_mapping_forms():
    """The other spellings admins write, one entry each."""
    with StockInstance("forms") as inst:
        sock = inst.path("lmtp2.sock")
        ports = {n: free_port() for n in ("imaps", "pop3s", "ghost",
                                          "ours", "cyrimap")}
        text = """START {
  recover1 cmd="ctl_cyrusdb -r"
  recover2 cmd="/usr/lib/cyrus/bin/ctl_cyrusdb -x -r"
  mupdatepush cmd="/usr/sbin/cyrus ctl_mboxlist -m"
}
SERVICES {
  imaps cmd="imapd -s -U 30 -D" listen="127.0.0.1:%(imaps)d" prefork=0
  cyrimap cmd="/usr/sbin/cyrus imapd -T 60" listen="127.0.0.1:%(cyrimap)d"
  pop3s cmd="/usr/lib/cyrus/bin/pop3d -s" listen="127.0.0.1:%(pop3s)d"
  ghost cmd="/nonexistent/bin/ghostd" listen="127.0.0.1:%(ghost)d"
  ours cmd="%(lmtpd)s -a" listen="127.0.0.1:%(ours)d" prefork=0
  lmtp2 cmd="/usr/lib/cyrus/bin/lmtpd -C /etc/imapd.conf" listen="%(sock)s"
}
EVENTS {
  checkpoint cmd="/usr/lib/cyrus/bin/ctl_cyrusdb -c" period=30
  delprune cmd="ctl_deliver -E 3" at=0400
  expire cmd="cyr_expire -E 36h -X 2d -v" at=0401
  expunge cmd="/usr/sbin/cyrus expire -X 28" at=0402
  squat cmd="/usr/bin/nice -n 19 /usr/sbin/cyrus squatter -s" at=0403
  nicedel cmd="nice -n 19 /usr/sbin/cyrus expire -E 2" at=0404
  deleted cmd="cyr_expire -D 28" at=0405
  nothing cmd="cyr_expire -v" at=0406
}
DAEMON {
  idled cmd="idled"
}
""" % dict(ports, lmtpd=LMTPD, sock=sock)
        with open(inst.cyrus_conf, "w") as f:
            f.write(text)
        inst.start()
        log = inst.log()
        conf = re.escape(inst.imapd_conf)
        ours = r"\S*/%s -C " + conf

        def runs(entry, sec, want):
            pat = r"info: .*%s entry=<%s> cmd=<[^\n]*> runs=<%s>" % (
                sec, entry, want)
            check(count(pat, log) == 1, "%s %s: no line matching %r in:\n%s"
                  % (sec, entry, pat, log[-3000:]))

        def skipped(entry, sec, why):
            pat = r"warning: .*%s entry=<%s> .*(skipped|refused, no socket " \
                  r"opened): %s" % (sec, entry, why)
            check(count(pat, log) == 1, "%s %s: no single line matching %r"
                  % (sec, entry, pat))

        runs("recover1", "START", ours % "tools/ctl_cyrusdb" + " -r")
        runs("recover2", "START", ours % "tools/ctl_cyrusdb" + " -r")
        skipped("mupdatepush", "START", "Cyrus's ctl_mboxlist has no "
                "equivalent")
        runs("imaps", "SERVICES", ours % "imapd/imapd" + " -s -U 30")
        runs("cyrimap", "SERVICES", ours % "imapd/imapd" + " -T 60")
        skipped("pop3s", "SERVICES", "Cyrus's pop3d has no equivalent")
        skipped("ghost", "SERVICES", "the program does not exist")
        check(not re.search(r"entry=<ours>", log), "our own lmtpd "
              "(absolute path) was rewritten")
        runs("lmtp2", "SERVICES", ours % "lmtpd/lmtpd")
        runs("checkpoint", "EVENTS", ours % "tools/ctl_cyrusdb" + " -c")
        runs("delprune", "EVENTS", ours % "tools/cyr_expire" + " -E 3")
        runs("expire", "EVENTS", ours % "tools/cyr_expire"
             + " -E 36h -X 2d")
        check(not re.search(r"entry=<expire-cleanup>", log),
              "a second entry was added for cyr_expire -X")
        runs("expunge", "EVENTS", ours % "tools/cyr_expire" + " -X 28")
        skipped("squat", "EVENTS", "Cyrus's squatter has no equivalent")
        runs("nicedel", "EVENTS", "nice -n 19 " + ours % "tools/cyr_expire"
             + " -E 2")
        runs("deleted", "EVENTS", ours % "tools/cyr_expire" + " -D 28")
        skipped("nothing", "EVENTS", "cyr_expire without -E, -X or -D asks "
                "for nothing we do")
        skipped("idled", "DAEMON", "Cyrus's idled has no equivalent")

        # what runs: both recoveries, the services that are ours
        check(count(r"ctl_cyrusdb: recovery dir=<%s>" % re.escape(
            inst.confdir), log) == 2, "two recoveries expected")
        status = inst.status().get("services", {})
        check(set(status) == {"imaps", "cyrimap", "ours", "lmtp2"},
              "services: %s" % sorted(status))
        check(refused(("127.0.0.1", ports["pop3s"])), "pop3s listens")
        check(refused(("127.0.0.1", ports["ghost"])), "ghost listens")
        s = socket.create_connection(("127.0.0.1", ports["cyrimap"]), 30)
        try:
            s.settimeout(30)
            greeting = s.recv(1024)
            check(greeting.startswith(b"* OK"), "imap greeting %r"
                  % greeting)
        finally:
            s.close()
        # the status file lists what the master keeps running
        with open(inst.statusfile) as f:
            events = set(re.findall(r"(?m)^event (\S+)", f.read()))
        check(events == {"checkpoint", "delprune", "expire",
                         "expunge", "nicedel", "deleted"},
              "events in the status file: %s" % sorted(events))


def test_tools_warn():
    """A tool run by hand warns about unknown keys; run with the master's
    CYRUSDELIVER_CONF_WARNED for that file it does not."""
    with StockInstance("tools") as inst:
        with open(FIXTURE_IMAPD) as f:
            text = inst.stock_imapd(f.read())
        with open(inst.imapd_conf, "w") as f:
            f.write(text)
        for env_value, want in ((None, True), (inst.imapd_conf, False),
                                (inst.path("other.conf"), True)):
            env = dict(os.environ)
            env.pop("CYRUSDELIVER_CONF_WARNED", None)
            if env_value:
                env["CYRUSDELIVER_CONF_WARNED"] = env_value
            r = subprocess.run([MBTOOL, "-C", inst.imapd_conf, "list"],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env,
                               preexec_fn=drop_privileges, timeout=60)
            err = r.stderr.decode(errors="replace")
            check(r.returncode == 0, "mbtool list: %d %s" % (r.returncode,
                                                            err))
            got = "unknown key lmtpsocket" in err
            check(got == want, "CYRUSDELIVER_CONF_WARNED=%s: warning %s"
                  " expected %s (stderr %r)" % (env_value, got, want,
                                                err[:300]))


if __name__ == "__main__":
    sys.exit(run_tests([test_stock_fixture, test_stock_installed,
                        test_mapping_forms, test_tools_warn], "STOCK_TESTS",
                       [MASTER, MBTOOL, CTL_CYRUSDB, IMAPD, LMTPD]))
