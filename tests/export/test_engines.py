"""TensorRT engines without TensorRT: profiles, records, compatibility, the manifest
rewrite, the exporter's decisions, the operator lint, and clean refusals."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from test_bad_input import export_cli, run

from ssd_export.engines import decide_engines, record_engines
from ssd_graphs.trt_lint import SUPPORTED, errors, lint_file, lint_model
from ssd_runtime import Generator
from ssd_runtime.backends.select import Facts, plan
from ssd_runtime.engines import (GpuInfo, Profile, engine_folder, engine_profiles, gpu_slug,
                                 refusal, select_engines)
from ssd_runtime.errors import BackendError, ConfigError
from ssd_runtime.manifest import SCHEMA_VERSION, EngineEntry, read_manifest, sha256_file

H200 = GpuInfo("NVIDIA H200", "9.0")
A100 = GpuInfo("NVIDIA A100-SXM4-80GB", "8.0")
no_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None,
                                 reason="TensorRT is installed here")


def entry(model: str = "target", gpu: GpuInfo = H200, version: str = "10.8.0",
          compatible: bool = False, folder: str | None = None) -> EngineEntry:
    folder = folder or engine_folder(gpu, version)
    return EngineEntry(model, f"{folder}/{model}.plan", "0" * 64, gpu.name, gpu.compute_capability,
                       version, "fp16", compatible,
                       [p.as_dict() for p in engine_profiles(model, 256, 8, 256)])


# --- profiles and shapes ----------------------------------------------------------------

def test_profiles_span_decode_and_prefill():
    decode, prefill = engine_profiles("target", max_context=2048, max_draft=8, prefill_chunk=256)
    assert decode == Profile("decode", (1, 5, 10), (0, 1024, 2047))     # k+1 verify, catch-up
    assert prefill == Profile("prefill", (1, 64, 256), (0, 0, 2047))
    draft_decode, _ = engine_profiles("draft", 2048, 8, 256)
    assert draft_decode.new_len == (1, 1, 10)                            # one token a step
    small_decode, small_prefill = engine_profiles("target", 6, 8, 256)  # clamped to the context
    assert small_decode.new_len == (1, 5, 6) and small_prefill.new_len == (1, 6, 6)
    for profile in (decode, prefill, small_decode, small_prefill):
        for low, opt, high in (profile.new_len, profile.past_len):
            assert low <= opt <= high


def test_profile_shapes_follow_the_graph_contract(bundle_factory):
    manifest = read_manifest(bundle_factory("llama", "llama_cut", graph="standard", trees="on"))
    e = manifest.target
    decode, _ = engine_profiles("target", manifest.max_context, manifest.max_draft, 256)
    shapes = decode.shapes(e)
    assert set(shapes) == set(e.inputs)
    assert shapes["input_ids"] == ((1, 1), (1, 5), (1, 10))
    assert e.tree and shapes["tree_mask"] == ((1, 1, 1), (1, 5, 5), (1, 10, 10))  # (B, T, T)
    top = manifest.max_context - 1
    assert shapes["past_value.2"] == ((1, 0, e.num_kv_heads, e.head_dim),
                                      (1, manifest.max_context // 2, e.num_kv_heads, e.head_dim),
                                      (1, top, e.num_kv_heads, e.head_dim))


def test_profiles_take_a_batch_of_1_to_max_batch():
    """Batch 1 by default (the profiles above, unchanged); with max_batch the batch axis spans
    1 … max_batch and, since a batch binds each slot's whole cache, past_len max_context."""
    decode, prefill = engine_profiles("target", 2048, 8, 256)
    assert decode.batch == prefill.batch == (1, 1, 1)
    decode, prefill = engine_profiles("target", max_context=2048, max_draft=8, prefill_chunk=256,
                                      max_batch=8)
    assert decode == Profile("decode", (1, 5, 10), (0, 1024, 2048), (1, 8, 8))
    assert prefill == Profile("prefill", (1, 64, 256), (0, 0, 2048), (1, 1, 8))
    assert decode.as_dict()["batch"] == [1, 8, 8]
    with pytest.raises(ValueError, match=r"max_batch=0"):
        engine_profiles("target", 2048, 8, 256, max_batch=0)
    decode.check(10, 2048, "target", batch=8)
    with pytest.raises(BackendError, match=r"target: batch=9 is outside the TensorRT engine's "
                                           r"decode profile \(min 1, opt 8, max 8\).*--max-batch"):
        decode.check(1, 0, "target", batch=9)


