"""The exporter's rows graph (docs/design.md §2, §11): written beside an ort target with
max_batch > 1, its weights in the target's data file (no second copy on disk), quantized as the
target, recorded in the manifest with its parity; none, and why, where it cannot be had.
"""
from __future__ import annotations

import json

import numpy as np
import onnx

from ssd_runtime.backends import cpu_session
from ssd_runtime.manifest import read_manifest


def _weights(bundle):
    """(bytes read from model.onnx.data, bytes of the rows graph's own) over its initializers."""
    model = onnx.load(str(bundle / "target" / "rows.onnx"), load_external_data=False)
    shared = own = 0
    for t in model.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if info.get("location") == "model.onnx.data":
            shared += int(info["length"])
        else:
            own += int(info.get("length", len(t.raw_data)))
    return model, shared, own


def test_the_rows_graph_reads_the_targets_weights_file(bundle_factory):
    bundle = bundle_factory("llama", "llama_cut")
    target = read_manifest(bundle).target
    assert target.rows == "target/rows.onnx" and target.rows_note == ""
    assert max(target.rows_parity.values()) < 1e-3 and "in_batch" in target.rows_parity
    model, shared, own = _weights(bundle)
    data = (bundle / "target" / "model.onnx.data").stat().st_size
    assert shared > 0.9 * data and own < 0.05 * data     # one copy of the weights on disk
    # (then a target's draft trees' mask, schema 13: design §2 "Trees")
    assert [i.name for i in model.graph.input][-2:] == ["attend_rows", "tree_mask"]
    assert json.loads((bundle / "manifest.json").read_text())["schema_version"] >= 8


def test_a_quantized_target_has_a_quantized_rows_graph(bundle_factory):
    """A quantized target in the ort flavour (--graph ort: the fast form; the default for
    --quant is the exact static flavour, which takes several tokens per row natively)."""
    bundle = bundle_factory("llama", "llama_cut", graph="ort", quant="int4")
    manifest = read_manifest(bundle)
    assert manifest.target.quant == "int4" and manifest.target.rows
    # against Hugging Face with the dequantized weights, and in a batch against each row alone
    assert manifest.target.rows_parity["logits"] < 1e-3 and "in_batch" in manifest.target.rows_parity
    model, shared, own = _weights(bundle)
    target = onnx.load(str(bundle / "target" / "model.onnx"), load_external_data=False)
    kinds = [n.op_type for n in model.graph.node if n.op_type in ("MatMul", "MatMulNBits")]
    assert kinds.count("MatMulNBits") == sum(n.op_type == "MatMulNBits"
                                             for n in target.graph.node)
    assert own < 0.05 * shared
    # the same kernels in one call give each row what GroupQueryAttention gives it alone
    session = cpu_session("target", bundle, manifest, threads=1, max_batch=2)
    assert session.rows_graph
    ids = np.arange(3, 23, dtype=np.int64).reshape(2, 10)
    session.prefill(ids[0, :7], 0, slot=0)
    session.prefill(ids[1, :2], 0, slot=1)
    rows = session.forward_rows(np.stack([ids[0, 7:10], ids[1, 2:5]]),
                                np.asarray([7, 2], np.int64)).copy()
    for b, past in enumerate((7, 2)):
        alone = session.forward(ids[b, past:past + 3], past, slot=b)
        np.testing.assert_allclose(rows[b], alone, atol=2e-3, rtol=2e-3)


def test_no_rows_graph_where_there_are_no_batches_of_ort_rows(bundle_factory):
    """A standard target verifies a batch in one call already; a MoE target would run its
    experts dense in the rows graph: both say why they have none."""
    standard = read_manifest(bundle_factory("llama", "llama_cut", graph="standard")).target
    assert standard.rows == "" and "ort-flavour" in standard.rows_note
    moe = read_manifest(bundle_factory("qwen3_moe", "qwen3_moe_cut")).target
    assert moe.rows == "" and "mixture-of-experts" in moe.rows_note
