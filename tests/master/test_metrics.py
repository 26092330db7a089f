#!/usr/bin/env python3
"""test_metrics.py - metricsd and the shared counters, end to end.

One private master (tests/imapd/imaphelp.ImapInstance) runs lmtpd on a
UNIX socket, imapd on 127.0.0.1 and, because imapd.conf sets
metrics_listen on a free loopback port, metricsd: the master adds its
DAEMON entry itself and finds the program in its service directory (-S,
a directory of links to the built imapd and metricsd).  An LMTP storm
(tools/mailbench lmtp, several connections) and IMAP sessions (mailbench
imap, and imaplib logins right and wrong) run against it while a private
Prometheus (/usr/bin/prometheus, its own configuration and TSDB in the
test's directory, its web port on loopback) scrapes /metrics every
second.  Then:
  - the 250s counted (cyrusdeliver_lmtp_deliveries_total{code="250"})
    equal the 250s mailbench saw (a delta over the storm), and the total
    equals what the lmtpd log lines say (stored + duplicates), bytes too;
  - the delivery histogram's buckets grow with le and its count equals
    the 250s; the same for every IMAP command histogram;
  - logins ok/failed and commands by name as sent;
  - the master's service gauges and counters;
  - `promtool check metrics` accepts a scrape;
  - Prometheus's own value of the delivery counter (its HTTP API) equals
    the 250s, after a scrape that followed the storm;
  - workers stopped by SIGTERM (their slots folded by the master) take
    nothing away, and their successors count on;
  - a path other than /metrics is 404, and without metrics_listen no
    metricsd runs and no metrics.shm exists;
  - the database checkpoints the master ran (`ctl_cyrusdb -c` from START,
    reaped before any worker, and from EVENTS, run at start) are in the
    checkpoint duration histogram; one run by hand is not;
  - a master whose -S directory has no metricsd finds the build tree's
    (beside its own directory) for the entry it adds.
The Prometheus part is skipped (with a note) when prometheus is not
installed.  Every process is stopped by pid.  Environment: see
../imapd/imaphelp.py; METRICS_TESTS picks tests by name.
"""
import imaplib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "imapd"))
from imaphelp import (IMAPD, ImapInstance, make_sasldb_extra)  # noqa: E402
from testlib import (MASTER, TMPDIR, TOP_BUILDDIR, Fail,  # noqa: E402
                     check, free_port, run_tests, wait_until)

METRICSD = os.path.join(TOP_BUILDDIR, "metricsd", "metricsd")
MAILBENCH = os.path.join(TOP_BUILDDIR, "tools", "mailbench")
CTL_CYRUSDB = os.path.join(TOP_BUILDDIR, "tools", "ctl_cyrusdb")
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
USERS = 20
PASSWORD = "pw"
P = "cyrusdeliver_"


def user(i):
    return "u%04d" % i


class MetricsInstance(ImapInstance):
    """ImapInstance whose master finds imapd and metricsd in a private
    service directory (links), so that the DAEMON entry the master adds
    for metricsd is the one used."""

    def start(self, ready=1, timeout=60):
        sdir = self.path("bin")
        os.makedirs(sdir, exist_ok=True)
        for prog in (IMAPD, METRICSD):
            link = os.path.join(sdir, os.path.basename(prog))
            if not os.path.lexists(link):
                os.symlink(prog, link)
        self.spawn([MASTER, "-D", "-l", "-C", self.imapd_conf, "-M",
                    self.cyrus_conf, "-p", self.pidfile, "-S", sdir,
                    "-s", self.statusfile, "-T", "10"])
        ok = wait_until(lambda: not self.running()
                        or (self.svc_int("imap", "ready") or 0) >= ready,
                        timeout)
        if not self.running():
            raise Fail("master exited at start with status %s: %s"
                       % (self.proc.returncode, self.log()[-600:]))
        check(ok, "imap not ready (log: %s)" % self.log()[-600:])
        return self


_inst = None


