#!/usr/bin/env python3
"""Estimated load of the Hopper attention's busiest CTA, per decode case.

For each case of bench/workloads/decode.json (batch 64-128, where every CTA
walks several units) a unit is one (request, KV head) of 8 tokens (or 1);
its cost is the expected size of its tokens' union in 64-key tiles if each
token chose its K - 1 scored blocks at random (M3: K = 16, one forced local
block), plus 2 tiles of fixed cost.  Prints the most loaded CTA's cost over
the mean for units dealt in plan order (unit u to CTA u mod SMs, as the
plan once did) and dealt largest first to the least loaded CTA (as the plan
does now, by its own, simpler estimate: min(blocks, tokens x K)).

Usage: bench/unit_balance.py [--sms 132] [--q-len 8]
"""
import argparse
import heapq
import json
import os

K = 16


def union_blocks(n_blocks, q_len):
    if n_blocks <= K:
        return n_blocks
    cand = n_blocks - 1
    return 1 + cand * (1 - (1 - (K - 1) / cand) ** q_len)


def dealt(costs, estimates, sms):
    heap = [(0, c) for c in range(sms)]
    load = [0.0] * sms
    for u in sorted(range(len(costs)), key=lambda u: (-estimates[u], u)):
        est, c = heapq.heappop(heap)
        load[c] += costs[u]
        heapq.heappush(heap, (est + estimates[u], c))
    return max(load)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--q-len", type=int, default=8)
    args = ap.parse_args()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads", "decode.json")
    cases = json.load(open(path))["cases"]
    print("case                   plan order  dealt by cost  (most loaded CTA / mean)")
    for case in cases:
        if case["batch"] < 64:
            continue
        costs, estimates = [], []
        for kl in case["kv_lens"]:
            n = (kl + 127) // 128
            for _head in range(4):
                costs.append(2 * union_blocks(n, args.q_len) + 2)
                estimates.append(2 * min(n, args.q_len * K) + 2)
        mean = sum(costs) / args.sms
        in_order = [0.0] * args.sms
        for u, c in enumerate(costs):
            in_order[u % args.sms] += c
        print("%-22s %10.3f %14.3f" % (case["id"], max(in_order) / mean,
                                       dealt(costs, estimates, args.sms) / mean))


if __name__ == "__main__":
    main()
