"""Exported graphs reproduce the Hugging Face models (ONNX Runtime CPU vs PyTorch)."""
from __future__ import annotations

import pytest
import torch

from ssd_export.parity import check_parity
from ssd_graphs.adapters import REGISTRY
from ssd_graphs.trace import export_decoder
from ssd_runtime.errors import ParityError

# one parity case per registered architecture: fixture model name
CASES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}


def test_every_registered_architecture_has_a_parity_case():
    missing = sorted(set(REGISTRY) - set(CASES))
    assert not missing, f"architectures without a parity case: {missing}"


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    out = {}
    root = tmp_path_factory.mktemp("parity")
    for arch, name in CASES.items():
        model = AutoModelForCausalLM.from_pretrained(models[name], attn_implementation="eager").eval()
        assert type(model).__name__ == arch
        traced = export_decoder(model, name, root / name / "model.onnx", max_context=256)
        out[arch] = (model, traced)
    return out


@pytest.mark.parametrize("arch", sorted(CASES))
def test_parity_with_hugging_face(exported, arch):
    model, traced = exported[arch]
    diffs = check_parity(model, traced.path, "target", max_draft=8, dtype="float32",
                         max_context=256)
    assert diffs["logits"] < 1e-3, diffs
    assert diffs["new_key"] < 1e-3 and diffs["new_value"] < 1e-3, diffs


def test_parity_catches_a_wrong_graph(exported):
    model, traced = exported["LlamaForCausalLM"]
    layer = model.model.layers[0].self_attn.k_proj
    saved = layer.weight.detach().clone()
    try:
        with torch.no_grad():
            layer.weight.mul_(1.5)      # the graph no longer matches the model
        with pytest.raises(ParityError, match=r"differs from the Hugging Face model at past_len"):
            check_parity(model, traced.path, "target", 8, "float32", 256)
    finally:
        with torch.no_grad():
            layer.weight.copy_(saved)


def test_sliding_window_is_exercised(models):
    """The Mistral fixture's window is shorter than parity's longest sequence."""
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(models["mistral"]).sliding_window < 24
