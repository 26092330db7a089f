#!/usr/bin/env python3
"""test_mailbench.py - tools/mailbench against real servers.

One private master (tests/imapd/imaphelp.ImapInstance) runs lmtpd on a
UNIX socket and imapd on 127.0.0.1 (plain with STARTTLS, and imaps),
with a self-signed certificate, a sasldb holding 50 users u0001..u0050
(password "pw") made with saslpasswd2, allowplaintext on, and the 50
mailboxes user.u0001.. created with the real tools/mbtool.  mailbench
runs as a subprocess and its exit status, its JSON and CSV, its table
and its error messages are checked; where mailbench claims that every
message arrived (--verify), the mailbox counts are also read
independently with `mbtool info` before and after.

The cases: LMTP with --verify imap; 3 recipients with repeated
Message-IDs and --verify cmd:PROGRAM (a script around mbtool); IMAP
sessions; mixed LMTP + IMAP with expunges (the verification must stay
exact); STARTTLS for LMTP, implicit TLS and AUTHENTICATE PLAIN for IMAP;
--csv and --plot; a mismatch that must be found (--dedup no while the
server suppresses the repeated Message-IDs): exit 1; bad targets and a
wrong password: exit 2 with a clear message; and Postfix's smtp-sink -L
(pipelining, no pipelining, every RCPT refused with 4xx, one connection
per message) when it is installed.

Every mailbench run must print no sanitizer report.  Environment: see
../imapd/imaphelp.py; MAILBENCH_TESTS picks tests by name.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "imapd"))
from imaphelp import (IMAPD, ImapInstance, make_sasldb_extra)  # noqa: E402
from testlib import (MASTER, RUN_AS, TMPDIR, TOP_BUILDDIR, Skip,  # noqa: E402
                     check, run_tests, wait_until)
from lmtphelp import LMTPD, MBTOOL  # noqa: E402

MAILBENCH = os.path.join(TOP_BUILDDIR, "tools", "mailbench")
SMTP_SINK = "/usr/sbin/smtp-sink"
USERS = 50
PASSWORD = "pw"

_inst = None

# a --verify cmd: program that prints the count of a user's INBOX, and
# expunges one of u0001's messages over IMAP the second time it is asked
# about u0001 (after the run)
COUNT_AND_EXPUNGE = """#!/bin/sh
if [ "$1" = u0001 ]; then
  if [ -e %(d)s/seen ] && [ ! -e %(d)s/done ]; then
    touch %(d)s/done
    python3 - <<'EOF' || exit 1
import imaplib
m = imaplib.IMAP4("127.0.0.1", %(port)d)
m.login("u0001", "%(pw)s")
m.select("INBOX")
m.store("1", "+FLAGS", "(\\\\Deleted)")
m.expunge()
m.logout()
EOF
  fi
  touch %(d)s/seen
fi
%(runas)s%(mb)s -C %(conf)s info "user.$1" | sed -n 's/^messages: //p'
"""


def runas():
    """The command prefix that runs mbtool as the servers' user."""
    return "runuser -u %s -- " % RUN_AS.pw_name if RUN_AS else ""


def user(i):
    return "u%04d" % i


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("mailbench", conf={"allowplaintext": "yes"},
                         tls=True, sasl=(user(1), PASSWORD))
        try:
            for k in range(2, USERS + 1):
                make_sasldb_extra(i, user(k), PASSWORD)
            for k in range(1, USERS + 1):
                i.create("user." + user(k))
            i.write_cyrus_conf(prefork=1, maxchild=40)
            i.start()
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


def lmtp_target():
    return inst().unix_socket


def imap_target(tls=False):
    i = inst()
    return "127.0.0.1:%d" % (i.imaps_port if tls else i.tcp_port)


def counts():
    """{user: messages} of every mailbox, read with mbtool info."""
    out = {}
    for k in range(1, USERS + 1):
        info = inst().info("user." + user(k))
        out[user(k)] = int(info["messages"])
    return out


def mailbench(args, rc=0, timeout=120):
    """Run mailbench with args; check its exit status is rc and that no
    sanitizer spoke.  Returns (stdout, stderr)."""
    r = subprocess.run([MAILBENCH] + args, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                       timeout=timeout)
    out = r.stdout.decode(errors="replace")
    err = r.stderr.decode(errors="replace")
    for bad in ("AddressSanitizer", "LeakSanitizer", "runtime error:"):
        check(bad not in err, "sanitizer report from mailbench %s:\n%s"
              % (" ".join(args), err[-3000:]))
    check(r.returncode == rc, "mailbench %s: exit %d, expected %d\n"
          "stdout:\n%s\nstderr:\n%s" % (" ".join(args), r.returncode, rc,
                                        out[-2000:], err[-2000:]))
    return out, err


