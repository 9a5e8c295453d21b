"""The packages' boundaries: no module imports another's private names, and the exporter reads
what it shares with the runtime from the runtime's public modules, not a backend's insides."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime", "graphs", "ssd_export", "ssd_distill")


def imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every `from module import name` in the packages."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom):
                    found += [(str(path.relative_to(ROOT)), "." * node.level + (node.module or ""),
                               alias.name) for alias in node.names]
    return found


def test_no_module_imports_another_modules_private_names():
    private = [f"{file}: from {module} import {name}" for file, module, name in imports()
               if name.startswith("_") and not (name.startswith("__") and name.endswith("__"))]
    assert not private, "shared names are public (no leading underscore):\n" + "\n".join(private)


def test_the_exporter_uses_no_backends_insides():
    inside = [f"{file}: from {module} import {name}" for file, module, name in imports()
              if file.startswith("ssd_export") and module.startswith("ssd_runtime.backends.ort")]
    assert not inside, "\n".join(inside)
