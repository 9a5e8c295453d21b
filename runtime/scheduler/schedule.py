"""Schedules: how many tokens each round drafts, and from which source (docs/design.md §4,
§6, §6.1). `FixedK` drafts k every round; `AdaptiveK` the k that maximises expected tokens
per second under the cost model (cost.py) and what it learns (learning.py), and stops
drafting early where more tokens are not worth their time.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .cost import CostModel, expected_tokens
from .learning import PROBE, PROBE_BACKOFF, PROBE_EVERY, Acceptance, Sources, tenth
from .tree_plan import TreeAcceptance, TreePlan, plan_for

# A tree's plan (tree_plan.plan_for, ~0.6 ms) is worked out again with the chain's, but at
# most every TREE_REPLAN rounds: what it reads (acceptance by depth and rank, forgotten at
# 0.98 a round) moves over tens of rounds.
TREE_REPLAN = 32


@dataclass
class FixedK:
    """k draft tokens every round (docs/design.md §6.1): a lookup continuation, up to k, where
    its first token is likelier to pass than a model token (both learnt, when the learners are
    given; else always), else the draft model's k; `model=False` drafts lookup tokens only."""

    k: int
    model: bool = True
    learnt: Acceptance | None = None      # the draft model's acceptance
    adaptive = False                      # drafts as asked (no pricing of its own)
    lookup: Acceptance | Sources | None = None      # lookup tokens'
    _taken: int = 0
    _matched: int = 0

    @property
    def uses_draft(self) -> bool:
        return self.k > 0 and self.model

    def next_k(self) -> int:
        self._taken = 0
        return self.k

    @property
    def model_cap(self) -> int:
        return self.k if self.model else 0

    def take_lookup(self, matched: int, found: int, k: int) -> int:
        if self.model and self.learnt is not None and self.lookup is not None \
                and not lookup_beats(self.lookup, self.learnt, matched):
            return 0
        self._taken, self._matched = min(found, k), matched
        return self._taken

    def extend_lookup(self, taken: int, k: int) -> bool:
        """A taken continuation is the round (as in a batch's slot, batch.py: a fixed k drafts
        the same tokens alone and in a batch)."""
        return False

    def take_forced(self, forced: int, k: int) -> int:
        """After tokens the grammar forces (docs/design.md §4) the model drafts its k."""
        return k if self.model else 0

    def planned_tree(self) -> TreePlan | None:
        """A fixed k drafts chains (a tree's shape by hand: Drafter.tree_shape)."""
        return None

    def observe_tree(self, tree, path) -> None:
        """A tree round's verdict: a fixed k learns nothing of trees."""

    def keep_drafting(self, drafted: int, logits: np.ndarray, top=None) -> bool:
        return True

    def observe(self, drafted: int, accepted: int, seconds: float | None = None,
                forced: int = 0) -> None:
        taken = self._taken
        if taken and self.lookup is not None:
            self.lookup.observe_run(taken, accepted, self._matched)
        if self.learnt is not None and drafted > taken and accepted >= taken:
            self.learnt.observe(drafted - taken, accepted - taken)


def lookup_beats(lookup: Acceptance | Sources, model: Acceptance, matched: int) -> bool:
    """A fixed k's choice of source (FixedK, a batch's slot): a continuation found on an n-gram
    of `matched` tokens is drafted where its first token is at least as likely to pass as a
    model token; declined, what was learnt of lookup ages (Acceptance.forget)."""
    if lookup.chance_in(matched, 0) >= model.alpha:
        return True
    lookup.forget(matched)
    return False