class TempDir:
    def __enter__(self):
        os.makedirs(TMPDIR, exist_ok=True)
        self.path = tempfile.mkdtemp(prefix="mailbench-test.", dir=TMPDIR)
        os.chmod(self.path, 0o755)
        return self.path

    def __exit__(self, *a):
        shutil.rmtree(self.path, ignore_errors=True)


def run_json(args, rc=0):
    """mailbench with --json into a file; (json dict, stdout, stderr)."""
    with TempDir() as d:
        path = os.path.join(d, "out.json")
        out, err = mailbench(args + ["--json", path, "-q"], rc=rc)
        with open(path) as f:
            data = json.load(f)
    return data, out, err


def check_latency(j, name, count=None):
    lat = j["latency_ms"].get(name)
    check(lat is not None, "no latency for %s in %r" % (name, j["latency_ms"]))
    check(lat["count"] > 0, "%s: count %r" % (name, lat))
    if count is not None:
        check(lat["count"] == count, "%s: count %d, expected %d"
              % (name, lat["count"], count))
    check(0 <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"],
          "%s: percentiles out of order: %r" % (name, lat))


# ---- tests -------------------------------------------------------------------

def test_lmtp_verify_imap():
    before = counts()
    j, out, _ = run_json(["lmtp", "--lmtp", lmtp_target(), "--imap",
                          imap_target(), "-n", "300", "-m", str(USERS),
                          "-c", "10", "--verify", "imap", "--label", "ours"])
    check(j["mode"] == "lmtp" and j["label"] == "ours", "mode/label %r" % j)
    check(j["delivered_msgs"] == 300 and j["delivered_rcpts"] == 300,
          "delivered %r" % j)
    check(j["error_total"] == 0 and j["errors"] == {}, "errors %r"
          % j["errors"])
    check(j["verify"]["ok"] is True and j["verify"]["checked"] == USERS
          and j["verify"]["mismatches"] == 0, "verify %r" % j["verify"])
    check(j["msgs_per_s"] > 0 and j["elapsed_s"] > 0, "rate %r" % j)
    for name in ("CONNECT", "LHLO", "MAIL", "RCPT", "DATA"):
        check_latency(j, name)
    check_latency(j, "DELIVERY", 300)
    for key in ("load1", "cpu_user_pct", "cpu_iowait_pct", "disk_write_ops",
                "disks"):
        check(key in j["host"], "host.%s missing: %r" % (key, j["host"]))
    check(j["self_cpu_s"] >= 0, "self_cpu_s %r" % j)
    # the table
    check("delivered      300 msgs" in out and "verify: ok" in out
          and "DELIVERY" in out, "table:\n%s" % out)
    # what the mailboxes really hold: 300 / 50 = 6 more each
    after = counts()
    for u in before:
        check(after[u] == before[u] + 6, "%s: %d before, %d after"
              % (u, before[u], after[u]))


def test_rcpts_dup_verify_cmd():
    with TempDir() as d:
        script = os.path.join(d, "count.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\n%s%s -C %s info \"user.$1\" | "
                    "sed -n 's/^messages: //p'\n"
                    % (runas(), MBTOOL, inst().imapd_conf))
        os.chmod(script, 0o755)
        j, out, _ = run_json(["lmtp", "--lmtp", lmtp_target(), "-n", "200",
                              "-m", str(USERS), "-r", "3", "--dup", "10",
                              "-c", "10", "--verify", "cmd:" + script])
    check(j["delivered_msgs"] == 200 and j["delivered_rcpts"] == 600,
          "delivered %r" % j)
    check(j["rcpts"] == 3 and j["rcpts_per_s"] > j["msgs_per_s"],
          "rates %r" % j)
    check(j["dups_sent"] > 0 and j["dups_delivered"] == j["dups_sent"],
          "duplicates %r" % j)
    check(j["verify"]["ok"] is True and j["verify"]["checked"] == USERS,
          "verify %r" % j["verify"])
    check("duplicates" in out, "table without duplicates:\n%s" % out)


