#!/usr/bin/env python3
"""Checks what `msa replay` left in a directory written by make_case.py.

usage: check.py DIR
  A good case: out_status.json says ok; out_o / out_lse (and out_topk,
  out_idx_o where the layer has them) match expected.json: relative error
  below 1e-5 (fp32), identical selected ids, padding rows exactly 0 / -inf / -1.
  A bad case (DIR/expect_error exists): out_status.json names that error with
  a message, and no out_*.npy (or temporary) file exists.
Exits 0 when everything holds, 1 with the reasons otherwise.
"""

import json
import math
import os
import sys

import replay_ref as ref

TOL = 1e-5
OUTPUTS = ('out_o.npy', 'out_lse.npy', 'out_topk.npy', 'out_idx_o.npy')


def rel_err(got, want):
    num = sum((g - w) ** 2 for g, w in zip(got, want))
    den = sum(w * w for w in want)
    if any(math.isnan(g) for g in got):
        return math.inf
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def check_bad(d, problems):
    want = open(os.path.join(d, 'expect_error')).read().strip()
    status = json.load(open(os.path.join(d, 'out_status.json')))
    if status.get('status') != want:
        problems.append('status %r, expected %r' % (status.get('status'), want))
    if not status.get('message'):
        problems.append('no message in out_status.json')
    for name in os.listdir(d):
        if name.startswith('out_') and name != 'out_status.json':
            problems.append('%s exists after a rejected step' % name)


def check_good(d, problems):
    status = json.load(open(os.path.join(d, 'out_status.json')))
    if status != {'status': 'ok'}:
        problems.append('out_status.json is %r' % status)
        return
    exp = json.load(open(os.path.join(d, 'expected.json')))
    T, Hq, D = exp['shape']
    rows = exp['rows']  # rows of requests; the rest are padding

    def load(name, shape):
        descr, got_shape, vals = ref.read_npy(os.path.join(d, name))
        if list(got_shape) != list(shape):
            problems.append('%s has shape %r, expected %r' % (name, got_shape, shape))
            return None
        return vals

    o = load('out_o.npy', [T, Hq, D])
    if o is not None:
        n = rows * Hq * D
        e = rel_err(o[:n], exp['o'][:n])
        if not e < TOL:
            problems.append('o: relative error %.3g' % e)
        if any(x != 0.0 for x in o[n:]):
            problems.append('o: padding rows are not 0')
    lse = load('out_lse.npy', [T, Hq])
    if lse is not None:
        n = rows * Hq
        e = rel_err(lse[:n], exp['lse'][:n])
        if not e < TOL:
            problems.append('lse: relative error %.3g' % e)
        if any(x != -math.inf for x in lse[n:]):
            problems.append('lse: padding rows are not -inf')
    names = set(os.listdir(d))
    if exp['sparse']:
        W = exp['width']
        topk = load('out_topk.npy', [T, exp['Hkv'], W])
        if topk is not None and topk != exp['topk']:
            bad = sum(1 for a, b in zip(topk, exp['topk']) if a != b)
            problems.append('topk: %d ids differ from the reference' % bad)
    elif 'out_topk.npy' in names:
        problems.append('out_topk.npy written for a dense layer')
    if exp['index_value']:
        idx_o = load('out_idx_o.npy', [T, exp['Hi'], exp['Di']])
        if idx_o is not None:
            n = rows * exp['Hi'] * exp['Di']
            e = rel_err(idx_o[:n], exp['idx_o'][:n])
            if not e < TOL:
                problems.append('idx_o: relative error %.3g' % e)
            if any(x != 0.0 for x in idx_o[n:]):
                problems.append('idx_o: padding rows are not 0')
    elif 'out_idx_o.npy' in names:
        problems.append('out_idx_o.npy written for a layer without index value')
    for name in names:
        if name.endswith('.tmp'):
            problems.append('temporary file %s left behind' % name)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    problems = []
    try:
        if os.path.exists(os.path.join(d, 'expect_error')):
            check_bad(d, problems)
        else:
            check_good(d, problems)
    except (OSError, ValueError, KeyError) as e:
        problems.append(str(e))
    if problems:
        print('%s: FAIL\n  %s' % (d, '\n  '.join(problems)))
        sys.exit(1)
    print('%s: ok' % d)


if __name__ == '__main__':
    main()
