"""Structured outputs, predictions and logprobs on a backend against the CPU provider's k=0.

    python tools/gpu_outputs.py BUNDLE [--backend cuda] [--rows 4] [--max-new-tokens 48]

Issue 45's features on a GPU (tools/gpu_check.sh step g). Every run asks for logprobs=5. The
references are the bundle on backend="cpu" at k=0, each prompt alone; on --backend (loaded
with max_batch = --rows) each case runs at k=0 and k=auto, alone and as one `generate_batch`
of the --rows prompts:
  json    response_format = a JSON schema (an object of a boolean, an enum and an integer),
          greedy and seeded (temperature 0.8, seed 7 + the prompt's index): every finished
          output must parse and follow the schema;
  free    no format, greedy and seeded: the logprobs' case;
  predict greedy and seeded at k=4 and auto with `prediction` = the CPU's k=0 output of the
          same settings (right) and its first half followed by other text (half right), alone
          and in a batch:
          accepted and drafted prediction tokens, output against the run without one.
A line per case says how many rows equal the CPU's k=0 and the backend's own k=0 (alone for a
row alone, batched for a batch); for the first parted row, the token where it parts and the
reference's log-probability margin there between its token and the row's (a near-tie when
small). Logprobs: the largest difference from the
CPU's over the tokens both emitted before parting (limit 1e-3). Exit 1 when speculation
differs from the backend's own k=0 (exactness), a prediction changes the output, an output
does not follow its schema, a logprob differs by more than 1e-3, or a session is not on the
backend's provider; a CUDA-vs-CPU parting alone is reported, not failed (kernels round
differently, so a near-tie may go the other way).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gpu_tokens import PROMPTS, SAMPLED, providers_ok

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "color", "n"],
          "properties": {"ok": {"type": "boolean"},
                         "color": {"enum": ["red", "green", "blue"]},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA,
                                                 "strict": True}}
TOP = 5                       # alternatives per token asked for: the margin at a parting
LOGPROB_TOL = 1e-3
HALF_WRONG = "\n# something else entirely\npass\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    args = p.parse_args(argv)
    from ssd_runtime import Generator

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.rows)]
    n = args.max_new_tokens
    settings = {"greedy": lambda i: {}, "seeded": lambda i: dict(seed=7 + i, **SAMPLED)}
    formats = {"json": FORMAT, "free": None}
    cpu = Generator.load(args.bundle, backend="cpu")
    refs = {(f, s): [cpu.generate(x, max_new_tokens=n, k=0, logprobs=TOP, response_format=fmt,
                                  **extra(i)) for i, x in enumerate(prompts)]
            for f, fmt in formats.items() for s, extra in settings.items()}
    print(f"reference: cpu k=0, {len(prompts)} prompts, {n} new tokens, logprobs={TOP}")
    del cpu
    gen = Generator.load(args.bundle, backend=args.backend, max_batch=args.rows)
    bad = providers_ok(gen, args.backend)
    print(f"{args.backend}: {gen.backend_reason}")
    for (f, s), ref in refs.items():
        fmt, extra = formats[f], settings[s]
        own: dict[str, list] = {}          # this backend's k=0, alone and batched
        for k in (0, "auto"):
            alone = [gen.generate(x, max_new_tokens=n, k=k, logprobs=TOP, response_format=fmt,
                                  **extra(i)) for i, x in enumerate(prompts)]
            batch = gen.generate_batch([{"prompt": x, "logprobs": TOP, "response_format": fmt,
                                         **extra(i)} for i, x in enumerate(prompts)],
                                       max_new_tokens=n, k=k)
            for how, got in (("alone", alone), (f"batch of {len(prompts)}", batch)):
                own.setdefault(how, got)
                bad += compare(f"{f} {s} {how} k={k}", got, ref, own[how], fmt is not None)
    bad += predictions(gen, prompts, {s: refs[("free", s)] for s in settings}, settings, n)
    print(f"failures: {bad}")
    return 1 if bad else 0


def compare(label: str, got: list, ref: list, own: list, check_json: bool) -> int:
    """One line for a case; returns the failures (exactness, schema, logprobs)."""
    cpu_same = sum(g.token_ids == r.token_ids for g, r in zip(got, ref))
    own_same = sum(g.token_ids == o.token_ids for g, o in zip(got, own))
    fails = len(got) - own_same      # speculation must be its own k=0 (alone: alone's; batch: batch's)
    worst = max(logprob_gap(g, r) for g, r in zip(got, ref))
    fails += worst > LOGPROB_TOL
    line = (f"  {label:30} {cpu_same}/{len(got)} equal to cpu's k=0, {own_same}/{len(got)} "
            f"to its own k=0; logprobs within {worst:.1e} of cpu's")
    if check_json:
        finished = [g for g in got if g.stop_reason == "eos"]
        invalid = [g.text for g in finished if not valid(g.text)]
        fails += len(invalid)
        line += f"; json: {len(finished) - len(invalid)}/{len(got)} valid"
        line += f" ({len(got) - len(finished)} unfinished)" if len(finished) < len(got) else ""
        line += f"; INVALID: {invalid[0]!r}" if invalid else ""
    for whose, refs in (("cpu", ref), ("own", own)):
        parted = next((i for i, (g, r) in enumerate(zip(got, refs))
                       if g.token_ids != r.token_ids), None)
        if parted is not None:
            line += f" | {whose}: " + parting(parted, got[parted], refs[parted])
    print(line)
    return fails


def predictions(gen, prompts: list[str], refs: dict, settings: dict, n: int) -> int:
    """A right (the CPU's k=0 output with the same settings) and a half-right prediction at k=4
    and auto: the output must stay the run's without one; print the prediction tokens drafted
    and accepted."""
    fails = 0
    for s, extra in settings.items():
        for k in (4, "auto"):
            plain = [gen.generate(x, max_new_tokens=n, k=k, **extra(i)).token_ids
                     for i, x in enumerate(prompts)]
            for kind, guess in (("right", lambda r: r.text),
                                ("half right", lambda r: r.text[:len(r.text) // 2] + HALF_WRONG)):
                guesses = [guess(r) for r in refs[s]]
                alone = [gen.generate(x, max_new_tokens=n, k=k, prediction=g, **extra(i))
                         for i, (x, g) in enumerate(zip(prompts, guesses))]
                batch = gen.generate_batch([{"prompt": x, "prediction": g, **extra(i)}
                                            for i, (x, g) in enumerate(zip(prompts, guesses))],
                                           max_new_tokens=n, k=k)
                for label, got in (("alone", alone), (f"batch of {len(prompts)}", batch)):
                    same = sum(g.token_ids == q for g, q in zip(got, plain))
                    drafted = sum(g.stats.prediction_drafted for g in got)
                    accepted = sum(g.stats.prediction_accepted for g in got)
                    fails += len(got) - same
                    print(f"  predict {kind:10} {s} {label:10} k={k:<4} {same}/{len(got)} equal "
                          f"to the run without it; prediction tokens accepted {accepted}, "
                          f"rejected {drafted - accepted} of {drafted} drafted")
    return fails


def logprob_gap(got, ref) -> float:
    """The largest |logprob difference| over the tokens both emitted before they part."""
    gap = 0.0
    for a, b in zip(got.logprobs or [], ref.logprobs or []):
        if a.token != b.token:
            break
        gap = max(gap, abs(a.logprob - b.logprob))
    return gap


def parting(row: int, got, ref) -> str:
    """Where a row parts from a reference, and the reference's log-probability margin there
    between its token and the row's (a near-tie when small)."""
    g, r = got.token_ids, ref.token_ids
    at = next((j for j, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
    where = f"row {row} parts at token {at}: {g[at:at + 3]} against {r[at:at + 3]}"
    if at < min(len(g), len(r)) and ref.logprobs and at < len(ref.logprobs):
        mine = ref.logprobs[at]
        other = dict(mine.top).get(g[at])
        where += (f", margin {mine.logprob - other:.2e}" if other is not None
                  else f", the row's token not in the reference's top {TOP}")
    return where


def valid(text: str) -> bool:
    try:
        value = json.loads(text)
    except ValueError:
        return False
    return (isinstance(value, dict) and set(value) == {"ok", "color", "n"}
            and isinstance(value["ok"], bool) and value["color"] in ("red", "green", "blue")
            and isinstance(value["n"], int) and not isinstance(value["n"], bool)
            and 0 <= value["n"] <= 99)


if __name__ == "__main__":
    sys.exit(main())
