"""Exported graphs reproduce the Hugging Face models (ONNX Runtime CPU vs PyTorch)."""
from __future__ import annotations

import pytest
import torch

import tiny
from ssd_export.parity import check_parity
from ssd_graphs.registry import REGISTRY
from ssd_graphs.trace import export_decoder
from ssd_runtime.errors import ConfigError, ParityError

MAX_CONTEXT = 256

# fixture models (conftest `models`): name -> Hugging Face class
CASES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
         "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM",
         "gemma2": "Gemma2ForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM",
         "opt": "OPTForCausalLM", "falcon": "FalconForCausalLM",
         "falcon_alibi": "FalconForCausalLM", "falcon_new": "FalconForCausalLM",
         "gemma3": "Gemma3ForCausalLM", "starcoder2": "Starcoder2ForCausalLM",
         "granite": "GraniteForCausalLM", "olmo2": "Olmo2ForCausalLM",
         "smollm3": "SmolLM3ForCausalLM", "phi": "PhiForCausalLM",
         "stablelm": "StableLmForCausalLM", "gpt_bigcode": "GPTBigCodeForCausalLM",
         "gptj": "GPTJForCausalLM", "cohere": "CohereForCausalLM",
         "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
         "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM",
         "granitemoe": "GraniteMoeForCausalLM", "granitemoeshared": "GraniteMoeSharedForCausalLM",
         "gpt_oss": "GptOssForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
         "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
         "dots1": "Dots1ForCausalLM", "phimoe": "PhimoeForCausalLM",
         "deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM",
         "ministral": "MinistralForCausalLM", "exaone4": "Exaone4ForCausalLM",
         "glm4": "Glm4ForCausalLM", "glm": "GlmForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
         "hunyuan": "HunYuanDenseV1ForCausalLM", "olmo3": "Olmo3ForCausalLM",
         "olmo": "OlmoForCausalLM", "seed_oss": "SeedOssForCausalLM",
         "cohere2": "Cohere2ForCausalLM", "vaultgemma": "VaultGemmaForCausalLM",
         "ministral3": "Ministral3ForCausalLM"}
# legacy and misc
CASES.update({"nemotron": "NemotronForCausalLM", "arcee": "ArceeForCausalLM",
              "helium": "HeliumForCausalLM", "apertus": "ApertusForCausalLM",
              "gpt_neo": "GPTNeoForCausalLM", "bloom": "BloomForCausalLM",
              "mpt": "MptForCausalLM", "codegen": "CodeGenForCausalLM"})

