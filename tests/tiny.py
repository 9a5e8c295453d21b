"""Tiny models and a real tokenizer, built from configs for the tests (no downloads).

The tokenizer is a byte-level BPE trained on a few standard-library files;
model weights are drawn with a large init so that greedy choices are not
near-ties between Hugging Face and ONNX Runtime.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

VOCAB = 384
SPECIALS = ["<s>", "</s>", "<pad>"]
CORPUS_FILES = ("textwrap.py", "string.py", "fnmatch.py", "bisect.py")


def build_tokenizer(folder: Path):
    """A PreTrainedTokenizerFast that prepends <s>, like Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = [(stdlib / name).read_text() for name in CORPUS_FILES]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(folder)
    return fast


def config_for(kind: str, vocab: int, layers: int = 2, hidden: int = 64, **extra):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=256, initializer_range=0.25, bos_token_id=0,
                  eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    common.update(extra)
    if kind == "llama":
        return LlamaConfig(**common)
    if kind == "mistral":
        return MistralConfig(sliding_window=common.pop("sliding_window", 16), **common)
    if kind == "qwen2":
        return Qwen2Config(**common)
    raise ValueError(kind)


def build_model(folder: Path, kind: str, tokenizer, seed: int, **config_extra) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = config_for(kind, len(tokenizer), **config_extra)
    model = AutoModelForCausalLM.from_config(config).eval()
    _save(model, tokenizer, folder)
    return folder


def truncate(source: Path, folder: Path, layers: int, tokenizer) -> Path:
    """The source model cut to its first `layers` layers (a draft that partly agrees)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    _save(model, tokenizer, folder)
    return folder


def _save(model, tokenizer, folder: Path) -> None:
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
