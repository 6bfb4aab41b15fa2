#!/usr/bin/env python3
"""Table of a bench/cpu_decode_dtypes_ab.sh run: per level and plane
format pair, each build's median time of the sparse layer in every round,
the median of the rounds, and its ratio to the same build's bf16 planes.

Usage: bench/cpu_decode_dtypes_summary.py OUTDIR
"""
import glob
import json
import os
import re
import statistics
import sys


def main():
    out = sys.argv[1]
    cells = {}
    loads = []
    bws = []
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        m = re.match(r"(old|new)\.(\w+)\.(\w+)\.(\w+)\.r(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        which, level, kv, ix, _ = m.groups()
        with open(path) as f:
            d = json.load(f)
        with open(path[: -len(".json")] + ".load") as f:
            loads.append(float(f.read().split()[0]))
        bws.append(d["read_bw_gbps"])
        for res in d["results"]:
            if res["layer_kind"] == "sparse":
                cells.setdefault((level, kv, ix, which), []).append(res["time_us"]["median"])
    med = {k: statistics.median(v) for k, v in cells.items()}
    print("| level | K/V | index keys | before: ms per round | after: ms per round "
          "| before / bf16 | after / bf16 | after / before |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for level, kv, ix in sorted({k[:3] for k in cells}):
        def fmt(which):
            return ", ".join("%.2f" % (t / 1000) for t in cells.get((level, kv, ix, which), []))

        def ratio(a, b):
            return "%.2f" % (med[a] / med[b]) if a in med and b in med else ""

        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            level, kv, ix, fmt("old"), fmt("new"),
            ratio((level, kv, ix, "old"), (level, "bf16", "bf16", "old")),
            ratio((level, kv, ix, "new"), (level, "bf16", "bf16", "new")),
            ratio((level, kv, ix, "new"), (level, kv, ix, "old"))))
    if bws:
        print("\nread bandwidth measured in the runs: %.1f-%.1f GB/s (median %.1f); "
              "load average (1 min) before the runs: %.2f-%.2f" %
              (min(bws), max(bws), statistics.median(bws), min(loads), max(loads)))


if __name__ == "__main__":
    main()