_ROPE = {"rope_theta": 10000.0}
# config variants built in memory: name -> (tiny kind, config overrides, max_context)
VARIANTS = {
    "rope_linear": ("llama", {"rope_parameters": {**_ROPE, "rope_type": "linear", "factor": 2.0}},
                    MAX_CONTEXT),
    "rope_llama3": ("llama", {"rope_parameters": {
        **_ROPE, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}, MAX_CONTEXT),
    "rope_yarn": ("qwen2", {"rope_parameters": {
        **_ROPE, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
        MAX_CONTEXT),
    "rope_dynamic": ("llama", {"rope_parameters": {**_ROPE, "rope_type": "dynamic", "factor": 2.0}},
                     MAX_CONTEXT),
    # longrope keeps its short factors up to original_max_position_embeddings: export up to it
    "phi3_longrope": ("phi3", {"original_max_position_embeddings": 64, "rope_parameters": {
        **_ROPE, "rope_type": "longrope", "short_factor": [1.5] * 8, "long_factor": [4.0] * 8}},
        64),
    "phi3_partial_rotary": ("phi3", {"partial_rotary_factor": 0.5}, MAX_CONTEXT),
    "llama_tied": ("llama", {"tie_word_embeddings": True}, MAX_CONTEXT),
    # heads of 24: GroupQueryAttention rotates only multiples of 16, so RoPE stays in the graph
    "llama_head_24": ("llama", {"head_dim": 24}, MAX_CONTEXT),
    "gpt2_layer_scaled": ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, MAX_CONTEXT),
    "gpt_neox_sequential": ("gpt_neox", {"use_parallel_residual": False, "rotary_pct": 0.5},
                            MAX_CONTEXT),
    # OPT-350m style: post-norm, no final norm, embeddings projected in and out
    "opt_post_norm": ("opt", {"do_layer_norm_before": False, "word_embed_proj_dim": 32},
                      MAX_CONTEXT),
    "falcon_new_one_norm": ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2,
                                       "num_ln_in_parallel_attn": 1}, MAX_CONTEXT),
    "falcon_sequential_rope": ("falcon", {"multi_query": False, "parallel_attn": False},
                               MAX_CONTEXT),
    # StableLM 2 12B style: parallel residual, per-head q/k LayerNorms read heads-first
    "stablelm_parallel_qk_norm": ("stablelm", {"use_parallel_residual": True,
                                               "qk_layernorm": True}, MAX_CONTEXT),
    "gpt_bigcode_mha": ("gpt_bigcode", {"multi_query": False}, MAX_CONTEXT),  # per head [q, k, v]
    "cohere_qk_norm": ("cohere", {"use_qk_norm": True}, MAX_CONTEXT),   # Command R+ style
    # MoE on every other layer (decoder_sparse_step), top-k weights not renormalised
    "qwen3_moe_sparse_step": ("qwen3_moe", {"num_hidden_layers": 3, "mlp_only_layers": [],
                                            "decoder_sparse_step": 2, "norm_topk_prob": False},
                              MAX_CONTEXT),
    "olmoe_clip_qkv": ("olmoe", {"clip_qkv": 1.0, "norm_topk_prob": True}, MAX_CONTEXT),
    # GELU experts: no ONNX Runtime MoE kernel for them, so dense in the ort flavour too
    "mixtral_gelu": ("mixtral", {"hidden_act": "gelu"}, MAX_CONTEXT),
    "mpt_clip_qkv": ("mpt", {"attn_config": {"clip_qkv": 0.5, "softmax_scale": 0.2}},
                     MAX_CONTEXT),
    # EXAONE 4 without a sliding window: RoPE on every layer
    "exaone4_no_window": ("exaone4", {"sliding_window": None,
                                      "layer_types": ["full_attention"] * 2}, MAX_CONTEXT),
    # Phi-3.5-MoE's longrope: cos/sin scaled by short_mscale (not the rotary module's
    # attention_scaling) up to original_max_position_embeddings; a sliding window
    "phimoe_longrope": ("phimoe", {"sliding_window": 8, "rope_parameters": {
        **_ROPE, "rope_type": "longrope", "short_factor": [1.5] * 8, "long_factor": [4.0] * 8,
        "short_mscale": 1.25, "long_mscale": 1.5, "original_max_position_embeddings": 64}}, 64),
    # DeepSeek V3 without a query rank, plain rotate-half RoPE, biased projections and YaRN
    # whose mscale_all_dim scales the attention
    "deepseek_v3_yarn": ("deepseek_v3", {"q_lora_rank": None, "rope_interleave": False,
                                         "attention_bias": True, "rope_parameters": {
        **_ROPE, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}},
        MAX_CONTEXT),
    # Hunyuan-A13B's RoPE: labelled dynamic, static frequencies from a fixed NTK alpha
    "hunyuan_ntk_alpha": ("hunyuan_v1_moe", {"rope_parameters": {
        **_ROPE, "rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0}}, MAX_CONTEXT),
}


def test_every_registered_architecture_has_a_parity_case():
    missing = sorted(set(REGISTRY) - set(CASES.values()))
    assert not missing, f"architectures without a parity case: {missing}"


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
    """name -> (Hugging Face model, traced graph, max_context) for every case and variant."""
    from transformers import AutoModelForCausalLM

    out = {}
    root = tmp_path_factory.mktemp("parity")
    for name, arch in CASES.items():
        model = AutoModelForCausalLM.from_pretrained(models[name], attn_implementation="eager").eval()
        assert type(model).__name__ == arch
        out[name] = (model, export_decoder(model, name, root / name / "model.onnx", MAX_CONTEXT),
                     MAX_CONTEXT)
    for name, (kind, overrides, max_context) in VARIANTS.items():
        torch.manual_seed(len(name))
        config = tiny.config_for(kind, tiny.VOCAB, **overrides)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
        out[name] = (model, export_decoder(model, name, root / name / "model.onnx", max_context),
                     max_context)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", [*CASES, *VARIANTS])
def test_parity_with_hugging_face(exported, name):
    model, traced, max_context = exported[name]
    diffs = check_parity(model, traced.path, "target", max_draft=8, dtype="float32",
                         max_context=max_context)
    assert diffs["logits"] < 1e-3, diffs
    assert diffs["new_key"] < 1e-3 and diffs["new_value"] < 1e-3, diffs


@pytest.fixture(scope="module")
def exported_ort(exported, tmp_path_factory):
    """The same models in the "ort" flavour (GroupQueryAttention, caches updated in place)."""
    root = tmp_path_factory.mktemp("parity_ort")
    return {name: export_decoder(model, name, root / name / "model.onnx", max_context, graph="ort")
            for name, (model, _, max_context) in exported.items() if name not in NO_ORT}


# ALiBi: GroupQueryAttention takes no per-head slopes
NO_ORT = {"falcon_alibi", "bloom", "mpt", "mpt_clip_qkv"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted({*CASES, *VARIANTS} - NO_ORT))
def test_ort_flavour_parity_with_hugging_face(exported, exported_ort, name):
    model, _, max_context = exported[name]
    diffs = check_parity(model, exported_ort[name].path, "target", max_draft=8, dtype="float32",
                         max_context=max_context, graph="ort")
    assert diffs["logits"] < 1e-3, diffs
    assert diffs["new_key"] < 1e-3 and diffs["new_value"] < 1e-3, diffs


# the static flavour (caches written in place by ScatterND, attention masked by position) on
# one case of each attention feature: GQA, windows + soft-capping, ALiBi (bfloat16 and the
# model's dtype), learned positions, MLA, sinks, q/k norms, MoE, partial rotary
STATIC_CASES = ["llama", "gemma2", "falcon_alibi", "bloom", "gpt2", "deepseek_v3", "gpt_oss",
                "qwen3", "mixtral", "phi", "cohere2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", STATIC_CASES)
def test_static_flavour_parity_with_hugging_face(exported, tmp_path, name):
    model, _, max_context = exported[name]
    traced = export_decoder(model, name, tmp_path / "model.onnx", max_context, graph="static")
    diffs = check_parity(model, traced.path, "target", max_draft=8, dtype="float32",
                         max_context=max_context, graph="static")
    assert diffs["logits"] < 1e-3, diffs
    assert diffs["new_key"] < 1e-3 and diffs["new_value"] < 1e-3, diffs


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NO_ORT))
def test_ort_flavour_refuses_alibi_naming_the_fix(exported, tmp_path, name):
    model, _, _ = exported[name]
    with pytest.raises(ConfigError, match=r"no ALiBi.*--graph standard"):
        export_decoder(model, name, tmp_path / "model.onnx", 64, graph="ort")


def test_ort_flavour_refuses_a_head_size_not_a_multiple_of_8(tmp_path):
    """GroupQueryAttention takes head sizes that are multiples of 8 only; a model with heads of
    20 used to export and then fail inside ONNX Runtime with a bare RuntimeError."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny.config_for("phi", tiny.VOCAB, layers=1,
                                                             hidden=80)).eval()
    with pytest.raises(ConfigError, match=r"multiple of 8.*is 20.*--graph standard"):
        export_decoder(model, "phi", tmp_path / "model.onnx", 64, graph="ort")


@pytest.mark.slow
def test_parity_catches_a_wrong_graph(exported):
    model, traced, _ = exported["llama"]
    layer = model.model.layers[0].self_attn.k_proj
    saved = layer.weight.detach().clone()
    try:
        with torch.no_grad():
            layer.weight.mul_(1.5)      # the graph no longer matches the model
        with pytest.raises(ParityError, match=r"differs from the Hugging Face model at past_len"):
            check_parity(model, traced.path, "target", 8, "float32", 256)
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved)


@pytest.mark.slow
def test_parity_fails_a_graph_that_gives_nan(exported, tmp_path):
    """NaN compares False against any tolerance: a NaN output used to pass parity."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model, traced, _ = exported["llama"]
    graph = onnx.load(str(traced.path))
    norm = next(t for t in graph.graph.initializer if t.name.endswith("norm.weight"))
    norm.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(norm).shape, np.nan,
                                                  np.float32), norm.name))
    onnx.save(graph, str(tmp_path / "model.onnx"))
    with pytest.raises(ParityError, match=r"max \|diff\| logits nan"):
        check_parity(model, tmp_path / "model.onnx", "target", 8, "float32", 256)


