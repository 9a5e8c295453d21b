"""`ssd-export --draft mtp` (docs/design.md §14): a DeepSeek V3 or GLM-4 MoE target's own MTP layer,
read from its checkpoint (transformers drops it at load) and exported as its draft head with no
training. The manifest says so, the layer's graph matches Hugging Face's decoder layer of the
family, the runtime drafts what the PyTorch layer drafts, speculation is the target alone, and a
target without a usable MTP layer is one clear error with nothing written."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import export_cache
import pytest
import tiny
from heads import assert_batch_drafts_as, head_row
import torch
from ssd_export import ExportConfig, export_bundle
from ssd_graphs.mtp import load_mtp
from ssd_runtime import Generator, contract
from ssd_graphs.trt_lint import errors, lint_file
from ssd_runtime.errors import BundleError, ConfigError
from ssd_runtime.manifest import Manifest, read_manifest
from ssd_runtime.round.loop import Loop

PROMPTS = [[5, 9, 14, 3, 22, 7], [40, 2, 2, 17], [11, 60, 3, 8, 19, 25, 31, 4, 9]]
LAYERS = 2                      # the MTP layer is model.layers.2


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """DeepSeek V3 (MLA, MoE) with the layer's own shared_head.head; GLM-4 MoE without one
    (the target's lm_head serves, as SGLang reads it)."""
    root = tmp_path_factory.mktemp("mtp-targets")
    tok = tiny.build_tokenizer(root / "tokenizer")
    made = {}
    for kind, head in (("deepseek_v3", True), ("glm4_moe", False)):
        folder = tiny.build_model(root / kind, kind, tok, seed=1, layers=LAYERS)
        made[kind] = tiny.add_mtp_layer(folder, seed=2, head=head)
    made["tokenizer"] = root / "tokenizer"
    return made


@pytest.fixture(scope="module")
def bundles(targets, tmp_path_factory):
    """kind -> its bundle, exported on first use: DeepSeek V3 with the default (ort) target,
    GLM-4 MoE with standard graphs."""
    root = tmp_path_factory.mktemp("mtp-bundles")
    made: dict[str, Path] = {}

    def bundle(kind: str) -> Path:
        if kind not in made:
            out = root / kind
            graph = "auto" if kind == "deepseek_v3" else "standard"
            made[kind] = export_cache.bundle(ExportConfig(
                target=str(targets[kind]), draft="mtp", output=out, quiet=True, graph=graph,
                max_batch=3, max_context=256), out)
        return made[kind]

    return bundle


@pytest.fixture(scope="module")
def gen(bundles) -> Generator:
    return Generator.load(bundles("deepseek_v3"), backend="cpu", threads=1, max_batch=3)


@pytest.fixture(scope="module")
def reference(targets):
    """The drafts the PyTorch MTP layer proposes after `seq` (its last token pending): the
    target's last hidden state (after its final norm) over seq[:-1] from Hugging Face, the
    layer over every position, then its own output fed back, one token a step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(targets["deepseek_v3"]).eval()
    head = load_mtp(targets["deepseek_v3"], model)

    @torch.no_grad()
    def drafts(seq: list[int], k: int) -> list[int]:
        h = model(torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[LAYERS]
        n = len(seq) - 1
        logits, out, cache = head(torch.tensor([seq[1:]]), h, torch.arange(n)[None])
        found = []
        for step in range(k):
            token = int(logits[0, -1].argmax())
            found.append(token)
            logits, out, cache = head(torch.tensor([[token]]), out[:, -1:],
                                      torch.tensor([[n + step]]), cache)
        return found

    return drafts


def test_the_manifest_describes_the_mtp_layer(bundles):
    m = read_manifest(bundles("deepseek_v3"))
    assert m.draft.kind == contract.MTP and m.target.kind == contract.MODEL
    assert m.target.aux_layer_ids == m.draft.aux_layer_ids == [LAYERS]
    assert m.draft.head == {"layout": "mtp", "hidden_size": 64, "target_hidden_size": 64,
                            "draft_vocab_size": tiny.VOCAB, "norm_before_residual": False,
                            "embedding": "target", "lm_head": "layer", "source_layer": LAYERS,
                            "features": "final_norm", "num_nextn_predict_layers": 1}
    assert (m.target.graph, m.draft.graph) == (contract.ORT, contract.STATIC)
    assert m.draft.inputs == contract.head_input_names()
    assert (m.draft.num_kv_heads, m.draft.head_dim) == (1, 32 + 8)    # MLA: latent + rope
    # the feature is Hugging Face's hidden_states[L], checked in the target graphs
    assert m.target.outputs[-1] == contract.AUX_HIDDEN
    assert m.target.parity[contract.AUX_HIDDEN] < 1e-3
    assert max(m.draft.parity.values()) < 1e-3


def test_the_manifest_ties_the_mtp_layer_to_the_target_feature(bundles):
    data = json.loads((bundles("deepseek_v3") / "manifest.json").read_text())
    assert Manifest.from_dict(json.loads(json.dumps(data))).draft.kind == contract.MTP
    for role, ids in (("draft", [0, 1, 2]), ("target", [LAYERS - 1])):
        broken = json.loads(json.dumps(data))
        broken["models"][role]["aux_layer_ids"] = ids
        with pytest.raises(BundleError, match=r"the draft is a head \(mtp\) but the bundle "
                                              r"does not describe it whole"):
            Manifest.from_dict(broken)


def test_the_runtime_drafts_what_the_pytorch_layer_drafts(gen, reference):
    """Round after round, alone and in a batch of three: the feature of position t beside
    token x_{t+1}, the layer's own output fed back for the later drafts."""
    row = head_row(gen, PROMPTS[0], 3)
    loop = Loop(gen.target, gen.draft)
    for _ in range(3):
        before = list(row.seq)
        loop.round([row])
        assert row.drafts == reference(before, 3)
    assert_batch_drafts_as(gen, reference, PROMPTS, 2, rounds=2)


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 3}])
def test_speculation_with_the_mtp_layer_is_the_target_alone(gen, sampling):
    for prompt in PROMPTS:
        alone = gen.generate(prompt, max_new_tokens=16, k=0, **sampling).token_ids
        for k in (1, 4, "auto"):
            assert gen.generate(prompt, max_new_tokens=16, k=k, **sampling).token_ids == alone
    alone = [gen.generate(p, max_new_tokens=16, k=0, **sampling).token_ids for p in PROMPTS]
    results = gen.generate_batch(PROMPTS, max_new_tokens=16, k=3, **sampling)
    assert [r.token_ids for r in results] == alone


