#!/usr/bin/env python3
"""test_clients.py - imapd with real third-party IMAP clients.

One master-run instance (see imaphelp.py): an "imap" listener on
127.0.0.1 with STARTTLS, a self-signed certificate, a sasldb with one
user, allowplaintext off.  Two clients, each run as a program:

- Cyrus's imtest (cyrus-clients) does STARTTLS, then AUTHENTICATE PLAIN,
  then a LIST and a LOGOUT; its transcript must show the TLS handshake,
  "Authenticated." and the tagged OKs.
- mbsync (isync) syncs the user's mailboxes to a local Maildir and back
  over STARTTLS, checking the server's certificate against the test's
  self-signed one: messages delivered with mbtool come down, flags set
  and a folder made locally go up (checked with imaplib), and one more
  sync changes nothing on either side.  Another sync shows (mbsync's
  network debug output, the server's log) that mbsync compresses with
  COMPRESS=DEFLATE when imapd offers it, and not with DisableExtensions.
- offlineimap (offlineimap3), a second full client with its own IMAP
  library: the same round trip over STARTTLS with the certificate
  checked (messages down, flags and a locally written message up, a
  third run that changes nothing).

A test is skipped (SKIP) only when its program is not installed.

Environment: see imaphelp.py.
"""
import imaplib
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from imaphelp import (IMAP4, ImapInstance, check,  # noqa: E402
                      make_message, run_imap_tests, tls_context)
from testlib import Skip  # noqa: E402

IMTEST = "/usr/lib/cyrus/bin/imtest"
MBSYNC = shutil.which("mbsync") or "/usr/bin/mbsync"
OFFLINEIMAP = shutil.which("offlineimap") or "/usr/bin/offlineimap"
USER, PASSWORD = "carol", "c4rol-pw"

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("clients", tls=True, sasl=(USER, PASSWORD))
        try:
            i.create("user." + USER)
            i.create("user.%s.Archive" % USER)
            i.write_cyrus_conf(imaps=False, lmtp=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def tls_login_logged(log):
    """Whether the log shows USER logging in with PLAIN over TLS."""
    return re.search(r"imap: login user=<%s> mech=<PLAIN> peer=<127\.0\.0"
                     r"\.1:\d+> tls=<TLSv1\.[23] " % USER, log) is not None


def login():
    m = IMAP4(*inst().addr(), timeout=20)
    m.starttls(tls_context())
    m.login(USER, PASSWORD)
    return m


def close(m):
    try:
        m.shutdown()
    except OSError:
        pass


def run(cmd, env=None, input=None, timeout=120):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       input=input, env=env, timeout=timeout)
    return r.returncode, r.stdout.decode(errors="replace")


# ---- imtest ----------------------------------------------------------------

def test_imtest_starttls_plain():
    if not os.access(IMTEST, os.X_OK):
        raise Skip("%s not installed (package cyrus-clients)" % IMTEST)
    i = inst()
    i.mark_log()
    tmp = tempfile.mkdtemp(prefix="imtest.", dir=i.dir)
    cmds = os.path.join(tmp, "commands")
    with open(cmds, "wb") as f:
        f.write(b'a01 LIST "" *\r\na02 LOGOUT\r\n')
    # -t "": STARTTLS without a client certificate; -f: these commands
    # after authentication, then imtest waits for the server to close
    rc, out = run([IMTEST, "-t", "", "-m", "PLAIN", "-a", USER,
                   "-w", PASSWORD, "-p", str(i.tcp_port), "-f", cmds,
                   "127.0.0.1"], env=dict(os.environ, HOME=tmp),
                  input=b"", timeout=120)
    transcript = "imtest exit %d:\n%s" % (rc, out)
    check(re.search(r"^C: [^\r\n]*STARTTLS", out, re.M) is not None,
          "imtest did not send STARTTLS: " + transcript)
    check(re.search(r"^S: [^\r\n]*OK[^\r\n]*", out, re.M) is not None,
          "no OK from the server: " + transcript)
    check(re.search(r"TLS connection established", out) is not None,
          "no TLS connection: " + transcript)
    check(re.search(r"^C: [^\r\n]*AUTHENTICATE PLAIN", out, re.M)
          is not None, "imtest did not AUTHENTICATE PLAIN: " + transcript)
    check("Authenticated." in out, "not authenticated: " + transcript)
    check(re.search(r'^\* LIST \([^)]*\) "\." (INBOX|"INBOX")\r?$', out,
                    re.M) is not None, "no LIST INBOX line: " + transcript)
    check(re.search(r'^\* LIST \([^)]*\) "\." "?INBOX\.Archive"?\r?$', out,
                    re.M) is not None, "no LIST INBOX.Archive line: "
          + transcript)
    check(re.search(r"^a01 OK", out, re.M) is not None,
          "LIST not OK: " + transcript)
    check(re.search(r"^a02 OK", out, re.M) is not None,
          "LOGOUT not OK: " + transcript)
    check(rc == 0, transcript)
    check(re.search(r"Security strength factor: [1-9]", out) is not None,
          "no security layer: " + transcript)
    shutil.rmtree(tmp, ignore_errors=True)
    # the server's side: a PLAIN login under TLS
    check(tls_login_logged(i.new_log()), "no TLS PLAIN login of %s in the "
          "master log: %s" % (USER, i.new_log()[-800:]))
    check(not i.worker_trouble(), "worker trouble: %s" % i.worker_trouble())


