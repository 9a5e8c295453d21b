"""Load test of ssd-serve: concurrent streaming clients, per configuration, against the roofline.

For each server configuration (`--config NAME:ARGS`, ARGS passed to ssd-serve as they are, e.g.
"batched-auto:--max-batch 16 --k auto") this starts `python -m ssd_runtime.serve.cli BUNDLE`
on a free 127.0.0.1 port (our --host/--port/--model-name come after ARGS and win), waits for
/health, sends --warmup requests, then for each --concurrency C runs C clients at once in one
asyncio loop with the `openai` package (AsyncOpenAI, base_url http://127.0.0.1:PORT/v1). Each
client sends completions back to back: greedy (temperature 0), streamed with
stream_options.include_usage, --max-tokens each (ignore_eos unless --stop-at-eos, so that
every request asks for the same work), prompts taken in turn from --prompts (JSONL with a
"prompt" per line, or plain text, one prompt a line) or a built-in list; until it has sent
--requests-per-client requests or --duration seconds have passed since the level began
(whichever comes first; every request is also bounded by --request-timeout). The server is
then stopped (SIGINT, then SIGKILL of the process group this script started).

Per request: TTFT (sending to the first chunk with text), the gaps between chunks with text
(ITL; a speculative round may stream several tokens in one chunk, so this is per chunk, not
per token), TPOT ((last chunk - first chunk) / (tokens - 1)) and the tokens, counted by the
final usage chunk. Per level: output tokens/s = all requests' tokens / (end of the last
request - start of the level); p50/p95 of TTFT, ITL and TPOT over all requests; this
process's CPU time (the clients share the machine's cores with the server: on a 2-core
machine they are not free, and `client cpu` says how much they took).

Machine probe (once, before any server, unless --skip-probe; threadpoolctl reports the BLAS
library and its threads and limits them for the 1-thread runs, if it is installed;
OPENBLAS_CORETYPE is reported, never changed):
  GEMM peak   numpy float32 matmul of --probe-gemm N x N (default 1024), best of 5,
              2 N^3 / s, on 1 BLAS thread and on the BLAS default; the peak is the best.
  bandwidth   the sum of a --probe-mib MiB float32 array (default 256), best of 5, in 1 thread
              and split over one thread per core (numpy's reductions release the GIL): bytes
              read / s, the best. A copy (bytes read + written / s) is reported beside it.

What each configuration moves, estimated per level from the bundle's manifest.json and the
difference of the server's /metrics counters over the level (generated G, drafted D,
accepted A, prompt tokens P; N requests):
  rounds        R = G - A (each round emits its accepted drafts plus the target's token; the
                last round of a request cut at max_tokens emits fewer, so R is a slight
                underestimate), or a server counter of rounds if it exposes one
                (ssd_rounds_total).
  target tokens T = P + D + R: the prefill, and each round verifies [last, d1..dk] (k+1 rows).
  draft tokens  D + P when D > 0 (its prefill, one row per drafted token; its first step of a
                round may take one more row: up to R more), else 0.
  FLOPs         2 * parameters * tokens for each model (the manifest's "parameters"). The
                attention over the context (about 4 * layers * context * heads * head_dim
                per token: ~10% more for the demo target at a few hundred positions) is left
                out, and so is the embedding lookup, which is no GEMM (with tied embeddings,
                as in the demo pair, the LM head's GEMM uses that matrix, so 2 * parameters
                is about right; untied, it overstates by 2 * vocab * hidden per token).
  weight bytes  per forward call, the bytes of the model's files in the bundle (model.onnx
                and its external data: what the graph holds, int8/int4 weights included, and
                every weight is read once per call), times the calls: target calls = the
                server's rounds of the batch when /metrics has a batch-size histogram (a
                metric with "batch" in its name: its _count), else R + N (one call per
                round and one prefill per request: a server that serves one sequence at a
                time; for a batching server without such a metric this overstates the bytes);
                draft calls = D + N when D > 0 (one per drafted token and a prefill), else 0.
  roofline      achieved GFLOP/s / GEMM peak and achieved GB/s / bandwidth. Weights that fit
                in the caches (the demo draft, 2 MB) are not read from memory each call, so
                for small models the GB/s column is an upper bound of the DRAM traffic.
When /metrics cannot be read, the estimate falls back to the clients' output tokens (one
target row and one call per output token) and the row's `basis` says so.

    python tools/load.py BUNDLE --config "k0:--k 0" --config "auto:--k auto" \\
        [--concurrency 1,2,4,8,16] [--max-tokens 128] [--requests-per-client N] [--duration S]
        [--prompts FILE] [--warmup 2] [--skip-probe] [--json OUT] [--workdir DIR]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROMPTS = [
    "def read_config(path):\n    \"\"\"Read a JSON configuration file and return a dict.\"\"\"\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser(description=",
    "try:\n    import json\nexcept ImportError:\n",
    "class Timer:\n    \"\"\"A context manager that measures elapsed time.\"\"\"\n\n",
    "def merge_sorted(a, b):\n    result = []\n    i = j = 0\n",
]
MODEL_NAME = "load"


# ---------------------------------------------------------------- machine probe

def probe_machine(gemm_n: int, mib: int) -> dict:
    import numpy as np

    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        threadpool_info = threadpool_limits = None
    cores = os.cpu_count() or 1
    out: dict = {"cores": cores, "loadavg_before": os.getloadavg()[0],
                 "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
                 "blas": None, "gemm_n": gemm_n, "gemm_gflops": {}, "read_gbs": {},
                 "copy_gbs": None}
    if threadpool_info is not None:
        out["blas"] = [{k: i.get(k) for k in ("internal_api", "version", "num_threads",
                                               "architecture", "threading_layer")}
                       for i in threadpool_info() if i.get("user_api") == "blas"]
    else:
        out["blas"] = "threadpoolctl not installed: BLAS threads left at numpy's default"

    rng = np.random.default_rng(0)
    a = rng.standard_normal((gemm_n, gemm_n), dtype=np.float32)
    b = rng.standard_normal((gemm_n, gemm_n), dtype=np.float32)

    def gemm() -> float:
        a @ b
        best = min(_timed(lambda: a @ b) for _ in range(5))
        return 2 * gemm_n ** 3 / best / 1e9

    if threadpool_limits is not None:
        with threadpool_limits(limits=1, user_api="blas"):
            out["gemm_gflops"]["1"] = gemm()
    out["gemm_gflops"]["default"] = gemm()
    out["gemm_peak_gflops"] = max(out["gemm_gflops"].values())

    x = np.ones(mib * (1 << 20) // 4, dtype=np.float32)
    nbytes = x.nbytes

    def read(threads: int) -> float:
        parts = np.array_split(x, threads)
        with ThreadPoolExecutor(threads) as pool:
            def once() -> None:
                list(pool.map(np.add.reduce, parts))
            once()
            return nbytes / min(_timed(once) for _ in range(5)) / 1e9

    out["read_gbs"]["1"] = read(1)
    if cores > 1:
        out["read_gbs"][str(cores)] = read(cores)
    out["bandwidth_gbs"] = max(out["read_gbs"].values())
    y = np.empty_like(x)
    np.copyto(y, x)
    out["copy_gbs"] = 2 * nbytes / min(_timed(lambda: np.copyto(y, x)) for _ in range(3)) / 1e9
    out["probe_mib"] = mib
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------- the bundle's costs

def bundle_costs(bundle: Path) -> dict:
    """Per model: parameters, dtype/quant, and the bytes of its files (read once per call)."""
    m = json.loads((bundle / "manifest.json").read_text())
    out = {"max_context": m.get("max_context"), "max_draft": m.get("max_draft"),
           "dtype": m.get("build", {}).get("dtype", "float32")}
    for role in ("target", "draft"):
        e = m["models"][role]
        folder = str(Path(e["path"]).parent) + "/"
        files = [f for f in m.get("files", {}) if f.startswith(folder)] or [e["path"]]
        size = sum((bundle / f).stat().st_size for f in files if (bundle / f).is_file())
        data = bundle / (e["path"] + ".data")          # external data, if the manifest omits it
        if data.is_file() and (e["path"] + ".data") not in files:
            size += data.stat().st_size
        out[role] = {"parameters": int(e.get("parameters") or 0), "quant": e.get("quant", "none"),
                     "num_layers": e.get("num_layers"), "num_kv_heads": e.get("num_kv_heads"),
                     "head_dim": e.get("head_dim"), "vocab_size": e.get("vocab_size"),
                     "architecture": e.get("architecture"), "graph": e.get("graph"),
                     "weight_bytes": size}
    return out


# ---------------------------------------------------------------- the server

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, bundle: Path, extra: list[str], log: Path, startup_s: float) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.cmd = [sys.executable, "-m", "ssd_runtime.serve.cli", str(bundle), *extra,
                    "--host", "127.0.0.1", "--port", str(self.port),
                    "--model-name", MODEL_NAME, "--log-level", "warning"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(self.cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.health = self._wait(startup_s)

    def _wait(self, startup_s: float) -> dict:
        import httpx

        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ssd-serve exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                r = httpx.get(f"{self.url}/health", timeout=2)
                if r.status_code == 200:
                    return r.json()
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"ssd-serve did not answer /health in {startup_s:.0f} s "
                           f"(log {self.log}): {self.log.read_text()[-2000:]}")

    def metrics(self) -> dict[str, float] | None:
        import httpx

        try:
            text = httpx.get(f"{self.url}/metrics", timeout=10).text
        except httpx.HTTPError:
            return None
        return parse_metrics(text)

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)   # the group this script started
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: each sample name's sum over its label sets (buckets left out)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name.endswith("_bucket"):
            continue
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out


# ---------------------------------------------------------------- the clients

@dataclass
class Record:
    client: int
    prompt: int
    start: float                   # seconds from the level's start
    end: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.tokens < 2:
            return None
        return (self.end - self.start - self.ttft) / (self.tokens - 1)


async def run_level(url: str, prompts: list[str], concurrency: int, args) -> tuple[list[Record],
                                                                                     float]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="load", max_retries=0,
                         timeout=args.request_timeout)
    records: list[Record] = []
    t0 = time.perf_counter()
    extra = {} if args.stop_at_eos else {"ignore_eos": True}

    async def one(c: int, i: int) -> None:
        p = (c * args.requests_per_client + i) % len(prompts)
        rec = Record(c, p, time.perf_counter() - t0)
        records.append(rec)
        last = None
        try:
            stream = await client.completions.create(
                model=MODEL_NAME, prompt=prompts[p], max_tokens=args.max_tokens, temperature=0,
                stream=True, stream_options={"include_usage": True}, extra_body=extra)
            async for chunk in stream:
                now = time.perf_counter() - t0
                if chunk.choices:
                    choice = chunk.choices[0]
                    if choice.text:
                        if rec.ttft is None:
                            rec.ttft = now - rec.start
                        else:
                            rec.itl.append(now - last)
                        last = now
                        rec.chunks += 1
                    if choice.finish_reason:
                        rec.finish_reason = choice.finish_reason
                if chunk.usage is not None:
                    rec.tokens = chunk.usage.completion_tokens
        except Exception as exc:       # noqa: BLE001 - every failure is a row's error, not a stop
            rec.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        rec.end = (last if last is not None else time.perf_counter() - t0)

    async def worker(c: int) -> None:
        for i in range(args.requests_per_client):
            if args.duration and time.perf_counter() - t0 >= args.duration:
                break
            await one(c, i)

    await asyncio.gather(*(worker(c) for c in range(concurrency)))
    wall = time.perf_counter() - t0
    await client.close()
    return records, wall


def warm_up(url: str, prompts: list[str], args) -> None:
    import httpx

    for i in range(args.warmup):
        r = httpx.post(f"{url}/v1/completions", timeout=args.request_timeout,
                       json={"model": MODEL_NAME, "prompt": prompts[i % len(prompts)],
                             "max_tokens": args.max_tokens, "temperature": 0})
        r.raise_for_status()


# ---------------------------------------------------------------- summaries

def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarise(records: list[Record], wall: float) -> dict:
    ok = [r for r in records if r.error is None]
    tokens = sum(r.tokens for r in ok)
    span = max((r.end for r in ok), default=wall)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl]
    tpot = [t for r in ok if (t := r.tpot) is not None]
    return {"requests": len(records), "errors": len(records) - len(ok),
            "first_error": next((r.error for r in records if r.error), None),
            "output_tokens": tokens, "seconds": span, "tokens_per_s": tokens / span if span else 0,
            "ttft_p50": pct(ttft, .5), "ttft_p95": pct(ttft, .95),
            "itl_p50": pct(itl, .5), "itl_p95": pct(itl, .95),
            "tpot_p50": pct(tpot, .5), "tpot_p95": pct(tpot, .95),
            "text_chunks": sum(r.chunks for r in ok),
            "textless": sum(1 for r in ok if r.tokens and not r.chunks)}


def work_done(before: dict | None, after: dict | None, summary: dict, costs: dict) -> dict:
    """FLOPs and weight bytes the level moved (the docstring's estimate)."""
    n = summary["requests"]
    if before is None or after is None:
        g = summary["output_tokens"]
        work = {"basis": "per output token (no /metrics): one target row and call per token",
                "generated": g, "drafted": 0, "accepted": 0, "prompt_tokens": 0,
                "rounds": g, "target_tokens": g, "target_calls": g,
                "draft_tokens": 0, "draft_calls": 0}
    else:
        d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        g = d.get("ssd_generated_tokens_total", 0)
        drafted = d.get("ssd_draft_tokens_total", 0)
        accepted = d.get("ssd_accepted_tokens_total", 0)
        prompt = d.get("ssd_prompt_tokens_total", 0)
        rounds = d["ssd_rounds_total"] if "ssd_rounds_total" in d else g - accepted
        batch = sorted(k for k in d if "batch" in k and k.endswith("_count") and d[k] > 0)
        if batch:                   # a batching server counts its rounds (one call each)
            calls, basis = d[batch[0]], f"/metrics; target calls = {batch[0]}"
        else:
            calls, basis = rounds + n, "/metrics; target calls = rounds + requests (no batch metric)"
        work = {"basis": basis, "generated": g, "drafted": drafted, "accepted": accepted,
                "prompt_tokens": prompt, "rounds": rounds,
                "target_tokens": prompt + drafted + rounds, "target_calls": calls,
                "draft_tokens": drafted + prompt if drafted else 0,
                "draft_calls": drafted + n if drafted else 0}
    t, dr = costs["target"], costs["draft"]
    work["flops"] = 2 * (t["parameters"] * work["target_tokens"] +
                         dr["parameters"] * work["draft_tokens"])
    work["weight_bytes"] = t["weight_bytes"] * work["target_calls"] + \
        dr["weight_bytes"] * work["draft_calls"]
    g = work["generated"] or 1
    work["flops_per_output_token"] = work["flops"] / g
    work["bytes_per_output_token"] = work["weight_bytes"] / g
    work["accepted_per_round"] = work["accepted"] / work["rounds"] \
        if work["rounds"] and work["drafted"] else None
    return work


def roofline(work: dict, seconds: float, probe: dict | None) -> dict:
    gflops = work["flops"] / seconds / 1e9 if seconds else 0.0
    gbs = work["weight_bytes"] / seconds / 1e9 if seconds else 0.0
    out = {"gflops": gflops, "gbs": gbs, "peak_fraction": None, "bandwidth_fraction": None}
    if probe:
        out["peak_fraction"] = gflops / probe["gemm_peak_gflops"]
        out["bandwidth_fraction"] = gbs / probe["bandwidth_gbs"]
    return out


# ---------------------------------------------------------------- output

COLUMNS = [("config", "{}"), ("conc", "{}"), ("req", "{}"), ("err", "{}"), ("tokens", "{}"),
           ("tok/s", "{:.1f}"), ("TTFT p50", "{:.0f}"), ("p95", "{:.0f}"),
           ("ITL p50", "{:.1f}"), ("p95", "{:.1f}"), ("TPOT p50", "{:.1f}"),
           ("acc/rnd", "{:.2f}"), ("GFLOP/s", "{:.2f}"), ("%peak", "{:.1%}"),
           ("GB/s", "{:.2f}"), ("%bw", "{:.1%}"), ("cli cpu", "{:.0%}")]


def row(level: dict) -> list[str]:
    s, w, r = level["summary"], level["work"], level["roofline"]
    ms = lambda v: None if v is None else v * 1e3   # noqa: E731
    values = [level["config"], level["concurrency"], s["requests"], s["errors"],
              s["output_tokens"], s["tokens_per_s"], ms(s["ttft_p50"]), ms(s["ttft_p95"]),
              ms(s["itl_p50"]), ms(s["itl_p95"]), ms(s["tpot_p50"]), w["accepted_per_round"],
              r["gflops"], r["peak_fraction"], r["gbs"], r["bandwidth_fraction"],
              level["client_cpu"]]
    return ["-" if v is None else fmt.format(v) for (_, fmt), v in zip(COLUMNS, values)]


def print_table(levels: list[dict]) -> None:
    rows = [[name for name, _ in COLUMNS]] + [row(lv) for lv in levels]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for j, r in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))))
        if j == 0:
            print("  ".join("-" * w for w in widths))
    print("TTFT, ITL (per streamed chunk) and TPOT in ms; tok/s: all clients' output tokens / "
          "the level's wall time; GFLOP/s, GB/s: estimated work (see --help) per second, "
          "against the probe's GEMM peak and read bandwidth; cli cpu: this process's CPU "
          "time / wall (the clients' share of the cores).")


