"""ssd-serve end to end: the real server on 127.0.0.1, queried with the official openai client.

One server subprocess (a tiny llama pair with a chat template) serves most tests; outputs
are checked against `Generator` in this process with the same settings. The queue and
disconnect tests run the same app in uvicorn in a thread, over a generator they pace.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import pytest

pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra: pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the serve tests use the openai client (test extra)")

from serve_util import (GatedRounds, ServerProcess, ThreadedServer, metric,  # noqa: E402
                        with_chat_template)

from ssd_runtime import Generator  # noqa: E402
from ssd_runtime.serve.app import create_app  # noqa: E402
from ssd_runtime.serve.config import ServeConfig  # noqa: E402

MODEL = "tiny"
MAX_QUEUE = 8
MAX_TOKENS_LIMIT = 200
PROMPT = "def read_config(path):"
LONG_PROMPT = "def read(path):"        # greedy runs to any max_tokens without an EOS


@pytest.fixture(scope="module")
def bundle(bundle_factory, tmp_path_factory):
    return with_chat_template(bundle_factory("llama", "llama_cut"),
                              tmp_path_factory.mktemp("serve") / "chat-bundle")


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    srv = ServerProcess(bundle, tmp_path_factory.mktemp("serve-log") / "server.log",
                        "--model-name", MODEL, "--max-queue", str(MAX_QUEUE), "--threads", "1",
                        "--k", "4", "--draft-source", "fused",   # each request drafts alone
                        "--max-tokens-limit", str(MAX_TOKENS_LIMIT))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def gen(bundle):
    return Generator.load(bundle)


def chat_ids(bundle, messages) -> list[int]:
    """The prompt Hugging Face `apply_chat_template` builds for these messages."""
    from transformers import PreTrainedTokenizerFast

    manifest = json.loads((bundle / "manifest.json").read_text())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(bundle / "tokenizer" / "tokenizer.json"),
                                  bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = manifest["tokenizer"]["chat_template"]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = server.health()
    assert health["status"] == "ok" and health["k"] == 4 and health["max_context"] == 256
    assert health["placement"]["threads"] == "1:1" and health["placement"]["source"] == "given"
    text = server.metrics()
    for name in ("ssd_requests_total", "ssd_generated_tokens_total", "ssd_tokens_per_second",
                 "ssd_acceptance_rate", "ssd_queue_depth", "ssd_request_latency_seconds_bucket"):
        assert f"# TYPE {name.removesuffix('_bucket')}" in text


PENALTIES = dict(presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3,
                 logit_bias={5: 2.0, 9: -100.0}, min_new_tokens=3)


@pytest.mark.parametrize("temperature,seed,penalties", [(0.0, None, {}), (0.8, 7, {}),
                                                        (0.0, None, PENALTIES),
                                                        (0.8, 7, PENALTIES)])
def test_completion_equals_generator(client, gen, temperature, seed, penalties):
    extra = {"repetition_penalty": penalties["repetition_penalty"],
             "min_tokens": penalties["min_new_tokens"], "ignore_eos": True} if penalties else {}
    res = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=40, temperature=temperature, seed=seed,
        presence_penalty=penalties.get("presence_penalty"),
        frequency_penalty=penalties.get("frequency_penalty"),
        logit_bias={str(t): b for t, b in penalties.get("logit_bias", {}).items()} or None,
        extra_body=extra)
    ref = gen.generate(PROMPT, max_new_tokens=40, k=4, temperature=temperature, seed=seed,
                       **penalties, ignore_eos=bool(penalties))
    choice = res.choices[0]
    assert choice.text == ref.text
    assert choice.finish_reason == {"eos": "stop", "length": "length"}[ref.stop_reason]
    assert res.usage.prompt_tokens == len(gen.encode(PROMPT))
    assert res.usage.completion_tokens == len(ref.token_ids)
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens
    spec = res.model_extra["speculative"]
    assert spec["k"] == 4 and spec["rounds"] == ref.stats.rounds
    assert spec["acceptance_rate"] == pytest.approx(ref.stats.acceptance_rate)
    assert spec["mean_accepted_per_round"] == pytest.approx(ref.stats.mean_accepted_per_round)
    assert spec["tokens_per_s"] > 0
    # acceptance by depth (a chain's round: depth j, rank 0), nodes a round = mean k
    want = ref.stats.as_dict()
    assert spec["nodes_per_round"] == pytest.approx(ref.stats.mean_k) and spec["tree_rounds"] == 0
    assert spec["acceptance_by_depth"] == pytest.approx(want["acceptance_by_depth"])
    assert spec["acceptance_by_rank"] == pytest.approx(want["acceptance_by_rank"])
    verdicts = ref.stats.verdicts
    assert sum(verdicts.depth_accepted) == ref.stats.accepted + ref.stats.forced_accepted
    assert all(t <= ref.stats.rounds for t in verdicts.depth_tried)


def test_chat_completion_uses_the_template(bundle, client, gen):
    messages = [{"role": "system", "content": "You write Python."},
                {"role": "user", "content": "Read a config file."}]
    res = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=32,
                                         temperature=0.7, seed=3)
    ref = gen.generate(chat_ids(bundle, messages), max_new_tokens=32, k=4, temperature=0.7,
                       seed=3)
    assert res.choices[0].message.role == "assistant"
    assert res.choices[0].message.content == ref.text
    assert res.usage.prompt_tokens == len(chat_ids(bundle, messages))
    assert res.model_extra["speculative"]["rounds"] == ref.stats.rounds


def test_chat_template_errors_are_400(client):
    with pytest.raises(openai.BadRequestError, match="unknown role"):
        client.chat.completions.create(model=MODEL, max_tokens=4,
                                       messages=[{"role": "tool-ish", "content": "x"}])


def test_completion_stream_equals_non_stream(server, client):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=96, temperature=0.9, seed=11)
    whole = client.completions.create(**args)
    pieces, finish, usage = [], None, None
    for chunk in client.completions.create(**args, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert "".join(pieces) == whole.choices[0].text
    assert sum(1 for p in pieces if p) >= 3            # many pieces, not one blob
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_chat_stream_equals_non_stream(client):
    args = dict(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=48,
                temperature=0.8, seed=5)
    whole = client.chat.completions.create(**args)
    chunks = list(client.chat.completions.create(**args, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].model_extra["speculative"]["rounds"] == \
        whole.model_extra["speculative"]["rounds"]


def test_stop_strings(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64,
                                     temperature=0).choices[0].text
    # a short ASCII-letter stop string that first occurs at its own position
    at = next(i for i in range(4, len(full) - 3) if full[i:i + 2].isascii()
              and full[i:i + 2].isalpha() and full.find(full[i:i + 2]) == i)
    stop = full[at:at + 2]
    for form in (stop, ["never-there", stop]):
        res = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=64,
                                        temperature=0, stop=form)
        assert res.choices[0].text == full[:at]
        assert res.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=64, temperature=0, stop=stop, stream=True)]
    assert "".join(pieces) == full[:at]


BAD = [  # (path, body, status, message fragment, param)
    ("/v1/completions", b'{"model": "tiny", "prompt": ', 400, "not valid JSON", None),
    ("/v1/completions", b'["tiny"]', 400, "must be a JSON object", None),
    ("/v1/completions", {"model": "tiny"}, 400, "'prompt' is a required field", "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": 5}, 400, "'prompt' must be", "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": "ten"}, 400,
     "'max_tokens' must be a positive integer", "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "temperature": "hot"}, 400,
     "'temperature' must be", "temperature"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "does not exist", "model"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": MAX_TOKENS_LIMIT + 1}, 400,
     f"outside [1, {MAX_TOKENS_LIMIT}]", "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "outside [1",
     "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": [5] * 300}, 400,
     "more than this model's context of 256", "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "def f(): pass\n" * 200}, 400,
     "more than this model's context", "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": [10**6]}, 400, "outside the vocabulary",
     None),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "temperature": -0.5}, 400,
     "temperature=-0.5 must be in [0, 2]", "temperature"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "top_p": 0}, 400, "must be in (0, 1]",
     "top_p"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "top_p": 1.5}, 400, "must be in (0, 1]",
     "top_p"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "top_k": -1}, 400, "top_k=-1", "top_k"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "seed": -3}, 400, "seed=-3", "seed"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "presence_penalty": 2.5}, 400,
     "presence_penalty=2.5 must be in [-2, 2]", "presence_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "frequency_penalty": "a"}, 400,
     "'frequency_penalty' must be a number in [-2, 2]", "frequency_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "repetition_penalty": 0}, 400,
     "repetition_penalty=0.0 must be > 0", "repetition_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"x1": 1}}, 400,
     "logit_bias: key 'x1' must be a token id", "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"\u00b2": 1}}, 400,
     "logit_bias: key '\u00b2' must be a token id", "logit_bias"),       # isdigit() says yes
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"\u0661": 1}}, 400,
     "logit_bias: key '\u0661' must be a token id", "logit_bias"),       # an Arabic-Indic 1
    ("/v1/completions", {"model": "tiny", "prompt": "a\ud800b"}, 400,
     "not valid Unicode: surrogates not allowed at character 1", "prompt"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user",
                                                             "content": "a\ud800b"}]}, 400,
     "not valid Unicode", "messages"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"7": -101}}, 400,
     "logit_bias[7]=-101.0 must be in [-100, 100]", "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "logit_bias": {"99999": 1}}, 400,
     "token id 99999 is outside the vocabulary", None),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "min_tokens": -2}, 400,
     "min_tokens=-2 must be >= 0", "min_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "stop": 7}, 400, "'stop' must be",
     "stop"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "stop": list("abcde")}, 400,
     "at most 4", "stop"),
    ("/v1/completions", {"model": "tiny", "prompt": ["a", "b"]}, 400, "one per request",
     "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "n": 2}, 400, "not supported", "n"),
    ("/v1/completions", {"model": "tiny", "prompt": "x", "stream": "yes"}, 400,
     "'stream' must be true or false", "stream"),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "'messages' must be",
     "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": "hi"}, 400, "'messages' must be",
     "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"content": "hi"}]}, 400,
     "'messages.0.role' is a required field", "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function"}]}, 400, "not supported", "tools"),
]


@pytest.mark.parametrize("path,body,status,fragment,param", BAD,
                         ids=[f"{i}-{b[2]}-{b[4]}" for i, b in enumerate(BAD)])
def test_bad_requests_answer_4xx(server, path, body, status, fragment, param):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    res = httpx.post(server.url + path, content=raw, timeout=30,
                     headers={"content-type": "application/json"})
    assert res.status_code == status, res.text
    error = res.json()["error"]
    assert fragment in error["message"]
    assert error["param"] == param
    assert set(error) == {"message", "type", "param", "code"}


def test_bad_requests_through_the_openai_client(client, server):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="x", temperature=-1)
    res = httpx.get(f"{server.url}/v1/completions", timeout=5)
    assert res.status_code == 405 and "error" in res.json()
    assert metric(server.metrics(), "ssd_requests_total", status="500") == 0
    assert server.health()["status"] == "ok"


def test_no_chat_template_is_a_clear_400(bundle_factory):
    from fastapi.testclient import TestClient

    app = create_app(ServeConfig(bundle=bundle_factory("llama", "llama_cut"), model_name=MODEL))
    with TestClient(app) as http:
        res = http.post("/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert res.status_code == 400
        assert res.json()["error"]["code"] == "no_chat_template"
        assert "no chat template" in res.json()["error"]["message"]
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                  "max_tokens": 2}).status_code == 200


GENERATION_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}"
    "{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def test_chat_templates_hugging_face_renders(bundle_factory, tmp_path):
    """A {% generation %} block (training masks, as SmolLM3's template has) renders as its body,
    as apply_chat_template renders it; a template that does not compile leaves completions
    serving and makes chat answer why; of named templates the export carries 'default'."""
    from fastapi.testclient import TestClient

    from ssd_export.pair import chat_template
    from ssd_runtime.serve.chat import ChatTemplate

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def f():"},
                {"role": "user", "content": "more"}]
    base = bundle_factory("llama", "llama_cut")
    marked = with_chat_template(base, tmp_path / "generation", GENERATION_TEMPLATE)
    assert ChatTemplate(Generator.load(marked)).prompt_ids(messages) == \
        chat_ids(marked, messages)
    broken = with_chat_template(base, tmp_path / "broken", "{% for m in messages %}")
    with TestClient(create_app(ServeConfig(bundle=broken, model_name=MODEL))) as http:
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                  "max_tokens": 2}).status_code == 200
        res = http.post("/v1/chat/completions", json={"model": MODEL, "messages": messages})
        assert res.status_code == 400 and res.json()["error"]["code"] == "chat_template_error"
        assert "does not compile" in res.json()["error"]["message"]

    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(base / "tokenizer" / "tokenizer.json"))
    tok.chat_template = {"default": GENERATION_TEMPLATE, "tool_use": "T"}
    template, note = chat_template(tok)
    assert template == GENERATION_TEMPLATE and "carries 'default'" in note
    tok.chat_template = {"tool_use": "T"}
    assert chat_template(tok)[0] is None


def test_templates_read_the_tokenizers_eos_token(models, tmp_path):
    """apply_chat_template hands the template the tokenizer's eos_token, which may differ from
    the generation_config's first EOS id (Llama 3 Instruct); an older bundle reads as before."""
    import shutil

    from transformers import GenerationConfig

    from ssd_export import ExportConfig, export_bundle
    from ssd_runtime.manifest import read_manifest
    from ssd_runtime.serve.chat import ChatTemplate

    target = tmp_path / "target"
    shutil.copytree(models["llama"], target)
    config = GenerationConfig.from_pretrained(target)
    config.eos_token_id = [2]                       # <pad> ends generation; "</s>" is eos_token
    config.save_pretrained(target)
    export_bundle(ExportConfig(target=str(target), draft=str(models["llama_cut"]),
                               output=tmp_path / "b", quiet=True))
    bundle = with_chat_template(tmp_path / "b", tmp_path / "chat")
    manifest = read_manifest(bundle)
    assert manifest.tokenizer.eos_token_ids == [2]
    assert manifest.tokenizer.special_tokens == {"bos_token": "<s>", "eos_token": "</s>",
                                                 "pad_token": "<pad>"}
    messages = [{"role": "user", "content": "hi"}]
    assert ChatTemplate(Generator.load(bundle)).prompt_ids(messages) == chat_ids(bundle, messages)
    data = json.loads((bundle / "manifest.json").read_text())
    del data["tokenizer"]["special_tokens"]
    data["schema_version"] = 4
    (bundle / "manifest.json").write_text(json.dumps(data))
    assert read_manifest(bundle).tokenizer.special_tokens == {}


def test_split_mode_server_answers_as_the_sequential_generator(bundle, gen):
    from fastapi.testclient import TestClient

    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, mode="split"))
    assert app.state.server.generator.mode == "split"
    with TestClient(app) as http:
        res = http.post("/v1/completions", json={"model": MODEL, "prompt": "def f(x):",
                                                 "max_tokens": 24, "temperature": 0})
    assert res.status_code == 200
    expected = gen.generate("def f(x):", max_new_tokens=24, temperature=0, mode="sequential")
    assert res.json()["choices"][0]["text"] == expected.text


