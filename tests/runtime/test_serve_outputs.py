"""ssd-serve's predicted outputs (`prediction`), usage details and the fields it refuses rather
than ignore (`response_format`): the real server on 127.0.0.1 with continuous batching, queried
with the official openai client, checked against `Generator` in this process."""
from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra: pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the serve tests use the openai client (test extra)")

from serve_util import ServerProcess, with_chat_template  # noqa: E402

from ssd_runtime import Generator  # noqa: E402

MODEL = "tiny"
PROMPT = "def read(path):"          # greedy runs to any max_tokens without an EOS


@pytest.fixture(scope="module")
def bundle(bundle_factory, tmp_path_factory):
    return with_chat_template(bundle_factory("llama", "llama_cut"),
                              tmp_path_factory.mktemp("outputs") / "chat-bundle")


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    srv = ServerProcess(bundle, tmp_path_factory.mktemp("outputs-log") / "server.log",
                        "--model-name", MODEL, "--threads", "1", "--k", "4", "--max-batch", "2")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def gen(bundle):
    return Generator.load(bundle)


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.8, 7)])
def test_a_prediction_changes_nothing_but_the_speed(client, gen, temperature, seed):
    """The target's own output as the prediction: the same text as without it, and the
    prediction's tokens accepted (usage.completion_tokens_details, as OpenAI reports them)."""
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=48, temperature=temperature, seed=seed)
    plain = client.completions.create(**args)
    expected = gen.generate(PROMPT, max_new_tokens=48, k=0, temperature=temperature, seed=seed)
    assert plain.choices[0].text == expected.text
    details = plain.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == details.rejected_prediction_tokens == 0
    predicted = client.completions.create(**args, extra_body={
        "prediction": {"type": "content", "content": expected.text}})
    assert predicted.choices[0].text == expected.text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert details.rejected_prediction_tokens >= 0
    usage = predicted.usage.model_extra            # every request's own acceptance
    assert usage["accepted_draft_tokens"] >= details.accepted_prediction_tokens
    assert usage["draft_tokens"] >= usage["accepted_draft_tokens"]
    assert usage["acceptance_rate"] == pytest.approx(
        usage["accepted_draft_tokens"] / usage["draft_tokens"])


def test_chat_prediction_streams_its_usage(client):
    messages = [{"role": "user", "content": "Read a config file."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,
                                           temperature=0)
    text = whole.choices[0].message.content
    prediction = {"type": "content", "content": [{"type": "text", "text": text}]}
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,
                                            temperature=0, prediction=prediction)
    assert answer.choices[0].message.content == text
    accepted = answer.usage.completion_tokens_details.accepted_prediction_tokens
    assert accepted > 0
    pieces, usage = [], None
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40,
                                                temperature=0, prediction=prediction,
                                                stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(pieces) == text
    assert usage.completion_tokens_details.accepted_prediction_tokens == accepted
    assert usage.completion_tokens == answer.usage.completion_tokens


def _error(server, path: str, body: dict) -> dict:
    res = httpx.post(server.url + path, content=json.dumps(body).encode(), timeout=30,
                     headers={"content-type": "application/json"})
    assert res.status_code == 400, res.text
    return res.json()["error"]


def test_bad_fields_are_400s_naming_them(server, client):
    long = "def f(x):\n    return x\n" * 200             # far more tokens than the context
    error = _error(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT,
                                               "prediction": {"type": "content",
                                                              "content": long}})
    assert error["param"] == "prediction" and "more than the" in error["message"]
    error = _error(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT,
                                               "prediction": {"type": "text", "content": "x"}})
    assert error["param"] == "prediction"
    # structured outputs are not constrained yet: refused by name, never silently ignored
    for fmt in ({"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}):
        error = _error(server, "/v1/chat/completions",
                       {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                        "response_format": fmt})
        assert error["param"] == "response_format" and "not supported" in error["message"]
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=MODEL, max_tokens=4,
                                       messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_object"})
    plain = client.chat.completions.create(model=MODEL, max_tokens=4,
                                           messages=[{"role": "user", "content": "x"}],
                                           response_format={"type": "text"})
    assert plain.choices[0].message.content is not None
    assert server.health()["status"] == "ok"
