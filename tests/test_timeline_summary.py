#!/usr/bin/env python3
"""Checks bench/timeline.py, the summarizer of the CUDA kernel timeline
(MSA_CUDA_TIMELINE): per kernel the CTA count and min / median / max of
each event in µs, empty cells skipped, kernels in launch order, the event
columns those of the file (four in the first format, six now).  Prints
"N passed, N failed" and exits non-zero on a failure."""
import contextlib
import io
import os
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
import timeline  # noqa: E402

CSV = """kernel,cta,entry_ns,waited_ns,first_ns,exit_ns
select,0,9200,9500,12000,12100
prologue,0,0,,,2100
indexer,0,300,2500,3400,9000
indexer,1,350,2600,3300,9100
indexer,2,400,2700,,9300
"""

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def summarize(text):
    """bench/timeline.py on a CSV with this text: exit status, output lines."""
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = timeline.main(path)
        return rc, out.getvalue().splitlines()
    finally:
        os.unlink(path)


rc, lines = summarize(CSV)
check(rc == 0, "exit status %r" % rc)
rows = {ln.split()[0]: ln.split()[1:] for ln in lines[1:]}
check([ln.split()[0] for ln in lines[1:]] == ["prologue", "indexer", "select"],
      "kernels in launch order: %r" % [ln.split()[0] for ln in lines[1:]])
ix = rows.get("indexer", [])
# CTAs, entry min/med/max, waited min/med/max, first min/med/max, exit min/med/max
check(ix[:1] == ["3"], "indexer CTA count %r" % ix[:1])
check(ix[1:4] == ["0.3", "0.3", "0.4"], "indexer entry %r" % ix[1:4])
check(ix[4:7] == ["2.5", "2.6", "2.7"], "indexer waited %r" % ix[4:7])
check(ix[7:10] == ["3.3", "3.3", "3.4"], "indexer first (empty cell skipped) %r" % ix[7:10])
check(ix[10:13] == ["9.0", "9.1", "9.3"], "indexer exit %r" % ix[10:13])
pr = rows.get("prologue", [])
check(pr[1:5] == ["0.0", "0.0", "0.0", "-"], "prologue entry and empty waited %r" % pr[1:5])

# The six events the library writes now (common/timeline.cuh): columns taken
# from the header, in its order.
CSV6 = """kernel,cta,entry_ns,waited_ns,issued_ns,first_ns,last_ns,exit_ns
attention,0,1000,2000,2500,4000,9000,9500
attention,1,1100,2100,,,,2200
"""
rc, lines = summarize(CSV6)
check(rc == 0, "exit status %r (six events)" % rc)
head = lines[0].split()
check([h for h in head if h != "min/med/max"][2:] == ["entry", "waited", "issued", "first", "last", "exit"],
      "event columns %r" % head)
at = lines[1].split() if len(lines) > 1 else []
check(at[:2] == ["attention", "2"], "attention row %r" % at[:2])
check(at[8:11] == ["2.5", "2.5", "2.5"], "issued (one CTA stamped) %r" % at[8:11])
check(at[14:17] == ["9.0", "9.0", "9.0"], "last %r" % at[14:17])
check(at[17:20] == ["2.2", "5.8", "9.5"], "exit %r" % at[17:20])

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
