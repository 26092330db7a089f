#!/usr/bin/env python3
"""test_cyradm.py - Cyrus's own cyradm (Debian cyrus-admin: Perl,
Cyrus::IMAP::Admin) administers a private master's imapd.

The instance allows plaintext logins (no TLS; cyradm --notls) and has
`admins: admin`; cyradm logs in with SASL PLAIN (--auth PLAIN,
--password) and reads its commands from standard input, a few per run.
After each run the result is checked through mbtool and over IMAP:

  cm user.x, cm user.x.Sub      the user (its INBOX) and a folder exist,
                                the owner has the default rights
  lm                            both listed
  sam user.x alice lr, lam      the ACL entry, shown back by lam
  sq user.x 1000, lq, lqr       the quota root, its limit and usage as
                                cyradm prints them
  sq user.x none                the root removed
  renm user.x.Sub user.x.Sub2   renamed
  dm user.x                     the user and its whole tree deleted
  version, info                 ID answered; METADATA not advertised
                                (cyradm refuses info itself)

Skips when cyradm is not installed.  Environment: top_builddir,
TEST_TMPDIR, CYRADM_TESTS (names to run).
"""
import os
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True     # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "imapd"))
from imaphelp import (IMAPD, MASTER, MBTOOL, ImapInstance,  # noqa: E402
                      Raw, check, make_message, make_sasldb_extra)
from testlib import Skip, run_tests  # noqa: E402

ADMIN_PW, ALICE_PW = "adm1n-pw", "al1ce-pw"
CYRADM = shutil.which("cyradm")

_inst = None


def inst():
    global _inst
    if _inst is None:
        i = ImapInstance("cyradm", conf={"admins": "admin",
                                         "allowplaintext": "yes"},
                         sasl=("alice", ALICE_PW))
        try:
            make_sasldb_extra(i, "admin", ADMIN_PW)
            i.create("user.alice")
            i.write_cyrus_conf(imaps=False, lmtp=False)
            i.start()
        except BaseException:
            i.stop()
            i.cleanup()
            raise
        _inst = i
    return _inst


def cyradm(script):
    """Run cyradm as admin with `script` on stdin: its stdout."""
    if not CYRADM:
        raise Skip("cyradm (cyrus-admin) not installed")
    i = inst()
    host, port = i.addr()
    env = dict(os.environ, HOME=i.dir)
    r = subprocess.run([CYRADM, "--norc", "--notls", "--auth", "PLAIN",
                        "--user", "admin", "--password", ADMIN_PW,
                        "--server", host, "--port", str(port)],
                       input=script.encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env, timeout=120)
    out = r.stdout.decode(errors="replace")
    err = r.stderr.decode(errors="replace")
    check(r.returncode == 0 and not err.strip(),
          "cyradm exit %d\nstdout: %s\nstderr: %s" % (r.returncode, out,
                                                      err))
    return out


def names():
    _, out, _ = inst().mbtool("list")
    return {ln.split()[0] for ln in out.splitlines() if ln.strip()}


def acl_of(name):
    acl = inst().info(name).get("acl", "")
    return dict(kv.split("=", 1) for kv in acl.split() if "=" in kv)


def imap(user, pw, *cmds):
    """Log in over IMAP and run cmds; each one's response lines."""
    c = Raw(inst().addr())
    try:
        c.line()
        r = c.cmd("L", "LOGIN %s %s" % (user, pw))
        check(r[-1].startswith(b"L OK"), "LOGIN %r" % r)
        return [c.cmd("c%d" % n, cmd) for n, cmd in enumerate(cmds)]
    finally:
        c.close()


# ---- tests ----------------------------------------------------------------

def test_create_list():
    out = cyradm("cm user.x\ncm user.x.Sub\nlm\n")
    check({"user.x", "user.x.Sub"} <= names(), "mbtool list: %r" % names())
    check(acl_of("user.x").get("x") == "lrswipkxtea",
          "the new user's rights: %r" % acl_of("user.x"))
    check("user.x (\\HasChildren)" in out and
          "user.x.Sub (\\HasNoChildren)" in out and "user.alice" in out,
          "lm: %r" % out)
    # the new mailboxes are real: a message goes in
    inst().mbtool("deliver", "-M", "user.x",
                  input=make_message(msgid="cyradm@test", body="y" * 5000))


