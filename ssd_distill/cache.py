"""The answer cache (docs/distill.md §9): the target's answers to prompts, their labels and
features, on disk, made once and reused by every later training on the same target.

    CACHE/cache.json              what it holds: format, the target's identity, the layers
    CACHE/bundle/                 the bundle that wrote the answers (answers.py)
    CACHE/answers/part-NNNNNN.npz a part: prompts + answers (ids), labels, a line per answer
    CACHE/features/part-NNNNNN.f16   its rows' features (positions, 3H) float16 (features.py)
    CACHE/features/part-NNNNNN.labels.npz   labels made by the prefill, where the answers
                                  came from a quantized target (their own are not the float's)

Every file is written beside its name and renamed, so a part is whole or absent: a killed run
leaves the cache usable and the next one continues. A write that finds the disk full removes
what it started and stops with one error; the parts before it stay.
"""
from __future__ import annotations

import errno
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ssd_runtime.errors import ConfigError

FORMAT, VERSION = "ssd-distill-answers", 1
MANIFEST = "cache.json"
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)    # no room, over quota, too large
SAMPLE = 1 << 20        # bytes read at each end of a weight file for the target's identity


class CacheFull(ConfigError):
    """The cache's disk (or the process's file-size limit) refused a write."""


@dataclass
class Part:
    """One part's answers: rows of prompt + answer ids, concatenated; labels for every answer
    position when the answering target was the float one (top-K ids and log-probs)."""

    prompt_len: np.ndarray        # (n,) int32
    answer_len: np.ndarray        # (n,) int32
    ids: np.ndarray               # (sum prompt_len + answer_len,) int32
    top_ids: np.ndarray | None    # (sum answer_len, K) int32
    top_logp: np.ndarray | None   # (sum answer_len, K) float16
    meta: list[dict[str, Any]]    # per answer: source, mode, key, stop

    @property
    def positions(self) -> int:
        return int(self.answer_len.sum())

    @property
    def tokens(self) -> int:
        return int(self.prompt_len.sum() + self.answer_len.sum())


def target_identity(source: str) -> dict[str, Any]:
    """The target's name and a digest of what makes it itself: config.json and the tokenizer
    whole, each weight file's size and its first and last MiB (a cheap stand-in for hashing
    gigabytes: two checkpoints that differ differ there too)."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return {"name": source, "digest": hashlib.sha256(source.encode()).hexdigest()[:16]}
    h = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            h.update(path.name.encode() + path.read_bytes())
        elif path.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
            size = path.stat().st_size
            h.update(f"{path.name}:{size}".encode())
            with path.open("rb") as f:
                h.update(f.read(SAMPLE))
                f.seek(max(0, size - SAMPLE))
                h.update(f.read(SAMPLE))
    return {"name": str(folder.absolute()), "digest": h.hexdigest()[:16]}


class AnswerCache:
    """A cache folder for one target (refused for any other, by name, when opened);
    `ensure()` creates it."""

    def __init__(self, root: Path, identity: dict[str, Any]) -> None:
        self.root = Path(root).absolute()
        self.identity = identity
        path = self.root / MANIFEST
        if path.exists():
            try:
                self.manifest = json.loads(path.read_text())
                found = self.manifest["target"]
            except (OSError, ValueError, KeyError, TypeError):
                raise ConfigError(f"--cache {self.root}: {MANIFEST} is unreadable. ---> HINT: "
                                  f"give another --cache folder, or delete this one.") from None
            if self.manifest.get("format") != FORMAT or self.manifest.get("version") != VERSION:
                raise ConfigError(f"--cache {self.root} is not an answer cache of this version "
                                  f"({FORMAT} {VERSION}). ---> HINT: give another --cache.")
            if found.get("digest") != identity["digest"]:
                raise ConfigError(
                    f"--cache {self.root} holds the answers of target {found.get('name')!r} "
                    f"(identity {found.get('digest')}), not of {identity['name']!r} (identity "
                    f"{identity['digest']}): another target's answers and features would "
                    f"train a head for the wrong model. ---> HINT: give this target its own "
                    f"--cache folder (or drop --cache for the default beside --output).")
        else:
            self.manifest = {"format": FORMAT, "version": VERSION, "target": identity}

    def ensure(self) -> None:
        """Create the folder (if new) and clear what a killed run half-wrote."""
        if not (self.root / MANIFEST).exists():
            self.root.mkdir(parents=True, exist_ok=True)
            self.write_json(self.root / MANIFEST, self.manifest)
        for sub in ("answers", "features"):
            (self.root / sub).mkdir(exist_ok=True)
            for stale in (self.root / sub).glob(".*.tmp-*"):    # a killed run's half-write
                stale.unlink(missing_ok=True)

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    def parts(self) -> list[str]:
        """The complete parts' names, in order."""
        return sorted(p.stem for p in (self.root / "answers").glob("part-*.npz"))

    def next_name(self) -> str:
        names = self.parts()
        return f"part-{int(names[-1].split('-')[1]) + 1 if names else 1:06d}"

    def read(self, name: str) -> Part:
        with np.load(self.root / "answers" / f"{name}.npz") as z:
            meta = json.loads(str(z["meta"]))
            has = "top_ids" in z.files
            return Part(z["prompt_len"], z["answer_len"], z["ids"],
                        z["top_ids"] if has else None, z["top_logp"] if has else None, meta)

    def write(self, name: str, part: Part) -> None:
        arrays = {"prompt_len": part.prompt_len, "answer_len": part.answer_len,
                  "ids": part.ids, "meta": np.array(json.dumps(part.meta))}
        if part.top_ids is not None:
            arrays.update(top_ids=part.top_ids, top_logp=part.top_logp)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        self.write_bytes(self.root / "answers" / f"{name}.npz", buf.getvalue())

    def features_path(self, name: str) -> Path:
        return self.root / "features" / f"{name}.f16"

    def labels_path(self, name: str) -> Path:
        return self.root / "features" / f"{name}.labels.npz"

    def size(self) -> int:
        """Bytes of data held (answers, labels, features; not the bundle)."""
        return sum(p.stat().st_size for sub in ("answers", "features")
                   for p in (self.root / sub).glob("part-*"))

    def known(self) -> tuple[set[str], dict[str, tuple[int, int]]]:
        """(the keys of the answers held, {source: (answers, positions)})."""
        keys: set[str] = set()
        per: dict[str, tuple[int, int]] = {}
        for name in self.parts():
            part = self.read(name)
            for m, n in zip(part.meta, part.answer_len.tolist()):
                keys.add(m["key"])
                a, p = per.get(m["source"], (0, 0))
                per[m["source"]] = (a + 1, p + n)
        return keys, per

    def write_json(self, path: Path, data: Any) -> None:
        self.write_bytes(path, (json.dumps(data, indent=2) + "\n").encode())

    def write_bytes(self, path: Path, data: bytes | memoryview) -> None:
        """Write `data` at `path` whole or not at all: beside it, then renamed. A full disk
        removes the half-written file and raises CacheFull."""
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in FULL_ERRNOS:
                held = len(self.parts())
                raise CacheFull(
                    f"the answer cache {self.root} is full: writing {path.name} "
                    f"({len(data):,} bytes) failed ({os.strerror(exc.errno)}). Nothing was "
                    f"half-written: the cache keeps its {held} complete part(s), and the same "
                    f"command continues from them. ---> HINT: free disk space, or bound the "
                    f"cache with --data-budget (e.g. --data-budget 2GB), then rerun it.") from None
            raise
