#!/usr/bin/env python3
"""Summarizes a kernel timeline written by MSA_CUDA_TIMELINE=path (CUDA
backend, cu_timeline.cuh): per kernel, when its CTAs started, came back
from the launch wait, issued their first copy, had their first and last
piece of work, and ended (the event columns the file has, `*_ns`), in µs
after the earliest stamp (min / median / max over the CTAs that stamped).

Usage: bench/timeline.py TIMELINE.csv
"""
import csv
import statistics
import sys

ORDER = ("prologue", "indexer", "select", "attention", "merge")


def main(path):
    rows = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        events = [c for c in reader.fieldnames or () if c.endswith("_ns")]
        for r in reader:
            rows.setdefault(r["kernel"], []).append(r)
    print("%-10s %5s" % ("kernel", "CTAs") + "".join("  %-20s" % (e[:-3] + " min/med/max") for e in events))
    for k in ORDER:
        if k not in rows:
            continue
        cells = []
        for e in events:
            v = [int(r[e]) / 1000.0 for r in rows[k] if r[e]]
            cells.append("%6.1f %6.1f %6.1f" % (min(v), statistics.median(v), max(v)) if v else "-")
        print("%-10s %5d" % (k, len(rows[k])) + "".join("  %-20s" % c for c in cells))
    print_select_cycles(rows.get("select", []))
    return 0


def print_select_cycles(sel):
    """A build with MSA_TL_SEL_CYCLES: aux1 = waited + the cycles of the
    CTA's first row, aux2 = entry + the cycles from entry to exit."""
    ghz, cyc, ns = [], [], []
    for r in sel:
        e, x, a2 = r.get("entry_ns"), r.get("exit_ns"), r.get("aux2_ns")
        if e and x and a2 and int(x) > int(e):
            ghz.append((int(a2) - int(e)) / (int(x) - int(e)))
        w, a1, f = r.get("waited_ns"), r.get("aux1_ns"), r.get("first_ns")
        if w and a1 and f:
            cyc.append(int(a1) - int(w))
            ns.append(int(f) - int(w))
    if ghz and cyc:
        print("select: SM clock %.2f GHz (median over CTAs, entry to exit); first row, wait to written: "
              "%d cycles, %.2f µs (medians of %d CTAs)"
              % (statistics.median(ghz), statistics.median(cyc), statistics.median(ns) / 1000.0, len(cyc)))
    # aux4 .. aux9: the list path's entry, keys, thresholds, list, ranks, ids.
    names = ("entry", "keys", "thresholds", "list", "ranks", "ids")
    steps = []
    for i in range(len(names)):
        v = [int(r["aux%d_ns" % (4 + i)]) - int(r["waited_ns"]) for r in sel
             if r.get("aux%d_ns" % (4 + i)) and r.get("waited_ns")]
        if v:
            steps.append("%s %d" % (names[i], statistics.median(v)))
    if steps:
        print("select: list path, cycles after the wait (medians): " + ", ".join(steps))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
