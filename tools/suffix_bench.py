"""Drafts from earlier requests (issue 57): an agentic-like workload, side by side.

    python tools/suffix_bench.py BUNDLE [--files 10] [--requests 40] [--max-new-tokens 256]
                                        [--concurrency 16] [--json OUT]

The workload, made here and seeded: `--requests` chat requests through the bundle's chat
template (runtime/text.ChatTemplate, as ssd-serve renders them), in a shuffled order that
interleaves two kinds an agent sends over and over:
- code edits: a slice of whole top-level statements of one of `--files` standard-library files
  (120-200 tokens), with one of four instructions (rename a function, add a comment line at
  the top, rename a parameter, return it unchanged after a review), each file edited several
  times;
- tool calls: the same tool schema in the system prompt and a different user question each
  time, answered as the tool call's JSON.

Modes, each on a Generator of its own (what k="auto" learns, and the suffix index, carry over
the requests as in a server, but not from one mode into another), every request run in every
mode before the next request (the order rotating), greedy:
  k=0             the target alone
  fused auto      today's drafting: the request's own lookup and the draft model
  suffix auto     the same with earlier requests' text (draft_source="suffix")
Reported: tokens/s (tokens over decode seconds summed), speed-up over fused auto and k=0,
accepted tokens per round, the share of drafts from earlier requests and their acceptance, and
whether every answer is the target alone's (it must be).

`--concurrency N` also runs the same requests N at a time (up to the bundle's max_batch slots)
through `generate_batch` in every mode, tokens/s over wall seconds.

`--memory N` instead feeds N requests' worth of text (consecutive 300-900-token pieces of
the standard library, tokenised by the bundle, as prompt and answer) into a SuffixStore of
`--budget-mb`, and reports its bytes, the process's RSS growth, and the time an add and a
find take.
"""
from __future__ import annotations

import argparse
import ast
import json
import random
import sysconfig
import time
from pathlib import Path

from ssd_runtime import Generator
from ssd_runtime.text import ChatTemplate

FILES = ("bisect.py", "colorsys.py", "fnmatch.py", "shlex.py", "glob.py", "heapq.py",
         "textwrap.py", "genericpath.py", "copy.py", "base64.py")
EDITS = ("Rename the function `{name}` to `{name}_v2`, including where it is called. Return "
         "the whole code with that change, nothing else.",
         "Add the comment line `# Reviewed.` at the very top of this code. Return the whole "
         "code with that change, nothing else.",
         "Rename the first parameter of `{name}` to `value` in its body too. Return the whole "
         "code with that change, nothing else.",
         "Review this code. If it is correct, return it unchanged, nothing else.")
TOOLS = ("You can call one tool. Answer only with a JSON object "
         '{"name": "get_weather", "arguments": {"city": <string>, "unit": "celsius" or '
         '"fahrenheit", "days": <integer>}} and nothing else.')
CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Austin", "Perth", "Quito", "Seoul",
          "Milan", "Dakar", "Hanoi", "Bergen", "Porto", "Denver", "Kyoto", "Nairobi", "Turin",
          "Zagreb", "Halifax")
QUESTIONS = ("What will the weather be in {city} for the next {days} days, in {unit}?",
             "Give me the {unit} forecast for {city}, {days} days ahead.",
             "I'm travelling to {city}. Forecast for {days} days please, {unit}.")
