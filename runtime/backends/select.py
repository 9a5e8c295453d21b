"""Which backend to open: TensorRT, then ORT CUDA, then ORT CPU (docs/design.md §9).

`plan()` is a pure function of `Facts` (what is installed, which GPU, which
engines the bundle has), so tests decide with injected facts instead of GPUs;
backends/__init__.py gathers the real facts and opens the plan's attempts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..engines import GpuInfo, select_engines
from ..errors import BackendError
from ..manifest import EngineEntry

CUDA_PROVIDER = "CUDAExecutionProvider"
TRT_HINT = ("pip install 'ssd-toolkit[trt]' (TensorRT 10 and cuda-python 12) on x86_64; on "
            "SBSA (Grace) also pip install 'tensorrt-cu12>=10,<11'; on Jetson use JetPack 6.1+'s "
            "TensorRT and pip install 'cuda-python>=12.6,<13'")
ORT_GPU_HINT = ("pip uninstall -y onnxruntime && pip install onnxruntime-gpu (one of the two, "
                "never both)")


@dataclass(frozen=True)
class Facts:
    """What this machine offers, as plain data."""

    tensorrt: str | None = None                  # version of an importable TensorRT
    tensorrt_problem: str = ""                   # why TensorRT or cuda-python is unusable
    gpu: GpuInfo | None = None                   # CUDA device 0, as cuda-python reports it
    ort_providers: tuple[str, ...] = ("CPUExecutionProvider",)
    engines: tuple[EngineEntry, ...] = ()        # the bundle's manifest.engines
    cpu_only: str = ""                           # why the bundle is CPU-only (Manifest.cpu_only)


@dataclass(frozen=True)
class Plan:
    attempts: tuple[str, ...]                    # open these in order; the first that opens wins
    skipped: tuple[str, ...] = ()                # why better backends were passed over
    engines: dict[str, EngineEntry] | None = field(default=None)   # for "trt"


def plan(requested: str, facts: Facts) -> Plan:
    """The backends to try for `requested`; an explicit request that cannot work raises."""
    trt_engines, trt_why = _trt(facts)
    cuda_why = _cuda(facts)
    if requested == "trt":
        if trt_engines is None:
            raise BackendError(f"backend 'trt' is not usable here: {trt_why}.")
        return Plan(("trt",), engines=trt_engines)
    if requested == "cuda":
        if cuda_why:
            raise BackendError(f"backend 'cuda' is not usable here: {cuda_why}.")
        return Plan(("cuda",))
    if requested == "cpu":
        return Plan(("cpu",))
    if requested != "auto":
        raise BackendError(f"backend {requested!r} is unknown; choose one of auto, cpu, cuda, "
                           f"trt.")
    attempts, skipped = [], []
    if trt_engines is not None:
        attempts.append("trt")
    else:
        skipped.append(f"trt skipped: {trt_why}")
    if not cuda_why:
        attempts.append("cuda")
    else:
        skipped.append(f"cuda skipped: {cuda_why}")
    return Plan((*attempts, "cpu"), tuple(skipped), trt_engines)


def describe(chosen: str, plan_: Plan, failures: list[str], requested: str) -> str:
    """gen.backend_reason: what was chosen and why the better choices were not."""
    if requested != "auto":
        return f"{chosen}: requested"
    notes = [*plan_.skipped, *failures]
    if chosen == "trt" and plan_.engines:
        e = plan_.engines["target"]
        notes.insert(0, f"engines {e.path.rsplit('/', 2)[-2]} match {e.gpu_name} and "
                        f"TensorRT {e.tensorrt_version}")
    return f"{chosen} (auto): " + ("; ".join(notes) if notes else "first choice")


GPU_BUNDLE_HINT = ("---> HINT: re-export with ssd-export --graph standard --draft-quant none "
                   "for CUDA or TensorRT")


def _trt(facts: Facts) -> tuple[dict[str, EngineEntry] | None, str]:
    if facts.cpu_only:
        return None, f"the bundle has no TensorRT path: {facts.cpu_only} {GPU_BUNDLE_HINT}"
    if facts.tensorrt is None or facts.gpu is None:
        problem = facts.tensorrt_problem or ("TensorRT is not installed" if facts.tensorrt is None
                                             else "no CUDA GPU is visible")
        if facts.tensorrt is None:
            problem += f" ---> HINT: {TRT_HINT}"
        return None, problem
    return select_engines(list(facts.engines), facts.gpu, facts.tensorrt)


def _cuda(facts: Facts) -> str:
    """Why ORT CUDA cannot be tried ("" when it can)."""
    if facts.cpu_only:
        return f"the bundle is CPU-only: {facts.cpu_only} {GPU_BUNDLE_HINT}"
    if CUDA_PROVIDER not in facts.ort_providers:
        return (f"onnxruntime has no {CUDA_PROVIDER} (providers: "
                f"{', '.join(facts.ort_providers)}) ---> HINT: {ORT_GPU_HINT}")
    return ""
