"""Exact acceptance over a draft tree (round/tree_rules.py, each rule's verify_tree).

The target here is a table of logits per context on a small vocabulary (what a model's rows
are: one distribution per prefix), so every tree's rows can be read off it and the target
alone's tokens and joint law are known exactly. The rules are the runtime's own. Greedy and
the invariant coupling must give k = 0's tokens; rejection must give the target's joint law
for adversarial drafts (chi-square over seeded trials) and fail for a wrong rule; a chain tree
must decide what `verify` decides from the same seed.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from ssd_runtime.round.acceptance import GreedyAcceptance, InvariantSampling, SamplingAcceptance
from ssd_runtime.round.processors import Processors
from ssd_runtime.round.sampling import SamplingParams, probabilities, sample
from ssd_runtime.round.tree import Tree

V = 5
PROMPT = (0, 3)


def target_logits(context: tuple[int, ...]) -> np.ndarray:
    """The target's logits (V,) after `context`: fixed per context, peaked enough to matter."""
    rng = np.random.default_rng([7, len(context), *context])
    return (rng.normal(0, 1.5, V)).astype(np.float32)


def rows(tree: Tree, context: tuple[int, ...]) -> np.ndarray:
    """The verification's rows (N, V): node i's row follows the context and its path."""
    return np.stack([target_logits(context + tuple(tree.pending(i))) for i in range(len(tree))])


def random_tree(rng, context, depth=3, siblings=3, hit=None) -> Tree:
    """A tree of `siblings` children per node down to `depth` (each node's tokens distinct),
    with the branch `hit` (a token list the target would choose) included when given."""
    paths = []
    for _ in range(siblings ** depth):
        paths.append([int(t) for t in rng.integers(0, V, rng.integers(1, depth + 1))])
    if hit is not None:
        paths.insert(int(rng.integers(0, len(paths) + 1)), hit)
    return Tree.from_paths(context[-1], paths, max_nodes=int(rng.integers(1, 20)))


def greedy_alone(rule_factory, steps: int, seed=None) -> list[int]:
    """k = 0: one token per round from the rule's verify with no drafts."""
    rule, seq = rule_factory(), list(PROMPT)
    for _ in range(steps):
        _, t = rule.verify(target_logits(tuple(seq))[None], [], [], len(seq))
        seq.append(t)
        rule.commit([t])
    return seq[len(PROMPT):]


def tree_run(rule, steps: int, rng, hit_len=0, reference=None) -> list[int]:
    """Rounds of verify_tree over random trees until `steps` tokens; `hit_len` of the
    reference's next tokens are planted as one branch (so paths get accepted)."""
    seq = list(PROMPT)
    while len(seq) - len(PROMPT) < steps:
        done = len(seq) - len(PROMPT)
        hit = None if reference is None else reference[done:done + hit_len] or None
        tree = random_tree(rng, tuple(seq), hit=hit)
        path, t = rule.verify_tree(rows(tree, tuple(seq)), tree, [None] * (len(tree) - 1),
                                   len(seq))
        assert all(tree.parents[b] == a for a, b in zip([0, *path], path)), "not a path"
        new = [*tree.pending(path[-1]), t] if path else [t]
        seq += new
        rule.commit(new)
    return seq[len(PROMPT):][:steps]


PENALTIES = dict(repetition_penalty=0.5, presence_penalty=1.0, frequency_penalty=0.5)


@pytest.mark.parametrize("penalised", [False, True], ids=["plain", "penalties"])
def test_greedy_over_trees_gives_the_tokens_of_k0(penalised):
    params = SamplingParams(**PENALTIES) if penalised else SamplingParams()

    def make():
        return GreedyAcceptance(Processors(params, list(PROMPT), V, {1}) if penalised else None)

    alone = greedy_alone(make, 40)
    rng = np.random.default_rng(1)
    for hit_len in (0, 2, 5):
        assert tree_run(make(), 40, rng, hit_len, alone) == alone
    # a chain tree decides what the chain rule decides
    rule = make()
    for _ in range(50):
        drafts = [int(t) for t in rng.integers(0, V, rng.integers(0, 5))]
        tree = Tree.chain(3, drafts)
        j, t = rule.verify(rows(tree, PROMPT), drafts, [None] * len(drafts), 2)
        assert rule.verify_tree(rows(tree, PROMPT), tree, [None] * len(drafts), 2) == \
            (list(range(1, j + 1)), t)


def test_invariant_sampling_over_trees_gives_the_seeds_tokens_of_k0():
    params = SamplingParams(temperature=1.0, seed=5, coupling="invariant", **PENALTIES)

    def make():
        return InvariantSampling(params, Processors(params, list(PROMPT), V, {1}), V)

    alone = greedy_alone(make, 40)
    rng = np.random.default_rng(2)
    for hit_len in (0, 3):
        assert tree_run(make(), 40, rng, hit_len, alone) == alone


