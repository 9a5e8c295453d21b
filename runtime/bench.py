"""`ssd-bench`: speed of every configuration side by side, against k = 0.

Configurations (k × mode × thread placement) are interleaved prompt by
prompt so that machine noise hits them alike; the report gives tokens/s,
speed-up, α, c, v(k), the analytic bound and the efficiency measured/bound.
Unless --threads names placements, each mode runs at the placement the runtime
picks by itself (remembered, or timed at this load), so the figures are a user's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import ConfigError, cli_main
from .machine import cpu_cores
from .round.lookup import DRAFT_SOURCES
from .scheduler.calibration import calibrate
from .scheduler.cost import CostModel, expected_tokens


@dataclass(frozen=True)
class Config:
    k: int | str
    mode: str
    threads: tuple[int, int] | None      # target:draft; None: what the runtime picks itself
    source: str = "fused"         # lookup.DRAFT_SOURCES (k=0 drafts nothing: not named)

    @property
    def load(self) -> tuple:
        """The generator it runs on: one per placement given, one per mode for the default
        (the runtime picks threads per mode, docs/design.md §9)."""
        return (self.threads, self.mode if self.threads is None else "sequential")

    def name(self, threads: str) -> str:
        """`threads`: the placement it ran at, e.g. "2:1"."""
        source = "" if self.k == 0 else f" {self.source}"
        default = " (default)" if self.threads is None else ""
        return f"k={self.k}{source} {self.mode} threads={threads}{default}"


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


def run_bench(bundle: str, configs: list[Config], prompts: list[str], max_new_tokens: int,
              temperature: float, repeats: int, backend: str = "auto",
              coupling: str = "rejection", recalibrate: bool = False,
              draft_backend: str | None = None) -> dict:
    from .generator import Generator

    placements = list(dict.fromkeys(c.load for c in configs))
    gens = {t: Generator.load(bundle, backend=backend, threads=t[0], mode=t[1],
                              recalibrate=recalibrate, draft_backend=draft_backend)
            for t in placements}
    threads = {t: f"{gen.target.threads}:{gen.draft.threads}" for t, gen in gens.items()}
    runs: dict[Config, list] = {c: [] for c in configs}
    outputs: dict[int, list[int]] = {}               # the target alone's tokens per prompt
    for c in configs:                                    # warm-up, not recorded
        gens[c.load].generate(prompts[0], max_new_tokens=8, k=c.k, mode=c.mode,
                                 draft_source=c.source)
    # the bound's c and v(k): one timed pass of each k (after a warm-up pass) before every
    # prompt, beside the runs, and the median of them all taken: the machine's state moves,
    # so the samples are spread over the run (20 in the default run: 10 prompts, 2 repeats).
    # Nine timed passes before every prompt made calibration a third of a run on a 135M
    # target, one makes it an eighth (docs/performance.md, start-up).
    calibrations: dict[tuple[int, int], list[CostModel]] = {t: [] for t in placements}
    for r in range(repeats):
        for p, prompt in enumerate(prompts):
            for t, gen in gens.items():
                calibrations[t].append(calibrate(gen.target, gen.draft, gen.manifest.max_draft,
                                                 repeats=1))
            shift = (r * len(prompts) + p) % len(configs)
            for c in configs[shift:] + configs[:shift]:   # rotate the order every prompt
                res = gens[c.load].generate(prompt, max_new_tokens=max_new_tokens, k=c.k,
                                               mode=c.mode, temperature=temperature,
                                               seed=p if temperature else None,
                                               coupling=coupling, draft_source=c.source)
                runs[c].append((p, res.stats))
                if c.k == 0:
                    outputs.setdefault(p, res.token_ids)
    # k=0 per thread placement: the bound's (and so the efficiency's) own baseline; the
    # speed-up column is against the fastest of them
    costs = {t: CostModel.median(calibrations[t]) for t in placements}
    own = {threads[c.load]: _tokens_per_s(runs[c]) for c in configs if c.k == 0}
    baseline = max(own.values()) if own else None
    summary = {c: _summary(c, threads[c.load], runs[c], costs[c.load], baseline,
                           own.get(threads[c.load], baseline))
               for c in configs if c.k != "auto"}
    for c in configs:
        if c.k == "auto":       # its bound: the best fixed k's, at α of the fixed-k rows beside it
            alphas = [r["alpha"] for f, r in summary.items()
                      if f.k and (f.load, f.mode, f.source) == (c.load, c.mode, c.source)]
            summary[c] = _summary(c, threads[c.load], runs[c], costs[c.load], baseline,
                                  own.get(threads[c.load], baseline),
                                  float(np.median(alphas)) if alphas else None)
    rows = [summary[c] for c in configs]
    looping = sorted(p for p, ids in outputs.items() if loops(ids))
    if outputs:                 # the gain on text that loops, apart from the rest
        for c, row in zip(configs, rows):
            row.update(_by_loops(c, looping, runs, threads))
    first = gens[placements[0]]
    cores = cpu_cores() if first.backend == "cpu" else None
    return {"bundle": str(bundle), "backend": first.backend, "backend_reason": first.backend_reason,
            "max_new_tokens": max_new_tokens, "temperature": temperature, "coupling": coupling,
            "prompts": len(prompts), "repeats": repeats, "baseline_tokens_per_s": baseline,
            "cpu_cores": cores,
            "calibration": {threads[t]: _calibration_row(costs[t], calibrations[t])
                            for t in placements},
            # the threads each generator ran at, and where they came from (measured at this
            # load, remembered, or given: docs/design.md §9)
            "placements": {_placement_name(t, threads[t]): _placement(gens[t])
                           for t in placements},
            "looping_prompts": looping if outputs else None,
            "results": rows, "split_vs_sequential": split_against_sequential(rows, cores)}


def loops(tokens: list[int]) -> bool:
    """Whether an output falls into a repeating loop: its second half periodic (each token
    the one p before it, for some period p <= 32, at 90% of places or more). Lookup drafts
    win most there, so ssd-bench reports such prompts apart from the others."""
    half = tokens[len(tokens) // 2:]
    if len(half) < 16:
        return False
    for p in range(1, min(33, len(half) // 2 + 1)):
        same = sum(a == b for a, b in zip(half[p:], half))
        if same >= 0.9 * (len(half) - p):
            return True
    return False


def _placement_name(load: tuple, threads: str) -> str:
    """e.g. "default sequential" or "2:1"."""
    return f"default {load[1]}" if load[0] is None else threads


def _placement(gen) -> dict | None:
    return gen.placement.as_dict() if gen.placement is not None else None


def _by_loops(c: Config, looping: list[int], runs: dict[Config, list],
              threads: dict[tuple, str]) -> dict:
    """c's tokens/s and × k=0 (same threads) over the prompts whose target output loops, and
    over the others."""
    base = next((r for f, r in runs.items()
                 if f.k == 0 and threads[f.load] == threads[c.load]), None)
    out = {}
    for name, keep in (("loop", lambda p: p in looping), ("no_loop", lambda p: p not in looping)):
        mine = [(p, s) for p, s in runs[c] if keep(p)]
        theirs = [(p, s) for p, s in base or [] if keep(p)]
        tps = _tokens_per_s(mine) if mine else None
        ref = _tokens_per_s(theirs) if theirs else None
        out[f"tokens_per_s_{name}"] = tps
        out[f"speedup_{name}"] = tps / ref if tps and ref else None
    return out


def _calibration_row(cost: CostModel, models: list[CostModel]) -> dict:
    steps = [1e3 * m.target_step for m in models]
    return {**cost.as_dict(), "calibrations": len(models),
            "target_step_ms_range": [min(steps), max(steps)]}


def _tokens_per_s(runs: list) -> float:
    """Median over prompts of each prompt's total tokens / total decode time."""
    per_prompt: dict[int, list[float]] = {}
    for p, s in runs:
        per_prompt.setdefault(p, [0.0, 0.0])
        per_prompt[p][0] += s.new_tokens
        per_prompt[p][1] += s.seconds["decode"]
    return float(np.median([n / t for n, t in per_prompt.values() if t > 0]))


