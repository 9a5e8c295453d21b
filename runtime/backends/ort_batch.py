"""OrtCpuSession's batch: slots 0..B-1 in one call, each row at its own past length
(docs/design.md §11; ort.py's docstring says how each graph flavour binds them). A mixin: it
works on the session's arenas, host buffers and binders, which ort.py sets up.
"""
from __future__ import annotations

import numpy as np

from .. import contract
from ..errors import BackendError
from .ort_rows import RowsGraph
from .ort_session import binders, runner


class OrtBatchMixin:
    """forward_rows and what it needs: the rows graph, the standard flavour's scratch, the
    ort flavour's one row at a time, and the rows' top outputs."""

    def open_rows(self) -> RowsGraph | None:
        """Open the target's rows graph (design §11: a batch's k+1 tokens per row in one call)
        where the bundle has one and this session batches; a second ONNX Runtime session over
        the same arenas, holding its own prepacked copy of the weights."""
        if self._rows is not None or self._rows_file is None:
            return self._rows
        where = self._rows_file
        try:
            session = self._open(where, self.threads)
        except Exception as exc:  # ORT raises its own exception types
            raise BackendError(f"ONNX Runtime cannot load {where}: {exc} ---> HINT: re-run "
                               f"ssd-export, or load with max_batch=1.") from None
        self._rows = RowsGraph(self, session,
                               lambda binding: binders(binding, self.device, self.device_id),
                               runner)
        return self._rows

    @property
    def rows_graph(self) -> bool:
        """Whether a batch's several new tokens per row run in one call of the rows graph."""
        return self._rows_file is not None

    def _allocate_scratch(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Standard graph, batches: per layer, where a call's new keys and values land (flat,
        viewed as (B, T, Hkv, D)) before their real rows are copied into the arena."""
        e = self.entry
        size = self.max_batch * self.max_new_len * e.num_kv_heads * e.head_dim
        return [(np.zeros(size, self.kv_dtype), np.zeros(size, self.kv_dtype))
                for _ in range(e.num_layers)]

    def forward_rows(self, token_ids: np.ndarray, past_lens: np.ndarray,
                     real: np.ndarray | None = None) -> np.ndarray:
        """Slots 0..B-1 in one call: row b's T tokens `token_ids[b]` at positions
        past_lens[b].., its keys/values written at those rows of slot b; `real[b]` of them are
        real (the rest pad the row and their rows are not kept: default all). Returns the
        logits (B, T, vocab), valid until the next call."""
        B, T = token_ids.shape
        if B == 1:        # as one sequence runs (host rows on a GPU backend: the batch decides
            #               on the host, design §11)
            return np.asarray(self.forward(token_ids[0], int(past_lens[0])))[None]
        if B > self.max_batch or T > self.max_new_len:
            raise BackendError(f"{self.name}: a batch of {B} rows of {T} tokens exceeds this "
                               f"session's {self.max_batch} slots of {self.max_new_len}.")
        if int(past_lens.max()) + T > self.max_context:
            raise BackendError(f"{self.name}: positions up to {int(past_lens.max()) + T} exceed "
                               f"the bundle's max_context {self.max_context}.")
        e, width = self.entry, B * T
        if T > 1 and not self.batches_new_tokens:
            return self._rows_one_by_one(token_ids, past_lens, real)
        ids = self.ids[0, :width].reshape(B, T)
        positions = self.positions[0, :width].reshape(B, T)
        ids[:] = token_ids
        positions[:] = past_lens[:, None] + np.arange(T)
        if T > 1 and self._rows_file is not None:     # the ort target's rows graph (§11)
            (self._rows or self.open_rows()).run(B, T, int(past_lens.max()) + T)
            self._pass_aux(B, T, past_lens, real)
            return self._rows_logits(B, T)
        if self.in_place:
            self._bind_caches(0, B)
            self._bind_attend(int(past_lens.max()) + T)
        else:
            self._bind_scratch(B, T)
        bind_host = self._bind_host_in
        bind_host(contract.INPUT_IDS, np.int64, (B, T), self._ids_ptr)
        bind_host(contract.POSITION_IDS, np.int64, (B, T), self._pos_ptr)
        self._bind_mask(B, T)
        self._bind_extras(B, T)
        self._bind_out(contract.LOGITS, self.logits_dtype, (B, T, e.vocab_size),
                       self._logits_addr)
        self._bound_len = None
        self._run_bound()
        if not self.in_place:
            self._keep_new_rows(B, T, past_lens, np.full(B, T) if real is None else real)
        self._pass_aux(B, T, past_lens, real)
        return self._rows_logits(B, T)

    def _rows_logits(self, B: int, T: int) -> np.ndarray:
        """forward_rows' logits (B, T, vocab) on the host, valid until the next call."""
        V = self.entry.vocab_size
        return self.logits[:B * T * V].reshape(B, T, V)

    @property
    def batches_new_tokens(self) -> bool:
        """Whether one call may carry several rows of several new tokens each. ONNX Runtime's
        GroupQueryAttention (the ort flavour) refuses it: "batch_size must be 1 when
        sequence_length > 1 and past context is given" (1.32), so forward_rows runs such
        calls one row at a time, unless the bundle has the target's rows graph
        (ModelEntry.rows, design §11). The standard and static flavours take them."""
        return self.entry.graph != contract.ORT or self._rows_file is not None

    def _rows_one_by_one(self, token_ids: np.ndarray, past_lens: np.ndarray,
                         real: np.ndarray | None) -> np.ndarray:
        """The ort flavour's several new tokens per row: one call per row with real tokens,
        each in its slot, its logits at its row of the (B, T, vocab) result."""
        B, T = token_ids.shape
        for b in range(B):
            n = T if real is None else int(real[b])
            if n:
                self._run(token_ids[b, :n], int(past_lens[b]), logits_out=True, slot=b,
                          logits_row=b * T)
        V = self.entry.vocab_size
        return self.logits[:B * T * V].reshape(B, T, V)

    def top_rows(self, rows: int) -> tuple[np.ndarray, np.ndarray] | None:
        """forward_rows' last-row argmax and probability per row, where the graph gives them."""
        if self._top is None:
            return None
        return self._top[0][:rows], self._top[1][:rows]

    def _bind_scratch(self, B: int, T: int) -> None:
        """Standard graph, a batch: slots 0..B-1 whole as the past (B, max_context, Hkv, D),
        the new rows (B, T, Hkv, D) into the scratch buffers (never over an input)."""
        self.binding.clear_binding_inputs()
        self.binding.clear_binding_outputs()
        bind_in, bind_out, kv_type, e = self._bind_in, self._bind_out, self.kv_dtype, self.entry
        past_shape = (B, self.max_context, e.num_kv_heads, e.head_dim)
        new_shape = (B, T, e.num_kv_heads, e.head_dim)
        assert self._scratch is not None
        for (past_k, past_v, new_k, new_v, k_ptr, v_ptr), (sk, sv) in zip(self.layers,
                                                                         self._scratch):
            bind_in(past_k, kv_type, past_shape, k_ptr)
            bind_in(past_v, kv_type, past_shape, v_ptr)
            bind_out(new_k, kv_type, new_shape, sk.ctypes.data)
            bind_out(new_v, kv_type, new_shape, sv.ctypes.data)

    def _keep_new_rows(self, B: int, T: int, past_lens: np.ndarray, real: np.ndarray) -> None:
        """Copy each row's real new keys/values from the scratch into its slot at its length."""
        e = self.entry
        rows = np.concatenate([np.full(int(n), b) for b, n in enumerate(real)]).astype(np.intp)
        steps = np.concatenate([np.arange(int(n)) for n in real]).astype(np.intp)
        at = past_lens[rows] + steps
        shape = (B, T, e.num_kv_heads, e.head_dim)
        size = B * T * e.num_kv_heads * e.head_dim
        assert self._scratch is not None
        for keys, values, (sk, sv) in zip(self.keys, self.values, self._scratch):
            keys[rows, at] = sk[:size].reshape(shape)[rows, steps]
            values[rows, at] = sv[:size].reshape(shape)[rows, steps]
