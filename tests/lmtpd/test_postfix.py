#!/usr/bin/env python3
"""test_postfix.py - a real upstream MTA in front of lmtpd.

test_postfix_virtual_domains: Postfix with virtual_mailbox_domains and
virtual_transport = lmtp:unix:... in front of lmtpd with virtdomains
(see the test's own text).  The first test:

The test runs a private Postfix instance (its own config_directory,
queue_directory and data_directory under the test's directory; chroot
off; an SMTP listener on 127.0.0.1:free port; relay_domains = the test
domain with relay_transport = lmtp:unix:THE-LMTP-SOCKET), submits 2,000
messages with unique Message-IDs to Postfix's smtpd over SMTP from several
threads, spread over 20 mailboxes, and waits until every message is in its
mailbox and `postqueue -p` says the queue is empty.  Then every Message-ID
must be in the spool exactly once, in the right mailbox, and Postfix's log
must show no bounce.  Postfix is stopped with `postfix stop` (`postfix
abort` and SIGKILL of its master as fallbacks) and must be gone.

Needs root (postfix start) and Debian's postfix package; the system's own
Postfix (/etc/postfix) is never started or touched.

Environment: see lmtphelp.py; POSTFIX_MESSAGES (default 2000).
"""
import os
import pwd
import re
import shutil
import smtplib
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]   # lmtphelp, ../testlib
from testlib import (Fail, Skip, alive, check,  # noqa: E402
                     find_processes, free_port, kill_all, proc_read,
                     read_text, run_threads, wait_until)
from lmtphelp import (Instance, header_value, make_message,  # noqa: E402
                      run_lmtp_tests)

NMSG = int(os.environ.get("POSTFIX_MESSAGES") or "2000")
NBOX = 20
STALL_S = 120           # no delivery for this long: stalled
NTHREADS = 8
DOMAIN = "test.example"
POSTFIX = shutil.which("postfix") or "/usr/sbin/postfix"
POSTQUEUE = shutil.which("postqueue") or "/usr/sbin/postqueue"
TOOL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}

