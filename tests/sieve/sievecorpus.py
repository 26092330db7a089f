"""sievecorpus.py - the Sieve conformance corpus (tests/sieve/corpus/):
reading a case, running it through tools/sievec, and comparing.

A case is one file NAME.svtest made of sections, each opened by a line
"== SECTION" (lines before the first section are the description):

  == script      the Sieve script (bytes as written)
  == message     the message (default: corpus/default.eml); LF line ends
                 are turned into CRLF
  == options     sievec --run options, shell-split: -f sender, -t rcpt,
                 -m mailbox, -D duplicate-id, -E name=value, -N epoch,
                 -Z zone, -I (the corpus's include/ directory), -x exts
  == expect      the expected output of sievec --run, line for line:
                 the actions in sieve_actions_format()'s form; or
                 "compile-error line N" (the script must fail to compile
                 with "line N: ..."); a line "runtime-error line N" stands
                 for sievec's "error: line N: ..." line
  == pigeonhole  compare | skip REASON | differs REASON  (for
                 test_sieve_pigeonhole.py; default: compare)
"""
import os
import re
import shlex
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


class Case:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)[:-len(".svtest")]
        self.sections = {"description": ""}
        cur = "description"
        with open(path, "rb") as f:
            for raw in f.read().split(b"\n"):
                m = re.match(rb"^== ([a-z]+)\s*$", raw)
                if m:
                    cur = m.group(1).decode()
                    self.sections[cur] = b""
                    continue
                if cur == "description":
                    continue
                self.sections[cur] += raw + b"\n"
        for k in ("script", "expect"):
            if k not in self.sections:
                raise ValueError("%s: no '== %s' section" % (path, k))

    def script(self):
        return self.sections["script"]

    def message(self):
        m = self.sections.get("message")
        if m is None:
            with open(os.path.join(CORPUS, "default.eml"), "rb") as f:
                m = f.read()
        m = m.replace(b"\r\n", b"\n").rstrip(b"\n") + b"\n"
        return m.replace(b"\n", b"\r\n")

    def options(self):
        opts = shlex.split(self.sections.get("options", b"").decode())
        out = []
        for o in opts:
            out.append(os.path.join(CORPUS, "include") if o == "@include" else o)
        return out

    def expect(self):
        return [l for l in self.sections["expect"].decode().split("\n")
                if l.strip()]

    def pigeonhole(self):
        return (self.sections.get("pigeonhole") or b"compare").decode().strip()


def cases():
    names = sorted(n for n in os.listdir(CORPUS) if n.endswith(".svtest"))
    return [Case(os.path.join(CORPUS, n)) for n in names]


def run_sievec(sievec, case, tmpdir):
    """Run the case; returns (exit status, output lines)."""
    sp = os.path.join(tmpdir, case.name + ".sieve")
    mp = os.path.join(tmpdir, case.name + ".eml")
    with open(sp, "wb") as f:
        f.write(case.script())
    with open(mp, "wb") as f:
        f.write(case.message())
    p = subprocess.run([sievec, "--run"] + case.options() + [sp, mp],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    return p.returncode, [l for l in p.stdout.decode("utf-8", "replace")
                          .split("\n") if l.strip()]


def compare(case, status, lines):
    """None when the output is what the case expects, else a reason."""
    exp = case.expect()
    if len(exp) == 1 and exp[0].startswith("compile-error line "):
        n = exp[0].split()[-1]
        if status != 1 or len(lines) != 1 or \
                not lines[0].startswith("line %s: " % n):
            return "expected a compile error at line %s, got %r (exit %d)" % (
                n, lines, status)
        return None
    want = []
    for l in exp:
        m = re.match(r"^runtime-error line (\d+)$", l)
        want.append(("re", r"^error: line %s: " % m.group(1)) if m else
                    ("eq", l))
    ok = len(want) == len(lines) and all(
        (re.match(v, got) if k == "re" else v == got)
        for (k, v), got in zip(want, lines))
    if not ok:
        return "expected %r, got %r (exit %d)" % (exp, lines, status)
    rt = any(k == "re" for k, _ in want)
    if status != (3 if rt else 0):
        return "exit status %d" % status
    return None
