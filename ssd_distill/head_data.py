"""The layers an EAGLE-3 head reads (docs/distill.md §8) and, from Hugging Face's
`hidden_states`, the features it reads there: the reference features.py's prefill (which stops
at the deepest of those layers) is checked against."""
from __future__ import annotations

import time

import torch

from ssd_graphs.eagle3 import Eagle3Config, aux_hidden
from ssd_runtime.errors import ConfigError

from .data import Progress, Rows

MIN_LAYERS = 7   # 2 < L//2 < L-3 are three distinct layers from L = 7 on
# features are kept in float16: a real target's residual stream reaches tens of thousands on
# a few "massive activation" channels, still under float16's largest 65,504
# (docs/performance-notes.md, "Figures from code comments")
F16_MAX = 65504.0


def aux_layer_ids(n_layers: int) -> list[int]:
    """The layers whose input (the residual stream entering them) the head reads: 2, L//2 and
    L-3, SafeAILab's and vLLM's convention (eagle/traineagle3/modeling_llama_kv.py). Hugging
    Face's `hidden_states[l]` is exactly that stream: index 0 is the embeddings."""
    return list(Eagle3Config.default_aux_layer_ids(n_layers))


def check_layers(layer_ids: list[int], n_layers: int, target: str) -> None:
    """Three increasing layers inside the target (as vLLM and SafeAILab read them), or one
    error naming the depth it needs."""
    increasing = all(a < b for a, b in zip(layer_ids, layer_ids[1:]))
    if not increasing or not all(0 <= i < n_layers for i in layer_ids):
        raise ConfigError(f"target {target} has {n_layers} layers: an EAGLE-3 head reads the "
                          f"residual stream entering layers 2, L//2 and L-3 ({layer_ids} here), "
                          f"three increasing layers, which needs at least {MIN_LAYERS}. ---> HINT: "
                          f"train a small draft instead (ssd-distill without --kind head).")


@torch.no_grad()
def add_features(target, rows: Rows, layer_ids: list[int], batch: int, progress: Progress
                 ) -> Rows:
    """The rows with `features`: teacher-forced through the whole target, the hidden states
    entering `layer_ids` concatenated at every position, in float16 (what the exported
    target's verification outputs for the head at run time, docs/design.md)."""
    n, width = rows.ids.shape
    hidden = int(target.config.hidden_size)
    out = torch.zeros(n, width, len(layer_ids) * hidden, dtype=torch.float16)  # (N, L, 3H)
    lengths = _lengths(rows)
    order = sorted(range(n), key=lambda r: int(lengths[r]))           # similar lengths batch
    start, done, total = time.monotonic(), 0, int(lengths.sum())
    device = next(target.parameters()).device
    for first in range(0, n, batch):
        part = order[first:first + batch]
        w = int(lengths[part].max())
        ids = rows.ids[part, :w].to(device)                                # (B, w)
        states = target.base_model(input_ids=ids, output_hidden_states=True).hidden_states
        aux = aux_hidden(states, tuple(layer_ids))                         # (B, w, 3H)
        out[part, :w] = aux.clamp(-F16_MAX, F16_MAX).to("cpu", torch.float16)
        done += int(lengths[part].sum())
        progress(done, total, f"{done / max(time.monotonic() - start, 1e-6):,.0f} tok/s")
    return Rows(**{**rows.as_dict(), "features": out})


def _lengths(rows: Rows) -> torch.Tensor:
    """Each row's length up to its last labelled position plus one (what the head reads)."""
    last = torch.where(rows.mask, torch.arange(rows.mask.shape[1]), -1).max(1).values
    return (last + 2).clamp(max=rows.mask.shape[1], min=1)                 # (N,)
