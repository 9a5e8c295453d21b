"""The draft → verify → correct loop of docs/design.md §4: one round for every running row.

`Loop.round` is the only round there is. A row is one sequence in its own slot of both
models' arenas (its own lengths, rule, schedule and drafter); a round drafts for all rows
together, one draft call per step over the rows still drafting, then verifies every row's
`[last, d1..dk]` in one target call, and each row's rule judges its own rows. One row is a
batch of one: its calls are the session's single-sequence forward (the logits stay where the
backend leaves them, so the bundle's fused heads can judge them on a device). The engine
(batch.py) drives it for one sequence or many, and the planner (scheduler/planner.py) gives
each round its cap on k. The loop owns the lengths: the target's rows advance by j + 1 per
round, the draft's stay at what is still valid, and rejected rows are simply overwritten
later (free rollback).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
import numpy as np

from ..backends.base import ModelSession
from .drafting import Drafter, Schedule, call
from .logprobs import Logprobs
from .rules import Rule
from .tree import Tree, Verdicts
from .tree_round import batch_inputs, judge

# tokens a draft left behind may catch up on whenever it drafts (a round's worth: its prefill
# costs about a draft step); further behind, see Loop.round
FREE_CATCH_UP = 16


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
    prediction_drafted: int = 0   # of lookup_drafted, the request's prediction's (OpenAI's
    prediction_accepted: int = 0  # accepted/rejected_prediction_tokens: judged by the target)
    earlier_drafted: int = 0      # of lookup_drafted, earlier requests' (round/suffix.py)
    earlier_accepted: int = 0
    forced: int = 0               # tokens a response_format's grammar forced, verified beside
    forced_accepted: int = 0      # the drafts (not in drafted: no one drafted them; design §4)
    tree_rounds: int = 0          # rounds that verified a draft tree (lookup's; design §4)
    tree_nodes: int = 0           # ... and its nodes after the root (drafted counts the depth)
    tree_gained: int = 0          # ... and the tokens they took past the chosen chain's
    tree_carried: int = 0         # ... of which drafted again next round (tree_round.judge)
    split_bets: int = 0           # split mode: rounds whose next round was drafted ahead
    split_hits: int = 0           # ... and whose bet was right
    verdicts: Verdicts = field(default_factory=Verdicts)   # acceptance by depth and rank
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

    @property
    def nodes_per_round(self) -> float:
        """Draft nodes verified a round (a chain's k; a tree's nodes but the root)."""
        return self.verdicts.nodes / self.rounds if self.rounds else 0.0

    def observe_tree(self, tree: Tree, path: list[int]) -> None:
        """A round that verified `tree` and accepted `path`: its nodes, and the nodes its
        verdict judged by depth and rank (drafted and accepted count the path as a chain's)."""
        self.tree_rounds += 1
        self.tree_nodes += len(tree) - 1
        self.verdicts.tree(tree, path)

    def as_dict(self) -> dict:
        return {**{k: v for k, v in self.__dict__.items() if k not in ("seconds", "verdicts")},
                "nodes_per_round": self.nodes_per_round, **self.verdicts.as_dict(),
                "acceptance_rate": self.acceptance_rate,
                "lookup_acceptance_rate": self.lookup_acceptance_rate,
                "model_acceptance_rate": self.model_acceptance_rate,
                "mean_accepted_per_round": self.mean_accepted_per_round, "mean_k": self.mean_k,
                "tokens_per_s": self.tokens_per_s, "seconds": dict(self.seconds)}


@dataclass(eq=False)
class Row:
    """One sequence in the loop: its tokens, its target length, and who decides for it."""

    seq: list[int]                # every token; seq[p] sits at position p
    rule: Rule
    schedule: Schedule
    drafter: Drafter              # its draft state (draft_len, lookup, a split bet)
    stats: Stats
    eos_ids: set[int]
    max_new_tokens: int
    prompt_len: int
    target_len: int = 0           # rows of valid keys/values in its slot of the target's arena
    k: int = 0                    # this round's cap on drafted tokens
    drafts: list[int] = field(default_factory=list)      # this round's, and their draft
    probs: list = field(default_factory=list)            # probabilities (None: lookup)
    left: int = 0                 # model tokens it may still draft this round
    feed: list[int] = field(default_factory=list)       # what its next draft step takes
    logprobs: Logprobs | None = None                     # the target's, when asked for
    dry: int = 0                  # rounds in a row that lookup drafted nothing for
    cap: int | None = None        # the sequence's own cap on k (a fixed k), None under auto

    @property
    def slot(self) -> int:
        return self.drafter.slot

    @property
    def produced(self) -> int:
        return len(self.seq) - self.prompt_len

    def room(self, max_context: int) -> int:
        """How many tokens it may still emit: 0 when it is done (length or context)."""
        return min(max_context - len(self.seq), self.max_new_tokens - self.produced)


class Loop:
    """Rounds over a target and a draft session (their arenas' slots hold the rows)."""

    trees = True    # lookup's trees where the target takes them (off: chains, tree_bench.py)

    def __init__(self, target: ModelSession, draft: ModelSession) -> None:
        self.target, self.draft = target, draft
        self.max_context = target.max_context
        self.max_draft = target.max_new_len - 2     # the bundle's: a verification's drafts
        # the most nodes a row alone's tree may have (ort_tree.py; design §2, §4 "Trees")
        self.tree_nodes = self.max_draft + 1 \
            if self.trees and getattr(target, "verifies_trees", False) else 0
        # the last round's (draft seconds, draft calls, verify seconds, verified width), its
        # draft seconds without the catch-up prefills, which are `caught_up`: (tokens, seconds)
        self.last: tuple[float, int, float, int] = (0.0, 0, 0.0, 0)
        self.caught_up: list[tuple[int, float]] = []

    def round(self, rows: list[Row], cap: int | None = None,
              lengths: tuple[np.ndarray, np.ndarray] | None = None) -> list[list[int]]:
        """One round for `rows`; returns each row's emitted tokens (cut after an EOS).

        `cap`: the batch's k (batch_cost.best_k), over each row's own schedule. `lengths`:
        with several rows, every slot's valid (target, draft) rows up to the highest row's
        slot (a call spans those slots; a slot without a row here takes a dummy token past
        its valid rows, so whatever sits there stays)."""
        t0 = perf_counter()
        self.caught_up = []
        one = len(rows) == 1
        span = None if one else lengths
        most = self.max_context if span is None else \
            int(self.max_context - 1 - span[0].max())   # every row of a call writes past it
        for row in rows:
            if row.drafter.lagging(row.target_len) and row.schedule.uses_draft:
                self._timed(row, row.drafter.catch_up, row.seq, row.target_len)   # a head (§14)
            # a batch at k = 0 asks no schedule: each would plan for nothing, a cost per row
            # that an overhead-bound target's short rounds feel
            k = 0 if cap == 0 else row.schedule.next_k()
            if cap is not None:
                k = min(k, cap)
            room = row.room(self.max_context)
            row.k = max(0, min(k, room - 1, most))
            row.drafter.room = max(0, min(room - 1, most, self.max_draft))   # forced tokens'
            if row.k and row.schedule.adaptive:
                # a draft that rounds of lookup alone left behind catches up (a prefill of
                # all it missed, which the marginal rules do not price) only after a round
                # that lookup found nothing for, and never past what the sequence may still
                # emit: where lookup pauses for one token (an edit in a predicted file, its
                # end before EOS) it would buy a token or two (design §6; the figures:
                # docs/performance-notes.md §6, "A draft left behind by lookup"; a fixed k
                # drafts as asked)
                behind = len(row.seq) - 1 - row.drafter.draft_len
                row.drafter.waits = behind > room or behind > FREE_CATCH_UP and not row.dry
            row.drafter.tree_nodes = min(self.tree_nodes, most - row.target_len if one
                                         else most + 1)
            row.drafter.grows = not one          # a batch's trees grow in its draft steps
            row.drafts, row.probs, row.left = row.drafter.start(row.seq, row.k)
        steps = self._draft(rows, span)
        for row in rows:
            if row.drafter.growth is not None:   # the tree stands in for the chain
                row.drafter.grown(row.drafts)
                row.drafts, row.probs = [], []
        t1 = perf_counter()
        for row in rows:
            row.drafter.bet(row.drafts)          # split mode: the draft works on (§7)
        logits = self._verify(rows, span)
        t2 = perf_counter()
        self.last = (t1 - t0 - sum(s for _, s in self.caught_up), steps, t2 - t1,
                     max(len(row.drafter.tree) if row.drafter.tree is not None
                         else 1 + len(row.drafts) for row in rows))
        emitted = []
        for row in rows:
            d = row.drafts
            rows_logits = logits if one else logits[row.slot, :len(d) + 1]
            tree = row.drafter.tree
            if tree is not None:                 # the path taken stands in for the drafts
                d, j, t, rows_logits, seen = judge(
                    row, tree, logits if one else logits[row.slot, :len(tree)], self.target)
            else:
                j, t = row.rule.verify(rows_logits, d, row.probs, row.target_len + 1)
                seen = j                         # what the schedule learns from
            # the grammar's, and a tree's path carried from the last round (design §4): not
            # the schedule's
            forced = row.drafter.forced_at
            carried = row.drafter.from_carried
            passed = sum(i < j for i in forced)
            if cap != 0:                         # (nothing drafted: nothing to learn)
                row.schedule.observe(len(d) - len(forced), seen - passed,
                                     t2 - t0 if one and tree is None else None, len(forced))
            row.target_len += j + 1              # rows for last, d1..dj stay valid
            row.drafter.settle(row.target_len, j == len(d), t)
            new = [*d[:j], t]
            ended = next((i for i, tok in enumerate(new) if tok in row.eos_ids), None)
            if ended is not None:
                new = new[:ended + 1]
            row.seq += new
            row.rule.commit(new)
            if row.logprobs is not None:         # row i of the verification emitted new[i]
                row.logprobs.add(rows_logits, new)
            st = row.stats
            row.dry = 0 if row.drafter.from_lookup else row.dry + 1
            st.rounds += 1
            st.target_calls += 1
            st.forced += len(forced) - carried
            st.forced_accepted += passed - min(j, carried)
            st.tree_carried += carried
            st.drafted += len(d) - len(forced)
            st.accepted += j - passed
            if tree is None:                     # (a tree's verdicts: tree_round.judge)
                st.verdicts.chain(len(d), j)
            if taken := row.drafter.from_lookup:
                st.lookup_drafted += taken
                st.lookup_accepted += min(j, taken)
            if taken := row.drafter.from_prediction:
                st.prediction_drafted += taken
                st.prediction_accepted += min(j, taken)
            if taken := row.drafter.from_earlier:
                st.earlier_drafted += taken
                st.earlier_accepted += min(j, taken)
            st.seconds["draft"] += t1 - t0
            st.seconds["verify"] += t2 - t1
            st.new_tokens = row.produced
            emitted.append(new)
        return emitted

    def _draft(self, rows: list[Row], span) -> int:
        """The model's tokens of every row: step i is one draft call over the rows still
        drafting, each its feed at its own length; after each token the row's schedule says
        whether more pay (keep_drafting). Returns the number of draft calls."""
        drafting, steps = [], 0
        for row in rows:
            if row.left:
                row.feed = row.drafter.feed(row.seq, row.drafts)
                drafting.append(row)
        while drafting:
            if len(drafting) == 1:               # one call of its own, in its slot
                row = drafting[0]
                found = [(row, self._step_alone(row), self.draft.top())]
                steps += 1
            else:
                found, calls = self._step_rows(drafting, rows, span)
                steps += calls
            drafting = []
            for row, logits, top in found:
                drafter = row.drafter
                if drafter.cut is not None:          # propose only ids the target has
                    logits = np.asarray(logits[-1])[None, :drafter.cut]
                    top = top if top is not None and top[0] < drafter.cut else None
                growth = drafter.growth
                if growth is not None:               # a batch row's tree (design §4 "Trees")
                    token = growth.add(np.asarray(logits[-1]))
                    row.left -= 1
                    if token is not None:
                        row.drafts.append(token)
                        row.feed = [token]
                        if row.left:
                            drafting.append(row)
                    continue
                token, q = row.rule.draft_pick(logits, drafter.draft_len, top, row.drafts)
                row.drafts.append(token)
                row.probs.append(q)
                # the tokens the grammar forces after it (design §4): drafts without a step,
                # which the next call feeds with it
                forced, row.left = drafter.force(row.drafts, row.left - 1)
                row.drafts += forced
                row.probs += [None] * len(forced)
                row.feed = [token, *forced]
                # asked after every token, the last too: the schedule learns each one's
                # confidence from it
                if row.schedule.keep_drafting(len(row.drafts), logits, top) and row.left:
                    drafting.append(row)
        return steps

    def _step_alone(self, row: Row):
        """One row's draft step: its whole feed in one call (a feed longer than a call takes
        — the draft skipped by k = 0 rounds — is prefilled first)."""
        drafter = row.drafter
        if len(row.feed) > self.draft.max_new_len:
            self._catch_up(row)
        feed = row.feed
        drafter.fill(0, len(feed), len(feed))
        logits = call(self.draft.forward, drafter.ids(feed), drafter.draft_len, row.slot)
        drafter.took(0, len(feed), len(feed) - 1)
        drafter.draft_len += len(feed)
        drafter.draft_calls += 1
        row.stats.draft_calls += 1
        return logits

    def _step_rows(self, drafting: list[Row], rows: list[Row], span):
        """One draft step for several rows (each its feed at its own length) over slots
        0..S-1: [(row, its last token's logits (1, vocab), its top or None)]. Every other slot
        takes a dummy token at its current length (a row of the round that stopped drafting
        has moved on since the round began). A feed of more
        than two tokens (a draft far behind) catches up alone first; where the graph cannot
        batch several new tokens per row (the ort flavour), a feed of two (a pending token
        and the last) goes in as two one-token calls, right-aligned."""
        draft = self.draft
        for row in drafting:
            if len(row.feed) > 2:
                self._catch_up(row)
        slots = max(row.slot for row in drafting) + 1
        past = np.array(span[1][:slots] if span is not None else np.zeros(slots), np.int64)
        for row in rows:
            if row.slot < slots:
                past[row.slot] = row.drafter.draft_len
        width = max(len(row.feed) for row in drafting)
        calls = width if width > 1 and not draft.batches_new_tokens else 1
        step = width // calls
        for c in range(calls):
            ids = np.zeros((slots, step), np.int64)
            real = np.zeros(slots, np.int64)
            at = past.copy()
            for row in drafting:
                feed = row.feed
                if calls > 1:
                    late = len(feed) - width + c          # < 0: this row's feed starts later
                    part = feed[late:late + step] if late >= 0 else []
                    at[row.slot] = row.drafter.draft_len + max(0, late)
                else:
                    part = feed
                ids[row.slot, :len(part)] = row.drafter.ids(part) if part else 0
                real[row.slot] = len(part)
                if part:
                    row.drafter.fill(row.slot, step, len(part))
            logits = draft.forward_rows(ids, at, real)
        tops = draft.top_rows(slots)
        found = []
        for row in drafting:
            last = len(row.feed) - 1 if calls == 1 else 0
            top = None
            if tops is not None and last == logits.shape[1] - 1:
                top = int(tops[0][row.slot]), float(tops[1][row.slot])  # the row's last's
            row.drafter.took(row.slot, step, last)
            row.drafter.draft_len += len(row.feed)
            row.drafter.draft_calls += calls
            row.stats.draft_calls += calls
            found.append((row, logits[row.slot, last:last + 1], top))
        return found, calls

    def _catch_up(self, row: Row) -> None:
        """Prefill all of a row's draft feed but its last token (the draft skipped rounds: k =
        0, or a batch that did not feed it), timed apart in `caught_up`: a batch prices the
        draft's prefill apart from its steps (batch_cost.LiveCost)."""
        self._timed(row, row.drafter.advance, row.feed[:-1])
        row.feed = row.feed[-1:]

    def _timed(self, row: Row, feed, *args) -> None:
        """Run a catch-up of the row's draft (`feed(*args)`) and note its tokens and seconds."""
        before, t0 = row.drafter.draft_len, perf_counter()
        feed(*args)
        self.caught_up.append((row.drafter.draft_len - before, perf_counter() - t0))

    def _verify(self, rows: list[Row], span):
        """One target call over every row's [last, d1..dk] at its own length: one row alone,
        its logits (k+1, vocab) as the backend gives them; several, over slots 0..S-1 padded
        to the longest (row b's padding is written past its valid rows and never kept)."""
        if span is None:
            row = rows[0]
            tree = row.drafter.tree
            if tree is not None:                 # lookup's tree (design §4, "Trees")
                return self.target.forward_tree(tree.tokens, tree.ancestors(), tree.depth,
                                                row.target_len, row.slot)
            return call(self.target.forward, np.asarray([row.seq[-1], *row.drafts], np.int64),
                        row.target_len, row.slot)
        slots = max(row.slot for row in rows) + 1
        if any(row.drafter.tree is not None for row in rows):    # rows' trees (design §4)
            return self.target.forward_rows_tree(*batch_inputs(
                rows, slots, np.asarray(span[0][:slots], np.int64).copy()))
        width = 1 + max(len(row.drafts) for row in rows)
        ids = np.zeros((slots, width), np.int64)
        real = np.zeros(slots, np.int64)
        past = np.asarray(span[0][:slots], np.int64).copy()
        for row in rows:
            ids[row.slot, :len(row.drafts) + 1] = [row.seq[-1], *row.drafts]
            real[row.slot] = len(row.drafts) + 1
            past[row.slot] = row.target_len
        return self.target.forward_rows(ids, past, real)
