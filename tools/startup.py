"""Start-up time of a bundle: `Generator.load` by stage, then the first k="auto" call's
calibration, each in a fresh process (a new user's start, with the file pages cached).

    python tools/startup.py /tmp/b135 --repeats 5             # a fresh cache, then warm loads
    python tools/startup.py /tmp/b135 --repeats 5 --cold      # every load with an empty cache
    python tools/startup.py /tmp/b135 --bench-prompts 3       # ssd-bench's calibrations' share
    python tools/startup.py /tmp/b135 --sessions 5            # what opening the target costs

Stages: `import` (the runtime and onnxruntime, before the load), `load` and in it `verify`
(the files' checksums), `sessions` (ONNX Runtime sessions opened: graph optimisation and
weight packing), `threads` (timing 1 against every core, when threads are chosen) and `rest`
(the tokenizer, arenas); then `calibrate` (the c and v(k) of docs/design.md §6, on the first
k="auto" call). The first run of a series starts
from an empty cache (the cache dir is a temporary folder); the figures to read are the
median and the range of the runs after it. Works on runtimes from before the cache too.
`--bench-prompts N` instead runs ssd-bench's loop (k=0,4,auto at 2:1 threads, 128 new
tokens, the first N default prompts, one repeat) twice, its per-prompt calibrations of nine
timed passes and of one, and says what share of the run they took. `--sessions N` opens
the target's session N times each way, interleaved: as the runtime does, without graph
optimisation, without weight prepacking, and from the graph ONNX Runtime saves optimised
(`optimized_model_filepath`, written once to a temporary folder); then it times a
verification of 9 tokens at past length 128 with and without the prepacked weights.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STAGES = ("import", "load", "verify", "sessions", "threads", "rest", "calibrate")

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import onnxruntime
from ssd_runtime import manifest as M, generator as G
import ssd_runtime.backends as B
from ssd_runtime.backends import ort as O
spent = {"import": time.perf_counter() - t0, "verify": 0.0, "sessions": 0.0, "threads": 0.0}
def timed(owner, name, stage):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[stage] += time.perf_counter() - t0
    setattr(owner, name, wrapper)
timed(M, "verify_files", "verify")
timed(O.OrtCpuSession, "_open", "sessions")
timed(B, "fastest", "threads")
t0 = time.perf_counter()
gen = G.Generator.load(sys.argv[1], backend="cpu")
spent["load"] = time.perf_counter() - t0
spent["rest"] = spent["load"] - spent["verify"] - spent["sessions"] - spent["threads"]
t0 = time.perf_counter()
gen.knowledge.cost_model()
spent["calibrate"] = time.perf_counter() - t0
spent["chosen_threads"] = f"{gen.target.threads}:{gen.draft.threads}"
print(json.dumps(spent))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--repeats", type=int, default=5, help="loads after the first")
    p.add_argument("--cold", action="store_true", help="empty the cache before every load")
    p.add_argument("--json", help="write the runs here")
    p.add_argument("--bench-prompts", type=int, default=0, metavar="N",
                   help="time ssd-bench's calibrations on N prompts instead")
    p.add_argument("--sessions", type=int, default=0, metavar="N",
                   help="time opening the target's session N times each way instead")
    args = p.parse_args(argv)
    if args.sessions:
        return sessions(args.bundle, args.sessions)
    if args.bench_prompts:
        for passes in (9, 1):
            run, calibrating = bench_share(args.bundle, args.bench_prompts, passes)
            print(f"calibrations of {passes} timed passes: {calibrating:.1f} s of a {run:.1f} s "
                  f"run ({calibrating / run:.0%})", flush=True)
        return 0
    cache = tempfile.mkdtemp(prefix="ssd-startup-cache-")
    env = {**os.environ, "SSD_CACHE_DIR": cache}
    runs = []
    try:
        for i in range(args.repeats + 1):
            if args.cold:
                shutil.rmtree(cache, ignore_errors=True)
            out = subprocess.run([sys.executable, "-c", _CHILD, args.bundle], env=env,
                                 capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(("first " if i == 0 else f"run {i} ") + "  ".join(
                f"{s} {runs[-1][s]:.2f}" for s in STAGES) + f"  threads {runs[-1]['chosen_threads']}",
                flush=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    later = runs[1:]
    print("after the first, median (min-max) s: " + "  ".join(
        f"{s} {statistics.median(r[s] for r in later):.2f} "
        f"({min(r[s] for r in later):.2f}-{max(r[s] for r in later):.2f})" for s in STAGES))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"bundle": args.bundle, "cold": args.cold, "runs": runs}, fh, indent=2)
    return 0


def sessions(bundle: str, repeats: int) -> int:
    import onnxruntime as ort

    from ssd_runtime.backends.ort import session_options
    from ssd_runtime.manifest import read_manifest

    model = os.path.join(bundle, read_manifest(bundle, verify=False).target.path)
    saved = tempfile.mkdtemp(prefix="ssd-optimised-")

    def options(way: str):
        opts = session_options(1)
        if way == "no graph optimisation":
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        elif way == "no weight prepacking":
            opts.add_session_config_entry("session.disable_prepacking", "1")
        elif way == "save the optimised graph":
            opts.optimized_model_filepath = os.path.join(saved, "model.onnx")
            opts.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", "model.onnx.data")
        elif way == "from the saved graph":
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return opts

    def opened(way: str) -> float:
        path = os.path.join(saved, "model.onnx") if way == "from the saved graph" else model
        t0 = time.perf_counter()
        ort.InferenceSession(path, options(way), providers=["CPUExecutionProvider"])
        return time.perf_counter() - t0

    try:
        print(f"save the optimised graph: {opened('save the optimised graph'):.2f} s, "
              f"{sum(f.stat().st_size for f in os.scandir(saved)) / 1e6:.0f} MB")
        ways = ("as the runtime opens it", "no graph optimisation", "no weight prepacking",
                "from the saved graph")
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(repeats):
            for way in ways:
                times[way].append(opened(way))
        for way, spent in times.items():
            print(f"{way}: median {statistics.median(spent):.2f} s "
                  f"({min(spent):.2f}-{max(spent):.2f})")
        verify = {way: verify_times(bundle, options(way), repeats)
                  for way in ("as the runtime opens it", "no weight prepacking")}
        for way, spent in verify.items():
            print(f"{way}: a verification of 9 tokens takes {1e3 * statistics.median(spent):.0f} "
                  f"ms ({1e3 * min(spent):.0f}-{1e3 * max(spent):.0f})")
    finally:
        shutil.rmtree(saved, ignore_errors=True)
    return 0


def verify_times(bundle: str, options, repeats: int) -> list[float]:
    """Seconds of target passes of 9 tokens at past length 128, in a session opened so."""
    from pathlib import Path

    import numpy as np
    import onnxruntime as ort

    from ssd_runtime.backends.ort import OrtCpuSession
    from ssd_runtime.manifest import read_manifest

    class Opened(OrtCpuSession):
        def _open(self, path, threads):
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    m = read_manifest(bundle, verify=False)
    target = Opened("target", Path(bundle) / m.target.path, m.target, m.max_context,
                    m.max_draft + 2, 1)
    target.prefill(np.zeros(128, np.int64))
    spent = []
    for _ in range(repeats + 1):                     # the first warms up
        t0 = time.perf_counter()
        target.forward(np.zeros(9, np.int64), 128)
        spent.append(time.perf_counter() - t0)
    return spent[1:]


def bench_share(bundle: str, prompts: int, passes: int) -> tuple[float, float]:
    """Seconds of ssd-bench's loop and of its per-prompt calibrations at `passes` each."""
    from ssd_runtime import bench, bench_run

    calibrate, spent = bench_run.calibrate, [0.0]

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return calibrate(*args, **{**kwargs, "repeats": passes})
        finally:
            spent[0] += time.perf_counter() - t0
    bench_run.calibrate = timed
    try:
        configs = [bench.Config(k, "sequential", (2, 1)) for k in (0, 4, "auto")]
        t0 = time.perf_counter()
        bench.run_bench(bundle, configs, bench.load_prompts(None)[:prompts], 128, 0.0, 1, "cpu")
        return time.perf_counter() - t0, spent[0]
    finally:
        bench_run.calibrate = calibrate


if __name__ == "__main__":
    sys.exit(main())
