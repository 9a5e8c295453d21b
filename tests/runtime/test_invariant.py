"""Seeded sampling gives the target alone's tokens: the drafter-invariant coupling.

With a seed (coupling "auto"), every token is the Gumbel-max sample of the target's processed
distribution under noise keyed by (seed, position, token id); drafts only decide how many of
those tokens one target pass confirms. So the tokens do not depend on k (fixed or auto), the
mode, the draft or the heads. Exactness (the target's distribution) is checked by chi-square
in test_sampling.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from ssd_runtime import Generator
from ssd_runtime.round.sampling import GumbelNoise, gumbel_pick

PROMPT = [0, 5, 6, 7]
SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=8, top_p=0.9),
            dict(temperature=0.9, repetition_penalty=0.6, presence_penalty=0.5)]


def test_gumbel_pick_samples_the_distribution():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(12, 0.7))
    probs[[3, 7]] = 0.0                                   # as top-k / top-p leave it
    probs /= probs.sum()
    n = 20000
    picks = np.array([gumbel_pick(probs, GumbelNoise(99), pos) for pos in range(n)])
    assert not np.isin(picks, [3, 7]).any()
    counts = np.bincount(picks, minlength=12)[probs > 0]
    assert chisquare(counts, probs[probs > 0] * n).pvalue > 1e-3
    noise = GumbelNoise(99, size=40, keep=8)             # a larger vocabulary, a small cache
    again = [gumbel_pick(probs, noise, pos) for pos in range(50)]
    assert again == list(picks[:50])                     # a function of (key, position, id)
    assert again == [gumbel_pick(probs, noise, pos) for pos in range(50)]
    assert again != [gumbel_pick(probs, GumbelNoise(100), pos) for pos in range(50)]


@pytest.mark.parametrize("setting", SETTINGS, ids=["t1", "t0.7-k8-p0.9", "penalised"])
def test_a_seed_gives_the_same_tokens_at_every_k_and_mode(small_vocab_bundle, setting):
    bundle, _ = small_vocab_bundle
    gen, fused = Generator.load(bundle), Generator.load(bundle, fused_heads=True)
    differ = 0
    for seed in range(6):
        run = dict(max_new_tokens=24, seed=seed, ignore_eos=True, **setting)
        alone = gen.generate(PROMPT, k=0, **run).token_ids
        for k in (1, 3, 8, "auto"):
            for mode in ("sequential", "split"):
                assert gen.generate(PROMPT, k=k, mode=mode, **run).token_ids == alone, (k, mode)
        assert fused.generate(PROMPT, k=4, **run).token_ids == alone
        # the rejection rule draws differently, so it parts from these tokens somewhere
        differ += gen.generate(PROMPT, k=3, coupling="rejection", **run).token_ids != alone
    assert differ > 0


def test_invariant_tokens_do_not_depend_on_the_draft(bundle_factory):
    """Two different drafts for one target: the same seeded tokens, as the target alone."""
    one = Generator.load(bundle_factory("llama", "llama_cut"))
    other = Generator.load(bundle_factory("llama", "llama_other"))
    for seed in range(3):
        run = dict(max_new_tokens=32, temperature=0.8, top_p=0.95, seed=seed)
        alone = one.generate("def f(x):", k=0, **run).token_ids
        assert one.generate("def f(x):", k=4, **run).token_ids == alone
        assert other.generate("def f(x):", k=4, mode="split", **run).token_ids == alone
        assert other.generate("def f(x):", k="auto", **run).token_ids == alone


def test_draft_and_target_share_each_positions_noise(bundle_factory):
    """The target as its own draft: under the same noise its proposals are the target's
    tokens, so every draft is accepted (noise keyed off by a position would reject most)."""
    gen = Generator.load(bundle_factory("llama", "llama", draft_quant="none"))
    for mode in ("sequential", "split"):
        res = gen.generate("def f(x):", max_new_tokens=40, k=4, mode=mode, temperature=1.0,
                           seed=3, ignore_eos=True)
        assert res.stats.drafted > 0 and res.stats.acceptance_rate == 1.0
