"""ONNX Runtime backend on the CPU; ort_cuda.py puts the same binding on a GPU.

KV buffers are preallocated arenas per layer, in the layout of the bundle's graph flavour
(contract.py). "standard": sequence-major `(1, max_context, Hkv, D)`; each call binds the
past as the prefix `[:past_len]` and the new-KV outputs at row `past_len` of the same buffer.
"ort": head-major `(1, Hkv, max_context, D)`, bound whole as both past and present; the
GroupQueryAttention kernel sees the same address on both sides and writes the new rows in
place at the past length it reads from the positions. "static": the same arenas bound the
same way; its ScatterND writes the new rows in place, and its attention reads cache rows
[0, L), L = the call's longest past_len + new_len bound as `attend_rows` on every call
(schema 10; older static graphs read all rows). No KV copy ever, in any.

With `max_batch` S > 1 the arenas hold S slots, `(S, max_context, Hkv, D)` or
`(S, Hkv, max_context, D)`, one sequence each (docs/design.md §11). `forward`/`prefill` with
`slot=b` run one sequence in slot b's rows as above; `forward_rows` (ort_batch.py) runs
slots 0..B-1 in one call, each row at its own past length: "ort" binds the first B slots
whole, in place as before; "standard" binds them whole as the past (the graph masks each row
past its own length) and its new rows land in a scratch buffer, from which the real rows are
copied into the arena: only new rows are written, never the past.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from .. import contract
from ..contract import PREFILL_CHUNK
from ..errors import BackendError
from ..manifest import ModelEntry
from .base import DTYPES
from .ort_batch import OrtBatchMixin
from .ort_rows import RowsGraph, rows_path
from .ort_session import binders, check_onnxruntime, runner, session_options
from .ort_tree import OrtTreeMixin


class OrtCpuSession(OrtBatchMixin, OrtTreeMixin):
    """A model on ONNX Runtime's CPU provider with IOBinding over numpy arenas."""

    backend = "cpu"
    device, device_id = "cpu", 0          # where the arenas live (ort_cuda overrides)

    def __init__(self, name: str, path: Path, entry: ModelEntry, max_context: int,
                 max_new_len: int, threads: int | None = None, max_batch: int = 1) -> None:
        self.name, self.entry, self.threads = name, entry, threads
        self.max_context, self.max_new_len, self.max_batch = max_context, max_new_len, max_batch
        # an arena's rows a slot: max_context, and the rows past it the graph writes (an ort
        # target's dummy attention row, design §12)
        self.cache_rows = max_context + entry.spare_rows
        check_onnxruntime(name, entry)
        try:
            self.session = self._open(path, threads)
        except BackendError:
            raise
        except Exception as exc:  # ORT raises its own exception types
            hint = (f" ---> HINT: this graph has {entry.cpu_only} (ONNX Runtime contrib ops): "
                    f"use the onnxruntime it was exported with (the manifest's "
                    f"build.onnxruntime) or newer, or re-export with ssd-export --graph "
                    f"standard --draft-quant none." if entry.cpu_only else "")
            raise BackendError(f"ONNX Runtime cannot load {path}: {exc}{hint}") from None
        self._check_io()
        self.kv_dtype = DTYPES[entry.kv_dtype]
        self.row_bytes = entry.num_kv_heads * entry.head_dim * np.dtype(self.kv_dtype).itemsize
        # ids and positions: one flat buffer each, viewed as (1, n) or (B, T) per call
        width = max(max_new_len, PREFILL_CHUNK, max_batch * max_new_len)
        self.ids = np.zeros((1, width), np.int64)
        self.positions = np.zeros_like(self.ids)
        self.in_place = contract.in_place(entry.graph)    # arenas head-major, bound whole
        self._allocate()
        self.binding = self.session.io_binding()
        self._bind_in, self._bind_out = binders(self.binding, self.device, self.device_id)
        # ids, positions and the top outputs are numpy (host) memory on every device: bound
        # as such, ONNX Runtime copies them across; bound as device memory, a CUDA kernel
        # would read a host address (an illegal memory access, seen on an H200)
        self._bind_host_in, self._bind_host_out = (
            (self._bind_in, self._bind_out) if self.device == "cpu"
            else binders(self.binding, "cpu", 0))
        # what the decode loop binds on every call, worked out once: graph names and arena
        # addresses per layer (the arenas never move), and the ids/positions/logits addresses
        self.layers = [(contract.past_key(i), contract.past_value(i),
                        *contract.kv_output_names(i, entry.graph), *self._kv_ptrs(i))
                       for i in range(entry.num_layers)]
        self._ids_ptr, self._pos_ptr = self.ids.ctypes.data, self.positions.ctypes.data
        # a static graph of schema 10 on attends over cache rows [0, L), L the length of its
        # attend_rows input (values unread): bound on every call at the call's longest
        # past_len + new_len; one of schema 9 or older has no such input and attends over all
        # max_context rows (design §2)
        self._attend = np.zeros(max_context, np.int64) if self.attends_rows else None
        self._logits_addr = self._logits_ptr()
        self.logits_dtype = DTYPES[entry.logits_dtype]
        self._top = self._tops()
        self._caches_at: tuple[int, int] | None = None    # ort: (first slot, count) bound
        if self.in_place:
            self._bind_caches(0, 1)
        self._bound_len: int | None = None     # the length ids/positions/logits are bound at
        self._run_bound = runner(self.session, self.binding)
        # the target's rows graph (design §11), opened by open_rows: once the session is chosen
        # (backends.select's timing builds candidates), else at the first call that needs it
        self._rows_file = rows_path(path, entry) if max_batch > 1 and entry.rows \
            and entry.graph == contract.ORT and self.device == "cpu" else None
        self._rows: RowsGraph | None = None
        self._scratch = self._allocate_scratch() if max_batch > 1 and not self.in_place else None
        self._init_extras(max(width, PREFILL_CHUNK))
        self._init_tree(width)       # a target that takes draft trees (ort_tree.py)

    def _init_extras(self, rows: int) -> None:
        """Host buffers for a graph's inputs and outputs beyond the contract's (docs/design.md
        §14): a head's target writes `aux_hidden` (rows, 3·H), which `on_aux(slot, position,
        rows)` receives after every call; a head reads `features` and `hidden` and writes
        `hidden_out`. Host memory on every device (ONNX Runtime copies across on a GPU); a
        call's B·T rows are its first rows, (B, T, width) row-major."""
        self.extra_in: dict[str, np.ndarray] = {}
        self.extra_out: dict[str, np.ndarray] = {}
        self.on_aux: Callable[[int, int, np.ndarray], None] | None = None
        for io, names, into in ((self.session.get_inputs(), contract.HEAD_INPUTS, self.extra_in),
                                (self.session.get_outputs(), contract.EXTRA_OUTPUTS,
                                 self.extra_out)):
            for arg in io:
                if arg.name in names:
                    into[arg.name] = np.zeros((rows, int(arg.shape[-1])), np.float32)

    @property
    def attends_rows(self) -> bool:
        """Whether the graph reads only the cache rows [0, L) that contract.ATTEND_ROWS says."""
        return contract.ATTEND_ROWS in {i.name for i in self.session.get_inputs()}

    def _bind_attend(self, rows: int) -> None:
        """Attention over cache rows [0, rows) in the next call, where the graph takes it. A
        host input: on a GPU ONNX Runtime copies it across when bound, so it is bound on every
        call (its length changes with the context)."""
        if self._attend is not None:
            self._bind_host_in(contract.ATTEND_ROWS, np.int64, (rows,), self._attend.ctypes.data)

    def _bind_extras(self, B: int, T: int) -> None:
        """Bind the extra inputs and outputs for a call of B rows of T tokens; before the
        logits, which stay the last output bound (ort_cuda reads the call's logits there)."""
        for name, buf in self.extra_in.items():
            self._bind_host_in(name, np.float32, (B, T, buf.shape[1]), buf.ctypes.data)
        for name, buf in self.extra_out.items():
            self._bind_host_out(name, np.float32, (B, T, buf.shape[1]), buf.ctypes.data)

    def _pass_aux(self, B: int, T: int, past_lens, real) -> None:
        """Hand the call's aux_hidden rows to `on_aux`, each row's real ones at its positions."""
        if self.on_aux is None:
            return
        aux = self.extra_out[contract.AUX_HIDDEN]
        for b in range(B):
            n = T if real is None else int(real[b])
            if n:
                self.on_aux(b, int(past_lens[b]), aux[b * T:b * T + n])

    def _open(self, path: Path, threads: int | None):
        import onnxruntime as ort

        return ort.InferenceSession(str(path), session_options(threads, self.entry),
                                    providers=["CPUExecutionProvider"])

    def _allocate(self) -> None:
        e, shape = self.entry, self.arena_shape
        # one per layer, for keys and for values
        self.keys = [np.zeros(shape, self.kv_dtype) for _ in range(e.num_layers)]
        self.values = [np.zeros(shape, self.kv_dtype) for _ in range(e.num_layers)]
        self.logits = np.zeros((self.max_batch * self.max_new_len * e.vocab_size,),
                               DTYPES[e.logits_dtype])

    @property
    def arena_shape(self) -> tuple[int, int, int, int]:
        """(slots, Hkv, cache_rows, D) in the ort and static flavours, else (slots,
        cache_rows, Hkv, D); cache_rows = max_context + the entry's spare rows."""
        e = self.entry
        if self.in_place:
            return (self.max_batch, e.num_kv_heads, self.cache_rows, e.head_dim)
        return (self.max_batch, self.cache_rows, e.num_kv_heads, e.head_dim)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's rows in one layer's arena."""
        return self.cache_rows * self.row_bytes

    def _kv_ptrs(self, layer: int) -> tuple[int, int]:
        return self.keys[layer].ctypes.data, self.values[layer].ctypes.data

    def _logits_ptr(self) -> int:
        return self.logits.ctypes.data

    def _logits_view(self, n: int):
        return self.logits[:n * self.entry.vocab_size].reshape(n, self.entry.vocab_size)

    def forward(self, token_ids: np.ndarray, past_len: int, slot: int = 0) -> np.ndarray:
        n = len(token_ids)
        if n > self.max_new_len:
            raise BackendError(f"{self.name}: {n} new tokens exceed this session's "
                               f"{self.max_new_len}; use prefill for long inputs.")
        self._run(token_ids, past_len, logits_out=True, slot=slot)
        return self._logits_view(n)

    def prefill(self, token_ids: np.ndarray, past_len: int = 0, slot: int = 0) -> None:
        for start in range(0, len(token_ids), PREFILL_CHUNK):
            chunk = token_ids[start:start + PREFILL_CHUNK]
            self._run(chunk, past_len + start, logits_out=False, slot=slot)

    def _run(self, token_ids: np.ndarray, past_len: int, logits_out: bool, slot: int = 0,
             logits_row: int = 0) -> None:
        """One sequence's call in `slot`; its logits land `logits_row` rows into the buffer."""
        n = len(token_ids)
        if past_len + n > self.max_context:
            raise BackendError(f"{self.name}: positions up to {past_len + n} exceed the bundle's "
                               f"max_context {self.max_context}.")
        if n == 1:                    # a draft step: no slices, no arange
            self.ids[0, 0], self.positions[0, 0] = token_ids[0], past_len
        else:
            self.ids[0, :n] = token_ids
            self.positions[0, :n] = np.arange(past_len, past_len + n)
        if not self.in_place:
            self._bind_rows(past_len, n, slot)
        elif self._caches_at != (slot, 1):
            self._bind_caches(slot, 1)
            self._bound_len = None
        self._bind_attend(past_len + n)
        if self.extra_in or self.extra_out:
            self._bind_extras(1, n)
        if n != self._bound_len or not logits_out or logits_row:
            # ids, positions and logits are bound by length; the ort flavour never clears its
            # bindings, so consecutive calls of one length (draft steps) bind nothing
            bind_host, e = self._bind_host_in, self.entry
            bind_host(contract.INPUT_IDS, np.int64, (1, n), self._ids_ptr)
            bind_host(contract.POSITION_IDS, np.int64, (1, n), self._pos_ptr)
            self._bind_mask(1, n)
            if logits_out:
                self._bind_out(contract.LOGITS, self.logits_dtype, (1, n, e.vocab_size),
                               self._logits_addr + logits_row * e.vocab_size
                               * np.dtype(self.logits_dtype).itemsize)
            else:
                self.binding.bind_output(contract.LOGITS, self.device, self.device_id)
        # on a GPU a host input is copied across when it is bound, not when the graph runs:
        # its new values reach the device only by binding it again (skipped, a single
        # sequence of a static bundle repeats one token on a GPU)
        self._bound_len = n if self.in_place and logits_out and not logits_row \
            and self.device == "cpu" else None
        self._run_bound()
        if self.on_aux is not None:
            self.on_aux(slot, past_len, self.extra_out[contract.AUX_HIDDEN][:n])

    def _bind_rows(self, past_len: int, n: int, slot: int = 0) -> None:
        """Standard graph: the past is rows [0, past_len) of the slot's rows in each arena, and
        the new rows land at [past_len, past_len + n) of the same buffer; rebound on every
        call."""
        self.binding.clear_binding_inputs()
        self.binding.clear_binding_outputs()
        bind_in, bind_out, kv_type, e = self._bind_in, self._bind_out, self.kv_dtype, self.entry
        past_shape = (1, past_len, e.num_kv_heads, e.head_dim)
        new_shape = (1, n, e.num_kv_heads, e.head_dim)
        base = slot * self.slot_bytes
        offset = base + past_len * self.row_bytes
        for past_k, past_v, new_k, new_v, k_ptr, v_ptr in self.layers:
            bind_in(past_k, kv_type, past_shape, k_ptr + base)
            bind_in(past_v, kv_type, past_shape, v_ptr + base)
            bind_out(new_k, kv_type, new_shape, k_ptr + offset)
            bind_out(new_v, kv_type, new_shape, v_ptr + offset)

    def _bind_caches(self, first: int, count: int) -> None:
        """The ort graph: slots first..first+count-1 of each whole cache as both past and
        present (and the tops). Names, shapes and addresses change only when a call runs other
        slots, so a run of one sequence binds them once; a call binds only ids, positions and
        logits, which replace their own earlier bindings."""
        if self._caches_at == (first, count):
            return
        e, kv_type = self.entry, self.kv_dtype
        whole = (count, e.num_kv_heads, self.cache_rows, e.head_dim)
        base = first * self.slot_bytes
        for past_k, past_v, present_k, present_v, k_ptr, v_ptr in self.layers:
            self._bind_in(past_k, kv_type, whole, k_ptr + base)
            self._bind_in(past_v, kv_type, whole, v_ptr + base)
            self._bind_out(present_k, kv_type, whole, k_ptr + base)
            self._bind_out(present_v, kv_type, whole, v_ptr + base)
        if self._top is not None:
            top_id, top_prob = self._top
            self._bind_host_out(contract.TOP_ID, np.int64, (count,), top_id.ctypes.data)
            self._bind_host_out(contract.TOP_PROB, np.float32, (count,), top_prob.ctypes.data)
        self._caches_at = (first, count)

    def top(self) -> tuple[int, float] | None:
        """The last call's last-row argmax and its probability, where the graph computes them
        (contract.TOP_ID, TOP_PROB); else None."""
        if self._top is None:
            return None
        top_id, top_prob = self._top
        return int(top_id[0]), float(top_prob[0])

    def _tops(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Where the ort flavour's top outputs land, one per slot; bound with the caches (only
        the ort flavour never clears its bindings)."""
        outputs = {o.name for o in self.session.get_outputs()}
        if not self.in_place or not {contract.TOP_ID, contract.TOP_PROB} <= outputs:
            return None
        return np.zeros(self.max_batch, np.int64), np.zeros(self.max_batch, np.float32)

    def _check_io(self) -> None:
        found_in = [i.name for i in self.session.get_inputs()]
        found_out = [o.name for o in self.session.get_outputs()]
        want_in = contract.input_names(self.entry.num_layers, self.entry.graph)
        want_out = contract.output_names(self.entry.num_layers, self.entry.graph)
        found_in = [n for n in found_in if n not in contract.HEAD_INPUTS   # a head's (§14)
                    and n != contract.TREE_MASK]                          # trees' (ort_tree)
        if found_in == want_in[:-1] and want_in[-1:] == [contract.ATTEND_ROWS]:
            want_in = found_in     # a static graph of schema 9 or older, or a head's: no L
        found_out = [n for n in found_out if n not in contract.EXTRA_OUTPUTS]
        if found_in != want_in or found_out[:len(want_out)] != want_out:
            raise BackendError(f"{self.name} graph does not follow the contract: inputs "
                               f"{found_in[:4]}…, outputs {found_out[:3]}…, expected "
                               f"{want_in[:4]}… and {want_out[:3]}…. Re-run ssd-export.")