def wait_idle(server, timeout_s: float) -> float:
    """Seconds until the server has no running and no waiting request."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        h = server.health()
        if not h["busy"] and h["queue_depth"] == 0:
            return time.perf_counter() - start
        time.sleep(0.005)
    raise AssertionError(f"server still busy after {timeout_s} s: {server.health()}")


@pytest.fixture
def gated(bundle):
    """The real app in uvicorn (a thread), one slot, its rounds each waiting for a permit:
    the test decides when a generation advances, so queue states are exact, not raced."""
    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, max_queue=2),
                     generator=Generator.load(bundle))
    with ThreadedServer(app) as srv:
        srv.gen = GatedRounds(app.state.server)
        yield srv
        srv.gen.permits.release(10_000)              # never leave the worker blocked


def test_a_stream_sends_each_piece_before_the_next_is_generated(gated):
    """Without timing: the engine is held after its first round, whose piece must arrive."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": True}
    gated.gen.permits.release(1)
    with httpx.Client(base_url=gated.url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as res:
            lines = (line for line in res.iter_lines() if line.startswith("data: "))
            first = json.loads(next(lines).removeprefix("data: "))
            assert first["choices"][0]["text"] and gated.gen.taken == 1   # still held
            gated.gen.permits.release(10_000)
            rest = [line for line in lines]
    assert rest[-1] == "data: [DONE]" and len(rest) >= 2


def test_disconnect_stops_generation_at_the_next_round(gated):
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 100, "temperature": 0,
            "stream": True}
    before = metric(gated.metrics(), "ssd_requests_total", status="499")
    gated.gen.permits.release(1)
    with httpx.Client(base_url=gated.url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as res:
            assert res.status_code == 200
            assert next(res.iter_lines()).startswith("data: ")   # one piece, then hang up
    # The engine runs ahead of its clients (their pieces queue up, as in any batch): a leaver
    # is cancelled at the round after the server notices the closed stream. Rounds are let
    # through one at a time until then; the sequence must be cancelled, not run to its end.
    deadline = time.monotonic() + 20
    while not gated.gen.closed.is_set() and time.monotonic() < deadline:
        gated.gen.permits.release(1)
        time.sleep(0.05)
    assert gated.gen.closed.is_set(), "the generation was not stopped"
    gated.gen.permits.release(10_000)
    wait_idle(gated, 10)                             # and its slot is free
    assert metric(gated.metrics(), "ssd_requests_total", status="499") == before + 1


def test_full_queue_answers_429_and_waiting_clients_can_leave(gated):
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0,
            "stream": True}
    with httpx.Client(base_url=gated.url, timeout=30) as http:
        # one running (blocked on its first piece) and max_queue=2 waiting
        streams = [http.send(http.build_request("POST", "/v1/completions", json=body),
                             stream=True) for _ in range(3)]
        # the engine's worker moves the first from its inbox into a slot: between the two a
        # health check may see it in neither (a beat on a loaded machine)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                gated.health()["queue_depth"] == 2 and gated.health()["busy"]):
            time.sleep(0.01)
        health = gated.health()
        assert health["queue_depth"] == 2 and health["busy"], health
        res = http.post("/v1/completions", json={**body, "stream": False})
        assert res.status_code == 429, res.text
        assert int(res.headers["retry-after"]) >= 1
        assert res.json()["error"]["type"] == "rate_limit_error"
        assert "--max-queue 2" in res.json()["error"]["message"]
        streams[1].close()                           # a waiting client leaves
        deadline = time.monotonic() + 10
        while gated.health()["queue_depth"] != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gated.health()["queue_depth"] == 1
        gated.gen.permits.release(10_000)
        texts = ["".join(_sse_texts(s.iter_lines())) for s in (streams[0], streams[2])]
        for s in streams:
            s.close()
    ref = Generator.load(gated.gen.manifest_root).generate(LONG_PROMPT, max_new_tokens=4, k=4)
    assert texts == [ref.text, ref.text]
    wait_idle(gated, 10)


