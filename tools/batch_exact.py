"""Batches against each request alone: every request of a batch, greedy and sampled with its own
seed, at each k, equals the same request decoded alone at k = 0 (the exactness a batch promises,
docs/design.md §5, §11, §12), on any bundle, real models included.

    python tools/batch_exact.py BUNDLE --prompts FILE.jsonl [--rows 4] [--ks 2,4,auto]
                                [--tokens 128] [--json OUT]

--prompts: JSONL with a "prompt" (text; render chats through their template first, as in
tools/data/exact_chat_prompts.jsonl). The prompts go in batches of --rows, in order. Prints the
requests that differ; exit status 1 if any does.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--ks", default="2,4,auto")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    from ssd_runtime import Generator

    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines()
               if line.strip()]
    ks = [k if k == "auto" else int(k) for k in args.ks.split(",")]
    gen = Generator.load(args.bundle, max_batch=args.rows)
    same = total = drafted = 0
    differ = []
    for start in range(0, len(prompts), args.rows):
        group = prompts[start:start + args.rows]
        for label, setting in (("greedy", {}), ("sampled", {"temperature": 1.0})):
            alone = [gen.generate(text, max_new_tokens=args.tokens, k=0, seed=11 + i,
                                  **setting).token_ids for i, text in enumerate(group)]
            for k in ks:
                batch = gen.generate_batch([dict(prompt=text, seed=11 + i, **setting)
                                            for i, text in enumerate(group)],
                                           max_new_tokens=args.tokens, k=k)
                for i, (expected, got) in enumerate(zip(alone, batch)):
                    total += 1
                    drafted += got.stats.drafted
                    if got.token_ids == expected:
                        same += 1
                    else:
                        differ.append({"prompt": start + i, "setting": label, "k": k})
                        print(f"prompt {start + i}, {label}, k={k}: differs from k=0 alone",
                              file=sys.stderr)
    print(f"{args.bundle}: {same} of {total} requests in batches of {args.rows} equal to the "
          f"request alone at k=0 ({drafted} tokens drafted)")
    if args.json:
        args.json.write_text(json.dumps({"bundle": str(args.bundle), "rows": args.rows,
                                         "ks": [str(k) for k in ks], "tokens": args.tokens,
                                         "requests": total, "equal": same,
                                         "drafted": drafted, "differ": differ}, indent=1) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
