"""`distill_head(config)`, `ssd-distill --kind head`: the target writes its own answers with
this project's runtime (answers.py) into the answer cache (cache.py) → their features at the
cost of a prefill (features.py) → a plan for the time budget from rates measured here
(plan.py) → a draft vocabulary covering the answers (corpus.py) → an EAGLE-3 head started from
the target's last layer (head_init.py) → train with K unrolled steps (ttt.py) → agreement per
step on held-out prompts of another source → the pair's worth (export) → the SafeAILab layout
and its card. Reads top to bottom (docs/distill.md §8–§9).

The answers, labels and features stay in the cache (reused by later runs on the same
target); the run's own state (settings, plan, checkpoints) is built in `OUTPUT.partial/`,
which `--resume` continues; the head folder appears at OUTPUT only when complete.
"""
from __future__ import annotations

import gc
import json
import math
import os
import platform
import resource
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ssd_graphs.eagle3 import Eagle3Head, is_head, save_safeailab
from ssd_runtime.errors import ConfigError, SsdError

from . import answers as ans
from .cache import AnswerCache, target_identity
from .card import head_card
from .config import DistillConfig, Preset
from .corpus import Corpus, draft_vocabulary
from .data import Rows
from .features import make_features
from .head_data import aux_layer_ids, check_layers
from .head_init import head_config, init_from_target
from .memory import ANSWER_CONTEXT, ANSWER_SLOTS, check_memory
from .pipeline import Log, check_paths, load_target, publish, read_texts, run_key
from .plan import Plan, Rates, describe, make_plan, parse_budget, parse_data_budget
from .probe import autocast, measure
from .prompts import (DOCSTRINGS, HELDOUT, SHIPPED, TEXT, Prompt, docstring_texts, interleave,
                      read_prompt_file, shipped, text_prompts, user_turn_opening)
from .train import train
from .ttt import agreement, loss, to_device

SELF_SHARE = 1 / 3       # of a chat model's answers, to its own questions (Magpie)
MEASURE_S = 30.0         # seconds of answering (and of prefill) that measure a rate
CHECK_S = 180.0          # kept in a budget for the pair's worth (an export of target + head)
LADDER = (1024, 2048, 4096, 8192, 16384, 32768, 65536)   # draft vocabulary sizes tried
MAX_LM_SHARE = 0.5       # of a drafted token's weights, the draft vocabulary's LM head at most


def distill_head(config: DistillConfig) -> dict:
    """Train an EAGLE-3 head for `config.target` at `config.output`; return the card's facts."""
    log = Log(config.quiet)
    preset = config.settings
    out = config.output.absolute()
    work = out.with_name(out.name + ".partial")
    if out.exists() and not is_head(out):
        raise ConfigError(f"output {out} exists and holds something other than an EAGLE-3 "
                          f"head. ---> HINT: choose another --output; ssd-distill replaces "
                          f"(--force) only a head folder it wrote.")
    # another target's cache is refused first, by name, before anything is loaded or written
    cache = AnswerCache(config.cache or out.with_name(out.name + ".answers"),
                        target_identity(config.target))
    check_paths(config, out, work)
    budget_s = parse_budget(preset.budget) if preset.budget else None
    data_budget = parse_data_budget(config.data_budget) if config.data_budget else (None, None)
    torch.set_num_threads(config.threads or max(1, os.cpu_count() or 1))
    user = read_prompt_file(config.prompts) if config.prompts is not None else None
    texts = read_texts(config.data)
    log.stage("load the target")
    target, tokenizer = load_target(config.target)
    n_layers = int(target.config.num_hidden_layers)
    layer_ids = aux_layer_ids(n_layers)
    check_layers(layer_ids, n_layers, config.target)
    need = check_memory(target, preset, config.preset, "head")
    log.line(f"the head reads the target's layers {layer_ids}; the run needs about "
             f"{need / 2**30:.1f} GiB at its peak (estimated); answers cached in {cache.root}")
    if not config.resume:
        work.mkdir(parents=True)
        (work / "run.json").write_text(json.dumps(run_key(config), indent=2))
    held = [target]          # handed over, so that the pair's worth runs without it in memory
    del target
    try:
        cache.ensure()
        return _distill_head(config, preset, held, tokenizer, user, texts, layer_ids, cache,
                             budget_s, data_budget, out, work, log)
    except ConfigError:      # a refusal after the start: nothing of this run is kept but
        if not config.resume:    # the cache's complete parts
            shutil.rmtree(work, ignore_errors=True)
        raise


