"""Draft trees in the verification contract (docs/design.md §2 "Trees", §3): an ort target's
tree call gives each node the logits of its path run as a chain, its first path a chain's bits
and rows, the loop keeps k = 0's tokens, and bundles say whether they take trees."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ssd_runtime import Generator
from ssd_runtime.errors import BackendError, BundleError
from ssd_runtime.manifest import read_manifest
from ssd_runtime.round.lookup import lookup_tree
from ssd_runtime.round.tree import Tree
from trees import (PROMPT, assert_a_batch_drafts_the_trees_it_prices,
                   assert_a_chain_through_the_tree_input_is_the_chain,
                   assert_a_tree_past_the_width_is_refused, assert_auto_drafts_the_trees_it_prices,
                   assert_the_first_paths_rows_are_a_chains, assert_nodes_see_their_paths,
                   prediction_trials)



@pytest.fixture(scope="module")
def tree_bundle(bundle_factory):
    return bundle_factory("llama", "llama_cut")


def _target(bundle):
    return Generator.load(bundle, backend="cpu", threads=1).target


def test_the_ort_target_takes_trees_and_the_bundle_says_so(tree_bundle):
    m = read_manifest(tree_bundle, verify=False)
    assert m.target.graph == "ort"
    assert m.target.tree and m.target.tree_note == ""
    assert m.target.inputs[-1] == "tree_mask"
    assert m.requires == ["tree", "spare_rows"]         # its attention's dummy row too
    assert not m.draft.tree and m.draft.spare_rows == 0


def test_a_tree_call_gives_each_node_its_path_as_a_chain(tree_bundle):
    assert_nodes_see_their_paths(_target(tree_bundle))


def test_a_chain_through_the_tree_input_gives_the_chain_call_bit_for_bit(tree_bundle):
    assert_a_chain_through_the_tree_input_is_the_chain(_target(tree_bundle))


def test_a_trees_first_path_leaves_a_chains_rows(tree_bundle):
    # (slots, Hkv, max_context, D): rows on axis 2
    assert_the_first_paths_rows_are_a_chains(_target(tree_bundle), _target(tree_bundle), 2)


def test_a_tree_past_the_bundles_verification_width_is_refused(tree_bundle):
    assert_a_tree_past_the_width_is_refused(_target(tree_bundle))


def test_a_tree_of_a_target_without_the_tree_input_is_one_clear_error(tree_bundle):
    target = _target(tree_bundle)
    target.takes_trees = False          # as a bundle from before schema 13 opens
    tree = Tree.chain(1, [2])
    with pytest.raises(BackendError, match="takes no draft tree.*re-export"):
        target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, 0)


def test_a_runtime_that_predates_trees_refuses_a_tree_bundle_by_name(tree_bundle, tmp_path,
                                                                   monkeypatch):
    """An older runtime (its schema number and the names it knows) reads the manifest."""
    from ssd_runtime import manifest as manifest_module

    copy = tmp_path / "bundle"
    shutil.copytree(tree_bundle, copy)
    monkeypatch.setattr(manifest_module, "SCHEMA_VERSION", 12)
    monkeypatch.setattr(manifest_module, "REQUIRES", ())
    with pytest.raises(BundleError, match=r"schema_version 14 is newer than this runtime reads "
                                          r"\(up to 12\) and needs 'tree', 'spare_rows', which "
                                          r"this runtime predates.*upgrade"):
        read_manifest(copy, verify=False)
    # a runtime of schema 13 takes trees but not the ort target's spare arena row (two_rows.py)
    monkeypatch.setattr(manifest_module, "SCHEMA_VERSION", 13)
    monkeypatch.setattr(manifest_module, "REQUIRES", ("tree",))
    with pytest.raises(BundleError, match=r"schema_version 14 .* needs 'spare_rows', which"):
        read_manifest(copy, verify=False)
    monkeypatch.undo()
    data = json.loads((copy / "manifest.json").read_text())
    data["requires"] = ["tree", "telepathy"]
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"needs 'telepathy', which this runtime predates"):
        read_manifest(copy, verify=False)
    data["requires"] = ["tree", "spare_rows"]
    data["models"]["target"]["spare_rows"] = -1
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"models.target.spare_rows is -1, expected an integer"):
        read_manifest(copy, verify=False)


@pytest.mark.parametrize("k", [4, "auto"])
def test_greedy_with_lookup_trees_is_k0_and_takes_the_branch_the_chain_missed(
        tree_bundle, monkeypatch, k):
    from ssd_runtime.round.loop import Loop

    gen = Generator.load(tree_bundle, backend="cpu", threads=1)
    rounds, gained = {True: 0, False: 0}, 0
    for prompt, alone in prediction_trials(gen, 4):
        for trees in (True, False):
            monkeypatch.setattr(Loop, "trees", trees)
            res = gen.generate(prompt, max_new_tokens=24, k=k, draft_source="lookup",
                               ignore_eos=True, prediction=alone)
            assert res.token_ids == alone, (prompt, trees)
            rounds[trees] += res.stats.rounds
            gained += res.stats.tree_gained
            assert trees or res.stats.tree_rounds == 0
    # a fixed k drafts the sequence's own continuation first, which the tree's other branch
    # beats; auto's schedule may take the prediction first, where both drafts agree
    assert gained > 0 if k == 4 else gained >= 0
    assert rounds[True] <= rounds[False]


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}])
def test_auto_drafts_the_model_trees_its_plan_prices(tree_bundle, sampling, monkeypatch):
    """A draft model's trees (Drafter.tree_step: a call per expanded node over its path)."""
    gen = Generator.load(tree_bundle, backend="cpu", threads=1)
    prompts = [PROMPT, [5, 9, 14, 3, 22, 7], [40, 2, 2, 17, 250, 31]]
    assert_auto_drafts_the_trees_it_prices(gen, prompts, sampling, monkeypatch)


