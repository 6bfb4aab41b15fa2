#!/usr/bin/env python3
"""Summarizes a kernel timeline (CUDA backend built with -DMSA_TIMELINE,
msa_debug_options.cuda_timeline_path; `msa` maps MSA_CUDA_TIMELINE=path to it): per kernel, when its CTAs started, came back
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
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
