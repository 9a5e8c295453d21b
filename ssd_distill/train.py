"""Training the draft on the target's labels, with checkpoints an interrupted run resumes from
(docs/distill.md §4).

    loss = a · CE(p_target top-k ∩ S, q_draft) + (1 − a) · CE(argmax target, q_draft)

The first term is KL(target ‖ draft) up to a constant (the target's top-k mass renormalised
over the draft's output vocabulary S), the second the target's greedy choice: acceptance of a
greedy draft token is exactly "the draft's argmax is the target's".
"""
from __future__ import annotations

import math
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .config import Preset
from .corpus import Corpus
from .data import Rows
from .memory import HeapKeeper
from .student import head_logits

MIX = {"mix": 0.5, "kl": 1.0, "top1": 0.0}   # weight a of the soft term
CHECKPOINT_S = 60.0                          # seconds between checkpoints


@dataclass
class TrainResult:
    steps: int
    planned_steps: int
    seconds: float
    loss: float
    tokens_per_s: float
    stopped_early: bool


def loss_terms(student, rows: Rows, vocab_map: torch.Tensor | None,
               ids: torch.Tensor | None, soft_weight: float) -> torch.Tensor:
    """The mixed loss over the labelled positions of a batch of rows."""
    out = student.base_model(input_ids=rows.ids)     # right-padded: causal attention suffices
    hidden = out.last_hidden_state[rows.mask]                              # (N, H)
    logq = torch.log_softmax(head_logits(student, hidden, ids), -1)        # (N, m)
    top_ids = rows.top_ids[rows.mask].long()                               # (N, K)
    top_logp = rows.top_logp[rows.mask].float()                            # (N, K)
    argmax = rows.argmax[rows.mask]                                        # (N,)
    if vocab_map is not None:                  # token id -> column of S, or -1 outside it
        top_cols, arg_cols = vocab_map[top_ids], vocab_map[argmax]
    else:
        top_cols, arg_cols = top_ids, argmax
    inside = top_cols >= 0
    p = torch.where(inside, top_logp.exp(), torch.zeros_like(top_logp))
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)                        # renormalised on S
    soft = -(p * logq.gather(-1, top_cols.clamp(min=0))).sum(-1)           # (N,)
    arg_in = arg_cols >= 0
    hard = -logq.gather(-1, arg_cols.clamp(min=0)[:, None]).squeeze(-1)    # (N,)
    hard = torch.where(arg_in, hard, torch.zeros_like(hard))
    return (soft_weight * soft + (1 - soft_weight) * hard).mean()


def train(model: torch.nn.Module, params: list[torch.nn.Parameter], rows: Rows | Corpus,
          preset: Preset, loss_fn: Callable[[Rows], torch.Tensor], seed: int,
          checkpoint: Path, resume: bool, progress: Callable[[int, int, str], None]
          ) -> TrainResult:
    """AdamW with a cosine schedule over a fixed number of steps (preset.steps, else
    preset.epochs over the rows), each on a random batch of rows trimmed of padding and scored
    by `loss_fn`; resumed from `checkpoint` when asked (weights, optimizer, step and sampling
    state). The draft and the head (--kind head) share it."""
    steps = preset.steps or max(1, math.ceil(preset.epochs * len(rows) / preset.batch))
    warmup = max(1, steps // 20)
    opt = torch.optim.AdamW(params, lr=preset.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps)
                                                                          / steps)))
    gen = torch.Generator().manual_seed(seed)
    step, seconds_before, tokens, loss_ema = 0, 0.0, 0, float("nan")
    if resume and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False, map_location="cpu")
        for p, saved in zip(params, state["params"]):
            p.data.copy_(saved)
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        gen.set_state(state["gen"])
        step, seconds_before, tokens = state["step"], state["seconds"], state["tokens"]
        loss_ema = state["loss_ema"]
    model.train()
    start, last_save = time.monotonic(), time.monotonic()
    stopped = False
    interrupted = _defer_interrupt()
    keep_heap = HeapKeeper()     # what steps of changing shapes free goes back (memory.py)
    try:
        while step < steps:
            batch = rows.draw(gen, preset.batch)
            width = int(batch.mask.any(0).nonzero().max()) + 1                # trim the padding
            value = loss_fn(batch.trim(width))
            value.backward()
            torch.nn.utils.clip_grad_norm_(params, preset.clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            keep_heap()
            step += 1
            tokens += batch.positions
            loss_ema = value.item() if math.isnan(loss_ema) else \
                0.95 * loss_ema + 0.05 * value.item()
            elapsed = seconds_before + time.monotonic() - start
            progress(step, steps, f"loss {loss_ema:.3f}, {tokens / max(elapsed, 1e-6):,.0f} tok/s")
            if time.monotonic() - last_save > CHECKPOINT_S or step == steps:
                _save(checkpoint, params, opt, sched, gen, step, elapsed, tokens, loss_ema)
                last_save = time.monotonic()
            if interrupted():      # Ctrl-C: this step is done and kept, then the run stops
                _save(checkpoint, params, opt, sched, gen, step, elapsed, tokens, loss_ema)
                raise KeyboardInterrupt
            if elapsed > preset.train_budget_s and step < steps:
                _save(checkpoint, params, opt, sched, gen, step, elapsed, tokens, loss_ema)
                stopped = True
                break
    finally:
        interrupted.restore()
    model.eval()
    elapsed = seconds_before + time.monotonic() - start
    return TrainResult(step, steps, round(elapsed, 1), round(loss_ema, 4),
                       round(tokens / max(elapsed, 1e-6), 1), stopped)


@torch.no_grad()
def agreement(student, rows: Rows, ids: torch.Tensor | None, batch: int = 16) -> tuple[int, int]:
    """(positions where the draft's argmax is the target's, labelled positions), teacher-forced
    on the rows: a greedy draft token's acceptance, position by position."""
    agree = total = 0
    for first in range(0, len(rows.ids), batch):
        part = rows.select(torch.arange(first, min(first + batch, len(rows.ids))))
        hidden = student.base_model(input_ids=part.ids).last_hidden_state[part.mask]
        picks = head_logits(student, hidden, ids).argmax(-1)
        if ids is not None:
            picks = ids[picks]
        agree += int((picks == part.argmax[part.mask]).sum())
        total += part.positions
    return agree, total


def _save(path: Path, params, opt, sched, gen, step, seconds, tokens, loss_ema) -> None:
    """Written beside and renamed: a checkpoint is whole or absent."""
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    torch.save({"params": [p.detach().clone() for p in params], "opt": opt.state_dict(),
                "sched": sched.state_dict(), "gen": gen.get_state(), "step": step,
                "seconds": seconds, "tokens": tokens, "loss_ema": loss_ema}, tmp)
    tmp.replace(path)


class _defer_interrupt:
    """Ctrl-C (SIGINT) during training is noted and acted on between two steps, so that the
    checkpoint written then holds whole steps (weights and optimizer in step). Only the main
    thread can take signals; elsewhere Ctrl-C stays Python's default."""

    def __init__(self) -> None:
        self.asked = False
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self._note)

    def _note(self, signum, frame) -> None:
        self.asked = True

    def __call__(self) -> bool:
        if self.asked:
            self.restore()
        return self.asked

    def restore(self) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            self.old = None
