"""ssd-serve with continuous batching: concurrent requests share rounds, each gets what it gets
alone; a client that leaves frees its slot; a full queue is a 429; metrics show the batches."""
from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from serve_util import ServerProcess
from ssd_runtime import Generator

MODEL = "tiny"
PROMPTS = ["def read_config(path):", "import os", "class Point:", "x", "for i in range(10):",
           "def read(path):", "return", "# a comment"]


@pytest.fixture(scope="module")
def bundle(bundle_factory):
    return bundle_factory("llama", "llama_cut")


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    srv = ServerProcess(bundle, tmp_path_factory.mktemp("serve-batch") / "server.log",
                        "--model-name", MODEL, "--threads", "1", "--k", "3", "--max-batch", "4",
                        "--max-queue", "2")
    yield srv
    srv.stop()


def _complete(url: str, body: dict) -> tuple[int, str, dict]:
    """(status, text, json or headers) for one request, streamed or not."""
    with httpx.Client(base_url=url, timeout=120) as http:
        if not body.get("stream"):
            res = http.post("/v1/completions", json=body)
            data = res.json()
            text = data["choices"][0]["text"] if res.status_code == 200 else ""
            return res.status_code, text, {**data, "headers": dict(res.headers)}
        text = ""
        with http.stream("POST", "/v1/completions", json=body) as res:
            for line in res.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text += json.loads(line[6:])["choices"][0]["text"]
        return res.status_code, text, {}


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.fixture
def held(bundle):
    """The real app in uvicorn (a thread) with 4 slots whose batch holds its first round until
    4 requests have joined, so that they certainly share rounds (left to the clients' timing,
    the overlap failed once in two runs: no two requests happened to share a round)."""
    from serve_util import ThreadedServer
    from ssd_runtime.serve.app import create_app
    from ssd_runtime.serve.config import ServeConfig

    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, max_queue=2, max_batch=4,
                                 k=3), generator=Generator.load(bundle, max_batch=4, threads=1))
    batch = app.state.server.engine.batch
    step, deadline, started = batch.step, time.monotonic() + 60, []

    def held_step():
        if not started and batch.active < 4 and time.monotonic() < deadline:
            time.sleep(0.005)                 # the worker adds what arrived, then asks again
            return []
        started.append(True)
        return step()

    batch.step = held_step
    with ThreadedServer(app) as srv:
        yield srv


def test_concurrent_requests_each_get_what_they_get_alone(held, bundle):
    server = held
    gen = Generator.load(bundle, threads=1)
    bodies = [dict(model=MODEL, prompt=p, max_tokens=6 + 3 * i, temperature=0, stream=i % 2 == 1)
              for i, p in enumerate(PROMPTS[:6])]
    bodies[2].update(temperature=0.9, seed=7)               # seeded sampling beside greedy
    bodies[4].update(presence_penalty=1.0)
    results: list = [None] * len(bodies)

    def one(i: int) -> None:
        results[i] = _complete(server.url, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for body, (status, text, _) in zip(bodies, results):
        assert status == 200
        settings = {k: body[k] for k in ("temperature", "seed", "presence_penalty") if k in body}
        want = gen.generate(body["prompt"], max_new_tokens=body["max_tokens"], k=0, **settings)
        assert text == want.text, f"{body['prompt']!r} differs when served in a batch"
    health = server.health()
    assert health["max_batch"] == 4
    metrics = server.metrics()
    rounds = _metric(metrics, "ssd_batch_size_count")
    assert rounds > 0 and _metric(metrics, "ssd_batch_size_sum") > rounds   # some shared a round
    assert _metric(metrics, "ssd_inter_token_seconds_count") > 0


@pytest.fixture
def gated(bundle):
    """The real app in uvicorn (a thread) with 2 slots and room for 1 waiting request, whose
    batch runs a round only per permit: the test decides when rounds happen."""
    from serve_util import ThreadedServer
    from ssd_runtime.serve.app import create_app
    from ssd_runtime.serve.config import ServeConfig

    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, max_queue=1, max_batch=2,
                                 k=3), generator=Generator.load(bundle, max_batch=2, threads=1))
    batch = app.state.server.engine.batch
    permits, step = threading.Semaphore(0), batch.step

    def gated_step():
        permits.acquire(timeout=30)
        return step()

    batch.step = gated_step
    with ThreadedServer(app) as srv:
        srv.permits, srv.batch = permits, batch
        yield srv
        permits.release(10_000)


