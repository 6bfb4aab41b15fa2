#!/usr/bin/env python3
"""Summarizes a kernel timeline written by MSA_CUDA_TIMELINE=path (CUDA
backend, cu_timeline.cuh): per kernel, when its CTAs started, came back
from the launch wait, had their first piece of work, and ended, in µs after
the earliest stamp (min / median / max over the CTAs that stamped).

Usage: bench/timeline.py TIMELINE.csv
"""
import csv
import statistics
import sys

EVENTS = ("entry_ns", "waited_ns", "first_ns", "exit_ns")
ORDER = ("prologue", "indexer", "select", "attention", "merge")


def main(path):
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.setdefault(r["kernel"], []).append(r)
    print("%-10s %5s  %-22s %-22s %-22s %-22s" % ("kernel", "CTAs", *(e[:-3] + " min/med/max" for e in EVENTS)))
    for k in ORDER:
        if k not in rows:
            continue
        cells = []
        for e in EVENTS:
            v = [int(r[e]) / 1000.0 for r in rows[k] if r[e]]
            cells.append("%6.1f %6.1f %6.1f" % (min(v), statistics.median(v), max(v)) if v else "-")
        print("%-10s %5d  %-22s %-22s %-22s %-22s" % (k, len(rows[k]), *cells))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
