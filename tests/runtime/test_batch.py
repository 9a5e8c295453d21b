"""Batches are lossless per sequence: each sequence's output in a batch is what it gives alone.

Greedy: token-identical to the same prompt decoded alone at k=0 and to Hugging Face generate,
whatever its neighbours (other lengths, settings, EOS rounds, joining and leaving, one at the
context end). Seeded sampling: the tokens it gives alone. Unseeded sampling: the exact
distribution (chi-square against enumeration) beside neighbours with other settings.
"""
from __future__ import annotations

import json

import pytest

from ssd_runtime import ConfigError, Generator

from test_lossless import prompt_ids
from test_sampling import PROMPT, SETTINGS, chi_square_p, exact_joint, first_two

NEW = 24
# (target, draft, graph): the default flavour ("ort" where it fits; ALiBi stays standard),
# the standard one that GPU bundles carry and the static one (whole caches written in place,
# several new tokens per row in one call); sliding windows, learned positions, ALiBi, full
# acceptance
PAIRS = [("llama", "llama_cut", "auto"), ("llama", "llama", "auto"),
         ("mistral", "mistral_cut", "auto"), ("qwen2", "qwen2_cut", "auto"),
         ("falcon_alibi", "falcon_alibi_cut", "auto"),
         ("llama", "llama_cut", "standard"), ("mistral", "mistral_cut", "standard"),
         ("gpt2", "opt_cut", "standard"),
         ("llama", "llama_cut", "static"), ("mistral", "mistral_cut", "static"),
         ("falcon_alibi", "falcon_alibi_cut", "static"), ("gpt2", "opt_cut", "static")]