class RoundTimes:
    """Seconds a round takes by how many tokens it drafts (its drafting and its verification):
    the calibration's times, times the machine's pace, times each k's own correction.

    The calibration times each model alone at one past length; in the loop a verification's
    time grows with k otherwise than the calibration's did (docs/performance-notes.md, the
    first section: the early `ssd-bench` runs), and a shared machine speeds up and slows down for
    every k alike. So every round moves the pace a tenth of the way (in ratio) to what it took
    against the calibration, and moves its own k's correction a twentieth of the way to what
    it took against the expected time: the pace takes the machine's drift, the corrections
    the loop's shape, and a k seldom drafted follows the pace instead of keeping the time of
    its last visit. Times learnt one k at a time would keep a slow spell's price on the k
    drafted in it and the calibration's on those never drafted, and the plan would compare k
    at different moments' prices (figures: docs/performance-notes.md, "Figures from code
    comments"; `tools/replay_rules.py`). Decisions depend on ratios of these times only. A
    round counts at most 25% over or 20% under what is expected of it, so one preempted round
    cannot move them.
    """

    def __init__(self, calibrated: Sequence[float], pace_weight: float = 0.1,
                 shape_weight: float = 0.05) -> None:
        self.calibrated = list(calibrated)
        self.pace, self.correction = 1.0, [1.0] * len(self.calibrated)
        self.pace_weight, self.shape_weight = pace_weight, shape_weight

    @property
    def seconds(self) -> list[float]:
        """What a round drafting k = 0..max_k is expected to take (worked out when asked:
        the plan asks every few rounds, observe() runs every round)."""
        pace = self.pace
        return [t * pace * c for t, c in zip(self.calibrated, self.correction)]

    @classmethod
    def from_cost(cls, cost: CostModel, max_k: int) -> RoundTimes:
        return cls([cost.round_cost(k) * cost.target_step for k in range(max_k + 1)])

    def observe_pace(self, expected: float, seconds: float) -> None:
        """A round of another shape (lookup tokens: docs/design.md §6.1) that was expected to
        take `expected` seconds at pace 1 moves the pace only."""
        self.pace *= _clipped(seconds / (expected * self.pace)) ** self.pace_weight

    def observe(self, drafted: int, seconds: float) -> None:
        if drafted >= len(self.calibrated):
            return
        shaped = seconds / (self.calibrated[drafted] * self.pace * self.correction[drafted])
        self.observe_pace(self.calibrated[drafted], seconds)
        self.correction[drafted] *= _clipped(shaped) ** self.shape_weight