def test_a_glm4_moe_mtp_layer_without_its_own_head_is_lossless_in_a_batch(bundles):
    g = read_manifest(bundles("glm4_moe"))
    assert g.draft.head["lm_head"] == "target" and g.draft.aux_layer_ids == [LAYERS]
    assert (g.target.graph, g.draft.graph) == (contract.STANDARD, contract.STANDARD)
    assert max(g.draft.parity.values()) < 1e-3 and g.target.parity[contract.AUX_HIDDEN] < 1e-3
    for entry in (g.target, g.draft):    # standard ONNX, as the TensorRT lint reads it
        assert errors(lint_file(bundles("glm4_moe") / entry.path, entry.path)) == [], entry.path
    gen = Generator.load(bundles("glm4_moe"), backend="cpu", threads=1, max_batch=3)
    alone = [gen.generate(p, max_new_tokens=12, k=0).token_ids for p in PROMPTS]
    assert [gen.generate(p, max_new_tokens=12, k=3).token_ids for p in PROMPTS] == alone
    results = gen.generate_batch(PROMPTS, max_new_tokens=12, k=2)
    assert [r.token_ids for r in results] == alone


def _copy(targets, tmp_path: Path, kind: str = "deepseek_v3") -> Path:
    folder = tmp_path / "target"
    shutil.copytree(targets[kind], folder)
    return folder


def _edit_config(folder: Path, **fields) -> Path:
    d = json.loads((folder / "config.json").read_text())
    d.update(fields)
    (folder / "config.json").write_text(json.dumps(d))
    return folder


