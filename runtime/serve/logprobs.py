"""OpenAI's `logprobs` bodies from the target's log-probabilities (round/logprobs.py).

Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"};
chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
"bytes"}]}], "refusal": None} — the shapes of openai/types/completion_choice.py and
chat/chat_completion_token_logprob.py.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..round.logprobs import TokenLogprob
    from ..text import TextCodec


class TokenNames:
    """A token id's text (its own decoding, special tokens shown) and UTF-8 bytes (for a
    byte-level BPE token its bytes, also where they are part of a character)."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        decoder = json.loads(codec.tokenizer.to_str()).get("decoder")
        self.byte_level = "ByteLevel" in json.dumps(decoder)    # its vocabulary spells bytes
        self.text = lru_cache(maxsize=65536)(self._text)
        self.bytes = lru_cache(maxsize=65536)(self._bytes)

    def _text(self, token: int) -> str:
        return self.codec.tokenizer.decode([token], skip_special_tokens=False)

    def _bytes(self, token: int) -> list[int]:
        piece = self.codec.tokenizer.id_to_token(token) or ""
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                return [int(piece[3:5], 16)]        # a byte-fallback token: <0x0A>
            except ValueError:
                pass
        table = _byte_decoder()
        if self.byte_level and piece and all(ch in table for ch in piece):    # GPT-2's alphabet
            return [table[ch] for ch in piece]
        return list(self.text(token).encode("utf-8"))


def completion_logprobs(tokens: list[TokenLogprob], names: TokenNames,
                        offset: int = 0) -> dict[str, Any]:
    """`offset`: the text's length before these tokens (a stream's earlier chunks)."""
    texts = [names.text(t.token) for t in tokens]
    offsets, at = [], offset
    for text in texts:
        offsets.append(at)
        at += len(text)
    tops = []
    for t in tokens:                  # the N likeliest and the emitted token (up to N + 1)
        top = {names.text(i): lp for i, lp in t.top}
        top.setdefault(names.text(t.token), t.logprob)
        tops.append(top)
    return {"tokens": texts, "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(tokens: list[TokenLogprob], names: TokenNames) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        return {"token": names.text(token), "logprob": logprob, "bytes": names.bytes(token)}

    return {"content": [{**entry(t.token, t.logprob),
                         "top_logprobs": [entry(i, lp) for i, lp in t.top]} for t in tokens],
            "refusal": None}


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars
