"""Backend selection and thread placement.

`auto` picks TensorRT (when the bundle has engines for this GPU and TensorRT
version), then ORT CUDA, then ORT CPU, and says why (select.py decides from
plain facts). With `threads=None` each CPU model's intra-op thread count is
chosen by timing a few steps at 1 thread and at every core it may have
(placement.py: all of them unless fewer are clearly faster): all cores in
sequential mode; in split mode, where the draft runs on a thread of its own
beside the target's verification, one core is the draft's and the rest the
target's. The choice is remembered per bundle, machine and mode (cache.py), since
timing it takes longer than the rest of a load; one timed while other processes
kept the cores busy is timed again on later loads; `recalibrate` times it again.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from time import sleep

from .. import cache
from ..errors import BackendError, ConfigError
from ..machine import cpu_cores
from ..manifest import Manifest, ModelEntry
from ..machine import Busy
from .base import ModelSession
from .placement import QUIET_WINDOW_S, RECHECKS, Placement, fastest, recheck
from .select import Facts, Plan, describe, plan

BACKENDS = ("auto", "cpu", "cuda", "trt")
Threads = int | tuple[int, int] | None        # both models, or (target, draft), or chosen


@dataclass
class Opened:
    target: ModelSession
    draft: ModelSession
    backend: str          # "cpu" | "cuda" | "trt": the target's
    reason: str           # why this backend, e.g. "cpu (auto): TensorRT: not installed; ..."
    draft_backend: str = ""   # the draft's, where it differs (a CPU draft beside a GPU target)
    placement: Placement | None = None   # the CPU threads and where they came from (cpu only)


def open_backend(root: Path, manifest: Manifest, backend: str = "auto",
                 threads: Threads = None, mode: str = "sequential", max_batch: int = 1,
                 recalibrate: bool = False, draft_backend: str | None = None) -> Opened:
    """Open both sessions on the first backend of the plan that opens; say why it won.
    `max_batch`: KV slots per model, one sequence each (docs/design.md §11). `recalibrate`:
    time the CPU thread counts again instead of taking the remembered choice.
    `draft_backend="cpu"`: the draft on ONNX Runtime's CPU provider beside a cuda or trt
    target (docs/design.md §9): the plan then asks only the target to run on a GPU."""
    if backend not in BACKENDS:
        raise BackendError(f"backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}.")
    if draft_backend not in (None, *BACKENDS[1:]):
        raise BackendError(f"draft_backend {draft_backend!r} is unknown; choose one of "
                           f"{', '.join(BACKENDS[1:])} (None: the target's).")
    placement = threads if isinstance(threads, tuple) else (threads, threads)
    for n in placement:
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ConfigError(f"threads={threads!r}: each count must be a positive integer.")
    cpu_draft = draft_backend == "cpu"
    chosen_plan = plan(backend, probe(manifest, backend, target_only=cpu_draft))
    failures: list[str] = []
    for name in chosen_plan.attempts:
        try:
            if max_batch > 1 and name == "trt":
                raise BackendError(f"backend 'trt' decodes one sequence at a time for now "
                                   f"(max_batch={max_batch}): TensorRT cannot write a batch's new "
                                   f"rows into the caches in place (design §11). ---> HINT: use "
                                   f"backend='cuda' with a bundle exported with --graph static, "
                                   f"backend='cpu', or max_batch=1.")
            if draft_backend not in (None, name, "cpu"):
                raise BackendError(f"draft_backend {draft_backend!r} beside a {name!r} target: "
                                   f"only a CPU draft beside a GPU target is supported (the "
                                   f"draft's steps are the small, latency-bound ones). ---> "
                                   f"HINT: use draft_backend='cpu', or leave it unset.")
            if cpu_draft and name != "cpu":
                target = _open_one(name, root, manifest, "target", placement[0], chosen_plan,
                                   max_batch)
                draft = _open_one("cpu", root, manifest, "draft", placement[1], chosen_plan,
                                  max_batch)
            else:
                target, draft, *chosen = _OPENERS[name](root, manifest, placement, chosen_plan,
                                                        mode, max_batch, recalibrate)
        except BackendError as exc:      # a refusal; anything else is a bug and propagates
            if backend != "auto" or name == chosen_plan.attempts[-1]:
                raise
            failures.append(f"{name} did not open: {exc}")
            continue
        reason = describe(name, chosen_plan, failures, backend)
        if cpu_draft and name != "cpu":
            return Opened(target, draft, name, f"{reason}; the draft on cpu", "cpu")
        return Opened(target, draft, name, reason, placement=chosen[0] if chosen else None)
    raise AssertionError("a plan always ends with a backend that raises or opens")


def cpu_session(name: str, root: Path, manifest: Manifest, threads: int = 1,
                max_batch: int = 1) -> ModelSession:
    """One model of a bundle ("target" or "draft") on ONNX Runtime's CPU provider, as the loop
    runs it (the exporter checks its graphs through this)."""
    from .ort import OrtCpuSession

    entry = getattr(manifest, name)
    session = OrtCpuSession(name, root / entry.path, entry, manifest.max_context,
                            manifest.max_draft + 2, threads, max_batch)
    session.open_rows()
    return session


def probe(manifest: Manifest, requested: str, target_only: bool = False) -> Facts:
    """The facts `plan` needs; TensorRT is only looked at when it could be chosen.
    `target_only`: the draft runs on the CPU whatever is chosen, so only the target's graph
    decides whether the bundle is CPU-only."""
    import onnxruntime as ort

    providers = tuple(ort.get_available_providers())
    cpu_only = manifest.cpu_only_of(("target",) if target_only else ("target", "draft"))
    if requested not in ("auto", "trt") or cpu_only:
        return Facts(ort_providers=providers, engines=tuple(manifest.engines), cpu_only=cpu_only)
    from .trt import probe_tensorrt

    version, gpu, problem = probe_tensorrt()
    return Facts(version, problem, gpu, providers, tuple(manifest.engines))


def _open_cpu(root: Path, manifest: Manifest, placement, _: Plan, mode: str, max_batch: int,
              recalibrate: bool):
    """Both models on the CPU, with the threads given, remembered (unless timed on a busy
    machine: placement.recheck), or timed now and remembered with how busy the machine was."""
    cores = cpu_cores()
    split = mode == "split"                 # the draft's thread runs beside the target's
    if placement != (None, None):           # given (a count left None is timed, not kept)
        target, draft = _open_pair(root, manifest, placement, split, cores, max_batch)
        return target, draft, Placement(target.threads, draft.threads, "given")
    key = cache.measurement_key(manifest.digest(), "threads", mode=mode)
    known = None if recalibrate else \
        cache.recall(key, lambda record: Placement.restore(record, cores))
    busy_now = None
    if known is not None and known.provisional and known.timings > RECHECKS:
        watch = Busy()                      # is the machine quieter than when it was timed?
        sleep(QUIET_WINDOW_S)
        busy_now = watch.cores()
    if known is not None and not recheck(known, busy_now):
        target, draft = _open_pair(root, manifest, (known.target, known.draft), split, cores,
                                   max_batch)
        return target, draft, known
    watch = Busy()
    target, draft = _open_pair(root, manifest, (None, None), split, cores, max_batch)
    timed = (cores - 1 if split else cores) > 1       # else one candidate each: nothing timed
    chosen = Placement(target.threads, draft.threads, "measured",
                       watch.cores() if timed else None, (known.timings if known else 0) + 1)
    cache.remember(key, chosen.record())
    return target, draft, chosen


def _open_pair(root: Path, manifest: Manifest, placement, split: bool, cores: int,
               max_batch: int) -> tuple[ModelSession, ModelSession]:
    target = _open(root, manifest, "target", manifest.target, placement[0],
                   cores=max(1, cores - 1) if split else cores, max_batch=max_batch)
    draft = _open(root, manifest, "draft", manifest.draft, placement[1], beside=target,
                  cores=1 if split else cores, max_batch=max_batch)
    return target, draft


def _open_cuda(root: Path, manifest: Manifest, placement, _: Plan, __: str, max_batch: int,
               ___: bool):
    from .ort_cuda import OrtCudaSession

    max_new = manifest.max_draft + 2
    return tuple(OrtCudaSession(name, root / entry.path, entry, manifest.max_context, max_new,
                                n or 1, max_batch=max_batch)
                 for name, entry, n in (("target", manifest.target, placement[0]),
                                        ("draft", manifest.draft, placement[1])))


def _open_trt(root: Path, manifest: Manifest, placement, chosen: Plan, _: str, __: int,
              ___: bool):
    from .trt import TrtSession

    assert chosen.engines is not None
    max_new = manifest.max_draft + 2
    try:
        return tuple(TrtSession(name, root / chosen.engines[name].path, entry,
                                chosen.engines[name], manifest.max_context, max_new)
                     for name, entry in (("target", manifest.target), ("draft", manifest.draft)))
    except RuntimeError as exc:   # TensorRT's Python bindings raise it for a refused call
        raise BackendError(f"backend 'trt' did not open: TensorRT refused it ({exc}). ---> HINT: "
                           f"rebuild the engines with ssd-build-engines BUNDLE --force, or "
                           f"choose another backend.") from exc


_OPENERS = {"cpu": _open_cpu, "cuda": _open_cuda, "trt": _open_trt}


def _open_one(kind: str, root: Path, manifest: Manifest, name: str, threads: int | None,
              chosen: Plan, max_batch: int = 1) -> ModelSession:
    """One model on one backend, for a placement that splits them (a CPU draft beside a GPU
    target: its threads, unless given, chosen by timing as a target's, all cores free)."""
    entry: ModelEntry = getattr(manifest, name)
    if kind == "cpu":
        return _open(root, manifest, name, entry, threads, cores=cpu_cores(),
                     max_batch=max_batch)
    max_new = manifest.max_draft + 2
    if kind == "cuda":
        from .ort_cuda import OrtCudaSession

        return OrtCudaSession(name, root / entry.path, entry, manifest.max_context, max_new,
                              threads or 1, max_batch=max_batch)
    from .trt import TrtSession

    assert chosen.engines is not None
    try:
        return TrtSession(name, root / chosen.engines[name].path, entry, chosen.engines[name],
                          manifest.max_context, max_new)
    except RuntimeError as exc:   # TensorRT's Python bindings raise it for a refused call
        raise BackendError(f"backend 'trt' did not open the {name}: TensorRT refused it ({exc})."
                           f" ---> HINT: rebuild the engines with ssd-build-engines BUNDLE "
                           f"--force, or choose another backend.") from exc


def _open(root: Path, manifest: Manifest, name: str, entry: ModelEntry,
          threads: int | None, beside: ModelSession | None = None,
          cores: int = 1, max_batch: int = 1) -> ModelSession:
    """A CPU session with `threads` intra-op threads, or else `cores` unless 1 is clearly
    faster (placement.fastest)."""
    from .ort import OrtCpuSession

    max_new = manifest.max_draft + 2     # verify k+1, or a draft step with its catch-up token
    path = root / entry.path
    if threads is not None or cores == 1:
        chosen = OrtCpuSession(name, path, entry, manifest.max_context, max_new, threads or 1,
                               max_batch)
    else:
        candidates = [OrtCpuSession(name, path, entry, manifest.max_context, max_new, n,
                                    max_batch) for n in (1, cores)]
        # what each runs in the loop: the target single steps (k=0) and whole verifications,
        # which gain far more from threads than one token does; the draft a round of steps
        # right after a verification
        verify = manifest.max_draft + 1
        lengths = (1, verify) if beside is None else (1,) * max(1, manifest.max_draft)
        chosen = fastest(candidates, beside, lengths, verify)
    chosen.open_rows()      # the chosen one only: each holds its own copy of the weights
    return chosen
