"""What the draft-tree tests of every target flavour share (runtime/test_tree_verify.py: ort and
static; runtime/test_tree_standard.py: standard): a prompt, the checks of a tree call against
chain calls on one target session, and requests whose lookup offers a tree."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from ssd_runtime.errors import BackendError
from ssd_runtime.round.tree import Tree
from ssd_runtime.scheduler.cost import CostModel
from ssd_runtime.scheduler.learning import Acceptance
from ssd_runtime.scheduler.tree_plan import DEPTHS, RANKS, TreeAcceptance

PROMPT = [3, 17, 44, 9, 120, 7, 7, 31, 250, 12, 5, 88]


def assert_nodes_see_their_paths(target) -> None:
    """A tree call gives each node the logits of its path run as a chain: the same keys,
    rows of other branches between them adding exact zeros, so equal up to the sums' order,
    and the same argmax."""
    prompt = np.asarray(PROMPT, np.int64)
    past = len(prompt)
    tree = Tree.from_paths(5, [[7, 8, 9], [7, 10], [11, 12, 13], [14]], max_nodes=9)
    assert len(tree) == 9 and not tree.is_chain()
    target.prefill(prompt)
    got = target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, past).copy()
    for leaf in tree.leaves():
        path = tree.path(leaf)
        target.prefill(prompt)
        chain = target.forward(tree.tokens[path], past).copy()
        np.testing.assert_allclose(got[path], chain, atol=2e-5, rtol=0)
        assert np.array_equal(got[path].argmax(-1), chain.argmax(-1))


def assert_a_chain_through_the_tree_input_is_the_chain(target) -> None:
    """A chain's tree call gives the chain call bit for bit, and chain calls after it bind
    their own mask again: the same bits as before it."""
    prompt, drafts = np.asarray(PROMPT, np.int64), [5, 6, 7, 8]
    target.prefill(prompt)
    one = target.forward(np.asarray(drafts[:1]), len(prompt)).copy()
    chain = target.forward(np.asarray(drafts), len(prompt)).copy()
    tree = Tree.chain(drafts[0], drafts[1:])
    got = target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, len(prompt)).copy()
    assert np.array_equal(got, chain)
    assert np.array_equal(target.forward(np.asarray(drafts[:1]), len(prompt)), one)
    assert np.array_equal(target.forward(np.asarray(drafts), len(prompt)), chain)


def assert_the_first_paths_rows_are_a_chains(tree_side, chain_side, rows_axis: int) -> None:
    """A tree's first path (nodes 1, 2, ... as a chain's rows; the other branches' rows after
    it) leaves in the caches what a chain of that path writes, bit for bit (their rows on
    `rows_axis` after the slot's), and the next call reads them as the chain's next call
    does: the loop keeps that path and no other (tree_round.judge), with no row moved."""
    prompt = np.asarray(PROMPT, np.int64)
    past = len(prompt)
    tree = Tree.from_paths(5, [[7, 8], [11, 12]], max_nodes=5, whole_first=True)
    path = tree.path(2)
    assert path == [0, 1, 2] and tree.tokens.tolist() == [5, 7, 8, 11, 12]
    tree_side.prefill(prompt)
    tree_side.forward_tree(tree.tokens, tree.ancestors(), tree.depth, past)
    chain_side.prefill(prompt)
    chain_side.forward(tree.tokens[path], past)
    rows = (0, *[slice(None)] * (rows_axis - 1), slice(0, past + 3))
    for layer in range(len(tree_side.keys)):
        for a, b in ((tree_side.keys, chain_side.keys), (tree_side.values, chain_side.values)):
            assert np.array_equal(a[layer][rows], b[layer][rows])
    nxt = np.asarray([40, 41, 42], np.int64)
    assert np.array_equal(tree_side.forward(nxt, past + 3), chain_side.forward(nxt, past + 3))


def assert_a_tree_past_the_width_is_refused(target) -> None:
    n = target.max_new_len + 1
    tree = Tree.from_paths(1, [[2 + i] for i in range(n - 1)], max_nodes=n)
    target.prefill(np.asarray(PROMPT, np.int64))
    with pytest.raises(BackendError, match=rf"a draft tree of {n} nodes exceeds the "
                                           rf"{target.max_new_len} tokens.*--max-draft"):
        target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, len(PROMPT))


def prediction_trials(gen, trials: int) -> Iterator[tuple[list[int], list[int]]]:
    """Prompts whose last 3-gram occurred once before, followed by other tokens than the
    target writes, and the target's own answer as the request's prediction: the sequence's
    lookup (the longer match) wins the chain, the prediction's start is the other path."""
    rng = np.random.default_rng(1)
    for _ in range(trials):
        abc = [int(x) for x in rng.integers(5, 300, 3)]
        prompt = [int(x) for x in rng.integers(5, 300, 5)] + abc + \
            [int(x) for x in rng.integers(5, 300, 8)] + [7] + abc
        yield prompt, gen.generate(prompt, max_new_tokens=24, k=0, ignore_eos=True).token_ids


def known(by_rank: list[float]) -> TreeAcceptance:
    """Acceptance by rank at every depth, seen so often that a run cannot move it."""
    acc = TreeAcceptance()
    for d in range(DEPTHS):
        for r in range(RANKS):
            acc.tried[d][r] = 1e9
            acc.hits[d][r] = 1e9 * by_rank[min(r, len(by_rank) - 1)]
    return acc


def assert_auto_drafts_the_trees_it_prices(gen, prompts, sampling: dict, monkeypatch) -> None:
    """k="auto" (design §6 "Trees"): the schedule plans a tree from the acceptance learnt by
    depth and rank and the calibrated costs (here a cheap draft and a flat verification). A
    draft whose first guess seldom passes but whose second and third often do drafts trees,
    and the output is the target's alone (greedy; seeded sampling); where later guesses
    never pass, the same plan drafts chains only."""
    knowledge = gen.knowledge
    kind = "invariant" if sampling else "greedy"        # a seed: the target alone's tokens
    flat = CostModel(1.0, 0.05, tuple(1.0 + 0.01 * k for k in range(gen.manifest.max_draft + 1)))
    assert knowledge.draft_trees
    monkeypatch.setattr(knowledge, "cost", flat)
    for later, trees in ((0.6, True), (0.0, False)):
        monkeypatch.setattr(knowledge, "times", {})
        monkeypatch.setattr(knowledge, "learnt", {kind: Acceptance.starting_at(0.15)})
        monkeypatch.setattr(knowledge, "trees", {kind: known([0.15, later])})
        for prompt in prompts:
            alone = gen.generate(prompt, max_new_tokens=20, k=0, **sampling).token_ids
            res = gen.generate(prompt, max_new_tokens=20, k="auto", draft_source="model",
                               **sampling)
            assert res.token_ids == alone
            assert (res.stats.tree_rounds > 0) == trees, (later, res.stats.tree_rounds)


def assert_a_batch_drafts_the_trees_it_prices(gen, prompts, sampling: dict, monkeypatch,
                                              max_new_tokens: int = 20, **settings) -> list:
    """k="auto" over a batch (design §6 "Trees"): the planner prices every row's tree in the
    batch's one call (tree_plan.plan_batch_for; here a cheap draft and a flat verification of
    any width), and where the first guess seldom passes but the second often does, each row
    grows its tree along its chain in the batch's draft steps (tree_draft.ChainTree); every
    prompt's output is the target's alone (greedy; seeded sampling). Where later guesses never
    pass, the same batch drafts no tree. (The guard, which judges drafting by the rounds' own
    times, is left out: the prices are the test's.) `settings`: every request's besides (a
    response_format); returns the tree batch's results."""
    from ssd_runtime.scheduler.batch_cost import BatchCost, Realized

    knowledge = gen.knowledge
    kind = "invariant" if sampling else "greedy"
    flat = ((1, 1e-3), (17, 1.01e-3))
    one = CostModel(1.0, 0.05, tuple(1.0 + 0.01 * k for k in range(gen.manifest.max_draft + 1)))
    assert knowledge.draft_trees and gen.max_batch >= len(prompts)
    monkeypatch.setattr(Realized, "decide", lambda self, k: k)
    monkeypatch.setattr(knowledge, "cost", one)          # (a row left alone plans its own)
    alone = [gen.generate(p, max_new_tokens=max_new_tokens, k=0, **sampling,
                          **settings).token_ids for p in prompts]
    found = []
    for later, trees in ((0.6, True), (0.0, False)):
        monkeypatch.setattr(knowledge, "times", {})
        monkeypatch.setattr(knowledge, "batch_costs",
                            {r: BatchCost(r, 1e-5, flat) for r in range(1, 9)})
        monkeypatch.setattr(knowledge, "live_costs", {})
        monkeypatch.setattr(knowledge, "draft_prefill", 0.0)
        monkeypatch.setattr(knowledge, "learnt", {kind: Acceptance.starting_at(0.15)})
        monkeypatch.setattr(knowledge, "trees", {kind: known([0.15, later])})
        results = gen.generate_batch(prompts, max_new_tokens=max_new_tokens, k="auto",
                                     draft_source="model", **sampling, **settings)
        assert [r.token_ids for r in results] == alone, later
        rounds = [r.stats.tree_rounds for r in results]
        assert all(rounds) if trees else not any(rounds), (later, rounds)
        found = found or results
    return found
