"""tools/node_profile.py: nodes per layer and per step of each graph of a bundle, as exported and
as ONNX Runtime runs them, and its profiler's time per operator (issue 59). The upper bounds
below are today's counts on the tiny llama: a change that adds nodes to a layer fails here
(docs/design.md §12 says what each node of the static layer is)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "node_profile.py"

# ONNX Runtime's optimized graph of the tiny llama (3 layers), one-token step
STATIC_LAYER = 23          # the static flavour's fused layer (the exact one; 30 before it)
ORT_LAYER = 14             # the ort target's: one GroupQueryAttention reading two rows at
                           # least (a Concat and a Slice around it, graphs/two_rows.py)
FUSED = {"Attention": 1, "RotaryEmbedding": 1, "com.microsoft.SkipSimplifiedLayerNormalization": 2}


def run(tmp_path: Path, *args: str) -> list[dict]:
    out = tmp_path / "nodes.json"
    res = subprocess.run([sys.executable, str(TOOL), *args, "--json", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(out.read_text())


def test_the_static_layer_keeps_its_nodes_and_the_profile_counts_them(bundle_factory, tmp_path):
    bundle = bundle_factory("llama", "llama_cut", graph="static", quant="int4")
    (target,) = run(tmp_path, str(bundle), "--models", "target", "--steps", "3", "--past", "20")
    assert (target["graph"], target["quant"], target["layers"]) == ("static", "int4", 3)
    opt = target["optimized"]
    assert opt["layer"] <= STATIC_LAYER, opt["layer_ops"]
    assert opt["step"] == 3 * opt["layer"] + opt["outside"]
    assert opt["layer_ops"]["com.microsoft.MatMulNBits"] == 4      # qkv, o, gate|up, down
    for op, n in FUSED.items():
        assert opt["layer_ops"][op] == n, opt["layer_ops"]
    assert target["exported"]["step"] > opt["step"]
    profile = target["profile"]
    assert profile["steps"] == 3 and profile["nodes_run"] == opt["step"]
    assert profile["ops"]["MatMulNBits"]["count"] == opt["ops"]["com.microsoft.MatMulNBits"]


def test_every_graph_of_an_ort_bundle_is_counted(bundle_factory, tmp_path):
    """The ort target, its rows graph (the static layer over its weights) and the draft."""
    bundle = bundle_factory("llama", "llama_cut")
    rows = {r["model"]: r for r in run(tmp_path, str(bundle))}
    assert set(rows) == {"target", "rows", "draft"}
    target = rows["target"]["optimized"]
    assert target["layer"] <= ORT_LAYER
    assert target["layer_ops"]["com.microsoft.GroupQueryAttention"] == 1
    assert rows["rows"]["optimized"]["layer"] <= STATIC_LAYER     # the static layer's
    assert rows["rows"]["optimized"]["layer_ops"]["Attention"] == 1
    assert rows["draft"]["layers"] == 1 and rows["draft"]["optimized"]["layer"] is None


def test_a_folder_that_is_not_a_bundle_is_refused(tmp_path):
    res = subprocess.run([sys.executable, str(TOOL), str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and "not a bundle" in res.stderr
