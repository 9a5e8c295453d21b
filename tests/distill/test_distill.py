"""ssd-distill on tiny targets: the draft folder, exact decoding with it (greedy and sampled,
a reduced-vocabulary head included), resuming an interrupted run, and the refusals."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ssd_runtime import Generator
from ssd_runtime.errors import ConfigError

sys.path.insert(0, str(Path(__file__).parent.parent / "export"))
sys.path.insert(0, str(Path(__file__).parent.parent / "runtime"))
from test_bad_input import assert_clean_error, run  # noqa: E402

HEAD = 64      # the tiny llama's draft head: 64 of its 384 tokens (and the special ones)


def distill_cli(target, out, *extra):
    return run("ssd_distill.cli", "--target", target, "--output", out, "--preset", "quick",
               "--threads", "1", "--quiet", *extra)


@pytest.fixture(scope="module")
def distilled(models, tmp_path_factory):
    """(draft folder, bundle) for the tiny llama target, the CLI as a user runs it, the
    report's export kept as the bundle."""
    root = tmp_path_factory.mktemp("distilled")
    draft, bundle = root / "draft", root / "bundle"
    proc = distill_cli(models["llama"], draft, "--head-tokens", HEAD, "--bundle", bundle)
    assert proc.returncode == 0, proc.stderr
    return draft, bundle


def test_the_draft_is_a_hugging_face_folder_of_the_targets_kind(distilled, models):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    draft, _ = distilled
    model = AutoModelForCausalLM.from_pretrained(draft)
    target = AutoModelForCausalLM.from_pretrained(models["llama"])
    assert type(model) is type(target) and model.config.num_hidden_layers == 1
    assert AutoTokenizer.from_pretrained(draft).get_vocab() == \
        AutoTokenizer.from_pretrained(models["llama"]).get_vocab()
    # embeddings shared with the target, frozen: equal after training
    assert np.array_equal(model.get_input_embeddings().weight.detach().numpy(),
                          target.get_input_embeddings().weight.detach().numpy())
    ids = json.loads((draft / "output_vocab.json").read_text())["ids"]
    assert HEAD <= len(ids) <= HEAD + 4 and ids == sorted(set(ids))
    card = json.loads((draft / "distill.json").read_text())
    assert 0 <= card["heldout"]["agreement"] <= 1 and card["heldout"]["positions"] > 0
    assert card["worth"]["c"] > 0 and card["worth"]["speedups"][0] == 1.0
    # the worth is measured on the held-out prompts' answers, the last tenth of calib.jsonl
    assert card["worth"]["text"].startswith("calib.jsonl's last"), card["worth"]["text"]
    lines = (draft / "calib.jsonl").read_text().splitlines()
    assert len(lines) >= 10 and all("text" in json.loads(line) for line in lines)
    readme = (draft / "README.md").read_text()
    assert "teacher-forced top-1 agreement" in readme and "predicted speed-up" in readme
    assert not (draft.parent / "draft.partial").exists()


def test_the_graph_computes_the_reduced_head_alone(distilled):
    """The draft's head MatMul has the subset's columns, and its logits elsewhere are MASKED:
    q = 0 outside the subset."""
    import onnx

    draft, bundle = distilled
    ids = json.loads((draft / "output_vocab.json").read_text())["ids"]
    gen = Generator.load(bundle)
    model = onnx.load(str(bundle / gen.manifest.draft.path), load_external_data=False)
    # the draft is int8 (MatMulNBits, whose N and K are attributes) or float (a 2-D weight)
    heads = [{a.name: a.i for a in n.attribute} for n in model.graph.node
             if n.op_type == "MatMulNBits"]
    heads = [(h["K"], h["N"]) for h in heads] + \
        [tuple(t.dims) for t in model.graph.initializer if len(t.dims) == 2]
    assert (64, len(ids)) in heads or (len(ids), 64) in heads, heads
    assert (64, 384) not in heads        # no full-vocabulary head beside it
    from ssd_runtime.backends import open_backend

    draft_session = open_backend(bundle, gen.manifest, "cpu").draft
    logits = np.asarray(draft_session.forward(np.array([5, 9, 13]), 0))     # (3, V)
    outside = np.ones(logits.shape[-1], dtype=bool)
    outside[ids] = False
    assert np.all(logits[:, outside] == -1e9) and np.all(logits[:, ids] > -1e4)


@pytest.mark.parametrize("prompt", ["hello world", "the quick brown", "a"])
def test_greedy_output_is_the_targets(distilled, models, prompt):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, bundle = distilled
    gen = Generator.load(bundle)
    alone = gen.generate(prompt, max_new_tokens=24, k=0).token_ids
    for k in (1, 4, "auto"):
        assert gen.generate(prompt, max_new_tokens=24, k=k).token_ids == alone, k
    tok = AutoTokenizer.from_pretrained(models["llama"])
    hf = AutoModelForCausalLM.from_pretrained(models["llama"]).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    out = hf.generate(ids, max_new_tokens=24, do_sample=False, attention_mask=ids * 0 + 1)
    assert out[0, ids.shape[1]:].tolist()[:len(alone)] == alone