def test_imap_sessions():
    # some messages first, so that every operation has work
    mailbench(["lmtp", "--lmtp", lmtp_target(), "-n", "100", "-m",
               str(USERS), "-q"])
    j, out, _ = run_json(["imap", "--imap", imap_target(), "--users",
                          str(USERS), "--sessions", "8", "--imap-n", "40",
                          "--ops", "10"])
    im = j["imap"]
    check(im["sessions"] == 40 and im["failed_sessions"] == 0,
          "sessions %r" % im)
    check(im["ops"] + im["skipped"] == 400, "ops %r" % im)
    check(im["ops"] > 0 and im["ops_per_s"] > 0, "ops %r" % im)
    check(j["error_total"] == 0, "errors %r" % j["errors"])
    for name in ("CONNECT", "LOGIN", "SELECT", "LOGOUT", "FETCH-HDR"):
        check_latency(j, name)
    check_latency(j, "LOGIN", 40)
    check(im["fetch_bytes"] > 0, "nothing fetched: %r" % im)


def test_mixed_with_expunge():
    before = counts()
    j, out, _ = run_json(["mixed", "--lmtp", lmtp_target(), "--imap",
                          imap_target(), "-n", "400", "-m", str(USERS),
                          "--users", str(USERS), "-c", "10", "--sessions",
                          "6", "--mix", "fetchhdr=2,fetchbody=1,store=1,"
                          "search=1,expunge=4,append=2", "--verify", "imap"])
    check(j["mode"] == "mixed" and j["delivered_msgs"] == 400,
          "delivered %r" % j)
    check(j["error_total"] == 0, "errors %r" % j["errors"])
    expunged = j["imap"]["expunged"]
    check(expunged > 0, "no expunge in the mixed run: %r" % j["imap"])
    check(j["verify"]["ok"] is True and j["verify"]["checked"] == USERS,
          "verify %r" % j["verify"])
    check_latency(j, "IMAP-CONNECT")
    check_latency(j, "EXPUNGE")
    check_latency(j, "APPEND")
    # every APPEND succeeded (no errors): counted by verify as expected
    appended = j["latency_ms"]["APPEND"]["count"]
    after = counts()
    check(sum(after.values()) == sum(before.values()) + 400 + appended
          - expunged,
          "mailboxes hold %d messages, expected %d + 400 + %d - %d"
          % (sum(after.values()), sum(before.values()), appended,
             expunged))


def test_tls():
    # LMTP with STARTTLS, the verification over imaps with AUTHENTICATE PLAIN
    j, _, _ = run_json(["lmtp", "--lmtp", lmtp_target(), "--lmtp-starttls",
                        "--imap", imap_target(tls=True), "--imap-tls",
                        "--auth", "plain", "-n", "100", "-m", str(USERS),
                        "-c", "5", "--verify", "imap"])
    check(j["delivered_msgs"] == 100 and j["error_total"] == 0,
          "delivered %r errors %r" % (j["delivered_msgs"], j["errors"]))
    check(j["verify"]["ok"] is True, "verify %r" % j["verify"])
    # IMAP sessions after STARTTLS
    j, _, _ = run_json(["imap", "--imap", imap_target(), "--imap-starttls",
                        "--auth", "plain", "--users", str(USERS),
                        "--sessions", "4", "--imap-n", "8", "--ops", "4"])
    check(j["imap"]["sessions"] == 8 and j["error_total"] == 0,
          "imap over STARTTLS: %r %r" % (j["imap"], j["errors"]))
    # LMTP, one connection per message, with STARTTLS each time
    j, _, _ = run_json(["lmtp", "--lmtp", lmtp_target(), "--lmtp-starttls",
                        "-k", "-n", "20", "-m", str(USERS), "-c", "4"])
    check(j["delivered_msgs"] == 20, "delivered %r" % j)
    check_latency(j, "CONNECT", 20)


