"""Graph rewrites made at export so that ONNX Runtime fuses what it can."""
from __future__ import annotations

import collections

import onnx
import onnxruntime as ort
import pytest


def _ops(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path), load_external_data=False)
                               .graph.node)


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma"])
def test_rms_norms_become_one_fused_kernel(bundle_factory, tmp_path, kind):
    """Every RMSNorm (layers, final, Qwen3's per-head q/k norms) is exported as
    x / Sqrt(...) and ONNX Runtime fuses each into a SimplifiedLayerNormalization."""
    graph = bundle_factory(kind, f"{kind}_cut") / "target" / "model.onnx"
    exported = _ops(graph)
    assert exported["Reciprocal"] == 0
    norms = exported["ReduceMean"]
    assert norms >= 3 and exported["Div"] >= norms
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    optimized = _ops(tmp_path / "optimized.onnx")
    assert optimized["SimplifiedLayerNormalization"] == norms
    assert optimized["ReduceMean"] == 0
