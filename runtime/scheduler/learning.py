"""What the adaptive schedule learns of a pair as it decodes (docs/design.md §6): `Acceptance`,
α with forgetting, refined by the draft's confidence and a token's place in its round; and
how often a source judged poor is tried again (the probes).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


_BINS = 10                        # tenths of the draft's top probability
_PRIOR_ROUNDS = 2.0               # α starts at 0.5 with the weight of a few rounds


def tenth(top: float) -> int:
    return min(int(top * _BINS), _BINS - 1)


_PLACES = 4                       # a token's place in its round: 1st, 2nd, 3rd-4th, later
# Where the plan stops drafting, α is no longer measured, so a pair's worth could go unseen
# (a plan made from a low first estimate never drafts again): every PROBE_EVERY rounds without
# drafting, a round drafts PROBE tokens, and each probe in a row with nothing accepted doubles
# the wait (up to 2^PROBE_BACKOFF times). On a draft that is never right a probe costs c₁ + c +
# v(2) - v(0), and the backoff keeps it to a few probes a sequence. An α that no round has
# measured yet (the export's estimate, or the prior) is probed at once: the export measured it
# on its own text, which may not be the requests', and a pair that pays would otherwise wait
# PROBE_EVERY rounds at k = 0 to be seen (docs/performance-notes.md §6, "Probes").
PROBE, PROBE_EVERY, PROBE_BACKOFF = 2, 16, 6


def _place(position: int) -> int:
    return 0 if position == 0 else 1 if position == 1 else 2 if position < 4 else 3


@dataclass
class Acceptance:
    """What the adaptive schedule learns about a pair as it decodes; a generator keeps one
    per decoding kind (greedy, sampled), so that each call starts from what the last saw.

    α is the maximum-likelihood estimate of a geometric acceptance process (accepted /
    (accepted + rejections)) with exponential forgetting. `chance(top)` is the acceptance
    rate of draft tokens whose top probability fell in the same tenth, shrunk towards α
    while that tenth has seen few tokens; `chance(top, position)` refines it by the token's
    place in its round (shrunk towards the tenth's rate): acceptance comes in runs, so a
    token of middling confidence that follows accepted ones is likelier to pass than the
    same confidence first in a round, and the stopping rule that reads `chance` drafts
    longer runs where they are likely to pass (figures: docs/performance-notes.md, "Figures
    from code comments").
    """

    decay: float = 0.9            # per round, for α
    bin_decay: float = 0.98       # per round, for the confidence tenths (they see fewer tokens)
    accepted: float = _PRIOR_ROUNDS
    rejected: float = _PRIOR_ROUNDS
    prior: float = 4.0            # tokens' worth of α each bin starts with
    place_prior: float = 8.0      # tokens' worth of the tenth's rate each (tenth, place) starts with
    # Counts per tenth and per (tenth, place), forgotten at bin_decay per round lazily: each
    # round's tokens count `scale` (which grows by 1/bin_decay a round) instead of every older
    # count being multiplied down, and they are plain floats, not numpy scalars. chance() runs
    # after every draft step and observe() after every round, both on caches the models have
    # just swept, where numpy's per-call overhead on arrays this small is dearer than the
    # arithmetic (docs/performance-notes.md, "Figures from code comments").
    hits: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    seen: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    place_hits: list[list[float]] = field(
        default_factory=lambda: [[0.0] * _PLACES for _ in range(_BINS)])
    place_seen: list[list[float]] = field(
        default_factory=lambda: [[0.0] * _PLACES for _ in range(_BINS)])
    scale: float = 1.0            # what one token counts this round (counts / scale: weights)
    misses: int = 0               # probes in a row that had nothing accepted (AdaptiveK)
    measured: bool = False        # whether a round has judged drafts (else α is an estimate)
    start: float = 0.5            # the α it started at, which `forget` drifts back towards

    @classmethod
    def starting_at(cls, alpha: float) -> Acceptance:
        """Knowing nothing but an estimate of α (the export's measured agreement of the pair:
        docs/design.md §6), with the prior's weight."""
        alpha = min(max(float(alpha), 0.01), 0.99)     # a measurement, not a certainty
        return cls(accepted=2 * _PRIOR_ROUNDS * alpha, rejected=2 * _PRIOR_ROUNDS * (1 - alpha),
                   start=alpha)

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def carried(self) -> Acceptance:
        """α alone, for a sequence that starts from what earlier ones of its kind saw (a
        batch's sequences learn on their own copies)."""
        return Acceptance(accepted=self.accepted, rejected=self.rejected,
                          measured=self.measured, start=self.start)

    def chance(self, top: float, position: int | None = None) -> float:
        """P(a draft token is accepted | its top probability [, its place in the round])."""
        return self.chance_in(tenth(top), position)

    def chance_in(self, b: int, position: int | None = None) -> float:
        """P(accepted | its class b [, its place]): a model token's class is the tenth of its
        top probability, a lookup token's the length of the n-gram it was found by."""
        scale = self.scale
        prior = self.prior * scale
        tenth = (self.hits[b] + prior * self.alpha) / (self.seen[b] + prior)
        if position is None:
            return tenth
        p, prior = _place(position), self.place_prior * scale
        return (self.place_hits[b][p] + prior * tenth) / (self.place_seen[b][p] + prior)

    def observe(self, drafted: int, accepted: int, tops: Sequence[float] = ()) -> None:
        """A round drafted `drafted` tokens (their top probabilities `tops`, where known) and
        the target accepted the first `accepted`."""
        self.observe_in(drafted, accepted, [tenth(top) for top in tops[:accepted + 1]])

    def observe_in(self, drafted: int, accepted: int, classes: Sequence[int] = (),
                   first_place: int = 0) -> None:
        """observe() with each token's class given (chance_in); `first_place`: the place in
        its round of the first of these tokens (a model draft after lookup tokens)."""
        if drafted == 0:      # nothing to learn (AdaptiveK probes where it stopped drafting)
            return
        self.measured = True
        self.accepted = self.decay * self.accepted + accepted
        self.rejected = self.decay * self.rejected + (1 if accepted < drafted else 0)
        judged = classes[:accepted + 1]               # the accepted ones, then the rejected one
        if not judged:
            return
        self.scale /= self.bin_decay
        if self.scale > 1e100:                        # after ~11,000 rounds: back to 1
            self._rescale()
        weight, hits, seen, place_hits, place_seen = \
            self.scale, self.hits, self.seen, self.place_hits, self.place_seen
        for i, b in enumerate(judged):
            p = _place(first_place + i)
            seen[b] += weight
            place_seen[b][p] += weight
            if i < accepted:
                hits[b] += weight
                place_hits[b][p] += weight

    def observe_run(self, drafted: int, accepted: int, b: int) -> None:
        """A run of `drafted` tokens of one class b (a lookup continuation, b its n-gram's
        length) of which the first `accepted` passed; a run with none accepted is a miss
        (`forget` slows down after misses)."""
        self.observe_in(drafted, min(accepted, drafted), [b] * min(accepted + 1, drafted))
        self.misses = 0 if accepted else self.misses + 1

    def forget(self, b: int | None = None) -> None:
        """A round in which this source could have drafted and was not asked to: α drifts
        back towards where it started (the prior's 0.5; a prediction's 0.9, the client's
        claim) and the tenths' counts age, so that a source judged poor is tried again —
        each try in a row with nothing accepted (`misses`) halving the pace. For lookup
        drafts (docs/design.md §6.1), whose worth is the text's, not the pair's, and whose
        tries cost only a longer verification. `b`: the class that was offered (one
        Acceptance learns every class alike; `Sources` ages the offering source's)."""
        rate = (1 - self.decay) / (1 << min(self.misses, PROBE_BACKOFF))
        self.accepted += rate * (2 * _PRIOR_ROUNDS * self.start - self.accepted)
        self.rejected += rate * (2 * _PRIOR_ROUNDS * (1 - self.start) - self.rejected)
        self.scale /= self.bin_decay ** (rate / (1 - self.decay))
        if self.scale > 1e100:
            self._rescale()

    def _rescale(self) -> None:
        s = self.scale
        self.hits = [h / s for h in self.hits]
        self.seen = [n / s for n in self.seen]
        self.place_hits = [[h / s for h in row] for row in self.place_hits]
        self.place_seen = [[n / s for n in row] for row in self.place_seen]
        self.scale = 1.0


@dataclass
class Sources:
    """What is learnt of lookup tokens when a request brings a prediction (docs/design.md
    §6.1): the sequence's own continuations (classes below `split`) and the prediction's (from
    `split` on, up to `end`), each in an Acceptance of its own, so that neither source's misses
    move the other's α — a repeat of the prompt that fails says nothing of the client's text,
    which starts at its claim (0.9) and is judged on its own tokens. Classes from `end` on,
    earlier requests' continuations, in `earlier` (from its own start) where given, else with
    the sequence's."""

    sequence: Acceptance
    prediction: Acceptance
    split: int
    end: int = _BINS
    earlier: Acceptance | None = None

    def of(self, b: int) -> Acceptance:
        if b >= self.end:
            return self.earlier or self.sequence
        return self.prediction if b >= self.split else self.sequence

    def chance_in(self, b: int, position: int | None = None) -> float:
        return self.of(b).chance_in(b, position)

    def observe_run(self, drafted: int, accepted: int, b: int) -> None:
        self.of(b).observe_run(drafted, accepted, b)

    def forget(self, b: int | None = None) -> None:
        self.of(b if b is not None else 0).forget()
