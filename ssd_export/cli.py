"""`ssd-export` and `ssd-build-engines`: the only argparse file of the exporter.

`ssd-export` builds an `ExportConfig` and calls `export_bundle(config)`;
`ssd-build-engines DIR` adds TensorRT engines to an existing bundle on the GPU
machine; `ssd-gguf-to-hf MODEL.gguf OUT/` writes a GGUF file as a Hugging Face
folder. Errors print one line and exit 2, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from ssd_runtime.engines import PRECISIONS
from ssd_runtime.errors import cli_main

from .config import (QUANT_BLOCKS, DType, Engines, ExportConfig, Graph, Quant, QuantCompute,
                     QuantMethod, TargetQuant, Trees)
from .gguf import DTYPES as GGUF_DTYPES

EXTRA_HINT = ("ssd-export needs the exporter's packages (torch, transformers, onnx, onnxscript). "
              "---> HINT: pip install 'ssd-toolkit[export]'")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ssd-export",
        description="Export a target/draft pair of Hugging Face causal LMs to an SSD bundle.")
    p.add_argument("--target", help="target model: local Hugging Face folder, hub id, or a "
                                    ".gguf file (converted to a temporary folder first; needs "
                                    "the gguf package)")
    p.add_argument("--draft", help="draft model sharing the target's tokenizer (a folder, hub "
                                   "id or .gguf file; the target's own gives its int8 copy), an "
                                   "EAGLE-3 head's folder, or 'mtp': the target's own MTP layer "
                                   "(DeepSeek V3, GLM-4 MoE)")
    p.add_argument("--output", type=Path, help="bundle folder to write")
    p.add_argument("--max-context", type=int, default=None,
                   help="longest sequence the bundle serves (default: 2048, or the models' limit)")
    p.add_argument("--max-draft", type=int, default=8, help="largest k (draft tokens per round)")
    p.add_argument("--max-batch", type=int, default=16,
                   help="most sequences the runtime may decode in one call, each at its own "
                        "length (Generator.load(max_batch=), ssd-serve --max-batch); checked at "
                        "export and recorded in the bundle (default 16, at most 64)")
    p.add_argument("--dtype", choices=get_args(DType), default="float32")
    p.add_argument("--engines", choices=get_args(Engines), default="auto",
                   help="TensorRT engines: auto (default) builds them when TensorRT and a GPU are "
                        "here and says so when it skips; trt requires them; none skips")
    p.add_argument("--engine-precision", choices=PRECISIONS, default="fp16",
                   help="precision TensorRT may use inside the engines (default fp16)")
    p.add_argument("--graph", choices=get_args(Graph), default="auto",
                   help="graph flavour: standard ONNX runs on every backend (TensorRT, ORT CUDA, "
                        "ORT CPU); ort uses ONNX Runtime's GroupQueryAttention kernel with the KV "
                        "cache updated in place, faster on ORT CPU and CPU-only; static is "
                        "ONNX over whole caches written in place (ScatterND): fixed "
                        "shapes per batch and new tokens, batches of several new tokens per row, "
                        "any ONNX Runtime provider, not TensorRT; auto (default) is ort unless "
                        "TensorRT engines are built or onnxruntime has CUDA here, or static "
                        "for a quantized target (--quant: its rows are then exact, so "
                        "speculation equals k=0; design §12)")
    p.add_argument("--draft-quant", choices=get_args(Quant), default="auto",
                   help="the draft's weights: int8/int4 weight-only quantization (ONNX Runtime "
                        "MatMulNBits, CPU-only) makes its steps cheaper and never changes the "
                        "output, only how many draft tokens are accepted; auto (default) is int8 "
                        "when the graphs are the ort flavour and the int8 draft agrees with the "
                        "float one on >= 97%% of its tokens, else none")
    p.add_argument("--quant", choices=get_args(TargetQuant), default="none",
                   help="the target's weights: int8/int4 weight-only, symmetric blocks "
                        "(MatMulNBits in the ort flavour, blockwise DequantizeLinear in the "
                        "standard one); the quantized target becomes the reference the output "
                        "is exact against; a quality report against the float target is "
                        "printed and recorded; auto takes int4, else int8, when it agrees with "
                        "the float target on enough next tokens (default none)")
    p.add_argument("--quant-block", type=int, choices=QUANT_BLOCKS, default=32,
                   help="weights per scale along K (default 32)")
    p.add_argument("--quant-method", choices=get_args(QuantMethod), default="rtn",
                   help="rtn: round to nearest (default); hqq: ONNX Runtime's Half-Quadratic "
                        "Quantization (int4, the ort flavour)")
    p.add_argument("--quant-lm-head", action=argparse.BooleanOptionalAction, default=True,
                   help="quantize the LM head too (default; --no-quant-lm-head keeps it float)")
    p.add_argument("--quant-compute", choices=get_args(QuantCompute), default="int8",
                   help="what the quantized MatMuls compute in: int8 (default) rounds each "
                        "block of activations to int8, the fast CPU kernels: exact against "
                        "k=0 in the standard and static flavours, while in the ort flavour a "
                        "row varies slightly with the rows beside it and speculation may part "
                        "from k=0 (design §12); float computes in float32, slower (int4 only)")
    p.add_argument("--trees", choices=get_args(Trees), default="auto",
                   help="whether the target's graph takes draft trees (several guesses a "
                        "position, verified in one call; design §2): auto (default) in the ort "
                        "and static flavours, whose chains it costs nothing (the runtime "
                        "verifies trees on ort targets; a static one keeps k=0's bits and "
                        "verifies chains); on: the standard flavour too, whose every call it "
                        "costs a few percent on a CPU and whose GPU backends verify chains "
                        "only; off: none")
    p.add_argument("--calib", metavar="FILE.jsonl",
                   help="text for the quantization report and the pair's worth (the draft's "
                        "agreement with the target, docs/export.md), one {\"text\": ...} a line "
                        "(its last tenth is held out); default: Python's standard-library "
                        "docstrings")
    p.add_argument("--force", action="store_true", help="replace an existing --output")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--list-architectures", action="store_true",
                   help="print the supported Hugging Face classes and exit")
    return p


@cli_main("ssd-export", "interrupted; nothing was written.")
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_architectures:
        from ssd_graphs.registry import supported_architectures

        print("\n".join(supported_architectures()))
        return 0
    missing = [f"--{n}" for n in ("target", "draft", "output") if getattr(args, n) is None]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    config = ExportConfig(target=args.target, draft=args.draft, output=args.output,
                          max_context=args.max_context, max_draft=args.max_draft,
                          max_batch=args.max_batch, dtype=args.dtype, force=args.force, quiet=args.quiet,
                          engines=args.engines, engine_precision=args.engine_precision,
                          graph=args.graph, draft_quant=args.draft_quant, quant=args.quant,
                          quant_block=args.quant_block, quant_method=args.quant_method,
                          quant_lm_head=args.quant_lm_head, quant_compute=args.quant_compute,
                          trees=args.trees, calib=args.calib)
    try:
        from .pipeline import export_bundle
    except ImportError as exc:
        print(f"ssd-export: error: {EXTRA_HINT} (missing: {exc.name})", file=sys.stderr)
        return 2
    export_bundle(config)
    return 0


def build_engines_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ssd-build-engines",
        description="Build TensorRT engines for this machine's GPU into an existing bundle "
                    "(engines are specific to the GPU and the TensorRT version).")
    p.add_argument("bundle", type=Path, help="bundle folder written by ssd-export")
    p.add_argument("--precision", choices=PRECISIONS, default="fp16",
                   help="precision TensorRT may use inside the engines (default fp16)")
    p.add_argument("--version-compatible", action="store_true",
                   help="build engines that later TensorRT 10.x runtimes (and the lean runtime) "
                        "can run")
    p.add_argument("--force", action="store_true",
                   help="rebuild engines that already exist for this GPU and TensorRT version")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


@cli_main("ssd-build-engines", "interrupted; the bundle is unchanged.")
def build_engines_main(argv: list[str] | None = None) -> int:
    args = build_engines_parser().parse_args(argv)
    from .engines import add_engines

    say = _progress(args.quiet)
    manifest = add_engines(args.bundle, args.precision, args.version_compatible, args.force,
                           say)
    built = [e.path for e in manifest.engines][-2:]
    say(f"ssd-build-engines: wrote {', '.join(built)} and updated "
        f"{args.bundle / 'manifest.json'}")
    return 0


def gguf_to_hf_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ssd-gguf-to-hf",
        description="Write a GGUF model file (llama.cpp's format) as a Hugging Face folder: "
                    "config, dequantized safetensors, tokenizer and chat template, for "
                    "ssd-export, ssd-distill or transformers. Needs the gguf package.")
    p.add_argument("gguf", type=Path, help="the .gguf file")
    p.add_argument("output", type=Path, help="folder to write (written whole or not at all)")
    p.add_argument("--dtype", choices=GGUF_DTYPES, default="float32",
                   help="the weights' dtype once dequantized (default float32)")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


@cli_main("ssd-gguf-to-hf", "interrupted; nothing was written.")
def gguf_to_hf_main(argv: list[str] | None = None) -> int:
    args = gguf_to_hf_parser().parse_args(argv)
    from .gguf import gguf_to_hf

    say = _progress(args.quiet)
    try:
        out = gguf_to_hf(args.gguf, args.output, args.dtype, args.force, say)
    except ImportError as exc:
        print(f"ssd-gguf-to-hf: error: reading a GGUF file needs torch and transformers. "
              f"---> HINT: pip install 'ssd-toolkit[export]' (missing: {exc.name})",
              file=sys.stderr)
        return 2
    say(f"ssd-gguf-to-hf: wrote {out} from {args.gguf}")
    return 0


def _progress(quiet: bool):
    """Progress lines to stderr, or nothing with --quiet."""
    return (lambda text: None) if quiet else \
        (lambda text: print(text, file=sys.stderr, flush=True))


if __name__ == "__main__":
    sys.exit(main())
