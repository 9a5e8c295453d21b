"""What the head tests share (test_heads_run.py: EAGLE-3; export/test_mtp.py: an MTP layer):
a row of the loop set up as a batch sets one up, and a check that every round's drafts equal a
PyTorch reference's for the same committed tokens."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from ssd_runtime import Generator
from ssd_runtime.round.loop import Loop, Row, Stats
from ssd_runtime.scheduler.schedule import FixedK


def head_row(gen: Generator, prompt: list[int], k: int, slot: int = 0) -> Row:
    """A row drafting k tokens a round in `slot`, its prompt prefilled, the head caught up."""
    req = gen.request(prompt, max_new_tokens=12, k=k)
    schedule = FixedK(k)
    row = Row(list(req.ids), req.rule, schedule, gen.drafter(req.rule, schedule, None, slot),
              Stats(), req.eos_ids, 12, len(req.ids))
    gen.target.prefill(np.asarray(row.seq[:-1], np.int64), 0, slot=slot)
    row.target_len = len(row.seq) - 1
    row.drafter.catch_up(row.seq, row.target_len)
    return row


def assert_batch_drafts_as(gen: Generator, reference: Callable[[list[int], int], list[int]],
                           prompts: list[list[int]], k: int, rounds: int) -> None:
    """The prompts in one batch (slot i for prompt i), `rounds` rounds of k drafts: each row's
    drafts are reference(its tokens before the round, k)."""
    rows = [head_row(gen, prompt, k, slot) for slot, prompt in enumerate(prompts)]
    loop = Loop(gen.target, gen.draft)
    for _ in range(rounds):
        befores = [list(row.seq) for row in rows]
        lengths = (np.array([row.target_len for row in rows], np.int64),
                   np.array([row.drafter.draft_len for row in rows], np.int64))
        loop.round(rows, lengths=lengths)
        for row, before in zip(rows, befores):
            assert row.drafts == reference(before, k)
