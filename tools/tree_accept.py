"""Accepted tokens per round of model-drafted trees against chains, with the runtime's own rules
and sessions, and the tree planner's choice on this machine (issue 56).

    python tools/tree_accept.py BUNDLE [--prompts FILE] [--max-new-tokens 64] [--threads 2]
                                [--shapes 9x1x8x1,5x1x4x1,8x2x4x2,10x3x3x3,10x2x6x2]
                                [--temperature T [--sampled]] [--json out.json]

Greedy. A shape is NODESxWIDTHxDEPTHxBEAM (tree_draft.TreeShape; width 1: a chain of
NODES - 1 drafts); with a trailing L its nodes are valued by the acceptance learnt so far (per
depth and rank, TreeAcceptance.chance) instead of the draft's q (put it after the widest
shape, whose run it learns from). Each round drafts with tree_draft.expand — the draft's rows by tree_step
where its graph takes a tree, else branch_step (one chain call per expanded node), an EAGLE-3
or MTP head's by features.head_step (one one-row call per expanded node) — and
verifies with GreedyAcceptance.verify_tree over the target's rows (forward_tree where the
target takes trees, else one chain call per leaf: the same logits, so the same verdicts). Every
run's tokens are compared with k = 0's (partings: runs that differ). Reported per shape:
rounds, accepted and nodes per round, acceptance by depth and by rank. `--temperature`:
sampling with the rejection rule instead (SamplingAcceptance.verify_tree, seeded per prompt;
no partings: the tokens are the target's law, not k = 0's), the candidates the draft's top-m
(point masses), or with `--sampled` drawn from its q without replacement. Then a TreeAcceptance
learnt from the widest shape's verdicts, v(N) timed on the target (calibration.calibrate_rows,
N = 1 .. the bundle's verification width), c and c1 from the runtime's calibration, and
plan_tree's choice against its best chain with that acceptance. Calls are timed by nothing
else here: the accepted tokens are what this measures (tokens/s with trees needs the loop's
tree rounds: docs/performance.md, "Draft trees (issue 56)").
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from ssd_runtime import Generator
from ssd_runtime.bench import load_prompts
from ssd_runtime.round.acceptance import GreedyAcceptance, SamplingAcceptance
from ssd_runtime.round.features import head_step
from ssd_runtime.round.tree import Tree, Verdicts
from ssd_runtime.round.sampling import SamplingParams
from ssd_runtime.round.tree_draft import TreeShape, branch_step, expand, tree_step
from ssd_runtime.scheduler.calibration import calibrate_rows
from ssd_runtime.scheduler.schedule import FixedK
from ssd_runtime.scheduler.tree_plan import TreeAcceptance, plan_tree, verify_from_times

SHAPES = "5x1x4x1,9x1x8x1,8x2x4x2,10x3x3x3,10x2x6x2"


def target_rows(target, seq: list[int], tree: Tree) -> np.ndarray:
    """The target's rows (N, V) for a tree after the committed seq[:-1]."""
    past = len(seq) - 1
    if getattr(target, "takes_trees", False):
        return np.array(target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, past))
    found: dict[int, np.ndarray] = {}
    for leaf in tree.leaves():                     # one chain call per leaf, over its path
        logits = np.asarray(target.forward(np.asarray([seq[-1], *tree.pending(leaf)],
                                                      np.int64), past))
        for row, node in enumerate(tree.path(leaf)):
            found.setdefault(node, np.array(logits[row]))
    return np.stack([found[i] for i in range(len(tree))])


