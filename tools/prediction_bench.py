"""Predicted outputs (issue 45): tokens/s of the same requests with and without a prediction.

    python tools/prediction_bench.py BUNDLE [--files a.py b.py] [--tokens 400] [--repeat 3]
    python tools/prediction_bench.py BUNDLE --chat [--chat-template-from HF_DIR] \
        [--files a.py ...] [--slice 300:420] [--max-new-tokens 800] [--json OUT]

Completion proxy (default). For each source file (default: a few of this interpreter's
standard library, cut to --tokens tokens): the prompt is the file's first lines, and three
predictions are tried against none (k=auto each): the file's own rest ("original": right where
the model reproduces the file), the target's own greedy output ("exact": an unchanged file),
and that output with every 25th token changed ("edited": a small edit).

Chat code edits (--chat), the issue's workload. For each file a slice of whole top-level
blocks of --slice tokens (at most what the context leaves for the file twice, prompt and
answer), and one chat request through the target's chat template (--chat-template-from a
Hugging Face folder, else the bundle's tokenizer folder, as tools/drafts_bench.py): "Rename the
function X to Y ... return the whole code, nothing else", the slice in a fenced block. Modes:
the target alone (k=0), k=auto without a prediction ("none"), k=auto with the original slice
as OpenAI's `prediction` ("original": the workload), the same in the fence the model answers
in ("fenced": "```python\n" + slice + "```"), and the target's own answer as the prediction
("own answer": the ceiling, a model that returns exactly what the client predicted). Each
mode runs on a generator of its own, so that what k=auto learns carries over its files, as
in a server, but not from one mode into another. Reported per mode: tokens/s, the speed-up
over "none", accepted/rejected prediction tokens; per file: whether each answer is the
target alone's (it must be), and whether the model returned the edited slice ("faithful").

Code edits asked of a base model (--chat --plain: no chat template; Gemma 3 270M here): the
same request as plain text that opens the answer's fence itself ("Here is a Python file: ...
The same file with the function `X` renamed to `Y` ...:\n\n```python\n"), so the answer
is the file itself and "original" is what a client would send.

Every answer is checked against the target alone (k=0) and greedy; tokens/s are decode
seconds summed over the files, the best of --repeat runs.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sysconfig
from pathlib import Path

from ssd_runtime import Generator

DEFAULT_FILES = ("textwrap.py", "bisect.py", "colorsys.py", "keyword.py")
CHAT_FILES = ("bisect.py", "colorsys.py", "fnmatch.py", "shlex.py", "glob.py", "heapq.py")
# (label, k, the prediction from the slice and the target alone's answer)
CHAT_MODES = (("target alone", 0, lambda code, alone: None),
              ("none", "auto", lambda code, alone: None),
              ("original", "auto", lambda code, alone: code),
              ("fenced", "auto", lambda code, alone: f"```python\n{code}```"),
              ("own answer", "auto", lambda code, alone: alone.token_ids))
ASK = ("Rename the function `{old}` to `{new}` in this Python code, including where it is "
       "called. Return the whole code with that change, nothing else.\n\n```python\n{code}```")
ASK_PLAIN = ("Here is a Python file:\n\n```python\n{code}```\n\nThe same file with the "
             "function `{old}` renamed to `{new}`, including where it is called:\n\n```python\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--files", nargs="*")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--prompt-lines", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--chat", action="store_true", help="chat code edits (see above)")
    ap.add_argument("--chat-template-from", default=None)
    ap.add_argument("--plain", action="store_true",
                    help="--chat on a base model: the request as plain text (see above)")
    ap.add_argument("--slice", default="300:420", help="tokens of each file's slice, LO:HI")
    ap.add_argument("--max-new-tokens", type=int, default=800)
    ap.add_argument("--json", type=Path, default=None, help="--chat: per-file results here")
    args = ap.parse_args()
    gen = Generator.load(args.bundle, threads=args.threads)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if args.chat:
        files = args.files or [str(stdlib / name) for name in CHAT_FILES]
        chat_edits(gen, files, args)
    else:
        files = args.files or [str(stdlib / name) for name in DEFAULT_FILES]
        completions(gen, files, args)


def completions(gen: Generator, files: list[str], args: argparse.Namespace) -> None:
    totals: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    produced = 0
    for name in files:
        lines = Path(name).read_text().splitlines(keepends=True)
        prompt = "".join(lines[:args.prompt_lines])
        rest = gen.encode("".join(lines[args.prompt_lines:]))[:args.tokens]
        budget = min(args.tokens, gen.manifest.max_context - len(gen.encode(prompt)) - 1)
        alone = gen.generate(prompt, max_new_tokens=budget, k=0).token_ids
        produced += len(alone)
        edited = [(t + 1) % 256 if i % 25 == 12 else t for i, t in enumerate(alone)]
        for label, prediction in (("none", None), ("original", rest[:budget]),
                                  ("exact", alone), ("edited", edited)):
            best, res = _best(gen, prompt, budget, "auto", prediction, args.repeat)
            assert res.token_ids == alone, f"{name} {label}: not the target alone's"
            totals.setdefault(label, []).append(best)
            c = counts.setdefault(label, [0, 0])
            c[0] += res.stats.prediction_accepted
            c[1] += res.stats.prediction_drafted - res.stats.prediction_accepted
    base = sum(totals["none"])
    print(f"{len(files)} files, {produced} tokens, {gen.backend} ({os.cpu_count()} cores)")
    for label, spent in totals.items():
        accepted, rejected = counts[label]
        print(f"  {label:9s} {produced / sum(spent):8.1f} tok/s  {base / sum(spent):5.2f}x  "
              f"accepted_prediction_tokens {accepted}  rejected {rejected}")


def chat_edits(gen: Generator, files: list[str], args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    template = None if args.plain else AutoTokenizer.from_pretrained(
        args.chat_template_from or str(Path(args.bundle) / "tokenizer"))
    lo, hi = (int(x) for x in args.slice.split(":"))
    rows, asks = [], []
    for name in files:
        code, old = _slice(gen, Path(name).read_text(), lo, hi)
        new = f"{old}_renamed"
        if template is None:
            ids = gen.encode(ASK_PLAIN.format(old=old, new=new, code=code))
        else:
            messages = [{"role": "user", "content": ASK.format(old=old, new=new, code=code)}]
            ids = gen.encode(template.apply_chat_template(messages, add_generation_prompt=True,
                                                          tokenize=False))
        budget = min(args.max_new_tokens, gen.manifest.max_context - len(ids) - 1)
        alone = gen.generate(ids, max_new_tokens=budget, k=0)     # the reference
        asks.append((ids, budget, code, alone))
        rows.append({"file": Path(name).name, "function": old,
                     "slice_tokens": len(gen.encode(code)), "prompt_tokens": len(ids),
                     "max_new_tokens": budget, "answer_tokens": len(alone.token_ids),
                     "stop": alone.stop_reason, "faithful": _faithful(alone.text, code, old, new),
                     "alone_text": alone.text})
    seconds: dict[str, float] = {}
    counts: dict[str, list[int]] = {}
    for label, k, predict in CHAT_MODES:
        # each mode on a generator of its own: what k=auto learns carries over its files (as
        # in a server), not from another mode's
        gen = Generator.load(args.bundle, threads=args.threads)
        seconds[label], counts[label] = 0.0, [0, 0]
        for row, (ids, budget, code, alone) in zip(rows, asks):
            prediction = predict(code, alone)
            best, res = _best(gen, ids, budget, k, prediction, args.repeat)
            accepted = res.stats.prediction_accepted
            rejected = res.stats.prediction_drafted - accepted
            seconds[label] += best
            counts[label][0] += accepted
            counts[label][1] += rejected
            row[label] = {"decode_s": round(best, 3),
                          "tok_s": round(len(res.token_ids) / best, 2),
                          "accepted": accepted, "rejected": rejected,
                          "identical": res.token_ids == alone.token_ids}
    produced = sum(len(alone.token_ids) for *_, alone in asks)
    for row in rows:
        print(f"{row['file']:12s} slice {row['slice_tokens']:3d} tok, answer "
              f"{row['answer_tokens']:3d} ({row['stop']}), faithful {row['faithful']!s:5s} "
              + "  ".join(f"{label} {row[label]['tok_s']:5.1f} tok/s "
                          f"{row[label]['accepted']}/{row[label]['rejected']}"
                          for label, *_ in CHAT_MODES[1:]))
    print(f"{len(files)} files, {produced} answer tokens, {gen.backend} "
          f"({os.cpu_count()} cores), load {os.getloadavg()[0]:.2f}")
    for label, spent in seconds.items():
        accepted, rejected = counts[label]
        print(f"  {label:12s} {produced / spent:7.1f} tok/s  {seconds['none'] / spent:5.2f}x "
              f"none  accepted_prediction_tokens {accepted}  rejected {rejected}")
    same = sum(all(r[label]["identical"] for label in seconds) for r in rows)
    print(f"  identical to the target alone: {same}/{len(rows)}; faithful edits: "
          f"{sum(r['faithful'] for r in rows)}/{len(rows)}")
    if args.json:
        args.json.write_text(json.dumps({"bundle": args.bundle, "files": rows,
                                         "load_after": os.getloadavg()}, indent=1) + "\n")
    if same < len(rows):
        raise SystemExit("an answer differs from the target alone's")


def _best(gen: Generator, prompt, budget: int, k, prediction, repeat: int):
    """The least decode seconds over `repeat` runs, and the last run's result."""
    best = None
    for _ in range(repeat):
        res = gen.generate(prompt, max_new_tokens=budget, k=k, prediction=prediction)
        seconds = res.stats.seconds["decode"]
        best = seconds if best is None else min(best, seconds)
    return best, res


