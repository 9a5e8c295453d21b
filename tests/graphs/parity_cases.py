"""The parity cases (every registered architecture and the config variants) and a per-process
cache of their Hugging Face models and exported graphs, shared by the test_parity*.py files.

The cases are split over several files so that `make test`'s two workers (one file at a
time each, `--dist loadfile`) share the ~150 exports: in one file they were the whole run's
critical path (one worker exporting for 40+ minutes while the other had finished).
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch

import export_cache
import tiny

MAX_CONTEXT = 256

# fixture models (conftest `models`): name -> Hugging Face class, in four groups
FIRST = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
         "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM",
         "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gpt2": "GPT2LMHeadModel",
         "gpt_neox": "GPTNeoXForCausalLM", "opt": "OPTForCausalLM",
         "falcon": "FalconForCausalLM", "falcon_alibi": "FalconForCausalLM",
         "falcon_new": "FalconForCausalLM", "gemma3": "Gemma3ForCausalLM",
         "starcoder2": "Starcoder2ForCausalLM", "granite": "GraniteForCausalLM",
         "olmo2": "Olmo2ForCausalLM", "smollm3": "SmolLM3ForCausalLM", "phi": "PhiForCausalLM",
         "stablelm": "StableLmForCausalLM", "gpt_bigcode": "GPTBigCodeForCausalLM",
         "gptj": "GPTJForCausalLM", "cohere": "CohereForCausalLM"}
MOE = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
       "mixtral": "MixtralForCausalLM", "olmoe": "OlmoeForCausalLM",
       "granitemoe": "GraniteMoeForCausalLM", "granitemoeshared": "GraniteMoeSharedForCausalLM",
       "gpt_oss": "GptOssForCausalLM", "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
       "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM", "glm4_moe": "Glm4MoeForCausalLM",
       "dots1": "Dots1ForCausalLM", "phimoe": "PhimoeForCausalLM",
       "deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v2": "DeepseekV2ForCausalLM"}
# later dense families, then legacy and misc
LATER = {"ministral": "MinistralForCausalLM", "exaone4": "Exaone4ForCausalLM",
         "glm4": "Glm4ForCausalLM", "glm": "GlmForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
         "hunyuan": "HunYuanDenseV1ForCausalLM", "olmo3": "Olmo3ForCausalLM",
         "olmo": "OlmoForCausalLM", "seed_oss": "SeedOssForCausalLM",
         "cohere2": "Cohere2ForCausalLM", "vaultgemma": "VaultGemmaForCausalLM",
         "ministral3": "Ministral3ForCausalLM",
         "nemotron": "NemotronForCausalLM", "arcee": "ArceeForCausalLM",
         "helium": "HeliumForCausalLM", "apertus": "ApertusForCausalLM",
         "gpt_neo": "GPTNeoForCausalLM", "bloom": "BloomForCausalLM",
         "mpt": "MptForCausalLM", "codegen": "CodeGenForCausalLM"}
CASES = {**FIRST, **MOE, **LATER}

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

# the variants of mixture-of-experts families go with them (test_parity_moe.py)
MOE_VARIANTS = [name for name, (kind, _, _) in VARIANTS.items() if kind in MOE]
DENSE_VARIANTS = [name for name in VARIANTS if name not in MOE_VARIANTS]

# ALiBi: GroupQueryAttention takes no per-head slopes
NO_ORT = {"falcon_alibi", "bloom", "mpt", "mpt_clip_qkv"}



def flavours(names) -> list[tuple[str, str]]:
    """(name, graph) for each case in the standard flavour and, where it has no ALiBi, the ort
    flavour."""
    return [(n, g) for n in names for g in ("standard", "ort")
            if g == "standard" or n not in NO_ORT]


# what one process has built: name -> (model, max_context); (name, graph) -> TracedModel
_MODELS: dict[str, tuple] = {}
_TRACED: dict[tuple[str, str], object] = {}


@functools.cache
def _root() -> Path:
    """Where this process writes its parity exports, removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="parity-"))
    atexit.register(shutil.rmtree, root, True)
    return root


def hf_model(models: dict[str, Path], name: str) -> tuple:
    """(Hugging Face model, max_context) of a case or variant, built once per process."""
    if name not in _MODELS:
        from transformers import AutoModelForCausalLM

        if name in CASES:
            model = AutoModelForCausalLM.from_pretrained(models[name],
                                                         attn_implementation="eager").eval()
            assert type(model).__name__ == CASES[name]
            _MODELS[name] = (model, MAX_CONTEXT)
        else:
            kind, overrides, max_context = VARIANTS[name]
            torch.manual_seed(len(name))
            config = tiny.config_for(kind, tiny.VOCAB, **overrides)
            _MODELS[name] = (AutoModelForCausalLM.from_config(
                config, attn_implementation="eager").eval(), max_context)
    return _MODELS[name]


def traced(models: dict[str, Path], name: str, graph: str = "standard"):
    """The case exported in that flavour (a TracedModel), once per process and, by its inputs'
    hash, once per cache (export_cache.py)."""
    from ssd_graphs.trace import export_decoder

    if (name, graph) not in _TRACED:
        model, max_context = hf_model(models, name)
        _TRACED[name, graph] = export_cache.traced(
            export_decoder, model, name, _root() / graph / name / "model.onnx", max_context, graph)
    return _TRACED[name, graph]


def assert_parity(models: dict[str, Path], name: str, graph: str = "standard") -> None:
    """The exported graph gives Hugging Face's logits and new keys/values (< 1e-3)."""
    from ssd_export.parity import check_parity

    model, max_context = hf_model(models, name)
    diffs = check_parity(model, traced(models, name, graph).path, "target", max_draft=8,
                         dtype="float32", max_context=max_context, graph=graph)
    assert diffs["logits"] < 1e-3, diffs
    assert diffs["new_key"] < 1e-3 and diffs["new_value"] < 1e-3, diffs
