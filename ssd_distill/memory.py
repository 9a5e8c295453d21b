"""Whether a preset fits in this machine's memory, estimated before any work (docs/distill.md
§5): the target's weights, its KV cache and logits while answering, the labels, and the
draft's training state."""
from __future__ import annotations

import os

from ssd_runtime.errors import ConfigError

from .config import PRESETS, Preset

ANSWER_BATCH = 32        # rows the target answers at once (data.answer)


def estimate(target, preset: Preset) -> int:
    """Bytes the run needs at its peak, roughly (float32 throughout)."""
    cfg = target.config
    params = sum(p.numel() for p in target.parameters())
    hidden, vocab = int(cfg.hidden_size), int(cfg.vocab_size)
    layers = int(cfg.num_hidden_layers)
    kv_dim = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) * int(
        getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads)
    answering = ANSWER_BATCH * (preset.seq_len * layers * 2 * kv_dim + 4 * vocab) * 4
    labels = (preset.prompts + preset.text_tokens // max(preset.seq_len, 1)) * preset.seq_len \
        * (preset.top_k * 6 + 24)
    per_layer = params / max(layers, 1)
    draft = per_layer * preset.layers * 4 * 4           # weights, grads, two Adam moments
    head = preset.head_tokens or vocab
    activations = preset.batch * preset.seq_len * (hidden * preset.layers * 40 + head * 3) * 4
    return int(params * 4 * 2 + answering + labels + draft + activations)


def available() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else None (not checked)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(target, preset: Preset, name: str) -> None:
    have = available()
    need = estimate(target, preset)
    if have is None or need <= have:
        return
    fits = [n for n, p in PRESETS.items() if estimate(target, p) <= have]
    raise ConfigError(f"the {name} preset needs about {need / 2**30:.1f} GiB for this target "
                      f"and {have / 2**30:.1f} GiB are available. ---> HINT: "
                      + (f"use --preset {fits[-1]}" if fits else "free memory, or use a machine "
                         "with more") + f" (os reports {os.cpu_count()} cores).")
