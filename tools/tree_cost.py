"""Verification cost v(N) of a target with and without the tree input, side by side.

    python tools/tree_cost.py CHAIN_BUNDLE TREE_BUNDLE [--past 128] [--rounds 5] [--cpu-time]
                              [--widths 1,2,4,8,12,16,32] [--threads 2] [--json out.json]

CHAIN_BUNDLE's target is a graph without contract.TREE_MASK (as exported before schema 12),
TREE_BUNDLE's the same target with it. Both are prefilled to `--past` rows; then, round by
round, for each width N every variant is called in turn, call by call (A B C A B C ..., 30
calls each), so a loaded machine's drift hits all alike: the old graph over a chain of N
tokens, the tree graph over the same chain (its lower-triangular mask), and the tree graph
over a tree of N nodes (each depth two siblings, the first one's subtree going on; a
chain's cost if the mask costs nothing). Reported per variant and N: the median over rounds
of each round's median call, its spread, and v(N) = that over the same variant's N = 1. The
sessions are the runtime's own (IO-bound, the arena in place); the manifests are read
without checking files (a tree bundle made by graphs/tree_input.py over a copy).

`--cpu-time` (with `--threads 1`): each call's CPU time of the calling thread instead of its
wall time (ONNX Runtime runs a one-thread graph on the caller's thread): the work of the call,
without the waits of a machine loaded by others.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from ssd_runtime.backends.ort import OrtCpuSession
from ssd_runtime.manifest import read_manifest

CALLS = 30


def bushy(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A tree of n nodes: every node on the spine has two children, the first continues."""
    parents = [-1]
    spine = 0
    while len(parents) < n:
        parents.append(spine)
        if len(parents) < n:
            parents.append(spine)
        spine = len(parents) - 2 if len(parents) >= 3 else len(parents) - 1
    parents = np.asarray(parents[:n], np.int64)
    depth = np.zeros(n, np.int64)
    mask = np.zeros((n, n), bool)
    for i in range(n):
        if i:
            depth[i] = depth[parents[i]] + 1
            mask[i] = mask[parents[i]]
        mask[i, i] = True
    return depth, mask


def session(bundle: Path, threads: int | None, width: int) -> OrtCpuSession:
    """The bundle's target as the runtime opens it, taking calls of up to `width` tokens (the
    graph takes any; the bundle's max_draft bounds only the runtime's rounds)."""
    m = read_manifest(bundle, verify=False)
    return OrtCpuSession("target", bundle / m.target.path, m.target, m.max_context,
                         max(width, m.max_draft + 2), threads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("chain", type=Path)
    p.add_argument("tree", type=Path)
    p.add_argument("--past", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--widths", default="1,2,4,8,12,16,32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpu-time", action="store_true",
                   help="time each call's CPU time on the calling thread (with --threads 1)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.cpu_time and args.threads != 1:
        p.error("--cpu-time needs --threads 1: ONNX Runtime's pool threads are not the caller's")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    widths = [int(w) for w in args.widths.split(",")]
    old, new = (session(b, args.threads, max(widths)) for b in (args.chain, args.tree))
    if old.takes_trees or not new.takes_trees:
        p.error("the first bundle's target must be without the tree input, the second's with")
    prompt = (np.arange(args.past) % 50).astype(np.int64)
    for s in (old, new):
        s.prefill(prompt)
    trees = {n: bushy(n) for n in widths}
    variants = {
        "chain_old": lambda n, ids: old.forward(ids, args.past),
        "chain_tree_graph": lambda n, ids: new.forward(ids, args.past),
        "tree": lambda n, ids: new.forward_tree(ids, trees[n][1], trees[n][0], args.past),
    }
    times = {(v, n): [] for v in variants for n in widths}
    for _ in range(args.rounds):
        for n in widths:
            ids = np.ones(n, np.int64)
            calls = {v: [] for v in variants}
            for run in variants.values():
                run(n, ids)                                 # warm
            for _ in range(CALLS):
                for v, run in variants.items():
                    start = clock()
                    run(n, ids)
                    calls[v].append((clock() - start) * 1e3)
            for v in variants:
                times[v, n].append(statistics.median(calls[v]))
    result = {"past": args.past, "rounds": args.rounds, "calls": CALLS, "threads": args.threads,
              "cpu_time": args.cpu_time,
              "chain_bundle": str(args.chain), "tree_bundle": str(args.tree), "variants": {}}
    for v in variants:
        base = statistics.median(times[v, widths[0]])
        rows = {}
        for n in widths:
            med = statistics.median(times[v, n])
            rows[n] = {"ms": round(med, 3), "spread_ms": [round(min(times[v, n]), 3),
                                                           round(max(times[v, n]), 3)],
                       "v": round(med / base, 3)}
        result["variants"][v] = rows
        print(f"{v:17s} " + "  ".join(f"N={n}: {r['ms']:.2f} ms v={r['v']:.2f}"
                                      for n, r in rows.items()))
    for n in widths:
        a, b = (statistics.median(times[v, n]) for v in ("chain_old", "chain_tree_graph"))
        print(f"N={n}: tree graph's chain / old graph's chain = {b / a:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
