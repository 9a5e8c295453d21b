"""Bad input: one clear line, exit 2, no traceback, and never a half-written bundle."""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ssd_export import ExportConfig, export_bundle
from ssd_runtime.errors import ConfigError, ParityError
from ssd_runtime.manifest import SCHEMA_VERSION


def run(module: str, *args, program: bool = False, entry: str = "main"
        ) -> subprocess.CompletedProcess:
    """`python -m module args`: by default the CLI's `entry`(argv) in this process, its stdout and
    stderr captured and its exit code returned (a new Python importing torch costs 5-8 s a
    call); program=True runs it as a user does, as its own process (one test per CLI)."""
    argv = [str(a) for a in args]
    if program:
        return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True,
                              text=True, timeout=300)
    main = getattr(importlib.import_module(module), entry)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:          # argparse's errors: the message is on stderr
            code = exc.code
    return subprocess.CompletedProcess([module, *argv], code, out.getvalue(), err.getvalue())


def assert_clean_error(proc: subprocess.CompletedProcess, prog: str, pattern: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), proc.stderr
    assert pytest.importorskip("re").search(pattern, lines[0]), lines[0]


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


@pytest.fixture
def out(tmp_path) -> Path:
    return tmp_path / "bundle"


def export_cli(target, draft, out, *extra, program: bool = False, quiet: bool = True):
    return run("ssd_export.cli", "--target", target, "--draft", draft, "--output", out,
               *(["--quiet"] if quiet else []), *extra, program=program)


def test_the_python_api_takes_string_paths_and_names_bad_choices(models, tmp_path):
    config = ExportConfig(target=models["llama"], draft=models["llama_cut"],
                          output=str(tmp_path / "b"))
    assert config.output == tmp_path / "b" and isinstance(config.target, str)
    with pytest.raises(ConfigError, match=r"dtype='bf16' is not one of float32, float16"):
        ExportConfig(target="t", draft="d", output="o", dtype="bf16")
    with pytest.raises(ConfigError, match=r"graph='fast' is not one of auto, standard, ort"):
        ExportConfig(target="t", draft="d", output="o", graph="fast")


def test_missing_model_folder(models, out):
    proc = export_cli(out.parent / "no-such-model", models["llama"], out, program=True)
    assert_clean_error(proc, "ssd-export", r"target model folder .*no-such-model.* does not exist")
    assert_nothing_written(out)


def test_an_output_under_a_file_is_one_line(models, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = export_cli(models["llama"], models["llama_cut"], blocker / "bundle")
    assert_clean_error(proc, "ssd-export", r"cannot be created: .*file is a file, not a folder")


@pytest.mark.parametrize("damage", ["truncated weights", "corrupt tokenizer.json"])
def test_a_damaged_model_folder_is_one_line(models, out, tmp_path, damage):
    """An interrupted download or copy: the folder's problem, named, never a traceback."""
    folder = tmp_path / "draft"
    shutil.copytree(models["llama_cut"], folder)
    if damage == "truncated weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
        pattern = r"draft model .* failed to load: .*weight files are complete"
    else:
        (folder / "tokenizer.json").write_text("{}")
        pattern = r"draft model .* has no usable tokenizer"
    with pytest.raises(ConfigError, match=pattern):
        export_bundle(ExportConfig(target=str(models["llama"]), draft=str(folder), output=out,
                                   quiet=True))
    assert_nothing_written(out)


def test_not_a_causal_lm(models, out, tmp_path):
    from transformers import BertConfig

    folder = tmp_path / "bert"
    BertConfig(architectures=["BertForSequenceClassification"]).save_pretrained(folder)
    proc = export_cli(models["llama"], folder, out)
    assert_clean_error(proc, "ssd-export", r"draft model .* not a causal language model")
    assert_nothing_written(out)


def test_unsupported_architecture_lists_supported(models, out, tmp_path):
    from transformers import MambaConfig       # a state-space model: no KV cache to export

    folder = tmp_path / "mamba"
    MambaConfig(architectures=["MambaForCausalLM"]).save_pretrained(folder)
    proc = export_cli(folder, models["llama"], out)
    assert_clean_error(proc, "ssd-export",
                       r"MambaForCausalLM is not supported\. Supported: .*LlamaForCausalLM.*"
                       r"MistralForCausalLM.*Qwen2ForCausalLM")
    assert_nothing_written(out)


def test_vocabularies_differ(models, out):
    # transformers loads the Qwen2 folder with Qwen2's tokenizer class, which adds a token
    proc = export_cli(models["qwen2"], models["llama_cut"], out)
    assert_clean_error(proc, "ssd-export", r"vocabularies differ .*first: id 384: target "
                                           r"'<\|endoftext\|>', draft None")
    assert_nothing_written(out)


def test_existing_output_needs_force(models, out):
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = export_cli(models["llama"], models["llama_cut"], out)
    assert_clean_error(proc, "ssd-export", r"already exists.*--force")
    assert (out / "keep.txt").read_text() == "mine"


def test_force_replaces_a_bundle(models, out):
    out.mkdir()
    (out / "old.txt").write_text("old")
    proc = export_cli(models["llama"], models["llama_cut"], out, "--force", "--max-context", "64")
    assert proc.returncode == 0, proc.stderr
    assert not (out / "old.txt").exists()
    assert json.loads((out / "manifest.json").read_text())["max_context"] == 64
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".bundle.")]  # no leftovers


