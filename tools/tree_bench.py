"""Lookup trees against lookup chains (issue 56): the same requests, side by side, alternated.

    python tools/tree_bench.py BUNDLE [--workload edits|chat|both] [--draft-source lookup]
                               [--k auto] [--repeat 2] [--max-new-tokens 256] [--json OUT]

Workloads: "edits", the chat code edits of tools/prediction_bench.py --chat (a rename asked of
a slice of whole top-level blocks of a few standard-library files, through the bundle's chat
template), each once without a prediction and once with the original slice as the request's
prediction (the issue-45 workload); "chat", tools/data/exact_chat_prompts.jsonl (chat prompts
that do not repeat much). Two generators, one verifying lookup's trees (the runtime's default
where the target takes them) and one chains only (`Loop.trees = False`), so what k=auto learns
stays with its own mode; each request runs on one, then the other (the first alternating),
--repeat times, the least decode seconds kept. Reported per workload and mode: tokens/s (the
tokens over the summed best seconds), the ratio trees / chains, rounds, accepted per round,
tree rounds and their nodes; every answer is checked against the target alone (k=0, greedy).
"""
from __future__ import annotations

import argparse
import json
import os
import sysconfig
from pathlib import Path

from prediction_bench import ASK, CHAT_FILES, _slice

from ssd_runtime import Generator
from ssd_runtime.round.loop import Loop

CHAT = Path(__file__).parent / "data" / "exact_chat_prompts.jsonl"


def requests(gen: Generator, workload: str, max_new: int) -> list[tuple[str, list[int], object]]:
    """(label, prompt ids, prediction or None) of the workload."""
    out = []
    if workload in ("edits", "both"):
        from transformers import AutoTokenizer

        template = AutoTokenizer.from_pretrained(str(Path(gen.root) / "tokenizer"))
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        for name in CHAT_FILES:
            code, old = _slice(gen, (stdlib / name).read_text(), 300, 420)
            messages = [{"role": "user", "content": ASK.format(old=old, new=f"{old}_renamed",
                                                               code=code)}]
            ids = gen.encode(template.apply_chat_template(messages, add_generation_prompt=True,
                                                          tokenize=False))
            out.append((f"edit {name}", ids, None))
            out.append((f"edit {name} +prediction", ids, code))
    if workload in ("chat", "both"):
        for i, line in enumerate(CHAT.read_text().splitlines()):
            out.append((f"chat {i}", gen.encode(json.loads(line)["prompt"]), None))
    return [(label, ids, p) for label, ids, p in out if len(ids) + max_new < gen.manifest.max_context]


def run(gen: Generator, trees: bool, ids, budget: int, k, source: str, prediction):
    Loop.trees = trees
    try:
        return gen.generate(ids, max_new_tokens=budget, k=k, draft_source=source,
                            prediction=prediction)
    finally:
        Loop.trees = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--workload", choices=("edits", "chat", "both"), default="both")
    ap.add_argument("--draft-source", default="lookup")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    k = args.k if args.k == "auto" else int(args.k)
    gens = {mode: Generator.load(args.bundle, threads=args.threads) for mode in (True, False)}
    if not gens[True].target.takes_trees:
        raise SystemExit(f"{args.bundle}: its target takes no draft tree (schema 13's tree).")
    reference = gens[True]
    rows = []
    for i, (label, ids, prediction) in enumerate(requests(reference, args.workload,
                                                          args.max_new_tokens)):
        budget = args.max_new_tokens
        alone = reference.generate(ids, max_new_tokens=budget, k=0).token_ids
        row = {"request": label, "prompt_tokens": len(ids), "answer_tokens": len(alone)}
        best: dict[bool, float] = {}
        for r in range(args.repeat):
            order = (True, False) if (i + r) % 2 == 0 else (False, True)
            for trees in order:
                res = run(gens[trees], trees, ids, budget, k, args.draft_source, prediction)
                if res.token_ids != alone:
                    raise SystemExit(f"{label} ({'trees' if trees else 'chains'}): the answer "
                                     f"differs from the target alone's")
                s = res.stats
                seconds = s.seconds["decode"]
                if trees not in best or seconds < best[trees]:
                    best[trees] = seconds
                    row["trees" if trees else "chains"] = {
                        "decode_s": round(seconds, 4), "rounds": s.rounds,
                        "accepted": s.accepted, "drafted": s.drafted,
                        "tree_rounds": s.tree_rounds, "tree_nodes": s.tree_nodes}
        rows.append(row)
        t, c = row["trees"], row["chains"]
        print(f"{label:28s} {len(alone):4d} tok  trees {len(alone) / t['decode_s']:6.1f} tok/s "
              f"{t['rounds']:4d} rounds ({t['tree_rounds']} trees)  chains "
              f"{len(alone) / c['decode_s']:6.1f} tok/s {c['rounds']:4d} rounds  "
              f"{c['decode_s'] / t['decode_s']:.2f}x", flush=True)
    summary = {}
    for group in sorted({r["request"].split()[0] + (" +prediction" if "+prediction" in
                                                     r["request"] else "") for r in rows}):
        part = [r for r in rows if r["request"].split()[0] == group.split()[0]
                and ("+prediction" in r["request"]) == ("+prediction" in group)]
        tokens = sum(r["answer_tokens"] for r in part)
        sums = {m: {key: sum(r[m][key] for r in part) for key in
                    ("decode_s", "rounds", "accepted", "tree_rounds", "tree_nodes")}
                for m in ("trees", "chains")}
        summary[group] = {"requests": len(part), "tokens": tokens, **{
            m: {**v, "tok_s": round(tokens / v["decode_s"], 2),
                "accepted_per_round": round(v["accepted"] / v["rounds"], 3)}
            for m, v in sums.items()},
            "trees_over_chains": round(sums["chains"]["decode_s"] / sums["trees"]["decode_s"], 3)}
        s = summary[group]
        print(f"{group:18s} {len(part)} requests, {tokens} tokens: trees "
              f"{s['trees']['tok_s']} tok/s ({s['trees']['accepted_per_round']} accepted/round, "
              f"{s['trees']['tree_rounds']} tree rounds, {s['trees']['tree_nodes']} nodes), "
              f"chains {s['chains']['tok_s']} tok/s ({s['chains']['accepted_per_round']}/round): "
              f"{s['trees_over_chains']}x")
    print(f"all {len(rows)} answers identical to the target alone's; load "
          f"{os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({
            "bundle": args.bundle, "draft_source": args.draft_source, "k": args.k,
            "repeat": args.repeat, "max_new_tokens": args.max_new_tokens, "summary": summary,
            "requests": rows, "load_after": os.getloadavg()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
