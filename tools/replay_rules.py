"""Adaptive k against fixed k in model time: the same rounds, no machine noise.

Decodes the bench prompts greedily at k = max_draft, recording every round's draft
confidences (the draft's top probability per token) and how many tokens the target
accepted; measures the seconds of a round at every fixed k through the runtime's own loop;
then replays the recorded rounds through each fixed k, the adaptive schedule (its
acceptance model learning as it goes, its round times starting from the calibration and
learning from the measured ones) and an oracle that stops right after the first rejected
token. A round stopped at d keeps min(accepted, d) tokens plus the target's own and costs
the measured seconds of a round drafting d. Live runs on a shared machine swing by more
than the differences between stopping rules; this does not.

    python tools/replay_rules.py BUNDLE [--threads 2:1] [--max-new-tokens 128] [--passes 3]
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np


class Recording:
    """A schedule for `decode` that drafts k tokens a round and keeps what each round saw."""

    uses_draft = True

    def __init__(self, k: int, top_probability, scratch) -> None:
        self.k, self.rounds, self._tops = k, [], []
        self._top_probability, self._scratch = top_probability, scratch

    def next_k(self) -> int:
        self._tops = []
        return self.k

    def keep_drafting(self, drafted: int, logits, top=None) -> bool:
        self._tops.append(top[1] if top is not None else
                          self._top_probability(logits[-1], self._scratch))
        return True

    def observe(self, drafted: int, accepted: int, seconds: float | None = None) -> None:
        self.rounds.append((self._tops[:drafted], accepted))


def replay(rounds, seconds: list[float], schedule, passes: int) -> tuple[float, float]:
    """(tokens per second, mean drafted) of the last pass; earlier passes only teach."""
    tokens = spent = 0.0
    drafted = []
    for p in range(passes):
        for tops, accepted in rounds:
            d = 0
            for step in range(1, min(schedule.next_k(), len(tops)) + 1):
                d = step
                if not schedule.keep_drafting(d, None, (0, tops[d - 1])):
                    break
            kept = min(accepted, d)
            schedule.observe(d, kept, seconds[d])
            if p == passes - 1:
                tokens, spent = tokens + kept + 1, spent + seconds[d]
                drafted.append(d)
    return tokens / spent, float(np.mean(drafted))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--threads", default="2:1", help="target:draft intra-op threads")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--passes", type=int, default=3, help="replays of the rounds (the last counts)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)

    from ssd_runtime import Generator
    from ssd_runtime.acceptance import GreedyAcceptance
    from ssd_runtime.bench import load_prompts
    from ssd_runtime.drafting import SequentialDrafter
    from ssd_runtime.loop import Stats, decode
    from ssd_runtime.perf import AdaptiveK, FixedK, RoundTimes, top_probability

    gen = Generator.load(args.bundle, backend="cpu",
                         threads=tuple(int(t) for t in args.threads.split(":")))
    max_k, prompts = gen.manifest.max_draft, [gen.encode(t) for t in load_prompts(None)]
    cost = gen.cost_model()

    def run(schedule) -> Stats:
        stats, rule = Stats(), GreedyAcceptance()
        for prompt in prompts:
            one = Stats()
            for _ in decode(gen.target, SequentialDrafter(gen.draft, rule, schedule), rule,
                            prompt, args.max_new_tokens, schedule, gen.eos_ids, one):
                pass
            stats.rounds += one.rounds
            for key in ("draft", "verify"):
                stats.seconds[key] += one.seconds[key]
        return stats

    recording = Recording(max_k, top_probability,
                          np.empty(gen.manifest.draft.vocab_size, np.float32))
    run(recording)
    seconds = []
    for k in range(max_k + 1):                      # a round's seconds at each fixed k
        s = run(FixedK(k))
        seconds.append((s.seconds["draft"] + s.seconds["verify"]) / s.rounds)
    rates = {f"k={k}": replay(recording.rounds, seconds, FixedK(k), args.passes)[0]
             for k in range(max_k + 1)}
    best = max((r, name) for name, r in rates.items() if name != "k=0")
    auto, auto_k = replay(recording.rounds, seconds, AdaptiveK(
        cost, max_k, times=RoundTimes.from_cost(cost, max_k)), args.passes)
    oracle_tokens = sum(min(a, len(t)) + 1 for t, a in recording.rounds)
    oracle_seconds = sum(seconds[min(a + 1, len(t))] for t, a in recording.rounds)
    base = rates["k=0"]
    report = {"bundle": args.bundle, "threads": args.threads, "rounds": len(recording.rounds),
              "round_ms": [s * 1e3 for s in seconds],
              "speedup": {name: r / base for name, r in rates.items()},
              "best_fixed": best[1], "auto_speedup": auto / base, "auto_mean_k": auto_k,
              "auto_vs_best_fixed": auto / best[0],
              "oracle_vs_best_fixed": oracle_tokens / oracle_seconds / best[0]}
    print(f"{len(recording.rounds)} rounds recorded at k={max_k}; round ms by k: "
          + " ".join(f"{s * 1e3:.3f}" for s in seconds))
    print("model-time speed-up over k=0: "
          + " ".join(f"{n} {v:.3f}" for n, v in report["speedup"].items()))
    print(f"auto {report['auto_speedup']:.3f} (mean k {auto_k:.2f}) = "
          f"{report['auto_vs_best_fixed']:.3f} of the best fixed ({best[1]}); "
          f"oracle stopping {report['oracle_vs_best_fixed']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
