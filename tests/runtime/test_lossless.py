"""Greedy speculative decoding is lossless: speculative == k=0 == Hugging Face generate."""
from __future__ import annotations

import numpy as np
import pytest

from ssd_runtime import Generator

PROMPT_LENGTHS = (1, 7, 40)
KS = (1, 2, 4, 8, "auto")
NEW_TOKENS = 64
# (target, draft): unrelated (acceptance ~0), truncated (partial), itself (full),
# the other two classes (sliding window for Mistral), and cross-class pairs.
PAIRS = [("llama", "llama_other"), ("llama", "llama_cut"), ("llama", "llama"),
         ("mistral", "mistral_cut"), ("qwen2", "qwen2_cut"),
         ("llama", "mistral_cut"), ("mistral", "llama")]
# every other architecture with a truncated draft of its own class (Falcon: multi-query
# RoPE, ALiBi, and the new architecture drafted by the multi-query one), and cross-class
# pairs on the shared tokenizer: soft-capped sliding Gemma 2 drafted by Llama, learned
# positions at two offsets (GPT-2 drafted by OPT).
PAIRS += [(name, f"{name}_cut") for name in ("qwen3", "phi3", "gemma", "gemma2", "gpt2",
                                             "gpt_neox", "opt", "falcon", "falcon_alibi")]
PAIRS += [("falcon_new", "falcon_cut"), ("gemma2", "llama_cut"), ("gpt2", "opt_cut")]
# the families added later (Gemma 3 on), each with a truncated draft of its own
PAIRS += [(name, f"{name}_cut") for name in ("gemma3", "starcoder2", "granite", "olmo2", "smollm3",
                                             "phi", "stablelm", "gpt_bigcode", "gptj", "cohere")]
# mixture of experts (Qwen3-MoE's draft keeps its MoE layer, the target mixes MoE and dense)
PAIRS += [(name, f"{name}_cut") for name in ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")]
# legacy and misc families with a mechanism of their own (GPT-Neo: unscaled q·k, local layers;
# BLOOM: ALiBi added unscaled, a norm on the embeddings, so the standard graph; CodeGen: q, v, k
# fused in blocks)
PAIRS += [(name, f"{name}_cut") for name in ("gpt_neo", "bloom", "codegen")]
# q/k norms after RoPE (HunYuan), queries scaled by position (Ministral 3)
PAIRS += [(name, f"{name}_cut") for name in ("hunyuan", "ministral3")]
# attention sinks and a clamped SwiGLU on the MoE kernel, sliding and full layers in turn
PAIRS += [("gpt_oss", "gpt_oss_cut")]
# multi-head latent attention: one KV head of latent + rotated key part, the latent as values
PAIRS += [("deepseek_v3", "deepseek_v3_cut")]

# The pairs above run in the graph flavour ssd-export writes by default here ("ort" where it
# fits; ALiBi stays standard); these run in the standard graph that GPU bundles carry too.
STANDARD = [("llama", "llama_cut"), ("mistral", "mistral_cut"), ("qwen3", "qwen3_cut"),
            ("gemma2", "llama_cut"), ("gpt2", "opt_cut"), ("falcon_new", "falcon_cut"),
            ("qwen3_moe", "qwen3_moe_cut")]       # MoE dense, as GPU bundles carry it
RUNS = [(t, d, "auto") for t, d in PAIRS] + [(t, d, "standard") for t, d in STANDARD]


def prompt_ids(n: int) -> list[int]:
    rng = np.random.default_rng(n)
    return [0, *rng.integers(3, 384, size=n - 1).tolist()]


@pytest.fixture(scope="module")
def hf_reference(models):
    """Hugging Face greedy continuations per (target, prompt length)."""
    import torch
    from transformers import AutoModelForCausalLM

    ref = {}
    for target in {t for t, _ in PAIRS}:
        model = AutoModelForCausalLM.from_pretrained(models[target]).eval()
        for n in PROMPT_LENGTHS:
            ids = torch.tensor([prompt_ids(n)])
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=2, attention_mask=torch.ones_like(ids))
            ref[target, n] = out[0, n:].tolist()
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("target,draft,graph", RUNS, ids=[f"{t}+{d}-{g}" for t, d, g in RUNS])
def test_speculative_equals_target_and_hugging_face(bundle_factory, hf_reference, target, draft,
                                                    graph):
    gen = Generator.load(bundle_factory(target, draft, graph=graph))
    rates = []
    for n in PROMPT_LENGTHS:
        expected = hf_reference[target, n]
        plain = gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=0)
        assert plain.token_ids == expected, f"k=0 differs from Hugging Face (prompt {n})"
        for k in KS:
            res = gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=k)
            assert res.token_ids == expected, f"k={k}, prompt {n}: speculative output differs"
            assert res.stop_reason == plain.stop_reason
            if k != "auto":
                rates.append(res.stats.acceptance_rate)
    if draft == target:
        assert min(rates) == 1.0          # the target as its own draft accepts everything
    if draft == f"{target}_cut":          # a truncated draft partly agrees with its target
        assert 0.0 < np.mean(rates) < 1.0, rates


