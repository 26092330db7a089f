#!/usr/bin/env python3
"""test_sieve_smtp.py - Sieve's redirects and vacation replies handed to
the MTA over SMTP (smtp_backend: host) instead of a sendmail process.

    LMTP client --> lmtpd (one worker) --SMTP, kept open--> smtp-sink

smtp-sink is Postfix's test server on 127.0.0.1 (or a UNIX socket),
dumping each transaction with its envelope (-d); its options make it
refuse a command (-f), drop the connection after one (-q), or not
announce PIPELINING (-p).  The `sendmail` key points at the test's fake
sendmail, which must never run.  Checked: vacation (MAIL FROM:<>) and
redirect (the original sender) arrive with their envelopes, a line
starting with a dot survives, several replies go over one connection
(one "smtp connected" log line), with and without pipelining, over a
UNIX socket; an MTA that refuses RCPT, drops the connection at DATA, or
is not there: the recipient gets 451 and nothing is stored, and the next
delivery after the MTA is back gets 250; a kept connection the MTA closed
meanwhile (the sink restarted) is opened again for the same reply.

Needs root (smtp-sink -u postfix) and Debian's postfix package.
Environment: see lmtphelp.py.
"""
import email
import email.policy
import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import Skip, alive, check, free_port, wait_until  # noqa: E402
from lmtphelp import make_message, run_lmtp_tests  # noqa: E402
from test_sieve_delivery import SieveInstance, msgid, send  # noqa: E402

SMTP_SINK = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
DEADLINE_S = 60

VACATION = ('require "vacation";\n'
            'vacation :days 1 :subject "away" "I am away.\n.dot line";\n')
REDIRECT = 'redirect "fwd@remote.example";\n'


def need_sink():
    if os.geteuid() != 0:
        raise Skip("needs root (smtp-sink -u postfix)")
    if not os.access(SMTP_SINK, os.X_OK):
        raise Skip("smtp-sink is not installed")
    try:
        pwd.getpwnam("postfix")
    except KeyError:
        raise Skip("no user postfix")


def addr(args):
    """The address of MAIL / RCPT arguments ("FROM:<a> SIZE=1" -> "a")."""
    a = args.strip().split()[0] if args.strip() else ""
    if a.upper().startswith(("FROM:", "TO:")):
        a = a.split(":", 1)[1]
    return a[1:-1] if a.startswith("<") and a.endswith(">") else a


