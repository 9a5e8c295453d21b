"""Fixtures of the distiller's tests: the bundle whose runtime writes a target's answers."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
import export_cache  # noqa: E402


@pytest.fixture(scope="session")
def answers_bundle(tmp_path_factory):
    """export(target folder, quant) -> the bundle ssd-distill --kind head exports to write its
    answers (answers.answer_bundle's ExportConfig), from the tests' export cache."""
    from ssd_distill.answers import answer_export

    made: dict[tuple[str, str], Path] = {}

    def export(target: Path, quant: str = "none") -> Path:
        if (str(target), quant) not in made:
            out = tmp_path_factory.mktemp("answers-bundle") / "b"
            export_cache.bundle(answer_export(str(target), out, quant, 256, 16, cuda=False),
                                out)
            made[str(target), quant] = out
        return made[str(target), quant]

    return export