def test_batched_profile_shapes_put_the_batch_on_axis_0(bundle_factory):
    manifest = read_manifest(bundle_factory("llama", "llama_cut", graph="standard"))
    e, top = manifest.target, manifest.max_context
    decode, _ = engine_profiles("target", top, manifest.max_draft, 256, max_batch=4)
    shapes = decode.shapes(e)
    assert shapes["position_ids"] == ((1, 1), (4, 5), (4, 10))
    assert shapes["past_key.0"] == ((1, 0, e.num_kv_heads, e.head_dim),
                                    (4, top // 2, e.num_kv_heads, e.head_dim),
                                    (4, top, e.num_kv_heads, e.head_dim))


def test_a_call_outside_a_profile_names_its_min_opt_max():
    decode, _ = engine_profiles("target", 64, 4, 256)
    decode.check(6, 0, "target")
    with pytest.raises(BackendError, match=r"target: new_len=7 is outside the TensorRT engine's "
                                           r"decode profile \(min 1, opt 5, max 6\)"):
        decode.check(7, 0, "target")
    with pytest.raises(BackendError, match=r"past_len=64 .* \(min 0, opt 32, max 63\)"):
        decode.check(1, 64, "target")


# --- engine records and compatibility ---------------------------------------------------

def test_engine_folders_name_the_gpu_and_tensorrt():
    assert gpu_slug(H200) == "nvidia-h200-sm90"
    assert gpu_slug(GpuInfo("Orin (nvgpu)", "8.7")) == "orin-nvgpu-sm87"
    assert engine_folder(H200, "10.8.0.43") == "engines/nvidia-h200-sm90-trt10.8.0.43"


def test_same_gpu_and_tensorrt_is_used_anything_else_is_refused_naming_both():
    assert refusal(entry(), H200, "10.8.0") is None
    other_gpu = refusal(entry(), A100, "10.8.0")
    assert "NVIDIA H200 (sm 9.0), TensorRT 10.8.0" in other_gpu
    assert "this machine has NVIDIA A100-SXM4-80GB (sm 8.0), TensorRT 10.8.0" in other_gpu
    other_trt = refusal(entry(), H200, "10.9.0")
    assert "built with NVIDIA H200 (sm 9.0), TensorRT 10.8.0" in other_trt
    assert other_trt.endswith("this machine has NVIDIA H200 (sm 9.0), TensorRT 10.9.0")


def test_version_compatible_engines_run_on_later_tensorrt_of_the_same_major():
    compatible = entry(version="10.3.0", compatible=True)
    assert refusal(compatible, H200, "10.8.0") is None
    assert "a version-compatible engine" in refusal(compatible, H200, "10.1.0")
    assert refusal(compatible, H200, "11.0.0") is not None
    assert refusal(compatible, A100, "10.8.0") is not None      # never across GPUs


def test_select_engines_wants_a_target_and_a_draft():
    both = [entry("target"), entry("draft")]
    chosen, why = select_engines(both, H200, "10.8.0")
    assert why == "" and chosen["draft"].path.endswith("/draft.plan")
    assert select_engines(both[:1], H200, "10.8.0")[1] == "the bundle's engines lack a draft"
    assert select_engines([], H200, "10.8.0")[1].startswith("the bundle has no TensorRT engines")
    chosen, why = select_engines(both, A100, "10.8.0")
    assert chosen is None and "ssd-build-engines" in why


# --- the manifest: engines field, atomic rewrite ----------------------------------------

@pytest.fixture
def bundle_copy(bundle_factory, tmp_path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(bundle_factory("llama", "llama_cut", graph="standard"), dst)
    return dst


def fake_engines(root: Path, gpu: GpuInfo, version: str) -> list[EngineEntry]:
    """Plans as ssd-build-engines lays them out; bytes stand in for real engines."""
    folder = engine_folder(gpu, version)
    (root / folder).mkdir(parents=True)
    entries = []
    for model in ("target", "draft"):
        plan_file = root / folder / f"{model}.plan"
        plan_file.write_bytes(f"{model} plan for {gpu.name}".encode())
        entries.append(replace(entry(model, gpu, version), sha256=sha256_file(plan_file)))
    (root / folder / "build.json").write_text("{}\n")
    (root / folder / "timing.cache").write_bytes(b"cache")
    return entries


def test_manifests_without_engines_still_load(bundle_copy):
    path = bundle_copy / "manifest.json"
    data = json.loads(path.read_text())
    assert data["engines"] == [] and data["schema_version"] == SCHEMA_VERSION
    del data["engines"]
    path.write_text(json.dumps(data))
    assert read_manifest(bundle_copy).engines == []


def test_recording_engines_rewrites_the_manifest_atomically(bundle_copy):
    before = read_manifest(bundle_copy)
    h200 = record_engines(bundle_copy, fake_engines(bundle_copy, H200, "10.8.0"))
    a100 = record_engines(bundle_copy, fake_engines(bundle_copy, A100, "10.8.0"))
    again = record_engines(bundle_copy, fake_engines_again(bundle_copy, H200, "10.8.0"))
    manifest = read_manifest(bundle_copy, verify=True)          # every checksum matches
    assert manifest == again and len(h200.engines) == 2 and len(a100.engines) == 4
    assert sorted(e.gpu_name for e in manifest.engines) == sorted([A100.name] * 2 + [H200.name] * 2)
    folder = engine_folder(H200, "10.8.0")
    assert manifest.files[f"{folder}/timing.cache"] == sha256_file(bundle_copy / folder /
                                                                   "timing.cache")
    assert {k: v for k, v in manifest.files.items() if not k.startswith("engines/")} == \
        before.files
    assert not [p for p in bundle_copy.iterdir() if p.name.startswith(".manifest")]
    # a machine with another GPU keeps to ONNX Runtime and says why, naming both GPUs
    facts = Facts("10.8.0", "", GpuInfo("NVIDIA L4", "8.9"), ("CPUExecutionProvider",),
                  tuple(manifest.engines))
    chosen = plan("auto", facts)
    assert chosen.attempts == ("cpu",) and "NVIDIA L4" in chosen.skipped[0]
    assert plan("auto", replace(facts, gpu=H200)).attempts == ("trt", "cpu")


def fake_engines_again(root: Path, gpu: GpuInfo, version: str) -> list[EngineEntry]:
    """A rebuild (--force) of the same folder: new bytes, same paths."""
    shutil.rmtree(root / engine_folder(gpu, version))
    entries = fake_engines(root, gpu, version)
    (root / engine_folder(gpu, version) / "target.plan").write_bytes(b"rebuilt")
    return [replace(e, sha256=sha256_file(root / e.path)) for e in entries]


@no_tensorrt
def test_generator_loads_a_bundle_with_engines_and_says_why_it_does_not_use_them(bundle_copy):
    record_engines(bundle_copy, fake_engines(bundle_copy, H200, "10.8.0"))
    gen = Generator.load(bundle_copy)
    assert gen.backend == "cpu" and "trt skipped: TensorRT is not installed" in gen.backend_reason


# --- the exporter's decision ------------------------------------------------------------

def test_exporter_builds_skips_or_refuses(tmp_path):
    out = tmp_path / "bundle"
    assert decide_engines("auto", "", [], out) == ("build", "")
    assert decide_engines("none", "no GPU", [], out)[0] == "skip"
    action, why = decide_engines("auto", "TensorRT is not installed", [], out)
    assert action == "skip" and why.endswith(f"ssd-build-engines {out}")
    with pytest.raises(ConfigError, match=r"--engines trt needs TensorRT 10 .*not installed"):
        decide_engines("trt", "TensorRT is not installed", [], out)
    blocking = errors(lint_model(graph_with("Unique"), "target/model.onnx"))
    action, why = decide_engines("auto", "", blocking, out)
    assert action == "skip" and "node 'n0' (Unique)" in why
    with pytest.raises(ConfigError, match=r"--engines trt: target/model\.onnx: node 'n0' "
                                          r"\(Unique\): Unique is not supported"):
        decide_engines("trt", "", blocking, out)


def build_engines(bundle: Path) -> subprocess.CompletedProcess:
    return run("ssd_export.cli", bundle, entry="build_engines_main")


@no_tensorrt
def test_engines_trt_without_tensorrt_fails_in_one_line_and_writes_nothing(models, tmp_path):
    out = tmp_path / "bundle"
    proc = export_cli(models["llama"], models["llama_cut"], out, "--engines", "trt",
                      quiet=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssd-export: error: --engines trt needs "
                                                   "TensorRT 10 and an NVIDIA GPU"), proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@no_tensorrt
def test_build_engines_without_tensorrt_leaves_the_bundle_alone(bundle_copy):
    manifest = (bundle_copy / "manifest.json").read_bytes()
    proc = build_engines(bundle_copy)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ssd-build-engines: error: ssd-build-engines "
                                                   "needs TensorRT 10"), proc.stderr
    assert (bundle_copy / "manifest.json").read_bytes() == manifest
    assert not (bundle_copy / "engines").exists()


def test_export_reports_the_lint_and_the_skipped_engines(models, tmp_path):
    out = tmp_path / "bundle"
    proc = export_cli(models["llama"], models["llama_cut"], out, "--max-context", "64",
                      "--graph", "standard", quiet=False)
    assert proc.returncode == 0, proc.stderr
    assert "graph flavour: standard (--graph)" in proc.stderr
    assert "TensorRT lint of the graphs" in proc.stderr
    assert "they run on ONNX Runtime, not TensorRT" in proc.stderr         # the heads' notes
    if importlib.util.find_spec("tensorrt") is None:
        assert "engines: skipped (TensorRT is not installed" in proc.stderr
        assert f"ssd-build-engines {out}" in proc.stderr
        assert json.loads((out / "manifest.json").read_text())["engines"] == []


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None
                    or "CUDAExecutionProvider" in __import__("onnxruntime").get_available_providers(),
                    reason="a GPU stack here makes auto write the standard graph")
