"""A generator deciding with the bundle's ONNX heads gives the host's outputs."""
from __future__ import annotations

from ssd_runtime import Generator

PROMPT = [0, 5, 6, 7]


def test_bundle_lists_its_heads(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"))
    assert set(gen.manifest.heads) == {"argmax", "sample", "accept"}
    assert gen.heads is None                     # the CPU backend decides on the host


def test_greedy_with_heads_is_unchanged(bundle_factory):
    bundle = bundle_factory("llama", "llama_cut")
    host, fused = Generator.load(bundle), Generator.load(bundle, fused_heads=True)
    for k in (0, 1, 4, 8):
        expected = host.generate([0, 17, 42, 99], max_new_tokens=48, k=k).token_ids
        assert fused.generate([0, 17, 42, 99], max_new_tokens=48, k=k).token_ids == expected


def test_sampling_with_heads_makes_the_same_decisions(small_vocab_bundle):
    bundle, _ = small_vocab_bundle
    host, fused = Generator.load(bundle), Generator.load(bundle, fused_heads=True)
    same = 0
    for seed in range(40):
        for setting in (dict(temperature=1.0, coupling="rejection"),       # the heads' rule
                        dict(temperature=0.7, top_k=8, top_p=0.9, coupling="rejection")):
            a = host.generate(PROMPT, max_new_tokens=12, k=3, seed=seed, **setting).token_ids
            b = fused.generate(PROMPT, max_new_tokens=12, k=3, seed=seed, **setting).token_ids
            same += a == b
    assert same == 80
