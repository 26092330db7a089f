#!/usr/bin/env python3
"""test_sieve_postfix.py - Sieve at delivery with a real MTA on both
sides.

    SMTP client --> Postfix "in" --LMTP--> lmtpd (users' Sieve scripts)
                        |                      |
                        | bounces (DSN)        | redirect, vacation:
                        v                      v  the `sendmail` key
                   smtp-sink  <--SMTP--  Postfix "out" (sendmail, pickup)

Postfix "in" is test_postfix.py's private instance (relay_domains = the
test domain over lmtp:unix:THE-LMTP-SOCKET); its default_transport is
smtp with relayhost = [127.0.0.1]:SINK, so the bounce of a recipient
refused with 550 goes there.  Postfix "out" is a second private instance
whose `sendmail` lmtpd runs for redirect and vacation:

    sendmail: /usr/bin/env MAIL_CONFIG=OUT/etc /usr/sbin/sendmail

(Postfix's own sendmail, its configuration named by MAIL_CONFIG: lmtpd
runs as the cyrus user, and an unprivileged `sendmail -C DIR` is refused
unless DIR is listed in alternate_config_directories of the system's
main.cf, which the test never touches.  For the same reason the
instance's command_directory holds a postdrop without the set-gid bit
and its maildrop directory is mode 1733: the pre-setgid way of letting
local users submit.)  Its relayhost is the same loopback smtp-sink,
Postfix's test server, which dumps each transaction with its envelope
(-d: X-Mail-Args, X-Rcpt-Args, then the message).

One message from sender@example.net to three users of the test domain:
alice redirects (the sink gets it with MAIL FROM:<sender@example.net>,
RCPT TO:<fwd@remote.example>, our trace header; nothing stored), bob
answers with vacation (MAIL FROM:<>, RCPT TO:<sender@example.net>,
Auto-Submitted: auto-replied; the message stored), carol rejects (lmtpd
answers 550 5.7.1, Postfix "in" bounces: a multipart/report;
report-type=delivery-status from MAILER-DAEMON with MAIL FROM:<>, naming
carol and the reason).  Every process is stopped by its PID; everything
listens on 127.0.0.1 only.

Needs root (postfix start, smtp-sink -u) and Debian's postfix package.
Environment: see lmtphelp.py.
"""
import email
import email.policy
import glob
import os
import pwd
import shutil
import smtplib
import socket
import subprocess
import sys
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import Skip, alive, check, free_port, wait_until  # noqa: E402
from lmtphelp import make_message, run_lmtp_tests  # noqa: E402
from test_postfix import Postfix, need_postfix  # noqa: E402
from test_sieve_delivery import SieveInstance, msgid  # noqa: E402

SMTP_SINK = shutil.which("smtp-sink") or "/usr/sbin/smtp-sink"
SENDMAIL = "/usr/sbin/sendmail"
DEADLINE_S = 180      # for mail to cross both MTAs: a hang guard


def addr(args):
    """The address of MAIL / RCPT arguments ("FROM:<a> SIZE=1" -> "a")."""
    a = args.strip().split()[0] if args.strip() else ""
    if a.upper().startswith(("FROM:", "TO:")):
        a = a.split(":", 1)[1]
    return a[1:-1] if a.startswith("<") and a.endswith(">") else a


class Sink:
    """Postfix's smtp-sink on 127.0.0.1, dumping every transaction."""

    def __init__(self, base):
        self.dir = os.path.join(base, "sink")
        os.makedirs(self.dir, exist_ok=True)
        pw = pwd.getpwnam("postfix")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.port = free_port()
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [SMTP_SINK, "-u", "postfix", "-h", "sink.test.invalid",
             "-d", os.path.join(self.dir, "m."),
             "127.0.0.1:%d" % self.port, "32"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up():
            try:
                with socket.create_connection(("127.0.0.1", self.port), 2):
                    return True
            except OSError:
                return self.proc.poll() is not None
        check(wait_until(up, 30, 0.1) and self.proc.poll() is None,
              "smtp-sink did not start")

    def messages(self):
        """[(mail args, [rcpt args], email.message)] of complete dumps."""
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
                                     m.get_all("X-Rcpt-Args") or []], m))
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


def outgoing_postfix(base, sink_port):
    """The second private Postfix, for lmtpd's sendmail."""
    bindir = os.path.join(base, "bin")
    os.makedirs(bindir, exist_ok=True)
    for src in glob.glob("/usr/sbin/post*") + [SENDMAIL]:
        n = os.path.basename(src)
        if n not in ("postdrop", "postqueue"):
            os.symlink(src, os.path.join(bindir, n))
    for n in ("postdrop", "postqueue"):     # copies: no set-gid bit
        shutil.copy("/usr/sbin/" + n, os.path.join(bindir, n))
        os.chmod(os.path.join(bindir, n), 0o755)
    return Postfix(base, "/nonexistent-lmtp.sock", extra={
        "command_directory": bindir,
        "relay_domains": "",
        "default_transport": "smtp",
        "relayhost": "[127.0.0.1]:%d" % sink_port,
        "myhostname": "out.test.invalid",
        "syslog_name": "postfix-sieveout",
    })


