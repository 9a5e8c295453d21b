"""The draft: the target's own architecture with a few of its layers (docs/distill.md §3), its
embeddings shared and frozen, and optionally a head over the target's most frequent outputs.

    target  embed ─ layer 0 … layer L-1 ─ norm ─ head (V)
    draft   embed ─ layer i_0 … i_{n-1}  ─ norm ─ head rows S ⊂ V   (S: output_vocab.json)

A draft that proposes only from S is still exact: its q is 0 outside S, and the target's
verification decides every token (docs/design.md §13).
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ssd_runtime.errors import ConfigError

OUTPUT_VOCAB = "output_vocab.json"    # the file ssd-export reads (ssd_export/loading.py)


def layer_indices(n_target: int, n: int, init: str) -> list[int]:
    """Which target layers the draft's n layers start from: evenly spread from the first to
    the last ("spread"), or the first n ("first")."""
    n = min(n, n_target)
    if init == "first" or n == 1:
        return list(range(n))
    return [round(j * (n_target - 1) / (n - 1)) for j in range(n)]


def make_student(target: nn.Module, n_layers: int, init: str) -> tuple[nn.Module, list[int]]:
    """A model of the target's class and config with n_layers layers, its weights copied from
    the target's (the chosen layers; embeddings, final norm, head as they are)."""
    config = copy.deepcopy(target.config)
    n_target = int(config.num_hidden_layers)
    idx = layer_indices(n_target, n_layers, init)
    for name, value in list(vars(config).items()):   # per-layer lists (layer_types, ...)
        if isinstance(value, list) and len(value) == n_target and name != "architectures":
            setattr(config, name, [value[i] for i in idx])
    config.num_hidden_layers = len(idx)
    student = type(target)(config).to(next(target.parameters()).dtype)
    source = target.state_dict()
    state = {}
    for key, value in student.state_dict().items():
        src = _source_key(key, idx)
        if src not in source or source[src].shape != value.shape:
            raise ConfigError(f"cannot start the draft from the target: its weight {key} has no "
                              f"match {src} of shape {tuple(value.shape)} in the target. "
                              f"---> HINT: this architecture's layers are not a list "
                              f"`...layers.N...`; report it.")
        state[key] = source[src].clone()
    student.load_state_dict(state)
    student.tie_weights()
    student.generation_config = copy.deepcopy(target.generation_config)
    return student, idx


def freeze_embeddings(student: nn.Module) -> list[nn.Parameter]:
    """Freeze the input embeddings and the head (shared with the target: the draft learns to
    reach the target's output space); return what trains."""
    frozen = {id(student.get_input_embeddings().weight)}
    head = student.get_output_embeddings()
    if head is not None:
        frozen.add(id(head.weight))
    trainable = []
    for p in student.parameters():
        p.requires_grad_(id(p) not in frozen)
        if p.requires_grad:
            trainable.append(p)
    return trainable


def output_vocab(rows_argmax: torch.Tensor, rows_top: torch.Tensor, mask: torch.Tensor,
                 vocab: int, size: int | None, keep: list[int]) -> list[int] | None:
    """The `size` tokens the target outputs most often (counted by its argmax, then by its
    top-k mass as a tie-break), plus `keep` (eos and the other special ids); None when the
    whole vocabulary is asked for or `size` would cover most of it anyway."""
    if size is None or size >= 0.9 * vocab:
        return None
    counts = torch.bincount(rows_argmax[mask], minlength=vocab).double() * 1e6
    counts += torch.bincount(rows_top[mask].flatten().long(), minlength=vocab).double()
    chosen = set(torch.topk(counts, min(size, vocab)).indices.tolist()) | set(keep)
    return sorted(chosen)


def head_logits(student: nn.Module, hidden: torch.Tensor, ids: torch.Tensor | None
                ) -> torch.Tensor:
    """The draft's logits over its output vocabulary (all tokens when ids is None) from the
    last hidden states, as the exported graph computes them (scale and soft-cap included)."""
    head = student.get_output_embeddings()
    weight = head.weight if ids is None else head.weight[ids]              # (m, H)
    bias = getattr(head, "bias", None)
    if bias is not None and ids is not None:
        bias = bias[ids]
    logits = nn.functional.linear(hidden, weight, bias).float()            # (N, m)
    config = student.config
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, (int, float)) and scale != 1:
        logits = logits * scale
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def save_draft(student: nn.Module, tokenizer: Any, folder: Path, ids: list[int] | None) -> None:
    """A Hugging Face folder: config, safetensors, the target's tokenizer and chat template,
    and output_vocab.json when the head is a subset."""
    student.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    if ids is not None:
        (folder / OUTPUT_VOCAB).write_text(json.dumps(
            {"ids": ids, "size": len(ids), "vocab_size": int(student.config.vocab_size),
             "note": "ssd-export builds the draft's head over these token ids only; its "
                     "logits elsewhere are -1e9 (q = 0), which keeps decoding exact"}) + "\n")


def _source_key(key: str, idx: list[int]) -> str:
    """student `model.layers.j.…` -> target `model.layers.idx[j].…` (the first list index)."""
    match = re.search(r"\.(\d+)\.", key)
    if match is None:
        return key
    j = int(match.group(1))
    return f"{key[:match.start()]}.{idx[j]}.{key[match.end():]}"
