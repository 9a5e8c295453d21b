"""A feature-level draft head's side of the loop (EAGLE-3; docs/design.md §14).

The head drafts from what the target computed: its row at position t reads the target's
features h_t (the residual stream entering three of its layers, `aux_hidden`) beside the
embedding of token x_{t+1}, and predicts x_{t+2}; its later steps read its own previous
output (`hidden_out`) instead of h_t. So with the target's rows valid up to position n - 1 and
x_n pending, one head call over positions draft_len .. n - 1 (features) gives d1, and each
further call, one position on (its own hidden), one more draft:

    position   draft_len ... n-1 | n      n+1    ...
    token      x_{t+1} ..... x_n | d1     d2     ...
    reads      h_t (target)      | own hidden of the row before
    gives      .............. d1 | d2     d3     ...

After the verification only the rows fed by the target's features stay valid in the head's
cache (`fed_until`); the accepted positions are fed again, from the features the verification
has just computed.

`FeatureStore` keeps every slot's last CAPACITY positions of features: the target's session
hands each call's rows to it (`on_aux`), rejected ones too, which later calls overwrite; the
head reads its unread span [draft_len, target_len) from there. A head that falls more than
SLACK positions behind (k = 0 for a while, a long prompt) catches up before the ring would
overwrite what it has not read.
"""
from __future__ import annotations

import numpy as np

from .. import contract
from ..backends.base import ModelSession
from ..contract import PREFILL_CHUNK
from ..errors import ConfigError
from .drafting import Drafter, Schedule, call
from .lookup import Lookup
from .rules import Rule

CAPACITY = 2 * PREFILL_CHUNK        # positions of features kept per slot
SLACK = CAPACITY - PREFILL_CHUNK    # the most a head may lag when the target writes a chunk


class FeatureStore:
    """Per slot, a ring of the target's features by position: (slots, CAPACITY, width)."""

    def __init__(self, slots: int, width: int) -> None:
        self.rows = np.zeros((slots, CAPACITY, width), np.float32)

    def put(self, slot: int, position: int, rows: np.ndarray) -> None:
        at = (position + np.arange(len(rows))) % CAPACITY
        self.rows[slot, at] = rows

    def take(self, slot: int, position: int, n: int, out: np.ndarray) -> None:
        out[:] = self.rows[slot, (position + np.arange(n)) % CAPACITY]


def attach(target: ModelSession, head: ModelSession, slots: int) -> FeatureStore:
    """A store the target's calls fill, for a head that reads it; the sessions' widths must
    agree (the bundle's export checked this against the models; a mismatch is a bundle
    assembled by hand)."""
    aux = getattr(target, "extra_out", {}).get(contract.AUX_HIDDEN)
    features = getattr(head, "extra_in", {}).get(contract.FEATURES)
    if aux is None or features is None or aux.shape[1] != features.shape[1]:
        raise ConfigError(f"the bundle's draft is an EAGLE-3 head, but on the "
                          f"'{target.backend}' backend its target gives no {contract.AUX_HIDDEN}"
                          f" of the width the head reads. ---> HINT: re-export the pair with "
                          f"ssd-export --draft HEAD, or load it with backend='cpu' or 'cuda'.")
    store = FeatureStore(slots, aux.shape[1])
    target.on_aux = store.put
    return store


class HeadDrafter(Drafter):
    """One row's draft state for a feature-level head (the loop drives it as any drafter:
    `feed`, `fill`, `took`, `advance`, `settle`)."""

    extends_lookup = False      # a head cannot feed lookup tokens in one call: each needs
    #                             the hidden of the one before (a call per token)

    def __init__(self, draft: ModelSession, rule: Rule, schedule: Schedule,
                 vocab: tuple[int, int] | None, lookup: Lookup | None, slot: int,
                 store: FeatureStore) -> None:
        super().__init__(draft, rule, schedule, vocab, lookup, slot)
        self.store = store
        self.features = draft.extra_in[contract.FEATURES]
        self.hidden_in = draft.extra_in[contract.HIDDEN]
        self.hidden_out = draft.extra_out[contract.HIDDEN_OUT]
        self.hidden = np.zeros(self.hidden_in.shape[1], np.float32)   # its last hidden_out
        self.chained = False        # the next call reads `hidden`, not the target's features
        self.fed_until = 0          # rows up to here were fed by the target's features

    def feed(self, seq: list[int], drafts: list[int]) -> list[int]:
        return seq[self.draft_len + 1:] + drafts

    def start(self, seq: list[int], k: int) -> tuple[list[int], list, int]:
        self.chained = False
        self.fed_until = self.draft_len
        return super().start(seq, k)

    def fill(self, b: int, T: int, n: int) -> None:
        """This row's inputs of the next call, at rows b·T .. b·T + n - 1 of the buffers."""
        rows = slice(b * T, b * T + n)
        if self.chained:            # one token, fed the head's own last output
            self.features[rows] = 0.0
            self.hidden_in[rows] = self.hidden
        else:
            self.store.take(self.slot, self.draft_len, n, self.features[rows])
            self.hidden_in[rows] = 0.0
            self.fed_until = self.draft_len + n

    def took(self, b: int, T: int, last: int) -> None:
        self.hidden = self.hidden_out[b * T + last].copy()
        self.chained = True

    def advance(self, tokens: list[int]) -> None:
        """Rows fed by the target's features, their logits unused: a long catch-up in chunks."""
        for i in range(0, len(tokens), PREFILL_CHUNK):
            chunk = tokens[i:i + PREFILL_CHUNK]
            self.fill(0, len(chunk), len(chunk))
            call(self.draft.prefill, self.ids(chunk), self.draft_len, self.slot)
            self.draft_len += len(chunk)
        self.chained = False

    def catch_up(self, seq: list[int], target_len: int) -> None:
        """Feed every position the target has computed but the last (a round's first call
        takes that one, and its logits give d1)."""
        self.advance(seq[self.draft_len + 1:target_len])

    def synced_with(self, target_len: int) -> bool:
        return self.draft_len + 1 >= target_len

    def lagging(self, target_len: int) -> bool:
        return target_len - self.draft_len > SLACK

    def settle(self, target_len: int, accepted_all: bool, next_token: int) -> None:
        self.draft_len = min(self.draft_len, self.fed_until, target_len)
