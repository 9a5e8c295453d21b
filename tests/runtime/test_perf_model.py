"""The performance model and the adaptive-k scheduler."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime import Generator
from ssd_runtime.scheduler.cost import CostModel, expected_tokens
from ssd_runtime.scheduler.learning import Acceptance
from ssd_runtime.scheduler.schedule import AdaptiveK, RoundTimes, top_probability


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
    # a dearer first step of the round (cold caches) is priced once per round
    cold = CostModel(cost.target_step, cost.draft_step, cost.verify, draft_first=0.2)
    assert cold.round_cost(k) == pytest.approx(0.2 + (k - 1) * cost.c + cost.v(k))
    assert cold.round_cost(0) == pytest.approx(1.0)
    assert cold.speedup(alpha, k) < cost.speedup(alpha, k)


def test_best_k_follows_alpha_and_costs():
    """The k adaptive k plans for (what the product decides with)."""
    def best_k(cost: CostModel, alpha: float) -> int:
        return AdaptiveK(cost, max_k=8).plan(alpha)[0]

    gpu, cpu = gpu_like(), cpu_like()
    assert best_k(gpu, 0.95) == 8 and best_k(gpu, 0.05) <= 1
    assert best_k(cpu, 0.8) < best_k(gpu, 0.8)
    ks = [best_k(gpu, a) for a in (0.2, 0.5, 0.7, 0.9)]
    assert ks == sorted(ks)
    assert best_k(cpu, 0.05) == 0


def test_adaptive_tracks_alpha():
    sched = AdaptiveK(gpu_like(), max_k=8)
    for _ in range(30):                 # every draft token accepted
        k = sched.next_k()
        sched.observe(k, k)
    assert sched.alpha > 0.9 and sched.next_k() == 8
    for _ in range(60):                 # every first draft token rejected
        sched.observe(sched.next_k(), 0)
    # one token may still pay at this cheap draft, a second one does not
    assert sched.alpha < 0.1 and not sched.keep_drafting(1, np.zeros((1, 4)))
    assert AdaptiveK(cpu_like(), 8, sched.learnt).next_k() == 0


def test_acceptance_learns_per_place_in_the_round():
    learnt = Acceptance()
    for _ in range(60):     # middling tokens fail first in a round and pass after accepted ones
        learnt.observe(1, 0, [0.55])
        learnt.observe(4, 4, [0.95, 0.95, 0.55, 0.55])
    tenth = learnt.chance(0.55)
    assert learnt.chance(0.55, 0) < tenth - 0.2 and learnt.chance(0.55, 2) > tenth + 0.2
    assert learnt.chance(0.55, 3) == learnt.chance(0.55, 2)      # places 3rd-4th share a bucket
    fresh = Acceptance()
    assert fresh.chance(0.55, 5) == pytest.approx(fresh.chance(0.55))   # no data: the tenth


def test_acceptance_forgets_old_rounds_at_its_rate_and_survives_a_rescale():
    learnt = Acceptance(prior=1e-9, place_prior=1e-9)      # the counts alone
    learnt.observe(1, 1, [0.95])                         # a confident token accepted ...
    learnt.observe(1, 0, [0.95])                         # ... then one rejected, a round later
    d = learnt.bin_decay                                  # the older round weighs d
    assert learnt.chance(0.95) == pytest.approx(d / (d + 1))
    before = [learnt.chance(t, p) for t in (0.35, 0.95) for p in (0, 1, 5)]
    learnt._rescale()
    assert learnt.scale == 1.0
    assert [learnt.chance(t, p) for t in (0.35, 0.95) for p in (0, 1, 5)] == \
        pytest.approx(before)


def test_acceptance_learns_per_confidence():
    learnt = Acceptance()
    for _ in range(40):     # confident tokens (top 0.95) survive, unsure ones (0.3) do not
        learnt.observe(3, 2, [0.95, 0.95, 0.3])
    assert learnt.chance(0.96) > 0.9 and learnt.chance(0.31) < 0.2
    assert learnt.chance(0.55) == pytest.approx(learnt.alpha)   # an unseen tenth: α


def test_adaptive_stops_drafting_when_the_draft_is_unsure():
    learnt = Acceptance(accepted=8.0, rejected=2.0)
    for _ in range(20):
        learnt.observe(3, 2, [0.95, 0.95, 0.3])
    sched = AdaptiveK(gpu_like(), max_k=8, learnt=learnt)
    confident = np.array([[10.0, 0.0, 0.0, 0.0]])    # top probability ~1
    unsure = np.array([[0.3, 0.0, 0.0, 0.0]])        # top probability ~0.31
    assert sched.next_k() >= 4
    assert sched.keep_drafting(1, confident) and sched.keep_drafting(2, confident)
    assert not sched.keep_drafting(3, unsure)
    sched.next_k()                                   # the next round starts afresh
    assert sched.keep_drafting(1, confident)
    # the graph's own (argmax, probability) is taken over the logits when given
    assert sched.keep_drafting(2, unsure, (0, 0.99)) and not sched.keep_drafting(3, confident,
                                                                                 (0, 0.3))
    # the round never drafts past its plan
    sched = AdaptiveK(gpu_like(), max_k=2, learnt=learnt)
    assert sched.next_k() == 2 and not sched.keep_drafting(2, confident)


def test_round_times_follow_the_rounds_but_not_one_outlier():
    times = RoundTimes([1.0, 2.0])
    times.observe(1, 100.0)                  # a preempted round counts as 25% over at most
    assert times.seconds == pytest.approx([1.25 ** 0.1, 2.0 * 1.25 ** 0.15])
    for _ in range(300):
        times.observe(1, 1.5)
    assert times.seconds[1] == pytest.approx(1.5, rel=1e-3)
    times.observe(5, 1.0)                    # past max_k (a bundle re-read elsewhere): ignored
    assert len(times.seconds) == 2


def test_round_times_keep_the_shape_when_the_machine_drifts():
    """A slow spell seen only through k = 8 rounds slows k = 4 alike (the ratio that decides
    is kept), while a shape the loop measures apart from the calibration's is learnt."""
    calibrated = [1.0 + 0.3 * k for k in range(9)]
    times = RoundTimes(calibrated)
    for _ in range(200):
        times.observe(8, 1.5 * calibrated[8])            # the machine 1.5x slower
    assert times.seconds[4] / times.seconds[8] == pytest.approx(calibrated[4] / calibrated[8],
                                                                rel=0.02)
    assert times.seconds[8] == pytest.approx(1.5 * calibrated[8], rel=1e-3)
    for _ in range(400):                     # in the loop, 8 drafted cost what 4 do
        times.observe(4, 1.5 * calibrated[4])
        times.observe(8, 1.5 * calibrated[4])
    # (calibrated 0.65; the pace wobbles a round's step, 2% at most, between 4 and 8)
    assert times.seconds[8] / times.seconds[4] == pytest.approx(1.0, rel=0.03)
    assert times.seconds[4] == pytest.approx(1.5 * calibrated[4], rel=0.03)


