"""Backend selection: `auto` picks TensorRT, then ORT CUDA, then ORT CPU.

Only ORT CPU exists in this version; the others are refused with a message.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..errors import BackendError
from ..manifest import Manifest
from .base import ModelSession

BackendName = Literal["auto", "cpu", "cuda", "trt"]
BACKENDS = ("auto", "cpu", "cuda", "trt")


def open_sessions(root: Path, manifest: Manifest, backend: str = "auto",
                  threads: int | None = None) -> tuple[ModelSession, ModelSession]:
    """Open the target and draft sessions on the chosen backend."""
    if backend not in BACKENDS:
        raise BackendError(f"backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}.")
    if backend in ("cuda", "trt"):
        raise BackendError(f"backend {backend!r} is not available in this build; use 'cpu' "
                           f"or 'auto'.")
    from .ort import OrtCpuSession

    max_new = manifest.max_draft + 2     # verify k+1, or a draft step with its catch-up token
    target = OrtCpuSession("target", root / manifest.target.path, manifest.target,
                           manifest.max_context, max_new, threads)
    draft = OrtCpuSession("draft", root / manifest.draft.path, manifest.draft,
                          manifest.max_context, max_new, threads)
    return target, draft
