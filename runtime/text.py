"""Text in and out: the bundle's tokenizer, used as Hugging Face would.

The exporter records which ids the Hugging Face tokenizer adds around a text
(prefix/suffix, e.g. BOS); encoding here adds exactly those. `ChatTemplate`
renders chat messages with the bundle's template. `TextStream` turns accepted
ids into text pieces and cuts the output at stop strings.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

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


class ChatTemplate:
    """Chat messages -> prompt ids with the bundle's `tokenizer.chat_template`, rendered as
    Hugging Face's `apply_chat_template` renders it: a sandboxed jinja2 environment with
    trim_blocks/lstrip_blocks, `raise_exception`, `tojson`, `strftime_now`,
    `add_generation_prompt=True` and the special tokens as text; the result is tokenized
    without adding special tokens again. Compiled once; `problem` says why a template the
    bundle has cannot be used (it does not compile, or jinja2 is not installed)."""

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        source = codec.entry.chat_template
        if isinstance(source, dict):      # named templates, from a bundle of before the export
            source = source.get("default")    # chose one: apply_chat_template's without tools
        self.template, self.problem = None, ""
        try:
            self.template = _compile(source) if source else None
        except ConfigError as exc:
            self.problem = str(exc)
        except ImportError:
            self.problem = ("rendering it needs jinja2, which is not installed. ---> HINT: pip "
                            "install jinja2 (or 'ssd-toolkit[serve]')")
        self.special_tokens = _special_tokens(codec)

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The prompt's text; a ConfigError where there is no usable template or it refuses
        these messages."""
        if self.problem:
            raise ConfigError(f"this model's chat template cannot be used: {self.problem}")
        if self.template is None:
            raise ConfigError("this model has no chat template (the bundle's manifest has no "
                              "tokenizer.chat_template). ---> HINT: give the prompt as text in "
                              "the model's own format, or export from a tokenizer that has a "
                              "chat template.")
        from jinja2 import TemplateError

        try:
            return self.template.render(messages=messages, add_generation_prompt=True,
                                        tools=None, documents=None, **self.special_tokens)
        except TemplateError as exc:
            raise ConfigError(f"the chat template refused these messages: {exc}") from None

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.codec.tokens(self.render(messages))


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


def _compile(source: str) -> Any:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    class Generation(Extension):
        """{% generation %}...{% endgeneration %} marks the assistant's part for training
        masks (Hugging Face's AssistantTracker); rendering a prompt, it is its body as is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, Generation])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"the bundle's tokenizer.chat_template does not compile: {exc} (line "
                          f"{exc.lineno}). ---> HINT: fix the template in the tokenizer config "
                          f"and re-export the bundle.") from None


def _special_tokens(codec: TextCodec) -> dict[str, str]:
    """bos_token / eos_token / pad_token (/ unk_token) as text, as apply_chat_template passes
    them: the Hugging Face tokenizer's own, recorded by the export; a bundle of schema 4 or
    older has only ids, and the first EOS id stands for eos_token."""
    entry, tokenizer = codec.entry, codec.tokenizer
    if entry.special_tokens:
        return dict(entry.special_tokens)
    ids = {"bos_token": entry.bos_token_id, "pad_token": entry.pad_token_id,
           "eos_token": entry.eos_token_ids[0] if entry.eos_token_ids else None}
    tokens = {name: tokenizer.id_to_token(i) for name, i in ids.items() if i is not None}
    return {name: token for name, token in tokens.items() if token is not None}
