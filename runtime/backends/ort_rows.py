"""The ort target's rows graph on ONNX Runtime's CPU provider (docs/design.md §2, §11).

GroupQueryAttention refuses a batch of several new tokens per row after a past, so an ort
target's batched verification would run one row at a time and read the weights B times. The
rows graph (contract.ROWS) takes such a call whole: it binds the very arenas of the ort
session (head-major, whole, past_* and present_* over the same memory, as the static flavour:
its ScatterND writes the new rows in place) and attends over the first L cache rows only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import contract
from ..errors import BackendError
from ..manifest import ModelEntry


def rows_path(model_path: Path, entry: ModelEntry) -> Path:
    """The rows graph's file: entry.rows is relative to the bundle root, as entry.path is."""
    root = Path(model_path).parents[len(Path(entry.path).parts) - 1]
    return root / entry.rows


class RowsGraph:
    """A second session over an OrtCpuSession's arenas and host buffers; `run` binds and
    runs one call of B rows of T tokens whose ids and positions are already in the buffers.
    `binders(binding)` and `runner(session, binding)` are the owner's fast bind and run."""

    def __init__(self, owner, session, binders, runner) -> None:
        self.owner, self.session = owner, session
        found = [i.name for i in self.session.get_inputs()]
        self.takes_trees = found[-1:] == [contract.TREE_MASK]   # (ort_tree.py; design §2)
        found = found[:-1] if self.takes_trees else found
        want = contract.input_names(owner.entry.num_layers, contract.ROWS)
        if found != want:
            raise BackendError(f"{owner.name} rows graph does not follow the contract: "
                               f"inputs {found[:3]}…{found[-1:]}, expected {want[:3]}…"
                               f"{want[-1:]}. ---> HINT: re-run ssd-export.")
        self.binding = self.session.io_binding()
        self._bind_in, self._bind_out = binders(self.binding)
        self._run = runner(self.session, self.binding)
        # the ort graph's names and arena addresses, which are the rows graph's too
        assert all(contract.kv_output_names(i, contract.ROWS) == tuple(layer[2:4])
                   for i, layer in enumerate(owner.layers))
        self.layers = owner.layers
        self._host = (owner.ids.ctypes.data, owner.positions.ctypes.data,
                      owner.logits.ctypes.data)                 # (the CPU session's own memory)
        # attend_rows: only its length L is read; one buffer, viewed as (L,)
        self.attend = np.zeros(owner.max_context, np.int64)
        self._slots: int | None = None          # how many slots the caches are bound for

    def run(self, B: int, T: int, live: int, trees: bool = False) -> None:
        """Slots 0..B-1, T tokens each, attention over cache rows [0, live); `trees`: the
        owner's mask buffer holds the rows' trees (OrtTreeMixin.forward_rows_tree)."""
        owner, e = self.owner, self.owner.entry
        if self._slots != B:
            # the binding rule's one exception (design §2): the whole cache as past and present,
            # one address, which the graph's ScatterND updates in place
            whole, kv_type = (B, e.num_kv_heads, owner.cache_rows, e.head_dim), owner.kv_dtype
            for past_k, past_v, present_k, present_v, k_ptr, v_ptr in self.layers:
                self._bind_in(past_k, kv_type, whole, k_ptr)
                self._bind_in(past_v, kv_type, whole, v_ptr)
                self._bind_out(present_k, kv_type, whole, k_ptr)
                self._bind_out(present_v, kv_type, whole, v_ptr)
            self._slots = B
        ids, positions, logits = self._host
        self._bind_in(contract.INPUT_IDS, np.int64, (B, T), ids)
        self._bind_in(contract.POSITION_IDS, np.int64, (B, T), positions)
        self._bind_in(contract.ATTEND_ROWS, np.int64, (live,), self.attend.ctypes.data)
        if self.takes_trees:          # B chains' lower triangles, as the owner keeps them
            owner._bind_mask(B, T, self._bind_in, trees)
        for name, buf in owner.extra_out.items():     # a head's features (design §14)
            self._bind_out(name, np.float32, (B, T, buf.shape[1]), buf.ctypes.data)
        self._bind_out(contract.LOGITS, owner.logits_dtype, (B, T, e.vocab_size), logits)
        self._run()