def print_probe(probe: dict) -> None:
    g = ", ".join(f"{k} thread(s) {v:.1f}" for k, v in probe["gemm_gflops"].items())
    b = ", ".join(f"{k} thread(s) {v:.1f}" for k, v in probe["read_gbs"].items())
    print(f"machine: {probe['cores']} cores (load average {probe['loadavg_before']:.1f} before "
          f"the probe: other work on it lowers every figure), BLAS {probe['blas']}, OPENBLAS_CORETYPE="
          f"{probe['OPENBLAS_CORETYPE']}")
    print(f"  GEMM {probe['gemm_n']}^2 float32 GFLOP/s: {g} -> peak "
          f"{probe['gemm_peak_gflops']:.1f}")
    print(f"  read {probe['probe_mib']} MiB GB/s: {b} -> bandwidth {probe['bandwidth_gbs']:.1f}; "
          f"copy {probe['copy_gbs']:.1f} GB/s (read + write)")


# ---------------------------------------------------------------- main

def parse_config(text: str) -> tuple[str, list[str]]:
    name, sep, rest = text.partition(":")
    if not sep:
        name, rest = text.strip() or "default", text
    return name.strip() or "default", shlex.split(rest)


def load_prompt_file(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            out.append(obj["prompt"] if isinstance(obj, dict) else str(obj))
        except (json.JSONDecodeError, KeyError):
            out.append(line)
    if not out:
        raise SystemExit(f"--prompts {path}: no prompts in it")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", type=Path, help="bundle folder written by ssd-export")
    p.add_argument("--config", action="append", default=[], metavar="NAME:ARGS",
                   help="a server configuration: a name, ':' and ssd-serve arguments "
                        "(repeatable; default one configuration with no arguments)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="clients at once, per level")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--requests-per-client", type=int, default=None,
                   help="requests each client sends back to back, at most (default 2; with "
                        "--duration, 10000)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds after which a client sends no new request")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL ({\"prompt\": ...} per line) or one prompt a line; default: a "
                        "built-in list of Python openings")
    p.add_argument("--stop-at-eos", action="store_true",
                   help="let requests end at EOS (default: ignore_eos, every request asks "
                        "for --max-tokens)")
    p.add_argument("--warmup", type=int, default=2, help="requests after startup, unmeasured")
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--skip-probe", action="store_true", help="no machine probe (no roofline)")
    p.add_argument("--probe-gemm", type=int, default=1024, metavar="N")
    p.add_argument("--probe-mib", type=int, default=256, metavar="MIB")
    p.add_argument("--json", type=Path, default=None, help="write everything here")
    p.add_argument("--workdir", type=Path, default=None, help="server logs (default: a temp dir)")
    args = p.parse_args(argv)

    if not (args.bundle / "manifest.json").is_file():
        p.error(f"{args.bundle} is not a bundle (no manifest.json)")
    try:
        levels_c = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        p.error(f"--concurrency {args.concurrency!r}: integers separated by commas")
    if args.requests_per_client is None:
        args.requests_per_client = 10000 if args.duration else 2
    if args.duration is not None and args.duration <= 0:
        p.error("--duration must be above 0")
    if not levels_c or min(levels_c) < 1 or args.max_tokens < 1 or args.requests_per_client < 1:
        p.error("--concurrency, --max-tokens and --requests-per-client must be 1 or more")
    configs = [parse_config(c) for c in (args.config or ["default:"])]
    if len({n for n, _ in configs}) != len(configs):
        p.error("--config names must differ")
    prompts = load_prompt_file(args.prompts) if args.prompts else PROMPTS
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ssd-load-"))
    workdir.mkdir(parents=True, exist_ok=True)

    import openai  # noqa: F401 - imported before any level, so that its import is no client CPU

    costs = bundle_costs(args.bundle)
    print(f"bundle {args.bundle}: target {costs['target']['parameters']:,} parameters "
          f"({costs['target']['weight_bytes'] / 1e6:.1f} MB, {costs['target']['quant']}), "
          f"draft {costs['draft']['parameters']:,} ({costs['draft']['weight_bytes'] / 1e6:.1f} "
          f"MB, {costs['draft']['quant']})")
    probe = None
    if not args.skip_probe:
        probe = probe_machine(args.probe_gemm, args.probe_mib)
        print_probe(probe)

    levels, servers = [], []
    for name, extra in configs:
        log = workdir / f"serve-{name.replace('/', '_')}.log"
        print(f"[{name}] ssd-serve {' '.join(map(shlex.quote, extra))} (log {log})", flush=True)
        t_start = time.perf_counter()
        try:
            server = Server(args.bundle, extra, log, args.startup_timeout)
        except RuntimeError as exc:
            print(f"[{name}] FAILED to start: {exc}", file=sys.stderr)
            servers.append({"config": name, "args": extra, "error": str(exc)})
            continue
        info = {"config": name, "args": extra, "health": server.health, "cmd": server.cmd,
                "startup_s": time.perf_counter() - t_start}
        try:
            warm_up(server.url, prompts, args)
            for c in levels_c:
                before = server.metrics()
                cpu0 = time.process_time()
                records, wall = asyncio.run(run_level(server.url, prompts, c, args))
                cpu = time.process_time() - cpu0
                after = server.metrics()
                summary = summarise(records, wall)
                work = work_done(before, after, summary, costs)
                level = {"config": name, "concurrency": c, "summary": summary, "work": work,
                         "roofline": roofline(work, summary["seconds"], probe),
                         "client_cpu": cpu / wall if wall else None,
                         "records": [asdict(r) for r in records]}
                levels.append(level)
                print("  " + "  ".join(row(level)), flush=True)
                if summary["textless"]:
                    print(f"  {summary['textless']} requests streamed tokens but no text (ids "
                          f"past the tokenizer?): no TTFT or ITL for them")
                if summary["errors"]:
                    print(f"  {summary['errors']} errors, first: {summary['first_error']}")
        except Exception as exc:       # noqa: BLE001 - report, stop this server, go on
            import traceback

            traceback.print_exc()
            print(f"[{name}] FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            info["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            server.stop()
        servers.append(info)

    print()
    if probe:
        print_probe(probe)
    print_table(levels)
    if args.json:
        args.json.write_text(json.dumps({
            "bundle": str(args.bundle), "costs": costs, "probe": probe, "servers": servers,
            "levels": levels, "settings": {k: str(v) if isinstance(v, Path) else v
                                           for k, v in vars(args).items()},
            "prompts": prompts}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if levels and not any(s.get("error") for s in servers) else 1


if __name__ == "__main__":
    sys.exit(main())
