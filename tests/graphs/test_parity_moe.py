"""Mixture-of-experts families and their config variants: exported graphs reproduce the
Hugging Face models in both flavours (dense in standard ONNX, on ONNX Runtime's MoE kernel in
the ort flavour where it fits), and unsupported routers are refused."""
from __future__ import annotations

import pytest
import torch

from parity_cases import MOE, MOE_VARIANTS, assert_parity, flavours, hf_model, traced
from ssd_runtime.errors import ConfigError


@pytest.mark.slow
@pytest.mark.parametrize("name,graph", flavours([*MOE, *MOE_VARIANTS]))
def test_parity_with_hugging_face(models, name, graph):
    assert_parity(models, name, graph)


@pytest.mark.slow
def test_moe_runs_dense_in_plain_onnx_and_on_the_kernel_in_the_ort_flavour(models):
    import onnx

    from ssd_graphs.decoder import Decoder
    from ssd_graphs.registry import adapter_for

    def ops(path):
        return {(n.domain, n.op_type) for n in onnx.load(str(path), load_external_data=False)
                .graph.node}

    dense = traced(models, "qwen3_moe")
    assert dense.moe_note.startswith("MoE exported dense: all 4 experts run for every token, "
                                      "2x the routed experts' compute")
    assert ("com.microsoft", "MoE") not in ops(dense.path) and ("", "TopK") in ops(dense.path)
    kernel = traced(models, "qwen3_moe", "ort")
    assert ("com.microsoft", "MoE") in ops(kernel.path)
    assert "kernel: 2 of 4 experts run per token" in kernel.moe_note
    gelu = traced(models, "mixtral_gelu", "ort")
    assert ("com.microsoft", "MoE") not in ops(gelu.path)
    assert "dense" in gelu.moe_note and "SiLU experts, not gelu" in gelu.moe_note
    biased = traced(models, "ernie4_5_moe", "ort")      # a selection-only bias: dense in ort too
    assert ("com.microsoft", "MoE") not in ops(biased.path)
    assert "dense" in biased.moe_note and "not this model's routing" in biased.moe_note
    clamped = traced(models, "gpt_oss", "ort")                      # clamped SwiGLU
    assert ("com.microsoft", "MoE") in ops(clamped.path)
    llama, _ = hf_model(models, "llama")
    assert Decoder(llama, adapter_for(llama, "llama"), source="llama").moe_note == ""


@pytest.mark.parametrize("change,match", [
    ("router_bias", r"layer 0's mixture-of-experts block has a router \(Qwen3MoeTopKRouter\) "
                    r"that is not a bias-free linear map.*top-k routing"),
    ("experts_bias", r"layer 0's mixture-of-experts block stores its experts "
                     r"\(Qwen3MoeExperts: has_bias=True without gate_up_proj_bias"),
    ("top_k", r"routes to the top 5 of 4 logits over 4 experts"),
])
def test_unsupported_moe_variants_are_refused(models, change, match):
    from dataclasses import replace

    from ssd_graphs.registry import adapter_for
    from ssd_graphs.decoder import Decoder

    model, _ = hf_model(models, "qwen3_moe")
    block = model.model.layers[0].mlp
    adapter = adapter_for(model, "qwen3_moe")
    if change == "router_bias":
        block.gate.bias = torch.nn.Parameter(torch.zeros(4))
    elif change == "experts_bias":
        block.experts.has_bias = True
    else:
        adapter = replace(adapter, moe=replace(adapter.moe, top_k=5))
    try:
        with pytest.raises(ConfigError, match=match):
            Decoder(model, adapter, source="qwen3_moe")
    finally:
        if change == "router_bias":
            del block.gate.bias
        block.experts.has_bias = False