def test_a_full_queue_is_a_429_and_a_client_that_leaves_frees_its_slot(gated):
    long = dict(model=MODEL, prompt="def read(path):", max_tokens=50, temperature=0,
                stream=True)
    with httpx.Client(base_url=gated.url, timeout=60) as http:
        streams = [http.send(http.build_request("POST", "/v1/completions", json=long),
                             stream=True) for _ in range(3)]         # 2 slots + 1 waiting
        lines = [s.iter_lines() for s in streams]
        gated.permits.release(1)                                    # one round: 2 admitted
        first = [next(lines[i]) for i in range(2)]
        assert all(line.startswith("data: ") for line in first)
        assert gated.health()["queue_depth"] == 1 and gated.health()["busy"]
        res = http.post("/v1/completions", json={**long, "stream": False})
        assert res.status_code == 429, res.text
        assert int(res.headers["retry-after"]) >= 1
        assert res.json()["error"]["type"] == "rate_limit_error"
        assert "--max-queue 1" in res.json()["error"]["message"]
        streams[0].close()                                          # a running client leaves
        deadline = time.monotonic() + 10
        while gated.health()["queue_depth"] and time.monotonic() < deadline:
            gated.permits.release(1)                # its slot goes to the waiting request
            time.sleep(0.05)
        assert gated.health()["queue_depth"] == 0
        # the leaver's slot, not the end of the other: both others decode side by side
        assert {seq.id for seq in gated.batch.slots if seq is not None} == {1, 2}
        gated.permits.release(10_000)
        texts = ["".join(_texts([first[1], *lines[1]])), "".join(_texts(lines[2]))]
        for s in streams:
            s.close()
    ref = Generator.load(gated.batch.gen.root, threads=1).generate(
        "def read(path):", max_new_tokens=50, k=0)
    assert texts == [ref.text, ref.text]
    deadline = time.monotonic() + 10
    while gated.health()["busy"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not gated.health()["busy"] and gated.health()["queue_depth"] == 0


def _texts(lines) -> list[str]:
    out = []
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:])["choices"][0]["text"])
    return out


def test_bad_settings_are_a_400_that_leaves_the_batch_running(server):
    status, _, data = _complete(server.url, dict(model=MODEL, prompt="x", max_tokens=4,
                                                 temperature=0, logit_bias={"99999": 1}))
    assert status == 400 and "vocabulary" in data["error"]["message"]
    status, text, _ = _complete(server.url, dict(model=MODEL, prompt="x", max_tokens=4,
                                                 temperature=0))
    assert status == 200 and text


def test_split_mode_cannot_batch(bundle, tmp_path):
    from ssd_runtime.errors import ConfigError
    from ssd_runtime.serve.config import ServeConfig

    with pytest.raises(ConfigError, match="--mode split.*--max-batch"):
        ServeConfig(bundle=bundle, mode="split", max_batch=4)


def test_a_lagging_stream_gets_what_arrived_as_one_piece(bundle):
    """When the event loop falls behind the rounds (a busy server), the pieces that queued up
    for a request go out as one chunk, in order, nothing lost: one SSE write and one client
    parse per wake-up instead of one per round."""
    import asyncio

    from ssd_runtime.serve.batching import BatchEngine
    from ssd_runtime.serve.metrics import Metrics

    gen = Generator.load(bundle, max_batch=2, threads=1)
    want = gen.generate("def read(path):", max_new_tokens=24, k=0)
    engine = BatchEngine(gen, 0, max_queue=4, metrics=Metrics(MODEL, "test"))

    async def lagging() -> tuple[int, list[str]]:
        job = engine.prepare(gen.encode("def read(path):"), dict(max_new_tokens=24, k=0,
                                                                 temperature=0.0))
        ticket = engine.enter(job)
        deadline = time.monotonic() + 60
        while engine.running() or engine.waiting():    # the loop is blocked meanwhile
            time.sleep(0.02)
            assert time.monotonic() < deadline
        for _ in range(3):                # the worker's hand-overs run at the loop's next turn
            await asyncio.sleep(0)
        queued = ticket.pieces.qsize()
        return queued, [piece async for piece in engine.run(ticket, job)]

    try:
        queued, pieces = asyncio.run(lagging())
    finally:
        engine.close()
    assert queued > 3                      # several rounds' pieces were waiting
    assert pieces == [want.text]           # ... and went out as one, in order


@pytest.fixture
def paused(bundle):
    """The real app in uvicorn (a thread) with 16 slots under k="auto", whose batch holds its
    first round until 16 requests have joined and then pauses after its second round until
    the test releases it: what the test sends then certainly arrives inside a running batch."""
    from serve_util import ThreadedServer
    from ssd_runtime.serve.app import create_app
    from ssd_runtime.serve.config import ServeConfig

    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, max_queue=16, max_batch=16,
                                 k="auto"),
                     generator=Generator.load(bundle, max_batch=16, threads=1))
    batch = app.state.server.engine.batch
    step, deadline, started = batch.step, time.monotonic() + 60, []
    pausing, release = threading.Event(), threading.Event()

    def paced_step():
        if not started and batch.active < 16 and time.monotonic() < deadline:
            time.sleep(0.005)
            return []
        started.append(True)
        if batch.rounds >= 2 and not release.is_set():
            pausing.set()
            release.wait(60)
        return step()

    batch.step = paced_step
    with ThreadedServer(app) as srv:
        srv.pausing, srv.release = pausing, release
        yield srv
        release.set()


