"""lmtphelp.py - what the lmtpd tests share: a private master running
lmtpd with its own imapd.conf, cyrus.conf, mailbox list and spool under
$TEST_TMPDIR (default /var/tmp, never tmpfs), mailboxes set up with the
real tools/mbtool, a raw LMTP client that sees every reply line, message
files read back from the spool, and run_lmtp_tests(), testlib's runner
(PASS/FAIL lines, a closing "N passed, N failed", exit status) with the
lmtpd programs' defaults.  What the master tests share too (check, Fail,
processes from /proc, the status file, the runner) is in ../testlib.py.

Started as root the master switches to cyrus_user (the user "cyrus" when
it exists, else root is kept): the test directory is then owned by that
user and mbtool runs as that user too, so that every file the servers
must write is theirs.

Environment: top_builddir (default "."), TEST_TMPDIR, LMTP_TESTS (space
separated test names: run only those), LMTP_KEEP=1 (keep the temporary
directories for inspection; a failed test's directory is kept unless
LMTP_KEEP=0).  Python 3 standard library only.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from testlib import (MASTER, TMPDIR, TOP_BUILDDIR, Fail,  # noqa: E402
                     MasterRun, check, chown_run_as, connect_socket,
                     drop_privileges, free_port, root_stays, run_tests,
                     service_line, wait_until)

LMTPD_DIR = os.path.join(TOP_BUILDDIR, "lmtpd")
LMTPD = os.path.join(LMTPD_DIR, "lmtpd")
MBTOOL = os.path.join(TOP_BUILDDIR, "tools", "mbtool")
SERVERNAME = "test.example"
KEEP = os.environ.get("LMTP_KEEP") == "1"
KEEP_FAILED = os.environ.get("LMTP_KEEP") != "0"


# ---- certificates and sasldb ---------------------------------------------

def make_cert(directory):
    """A self-signed certificate for localhost: (certfile, keyfile),
    readable by the servers' user."""
    key = os.path.join(directory, "server.key")
    cert = os.path.join(directory, "server.crt")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048",
                        "-nodes", "-keyout", key, "-out", cert, "-subj",
                        "/CN=localhost", "-days", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    check(r.returncode == 0, "openssl req failed: %s"
          % r.stdout.decode(errors="replace")[-300:])
    for p in (key, cert):
        chown_run_as(p)
    os.chmod(key, 0o600)
    return cert, key


def make_sasldb(path, user, password, realms):
    """A sasldb with user's password in each of realms (saslpasswd2 -c)."""
    for realm in realms:
        cmd = ["saslpasswd2", "-p", "-c", "-f", path]
        if realm:
            cmd += ["-u", realm]
        cmd.append(user)
        r = subprocess.run(cmd, input=password.encode() + b"\n",
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=30)
        check(r.returncode == 0, "saslpasswd2 failed: %s"
              % r.stdout.decode(errors="replace"))
    chown_run_as(path)
    os.chmod(path, 0o640)


# ---- LMTP ----------------------------------------------------------------

class Reply:
    """One (possibly multi-line) reply: code (int), lines (texts after the
    code and separator), enh (the enhanced status code of the first line,
    or "")."""

    def __init__(self, code, lines):
        self.code = code
        self.lines = lines
        m = re.match(r"([245]\.\d{1,3}\.\d{1,3})\b", lines[0] if lines else "")
        self.enh = m.group(1) if m else ""

    @property
    def text(self):
        return "\n".join(self.lines)

    def __repr__(self):
        return "%d %s" % (self.code, " / ".join(self.lines))[:300]


class ConnectionClosed(Exception):
    pass


