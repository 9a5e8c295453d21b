"""An EAGLE-3 head's worth at export (docs/design.md §6, §14), as worth.py measures a draft's:
its agreement with the target on held-out text, a quick calibration, the predicted speed-up.

    agreement  the head's first draft token, fed the target graph's own features at row t and
               token x_{t+1}, against the target's argmax after x_{t+1} (teacher-forced)
    timing     the runtime's calibration (scheduler.calibrate) with the head's graph stepped
               as a draft: one row at a time over its cache, fed its own hidden_out
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from ssd_runtime import contract
from ssd_runtime.backends import cpu_session
from ssd_runtime.errors import BackendError, ConfigError
from ssd_runtime.machine import cpu_cores
from ssd_runtime.manifest import Manifest, ModelEntry
from ssd_runtime.scheduler.calibration import calibrate

from .parity import ort_errors, run_with_features
from .qtarget import heldout_ids
from .worth import REPEATS, WORTH_TOKENS, Worth, first_line, own_continuations, skipped

NOTE = "α is the head's first draft token, teacher-forced on the target's features"


def measure_head_worth(root: Path, manifest: Manifest, tokenizer,
                       heldout: tuple[list[str], str], own: bool = False) -> Worth:
    """What measure_worth gives for a model draft, for a head; never fails the export."""
    worth = Worth(text=heldout[1], max_draft=manifest.max_draft)
    cores = cpu_cores()
    try:
        target = cpu_session("target", root, manifest, threads=cores)
        texts, source = own_continuations(target, tokenizer, heldout, manifest) if own \
            else heldout
        worth = replace(worth, text=source)
        windows = heldout_ids(tokenizer, texts, manifest.target.vocab_size, manifest.max_context,
                              WORTH_TOKENS, "the pair's worth")
        target_graph = _session(root / manifest.target.path, cores)
        head = _session(root / manifest.draft.path, 1)
        agree, total = head_agreement(target_graph, head, manifest, windows)
    except ConfigError as exc:
        return skipped(worth, str(exc).split(" ---> ")[0])
    except (BackendError, *ort_errors()) as exc:
        return skipped(worth, f"the graphs did not run here: {first_line(exc)}")
    worth = Worth(source, manifest.max_draft, agree / total, total, backend="cpu",
                  threads=f"{cores}:1", note=NOTE)
    try:
        cost = calibrate(target, HeadSteps(head, manifest.draft, manifest.max_context),
                         manifest.max_draft, repeats=REPEATS)
    except (BackendError, *ort_errors()) as exc:
        return replace(worth, note=f"{NOTE}; not timed: {first_line(exc)}")
    return replace(worth, cost=cost)


def head_agreement(target, head, manifest: Manifest, windows: list[np.ndarray]
                   ) -> tuple[int, int]:
    """(positions where the head's argmax is the target's, positions compared)."""
    agree = total = 0
    for ids in windows:
        wanted, drafted = picks(target, head, manifest, ids)
        agree += int((wanted == drafted).sum())
        total += wanted.size
    return agree, total


def picks(target, head, manifest: Manifest, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Over one window of n tokens, both (n-1,): the target's argmax after x_{t+1}, and the
    head's first draft token at row t (features of row t, token x_{t+1}): both guess x_{t+2}."""
    n = ids.size
    logits, aux = run_with_features(target, ids[None], manifest.target.graph,
                                    manifest.target.kv_dtype)       # (1, n, V), (1, n, 3·Ht)
    H = int(manifest.draft.head["hidden_size"])
    drafted = HeadSteps(head, manifest.draft, n + 1).run(
        ids[None, 1:], 0, aux[:, :n - 1], np.zeros((1, n - 1, H), np.float32))
    return logits[0, 1:].argmax(-1), drafted[0].argmax(-1)


class HeadSteps:
    """The head's graph over one cache (1, ...) of `rows` rows, bound as the runtime binds a
    draft's (§3): standard, the past as the arena's prefix and the new rows at row past_len;
    static, the whole cache as both. `forward` is a drafting step: zero features, the last
    hidden_out fed back, as calibrate times a draft."""

    def __init__(self, session, entry: ModelEntry, rows: int) -> None:
        self.session, self.entry = session, entry
        self.static = contract.in_place(entry.graph)
        Hkv, D = entry.num_kv_heads, entry.head_dim
        shape = (1, Hkv, rows, D) if self.static else (1, rows, Hkv, D)
        self.caches = [np.zeros(shape, np.float32) for _ in range(2)]
        self.H = int(entry.head["hidden_size"])
        self.Ht3 = 3 * int(entry.head["target_hidden_size"])
        self.max_context = rows
        self.hidden = np.zeros((1, 1, self.H), np.float32)

    def prefill(self, ids: np.ndarray, past_len: int = 0) -> None:
        n = ids.size
        self.run(ids[None], past_len, np.zeros((1, n, self.Ht3), np.float32),
                 np.zeros((1, n, self.H), np.float32))

    def forward(self, ids: np.ndarray, past_len: int) -> np.ndarray:
        n = ids.size
        hidden = np.repeat(self.hidden, n, axis=1)
        return self.run(ids[None], past_len, np.zeros((1, n, self.Ht3), np.float32), hidden)[0]

    def run(self, ids, past_len: int, features, hidden) -> np.ndarray:
        T = ids.shape[1]
        b = self.session.io_binding()
        b.bind_cpu_input(contract.INPUT_IDS, np.ascontiguousarray(ids, dtype=np.int64))
        b.bind_cpu_input(contract.POSITION_IDS, np.arange(past_len, past_len + T)[None])
        b.bind_cpu_input(contract.FEATURES, np.ascontiguousarray(features))
        b.bind_cpu_input(contract.HIDDEN, np.ascontiguousarray(hidden))
        b.bind_output(contract.LOGITS)
        b.bind_output(contract.HIDDEN_OUT)
        names = ((contract.past_key(0), contract.kv_output_names(0, self.entry.graph)[0]),
                 (contract.past_value(0), contract.kv_output_names(0, self.entry.graph)[1]))
        for cache, (past, out) in zip(self.caches, names):
            if self.static:
                b.bind_input(past, "cpu", 0, np.float32, cache.shape, cache.ctypes.data)
                b.bind_output(out, "cpu", 0, np.float32, cache.shape, cache.ctypes.data)
            else:           # past rows [0, past_len), new rows at past_len: never overlapping
                row = cache[0, 0].nbytes
                b.bind_input(past, "cpu", 0, np.float32, (1, past_len, *cache.shape[2:]),
                             cache.ctypes.data)
                b.bind_output(out, "cpu", 0, np.float32, (1, T, *cache.shape[2:]),
                              cache.ctypes.data + past_len * row)
        self.session.run_with_iobinding(b)
        logits, hidden_out = b.copy_outputs_to_cpu()[:2]
        self.hidden = hidden_out[:, -1:]
        return logits


def _session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 4
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
