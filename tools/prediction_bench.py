"""Predicted outputs (issue 45): tokens/s of the same requests with and without a prediction.

    python tools/prediction_bench.py BUNDLE [--files a.py b.py] [--tokens 400] [--repeat 3]

For each source file (default: a few of this interpreter's standard library, cut to --tokens
tokens): the prompt is the file's first lines, and three predictions are tried against none
(k=auto each): the file's own rest ("original": right where the model reproduces the file),
the target's own greedy output ("exact": an unchanged file), and that output with every 25th
token changed ("edited": a small edit). Every answer is checked against the target alone
(k=0); tokens/s are decode seconds summed over the files, the best of --repeat runs.
"""
from __future__ import annotations

import argparse
import os
import sysconfig
from pathlib import Path

from ssd_runtime import Generator

DEFAULT_FILES = ("textwrap.py", "bisect.py", "colorsys.py", "keyword.py")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--files", nargs="*")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--prompt-lines", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    gen = Generator.load(args.bundle, threads=args.threads)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = args.files or [str(stdlib / name) for name in DEFAULT_FILES]
    totals: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    produced = 0
    for name in files:
        lines = Path(name).read_text().splitlines(keepends=True)
        prompt = "".join(lines[:args.prompt_lines])
        rest = gen.encode("".join(lines[args.prompt_lines:]))[:args.tokens]
        budget = min(args.tokens, gen.manifest.max_context - len(gen.encode(prompt)) - 1)
        alone = gen.generate(prompt, max_new_tokens=budget, k=0).token_ids
        produced += len(alone)
        edited = [(t + 1) % 256 if i % 25 == 12 else t for i, t in enumerate(alone)]
        for label, prediction in (("none", None), ("original", rest[:budget]),
                                  ("exact", alone), ("edited", edited)):
            best = None
            for _ in range(args.repeat):
                res = gen.generate(prompt, max_new_tokens=budget, k="auto",
                                   prediction=prediction)
                assert res.token_ids == alone, f"{name} {label}: not the target alone's"
                seconds = res.stats.seconds["decode"]
                best = seconds if best is None else min(best, seconds)
            st = res.stats
            totals.setdefault(label, []).append(best)
            c = counts.setdefault(label, [0, 0])
            c[0] += st.prediction_accepted
            c[1] += st.prediction_drafted - st.prediction_accepted
    base = sum(totals["none"])
    print(f"{len(files)} files, {produced} tokens, {gen.backend} ({os.cpu_count()} cores)")
    for label, spent in totals.items():
        accepted, rejected = counts[label]
        print(f"  {label:9s} {produced / sum(spent):8.1f} tok/s  {base / sum(spent):5.2f}x  "
              f"accepted_prediction_tokens {accepted}  rejected {rejected}")


if __name__ == "__main__":
    main()
