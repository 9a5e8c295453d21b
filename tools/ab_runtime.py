"""Two versions of the runtime side by side on one bundle: tokens/s of each k, alternated.

    python tools/ab_runtime.py BUNDLE --old SRC [--k 0,auto] [--batch 1,8] [--rounds 3]
                               [--prompts FILE.jsonl] [--max-new-tokens 128] [--threads 2:1]
                               [--mode sequential|split] [--json OUT]

SRC is another checkout's `runtime/` folder (e.g. `git worktree add /tmp/old REF` and
`--old /tmp/old/runtime`): each round runs the old and the new runtime in fresh processes,
one after the other in alternating order, over the same prompts, and reports per version and
configuration the tokens/s of every round, their median and the new/old ratio per round.
Batch 1 is `Generator.generate` per prompt; batch B > 1 is `generate_batch` over the
prompts, B at a time. Greedy; every version's tokens are compared (they must be equal).
Threads are fixed (--threads) so that both run the same placement.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, sys, time
spec = json.loads(sys.argv[1])
if spec["src"]:
    sys.path.insert(0, spec["src"])
from ssd_runtime import Generator
t, d = (int(x) for x in spec["threads"].split(":"))
batch = max(spec["batch"])
gen = Generator.load(spec["bundle"], threads=(t, d), max_batch=batch, mode=spec["mode"])
prompts = spec["prompts"]
n = spec["max_new_tokens"]
out = {}
for k in spec["k"]:
    k = k if k == "auto" else int(k)
    gen.generate(prompts[0], max_new_tokens=16, k=k)           # warm up, calibrate
    for b in spec["batch"]:
        tokens, ids = 0, []
        t0 = time.perf_counter()
        if b == 1:
            for p in prompts:
                r = gen.generate(p, max_new_tokens=n, k=k)
                tokens += len(r.token_ids); ids.append(r.token_ids)
        else:
            for i in range(0, len(prompts), b):
                for r in gen.generate_batch(prompts[i:i + b], max_new_tokens=n, k=k):
                    tokens += len(r.token_ids); ids.append(r.token_ids)
        out[f"k={k} batch={b}"] = {"tokens_per_s": tokens / (time.perf_counter() - t0),
                                   "ids": ids}
print(json.dumps(out))
"""


def run(version: str, src: str | None, args, prompts) -> dict:
    spec = {"src": src, "bundle": str(args.bundle), "threads": args.threads,
            "batch": args.batch, "k": args.k, "prompts": prompts,
            "max_new_tokens": args.max_new_tokens, "mode": args.mode}
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True,
                          text=True, env=env, cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(f"{version} runtime failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--old", required=True, type=Path, help="the other checkout's runtime/")
    p.add_argument("--k", default="0,auto")
    p.add_argument("--batch", default="1")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=Path, default=HERE.parent / "runtime/data/bench_prompts.jsonl")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", default="2:1")
    p.add_argument("--mode", default="sequential", choices=["sequential", "split"])
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    args.k = args.k.split(",")
    args.batch = [int(b) for b in args.batch.split(",")]
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    prompts = [r["prompt"] if isinstance(r, dict) else r for r in rows][:args.num_prompts]
    old_pkg = Path(tempfile.mkdtemp(prefix="ab-old-"))
    (old_pkg / "ssd_runtime").symlink_to(args.old.resolve())
    results: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    for r in range(args.rounds):
        order = [("old", str(old_pkg)), ("new", None)]
        for version, src in (order if r % 2 == 0 else order[::-1]):
            got = run(version, src, args, prompts)
            for config, res in got.items():
                results[version].setdefault(config, []).append(res["tokens_per_s"])
                results[version].setdefault(config + " ids", res["ids"])
                assert results[version][config + " ids"] == res["ids"], "not deterministic"
    report = {}
    print(f"{'config':<22} {'old tok/s (median)':>20} {'new tok/s (median)':>20} "
          f"{'new/old per round':>28}")
    for config in results["new"]:
        if config.endswith(" ids"):
            continue
        old, new = results["old"][config], results["new"][config]
        ratios = [n / o for n, o in zip(new, old)]
        same = results["old"][config + " ids"] == results["new"][config + " ids"]
        report[config] = {"old": old, "new": new, "ratios": ratios, "same_tokens": same}
        print(f"{config:<22} {statistics.median(old):>20.1f} {statistics.median(new):>20.1f} "
              f"{' '.join(f'{x:.3f}' for x in ratios):>28}" + ("" if same else "  TOKENS DIFFER"))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
