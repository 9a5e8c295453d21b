"""ssd_graphs: what gets traced to ONNX (the decoder wrapper and its adapters)."""
from __future__ import annotations

from .registry import REGISTRY, adapter_for, supported_architectures

__all__ = ["REGISTRY", "adapter_for", "supported_architectures"]
