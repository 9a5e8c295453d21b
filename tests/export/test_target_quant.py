"""Quantized targets (--quant): the quantized target is the reference. Its graph is checked
against Hugging Face carrying the same dequantized weights, its quality against the float
target is recorded, and speculative output equals the same bundle's k=0 exactly."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from ssd_runtime import Generator
from ssd_runtime.backends import cpu_session
from ssd_runtime.contract import DEQUANTIZE, MATMULNBITS
from ssd_runtime.manifest import read_manifest
from test_bad_input import assert_clean_error, assert_nothing_written, export_cli

NEW_TOKENS = 40
NEAR_TIE = 0.1      # logits: int8 activations move a row's logits by up to ~0.04 (design §12)
# (graph, target quant, draft quant, compute): int4 and int8 targets in each flavour, with a
# draft that follows the target (auto), a float one and the other kind. Speculative output
# equals the same bundle's k=0 exactly (greedy, split, seeded) wherever attention is plain
# ONNX (auto writes the static flavour for a quantized target); in the ort flavour a row's
# logits depend slightly on the rows beside it (GroupQueryAttention), so greedy output may
# differ there, at near-ties only.
RUNS = [("auto", "int4", "auto", "float"), ("standard", "int4", "int8", "float"),
        ("auto", "int8", "int4", "int8"), ("standard", "int8", "none", "int8"),
        ("auto", "int4", "none", "int8"), ("ort", "int4", "none", "int8")]


def prompt_ids(n: int) -> list[int]:
    rng = np.random.default_rng(n)
    return [0, *rng.integers(3, 384, size=n - 1).tolist()]


def ops(path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


def fused_levels(bundle, role: str, tmp_path) -> set[int]:
    """The accuracy levels of the MatMulNBits nodes in the graph ONNX Runtime runs for `role`,
    with the runtime's own session options (DequantizeLinear fused at the manifest's level)."""
    import onnxruntime as ort
    from ssd_runtime.backends.ort import session_options

    entry = getattr(read_manifest(bundle), role)
    opts = session_options(1, entry)
    opts.optimized_model_filepath = str(tmp_path / f"{role}.onnx")
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                  f"{role}.data")
    ort.InferenceSession(str(bundle / entry.path), opts, providers=["CPUExecutionProvider"])
    nodes = onnx.load(str(tmp_path / f"{role}.onnx"), load_external_data=False).graph.node
    return {next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
            for n in nodes if n.op_type == "MatMulNBits"}


def assert_same_or_near_tie(bundle, prompt: list[int], expected: list[int], found: list[int],
                            what: str) -> None:
    """`found` equals `expected`, or first differs where the target's two tokens are within
    NEAR_TIE of each other in its logits."""
    if found == expected:
        return
    at = next(i for i, (a, b) in enumerate(zip(expected, found)) if a != b)
    session = cpu_session("target", bundle, read_manifest(bundle), threads=1)
    ids = np.asarray(prompt + expected[:at], np.int64)
    session.prefill(ids[:-1], 0)
    logits = session.forward(ids[-1:], len(ids) - 1)[0]
    gap = abs(float(logits[expected[at]] - logits[found[at]]))
    assert gap < NEAR_TIE, f"{what}: differs at {at} where the logits are {gap:.3f} apart"


# the fast subset keeps the ort flavour's three; the standard ones run in the full suite
@pytest.mark.parametrize("graph,quant,draft_quant,compute",
                         [pytest.param(*r, marks=pytest.mark.slow) if r[0] == "standard" else r
                          for r in RUNS], ids=["-".join(r) for r in RUNS])
def test_a_quantized_target_is_recorded_checked_and_lossless(bundle_factory, graph, quant,
                                                            draft_quant, compute, tmp_path):
    bundle = bundle_factory("llama", "llama_cut", graph=graph, quant=quant,
                            draft_quant=draft_quant, quant_compute=compute)
    m = read_manifest(bundle)
    form = MATMULNBITS if graph == "ort" else DEQUANTIZE
    assert m.target.graph == ("static" if graph == "auto" else graph)
    assert m.target.quant == quant and m.target.quant_form == form
    assert m.target.quant_scheme == {"bits": int(quant[-1]), "block": 32, "method": "rtn",
                                     "lm_head": True, "form": form,
                                     "accuracy_level": 0 if compute == "float" else 4}
    quality = m.target.quant_quality
    # random tiny models have nearly flat logits: quantization flips many of their argmaxes
    assert 0 < quality["top1_agreement"] <= 1 and quality["tokens"] > 100, quality
    assert 1 < quality["float_perplexity"] and 0.8 < quality["perplexity"] / quality[
        "float_perplexity"] < 1.5, quality
    assert max(m.target.parity.values()) < 1e-3        # exact against the dequantized weights
    # auto follows the target (int4, else int8) unless the quantized draft agrees too little
    # with the float one
    assert m.draft.quant == draft_quant or (draft_quant == "auto" and m.draft.quant in
                                            (quant, "int8", "none"))
    if m.draft.quant != "none":     # int8 activations, the fast kernel, in every flavour
        assert m.draft.quant_scheme["accuracy_level"] == 4
        assert fused_levels(bundle, "draft", tmp_path) == {4}
    target_ops = ops(bundle / m.target.path)
    assert form in target_ops and (form != MATMULNBITS or "MatMul" not in target_ops)
    assert bool(m.cpu_only) == (graph == "ort"), m.cpu_only
    gen = Generator.load(bundle)
    for n in (1, 7, 40):
        plain = gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=0).token_ids
        runs = {f"k={k}": gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=k).token_ids
                for k in (1, 4, "auto")}
        runs["split"] = gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=4,
                                     mode="split").token_ids
        for what, tokens in runs.items():
            if graph != "ort":
                assert tokens == plain, f"{what}, prompt {n}"
            else:
                assert_same_or_near_tie(bundle, prompt_ids(n), plain, tokens,
                                        f"{what}, prompt {n}")
        if graph != "ort":
            seeded = {k: gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=k,
                                      temperature=0.9, top_p=0.95, seed=11).token_ids
                      for k in (0, 3, "auto")}
            assert seeded[3] == seeded[0] and seeded["auto"] == seeded[0], n


def test_the_quantized_target_differs_from_the_float_one(bundle_factory):
    """The reference moved: the int4 target's own k=0 output, not the float model's."""
    float_gen = Generator.load(bundle_factory("llama", "llama_cut"))
    quant_gen = Generator.load(bundle_factory("llama", "llama_cut", quant="int4"))
    outputs = [[g.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=0).token_ids
                for n in (1, 7, 40)] for g in (float_gen, quant_gen)]
    assert outputs[0] != outputs[1]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["gpt2", "phi3", "qwen2", "falcon"])
def test_targets_of_other_layouts_quantize_and_stay_lossless(bundle_factory, target):
    """Conv1D weights (GPT-2), fused QKV and gate-up (Phi-3), biases (Qwen2), Falcon's fused
    projection: every quantized MatMul is located in the model's parameters for parity."""
    bundle = bundle_factory(target, f"{target}_cut", quant="int4", quant_compute="float")
    m = read_manifest(bundle)
    assert m.target.quant == "int4" and max(m.target.parity.values()) < 1e-3
    gen = Generator.load(bundle)
    for n in (3, 20):
        plain = gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=0).token_ids
        assert gen.generate(prompt_ids(n), max_new_tokens=NEW_TOKENS, k=4).token_ids == plain


