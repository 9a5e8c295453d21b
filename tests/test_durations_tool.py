"""tools/test_durations.py: a JUnit XML of pytest's becomes the per-file markdown table of
CONTRIBUTING (sums, counts, shares, sorted, the total and the fixtures' note). The tool is a
script, run as a subprocess."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "test_durations.py"

# as pytest-xdist writes it (xunit2: no file attribute; classname from the module path)
XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests"><testsuite name="pytest" errors="0" failures="0" skipped="1"
 tests="4" time="12.5" timestamp="2026-12-04T10:00:00" hostname="h">
<testcase classname="tests.runtime.test_batch" name="test_a" time="6.0" />
<testcase classname="tests.runtime.test_batch" name="test_b[x]" time="1.5" />
<testcase classname="tests.test_layout" name="test_c" time="2.5" />
<testcase classname="tests.runtime.test_gpu.TestCuda" name="test_d" time="0.0">
<skipped type="pytest.skip" message="needs a GPU" /></testcase>
</testsuite></testsuites>
"""


def test_the_table_sums_each_file_and_sorts_by_time(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(XML)
    res = subprocess.run([sys.executable, str(TOOL), str(xml), "--root", str(ROOT),
                          "--tests", "2"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    rows = [line for line in lines if line.startswith("| `tests/")]
    assert rows[:3] == ["| `tests/runtime/test_batch.py` | 2 | 7.5 | 75.0% |",
                        "| `tests/test_layout.py` | 1 | 2.5 | 25.0% |",
                        "| `tests/runtime/test_gpu.py` | 1 (1 skipped) | 0.0 | 0.0% |"]
    assert "| **total** | 4 | 10.0 | 100% |" in lines
    assert "Wall time of the run: 12.5 s" in res.stdout
    assert "lands in the first test that uses it" in res.stdout
    assert "| 6.0 | `tests/runtime/test_batch.py::test_a` |" in lines


def test_a_missing_file_says_how_to_make_one(tmp_path):
    res = subprocess.run([sys.executable, str(TOOL), str(tmp_path / "none.xml")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "---> HINT: run `make test-fast`" in res.stderr