MASTER_CF = """\
# service type  private unpriv  chroot  wakeup  maxproc command
{listen} inet  n       -       n       -       -       smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
lmtp      unix  -       -       n       -       -       lmtp
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""


class Postfix:
    """A private Postfix instance below base."""

    def __init__(self, base, lmtp_socket, extra=None):
        self.base = base
        self.confdir = os.path.join(base, "etc")
        self.queue = os.path.join(base, "queue")
        self.data = os.path.join(base, "data")
        self.logfile = os.path.join(base, "postfix.log")
        self.port = free_port()
        pw = pwd.getpwnam("postfix")
        for d in (base, self.confdir, self.queue, self.data):
            os.makedirs(d, exist_ok=True)
            os.chmod(d, 0o755)
        os.chown(self.data, pw.pw_uid, pw.pw_gid)
        main_cf = {
            "compatibility_level": "3.6",
            "queue_directory": self.queue,
            "data_directory": self.data,
            "mail_owner": "postfix",
            "setgid_group": "postdrop",
            "myhostname": "mta.test.invalid",
            "mydomain": "test.invalid",
            "myorigin": "$myhostname",
            "mydestination": "",
            "local_recipient_maps": "",
            "alias_maps": "",
            "alias_database": "",
            "inet_interfaces": "127.0.0.1",
            "inet_protocols": "ipv4",
            "mynetworks": "127.0.0.0/8",
            "smtpd_relay_restrictions": "permit_mynetworks, "
                                        "reject_unauth_destination",
            "relay_domains": DOMAIN,
            "relay_transport": "lmtp:unix:%s" % lmtp_socket,
            "default_transport": "error:this test relays only to %s"
                                 % DOMAIN,
            "lmtp_destination_concurrency_limit": "20",
            "default_process_limit": "50",
            "in_flow_delay": "0",
            "queue_run_delay": "1s",
            "minimal_backoff_time": "1s",
            "maximal_backoff_time": "2s",
            "smtputf8_enable": "no",
            "biff": "no",
            "append_dot_mydomain": "no",
            "smtpd_tls_security_level": "none",
            "smtp_tls_security_level": "none",
            "lmtp_tls_security_level": "none",
            "maillog_file": self.logfile,
            "import_environment": "MAIL_CONFIG MAIL_DEBUG MAIL_LOGTAG TZ "
                                  "LANG=C",
            "syslog_name": "postfix-lmtptest",
        }
        main_cf.update(extra or {})
        with open(os.path.join(self.confdir, "main.cf"), "w") as f:
            for k, v in main_cf.items():
                f.write("%s = %s\n" % (k, v))
        with open(os.path.join(self.confdir, "master.cf"), "w") as f:
            f.write(MASTER_CF.format(listen="127.0.0.1:%d" % self.port))
        self.started = False

    def run(self, *args, timeout=120):
        r = subprocess.run([POSTFIX, "-c", self.confdir] + list(args),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, env=TOOL_ENV)
        return r.returncode, r.stdout.decode(errors="replace")

    def master_pid(self):
        try:
            with open(os.path.join(self.queue, "pid", "master.pid")) as f:
                pid = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if alive(pid) else None

    def start(self):
        rc, out = self.run("check")
        check(rc == 0, "postfix check: %s" % out[-800:])
        rc, out = self.run("start")
        self.started = True
        check(rc == 0, "postfix start: %s" % out[-800:])
        ok = wait_until(lambda: self.master_pid() and self.smtp_ready(), 30,
                        0.2)
        check(ok, "Postfix's smtpd does not answer on port %d: %s"
              % (self.port, self.log()[-800:]))

    def smtp_ready(self):
        try:
            s = smtplib.SMTP("127.0.0.1", self.port, timeout=5)
        except OSError:
            return False
        try:
            s.quit()
        except smtplib.SMTPException:
            pass
        return True

    def queue_listing(self):
        r = subprocess.run([POSTQUEUE, "-c", self.confdir, "-p"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60, env=TOOL_ENV)
        return r.stdout.decode(errors="replace")

    def queue_empty(self):
        return "Mail queue is empty" in self.queue_listing()

    def flush(self):
        subprocess.run([POSTQUEUE, "-c", self.confdir, "-f"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, env=TOOL_ENV)

    def log(self):
        return read_text(self.logfile)

    def stop(self):
        """postfix stop; abort and SIGKILL as fallbacks.  Returns a list
        of problems."""
        problems = []
        if not self.started:
            return problems
        pid = self.master_pid()
        rc, out = self.run("stop", timeout=60)
        if rc != 0 and pid:
            problems.append("postfix stop: exit %d: %s" % (rc, out[-300:]))
        if pid and not wait_until(lambda: not alive(pid), 20, 0.1):
            problems.append("Postfix master %d alive 20 s after stop" % pid)
            self.run("abort", timeout=60)
            if not wait_until(lambda: not alive(pid), 10, 0.1):
                kill_all([pid])
        # its children (smtpd, qmgr, lmtp, ...) leave with the master
        left = wait_until(lambda: not self.processes() or None, 10, 0.1)
        if left is None:
            rest = self.processes()
            problems.append("Postfix processes left: %s" % rest)
            kill_all(rest)
        self.started = False
        return problems

    def processes(self):
        """PIDs of processes of this instance (their command line or
        environment names our config directory)."""
        needle = self.confdir.encode()

        def match(pid):
            cmd = proc_read(pid, "cmdline")
            env = proc_read(pid, "environ")
            return (cmd is not None and env is not None
                    and (needle in cmd or needle in env))
        return find_processes(match)


def submit(port, ids, errors, counter, lock):
    """Send the messages ids over one SMTP connection (reconnecting when
    the server closes it)."""
    s = None
    try:
        for i in ids:
            for attempt in range(5):
                try:
                    if s is None:
                        s = smtplib.SMTP("127.0.0.1", port, timeout=60)
                        s.ehlo("submit.example")
                    rcpt = "pf%02d@%s" % (i % NBOX, DOMAIN)
                    msg = make_message(msgid_of(i), subject="pf %d" % i,
                                       to=rcpt, body=b"message %d\r\n" % i
                                       + b"x" * (i % 700) + b"\r\n")
                    refused = s.sendmail("sender@example.org", [rcpt], msg)
                    if refused:
                        raise Fail("refused %r" % refused)
                    with lock:
                        counter[0] += 1
                    break
                except (smtplib.SMTPServerDisconnected, ConnectionError):
                    s = None
                    time.sleep(0.1 * (attempt + 1))
            else:
                raise Fail("message %d: could not be submitted" % i)
        if s is not None:
            s.quit()
    except Exception as e:  # noqa: BLE001 - reported by the caller
        with lock:
            errors.append(repr(e))


def msgid_of(i):
    return "pf.%d.%d@submit.example" % (os.getpid(), i)


def test_postfix_end_to_end():
    if os.geteuid() != 0:
        raise Skip("needs root to start a private Postfix")
    if not os.access(POSTFIX, os.X_OK):
        raise Skip("postfix is not installed")
    try:
        pwd.getpwnam("postfix")
    except KeyError:
        raise Skip("no user postfix")
    with Instance("postfix") as inst:
        boxes = ["user.pf%02d" % i for i in range(NBOX)]
        for b in boxes:
            inst.create(b)
        inst.write_cyrus_conf(prefork=2, maxchild=25)
        inst.start(ready=2)
        pf = Postfix(inst.path("postfix"), inst.unix_socket)
        try:
            pf.start()
            errors, counter, lock = [], [0], threading.Lock()
            t0 = time.monotonic()
            threads = [threading.Thread(target=submit, args=(
                pf.port, range(k, NMSG, NTHREADS), errors, counter, lock))
                for k in range(NTHREADS)]
            run_threads(threads, 1800)    # a hang guard, not a speed bound
            t_submit = time.monotonic() - t0
            check(not errors, "submission: %s" % "; ".join(errors[:3]))
            check(counter[0] == NMSG, "%d of %d submitted"
                  % (counter[0], NMSG))

            def total():
                return sum(inst.count(b) for b in boxes)
            last = [0, time.monotonic(), time.monotonic()]

            # no deadline for the whole run (a loaded machine is slower):
            # it fails when deliveries stop progressing for STALL_S
            def done():
                n = total()
                now = time.monotonic()
                if n != last[0]:
                    last[0], last[1], last[2] = n, now, now
                elif now - last[1] > 5:
                    pf.flush()         # nudge deferred mail
                    last[1] = now
                return (n >= NMSG and pf.queue_empty()) or \
                    now - last[2] > STALL_S
            wait_until(done, 3600, 0.5)
            ok = total() >= NMSG and pf.queue_empty()
            t_all = time.monotonic() - t0
            n = total()
            check(ok, "after %.0f s: %d of %d messages delivered, none for "
                  "%.0f s; queue:\n%s" % (t_all, n, NMSG,
                                         time.monotonic() - last[2],
                                         pf.queue_listing()[-1500:]))
            log = pf.log()
            deferred = len(re.findall(r"status=deferred", log))
            bounced = re.findall(r".*status=bounced.*", log)
            check(not bounced, "Postfix bounced %d messages, e.g. %s"
                  % (len(bounced), bounced[:2]))
            sent = len(re.findall(r"relay=[^,]*lmtp\.sock[^,]*,.*"
                                  r"status=sent", log))
            # lmtpd logs each delivery with Postfix's queue id, read
            # from the Received field Postfix put on top
            pf_qids = set(re.findall(r"lmtp\[\d+\]: ([0-9A-Za-z]+): to=<"
                                     r"[^>]*>, relay=[^,]*lmtp\.sock[^,]*,"
                                     r".*status=sent", log))
            our_qids = set(re.findall(r"lmtp: recipient qid=<([^>]*)> .*"
                                      r"status=<delivered>", inst.log()))
            check(pf_qids and pf_qids <= our_qids,
                  "Postfix queue ids not in lmtpd's recipient lines: %r"
                  % sorted(pf_qids - our_qids)[:5])
            print("#   %d messages: submitted in %.1f s, all delivered "
                  "after %.1f s (%.0f msg/s end to end); Postfix log: %d "
                  "sent via lmtp, %d deferrals"
                  % (NMSG, t_submit, t_all, NMSG / t_all, sent, deferred))
        finally:
            problems = pf.stop()
        check(not problems, "; ".join(problems))
        # every Message-ID exactly once, in its own mailbox
        seen = {}
        for b in boxes:
            for data in inst.messages(b):
                mid = header_value(data, "Message-ID")
                seen.setdefault(mid, []).append(b)
        missing, dups, wrong = [], [], []
        for i in range(NMSG):
            mid = "<%s>" % msgid_of(i)
            where = seen.pop(mid, [])
            if not where:
                missing.append(i)
            elif len(where) > 1:
                dups.append((i, where))
            elif where[0] != "user.pf%02d" % (i % NBOX):
                wrong.append((i, where[0]))
        check(not missing, "%d messages missing, e.g. %s"
              % (len(missing), missing[:5]))
        check(not dups, "%d messages stored more than once, e.g. %s"
              % (len(dups), dups[:3]))
        check(not wrong, "messages in the wrong mailbox: %s" % wrong[:3])
        check(not seen, "unexpected messages: %s" % list(seen)[:3])
        for b in boxes:
            rc, out, err = inst.mbtool("check", b, check_rc=False)
            check(rc == 0, "mbtool check %s: %s%s" % (b, out, err))


VDOMAINS = ["a.example", "b.example"]
VDEFAULT = "main.example"
VUSERS = ["alice", "bob", "postmaster"]


def need_postfix():
    if os.geteuid() != 0:
        raise Skip("needs root to start a private Postfix")
    if not os.access(POSTFIX, os.X_OK):
        raise Skip("postfix is not installed")
    try:
        pwd.getpwnam("postfix")
    except KeyError:
        raise Skip("no user postfix")


def test_postfix_virtual_domains():
    """Postfix with virtual_mailbox_domains for two domains (and the
    defaultdomain) and virtual_transport = lmtp:unix:SOCKET in front of
    lmtpd with virtdomains: userid: the same local parts in both domains
    and the default one receive only their own mail, messages addressed
    to users of several domains at once reach each, and an unknown user
    of a virtual domain is bounced by Postfix on lmtpd's 550 5.1.1."""
    need_postfix()
    with Instance("pfvirt", conf={"virtdomains": "userid",
                                  "defaultdomain": VDEFAULT}) as inst:
        boxes = {}
        for u in VUSERS:
            for d in VDOMAINS:
                boxes["%s@%s" % (u, d)] = "%s!user.%s" % (d, u)
            boxes["%s@%s" % (u, VDEFAULT)] = "user.%s" % u
        for b in boxes.values():
            inst.create(b)
        inst.write_cyrus_conf(prefork=2, maxchild=10)
        inst.start(ready=2)
        pf = Postfix(inst.path("postfix"), inst.unix_socket, extra={
            "relay_domains": "",
            "virtual_mailbox_domains": ", ".join(VDOMAINS + [VDEFAULT]),
            "virtual_mailbox_maps": "",
            "virtual_transport": "lmtp:unix:%s" % inst.unix_socket,
            # lmtpd decides who exists (550 5.1.1 otherwise)
            "smtpd_reject_unlisted_recipient": "no",
            "default_transport": "error:this test delivers only to "
                                 "virtual domains",
        })
        rcpts = sorted(boxes)
        sent = {}      # message-id -> set of mailboxes it must reach
        try:
            pf.start()
            s = smtplib.SMTP("127.0.0.1", pf.port, timeout=60)
            s.ehlo("submit.example")
            n = 0
            for k in range(4):
                for i, r in enumerate(rcpts):
                    # alone, and with a namesake of another domain
                    to = [r] if k % 2 == 0 else \
                        [r, rcpts[(i + 3) % len(rcpts)]]
                    mid = "pfv.%d.%d@submit.example" % (os.getpid(), n)
                    n += 1
                    msg = make_message(mid, subject="v %d" % n,
                                       to=", ".join(to),
                                       body=b"to %s\r\n" %
                                       ", ".join(to).encode())
                    refused = s.sendmail("sender@example.org", to, msg)
                    check(not refused, "refused %r" % refused)
                    sent["<%s>" % mid] = {boxes[t] for t in to}
            bad_mid = "pfv.%d.bad@submit.example" % os.getpid()
            s.sendmail("sender@example.org", ["nobody@a.example"],
                       make_message(bad_mid, to="nobody@a.example"))
            s.quit()

            def total():
                return sum(inst.count(b) for b in boxes.values())
            want = sum(len(v) for v in sent.values())

            def done():
                if total() < want or not pf.queue_empty() or \
                        "nobody@a.example" not in pf.log():
                    pf.flush()
                    return False
                return True
            ok = wait_until(done, 300, 0.5)
            check(ok, "%d of %d deliveries after 300 s; queue:\n%s"
                  % (total(), want, pf.queue_listing()[-1500:]))
            log = pf.log()
        finally:
            problems = pf.stop()
        check(not problems, "; ".join(problems))
        # (the notice to sender@example.org bounces too: this Postfix
        # delivers nowhere else)
        bounced = [a for a in re.findall(r"to=<([^>]*)>.*status=bounced",
                                         log)
                   if a.split("@")[-1] in VDOMAINS + [VDEFAULT]]
        check(bounced == ["nobody@a.example"], "bounced: %s" % bounced)
        check(re.search(r"to=<nobody@a\.example>.*5\.1\.1", log),
              "the bounce of nobody@a.example does not give lmtpd's 5.1.1")
        found = {}
        for b in boxes.values():
            for data in inst.messages(b):
                mid = header_value(data, "Message-ID")
                found.setdefault(mid, set()).add(b)
                check(mid in sent and b in sent[mid],
                      "%s holds %s, addressed to %s" % (b, mid,
                                                       sent.get(mid)))
        for mid, where in sent.items():
            check(found.get(mid) == where, "%s: in %s, expected %s"
                  % (mid, sorted(found.get(mid, ())), sorted(where)))


