"""The target writes its own training data (docs/distill.md §9): this project's runtime decodes
its answers to the prompts in batches (`Generator.generate_batch`, k = 0: the target alone), a
share greedy and the rest sampled as ssd-serve would sample them, each answer position with
the target's top-20 log-probabilities, into the answer cache (cache.py), one part at a time.

The bundle is exported once per cache from the Hugging Face target (the float target by
default: its answers and log-probabilities are the float target's own, the ones the head is
trained to guess), or given (`--answers-bundle`).
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ssd_runtime.errors import ConfigError

from .cache import AnswerCache, Part
from .prompts import SELF, Prompt, encode, key, user_turn_opening

TOP = 20                   # labels kept per position: the runtime's most (round/logprobs.py)
SELF_FILE = "self-questions.json"
SELF_TOKENS = 96           # a question's most tokens; longer ones ramble and are dropped
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class AnswerPlan:
    answers: int              # answers wanted in the cache (held ones count)
    max_new_tokens: int       # an answer's most tokens
    max_prompt: int           # a prompt's most tokens (longer ones are skipped)
    greedy_share: float       # answers decoded greedily; the rest sampled
    part_size: int            # answers per part (one generate_batch call)
    budget_positions: int | None = None   # --data-budget: the cache's most answer positions
    budget_bytes: int | None = None       # ... or its most bytes (features included)


@dataclass
class Written:
    answers: int = 0
    positions: int = 0
    tokens: int = 0           # prompt + answer tokens of the new answers
    seconds: float = 0.0
    stopped: str = ""         # why fewer answers than planned were written, if so


def answer_export(target: str, output: Path, quant: str, max_context: int, max_batch: int,
                  cuda: bool):
    """The export of the bundle that writes the answers. The target is its own draft: k = 0
    never drafts, but a bundle has one. On the CPU that draft's weights are int4, so the
    session that never runs holds an eighth of a float copy (docs/distill.md §9, "Gemma 3
    270M's hour again"); on a GPU it stays float, since int4 weights are a CPU kernel here
    and would keep the bundle off the GPU."""
    from ssd_export.config import ExportConfig

    return ExportConfig(target=target, draft=target, output=output, max_context=max_context,
                        max_batch=max_batch, quiet=True, quant=quant,
                        draft_quant="none" if cuda else "int4")


def must_export(cache: AnswerCache, given: Path | None, quant: str) -> bool:
    """Whether `answer_bundle` exports: no bundle given, and none of these weights cached."""
    manifest = cache.bundle / "manifest.json"
    return given is None and (not manifest.exists() or json.loads(manifest.read_text())[
        "models"]["target"].get("quant", "none") != quant)


def answer_bundle(cache: AnswerCache, target: str, given: Path | None, quant: str,
                  max_context: int, max_batch: int, cuda: bool, log) -> Path:
    """The bundle that writes the answers: `given`, or the cache's own, exported once from
    the target (`answer_export`)."""
    if given is not None:
        if not (Path(given) / "manifest.json").exists():
            raise ConfigError(f"--answers-bundle {given} is not a bundle (no manifest.json). "
                              f"---> HINT: give a folder written by ssd-export, or drop "
                              f"--answers-bundle to export one into the cache.")
        return Path(given)
    bundle = cache.bundle
    if not must_export(cache, given, quant):
        return bundle
    shutil.rmtree(bundle, ignore_errors=True)
    from ssd_export.pipeline import export_bundle

    tmp = bundle.with_name("bundle.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.monotonic()
    log.line(f"exporting the target ({quant if quant != 'none' else 'float'} weights) into "
             f"{bundle}, once for this cache")
    export_bundle(answer_export(target, tmp, quant, max_context, max_batch, cuda))
    tmp.rename(bundle)
    log.line(f"exported in {time.monotonic() - start:.0f} s")
    return bundle


def open_generator(bundle: Path, max_batch: int, threads: int | None):
    """The runtime over `bundle`, max_batch sequences at a time (fewer if the bundle was
    exported for fewer)."""
    from ssd_runtime import Generator
    from ssd_runtime.manifest import read_manifest

    slots = min(max_batch, read_manifest(bundle, verify=False).max_batch)
    return Generator.load(bundle, max_batch=slots, threads=threads)


def float_answers(gen) -> bool:
    """Whether the bundle's target is the float target (its log-probabilities label the
    answers); a quantized one's answers are labelled by the float target's prefill."""
    return gen.manifest.target.quant == "none"


def self_questions(gen, tokenizer, cache: AnswerCache, wanted: int, seed: int,
                   progress: Progress) -> list[Prompt]:
    """Up to `wanted` requests written by a chat model itself (Magpie): given its template's
    opening of a user turn and nothing else, it writes what a user would ask; sampled at
    temperature 1, kept when the turn ends within SELF_TOKENS, deduplicated. Kept in the
    cache: a later run reuses them and asks for more only if it needs more."""
    opening = user_turn_opening(tokenizer)
    if opening is None or wanted <= 0:
        return []
    path = cache.root / SELF_FILE
    state = json.loads(path.read_text()) if path.exists() else {"attempts": 0, "questions": []}
    questions: list[str] = state["questions"]
    ids = list(tokenizer(opening, add_special_tokens=False)["input_ids"])
    batch = max(gen.max_batch, 8)
    start = time.monotonic()
    # a model that rarely ends its turn gets four tries per question wanted, then stops asking
    while len(questions) < wanted and state["attempts"] < 4 * wanted:
        asks = [{"prompt": ids, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                 "seed": seed * 1_000_003 + state["attempts"] + i, "max_new_tokens": SELF_TOKENS}
                for i in range(batch)]
        state["attempts"] += batch
        for result in gen.generate_batch(asks, k=0):
            text = result.text.strip()
            if result.stop_reason == "eos" and 12 <= len(text) and text not in questions:
                questions.append(text)
        cache.write_json(path, state)
        progress(min(len(questions), wanted), wanted,
                 f"{state['attempts']} asked, {time.monotonic() - start:.0f} s")
    return [Prompt(SELF, q) for q in questions[:wanted]]


def queue(prompts: list[Prompt], tokenizer, plan: AnswerPlan, seed: int
          ) -> list[tuple[Prompt, list[int], str, int]]:
    """(prompt, ids, mode, seed) for each answer to write, in order: the prompts cycled until
    `plan.answers`, each round's answers greedy for a share and sampled for the rest."""
    encoded = [(p, encode(tokenizer, p)) for p in prompts]
    encoded = [(p, ids) for p, ids in encoded if 0 < len(ids) <= plan.max_prompt]
    if not encoded:
        return []
    out, seen = [], set()
    i = 0
    while len(out) < plan.answers and i < plan.answers * 4:
        p, ids = encoded[i % len(encoded)]
        greedy = (i * 7919 % 1000) / 1000 < plan.greedy_share
        mode = "greedy" if greedy else "sampled"
        answer_seed = seed * 1_000_003 + i
        k = key(ids, mode if greedy else f"sampled-{answer_seed}")
        if k not in seen:
            seen.add(k)
            out.append((p, ids, mode, answer_seed))
        i += 1
    return out


