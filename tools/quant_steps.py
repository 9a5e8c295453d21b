"""Target step time and size of bundles side by side: float against quantized targets.

    python tools/quant_steps.py BUNDLE [BUNDLE ...] [--past 128] [--rounds 5] [--interleave]
                                [--json out.json]

Each bundle's target is prefilled to `--past` rows; then, round by round (the bundles take
turns, so the machine's drift hits all alike), each is called 30 times at 1 new token (a
decode step) and at 9 (a verification of k=8). Reported: the median over rounds of each
round's median, the spread over rounds, the ratio to the first bundle, and the target's size
on disk. The sessions are the runtime's own (IO-bound, the arena in place).

`--interleave`: the bundles take turns call by call instead (A B C A B C ..., 30 calls each a
round), for a loaded machine, where a busy second can fall on one bundle's 30 calls and steps
bunch at the scheduler's ticks; the mean over all calls is reported beside the median.

`--cpu-time` (with `--threads 1`): each call's CPU time of the calling thread instead of its
wall time. On one thread ONNX Runtime runs the graph on the caller's thread, so this is the
work of the step itself, without the time spent waiting for a core on a loaded machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from ssd_runtime import Generator

WIDTHS = (1, 9)
CALLS = 30


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--past", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--interleave", action="store_true",
                   help="take turns call by call rather than 30 calls at a time")
    p.add_argument("--cpu-time", action="store_true",
                   help="time each call's CPU time on the calling thread (with --threads 1)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.cpu_time and args.threads != 1:
        p.error("--cpu-time needs --threads 1: ONNX Runtime's pool threads are not the caller's")
    clock = time.thread_time if args.cpu_time else time.perf_counter
    gens = {b: Generator.load(b, backend="cpu", threads=args.threads) for b in args.bundles}
    for gen in gens.values():
        gen.target.prefill((np.arange(args.past) % 50).astype(np.int64))
    times = {(b, w): [] for b in gens for w in WIDTHS}
    calls = {(b, w): [] for b in gens for w in WIDTHS}         # every call's time, ms
    for _ in range(args.rounds):
        for w in WIDTHS:
            ids = np.ones(w, np.int64)
            # blocks of 30 calls a bundle, each warmed first (after the other bundles); or
            # every bundle warmed, then one call each in turn, 30 times
            blocks = [[b] * CALLS for b in gens] if not args.interleave else \
                [list(gens) * CALLS]
            for block in blocks:
                for b in dict.fromkeys(block):
                    gens[b].target.forward(ids, args.past)
                for b in block:
                    start = clock()
                    gens[b].target.forward(ids, args.past)
                    calls[b, w].append((clock() - start) * 1e3)
            for b in gens:
                times[b, w].append(statistics.median(calls[b, w][-CALLS:]))
    first = args.bundles[0]
    rows = []
    for b, gen in gens.items():
        entry = gen.manifest.target
        files = [b / entry.path, b / (entry.path + ".data")]
        size = sum(f.stat().st_size for f in files if f.exists())
        row = {"bundle": str(b), "quant": entry.quant, "graph": entry.graph,
               "scheme": entry.quant_scheme, "quality": entry.quant_quality,
               "target_mb": round(size / 2**20, 1)}
        for w in WIDTHS:
            med = statistics.median(times[b, w])
            base = statistics.median(times[first, w])
            row[f"step{w}_ms"] = round(med, 3)
            row[f"step{w}_spread_ms"] = [round(min(times[b, w]), 3), round(max(times[b, w]), 3)]
            row[f"step{w}_speedup"] = round(base / med, 2)
            row[f"step{w}_mean_ms"] = round(statistics.fmean(calls[b, w]), 3)
        rows.append(row)
        print(f"{b}: target {entry.quant} ({entry.graph}), {row['target_mb']} MB; " + "; ".join(
            f"{w} tok {row[f'step{w}_ms']} ms [{row[f'step{w}_spread_ms'][0]}-"
            f"{row[f'step{w}_spread_ms'][1]}] {row[f'step{w}_speedup']}x "
            f"(mean {row[f'step{w}_mean_ms']})" for w in WIDTHS))
    if args.json:
        args.json.write_text(json.dumps({"past": args.past, "rounds": args.rounds,
                                         "calls": CALLS, "interleave": args.interleave,
                                         "cpu_time": args.cpu_time,
                                         "bundles": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
