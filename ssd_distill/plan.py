"""Presets by budget (docs/distill.md §9): `--budget 1h` becomes a number of answers, of
positions and of epochs, from the rates measured at the start of the run on this machine
(answers written, features prefilled, positions trained a second), printed before the work.

    time left  =  new · (1/answer + tokens_per_position/feature)      write and prefill
               +  all · epochs / train                                 train
               +  held_without_features · tokens_per_position/feature

`new` positions are solved for; held answers (the cache's) cost only their training and any
missing features. The epochs are chosen first: as many passes as make training a position
take as long as writing it (its answer and its features), between EPOCHS and MOST_EPOCHS.
A target slow to answer (Gemma 3 270M, whose 262,144-row output layer is most of a step)
gets more passes over fewer answers: measured, a second pass over the same answers bought
more agreement than the answers its time would have written (docs/distill.md §9, "Epochs
against answers"). When even the held data cannot be trained EPOCHS times, the plan trains
fewer passes and writes nothing new; when --data-budget caps the data, the time left goes
to passes, up to MOST_EPOCHS.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from ssd_runtime.errors import ConfigError

EPOCHS = 2.0             # the fewest passes over the data a plan trains ...
MOST_EPOCHS = 4.0        # ... and the most (measured no further: docs/distill.md §9)
RESERVE = 0.05           # of the budget kept for the held-out agreement, the card, the slack
MIN_EPOCHS = 0.25
# Training's rate over a whole run against the probe's (a few steps of half batches: probe.py)
# is lower (docs/distill.md §9, "The budget"): the plan trains at this share of the probe's
# rate, so that the budget stops training early less often
TRAIN_REALISED = 0.75


@dataclass(frozen=True)
class Rates:
    """Measured on this machine at the start of the run."""

    answer: float            # answer positions written a second (batched, the runtime)
    feature: float           # tokens (prompt + answer) prefilled a second
    train: float             # positions trained a second (all unrolled steps)
    tokens_per_position: float   # prompt + answer tokens per answer position
    positions_per_answer: float
    questions_per_position: float = 0.0   # tokens of the model's own questions (Magpie)
                                          # written per answer position
    precision: str = "float32"   # what training runs in (probe.py): the faster here


@dataclass(frozen=True)
class Plan:
    answers: int             # answers the cache should hold for training
    new_positions: int       # to write now, about
    positions: int           # trained on, about
    epochs: float
    answer_s: float          # the stages' expected seconds
    feature_s: float
    train_s: float
    budget_s: float
    note: str = ""
    precision: str = "float32"   # training's (probe.py), kept by a resumed run

    def as_dict(self) -> dict:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def parse_budget(text: str) -> float:
    """'1h', '90m', '1h30m', '600s', '600' (seconds) -> seconds."""
    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*",
                     text)
    if not text.strip() or m is None or not any(m.groups()):
        raise ConfigError(f"--budget {text!r} is not a duration. ---> HINT: e.g. 1h, 45m, "
                          f"1h30m or 600s.")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    seconds = h * 3600 + mi * 60 + s
    if seconds < 60:
        raise ConfigError(f"--budget {text!r} is under a minute: too short to measure the "
                          f"machine, write answers and train. ---> HINT: at least 5m.")
    return seconds


_UNITS = {"b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_data_budget(text: str) -> tuple[int | None, int | None]:
    """'2GB', '512MiB', '4000B' -> (bytes, None); '500k', '1.5M', '200000' -> (None, positions)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in _UNITS and unit not in ("k", "m")):
        raise ConfigError(f"--data-budget {text!r} is neither a size nor a count. ---> HINT: "
                          f"bytes with a unit (2GB, 512MiB) or answer positions (500k, 1M).")
    value = float(m.group(1))
    if unit in _UNITS:
        return int(value * _UNITS[unit]), None
    return None, int(value * {"": 1, "k": 1e3, "m": 1e6}[unit])


def make_plan(budget_s: float, elapsed_s: float, rates: Rates, held_positions: int,
              held_unfeatured_tokens: int, epochs: float | None, most_positions: int | None,
              after_s: float = 0.0) -> Plan:
    """The answers to hold, the epochs, and each stage's expected time (module docstring);
    `after_s` is kept for what follows training (the pair's worth: an export)."""
    left = budget_s * (1 - RESERVE) - elapsed_s - after_s
    feature_cost = rates.tokens_per_position / rates.feature
    fixed = held_unfeatured_tokens / rates.feature
    # a new position's writing: its answer (and the model's own questions, where it writes
    # them) and its features
    write = (1 + rates.questions_per_position) / rates.answer + feature_cost
    train = rates.train * TRAIN_REALISED
    passes = min(MOST_EPOCHS, max(EPOCHS, write * train)) if epochs is None else epochs
    new = max(0.0, (left - fixed - held_positions * passes / train) / (write + passes / train))
    note = ""
    capped = most_positions is not None and held_positions + new > most_positions
    if capped:
        new = max(0.0, most_positions - held_positions)
        note = f"--data-budget: at most {most_positions:,} positions"
    total = held_positions + new
    if epochs is None and total:
        room = (left - fixed - new * write) * train / total     # passes the time left allows
        if capped:                                              # the time left goes to passes
            passes = min(MOST_EPOCHS, max(passes, room))
        if new == 0:                                            # the held data alone
            passes = max(MIN_EPOCHS, min(passes, room))
            note = note or "the budget trains the held answers and writes none"
    if left <= 0 or total == 0:
        raise ConfigError(f"the budget of {budget_s / 60:.0f} min leaves no time to train "
                          f"(the start took {elapsed_s / 60:.1f} min). ---> HINT: a larger "
                          f"--budget.")
    answers = math.ceil(total / rates.positions_per_answer)
    return Plan(answers=answers, new_positions=int(new), positions=int(total), epochs=passes,
                answer_s=new * (1 + rates.questions_per_position) / rates.answer,
                feature_s=new * feature_cost + fixed,
                train_s=total * passes / train, budget_s=budget_s, note=note,
                precision=rates.precision)


def describe(plan: Plan, rates: Rates, elapsed_s: float) -> list[str]:
    """The plan as the lines printed before the work starts."""
    end = elapsed_s + plan.answer_s + plan.feature_s + plan.train_s
    return [
        f"measured here: answers {rates.answer:,.0f} positions/s (batched), features "
        f"{rates.feature:,.0f} tokens/s (a prefill), training {rates.train:,.0f} positions/s "
        f"({rates.precision}; planned at {TRAIN_REALISED:.0%} of it); "
        f"{rates.positions_per_answer:.0f} positions an answer, "
        f"{rates.tokens_per_position:.2f} tokens a position with its prompt",
        f"plan for {_clock(plan.budget_s)}: {plan.answers:,} answers, {plan.positions:,} "
        f"positions ({plan.new_positions:,} new), {plan.epochs:.3g} epoch(s)"
        + (f" ({plan.note})" if plan.note else ""),
        f"expected: answers {_clock(plan.answer_s)}, features {_clock(plan.feature_s)}, "
        f"training {_clock(plan.train_s)}; done at about {_clock(end)} of {_clock(plan.budget_s)}",
    ]


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    h, m, s = seconds // 3600, seconds % 3600 // 60, seconds % 60
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
