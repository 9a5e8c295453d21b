"""An EAGLE-3 head's settings (`Eagle3Config`) and how either published config.json spells them.

SafeAILab's layout keeps the Llama settings at the top with `draft_vocab_size`; vLLM
speculators' nests them in `transformer_layer_config`. graphs/eagle3.py builds the module.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ssd_runtime.errors import ConfigError

SAFEAILAB, SPECULATORS = "safeailab", "speculators"
Layout = Literal["safeailab", "speculators"]
SAFEAILAB_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class Eagle3Config:
    """What defines a head. Sizes are the head's own (H) except `target_hidden_size` (Ht, the
    width of each of the three feature vectors) and `vocab_size` (the target's V)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: tuple[int, int, int]
    target_hidden_size: int
    norm_before_residual: bool = False
    hidden_act: str = "silu"
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)

    @property
    def feature_width(self) -> int:
        """The width of the features the head reads: three of the target's hidden states."""
        return 3 * self.target_hidden_size

    @classmethod
    def default_aux_layer_ids(cls, num_target_layers: int) -> tuple[int, int, int]:
        """SafeAILab's and vLLM's: the residual stream entering layers 2, L//2 and L-3."""
        L = num_target_layers
        return (2, L // 2, L - 3)

    def to_safeailab_config(self) -> dict[str, Any]:
        """config.json of the SafeAILab layout, as vLLM, SGLang and TensorRT-LLM read it."""
        return {
            "architectures": [SAFEAILAB_ARCHITECTURE], "model_type": "llama",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "num_hidden_layers": 1, "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "norm_before_residual": self.norm_before_residual,
            "tie_word_embeddings": False, "torch_dtype": "float32",
        }

    @classmethod
    def from_safeailab_config(cls, d: dict[str, Any], num_target_layers: int | None = None,
                              source: str = "head") -> Eagle3Config:
        return _config_from(d, d, d.get("norm_before_residual", False), num_target_layers,
                            source)

    @classmethod
    def from_speculators_config(cls, d: dict[str, Any], num_target_layers: int | None = None,
                                source: str = "head") -> Eagle3Config:
        layer = d.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ConfigError(f"EAGLE-3 head {source!r}: a speculators config.json needs a "
                              f"transformer_layer_config object. ---> HINT: re-save the head "
                              f"with speculators, or convert it.")
        for key in ("norm_before_fc", "fc_norm", "norm_output"):
            if d.get(key):
                raise ConfigError(f"EAGLE-3 head {source!r} sets {key}, a speculators variant "
                                  f"this exporter does not build. ---> HINT: use a head "
                                  f"without it (the plain EAGLE-3 layer).")
        # vLLM reads a speculators head without the key as norm_before_residual = true
        # (vllm/transformers_utils/configs/speculators/algos.py); what serves it decides
        return _config_from(layer, d, d.get("norm_before_residual", True), num_target_layers,
                            source)


def head_layout(d: dict[str, Any], source: str) -> Layout:
    archs = d.get("architectures") or []
    kind = d.get("speculators_model_type")
    if kind is not None or SPECULATORS_ARCHITECTURE in archs:
        if kind != "eagle3":
            raise ConfigError(f"EAGLE-3 head {source!r}: speculators_model_type is {kind!r}, "
                              f"not 'eagle3'. ---> HINT: only EAGLE-3 speculators heads are "
                              f"exported; use a plain model folder as the draft otherwise.")
        return SPECULATORS
    if SAFEAILAB_ARCHITECTURE in archs or (archs == ["LlamaForCausalLM"]
                                           and "draft_vocab_size" in d):
        return SAFEAILAB        # (SafeAILab's training config names the plain Llama class)
    raise ConfigError(f"{source!r} is not an EAGLE-3 head in a known layout: its config.json "
                      f"has architectures {archs} and no speculators_model_type. ---> HINT: "
                      f"expected {SAFEAILAB_ARCHITECTURE} (SafeAILab) or speculators_model_type "
                      f"'eagle3' ({SPECULATORS_ARCHITECTURE}).")


def _config_from(layer: dict[str, Any], top: dict[str, Any], norm_before_residual: bool,
                 num_target_layers: int | None, source: str) -> Eagle3Config:
    """The head's config from its layer settings (`layer`) and the EAGLE-3 fields (`top`)."""
    def need(d: dict[str, Any], key: str):
        if key not in d:
            raise ConfigError(f"EAGLE-3 head {source!r}: config.json lacks {key}. ---> HINT: "
                              f"the config is incomplete; use the one published with the head.")
        return d[key]

    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ConfigError(f"EAGLE-3 head {source!r} has {layer['num_hidden_layers']} decoder "
                          f"layers; this exporter builds one-layer heads. ---> HINT: use a "
                          f"one-layer EAGLE-3 head.")
    if layer.get("model_type", "llama") != "llama" or layer.get("attention_bias") \
            or layer.get("mlp_bias"):
        raise ConfigError(f"EAGLE-3 head {source!r}: its layer is {layer.get('model_type')!r} "
                          f"(attention_bias {layer.get('attention_bias', False)}, mlp_bias "
                          f"{layer.get('mlp_bias', False)}); the exported head is the Llama "
                          f"layer without biases. ---> HINT: use a Llama-layer EAGLE-3 head.")
    hidden, heads = int(need(layer, "hidden_size")), int(need(layer, "num_attention_heads"))
    vocab = int(need(layer, "vocab_size"))
    theta, scaling = _rope_settings(layer)
    ids = top.get("eagle_aux_hidden_state_layer_ids") or layer.get(
        "eagle_aux_hidden_state_layer_ids")
    if not ids:
        if num_target_layers is None:
            raise ConfigError(f"EAGLE-3 head {source!r} names no eagle_aux_hidden_state_layer_ids"
                              f" and no target depth was given for the default (2, L//2, L-3).")
        ids = Eagle3Config.default_aux_layer_ids(num_target_layers)
    if len(ids) != 3 or not all(isinstance(i, int) for i in ids) or list(ids) != sorted(set(ids)):
        raise ConfigError(f"EAGLE-3 head {source!r}: aux layer ids {list(ids)} are not three "
                          f"increasing layer numbers. ---> HINT: set "
                          f"eagle_aux_hidden_state_layer_ids to the three layers it was trained "
                          f"on (vLLM and SafeAILab read them in increasing order).")
    return Eagle3Config(
        hidden_size=hidden, intermediate_size=int(need(layer, "intermediate_size")),
        num_attention_heads=heads,
        num_key_value_heads=int(layer.get("num_key_value_heads") or heads),
        head_dim=int(layer.get("head_dim") or hidden // heads),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(layer.get("max_position_embeddings", 2048)),
        vocab_size=vocab, draft_vocab_size=int(top.get("draft_vocab_size") or vocab),
        aux_layer_ids=tuple(int(i) for i in ids),
        target_hidden_size=int(top.get("target_hidden_size") or hidden),
        norm_before_residual=bool(norm_before_residual),
        hidden_act=str(layer.get("hidden_act", "silu")))


def _rope_settings(layer: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either spelling: transformers 5's rope_parameters, or
    rope_theta with rope_scaling ({"type"|"rope_type": ..., ...} or null)."""
    params = layer.get("rope_parameters")
    if isinstance(params, dict):
        theta = float(params.get("rope_theta", layer.get("rope_theta", 10000.0)))
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        kind = rest.get("rope_type", rest.get("type", "default"))
        return theta, None if kind == "default" else rest
    scaling = layer.get("rope_scaling")
    return float(layer.get("rope_theta", 10000.0)), scaling if scaling else None


def config_dict(config: Eagle3Config) -> dict[str, Any]:
    """The config as plain JSON values (for a manifest or a model card)."""
    d = asdict(config)
    d["aux_layer_ids"] = list(config.aux_layer_ids)
    return d
