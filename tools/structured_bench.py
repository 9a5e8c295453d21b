"""Structured outputs (issues 45, 57): constrained speculation, with and without the tokens the
grammar forces, against the constrained target alone and against free text.

    python tools/structured_bench.py BUNDLE [--cases extraction|code] [--rounds 8]
        [--max-new-tokens 128] [--threads N] [--json OUT]

`extraction` (the default): four chat requests through the bundle's template, each asking for
a JSON object of a schema of its own (a person, an invoice, an event, a review) filled from a
sentence. `code`: the eight code-like raw prompts of issue 45, a three-property schema each.
Every configuration runs every case once a round, in an order that turns each round, so a
slow spell of the shared machine lands on all of them; per round, each configuration's tokens
per second over all cases (their tokens over their decode seconds) and its ratio to the same
round's constrained auto without forced tokens ("today": what structured outputs ran before
forced tokens). Configurations: constrained auto and k=0, each with forced tokens (`+forced`)
and without; free text at auto and k=0 (no format, the same prompt, as many tokens as the
constrained answer, ignore_eos). Every constrained answer is checked identical to constrained
k=0 without forced tokens, token for token, and valid (exit 1 if not). Greedy, then seeded
sampling (T 0.8, the invariant coupling). Prints the median and range over rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ssd_runtime import Generator
from ssd_runtime.text import ChatTemplate

S = {"type": "string", "maxLength": 12}
I = {"type": "integer", "minimum": 0, "maximum": 9999}
B = {"type": "boolean"}
CODE = [
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


def _text(n: int) -> dict:
    return {"type": "string", "maxLength": n}


EXTRACTION = [
    ("Maria Lopez, 34, moved to Lisbon last year; write to her at maria.lopez@example.com.",
     {"full_name": _text(24), "age": {"type": "integer", "minimum": 0, "maximum": 120},
      "city": _text(20), "email_address": _text(40)}),
    ("Invoice INV-2024-0193 from Northwind Traders: 1250 EUR, due on 2024-03-15.",
     {"invoice_number": _text(16), "vendor_name": _text(24),
      "total_amount": {"type": "integer", "minimum": 0, "maximum": 100000},
      "currency": {"enum": ["EUR", "USD", "GBP"]}, "due_date": _text(10)}),
    ("The Annual Robotics Meetup is on 12 May 2025 at the Berlin Convention Center; 250 "
     "attendees are expected.",
     {"event_title": _text(32), "event_date": _text(16), "venue": _text(32),
      "expected_attendees": {"type": "integer", "minimum": 0, "maximum": 100000}}),
    ("Review: the AquaPure 300 water filter is quiet and easy to install, but the cartridges "
     "are expensive. Four stars.",
     {"product_name": _text(24), "rating": {"type": "integer", "minimum": 1, "maximum": 5},
      "sentiment": {"enum": ["positive", "negative", "mixed"]},
      "pros": {"type": "array", "items": _text(24), "maxItems": 3},
      "cons": {"type": "array", "items": _text(24), "maxItems": 3}}),
]
CONFIGS = {             # name: (k, response format?, forced tokens?)
    "auto": ("auto", True, False), "auto+forced": ("auto", True, True),
    "k0": (0, True, False), "k0+forced": (0, True, True),
    "free auto": ("auto", False, False), "free k0": (0, False, False),
}
TODAY = "auto"


def schema_of(props: dict) -> dict:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


def valid(text: str, props: dict) -> bool:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return isinstance(value, dict) and set(value) == set(props)


def cases(gen: Generator, which: str) -> list[tuple[str, list[int] | str, dict, object]]:
    """(label, prompt, properties, constraint) per case."""
    if which == "code":
        chosen = [(p[:20], p, props) for p, props in CODE]
    else:
        template = ChatTemplate(gen.codec)
        chosen = [(text[:20], template.prompt_ids([{"role": "user", "content":
                  f"Extract the fields {', '.join(props)} from this text as JSON.\n\n{text}"}]),
                   props) for text, props in EXTRACTION]
    return [(label, prompt, props, gen.constraint(
        {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                "schema": schema_of(props)}}))
            for label, prompt, props in chosen]


def run(gen: Generator, chosen: list, setting: dict, rounds: int, max_new: int) -> dict:
    """Every configuration over every case, `rounds` times (after a round that warms up),
    the order turning each round; per configuration and round, tokens, seconds and loop
    rounds. The reference answers (constrained k=0 without forced tokens) come first."""
    names = list(CONFIGS)
    figures: dict[str, list[tuple[int, float, int]]] = {n: [] for n in names}
    answers = {label: gen.generate(prompt, max_new, k=0, response_format=constraint,
                                   forced_tokens=False, **setting)
               for label, prompt, _, constraint in chosen}
    problems = [f"{label}: not valid: {res.text!r}" for (label, _, props, _), res
                in zip(chosen, answers.values()) if not valid(res.text, props)]
    for r in range(rounds + 1):
        spent = {n: [0, 0.0, 0] for n in names}
        for c, (label, prompt, props, constraint) in enumerate(chosen):
            shift = (r + c) % len(names)
            reference = answers[label].token_ids
            for name in names[shift:] + names[:shift]:
                k, constrained, forced = CONFIGS[name]
                if constrained:
                    res = gen.generate(prompt, max_new, k=k, response_format=constraint,
                                       forced_tokens=forced, **setting)
                    if res.token_ids != reference:
                        problems.append(f"{label}: {name} differs from constrained k=0")
                else:
                    res = gen.generate(prompt, len(reference), k=k, ignore_eos=True, **setting)
                s = spent[name]
                s[0] += len(res.token_ids)
                s[1] += res.stats.seconds["decode"]
                s[2] += res.stats.rounds
        if r:                                     # the first round warms up
            for name in names:
                figures[name].append(tuple(spent[name]))
    return {"rounds": figures, "problems": sorted(set(problems)),
            "answers": {label: res.text for label, res in answers.items()}}


def summary(figures: dict) -> dict:
    """Per configuration: tokens/s per round, its ratio to the same round's TODAY, and the
    median and range of each; loop rounds per case."""
    out = {}
    today = [t / s for t, s, _ in figures[TODAY]]
    for name, rows in figures.items():
        rates = [t / s for t, s, _ in rows]
        ratios = [a / b for a, b in zip(rates, today)]
        out[name] = {"tokens_per_s": rates, "median_tokens_per_s": statistics.median(rates),
                     "vs_today": ratios, "median_vs_today": statistics.median(ratios),
                     "range_vs_today": [min(ratios), max(ratios)],
                     "tokens": rows[0][0], "loop_rounds": rows[0][2]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--cases", choices=("extraction", "code"), default="extraction")
    ap.add_argument("--rounds", type=int, default=8, help="counted rounds (one more warms up)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every round's figures here")
    args = ap.parse_args()
    gen = Generator.load(args.bundle, threads=args.threads)
    chosen = cases(gen, args.cases)
    report = {"command": " ".join(["python", "tools/structured_bench.py", *sys.argv[1:]]),
              "date": time.strftime("%Y-%m-%d %H:%M"), "bundle": args.bundle,
              "threads": f"{gen.target.threads}:{gen.draft.threads}", "cases": args.cases,
              "settings": {}}
    bad = False
    for name, setting in (("greedy", {}), ("seeded T 0.8", {"temperature": 0.8, "seed": 1})):
        result = run(gen, chosen, setting, args.rounds, args.max_new_tokens)
        table = summary(result["rounds"])
        report["settings"][name] = {"summary": table, "problems": result["problems"],
                                    "answers": result["answers"]}
        bad |= bool(result["problems"])
        print(f"{name}: {len(chosen)} cases, {args.rounds} rounds; answers identical to "
              f"constrained k=0 and valid: {'no: ' + '; '.join(result['problems']) if result['problems'] else 'yes'}")
        for config, row in table.items():
            lo, hi = row["range_vs_today"]
            print(f"  {config:12} {row['median_tokens_per_s']:7.1f} tok/s  "
                  f"{row['median_vs_today']:.2f}x today [{lo:.2f}-{hi:.2f}]  "
                  f"{row['tokens']} tokens in {row['loop_rounds']} rounds")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
