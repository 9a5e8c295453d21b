"""The static flavour (caches written in place by ScatterND, attention masked by position)
reproduces the Hugging Face models, on one case of each attention feature: GQA, windows +
soft-capping, ALiBi (bfloat16 and the model's dtype), learned positions, MLA, sinks, q/k
norms, MoE, partial rotary; and the fused layer on each feature it takes."""
from __future__ import annotations

import pytest

from parity_cases import assert_parity

STATIC_CASES = ["llama", "gemma2", "falcon_alibi", "bloom", "gpt2", "deepseek_v3", "gpt_oss",
                "qwen3", "mixtral", "phi", "cohere2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", STATIC_CASES)
def test_static_flavour_parity_with_hugging_face(models, name):
    assert_parity(models, name, "static")


# The fused layer (graphs/fused.py: SkipSimplifiedLayerNormalization, RotaryEmbedding and
# Attention of opset 23), on each feature it takes: sliding windows (mistral; ministral's
# mixed layers), layers without RoPE (smollm3), interleaved partial rotary (glm), interleaved
# whole-head rotary with [gate | up] packed (helium), q/k/v biases (qwen2), partial rotary
# (phi3's variant), scaled tables (yarn), MoE layers with a shared expert (qwen2_moe). Of the
# cases above llama and mixtral take it too; the others keep the plain layer (LayerNorms,
# Gemma's norms, q/k norms, one query head per key head, sinks, ALiBi, soft-capping, MLA).
FUSED_CASES = ["mistral", "ministral", "smollm3", "glm", "helium", "qwen2",
               "phi3_partial_rotary", "rope_yarn", "qwen2_moe"]


@pytest.mark.slow
@pytest.mark.parametrize("name", FUSED_CASES)
def test_the_fused_static_layer_has_parity_with_hugging_face(models, name):
    import onnx

    from parity_cases import traced

    assert_parity(models, name, "static")
    graph = onnx.load(str(traced(models, name, "static").path), load_external_data=False)
    ops = {n.op_type for n in graph.graph.node}
    assert {"SkipSimplifiedLayerNormalization", "RotaryEmbedding", "Attention"} <= ops, ops
