"""On an NVIDIA GPU: the cuda and trt backends give the CPU backend's tokens (greedy, and
sampled with a seed), sampling is reproducible, and new KV rows are written in place on the
device.

Skipped without a GPU (tests/conftest.py); the trt tests also need TensorRT and
cuda-python. Engines are built here in fp32 (TF32 off) so that greedy choices match.
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

import tiny
from ssd_export import ExportConfig, export_bundle
from ssd_export.engines import add_engines
from ssd_runtime import Generator

pytestmark = pytest.mark.gpu
PROMPTS = ([0, 17, 42, 99], [0, 5, 9, 17, 33, 64, 100, 7, 250, 11])
KS = (0, 1, 4, "auto")


def has_trt() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("tensorrt", "cuda"))


needs_trt = pytest.mark.skipif(not has_trt(), reason="needs TensorRT and cuda-python")


def with_engines(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    if has_trt():
        add_engines(dst, "fp32", version_compatible=False, force=False, say=lambda text: None)
    return dst


def llama_pair_bundle(root: Path, seed: int, **target) -> Path:
    """A tiny llama target and its one-layer cut as draft, exported in the standard flavour,
    with engines where TensorRT is. Built here rather than from the session's `models`
    fixture, which makes every architecture the suite covers: the GPU machine's transformers
    need only have Llama."""
    tok = tiny.build_tokenizer(root / "tokenizer")
    target_dir = tiny.build_model(root / "target", "llama", tok, seed=seed, **target)
    draft = tiny.truncate(target_dir, root / "draft", 1, tok)
    export_bundle(ExportConfig(target=str(target_dir), draft=str(draft), output=root / "plain",
                               max_context=128, quiet=True, engines="none", graph="standard"))
    return with_engines(root / "plain", root / "bundle")


@pytest.fixture(scope="module")
def gpu_bundle(tmp_path_factory) -> Path:
    """KV rows of 128 bytes: TensorRT writes them via a scratch copy."""
    return llama_pair_bundle(tmp_path_factory.mktemp("gpu"), seed=1, layers=3)


@pytest.fixture(scope="module")
def aligned_bundle(tmp_path_factory) -> Path:
    """4 KV heads of 16 in fp32: 256-byte rows, bound in place by TensorRT too."""
    return llama_pair_bundle(tmp_path_factory.mktemp("aligned"), seed=21, layers=2,
                             num_key_value_heads=4)


def streams(gen: Generator, ks=KS, **settings) -> list[list[int]]:
    return [gen.generate(p, max_new_tokens=32, k=k, **settings).token_ids
            for p in PROMPTS for k in ks]


@pytest.mark.parametrize("fused_heads", [True, False])
def test_cuda_backend_gives_the_cpu_tokens(gpu_bundle, fused_heads):
    cpu = Generator.load(gpu_bundle, backend="cpu")
    cuda = Generator.load(gpu_bundle, backend="cuda", fused_heads=fused_heads)
    assert cuda.backend == "cuda" and (cuda.heads is not None) == fused_heads
    assert streams(cuda) == streams(cpu)


@needs_trt
@pytest.mark.parametrize("bundle", ["gpu_bundle", "aligned_bundle"])
def test_trt_backend_gives_the_cpu_tokens(bundle, request):
    root = request.getfixturevalue(bundle)
    cpu = Generator.load(root, backend="cpu")
    trt = Generator.load(root, backend="trt")
    assert trt.backend == "trt" and trt.target.in_place == (bundle == "aligned_bundle")
    assert streams(trt) == streams(cpu)
    auto = Generator.load(root)
    assert auto.backend == "trt" and auto.backend_reason.startswith("trt (auto): engines ")


@pytest.mark.parametrize("backend", ["cuda", pytest.param("trt", marks=needs_trt)])
def test_a_seed_gives_the_cpus_tokens_and_reproduces(gpu_bundle, backend):
    """Seeded (the invariant coupling): the target alone's tokens at every k, auto included,
    so the same as the CPU backend's; the rejection rule gives the CPU backend's tokens at a
    fixed k, split too (it was compared with a second run of itself)."""
    gen = Generator.load(gpu_bundle, backend=backend)
    cpu = Generator.load(gpu_bundle, backend="cpu")     # auto would open this GPU's backend
    assert gen.backend == backend and cpu.backend == "cpu"
    for seed in (0, 1, 2):
        settings = dict(temperature=0.8, top_p=0.95, seed=seed)
        assert streams(gen, **settings) == streams(cpu, **settings)
        rejection = dict(settings, coupling="rejection")
        fixed = [k for k in KS if k != "auto"]     # auto's round lengths follow timings
        assert streams(gen, ks=fixed, **rejection) == streams(cpu, ks=fixed, **rejection)

        def split(g: Generator) -> list[list[int]]:
            return [g.generate(p, max_new_tokens=32, k=3, mode="split", **rejection).token_ids
                    for p in PROMPTS]
        assert split(gen) == split(cpu)


def test_cuda_writes_new_kv_in_place_on_the_device(gpu_bundle):
    session = Generator.load(gpu_bundle, backend="cuda").target
    ids = np.array([0, 5, 9, 17, 33, 64, 100], np.int64)
    session.prefill(ids[:4])
    logits = session.forward(ids[4:], 4)
    outputs = session.binding.get_outputs()
    assert session.keys[0].device_name() == "cuda" and logits.device == "cuda"
    for i in range(session.entry.num_layers):
        assert outputs[2 * i].data_ptr() == session.keys[i].data_ptr() + 4 * session.row_bytes
        assert outputs[2 * i + 1].data_ptr() == session.values[i].data_ptr() + \
            4 * session.row_bytes
    assert outputs[-1].data_ptr() == logits.ptr


@needs_trt
def test_trt_binds_the_past_and_the_new_rows_inside_the_arena(aligned_bundle):
    session = Generator.load(aligned_bundle, backend="trt").target
    assert session.in_place and session.row_bytes % 256 == 0
    session.prefill(np.array([0, 5, 9], np.int64))
    first = session.forward(np.array([17, 33], np.int64), 3).numpy()
    context = session.contexts[0]
    for i in range(session.entry.num_layers):
        assert context.get_tensor_address(f"past_key.{i}") == session.keys[i].ptr
        assert context.get_tensor_address(f"new_key.{i}") == session.keys[i].ptr + \
            3 * session.row_bytes
        assert context.get_tensor_address(f"new_value.{i}") == session.values[i].ptr + \
            3 * session.row_bytes
    session.forward(np.array([200, 201, 202], np.int64), 3)      # a rejected continuation
    again = session.forward(np.array([17, 33], np.int64), 3)     # rolled back: free
    np.testing.assert_allclose(again.numpy(), first, atol=1e-5)
    np.testing.assert_allclose(again[-1], first[-1], atol=1e-5)   # one row to the host


@pytest.mark.parametrize("backend", ["cuda", pytest.param("trt", marks=needs_trt)])
@pytest.mark.parametrize("mode", ["sequential", "split"])
def test_a_cpu_draft_beside_a_gpu_target_gives_the_cpu_tokens(gpu_bundle, backend, mode):
    mixed = Generator.load(gpu_bundle, backend=backend, draft_backend="cpu", mode=mode)
    assert (mixed.backend, mixed.draft_backend) == (backend, "cpu")
    assert mixed.backend_reason.endswith("the draft on cpu")
    assert streams(mixed, mode=mode) == streams(Generator.load(gpu_bundle, backend="cpu"))


@pytest.fixture(scope="module")
def static_bundles(tmp_path_factory) -> dict[str, Path]:
    """The static flavour a GPU batches with (§2, §11): a tiny llama pair, and the same target
    with a random EAGLE-3 head (§14), max_batch 4."""
    root = tmp_path_factory.mktemp("static")
    tok = tiny.build_tokenizer(root / "tokenizer")
    target = tiny.build_model(root / "target", "llama", tok, seed=1, layers=3)
    head = tiny.build_eagle3_head(root / "head", "safeailab", target_hidden=64,
                                  vocab=tiny.VOCAB, hidden=32, seed=1)
    out = {}
    for name, draft in (("pair", tiny.truncate(target, root / "draft", 1, tok)), ("head", head)):
        out[name] = root / f"bundle-{name}"
        export_bundle(ExportConfig(target=str(target), draft=str(draft), output=out[name],
                                   max_context=128, quiet=True, engines="none",
                                   graph="static", max_batch=4))
    return out


@pytest.mark.parametrize("name", ["pair", "head"])
def test_static_bundles_give_the_cpu_tokens_alone_and_in_batches(static_bundles, name):
    """A single sequence rebinds its host inputs on every call (ONNX Runtime copies a host
    input to the GPU when it is bound: an H200 showed every single stream of a static bundle
    repeating one token), and a batch's rows are each the CPU's."""
    cpu = Generator.load(static_bundles[name], backend="cpu", max_batch=4)
    cuda = Generator.load(static_bundles[name], backend="cuda", max_batch=4)
    assert cuda.backend == "cuda"
    alone = streams(cpu, ks=(0,))
    assert streams(cuda) == [s for s in alone for _ in KS]
    for k in (0, 4, "auto"):
        rows = cuda.generate_batch([list(p) for p in PROMPTS], max_new_tokens=32, k=k)
        assert [r.token_ids for r in rows] == alone
