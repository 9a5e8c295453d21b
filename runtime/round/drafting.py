"""Drafters: the draft side of one row of the loop (docs/design.md §4, §7).

A drafter owns its row's draft state: `draft_len` (rows of valid keys/values in its slot of
the draft's arena), its lookup index, and in split mode the bet thread. The loop (loop.py)
drafts the model's tokens of every row together, one call per step; a drafter says what its
row starts a round with (`start`): the tokens a response_format's grammar forces (grammar.py,
docs/design.md §4), a lookup continuation found earlier in the sequence where the schedule
takes it (lookup.py, docs/design.md §6.1), or a split bet's tokens, and how many model tokens
may follow.

`SplitDrafter` also drafts round r+1 on a second thread while the target verifies round r,
betting that all of round r is accepted and guessing the target's bonus token (as in
"speculative speculative decoding"); on a hit the next round needs no drafting, on a miss the
extra rows are dropped (free rollback). It decodes one sequence: a batch refuses split mode.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from ..backends.base import ModelSession
from .lookup import Lookup, lookup_tree
from .rules import Rule
from .tree import Tree
from .tree_draft import ChainTree, TreeShape, expand


class Schedule(Protocol):
    """What the drafters and the loop ask of a schedule (schedule.FixedK, AdaptiveK, built on
    this round; docs/design.md §4): the round's k, lookup's share of it, whether to keep
    drafting, and what the round came to."""

    adaptive: bool      # whether it prices its drafts (auto) or drafts as asked (a fixed k)

    @property
    def uses_draft(self) -> bool: ...

    @property
    def model_cap(self) -> int: ...

    def next_k(self) -> int: ...

    def take_lookup(self, matched: int, found: int, k: int) -> int: ...

    def take_forced(self, forced: int, k: int) -> int: ...

    def extend_lookup(self, taken: int, k: int) -> bool: ...

    def keep_drafting(self, drafted: int, logits: np.ndarray,
                      top: tuple[int, float] | None = None) -> bool: ...

    def observe(self, drafted: int, accepted: int, seconds: float | None = None,
                forced: int = 0) -> None: ...

    def planned_tree(self):
        """This round's tree where the plan drafts one (scheduler/tree_plan.TreePlan), else
        None."""

    def observe_tree(self, tree: Tree, path: list[int]) -> None: ...


class Drafter:
    """One row's draft state. `vocab`: (target's, draft's) vocabulary sizes, which differ where
    one embedding is padded past the tokenizer (Qwen2.5-7B's 152,064 rows against 0.5B's
    151,936): the draft never proposes an id the target does not have (`cut`), and a target id
    the draft does not have (the target may emit one, as Hugging Face's generate does) reaches
    the draft as id 0, which only costs acceptance (`ids`)."""

    def __init__(self, draft: ModelSession, rule: Rule, schedule: Schedule,
                 vocab: tuple[int, int] | None = None, lookup: Lookup | None = None,
                 slot: int = 0) -> None:
        self.draft, self.rule, self.schedule, self.lookup = draft, rule, schedule, lookup
        self.slot = slot                       # its rows of the draft's arena
        self.draft_len = 0                     # rows of valid keys/values in that slot
        self.hits = self.bets = self.draft_calls = 0
        self.from_lookup = 0                   # this round's leading drafts found by lookup
        self.from_prediction = 0               # ... of which the request's prediction's
        self.from_earlier = 0                  # ... of which earlier requests' (suffix.py)
        self.forced_at: list[int] = []         # this round's drafts the grammar forced (places)
        # a tree's accepted path past the first node off its first path, and the target's
        # token after it: the next round's first drafts (tree_round.judge; design §4 "Trees")
        self.carried: list[int] = []
        self.from_carried = 0                  # this round's leading drafts carried so
        # set by the loop each round: the most drafts the row may verify (its room to emit
        # less the bonus token, the context, the bundle's max_draft): forced tokens' cap
        self.room = 0
        self.synced = True                     # the draft has seen every draft but the last
        # whether the draft model drafts for this row: a batch stops feeding a row whose
        # draft is behind where catching up costs more than its drafts save (batch_cost.plan);
        # the row then drafts lookup's tokens only, which need no draft
        self.fed = True
        # this round only (Loop.round, under auto): a draft that lookup's rounds left far
        # behind waits for lookup to pause before it pays its catch-up; lookup still drafts
        self.waits = False
        # lookup trees (design §4, "Trees"): set by the loop each round, the most nodes a tree
        # may have (0: chains only; the target takes no tree, or a batch); `tree`: this
        # round's, where lookup offered several continuations, else None
        self.tree_nodes = 0
        self.tree: Tree | None = None
        # a batch's row (set by the loop each round): a tree of one expanded node a level
        # grows along its chain in the batch's draft steps (`growth`, Loop._draft) instead of
        # one draft call per node of its own (node_step)
        self.grows = False
        self.growth: ChainTree | None = None
        target_vocab, draft_vocab = vocab or (0, 0)
        self.cut = target_vocab if draft_vocab > target_vocab else None   # draft rows to keep
        self.unknown = draft_vocab if target_vocab > draft_vocab else None   # ids to replace

    extends_lookup = True       # the model may draft on after lookup's tokens (one call)
    # draft trees (design §4, §6 "Trees"): where the loop lets the row verify a tree, a round
    # the schedule gives model tokens drafts the schedule's planned tree (k="auto":
    # AdaptiveK.planned_tree), or this shape where set by hand (any k > 0: a benchmark's fixed
    # shapes), instead of a chain; its nodes capped by tree_nodes, its depth by k
    tree_shape: TreeShape | None = None
    # a lookup tree's nodes beyond its chain's, as a fraction of the chain's rows (at least
    # one; 0: chains only): the verification's price of a tree is not learnt (design §4)
    tree_extra = 0.5

    def feed(self, seq: list[int], drafts: list[int]) -> list[int]:
        """What the round's first draft call takes: every token the draft has not seen, the
        pending last included (its logits give d1), then lookup's drafts."""
        return seq[self.draft_len:] + drafts

    def catch_up(self, seq: list[int], target_len: int) -> None:
        """Feed the draft every token before the pending last (the target's rows)."""
        self.advance(seq[self.draft_len:target_len])

    def advance(self, tokens: list[int]) -> None:
        """Feed `tokens` at draft_len, logits unused (a draft behind catches up)."""
        if tokens:
            call(self.draft.prefill, self.ids(tokens), self.draft_len, self.slot)
            self.draft_len += len(tokens)

    def synced_with(self, target_len: int) -> bool:
        """Whether it has seen every token the target has (the target's rows)."""
        return self.draft_len >= target_len

    def lagging(self, target_len: int) -> bool:
        """Whether it must catch up now, drafting or not (a head's features would be lost)."""
        return False

    def fill(self, b: int, T: int, n: int) -> None:
        """Set this row's inputs beyond the ids for the next call (a head's; none here)."""

    def took(self, b: int, T: int, last: int) -> None:
        """Read what the call gave beyond the logits for this row (a head's; none here)."""

    def ids(self, tokens: list[int]) -> np.ndarray:
        ids = np.asarray(tokens, np.int64)
        if self.unknown is not None and len(ids) and ids.max() >= self.unknown:
            ids = np.where(ids >= self.unknown, 0, ids)
        return ids

    def start(self, seq: list[int], k: int) -> tuple[list[int], list, int]:
        """The round's tokens before any model step and how many model tokens may follow (up
        to k in all): the tokens the grammar forces (not counted in k: up to `room`), then the
        model's where the schedule says they pay; else a lookup continuation where the
        schedule takes it (its draft probabilities None: point masses, acceptance.py),
        extended by the model where the schedule says that pays; else none, and the
        schedule's cap on model tokens."""
        self.from_lookup = self.from_prediction = self.from_earlier = self.from_carried = 0
        self.synced = True
        self.tree, self.growth = None, None
        schedule = self.schedule
        model = self.fed and not self.waits        # the draft model drafts this round
        forced = self.rule.forced(self.room)
        carried, self.carried = self.carried[:self.room], []
        looked = None
        if not forced and k > 0 and carried:
            # the last tree's path past its first branch (tree_round.judge): the target chose
            # these where its logits lacked a chain's bits; drafted again, free, and judged as
            # forced tokens are (not the schedule's to learn: design §4 "Trees"), unless
            # lookup offers them and more
            looked = self.lookup.find(seq, k) if self.lookup is not None else ([], 0)
            if looked[0][:len(carried)] != carried or len(looked[0]) <= len(carried):
                forced = carried
                self.from_carried = len(forced)
        self.forced_at = list(range(len(forced)))
        if forced:
            # free to draft and certain to pass under the mask: a verification row each, no
            # draft step and no lookup (docs/design.md §4, "Forced tokens"); the model drafts
            # on after them where it is in step and the schedule says its tokens pay
            k = max(0, min(k, self.room - len(forced)))
            behind = len(seq) - 1 - self.draft_len
            more = schedule.take_forced(len(forced), k if model and self.extends_lookup
                                        and behind <= k else 0)
            self.synced = more > 0
            return forced, [None] * len(forced), more
        if self.lookup is not None and k > 0:
            found, matched = looked if looked is not None else self.lookup.find(seq, k)
            taken = schedule.take_lookup(matched, len(found), k) if found else 0
            if taken:
                self.from_lookup = taken
                if self.lookup.source == "prediction":
                    self.from_prediction = taken
                elif self.lookup.source == "earlier":
                    self.from_earlier = taken
                # the model extends them where its tokens pay (extend_lookup) and it is in
                # step: a draft that rounds of lookup alone left behind would first prefill
                # all it missed, which the marginal rule does not price (design §6, "A draft
                # left behind by lookup")
                behind = len(seq) - 1 - self.draft_len
                if not (model and self.extends_lookup and behind <= k
                        and schedule.extend_lookup(taken, k)):
                    self.synced = False            # the draft has not seen these
                    if self.tree_nodes > taken + 1 and self.tree_extra > 0:
                        # every continuation the text offers, as deep as the chosen one, in
                        # up to tree_extra times the chain's rows more (design §4, "Trees")
                        extra = max(1, round(self.tree_extra * (taken + 1)))
                        self.tree = lookup_tree(seq[-1], [found[:taken], *self.lookup.others(
                            seq, taken)], min(self.tree_nodes, taken + 1 + extra))
                    return found[:taken], [None] * taken, 0
                return found[:taken], [None] * taken, k - taken
        left = max(0, min(k, schedule.model_cap)) if model else 0
        shape, chance = self._tree_shape(left) if left and self.tree_nodes >= 3 else (None, None)
        if shape is not None and self.grows and shape.beam == 1:
            # a batch's row: its tree grows along its chain in the batch's draft steps
            self.growth = ChainTree(seq[-1], shape, self.rule.draft_candidates, len(seq),
                                    chance)
            return [], [], shape.depth
        if shape is not None:
            self.tree = expand(seq[-1], self.node_step(seq), shape, self.rule.draft_candidates,
                               len(seq), chance=chance).tree
            self.synced = False                    # the draft has not seen the path taken
            return [], [], 0
        return [], [], left

    def _tree_shape(self, left: int):
        """This round's tree shape of model drafts and the chance its nodes are kept by, where
        the schedule plans one or a shape is set; else (None, None): a chain."""
        shape, chance = self.tree_shape, None
        if shape is None:
            plan = self.schedule.planned_tree()
            if plan is None:
                return None, None
            shape = TreeShape(plan.nodes, plan.width, plan.depth, plan.beam)
            chance = self.schedule.tree.chance  # nodes kept by their learnt chance: the plan's
        nodes = min(self.tree_nodes, shape.nodes)
        if nodes < 3:
            return None, None
        return TreeShape(nodes, shape.width, min(shape.depth, left), shape.beam), chance

    def grown(self, drafts: list[int]) -> None:
        """The batch's draft steps have grown this row's tree (`growth`, whose chain is
        `drafts`): it is the round's tree. The draft fed the chain's tokens but the last; its
        rows stay valid as far as they hold the tree's first path (the rerank may cut the
        chain), as a chain's rows stay valid as far as the target accepts."""
        growth, self.growth = self.growth, None
        tree = growth.result().tree
        first = tree.tokens[tree.first_path()].tolist()
        fed = drafts[:growth.rows - 1]              # each call after the first fed one
        same = next((i for i, (a, b) in enumerate(zip(fed, first)) if a != b),
                    min(len(fed), len(first)))
        self.draft_len -= len(fed) - same
        self.tree = tree if len(tree) > 1 else None
        self.synced = False

    def node_step(self, seq: list[int]):
        """tree_draft.expand's `step` for a draft graph without a tree input (design §4,
        "Trees"): the root's call feeds every token the draft has not seen (committed tokens:
        their rows stay, draft_len moves to len(seq); more than a call takes are prefilled first,
        as Loop._step_alone does); each other expanded node one call over
        its path at len(seq), rows there scratch that the next node's call overwrites. The
        next round feeds the accepted tokens, as after a rejected chain. (tree_draft.branch_step
        is the same without a drafter: it re-feeds the unseen tokens with every node, which
        the tools' drafts, prefilled each round, never have.)"""
        base = len(seq)

        def step(tree: Tree, nodes: list[int]) -> np.ndarray:
            rows = []
            for u in nodes:
                if u == 0 and len(seq) - self.draft_len > self.draft.max_new_len:
                    self.advance(seq[self.draft_len:-1])   # far behind: a prefill first
                feed, at = (seq[self.draft_len:], self.draft_len) if u == 0 else \
                    (tree.pending(u), base)
                logits = call(self.draft.forward, self.ids(feed), at, self.slot)
                self.draft_calls += 1
                if u == 0:
                    self.draft_len = base
                rows.append(np.array(logits[-1], np.float32)[:self.cut])
            return np.stack(rows)
        return step

    def force(self, drafts: list[int], left: int) -> tuple[list[int], int]:
        """After the model's latest draft token (the last of `drafts`): the tokens the grammar
        forces next, drafted after it without draft steps (the model's next call takes them
        with it), and how many model tokens may still follow, of `left` (a head none: it
        cannot take several tokens in one call, extends_lookup)."""
        forced = self.rule.forced(self.room - len(drafts), drafts)
        if not forced:
            return forced, left
        self.forced_at += range(len(drafts), len(drafts) + len(forced))
        room = self.room - len(drafts) - len(forced)
        return forced, min(left, room) if self.extends_lookup else 0

    def bet(self, drafts: list[int]) -> None:
        """Called while the target verifies `drafts`; the sequential drafter waits."""

    def settle(self, target_len: int, accepted_all: bool, next_token: int) -> None:
        self.draft_len = min(self.draft_len, target_len)   # when all accepted, dk is pending

    def close(self) -> None:
        pass


class SplitDrafter(Drafter):
    def __init__(self, draft: ModelSession, rule: Rule, schedule: Schedule,
                 vocab: tuple[int, int] | None = None, lookup: Lookup | None = None,
                 slot: int = 0) -> None:
        super().__init__(draft, rule, schedule, vocab, lookup, slot)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="ssd-draft")
        self.stop = threading.Event()
        self.pending: Future | None = None     # (tokens, probs) drafted after dk
        self.ready: tuple[list[int], list, list] | None = None   # tokens, probs, what _keep saw
        self.seen: list[tuple[np.ndarray | None, tuple[int, float] | None]] = []

    def start(self, seq: list[int], k: int) -> tuple[list[int], list, int]:
        if self.ready is None:
            return super().start(seq, k)
        tokens, probs, seen = self.ready        # drafted during the last verification
        self.ready = None
        self.carried = []                       # (the bet follows what was emitted)
        self.from_lookup = self.from_prediction = self.from_earlier = self.from_carried = 0
        self.forced_at = []                     # (a grammar refuses split mode)
        self.synced = True
        # the schedule judges a hit's tokens as it judges drafted ones, in order: it learns
        # their confidence (its bins saw only misses' and sequential rounds' tokens) and its
        # stopping rule may end the round early (k = 0 drops a stale bet)
        m = 0
        while m < min(k, len(tokens)):
            m += 1
            row, top = seen[m - 1]
            if not self.schedule.keep_drafting(m, row, top):
                break
        self.draft_len = len(seq) - 1 + m       # rows for last, r1..r(m-1) are valid
        return tokens[:m], probs[:m], 0

    def bet(self, drafts: list[int]) -> None:
        # guess the bonus token and the next round: k+1 more tokens after dk, which is fed at
        # row draft_len; no further than the context's last row (a bet of one token, the bonus
        # guess alone, would leave the next round nothing)
        steps = min(len(drafts) + 1, self.draft.max_context - self.draft_len)
        if not drafts or steps < 2 or not self.synced:    # lookup tokens the draft never saw
            return
        self.stop.clear()
        self.bets += 1
        self.seen = []                          # each step's (last logits row, top), kept for
        self.pending = self.pool.submit(self._draft, drafts[-1], steps, tuple(drafts))

    def _draft(self, feed: int, steps: int, unjudged: tuple[int, ...]):
        """The bet: up to `steps` draft tokens after `feed`, on this thread, one call each;
        `unjudged` (the round being verified) is what the rule's logits processors count
        before them. What keep_drafting needs of each step is kept for a hit (the row is
        copied only where the graph gives no top: logits live until the next call)."""
        drafts, probs = [], []
        for _ in range(steps):
            if self.stop.is_set():
                break
            logits = call(self.draft.forward, self.ids([feed]), self.draft_len, self.slot)
            top = self.draft.top()
            if self.cut is not None:
                logits = np.asarray(logits[-1])[None, :self.cut]
                top = top if top is not None and top[0] < self.cut else None
            self.draft_len += 1
            self.draft_calls += 1
            feed, q = self.rule.draft_pick(logits, self.draft_len, top, [*unjudged, *drafts])
            drafts.append(feed)
            probs.append(q)
            self.seen.append((None, top) if top is not None else (np.array(logits[-1])[None],
                                                                  None))
        return drafts, probs

    def settle(self, target_len: int, accepted_all: bool, next_token: int) -> None:
        if self.pending is None:
            return super().settle(target_len, accepted_all, next_token)
        if not accepted_all:
            self.stop.set()                     # the bet is lost: stop after the current step
        tokens, probs = self.pending.result()
        self.pending = None
        if accepted_all and len(tokens) > 1 and tokens[0] == next_token:
            self.hits += 1
            self.ready = (tokens[1:], probs[1:], self.seen[1:])
        else:
            self.draft_len = min(self.draft_len, target_len)

    def close(self) -> None:
        if self.pending is not None:
            self.stop.set()
            self.pending.result()
            self.pending = None
        self.pool.shutdown(wait=True)


def call(method, ids: np.ndarray, past_len: int, slot: int):
    """A session's forward or prefill for one sequence in `slot` (sessions of one slot, such
    as TensorRT's, take no slot argument)."""
    return method(ids, past_len, slot=slot) if slot else method(ids, past_len)