@pytest.fixture
def out(tmp_path):
    return tmp_path / "bundle"


@pytest.mark.parametrize("extra,pattern", [
    (["--quant", "int4", "--quant-block", "128"],
     r"block size 128 does not divide .* K = 64 .*HINT: use --quant-block 64"),
    (["--quant", "int4", "--quant-method", "hqq", "--graph", "standard"],
     r"hqq writes MatMulNBits with float zero points.*HINT: use --quant-method rtn"),
    (["--quant", "int8", "--quant-method", "hqq"], r"hqq is 4-bit only"),
    (["--quant", "int8", "--quant-compute", "float"], r"no fast CPU kernel for 8-bit weights"),
    (["--quant", "int8", "--engines", "trt", "--graph", "standard"],
     r"--quant int8 cannot go with --engines trt: TensorRT 10 .* INT4 only"),
    (["--quant", "int4", "--calib", "/nonexistent/calib.jsonl"],
     r"--calib /nonexistent/calib.jsonl: cannot read it"),
])
def test_bad_quantization_requests_are_refused_and_write_nothing(models, out, extra, pattern):
    proc = export_cli(models["llama"], models["llama_cut"], out, *extra)
    assert_clean_error(proc, "ssd-export", pattern)
    assert_nothing_written(out)


@pytest.mark.slow
def test_a_calibration_file_is_read_and_a_bad_one_named(models, out, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "one"}\n{"txt": "two"}\n')
    proc = export_cli(models["llama"], models["llama_cut"], out, "--quant", "int8",
                      "--calib", bad)
    assert_clean_error(proc, "ssd-export", r"line 2 has no string \"text\" field")
    assert_nothing_written(out)
    good = tmp_path / "calib.jsonl"
    words = " ".join(f"word{i % 50} and more" for i in range(400))
    good.write_text("".join(json.dumps({"text": f"{words} {n}"}) + "\n" for n in range(10)))
    proc = export_cli(models["llama"], models["llama_cut"], out, "--quant", "int8",
                      "--calib", good, "--graph", "standard", "--max-batch", "1")
    assert proc.returncode == 0, proc.stderr
    quality = read_manifest(out).target.quant_quality
    assert quality["text"] == "calib.jsonl's last 1 line(s)", quality
    # the pair's worth reads the same text (without --calib: the target's own continuations)
    assert read_manifest(out).pair_worth["text"] == quality["text"]
