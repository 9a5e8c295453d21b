"""Stopping rules replayed in model time: every rule on the same text, no machine noise.

Decodes the bench prompts greedily with the target alone, runs the draft over the same text
and records at every position the draft's top probability and whether its token is the
target's; measures the seconds of a round at every fixed k through the runtime's own loop.
Greedy rounds then replay exactly: a round that starts at position p and drafts d tokens
keeps the leading matches among p..p+d-1 plus the target's own token, and costs the measured
seconds of a round drafting d. Each rule -- every fixed k, the adaptive schedule (learning
as it goes, its round times starting from the calibration) and an oracle that drafts up to
the first mismatch -- runs over the text `--passes` times and the last pass counts.

`--noise` shows the adaptive schedule its round times as a shared machine would (a slow
drift of the machine's pace, jitter, and one round in twenty preempted; four seeds), while
the tokens/s it is scored by stay in model time: what noisy learning costs its decisions.

    python tools/replay_rules.py BUNDLE [--threads 2:1] [--max-new-tokens 128] [--passes 3]
                                        [--noise] [--round-ms MS,..] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np


class Noisy:
    """A schedule whose observed round times are scaled as on a busy machine: an AR(1) drift
    of the log pace (sd `drift`, ~50 rounds long), per-round jitter and preempted rounds."""

    uses_draft = True

    def __init__(self, schedule, seed: int, drift: float = 0.1, jitter: float = 0.08,
                 preempted: float = 0.05) -> None:
        self.schedule, self.rng = schedule, np.random.default_rng(seed)
        self.drift, self.jitter, self.preempted, self.log_pace = drift, jitter, preempted, 0.0

    def next_k(self) -> int:
        return self.schedule.next_k()

    def keep_drafting(self, drafted: int, logits, top=None) -> bool:
        return self.schedule.keep_drafting(drafted, logits, top)

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        rng = self.rng
        self.log_pace = 0.98 * self.log_pace + rng.normal(0, self.drift * math.sqrt(1 - 0.98**2))
        seconds *= math.exp(self.log_pace + rng.normal(0, self.jitter))
        if rng.random() < self.preempted:
            seconds *= rng.uniform(1.3, 3.0)
        self.schedule.observe(drafted, accepted, seconds)


def record(gen, prompts: list[str], max_new_tokens: int, top_probability) -> list[tuple]:
    """Per prompt: (first generated position, end, tops, matches), tops[i] and matches[i]
    for the token at position i, as the draft sees it after the target's own text."""
    texts, draft = [], gen.draft
    scratch = np.empty(gen.manifest.draft.vocab_size, np.float32)
    for prompt in prompts:
        ids = gen.encode(prompt)
        seq = ids + gen.generate(prompt, max_new_tokens=max_new_tokens, k=0).token_ids
        draft.prefill(np.asarray(seq[:len(ids) - 1], np.int64))
        tops, matches = {}, {}
        for i in range(len(ids) - 1, len(seq) - 1):
            logits = draft.forward(np.asarray([seq[i]], np.int64), i)
            top = draft.top()
            token, p = top if top is not None else \
                (int(logits[-1].argmax()), top_probability(logits[-1], scratch))
            tops[i + 1], matches[i + 1] = p, token == seq[i + 1]
        texts.append((len(ids), len(seq), tops, matches))
    return texts


def _leading(matches: dict[int, bool], pos: int, n: int) -> int:
    """How many of the n draft tokens from `pos` the target accepts: the leading matches."""
    return next((i for i in range(n) if not matches[pos + i]), n)


def replay(texts, seconds: list[float], schedule, passes: int) -> tuple[float, float]:
    """(tokens per second, mean drafted) of the last pass; earlier passes only teach."""
    for _ in range(passes):
        tokens = spent = 0.0
        drafted = []
        for start, end, tops, matches in texts:
            pos = start
            while pos < end:
                d = 0
                for step in range(1, min(schedule.next_k(), end - pos - 1) + 1):
                    d = step
                    if not schedule.keep_drafting(d, None, (0, tops[pos + d - 1])):
                        break
                kept = _leading(matches, pos, d)
                schedule.observe(d, kept, seconds[d])
                tokens, spent, pos = tokens + kept + 1, spent + seconds[d], pos + kept + 1
                drafted.append(d)
    return tokens / spent, float(np.mean(drafted))


