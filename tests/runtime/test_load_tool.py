"""tools/load.py (the ssd-serve load tool) runs: its --help, and one short run against a tiny
bundle's server. The tool is a script, never imported: it is run as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "load.py"


def test_help():
    res = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "--concurrency" in res.stdout and "roofline" in res.stdout


def test_short_run_against_a_tiny_bundle(bundle_factory, tmp_path):
    pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra")
    pytest.importorskip("openai", reason="the load tool's clients use the openai package")
    bundle = bundle_factory("llama", "llama_cut")
    out = tmp_path / "load.json"
    res = subprocess.run(
        [sys.executable, str(TOOL), str(bundle), "--config", "k2:--k 2 --threads 1",
         "--concurrency", "1,2", "--max-tokens", "8", "--requests-per-client", "1",
         "--warmup", "1", "--skip-probe", "--json", str(out), "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in data["levels"]] == [1, 2]
    for lv in data["levels"]:
        s, w = lv["summary"], lv["work"]
        assert s["errors"] == 0 and s["requests"] == lv["concurrency"]
        assert s["output_tokens"] == 8 * lv["concurrency"]        # ignore_eos: all asked for
        assert s["ttft_p50"] > 0 and s["tokens_per_s"] > 0
        assert w["generated"] == s["output_tokens"]               # the server's own count
        assert w["target_tokens"] > w["prompt_tokens"] and w["flops"] > 0
        assert w["basis"].startswith("/metrics")
    assert data["servers"][0]["health"]["k"] == 2