def test_a_draft_left_far_behind_by_lookup_drafts_its_tree_after_a_prefill(tree_bundle,
                                                                          monkeypatch):
    """Rounds of the prediction's tokens leave the draft model more tokens behind than one call
    takes; the first round it drafts a tree, the root's call prefills them first (as a chain's
    first step does) and the output stays k=0's."""
    from ssd_runtime.round.drafting import Drafter
    from ssd_runtime.round.tree_draft import TreeShape

    gen = Generator.load(tree_bundle, backend="cpu", threads=1)
    monkeypatch.setattr(Drafter, "tree_shape", TreeShape(6, 2, 3, 2))
    prompt = [int(x) for x in np.random.default_rng(4).integers(5, 300, 9)]
    alone = gen.generate(prompt, max_new_tokens=40, k=0, ignore_eos=True).token_ids
    behind = gen.draft.max_new_len + 6
    res = gen.generate(prompt, max_new_tokens=40, k=3, draft_source="fused", ignore_eos=True,
                       prediction=alone[:behind] + [1] * 8)
    assert res.token_ids == alone
    assert res.stats.tree_rounds > 0


def test_seeded_sampling_with_lookup_trees_is_reproducible(tree_bundle):
    gen = Generator.load(tree_bundle, backend="cpu", threads=1)
    prompt, alone = next(prediction_trials(gen, 1))
    runs = [gen.generate(prompt, max_new_tokens=24, k=4, draft_source="lookup",
                         prediction=alone, temperature=0.8, seed=11, ignore_eos=True)
            for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].stats.tree_rounds > 0


def test_a_batch_of_four_verifies_its_rows_trees_and_gives_each_prompt_alone(
        tree_bundle, monkeypatch):
    """Rows of a batch each verify their own lookup tree in the batch's one call (the ort
    target's rows graph; design §4, §11); every row gets k=0's tokens, and trees take tokens
    chains missed."""
    from ssd_runtime.round.loop import Loop

    gen = Generator.load(tree_bundle, backend="cpu", threads=1, max_batch=4)
    trials = list(prediction_trials(gen, 4))
    asks = [{"prompt": p, "prediction": alone} for p, alone in trials]
    gained = {}
    for trees in (True, False):
        monkeypatch.setattr(Loop, "trees", trees)
        results = gen.generate_batch(asks, max_new_tokens=24, k=4, draft_source="lookup",
                                     ignore_eos=True)
        assert [r.token_ids for r in results] == [alone for _, alone in trials], trees
        gained[trees] = sum(r.stats.tree_gained for r in results)
        assert trees or sum(r.stats.tree_rounds for r in results) == 0
    assert gained[True] > 0


@pytest.fixture(scope="module")
def static_bundle(bundle_factory):
    return bundle_factory("llama", "llama_cut", graph="static")


