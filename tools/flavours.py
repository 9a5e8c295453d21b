"""Target step time of two bundles of one pair side by side: standard graph vs ort graph.

    python tools/flavours.py demo/bundle-standard demo/bundle [--threads 2] [--repeats 200]

Each bundle's target runs through the runtime's own CPU session (the IOBinding the decode
loop uses) at new_len 1 (a decode step) and k+1 (a verification) for several past lengths.
The two bundles alternate in blocks of 25 calls, the first 5 of each block untimed: call by
call, each model would evict the other's weights from the caches and find its thread pool
asleep, which the decode loop never does. Prints the median ms per call and the ratio
standard / ort.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from time import perf_counter

import numpy as np
from ssd_runtime.backends.ort import OrtCpuSession
from ssd_runtime.manifest import read_manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundles", type=Path, nargs=2, help="two bundles of the same pair")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=200, help="timed calls per bundle and shape")
    p.add_argument("--past", default="10,100,400")
    args = p.parse_args()
    sessions = []
    for root in args.bundles:
        m = read_manifest(root)
        sessions.append((f"{root} ({m.target.graph})",
                         OrtCpuSession("target", root / m.target.path, m.target, m.max_context,
                                       m.max_draft + 2, args.threads)))
    k1 = read_manifest(args.bundles[0]).max_draft + 1
    rng = np.random.default_rng(0)
    ids = rng.integers(3, sessions[0][1].entry.vocab_size, size=1024)
    print(f"target step, median ms over {args.repeats} calls, {args.threads} threads")
    print(f"{'past':>5} {'new':>4}  " + "  ".join(f"{name:>28}" for name, _ in sessions) +
          "   ratio")
    for past in (int(x) for x in args.past.split(",")):
        for _, s in sessions:
            s.prefill(ids[:past])
        for n in (1, k1):
            times: list[list[float]] = [[] for _ in sessions]
            for _ in range(max(1, args.repeats // 20)):
                for (_, s), spent in zip(sessions, times):
                    for i in range(25):
                        t0 = perf_counter()
                        s.forward(ids[past:past + n], past)
                        if i >= 5:
                            spent.append(perf_counter() - t0)
            med = [float(np.median(t)) * 1e3 for t in times]
            print(f"{past:>5} {n:>4}  " + "  ".join(f"{m:>28.3f}" for m in med) +
                  f"   {med[0] / med[1]:.2f}")


if __name__ == "__main__":
    main()
