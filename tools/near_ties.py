"""Where speculative output leaves k=0's on a bundle, and how close to a tie the target was.

    python tools/near_ties.py BUNDLE [--prompts FILE.jsonl] [--tokens 128] [--ks 4,auto]
                              [--seeds 3] [--json out.json]

A target whose kernels give a row slightly different logits alone (k=0) than among the k+1
rows of a verification (int8 activations, docs/design.md §12) can make the two outputs part
at a near-tie. For each prompt (ssd-bench's by default) and each k: greedy, and sampled at
temperature 1 with a few seeds, against k=0 with the same settings; at the first differing
token, for greedy runs, the gap between the two tokens' logits in the target's k=0 row (a
sampled run parts where its draw falls between the two computations' probabilities, which
says nothing of the logits). Reports how many runs and generated tokens agree, and where
they part.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ssd_runtime import Generator
from ssd_runtime.backends import cpu_session
from ssd_runtime.bench import load_prompts


def gap_at(session, prompt: list[int], expected: list[int], found: list[int]) -> tuple[int, float]:
    """(first differing index, |logit difference| of the two tokens there, at k=0's row)."""
    at = next(i for i, (a, b) in enumerate(zip(expected, found)) if a != b)
    ids = np.asarray(prompt + expected[:at], np.int64)
    session.prefill(ids[:-1], 0)
    logits = session.forward(ids[-1:], len(ids) - 1)[0]
    return at, abs(float(logits[expected[at]] - logits[found[at]]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--prompts")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--ks", default="4,auto")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    gen = Generator.load(args.bundle, backend="cpu")
    session = cpu_session("target", args.bundle, gen.manifest, threads=1)
    ks = [k if k == "auto" else int(k) for k in args.ks.split(",")]
    settings = [("greedy", {})] + [(f"seed {s}", dict(temperature=1.0, seed=s))
                                   for s in range(args.seeds)]
    runs, parted, tokens, agreed, gaps = 0, 0, 0, 0, []
    drafted = {str(k): [0, 0] for k in ks}     # per k: tokens drafted and accepted (a run that
    #                                            drafts nothing checks nothing of the rows)
    for text in load_prompts(args.prompts):
        prompt = gen.encode(text)
        for label, setting in settings:
            expected = gen.generate(prompt, max_new_tokens=args.tokens, k=0, **setting).token_ids
            for k in ks:
                result = gen.generate(prompt, max_new_tokens=args.tokens, k=k, **setting)
                found = result.token_ids
                drafted[str(k)][0] += result.stats.drafted
                drafted[str(k)][1] += result.stats.accepted
                runs += 1
                tokens += len(expected)
                if found == expected:
                    agreed += len(expected)
                    continue
                at, gap = gap_at(session, prompt, expected, found)
                parted += 1
                agreed += at
                gap = round(gap, 4) if label == "greedy" else None
                gaps.append({"prompt": text[:40], "setting": label, "k": k, "at": at,
                             "gap": gap})
                print(f"{label}, k={k}: parts at token {at} of {len(expected)}"
                      + (f", logit gap {gap:.4f}" if gap is not None else "")
                      + f" ({text[:40]!r})")
    scheme = gen.manifest.target.quant_scheme
    summary = {"bundle": str(args.bundle), "target_quant": gen.manifest.target.quant,
               "scheme": scheme, "runs": runs, "parted": parted, "tokens": tokens,
               "tokens_before_parting": agreed, "drafted_accepted": drafted,
               "greedy_max_gap": max((g["gap"] for g in gaps if g["gap"] is not None),
                                     default=None), "where": gaps}
    print(f"{args.bundle}: {runs - parted} of {runs} runs equal k=0's output; {agreed} of "
          f"{tokens} tokens before any parting; largest logit gap where greedy runs part: "
          f"{summary['greedy_max_gap']}; drafted/accepted by k: "
          + ", ".join(f"{k}: {d}/{a}" for k, (d, a) in drafted.items()))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
