"""A tree's shape from the cost model (scheduler/tree_plan.py): acceptance learnt per depth
and rank, the best nodes of a budget, the plan's choice (k = 0, a chain, a tree) and a
batch's, checked against simulated rounds of the acceptance process they model."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime.round.tree import Tree
from ssd_runtime.scheduler.cost import CostModel
from ssd_runtime.scheduler.tree_plan import (DEPTHS, RANKS, TreeAcceptance, best_nodes,
                                             plan_batch, plan_batch_for, plan_for, plan_tree,
                                             verify_steps)

# v(N) of the float32 SmolLM2-135M (issue 56: 1.01, 1.17, 1.24, 1.31, 1.64, 2.64 at N = 2, 4,
# 8, 12, 16, 32), interpolated: a weight-bound call that turns compute-bound past ~12 rows
FLAT = {1: 1.0, 2: 1.01, 4: 1.17, 8: 1.24, 12: 1.31, 16: 1.64, 32: 2.64}


def v_of(points: dict[int, float]):
    xs = sorted(points)
    return lambda n: float(np.interp(n, xs, [points[x] for x in xs]))


def learnt(table: list[list[float]], weight: float = 1e9) -> TreeAcceptance:
    """An acceptance that has seen `weight` tries of each cell at the rates of `table`
    (rows: depth 1.., columns: rank 0..; missing cells repeat the row's last)."""
    acc = TreeAcceptance()
    for d in range(DEPTHS):
        row = table[min(d, len(table) - 1)]
        for r in range(RANKS):
            acc.tried[d][r] = weight
            acc.hits[d][r] = weight * row[min(r, len(row) - 1)]
    return acc


def test_best_nodes_are_a_tree_in_order_of_their_chance():
    acc = learnt([[0.5, 0.4, 0.2]])
    nodes = best_nodes(acc, 20, 4, 3)
    assert nodes[0] == (pytest.approx(0.5), 1, 0, -1)
    assert nodes[1][0] == pytest.approx(0.5 * 0.5) and nodes[1][1] == 2      # its child (0.25)
    assert any(p == pytest.approx(0.5 * 0.4) and d == 1 and r == 1 for p, d, r, _ in nodes)
    for i, (p, d, r, parent) in enumerate(nodes):
        assert parent < i
        if parent >= 0:
            assert nodes[parent][1] == d - 1 and p <= nodes[parent][0] + 1e-12
        if r:                                      # its earlier siblings come first
            assert any(n[3] == parent and n[2] == r - 1 for n in nodes[:i])


def simulated_accepted(acc: TreeAcceptance, nodes, rounds: int, rng) -> float:
    """Mean accepted per round when each node's candidates are tried in rank order and the
    rank-r one at depth d passes with a[d][r] (the process the plan's E models)."""
    children: dict[int, list[int]] = {}
    for i, (_, _, r, parent) in enumerate(nodes):
        children.setdefault(parent, []).append(i)
    total = 0
    for _ in range(rounds):
        node, depth = -1, 0
        while True:
            kids = sorted(children.get(node, []), key=lambda i: nodes[i][2])
            nxt = next((c for c in kids if rng.random() < acc.rate(depth + 1, nodes[c][2])),
                       None)
            if nxt is None:
                break
            total, node, depth = total + 1, nxt, depth + 1
    return total / rounds


@pytest.mark.parametrize("table", [[[0.5, 0.4, 0.2]], [[0.8, 0.3], [0.6, 0.2]], [[0.2, 0.2]]])
def test_the_plans_expected_tokens_are_what_rounds_give(table):
    acc = learnt(table)
    plan = plan_tree(acc, v_of(FLAT), 0.1, 0.05, 16)
    nodes = best_nodes(acc, plan.nodes - 1, plan.depth, plan.width)
    assert sum(p for p, *_ in nodes) == pytest.approx(plan.expected)
    got = simulated_accepted(acc, nodes, 20000, np.random.default_rng(0))
    assert got == pytest.approx(plan.expected, abs=0.04)


def test_k0_where_nothing_pays_a_chain_where_later_ranks_never_pass_a_tree_where_they_do():
    v = v_of(FLAT)
    assert plan_tree(learnt([[0.05, 0.02]]), v, 0.3, 0.3, 16).nodes == 1
    chain = plan_tree(learnt([[0.7, 0.0]]), v, 0.1, 0.05, 16)
    assert chain.is_chain and chain.nodes > 2
    tree = plan_tree(learnt([[0.4, 0.35, 0.3]]), v, 0.1, 0.05, 16)
    assert not tree.is_chain and tree.speedup > plan_tree(
        learnt([[0.4, 0.35, 0.3]]), v, 0.1, 0.05, 16, max_width=1).speedup


def test_a_steeper_verification_buys_a_smaller_tree():
    acc = learnt([[0.5, 0.35, 0.25]])
    flat = plan_tree(acc, v_of(FLAT), 0.1, 0.05, 32)
    steep = plan_tree(acc, lambda n: 1.0 + 0.12 * (n - 1), 0.1, 0.05, 32)  # compute-bound
    assert steep.nodes < flat.nodes and steep.speedup < flat.speedup


def test_acceptance_is_learnt_per_depth_and_rank_from_verdicts():
    acc = TreeAcceptance(alpha=0.5)
    tree = Tree.from_paths(0, [[1, 5], [2, 6], [3]], max_nodes=10)   # root: ranks 1, 2, 3
    second = [int(c) for c in tree.children(0)][1]                    # the rank-1 child
    grandchild = tree.children(second)[0]
    for _ in range(400):                          # rank 1 passes at depth 1, then its child
        acc.observe(tree, [second, grandchild])
    assert acc.rate(1, 0) < 0.05 and acc.rate(1, 1) > 0.9 and acc.rate(2, 0) > 0.9
    assert acc.rate(1, 2) == pytest.approx(0.5 / 3)                  # never tried: the prior
    for _ in range(400):                          # nothing passes: every root child tried
        acc.observe(tree, [])
    assert acc.rate(1, 1) < 0.05 and acc.rate(1, 2) < 0.05
    assert len(acc.as_dict()["by_depth_rank"]) == DEPTHS


def test_a_chains_verdict_teaches_the_first_guesses_as_the_same_tree_would():
    """observe_chain (a chain round under a plan that also prices trees) counts what
    observe counts for the chain as a tree: rank 0 only, up to the first rejection."""
    as_chain, as_tree = TreeAcceptance(alpha=0.4), TreeAcceptance(alpha=0.4)
    for drafted, accepted in [(4, 2), (3, 3), (5, 0), (2, 1)] * 20:
        as_chain.observe_chain(drafted, accepted)
        as_tree.observe(Tree.chain(0, list(range(1, drafted + 1))), list(range(1, accepted + 1)))
    np.testing.assert_allclose(as_chain.tried, as_tree.tried)
    np.testing.assert_allclose(as_chain.hits, as_tree.hits)
    assert as_chain.rate(1, 1) == pytest.approx(0.4 / 2)            # later ranks untouched


def test_a_batch_prices_its_call_of_every_rows_tree():
    good, poor = learnt([[0.6, 0.3]]), learnt([[0.03, 0.01]])
    width, plans = plan_batch([good, good], lambda w: 1.0 + 0.02 * (w - 1), 0.1, 0.05, 16)
    assert width > 2 and all(p.nodes <= width for p in plans)
    assert plan_batch([poor, poor], lambda w: 1.0 + 0.3 * (w - 1), 0.3, 0.3, 16)[0] == 1
    # one call of 4 rows costs more a node than one of 1: the batch's trees are smaller
    alone, _ = plan_batch([good], lambda w: 1.0 + 0.02 * (w - 1), 0.1, 0.05, 16)
    four, _ = plan_batch([good] * 4, lambda w: 1.0 + 0.15 * (w - 1), 0.1, 0.05, 16)
    assert four < alone


def test_verify_steps_reads_the_calibration_and_goes_on_past_it():
    cost = CostModel(target_step=0.01, draft_step=0.001, verify=(0.01, 0.0102, 0.011, 0.013))
    v = verify_steps(cost)
    assert v(1) == 1.0 and v(3) == pytest.approx(1.1) and v(4) == pytest.approx(1.3)
    assert v(6) == pytest.approx(1.3 + 2 * 0.2)


def test_v_of_n_is_timed_on_the_real_target(small_vocab_bundle):
    from ssd_runtime import ConfigError, Generator
    from ssd_runtime.scheduler.calibration import calibrate_rows
    from ssd_runtime.scheduler.tree_plan import verify_from_times

    gen = Generator.load(small_vocab_bundle[0])
    times = calibrate_rows(gen.target, [1, 2, 4], past_len=16, repeats=3)
    assert sorted(times) == [1, 2, 4] and times[1] <= times[2] <= times[4]
    v = verify_from_times(times)
    assert v(1) == 1.0 and v(3) == pytest.approx((times[2] + times[4]) / 2 / times[1])
    with pytest.raises(ConfigError, match="rows"):
        calibrate_rows(gen.target, [1, gen.target.max_new_len + 1])


def test_a_draft_without_a_tree_graph_pays_a_call_per_expanded_node():
    acc = learnt([[0.6, 0.4, 0.3]])
    v = v_of(FLAT)
    levels = plan_tree(acc, v, 0.3, 0.3, 16)
    nodes = plan_tree(acc, v, 0.3, 0.3, 16, draft_calls="nodes")
    assert nodes.speedup < levels.speedup
    # its plan's cost is what it says: c1 + (expanded - 1) c + v(N), and a round of its own
    # for the paths that leave the first one (carried: C v(2))
    chosen = best_nodes(acc, nodes.nodes - 1, nodes.depth, nodes.width)
    expanded = len({parent for *_, parent in chosen})
    carry = carried(chosen)
    assert 0 < carry < 1
    cost = 0.3 + (expanded - 1) * 0.3 + v(nodes.nodes) + carry * v(2)
    assert nodes.speedup == pytest.approx((1 + nodes.expected + carry) / cost)


def carried(nodes) -> float:
    """P(the target's path leaves the first path): the nodes of rank > 0 under it."""
    first: list[bool] = []
    out = 0.0
    for p, _, r, parent in nodes:
        under = parent < 0 or first[parent]
        first.append(r == 0 and under)
        out += p if r and under else 0.0
    return out


def test_a_path_off_the_first_one_pays_a_round_of_its_own():
    """Where the value lies off the first path (a weak first guess, a strong second), the
    round keeps the first path and the rest comes in a round of its own (design §4, "Trees"):
    the plan prices that round, so such a tree is worth less than if it came at once, and
    more than a chain."""
    acc = learnt([[0.2, 0.7]])
    v = v_of(FLAT)
    plan = plan_tree(acc, v, 0.05, 0.05, 12)
    assert not plan.is_chain
    chain = plan_tree(acc, v, 0.05, 0.05, 12, max_width=1)
    assert chain.speedup < plan.speedup
    at_once = (1 + plan.expected) / (0.05 + (plan.depth - 1) * 0.05 + v(plan.nodes))
    assert plan.speedup < at_once


def test_plan_for_reads_a_generators_calibration():
    cost = CostModel(target_step=0.01, draft_step=0.001, verify=tuple(
        0.01 * (1 + 0.02 * k) for k in range(9)), draft_first=0.002)
    acc = learnt([[0.5, 0.4, 0.3]])
    assert plan_for(acc, cost, 9) == plan_tree(acc, verify_steps(cost), 0.2, 0.1, 9)


def test_a_batch_plan_from_its_calls_prices():
    from ssd_runtime.scheduler.batch_cost import BatchCost, LiveCost

    cheap = BatchCost(rows=4, draft_step=0.002, verify=((1, 0.010), (2, 0.0102), (5, 0.0106),
                                                       (9, 0.011), (17, 0.020)))
    dear = BatchCost(rows=4, draft_step=0.002, verify=((1, 0.010), (2, 0.016), (5, 0.030),
                                                      (9, 0.050), (17, 0.090)))
    accs = [learnt([[0.6, 0.4]])] * 4
    wide, plans = plan_batch_for(accs, cheap, 16)
    assert wide > 4 and len(plans) == 4
    assert plan_batch_for(accs, LiveCost(dear), 16)[0] < wide
    w, _ = plan_batch_for(accs, cheap, 16)
    assert w == plan_batch(accs, lambda n: cheap.verify_time(n) / 0.010, 0.2, 0.2, 16)[0]


def test_a_batch_rows_tree_has_children_under_its_first_guesses_only():
    """A batch's row grows its tree along its chain (tree_draft.ChainTree): its plan's nodes
    (best_nodes, first_path) have children only under rank-0 nodes whose ancestors are rank 0,
    even where a later rank is likelier than the first (a weak first guess); without the
    restriction the same acceptance would expand that rank."""
    acc = learnt([[0.15, 0.6]])
    free = best_nodes(acc, 12, 4, 3)
    chained = best_nodes(acc, 12, 4, 3, first_path=True)
    assert any(free[parent][2] > 0 for *_, parent in free if parent >= 0)
    assert all(chained[parent][2] == 0 for *_, parent in chained if parent >= 0)
    first = {-1}
    for i, (_, _, r, parent) in enumerate(chained):
        if r == 0 and parent in first:
            first.add(i)
    assert all(parent in first for *_, parent in chained)
    assert sum(p for p, *_ in chained) < sum(p for p, *_ in free)   # the shape's price
