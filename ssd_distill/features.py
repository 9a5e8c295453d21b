"""The features a head reads, at the cost of a prefill (docs/distill.md §9): every cached part's
rows (prompt + answer) go once through the float target in batches, and the residual stream
entering the head's layers is kept (float16, `CACHE/features/part-N.f16`). The pass stops at
the deepest of those layers: the layers after it, the final norm and the LM head are not run —
unless the answers came from a quantized target, whose log-probabilities are not the float
target's; then the whole model runs and its top-20 at the answer positions label them.
"""
from __future__ import annotations

import io
import time
from typing import Callable

import numpy as np
import torch

from .answers import TOP
from .cache import AnswerCache, Part
from .head_data import F16_MAX       # features are stored as float16
from .memory import PREFILL_TOKENS    # padded tokens per prefill call
from .student import head_logits

Progress = Callable[[int, int, str], None]


class _Stop(Exception):
    """Raised by the deepest layer's hook: the rest of the model is not needed."""


def decoder_layers(target) -> torch.nn.ModuleList:
    """The target's list of decoder layers (the one ModuleList of num_hidden_layers)."""
    n = int(target.config.num_hidden_layers)
    for module in target.base_model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise RuntimeError(f"{type(target).__name__} has no list of {n} decoder layers")


@torch.no_grad()
def prefill(target, ids: torch.Tensor, layer_ids: list[int], labels_at: torch.Tensor | None
            ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """ids (B, T), right-padded -> (features (B, T, 3H) float32, and with `labels_at` (B, T)
    bool the target's top-TOP (ids, log-probs) at those positions, (N, TOP) each).

    The stream entering layer l is that layer's input, caught by a pre-hook: the same tensor
    as Hugging Face's `hidden_states[l]` (head_data.add_features, which runs every layer)."""
    layers = decoder_layers(target)
    caught: dict[int, torch.Tensor] = {}
    deepest = max(layer_ids)

    def catch(index: int):
        def hook(module, args, kwargs):
            caught[index] = args[0] if args else kwargs["hidden_states"]
            if index == deepest and labels_at is None:
                raise _Stop
        return hook

    handles = [layers[i].register_forward_pre_hook(catch(i), with_kwargs=True)
               for i in layer_ids]
    cuda = ids.device.type == "cuda"      # mixed precision there, float32 on the CPU
    try:
        try:
            with torch.autocast(ids.device.type, torch.bfloat16, enabled=cuda):
                hidden = target.base_model(input_ids=ids).last_hidden_state  # (B, T, H)
        except _Stop:
            hidden = None
    finally:
        for h in handles:
            h.remove()
    features = torch.cat([caught[i] for i in layer_ids], dim=-1).float()  # (B, T, 3H)
    if labels_at is None:
        return features, None
    assert hidden is not None
    logp = torch.log_softmax(head_logits(target, hidden[labels_at].float(), None), -1)  # (N, V)
    top = logp.topk(TOP, -1)
    return features, (top.indices, top.values)


def make_features(target, cache: AnswerCache, layer_ids: list[int], need_labels: bool,
                  progress: Progress) -> tuple[int, float]:
    """Features (and, when `need_labels`, labels) for every part that lacks them; returns
    (tokens prefilled, seconds). A part's file is written whole, so a killed run redoes at
    most the part it was in."""
    todo = [n for n in cache.parts() if not cache.features_path(n).exists()
            or (need_labels and not cache.labels_path(n).exists())]
    parts = [(n, cache.read(n)) for n in todo]
    total = sum(p.tokens for _, p in parts)
    done, start = 0, time.monotonic()
    device = next(target.parameters()).device
    for name, part in parts:
        feats, labels = part_features(target, part, layer_ids, need_labels, device)
        if labels is not None:
            buf = io.BytesIO()
            np.savez(buf, top_ids=labels[0], top_logp=labels[1])
            cache.write_bytes(cache.labels_path(name), buf.getvalue())
        cache.write_bytes(cache.features_path(name), memoryview(feats).cast("B"))
        done += part.tokens
        progress(done, total, f"{done / max(time.monotonic() - start, 1e-6):,.0f} tok/s")
    return done, time.monotonic() - start


def part_features(target, part: Part, layer_ids: list[int], need_labels: bool, device
                  ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """One part's features (tokens, 3H) float16 in its rows' order, and its labels (answer
    positions, TOP) if asked; rows batched by length, PREFILL_TOKENS padded tokens a call."""
    lengths = (part.prompt_len + part.answer_len).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    width = len(layer_ids) * int(target.config.hidden_size)
    out = np.zeros((int(lengths.sum()), width), np.float16)
    label_starts = np.concatenate([[0], np.cumsum(part.answer_len)[:-1]])
    n_labels = int(part.answer_len.sum())
    top_ids = np.zeros((n_labels, TOP), np.int32) if need_labels else None
    top_logp = np.zeros((n_labels, TOP), np.float16) if need_labels else None
    order = np.argsort(lengths, kind="stable")
    first = 0
    while first < len(order):
        last = first + 1
        while last < len(order) and (last - first + 1) * int(lengths[order[last]]) <= PREFILL_TOKENS:
            last += 1
        rows = order[first:last]
        T = int(lengths[rows].max())
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        at = torch.zeros(len(rows), T, dtype=torch.bool)
        for b, r in enumerate(rows):
            ids[b, :lengths[r]] = torch.from_numpy(part.ids[starts[r]:starts[r] + lengths[r]]
                                                   .astype(np.int64))
            p, a = int(part.prompt_len[r]), int(part.answer_len[r])
            at[b, p - 1:p - 1 + a] = True          # position p-1+j gives answer token j
        feats, labels = prefill(target, ids.to(device), layer_ids,
                                at.to(device) if need_labels else None)
        feats = feats.clamp(-F16_MAX, F16_MAX).to("cpu", torch.float16).numpy()
        offset = 0
        for b, r in enumerate(rows):
            out[starts[r]:starts[r] + lengths[r]] = feats[b, :lengths[r]]
            if labels is not None:
                a = int(part.answer_len[r])
                s = label_starts[r]
                top_ids[s:s + a] = labels[0][offset:offset + a].cpu().numpy()
                top_logp[s:s + a] = labels[1][offset:offset + a].cpu().half().numpy()
                offset += a
        first = last
    return out, (None if top_ids is None else (top_ids, top_logp))
