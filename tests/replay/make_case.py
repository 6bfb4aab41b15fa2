#!/usr/bin/env python3
"""Writes small `msa replay` directories (docs/REPLAY.md) with their expected
outputs, computed by the double-precision reference in replay_ref.py.

usage: make_case.py OUTDIR

Good cases (expected.json beside the inputs):
  sparse_max     sparse, max score, 2 requests sharing prefix pages, padding rows
  sparse_lse_iv  sparse, lse score, index value, Hi = 2*Hkv (union ids), init block,
                 explicit scales, page size 4 (not the block size)
  dense          dense layer, entries already cached (write_cache false)
Bad cases (a file expect_error names the status out_status.json must carry):
  bad_page, bad_page_count, bad_shape, bad_npy, bad_qlen, bad_tokens,
  bad_config, bad_json
Contexts reach 40 tokens with blocks of 4 and K of 2 or 3, so the selection
really discards blocks; inputs are redrawn until no selection is a near-tie.
"""

import json
import math
import os
import random
import sys

import replay_ref as ref

CASES = {
    'sparse_max': dict(
        layer=dict(type='sparse', Hq=4, Hkv=2, D=8, Hi=2, Di=8, block=4, topk=2,
                   init_blocks=0, local_blocks=1, score='max', index_value=False,
                   scale=None, index_scale=None),
        page_size=8, num_pages=12, requests=[(3, 37), (2, 29)], share=2, padding=2,
        write_cache=True, seed=11),
    'sparse_lse_iv': dict(
        layer=dict(type='sparse', Hq=4, Hkv=2, D=8, Hi=4, Di=8, block=4, topk=3,
                   init_blocks=1, local_blocks=1, score='lse', index_value=True,
                   scale=0.3, index_scale=0.25),
        page_size=4, num_pages=24, requests=[(4, 40), (1, 33)], share=3, padding=1,
        write_cache=True, seed=22),
    'dense': dict(
        layer=dict(type='dense', Hq=4, Hkv=2, D=8, scale=None),
        page_size=8, num_pages=10, requests=[(2, 21), (3, 30)], share=1, padding=1,
        write_cache=False, seed=33),
}


def rand_list(rng, n):
    return [ref.f32(rng.uniform(-1.0, 1.0)) for _ in range(n)]


