"""The target's log-probabilities of the emitted tokens (runtime/round/logprobs.py): read from
the verification's rows, they equal the target alone's (k = 0) within float tolerance, alone
and in a batch, greedy and sampled, and they are the model's own log_softmax."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime import ConfigError, Generator

PROMPTS = ([0, 17, 42, 99, 17, 42], [3, 9, 4], [0, 5, 6, 7, 8, 9, 5, 6, 7])


@pytest.fixture(scope="module")
def gen(bundle_factory):
    return Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)


def _same(a, b):
    assert [t.token for t in a] == [t.token for t in b]
    np.testing.assert_allclose([t.logprob for t in a], [t.logprob for t in b], atol=1e-4)
    for x, y in zip(a, b):       # (ids of near-equal alternatives may swap: values compared)
        np.testing.assert_allclose([v for _, v in x.top], [v for _, v in y.top], atol=1e-4)


@pytest.mark.parametrize("setting", [{}, {"temperature": 0.8, "seed": 3, "ignore_eos": True}])
def test_logprobs_under_speculation_are_the_target_alones(gen, setting):
    drafted = 0
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=30, k=0, logprobs=5, **setting)
        assert len(alone.logprobs) == len(alone.token_ids)
        for k in (4, "auto"):
            res = gen.generate(prompt, max_new_tokens=30, k=k, logprobs=5, **setting)
            assert res.token_ids == alone.token_ids
            _same(res.logprobs, alone.logprobs)
            drafted += res.stats.accepted
        for t in alone.logprobs:
            assert len(t.top) == 5 and t.logprob <= 0
            assert t.top[0][1] >= t.top[-1][1]
            if not setting:                       # greedy: the emitted token is the top one
                assert t.top[0][0] == t.token
    assert drafted > 0                            # accepted drafts' rows were read


def test_logprobs_are_the_models_own_log_softmax(gen):
    """One step by hand: the target's logits at the last prompt position."""
    prompt = PROMPTS[1]
    res = gen.generate(prompt, max_new_tokens=1, k=0, logprobs=0)
    logits = np.asarray(gen.target.forward(np.asarray(prompt, np.int64), 0)[-1], np.float64)
    expected = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    assert res.logprobs[0].logprob == pytest.approx(expected[res.token_ids[0]], abs=1e-5)
    assert res.logprobs[0].top == ()


def test_a_batch_gives_each_sequence_its_logprobs(gen):
    alone = [gen.generate(p, max_new_tokens=20, k=0, logprobs=2) for p in PROMPTS]
    results = gen.generate_batch([{"prompt": p, "logprobs": 2} for p in PROMPTS] + [PROMPTS[0]],
                                 max_new_tokens=20, k=4)
    for a, r in zip(alone, results):
        _same(r.logprobs, a.logprobs)
    assert results[3].logprobs is None


def test_bad_logprobs_are_refused(gen):
    for bad in (-1, 21, 1.5, True):
        with pytest.raises(ConfigError, match="logprobs"):
            gen.generate(PROMPTS[0], max_new_tokens=2, logprobs=bad)