def test_the_static_target_takes_trees_and_keeps_its_rows_exact(static_bundle):
    """The static flavour (design §2, §12): a node on the tree's first path sits at the row a
    chain's token would, so its logits are the chain's bit for bit (the other branches' rows
    lie past it, masked: exact zeros); every node's equal its path's up to the sums' order."""
    m = read_manifest(static_bundle, verify=False)
    assert m.target.graph == "static" and m.target.tree and m.requires == ["tree"]
    assert m.target.inputs[-2:] == ["attend_rows", "tree_mask"]
    target = _target(static_bundle)
    prompt = np.asarray(PROMPT, np.int64)
    past = len(prompt)
    # path by path (lookup_tree): the first path's nodes are rows 0..3, as a chain's
    tree = lookup_tree(5, [[7, 8, 9], [7, 10], [11, 12, 13], [14]], max_nodes=9)
    target.prefill(prompt)
    got = target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, past).copy()
    first = tree.path(3)
    assert first == [0, 1, 2, 3] and len(tree) == 9
    for leaf in tree.leaves():
        path = tree.path(leaf)
        target.prefill(prompt)
        chain = target.forward(tree.tokens[path], past).copy()
        if path == first:
            assert np.array_equal(got[path], chain)
        np.testing.assert_allclose(got[path], chain, atol=2e-5, rtol=0)
        assert np.array_equal(got[path].argmax(-1), chain.argmax(-1))


def test_a_row_exact_target_verifies_trees_and_keeps_k0s_bits_alone_and_in_a_batch(
        static_bundle):
    """The static flavour keeps k = 0's bits (design §12): the loop keeps only the logits and
    rows of a tree's first path, which are a chain's bit for bit (above), and drafts the rest
    of a path that leaves it again in the next round (tree_round.judge): lookup's trees, alone
    and in a batch, give every request k = 0's tokens."""
    gen = Generator.load(static_bundle, backend="cpu", threads=1, max_batch=3)
    assert gen.target.takes_trees and gen.target.verifies_trees and gen.knowledge.draft_trees
    trials = list(prediction_trials(gen, 3))
    rounds = 0
    for prompt, alone in trials:
        res = gen.generate(prompt, max_new_tokens=24, k=4, draft_source="lookup",
                           ignore_eos=True, prediction=alone)
        assert res.token_ids == alone
        rounds += res.stats.tree_rounds
    assert rounds > 0
    results = gen.generate_batch([{"prompt": p, "prediction": alone} for p, alone in trials],
                                 max_new_tokens=24, k=4, draft_source="lookup", ignore_eos=True)
    assert [r.token_ids for r in results] == [alone for _, alone in trials]
    assert sum(r.stats.tree_rounds for r in results) > 0


def prompt_ids(n: int) -> list[int]:
    rng = np.random.default_rng(n)
    return [0, *rng.integers(3, 384, size=n - 1).tolist()]


@pytest.mark.parametrize("target,graph", [("gemma", "auto"), ("phi3", "auto"),
                                          ("llama", "static"), ("gemma3", "auto"),
                                          ("mistral", "auto")])
def test_model_trees_that_leave_their_first_path_keep_k0s_tokens(bundle_factory, target,
                                                                 graph, monkeypatch):
    """A node off a tree's first path has its path's logits up to the sums' order only (design
    §2 "Trees"): where the target's path leaves the first branch the round ends at its first
    node there and the rest is drafted again next round (tree_round.judge). These pairs' trees
    parted from k = 0 at a near-tie (token 7 of Gemma's first prompt, 2 of Phi-3's) while the
    whole path was taken in one round; every output is now k = 0's, with paths carried."""
    from ssd_runtime.round.drafting import Drafter
    from ssd_runtime.round.tree_draft import TreeShape

    gen = Generator.load(bundle_factory(target, f"{target}_cut", graph=graph))
    assert gen.manifest.target.tree          # sliding windows (gemma3, mistral) by position
    carried = 0
    for n in range(1, 9):
        want = gen.generate(prompt_ids(n), max_new_tokens=48, k=0).token_ids
        for shape, k in ((TreeShape(6, 5, 1, 1), 1), (TreeShape(10, 3, 3, 3), 3)):
            monkeypatch.setattr(Drafter, "tree_shape", shape)
            res = gen.generate(prompt_ids(n), max_new_tokens=48, k=k, draft_source="model")
            assert res.token_ids == want, (n, shape)
            assert res.stats.tree_rounds > 0
            carried += res.stats.tree_carried
    assert carried > 0