# ---- mbsync ----------------------------------------------------------------

MBSYNC_CONF = """\
IMAPAccount test
Host localhost
Port {port}
User {user}
Pass {password}
SSLType STARTTLS
CertificateFile {cert}
AuthMechs PLAIN
Timeout 20

IMAPStore remote
Account test

MaildirStore local
Path {maildir}/
Inbox {maildir}/INBOX
SubFolders Verbatim

Channel test
Far :remote:
Near :local:
Patterns *
Create Both
Expunge Both
SyncState *
"""


def maildir_files(path):
    """{basename-before-':2,': (subdir, flags)} of a Maildir folder."""
    out = {}
    for sub in ("new", "cur"):
        for name in os.listdir(os.path.join(path, sub)):
            base, _, info = name.partition(":2,")
            out[base] = (sub, info)
    return out


def message_ids(files_dir):
    """Sorted Message-ID header values of the messages under a Maildir."""
    ids = []
    for sub in ("new", "cur"):
        d = os.path.join(files_dir, sub)
        for name in os.listdir(d):
            with open(os.path.join(d, name), "rb") as f:
                m = re.search(rb"^Message-ID: *(\S+)", f.read(), re.M | re.I)
            ids.append(m.group(1).decode() if m else None)
    return sorted(ids, key=str)


def server_state(m):
    """{folder: [(message-id, frozenset(flags), uid)]} of every folder."""
    typ, data = m.list('""', "*")
    check(typ == "OK", "LIST %r" % data)
    names = []
    for d in data:
        mm = re.match(rb'^\(([^)]*)\) "\." (.*)$', d)
        check(mm is not None, "LIST line %r" % d)
        n = mm.group(2)
        if n.startswith(b'"'):
            n = n[1:-1]
        if b"\\Noselect" not in mm.group(1):
            names.append(n.decode())
    state = {}
    for n in names:
        typ, data = m.select('"%s"' % n, readonly=True)
        check(typ == "OK", "EXAMINE %s %r" % (n, data))
        msgs = []
        if int(data[0]) > 0:
            typ, data = m.fetch(
                "1:*", "(UID FLAGS BODY.PEEK[HEADER.FIELDS (MESSAGE-ID)])")
            check(typ == "OK", "FETCH %s %r" % (n, data))
            for part in data:
                if not isinstance(part, tuple):
                    continue
                fl = re.search(rb"FLAGS \(([^)]*)\)", part[0])
                uid = re.search(rb"UID (\d+)", part[0])
                mid = re.search(rb"Message-ID: *(\S+)", part[1], re.I)
                check(fl is not None and mid is not None and uid is not None,
                      "FETCH item %r" % (part,))
                msgs.append((mid.group(1).decode(),
                             frozenset(fl.group(1).decode().split()),
                             int(uid.group(1))))
        state[n] = sorted(msgs)
    return state


