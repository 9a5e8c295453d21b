"""`distill(config)`: load the target → its answers and labels → the draft's output vocabulary
→ the draft from the target's layers → train → held-out agreement → save → the pair's worth
(export) → card. Reads top to bottom (docs/distill.md).

Everything is built in `OUTPUT.partial/` (labels and checkpoints included), which `--resume`
continues; the draft folder appears at OUTPUT only when complete.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ssd_runtime.errors import ConfigError

from .card import model_card
from .config import DistillConfig, Preset
from .data import Rows, answer, concat, encode_prompt, label_text, read_prompts, read_texts
from .memory import check_memory
from .student import freeze_embeddings, make_student, output_vocab, save_draft
from .train import MIX, agreement, loss_terms, train

MIN_PROMPTS = 4


def distill(config: DistillConfig) -> dict:
    """Make a draft for `config.target` at `config.output`; return the card's facts."""
    log = Log(config.quiet)
    preset = config.settings
    out = config.output.absolute()
    work = out.with_name(out.name + ".partial")
    check_paths(config, out, work)
    torch.set_num_threads(config.threads or max(1, os.cpu_count() or 1))
    prompts, texts = read_inputs(config, preset)
    log.stage("load the target")
    target, tokenizer = load_target(config.target)
    check_memory(target, preset, config.preset)
    if not config.resume:
        work.mkdir(parents=True)
        (work / "run.json").write_text(json.dumps(run_key(config), indent=2))
    try:
        return _distill(config, preset, target, tokenizer, prompts, texts, out, work, log)
    except ConfigError:      # a refusal after the start: nothing of this run is kept
        if not config.resume:
            shutil.rmtree(work, ignore_errors=True)
        raise


def read_inputs(config: DistillConfig, preset: Preset) -> tuple[list, list[str]]:
    """The prompts the target answers (at least MIN_PROMPTS) and the user's texts."""
    prompts = read_prompts(config.prompts)
    if len(prompts) < MIN_PROMPTS:
        raise ConfigError(f"--prompts {config.prompts} has {len(prompts)} prompts; at least "
                          f"{MIN_PROMPTS} are needed (the preset answers {preset.prompts}; "
                          f"fewer are cycled). ---> HINT: add prompts, or leave --prompts out "
                          f"for the shipped 750.")
    return prompts, read_texts(config.data)


def check_enough(rows: Rows, preset: Preset, name: str) -> None:
    if rows.positions < preset.min_tokens:
        raise ConfigError(f"too little text to train on: {rows.positions} labelled "
                          f"positions, the {name} preset needs at least "
                          f"{preset.min_tokens}. ---> HINT: give more prompts (--prompts) or "
                          f"text (--data FILE), or a larger preset.")


CALIB = "calib.jsonl"   # the target's answers, for ssd-export --calib