def write_answers(gen, cache: AnswerCache, items: list, plan: AnswerPlan, sources: set[str],
                  exclude: bool, bytes_per_token: float, progress: Progress) -> Written:
    """Answer the items the cache does not hold yet until it holds `plan.answers` answers of
    `sources` (with `exclude`: of every other source) or a --data-budget bound would be
    passed: one continuous batch over the runtime's slots (a sequence joins as another
    ends), a part written every `plan.part_size` answers."""
    held_keys, per_source = cache.known()
    held = sum(a for s, (a, _) in per_source.items() if (s in sources) != exclude)
    held_positions = sum(p for a, p in per_source.values())
    todo = [it for it in items if _item_key(it) not in held_keys]
    todo = iter(todo[:max(0, plan.answers - held)])
    total = held + max(0, min(plan.answers - held, len(items)))
    written = Written()
    labels = float_answers(gen)
    sample = gen.defaults(openai=True)           # how ssd-serve samples an unset request
    start = time.monotonic()
    live: dict[int, tuple] = {}
    done: list[tuple] = []
    written.stopped = _over_budget(cache, plan, held_positions, plan.part_size
                                   * plan.max_new_tokens, bytes_per_token)

    def save(chunk: list[tuple]) -> None:
        part = _part([it for it, _ in chunk], [r for _, r in chunk], labels)
        cache.write(cache.next_name(), part)
        written.answers += len(chunk)
        written.positions += part.positions
        written.tokens += part.tokens
        written.seconds = time.monotonic() - start

    with gen.batch(k=0) as batch:
        while True:
            while not written.stopped and len(live) < gen.max_batch + 2:
                item = next(todo, None)
                if item is None:
                    break
                _, ids, mode, seed = item
                settings = ({"temperature": 0.0} if mode == "greedy" else
                            {"temperature": sample["temperature"] or 1.0, "seed": seed,
                             "top_p": sample["top_p"], "top_k": sample["top_k"]})
                live[batch.add(ids, plan.max_new_tokens, pieces=False, logprobs=TOP,
                               **settings)] = item
            if not live:
                break
            for event in batch.step():
                if event.result is None or event.id not in live:
                    continue
                item = live.pop(event.id)
                if event.result.stop_reason in ("error", "cancelled"):
                    continue
                done.append((item, event.result))
                made = written.positions + sum(len(r.token_ids) for _, r in done)
                progress(held + written.answers + len(done), total,
                         f"{made / max(time.monotonic() - start, 1e-6):,.0f} tok/s")
            while len(done) >= plan.part_size and not written.stopped:
                save(done[:plan.part_size])
                done = done[plan.part_size:]
                written.stopped = _over_budget(cache, plan, held_positions + written.positions,
                                               plan.part_size * plan.max_new_tokens,
                                               bytes_per_token)
            if written.stopped:
                for seq_id in list(live):
                    batch.cancel(seq_id)
                live.clear()
        if done and not written.stopped:
            save(done)
    return written


