"""One sequence to decode and what comes of it: `Request` (its prompt ids, rule and settings,
checked by Generator.request) and `GenerationResult`. The generator and a batch both decode
requests into results; both take these from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .round.lookup import Lookup, Prediction
from .round.logprobs import Logprobs, TokenLogprob
from .round.loop import Stats
from .round.rules import Rule

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

    def kept(self, token_ids: list[int]) -> list[TokenLogprob] | None:
        """The log-probabilities of the tokens the result keeps (a stop string trims them)."""
        return None if self.logprobs is None else self.logprobs.tokens[:len(token_ids)]

    def lookup(self) -> Lookup | None:
        """Its lookup source (docs/design.md §6.1): the sequence's own earlier text unless the
        draft model drafts alone, and the prediction whenever there is one."""
        if self.source == "model" and self.prediction is None:
            return None
        prediction = None if self.prediction is None else \
            Prediction(self.prediction, len(self.ids))
        return Lookup(prediction=prediction, sequence=self.source != "model")
