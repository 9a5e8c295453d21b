"""An EAGLE-3 head's worth at export (docs/design.md §6, §14), as worth.py measures a draft's:
its agreement with the target on held-out text, a quick calibration, the predicted speed-up.

    agreement  the head's first draft token, fed the target graph's own features at row t and
               token x_{t+1}, against the target's argmax after x_{t+1} (teacher-forced)
    timing     the runtime's calibration (scheduler.calibrate) over the sessions a load opens,
               the head's as the runtime drafts with it
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from ssd_runtime import contract
from ssd_runtime.backends import open_backend
from ssd_runtime.errors import BackendError, ConfigError
from ssd_runtime.machine import cpu_cores
from ssd_runtime.manifest import Manifest, ModelEntry
from ssd_runtime.scheduler.calibration import calibrate

from .parity import ort_errors, run_with_features
from .qtarget import heldout_ids
from .worth import (REPEATS, WORTH_TOKENS, Worth, first_line, own_continuations, placement,
                    skipped)

NOTE = "α is the head's first draft token, teacher-forced on the target's features"


def measure_head_worth(root: Path, manifest: Manifest, tokenizer,
                       heldout: tuple[list[str], str], own: bool = False) -> Worth:
    """What measure_worth gives for a model draft, for a head; never fails the export."""
    worth = Worth(text=heldout[1], max_draft=manifest.max_draft)
    try:
        opened = open_backend(root, manifest, "auto", threads=placement(manifest))
    except (BackendError, *ort_errors()) as exc:
        return skipped(worth, f"the graphs did not open here: {first_line(exc)}")
    try:
        texts, source = own_continuations(opened.target, tokenizer, heldout, manifest) if own \
            else heldout
        worth = replace(worth, text=source)
        windows = heldout_ids(tokenizer, texts, manifest.target.vocab_size, manifest.max_context,
                              WORTH_TOKENS, "the pair's worth")
        agree, total = head_agreement(_session(root / manifest.target.path, cpu_cores()),
                                      _session(root / manifest.draft.path, 1), manifest, windows)
    except ConfigError as exc:
        return skipped(worth, str(exc).split(" ---> ")[0])
    except (BackendError, *ort_errors()) as exc:
        return skipped(worth, f"the graphs did not run here: {first_line(exc)}")
    target, draft = opened.target, opened.draft
    threads = f"{target.threads}:{draft.threads}" if opened.backend == "cpu" else ""
    worth = Worth(source, manifest.max_draft, agree / total, total, backend=opened.backend,
                  threads=threads, note=NOTE)
    try:        # the runtime's head session, as a load opens it (design §14)
        cost = calibrate(target, draft, manifest.max_draft, repeats=REPEATS)
    except (BackendError, *ort_errors()) as exc:
        return replace(worth, note=f"{NOTE}; not timed on {opened.backend}: {first_line(exc)}")
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
    drafted = _head_logits(head, manifest.draft, ids[None, 1:], aux[:, :n - 1],
                           np.zeros((1, n - 1, H), np.float32))            # (1, n-1, V)
    return logits[0, 1:].argmax(-1), drafted[0].argmax(-1)


def _head_logits(session, entry: ModelEntry, ids: np.ndarray, features: np.ndarray,
                 hidden: np.ndarray) -> np.ndarray:
    """One call of the head's graph over T rows from an empty cache (positions 0..T-1): its
    logits (1, T, V). Static: a zeroed cache of T rows (its output, the cache written, is
    ONNX Runtime's own here); standard: an empty past."""
    T = ids.shape[1]
    Hkv, D = entry.num_kv_heads, entry.head_dim
    empty = np.zeros((1, Hkv, T, D) if contract.in_place(entry.graph) else (1, 0, Hkv, D),
                     np.float32)
    feeds = {contract.INPUT_IDS: np.ascontiguousarray(ids, dtype=np.int64),
             contract.POSITION_IDS: np.arange(T)[None], contract.FEATURES: features,
             contract.HIDDEN: hidden, contract.past_key(0): empty,
             contract.past_value(0): empty}
    return session.run([contract.LOGITS], feeds)[0]


def _session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 4
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
