"""The docs' result files: every measured run kept in the repository lives in docs/results/
and is cited by a page (docs/*.md, README.md, CONTRIBUTING.md, tools/README.md), and every
result file a page cites exists there (issue 55)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "CONTRIBUTING.md",
         ROOT / "tools" / "README.md"]


def _text() -> str:
    return "\n".join(page.read_text() for page in PAGES)


def test_no_result_file_lies_beside_the_pages():
    loose = [p.name for p in (ROOT / "docs").iterdir()
             if p.is_file() and p.suffix in (".json", ".png", ".txt")]
    assert not loose, f"result files belong in docs/results/: {loose}"


def test_every_result_file_is_cited_by_a_page():
    text = _text()
    uncited = [p.name for p in sorted(RESULTS.iterdir()) if f"results/{p.name}" not in text]
    assert not uncited, f"cite these where their figures are given, or remove them: {uncited}"


def test_every_cited_result_file_exists():
    cited = set(re.findall(r"results/([A-Za-z0-9_.-]+\.(?:json|png|txt))", _text()))
    missing = sorted(name for name in cited if not (RESULTS / name).exists())
    assert not missing, f"pages cite result files that docs/results/ lacks: {missing}"