def _item_key(item) -> str:
    _, ids, mode, seed = item
    return key(ids, mode if mode == "greedy" else f"sampled-{seed}")


def _over_budget(cache: AnswerCache, plan: AnswerPlan, positions: int, next_positions: int,
                 bytes_per_token: float) -> str:
    """Why the next part would pass a --data-budget bound, or ''."""
    if plan.budget_positions is not None and positions >= plan.budget_positions:
        return f"the data budget of {plan.budget_positions:,} positions is reached"
    if plan.budget_bytes is not None:
        need = cache.size() + next_positions * 1.5 * bytes_per_token   # answers and prompts
        if need > plan.budget_bytes:
            return (f"the data budget of {plan.budget_bytes / 2**20:,.0f} MiB would be passed "
                    f"(the cache holds {cache.size() / 2**20:,.0f} MiB)")
    return ""


def _part(chunk: list, results: list, labels: bool) -> Part:
    """A part from the items and their results; an answer's label j is the distribution its
    token j was decoded from."""
    ids, prompt_len, answer_len, top_ids, top_logp, meta = [], [], [], [], [], []
    for (prompt, p_ids, mode, seed), r in zip(chunk, results):
        ids += p_ids + r.token_ids
        prompt_len.append(len(p_ids))
        answer_len.append(len(r.token_ids))
        if labels:
            for lp in r.logprobs or []:
                top_ids.append([t for t, _ in lp.top])
                top_logp.append([v for _, v in lp.top])
        meta.append({"source": prompt.source, "mode": mode, "key": _item_key(
            (prompt, p_ids, mode, seed)), "stop": r.stop_reason})
    n = int(sum(answer_len))
    return Part(np.array(prompt_len, np.int32), np.array(answer_len, np.int32),
                np.array(ids, np.int32),
                np.array(top_ids, np.int32).reshape(n, TOP) if labels else None,
                np.array(top_logp, np.float16).reshape(n, TOP) if labels else None, meta)


def prompt_info(prompts: list[Prompt]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in prompts:
        out[p.source] = out.get(p.source, 0) + 1
    return out
