"""Per-architecture adapters: where each part of a Hugging Face model lives, and how a layer wires them.

An adapter is declarative: attribute paths and a few switches, built from the model's
config by a short function per class. The one `Decoder` in decoder.py reads them; no
architecture gets code of its own.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ssd_runtime.errors import ConfigError

Positions = Literal["rope", "learned", "alibi"]
QkvLayout = Literal["split", "grouped"]
QkNormOver = Literal["head", "heads_first", "projection"]


@dataclass(frozen=True)
class MoeSpec:
    """A sparse mixture-of-experts block in place of the MLP on some layers (moe.py computes it).

    Paths are from the layer's `block` module. The router is a bias-free linear map to one
    logit per expert, followed by softmax (in float32), top-k and, if `renormalise`, the k
    weights divided by their sum. The experts keep fused weights: `gate_up_proj`
    (E, 2I, H) as [gate; up] and `down_proj` (E, H, I), expert e computing
    down_e · (act(gate_e · h) * (up_e · h)) with the experts module's own `act_fn`.
    """

    layers: tuple[int, ...]               # the layers whose MLP is this block (others: dense)
    top_k: int
    renormalise: bool
    activation: str                       # config.hidden_act (ONNX Runtime's kernel: silu only)
    block: str = "mlp"
    router: str = "gate"
    experts: str = "experts"
    float_weights: bool = False           # routing weights stay float32 (Mixtral); else the
                                          # model's dtype, as Qwen and OLMoE round them
    shared_expert: str | None = None      # a dense MLP every token goes through (Qwen2-MoE) ...
    shared_gate: str | None = None        # ... times sigmoid(shared_gate(h)), a Linear H -> 1


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
    project_in: str | None = None         # after the embedding (OPT's word_embed_proj_dim)
    project_out: str | None = None        # before the LM head
    positions: Positions = "rope"
    rotary: str = "model.rotary_emb"      # rope: module with inv_freq and attention_scaling
    layer_rope: tuple[str | None, ...] | None = None  # per layer: the rotary module's table
                                          # prefix (Gemma 3: "sliding_attention_"), None: no
                                          # RoPE on that layer (SmolLM3); None: "" everywhere
    rope_base: tuple[float, int] | None = None  # (base, rotary dims) for a rotary module
                                          # without inv_freq (GPT-J's sin/cos table)
    rope_interleaved: bool = False        # rotate pairs (2j, 2j+1), not (j, j + R/2)
    pos_embed: str | None = None          # learned: embedding table read at position_ids + offset
    pos_offset: int = 0
    # --- a layer ----------------------------------------------------------------------
    attn: str = "self_attn"
    input_norm: str | None = "input_layernorm"  # before attention (after the residual add if
                                          # "post"); None: none (OLMo 2 norms outputs instead)
    attn_out_norm: str | None = None      # on the attention output, before the residual add
    mlp_norm: str | None = "post_attention_layernorm"  # None: the MLP reads input_norm's output
                                          # (parallel) or the residual stream (sequential)
    mlp: tuple[str, ...] = ("mlp",)       # modules applied in turn
    mlp_out_norm: str | None = None       # on the MLP output, before the residual add
    residual: Literal["sequential", "parallel"] = "sequential"  # parallel: x + attn(.) + mlp(.)
    norm_position: Literal["pre", "post"] = "pre"
    residual_scale: float = 1.0           # x += scale · attn(.), likewise the MLP (Granite)
    # --- the attention module ---------------------------------------------------------
    q: str = "q_proj"
    k: str = "k_proj"
    v: str = "v_proj"
    qkv: str | None = None                # one fused projection instead of q, k, v
    qkv_layout: QkvLayout = "split"       # split: [q | k | v]; grouped: per KV head [q*G, k, v]
    o: str = "o_proj"
    q_norm: str | None = None             # norms on q and k (Qwen 3, OLMo 2)
    k_norm: str | None = None
    qk_norm_over: QkNormOver = "head"     # what they read: (B, T, n, D) per head, (B, n, T, D)
                                          # (StableLM's per-head module list), or the whole
                                          # projection (B, T, n·D) (OLMo 2)
    head_dim: str = "head_dim"            # attribute names on the attention module
    scaling: str = "scaling"
    num_kv_heads: int | None = None       # None: config.num_key_value_heads, else all heads
    attn_softcap: float | None = None     # scores = cap * tanh(scores / cap)
    logit_softcap: float | None = None
    logit_scale: float = 1.0              # times the logits (Cohere; Granite's 1/logits_scaling)
    qkv_clip: float | None = None         # q, k, v clamped to ±clip after the q/k norms (OLMoE)
    scores_fp32: bool = False             # q·k computed in float32 (GPT-J: float16 overflows)
    reference_attn: str | None = None     # attention implementation parity compares against
    moe: MoeSpec | None = None            # mixture-of-experts layers


# --- one builder per family: config -> Adapter --------------------------------------------

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


def _granite(config: Any) -> Adapter:
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
                   qk_norm_over="projection")


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
    norms = bool(config.use_qk_norm)
    return Adapter(mlp_norm=None, residual="parallel", rope_interleaved=True,
                   q_norm="q_norm" if norms else None, k_norm="k_norm" if norms else None,
                   logit_scale=config.logit_scale)


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


REGISTRY: dict[str, Callable[[Any], Adapter]] = {
    "LlamaForCausalLM": _llama, "MistralForCausalLM": _llama, "Qwen2ForCausalLM": _llama,
    "GemmaForCausalLM": _llama, "Qwen3ForCausalLM": _qwen3, "Phi3ForCausalLM": _phi3,
    "Gemma2ForCausalLM": _gemma2, "GPT2LMHeadModel": _gpt2, "GPTNeoXForCausalLM": _gpt_neox,
    "OPTForCausalLM": _opt, "FalconForCausalLM": _falcon,
    "Gemma3ForCausalLM": _gemma3,
    "Starcoder2ForCausalLM": _llama,
    "GraniteForCausalLM": _granite,
    "Olmo2ForCausalLM": _olmo2,
    "SmolLM3ForCausalLM": _smollm3,
    "PhiForCausalLM": _phi,
    "StableLmForCausalLM": _stablelm,
    "GPTBigCodeForCausalLM": _gpt_bigcode,
    "GPTJForCausalLM": _gptj,
    "CohereForCausalLM": _cohere,
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "Qwen2MoeForCausalLM": _qwen2_moe,
    "MixtralForCausalLM": _mixtral,
    "OlmoeForCausalLM": _olmoe,
}

# RoPE types whose frequencies Hugging Face fixes at load time, and those it keeps fixed
# only up to a context length (dynamic NTK grows past max_position_embeddings; longrope
# switches to its long factors past original_max_position_embeddings).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
BOUNDED_ROPE_TYPES = ("dynamic", "longrope")


def supported_architectures() -> list[str]:
    return sorted(REGISTRY)


def adapter_for(model: Any, source: str) -> Adapter:
    """The adapter for a loaded model, or a ConfigError listing what is supported."""
    name = type(model).__name__
    if name not in REGISTRY:
        raise ConfigError(f"{source}: architecture {name} is not supported. Supported: "
                          f"{', '.join(supported_architectures())}.")
    adapter = REGISTRY[name](model.config)
    for kind, _ in _rope_kinds(model.config):
        if adapter.positions == "rope" and kind not in STATIC_ROPE_TYPES + BOUNDED_ROPE_TYPES:
            raise ConfigError(f"{source}: RoPE type {kind!r} is not supported; supported: "
                              f"{', '.join(STATIC_ROPE_TYPES + BOUNDED_ROPE_TYPES)}.")
    return adapter


def check_rope_context(model: Any, source: str, max_context: int) -> None:
    """Refuse a context past which Hugging Face would change the RoPE frequencies."""
    config = model.config
    if REGISTRY[type(model).__name__](config).positions != "rope":
        return
    for kind, params in _rope_kinds(config):
        if kind not in BOUNDED_ROPE_TYPES:
            continue
        limit = int(params.get("original_max_position_embeddings")
                    or getattr(config, "original_max_position_embeddings", 0)
                    or config.max_position_embeddings) if kind == "longrope" \
            else int(config.max_position_embeddings)
        if max_context > limit:
            raise ConfigError(f"{source}: RoPE type {kind!r} changes its frequencies past "
                              f"{limit} positions, which one graph cannot reproduce; max_context "
                              f"is {max_context}. ---> HINT: export with --max-context {limit} "
                              f"or less.")


def sliding_windows(config: Any) -> tuple[int | None, ...]:
    """Per-layer attention window (None = full attention), as Hugging Face applies it."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(window if t == "sliding_attention" and window else None for t in types[:n])
    return (window,) * n if window else (None,) * n


def _rope_kinds(config: Any) -> list[tuple[str, dict]]:
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
