"""Family-specific checks that need no exported fixture: configs refused with the fix named,
and float16 numerics computed where Hugging Face computes them."""
from __future__ import annotations

import pytest
import torch

import tiny
from ssd_export.parity import check_parity
from ssd_graphs.registry import REGISTRY
from ssd_graphs.trace import export_decoder
from ssd_runtime.errors import ConfigError


def test_gptj_scores_are_float32_in_a_float16_graph(tmp_path):
    """Hugging Face's GPT-J computes q·k in float32 (float16 overflows past 65504 on a GPU;
    ONNX Runtime's CPU kernels upcast float16 MatMuls anyway, so only the graph can show it):
    each layer's score MatMul reads float32, the rest stays float16, and parity holds."""
    import onnx
    from onnx import TensorProto
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny.config_for("gptj", tiny.VOCAB),
                                             attn_implementation="eager").eval().half()
    traced = export_decoder(model, "gptj", tmp_path / "model.onnx", 64)
    check_parity(model, traced.path, "target", 8, "float16", 64)
    graph = onnx.shape_inference.infer_shapes(
        onnx.load(str(traced.path), load_external_data=False)).graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    reads = [tuple(types.get(i) for i in n.input) for n in graph.node if n.op_type == "MatMul"]
    assert reads.count((TensorProto.FLOAT, TensorProto.FLOAT)) == traced.num_layers
    assert (TensorProto.FLOAT16, TensorProto.FLOAT16) in reads

def test_bidirectional_gemma3_is_refused():
    config = tiny.config_for("gemma3", tiny.VOCAB, use_bidirectional_attention=True)
    with pytest.raises(ConfigError, match=r"use_bidirectional_attention.*causal attention"):
        REGISTRY["Gemma3ForCausalLM"](config)


def test_bloom_residual_after_the_norms_is_refused():
    config = tiny.config_for("bloom", tiny.VOCAB, apply_residual_connection_post_layernorm=True)
    with pytest.raises(ConfigError, match=r"apply_residual_connection_post_layernorm=True .*not "
                                          r"supported"):
        REGISTRY["BloomForCausalLM"](config)


def test_ministral3_without_its_query_scale_is_refused():
    config = tiny.config_for("ministral3", tiny.VOCAB,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    with pytest.raises(ConfigError, match=r"llama_4_scaling_beta and "
                                          r"original_max_position_embeddings.*---> HINT"):
        REGISTRY["Ministral3ForCausalLM"](config)

@pytest.mark.parametrize("kind", ["olmo", "ernie4_5", "cohere2"])
def test_float16_rope_is_computed_where_hugging_face_computes_it(kind):
    """OLMo and ERNIE 4.5 rotate in float32 from float32 cos/sin, Cohere in float32 from cos/sin
    rounded to float16: the wrapper's layer-0 keys in float16 equal Hugging Face's bit for bit
    (rotating in float16 differs in the last bits)."""
    from transformers import AutoModelForCausalLM

    from ssd_graphs.decoder import Decoder
    from ssd_graphs.registry import adapter_for

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny.config_for(kind, tiny.VOCAB),
                                             attn_implementation="eager").eval().half()
    decoder = Decoder(model, adapter_for(model, kind)).eval()
    ids = torch.randint(3, tiny.VOCAB, (1, 20))
    past = [torch.zeros(1, 0, decoder.num_kv_heads, decoder.head_dim, dtype=torch.float16)] * (
        2 * len(decoder.layers))
    with torch.no_grad():
        keys = decoder(ids, torch.arange(20)[None], *past)[1]             # (1, 20, Hkv, D)
        ref = model(ids, use_cache=True)["cache"].layers[0].keys          # (1, Hkv, S, D)
    ref = ref.transpose(1, 2)                 # a sliding layer keeps only its last rows
    assert torch.equal(keys[:, -ref.shape[1]:], ref)


def test_per_layer_moe_top_k_is_refused():
    config = tiny.config_for("hunyuan_v1_moe", tiny.VOCAB, moe_topk=[2, 1])
    with pytest.raises(ConfigError, match=r"per-layer moe_topk \[2, 1\].*one top-k"):
        REGISTRY["HunYuanMoEV1ForCausalLM"](config)


def test_unknown_deepseek_v2_routing_is_refused():
    config = tiny.config_for("deepseek_v2", tiny.VOCAB, topk_method="noaux_tc")
    with pytest.raises(ConfigError, match=r"topk_method 'noaux_tc'.*'greedy' and "):
        REGISTRY["DeepseekV2ForCausalLM"](config)


def test_moe_kernel_takes_router_logits_in_the_experts_dtype():
    """HunYuan keeps its router in float32 in a float16 model (and Hugging Face casts h up);
    ONNX Runtime's MoE kernel takes the logits in the experts' dtype: dense in the ort flavour."""
    from transformers import AutoModelForCausalLM

    from ssd_graphs.decoder import Decoder
    from ssd_graphs.registry import adapter_for

    config = tiny.config_for("hunyuan_v1_moe", tiny.VOCAB, layers=1)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float16).eval()
    decoder = Decoder(model, adapter_for(model, "hunyuan"), "ort", 64, "hunyuan")
    assert decoder.moe_kind == "dense" and "router's weights are float32" in decoder.moe_note
    assert Decoder(model.float(), adapter_for(model, "hunyuan"), "ort", 64).moe_kind == "kernel"
