"""`distill_head(config)`, `ssd-distill --kind head`: load the target → its answers and labels
(as for a draft) → the draft vocabulary → the target's features at the head's layers → an
EAGLE-3 head initialised as SafeAILab's → train with K unrolled steps → held-out agreement per
step → the SafeAILab layout and its card. Reads top to bottom (docs/distill.md §8).

Built in `OUTPUT.partial/` like a draft (labels, features, checkpoints), which `--resume`
continues; the head folder appears at OUTPUT only when complete.
"""
from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ssd_graphs.eagle3 import Eagle3Config, Eagle3Head, is_head, save_safeailab
from ssd_runtime.errors import ConfigError

from .card import head_card
from .config import DistillConfig, Preset
from .data import Rows
from .head_data import add_features, aux_layer_ids, check_layers, draft_vocabulary
from .memory import check_memory
from .pipeline import (Log, check_enough, check_paths, load_target, publish, read_inputs,
                       run_key, target_rows)
from .train import train
from .ttt import agreement, loss, to_device

FEATURES = "features.pt"     # in the work folder: the target's features, made once


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
    check_paths(config, out, work)
    torch.set_num_threads(config.threads or max(1, os.cpu_count() or 1))
    prompts, texts = read_inputs(config, preset)
    log.stage("load the target")
    target, tokenizer = load_target(config.target)
    n_layers = int(target.config.num_hidden_layers)
    layer_ids = aux_layer_ids(n_layers)
    check_layers(layer_ids, n_layers, config.target)
    need = check_memory(target, preset, config.preset, "head")
    log.line(f"the {config.preset} preset needs about {need / 2**30:.1f} GiB at its peak "
             f"(estimated); the head reads the target's layers {layer_ids}")
    if not config.resume:
        work.mkdir(parents=True)
        (work / "run.json").write_text(json.dumps(run_key(config), indent=2))
    try:
        return _distill_head(config, preset, target, tokenizer, prompts, texts, layer_ids,
                             out, work, log)
    except ConfigError:      # a refusal after the start: nothing of this run is kept
        if not config.resume:
            shutil.rmtree(work, ignore_errors=True)
        raise


