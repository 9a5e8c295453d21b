"""The draft → verify → correct loop of docs/design.md §4, batch 1.

`decode` yields the tokens each round emits. It owns the two lengths: the
target's rows advance by j + 1 per round, the draft's rows stay at what is
still valid, and rejected rows are simply overwritten later (free rollback).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Iterator

import numpy as np

from ..backends.base import ModelSession
from .drafting import Schedule, SequentialDrafter
from .rules import Rule


@dataclass
class Stats:
    backend: str = "cpu"
    k: int | str = 0              # the k asked for: an int, or "auto"
    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0
    target_calls: int = 0
    draft_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    lookup_drafted: int = 0       # of drafted, the tokens found by lookup (docs/design.md §6.1)
    lookup_accepted: int = 0      # ... and of accepted
    split_bets: int = 0           # split mode: rounds whose next round was drafted ahead
    split_hits: int = 0           # ... and whose bet was right
    mode: str = "sequential"
    threads: str = ""             # intra-op threads "target:draft"
    stop_reason: str = ""
    seconds: dict[str, float] = field(
        default_factory=lambda: {"prefill": 0.0, "draft": 0.0, "verify": 0.0, "host": 0.0,
                                 "decode": 0.0, "total": 0.0})

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def lookup_acceptance_rate(self) -> float:
        return self.lookup_accepted / self.lookup_drafted if self.lookup_drafted else 0.0

    @property
    def model_acceptance_rate(self) -> float:
        model = self.drafted - self.lookup_drafted
        return (self.accepted - self.lookup_accepted) / model if model else 0.0

    @property
    def mean_accepted_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def mean_k(self) -> float:
        return self.drafted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        decode = self.seconds["decode"]
        return self.new_tokens / decode if decode > 0 else 0.0

    def as_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k != "seconds"},
                "acceptance_rate": self.acceptance_rate,
                "lookup_acceptance_rate": self.lookup_acceptance_rate,
                "model_acceptance_rate": self.model_acceptance_rate,
                "mean_accepted_per_round": self.mean_accepted_per_round, "mean_k": self.mean_k,
                "tokens_per_s": self.tokens_per_s, "seconds": dict(self.seconds)}


def decode(target: ModelSession, drafter: SequentialDrafter,
           rule: Rule, prompt: list[int], max_new_tokens: int,
           schedule: Schedule, eos_ids: set[int], stats: Stats) -> Iterator[list[int]]:
    """Yield the tokens of each round until EOS, max_new_tokens or the context end.

    A consumer may stop early (close the generator); the stats stay consistent.
    """
    start = perf_counter()
    seq = list(prompt)                       # every token; seq[p] sits at position p
    target.prefill(np.asarray(seq[:-1], np.int64))
    target_len = len(seq) - 1                # rows of valid keys/values in the target's cache
    if schedule.uses_draft:
        drafter.prefill(seq[:-1])            # else the draft catches up if it is ever used
    spent = stats.seconds
    spent["prefill"] = perf_counter() - start
    decode_start = perf_counter()
    try:
        while True:
            room = target.max_context - len(seq)
            produced = len(seq) - len(prompt)
            if produced >= max_new_tokens or room <= 0:
                stats.stop_reason = "length" if produced >= max_new_tokens else "context"
                return
            k_round = min(schedule.next_k(), room - 1, max_new_tokens - produced - 1)
            t0 = perf_counter()
            drafts, draft_probs = drafter.propose(seq, k_round)   # k_round = 0 drops a stale bet
            t1 = perf_counter()
            # verify: one target pass over [last, d1..dk] at positions target_len..target_len+k
            drafter.bet(drafts)              # split mode: the draft works on while we verify
            logits = target.forward(np.asarray([seq[-1], *drafts], np.int64), target_len)
            t2 = perf_counter()
            j, t = rule.verify(logits, drafts, draft_probs, target_len + 1)   # the first's position
            schedule.observe(len(drafts), j, t2 - t0)
            target_len += j + 1              # rows for last, d1..dj stay valid
            drafter.settle(target_len, j == len(drafts), t)
            new = [*drafts[:j], t]
            ended = next((i for i, tok in enumerate(new) if tok in eos_ids), None)
            if ended is not None:
                new = new[:ended + 1]
            seq += new
            rule.commit(new)
            stats.rounds += 1
            stats.target_calls += 1
            stats.drafted += len(drafts)
            stats.accepted += j
            if taken := drafter.from_lookup:
                stats.lookup_drafted += taken
                stats.lookup_accepted += min(j, taken)
            spent["draft"] += t1 - t0
            spent["verify"] += t2 - t1
            stats.new_tokens = len(seq) - len(prompt)
            yield new
            if ended is not None:
                stats.stop_reason = "eos"
                return
    finally:
        drafter.close()
        stats.draft_calls = drafter.draft_calls
        stats.split_hits, stats.split_bets = drafter.hits, drafter.bets
        spent["decode"] = perf_counter() - decode_start
        spent["host"] = max(0.0, spent["decode"] - spent["draft"] - spent["verify"])
        spent["total"] = perf_counter() - start