@pytest.fixture(scope="module")
def hf_reference(models):
    """Hugging Face greedy continuations of prompts of 1, 7 and 40 tokens, per target."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = {}
    for target in {t for t, _, _ in PAIRS}:
        model = AutoModelForCausalLM.from_pretrained(models[target]).eval()
        for n in (1, 7, 40):
            ids = torch.tensor([prompt_ids(n)])
            out = model.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=2,
                                 attention_mask=torch.ones_like(ids))
            ref[target, n] = out[0, n:].tolist()
    return ref


def batch_prompts() -> list[dict]:
    """Six prompts for four slots: two join when others leave. Lengths 1, 7, 40; own
    max_new_tokens (they leave at different rounds); one made to end early on EOS by a bias
    on an EOS id; one capped at k=0."""
    return [dict(prompt=prompt_ids(7), max_new_tokens=NEW),
            dict(prompt=prompt_ids(1), max_new_tokens=5),
            dict(prompt=prompt_ids(40), max_new_tokens=NEW),
            dict(prompt=prompt_ids(7)[:4], max_new_tokens=9, k=0),
            dict(prompt=prompt_ids(40)[:20], max_new_tokens=NEW, logit_bias={1: 6.0}),
            dict(prompt=prompt_ids(1) + [9, 9], max_new_tokens=NEW - 3)]


# the fast subset (-m "not slow") keeps one pair per flavour
RUNS = [pytest.param(*p, marks=() if p in (("llama", "llama_cut", "auto"),
                                           ("llama", "llama_cut", "standard"),
                                           ("llama", "llama_cut", "static"))
                     else pytest.mark.slow) for p in PAIRS]


@pytest.mark.parametrize("target,draft,graph", RUNS, ids=[f"{t}+{d}-{g}" for t, d, g in PAIRS])
def test_batch_equals_each_sequence_alone(bundle_factory, hf_reference, target, draft, graph):
    gen = Generator.load(bundle_factory(target, draft, graph=graph), max_batch=4, threads=1)
    prompts = batch_prompts()
    alone = []
    for p in prompts:
        p = dict(p)
        alone.append(gen.generate(p.pop("prompt"), **{**p, "k": 0}))
    for n, res in zip((7, 1, 40), (alone[0], alone[1], alone[2])):   # k=0 alone is HF's
        assert res.token_ids == hf_reference[target, n][:len(res.token_ids)]
    assert alone[4].stop_reason == "eos" and len(alone[4].token_ids) < NEW, \
        "the biased prompt should end early on EOS"
    for k in (0, 3, "auto"):
        batch = gen.generate_batch(prompts, k=k)
        for i, (got, want) in enumerate(zip(batch, alone)):
            assert got.token_ids == want.token_ids, f"k={k}: prompt {i} differs in the batch"
            assert got.stop_reason == want.stop_reason
            assert got.text == want.text
        if k == 3 and draft == target:
            assert sum(r.stats.accepted for r in batch) > 0


@pytest.mark.parametrize("graph", ["auto", pytest.param("standard", marks=pytest.mark.slow),
                                   pytest.param("static", marks=pytest.mark.slow)])
def test_a_sequence_reaching_the_context_end_leaves_the_others_right(bundle_factory, graph):
    gen = Generator.load(bundle_factory("llama", "llama_cut", max_context=64, graph=graph),
                         max_batch=3, threads=1)
    prompts = [prompt_ids(40)[:50], prompt_ids(7), prompt_ids(1)]
    alone = [gen.generate(p, max_new_tokens=40, k=0) for p in prompts]
    assert alone[0].stop_reason == "context"
    for k in (2, "auto"):
        batch = gen.generate_batch(prompts, max_new_tokens=40, k=k)
        assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
        assert [r.stop_reason for r in batch] == [r.stop_reason for r in alone]


def test_each_row_drafts_what_it_drafts_alone(bundle_factory):
    """At a fixed k a row's drafts depend on it alone: rows that stop drafting early in a round
    (k=1 beside k=4, one near its max_new_tokens) keep their draft caches, so every row drafts
    and has accepted exactly what it does decoded by itself (a dummy token written over a
    row's valid draft rows would show here as other acceptance, never as other output)."""
    gen = Generator.load(bundle_factory("llama", "llama", graph="auto"), max_batch=4, threads=1)
    asks = [dict(prompt=prompt_ids(7), k=1, max_new_tokens=20),
            dict(prompt=prompt_ids(40), k=4, max_new_tokens=30),
            dict(prompt=prompt_ids(1), k=4, max_new_tokens=9),
            dict(prompt=prompt_ids(7)[:5], k=2, max_new_tokens=25)]
    together = gen.generate_batch(asks, k=4)
    for ask, res in zip(asks, together):
        alone = gen.generate(**ask)
        assert res.token_ids == alone.token_ids
        assert (res.stats.drafted, res.stats.accepted) == \
            (alone.stats.drafted, alone.stats.accepted), ask


def test_a_draft_left_behind_while_the_batch_did_not_draft_catches_up(bundle_factory,
                                                                     monkeypatch):
    """Rows prefill their draft only while the batch drafts (its last cap not 0): a prompt
    whose first chunks went in while the batch did not draft skips the draft for the rest of
    its prompt too, and its draft catches up when it first drafts, drafting and having
    accepted what it does alone."""
    import ssd_runtime.batch as batch_module

    monkeypatch.setattr(batch_module, "PREFILL_BUDGET", 16)
    gen = Generator.load(bundle_factory("llama", "llama", graph="auto"), max_batch=2, threads=1)
    prompt = prompt_ids(40)
    with gen.batch(k=4) as batch:
        batch.planner.k = 0                   # a size where k = 0 pays
        batch.add(prompt, max_new_tokens=20)
        batch.step()                         # chunk 1: the target alone
        row = batch._running()[0].row
        assert (row.target_len, row.drafter.draft_len) == (16, 0)
        batch.planner.k = 4                  # the batch's own k again
        batch.step()                         # chunk 2 (the draft stays behind), and so on
        assert row.drafter.draft_len == 0
        results = []
        while batch.active:
            results += [e.result for e in batch.step() if e.result is not None]
    alone = gen.generate(prompt, max_new_tokens=20, k=4)
    assert results[0].token_ids == alone.token_ids
    assert (results[0].stats.drafted, results[0].stats.accepted) == \
        (alone.stats.drafted, alone.stats.accepted)


def test_seeded_sampling_gives_the_tokens_it_gives_alone(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)
    prompts = [dict(prompt=prompt_ids(7), temperature=0.8, seed=1),
               dict(prompt=prompt_ids(40), temperature=1.0, top_p=0.9, seed=2),
               dict(prompt=prompt_ids(1), seed=3, temperature=1.2, top_k=20,
                    repetition_penalty=1.3),
               dict(prompt=prompt_ids(7)[:3])]                           # greedy beside them
    alone = []
    for p in prompts:
        p = dict(p)
        alone.append(gen.generate(p.pop("prompt"), max_new_tokens=NEW, k=0, **p).token_ids)
    for k in (4, "auto"):
        assert [r.token_ids for r in gen.generate_batch(prompts, max_new_tokens=NEW, k=k)] == alone


@pytest.fixture(scope="module")
def small_batch(small_vocab_bundle):
    bundle, target_dir = small_vocab_bundle
    return Generator.load(bundle, max_batch=4, threads=1), target_dir


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 4])
def test_unseeded_sampling_in_a_batch_follows_the_target(small_batch, k):
    """Two sequences of one setting sampled beside two of other settings (rejection rule)."""
    gen, target_dir = small_batch
    setting, other = SETTINGS[1], SETTINGS[2]
    joint = exact_joint(target_dir, setting)
    counted = dict(prompt=PROMPT, coupling="rejection", **setting)
    beside = dict(prompt=PROMPT[:2], coupling="rejection", max_new_tokens=3, **other)
    samples = []
    for _ in range(750):
        res = gen.generate_batch([counted, beside, counted, beside], max_new_tokens=k + 1, k=k)
        samples += [first_two(res[0].token_ids), first_two(res[2].token_ids)]
    p = chi_square_p(samples, joint)
    assert p > 1e-3, f"batched samples do not follow the target (chi-square p={p:.2g})"