def head_config(cfg, draft_vocab: int, layer_ids: list[int]) -> Eagle3Config:
    """An EAGLE-3 head shaped like one of the target's layers (SafeAILab's config.json: the
    target's sizes, one layer), over a draft vocabulary of `draft_vocab` tokens."""
    hidden, heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    theta = float(rope.pop("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0))
    static = rope.get("rope_type", "default") in ("linear", "llama3", "yarn")
    return Eagle3Config(
        hidden_size=hidden, intermediate_size=int(getattr(cfg, "intermediate_size", None)
                                                  or 4 * hidden),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", None) or 1e-6), rope_theta=theta,
        rope_scaling=rope if static else None,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", None) or 2048),
        vocab_size=int(cfg.vocab_size), draft_vocab_size=draft_vocab,
        aux_layer_ids=tuple(layer_ids), target_hidden_size=hidden)


def _distill_head(config: DistillConfig, preset: Preset, target, tokenizer, prompts: list,
                  texts: list[str], layer_ids: list[int], out: Path, work: Path, log: Log
                  ) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log.stage("the target answers prompts and labels text")
    train_rows, held_rows, data_info = target_rows(config, preset, target, tokenizer, prompts,
                                                   texts, work, log)
    check_enough(train_rows, preset, config.preset)

    log.stage("the draft vocabulary and the target's features")
    vocab = int(target.config.vocab_size)
    ids, d2t, t2d = draft_vocabulary(train_rows, vocab, preset.head_tokens)
    covered = float(t2d[train_rows.argmax[train_rows.mask]].float().mean())
    log.line(f"draft vocabulary: {len(ids):,} of {vocab:,} tokens, the target's argmax at "
             f"{covered:.1%} of training positions")
    train_rows, held_rows, feature_s = _features(target, train_rows, held_rows, layer_ids,
                                                 preset, work, log)

    log.stage(f"the head: train {preset.ttt_steps} unrolled steps on {device}")
    torch.manual_seed(config.seed)      # SafeAILab's init: PyTorch's defaults, norms at one
    head = Eagle3Head(head_config(target.config, len(ids), layer_ids),
                      embed_weight=target.get_input_embeddings().weight)   # frozen
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    head.to(device)
    params = [p for p in head.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    log.line(f"{n_params:,} parameters train (the embedding is the target's, frozen)")
    draft_of = torch.full((vocab,), -1, dtype=torch.long)                 # target id -> draft id
    draft_of[torch.tensor(ids)] = torch.arange(len(ids))
    draft_of, t2d_dev = draft_of.to(device), t2d.to(device)

    def loss_fn(batch: Rows) -> torch.Tensor:
        return loss(head, to_device(batch, device), preset.ttt_steps, t2d_dev, draft_of)

    result = train(head, params, train_rows, preset, loss_fn, config.seed + 1,
                   work / "checkpoint.pt", config.resume, log.bar("train"))
    if result.stopped_early:
        log.line(f"the train budget of {preset.train_budget_s:.0f} s was hit at step "
                 f"{result.steps}/{result.planned_steps} (recorded in the card)")

    log.stage("held-out agreement")
    per_step = agreement(head, held_rows, preset.ttt_steps, preset.batch, device)
    rates = [round(a / max(n, 1), 4) for a, n in per_step]
    reach = float(t2d[held_rows.argmax[held_rows.mask]].float().mean())   # the most it can get
    log.line("teacher-forced top-1 agreement on held-out answers, step by step: "
             + ", ".join(f"{r:.3f}" for r in rates) + f" ({per_step[0][1]:,} positions; the "
             f"target's argmax is in the draft vocabulary at {reach:.1%} of them)")

    head_dir = work / "head"
    shutil.rmtree(head_dir, ignore_errors=True)
    head.cpu()
    save_safeailab(head, head.config, head_dir)
    target_params = sum(p.numel() for p in target.parameters())
    embed = target.get_input_embeddings().weight.numel()
    card = {
        "kind": "head", "target": config.target, "preset": config.preset,
        "settings": asdict(preset), "seed": config.seed, "threads": torch.get_num_threads(),
        "device": str(device), "aux_layer_ids": layer_ids,
        "draft_vocab_size": len(ids), "vocab_size": vocab,
        "draft_vocab_coverage": round(covered, 4),
        "parameters": n_params, "target_parameters": target_params,
        # a drafted token reads the layer and lm_head (fc: once per accepted row), the target
        # every parameter but its embedding table: their ratio is the matmul-bound cost
        "cost_ratio": round((n_params - head.fc.weight.numel()) / (target_params - embed), 4),
        "bytes": (head_dir / "model.safetensors").stat().st_size,
        "data": data_info, "feature_seconds": feature_s, "train": asdict(result),
        "heldout": {"positions": per_step[0][1], "agreement": rates,
                    "draft_vocab_coverage": round(reach, 4),
                    "counts": [list(c) for c in per_step]},
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "command": "ssd-distill " + " ".join(sys.argv[1:]) if sys.argv[0].endswith(
            "ssd-distill") else None,
        "total_seconds": round(time.monotonic() - log.t0, 1),
    }
    (head_dir / "distill.json").write_text(json.dumps(card, indent=2) + "\n")
    (head_dir / "README.md").write_text(head_card(card))
    publish(head_dir, out, config.force)
    shutil.rmtree(work, ignore_errors=True)
    log.line(f"ssd-distill: wrote {out} in {card['total_seconds']:.0f} s "
             f"(peak RSS {card['peak_rss_gib']} GiB)")
    return card


def _features(target, train_rows: Rows, held_rows: Rows, layer_ids: list[int], preset: Preset,
              work: Path, log: Log) -> tuple[Rows, Rows, float]:
    """The rows with the target's features, made once and kept in the work folder."""
    saved = work / FEATURES
    if saved.exists():
        state = torch.load(saved, weights_only=False)
        log.line(f"reusing the features of the interrupted run ({saved})")
        return (Rows(**{**train_rows.as_dict(), "features": state["train"]}),
                Rows(**{**held_rows.as_dict(), "features": state["heldout"]}), state["seconds"])
    start = time.monotonic()
    train_rows = add_features(target, train_rows, layer_ids, preset.batch, log.bar("features"))
    held_rows = add_features(target, held_rows, layer_ids, preset.batch,
                             log.bar("held-out features"))
    seconds = round(time.monotonic() - start, 1)
    tmp = saved.with_name(FEATURES + ".tmp")
    torch.save({"train": train_rows.features, "heldout": held_rows.features,
                "layer_ids": layer_ids, "seconds": seconds}, tmp)
    tmp.replace(saved)
    return train_rows, held_rows, seconds
