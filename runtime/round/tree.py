"""A round's draft tree (docs/design.md §5): several guesses per position, verified in one call.

Node 0 is the root, the round's first verified input (the last committed token, not a draft);
every other node is a draft token whose parent comes before it, so a chain of k drafts is the
tree of k + 1 nodes where node i's parent is i - 1. numpy only: the round layer reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError


class Tree:
    """A round's draft tree. Node 0 is the root: the round's first verified input (the last
    committed token, not a draft); its logits give depth 1. Nodes are in topological order
    (parents[i] < i), so the accepted path's node indices increase. len(tree) is the
    verification call's rows, the root included (a chain of k drafts: k + 1)."""

    def __init__(self, tokens, parents) -> None:
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)       # (N,)
        parents = np.asarray(parents, dtype=np.int64).reshape(-1)     # (N,)
        n = len(tokens)
        if n == 0 or len(parents) != n:
            raise ConfigError(f"a draft tree needs one parent per token and at least the root; "
                              f"found {n} tokens and {len(parents)} parents.\n"
                              f"---> HINT: build it with Tree.chain or Tree.from_paths.")
        order = np.arange(n)
        if parents[0] != -1 or np.any(parents[1:] < 0) or np.any(parents[1:] >= order[1:]):
            raise ConfigError(f"a draft tree's parents must be -1 for the root (node 0) and "
                              f"0 <= parents[i] < i for every other node; found "
                              f"{parents.tolist()}.\n---> HINT: list the nodes in topological "
                              f"order (a parent before its children).")
        if np.any(tokens < 0):
            raise ConfigError(f"a draft tree's tokens must be token ids >= 0; found "
                              f"{tokens.tolist()}.")
        depth = np.zeros(n, np.int64)
        for i in range(1, n):
            depth[i] = depth[parents[i]] + 1
        self.tokens, self.parents, self.depth = tokens, parents, depth
        self._children: list[list[int]] | None = None

    @classmethod
    def chain(cls, root: int, drafts: list[int]) -> Tree:
        """The chain root -> drafts[0] -> drafts[1] ...: what a round of k drafts is today."""
        return cls([root, *drafts], np.arange(-1, len(drafts)))

    @classmethod
    def from_paths(cls, root: int, paths: list[list[int]], max_nodes: int,
                   whole_first: bool = False) -> Tree:
        """The trie of `paths` (token lists after the root; common prefixes merged), breadth
        first with the earlier paths' nodes first at each depth, cut at `max_nodes` nodes in
        all (the root included): the nodes past the budget are dropped, deepest first.
        `whole_first`: path by path instead, so the first path is whole within the budget and
        its nodes are rows 1, 2, ... as a chain's (lookup's trees, lookup.lookup_tree)."""
        if max_nodes < 1:
            raise ConfigError(f"a draft tree's max_nodes={max_nodes} must be >= 1 (the root).")
        if whole_first:
            prefixes = (path[:d] for path in paths for d in range(1, len(path) + 1))
        else:
            deepest = max((len(p) for p in paths), default=0)
            prefixes = (path[:d] for d in range(1, deepest + 1) for path in paths
                        if len(path) >= d)
        tokens, parents = [int(root)], [-1]
        index: dict[tuple[int, ...], int] = {(): 0}       # prefix -> node
        for part in prefixes:
            if len(tokens) >= max_nodes:
                break
            prefix = tuple(int(t) for t in part)
            parent = index.get(prefix[:-1])
            if prefix in index or parent is None:         # merged, or its parent was cut
                continue
            index[prefix] = len(tokens)
            tokens.append(prefix[-1])
            parents.append(parent)
        return cls(tokens, parents)

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"Tree(tokens={self.tokens.tolist()}, parents={self.parents.tolist()})"

    def is_chain(self) -> bool:
        """Whether every node has at most one child (node i's parent is i - 1)."""
        return bool(np.all(self.parents[1:] == np.arange(len(self) - 1)))

    def children(self, node: int) -> list[int]:
        """The nodes whose parent is `node`, in order."""
        if self._children is None:
            kids: list[list[int]] = [[] for _ in range(len(self))]
            for i in range(1, len(self)):
                kids[self.parents[i]].append(i)
            self._children = kids
        return self._children[node]

    def path(self, node: int) -> list[int]:
        """Node indices root..node."""
        out = [int(node)]
        while out[-1] != 0:
            out.append(int(self.parents[out[-1]]))
        return out[::-1]

    def ancestors(self) -> np.ndarray:
        """bool (N, N): [i, j] = node j is i or an ancestor of i (the tree's attention mask
        over its own rows; a chain's is the lower triangle)."""
        n = len(self)
        mask = np.zeros((n, n), bool)                     # (N, N)
        for i in range(n):
            if i:
                mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return mask

    def positions(self, past_len: int) -> np.ndarray:
        """int64 (N,): each node's position in the sequence, past_len + depth."""
        return past_len + self.depth

    def pending(self, node: int) -> list[int]:
        """The draft tokens after the root up to and including `node`: the tokens the target
        sees as emitted when it reads `node`'s logits (the processors' `pending`)."""
        return [int(self.tokens[i]) for i in self.path(node)[1:]]

    def rank(self, node: int) -> int:
        """The node's place among its siblings (0: its parent's first candidate)."""
        return self.children(int(self.parents[node])).index(node) if node else 0

    def tried(self, path: list[int]) -> list[tuple[int, bool]]:
        """The nodes a verdict that accepted `path` judged, in order, and whether each passed:
        at the root and at each accepted node its children up to the accepted one (all of
        them after the last). The statistics and the planner learn acceptance by depth and
        rank from it."""
        out = []
        for u, nxt in zip([0, *path], [*path, None]):
            for c in self.children(u):
                out.append((c, c == nxt))
                if c == nxt:
                    break
        return out

    def first_path(self) -> list[int]:
        """The nodes from the root down each node's first child, the root left out: the
        draft's first guesses, a chain's rows 1, 2, ... (tree_draft.first_path_first)."""
        out, node = [], 0
        while kids := self.children(node):
            node = kids[0]
            out.append(node)
        return out

    def leaves(self) -> list[int]:
        """The nodes without children, in order."""
        return [i for i in range(len(self)) if not self.children(i)]


