"""Helpers for the ssd-serve tests: a server subprocess on loopback, a templated bundle copy."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

# A small ChatML-like template that uses the variables Hugging Face templates use.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_chat_template(bundle: Path, dest: Path, template: str = CHAT_TEMPLATE) -> Path:
    """A copy of `bundle` whose manifest carries a chat template (manifest.json has no checksum)."""
    if not dest.exists():
        shutil.copytree(bundle, dest)
        manifest = json.loads((dest / "manifest.json").read_text())
        manifest["tokenizer"]["chat_template"] = template
        (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dest


class ServerProcess:
    """`python -m ssd_runtime.serve.cli BUNDLE --port P ...` on 127.0.0.1, output to a log file."""

    def __init__(self, bundle: Path, log: Path, *args: str, startup_s: float = 120.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "ssd_runtime.serve.cli", str(bundle), "--host", "127.0.0.1",
               "--port", str(self.port), "--log-level", "warning", *args]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self._wait_ready(startup_s)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS line")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5).json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGINT (a clean shutdown, Ray included), then kill our own process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # the group this test started, nothing else
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def _wait_ready(self, startup_s: float) -> None:
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ssd-serve exited ({self.proc.returncode}):\n"
                                   f"{self.log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"ssd-serve did not answer /health in {startup_s} s:\n"
                           f"{self.log.read_text()[-4000:]}")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


class GatedRounds:
    """A server's engine whose decode rounds each wait for a permit (its batch's loop): the test
    decides when a generation advances. Counts the rounds run and notes a cancelled sequence."""

    def __init__(self, server) -> None:
        batch = server.engine.batch
        self.manifest_root = server.generator.root
        self.permits = threading.Semaphore(0)
        self.closed = threading.Event()
        self.taken = 0
        loop_round, cancel = batch.loop.round, batch.cancel

        def gated_round(*args, **kwargs):
            self.permits.acquire(timeout=30)
            self.taken += 1
            return loop_round(*args, **kwargs)

        def noted_cancel(seq_id: int) -> bool:
            found = cancel(seq_id)
            if found:
                self.closed.set()
            return found

        batch.loop.round, batch.cancel = gated_round, noted_cancel


class ThreadedServer:
    """uvicorn serving `app` on 127.0.0.1 in a thread of this process."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.server.started, "uvicorn did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=5).json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=5).text
