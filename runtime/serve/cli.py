"""`ssd-serve`: an OpenAI-compatible HTTP server for an SSD bundle.

    ssd-serve bundle/ --port 8000                  # one process, uvicorn
    ssd-serve bundle/ --ray-replicas 4             # Ray Serve replicas behind Ray's HTTP proxy
    ssd-serve bundle/ --api-key-file keys.txt      # every route but /health needs a Bearer key
"""
from __future__ import annotations

import argparse
import logging
import sys

from ..cli import k_option
from ..errors import ConfigError, cli_main
from ..round.lookup import DRAFT_SOURCES
from .config import ServeConfig
from .keys import ENV, FILE_FORMAT, load_keys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ssd-serve", description="Serve an SSD bundle over an "
                                "OpenAI-compatible HTTP API (completions, chat, streaming).")
    p.add_argument("bundle", help="bundle folder written by ssd-export")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda", "trt"))
    p.add_argument("--draft-backend", default=None, choices=("cpu", "cuda", "trt"),
                   help="the draft's backend where it differs: cpu beside a cuda or trt target")
    p.add_argument("--k", type=k_option, default="auto", metavar="auto|N",
                   help="draft tokens per round: auto (adaptive, default) or N; 0 = target alone")
    p.add_argument("--max-queue", type=int, default=64, metavar="N",
                   help="requests that may wait for the generator; more get 429 (default 64)")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="requests decoded together in one batch (continuous batching; 1: one "
                        "at a time); default: chosen at start from the measured cost of each "
                        "batch size, up to the bundle's max_batch")
    p.add_argument("--max-tokens-limit", type=int, default=None, metavar="N",
                   help="largest max_tokens a request may ask for (default: the bundle's "
                        "max_context)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime intra-op threads")
    p.add_argument("--mode", choices=("sequential", "split"), default="sequential",
                   help="split: draft the next round while the target verifies (threads "
                        "are chosen for it: one core for the draft)")
    p.add_argument("--draft-source", default="fused+suffix", choices=DRAFT_SOURCES,
                   help="who drafts: fused+suffix (default: fused, with the text of earlier "
                        "requests of the same API key), fused (continuations found earlier in "
                        "the request where they pay, the draft model elsewhere), model, lookup, "
                        "suffix (lookup with earlier requests' text, no draft model)")
    p.add_argument("--suffix-cache-mb", type=float, default=64.0, metavar="MB",
                   help="memory for earlier requests' text (--draft-source suffix); the oldest "
                        "go first (default 64; 0 keeps none)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure again what start-up remembers for this bundle and machine: "
                   "the CPU threads and the k=auto calibrations (docs/runtime.md)")
    p.add_argument("--model-name", default=None, metavar="NAME",
                   help="model id clients must send (default: the bundle folder's name)")
    p.add_argument("--ray-replicas", type=int, default=0, metavar="N",
                   help="run N replicas on Ray Serve instead of one process (needs the ray extra)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="Ray cluster to join ('auto': the one `ray start` runs here; default: "
                        "start a local Ray instance)")
    p.add_argument("--api-key", action="append", metavar="KEY",
                   help="a key clients must send as `Authorization: Bearer KEY` on every route "
                        "but /health (repeatable: any of them; a command line is visible to "
                        "other users: prefer --api-key-file). Neither this nor --api-key-file: "
                        f"${ENV}, if set")
    p.add_argument("--api-key-file", metavar="FILE",
                   help=f"a file of keys, {FILE_FORMAT}")
    p.add_argument("--metrics-open", action="store_true",
                   help="answer GET /metrics without a key (a scraper that sends none)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(bundle=args.bundle, host=args.host, port=args.port, backend=args.backend,
                       k=args.k, max_queue=args.max_queue, max_batch=args.max_batch,
                       max_tokens_limit=args.max_tokens_limit,
                       threads=args.threads, mode=args.mode, model_name=args.model_name,
                       recalibrate=args.recalibrate, draft_source=args.draft_source,
                       draft_backend=args.draft_backend, suffix_cache_mb=args.suffix_cache_mb,
                       api_keys=load_keys(args.api_key, args.api_key_file),
                       metrics_open=args.metrics_open)


@cli_main("ssd-serve")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s: %(message)s")
    config = config_from_args(args)
    if args.ray_replicas < 0:
        raise ConfigError(f"--ray-replicas {args.ray_replicas} must be 1 or more (0: no Ray).")
    if args.ray_replicas:
        _ray().serve_forever(config, args.ray_replicas, args.ray_address)
        return 0
    app, uvicorn = _single_process(config)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level,
                timeout_graceful_shutdown=5)
    return 0


def _single_process(config: ServeConfig):
    try:
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        raise ConfigError(f"ssd-serve needs the serve extra ({exc.name} is not installed). "
                          f"---> HINT: pip install 'ssd-toolkit[serve]'.") from None
    return create_app(config), uvicorn


def _ray():
    try:
        from . import ray_app
    except ImportError as exc:
        raise ConfigError(f"--ray-replicas needs the ray extra ({exc.name} is not installed). "
                          f"---> HINT: pip install 'ssd-toolkit[serve,ray]'.") from None
    return ray_app


if __name__ == "__main__":
    sys.exit(main())
