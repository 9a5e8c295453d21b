"""`Generator`: load a bundle and generate text with speculative decoding.

    gen = Generator.load("bundle/")
    res = gen.generate("def fib(n):", max_new_tokens=64, k=4)   # k=0: target alone
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

from .acceptance import GreedyAcceptance
from .backends import open_sessions
from .errors import ConfigError
from .loop import Stats, decode
from .manifest import Manifest, read_manifest
from .text import IncrementalDecoder, TextCodec


@dataclass
class GenerationResult:
    token_ids: list[int]      # generated ids only, not the prompt
    text: str
    stop_reason: str          # "eos" | "length" | "context"
    stats: Stats


class Generator:
    def __init__(self, root: Path, manifest: Manifest, backend: str = "auto",
                 threads: int | None = None) -> None:
        self.root, self.manifest = root, manifest
        self.codec = TextCodec(root, manifest.tokenizer)
        self.target, self.draft = open_sessions(root, manifest, backend, threads)
        self.backend = self.target.backend
        self.eos_ids = set(manifest.tokenizer.eos_token_ids)
        self.last_result: GenerationResult | None = None

    @classmethod
    def load(cls, bundle: str | Path, backend: str = "auto", threads: int | None = None,
             verify: bool = True) -> Generator:
        """Open a bundle written by ssd-export; `verify` checks every file's sha256."""
        root = Path(bundle)
        return cls(root, read_manifest(root, verify=verify), backend, threads)

    def generate(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
                 k: int = 4) -> GenerationResult:
        ids, stats = [], Stats()
        for new in self._rounds(prompt, max_new_tokens, k, stats):
            ids += new
        return self._finish(ids, stats)

    def stream(self, prompt: str | Sequence[int], max_new_tokens: int = 128,
               k: int = 4) -> Iterator[str]:
        """Yield text pieces as tokens are accepted; `last_result` holds the rest."""
        ids, stats = [], Stats()
        pieces = IncrementalDecoder(self.codec)
        for new in self._rounds(prompt, max_new_tokens, k, stats):
            ids += new
            if piece := pieces.push(new):
                yield piece
        if tail := pieces.flush():
            yield tail
        self._finish(ids, stats)

    def encode(self, text: str) -> list[int]:
        return self.codec.encode(text)

    def _rounds(self, prompt: str | Sequence[int], max_new_tokens: int, k: int,
                stats: Stats) -> Iterator[list[int]]:
        ids = self._prompt_ids(prompt)
        self._check(k, max_new_tokens)
        stats.backend, stats.k, stats.prompt_tokens = self.backend, k, len(ids)
        return decode(self.target, self.draft, GreedyAcceptance(), ids, max_new_tokens, k,
                      self.eos_ids, stats)

    def _finish(self, ids: list[int], stats: Stats) -> GenerationResult:
        result = GenerationResult(ids, self.codec.decode(ids), stats.stop_reason, stats)
        self.last_result = result
        return result

    def _prompt_ids(self, prompt: str | Sequence[int]) -> list[int]:
        ids = self.codec.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        limit, vocab = self.manifest.max_context, self.manifest.target.vocab_size
        if not ids:
            raise ConfigError("the prompt is empty: give at least one token or character.")
        if len(ids) > limit:
            raise ConfigError(f"the prompt has {len(ids)} tokens, more than the bundle's "
                              f"max_context {limit}. ---> HINT: shorten it, or re-export with "
                              f"ssd-export --max-context {len(ids) + 256}.")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise ConfigError(f"prompt token id {bad[0]} is outside the vocabulary [0, {vocab}).")
        return ids

    def _check(self, k: int, max_new_tokens: int) -> None:
        if not isinstance(k, int) or k < 0 or k > self.manifest.max_draft:
            raise ConfigError(f"k={k!r} is outside [0, {self.manifest.max_draft}], the bundle's "
                              f"max_draft. ---> HINT: use a smaller k, or re-export with "
                              f"ssd-export --max-draft {k}.")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be a positive integer.")
