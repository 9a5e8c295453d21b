"""A draft tree's shape from the cost model (docs/design.md §6): how many nodes, how wide and
how deep a round's tree is, from v(N) (a verification of N rows, calibrated per machine as
v(k) is), the draft's cost per level, and the acceptance learnt per depth and per rank of a
candidate among its siblings. A chain is the width-1 tree; one node (the root alone) is k = 0.

    E(tree) = Σ_nodes P(node accepted),   P(node) = P(parent) · Π_{s<r} (1 - a[d][s]) · a[d][r]
    speed-up = (1 + E + C) / (c₁ + (D - 1)·c + v(N) + C · v(2))  ·  v(1)

C: P(the target's path leaves the first path), the sum of P over the nodes of rank > 0 whose
ancestors are all rank 0. The round keeps the first path only and drafts the rest of such a
path again next round (design §4, "Trees"): those tokens, and the target's token after them,
come in a round of their own, with no draft step (priced as v(2)).

a[d][r]: P(the rank-r candidate at depth d is accepted | its parent was, ranks < r were not).
The best tree of N nodes holds the N - 1 nodes of highest P (a child's P is below its
parent's, so they form a tree); the plan takes the (N, width, depth) of highest speed-up.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Callable, Literal, Sequence

from ..round.tree import Tree
from .batch_cost import BatchCost, LiveCost
from .cost import CostModel

DEPTHS = 8          # depths learnt apart (deeper ones share the last)
RANKS = 4           # ranks learnt apart (later ones share the last)


@dataclass
class TreeAcceptance:
    """Acceptance per depth and rank, learnt from the rounds' verdicts with forgetting
    (`decay` per round), each cell starting at a prior with the weight of `prior` tries:
    rank 0 at the chain's α, rank r at α / (r + 1) (a later guess is a weaker one)."""

    alpha: float = 0.5
    decay: float = 0.98
    prior: float = 4.0
    hits: list[list[float]] = field(default_factory=lambda: [[0.0] * RANKS
                                                             for _ in range(DEPTHS)])
    tried: list[list[float]] = field(default_factory=lambda: [[0.0] * RANKS
                                                              for _ in range(DEPTHS)])

    def rate(self, depth: int, rank: int) -> float:
        """a[depth][rank], depth >= 1."""
        d, r = min(depth, DEPTHS) - 1, min(rank, RANKS - 1)
        start = self.alpha / (r + 1)
        return (self.hits[d][r] + self.prior * start) / (self.tried[d][r] + self.prior)

    def chance(self, q: float, depth: int, rank: int) -> float:
        """P(the rank-`rank` candidate at `depth` passes | its parent did): a[d][r] times the
        chance that every earlier rank failed; `q` (the draft's probability of it) unused.
        tree_draft.expand's `chance`, so that a drafted tree has the plan's shape."""
        out = self.rate(depth, rank)
        for s in range(rank):
            out *= 1 - self.rate(depth, s)
        return out

    def observe(self, tree: Tree, path: Sequence[int]) -> None:
        """A round's verdict over a tree: the nodes it judged (Tree.tried), each counted at its
        depth and rank."""
        self._age()
        for node, passed in tree.tried(list(path)):
            d, r = min(int(tree.depth[node]), DEPTHS) - 1, min(tree.rank(node), RANKS - 1)
            self.tried[d][r] += 1
            self.hits[d][r] += passed

    def observe_chain(self, drafted: int, accepted: int) -> None:
        """A chain's verdict (every node rank 0): the first `accepted` of `drafted` passed."""
        self._age()
        for d in range(min(accepted + 1, drafted)):
            i = min(d, DEPTHS - 1)
            self.tried[i][0] += 1
            self.hits[i][0] += d < accepted

    def _age(self) -> None:
        for row_h, row_t in zip(self.hits, self.tried):
            for r in range(RANKS):
                row_h[r] *= self.decay
                row_t[r] *= self.decay

    def as_dict(self) -> dict:
        """a[d][r] for the depths and ranks learnt apart (bench reports, usage)."""
        return {"by_depth_rank": [[round(self.rate(d, r), 4) for r in range(RANKS)]
                                  for d in range(1, DEPTHS + 1)]}


@dataclass(frozen=True)
class TreePlan:
    """A round's tree: `nodes` rows in all (1: k = 0), `width` candidates per expanded node,
    `depth` levels, `beam` nodes expanded per level (tree_draft.TreeShape's), the accepted
    tokens per round it expects and its speed-up over k = 0 by the model."""

    nodes: int
    width: int
    depth: int
    beam: int
    expected: float
    speedup: float

    @property
    def is_chain(self) -> bool:
        return self.width <= 1


