"""The GPU check's tools without a GPU: gpu_carry.py's calls for a selection of gpu_check.sh's
steps (the default calls unchanged), gpu_check.sh's refusal of an unknown step, and
random_model.py's EAGLE-3 head, which the head loader reads back. The tools are scripts,
loaded from their files."""
from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _calls(text: str) -> list[tuple[str, str]]:
    """(carry line, command) per printed call."""
    lines = text.splitlines()
    return [(lines[i + 1], lines[i + 3]) for i, line in enumerate(lines)
            if line.startswith("# call ")]


def test_carry_calls_for_a_selection_of_steps(tmp_path, capsys):
    carry = _tool("gpu_carry")
    out = tmp_path / ".whl"
    out.mkdir()
    slices = [{"name": f"ortgpu.tar.xz.0{i}"} for i in range(3)]

    assert carry._print_calls(tmp_path, out, slices) == 0
    calls = _calls(capsys.readouterr().out)
    assert len(calls) == 3 and "STEPS" not in "".join(c for _, c in calls)
    assert calls[0][1].endswith(carry.PREPARE) and calls[2][1].endswith(carry.FINAL)
    assert "llguidance" not in "".join(c for c, _ in calls)

    # g needs llguidance carried: refused until `extra` has packed it
    assert carry._print_calls(tmp_path, out, slices, "g  h") == 1
    (out / "llguidance.tar.xz").write_bytes(b"")
    assert carry._print_calls(tmp_path, out, slices, "g  h") == 0
    calls = _calls(capsys.readouterr().out)
    assert "STEPS='g h' STAGE=prepare" in calls[0][1]
    assert '".whl/llguidance.tar.xz"' in calls[2][0]
    last = calls[2][1]
    assert "install --extra .whl/llguidance.tar.xz" in last
    assert "STEPS='g h' INSTALL=0" in last and "BUDGET=480" in last
    assert all(len(c) <= 2000 for _, c in calls)

    assert carry._print_calls(tmp_path, out, slices, "h", 200) == 0
    calls = _calls(capsys.readouterr().out)
    assert "llguidance" not in calls[2][0] + calls[2][1] and "BUDGET=200" in calls[2][1]


def test_gpu_check_refuses_an_unknown_step(tmp_path):
    res = subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), str(tmp_path / "r.txt")],
                         env=dict(os.environ, STEPS="g x", WORK=str(tmp_path)),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "unknown step 'x'" in res.stderr and not (tmp_path / "r.txt").exists()


def test_random_eagle3_head_loads_for_its_target(tmp_path):
    pytest.importorskip("torch")
    from ssd_graphs.eagle3 import load_head

    random_model = _tool("random_model")
    assert random_model.main(["--config", "tiny-llama", "--layers", "8", "--head",
                              "--output", str(tmp_path / "head")]) == 0
    with pytest.raises(SystemExit, match="fewer than 6"):
        random_model.main(["--config", "tiny-llama", "--head", "--output",
                           str(tmp_path / "shallow")])
    config, head, _ = load_head(tmp_path / "head", num_target_layers=8)
    assert config.aux_layer_ids == (2, 4, 5)
    assert (config.hidden_size, config.target_hidden_size, config.draft_vocab_size) == (64, 64,
                                                                                      32000)
    assert not head.own_embedding and bool(head.t2d[:32000].all()) and not head.t2d[32000:].any()
