"""Lookup trees against lookup chains (issue 56): the same requests, side by side, alternated.

    python tools/tree_bench.py BUNDLE [--workload edits|chat|both] [--draft-source lookup]
                               [--k auto] [--repeat 2] [--max-new-tokens 256]
                               [--tree-extra 0.5,1] [--threads 1 --cpu-time] [--json OUT]

Workloads: "edits", the chat code edits of tools/prediction_bench.py --chat (a rename asked of
a slice of whole top-level blocks of a few standard-library files, through the bundle's chat
template), each once without a prediction and once with the original slice as the request's
prediction (the issue-45 workload); "chat", tools/data/exact_chat_prompts.jsonl (chat prompts
that do not repeat much). One generator per mode: chains only (`Loop.trees = False`) and lookup
trees of each --tree-extra (`Drafter.tree_extra`), so what k=auto learns stays with its own
mode, each warmed by a short request first; each request runs in every mode in turn (the first
rotating), --repeat times, the least decode seconds kept (`--cpu-time`, with `--threads 1`: the whole
request's CPU time on the calling thread, prefill included, which a machine loaded by others
does not inflate). Reported per workload and mode: tokens/s (the
tokens over the summed best seconds), the ratio trees / chains, rounds, accepted per round,
tree rounds and their nodes; every answer is checked against the target alone (k=0, greedy).
"""
from __future__ import annotations

import argparse
import json
import os
import sysconfig
import time
from pathlib import Path

from prediction_bench import ASK, CHAT_FILES, _slice

from ssd_runtime import Generator
from ssd_runtime.round.drafting import Drafter
from ssd_runtime.round.loop import Loop

CHAT = Path(__file__).parent / "data" / "exact_chat_prompts.jsonl"
DEFAULT_EXTRA = Drafter.tree_extra


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


def run(gen: Generator, extra: float, ids, budget: int, k, source: str, prediction):
    """One request with lookup trees of `extra` (Drafter.tree_extra; 0: chains only)."""
    Loop.trees, Drafter.tree_extra = extra > 0, extra
    try:
        return gen.generate(ids, max_new_tokens=budget, k=k, draft_source=source,
                            prediction=prediction)
    finally:
        Loop.trees, Drafter.tree_extra = True, DEFAULT_EXTRA


def name(extra: float) -> str:
    return "chains" if extra == 0 else f"trees x{extra:g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--workload", choices=("edits", "chat", "both"), default="both")
    ap.add_argument("--draft-source", default="lookup")
    ap.add_argument("--k", default="auto")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cpu-time", action="store_true",
                    help="each request's CPU time on the calling thread (with --threads 1)")
    ap.add_argument("--tree-extra", default=f"{DEFAULT_EXTRA:g}",
                    help="comma-separated Drafter.tree_extra values to compare with chains: "
                         "a tree's nodes beyond its chain's, per chain row")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time needs --threads 1: ONNX Runtime's pool threads are not the caller's")
    k = args.k if args.k == "auto" else int(args.k)
    modes = [0.0, *(float(x) for x in args.tree_extra.split(","))]
    gens = {m: Generator.load(args.bundle, threads=args.threads) for m in modes}
    # the target alone on a generator of its own: what k=0's rounds teach a generator (its
    # round times) stays out of the modes'
    reference = Generator.load(args.bundle, threads=args.threads)
    if not reference.target.verifies_trees:
        raise SystemExit(f"{args.bundle}: the loop verifies no draft tree on its target (schema "
                         f"13's tree input, on a flavour without a bitwise promise: ort).")
    work = requests(reference, args.workload, args.max_new_tokens)
    for m, gen in gens.items():      # warm: k=auto's first call calibrates (design §6)
        run(gen, m, work[0][1], 8, k, args.draft_source, None)
    rows = []
    for i, (label, ids, prediction) in enumerate(work):
        budget = args.max_new_tokens
        alone = reference.generate(ids, max_new_tokens=budget, k=0).token_ids
        row = {"request": label, "prompt_tokens": len(ids), "answer_tokens": len(alone)}
        best: dict[float, float] = {}
        for r in range(args.repeat):
            shift = (i + r) % len(modes)
            for m in modes[shift:] + modes[:shift]:          # the first in turn
                start = time.thread_time()
                res = run(gens[m], m, ids, budget, k, args.draft_source, prediction)
                cpu = time.thread_time() - start
                if res.token_ids != alone:
                    raise SystemExit(f"{label} ({name(m)}): the answer differs from the target "
                                     f"alone's")
                s = res.stats
                seconds = cpu if args.cpu_time else s.seconds["decode"]
                if m not in best or seconds < best[m]:
                    best[m] = seconds
                    row[name(m)] = {"seconds": round(seconds, 4), "rounds": s.rounds,
                                    "accepted": s.accepted, "drafted": s.drafted,
                                    "tree_rounds": s.tree_rounds, "tree_nodes": s.tree_nodes,
                                    "tree_gained": s.tree_gained}
        rows.append(row)
        base = row["chains"]["seconds"]
        print(f"{label:28s} {len(alone):4d} tok  " + "  ".join(
            f"{name(m)} {len(alone) / row[name(m)]['seconds']:6.1f} tok/s "
            f"{row[name(m)]['rounds']:3d} rounds ({row[name(m)]['tree_rounds']} trees, "
            f"+{row[name(m)]['tree_gained']}) {base / row[name(m)]['seconds']:.2f}x"
            for m in modes), flush=True)
    summary = {}
    for group in ("edit", "edit +prediction", "chat"):
        part = [r for r in rows if r["request"].split()[0] == group.split()[0]
                and ("+prediction" in r["request"]) == ("+prediction" in group)]
        if not part:
            continue
        tokens = sum(r["answer_tokens"] for r in part)
        entry = {"requests": len(part), "tokens": tokens}
        for m in modes:
            sums = {key: sum(r[name(m)][key] for r in part) for key in
                    ("seconds", "rounds", "accepted", "tree_rounds", "tree_nodes",
                     "tree_gained")}
            entry[name(m)] = {**sums, "tok_s": round(tokens / sums["seconds"], 2),
                              "accepted_per_round": round(sums["accepted"] / sums["rounds"], 3)}
        for m in modes[1:]:
            entry[name(m)]["over_chains"] = round(entry["chains"]["seconds"]
                                                  / entry[name(m)]["seconds"], 3)
        summary[group] = entry
        print(f"{group:18s} {len(part)} requests, {tokens} tokens: " + "; ".join(
            f"{name(m)} {entry[name(m)]['tok_s']} tok/s, {entry[name(m)]['accepted_per_round']}"
            f" accepted/round" + (f", {entry[name(m)]['tree_rounds']} tree rounds, "
                                  f"+{entry[name(m)]['tree_gained']} tokens, "
                                  f"{entry[name(m)]['over_chains']}x" if m else "")
            for m in modes))
    print(f"all {len(rows)} answers identical to the target alone's; load "
          f"{os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({
            "bundle": args.bundle, "draft_source": args.draft_source, "k": args.k,
            "modes": [name(m) for m in modes], "cpu_time": args.cpu_time,
            "repeat": args.repeat, "max_new_tokens": args.max_new_tokens, "summary": summary,
            "requests": rows, "load_after": os.getloadavg()}, indent=1) + "\n")


if __name__ == "__main__":
    main()
