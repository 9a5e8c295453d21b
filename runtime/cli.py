"""`ssd-run`: generate from a bundle on the command line.

    ssd-run bundle/ --prompt "def fib(n):" --max-new-tokens 64 --k 4 --stats
    ssd-run bundle/ --chat --prompt "What is a prime number?" --stats
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .errors import ConfigError, cli_main


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ssd-run", description="Generate text from an SSD bundle.")
    p.add_argument("bundle", help="bundle folder written by ssd-export")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true",
                   help="the prompt is a user's chat message, rendered with the bundle's chat "
                        "template as ssd-serve's /v1/chat/completions renders it (needs jinja2)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", type=k_option, default="auto",
                   help="draft tokens per round: auto (default, adaptive) or N; 0 = target alone")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy (default: the model's generation_config, else greedy)")
    p.add_argument("--top-k", type=int, default=None, help="keep the k likeliest tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--repetition-penalty", type=float, default=None,
                   help="Hugging Face's: seen tokens' logits divided by it (1 = off)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="OpenAI's: minus this for a token already in the output (0 = off)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="OpenAI's: minus this per time a token is in the output (0 = off)")
    p.add_argument("--min-new-tokens", type=int, default=0, help="no EOS before this many")
    p.add_argument("--ignore-eos", action="store_true", help="generate on past EOS")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop when this text appears (repeatable); it is not printed")
    p.add_argument("--mode", choices=("sequential", "split"), default="sequential",
                   help="split: draft the next round while the target verifies")
    p.add_argument("--draft-source", default="fused",
                   choices=("fused", "model", "lookup"),
                   help="who drafts: fused (continuations found earlier in the text where they "
                        "pay, the draft model elsewhere; default), model, lookup")
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda", "trt"))
    p.add_argument("--draft-backend", default=None, choices=("cpu", "cuda", "trt"),
                   help="the draft's backend where it differs: cpu beside a cuda or trt target "
                        "(default: the target's)")
    p.add_argument("--threads", type=int, default=None,
                   help="ONNX Runtime intra-op threads of each model (default: chosen by timing "
                        "and remembered; --stats says which and where from)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure again what start-up remembers for this bundle and machine: "
                   "the CPU threads and the k=auto calibration (docs/runtime.md)")
    p.add_argument("--stats", action="store_true", help="print speed and acceptance to stderr")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--json-schema", metavar="FILE", default=None,
                   help="constrain the output to this JSON schema (response_format json_schema)")
    p.add_argument("--json-object", action="store_true",
                   help="constrain the output to a JSON object (response_format json_object)")
    p.add_argument("--no-forced-tokens", action="store_true",
                   help="under --json-schema/--json-object, do not draft the tokens the grammar "
                        "forces (the comparison; the output is the same)")
    p.add_argument("--prediction", metavar="FILE", default=None,
                   help="the text the output is expected to be (predicted outputs): drafted "
                        "where it pays; the output is unchanged")
    return p


@cli_main("ssd-run")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .generator import Generator

    gen = Generator.load(args.bundle, backend=args.backend, threads=args.threads,
                         mode=args.mode, recalibrate=args.recalibrate,
                         draft_backend=args.draft_backend)
    prompt = _chat_ids(gen, args.prompt) if args.chat else args.prompt
    options = dict(max_new_tokens=args.max_new_tokens, k=args.k, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=args.stop,
                   mode=args.mode, repetition_penalty=args.repetition_penalty,
                   presence_penalty=args.presence_penalty,
                   frequency_penalty=args.frequency_penalty,
                   min_new_tokens=args.min_new_tokens, ignore_eos=args.ignore_eos,
                   draft_source=args.draft_source, response_format=_response_format(args),
                   forced_tokens=not args.no_forced_tokens,
                   prediction=_read(args.prediction, "--prediction") if args.prediction
                   else None)
    if args.json:
        res = gen.generate(prompt, **options)
        print(json.dumps({"text": res.text, "token_ids": res.token_ids,
                          "stop_reason": res.stop_reason, "stats": res.stats.as_dict(),
                          "placement": gen.placement.as_dict() if gen.placement else None}))
        return 0
    for piece in gen.stream(prompt, **options):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if args.stats:
        print(format_stats(gen.last_result.stats), file=sys.stderr)
        print(f"threads target:draft {format_placement(gen.placement)}", file=sys.stderr)
    return 0


def _chat_ids(gen, message: str) -> list[int]:
    """One user message through the bundle's chat template (text.ChatTemplate: the one
    ssd-serve renders with)."""
    from .text import ChatTemplate

    return ChatTemplate(gen.codec).prompt_ids([{"role": "user", "content": message}])


def _response_format(args: argparse.Namespace) -> dict | None:
    if args.json_schema and args.json_object:
        raise ConfigError("--json-schema and --json-object exclude each other; give one.")
    if args.json_object:
        return {"type": "json_object"}
    if not args.json_schema:
        return None
    try:
        schema = json.loads(_read(args.json_schema, "--json-schema"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--json-schema {args.json_schema}: not JSON ({exc}).") from None
    return {"type": "json_schema", "json_schema": {"name": Path(args.json_schema).stem,
                                                   "schema": schema, "strict": True}}


def _read(path: str, option: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot be read ({exc.strerror}).") from None


def k_option(text: str) -> int | str:
    """argparse type for --k: 'auto' or a whole number (ssd-run and ssd-serve)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"k must be 'auto' or an integer, not {text!r}") from None


def format_placement(placement) -> str:
    """e.g. '2:1 (measured at this load; 0.1 cores busy elsewhere then: quiet)'; a GPU
    backend's threads are not placed."""
    return placement.describe() if placement is not None else "- (not on the CPU)"


def format_stats(s) -> str:
    sec = s.seconds
    return (f"[{s.backend}] k={s.k} (mean {s.mean_k:.1f}) stop={s.stop_reason} "
            f"tokens={s.new_tokens} "
            f"tokens/s={s.tokens_per_s:.1f} rounds={s.rounds} acceptance={s.acceptance_rate:.2f} "
            f"accepted/round={s.mean_accepted_per_round:.2f} "
            f"lookup={s.lookup_drafted}/{s.drafted} drafts (acceptance "
            f"{s.lookup_acceptance_rate:.2f}) forced={s.forced} | prefill {sec['prefill'] * 1e3:.1f} ms, "
            f"draft {sec['draft'] * 1e3:.1f} ms, verify {sec['verify'] * 1e3:.1f} ms, "
            f"host {sec['host'] * 1e3:.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
