"""ssd_export: the build pipeline behind `ssd-export` (needs the `export` extra)."""
from __future__ import annotations

from .config import ExportConfig

__all__ = ["ExportConfig", "export_bundle"]


def __getattr__(name: str):
    if name == "export_bundle":
        from .pipeline import export_bundle

        return export_bundle
    raise AttributeError(f"module 'ssd_export' has no attribute {name!r}")
