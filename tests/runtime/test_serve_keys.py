"""ssd-serve with API keys: the real server on 127.0.0.1, real clients, real keys.

A server subprocess (`--api-key` and `--api-key-file`, debug logging) answers every route with
no key, a wrong key and a right one; the keys must not reach its log or /metrics. The same
app in a thread shows that a refused request never reaches the engine, and that each key
arrives there as its own tenant. Bad key options are refused by the CLI's entry point.
"""
from __future__ import annotations

import hmac
import json
import logging
import pickle
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra: pip install '.[serve]'")
openai = pytest.importorskip("openai", reason="the serve tests use the openai client (test extra)")

from serve_util import ServerProcess, ThreadedServer, metric, with_chat_template  # noqa: E402

from ssd_runtime import Generator  # noqa: E402
from ssd_runtime.serve.app import create_app  # noqa: E402
from ssd_runtime.serve.config import ServeConfig  # noqa: E402
from ssd_runtime.serve.keys import ApiKeys, bearer_token, load_keys  # noqa: E402

MODEL = "tiny"
PROMPT = "def read_config(path):"
# new keys each run, so that none can be in a log by chance
KEY_A, KEY_B, WRONG = ("sk-ssd-" + secrets.token_urlsafe(24) for _ in range(3))
CHAT = [{"role": "user", "content": "Read a config file."}]
ROUTES = [  # (method, path, body): every route of the app, streamed ones too
    ("POST", "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 8,
                                 "temperature": 0}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 8,
                                 "temperature": 0, "stream": True}),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 8,
                                      "temperature": 0}),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 8,
                                      "temperature": 0, "stream": True}),
    ("GET", "/v1/models", None),
    ("GET", f"/v1/models/{MODEL}", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
]
REFUSED = {  # Authorization header -> whether the server reads it as no key at all
    None: True, "": True, "Basic dXNlcjpwYXNz": True, "Bearer": True, "bearer": True,
    f"Bearer {WRONG}": False, f"Bearer {KEY_A}x": False, f"Bearer {KEY_A[:-1]}": False,
    f"Token {KEY_A}": True,
}


@pytest.fixture(scope="module")
def bundle(bundle_factory, tmp_path_factory):
    return with_chat_template(bundle_factory("llama", "llama_cut"),
                              tmp_path_factory.mktemp("serve-keys") / "chat-bundle")


@pytest.fixture(scope="module")
def keyed(bundle, tmp_path_factory):
    """Key A on the command line, key B in a file beside a comment that holds WRONG."""
    folder = tmp_path_factory.mktemp("serve-keys-log")
    keys = folder / "keys.txt"
    keys.write_text(f"# tenants of the test\n\n  {KEY_B}  \n# {WRONG} (retired)\n   \n")
    srv = ServerProcess(bundle, folder / "server.log", "--model-name", MODEL, "--threads", "1",
                        "--k", "4", "--api-key", KEY_A, "--api-key-file", str(keys),
                        "--log-level", "debug")
    yield srv
    srv.stop()


def _send(url: str, method: str, path: str, body: dict | None,
          authorization: str | None) -> httpx.Response:
    headers = {} if authorization is None else {"Authorization": authorization}
    with httpx.Client(base_url=url, timeout=60) as http:
        return http.request(method, path, json=body, headers=headers)


def _refused(res: httpx.Response, missing: bool) -> None:
    assert res.status_code == 401, res.text
    assert res.json() == {"error": {"message": res.json()["error"]["message"],
                                    "type": "invalid_request_error", "param": None,
                                    "code": "invalid_api_key"}}
    message = res.json()["error"]["message"]
    assert message.startswith("no API key" if missing else "incorrect API key")
    assert res.headers["www-authenticate"].startswith("Bearer")
    assert ('error="invalid_token"' in res.headers["www-authenticate"]) is not missing
    assert res.headers["x-ssd-replica"]                  # answered by the app, counted


@pytest.mark.parametrize("method,path,body", ROUTES,
                         ids=[f"{p}{'-stream' if b and b.get('stream') else ''}"
                              for _, p, b in ROUTES])
