"""Backend choice, device-logits access and the device binding path, without a GPU.

Selection is a pure function of injected facts; the ORT CUDA session runs its
very code path with device="cpu" (OrtValue arenas, DeviceLogits, heads bound to
the logits' memory), so everything but the CUDA provider itself is checked here.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ssd_runtime import Generator
from ssd_runtime.backends.device import DeviceLogits
from ssd_runtime.backends.ort import OrtCpuSession
from ssd_runtime.backends.ort_cuda import OrtCudaSession
from ssd_runtime.backends.select import Facts, describe, plan
from ssd_runtime.backends.trt import ALIGNMENT, in_place_kv, too_old
from ssd_runtime.engines import GpuInfo, engine_profiles
from ssd_runtime.errors import BackendError
from ssd_runtime.manifest import EngineEntry
from ssd_runtime.round.heads import HeadSessions

H200 = GpuInfo("NVIDIA H200", "9.0")
ORIN = GpuInfo("Orin (nvgpu)", "8.7")
CPU_ONLY = ("CPUExecutionProvider",)
WITH_CUDA = ("CUDAExecutionProvider", "CPUExecutionProvider")
PROMPT = [0, 17, 42, 99]


def engines_for(gpu: GpuInfo, version: str, compatible: bool = False) -> tuple[EngineEntry, ...]:
    folder = f"engines/x-trt{version}"
    profiles = [p.as_dict() for p in engine_profiles("target", 64, 8, 256)]
    return tuple(EngineEntry(role, f"{folder}/{role}.plan", "0" * 64, gpu.name,
                             gpu.compute_capability, version, "fp16", compatible, profiles)
                 for role in ("target", "draft"))


# --- choosing a backend from facts ------------------------------------------------------

def test_auto_on_a_bare_machine_is_cpu_and_says_why():
    chosen = plan("auto", Facts(tensorrt_problem="TensorRT is not installed"))
    assert chosen.attempts == ("cpu",)
    reason = describe("cpu", chosen, [], "auto")
    assert reason.startswith("cpu (auto): trt skipped: TensorRT is not installed")
    assert "pip install 'ssd-toolkit[trt]'" in reason and "onnxruntime-gpu" in reason


def test_auto_prefers_trt_then_cuda_then_cpu():
    facts = Facts("10.8.0", "", H200, WITH_CUDA, engines_for(H200, "10.8.0"))
    chosen = plan("auto", facts)
    assert chosen.attempts == ("trt", "cuda", "cpu")
    assert chosen.engines["target"].model == "target" and chosen.engines["draft"].model == "draft"
    assert describe("trt", chosen, [], "auto").startswith("trt (auto): engines x-trt10.8.0 "
                                                          "match NVIDIA H200")
    assert plan("auto", Facts(ort_providers=WITH_CUDA)).attempts == ("cuda", "cpu")


def test_auto_skips_engines_of_another_gpu_naming_both():
    facts = Facts("10.8.0", "", ORIN, WITH_CUDA, engines_for(H200, "10.8.0"))
    chosen = plan("auto", facts)
    assert chosen.attempts == ("cuda", "cpu")
    assert "NVIDIA H200 (sm 9.0)" in chosen.skipped[0] and "Orin (nvgpu) (sm 8.7)" in \
        chosen.skipped[0]
    assert "ssd-build-engines" in chosen.skipped[0]


def test_auto_falls_back_when_a_backend_fails_to_open():
    facts = Facts(ort_providers=WITH_CUDA)
    reason = describe("cpu", plan("auto", facts), ["cuda did not open: no GPU"], "auto")
    assert reason.startswith("cpu (auto): trt skipped: TensorRT is not installed")
    assert reason.endswith("; cuda did not open: no GPU")


def test_explicit_trt_refuses_another_tensorrt_version_naming_both():
    facts = Facts("10.3.0", "", H200, CPU_ONLY, engines_for(H200, "10.8.0"))
    with pytest.raises(BackendError, match=r"backend 'trt' is not usable here: .*TensorRT "
                                           r"10\.8\.0.*this machine has .*TensorRT 10\.3\.0"):
        plan("trt", facts)


def test_tensorrt_before_10_is_refused_by_name_and_auto_moves_on():
    # TensorRT 8.x parses into an implicit-batch network and fails obscurely: say so up front
    assert too_old("10.3.0") == too_old("10.13.2.6") == too_old("11.0") == ""
    problem = too_old("8.6.2")
    assert "TensorRT 8.6.2 is installed" in problem and "TensorRT 10" in problem
    chosen = plan("auto", Facts(None, problem, H200, WITH_CUDA))
    assert chosen.attempts == ("cuda", "cpu")
    assert "TensorRT 8.6.2 is installed" in describe("cuda", chosen, [], "auto")
    with pytest.raises(BackendError, match=r"TensorRT 8.6.2 is installed.*TensorRT 10"):
        plan("trt", Facts(None, problem, H200))


def test_explicit_trt_without_tensorrt_names_what_to_install():
    with pytest.raises(BackendError, match=r"not installed.*pip install 'ssd-toolkit\[trt\]'"):
        plan("trt", Facts())
    with pytest.raises(BackendError, match=r"no TensorRT engines.*ssd-build-engines"):
        plan("trt", Facts("10.8.0", "", H200))


def test_explicit_cuda_without_the_provider_names_onnxruntime_gpu():
    with pytest.raises(BackendError, match=r"no CUDAExecutionProvider.*pip uninstall -y "
                                           r"onnxruntime && pip install onnxruntime-gpu"):
        plan("cuda", Facts())
    assert plan("cuda", Facts(ort_providers=WITH_CUDA)).attempts == ("cuda",)
    assert describe("cpu", plan("cpu", Facts()), [], "cpu") == "cpu: requested"


def test_an_ort_flavour_bundle_is_cpu_only_and_says_how_to_get_a_gpu_bundle():
    why = "the draft is the 'ort' graph flavour, built for ONNX Runtime's CPU kernels"
    facts = Facts("10.8.0", "", H200, WITH_CUDA, engines_for(H200, "10.8.0"), cpu_only=why)
    chosen = plan("auto", facts)
    assert chosen.attempts == ("cpu",)
    reason = describe("cpu", chosen, [], "auto")
    assert "trt skipped: the bundle has no TensorRT path" in reason
    assert "cuda skipped: the bundle is CPU-only" in reason and "--graph standard" in reason
    for backend in ("cuda", "trt"):
        with pytest.raises(BackendError, match=rf"backend '{backend}'.*'ort' graph flavour.*"
                                               r"ssd-export --graph standard --draft-quant none"):
            plan(backend, facts)


def test_the_cuda_session_refuses_an_ort_flavour_graph(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"), threads=1)
    m = gen.manifest
    assert m.target.graph == "ort"
    with pytest.raises(BackendError, match=r"backend 'cuda'.*CPU-only.*--graph standard"):
        OrtCudaSession("target", gen.root / m.target.path, m.target, m.max_context, 10, 1)


def test_onnxruntime_too_old_for_the_ort_flavour_is_refused_naming_both_fixes(bundle_factory,
                                                                             monkeypatch):
    from ssd_runtime import contract

    assert contract.runs_ort_flavour("1.20.0") and contract.runs_ort_flavour("1.32.0")
    assert contract.runs_ort_flavour("1.21.0.dev20250101")
    assert not contract.runs_ort_flavour("1.19.2") and not contract.runs_ort_flavour("1.18.1")
    bundle = bundle_factory("llama", "llama_cut")
    monkeypatch.setattr("onnxruntime.__version__", "1.19.2")
    # the target's fused rows graph needs 1.23 and names itself first (tests/graphs/test_fused.py)
    monkeypatch.setattr("ssd_runtime.contract.STATIC_FUSED_MIN", (1, 19))
    with pytest.raises(BackendError, match=r"'ort' graph flavour, which onnxruntime 1\.19\.2 "
                                           r"runs wrongly.*onnxruntime>=1\.20.*--graph standard"):
        Generator.load(bundle)


@pytest.mark.slow
def test_onnxruntime_too_old_for_the_moe_kernel_is_refused_naming_both_fixes(bundle_factory,
                                                                           monkeypatch):
    """The ort flavour runs SiLU experts on ONNX Runtime's MoE kernel (1.23.1 and newer); the
    standard graph runs them dense, on any release."""
    kernel = bundle_factory("qwen3_moe", "qwen3_moe_cut")
    dense = bundle_factory("qwen3_moe", "qwen3_moe_cut", graph="standard")
    from ssd_runtime.manifest import read_manifest

    assert read_manifest(kernel).target.moe == "kernel"
    assert read_manifest(dense).target.moe == "dense"
    assert read_manifest(bundle_factory("llama", "llama_cut")).target.moe == "none"
    monkeypatch.setattr("onnxruntime.__version__", "1.23.0")
    with pytest.raises(BackendError, match=r"the target graph has ONNX Runtime's MoE kernel, "
                                           r"which onnxruntime 1\.23\.0 runs wrongly or not at "
                                           r"all \(it needs 1\.23\.1 or newer\).*--graph standard"):
        Generator.load(kernel)
    Generator.load(dense)


# --- the real machine (CI has no GPU) ---------------------------------------------------

needs_no_gpu_stack = pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None
    or "CUDAExecutionProvider" in __import__("onnxruntime").get_available_providers(),
    reason="this machine has a GPU stack")


@needs_no_gpu_stack
def test_this_machine_picks_cpu_and_refuses_gpu_backends_clearly(bundle_factory):
    bundle = bundle_factory("llama", "llama_cut", graph="standard")
    gen = Generator.load(bundle)
    assert gen.backend == "cpu" and gen.last_result is None
    assert "trt skipped: TensorRT is not installed" in gen.backend_reason
    assert "cuda skipped: onnxruntime has no CUDAExecutionProvider" in gen.backend_reason
    with pytest.raises(BackendError, match=r"backend 'cuda'.*install onnxruntime-gpu"):
        Generator.load(bundle, backend="cuda")
    with pytest.raises(BackendError, match=r"backend 'trt'.*TensorRT is not installed.*"
                                           r"pip install 'ssd-toolkit\[trt\]'"):
        Generator.load(bundle, backend="trt")


def test_the_trt_module_imports_neither_tensorrt_nor_cuda():
    code = ("import sys, ssd_runtime.backends.trt, ssd_runtime.backends.ort_cuda; "
            "print([m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'cuda')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_kv_rows_are_bound_in_place_only_when_tensorrt_alignment_allows():
    assert ALIGNMENT == 256
    assert in_place_kv(8 * 128 * 2)          # 8 KV heads of 128, fp16: 2048 bytes a row
    assert in_place_kv(2 * 32 * 4)           # 256 bytes
    assert not in_place_kv(2 * 16 * 4)       # the tiny test models: 128 bytes -> scratch + copy


# --- device logits ----------------------------------------------------------------------

def test_device_logits_copy_only_the_rows_asked_for():
    host = np.arange(5 * 7, dtype=np.float32).reshape(5, 7)          # (T, V) "device" buffer
    asked = []

    def rows_to_host(first: int, count: int) -> np.ndarray:
        asked.append((first, count))
        return host[first:first + count].copy()

    logits = DeviceLogits(host.ctypes.data, 5, 7, np.float32, "cpu", rows_to_host)
    np.testing.assert_array_equal(logits[-1], host[4])
    assert asked == [(4, 1)]
    tail = logits[3:]
    assert tail.shape == (2, 7) and tail.ptr == host.ctypes.data + 3 * 7 * 4 and asked == [(4, 1)]
    np.testing.assert_array_equal(tail[0], host[3])
    np.testing.assert_array_equal(np.argmax(logits, axis=-1), np.argmax(host, axis=-1))
    assert asked[-1] == (0, 5) and len(logits) == 5
    with pytest.raises(IndexError):
        logits[5]
    with pytest.raises(IndexError, match="contiguous"):
        logits[::2]


# --- the ORT device session on host memory ----------------------------------------------

def device_sessions(gen: Generator) -> tuple[OrtCudaSession, OrtCudaSession]:
    m, root = gen.manifest, gen.root
    return tuple(OrtCudaSession(name, root / entry.path, entry, m.max_context, m.max_draft + 2,
                                1, device="cpu")
                 for name, entry in (("target", m.target), ("draft", m.draft)))


def test_device_session_binds_in_place_and_matches_the_cpu_session(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut", graph="standard"), backend="cpu",
                         threads=1)
    target, _ = device_sessions(gen)
    host: OrtCpuSession = gen.target
    ids = np.array([0, 5, 9, 17, 33, 64, 100], np.int64)
    for session in (host, target):
        session.prefill(ids[:4])
    expected = host.forward(ids[4:], 4).copy()
    logits = target.forward(ids[4:], 4)
    assert isinstance(logits, DeviceLogits) and logits.shape == (3, gen.manifest.target.vocab_size)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5)
    np.testing.assert_allclose(logits[-1], expected[-1], atol=1e-5)
    outputs = target.binding.get_outputs()   # binding order: new_key.0, new_value.0, ..., logits
    for i in range(target.entry.num_layers):
        assert outputs[2 * i].data_ptr() == target.keys[i].data_ptr() + 4 * target.row_bytes
        assert outputs[2 * i + 1].data_ptr() == target.values[i].data_ptr() + 4 * target.row_bytes
    assert outputs[-1].data_ptr() == logits.ptr == target.logits.data_ptr()


def test_generation_on_the_device_path_equals_the_cpu_backend(bundle_factory, small_vocab_bundle):
    for bundle, prompt in ((bundle_factory("llama", "llama_cut"), PROMPT),
                           (small_vocab_bundle[0], [0, 5, 6, 7])):
        host = Generator.load(bundle, backend="cpu", threads=1)
        device = Generator.load(bundle, backend="cpu", threads=1, fused_heads=False)
        device.target, device.draft = device_sessions(device)
        for k in (0, 1, 4, "auto"):
            expected = host.generate(prompt, max_new_tokens=24, k=k).token_ids
            assert device.generate(prompt, max_new_tokens=24, k=k).token_ids == expected
        # heads bound to the logits' memory, as on a GPU
        device.heads = HeadSessions(device.root, device.manifest.heads, "cpu")
        for k in (0, 3):
            expected = host.generate(prompt, max_new_tokens=24, k=k).token_ids
            assert device.generate(prompt, max_new_tokens=24, k=k).token_ids == expected
        host_heads = Generator.load(bundle, backend="cpu", threads=1, fused_heads=True)
        for seed, coupling in [(0, "rejection"), (1, "rejection"), (2, "invariant")]:
            setting = dict(max_new_tokens=16, k=3, temperature=0.9, top_p=0.95, seed=seed,
                           coupling=coupling)
            expected = host_heads.generate(prompt, **setting).token_ids
            assert device.generate(prompt, **setting).token_ids == expected
            assert device.generate(prompt, mode="split", **setting).token_ids == expected


@pytest.mark.slow    # its static bundle is the fast subset's only one (ragged tests: the graphs)
def test_batches_on_the_device_path_take_the_static_flavour(bundle_factory):
    """The cuda backend batches static bundles (design §11): the device code path on host
    memory gives each sequence of a batch its tokens alone, with several new tokens per row in
    one call; a batch of a standard graph is refused, naming the fix."""
    from test_batch import batch_prompts

    bundle = bundle_factory("llama", "llama_cut", graph="static")
    host = Generator.load(bundle, backend="cpu", threads=1)
    device = Generator.load(bundle, backend="cpu", threads=1, max_batch=4, fused_heads=False)
    m = device.manifest
    device.target, device.draft = (
        OrtCudaSession(name, device.root / entry.path, entry, m.max_context, m.max_draft + 2, 1,
                       device="cpu", max_batch=4)
        for name, entry in (("target", m.target), ("draft", m.draft)))
    assert device.target.batches_new_tokens
    # the static flavour reads every row: fresh device memory must start as zeros (a NaN left
    # there survived the mask and made a CI run's tokens all 0)
    for session in (device.target, device.draft):
        assert not any(a.numpy().any() for a in (*session.keys, *session.values))
    prompts = batch_prompts()
    alone = []
    for p in prompts:
        p = dict(p)
        alone.append(host.generate(p.pop("prompt"), **{**p, "k": 0}).token_ids)
    assert device.generate(prompts[0]["prompt"], max_new_tokens=24, k=3).token_ids == alone[0]
    for k in (0, 3):
        assert [r.token_ids for r in device.generate_batch(prompts, k=k)] == alone
    standard = Generator.load(bundle_factory("llama", "llama_cut", graph="standard"),
                              backend="cpu", threads=1)
    e = standard.manifest.target
    with pytest.raises(BackendError, match=r"needs the static graph flavour.*HINT: re-export "
                                           r"with ssd-export --graph static"):
        OrtCudaSession("target", standard.root / e.path, e, standard.manifest.max_context, 10, 1,
                       device="cpu", max_batch=2)


def test_cuda_errors_name_the_call_and_are_formatted_only_on_failure():
    """`_call` (every cuda-python call of the trt backend) on cuda-python's return shapes."""
    from types import SimpleNamespace

    from ssd_runtime.backends.trt import _call

    ok, bad = "cudaSuccess", "cudaErrorInvalidValue"
    cudart = SimpleNamespace(cudaError_t=SimpleNamespace(cudaSuccess=ok),
                             cudaGetErrorName=lambda err: (ok, err.encode()))

    def never() -> str:
        raise AssertionError("formatted on success")
    assert _call(cudart, (ok, 7), never) == 7 and _call(cudart, (ok, 1, 2), never) == (1, 2)
    with pytest.raises(BackendError, match=r"CUDA target: cudaMemcpyAsync H2D of 8 bytes failed: "
                                           r"cudaErrorInvalidValue\."):
        _call(cudart, (bad,), lambda: "target: cudaMemcpyAsync H2D of 8 bytes")
    with pytest.raises(BackendError, match="CUDA cudaSetDevice failed"):
        _call(cudart, bad, "cudaSetDevice")


