"""What training a head costs on this machine, timed before a budget is planned (plan.py): a
few steps of a throwaway head on the held-out rows, in float32 and under bfloat16 autocast
(mixed precision: the weights and the optimizer stay float32). A GPU trains in bfloat16; a CPU
in whichever was faster here, if by PREFER (CPUs with bfloat16 instructions are about 1.7×
faster so; others emulate it, slower)."""
from __future__ import annotations

import time

import torch

from .corpus import Corpus
from .ttt import loss, to_device

STEPS = 3                # timed steps a precision, after one untimed
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
            rows = to_device(held.draw(gen, batch), device)
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
