"""Which adapter builds each Hugging Face class, and the checks made when one is looked up."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ssd_runtime.errors import ConfigError

from .adapters import Adapter, rope_kinds
from .families import DENSE
from .families_moe import MOE

REGISTRY: dict[str, Callable[[Any], Adapter]] = {**DENSE, **MOE}

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
    for kind, _ in rope_kinds(model.config):
        if adapter.positions == "rope" and kind not in STATIC_ROPE_TYPES + BOUNDED_ROPE_TYPES:
            raise ConfigError(f"{source}: RoPE type {kind!r} is not supported; supported: "
                              f"{', '.join(STATIC_ROPE_TYPES + BOUNDED_ROPE_TYPES)}.")
    return adapter


def check_rope_context(model: Any, source: str, max_context: int) -> None:
    """Refuse a context past which Hugging Face would change the RoPE frequencies."""
    config = model.config
    if REGISTRY[type(model).__name__](config).positions != "rope":
        return
    for kind, params in rope_kinds(config):
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
