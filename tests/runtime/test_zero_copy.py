"""The KV arena is written in place: new rows land at offset past_len, nothing is copied."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ssd_runtime import Generator, contract


def test_new_kv_is_written_at_offset_past_len(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut", graph="standard"))
    session = gen.target
    ids = np.array([0, 5, 9, 17, 33, 64, 100], np.int64)
    session.prefill(ids[:4])
    before = [k.copy() for k in session.keys]
    past_len = 4
    logits = session.forward(ids[4:], past_len)
    outputs = session.binding.get_outputs()   # binding order: new_key.0, new_value.0, ..., logits
    row = session.row_bytes
    for i in range(session.entry.num_layers):
        assert outputs[2 * i].data_ptr() == session.keys[i].ctypes.data + past_len * row
        assert outputs[2 * i + 1].data_ptr() == session.values[i].ctypes.data + past_len * row
        # rows before past_len untouched, rows past_len..past_len+3 filled
        np.testing.assert_array_equal(session.keys[i][:, :past_len], before[i][:, :past_len])
        assert np.abs(session.keys[i][:, past_len:past_len + 3]).sum() > 0
    assert outputs[-1].data_ptr() == session.logits.ctypes.data
    # and the in-place result equals a plain run without IOBinding
    plain = ort.InferenceSession(str(gen.root / gen.manifest.target.path),
                                 providers=["CPUExecutionProvider"])
    feeds = {contract.INPUT_IDS: ids[None], contract.POSITION_IDS: np.arange(7)[None]}
    assert not session.entry.tree        # --trees auto: no tree input in the standard flavour
    e = session.entry
    for i in range(e.num_layers):
        empty = np.zeros((1, 0, e.num_kv_heads, e.head_dim), np.float32)
        feeds[contract.past_key(i)] = feeds[contract.past_value(i)] = empty
    ref = plain.run(None, feeds)
    np.testing.assert_allclose(logits, ref[0][0, 4:], atol=1e-4)
    for i in range(e.num_layers):
        np.testing.assert_allclose(session.keys[i][:, :7], ref[1 + 2 * i], atol=1e-5)
        np.testing.assert_allclose(session.values[i][:, :7], ref[2 + 2 * i], atol=1e-5)


def test_rollback_is_free(bundle_factory):
    """Re-running from an earlier past_len overwrites rejected rows and gives fresh results."""
    gen = Generator.load(bundle_factory("llama", "llama_cut"))
    s = gen.target
    s.prefill(np.array([0, 5, 9], np.int64))
    first = s.forward(np.array([17, 33], np.int64), 3).copy()
    s.forward(np.array([200, 201, 202], np.int64), 3)      # a "rejected" continuation
    again = s.forward(np.array([17, 33], np.int64), 3)     # rolled back to past_len 3
    np.testing.assert_allclose(again, first, atol=1e-6)


def test_ort_flavour_updates_the_cache_in_place(bundle_factory):
    """The "ort" graph: past and present are one buffer per layer; the kernel writes the new
    rows at past_len in place, leaves every other row alone, and gives the standard logits."""
    gen = Generator.load(bundle_factory("llama", "llama_cut"), threads=1)
    standard = Generator.load(bundle_factory("llama", "llama_cut", graph="standard"), threads=1)
    session, ref = gen.target, standard.target
    assert session.entry.graph == contract.ORT and ref.entry.graph == contract.STANDARD
    e = session.entry
    assert e.spare_rows == 1          # the target's attention reads two rows (two_rows.py)
    assert session.keys[0].shape == (1, e.num_kv_heads, gen.manifest.max_context + 1, e.head_dim)
    ids = np.array([0, 5, 9, 17, 33, 64, 100], np.int64)
    for s in (session, ref):
        s.prefill(ids[:4])
    before = [k.copy() for k in session.keys]
    logits = session.forward(ids[4:], 4).copy()
    np.testing.assert_allclose(logits, ref.forward(ids[4:], 4), atol=1e-5)
    outputs = session.binding.get_outputs()   # present_key.0, present_value.0, ..., logits
    for i in range(e.num_layers):
        assert outputs[2 * i].data_ptr() == session.keys[i].ctypes.data
        assert outputs[2 * i + 1].data_ptr() == session.values[i].ctypes.data
        np.testing.assert_array_equal(session.keys[i][:, :, :4], before[i][:, :, :4])
        np.testing.assert_array_equal(session.keys[i][:, :, 7:], before[i][:, :, 7:])
        # the same keys as the standard graph's sequence-major rows
        np.testing.assert_allclose(session.keys[i][0, :, :7].transpose(1, 0, 2),
                                   ref.keys[i][0, :7], atol=1e-5)
        np.testing.assert_allclose(session.values[i][0, :, :7].transpose(1, 0, 2),
                                   ref.values[i][0, :7], atol=1e-5)
    # rolled back to past_len 4 over rows a rejected continuation wrote: the same logits again
    session.forward(np.array([200, 201, 202], np.int64), 4)
    np.testing.assert_allclose(session.forward(ids[4:], 4), logits, atol=1e-6)


def test_an_ort_draft_gives_its_last_rows_argmax_and_probability(bundle_factory):
    """contract.TOP_ID / TOP_PROB: what greedy drafting and adaptive k read after every draft
    step, from the graph (quantized or not); standard graphs and targets have none."""
    for quant in ("none", "int8"):
        gen = Generator.load(bundle_factory("llama", "llama_cut", draft_quant=quant), threads=1)
        draft = gen.draft
        assert gen.manifest.draft.quant == quant and gen.target.top() is None
        assert gen.manifest.draft.outputs[-2:] == [contract.TOP_ID, contract.TOP_PROB]
        assert contract.TOP_ID not in gen.manifest.target.outputs
        draft.prefill(np.array([0, 5, 9], np.int64))
        for ids, past_len in (([17, 33, 64], 3), ([100], 6), ([7], 7)):
            row = draft.forward(np.array(ids, np.int64), past_len)[-1].astype(np.float64)
            token, prob = draft.top()
            probs = np.exp(row - row.max())
            assert token == int(np.argmax(row))
            assert prob == pytest.approx(probs.max() / probs.sum(), rel=1e-5)
    standard = Generator.load(bundle_factory("llama", "llama_cut", graph="standard"))
    assert standard.draft.top() is None
