"""ssd-serve's predicted outputs (`prediction`), log-probabilities, structured outputs
(`response_format`) and usage details: the real server on 127.0.0.1 with continuous batching, queried
with the official openai client, checked against `Generator` in this process."""
from __future__ import annotations

import json

from typing import Literal

import httpx
import pydantic
import pytest

pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra: pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the serve tests use the openai client (test extra)")

from serve_util import ServerProcess, with_chat_template  # noqa: E402
from test_serve import chat_ids  # noqa: E402

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
    for fmt, fragment in (({"type": "xml"}, "must be an object whose type"),
                          ({"type": "json_schema", "json_schema": {"name": "a", "schema": {
                              "type": "nonsense"}}}, "cannot be used")):
        error = _error(server, "/v1/chat/completions",
                       {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                        "response_format": fmt})
        assert error["param"] == "response_format" and fragment in error["message"]
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=MODEL, max_tokens=4,
                                       messages=[{"role": "user", "content": "x"}],
                                       response_format={"type": "json_schema"})
    plain = client.chat.completions.create(model=MODEL, max_tokens=4,
                                           messages=[{"role": "user", "content": "x"}],
                                           response_format={"type": "text"})
    assert plain.choices[0].message.content is not None
    assert server.health()["status"] == "ok"


def test_completion_logprobs_are_the_target_alones(client, gen):
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, logprobs=3)
    res = client.completions.create(**args)
    alone = gen.generate(PROMPT, max_new_tokens=24, k=0, logprobs=3)
    lp = res.choices[0].logprobs
    assert res.choices[0].text == alone.text
    assert len(lp.tokens) == len(alone.token_ids) == len(lp.token_logprobs)
    # each token's own text (a piece of a character shows as U+FFFD, as OpenAI's)
    assert lp.tokens == [gen.codec.tokenizer.decode([i], skip_special_tokens=False)
                         for i in alone.token_ids]
    assert lp.token_logprobs == pytest.approx([t.logprob for t in alone.logprobs], abs=1e-4)
    # the 3 likeliest and the emitted token, by text (ids whose texts coincide share a key)
    assert all(1 <= len(top) <= 4 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    streamed = [c.choices[0].logprobs for c in client.completions.create(**args, stream=True)
                if c.choices and c.choices[0].logprobs is not None]
    assert [v for c in streamed for v in c.token_logprobs] == pytest.approx(
        lp.token_logprobs, abs=1e-6)
    assert [o for c in streamed for o in c.text_offset] == lp.text_offset


def test_chat_logprobs_streamed_and_whole(client, bundle, gen):
    messages = [{"role": "user", "content": "Read a config file."}]
    args = dict(model=MODEL, messages=messages, max_tokens=24, temperature=0.8, seed=4,
                logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**args)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace") \
        .startswith(whole.choices[0].message.content[:8])
    streamed = [t for c in client.chat.completions.create(**args, stream=True)
                if c.choices and c.choices[0].logprobs is not None
                for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content]
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content],
                                                          abs=1e-6)
    plain = client.chat.completions.create(**{**args, "logprobs": None, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
])
def test_bad_logprobs_are_400s_naming_them(server, path, body, param):
    assert _error(server, path, {"model": MODEL, **body})["param"] == param


def test_one_at_a_time_serving_streams_logprobs_and_predictions_too(bundle, gen):
    """--max-batch 1: the batch engine over one slot (batching.py)."""
    from fastapi.testclient import TestClient

    from ssd_runtime.serve.app import create_app
    from ssd_runtime.serve.config import ServeConfig

    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, k=4, max_batch=1,
                                 threads=1))
    with TestClient(app) as http:
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)
        alone = gen.generate(PROMPT, max_new_tokens=20, k=0, logprobs=1)
        chunks = list(client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, logprobs=1, stream=True,
            stream_options={"include_usage": True},
            extra_body={"prediction": {"type": "content", "content": alone.text}}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        values = [v for c in chunks if c.choices and c.choices[0].logprobs
                  for v in c.choices[0].logprobs.token_logprobs]
        assert text == alone.text
        assert values == pytest.approx([t.logprob for t in alone.logprobs], abs=1e-4)
        assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens > 0


class Thing(pydantic.BaseModel):
    ok: bool
    color: Literal["red", "green", "blue"]
    n: int = pydantic.Field(ge=0, le=99)


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.9, 3)])
def test_structured_outputs_through_the_openai_client(client, bundle, gen, temperature, seed):
    """A Pydantic model through the client's parse(): the answer parses into it, and it is the
    constrained target alone's (without forced tokens); json_object and a json_schema on
    completions, streamed too."""
    from openai.lib._pydantic import to_strict_json_schema

    messages = [{"role": "user", "content": "Describe a thing."}]
    parsed = client.chat.completions.parse(model=MODEL, messages=messages, max_tokens=60,
                                           temperature=temperature, seed=seed,
                                           response_format=Thing)
    thing = parsed.choices[0].message.parsed
    assert isinstance(thing, Thing)
    fmt = {"type": "json_schema", "json_schema": {"name": "Thing", "strict": True,
                                                  "schema": to_strict_json_schema(Thing)}}
    alone = gen.generate(chat_ids(bundle, messages), max_new_tokens=60, k=0,
                         temperature=temperature, seed=seed, response_format=fmt,
                         forced_tokens=False)
    assert parsed.choices[0].message.content == alone.text
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=60, temperature=temperature, seed=seed,
                extra_body={"response_format": fmt})
    whole = client.completions.create(**args)
    Thing.model_validate_json(whole.choices[0].text)
    assert whole.model_extra["speculative"]["forced"] > 0      # the grammar's, drafted free
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True)
                       if c.choices)
    assert streamed == whole.choices[0].text
    obj = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=120,
                                         temperature=0, response_format={"type": "json_object"})
    if obj.choices[0].finish_reason == "stop":    # a random model may run out of tokens
        assert isinstance(json.loads(obj.choices[0].message.content), dict)


def test_a_schema_max_tokens_cannot_hold_is_a_400_and_the_batch_runs_on(server, client, bundle,
                                                                         gen):
    """A json_schema whose required names alone outrun max_tokens: 400 naming response_format,
    max_tokens and the least length, while a streamed answer in the batch goes on untouched;
    with room enough, the same schema is answered, valid, and the constrained target alone's."""
    from test_structured import LONG, LONG_NAMES

    least = gen.constraint(LONG).least_tokens
    messages = [{"role": "user", "content": "Fill in the record."}]
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0,
                                       stream=True)
    pieces = [next(iter(stream)).choices[0].text]          # the batch is running
    for path, body in (("/v1/chat/completions", {"messages": messages}),
                       ("/v1/completions", {"prompt": PROMPT})):
        error = _error(server, path, {"model": MODEL, "max_tokens": 5, "response_format": LONG,
                                      **body})
        assert error["param"] == "response_format", error
        assert f"shorter than {least} tokens" in error["message"]
        assert "max_tokens=5" in error["message"] and "HINT" in error["message"]
    pieces += [c.choices[0].text for c in stream if c.choices]
    assert "".join(pieces) == gen.generate(PROMPT, max_new_tokens=40, k=0).text
    res = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=least + 60,
                                         temperature=0, response_format=LONG)
    assert res.choices[0].finish_reason == "stop"
    assert list(json.loads(res.choices[0].message.content)) == LONG_NAMES
    alone = gen.generate(chat_ids(bundle, messages), max_new_tokens=least + 60, k=0,
                         response_format=LONG)
    assert res.choices[0].message.content == alone.text
    assert server.health()["status"] == "ok"
