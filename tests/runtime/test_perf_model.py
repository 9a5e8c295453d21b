"""The performance model and the adaptive-k scheduler."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime import Generator
from ssd_runtime.perf import AdaptiveK, CostModel, expected_tokens


def gpu_like() -> CostModel:      # v(k) ≈ 1, a cheap draft
    return CostModel(target_step=1.0, draft_step=0.05, verify=tuple(1.0 + 0.01 * k for k in range(9)))


def cpu_like() -> CostModel:      # verify grows with k, a dearer draft
    return CostModel(target_step=1.0, draft_step=0.15, verify=tuple(1.0 + 0.15 * k for k in range(9)))


def test_expected_tokens_and_speedup():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    cost = gpu_like()
    assert cost.speedup(0.8, 0) == pytest.approx(1.0)
    alpha, k = 0.8, 4
    bound = (1 - alpha ** (k + 1)) / (1 - alpha) / (k * cost.c + cost.v(k))
    assert cost.speedup(alpha, k) == pytest.approx(bound)


def test_best_k_follows_alpha_and_costs():
    gpu, cpu = gpu_like(), cpu_like()
    assert gpu.best_k(0.95, 8) == 8 and gpu.best_k(0.05, 8) <= 1
    assert cpu.best_k(0.8, 8) < gpu.best_k(0.8, 8)
    ks = [gpu.best_k(a, 8) for a in (0.2, 0.5, 0.7, 0.9)]
    assert ks == sorted(ks)


def test_adaptive_tracks_alpha():
    sched = AdaptiveK(gpu_like(), max_k=8)
    for _ in range(30):                 # every draft token accepted
        sched.observe(sched.next_k(), sched.history[-1])
    assert sched.alpha > 0.9 and sched.next_k() == 8
    for _ in range(60):                 # every first draft token rejected
        sched.observe(sched.next_k(), 0)
    assert sched.alpha < 0.1 and sched.next_k() <= 1


def test_adaptive_stops_drafting_when_the_draft_is_unsure():
    sched = AdaptiveK(cpu_like(), max_k=8, accepted=8.0, rejected=2.0)
    confident = np.array([[10.0, 0.0, 0.0, 0.0]])
    unsure = np.zeros((1, 4))           # top probability 0.25
    for _ in range(20):                 # the draft is usually confident
        sched.next_k()
        assert sched.keep_drafting(1, confident)
    sched.next_k()
    assert sched.keep_drafting(1, confident)
    assert not sched.keep_drafting(2, unsure)


def test_auto_on_a_real_bundle(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama"))   # the target is its own draft
    cost = gen.cost_model()
    assert cost.target_step > 0 and cost.draft_step > 0 and len(cost.verify) == 9
    # a draft as dear as the target can never pay: auto keeps to k = 0
    res = gen.generate([0, 5, 9], max_new_tokens=64, k="auto")
    assert res.stats.k == "auto" and res.stats.mean_k < 0.5
    # with GPU-like costs the same pair (α = 1) drafts long rounds
    gen._cost = gpu_like()
    res = gen.generate([0, 5, 9], max_new_tokens=64, k="auto")
    assert res.stats.acceptance_rate == 1.0 and res.stats.mean_k > 3
