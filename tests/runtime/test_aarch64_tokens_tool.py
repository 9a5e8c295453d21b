"""tools/aarch64_tokens.py's compare, without emulation: a real run on a tiny bundle against
itself (every stream equal, exit 0) and against a copy whose one stream parts with no row
from the other machine to explain it (exit 1). The tool is a script, run as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "aarch64_tokens.py"


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          timeout=120)


def test_compare_counts_equal_and_parted_streams(bundle_factory, tmp_path):
    bundle = bundle_factory("llama", "llama_cut")
    ref = tmp_path / "ref.json"
    res = _tool("run", str(bundle), "--out", str(ref), "--tokens", "6")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]

    same = _tool("compare", str(ref), str(ref))
    assert same.returncode == 0, same.stdout[-2000:] + same.stderr[-2000:]
    assert "24 of 24 streams equal; 0 explained, 0 unexplained" in same.stdout
    assert "rows bit-equal 6/6" in same.stdout

    data = json.loads(ref.read_text())
    case = next(c for c in data["cases"] if c["name"] == "batch greedy k=4")
    case["ids"][1][3] += 1                   # stream 1 of the batch parts at its token 3
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    parted = _tool("compare", str(ref), str(other))
    assert parted.returncode == 1, parted.stdout[-2000:] + parted.stderr[-2000:]
    assert "batch greedy k=4              1  parts at token 3 of 6" in parted.stdout
    assert "23 of 24 streams equal; 0 explained, 1 unexplained" in parted.stdout
    assert "distinct greedy streams (prompt, seed): 3, parted 1" in parted.stdout