def test_csv_and_plot():
    with TempDir() as d:
        csv = os.path.join(d, "out.csv")
        png = os.path.join(d, "out.png")
        out, _ = mailbench(["mixed", "--lmtp", lmtp_target(), "--imap",
                            imap_target(), "-n", "150", "-m", str(USERS),
                            "--users", str(USERS), "-c", "5", "--sessions",
                            "3", "--csv", csv, "--plot", png, "-q"])
        with open(csv) as f:
            lines = f.read().splitlines()
        check(lines[0] == "metric,value", "CSV header %r" % lines[:1])
        rows = dict(ln.split(",", 1) for ln in lines[1:])
        check(rows.get("delivered_msgs") == "150", "CSV %r" % rows)
        check("latency_ms.DELIVERY.p99" in rows and "imap.ops" in rows
              and "host.cpu_iowait_pct" in rows, "CSV rows %r"
              % sorted(rows))
        with open(png, "rb") as f:
            check(f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG: %s" % png)
        check(os.path.getsize(png) > 1000, "PNG too small")
    # without gnuplot on PATH: a clear error before anything runs
    r = subprocess.run([MAILBENCH, "lmtp", "--lmtp", lmtp_target(),
                        "--plot", "/nonexistent/x.png"],
                       env={"PATH": "/nonexistent"}, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=30)
    check(r.returncode == 2 and b"gnuplot" in r.stderr,
          "no gnuplot: exit %d %r" % (r.returncode, r.stderr))


def test_mismatch_detected():
    # the server suppresses repeated Message-IDs; told it does not, the
    # verification must expect more messages than it finds
    j, _, err = run_json(["lmtp", "--lmtp", lmtp_target(), "--imap",
                          imap_target(), "-n", "200", "-m", str(USERS),
                          "--dup", "30", "--dedup", "no", "-c", "10",
                          "--verify", "imap"], rc=1)
    check(j["dups_sent"] > 0 and j["delivered_msgs"] == 200,
          "duplicates %r" % j)
    check(j["verify"]["ok"] is False and j["verify"]["mismatches"] > 0,
          "verify %r" % j["verify"])
    check("verify: user u" in err and "expected" in err and "found" in err,
          "mismatch not reported: %s" % err)
    # a message expunged behind mailbench's back between its counts: the
    # count program, asked about u0001 the second time (after the run),
    # first expunges one of u0001's messages over IMAP
    with TempDir() as d:
        script = os.path.join(d, "count.sh")
        with open(script, "w") as f:
            f.write(COUNT_AND_EXPUNGE % {
                "d": d, "port": inst().tcp_port, "pw": PASSWORD,
                "mb": MBTOOL, "conf": inst().imapd_conf, "runas": runas()})
        os.chmod(script, 0o755)
        j, _, err = run_json(["lmtp", "--lmtp", lmtp_target(), "-n", "50",
                              "-m", str(USERS), "--verify", "cmd:" + script],
                             rc=1)
        check(os.path.exists(os.path.join(d, "done")),
              "the count program did not expunge")
    check(j["verify"]["mismatches"] == 1 and j["delivered_msgs"] == 50,
          "verify %r" % j["verify"])
    check("user u0001 expected" in err, "mismatch not reported: %s" % err)


def test_bad_targets():
    _, err = mailbench(["lmtp", "--lmtp", "/nonexistent/lmtp.sock", "-n",
                        "10"], rc=2)
    check("cannot connect to LMTP target /nonexistent/lmtp.sock" in err,
          "message: %s" % err)
    _, err = mailbench(["lmtp", "--lmtp", "nohostnoport", "-n", "10"], rc=2)
    check("nohostnoport" in err, "message: %s" % err)
    _, err = mailbench(["imap", "--imap", imap_target(), "--password",
                        "wrong", "--users", "3", "--imap-n", "3"], rc=2)
    check("login as u0001 failed" in err or "login as u000" in err,
          "message: %s" % err)
    _, err = mailbench(["lmtp", "-n", "10"], rc=2)
    check("needs --lmtp" in err, "message: %s" % err)
    _, err = mailbench(["lmtp", "--lmtp", lmtp_target(), "-r", "0"], rc=2)
    check("-r" in err, "message: %s" % err)
    _, err = mailbench(["stress", "--lmtp", lmtp_target()], rc=2)
    check("unknown mode" in err, "message: %s" % err)


class Sink:
    """Postfix's smtp-sink speaking LMTP on a UNIX socket."""

    def __init__(self, d, *opts):
        self.sock = os.path.join(d, "sink")
        cmd = [SMTP_SINK]
        if os.geteuid() == 0:
            cmd += ["-u", "nobody"]
        cmd += list(opts) + ["-L", "unix:" + self.sock, "100"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        ok = wait_until(lambda: os.path.exists(self.sock)
                        or self.proc.poll() is not None, 10)
        check(ok and self.proc.poll() is None, "smtp-sink did not start")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def test_smtp_sink():
    if not os.access(SMTP_SINK, os.X_OK):
        raise Skip("%s is not installed" % SMTP_SINK)
    with TempDir() as d:
        sink = Sink(d)
        try:
            t0 = time.monotonic()
            j, _, _ = run_json(["lmtp", "--lmtp", sink.sock, "-n", "3000",
                                "-c", "20"])
            check(j["delivered_msgs"] == 3000 and j["error_total"] == 0,
                  "smtp-sink: %r %r" % (j["delivered_msgs"], j["errors"]))
            # a stall guard, not a speed test: a loaded machine with a
            # sanitizer build beside must not fail it
            check(time.monotonic() - t0 < 300, "3000 messages took %.0f s: "
                  "stalled" % (time.monotonic() - t0))
            check_latency(j, "DELIVERY", 3000)
            j, _, _ = run_json(["lmtp", "--lmtp", sink.sock, "-n", "100",
                                "-c", "5", "-k", "-r", "2", "-m", "10"])
            check(j["delivered_msgs"] == 100
                  and j["delivered_rcpts"] == 200, "-k: %r" % j)
            check_latency(j, "CONNECT", 100)
        finally:
            sink.stop()
    with TempDir() as d:
        # no PIPELINING: one command at a time
        sink = Sink(d, "-p")
        try:
            j, _, _ = run_json(["lmtp", "--lmtp", sink.sock, "-n", "300",
                                "-r", "3", "-c", "5"])
            check(j["delivered_rcpts"] == 900 and j["error_total"] == 0,
                  "no pipelining: %r %r" % (j["delivered_rcpts"],
                                            j["errors"]))
        finally:
            sink.stop()
    with TempDir() as d:
        # every RCPT refused with a 4xx: every message fails, by code
        sink = Sink(d, "-r", "RCPT")
        try:
            j, out, _ = run_json(["lmtp", "--lmtp", sink.sock, "-n", "50",
                                  "-r", "2", "-m", "10", "-c", "3"], rc=1)
            check(j["delivered_msgs"] == 0 and j["failed_msgs"] == 50,
                  "refused: %r" % j)
            codes = {k: v for k, v in j["errors"].items() if k.isdigit()}
            check(len(codes) == 1 and list(codes.values())[0] == 100
                  and list(codes)[0].startswith("4"),
                  "errors by code: %r" % j["errors"])
        finally:
            sink.stop()


def test_lmtp_rate():
    """--lmtp-rate paces the LMTP part: message k starts no earlier than
    k / rate seconds into the run, so 50 messages at 25/s take at least
    49 / 25 s however fast the server is (a slower one only takes
    longer), every one is delivered, and IMAP sessions run beside it
    until the last."""
    j, out, _ = run_json(["mixed", "--lmtp", lmtp_target(), "--imap",
                          imap_target(), "-n", "50", "-m", str(USERS),
                          "-c", "5", "--lmtp-rate", "25", "--sessions", "2",
                          "--users", str(USERS), "--ops", "5"])
    check(j["lmtp_rate"] == 25, "lmtp_rate %r" % j.get("lmtp_rate"))
    check(j["delivered_msgs"] == 50 and j["error_total"] == 0,
          "delivered %r errors %r" % (j["delivered_msgs"], j["errors"]))
    check(j["elapsed_s"] >= 49 / 25.0, "50 messages at 25/s in %.3f s"
          % j["elapsed_s"])
    check(j["imap"]["ops"] > 0, "no IMAP operations beside it: %r"
          % j["imap"])
    check_latency(j, "DELIVERY", 50)
    check("--lmtp-rate 25 msgs/s" in out, "table without the pace:\n%s"
          % out)
    mailbench(["lmtp", "--lmtp", lmtp_target(), "-n", "1",
               "--lmtp-rate", "0"], rc=2)


if __name__ == "__main__":
    rc = run_tests([
        test_lmtp_verify_imap,
        test_rcpts_dup_verify_cmd,
        test_imap_sessions,
        test_mixed_with_expunge,
        test_tls,
        test_csv_and_plot,
        test_mismatch_detected,
        test_bad_targets,
        test_smtp_sink,
        test_lmtp_rate,
    ], "MAILBENCH_TESTS", (MASTER, IMAPD, LMTPD, MBTOOL, MAILBENCH))
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
