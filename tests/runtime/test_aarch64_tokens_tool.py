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
    # 24 streams, and 3 under a JSON schema (llguidance is installed here)
    assert "27 of 27 streams equal; 0 explained, 0 unexplained" in same.stdout
    assert "rows bit-equal 6/6" in same.stdout

    data = json.loads(ref.read_text())
    case = next(c for c in data["cases"] if c["name"] == "batch greedy k=4")
    case["ids"][1][3] += 1                   # stream 1 of the batch parts at its token 3
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    parted = _tool("compare", str(ref), str(other))
    assert parted.returncode == 1, parted.stdout[-2000:] + parted.stderr[-2000:]
    assert "batch greedy k=4              1  parts at token 3 of 6" in parted.stdout
    assert "26 of 27 streams equal; 0 explained, 1 unexplained" in parted.stdout
    assert "distinct greedy streams (prompt, seed, schema): 4, parted 1" in parted.stdout


def test_compare_counts_a_machine_without_llguidance_as_unexplained(bundle_factory, tmp_path):
    """The constrained cases run only where llguidance is installed: a run that lacks them
    (an aarch64 install without its wheel) fails the comparison, naming them."""
    ref = tmp_path / "ref.json"
    res = _tool("run", str(bundle_factory("llama", "llama_cut")), "--out", str(ref),
                "--tokens", "6")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    data = json.loads(ref.read_text())
    assert "llguidance" in data["versions"]
    assert [c["name"] for c in data["cases"] if "response_format" in c["streams"][0]] == \
        ["json p0 k=0", "json p0 k=4", "json p0 k=auto"]
    data["cases"] = [c for c in data["cases"] if not c["name"].startswith("json")]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    res = _tool("compare", str(ref), str(other))
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    assert "json p0 k=auto              all  not run on the other machine" in res.stdout
    assert "24 of 27 streams equal; 0 explained, 3 unexplained" in res.stdout