@pytest.mark.slow
def test_sampling_with_a_reduced_head_follows_the_target(small_vocab_bundle, tmp_path):
    """On a 16-token vocabulary a distilled draft whose head covers 6 tokens (and the 3
    special ones): the joint of the first two tokens is the target's exact distribution."""
    from test_sampling import PROMPT, SAMPLES, SETTINGS, chi_square_p, exact_joint, first_two

    _, target_dir = small_vocab_bundle
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                               ["a b c", "d e", "f g h i", "j k l m", "b a", "m l k"]))
    draft, bundle = tmp_path / "draft", tmp_path / "bundle"
    proc = distill_cli(target_dir, draft, "--head-tokens", 6, "--prompts", prompts,
                       "--bundle", bundle)
    assert proc.returncode == 0, proc.stderr
    ids = json.loads((draft / "output_vocab.json").read_text())["ids"]
    assert len(ids) < 16
    gen = Generator.load(bundle)
    setting = SETTINGS[0]
    joint = exact_joint(target_dir, setting)
    samples = [first_two(gen.generate(PROMPT, max_new_tokens=5, k=4, seed=s,
                                      coupling="rejection", **setting).token_ids)
               for s in range(SAMPLES)]
    assert chi_square_p(samples, joint) > 1e-3


def _interrupted(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    """Run `cmd` and Ctrl-C it once its work folder is made and the target starts answering
    (the "[2]" stage line). The run is frozen (SIGSTOP) the moment the line is read, so the
    signal lands there, not after the second of work that is left on a tiny target."""
    # a pytest-xdist worker ignores SIGINT, and a child inherits that: give it a shell's default
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("[2]"):
            proc.send_signal(signal.SIGSTOP)
            break
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGCONT)
    _, rest = proc.communicate(timeout=120)
    return proc, "".join(seen) + rest


@pytest.mark.slow
def test_an_interrupted_run_resumes_and_leaves_no_half_draft(models, tmp_path):
    out = tmp_path / "draft"
    work = tmp_path / "draft.partial"
    cmd = [sys.executable, "-m", "ssd_distill.cli", "--target", str(models["llama"]),
           "--output", str(out), "--preset", "quick", "--threads", "1", "--no-check"]
    proc, err = _interrupted(cmd)
    for _ in range(2):          # read while the run went on (a descheduled test): once more
        if proc.returncode != 0:
            break
        shutil.rmtree(out)
        proc, err = _interrupted(cmd)
    assert proc.returncode == 130 and "rerun with --resume" in err, err
    assert "Traceback" not in err
    assert not out.exists() and work.is_dir()
    again = distill_cli(models["llama"], out, "--no-check")
    assert_clean_error(again, "ssd-distill", r"holds an interrupted run.*--resume")
    resumed = distill_cli(models["llama"], out, "--no-check", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "config.json").exists() and not work.exists()


def test_refusals(models, tmp_path):
    out = tmp_path / "d"
    assert_clean_error(distill_cli(tmp_path / "nope", out), "ssd-distill",
                       r"target model folder .*nope.* does not exist")
    bare = tmp_path / "bare"
    shutil.copytree(models["llama"], bare)
    for f in bare.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            f.unlink()
    assert_clean_error(distill_cli(bare, out), "ssd-distill", r"has no usable tokenizer")
    out.mkdir()
    assert_clean_error(distill_cli(models["llama"], out), "ssd-distill",
                       r"already exists.*--force")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\nnot json\n')
    assert_clean_error(distill_cli(models["llama"], tmp_path / "e", "--prompts", bad),
                       "ssd-distill", r"line 2 is not JSON")
    few = tmp_path / "few.jsonl"
    few.write_text('{"prompt": "one"}\n')
    assert_clean_error(distill_cli(models["llama"], tmp_path / "e", "--prompts", few),
                       "ssd-distill", r"has 1 prompts; at least 4")
    assert not (tmp_path / "e").exists() and not (tmp_path / "e.partial").exists()


def test_too_little_text_and_too_little_memory_are_refused(models, tmp_path):
    from ssd_distill.config import DistillConfig
    from ssd_distill.pipeline import distill

    short = DistillConfig(target=models["llama"], output=tmp_path / "a", preset="quick",
                          threads=1, quiet=True, check=False,
                          overrides={"prompts": 4, "new_tokens": 2})
    with pytest.raises(ConfigError, match=r"too little text to train on: \d+ labelled "
                                          r"positions, .* at least 200.*--data"):
        distill(short)
    huge = DistillConfig(target=models["llama"], output=tmp_path / "b", preset="quick",
                         threads=1, quiet=True, check=False, overrides={"prompts": 10 ** 9})
    with pytest.raises(ConfigError, match=r"needs about [\d.]+ GiB .* [\d.]+ GiB are "
                                          r"available"):
        distill(huge)
    assert not (tmp_path / "b").exists()


def test_a_broken_output_vocabulary_is_refused_at_export(distilled, tmp_path):
    from test_bad_input import export_cli

    draft, _ = distilled
    broken = tmp_path / "draft"
    shutil.copytree(draft, broken)
    (broken / "output_vocab.json").write_text(json.dumps({"ids": [1, 1, 99999]}))
    target = json.loads((draft / "distill.json").read_text())["target"]
    assert_clean_error(export_cli(target, broken, tmp_path / "b"), "ssd-export",
                       r"output_vocab.json .* not a list of distinct token ids")
    assert os.listdir(tmp_path) == ["draft"]
