"""Speculative sampling leaves the target's distribution exactly unchanged.

On a 16-token pair the joint distribution of the first two generated tokens is
enumerated from the Hugging Face target; samples from the runtime must match
it (chi-square), and a deliberately wrong rule must not.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from ssd_runtime import ConfigError, Generator
from ssd_runtime.round.acceptance import InvariantSampling, SamplingAcceptance
from ssd_runtime.round.drafting import Drafter
from alone import decode
from ssd_runtime.round.loop import Stats
from ssd_runtime.round.sampling import SamplingParams, probabilities
from ssd_runtime.scheduler.schedule import FixedK

PROMPT = [0, 5, 6, 7]
EOS = 1
SAMPLES = 3000
SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_k=8), dict(temperature=1.0, top_p=0.9)]


def hf_processed(logits, temperature, top_k=0, top_p=1.0, context=PROMPT,
                 repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0,
                 logit_bias=None, min_new_tokens=0):
    """Hugging Face's processing of the logits that follow `context` (prompt + output);
    presence and frequency penalties (not in Hugging Face) written out as OpenAI defines them,
    over the output (context past PROMPT)."""
    import torch
    from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor,
                                                        RepetitionPenaltyLogitsProcessor,
                                                        SequenceBiasLogitsProcessor,
                                                        TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    scores = torch.as_tensor(np.asarray(logits, np.float32))[None]
    ids = torch.tensor([list(context)])
    if logit_bias:
        scores = SequenceBiasLogitsProcessor({(t,): b for t, b in logit_bias.items()})(ids, scores)
    if repetition_penalty != 1:
        scores = RepetitionPenaltyLogitsProcessor(repetition_penalty)(
            torch.tensor([list(context)]), scores)
    counts = torch.bincount(torch.tensor(list(context[len(PROMPT):]), dtype=torch.long),
                            minlength=scores.shape[-1])[:scores.shape[-1]].float()
    scores = scores - frequency_penalty * counts - presence_penalty * (counts > 0).float()
    if min_new_tokens:
        scores = MinNewTokensLengthLogitsProcessor(len(PROMPT), min_new_tokens, EOS)(ids, scores)
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)[0].double().numpy()


@pytest.mark.parametrize("setting", SETTINGS + [dict(temperature=1.3, top_k=3, top_p=0.5)])
def test_processing_matches_hugging_face_warpers(setting):
    rng = np.random.default_rng(0)
    for _ in range(20):
        logits = rng.normal(0, 3, size=50).astype(np.float32)
        ours = probabilities(logits, SamplingParams(**setting))
        np.testing.assert_allclose(ours, hf_processed(logits, **setting), atol=1e-6)


def exact_joint(target_dir, setting) -> dict[tuple[int, int], float]:
    """P(t1, t2) under the target alone, from Hugging Face logits; t2 = -1 after EOS."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir).eval()
    with torch.no_grad():
        p1 = hf_processed(model(torch.tensor([PROMPT])).logits[0, -1].numpy(), **setting,
                          context=PROMPT)
        seconds = torch.tensor([PROMPT + [t] for t in range(len(p1))])
        last = model(seconds).logits[:, -1].numpy()          # (V, V)
    return joint_of(p1, lambda t1: hf_processed(last[t1], **setting, context=PROMPT + [t1]))


def joint_of(p1: np.ndarray, second) -> dict[tuple[int, int], float]:
    """P(t1, t2) from the first token's distribution and second(t1), the second's."""
    joint = {}
    for t1, pt1 in enumerate(p1):
        if pt1 == 0:
            continue
        if t1 == EOS:
            joint[t1, -1] = pt1
            continue
        for t2, pt2 in enumerate(second(t1)):
            if pt2 > 0:
                joint[t1, t2] = pt1 * pt2
    return joint


def chi_square_p(samples: list[tuple[int, int]], joint: dict) -> float:
    counts: dict = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) <= set(joint), "sampled a pair the target gives probability 0"
    n = len(samples)
    big = [c for c, p in joint.items() if p * n >= 5]
    observed = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    expected = [joint[c] * n for c in big] + [n - sum(joint[c] * n for c in big)]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    expected = np.asarray(expected) * (sum(observed) / sum(expected))  # float32 softmax sums
    return float(chisquare(observed, expected).pvalue)


def first_two(ids: list[int]) -> tuple[int, int]:
    return (ids[0], -1) if ids[0] == EOS else (ids[0], ids[1])


@pytest.fixture(scope="module")
def small(small_vocab_bundle):
    bundle, target_dir = small_vocab_bundle
    return Generator.load(bundle), target_dir


@pytest.mark.parametrize("k,coupling", [(1, "rejection"), (4, "rejection"), (4, "invariant")])
@pytest.mark.parametrize("setting", SETTINGS, ids=["t1", "t0.7-k8", "p0.9"])
def test_speculative_sampling_is_lossless(small, setting, k, coupling):
    gen, target_dir = small
    joint = exact_joint(target_dir, setting)
    samples = [first_two(gen.generate(PROMPT, max_new_tokens=k + 1, k=k, seed=s,
                                      coupling=coupling, **setting).token_ids)
               for s in range(SAMPLES)]
    p = chi_square_p(samples, joint)
    assert p > 1e-3, f"speculative samples do not follow the target (chi-square p={p:.2g})"


# the second token is drawn after the first: both penalties read it (the repetition penalty
# also reads the prompt); with k = 4 its row follows an unverified draft token. Strong enough
# to move the joint by 0.13-0.35 in total variation (this model's logits are within ±1.3)
PENALISED = [dict(temperature=1.0, repetition_penalty=0.3),
             dict(temperature=0.8, top_k=8, presence_penalty=1.5, frequency_penalty=0.7),
             dict(temperature=1.0, repetition_penalty=0.6, frequency_penalty=-1.0),
             # EOS (token 1) made likely, but impossible as the first token
             dict(temperature=1.0, logit_bias={EOS: 2.5, 3: -3.0}, min_new_tokens=1)]


PENALISED_IDS = ["rep0.3", "pres-freq", "rep0.6-freq-1", "bias-min1"]
# every setting sequential in the fast subset (-m "not slow"), split mode (rejection) for one;
# the full suite runs each setting in split mode under both couplings
PENALISED_RUNS = [pytest.param(setting, mode, coupling, id=f"{name}-{mode}-{coupling}",
                               marks=() if mode == "sequential" or (
                                   name == "pres-freq" and coupling == "rejection")
                               else pytest.mark.slow)
                  for mode, coupling in [("sequential", "rejection"), ("split", "rejection"),
                                         ("split", "invariant")]
                  for setting, name in zip(PENALISED, PENALISED_IDS)]


@pytest.mark.parametrize("setting,mode,coupling", PENALISED_RUNS)
def test_speculative_sampling_with_penalties_is_lossless(small, setting, mode, coupling):
    gen, target_dir = small
    joint = exact_joint(target_dir, setting)
    samples = [first_two(gen.generate(PROMPT, max_new_tokens=5, k=4, seed=s, mode=mode,
                                      coupling=coupling, **setting).token_ids)
               for s in range(SAMPLES)]
    p = chi_square_p(samples, joint)
    assert p > 1e-3, f"penalised samples do not follow the target (chi-square p={p:.2g})"


def test_the_test_sees_penalties(small):
    """Sampling without the penalties must fail against the penalised distribution."""
    gen, target_dir = small
    setting = PENALISED[0]
    samples = [first_two(gen.generate(PROMPT, max_new_tokens=5, k=4, seed=s, temperature=1.0,
                                      coupling="rejection").token_ids) for s in range(SAMPLES)]
    assert chi_square_p(samples, exact_joint(target_dir, setting)) < 1e-6


@pytest.mark.parametrize("setting", SETTINGS, ids=["t1", "t0.7-k8", "p0.9"])
def test_plain_sampling_follows_the_target(small, setting):
    gen, target_dir = small
    plain = [first_two(gen.generate(PROMPT, max_new_tokens=2, k=0, seed=s, coupling="rejection",
                                    **setting).token_ids) for s in range(SAMPLES)]
    assert chi_square_p(plain, exact_joint(target_dir, setting)) > 1e-3


