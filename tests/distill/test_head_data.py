"""ssd-distill --kind head's own data (docs/distill.md §9) on a tiny 8-layer chat target: the
runtime's answers and log-probabilities against the float target's, the prefill's features
against Hugging Face's hidden states, a head that starts as the target's last layer, the
cache reused, resumed after a kill, and refused or stopped cleanly on bad input."""
from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent.parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "export"))
import tiny  # noqa: E402
from test_bad_input import assert_clean_error, run  # noqa: E402

DRAFT_VOCAB = 64
CHAT = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def _chat_model(root: Path, name: str, seed: int) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(root.parent / "tok") if (root.parent / "tok").exists() \
        else tiny.build_tokenizer(root.parent / "tok")
    tok.chat_template = CHAT
    folder = tiny.build_model(root / name, "llama", tok, seed=seed, layers=8)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory) -> Path:
    """A tiny Llama of 8 layers (the head reads layers 2, 4 and 5) with a chat template."""
    return _chat_model(tmp_path_factory.mktemp("chat") / "m", "llama8", seed=8)


@pytest.fixture(scope="module")
def answer_bundle(chat_target, answers_bundle) -> Path:
    return answers_bundle(chat_target)


def head_cli(target, out, *extra):
    return run("ssd_distill.cli", "--kind", "head", "--target", target, "--output", out,
               "--preset", "quick", "--threads", "1", "--quiet", "--draft-vocab", DRAFT_VOCAB,
               "--no-check", *extra)


@pytest.fixture(scope="module")
def trained(chat_target, answer_bundle, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("head") / "head"
    proc = head_cli(chat_target, out, "--steps", 8, "--answers-bundle", answer_bundle)
    assert proc.returncode == 0, proc.stderr
    return out


def _cache_files(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_size for p in sorted(cache.rglob("*"))
            if p.is_file() and "bundle" not in p.parts}


def test_the_card_records_the_data_and_the_cache_is_reused(trained, chat_target, answer_bundle):
    card = json.loads((trained / "distill.json").read_text())
    d = card["data"]
    assert d["labels"] == "runtime" and d["answers"] == 24 and d["new_answers"] == 24
    assert set(d["sources"]) <= {"shipped", "docstrings", "self"} and d["positions"] > 0
    assert set(d["heldout_sources"]) == {"heldout"}          # another source than training
    assert len(card["heldout"]["agreement"]) == 3 == len(card["heldout"]["agreement_before_training"])
    assert card["rates"]["train"] > 0 and card["plan"]["answers"] == 24
    readme = (trained / "README.md").read_text()
    assert "held out (another source" in readme and "step 3:" in readme
    cache = Path(d["cache"])
    assert cache == trained.with_name("head.answers") and (cache / "cache.json").exists()
    before = _cache_files(cache)
    assert not [f for f in before if ".tmp-" in f]
    # a second training on the same cache writes no answer: it reads them (and more epochs)
    again = trained.with_name("again")
    proc = head_cli(chat_target, again, "--steps", 4, "--answers-bundle", answer_bundle,
                    "--cache", cache)
    assert proc.returncode == 0, proc.stderr
    card2 = json.loads((again / "distill.json").read_text())
    assert card2["data"]["new_answers"] == 0 and card2["data"]["positions"] == d["positions"]
    assert _cache_files(cache) == before


def test_the_runtime_answers_and_labels_are_the_float_targets(trained, chat_target):
    """Each cached label row is the float target's distribution (Hugging Face, teacher-forced
    on the cached ids) at that position, and a greedy answer's token is that row's argmax."""
    from transformers import AutoModelForCausalLM

    from ssd_distill.cache import AnswerCache, target_identity

    target = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    cache = AnswerCache(trained.with_name("head.answers"), target_identity(str(chat_target)))
    part = cache.read(cache.parts()[1])                  # the first training part
    start = label = 0
    checked = 0
    for m, pl, al in zip(part.meta, part.prompt_len.tolist(), part.answer_len.tolist()):
        ids = torch.from_numpy(part.ids[start:start + pl + al].astype(np.int64))[None]
        with torch.no_grad():
            logp = torch.log_softmax(target(ids).logits[0].float(), -1)      # (T, V)
        rows = logp[pl - 1:pl - 1 + al]                                     # answer positions
        top_ids = torch.from_numpy(part.top_ids[label:label + al].astype(np.int64))
        top_logp = torch.from_numpy(part.top_logp[label:label + al].astype(np.float32))
        assert torch.allclose(rows.gather(1, top_ids), top_logp, atol=2e-2)
        assert torch.equal(top_ids[:, 0], rows.argmax(-1))
        if m["mode"] == "greedy":
            assert torch.equal(ids[0, pl:pl + al], top_ids[:, 0])
        checked += al
        start += pl + al
        label += al
    assert checked > 50


def test_the_prefill_gives_hugging_faces_hidden_states_and_logits(chat_target):
    from transformers import AutoModelForCausalLM

    from ssd_distill.data import Rows
    from ssd_distill.features import prefill
    from ssd_distill.head_data import add_features

    target = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    ids = torch.randint(3, 384, (2, 20), generator=torch.Generator().manual_seed(1))
    rows = Rows(ids, torch.ones(2, 20, dtype=torch.bool), torch.zeros(2, 20, 4, dtype=torch.int32),
                torch.zeros(2, 20, 4, dtype=torch.float16), torch.zeros(2, 20, dtype=torch.long))
    reference = add_features(target, rows, [2, 4, 5], 2, lambda *a: None).features.float()
    features, none = prefill(target, ids, [2, 4, 5], None)       # stops at layer 5
    assert none is None and torch.allclose(features.half().float(), reference, atol=1e-2)
    at = torch.zeros(2, 20, dtype=torch.bool)
    at[:, 5:12] = True
    features2, (top_ids, top_logp) = prefill(target, ids, [2, 4, 5], at)   # the whole model
    assert torch.allclose(features2, features, atol=1e-5)
    with torch.no_grad():
        logp = torch.log_softmax(target(ids).logits.float(), -1)[at]       # (14, V)
    assert torch.equal(top_ids[:, 0], logp.argmax(-1))
    assert torch.allclose(top_logp, logp.gather(1, top_ids), atol=1e-4)


def test_the_head_starts_as_the_target_without_two_layers(chat_target):
    """Initialised from the target, the head's first step is the target with layers L-3 and
    L-2 left out (its last layer on the stream entering L-3, its final norm, its LM head's
    rows of the draft vocabulary), whatever the next token: exactly, within float error."""
    import copy

    from transformers import AutoModelForCausalLM

    from ssd_distill.features import decoder_layers, prefill
    from ssd_distill.head import head_config
    from ssd_distill.head_init import init_from_target
    from ssd_graphs.eagle3 import Eagle3Head

    target = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    ids = list(range(10, 10 + DRAFT_VOCAB * 2, 2))[:DRAFT_VOCAB]
    head = Eagle3Head(head_config(target.config, len(ids), [2, 4, 5]),
                      embed_weight=target.get_input_embeddings().weight).eval()
    done = init_from_target(head, target, ids)
    assert {"fc", "lm_head", "norm", "midlayer.self_attn.q_proj", "midlayer.mlp.down_proj"} \
        <= set(done)
    skipped = copy.deepcopy(target)
    layers = decoder_layers(skipped)
    skipped.model.layers = torch.nn.ModuleList([layers[i] for i in (0, 1, 2, 3, 4, 7)])
    skipped.config.num_hidden_layers = 6
    x = torch.randint(3, 384, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = skipped(x, use_cache=False).logits[0, :, ids]                                 # (16, Vd)
        features, _ = prefill(target, x, [2, 4, 5], None)
        nxt = torch.randint(3, 384, (1, 16))                                # any next tokens
        got, _, _ = head(nxt, head.fuse(features), torch.arange(16)[None])
    assert torch.allclose(got[0], want, atol=1e-4), (got[0] - want).abs().max()


def _cache_of(folder: Path, answers: list[list[int]], width: int = 4):
    """A cache holding one part: a one-token prompt and `answers` each (labels: the token)."""
    from ssd_distill.cache import AnswerCache, Part

    cache = AnswerCache(folder, {"name": "t", "digest": "0"})
    cache.ensure()
    ids = np.array([t for a in answers for t in [1] + a], np.int32)
    tops = np.array([[t, 1] for a in answers for t in a], np.int32)
    meta = [{"source": "shipped", "mode": "greedy", "key": str(i), "stop": "eos"}
            for i in range(len(answers))]
    cache.write("part-000001", Part(np.ones(len(answers), np.int32),
                                    np.array([len(a) for a in answers], np.int32), ids, tops,
                                    np.zeros((len(tops), 2), np.float16), meta))
    cache.write_bytes(cache.features_path("part-000001"),
                      np.zeros((len(ids), width), np.float16).tobytes())
    return cache


def test_draft_vocabulary_by_coverage_in_speculators_layout(tmp_path):
    """The smallest rung whose tokens, counted on half the answers, cover the other half;
    d2t and t2d as EAGLE-3 and vLLM speculators lay them out."""
    from ssd_distill.corpus import Corpus, draft_vocabulary

    common = [5] * 10 + [7] * 6 + [2] * 3
    answers = [common + [20 + i] for i in range(10)]     # a rare token of its own each
    corpus = Corpus(_cache_of(tmp_path / "c", answers), {"heldout"}, True, 4, 64)
    ids, d2t, t2d, covered = draft_vocabulary(corpus, 64, None, 0.95, (2, 3, 8))
    assert ids == [2, 5, 7] and covered == 0.95                # 19 of each 20 tokens
    assert torch.equal(torch.arange(3) + d2t, torch.tensor(ids))        # target = draft + d2t
    assert t2d.sum() == 3 and bool(t2d[7]) and not bool(t2d[6])
    ids, _, _, covered = draft_vocabulary(corpus, 64, 2, 0.95, (2, 3, 8))   # a size given
    assert ids == [5, 7] and covered == 0.8
    # 8 tokens counted on the even rows cover all of them, but the odd rows' rare tokens are
    # not among them: 96% is out of reach of every rung, so the last (the dearest allowed)
    ids, _, _, covered = draft_vocabulary(corpus, 64, None, 0.96, (2, 3, 8))
    assert len(ids) == 8 and covered == 0.95


def test_budgets_parse_and_plans_fill_them():
    from ssd_distill.plan import (TRAIN_REALISED, Rates, make_plan, parse_budget,
                                  parse_data_budget)
    from ssd_runtime.errors import ConfigError

    assert parse_budget("1h") == 3600 and parse_budget("1h30m") == 5400
    assert parse_budget("600s") == parse_budget("10m") == parse_budget("600") == 600
    for bad in ("", "soon", "30s"):
        with pytest.raises(ConfigError, match="--budget"):
            parse_budget(bad)
    assert parse_data_budget("2GB") == (2 * 10**9, None)
    assert parse_data_budget("512MiB") == (512 * 2**20, None)
    assert parse_data_budget("500k") == (None, 500_000)
    with pytest.raises(ConfigError, match="--data-budget"):
        parse_data_budget("lots")
    rates = Rates(answer=200, feature=400, train=100, tokens_per_position=1.5,
                  positions_per_answer=200)
    plan = make_plan(3600, 100, rates, 0, 0, None, None)
    used = plan.answer_s + plan.feature_s + plan.train_s
    assert 0.9 * (0.95 * 3600 - 100) < used <= 0.95 * 3600 - 100 + 1
    assert plan.epochs == 2 and plan.answers == -(-plan.positions // 200)
    capped = make_plan(3600, 100, rates, 0, 0, None, 50_000)
    assert capped.positions == 50_000 and "data-budget" in capped.note
    assert capped.epochs == 4            # the time its data leaves goes to passes, up to 4
    held = make_plan(3600, 100, rates, 400_000, 0, None, None)    # more than it can train twice
    assert held.new_positions == 0 and held.epochs < 2
    # a target slow to answer trains its fewer answers more often: training a position takes
    # as long as writing it (1/25 + 1.5/400 s against a pass at the rate realised,
    # TRAIN_REALISED of the probe's 100 a second), up to 4 passes
    slow = make_plan(3600, 100, replace(rates, answer=25), 0, 0, None, None)
    assert slow.epochs == pytest.approx(100 * TRAIN_REALISED * (1 / 25 + 1.5 / 400))
    assert slow.train_s == pytest.approx(slow.answer_s + slow.feature_s, rel=1e-6)
    slower = make_plan(3600, 100, replace(rates, answer=10), 0, 0, None, None)
    assert slower.epochs == 4 and slower.positions < slow.positions < plan.positions
    assert make_plan(3600, 100, replace(rates, answer=10), 0, 0, 1.5, None).epochs == 1.5


def test_the_user_turn_opening_of_a_chat_template(chat_target):
    from transformers import AutoTokenizer

    from ssd_distill.prompts import Prompt, encode, user_turn_opening

    tok = AutoTokenizer.from_pretrained(chat_target)
    assert user_turn_opening(tok) == "<s>user\n"
    assert tok.decode(encode(tok, Prompt("x", "hi"))) == "<s>user\nhi</s>\n<s>assistant\n"
    tok.chat_template = None
    assert user_turn_opening(tok) is None


def test_prompt_files_and_their_refusals(chat_target, tmp_path):
    from ssd_distill.prompts import read_prompt_file
    from ssd_runtime.errors import ConfigError

    text = tmp_path / "p.txt"
    text.write_text("How do magnets work?\n\nName a prime.\n")
    assert [p.body for p in read_prompt_file(text)] == ["How do magnets work?", "Name a prime."]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"messages": [{"role": "user", "content": "b"}]}\n')
    assert [p.source for p in read_prompt_file(jsonl)] == ["file:p.jsonl"] * 2
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    out = tmp_path / "h"
    assert_clean_error(head_cli(chat_target, out, "--prompts", empty), "ssd-distill",
                       r"--prompts .*empty.txt holds no prompts")
    assert_clean_error(head_cli(chat_target, out, "--prompts", tmp_path / "none.txt"),
                       "ssd-distill", r"--prompts .*none.txt: cannot read it")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    assert_clean_error(head_cli(chat_target, out, "--prompts", binary), "ssd-distill",
                       r"cannot read it \(UnicodeDecodeError")
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"prompt": "a"}\n{nope\n')
        read_prompt_file(bad)
    assert not out.exists() and not (tmp_path / "h.partial").exists()
    assert not (tmp_path / "h.answers").exists()
    assert_clean_error(head_cli(chat_target, out, "--budget", "soon"), "ssd-distill",
                       r"--budget 'soon' is not a duration")
    assert_clean_error(run("ssd_distill.cli", "--target", chat_target, "--output", out,
                           "--budget", "1h", "--quiet"), "ssd-distill",
                       r"--budget: for --kind head only")


def test_the_cache_exports_its_answering_bundle_once_with_an_int4_draft(chat_target, tmp_path):
    """Without --answers-bundle a run exports the target into its cache, the target its own
    draft in int4 (never run at k = 0: answers.answer_export), the float target let go while
    the export loads its own; the next run reuses that bundle."""
    out, cache = tmp_path / "h", tmp_path / "cache"
    proc = head_cli(chat_target, out, "--steps", 2, "--cache", cache)
    assert proc.returncode == 0, proc.stderr
    manifest = cache / "bundle" / "manifest.json"
    models = json.loads(manifest.read_text())["models"]
    assert (models["target"]["quant"], models["draft"]["quant"]) == ("none", "int4")
    assert json.loads((out / "distill.json").read_text())["data"]["positions"] > 0
    written = manifest.stat().st_mtime_ns
    proc = head_cli(chat_target, tmp_path / "again", "--steps", 2, "--cache", cache)
    assert proc.returncode == 0, proc.stderr
    assert manifest.stat().st_mtime_ns == written


def test_another_targets_cache_is_refused_by_name(trained, tmp_path):
    other = _chat_model(tmp_path / "o", "other8", seed=9)
    cache = trained.with_name("head.answers")
    before = _cache_files(cache)
    out = tmp_path / "h"
    for extra in ((), ("--resume",)):
        proc = head_cli(other, out, "--cache", cache, *extra)
        assert_clean_error(proc, "ssd-distill",
                           r"--cache .* holds the answers of target '.*llama8' \(identity "
                           r"\w+\), not of '.*other8'.*HINT")
    assert _cache_files(cache) == before and not out.exists()
    assert not (tmp_path / "h.partial").exists()


def _limited(limit: int):
    """A child's file-size limit (a disk that fills at `limit` bytes a file): a write past it
    fails with EFBIG (Python ignores SIGXFSZ)."""
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_stops_with_one_error_and_the_cache_stays_usable(
        chat_target, answer_bundle, tmp_path):
    out, cache = tmp_path / "h", tmp_path / "cache"
    args = [sys.executable, "-m", "ssd_distill.cli", "--kind", "head", "--target",
            str(chat_target), "--output", str(out), "--preset", "quick", "--threads", "1",
            "--quiet", "--draft-vocab", str(DRAFT_VOCAB), "--no-check", "--steps", "4",
            "--answers-bundle", str(answer_bundle), "--cache", str(cache)]
    # 24 KiB a file: the held-out part (~20 KB) fits, its features (3 x 64 x 2 bytes a token)
    # do not
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          preexec_fn=_limited(24 * 1024))
    assert_clean_error(proc, "ssd-distill", r"the answer cache .*cache is full: writing "
                       r"part-000001.f16 .* failed \(File too large\)\. Nothing was "
                       r"half-written: the cache keeps its 1 complete part.*--data-budget")
    files = _cache_files(cache)
    assert "answers/part-000001.npz" in files and not [f for f in files if "tmp" in f]
    assert not out.exists() and not (tmp_path / "h.partial").exists()
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)   # room again
    assert proc.returncode == 0, proc.stderr
    card = json.loads((out / "distill.json").read_text())
    assert card["data"]["answers"] == 24


def test_a_data_budget_bounds_the_cache(chat_target, answer_bundle, tmp_path):
    out = tmp_path / "h"
    # about 24 positions an answer: the held-out six and two parts of eight pass 400
    proc = head_cli(chat_target, out, "--steps", 2, "--answers-bundle", answer_bundle,
                    "--data-budget", "400")
    assert proc.returncode == 0, proc.stderr
    d = json.loads((out / "distill.json").read_text())["data"]
    assert d["answers"] in (8, 16) and "data budget of 400 positions is reached" in d["stopped"]
    total = d["positions"] + sum(v["positions"] for v in d["heldout_sources"].values())
    assert 400 <= total < 400 + 8 * 24


def test_a_killed_run_continues_where_it_stopped(chat_target, answer_bundle, tmp_path):
    out = tmp_path / "h"
    args = [sys.executable, "-m", "ssd_distill.cli", "--kind", "head", "--target",
            str(chat_target), "--output", str(out), "--preset", "quick", "--threads", "1",
            "--draft-vocab", str(DRAFT_VOCAB), "--no-check", "--steps", "4",
            "--answers-bundle", str(answer_bundle), "--answers", "200"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:     # parts of 8 are written once a round's answers are counted:
        if line.strip().startswith("answers [") and \
                int(line.split("] ")[1].split("/")[0]) > 16:      # two parts, at least
            proc.send_signal(signal.SIGSTOP)
            break
    proc.kill()
    proc.wait(timeout=60)
    cache = tmp_path / "h.answers"
    held = [f for f in _cache_files(cache) if f.startswith("answers/")]
    assert 3 <= len(held) < 26                     # held-out part + training parts, not all
    done = subprocess.run(args + ["--resume", "--quiet"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    d = json.loads((out / "distill.json").read_text())["data"]
    assert d["answers"] == 200 and d["new_answers"] == 200 - 8 * (len(held) - 1)
    assert not [f for f in _cache_files(cache) if ".tmp-" in f]


def test_mixed_precision_training_steps_match_float32(chat_target):
    """The loss under bfloat16 autocast (what a GPU trains in, and a CPU where it is faster)
    is float32's within bfloat16's rounding, and its gradients point the same way."""
    from transformers import AutoModelForCausalLM

    from ssd_distill.data import Rows
    from ssd_distill.features import prefill
    from ssd_distill.head import head_config
    from ssd_distill.probe import autocast
    from ssd_distill.ttt import loss
    from ssd_graphs.eagle3 import Eagle3Head

    target = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 384, (2, 24), generator=g)
    features, (top_ids, top_logp) = prefill(target, ids, [2, 4, 5],
                                            torch.ones(2, 24, dtype=torch.bool))
    rows = Rows(ids, torch.ones(2, 24, dtype=torch.bool), top_ids.view(2, 24, -1).int(),
                top_logp.view(2, 24, -1).half(), top_ids[:, 0].view(2, 24),
                features.half())
    head = Eagle3Head(head_config(target.config, 384, [2, 4, 5]),
                      embed_weight=target.get_input_embeddings().weight)
    t2d = torch.ones(384, dtype=torch.bool)
    grads = {}
    for precision in ("float32", "bfloat16"):
        head.zero_grad()
        with autocast(torch.device("cpu"), precision):
            value = loss(head, rows, 3, t2d, torch.arange(384))
        value.backward()
        grads[precision] = (value.item(), head.fc.weight.grad.flatten().clone())
    (l32, g32), (l16, g16) = grads["float32"], grads["bfloat16"]
    assert abs(l16 - l32) < 0.02 * l32, (l32, l16)
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.95


def test_a_quantized_targets_answers_are_labelled_by_the_float_prefill(
        chat_target, answers_bundle, tmp_path):
    """An int8 target writes the answers; their labels are then the float target's, made by
    the prefill running the whole model (its log-probabilities would be the int8 model's)."""
    from transformers import AutoModelForCausalLM

    from ssd_distill.cache import AnswerCache, target_identity

    out = tmp_path / "h"
    proc = head_cli(chat_target, out, "--steps", 2, "--answers-bundle",
                    answers_bundle(chat_target, "int8"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "distill.json").read_text())["data"]["labels"] == "prefill"
    cache = AnswerCache(tmp_path / "h.answers", target_identity(str(chat_target)))
    name = cache.parts()[1]
    part = cache.read(name)
    assert part.top_ids is None                        # not the int8 model's
    with np.load(cache.labels_path(name)) as z:
        top_ids, top_logp = z["top_ids"], z["top_logp"]
    target = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    pl, al = int(part.prompt_len[0]), int(part.answer_len[0])
    ids = torch.from_numpy(part.ids[:pl + al].astype(np.int64))[None]
    with torch.no_grad():
        logp = torch.log_softmax(target(ids).logits[0].float(), -1)[pl - 1:pl - 1 + al]
    assert torch.equal(torch.from_numpy(top_ids[:al, 0]).long(), logp.argmax(-1))
    assert torch.allclose(logp.gather(1, torch.from_numpy(top_ids[:al]).long()),
                          torch.from_numpy(top_logp[:al]).float(), atol=2e-2)


def test_the_corpus_lines_up_ids_labels_and_features(tmp_path):
    """Rows read back from a cache part: label j of an answer sits at the position before its
    token j (its top-1 here is that token), features row by row, a long prompt cut from its
    start, and the held-out source split off."""
    from ssd_distill.cache import AnswerCache, Part
    from ssd_distill.corpus import Corpus

    cache = AnswerCache(tmp_path / "c", {"name": "t", "digest": "0"})
    cache.ensure()
    prompts, answers = [[5, 6, 7], [8, 9, 10, 11, 12, 13]], [[20, 21], [30, 31, 32]]
    ids = np.array([t for p, a in zip(prompts, answers) for t in p + a], np.int32)
    tops = np.array([[t, 1] for a in answers for t in a], np.int32)
    part = Part(np.array([3, 6], np.int32), np.array([2, 3], np.int32), ids, tops,
                np.zeros((5, 2), np.float16),
                [{"source": "shipped", "mode": "greedy", "key": "a", "stop": "eos"},
                 {"source": "heldout", "mode": "greedy", "key": "b", "stop": "eos"}])
    cache.write("part-000001", part)
    width = 4
    feats = np.repeat(np.arange(len(ids), dtype=np.float16)[:, None], width, 1)  # row = index
    cache.write_bytes(cache.features_path("part-000001"), feats.tobytes())
    train = Corpus(cache, {"heldout"}, True, width, max_len=64)
    assert len(train) == 1 and train.positions == 2 and train.sources == {"shipped": [1, 2]}
    rows = train.select(torch.tensor([0]))
    assert rows.ids[0].tolist() == [5, 6, 7, 20, 21]
    assert rows.mask[0].tolist() == [False, False, True, True, False]
    assert rows.argmax[0, 2:4].tolist() == [20, 21]              # position 2 gives token 3
    assert rows.features[0, :, 0].tolist() == [0, 1, 2, 3, 4]
    held = Corpus(cache, {"heldout"}, False, width, max_len=5)    # 9 tokens: 4 cut
    rows = held.select(torch.tensor([0]))
    assert rows.ids[0].tolist() == [12, 13, 30, 31, 32]
    assert rows.mask[0].tolist() == [False, True, True, True, False]
    assert rows.argmax[0, 1:4].tolist() == [30, 31, 32]
    assert rows.features[0, :, 0].tolist() == [9, 10, 11, 12, 13]
    assert held.answer_tokens().tolist() == [30, 31, 32]


def test_a_budget_is_planned_from_measured_rates_and_printed(chat_target, answer_bundle,
                                                              tmp_path):
    """--budget: the held-out answers and features measure the machine, a few steps the
    training; the plan is printed before the answers, and --data-budget caps it."""
    out = tmp_path / "h"
    proc = run("ssd_distill.cli", "--kind", "head", "--target", chat_target, "--output", out,
               "--preset", "quick", "--threads", "1", "--draft-vocab", DRAFT_VOCAB,
               "--no-check", "--answers-bundle", answer_bundle, "--budget", "5m",
               "--data-budget", "600")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "measured here: answers" in err and "plan for 5m00s:" in err
    assert err.index("plan for 5m00s") < err.index("the target answers")
    card = json.loads((out / "distill.json").read_text())
    plan, rates = card["plan"], card["rates"]
    assert 2 <= plan["epochs"] <= 4 and "--data-budget" in plan["note"]
    assert rates["answer"] > 0 and rates["feature"] > 0 and rates["train"] > 0
    assert plan["precision"] == rates["precision"] in ("float32", "bfloat16")
    d = card["data"]
    total = d["positions"] + sum(v["positions"] for v in d["heldout_sources"].values())
    assert total <= 600 + 8 * 24
    assert card["total_seconds"] < 300