def test_adaptive_drafts_on_where_the_rounds_show_more_tokens_cost_little():
    """Tokens of middling confidence: with round times climbing 0.3 a token the round stops
    early; once the rounds measure that past 3 tokens more cost next to nothing, it goes on."""
    sched = AdaptiveK(gpu_like(), 8, Acceptance(accepted=8.0, rejected=2.0),      # α = 0.8
                      RoundTimes([1.0 + 0.3 * k for k in range(9)]))

    def drafted_in_a_round() -> int:
        for _ in range(8):                   # the plan is refreshed every 8 rounds
            sched.next_k()
        n = 1
        while sched.keep_drafting(n, np.zeros((1, 4))):     # top 0.25: a tenth with no data
            n += 1
        return n

    steep = drafted_in_a_round()
    for _ in range(60):
        for k in range(9):
            sched.times.observe(k, 1.0 + 0.3 * min(k, 3) + 0.01 * k)
    assert steep < 8 and drafted_in_a_round() == 8


def test_top_probability_is_the_softmax_maximum():
    rng = np.random.default_rng(0)
    scratch = np.empty(300, np.float32)
    for scale in (0.1, 3.0, 40.0):
        row = (rng.standard_normal(300) * scale).astype(np.float32)
        probs = np.exp(row.astype(np.float64) - row.max())
        assert top_probability(row, scratch) == pytest.approx(probs.max() / probs.sum(), rel=1e-5)
    assert top_probability(np.full(300, np.nan, np.float32), scratch) == 0.0