class AlwaysAccept(SamplingAcceptance):
    """A wrong rule: trust the draft blindly."""

    def decide(self, target_logits, drafts, draft_probs, accept_u, final_u):
        p = probabilities(target_logits[len(drafts)], self.params)
        return len(drafts), int(np.searchsorted(np.cumsum(p), final_u * p.sum(), side="right"))


class AlwaysAcceptInvariant(InvariantSampling):
    """A wrong invariant rule: take the draft's Gumbel-max tokens without comparing."""

    def verify(self, target_logits, drafts, draft_probs, position):
        return len(drafts), self._choose(target_logits[len(drafts)], drafts,
                                         position + len(drafts))


@pytest.mark.parametrize("wrong", [AlwaysAccept, AlwaysAcceptInvariant])
def test_the_test_rejects_a_wrong_rule(small, wrong):
    gen, target_dir = small
    setting = SETTINGS[0]
    joint = exact_joint(target_dir, setting)
    samples = []
    for s in range(SAMPLES):
        rule, schedule = wrong(SamplingParams(**setting, seed=s)), FixedK(4)
        drafter = Drafter(gen.draft, rule, schedule)
        ids = [t for new in decode(gen.target, drafter, rule, PROMPT, 5, schedule, {EOS}, Stats())
               for t in new]
        samples.append(first_two(ids))
    assert chi_square_p(samples, joint) < 1e-6


def test_seed_makes_sampling_reproducible(small):
    """The rejection rule at a fixed k; the invariant rule at any k (test_invariant.py)."""
    gen, _ = small
    run = dict(max_new_tokens=30, k=3, temperature=1.0, coupling="rejection")
    a = gen.generate(PROMPT, seed=7, **run).token_ids
    assert a == gen.generate(PROMPT, seed=7, **run).token_ids
    assert a != gen.generate(PROMPT, seed=8, **run).token_ids