def test_default_export_on_a_cpu_machine_writes_the_ort_flavour_and_says_so(models, tmp_path):
    out = tmp_path / "bundle"
    proc = export_cli(models["llama"], models["llama_cut"], out, "--max-context", "64",
                      quiet=False)
    assert proc.returncode == 0, proc.stderr
    assert "graph flavour: ort (no TensorRT or CUDA here" in proc.stderr
    assert "engines: none: the target is the 'ort' graph flavour" in proc.stderr
    assert "draft weights: int8 (a CPU bundle" in proc.stderr   # then kept or not, saying why
    manifest = read_manifest(out)
    assert manifest.target.graph == manifest.draft.graph == "ort" and manifest.engines == []
    assert manifest.target.outputs[1:3] == ["present_key.0", "present_value.0"]


@pytest.mark.parametrize("graph,refusal", [("ort", "'ort' graph flavour"),
                                           pytest.param("static", "static graph flavour",
                                                        marks=pytest.mark.slow)])
def test_in_place_flavours_and_tensorrt_refuse_each_other_naming_the_fix(
        models, bundle_factory, tmp_path, graph, refusal):
    """Neither the ort flavour (contrib ops) nor the static one (caches bound as both input
    and output) goes to TensorRT: the export refuses --engines trt before any work, and
    ssd-build-engines refuses the bundle, leaving it as it was."""
    out = tmp_path / "bundle"
    proc = export_cli(models["llama"], models["llama_cut"], out, "--graph", graph,
                      "--engines", "trt", quiet=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"--graph {graph} cannot go with --engines trt" in proc.stderr and not out.exists()
    bundle = bundle_factory("llama", "llama_cut", graph=graph)
    before = (bundle / "manifest.json").read_bytes()
    manifest = json.loads(before)
    assert {m["graph"] for m in manifest["models"].values()} == {graph}
    assert manifest["engines"] == [] and "top_id" in manifest["models"]["draft"]["outputs"]
    proc = build_engines(bundle)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert refusal in proc.stderr and "--graph standard" in proc.stderr
    assert (bundle / "manifest.json").read_bytes() == before


@pytest.mark.slow
def test_alibi_falls_back_to_the_standard_graph_under_auto_and_says_why(models, tmp_path):
    out = tmp_path / "bundle"
    proc = export_cli(models["falcon_alibi"], models["falcon_alibi_cut"], out,
                      "--max-context", "64", "--graph", "ort", quiet=False)
    assert proc.returncode == 2 and "no ALiBi" in proc.stderr and not out.exists()
    proc = export_cli(models["falcon_alibi"], models["falcon_alibi_cut"], out,
                      "--max-context", "64", "--graph", "auto", "--engines", "none", quiet=False)
    assert proc.returncode == 0, proc.stderr
    if "graph flavour: ort" in proc.stderr:
        assert "target: the ort flavour does not fit (the ort graph flavour has no ALiBi" \
            in proc.stderr
        manifest = read_manifest(out)
        assert manifest.target.graph == manifest.draft.graph == "standard"


# --- the TensorRT operator lint ---------------------------------------------------------

@pytest.mark.parametrize("pair", [("llama", "llama_cut"),
                                  pytest.param(("mistral", "mistral_cut"), marks=pytest.mark.slow),
                                  pytest.param(("gpt2", "gpt2_cut"), marks=pytest.mark.slow)])
def test_exported_decoder_graphs_pass_the_lint(bundle_factory, pair):
    root = bundle_factory(*pair, graph="standard")
    manifest = read_manifest(root)
    for model in (manifest.target, manifest.draft):
        assert errors(lint_file(root / model.path, model.path)) == []
    for path in manifest.heads.values():               # heads run on ORT: checked, reported
        for finding in lint_file(root / path, path):
            assert finding.graph == path and finding.node and finding.op in SUPPORTED


def graph_with(op: str, domain: str = "", opset: int = 18, **attrs) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    node = helper.make_node(op, ["x"], ["y"], name="n0", domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [x], [y])
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain
                                                  else [])
    return helper.make_model(graph, opset_imports=imports)


