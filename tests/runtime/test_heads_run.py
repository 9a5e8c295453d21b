"""An EAGLE-3 head drafting in the runtime (docs/design.md §14): the drafts it proposes are the
PyTorch head's over Hugging Face's features, round after round and in a batch; the output is
the target's alone (greedy and seeded sampling, streams, batches, a prompt longer than the
feature ring); split mode is refused by name."""
from __future__ import annotations

from pathlib import Path

import export_cache
import numpy as np
import pytest
import tiny
from heads import assert_batch_drafts_as, head_row
from trees import (assert_a_batch_drafts_the_trees_it_prices,
                   assert_auto_drafts_the_trees_it_prices)
import torch
from ssd_export import ExportConfig
from ssd_graphs.eagle3 import aux_hidden, load_head
from ssd_runtime import Generator
from ssd_runtime.errors import ConfigError
from ssd_runtime.round import features
from ssd_runtime.round.loop import Loop
from ssd_runtime.round.tree import Tree
from ssd_runtime.round.tree_draft import TreeShape, expand
from ssd_runtime.round.tree_round import judge

WIDTH = 64                                      # the "llama" fixture target's hidden size
PROMPTS = [[5, 9, 14, 3, 22, 7], [40, 2, 2, 17], [11, 60, 3, 8, 19, 25, 31, 4, 9]]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """The tests' tiny Llama (3 layers, width 64) with room for a prompt longer than the ring."""
    root = tmp_path_factory.mktemp("long-llama")
    return tiny.build_model(root / "llama", "llama", tiny.build_tokenizer(root / "tokenizer"),
                            seed=1, layers=3, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def head(tmp_path_factory) -> Path:
    return tiny.build_eagle3_head(tmp_path_factory.mktemp("head") / "h", "safeailab",
                                  target_hidden=WIDTH, vocab=tiny.VOCAB, hidden=32, seed=1,
                                  max_position_embeddings=1024)


@pytest.fixture(scope="module")
def bundle(target, head, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("head-run") / "b"
    export_cache.bundle(ExportConfig(target=str(target), draft=str(head), output=out,
                                     quiet=True, max_batch=3, max_context=1024), out)
    return out


@pytest.fixture(scope="module")
def gen(bundle) -> Generator:
    return Generator.load(bundle, backend="cpu", threads=1, max_batch=3)


@pytest.fixture(scope="module")
def reference(target, head):
    """The drafts the PyTorch head proposes after `seq` (its last token pending): features of
    seq[:-1] from Hugging Face's target, the head over every position, then its chain."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    config, module, _ = load_head(head, embed_weight=model.get_input_embeddings().weight)
    module.eval()

    @torch.no_grad()
    def drafts(seq: list[int], k: int) -> list[int]:
        states = model(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
        hidden = module.fuse(aux_hidden(states, config.aux_layer_ids))
        n = len(seq) - 1
        logits, out, kv = module(torch.tensor([seq[1:]]), hidden, torch.arange(n)[None])
        found = []
        for step in range(k):
            token = int(module.target_logits(logits[:, -1:]).argmax(-1))
            found.append(token)
            logits, out, kv = module(torch.tensor([[token]]), out[:, -1:],
                                     torch.tensor([[n + step]]), kv)
        return found

    return drafts


def test_the_runtime_drafts_what_the_pytorch_head_drafts(gen, reference):
    """Every round's drafts equal the PyTorch head's over Hugging Face's features for the
    same committed tokens: the features reach the head at their positions, each step feeds
    the one before, the draft vocabulary maps back through d2t, and after a verification the
    head reads the features of what was accepted."""
    row = head_row(gen, PROMPTS[0], 3)
    loop = Loop(gen.target, gen.draft)
    for _ in range(4):
        before = list(row.seq)
        loop.round([row])
        assert row.drafts == reference(before, 3)


def test_a_batch_drafts_each_row_as_the_pytorch_head_does(gen, reference):
    assert_batch_drafts_as(gen, reference, PROMPTS, 2, rounds=3)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}])
def test_speculation_with_a_head_is_the_target_alone(gen, sampling):
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=20, k=0, **sampling).token_ids
        for k in (1, 4, "auto"):
            assert gen.generate(prompt, max_new_tokens=20, k=k, **sampling).token_ids == alone
        text = "".join(gen.stream(prompt, max_new_tokens=20, k=3, **sampling))
        assert gen.last_result.token_ids == alone and text == gen.last_result.text


def test_a_batch_with_a_head_gives_each_row_its_output_alone(gen):
    alone = [gen.generate(p, max_new_tokens=16, k=0).token_ids for p in PROMPTS]
    for k in (3, "auto"):
        results = gen.generate_batch(PROMPTS, max_new_tokens=16, k=k)
        assert [r.token_ids for r in results] == alone


def test_a_prompt_longer_than_the_feature_ring(gen):
    """The target writes features faster than a lazy head reads them: a prompt longer than
    the ring, and a stretch at k = 0, make the head catch up before they are overwritten."""
    prompt = [(7 * i) % (tiny.VOCAB - 1) + 1 for i in range(features.CAPACITY + 140)]
    alone = gen.generate(prompt, max_new_tokens=10, k=0).token_ids
    assert gen.generate(prompt, max_new_tokens=10, k=3).token_ids == alone
    assert gen.generate_batch([prompt, PROMPTS[1]], max_new_tokens=10, k=3)[0].token_ids == alone


def test_split_mode_is_refused_by_name(bundle):
    with pytest.raises(ConfigError, match="split.*feature-level head"):
        Generator.load(bundle, backend="cpu", threads=1, mode="split")


@pytest.fixture(scope="module")
def head_logits(target, head):
    """The PyTorch head's logits (V,) after `seq` (its last token pending) and then `path`,
    the tokens of a tree node's path after the root, fed one by one as its chain would."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    config, module, _ = load_head(head, embed_weight=model.get_input_embeddings().weight)
    module.eval()

    @torch.no_grad()
    def logits_after(seq: list[int], path: list[int]) -> np.ndarray:
        states = model(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states
        hidden = module.fuse(aux_hidden(states, config.aux_layer_ids))
        n = len(seq) - 1
        logits, out, kv = module(torch.tensor([seq[1:]]), hidden, torch.arange(n)[None])
        for step, token in enumerate(path):
            logits, out, kv = module(torch.tensor([[token]]), out[:, -1:],
                                     torch.tensor([[n + step]]), kv)
        return module.target_logits(logits[:, -1:])[0, 0].numpy()

    return logits_after


@pytest.mark.parametrize("shape", [TreeShape(12, 3, 3, 3), TreeShape(9, 2, 4, 2)])
def test_a_head_tree_reads_each_node_after_its_own_path(gen, head_logits, reference, shape):
    """Head trees (design §14): each expanded node's logits are the PyTorch head's after that
    node's path alone (its ancestors' keys, its parent's hidden_out), though branches share
    the head's scratch rows; and a chain drafted after the tree is the head's as if no tree
    had been (its root's row fed again from the target's features, its rows rewritten)."""
    row = head_row(gen, PROMPTS[2], 3)
    seen: list[tuple[list[int], np.ndarray]] = []
    step = features.head_step(row.drafter, row.seq)

    def recording(tree, nodes):
        rows = step(tree, nodes)
        seen.extend((tree.pending(u), r) for u, r in zip(nodes, rows))
        return rows

    drafted = expand(row.seq[-1], recording, shape, row.rule.draft_candidates, len(row.seq))
    assert len(drafted.tree) == shape.nodes and not drafted.tree.is_chain()
    assert len(seen) > shape.depth                  # several branches: rows rewritten
    for path, logits in seen:
        np.testing.assert_allclose(logits, head_logits(row.seq, path), rtol=1e-4, atol=1e-4)
    chain = expand(row.seq[-1], features.head_step(row.drafter, row.seq), TreeShape(4, 1, 3),
                   row.rule.draft_candidates, len(row.seq))
    assert chain.tree.tokens[1:].tolist() == reference(row.seq, 3)


def test_a_head_far_behind_drafts_its_tree_after_a_prefill(gen, reference):
    """A head that rounds without its drafts left more tokens behind than one call takes (a
    batch at k = 0, lookup's rounds) drafts a tree: the root's call prefills them first from
    the target's features, as a chain's first step does, and the tree's first path is the
    PyTorch head's drafts."""
    prompt = [int(x) for x in np.random.default_rng(5).integers(3, 200, 30)]
    req = gen.request(prompt, max_new_tokens=12, k=3)
    row = head_row(gen, prompt[:4], 3)                  # the head has seen 3 positions
    row.seq = list(req.ids)
    gen.target.prefill(np.asarray(row.seq[:-1], np.int64))
    row.target_len = len(row.seq) - 1
    assert len(row.seq) - 1 - row.drafter.draft_len > gen.draft.max_new_len
    drafted = expand(row.seq[-1], features.head_step(row.drafter, row.seq), TreeShape(7, 2, 3),
                     row.rule.draft_candidates, len(row.seq))
    assert drafted.tree.tokens[1:4].tolist() == reference(row.seq, 3)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}])
