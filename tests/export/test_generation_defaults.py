"""The target's generation_config travels in the bundle and sets the runtime's defaults, as
Hugging Face's generate() (and vLLM) apply it: unset settings mean what the model asks for."""
from __future__ import annotations

import json
import shutil

import pytest

from ssd_runtime import BundleError, Generator
from ssd_runtime.manifest import read_manifest

PROMPT = [0, 17, 42, 99, 17, 5]


def export_with(models, tmp_path, name: str, **generation) -> tuple[Generator, object]:
    """The tiny Llama pair, the target's generation_config changed to `generation`."""
    from transformers import GenerationConfig

    from ssd_export import ExportConfig, export_bundle

    target = tmp_path / f"{name}-target"
    shutil.copytree(models["llama"], target)
    config = GenerationConfig.from_pretrained(target)
    for key, value in generation.items():
        setattr(config, key, value)
    config.save_pretrained(target)
    out = tmp_path / name
    export_bundle(ExportConfig(target=str(target), draft=str(models["llama_cut"]), output=out,
                               quiet=True))
    return Generator.load(out), target


@pytest.mark.slow
def test_greedy_model_default_repetition_penalty_equals_plain_generate(models, tmp_path):
    """A greedy generation_config with a repetition penalty (as Qwen2.5-Instruct ships):
    generate() with no settings applies it, so the runtime's defaults must too."""
    import torch
    from transformers import AutoModelForCausalLM

    gen, target = export_with(models, tmp_path, "rep", repetition_penalty=1.6)
    assert gen.manifest.generation == {"repetition_penalty": 1.6}
    model = AutoModelForCausalLM.from_pretrained(target).eval()
    ids = torch.tensor([PROMPT])
    hf = model.generate(ids, max_new_tokens=40, attention_mask=torch.ones_like(ids),
                        pad_token_id=2)[0, len(PROMPT):].tolist()
    plain = gen.generate(PROMPT, max_new_tokens=40, repetition_penalty=1.0, k=0).token_ids
    assert plain != hf, "the penalty must change this output, or the test shows nothing"
    for k in (0, 4, "auto"):
        assert gen.generate(PROMPT, max_new_tokens=40, k=k).token_ids == hf[:40]


@pytest.mark.slow
def test_a_model_without_eos_runs_past_the_tokenizers_eos_as_generate_does(models, tmp_path,
                                                                           capsys):
    """No eos_token_id in config.json or generation_config.json: generate() never stops at the
    tokenizer's </s>, so neither does the bundle (it used to fall back to the tokenizer's)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ssd_export import ExportConfig, export_bundle

    target = tmp_path / "noeos-target"
    model = AutoModelForCausalLM.from_pretrained(models["llama"]).eval()
    model.config.eos_token_id = model.generation_config.eos_token_id = None
    ids = torch.tensor([PROMPT])
    plain = model.generate(ids, max_new_tokens=12, attention_mask=torch.ones_like(ids),
                           pad_token_id=2)[0, len(PROMPT):].tolist()
    with torch.no_grad():               # </s> (1) becomes the argmax where the 6th token was
        model.lm_head.weight[1] = model.lm_head.weight[plain[5]] * 1.05
    model.save_pretrained(target)
    shutil.copy(models["llama"] / "tokenizer.json", target)
    shutil.copy(models["llama"] / "tokenizer_config.json", target)
    hf = model.generate(ids, max_new_tokens=20, attention_mask=torch.ones_like(ids),
                        pad_token_id=2)[0, len(PROMPT):].tolist()
    assert 1 in hf[:-1], "</s> must come before the end, or the test shows nothing"
    out = tmp_path / "noeos"
    export_bundle(ExportConfig(target=str(target), draft=str(models["llama_cut"]), output=out))
    assert "set no eos_token_id" in capsys.readouterr().err
    gen = Generator.load(out)
    assert gen.manifest.tokenizer.eos_token_ids == []
    for k in (0, 4, "auto"):
        res = gen.generate(PROMPT, max_new_tokens=20, k=k)
        assert res.token_ids == hf and res.stop_reason == "length", k


def test_sampling_model_defaults_and_what_overrides_them(models, tmp_path, capsys):
    from ssd_export import ExportConfig, export_bundle

    gen, target = export_with(models, tmp_path, "sample", do_sample=True, temperature=0.7,
                              top_p=0.9)
    assert gen.manifest.generation == {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
    assert gen.defaults() == {"temperature": 0.7, "top_k": 0, "top_p": 0.9,
                              "repetition_penalty": 1.0}
    by_default = gen.generate(PROMPT, max_new_tokens=30, seed=3, k=4).token_ids
    spelled = gen.generate(PROMPT, max_new_tokens=30, seed=3, k=4, temperature=0.7, top_p=0.9)
    greedy = gen.generate(PROMPT, max_new_tokens=30, temperature=0)
    assert by_default == spelled.token_ids != greedy.token_ids
    assert greedy.token_ids == gen.generate(PROMPT, max_new_tokens=30, temperature=0,
                                            k=0).token_ids
    # settings the runtime does not apply are named at export
    from transformers import GenerationConfig

    config = GenerationConfig.from_pretrained(target)
    config.no_repeat_ngram_size = 3
    config.save_pretrained(target)
    export_bundle(ExportConfig(target=str(target), draft=str(models["llama_cut"]),
                               output=tmp_path / "noted"))
    assert "generation_config sets no_repeat_ngram_size=3, which the runtime does not apply" \
        in capsys.readouterr().err


def test_models_without_settings_decode_greedily(bundle_factory):
    gen = Generator.load(bundle_factory("llama", "llama_cut"))
    assert gen.manifest.generation == {}
    assert gen.defaults()["temperature"] == 0 and gen.defaults(openai=True)["temperature"] == 1


@pytest.mark.parametrize("bad", [{"temperature": "hot"}, {"beams": 4}, ["do_sample"]])
def test_malformed_generation_defaults_are_refused(bundle_factory, tmp_path, bad):
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_factory("llama", "llama_cut"), bundle)
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    data["generation"] = bad
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match="malformed field"):
        read_manifest(bundle)
