"""The same generations on two machines, and where their tokens or logits part.

    python tools/aarch64_tokens.py run BUNDLE --out OUT.json [--tokens 48] [--against REF.json]
    python tools/aarch64_tokens.py compare REF.json OTHER.json [--bundle BUNDLE]

`run` loads BUNDLE on the CPU backend (1 thread each for target and draft, max_batch 3) and
runs a fixed list of cases: greedy at k = 0, 4 and auto on three prompts; seeded sampling
(temperature 0.8, top-p 0.95) at k = 0, 4 and auto on two; `generate_batch` of the three
prompts greedy at k = 4 and auto, and sampled with a seed each at auto; and, where llguidance
is installed (`pip install '.[structured]'`), greedy under a JSON schema (response_format) at
k = 0, 4 and auto: llguidance's wheel compiling the schema and masking every row there, its
tokens held to the other machine's like the rest (a run without llguidance lacks those cases,
and `compare` counts each as unexplained). It writes their
token ids, each case's seconds, the versions, and the target's k=0 logits at every step of
the first greedy case (`logits`: prefill the prompt, then one row at a time, as k=0 runs),
which is where the kernels' rounding shows even when the tokens agree. With `--against
REF.json` (the other machine's run) it also records, for every case whose tokens part from
REF's, its own k=0 row of the target at the first differing step.

`compare` (on the machine of REF, with its bundle) prints a table, one line per stream:
equal, or where it parts and why. At a parting it replays the decision on both machines' k=0
rows of the target there (REF's computed again, OTHER's from `parting_rows`) with the
runtime's own rule: greedy is the argmax; seeded sampling (the invariant coupling) is the
Gumbel-max argmax of logit/T - log E over the top-p nucleus, E the noise keyed by (seed,
position, token). The parting is *explained* when each machine's row gives that machine's
token: the streams part only because the two machines' logits differ (kernel rounding), not
the loop, the random numbers or the sampling code. It prints the margin the rounding crossed:
the logit gap (greedy), the noisy-score gap (sampling), or the nucleus edge (a token whose
mass puts it inside top-p on one machine and outside on the other). Then how far the two
machines' logits lie apart over the trace. Any other difference exits 1.
Runtime-only imports: it runs where `pip install .` installed the runtime (tools/aarch64_check.sh).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from ssd_runtime import Generator
from ssd_runtime.backends import cpu_session
from ssd_runtime.round.acceptance import InvariantSampling
from ssd_runtime.round.sampling import SamplingParams, gumbel_pick, probabilities

PROMPTS = ["def read_config(path):\n", "import os\nimport sys\n\n", "class Stack:\n    def "]
SAMPLED = dict(temperature=0.8, top_p=0.95)
# a schema with an enum, a bounded integer and a boolean: the grammar decides every token
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["path", "lines", "ok"],
          "properties": {"path": {"enum": ["a.cfg", "b.ini"]},
                         "lines": {"type": "integer", "minimum": 0, "maximum": 999},
                         "ok": {"type": "boolean"}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "config", "schema": SCHEMA}}
# the Linux arm64 HWCAP / HWCAP2 bits that decide ONNX Runtime's (MLAS, KleidiAI) kernels
HWCAP = {"fphp": 9, "asimdhp": 10, "asimddp": 20, "sve": 22}
HWCAP2 = {"sve2": 1, "i8mm": 13, "bf16": 14, "sme": 23}


def cases(tokens: int) -> list[dict]:
    """name, how (single | batch), k, and the settings of each stream."""
    out = []
    for k in (0, 4, "auto"):
        out += [dict(name=f"greedy p{i} k={k}", how="single", k=k, streams=[dict(prompt=i)])
                for i in range(3)]
        out += [dict(name=f"seed {s} p{i} k={k}", how="single", k=k,
                     streams=[dict(prompt=i, seed=s, **SAMPLED)]) for i, s in ((0, 1), (2, 7))]
    for k in (4, "auto"):
        out.append(dict(name=f"batch greedy k={k}", how="batch", k=k,
                        streams=[dict(prompt=i) for i in range(3)]))
    out.append(dict(name="batch seeded k=auto", how="batch", k="auto",
                    streams=[dict(prompt=i, seed=10 + i, **SAMPLED) for i in range(3)]))
    if importlib.util.find_spec("llguidance") is not None:
        out += [dict(name=f"json p0 k={k}", how="single", k=k,
                     streams=[dict(prompt=0, response_format=FORMAT)]) for k in (0, 4, "auto")]
    for case in out:
        for stream in case["streams"]:
            # a schema's output is refused a max_new_tokens below its least length: 64 holds it
            stream["max_new_tokens"] = max(tokens, 64) if "response_format" in stream else tokens
    return out


def run(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    gen = Generator.load(args.bundle, backend="cpu", threads=(1, 1), max_batch=3)
    loaded = time.perf_counter() - started
    prompts = [gen.encode(text) for text in PROMPTS]
    session = cpu_session("target", args.bundle, gen.manifest, threads=1)
    out = {"machine": platform.machine(), "python": platform.python_version(),
           "versions": {d: metadata.version(d) for d in ("onnxruntime", "numpy", "tokenizers",
                                                           "llguidance") if _installed(d)},
           "cpu": _cpu(),
           "qemu_cpu": os.environ.get("QEMU_CPU") if platform.machine() == "aarch64" else None, "bundle": str(args.bundle),
           "target_quant": gen.manifest.target.quant, "load_s": round(loaded, 3), "cases": []}
    for case in cases(args.tokens):
        t0 = time.perf_counter()
        settings = [{**s, "prompt": prompts[s["prompt"]]} for s in case["streams"]]
        if case["how"] == "single":
            (one,) = settings
            got = [gen.generate(one.pop("prompt"), k=case["k"], **one)]
        else:
            got = gen.generate_batch(settings, k=case["k"])
        seconds = time.perf_counter() - t0
        ids = [r.token_ids for r in got]
        out["cases"].append({**case, "ids": ids, "seconds": round(seconds, 3),
                             "tokens_per_s": round(sum(map(len, ids)) / seconds, 2)})
        print(f"{case['name']:<22} {seconds:7.2f} s  {sum(map(len, ids)):4d} tokens", flush=True)
    out["decode_s"] = round(time.perf_counter() - started - loaded, 3)
    args.out.write_text(json.dumps(out) + "\n")        # the tokens, before the logits' passes
    first = out["cases"][0]
    out["logits"] = _trace(session, prompts[0], first["ids"][0]).tolist()
    if args.against:
        ref = {c["name"]: c for c in json.loads(args.against.read_text())["cases"]}
        out["parting_rows"] = {}
        for case in out["cases"]:
            for j, (mine, theirs) in enumerate(zip(case["ids"], ref[case["name"]]["ids"])):
                at = _parts(mine, theirs)
                if at is not None and at < len(mine):
                    prompt = prompts[case["streams"][j]["prompt"]]
                    row = _row(session, prompt + mine[:at])
                    out["parting_rows"][f"{case['name']}#{j}"] = {"at": at, "row": row.tolist()}
    out["total_s"] = round(time.perf_counter() - started, 3)
    args.out.write_text(json.dumps(out) + "\n")
    print(f"{args.out}: {len(out['cases'])} cases on {out['machine']} in {out['total_s']:.1f} s "
          f"(load {loaded:.1f} s)", flush=True)


def compare(args: argparse.Namespace) -> int:
    ref, other = (json.loads(p.read_text()) for p in (args.ref, args.other))
    for label, r in (("reference", ref), ("other", other)):
        qemu = f", emulated by qemu as {r['qemu_cpu']}" if r.get("qemu_cpu") else ""
        print(f"{label}: {r['machine']} ({r['cpu']}{qemu}), Python {r['python']}, "
              + ", ".join(f"{d} {v}" for d, v in r["versions"].items())
              + f"; target {r['target_quant']}")
    for label, r in (("reference", ref), ("other", other)):
        alone = {c["name"].replace(" k=0", ""): c["ids"][0] for c in r["cases"] if c["k"] == 0}
        spec = [(c["name"].rsplit(" k=", 1)[0], c["ids"][0]) for c in r["cases"]
                if c["how"] == "single" and c["k"] != 0]
        same = sum(alone[name] == ids for name, ids in spec)
        print(f"{label}: k=4 and auto give k=0's tokens in {same} of {len(spec)} single streams")
    if "logits" in ref and "logits" in other:
        a, b = np.asarray(ref["logits"]), np.asarray(other["logits"])     # (steps, vocab)
        delta, top2 = np.abs(a - b), np.sort(a, axis=1)[:, -2:]
        print(f"target k=0 logits over {len(a)} steps of '{ref['cases'][0]['name']}': max "
              f"|diff| {delta.max():.2e}, mean {delta.mean():.2e}, rows bit-equal "
              f"{int((delta.max(1) == 0).sum())}/{len(a)}, argmax equal "
              f"{int((a.argmax(1) == b.argmax(1)).sum())}/{len(a)}, smallest top-2 gap "
              f"{float((top2[:, 1] - top2[:, 0]).min()):.4f}")
    else:
        print("logits: not in both runs (a run that stopped after its tokens)")
    session = gen = None
    theirs = {c["name"]: c for c in other["cases"]}
    equal = unexplained = 0
    print(f"{'case':<24} {'stream':>6}  result")
    missing = [c for c in ref["cases"] if c["name"] not in theirs]
    for case in missing:                 # e.g. the other machine lacks llguidance
        unexplained += len(case["ids"])
        print(f"{case['name']:<24} {'all':>6}  not run on the other machine — NOT explained")
    for case in [c for c in ref["cases"] if c["name"] in theirs]:
        for j, (mine, found) in enumerate(zip(case["ids"], theirs[case["name"]]["ids"])):
            at = _parts(mine, found)
            if at is None:
                equal += 1
                print(f"{case['name']:<24} {j:>6}  equal ({len(mine)} tokens)")
                continue
            text = f"parts at token {at} of {len(mine)}"
            row = other.get("parting_rows", {}).get(f"{case['name']}#{j}")
            if args.bundle is not None and row is not None and at < min(len(mine), len(found)):
                if session is None:
                    gen = Generator.load(args.bundle, backend="cpu", threads=(1, 1))
                    session = cpu_session("target", args.bundle, gen.manifest, threads=1)
                prompt = gen.encode(PROMPTS[case["streams"][j]["prompt"]])
                here, there = _row(session, prompt + mine[:at]), np.asarray(row["row"])
                diff = np.abs(here - there).max()
                fmt = case["streams"][j].get("response_format")
                if fmt is not None:           # the grammar's mask there, on both rows alike
                    matcher = gen.constraint(fmt).matcher()
                    matcher.commit(mine[:at])
                    allowed = matcher.allowed(len(here))
                    here, there = (np.where(allowed, r, -np.inf) for r in (here, there))
                why, ok = _decision(case["streams"][j], here, there, mine[at], found[at],
                                    len(prompt) + at)
                text += f": {why}; rows |diff| {diff:.2e}"
                text += " — explained" if ok else " — NOT explained"
                unexplained += not ok
            else:
                unexplained += 1
            print(f"{case['name']:<24} {j:>6}  {text}")
    total = sum(len(c["ids"]) for c in ref["cases"])
    # the same (prompt, seed) at k = 0, 4, auto gives one stream three times (k-invariance)
    distinct: dict[tuple, bool] = {}
    for case in [c for c in ref["cases"] if c["name"] in theirs]:
        for s, mine, found in zip(case["streams"], case["ids"], theirs[case["name"]]["ids"]):
            key = (s["prompt"], s.get("seed"), "response_format" in s)
            distinct[key] = distinct.get(key, False) or _parts(mine, found) is not None
    for kind, greedy in (("greedy", True), ("seeded", False)):
        keys = [key for key in distinct if (key[1] is None) == greedy]
        print(f"distinct {kind} streams (prompt, seed, schema): {len(keys)}, parted "
              f"{sum(distinct[key] for key in keys)}")
    seconds = [sum(c["seconds"] for c in r["cases"]) for r in (ref, other)]
    print(f"{equal} of {total} streams equal; {total - equal - unexplained} explained, "
          f"{unexplained} unexplained; decoding {seconds[0]:.1f} s here, {seconds[1]:.1f} s "
          f"there (load {ref['load_s']:.1f} s, {other['load_s']:.1f} s)")
    return 1 if unexplained else 0


def _decision(stream: dict, here: np.ndarray, there: np.ndarray, a: int, b: int,
              position: int) -> tuple[str, bool]:
    """Replay the choice of the token at `position` on both rows: (what decided it, whether
    `here` gives a and `there` gives b)."""
    if not stream.get("temperature"):
        picks = [int(np.argmax(r)) for r in (here, there)]
        gaps = [float(r[a] - r[b]) for r in (here, there)]
        why = f"greedy, logit gap {gaps[0]:+.4f} here, {gaps[1]:+.4f} there"
        return why, picks == [a, b]
    params = SamplingParams(temperature=stream["temperature"], top_p=stream.get("top_p", 1.0),
                            seed=stream["seed"])
    noise = InvariantSampling(params, None, len(here)).noise
    probs = [probabilities(r, params) for r in (here, there)]
    picks = [gumbel_pick(p, noise, position) for p in probs]
    inside = [[bool(p[t] > 0) for t in (a, b)] for p in probs]
    if inside[0] != inside[1]:                  # a token crossed the nucleus's edge
        t = a if inside[0][0] != inside[1][0] else b
        edge = [_nucleus_margin(r, t, params) for r in (here, there)]
        why = (f"sampled, nucleus edge: token {t} {'in' if edge[0] > 0 else 'out'} here, "
               f"{'in' if edge[1] > 0 else 'out'} there (its mass past 1 - top_p by "
               f"{edge[0]:+.4f} here, {edge[1]:+.4f} there)")
    else:
        E = noise.at(position, len(here))
        gaps = [float((r[a] - r[b]) / params.temperature - np.log(E[a] / E[b]))
                for r in (here, there)]
        why = (f"sampled, Gumbel-max near-tie: noisy-score gap {gaps[0]:+.4f} here, "
               f"{gaps[1]:+.4f} there (logit gap {float(here[a] - here[b]):+.4f})")
    return why, picks == [a, b]


def _nucleus_margin(row: np.ndarray, token: int, params: SamplingParams) -> float:
    """How far the mass of the tokens ranked at or below `token` (ascending, as top-p
    removes them) lies past 1 - top_p: > 0 keeps it, <= 0 removes it."""
    scores = row.astype(np.float64) / params.temperature
    order = np.argsort(scores, kind="stable")
    ranked = np.exp(scores[order] - scores[order[-1]])
    cumulative = np.cumsum(ranked / ranked.sum())
    return float(cumulative[int(np.nonzero(order == token)[0][0])] - (1 - params.top_p))


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _parts(a: list[int], b: list[int]) -> int | None:
    """The first index where two streams differ (a shorter one parts where it ends), or None."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if at == len(a) == len(b) else at


def _row(session, ids: list[int]) -> np.ndarray:
    """The target's logits after `ids`, computed as k=0 computes its last row."""
    ids = np.asarray(ids, np.int64)
    session.prefill(ids[:-1], 0)
    return np.array(session.forward(ids[-1:], len(ids) - 1)[0])    # (vocab,)


def _trace(session, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """k=0's target rows along prompt + tokens: (len(tokens), vocab)."""
    ids = np.asarray(prompt + tokens, np.int64)
    session.prefill(ids[:len(prompt) - 1], 0)
    rows = [np.array(session.forward(ids[i:i + 1], i)[0])
            for i in range(len(prompt) - 1, len(ids) - 1)]
    return np.stack(rows)


def _cpu() -> str:
    """The x86 model name, or on aarch64 the features ONNX Runtime's kernels choose by: the
    kernel's (or qemu's) HWCAP bits, which is what they read, not /proc/cpuinfo."""
    if platform.machine() == "aarch64":
        import ctypes

        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype = ctypes.c_ulong
        hwcap, hwcap2 = getauxval(16), getauxval(26)        # AT_HWCAP, AT_HWCAP2
        found = [name for name, bit in HWCAP.items() if hwcap >> bit & 1]
        found += [name for name, bit in HWCAP2.items() if hwcap2 >> bit & 1]
        return "HWCAP: " + " ".join(found)
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines
                 if line.startswith("model name")), "unknown")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("bundle", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--tokens", type=int, default=48)
    r.add_argument("--against", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("ref", type=Path)
    c.add_argument("other", type=Path)
    c.add_argument("--bundle", type=Path)
    args = p.parse_args()
    if args.command == "run":
        run(args)
    else:
        sys.exit(compare(args))


if __name__ == "__main__":
    main()
