#!/usr/bin/env python3
"""Table of a bench/cpu_decode_ab.sh run: per level, context, tokens and
layer, each build's median time and share of the read bandwidth in every
round, and the median of the rounds.

Usage: bench/cpu_decode_summary.py OUTDIR
"""
import glob
import json
import os
import re
import statistics
import sys


def main():
    out = sys.argv[1]
    rows = {}
    loads = []
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        m = re.match(r"(old|new)_(\w+?)_c(\d+)_q(\d+)_r(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        which, level, ctx, q, rnd = m.groups()
        with open(path) as f:
            d = json.load(f)
        with open(path[: -len(".json")] + ".load") as f:
            loads.append(float(f.read().split()[0]))
        for res in d["results"]:
            key = (level, int(ctx), int(q), res["layer_kind"])
            cell = rows.setdefault(key, {"old": [], "new": []})
            cell[which].append((res["time_us"]["median"], res["read_bw_fraction"], d["read_bw_gbps"]))
    print("| level | context | tokens | layer | before: ms (% read BW) per round | after: ms (% read BW) per round | after / before (median ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for key in sorted(rows):
        level, ctx, q, kind = key
        cell = rows[key]

        def fmt(xs):
            return ", ".join("%.2f (%.0f%%)" % (t / 1000, 100 * f) for t, f, _ in xs)

        ratio = ""
        if cell["old"] and cell["new"]:
            ratio = "%.2f" % (statistics.median(t for t, _, _ in cell["new"]) /
                              statistics.median(t for t, _, _ in cell["old"]))
        print("| %s | %dK | %d | %s | %s | %s | %s |" % (level, ctx // 1024, q, kind, fmt(cell["old"]),
                                                   fmt(cell["new"]), ratio))
    bws = [x[2] for c in rows.values() for w in ("old", "new") for x in c[w]]
    if bws:
        print("\nread bandwidth measured in the runs: %.1f-%.1f GB/s (median %.1f); "
              "load average (1 min) before the runs: %.2f-%.2f" %
              (min(bws), max(bws), statistics.median(bws), min(loads), max(loads)))


if __name__ == "__main__":
    main()
