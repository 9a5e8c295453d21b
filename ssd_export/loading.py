"""Load a Hugging Face causal LM and its tokenizer, with errors a user can act on."""
from __future__ import annotations

from dataclasses import dataclass, replace
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
        raise ConfigError(f"{role} model {source!r} failed to load: {described(exc)}. ---> "
                          f"HINT: check that its weight files are complete (an interrupted "
                          f"download or copy leaves them short).") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        raise ConfigError(f"{role} model {source!r} has no usable tokenizer: "
                          f"{described(exc)}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"{role} tokenizer of {source!r} is not a fast tokenizer (no "
                          f"tokenizer.json); the runtime needs one. ---> HINT: save it with "
                          f"AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained().")
    if role == "draft":
        restrict_output(model, source)
    return LoadedModel(role, source, model.eval(), tokenizer, type(model).__name__)


def load_draft(source: str, target: LoadedModel, dtype: str) -> LoadedModel:
    """The draft model. The target's own folder as the draft (its int8 copy, which
    --draft-quant makes from the traced graph; ssd-distill's answering bundle) shares the
    target's loaded model: the same weights are not loaded and held twice. Not where the
    folder carries an `output_vocab.json`, which gives a draft's head other rows than the
    target's."""
    same = Path(source).resolve() == Path(target.source).resolve() if Path(source).exists() \
        else source == target.source
    if same and not (Path(source) / OUTPUT_VOCAB).exists():
        return replace(target, role="draft")
    return load_model(source, "draft", dtype)


OUTPUT_VOCAB = "output_vocab.json"      # written by ssd-distill (ssd_distill/student.py)


def restrict_output(model: Any, source: str) -> None:
    """A draft folder's `output_vocab.json` (ids the draft may propose) becomes
    `model.ssd_output_ids`, which the traced head computes alone (graphs/decoder.py), and a
    forward hook that gives the Hugging Face model the same logits (MASKED elsewhere), so that
    parity compares like with like. q = 0 outside the ids: the target's verification still
    decides every token, so decoding stays exact (docs/design.md §13)."""
    import json

    import torch
    from ssd_graphs.decoder import MASKED

    path = Path(source).expanduser() / OUTPUT_VOCAB
    if not path.is_file():
        return
    vocab = int(model.config.vocab_size)
    try:
        ids = json.loads(path.read_text())["ids"]
        ok = isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok or len(set(ids)) != len(ids) or not all(0 <= i < vocab for i in ids):
        raise ConfigError(f"draft {OUTPUT_VOCAB} in {source!r} is not a list of distinct token "
                          f"ids below the vocabulary size {vocab}. ---> HINT: remake the draft "
                          f"with ssd-distill, or delete the file to use the whole vocabulary.")
    keep = torch.zeros(vocab, dtype=torch.bool)
    keep[torch.tensor(ids)] = True
    model.ssd_output_ids = torch.tensor(sorted(ids))

    def mask(module, args, output):
        output.logits = output.logits.masked_fill(~keep, MASKED)
        return output

    model.register_forward_hook(mask)


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


def described(exc: Exception) -> str:
    """OSError and ValueError say what they are; others get their type's name (KeyError's
    text alone is just the missing key)."""
    line = _first_line(exc)
    return line if isinstance(exc, (OSError, ValueError)) else f"{type(exc).__name__}: {line}"
