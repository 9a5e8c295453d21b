"""`ServeConfig`: everything `ssd-serve` needs to build the app, frozen and picklable.

The CLI builds it; `app.create_app` and the Ray deployment read it. Plain
Python only, so that it can cross into Ray replicas.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import ConfigError
from ..round.lookup import DRAFT_SOURCES
from .keys import ApiKeys

Backend = Literal["auto", "cpu", "cuda", "trt"]

@dataclass(frozen=True)
class ServeConfig:
    bundle: Path
    host: str = "127.0.0.1"
    port: int = 8000
    backend: Backend = "auto"
    k: int | Literal["auto"] = "auto"
    max_queue: int = 64                 # requests waiting for the generator, beyond the running one
    max_batch: int | None = None        # sequences decoded together; None: from the calibration
    max_tokens_limit: int | None = None  # None: the bundle's max_context
    threads: int | None = None
    mode: Literal["sequential", "split"] = "sequential"   # split: the draft runs ahead on a thread
    model_name: str | None = None       # None: the bundle folder's name
    recalibrate: bool = False           # time threads and batch sizes again (cache.py)
    draft_source: str = "fused+suffix"  # lookup.DRAFT_SOURCES: who drafts
    suffix_cache_mb: float = 64.0       # earlier requests' text kept for "suffix" (0: none)
    draft_backend: str | None = None    # "cpu": the draft on the host beside a GPU target
    api_keys: ApiKeys | None = field(default=None, repr=False)  # None: every route is open
    metrics_open: bool = False          # GET /metrics without a key (keys.py)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bundle", Path(self.bundle).resolve())
        if self.max_queue < 0:
            raise ConfigError(f"--max-queue {self.max_queue} must be 0 or more.")
        if self.max_batch is not None and self.max_batch < 1:
            raise ConfigError(f"--max-batch {self.max_batch} must be at least 1.")
        if self.max_batch not in (None, 1) and self.mode == "split":
            raise ConfigError("--mode split decodes one sequence at a time: it cannot go with "
                              "--max-batch above 1. ---> HINT: drop --mode split to batch.")
        if self.max_tokens_limit is not None and self.max_tokens_limit < 1:
            raise ConfigError(f"--max-tokens-limit {self.max_tokens_limit} must be at least 1.")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads {self.threads} must be at least 1.")
        if self.draft_source not in DRAFT_SOURCES:
            raise ConfigError(f"--draft-source {self.draft_source!r} is unknown; use "
                              f"{', '.join(DRAFT_SOURCES)}.")
        if not self.suffix_cache_mb >= 0:
            raise ConfigError(f"--suffix-cache-mb {self.suffix_cache_mb} must be 0 or more "
                              f"(0 keeps no earlier requests).")
        if self.mode not in ("sequential", "split"):
            raise ConfigError(f"--mode {self.mode!r} is unknown; use sequential or split.")
        if self.api_keys is not None and not isinstance(self.api_keys, ApiKeys):
            raise ConfigError(f"api_keys must be an ApiKeys (keys.ApiKeys.of([...]) or "
                              f"keys.load_keys), not {type(self.api_keys).__name__}.")

    @property
    def served_name(self) -> str:
        return self.model_name or self.bundle.name


def resolve_k(k: int | str, max_draft: int) -> int | str:
    """The draft length requests run with: an int as given, or "auto" (adaptive k)."""
    if k == "auto":
        return "auto"
    if isinstance(k, str):
        if not k.isdigit():
            raise ConfigError(f"--k {k!r} must be 'auto' or a whole number from 0 to {max_draft}.")
        k = int(k)
    if not 0 <= k <= max_draft:
        raise ConfigError(f"--k {k} is outside [0, {max_draft}], the bundle's max_draft. "
                          f"---> HINT: use a smaller k, or re-export with "
                          f"ssd-export --max-draft {k}.")
    return k