class Conn:
    """A raw LMTP client over a UNIX socket path or a (host, port): sends
    exactly the bytes it is given, parses replies line by line."""

    def __init__(self, addr, timeout=30.0):
        self.sock = connect_socket(addr, timeout)
        self.buf = b""
        self.eof = False
        self.tls = None

    def settimeout(self, t):
        (self.tls or self.sock).settimeout(t)

    def _recv(self):
        s = self.tls or self.sock
        data = s.recv(65536)
        if not data:
            self.eof = True
        self.buf += data

    def readline(self):
        """One line without its CRLF; ConnectionClosed at EOF."""
        while b"\n" not in self.buf:
            if self.eof:
                raise ConnectionClosed("connection closed (pending %r)"
                                       % self.buf[:200])
            self._recv()
        i = self.buf.index(b"\n")
        line, self.buf = self.buf[:i + 1], self.buf[i + 1:]
        return line.rstrip(b"\r\n").decode("utf-8", errors="replace")

    def reply(self):
        lines = []
        while True:
            line = self.readline()
            m = re.match(r"(\d{3})([ -])(.*)$", line)
            if not m:
                raise Fail("malformed reply line %r" % line)
            lines.append(m.group(3))
            if m.group(2) == " ":
                return Reply(int(m.group(1)), lines)

    def replies(self, n):
        return [self.reply() for _ in range(n)]

    def send(self, data):
        if isinstance(data, str):
            data = data.encode()
        (self.tls or self.sock).sendall(data)

    def cmd(self, line):
        """Send one command line (CRLF added), return its reply."""
        self.send(line.encode() + b"\r\n" if isinstance(line, str)
                  else line + b"\r\n")
        return self.reply()

    def expect(self, line, code, enh=None, what="%r"):
        """cmd(line), checked: its reply must have code (and the enhanced
        status code enh when one is given), else Fail with what % reply.
        Returns the reply."""
        r = self.cmd(line)
        check(r.code == code and (enh is None or r.enh == enh), what % r)
        return r

    def at_eof(self, timeout=30.0):
        """True when the server closed the connection (nothing more)."""
        self.settimeout(timeout)
        try:
            while not self.eof:
                self._recv()
        except socket.timeout:
            return False
        except OSError:
            return True
        return True

    def starttls(self, ctx, hostname="localhost"):
        self.tls = ctx.wrap_socket(self.sock, server_hostname=hostname)

    def close(self):
        try:
            (self.tls or self.sock).close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def dot_stuff(data):
    """Message bytes (CRLF lines) -> DATA payload with the final dot."""
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    out = re.sub(rb"(^|\r\n)\.", rb"\1..", data)
    return out + b".\r\n"


def make_message(msgid=None, subject="test", body=None, extra_headers=(),
                 sender="sender@example.org", to="rcpt@test.example"):
    """A CRLF message as bytes."""
    hdrs = ["From: <%s>" % sender, "To: <%s>" % to,
            "Subject: %s" % subject, "Date: Thu, 21 Nov 2024 12:00:00 +0000"]
    if msgid:
        hdrs.append("Message-ID: <%s>" % msgid)
    hdrs.extend(extra_headers)
    if body is None:
        body = b"hello\r\n"
    if isinstance(body, str):
        body = body.encode()
    return ("\r\n".join(hdrs) + "\r\n\r\n").encode() + body


def transaction(conn, sender, rcpts, message, lhlo=None, mail_params=""):
    """MAIL, RCPTs, DATA: returns (mail reply, [rcpt replies], data reply
    or None, [per-recipient replies]).  Sends LHLO first when lhlo is
    given."""
    if lhlo:
        r = conn.cmd("LHLO %s" % lhlo)
        check(r.code == 250, "LHLO: %r" % r)
    mr = conn.cmd("MAIL FROM:<%s>%s" % (sender, mail_params))
    if mr.code != 250:
        return mr, [], None, []
    rr = [conn.cmd("RCPT TO:<%s>" % r) for r in rcpts]
    ok = sum(1 for r in rr if r.code == 250)
    dr = conn.cmd("DATA")
    if dr.code != 354:
        return mr, rr, dr, []
    conn.send(dot_stuff(message))
    return mr, rr, dr, conn.replies(ok)


# ---- the instance --------------------------------------------------------