def decode(gen: Generator, prompt: list[int], shape: TreeShape, max_new: int,
           learnt: TreeAcceptance | None, rule, sampled: bool = False, chance=None
           ) -> tuple[list[int], int, Verdicts]:
    """Tokens, rounds and verdicts of one prompt drafted with `shape`, judged by `rule`."""
    target, draft = gen.target, gen.draft
    cut = gen.manifest.target.vocab_size
    seq, rounds, verdicts = list(prompt), 0, Verdicts()
    head = gen.drafter(rule, FixedK(1), None, 0) if gen.features is not None else None
    while len(seq) - len(prompt) < max_new:
        target.prefill(np.asarray(seq[:-1], np.int64), 0)     # (a head's features: on_aux)
        if head is not None:                      # a head: features.head_step
            head.draft_len = 0
            head.catch_up(seq, len(seq) - 1)
            step = head_step(head, seq)
        else:
            draft.prefill(np.asarray(seq[:-1], np.int64), 0)
            step = (tree_step if getattr(draft, "takes_trees", False) else branch_step)(
                draft, seq, len(seq) - 1, cut=cut)
        drafted = expand(seq[-1], step, shape, rule.draft_candidates, len(seq), sampled, chance)
        tree = drafted.tree
        path, t = rule.verify_tree(target_rows(target, seq, tree), tree, drafted.probs, len(seq))
        seq += [*tree.pending(path[-1]), t] if path else [t]
        rounds += 1
        verdicts.tree(tree, path)
        if learnt is not None:
            learnt.observe(tree, path)
        eos = next((i for i, x in enumerate(seq[len(prompt):]) if x in gen.eos_ids), None)
        if eos is not None:
            del seq[len(prompt) + eos + 1:]
            break
    return seq[len(prompt):][:max_new], rounds, verdicts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--sampled", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = args.shapes.split(",")
    shapes = [TreeShape.parse(s.rstrip("L")) for s in names]
    gen = Generator.load(args.bundle, backend="cpu", threads=(args.threads, args.threads))
    width = gen.target.max_new_len
    if max(s.nodes for s in shapes) > width:
        sys.exit(f"a shape has more nodes than the bundle verifies at once ({width}).")
    prompts = [gen.encode(p) for p in load_prompts(args.prompts)]
    alone = [gen.generate(p, max_new_tokens=args.max_new_tokens, k=0).token_ids for p in prompts]
    widest = max(range(len(shapes)), key=lambda i: (shapes[i].width, shapes[i].nodes,
                                                    not names[i].endswith("L")))
    learnt = TreeAcceptance(alpha=gen.manifest.pair_worth.get("alpha") or 0.5)
    rows = []
    for at, (name, shape) in enumerate(zip(names, shapes)):
        chance = learnt.chance if name.endswith("L") else None
        total, rounds, partings, tokens = Verdicts(), 0, 0, 0
        for i, (p, want) in enumerate(zip(prompts, alone)):
            rule = GreedyAcceptance() if not args.temperature else SamplingAcceptance(
                SamplingParams(temperature=args.temperature, seed=i, coupling="rejection"))
            got, r, v = decode(gen, p, shape, args.max_new_tokens,
                               learnt if at == widest else None, rule, args.sampled, chance)
            if not args.temperature:
                partings += got != want[:len(got)] or len(got) < len(want)
            rounds, tokens = rounds + r, tokens + len(got)
            total.merge(v)
        found = total.as_dict()
        rows.append({"shape": name,
                     "chain": shape.width == 1, "rounds": rounds, "partings": partings,
                     "accepted_per_round": (tokens - rounds) / rounds,
                     "tokens_per_round": tokens / rounds, "nodes_per_round": total.nodes / rounds,
                     "acceptance_by_depth": found["acceptance_by_depth"],
                     "acceptance_by_rank": found["acceptance_by_rank"]})
        print(f"{rows[-1]['shape']:>10}  rounds {rounds:4d}  accepted/round "
              f"{rows[-1]['accepted_per_round']:.2f}  nodes/round {rows[-1]['nodes_per_round']:.1f}"
              f"  partings {partings}  by depth {_r(found['acceptance_by_depth'])}  by rank "
              f"{_r(found['acceptance_by_rank'])}", flush=True)
    best_chain = max((r for r in rows if r["chain"]), key=lambda r: r["accepted_per_round"],
                     default=None)
    best_tree = max((r for r in rows if not r["chain"]), key=lambda r: r["accepted_per_round"],
                    default=None)
    cost = gen.knowledge.cost_model()
    times = calibrate_rows(gen.target, list(range(1, width + 1)))
    v = verify_from_times(times)
    calls = "levels" if getattr(gen.draft, "takes_trees", False) else "nodes"   # head_step's
    plan = plan_tree(learnt, v, cost.c_first, cost.c, width, draft_calls=calls)
    chain = plan_tree(learnt, v, cost.c_first, cost.c, width, max_width=1, draft_calls=calls)
    report = {"bundle": args.bundle, "prompts": len(prompts), "max_new_tokens":
              args.max_new_tokens, "threads": args.threads, "temperature": args.temperature,
              "sampled": args.sampled, "shapes": rows,
              "tree_over_chain": best_tree["accepted_per_round"] / best_chain["accepted_per_round"]
              if best_tree and best_chain else None,
              "v": {n: v(n) for n in times}, "c": cost.c, "c_first": cost.c_first,
              "learnt": learnt.as_dict()["by_depth_rank"][:4],
              "plan": plan.__dict__, "plan_chain": chain.__dict__}
    print(f"best tree / best chain, accepted per round: {report['tree_over_chain']}")
    print("v(N) = " + ", ".join(f"{n}: {x:.2f}" for n, x in report["v"].items()) +
          f"; c = {cost.c:.3f}, c1 = {cost.c_first:.3f}")
    print(f"learnt a[d][r] (d = 1..4): {report['learnt']}")
    print(f"plan: {plan}\nchain plan: {chain}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def _r(rates: list) -> str:
    return " ".join("-" if x is None else f"{x:.2f}" for x in rates[:8])


if __name__ == "__main__":
    sys.exit(main())
