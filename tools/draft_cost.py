"""What a draft step costs inside the loop, against back to back.

In a round the draft runs right after the target's verification, whose weights have just
streamed through the CPU caches; the first draft steps of a round pay for that. This times
the draft's k steps through the runtime's own sessions after each of: a target verification
of k+1 tokens (as in the loop), a busy-wait of the same length, a 64 MB memory sweep, and
nothing (back to back). Medians in µs per step position.

    python tools/draft_cost.py BUNDLE [--k 8] [--rounds 400] [--threads 2:1]
"""
from __future__ import annotations

import argparse
import sys
from time import perf_counter

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--k", type=int, default=8, help="draft steps per round")
    p.add_argument("--rounds", type=int, default=400)
    p.add_argument("--threads", default="2:1", help="target:draft intra-op threads")
    args = p.parse_args(argv)

    from ssd_runtime import Generator

    target_threads, draft_threads = (int(t) for t in args.threads.split(":"))
    gen = Generator.load(args.bundle, backend="cpu", threads=(target_threads, draft_threads))
    target, draft = gen.target, gen.draft
    past = 100
    prefix = np.arange(1, past + 1, dtype=np.int64) % gen.manifest.target.vocab_size
    target.prefill(prefix)
    draft.prefill(prefix)
    one, verify_ids = np.zeros(1, np.int64), np.zeros(args.k + 1, np.int64)
    t0 = perf_counter()
    target.forward(verify_ids, past)
    verify_s = perf_counter() - t0
    sweep = np.zeros(64 * 2**20 // 8)

    def busy() -> None:
        start = perf_counter()
        while perf_counter() - start < verify_s:
            pass

    before = {"after a verification": lambda: target.forward(verify_ids, past),
              "after a busy-wait": busy, "after a 64 MB sweep": lambda: float(sweep.sum()),
              "back to back": lambda: None}
    print(f"{args.bundle}: draft steps (µs) by place in the round, median of {args.rounds}")
    for name, fn in before.items():
        steps = np.empty((args.rounds, args.k))
        for r in range(args.rounds):
            fn()
            for i in range(args.k):
                t0 = perf_counter()
                draft.forward(one, past)
                steps[r, i] = perf_counter() - t0
        medians = np.median(steps, axis=0) * 1e6
        print(f"  {name:<22}" + " ".join(f"{m:6.0f}" for m in medians)
              + f"   round {medians.sum():6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