def test_lint_names_the_unsupported_op_and_node():
    (finding,) = lint_model(graph_with("Unique"), "hand.onnx")
    assert str(finding) == ("hand.onnx: node 'n0' (Unique): Unique is not supported by TensorRT "
                            "10's ONNX parser (onnx-tensorrt docs/operators.md, TensorRT 10.15 GA)")
    assert finding.severity == "error"
    (custom,) = lint_model(graph_with("FusedThing", domain="com.example"), "hand.onnx")
    assert "custom domain 'com.example'" in custom.problem
    (opset,) = lint_model(graph_with("Relu", opset=25), "hand.onnx")
    assert opset.op == "opset" and "outside [9, 24]" in opset.problem
    assert lint_model(graph_with("Relu"), "hand.onnx") == []


def test_lint_reports_failed_type_inference_and_lets_bugs_through(monkeypatch):
    """Type inference is what the dtype checks read: its failure is a warning naming why
    (it was dropped silently), and anything but ONNX's InferenceError propagates."""
    def failing(model, strict_mode=False):
        raise onnx.shape_inference.InferenceError("[ShapeInferenceError] (op_type:Cast): bad")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", failing)
    (finding,) = lint_model(graph_with("Relu"), "hand.onnx")
    assert finding.severity == "warning" and finding.op == "type inference"
    assert "ONNX type inference failed ([ShapeInferenceError] (op_type:Cast): bad)" in \
        finding.problem and "only declared types were checked" in finding.problem

    def buggy(model, strict_mode=False):
        raise TypeError("a bug")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", buggy)
    with pytest.raises(TypeError, match="a bug"):
        lint_model(graph_with("Relu"), "hand.onnx")


