"""Where a greedy token's time goes, ours against ONNX Runtime GenAI, in one process.

    python tools/token_gap.py BUNDLE --genai GENAI_MODEL_DIR [--tokens 128] [--rounds 12]

Three ways of decoding the same prompt (57 ids) greedily, k=0, on the CPU with 2 threads,
shuffled within each round so that the machine's moods fall on all of them alike:

- `genai`: GenAI's `generate_next_token()` loop (its C++ loop around its ONNX Runtime session)
- `session`: our target session's `forward()` and an argmax, nothing else (our graph and IO
  binding, no loop machinery)
- `generate`: `Generator.generate(k=0)`, the whole runtime loop (rule, schedule, drafter,
  stats, text)

Each prints its median ms per decoded token and the per-round ratios genai / ours. Needs
`onnxruntime-genai` beside the project's packages (tools/README.md, peers).
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from ssd_runtime import Generator

PROMPT = list(range(3, 60))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle")
    p.add_argument("--genai", required=True, help="a GenAI model folder (genai_config.json)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import onnxruntime_genai as og

    config = og.Config(args.genai)
    config.clear_providers()
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": args.threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(config)
    gen = Generator.load(args.bundle, backend="cpu", threads=(args.threads, args.threads))
    target, n = gen.target, args.tokens

    def genai() -> float:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(PROMPT) + n, do_sample=False)
        g = og.Generator(model, params)
        g.append_tokens(np.array([PROMPT], np.int32))
        g.generate_next_token()                     # the prompt's pass, not timed
        start, count = time.perf_counter(), 0
        while not g.is_done():
            g.generate_next_token()
            count += 1
        return (time.perf_counter() - start) / count * 1e3

    def session() -> float:
        target.prefill(np.array(PROMPT[:-1], np.int64))
        token, past = PROMPT[-1], len(PROMPT) - 1
        start = time.perf_counter()
        for i in range(n):
            logits = target.forward(np.array([token], np.int64), past + i)
            token = int(np.argmax(logits[-1]))
        return (time.perf_counter() - start) / n * 1e3

    def generate() -> float:
        res = gen.generate(PROMPT, max_new_tokens=n, k=0, ignore_eos=True)
        return res.stats.seconds["decode"] / res.stats.new_tokens * 1e3

    ways = {"genai": genai, "session": session, "generate": generate}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for way in ways.values():
        way()                                       # warm up
    for _ in range(args.rounds):
        order = list(ways)
        random.shuffle(order)
        for name in order:
            times[name].append(ways[name]())
    for name, t in times.items():
        q1, q3 = np.percentile(t, [25, 75])
        print(f"{name:9} {np.median(t):.3f} ms/token (quartiles {q1:.3f}-{q3:.3f})")
    g = np.array(times["genai"])
    for name in ("session", "generate"):
        r = g / np.array(times[name])
        print(f"genai / {name}: median {np.median(r):.3f} (rounds {r.min():.2f}-{r.max():.2f}); "
              f"ours as fast as GenAI at >= 1")


if __name__ == "__main__":
    main()