def _refused(target: Path, tmp_path: Path, match: str, **options) -> None:
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=match):
        export_bundle(ExportConfig(target=str(target), draft="mtp", output=out, quiet=True,
                                   **options))
    assert not out.exists()


def test_a_target_without_mtp_layers_is_refused(targets, tmp_path):
    folder = _copy(targets, tmp_path)
    _refused(_edit_config(folder, num_nextn_predict_layers=0), tmp_path,
             r"has no MTP layer.*num_nextn_predict_layers 0")
    _refused(_edit_config(folder, num_nextn_predict_layers=None), tmp_path,
             r"has no MTP layer.*num_nextn_predict_layers None")


@pytest.mark.parametrize("drop", ["eh_proj.weight", "mlp.experts.1.up_proj.weight"])
def test_missing_mtp_tensors_are_refused(targets, tmp_path, drop):
    """The config says 1 but the safetensors lack a tensor (as transformers' save_pretrained
    leaves a checkpoint: it drops the layer)."""
    folder = tiny.add_mtp_layer(tiny.build_model(tmp_path / "t", "deepseek_v3",
                                                 tiny.build_tokenizer(tmp_path / "tok"), seed=1,
                                                 layers=LAYERS), drop=drop)
    _refused(folder, tmp_path, rf"num_nextn_predict_layers 1, but its safetensors lack "
                               rf"model\.layers\.2\.{drop}")


def test_misshapen_mtp_tensors_are_refused(targets, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _copy(targets, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.2.eh_proj.weight"] = torch.zeros(64, 64)     # (H, H), not (H, 2H)
    save_file(tensors, str(folder / "model.safetensors"))
    _refused(folder, tmp_path, r"model\.layers\.2\.eh_proj\.weight is \(64, 64\), expected "
                               r"\(64, 128\)")


@pytest.mark.parametrize("arch", ["MiMoForCausalLM", "Qwen3NextForCausalLM", "LlamaForCausalLM"])
def test_classes_whose_mtp_layers_are_not_read_are_refused_by_name(targets, tmp_path, arch):
    folder = _edit_config(_copy(targets, tmp_path), architectures=[arch])
    _refused(folder, tmp_path, rf"is {arch}: .*(MiMo|Qwen3-Next|no MTP layer this toolkit)")


def test_mtp_options_not_built_yet_are_refused(targets, tmp_path):
    _refused(targets["deepseek_v3"], tmp_path, r"--draft-quant int8 with --draft mtp",
             draft_quant="int8")


def test_a_deepseek_v2_mtp_layer_matches_hugging_face(tmp_path):
    """V2's config carries num_nextn_predict_layers as an extra key; its layer (MLA without a
    query rank, interleaved RoPE, softmax routing) traces as the target's layers do."""
    from ssd_export.eagle3 import head_parity
    from ssd_graphs.mtp_trace import export_mtp
    from transformers import AutoModelForCausalLM

    folder = tiny.add_mtp_layer(tiny.build_model(tmp_path / "v2", "deepseek_v2",
                                                 tiny.build_tokenizer(tmp_path / "tok"), seed=1,
                                                 layers=LAYERS), seed=3)
    head = load_mtp(folder, AutoModelForCausalLM.from_pretrained(folder).eval())
    traced = export_mtp(head, str(folder), tmp_path / "g" / "model.onnx", 64, contract.STANDARD)
    assert max(head_parity(head, traced.path, contract.STANDARD, 4, 64).values()) < 1e-3


def test_more_mtp_layers_than_one_export_the_first_and_say_so(targets, tmp_path):
    """As vLLM's proposer drafts: the first MTP layer at every step, the others unread."""
    from ssd_export.mtp import read_mtp
    from transformers import AutoModelForCausalLM

    folder = _edit_config(_copy(targets, tmp_path), num_nextn_predict_layers=2)
    loaded = read_mtp(str(folder), AutoModelForCausalLM.from_pretrained(folder).eval())
    assert loaded.config.source_layer == LAYERS and loaded.config.aux_layer_ids == (LAYERS,)
    assert loaded.settings()["num_nextn_predict_layers"] == 2
    assert "the checkpoint has 2, the first drafts every step" in loaded.describe()
