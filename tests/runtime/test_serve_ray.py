"""ssd-serve on Ray Serve: `--ray-replicas 2` on a local Ray instance (loopback only).

Requests spread over both replicas (each names itself in `speculative.replica` and the
x-ssd-replica header) and give what one process gives for the same seeds; structured outputs,
predictions and log-probabilities pass through the deployment unchanged (issue 45); each
replica checks the API key as one process does.
"""
from __future__ import annotations

import json
import secrets
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra: pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the serve tests use the openai client (test extra)")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[serve,ray]'")

from serve_util import ServerProcess, with_chat_template  # noqa: E402

from ssd_runtime import Generator  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]
MODEL = "tiny"
PROMPT = "def read_config(path):"
KEY = "sk-ssd-" + secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def bundle(bundle_factory, tmp_path_factory):
    return with_chat_template(bundle_factory("llama", "llama_cut"),
                              tmp_path_factory.mktemp("serve-ray") / "chat-bundle")


@pytest.fixture(scope="module")
def ray_server(bundle, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-ray")
    (folder / "keys.txt").write_text(f"# the test's key\n{KEY}\n")
    srv = ServerProcess(bundle, folder / "server.log", "--ray-replicas", "2", "--threads", "1",
                        "--k", "4", "--model-name", MODEL,
                        "--api-key-file", str(folder / "keys.txt"), startup_s=240)
    yield srv
    srv.stop(grace_s=60)


def test_two_replicas_share_the_load_and_match_one_process(ray_server, bundle):
    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key=KEY, max_retries=0,
                           timeout=120)

    def ask(seed: int):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48,
                                         temperature=0.8, seed=seed)

    results: dict[int, object] = {}
    replicas: set[str] = set()
    deadline = time.monotonic() + 90
    with ThreadPoolExecutor(16) as pool:            # waves of 16 until both replicas answered
        while len(replicas) < 2 and len(results) < 128 and time.monotonic() < deadline:
            wave = range(len(results), len(results) + 16)
            for seed, res in zip(wave, pool.map(ask, wave), strict=True):
                results[seed] = res
                replicas.add(res.model_extra["speculative"]["replica"])
    assert len(replicas) == 2, f"{len(results)} requests all went to {replicas}"
    gen = Generator.load(bundle)
    for seed, res in results.items():
        ref = gen.generate(PROMPT, max_new_tokens=48, k=4, temperature=0.8, seed=seed)
        assert res.choices[0].text == ref.text, f"seed {seed}"
        assert res.usage.completion_tokens == len(ref.token_ids)


def test_ray_streaming_and_routes(ray_server, bundle):
    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key=KEY, max_retries=0,
                           timeout=120)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32,
                                      temperature=0.9, seed=4)
    # the first test asked this prompt with seed 4 already: a replica that answered it drafts
    # the whole answer from its earlier text in one round, so this stream opts out of that
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0.9, seed=4, stream=True,
        extra_body={"suffix_drafts": False})]
    assert len(pieces) > 2 and "".join(pieces) == whole.choices[0].text
    assert [m.id for m in client.models.list().data] == [MODEL]
    res = httpx.post(f"{ray_server.url}/v1/completions", timeout=60, headers=AUTH,
                     json={"model": MODEL, "prompt": "x", "temperature": -1})
    assert res.status_code == 400 and "temperature" in res.json()["error"]["message"]
    assert res.headers["x-ssd-replica"]
    assert "ssd_requests_total" in httpx.get(f"{ray_server.url}/metrics", timeout=60,
                                             headers=AUTH).text


def test_ray_structured_predicted_outputs_and_logprobs(ray_server, bundle):
    """response_format, prediction and logprobs through the Ray deployment: what one process
    gives for the same request, and bad formats a 400 naming the field there too."""
    pytest.importorskip("llguidance", reason="structured outputs need llguidance")
    from test_serve import chat_ids
    from test_serve_outputs import Thing
    from test_structured import FORMAT, LONG, _valid

    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key=KEY, max_retries=0,
                           timeout=120)
    gen = Generator.load(bundle)
    constrained = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=60,
                                            temperature=0, extra_body={"response_format": FORMAT})
    _valid(constrained.choices[0].text)
    alone = gen.generate(PROMPT, max_new_tokens=60, k=0, response_format=FORMAT)
    assert constrained.choices[0].text == alone.text
    messages = [{"role": "user", "content": "Describe a thing."}]
    parsed = client.chat.completions.parse(model=MODEL, messages=messages, max_tokens=60,
                                           temperature=0.9, seed=3, response_format=Thing)
    assert isinstance(parsed.choices[0].message.parsed, Thing)

    plain = gen.generate(PROMPT, max_new_tokens=48, k=0)          # one process, no prediction
    predicted = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=48,
                                          temperature=0, extra_body={"prediction": {
                                              "type": "content", "content": plain.text}})
    assert predicted.choices[0].text == plain.text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0

    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                          temperature=0, logprobs=True, top_logprobs=2)
    ref = gen.generate(chat_ids(bundle, messages), max_new_tokens=16, k=0, logprobs=2)
    content = chat.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([t.logprob for t in ref.logprobs],
                                                         abs=1e-4)
    assert all(len(c.top_logprobs) == 2 for c in content)

    for fmt, max_tokens, fragment in (({"type": "xml"}, 16, "must be an object whose type"),
                                      (LONG, 5, "max_tokens=5")):
        res = httpx.post(f"{ray_server.url}/v1/completions", timeout=60,
                         content=json.dumps({"model": MODEL, "prompt": PROMPT,
                                             "max_tokens": max_tokens,
                                             "response_format": fmt}).encode(),
                         headers={"content-type": "application/json", **AUTH})
        assert res.status_code == 400, res.text
        error = res.json()["error"]
        assert error["param"] == "response_format" and fragment in error["message"]


def test_ray_replicas_check_the_key(ray_server):
    """No key or a wrong one: the replica answers 401 in OpenAI's shape through Ray's proxy
    (each replica holds the keys' digests); /health stays open."""
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": PROMPT}),
                       ("/v1/models", None), ("/metrics", None)):
        for headers in ({}, {"Authorization": f"Bearer {KEY}x"}):
            res = httpx.request("POST" if body else "GET", f"{ray_server.url}{path}",
                                json=body, headers=headers, timeout=60)
            assert res.status_code == 401, res.text
            assert res.json()["error"]["code"] == "invalid_api_key"
            assert res.headers["www-authenticate"].startswith("Bearer")
            assert res.headers["x-ssd-replica"]
    assert httpx.get(f"{ray_server.url}/health", timeout=60).status_code == 200
    assert KEY not in ray_server.log.read_text()


def test_app_builder_reads_keys_as_the_cli(tmp_path):
    """`serve run ...:app_builder api_key_file=FILE` reads the file as --api-key-file does."""
    from ssd_runtime.errors import ConfigError
    from ssd_runtime.serve.ray_app import app_builder

    (tmp_path / "keys.txt").write_text(f"{KEY}\n")
    assert app_builder({"bundle": str(tmp_path), "api_key_file": str(tmp_path / "keys.txt")})
    with pytest.raises(ConfigError, match=r"--api-key-file .*nope: no such file"):
        app_builder({"bundle": str(tmp_path), "api_key_file": str(tmp_path / "nope")})
