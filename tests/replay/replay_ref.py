"""Shared pieces of the replay test: .npy files and a double-precision
reference of one layer step (docs/SPEC.md sections 3-6), standard library
only, written to be obviously right rather than fast."""

import math
import struct

# ---- .npy (v1.0, little-endian float32 / int32, C order) ------------------

def f32(x):
    """x rounded to the nearest float32, as a Python float."""
    return struct.unpack('<f', struct.pack('<f', x))[0]


def write_npy(path, shape, values, dtype='<f4'):
    shape_txt = '(' + ', '.join(str(s) for s in shape) + (',)' if len(shape) == 1 else ')')
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (dtype, shape_txt)
    total = 10 + len(header) + 1
    header += ' ' * ((total + 63) // 64 * 64 - total) + '\n'
    code = 'f' if dtype == '<f4' else 'i'
    with open(path, 'wb') as f:
        f.write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(header)) + header.encode('latin1'))
        f.write(struct.pack('<%d%s' % (len(values), code), *values))


def read_npy(path):
    """Returns (descr, shape, flat values)."""
    with open(path, 'rb') as f:
        data = f.read()
    if data[:6] != b'\x93NUMPY' or data[6] != 1:
        raise ValueError('%s: not a v1 .npy file' % path)
    hlen = struct.unpack('<H', data[8:10])[0]
    header = data[10:10 + hlen].decode('latin1')
    if (10 + hlen) % 64 != 0:
        raise ValueError('%s: header not 64-byte aligned' % path)
    d = eval(header, {'__builtins__': {}}, {'False': False, 'True': True})  # a literal dict
    descr, shape = d['descr'], tuple(d['shape'])
    if d['fortran_order'] or descr not in ('<f4', '<i4'):
        raise ValueError('%s: unexpected layout %r' % (path, d))
    n = 1
    for s in shape:
        n *= s
    body = data[10 + hlen:]
    if len(body) != 4 * n:
        raise ValueError('%s: %d data bytes, expected %d' % (path, len(body), 4 * n))
    vals = struct.unpack('<%d%s' % (n, 'f' if descr == '<f4' else 'i'), body)
    return descr, shape, list(vals)

# ---- the reference -----------------------------------------------------------

def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def block_scores(L, idx_q_h, idx_k, p):
    """Block scores of one index head for a token at position p."""
    B = L['block']
    scores = []
    for n in range(p // B + 1):
        s = [dot(idx_q_h, idx_k[j]) for j in range(n * B, min((n + 1) * B, p + 1))]
        if L['score'] == 'max':
            scores.append(max(s))
        else:
            c = L['index_scale']
            m = max(s)
            scores.append(c * m + math.log(sum(math.exp(c * (x - m)) for x in s)))
    return scores


def select(L, scores):
    """SPEC 4 selection for one index head: set of block ids, and the score
    gap at the selection boundary (inf when no choice was made)."""
    N = len(scores)
    T = min(L['topk'], N)
    forced = {n for n in range(N) if n < L['init_blocks'] or n >= N - L['local_blocks']}
    free = sorted((n for n in range(N) if n not in forced), key=lambda n: (-scores[n], n))
    need = T - len(forced)
    chosen = forced | set(free[:need])
    gap = math.inf
    if 0 < need < len(free):
        gap = scores[free[need - 1]] - scores[free[need]]
        gap /= max(1.0, abs(scores[free[need - 1]]))
    return chosen, gap


def attend(q, keys, vals, scale):
    logits = [scale * dot(q, k) for k in keys]
    m = max(logits)
    w = [math.exp(x - m) for x in logits]
    s = sum(w)
    out = [sum(wj * v[e] for wj, v in zip(w, vals)) / s for e in range(len(vals[0]))]
    return out, m + math.log(s)


def reference(L, req_rows, tokens):
    """req_rows: per request dict with q_len, kv_len and logical arrays
    k[j][g], v[j][g], idx_k[j], idx_v[j] (after the cache write) and the
    step rows q[i][h], idx_q[i][h].  Returns per-row outputs and the
    smallest selection gap."""
    Hq, Hkv, D, Hi, Di = L['Hq'], L['Hkv'], L['D'], L['Hi'], L['Di']
    group = Hq // Hkv
    W = L['topk'] * (Hi // Hkv if Hi > Hkv else 1)
    o = [[0.0] * D for _ in range(tokens * Hq)]
    lse = [-math.inf] * (tokens * Hq)
    topk = [-1] * (tokens * Hkv * W)
    idx_o = [[0.0] * Di for _ in range(tokens * Hi)]
    min_gap = math.inf
    row = 0
    for R in req_rows:
        for i in range(R['q_len']):
            p = R['kv_len'] - R['q_len'] + i
            t = row + i
            sel = None
            if L['sparse']:
                per_head = []
                for h in range(Hi):
                    chosen, gap = select(L, block_scores(L, R['idx_q'][i][h], R['idx_k'], p))
                    per_head.append(chosen)
                    min_gap = min(min_gap, gap)
                sel = []
                for g in range(Hkv):
                    if Hi >= Hkv:
                        m = Hi // Hkv
                        s = set().union(*per_head[g * m:(g + 1) * m])
                    else:
                        s = per_head[g // (Hkv // Hi)]
                    sel.append(s)
                    ids = sorted(s) + [-1] * (W - len(s))
                    topk[(t * Hkv + g) * W:(t * Hkv + g + 1) * W] = ids
            for hq in range(Hq):
                g = hq // group
                js = [j for j in range(p + 1) if sel is None or j // L['block'] in sel[g]]
                out, l = attend(R['q'][i][hq], [R['k'][j][g] for j in js],
                                [R['v'][j][g] for j in js], L['scale'])
                o[t * Hq + hq] = out
                lse[t * Hq + hq] = l
            if L['sparse'] and L['index_value']:
                for h in range(Hi):
                    out, _ = attend(R['idx_q'][i][h], R['idx_k'][:p + 1], R['idx_v'][:p + 1],
                                    L['index_scale'])
                    idx_o[t * Hi + h] = out
        row += R['q_len']
    return {'o': o, 'lse': lse, 'topk': topk, 'idx_o': idx_o, 'width': W, 'min_gap': min_gap}