def test_the_step_api_joins_cancels_and_streams(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=2, threads=1)
    want = {n: gen.generate(prompt_ids(n), max_new_tokens=NEW, k=0) for n in (1, 7, 40)}
    texts: dict[int, str] = {}
    results = {}
    with gen.batch(k=3) as batch:
        a = batch.add(prompt_ids(7), max_new_tokens=NEW)
        b = batch.add(prompt_ids(40), max_new_tokens=NEW)
        c = batch.add(prompt_ids(1), max_new_tokens=NEW)        # waits: two slots
        assert batch.active == 3
        rounds = 0
        while batch.active:
            for event in batch.step():
                texts[event.id] = texts.get(event.id, "") + event.text
                if event.result is not None:
                    results[event.id] = event.result
            rounds += 1
            if rounds == 2:
                assert batch.cancel(b)                           # frees its slot for c
        assert not batch.cancel(12345)
    assert results[b].stop_reason == "cancelled"
    assert results[b].token_ids == want[40].token_ids[:len(results[b].token_ids)]
    for seq, n in ((a, 7), (c, 1)):
        assert results[seq].token_ids == want[n].token_ids
        assert texts[seq] == results[seq].text == want[n].text
    gen.generate(prompt_ids(7), max_new_tokens=4)               # the generator is free again


