"""Predicted outputs (OpenAI's `prediction`; runtime/round/lookup.py `Prediction`, docs/design.md
§6.1): the predicted text is a lookup source beside the draft model and the sequence's own text.
The output stays exactly the target alone's, whatever the prediction; a right one is accepted."""
from __future__ import annotations

import pytest

from ssd_runtime import ConfigError, Generator
from ssd_runtime.round.lookup import MAX_NGRAM, Lookup, Prediction

PROMPTS = ([0, 17, 42, 99, 17, 42], [3, 9, 4], [0, 5, 6, 7, 8, 9, 5, 6, 7])


@pytest.fixture(scope="module")
def gen(bundle_factory):
    return Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)


def test_prediction_drafts_from_its_start_and_re_anchors_after_a_divergence():
    prompt = [1, 2]
    pred = Prediction([10, 11, 12, 13, 14, 15, 11, 12, 16], prompt_len=len(prompt))
    assert pred.find(prompt, 3) == ([10, 11, 12], MAX_NGRAM)       # the output's start
    assert pred.find(prompt + [10, 11], 2) == ([12, 13], MAX_NGRAM)  # followed it: on from there
    # the target wrote 99 instead of 12 and then 13: re-anchored on [13], forward
    assert pred.find(prompt + [10, 11, 99, 13], 2) == ([14, 15], 1)
    # [11, 12] occurs twice: the first occurrence from the last anchor on (an edit moves
    # forward through the text it edits)
    assert pred.find(prompt + [10, 11, 99, 13, 14, 99, 11, 12], 3) == ([16], 2)
    assert Prediction([10, 11], 2).find(prompt + [7, 8], 3) == ([], 0)   # never predicted
    # a round whose last token replaced a predicted one (an edit of one token): on after it
    swap = Prediction([10, 11, 12, 13, 14], prompt_len=2)
    assert swap.find(prompt, 3) == ([10, 11, 12], MAX_NGRAM)
    assert swap.find(prompt + [10, 11, 99], 3) == ([13, 14], 1)
    assert swap.find(prompt + [10, 11, 99, 13], 3) == ([14], MAX_NGRAM)
    # beside the sequence's own text: the prediction where its n-gram is at least as long,
    # learnt under its own class (max_ngram + n)
    look = Lookup(prediction=Prediction([5, 6, 7], prompt_len=3))
    assert look.find([5, 6, 8, 5], 2) == ([6, 7], 2 * MAX_NGRAM) and look.source == "prediction"
    alone = Lookup(prediction=Prediction([5, 6, 7], prompt_len=4), sequence=False)
    assert alone.find([5, 6, 8, 5, 6, 9], 2) == ([], 0)


@pytest.mark.parametrize("k", [4, "auto"])
def test_greedy_with_a_prediction_is_the_target_alone(gen, k):
    accepted = 0
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=40, k=0).token_ids
        wrong = [(t * 7 + 3) % 200 for t in alone]
        for prediction, source in ((alone, "fused"), (alone, "model"), (wrong, "fused"),
                                   (alone[5:] + alone[:5], "lookup")):
            res = gen.generate(prompt, max_new_tokens=40, k=k, prediction=prediction,
                               draft_source=source)
            assert res.token_ids == alone, (prompt, prediction, source)
            st = res.stats
            assert 0 <= st.prediction_accepted <= st.prediction_drafted <= st.lookup_drafted
            if prediction is alone:
                accepted += st.prediction_accepted
    assert accepted > 0


def test_a_right_prediction_is_accepted_whole(gen):
    """The target's own output as the prediction: every drafted prediction token passes."""
    prompt = PROMPTS[1]
    alone = gen.generate(prompt, max_new_tokens=40, k=0).token_ids
    res = gen.generate(prompt, max_new_tokens=40, k=4, prediction=alone, draft_source="lookup")
    assert res.token_ids == alone
    assert res.stats.prediction_accepted == res.stats.prediction_drafted > 0
    assert res.stats.rounds < len(alone)              # rounds of several tokens each


def test_text_prediction_is_tokenised_once(gen):
    prompt = "def read(path):"
    alone = gen.generate(prompt, max_new_tokens=24, k=0)
    res = gen.generate(prompt, max_new_tokens=24, k=4, prediction=alone.text)
    assert res.token_ids == alone.token_ids
    assert res.stats.prediction_drafted > 0


def test_seeded_sampling_with_a_prediction_gives_the_target_alones_tokens(gen):
    for seed in range(3):
        run = dict(max_new_tokens=24, seed=seed, temperature=0.8, ignore_eos=True)
        alone = gen.generate(PROMPTS[0], k=0, **run).token_ids
        for k in (4, "auto"):
            res = gen.generate(PROMPTS[0], k=k, prediction=alone, **run)
            assert res.token_ids == alone, (seed, k)


def test_a_batch_takes_a_prediction_per_sequence(gen):
    alone = [gen.generate(p, max_new_tokens=30, k=0).token_ids for p in PROMPTS]
    results = gen.generate_batch(
        [{"prompt": p, "prediction": a} for p, a in zip(PROMPTS, alone)] + [PROMPTS[0]],
        max_new_tokens=30, k=4)
    assert [r.token_ids for r in results] == alone + [alone[0]]
    assert all(r.stats.prediction_accepted > 0 for r in results[:3])
    assert results[3].stats.prediction_drafted == 0


def test_bad_predictions_name_the_field(gen):
    room = gen.manifest.max_context - len(PROMPTS[0])
    with pytest.raises(ConfigError, match=f"prediction has {room + 1} tokens, more than"):
        gen.generate(PROMPTS[0], max_new_tokens=4, prediction=[5] * (room + 1))
    with pytest.raises(ConfigError, match="prediction: token id"):
        gen.generate(PROMPTS[0], max_new_tokens=4, prediction=[10 ** 9])
    with pytest.raises(ConfigError, match="prediction must be"):
        gen.generate(PROMPTS[0], max_new_tokens=4, prediction=[1.5])
    result = gen.generate_batch([{"prompt": PROMPTS[0], "prediction": [10 ** 9]}, PROMPTS[1]],
                                max_new_tokens=4, k=4)
    assert result[0].stop_reason == "error" and "prediction" in result[0].error
    assert result[1].stop_reason != "error"
