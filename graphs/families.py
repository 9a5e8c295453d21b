"""One builder per dense family: a Hugging Face config -> the Adapter its model needs."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ssd_runtime.errors import ConfigError

from .adapters import Adapter


def _llama(config: Any) -> Adapter:
    return Adapter()


def _qwen3(config: Any) -> Adapter:
    return Adapter(q_norm="q_norm", k_norm="k_norm")


def _phi3(config: Any) -> Adapter:
    return Adapter(qkv="qkv_proj", qkv_layout="split")


def _gemma2(config: Any) -> Adapter:
    return Adapter(attn_out_norm="post_attention_layernorm", mlp_norm="pre_feedforward_layernorm",
                   mlp_out_norm="post_feedforward_layernorm",
                   attn_softcap=config.attn_logit_softcapping,
                   logit_softcap=config.final_logit_softcapping)


def _gpt2(config: Any) -> Adapter:
    return Adapter(embed="transformer.wte", layers="transformer.h", final_norm="transformer.ln_f",
                   positions="learned", pos_embed="transformer.wpe", attn="attn",
                   input_norm="ln_1", mlp_norm="ln_2", qkv="c_attn", qkv_layout="split",
                   o="c_proj", num_kv_heads=config.num_attention_heads)


def _gpt_neox(config: Any) -> Adapter:
    return Adapter(embed="gpt_neox.embed_in", layers="gpt_neox.layers",
                   final_norm="gpt_neox.final_layer_norm",
                   rotary="gpt_neox.rotary_emb", attn="attention", qkv="query_key_value",
                   qkv_layout="grouped", o="dense", head_dim="head_size",
                   residual="parallel" if config.use_parallel_residual else "sequential",
                   num_kv_heads=config.num_attention_heads)


def _opt(config: Any) -> Adapter:
    # OPT-350m style (do_layer_norm_before=False) is post-norm and has no final norm.
    return Adapter(embed="model.decoder.embed_tokens", layers="model.decoder.layers",
                   final_norm="model.decoder.final_layer_norm",
                   project_in="model.decoder.project_in", project_out="model.decoder.project_out",
                   positions="learned", pos_embed="model.decoder.embed_positions", pos_offset=2,
                   input_norm="self_attn_layer_norm", mlp_norm="final_layer_norm",
                   mlp=("fc1", "activation_fn", "fc2"), o="out_proj",
                   norm_position="pre" if config.do_layer_norm_before else "post",
                   num_kv_heads=config.num_attention_heads)


def _falcon(config: Any) -> Adapter:
    # Falcon-7B: multi-query, parallel; Falcon-40B/180B (new_decoder_architecture): grouped
    # KV heads, two norms; Falcon-RW: ALiBi, sequential. All share the grouped QKV layout.
    new = bool(config.new_decoder_architecture)
    two_norms = new and (config.num_ln_in_parallel_attn or 2) == 2
    parallel = new or bool(config.parallel_attn)
    if two_norms:
        input_norm, mlp_norm = "ln_attn", "ln_mlp"
    else:
        input_norm, mlp_norm = "input_layernorm", None if parallel else "post_attention_layernorm"
    return Adapter(embed="transformer.word_embeddings", layers="transformer.h",
                   final_norm="transformer.ln_f", rotary="transformer.rotary_emb",
                   positions="alibi" if config.alibi else "rope", attn="self_attention",
                   input_norm=input_norm, mlp_norm=mlp_norm,
                   residual="parallel" if parallel else "sequential",
                   qkv="query_key_value", qkv_layout="grouped", o="dense",
                   scaling="inv_norm_factor",
                   num_kv_heads=config.num_kv_heads if new or not config.multi_query else 1,
                   # HF's eager Falcon adds the ALiBi bias twice (in the scores and again
                   # through the mask); sdpa, its default, matches the original Falcon code.
                   reference_attn="sdpa" if config.alibi else None)


def _gemma3(config: Any) -> Adapter:
    # Gemma 3 (text): q/k norms, 5 sliding layers per full one, and a RoPE table per layer
    # type (local base 10k, global 1M) kept on the one rotary module under the type's name.
    if getattr(config, "use_bidirectional_attention", False):
        raise ConfigError("Gemma 3 with use_bidirectional_attention is an encoder, not a causal "
                          "LM; ssd-export needs causal attention.")
    return Adapter(attn_out_norm="post_attention_layernorm", mlp_norm="pre_feedforward_layernorm",
                   mlp_out_norm="post_feedforward_layernorm", q_norm="q_norm", k_norm="k_norm",
                   layer_rope=tuple(f"{t}_" for t in config.layer_types[:config.num_hidden_layers]),
                   logit_softcap=config.final_logit_softcapping)


def granite(config: Any) -> Adapter:
    # Llama with multipliers: embeddings, both residual branches, logits (divided);
    # the attention multiplier is the attention module's `scaling`.
    return Adapter(embed_scale=config.embedding_multiplier,
                   residual_scale=config.residual_multiplier,
                   logit_scale=1.0 / config.logits_scaling)


def _olmo2(config: Any) -> Adapter:
    # norms on the attention and MLP outputs, none before them; q/k norms over the whole
    # projection (all heads at once)
    return Adapter(input_norm=None, attn_out_norm="post_attention_layernorm", mlp_norm=None,
                   mlp_out_norm="post_feedforward_layernorm", q_norm="q_norm", k_norm="k_norm",
                   qk_norm_over="projection", rope_precision="float32")


def _smollm3(config: Any) -> Adapter:
    # no_rope_layers[i] is 1 where layer i uses RoPE (every 4th layer has none)
    return Adapter(layer_rope=tuple("" if use else None
                                    for use in config.no_rope_layers[:config.num_hidden_layers]))


def _phi(config: Any) -> Adapter:
    # phi-1/1.5/2: one LayerNorm feeding parallel attention and MLP, partial rotary
    return Adapter(final_norm="model.final_layernorm", mlp_norm=None, residual="parallel",
                   o="dense", q_norm="q_layernorm" if config.qk_layernorm else None,
                   k_norm="k_layernorm" if config.qk_layernorm else None)


def _stablelm(config: Any) -> Adapter:
    # per-head q/k LayerNorms are a module list that reads heads-first (B, n, T, D)
    norms = bool(config.qk_layernorm)
    parallel = bool(config.use_parallel_residual)
    return Adapter(mlp_norm=None if parallel else "post_attention_layernorm",
                   residual="parallel" if parallel else "sequential",
                   q_norm="q_layernorm" if norms else None, k_norm="k_layernorm" if norms else None,
                   qk_norm_over="heads_first")


def _gpt_bigcode(config: Any) -> Adapter:
    # GPT-2 layout; c_attn is [q | k | v] with one KV head (multi-query), else per head [q, k, v]
    mq = bool(config.multi_query)
    return Adapter(embed="transformer.wte", layers="transformer.h", final_norm="transformer.ln_f",
                   positions="learned", pos_embed="transformer.wpe", attn="attn",
                   input_norm="ln_1", mlp_norm="ln_2", qkv="c_attn",
                   qkv_layout="split" if mq else "grouped", o="c_proj",
                   num_kv_heads=1 if mq else config.num_attention_heads)


def _gptj(config: Any) -> Adapter:
    # parallel residual on one norm; interleaved RoPE on the first rotary_dim dims, from a
    # sin/cos table with base 10000 (the module keeps no inv_freq); q·k in float32 as
    # Hugging Face computes it
    return Adapter(embed="transformer.wte", layers="transformer.h", final_norm="transformer.ln_f",
                   rope_base=(10000.0, config.rotary_dim or config.n_embd // config.n_head),
                   rope_interleaved=True, attn="attn", input_norm="ln_1", mlp_norm=None,
                   residual="parallel", o="out_proj", num_kv_heads=config.num_attention_heads,
                   scores_fp32=True)


def _cohere(config: Any) -> Adapter:
    # Command-R: parallel residual on one norm, interleaved RoPE, logits times logit_scale,
    # optional per-head q/k norms
    norms = bool(getattr(config, "use_qk_norm", False))          # Cohere2's config has none
    return Adapter(mlp_norm=None, residual="parallel", rope_interleaved=True,
                   rope_precision="float32_rounded_tables",
                   q_norm="q_norm" if norms else None, k_norm="k_norm" if norms else None,
                   logit_scale=config.logit_scale)


def _ministral(config: Any) -> Adapter:
    # Llama with a sliding window on the layers layer_types names (all of them by default)
    return Adapter()


def _exaone4(config: Any) -> Adapter:
    # OLMo 2's output norms with per-head q/k norms; with a sliding window, RoPE on the
    # sliding layers only (the global layers have none), else on every layer
    windowed = config.sliding_window is not None
    return Adapter(input_norm=None, attn_out_norm="post_attention_layernorm", mlp_norm=None,
                   mlp_out_norm="post_feedforward_layernorm", q_norm="q_norm", k_norm="k_norm",
                   layer_rope=tuple("" if not windowed or t == "sliding_attention" else None
                                    for t in config.layer_types[:config.num_hidden_layers]))


def _glm(config: Any) -> Adapter:
    # GLM-4 (0414): interleaved RoPE on the first half of each head (partial_rotary_factor)
    return Adapter(rope_interleaved=True)


def _glm4(config: Any) -> Adapter:
    # GLM's attention and RoPE, with norms on the attention and MLP outputs as well
    return Adapter(rope_interleaved=True, attn_out_norm="post_self_attn_layernorm",
                   mlp_out_norm="post_mlp_layernorm")


def _olmo(config: Any) -> Adapter:
    # Llama with parameter-free LayerNorms and optional q/k/v clipping; RoPE in float32
    return Adapter(qkv_clip=config.clip_qkv, rope_precision="float32")


def _olmo3(config: Any) -> Adapter:
    # OLMo 2 with sliding-window layers, and a RoPE table per layer type (like Gemma 3)
    return replace(_olmo2(config), layer_rope=tuple(
        f"{t}_" for t in config.layer_types[:config.num_hidden_layers]))


def _cohere2(config: Any) -> Adapter:
    # Command R7B / A: Cohere's parallel block (no q/k norms); RoPE on the sliding layers only
    rope = tuple("" if t == "sliding_attention" and config.sliding_window else None
                 for t in config.layer_types[:config.num_hidden_layers])
    return replace(_cohere(config), layer_rope=rope)


def _vaultgemma(config: Any) -> Adapter:
    # Gemma 2 without the norms on the attention and MLP outputs
    return Adapter(mlp_norm="pre_feedforward_layernorm",
                   attn_softcap=config.attn_logit_softcapping,
                   logit_softcap=config.final_logit_softcapping)


def _ernie4_5(config: Any) -> Adapter:
    # Llama with interleaved RoPE, rotated in float32
    return Adapter(rope_interleaved=True, rope_precision="float32")


def hunyuan_dense(config: Any) -> Adapter:
    # per-head q/k norms applied after RoPE
    return Adapter(q_norm="query_layernorm", k_norm="key_layernorm", qk_norm_after_rope=True)


def _ministral3(config: Any) -> Adapter:
    # Mistral with Llama 4's attention temperature: queries scaled up, by the log of how many
    # original contexts (original_max_position_embeddings) lie before their position
    rope = config.rope_parameters or {}
    beta, period = rope.get("llama_4_scaling_beta"), rope.get("original_max_position_embeddings")
    if beta is None or not period:
        raise ConfigError("Ministral 3 scales its queries by rope_parameters' "
                          "llama_4_scaling_beta and original_max_position_embeddings, which this "
                          f"config lacks (rope_parameters: {rope}). ---> HINT: set both, as "
                          "Mistral's checkpoints do.")
    return Adapter(q_position_scale=(float(beta), int(period)))


DENSE = {
    "LlamaForCausalLM": _llama, "MistralForCausalLM": _llama, "Qwen2ForCausalLM": _llama,
    "GemmaForCausalLM": _llama, "Qwen3ForCausalLM": _qwen3, "Phi3ForCausalLM": _phi3,
    "Gemma2ForCausalLM": _gemma2, "GPT2LMHeadModel": _gpt2, "GPTNeoXForCausalLM": _gpt_neox,
    "OPTForCausalLM": _opt, "FalconForCausalLM": _falcon,
    "Gemma3ForCausalLM": _gemma3,
    "Starcoder2ForCausalLM": _llama,
    "GraniteForCausalLM": granite,
    "Olmo2ForCausalLM": _olmo2,
    "SmolLM3ForCausalLM": _smollm3,
    "PhiForCausalLM": _phi,
    "StableLmForCausalLM": _stablelm,
    "GPTBigCodeForCausalLM": _gpt_bigcode,
    "GPTJForCausalLM": _gptj,
    "CohereForCausalLM": _cohere,
    "MinistralForCausalLM": _ministral,
    "Exaone4ForCausalLM": _exaone4,
    "Glm4ForCausalLM": _glm4,
    "GlmForCausalLM": _glm,
    "Ernie4_5ForCausalLM": _ernie4_5,
    "Olmo3ForCausalLM": _olmo3,
    "OlmoForCausalLM": _olmo,
    "SeedOssForCausalLM": _llama,
    "Cohere2ForCausalLM": _cohere2,
    "VaultGemmaForCausalLM": _vaultgemma,
    "HunYuanDenseV1ForCausalLM": hunyuan_dense,
    "Ministral3ForCausalLM": _ministral3,
}


# --- legacy and misc ---

def _helium(config: Any) -> Adapter:
    # Llama with interleaved RoPE (pairs 2j, 2j+1)
    return Adapter(rope_interleaved=True)


def _apertus(config: Any) -> Adapter:
    # per-head q/k RMSNorms, its own norm names; the MLP (xIELU, no gate) is Hugging Face's
    return Adapter(input_norm="attention_layernorm", mlp_norm="feedforward_layernorm",
                   q_norm="q_norm", k_norm="k_norm")


def _gpt_neo(config: Any) -> Adapter:
    # GPT-2 layout with separate q, k, v one module deeper; global and local (window_size)
    # layers alternate; q·k unscaled, in float32 as Hugging Face computes it
    types = config.attention_layers[:config.num_layers]
    return Adapter(embed="transformer.wte", layers="transformer.h", final_norm="transformer.ln_f",
                   positions="learned", pos_embed="transformer.wpe", attn="attn.attention",
                   windows=tuple(config.window_size if t == "local" else None for t in types),
                   input_norm="ln_1", mlp_norm="ln_2", o="out_proj", scaling=None,
                   num_kv_heads=config.num_heads, scores_fp32=True)


def _bloom(config: Any) -> Adapter:
    # ALiBi added unscaled (a float32 bias rounded to the model's dtype), a LayerNorm on the
    # embeddings, per head [q, k, v]; its MLP module adds the residual itself, so the decoder
    # calls the MLP's parts
    if config.apply_residual_connection_post_layernorm:
        raise ConfigError("BLOOM with apply_residual_connection_post_layernorm=True (residuals "
                          "taken after the norms) is not supported; no released BLOOM "
                          "checkpoint sets it. ---> HINT: check the checkpoint's config.json.")
    return Adapter(embed="transformer.word_embeddings",
                   embed_norm="transformer.word_embeddings_layernorm", layers="transformer.h",
                   final_norm="transformer.ln_f", positions="alibi", alibi_scaled=False,
                   alibi_dtype="model", attn="self_attention", qkv="query_key_value",
                   qkv_layout="grouped", o="dense", scaling="inv_norm_factor",
                   mlp=("mlp.dense_h_to_4h", "mlp.gelu_impl", "mlp.dense_4h_to_h"),
                   num_kv_heads=config.n_head)


def _mpt(config: Any) -> Adapter:
    # ALiBi added unscaled in float32 (Hugging Face builds the slopes with alibi_bias_max 8
    # whatever the config says: the ALiBi paper's), [q | k | v] fused, clip_qkv; its MLP
    # module adds the residual itself, so the decoder calls the MLP's parts
    return Adapter(embed="transformer.wte", layers="transformer.blocks",
                   final_norm="transformer.norm_f", positions="alibi", alibi_scaled=False,
                   alibi_dtype="float32", attn="attn", input_norm="norm_1",
                   mlp_norm="norm_2", mlp=("ffn.up_proj", "ffn.act", "ffn.down_proj"),
                   qkv="Wqkv", qkv_layout="split", o="out_proj", scaling="softmax_scale",
                   num_kv_heads=config.n_heads, qkv_clip=config.attn_config.clip_qkv)


def _codegen(config: Any) -> Adapter:
    # GPT-J's layer (parallel residual on one norm, interleaved RoPE on rotary_dim dims from a
    # base-10000 table, q·k in float32) with q, v, k fused in 4 model-parallel blocks
    return Adapter(embed="transformer.wte", layers="transformer.h", final_norm="transformer.ln_f",
                   rope_base=(10000.0, config.rotary_dim), rope_interleaved=True, attn="attn",
                   input_norm="ln_1", mlp_norm=None, residual="parallel", qkv="qkv_proj",
                   qkv_layout="blocks_qvk", qkv_blocks=4, o="out_proj",
                   num_kv_heads=config.num_attention_heads, scores_fp32=True)


DENSE.update({
    # Llama layouts whose norms and MLPs (LayerNorm1P, relu² without a gate) are their own
    # Hugging Face modules, reused as they are; partial rotary comes from the rotary module
    "NemotronForCausalLM": _llama,
    "ArceeForCausalLM": _llama,
    "HeliumForCausalLM": _helium,
    "ApertusForCausalLM": _apertus,
    "GPTNeoForCausalLM": _gpt_neo,
    "BloomForCausalLM": _bloom,
    "MptForCausalLM": _mpt,
    "CodeGenForCausalLM": _codegen,
})
