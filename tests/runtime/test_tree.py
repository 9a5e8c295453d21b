"""The draft tree (runtime/round/tree.py): chains, tries of paths, the mask and positions."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime import ConfigError
from ssd_runtime.round.tree import Tree


def test_a_chain_is_the_tree_whose_every_node_has_one_child():
    tree = Tree.chain(7, [3, 4, 5])
    assert len(tree) == 4 and tree.is_chain()
    assert tree.tokens.tolist() == [7, 3, 4, 5] and tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.depth.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(tree.ancestors(), np.tril(np.ones((4, 4), bool)))
    assert tree.positions(10).tolist() == [10, 11, 12, 13]
    assert tree.path(3) == [0, 1, 2, 3] and tree.pending(3) == [3, 4, 5]
    assert Tree.chain(7, []).is_chain() and len(Tree.chain(7, [])) == 1


def test_from_paths_merges_common_prefixes_breadth_first():
    tree = Tree.from_paths(9, [[1, 2, 3], [1, 4], [5, 6], [1, 2, 7]], max_nodes=20)
    # depth 1: 1, 5; depth 2: 1-2, 1-4, 5-6; depth 3: 1-2-3, 1-2-7
    assert tree.tokens.tolist() == [9, 1, 5, 2, 4, 6, 3, 7]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3, 3]
    assert tree.depth.tolist() == [0, 1, 1, 2, 2, 2, 3, 3]
    assert not tree.is_chain()
    assert tree.children(0) == [1, 2] and tree.children(3) == [6, 7] and tree.children(6) == []
    assert tree.path(7) == [0, 1, 3, 7] and tree.pending(7) == [1, 2, 7]
    assert tree.leaves() == [4, 5, 6, 7]
    assert tree.positions(4).tolist() == [4, 5, 5, 6, 6, 6, 7, 7]
    anc = tree.ancestors()
    for i in range(len(tree)):
        assert set(np.flatnonzero(anc[i])) == set(tree.path(i))
    assert all(tree.parents[i] < i for i in range(1, len(tree)))


def test_from_paths_cuts_at_the_budget_root_included():
    paths = [[1, 2, 3], [1, 4], [5, 6]]
    assert Tree.from_paths(9, paths, max_nodes=4).tokens.tolist() == [9, 1, 5, 2]
    assert Tree.from_paths(9, paths, max_nodes=1).tokens.tolist() == [9]
    one = Tree.from_paths(9, [[1, 2, 3]], max_nodes=10)
    assert one.is_chain() and one.tokens.tolist() == [9, 1, 2, 3]
    assert len(Tree.from_paths(9, [], max_nodes=5)) == 1


@pytest.mark.parametrize("tokens, parents, match", [
    ([], [], "at least the root"),
    ([1, 2], [-1], "one parent per token"),
    ([1, 2], [0, 0], "-1 for the root"),
    ([1, 2, 3], [-1, 2, 0], "topological"),
    ([1, -2], [-1, 0], "token ids"),
])
def test_a_malformed_tree_is_refused_by_name(tokens, parents, match):
    with pytest.raises(ConfigError, match=match):
        Tree(tokens, parents)
    with pytest.raises(ConfigError, match="max_nodes"):
        Tree.from_paths(1, [[2]], max_nodes=0)


def test_the_verdicts_judged_nodes_by_depth_and_rank():
    from ssd_runtime.round.loop import Stats
    from ssd_runtime.round.tree import Verdicts

    tree = Tree.from_paths(9, [[1, 2], [3, 4], [5]], max_nodes=10)   # root's children 1, 3, 5
    second = tree.children(0)[1]
    assert [tree.rank(c) for c in tree.children(0)] == [0, 1, 2] and tree.rank(0) == 0
    below = tree.children(second)[0]
    assert tree.tried([second, below]) == [(1, False), (second, True), (below, True)]
    assert tree.tried([]) == [(c, False) for c in tree.children(0)]
    stats = Stats()
    stats.observe_tree(tree, [second, below])
    stats.verdicts.chain(4, 2)                         # a chain: depths 1, 2 pass, 3 fails
    out = stats.as_dict()
    assert stats.tree_rounds == 1 and stats.tree_nodes == len(tree) - 1
    stats.rounds = 2
    assert stats.verdicts.nodes == len(tree) - 1 + 4
    assert stats.nodes_per_round == (len(tree) - 1 + 4) / 2
    assert out["depth_tried"] == [3, 2, 1] and out["depth_accepted"] == [2, 2, 0]
    assert out["acceptance_by_rank"] == [3 / 5, 1.0]
    assert "verdicts" not in out
    total = Verdicts()
    total.merge(stats.verdicts)
    total.merge(stats.verdicts)
    assert total.depth_tried == [6, 4, 2]
