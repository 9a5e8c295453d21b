"""TensorRT engines of a bundle: optimisation profiles, folder names, compatibility.

Pure functions over plain data, shared by the engine builder (ssd_export.engines)
and the TensorRT backend; nothing here imports TensorRT, so all of it is tested
on machines without a GPU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from . import contract
from .errors import BackendError
from .manifest import EngineEntry, ModelEntry

Precision = Literal["fp16", "bf16", "fp32"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
DECODE, PREFILL = 0, 1            # profile indices inside every engine
Range3 = tuple[int, int, int]     # (min, opt, max)


@dataclass(frozen=True)
class GpuInfo:
    name: str                     # "NVIDIA H200", "Orin (nvgpu)"
    compute_capability: str       # "9.0", "8.7"


@dataclass(frozen=True)
class Profile:
    """One optimisation profile: ranges of new_len, past_len and the batch (rows per call)."""

    name: str                     # "decode" | "prefill"
    new_len: Range3
    past_len: Range3
    batch: Range3 = (1, 1, 1)

    def shapes(self, entry: ModelEntry) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Input name -> (min, opt, max) shapes, in the graph contract's layout."""
        ids = tuple(zip(self.batch, self.new_len))                           # (B, T)
        kv = tuple((b, p, entry.num_kv_heads, entry.head_dim)
                   for b, p in zip(self.batch, self.past_len))
        shapes = {contract.INPUT_IDS: ids, contract.POSITION_IDS: ids}
        for i in range(entry.num_layers):
            shapes[contract.past_key(i)] = shapes[contract.past_value(i)] = kv  # (B, P, Hkv, D)
        if entry.tree:          # a draft tree's mask (B, T, T), bool (docs/design.md §2)
            shapes[contract.TREE_MASK] = tuple((b, t, t) for b, t in ids)
        return shapes

    def as_dict(self) -> dict:
        return {"name": self.name, "new_len": list(self.new_len), "past_len": list(self.past_len),
                "batch": list(self.batch)}

    def check(self, new_len: int, past_len: int, where: str, batch: int = 1) -> None:
        """Refuse a call outside this profile, naming its min/opt/max."""
        for axis, value, (lo, opt, hi) in (("new_len", new_len, self.new_len),
                                           ("past_len", past_len, self.past_len),
                                           ("batch", batch, self.batch)):
            if not lo <= value <= hi:
                raise BackendError(
                    f"{where}: {axis}={value} is outside the TensorRT engine's {self.name} "
                    f"profile (min {lo}, opt {opt}, max {hi}). ---> HINT: rebuild the engines "
                    f"with ssd-build-engines --force after re-exporting with a larger "
                    f"{'--max-batch' if axis == 'batch' else '--max-context / --max-draft'}, "
                    f"or use --backend cuda.")


