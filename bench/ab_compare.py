#!/usr/bin/env python3
"""Compares two builds' decode timings written by bench/ab_decode.sh.

Usage: ab_compare.py OUTDIR QLEN
For every case: the median over rounds of each build's per-round median (µs),
and new / old.  Exits 1 when a case is more than 1% slower in the new build.
"""
import glob
import json
import statistics
import sys


def medians(out, which, q):
    per_case = {}
    for path in sorted(glob.glob(f"{out}/ab_{which}_q{q}_r*.json")):
        for res in json.load(open(path))["results"]:
            per_case.setdefault(res["id"], []).append(res["time_us"]["median"])
    return {k: statistics.median(v) for k, v in per_case.items()}


def main():
    out, q = sys.argv[1], sys.argv[2]
    old, new = medians(out, "old", q), medians(out, "new", q)
    worst = 0.0
    print(f"q_len {q}: case, old µs, new µs, new/old")
    for case in old:
        if case not in new:
            print(f"{case:32s} {old[case]:9.1f}        -   missing in new")
            worst = float("inf")
            continue
        ratio = new[case] / old[case]
        worst = max(worst, ratio)
        print(f"{case:32s} {old[case]:9.1f} {new[case]:9.1f} {ratio:7.3f}")
    print(f"q_len {q}: worst new/old {worst:.3f} over {len(old)} cases")
    return 1 if worst > 1.01 else 0


if __name__ == "__main__":
    sys.exit(main())
