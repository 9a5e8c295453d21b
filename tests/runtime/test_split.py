"""Split mode (the draft works on the next round during verification) is lossless."""
from __future__ import annotations

import pytest

from ssd_runtime import ConfigError, Generator
from test_lossless import prompt_ids

PAIRS = [("llama", "llama_cut"), ("llama", "llama"), ("llama", "llama_other")]


@pytest.fixture(scope="module")
def llama_reference(models):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models["llama"]).eval()
    ref = {}
    for n in (1, 7, 40):
        ids = torch.tensor([prompt_ids(n)])
        out = model.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=2,
                             attention_mask=torch.ones_like(ids))
        ref[n] = out[0, n:].tolist()
    return ref


@pytest.mark.parametrize("target,draft", [  # one pair in the fast subset (-m "not slow")
    PAIRS[0], *(pytest.param(*pair, marks=pytest.mark.slow) for pair in PAIRS[1:])],
    ids=[f"{t}+{d}" for t, d in PAIRS])
def test_split_equals_hugging_face(bundle_factory, llama_reference, target, draft):
    gen = Generator.load(bundle_factory(target, draft), threads=(1, 1))
    for n in (1, 7, 40):
        expected = llama_reference[n]
        for k in (1, 3, 8, "auto"):
            res = gen.generate(prompt_ids(n), max_new_tokens=64, k=k, mode="split")
            assert res.token_ids == expected, f"split, k={k}, prompt {n}"
            assert res.stats.mode == "split"
    if draft == target:                      # every bet on full acceptance is a hit
        res = gen.generate(prompt_ids(7), max_new_tokens=64, k=3, mode="split")
        assert res.stats.split_bets > 5 and res.stats.split_hits == res.stats.split_bets


def test_unknown_mode(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"))
    with pytest.raises(ConfigError, match=r"mode='parallel' is unknown"):
        gen.generate("x", mode="parallel")
    with pytest.raises(ConfigError, match=r"mode='parallel' is unknown"):
        Generator.load(bundle_factory("llama", "llama_cut"), mode="parallel")


def test_loaded_for_split_leaves_the_draft_a_core(bundle_factory):
    """threads=None chooses per mode: in split mode the draft's thread has a core of its own
    and generate() runs split unless told otherwise, with the sequential mode's tokens."""
    from ssd_runtime.machine import cpu_cores

    bundle = bundle_factory("llama", "llama_cut")
    gen = Generator.load(bundle, mode="split")
    assert gen.draft.threads == 1 and gen.target.threads <= max(1, cpu_cores() - 1)
    res = gen.generate(prompt_ids(7), max_new_tokens=24, k=3)
    assert res.stats.mode == "split" and res.stats.split_bets > 0
    assert res.token_ids == gen.generate(prompt_ids(7), max_new_tokens=24, k=3,
                                         mode="sequential").token_ids