def test_parity_refuses_a_model_that_overflows_in_hugging_face_itself(tmp_path):
    """float16 activations past 65504 give inf logits in Hugging Face too: inf - inf is NaN and
    the limit itself inf, so parity used to pass such a bundle."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny.config_for("llama", tiny.VOCAB, layers=1),
                                             attn_implementation="eager").eval().half()
    with torch.no_grad():
        model.model.norm.weight.fill_(3e4)          # logits past float16's range
    with pytest.raises(ConfigError, match=r"non-finite logits.*float16.*--dtype float32"):
        check_parity(model, tmp_path / "unused.onnx", "target", 8, "float16", 64)


def test_kv_comparison_reads_cropped_and_repeated_caches():
    """Gemma 2's sliding layers keep only their last rows; Falcon's new architecture stores
    each KV head once per query of its group: parity compares the rows and heads there are."""
    import numpy as np

    from ssd_export.parity import _kv_diff

    full = np.random.default_rng(0).normal(size=(1, 13, 2, 4)).astype(np.float32)  # (1, S, Hkv, D)
    ref = np.repeat(full, 2, axis=2)[:, 8:]       # HF: rows 8..12 kept, each head twice
    ours = full[:, 10:13].copy()                  # new rows at past_len 10
    assert _kv_diff(ours, 8, ref, past_len=10) == 0.0
    ours[0, 1, 1, 3] += 0.5
    assert _kv_diff(ours, 8, ref, past_len=10) == pytest.approx(0.5)
    assert _kv_diff(full[:, :3], 8, ref, past_len=0) is None     # rows 0..2 were dropped


@pytest.mark.slow
def test_longrope_past_its_original_context_is_refused(exported, tmp_path):
    model, _, _ = exported["phi3_longrope"]
    with pytest.raises(ConfigError, match=r"RoPE type 'longrope' changes its frequencies past 64 "
                                          r"positions.*--max-context 64 or less"):
        export_decoder(model, "phi3_longrope", tmp_path / "model.onnx", max_context=65)


@pytest.mark.slow
def test_unknown_rope_type_is_refused(exported, tmp_path):
    model, _, _ = exported["llama"]
    saved = model.config.rope_parameters
    model.config.rope_parameters = {**saved, "rope_type": "made_up"}
    try:
        with pytest.raises(ConfigError, match=r"RoPE type 'made_up' is not supported; supported: "
                                              r"default, linear, llama3, yarn, dynamic, longrope"):
            export_decoder(model, "llama", tmp_path / "model.onnx", max_context=64)
    finally:
        model.config.rope_parameters = saved


def test_sliding_window_is_exercised(models):
    """The sliding-window fixtures' windows are shorter than parity's longest sequence."""
    from transformers import AutoConfig

    for name in ("mistral", "gemma2", "gemma3", "starcoder2", "ministral", "exaone4", "olmo3",
                 "cohere2", "vaultgemma"):
        assert AutoConfig.from_pretrained(models[name]).sliding_window < 24
    gpt_neo = AutoConfig.from_pretrained(models["gpt_neo"])        # a global and a local layer
    assert gpt_neo.window_size < 24 and set(gpt_neo.attention_layers) == {"global", "local"}


def test_per_layer_rope_is_exercised(models):
    """Gemma 3's fixture has a sliding and a full layer with different RoPE bases; SmolLM3's
    has a layer with RoPE and one without."""
    from transformers import AutoConfig

    gemma3 = AutoConfig.from_pretrained(models["gemma3"])
    assert set(gemma3.layer_types) == {"sliding_attention", "full_attention"}
    assert len({p["rope_theta"] for p in gemma3.rope_parameters.values()}) == 2
    assert set(AutoConfig.from_pretrained(models["smollm3"]).no_rope_layers) == {0, 1}


@pytest.mark.slow
def test_moe_runs_dense_in_plain_onnx_and_on_the_kernel_in_the_ort_flavour(exported,
                                                                            exported_ort):
    import onnx

    def ops(path):
        return {(n.domain, n.op_type) for n in onnx.load(str(path), load_external_data=False)
                .graph.node}

    _, traced, _ = exported["qwen3_moe"]
    assert traced.moe_note.startswith("MoE exported dense: all 4 experts run for every token, "
                                      "2x the routed experts' compute")
    assert ("com.microsoft", "MoE") not in ops(traced.path) and ("", "TopK") in ops(traced.path)
    assert ("com.microsoft", "MoE") in ops(exported_ort["qwen3_moe"].path)
    assert "kernel: 2 of 4 experts run per token" in exported_ort["qwen3_moe"].moe_note
    gelu = exported_ort["mixtral_gelu"]
    assert ("com.microsoft", "MoE") not in ops(gelu.path)
    assert "dense" in gelu.moe_note and "SiLU experts, not gelu" in gelu.moe_note
    biased = exported_ort["ernie4_5_moe"]           # a selection-only bias: dense in ort too
    assert ("com.microsoft", "MoE") not in ops(biased.path)
    assert "dense" in biased.moe_note and "not this model's routing" in biased.moe_note
    assert ("com.microsoft", "MoE") in ops(exported_ort["gpt_oss"].path)   # clamped SwiGLU
    assert exported["llama"][1].moe_note == ""


def test_qwen3_moe_mixes_dense_and_moe_layers(models):
    """The fixture's first layer has experts, its second (mlp_only_layers) a dense MLP."""
    from transformers import AutoConfig

    assert REGISTRY["Qwen3MoeForCausalLM"](AutoConfig.from_pretrained(
        models["qwen3_moe"])).moe.layers == (0,)


@pytest.mark.parametrize("change,match", [
    ("router_bias", r"layer 0's mixture-of-experts block has a router \(Qwen3MoeTopKRouter\) "
                    r"that is not a bias-free linear map.*top-k routing"),
    ("experts_bias", r"layer 0's mixture-of-experts block stores its experts "
                     r"\(Qwen3MoeExperts: has_bias=True without gate_up_proj_bias"),
    ("top_k", r"routes to the top 5 of 4 logits over 4 experts"),
])
@pytest.mark.slow
def test_unsupported_moe_variants_are_refused(exported, change, match):
    from dataclasses import replace

    from ssd_graphs.registry import adapter_for
    from ssd_graphs.decoder import Decoder

    model, _, _ = exported["qwen3_moe"]
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