def _slice(gen: Generator, source: str, lo: int, hi: int) -> tuple[str, str]:
    """Consecutive whole top-level statements of `source`, starting at a function or class, as
    many as stay under `hi` tokens (at least `lo`), and the first public top-level function
    defined in them."""
    body = ast.parse(source).body
    lines = source.splitlines(keepends=True)

    def first_line(node: ast.stmt) -> int:
        return min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno]) - 1

    for start, head in enumerate(body):
        if not isinstance(head, (ast.FunctionDef, ast.ClassDef)):
            continue
        code = ""
        for node in body[start:]:
            more = "".join(lines[first_line(head):node.end_lineno])
            if len(gen.encode(more)) > hi:
                break
            code = more
        name = re.search(r"^def ([A-Za-z]\w*)\(", code, re.M)
        if len(gen.encode(code)) >= lo and name:
            return code.rstrip("\n") + "\n", name.group(1)
    raise SystemExit(f"no run of whole statements of {lo}-{hi} tokens in this file")


def _faithful(text: str, code: str, old: str, new: str) -> bool:
    """Whether the answer holds the slice with the function renamed (fences and spacing at
    the ends aside)."""
    edited = re.sub(rf"\b{re.escape(old)}\b", new, code).strip()
    return edited in text


if __name__ == "__main__":
    main()