def test_failed_export_leaves_nothing(models, out, monkeypatch):
    import ssd_export.pipeline as pipeline

    def broken(*args, **kwargs):
        raise ParityError("simulated parity failure")

    monkeypatch.setattr(pipeline, "check_parity", broken)
    with pytest.raises(ParityError):
        export_bundle(ExportConfig(target=str(models["llama"]), draft=str(models["llama_cut"]),
                                   output=out, quiet=True))
    assert_nothing_written(out)


def test_max_context_above_model_limit(models, out):
    with pytest.raises(ConfigError, match=r"--max-context 4096 exceeds the models' limit"):
        export_bundle(ExportConfig(target=str(models["llama"]), draft=str(models["llama_cut"]),
                                   output=out, max_context=4096, quiet=True))
    assert_nothing_written(out)


def test_max_context_too_small_for_a_round(models, out):
    """Too small to trace, or to hold a prompt token and a verification of max_draft + 1."""
    proc = export_cli(models["llama"], models["llama_cut"], out, "--max-context", "4")
    assert_clean_error(proc, "ssd-export", r"--max-context 4 is too small: at least 16")
    with pytest.raises(ConfigError, match=r"--max-context 20 is too small: at least 26.*"
                                          r"lower --max-draft"):
        export_bundle(ExportConfig(target=str(models["llama"]), draft=str(models["llama_cut"]),
                                   output=out, max_context=20, max_draft=24, quiet=True))
    assert_nothing_written(out)


def test_max_context_above_mpt_max_seq_len(models, out):
    """MPT's limit is max_seq_len (256 here): Hugging Face's ALiBi table ends there."""
    with pytest.raises(ConfigError, match=r"--max-context 512 exceeds the models' limit.*256"):
        export_bundle(ExportConfig(target=str(models["mpt"]), draft=str(models["mpt"]),
                                   output=out, max_context=512, quiet=True))
    assert_nothing_written(out)


BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers'):
            raise ImportError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from ssd_export.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_export_without_the_extra_names_it(models, out):
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH, "--target", str(models["llama"]),
                           "--draft", str(models["llama"]), "--output", str(out)],
                          capture_output=True, text=True)
    assert_clean_error(proc, "ssd-export", r"pip install 'ssd-toolkit\[export\]'")


# --- the runtime side -------------------------------------------------------------------

@pytest.fixture
def bundle_copy(bundle_factory, tmp_path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(bundle_factory("llama", "llama_cut", max_context=48), dst)
    return dst


def test_prompt_longer_than_max_context(bundle_copy):
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "x = 1\n" * 40, program=True)
    assert_clean_error(proc, "ssd-run", r"prompt has \d+ tokens, more than the bundle's "
                                        r"max_context 48")


def test_modified_file_is_refused(bundle_copy):
    data = next((bundle_copy / "target").glob("*.data"))
    blob = bytearray(data.read_bytes())
    blob[100] ^= 0xFF
    data.write_bytes(bytes(blob))
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "x")
    assert_clean_error(proc, "ssd-run", r"target/model\.onnx\.data was modified: sha256")


def test_newer_schema_is_refused(bundle_copy):
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema_version"] = 99
    path.write_text(json.dumps(manifest))
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "x")
    assert_clean_error(proc, "ssd-run", r"schema_version 99 is newer than this runtime reads "
                                        rf"\(up to {SCHEMA_VERSION}\).*upgrade")


