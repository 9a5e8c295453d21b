"""generate_batch at k=0 against k="auto", with and without the target's rows graph, side by side
in one process (issue 43, docs/design.md §11): the batch's tokens per second, repetitions
interleaved, medians with their spread (min-max).

    .venv/bin/python tools/batch_gen_bench.py /tmp/demo43 --prompts 8 --tokens 128 --reps 3

"Without" is a copy of the bundle whose manifest names no rows graph (what a bundle exported
before it, or a load without it, does: a batch's verification one row at a time). Each load is
calibrated afresh (recalibrate=True), since the cost model's batch costs are what changes.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ssd_runtime import Generator

TEXTS = ["def parse(line):", "The quick brown fox jumps over the lazy dog, and then",
         "import numpy as np\n", "Once upon a time, in a land far away, there lived a king who",
         "SELECT name FROM users WHERE", "class Stack:\n    def __init__(self):",
         "Speculative decoding drafts tokens with a small model and", "for i in range(10):"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    prompts = [TEXTS[i % len(TEXTS)] for i in range(args.prompts)]
    with tempfile.TemporaryDirectory() as tmp:
        without = Path(tmp) / "without-rows"
        shutil.copytree(args.bundle, without)
        data = json.loads((without / "manifest.json").read_text())
        data["models"]["target"].update(rows="", rows_parity={}, rows_note="removed for a bench")
        (without / "manifest.json").write_text(json.dumps(data, indent=1))
        gens = {name: Generator.load(path, threads=args.threads, max_batch=args.prompts,
                                     recalibrate=True)
                for name, path in (("without", without), ("with", Path(args.bundle)))}
        for gen in gens.values():        # untimed: the first k="auto" batch calibrates
            for k in (0, "auto"):
                gen.generate_batch(prompts, max_new_tokens=8, k=k, ignore_eos=True)
        rates: dict[tuple[str, object], list[float]] = {}
        outputs: dict[tuple[str, object], list] = {}
        drafted: dict[str, list[float]] = {}
        for _ in range(args.reps):
            for name, gen in gens.items():
                for k in (0, "auto"):
                    t0 = time.perf_counter()
                    results = gen.generate_batch(prompts, max_new_tokens=args.tokens, k=k,
                                                 ignore_eos=True)
                    seconds = time.perf_counter() - t0
                    tokens = sum(len(r.token_ids) for r in results)
                    rates.setdefault((name, k), []).append(tokens / seconds)
                    outputs[name, k] = [r.token_ids for r in results]
                    if k == "auto":     # draft tokens per round, the k the cost model chose
                        drafted.setdefault(name, []).append(
                            sum(r.stats.drafted for r in results)
                            / max(1, sum(r.stats.rounds for r in results)))
        for name, gen in gens.items():   # what the cost model measured at 8 rows (ms)
            cost = gen.knowledge.batch_costs.get(min(8, args.prompts))
            if cost is not None:
                print(f"  {name} rows graph, {cost.rows} rows: draft step "
                      f"{cost.draft_step * 1e3:.1f} ms, V(T) "
                      + ", ".join(f"{t}: {s * 1e3:.1f}" for t, s in cost.verify) + " ms")
    same = all(outputs[key] == outputs["with", 0] for key in outputs)
    print(f"{args.prompts} prompts x {args.tokens} tokens, {args.threads} threads, {args.reps} "
          f"reps; every run's tokens identical: {same}")
    for name in ("without", "with"):
        k0, auto = rates[name, 0], rates[name, "auto"]
        print(f"  {name:>7} rows graph: k=0 {statistics.median(k0):7.1f} tok/s "
              f"({min(k0):.1f}-{max(k0):.1f}), auto {statistics.median(auto):7.1f} tok/s "
              f"({min(auto):.1f}-{max(auto):.1f}): auto/k=0 "
              f"{statistics.median(auto) / statistics.median(k0):.2f}x "
              f"(per rep {', '.join(f'{a / b:.2f}' for a, b in zip(auto, k0))}); auto drafted "
              f"{statistics.mean(drafted[name]):.2f} tokens a row per round")


if __name__ == "__main__":
    main()
