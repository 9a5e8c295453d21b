"""Per-architecture adapters: where each part of a Hugging Face model lives, and how a layer wires them.

An adapter is declarative: attribute paths and a few switches, built from the model's
config by a short function per class (families.py, families_moe.py; looked up in
registry.py). The one `Decoder` in decoder.py reads them; no architecture gets code of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


Positions = Literal["rope", "learned", "alibi"]
QkvLayout = Literal["split", "grouped", "blocks_qvk"]
QkNormOver = Literal["head", "heads_first", "projection"]
RopePrecision = Literal["model", "float32", "float32_rounded_tables"]
Scoring = Literal["softmax", "sigmoid", "sparsemixer"]


@dataclass(frozen=True)
class MoeSpec:
    """A sparse mixture-of-experts block in place of the MLP on some layers (moe.py computes it).

    Paths are from the layer's `block` module (None: the layer itself). The router is a
    linear map to one logit per expert; `scoring` turns logits into scores (in float32),
    top-k over the scores (plus a selection-only bias, within the best groups if grouped)
    picks the experts, and their scores are the weights: divided by their sum if
    `renormalise`, then times `routed_scale`. The experts keep fused weights:
    `gate_up_proj` (E, 2I, H) as [gate; up] and `down_proj` (E, H, I), expert e computing
    down_e · (act(gate_e · h) * (up_e · h)) with the experts module's own `act_fn`; the
    module's flags may say the weights are transposed (E, H, 2I) and (E, I, H), gate and up
    interleaved, and biased (`gate_up_proj_bias`, `down_proj_bias`), and the router biased.
    """

    layers: tuple[int, ...]               # the layers whose MLP is this block (others: dense)
    top_k: int
    renormalise: bool
    activation: str                       # config.hidden_act (ONNX Runtime's kernel: silu only)
    block: str | None = "mlp"
    router: str = "gate"
    experts: str = "experts"
    float_weights: bool = False           # routing weights stay float32 (Mixtral); else the
                                          # model's dtype, as Qwen and OLMoE round them
    shared_expert: str | None = None      # a dense MLP every token goes through (Qwen2-MoE) ...
    shared_gate: str | None = None        # ... times sigmoid(shared_gate(h)), a Linear H -> 1
    scoring: Scoring = "softmax"          # scores from the router's logits (sparsemixer:
                                          # PhiMoE's two rounds of a masked softmax, top-2)
    mixer_eps: float = 0.0                # sparsemixer's jitter_eps
    router_bias: bool = False             # the router's Linear adds its bias (GPT-OSS)
    router_fp32: bool = False             # logits from float32 h and weights (DeepSeek V3)
    choice_bias: str | None = None        # a per-expert bias (E,) added to the scores for
                                          # choosing only (e_score_correction_bias)
    groups: int = 1                       # experts in n equal groups; only the best
    topk_groups: int = 1                  # topk_groups groups are eligible, a group scoring
    group_score_top: int = 1              # the sum of its best group_score_top choice scores
    renorm_floor: float = 0.0             # the renormalising sum clamped to at least this
    routed_scale: float = 1.0             # times the routed weights (routed_scaling_factor)
    swiglu: tuple[float, float, float] | None = None  # (alpha, beta, limit): experts compute
                                          # clamp(g, max=limit)·σ(alpha·that)·(clamp(u, ±limit)
                                          # + beta) instead of act(g)·u (GPT-OSS)


@dataclass(frozen=True)
class LatentSpec:
    """Multi-head latent attention (DeepSeek V2/V3; latent.py computes it).

    Paths are from the attention module. Each token keeps a normed latent c (`rank`) and a
    rotated key part (`rope_dims`) shared by every head; kv_b_proj maps c to each head's
    key part (`nope_dims`) and value (`v_dims`); the query comes from q_proj, or from q_a_proj,
    q_a_layernorm and q_b_proj where the model has a query rank.
    """

    rank: int                             # kv_lora_rank
    rope_dims: int                        # qk_rope_head_dim
    nope_dims: int                        # qk_nope_head_dim
    v_dims: int                           # v_head_dim
    q_rank: bool                          # q_lora_rank set: q through q_a -> norm -> q_b
    deinterleave: bool = False            # the rotary dims reordered (0, 2, 4, .. | 1, 3, ..)
                                          # before rotate-half RoPE (DeepSeek V3's rope_interleave)


@dataclass(frozen=True)
class Adapter:
    """Where to find the parts of one Hugging Face causal LM and how its layers connect them.

    Paths are attribute paths: top-level parts from the model, per-layer parts from a
    layer, projections from the layer's attention module. A path whose attribute is None
    on the loaded model (OPT's optional projections and final norm) means "absent".
    """

    # --- top level (from the model) -----------------------------------------------------
    embed: str = "model.embed_tokens"     # called as a module; Gemma's scales by sqrt(hidden)
    embed_scale: float = 1.0              # times the embedding output (Granite's multiplier)
    layers: str = "model.layers"
    final_norm: str | None = "model.norm"
    lm_head: str = "lm_head"              # tied or not: whatever module Hugging Face calls
    embed_norm: str | None = None         # a norm on the embedding output (BLOOM's)
    project_in: str | None = None         # after the embedding (OPT's word_embed_proj_dim)
    project_out: str | None = None        # before the LM head
    positions: Positions = "rope"
    rotary: str = "model.rotary_emb"      # rope: module with inv_freq and attention_scaling
    rope_scale: float | None = None       # the cos/sin scale where the model applies another
                                          # than attention_scaling (PhiMoE's short_mscale)
    layer_rope: tuple[str | None, ...] | None = None  # per layer: the rotary module's table
                                          # prefix (Gemma 3: "sliding_attention_"), None: no
                                          # RoPE on that layer (SmolLM3); None: "" everywhere
    rope_base: tuple[float, int] | None = None  # (base, rotary dims) for a rotary module
                                          # without inv_freq (GPT-J's sin/cos table)
    rope_interleaved: bool = False        # rotate pairs (2j, 2j+1), not (j, j + R/2)
    rope_precision: RopePrecision = "model"  # where a float16 model rotates (positions.Rope):
                                          # float32 (OLMo, ERNIE 4.5), float32 from rounded
                                          # cos/sin (Cohere), else its own dtype
    pos_embed: str | None = None          # learned: embedding table read at position_ids + offset
    pos_offset: int = 0
    alibi_scaled: bool = True             # alibi: the bias times the q·k scale (Falcon), or
                                          # added as it is (BLOOM)
    alibi_dtype: Literal["bfloat16", "model", "float32"] = "bfloat16"  # rounding: slopes,
                                          # positions and bias to bfloat16 (Falcon), the
                                          # float32 bias to the model's dtype (BLOOM), none (MPT)
    # --- a layer ----------------------------------------------------------------------
    attn: str = "self_attn"               # a path: GPT-Neo's is "attn.attention"
    windows: tuple[int | None, ...] | None = None  # per layer: attention window, or None for
                                          # full attention; unset: from the config
                                          # (sliding_windows; GPT-Neo lists its own kinds)
    input_norm: str | None = "input_layernorm"  # before attention (after the residual add if
                                          # "post"); None: none (OLMo 2 norms outputs instead)
    attn_out_norm: str | None = None      # on the attention output, before the residual add
    mlp_norm: str | None = "post_attention_layernorm"  # None: the MLP reads input_norm's output
                                          # (parallel) or the residual stream (sequential)
    mlp: tuple[str, ...] = ("mlp",)       # modules applied in turn (paths: "mlp.fc1")
    mlp_out_norm: str | None = None       # on the MLP output, before the residual add
    residual: Literal["sequential", "parallel"] = "sequential"  # parallel: x + attn(.) + mlp(.)
    norm_position: Literal["pre", "post"] = "pre"
    residual_scale: float = 1.0           # x += scale · attn(.), likewise the MLP (Granite)
    # --- the attention module ---------------------------------------------------------
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    qkv: str | None = None                # one fused projection instead of q, k, v
    qkv_layout: QkvLayout = "split"       # split: [q | k | v]; grouped: per KV head [q*G, k, v];
                                          # blocks_qvk: qkv_blocks blocks, each [q | v | k] of
                                          # a slice of the heads (CodeGen's model-parallel one)
    qkv_blocks: int = 1
    o: str = "o_proj"
    q_norm: str | None = None             # norms on q and k (Qwen 3, OLMo 2)
    k_norm: str | None = None
    qk_norm_after_rope: bool = False      # the q/k norms read the rotated q, k (HunYuan)
    qk_norm_over: QkNormOver = "head"     # what they read: (B, T, n, D) per head, (B, n, T, D)
                                          # (StableLM's per-head module list), or the whole
                                          # projection (B, T, n·D) (OLMo 2)
    head_dim: str = "head_dim"            # attribute names on the attention module
    scaling: str | None = "scaling"       # None: q·k unscaled (GPT-Neo)
    num_kv_heads: int | None = None       # None: config.num_key_value_heads, else all heads
    attn_softcap: float | None = None     # scores = cap * tanh(scores / cap)
    logit_softcap: float | None = None
    logit_scale: float = 1.0              # times the logits (Cohere; Granite's 1/logits_scaling)
    qkv_clip: float | None = None         # q, k, v clamped to ±clip after the q/k norms (OLMoE)
    q_position_scale: tuple[float, int] | None = None  # (beta, period): q times
                                          # 1 + beta·log(1 + floor(position / period)) after
                                          # RoPE (Llama 4's attention temperature; Ministral 3)
    scores_fp32: bool = False             # q·k computed in float32 (GPT-J: float16 overflows)
    attn_sinks: str | None = None         # per-head logits (H,) that join each softmax as one
                                          # more key without a value (GPT-OSS's sinks)
    reference_attn: str | None = None     # attention implementation parity compares against
    moe: MoeSpec | None = None            # mixture-of-experts layers
    latent: LatentSpec | None = None      # multi-head latent attention instead of q/k/v


def sliding_windows(config: Any) -> tuple[int | None, ...]:
    """Per-layer attention window (None = full attention), as Hugging Face applies it."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(window if t == "sliding_attention" and window else None for t in types[:n])
    return (window,) * n if window else (None,) * n


def rope_kinds(config: Any) -> list[tuple[str, dict]]:
    """(type, parameters) per set of RoPE parameters: one, or one per layer type (Gemma 3)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if not isinstance(params, dict):
        return [("default", {})]
    sets = list(params.values()) if params and all(isinstance(v, dict) or v is None
                                                   for v in params.values()) else [params]
    return [(p.get("rope_type", p.get("type", "default")), p) for p in sets if p]


def get_path(obj: Any, path: str | None) -> Any:
    """The attribute at a dotted path; None for a None path or a None attribute on the way."""
    if path is None:
        return None
    for part in path.split("."):
        obj = getattr(obj, part)
        if obj is None:
            return None
    return obj
