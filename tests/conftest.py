"""Session fixtures: a tokenizer, tiny models of each class, and bundles built from them."""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from filelock import FileLock

sys.path.insert(0, str(Path(__file__).parent))

import export_cache  # noqa: E402
import tiny  # noqa: E402
import torchlib_once  # noqa: E402

# every export of the run reads torchlib's function list once (tests/torchlib_once.py)
torchlib_once.enable()

# What start-up remembers (ssd_runtime.cache) goes to a folder of the run's own, never to
# ~/.cache; each test gets a fresh one below, so that no test depends on another's.
os.environ["SSD_CACHE_DIR"] = tempfile.mkdtemp(prefix="ssd-cache-")
atexit.register(shutil.rmtree, os.environ["SSD_CACHE_DIR"], True)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch) -> None:
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path_factory.mktemp("ssd-cache")))


def _has_gpu() -> bool:
    """An NVIDIA device plus TensorRT or ONNX Runtime's CUDA provider; each gpu test checks
    the backend it needs itself."""
    if not Path("/dev/nvidia0").exists():
        return False
    import importlib.util

    try:
        import onnxruntime as ort

        cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    except ImportError:
        cuda = False
    return cuda or importlib.util.find_spec("tensorrt") is not None


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with TensorRT or ORT CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# later families, one fixture model each (and a truncated draft)
NEWER = ("gemma3", "starcoder2", "granite", "olmo2", "smollm3", "phi", "stablelm", "gpt_bigcode",
         "gptj", "cohere")
# mixture-of-experts families
MOE = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "granitemoe", "granitemoeshared", "gpt_oss",
       "ernie4_5_moe", "hunyuan_v1_moe", "glm4_moe", "dots1", "phimoe",
       "deepseek_v3", "deepseek_v2")
# legacy and misc families (tiny.LEGACY) that brought a new mechanism: a truncated draft each
LEGACY_CUT = ("gpt_neo", "bloom", "codegen")
# dense families added after them (HunYuan and Ministral 3, with new mechanisms, get drafts)
LATER_DENSE = ("ministral", "exaone4", "glm4", "glm", "ernie4_5", "hunyuan", "olmo3", "olmo",
               "seed_oss", "cohere2", "vaultgemma", "ministral3")
LATER_DENSE_CUT = ("hunyuan", "ministral3")


def _shared(tmp_path_factory, name: str) -> Path:
    """A folder that every pytest-xdist worker of this run shares (`make test` runs two), or
    the session's own without xdist: what one worker builds there, the others reuse."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session", autouse=True)
def _export_cache(tmp_path_factory) -> Path:
    """Traces and bundles filed by their inputs' hash (tests/export_cache.py): across runs in
    $SSD_TEST_CACHE (~/.cache/ssd-tests), or with SSD_TEST_CACHE=off within this run only."""
    return export_cache.configure(export_cache.default_folder(),
                                  _shared(tmp_path_factory, "export-cache"))


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Hugging Face folders: target and draft variants of each class, built once per run."""
    import json

    root = _shared(tmp_path_factory, "models")
    index = root / "index.json"
    with FileLock(str(root) + ".lock"):
        if not index.exists():
            m = _build_models(root)
            index.write_text(json.dumps({k: str(v) for k, v in m.items()}))
    return {k: Path(v) for k, v in json.loads(index.read_text()).items()}