def best_nodes(acc: TreeAcceptance, limit: int, max_depth: int, max_width: int,
               first_path: bool = False) -> list[tuple[float, int, int, int]]:
    """The `limit` nodes of highest P(accepted) in the tree of every candidate (depth up to
    max_depth, rank below max_width), best first: (P, depth, rank, parent's index in this
    list, -1 for the root). `first_path`: only the first candidates' chain has children (a
    batch row's tree, tree_draft.ChainTree)."""
    out: list[tuple[float, int, int, int]] = []
    # heap of (-P, tie, depth, rank, parent, P(parent), P(ranks < rank all rejected))
    heap = [(-acc.rate(1, 0), 0, 1, 0, -1, 1.0, 1.0)] if max_depth and max_width else []
    tie = 1
    while heap and len(out) < limit:
        neg, _, d, r, parent, p_parent, none_before = heapq.heappop(heap)
        me = len(out)
        out.append((-neg, d, r, parent))
        if r + 1 < max_width:                           # its next sibling
            left = none_before * (1 - acc.rate(d, r))
            heapq.heappush(heap, (-p_parent * left * acc.rate(d, r + 1), tie, d, r + 1, parent,
                                  p_parent, left))
            tie += 1
        if d < max_depth and not (first_path and r):    # its first child
            heapq.heappush(heap, (neg * acc.rate(d + 1, 0), tie, d + 1, 0, me, -neg, 1.0))
            tie += 1
    return out


def plan_tree(acc: TreeAcceptance, verify: Callable[[int], float], c_first: float, c: float,
              max_nodes: int, max_depth: int = 8, max_width: int = 4,
              draft_calls: Literal["levels", "nodes"] = "levels") -> TreePlan:
    """The shape of highest expected speed-up: every node budget N <= max_nodes, depth cap
    and width cap, each with its best nodes (best_nodes); `verify(n)`: v of n rows in target
    steps (v(1) = 1); c₁, c: the draft's first and later calls. `draft_calls`: "levels", a
    draft graph that takes a tree (one call a level, as a chain's step); "nodes", one without
    (tree_draft.branch_step: one call per expanded node). k = 0 (speed-up 1) where nothing
    pays."""
    best = TreePlan(1, 1, 0, 1, 0.0, 1.0)
    v1 = verify(1)
    for width in range(1, max_width + 1):
        for depth_cap in range(1, max_depth + 1):
            nodes = best_nodes(acc, max_nodes - 1, depth_cap, width)
            expected, deepest, ranks, carry = 0.0, 0, 0, 0.0
            expanded: set[int] = set()
            first: list[bool] = []                      # on the first path
            for n, (p, d, r, parent) in enumerate(nodes, start=2):
                expected += p
                deepest, ranks = max(deepest, d), max(ranks, r + 1)
                expanded.add(parent)
                under_first = parent < 0 or first[parent]
                first.append(r == 0 and under_first)
                if r and under_first:
                    carry += p                          # the path leaves the first one here
                calls = deepest if draft_calls == "levels" else len(expanded)
                cost = c_first + (calls - 1) * c + verify(n) + carry * verify(2)
                speedup = (1 + expected + carry) / cost * v1
                if speedup > best.speedup + 1e-12:
                    best = TreePlan(n, ranks, deepest, _beam(nodes[:n - 1]), expected, speedup)
    return best


def plan_for(acc: TreeAcceptance, cost: CostModel, max_nodes: int,
             draft_calls: Literal["levels", "nodes"] = "levels") -> TreePlan:
    """plan_tree from a generator's calibration (Knowledge.cost_model): its v(k) as v(N) (N =
    k + 1 rows; past its last k, verify_steps goes on) and its c₁ and c."""
    return plan_tree(acc, verify_steps(cost), cost.c_first, cost.c, max_nodes,
                     draft_calls=draft_calls)


