"""A round's draft trees in the loop (docs/design.md §4, "Trees"): the verification's inputs for
a batch whose rows carry trees or chains, and a tree's verdict read as a chain's.

numpy only; loop.py calls these with its rows.
"""
from __future__ import annotations

import numpy as np

from .tree import Tree


def batch_inputs(rows, slots: int, past: np.ndarray):
    """One call over slots 0..slots-1 where some rows verify a tree: (ids (S, W), past, real
    (S,), ancestors (S, W, W) bool, depth (S, W)); a chain's row [last, d1..dk] is the tree of
    its lower triangle, a slot without a row a dummy token past its valid rows (its mask the
    lower triangle: its padding sees nothing of anyone's)."""
    nodes = [(row, row.drafter.tree if row.drafter.tree is not None
              else Tree.chain(row.seq[-1], row.drafts)) for row in rows]
    width = max(len(tree) for _, tree in nodes)
    ids = np.zeros((slots, width), np.int64)
    real = np.zeros(slots, np.int64)
    depth = np.tile(np.arange(width, dtype=np.int64), (slots, 1))        # (S, W)
    ancestors = np.tile(np.tri(width, dtype=np.bool_), (slots, 1, 1))    # (S, W, W)
    for row, tree in nodes:
        n, b = len(tree), row.slot
        ids[b, :n] = tree.tokens
        real[b] = n
        past[b] = row.target_len
        depth[b, :n] = tree.depth
        # padding after a tree: at the next positions, each seeing itself and the root only
        depth[b, n:] = tree.depth.max() + 1 + np.arange(width - n)
        ancestors[b, :n, :n] = tree.ancestors()
        ancestors[b, n:, :n] = False
        ancestors[b, n:, 0] = True
    return ids, past, real, ancestors, depth


def judge(row, tree: Tree, logits: np.ndarray, target):
    """A tree round's verdict (rule.verify_tree) as a chain's: (the drafts as judged, the path's
    tokens then the chosen chain's; j, t; the root's and the path's logits; the chosen chain's
    tokens the path took, nodes 1, 2, ... of lookup_tree, which the schedule learns as of the
    chain alone).

    Only the tree's first path (nodes 1, 2, ... each the child of the one before) has a chain's
    bits: a node off it sees its keys at other rows, its path's chain's logits up to the sums'
    order only (design §2 "Trees"). So where the path leaves it the round ends at the first node
    off it, taken as the round's last token (the target's own choice at a node that has the
    chain's bits), and the rest of the path, with the target's token after it, is the next
    round's first drafts (`Drafter.carried`), judged there by a chain's bits: the output stays
    k = 0's bit for bit (design §4, "Trees"). The path kept is node t at row target_len + t,
    as a chain's: the rows (and a head's features) need no move (design §3)."""
    path, t = row.rule.verify_tree(logits, tree, [None] * (len(tree) - 1), row.target_len + 1)
    row.stats.observe_tree(tree, path)
    row.schedule.observe_tree(tree, path)
    chained = next((i for i, node in enumerate(path) if node != i + 1), len(path))
    row.stats.tree_gained += len(path) - chained
    if chained < len(path):
        row.drafter.carried = [int(x) for x in tree.tokens[path[chained + 1:]]] + [int(t)]
        t = int(tree.tokens[path[chained]])
        path = path[:chained]
    taken = [int(x) for x in tree.tokens[path]]
    drafts = taken + row.drafts[len(taken):] if len(taken) < len(row.drafts) else taken
    return drafts, len(path), t, logits[[0, *path]], chained
