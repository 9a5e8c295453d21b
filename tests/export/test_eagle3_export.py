"""ssd-export with a published EAGLE-3 head as the draft (docs/design.md §14): the target's graphs
output the head's features, the head is the draft graph, the manifest says so, parity holds end
to end, and a head that does not fit is one clear error with nothing written."""
from __future__ import annotations

import json
from pathlib import Path

import export_cache
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tiny
import torch
from ssd_export import ExportConfig, export_bundle
from ssd_export.eagle3 import head_parity
from ssd_graphs.eagle3 import aux_hidden, load_head
from ssd_graphs.trt_lint import errors, lint_file
from ssd_runtime import contract
from ssd_runtime.backends import cpu_session
from ssd_runtime.errors import BundleError, ConfigError, ParityError
from ssd_runtime.manifest import Manifest, read_manifest

WIDTH, VOCAB, LAYERS = 64, tiny.VOCAB, 3          # the "llama" fixture target


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    return {
        # narrower than the target, its own embedding, the default (ort) bundle
        "safeailab": tiny.build_eagle3_head(root / "safeailab", "safeailab", target_hidden=WIDTH,
                                            vocab=VOCAB, hidden=32, seed=1),
        # as wide as the target, the target's embedding, a residual after the norm
        "speculators": tiny.build_eagle3_head(root / "speculators", "speculators",
                                              target_hidden=WIDTH, vocab=VOCAB, hidden=WIDTH,
                                              draft_vocab=128, embed=False, seed=2),
    }


