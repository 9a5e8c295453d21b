"""One builder per mixture-of-experts family: a Hugging Face config -> its Adapter and MoeSpec."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ssd_runtime.errors import ConfigError

from .adapters import Adapter, LatentSpec, MoeSpec
from .families import granite, hunyuan_dense


def _qwen_sparse_layers(config: Any) -> tuple[int, ...]:
    """Qwen-MoE layers with experts: every decoder_sparse_step-th, less mlp_only_layers."""
    return tuple(i for i in range(config.num_hidden_layers)
                 if i not in (config.mlp_only_layers or ()) and config.num_experts > 0
                 and (i + 1) % config.decoder_sparse_step == 0)


def _qwen3_moe(config: Any) -> Adapter:
    return Adapter(q_norm="q_norm", k_norm="k_norm", moe=MoeSpec(
        layers=_qwen_sparse_layers(config), top_k=config.num_experts_per_tok,
        renormalise=bool(config.norm_topk_prob), activation=config.hidden_act))


def _qwen2_moe(config: Any) -> Adapter:
    # a shared expert on every MoE layer, gated per token by a sigmoid
    return Adapter(moe=MoeSpec(
        layers=_qwen_sparse_layers(config), top_k=config.num_experts_per_tok,
        renormalise=bool(config.norm_topk_prob), activation=config.hidden_act,
        shared_expert="shared_expert", shared_gate="shared_expert_gate"))


def _mixtral(config: Any) -> Adapter:
    # always renormalised; the routing weights are not rounded back to the model's dtype
    return Adapter(moe=MoeSpec(
        layers=tuple(range(config.num_hidden_layers)), top_k=config.num_experts_per_tok,
        renormalise=True, activation=config.hidden_act, float_weights=True))


def _olmoe(config: Any) -> Adapter:
    # OLMo-style q/k norms over the whole projection, optional q/k/v clipping
    return Adapter(q_norm="q_norm", k_norm="k_norm", qk_norm_over="projection",
                   qkv_clip=config.clip_qkv, moe=MoeSpec(
                       layers=tuple(range(config.num_hidden_layers)),
                       top_k=config.num_experts_per_tok, renormalise=bool(config.norm_topk_prob),
                       activation=config.hidden_act))


def _granite_moe(config: Any) -> Adapter:
    # Granite's multipliers around a Mixtral-style block; its router takes the softmax of the
    # top-k logits, which is the renormalised top-k of the softmax. GraniteMoeShared adds a
    # dense MLP on the layer (not in the block) summed with it
    shared = "shared_mlp" if getattr(config, "shared_intermediate_size", 0) else None
    return replace(granite(config), moe=MoeSpec(
        layers=tuple(range(config.num_hidden_layers)), top_k=config.num_experts_per_tok,
        renormalise=True, activation=config.hidden_act, block=None,
        router="block_sparse_moe.router", experts="block_sparse_moe.experts",
        shared_expert=shared))


def _gpt_oss(config: Any) -> Adapter:
    # attention sinks, sliding and full layers in turn (layer_types), a biased router (softmax
    # of the top-k logits) and biased, transposed experts with gate and up interleaved and a
    # clamped SwiGLU: (clamp(up, ±limit) + 1) · g·σ(alpha·g), g = clamp(gate, max=limit).
    # older transformers releases (5.17) hard-code alpha, 1.702, and their config lacks it
    return Adapter(attn_sinks="sinks", moe=MoeSpec(
        layers=tuple(range(config.num_hidden_layers)), top_k=config.num_experts_per_tok,
        renormalise=True, activation=config.hidden_act, router="router", router_bias=True,
        swiglu=(getattr(config, "swiglu_alpha", 1.702), 1.0, config.swiglu_limit)))


def _ernie4_5_moe(config: Any) -> Adapter:
    # interleaved RoPE; experts on every moe_layer_interval-th layer from start to end index;
    # float32 softmax routing chosen with a selection-only bias, its sum clamped to
    # moe_norm_min; optional shared experts
    layers = tuple(i for i in range(config.num_hidden_layers)
                   if (i + 1) % config.moe_layer_interval == 0
                   and config.moe_layer_start_index <= i <= config.moe_layer_end_index)
    return Adapter(rope_interleaved=True, moe=MoeSpec(
        layers=layers, top_k=config.num_experts_per_tok, renormalise=True,
        activation=config.hidden_act, router_fp32=True,
        choice_bias="gate.moe_statics.e_score_correction_bias",
        renorm_floor=config.moe_norm_min,
        shared_expert="shared_experts" if config.moe_num_shared_experts else None))


def _hunyuan_moe(config: Any) -> Adapter:
    # HunYuan's attention (q/k norms after RoPE); experts on every layer plus a shared MLP;
    # top-k and the number of experts may be given per layer, but only one of each is computed
    top_ks, experts = ({v} if isinstance(v, int) else set(v)
                       for v in (config.moe_topk, config.num_experts))
    if len(top_ks) != 1 or len(experts) != 1:
        raise ConfigError(f"HunYuan MoE with per-layer moe_topk {config.moe_topk} / "
                          f"num_experts {config.num_experts}: ssd-export computes one top-k "
                          f"over one number of experts. ---> HINT: no fix short of a graph "
                          f"per layer setting; this checkpoint is not supported.")
    return replace(hunyuan_dense(config), moe=MoeSpec(
        layers=tuple(range(config.num_hidden_layers)), top_k=top_ks.pop(), renormalise=True,
        activation=config.hidden_act, router="gate.wg", float_weights=True,
        shared_expert="shared_mlp"))


def _sigmoid_grouped(config: Any) -> dict:
    """DeepSeek-V3-style routing (DeepSeek V3, GLM-4 MoE, dots.llm1): float32 sigmoid scores,
    chosen with a selection-only bias within the best topk_group of n_group groups (a group
    scoring its best two), [renormalised,] times routed_scaling_factor, kept float32; experts
    from layer first_k_dense_replace on, each block with shared experts."""
    return dict(layers=tuple(range(config.first_k_dense_replace, config.num_hidden_layers)),
                top_k=config.num_experts_per_tok, renormalise=bool(config.norm_topk_prob),
                activation=config.hidden_act, float_weights=True, scoring="sigmoid",
                router_fp32=True, choice_bias="gate.e_score_correction_bias",
                groups=config.n_group, topk_groups=config.topk_group, group_score_top=2,
                routed_scale=config.routed_scaling_factor, shared_expert="shared_experts")


def _glm4_moe(config: Any) -> Adapter:
    # partial rotary (the rotary module's inv_freq says how much), optional q/k norms
    norms = bool(config.use_qk_norm)
    return Adapter(q_norm="q_norm" if norms else None, k_norm="k_norm" if norms else None,
                   moe=MoeSpec(**_sigmoid_grouped(config)))


def _dots1(config: Any) -> Adapter:
    # q/k norms per head, sliding layers from max_window_layers on (layer_types)
    return Adapter(q_norm="q_norm", k_norm="k_norm", moe=MoeSpec(**_sigmoid_grouped(config)))


def _phimoe(config: Any) -> Adapter:
    # LayerNorms, biased projections and LM head (the modules' own); sparsemixer routing (two
    # experts, whatever num_experts_per_tok says); longrope scales cos/sin by short_mscale
    # (the context stays below original_max_position_embeddings: registry.check_rope_context)
    params = config.rope_parameters or {}
    longrope = params.get("rope_type", "default") != "default"
    return Adapter(rope_scale=float(params["short_mscale"]) if longrope else None,
                   moe=MoeSpec(layers=tuple(range(config.num_hidden_layers)), top_k=2,
                               renormalise=False, activation=config.hidden_act, router="router",
                               scoring="sparsemixer", mixer_eps=config.router_jitter_noise))


def _latent(config: Any, deinterleave: bool = False) -> LatentSpec:
    return LatentSpec(rank=config.kv_lora_rank, rope_dims=config.qk_rope_head_dim,
                      nope_dims=config.qk_nope_head_dim, v_dims=config.v_head_dim,
                      q_rank=config.q_lora_rank is not None, deinterleave=deinterleave)


def _deepseek_v3(config: Any) -> Adapter:
    # multi-head latent attention (one shared KV head of kv_lora_rank + qk_rope_head_dim);
    # rope_interleave: rotary dims de-interleaved, then rotate-half
    return Adapter(num_kv_heads=1, latent=_latent(config, bool(config.rope_interleave)),
                   moe=MoeSpec(**_sigmoid_grouped(config)))


def _deepseek_v2(config: Any) -> Adapter:
    # multi-head latent attention with RoPE on interleaved pairs; float32 softmax routing,
    # greedy or within the best topk_group of n_group groups (a group scoring its best
    # expert), never renormalised, times routed_scaling_factor; shared experts
    if config.topk_method not in ("greedy", "group_limited_greedy"):
        raise ConfigError(f"DeepSeek V2 with topk_method {config.topk_method!r}: ssd-export "
                          f"reproduces 'greedy' and 'group_limited_greedy' routing.")
    grouped = config.topk_method == "group_limited_greedy"
    return Adapter(num_kv_heads=1, rope_interleaved=True, latent=_latent(config), moe=MoeSpec(
        layers=tuple(range(config.first_k_dense_replace, config.num_hidden_layers)),
        top_k=config.num_experts_per_tok, renormalise=False, activation=config.hidden_act,
        float_weights=True, router_fp32=True, groups=config.n_group if grouped else 1,
        topk_groups=config.topk_group if grouped else 1,
        routed_scale=config.routed_scaling_factor, shared_expert="shared_experts"))


MOE = {
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "Qwen2MoeForCausalLM": _qwen2_moe,
    "MixtralForCausalLM": _mixtral,
    "OlmoeForCausalLM": _olmoe,
    "GraniteMoeForCausalLM": _granite_moe,
    "GraniteMoeSharedForCausalLM": _granite_moe,
    "GptOssForCausalLM": _gpt_oss,
    "Ernie4_5_MoeForCausalLM": _ernie4_5_moe,
    "HunYuanMoEV1ForCausalLM": _hunyuan_moe,
    "Glm4MoeForCausalLM": _glm4_moe,
    "Dots1ForCausalLM": _dots1,
    "PhimoeForCausalLM": _phimoe,
    "DeepseekV3ForCausalLM": _deepseek_v3,
    "DeepseekV2ForCausalLM": _deepseek_v2,
}