def _summary(c: Config, threads: str, runs: list, cost: CostModel, baseline: float | None,
             own_baseline: float | None, pair_alpha: float | None = None) -> dict:
    """One configuration's figures. k="auto" is held to the best fixed k's bound, at the
    pair's α (`pair_alpha`: fitted to the fixed-k rows of the same threads and mode, where the
    run has them); α fitted to auto's own rounds is higher than the pair's, since it stops
    where the draft is unsure (0.91 against 0.88 on the demo pair), and would promise a
    bound no fixed k reaches. Auto may exceed its bound: it drafts by confidence."""
    stats = [s for _, s in runs]
    rounds = sum(s.rounds for s in stats)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    looked, found = sum(s.lookup_drafted for s in stats), sum(s.lookup_accepted for s in stats)
    seconds = {key: sum(s.seconds[key] for s in stats) for key in ("draft", "verify", "host")}
    decode = sum(s.seconds["decode"] for s in stats)
    tps = _tokens_per_s(runs)
    mean_k = drafted / rounds if rounds else 0.0
    tokens_per_round = (sum(s.new_tokens for s in stats) / rounds) if rounds else 0.0
    alpha = _alpha_from_tokens_per_round(tokens_per_round, mean_k)
    bound_alpha = alpha if pair_alpha is None else pair_alpha
    if c.k == "auto":
        bound = max(cost.speedup(bound_alpha, k) for k in range(len(cost.verify)))
    else:
        bound = cost.speedup(alpha, int(c.k))
    speedup = tps / baseline if baseline else None
    own_speedup = tps / own_baseline if own_baseline else None
    return {
        "config": c.name(threads), "k": c.k, "mode": c.mode, "threads": threads,
        "default_placement": c.threads is None,
        "source": c.source if c.k != 0 else None, "tokens_per_s": tps,
        "ms_per_token": 1e3 / tps if tps else None, "speedup": speedup,
        "acceptance_rate": accepted / drafted if drafted else 0.0, "alpha": alpha,
        # per source (docs/design.md §6.1): the share of drafts found by lookup, and each
        # source's acceptance rate (None where it drafted nothing)
        "lookup_share": looked / drafted if drafted else 0.0,
        "lookup_acceptance": found / looked if looked else None,
        "model_acceptance": (accepted - found) / (drafted - looked) if drafted > looked
        else None,
        "mean_k": mean_k, "mean_accepted_per_round": accepted / rounds if rounds else 0.0,
        "c": cost.c, "v_k": cost.v(min(round(mean_k), len(cost.verify) - 1)),
        "bound": bound, "bound_alpha": bound_alpha, "speedup_own_threads": own_speedup,
        "efficiency": own_speedup / bound if own_speedup else None,
        "per_round_ms": {k: 1e3 * v / rounds for k, v in seconds.items()} if rounds else {},
        "host_share": seconds["host"] / decode if decode else 0.0,
        "split_hit_rate": (sum(s.split_hits for s in stats) / max(1, sum(s.split_bets
                                                                          for s in stats))),
    }