def _distill(config: DistillConfig, preset: Preset, target, tokenizer, prompts: list,
             texts: list[str], out: Path, work: Path, log: "Log") -> dict:
    t0 = log.t0
    log.stage("the target answers prompts and labels text")
    train_rows, held_rows, data_info = target_rows(config, preset, target, tokenizer, prompts,
                                                   texts, work, log)
    check_enough(train_rows, preset, config.preset)

    log.stage("the draft's output vocabulary and layers")
    vocab = int(target.config.vocab_size)
    keep = sorted({int(t) for t in [*eos_ids(target), *tokenizer.all_special_ids]
                   if 0 <= t < vocab})
    ids = output_vocab(train_rows.argmax, train_rows.top_ids, train_rows.mask, vocab,
                       preset.head_tokens, keep)
    ids_t = None if ids is None else torch.tensor(ids)
    vocab_map = None
    if ids_t is not None:
        vocab_map = torch.full((vocab,), -1, dtype=torch.long)
        vocab_map[ids_t] = torch.arange(len(ids))
        covered = float(torch.isin(train_rows.argmax[train_rows.mask], ids_t).float().mean())
        log.line(f"head over {len(ids):,} of {vocab:,} tokens: they are the target's argmax "
                 f"at {covered:.1%} of training positions")
    student, idx = make_student(target, preset.layers, config.init)
    params = freeze_embeddings(student)
    log.line(f"{len(idx)} layers from the target's {idx}; "
             f"{sum(p.numel() for p in params):,} parameters train")

    log.stage("train")
    def loss_fn(batch: Rows) -> torch.Tensor:
        return loss_terms(student, batch, vocab_map, ids_t, MIX[config.loss])

    result = train(student, params, train_rows, preset, loss_fn, config.seed + 1,
                   work / "checkpoint.pt", config.resume, log.bar("train"))
    if result.stopped_early:
        log.line(f"the train budget of {preset.train_budget_s:.0f} s was hit at step "
                 f"{result.steps}/{result.planned_steps} (recorded in the card)")

    log.stage("held-out agreement")
    agree, total = agreement(student, held_rows, ids_t)
    start_agree = _start_agreement(target, held_rows, ids_t, len(idx), config.init)
    log.line(f"teacher-forced top-1 agreement on {total:,} held-out positions: "
             f"{agree / max(total, 1):.3f} (the copied layers before training: "
             f"{start_agree:.3f})")

    draft_dir = work / "draft"
    shutil.rmtree(draft_dir, ignore_errors=True)
    save_draft(student, tokenizer, draft_dir, ids)
    calib = _write_calibration(tokenizer, train_rows, held_rows, draft_dir / CALIB)
    card = {
        "target": config.target, "preset": config.preset, "settings": asdict(preset),
        "loss": config.loss, "init": config.init, "seed": config.seed,
        "threads": torch.get_num_threads(), "layers": idx,
        "architecture": type(student).__name__,
        "parameters": sum(p.numel() for p in student.parameters()),
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "head_tokens": len(ids) if ids else vocab, "vocab_size": vocab,
        "data": data_info, "train": asdict(result),
        "heldout": {"positions": total, "agreement": round(agree / max(total, 1), 4),
                    "agreement_before_training": round(start_agree, 4)},
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "command": "ssd-distill " + " ".join(sys.argv[1:]) if sys.argv[0].endswith(
            "ssd-distill") else None,
    }
    del target
    if config.check:
        log.stage("the pair's worth: export and time the bundle")
        card["worth"] = _worth(config, draft_dir, calib, log)
    card["total_seconds"] = round(time.monotonic() - t0, 1)
    (draft_dir / "distill.json").write_text(json.dumps(card, indent=2) + "\n")
    (draft_dir / "README.md").write_text(model_card(card))
    publish(draft_dir, out, config.force)
    shutil.rmtree(work, ignore_errors=True)
    log.line(f"ssd-distill: wrote {out} in {card['total_seconds']:.0f} s")
    return card