def test_lint_checks_dtypes_and_attributes():
    b = TensorProto.BOOL
    x = helper.make_tensor_value_info("x", b, [4])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [4])
    nodes = [helper.make_node("Cast", ["x"], ["c"], name="cast", to=TensorProto.INT64),
             helper.make_node("CumSum", ["c", "axis"], ["y"], name="cumsum")]
    axis = onnx.numpy_helper.from_array(np.array(0, np.int64), "axis")
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [axis]),
                              opset_imports=[helper.make_opsetid("", 18)])
    (finding,) = lint_model(model, "accept.onnx")
    assert finding.node == "cumsum" and "'c' is INT64; TensorRT 10 takes CumSum on" in \
        finding.problem
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 5000])
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in
            (("vals", TensorProto.FLOAT), ("idx", TensorProto.INT64))]
    k = onnx.numpy_helper.from_array(np.array([4000], np.int64), "k")
    topk = helper.make_node("TopK", ["v", "k"], ["vals", "idx"], name="topk", sorted=0)
    model = helper.make_model(helper.make_graph([topk], "g", [v], outs, [k]),
                              opset_imports=[helper.make_opsetid("", 18)])
    (finding,) = lint_model(model, "sample.onnx")
    assert finding.problem == "sorted=0; TensorRT needs sorted=1"
    model.graph.node[0].attribute[0].i = 1                  # sorted=1, K still too large
    (finding,) = lint_model(model, "sample.onnx")
    assert finding.problem == "K=4000; TensorRT needs K < 3840"
