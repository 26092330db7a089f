#!/usr/bin/env python3
"""durable.py - the durable-commit figures of a `bench/run.sh -x nosync`
results directory: per connection count the median msgs/s of every
spool_sync variant, the rounds themselves, and the checks of
doc/bench/durable.md (journal vs off, journal vs the best durable mode
of the baseline build, the fastest durable mode, c=100 vs the best cell).

    bench/durable.py RESULTSDIR        (e.g. doc/bench/durable/results)
"""
import json
import os
import statistics as st
import sys

SHORT = {"spool_sync=group": "group", "spool_sync=group (default)": "group",
         "spool_sync=file": "file", "spool_sync=journal": "journal",
         "spool_sync=journal, baseline build": "journal (before)",
         "spool_sync=off": "off",
         "spool_sync=off, partition on tmpfs": "off, tmpfs"}
ORDER = ["group", "file", "journal (before)", "journal", "off", "off, tmpfs"]


def load(res):
    cells = {}
    for line in open(os.path.join(res, "index.tsv")):
        if line.startswith("#"):
            continue
        exp, _grp, var, conc, rnd, rc, js = line.rstrip("\n").split("\t")
        if exp != "nosync" or rc != "0":
            continue
        try:
            j = json.load(open(os.path.join(res, js)))
        except (OSError, ValueError):
            continue
        cells.setdefault(int(conc), {}).setdefault(
            SHORT.get(var, var), {})[int(rnd)] = j["msgs_per_s"]
    return cells


def fmt(x):
    return "-" if x is None else "{:,.0f}".format(x)


def main():
    cells = load(sys.argv[1])
    med = {c: {k: st.median(r.values()) for k, r in v.items()}
           for c, v in cells.items()}
    print("| connections | " + " | ".join(ORDER) + " |")
    print("|---|" + "---:|" * len(ORDER))
    for c in sorted(med):
        print("| %d | " % c + " | ".join(fmt(med[c].get(k)) for k in ORDER)
              + " |")
    print()
    for c in sorted(med):
        m, raw = med[c], cells[c]
        print("c=%d rounds: %s" % (c, "; ".join(
            "%s %s" % (k, ", ".join(fmt(raw[k][i]) for i in sorted(raw[k])))
            for k in ORDER if k in raw)))
        dur = {k: m[k] for k in ("group", "file", "journal") if k in m}
        old = {k: m[k] for k in ("group", "file", "journal (before)")
               if k in m}
        out = ["fastest durable: %s" % max(dur, key=dur.get)]
        if "journal" in m and "off" in m:
            out.append("journal/off %.2f" % (m["journal"] / m["off"]))
        if "journal" in m and old:
            ob = max(old, key=old.get)
            out.append("journal / best durable before (%s) %.2f"
                       % (ob, m["journal"] / old[ob]))
        if "journal" in raw and "journal (before)" in raw:
            r = [raw["journal"][i] / raw["journal (before)"][i]
                 for i in raw["journal"] if i in raw["journal (before)"]]
            out.append("journal / journal (before), median of the rounds' "
                       "ratios %.2f" % st.median(r))
        print("  " + "; ".join(out))
    for k in ("group", "file", "journal"):
        if 100 in med and k in med[100]:
            best = max(med[c][k] for c in med if k in med[c])
            print("%s: c=100 / its best cell %.2f" % (k, med[100][k] / best))


if __name__ == "__main__":
    main()
