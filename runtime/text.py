"""Text in and out: the bundle's tokenizer, used as Hugging Face would.

The exporter records which ids the Hugging Face tokenizer adds around a text
(prefix/suffix, e.g. BOS); encoding here adds exactly those. `TextStream`
turns accepted ids into text pieces and cuts the output at stop strings.
"""
from __future__ import annotations

from pathlib import Path

from .errors import ConfigError
from .manifest import TokenizerEntry


class TextCodec:
    def __init__(self, root: Path, entry: TokenizerEntry) -> None:
        from tokenizers import Tokenizer

        self.entry = entry
        self.tokenizer = Tokenizer.from_file(str(root / entry.path))
        self.tokenizer.encode_special_tokens = entry.split_special_tokens
        # byte-fallback tokens (<0x0A>...; Llama 2, Mistral, Gemma): their decoder turns a whole
        # run of them into U+FFFD when the run is not valid UTF-8, bytes that were valid on
        # their own included, so the stream holds a run's text until the run ends
        self.byte_ids = {i for b in range(256)
                         if (i := self.tokenizer.token_to_id(f"<0x{b:02X}>")) is not None}

    def encode(self, text: str) -> list[int]:
        """Ids as the Hugging Face tokenizer gives them, its added ids (BOS...) included."""
        return [*self.entry.prefix_ids, *self.tokens(text), *self.entry.suffix_ids]

    def tokens(self, text: str) -> list[int]:
        """The text's own ids, nothing added; text that is not valid Unicode (a lone
        surrogate, from bytes decoded with surrogateescape or a bad "\\ud800" escape) is a
        ConfigError naming where, not the tokenizer's TypeError."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"the text is not valid Unicode: {exc.reason} at character "
                              f"{exc.start} ({text[exc.start]!r}). ---> HINT: pass UTF-8 text; "
                              f"a lone surrogate usually comes from bytes decoded wrongly.") \
                from None
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """The text Hugging Face's tokenizer.decode(ids, skip_special_tokens=True) gives."""
        return self.clean(self.raw(ids))

    def raw(self, ids: list[int]) -> str:
        """tokenizer.json's decoding alone, before the clean-up of spaces."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def clean(self, text: str) -> str:
        if not self.entry.clean_up_spaces:
            return text
        for spaced, tight in CLEAN_UP:
            text = text.replace(spaced, tight)
        return text


# transformers' clean_up_tokenization, in its order
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


class TextStream:
    """Growing ids → safe text pieces, stopping at the first stop string.

    Text that could still become a stop string, or that ends in half a UTF-8
    character, is held back until the next push decides it. Decoding is
    incremental, as in Hugging Face's and vLLM's detokenizers: each push decodes
    only the ids since the last complete character (plus those before them, so
    that a decoder's word-boundary rules see the same context), never the whole
    output again.
    """

    def __init__(self, codec: TextCodec, stops: list[str] | None = None,
                 pieces: bool = True) -> None:
        self.codec, self.stops = codec, [s for s in (stops or []) if s]
        # pieces=False (generate(): only the whole text is wanted): without stop strings
        # nothing needs the text before the end, so push only gathers ids and flush decodes
        # them once, the same text, and no decoding per token (docs/performance.md, "Quantized
        # peers": "Where the int4 step gap was")
        self.lazy = not pieces and not self.stops
        # held back: the start of a stop string, and of a space the clean-up may still remove
        self._held = [*self.stops, *(s for s, _ in CLEAN_UP)] if codec.entry.clean_up_spaces \
            else self.stops
        self.ids: list[int] = []
        self.text = ""            # text emitted so far
        self.stopped = False
        self._decoded = ""        # text of ids[:_read], up to its last complete character
        self._prefix = 0          # ids[_prefix:_read] were decoded last time, for context
        self._read = 0

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        if self.lazy:
            return ""
        self._decoded += self._new_text()
        full = self.codec.clean(self._decoded)
        if (piece := self._cut(full)) is not None:
            return piece
        hold = max([_overlap(full, s) for s in self._held] + [0])
        return self._emit(full[:len(full) - hold])

    def flush(self) -> str:
        """The rest, once no ids will follow: held-back text, a last run of byte tokens (which
        may hold a stop string too)."""
        if self.stopped:
            return ""
        full = self.codec.decode(self.ids)
        piece = self._cut(full)
        return self._emit(full) if piece is None else piece

    def _cut(self, full: str) -> str | None:
        """At the first stop string past the emitted text (which holds no stop string nor the
        start of one): stop there, keep the ids before it, and emit up to it; None if none."""
        cuts = [i for i in (full.find(s, len(self.text)) for s in self.stops) if i >= 0]
        if not cuts:
            return None
        self.stopped = True
        self._trim_ids(min(cuts))
        return self._emit(full[:min(cuts)])

    def _new_text(self) -> str:
        """Text of the ids since `_read` (before the clean-up of spaces), or "" while it ends
        in half a character or in a run of byte-fallback tokens that may yet turn invalid."""
        if self.ids and self.ids[-1] in self.codec.byte_ids:
            return ""
        decode = self.codec.raw
        before = decode(self.ids[self._prefix:self._read])
        window = decode(self.ids[self._prefix:])
        if len(window) <= len(before) or window.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return window[len(before):]

    def _emit(self, upto: str) -> str:
        piece = upto[len(self.text):] if upto.startswith(self.text) else ""
        self.text = upto if upto.startswith(self.text) else self.text
        return piece

    def _trim_ids(self, cut: int) -> None:
        """Keep the longest prefix of ids whose text ends before the stop string."""
        m = len(self.ids)
        while m > 0 and len(self.codec.decode(self.ids[:m])) > cut:
            m -= 1
        self.ids = self.ids[:m]


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