def inst():
    global _inst
    if _inst is None:
        port = free_port()
        i = MetricsInstance("metrics", conf={
            "allowplaintext": "yes",
            "metrics_listen": "127.0.0.1:%d" % port}, sasl=(user(1),
                                                           PASSWORD))
        i.metrics_port = port
        try:
            for k in range(2, USERS + 1):
                make_sasldb_extra(i, user(k), PASSWORD)
            for k in range(1, USERS + 1):
                i.create("user." + user(k))
            i.write_cyrus_conf(prefork=1, maxchild=20, imaps=False)
            # database checkpoints run by the master: one in START, one
            # from EVENTS (an entry with a period also runs at start)
            with open(i.cyrus_conf, "a") as f:
                f.write("START {\n  ckptstart cmd=\"%s -C %s -c\"\n}\n"
                        "EVENTS {\n  checkpoint cmd=\"%s -C %s -c\" "
                        "period=60\n}\n" % (CTL_CYRUSDB, i.imapd_conf,
                                             CTL_CYRUSDB, i.imapd_conf))
            i.start()
            ok = wait_until(lambda: try_scrape(port), 60, step=0.1)
            check(ok, "metricsd does not answer on 127.0.0.1:%d (log: %s)"
                  % (port, i.log()[-800:]))
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


# ---- scraping and parsing ---------------------------------------------------

