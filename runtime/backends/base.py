"""The backend interface: one model graph, its KV arena, and a forward call.

A session is stateless about sequence length: the caller passes `past_len`
and decides how far the length advances, which is what makes rollback free.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class ModelSession(Protocol):
    name: str            # "target" | "draft"
    backend: str         # "cpu" | "cuda" | "trt"
    max_context: int
    max_new_len: int     # most tokens one decode call may carry

    def forward(self, token_ids: np.ndarray, past_len: int) -> np.ndarray:
        """Run `token_ids` at positions past_len.. and write their keys/values
        into rows past_len.. of the arena. Returns logits (new_len, vocab) as a
        float32 host array that stays valid until the next call."""
        ...

    def prefill(self, token_ids: np.ndarray, past_len: int = 0) -> None:
        """Like forward, for any length up to max_context, logits discarded."""
        ...