@pytest.mark.slow
def test_auto_on_a_real_bundle(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama"))   # the target is its own draft
    cost = gen.knowledge.cost_model()
    assert cost.target_step > 0 and cost.draft_step > 0 and len(cost.verify) == 9
    # a draft as dear as the target can never pay, even right every time (the export measured
    # agreement 1.0 for this pair): auto keeps to k = 0 but for its probes (the model's drafts
    # alone: lookup drafts cost no draft step and may pay). Timed, this bundle's int8 copy of
    # the target is cheaper than the target and may pay: the costs are set here.
    assert gen.manifest.pair_worth["agreement"] == 1.0
    gen.knowledge.cost = CostModel(target_step=1.0, draft_step=1.0,
                          verify=tuple(1.0 + 0.1 * k for k in range(9)))
    res = gen.generate([0, 5, 9], max_new_tokens=64, k="auto", draft_source="model")
    assert res.stats.k == "auto" and res.stats.mean_k < 0.5
    # with GPU-like costs the same pair (α = 1) drafts long rounds
    gen.knowledge.cost = gpu_like()
    gen.knowledge.times.clear()                 # the round times learnt so far came from the real costs
    res = gen.generate([0, 5, 9], max_new_tokens=64, k="auto", draft_source="model")
    assert res.stats.acceptance_rate == 1.0 and res.stats.mean_k > 3


def test_median_of_calibrations_takes_each_time_apart_and_keeps_verify_monotone():
    runs = [CostModel(1.0, 0.05, (1.0, 1.2, 1.5), draft_first=0.1),
            CostModel(1.4, 0.07, (1.4, 1.3, 1.6), draft_first=0.2),
            CostModel(1.1, 0.04, (1.1, 1.0, 1.9), draft_first=0.12)]
    m = CostModel.median(runs)
    assert (m.target_step, m.draft_step) == (1.1, 0.05)
    assert m.verify == (1.1, 1.2, 1.6)                 # medians 1.1, 1.2, 1.6: already rising
    assert m.c_first * m.target_step == pytest.approx(0.12)
    low = CostModel.median([CostModel(1.0, 0.05, (1.0, 0.9, 1.2)), runs[0], runs[0]])
    assert low.verify == (1.0, 1.2, 1.5)
    dip = CostModel.median([CostModel(1.0, 0.05, (1.0, 0.9, 1.2))] * 3)
    assert dip.verify == (1.0, 1.0, 1.2)               # a dip in k is noise: smoothed away


def test_a_plan_that_drafts_nothing_probes_with_growing_waits():
    """α is not measured while nothing is drafted: a probe of PROBE tokens every PROBE_EVERY
    rounds, the wait doubling after each probe with nothing accepted, reset by a hit. The
    first comes at once: α was only the export's estimate until a round measured it."""
    from ssd_runtime.scheduler.learning import PROBE, PROBE_EVERY

    sched = AdaptiveK(cpu_like(), 8, Acceptance.starting_at(0.02))
    probes, rounds = [], 0
    while len(probes) < 3:
        k = sched.next_k()
        rounds += 1
        if k:
            assert sched.model_cap == PROBE
            probes.append(rounds)
            assert sched.keep_drafting(1, np.zeros((1, 4)), (0, 0.01))   # past the rule
            assert not sched.keep_drafting(2, np.zeros((1, 4)), (0, 0.01))
        sched.observe(2 if k else 0, 0)
    assert probes == [1, 1 + 2 * PROBE_EVERY, 1 + 6 * PROBE_EVERY]    # waits 1, 32, 64
    assert sched.learnt.misses == 3
    while not sched.next_k():          # the next probe: its first token is accepted
        sched.observe(0, 0)
    sched.keep_drafting(1, np.zeros((1, 4)), (0, 0.9))
    sched.observe(2, 1)
    assert sched.learnt.misses == 0 and sched.alpha > 0.02


def test_a_pair_measured_at_no_agreement_plans_without_dividing_by_zero():
    for alpha in (0.0, 1.0):
        sched = AdaptiveK(cpu_like(), 8, Acceptance.starting_at(alpha))
        assert 0 < sched.alpha < 1
        sched.next_k()
    best, thresholds = AdaptiveK(cpu_like(), 8).plan(0.0)
    assert best == 0 and thresholds == [float("inf")] * 8


def test_a_batch_prices_speculation_from_its_own_rounds():
    """batch_cost.LiveCost: the calibration said drafting pays at this batch size; the
    batch's own rounds of 5 tokens take 3 times that, and k falls to 0 (speculation that its
    own measurements say costs more than it saves is not run). One preempted round alone
    does not move the choice."""
    from ssd_runtime.scheduler.batch_cost import BatchCost, LiveCost, best_k

    calibrated = BatchCost(4, 0.1e-3, ((1, 1.0e-3), (5, 1.2e-3), (9, 1.5e-3)))
    rows = [(0.6, None)] * 4
    live = LiveCost(calibrated)
    planned = best_k(rows, live, 8)
    assert planned >= 2
    live.observe(5, 50e-3, 4, 0.4e-3)          # one round 40x slow: at most 25% counted
    assert best_k(rows, live, 8) == planned and live.verify_time(5) < 1.03 * 1.2e-3
    for _ in range(60):                        # every 1-token round as calibrated,
        live.observe(1, 1.0e-3, 0, 0.0)
        live.observe(5, 3.6e-3, 4, 0.4e-3)     # every 5-token one three times slower
    assert live.verify_time(1) == pytest.approx(1.0e-3, rel=0.02)
    assert live.verify_time(5) == pytest.approx(3.6e-3, rel=0.05)
    assert best_k(rows, live, 8) == 0
    fresh = LiveCost(calibrated)               # a T never seen takes the machine's pace
    for _ in range(60):
        fresh.observe(1, 2.0e-3, 0, 0.0)
    assert fresh.verify_time(9) == pytest.approx(2 * 1.5e-3, rel=0.05)


def test_a_batch_prices_the_draft_calls_its_rounds_make():
    """A draft that feeds a round's pending token and its last as two calls (the ort flavour
    in a batch) pays one draft call more than its k steps in every drafting round, and
    nothing in a round that drafts nothing; the array form agrees with round_time."""
    from ssd_runtime.scheduler.batch_cost import BatchCost, LiveCost

    cost = BatchCost(4, 1e-3, ((1, 2e-3), (9, 4e-3)))
    split, whole = LiveCost(cost, extra_calls=1), LiveCost(cost)
    assert split.round_time(0) == whole.round_time(0) == pytest.approx(2e-3)
    assert split.round_time(4) == pytest.approx(whole.round_time(4) + 1e-3)
    for live in (split, whole):
        assert np.allclose(live.round_times(8), [live.round_time(k) for k in range(9)])


def test_a_busy_calibration_does_not_keep_drafting_priced_busy():
    """Calibrated in a busy moment (every call twice what it costs now), a batch that runs
    k = 0 rounds learns the quiet pace from them, and its unseen draft calls follow that pace:
    speculation stays priced as it is now, not as it was."""
    from ssd_runtime.scheduler.batch_cost import BatchCost, LiveCost, best_k

    busy = BatchCost(2, 24e-3, ((1, 62e-3), (5, 84e-3), (9, 118e-3)))
    quiet = BatchCost(2, 12e-3, ((1, 31e-3), (5, 42e-3), (9, 59e-3)))
    live = LiveCost(busy, extra_calls=1)
    for _ in range(200):                       # k = 0 rounds, as fast as quiet says
        live.observe(1, 31e-3, 0, 0.0)
    rows = [(0.95, None)] * 2
    assert live.draft_factor == pytest.approx(0.5, rel=0.05)
    assert best_k(rows, live, 8) == best_k(rows, LiveCost(quiet, extra_calls=1), 8) > 0


# SmolLM2-135M-Instruct with its int8 self-copy, calls of 2 and 4 rows as Batch.calibrate
# timed them on this machine (2026-12-04, threads 2:2, load average 3-6) and the draft's
# prefill (8.0 ms a token, batch_cost.measure_prefill); seconds
SMOL_2 = ((1, 135.0e-3), (2, 178.9e-3), (3, 183.1e-3), (5, 219.9e-3), (9, 275.9e-3))
SMOL_4 = ((1, 176.6e-3), (2, 223.7e-3), (3, 223.7e-3), (5, 276.7e-3), (9, 432.1e-3))


def test_a_newcomer_is_drafted_for_only_where_its_drafts_pay_for_the_drafts_prefill():
    """batch_cost.fed: a newcomer's draft must prefill its prompt before it drafts, which
    k = 0 never pays. At 2 rows of SmolLM2-135M drafted by its int8 copy, 128 tokens to go save
    more than a 60-token prompt's prefill costs; at 4 rows, at the prices its rounds measured
    (k = 0 rounds 113 ms, verifications of 7 tokens 285 ms and draft calls 53 ms, medians, same
    day), the rounds still pay for drafting but not for the prefill, so no newcomer is fed and
    the batch runs k = 0; a row whose draft is in step stays fed whatever the prices, and rows
    with 1,000 tokens to go are worth their prefill."""
    from ssd_runtime.scheduler.batch_cost import BatchCost, LiveCost, best_k, fed, gain_per_token

    two = LiveCost(BatchCost(2, 52.6e-3, SMOL_2), extra_calls=1, prefill=8.0e-3)
    assert fed([(0.94, None, 128, 60)] * 2, two, 8) == [True, True]
    four = LiveCost(BatchCost(4, 73.2e-3, SMOL_4), extra_calls=1, prefill=8.0e-3)
    for _ in range(100):
        four.observe(1, 113e-3, 0, 0.0)
        four.observe(7, 285e-3, 7, 7 * 53e-3)
    rows = [(0.94, None)] * 4
    assert best_k(rows, four, 8) > 0             # in step, drafting would pay a little ...
    gain = gain_per_token(rows, four, 8)
    assert 0 < 128 * gain < four.prefill_time(60)        # ... less than a prompt's prefill
    newcomers = [(0.94, None, 128, 60)] * 4
    assert fed(newcomers, four, 8) == [False] * 4
    assert best_k([(0.94, 0)] * 4, four, 8) == 0
    assert fed(newcomers[:3] + [(0.94, None, 128, 1)], four, 8) == [False] * 3 + [True]
    assert fed([(0.94, None, 1000, 60)] * 4, four, 8) == [True] * 4
    assert fed([(0.94, None, 128, 0)] * 4, LiveCost(BatchCost(4, 1.0, SMOL_4), prefill=1.0),
               8) == [True] * 4                  # in step: nothing to prefill, nothing to pay


def test_the_drafts_prefill_is_priced_at_the_drafts_pace():
    """LiveCost prices the draft's prefill at its calibration times the draft calls' pace
    (a few prefills a batch, many draft calls), corrected by the prefills it sees, one
    preempted prefill counting at most 25% over."""
    from ssd_runtime.scheduler.batch_cost import BatchCost, LiveCost

    live = LiveCost(BatchCost(2, 10e-3, ((1, 20e-3), (9, 40e-3))), prefill=5e-3)
    assert live.prefill_time(60) == pytest.approx(0.3)
    for _ in range(200):                         # the draft's calls now take twice as long
        live.observe(3, 30e-3, 2, 40e-3)
    assert live.prefill_time(60) == pytest.approx(0.6, rel=0.05)
    live.observe_prefill(60, 60.0)               # one prefill preempted for a minute
    assert live.prefill_time(60) < 0.6 * 1.03
    for _ in range(200):                         # prefills cost half what the pace says
        live.observe_prefill(60, 0.3)
    assert live.prefill_time(60) == pytest.approx(0.3, rel=0.05)


def test_what_the_rounds_gave_overrules_a_plan_that_drafts_at_a_loss():
    """batch_cost.Realized: a batch whose drafting rounds give fewer tokens a second than its
    k = 0 rounds (whatever the prices said) stops drafting for HOLD rounds, tries again, and
    each loss in a row doubles the hold; while drafting pays it drafts, and one round in
    PROBE_EVERY runs at k = 0 to keep that comparison current. Simulated over rounds of 4 rows:
    speculation at 0.7x k = 0 runs at >= 0.9x of k = 0 overall, at 1.3x it keeps >= 1.25x."""
    from ssd_runtime.scheduler.batch_cost import Realized

    def run(gain: float, rounds: int = 2000) -> float:
        guard, tokens, seconds = Realized(), 0, 0.0
        for _ in range(rounds):
            k = guard.decide(4)
            if k:       # a drafting round: 4 rows x 3 tokens, priced so that a token costs
                t, s = 12, 12 * 1e-3 / gain          # 1/gain of a plain round's
            else:
                t, s = 4, 4e-3
            guard.observe(k > 0, t, s)
            tokens, seconds = tokens + t, seconds + s
        return tokens / seconds / 1e3                # against k = 0's 1 token a ms

    assert run(0.7) >= 0.9
    assert run(1.3) >= 1.25
    guard = Realized()
    assert guard.decide(4) == 0 and guard.probes == 1      # nothing at k = 0 seen yet
    guard.observe(False, 4, 4e-3)
    assert guard.decide(0) == 0 and guard.probes == 1      # a plan of k = 0 is not a probe
    for _ in range(Realized.MIN_DRAFTED):
        assert guard.decide(4) == 4
        guard.observe(True, 8, 16e-3)                       # 2 ms a token against 1
    assert guard.decide(4) == 0 and guard.holding
    held = 1
    while guard.holding:
        assert guard.decide(4) == 0
        guard.observe(False, 4, 4e-3)
        held += 1
    assert held == Realized.HOLD
    for _ in range(Realized.MIN_DRAFTED):                  # tried again: judged afresh
        assert guard.decide(4) == 4
        guard.observe(True, 8, 16e-3)
    assert guard.decide(4) == 0 and guard.hold == 2 * Realized.HOLD - 1
    guard.observe(True, 0, 1.0)                             # no tokens: nothing learnt
    assert len(guard.drafted) == Realized.MIN_DRAFTED


def test_an_estimate_is_probed_at_once_and_lookup_does_not_take_the_probe():
    """The export's agreement is an estimate measured on its own text: a schedule that starts
    from one probes the model in its first round, and that round takes no lookup tokens
    (a text that repeats offers a continuation almost every round, which would displace the
    probe for good); once measured, probes wait their turn again."""
    from ssd_runtime.scheduler.learning import PROBE

    sched = AdaptiveK(cpu_like(), 8, Acceptance.starting_at(0.0),
                      lookup=Acceptance.starting_at(0.9))
    assert sched.next_k() == 8 and sched.model_cap == PROBE
    assert sched.take_lookup(3, 6, 8) == 0
    for n in (1, 2):
        sched.keep_drafting(n, np.zeros((1, 4)), (0, 0.9))
    sched.observe(PROBE, PROBE)                     # both accepted: α measured, and higher
    assert sched.learnt.measured and sched.alpha > 0.3
    sched.next_k()
    assert sched.take_lookup(3, 6, 8) > 0           # an ordinary round: lookup as before


def test_a_draft_that_cannot_pay_at_any_acceptance_is_not_probed():
    """A probe measures α; where even α = 1 would not pay (a draft step as dear as the target's:
    SmolLM2-135M's int8 copy beside its int8 target), it could not change the plan, and each
    cost a catch-up of the rounds since (0.92x k=0 before, 1.03x without): such a draft is
    probed only at the longest wait (its round times could still correct a wrong price)."""
    from ssd_runtime.scheduler.learning import PROBE_BACKOFF, PROBE_EVERY

    dear = CostModel(target_step=1.0, draft_step=1.0, verify=tuple(1.0 + 0.12 * k
                                                                    for k in range(9)))
    sched = AdaptiveK(dear, 8, Acceptance.starting_at(1.0))
    probes = [r for r in range(1, 3000) if sched.next_k()]
    assert probes[:2] == [PROBE_EVERY << PROBE_BACKOFF, 2 * (PROBE_EVERY << PROBE_BACKOFF)]
    cheap = AdaptiveK(cpu_like(), 8, Acceptance.starting_at(0.0))
    assert any(cheap.next_k() for _ in range(20))      # an estimate that may be wrong is probed
