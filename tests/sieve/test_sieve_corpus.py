#!/usr/bin/env python3
"""test_sieve_corpus.py - the Sieve conformance corpus (tests/sieve/corpus,
format in sievecorpus.py) run through tools/sievec --run: every case's
output must be what its "== expect" section says.  Also: every case's
script fed to sievec in check mode agrees with the run (compiles iff the
case expects no compile error).  And every case that compiles, written
to its stored compiled form (sievec -o) and run from it (sievec -b),
gives the same output and exit status as the run from the text.
Environment: top_builddir, TEST_TMPDIR, SIEVE_CASES (case names to run).
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]
from testlib import TMPDIR, TOP_BUILDDIR, Fail, run_tests  # noqa: E402
import sievecorpus  # noqa: E402

SIEVEC = os.path.join(TOP_BUILDDIR, "tools", "sievec")


def test_corpus():
    only = (os.environ.get("SIEVE_CASES") or "").split()
    bad = []
    n = 0
    with tempfile.TemporaryDirectory(dir=TMPDIR) as tmp:
        for case in sievecorpus.cases():
            if only and case.name not in only:
                continue
            n += 1
            status, lines = sievecorpus.run_sievec(SIEVEC, case, tmp)
            why = sievecorpus.compare(case, status, lines)
            # check mode must agree with the run about compiling
            sp = os.path.join(tmp, case.name + ".sieve")
            chk = subprocess.run([SIEVEC, sp], stdout=subprocess.PIPE,
                                 timeout=60)
            compiled = chk.returncode == 0
            if why is None and compiled != (status != 1):
                why = "check mode exit %d, run exit %d" % (chk.returncode,
                                                           status)
            print("# %s %s" % ("ok  " if why is None else "FAIL", case.name))
            if why:
                bad.append("%s: %s" % (case.name, why))
    print("# %d cases, %d failed" % (n, len(bad)))
    if bad:
        raise Fail("; ".join(bad))
    if n == 0:
        raise Fail("no cases found")


def test_corpus_compiled_form():
    only = (os.environ.get("SIEVE_CASES") or "").split()
    bad = []
    n = 0
    with tempfile.TemporaryDirectory(dir=TMPDIR) as tmp:
        for case in sievecorpus.cases():
            if only and case.name not in only:
                continue
            status, lines = sievecorpus.run_sievec(SIEVEC, case, tmp)
            if status == 1:
                continue   # does not compile: nothing to store
            n += 1
            sp = os.path.join(tmp, case.name + ".sieve")
            mp = os.path.join(tmp, case.name + ".eml")
            bp = os.path.join(tmp, case.name + ".bc")
            w = subprocess.run([SIEVEC] + case.options() + ["-o", bp, sp],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60)
            why = None
            if w.returncode != 0 or not os.path.exists(bp):
                why = "sievec -o exit %d: %r" % (w.returncode, w.stdout)
            else:
                p = subprocess.run([SIEVEC, "--run"] + case.options() +
                                   ["-b", bp, sp, mp],
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=60)
                got = [l for l in p.stdout.decode("utf-8", "replace")
                       .split("\n") if l.strip()]
                if (p.returncode, got) != (status, lines):
                    why = "from the compiled form %r (exit %d), from the " \
                          "text %r (exit %d)" % (got, p.returncode, lines,
                                                 status)
            print("# %s %s" % ("ok  " if why is None else "FAIL", case.name))
            if why:
                bad.append("%s: %s" % (case.name, why))
    print("# %d cases run from their compiled form, %d failed" % (n, len(bad)))
    if bad:
        raise Fail("; ".join(bad))
    if n == 0:
        raise Fail("no cases found")


if __name__ == "__main__":
    sys.exit(run_tests([test_corpus, test_corpus_compiled_form],
                       "SIEVE_TESTS", [SIEVEC]))
