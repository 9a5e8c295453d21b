"""A content-addressed cache of the tests' exports, as a compiler cache keeps objects: traces
(`export_decoder`) and whole bundles (`export_bundle`), each filed under the hash of every
input, so that a changed input misses. tests/conftest.py and parity_cases.py use it.

Where: $SSD_TEST_CACHE, else ~/.cache/ssd-tests. SSD_TEST_CACHE=off keeps it to the run (a
folder of the run's own, shared by its xdist workers): the cold run CI's first run on a new
machine sees, still exporting each distinct graph once. Entries unused for KEEP_DAYS go.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

# what a trace is made of: the graph code and the contract it writes (errors.py: the refusals)
TRACE_SOURCES = ("ssd_graphs", "ssd_runtime.contract", "ssd_runtime.errors")
# what a bundle is made of: the exporter, and the runtime it runs for parity, batches and worth
BUNDLE_SOURCES = ("ssd_graphs", "ssd_export", "ssd_runtime")
PACKAGES = ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "numpy",
            "safetensors", "tokenizers")
# ExportConfig fields that name where and how loudly, not what is written
NOT_INPUTS = ("output", "force", "quiet")
FORMAT = 1              # raise it when what an entry holds changes
KEEP_DAYS = 14
DONE = "cache-entry.json"

_root: Path | None = None


def configure(persistent: Path | None, run_folder: Path) -> Path:
    """Use `persistent` (None: SSD_TEST_CACHE=off) or else `run_folder`; returns the root."""
    global _root
    _root = persistent or run_folder
    _root.mkdir(parents=True, exist_ok=True)
    if persistent is not None:
        _prune(persistent)
    return _root


def default_folder() -> Path | None:
    """$SSD_TEST_CACHE, ~/.cache/ssd-tests without it, None for "off"."""
    value = os.environ.get("SSD_TEST_CACHE", "")
    if value.lower() == "off":
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "ssd-tests"


# ---- keys -----------------------------------------------------------------------------------

def trace_key(model, max_context: int, graph: str, aux_layers: tuple[int, ...] = (),
              tree: bool = False, exact: bool = False) -> str:
    """Everything `export_decoder` reads but the source name, which only error messages
    (never cached) carry: the graph code, the tool versions, the model itself."""
    return _digest("trace", FORMAT, sources(TRACE_SOURCES), versions(), model_digest(model),
                   max_context, graph, list(aux_layers), tree, *(("exact",) if exact else ()))


def bundle_key(config) -> str:
    """Everything `export_bundle(config)` reads: the exporter's and runtime's code, the tool
    versions and what this machine offers (graph choice, engines), the two model folders,
    every option that changes what is written, and a --calib file's text."""
    options = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
               if f.name not in NOT_INPUTS}
    for role in ("target", "draft"):
        options[role] = folder_digest(Path(getattr(config, role)))
    if config.calib is not None:
        options["calib"] = file_digest(Path(config.calib))
    return _digest("bundle", FORMAT, sources(BUNDLE_SOURCES), versions(), machine(), options)


def sources(modules) -> dict[str, str]:
    """Digest of each package's folder (every file, data included) or module's file, with
    the __init__.py of the packages a module sits in (they run first)."""
    out = {}
    for name in modules:
        spec = importlib.util.find_spec(name)
        if spec.submodule_search_locations:
            out[name] = folder_digest(Path(next(iter(spec.submodule_search_locations))))
        else:
            out[name] = file_digest(Path(spec.origin))
        parts = name.split(".")
        for n in range(1, len(parts)):
            parent = ".".join(parts[:n])
            out.setdefault(parent, file_digest(Path(importlib.util.find_spec(parent).origin)))
    return out


def versions() -> dict[str, str]:
    out = {"python": sys.version}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "absent"
    import onnxruntime

    out["onnxruntime.__version__"] = onnxruntime.__version__   # as the export reads it
    return out


def machine() -> dict:
    """What the export's choices read of this machine (the graph flavour, engines, threads)."""
    import onnxruntime as ort

    return {"providers": ort.get_available_providers(), "cpus": os.cpu_count(),
            "tensorrt": importlib.util.find_spec("tensorrt") is not None,
            "gpu": Path("/dev/nvidia0").exists(), "arch": platform.machine()}