def test_every_route_needs_a_key(keyed, method, path, body):
    for authorization, missing in REFUSED.items():
        _refused(_send(keyed.url, method, path, body, authorization), missing)
    for key in (KEY_A, KEY_B):
        for scheme in ("Bearer", "bearer"):
            res = _send(keyed.url, method, path, body, f"{scheme} {key}")
            assert res.status_code == 200, res.text
            if body and body.get("stream"):
                assert res.text.rstrip().endswith("data: [DONE]")
    assert _send(keyed.url, "GET", "/nowhere", None, None).status_code == 401   # fail closed
    assert _send(keyed.url, "GET", "/nowhere", None, f"Bearer {KEY_A}").status_code == 404


def test_health_stays_open(keyed):
    for authorization in (None, f"Bearer {WRONG}", f"Bearer {KEY_A}"):
        res = _send(keyed.url, "GET", "/health", None, authorization)
        assert res.status_code == 200 and res.json()["status"] == "ok"


def test_concurrent_clients_with_and_without_keys(keyed, bundle):
    """16 openai clients at once, a quarter each with key A, key B, a wrong key and key A as
    Basic auth: the keyed ones get the target's answer, the others AuthenticationError."""
    def ask(n: int):
        key = (KEY_A, KEY_B, WRONG, KEY_A)[n % 4]
        basic = {"Authorization": f"Basic {KEY_A}"} if n % 4 == 3 else None
        client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=key, max_retries=0,
                               timeout=120, default_headers=basic)
        try:
            if n % 2:
                return "".join(c.choices[0].text for c in client.completions.create(
                    model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True))
            return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                             temperature=0).choices[0].text
        except openai.AuthenticationError as exc:
            return exc.status_code, exc.body["code"]
        finally:
            client.close()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(16)))
    ref = Generator.load(bundle).generate(PROMPT, max_new_tokens=24, k=4, temperature=0).text
    assert [a for n, a in enumerate(answers) if n % 4 < 2] == [ref] * 8
    assert [a for n, a in enumerate(answers) if n % 4 >= 2] == [(401, "invalid_api_key")] * 8


def test_keys_are_in_no_log_and_no_metric(keyed):
    """Every key, the right ones and a wrong one, crosses the server; its log (debug level,
    uvicorn's access lines included) and /metrics hold none of them, nor the file's comment."""
    for key in (KEY_A, KEY_B, WRONG):
        for method, path, body in ROUTES[:2] + ROUTES[4:5]:
            _send(keyed.url, method, path, body, f"Bearer {key}")
    text = _send(keyed.url, "GET", "/metrics", None, f"Bearer {KEY_A}").text
    assert metric(text, "ssd_requests_total", status="401") >= 3
    log = keyed.log.read_text()
    assert "2 API keys: every route but /health needs one" in log     # the start-up line
    assert '"POST /v1/completions HTTP/1.1" 401' in log                # access lines are there
    for key in (KEY_A, KEY_B, WRONG):
        for text_ in (log, text):
            assert key not in text_ and key[7:19] not in text_


@pytest.fixture
def watched(bundle):
    """The app with keys A and B in uvicorn (a thread), its engine watched: the settings it
    prepared, the requests it queued (with their tenant) and its rounds."""
    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, k=4,
                                 api_keys=ApiKeys.of([KEY_A, KEY_B])),
                     generator=Generator.load(bundle, threads=1))
    server = app.state.server
    seen = {"prepared": 0, "encoded": 0, "tenants": []}
    prepare, encode, submit = server.engine.prepare, server.generator.encode, \
        server.engine.batch.submit

    def counted_prepare(*args, **kwargs):
        seen["prepared"] += 1
        return prepare(*args, **kwargs)

    def counted_encode(*args, **kwargs):
        seen["encoded"] += 1
        return encode(*args, **kwargs)

    def noted_submit(req, *args, **kwargs):
        seen["tenants"].append(req.tenant)
        return submit(req, *args, **kwargs)

    server.engine.prepare, server.generator.encode = counted_prepare, counted_encode
    server.engine.batch.submit = noted_submit
    with ThreadedServer(app) as srv:
        srv.server_state, srv.seen = server, seen
        yield srv


