"""Drafting a tree (round/tree_draft.py): the expansion by path probability under a budget,
the rules' candidates, and the drafted tree verified exactly (the target's law, k = 0's
greedy tokens), on the context tables of test_tree_accept and on a real tiny pair's sessions
(the draft by one chain call per branch, the target's rows by one chain call per leaf)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from ssd_runtime import ConfigError, Generator
from ssd_runtime.round.acceptance import GreedyAcceptance, InvariantSampling, SamplingAcceptance
from ssd_runtime.round.sampling import SamplingParams
from ssd_runtime.round.tree import Tree
from ssd_runtime.round.tree_draft import TreeShape, branch_step, expand, softmax
from test_tree_accept import PROMPT, V, chi_square_p, exact_joint, rows, target_logits


def draft_logits(context: tuple[int, ...]) -> np.ndarray:
    """An adversarial draft: its likeliest tokens are the target's least likely."""
    return (-1.2 * target_logits(context) + np.random.default_rng(
        [3, *context]).normal(0, 0.5, V)).astype(np.float32)


def table_step(context: tuple[int, ...]):
    """A `step` reading the draft's table: node u's row follows the context and its path."""
    def step(tree: Tree, nodes: list[int]) -> np.ndarray:
        return np.stack([draft_logits(context + tuple(tree.pending(u))) for u in nodes])
    return step


def test_a_width_one_shape_drafts_the_chain():
    rule = GreedyAcceptance()
    drafted = expand(3, table_step(PROMPT), TreeShape(5, 1, 4, 1), rule.draft_candidates, 2)
    chain, context = [], PROMPT
    for _ in range(4):
        chain.append(int(np.argmax(draft_logits(context))))
        context += (chain[-1],)
    assert drafted.tree.is_chain() and drafted.tree.tokens.tolist() == [3, *chain]
    assert drafted.probs == [None] * 4


@pytest.mark.parametrize("nodes,width,depth,beam", [(8, 3, 3, 2), (12, 4, 4, 3), (4, 2, 5, 1)])
def test_the_kept_nodes_are_the_budgets_best_paths(nodes, width, depth, beam):
    shape = TreeShape(nodes, width, depth, beam)
    drafted = expand(3, table_step(PROMPT), shape, GreedyAcceptance().draft_candidates, 2)
    tree, values = drafted.tree, drafted.values
    assert len(tree) <= nodes and all(tree.parents[i] < i for i in range(1, len(tree)))
    assert tree.depth.max() <= depth
    for i in range(1, len(tree)):                   # each value is its path's product of q
        path = tree.pending(i)
        q = [softmax(draft_logits(PROMPT + tuple(path[:d])))[path[d]] for d in range(len(path))]
        assert values[i] == pytest.approx(np.prod(q))
        kids = [int(tree.tokens[c]) for c in tree.children(tree.parents[i])]
        top = np.argsort(-softmax(draft_logits(PROMPT + tuple(path[:-1]))), kind="stable")
        assert set(kids) <= set(top[:width].tolist())     # a node's own top-m
        assert kids == sorted(kids, key=lambda t: -softmax(draft_logits(
            PROMPT + tuple(path[:-1])))[t])               # siblings best first (ranks)
    # the first path, down each node's best candidate, is nodes 1, 2, ... (a chain's rows)
    first = [i for i in range(1, len(tree)) if all(
        tree.rank(u) == 0 for u in [*tree.path(i)][1:])]
    assert first == list(range(1, len(first) + 1)) and len(first) == tree.depth.max()
    # every path of the full expansion (width-m per level, beam nodes expanded) that the
    # budget left out is worth no more than the least kept node
    full = expand(3, table_step(PROMPT), TreeShape(10_000, width, depth, beam),
                  GreedyAcceptance().draft_candidates, 2)
    if len(full.tree) > nodes:
        assert len(tree) == nodes
        kept = {tuple(tree.pending(i)) for i in range(1, len(tree))}
        dropped = [full.values[i] for i in range(1, len(full.tree))
                   if tuple(full.tree.pending(i)) not in kept]
        assert max(dropped) <= min(values[1:]) + 1e-12


