"""Text in and out: the bundle's tokenizer, used as Hugging Face would.

The exporter records which ids the Hugging Face tokenizer adds around a text
(prefix/suffix, e.g. BOS); encoding here adds exactly those.
"""
from __future__ import annotations

from pathlib import Path

from .manifest import TokenizerEntry


class TextCodec:
    def __init__(self, root: Path, entry: TokenizerEntry) -> None:
        from tokenizers import Tokenizer

        self.entry = entry
        self.tokenizer = Tokenizer.from_file(str(root / entry.path))

    def encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [*self.entry.prefix_ids, *ids, *self.entry.suffix_ids]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


class IncrementalDecoder:
    """Turns a growing list of ids into text pieces.

    Decodes the whole tail since the last complete character, so byte-level
    BPE tokens that split a UTF-8 character are held back until complete.
    """

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.codec.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece

    def flush(self) -> str:
        text = self.codec.decode(self.ids)
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece
