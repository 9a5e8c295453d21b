"""ssd-distill --kind head on a tiny 8-layer target: the SafeAILab folder load_head reads back,
the unrolled training against the chain the runtime drafts, the loss going down, an
interrupted run resumed to the same head, and the refusals."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "export"))
import tiny  # noqa: E402
from test_bad_input import assert_clean_error, run  # noqa: E402

DRAFT_VOCAB = 64     # of the tiny tokenizer's 384


@pytest.fixture(scope="module")
def deep_target(models, tmp_path_factory) -> Path:
    """A tiny Llama of 8 layers (the head reads layers 2, 4 and 5), the session's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["llama"])
    return tiny.build_model(tmp_path_factory.mktemp("deep") / "llama8", "llama", tok, seed=8,
                            layers=8)


@pytest.fixture(scope="module")
def bundle(deep_target, answers_bundle) -> Path:
    """The bundle that writes the deep target's answers (conftest.py)."""
    return answers_bundle(deep_target)


def head_cli(target, out, *extra):
    return run("ssd_distill.cli", "--kind", "head", "--target", target, "--output", out,
               "--preset", "quick", "--threads", "1", "--quiet", "--draft-vocab", DRAFT_VOCAB,
               "--no-check", *extra)


@pytest.fixture(scope="module")
def trained(deep_target, bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("head") / "head"
    proc = head_cli(deep_target, out, "--steps", 12, "--answers-bundle", bundle)
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_head_is_a_safeailab_folder_that_load_head_reads_back(trained, deep_target):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ssd_graphs.eagle3 import SAFEAILAB, load_head

    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == DRAFT_VOCAB
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    target = AutoModelForCausalLM.from_pretrained(deep_target)
    embed = target.get_input_embeddings().weight
    head_config, head, layout = load_head(trained, 8, embed)
    assert layout == SAFEAILAB and head_config.draft_vocab_size == DRAFT_VOCAB
    saved = load_file(str(trained / "model.safetensors"))
    assert "embed_tokens.weight" not in saved          # the target's, as SafeAILab saves it
    state = head.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(state[name], tensor), name
    # d2t maps the draft ids onto the t2d mask, sorted by target id
    ids = torch.arange(DRAFT_VOCAB) + state["d2t"]
    assert torch.equal(ids, state["t2d"].nonzero().flatten())
    card = json.loads((trained / "distill.json").read_text())
    rates = card["heldout"]["agreement"]
    assert len(rates) == card["settings"]["ttt_steps"] == 3 and all(0 <= r <= 1 for r in rates)
    assert card["train"]["steps"] == 12 and card["heldout"]["positions"] > 0
    readme = (trained / "README.md").read_text()
    assert "teacher-forced top-1 agreement" in readme and "step 2:" in readme
    assert not trained.with_name("head.partial").exists()


def test_the_unrolled_steps_are_the_chain_the_runtime_drafts(deep_target):
    """Step j of the training-time test at position i equals drafting a chain from i with the
    head's own KV cache: step 0 over the features of positions <= i, then one token at a time,
    each fed the previous hidden_out."""
    from transformers import AutoModelForCausalLM

    from ssd_distill.data import Rows
    from ssd_distill.head import head_config
    from ssd_distill.head_data import add_features
    from ssd_distill.ttt import unroll
    from ssd_graphs.eagle3 import Eagle3Head

    target = AutoModelForCausalLM.from_pretrained(deep_target).eval()
    torch.manual_seed(0)
    T, steps = 12, 3
    ids = torch.randint(3, 384, (2, T))
    rows = Rows(ids, torch.ones(2, T, dtype=torch.bool), torch.zeros(2, T, 4, dtype=torch.int32),
                torch.zeros(2, T, 4, dtype=torch.float16), torch.zeros(2, T, dtype=torch.long))
    rows = add_features(target, rows, [2, 4, 5], 2, lambda *a: None)
    head = Eagle3Head(head_config(target.config, 384, [2, 4, 5]),
                      embed_weight=target.get_input_embeddings().weight).eval()
    with torch.no_grad():
        unrolled = [logits for logits, _ in unroll(head, rows, steps)]
        aux = rows.features.float()
        for i in (0, 4, T - 1 - steps):
            hidden = head.fuse(aux[:, :i + 1])
            logits, out, kv = head(ids[:, 1:i + 2], hidden, torch.arange(i + 1).expand(2, -1))
            chain = [logits[:, i]]
            h = out[:, i:i + 1]
            for j in range(1, steps):
                logits, h, kv = head(ids[:, i + 1 + j:i + 2 + j], h,
                                     torch.full((2, 1), i + j), kv)
                chain.append(logits[:, 0])
            for j in range(steps):
                per_row = T - 1 - j                 # positions scored at step j, row-major
                got = unrolled[j].view(2, per_row, -1)[:, i]
                assert torch.allclose(got, chain[j], atol=1e-4), (i, j)


def test_the_loss_goes_down_on_a_fixed_corpus(deep_target, bundle, tmp_path):
    """Forty steps on the same rows: the training loss ends well below where it started, and
    the held-out agreement of the first step rises above an untrained head's."""
    from ssd_distill.config import DistillConfig
    from ssd_distill.head import distill_head

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in
                               ["def read(path):", "import os", "class Point:", "for i in x:",
                                "return self", "while True:"]))
    runs = {}
    for steps in (1, 40):
        config = DistillConfig(target=deep_target, output=tmp_path / f"h{steps}", kind="head",
                               preset="quick", prompts=prompts, threads=1, quiet=True,
                               head_tokens=DRAFT_VOCAB, steps=steps, check=False,
                               answers_bundle=bundle, cache=tmp_path / "cache")
        runs[steps] = distill_head(config)
    first, last = runs[1]["train"]["loss"], runs[40]["train"]["loss"]
    assert last < 0.8 * first, (first, last)
    assert _train_agreement(deep_target, tmp_path / "h40", tmp_path / "cache") > \
        _train_agreement(deep_target, tmp_path / "h1", tmp_path / "cache")


def _train_agreement(target_folder: Path, head_folder: Path, cache_folder: Path) -> float:
    """The first drafting step's teacher-forced agreement on the training answers (the
    held-out ones, of another source, say little of a random tiny target)."""
    from transformers import AutoModelForCausalLM

    from ssd_distill.cache import AnswerCache, target_identity
    from ssd_distill.corpus import Corpus
    from ssd_distill.ttt import agreement
    from ssd_graphs.eagle3 import load_head

    target = AutoModelForCausalLM.from_pretrained(target_folder)
    _, head, _ = load_head(head_folder, 8, target.get_input_embeddings().weight)
    cache = AnswerCache(cache_folder, target_identity(str(target_folder)))
    corpus = Corpus(cache, {"heldout"}, True, 3 * 64, 512)
    agree, total = agreement(head, corpus, 1, 8, "cpu")[0]
    return agree / total


def _interrupt_in_training(cmd: list[str]) -> subprocess.Popen:
    """Run `cmd` and Ctrl-C it once training has started (the train bar's first line)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stderr:
        if line.strip().startswith("train ["):
            proc.send_signal(signal.SIGSTOP)
            break
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGCONT)
    proc.communicate(timeout=120)
    return proc


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_head(deep_target, bundle, tmp_path):
    from safetensors.torch import load_file

    out, straight = tmp_path / "head", tmp_path / "straight"
    args = ["--kind", "head", "--target", str(deep_target), "--preset", "quick",
            "--threads", "1", "--draft-vocab", str(DRAFT_VOCAB), "--steps", "400",
            "--no-check", "--answers-bundle", str(bundle), "--cache", str(tmp_path / "cache")]
    proc = _interrupt_in_training([sys.executable, "-m", "ssd_distill.cli", "--output",
                                   str(out), *args])
    assert proc.returncode == 130, proc.returncode
    work = tmp_path / "head.partial"
    assert not out.exists() and (work / "checkpoint.pt").exists()
    step = torch.load(work / "checkpoint.pt", weights_only=False)["step"]
    assert 0 < step < 400
    assert run("ssd_distill.cli", "--output", out, "--resume", "--quiet", *args).returncode == 0
    assert run("ssd_distill.cli", "--output", straight, "--quiet", *args).returncode == 0
    resumed = load_file(str(out / "model.safetensors"))
    whole = load_file(str(straight / "model.safetensors"))
    assert resumed.keys() == whole.keys()
    for name in whole:
        assert torch.equal(resumed[name], whole[name]), name


def test_refusals(models, deep_target, trained, tmp_path):
    out = tmp_path / "h"
    assert_clean_error(head_cli(models["llama"], out), "ssd-distill",
                       r"has 3 layers: an EAGLE-3 head reads .* at least 7")
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert_clean_error(head_cli(deep_target, other, "--force"), "ssd-distill",
                       r"holds something other than an EAGLE-3 head")
    assert (other / "notes.txt").exists()
    assert_clean_error(head_cli(deep_target, trained), "ssd-distill",
                       r"already exists.*--force")
    assert_clean_error(head_cli(deep_target, out, "--resume"), "ssd-distill",
                       r"no interrupted run at .*h.partial.*drop --resume")
    assert_clean_error(head_cli(deep_target, out, "--ttt-steps", 0), "ssd-distill",
                       r"--ttt-steps 0 must be positive")
    assert_clean_error(head_cli(deep_target, out, "--loss", "kl"), "ssd-distill",
                       r"--layers, --loss and --init shape a draft.*drop them")
    assert not out.exists() and not (tmp_path / "h.partial").exists()
