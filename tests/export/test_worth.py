"""A draft's worth at export (docs/export.md, docs/design.md §6 and §8): the manifest's
`pair_worth` from the exported graphs, the prediction it makes for a draft that agrees and
costs less, for a draft that is the target itself and for an unrelated one, the one-line
warning, and bundles written before the field."""
from __future__ import annotations

import json
import re
import shutil

import pytest

import tiny
from ssd_export import ExportConfig, export_bundle
from ssd_export.worth import PAYS
from ssd_runtime.errors import BundleError
from ssd_runtime.manifest import SCHEMA_VERSION, read_manifest
from ssd_runtime.scheduler.cost import expected_tokens

# without --calib: the target's own continuations of the docstrings' openings
DEFAULT_TEXT = (r"the target's greedy continuations of \d+ openings of the Python standard "
                r"library's docstrings")


def predicted(worth: dict, k: int) -> float:
    """design §6's speed-up from the recorded c, c₁ and v(k) (v(0) = 1: in target steps)."""
    cost = (worth["c_first"] + (k - 1) * worth["c"] if k else 0.0) + worth["v"][k]
    return expected_tokens(worth["alpha"], k) / cost


def assert_sane(worth: dict, max_draft: int) -> None:
    assert 0.0 <= worth["agreement"] <= 1.0 and worth["alpha"] == worth["agreement"]
    assert worth["tokens"] >= 16 and re.fullmatch(DEFAULT_TEXT, worth["text"])
    assert worth["backend"] == "cpu" and worth["note"] == ""
    assert worth["c"] > 0 and worth["c_first"] > 0
    assert len(worth["v"]) == len(worth["speedups"]) == max_draft + 1
    assert worth["v"][0] == 1.0 and worth["v"] == sorted(worth["v"])   # rising (design §6)
    assert worth["speedups"][0] == 1.0                                  # k = 0: the target
    for k, s in enumerate(worth["speedups"]):
        assert s == pytest.approx(predicted(worth, k), rel=1e-3, abs=1e-3)
    assert worth["speedup"] == max(worth["speedups"]) == worth["speedups"][worth["best_k"]]
    assert worth["pays"] == (worth["best_k"] > 0 and worth["speedup"] >= PAYS)


def test_the_manifest_records_the_pairs_worth(bundle_factory):
    manifest = read_manifest(bundle_factory("llama", "llama_cut"))
    assert manifest.schema_version == SCHEMA_VERSION     # an optional key: no new schema
    assert_sane(manifest.pair_worth, manifest.max_draft)


def test_a_draft_that_is_the_target_agrees_on_every_token(bundle_factory):
    manifest = read_manifest(bundle_factory("llama", "llama", draft_quant="none"))
    worth = manifest.pair_worth
    assert worth["agreement"] == worth["alpha"] == 1.0
    assert_sane(worth, manifest.max_draft)        # k + 1 tokens a round, at the pair's costs


@pytest.fixture(scope="module")
def cheap_copy(models, tmp_path_factory):
    """(target, draft): a 6-layer Llama whose layers after the first add nothing (their
    attention and MLP outputs are zeroed, so the residual stream passes through unchanged),
    and its first layer alone: a draft that agrees on every token at a fraction of the cost."""
    from transformers import AutoModelForCausalLM, AutoTokenizer


    root = tmp_path_factory.mktemp("cheap_copy")
    tokenizer = AutoTokenizer.from_pretrained(models["llama"])
    target = tiny.build_model(root / "target", "llama", tokenizer, seed=70, layers=6)
    model = AutoModelForCausalLM.from_pretrained(target)
    for layer in model.model.layers[1:]:
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()
    model.save_pretrained(target)
    return target, tiny.truncate(target, root / "draft", 1, tokenizer)


def test_a_draft_that_agrees_and_costs_less_is_predicted_to_pay(cheap_copy, tmp_path, capsys):
    target, draft = cheap_copy
    manifest = export_bundle(ExportConfig(target=target, draft=draft, output=tmp_path / "b",
                                          draft_quant="none"))
    worth = manifest.pair_worth
    assert worth["agreement"] == 1.0 and worth["pays"] is True
    assert worth["best_k"] > 0 and worth["speedup"] > PAYS
    assert_sane(worth, manifest.max_draft)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "pair worth:" in line]
    assert len(lines) == 1 and "top-1 agreement 1.000" in lines[0], err
    assert f"at k = {worth['best_k']}" in lines[0]
    assert "warning" not in err, err


def test_an_unrelated_draft_gets_one_warning_line_saying_what_to_try(models, tmp_path, capsys):
    manifest = export_bundle(ExportConfig(target=models["llama"], draft=models["llama_other"],
                                          output=tmp_path / "b"))
    worth = manifest.pair_worth
    assert worth["agreement"] < 0.2 and worth["pays"] is False
    assert_sane(worth, manifest.max_draft)
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1, err
    line = warnings[0]
    assert "speculation is not expected to pay" in line
    assert f"best k is {worth['best_k']}" in line
    assert "another draft" in line and "--draft-quant" in line
    assert "--draft-source lookup" in line


def test_a_bundle_without_the_field_still_loads(bundle_factory, tmp_path):
    bundle = shutil.copytree(bundle_factory("llama", "llama_cut"), tmp_path / "b")
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    data.pop("pair_worth")                       # as written before the check existed
    path.write_text(json.dumps(data))
    assert read_manifest(bundle).pair_worth == {}
    data["schema_version"] = 6                   # and by older schemas
    path.write_text(json.dumps(data))
    assert read_manifest(bundle).pair_worth == {}
    data["pair_worth"] = [0.5]
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"malformed field \(pair_worth: \[0\.5\]\)"):
        read_manifest(bundle)


def test_the_warning_names_what_costs_a_draft_that_agrees():
    """A quantized draft that agrees on nearly every token and still does not pay (the
    target's own int8 copy beside an int8 target is the target): its step is the cost, so the
    line does not suggest a float draft, which would agree no more and cost more."""
    from ssd_export.worth import Worth
    from ssd_runtime.scheduler.cost import CostModel

    dear = CostModel(target_step=1.0, draft_step=1.05, verify=tuple(1.0 + 0.1 * k for k in range(5)))
    lines = {agreement: Worth(text="t", max_draft=4, agreement=agreement, tokens=256,
                              cost=dear).warning("int8") for agreement in (1.0, 0.5)}
    assert "cheaper step" in lines[1.0] and "--draft-quant none" not in lines[1.0]
    assert "--draft-quant none" in lines[0.5]
    cheap = Worth(text="t", max_draft=4, agreement=0.05, tokens=256, cost=dear).warning("none")
    assert "another draft" in cheap and "--draft-quant int8" in cheap