class Sink:
    """smtp-sink on 127.0.0.1:PORT (or unix:PATH), restartable on the same
    address with other options."""

    def __init__(self, base, unix=False):
        self.dir = os.path.join(base, "sink")
        os.makedirs(self.dir, exist_ok=True)
        pw = pwd.getpwnam("postfix")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        if unix:
            self.path = os.path.join(base, "sink.sock")
            self.listen = "unix:" + self.path
            self.host = self.path
        else:
            self.port = free_port()
            self.listen = "127.0.0.1:%d" % self.port
            self.host = self.listen
        self.proc = None

    def _connect(self):
        if self.listen.startswith("unix:"):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            s.connect(self.path)
            return s
        return socket.create_connection(("127.0.0.1", self.port), 2)

    def start(self, *opts):
        if self.listen.startswith("unix:") and os.path.exists(self.path):
            os.unlink(self.path)
        self.proc = subprocess.Popen(
            [SMTP_SINK, "-u", "postfix", "-h", "sink.test.invalid",
             "-d", os.path.join(self.dir, "m.")] + list(opts) +
            [self.listen, "32"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up():
            try:
                with self._connect():
                    return True
            except OSError:
                return self.proc.poll() is not None
        check(wait_until(up, 30, 0.1) and self.proc.poll() is None,
              "smtp-sink did not start")
        if self.listen.startswith("unix:"):
            os.chmod(self.path, 0o666)   # lmtpd runs as the run-as user

    def messages(self):
        """[(mail, [rcpts], raw bytes, email.message)] of complete dumps."""
        out = []
        for p in sorted(glob.glob(os.path.join(self.dir, "m.*"))):
            with open(p, "rb") as f:
                raw = f.read()
            if b"\n\n" not in raw.replace(b"\r\n", b"\n"):
                continue   # still being written
            m = email.message_from_bytes(raw, policy=email.policy.compat32)
            mail = m.get("X-Mail-Args")
            if mail is None:
                continue
            out.append((addr(mail), [addr(r) for r in
                                     m.get_all("X-Rcpt-Args") or []],
                        raw, m))
        return out

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)
        return [] if self.proc is None or not alive(self.proc.pid) \
            else ["smtp-sink %d still alive" % self.proc.pid]


def sink_base(name):
    """A directory of its own for the sink (and its socket)."""
    d = tempfile.mkdtemp(prefix=name + "-mta.",
                         dir=os.environ.get("TEST_TMPDIR", "/var/tmp"))
    os.chmod(d, 0o755)
    return d


def smtp_instance(name, sink):
    return SieveInstance(name, prefork=1, maxchild=1, conf={
        "smtp_backend": "host", "smtp_host": sink.host})


def wait_messages(sink, n):
    got = wait_until(lambda: sink.messages() if len(sink.messages()) >= n
                     else None, DEADLINE_S, 0.1)
    check(got, "the sink has %d of %d messages" % (len(sink.messages()), n))
    return got


def replies_over_one_connection(name, *sink_opts, unix=False):
    need_sink()
    sink = Sink(sink_base(name), unix=unix)
    with smtp_instance(name, sink) as inst:
        inst.script("bob", VACATION)
        inst.script("alice", REDIRECT)
        problems = []
        try:
            sink.start(*sink_opts)
            inst.start()
            senders = ["s%d@example.net" % i for i in range(3)]
            for s in senders:
                per = send(inst, ["bob@test.example"],
                           make_message(msgid(), subject="hello",
                                        to="bob@test.example"), sender=s)
                check(per[0].code == 250, "vacation answered %r" % per)
            mid = msgid()
            per = send(inst, ["alice@test.example"],
                       make_message(mid, subject="fwd me",
                                    to="alice@test.example",
                                    body=".starts with a dot\r\nend\r\n"),
                       sender="orig@example.net")
            check(per[0].code == 250, "redirect answered %r" % per)
            got = wait_messages(sink, 4)
            vac = [g for g in got if g[3].get("Subject") == "away"]
            check(sorted(r for g in vac for r in g[1]) == senders and
                  all(g[0] == "" for g in vac),
                  "vacation envelopes: %r" % [(g[0], g[1]) for g in got])
            check(all(b"\n.dot line" in g[2].replace(b"\r\n", b"\n") or
                      b"\n..dot line" in g[2].replace(b"\r\n", b"\n")
                      for g in vac), "vacation text: %r" % vac[0][2][-200:])
            red = [g for g in got if g[1] == ["fwd@remote.example"]]
            check(len(red) == 1 and red[0][0] == "orig@example.net",
                  "redirect envelope: %r" % [(g[0], g[1]) for g in got])
            body = red[0][2].replace(b"\r\n", b"\n")
            check(b"\n.starts with a dot\nend\n" in body or
                  b"\n..starts with a dot\nend\n" in body,
                  "redirected body: %r" % body[-200:])
            check(red[0][3].get("X-Sieve-Redirected-By") ==
                  "alice@test.example", "no trace header")
            check(len(inst.messages("user.bob")) == 3, "vacation lost mail")
            check(inst.sent() == [], "sendmail ran: %r" % inst.sent())
            log = inst.log()
            check(log.count("lmtp: sieve smtp connected") == 1,
                  "connections: %d" % log.count("lmtp: sieve smtp connected"))
        finally:
            problems += sink.stop()
        check(not problems, "stop: %s" % problems)


def test_smtp_pipelining():
    replies_over_one_connection("sv-smtp-pipe")


def test_smtp_no_pipelining():
    replies_over_one_connection("sv-smtp-serial", "-p")


def test_smtp_unix_socket():
    replies_over_one_connection("sv-smtp-unix", unix=True)


def test_smtp_refusals_and_reconnect():
    need_sink()
    sink = Sink(sink_base("sv-smtp-fail"))
    with smtp_instance("sv-smtp-fail", sink) as inst:
        inst.script("bob", VACATION)
        problems = []
        n = [0]

        def deliver(expect, why):
            n[0] += 1
            per = send(inst, ["bob@test.example"],
                       make_message(msgid(), subject="m%d" % n[0],
                                    to="bob@test.example"),
                       sender="s%d@example.net" % n[0])
            check(per[0].code == expect, "%s: answered %r" % (why, per))

        try:
            inst.start()
            # no MTA at all
            deliver(451, "MTA not listening")
            check("stage=<connect>" in inst.log(), "no connect failure "
                  "logged: %s" % inst.log()[-600:])
            # the MTA refuses the recipient
            sink.start("-f", "RCPT")
            deliver(451, "RCPT refused")
            check("stage=<RCPT>" in inst.log(), "RCPT refusal not logged")
            sink.stop()
            # the MTA drops the connection at DATA
            sink.start("-q", "DATA")
            deliver(451, "dropped at DATA")
            sink.stop()
            check(len(inst.messages("user.bob")) == 0,
                  "stored although the recipient got 451")
            check(sink.messages() == [], "the sink kept a message")
            # the MTA is back: the next delivery opens a new connection
            sink.start()
            deliver(250, "MTA back")
            wait_messages(sink, 1)
            before = inst.log().count("lmtp: sieve smtp connected")
            # the MTA restarts behind the kept connection: the reply goes
            # over a new one, the recipient does not notice
            sink.stop()
            sink.start()
            deliver(250, "kept connection closed by the MTA")
            wait_messages(sink, 2)
            check(inst.log().count("lmtp: sieve smtp connected") ==
                  before + 1, "not reconnected once: %s"
                  % inst.log()[-800:])
            check(len(inst.messages("user.bob")) == 2, "mail lost")
            check(inst.sent() == [], "sendmail ran")
        finally:
            problems += sink.stop()
        check(not problems, "stop: %s" % problems)


TESTS = [
    test_smtp_pipelining,
    test_smtp_no_pipelining,
    test_smtp_unix_socket,
    test_smtp_refusals_and_reconnect,
]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
