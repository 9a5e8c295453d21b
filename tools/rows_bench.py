"""V(B, T): one verification call of B rows of T tokens on an ort bundle's target, side by side
in one process (docs/design.md §11, issue 43): one row at a time (GroupQueryAttention, the
path before the rows graph), GroupQueryAttention in one call (T = 1 only: it refuses T > 1),
and the rows graph in one call. Rows sit at different past lengths (past .. past + 15·B).

    .venv/bin/python tools/rows_bench.py /tmp/demo43 --threads 2 --reps 15

Prints per (B, T) the median ms of each path with its spread (min-max of the repetitions,
which interleave the paths), the speed-up of the rows graph over one row at a time (of the
medians, and of the minimums: on a shared machine the least disturbed run), and the
process's RSS after loading the target with and without the rows graph.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ssd_runtime.backends import cpu_session
from ssd_runtime.manifest import read_manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--past", type=int, default=200, help="the shortest row's past length")
    p.add_argument("--batches", default="1,2,4,8,16")
    p.add_argument("--tokens", default="1,5")
    p.add_argument("--rss-only", choices=("with", "without"), help=argparse.SUPPRESS)
    args = p.parse_args()
    args.bundle = Path(args.bundle)
    manifest = read_manifest(args.bundle, verify=False)
    batches = [int(b) for b in args.batches.split(",")]
    slots = max(batches)
    if args.rss_only:
        rss0 = _rss_mb()
        keep = cpu_session("target", args.bundle, manifest if args.rss_only == "with" else
                           _without_rows(manifest), threads=args.threads, max_batch=slots)
        print(f"{_rss_mb() - rss0:.0f} {keep.rows_graph}")
        return
    rss = {which: _rss_in_child(args, which) for which in ("without", "with")}
    old = cpu_session("target", args.bundle, _without_rows(manifest), threads=args.threads,
                      max_batch=slots)
    new = cpu_session("target", args.bundle, manifest, threads=args.threads, max_batch=slots)
    print(f"target {manifest.target.architecture}, {manifest.target.parameters / 1e6:.0f}M "
          f"parameters, quant {manifest.target.quant}, rows graph: "
          f"{manifest.target.rows or 'none'}; threads {args.threads}")
    print(f"RSS of a load of the target ({slots} slots, fresh process): {rss['without']} MB "
          f"without the rows graph, {rss['with']} MB with it")
    rng = np.random.default_rng(0)
    pasts = np.asarray([args.past + 15 * b for b in range(slots)], np.int64)
    for session in (old, new):                       # every slot's past filled once
        for b in range(slots):
            session.prefill(rng.integers(0, 100, int(pasts[b])), 0, slot=b)
    print(f"{'B':>3} {'T':>2} {'one row at a time':>22} {'GQA one call':>20} "
          f"{'rows graph':>20} {'speed-up':>9} {'(mins)':>7}")
    for T in (int(t) for t in args.tokens.split(",")):
        for B in batches:
            ids = rng.integers(0, 100, size=(B, T))
            past_lens = pasts[:B]
            # (a batch of one runs as one sequence on GQA on every path)
            paths = {"one": lambda: old._rows_one_by_one(ids, past_lens, None),
                     "rows": lambda: new.forward_rows(ids, past_lens)}
            if T == 1:       # ... and T == 1 too: the rows graph's cost, called directly
                paths["gqa"] = lambda: old.forward_rows(ids, past_lens)
                if B > 1:
                    paths["rows"] = lambda: _rows_call(new, ids, past_lens)
            times: dict[str, list[float]] = {k: [] for k in paths}
            for _ in range(args.reps):
                for name, run in paths.items():
                    t0 = time.perf_counter()
                    run()
                    times[name].append((time.perf_counter() - t0) * 1e3)
            cell = {k: f"{statistics.median(v):6.2f} ({min(v):.2f}-{max(v):.2f})"
                    for k, v in times.items()}
            ratio = statistics.median(times["one"]) / statistics.median(times["rows"])
            best = min(times["one"]) / min(times["rows"])
            print(f"{B:>3} {T:>2} {cell['one']:>22} {cell.get('gqa', '-'):>20} "
                  f"{cell['rows']:>20} {ratio:8.2f}x {best:6.2f}x")


def _rows_call(session, ids: np.ndarray, past_lens: np.ndarray):
    """The rows graph on a T == 1 batch (forward_rows keeps those on GroupQueryAttention)."""
    B, T = ids.shape
    session.ids[0, :B * T] = ids.reshape(-1)
    session.positions[0, :B * T] = (past_lens[:, None] + np.arange(T)).reshape(-1)
    session._rows.run(B, T, int(past_lens.max()) + T)


def _without_rows(manifest):
    return replace(manifest, target=replace(manifest.target, rows=""))


def _rss_in_child(args, which: str) -> str:
    """MB the process's resident set grows by loading the target, in a fresh Python."""
    out = subprocess.run([sys.executable, __file__, str(args.bundle), "--threads", str(args.threads),
                          "--batches", args.batches, "--rss-only", which],
                         capture_output=True, text=True, check=True).stdout.split()
    return out[0]


def _rss_mb() -> float:
    """The process's resident set now, MB (/proc/self/statm, in pages)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


if __name__ == "__main__":
    main()
