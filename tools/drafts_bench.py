"""Several drafts and targets side by side in one run: bundles of one model (each exported with
another draft, or with a quantized target), every configuration interleaved prompt by prompt,
and speed-ups against the same run's k=0 of the bundle itself (its own target alone) and of
the first bundle (the float target alone).

    python tools/drafts_bench.py --bundle distilled=B1 --bundle int8-self=B2 \
        --k 0,4,auto --lookup --prompts tools/data/distill_bench_prompts.jsonl \
        --max-new-tokens 128 --threads 2 --repeats 2 --json docs/results/distill-bench.json

Prompts: JSONL of {"prompt": text} or {"messages": [...]}; messages are rendered with the
target's chat template (`--chat-template-from` a Hugging Face folder, else the first bundle's
tokenizer through transformers); a target without one (a base model) gets the messages'
contents joined by newlines. Greedy. Reports the median and the spread (min–max over
repeats) of each row's speed-up, acceptance and tokens per round, and whether each bundle's
rows give its k=0 tokens (a float target must, exactly; an int8-compute target may part at a
near-tie, docs/design.md §12: the count is reported). Exit 1 if a float target's rows part.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def render(prompts_file: Path, template_source: str) -> list[str]:
    from transformers import AutoTokenizer

    from ssd_distill.data import plain_text

    tok = AutoTokenizer.from_pretrained(template_source)
    out = []
    for line in prompts_file.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if "messages" in item and getattr(tok, "chat_template", None):
            out.append(tok.apply_chat_template(item["messages"], add_generation_prompt=True,
                                               tokenize=False))
        elif "messages" in item:        # a base model: as ssd-distill encodes its prompts
            out.append(plain_text(item["messages"]))
        else:
            out.append(item["prompt"])
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--k", default="0,4,auto")
    p.add_argument("--lookup", action="store_true",
                   help="also a row of lookup drafts alone (k=auto) on the first bundle")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--chat-template-from", default=None)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--sources", default="fused",
                   help="draft sources of the k > 0 rows, comma-separated: fused (the model's "
                        "drafts and lookup's, by cost), model (the draft model's alone)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from ssd_runtime import Generator

    bundles = dict(b.split("=", 1) for b in args.bundle)
    first = next(iter(bundles.values()))
    prompts = render(args.prompts, args.chat_template_from or str(Path(first) / "tokenizer"))
    ks = [int(k) if k != "auto" else "auto" for k in args.k.split(",")]
    gens = {name: Generator.load(path, threads=args.threads) for name, path in bundles.items()}
    first_name = next(iter(bundles))
    if 0 not in ks:
        ks = [0, *ks]                              # every bundle's own target alone
    sources = args.sources.split(",")
    configs = [(name, k, source) for name in bundles for k in ks
               for source in (["model"] if k == 0 else sources)]
    float_target = {name: _target_quant(path) == "none" for name, path in bundles.items()}
    if args.lookup:
        configs.append((first_name, "auto", "lookup"))
    for name, k, source in configs:                                  # warm-up
        gens[name].generate(prompts[0], max_new_tokens=8, k=k, draft_source=source)
    rows = {c: [] for c in configs}                # per repeat: (tokens, seconds, stats)
    reference: dict[tuple[str, int], list[int]] = {}      # (bundle, prompt) -> its tokens
    parted = {name: 0 for name in bundles}
    t0 = time.monotonic()
    for r in range(args.repeats):
        per = {c: [0, 0.0, 0, 0, 0] for c in configs}   # tokens, seconds, drafted, accepted, rounds
        for i, prompt in enumerate(prompts):
            shift = (r * len(prompts) + i) % len(configs)
            for c in configs[shift:] + configs[:shift]:
                name, k, source = c
                res = gens[name].generate(prompt, max_new_tokens=args.max_new_tokens, k=k,
                                          draft_source=source)
                s = res.stats
                acc = per[c]
                acc[0] += s.new_tokens
                acc[1] += s.seconds["total"]
                acc[2] += s.drafted
                acc[3] += s.accepted
                acc[4] += s.rounds
                ref = reference.setdefault((name, i), res.token_ids)
                if res.token_ids[:len(ref)] != ref[:len(res.token_ids)]:
                    parted[name] += 1
                    print(f"parted from the bundle's first run: {c} prompt {i}",
                          file=sys.stderr)
        for c in configs:
            rows[c].append(per[c])
        print(f"repeat {r + 1}/{args.repeats} done ({time.monotonic() - t0:.0f} s)",
              file=sys.stderr, flush=True)
    def speeds(c):
        return [acc[0] / acc[1] for acc in rows[c]]

    report = []
    for c in configs:
        tps = speeds(c)
        speed = [t / b for t, b in zip(tps, speeds((c[0], 0, "model")))]
        vs_first = [t / b for t, b in zip(tps, speeds((first_name, 0, "model")))]
        alpha = [acc[3] / acc[2] if acc[2] else None for acc in rows[c]]
        per_round = [acc[0] / acc[4] if acc[4] else None for acc in rows[c]]
        report.append({"draft": c[0], "k": c[1], "source": c[2],
                       "tokens_per_s": round(statistics.median(tps), 1),
                       "speedup": round(statistics.median(speed), 3),
                       "speedup_range": [round(min(speed), 3), round(max(speed), 3)],
                       "vs_first_target": round(statistics.median(vs_first), 3),
                       "acceptance": None if alpha[0] is None else round(
                           statistics.median(a for a in alpha if a is not None), 3),
                       "tokens_per_round": None if per_round[0] is None else round(
                           statistics.median(x for x in per_round if x is not None), 2)})
    print(f"{'bundle':<22} {'k':>5} {'source':<7} {'tok/s':>8} {'x own k=0':>9} "
          f"{'range':>13} {'x first':>7} {'accept':>7} {'tok/round':>9}")
    for row in report:
        lo, hi = row["speedup_range"]
        print(f"{row['draft']:<22} {str(row['k']):>5} {row['source']:<7} "
              f"{row['tokens_per_s']:>8} {row['speedup']:>9} {f'{lo}-{hi}':>13} "
              f"{row['vs_first_target']:>7} {str(row['acceptance']):>7} "
              f"{str(row['tokens_per_round']):>9}")
    runs = args.repeats * len(prompts)
    for name in bundles:
        kind = "float target" if float_target[name] else "quantized target"
        print(f"{name}: {parted[name]} of {runs * (sum(c[0] == name for c in configs) - 1)} runs parted from its k=0 tokens "
              f"({kind})")
    exact = not any(parted[n] for n in bundles if float_target[n])
    if args.json:
        args.json.write_text(json.dumps({
            "bundles": bundles, "prompts": str(args.prompts), "n_prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens, "threads": args.threads,
            "repeats": args.repeats, "date": time.strftime("%Y-%m-%d"), "exact": exact,
            "parted": parted,
            "rows": report}, indent=2) + "\n")
    return 0 if exact else 1


def _target_quant(bundle: str) -> str:
    manifest = json.loads((Path(bundle) / "manifest.json").read_text())
    return manifest["models"]["target"].get("quant") or "none"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
