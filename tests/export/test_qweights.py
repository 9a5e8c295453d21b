"""Weight-only quantization of MatMul weights (ssd_export.qweights): each form computes with
exactly the dequantized weights it reports, and bad shapes are refused by name."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from ssd_graphs import trt_lint
from ssd_runtime.contract import DEQUANTIZE, MATMULNBITS
from ssd_runtime.errors import ConfigError

from ssd_export.qtarget import locate, parameter_index
from ssd_export.qweights import Scheme, rewrite, rtn

SCHEMES = [(MATMULNBITS, 4, "rtn"), (MATMULNBITS, 8, "rtn"), (MATMULNBITS, 4, "hqq"),
           (DEQUANTIZE, 4, "rtn"), (DEQUANTIZE, 8, "rtn")]


def matmul_model(weights: dict[str, np.ndarray], k: int) -> onnx.ModelProto:
    """x (3, K) times each weight, one output each."""
    nodes = [helper.make_node("MatMul", ["x", name], [f"y_{name}"], name=f"mm_{name}")
             for name in weights]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k])],
        [helper.make_tensor_value_info(f"y_{n}", TensorProto.FLOAT, [3, w.shape[1]])
         for n, w in weights.items()],
        [numpy_helper.from_array(w, n) for n, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    session = ort.InferenceSession(model.SerializeToString(), opts,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.mark.parametrize("form,bits,method", SCHEMES)
@pytest.mark.parametrize("k", [128, 96])
def test_each_form_computes_with_the_dequantized_weights_it_reports(form, bits, method, k):
    if (form, bits, method) == (MATMULNBITS, 8, "hqq"):
        pytest.skip("no 8-bit kernel with float zero points")
    rng = np.random.default_rng(bits + k)
    w = rng.normal(size=(k, 80)).astype(np.float32)
    x = rng.normal(size=(3, k)).astype(np.float32)
    model = matmul_model({"w": w}, k)
    scheme = Scheme(bits, 64, method, True, form)
    if k % 64:
        with pytest.raises(ConfigError, match=r"block size 64 does not divide .* K = 96.*"
                                              r"--quant-block 32"):
            rewrite(model, scheme, 0)
    (weight,) = rewrite(model, scheme, 0, pad=True)
    assert {n.op_type for n in model.graph.node} == \
        ({MATMULNBITS} if form == MATMULNBITS else {DEQUANTIZE, "MatMul"})
    assert np.array_equal(weight.original, w)
    (y,) = run(model, x)
    np.testing.assert_allclose(y, x @ weight.dequantized, atol=2e-4, rtol=1e-4)
    error = np.abs(weight.dequantized - w).max()
    assert 0 < error < (0.4 if bits == 4 else 0.03), error     # quantized, and close


def test_round_to_nearest_is_symmetric_and_reaches_minus_two_to_the_bits():
    w = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    w[:32] *= 0                                    # an all-zero block quantizes to zeros
    q, scale = rtn(w, 4, 32)
    assert q.min() == -8 and q.max() <= 7 and not q[:32].any() and not scale[0].any()
    biggest = np.abs(w[32:]).argmax(0)
    assert (q[32:][biggest, np.arange(16)] == -8).all()
    np.testing.assert_allclose(q[32:] * scale[1], w[32:], atol=float(np.abs(scale).max()) / 2
                               + 1e-6)


def test_the_lm_head_stays_float_when_asked_and_others_when_not_selected():
    rng = np.random.default_rng(1)
    weights = {"proj": rng.normal(size=(64, 32)).astype(np.float32),
               "head": rng.normal(size=(64, 100)).astype(np.float32),
               "other": rng.normal(size=(64, 48)).astype(np.float32)}
    model = matmul_model(weights, 64)
    done = rewrite(model, Scheme(4, 32, "rtn", False, MATMULNBITS), vocab_size=100,
                   select=lambda name, b: name != "other")
    assert [w.name for w in done] == ["proj"]
    ops = [(n.op_type, n.input[1]) for n in model.graph.node]
    assert ("MatMul", "head") in ops and ("MatMul", "other") in ops
    assert {i.name for i in model.graph.initializer} >= {"head", "other"}
    assert "proj" not in {i.name for i in model.graph.initializer}   # the float copy is gone


def test_a_packed_projection_is_located_in_its_parameters():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"q": torch.nn.Linear(32, 32, bias=False),
                                 "k": torch.nn.Linear(32, 16, bias=False),
                                 "v": torch.nn.Linear(32, 16, bias=False)})
    index = parameter_index(model)
    packed = torch.cat([model[n].weight for n in ("q", "k", "v")]).T.detach().numpy()
    parts = locate(packed, index)
    assert [(p.module, p.transposed, p.start, p.width) for p in parts] == \
        [(model["q"], True, 0, 32), (model["k"], True, 32, 16), (model["v"], True, 48, 16)]
    assert locate(packed * 1.001, index) is None


def test_the_tensorrt_lint_takes_blocked_int4_and_refuses_blocked_int8():
    w = np.random.default_rng(2).normal(size=(64, 32)).astype(np.float32)
    for bits, expected in ((4, []), (8, ["blocked quantization of INT8"])):
        model = matmul_model({"w": w}, 64)
        rewrite(model, Scheme(bits, 32, "rtn", True, DEQUANTIZE), 0)
        found = [f.problem for f in trt_lint.errors(trt_lint.lint_model(model, "m"))]
        assert [p.split(";")[0] for p in found] == expected, found