@pytest.mark.parametrize("bad,match", [
    (dict(temperature=-0.1), r"temperature=-0.1 must be a number >= 0"),
    (dict(temperature=1.0, top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"),
    (dict(temperature=1.0, top_p=1.5), r"top_p=1.5 must be in \(0, 1\]"),
    (dict(temperature=1.0, top_k=-1), r"top_k=-1 must be an integer >= 0"),
    (dict(stop="x"), r"stop='x' must be a list of strings"),
    (dict(repetition_penalty=0.0), r"repetition_penalty=0.0 must be a number > 0"),
    (dict(presence_penalty=2.5), r"presence_penalty=2.5 must be a number in \[-2, 2\]"),
    (dict(frequency_penalty=float("nan")), r"frequency_penalty=nan must be a number in"),
    (dict(logit_bias={3: 101}), r"logit_bias\[3\]=101 must be a number in \[-100, 100\]"),
    (dict(logit_bias={16: 1.0}), r"logit_bias: token id 16 is outside the vocabulary \[0, 16\)"),
    (dict(logit_bias={"3": 1.0}), r"logit_bias: key '3' must be a token id"),
    (dict(logit_bias=[(3, 1.0)]), r"logit_bias must be a dict"),
    (dict(min_new_tokens=-1), r"min_new_tokens=-1 must be an integer >= 0"),
    (dict(coupling="gumbel"), r"coupling='gumbel' is unknown; choose one of auto, rejection"),
])
def test_bad_sampling_settings(small, bad, match):
    gen, _ = small
    with pytest.raises(ConfigError, match=match):
        gen.stream(PROMPT, **bad)


def test_stop_strings(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"))
    full = gen.generate("def f(x):", max_new_tokens=40, k=3)
    stop = full.text[10:13]
    cut = full.text.index(stop)
    for k in (0, 3):
        res = gen.generate("def f(x):", max_new_tokens=40, k=k, stop=[stop, "never-seen"])
        assert res.stop_reason == "stop"
        assert res.text == full.text[:cut]
        assert res.token_ids == full.token_ids[:len(res.token_ids)]
        assert "".join(gen.stream("def f(x):", max_new_tokens=40, k=k, stop=[stop])) == res.text


@pytest.mark.parametrize("quant", ["int4"])
def test_a_quantized_draft_leaves_the_distribution_unchanged(small_vocab_bundle, tmp_path,
                                                             quant):
    """The rule uses the quantized draft's own q: still exactly the target's distribution."""
    from ssd_export import ExportConfig, export_bundle

    _, target_dir = small_vocab_bundle
    out = tmp_path / "bundle"
    draft_dir = target_dir.parent / "small_draft"
    export_bundle(ExportConfig(target=str(target_dir), draft=str(draft_dir), output=out,
                               quiet=True, draft_quant=quant))
    gen = Generator.load(out)
    assert gen.manifest.draft.quant == quant
    setting = SETTINGS[0]
    joint = exact_joint(target_dir, setting)
    samples = [first_two(gen.generate(PROMPT, max_new_tokens=5, k=4, seed=s,
                                      coupling="rejection", **setting).token_ids)
               for s in range(SAMPLES)]
    assert chi_square_p(samples, joint) > 1e-3


@pytest.mark.parametrize("k,coupling", [(1, "rejection"),
                                       pytest.param(4, "rejection", marks=pytest.mark.slow),
                                       pytest.param(4, "invariant", marks=pytest.mark.slow)])
def test_split_mode_sampling_is_lossless(small, k, coupling):
    gen, target_dir = small
    setting = dict(SETTINGS[1], coupling=coupling)
    joint = exact_joint(target_dir, SETTINGS[1])
    samples = [first_two(gen.generate(PROMPT, max_new_tokens=2 * k + 2, k=k, seed=s,
                                      mode="split", **setting).token_ids)
               for s in range(SAMPLES)]
    assert chi_square_p(samples, joint) > 1e-3
    again = gen.generate(PROMPT, max_new_tokens=20, k=k, seed=5, mode="split", **setting)
    assert again.token_ids == gen.generate(PROMPT, max_new_tokens=20, k=k, seed=5, mode="split",
                                           **setting).token_ids


def bundle_joint(bundle, setting) -> dict[tuple[int, int], float]:
    """P(t1, t2) under the bundle's own target, one row per call as k=0 computes it: the
    reference of a quantized target (docs/design.md §12)."""
    from ssd_runtime.backends import cpu_session
    from ssd_runtime.manifest import read_manifest

    session = cpu_session("target", bundle, read_manifest(bundle), threads=1)
    session.prefill(np.asarray(PROMPT[:-1], np.int64), 0)
    n = len(PROMPT)
    first = session.forward(np.asarray(PROMPT[-1:], np.int64), n - 1)[0].copy()
    p1 = hf_processed(first, **setting, context=PROMPT)
    return joint_of(p1, lambda t1: hf_processed(
        session.forward(np.asarray([t1], np.int64), n)[0], **setting, context=PROMPT + [t1]))


@pytest.mark.parametrize("quant,compute,draft_quant", [
    ("int4", "int8", "int8"), pytest.param("int8", "int8", "none", marks=pytest.mark.slow),
    pytest.param("int4", "float", "int4", marks=pytest.mark.slow)])
def test_sampling_from_a_quantized_target_follows_its_own_distribution(small_vocab_bundle,
                                                                       tmp_path, quant,
                                                                       compute, draft_quant):
    """The quantized target is the reference: speculative samples follow its own enumerated
    distribution (and it is not the float model's)."""
    from ssd_export import ExportConfig, export_bundle

    _, target_dir = small_vocab_bundle
    out = tmp_path / "bundle"
    export_bundle(ExportConfig(target=str(target_dir), draft=str(target_dir.parent /
                                                                  "small_draft"),
                               output=out, quiet=True, quant=quant, quant_compute=compute,
                               draft_quant=draft_quant, max_batch=1))
    gen = Generator.load(out)
    assert (gen.manifest.target.quant, gen.manifest.draft.quant) == (quant, draft_quant)
    setting = SETTINGS[2]
    joint = bundle_joint(out, setting)
    float_joint = exact_joint(target_dir, setting)
    moved = sum(abs(joint.get(c, 0) - float_joint.get(c, 0)) for c in {*joint, *float_joint})
    assert moved > 1e-3, "quantization did not move the target's distribution"
    samples = [first_two(gen.generate(PROMPT, max_new_tokens=5, k=4, seed=s,
                                      coupling="rejection", **setting).token_ids)
               for s in range(SAMPLES)]
    assert chi_square_p(samples, joint) > 1e-3