def test_mbsync_round_trip():
    if not os.access(MBSYNC, os.X_OK):
        raise Skip("mbsync not installed (package isync)")
    i = inst()
    i.mark_log()
    home = tempfile.mkdtemp(prefix="mbsync.", dir=i.dir)
    maildir = os.path.join(home, "Mail")
    os.mkdir(maildir)
    conf = os.path.join(home, "mbsyncrc")
    with open(conf, "w") as f:
        f.write(MBSYNC_CONF.format(port=i.tcp_port, user=USER,
                                   password=PASSWORD, cert=i.cert,
                                   maildir=maildir))
    env = dict(os.environ, HOME=home)

    def sync(what):
        rc, out = run([MBSYNC, "-c", conf, "-a"], env=env, timeout=120)
        check(rc == 0, "mbsync (%s) exit %d:\n%s" % (what, rc, out))
        return out

    mids = []
    for n in range(3):
        mid = "clients-%d@example.com" % n
        mids.append("<%s>" % mid)
        i.mbtool("deliver", USER, input=make_message(
            msgid=mid, subject="sync %d" % n))
    i.mbtool("deliver", "-m", "Archive", USER, input=make_message(
        msgid="clients-archive@example.com", subject="archived"))

    # down: INBOX and Archive with their messages
    sync("down")
    inbox = os.path.join(maildir, "INBOX")
    check(message_ids(inbox) == sorted(mids), "local INBOX after the first "
          "sync: %r" % message_ids(inbox))
    # the spool's messages, line ends aside, are the local files (but
    # for the X-TUID header mbsync adds to track what it stores)
    local = sorted(re.sub(rb"(?m)^X-TUID: \S+\n", b"", d)
                   for d in _read_all(inbox))
    spool = sorted(d.replace(b"\r\n", b"\n")
                   for d in i.messages("user." + USER))
    check(local == spool, "local INBOX files differ from the spool:\n%r\n%r"
          % (local, spool))
    archive = os.path.join(maildir, "Archive")
    check(os.path.isdir(archive) and message_ids(archive)
          == ["<clients-archive@example.com>"], "local Archive: %r"
          % (os.listdir(maildir),))

    # locally: one message seen and flagged, a new folder with a message
    old = None
    for sub in ("new", "cur"):
        for name in os.listdir(os.path.join(inbox, sub)):
            with open(os.path.join(inbox, sub, name), "rb") as f:
                if mids[1].encode() in f.read():
                    old = os.path.join(inbox, sub, name)
    check(old is not None, "message %s not found locally" % mids[1])
    base = os.path.basename(old).partition(":2,")[0]
    os.rename(old, os.path.join(inbox, "cur", base + ":2,FS"))
    newdir = os.path.join(maildir, "Projects")
    for s in ("cur", "new", "tmp"):
        os.makedirs(os.path.join(newdir, s))
    with open(os.path.join(newdir, "new", "1700000000.1.localhost"),
              "wb") as f:
        local_msg = make_message(msgid="clients-local@example.com",
                                 subject="made locally")
        f.write(local_msg.replace(b"\r\n", b"\n"))

    check(tls_login_logged(i.new_log()), "no TLS PLAIN login of %s in the "
          "master log: %s" % (USER, i.new_log()[-800:]))

    # up: the flags and the new folder reach the server
    sync("up")
    m = login()
    try:
        state = server_state(m)
        # the message made locally arrives byte for byte (CRLF), with
        # the X-TUID header mbsync adds to whatever it stores
        typ, data = m.select('"INBOX.Projects"', readonly=True)
        check(typ == "OK", "EXAMINE INBOX.Projects %r" % data)
        typ, data = m.fetch("1", "(BODY.PEEK[])")
        check(typ == "OK" and isinstance(data[0], tuple)
              and re.sub(rb"(?m)^X-TUID: \S+\r\n", b"", data[0][1])
              == local_msg, "INBOX.Projects message %r"
              % (data,))
        m.logout()
    finally:
        close(m)
    short = {k: [e[:2] for e in v] for k, v in state.items()}
    expect_inbox = sorted((mid, frozenset(["\\Seen", "\\Flagged"])
                           if mid == mids[1] else frozenset())
                          for mid in mids)
    check(short.get("INBOX") == expect_inbox, "server INBOX after the "
          "sync up: %r" % short.get("INBOX"))
    check(short.get("INBOX.Archive") == [("<clients-archive@example.com>",
                                          frozenset())],
          "server INBOX.Archive: %r" % short.get("INBOX.Archive"))
    check(short.get("INBOX.Projects") == [("<clients-local@example.com>",
                                           frozenset())],
          "server INBOX.Projects after the sync up: %r" % (state,))
    check(set(state) == {"INBOX", "INBOX.Archive", "INBOX.Projects"},
          "server folders %r" % sorted(state))

    # again: nothing changes on either side
    local_before = {f: maildir_files(os.path.join(maildir, f))
                    for f in ("INBOX", "Archive", "Projects")}
    out = sync("again")
    local_after = {f: maildir_files(os.path.join(maildir, f))
                   for f in ("INBOX", "Archive", "Projects")}
    check(local_before == local_after, "third sync changed the Maildir: "
          "%r -> %r\n%s" % (local_before, local_after, out))
    m = login()
    try:
        state2 = server_state(m)
        m.logout()
    finally:
        close(m)
    check(state2 == state, "third sync changed the server: %r -> %r"
          % (state, state2))
    shutil.rmtree(home, ignore_errors=True)
    check(not i.worker_trouble(), "worker trouble: %s" % i.worker_trouble())


