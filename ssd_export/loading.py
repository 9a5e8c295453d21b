"""Load a Hugging Face causal LM and its tokenizer, with errors a user can act on."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssd_graphs.registry import REGISTRY, supported_architectures
from ssd_runtime.errors import ConfigError


@dataclass
class LoadedModel:
    role: str            # "target" | "draft"
    source: str
    model: Any           # transformers PreTrainedModel, in eval mode
    tokenizer: Any       # transformers fast tokenizer
    architecture: str


def check_architecture(source: str, role: str) -> None:
    """Read only the config; fail fast on a missing folder or an unsupported class (before
    `load_model`, which relies on it)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    _check_exists(source, role)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{role} model {source!r} cannot be read as a Hugging Face model: "
                          f"{_first_line(exc)}") from None
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    names = list(getattr(config, "architectures", None) or [])
    if not names:
        mapped = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
        names = [mapped] if mapped else []
    if not any(n in causal for n in names):
        raise ConfigError(f"{role} model {source!r} is {', '.join(names) or config.model_type}, "
                          f"not a causal language model. ssd-export needs a *ForCausalLM model; "
                          f"supported: {', '.join(supported_architectures())}.")
    if not any(n in REGISTRY for n in names):
        raise ConfigError(f"{role} model {source!r}: architecture {', '.join(names)} is not "
                          f"supported. Supported: {', '.join(supported_architectures())}.")


def load_model(source: str, role: str, dtype: str) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # Anything a model folder can break with (a truncated safetensors file: SafetensorError;
    # a corrupt tokenizer.json: KeyError, Exception from the tokenizers library) is the
    # folder's problem, named in one line.
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=getattr(torch, dtype), attn_implementation="eager")
    except Exception as exc:
        raise ConfigError(f"{role} model {source!r} failed to load: {_described(exc)}. ---> "
                          f"HINT: check that its weight files are complete (an interrupted "
                          f"download or copy leaves them short).") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise ConfigError(f"{role} model {source!r} has no usable tokenizer: "
                          f"{_described(exc)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{role} tokenizer of {source!r} is not a fast tokenizer (no "
                          f"tokenizer.json); the runtime needs one. ---> HINT: save it with "
                          f"AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained().")
    return LoadedModel(role, source, model.eval(), tokenizer, type(model).__name__)


def _check_exists(source: str, role: str) -> None:
    path = Path(source).expanduser()
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ConfigError(f"{role} model {source!r} is not a Hugging Face model folder "
                              f"(no config.json in it).")
        return
    looks_local = source.startswith((".", "/", "~")) or source.count("/") > 1   # else a hub id
    if looks_local:
        raise ConfigError(f"{role} model folder {source!r} does not exist. ---> HINT: pass a "
                          f"folder written by save_pretrained() or a hub id like org/name.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _described(exc: Exception) -> str:
    """OSError and ValueError say what they are; others get their type's name (KeyError's
    text alone is just the missing key)."""
    line = _first_line(exc)
    return line if isinstance(exc, (OSError, ValueError)) else f"{type(exc).__name__}: {line}"
