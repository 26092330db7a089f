#!/usr/bin/env python3
"""test_imap_proxy.py - imapd as a frontend (imap_proxy: yes) in front of
two backends, the user -> backend directory in a private 3-member etcd
cluster (test_cyrusdb_etcd.Cluster), everything on loopback and stopped
by PID:

  backends alpha and beta: a master each with imapd (STARTTLS, its own
  self-signed certificate for localhost) and lmtpd on a UNIX socket,
  proxyservers: proxy; the frontend: a master with imapd (imap_proxy,
  directory_db: etcd, proxy_imap_backends localhost:PORT, STARTTLS to the
  backends verified against their certificates).  Users are placed with
  cyr_dbtool on the etcd directory (the fixture: tests/tierhelp.py).
  Clients are Python's imaplib over STARTTLS, every response checked
  against the grammar (imaphelp.IMAP4).

  both_backends   alice (alpha) and carol (beta) log in at the frontend:
                  the backend's capabilities after login, SELECT, FETCH of
                  a message delivered on the backend byte for byte, STORE,
                  APPEND landing on the right backend only; the logs name
                  the backend (frontend) and the proxy user (backend)
  idle            IDLE through the frontend: a delivery on the backend is
                  an EXISTS at the client
  refusals        a wrong password (the frontend's own check), a user
                  with no directory record, a record naming an unknown
                  backend: NO with the reason, the frontend stays up; at a
                  backend, a user who is not in proxyservers cannot log in
                  as another user
  backend_dies    the backend's imapd killed under a selected session: the
                  client gets "* BYE Mail server connection lost" and EOF;
                  with the backend stopped a login gets NO [UNAVAILABLE];
                  started again, a new login works
  tls_verified    a frontend that does not trust the backend's
                  certificate opens no session (NO, "not verified" logged)
  etcd_down       every etcd member stopped: NO [UNAVAILABLE] Mail
                  directory not reachable; the cluster started again: the
                  login works

Skipped (exit 77) without /usr/bin/etcd.  IMAP_PROXY_TESTS picks tests by
name.
"""
import os
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [TESTS, HERE, os.path.join(TESTS, "lmtpd"),
                os.path.join(TESTS, "conformance")]
from testlib import check, run_tests, wait_until  # noqa: E402
from lmtphelp import make_cert, make_message  # noqa: E402
from imaphelp import (IMAP4, IMAPD, ImapInstance,  # noqa: E402
                      make_sasldb_extra, tls_context)
from test_cyrusdb_etcd import DBTOOL  # noqa: E402
from tierhelp import Tier, pw, usable  # noqa: E402

USERS = {"alice": "alpha", "bob": "alpha", "carol": "beta"}
PROXY_USER, PROXY_PW = "proxy", "pr0xy-pw"
TIER = None
CLUSTER = None
WORK = None
B = {}          # name -> backend instance
FRONT = None


def place(user, backend):
    TIER.place(user, backend)


def new_backend(name, users):
    b = ImapInstance(name, tls=True, conf={"proxyservers": PROXY_USER},
                     sasl=(users[0], pw(users[0])))
    for u in users[1:]:
        make_sasldb_extra(b, u, pw(u))
    make_sasldb_extra(b, PROXY_USER, PROXY_PW)
    for u in users:
        b.create("user." + u)
    b.write_cyrus_conf(imaps=False)
    return TIER.start(b)


def front_conf(ca_file):
    conf = TIER.directory_conf(ttl="1", timeout="1500")
    conf.update({
        "imap_proxy": "yes",
        "proxy_imap_backends": "alpha=localhost:%d beta=localhost:%d"
                               % (B["alpha"].tcp_port, B["beta"].tcp_port),
        "proxy_authname": PROXY_USER,
        "proxy_password": PROXY_PW,
        "proxy_timeout": "5",
        "tls_client_ca_file": ca_file,
    })
    return conf


def new_front(name, ca_file):
    users = list(USERS) + ["erin", "frank"]
    f = ImapInstance(name, tls=True, conf=front_conf(ca_file),
                     sasl=(users[0], pw(users[0])))
    for u in users[1:]:
        make_sasldb_extra(f, u, pw(u))
    f.write_cyrus_conf(imaps=False, lmtp=False)
    return TIER.start(f)


def connect(inst=None, starttls=True):
    inst = inst or FRONT
    m = IMAP4(*inst.addr(), timeout=30)
    if starttls:
        m.starttls(tls_context())
    return m