def _build_models(root: Path) -> dict[str, Path]:
    tok = tiny.build_tokenizer(root / "tokenizer")
    m = {
        "llama": tiny.build_model(root / "llama", "llama", tok, seed=1, layers=3),
        "llama_other": tiny.build_model(root / "llama_other", "llama", tok, seed=2, layers=1),
        "mistral": tiny.build_model(root / "mistral", "mistral", tok, seed=3, layers=2,
                                    sliding_window=16),
        "qwen2": tiny.build_model(root / "qwen2", "qwen2", tok, seed=4, layers=2),
    }
    for seed, kind in enumerate(("qwen3", "phi3", "gemma", "gemma2", "gpt2", "gpt_neox", "opt",
                                 "falcon"), start=5):
        m[kind] = tiny.build_model(root / kind, kind, tok, seed=seed)
    # Falcon's other variants: ALiBi (16 heads: slopes that bfloat16 rounds) and the new
    # decoder architecture (grouped KV heads, two norms per layer)
    # embeddings padded past the tokenizer (448 rows for 384 tokens), as Qwen2.5-7B's against
    # its 0.5B draft's: the target may emit a padded id, a padded draft may propose one
    m["llama_padded"] = tiny.build_model(root / "llama_padded", "llama", tok, seed=60,
                                         vocab_size=448)
    m["falcon_alibi"] = tiny.build_model(root / "falcon_alibi", "falcon", tok, seed=13,
                                         **tiny.FALCON_ALIBI)
    m["falcon_new"] = tiny.build_model(root / "falcon_new", "falcon", tok, seed=14,
                                       new_decoder_architecture=True, num_kv_heads=2)
    for seed, kind in enumerate(NEWER + MOE, start=15):
        m[kind] = tiny.build_model(root / kind, kind, tok, seed=seed)
    for seed, kind in enumerate(tiny.LEGACY, start=40):
        m[kind] = tiny.build_model(root / kind, kind, tok, seed=seed)
    for name in LEGACY_CUT:
        m[f"{name}_cut"] = tiny.truncate(m[name], root / f"{name}_cut", 1, tok)
    for seed, kind in enumerate(LATER_DENSE, start=100):
        m[kind] = tiny.build_model(root / kind, kind, tok, seed=seed)
    for name in ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gpt2",
                 "gpt_neox", "opt", "falcon", "falcon_alibi", *NEWER, *MOE, *LATER_DENSE_CUT):
        m[f"{name}_cut"] = tiny.truncate(m[name], root / f"{name}_cut", 1, tok)
    return m


@pytest.fixture(scope="session")
def bundle_factory(models, tmp_path_factory):
    """export(target, draft) -> bundle folder, cached per pair for the session and, by its
    inputs' hash, across sessions (export_cache.py); bundles that share a model share its
    trace."""
    from ssd_export import ExportConfig

    cache: dict[tuple, Path] = {}
    root = _shared(tmp_path_factory, "bundles")

    def export(target: str, draft: str, max_context: int | None = None,
               graph: str = "auto", draft_quant: str = "auto", quant: str = "none",
               quant_compute: str = "int8", trees: str = "auto") -> Path:
        """graph: "auto" is what ssd-export writes here (the ort flavour where it fits);
        "standard" for what TensorRT and CUDA bundles carry. draft_quant: the draft's weights
        (auto: int8 on an ort bundle if it agrees with the float draft, which random tiny
        drafts often do not, or the target's; "int8"/"int4" always). quant, quant_compute: the
        target's weights and what its quantized MatMuls compute in. trees: the target's tree
        input (auto: the ort and static flavours; "on": the standard one too)."""
        key = (target, draft, max_context or 0, graph, draft_quant, quant, quant_compute) \
            + ((trees,) if trees != "auto" else ())
        if key not in cache:
            out = root / "-".join(map(str, key))
            with FileLock(str(out) + ".lock"):  # another worker may be writing it
                if not (out / "manifest.json").exists():
                    export_cache.bundle(ExportConfig(
                        target=str(models[target]), draft=str(models[draft]), output=out,
                        max_context=max_context, quiet=True, graph=graph,
                        draft_quant=draft_quant, quant=quant, quant_compute=quant_compute,
                        trees=trees), out)
            cache[key] = out
        return cache[key]

    return export


@pytest.fixture(scope="session")
def small_vocab_bundle(tmp_path_factory) -> tuple[Path, Path]:
    """(bundle, target folder) for a 16-token pair whose distributions can be enumerated."""
    from ssd_export import ExportConfig

    root = _shared(tmp_path_factory, "small")
    out = root / "bundle"
    with FileLock(str(root) + ".lock"):
        if not (out / "manifest.json").exists():
            target, draft = tiny.build_small_vocab_pair(root)
            export_cache.bundle(ExportConfig(target=str(target), draft=str(draft), output=out,
                                             quiet=True), out)
    return out, root / "small_target"
