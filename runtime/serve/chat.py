"""Chat messages -> prompt token ids for /v1/chat/completions: the runtime's
`text.ChatTemplate` (the bundle's template, rendered as Hugging Face's
apply_chat_template renders it), its refusals as the server's 400s.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..text import ChatTemplate as TextChatTemplate
from .protocol import ApiError

if TYPE_CHECKING:
    from ..generator import Generator

log = logging.getLogger("ssd_runtime.serve")


class ChatTemplate(TextChatTemplate):
    """The bundle's `tokenizer.chat_template`, compiled once; a template that cannot be used
    leaves completions serving and makes chat answer 400 with why."""

    def __init__(self, generator: Generator) -> None:
        super().__init__(generator.codec)
        if self.problem:
            log.warning("%s /v1/chat/completions will answer 400.", self.problem)

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
        try:
            text = self.render(messages)
        except ConfigError as exc:
            raise ApiError(400, str(exc), "messages") from None
        try:
            return self.codec.tokens(text)
        except ConfigError as exc:
            raise ApiError(400, f"messages: {exc}", "messages") from None
