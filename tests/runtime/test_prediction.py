"""Predicted outputs (OpenAI's `prediction`; runtime/round/lookup.py `Prediction`, docs/design.md
§6.1): the predicted text is a lookup source beside the draft model and the sequence's own text.
The output stays exactly the target alone's, whatever the prediction; a right one is accepted."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime import ConfigError, Generator
from ssd_runtime.round.lookup import MAX_NGRAM, PREDICTION_PRIOR, Lookup, Prediction
from ssd_runtime.scheduler.cost import CostModel
from ssd_runtime.scheduler.learning import Acceptance, Sources
from ssd_runtime.scheduler.schedule import AdaptiveK, RoundTimes

PROMPTS = ([0, 17, 42, 99, 17, 42], [3, 9, 4], [0, 5, 6, 7, 8, 9, 5, 6, 7])


@pytest.fixture(scope="module")
def gen(bundle_factory):
    return Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)


def test_prediction_drafts_from_its_start_and_re_anchors_after_a_divergence():
    prompt = [1, 2]
    pred = Prediction([10, 11, 12, 13, 14, 15, 11, 12, 16], prompt_len=len(prompt))
    # the output's start, before any output has followed it: a class of its own
    assert pred.find(prompt, 3) == ([10, 11, 12], MAX_NGRAM + 1)
    assert pred.find(prompt + [10, 11], 2) == ([12, 13], MAX_NGRAM)  # followed it: on from there
    # the target wrote 99 instead of 12 and then 13: re-anchored on [13], forward
    assert pred.find(prompt + [10, 11, 99, 13], 2) == ([14, 15], 1)
    # [11, 12] occurs twice: the first occurrence from the last anchor on (an edit moves
    # forward through the text it edits)
    assert pred.find(prompt + [10, 11, 99, 13, 14, 99, 11, 12], 3) == ([16], 2)
    # nothing followed yet: after a preamble the start is offered again, a single token of
    # the preamble found in the prediction is no anchor, two are
    late = Prediction([10, 11, 7, 12, 7, 8, 13, 14, 15], 2)
    assert late.find(prompt + [7], 3) == ([10, 11, 7], MAX_NGRAM + 1)
    assert late.find(prompt + [7, 8], 3) == ([13, 14, 15], 2)
    assert late.find(prompt + [7, 8, 13, 99], 3) == ([15], 1)     # followed 13, replaced 14
    assert late.find(prompt + [7, 8, 13, 99, 15, 42, 43], 3) == ([], 0)   # then left it
    # a round whose last token replaced a predicted one (an edit of one token): on after it
    swap = Prediction([10, 11, 12, 13, 14], prompt_len=2)
    assert swap.find(prompt, 3) == ([10, 11, 12], MAX_NGRAM + 1)
    assert swap.find(prompt + [10, 11, 99], 3) == ([13, 14], 1)
    assert swap.find(prompt + [10, 11, 99, 13], 3) == ([14], MAX_NGRAM)
    # beside the sequence's own text: the prediction where its n-gram is at least as long,
    # learnt under its own class (max_ngram + n)
    look = Lookup(prediction=Prediction([5, 6, 7], prompt_len=3))
    assert look.find([5, 6, 8, 5], 2) == ([6, 7], 2 * MAX_NGRAM) and look.source == "prediction"
    start = Lookup(prediction=Prediction([5, 6, 7], prompt_len=3))
    assert start.find([5, 6, 8], 2) == ([5, 6], 2 * MAX_NGRAM + 1)    # beats any n-gram
    alone = Lookup(prediction=Prediction([5, 6, 7], prompt_len=4), sequence=False)
    assert alone.find([5, 6, 8, 5, 6, 9], 2) == ([5, 6], 2 * MAX_NGRAM + 1)   # its start only
    # the start, a guess, gives way to the sequence's own match of two tokens or more
    both = Lookup(prediction=Prediction([5, 6, 7], prompt_len=4))
    assert both.find([1, 2, 3, 4, 8, 9, 8, 9], 2) == ([8, 9], 2) and both.source == "sequence"
    assert both.find([1, 2, 3, 4, 8, 9, 8, 9, 1], 2) == ([5, 6], 2 * MAX_NGRAM + 1)


def test_a_rejected_start_and_the_prompts_repeats_leave_the_prediction_its_worth():
    """An answer that opens with a preamble the prediction lacks (a code fence) rejects the
    prediction's start, and the file quoted in the prompt offers the same text as a repeat
    that may fail too: neither may cost the prediction, re-anchored after the preamble, its
    turn. Its start and the sequence's own repeats are learnt apart from it (lookup.py,
    learning.Sources). With one Acceptance for every class, as before, the third round
    below drafted none of it and a model draft of 0.3 target steps a token drafted instead."""
    cost = CostModel(target_step=1.0, draft_step=0.3,
                     verify=tuple(1.0 + 0.05 * k for k in range(9)))

    def rounds(lookup, start_class):
        sched = AdaptiveK(cost, 8, Acceptance.starting_at(0.95), RoundTimes.from_cost(cost, 8),
                          lookup=lookup)
        taken = []
        for matched in (start_class, MAX_NGRAM, 2 * MAX_NGRAM):   # start, repeat, re-anchored
            sched.next_k()
            taken.append(sched.take_lookup(matched, 7, 8))
            sched.observe(taken[-1], 0)                # each rejected at its first token
        return taken

    apart = Sources(Acceptance(), Acceptance.starting_at(PREDICTION_PRIOR), MAX_NGRAM + 1)
    assert rounds(apart, 2 * MAX_NGRAM + 1)[2] > 0
    assert rounds(Acceptance.starting_at(PREDICTION_PRIOR), 2 * MAX_NGRAM)[2] == 0   # as before
    # declined, a prediction's worth drifts back to the client's claim, not to the prior's 0.5
    worth = Acceptance.starting_at(PREDICTION_PRIOR)
    worth.observe_run(7, 0, 2 * MAX_NGRAM)
    for _ in range(200):
        worth.forget()
    assert worth.alpha == pytest.approx(PREDICTION_PRIOR, abs=0.01)


def test_a_preamble_the_prediction_lacks_does_not_stop_it_drafting(gen):
    """The target's own answer as the prediction, less its first tokens (the answer opens with
    what the client did not predict): after that start is rejected, the rest is drafted from
    the prediction and accepted."""
    accepted = predicted = 0
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=48, k=0).token_ids
        res = gen.generate(prompt, max_new_tokens=48, k="auto", prediction=alone[3:])
        assert res.token_ids == alone
        accepted += res.stats.prediction_accepted
        predicted += max(len(alone) - 4, 0)          # all but the preamble and the last
    # (75 of 90 here; 17 when the first token of the preamble anchored the prediction at that
    # token's first occurrence in it, and the start was never offered again)
    assert accepted >= 0.6 * predicted, (accepted, predicted)


def test_a_draft_left_behind_by_a_prediction_does_not_catch_up_for_its_last_token(
        bundle_factory, monkeypatch):
    """An answer the prediction covers but for its last token: every round drafts from the
    prediction, the draft model sees none of it, and the last round (the prediction spent)
    decodes one token plainly rather than prefilling the whole answer into the draft to draft
    it (Loop.round, design §6). Before, that round cost a catch-up of 40-odd tokens here."""
    gen = Generator.load(bundle_factory("llama", "llama_cut"), threads=1)   # its own prices
    gen.knowledge.cost_model()                                # the calibration's calls aside
    # prices and an acceptance at which the model's drafts pay whenever lookup has none
    gen.knowledge.cost = CostModel(target_step=1.0, draft_step=0.05,
                          verify=tuple(1.0 + 0.01 * k for k in range(9)))
    gen.knowledge.learnt["greedy"] = Acceptance(accepted=90.0, rejected=10.0, measured=True)
    fed = []
    draft = gen.draft
    for name in ("forward", "prefill", "forward_rows"):
        real = getattr(draft, name)
        monkeypatch.setattr(draft, name, lambda ids, *a, real=real, **kw:
                            fed.append(np.shape(ids)[-1]) or real(ids, *a, **kw))
    every = []
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=48, k=0, ignore_eos=True).token_ids
        every.append(alone)
        fed.clear()
        res = gen.generate(prompt, max_new_tokens=48, k="auto", prediction=alone[:-1],
                           ignore_eos=True, draft_source="model")   # no lookup in the text
        assert res.token_ids == alone
        assert res.stats.prediction_accepted >= 0.8 * (len(alone) - 1)
        # what the draft was fed in one call: a round's worth at most (k + the pending token)
        assert max(fed, default=0) <= gen.manifest.max_draft + 1, (prompt, fed)
    # the same in a batch (ssd-serve's path): the rule is the loop's, for every row
    gen.generate_batch(PROMPTS, max_new_tokens=2, k="auto")      # its calibration aside
    fed.clear()
    results = gen.generate_batch([{"prompt": p, "prediction": a[:-1]}
                                  for p, a in zip(PROMPTS, every)], max_new_tokens=48,
                                 k="auto", ignore_eos=True, draft_source="model")
    assert [r.token_ids for r in results] == every
    assert max(fed, default=0) <= gen.manifest.max_draft + 1, fed


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
