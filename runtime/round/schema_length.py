"""The least number of tokens any output valid under a response_format's JSON schema takes: a
lower bound, so that a request whose max_tokens cannot hold it is refused up front (grammar.py,
docs/design.md §4). Never an example's length — an example only bounds the least from above,
and a refusal must be right for every output the grammar allows.

    pieces = TokenPieces.of(llguidance_tokenizer)      # once per tokenizer
    least = least_tokens(schema, pieces)               # ≤ the token count of every valid output

Two bounds, the larger taken (both hold for every valid output, so their maximum does):
- bytes: the JSON text has at least `least_bytes` bytes (required properties, minLength,
  minItems, const/enum), and no token is longer than the tokenizer's longest;
- fixed text: each required property name appears as `"name":` (llguidance spells a property
  name literally, compact JSON puts the colon right after it), and the tokens overlapping it
  are at least `cover(text)`: the first may start before it (a suffix of a token), the last
  may run past it (a prefix), those between are whole tokens. Two such texts share at most the
  one token that spans the gap between them, so m texts take at least Σ cover − (m − 1).
A keyword not modelled here only makes the bound smaller (the set of valid outputs it bounds
grows), never wrong; a schema carrying llguidance's own options ("x-guidance") gets 1.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Iterable

ANY_VALUE = (1, 0)      # (bytes, fixed-text tokens beyond one) of a value nothing is known of
TYPE_BYTES = {"integer": 1, "number": 1, "boolean": 4, "null": 4}   # "0", "true", "null"


@dataclass(frozen=True)
class TokenPieces:
    """A tokenizer's tokens as bytes, sorted forwards and reversed: what `cover` looks up."""

    tokens: frozenset[bytes]
    forwards: tuple[bytes, ...]       # sorted: is a text some token's prefix?
    backwards: tuple[bytes, ...]      # each token reversed, sorted: ... some token's suffix?
    inside: tuple[bytes, ...]         # every token's every suffix, sorted: ... inside a token?
    longest: int                      # bytes of the longest token

    @staticmethod
    def of(tokenizer: Any) -> TokenPieces:
        """From llguidance's tokenizer (the bytes its matcher sees); special tokens are kept,
        which can only lower the bound. Decodes every token once: the caller builds it once
        per tokenizer."""
        return TokenPieces.of_bytes(tokenizer.decode_bytes([i])
                                    for i in range(tokenizer.vocab_size))

    @staticmethod
    def of_bytes(tokens: Iterable[bytes]) -> TokenPieces:
        found = set(tokens) - {b""}
        return TokenPieces(frozenset(found), tuple(sorted(found)),
                           tuple(sorted(t[::-1] for t in found)),
                           tuple(sorted({t[i:] for t in found for i in range(len(t))})),
                           max(map(len, found)))

    def cover(self, text: bytes) -> int:
        """The least number of tokens that overlap `text` wherever it stands in an output."""
        if _starts(self.inside, text):              # inside one token
            return 1
        n = len(text)
        # first[j]: tokens covering text[:j] exactly, the first one possibly starting before it
        first = [math.inf] * (n + 1)
        for j in range(1, n + 1):
            if _starts(self.backwards, text[:j][::-1]):
                first[j] = 1
            for i in range(max(1, j - self.longest), j):
                if first[i] + 1 < first[j] and text[i:j] in self.tokens:
                    first[j] = first[i] + 1
        ends = [first[i] + 1 for i in range(1, n) if _starts(self.forwards, text[i:])]
        least = min([first[n], *ends])
        return 1 if least == math.inf else int(least)


def least_tokens(schema: Any, pieces: TokenPieces) -> int:
    """A lower bound on the tokens of every output valid under `schema` (EOS not counted)."""
    if isinstance(schema, dict) and "x-guidance" in schema:
        return 1
    size, fixed = _Bound(schema, pieces).of(schema, frozenset())
    return max(1 + fixed, math.ceil(size / pieces.longest), 1)