def test_mbsync_compress():
    """mbsync uses COMPRESS=DEFLATE when offered (under STARTTLS): its
    network debug output shows the command and its OK, the server logs
    the compression, and the messages arrive intact.  With
    DisableExtensions COMPRESS=DEFLATE the same sync runs uncompressed (the
    server logs no compression for it), so the first run's log line is
    mbsync's doing."""
    if not os.access(MBSYNC, os.X_OK):
        raise Skip("mbsync not installed (package isync)")
    i = inst()
    i.create("user.%s.Zipped" % USER)
    mids = []
    for n in range(4):
        mid = "zipped-%d@example.com" % n
        mids.append("<%s>" % mid)
        i.mbtool("deliver", "-m", "Zipped", USER, input=make_message(
            msgid=mid, subject="compressed %d" % n,
            body=b"deflate me, deflate me\r\n" * 2000))
    for disable in (False, True):
        i.mark_log()
        home = tempfile.mkdtemp(prefix="mbsyncz.", dir=i.dir)
        maildir = os.path.join(home, "Mail")
        os.mkdir(maildir)
        conf = os.path.join(home, "mbsyncrc")
        text = MBSYNC_CONF.format(port=i.tcp_port, user=USER,
                                  password=PASSWORD, cert=i.cert,
                                  maildir=maildir)
        text = text.replace("Patterns *", "Patterns Zipped")
        if disable:
            text = text.replace("Timeout 20\n", "Timeout 20\n"
                                "DisableExtensions COMPRESS=DEFLATE\n")
        with open(conf, "w") as f:
            f.write(text)
        rc, out = run([MBSYNC, "-Dn", "-c", conf, "-a"],
                      env=dict(os.environ, HOME=home), timeout=120)
        check(rc == 0, "mbsync exit %d:\n%s" % (rc, out[-3000:]))
        folder = os.path.join(maildir, "Zipped")
        check(os.path.isdir(folder) and message_ids(folder) == sorted(mids),
              "local Zipped: %r" % (os.listdir(maildir),))
        sent = re.search(r"(?m)^>>> \d+ COMPRESS DEFLATE", out)
        answered = re.search(r"(?m)^\d+ OK DEFLATE active", out)
        logged = re.search(r"imap: compression user=<%s> " % USER,
                           i.new_log())
        if disable:
            check(not sent and not logged, "compression with "
                  "DisableExtensions COMPRESS=DEFLATE:\n%s" % out[-2000:])
        else:
            check(sent and answered, "mbsync did not use COMPRESS:\n%s"
                  % out[-3000:])
            check(logged, "no compression line in the server log: %s"
                  % i.new_log()[-800:])
        shutil.rmtree(home, ignore_errors=True)
    check(not i.worker_trouble(), "worker trouble: %s" % i.worker_trouble())


# ---- offlineimap -----------------------------------------------------------

OFFLINEIMAP_CONF = """\
[general]
accounts = test
metadata = {home}/meta
maxsyncaccounts = 1

[Account test]
localrepository = local
remoterepository = remote

[Repository local]
type = Maildir
localfolders = {maildir}

[Repository remote]
type = IMAP
remotehost = localhost
remoteport = {port}
remoteuser = {user}
remotepass = {password}
ssl = no
starttls = yes
sslcacertfile = {cert}
auth_mechanisms = PLAIN
folderfilter = lambda name: name in ("INBOX", "INBOX.Offline")
createfolders = False
holdconnectionopen = no
"""


