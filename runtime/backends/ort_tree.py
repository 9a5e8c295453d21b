"""Draft trees on an ONNX Runtime session (docs/design.md §2 "Trees", §3): a verification
call over a tree's nodes, and the accepted path's KV rows made contiguous afterwards.

A graph with contract.TREE_MASK (a target of schema 13, any flavour) takes it on every call: a
chain binds the lower triangle (kept in a host buffer, rewritten only when a tree call wrote
over it), a tree its ancestor mask. The arenas' rows move on the host: head-major in the ort and
static flavours, sequence-major in the standard one. A mixin over OrtCpuSession's buffers and
binders (ort.py).
"""
from __future__ import annotations

import numpy as np

from .. import contract
from ..contract import PREFILL_CHUNK
from ..errors import BackendError


class OrtTreeMixin:
    """forward_tree, forward_rows_tree and the tree mask's buffer and binding."""

    def _init_tree(self, width: int) -> None:
        # the graph's input (bound on every call), and whether a tree may be verified here (a
        # backend whose tree call is not checked says no: ort_cuda.py)
        self._mask_input = contract.TREE_MASK in {i.name for i in self.session.get_inputs()}
        self.takes_trees = self._mask_input
        # whether the loop verifies trees here: wherever the graph takes them, the row-exact
        # (static) flavour too: the loop keeps only the logits and rows of a tree's first
        # path, which are a chain's bit for bit (tree_round.judge; design §2 "Trees", §12)
        self.verifies_trees = self.takes_trees
        side = max(width, PREFILL_CHUNK)
        # (B, T, T) bool, flat: B·T·T <= max(max_batch·max_new_len², PREFILL_CHUNK²)
        size = max(self.max_batch * self.max_new_len ** 2, side * side) \
            if self._mask_input or self._rows_file is not None else 0
        self._mask = np.zeros(size, np.bool_)
        self._mask_holds: tuple[int, int] | None = None   # (B, T) of the lower triangles in it

    def _bind_mask(self, B: int, T: int, bind=None, trees: bool = False) -> None:
        """Bind tree_mask (B, T, T) as B lower triangles (a chain's call), where the graph takes
        it (`bind`: the rows graph's binder, which takes it too); the buffer is refilled only
        when it holds something else. `trees`: bind what forward_rows_tree wrote there."""
        if not self._mask_input and bind is None:
            return
        if self._mask_holds != (B, T) and not trees:
            view = self._mask[:B * T * T].reshape(B, T, T)
            view[:] = np.tri(T, dtype=np.bool_)
            self._mask_holds = (B, T)
        (bind or self._bind_host_in)(contract.TREE_MASK, np.bool_, (B, T, T),
                                     self._mask.ctypes.data)

    def forward_tree(self, tokens: np.ndarray, ancestors: np.ndarray, depth: np.ndarray,
                     past_len: int, slot: int = 0) -> np.ndarray:
        """One sequence's verification over a draft tree of N nodes (runtime/round/tree.py):
        node i's token `tokens[i]` at cache row past_len + i and position past_len + depth[i],
        attending the committed rows [0, past_len) and the nodes j with ancestors[i, j]. Returns
        the logits (N, vocab), valid until the next call. Row past_len + i then holds node i's
        keys and values; the loop keeps the first path's, which a chain's lie at (design §3)."""
        n = len(tokens)
        if not self.takes_trees:
            raise BackendError(f"{self.name}: this bundle's target graph takes no draft tree "
                               f"(its manifest has no tree input). ---> HINT: re-export with "
                               f"this ssd-export (the ort flavour writes it), or draft chains.")
        if n > self.max_new_len:
            raise BackendError(f"{self.name}: a draft tree of {n} nodes exceeds the {self.max_new_len} "
                               f"tokens a verification of this bundle takes (max_draft + 1). "
                               f"---> HINT: a smaller tree, or re-export with a larger "
                               f"--max-draft.")
        if past_len + n > self.max_context:
            raise BackendError(f"{self.name}: cache rows up to {past_len + n} exceed the "
                               f"bundle's max_context {self.max_context}.")
        self.ids[0, :n] = tokens
        self.positions[0, :n] = past_len + np.asarray(depth, np.int64)
        self._mask[:n * n].reshape(1, n, n)[0] = ancestors
        self._mask_holds = None
        if not self.in_place:         # standard: past rows [0, past_len), new rows after them
            self._bind_rows(past_len, n, slot)
        elif self._caches_at != (slot, 1):
            self._bind_caches(slot, 1)
        self._bind_attend(past_len + n)
        if self.extra_in or self.extra_out:
            self._bind_extras(1, n)
        bind_host, e = self._bind_host_in, self.entry
        bind_host(contract.INPUT_IDS, np.int64, (1, n), self._ids_ptr)
        bind_host(contract.POSITION_IDS, np.int64, (1, n), self._pos_ptr)
        bind_host(contract.TREE_MASK, np.bool_, (1, n, n), self._mask.ctypes.data)
        self._bind_out(contract.LOGITS, self.logits_dtype, (1, n, e.vocab_size),
                       self._logits_addr)
        self._bound_len = None        # the next chain call binds its own mask and lengths
        self._run_bound()
        if self.on_aux is not None:
            self.on_aux(slot, past_len, self.extra_out[contract.AUX_HIDDEN][:n])
        return self._logits_view(n)

    def forward_rows_tree(self, token_ids: np.ndarray, past_lens: np.ndarray,
                          real: np.ndarray, ancestors: np.ndarray, depth: np.ndarray
                          ) -> np.ndarray:
        """forward_rows over slots 0..B-1 where rows carry draft trees: row b's W nodes
        `token_ids[b]` at cache rows past_lens[b] + i and positions past_lens[b] + depth[b, i],
        attending as `ancestors[b]` says (a chain's row: the lower triangle, its depths 0..W-1);
        `real[b]` of them real. One call of the rows graph (or of a static graph, which takes
        them), else one tree call per row. Returns the logits (B, W, vocab)."""
        B, T = token_ids.shape
        if not self.takes_trees:
            raise BackendError(f"{self.name}: this bundle's target graph takes no draft tree. "
                               f"---> HINT: re-export with this ssd-export, or draft chains.")
        if B > self.max_batch or T > self.max_new_len:
            raise BackendError(f"{self.name}: a batch of {B} rows of {T} tree nodes exceeds this "
                               f"session's {self.max_batch} slots of {self.max_new_len}.")
        rows = (self._rows or self.open_rows()) if self._rows_file is not None else None
        if self.entry.graph == contract.ORT and (rows is None or not rows.takes_trees):
            # GroupQueryAttention takes one row of several tokens: a tree call per row
            V = self.entry.vocab_size
            found = {b: self.forward_tree(token_ids[b, :int(real[b])],
                                          ancestors[b, :int(real[b]), :int(real[b])],
                                          depth[b, :int(real[b])], int(past_lens[b]),
                                          slot=b).copy()
                     for b in range(B) if int(real[b])}
            out = self.logits[:B * T * V].reshape(B, T, V)
            for b, logits in found.items():
                out[b, :len(logits)] = logits
            return out
        self.ids[0, :B * T] = token_ids.reshape(-1)
        self.positions[0, :B * T] = (past_lens[:, None] + depth).reshape(-1)
        self._mask[:B * T * T] = ancestors.reshape(-1)
        self._mask_holds = None
        live = int(past_lens.max()) + T
        if rows is not None:                      # the ort target's rows graph (design §11)
            rows.run(B, T, live, trees=True)
            self._pass_aux(B, T, past_lens, real)
        else:                                     # a static or standard target
            if self.in_place:
                self._bind_caches(0, B)
                self._bind_attend(live)
            else:                                 # new rows to the scratch, kept below
                self._bind_scratch(B, T)
            self._bind_host_in(contract.INPUT_IDS, np.int64, (B, T), self._ids_ptr)
            self._bind_host_in(contract.POSITION_IDS, np.int64, (B, T), self._pos_ptr)
            self._bind_mask(B, T, trees=True)
            self._bind_extras(B, T)
            self._bind_out(contract.LOGITS, self.logits_dtype, (B, T, self.entry.vocab_size),
                           self._logits_addr)
            self._bound_len = None
            self._run_bound()
            if not self.in_place:                 # node i's rows at past_lens[b] + i
                self._keep_new_rows(B, T, past_lens, real)
            self._pass_aux(B, T, past_lens, real)  # a head's features, node i at row i
        return self._rows_logits(B, T)
