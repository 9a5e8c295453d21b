"""Logits processors (penalties, logit bias, minimum length) leave greedy speculation exact: the same tokens as the target alone
with the same penalties, and as Hugging Face's `generate(repetition_penalty=...)`.

Each verification row is penalised as if the draft tokens before it had been emitted; these
tests fail if a row reads only the committed sequence (or a draft step its own round's).
"""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime import Generator
from ssd_runtime.round.processors import Processors
from ssd_runtime.round.sampling import SamplingParams

PROMPT = [0, 17, 42, 99, 17, 5]
NEW = 48


@pytest.fixture(scope="module")
def pair(bundle_factory, models):
    return Generator.load(bundle_factory("llama", "llama_cut")), models["llama"]


def hf_greedy(model_dir, **penalties) -> list[int]:
    """Hugging Face for the repetition penalty; presence/frequency written out over its logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([PROMPT])
    if set(penalties) <= {"repetition_penalty"}:
        out = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=2,
                             attention_mask=torch.ones_like(ids), **penalties)
        return out[0, len(PROMPT):].tolist()
    seq = list(PROMPT)
    with torch.no_grad():
        for _ in range(NEW):
            logits = model(torch.tensor([seq])).logits[0, -1]
            counts = torch.zeros_like(logits)
            for t in seq[len(PROMPT):]:
                counts[t] += 1
            logits = (logits - penalties.get("frequency_penalty", 0) * counts
                      - penalties.get("presence_penalty", 0) * (counts > 0).float())
            seq.append(int(logits.argmax()))
    return seq[len(PROMPT):]


@pytest.mark.parametrize("penalties", [dict(repetition_penalty=1.5), dict(repetition_penalty=0.7),
                                       dict(presence_penalty=1.2, frequency_penalty=0.8)],
                         ids=["rep1.5", "rep0.7", "pres-freq"])
def test_greedy_with_penalties_equals_the_target_alone_and_hugging_face(pair, penalties):
    gen, model_dir = pair
    expected = hf_greedy(model_dir, **penalties)
    plain = gen.generate(PROMPT, max_new_tokens=NEW, k=0).token_ids
    assert plain != expected, "the penalties must change this output, or the test shows nothing"
    for k in (0, 1, 4, "auto"):
        for mode in ("sequential", "split") if k else ("sequential",):
            res = gen.generate(PROMPT, max_new_tokens=NEW, k=k, mode=mode, **penalties)
            assert res.token_ids == expected[:len(res.token_ids)], (k, mode)
            assert res.stop_reason == "eos" or len(res.token_ids) == NEW
    assert gen.generate(PROMPT, max_new_tokens=NEW, k=4, **penalties).stats.accepted > 0


def test_logit_bias_and_min_new_tokens_equal_hugging_face(pair):
    """EOS pushed up by +100 ends the output as soon as the minimum length allows."""
    import torch
    from transformers import AutoModelForCausalLM

    gen, model_dir = pair
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([PROMPT])
    hf = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=2,
                        attention_mask=torch.ones_like(ids), sequence_bias={(1,): 100.0},
                        min_new_tokens=10)[0, len(PROMPT):].tolist()
    assert len(hf) == 11 and hf[-1] == 1
    for k in (0, 4, "auto"):
        for mode in ("sequential", "split") if k else ("sequential",):
            res = gen.generate(PROMPT, max_new_tokens=NEW, k=k, mode=mode,
                               logit_bias={1: 100.0}, min_new_tokens=10)
            assert res.token_ids == hf and res.stop_reason == "eos", (k, mode)


def test_ignore_eos_generates_past_eos(pair):
    gen, _ = pair
    runs = [gen.generate(PROMPT, max_new_tokens=20, k=k, logit_bias={1: 100.0},
                         ignore_eos=True) for k in (0, 4)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 20
    assert runs[0].token_ids.count(1) > 1 and runs[0].stop_reason == "length"
    assert gen.generate(PROMPT, max_new_tokens=20, logit_bias={1: 100.0}).token_ids == [1]


def test_pending_tokens_count_as_emitted():
    """apply(row, pending) is apply after committing `pending`; the commit itself is kept."""
    rng = np.random.default_rng(0)
    params = SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.25,
                            logit_bias=((2, 1.5),), min_new_tokens=4)
    a, b = Processors(params, [3, 4], 20, {1}), Processors(params, [3, 4], 20, {1})
    row = rng.normal(0, 3, 20).astype(np.float32)
    b.commit([7, 7, 9])
    np.testing.assert_array_equal(a.apply(row, [7, 7, 9]), b.apply(row))
    assert a.apply(row, [7, 7, 9])[1] == -np.inf and a.apply(row, [7, 7, 9, 5])[1] > -np.inf
    assert not a.seen[7] and a.counts[7] == 0 and a.emitted == 0   # pending changed nothing
    assert a.apply(row).dtype == np.float32 and a.apply(row[:10], [15]).shape == (10,)