def test_sampled_candidates_keep_whole_groups_within_the_budget_and_are_seeded():
    params = SamplingParams(temperature=1.0, seed=3, coupling="rejection")
    shape = TreeShape(9, 3, 3, 2)
    runs = [expand(3, table_step(PROMPT), shape, SamplingAcceptance(params).draft_candidates,
                   2, sampled=True) for _ in range(2)]
    tree = runs[0].tree
    assert runs[0].tree.tokens.tolist() == runs[1].tree.tokens.tolist()
    assert len(tree) <= 9 and all(q is not None for q in runs[0].probs)
    for node in range(len(tree)):
        kids = [int(tree.tokens[c]) for c in tree.children(node)]
        assert len(kids) == len(set(kids))          # without replacement
    other = expand(3, table_step(PROMPT), shape, SamplingAcceptance(
        SamplingParams(temperature=1.0, seed=4, coupling="rejection")).draft_candidates, 2,
        sampled=True)
    assert other.tree.tokens.tolist() != tree.tokens.tolist()


def test_a_bad_shape_is_refused_by_name():
    with pytest.raises(ConfigError, match="width"):
        TreeShape(8, 0, 2, 1)
    with pytest.raises(ConfigError, match="nodes"):
        TreeShape(True)


def run_trees(make_rule, shape, sampled, trials, context=PROMPT) -> list[tuple[int, int]]:
    """The first two tokens of `trials` generations (seeds 0, 1, ...: a seed fixes the draft's
    noise as well as the verifier's), each round a drafted tree."""
    out = []
    for seed in range(trials):
        rule = make_rule(seed)
        seq = list(context)
        while len(seq) < len(context) + 2:
            drafted = expand(seq[-1], table_step(tuple(seq)), shape, rule.draft_candidates,
                             len(seq), sampled)
            tree = drafted.tree
            path, t = rule.verify_tree(rows(tree, tuple(seq)), tree, drafted.probs, len(seq))
            new = [*tree.pending(path[-1]), t] if path else [t]
            seq += new
            rule.commit(new)
        out.append((seq[len(context)], seq[len(context) + 1]))
    return out


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "top-m"])
def test_drafted_trees_verified_give_the_targets_law(sampled):
    params = SamplingParams(temperature=1.0, coupling="rejection")
    samples = run_trees(lambda seed: SamplingAcceptance(SamplingParams(
        temperature=1.0, seed=seed, coupling="rejection")), TreeShape(8, 3, 2, 2), sampled, 4000)
    p = chi_square_p(samples, exact_joint(params, False))
    assert p > 1e-3, f"drafted trees do not give the target's law (chi-square p={p:.2g})"


def test_drafted_trees_under_the_invariant_coupling_give_the_seeds_tokens():
    params = SamplingParams(temperature=1.0, seed=8, coupling="invariant")
    seq = list(PROMPT)
    alone_rule = InvariantSampling(params, None, V)
    for _ in range(30):
        seq.append(alone_rule.verify(target_logits(tuple(seq))[None], [], [], len(seq))[1])
    rule, got, accepted = InvariantSampling(params, None, V), list(PROMPT), 0
    while len(got) < len(seq):
        drafted = expand(got[-1], table_step(tuple(got)), TreeShape(10, 3, 3, 2),
                         rule.draft_candidates, len(got))
        path, t = rule.verify_tree(rows(drafted.tree, tuple(got)), drafted.tree,
                                   drafted.probs, len(got))
        got += [*drafted.tree.pending(path[-1]), t] if path else [t]
        accepted += len(path)
    assert got[:len(seq)] == seq and accepted > 0


# ---- a real pair: the runtime's sessions on the 16-token tiny models ----

@pytest.fixture(scope="module")
def small(small_vocab_bundle):
    bundle, target_dir = small_vocab_bundle
    return Generator.load(bundle), target_dir


def target_rows(target, seq: list[int], tree: Tree) -> np.ndarray:
    """The target's rows (N, V) for a tree, one chain call per leaf at the committed length
    (what the tree-mask call computes in one: each node attends the prefix and its path)."""
    found = {}
    for leaf in tree.leaves():
        path = tree.path(leaf)
        logits = np.asarray(target.forward(np.asarray(
            [seq[-1], *tree.pending(leaf)], np.int64), len(seq) - 1))
        for row, node in enumerate(path):
            found.setdefault(node, logits[row].copy())
    return np.stack([found[i] for i in range(len(tree))])                 # (N, V)


def real_round(gen, rule, seq, shape, sampled=False):
    """One round on the real sessions: prefill both models, draft a tree per branch, verify
    it on the target's rows; returns the emitted tokens and the tree."""
    target, draft = gen.target, gen.draft
    target.prefill(np.asarray(seq[:-1], np.int64), 0)
    draft.prefill(np.asarray(seq[:-1], np.int64), 0)
    drafted = expand(seq[-1], branch_step(draft, seq, len(seq) - 1), shape,
                     rule.draft_candidates, len(seq), sampled)
    path, t = rule.verify_tree(target_rows(target, seq, drafted.tree), drafted.tree,
                               drafted.probs, len(seq))
    return [*drafted.tree.pending(path[-1]), t] if path else [t], path