MODES = (("k=0", 0, "fused"), ("lookup auto", "auto", "lookup"), ("suffix auto", "auto", "suffix"),
         ("fused auto", "auto", "fused"), ("fused+suffix auto", "auto", "fused+suffix"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--memory", type=int, default=0)
    ap.add_argument("--budget-mb", type=float, default=64.0)
    args = ap.parse_args()
    if args.memory:
        report = memory(args.bundle, args.memory, args.budget_mb)
        print(json.dumps(report, indent=1))
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")
        return
    gens = {label: Generator.load(args.bundle, threads=args.threads) for label, *_ in MODES}
    first = next(iter(gens.values()))
    requests = workload(first, args.files, args.requests, args.seed)
    report = {"bundle": args.bundle, "requests": len(requests),
              "kinds": {kind: sum(r[0] == kind for r in requests) for kind in ("edit", "tool")},
              "max_new_tokens": args.max_new_tokens, "one_at_a_time": one_at_a_time(
                  gens, requests, args.max_new_tokens)}
    if args.concurrency:
        del gens
        report["concurrent"] = concurrent(args.bundle, args.threads, requests,
                                          args.max_new_tokens, args.concurrency)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


def workload(gen: Generator, files: int, count: int, seed: int) -> list[tuple[str, list[int]]]:
    """(kind, prompt ids) per request, in a shuffled order: half code edits over `files`
    files, half tool calls."""
    rng = random.Random(seed)
    template = ChatTemplate(gen.codec)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    slices = [_slice(gen, (stdlib / name).read_text()) for name in FILES[:files]]
    edits = [("edit", template.prompt_ids([{"role": "user", "content": EDITS[i % len(EDITS)]
                                            .format(name=name) + f"\n\n```python\n{code}```"}]))
             for i, (code, name) in ((i, slices[i % len(slices)]) for i in range(count // 2))]
    tools = [("tool", template.prompt_ids([
        {"role": "system", "content": TOOLS},
        {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)].format(
            city=CITIES[i % len(CITIES)], days=1 + (7 * i) % 10,
            unit=("celsius", "fahrenheit")[i % 2])}])) for i in range(count - count // 2)]
    requests = edits + tools
    rng.shuffle(requests)
    return requests


def one_at_a_time(gens: dict[str, Generator], requests, max_new_tokens: int) -> dict:
    totals = {label: {"tokens": 0, "seconds": 0.0, "rounds": 0, "accepted": 0, "drafted": 0,
                      "earlier_drafted": 0, "earlier_accepted": 0, "lookup_drafted": 0}
              for label, *_ in MODES}
    same = 0
    for i, (_, ids) in enumerate(requests):
        outputs = {}
        for label, k, source in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
            res = gens[label].generate(ids, max_new_tokens=max_new_tokens, k=k,
                                       draft_source=source)
            s, t = res.stats, totals[label]
            t["tokens"] += s.new_tokens
            t["seconds"] += s.seconds["decode"]
            for name in ("rounds", "accepted", "drafted", "earlier_drafted",
                         "earlier_accepted", "lookup_drafted"):
                t[name] += getattr(s, name)
            outputs[label] = res.token_ids
        same += len({tuple(o) for o in outputs.values()}) == 1
        print(f"request {i + 1}/{len(requests)}: "
              + "  ".join(f"{label} {t['tokens'] / t['seconds']:.1f} tok/s"
                          for label, t in totals.items()), flush=True)
    return _summary(totals, same, len(requests))


def concurrent(bundle: str, threads, requests, max_new_tokens: int, n: int) -> dict:
    """The same requests through generate_batch, n at a time, each mode on its own
    generator; tokens/s over wall seconds."""
    out = {}
    tokens: dict[str, list] = {}
    for label, k, source in MODES:
        gen = Generator.load(bundle, threads=threads, max_batch=min(n, _max_batch(bundle)))
        gen.generate_batch([ids for _, ids in requests[:2]], max_new_tokens=8, k=k,
                           draft_source=source, tenant="warm-up")      # warm-up, not counted
        t0 = time.perf_counter()
        results = gen.generate_batch([ids for _, ids in requests], max_new_tokens=max_new_tokens,
                                     k=k, draft_source=source)
        wall = time.perf_counter() - t0
        produced = sum(r.stats.new_tokens for r in results)
        out[label] = {"slots": gen.max_batch, "tokens": produced, "wall_s": round(wall, 2),
                      "tokens_per_s": round(produced / wall, 1),
                      "earlier_drafted": sum(r.stats.earlier_drafted for r in results)}
        tokens[label] = [r.token_ids for r in results]
        del gen
    base = out["k=0"]["tokens_per_s"]
    for row in out.values():
        row["x_k0"] = round(row["tokens_per_s"] / base, 3)
    out["identical"] = all(tokens[label] == tokens["k=0"] for label in tokens)
    return out


def _summary(totals: dict, same: int, count: int) -> dict:
    rows = {}
    for label, t in totals.items():
        rows[label] = {"tokens": t["tokens"], "decode_s": round(t["seconds"], 2),
                       "tokens_per_s": round(t["tokens"] / t["seconds"], 1),
                       "accepted_per_round": round(t["accepted"] / max(1, t["rounds"]), 3),
                       "drafted": t["drafted"], "accepted": t["accepted"],
                       "lookup_drafted": t["lookup_drafted"],
                       "earlier_drafted": t["earlier_drafted"],
                       "earlier_acceptance": round(t["earlier_accepted"]
                                                   / max(1, t["earlier_drafted"]), 3)}
    for row in rows.values():
        row["x_k0"] = round(row["tokens_per_s"] / rows["k=0"]["tokens_per_s"], 3)
        row["x_fused_auto"] = round(row["tokens_per_s"] / rows["fused auto"]["tokens_per_s"], 3)
    return {"modes": rows, "identical_answers": f"{same}/{count}"}


def memory(bundle: str, count: int, budget_mb: float) -> dict:
    """RSS and the store's own bytes over `count` requests' text (see the module's text)."""
    from ssd_runtime.round.suffix import SuffixStore
    from ssd_runtime.text import TextCodec
    from ssd_runtime.manifest import read_manifest

    codec = TextCodec(Path(bundle), read_manifest(Path(bundle), verify=False).tokenizer)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text() for p in sorted(stdlib.glob("*.py"))[:120])
    ids = codec.tokens(text)
    rng = random.Random(0)
    store = SuffixStore(int(budget_mb * (1 << 20)))
    before, peak, adds, finds, at = _rss(), 0, [], [], 0
    for i in range(count):
        size = rng.randrange(300, 900)
        if at + size > len(ids):
            at = 0
        piece = ids[at:at + size]
        t0 = time.perf_counter()
        store.add(f"tenant-{i % 4}", piece)
        adds.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.find(f"tenant-{i % 4}", piece[:rng.randrange(20, 200)], 8)
        finds.append(time.perf_counter() - t0)
        at += size // 2                      # half of it again next time: text repeats
        if i % 100 == 99:
            peak = max(peak, _rss())
    summary = store.summary()
    return {"requests": count, "budget_bytes": summary["budget"], "store_bytes": summary["bytes"],
            "kept_requests": summary["requests"], "evicted": summary["evicted"],
            "rss_growth_mb": round((peak - before) / (1 << 20), 1),
            "add_ms_median": round(1e3 * sorted(adds)[len(adds) // 2], 3),
            "find_us_median": round(1e6 * sorted(finds)[len(finds) // 2], 1),
            "find_us_p99": round(1e6 * sorted(finds)[int(len(finds) * 0.99)], 1)}


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _max_batch(bundle: str) -> int:
    return json.loads((Path(bundle) / "manifest.json").read_text()).get("max_batch", 1)


def _slice(gen: Generator, source: str, lo: int = 120, hi: int = 200) -> tuple[str, str]:
    """Whole top-level statements from a function on, lo..hi tokens, and that function's name
    (the first such run in the file; else the file's first hi tokens' lines)."""
    body = ast.parse(source).body
    lines = source.splitlines(keepends=True)
    for start, head in enumerate(body):
        if not isinstance(head, ast.FunctionDef) or head.name.startswith("_"):
            continue
        code = ""
        for node in body[start:]:
            more = "".join(lines[head.lineno - 1:node.end_lineno])
            if len(gen.encode(more)) > hi:
                break
            code = more
        if len(gen.encode(code)) >= lo:
            return code.rstrip("\n") + "\n", head.name
    head = next(n for n in body if isinstance(n, ast.FunctionDef))
    return "".join(lines[head.lineno - 1:head.end_lineno]), head.name


if __name__ == "__main__":
    main()
