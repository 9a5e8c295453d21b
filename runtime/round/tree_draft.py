"""Drafting a tree (docs/design.md §6): depth by depth, the candidates of highest path
probability, each expanded node giving its own top-m, under a node budget (EAGLE-2's dynamic
tree). `expand` is a function over the draft's per-node distributions: `step(tree, nodes)`
gives the rows of logits for `nodes` of the tree drafted so far, from a draft graph that takes
a tree (one call per depth, an ancestor mask over the rows it fed) or `branch_step`, one chain
call per node over its path. The rule picks the candidates (Rule.draft_candidates): greedy
and deterministic top-m are point masses for the verdict, a sampling rule's are sampled
without replacement from q (exponential races keyed by seed, position and node).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ConfigError
from .tree import Tree

# Rule.draft_candidates: (row of logits (vocab,), how many, position of the children, pending
# tokens, node, sampled) -> (tokens, their draft probabilities, q for the verdict or None)
Pick = Callable[[np.ndarray, int, int, list, int, bool], tuple[list[int], np.ndarray, object]]


@dataclass(frozen=True)
class TreeShape:
    """A round's tree: at most `nodes` verification rows (the root included), `depth` draft
    levels, `width` candidates per expanded node (top-m), `beam` nodes expanded per level.
    A chain of k drafts: TreeShape(k + 1, 1, k, 1)."""

    nodes: int
    width: int = 1
    depth: int = 1
    beam: int = 1

    def __post_init__(self) -> None:
        for name in ("nodes", "width", "depth", "beam"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"a draft tree's {name}={value!r} must be an integer >= 1.")

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """A shape written NODESxWIDTHxDEPTHxBEAM (the tools' "6x5x1x1"; later parts may be
        left out: TreeShape's defaults)."""
        try:
            return cls(*(int(x) for x in text.split("x")))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"a draft tree's shape {text!r}: write NODESxWIDTHxDEPTHxBEAM, "
                              f"e.g. 6x5x1x1 ({exc}).") from exc

    @property
    def is_chain(self) -> bool:
        return self.width == 1 or self.nodes <= 2

    @property
    def draft_calls(self) -> int:
        """Draft calls a tree-mask draft makes for it (one per level it expands)."""
        return min(self.depth, self.nodes - 1)


@dataclass
class DraftTree:
    """What `expand` drafted: the tree, each draft node's q for the verdict (None: a point
    mass; node order after the root, as verify_tree takes it) and each node's path
    probability under the draft (the root's 1)."""

    tree: Tree
    probs: list
    values: np.ndarray


def expand(root: int, step: Callable[[Tree, list[int]], np.ndarray], shape: TreeShape,
           pick: Pick, position: int, sampled: bool = False,
           chance: Callable[[float, int, int], float] | None = None) -> DraftTree:
    """Draft a tree after `root` (its children sit at `position`).

    Each level feeds the `beam` frontier nodes of highest value to `step` and takes `width`
    candidates of each (its own top-m, `pick`). Deterministic candidates (point masses:
    `sampled` False) are then cut to the `nodes` budget by value over all levels (EAGLE-2's
    rerank: a node's value is at most its parent's, so the kept nodes form a tree). Sampled
    candidates (`sampled`: `pick` draws without replacement and returns q) are never cut by
    their own value, which would bias them: each level gives the frontier's nodes, in order of
    their value, as many children as the level's share of the budget allows (what is left but
    one node for each level below), decided before they are drawn.

    A node's value is its parent's times its own chance: the draft's q of it by default (the
    path probability, calibrated where acceptance follows q, as under sampling), or
    `chance(q, depth, rank)`, e.g. the planner's learnt chance of a rank at a depth
    (tree_plan.TreeAcceptance.chance): under greedy a draft close to the target passes its
    first guess far more often than its q says, and the q-product would trade its deep nodes
    for siblings that seldom pass; sampled children are tried in the order drawn, the first
    passing with probability Σ min(p, q) whatever its q."""
    tokens, parents, depth = [int(root)], [-1], [0]
    values, probs = [1.0], [None]
    frontier = [0]
    budget = shape.nodes - 1
    for level in range(shape.depth):
        if not frontier or (sampled and len(tokens) - 1 >= budget):
            break
        partial = Tree(tokens, parents)
        rows = np.asarray(step(partial, frontier))                     # (len(frontier), V)
        new = []
        # sampled: this level's share of the budget, fixed before the draw, one node kept for
        # each level below it (so the tree reaches the shape's depth, as a chain would)
        room = max(1, budget - (len(tokens) - 1) - (shape.depth - level - 1))
        for u, row in zip(frontier, rows):
            count = shape.width
            if sampled:
                count = min(count, room)
                room -= count
                if count <= 0:
                    break
            chosen, q_of, q = pick(row, count, position + depth[u], partial.pending(u), u,
                                   sampled)
            for rank, (t, v) in enumerate(zip(chosen, q_of)):
                tokens.append(int(t))
                parents.append(u)
                depth.append(depth[u] + 1)
                factor = float(v) if chance is None else chance(float(v), depth[u] + 1, rank)
                values.append(values[u] * factor)
                probs.append(q)
                new.append(len(tokens) - 1)
        frontier = sorted(new, key=lambda i: -values[i])[:shape.beam]
    return _kept(tokens, parents, depth, values, probs, budget, sampled)