def test_real_pair_greedy_trees_give_the_tokens_of_k0(small):
    gen, _ = small
    prompt = [0, 5, 6, 7]
    alone = gen.generate(prompt, max_new_tokens=12, k=0).token_ids
    rule, seq, accepted = GreedyAcceptance(), list(prompt), 0
    for shape in itertools.islice(itertools.cycle([TreeShape(8, 3, 3, 2),
                                                   TreeShape(6, 2, 4, 1)]), 100):
        if len(seq) >= len(prompt) + len(alone):
            break
        new, path = real_round(gen, rule, seq, shape)
        seq += new
        accepted += len(path)
    assert seq[len(prompt):][:len(alone)] == alone[:len(seq) - len(prompt)]
    assert len(seq) - len(prompt) >= len(alone)
    assert accepted > 0


def test_real_pair_sampled_trees_follow_the_target(small):
    from test_sampling import chi_square_p as joint_p, exact_joint as hf_joint, first_two
    gen, target_dir = small
    setting = dict(temperature=1.0)
    prompt, samples = [0, 5, 6, 7], []
    for seed in range(1500):
        rule = SamplingAcceptance(SamplingParams(seed=seed, coupling="rejection", **setting))
        seq = list(prompt)
        while len(seq) < len(prompt) + 2:
            seq += real_round(gen, rule, seq, TreeShape(7, 3, 2, 2), sampled=True)[0]
            if seq[len(prompt)] == 1:                  # EOS first
                break
        samples.append(first_two(seq[len(prompt):]))
    p = joint_p(samples, hf_joint(target_dir, setting))
    assert p > 1e-3, f"real drafted trees do not follow the target (chi-square p={p:.2g})"


# ---- a draft graph that takes a tree: the tree bundle's ort target stands in as its own draft

def test_tree_step_drafts_what_branch_step_does_and_rounds_give_k0(bundle_factory):
    from ssd_runtime.round.tree_draft import tree_step

    gen = Generator.load(bundle_factory("llama", "llama_cut"), backend="cpu", threads=1)
    target = gen.target
    assert target.takes_trees
    prompt = [3, 17, 44, 9, 120, 7, 7, 31, 250, 12, 5, 88]
    alone = gen.generate(prompt, max_new_tokens=16, k=0).token_ids
    rule, seq, accepted, rounds = GreedyAcceptance(), list(prompt), 0, 0
    shape = TreeShape(8, 3, 3, 2)
    while len(seq) - len(prompt) < len(alone):
        target.prefill(np.asarray(seq[:-1], np.int64), 0)
        by_tree = expand(seq[-1], tree_step(target, seq, len(seq) - 1), shape,
                         rule.draft_candidates, len(seq))
        by_branch = expand(seq[-1], branch_step(target, seq, len(seq) - 1), shape,
                           rule.draft_candidates, len(seq))
        tree = by_tree.tree
        assert tree.tokens.tolist() == by_branch.tree.tokens.tolist()
        np.testing.assert_allclose(by_tree.values, by_branch.values, rtol=1e-4)
        logits = np.array(target.forward_tree(tree.tokens, tree.ancestors(), tree.depth,
                                              len(seq) - 1))
        path, t = rule.verify_tree(logits, tree, by_tree.probs, len(seq))
        seq += [*tree.pending(path[-1]), t] if path else [t]
        accepted, rounds = accepted + len(path), rounds + 1
    assert seq[len(prompt):][:len(alone)] == alone
    assert accepted >= 2 * rounds                  # its own draft: a whole branch passes
    with pytest.raises(ValueError, match="catch it up"):
        tree_step(target, seq, 0)


