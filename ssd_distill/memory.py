"""Whether a preset fits in this machine's memory, estimated before any work (docs/distill.md
§5): the target's weights, its KV cache and logits while answering, the labels, and the
draft's training state."""
from __future__ import annotations

import ctypes
import ctypes.util
import os

from ssd_runtime.errors import ConfigError

from .config import HEAD_PRESETS, PRESETS, Preset

ANSWER_BATCH = 32        # rows the target answers at once (data.answer)
ANSWER_SLOTS, ANSWER_CONTEXT = 16, 1024   # --kind head: the answering bundle's (head.py)
PREFILL_TOKENS = 4096    # --kind head: tokens a feature prefill runs at once (features.py)


def estimate(target, preset: Preset) -> int:
    """Bytes the run needs at its peak, roughly (float32 throughout)."""
    params, hidden, vocab, layers, shared = _target_and_labels(target, preset)
    per_layer = params / max(layers, 1)
    draft = per_layer * preset.layers * 4 * 4           # weights, grads, two Adam moments
    head = preset.head_tokens or vocab
    activations = preset.batch * preset.seq_len * (hidden * preset.layers * 40 + head * 3) * 4
    return int(shared + draft + activations)


def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


_TRIM = _malloc_trim()


class HeapKeeper:
    """Hands the pages that freed tensors left in glibc's heap back to the system once the
    process has grown `slack` bytes past its size after the first call (docs/distill.md §5,
    "Memory"). A training step's tensors change shape with every batch (rows and length, the
    positions it scores); glibc keeps what they freed for reuse and rarely returns it, so
    without this the process grows step after step (an hour's head training to 9.4–9.6 GiB,
    where a step needs under 1.5). Trimming after every step would pay the pages' faults
    every step (about 6% of training's speed); at a ceiling it trims every several steps,
    and where the memory is live (a trim leaves the process past the ceiling) the ceiling
    moves up. No effect without glibc."""

    def __init__(self, slack: int = 1 << 30) -> None:
        self.slack, self.ceiling = slack, None

    def __call__(self) -> None:
        if _TRIM is None or (rss := _rss()) is None:
            return
        if self.ceiling is None:
            self.ceiling = rss + self.slack
        elif rss > self.ceiling:
            _TRIM(0)
            after = _rss()
            if after is not None and after > self.ceiling:   # live, not freed: trim past it
                self.ceiling = after + self.slack


def trim() -> None:
    """Hand the free pages of glibc's heap back to the system now (nothing without glibc)."""
    if _TRIM is not None:
        _TRIM(0)


def _rss() -> int | None:
    """This process's resident bytes (Linux), else None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


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


def check_memory(target, preset: Preset, name: str, kind: str = "draft") -> int:
    """The run's estimated peak in bytes, or one error naming the preset that fits."""
    have = available()
    measure = estimate_head if kind == "head" else estimate
    need = measure(target, preset)
    if have is None or need <= have:
        return need
    presets = HEAD_PRESETS if kind == "head" else PRESETS
    fits = [n for n, p in presets.items() if measure(target, p) <= have]
    raise ConfigError(f"the {name} preset needs about {need / 2**30:.1f} GiB for this target "
                      f"and {have / 2**30:.1f} GiB are available. ---> HINT: "
                      + (f"use --preset {fits[-1]}" if fits else "free memory, or use a machine "
                         "with more") + f" (os reports {os.cpu_count()} cores).")


def estimate_head(target, preset: Preset) -> int:
    """Bytes a head's run needs at its peak, roughly: the float target (PyTorch's, for the
    features) and the cached answers' ids and labels (about 130 bytes a position, a million
    positions) throughout; then the larger of the answering and the training (the head's
    state and the activations of `ttt_steps` unrolled steps over a batch of long rows: the
    logits over the draft vocabulary dominate). Answering holds the bundle's float target
    three times (its weights mapped from disk, and prepacked by the one-token graph and by
    the rows graph), its int4 draft (answers.answer_export) at about a byte a weight with
    its packing, both models' KV caches and a prefill's activations. The features stay on
    disk (corpus.py)."""
    cfg = target.config
    params, hidden, vocab, layers, kv_dim = _dims(target)
    kv = ANSWER_SLOTS * ANSWER_CONTEXT * layers * 2 * kv_dim * 4       # a model's caches
    answering = params * (4 * 3 + 1) + 2 * kv \
        + PREFILL_TOKENS * (hidden * 16 + 3 * hidden * 2) * 4
    head_vocab = min(preset.head_tokens or 8192, vocab)
    inter = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
    head = (3 * hidden * hidden + 4 * hidden * hidden + 3 * hidden * inter
            + hidden * head_vocab) * 4 * 4               # weights, grads, two Adam moments
    seq = min(preset.max_prompt, 256) + preset.new_tokens   # a long row
    positions = preset.batch * seq * preset.ttt_steps
    activations = positions * (hidden * 30 + inter * 4 + head_vocab * 3
                               + seq * preset.ttt_steps * 2) * 4
    return int(params * 4 + 10**6 * 130 + max(answering, head + activations))


def _target_and_labels(target, preset: Preset) -> tuple[int, int, int, int, int]:
    """(target parameters, hidden size, vocabulary, layers, bytes of what a draft's and a
    head's runs both hold: the target twice over, its KV cache and logits while answering,
    the labels)."""
    params, hidden, vocab, layers, kv_dim = _dims(target)
    answering = ANSWER_BATCH * (preset.seq_len * layers * 2 * kv_dim + 4 * vocab) * 4
    labels = (preset.prompts + preset.text_tokens // max(preset.seq_len, 1)) * preset.seq_len \
        * (preset.top_k * 6 + 24)
    return params, hidden, vocab, layers, int(params * 4 * 2 + answering + labels)


def _dims(target) -> tuple[int, int, int, int, int]:
    """(parameters, hidden size, vocabulary, layers, key/value width) of a Hugging Face model."""
    cfg = target.config
    hidden = int(cfg.hidden_size)
    kv_dim = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads) * int(
        getattr(cfg, "head_dim", None) or hidden // cfg.num_attention_heads)
    return (sum(p.numel() for p in target.parameters()), hidden, int(cfg.vocab_size),
            int(cfg.num_hidden_layers), kv_dim)
