"""Check that target and draft can be paired, and describe their tokenizer.

Speculation compares token ids, so both models must map text to ids the same
way: identical vocabulary and special tokens.
"""
from __future__ import annotations

from typing import Any

from ssd_runtime.errors import ConfigError

_SPECIALS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
PROBES = ("Hello, world!", "def add(a, b):\n    return a + b\n", " leading space", "ünïcödé ✓")


def check_vocabularies(target_tok: Any, draft_tok: Any) -> None:
    """Raise ConfigError naming the first differing tokens, if any."""
    t_vocab, d_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if t_vocab != d_vocab:
        t_by_id = {i: tok for tok, i in t_vocab.items()}
        d_by_id = {i: tok for tok, i in d_vocab.items()}
        diffs = [i for i in sorted(set(t_by_id) | set(d_by_id)) if t_by_id.get(i) != d_by_id.get(i)]
        shown = "; ".join(f"id {i}: target {t_by_id.get(i)!r}, draft {d_by_id.get(i)!r}"
                          for i in diffs[:3])
        raise ConfigError(f"target and draft vocabularies differ ({len(t_vocab)} vs "
                          f"{len(d_vocab)} tokens, {len(diffs)} ids differ; first: {shown}). "
                          f"Speculative decoding needs a draft that shares the target's tokenizer.")
    for name in _SPECIALS:
        t, d = getattr(target_tok, name, None), getattr(draft_tok, name, None)
        if t != d:
            raise ConfigError(f"target and draft special tokens differ: {name} is {t} for the "
                              f"target and {d} for the draft. Use a draft with the target's "
                              f"tokenizer.")


def added_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the Hugging Face tokenizer adds before and after a text by default."""
    backend = tokenizer.backend_tokenizer
    found: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    for text in PROBES:
        full = list(tokenizer(text)["input_ids"])
        raw = backend.encode(text, add_special_tokens=False).ids
        start = _find(full, raw)
        if start < 0:
            raise ConfigError(f"the tokenizer's default encoding of {text!r} is not the plain "
                              f"encoding plus added ids ({full} vs {raw}); the runtime cannot "
                              f"reproduce it.")
        found.add((tuple(full[:start]), tuple(full[start + len(raw):])))
    if len(found) != 1:
        raise ConfigError(f"the tokenizer adds different ids to different texts ({found}); the "
                          f"runtime cannot reproduce that.")
    prefix, suffix = found.pop()
    return list(prefix), list(suffix)


def eos_ids(model: Any) -> list[int]:
    """End-of-sequence ids as Hugging Face generate() uses them: the generation_config's (which
    takes the model config's), never the tokenizer's. A model that sets none is decoded to
    max_new_tokens, as generate() does, even past the tokenizer's eos token."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        return []
    return sorted({int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])})


def special_tokens(tokenizer: Any) -> dict[str, str]:
    """The tokenizer's special tokens as text, as apply_chat_template() hands them to the
    template (bos_token, eos_token, pad_token, unk_token; those it has)."""
    names = ("bos_token", "eos_token", "pad_token", "unk_token")
    return {name: str(value) for name in names
            if isinstance(value := getattr(tokenizer, name, None), str) and value}


def text_settings(tokenizer: Any) -> dict[str, bool]:
    """What the Hugging Face tokenizer does to text beyond tokenizer.json: split_special_tokens
    (a special token's string in a text is plain text), and the decode's clean-up of spaces,
    which transformers applies when asked except to BPE models (unless forced)."""
    backend = tokenizer.backend_tokenizer
    bpe = type(backend.model).__name__ == "BPE"
    forced = getattr(tokenizer,
                     "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                     False)
    return {"split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
            "clean_up_spaces": bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
            and (not bpe or bool(forced))}


def chat_template(tokenizer: Any) -> tuple[str | None, str]:
    """The chat template apply_chat_template() renders without tools, and a note when the
    tokenizer has several named ones (a dict: "default", "tool_use", ...) and one was chosen."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, dict):
        return template, ""
    names = ", ".join(sorted(template))
    if "default" in template:
        return template["default"], (f"the tokenizer has named chat templates ({names}); the "
                                     f"bundle carries 'default', which apply_chat_template() "
                                     f"uses without tools")
    return None, (f"the tokenizer has named chat templates ({names}) and no 'default'; the bundle "
                  f"carries none, so ssd-serve's /v1/chat/completions will answer 400")


# what the runtime applies by default, as generate() would; and what it cannot apply
DEFAULT_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
UNAPPLIED = {"num_beams": 1, "min_p": None, "typical_p": 1.0, "no_repeat_ngram_size": 0,
             "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None, "bad_words_ids": None,
             "sequence_bias": None, "suppress_tokens": None, "begin_suppress_tokens": None,
             "min_length": 0, "min_new_tokens": None, "encoder_repetition_penalty": 1.0,
             "exponential_decay_length_penalty": None, "guidance_scale": None,
             "forced_bos_token_id": None, "forced_eos_token_id": None}


def generation_defaults(model: Any) -> tuple[dict[str, Any], list[str]]:
    """The decoding settings the model's generation_config sets explicitly (the runtime's
    defaults, as vLLM takes them), and the ones it sets that the runtime does not apply."""
    config = model.generation_config
    explicit = config.to_diff_dict()
    kinds = {"do_sample": bool, "top_k": int}
    defaults = {name: kinds.get(name, float)(explicit[name]) for name in DEFAULT_FIELDS
                if explicit.get(name) is not None}
    unapplied = [f"{name}={explicit[name]!r}" for name, off in UNAPPLIED.items()
                 if explicit.get(name) not in (None, off)]
    return defaults, unapplied


def _find(seq: list[int], sub: list[int]) -> int:
    for i in range(len(seq) - len(sub) + 1):
        if seq[i:i + len(sub)] == sub:
            return i
    return -1