def login(user, inst=None):
    m = connect(inst)
    typ, data = m.login(user, pw(user))
    check(typ == "OK", "LOGIN %s: %r" % (user, data))
    return m


def close(m):
    try:
        m.logout()
    except Exception:  # noqa: BLE001
        pass
    try:
        m.shutdown()
    except Exception:  # noqa: BLE001
        pass


def login_refused(user, password, inst=None):
    """The tagged NO text of a LOGIN through the frontend."""
    m = connect(inst)
    try:
        m.login(user, password)
    except IMAP4.error as e:
        return str(e)
    finally:
        close(m)
    raise AssertionError("LOGIN %s succeeded" % user)


def fetch_all(m):
    typ, data = m.select("INBOX", readonly=True)
    check(typ == "OK", "SELECT: %r" % data)
    if int(data[0]) == 0:
        return []
    typ, data = m.fetch("1:*", "(BODY.PEEK[])")
    check(typ == "OK", "FETCH: %r" % data)
    return [d[1] for d in data if isinstance(d, tuple)]


def direct_messages(user):
    """user's INBOX read straight from its backend (no proxy)."""
    m = login(user, B[USERS[user]])
    try:
        return fetch_all(m)
    finally:
        close(m)


# ---- tests -----------------------------------------------------------------

def test_both_backends():
    FRONT.mark_log()
    for user in ("alice", "carol"):
        b = B[USERS[user]]
        msg = make_message(msgid="proxy-%s@test" % user,
                           subject="to %s" % user)
        b.lmtp_deliver(user, msg)
        want = direct_messages(user)
        m = login(user)
        try:
            caps = m.capabilities
            check("IDLE" in caps and "IMAP4REV1" in caps,
                  "capabilities after login: %r" % (caps,))
            got = fetch_all(m)
            check(got == want, "%s through the frontend: %r, on the backend "
                  "%r" % (user, got[-1:], want[-1:]))
            typ, data = m.select("INBOX")
            check(typ == "OK", "SELECT: %r" % data)
            typ, data = m.store("1", "+FLAGS", "(\\Flagged)")
            check(typ == "OK" and b"\\Flagged" in data[0],
                  "STORE: %r" % data)
            app = make_message(msgid="appended-%s@test" % user,
                               subject="appended through the frontend")
            typ, data = m.append("INBOX", None, None, app)
            check(typ == "OK", "APPEND: %r" % data)
        finally:
            close(m)
        after = direct_messages(user)
        check(len(after) == len(want) + 1 and after[-1] == app,
              "%s's backend after the APPEND: %d messages, last %r"
              % (user, len(after), after[-1][:200]))
        other = [u for u, bn in USERS.items() if bn != USERS[user]][0]
        check(all(b"appended-%s@test" % user.encode() not in x
                  for x in direct_messages(other)),
              "the APPEND landed on the other backend too")
        check("proxy=<%s>" % PROXY_USER in b.log(),
              "%s's backend log has no proxied login" % user)
    log = FRONT.new_log()
    for user in ("alice", "carol"):
        check("imap: proxy session user=<%s> backend=<%s>"
              % (user, USERS[user]) in log, "no proxy session line for %s: "
              "%s" % (user, log[-800:]))
    check("tls=<TLSv1." in log, "the backend leg is not TLS: %s" % log[-800:])


def test_idle():
    m = login("bob")
    try:
        typ, data = m.select("INBOX")
        check(typ == "OK", "SELECT: %r" % data)
        n = int(data[0])
        tag = m._new_tag()
        m.send(tag + b" IDLE\r\n")
        line = m.readline()
        check(line.startswith(b"+"), "IDLE: %r" % line)
        B["alpha"].lmtp_deliver("bob", make_message(msgid="idle@test"))
        m.sock.settimeout(30)
        line = m.readline()
        check(line == b"* %d EXISTS\r\n" % (n + 1), "IDLE got %r" % line)
        m.send(b"DONE\r\n")
        while True:
            line = m.readline()
            if line.startswith(tag):
                break
        check(b" OK" in line, "IDLE end: %r" % line)
    finally:
        close(m)