def _sse_texts(lines) -> list[str]:
    out = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:])["choices"][0]["text"])
    return out


def test_load_bounded(server):
    """16 clients, 208 requests (mixed stream / chat), loopback only; then RSS is stable."""
    clients, per_client = 16, 13

    def run(n: int, results: list) -> None:
        def worker(w: int) -> None:
            api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0,
                                timeout=60)
            for i in range(n):
                kind = (w + i) % 3
                try:
                    if kind == 0:
                        api.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8,
                                               temperature=0.7, seed=i)
                    elif kind == 1:
                        list(api.completions.create(model=MODEL, prompt=f"x{i}", max_tokens=8,
                                                    stream=True))
                    else:
                        api.chat.completions.create(model=MODEL, max_tokens=8, messages=[
                            {"role": "user", "content": f"hi {i}"}])
                    results.append(200)
                except openai.RateLimitError:
                    results.append(429)
                    time.sleep(0.1)                   # back off a little, as a client would
                except openai.APIStatusError as exc:
                    results.append(exc.status_code)
                except Exception as exc:              # noqa: BLE001 - reported below
                    results.append(repr(exc))
            api.close()

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "load test clients hung"

    warm: list = []
    run(3, warm)
    wait_idle(server, 10)
    rss_warm = server.rss_kib()
    results: list = []
    start = time.perf_counter()
    run(per_client, results)
    elapsed = time.perf_counter() - start
    wait_idle(server, 10)
    rss_after = server.rss_kib()
    counts = dict(Counter(map(str, results)))
    print(f"\nload: {len(results)} requests in {elapsed:.1f} s, {counts}, "
          f"RSS warm {rss_warm / 1024:.1f} MiB -> after {rss_after / 1024:.1f} MiB")
    assert len(results) == clients * per_client >= 200
    assert set(results) <= {200, 429}, counts
    assert results.count(200) >= len(results) // 4      # the 429s are the overflow only
    assert rss_after <= rss_warm * 1.10
    text = server.metrics()
    assert metric(text, "ssd_requests_total", status="500") == 0
    assert metric(text, "ssd_queue_depth") == 0


def test_runtime_import_stays_light():
    code = ("import sys, ssd_runtime, ssd_runtime.serve, ssd_runtime.serve.config, "
            "ssd_runtime.serve.cli; print([m for m in ('fastapi', 'uvicorn', 'starlette', 'ray', "
            "'jinja2', 'pydantic') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("args,message", [
    (["/nonexistent/bundle"], "does not exist"),
    (["BUNDLE", "--k", "99"], "--k 99 is outside [0, 8]"),
    (["BUNDLE", "--max-queue", "-1"], "--max-queue -1 must be 0 or more"),
])
def test_cli_errors_are_messages(bundle, capsys, args, message):
    from ssd_runtime.serve.cli import main

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        assert main([str(bundle) if a == "BUNDLE" else a for a in args]) == 2
    finally:                           # main() configures logging on the captured stderr
        root.handlers[:], root.level = handlers, level
    err = capsys.readouterr().err
    assert err.startswith("ssd-serve: error:") and message in err and "Traceback" not in err
