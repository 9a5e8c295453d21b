"""Calibration (docs/design.md §6): the cost model's step and verification times, measured
on this machine's sessions in the loop's own pattern (draft steps, then a verification).
"""
from __future__ import annotations

from time import perf_counter

import numpy as np

from ..backends.base import ModelSession
from ..errors import ConfigError
from .cost import CostModel, rising


def calibrate(target: ModelSession, draft: ModelSession, max_draft: int, past_len: int = 128,
              repeats: int = 9) -> CostModel:
    """Median times of draft steps and of target passes of 1..max_draft+1 tokens.

    Timed in the loop's own pattern — k draft steps, then a verify of k+1 tokens — so
    that each model pays the cold caches and thread wake-ups it pays in real rounds;
    timed back to back, a small draft looks several times cheaper than it is.
    """
    past_len = min(past_len, target.max_context - max_draft - 2)
    target.prefill(np.zeros(past_len, np.int64))
    draft.prefill(np.zeros(past_len, np.int64))
    one = np.zeros(1, np.int64)
    verify_times: list[list[float]] = [[] for _ in range(max_draft + 1)]
    first_times: list[float] = []                      # a round's first draft step
    draft_times: list[float] = []                      # the others
    for r in range(repeats + 1):                       # the first pass warms up
        for k in range(max_draft + 1):
            for i in range(k):
                t0 = perf_counter()
                draft.forward(one, past_len)
                if r:
                    (draft_times if i else first_times).append(perf_counter() - t0)
            ids = np.zeros(k + 1, np.int64)
            t0 = perf_counter()
            target.forward(ids, past_len)
            if r:
                verify_times[k].append(perf_counter() - t0)
    verify = rising([float(np.median(t)) for t in verify_times])
    first = float(np.median(first_times))
    later = float(np.median(draft_times)) if draft_times else first
    return CostModel(target_step=verify[0], draft_step=later, verify=verify, draft_first=first)


def calibrate_rows(target: ModelSession, rows: list[int], past_len: int = 128,
                   repeats: int = 9) -> dict[int, float]:
    """v(N) for a draft tree (tree_plan.py): the median seconds of target passes of N new rows
    for each N of `rows`, over `past_len` committed ones, each after a one-row pass (the
    loop's pattern: a round's verification follows the last one's), never decreasing in N. A
    tree's mask changes what each row reads, not how much is computed: a chain's call of N
    rows costs what a tree's does."""
    rows = sorted(set(rows))
    if rows[0] < 1 or rows[-1] > target.max_new_len:
        raise ConfigError(f"v(N) is timed for 1 <= N <= {target.max_new_len} rows (the target "
                          f"graph's most new tokens a call); asked for {rows}.")
    past_len = min(past_len, target.max_context - rows[-1] - 1)
    target.prefill(np.zeros(past_len, np.int64))
    one = np.zeros(1, np.int64)
    times: dict[int, list[float]] = {n: [] for n in rows}
    for r in range(repeats + 1):                       # the first pass warms up
        for n in rows:
            target.forward(one, past_len)
            ids = np.zeros(n, np.int64)
            t0 = perf_counter()
            target.forward(ids, past_len)
            if r:
                times[n].append(perf_counter() - t0)
    return dict(zip(rows, rising([float(np.median(times[n])) for n in rows])))
