"""Acceptance rules: how draft tokens are picked and how the target judges them.

Greedy and sampling differ only here (CONTRIBUTING.md, house style 3): the loop calls
`draft_pick` for each draft step and `verify` once per round (`verify_tree` for a draft tree,
tree_rules.py). Sampling
follows Leviathan et al. / Chen et al. and leaves the target's distribution
exactly unchanged.
"""
from __future__ import annotations

import numpy as np

from .processors import Processors
from .rules import Rule, leading_agreement, random_streams
from .sampling import (GumbelNoise, SamplingParams, gumbel_pick, position_uniform,
                       probabilities, sample)
from .tree import Tree
from .tree_draft import race_noise, top_candidates
from .tree_rules import fit, reject, walk


class GreedyAcceptance(Rule):
    """Accept the longest prefix on which the draft agrees with the target's argmax (of the
    processed logits, with `processors`)."""

    def __init__(self, processors: Processors | None = None) -> None:
        self.processors = processors

    def draft_pick(self, logits: np.ndarray, position: int,
                   top: tuple[int, float] | None = None, pending: list[int] = ()
                   ) -> tuple[int, None]:
        """The last row's argmax (logits: (new_len, vocab)); the graph's own when it has one.
        `pending`: this round's tokens before this one, not yet judged (for the processors)."""
        if self.processors is not None:
            return int(np.argmax(self.processors.apply(logits[-1], pending))), None
        return (top[0] if top is not None else int(np.argmax(logits[-1]))), None

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list[np.ndarray | None], position: int) -> tuple[int, int]:
        """target_logits: (k+1, vocab), row j for the token at `position` + j. Returns
        (accepted j, next token t)."""
        if self.processors is None:
            return leading_agreement(drafts, np.argmax(target_logits, axis=-1))
        return self._agreement(target_logits, drafts, position)

    def verify_tree(self, target_logits: np.ndarray, tree: Tree, draft_probs: list,
                    position: int) -> tuple[list[int], int]:
        """target_logits: (N, vocab), row i for the token after node i (at `position` +
        depth[i]). Walks the tree along the target's choice (tree_rules.walk): the tokens of
        k = 0. Returns (accepted nodes after the root, next token t)."""
        if self.processors is None:
            choices = np.argmax(target_logits, axis=-1)                      # (N,)
            return walk(tree, lambda i: int(choices[i]))
        return self._walk(target_logits, tree, position)

    def _walk(self, target_logits: np.ndarray, tree: Tree, position: int
              ) -> tuple[list[int], int]:
        """Node i's row is processed as if its path's drafts had been emitted."""
        return walk(tree, lambda i: self._choose(target_logits[i], tree.pending(i),
                                                 position + int(tree.depth[i])))

    def _agreement(self, target_logits: np.ndarray, drafts: list[int], position: int
                   ) -> tuple[int, int]:
        for j in range(len(drafts) + 1):     # row j follows drafts[:j]; stop at a disagreement
            t = self._choose(target_logits[j], drafts[:j], position + j)
            if j == len(drafts) or drafts[j] != t:
                return j, t

    def _choose(self, row: np.ndarray, pending: list[int], position: int) -> int:
        return int(np.argmax(self._processed(row, pending)))


class InvariantSampling(GreedyAcceptance):
    """Sampling whose tokens do not depend on the draft: the token at each position is the
    Gumbel-max sample of the target's processed distribution with noise keyed by (seed,
    position, token id) — an exact sample of p — and the draft proposes its own Gumbel-max
    under the same noise; a draft is accepted when it equals the target's token, as in
    greedy. So a seed gives the target alone's tokens (k = 0) whatever k, mode, draft or
    backend ("drafter-invariant speculative decoding", Daliri et al. 2024). The draft's token
    matches with probability at least (1 - TV)/(1 + TV), against 1 - TV for the rejection
    rule (figures: docs/runtime.md, "What the loop does")."""

    def __init__(self, params: SamplingParams, processors: Processors | None = None,
                 vocab: int = 0) -> None:
        self.params, self.processors = params, processors
        key = np.random.SeedSequence(params.seed).spawn(3)[2].generate_state(1, np.uint64)[0]
        self.noise = GumbelNoise(int(key), vocab)

    def draft_pick(self, logits: np.ndarray, position: int,
                   top: tuple[int, float] | None = None, pending: list[int] = ()
                   ) -> tuple[int, None]:
        return self._choose(logits[-1], pending, position), None

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list[np.ndarray | None], position: int) -> tuple[int, int]:
        return self._agreement(target_logits, drafts, position)

    def verify_tree(self, target_logits: np.ndarray, tree: Tree, draft_probs: list,
                    position: int) -> tuple[list[int], int]:
        """The walk along the target's Gumbel-max token at each node's position."""
        return self._walk(target_logits, tree, position)

    def draft_candidates(self, row: np.ndarray, count: int, position: int,
                         pending: list[int] = (), node: int = 0, sampled: bool = False
                         ) -> tuple[list[int], np.ndarray, None]:
        """The draft's Gumbel-top-`count` under the position's shared noise: its first is the
        chain's draft token, the others the next likeliest to be the target's own sample."""
        q = probabilities(self._processed(np.asarray(row), list(pending)), self.params)
        tokens = top_candidates(q / self.noise.at(position, len(q)), q, count)
        return tokens, q[tokens], None

    def _choose(self, row: np.ndarray, pending: list[int], position: int) -> int:
        return gumbel_pick(probabilities(self._processed(row, pending), self.params), self.noise,
                           position)