def sampled_tree(rng, context, draft_q, siblings=3, depth=2, point_every=3) -> tuple[Tree, list]:
    """A tree whose children are drawn as the rule assumes: at each node `siblings` tokens
    without replacement from the draft's q there (every `point_every`-th child a deterministic
    candidate instead: the least likely left under q, a point mass), down to `depth`."""
    tokens, parents, probs = [context[-1]], [-1], [None]
    frontier = [0]
    for _ in range(depth):
        nxt = []
        for node in frontier:
            path = [tokens[i] for i in _path(parents, node)][1:]
            q = draft_q(context + tuple(path))
            left = q.copy()
            for s in range(siblings):
                if (s + 1) % point_every == 0:
                    x, qx = int(np.argmin(np.where(left > 0, left, np.inf))), None
                else:
                    x, qx = sample(left, rng.random()), q
                left[x] = 0.0
                tokens.append(x)
                parents.append(node)
                probs.append(qx)
                nxt.append(len(tokens) - 1)
        frontier = nxt[::2]                         # expand some, not all
    return Tree(tokens, parents), probs[1:]


def _path(parents, node):
    out = [node]
    while parents[out[-1]] != -1:
        out.append(parents[out[-1]])
    return out[::-1]


def draft_q(context) -> np.ndarray:
    """An adversarial draft: its mass on the target's least likely tokens."""
    p = probabilities(target_logits(context), SamplingParams(temperature=1.0))
    q = (1.0 - p) ** 6 + 0.02
    return q / q.sum()


def first_two(rule, rng, trials: int, processors=None) -> list[tuple[int, int]]:
    """The first two tokens of `trials` generations, each round over a fresh sampled tree;
    `processors()` gives each generation its own (the rule's random stream goes on)."""
    out = []
    for _ in range(trials):
        if processors is not None:
            rule.processors = processors()
        seq = list(PROMPT)
        while len(seq) < len(PROMPT) + 2:
            tree, probs = sampled_tree(rng, tuple(seq), draft_q)
            path, t = rule.verify_tree(rows(tree, tuple(seq)), tree, probs, len(seq))
            new = [*tree.pending(path[-1]), t] if path else [t]
            seq += new
            rule.commit(new)
        out.append((seq[len(PROMPT)], seq[len(PROMPT) + 1]))
    return out


def exact_joint(params: SamplingParams, penalised: bool) -> np.ndarray:
    """P(t1, t2) (V, V) of the target alone, processed as the rule processes it."""
    proc = Processors(params, list(PROMPT), V, {1}) if penalised else None
    joint = np.zeros((V, V))
    p1 = probabilities(proc.apply(target_logits(PROMPT)) if proc else target_logits(PROMPT),
                       params)
    for t1 in range(V):
        row = target_logits(PROMPT + (t1,))
        p2 = probabilities(proc.apply(row, [t1]) if proc else row, params)
        joint[t1] = p1[t1] * p2
    return joint


def chi_square_p(samples, joint: np.ndarray) -> float:
    counts = np.zeros_like(joint)
    for a, b in samples:
        counts[a, b] += 1
    n = len(samples)
    keep = joint * n >= 5
    observed = [*counts[keep], counts[~keep].sum()]
    expected = [*(joint[keep] * n), joint[~keep].sum() * n]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, np.asarray(expected) * n / sum(expected)).pvalue)


TRIALS = 6000
SETTINGS = [(dict(temperature=1.0), False), (dict(temperature=0.7, top_k=4), False),
            (dict(temperature=1.0, **PENALTIES), True)]


@pytest.mark.parametrize("setting,penalised", SETTINGS, ids=["t1", "t0.7-k4", "penalties"])
def test_recursive_rejection_over_trees_is_the_targets_law(setting, penalised):
    params = SamplingParams(seed=11, coupling="rejection", **setting)
    fresh = (lambda: Processors(params, list(PROMPT), V, {1})) if penalised else None
    samples = first_two(SamplingAcceptance(params), np.random.default_rng(3), TRIALS, fresh)
    p = chi_square_p(samples, exact_joint(params, penalised))
    assert p > 1e-3, f"tree samples do not follow the target (chi-square p={p:.2g})"


class NoResidual(SamplingAcceptance):
    """A wrong tree rule: a rejected point mass is tried again through its siblings' p (its
    token is not zeroed), as a rule that forgets the residual would."""

    def decide_tree(self, target_logits, tree, draft_probs, accept_u, final_u):
        node, path = 0, []
        while True:
            p = probabilities(target_logits[node], self.params)
            for c in tree.children(node):
                x = int(tree.tokens[c])
                q = draft_probs[c - 1]
                if (q is None and accept_u[c - 1] < p[x]) or \
                        (q is not None and accept_u[c - 1] * q[x] < p[x]):
                    path.append(c)
                    node = c
                    break
            else:
                return path, sample(p, final_u)


