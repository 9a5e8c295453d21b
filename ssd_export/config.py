"""The frozen, typed options of one export; built by cli.py, read by pipeline.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ssd_runtime.engines import Precision

DType = Literal["float32", "float16"]
Engines = Literal["trt", "none", "auto"]       # auto: build when TensorRT and a GPU are here
Graph = Literal["auto", "standard", "ort"]     # auto: "ort" unless the bundle is for a GPU
Quant = Literal["auto", "none", "int8", "int4"]   # the draft's weights; auto: int8 on a CPU bundle
DEFAULT_MAX_CONTEXT = 2048


@dataclass(frozen=True)
class ExportConfig:
    target: str                     # local Hugging Face folder or hub id
    draft: str
    output: Path
    max_context: int | None = None  # None: 2048, or the models' limit if smaller
    max_draft: int = 8
    dtype: DType = "float32"
    force: bool = False
    quiet: bool = False
    engines: Engines = "auto"
    engine_precision: Precision = "fp16"
    graph: Graph = "auto"
    draft_quant: Quant = "auto"
