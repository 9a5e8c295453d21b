"""Draft trees in the standard flavour (docs/design.md §2 "Trees"): the plain ONNX graph that
TensorRT and ONNX Runtime CUDA bundles carry takes contract.TREE_MASK too; its mask is the
causal one for a chain, value for value; a tree call gives each node its path's logits; the CPU
backend moves the accepted path's sequence-major rows; the TensorRT lint stays clean."""
from __future__ import annotations

import pytest
import torch

from ssd_graphs.attention import causal_mask, key_positions, past_tree_mask
from ssd_graphs.trt_lint import errors, lint_file
from ssd_runtime import Generator
from ssd_runtime.manifest import read_manifest
from trees import (assert_a_chain_through_the_tree_input_is_the_chain,
                   assert_a_tree_past_the_width_is_refused, assert_the_first_paths_rows_are_a_chains,
                   assert_nodes_see_their_paths, prediction_trials)



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
    assert_nodes_see_their_paths(target)


def test_a_chain_through_the_tree_input_gives_the_chain_call_bit_for_bit(std_bundle):
    assert_a_chain_through_the_tree_input_is_the_chain(_target(std_bundle))


def test_a_trees_first_path_leaves_a_chains_sequence_major_rows(std_bundle):
    # (slots, max_context, Hkv, D): rows on axis 1
    assert_the_first_paths_rows_are_a_chains(_target(std_bundle), _target(std_bundle), 1)


def test_a_tree_past_the_bundles_verification_width_is_one_clear_error(std_bundle):
    assert_a_tree_past_the_width_is_refused(_target(std_bundle))


def test_greedy_with_lookup_trees_on_a_standard_bundle_is_k0(std_bundle):
    gen = Generator.load(std_bundle, backend="cpu", threads=1)
    tree_rounds = 0
    for prompt, alone in prediction_trials(gen, 3):
        res = gen.generate(prompt, max_new_tokens=24, k=4, draft_source="lookup",
                           ignore_eos=True, prediction=alone)
        assert res.token_ids == alone, prompt
        tree_rounds += res.stats.tree_rounds
    assert tree_rounds > 0


def test_a_batch_of_rows_trees_on_a_standard_bundle_gives_each_prompt_alone(std_bundle):
    """forward_rows_tree on the standard flavour: one call, new rows through the scratch."""
    gen = Generator.load(std_bundle, backend="cpu", threads=1, max_batch=3)
    trials = list(prediction_trials(gen, 3))
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
