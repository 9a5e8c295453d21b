"""Draft trees against chains (issue 56), a head's or a draft model's: the same prompts through
the loop, side by side, alternated, greedy, every answer checked against k = 0.

    python tools/head_tree_bench.py BUNDLE [--prompts tools/data/exact_chat_prompts.jsonl]
                                   [--max-new-tokens 128] [--threads 2] [--repeat 1]
                                   [--modes k0,c1,c2,c3,t6x5x1x1@1,t8x3x2x2@2] [--json OUT]
                                   [--batch B]

BUNDLE: a target with an EAGLE-3 or MTP head (ssd-export --draft HEAD) or a draft model. A mode
is `k0` (the target alone), `cK` (the draft's chain of K drafts a round, FixedK), `tNxWxDxB@K`
(its tree of that TreeShape, its depth capped at K: Drafter.tree_shape with FixedK(K)), `auto`
(k="auto": the planner's chains and trees, tree_plan) or `autochain` (k="auto", chains only),
all with draft_source="model"; each auto mode on a Generator of its own (what k="auto" learns
carries over the prompts, as in a server, but not from one mode into another). Each prompt
runs in every mode in turn, the first mode rotating, --repeat times. Reported per mode: decode tokens/s per request (median and range), tokens and
accepted per round, nodes per round, partings from k = 0 (must be 0).

`--batch B`: the prompts go in groups of B through generate_batch (Generators of max_batch B;
a batch's rows grow their trees along their chains: a shape's beam must be 1), and a group's
rate is its tokens over its wall time (prefills included): the batch's throughput.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from ssd_runtime import Generator
from ssd_runtime.bench import load_prompts
from ssd_runtime.round.drafting import Drafter
from ssd_runtime.round.tree_draft import TreeShape

CHAT = Path(__file__).parent / "data" / "exact_chat_prompts.jsonl"
MODES = "k0,c1,c2,c3,t6x5x1x1@1,t8x3x2x2@2,t10x3x3x3@3"


def parse(mode: str) -> tuple[int | str, TreeShape | None]:
    if mode == "k0":
        return 0, None
    if mode in ("auto", "autochain"):
        return "auto", None
    if mode.startswith("c"):
        return int(mode[1:]), None
    shape, k = mode[1:].split("@")
    return int(k), TreeShape.parse(shape)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=str(CHAT))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--modes", default=MODES)
    ap.add_argument("--json", default=None)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    plans = {m: parse(m) for m in modes}
    threads, batch = (args.threads, args.threads), args.batch
    gen = Generator.load(args.bundle, backend="cpu", threads=threads, max_batch=batch)
    gens = {m: Generator.load(args.bundle, backend="cpu", threads=threads, max_batch=batch)
            if plans[m][0] == "auto" else gen for m in modes}
    for m in modes:
        if m == "autochain":
            gens[m].knowledge.draft_trees = False
    prompts = [gen.encode(p) for p in load_prompts(args.prompts)]
    alone = [gen.generate(p, max_new_tokens=args.max_new_tokens, k=0).token_ids
             for p in prompts]
    found = {m: {"rates": [], "tokens": 0, "rounds": 0, "accepted": 0, "nodes": 0,
                 "tree_rounds": 0, "partings": 0} for m in modes}
    groups = [list(range(i, min(i + batch, len(prompts))))
              for i in range(0, len(prompts), batch)]
    for rep in range(args.repeat):
        for i, group in enumerate(groups):
            turn = (i + rep) % len(modes)
            for m in modes[turn:] + modes[:turn]:
                k, shape = plans[m]
                Drafter.tree_shape = shape
                try:
                    t0 = time.perf_counter()
                    if batch > 1:
                        results = gens[m].generate_batch(
                            [prompts[j] for j in group], max_new_tokens=args.max_new_tokens,
                            k=k, draft_source="model")
                    else:
                        results = [gens[m].generate(prompts[group[0]], k=k,
                                                    max_new_tokens=args.max_new_tokens,
                                                    draft_source="model")]
                    wall = time.perf_counter() - t0
                finally:
                    Drafter.tree_shape = None
                row = found[m]
                if batch > 1:
                    row["rates"].append(sum(r.stats.new_tokens for r in results) / wall)
                for j, res in zip(group, results):
                    st = res.stats
                    if batch == 1:
                        row["rates"].append(st.new_tokens / st.seconds["decode"])
                    row["tokens"] += st.new_tokens
                    row["rounds"] += st.rounds
                    row["accepted"] += st.new_tokens - st.rounds
                    row["nodes"] += st.tree_nodes if st.tree_rounds else st.drafted
                    row["tree_rounds"] += st.tree_rounds
                    row["partings"] += res.token_ids != alone[j]
    auto = gens["auto"].knowledge.trees.get("greedy") if "auto" in gens else None
    report = {"bundle": args.bundle, "learnt_by_depth_rank": auto.as_dict() if auto else None,
              "prompts": len(prompts), "repeat": args.repeat, "batch": batch,
              "max_new_tokens": args.max_new_tokens, "threads": args.threads, "modes": {}}
    base = statistics.median(found["k0"]["rates"]) if "k0" in found else None
    for m in modes:
        row = found[m]
        rates = row["rates"]
        out = {"tokens_per_s_median": statistics.median(rates), "tokens_per_s_min": min(rates),
               "tokens_per_s_max": max(rates), "tokens_per_round": row["tokens"] / row["rounds"],
               "accepted_per_round": row["accepted"] / row["rounds"],
               "nodes_per_round": row["nodes"] / row["rounds"],
               "tree_rounds": row["tree_rounds"], "rounds": row["rounds"],
               "partings": row["partings"]}
        if base:
            out["speedup_vs_k0"] = out["tokens_per_s_median"] / base
        report["modes"][m] = out
        print(f"{m:>14}  tok/s {out['tokens_per_s_median']:6.1f} [{min(rates):.1f}-"
              f"{max(rates):.1f}]  accepted/round {out['accepted_per_round']:.3f}  "
              f"nodes/round {out['nodes_per_round']:.1f}  tree rounds {row['tree_rounds']:4d}"
              f"  partings {row['partings']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
