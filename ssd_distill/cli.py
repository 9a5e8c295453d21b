"""`ssd-distill`: the only argparse file of the distiller; builds a `DistillConfig` and calls
`distill(config)`. Errors print one line and exit 2, never a traceback."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from ssd_runtime.errors import cli_main

from .config import PRESETS, DistillConfig, Init, Loss

EXTRA_HINT = ("ssd-distill needs the exporter's packages (torch, transformers, onnx, "
              "onnxscript). ---> HINT: pip install 'ssd-toolkit[export]'")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ssd-distill",
        description="Make a draft model from a target: a few of its layers, trained on its own "
                    "answers and next-token distributions; ssd-export --draft takes the folder.")
    p.add_argument("--target", required=True, help="target model: local Hugging Face folder or hub id")
    p.add_argument("--output", required=True, type=Path, help="draft folder to write")
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="quick (a tiny test target, about a minute), default (a 100-300M "
                        "target in at most 45 minutes on 2 cores), large (hours)")
    p.add_argument("--data", type=Path, nargs="+", default=[], metavar="FILE",
                   help="text files of your domain, labelled by the target beside its answers")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL of {\"prompt\": ...} or {\"messages\": [...]} the target answers "
                        "(default: the shipped 750 chat and code requests)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--force", action="store_true",
                   help="replace --output once the new draft is complete; start over an "
                        "interrupted run")
    p.add_argument("--layers", type=int, default=None, help="draft layers (default: the preset's)")
    p.add_argument("--head-tokens", type=int, default=None,
                   help="the draft's head covers the target's N most frequent output tokens "
                        "(0: the whole vocabulary; default: the preset's)")
    p.add_argument("--loss", choices=get_args(Loss), default="mix",
                   help="soft labels (kl), the target's argmax (top1), or half each (mix)")
    p.add_argument("--init", choices=get_args(Init), default="spread",
                   help="the draft's layers start as the target's first ones or spread evenly")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bundle", type=Path, default=None,
                   help="keep the report's export (target + new draft) as this bundle")
    p.add_argument("--no-check", action="store_true",
                   help="skip the export and timing of the pair at the end")
    p.add_argument("--quiet", action="store_true")
    return p


@cli_main("ssd-distill", "interrupted; the work so far is kept: rerun with --resume.")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = DistillConfig(target=args.target, output=args.output, preset=args.preset,
                           data=tuple(args.data), prompts=args.prompts, threads=args.threads,
                           resume=args.resume, force=args.force, quiet=args.quiet,
                           seed=args.seed, layers=args.layers, head_tokens=args.head_tokens,
                           loss=args.loss, init=args.init, bundle=args.bundle,
                           check=not args.no_check)
    try:
        from .pipeline import distill
    except ImportError as exc:
        print(f"ssd-distill: error: {EXTRA_HINT} (missing: {exc.name})", file=sys.stderr)
        return 2
    distill(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
