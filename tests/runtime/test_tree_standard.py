"""Draft trees in the standard flavour (docs/design.md §2 "Trees"): the plain ONNX graph that
TensorRT and ONNX Runtime CUDA bundles carry takes contract.TREE_MASK too; its mask is the
causal one for a chain, value for value; a tree call gives each node its path's logits; the CPU
backend moves the accepted path's sequence-major rows; the TensorRT lint stays clean."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ssd_graphs.attention import causal_mask, key_positions, past_tree_mask
from ssd_graphs.trt_lint import errors, lint_file
from ssd_runtime import Generator
from ssd_runtime.errors import BackendError
from ssd_runtime.manifest import read_manifest
from ssd_runtime.round.tree import Tree

PROMPT = [3, 17, 44, 9, 120, 7, 7, 31, 250, 12, 5, 88]


@pytest.fixture(scope="module")
def std_bundle(bundle_factory):
    return bundle_factory("llama", "llama_cut", graph="standard", trees="on")


def _target(bundle, max_batch: int = 1):
    return Generator.load(bundle, backend="cpu", threads=1, max_batch=max_batch).target


@pytest.mark.parametrize("window", [None, 3])
def test_a_chains_lower_triangle_is_the_causal_mask_value_for_value(window):
    """Rows of a batch at their own past lengths (ragged), a sliding window or none."""
    position_ids = torch.tensor([[5, 6, 7, 8], [2, 3, 4, 5]])
    key_pos, key_valid = key_positions(position_ids, 6)
    tree = torch.tril(torch.ones(2, 4, 4, dtype=torch.bool))
    assert torch.equal(past_tree_mask(position_ids, key_pos, key_valid, tree, window),
                       causal_mask(position_ids, key_pos, key_valid, window))


def test_a_tree_node_sees_the_past_by_position_and_its_ancestors_only():
    # nodes 0:root(d0) 1:(d1, under 0) 2:(d1, under 0) 3:(d2, under 2); past 4 rows
    depth = torch.tensor([0, 1, 1, 2])
    position_ids = (4 + depth)[None]
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]],
                        dtype=torch.bool)[None]
    key_pos, key_valid = key_positions(position_ids, 4)
    for window, past_seen in ((None, [4, 4, 4, 4]), (3, [2, 1, 1, 0])):
        visible = past_tree_mask(position_ids, key_pos, key_valid, tree, window)[0, 0, 0] == 0
        assert visible[:, :4].sum(1).tolist() == past_seen      # past: by position (q - k < 3)
        # new keys: the ancestors (within the window by their positions, depths 0..2)
        want = tree[0] & ((position_ids[0][:, None] - position_ids[0][None, :]) < (window or 99))
        assert torch.equal(visible[:, 4:], want)


def test_the_standard_target_takes_trees_and_passes_the_tensorrt_lint(std_bundle):
    m = read_manifest(std_bundle, verify=False)
    assert m.target.graph == "standard"
    assert m.target.tree and m.target.tree_note == ""
    assert m.target.inputs[-1] == "tree_mask"
    assert m.requires == ["tree"] and not m.draft.tree
    assert errors(lint_file(std_bundle / m.target.path, m.target.path)) == []


def test_a_tree_call_gives_each_node_its_path_as_a_chain(std_bundle):
    target = _target(std_bundle)
    assert target.takes_trees
    prompt = np.asarray(PROMPT, np.int64)
    past = len(prompt)
    tree = Tree.from_paths(5, [[7, 8, 9], [7, 10], [11, 12, 13], [14]], max_nodes=9)
    target.prefill(prompt)
    got = target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, past).copy()
    for leaf in tree.leaves():
        path = tree.path(leaf)
        target.prefill(prompt)
        chain = target.forward(tree.tokens[path], past).copy()
        np.testing.assert_allclose(got[path], chain, atol=2e-5, rtol=0)
        assert np.array_equal(got[path].argmax(-1), chain.argmax(-1))


def test_a_chain_through_the_tree_input_gives_the_chain_call_bit_for_bit(std_bundle):
    target = _target(std_bundle)
    prompt, drafts = np.asarray(PROMPT, np.int64), [5, 6, 7, 8]
    target.prefill(prompt)
    chain = target.forward(np.asarray(drafts), len(prompt)).copy()
    tree = Tree.chain(drafts[0], drafts[1:])
    got = target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, len(prompt)).copy()
    assert np.array_equal(got, chain)
    assert np.array_equal(target.forward(np.asarray(drafts), len(prompt)), chain)


def test_compacted_sequence_major_rows_keep_the_next_calls_exact(std_bundle):
    tree_side, chain_side = _target(std_bundle), _target(std_bundle)
    prompt = np.asarray(PROMPT, np.int64)
    past = len(prompt)
    tree = Tree.from_paths(5, [[7, 8], [11, 12]], max_nodes=5)      # 0:5 1:7 2:11 3:8 4:12
    path = tree.path(4)                                              # [0, 2, 4]
    tree_side.prefill(prompt)
    tree_side.forward_tree(tree.tokens, tree.ancestors(), tree.depth, past)
    tree_side.compact_rows(past, path)
    chain_side.prefill(prompt)
    chain_side.forward(tree.tokens[path], past)
    for layer in range(len(tree_side.keys)):
        for a, b in ((tree_side.keys, chain_side.keys), (tree_side.values, chain_side.values)):
            # (slots, max_context, Hkv, D): rows on axis 1
            np.testing.assert_allclose(a[layer][0, :past + 3], b[layer][0, :past + 3],
                                       atol=1e-5, rtol=0)
    nxt = np.asarray([40, 41, 42], np.int64)
    got = tree_side.forward(nxt, past + 3).copy()
    want = chain_side.forward(nxt, past + 3).copy()
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    assert np.array_equal(got.argmax(-1), want.argmax(-1))


def test_a_tree_past_the_bundles_verification_width_is_one_clear_error(std_bundle):
    target = _target(std_bundle)
    n = target.max_new_len + 1
    tree = Tree.from_paths(1, [[2 + i] for i in range(n - 1)], max_nodes=n)
    target.prefill(np.asarray(PROMPT, np.int64))
    with pytest.raises(BackendError, match=rf"a draft tree of {n} nodes exceeds the "
                                           rf"{target.max_new_len} tokens.*--max-draft"):
        target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, len(PROMPT))


def _prediction_trials(gen, trials: int = 3):
    """As test_tree_verify's: a 3-gram seen once before, then the target's own answer as the
    request's prediction, so that lookup's tree holds two continuations."""
    rng = np.random.default_rng(1)
    for _ in range(trials):
        abc = [int(x) for x in rng.integers(5, 300, 3)]
        prompt = [int(x) for x in rng.integers(5, 300, 5)] + abc + \
            [int(x) for x in rng.integers(5, 300, 8)] + [7] + abc
        yield prompt, gen.generate(prompt, max_new_tokens=24, k=0, ignore_eos=True).token_ids


def test_greedy_with_lookup_trees_on_a_standard_bundle_is_k0(std_bundle):
    gen = Generator.load(std_bundle, backend="cpu", threads=1)
    tree_rounds = 0
    for prompt, alone in _prediction_trials(gen):
        res = gen.generate(prompt, max_new_tokens=24, k=4, draft_source="lookup",
                           ignore_eos=True, prediction=alone)
        assert res.token_ids == alone, prompt
        tree_rounds += res.stats.tree_rounds
    assert tree_rounds > 0


def test_a_batch_of_rows_trees_on_a_standard_bundle_gives_each_prompt_alone(std_bundle):
    """forward_rows_tree on the standard flavour: one call, new rows through the scratch."""
    gen = Generator.load(std_bundle, backend="cpu", threads=1, max_batch=3)
    trials = list(_prediction_trials(gen, 3))
    results = gen.generate_batch([{"prompt": p, "prediction": alone} for p, alone in trials],
                                 max_new_tokens=24, k=4, draft_source="lookup", ignore_eos=True)
    assert [r.token_ids for r in results] == [alone for _, alone in trials]
    assert sum(r.stats.tree_rounds for r in results) > 0


def test_trees_auto_leaves_the_standard_flavour_without_the_input(bundle_factory):
    """--trees auto: the ort and static flavours take trees, the standard one not (its input
    costs its every call; its GPU backends verify chains only); on and off as they say."""
    from ssd_export.pipeline import takes_trees

    assert [takes_trees("auto", g) for g in ("ort", "static", "standard")] == [True, True, False]
    assert takes_trees("on", "standard") and not takes_trees("off", "ort")
    m = read_manifest(bundle_factory("llama", "llama_cut", graph="standard"), verify=False)
    assert not m.target.tree and "tree_mask" not in m.target.inputs and m.requires == []