class Log:
    """Stage lines and progress bars on stderr: a bar redraws in place on a terminal and
    prints a line every tenth of the way elsewhere (logs, CI)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.n, self.t0 = quiet, 0, time.monotonic()
        self.tty = sys.stderr.isatty()

    def stage(self, what: str) -> None:
        self.n += 1
        self.line(f"[{self.n}] {what} ({time.monotonic() - self.t0:.0f} s)")

    def line(self, text: str) -> None:
        if not self.quiet:
            print(("    " if not text.startswith(("[", "ssd-")) else "") + text,
                  file=sys.stderr, flush=True)

    def bar(self, name: str):
        start, shown = time.monotonic(), [-1]

        def progress(done: int, total: int, extra: str) -> None:
            if self.quiet or total <= 0:
                return
            elapsed = time.monotonic() - start
            left = elapsed * (total - done) / max(done, 1)
            frac = done / total
            filled = int(24 * frac)
            text = (f"    {name} [{'#' * filled}{'.' * (24 - filled)}] {done:,}/{total:,} "
                    f"{extra}, {_clock(elapsed)} elapsed, ~{_clock(left)} left")
            if self.tty:
                print("\r" + text, end="\n" if done >= total else "", file=sys.stderr,
                      flush=True)
            elif int(frac * 10) > shown[0]:
                shown[0] = int(frac * 10)
                print(text, file=sys.stderr, flush=True)

        return progress


def check_paths(config: DistillConfig, out: Path, work: Path) -> None:
    """The output is free (or --force), an interrupted run is resumed or replaced only when
    asked, with the settings it was started with."""
    if out.exists() and not config.force:
        raise ConfigError(f"output {out} already exists. ---> HINT: pass --force to replace it "
                          f"(only once the new draft is complete), or choose another --output.")
    if work.exists() and not config.resume:
        if config.force:
            shutil.rmtree(work)
        else:
            raise ConfigError(f"{work} holds an interrupted run. ---> HINT: pass --resume to "
                              f"continue it, or --force to start over.")
    if config.resume and not work.exists():
        raise ConfigError(f"--resume: there is no interrupted run at {work}. ---> HINT: drop "
                          f"--resume to start one.")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"output {out} cannot be created: {parent} is not a writable "
                          f"folder. ---> HINT: choose another --output.")
    if config.resume:
        saved = work / "run.json"
        if saved.exists():
            before = json.loads(saved.read_text())
            now = run_key(config)
            if before != now:
                changed = ", ".join(k for k in now if before.get(k) != now[k])
                raise ConfigError(f"--resume: {work} was started with other settings "
                                  f"({changed}). ---> HINT: resume with the same options, or "
                                  f"--force to start over.")


def run_key(config: DistillConfig) -> dict:
    return {"target": str(Path(config.target).absolute()) if Path(config.target).exists()
            else config.target, "kind": config.kind, "preset": config.preset,
            "settings": asdict(config.settings),
            "data": [str(p.absolute()) for p in config.data],
            "prompts": str(config.prompts.absolute()) if config.prompts else None,
            "seed": config.seed, "loss": config.loss, "init": config.init,
            **({} if config.kind != "head" else {
                "budget": config.budget, "answers": config.answers,
                "cache": str(config.cache.absolute()) if config.cache else None,
                "data_budget": config.data_budget, "answers_quant": config.answers_quant,
                "answers_bundle": str(config.answers_bundle.absolute())
                if config.answers_bundle else None, "head_init": config.head_init})}


def load_target(source: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ssd_export.loading import described, check_architecture

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    check_architecture(source, "target")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise ConfigError(f"target model {source!r} has no usable tokenizer: {described(exc)}. "
                          f"---> HINT: the draft is trained on the target's own text, and "
                          f"ssd-distill copies its tokenizer: save it beside the model "
                          f"(tokenizer.save_pretrained(folder)).") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"target tokenizer of {source!r} is not a fast tokenizer (no "
                          f"tokenizer.json). ---> HINT: save it with AutoTokenizer."
                          f"from_pretrained(..., use_fast=True).save_pretrained().")
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except Exception as exc:
        raise ConfigError(f"target model {source!r} failed to load: {described(exc)}. ---> "
                          f"HINT: check that its weight files are complete.") from None
    return model.eval().requires_grad_(False), tokenizer


def target_rows(config: DistillConfig, preset: Preset, target, tokenizer, prompts: list, texts,
          work: Path, log: Log) -> tuple[Rows, Rows, dict]:
    """The labelled rows, made once and kept in the work folder for --resume."""
    saved = work / "data.pt"
    if saved.exists():
        state = torch.load(saved, weights_only=False)
        log.line(f"reusing the labels of the interrupted run ({saved})")
        return Rows(**state["train"]), Rows(**state["heldout"]), state["info"]
    encoded = [encode_prompt(tokenizer, p) for p in prompts]
    encoded = [e[-(preset.seq_len // 2):] for e in encoded]   # long prompts: their end
    n_held = max(2, min(round(len(encoded) * preset.heldout_share),
                        round(preset.prompts * preset.heldout_share)))
    held = encoded[::max(1, len(encoded) // n_held)][:n_held]  # spread over the file
    held_set = {id(e) for e in held}
    pool = [e for e in encoded if id(e) not in held_set]
    chosen = [pool[i % len(pool)] for i in range(preset.prompts)]
    eos = eos_ids(target)
    t0 = time.monotonic()
    held_rows = answer(target, held, preset, eos, config.seed + 7, log.bar("held-out answers"))
    train_rows = answer(target, chosen, preset, eos, config.seed, log.bar("answers"),
                        budget_s=max(0.0, preset.generate_budget_s - (time.monotonic() - t0)))
    n_train = len(train_rows.ids)
    if n_train < len(chosen):
        log.line(f"the answer budget of {preset.generate_budget_s:.0f} s was hit: {n_train} of "
                 f"{len(chosen)} prompts answered (recorded in the card)")
    gen_s = time.monotonic() - t0
    t1 = time.monotonic()
    text_rows = label_text(target, tokenizer, texts, preset, log.bar("text"))
    parts = [train_rows, text_rows]
    info = {"prompts": len(prompts), "answered": n_train, "asked": len(chosen),
            "heldout_prompts": len(held),
            "answer_positions": train_rows.positions, "heldout_positions": held_rows.positions,
            "text_files": len(texts),
            "text_positions": text_rows.positions if text_rows is not None else 0,
            "answer_seconds": round(gen_s, 1), "text_seconds": round(time.monotonic() - t1, 1),
            "answer_tokens_per_s": round((train_rows.positions + held_rows.positions)
                                         / max(gen_s, 1e-6), 1),
            "prompt_source": str(config.prompts) if config.prompts else "shipped (750)"}
    rows = concat(parts)
    tmp = saved.with_name("data.pt.tmp")
    torch.save({"train": rows.as_dict(), "heldout": held_rows.as_dict(), "info": info}, tmp)
    tmp.replace(saved)
    log.line(f"{info['answer_positions']:,} answer and {info['text_positions']:,} text "
             f"positions labelled ({info['answer_tokens_per_s']:.0f} answer tok/s)")
    return rows, held_rows, info


def _start_agreement(target, held: Rows, ids, n: int, init: str) -> float:
    """The same agreement for the copied layers before any training (what truncation gives)."""
    student, _ = make_student(target, n, init)
    agree, total = agreement(student.eval(), held, ids)
    return agree / max(total, 1)


def _row_texts(tokenizer, rows) -> list[str]:
    """Each row's prompt and answer as text (special tokens kept: the chat template's)."""
    out = []
    for r in range(len(rows.ids)):
        labelled = rows.mask[r].nonzero()
        if len(labelled):
            end = min(rows.ids.shape[1], int(labelled[-1]) + 2)
            out.append(tokenizer.decode(rows.ids[r, :end].tolist()))
    return out


def _write_calibration(tokenizer, train_rows, held_rows, path: Path) -> Path | None:
    """The target's own answers as `ssd-export --calib` text, so that the export's worth check
    measures the draft on the text it will be asked to guess (docs/distill.md §1), not on
    the export's default English prose. `--calib` holds out a file's last tenth: that tenth is
    exactly the held-out prompts' answers, after nine times as many training answers."""
    held = _row_texts(tokenizer, held_rows)
    if not held:
        return None
    lines = [*_row_texts(tokenizer, train_rows)[:9 * len(held)], *held]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    return path