def test_nothing_is_lost_under_load(paused, bundle):
    """16 streaming clients in one batch; 4 leave after their first piece, and bad requests
    arrive while the batch runs: the bad ones get their 4xx, the 12 others the text each
    prompt gives alone at k=0, no answer is a 5xx, and every slot is free afterwards."""
    server = paused
    bodies = [dict(model=MODEL, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=24 + i,
                   temperature=0, stream=True) for i in range(16)]
    leavers = {1, 6, 11, 15}
    results: list = [None] * 16

    def one(i: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            with http.stream("POST", "/v1/completions", json=bodies[i]) as res:
                text = ""
                for line in res.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        text += json.loads(line[6:])["choices"][0]["text"]
                        if i in leavers:
                            break                    # leaves mid-stream: the stream closes
                results[i] = (res.status_code, text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    assert server.pausing.wait(60), "the batch did not start its rounds"
    bad = [("/v1/completions", {"model": "other", "prompt": "x"}, 404),
           ("/v1/completions", {"model": MODEL, "prompt": "x", "logit_bias": {"99999": 1}}, 400),
           ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1}, 400),
           ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400),
           ("/v1/completions", b"{not json", 400)]
    for path, body, status in bad:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        res = httpx.post(server.url + path, content=raw, timeout=30,
                         headers={"content-type": "application/json"})
        assert res.status_code == status, (body, res.text)
        assert res.json()["error"]["message"]
    assert server.health()["busy"]                   # the batch is still running
    server.release.set()
    for t in threads:
        t.join(120)
    gen = Generator.load(bundle, threads=1)
    cut = 0
    for i, (body, (status, text)) in enumerate(zip(bodies, results)):
        assert status == 200
        want = gen.generate(body["prompt"], max_new_tokens=body["max_tokens"], k=0).text
        if i in leavers:
            assert want.startswith(text) and text
            cut += len(text) < len(want)
        else:
            assert text == want, f"{body['prompt']!r} differs beside leavers and bad requests"
    assert cut, "no client left mid-stream"
    deadline = time.monotonic() + 10
    while server.health()["busy"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not server.health()["busy"] and server.health()["queue_depth"] == 0
    metrics = server.metrics()
    counted = r'^ssd_requests_total\{[^}]*status="%s"[^}]*\} [1-9]'
    assert re.search(counted % "400", metrics, re.M)             # (the 4xx are counted ...)
    assert not re.search(counted % r"5\d\d", metrics, re.M)       # ... and no 5xx)


@pytest.mark.parametrize("max_batch", ["1", "4"])
def test_sigterm_drains_the_requests_in_flight(bundle, tmp_path, max_batch):
    """SIGTERM while three streams run (one slot: two of them wait in line): no new request is
    taken, each stream still ends with [DONE] and the text its prompt gives alone, and the
    server exits without an error."""
    import signal

    srv = ServerProcess(bundle, tmp_path / "server.log", "--model-name", MODEL, "--threads",
                        "1", "--k", "3", "--max-batch", max_batch)
    bodies = [dict(model=MODEL, prompt=PROMPTS[i], max_tokens=32, temperature=0, stream=True)
              for i in range(3)]
    got: list = [None] * 3
    first = [threading.Event() for _ in range(3)]

    def one(i: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=bodies[i]) as res:
                lines = res.iter_lines()
                head = next(lines)
                first[i].set()
                got[i] = [line for line in (head, *lines) if line]

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        # every request taken: decoding (its first line read) or waiting in line (one slot)
        deadline = time.monotonic() + 60
        while sum(e.is_set() for e in first) + srv.health()["queue_depth"] < 3:
            assert time.monotonic() < deadline, srv.health()
            time.sleep(0.01)
        srv.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        # uvicorn drains, then exits by the signal it caught (its handler re-raises it)
        assert srv.proc.wait(30) in (0, -signal.SIGTERM), srv.log.read_text()[-2000:]
        assert "Traceback" not in srv.log.read_text()
    finally:
        srv.stop()
    gen = Generator.load(bundle, threads=1)
    for body, lines in zip(bodies, got):
        assert lines is not None and lines[-1] == "data: [DONE]"
        text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines
                       if line.startswith("data: {"))
        assert text == gen.generate(body["prompt"], max_new_tokens=32, k=0).text
