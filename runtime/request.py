"""One sequence to decode and what comes of it: `Request` (its prompt ids, rule and settings,
checked by Generator.request) and `GenerationResult`; the checks of the settings every
request shares. The engine (batch.py) decodes requests into results.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from .errors import ConfigError
from .round.acceptance import GreedyAcceptance, InvariantSampling, SamplingAcceptance
from .round.grammar import Constraint
from .round.heads import FusedGreedyAcceptance, FusedSamplingAcceptance, HeadSessions
from .round.lookup import Lookup, Prediction
from .round.logprobs import Logprobs, TokenLogprob
from .round.loop import Stats
from .round.processors import Processors
from .round.rules import Rule
from .round.sampling import SamplingParams
from .round.suffix import SuffixView

Mode = Literal["sequential", "split"]


@dataclass
class GenerationResult:
    token_ids: list[int]      # generated ids only, not the prompt
    text: str
    stop_reason: str          # "eos" | "length" | "context" | "stop" | "error" (batches only)
    stats: Stats
    error: str | None = None  # generate_batch: why this prompt was refused (the others ran)
    logprobs: list[TokenLogprob] | None = None   # the target's, one per token id, when asked


@dataclass
class Request:
    """One sequence to decode: its prompt ids, rule and settings, checked (Generator.request)."""

    ids: list[int]
    rule: Rule                # acceptance.GreedyAcceptance | SamplingAcceptance | ... (make_rule)
    eos_ids: set[int]
    max_new_tokens: int
    k: int | str
    stop: list[str]
    mode: Mode
    kind: str                 # "greedy" | "sampled" | "invariant": what acceptance is learnt for
    source: str = "fused"     # lookup.DRAFT_SOURCES: who drafts
    prediction: list[int] | None = None   # the predicted output's ids (OpenAI's `prediction`)
    logprobs: Logprobs | None = None      # collects the target's log-probabilities, if asked
    tenant: str | None = None             # who asked (ssd-serve: its API key's id, serve/keys.py;
                                          # None without keys): the scope of what requests share
    earlier: SuffixView | None = None     # sources "suffix", "fused+suffix": its tenant's
                                          # earlier requests (round/suffix.py)

    def kept(self, token_ids: list[int]) -> list[TokenLogprob] | None:
        """The log-probabilities of the tokens the result keeps (a stop string trims them)."""
        return None if self.logprobs is None else self.logprobs.tokens[:len(token_ids)]

    def lookup(self) -> Lookup | None:
        """Its lookup source (docs/design.md §6.1): the sequence's own earlier text unless the
        draft model drafts alone, the prediction whenever there is one, and earlier requests'
        text under source "suffix"."""
        if self.source == "model" and self.prediction is None:
            return None
        prediction = None if self.prediction is None else \
            Prediction(self.prediction, len(self.ids))
        return Lookup(prediction=prediction, sequence=self.source != "model",
                      earlier=self.earlier)


def check_k(k: int | str, max_draft: int) -> None:
    """k is "auto" or an int in [0, max_draft] (the bundle's): else a ConfigError naming it."""
    if k == "auto":
        return
    if not isinstance(k, int) or isinstance(k, bool) or k < 0 or k > max_draft:
        above = isinstance(k, int) and not isinstance(k, bool) and k > 0
        raise ConfigError(f"k={k!r} is outside [0, {max_draft}], the bundle's max_draft, and is "
                          f"not 'auto'. ---> HINT: use k='auto' or a k in that range"
                          + (f", or re-export with ssd-export --max-draft {k}." if above
                             else "."))


def check_settings(k: int | str, max_draft: int, max_new_tokens: int,
                   stop: Sequence[str] | None) -> None:
    """k (check_k), a positive max_new_tokens and a list of stop strings, or a ConfigError."""
    check_k(k, max_draft)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) \
            or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} must be a positive integer.")
    if stop is not None and (isinstance(stop, str) or
                             not all(isinstance(s, str) for s in stop)):
        raise ConfigError(f"stop={stop!r} must be a list of strings.")


def make_rule(params: SamplingParams, heads: HeadSessions | None = None,
              prompt: list[int] = (), vocab: int = 0, eos_ids: set[int] = frozenset(),
              constraint: Constraint | None = None, forced: bool = True) -> Rule:
    """The host rule, or the same rule on the bundle's ONNX heads when `heads` is given (the
    heads have no logits processors and no invariant coupling: with penalties, a bias, a
    minimum length, a response_format or a seeded invariant run the host decides).
    `forced=False`: the grammar names no forced tokens to draft (grammar.Matcher.forced)."""
    if heads is None or params.processed or params.invariant or constraint is not None:
        processors = Processors(params, list(prompt), vocab, eos_ids) \
            if params.processed or constraint is not None else None
        if constraint is not None:
            processors.matcher = constraint.matcher(forced)
        if params.greedy:
            return GreedyAcceptance(processors)
        if params.invariant:
            return InvariantSampling(params, processors, vocab)
        return SamplingAcceptance(params, processors)
    return FusedGreedyAcceptance(heads) if params.greedy else FusedSamplingAcceptance(heads, params)