@dataclass
class AdaptiveK:
    """Choose k each round to maximise expected tokens per unit time.

    The plan: the k that maximises (1 + α + … + α^k) / seconds(k), α learnt online and
    seconds(k) from RoundTimes; no draft at all when that is 0. Otherwise drafting goes on,
    up to max_k, while more tokens are worth their time: drafting m more adds
    P(every token so far survives) · (α + … + α^m) expected tokens for
    seconds(d + m) - seconds(d), and the round stops once no m pays at the rate the plan
    promises (the marginal-value rule, looking ahead because the verification's cost climbs
    in steps: kernel tiles). P(survive) multiplies the learnt acceptance rate of each drafted
    token's confidence, so the threshold comes from the same model and needs no tuning.

    Lookup drafts (`lookup`: what is learnt of them; None: off; docs/design.md §6.1): a
    continuation found earlier in the sequence costs no draft step, only its verification,
    so the round takes as many of its tokens as maximise its own rate, if that beats the
    plan's; then the draft model extends it where the same marginal rule says its tokens
    pay at that rate. `model=False`: lookup tokens only.

    Trees (`tree`: acceptance learnt per depth and rank; None: chains only; docs/design.md
    §6, "Trees"): each plan also works out the best tree of up to `tree_nodes` nodes
    (tree_plan.plan_for, a draft call per expanded node); where that is wider than a chain,
    the drafter drafts it (planned_tree) — also where no chain pays, which is where a tree
    earns its place: a weak first guess whose second or third often passes.
    """

    cost: CostModel
    max_k: int
    learnt: Acceptance = field(default_factory=Acceptance)
    times: RoundTimes | None = None
    lookup: Acceptance | Sources | None = None
    model: bool = True
    adaptive = True                       # prices what it drafts
    _k: int = 0                   # this round's cap on drafted tokens (0: no model draft)
    _survive: float = 1.0
    _tops: list[float] = field(default_factory=list)
    _buf: np.ndarray | None = None
    _plan: tuple[int, list[float]] = (0, [])    # the plan's k and the thresholds on P(survive)
    _plan_rate: float = 0.0       # the plan's tokens per second
    _planned_alpha: float = -1.0
    _rounds: int = 0
    _taken: int = 0               # lookup tokens this round, found by an n-gram of _matched
    _matched: int = 0
    _scale: float = 1.0           # this round's rate against the plan's (thresholds scale)
    _idle: int = 0                # rounds in a row the plan drafted nothing
    _probe: bool = False          # this round drafts PROBE tokens to measure α again
    _probing: bool = True         # whether drafting would pay at some α (else rare probes)
    _whole: bool = False          # the last round's lookup tokens all passed
    tree: TreeAcceptance | None = None
    tree_nodes: int = 0           # the most nodes a tree may have, root included
    _tree: TreePlan | None = None             # the plan's tree, where one beats every chain
    _tree_round: bool = False     # this round drafts that tree
    _tree_age: int = TREE_REPLAN  # rounds since the tree was planned
    _batched: bool = False        # a row of a batch of several: the batch plans its tree
    _batch_tree: TreePlan | None = None       # ... this round's (Planner.plan)

    def __post_init__(self) -> None:
        if self.times is None:
            self.times = RoundTimes.from_cost(self.cost, self.max_k)

    @property
    def uses_draft(self) -> bool:
        return self.max_k > 0 and self.model

    @property
    def alpha(self) -> float:
        return self.learnt.alpha

    @property
    def model_cap(self) -> int:
        return self._k

    def next_k(self) -> int:
        # next_k and keep_drafting run every round and every draft step, on caches the models
        # have just swept: the plan is worked out again every 8 rounds, or sooner when α has
        # moved far (0.03), not whenever α moves a little, which it does most rounds; a
        # plan made from an α a few hundredths off is nearly the same plan
        # (docs/performance-notes.md, "Figures from code comments").
        alpha = min(self.alpha, 0.999)
        if abs(alpha - self._planned_alpha) > 0.03 or self._rounds >= 8:
            self._plan, self._planned_alpha, self._rounds = self.plan(alpha), alpha, 0
            seconds = self.times.seconds
            best = self._plan[0]
            self._plan_rate = expected_tokens(alpha, best) / seconds[best]
            if self.tree is not None and self.model and self._tree_age >= TREE_REPLAN \
                    and not self._batched:
                tree = plan_for(self.tree, self.cost, self.tree_nodes, "nodes")
                self._tree, self._tree_age = None if tree.is_chain or tree.nodes < 3 else tree, 0
            # a probe can change the plan only where some α would make drafting pay: a draft
            # as dear as the target never pays, and each probe pays the draft's catch-up over
            # the rounds since (docs/performance-notes.md §6, "Probes"). Such a draft is probed
            # at the longest wait only (its price was measured once, at calibration, and a
            # probe's round times are what would correct it)
            self._probing = best > 0 or self._tree is not None or self.plan(0.999)[0] > 0
        self._rounds += 1
        self._tree_age += 1
        # The plan is only a cap: the stopping rule below ends the round where no more tokens
        # are worth their time and knows more than α does (each token's confidence), so a
        # round may run to max_k; none is drafted when not even one token pays at this α.
        # Lookup tokens are judged when one is found (take_lookup), so their cap stays.
        k = self.max_k if self._plan[0] or self._planned() is not None else 0
        self._probe, self._tree_round = False, False
        if k or not self.model:
            self._idle = 0
        else:       # α is not measured while nothing is drafted: probe now and then (below)
            self._idle += 1
            if not self._probing:                      # no α would pay: the longest wait
                wait = PROBE_EVERY << PROBE_BACKOFF
            elif not self.learnt.measured:              # an estimate: measured at once
                wait = 1
            else:
                wait = PROBE_EVERY << min(self.learnt.misses, PROBE_BACKOFF)
            # no probe while lookup's tokens all pass (an exact prediction, a quoted file):
            # the draft has seen none of them, and a probe would pay its catch-up of the
            # whole run (a prefill of every one of them) to displace tokens that were right
            if self._idle >= wait and not self._whole:
                k, self._probe, self._idle = min(PROBE, self.max_k), True, 0
        self._k, self._survive, self._tops, self._taken, self._scale = k, 1.0, [], 0, 1.0
        return self.max_k if k or self.lookup is not None else 0

    def plan(self, alpha: float) -> tuple[int, list[float]]:
        """The best k at this α (the one model of it: next_k caps rounds by it) and the
        stopping rule's thresholds on P(survive), one per tokens drafted so far."""
        seconds, n = self.times.seconds, self.max_k
        rates = [expected_tokens(alpha, k) / seconds[k] for k in range(n + 1)]  # tokens/second
        best = max(range(n + 1), key=rates.__getitem__) if self.model else 0
        rate = rates[best]
        # thresholds[d]: after d drafted tokens, go on iff P(survive) > min over m of
        # rate · (seconds(d + m) - seconds(d)) / (α + … + α^m)
        thresholds = []
        for d in range(n):
            gain, power, lowest = 0.0, 1.0, float("inf")
            for m in range(1, n - d + 1):
                power *= alpha
                gain += power
                if gain > 0:                 # α = 0: no more tokens ever pay
                    lowest = min(lowest, rate * (seconds[d + m] - seconds[d]) / gain)
            thresholds.append(lowest)
        return best, thresholds

    def take_lookup(self, matched: int, found: int, k: int) -> int:
        """How many of `found` lookup tokens (matched on an n-gram of `matched` tokens) this
        round drafts: the count n maximising (1 + S₁ + … + Sₙ) / verify(n), Sᵢ the product of
        the first i tokens' learnt chances, if that rate beats the plan's; else 0. A probe
        round takes none: it is there to measure the model's tokens, which lookup's would
        displace (a text that repeats offers a continuation almost every round)."""
        if self.lookup is None or self._probe:
            return 0
        verify, pace = self.cost.verify, self.times.pace
        survive, gain, best, best_rate, survives = 1.0, 1.0, 0, self._plan_rate, []
        for i in range(min(found, k, len(verify) - 1)):
            survive *= self.lookup.chance_in(matched, i)
            gain += survive
            survives.append(survive)
            rate = gain / (verify[i + 1] * pace)
            if rate > best_rate:
                best, best_rate = i + 1, rate
        if best:
            self._taken, self._matched = best, matched
            self._survive = survives[best - 1]
            self._scale = best_rate / self._plan_rate if self._plan_rate > 0 else 1.0
        else:
            self.lookup.forget(matched)
        return best

    def extend_lookup(self, taken: int, k: int) -> bool:
        """After `taken` lookup tokens: does the draft model's first token (and those it may
        lead to) pay at this round's rate? The marginal rule of keep_drafting, with the cost
        of the model's steps and of the longer verification."""
        if not self.model or taken >= k:
            return False
        cost, pace, alpha = self.cost, self.times.pace, min(self.alpha, 0.999)
        first, step = cost.c_first * cost.target_step, cost.draft_step
        rate = self._plan_rate * self._scale
        gain, power, lowest = 0.0, 1.0, float("inf")
        for m in range(1, min(k, len(cost.verify) - 1) - taken + 1):
            power *= alpha
            gain += power
            seconds = pace * (first + (m - 1) * step + cost.verify[taken + m] -
                              cost.verify[taken])
            if gain > 0:
                lowest = min(lowest, rate * seconds / gain)
        if self._survive <= lowest:
            return False
        self._k = k
        return True

    def take_forced(self, forced: int, k: int) -> int:
        """The round opens with `forced` tokens the grammar forces (docs/design.md §4): free
        to draft, certain to pass under the mask, a verification row each. How many model
        tokens may follow (up to k): none where the plan drafts none; a probe's; else those
        that pay at the plan's rate after them (extend_lookup's marginal rule, each forced
        token surviving)."""
        if not k or not self.model or not self._k:
            return 0
        if self._probe:
            self._k = forced + min(k, self._k)
            return self._k - forced
        return k if self.extend_lookup(forced, forced + k) else 0

    def planned_tree(self) -> TreePlan | None:
        """The tree this round drafts instead of a chain, where the plan has one (asked by a
        drafter that can draft it, once it has no lookup or forced tokens to verify)."""
        tree = self._planned()
        if tree is None or self._probe:
            return None
        self._tree_round = True
        return tree

    def batch_tree(self, plan: TreePlan | None, batched: bool = True) -> None:
        """Set each round by a batch's planner (planner.Planner.plan): where the row has
        neighbours (`batched`), its tree is the batch's plan for it (None: a chain), priced
        over the batch's call (tree_plan.plan_batch_for); alone, its own plan again."""
        self._batched, self._batch_tree = batched, plan

    def _planned(self) -> TreePlan | None:
        return self._batch_tree if self._batched else self._tree

    def observe_tree(self, tree, path: list[int]) -> None:
        """A tree round's verdict (tree_round.judge): the planned tree's nodes teach the
        acceptance by depth and rank, its first-guess chain α (a lookup tree teaches
        neither: its guesses are the text's)."""
        if not self._tree_round:
            return
        self.tree.observe(tree, path)
        first = next((i for i, u in enumerate(path) if tree.rank(u)), len(path))
        self.learnt.observe(len(tree.first_path()), first)

    def keep_drafting(self, drafted: int, logits: np.ndarray,
                      top: tuple[int, float] | None = None) -> bool:
        """After each draft step: are more tokens worth their time? `top`: the graph's (argmax,
        probability) of the last row, else the probability is worked out from `logits`.
        `drafted` counts the round's lookup and forced tokens too."""
        top = top[1] if top is not None else \
            top_probability(logits[-1], self._scratch(logits.shape[-1]))
        self._tops.append(top)
        self._survive *= self.learnt.chance(top, self._taken + len(self._tops) - 1)
        if self._probe:
            return drafted < self._k
        return drafted < self._k and self._survive > self._plan[1][drafted] * self._scale

    def observe(self, drafted: int, accepted: int, seconds: float | None = None,
                forced: int = 0) -> None:
        """A round drafted `drafted` tokens (the first _taken of them lookup tokens),
        `accepted` passed, and drafting plus verification took `seconds`; `forced` more, the
        grammar's (docs/design.md §4), were verified beside them: not learnt, only timed."""
        taken = self._taken
        self._whole = bool(taken) and accepted >= taken
        if self._tree_round:                   # learnt in observe_tree
            if accepted:
                self.learnt.misses = 0
            return
        if self._probe and drafted > taken:
            self.learnt.misses = self.learnt.misses + 1 if accepted <= taken else 0
        elif accepted > taken:                     # the model's tokens pay again
            self.learnt.misses = 0
        if not taken:
            self.learnt.observe(drafted, accepted, self._tops[:drafted])
            if self.tree is not None and drafted:
                self.tree.observe_chain(drafted, accepted)
            if seconds is not None and not forced:
                self.times.observe(drafted, seconds)
            elif seconds is not None:      # a width the plan's k do not have: the pace only
                self.times.observe_pace(self._expected(drafted + forced, drafted), seconds)
            return
        self.lookup.observe_run(taken, accepted, self._matched)
        model = drafted - taken
        if model and accepted >= taken:       # the model's tokens were judged too
            self.learnt.observe_in(model, accepted - taken,
                                   [tenth(t) for t in self._tops[:accepted - taken + 1]],
                                   first_place=taken)
        if seconds is not None:
            self.times.observe_pace(self._expected(drafted + forced, model), seconds)

    def _expected(self, width: int, model: int) -> float:
        """Seconds at pace 1 of a round verifying `width` drafts, `model` of them the draft
        model's (the others lookup's or forced: no draft step)."""
        cost = self.cost
        return cost.verify[min(width, len(cost.verify) - 1)] + (
            cost.c_first * cost.target_step + (model - 1) * cost.draft_step if model else 0)

    def _scratch(self, vocab: int) -> np.ndarray:
        if self._buf is None or len(self._buf) != vocab:
            self._buf = np.empty(vocab, np.float32)
        return self._buf


def top_probability(row: np.ndarray, scratch: np.ndarray) -> float:
    """max softmax(row) for a (vocab,) row of logits, computed in `scratch` (float32, vocab).

    Shifted by the largest logit (found by argmax, which numpy vectorises better than max)
    so that exp cannot overflow; in place, since it runs after every draft step and an array
    allocated per call adds to every one (docs/performance-notes.md, "Figures from code
    comments")."""
    np.subtract(row, row[row.argmax()], out=scratch)
    np.exp(scratch, out=scratch)
    total = float(scratch.sum())         # >= 1 (the top itself); NaN logits: no confidence
    return 1.0 / total if total >= 1.0 else 0.0


def _clipped(ratio: float) -> float:
    """A round counts at most 25% over or 20% under what was expected of it (RoundTimes)."""
    return min(max(ratio, 0.8), 1.25)
