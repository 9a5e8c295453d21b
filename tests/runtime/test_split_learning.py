"""Split mode teaches the adaptive-k learner what sequential mode does: a hit's tokens pass
through the schedule's stopping rule and reach its confidence bins like any drafted token."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime.round.acceptance import GreedyAcceptance
from ssd_runtime.round.drafting import Drafter, SplitDrafter
from alone import decode
from ssd_runtime.round.loop import Stats
from ssd_runtime.scheduler.cost import CostModel
from ssd_runtime.scheduler.learning import Acceptance
from ssd_runtime.scheduler.schedule import AdaptiveK

VOCAB = 16


class Counting:
    """A model whose next token is always (last + 1) mod VOCAB, with top probability `p`:
    target and draft agree on everything, so every split bet is a hit."""

    backend, threads, max_new_len = "cpu", 1, 64

    def __init__(self, name: str, p: float, tops: bool, max_context: int = 512) -> None:
        self.name, self.p, self.tops, self.max_context = name, p, tops, max_context
        self.calls = 0

    def _logits(self, ids: np.ndarray) -> np.ndarray:
        other = np.log((1 - self.p) / (VOCAB - 1))
        out = np.full((len(ids), VOCAB), other, np.float32)
        out[np.arange(len(ids)), (ids + 1) % VOCAB] = np.log(self.p)
        self.last = int((ids[-1] + 1) % VOCAB)
        return out

    def forward(self, token_ids: np.ndarray, past_len: int) -> np.ndarray:
        self.calls += 1
        return self._logits(np.asarray(token_ids))

    def prefill(self, token_ids: np.ndarray, past_len: int = 0) -> None:
        pass

    def top(self):
        return (self.last, self.p) if self.tops else None


class Recording(Acceptance):
    def observe(self, drafted, accepted, tops=()):
        self.rounds.append((drafted, len(tops)))
        super().observe(drafted, accepted, tops)


def cheap_draft() -> CostModel:
    return CostModel(target_step=1.0, draft_step=0.05, verify=tuple(1.0 + 0.01 * k for k in range(9)))


def run(mode: str, tops: bool, p: float = 0.97, tokens: int = 120):
    learnt = Recording()
    learnt.rounds = []
    schedule = AdaptiveK(cheap_draft(), max_k=4, learnt=learnt)
    rule = GreedyAcceptance()
    draft = Counting("draft", p, tops)
    drafter = {"sequential": Drafter, "split": SplitDrafter}[mode](draft, rule, schedule)
    stats = Stats(mode=mode)
    out = [t for new in decode(Counting("target", p, tops), drafter, rule, [1, 2, 3], tokens,
                               schedule, set(), stats) for t in new]
    return out, learnt, stats


@pytest.mark.parametrize("tops", [True, False], ids=["graph-tops", "logits"])
def test_split_hits_reach_the_confidence_bins(tops):
    seq_out, seq_learnt, _ = run("sequential", tops)
    out, learnt, stats = run("split", tops)
    assert out == seq_out
    assert stats.split_hits > 10 and stats.split_hits == stats.split_bets
    # every round that drafted handed the learner each drafted token's confidence
    drafted = [(d, n) for d, n in learnt.rounds if d]
    assert drafted and all(n == d for d, n in drafted), drafted
    # and so the bins hold about what sequential mode's hold: confident tokens that pass
    b = int(0.97 * 10)
    assert learnt.seen[b] / learnt.scale > 0.7 * seq_learnt.seen[b] / seq_learnt.scale
    assert learnt.hits[b] / learnt.seen[b] > 0.95 and learnt.chance(0.97) > 0.9


def test_a_hit_is_cut_where_the_stopping_rule_says():
    """A hit's round obeys keep_drafting like a drafted one: with the learner taught that
    these tokens fail, a bet's tokens are not all proposed."""
    learnt = Acceptance()
    for _ in range(200):
        learnt.observe(4, 0, [0.97] * 4)
    schedule = AdaptiveK(cheap_draft(), max_k=4, learnt=learnt)
    drafter = SplitDrafter(Counting("draft", 0.97, True), GreedyAcceptance(), schedule)
    drafter.advance([1, 2])
    drafter.ready = ([4, 5, 6, 7], [None] * 4, [(None, (t, 0.97)) for t in (5, 6, 7, 8)])
    schedule.next_k()
    tokens, _, more = drafter.start([1, 2, 3], 4)
    drafter.close()
    assert len(tokens) < 4 and len(schedule._tops) == len(tokens) and more == 0