class _Bound:
    """(bytes, Σ (cover − 1) over the fixed texts) of a (sub)schema, both least over its
    valid values: alternatives take the least of each, conjunctions the most."""

    def __init__(self, root: Any, pieces: TokenPieces) -> None:
        self.root, self.pieces = root, pieces
        self.refs: dict[str, tuple[int, int]] = {}   # a $ref's bound, worked out once

    def of(self, schema: Any, seen: frozenset[str]) -> tuple[int, int]:
        if not isinstance(schema, dict):          # true, false, or not a schema
            return ANY_VALUE
        bounds = [self._typed(schema, seen)]
        if "const" in schema:
            bounds.append((_value_bytes(schema["const"]), 0))
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            bounds.append((min(map(_value_bytes, schema["enum"])), 0))
        for branch in _schemas(schema.get("allOf")):
            bounds.append(self.of(branch, seen))
        for key in ("anyOf", "oneOf"):
            branches = [self.of(b, seen) for b in _schemas(schema.get(key))]
            if branches:
                bounds.append((min(b[0] for b in branches), min(b[1] for b in branches)))
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref not in seen:      # a recursive $ref: nothing more
            if ref not in self.refs:     # cut where it recurses, still a bound: kept
                self.refs[ref] = self.of(_resolve(self.root, ref), seen | {ref})
            bounds.append(self.refs[ref])
        return max(b[0] for b in bounds), max(b[1] for b in bounds)

    def _typed(self, schema: dict, seen: frozenset[str]) -> tuple[int, int]:
        """The least over the types the schema allows (all, where it names none)."""
        kinds = schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) \
            else ["object", "array", "string", "integer", "number", "boolean", "null"]
        bounds = [self._of_type(kind, schema, seen) for kind in kinds]
        return (min(b[0] for b in bounds), min(b[1] for b in bounds)) if bounds else ANY_VALUE

    def _of_type(self, kind: Any, schema: dict, seen: frozenset[str]) -> tuple[int, int]:
        if kind == "string":
            return 2 + _count(schema.get("minLength")), 0     # a character is ≥ 1 byte
        if kind == "object":
            return self._object(schema, seen)
        if kind == "array":
            return self._array(schema, seen)
        return TYPE_BYTES.get(kind, 1), 0

    def _object(self, schema: dict, seen: frozenset[str]) -> tuple[int, int]:
        """{"a":A,"b":B}: braces, each required name, colon and value, commas between."""
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        names = schema.get("required") if isinstance(schema.get("required"), list) else []
        names = list(dict.fromkeys(n for n in names if isinstance(n, str)))
        size, fixed = 2 + max(len(names) - 1, 0), 0
        for name in names:
            value = self.of(props[name], seen) if name in props else ANY_VALUE
            size += _value_bytes(name) + 1 + value[0]
            fixed += value[1]
            if name in props and _plain(name):      # spelt literally by llguidance
                fixed += self.pieces.cover(f'"{name}":'.encode()) - 1
        return size, fixed

    def _array(self, schema: dict, seen: frozenset[str]) -> tuple[int, int]:
        """[a,b,...]: brackets, the first minItems items, commas between."""
        count = _count(schema.get("minItems"))
        prefix = schema.get("prefixItems", schema.get("items"))
        prefix = prefix if isinstance(prefix, list) else []
        rest = schema.get("items") if isinstance(schema.get("items"), dict) else True
        items = [self.of(prefix[i] if i < len(prefix) else rest, seen) for i in range(count)]
        return (2 + max(count - 1, 0) + sum(i[0] for i in items), sum(i[1] for i in items))


def _value_bytes(value: Any) -> int:
    """The least bytes of a JSON value's text: a string's characters unescaped where they may
    be (an escape is ≥ 2 bytes), a number as 1 (1e6 is shorter than 1000000)."""
    if isinstance(value, str):
        return 2 + sum(2 if c in '"\\' or c < " " else len(c.encode()) for c in value)
    if isinstance(value, bool):
        return 4 if value else 5
    if value is None:
        return 4
    if isinstance(value, list):
        return 2 + max(len(value) - 1, 0) + sum(map(_value_bytes, value))
    if isinstance(value, dict):
        return 2 + max(len(value) - 1, 0) + sum(_value_bytes(str(k)) + 1 + _value_bytes(v)
                                                for k, v in value.items())
    return 1


def _plain(name: str) -> bool:
    """Printable ASCII that JSON never escapes: the name's text is exactly `"name"`."""
    return all(" " <= c <= "~" and c not in '"\\' for c in name)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _schemas(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _resolve(root: Any, ref: str) -> Any:
    """A local $ref ("#/$defs/x"); anything else resolves to nothing known (True)."""
    if not ref.startswith("#"):
        return True
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return True
    return node


def _starts(ordered: tuple[bytes, ...], text: bytes) -> bool:
    """Whether some entry of the sorted `ordered` starts with `text`."""
    i = bisect.bisect_left(ordered, text)
    return i < len(ordered) and ordered[i].startswith(text)