def test_the_device_path_binds_a_chains_mask_and_verifies_no_tree(static_bundle):
    """The cuda backend's code path on host memory (OrtCudaSession, device="cpu"): a static
    target's tree input takes the chain's mask on every call (lookup drafts give k=0's tokens),
    and no tree is verified there: a tree call on device arenas has not been run on a GPU."""
    from ssd_runtime.backends.ort_cuda import OrtCudaSession

    gen = Generator.load(static_bundle, backend="cpu", threads=1, fused_heads=False)
    prompt, alone = next(prediction_trials(gen, 1))
    m = gen.manifest
    gen.target, gen.draft = (
        OrtCudaSession(name, gen.root / entry.path, entry, m.max_context, m.max_draft + 2, 1,
                       device="cpu")
        for name, entry in (("target", m.target), ("draft", m.draft)))
    assert gen.target._mask_input and not gen.target.takes_trees
    res = gen.generate(prompt, max_new_tokens=24, k=4, draft_source="lookup", ignore_eos=True,
                       prediction=alone)
    assert res.token_ids == alone and res.stats.tree_rounds == 0


def test_lookup_offers_every_continuation_of_its_n_gram_merged_into_one_tree():
    from ssd_runtime.round.lookup import Lookup, Prediction

    # [1, 2] went on with 3 4, then 5 6, then 3 7 (latest): the chain drafts [3, 7]
    seq = [1, 2, 3, 4, 0, 1, 2, 5, 6, 0, 1, 2, 3, 7, 0, 9, 1, 2]
    look = Lookup(max_ngram=3)
    assert look.find(seq, 2) == ([3, 7], 2)
    assert look.others(seq, 2) == [[3, 7], [5, 6], [3, 4]]
    tree = lookup_tree(seq[-1], [[3, 7], *look.others(seq, 2)], max_nodes=16)
    assert tree.tokens.tolist() == [2, 3, 7, 5, 6, 4]       # the chosen chain whole, first
    assert tree.parents.tolist() == [-1, 0, 1, 0, 3, 1]
    assert lookup_tree(2, [[3, 7], [3, 7]], max_nodes=16) is None       # nothing to add
    assert len(lookup_tree(2, [[3, 7], [5, 6], [3, 4]], max_nodes=4)) == 4   # the budget
    # the prediction's continuation, where the sequence's own won, is offered too
    with_prediction = Lookup(max_ngram=3, prediction=Prediction([8, 8, 8], prompt_len=len(seq)))
    found, _ = with_prediction.find(seq, 2)
    assert found == [3, 7] and [8, 8] in with_prediction.others(seq, 2)


@pytest.mark.parametrize("target", ["gemma3", "mistral"])
def test_a_sliding_window_tree_node_sees_its_path_by_position(bundle_factory, target):
    """Windowed layers (gemma3: 8, a sliding and a full layer; mistral: 16) past their window:
    a node at cache row past + i but position past + depth sees the keys its position's window
    holds, as its path run as a chain does (graphs/tree_input.py), on every branch."""
    assert_nodes_see_their_paths(_target(bundle_factory(target, f"{target}_cut")))


@pytest.mark.parametrize("flavour,sampling", [("ort", {}), ("ort", {"temperature": 0.9, "seed": 3}),
                                              ("static", {})])
def test_a_batch_under_auto_drafts_the_trees_its_call_prices(tree_bundle, static_bundle,
                                                            flavour, sampling, monkeypatch):
    """A draft model's trees in a batch of four (Planner._trees, tree_draft.ChainTree), on the
    ort target (its rows graph) and on the row-exact static one (one call of every row)."""
    bundle = tree_bundle if flavour == "ort" else static_bundle
    gen = Generator.load(bundle, backend="cpu", threads=1, max_batch=4)
    prompts = [PROMPT, [5, 9, 14, 3, 22, 7], [40, 2, 2, 17, 250, 31], [8, 8, 1, 90, 12]]
    assert_a_batch_drafts_the_trees_it_prices(gen, prompts, sampling, monkeypatch)


def test_a_batchs_trees_under_a_response_format_keep_the_constrained_output(tree_bundle,
                                                                           monkeypatch):
    """Rows of a batch with a response_format draft their trees under its mask (each node's
    candidates allowed after its path: tree_draft.ChainTree asks the rule with the path
    pending), and every output is the constrained target's alone, valid JSON."""
    pytest.importorskip("llguidance", reason="structured outputs need llguidance")
    from test_structured import FORMAT, _valid

    gen = Generator.load(tree_bundle, backend="cpu", threads=1, max_batch=3)
    prompts = [PROMPT, [5, 9, 14, 3, 22, 7], [40, 2, 2, 17, 250, 31]]
    results = assert_a_batch_drafts_the_trees_it_prices(gen, prompts, {}, monkeypatch,
                                                        max_new_tokens=60,
                                                        response_format=FORMAT)
    for res in results:
        _valid(res.text)