def build(spec, seed):
    """Inputs, meta and expected outputs of one case for one seed."""
    rng = random.Random(seed)
    L = dict(spec['layer'])
    sparse = L['type'] == 'sparse'
    for key, val in (('Hi', L['Hkv']), ('Di', L['D']), ('block', 4), ('topk', 2),
                     ('init_blocks', 0), ('local_blocks', 1), ('score', 'max'),
                     ('index_value', False), ('index_scale', None)):
        L.setdefault(key, val)
    Hq, Hkv, D, Hi, Di = L['Hq'], L['Hkv'], L['D'], L['Hi'], L['Di']
    P, NP = spec['page_size'], spec['num_pages']
    reqs = spec['requests']
    tokens = sum(q for q, _ in reqs) + spec['padding']

    # Pages: request 1 shares the first `share` pages of request 0.
    perm = list(range(NP))
    rng.shuffle(perm)
    npages0 = -(-reqs[0][1] // P)
    tables = [perm[:npages0]]
    nxt = npages0
    for q, kv in reqs[1:]:
        need = -(-kv // P)
        own = need - spec['share']
        tables.append(tables[0][:spec['share']] + perm[nxt:nxt + own])
        nxt += own
    assert nxt <= NP
    # The step must not write into a page another request reads.
    assert all(kv - q >= spec['share'] * P for q, kv in reqs)

    arrays = {
        'k_cache': ([NP, Hkv, P, D], rand_list(rng, NP * Hkv * P * D)),
        'v_cache': ([NP, Hkv, P, D], rand_list(rng, NP * Hkv * P * D)),
        'q': ([tokens, Hq, D], rand_list(rng, tokens * Hq * D)),
    }
    if spec['write_cache']:
        arrays['k'] = ([tokens, Hkv, D], rand_list(rng, tokens * Hkv * D))
        arrays['v'] = ([tokens, Hkv, D], rand_list(rng, tokens * Hkv * D))
    if sparse:
        arrays['idx_k_cache'] = ([NP, P, Di], rand_list(rng, NP * P * Di))
        arrays['idx_q'] = ([tokens, Hi, Di], rand_list(rng, tokens * Hi * Di))
        if spec['write_cache']:
            arrays['idx_k'] = ([tokens, Di], rand_list(rng, tokens * Di))
        if L['index_value']:
            arrays['idx_v_cache'] = ([NP, P, Di], rand_list(rng, NP * P * Di))
            if spec['write_cache']:
                arrays['idx_v'] = ([tokens, Di], rand_list(rng, tokens * Di))

    # The cache after the step's write, as one mutable copy per plane.
    kc, vc = list(arrays['k_cache'][1]), list(arrays['v_cache'][1])
    ikc = list(arrays['idx_k_cache'][1]) if sparse else None
    ivc = list(arrays['idx_v_cache'][1]) if sparse and L['index_value'] else None
    row = 0
    if spec['write_cache']:
        for (q, kv), t in zip(reqs, tables):
            for i in range(q):
                p = kv - q + i
                page, slot = t[p // P], p % P
                for g in range(Hkv):
                    dst = ((page * Hkv + g) * P + slot) * D
                    src = ((row + i) * Hkv + g) * D
                    kc[dst:dst + D] = arrays['k'][1][src:src + D]
                    vc[dst:dst + D] = arrays['v'][1][src:src + D]
                if sparse:
                    dst = (page * P + slot) * Di
                    ikc[dst:dst + Di] = arrays['idx_k'][1][(row + i) * Di:(row + i + 1) * Di]
                    if ivc is not None:
                        ivc[dst:dst + Di] = arrays['idx_v'][1][(row + i) * Di:(row + i + 1) * Di]
            row += q

    # Logical per-request views for the reference.
    req_rows = []
    row = 0
    for (q, kv), t in zip(reqs, tables):
        def kvrow(plane, j, g):
            base = ((t[j // P] * Hkv + g) * P + j % P) * D
            return plane[base:base + D]

        def irow(plane, j):
            base = (t[j // P] * P + j % P) * Di
            return plane[base:base + Di]
        R = dict(q_len=q, kv_len=kv,
                 k=[[kvrow(kc, j, g) for g in range(Hkv)] for j in range(kv)],
                 v=[[kvrow(vc, j, g) for g in range(Hkv)] for j in range(kv)],
                 q=[[arrays['q'][1][((row + i) * Hq + h) * D:((row + i) * Hq + h + 1) * D]
                     for h in range(Hq)] for i in range(q)])
        if sparse:
            R['idx_k'] = [irow(ikc, j) for j in range(kv)]
            R['idx_q'] = [[arrays['idx_q'][1][((row + i) * Hi + h) * Di:((row + i) * Hi + h + 1) * Di]
                           for h in range(Hi)] for i in range(q)]
            if ivc is not None:
                R['idx_v'] = [irow(ivc, j) for j in range(kv)]
        req_rows.append(R)
        row += q

    RL = dict(L, sparse=sparse,
              scale=L['scale'] if L['scale'] is not None else D ** -0.5,
              index_scale=L['index_scale'] if L['index_scale'] is not None else Di ** -0.5)
    expected = ref.reference(RL, req_rows, tokens)

    meta = {
        'layer': spec['layer'],
        'cache': {'page_size': P, 'num_pages': NP, 'dtype': 'fp32', 'index_dtype': 'fp32',
                  'k_scale': 1.0, 'v_scale': 1.0, 'index_k_scale': 1.0, 'index_v_scale': 1.0},
        'act_dtype': 'fp32',
        'tokens': tokens,
        'requests': [{'q_len': q, 'kv_len': kv, 'pages': t} for (q, kv), t in zip(reqs, tables)],
        'write_cache': spec['write_cache'],
    }
    return meta, arrays, expected


def write_case(outdir, name, meta, arrays, expected=None, expect_error=None):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, 'meta.json'), 'w') as f:
        json.dump(meta, f, indent=1)
    for key, (shape, values) in arrays.items():
        ref.write_npy(os.path.join(d, key + '.npy'), shape, values)
    if expected is not None:
        exp = {'o': [x for r in expected['o'] for x in r], 'lse': expected['lse'],
               'topk': expected['topk'], 'width': expected['width'],
               'idx_o': [x for r in expected['idx_o'] for x in r],
               'sparse': meta['layer']['type'] == 'sparse',
               'index_value': bool(meta['layer'].get('index_value')),
               'shape': [meta['tokens'], meta['layer']['Hq'], meta['layer']['D']],
               'Hkv': meta['layer']['Hkv'], 'Hi': meta['layer'].get('Hi', 0),
               'Di': meta['layer'].get('Di', 0),
               'rows': sum(r['q_len'] for r in meta['requests'])}
        with open(os.path.join(d, 'expected.json'), 'w') as f:
            json.dump(exp, f)
    if expect_error is not None:
        with open(os.path.join(d, 'expect_error'), 'w') as f:
            f.write(expect_error + '\n')
    return d


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    built = {}
    for name, spec in CASES.items():
        for attempt in range(50):
            meta, arrays, expected = build(spec, spec['seed'] + 1000 * attempt)
            if expected['min_gap'] > 1e-3:  # no near-tie at any selection boundary
                break
        else:
            sys.exit('%s: could not draw inputs without near-ties' % name)
        write_case(outdir, name, meta, arrays, expected)
        built[name] = (meta, arrays)

    meta, arrays = built['sparse_max']

    def variant(name, status, meta_fn=None, arrays_fn=None):
        m = json.loads(json.dumps(meta))
        a = dict(arrays)
        if meta_fn:
            meta_fn(m)
        if arrays_fn:
            arrays_fn(a)
        return write_case(outdir, name, m, a, expect_error=status)

    def page_out_of_range(m):
        m['requests'][0]['pages'][-1] = m['cache']['num_pages']
    variant('bad_page', 'MSA_ERR_OUT_OF_RANGE', page_out_of_range)
    variant('bad_page_count', 'MSA_ERR_INVALID_ARGUMENT',
            lambda m: m['requests'][1]['pages'].pop())
    variant('bad_qlen', 'MSA_ERR_INVALID_ARGUMENT',
            lambda m: m['requests'][1].update(q_len=m['requests'][1]['kv_len'] + 1))
    variant('bad_tokens', 'MSA_ERR_INVALID_ARGUMENT',
            lambda m: m.update(tokens=sum(r['q_len'] for r in m['requests']) - 1))

    def short_q(a):
        shape, vals = a['q']
        a['q'] = ([shape[0], shape[1], shape[2] - 1], vals[:shape[0] * shape[1] * (shape[2] - 1)])
    variant('bad_shape', 'MSA_ERR_INVALID_ARGUMENT', arrays_fn=short_q)
    d = variant('bad_npy', 'MSA_ERR_IO')
    path = os.path.join(d, 'q.npy')
    with open(path, 'rb') as f:
        data = f.read()
    with open(path, 'wb') as f:
        f.write(data[:-5])  # truncated data

    # Hq not a multiple of Hkv: the library refuses the model; arrays agree with meta.
    def hq3_meta(m):
        m['layer']['Hq'] = 3

    def hq3_arrays(a):
        shape, vals = a['q']
        a['q'] = ([shape[0], 3, shape[2]], vals[:shape[0] * 3 * shape[2]])
    variant('bad_config', 'MSA_ERR_INVALID_CONFIG', hq3_meta, hq3_arrays)
    d = variant('bad_json', 'MSA_ERR_IO')
    with open(os.path.join(d, 'meta.json'), 'w') as f:
        f.write('{"layer": {"type": "sparse",')


if __name__ == '__main__':
    main()
