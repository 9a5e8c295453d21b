"""The tests' export cache (export_cache.py) misses on any changed input: each input of a
trace and of a bundle changes its key, the code it hashes covers every module the exporter
imports, and a hit gives back the files and TracedModel the export wrote."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import export_cache
import tiny
from test_imports import import_graph


@pytest.fixture
def model():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(tiny.config_for("llama", tiny.VOCAB, layers=1)).eval()


def test_each_input_of_a_trace_changes_its_key(model, monkeypatch):
    base = export_cache.trace_key(model, 64, "ort")
    assert export_cache.trace_key(model, 64, "ort") == base         # stable
    assert export_cache.trace_key(model, 65, "ort") != base         # an option
    assert export_cache.trace_key(model, 64, "standard") != base
    assert export_cache.trace_key(model, 64, "ort", (0, 1, 2)) != base  # a head's features
    with torch.no_grad():                                            # one weight's one element
        model.model.layers[0].mlp.up_proj.weight[3, 5] += 1e-6
    changed = export_cache.trace_key(model, 64, "ort")
    assert changed != base
    model.config.rms_norm_eps = 1e-3                                 # the config
    assert export_cache.trace_key(model, 64, "ort") not in (base, changed)
    changed = export_cache.trace_key(model, 64, "ort")
    model.to(torch.float16)                                          # the dtype
    assert export_cache.trace_key(model, 64, "ort") != changed
    changed = export_cache.trace_key(model, 64, "ort")
    real = export_cache.importlib.metadata.version
    for package in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime"):
        monkeypatch.setattr(export_cache.importlib.metadata, "version",
                            lambda name, p=package: "0.0-other" if name == p else real(name))
        assert export_cache.trace_key(model, 64, "ort") != changed, package
    monkeypatch.undo()
    assert export_cache.trace_key(model, 64, "ort") == changed


def test_a_change_to_any_source_file_changes_the_key(tmp_path, monkeypatch):
    """Any file of a hashed package, data included, and the __init__ a module sits in."""
    package = tmp_path / "fake_pkg"
    (package / "sub").mkdir(parents=True)
    for name in ("__init__.py", "sub/__init__.py", "sub/mod.py", "sub/table.json"):
        (package / name).write_text("# one\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    keys = []
    for edit in (None, "sub/mod.py", "sub/table.json", "sub/__init__.py", "__init__.py"):
        if edit:
            (package / edit).write_text("# two\n")
        keys.append((export_cache._digest(export_cache.sources(["fake_pkg"])),
                     export_cache._digest(export_cache.sources(["fake_pkg.sub.mod"]))))
    whole, module = zip(*keys)
    assert len(set(whole)) == 5                     # each edit changes the package's digest
    assert len(set(module)) == 4                    # ...and the module's, but for table.json
    assert module[1] != module[0] and module[2] == module[1]


def test_the_hashed_code_covers_what_the_exporter_imports():
    """Every project module graphs/trace.py or ssd_export/pipeline.py reaches (imports of
    imports, lazy ones too) is inside what the trace or bundle key hashes. ssd_runtime's
    __init__ (hashed) imports only errors when it runs; the rest of the runtime it reaches
    only when `ssd_runtime.Generator` is asked for, which no trace does."""
    graph = import_graph()
    lazy = {"ssd_runtime": {"ssd_runtime.errors"}}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(lazy.get(name, graph.get(name, ())))
        return seen

    def covered(name: str, hashed) -> bool:
        parents = {h.rsplit(".", n)[0] for h in hashed for n in range(h.count(".") + 1)}
        return any(name == h or name.startswith(h + ".") for h in hashed) or name in parents

    for start, hashed in (("ssd_graphs.trace", export_cache.TRACE_SOURCES),
                          ("ssd_export.pipeline", export_cache.BUNDLE_SOURCES)):
        missing = sorted(n for n in reach(start) if not covered(n, hashed))
        assert not missing, f"{start} imports {missing}, which its cache key does not hash"


def test_each_input_of_a_bundle_changes_its_key(tmp_path, monkeypatch):
    from ssd_export import ExportConfig

    tok = tiny.build_tokenizer(tmp_path / "tokenizer")
    target = tiny.build_model(tmp_path / "target", "llama", tok, seed=1, layers=1)
    draft = tiny.build_model(tmp_path / "draft", "llama", tok, seed=2, layers=1)
    config = ExportConfig(target=str(target), draft=str(draft), output=tmp_path / "out")
    base = export_cache.bundle_key(config)
    # the fixtures' models, built again by the next run, give the same key: a warm run hits
    again = tiny.build_model(tmp_path / "again" / "target", "llama",
                             tiny.build_tokenizer(tmp_path / "again" / "tokenizer"), seed=1,
                             layers=1)
    assert export_cache.folder_digest(again) == export_cache.folder_digest(target)
    # where and how loudly it is written are not inputs: the same bundle hits anywhere
    assert export_cache.bundle_key(dataclasses.replace(
        config, output=tmp_path / "elsewhere", quiet=True, force=True)) == base
    keys = {base}
    for field, value in (("max_context", 48), ("max_draft", 4), ("max_batch", 2),
                         ("dtype", "float16"), ("engines", "none"), ("graph", "standard"),
                         ("draft_quant", "int8"), ("quant", "int4"), ("quant_block", 64),
                         ("quant_method", "hqq"), ("quant_lm_head", False),
                         ("quant_compute", "float"), ("engine_precision", "fp32")):
        key = export_cache.bundle_key(dataclasses.replace(config, **{field: value}))
        assert key not in keys, field               # every option gives a key of its own
        keys.add(key)
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"text": "one"}\n')
    with_calib = export_cache.bundle_key(dataclasses.replace(config, calib=str(calib)))
    calib.write_text('{"text": "two"}\n')
    assert export_cache.bundle_key(dataclasses.replace(config, calib=str(calib))) != with_calib
    for folder, name in ((target, "config.json"), (draft, "model.safetensors"),
                         (target, "tokenizer.json"), (draft, "generation_config.json")):
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data + b" ")
        assert export_cache.bundle_key(config) != base, (folder.name, name)
        (folder / name).write_bytes(data)
        assert export_cache.bundle_key(config) == base
    monkeypatch.setattr("onnxruntime.__version__", "1.19.2")   # as the export sees it
    assert export_cache.bundle_key(config) != base


def test_a_hit_gives_back_the_export_and_a_change_misses(model, tmp_path):
    """Against a stand-in export: the second call copies the files and the TracedModel; a
    changed weight exports again; an export that raises is not filed."""
    from ssd_graphs.trace import TracedModel

    calls = []

    def export(model, source, path, max_context, graph, aux_layers=()):
        calls.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"graph %d" % len(calls))
        path.with_name(path.name + ".data").write_bytes(b"weights")
        return TracedModel(path=path, num_layers=1, num_kv_heads=2, head_dim=16,
                           vocab_size=384, kv_dtype="float32", parameters=7, graph=graph,
                           moe_note="note")

    saved = export_cache._root
    export_cache.configure(None, tmp_path / "cache")
    try:
        first = export_cache.traced(export, model, "a", tmp_path / "a" / "model.onnx", 64, "ort")
        second = export_cache.traced(export, model, "b", tmp_path / "b" / "m.onnx", 64, "ort")
        assert len(calls) == 1
        assert second == dataclasses.replace(first, path=tmp_path / "b" / "m.onnx")
        assert (tmp_path / "b" / "m.onnx").read_bytes() == b"graph 1"
        assert (tmp_path / "b" / "m.onnx.data").read_bytes() == b"weights"
        with torch.no_grad():
            model.lm_head.weight[0, 0] += 1.0
        export_cache.traced(export, model, "c", tmp_path / "c" / "model.onnx", 64, "ort")
        assert len(calls) == 2

        def refuse(*args):
            raise ValueError("refused")

        with pytest.raises(ValueError):
            export_cache.traced(refuse, model, "d", tmp_path / "d" / "model.onnx", 65, "ort")
        export_cache.traced(export, model, "d", tmp_path / "d" / "model.onnx", 65, "ort")
        assert len(calls) == 3                      # the refusal left no entry
    finally:
        export_cache._root = saved


def test_a_test_s_own_export_decoder_is_not_cached(monkeypatch):
    from ssd_export import pipeline
    from ssd_graphs import trace

    with export_cache.tracing_cached():
        assert pipeline.export_decoder is not trace.export_decoder      # through the cache
    assert pipeline.export_decoder is trace.export_decoder

    def own(*args):
        raise AssertionError("not called here")

    monkeypatch.setattr(pipeline, "export_decoder", own)
    with export_cache.tracing_cached():
        assert pipeline.export_decoder is own
