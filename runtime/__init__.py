"""ssd_runtime: load an SSD bundle and run speculative decoding, without PyTorch.

`Generator` is imported lazily so that `ssd_runtime.contract` and
`ssd_runtime.manifest` stay cheap to import for the exporter.
"""
from __future__ import annotations

from .errors import BackendError, BundleError, ConfigError, ParityError, SsdError

__all__ = ["Generator", "GenerationResult", "SsdError", "ConfigError", "BundleError",
           "ParityError", "BackendError"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "Generator":
        from .generator import Generator

        return Generator
    if name == "GenerationResult":
        from .request import GenerationResult

        return GenerationResult
    raise AttributeError(f"module 'ssd_runtime' has no attribute {name!r}")
