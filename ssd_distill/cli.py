"""`ssd-distill`: the only argparse file of the distiller; builds a `DistillConfig` and calls
`distill(config)`. Errors print one line and exit 2, never a traceback."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import get_args

from ssd_runtime.errors import cli_main

from .config import PRESETS, DistillConfig, Init, Kind, Loss

EXTRA_HINT = ("ssd-distill needs the exporter's packages (torch, transformers, onnx, "
              "onnxscript). ---> HINT: pip install 'ssd-toolkit[export]'")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ssd-distill",
        description="Make a draft model from a target: a few of its layers (or an EAGLE-3 "
                    "head over its hidden states, --kind head), trained on its own answers and "
                    "next-token distributions; ssd-export --draft takes the folder.")
    p.add_argument("--target", required=True, help="target model: local Hugging Face folder or hub id")
    p.add_argument("--output", required=True, type=Path, help="draft (or head) folder to write")
    p.add_argument("--kind", choices=get_args(Kind), default="draft",
                   help="draft: a small model of the target's class (ssd-export --draft); "
                        "head: an EAGLE-3 head over the target's hidden states, in SafeAILab's "
                        "layout (docs/distill.md §8)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="quick (a tiny test target, about a minute), default (a 100-300M "
                        "target in at most 45 minutes on 2 cores), large (hours)")
    p.add_argument("--data", type=Path, nargs="+", default=[], metavar="FILE",
                   help="text files of your domain, labelled by the target beside its answers")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL of {\"prompt\": ...} or {\"messages\": [...]} the target answers "
                        "(--kind head: or plain text, one prompt a line; default: the shipped "
                        "750 chat and code requests, and for a head also requests about the "
                        "standard library's docstrings and a chat model's own questions)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--force", action="store_true",
                   help="replace --output once the new draft is complete; start over an "
                        "interrupted run")
    p.add_argument("--layers", type=int, default=None, help="draft layers (default: the preset's)")
    p.add_argument("--head-tokens", "--draft-vocab", type=int, default=None, dest="head_tokens",
                   help="the draft's output vocabulary: the target's N most frequent output "
                        "tokens (0: the whole vocabulary; default: the preset's; for a head, "
                        "its draft_vocab_size)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the training rows "
                   "(default: the preset's)")
    p.add_argument("--steps", type=int, default=None,
                   help="a fixed number of optimizer steps instead of --epochs")
    p.add_argument("--ttt-steps", type=int, default=None,
                   help="--kind head: drafting steps unrolled per position in training "
                        "(default: the preset's, 4)")
    p.add_argument("--loss", choices=get_args(Loss), default="mix",
                   help="soft labels (kl), the target's argmax (top1), or half each (mix)")
    p.add_argument("--init", choices=get_args(Init), default="spread",
                   help="the draft's layers start as the target's first ones or spread evenly")
    h = p.add_argument_group("--kind head: the target writes its own data (docs/distill.md §9)")
    h.add_argument("--budget", default=None, metavar="TIME",
                   help="the time to plan for (1h, 45m, 1h30m): answers, positions and epochs "
                        "from rates measured at the start, printed before the work (default: "
                        "the preset's, 1h; quick: fixed counts)")
    h.add_argument("--answers", type=int, default=None, metavar="N",
                   help="a fixed number of training answers instead of --budget's plan")
    h.add_argument("--cache", type=Path, default=None, metavar="DIR",
                   help="the answer cache: answers, labels and features, reused by later runs "
                        "on the same target and refused for another (default: OUTPUT.answers)")
    h.add_argument("--data-budget", default=None, metavar="SIZE",
                   help="the cache's most bytes (2GB, 512MiB) or answer positions (500k)")
    h.add_argument("--answers-bundle", type=Path, default=None, metavar="DIR",
                   help="the bundle whose runtime writes the answers (default: the target "
                        "exported into the cache once)")
    h.add_argument("--answers-quant", choices=["none", "int8", "int4"], default="none",
                   help="that export's target weights: none (default: the answers and their "
                        "log-probabilities are the float target's own), or int8/int4 (faster "
                        "decoding; the float target's prefill labels them)")
    h.add_argument("--head-init", choices=["target", "random"], default="target",
                   help="the head starts from the target's last layer, final norm and LM head "
                        "(default), or as SafeAILab's (random)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bundle", type=Path, default=None,
                   help="keep the report's export (target + new draft or head) as this bundle")
    p.add_argument("--no-check", action="store_true",
                   help="skip the export and timing of the pair at the end")
    p.add_argument("--quiet", action="store_true")
    return p


@cli_main("ssd-distill", "interrupted; the work so far is kept: rerun with --resume.")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = DistillConfig(target=args.target, output=args.output, kind=args.kind,
                           preset=args.preset, epochs=args.epochs, steps=args.steps,
                           ttt_steps=args.ttt_steps,
                           data=tuple(args.data), prompts=args.prompts, threads=args.threads,
                           resume=args.resume, force=args.force, quiet=args.quiet,
                           seed=args.seed, layers=args.layers, head_tokens=args.head_tokens,
                           loss=args.loss, init=args.init, bundle=args.bundle,
                           check=not args.no_check, budget=args.budget, answers=args.answers,
                           cache=args.cache, data_budget=args.data_budget,
                           answers_bundle=args.answers_bundle, answers_quant=args.answers_quant,
                           head_init=args.head_init)
    try:
        if config.kind == "head":
            from .head import distill_head as distill
        else:
            from .pipeline import distill
    except ImportError as exc:
        print(f"ssd-distill: error: {EXTRA_HINT} (missing: {exc.name})", file=sys.stderr)
        return 2
    distill(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