@pytest.mark.parametrize("setting", [{}, {"temperature": 0.9, "seed": 5}], ids=["greedy", "inv"])
def test_structured_output_masks_each_node_by_its_path(bundle_factory, setting):
    """A response_format's mask on every node (its path's tokens pending): the drafted trees
    propose only allowed tokens, and the output is the constrained target alone's."""
    pytest.importorskip("llguidance", reason="structured outputs need llguidance")
    from ssd_runtime.request import make_rule
    from test_structured import FORMAT, _valid

    gen = Generator.load(bundle_factory("llama", "llama_cut"), backend="cpu", threads=1)
    target, draft = gen.target, gen.draft
    prompt = [0, 17, 42, 99, 17, 42]
    alone = gen.generate(prompt, max_new_tokens=60, k=0, response_format=FORMAT, **setting)
    params = SamplingParams(coupling="invariant", **setting) if setting else SamplingParams()
    vocab = gen.manifest.target.vocab_size
    rule = make_rule(params, None, prompt, vocab, gen.eos_ids, gen.constraint(FORMAT))
    seq, accepted = list(prompt), 0
    while len(seq) - len(prompt) < 60 and seq[-1] not in gen.eos_ids:
        target.prefill(np.asarray(seq[:-1], np.int64), 0)
        draft.prefill(np.asarray(seq[:-1], np.int64), 0)
        drafted = expand(seq[-1], branch_step(draft, seq, len(seq) - 1), TreeShape(8, 3, 3, 2),
                         rule.draft_candidates, len(seq))
        tree = drafted.tree
        matcher = rule.processors.matcher
        for i in range(1, len(tree)):             # each candidate allowed after its parent's path
            allowed = matcher.allowed(vocab, tree.pending(int(tree.parents[i])))
            assert allowed is None or allowed[tree.tokens[i]]
        logits = np.array(target.forward_tree(tree.tokens, tree.ancestors(), tree.depth,
                                              len(seq) - 1))
        path, t = rule.verify_tree(logits, tree, drafted.probs, len(seq))
        new = [*tree.pending(path[-1]), t] if path else [t]
        ended = next((i for i, x in enumerate(new) if x in gen.eos_ids), None)
        new = new if ended is None else new[:ended + 1]
        seq += new
        rule.commit(new)
        accepted += len(path)
    assert seq[len(prompt):] == alone.token_ids
    _valid(alone.text)
    assert accepted > 0


def test_a_learnt_chance_in_place_of_q_gives_the_plans_shape():
    from ssd_runtime.scheduler.tree_plan import DEPTHS, RANKS, TreeAcceptance

    def learnt(first: float, later: float) -> TreeAcceptance:
        acc = TreeAcceptance()
        for d in range(DEPTHS):
            acc.tried[d] = [1e9] * RANKS
            acc.hits[d] = [1e9 * first] + [1e9 * later] * (RANKS - 1)
        return acc
    shape, rule = TreeShape(6, 3, 5, 2), GreedyAcceptance()
    sure = expand(3, table_step(PROMPT), shape, rule.draft_candidates, 2,
                  chance=learnt(0.99, 0.01).chance)
    chain = expand(3, table_step(PROMPT), TreeShape(6, 1, 5, 1), rule.draft_candidates, 2)
    assert sure.tree.is_chain() and sure.tree.tokens.tolist() == chain.tree.tokens.tolist()
    bushy = expand(3, table_step(PROMPT), shape, rule.draft_candidates, 2,
                   chance=learnt(0.3, 0.6).chance)
    assert len(bushy.tree.children(0)) == 3 and bushy.tree.depth.max() <= 2


def test_sampled_trees_keep_a_node_for_each_level_below():
    params = SamplingParams(temperature=1.0, seed=3, coupling="rejection")
    for nodes, width, depth in [(8, 2, 4), (6, 3, 5), (10, 3, 3)]:
        drafted = expand(3, table_step(PROMPT), TreeShape(nodes, width, depth, 2),
                         SamplingAcceptance(params).draft_candidates, 2, sampled=True)
        assert len(drafted.tree) <= nodes and drafted.tree.depth.max() == depth


@pytest.mark.parametrize("nodes,width,depth", [(7, 2, 3), (6, 3, 4), (9, 4, 2)])
def test_a_chain_tree_grows_what_expand_does_with_a_beam_of_one(nodes, width, depth):
    """tree_draft.ChainTree (a batch's rows, one draft call a level fed the chain's token):
    fed the rows of its chain's nodes it keeps the tree `expand` drafts with a beam of one
    where each level's first candidate is its likeliest (q's top-m), cut to the same budget;
    its chain is the draft's greedy chain and each row it asked for is that chain's."""
    from ssd_runtime.round.tree_draft import ChainTree

    shape = TreeShape(nodes, width, depth, 1)
    pick = GreedyAcceptance().draft_candidates
    drafted = expand(3, table_step(PROMPT), shape, pick, 2)
    grown = ChainTree(3, shape, pick, 2)
    context = PROMPT
    for level in range(depth):
        token = grown.add(draft_logits(context))
        assert token == int(np.argmax(draft_logits(context))) and grown.levels == level + 1
        context += (token,)
    assert grown.rows == depth
    kept = grown.result()
    assert kept.tree.tokens.tolist() == drafted.tree.tokens.tolist()
    assert kept.tree.parents.tolist() == drafted.tree.parents.tolist()
    np.testing.assert_allclose(kept.values, drafted.values)
    assert kept.probs == [None] * (len(kept.tree) - 1)
