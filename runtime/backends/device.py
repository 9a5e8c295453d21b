"""Logits that stay in device memory: what forward() returns on the cuda and trt backends.

The heads bind `ptr` directly (no host copy); host code that indexes a row
(`logits[-1]`, as AdaptiveK and the host acceptance rules do) copies only what
it asks for, and `np.asarray(logits)` copies everything.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

RowsToHost = Callable[[int, int], np.ndarray]     # (first row, row count) -> (count, vocab)


class DeviceLogits:
    """A (new_len, vocab) view of a device buffer, valid until the session's next call."""

    def __init__(self, ptr: int, rows: int, vocab: int, dtype: np.dtype, device: str,
                 rows_to_host: RowsToHost, device_id: int = 0, first: int = 0) -> None:
        self.ptr, self.device, self.device_id = ptr, device, device_id
        self.shape = (rows, vocab)
        self.dtype = np.dtype(dtype)
        self._rows_to_host, self._first = rows_to_host, first

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: int | slice):
        """An int gives that row on the host (vocab,); a slice gives a device view."""
        rows = self.shape[0]
        if isinstance(index, slice):
            start, stop, step = index.indices(rows)
            if step != 1:
                raise IndexError("device logits: only contiguous row slices are supported")
            count = max(0, stop - start)
            return DeviceLogits(self.ptr + start * self.row_bytes, count, self.shape[1],
                                self.dtype, self.device, self._rows_to_host, self.device_id,
                                self._first + start)
        if isinstance(index, (int, np.integer)):
            i = int(index) + rows if index < 0 else int(index)
            if not 0 <= i < rows:
                raise IndexError(f"device logits: row {index} of {rows}")
            return self._rows_to_host(self._first + i, 1)[0]
        raise TypeError(f"device logits: index with an int or a slice, not {type(index).__name__}")

    @property
    def row_bytes(self) -> int:
        return self.shape[1] * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """Every row, copied to the host: (new_len, vocab)."""
        return self._rows_to_host(self._first, self.shape[0])

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        return (f"DeviceLogits(shape={self.shape}, dtype={self.dtype}, device={self.device}:"
                f"{self.device_id}, ptr=0x{self.ptr:x})")
