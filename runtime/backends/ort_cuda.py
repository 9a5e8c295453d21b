"""ONNX Runtime's CUDA execution provider with IOBinding to device arenas (backend "cuda").

The same zero-copy binding as the CPU session (docs/design.md §3), on OrtValues allocated
on the GPU; forward() returns DeviceLogits, so logits never leave the device
unless host code asks for a row. Needs onnxruntime-gpu *instead of* onnxruntime.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .. import contract
from ..errors import BackendError
from ..manifest import ModelEntry
from .device import DeviceLogits
from .base import DTYPES
from .ort import OrtCpuSession
from .ort_session import session_options
from .select import CUDA_PROVIDER, GPU_BUNDLE_HINT, ORT_GPU_HINT

INSTALL_HINT = f"---> HINT: {ORT_GPU_HINT}, with an NVIDIA driver that nvidia-smi shows."


@functools.cache
def _preload_cuda_libraries(ort) -> None:
    """Load CUDA and cuDNN from pip's nvidia-* wheels before the first CUDA session.

    Those wheels (what `pip install onnxruntime-gpu[cuda,cudnn]` brings) are not on the
    dynamic loader's path, so without this the CUDA provider fails to load unless torch was
    imported first or LD_LIBRARY_PATH names them; onnxruntime >= 1.21 does the loading
    (`preload_dlls`, its documented remedy), and it skips what is missing, so system-wide
    CUDA installs still resolve as before."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()


class OrtCudaSession(OrtCpuSession):
    """A model on ORT's CUDA provider; `device="cpu"` keeps the same code path on host memory
    (OrtValue arenas and DeviceLogits), which is how machines without a GPU test it."""

    def __init__(self, name: str, path: Path, entry: ModelEntry, max_context: int,
                 max_new_len: int, threads: int | None = None, device: str = "cuda",
                 device_id: int = 0, max_batch: int = 1) -> None:
        if device not in ("cuda", "cpu"):
            raise BackendError(f"{name}: device {device!r} is not 'cuda' or 'cpu'.")
        if device == "cuda" and entry.cpu_only:
            raise BackendError(f"backend 'cuda': the {name} graph {path} is CPU-only "
                               f"({entry.cpu_only}) {GPU_BUNDLE_HINT}.")
        self.device, self.device_id = device, device_id
        self.backend = "cuda" if device == "cuda" else "cpu"
        if max_batch > 1 and entry.graph != contract.STATIC:
            raise BackendError(f"backend 'cuda': a batch (max_batch={max_batch}) of the {name} "
                               f"needs the static graph flavour, whose caches take each row's "
                               f"new rows in place (a {entry.graph} graph's would need a copy "
                               f"on the device). ---> HINT: re-export with ssd-export --graph "
                               f"static, or use max_batch=1.")
        super().__init__(name, path, entry, max_context, max_new_len, threads, max_batch)
        # a target's tree input (any flavour) is bound as on the CPU (a chain's lower triangle on
        # every call), but the loop verifies no tree here: a tree call on device arenas has not
        # been run on a GPU (docs/design.md §9)
        self.takes_trees = self.verifies_trees = False

    def _open(self, path: Path, threads: int | None):
        import onnxruntime as ort

        if self.device == "cpu":
            return super()._open(path, threads)
        if CUDA_PROVIDER not in ort.get_available_providers():
            raise BackendError(f"backend 'cuda': this onnxruntime ({ort.__version__}) has no "
                               f"{CUDA_PROVIDER}; found {ort.get_available_providers()}. "
                               f"{INSTALL_HINT}")
        _preload_cuda_libraries(ort)
        # TF32 off: fp32 graphs multiply in fp32, as PyTorch does by default, so greedy
        # choices match the Hugging Face model's (ORT's CUDA provider enables TF32 otherwise)
        providers = [(CUDA_PROVIDER, {"device_id": self.device_id, "use_tf32": 0}),
                     "CPUExecutionProvider"]
        session = ort.InferenceSession(str(path), session_options(threads, self.entry),
                                       providers=providers)
        # onnxruntime-gpu lists the CUDA provider even where it cannot load it, then falls
        # back to the CPU with a logged error only: ask the session what it really uses
        if CUDA_PROVIDER not in session.get_providers():
            raise BackendError(f"backend 'cuda': ONNX Runtime did not load {CUDA_PROVIDER} for "
                               f"{path} (session providers: {session.get_providers()}); the "
                               f"CUDA/cuDNN libraries or the GPU are missing. {INSTALL_HINT}")
        return session

    def _allocate(self) -> None:
        from onnxruntime import OrtValue

        e, dev = self.entry, (self.device, self.device_id)
        shape = self.arena_shape
        # zero-filled, as the CPU session's: the static flavour's attention reads every row of
        # a cache, and a stale row must be finite for its mask to hide it (a NaN left in fresh
        # memory survives the mask; design §2). One layer's zeros on the host at a time.
        self.keys = [OrtValue.ortvalue_from_numpy(np.zeros(shape, self.kv_dtype), *dev)
                     for _ in range(e.num_layers)]
        self.values = [OrtValue.ortvalue_from_numpy(np.zeros(shape, self.kv_dtype), *dev)
                       for _ in range(e.num_layers)]
        self.logits = OrtValue.ortvalue_from_shape_and_type(   # (max_batch, max_new_len, V)
            (self.max_batch, self.max_new_len, e.vocab_size), DTYPES[e.logits_dtype], *dev)

    def _kv_ptrs(self, layer: int) -> tuple[int, int]:
        return self.keys[layer].data_ptr(), self.values[layer].data_ptr()

    def _logits_ptr(self) -> int:
        return self.logits.data_ptr()

    def _logits_view(self, n: int) -> DeviceLogits:
        return DeviceLogits(self._logits_addr, n, self.entry.vocab_size, self.logits_dtype,
                            self.device, self._rows_to_host, self.device_id)

    def _rows_logits(self, B: int, T: int) -> np.ndarray:
        """A batch's logits (B, T, V) copied to the host (a batch decides there, design §11):
        the bound output of this call's shape, not the whole buffer."""
        return self.binding.get_outputs()[-1].numpy()

    def _rows_to_host(self, first: int, count: int) -> np.ndarray:
        # the last bound output is the logits OrtValue of this call's shape (1, n, V): copying
        # it moves n rows (one for a draft step), not the whole (1, max_new_len, V) buffer
        logits = self.binding.get_outputs()[-1].numpy()
        return logits[0, first:first + count]