def test_sieve_with_postfix_both_sides():
    need_postfix()
    if not os.access(SMTP_SINK, os.X_OK) or not os.access(SENDMAIL,
                                                           os.X_OK):
        raise Skip("smtp-sink or sendmail missing")
    with SieveInstance("sv-postfix", prefork=1, maxchild=5) as inst:
        sink = Sink(inst.path("mta"))
        pf_in = Postfix(inst.path("pf-in"), inst.unix_socket, extra={
            "default_transport": "smtp",
            "relayhost": "[127.0.0.1]:%d" % sink.port,
        })
        pf_out = outgoing_postfix(inst.path("pf-out"), sink.port)
        inst.write_imapd_conf({
            "sievedir": inst.sievedir,
            "sendmail": "/usr/bin/env MAIL_CONFIG=%s %s"
                        % (pf_out.confdir, SENDMAIL),
        })
        inst.script("alice", 'redirect "fwd@remote.example";\n')
        inst.script("bob", 'require "vacation";\n'
                    'vacation :days 1 :subject "away" "I am away.";\n')
        inst.script("carol", 'require "reject";\nreject "no thanks";\n')
        problems = []
        try:
            sink.start()
            inst.start()
            pf_in.start()
            pf_out.start()
            os.chmod(os.path.join(pf_out.queue, "maildrop"), 0o1733)
            os.chmod(os.path.join(pf_out.queue, "public"), 0o711)

            mid = msgid()
            msg = make_message(mid, subject="hello both sides",
                               to="alice@test.example>, "
                                  "<bob@test.example>, <carol@test.example")
            with smtplib.SMTP("127.0.0.1", pf_in.port, timeout=60) as s:
                refused = s.sendmail("sender@example.net",
                                     ["alice@test.example",
                                      "bob@test.example",
                                      "carol@test.example"], msg)
            check(not refused, "Postfix refused: %r" % refused)

            def arrived():
                got = sink.messages()
                return got if len(got) >= 3 else None
            got = wait_until(arrived, DEADLINE_S, 0.2)
            check(got, "the sink has %d of 3 messages; in: %s; out: %s" % (
                len(sink.messages()), pf_in.log()[-1200:],
                pf_out.log()[-1200:]))

            def one(pred, what):
                hits = [g for g in got if pred(g)]
                check(len(hits) == 1, "%s: %d at the sink: %r" % (
                    what, len(hits), [(g[0], g[1]) for g in got]))
                return hits[0]

            # the redirect: the original sender, the new recipient
            mail, rcpts, m = one(
                lambda g: "fwd@remote.example" in g[1], "redirect")
            check(mail == "sender@example.net",
                  "redirect MAIL FROM: %r" % mail)
            check(rcpts == ["fwd@remote.example"],
                  "redirect RCPT: %r" % rcpts)
            check(m.get("X-Sieve-Redirected-By") == "alice@test.example"
                  and m.get("Message-ID") == "<%s>" % mid
                  and m.get("Subject") == "hello both sides",
                  "redirected message: %r" % m.items()[:12])

            # the vacation reply: null sender, Auto-Submitted
            mail, rcpts, m = one(
                lambda g: g[2].get("Subject") == "away", "vacation")
            check(mail == "", "vacation MAIL FROM: %r" % mail)
            check(rcpts == ["sender@example.net"],
                  "vacation RCPT: %r" % rcpts)
            check((m.get("Auto-Submitted") or "").startswith("auto-replied"),
                  "vacation Auto-Submitted: %r" % m.get("Auto-Submitted"))
            check(m.get("In-Reply-To") == "<%s>" % mid, "vacation In-Reply-To: %r"
                  % m.get("In-Reply-To"))

            # the reject: Postfix's DSN to the sender
            mail, rcpts, m = one(
                lambda g: "report-type=delivery-status" in
                (g[2].get("Content-Type") or "").replace('"', ""),
                "delivery status notification")
            check(mail == "", "DSN MAIL FROM: %r" % mail)
            check(rcpts == ["sender@example.net"], "DSN RCPT: %r" % rcpts)
            text = m.as_string()
            check("carol@test.example" in text and "no thanks" in text and
                  "5.7.1" in text, "DSN does not name carol and the "
                  "reason: %s" % text[:1500])
            check("Action: failed" in text, "DSN action not failed")

            # what was stored
            check(len(inst.messages("user.alice")) == 0,
                  "redirect kept a copy")
            check(len(inst.messages("user.bob")) == 1, "vacation lost mail")
            check(len(inst.messages("user.carol")) == 0,
                  "rejected mail stored")
            check("status=bounced" in pf_in.log(), "no bounce in the log")
        finally:
            for pf in (pf_in, pf_out):
                problems += pf.stop()
            problems += sink.stop()
        check(not problems, "stop: %s" % problems)
        check(not pf_in.processes() and not pf_out.processes(),
              "Postfix processes left")


TESTS = [
    test_sieve_with_postfix_both_sides,
]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
