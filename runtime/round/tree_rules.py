"""The target's verdict over a draft tree (docs/design.md §5), shared by the host rules
(acceptance.py) and the rules on the bundle's heads (heads.py): a walk along the target's own
choice (greedy, invariant sampling) and recursive rejection over a node's children (sampling).
A chain is the tree whose every node has one child: both reduce to the chain's rules exactly.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .sampling import sample
from .tree import Tree


def walk(tree: Tree, choose: Callable[[int], int]) -> tuple[list[int], int]:
    """From the root, follow the child whose token is the target's choice at the node
    (`choose(node)`: the target's token after it); stop where no child has it. Returns (the
    accepted nodes after the root, the target's token after the last): the target alone's
    tokens, since each is its choice in the context of the path before it."""
    path, node = [], 0
    while True:
        token = choose(node)
        child = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
        if child is None:
            return path, token
        path.append(child)
        node = child


def node_probs(tree: Tree, draft_probs: list) -> list:
    """The draft's distribution per node (index: node; the root's None) from `draft_probs`:
    one per draft node in node order, as a chain's (a list as long as the tree, root first,
    is taken as it is)."""
    if len(draft_probs) == len(tree):
        return list(draft_probs)
    if len(draft_probs) != len(tree) - 1:
        raise ValueError(f"draft_probs has {len(draft_probs)} entries for a tree of "
                         f"{len(tree)} nodes: give one per draft node (node 1 on).")
    return [None, *draft_probs]


def reject(tree: Tree, distribution: Callable[[int], np.ndarray], draft_probs: list,
           accept_u: np.ndarray, final_u: float) -> tuple[list[int], int]:
    """Recursive rejection sampling over the tree (SpecInfer's multi-step speculative sampling;
    without replacement as in Jeon et al. 2024), exact for the target's distribution.

    At node u with the target's processed distribution p (`distribution(u)`), its children
    c_1..c_m are tried in order, c_i with the uniform accept_u[c_i - 1]; r_i is the law c_i was
    drawn from given the siblings before it:
    - q None (a deterministic top-m candidate, a lookup token): a point mass at x = c_i; accept
      with probability p(x), else p := p with x zeroed, renormalised;
    - q given (sampled from the draft's q at u without replacement): r_i = q with the earlier
      siblings zeroed, renormalised; accept with probability min(1, p(x) / r_i(x)), else
      p := normalise(max(0, p - r_i)).
    Accepted: go down to c_i. None accepted (or a leaf reached): the token is a sample of the
    last p with final_u. Each step leaves the law of what it emits equal to the p it started
    from (P(accept x) = min(p, r_i)(x), P(reject) * residual = max(0, p - r_i)), so the tokens
    are the target's; on a chain it is Leviathan et al.'s rule from the same uniforms."""
    probs = node_probs(tree, draft_probs)
    path, node = [], 0
    while True:
        p = distribution(node)                          # (vocab,) the target's, processed
        tried: list[int] = []                           # earlier siblings' tokens
        moved = False
        for c in tree.children(node):
            if tried:                                   # a residual from the last rejection
                p = p / p.sum()
            x, q = int(tree.tokens[c]), probs[c]
            u = accept_u[c - 1]
            if q is None:                               # a point mass at x
                if x < len(p) and u < p[x]:             # u < p(x) / 1
                    moved = True
                    break
                residual = p.copy()                     # max(0, p - q): p without x
                if x < len(p):
                    residual[x] = 0.0
                if residual.sum() > 0:                  # else p was a point mass at x
                    p = residual
            else:
                r = fit(q, len(p))
                if tried:                               # drawn without the earlier siblings
                    r = r.copy()
                    r[[t for t in tried if t < len(r)]] = 0.0
                    r = r / r.sum() if r.sum() > 0 else r
                if x < len(p) and u * r[x] < p[x]:      # u < p(x) / r(x), without dividing
                    moved = True
                    break
                residual = np.maximum(p - r, 0.0)       # normalise(max(0, p - r))
                if residual.sum() > 0:                  # p == r: rejection has probability 0
                    p = residual
            tried.append(x)
        if not moved:
            return path, sample(p, final_u)
        path.append(c)
        node = c


def fit(q: np.ndarray, n: int) -> np.ndarray:
    """The draft's distribution on the target's vocabulary (ids beyond the draft's have q=0)."""
    if len(q) == n:
        return q
    return q[:n] if len(q) > n else np.pad(q, (0, n - len(q)))