@dataclass
class Verdicts:
    """Draft nodes judged and passed per depth (1, 2, ...) and per rank among siblings (0: the
    first candidate), chains' rounds (depth j, rank 0) and trees' (Tree.tried) alike: the
    statistics' acceptance by depth and rank (loop.Stats, ssd-bench, ssd-serve's usage)."""

    nodes: int = 0                # draft nodes verified (a chain's k a round; a tree's N - 1)
    depth_tried: list[int] = field(default_factory=list)
    depth_accepted: list[int] = field(default_factory=list)
    rank_tried: list[int] = field(default_factory=list)
    rank_accepted: list[int] = field(default_factory=list)

    def tree(self, tree: Tree, path: list[int]) -> None:
        self.nodes += len(tree) - 1
        for node, passed in tree.tried(path):
            self.add(int(tree.depth[node]), tree.rank(node), passed)

    def chain(self, drafted: int, accepted: int) -> None:
        """A chain's round: depths 1..accepted passed, the next one (if drafted) failed."""
        self.nodes += drafted
        for depth in range(1, min(drafted, accepted + 1) + 1):
            self.add(depth, 0, depth <= accepted)

    def add(self, depth: int, rank: int, passed: bool) -> None:
        for tried, hits, at in ((self.depth_tried, self.depth_accepted, depth - 1),
                                (self.rank_tried, self.rank_accepted, rank)):
            while len(tried) <= at:
                tried.append(0)
                hits.append(0)
            tried[at] += 1
            hits[at] += bool(passed)

    def merge(self, other: Verdicts) -> None:
        """Add another's counts (a bench's runs, a server's requests)."""
        self.nodes += other.nodes
        for name in ("depth_tried", "depth_accepted", "rank_tried", "rank_accepted"):
            mine, theirs = getattr(self, name), getattr(other, name)
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, n in enumerate(theirs):
                mine[i] += n

    def as_dict(self) -> dict:
        def rates(hits: list[int], tried: list[int]) -> list[float | None]:
            return [h / t if t else None for h, t in zip(hits, tried)]
        return {"nodes": self.nodes, "depth_tried": list(self.depth_tried),
                "depth_accepted": list(self.depth_accepted),
                "rank_tried": list(self.rank_tried), "rank_accepted": list(self.rank_accepted),
                "acceptance_by_depth": rates(self.depth_accepted, self.depth_tried),
                "acceptance_by_rank": rates(self.rank_accepted, self.rank_tried)}