# --- choosing CPU threads ---------------------------------------------------------------

class _Clock:
    """The chooser's clock, advanced only by the stand-ins' passes: what is timed is exactly
    what they say they take, whatever else runs on the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Timed:
    """A stand-in whose passes take given seconds by new-token count on a `_Clock`: the thread
    chooser's decision is what is under test, not ONNX Runtime nor this machine's load."""

    max_context = 256

    def __init__(self, threads: int, seconds: dict[int, float], clock: _Clock) -> None:
        self.threads, self.seconds, self.clock = threads, seconds, clock

    def prefill(self, ids) -> None:
        pass

    def forward(self, ids, past_len: int) -> None:
        self.clock.now += self.seconds[len(ids)]


def test_threads_are_chosen_on_the_passes_the_loop_runs(monkeypatch):
    """One token gains nothing from a second thread but a verification gains 2x: the target
    keeps both threads once verifications are timed too; fewer threads win only when clearly
    faster (placement.GAIN: 10%), and level or slightly faster ones leave the all-cores
    default. Timed on a clock of the stand-ins' own: busy-waits preempted by a second test
    worker on this 2-core machine decided it wrongly twice."""
    from ssd_runtime.backends import placement

    clock = _Clock()
    monkeypatch.setattr(placement, "perf_counter", clock)
    one = _Timed(1, {1: 2e-3, 9: 6e-3}, clock)
    two = _Timed(2, {1: 2e-3, 9: 3e-3}, clock)
    assert placement.fastest([one, two], None, lengths=(1,), rounds=15).threads == 2
    assert placement.fastest([one, two], None, lengths=(1, 9), rounds=15).threads == 2
    level = _Timed(2, {1: 2e-3, 9: 6e-3}, clock)
    assert placement.fastest([one, level], None, lengths=(1, 9), rounds=15).threads == 2
    slower = _Timed(2, {1: 2.1e-3, 9: 6.4e-3}, clock)      # 1 thread 6% faster: in the noise
    assert placement.fastest([one, slower], None, lengths=(1, 9), rounds=15).threads == 2
    clearly = _Timed(2, {1: 3e-3, 9: 9e-3}, clock)          # 1 thread 33% faster
    assert placement.fastest([one, clearly], None, lengths=(1, 9), rounds=15).threads == 1


def test_a_few_slow_rounds_do_not_move_the_choice(monkeypatch):
    """Paired ratios and their median: three preempted passes (10x their time) among fifteen
    rounds leave the default chosen, and leave a clearly faster candidate chosen (a quarter
    of the rounds may be slow: placement.FASTER_SHARE)."""
    from ssd_runtime.backends import placement

    clock = _Clock()
    monkeypatch.setattr(placement, "perf_counter", clock)
    one = _Timed(1, {1: 2e-3}, clock)
    two = _Stalling(2, {1: 2e-3}, clock, stalls={3, 7, 12})
    assert placement.fastest([one, two], None, rounds=15).threads == 2
    fast_one = _Stalling(1, {1: 1e-3}, clock, stalls={0, 5, 14})
    assert placement.fastest([fast_one, _Timed(2, {1: 2e-3}, clock)], None,
                             rounds=15).threads == 1


class _Stalling(_Timed):
    """A stand-in whose timed pass in the rounds `stalls` takes ten times as long (another
    process took its cores then); a pass counts once per round after the warm-up."""

    def __init__(self, threads: int, seconds: dict[int, float], clock: _Clock,
                 stalls: set[int]) -> None:
        super().__init__(threads, seconds, clock)
        self.stalls, self.calls = stalls, -1           # the warm-up pass is call -1

    def forward(self, ids, past_len: int) -> None:
        slow = 10 if self.calls in self.stalls else 1
        self.calls += 1
        self.clock.now += slow * self.seconds[len(ids)]


# --- what moves `auto` to the next backend ---------------------------------------------

def open_with(monkeypatch, backend: str, attempts: tuple[str, ...], openers: dict):
    """open_backend over a plan of `attempts`, each opened by openers[name]."""
    from types import SimpleNamespace

    import ssd_runtime.backends as backends
    from ssd_runtime.backends.select import Plan

    monkeypatch.setattr(backends, "probe", lambda manifest, requested, **_: Facts())
    monkeypatch.setattr(backends, "plan", lambda requested, facts: Plan(
        attempts, engines={r: SimpleNamespace(path=f"{r}.plan") for r in ("target", "draft")}))
    monkeypatch.setattr(backends, "_OPENERS", {**backends._OPENERS, **openers})
    manifest = SimpleNamespace(max_draft=4, max_context=64, target=None, draft=None)
    return backends.open_backend(Path("bundle"), manifest, backend)


def refusing_trt_session(*args, **kwargs):
    raise RuntimeError("setOptimizationProfileAsync: profile 1 refused")   # as TensorRT 10 does


def fake_cpu(*args):
    return "target", "draft"


def test_tensorrts_refusal_moves_auto_on_and_is_one_line_when_asked_for(monkeypatch):
    import ssd_runtime.backends as backends

    monkeypatch.setattr("ssd_runtime.backends.trt.TrtSession", refusing_trt_session)
    opened = open_with(monkeypatch, "auto", ("trt", "cpu"), {"cpu": fake_cpu})
    assert opened.backend == "cpu" and "profile 1 refused" in opened.reason
    with pytest.raises(BackendError, match=r"backend 'trt' did not open: TensorRT refused it "
                                           r"\(.*profile 1 refused\).*HINT: rebuild"):
        open_with(monkeypatch, "trt", ("trt",), {"trt": backends._open_trt})


@pytest.mark.parametrize("backend", ["auto", "cpu"])
def test_a_bug_in_a_backend_is_not_a_fallback(monkeypatch, backend):
    """A RuntimeError outside TensorRT's bindings is a bug: it propagates as itself instead of
    moving `auto` on (or becoming a BackendError that blames the backend)."""
    def buggy_cuda(*args):
        raise RuntimeError("a bug")

    attempts = ("cuda", "cpu") if backend == "auto" else ("cpu",)
    with pytest.raises(RuntimeError, match="a bug"):
        open_with(monkeypatch, backend, attempts, {"cuda": buggy_cuda, "cpu": buggy_cuda})


# --- a CPU draft beside a GPU target ------------------------------------------------------

def test_a_cpu_draft_is_asked_for_by_name_and_refused_where_it_cannot_go(bundle_factory):
    bundle = bundle_factory("llama", "llama_cut", graph="standard")
    with pytest.raises(BackendError, match="draft_backend 'tpu' is unknown; choose one of "
                                           "cpu, cuda, trt"):
        Generator.load(bundle, draft_backend="tpu")
    with pytest.raises(BackendError, match="draft_backend 'cuda' beside a 'cpu' target: only "
                                           "a CPU draft beside a GPU target"):
        Generator.load(bundle, backend="cpu", draft_backend="cuda")
    with pytest.raises(BackendError, match=r"backend 'cuda'.*install onnxruntime-gpu"):
        Generator.load(bundle, backend="cuda", draft_backend="cpu")   # no GPU here
    same = Generator.load(bundle, backend="cpu", draft_backend="cpu")  # one backend: as before
    assert (same.backend, same.draft_backend) == ("cpu", "cpu")
    assert same.generate(PROMPT, max_new_tokens=16, k=3).token_ids == \
        Generator.load(bundle).generate(PROMPT, max_new_tokens=16, k=0).token_ids


def test_a_cpu_only_draft_does_not_keep_a_gpu_target_on_the_cpu(bundle_factory):
    """A bundle whose draft is CPU-only (MatMulNBits) is CPU-only as a whole, unless the draft
    is to run on the CPU anyway: then only the target's graph decides."""
    from dataclasses import replace

    from ssd_runtime.backends import probe
    from ssd_runtime.manifest import read_manifest

    manifest = read_manifest(bundle_factory("llama", "llama_cut", graph="standard"))
    assert manifest.cpu_only == ""
    cpu_draft = replace(manifest, draft=replace(manifest.draft, quant="int4",
                                                quant_scheme={"form": "MatMulNBits"}))
    assert "the draft is int4 MatMulNBits weights" in cpu_draft.cpu_only
    assert probe(cpu_draft, "cuda").cpu_only == cpu_draft.cpu_only
    assert probe(cpu_draft, "cuda", target_only=True).cpu_only == ""
    facts = replace(probe(cpu_draft, "cuda", target_only=True), ort_providers=WITH_CUDA)
    assert plan("auto", facts).attempts[0] == "cuda"
    ort_target = read_manifest(bundle_factory("llama", "llama_cut"))
    assert "the target is the 'ort' graph flavour" in \
        probe(ort_target, "cuda", target_only=True).cpu_only