def oracle(texts, seconds: list[float], max_k: int) -> float:
    """Tokens per second drafting each round up to its first mismatch (max_k at most)."""
    tokens = spent = 0.0
    for start, end, _, matches in texts:
        pos = start
        while pos < end:
            room = min(max_k, end - pos - 1)
            kept = _leading(matches, pos, room)
            d = min(kept + 1, room)
            tokens, spent, pos = tokens + kept + 1, spent + seconds[d], pos + kept + 1
    return tokens / spent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--threads", default="2:1", help="target:draft intra-op threads")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--passes", type=int, default=3, help="replays of the text (the last counts)")
    p.add_argument("--noise", action="store_true",
                   help="also replay auto seeing noisy round times (four seeds)")
    p.add_argument("--round-ms", help="a round's milliseconds at k = 0..max_draft, comma "
                   "separated (say, an earlier run's round_ms), instead of measuring them")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)

    from ssd_runtime import Generator
    from ssd_runtime.bench import load_prompts
    from ssd_runtime.scheduler.schedule import AdaptiveK, FixedK, RoundTimes, top_probability

    gen = Generator.load(args.bundle, backend="cpu",
                         threads=tuple(int(t) for t in args.threads.split(":")))
    max_k, prompts, cost = gen.manifest.max_draft, load_prompts(None), gen.knowledge.cost_model()
    texts = record(gen, prompts, args.max_new_tokens, top_probability)
    try:
        seconds = [float(ms) / 1e3 for ms in args.round_ms.split(",")] if args.round_ms else []
    except ValueError:
        p.error(f"--round-ms {args.round_ms!r}: give milliseconds separated by commas")
    if seconds and (len(seconds) != max_k + 1 or min(seconds) <= 0):
        p.error(f"--round-ms needs {max_k + 1} positive times (k = 0..{max_k}); "
                f"got {len(seconds)}")
    for k in range(max_k + 1 if not seconds else 0):   # a round's seconds at each fixed k
        rounds = spent = 0
        for prompt in prompts:
            stats = gen.generate(prompt, max_new_tokens=args.max_new_tokens, k=k).stats
            rounds, spent = rounds + stats.rounds, spent + stats.seconds["draft"] + \
                stats.seconds["verify"]
        seconds.append(spent / rounds)

    def auto(noise_seed: int | None = None) -> tuple[float, float]:
        schedule = AdaptiveK(cost, max_k, times=RoundTimes.from_cost(cost, max_k))
        if noise_seed is not None:
            schedule = Noisy(schedule, noise_seed)
        return replay(texts, seconds, schedule, args.passes)

    rates = {k: replay(texts, seconds, FixedK(k), args.passes)[0] for k in range(max_k + 1)}
    best_k = max(range(1, max_k + 1), key=rates.__getitem__)
    best, base = rates[best_k], rates[0]
    auto_rate, auto_k = auto()
    report = {"bundle": args.bundle, "threads": args.threads,
              "positions": sum(len(t[2]) for t in texts), "round_ms": [s * 1e3 for s in seconds],
              "speedup": {f"k={k}": r / base for k, r in rates.items()},
              "best_fixed": f"k={best_k}", "auto_speedup": auto_rate / base,
              "auto_mean_k": auto_k, "auto_vs_best_fixed": auto_rate / best,
              "oracle_vs_best_fixed": oracle(texts, seconds, max_k) / best}
    print(f"{report['positions']} positions; round ms by k: "
          + " ".join(f"{s * 1e3:.3f}" for s in seconds))
    print("model-time speed-up over k=0: "
          + " ".join(f"{n} {v:.3f}" for n, v in report["speedup"].items()))
    print(f"auto {report['auto_speedup']:.3f} (mean k {auto_k:.2f}) = "
          f"{report['auto_vs_best_fixed']:.3f} of the best fixed (k={best_k}); "
          f"oracle {report['oracle_vs_best_fixed']:.3f}")
    if args.noise:
        noisy = [auto(seed)[0] / best for seed in range(4)]
        report["auto_vs_best_fixed_noisy"] = noisy
        print(f"auto seeing noisy round times: {np.mean(noisy):.3f} of the best fixed "
              f"({min(noisy):.3f}-{max(noisy):.3f} over 4 seeds)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