class Instance(MasterRun):
    """A master + lmtpd with its own configuration, mailbox list and
    spool.  Use as a context manager: leaving it stops the master and
    checks that nothing it started is left (raises Fail otherwise)."""

    TAG_VAR = "LMTP_TEST_TAG"
    CHILD_ZOMBIES = False

    def __init__(self, name, conf=None, tls=False, sasl=None):
        self.name = name
        os.makedirs(TMPDIR, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="lmtp-%s." % name, dir=TMPDIR)
        # Postfix's lmtp client (user postfix) must reach the socket
        os.chmod(self.dir, 0o755)
        self.confdir = self.path("conf")
        self.partition = self.path("spool")
        for d in (self.confdir, self.partition):
            os.mkdir(d)
        for d in (self.dir, self.confdir, self.partition):
            chown_run_as(d)
        self.imapd_conf = self.path("imapd.conf")
        self.cyrus_conf = self.path("cyrus.conf")
        self.logfile = self.path("master.log")
        self.statusfile = self.path("master.status")
        self.pidfile = self.path("master.pid")
        self.unix_socket = self.path("lmtp.sock")
        self.tcp_port = None
        self.tcp_preauth_port = None
        self.cert = self.key = None
        self.sasldb = None
        if tls:
            self.cert, self.key = make_cert(self.dir)
        if sasl:
            user, password = sasl
            self.sasldb = self.path("sasldb2")
            # the realm lmtpd asks SASL for is the servername (the FQDN
            # given to sasl_server_new), not saslpasswd2's default (the
            # host name): a user only in that realm is refused with 535
            make_sasldb(self.sasldb, user, password, [SERVERNAME])
        self.write_imapd_conf(conf or {})
        self.proc = None
        self.pid = None
        self.rc = None
        self.seen_children = set()
        self.log_mark = 0
        # set by a test that SIGKILLs workers itself: those crashes are
        # not trouble
        self.ignore_sigkill = False

    def write_imapd_conf(self, extra):
        opts = {
            "configdirectory": self.confdir,
            "partition-default": self.partition,
            "servername": SERVERNAME,
            "lmtp_max_recipients": "1000",
        }
        if root_stays():
            opts["cyrus_user"] = "root"
        if self.cert:
            opts["tls_server_cert"] = self.cert
            opts["tls_server_key"] = self.key
        if self.sasldb:
            opts.update({
                "sasl_pwcheck_method": "auxprop",
                "sasl_auxprop_plugin": "sasldb",
                "sasl_sasldb_path": self.sasldb,
                "sasl_mech_list": "PLAIN LOGIN",
            })
        opts.update(extra)
        with open(self.imapd_conf, "w") as f:
            for k, v in opts.items():
                f.write("%s: %s\n" % (k, v))

    def write_cyrus_conf(self, unix=True, tcp=False, tcp_preauth=False,
                         prefork=1, maxchild=10, cmd="lmtpd", extra=""):
        lines = []
        if unix:
            lines.append(service_line("lmtpunix", cmd, self.unix_socket,
                                      prefork=prefork, maxchild=maxchild))
        if tcp:
            self.tcp_port = free_port()
            lines.append(service_line("lmtp", cmd, "127.0.0.1:%d"
                                      % self.tcp_port, prefork=0,
                                      maxchild=maxchild))
        if tcp_preauth:
            self.tcp_preauth_port = free_port()
            lines.append(service_line("lmtpa", cmd + " -a", "127.0.0.1:%d"
                                      % self.tcp_preauth_port, prefork=0,
                                      maxchild=maxchild))
        text = "SERVICES {\n" + "".join(lines) + extra + "}\n"
        with open(self.cyrus_conf, "w") as f:
            f.write(text)
        return self

    def tcp_addr(self, preauth=False):
        return ("127.0.0.1", self.tcp_preauth_port if preauth
                else self.tcp_port)

    # -- master --

    def start(self, ready=1, timeout=60, drain=10):
        """Start the master (drain: its -T, seconds) and wait, up to a
        generous timeout, for `ready` lmtpunix workers."""
        self.spawn([MASTER, "-D", "-l", "-C", self.imapd_conf, "-M",
                    self.cyrus_conf, "-p", self.pidfile, "-S", LMTPD_DIR,
                    "-s", self.statusfile, "-T", str(drain)])
        def up():
            # the status file of this master, not one left by an earlier
            # run that was killed
            st = self.status()
            if st.get("master", {}).get("pid") != str(self.pid):
                return False
            svc = st["services"].get("lmtpunix") or {}
            return ready == 0 or int(svc.get("ready") or 0) >= ready
        ok = wait_until(lambda: not self.running() or up(), timeout)
        if not self.running():
            raise Fail("master exited at start with status %s: %s"
                       % (self.proc.returncode, self.log()[-600:]))
        check(ok, "lmtpunix: fewer than %d ready children %d s after start "
              "(log: %s)" % (ready, timeout, self.log()[-600:]))
        return self

    def mark_log(self):
        """Remember the log's length: new_log() returns what came after."""
        self.log_mark = len(self.log())

    def new_log(self):
        return self.log()[self.log_mark:]

    def worker_trouble(self, text=None):
        """Lines of the master log (since mark_log) that tell of a worker
        that crashed, failed, or a sanitizer report."""
        if text is None:
            text = self.new_log()
        bad = []
        for line in text.splitlines():
            if self.ignore_sigkill and re.search(r"crashed signal=<?9\b",
                                                 line):
                continue
            if (re.search(r"crashed signal=", line)
                    or re.search(r"exited status=<?[1-9]", line)
                    or "AddressSanitizer" in line
                    or "LeakSanitizer" in line
                    or "runtime error:" in line):
                bad.append(line)
        return bad

    def stop(self):
        """SIGTERM, SIGKILL after 15 s; returns a list of problems."""
        problems = []
        if self.proc is None:
            return problems
        if self.running():
            self.children()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.rc = self.proc.wait(15)
            except subprocess.TimeoutExpired:
                problems.append("master did not exit 15 s after SIGTERM")
                self.proc.kill()
                self.rc = self.proc.wait(5)
        else:
            self.rc = self.proc.wait(5)
        if self.rc not in (0, None) and not problems:
            problems.append("master exit status %s" % self.rc)
        problems += self.leftovers(5)
        self.proc = None
        return problems

    def cleanup(self):
        if not KEEP:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, etype, exc, tb):
        problems = self.stop()
        trouble = self.worker_trouble(self.log())
        if etype is not None:
            tail = self.log().splitlines()[-15:]
            sys.stdout.write("# master log (%s), last lines:\n" % self.dir)
            for line in tail:
                sys.stdout.write("#   %s\n" % line)
            # a failed test's instance (spool, indexes, master log) stays
            # for a look, unless LMTP_KEEP=0
            if KEEP_FAILED:
                sys.stdout.write("# instance kept: %s\n" % self.dir)
            else:
                self.cleanup()
            return False
        self.cleanup()
        check(not problems, "; ".join(problems))
        check(not trouble, "worker trouble in the master log: %s"
              % " | ".join(trouble[:5]))
        return False

    # -- mailboxes --

    def mbtool(self, *args, check_rc=True, input=None):
        r = subprocess.run([MBTOOL, "-C", self.imapd_conf] + list(args),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           input=input, preexec_fn=drop_privileges,
                           timeout=120)
        out = r.stdout.decode(errors="replace")
        err = r.stderr.decode(errors="replace")
        if check_rc and r.returncode != 0:
            raise Fail("mbtool %s: exit %d: %s%s" % (" ".join(args),
                                                     r.returncode, out, err))
        return r.returncode, out, err

    def create(self, name, acl=None):
        """Create mailbox name (internal); acl: {identifier: rights}."""
        self.mbtool("create", name)
        for ident, rights in (acl or {}).items():
            self.mbtool("setacl", name, ident, rights)

    def quota(self, root, storage_kb, messages="none"):
        self.mbtool("quota", "set", root, str(storage_kb), str(messages))

    def info(self, name):
        _, out, _ = self.mbtool("info", name)
        d = {}
        for line in out.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                d[k.strip()] = v.strip()
        return d

    def mailbox_dir(self, name):
        """The spool directory of an internal name (hashimapspool off);
        "D!user.x" lies in PARTITION/domain/D/user/x."""
        if "!" in name:
            domain, rest = name.split("!", 1)
            return os.path.join(self.partition, "domain", domain,
                                *rest.split("."))
        return os.path.join(self.partition, *name.split("."))

    def message_files(self, name, all_files=False):
        """[(uid, path)] of mailbox name, in uid order: the messages the
        index shows (visible, not expunged/aborted), each checked against
        its record (size and SHA-1: Fail otherwise); with all_files every
        DIR/UID. file instead (a dead append's leftovers too)."""
        import hashlib
        d = self.mailbox_dir(name)
        if all_files:
            out = []
            try:
                entries = os.listdir(d)
            except FileNotFoundError:
                return out
            for e in entries:
                m = re.match(r"^(\d+)\.$", e)
                if m:
                    out.append((int(m.group(1)), os.path.join(d, e)))
            out.sort()
            return out
        out = []
        for uid, size, sha1 in visible_messages(d):
            p = os.path.join(d, "%d." % uid)
            try:
                with open(p, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise Fail("%s uid %d: message file: %s" % (name, uid, e))
            check(len(data) == size, "%s uid %d: file has %d bytes, the "
                  "record says %d" % (name, uid, len(data), size))
            check(hashlib.sha1(data).digest() == sha1, "%s uid %d: file "
                  "content does not match the record's SHA-1" % (name, uid))
            out.append((uid, p))
        return out

    def messages(self, name):
        """[bytes] of the committed messages of mailbox name."""
        out = []
        for _, p in self.message_files(name):
            with open(p, "rb") as f:
                out.append(f.read())
        return out

    def count(self, name):
        return len(self.message_files(name, all_files=True))

    def stage_files(self):
        """Staging files left under PARTITION/stage./NN."""
        out = []
        root = os.path.join(self.partition, "stage.")
        for dirpath, _, files in os.walk(root):
            out.extend(os.path.join(dirpath, f) for f in files)
        return out


# ---- the mailbox index (store/mailbox.c's on-disk format) ------------------

MBX_FLAG_EXPUNGED = 1 << 16
MBX_FLAG_PENDING = 1 << 17
MBX_FLAG_ABORTED = 1 << 18


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC32C = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC32C[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def read_index(directory):
    """(header dict, [record dict]) of DIR/cyrus.index, read under the
    mailbox's shared lock: the valid header slot with the higher
    generation; records of 128 bytes after byte 4096 (each checked
    against its CRC-32C: a bad one raises Fail)."""
    import fcntl
    import struct
    path = os.path.join(directory, "cyrus.index")
    with open(path, "rb") as f:
        fcntl.lockf(f.fileno(), fcntl.LOCK_SH, 1, 0)
        try:
            data = f.read()
        finally:
            fcntl.lockf(f.fileno(), fcntl.LOCK_UN, 1, 0)
    best = None
    for off in (0, 2048):
        slot = data[off:off + 80]
        if len(slot) < 80 or slot[:8] != b"CDMBIDX1":
            continue
        if struct.unpack_from("<I", slot, 76)[0] != crc32c(slot[:76]):
            continue
        (version, gen, uidvalidity, uidnext, num_records, visible,
         exists) = struct.unpack_from("<IQIIIII", slot, 8)
        h = {"version": version, "generation": gen, "uidnext": uidnext,
             "num_records": num_records, "visible": visible,
             "exists": exists}
        if best is None or gen > best["generation"]:
            best = h
    check(best is not None, "%s: no valid header slot" % path)
    records = []
    for i in range((len(data) - 4096) // 128):
        rec = data[4096 + i * 128:4096 + (i + 1) * 128]
        uid, flags = struct.unpack_from("<II", rec, 0)
        size, = struct.unpack_from("<I", rec, 16)
        crc, = struct.unpack_from("<I", rec, 124)
        records.append({"uid": uid, "flags": flags, "size": size,
                        "sha1": rec[56:76], "crc_ok": crc == crc32c(rec[:124])})
    return best, records


def visible_messages(directory):
    """[(uid, size, sha1)] of the messages readers see: records in the
    resolved prefix [0, visible) that are neither expunged nor aborted
    nor pending."""
    h, records = read_index(directory)
    check(h["visible"] <= len(records), "%s: visible %d > %d records"
          % (directory, h["visible"], len(records)))
    out = []
    for r in records[:h["visible"]]:
        check(r["crc_ok"], "%s: record uid %d fails its CRC"
              % (directory, r["uid"]))
        if r["flags"] & (MBX_FLAG_EXPUNGED | MBX_FLAG_ABORTED
                         | MBX_FLAG_PENDING):
            continue
        out.append((r["uid"], r["size"], r["sha1"]))
    check(len(out) == h["exists"], "%s: %d visible messages, header says "
          "exists=%d" % (directory, len(out), h["exists"]))
    return out


# ---- message files ---------------------------------------------------------

def split_added_headers(data):
    """A spool file -> (return_path_line, received_header (unfolded
    lines list), rest).  Fail when the file does not start with them."""
    lines = data.split(b"\r\n")
    check(lines and lines[0].startswith(b"Return-Path: "),
          "the stored message does not start with Return-Path: %r"
          % data[:120])
    check(len(lines) > 2 and lines[1].startswith(b"Received: "),
          "the second header is not Received: %r" % data[:300])
    recv = [lines[1]]
    i = 2
    while i < len(lines) and lines[i][:1] in (b" ", b"\t"):
        recv.append(lines[i])
        i += 1
    rest = b"\r\n".join(lines[i:])
    return lines[0], recv, rest


def header_value(data, name):
    """First header name's unfolded value (str) in message bytes, or None."""
    head = data.split(b"\r\n\r\n", 1)[0]
    m = re.search(rb"(?im)^" + re.escape(name.encode()) +
                  rb":[ \t]*([^\r\n]*(?:\r\n[ \t][^\r\n]*)*)", head)
    if not m:
        return None
    return re.sub(rb"\r\n[ \t]+", b" ", m.group(1)).decode(errors="replace")


# ---- runner ---------------------------------------------------------------

def run_lmtp_tests(tests):
    """run_tests() for the lmtpd programs: LMTP_TESTS picks a subset."""
    return run_tests(tests, "LMTP_TESTS", (MASTER, LMTPD, MBTOOL))
