"""The frozen, typed options of one export; built by cli.py, read by pipeline.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ssd_runtime.engines import Precision
from ssd_runtime.errors import ConfigError

DType = Literal["float32", "float16"]
Engines = Literal["trt", "none", "auto"]       # auto: build when TensorRT and a GPU are here
Graph = Literal["auto", "standard", "ort", "static"]   # auto: "ort" unless the bundle is for a GPU
Quant = Literal["auto", "none", "int8", "int4"]   # the draft's weights; auto: int8 on a CPU bundle
                                                  # or the target's kind when it is quantized
TargetQuant = Literal["none", "int8", "int4", "auto"]   # auto: int4, else int8, by agreement
QuantMethod = Literal["rtn", "hqq"]
QuantCompute = Literal["int8", "float"]     # the quantized MatMuls' activations (§12)
Trees = Literal["auto", "on", "off"]       # the target's tree input (design §2, "Trees")
QUANT_BLOCKS = (32, 64, 128)
DEFAULT_MAX_CONTEXT = 2048


@dataclass(frozen=True)
class ExportConfig:
    target: str                     # local Hugging Face folder or hub id
    draft: str
    output: Path
    max_context: int | None = None  # None: 2048, or the models' limit if smaller
    max_draft: int = 8
    max_batch: int = 16             # sequences per call the graphs are checked and recorded for
    dtype: DType = "float32"
    force: bool = False
    quiet: bool = False
    engines: Engines = "auto"
    engine_precision: Precision = "fp16"
    graph: Graph = "auto"
    draft_quant: Quant = "auto"
    quant: TargetQuant = "none"     # the target's weights (docs/design.md §12)
    quant_block: int = 32
    quant_method: QuantMethod = "rtn"
    quant_lm_head: bool = True
    quant_compute: QuantCompute = "int8"
    trees: Trees = "auto"           # auto: the ort and static flavours (and the rows graph;
                                    # the runtime verifies trees on ort targets only)
    calib: str | None = None        # JSONL of {"text": ...}: held-out text for the quality
                                    # report and the pair's worth (worth.py)

    def __post_init__(self) -> None:
        """From Python as from the CLI: paths may be strings, and a value outside a closed set
        is a ConfigError naming the choices (the CLI's argparse checks them before this)."""
        object.__setattr__(self, "output", Path(self.output))
        object.__setattr__(self, "target", str(self.target))
        object.__setattr__(self, "draft", str(self.draft))
        for name, kind in (("dtype", DType), ("engines", Engines), ("graph", Graph),
                           ("draft_quant", Quant), ("engine_precision", Precision),
                           ("quant", TargetQuant), ("quant_method", QuantMethod),
                           ("quant_compute", QuantCompute), ("trees", Trees)):
            if getattr(self, name) not in get_args(kind):
                raise ConfigError(f"ExportConfig {name}={getattr(self, name)!r} is not one of "
                                  f"{', '.join(get_args(kind))}.")
        if self.quant_block not in QUANT_BLOCKS:
            raise ConfigError(f"ExportConfig quant_block={self.quant_block!r} is not one of "
                              f"{', '.join(map(str, QUANT_BLOCKS))}.")
