"""Batched speculation against batched k=0 at each batch size: `generate_batch`, no HTTP.

    python tools/batch_bench.py BUNDLE [--rows 1,2,4,8,16] [--k 0,auto] [--repeats 3]
                                [--max-new-tokens 128] [--prompts FILE.jsonl] [--threads T:D]
                                [--backend auto|cpu|cuda] [--draft-backend cpu]
                                [--draft-source fused|model|lookup] [--recalibrate]
                                [--chat-template-from HF_DIR] [--json OUT]

One process, one Generator loaded with max_batch = the largest row count. For each row count
B and each repeat, every k of --k runs `generate_batch` over B prompts (taken in turn from
--prompts: JSONL with a "prompt", or "messages" rendered through --chat-template-from's chat
template as tools/drafts_bench.py does; greedy, ignore_eos so that each row asks for the same
work), in an order that
rotates each repeat; tokens/s = all rows' new tokens / wall time of the call. Reported per B:
each k's tokens/s (median and range), and each k's ratio to the first k of --k (k=0) per
repeat, with the median and range. Every row's tokens are checked against the same prompt
decoded alone at k=0 (the exactness the batch promises); a difference is reported and makes
the exit status 1.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--rows", default="1,2,4,8,16")
    p.add_argument("--k", default="0,auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompts", type=Path,
                   default=HERE.parent / "runtime" / "data" / "bench_prompts.jsonl")
    p.add_argument("--threads", default=None, help="T:D intra-op threads (default: the runtime's)")
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda", "trt"),
                   help="Generator.load's backend (cuda batches take a --graph static bundle)")
    p.add_argument("--draft-backend", default=None, choices=("cpu", "cuda", "trt"))
    p.add_argument("--draft-source", default="fused")
    p.add_argument("--recalibrate", action="store_true")
    p.add_argument("--chat-template-from", default=None)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    from ssd_runtime import Generator

    rows = [int(r) for r in args.rows.split(",")]
    ks = [k if k == "auto" else int(k) for k in args.k.split(",")]
    if args.chat_template_from:
        sys.path.insert(0, str(HERE))
        from drafts_bench import render

        prompts = render(args.prompts, args.chat_template_from)
    else:
        lines = [json.loads(line) for line in args.prompts.read_text().splitlines()
                 if line.strip()]
        prompts = [x["prompt"] if isinstance(x, dict) else x for x in lines]
    threads = tuple(int(t) for t in args.threads.split(":")) if args.threads else None
    gen = Generator.load(args.bundle, backend=args.backend, threads=threads,
                         max_batch=max(rows), recalibrate=args.recalibrate,
                         draft_backend=args.draft_backend)
    n = args.max_new_tokens
    alone = {}
    for prompt in prompts[:max(rows)]:
        alone[prompt] = gen.generate(prompt, max_new_tokens=n, k=0, ignore_eos=True).token_ids
    for k in ks:                                   # warm up; calibrate the batch's costs
        gen.generate_batch(prompts[:max(rows)], max_new_tokens=8, k=k, ignore_eos=True)
    print(f"bundle {args.bundle}, backend {gen.backend_reason}, threads "
          f"{gen.target.threads}:{gen.draft.threads}, "
          f"{n} tokens a row, {args.repeats} repeats")
    report, wrong = {}, 0
    for b in rows:
        batch = [prompts[i % len(prompts)] for i in range(b)]
        speeds: dict[str, list[float]] = {str(k): [] for k in ks}
        accept: dict[str, list[float]] = {str(k): [] for k in ks}
        for r in range(args.repeats):
            order = ks[r % len(ks):] + ks[:r % len(ks)]
            for k in order:
                t0 = time.perf_counter()
                results = gen.generate_batch(batch, max_new_tokens=n, k=k, ignore_eos=True,
                                             draft_source=args.draft_source)
                seconds = time.perf_counter() - t0
                speeds[str(k)].append(sum(len(x.token_ids) for x in results) / seconds)
                drafted = sum(x.stats.drafted for x in results)
                accept[str(k)].append(sum(x.stats.accepted for x in results) / drafted
                                      if drafted else 0.0)
                for prompt, res in zip(batch, results):
                    if res.token_ids != alone[prompt]:
                        wrong += 1
                        print(f"  rows {b} k={k}: {prompt[:30]!r} differs from k=0 alone",
                              file=sys.stderr)
        base = speeds[str(ks[0])]
        entry = {}
        for k in ks:
            s = speeds[str(k)]
            ratios = [x / y for x, y in zip(s, base)]
            entry[str(k)] = {"tokens_per_s": s, "ratio": ratios, "acceptance": accept[str(k)]}
            print(f"rows {b:>2}  k={str(k):<5} tok/s {statistics.median(s):8.1f} "
                  f"[{min(s):.1f}-{max(s):.1f}]  x k={ks[0]} {statistics.median(ratios):.2f} "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}]  accepted/drafted "
                  f"{statistics.median(accept[str(k)]):.2f}")
        report[str(b)] = entry
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "max_new_tokens": n,
                                         "backend": gen.backend,
                                         "threads": [gen.target.threads, gen.draft.threads],
                                         "rows": report, "rows_differing": wrong}, indent=1))
    print(f"rows differing from k=0 alone: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
