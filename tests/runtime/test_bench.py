"""ssd-bench on a real (tiny) bundle: the report's figures hang together."""
from __future__ import annotations

import json

import pytest

from ssd_runtime.bench import main


def test_bench_report(bundle_factory, tmp_path, capsys):
    bundle = bundle_factory("llama", "llama_cut")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os\\n"}\n')
    out = tmp_path / "bench.json"
    assert main([str(bundle), "--prompts", str(prompts), "--max-new-tokens", "12",
                 "--k", "0,2,auto", "--mode", "sequential,split", "--threads", "1:1,2:1",
                 "--repeats", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "bound = (1-a^(k+1))/((1-a)(c1 + (k-1) c + v(k)))" in table
    report = json.loads(out.read_text())
    rows = {(r["k"], r["mode"], r["threads"]): r for r in report["results"]}
    # k=0 runs sequential only; every k and mode at every placement
    assert len(rows) == 2 * (3 + 2) and (0, "split", "1:1") not in rows
    base = report["baseline_tokens_per_s"]
    assert base == max(rows[(0, "sequential", t)]["tokens_per_s"] for t in ("1:1", "2:1"))
    for (k, mode, threads), r in rows.items():
        assert r["tokens_per_s"] > 0 and r["speedup"] == pytest.approx(r["tokens_per_s"] / base)
        own = rows[(0, "sequential", threads)]["tokens_per_s"]
        assert r["efficiency"] == pytest.approx(r["tokens_per_s"] / own / r["bound"])
        assert 0 <= r["host_share"] < 1
        if k == 2:
            assert r["mean_k"] <= 2 and r["bound"] > 0
    for cal in report["calibration"].values():
        assert cal["c"] > 0 and cal["c_first"] > 0 and cal["v"][0] == pytest.approx(1.0)


def test_bench_bad_arguments(bundle_factory, capsys):
    bundle = str(bundle_factory("llama", "llama_cut"))
    assert main([bundle, "--k", "0,two"]) == 2
    assert main([bundle, "--mode", "parallel"]) == 2
    assert main([bundle, "--threads", "2:0"]) == 2
    err = capsys.readouterr().err
    assert "--k" in err and "parallel" in err and "TARGET:DRAFT" in err
