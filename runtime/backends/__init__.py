"""Backend selection and thread placement.

`auto` picks TensorRT, then ORT CUDA, then ORT CPU; only ORT CPU exists in
this version. With `threads=None` each model's intra-op thread count is
chosen by timing a few steps at 1 thread and at every core.
"""
from __future__ import annotations

import os
from pathlib import Path
from time import perf_counter

import numpy as np

from ..errors import BackendError, ConfigError
from ..manifest import Manifest, ModelEntry
from .base import ModelSession

BACKENDS = ("auto", "cpu", "cuda", "trt")
Threads = int | tuple[int, int] | None        # both models, or (target, draft), or chosen


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def open_sessions(root: Path, manifest: Manifest, backend: str = "auto",
                  threads: Threads = None) -> tuple[ModelSession, ModelSession]:
    """Open the target and draft sessions on the chosen backend."""
    if backend not in BACKENDS:
        raise BackendError(f"backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}.")
    if backend in ("cuda", "trt"):
        raise BackendError(f"backend {backend!r} is not available in this build; use 'cpu' "
                           f"or 'auto'.")
    placement = threads if isinstance(threads, tuple) else (threads, threads)
    for n in placement:
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ConfigError(f"threads={threads!r}: each count must be a positive integer.")
    target = _open(root, manifest, "target", manifest.target, placement[0])
    draft = _open(root, manifest, "draft", manifest.draft, placement[1])
    return target, draft


def _open(root: Path, manifest: Manifest, name: str, entry: ModelEntry,
          threads: int | None) -> ModelSession:
    from .ort import OrtCpuSession

    max_new = manifest.max_draft + 2     # verify k+1, or a draft step with its catch-up token
    path = root / entry.path
    if threads is not None or cpu_cores() == 1:
        return OrtCpuSession(name, path, entry, manifest.max_context, max_new, threads or 1)
    candidates = [OrtCpuSession(name, path, entry, manifest.max_context, max_new, n)
                  for n in sorted({1, cpu_cores()})]
    return min(candidates, key=_step_time)


def _step_time(session: ModelSession, steps: int = 8) -> float:
    past = min(32, session.max_context - 2)
    session.prefill(np.zeros(past, np.int64))
    session.forward(np.zeros(1, np.int64), past)
    times = []
    for _ in range(steps):
        t0 = perf_counter()
        session.forward(np.zeros(1, np.int64), past)
        times.append(perf_counter() - t0)
    return float(np.median(times))
