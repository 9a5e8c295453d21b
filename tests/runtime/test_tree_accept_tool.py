"""tools/tree_accept.py (trees against chains, accepted tokens per round) runs on a tiny tree
bundle: its shapes' figures, 0 partings from k = 0, a planner's choice. Run as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "tree_accept.py"


def test_short_run_on_a_tiny_tree_bundle(bundle_factory, tmp_path):
    bundle = bundle_factory("llama", "llama_cut")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os\\n"}\n')
    out = tmp_path / "trees.json"
    res = subprocess.run(
        [sys.executable, str(TOOL), str(bundle), "--prompts", str(prompts),
         "--max-new-tokens", "8", "--threads", "1", "--shapes", "4x1x3x1,6x2x3x2,6x2x3x2L",
         "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["shape"] for r in data["shapes"]] == ["4x1x3x1", "6x2x3x2", "6x2x3x2L"]
    for r in data["shapes"]:
        assert r["partings"] == 0 and r["rounds"] > 0 and 1 <= r["tokens_per_round"] <= 4
        assert r["nodes_per_round"] <= int(r["shape"].rstrip("L").split("x")[0]) - 1
    assert data["v"]["1"] == 1.0 and data["plan"]["nodes"] >= 1
    assert "best tree / best chain" in res.stdout


def test_sampling_run(bundle_factory, tmp_path):
    bundle = bundle_factory("llama", "llama_cut")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    out = tmp_path / "trees.json"
    res = subprocess.run(
        [sys.executable, str(TOOL), str(bundle), "--prompts", str(prompts),
         "--max-new-tokens", "8", "--threads", "1", "--shapes", "4x1x3x1,7x3x2x2",
         "--temperature", "1", "--sampled", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["temperature"] == 1 and data["sampled"]
    assert all(r["rounds"] > 0 and r["partings"] == 0 for r in data["shapes"])


def test_head_tree_bench_runs_a_batch_of_trees(bundle_factory, tmp_path):
    """tools/head_tree_bench.py --batch: the prompts as a batch in every mode (a fixed shape's
    rows grow their trees along their chains; auto plans the batch's), 0 partings."""
    bundle = bundle_factory("llama", "llama_cut")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os\\n"}\n'
                       '{"prompt": "class A:"}\n')
    out = tmp_path / "batch.json"
    res = subprocess.run(
        [sys.executable, str(TOOL.parent / "head_tree_bench.py"), str(bundle), "--prompts",
         str(prompts), "--max-new-tokens", "8", "--threads", "1", "--batch", "3",
         "--modes", "k0,c2,t5x2x2x1@2,auto", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["batch"] == 3 and set(data["modes"]) == {"k0", "c2", "t5x2x2x1@2", "auto"}
    for mode in data["modes"].values():
        assert mode["partings"] == 0 and mode["rounds"] > 0
    assert data["modes"]["t5x2x2x1@2"]["tree_rounds"] > 0
