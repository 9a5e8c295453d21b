"""The runtime's default thread placement against fixed ones, after a first load made beside a
busy process and after an idle one (issue 47; docs/performance.md, "Thread placement").

    python tools/placement_check.py /tmp/demo47 --json /tmp/placement.json

For each scenario: an empty runtime cache ($SSD_CACHE_DIR, a temporary folder), a first load
(`Generator.load`, threads chosen by the runtime) with --busy-cores processes spinning beside
it ("busy") or none ("idle"), the spinners stopped; then one `ssd-bench` run (its `run_bench`)
of k=0 and k=auto at the default placement (what a user's next load gets: remembered, or timed
again) and at each of --threads, interleaved prompt by prompt. Reports each row's tokens/s and
the default's over the best fixed placement's, per k.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SPIN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle")
    p.add_argument("--threads", default=None,
                   help="fixed placements to compare, e.g. 1:1,2:1,2:2 (default: 1:1, C:1 and "
                        "C:C for the C cores this process may use)")
    p.add_argument("--scenarios", default="busy,idle", help="comma-separated: busy, idle")
    p.add_argument("--busy-cores", type=int, default=1,
                   help="processes spinning beside the busy first load (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompts", default=None, help="JSONL prompts (default: ssd-bench's)")
    p.add_argument("--json", dest="json_out", help="write the report here")
    args = p.parse_args(argv)

    from ssd_runtime import Generator, cache
    from ssd_runtime.bench import Config, load_prompts, run_bench
    from ssd_runtime.machine import Busy, cpu_cores

    cores = cpu_cores()
    fixed = [tuple(int(n) for n in t.split(":")) for t in args.threads.split(",")] \
        if args.threads else list(dict.fromkeys([(1, 1), (cores, 1), (cores, cores)]))
    configs = [Config(k, "sequential", t, "fused" if k else "model")
               for t in [None, *fixed] for k in (0, "auto")]
    prompts = load_prompts(args.prompts)
    report = {"bundle": args.bundle, "cores": cores, "busy_cores": args.busy_cores,
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "prompts": len(prompts), "scenarios": []}
    for scenario in args.scenarios.split(","):
        os.environ[cache.ENV] = tempfile.mkdtemp(prefix=f"ssd-placement-{scenario}-")
        spinners = [subprocess.Popen([sys.executable, "-c", SPIN.format(s=120)])
                    for _ in range(args.busy_cores if scenario == "busy" else 0)]
        try:
            time.sleep(0.3 if spinners else 0)
            watch = Busy()
            t0 = time.perf_counter()
            first = Generator.load(args.bundle, backend="cpu").placement
            first_s = time.perf_counter() - t0
            busy_first = watch.cores()
        finally:
            for s in spinners:
                s.kill()
                s.wait()
        watch = Busy()
        t0 = time.perf_counter()
        bench = run_bench(args.bundle, configs, prompts, args.max_new_tokens, 0.0,
                          args.repeats, backend="cpu")
        row = {"scenario": scenario, "first_load": first.as_dict(), "first_load_s": first_s,
               "busy_cores_first_load": busy_first, "bench_s": time.perf_counter() - t0,
               "busy_cores_bench": watch.cores(),
               "default_at_bench": bench["placements"]["default sequential"],
               "results": [{"config": r["config"], "k": r["k"], "threads": r["threads"],
                            "default": r["default_placement"],
                            "tokens_per_s": r["tokens_per_s"]} for r in bench["results"]]}
        for k in (0, "auto"):
            rows = [r for r in row["results"] if r["k"] == k]
            default = next(r for r in rows if r["default"])["tokens_per_s"]
            best = max(r["tokens_per_s"] for r in rows if not r["default"])
            row[f"default_over_best_k{k}"] = default / best
        report["scenarios"].append(row)
        print(_format(row), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


def _format(row: dict) -> str:
    lines = [f"== {row['scenario']} first load: {row['first_load']['described']} "
             f"({row['first_load_s']:.1f} s; {_cores(row['busy_cores_first_load'])} cores busy "
             f"elsewhere meanwhile)",
             f"   the bench's load (the next one): {row['default_at_bench']['described']}; "
             f"bench {row['bench_s']:.0f} s, {_cores(row['busy_cores_bench'])} cores busy "
             f"elsewhere meanwhile"]
    for r in row["results"]:
        lines.append(f"   {r['config']:<48} {r['tokens_per_s']:8.1f} tok/s")
    lines.append(f"   default / best fixed: k=0 {row['default_over_best_k0']:.3f}, "
                 f"k=auto {row['default_over_best_kauto']:.3f}")
    return "\n".join(lines)


def _cores(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


if __name__ == "__main__":
    sys.exit(main())
