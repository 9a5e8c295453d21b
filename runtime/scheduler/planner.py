"""Who decides k: the one planner (docs/design.md §6, §11).

    knowledge = Knowledge(target, draft, manifest, key, recalibrate, max_batch)  # a generator's
    planner = Planner(knowledge, k, slots, lengths)        # a batch's (the engine's)
    cap = planner.plan(rows, span)      # each round: the cap on every row's k, and which rows
                                        # the draft model is fed for (Drafter.fed)
    cap = planner.guarded(rows, cap)    # what the rounds gave overrules the prices
    ... Loop.round(rows, cap, lengths) ...
    planner.observe(loop, rows, span, emitted, seconds)

Two levels decide a round's drafts. Each row's own schedule (schedule.AdaptiveK under "auto",
FixedK at a fixed k) plans its k token by token from what it learns of its acceptance and
the cost model, within the batch's cap. The planner sets that cap: at a fixed k the k asked;
under "auto" over several slots the k that maximises the batch's expected tokens per second at
this many rows (batch_cost.plan, from calls of this many rows timed here), with rows whose
draft is behind fed only where their drafts pay for its prefill, and the guard
(batch_cost.Realized) turning drafting off where the rounds say it loses; and where the
rows' draft trees beat those chains in the batch's one call, each row's tree
(Planner._trees, tree_plan.plan_batch_for; design §6 "Trees"). A batch of one slot (generate,
stream, a one-slot server) has no neighbours to price: its row's schedule is the plan (its
own tree included) and its draft is always fed.

`Knowledge` is what a generator has learnt and measured, kept across its sequences and
batches: acceptance per decoding kind, round times per mode, the cost model, the batch prices
per size and what batches' rounds gave.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .. import cache
from ..round.loop import Loop, Row
from ..round.lookup import (EARLIER, EARLIER_PRIOR, MAX_NGRAM, MODEL_FREE, PREDICTION_PRIOR,
                            SUFFIX_SHORT)
from .batch_cost import (TIMED_S, BatchCost, LiveCost, Realized, measure, measure_prefill, plan,
                         speedup)
from .calibration import calibrate
from .cost import CostModel
from .learning import Acceptance, Sources
from .schedule import AdaptiveK, FixedK, RoundTimes
from .tree_plan import TreeAcceptance, TreePlan, plan_batch_for

if TYPE_CHECKING:
    from ..backends.base import ModelSession
    from ..manifest import Manifest

# Under "auto" a batch's plan is worked out again when rows join or leave, when a row's α
# moved by more than REPLAN_ALPHA, or after REPLAN_EVERY rounds, as AdaptiveK re-plans (§6); a
# plan that came out as the last one did (the same k for the same rows) stands twice as long
# each time, up to REPLAN_LONGEST rounds. Worked out every round, the plan would be a
# noticeable part of a small target's round (docs/performance.md, "One loop, and batches on
# the real SmolLM2-135M", "Whose draft is fed").
REPLAN_EVERY = 8
REPLAN_LONGEST = 64
REPLAN_ALPHA = 0.03

Lengths = Callable[[int], "tuple[np.ndarray, np.ndarray]"]   # slots -> (target, draft) rows


class Knowledge:
    """What a generator has learnt and measured, for every sequence and batch it decodes."""

    def __init__(self, target: ModelSession, draft: ModelSession, manifest: Manifest,
                 key: Callable[..., dict[str, Any] | None], recalibrate: bool = False,
                 max_batch: int = 1) -> None:
        self.target, self.draft = target, draft
        self.max_draft, self.max_batch = manifest.max_draft, max_batch
        self.pair_alpha = manifest.pair_worth.get("alpha")   # the export's measured agreement
        self.key, self.recalibrate = key, recalibrate        # where measurements are remembered
        self.learnt: dict[str, Acceptance] = {}      # k="auto": per decoding kind, and lookup's
        self.trees: dict[str, TreeAcceptance] = {}   # ... the draft's trees, by depth and rank
        # the draft (a model or a head) drafts trees under auto where the target verifies
        # them (design §6 "Trees", §14)
        self.draft_trees = Loop.trees and getattr(target, "verifies_trees", False)
        self.times: dict[str, RoundTimes] = {}       # ... how long rounds took, per mode
        self.cost: CostModel | None = None           # c and v(k) (cost_model)
        self.batch_costs: dict[int, BatchCost] = {}  # calls of this many rows, timed
        self.live_costs: dict[int, LiveCost] = {}    # ... corrected by the batches' rounds
        self.realized: dict[int, Realized] = {}      # ... and what they gave, per row count
        self.draft_prefill: float | None = None      # the draft's prefill, seconds a token

    # -- one sequence's schedule -----------------------------------------------------------

    def schedule(self, k: int | str, kind: str, source: str = "fused", predicted: bool = False,
                 mode: str = "sequential", own: bool = False) -> AdaptiveK | FixedK:
        """A sequence's schedule. A fixed k learns afresh each call: its drafts (and so a
        seeded rejection-rule run's tokens) depend on this call alone. k="auto" starts from
        what earlier sequences learnt: acceptance per decoding `kind` (greedy, sampled,
        invariant) and `source`, round times per `mode`; `own` (a batch's rows, several at
        once) learns on a copy, which the batch keeps when the sequence ends (`keep`).
        `predicted`: the request brings a prediction, whose worth is its own (learnt apart,
        from the client's claim that the output follows it); earlier requests' continuations
        (sources EARLIER) are learnt apart too, from EARLIER_PRIOR, across requests."""
        auto = k == "auto"
        shared = auto and not own
        lookup = self.learnt.setdefault(f"{kind}/lookup", Acceptance()) \
            if shared and source != "model" else Acceptance()
        earlier = None
        if source in EARLIER:
            earlier = self.learnt.setdefault(f"{kind}/earlier",
                                             Acceptance.starting_at(EARLIER_PRIOR)) \
                if shared else Acceptance.starting_at(EARLIER_PRIOR)
        if predicted or earlier is not None:
            lookup = Sources(lookup, Acceptance.starting_at(PREDICTION_PRIOR), MAX_NGRAM + 1,
                             SUFFIX_SHORT, earlier)
        if not auto:
            return FixedK(int(k), source not in MODEL_FREE, self.prior(), lookup)
        cost = self.cost_model()
        if mode not in self.times:
            self.times[mode] = RoundTimes.from_cost(cost, self.max_draft)
        learnt = self.acceptance(kind).carried() if own else self.acceptance(kind)
        # the draft's trees: a row alone plans its own, a batch's are the batch's plan
        # (Planner.plan; design §6 "Trees"); what they teach is shared across rows
        tree = self.trees.setdefault(kind, TreeAcceptance(alpha=learnt.alpha)) \
            if self.draft_trees and source not in MODEL_FREE else None
        return AdaptiveK(cost, self.max_draft, learnt, self.times[mode],
                         lookup=None if source == "model" and not predicted else lookup,
                         model=source not in MODEL_FREE, tree=tree,
                         tree_nodes=self.max_draft + 1 if tree else 0)

    def keep(self, kind: str, learnt: Acceptance) -> None:
        """A batch's sequence ended having drafted: the next ones of its kind start from it."""
        self.learnt[kind] = learnt.carried()

    def acceptance(self, kind: str) -> Acceptance:
        """What k="auto" knows of the draft's acceptance for a decoding kind: what earlier
        sequences learnt, else the export's measured agreement (§6), else the prior."""
        if kind not in self.learnt:
            self.learnt[kind] = self.prior()
        return self.learnt[kind]

    def prior(self) -> Acceptance:
        """The draft's acceptance as known before decoding: the export's measured agreement
        of the pair (manifest `pair_worth`), else the prior's 0.5."""
        alpha = self.pair_alpha
        return Acceptance.starting_at(alpha) if isinstance(alpha, (int, float)) \
            and not isinstance(alpha, bool) else Acceptance()

    def cost_model(self) -> CostModel:
        """c and v(k) of this bundle on this machine: measured once, and remembered on disk
        for the next load (§8.1)."""
        if self.cost is None:
            max_draft = self.max_draft
            self.cost = cache.remembered(
                self.key("cost"), lambda: calibrate(self.target, self.draft, max_draft),
                CostModel.record, lambda data: CostModel.from_record(data, max_draft),
                redo=self.recalibrate)
        return self.cost

    # -- a batch's prices ------------------------------------------------------------------

    def size(self, rows: int) -> int:
        """The batch size whose calls price calls of `rows` rows: the power of two above."""
        return min(1 << max(0, rows - 1).bit_length(), self.max_batch)

    def batch_cost(self, rows: int, lengths: Lengths) -> BatchCost:
        """What calls of `rows` rows cost here, timed once per power of two (each slot written
        past its valid rows, `lengths`) and remembered for later loads (cache.py)."""
        size = self.size(rows)
        cached = self.batch_costs.get(size)
        if cached is None:
            cached = self.batch_costs[size] = cache.remembered(
                self.key("batch", rows=size, timed_s=TIMED_S),
                lambda: measure(self.target, self.draft, size, *lengths(size), self.max_draft),
                BatchCost.record, lambda data: BatchCost.from_record(data, size),
                redo=self.recalibrate)
        return cached

    def prefill_cost(self, slot: int, past: int) -> float:
        """The draft's prefill, seconds a token (batch_cost.measure_prefill): timed once, in
        `slot` past its `past` valid rows, and remembered for later loads."""
        if self.draft_prefill is None:
            self.draft_prefill = cache.remembered(
                self.key("draft-prefill"), lambda: measure_prefill(self.draft, slot, past),
                float, _seconds, redo=self.recalibrate)
        return self.draft_prefill

    def live(self, rows: int, lengths: Lengths) -> LiveCost:
        """The costs of calls of `rows` rows as the batches' rounds have corrected them."""
        cost = self.batch_cost(rows, lengths)
        live = self.live_costs.get(cost.rows)
        if live is None or live.cost is not cost:
            split = not getattr(self.draft, "batches_new_tokens", True)
            live = self.live_costs[cost.rows] = LiveCost(
                cost, extra_calls=int(split), prefill=self.draft_prefill or 0.0)
        return live

    def priced(self, rows: int, lengths: Lengths) -> LiveCost | None:
        """live(rows) where calls of that many rows have been timed; else None (a fixed k's
        batch times nothing; its rounds correct the prices of "auto" batches where there
        are some)."""
        if self.size(rows) not in self.batch_costs or self.draft_prefill is None:
            return None
        return self.live(rows, lengths)


class Planner:
    """A batch's planner over `slots` slots at `k` (an int, or "auto"): `plan` each round."""

    def __init__(self, knowledge: Knowledge, k: int | str, slots: int, lengths: Lengths) -> None:
        self.knowledge, self.k, self.slots, self.lengths = knowledge, k, slots, lengths
        self.cap: int | None = None              # this round's cap on k (None: none)
        self._planned: tuple = ()   # ((prices, rows), alphas, (k, trees), shapes): the last
        self._plan_rounds = 0                    # rounds left before it is made again
        self._plan_every = REPLAN_EVERY          # ... of how many it stands in all

    @property
    def pricing(self) -> bool:
        """Whether rows are priced together: "auto" over more than one slot."""
        return self.k == "auto" and self.slots > 1

    def calibrate(self) -> None:
        """Time calls of 1, 2, 4, ... rows up to the slots, and the draft's prefill (once per
        generator, remembered for later loads), now rather than in the middle of a round."""
        if not self.pricing:
            return
        self.knowledge.prefill_cost(self.slots - 1, int(self.lengths(self.slots)[1][-1]))
        rows = 1
        while True:
            self.cost(rows)
            if rows >= self.slots:
                return
            rows *= 2

    def cost(self, rows: int) -> BatchCost:
        """What calls of `rows` rows cost here (Knowledge.batch_cost)."""
        return self.knowledge.batch_cost(rows, self.lengths)

    def plan(self, rows: Sequence[Row], span: int) -> int | None:
        """The cap on every row's k this round, over slots 0..span-1: the fixed k, or under
        "auto" the k that maximises the batch's expected tokens per second at this many rows
        (batch_cost.plan; §11), rows whose draft is not fed at k = 0; None for a row alone
        (its own schedule plans). Under "auto" it also decides which rows the draft model
        drafts for (Drafter.fed): a row whose draft is behind (a newcomer's prompt, rounds it
        did not draft) where the rounds its drafts save pay for the draft's prefill; a row in
        step always. The plan stands for a few rounds (REPLAN_*)."""
        if self.k != "auto":
            self.cap = int(self.k)
            return self.cap
        if self.slots == 1:
            self.cap = None
            return None
        live = self.knowledge.live(span, self.lengths)
        alphas = [_alpha(row) for row in rows]
        key = (live, tuple(map(id, rows)))
        if self._planned and self._planned[0] == key and self._plan_rounds > 0 and \
                max(abs(a - b) for a, b in zip(alphas, self._planned[1])) <= REPLAN_ALPHA:
            self._plan_rounds -= 1
            k, trees = self._planned[2]
        else:
            max_context = self.knowledge.target.max_context
            chains = [(alpha, row.cap, row.room(max_context), _behind(row))
                      for alpha, row in zip(alphas, rows)]
            k, feeding = plan(chains, live, self.knowledge.max_draft)
            for row, feed in zip(rows, feeding):
                row.drafter.fed = feed
            trees = self._trees(rows, live, k, [(a, c if f else 0) for (a, c, _, _), f
                                                 in zip(chains, feeding)])
            shapes = (k, [t and (t.nodes, t.width, t.depth) for t in trees])
            same = bool(self._planned) and self._planned[0] == key and \
                self._planned[3] == shapes
            self._plan_every = min(2 * self._plan_every, REPLAN_LONGEST) if same \
                else REPLAN_EVERY
            self._planned = (key, alphas, (k, trees), shapes)
            self._plan_rounds = self._plan_every - 1
        alone = len(rows) == 1
        for row, tree in zip(rows, trees):
            if isinstance(row.schedule, AdaptiveK):
                row.schedule.batch_tree(tree, not alone)
        depths = [t.depth for t in trees if t is not None]
        self.cap = None if alone else max(k, *depths) if depths else k
        return self.cap

    def _trees(self, rows: Sequence[Row], live: LiveCost, k: int,
               chains: list[tuple[float, int | None]]) -> list[TreePlan | None]:
        """Each row's tree where the batch's trees beat its chains (design §6 "Trees"): every
        row drafting with the model its own tree, grown along its chain (tree_draft.ChainTree),
        all in one verification whose price is the call's total rows (tree_plan.plan_batch_for,
        the draft's acceptance by depth and rank); the chains' speed-up at the batch's k is
        batch_cost.speedup's. None each where a chain pays as much (a row alone plans its own)."""
        knowledge = self.knowledge
        none = [None] * len(rows)
        if len(rows) == 1 or not knowledge.draft_trees:
            return none
        accs = [row.schedule.tree if isinstance(row.schedule, AdaptiveK) and row.schedule.model
                and row.drafter.fed else None for row in rows]
        if not any(acc is not None for acc in accs):
            return none
        width, plans = plan_batch_for(accs, live, knowledge.max_draft + 1)
        best = next((p.speedup for p in plans if p is not None), 1.0)
        if width < 3 or best <= speedup(chains, live, knowledge.max_draft, k):
            return none
        return [p if p is not None and not p.is_chain and p.nodes >= 3 else None
                for p in plans]

    def feeds_drafts(self, rows: int) -> bool:
        """Whether a prefill this round also feeds the drafts: not where the batch runs at
        k = 0 (its cap, or the guard holding it there)."""
        guard = self.knowledge.realized.get(rows)
        return self.cap != 0 and not (guard is not None and guard.holding)

    def guarded(self, rows: Sequence[Row], cap: int | None) -> int | None:
        """The round's cap after the guard: what the batch's rounds gave at this many rows,
        drafting or not, overrules the prices where drafting loses (batch_cost.Realized)."""
        if not self.pricing or len(rows) < 2:
            return cap
        guard = self.knowledge.realized.get(len(rows))
        if guard is None:
            guard = self.knowledge.realized[len(rows)] = Realized()
        return guard.decide(cap or 0)

    def observe(self, loop: Loop, rows: Sequence[Row], span: int, emitted: list[list[int]],
                seconds: float) -> None:
        """What the round over `rows` gave: the guard's tokens and seconds (without the
        draft's catch-ups, priced apart), and the prices' corrections."""
        draft_s, calls, verify_s, width = loop.last
        if self.pricing and len(rows) > 1:
            # a round of k = 0 may verify forced tokens (design §4): it drafted none
            drafted = any(len(row.drafts) > len(row.drafter.forced_at)
                          or row.drafter.tree is not None for row in rows)
            self.knowledge.realized[len(rows)].observe(
                drafted, sum(map(len, emitted)), seconds - sum(s for _, s in loop.caught_up))
        live = self.knowledge.priced(span, self.lengths)
        if live is not None:
            if len(rows) > 1:              # (one row's round times are its own schedule's)
                live.observe(width, verify_s, calls, draft_s)
            for tokens, spent in loop.caught_up:
                live.observe_prefill(tokens, spent)

    def observe_prefill(self, span: int, tokens: int, seconds: float) -> None:
        """A draft's catch-up at prefill: `tokens` in `seconds`."""
        live = self.knowledge.priced(span, self.lengths)
        if live is not None:
            live.observe_prefill(tokens, seconds)


def _alpha(row: Row) -> float:
    """What a row's drafts are worth to the batch's plan: its draft model's α, or where the
    model does not draft for it (a model-free source), its lookup tokens' α."""
    schedule = row.schedule
    lookup = schedule.lookup
    if schedule.model or lookup is None:
        return schedule.learnt.alpha
    return (lookup.sequence if isinstance(lookup, Sources) else lookup).alpha


def _behind(row: Row) -> int:
    """Tokens the row's draft must prefill before it drafts: those before its last token that
    it has not seen (a newcomer's whole prompt; 1, the pending token a round feeds with its
    last, is no prefill). 0 where the row never drafts with the model."""
    return len(row.seq) - 1 - row.drafter.draft_len if row.schedule.uses_draft else 0


def _seconds(data: Any) -> float:
    """A remembered price in seconds, checked: ValueError if it is not one."""
    value = float(data)
    if not 0 <= value < float("inf"):
        raise ValueError(f"seconds {data!r}")
    return value