def test_a_refused_request_does_no_work(watched):
    """32 refused generation requests at once, large bodies: nothing is tokenised, prepared,
    queued or decoded; then key A and key B each reach the engine as a tenant of their own."""
    state = watched.server_state
    body = {"model": MODEL, "prompt": "x " * 20_000, "max_tokens": 64}

    def refused(n: int) -> int:
        authorization = (None, f"Bearer {WRONG}", "Bearer", f"Basic {KEY_A}")[n % 4]
        path = ("/v1/completions", "/v1/chat/completions")[n % 2]
        return _send(watched.url, "POST", path, {**body, "stream": n % 3 == 0,
                                                 "messages": CHAT}, authorization).status_code

    with ThreadPoolExecutor(16) as pool:
        assert set(pool.map(refused, range(32))) == {401}
    assert watched.seen == {"prepared": 0, "encoded": 0, "tenants": []}
    assert state.engine.batch.rounds == 0 and state.engine.waiting() == 0
    assert state.metrics.prompt_tokens == 0 and state.metrics.generated_tokens == 0

    for key, stream in ((KEY_A, False), (KEY_B, True), (KEY_A, True), (KEY_B, False)):
        res = _send(watched.url, "POST", "/v1/completions",
                    {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "stream": stream},
                    f"Bearer {key}")
        assert res.status_code == 200
    assert watched.seen["tenants"] == ["key-1", "key-2", "key-1", "key-2"]


def test_no_keys_no_tenant(bundle):
    """Without keys every route is open and the engine's requests carry no tenant."""
    from fastapi.testclient import TestClient

    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL))
    submit, tenants = app.state.server.engine.batch.submit, []
    app.state.server.engine.batch.submit = lambda req, *a: tenants.append(req.tenant) or \
        submit(req, *a)
    with TestClient(app) as http:
        assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                  "max_tokens": 2}).status_code == 200
        assert http.get("/metrics").status_code == 200
    assert tenants == [None]


def test_metrics_open(bundle):
    from fastapi.testclient import TestClient

    app = create_app(ServeConfig(bundle=bundle, model_name=MODEL, metrics_open=True,
                                 api_keys=ApiKeys.of([KEY_A])))
    with TestClient(app) as http:
        assert http.get("/metrics").status_code == 200
        assert http.get("/v1/models").status_code == 401
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {KEY_A}"}) \
            .status_code == 200


def test_the_check_itself(monkeypatch):
    """What the app and every Ray replica run: the header's token, each key's own id, and
    one constant-time comparison per key whichever matches (no early exit)."""
    keys = ApiKeys.of([KEY_A, KEY_B, KEY_A])              # a repeated key counts once
    assert len(keys) == 2 and repr(keys) == "ApiKeys(2 keys)"
    assert [keys.tenant(k) for k in (KEY_A, KEY_B, WRONG, "", None)] == \
        ["key-1", "key-2", None, None, None]
    assert bearer_token(f"  BEARER  {KEY_A} ") == KEY_A
    assert [bearer_token(h) for h in (None, "", "Bearer", f"Basic {KEY_A}", KEY_A)] == \
        [None] * 5
    compared = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    for token in (KEY_A, KEY_B, WRONG):
        compared.clear()
        keys.tenant(token)
        assert len(compared) == 2, token


def test_where_keys_come_from(tmp_path):
    """--api-key and --api-key-file together; $SSD_API_KEY only when neither is given (as vLLM
    reads VLLM_API_KEY); no key at all: an open server. The config holds digests only."""
    file = tmp_path / "keys"
    file.write_bytes(f"\ufeff\r\n# a comment\r\n{KEY_B}\r\n".encode())   # BOM, CRLF
    keys = load_keys([KEY_A], file, environ={"SSD_API_KEY": WRONG})
    assert [keys.tenant(k) for k in (KEY_A, KEY_B, WRONG)] == ["key-1", "key-2", None]
    assert load_keys(None, None, environ={"SSD_API_KEY": WRONG}).tenant(WRONG) == "key-1"
    assert load_keys(None, None, environ={"SSD_API_KEY": ""}) is None
    assert load_keys([], None, environ={}) is None
    config = ServeConfig(bundle=tmp_path, api_keys=keys)
    for shown in (repr(config), str(config), pickle.dumps(config)):   # printed, or sent to Ray
        for key in (KEY_A, KEY_B):
            assert (key.encode() if isinstance(shown, bytes) else key) not in shown
    with pytest.raises(Exception, match="api_keys must be an ApiKeys"):
        ServeConfig(bundle=tmp_path, api_keys=[KEY_A])


