"""One row driven through `Loop.round` by hand, for tests that bring their own rule, drafter
or sessions (a wrong rule, a counting session): what the engine (batch.py) does for a batch
of one, without a Generator."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from ssd_runtime.round.drafting import call
from ssd_runtime.round.loop import Loop, Row, Stats


def decode(target, drafter, rule, prompt: list[int], max_new_tokens: int, schedule,
           eos_ids: set[int], stats: Stats) -> Iterator[list[int]]:
    """Yield each round's tokens until EOS or max_new_tokens; `stats` as the engine keeps."""
    row = Row(list(prompt), rule, schedule, drafter, stats, eos_ids, max_new_tokens,
              len(prompt))
    if len(prompt) > 1:
        call(target.prefill, np.asarray(prompt[:-1], np.int64), 0, row.slot)
        row.target_len = len(prompt) - 1
        if schedule.uses_draft:
            drafter.catch_up(row.seq, row.target_len)
    loop = Loop(target, drafter.draft)
    try:
        while row.room(loop.max_context) > 0:
            new = loop.round([row])[0]
            yield new
            if new[-1] in eos_ids:
                return
    finally:
        drafter.close()
        stats.draft_calls = drafter.draft_calls
        stats.split_hits, stats.split_bets = drafter.hits, drafter.bets