def http_get(url, timeout=10):
    """(status, body text)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def try_scrape(port):
    try:
        st, body = http_get("http://127.0.0.1:%d/metrics" % port, 2)
    except OSError:
        return None
    return body if st == 200 else None


LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? (\S+)$')


def parse(text):
    """[(name, {label: value}, float)] of an exposition; HELP and TYPE
    lines are checked to come before their samples."""
    out = []
    typed = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            typed[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        m = LINE.match(line)
        check(m, "malformed sample line %r" % line)
        labels = {}
        if m.group(3):
            for part in re.findall(r'(\w+)="([^"]*)"', m.group(3)):
                labels[part[0]] = part[1]
        name = m.group(1)
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        check(name in typed or base in typed, "sample %s before its TYPE"
              % name)
        out.append((name, labels, float(m.group(4))))
    return out


def scrape():
    body = try_scrape(inst().metrics_port)
    check(body is not None, "scrape failed")
    return body


def value(samples, name, **labels):
    """Sum of the samples of name whose labels include labels."""
    total = 0.0
    found = False
    for n, lab, v in samples:
        if n == name and all(lab.get(k) == w for k, w in labels.items()):
            total += v
            found = True
    check(found, "no sample %s%r" % (name, labels))
    return total


def check_histogram(samples, name, **labels):
    """Buckets non-decreasing in le, +Inf == count; returns the count."""
    buckets = []
    for n, lab, v in samples:
        if n == name + "_bucket" and all(lab.get(k) == w
                                         for k, w in labels.items()):
            le = float("inf") if lab["le"] == "+Inf" else float(lab["le"])
            buckets.append((le, v))
    check(buckets and buckets[-1][0] == float("inf"),
          "%s%r: no +Inf bucket" % (name, labels))
    check(buckets == sorted(buckets), "%s: le out of order" % name)
    for (_, a), (_, b) in zip(buckets, buckets[1:]):
        check(a <= b, "%s%r: buckets decrease: %r" % (name, labels, buckets))
    count = value(samples, name + "_count", **labels)
    check(buckets[-1][1] == count, "%s%r: +Inf %d != count %d"
          % (name, labels, buckets[-1][1], count))
    return count


def log_deliveries():
    """(250s, bytes) from the lmtpd log lines: per delivery line,
    stored + duplicates recipients answered 250, each size bytes."""
    n = b = 0
    for m in re.finditer(r"lmtp: delivery .*? size=<(\d+)> .*?stored=<(\d+)> "
                         r"duplicates=<(\d+)>", inst().log()):
        k = int(m.group(2)) + int(m.group(3))
        n += k
        b += k * int(m.group(1))
    return n, b


def mailbench(args, timeout=300):
    d = tempfile.mkdtemp(prefix="metrics-mb.", dir=TMPDIR)
    try:
        path = os.path.join(d, "out.json")
        r = subprocess.run([MAILBENCH] + args + ["--json", path, "-q"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=timeout)
        check(r.returncode == 0, "mailbench %s: exit %d: %s"
              % (" ".join(args), r.returncode,
                 r.stderr.decode(errors="replace")[-1500:]))
        with open(path) as f:
            return json.load(f)
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---- a private Prometheus ----------------------------------------------------

class Prometheus:
    def __init__(self, target):
        self.dir = tempfile.mkdtemp(prefix="metrics-prom.", dir=TMPDIR)
        self.port = free_port()
        conf = os.path.join(self.dir, "prometheus.yml")
        with open(conf, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                    "scrape_configs:\n  - job_name: cyrusdeliver\n"
                    "    static_configs:\n      - targets: ['%s']\n"
                    % target)
        self.log = open(os.path.join(self.dir, "prometheus.log"), "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + conf,
             "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
            cwd=self.dir)

    def logtail(self):
        with open(os.path.join(self.dir, "prometheus.log"), "rb") as f:
            return f.read().decode(errors="replace")[-1500:]

    def ready(self):
        try:
            st, _ = http_get("http://127.0.0.1:%d/-/ready" % self.port, 2)
            return st == 200
        except OSError:
            return False

    def query(self, q):
        """The value of an instant query with one result, or None."""
        url = ("http://127.0.0.1:%d/api/v1/query?query=%s"
               % (self.port, urllib.parse.quote(q)))
        try:
            st, body = http_get(url, 5)
        except OSError:
            return None
        if st != 200:
            return None
        res = json.loads(body).get("data", {}).get("result", [])
        return float(res[0]["value"][1]) if len(res) == 1 else None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- tests -------------------------------------------------------------------

def test_storm_and_prometheus():
    i = inst()
    prom = None
    if os.access(PROMETHEUS, os.X_OK):
        prom = Prometheus("127.0.0.1:%d" % i.metrics_port)
    else:
        print("# SKIPPED PART: %s not installed (Debian package "
              "prometheus): Prometheus's own scrapes are not checked"
              % PROMETHEUS)
    try:
        if prom:
            check(wait_until(prom.ready, 120, step=0.2),
                  "prometheus not ready: %s" % prom.logtail())
        before = parse(scrape())
        ok0 = value(before, P + "lmtp_deliveries_total", code="250")
        lok0 = value(before, P + "imap_logins_total", result="ok")
        lbad0 = value(before, P + "imap_logins_total", result="failed")
        sel0 = value(before, P + "imap_commands_total", command="SELECT")

        j = mailbench(["lmtp", "--lmtp", i.unix_socket, "-n", "600",
                       "-m", str(USERS), "-r", "2", "--dup", "10",
                       "-c", "10"])
        seen250 = j["delivered_rcpts"]
        check(seen250 == 1200 and j["error_total"] == 0,
              "mailbench: %r" % {k: j[k] for k in ("delivered_rcpts",
                                                    "error_total")})
        im = mailbench(["imap", "--imap", "127.0.0.1:%d" % i.tcp_port,
                        "--users", str(USERS), "--password", PASSWORD,
                        "--sessions", "4", "--imap-n", "12",
                        "--ops", "5"])["imap"]
        check(im["failed_sessions"] == 0, "imap sessions %r" % im)
        # logins right and wrong, and a SELECT each
        for k in range(1, 4):
            m = imaplib.IMAP4("127.0.0.1", i.tcp_port)
            m.login(user(k), PASSWORD)
            m.select("INBOX")
            m.noop()
            m.logout()
        for k in range(2):
            m = imaplib.IMAP4("127.0.0.1", i.tcp_port)
            try:
                m.login(user(1), "wrong")
                raise Fail("a wrong password was accepted")
            except imaplib.IMAP4.error:
                pass
            m.logout()

        text = scrape()
        after = parse(text)
        ok1 = value(after, P + "lmtp_deliveries_total", code="250")
        check(ok1 - ok0 == seen250, "250s counted %d, mailbench saw %d"
              % (ok1 - ok0, seen250))
        n_log, bytes_log = log_deliveries()
        check(ok1 == n_log, "250s counted %d, the lmtpd log says %d"
              % (ok1, n_log))
        bytes_m = value(after, P + "lmtp_delivered_bytes_total")
        check(bytes_m == bytes_log and bytes_m > 0,
              "bytes counted %d, the lmtpd log says %d" % (bytes_m,
                                                          bytes_log))
        check(check_histogram(after, P + "lmtp_delivery_duration_seconds")
              == ok1, "delivery histogram count != 250s")
        check(value(after, P + "duplicate_suppressions_total") > 0,
              "no duplicate suppressions counted (--dup 10)")
        check(value(after, P + "imap_logins_total", result="ok") - lok0
              == im["sessions"] + 3, "logins ok: %d, expected %d"
              % (value(after, P + "imap_logins_total", result="ok") - lok0,
                 im["sessions"] + 3))
        check(value(after, P + "imap_logins_total", result="failed") - lbad0
              == 2, "failed logins not 2")
        check(value(after, P + "imap_commands_total", command="SELECT")
              - sel0 >= im["sessions"] + 3, "SELECTs not counted")
        for name in ("LOGIN", "SELECT", "NOOP", "LOGOUT", "FETCH"):
            c = check_histogram(after, P + "imap_command_duration_seconds",
                                command=name)
            check(c == value(after, P + "imap_commands_total",
                             command=name), "%s: histogram count != "
                  "commands_total" % name)
            check(c > 0, "no %s counted" % name)
        check(value(after, P + "commit_commits_total") > 0,
              "no commits counted")
        check(value(after, P + "service_maxchild", service="lmtpunix") == 20,
              "maxchild of lmtpunix")
        check(value(after, P + "service_forks_total", service="imap") >= 1,
              "no forks of imap")
        check(value(after, P + "service_crashes_total", service="imap")
              == 0, "crashes of imap")
        check(value(after, P + "service_ready", service="imap") >= 1,
              "imap has no ready child")

        # promtool on a scrape
        if os.access(PROMTOOL, os.X_OK):
            r = subprocess.run([PROMTOOL, "check", "metrics"],
                               input=text.encode(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60)
            check(r.returncode == 0, "promtool check metrics: %s"
                  % r.stdout.decode(errors="replace")[-1500:])
        else:
            print("# SKIPPED PART: %s not installed" % PROMTOOL)

        if prom:
            q = 'sum(%slmtp_deliveries_total{code="250"})' % P
            got = wait_until(lambda: prom.query(q) == ok1, 120, step=0.5)
            check(got, "prometheus says %r, expected %d: %s"
                  % (prom.query(q), ok1, prom.logtail()))
            print("# prometheus scraped %d 250s, as counted" % ok1)
    finally:
        if prom:
            prom.stop()


def test_fold_keeps_counts():
    i = inst()
    # counts in the living workers' slots first
    mailbench(["lmtp", "--lmtp", i.unix_socket, "-n", "40", "-m",
               str(USERS), "-c", "4"])
    m = imaplib.IMAP4("127.0.0.1", i.tcp_port)
    m.login(user(2), PASSWORD)
    m.logout()
    before = parse(scrape())
    ok0 = value(before, P + "lmtp_deliveries_total", code="250")
    login0 = value(before, P + "imap_logins_total", result="ok")
    # stop every worker: the master reaps them and folds their slots
    pids = i.child_pids("lmtpunix") + i.child_pids("imap")
    check(pids, "no workers to stop")
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    gone = wait_until(lambda: not any(os.path.exists("/proc/%d" % p)
                                      and p in i.children() for p in pids),
                      60)
    check(gone, "workers did not leave")
    time.sleep(0.2)
    mid = parse(scrape())
    check(value(mid, P + "lmtp_deliveries_total", code="250") == ok0,
          "250s changed when the workers left: %d -> %d"
          % (ok0, value(mid, P + "lmtp_deliveries_total", code="250")))
    check(value(mid, P + "imap_logins_total", result="ok") == login0,
          "logins changed when the workers left")
    # their successors count on
    j = mailbench(["lmtp", "--lmtp", i.unix_socket, "-n", "50", "-m",
                   str(USERS), "-c", "4"])
    after = parse(scrape())
    check(value(after, P + "lmtp_deliveries_total", code="250") - ok0
          == j["delivered_rcpts"], "successors' 250s not counted")
    check(check_histogram(after, P + "lmtp_delivery_duration_seconds")
          == ok0 + j["delivered_rcpts"], "histogram count after the fold")


def test_checkpoint():
    i = inst()
    name = P + "db_checkpoint_duration_seconds"
    check("entry=<ckptstart>" in i.log(), "START checkpoint not run: %s"
          % i.log()[-600:])

    def count():
        return check_histogram(parse(scrape()), name)
    # START's run is folded before any worker; EVENTS' once it is reaped
    check(wait_until(lambda: count() >= 2, 60, step=0.2),
          "checkpoint histogram count %r, expected >= 2 (log: %s)"
          % (count(), i.log()[-800:]))
    text = scrape()
    samples = parse(text)
    check(value(samples, name + "_sum") > 0, "checkpoint duration sum 0")
    check(value(samples, P + "db_checkpoint_failures_total") == 0,
          "checkpoint failures counted")
    if os.access(PROMTOOL, os.X_OK):
        r = subprocess.run([PROMTOOL, "check", "metrics"],
                           input=text.encode(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=60)
        check(r.returncode == 0, "promtool check metrics: %s"
              % r.stdout.decode(errors="replace")[-1500:])
    # a run by hand (even with the master's pid in its environment: its
    # parent is not the master) claims no slot and counts nothing
    n0 = value(samples, name + "_count")
    env = dict(os.environ, CYRUSDELIVER_MASTER_PID=str(i.proc.pid))
    r = subprocess.run([CTL_CYRUSDB, "-C", i.imapd_conf, "-c", "-q"],
                       env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    check(r.returncode == 0, "ctl_cyrusdb -c: %s"
          % r.stdout.decode(errors="replace")[-800:])
    time.sleep(0.2)
    check(value(parse(scrape()), name + "_count") == n0,
          "a checkpoint run by hand was counted")


def test_http_errors():
    i = inst()
    st, _ = http_get("http://127.0.0.1:%d/other" % i.metrics_port)
    check(st == 404, "GET /other: %d" % st)
    req = urllib.request.Request("http://127.0.0.1:%d/metrics"
                                 % i.metrics_port, data=b"x",
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            st = r.status
    except urllib.error.HTTPError as e:
        st = e.code
    check(st == 405, "POST /metrics: %d" % st)
    check(try_scrape(i.metrics_port), "metricsd gone after bad requests")


def test_metrics_off():
    with MetricsInstance("nometrics", conf={}) as i:
        i.write_cyrus_conf(prefork=1, maxchild=4, imaps=False, lmtp=True)
        i.start()
        time.sleep(1.0)
        check(not os.path.exists(os.path.join(i.confdir, "metrics.shm")),
              "metrics.shm created without metrics_listen")
        check("metricsd" not in i.log(), "metricsd mentioned: %s"
              % i.log()[-600:])


def test_sibling_metricsd():
    # a master of the build tree whose -S directory (imapd/) has no
    # metricsd finds the one beside it (../metricsd/) for the DAEMON
    # entry it adds itself, as it finds its other programs
    port = free_port()
    with ImapInstance("sibling", conf={
            "metrics_listen": "127.0.0.1:%d" % port}) as i:
        i.write_cyrus_conf(prefork=1, maxchild=4, imaps=False)
        i.start()
        ok = wait_until(lambda: try_scrape(port), 60, step=0.1)
        check(ok, "metricsd does not answer on 127.0.0.1:%d (log: %s)"
              % (port, i.log()[-800:]))


if __name__ == "__main__":
    rc = run_tests([test_storm_and_prometheus, test_fold_keeps_counts,
                    test_checkpoint, test_http_errors, test_metrics_off,
                    test_sibling_metricsd],
                   "METRICS_TESTS", (MASTER, IMAPD, METRICSD, MAILBENCH,
                                     CTL_CYRUSDB))
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
