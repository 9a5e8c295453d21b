"""`ssd-bench`: speed of every configuration side by side, against k = 0.

Configurations (k × mode × thread placement) are interleaved prompt by
prompt so that machine noise hits them alike; the report gives tokens/s,
speed-up, α, c, v(k), the analytic bound and the efficiency measured/bound.
Unless --threads names placements, each mode runs at the placement the runtime
picks by itself (remembered, or timed at this load), so the figures are a user's.
This module is the CLI (arguments, prompts, the table, the plot); bench_run.py runs and measures.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import resources
from pathlib import Path

from .bench_run import Config, run_bench
from .errors import ConfigError, cli_main
from .round.lookup import DRAFT_SOURCES


def load_prompts(path: str | None) -> list[str]:
    try:
        text = Path(path).read_text() if path else \
            resources.files("ssd_runtime").joinpath("data/bench_prompts.jsonl").read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"--prompts {path}: cannot read it ({why}). ---> HINT: pass a JSONL "
                          f"file with one {{\"prompt\": ...}} object per line.") from None
    prompts = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                prompt = json.loads(line)["prompt"]
            except (json.JSONDecodeError, KeyError, TypeError):
                prompt = None
            if not isinstance(prompt, str):      # checked here, not after the models load
                raise ConfigError(f"{path}:{i}: expected a JSON object with a \"prompt\" "
                                  f"string per line.") from None
            prompts.append(prompt)
    if not prompts:
        raise ConfigError(f"{path}: no prompts.")
    return prompts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ssd-bench", description="Benchmark a bundle: every k and "
                                "mode side by side against k=0 on the same runtime.")
    p.add_argument("bundle")
    p.add_argument("--prompts", help="JSONL file, one {\"prompt\": ...} per line "
                   "(default: the shipped code prompts)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--k", default="0,1,2,4,8,auto", help="comma-separated ks and/or auto")
    p.add_argument("--mode", default="sequential", help="comma-separated: sequential,split")
    p.add_argument("--draft-source", default="fused",
                   help="comma-separated: fused (lookup where it pays, the draft model "
                        "elsewhere), model, lookup, suffix (lookup with the text of the run's "
                        "earlier prompts of that configuration), fused+suffix (docs/runtime.md)")
    p.add_argument("--threads", default=None,
                   help="comma-separated target:draft placements, and/or 'default' (the "
                        "runtime's own choice, remembered or timed at load; what runs when "
                        "--threads is not given)")
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda", "trt"),
                   help="auto: trt, then cuda, then cpu (the report says which and why)")
    p.add_argument("--draft-backend", default=None, choices=("cpu", "cuda", "trt"),
                   help="the draft's backend where it differs: cpu beside a cuda or trt target")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--coupling", choices=("rejection", "invariant"), default="rejection",
                   help="sampled runs: the rule an unseeded request gets (rejection), or the "
                        "seeded default (invariant); each prompt has its own seed either way")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--recalibrate", action="store_true",
                   help="time the threads and k=auto's calibration again instead of taking "
                        "what earlier runs remembered (docs/runtime.md)")
    p.add_argument("--json", dest="json_out", help="write the report here")
    p.add_argument("--plot", help="write a PNG of speed-up vs k (needs matplotlib)")
    return p


@cli_main("ssd-bench")
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configs = _configs(args)
    prompts = load_prompts(args.prompts)
    for flag, path in (("--json", args.json_out), ("--plot", args.plot)):
        if path:                          # before a run of minutes, not after it
            _writable(flag, path)
    if args.plot:
        _plot_format(args.plot)
    report = run_bench(args.bundle, configs, prompts, args.max_new_tokens,
                       args.temperature, args.repeats, args.backend, args.coupling,
                       args.recalibrate, args.draft_backend)
    print(format_table(report))
    if args.json_out:                     # whole or not at all: a temporary file, renamed
        tmp = Path(f"{args.json_out}.tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(args.json_out)
    if args.plot:
        plot(report, args.plot)
    return 0


def _writable(flag: str, name: str) -> None:
    """Make the output's folder and try a file there (os.access says yes to root even where
    nothing can be written, as in /proc); say clearly when the output cannot be written."""
    path = Path(name)
    if name.endswith(("/", os.sep)) or path.is_dir():
        raise ConfigError(f"{flag} {name}: is a folder; give a file name.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".{path.name}.{os.getpid()}.probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{flag} {name}: cannot be written there "
                          f"({exc.strerror or exc}).") from None


# what matplotlib's Agg canvas writes, by extension (it infers the format from the name)
PLOT_FORMATS = ("avif", "eps", "jpeg", "jpg", "pdf", "pgf", "png", "ps", "raw", "rgba", "svg",
                "svgz", "tif", "tiff", "webp")


def _plot_format(name: str) -> None:
    """An image extension, or matplotlib fails after the run (or, with none, writes NAME.png)."""
    if Path(name).suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise ConfigError(f"--plot {name}: give a file name ending in an image format "
                          f"({', '.join('.' + f for f in PLOT_FORMATS)}).")
    _pyplot()


def _configs(args) -> list[Config]:
    try:
        ks = [k if k == "auto" else int(k) for k in args.k.split(",")]
        placements = [None if t == "default" else tuple(int(n) for n in t.split(":"))
                      for t in args.threads.split(",")] if args.threads else None
    except ValueError:
        raise ConfigError(f"--k {args.k!r} / --threads {args.threads!r}: expected e.g. "
                          f"--k 0,2,4,auto and --threads default,2:1,1:1.") from None
    modes = args.mode.split(",")
    if bad := [m for m in modes if m not in ("sequential", "split")]:
        raise ConfigError(f"--mode {bad[0]!r} is unknown; use sequential and/or split.")
    sources = args.draft_source.split(",")
    if bad := [s for s in sources if s not in DRAFT_SOURCES]:
        raise ConfigError(f"--draft-source {bad[0]!r} is unknown; use one or more of "
                          f"{', '.join(DRAFT_SOURCES)}.")
    for flag, value in (("--repeats", args.repeats), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise ConfigError(f"{flag} {value} must be at least 1.")
    if placements and any(t is not None and (len(t) != 2 or min(t) < 1) for t in placements):
        raise ConfigError(f"--threads {args.threads!r}: each placement is TARGET:DRAFT, >= 1.")
    configs = []
    for mode in modes:
        for t in placements or [None]:
            if 0 in ks and mode == "sequential":          # drafts nothing: one row
                configs.append(Config(0, mode, t, "model"))
            configs += [Config(k, mode, t, source) for k in ks if k != 0 for source in sources]
    if not configs:
        raise ConfigError(f"--k {args.k} --mode {args.mode}: nothing to measure (split mode "
                          f"drafts, so it has no k=0). ---> HINT: add k > 0 or auto, or "
                          f"--mode sequential.")
    return configs


def format_table(report: dict) -> str:
    head = (f"{'config':<48} {'tok/s':>8} {'x k=0':>6} {'alpha':>6} {'k':>4} {'acc/rd':>6} "
            f"{'lk%':>4} {'a.lk':>5} {'a.md':>5} {'bound':>6} {'eff':>5} {'draft':>7} "
            f"{'verify':>7} {'host':>6} {'host%':>6}")
    lines = [f"backend: {report.get('backend_reason') or report.get('backend', '?')}"]
    lines += [f"threads target:draft, {name}: {p['described']}"
              for name, p in (report.get("placements") or {}).items() if p]
    lines += [head, "-" * len(head)]
    for r in report["results"]:
        ms = r["per_round_ms"] or {"draft": 0, "verify": 0, "host": 0}
        lines.append(
            f"{r['config']:<48} {r['tokens_per_s']:8.1f} {_f(r['speedup'], 6)} {r['alpha']:6.2f} "
            f"{r['mean_k']:4.1f} {r['mean_accepted_per_round']:6.2f} "
            f"{100 * r['lookup_share']:4.0f} {_f(r['lookup_acceptance'], 5)} "
            f"{_f(r['model_acceptance'], 5)} {r['bound']:6.2f} "
            f"{_f(r['efficiency'], 5)} {ms['draft']:7.2f} {ms['verify']:7.2f} {ms['host']:6.2f} "
            f"{100 * r['host_share']:5.1f}%")
    if report.get("looping_prompts") is not None:
        n = len(report["looping_prompts"])
        lines.append(f"x k=0 on the {n} prompt(s) whose target output loops / on the other "
                     f"{report['prompts'] - n}: " + "; ".join(
                         f"{r['config']}: {_f(r.get('speedup_loop'), 4).strip()} / "
                         f"{_f(r.get('speedup_no_loop'), 4).strip()}"
                         for r in report["results"] if r["k"] != 0))
    for t, cal in report["calibration"].items():
        v = ", ".join(f"{x:.2f}" for x in cal["v"])
        low, high = cal["target_step_ms_range"]
        lines.append(f"threads {t}: target step {cal['target_step_ms']:.2f} ms ({low:.2f}-"
                     f"{high:.2f} over {cal['calibrations']} calibrations; medians), draft step "
                     f"{cal['draft_step_ms']:.2f} ms (a round's first {cal['draft_first_ms']:.2f}"
                     f" ms), c = {cal['c']:.3f}, c1 = {cal['c_first']:.3f}, v(0..) = {v}")
    if report.get("split_vs_sequential"):
        lines.append("split against sequential (same k and threads; a round's ms change = "
                     "- hidden drafting + slower verification + waiting):")
    for v in report.get("split_vs_sequential", []):
        lines.append(f"  k={v['k']} threads={v['threads']}: {v['ratio']:.2f}x, {v['verdict']}: "
                     f"{v['why']}")
    lines += [f"{r['config']}: nodes/round {r['nodes_per_round']:.1f}, accepted/round "
              f"{r['mean_accepted_per_round']:.2f}, {r['tree_rounds']} tree rounds; acceptance "
              f"by depth {_rates(r['acceptance_by_depth'])}, by rank "
              f"{_rates(r['acceptance_by_rank'])}"
              for r in report["results"] if r.get("acceptance_by_depth")]
    lines.append("lk% = drafts found by lookup; a.lk, a.md = acceptance of lookup's and of the "
                 "draft model's tokens")
    lines.append("per-round times in ms; bound = (1-a^(k+1))/((1-a)(c1 + (k-1) c + v(k))) "
                 "(k=auto: the best fixed k's, at the fixed-k rows' alpha); eff = measured "
                 "speed-up over k=0 at the same threads / bound")
    return "\n".join(lines)


def _rates(rates: list) -> str:
    """Rates by depth or rank, 1-based depth order: '0.62 0.48 -' ('-': none judged)."""
    return " ".join("-" if r is None else f"{r:.2f}" for r in rates[:8])


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib. ---> HINT: pip install matplotlib, or drop "
                          "--plot (--json keeps every figure).") from None
    return plt


def plot(report: dict, path: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    groups: dict[str, list] = {}
    for r in report["results"]:
        if r["k"] != "auto" and r["speedup"] is not None:
            groups.setdefault(f"{r['mode']} {r['threads']}", []).append(r)
    for label, rows in groups.items():
        ks = [r["k"] for r in rows]
        line, = ax.plot(ks, [r["speedup"] for r in rows], "o-", label=f"measured ({label})")
        # the bound is over k=0 at the same threads; drawn over the run's baseline, as measured
        scale = [r["speedup"] / r["speedup_own_threads"] for r in rows]
        ax.plot(ks, [r["bound"] * f for r, f in zip(rows, scale)], "--", color=line.get_color(),
                label=f"bound ({label})")
    for r in report["results"]:
        if r["k"] == "auto" and r["speedup"]:
            ax.axhline(r["speedup"], color="grey", lw=0.8, ls=":")
            ax.annotate(f"auto ({r['mode']} {r['threads']})", (0, r["speedup"]), fontsize=7)
    ax.set_xlabel("k (draft tokens per round)")
    ax.set_ylabel("speed-up over k = 0")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _f(x: float | None, width: int) -> str:
    return f"{x:{width}.2f}" if x is not None else " " * (width - 1) + "-"


if __name__ == "__main__":
    sys.exit(main())