def _kept(tokens: list[int], parents: list[int], depth: list[int], values: list[float],
          probs: list, budget: int, sampled: bool) -> DraftTree:
    """The drafted nodes cut to `budget` by value (deterministic candidates: EAGLE-2's
    rerank, parents first), first path first (first_path_first)."""
    keep = list(range(len(tokens)))
    if not sampled and len(tokens) - 1 > budget:      # rerank: the budget's best, parents first
        best = sorted(range(1, len(tokens)), key=lambda i: (-values[i], depth[i], i))[:budget]
        keep = [0, *sorted(best)]
    keep = first_path_first(keep, parents)
    index = {old: new for new, old in enumerate(keep)}
    tree = Tree([tokens[i] for i in keep], [-1, *(index[parents[i]] for i in keep[1:])])
    return DraftTree(tree, [probs[i] for i in keep[1:]], np.array([values[i] for i in keep]))


class ChainTree:
    """A tree of one expanded node per level grown along the draft's chain (a `beam` of 1,
    deterministic candidates): each step takes the last chain token's row of logits, keeps
    its `width` best candidates (`pick`, point masses) and continues the chain with the first
    of them, the others leaves. A batch's rows grow theirs in the batch's own draft steps, one
    call a level for all rows, the rows each feeding their chain token as a chain's step does
    (Loop._draft; design §4 "Trees"): a row's draft rows are its chain's. `result` keeps the
    nodes as `expand` does (the same values, the rerank to `shape.nodes`, the first path
    first); `expand` with a beam of 1 grows the same tree where each level's first candidate
    has its highest value (q's top-m; a learnt chance may rank a later one above it, which
    `expand` would expand instead). The batch's plan prices this shape
    (tree_plan.best_nodes, `first_path`)."""

    def __init__(self, root: int, shape: TreeShape, pick: Pick, position: int,
                 chance: Callable[[float, int, int], float] | None = None) -> None:
        self.shape, self.pick, self.position, self.chance = shape, pick, position, chance
        self.tokens, self.parents, self.depth = [int(root)], [-1], [0]
        self.values, self.probs = [1.0], [None]
        self.last = 0                                 # the chain's node the next row is of
        self.chain: list[int] = []                    # ... and the tokens down to it
        self.rows = 0                                 # rows of logits taken (draft calls)

    @property
    def levels(self) -> int:
        """Levels grown so far (draft tokens on the chain)."""
        return len(self.chain)

    def add(self, row: np.ndarray) -> int | None:
        """The next level from the chain's last node's row of logits (vocab,): its candidates;
        returns the first (the chain's next token, which the next step feeds), None where
        there is none (a grammar that allows nothing there)."""
        u, tokens = self.last, self.tokens
        self.rows += 1
        chosen, q_of, _ = self.pick(row, self.shape.width, self.position + len(self.chain),
                                    list(self.chain), u, False)
        if not len(chosen):
            return None
        d = len(self.chain) + 1
        for rank, (t, v) in enumerate(zip(chosen, q_of)):
            tokens.append(int(t))
            self.parents.append(u)
            self.depth.append(d)
            factor = float(v) if self.chance is None else self.chance(float(v), d, rank)
            self.values.append(self.values[u] * factor)
            self.probs.append(None)
        self.last = len(tokens) - len(chosen)         # the first candidate: the chain's next
        self.chain.append(tokens[self.last])
        return tokens[self.last]

    def result(self) -> DraftTree:
        return _kept(self.tokens, self.parents, self.depth, self.values, self.probs,
                     self.shape.nodes - 1, False)


