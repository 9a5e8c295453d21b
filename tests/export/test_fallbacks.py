"""The export's fallbacks take what they expect and nothing else: a refusal (ours or ONNX
Runtime's) or a parity failure falls back, a bug propagates instead of hiding behind a
standard graph or a float draft."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ssd_export import ExportConfig, pipeline, quantize
from ssd_runtime.errors import BackendError, ConfigError, ParityError


def ort_fail(message: str = "simulated ONNX Runtime refusal") -> Exception:
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    return Fail(message)


def trace(monkeypatch, tmp_path: Path, ort_error: Exception | None):
    """_trace_checked under --graph auto, the ort trace raising `ort_error`."""
    graphs = []

    def export_decoder(model, source, path, max_context, graph, aux_layers=(), tree=False,
                       exact=False):
        graphs.append(graph)
        if graph == "ort" and ort_error is not None:
            raise ort_error
        return SimpleNamespace(path=path, moe_note=None, graph=graph, tree_note="")

    monkeypatch.setattr(pipeline, "export_decoder", export_decoder)
    monkeypatch.setattr(pipeline, "check_parity", lambda *a, **k: {"logits": 0.0})
    loaded = SimpleNamespace(role="target", architecture="llama", model=None, source="x")
    config = ExportConfig(target="t", draft="d", output=tmp_path / "out", graph="auto")
    traced, _ = pipeline._trace_checked(loaded, tmp_path / "target" / "model.onnx", 64, config,
                                        "ort", pipeline._Progress(quiet=True))
    return traced.graph, graphs


@pytest.mark.parametrize("error", [ConfigError("the ort graph flavour has no ALiBi"),
                                   ParityError("differs"), ort_fail()],
                         ids=["refused", "parity", "onnxruntime"])
def test_ort_flavour_falls_back_on_what_it_expects(monkeypatch, tmp_path, error):
    assert trace(monkeypatch, tmp_path, error) == ("standard", ["ort", "standard"])


def test_a_bug_in_the_ort_trace_is_not_a_standard_graph(monkeypatch, tmp_path):
    with pytest.raises(TypeError, match="a bug"):
        trace(monkeypatch, tmp_path, TypeError("a bug"))


def quantize_checked(monkeypatch, tmp_path, error: Exception, requested: str = "auto"):
    def quantize_graph(path, quant, graph):
        raise error

    monkeypatch.setattr(quantize, "quantize_graph", quantize_graph)
    traced = SimpleNamespace(graph="ort", vocab_size=16)
    return quantize._quantize_checked(tmp_path / "q.onnx", tmp_path / "f.onnx", "int8",
                                      requested, traced, "float32", 64)


@pytest.mark.parametrize("error", [BackendError("the quantizer refuses"), ort_fail()],
                         ids=["quantizer", "onnxruntime"])
def test_a_refused_quantization_keeps_the_float_draft(monkeypatch, tmp_path, error):
    count, _, why = quantize_checked(monkeypatch, tmp_path, error)
    assert count == 0 and why.startswith("ONNX Runtime refused it: ")
    with pytest.raises(ConfigError, match=r"--draft-quant int8: ONNX Runtime could not"):
        quantize_checked(monkeypatch, tmp_path, error, requested="int8")


def test_a_bug_in_quantization_is_not_a_float_draft(monkeypatch, tmp_path):
    with pytest.raises(AttributeError, match="a bug"):
        quantize_checked(monkeypatch, tmp_path, AttributeError("a bug"))


def test_a_draft_weight_whose_k_the_block_does_not_divide_is_padded(tmp_path):
    """The draft's last block is padded (the target's is refused, test_qweights.py)."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    w = np.random.default_rng(0).normal(size=(40, 4)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 40])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    assert quantize.quantize_graph(path, "int8") == 1
    x = np.ones((1, 40), np.float32)
    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y[0], x @ w, atol=0.2)      # int8 weights and activations