# field, a bad value, what it must be, the schema before the field, what it reads as there
OLDER_FIELDS = [("graph", "fast", r"\['standard', 'ort', 'static'\]", 1, "standard", ()),
                ("quant", "int3", r"\['none', 'int8', 'int4'\]", 2, "none", ("quant_agreement",)),
                ("moe", "sparse", r"\['none', 'dense', 'kernel'\]", 3, "none", ())]


@pytest.mark.parametrize("field,bad,allowed,schema,default,also", OLDER_FIELDS,
                         ids=[f[0] for f in OLDER_FIELDS])
def test_an_unknown_model_field_value_is_refused_and_an_older_schema_reads_the_default(
        bundle_copy, field, bad, allowed, schema, default, also):
    from ssd_runtime.manifest import read_manifest

    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["models"]["draft"][field] = bad
    path.write_text(json.dumps(manifest))
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "x")
    assert_clean_error(proc, "ssd-run", rf"models\.draft\.{field} is '{bad}', expected one of "
                                        rf"{allowed}")
    for role in ("target", "draft"):               # a bundle written before the field
        for key in (field, *also):
            manifest["models"][role].pop(key, None)
    manifest["schema_version"] = schema
    path.write_text(json.dumps(manifest))
    m = read_manifest(bundle_copy, verify=False)
    assert getattr(m.target, field) == getattr(m.draft, field) == default


def test_k_above_max_draft(bundle_copy):
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "x", "--k", "9")
    assert_clean_error(proc, "ssd-run", r"k=9 is outside \[0, 8\].*--max-draft 9")
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "x", "--k", "-1")
    assert_clean_error(proc, "ssd-run", r"k=-1 is outside \[0, 8\].*in that range\.$")


def test_a_context_that_cannot_hold_a_round_is_refused(bundle_copy):
    path = bundle_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["max_context"] = 9                    # max_draft 8: no room for a prompt token
    path.write_text(json.dumps(manifest))
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "x")
    assert_clean_error(proc, "ssd-run", r"max_context 9 leaves no room .* at least 10")


def test_missing_bundle(tmp_path):
    proc = run("ssd_runtime.cli", tmp_path / "nope", "--prompt", "x")
    assert_clean_error(proc, "ssd-run", r"bundle folder .*nope does not exist")


def test_cli_round_trip(bundle_copy):
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "def f(x):", "--max-new-tokens", "12",
               "--k", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert len(res["token_ids"]) == 12 and res["stop_reason"] == "length"
    assert res["stats"]["k"] == 3 and res["stats"]["rounds"] >= 3
    assert res["placement"]["source"] in ("measured", "remembered")     # threads not given
    proc = run("ssd_runtime.cli", bundle_copy, "--prompt", "def f(x):", "--max-new-tokens", "12",
               "--stats", "--threads", "1")
    assert proc.returncode == 0 and "tokens/s=" in proc.stderr and "acceptance=" in proc.stderr
    assert "threads target:draft 1:1 (given)" in proc.stderr


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_cli_chat_applies_the_bundles_template(bundle_copy):
    """ssd-run --chat: the prompt is a user message rendered as apply_chat_template renders it
    (the ids ssd-serve's chat completions build); a bundle without a template is one line."""
    from transformers import PreTrainedTokenizerFast

    from ssd_runtime import Generator

    proc = run("ssd_runtime.cli", bundle_copy, "--chat", "--prompt", "hi", "--threads", "1")
    assert_clean_error(proc, "ssd-run", r"this model has no chat template .*HINT")
    data = json.loads((bundle_copy / "manifest.json").read_text())
    data["tokenizer"]["chat_template"] = CHAT           # manifest.json carries no checksum
    (bundle_copy / "manifest.json").write_text(json.dumps(data))
    proc = run("ssd_runtime.cli", bundle_copy, "--chat", "--prompt", "def f(x):", "--k", "2",
               "--max-new-tokens", "8", "--min-new-tokens", "8", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    tok = PreTrainedTokenizerFast(tokenizer_file=str(bundle_copy / "tokenizer" / "tokenizer.json"),
                                  bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = CHAT
    ids = tok.apply_chat_template([{"role": "user", "content": "def f(x):"}],
                                  add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    expected = Generator.load(bundle_copy, threads=1).generate(ids, max_new_tokens=8, k=0,
                                                               min_new_tokens=8)
    assert json.loads(proc.stdout)["token_ids"] == expected.token_ids