def test_refusals():
    text = login_refused("alice", "wrong")
    check("AUTHENTICATIONFAILED" in text, "wrong password: %r" % text)
    text = login_refused("erin", pw("erin"))       # no directory record
    check("UNAVAILABLE" in text and "No mail server known" in text,
          "no record: %r" % text)
    place("frank", "gamma")                         # not a known backend
    time.sleep(1.2)                                 # past the cache TTL
    text = login_refused("frank", pw("frank"))
    check("UNAVAILABLE" in text, "unknown backend: %r" % text)
    check("unknown backend user=<frank> backend=<gamma>" in FRONT.log(),
          "no log line for the unknown backend")
    # at a backend: bob is not in proxyservers
    import base64
    m = connect(B["alpha"])
    try:
        blob = base64.b64encode(b"alice\0bob\0" + pw("bob").encode())
        tag = m._new_tag()
        m.send(tag + b" AUTHENTICATE PLAIN " + blob + b"\r\n")
        line = m.readline()
        check(line.startswith(tag + b" NO"), "bob as alice: %r" % line)
    finally:
        close(m)
    # the frontend still serves
    close(login("alice"))


def backend_imapd(b):
    """PIDs of the backend's imapd workers."""
    out = []
    for pid in b.children():
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                if b"imapd" in f.read():
                    out.append(pid)
        except OSError:
            pass
    return out


def test_backend_dies():
    B["alpha"].ignore_sigkill = True            # the kill below is ours
    m = login("alice")
    try:
        typ, data = m.select("INBOX")
        check(typ == "OK", "SELECT: %r" % data)
        for pid in backend_imapd(B["alpha"]):
            os.kill(pid, signal.SIGKILL)
        m.sock.settimeout(30)
        line = m.readline()
        check(line == b"* BYE Mail server connection lost\r\n",
              "after the backend died: %r" % line)
        check(m.readline() == b"", "the connection stays open after BYE")
    finally:
        try:
            m.shutdown()
        except Exception:  # noqa: BLE001
            pass
    check("backend connection lost backend=<alpha>" in FRONT.log(),
          "no log line for the lost backend")
    problems = B["alpha"].stop()
    check(not problems, "alpha stop: %r" % problems)
    try:
        text = login_refused("alice", pw("alice"))
        check("UNAVAILABLE" in text and "not reachable" in text,
              "alpha down: %r" % text)
        close(login("carol"))                       # beta is fine
    finally:
        B["alpha"].start()
    close(login("alice"))


def test_tls_verified():
    d = tempfile.mkdtemp(prefix="othercert.", dir=WORK)
    os.chmod(d, 0o755)
    other_cert, _ = make_cert(d)
    f = new_front("front-untrusting", other_cert)
    try:
        text = login_refused("alice", pw("alice"), inst=f)
        check("UNAVAILABLE" in text, "untrusted backend: %r" % text)
        check("not verified" in f.log(), "no verification failure logged: "
              "%s" % f.log()[-600:])
    finally:
        problems = f.stop()
        check(not problems, "front-untrusting stop: %r" % problems)
        f.cleanup()


def test_etcd_down():
    for m in CLUSTER.members:
        CLUSTER.kill(m)
    time.sleep(1.5)        # past directory_cache_ttl
    try:
        text = login_refused("carol", pw("carol"))
        check("UNAVAILABLE" in text and "directory" in text,
              "etcd down: %r" % text)
    finally:
        CLUSTER.start()
        check(CLUSTER.leader(90), "the cluster elected no leader again")

    def works():
        try:
            close(login("carol"))
            return True
        except Exception:  # noqa: BLE001
            return False
    check(wait_until(works, 60, step=1), "no login after etcd came back")


# ---- setup -----------------------------------------------------------------

def main():
    global TIER, CLUSTER, WORK, FRONT
    rc = usable([IMAPD, DBTOOL])
    if rc is not None:
        return rc
    TIER = Tier("imapproxytest", "imapproxy.", mode=0o755)
    CLUSTER, WORK = TIER.cluster, TIER.work
    rc = 1
    try:
        if not TIER.start_cluster():
            return 1
        TIER.place_all(USERS)
        B["alpha"] = new_backend("alpha", ["alice", "bob"])
        B["beta"] = new_backend("beta", ["carol"])
        ca = os.path.join(WORK, "backends-ca.pem")
        with open(ca, "wb") as out:
            for b in B.values():
                with open(b.cert, "rb") as f:
                    out.write(f.read())
        os.chmod(ca, 0o644)
        FRONT = new_front("front", ca)
        tests = [test_both_backends, test_idle, test_refusals,
                 test_backend_dies, test_tls_verified, test_etcd_down]
        rc = run_tests(tests, "IMAP_PROXY_TESTS", [IMAPD, DBTOOL])
    finally:
        rc = TIER.finish(rc, [FRONT] + list(B.values()))
    return rc


if __name__ == "__main__":
    sys.exit(main())
