"""ssd-bench's measurement: the configurations run interleaved prompt by prompt on one
bundle, and the figures each comes to (tokens/s, speed-up, α, the bound, split against
sequential). bench.py is the CLI around it: its arguments, prompts, table and plot.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .machine import cpu_cores
from .round.tree import Verdicts
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
                                 draft_source=c.source, tenant="warm-up")
    # the bound's c and v(k): one timed pass of each k (after a warm-up pass) before every
    # prompt, beside the runs, and the median of them all taken: the machine's state moves,
    # so the samples are spread over the run (20 in the default run: 10 prompts, 2 repeats).
    # One pass a prompt, since the median over the run needs many samples, not many at each
    # moment, and more passes would make calibration a large part of a run on a larger target
    # (docs/performance.md, "Start-up").
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
                                               coupling=coupling, draft_source=c.source,
                                               # "suffix": the earlier prompts of this
                                               # configuration and repeat only
                                               tenant=f"{c!r}/{r}")
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


def _verdicts(stats: list, rounds: int) -> dict:
    """Nodes a round, acceptance by depth and rank over every run's rounds (Verdicts)."""
    total = Verdicts()
    for s in stats:
        total.merge(s.verdicts)
    found = total.as_dict()
    return {"nodes_per_round": total.nodes / rounds if rounds else 0.0,
            "acceptance_by_depth": found["acceptance_by_depth"],
            "acceptance_by_rank": found["acceptance_by_rank"],
            "judged_by_depth": found["depth_tried"], "judged_by_rank": found["rank_tried"]}


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
    where the draft is unsure (docs/performance.md, "Measured on this project's 2-core CPU
    machine"), and would promise a bound no fixed k reaches. Auto may exceed its bound: it
    drafts by confidence."""
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
        # draft trees (docs/design.md §5): verification rows but the root a round (a chain's
        # k), the rounds that verified a tree, and acceptance by depth and by rank
        "tree_rounds": sum(s.tree_rounds for s in stats), **_verdicts(stats, rounds),
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