def engine_profiles(model: str, max_context: int, max_draft: int,
                    prefill_chunk: int, max_batch: int = 1) -> tuple[Profile, Profile]:
    """Profile 0 serves decode calls, profile 1 prefill chunks (docs/design.md §9).

    decode: new_len 1 … max_draft+2 (a verify pass of k+1 tokens, or a draft step with
    its catch-up token); prefill: new_len 1 … the runtime's prefill chunk. past_len spans
    0 … max_context - 1 in both, since at least one new token is always appended.

    The batch spans 1 … max_batch rows in both (optimised for max_batch in decode, where a
    loaded server runs full batches, and for one row in prefill). A batch binds each slot's
    whole cache (the ragged contract: P = max_context, each row's own past length in its
    position_ids), so with max_batch > 1 past_len reaches max_context; max_batch = 1 gives
    exactly the profiles of a one-sequence engine.
    """
    if max_context < 2 or max_draft < 1 or prefill_chunk < 1 or max_batch < 1:
        raise ValueError(f"max_context={max_context}, max_draft={max_draft}, "
                         f"prefill_chunk={prefill_chunk}, max_batch={max_batch}: expected >= 2, "
                         f">= 1, >= 1, >= 1")
    top = max_context if max_batch > 1 else max_context - 1
    decode_max = min(max_draft + 2, max_context)
    # the target verifies k+1 tokens (k = 4 is typical); the draft steps one token at a time
    decode_opt = min(5, decode_max) if model == "target" else 1
    prefill_max = min(prefill_chunk, max_context)
    decode = Profile("decode", (1, decode_opt, decode_max), (0, max_context // 2, top),
                     (1, max_batch, max_batch))
    prefill = Profile("prefill", (1, min(64, prefill_max), prefill_max), (0, 0, top),
                      (1, 1, max_batch))
    return decode, prefill


def gpu_slug(gpu: GpuInfo) -> str:
    """A folder-safe name for a GPU: "NVIDIA H200", 9.0 -> "nvidia-h200-sm90"."""
    name = re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-") or "gpu"
    return f"{name}-sm{gpu.compute_capability.replace('.', '')}"


def engine_folder(gpu: GpuInfo, tensorrt_version: str) -> str:
    """engines/<gpu-slug>-trt<version>, relative to the bundle root."""
    return f"engines/{gpu_slug(gpu)}-trt{tensorrt_version}"


def refusal(entry: EngineEntry, gpu: GpuInfo, tensorrt_version: str) -> str | None:
    """Why `entry` cannot run here, naming both sides; None when it can.

    A plan is tied to the GPU it was built on; the TensorRT version must match
    exactly, except for version-compatible engines, which run on the same or a
    later TensorRT of the same major version.
    """
    built = f"{entry.gpu_name} (sm {entry.compute_capability}), TensorRT {entry.tensorrt_version}"
    here = f"{gpu.name} (sm {gpu.compute_capability}), TensorRT {tensorrt_version}"
    if (entry.gpu_name, entry.compute_capability) != (gpu.name, gpu.compute_capability):
        return f"{entry.path} was built for {built}; this machine has {here}"
    if entry.tensorrt_version == tensorrt_version:
        return None
    if entry.version_compatible and _version_compatible(entry.tensorrt_version, tensorrt_version):
        return None
    kind = "a version-compatible engine" if entry.version_compatible else "an engine"
    return f"{entry.path} is {kind} built with {built}; this machine has {here}"


def select_engines(entries: list[EngineEntry], gpu: GpuInfo | None,
                   tensorrt_version: str | None) -> tuple[dict[str, EngineEntry] | None, str]:
    """The target and draft engines usable here, or None and the reason."""
    if not entries:
        return None, ("the bundle has no TensorRT engines ---> HINT: build them on this "
                      "machine with ssd-build-engines BUNDLE")
    if tensorrt_version is None:
        return None, "TensorRT is not installed"
    if gpu is None:
        return None, "no CUDA GPU is visible"
    usable, reasons = {}, []
    for entry in entries:
        why = refusal(entry, gpu, tensorrt_version)
        if why is None:
            usable.setdefault(entry.model, entry)
        else:
            reasons.append(why)
    if {"target", "draft"} <= set(usable):
        return {"target": usable["target"], "draft": usable["draft"]}, ""
    if not reasons:
        return None, f"the bundle's engines lack a {'draft' if 'target' in usable else 'target'}"
    return None, (f"{reasons[0]}. ---> HINT: build engines for this machine with "
                  f"ssd-build-engines BUNDLE (TensorRT plans are specific to the GPU and "
                  f"the TensorRT version)")


def _version_compatible(built: str, here: str) -> bool:
    b, h = _parse(built), _parse(here)
    return b is not None and h is not None and b[0] == h[0] and h >= b


def _parse(version: str) -> tuple[int, ...] | None:
    parts = re.findall(r"\d+", version)
    return tuple(int(p) for p in parts[:4]) if parts else None
