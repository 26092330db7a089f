#!/usr/bin/env python3
"""test_sieve_pigeonhole.py - the conformance corpus run through both our
interpreter (tools/sievec --run) and Pigeonhole's (`sieve-test`, Debian
dovecot-sieve), both outputs mapped to one normal form:

  store MAILBOX [flags]      keep (INBOX) and fileinto; flags lower-cased
  redirect ADDRESS
  reject REASON / discard
  vacation SECONDS SUBJECT
  compile-error LINE / runtime-error

(header edits and duplicate marks are left out: sieve-test does not list
them).  A case is compared unless its "== pigeonhole" section says
"skip REASON" or it uses run options sieve-test has no equivalent for
(-m, -D, -E, -I, -N, -x).  A case marked "differs REASON" is a known,
explained difference: it is reported, and it fails the test only when
the two agree (the mark is then stale).  Any other disagreement fails.
sieve-test runs with a private configuration (mail under a temporary
Maildir, editheader and vacation-seconds enabled); as root it runs as
nobody.  Skipped when sieve-test is not installed.
Environment: top_builddir, TEST_TMPDIR, SIEVE_CASES.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from testlib import TMPDIR, TOP_BUILDDIR, Fail, Skip, run_tests  # noqa: E402
import sievecorpus  # noqa: E402

SIEVEC = os.path.join(TOP_BUILDDIR, "tools", "sievec")
UNMAPPED = {"-m", "-D", "-E", "-I", "-N", "-x", "-Z"}


def norm_ours(status, lines):
    if status == 1:
        m = re.match(r"^line (\d+):", lines[0] if lines else "")
        return {"compile-error %s" % (m.group(1) if m else "?")}
    out = set()
    for l in lines:
        if l.startswith("error: "):
            out.add("runtime-error")
            continue
        m = re.match(r'^(keep|keep implicit)( :flags \[(.*)\])?$', l)
        if m:
            out.add(store("INBOX", re.findall(r'"((?:[^"\\]|\\.)*)"',
                                               m.group(3) or "")))
            continue
        m = re.match(r'^fileinto (?:(?::create|:copy|:specialuse "[^"]*") )*'
                     r'(?::flags \[(.*)\] )?"((?:[^"\\]|\\.)*)"$', l)
        if m:
            out.add(store(unq(m.group(2)),
                          re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1) or "")))
            continue
        m = re.match(r'^redirect (?::copy )?"(.*)"$', l)
        if m:
            out.add("redirect " + unq(m.group(1)).lower())
            continue
        m = re.match(r'^e?reject "(.*)"$', l)
        if m:
            out.add("reject " + norm_text(unq(m.group(1))))
            continue
        if l == "discard":
            out.add("discard")
            continue
        m = re.match(r'^vacation (:days (\d+)|:seconds (\d+))'
                     r'(?: :subject "((?:[^"\\]|\\.)*)")?', l)
        if m:
            secs = int(m.group(2)) * 86400 if m.group(2) else int(m.group(3))
            out.add("vacation %d %s" % (secs, unq(m.group(4) or "")))
            continue
        # addheader, deleteheader, duplicate: not listed by sieve-test
    return out


def unq(s):
    """undo sieve_actions_format()'s quoting: \\n is a line break"""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n"
                  else m.group(1), s)


def norm_text(s):
    """sieve-test prints each control byte as '?' (CRLF as "??"): do the
    same to ours, then drop trailing '?' and blanks"""
    s = s.replace("\r\n", "\n").replace("\n", "??")
    s = re.sub(r"[\x00-\x1f\x7f]", "?", s)
    return s.rstrip("? ")


def store(mbox, flags, quoted=True):
    fl = sorted(set((unq(f) if quoted else f).lower() for f in flags))
    return "store %s%s" % (norm_text(mbox),
                            (" " + " ".join(fl)) if fl else "")