class SamplingAcceptance(Rule):
    """Speculative sampling: accept x with probability min(1, p(x)/q(x)); at the first
    rejection sample from normalise(max(0, p - q)); after k acceptances sample from p. A
    lookup token (q None) was proposed with certainty: q is a point mass at it, so it is
    accepted with probability p(x) and a rejection samples p without x (docs/design.md §6.1)."""

    def __init__(self, params: SamplingParams, processors: Processors | None = None) -> None:
        self.params, self.processors = params, processors
        self.draft_key, self.verify_rng = random_streams(params.seed)

    def draft_pick(self, logits: np.ndarray, position: int,
                   top: tuple[int, float] | None = None, pending: list[int] = ()
                   ) -> tuple[int, np.ndarray]:
        """Sample the draft token for `position` from q (the last row's distribution)."""
        q = probabilities(self._processed(logits[-1], pending), self.params)   # (vocab_draft,)
        return sample(q, position_uniform(self.draft_key, position)), q

    def draft_candidates(self, row: np.ndarray, count: int, position: int,
                         pending: list[int] = (), node: int = 0, sampled: bool = False
                         ) -> tuple[list[int], np.ndarray, np.ndarray]:
        """`sampled`: `count` tokens sampled from q without replacement (exponential races
        keyed by the seed, `position` and the parent `node`), and q: the verdict's r for each.
        Else q's top-`count`, point masses (q None)."""
        q = probabilities(self._processed(np.asarray(row), list(pending)), self.params)
        if not sampled:
            tokens = top_candidates(q, q, count)
            return tokens, q[tokens], None
        tokens = top_candidates(q / race_noise(self.draft_key, position, node, len(q)), q, count)
        return tokens, q[tokens], q

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list[np.ndarray], position: int) -> tuple[int, int]:
        k = len(drafts)
        accept_u = self.verify_rng.random(k)            # one uniform per draft token
        final_u = self.verify_rng.random()              # for the correction or the bonus
        return self.decide(target_logits, drafts, draft_probs, accept_u, final_u)

    def verify_tree(self, target_logits: np.ndarray, tree: Tree, draft_probs: list,
                    position: int) -> tuple[list[int], int]:
        """Recursive rejection over each node's children (tree_rules.reject); one uniform per
        draft node and one for the final token, drawn whatever the outcome (a chain draws what
        `verify` draws, and decides the same)."""
        accept_u = self.verify_rng.random(len(tree) - 1)     # node i's is accept_u[i - 1]
        final_u = self.verify_rng.random()
        return self.decide_tree(target_logits, tree, draft_probs, accept_u, final_u)

    def decide_tree(self, target_logits: np.ndarray, tree: Tree, draft_probs: list,
                    accept_u: np.ndarray, final_u: float) -> tuple[list[int], int]:
        """The tree rule itself, from given uniforms."""
        return reject(tree, lambda i: probabilities(
            self._processed(target_logits[i], tree.pending(i)), self.params),
            draft_probs, accept_u, final_u)

    def decide(self, target_logits: np.ndarray, drafts: list[int], draft_probs: list[np.ndarray],
               accept_u: np.ndarray, final_u: float) -> tuple[int, int]:
        """The rule itself, from given uniforms (so fused heads can be checked against it)."""
        for j, (x, q) in enumerate(zip(drafts, draft_probs)):
            p = probabilities(self._processed(target_logits[j], drafts[:j]), self.params)
            if q is None:                               # a lookup token: q is a point mass at x
                if accept_u[j] < p[x]:                  # u < p(x)/1
                    continue
                residual = p.copy()                     # max(0, p - q): p without x
                residual[x] = 0.0
                return j, sample(residual if residual.sum() > 0 else p, final_u)
            q = fit(q, len(p))
            if x < len(p) and accept_u[j] * q[x] < p[x]:   # u < p(x)/q(x), without dividing
                continue
            residual = np.maximum(p - q, 0.0)           # normalise(max(0, p - q))
            if residual.sum() <= 0:                     # p == q: rejection has probability 0
                residual = p
            return j, sample(residual, final_u)
        p = probabilities(self._processed(target_logits[len(drafts)], drafts), self.params)
        return len(drafts), sample(p, final_u)