def test_the_statistical_test_sees_a_wrong_tree_rule():
    params = SamplingParams(temperature=1.0, seed=11, coupling="rejection")
    samples = first_two(NoResidual(params), np.random.default_rng(3), TRIALS)
    assert chi_square_p(samples, exact_joint(params, False)) < 1e-6


def test_seeded_tree_sampling_is_reproducible_and_a_chain_decides_as_verify():
    params = SamplingParams(temperature=1.0, seed=4, coupling="rejection")
    runs = [first_two(SamplingAcceptance(params), np.random.default_rng(9), 200)
            for _ in range(2)]
    assert runs[0] == runs[1]
    other = first_two(SamplingAcceptance(SamplingParams(temperature=1.0, seed=5,
                                                        coupling="rejection")),
                      np.random.default_rng(9), 200)
    assert other != runs[0]
    chain, tree_rule = SamplingAcceptance(params), SamplingAcceptance(params)
    rng = np.random.default_rng(6)
    for _ in range(300):
        drafts = [int(t) for t in rng.integers(0, V, rng.integers(0, 5))]
        tree = Tree.chain(3, drafts)
        probs = [None if rng.random() < 0.3 else draft_q(PROMPT + tuple(drafts[:j]))
                 for j in range(len(drafts))]
        j, t = chain.verify(rows(tree, PROMPT), drafts, probs, 2)
        assert tree_rule.verify_tree(rows(tree, PROMPT), tree, probs, 2) == \
            (list(range(1, j + 1)), t)


def test_the_fused_heads_rules_judge_trees_as_the_host_rules(bundle_factory):
    """FusedGreedyAcceptance walks the argmax head's choices; FusedSamplingAcceptance decides
    on the host from the same uniforms: both as the host rules, on the bundle's real heads."""
    from ssd_runtime import Generator
    from ssd_runtime.round.heads import FusedGreedyAcceptance, FusedSamplingAcceptance

    gen = Generator.load(bundle_factory("llama", "llama_cut"), fused_heads=True)
    heads, vocab = gen.heads, gen.manifest.target.vocab_size
    rng = np.random.default_rng(12)
    params = SamplingParams(temperature=0.8, top_k=20, seed=3, coupling="rejection")
    greedy, fused_greedy = GreedyAcceptance(), FusedGreedyAcceptance(heads)
    sampling, fused_sampling = SamplingAcceptance(params), FusedSamplingAcceptance(heads, params)
    for _ in range(40):
        paths = [[int(t) for t in rng.integers(0, 8, rng.integers(1, 4))] for _ in range(6)]
        tree = Tree.from_paths(1, paths, max_nodes=10)
        logits = rng.normal(0, 2, (len(tree), vocab)).astype(np.float32)
        logits[:, :8] += 4                                   # the tree's tokens are likely
        probs = [None if rng.random() < 0.5 else probabilities(
            rng.normal(0, 2, vocab).astype(np.float32), params) for _ in range(len(tree) - 1)]
        assert fused_greedy.verify_tree(logits, tree, probs, 5) == \
            greedy.verify_tree(logits, tree, probs, 5)
        assert fused_sampling.verify_tree(logits, tree, probs, 5) == \
            sampling.verify_tree(logits, tree, probs, 5)
    row = rng.normal(0, 2, vocab).astype(np.float32)
    for sampled in (False, True):
        assert fused_sampling.draft_candidates(row, 3, 7, [], 2, sampled)[0] == \
            sampling.draft_candidates(row, 3, 7, [], 2, sampled)[0]


def test_logprobs_along_the_accepted_path_are_the_targets_own():
    """Rows [0, *path] of a tree's verification give the emitted tokens' log-probabilities,
    as k = 0 reads them from each token's own context."""
    from ssd_runtime.round.logprobs import Logprobs

    rng, rule = np.random.default_rng(5), GreedyAcceptance()
    alone = greedy_alone(GreedyAcceptance, 12)
    seq, got = list(PROMPT), Logprobs(top=3)
    while len(seq) - len(PROMPT) < 12:
        done = len(seq) - len(PROMPT)
        tree = random_tree(rng, tuple(seq), hit=alone[done:done + 3])
        logits = rows(tree, tuple(seq))
        path, t = rule.verify_tree(logits, tree, [None] * (len(tree) - 1), len(seq))
        new = [*tree.pending(path[-1]), t] if path else [t]
        got.add(logits[[0, *path]], new)
        seq += new
    want, context = Logprobs(top=3), list(PROMPT)
    for token in seq[len(PROMPT):]:
        want.add(target_logits(tuple(context))[None], [token])
        context.append(token)
    assert [(x.token, x.top) for x in got.tokens] == [(x.token, x.top) for x in want.tokens]
    np.testing.assert_allclose([x.logprob for x in got.tokens], [x.logprob for x in want.tokens])