def test_acl():
    out = cyradm("sam user.x alice lr\nlam user.x\n")
    check(acl_of("user.x").get("alice") == "lr", "mbtool: %r"
          % acl_of("user.x"))
    lines = [ln.strip() for ln in out.splitlines()]
    check(any(ln.endswith("alice lr") for ln in lines) and
          any(ln.endswith("x lrswipkxtecda") for ln in lines),
          "lam: %r" % out)
    # alice can now read user.x over IMAP
    r = imap("alice", ALICE_PW, "MYRIGHTS user.x", "EXAMINE user.x")
    check(r[0][0] == b"* MYRIGHTS user.x lr" and
          r[1][-1].startswith(b"c1 OK"), "alice after sam: %r" % r)
    # "none" (cyradm's alias for no rights) removes the entry
    cyradm("sam user.x alice none\n")
    check("alice" not in acl_of("user.x"), "sam none: %r" % acl_of("user.x"))
    cyradm("dam user.x x\n")
    check("x" not in acl_of("user.x"), "dam: %r" % acl_of("user.x"))
    cyradm("sam user.x x all\n")
    check(acl_of("user.x").get("x") == "lrswipkxtea", "sam all")


def test_quota():
    out = cyradm("sq user.x 1000\nlq user.x\nlqr user.x.Sub\n")
    _, show, _ = inst().mbtool("quota", "show", "user.x")
    check("/1000 KiB" in show and "messages=1 (no limit)" in show,
          "mbtool quota show: %r" % show)
    # usage (one 5 KB message) counted when the root was set
    check(" STORAGE 5/1000 (0.5%)" in out, "lq: %r" % out)
    check("user.x STORAGE 5/1000 (0.5%)" in out, "lqr: %r" % out)
    r = imap("admin", ADMIN_PW, "GETQUOTA user.x")
    check(r[0][0] == b'* QUOTA "user.x" (STORAGE 5 1000)', "%r" % r)
    cyradm("sq user.x none\n")
    rc, show, _ = inst().mbtool("quota", "show", "user.x", check_rc=False)
    check(rc != 0, "root left after sq none: %r" % show)


def test_rename_delete():
    cyradm("renm user.x.Sub user.x.Sub2\n")
    n = names()
    check("user.x.Sub2" in n and "user.x.Sub" not in n, "renm: %r" % n)
    cyradm("sq user.x 2000\n")
    out = cyradm("dm user.x\nlm\n")
    n = names()
    check(not [m for m in n if m.startswith("user.x")], "dm: %r" % n)
    rc, show, _ = inst().mbtool("quota", "show", "user.x", check_rc=False)
    check(rc != 0, "quota root of the deleted user left: %r" % show)
    listing = out.split("> lm\n", 1)[-1]
    check("user.x" not in listing and "user.alice" in listing,
          "lm: %r" % out)
    # an error comes back as cyradm's message, and the session goes on
    p = subprocess.run([CYRADM, "--norc", "--notls", "--auth", "PLAIN",
                        "--user", "admin", "--password", ADMIN_PW,
                        "--server", inst().addr()[0], "--port",
                        str(inst().addr()[1])],
                       input=b"dm user.nobody\ncm user.y\n",
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=dict(os.environ, HOME=inst().dir), timeout=120)
    err = p.stderr.decode(errors="replace")
    check("deletemailbox" in err and "NONEXISTENT" in err,
          "dm of a missing mailbox: %r" % err)
    check("user.y" in names(), "the session went on after the error")


def test_version_info():
    """version sends ID NIL (answered); info needs METADATA, which imapd
    does not advertise: cyradm says so itself, and the session goes
    on."""
    if not CYRADM:
        raise Skip("cyradm (cyrus-admin) not installed")
    host, port = inst().addr()
    p = subprocess.run([CYRADM, "--norc", "--notls", "--auth", "PLAIN",
                        "--user", "admin", "--password", ADMIN_PW,
                        "--server", host, "--port", str(port)],
                       input=b"version\ninfo user.alice\nlm user.alice\n",
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=dict(os.environ, HOME=inst().dir), timeout=120)
    out = p.stdout.decode(errors="replace")
    err = p.stderr.decode(errors="replace")
    check("name" in out and "cyrusdeliver" in out, "version: %r" % out)
    check("does not support METADATA" in err, "info: %r / %r" % (out, err))
    check("user.alice (\\HasNoChildren)" in out.split("> lm", 1)[-1],
          "lm after the error: %r" % out)


def finish():
    global _inst
    if _inst is not None:
        _inst.__exit__(None, None, None)
        _inst = None


if __name__ == "__main__":
    rc = run_tests([test_create_list, test_acl, test_quota,
                    test_rename_delete, test_version_info], "CYRADM_TESTS",
                   (MASTER, IMAPD, MBTOOL))
    try:
        finish()
    except Exception as e:  # noqa: BLE001
        print("FAIL: cleanup: %s" % e)
        rc = 1
    sys.exit(rc)
