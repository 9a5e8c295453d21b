"""Ray Serve: N replicas of the `ssd-serve` app behind Ray's HTTP proxy.

    ssd-serve bundle/ --ray-replicas 2 [--ray-address auto]
    serve run ssd_runtime.serve.ray_app:app_builder bundle=/abs/path/bundle replicas=2
Each replica loads the bundle in its own process and serves the same FastAPI app, API keys
included: the config carries their digests (keys.py), and each replica checks them.
"""
from __future__ import annotations

import logging
import signal
import time
from typing import Any

import ray
from ray import serve
from ray.serve import Application

from ..errors import BackendError
from ..manifest import read_manifest
from .config import ServeConfig, resolve_k
from .keys import load_keys

log = logging.getLogger("ssd_runtime.serve")
APP_NAME = "ssd-serve"


@serve.ingress()
class SsdReplica:
    """One replica; the app is built in the replica process, after Ray placed it."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config

    def __serve_build_asgi_app__(self) -> Any:
        from .app import create_app

        replica = serve.get_replica_context().replica_id.unique_id
        return create_app(self.config, replica=replica)


def build_app(config: ServeConfig, replicas: int) -> Application:
    """The Serve application: `replicas` copies, each taking `threads` (or 1) CPUs."""
    deployment = serve.deployment(
        SsdReplica, name=APP_NAME, num_replicas=replicas,
        # one more than a replica holds (its batch's slots, at most the bundle's 64, and its
        # FIFO of max_queue), so that when every replica is full the app itself answers 429
        # rather than Ray queueing unbounded
        max_ongoing_requests=config.max_queue + (config.max_batch or 64) + 1,
        ray_actor_options={"num_cpus": config.threads or 1})
    return deployment.bind(config)


def app_builder(args: dict[str, str]) -> Application:
    """For `serve run ssd_runtime.serve.ray_app:app_builder bundle=DIR [replicas=N] [k=..]
    [api_key_file=FILE] [metrics_open=1]` (no key on a command line; else $SSD_API_KEY)."""
    fields = {"k": str, "max_queue": int, "max_tokens_limit": int, "threads": int,
              "model_name": str, "backend": str, "mode": str}
    options = {name: cast(args[name]) for name, cast in fields.items() if name in args}
    config = ServeConfig(bundle=args["bundle"], **options,
                         api_keys=load_keys([], args.get("api_key_file")),
                         metrics_open=args.get("metrics_open", "0") not in ("0", "false", ""))
    return build_app(config, int(args.get("replicas", 1)))


def start(config: ServeConfig, replicas: int, address: str | None = None) -> None:
    """Join a cluster (`address`) or start a local Ray; open the HTTP proxy; deploy."""
    _preflight(config)
    if address is None:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    serve.start(http_options={"host": config.host, "port": config.port})
    try:
        serve.run(build_app(config, replicas), name=APP_NAME, route_prefix="/")
    except RuntimeError as exc:
        raise BackendError(f"Ray Serve could not start the replicas: {exc} ---> HINT: read the "
                           f"replica logs (/tmp/ray/session_latest/logs/serve/ on each node); every "
                           f"node needs ssd-toolkit installed and the bundle at "
                           f"{config.bundle}.") from None
    log.info("Ray Serve: %d replicas of %s at http://%s:%d/v1", replicas, config.served_name,
             config.host, config.port)


def stop(own_cluster: bool) -> None:
    """Remove the app; shut Serve and Ray down too when this process started them."""
    if own_cluster:
        serve.shutdown()
    else:
        serve.delete(APP_NAME)
    ray.shutdown()


def serve_forever(config: ServeConfig, replicas: int, address: str | None = None) -> None:
    """`ssd-serve --ray-replicas N`: deploy, then wait for Ctrl-C (SIGINT) and clean up."""
    signal.signal(signal.SIGTERM, _interrupt)      # `kill` cleans up like Ctrl-C
    try:
        start(config, replicas, address)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if ray.is_initialized():
            stop(own_cluster=address is None)


def _preflight(config: ServeConfig) -> None:
    """Catch a bad bundle or k here, with a plain message, before any replica starts."""
    resolve_k(config.k, read_manifest(config.bundle).max_draft)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
