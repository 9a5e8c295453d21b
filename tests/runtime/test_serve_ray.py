"""ssd-serve on Ray Serve: `--ray-replicas 2` on a local Ray instance (loopback only).

Requests spread over both replicas (each names itself in `speculative.replica` and the
x-ssd-replica header) and give what one process gives for the same seeds.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra: pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the serve tests use the openai client (test extra)")
pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install '.[serve,ray]'")

from serve_util import ServerProcess  # noqa: E402

from ssd_runtime import Generator  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]
MODEL = "tiny"
PROMPT = "def read_config(path):"


@pytest.fixture(scope="module")
def bundle(bundle_factory):
    return bundle_factory("llama", "llama_cut")


@pytest.fixture(scope="module")
def ray_server(bundle, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-ray") / "server.log"
    srv = ServerProcess(bundle, log, "--ray-replicas", "2", "--threads", "1", "--k", "4",
                        "--model-name", MODEL, startup_s=240)
    yield srv
    srv.stop(grace_s=60)


def test_two_replicas_share_the_load_and_match_one_process(ray_server, bundle):
    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key="x", max_retries=0,
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
    client = openai.OpenAI(base_url=f"{ray_server.url}/v1", api_key="x", max_retries=0,
                           timeout=120)
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=32,
                                      temperature=0.9, seed=4)
    pieces = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=32, temperature=0.9, seed=4, stream=True)]
    assert len(pieces) > 2 and "".join(pieces) == whole.choices[0].text
    assert [m.id for m in client.models.list().data] == [MODEL]
    res = httpx.post(f"{ray_server.url}/v1/completions", timeout=60,
                     json={"model": MODEL, "prompt": "x", "temperature": -1})
    assert res.status_code == 400 and "temperature" in res.json()["error"]["message"]
    assert res.headers["x-ssd-replica"]
    assert "ssd_requests_total" in httpx.get(f"{ray_server.url}/metrics", timeout=60).text
