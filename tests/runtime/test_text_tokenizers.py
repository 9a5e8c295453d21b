"""Text as Hugging Face's tokenizer gives it, for the tokenizer kinds real models use beside
byte-level BPE: SentencePiece-style BPE with byte fallback (Llama 2, Mistral, Gemma), Unigram
with the decode's clean-up of spaces, and split_special_tokens. Streamed pieces, in any
chunking, join to exactly `tokenizer.decode(ids, skip_special_tokens=True)`."""
from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import pytest

from ssd_export.pair import text_settings
from ssd_runtime.manifest import TokenizerEntry
from ssd_runtime.text import TextCodec, TextStream

CORPUS = ("textwrap.py", "string.py")
SPECIALS = ["<s>", "</s>", "<unk>"]


def _text() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text() for name in CORPUS] + ["héllo wörld ✓ 日本語 😀 don't .", ]


def byte_fallback_bpe():
    """Llama 2's pipeline: Metaspace-style "▁", BPE with byte fallback, BOS added."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=SPECIALS + bytes_,
                                  show_progress=False)
    tok.train_from_iterator(_text(), trainer)
    return tok


def unigram():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(_text(), trainers.UnigramTrainer(
        vocab_size=600, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False))
    return tok


def codec_and_hf(tok, folder: Path, **hf_settings):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>", **hf_settings)
    hf.save_pretrained(folder)
    hf = PreTrainedTokenizerFast.from_pretrained(folder)     # as the export reads it
    entry = TokenizerEntry(path="tokenizer.json", prefix_ids=[], suffix_ids=[],
                           eos_token_ids=[1], **text_settings(hf))
    return TextCodec(folder, entry), hf


def streamed(codec: TextCodec, ids: list[int], rng: random.Random,
             pieces_wanted: bool = True) -> tuple[str, str]:
    stream, pieces, i = TextStream(codec, pieces=pieces_wanted), [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        pieces.append(stream.push(ids[i:i + n]))
        i += n
    pieces.append(stream.flush())
    return "".join(pieces), stream.text


@pytest.mark.parametrize("kind", ["byte_fallback", "unigram_clean_up"])
def test_streamed_text_is_hugging_faces_decode(tmp_path, kind):
    if kind == "byte_fallback":
        codec, hf = codec_and_hf(byte_fallback_bpe(), tmp_path)
        assert len(codec.byte_ids) == 256 and not codec.entry.clean_up_spaces
    else:
        codec, hf = codec_and_hf(unigram(), tmp_path, clean_up_tokenization_spaces=True)
        assert codec.entry.clean_up_spaces        # not BPE: transformers applies it
    rng, vocab = random.Random(0), hf.backend_tokenizer.get_vocab_size()
    byte_ids = sorted(codec.byte_ids) or [hf.convert_tokens_to_ids(",")]
    punct = [i for i in (hf.convert_tokens_to_ids(t) for t in ("▁.", ".", "▁,", "'", "▁'"))
             if i is not None and i != hf.unk_token_id]
    cases = []
    if codec.byte_ids:       # a newline, then an emoji cut short: HF decodes all three as U+FFFD
        cases.append([hf.convert_tokens_to_ids(t) for t in ("<0x0A>", "<0xF0>", "<0x9F>")])
    for _ in range(300):     # random ids, rich in byte tokens and clean-up punctuation
        cases.append([rng.choice(byte_ids + punct) if rng.random() < 0.4 else
                      rng.randrange(3, vocab) for _ in range(rng.randint(1, 24))])
    for ids in cases:
        expected = hf.decode(ids, skip_special_tokens=True)
        assert codec.decode(ids) == expected, ids
        joined, text = streamed(codec, ids, rng)
        assert joined == text == expected, ids
        # generate()'s whole text, decoded once at the end: the same
        assert streamed(codec, ids, rng, pieces_wanted=False) == (expected, expected), ids


def test_split_special_tokens_encodes_them_as_text(tmp_path):
    tok = byte_fallback_bpe()
    tok.add_special_tokens(["<|im_start|>"])
    for split in (False, True):
        codec, hf = codec_and_hf(tok, tmp_path / str(split), split_special_tokens=split)
        assert codec.entry.split_special_tokens is split
        for text in ("x<|im_start|>y", "<|im_start|>user\nhi"):
            assert codec.tokens(text) == hf(text, add_special_tokens=False)["input_ids"], text
