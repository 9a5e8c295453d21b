"""The static flavour's fused layer (graphs/fused.py, fused_ops.py; docs/design.md §12): its three
operators as the exporter writes and lowers them compute what their torch references do, the
references are the plain layer's maths, and the forms chosen keep a row's bits whatever else
the call computes, in ONNX Runtime itself."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ssd_graphs.fused import rms_eps
from ssd_graphs.fused_ops import grouped_attention, lower, rotary, skip_rms_norm, translation_table
from ssd_graphs.positions import Rope


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


class Three(torch.nn.Module):
    """One of each fused op, as the layer calls them."""

    def __init__(self, interleaved: int, rotary_dim: int) -> None:
        super().__init__()
        self.interleaved, self.rotary_dim = interleaved, rotary_dim
        self.weight = torch.nn.Parameter(torch.rand(48) + 0.5)

    def forward(self, x, skip, q, k, v, mask, cos, sin, pos):
        h, total = skip_rms_norm(x, skip, self.weight, 1e-5)
        rotated = rotary(q, cos, sin, pos, self.interleaved, self.rotary_dim)
        return h, total, rotated, grouped_attention(rotated, k, v, mask, 0.25)


@pytest.mark.parametrize("interleaved,rotary_dim", [(0, 0), (1, 0), (0, 8), (1, 8)])
def test_the_lowered_operators_compute_their_references(tmp_path, interleaved, rotary_dim):
    g = torch.Generator().manual_seed(0)
    B, N, S, L, D = 2, 3, 4, 7, 16
    rope = Rope(1.0 / 10000 ** (torch.arange(0, rotary_dim or D, 2).float() / (rotary_dim or D)),
                interleaved=bool(interleaved))
    freqs = torch.arange(32, dtype=torch.float32)[:, None] * rope.inv_freq
    mask = torch.where(torch.rand(B, 1, S, L, generator=g) < 0.3, -1e30, 0.0)
    args = (torch.randn(B, S, 48, generator=g), torch.randn(B, S, 48, generator=g),
            torch.randn(B, N, S, D, generator=g), torch.randn(B, N, L, D, generator=g),
            torch.randn(B, N, L, D, generator=g), mask, freqs.cos(), freqs.sin(),
            torch.tensor([[3, 4, 5, 6], [20, 21, 22, 23]]))
    module = Three(interleaved, rotary_dim).eval()
    path = tmp_path / "three.onnx"
    torch.onnx.export(module, args, dynamo=True, opset_version=18,
                      custom_translation_table=translation_table()).save(str(path))
    model = onnx.load(str(path))
    assert lower(model) and not lower(model)
    assert [n.op_type for n in model.graph.node if n.domain in ("", "com.microsoft")
            and n.op_type in ("SkipSimplifiedLayerNormalization", "RotaryEmbedding",
                              "Attention")] == ["SkipSimplifiedLayerNormalization",
                                                "RotaryEmbedding", "Attention"]
    assert {o.domain: o.version for o in model.opset_import}[""] == 23
    feeds = {i.name: a.numpy() for i, a in zip(model.graph.input, args)}
    got = session(model).run(None, feeds)
    with torch.no_grad():
        want = module(*args)
    for name, a, b in zip(("norm", "sum", "rotary", "attention"), got, want):
        assert np.allclose(a, b.numpy(), rtol=1e-5, atol=2e-6), name
    # the references are the plain layer's maths: RoPE as positions.Rope rotates
    cos, sin = rope.tables(args[-1], torch.float32)                  # (B, S, 1, R)
    plain = rope.apply(args[2].transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.allclose(want[2], plain, rtol=1e-6, atol=1e-6)


def test_only_a_plain_rms_norm_is_fused():
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    llama = LlamaRMSNorm(32, eps=1e-6)
    with torch.no_grad():
        llama.weight.uniform_(0.5, 1.5)
    assert rms_eps(llama) == 1e-6
    assert rms_eps(GemmaRMSNorm(32)) is None                    # 1 + weight
    assert rms_eps(torch.nn.LayerNorm(32)) is None              # centred, biased


def _attention(q, k, v, mask, **attrs) -> np.ndarray:
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["o"], scale=0.125, **attrs)
    graph = helper.make_graph([node], "a", [helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                                                           None) for n in "qkvm"],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    return session(model).run(None, {"q": q, "k": k, "v": v, "m": mask})[0]


def test_attention_keeps_a_rows_bits_only_with_the_query_heads_as_rows():
    """Why the fused layer hands Attention (B, Hkv, G·T, D): each product then runs on G·T >= 2
    rows, and a row's output has the same bits alone (a decode step) as among k+1 (a
    verification). With the query heads as heads (q_num_heads = H, M = T rows a product), a
    one-token call takes the one-row kernel and rounds otherwise: when that starts passing,
    an onnxruntime made it row-exact and design §12 can be revisited."""
    rng = np.random.default_rng(0)
    Hkv, G, T, L, D = 3, 3, 9, 40, 64
    q = rng.standard_normal((1, T, Hkv, G, D)).astype(np.float32)   # (B, T, Hkv, G, D)
    k, v = (rng.standard_normal((1, Hkv, L, D)).astype(np.float32) for _ in range(2))
    visible = np.arange(L)[None, :] <= 30 + np.arange(T)[:, None]  # token t sees keys <= 30+t
    mask = np.where(visible, 0.0, -1e30).astype(np.float32)        # (T, L)

    def grouped(t0: int, n: int) -> np.ndarray:                    # tokens t0..t0+n-1
        rows = q[:, t0:t0 + n].transpose(0, 2, 3, 1, 4).reshape(1, Hkv, G * n, D)
        m = np.broadcast_to(mask[t0:t0 + n], (G, n, L)).reshape(1, 1, G * n, L)
        out = _attention(np.ascontiguousarray(rows), k, v, np.ascontiguousarray(m))
        return out.reshape(1, Hkv, G, n, D).transpose(0, 3, 1, 2, 4)

    def by_heads(t0: int, n: int) -> np.ndarray:
        heads = np.ascontiguousarray(q[:, t0:t0 + n].reshape(1, n, Hkv * G, D).transpose(0, 2, 1, 3))
        out = _attention(heads, k, v, np.ascontiguousarray(mask[None, None, t0:t0 + n]),
                         q_num_heads=Hkv * G, kv_num_heads=Hkv)
        return out.transpose(0, 2, 1, 3).reshape(1, n, Hkv, G, D)

    together = grouped(0, T)
    assert all((grouped(t, 1) == together[:, t:t + 1]).all() for t in range(T))
    together = by_heads(0, T)
    assert not all((by_heads(t, 1) == together[:, t:t + 1]).all() for t in range(T))


@pytest.mark.parametrize("bits", [None, 4, 8])
def test_a_packed_projections_columns_are_the_separate_ones_bit_for_bit(bits):
    """[gate | up] as one MatMul (float) or MatMulNBits (int4, int8 at level 4) gives each
    column the bits of the same column computed alone: packing changes no logit."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 MatMulNBitsQuantizer)

    rng = np.random.default_rng(1)
    K, N = 128, 96
    w = [(rng.standard_normal((K, N)) * 0.05).astype(np.float32) for _ in range(2)]

    def model(weights):
        names = [f"w{i}" for i in range(len(weights))]
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", n], [f"y{n}"]) for n in names], "p",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
            [helper.make_tensor_value_info(f"y{n}", TensorProto.FLOAT, None) for n in names],
            [numpy_helper.from_array(a, n) for a, n in zip(weights, names)])
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        if bits is None:
            return m
        q = MatMulNBitsQuantizer(m, algo_config=DefaultWeightOnlyQuantConfig(
            block_size=32, is_symmetric=True, accuracy_level=4, bits=bits))
        q.process()
        return q.model.model

    separate, packed = session(model(w)), session(model([np.concatenate(w, axis=1)]))
    for rows in (1, 2, 9):
        x = rng.standard_normal((1, rows, K)).astype(np.float32)
        (both,) = packed.run(None, {"x": x})
        assert (np.concatenate(separate.run(None, {"x": x}), axis=-1) == both).all(), rows


def test_a_fused_bundle_says_so_and_an_onnxruntime_without_opset_23_is_refused_by_name(
        bundle_factory, monkeypatch):
    """The manifest records the fused layer (schema 12), and an onnxruntime that would refuse
    opset 23 with an error of its own gets the runtime's, naming the release and the fix."""
    from ssd_runtime import Generator
    from ssd_runtime.errors import BackendError
    from ssd_runtime.manifest import read_manifest

    bundle = bundle_factory("llama", "llama_cut", graph="static")
    manifest = read_manifest(bundle)
    assert manifest.target.fused and manifest.target.graph == "static"
    ops = {n.op_type for n in onnx.load(str(bundle / manifest.target.path),
                                        load_external_data=False).graph.node}
    assert {"Attention", "RotaryEmbedding"} <= ops
    monkeypatch.setattr("onnxruntime.__version__", "1.22.1")
    with pytest.raises(BackendError, match=r"the target graph has the fused layer's opset-23 "
                                           r"operators, which onnxruntime 1\.22\.1 runs wrongly "
                                           r"or not at all \(it needs 1\.23 or newer\).*"
                                           r"pip install -U 'onnxruntime>=1\.23'"):
        Generator.load(bundle)