def test_offlineimap_round_trip():
    if not os.access(OFFLINEIMAP, os.X_OK):
        raise Skip("offlineimap not installed (package offlineimap3)")
    i = inst()
    i.create("user.%s.Offline" % USER)
    i.mark_log()
    home = tempfile.mkdtemp(prefix="offlineimap.", dir=i.dir)
    maildir = os.path.join(home, "Mail")
    os.mkdir(maildir)
    conf = os.path.join(home, "offlineimaprc")
    with open(conf, "w") as f:
        f.write(OFFLINEIMAP_CONF.format(home=home, maildir=maildir,
                                        port=i.tcp_port, user=USER,
                                        password=PASSWORD, cert=i.cert))
    env = dict(os.environ, HOME=home)

    def sync(what):
        # -o: one run; -u basic: plain progress lines (errors included)
        rc, out = run([OFFLINEIMAP, "-c", conf, "-o", "-u", "basic"],
                      env=env, timeout=180)
        check(rc == 0 and not re.search(r"(?m)^ERROR", out),
              "offlineimap (%s) exit %d:\n%s" % (what, rc, out[-3000:]))
        return out

    mids = []
    for n in range(3):
        mid = "offline-%d@example.com" % n
        mids.append("<%s>" % mid)
        i.mbtool("deliver", "-m", "Offline", USER, input=make_message(
            msgid=mid, subject="offline %d" % n))

    sync("down")
    folder = os.path.join(maildir, "INBOX.Offline")
    check(os.path.isdir(folder), "no local folder INBOX.Offline: %r"
          % os.listdir(maildir))
    check(message_ids(folder) == sorted(mids), "local INBOX.Offline after "
          "the first run: %r" % message_ids(folder))
    # what came down is the spool's message, line ends aside
    local = sorted(d.replace(b"\r\n", b"\n") for d in _read_all(folder))
    spool = sorted(d.replace(b"\r\n", b"\n")
                   for d in i.messages("user.%s.Offline" % USER))
    check(local == spool, "local files differ from the spool:\n%r\n%r"
          % (local, spool))
    check(tls_login_logged(i.new_log()), "no TLS PLAIN login of %s in the "
          "master log: %s" % (USER, i.new_log()[-800:]))

    # locally: one message seen and flagged, one message written
    target = None
    for sub in ("new", "cur"):
        for name in os.listdir(os.path.join(folder, sub)):
            with open(os.path.join(folder, sub, name), "rb") as f:
                if mids[1].encode() in f.read():
                    target = (sub, name)
    check(target is not None, "message %s not found locally" % mids[1])
    base = target[1].partition(":2,")[0]
    os.rename(os.path.join(folder, *target),
              os.path.join(folder, "cur", base + ":2,FS"))
    local_msg = make_message(msgid="offline-local@example.com",
                             subject="written offline")
    with open(os.path.join(folder, "new", "1700000001.2.localhost"),
              "wb") as f:
        f.write(local_msg.replace(b"\r\n", b"\n"))

    sync("up")
    m = login()
    try:
        state = server_state(m)
        typ, data = m.select('"INBOX.Offline"', readonly=True)
        check(typ == "OK", "EXAMINE INBOX.Offline %r" % data)
        typ, data = m.uid("SEARCH", None,
                          "HEADER", "Message-ID", "offline-local@example.com")
        check(typ == "OK" and len(data[0].split()) == 1,
              "the message written offline on the server: %r" % data)
        typ, data = m.uid("FETCH", data[0].split()[0], "(BODY.PEEK[])")
        # offlineimap adds its X-OfflineIMAP header to what it uploads
        body = data[0][1] if isinstance(data[0], tuple) else b""
        check(re.sub(rb"(?m)^X-OfflineIMAP: [^\r\n]*\r\n", b"", body)
              == local_msg, "uploaded message %r" % (body,))
        m.logout()
    finally:
        close(m)
    got = sorted(e[:2] for e in state.get("INBOX.Offline", []))
    want = sorted([(mid, frozenset(["\\Seen", "\\Flagged"])
                    if mid == mids[1] else frozenset()) for mid in mids]
                  + [("<offline-local@example.com>", frozenset())])
    check(got == want, "server INBOX.Offline after the run up: %r" % got)

    before = maildir_files(folder)
    out = sync("again")
    check(maildir_files(folder) == before, "third run changed the Maildir:"
          " %r -> %r\n%s" % (before, maildir_files(folder), out[-2000:]))
    m = login()
    try:
        state2 = server_state(m)
        m.logout()
    finally:
        close(m)
    check(state2 == state, "third run changed the server: %r -> %r"
          % (state, state2))
    shutil.rmtree(home, ignore_errors=True)
    check(not i.worker_trouble(), "worker trouble: %s" % i.worker_trouble())


def _read_all(folder):
    out = []
    for sub in ("new", "cur"):
        for name in os.listdir(os.path.join(folder, sub)):
            with open(os.path.join(folder, sub, name), "rb") as f:
                out.append(f.read())
    return out


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_imap_tests([
        test_imtest_starttls_plain,
        test_mbsync_round_trip,
        test_mbsync_compress,
        test_offlineimap_round_trip,
    ])
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
