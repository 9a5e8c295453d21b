"""ssd-bench on a real (tiny) bundle: the report's figures hang together."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ssd_runtime.bench import main
from ssd_runtime.bench_run import split_against_sequential
from ssd_runtime.scheduler.cost import expected_tokens


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
            assert r["mean_k"] <= 2 and r["bound"] > 0 and r["bound_alpha"] == r["alpha"]
            # a chain's rounds: depths 1..2 at rank 0, no tree rounds; nodes a round = mean k
            assert r["nodes_per_round"] == r["mean_k"] and r["tree_rounds"] == 0
            assert len(r["acceptance_by_depth"]) <= 2 and len(r["acceptance_by_rank"]) == 1
            assert f"{r['config']}: nodes/round {r['nodes_per_round']:.1f}" in table
        if k == "auto":         # the best fixed k's bound, at the α of the k=2 row beside it
            cal, alpha = report["calibration"][threads], rows[(2, mode, threads)]["alpha"]
            assert r["bound_alpha"] == alpha
            assert r["bound"] == pytest.approx(max(
                [1.0] + [expected_tokens(alpha, j) / (cal["c_first"] + (j - 1) * cal["c"] + v)
                         for j, v in enumerate(cal["v"]) if j]))
    for cal in report["calibration"].values():
        assert cal["c"] > 0 and cal["c_first"] > 0 and cal["v"][0] == pytest.approx(1.0)
        low, high = cal["target_step_ms_range"]       # one calibration per prompt and repeat
        assert cal["calibrations"] == 2 and low <= cal["target_step_ms"] <= high
    # split beside sequential at every k and placement, with its reasons, in the table too
    versus = {(v["k"], v["threads"]): v for v in report["split_vs_sequential"]}
    assert set(versus) == {(k, t) for k in (2, "auto") for t in ("1:1", "2:1")}
    for (k, threads), v in versus.items():
        split, seq = rows[(k, "split", threads)], rows[(k, "sequential", threads)]
        assert v["ratio"] == pytest.approx(split["tokens_per_s"] / seq["tokens_per_s"])
        assert v["hidden_ms"] == pytest.approx(seq["per_round_ms"]["draft"]
                                               - split["per_round_ms"]["draft"])
        assert f"k={k} threads={threads}: {v['ratio']:.2f}x, {v['verdict']}: hides" in table


def test_split_verdict_names_the_cause():
    """A split run whose verification slowed beside the draft's thread on too few cores."""
    def row(mode, tps, draft, verify, host, hits=0.0):
        return {"k": 8, "mode": mode, "threads": "2:1", "tokens_per_s": tps,
                "split_hit_rate": hits,
                "per_round_ms": {"draft": draft, "verify": verify, "host": host}}

    rows = [row("sequential", 2400.0, 0.45, 1.50, 0.05),
            row("split", 2040.0, 0.10, 1.95, 0.06, hits=0.6)]
    (v,) = split_against_sequential(rows, cores=2)
    assert v["verdict"] == "loses" and v["ratio"] == pytest.approx(0.85)
    assert v["hidden_ms"] == pytest.approx(0.35) and v["verify_slower_ms"] == pytest.approx(0.45)
    assert v["draft_share"] == pytest.approx(0.45 / 2.0)
    assert "+30%" in v["why"] and "2+1 threads on 2 cores" in v["why"]
    assert "waits" not in v["why"]
    (v,) = split_against_sequential(rows, cores=4)    # room for all three threads: no such cause
    assert "cores" not in v["why"]


def test_bench_bad_arguments(bundle_factory, capsys, tmp_path):
    bundle = str(bundle_factory("llama", "llama_cut"))
    assert main([bundle, "--k", "0,two"]) == 2
    assert main([bundle, "--mode", "parallel"]) == 2
    assert main([bundle, "--threads", "2:0"]) == 2
    err = capsys.readouterr().err
    assert "--k" in err and "parallel" in err and "TARGET:DRAFT" in err
    # refused before the run (minutes), each with one line naming the flag
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for args, fragment in ((["--repeats", "0"], "--repeats 0"),
                           (["--max-new-tokens", "0"], "--max-new-tokens 0"),
                           (["--prompts", str(tmp_path / "none.jsonl")], "none.jsonl: cannot read"),
                           (["--json", str(blocker / "out.json")], "cannot be written there"),
                           (["--json", "/proc/out.json"], "cannot be written there"),
                           (["--json", f"{tmp_path}/new-folder/"], "is a folder"),
                           (["--plot", str(tmp_path)], "is a folder"),
                           (["--plot", str(tmp_path / "plot.xyz")], "ending in an image format"),
                           (["--plot", str(tmp_path / "plot")], "ending in an image format"),
                           (["--prompts", str(_prompts(tmp_path, '{"prompt": 5}'))],
                            'a "prompt" string per line'),
                           (["--prompts", str(_prompts(tmp_path, 'null'))],
                            'a "prompt" string per line'),
                           (["--mode", "split"], "nothing to measure")):
        assert main([bundle, "--k", "0", *args]) == 2, args
        err = capsys.readouterr().err
        assert fragment in err and "Traceback" not in err and err.count("\n") == 1, err
    out = tmp_path / "new" / "bench.json"                 # a new folder is made, as mkdir -p
    assert main([bundle, "--k", "0", "--max-new-tokens", "2", "--repeats", "1",
                 "--prompts", str(_one_prompt(tmp_path)), "--json", str(out)]) == 0
    assert json.loads(out.read_text())["results"] and not Path(f"{out}.tmp").exists()


def _prompts(tmp_path, line: str) -> Path:
    path = tmp_path / f"prompts-{abs(hash(line))}.jsonl"
    path.write_text('{"prompt": "def f(x):"}\n' + line + "\n")
    return path


def _one_prompt(tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text('{"prompt": "def f(x):"}\n')
    return path