def test_postfix_smtputf8():
    """Postfix with smtputf8_enable = yes relays internationalized mail
    (a UTF-8 sender address, UTF-8 header fields) only to an LMTP server
    that offers SMTPUTF8 (RFC 6531), and bounces it otherwise: the
    messages arrive byte for byte, the sender's address intact in
    Return-Path, and nothing is bounced."""
    need_postfix()
    sender = "j\u00f6rg@\u4f8b\u5b50.example"
    with Instance("pfutf8") as inst:
        inst.create("user.uma")
        inst.write_cyrus_conf(prefork=1, maxchild=5)
        inst.start(ready=1)
        pf = Postfix(inst.path("postfix"), inst.unix_socket,
                     extra={"smtputf8_enable": "yes"})
        mids = []
        try:
            pf.start()
            s = smtplib.SMTP("127.0.0.1", pf.port, timeout=60)
            s.ehlo("submit.example")
            check(s.has_extn("smtputf8"), "Postfix does not offer SMTPUTF8")
            for i in range(3):
                mid = "pfu.%d.%d@submit.example" % (os.getpid(), i)
                mids.append(mid)
                msg = ("From: J\u00f6rg <%s>\r\nTo: <uma@%s>\r\n"
                       "Subject: Gr\u00fc\u00dfe \u4f60\u597d %d\r\n"
                       "Message-ID: <%s>\r\n\r\n\u00e9t\u00e9\r\n"
                       % (sender, DOMAIN, i, mid)).encode()
                refused = s.sendmail(sender, ["uma@%s" % DOMAIN], msg,
                                     mail_options=["SMTPUTF8",
                                                   "BODY=8BITMIME"])
                check(not refused, "refused %r" % refused)
            s.quit()

            def done():
                if "status=bounced" in pf.log():
                    return True
                if inst.count("user.uma") < len(mids) or \
                        not pf.queue_empty():
                    pf.flush()
                    return False
                return True
            ok = wait_until(done, 300, 0.5)
            log = pf.log()
            check(ok, "%d of %d delivered after 300 s; queue:\n%s\nlog:\n%s"
                  % (inst.count("user.uma"), len(mids),
                     pf.queue_listing()[-1500:], log[-1500:]))
        finally:
            problems = pf.stop()
        check(not problems, "; ".join(problems))
        check("status=bounced" not in log, "bounced: %s" % log[-1500:])
        got = {}
        for data in inst.messages("user.uma"):
            got[header_value(data, "Message-ID")] = data
        for mid in mids:
            data = got.get("<%s>" % mid)
            check(data is not None, "%s not delivered" % mid)
            check(data.startswith(("Return-Path: <%s>\r\n"
                                   % sender).encode()),
                  "Return-Path: %r" % data[:80])
            check(("Subject: Gr\u00fc\u00dfe \u4f60\u597d".encode())
                  in data, "the UTF-8 subject changed: %r" % data[:600])


TESTS = [test_postfix_end_to_end, test_postfix_virtual_domains,
         test_postfix_smtputf8]

if __name__ == "__main__":
    sys.exit(run_lmtp_tests(TESTS))