def first_path_first(keep: list[int], parents: list[int]) -> list[int]:
    """`keep` (parents first) reordered so that its first path, from the root down each node's
    first kept child (its best candidate: the chain the draft would draft), takes nodes 1, 2,
    ...: the rows a chain's tokens take, whose logits are the chain's bit for bit (design §2
    "Trees"); the other nodes follow in their order, each after its parent, so every child
    keeps its rank among its siblings."""
    first: dict[int, int] = {}
    for i in keep[1:]:
        first.setdefault(parents[i], i)
    path = [keep[0]]
    while path[-1] in first:
        path.append(first[path[-1]])
    on = set(path)
    return path + [i for i in keep if i not in on]


def branch_step(draft, seq: list[int], draft_len: int, slot: int = 0,
                ids: Callable[[list[int]], np.ndarray] | None = None, cut: int | None = None):
    """A `step` for a draft without a tree graph: one chain call per node, over what the draft
    has not seen (seq[draft_len:], the root last) and the node's path, at `draft_len`. Its
    rows past draft_len are scratch (each call overwrites them; design §6: the draft's tree
    KV): the drafter's draft_len does not move, and the next round's first call feeds the
    accepted tokens as a chain does after a rejection. `ids` and `cut`: the drafter's (ids the
    draft lacks, rows past the target's vocabulary)."""
    as_ids = ids or (lambda tokens: np.asarray(tokens, np.int64))

    def step(tree: Tree, nodes: list[int]) -> np.ndarray:
        rows = []
        for u in nodes:
            feed = as_ids(seq[draft_len:] + tree.pending(u))
            logits = draft.forward(feed, draft_len, slot=slot) if slot else \
                draft.forward(feed, draft_len)
            rows.append(np.array(logits[-1], np.float32)[:cut])
        return np.stack(rows)                                          # (len(nodes), V)
    return step


def tree_step(draft, seq: list[int], draft_len: int, slot: int = 0,
              ids: Callable[[list[int]], np.ndarray] | None = None, cut: int | None = None):
    """A `step` for a draft graph that takes a tree (`forward_tree`, as the ort target does,
    backends/ort_tree.py): each level is one call over the whole tree drafted so far, root
    first at `draft_len` (a weight-bound call of a few rows costs about a step), each node
    attending the committed rows and its own path. Its rows past draft_len are scratch, as
    branch_step's. The draft must have seen every token but the root (seq[-1])."""
    if draft_len != len(seq) - 1:
        raise ValueError(f"tree_step: the draft has seen {draft_len} tokens of {len(seq)}; "
                         f"catch it up to all but the root first (Drafter.catch_up).")
    if not getattr(draft, "takes_trees", False):
        raise ValueError("tree_step: this draft graph takes no tree; use branch_step.")
    as_ids = ids or (lambda tokens: np.asarray(tokens, np.int64))

    def step(tree: Tree, nodes: list[int]) -> np.ndarray:
        logits = draft.forward_tree(as_ids(tree.tokens.tolist()), tree.ancestors(), tree.depth,
                                    draft_len, slot)                    # (N, V)
        return np.array(np.asarray(logits)[nodes], np.float32)[:, :cut]
    return step


def top_candidates(keys: np.ndarray, q: np.ndarray, count: int) -> list[int]:
    """The `count` ids of highest `keys` among those q gives mass, best first (ties: lower
    id first)."""
    live = np.flatnonzero(q > 0)
    order = live[np.lexsort((live, -keys[live]))]
    return [int(t) for t in order[:count]]


def race_noise(key: int, position: int, node: int, size: int) -> np.ndarray:
    """Exponential noise E (size,) keyed by (key, position, node): the ids of smallest E / q,
    in order, are a sample of q without replacement (exponential races; the Gumbel-top-k
    trick), the same for a seed however the round was scheduled."""
    return np.random.default_rng([key, position, node]).exponential(size=size)


def softmax(row: np.ndarray) -> np.ndarray:
    """float64 softmax of one row; -inf (masked) ids get 0."""
    scores = np.asarray(row, np.float64)
    probs = np.exp(scores - scores.max())
    return probs / probs.sum()