def norm_pigeonhole(rc, text):
    m = re.search(r"^\S+: line (\d+): error:", text, re.M)
    if "failed to compile" in text or (m and "validation failed" in text):
        return {"compile-error %s" % (m.group(1) if m else "?")}
    out = set()
    if "final result: failed" in text:
        out.add("runtime-error")
        if "resolved with successful implicit keep" in text:
            out.add("store INBOX")
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        l = lines[i]
        m = re.match(r"^ \* store message in folder: (.*)$", l)
        if m:
            flags = []
            j = i + 1
            while j < len(lines) and lines[j].startswith("        "):
                fm = re.match(r"^\s+\+ add IMAP flags: (.*)$", lines[j])
                if fm:
                    flags += fm.group(1).split()
                j += 1
            out.add(store(m.group(1), flags, quoted=False))
            i = j
            continue
        m = re.match(r"^ \* redirect message to: <?([^>]*)>?$", l)
        if m:
            out.add("redirect " + m.group(1).lower())
        m = re.match(r"^ \* (?:e?reject) message with reason: (.*)$", l)
        if m:
            reason = [m.group(1)]
            j = i + 1
            while j < len(lines) and lines[j] and not lines[j].startswith(" *") \
                    and not lines[j].startswith("Implicit keep"):
                reason.append(lines[j])
                j += 1
            out.add("reject " + norm_text("\n".join(reason)))
        if l.strip() == "* discard":
            out.add("discard")
        if l.startswith(" * send vacation message"):
            secs, subj = "?", ""
            j = i + 1
            while j < len(lines) and lines[j].startswith("    =>"):
                vm = re.match(r"^\s+=> (\w+)\s*: (.*)$", lines[j])
                if vm and vm.group(1) == "seconds":
                    secs = vm.group(2)
                if vm and vm.group(1) == "subject":
                    subj = vm.group(2)
                j += 1
            out.add("vacation %s %s" % (secs, subj))
        i += 1
    return out


def setup(tmp):
    uid = os.geteuid()
    gid = os.getegid()
    if uid == 0:
        uid = gid = 65534
    os.chmod(tmp, 0o777)
    md = os.path.join(tmp, "Maildir")
    os.mkdir(md)
    os.chown(md, uid, gid) if os.geteuid() == 0 else None
    conf = os.path.join(tmp, "dovecot.conf")
    with open(conf, "w") as f:
        f.write("mail_location = maildir:%s\nmail_uid = %d\nmail_gid = %d\n"
                "first_valid_uid = 1\nfirst_valid_gid = 1\n"
                "plugin {\n  sieve_extensions = +editheader "
                "+vacation-seconds\n}\n" % (md, uid, gid))
    return conf


def test_pigeonhole():
    sieve_test = shutil.which("sieve-test")
    if not sieve_test:
        raise Skip("sieve-test (dovecot-sieve) not installed")
    only = (os.environ.get("SIEVE_CASES") or "").split()
    compared = same = 0
    bad, differs, stale = [], [], []
    with tempfile.TemporaryDirectory(dir=TMPDIR) as tmp:
        conf = setup(tmp)
        for case in sievecorpus.cases():
            if only and case.name not in only:
                continue
            mark = case.pigeonhole()
            opts = case.options()
            if mark.startswith("skip") or any(o in UNMAPPED for o in opts):
                continue
            status, lines = sievecorpus.run_sievec(SIEVEC, case, tmp)
            ours = norm_ours(status, lines)
            args = [sieve_test, "-c", conf]
            k = 0
            while k < len(opts):
                if opts[k] == "-f":
                    args += ["-f", opts[k + 1]]
                elif opts[k] == "-t":
                    args += ["-a", opts[k + 1]]
                k += 2
            sp = os.path.join(tmp, case.name + ".sieve")
            mp = os.path.join(tmp, case.name + ".eml")
            for p in (sp, mp):
                os.chmod(p, 0o644)
            p = subprocess.run(args + [sp, mp], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60,
                               env=dict(os.environ, HOME=tmp))
            theirs = norm_pigeonhole(p.returncode,
                                     p.stdout.decode("utf-8", "replace"))
            compared += 1
            agree = ours == theirs
            if agree:
                same += 1
            line = "%s: ours %s, Pigeonhole %s" % (case.name, sorted(ours),
                                                  sorted(theirs))
            if mark.startswith("differs"):
                if agree:
                    stale.append(case.name)
                else:
                    differs.append(line + " -- " + mark[len("differs"):].strip())
            elif not agree:
                bad.append(line)
    for d in differs:
        print("# known difference: " + d)
    for b in bad:
        print("# DIFFERENCE: " + b)
    print("# %d cases compared, %d agree, %d known differences, %d new" % (
        compared, same, len(differs), len(bad)))
    if stale:
        raise Fail("marked 'differs' but agree: %s" % ", ".join(stale))
    if bad:
        raise Fail("%d unexplained differences" % len(bad))


if __name__ == "__main__":
    sys.exit(run_tests([test_pigeonhole], "SIEVE_TESTS", [SIEVEC]))