def test_stop_at_eos(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"))
    plain = gen.generate(prompt_ids(7), max_new_tokens=40, k=0).token_ids
    eos = plain[12]
    first = plain.index(eos)
    gen.eos_ids = {eos}                   # pretend that token ends the sequence
    for k in (0, 3, 8):
        res = gen.generate(prompt_ids(7), max_new_tokens=40, k=k)
        assert res.stop_reason == "eos"
        assert res.token_ids == plain[:first + 1]


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["llama_cut", "llama"])
def test_stop_at_max_context(bundle_factory, hf_reference, draft):
    """Both modes end at the context's last row; with the target as its own draft every split
    bet is a hit, so the bets run up to the end of the context (they drafted past it once)."""
    gen = Generator.load(bundle_factory("llama", draft, max_context=48))
    for mode in ("sequential", "split"):
        for k in (0, 4, 8, "auto"):
            if mode == "split" and k == 0:
                continue
            res = gen.generate(prompt_ids(40), max_new_tokens=64, k=k, mode=mode)
            assert res.stop_reason == "context", (mode, k)
            assert res.token_ids == hf_reference["llama", 40][:8], (mode, k)
        res = gen.generate(prompt_ids(7), max_new_tokens=64, k=3, mode=mode)
        assert res.stop_reason == "context" and res.token_ids == hf_reference["llama", 7][:41], mode


@pytest.mark.parametrize("target,draft", [("llama_padded", "llama_other"),
                                          ("llama", "llama_padded")])
def test_pair_with_a_padded_vocabulary(models, bundle_factory, target, draft):
    """Target and draft embeddings of different widths (one padded past the tokenizer): the
    output stays the target's, greedy and seeded, although the padded model's random rows
    make it emit (or propose) ids the other model has no row for."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models[target]).eval()
    gen = Generator.load(bundle_factory(target, draft), threads=(1, 1))
    padded = []
    for n in (7, 40):
        ids = torch.tensor([prompt_ids(n)])
        expected = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=2,
                                  attention_mask=torch.ones_like(ids))[0, n:].tolist()
        padded += [t for t in expected if t >= 384]
        for mode, k in [("sequential", 0), ("sequential", 2), ("sequential", 8),
                        ("sequential", "auto"), ("split", 3)]:
            res = gen.generate(prompt_ids(n), max_new_tokens=40, k=k, mode=mode)
            assert res.token_ids == expected, (n, mode, k)
        seeded = {k: gen.generate(prompt_ids(n), max_new_tokens=40, k=k, temperature=1.0,
                                  seed=5).token_ids for k in (0, 3, "auto")}
        assert seeded[3] == seeded[0] and seeded["auto"] == seeded[0], n
        rejection = gen.generate(prompt_ids(n), max_new_tokens=40, k=3, temperature=1.0,
                                 seed=5, coupling="rejection", ignore_eos=True)
        vocab = model.config.vocab_size            # (unseeded, EOS could end it early)
        assert len(rejection.token_ids) == 40 and max(rejection.token_ids) < vocab
    if target == "llama_padded":                 # the padded ids reached the draft
        assert padded, "the padded target emitted no padded id: the test tests nothing"


def test_one_sequence_at_a_time(bundle_factory):
    """One KV cache per model: a second sequence beside a live one is refused by name (it
    used to overwrite the first's rows: wrong tokens, or ORT's shape errors from threads)."""
    import threading

    from ssd_runtime import ConfigError

    gen = Generator.load(bundle_factory("llama", "llama_cut"), threads=(1, 1))
    solo = {n: gen.generate(prompt_ids(n), max_new_tokens=20, k=3).token_ids for n in (7, 40)}
    first = gen.stream(prompt_ids(7), max_new_tokens=20, k=3)
    next(first)
    second = gen.stream(prompt_ids(40), max_new_tokens=20, k=3)
    with pytest.raises(ConfigError, match=r"already decoding another sequence"):
        next(second)
    for _ in first:
        pass
    assert gen.last_result.token_ids == solo[7]
    closed = gen.stream(prompt_ids(40), max_new_tokens=20, k=3)
    next(closed)
    closed.close()                                  # a stream closed early frees the generator
    assert gen.generate(prompt_ids(40), max_new_tokens=20, k=3).token_ids == solo[40]

    def run(n: int) -> None:
        try:
            out[n] = gen.generate(prompt_ids(n), max_new_tokens=20, k=3).token_ids
        except ConfigError as exc:
            out[n] = exc
    for _ in range(3):      # two threads race: one may be refused, never both (nor neither's
        out: dict[int, object] = {}                 # tokens wrong)
        threads = [threading.Thread(target=run, args=(n,)) for n in (7, 40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done = [n for n in (7, 40) if out[n] == solo[n]]
        refused = [n for n in (7, 40) if isinstance(out[n], ConfigError)
                   and "already decoding another sequence" in str(out[n])]
        assert done and sorted(done + refused) == [7, 40], out


def test_stop_at_length_and_stats(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama"))
    res = gen.generate(prompt_ids(7), max_new_tokens=10, k=4)
    assert res.stop_reason == "length" and len(res.token_ids) == 10
    s = res.stats
    assert s.new_tokens == 10 and s.rounds >= 2 and s.target_calls == s.rounds
    assert s.accepted == s.drafted and s.acceptance_rate == 1.0
    assert set(s.seconds) >= {"draft", "verify", "host", "prefill"} and s.tokens_per_s > 0


def test_text_prompt_matches_hugging_face_tokenizer(bundle_factory, models):
    from transformers import AutoTokenizer

    gen = Generator.load(bundle_factory("llama", "llama_cut"))
    hf = AutoTokenizer.from_pretrained(models["llama"])
    for text in ("def add(a, b):", "  x = [1, 2]\n", "héllo ✓ wörld"):
        assert gen.encode(text) == hf(text).input_ids
    res = gen.generate("def add(a, b):", max_new_tokens=20, k=2)
    assert res.text == hf.decode(res.token_ids, skip_special_tokens=True)
    pieces = list(gen.stream("def add(a, b):", max_new_tokens=20, k=2))
    assert "".join(pieces) == res.text and len(pieces) > 1
    assert gen.last_result.token_ids == res.token_ids
