"""One forward call's time through the runtime's sessions, per model and new-token count.

    python tools/step_times.py BUNDLE [BUNDLE ...] [--backend cpu|cuda|trt] [--past 100]

Each model is prefilled to `--past` rows, then called 20 times to warm up and 200 times timed
at 1, 5 and 9 new tokens (what a draft step and verifications of k = 4 and 8 cost), through
the same IO-bound sessions the decode loop uses.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ssd_runtime import Generator


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundles", nargs="+")
    p.add_argument("--backend", default="auto")
    p.add_argument("--past", type=int, default=100)
    args = p.parse_args()
    for bundle in args.bundles:
        gen = Generator.load(bundle, backend=args.backend)
        for name, session in (("target", gen.target), ("draft", gen.draft)):
            session.prefill((np.arange(args.past) % 50).astype(np.int64))
            times = []
            for n in (1, 5, 9):
                ids = np.ones(n, np.int64)
                for _ in range(20):
                    session.forward(ids, args.past)
                start = time.perf_counter()
                for _ in range(200):
                    session.forward(ids, args.past)
                times.append(f"{n} tok {(time.perf_counter() - start) / 200 * 1e3:.3f} ms")
            print(f"{bundle} [{gen.backend}] {name} step at past {args.past}: {', '.join(times)}")


if __name__ == "__main__":
    main()
