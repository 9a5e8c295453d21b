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
AnswersQuant = Literal["none", "int8", "int4"]   # --kind head: the answering bundle's weights
HeadInit = Literal["target", "random"]  # the head starts from the target's last layer, or as
                                        # SafeAILab's (PyTorch's defaults)


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
    # --kind head's cached answers (§9)
    heldout_prompts: int = 48    # of the shipped held-out set (another source than training)
    max_prompt: int = 512        # a prompt's most tokens (longer ones are skipped)
    part_size: int = 64          # answers per cache part (one batched call of the runtime)
    coverage: float = 0.95       # of the answers' tokens the draft vocabulary covers
    budget: str | None = None    # the time a run plans for; None: the counts above


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
#
# The answers come from the answer cache (§9): `prompts` is the number of answers when no
# budget plans it, `new_tokens` an answer's most tokens; `head_tokens` None chooses the draft
# vocabulary by `coverage`. default and large plan answers and epochs within their `budget`
# (`--budget` overrides it); quick has fixed counts, for tests.
HEAD_PRESETS: dict[str, Preset] = {
    "quick": Preset(layers=1, prompts=24, new_tokens=24, text_tokens=0, seq_len=96, batch=8,
                    epochs=8, lr=3e-3, head_tokens=None, generate_budget_s=120,
                    train_budget_s=120, min_tokens=200, clip=0.5, ttt_steps=3,
                    heldout_prompts=6, max_prompt=64, part_size=8),
    "default": Preset(layers=1, prompts=400, new_tokens=320, text_tokens=0, seq_len=832,
                      batch=8, epochs=2, lr=1e-3, head_tokens=None, generate_budget_s=3600,
                      train_budget_s=3600, clip=0.5, ttt_steps=4, budget="1h"),
    "large": Preset(layers=1, prompts=2250, new_tokens=512, text_tokens=0, seq_len=1024,
                    batch=8, epochs=2, lr=5e-4, head_tokens=None, generate_budget_s=14400,
                    train_budget_s=14400, clip=0.5, ttt_steps=7, budget="4h"),
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
    budget: str | None = None            # --kind head: the time to plan for ("1h"); the preset's
    answers: int | None = None           # --kind head: a fixed count of answers instead
    cache: Path | None = None            # --kind head: the answer cache (default OUTPUT.answers)
    data_budget: str | None = None       # --kind head: the cache's most bytes or positions
    answers_bundle: Path | None = None   # --kind head: the bundle that answers (default: export)
    answers_quant: AnswersQuant = "none"  # --kind head: that export's target weights
    head_init: HeadInit = "target"
    overrides: dict = field(default_factory=dict, compare=False)  # tests: smaller presets

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", Path(self.output))
        object.__setattr__(self, "target", str(self.target))
        object.__setattr__(self, "data", tuple(Path(p) for p in self.data))
        if self.prompts is not None:
            object.__setattr__(self, "prompts", Path(self.prompts))
        for name in ("bundle", "cache", "answers_bundle"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        for name, kind in (("preset", PresetName), ("loss", Loss), ("init", Init),
                           ("kind", Kind), ("answers_quant", AnswersQuant),
                           ("head_init", HeadInit)):
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
        head_only = {"budget": self.budget, "answers": self.answers, "cache": self.cache,
                     "data_budget": self.data_budget, "answers_bundle": self.answers_bundle,
                     "answers_quant": None if self.answers_quant == "none" else 1,
                     "head_init": None if self.head_init == "target" else 1}
        given = [f"--{k.replace('_', '-')}" for k, v in head_only.items() if v is not None]
        if self.kind != "head" and given:
            raise ConfigError(f"{', '.join(given)}: for --kind head only. ---> HINT: drop "
                              f"{'it' if len(given) == 1 else 'them'}, or add --kind head.")
        if self.answers is not None and self.answers < 1:
            raise ConfigError(f"--answers {self.answers} must be at least 1.")
        if self.budget is not None and self.answers is not None:
            raise ConfigError("--budget plans the number of answers and --answers fixes it. "
                              "---> HINT: give one of them.")
        if self.answers_bundle is not None and self.answers_quant != "none":
            raise ConfigError("--answers-quant shapes the bundle ssd-distill exports; "
                              "--answers-bundle gives one. ---> HINT: give one of them.")
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
        if self.kind == "head" and self.head_tokens == 0:
            preset = replace(preset, head_tokens=int(1e9))   # the whole vocabulary
        if self.budget is not None:
            preset = replace(preset, budget=self.budget)
        if self.answers is not None:
            preset = replace(preset, prompts=self.answers, budget=None)
        return preset