def test_head_trees_in_the_loop_are_the_target_alone(gen, sampling, monkeypatch):
    """A head drafting trees (HeadDrafter.tree_shape) in the loop: the target verifies each
    in one call and the kept first path's rows and features are already in place (the next
    round's head reads the features of what was accepted), so the output is k = 0's, greedy
    and sampled, and rounds did verify trees."""
    monkeypatch.setattr(features.HeadDrafter, "tree_shape", TreeShape(8, 3, 3, 2))
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=20, k=0, **sampling).token_ids
        for k in (2, 4):
            res = gen.generate(prompt, max_new_tokens=20, k=k, **sampling)
            assert res.token_ids == alone
            assert res.stats.tree_rounds > 0 and res.stats.tree_nodes > res.stats.tree_rounds


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}])
def test_auto_drafts_the_head_trees_its_plan_prices(gen, sampling, monkeypatch):
    assert_auto_drafts_the_trees_it_prices(gen, PROMPTS, sampling, monkeypatch)


def test_a_tree_verdict_keeps_the_first_paths_features_and_carries_the_rest(gen):
    """tree_round.judge beside a head: the tree call wrote each node's features at
    target_len + node. A path along the first branch (nodes 1, 2) has them at target_len + t,
    equal to what a chain over the same tokens writes (slot 2), so the head reads what was
    accepted; a path off it ends the round at its first node and carries the rest."""
    prompt = PROMPTS[1]
    a, b = gen.generate(prompt, max_new_tokens=2, k=0).token_ids[:2]
    row = head_row(gen, prompt, 3)
    x, y = (a + 1) % tiny.VOCAB, (b + 1) % tiny.VOCAB
    past = row.target_len
    off = Tree([row.seq[-1], x, a, y, b], [-1, 0, 0, 2, 2])      # the target's path: 2, 4
    logits = np.array(gen.target.forward_tree(off.tokens, off.ancestors(), off.depth, past))
    drafts, j, t, _, _ = judge(row, off, logits, gen.target)
    assert (drafts, j, t) == ([], 0, a) and row.drafter.carried[0] == b
    tree = Tree([row.seq[-1], a, b, x, y], [-1, 0, 1, 0, 1])     # the target's path: 1, 2
    logits = np.array(gen.target.forward_tree(tree.tokens, tree.ancestors(), tree.depth, past))
    drafts, j, t, _, _ = judge(row, tree, logits, gen.target)
    assert (drafts, j) == ([a, b], 2)
    gen.target.prefill(np.asarray(row.seq + [a, b], np.int64), 0, slot=2)
    at = (past + np.arange(3)) % features.CAPACITY
    store = gen.features.rows
    np.testing.assert_allclose(store[0, at], store[2, at], rtol=1e-4, atol=1e-3)


