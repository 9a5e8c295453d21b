"""Structured outputs: OpenAI's `response_format` as a token mask (llguidance), a logits processor.

    constraint = Constraint.compile(response_format, tokenizer, vocab, pieces)   # checked
    rule = make_rule(params, ..., constraint=constraint)     # its processors hold a Matcher

The mask is applied where every other logits processor is (processors.py): to each draft
proposal and to each row of the target's verification, as if the round's pending tokens had
been emitted — the matcher consumes them, computes the mask, and rolls them back; committed
tokens are consumed for good. So the constrained speculative output is the constrained target
alone's: greedy the same tokens, sampling from the masked, renormalised distribution (the rules
are unchanged). Where the grammar leaves one tokenization only (a key, `":`, a brace), the
matcher names those tokens (`forced`: llguidance's fast-forward tokens) and the round drafts them
for free (drafting.py, docs/design.md §4). llguidance's core is Rust and needs no PyTorch;
imported only when a request asks for a format.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .schema_length import TokenPieces, least_tokens

FORMATS = ("text", "json_object", "json_schema")
# Compact JSON: no whitespace between tokens of the grammar (a model free to add whitespace
# can loop in it until max_tokens, and the output would not parse).
JSON_OPTIONS = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Constraint:
    """A checked grammar for one tokenizer; `matcher()` starts a sequence's own matcher."""

    grammar: str
    tokenizer: Any            # llguidance.LLTokenizer
    vocab: int                # the logits' width (ids past the tokenizer's are never allowed)
    name: str                 # what the client asked for, for messages
    least_tokens: int = 1     # no valid output is shorter (schema_length.py)

    @staticmethod
    def compile(response_format: Any, tokenizer: Any, vocab: int,
                pieces: TokenPieces | None = None) -> Constraint | None:
        """OpenAI's response_format (a dict) -> a Constraint, None for text; a ConfigError
        naming `response_format` for what is malformed, unsupported or not a valid schema.
        With the tokenizer's `pieces`, it knows the least tokens of any output it allows."""
        import llguidance

        if not isinstance(response_format, dict) or response_format.get("type") not in FORMATS:
            raise ConfigError(f"response_format must be an object whose type is one of "
                              f"{', '.join(FORMATS)}; got {_shown(response_format)}.")
        kind = response_format["type"]
        if kind == "text":
            return None
        if kind == "json_object":
            schema, name = {"type": "object"}, "json_object"
        else:
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise ConfigError("response_format.json_schema must be an object with a 'name' "
                                  "(string) and a 'schema' (a JSON schema object); got "
                                  f"{_shown(spec)}.")
            schema = spec.get("schema", {})
            if not isinstance(schema, dict):
                raise ConfigError(f"response_format.json_schema.schema must be a JSON schema "
                                  f"object; got {_shown(schema)}.")
            name = f"json_schema {spec['name']!r}"
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema,
                                                                    overrides=JSON_OPTIONS)
        except ValueError as exc:
            raise ConfigError(f"response_format: {name} is not a JSON schema llguidance "
                              f"takes: {exc}") from None
        problem = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if problem and not problem.startswith("WARNING"):
            raise ConfigError(f"response_format: {name} cannot be used: {problem}. ---> HINT: "
                              f"check the schema (llguidance's supported JSON schema subset).")
        least = 1 if pieces is None else least_tokens(schema, pieces)
        return Constraint(grammar, tokenizer, vocab, name, least)

    def check_room(self, max_new_tokens: int) -> None:
        """A ConfigError naming response_format and max_tokens where no output valid under the
        grammar fits in `max_new_tokens` (the bound is a lower one: never a false refusal)."""
        if self.least_tokens > max_new_tokens:
            raise ConfigError(
                f"response_format: no output valid under {self.name} is shorter than "
                f"{self.least_tokens} tokens (a bound from its required properties and least "
                f"sizes), so max_tokens={max_new_tokens} (max_new_tokens) can never hold a "
                f"complete one. ---> HINT: raise max_tokens to at least {self.least_tokens} (a "
                f"whole answer usually needs more), or loosen the schema (fewer or shorter "
                f"required properties).")

    def matcher(self, forcing: bool = True) -> Matcher:
        """A sequence's own matcher; `forcing=False` names no forced tokens (the comparison
        with constrained decoding that drafts none of them)."""
        import llguidance

        return Matcher(llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0), self,
                       forcing)


class Matcher:
    """One sequence's place in the grammar: `commit` consumes emitted tokens for good; `allowed`
    is the mask after `pending` (this round's unjudged tokens), which it rolls back; `forced`
    the tokens the grammar forces after the committed ones."""

    def __init__(self, matcher: Any, constraint: Constraint, forcing: bool = True) -> None:
        self.matcher, self.constraint, self.forcing = matcher, constraint, forcing
        self.size = constraint.tokenizer.vocab_size        # the mask's ids

    def commit(self, tokens: list[int]) -> None:
        # an EOS after the grammar is complete ends the sequence; anything else was allowed
        self.matcher.consume_tokens(list(tokens))

    def allowed(self, n: int, pending: list[int] = ()) -> np.ndarray | None:
        """(n,) bool: the ids allowed next after `pending`; None where a pending token is not
        allowed (a draft the target rejects at its own row, so this row is never judged)."""
        taken = self.matcher.try_consume_tokens(list(pending)) if pending else 0
        try:
            if taken < len(pending) or self.matcher.is_error():
                return None
            bits = np.frombuffer(self.matcher.compute_bitmask(), np.uint8)
            mask = np.unpackbits(bits, bitorder="little")[:min(n, self.size)].astype(bool)
            return mask if len(mask) == n else np.pad(mask, (0, n - len(mask)))
        finally:
            if taken:
                self.matcher.rollback(taken)

    def forced(self, limit: int, pending: list[int] = ()) -> list[int]:
        """Up to `limit` tokens the grammar forces after `pending` (rolled back, as in
        `allowed`): llguidance's fast-forward tokens, the canonical tokenization of the bytes
        it forces, less any last token that a longer one could span (llguidance's
        docs/fast_forward.md), which its mask then allows alone at each place. The round
        still judges them as drafts (docs/design.md §4), so the output never rests on that:
        a forced token the target did not take would be rejected."""
        if not self.forcing or limit <= 0:
            return []
        taken = self.matcher.try_consume_tokens(list(pending)) if pending else 0
        try:
            if taken < len(pending) or self.matcher.is_error():
                return []
            return list(self.matcher.compute_ff_tokens()[:limit])
        finally:
            if taken:
                self.matcher.rollback(taken)

    @property
    def error(self) -> str:
        return self.matcher.get_error()


def tokenizer_for(tokenizer_json: str, vocab: int, eos_ids: list[int]) -> Any:
    """llguidance's tokenizer from the bundle's tokenizer.json (the Rust tokenizers format);
    a ConfigError naming `response_format` where llguidance cannot take it."""
    try:
        import llguidance
    except ImportError:
        raise ConfigError("response_format needs llguidance, which is not installed. "
                          "---> HINT: pip install llguidance (or '.[structured]').") from None
    try:
        return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos_ids)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"response_format: this bundle's tokenizer cannot be used for "
                          f"constrained decoding ({exc}).") from None


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str, int, float, bool)) \
        or value is None else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