def test_bad_batches_are_refused_by_name(bundle_factory, tmp_path):
    path = bundle_factory("llama", "llama_cut", max_context=64)
    gen = Generator.load(path, max_batch=2, threads=1)
    with pytest.raises(ConfigError, match="non-empty list"):
        gen.generate_batch([])
    with pytest.raises(ConfigError, match="non-empty list"):
        gen.generate_batch("one prompt")
    res = gen.generate_batch([prompt_ids(7), list(range(3, 80)), dict(prompt=prompt_ids(1),
                                                                      temperature=-1.0),
                              dict(max_new_tokens=3), prompt_ids(1)], max_new_tokens=8, k=2)
    assert [r.stop_reason for r in res] == ["length", "error", "error", "error", "length"]
    assert "max_context" in res[1].error and "temperature" in res[2].error
    assert "no 'prompt'" in res[3].error
    assert res[0].token_ids == gen.generate(prompt_ids(7), max_new_tokens=8, k=0).token_ids
    split = gen.generate_batch([prompt_ids(7)], mode="split")[0]
    assert split.stop_reason == "error" and "sequential mode only" in split.error
    with pytest.raises(ConfigError, match="max_batch=17 is more than"):
        Generator.load(path, max_batch=17)
    with pytest.raises(ConfigError, match="positive integer"):
        Generator.load(path, max_batch=0)
    with gen.batch() as batch:                                   # one user at a time
        with pytest.raises(ConfigError, match="already decoding"):
            gen.generate(prompt_ids(7), max_new_tokens=2)
        batch.add(prompt_ids(7), max_new_tokens=2)
    # a bundle from before schema 6 took one sequence per call
    import shutil

    old = tmp_path / "old"
    shutil.copytree(path, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["schema_version"] = 5
    del manifest["max_batch"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    Generator.load(old, threads=1).generate(prompt_ids(7), max_new_tokens=2)
    with pytest.raises(ConfigError, match="before schema 6.*--max-batch 4"):
        Generator.load(old, max_batch=4)


def test_batch_cost_model_prices_each_batch_size(bundle_factory):
    """k under load: the draft step and verification are measured per batch size, the
    chosen k maximises the batch's expected tokens per second, and falls to 0 when a draft
    step costs as much as a verification (speculation no longer pays)."""
    from ssd_runtime.scheduler.batch_cost import BatchCost
    from ssd_runtime.scheduler.learning import Acceptance

    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)
    with gen.batch() as batch:
        for rows in (1, 3):
            cost = batch.planner.cost(rows)
            assert cost.rows == (1 if rows == 1 else 4)
            assert cost.draft_step > 0 and cost.verify_time(1) > 0
            assert batch.planner.cost(rows) is cost                      # measured once
        batch.add(prompt_ids(7))
        batch.step()
        # one sequence plans alone, as it does decoded by itself (its schedule, no cap)
        assert batch.planner.plan([s.row for s in batch._running()], 1) is None
        batch.add(prompt_ids(9))
        batch.step()
        run = batch._running()
        assert len(run) == 2
        for seq in run:
            seq.row.schedule.learnt = Acceptance(accepted=90.0, rejected=10.0)   # α = 0.9
        gen.knowledge.batch_costs[2] = BatchCost(2, 0.01e-3, ((1, 1e-3), (9, 1.2e-3)))
        assert batch.planner.plan([s.row for s in run], 2) == gen.manifest.max_draft
        gen.knowledge.batch_costs[2] = BatchCost(2, 1e-3, ((1, 1e-3), (9, 9e-3)))  # compute-bound
        assert batch.planner.plan([s.row for s in run], 2) == 0


def test_a_plan_that_comes_out_the_same_stands_longer(bundle_factory, monkeypatch):
    """k="auto" in a batch re-plans every REPLAN_EVERY rounds; a plan that came out as the last
    one did stands twice as long each time, up to REPLAN_LONGEST (at prices where drafting
    never pays, 96 rounds of 4 rows made 12 plans, each ~0.3 ms: 9% of a tiny target's
    rounds). Rows joining re-plan at once, and the rows are what they are alone."""
    import ssd_runtime.scheduler.planner as planner_module
    from ssd_runtime.scheduler.batch_cost import BatchCost

    plans = []
    real = planner_module.plan
    monkeypatch.setattr(planner_module, "plan", lambda *a: plans.append(1) or real(*a))
    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)
    prompts = [prompt_ids(40), prompt_ids(7), prompt_ids(9), prompt_ids(20)]
    alone = [gen.generate(p, max_new_tokens=96, k=0).token_ids for p in prompts]
    compute_bound = ((1, 1e-3), (9, 9e-3))              # drafting never pays
    gen.knowledge.batch_costs = {r: BatchCost(r, 1e-3, compute_bound) for r in (1, 2, 4)}
    gen.knowledge.live_costs, gen.knowledge.draft_prefill = {}, 0.0
    results = gen.generate_batch(prompts, max_new_tokens=96, k="auto", draft_source="model")
    assert [r.token_ids for r in results] == alone
    assert all(r.stats.drafted == 0 for r in results)
    # 4 rows for 96 rounds: plans at rounds 0, 8, 24, 56 (and one per newcomer's prefill)
    assert len(plans) <= 8, len(plans)


def test_a_newcomer_whose_drafts_would_not_pay_for_its_prefill_decodes_at_k0(bundle_factory):
    """k="auto" in a batch (batch_cost.fed): at prices where rounds of 4 rows pay for drafting
    but the draft's prefill of each newcomer's prompt costs more than its drafts could save,
    no row's draft is prefilled or run, and each row is what it is alone at k=0; the same
    batch at a free prefill drafts."""
    from ssd_runtime.scheduler.batch_cost import BatchCost

    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)
    prompts = [prompt_ids(40), prompt_ids(7), prompt_ids(7)[:5], prompt_ids(40)[:20]]
    alone = [gen.generate(p, max_new_tokens=NEW, k=0).token_ids for p in prompts]
    cheap_rounds = ((1, 1e-3), (9, 1.05e-3))      # drafting pays at any acceptance
    for prefill, drafts in ((1.0, False), (0.0, True)):     # seconds a token
        gen.knowledge.batch_costs = {r: BatchCost(r, 1e-6, cheap_rounds) for r in (1, 2, 4)}
        gen.knowledge.live_costs, gen.knowledge.draft_prefill = {}, prefill
        with gen.batch(k="auto") as batch:
            for p in prompts:
                batch.add(p, max_new_tokens=NEW, draft_source="model")
            batch.step()                              # the prompts' prefill, then a round
            rows = [s.row for s in batch._running()]
            assert [r.drafter.draft_len > 0 for r in rows] == [drafts] * 4
            assert [r.drafter.fed for r in rows] == [drafts] * 4
            results = {}
            while batch.active:
                results.update({e.id: e.result for e in batch.step() if e.result is not None})
        assert [results[i].token_ids for i in range(4)] == alone
        assert all((r.stats.draft_calls > 0) == drafts for r in results.values())


