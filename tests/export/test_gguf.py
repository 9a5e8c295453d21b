"""GGUF import: `ssd-gguf-to-hf` and `ssd-export --target MODEL.gguf`.

A tiny random Llama is written as a GGUF file here, the way llama.cpp's convert_hf_to_gguf.py
writes one (float32 tensors under llama.cpp's names, q/k rows permuted, a byte-level BPE
vocabulary with its merges, a chat template), and read back: nothing is downloaded.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tiny

pytest.importorskip("gguf")

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TEXT = "def wrap(text, width=70):\n    return [line.strip() for line in text]"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny random Llama's Hugging Face folder, the same model as a GGUF file)."""
    root = tmp_path_factory.mktemp("gguf")
    tokenizer = tiny.build_tokenizer(root / "tokenizer")
    folder = tiny.build_model(root / "llama", "llama", tokenizer, seed=7, layers=2)
    path = root / "tiny-llama.gguf"
    write_gguf(folder, path)
    return folder, path


def test_a_gguf_file_reads_back_as_the_model_it_was_written_from(tiny_gguf, tmp_path):
    """The same weights, the same tokens for a text, the chat template; the output folder is
    complete (SOURCE.md written last inside it) and nothing else is left beside it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ssd_export.cli import gguf_to_hf_main

    folder, path = tiny_gguf
    out = tmp_path / "hf"
    assert gguf_to_hf_main([str(path), str(out), "--quiet"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "SOURCE.md"} <= \
        {p.name for p in out.iterdir()}
    original = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    back = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert original.keys() == back.keys()
    for name, weight in original.items():
        assert torch.equal(weight, back[name]), name
    hf, ours = AutoTokenizer.from_pretrained(folder), AutoTokenizer.from_pretrained(out)
    assert ours(TEXT).input_ids == hf(TEXT).input_ids
    assert ours.chat_template == TEMPLATE


def test_ssd_export_takes_a_gguf_target_and_draft(tiny_gguf, tmp_path):
    """--target and --draft a .gguf (the same file: converted once): the bundle's target is
    the model's own, its manifest names the file, and no temporary folder stays behind."""
    import tempfile

    from ssd_export import ExportConfig, export_bundle
    from ssd_runtime import Generator

    folder, path = tiny_gguf
    before = set(Path(tempfile.gettempdir()).glob("ssd-gguf-*"))
    manifest = export_bundle(ExportConfig(target=str(path), draft=str(path),
                                          output=tmp_path / "b", max_context=64, max_batch=1,
                                          quiet=True))
    assert manifest.target.source == str(path) == manifest.draft.source
    assert manifest.tokenizer.chat_template == TEMPLATE
    assert set(Path(tempfile.gettempdir()).glob("ssd-gguf-*")) == before
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(TEXT, return_tensors="pt").input_ids
    expected = AutoModelForCausalLM.from_pretrained(folder).generate(
        ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, ids.shape[1]:].tolist()
    res = Generator.load(tmp_path / "b").generate(TEXT, max_new_tokens=8, k=0,
                                                   min_new_tokens=8)
    assert res.token_ids == expected


@pytest.mark.parametrize("case", ["missing", "not_gguf", "a_folder"])
def test_a_bad_gguf_is_one_line_exit_2_and_no_output(case, tmp_path):
    """A missing file, a file that is not GGUF, a folder: one line on stderr naming it, exit
    code 2, no traceback, and no output folder (not even a half-written one)."""
    bad = {"missing": tmp_path / "nope.gguf", "a_folder": tmp_path}[case] \
        if case != "not_gguf" else tmp_path / "model.gguf"
    if case == "not_gguf":
        bad.write_bytes(b"PK\x03\x04 a zip, not a GGUF file")
    out = tmp_path / "out"
    res = _cli("ssd-gguf-to-hf", str(bad), str(out))
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("ssd-gguf-to-hf: error:")
    assert "Traceback" not in res.stderr and str(bad) in res.stderr
    assert not out.exists()
    if case == "not_gguf":
        assert "is not a GGUF file" in res.stderr and "HINT" in res.stderr


def test_ssd_export_refuses_a_bad_gguf_before_any_work(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("not a model")
    res = _cli("ssd-export", "--target", str(bad), "--draft", str(bad), "--output",
               str(tmp_path / "b"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.count("\n") == 1 and "is not a GGUF file" in res.stderr
    assert not (tmp_path / "b").exists()


def test_without_the_gguf_package_the_error_names_the_fix(tiny_gguf, tmp_path, monkeypatch,
                                                          capsys):
    from ssd_export.cli import gguf_to_hf_main

    monkeypatch.setitem(sys.modules, "gguf", None)       # `import gguf` raises ImportError
    assert gguf_to_hf_main([str(tiny_gguf[1]), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "needs the `gguf` package" in err and "pip install gguf" in err
    assert not (tmp_path / "out").exists()


def test_an_existing_output_needs_force(tiny_gguf, tmp_path):
    from ssd_export.cli import gguf_to_hf_main

    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep").write_text("mine")
    assert gguf_to_hf_main([str(tiny_gguf[1]), str(out), "--quiet"]) == 2
    assert (out / "keep").read_text() == "mine"


def _cli(name: str, *args: str) -> subprocess.CompletedProcess:
    entry = {"ssd-gguf-to-hf": "gguf_to_hf_main", "ssd-export": "main"}[name]
    code = f"import sys; from ssd_export.cli import {entry}; sys.exit({entry}(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300)


# llama.cpp's names for a Llama layer's tensors (convert_hf_to_gguf.py, gguf's tensor map)
LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
               "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
CONTROL, NORMAL = 3, 1      # llama.cpp's token types


def write_gguf(folder: Path, path: Path) -> None:
    """A Hugging Face Llama folder as llama.cpp's converter writes it, in float32."""
    import gguf
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    cfg = model.config
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]]
    specials = {t["content"] for t in tokenizer["added_tokens"]}

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([CONTROL if t in specials else NORMAL for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_pad_token_id(cfg.pad_token_id)
    w.add_add_bos_token(True)
    w.add_chat_template(TEMPLATE)
    for name, weight in model.state_dict().items():
        x = weight.float().numpy()
        if name in TOP_NAMES:
            w.add_tensor(TOP_NAMES[name], x)
            continue
        _, _, layer, *part, _ = name.split(".")        # model.layers.3.self_attn.q_proj.weight
        part = ".".join(part)
        if part == "self_attn.q_proj":
            x = _permute(x, cfg.num_attention_heads)
        elif part == "self_attn.k_proj":
            x = _permute(x, cfg.num_key_value_heads)
        w.add_tensor(f"blk.{layer}.{LAYER_NAMES[part]}.weight", np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _permute(x: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order: each head's rotary halves interleaved."""
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2) \
        .reshape(x.shape)