def _worth(config: DistillConfig, draft_dir: Path, calib: Path | None, log: Log) -> dict:
    """Export target + draft as ssd-export would and read the pair's worth it measures:
    agreement of the deployed graphs on held-out answers of the target's, the calibrated
    cost c, the predicted speed-up."""
    from ssd_export.config import ExportConfig
    from ssd_export.pipeline import export_bundle

    keep = config.bundle is not None
    bundle = config.bundle if keep else Path(tempfile.mkdtemp(prefix="ssd-distill-")) / "b"
    try:
        manifest = export_bundle(ExportConfig(target=config.target, draft=str(draft_dir),
                                              output=bundle, force=keep, quiet=True,
                                              calib=None if calib is None else str(calib)))
        worth = dict(manifest.pair_worth or {})
        if keep:
            worth["bundle"] = str(bundle)
        log.line(f"pair worth: agreement {worth.get('agreement')}, c = {worth.get('c')}, "
                 f"predicted {worth.get('speedup')}x at k = {worth.get('best_k')}"
                 + (f" (bundle kept at {bundle})" if keep else ""))
        return worth
    finally:
        if not keep:
            shutil.rmtree(bundle.parent, ignore_errors=True)


def publish(draft_dir: Path, out: Path, force: bool) -> None:
    if out.exists():
        if not force:
            raise ConfigError(f"output {out} appeared during the run. ---> HINT: --force.")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        shutil.rmtree(old)
    draft_dir.rename(out)


def eos_ids(model) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])})


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