def test_a_batch_stops_drafting_where_its_rounds_say_drafting_loses(bundle_factory):
    """k="auto" in a batch: where the prices say drafting pays but the batch's own rounds
    say its k = 0 rounds give more tokens a second (batch_cost.Realized, set here as if
    measured), the rounds run at k = 0 without drafting; each row is still what it is alone.
    The same batch with no such record drafts after one round at k = 0 that measures. (Each
    request asks k=4, a cap its own schedule drafts up to, so only the batch decides.)"""
    from ssd_runtime.scheduler.batch_cost import BatchCost, Realized

    n = Realized.HOLD                               # tokens a row: the hold's rounds at k = 0

    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=4, threads=1)
    prompts = [prompt_ids(40), prompt_ids(7), prompt_ids(9), prompt_ids(20)]
    alone = [gen.generate(p, max_new_tokens=n, k=0).token_ids for p in prompts]
    cheap_rounds = ((1, 1e-3), (9, 1.05e-3))      # drafting pays at any acceptance
    for lost in (True, False):
        gen.knowledge.batch_costs = {r: BatchCost(r, 1e-6, cheap_rounds) for r in (1, 2, 4)}
        gen.knowledge.live_costs, gen.knowledge.draft_prefill = {}, 0.0
        gen.knowledge.realized = {}
        if lost:
            guard = gen.knowledge.realized[4] = Realized()
            guard.observe(False, 4, 1e-3)
            for _ in range(Realized.MIN_DRAFTED):
                guard.observe(True, 8, 1.0)        # a second a token: drafting lost
        with gen.batch(k="auto") as batch:
            for p in prompts:
                batch.add(p, max_new_tokens=n, k=4, draft_source="model")
            results = {}
            while batch.active:
                results.update({e.id: e.result for e in batch.step() if e.result is not None})
        assert [results[i].token_ids for i in range(4)] == alone
        drafted = sum(r.stats.drafted for r in results.values())
        guard = gen.knowledge.realized[4]
        if lost:
            assert drafted == 0 and guard.held > 0 and guard.probes == 0
        else:
            assert drafted > 0 and guard.probes >= 1


def test_generate_and_stream_are_a_batch_of_one(bundle_factory, monkeypatch):
    """One engine: generate and stream step a batch of one slot (batch.py), and give what that
    batch gives when driven by hand: the same tokens, text, stop reason and counts."""
    import ssd_runtime.batch as batch_module

    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=2, threads=1)
    steps = []
    real = batch_module.Batch.step
    monkeypatch.setattr(batch_module.Batch, "step",
                        lambda self: steps.append(len(self.slots)) or real(self))
    res = gen.generate(prompt_ids(40), max_new_tokens=NEW, k=3)
    assert steps and set(steps) == {1}                    # every step over one slot
    streamed = "".join(gen.stream(prompt_ids(40), max_new_tokens=NEW, k=3))
    assert streamed == res.text == gen.last_result.text
    monkeypatch.undo()
    with gen.batch(k=3, slots=1) as batch:
        batch.add(prompt_ids(40), max_new_tokens=NEW)
        events = []
        while batch.active:
            events += batch.step()
    by_hand = events[-1].result
    assert (by_hand.token_ids, by_hand.text, by_hand.stop_reason) == \
        (res.token_ids, res.text, res.stop_reason)
    assert (by_hand.stats.drafted, by_hand.stats.accepted, by_hand.stats.rounds) == \
        (res.stats.drafted, res.stats.accepted, res.stats.rounds)
    assert res.stats.mode == "sequential" and res.stats.prompt_tokens == 40


def test_split_mode_is_for_a_batch_of_one_slot(bundle_factory):
    """Split mode drafts on a core of its own beside the verification: a batch of one slot
    (generate, stream, a one-slot server) runs it, a batch of several refuses it by name."""
    gen = Generator.load(bundle_factory("llama", "llama_cut"), max_batch=2, threads=1)
    alone = gen.generate(prompt_ids(7), max_new_tokens=NEW, k=0).token_ids
    with gen.batch(k=4, slots=1) as batch:
        batch.add(prompt_ids(7), max_new_tokens=NEW, mode="split")
        results = []
        while batch.active:
            results += [e.result for e in batch.step() if e.result is not None]
    assert results[0].token_ids == alone and results[0].stats.mode == "split"
    assert results[0].stats.split_bets > 0
    with gen.batch(k=4) as batch:
        with pytest.raises(ConfigError, match="sequential mode only"):
            batch.add(prompt_ids(7), mode="split")
