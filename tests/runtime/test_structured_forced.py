"""Tokens a response_format's grammar forces (docs/design.md §4, "Forced tokens"): drafted for
free at the front of a round and after each model token, verified in the round's one call, so
a forced run costs no round of its own; the output is exactly constrained k = 0's without
them (greedy and seeded sampling, alone and in a batch, logprobs, a max_tokens that cuts a
run), and the schedule learns nothing from them."""
from __future__ import annotations

import json

import numpy as np
import pytest
from alone import decode

pytest.importorskip("llguidance", reason="structured outputs need llguidance")

from ssd_runtime import Generator  # noqa: E402
from ssd_runtime.round.acceptance import GreedyAcceptance  # noqa: E402
from ssd_runtime.round.drafting import Drafter  # noqa: E402
from ssd_runtime.round.loop import Stats  # noqa: E402
from ssd_runtime.scheduler.cost import CostModel  # noqa: E402
from ssd_runtime.scheduler.learning import Acceptance  # noqa: E402
from ssd_runtime.scheduler.schedule import AdaptiveK, FixedK  # noqa: E402

PROMPTS = ([0, 17, 42, 99, 17, 42], [3, 9, 4], "def read(path):", [5, 6, 7, 8])
# long property names: runs of several forced tokens on the tests' small tokenizer
NAMES = ("first_flag", "colour_name", "small_number")
SCHEMA = {"type": "object", "additionalProperties": False, "required": list(NAMES),
          "properties": {NAMES[0]: {"type": "boolean"},
                         NAMES[1]: {"enum": ["red", "green", "blue"]},
                         NAMES[2]: {"type": "integer", "minimum": 0, "maximum": 99}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
SAMPLED = {"temperature": 0.9, "seed": 5}       # seeded: the invariant coupling


@pytest.fixture(scope="module")
def gen(bundle_factory):
    return Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)


def _today(gen, prompt, max_new_tokens=80, **setting):
    """Constrained k = 0 drafting nothing: the reference."""
    return gen.generate(prompt, max_new_tokens=max_new_tokens, k=0, response_format=FORMAT,
                        forced_tokens=False, **setting)


def test_a_round_drafts_the_tokens_the_grammar_forces(gen):
    """The first round of a constrained k = 0 verifies the grammar's forced tokens
    (llguidance's fast-forward tokens from the start), as many as the bundle's max_draft,
    beside the last prompt token."""
    constraint = gen.constraint(FORMAT)
    forced = constraint.matcher().matcher.compute_ff_tokens()
    most = gen.manifest.max_draft                # a verification's drafts: the run is cut
    assert len(forced) > most, forced            # '{"' and the first name's tokens
    expected = forced[:most]
    with gen.batch(k=0, slots=1) as batch:
        batch.add(PROMPTS[0], max_new_tokens=80, response_format=constraint)
        events = batch.step()
        row = batch.slots[0].row
        assert row.drafts == expected and row.drafter.forced_at == list(range(len(expected)))
        assert events[0].tokens[:len(expected)] == expected    # all passed, and one more
        assert len(events[0].tokens) == len(expected) + 1


@pytest.mark.parametrize("setting", [{}, SAMPLED], ids=["greedy", "seeded"])
def test_forced_tokens_leave_the_output_and_save_rounds(gen, setting):
    for prompt in PROMPTS:
        today = _today(gen, prompt, **setting)
        assert today.stop_reason == "eos", today
        value = json.loads(today.text)
        assert list(value) == list(NAMES)
        assert today.stats.forced == 0 and today.stats.rounds == len(today.token_ids)
        for k in (0, 4, "auto"):
            res = gen.generate(prompt, max_new_tokens=80, k=k, response_format=FORMAT,
                               **setting)
            st = res.stats
            assert res.token_ids == today.token_ids, (prompt, k)
            assert st.forced >= 10 and st.forced_accepted == st.forced, (prompt, k, st)
            assert st.accepted <= st.drafted                   # forced ones counted apart
            if k == 0:
                assert st.drafted == 0 and st.draft_calls == 0
                assert st.target_calls == st.rounds <= today.stats.rounds - st.forced
            off = gen.generate(prompt, max_new_tokens=80, k=k, response_format=FORMAT,
                               forced_tokens=False, **setting)
            assert off.token_ids == today.token_ids and off.stats.forced == 0
            if k == 4:                                         # no draft step for them
                assert st.draft_calls < off.stats.draft_calls, (st, off.stats)


def test_a_stop_string_ends_the_output_where_k0_ends_it(gen):
    today = _today(gen, PROMPTS[1])
    stop = f'"{NAMES[2]}'                        # inside the last forced run
    cut = today.text.index(stop)
    for k in (0, 4, "auto"):
        res = gen.generate(PROMPTS[1], max_new_tokens=80, k=k, response_format=FORMAT,
                           stop=[stop])
        alone = gen.generate(PROMPTS[1], max_new_tokens=80, k=0, response_format=FORMAT,
                             forced_tokens=False, stop=[stop])
        assert res.stop_reason == alone.stop_reason == "stop"
        assert res.text == alone.text == today.text[:cut] and res.token_ids == alone.token_ids


@pytest.mark.parametrize("k", [0, 4, "auto"])
def test_max_tokens_cuts_a_forced_run_as_k0(gen, k):
    """max_tokens inside a run of forced tokens: the run is cut to the row's room, and the
    output is constrained k = 0's, cut there ("length")."""
    today = _today(gen, PROMPTS[2])
    matcher = gen.constraint(FORMAT).matcher().matcher
    runs = []                                    # (position, length) of each forced run
    for i, token in enumerate(today.token_ids):
        forced = matcher.compute_ff_tokens()
        if len(forced) >= 3:
            runs.append((i, len(forced)))
        matcher.consume_tokens([token])
    least = gen.constraint(FORMAT).least_tokens
    at, length = next((i, n) for i, n in runs if i + 1 >= least)   # a run max_tokens may cut
    for limit in (at + 1, at + length - 1):      # after its first token, before its last
        res = gen.generate(PROMPTS[2], max_new_tokens=limit, k=k, response_format=FORMAT)
        assert res.stop_reason == "length" and res.token_ids == today.token_ids[:limit], limit
        alone = _today(gen, PROMPTS[2], max_new_tokens=limit)
        assert res.token_ids == alone.token_ids


@pytest.mark.parametrize("k", [0, 4, "auto"])
def test_a_batch_of_four_gives_each_what_it_gives_alone(gen, k):
    alone = [_today(gen, p, **s).token_ids for p, s in zip(PROMPTS, ({}, SAMPLED, {}, SAMPLED))]
    results = gen.generate_batch([{"prompt": p, "response_format": FORMAT, **s}
                                  for p, s in zip(PROMPTS, ({}, SAMPLED, {}, SAMPLED))],
                                 max_new_tokens=80, k=k)
    assert [r.token_ids for r in results] == alone
    assert all(r.stats.forced >= 10 and r.stats.forced == r.stats.forced_accepted
               for r in results)


def test_logprobs_of_forced_tokens_are_the_targets_as_at_k0(gen):
    """A forced token's logprob is the target's own (log_softmax of its raw logits, as for
    every token: docs/serving.md), read from the row that verified it: what constrained k = 0
    reports, not the 0 of the masked distribution."""
    today = _today(gen, PROMPTS[0], logprobs=3)
    for k in (0, 4):
        res = gen.generate(PROMPTS[0], max_new_tokens=80, k=k, response_format=FORMAT,
                           logprobs=3)
        assert res.token_ids == today.token_ids and res.stats.forced > 0
        a, b = res.logprobs, today.logprobs
        assert [t.token for t in a] == [t.token for t in b]
        np.testing.assert_allclose([t.logprob for t in a], [t.logprob for t in b], atol=1e-4)
        for x, y in zip(a, b):
            assert [i for i, _ in x.top] == [i for i, _ in y.top]
        assert any(t.logprob < -1e-3 for t in a)     # raw: not the mask's 0


class ForcesAnyToken(GreedyAcceptance):
    """A rule whose grammar would force tokens the target need not take (none does: the check
    that the round judges forced tokens as drafts rather than trusting them)."""

    def forced(self, limit, pending=()):
        return [7, 8, 9][:limit]


def test_a_forced_token_is_judged_not_trusted(gen):
    prompt = PROMPTS[0]
    alone = gen.generate(prompt, max_new_tokens=24, k=0).token_ids
    for k in (0, 3):
        rule, schedule, stats = ForcesAnyToken(), FixedK(k), Stats()
        drafter = Drafter(gen.draft, rule, schedule)
        ids = [t for new in decode(gen.target, drafter, rule, list(prompt), 24, schedule,
                                   gen.eos_ids, stats) for t in new]
        assert ids == alone, k
        assert stats.forced_accepted < stats.forced


def _cost() -> CostModel:
    return CostModel(target_step=0.02, draft_step=0.004, verify=tuple(0.02 + 0.001 * i
                                                                      for i in range(9)),
                     draft_first=0.005)


def test_forced_tokens_teach_the_schedule_nothing():
    """A round of forced tokens alone leaves what AdaptiveK and FixedK learn of the model and
    of lookup as it was; the model's tokens after them are learnt as the model's."""
    for schedule in (AdaptiveK(_cost(), 8, Acceptance.starting_at(0.6),
                               lookup=Acceptance.starting_at(0.4)),
                     FixedK(4, learnt=Acceptance.starting_at(0.6),
                            lookup=Acceptance.starting_at(0.4))):
        model, lookup = schedule.learnt, schedule.lookup
        before = (model.alpha, model.measured, lookup.alpha, lookup.measured)
        schedule.next_k()
        schedule.observe(0, 0, 0.03, forced=6)         # six forced tokens passed, no other
        assert (model.alpha, model.measured, lookup.alpha, lookup.measured) == before
        schedule.next_k()
        schedule.observe(2, 0, 0.03, forced=6)         # then two model tokens, the first wrong
        assert model.alpha < before[0] and model.measured
        assert (lookup.alpha, lookup.measured) == before[2:]


def test_ssd_run_drafts_them_unless_told_not_to(bundle_factory, tmp_path, capsys):
    from ssd_runtime.cli import main

    bundle = str(bundle_factory("llama", "llama_cut"))
    schema = tmp_path / "thing.json"
    schema.write_text(json.dumps(SCHEMA))
    runs = []
    for extra in ([], ["--no-forced-tokens"]):
        assert main([bundle, "--prompt", "def f():", "--k", "0", "--json-schema", str(schema),
                     "--max-new-tokens", "80", "--json", *extra]) == 0
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    assert runs[0]["stats"]["forced"] > 0 == runs[1]["stats"]["forced"]
    assert runs[0]["stats"]["rounds"] < runs[1]["stats"]["rounds"]