def test_a_batchs_head_trees_grow_along_the_heads_chain(gen, reference, monkeypatch):
    """In a batch each row's tree grows along the head's chain in the batch's own draft steps
    (tree_draft.ChainTree): round after round, every tree's first path is the PyTorch head's
    drafts after the same tokens, so the batch's tree call handed each row's features back
    by position (ort_tree.forward_rows_tree) and the head's rows past the root were its
    chain's."""
    monkeypatch.setattr(features.HeadDrafter, "tree_shape", TreeShape(7, 2, 3, 1))
    rows = [head_row(gen, prompt, 3, slot) for slot, prompt in enumerate(PROMPTS)]
    loop = Loop(gen.target, gen.draft)
    trees = 0
    for _ in range(3):
        befores = [list(row.seq) for row in rows]
        lengths = (np.array([row.target_len for row in rows], np.int64),
                   np.array([row.drafter.draft_len for row in rows], np.int64))
        loop.round(rows, lengths=lengths)
        for row, before in zip(rows, befores):
            tree = row.drafter.tree
            if tree is None:                   # a round of the tree's carried path
                assert row.drafter.from_carried
                continue
            trees += 1
            assert len(tree) == 7 and not tree.is_chain()
            first = [int(tree.tokens[u]) for u in range(1, 4)]
            assert tree.parents[1:4].tolist() == [0, 1, 2]
            assert first == reference(before, 3)
    assert trees >= len(PROMPTS)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}])
def test_a_batch_under_auto_drafts_the_head_trees_its_call_prices(gen, sampling, monkeypatch):
    assert_a_batch_drafts_the_trees_it_prices(gen, PROMPTS, sampling, monkeypatch)
