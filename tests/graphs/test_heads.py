"""The ONNX heads make exactly the host's decisions from the same uniforms."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ssd_graphs.heads import accept_head, argmax_head, sample_head
from ssd_runtime.round.acceptance import SamplingAcceptance
from ssd_runtime.round.sampling import SamplingParams, probabilities, sample


def session(model):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def heads():
    return session(argmax_head()), session(sample_head()), session(accept_head())


def settings(p: SamplingParams) -> dict:
    return dict(temperature=np.array([p.temperature], np.float32),
                top_k=np.array([p.top_k], np.int64), top_p=np.array([p.top_p], np.float32))


def test_argmax_head(heads):
    logits = np.random.default_rng(0).normal(size=(9, 300)).astype(np.float32)
    np.testing.assert_array_equal(heads[0].run(None, {"logits": logits})[0], logits.argmax(-1))


def test_sample_and_accept_heads_match_the_host_rule(heads):
    _, sampler, acceptor = heads
    rng = np.random.default_rng(0)
    rejections = accepted_all = 0
    for _ in range(400):
        vocab, d = 40, int(rng.integers(0, 6))
        params = SamplingParams(temperature=float(rng.choice([0.5, 1.0, 1.5])),
                                top_k=int(rng.choice([0, 3, 10])),
                                top_p=float(rng.choice([1.0, 0.9, 0.5])))
        logits = rng.normal(0, 2, (d + 1, vocab)).astype(np.float32)          # (D+1, V)
        u = float(rng.random())
        token, probs = sampler.run(None, {"logits": logits, **settings(params),
                                          "uniform": np.array([u], np.float32)})
        q_host = probabilities(logits[-1], params)
        np.testing.assert_allclose(probs, q_host, atol=1e-5)
        assert token[0] == sample(q_host, u)
        # a draft close to the target, so that both acceptance and rejection happen
        draft_logits = logits[:d] + rng.normal(0, 1, (d, vocab)).astype(np.float32)
        qs = [probabilities(row, params) for row in draft_logits]
        drafts = [sample(q, rng.random()) for q in qs]
        uniforms = rng.random(d + 1)
        j, t = acceptor.run(None, {"logits": logits, "draft_tokens": np.array(drafts, np.int64),
                                   "draft_probs": np.array(qs, np.float32).reshape(d, vocab),
                                   "uniforms": uniforms.astype(np.float32), **settings(params)})
        host = SamplingAcceptance(params).decide(logits, drafts, qs, uniforms[:d], uniforms[d])
        assert (int(j[0]), int(t[0])) == host, (params, d)
        rejections += host[0] < d
        accepted_all += host[0] == d and d > 0
    assert rejections > 50 and accepted_all > 20       # both branches were exercised
