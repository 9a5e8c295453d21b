"""Per-architecture adapters: where each part of a Hugging Face model lives.

An adapter is declarative: attribute paths and a few switches. The one
`Decoder` in decoder.py reads them; no architecture gets code of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ssd_runtime.errors import ConfigError


@dataclass(frozen=True)
class Adapter:
    """Where to find the parts of one family of Hugging Face causal LMs."""

    classes: tuple[str, ...]          # Hugging Face class names it covers
    embed: str = "model.embed_tokens"
    layers: str = "model.layers"
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    rotary: str = "model.rotary_emb"  # module with inv_freq and attention_scaling
    attn: str = "self_attn"           # inside a layer
    q: str = "q_proj"                 # inside the attention module
    k: str = "k_proj"
    v: str = "v_proj"
    o: str = "o_proj"
    input_norm: str = "input_layernorm"
    post_attn_norm: str = "post_attention_layernorm"
    mlp: str = "mlp"                  # called as a module: mlp(x)


LLAMA_FAMILY = Adapter(classes=("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"))

REGISTRY: dict[str, Adapter] = {name: a for a in (LLAMA_FAMILY,) for name in a.classes}

# RoPE types whose frequencies do not depend on the sequence length at run time.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def supported_architectures() -> list[str]:
    return sorted(REGISTRY)


def adapter_for(model: Any, source: str) -> Adapter:
    """The adapter for a loaded model, or a ConfigError listing what is supported."""
    name = type(model).__name__
    if name in REGISTRY:
        return REGISTRY[name]
    found = name
    raise ConfigError(f"{source}: architecture {found} is not supported. Supported: "
                      f"{', '.join(supported_architectures())}.")


def sliding_windows(config: Any) -> tuple[int | None, ...]:
    """Per-layer attention window (None = full attention), as Hugging Face applies it."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types:
        return tuple(window if t == "sliding_attention" and window else None for t in types)
    return (window,) * n if window else (None,) * n


def rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) \
        else "default"


def get_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj
