"""TensorRT engines for a bundle: `ssd-export --engines` and `ssd-build-engines DIR`.

TensorRT 10 Python API: the ONNX parser reads each model with parse_from_file (so
its external weights resolve), two optimisation profiles (decode, prefill; batch 1 …
max_batch; see ssd_runtime.engines), the chosen precision and a timing cache kept in the
bundle.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, replace
from pathlib import Path
from time import perf_counter, strftime
from typing import Literal

from ssd_runtime import contract
from ssd_runtime.backends.trt import probe_tensorrt
from ssd_runtime.engines import GpuInfo, Profile, engine_folder, engine_profiles
from ssd_runtime.errors import ConfigError
from ssd_runtime.manifest import (MANIFEST_NAME, EngineEntry, Manifest, ModelEntry,
                                  manifest_json, read_manifest, sha256_file)

from .bundle import staging
from .config import Engines

MODELS = ("target", "draft")
TIMING_CACHE = "timing.cache"
TRT_HINT = ("---> HINT: on a machine with an NVIDIA GPU, pip install 'ssd-toolkit[trt]' (or use "
            "JetPack's TensorRT on Jetson); or export with --engines none and build them on the "
            "GPU machine with ssd-build-engines BUNDLE.")


def require_tensorrt(what: str, hint: str = TRT_HINT) -> tuple[str, GpuInfo]:
    """TensorRT's version and GPU 0, or a ConfigError saying what is missing."""
    version, gpu, problem = probe_tensorrt()
    if version is None or gpu is None:
        raise ConfigError(f"{what} needs TensorRT 10 and an NVIDIA GPU: {problem}. {hint}")
    return version, gpu


def decide_engines(mode: Engines, tensorrt_problem: str, blocking: list,
                   output: Path) -> tuple[Literal["build", "skip"], str]:
    """Build, or skip saying why; raise for --engines trt when building cannot work.
    `tensorrt_problem` is "" when TensorRT and a GPU are here; `blocking` holds the
    decoder graphs' lint errors."""
    if mode == "none":
        return "skip", "engines: none (--engines none)"
    if tensorrt_problem:
        if mode == "trt":
            raise ConfigError(f"--engines trt needs TensorRT 10 and an NVIDIA GPU: "
                              f"{tensorrt_problem}. {TRT_HINT}")
        return "skip", (f"engines: skipped ({tensorrt_problem}); build them on the GPU machine "
                        f"with ssd-build-engines {output}")
    if blocking:
        if mode == "trt":
            raise ConfigError(f"--engines trt: {blocking[0]}, which TensorRT 10 does not take "
                              f"({len(blocking)} such node(s)). ---> HINT: export with --engines "
                              f"none and run the bundle on --backend cuda or cpu.")
        return "skip", f"engines: skipped: {blocking[0]} ({len(blocking)} lint error(s))"
    return "build", ""


def export_engines(root: Path, manifest: Manifest, mode: Engines, precision: str, log,
                   output: Path, max_batch: int = 1) -> list[EngineEntry]:
    """The exporter's engines stage: lint the graphs, then build, skip or refuse.
    `root` is the staging folder that becomes `output`; the engines take 1 … max_batch rows."""
    if manifest.cpu_only:             # the pipeline never pairs it with --engines trt
        log.print(f"    engines: none: {manifest.cpu_only}; export with --graph standard "
                  f"--draft-quant none for TensorRT")
        return []
    if contract.STATIC in (manifest.target.graph, manifest.draft.graph):
        log.print("    engines: none: the static flavour binds each cache as both an input and "
                  "an output, which TensorRT does not allow; export with --graph standard for "
                  "TensorRT")
        return []
    with log.stage("TensorRT lint of the graphs"):
        blocking = lint_bundle(root, manifest, log.print)
    if manifest.draft.kind in contract.HEADS:     # its inputs are not the profiles' (§14)
        log.print("    engines: none: a head's engine (EAGLE-3, MTP) is not built yet; the "
                  "standard graphs run on --backend cuda")
        return []
    version, gpu, problem = probe_tensorrt() if mode != "none" else (None, None, "")
    action, message = decide_engines(mode, problem, blocking, output)
    if action == "skip":
        log.print(f"    {message}")
        return []
    with log.stage(f"build TensorRT {version} engines for {gpu.name} ({precision})"):
        return build_engines(root, manifest, (version, gpu), precision, False, False, log.print,
                             max_batch)


def lint_bundle(root: Path, manifest: Manifest, say=print) -> list:
    """Lint every graph; returns the decoder errors (they block engines). The heads run on
    ONNX Runtime whatever the backend, so their findings are only reported."""
    try:
        from ssd_graphs.trt_lint import errors, lint_file
    except ImportError as exc:
        say(f"    lint skipped: it needs the export extra ({exc.name}); TensorRT's parser "
            f"checks the graphs while building")
        return []
    blocking = []
    for role in MODELS:
        entry: ModelEntry = getattr(manifest, role)
        found = lint_file(root / entry.path, entry.path)
        blocking += errors(found)
        for finding in found:
            say(f"    {finding.severity}: {finding}")
    heads = [f for path in sorted(manifest.heads.values()) for f in lint_file(root / path, path)]
    if heads:
        say(f"    heads: {len(heads)} note(s) ({heads[0].op}: {heads[0].problem}, ...); they run "
            f"on ONNX Runtime, not TensorRT")
    return blocking


def build_engines(root: Path, manifest: Manifest, found: tuple[str, GpuInfo], precision: str,
                  version_compatible: bool, force: bool, say=print,
                  max_batch: int = 1) -> list[EngineEntry]:
    """Build target and draft plans into engines/<gpu-slug>-trt<version>/ of `root`, for
    calls of 1 … max_batch rows (engine_profiles).

    The plans are written to a temporary folder that is renamed into place, so an
    interrupted build never leaves half an engine set behind.
    """
    version, gpu = found                     # TensorRT's version and GPU 0, as probed
    import tensorrt as trt

    folder = engine_folder(gpu, version)
    final = root / folder
    if final.exists() and not force:
        raise ConfigError(f"{final} already exists (engines for {gpu.name} and TensorRT "
                          f"{version}). ---> HINT: pass --force to rebuild them.")
    with staging(final, force=True) as tmp:   # renamed into place only when complete
        old_cache = final / TIMING_CACHE
        cache = old_cache.read_bytes() if old_cache.is_file() else b""
        entries, seconds = [], {}
        for role in MODELS:
            entry: ModelEntry = getattr(manifest, role)
            profiles = engine_profiles(role, manifest.max_context, manifest.max_draft,
                                       contract.PREFILL_CHUNK, max_batch)
            t0 = perf_counter()
            plan, cache = _build_one(trt, root / entry.path, entry, profiles, precision,
                                     version_compatible, cache)
            seconds[role] = round(perf_counter() - t0, 1)
            say(f"    {role}: {len(plan) / 2**20:.1f} MiB plan in {seconds[role]} s")
            (tmp / f"{role}.plan").write_bytes(plan)
            entries.append(EngineEntry(
                model=role, path=f"{folder}/{role}.plan", sha256=sha256_file(tmp / f"{role}.plan"),
                gpu_name=gpu.name, compute_capability=gpu.compute_capability,
                tensorrt_version=version, precision=precision,
                version_compatible=version_compatible, profiles=[p.as_dict() for p in profiles]))
        (tmp / TIMING_CACHE).write_bytes(cache)
        build = {"tensorrt": version, "gpu": gpu.name, "compute_capability":
                 gpu.compute_capability, "precision": precision,
                 "version_compatible": version_compatible, "timing_cache": TIMING_CACHE,
                 "built": strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": seconds,
                 "engines": [asdict(e) for e in entries]}
        (tmp / "build.json").write_text(json.dumps(build, indent=2) + "\n")
    return entries


def add_engines(root: Path, precision: str, version_compatible: bool, force: bool,
                say=print, max_batch: int = 1) -> Manifest:
    """ssd-build-engines: verify the bundle, lint, build (1 … max_batch rows per call), and
    rewrite its manifest."""
    manifest = read_manifest(root, verify=True)
    if manifest.cpu_only:
        raise ConfigError(f"{root}: {manifest.cpu_only}; TensorRT takes only standard ONNX "
                          f"without quantized weights. ---> HINT: re-export with ssd-export "
                          f"--graph standard --draft-quant none (or --engines trt) for TensorRT.")
    if contract.STATIC in (manifest.target.graph, manifest.draft.graph):
        raise ConfigError(f"{root}: the static graph flavour binds each cache as both an input "
                          f"and an output of one call, which TensorRT does not allow. ---> "
                          f"HINT: re-export with ssd-export --graph standard for TensorRT, or "
                          f"serve this bundle with --backend cuda.")
    found = require_tensorrt("ssd-build-engines", "---> HINT: run it on the machine with the "
                             "NVIDIA GPU, with TensorRT installed (pip install 'ssd-toolkit[trt]',"
                             " or JetPack 6.1+'s TensorRT and pip install 'cuda-python>=12.6,<13' on "
                             "Jetson).")
    blocking = lint_bundle(root, manifest, say)
    if blocking:
        raise ConfigError(f"{blocking[0]}, which TensorRT 10 does not take ({len(blocking)} such "
                          f"node(s)). ---> HINT: use --backend cuda or cpu for this bundle.")
    entries = build_engines(root, manifest, found, precision, version_compatible, force, say,
                            max_batch)
    return record_engines(root, entries)


def record_engines(root: Path, entries: list[EngineEntry]) -> Manifest:
    """List `entries` in root/manifest.json, replacing engines of the same folder, with the
    checksums of every file in that folder; the manifest is replaced atomically."""
    manifest = read_manifest(root, verify=False)
    folders = {e.path.rsplit("/", 1)[0] + "/" for e in entries}

    def stale(path: str) -> bool:
        return any(path.startswith(folder) for folder in folders)

    files = {path: digest for path, digest in manifest.files.items() if not stale(path)}
    known = {e.path: e.sha256 for e in entries}          # plans, hashed when they were built
    for folder in sorted(folders):
        for file in sorted((root / folder).rglob("*")):
            if file.is_file():
                rel = file.relative_to(root).as_posix()
                files[rel] = known.get(rel) or sha256_file(file)
    engines = [e for e in manifest.engines if not stale(e.path)] + list(entries)
    updated = replace(manifest, engines=engines, files=dict(sorted(files.items())))
    tmp = root / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
    tmp.write_text(manifest_json(updated))
    os.replace(tmp, root / MANIFEST_NAME)
    return updated


def _build_one(trt, onnx_path: Path, entry: ModelEntry, profiles: tuple[Profile, ...],
               precision: str, version_compatible: bool, cache: bytes) -> tuple[bytes, bytes]:
    """One serialised plan and the updated timing cache."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)          # explicit batch: the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):         # resolves model.onnx.data itself
        problems = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise ConfigError(f"TensorRT's ONNX parser rejected {onnx_path}: "
                          f"{problems[0] if problems else 'no detail'}"
                          f"{f' (+{len(problems) - 1} more)' if len(problems) > 1 else ''}.")
    config = builder.create_builder_config()
    _set_precision(trt, config, precision)
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    timing = config.create_timing_cache(cache)
    if timing is None or not config.set_timing_cache(timing, False):
        raise ConfigError(f"TensorRT refused the timing cache for {onnx_path}. ---> HINT: "
                          f"delete the bundle's engines/*/{TIMING_CACHE} and rebuild.")
    for profile in profiles:
        shapes = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.shapes(entry).items():
            try:   # TensorRT 10's binding raises where the C++ setDimensions returns false
                shapes.set_shape(name, low, opt, high)
            except RuntimeError as exc:
                raise ConfigError(f"TensorRT refused the {profile.name} profile for {name!r}: "
                                  f"min {low}, opt {opt}, max {high} ({exc}).") from None
        if config.add_optimization_profile(shapes) < 0:
            raise ConfigError(f"TensorRT refused the {profile.name} optimisation profile of "
                              f"{onnx_path} ({profile.as_dict()}).")
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise ConfigError(f"TensorRT could not build an engine from {onnx_path} (precision "
                          f"{precision}); its log above says why.")
    return bytes(plan), bytes(config.get_timing_cache().serialize())


def _set_precision(trt, config, precision: str) -> None:
    if precision == "fp32":
        config.clear_flag(trt.BuilderFlag.TF32)     # true FP32, as the CPU computes
        return
    flag = {"fp16": "FP16", "bf16": "BF16"}.get(precision)
    if flag is None:
        raise ConfigError(f"--precision {precision!r}: choose fp16, bf16 or fp32.")
    if not hasattr(trt.BuilderFlag, flag):
        raise ConfigError(f"--precision {precision}: TensorRT {trt.__version__} has no "
                          f"BuilderFlag.{flag} (TensorRT 11 builds strongly typed networks "
                          f"only). ---> HINT: use TensorRT 10, or export with --dtype float16 "
                          f"and build with --precision fp32.")
    config.set_flag(getattr(trt.BuilderFlag, flag))
