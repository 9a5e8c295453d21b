"""The ort target's rows graph (docs/design.md §2, §11): a batch's several new tokens per row in
one call give each row what it gives alone, write the same rows in place, and a bundle without
the graph falls back to one row at a time.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ssd_runtime import Generator
from ssd_runtime.backends import cpu_session
from ssd_runtime.manifest import read_manifest

PASTS = (0, 3, 17, 40)          # rows of other past lengths, one with no past
REAL = (5, 3, 1, 5)             # and other real lengths: padding at the end of a row
T = 5


def _prefilled(bundle, manifest, seed: int = 0):
    """A target session with 4 slots prefilled at PASTS, and the ids: (session, ids (4, 45))."""
    session = cpu_session("target", bundle, manifest, threads=1, max_batch=len(PASTS))
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, manifest.target.vocab_size, size=(len(PASTS), max(PASTS) + T),
                       dtype=np.int64)
    for b, past in enumerate(PASTS):
        if past:
            session.prefill(ids[b, :past], 0, slot=b)
    return session, ids


def _batch(ids):
    return np.stack([ids[b, p:p + T] for b, p in enumerate(PASTS)])


def test_rows_graph_gives_each_row_what_it_gives_alone(bundle_factory):
    bundle = bundle_factory("llama", "llama_cut")
    manifest = read_manifest(bundle)
    assert manifest.target.graph == "ort" and manifest.target.rows == "target/rows.onnx"
    assert set(manifest.target.rows_parity) >= {"logits", "in_batch"}
    session, ids = _prefilled(bundle, manifest)
    assert session.rows_graph and session.batches_new_tokens
    # stale rows beyond every row's length: finite junk that only a wrong mask would see
    for keys in session.keys:
        for b, past in enumerate(PASTS):
            keys[b, :, past + T:] = 3.0
    batch = _batch(ids)
    together = session.forward_rows(batch, np.asarray(PASTS, np.int64),
                                    np.asarray(REAL, np.int64)).copy()
    written = [k.copy() for k in session.keys] + [v.copy() for v in session.values]
    for b, past in enumerate(PASTS):
        alone = session.forward(batch[b, :REAL[b]], past, slot=b)      # GroupQueryAttention
        np.testing.assert_allclose(together[b, :REAL[b]], alone, atol=1e-4, rtol=1e-4)
        # the rows graph wrote the row's new keys/values in place where GQA writes them
        for before, arena in zip(written, session.keys + session.values):
            np.testing.assert_allclose(before[b, :, past:past + REAL[b]],
                                       arena[b, :, past:past + REAL[b]], atol=1e-5)


def test_rows_graph_matches_one_row_at_a_time(bundle_factory):
    """The one call against the path it replaces, on two sessions with the same pasts."""
    bundle = bundle_factory("llama", "llama_cut")
    manifest = read_manifest(bundle)
    old = replace(manifest, target=replace(manifest.target, rows="", rows_parity={}))
    new_session, ids = _prefilled(bundle, manifest)
    old_session, _ = _prefilled(bundle, old)
    assert new_session.rows_graph and not old_session.rows_graph
    assert not old_session.batches_new_tokens        # a bundle without it: one row at a time
    past_lens, real = np.asarray(PASTS, np.int64), np.asarray(REAL, np.int64)
    new = new_session.forward_rows(_batch(ids), past_lens, real).copy()
    one_by_one = old_session.forward_rows(_batch(ids), past_lens, real)
    for b in range(len(PASTS)):
        np.testing.assert_allclose(new[b, :REAL[b]], one_by_one[b, :REAL[b]], atol=1e-4,
                                   rtol=1e-4)
    # T == 1 stays on the GroupQueryAttention graph, and so does a batch of one
    step = new_session.forward_rows(ids[:, :1], past_lens + real)
    assert step.shape == (len(PASTS), 1, manifest.target.vocab_size)


def test_generate_batch_through_the_rows_graph_equals_each_prompt_alone(bundle_factory):
    """Greedy at k=4 and auto, prompts of other lengths, one capped at k=2; seeded sampling."""
    bundle = bundle_factory("llama", "llama_cut")
    gen = Generator.load(bundle, max_batch=4)
    assert gen.target.rows_graph
    prompts = [[5, 9, 11], list(range(3, 40)), [7] * 12, [20, 21]]
    for k in (4, "auto"):
        together = gen.generate_batch([dict(prompt=p, max_new_tokens=20, k=k if i != 3 else 2)
                                       for i, p in enumerate(prompts)])
        for p, got in zip(prompts, together):
            alone = gen.generate(p, max_new_tokens=20, k=0)
            assert got.token_ids == alone.token_ids and len(got.token_ids) == 20
    sampled = gen.generate_batch([dict(prompt=p, max_new_tokens=16, k=4, temperature=0.9,
                                       seed=7 + i) for i, p in enumerate(prompts)])
    for i, (p, got) in enumerate(zip(prompts, sampled)):
        assert got.token_ids == gen.generate(p, max_new_tokens=16, k=4, temperature=0.9,
                                       seed=7 + i).token_ids
