"""Exported graphs reproduce the Hugging Face models (ONNX Runtime CPU vs PyTorch): the
first families in both flavours, and what parity itself must catch. The other cases are in
test_parity_moe.py, test_parity_later.py, test_parity_variants.py and test_parity_static.py
(parity_cases.py says why they are split)."""
from __future__ import annotations

import pytest
import torch

import tiny
from parity_cases import CASES, FIRST, NO_ORT, assert_parity, flavours, hf_model, traced
from ssd_export.parity import check_parity
from ssd_graphs.registry import REGISTRY
from ssd_graphs.trace import export_decoder
from ssd_runtime.errors import ConfigError, ParityError


def test_every_registered_architecture_has_a_parity_case():
    missing = sorted(set(REGISTRY) - set(CASES.values()))
    assert not missing, f"architectures without a parity case: {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("name,graph", flavours(FIRST))
def test_parity_with_hugging_face(models, name, graph):
    assert_parity(models, name, graph)


@pytest.mark.parametrize("name", sorted(NO_ORT))
def test_ort_flavour_refuses_alibi_naming_the_fix(models, tmp_path, name):
    model, _ = hf_model(models, name)
    with pytest.raises(ConfigError, match=r"no ALiBi.*--graph standard"):
        export_decoder(model, name, tmp_path / "model.onnx", 64, graph="ort")


def test_ort_flavour_refuses_a_head_size_not_a_multiple_of_8(tmp_path):
    """GroupQueryAttention takes head sizes that are multiples of 8 only; a model with heads of
    20 used to export and then fail inside ONNX Runtime with a bare RuntimeError."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny.config_for("phi", tiny.VOCAB, layers=1,
                                                             hidden=80)).eval()
    with pytest.raises(ConfigError, match=r"multiple of 8.*is 20.*--graph standard"):
        export_decoder(model, "phi", tmp_path / "model.onnx", 64, graph="ort")


@pytest.mark.slow
def test_parity_catches_a_wrong_graph(models):
    model, _ = hf_model(models, "llama")
    path = traced(models, "llama").path        # exported before the model is changed
    layer = model.model.layers[0].self_attn.k_proj
    saved = layer.weight.detach().clone()
    try:
        with torch.no_grad():
            layer.weight.mul_(1.5)      # the graph no longer matches the model
        with pytest.raises(ParityError, match=r"differs from the Hugging Face model at past_len"):
            check_parity(model, path, "target", 8, "float32", 256)
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved)


@pytest.mark.slow
def test_parity_fails_a_graph_that_gives_nan(models, tmp_path):
    """NaN compares False against any tolerance: a NaN output used to pass parity."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model, _ = hf_model(models, "llama")
    graph = onnx.load(str(traced(models, "llama").path))
    norm = next(t for t in graph.graph.initializer if t.name.endswith("norm.weight"))
    norm.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(norm).shape, np.nan,
                                                  np.float32), norm.name))
    onnx.save(graph, str(tmp_path / "model.onnx"))
    with pytest.raises(ParityError, match=r"max \|diff\| logits nan"):
        check_parity(model, tmp_path / "model.onnx", "target", 8, "float32", 256)


def test_parity_refuses_a_model_that_overflows_in_hugging_face_itself(tmp_path):
    """float16 activations past 65504 give inf logits in Hugging Face too: inf - inf is NaN and
    the limit itself inf, so parity used to pass such a bundle."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny.config_for("llama", tiny.VOCAB, layers=1),
                                             attn_implementation="eager").eval().half()
    with torch.no_grad():
        model.model.norm.weight.fill_(3e4)          # logits past float16's range
    with pytest.raises(ConfigError, match=r"non-finite logits.*float16.*--dtype float32"):
        check_parity(model, tmp_path / "unused.onnx", "target", 8, "float16", 64)


def test_kv_comparison_reads_cropped_and_repeated_caches():
    """Gemma 2's sliding layers keep only their last rows; Falcon's new architecture stores
    each KV head once per query of its group: parity compares the rows and heads there are."""
    import numpy as np

    from ssd_export.parity import _kv_diff

    full = np.random.default_rng(0).normal(size=(1, 13, 2, 4)).astype(np.float32)  # (1, S, Hkv, D)
    ref = np.repeat(full, 2, axis=2)[:, 8:]       # HF: rows 8..12 kept, each head twice
    ours = full[:, 10:13].copy()                  # new rows at past_len 10
    assert _kv_diff(ours, 8, ref, past_len=10) == 0.0
    ours[0, 1, 1, 3] += 0.5
    assert _kv_diff(ours, 8, ref, past_len=10) == pytest.approx(0.5)
    assert _kv_diff(full[:, :3], 8, ref, past_len=0) is None     # rows 0..2 were dropped


def test_longrope_past_its_original_context_is_refused(models, tmp_path):
    model, _ = hf_model(models, "phi3_longrope")
    with pytest.raises(ConfigError, match=r"RoPE type 'longrope' changes its frequencies past 64 "
                                          r"positions.*--max-context 64 or less"):
        export_decoder(model, "phi3_longrope", tmp_path / "model.onnx", max_context=65)


def test_unknown_rope_type_is_refused(models, tmp_path):
    model, _ = hf_model(models, "llama")
    saved = model.config.rope_parameters
    model.config.rope_parameters = {**saved, "rope_type": "made_up"}
    try:
        with pytest.raises(ConfigError, match=r"RoPE type 'made_up' is not supported; supported: "
                                              r"default, linear, llama3, yarn, dynamic, longrope"):
            export_decoder(model, "llama", tmp_path / "model.onnx", max_context=64)
    finally:
        model.config.rope_parameters = saved


def test_sliding_window_is_exercised(models):
    """The sliding-window fixtures' windows are shorter than parity's longest sequence."""
    from transformers import AutoConfig

    for name in ("mistral", "gemma2", "gemma3", "starcoder2", "ministral", "exaone4", "olmo3",
                 "cohere2", "vaultgemma"):
        assert AutoConfig.from_pretrained(models[name]).sliding_window < 24
    gpt_neo = AutoConfig.from_pretrained(models["gpt_neo"])        # a global and a local layer
    assert gpt_neo.window_size < 24 and set(gpt_neo.attention_layers) == {"global", "local"}


def test_per_layer_rope_is_exercised(models):
    """Gemma 3's fixture has a sliding and a full layer with different RoPE bases; SmolLM3's
    has a layer with RoPE and one without."""
    from transformers import AutoConfig

    gemma3 = AutoConfig.from_pretrained(models["gemma3"])
    assert set(gemma3.layer_types) == {"sliding_attention", "full_attention"}
    assert len({p["rope_theta"] for p in gemma3.rope_parameters.values()}) == 2
    assert set(AutoConfig.from_pretrained(models["smollm3"]).no_rope_layers) == {0, 1}


def test_qwen3_moe_mixes_dense_and_moe_layers(models):
    """The fixture's first layer has experts, its second (mlp_only_layers) a dense MLP."""
    from transformers import AutoConfig

    assert REGISTRY["Qwen3MoeForCausalLM"](AutoConfig.from_pretrained(
        models["qwen3_moe"])).moe.layers == (0,)
