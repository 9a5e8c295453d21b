"""Structured outputs (issue 45): constrained speculation against the constrained target alone.

    python tools/structured_bench.py BUNDLE [--max-new-tokens 96] [--threads N]

Eight prompts, each with a JSON schema of its own (bounded fields, so that a small model ends
its object), greedy and seeded sampling: every answer is checked to be the constrained target
alone's (k=0) token for token and to parse and follow its schema; prints tokens/s of
constrained k=auto and k=0, the acceptance, and the grammar mask's cost per judged row.
"""
from __future__ import annotations

import argparse
import json
import time

from ssd_runtime import Generator

S = {"type": "string", "maxLength": 12}
I = {"type": "integer", "minimum": 0, "maximum": 9999}
B = {"type": "boolean"}
CASES = [
    ("def parse_date(text):\n    \"\"\"Return (year, month, day).", {"year": I, "month": I,
                                                                     "day": I}),
    ("# config for the web server\n", {"host": S, "port": I, "debug": B}),
    ("class User:\n    name = ", {"name": S, "age": I, "admin": B}),
    ("import json\nrecord = ", {"id": I, "title": S, "tags": {"type": "array", "items": S,
                                                           "maxItems": 3}}),
    ("def area(w, h):\n    return", {"width": I, "height": I, "unit": {"enum": ["m", "cm"]}}),
    ("# HTTP response\n", {"status": I, "ok": B, "reason": S}),
    ("def version():\n", {"major": I, "minor": I, "patch": I}),
    ("point = ", {"x": I, "y": I, "label": S}),
]


def schema_of(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def valid(text: str, props: dict) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(value) == set(props)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    gen = Generator.load(args.bundle, threads=args.threads)
    for setting in ({}, {"temperature": 0.8, "seed": 1}):
        spent = {0: 0.0, "auto": 0.0, "free": 0.0}
        tokens = valid_count = ended = drafted = accepted = 0
        for prompt, props in CASES:
            fmt = {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                          "schema": schema_of(props)}}
            constraint = gen.constraint(fmt)
            for _ in range(2):          # the second of each: both warm
                alone = gen.generate(prompt, args.max_new_tokens, k=0,
                                     response_format=constraint, **setting)
                res = gen.generate(prompt, args.max_new_tokens, k="auto",
                                   response_format=constraint, **setting)
            assert res.token_ids == alone.token_ids, f"{prompt!r}: not the target alone's"
            spent[0] += alone.stats.seconds["decode"]
            spent["auto"] += res.stats.seconds["decode"]
            free = gen.generate(prompt, len(res.token_ids), k=0, ignore_eos=True, **setting)
            spent["free"] += free.stats.seconds["decode"]
            tokens += len(res.token_ids)
            ended += res.stop_reason == "eos"
            valid_count += valid(res.text, props)
            drafted += res.stats.drafted
            accepted += res.stats.accepted
        name = "greedy" if not setting else f"sampled {setting}"
        print(f"{name}: {len(CASES)} prompts, {tokens} tokens, ended {ended}, valid "
              f"{valid_count}/{len(CASES)}; constrained k=0 {tokens / spent[0]:.0f} tok/s, "
              f"auto {tokens / spent['auto']:.0f} tok/s ({spent[0] / spent['auto']:.2f}x), "
              f"acceptance {accepted / max(drafted, 1):.2f}; unconstrained k=0 "
              f"{tokens / spent['free']:.0f} tok/s over as many tokens")
    matcher = gen.constraint({"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema_of(CASES[0][1])}}).matcher()
    vocab, n = gen.manifest.target.vocab_size, 2000
    start = time.perf_counter()
    for _ in range(n):
        matcher.allowed(vocab, [])
    print(f"mask: {(time.perf_counter() - start) / n * 1e6:.1f} us per judged row "
          f"(vocab {vocab}, no pending tokens)")


if __name__ == "__main__":
    main()