@pytest.fixture(scope="module")
def bundles(models, heads, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("head-bundles")
    made = {}
    for name, graph, max_batch in (("safeailab", "auto", 2), ("speculators", "standard", 1)):
        out = root / name
        export_cache.bundle(ExportConfig(target=str(models["llama"]), draft=str(heads[name]),
                                         output=out, quiet=True, graph=graph,
                                         max_batch=max_batch), out)
        made[name] = out
    return made


def _outputs(path: Path) -> list[str]:
    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def test_the_manifest_describes_the_head_and_the_features(bundles):
    m = read_manifest(bundles["safeailab"])
    assert m.schema_version >= 9
    assert m.draft.kind == contract.EAGLE3 and m.target.kind == contract.MODEL
    assert m.target.aux_layer_ids == m.draft.aux_layer_ids == [0, 1, 2]
    assert m.draft.head == {"layout": "safeailab", "hidden_size": 32, "target_hidden_size": WIDTH,
                            "draft_vocab_size": 96, "norm_before_residual": False,
                            "embedding": "head"}
    assert (m.target.graph, m.draft.graph) == (contract.ORT, contract.STATIC)
    assert m.draft.inputs == contract.head_input_names()
    assert m.draft.outputs[:4] == contract.head_output_names(contract.STATIC)
    # every target graph computes the features: the target's and its rows graph
    assert m.target.outputs[-1] == contract.AUX_HIDDEN
    for path in (m.target.path, m.target.rows):
        assert _outputs(bundles["safeailab"] / path)[-1] == contract.AUX_HIDDEN
    assert m.target.parity[contract.AUX_HIDDEN] < 1e-3
    assert m.target.rows_parity[contract.AUX_HIDDEN] < 1e-3
    assert max(m.draft.parity.values()) < 1e-3
    s = read_manifest(bundles["speculators"])
    assert s.draft.head["layout"] == "speculators" and s.draft.head["embedding"] == "target"
    assert s.draft.head["norm_before_residual"] is True
    assert (s.target.graph, s.draft.graph) == (contract.STANDARD, contract.STANDARD)


def test_a_bundle_without_a_head_is_unchanged(bundle_factory):
    bundle = bundle_factory("llama", "llama_cut")
    m = read_manifest(bundle)
    assert m.draft.kind == contract.MODEL and m.target.aux_layer_ids == []
    assert contract.AUX_HIDDEN not in m.target.outputs
    assert contract.AUX_HIDDEN not in _outputs(bundle / m.target.path)


def test_the_head_fed_the_targets_features_gives_the_pytorch_heads_logits(models, heads,
                                                                           bundles):
    """The chain a drafting round runs, on the standard bundle: the target graph's aux_hidden
    equals Hugging Face's hidden_states at the head's layers, and the head graph fed those
    features (then its own hidden_out) gives what the PyTorch head gives."""
    from transformers import AutoModelForCausalLM

    bundle = bundles["speculators"]
    m = read_manifest(bundle)
    ids = np.random.default_rng(0).integers(3, VOCAB, size=(1, 10))
    target = ort.InferenceSession(str(bundle / m.target.path), providers=["CPUExecutionProvider"])
    empty = np.zeros((1, 0, m.target.num_kv_heads, m.target.head_dim), np.float32)
    feeds = {contract.INPUT_IDS: ids, contract.POSITION_IDS: np.arange(10)[None],
             **{name: empty for name in contract.input_names(LAYERS)[2:]}}
    features = dict(zip(_outputs(bundle / m.target.path), target.run(None, feeds)))[
        contract.AUX_HIDDEN]                                         # (1, 10, 3·Ht)
    model = AutoModelForCausalLM.from_pretrained(models["llama"]).eval()
    with torch.no_grad():
        states = model(torch.from_numpy(ids), output_hidden_states=True).hidden_states
        want = aux_hidden(states, (0, 1, 2)).numpy()
    np.testing.assert_allclose(features, want, atol=1e-4, rtol=1e-4)
    _, torch_head, _ = load_head(heads["speculators"],
                                 embed_weight=model.get_input_embeddings().weight)
    head = ort.InferenceSession(str(bundle / m.draft.path), providers=["CPUExecutionProvider"])
    H = m.draft.head["hidden_size"]
    row_ids = np.roll(ids, -1)[:, :9]                                # row t carries x_{t+1}
    feeds = {contract.INPUT_IDS: row_ids, contract.POSITION_IDS: np.arange(9)[None],
             contract.FEATURES: features[:, :9], contract.HIDDEN: np.zeros((1, 9, H), np.float32),
             contract.past_key(0): np.zeros((1, 0, 2, H // 4), np.float32),
             contract.past_value(0): np.zeros((1, 0, 2, H // 4), np.float32)}
    logits, new_k, new_v, hidden_out = head.run(None, feeds)
    with torch.no_grad():
        draft, out, _ = torch_head(torch.from_numpy(row_ids),
                                   torch_head.fuse(torch.from_numpy(features[:, :9])),
                                   torch.arange(9)[None])
        want_logits = torch_head.target_logits(draft).numpy()
    np.testing.assert_allclose(logits, want_logits, atol=1e-3, rtol=1e-4)
    np.testing.assert_allclose(hidden_out, out.numpy(), atol=1e-4, rtol=1e-4)
    # the next drafting step: the draft token, fed with the head's own output
    token = logits[:, -1].argmax(-1)
    assert torch_head.t2d[int(token[0])]                             # a draft-vocabulary id
    step = head.run(None, {**feeds, contract.INPUT_IDS: token[:, None],
                           contract.POSITION_IDS: np.array([[9]]),
                           contract.FEATURES: np.zeros((1, 1, 3 * WIDTH), np.float32),
                           contract.HIDDEN: hidden_out[:, -1:],
                           contract.past_key(0): new_k, contract.past_value(0): new_v})
    with torch.no_grad():
        again, _, _ = torch_head(torch.from_numpy(token[:, None]),
                                 torch.from_numpy(hidden_out[:, -1:]), torch.tensor([[9]]),
                                 (torch.from_numpy(new_k), torch.from_numpy(new_v)))
    np.testing.assert_allclose(step[0], torch_head.target_logits(again).numpy(), atol=1e-3,
                               rtol=1e-4)


def test_the_standard_and_static_graphs_pass_the_tensorrt_lint(bundles):
    m = read_manifest(bundles["speculators"])
    static = read_manifest(bundles["safeailab"]).draft
    for bundle, entry in ((bundles["speculators"], m.target), (bundles["speculators"], m.draft),
                          (bundles["safeailab"], static)):
        assert errors(lint_file(bundle / entry.path, entry.path)) == [], entry.path


def test_todays_runtime_still_opens_the_target(bundles):
    """The extra output is computed and left unbound: the target session works as before."""
    bundle = bundles["safeailab"]
    session = cpu_session("target", bundle, read_manifest(bundle), threads=1)
    logits = session.forward(np.arange(3, 9, dtype=np.int64), 0)
    assert logits.shape == (6, VOCAB) and np.isfinite(logits).all()


def test_parity_catches_a_wrong_head_graph(bundles, heads, models):
    from transformers import AutoModelForCausalLM

    bundle = bundles["speculators"]
    m = read_manifest(bundle)
    embed = AutoModelForCausalLM.from_pretrained(models["llama"]).get_input_embeddings().weight
    _, head, _ = load_head(heads["speculators"], embed_weight=embed)
    assert max(head_parity(head, bundle / m.draft.path, m.draft.graph, 4, 64).values()) < 1e-3
    with torch.no_grad():
        head.midlayer.hidden_norm.weight.mul_(1.5)
    with pytest.raises(ParityError, match="differs from the PyTorch head"):
        head_parity(head, bundle / m.draft.path, m.draft.graph, 4, 64)


def test_older_and_inconsistent_manifests(bundles):
    data = json.loads((bundles["safeailab"] / "manifest.json").read_text())
    old = json.loads(json.dumps(data))
    old["schema_version"] = 8
    for role in ("target", "draft"):
        for key in ("kind", "aux_layer_ids", "head"):
            old["models"][role].pop(key)
    old["models"]["target"]["outputs"].remove(contract.AUX_HIDDEN)
    m = Manifest.from_dict(old)
    assert m.draft.kind == contract.MODEL and m.target.aux_layer_ids == [] and m.draft.head == {}
    broken = json.loads(json.dumps(data))
    broken["models"]["target"]["aux_layer_ids"] = [0, 1]
    with pytest.raises(BundleError, match="does not describe it whole"):
        Manifest.from_dict(broken)
    broken = json.loads(json.dumps(data))
    broken["models"]["draft"]["kind"] = "medusa"
    with pytest.raises(BundleError, match="kind is 'medusa'"):
        Manifest.from_dict(broken)


def _truncate(folder: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-64])


BAD = {
    "a head for a wider target": (dict(target_hidden=48), {}, None,
                                  "reads features of width 48.*hidden size is 64"),
    "another vocabulary": (dict(vocab=500), {}, None, "vocabulary of 500 tokens; the target has 384"),
    "layers past the target's depth": (dict(layer_ids=(0, 1, 5)), {}, None,
                                       r"layers \[0, 1, 5\], but the target has 3"),
    "a missing tensor": (dict(drop="midlayer.mlp.up_proj.weight"), {}, None,
                         "lacks midlayer.mlp.up_proj.weight"),
    "a misshapen tensor": (dict(), {"intermediate_size": 48}, None,
                           r"midlayer.mlp.gate_proj.weight is \(64, 32\).*implies \(48, 32\)"),
    "a truncated weight file": (dict(), {}, _truncate, "truncated or corrupt"),
    "an unknown speculators type": (dict(), {"speculators_model_type": "medusa"}, None,
                                    "speculators_model_type is 'medusa', not 'eagle3'"),
    "an unknown layout": (dict(), {"architectures": ["Qwen3ForCausalLMEagle3"]}, None,
                          "not an EAGLE-3 head in a known layout"),
    "no embedding and another width": (dict(embed=False), {}, None,
                                       "carries no embedding table and is 32 wide"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_head_that_does_not_fit_is_one_error_and_nothing_written(models, tmp_path, case):
    build, config, damage, message = BAD[case]
    spec = {"target_hidden": WIDTH, "vocab": VOCAB, **build}
    head = tiny.build_eagle3_head(tmp_path / "head", "safeailab", **spec, **config)
    if damage is not None:
        damage(head)
    out = tmp_path / "bundle"
    with pytest.raises(ConfigError, match=message):
        export_bundle(ExportConfig(target=str(models["llama"]), draft=str(head), output=out,
                                   quiet=True))
    assert not out.exists() and not list(tmp_path.glob(".bundle.*"))


@pytest.mark.parametrize("option, message", [
    (("--draft-quant", "int8"), "exported in float only"),
    (("--engines", "trt"), "TensorRT engine is not built yet"),
])
def test_what_a_head_does_not_have_yet_is_refused_by_the_cli(models, heads, tmp_path, capsys,
                                                            option, message):
    from ssd_export.cli import main

    out = tmp_path / "bundle"
    code = main(["--target", str(models["llama"]), "--draft", str(heads["safeailab"]),
                 "--output", str(out), "--quiet", *option])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and "Traceback" not in err[0]
    assert not out.exists()


def test_the_heads_worth_compares_the_right_rows(models, heads, bundles):
    """ssd-export's worth check for a head: row t of the head (the target's features at t,
    token x_{t+1}) against the target's argmax after x_{t+1}; both as Hugging Face and the
    PyTorch head give them. And the bundle records the prediction."""
    from ssd_export.head_worth import HeadSteps, picks
    from transformers import AutoModelForCausalLM

    bundle = bundles["speculators"]
    m = read_manifest(bundle)
    target = ort.InferenceSession(str(bundle / m.target.path), providers=["CPUExecutionProvider"])
    head = ort.InferenceSession(str(bundle / m.draft.path), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(1).integers(3, VOCAB, size=20)
    wanted, drafted = picks(target, head, m, ids)
    model = AutoModelForCausalLM.from_pretrained(models["llama"]).eval()
    _, torch_head, _ = load_head(heads["speculators"],
                                 embed_weight=model.get_input_embeddings().weight)
    with torch.no_grad():
        out = model(torch.from_numpy(ids[None]), output_hidden_states=True)
        features = aux_hidden(out.hidden_states, (0, 1, 2))[:, :19]
        logits, _, _ = torch_head(torch.from_numpy(ids[None, 1:]), torch_head.fuse(features),
                                  torch.arange(19)[None])
    assert np.array_equal(wanted, out.logits[0, 1:].argmax(-1).numpy())
    assert np.array_equal(drafted, torch_head.target_logits(logits)[0].argmax(-1).numpy())
    worth = m.pair_worth
    assert worth["tokens"] > 16 and worth["alpha"] is not None and worth["c"] > 0
    assert "first draft token" in worth["note"]
    assert worth["text"].startswith("the target's greedy continuations of")
    steps = HeadSteps(head, m.draft, 32)            # a drafting step after a prefill
    steps.prefill(ids[:5])
    assert steps.forward(ids[5:6], 5).shape == (1, VOCAB)