def _distill_head(config: DistillConfig, preset: Preset, models: list, tokenizer,
                  user: list[Prompt] | None, texts: list[str], layer_ids: list[int],
                  cache: AnswerCache, budget_s: float | None, data_budget, out: Path,
                  work: Path, log: Log) -> dict:
    target = models.pop()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    vocab, hidden = int(target.config.vocab_size), int(target.config.hidden_size)
    width = len(layer_ids) * hidden
    chat = user_turn_opening(tokenizer) is not None

    log.stage("the bundle that writes the answers (this project's runtime)")
    context = min(ANSWER_CONTEXT, int(getattr(target.config, "max_position_embeddings", None)
                                      or ANSWER_CONTEXT))
    exporting = ans.must_export(cache, config.answers_bundle, config.answers_quant)
    if exporting:            # the export loads the target itself: not held twice meanwhile
        del target
        gc.collect()
    bundle = ans.answer_bundle(cache, config.target, config.answers_bundle,
                               config.answers_quant, context, ANSWER_SLOTS,
                               device.type == "cuda", log)
    if exporting:
        target, _ = load_target(config.target)
    gen = ans.open_generator(bundle, ANSWER_SLOTS, config.threads)
    if gen.manifest.target.vocab_size != vocab:
        raise ConfigError(f"--answers-bundle {bundle} has a vocabulary of "
                          f"{gen.manifest.target.vocab_size}, the target {vocab}. ---> HINT: "
                          f"give the bundle exported from this target.")
    runtime_labels = ans.float_answers(gen)
    log.line(f"{bundle}: target {gen.manifest.target.quant} weights on {gen.backend}, "
             f"{gen.max_batch} sequences at a time; labels from "
             + ("its log-probabilities (the float target's)" if runtime_labels else
                "the float target's prefill (a quantized target's are not the float's)"))
    new_tokens = min(preset.new_tokens, gen.manifest.max_context - preset.max_prompt)
    if new_tokens < 1:
        raise ConfigError(f"--answers-bundle {bundle} serves {gen.manifest.max_context} tokens, "
                          f"fewer than a prompt's {preset.max_prompt}. ---> HINT: re-export it "
                          f"with a larger --max-context.")
    bpt = width * 2 + 4 + 6 * ans.TOP       # cache bytes per token, about
    settings = ans.AnswerPlan(answers=0, max_new_tokens=new_tokens, max_prompt=preset.max_prompt,
                              greedy_share=preset.greedy_share, part_size=preset.part_size,
                              budget_positions=data_budget[1], budget_bytes=data_budget[0])

    log.stage("held-out answers (prompts of another source, never trained on)")
    held_prompts = shipped(HELDOUT)[:preset.heldout_prompts]
    held_plan = replace(settings, answers=len(held_prompts), budget_positions=None,
                        budget_bytes=None)
    wrote = ans.write_answers(gen, cache, ans.queue(held_prompts, tokenizer, held_plan,
                                                    config.seed + 7),
                              held_plan, {HELDOUT}, False, bpt, log.bar("held-out answers"))
    log.stage("their features (a prefill of the float target)")
    target.to(device)                 # on a GPU the prefill runs there, under autocast
    f_tokens, f_seconds = make_features(target, cache, layer_ids, not runtime_labels,
                                        log.bar("features"))
    held = Corpus(cache, {HELDOUT}, False, width, preset.max_prompt + new_tokens)

    sources = _train_prompts(config, user, texts, chat)
    if budget_s is not None and not config.resume and min(wrote.seconds, f_seconds) < MEASURE_S:
        log.stage("a first part of answers and features: the held-out ones were cached, and "
                  "this machine's rates are measured now")
        _, per_source = cache.known()
        have = sum(a for s, (a, _) in per_source.items() if s != HELDOUT)
        first = replace(settings, answers=have + preset.part_size)
        wrote = ans.write_answers(gen, cache, ans.queue(interleave(sources, config.seed),
                                                        tokenizer, first, config.seed),
                                  first, {HELDOUT}, True, bpt, log.bar("answers"))
        f_tokens, f_seconds = make_features(target, cache, layer_ids, not runtime_labels,
                                            log.bar("features"))
    # training's steps are timed with the answering bundle closed: beside its sessions they
    # would set the run's peak (docs/distill.md §9, "Gemma 3 270M's hour again")
    del gen
    gc.collect()
    rates = measure(cache, wrote, f_tokens, f_seconds, held, target, layer_ids, preset, device,
                    SELF_SHARE if chat and user is None else 0.0, budget_s is not None)
    gen = ans.open_generator(bundle, ANSWER_SLOTS, config.threads)
    plan = _plan(config, preset, budget_s, cache, rates, data_budget[1], work, log)
    if chat and user is None:
        log.stage("the model's own questions (Magpie)")
        questions = ans.self_questions(gen, tokenizer, cache, math.ceil(plan.answers * SELF_SHARE),
                                       config.seed, log.bar("questions"))
        sources.append(questions)
        log.line(f"{len(questions)} questions of its own")
    prompts = interleave(sources, config.seed)
    log.stage(f"the target answers {len(prompts):,} prompts ({ans.prompt_info(prompts)})")
    train_plan = replace(settings, answers=plan.answers)
    wrote_train = ans.write_answers(gen, cache, ans.queue(prompts, tokenizer, train_plan,
                                                          config.seed),
                                    train_plan, {HELDOUT}, True, bpt, log.bar("answers"))
    if wrote_train.stopped:
        log.line(f"stopped writing answers: {wrote_train.stopped}")
    del gen                  # the answering bundle's sessions: training does not need them
    gc.collect()
    log.stage("their features")
    make_features(target, cache, layer_ids, not runtime_labels, log.bar("features"))
    corpus = Corpus(cache, {HELDOUT}, True, width, preset.max_prompt + new_tokens)
    if corpus.positions < preset.min_tokens:
        raise ConfigError(f"too little to train on: {corpus.positions} answer positions, the "
                          f"{config.preset} preset needs at least {preset.min_tokens}. ---> "
                          f"HINT: give more prompts (--prompts), a larger --budget or "
                          f"--data-budget.")

    log.stage("the draft vocabulary")
    layer = 3 * hidden + 4 * hidden + 3 * _inter(target)   # a drafted token's layer weights
    ladder = tuple(n for n in LADDER if n < vocab and n / (n + layer) <= MAX_LM_SHARE) \
        or (min(LADDER[0], vocab),)                  # by cost: the LM head at most half
    ids, d2t, t2d, covered = draft_vocabulary(corpus, vocab, preset.head_tokens,
                                              preset.coverage, ladder)
    lm_share = len(ids) / (len(ids) + layer)
    log.line(f"{len(ids):,} of {vocab:,} tokens, counted on half the answers, make up "
             f"{covered:.1%} of the other half's tokens; the LM head over them is "
             f"{lm_share:.0%} of a drafted token's weights")

    head = _head(config, target, ids, d2t, t2d, layer_ids, device, log)
    target_params = sum(p.numel() for p in target.parameters())
    embed = target.get_input_embeddings().weight.numel()
    del target               # training needs the head alone (the embedding it shares stays);
    gc.collect()             # the pair's worth exports from the target's folder
    before = _agreement(head, held, preset, device)
    epochs = plan.epochs if preset.steps is None else preset.epochs
    left = (budget_s - (time.monotonic() - log.t0)) if budget_s else preset.train_budget_s
    run = replace(preset, epochs=epochs, train_budget_s=max(60.0, left * 0.97),
                  steps=preset.steps or corpus.steps(epochs, preset.batch))
    log.stage(f"train {run.ttt_steps} unrolled steps on {device} ({plan.precision}): "
              f"{corpus.positions:,} positions, {epochs:.3g} epoch(s)")
    params = [p for p in head.parameters() if p.requires_grad]
    draft_of = torch.full((vocab,), -1, dtype=torch.long)                 # target id -> draft id
    draft_of[torch.tensor(ids)] = torch.arange(len(ids))
    draft_of, t2d_dev = draft_of.to(device), t2d.to(device)

    def loss_fn(batch: Rows) -> torch.Tensor:
        with autocast(device, plan.precision):
            return loss(head, to_device(batch, device), run.ttt_steps, t2d_dev, draft_of)

    result = train(head, params, corpus, run, loss_fn, config.seed + 1, work / "checkpoint.pt",
                   config.resume, log.bar("train"))
    if result.stopped_early:
        log.line(f"the time budget stopped training at step {result.steps}/"
                 f"{result.planned_steps} (recorded in the card)")

    log.stage("held-out agreement")
    per_step = agreement(head, held, run.ttt_steps, run.batch, device)
    rates_after = [round(a / max(n, 1), 4) for a, n in per_step]
    reach = float(t2d[torch.from_numpy(held.answer_tokens().astype("int64"))].float().mean()) \
        if len(held) else 0.0
    log.line("teacher-forced top-1 agreement on held-out answers, step by step: "
             + ", ".join(f"{r:.3f}" for r in rates_after) + f" ({per_step[0][1]:,} positions; "
             f"before training: " + ", ".join(f"{r:.3f}" for r in before) + ")")

    head_dir = work / "head"
    shutil.rmtree(head_dir, ignore_errors=True)
    head.cpu()
    save_safeailab(head, head.config, head_dir)
    n_params = sum(p.numel() for p in params)
    card = {
        "kind": "head", "target": config.target, "preset": config.preset,
        "settings": asdict(run), "seed": config.seed, "threads": torch.get_num_threads(),
        "device": str(device), "aux_layer_ids": layer_ids, "head_init": config.head_init,
        "draft_vocab_size": len(ids), "vocab_size": vocab, "draft_vocab_coverage": round(covered, 4),
        "parameters": n_params, "target_parameters": target_params,
        # a drafted token reads the layer and lm_head (fc: once per accepted row), the target
        # every parameter but its embedding table: their ratio is the matmul-bound cost
        "cost_ratio": round((n_params - head.fc.weight.numel()) / (target_params - embed), 4),
        "bytes": (head_dir / "model.safetensors").stat().st_size,
        "data": {"cache": str(cache.root), "cache_bytes": cache.size(),
                 "bundle": str(bundle), "answers_quant": "none" if runtime_labels else "quantized",
                 "labels": "runtime" if runtime_labels else "prefill",
                 "sources": {s: {"answers": a, "positions": p}
                             for s, (a, p) in corpus.sources.items()},
                 "answers": len(corpus), "positions": corpus.positions,
                 "heldout_sources": {s: {"answers": a, "positions": p}
                                     for s, (a, p) in held.sources.items()},
                 "new_answers": wrote_train.answers, "new_positions": wrote_train.positions,
                 "answer_seconds": round(wrote_train.seconds, 1),
                 "stopped": wrote_train.stopped, "max_new_tokens": new_tokens},
        "rates": asdict(rates), "plan": plan.as_dict(), "train": asdict(result),
        "heldout": {"positions": per_step[0][1], "agreement": rates_after,
                    "agreement_before_training": before, "draft_vocab_coverage": round(reach, 4),
                    "counts": [list(c) for c in per_step], "source": HELDOUT},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "command": "ssd-distill " + " ".join(sys.argv[1:]) if sys.argv[0].endswith(
            "ssd-distill") else None,
    }
    if config.check:
        log.stage("the pair's worth: export target + head and measure c")
        try:
            card["worth"] = _worth(config, head_dir, tokenizer, corpus, held, context, log)
        except SsdError as exc:      # the head is made: say why it was not measured, keep it
            card["worth"] = {"note": f"the export failed: {exc}"}
            log.line(f"the pair's worth was not measured: {exc}")
    card["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    card["total_seconds"] = round(time.monotonic() - log.t0, 1)
    (head_dir / "distill.json").write_text(json.dumps(card, indent=2) + "\n")
    (head_dir / "README.md").write_text(head_card(card))
    publish(head_dir, out, config.force)
    shutil.rmtree(work, ignore_errors=True)
    log.line(f"ssd-distill: wrote {out} in {card['total_seconds']:.0f} s (peak RSS "
             f"{card['peak_rss_gib']} GiB); its answers stay in {cache.root} (--cache reuses "
             f"them)")
    return card


def _train_prompts(config: DistillConfig, user: list[Prompt] | None, texts: list[str],
                   chat: bool) -> list[list[Prompt]]:
    """The training prompts' groups: the user's file, or the shipped requests and requests
    about the standard library's docstrings; requests about --data text in both cases."""
    groups = [user] if user is not None else [
        shipped(SHIPPED), text_prompts(docstring_texts(), DOCSTRINGS, chat, config.seed)]
    if texts:
        groups.append(text_prompts(texts, TEXT, chat, config.seed))
    return groups


def _plan(config: DistillConfig, preset: Preset, budget_s: float | None, cache: AnswerCache,
          rates: Rates, most_positions: int | None, work: Path, log: Log) -> Plan:
    """The budget's plan (printed), or the preset's fixed counts; a resumed run keeps the plan
    it started with (work/plan.json)."""
    saved = work / "plan.json"
    if config.resume and saved.exists():
        plan = Plan(**json.loads(saved.read_text()))
        log.line(f"the interrupted run's plan: {plan.answers:,} answers, {plan.epochs:.3g} "
                 f"epoch(s)")
        return plan
    _, per_source = cache.known()
    held_positions = sum(p for s, (_, p) in per_source.items() if s != HELDOUT)
    if budget_s is None:
        plan = Plan(answers=preset.prompts, new_positions=0, positions=held_positions,
                    epochs=preset.epochs, answer_s=0.0, feature_s=0.0, train_s=0.0, budget_s=0.0,
                    note="fixed counts (no --budget)", precision=rates.precision)
        log.line(f"{plan.answers:,} answers, {plan.epochs:.3g} epoch(s) (fixed: no --budget)")
    else:
        if not rates.answer or not rates.feature:
            raise ConfigError("--budget: this run wrote too little to measure this machine's "
                              "rates and the cache recorded none. ---> HINT: give --answers N "
                              "instead of --budget.")
        unfeatured = sum(cache.read(n).tokens for n in cache.parts()
                         if not cache.features_path(n).exists())
        heldout = per_source.get(HELDOUT, (0, 0))[1]      # --data-budget bounds them all
        most = None if most_positions is None else max(0, most_positions - heldout)
        plan = make_plan(budget_s, time.monotonic() - log.t0, rates, held_positions,
                         unfeatured, config.epochs, most,
                         CHECK_S if config.check else 0.0)
        log.stage("the plan")
        for line in describe(plan, rates, time.monotonic() - log.t0):
            log.line(line)
    saved.write_text(json.dumps(asdict(plan)) + "\n")
    return plan


def _head(config: DistillConfig, target, ids: list[int], d2t: torch.Tensor, t2d: torch.Tensor,
          layer_ids: list[int], device, log: Log) -> Eagle3Head:
    """The head over the draft vocabulary, started from the target's last layer (or as
    SafeAILab's, --head-init random); the embedding is the target's, frozen."""
    torch.manual_seed(config.seed)
    head = Eagle3Head(head_config(target.config, len(ids), layer_ids),
                      embed_weight=target.get_input_embeddings().weight)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    if config.head_init == "target":
        done = init_from_target(head, target, ids)
        log.line(f"the head starts from the target's last layer: {', '.join(done)}")
    return head.to(device)


def _agreement(head: Eagle3Head, held: Corpus, preset: Preset, device) -> list[float]:
    counts = agreement(head, held, preset.ttt_steps, preset.batch, device)
    return [round(a / max(n, 1), 4) for a, n in counts]


def _inter(target) -> int:
    return int(getattr(target.config, "intermediate_size", None)
               or 4 * int(target.config.hidden_size))


def _worth(config: DistillConfig, head_dir: Path, tokenizer, corpus: Corpus, held: Corpus,
           context: int, log: Log) -> dict:
    """Export target + head as ssd-export would and read the pair's worth it measures: the
    deployed graphs' agreement on the held-out answers, the cost c of a drafted token, the
    predicted speed-up. The export's calibration text holds out its last tenth: the held-out
    answers, after nine times as many training answers."""
    import tempfile

    from ssd_export.config import ExportConfig
    from ssd_export.pipeline import export_bundle

    calib = head_dir.parent / "calib.jsonl"
    n = len(held)
    texts = [_text(tokenizer, corpus, i) for i in range(min(len(corpus), 9 * n))]
    texts += [_text(tokenizer, held, i) for i in range(n)]
    calib.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    keep = config.bundle is not None
    bundle = config.bundle if keep else Path(tempfile.mkdtemp(prefix="ssd-distill-")) / "b"
    try:
        manifest = export_bundle(ExportConfig(target=config.target, draft=str(head_dir),
                                              output=bundle, force=keep, quiet=True,
                                              max_batch=16 if keep else 1,
                                              max_context=context, calib=str(calib)))
        worth = dict(manifest.pair_worth or {})
        if keep:
            worth["bundle"] = str(bundle)
        log.line(f"pair worth: agreement {worth.get('agreement')}, c = {worth.get('c')}, "
                 f"predicted {worth.get('speedup')}x at k = {worth.get('best_k')}")
        return worth
    finally:
        if not keep:
            shutil.rmtree(bundle.parent, ignore_errors=True)


def _text(tokenizer, corpus: Corpus, i: int) -> str:
    p, s, pl, al, _ = corpus.rows[i].tolist()
    return tokenizer.decode(corpus.ids[p][s:s + pl + al].tolist())
