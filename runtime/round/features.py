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
    # head trees (design §14, "Head trees"): as a model draft's (Drafter.tree_shape, the
    # schedule's planned tree), each node drafted by head_step instead of a chain call

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

    def node_step(self, seq: list[int]):
        """A tree's nodes drafted by the head (head_step), not by chain calls."""
        return head_step(self, seq)

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


def head_step(drafter: HeadDrafter, seq: list[int]):
    """A `step` for tree_draft.expand drafted by a feature-level head (docs/design.md §14,
    "Head trees"): a node at depth d sits at the head's position P + d (P = len(seq) - 2, the
    root's row, fed the target's features as a chain's first call) and reads its parent's
    hidden_out. The head's graph has no tree mask; instead each node is one one-row call whose
    keys are the committed rows and the rows P + 1 .. P + d - 1, which hold its ancestors: the
    step keeps what those scratch rows hold and rewrites the ones another branch overwrote
    (from the ancestor's parent's hidden_out, kept per node) before it feeds a node. Siblings
    share their ancestors, so a level costs one call per expanded node, plus one per ancestor
    that differs from the last branch's (design §6: the draft's rows past the root are
    scratch; the next round feeds the accepted positions from the target's features)."""
    root = len(seq) - 2                        # the root's row: x_n after h_{n-1}
    if drafter.draft_len > root + 1:
        raise ValueError(f"head_step: the head has fed {drafter.draft_len} rows, past the "
                         f"root's ({root}); start a round with settle() done.")
    drafter.draft_len = min(drafter.draft_len, root)     # the root's row fed again: its hidden
    hidden: dict[int, np.ndarray] = {}         # node -> its row's hidden_out
    holds: list[int] = []                      # holds[j - 1]: the node in row root + j

    def one(token: int, position: int, parent: int) -> np.ndarray:
        drafter.hidden, drafter.chained = hidden[parent], True
        drafter.fill(0, 1, 1)
        logits = call(drafter.draft.forward, drafter.ids([token]), position, drafter.slot)
        drafter.took(0, 1, 0)
        drafter.draft_calls += 1
        return np.array(logits[-1], np.float32)

    def step(tree, nodes: list[int]) -> np.ndarray:
        rows = []
        for u in nodes:
            if u == 0:                         # the target's features: the unread rows
                tokens = seq[drafter.draft_len + 1:]
                if len(tokens) > drafter.draft.max_new_len:   # far behind: a prefill first
                    drafter.advance(tokens[:-1])
                    tokens = tokens[-1:]
                drafter.chained = False
                drafter.fill(0, len(tokens), len(tokens))
                logits = call(drafter.draft.forward, drafter.ids(tokens), drafter.draft_len,
                              drafter.slot)
                drafter.took(0, len(tokens), len(tokens) - 1)
                drafter.draft_calls += 1
                drafter.draft_len = root + 1
                hidden[0] = drafter.hidden.copy()
                rows.append(np.array(logits[-1], np.float32))
                continue
            path = tree.path(u)[1:]            # u's nodes after the root, u last
            for j, a in enumerate(path[:-1], 1):
                if len(holds) < j or holds[j - 1] != a:    # another branch's row: rewrite it
                    one(int(tree.tokens[a]), root + j, int(tree.parents[a]))
                    del holds[j - 1:]
                    holds.append(a)
            rows.append(one(int(tree.tokens[u]), root + len(path), int(tree.parents[u])))
            hidden[u] = drafter.hidden.copy()
            del holds[len(path) - 1:]
            holds.append(u)
        return np.stack(rows)[:, :drafter.cut]                           # (len(nodes), V)
    return step