def split_against_sequential(rows: list[dict], cores: int | None) -> list[dict]:
    """Each split row beside the sequential row of the same k and threads, and why it wins
    or loses: a round's time changes by what the overlap hides of the drafting, against
    what the verification loses beside the draft's thread and what the loop waits for it."""
    sequential = {(r["k"], r["threads"]): r for r in rows if r["mode"] == "sequential"}
    out = []
    for r in rows:
        s = sequential.get((r["k"], r["threads"])) if r["mode"] == "split" else None
        if s is None or not r["per_round_ms"] or not s["per_round_ms"] or not s["tokens_per_s"]:
            continue
        alone, beside = s["per_round_ms"], r["per_round_ms"]
        hidden = alone["draft"] - beside["draft"]
        slower = beside["verify"] - alone["verify"]
        waited = beside["host"] - alone["host"]
        share = alone["draft"] / sum(alone.values())
        ratio = r["tokens_per_s"] / s["tokens_per_s"]
        target, draft = (int(n) for n in r["threads"].split(":"))
        why = [f"hides {hidden:.2f} of the {alone['draft']:.2f} ms a round drafts "
               f"({share:.0%} of a sequential round; bets right {r['split_hit_rate']:.0%})"]
        if slower > 0.03 * alone["verify"]:
            why.append(f"the verification takes {slower:.2f} ms longer beside the draft's "
                       f"thread (+{slower / alone['verify']:.0%})" +
                       (f": {target}+{draft} threads on {cores} cores, the draft takes a core "
                        f"from the target" if cores and target + draft > cores else ""))
        if waited > 0.03 * alone["verify"]:
            why.append(f"waits {waited:.2f} ms a round for the draft's thread")
        out.append({"k": r["k"], "threads": r["threads"], "ratio": ratio,
                    "verdict": "wins" if ratio > 1.02 else "loses" if ratio < 0.98 else "level",
                    "draft_share": share, "hidden_ms": hidden, "verify_slower_ms": slower,
                    "waited_ms": waited, "why": "; ".join(why)})
    return out


def _alpha_from_tokens_per_round(tokens: float, k: float) -> float:
    """Invert tokens per round = (1 - α^(k+1)) / (1 - α) for α, by bisection."""
    if k < 1e-9 or tokens <= 1.0:
        return 0.0
    kk = max(1, round(k))
    if tokens >= kk + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, kk) < tokens else (lo, mid)
    return (lo + hi) / 2


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
                        "elsewhere), model, lookup (docs/runtime.md)")
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
    lines.append("lk% = drafts found by lookup; a.lk, a.md = acceptance of lookup's and of the "
                 "draft model's tokens")
    lines.append("per-round times in ms; bound = (1-a^(k+1))/((1-a)(c1 + (k-1) c + v(k))) "
                 "(k=auto: the best fixed k's, at the fixed-k rows' alpha); eff = measured "
                 "speed-up over k=0 at the same threads / bound")
    return "\n".join(lines)


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