def _main(args: list[str], capsys) -> tuple[int, str]:
    from ssd_runtime.serve.cli import main

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        code = main(args)
    finally:                           # main() configures logging on the captured stderr
        root.handlers[:], root.level = handlers, level
    return code, capsys.readouterr().err


@pytest.mark.parametrize("case", ["missing", "folder", "empty", "comments", "binary",
                                  "empty-flag", "space-flag", "inline-comment", "env"])
def test_bad_key_options_are_one_clear_line(bundle, tmp_path, capsys, monkeypatch, case):
    secret = "sk-ssd-" + secrets.token_urlsafe(12)
    file = tmp_path / "keys.txt"
    args, expected = {
        "missing": (["--api-key-file", str(tmp_path / "nope.txt")],
                    f"--api-key-file {tmp_path / 'nope.txt'}: no such file"),
        "folder": (["--api-key-file", str(tmp_path)], f"--api-key-file {tmp_path} cannot be "
                                                      f"read (Is a directory)"),
        "empty": (["--api-key-file", str(file)], f"--api-key-file {file} holds no key"),
        "comments": (["--api-key-file", str(file)], f"--api-key-file {file} holds no key"),
        "binary": (["--api-key-file", str(file)], f"--api-key-file {file} is not UTF-8 text"),
        "empty-flag": (["--api-key", secret, "--api-key", ""], "--api-key #2 is empty"),
        "space-flag": (["--api-key", f"{secret} x"], "--api-key #1 holds a space"),
        "inline-comment": (["--api-key-file", str(file)],
                           f"--api-key-file {file}, line 2, holds a space"),
        "env": ([], "$SSD_API_KEY holds a space"),
    }[case]
    file.write_bytes({"empty": b"", "comments": f"# {secret}\n\n  \n".encode(),
                      "binary": b"\xff\xfe" + secret.encode(),
                      "inline-comment": f"# keys\n{secret} # the ops team\n".encode()}
                     .get(case, secret.encode()))
    monkeypatch.setenv("SSD_API_KEY", f"\t{secret}" if case == "env" else "")
    code, err = _main([str(bundle), *args], capsys)
    assert code == 2
    assert err.startswith("ssd-serve: error:") and expected in err and "---> HINT:" in err
    assert "Traceback" not in err and secret not in err and len(err.splitlines()) == 1


def test_bad_key_file_from_a_real_process(bundle, tmp_path):
    """The installed entry point's process: exit code 2 and one line naming the file."""
    missing = tmp_path / "keys.txt"
    out = subprocess.run([sys.executable, "-m", "ssd_runtime.serve.cli", str(bundle),
                          "--api-key-file", str(missing)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == (f"ssd-serve: error: --api-key-file {missing}: no such file. "
                                  f"---> HINT: give a text file of keys, one key per line; "
                                  f"blank lines and lines starting with # are skipped.")


def test_help_shows_no_key(capsys, monkeypatch):
    from ssd_runtime.serve.cli import main

    secret = "sk-ssd-" + secrets.token_urlsafe(12)
    monkeypatch.setenv("SSD_API_KEY", secret)
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--api-key KEY" in out and "--api-key-file FILE" in out and "--metrics-open" in out
    assert "$SSD_API_KEY" in out and secret not in out


def test_error_body_is_openai_json(keyed):
    """The 401 is JSON that the openai client reads as AuthenticationError with its fields."""
    client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key=WRONG, max_retries=0,
                           timeout=30)
    with pytest.raises(openai.AuthenticationError) as info:
        client.models.list()
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    assert json.loads(info.value.response.text)["error"]["type"] == "invalid_request_error"
