"""This machine's rates, measured before a budget is planned (plan.py): the answers and the
prefill as the run's start did them, training as a few steps of a throwaway head on the
held-out rows, in float32 and under bfloat16 autocast (mixed precision: the weights and the
optimizer stay float32). A GPU trains in bfloat16; a CPU in whichever was faster here, if by
PREFER (CPUs with bfloat16 instructions are about 1.7× faster so; others emulate it)."""
from __future__ import annotations

import time

import torch

from ssd_graphs.eagle3 import Eagle3Head

from .answers import SELF_TOKENS, Written
from .cache import AnswerCache
from .config import Preset
from .corpus import Corpus
from .head_init import head_config
from .memory import trim
from .plan import Rates
from .ttt import loss, to_device

STEPS = 2                # timed steps a precision, after one untimed, of half batches
PREFER = 1.15            # bfloat16 on a CPU only when this much faster
PRECISIONS = ("float32", "bfloat16")


def train_rates(head, held: Corpus, vocab: int, batch: int, ttt_steps: int, device
                ) -> dict[str, float]:
    """Positions trained a second in each precision (the head is changed: throw it away)."""
    Vd = head.config.draft_vocab_size
    t2d = torch.zeros(vocab, dtype=torch.bool, device=device)
    t2d[:Vd] = True
    draft_of = torch.where(t2d, torch.arange(vocab, device=device), -1)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    rates = {}
    for precision in PRECISIONS:
        positions, seconds = 0, 0.0
        for step in range(STEPS + 1):
            rows = to_device(held.draw(gen, max(1, batch // 2)), device)
            start = time.monotonic()
            with autocast(device, precision):
                value = loss(head, rows, ttt_steps, t2d, draft_of)
            value.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step:                                 # the first step warms up
                positions += rows.positions
                seconds += time.monotonic() - start
        rates[precision] = positions / max(seconds, 1e-6)
    return rates


def choose(rates: dict[str, float], device) -> str:
    if device.type == "cuda" or rates["bfloat16"] >= PREFER * rates["float32"]:
        return "bfloat16"
    return "float32"


def autocast(device, precision: str):
    """The context a training step runs in: bfloat16 autocast, or plain float32."""
    return torch.autocast(device.type, torch.bfloat16, enabled=precision == "bfloat16")


def measure(cache: AnswerCache, wrote: Written, f_tokens: int, f_seconds: float,
            held: Corpus, target, layer_ids: list[int], preset: Preset, device,
            self_share: float, planned: bool) -> Rates:
    """This machine's rates: measured now where this run did the work, else those the cache
    recorded when it did; training timed on a few steps of a throwaway head."""
    seen = cache.manifest.get("rates", {})
    answer = wrote.positions / wrote.seconds if wrote.seconds > 0 else seen.get("answer")
    feature = f_tokens / f_seconds if f_seconds > 0 else seen.get("feature")
    vocab = int(target.config.vocab_size)
    head = Eagle3Head(head_config(target.config, min(8192, vocab), layer_ids),
                      embed_weight=target.get_input_embeddings().weight).to(device)
    per_precision = train_rates(head, held, vocab, preset.batch, preset.ttt_steps, device)
    del head
    trim()                   # its steps' freed memory, which answering would otherwise keep
    # a fixed-count run trains float32 on a CPU: the same weights whatever the timing said
    precision = choose(per_precision, device) if planned or device.type == "cuda" \
        else "float32"
    tokens = int((held.rows[:, 2] + held.rows[:, 3]).sum())
    per_answer = held.positions / max(len(held), 1)
    rates = Rates(answer=answer or 0.0, feature=feature or 0.0,
                  train=per_precision[precision], precision=precision,
                  tokens_per_position=tokens / max(held.positions, 1),
                  positions_per_answer=per_answer,
                  questions_per_position=self_share * SELF_TOKENS / 2 / per_answer)
    if wrote.seconds > 0 and f_seconds > 0:
        cache.manifest["rates"] = {"answer": rates.answer, "feature": rates.feature}
        cache.write_json(cache.root / "cache.json", cache.manifest)
    return rates
