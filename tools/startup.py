"""Start-up time of a bundle: `Generator.load` by stage, then the first k="auto" call's
calibration, each in a fresh process (a new user's start, with the file pages cached).

    python tools/startup.py /tmp/b135 --repeats 5             # a fresh cache, then warm loads
    python tools/startup.py /tmp/b135 --repeats 5 --cold      # every load with an empty cache

Stages: `verify` (the files' checksums), `sessions` (ONNX Runtime sessions opened: graph
optimisation and weight packing), `threads` (timing 1 against every core, when threads are
chosen), `rest` (the tokenizer, arenas, imports of the runtime), and `calibrate` (the c and
v(k) of docs/design.md §6, on the first k="auto" call). The first run of a series starts
from an empty cache (the cache dir is a temporary folder); the figures to read are the
median and the range of the runs after it. Works on runtimes from before the cache too.
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

STAGES = ("load", "verify", "sessions", "threads", "rest", "calibrate")

_CHILD = r"""
import json, sys, time
from ssd_runtime import manifest as M, generator as G
import ssd_runtime.backends as B
from ssd_runtime.backends import ort as O
spent = {"verify": 0.0, "sessions": 0.0, "threads": 0.0}
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
timed(B, "_fastest", "threads")
t0 = time.perf_counter()
gen = G.Generator.load(sys.argv[1], backend="cpu")
spent["load"] = time.perf_counter() - t0
spent["rest"] = spent["load"] - spent["verify"] - spent["sessions"] - spent["threads"]
t0 = time.perf_counter()
gen.cost_model()
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
    args = p.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
