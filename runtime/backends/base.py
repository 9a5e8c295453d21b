"""The backend interface: one model graph, its KV arena, and a forward call.

A session is stateless about sequence length: the caller passes `past_len`
and decides how far the length advances, which is what makes rollback free.
"""
from __future__ import annotations

from typing import Protocol, Union

import numpy as np

from .device import DeviceLogits

# a manifest's kv_dtype / logits_dtype names and the numpy types every backend binds
DTYPES = {"float32": np.float32, "float16": np.float16}
Logits = Union[np.ndarray, DeviceLogits]     # (new_len, vocab): host array, or device memory


class ModelSession(Protocol):
    name: str            # "target" | "draft"
    backend: str         # "cpu" | "cuda" | "trt"
    threads: int | None  # intra-op threads (ORT); 1 on trt, where one thread drives the GPU
    max_context: int
    max_new_len: int     # most tokens one decode call may carry

    def forward(self, token_ids: np.ndarray, past_len: int) -> Logits:
        """Run `token_ids` at positions past_len.. and write their keys/values
        into rows past_len.. of the arena. Returns logits (new_len, vocab), valid
        until the next call: a float32 host array on cpu, DeviceLogits on cuda and
        trt (indexing a row copies that row to the host; the heads bind them as is)."""
        ...

    def prefill(self, token_ids: np.ndarray, past_len: int = 0) -> None:
        """Like forward, for any length up to max_context, logits discarded."""
        ...

    def top(self) -> tuple[int, float] | None:
        """The last call's last-row argmax and its softmax probability when the graph gives
        them (contract.TOP_ID, TOP_PROB: "ort" flavour drafts), else None."""
        ...
