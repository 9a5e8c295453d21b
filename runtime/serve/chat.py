"""Chat messages -> prompt token ids, with the bundle's chat template.

Rendered as Hugging Face `apply_chat_template` does: a sandboxed jinja2
environment with trim_blocks/lstrip_blocks, `raise_exception`, `tojson`,
`strftime_now`, `add_generation_prompt=True`, and the special tokens as text;
the result is tokenized without adding special tokens again.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .protocol import ApiError

if TYPE_CHECKING:
    from ..generator import Generator

log = logging.getLogger("ssd_runtime.serve")


class ChatTemplate:
    """The bundle's `tokenizer.chat_template`, compiled once; None when the bundle has none."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        source = generator.manifest.tokenizer.chat_template
        if isinstance(source, dict):      # named templates, from a bundle of before the export
            source = source.get("default")    # chose one: apply_chat_template's without tools
        self.template, self.problem = None, ""
        try:
            self.template = _compile(source) if source else None
        except ConfigError as exc:       # completions still serve; chat says why it cannot
            self.problem = str(exc)
            log.warning("%s /v1/chat/completions will answer 400.", exc)
        self.special_tokens = _special_tokens(generator)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        if self.problem:
            raise ApiError(400, f"this model's chat template cannot be used: {self.problem}",
                           "messages", "chat_template_error")
        if self.template is None:
            raise ApiError(400, "this model has no chat template (the bundle's manifest has no "
                                "tokenizer.chat_template), so /v1/chat/completions cannot build a "
                                "prompt. ---> HINT: use /v1/completions with your own prompt "
                                "format, or export from a tokenizer that has a chat template.",
                           "messages", "no_chat_template")
        from jinja2 import TemplateError

        try:
            text = self.template.render(messages=messages, add_generation_prompt=True, tools=None,
                                        documents=None, **self.special_tokens)
        except TemplateError as exc:
            raise ApiError(400, f"the chat template refused these messages: {exc}",
                           "messages") from None
        try:
            return self.generator.codec.tokens(text)
        except ConfigError as exc:
            raise ApiError(400, f"messages: {exc}", "messages") from None


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


def _special_tokens(generator: Generator) -> dict[str, str]:
    """bos_token / eos_token / pad_token (/ unk_token) as text, as apply_chat_template passes
    them: the Hugging Face tokenizer's own, recorded by the export; a bundle of schema 4 or
    older has only ids, and the first EOS id stands for eos_token."""
    entry, tokenizer = generator.manifest.tokenizer, generator.codec.tokenizer
    if entry.special_tokens:
        return dict(entry.special_tokens)
    ids = {"bos_token": entry.bos_token_id, "pad_token": entry.pad_token_id,
           "eos_token": entry.eos_token_ids[0] if entry.eos_token_ids else None}
    tokens = {name: tokenizer.id_to_token(i) for name, i in ids.items() if i is not None}
    return {name: token for name, token in tokens.items() if token is not None}