def model_digest(model) -> str:
    """The model as traced: its class, full config, and every parameter and buffer's bytes."""
    import torch

    h = hashlib.sha256()
    h.update(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    h.update(model.config.to_json_string(use_diff=False).encode())
    h.update(str(getattr(model.config, "_attn_implementation", None)).encode())
    h.update(str(model.training).encode())
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            t = tensor.detach().contiguous().cpu()
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def folder_digest(folder: Path) -> str:
    """Every file's relative path and bytes (__pycache__ left out)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*")
                       if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(file_digest(path).encode())
    return h.hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


# ---- entries --------------------------------------------------------------------------------

def traced(export, model, source: str, path: Path, max_context: int, graph: str,
           aux_layers: tuple[int, ...] = (), tree: bool = False, exact: bool = False):
    """`export(model, source, path, max_context, graph, aux_layers)` (graphs/trace.py's
    export_decoder; `tree=True`, `exact=True` passed on where asked), or its files and
    TracedModel from the cache; an exception is never cached."""
    from ssd_graphs.trace import TracedModel

    more = {**({"tree": True} if tree else {}), **({"exact": True} if exact else {})}
    if _root is None:
        return export(model, source, path, max_context, graph, aux_layers, **more)
    key = trace_key(model, max_context, graph, aux_layers, tree, exact)
    entry = _root / "traces" / key
    with _locked(key):
        if not (entry / DONE).exists():
            result = export(model, source, path, max_context, graph, aux_layers, **more)
            meta = {k: v for k, v in dataclasses.asdict(result).items() if k != "path"}
            with _writing(entry) as tmp:
                for file in _files_of(result.path):
                    shutil.copy2(file, tmp / file.name)
                (tmp / DONE).write_text(json.dumps({"name": result.path.name, **meta}))
            return result
    meta = json.loads((entry / DONE).read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    for file in entry.iterdir():
        if file.name != DONE:
            shutil.copy2(file, path.parent / file.name.replace(meta["name"], path.name, 1))
    _touch(entry)
    meta["aux_layer_ids"] = tuple(meta.get("aux_layer_ids", ()))     # JSON kept a list
    return TracedModel(path=path, **{k: v for k, v in meta.items() if k != "name"})


def bundle(config, out: Path) -> Path:
    """Write the bundle of `config` at `out`: a copy of the cached one, or exported (its
    traces through the trace cache) and then cached."""
    from ssd_export import export_bundle

    if _root is None:
        with tracing_cached():
            export_bundle(dataclasses.replace(config, output=out))
        return out
    key = bundle_key(config)
    entry = _root / "bundles" / key
    with _locked(key):
        if not (entry / DONE).exists():
            with _writing(entry) as tmp, tracing_cached():
                export_bundle(dataclasses.replace(config, output=tmp / "bundle"))
                (tmp / DONE).write_text(json.dumps({"output": str(out)}))
    shutil.copytree(entry / "bundle", out, dirs_exist_ok=True)
    _touch(entry)
    return out


@contextmanager
def tracing_cached():
    """The export pipeline traces through `traced` meanwhile, unless a test has put its own
    export_decoder there (whose results must not be filed under the real one's key)."""
    from ssd_export import pipeline
    from ssd_graphs import trace

    if pipeline.export_decoder is not trace.export_decoder:
        yield
        return
    real = trace.export_decoder
    pipeline.export_decoder = lambda model, source, path, max_context, graph="standard", \
        aux_layers=(), tree=False, exact=False: traced(real, model, source, path, max_context,
                                                       graph, aux_layers, tree, exact)
    try:
        yield
    finally:
        pipeline.export_decoder = real


def _files_of(path: Path) -> list[Path]:
    """model.onnx and its external data (model.onnx.data)."""
    return sorted(p for p in path.parent.iterdir() if p.name.startswith(path.name))


@contextmanager
def _locked(key: str):
    locks = _root / "locks"
    locks.mkdir(exist_ok=True)
    with FileLock(str(locks / f"{key}.lock")):
        yield


@contextmanager
def _writing(entry: Path):
    """A folder next to `entry` that becomes it, whole, only if the body succeeds."""
    tmp = entry.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if entry.exists():             # a half entry from a killed run (no DONE file)
            shutil.rmtree(entry)
        os.rename(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _touch(entry: Path) -> None:
    os.utime(entry / DONE)


def _prune(root: Path) -> None:
    """Remove entries unused for KEEP_DAYS, and temporary folders a killed run left."""
    old = time.time() - KEEP_DAYS * 86400
    for kind in ("traces", "bundles"):
        for entry in (root / kind).glob("*") if (root / kind).exists() else ():
            done = entry / DONE
            stamp = done.stat().st_mtime if done.exists() else entry.stat().st_mtime
            if stamp < old:
                shutil.rmtree(entry, ignore_errors=True)