def plan_batch(accs: Sequence[TreeAcceptance | None], verify: Callable[[int], float],
               c_first: float, c: float, max_nodes: int, max_depth: int = 8,
               max_width: int = 4, first_path: bool = True) -> tuple[int, list[TreePlan]]:
    """A batch's trees: every row its own tree of up to W nodes in one call of
    len(accs) × W rows (its rows padded to the widest), `verify(W)` that call's price in
    target steps of the batch's one-token call (verify(1) = 1), the draft's levels one call
    each for all rows (c₁, then c). A row of None drafts no tree (its token a round: the
    target's). `first_path`: each row's tree grows along its chain (tree_draft.ChainTree, as
    a batch's rows draft them). Returns the W of highest batch speed-up over k = 0 (1: k = 0)
    and each row's plan at that W (None where it drafts none)."""
    none = TreePlan(1, 1, 0, 1, 0.0, 1.0)
    best_w, best_rate, plans = 1, 1.0, [None if acc is None else none for acc in accs]
    for w in range(2, max_nodes + 1):
        rows = [None if acc is None else _fill(acc, w, max_depth, max_width, first_path)
                for acc in accs]
        deepest = max((p.depth for p in rows if p is not None), default=0)
        cost = (c_first + (deepest - 1) * c if deepest else 0.0) + verify(w)
        rate = sum(1 + (p.expected if p is not None else 0.0) for p in rows) / cost / \
            len(accs) * verify(1)
        if rate > best_rate + 1e-12:
            best_w, best_rate = w, rate
            plans = [None if p is None else replace(p, speedup=rate) for p in rows]
    return best_w, plans


def plan_batch_for(accs: Sequence[TreeAcceptance | None], cost: BatchCost | LiveCost,
                   max_nodes: int, max_depth: int = 8, max_width: int = 4
                   ) -> tuple[int, list[TreePlan | None]]:
    """plan_batch from a batch's prices (batch_cost.BatchCost or LiveCost, calls of this many
    rows): V(B, W) over its one-token call, its draft step for each level, the first with the
    calls a round adds to it (LiveCost.extra_calls: a draft that feeds a row's pending token
    and its last in two calls)."""
    one = cost.verify_time(1)
    step = cost.round_time(1) - cost.verify_time(2)        # a drafting round's draft calls
    later = cost.cost.draft_step * cost.draft_factor if isinstance(cost, LiveCost) \
        else cost.draft_step
    return plan_batch(accs, lambda w: cost.verify_time(w) / one, step / one, later / one,
                      max_nodes, max_depth, max_width)


def _fill(acc: TreeAcceptance, w: int, max_depth: int, max_width: int,
          first_path: bool = False) -> TreePlan:
    """A row's best tree of w nodes (the call pays for them whether it fills them or not);
    its speed-up is the batch's, set by plan_batch."""
    nodes = best_nodes(acc, w - 1, max_depth, max_width, first_path)
    if not nodes:
        return TreePlan(1, 1, 0, 1, 0.0, 1.0)
    return TreePlan(len(nodes) + 1, max(r for _, _, r, _ in nodes) + 1,
                    max(d for _, d, _, _ in nodes), _beam(nodes),
                    sum(p for p, _, _, _ in nodes), 0.0)


def _beam(nodes: list[tuple[float, int, int, int]]) -> int:
    """Nodes expanded at the widest level: those with a child among `nodes`, per depth (the
    root is the one node of level 0)."""
    expanded: dict[int, set[int]] = {}
    for _, d, _, parent in nodes:
        if parent >= 0:
            expanded.setdefault(d - 1, set()).add(parent)
    return max([1, *(len(s) for s in expanded.values())])


def verify_steps(cost: CostModel) -> Callable[[int], float]:
    """v(n) for n verification rows from a calibration (CostModel.v(n - 1)); past its last
    measured length, the last measured step's rise per row goes on (a call past the weight-
    bound knee grows about linearly in its rows)."""
    last = len(cost.verify) - 1

    def v(n: int) -> float:
        k = n - 1
        if k <= last:
            return cost.v(k)
        slope = cost.v(last) - cost.v(last - 1) if last else cost.v(0)
        return cost.v(last) + (k - last) * max(slope, 0.0)
    return v


def verify_from_times(times: dict[int, float]) -> Callable[[int], float]:
    """v(n) in target steps from calibration.calibrate_rows' seconds by row count (1 among
    them), interpolated linearly between the timed counts and held past the last."""
    counts = sorted(times)
    one = times[1]

    def v(n: int) -> float:
        if n <= counts[0]:
            return times[counts[0]] / one
        for a, b in zip(counts, counts[1:]):
            if n <= b:
                return (times[a] + (times[b] - times[a]) * (n - a) / (b - a)) / one
        return times[counts[-1]] / one
    return v
