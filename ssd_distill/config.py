"""The frozen, typed options of one `ssd-distill` run and its presets; built by cli.py, read by
pipeline.py (docs/distill.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from ssd_runtime.errors import ConfigError

PresetName = Literal["quick", "default", "large"]
Loss = Literal["mix", "kl", "top1"]     # soft labels, the target's argmax, or a mix of both
Init = Literal["spread", "first"]       # which target layers the draft's layers start from
Kind = Literal["draft", "head"]         # a small model of the target's class, or an EAGLE-3 head


@dataclass(frozen=True)
class Preset:
    """How much the run generates and trains. Counts are fixed (the same seed gives the same
    draft); each phase also has a wall-clock budget, a safety net recorded in the card if hit."""

    layers: int              # draft decoder layers, copied from the target's
    prompts: int             # prompts the target answers (cycled if the file has fewer)
    new_tokens: int          # the target's answer length per prompt, at most
    text_tokens: int         # tokens of --data text the target labels, at most
    seq_len: int             # longest row trained on (prompt + answer, or a text window)
    batch: int               # rows per optimizer step
    epochs: float            # passes over the training rows
    lr: float
    head_tokens: int | None  # draft head over the target's most frequent outputs; None: all
    top_k: int = 32          # soft labels kept per position: the target's top-k log-probs
    greedy_share: float = 0.75   # answers decoded greedily; the rest sampled at temperature 1
    heldout_share: float = 0.1   # prompts kept out of training for the agreement report
    generate_budget_s: float = 3600.0
    train_budget_s: float = 3600.0
    min_tokens: int = 2000   # labelled positions below which training is refused
    steps: int | None = None     # optimizer steps; None: as many as `epochs` take
    clip: float = 1.0            # gradient norm clipping
    ttt_steps: int = 1           # --kind head: drafting steps unrolled per position (§8)


# Sized for a 2-core CPU from the speeds at which a ~135M target answers prompts (batched,
# with a KV cache) and labels text: docs/distill.md §5 gives each preset's time, and
# docs/performance.md, "Drafts made by ssd-distill", the measurements.
PRESETS: dict[str, Preset] = {
    # a tiny test target in about a minute
    "quick": Preset(layers=1, prompts=24, new_tokens=24, text_tokens=2048, seq_len=96, batch=8,
                    epochs=4, lr=3e-3, head_tokens=None, generate_budget_s=120,
                    train_budget_s=120, min_tokens=200),
    # a ~100-300M target in at most 45 minutes end to end; its 16 epochs, since the same
    # answers trained for fewer epochs agree less (docs/performance.md, "Drafts made by
    # ssd-distill")
    "default": Preset(layers=4, prompts=400, new_tokens=128, text_tokens=65536, seq_len=320,
                      batch=16, epochs=16, lr=1e-3, head_tokens=8192,
                      generate_budget_s=1080, train_budget_s=1500),
    # more answers, longer training: a few hours
    "large": Preset(layers=6, prompts=2250, new_tokens=256, text_tokens=262144, seq_len=512,
                    batch=16, epochs=4, lr=1e-3, head_tokens=16384,
                    generate_budget_s=5400, train_budget_s=7200),
}

# --kind head (docs/distill.md §8): the same answers, one decoder layer trained with several
# drafting steps unrolled per position. SafeAILab's own recipe (eagle/traineagle3) unrolls 7
# steps, clips at 0.5, AdamW betas (0.9, 0.95), no weight decay, peak lr 5e-5 over 40 epochs of
# 68k conversations on 8 GPUs; on 2 CPU cores the run is ~10^4 times smaller, hence a larger lr
# and 4 unrolled steps (the runtime's k is rarely above 4 on CPU). `head_tokens` is the draft
# vocabulary (d2t's length); `layers` is unused. More epochs over the same answers kept
# raising the head's held-out agreement, the loss still falling (docs/distill.md §8).
HEAD_PRESETS: dict[str, Preset] = {
    "quick": Preset(layers=1, prompts=24, new_tokens=24, text_tokens=2048, seq_len=96, batch=8,
                    epochs=8, lr=3e-3, head_tokens=None, generate_budget_s=120,
                    train_budget_s=120, min_tokens=200, clip=0.5, ttt_steps=3),
    "default": Preset(layers=1, prompts=400, new_tokens=128, text_tokens=65536, seq_len=320,
                      batch=8, epochs=12, lr=1e-3, head_tokens=8192, generate_budget_s=1080,
                      train_budget_s=2400, clip=0.5, ttt_steps=4),
    "large": Preset(layers=1, prompts=2250, new_tokens=256, text_tokens=262144, seq_len=512,
                    batch=8, epochs=4, lr=5e-4, head_tokens=16384, generate_budget_s=5400,
                    train_budget_s=14400, clip=0.5, ttt_steps=7),
}


@dataclass(frozen=True)
class DistillConfig:
    target: str                          # local Hugging Face folder or hub id
    output: Path                         # the draft (or head) folder to write
    kind: Kind = "draft"
    preset: PresetName = "default"
    data: tuple[Path, ...] = ()          # the user's text files, labelled by the target
    prompts: Path | None = None          # JSONL of {"prompt": ...} or {"messages": [...]}
    threads: int | None = None           # torch intra-op threads; None: every core
    resume: bool = False
    force: bool = False
    quiet: bool = False
    seed: int = 0
    layers: int | None = None            # override the preset's
    head_tokens: int | None = None       # override the preset's; 0: the whole vocabulary
    loss: Loss = "mix"
    init: Init = "spread"
    bundle: Path | None = None           # keep the report's export here (else a temporary one)
    check: bool = True                   # export the pair and measure its worth at the end
    epochs: float | None = None          # override the preset's
    steps: int | None = None             # a fixed count of optimizer steps instead of epochs
    ttt_steps: int | None = None         # --kind head: override the preset's
    overrides: dict = field(default_factory=dict, compare=False)  # tests: smaller presets

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", Path(self.output))
        object.__setattr__(self, "target", str(self.target))
        object.__setattr__(self, "data", tuple(Path(p) for p in self.data))
        if self.prompts is not None:
            object.__setattr__(self, "prompts", Path(self.prompts))
        if self.bundle is not None:
            object.__setattr__(self, "bundle", Path(self.bundle))
        for name, kind in (("preset", PresetName), ("loss", Loss), ("init", Init),
                           ("kind", Kind)):
            if getattr(self, name) not in get_args(kind):
                raise ConfigError(f"DistillConfig {name}={getattr(self, name)!r} is not one of "
                                  f"{', '.join(get_args(kind))}.")
        if self.layers is not None and self.layers < 1:
            raise ConfigError(f"--layers {self.layers} must be at least 1.")
        if self.head_tokens is not None and self.head_tokens < 0:
            raise ConfigError(f"--head-tokens {self.head_tokens} must be 0 (the whole "
                              f"vocabulary) or a positive count.")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads {self.threads} must be at least 1.")
        for name in ("epochs", "steps", "ttt_steps"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} {value} must be positive.")
        if self.kind == "head" and self.bundle is not None:
            raise ConfigError("--bundle applies to a draft. ---> HINT: export the head with "
                              "ssd-export --target TARGET --draft HEAD_FOLDER.")
        if self.kind == "head" and (self.layers is not None or self.loss != "mix"
                                    or self.init != "spread"):
            raise ConfigError("--layers, --loss and --init shape a draft; a head is one layer "
                              "trained on SafeAILab's loss (docs/distill.md §8). ---> HINT: "
                              "drop them with --kind head.")
        if self.ttt_steps is not None and self.kind != "head":
            raise ConfigError("--ttt-steps applies to --kind head only. ---> HINT: drop it, or "
                              "add --kind head.")

    @property
    def settings(self) -> Preset:
        """The preset with this run's overrides applied."""
        from dataclasses import replace
        presets = HEAD_PRESETS if self.kind == "head" else PRESETS
        preset = replace(presets[self.preset], **self.overrides)
        for name in ("epochs", "steps", "ttt_steps"):
            if getattr(self, name) is not None:
                preset = replace(preset, **{name: getattr(self, name)})
        if self.layers is not None:
            preset = replace(preset, layers=self.layers)
        if self.head_tokens is not None:
            preset = replace(preset, head_tokens=self.head_tokens or None)
        return preset
