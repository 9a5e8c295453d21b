"""ssd-serve drafts from earlier requests by default (--draft-source fused+suffix; docs/serving.md):
a real server on 127.0.0.1, real HTTP clients; answers stay the generator's, a request can opt
out, the cache can be reset, and a bad budget is refused at start."""
from __future__ import annotations

import logging

import httpx
import pytest

pytest.importorskip("fastapi", reason="ssd-serve needs the serve extra: pip install '.[serve]'")

from serve_util import ServerProcess  # noqa: E402

from ssd_runtime import Generator  # noqa: E402

PROMPT = "def read_config(path):"


@pytest.fixture(scope="module")
def bundle(bundle_factory):
    return bundle_factory("llama", "llama_cut")


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    srv = ServerProcess(bundle, tmp_path_factory.mktemp("serve-suffix") / "server.log",
                        "--model-name", "tiny", "--threads", "1", "--k", "4")
    yield srv
    srv.stop()


def _complete(server, prompt: str = PROMPT, **extra) -> dict:
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0,
                         **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_repeated_request_drafts_from_the_first_and_answers_the_same(server, bundle):
    want = Generator.load(bundle).generate(PROMPT, max_new_tokens=40, k=0).text
    assert httpx.post(f"{server.url}/reset_suffix_cache").json()["status"] == "ok"
    first = _complete(server)
    second = _complete(server)
    assert first["choices"][0]["text"] == second["choices"][0]["text"] == want
    assert first["speculative"]["earlier_drafted"] == 0       # nothing earlier yet
    spec = second["speculative"]
    assert spec["earlier_drafted"] > 0 and spec["earlier_accepted"] > 0
    assert spec["earlier_drafted"] <= spec["lookup_drafted"] <= spec["drafted"]
    # opted out: drafts nothing from it (and adds nothing to it)
    out = _complete(server, suffix_drafts=False)
    assert out["choices"][0]["text"] == want and out["speculative"]["earlier_drafted"] == 0
    # reset: forgets both earlier requests (the opted-out one was never added)
    reset = httpx.post(f"{server.url}/reset_suffix_cache").json()
    assert reset == {"status": "ok", "forgotten_requests": 2}
    assert _complete(server)["speculative"]["earlier_drafted"] == 0


def test_a_bad_suffix_field_is_a_400(server):
    r = httpx.post(f"{server.url}/v1/completions", timeout=60,
                   json={"model": "tiny", "prompt": PROMPT, "suffix_drafts": "no"})
    assert r.status_code == 400 and "suffix_drafts" in r.text


@pytest.mark.parametrize("args,message", [
    (["--suffix-cache-mb", "-1"], "--suffix-cache-mb -1.0 must be 0 or more"),
    (["--draft-source", "ngram"], "invalid choice: 'ngram'"),
])
def test_bad_suffix_settings_are_refused_at_start(bundle, capsys, args, message):
    from ssd_runtime.serve.cli import main

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        if "invalid choice" in message:                  # argparse's own refusal
            with pytest.raises(SystemExit):
                main([str(bundle), *args])
        else:
            assert main([str(bundle), *args]) == 2
    finally:
        root.handlers[:], root.level = handlers, level
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err



def test_one_api_keys_text_never_drafts_anothers_requests(bundle, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-alice-0123456789\nsk-bob-9876543210\n")
    srv = ServerProcess(bundle, tmp_path / "server.log", "--model-name", "tiny", "--threads",
                        "1", "--k", "4", "--api-key-file", str(keys))
    try:
        def ask(key: str, prompt: str = PROMPT) -> dict:
            r = httpx.post(f"{srv.url}/v1/completions", timeout=60,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"model": "tiny", "prompt": prompt, "max_tokens": 40,
                                 "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()

        alice, bob = "sk-alice-0123456789", "sk-bob-9876543210"
        first = ask(alice)
        assert ask(alice)["speculative"]["earlier_drafted"] > 0       # its own earlier text
        mine = ask(bob)                                                # alice's is not bob's
        assert mine["speculative"]["earlier_drafted"] == 0
        assert mine["choices"][0]["text"] == first["choices"][0]["text"]
        assert ask(bob)["speculative"]["earlier_drafted"] > 0
        # without a key nothing is done, reset included; with one, only its own is forgotten
        r = httpx.post(f"{srv.url}/reset_suffix_cache")
        assert r.status_code == 401
        r = httpx.post(f"{srv.url}/reset_suffix_cache",
                       headers={"Authorization": f"Bearer {alice}"})
        assert r.json() == {"status": "ok", "forgotten_requests": 2}
        assert ask(alice)["speculative"]["earlier_drafted"] == 0
        assert ask(bob)["speculative"]["earlier_drafted"] > 0
        log = (tmp_path / "server.log").read_text()
        assert alice not in log and bob not in log
    finally:
        srv.stop()
