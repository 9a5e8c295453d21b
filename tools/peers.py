"""Speculative decoding peers side by side on one target/draft pair of Hugging Face folders.

Peers, each against its own target-alone run, on the same prompt token ids (the target
tokenizer's encoding, BOS included), greedy, the same max_new_tokens and thread count:
  ours   ssd_runtime.Generator on an `ssd-export` bundle: k=0, k=auto (and --k fixed ks);
  hf     transformers generate() in float32: the target alone, assisted generation with the
         draft at its defaults and with num_assistant_tokens=4, schedule "constant";
  genai  ONNX Runtime GenAI (model builder, cpu): the fp32 target alone and its draft+target
         speculative mode (model.type "speculative" + model.draft, speculative options), with
         the draft in fp32 and, as ours by default, in int8 (--genai-draft).
Runs are interleaved prompt by prompt (the order rotates). tok/s: median over prompts of new
tokens / wall time of the call, prefill included (GenAI: from append_tokens on; its fixed
og.Generator construction is reported apart). decode: the runtime's own decode-phase rate.
Greedy ids are checked against the peer's own target alone and Hugging Face's target alone.
--isolate measures each peer in a process of its own instead (they slow each other down);
with --rounds N the peers' processes take turns N times and their runs are pooled, so that
the machine's drift between processes hits every peer alike (the ratio of each round is
reported too).

    python tools/peers.py --target T --draft D [--bundle B] [--threads 1,2]
                          [--isolate [--rounds N]] [--json out.json]
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

GOALS = {"genai": 1.2, "hf": 3.0}    # our speculative tok/s over the peer's best speculative


@dataclass
class Sample:
    ids: list[int]                   # new tokens only
    seconds: float
    decode_seconds: float | None = None
    acceptance: float | None = None
    setup_seconds: float | None = None   # GenAI: og.Generator construction, not in `seconds`
    prompt: int = -1


@dataclass
class Variant:
    peer: str
    config: str
    speculative: bool
    run: Callable[[list[int], int], Sample]
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None


# ---------------------------------------------------------------- preparation

def load_prompt_ids(path: str | None, target: Path, limit: int | None) -> list[list[int]]:
    from ssd_runtime.bench import load_prompts
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    return [[int(i) for i in tok(p)["input_ids"]] for p in load_prompts(path)[:limit]]


def pair_stamp(target: Path, draft: Path) -> str:
    parts = [f"{f.resolve()}:{f.stat().st_mtime_ns}:{f.stat().st_size}"
             for d in (target, draft) for f in sorted(d.iterdir()) if f.is_file()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _fresh(out: Path, marker: str, stamp: str) -> bool:
    s = out / ".peers-stamp"
    return (out / marker).exists() and s.exists() and s.read_text() == stamp


def _sh(cmd: list[str], log: Path) -> None:
    with open(log, "w") as f:
        rc = subprocess.run(cmd, check=False, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = " | ".join(log.read_text().strip().splitlines()[-4:])
        raise RuntimeError(f"{' '.join(cmd)} exited {rc} (log {log}): {tail}")


def export_bundle(target: Path, draft: Path, workdir: Path, stamp: str) -> Path:
    out = workdir / "bundle"
    if _fresh(out, "manifest.json", stamp):
        print(f"reusing bundle {out}")
        return out
    print(f"ssd-export -> {out}", flush=True)
    exe = Path(sys.executable).with_name("ssd-export")
    _sh([str(exe) if exe.exists() else "ssd-export", "--target", str(target), "--draft",
         str(draft), "--output", str(out), "--force", "--quiet"], workdir / "ssd-export.log")
    (out / ".peers-stamp").write_text(stamp)
    return out


def build_genai(target: Path, draft: Path, workdir: Path, stamp: str,
                draft_precisions: list[str]) -> dict[str, Path]:
    """The target (fp32) and a draft per precision through the model builder; per draft
    precision one folder whose genai_config.json is the speculative one, with the models nested
    under it (GenAI takes model paths only relative to, and under, the config's folder; the
    fp32 one holds the models, the others link to them)."""
    root = workdir / "genai"
    builds = [("target", target, "fp32")] + \
        [(_draft_dir(p), draft, p) for p in draft_precisions]
    for name, src, precision in builds:
        out = root / name
        if _fresh(out, "genai_config.json", stamp):
            continue
        print(f"onnxruntime_genai builder: {src} -> {out} ({precision})", flush=True)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        _sh([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o",
             str(out), "-p", precision, "-e", "cpu", "-c", str(workdir / "genai-cache")],
            workdir / f"genai-builder-{name}.log")
        (out / ".peers-stamp").write_text(stamp)
    roots = {}
    for precision in draft_precisions:
        spec_root = root if precision == "fp32" else workdir / f"genai-{precision}-draft"
        if spec_root != root:
            shutil.rmtree(spec_root, ignore_errors=True)
            spec_root.mkdir()
            (spec_root / "target").symlink_to(root / "target")
            (spec_root / "draft").symlink_to(root / _draft_dir(precision))
        spec = json.loads((root / "target/genai_config.json").read_text())
        block = json.loads((spec_root / "draft/genai_config.json").read_text())["model"]
        spec["model"]["type"] = "speculative"
        spec["model"]["decoder"]["filename"] = "target/" + spec["model"]["decoder"]["filename"]
        spec["model"]["draft"] = dict(block["decoder"],
                                      filename="draft/" + block["decoder"]["filename"])
        spec["speculative"] = {"max_draft_tokens": 4}        # overridden per run
        (spec_root / "genai_config.json").write_text(json.dumps(spec, indent=2) + "\n")
        roots[precision] = spec_root
    return roots


def _draft_dir(precision: str) -> str:
    return "draft" if precision == "fp32" else f"draft-{precision}"


# ---------------------------------------------------------------- peers

def ours_variants(bundle: Path, threads: int, ks: list[int | str]) -> list[Variant]:
    from ssd_runtime import Generator
    from ssd_runtime.backends import cpu_cores

    # The same thread budget as the other peers; within it, what the runtime does by default:
    # with every core allowed it picks each model's count itself (here target 2, draft 1).
    placement = None if threads >= cpu_cores() else (threads, threads)
    gen = Generator.load(bundle, backend="cpu", threads=placement)   # every peer runs on CPU
    where = f" ({gen.target.threads}:{gen.draft.threads})"

    def runner(k: int | str) -> Callable[[list[int], int], Sample]:
        def run(ids: list[int], n: int) -> Sample:
            t0 = time.perf_counter()
            res = gen.generate(ids, max_new_tokens=n, k=k)
            return Sample(list(res.token_ids), time.perf_counter() - t0,
                          res.stats.seconds["decode"], res.stats.acceptance_rate if k else None)
        return run
    return [Variant("ours", f"k={k}{where}", k != 0, runner(k)) for k in [0, *ks]]


def hf_variants(target, draft, threads: int) -> list[Variant]:
    import torch

    defaults = copy.deepcopy(draft.generation_config)

    def runner(assist: dict | None) -> Callable[[list[int], int], Sample]:
        def run(ids: list[int], n: int) -> Sample:
            torch.set_num_threads(threads)
            kw: dict = {}
            if assist is not None:
                # The candidate generator reads these from the ASSISTANT's generation_config
                # (generate() kwargs alone do not reach it) and "heuristic" mutates it: reset.
                draft.generation_config = copy.deepcopy(defaults)
                for key, value in assist.items():
                    setattr(draft.generation_config, key, value)
                kw = {"assistant_model": draft, **assist}
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                      max_new_tokens=n, pad_token_id=target.config.pad_token_id,
                                      **kw)
            return Sample(out[0, len(ids):].tolist(), time.perf_counter() - t0)
        return run
    fixed4 = {"num_assistant_tokens": 4, "num_assistant_tokens_schedule": "constant"}
    return [Variant("hf", "target", False, runner(None)),
            Variant("hf", "assisted default", True, runner({})),
            Variant("hf", "assisted 4 constant", True, runner(fixed4))]


def genai_variants(roots: dict[str, Path], threads: int, genai_ks: list[str],
                   notes: list[str]) -> list[Variant]:
    import numpy as np
    import onnxruntime_genai as og

    def options(n: int) -> dict:
        return {"session_options": {"intra_op_num_threads": n, "inter_op_num_threads": 1}}

    def model(path: Path, spec: bool, draft_threads: int = threads):
        cfg = og.Config(str(path))
        cfg.overlay(json.dumps({"model": {"decoder": options(threads),
                                          **({"draft": options(draft_threads)} if spec else {})}}))
        return og.Model(cfg)

    def runner(m, opts: dict | None) -> Callable[[list[int], int], Sample]:
        def run(ids: list[int], n: int) -> Sample:
            s0 = time.perf_counter()
            params = og.GeneratorParams(m)
            params.set_search_options(do_sample=False, max_length=len(ids) + n)
            if opts:
                params.set_speculative_options(**opts)
            gen = og.Generator(m, params)        # a fixed ~15 ms here: timed apart
            t0 = time.perf_counter()
            gen.append_tokens(np.asarray([ids], dtype=np.int32))
            t1 = time.perf_counter()
            while not gen.is_done():
                gen.generate_next_token()
            t2 = time.perf_counter()
            acc = gen.get_speculative_stats().get("acceptance_rate") if opts else None
            return Sample([int(t) for t in gen.get_sequence(0)[len(ids):]], t2 - t0, t2 - t1,
                          acc, t0 - s0)
        return run

    any_root = next(iter(roots.values()))
    out = [Variant("genai", "target", False, runner(model(any_root / "target", False), None))]
    for precision, root in roots.items():
        try:
            spec = model(root, True)
        except Exception as exc:             # noqa: BLE001 - report the peer's own words
            notes.append(f"GenAI speculative mode not loadable ({root}/genai_config.json): "
                         f"{exc}")
            continue
        # the placement ours picks by itself (draft on one thread), offered to GenAI too
        specs = [(spec, "")] + \
            ([(model(root, True, 1), f" ({threads}:1)")] if threads > 1 else [])
        label = "" if precision == "fp32" else f" {precision} draft"
        for m, where in specs:
            for k in genai_ks:
                adaptive = k == "adaptive"
                opts = {"max_draft_tokens": 4 if adaptive else int(k),
                        "min_adaptive_k": 2 if adaptive else 0}
                name = ("adaptive" if adaptive else f"K={k}") + where + label
                out.append(Variant("genai", name, True, runner(m, opts)))
    return out


# ---------------------------------------------------------------- measurement and report

def measure(variants: list[Variant], prompts: list[list[int]], n: int, repeats: int,
            notes: list[str]) -> None:
    for v in variants:                       # warm-up (and k=auto's calibration), not recorded
        _guard(v, notes, v.run, prompts[0], min(8, n))
    for r in range(repeats):
        for p, ids in enumerate(prompts):
            live = [v for v in variants if v.error is None]
            shift = (r * len(prompts) + p) % max(1, len(live))
            for v in live[shift:] + live[:shift]:
                _guard(v, notes, _record, v, ids, n, p)
        print(f"  round {r + 1}/{repeats} done", flush=True)


def _record(v: Variant, ids: list[int], n: int, prompt: int) -> None:
    v.samples.append(sample := v.run(ids, n))
    sample.prompt = prompt


def _guard(v: Variant, notes: list[str], fn: Callable[..., object], *args: object) -> None:
    if v.error is None:
        try:
            fn(*args)
        except Exception as exc:             # noqa: BLE001 - one failing peer must not stop all
            v.error = f"{type(exc).__name__}: {exc}"
            notes.append(f"{v.peer} {v.config} failed and was dropped: {v.error}")


def _rate(v: Variant, secs: Callable[[Sample], float | None]) -> float | None:
    """Median over prompts of new tokens / seconds, each summed over that prompt's repeats."""
    per: dict[int, list[float]] = {}
    for s in v.samples:
        if (t := secs(s)) is None:
            return None
        acc = per.setdefault(s.prompt, [0.0, 0.0])
        acc[0], acc[1] = acc[0] + len(s.ids), acc[1] + t
    rates = [k / t for k, t in per.values() if t > 0]
    return statistics.median(rates) if rates else None


def _greedy(v: Variant, ref: Variant | None) -> dict | None:
    if ref is None or ref is v or not v.samples or len(ref.samples) != len(v.samples):
        return None
    return _agreement([s.ids for s in v.samples], [s.ids for s in ref.samples])


def _agreement(runs: list[list[int]], refs: list[list[int]]) -> dict:
    """How many runs equal their reference run, and where each first differs (None: equal)."""
    diffs = [None if a == b else next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                                      min(len(a), len(b))) for a, b in zip(runs, refs)]
    return {"equal": diffs.count(None), "of": len(diffs), "first_diff": diffs}


def summarise(threads: int, variants: list[Variant]) -> list[dict]:
    own = {v.peer: v for v in variants if not v.speculative and v.error is None}
    rows = []
    for v in variants:
        tps = _rate(v, lambda s: s.seconds)
        base = _rate(own[v.peer], lambda s: s.seconds) if v.peer in own else None
        setups = [s.setup_seconds for s in v.samples if s.setup_seconds is not None]
        accs = [s.acceptance for s in v.samples if s.acceptance is not None]
        rows.append({
            "threads": threads, "peer": v.peer, "config": v.config, "speculative": v.speculative,
            "tokens_per_s": tps, "decode_tokens_per_s": _rate(v, lambda s: s.decode_seconds),
            "speedup_vs_own_target": tps / base if tps and base else None,
            "acceptance": statistics.mean(accs) if accs else None,
            "setup_ms": 1e3 * statistics.median(setups) if setups else None,
            "tokens_per_s_with_setup": _rate(v, lambda s: s.seconds + s.setup_seconds)
            if setups else None,
            "greedy_vs_own_target": _greedy(v, own.get(v.peer)) if v.speculative else None,
            "greedy_vs_hf_target": _greedy(v, own.get("hf")), "error": v.error,
            "runs": [dict(asdict(s), new_tokens=len(s.ids)) for s in v.samples]})
    return rows


def ratios(rows: list[dict], threads: int) -> list[dict]:
    mine = [r for r in rows if r["threads"] == threads and r["speculative"] and r["tokens_per_s"]]

    def best(peer: str) -> dict | None:
        return max((r for r in mine if r["peer"] == peer), key=lambda r: r["tokens_per_s"],
                   default=None)
    ours = next((r for r in mine if r["peer"] == "ours" and r["config"].startswith("k=auto")),
                None) \
        or best("ours")
    out = []
    for peer, goal in GOALS.items():
        q: dict = {"threads": threads, "peer": peer, "goal": goal, "ratio": None}
        out.append(q)
        if not (ours and (other := best(peer))):
            continue
        q.update(ours=ours["config"], peer_config=other["config"],
                 ratio=ours["tokens_per_s"] / other["tokens_per_s"])
        q["met"] = q["ratio"] >= goal
        if ours["decode_tokens_per_s"] and other["decode_tokens_per_s"]:
            q["decode_ratio"] = ours["decode_tokens_per_s"] / other["decode_tokens_per_s"]
        if other["tokens_per_s_with_setup"]:
            q["ratio_with_peer_setup"] = ours["tokens_per_s"] / other["tokens_per_s_with_setup"]
    return out


def _f(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def format_table(report: dict) -> str:
    def eq(e: dict | None) -> str:
        return f"{e['equal']}/{e['of']}" if e else "-"
    head = (f"{'thr':>3} {'peer':<6} {'config':<28} {'tok/s':>8} {'decode':>8} {'x own':>6} "
            f"{'acc':>5} {'=own':>5} {'=hf':>5}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        lines.append(f"{r['threads']:>3} {r['peer']:<6} {r['config']:<28} "
                     f"{_f(r['tokens_per_s'], '8.1f'):>8} {_f(r['decode_tokens_per_s'], '8.1f'):>8}"
                     f" {_f(r['speedup_vs_own_target'], '6.2f'):>6} {_f(r['acceptance'], '5.2f'):>5}"
                     f" {eq(r['greedy_vs_own_target']):>5} {eq(r['greedy_vs_hf_target']):>5}"
                     + (f"  FAILED: {r['error']}" if r["error"] else ""))
    for q in report["ratios"]:
        if q["ratio"] is None:
            lines.append(f"threads {q['threads']}: ours / {q['peer']}: n/a (a side did not run)")
            continue
        extra = "".join(f"; {label} {q[key]:.2f}x" for key, label in (
            ("decode_ratio", "decode phase"), ("ratio_with_peer_setup", "with its setup"))
            if key in q)
        lines.append(f"threads {q['threads']}: ours {q['ours']} / {q['peer']} {q['peer_config']}"
                     f" = {q['ratio']:.2f}x (goal >= {q['goal']}x: "
                     f"{'met' if q['met'] else 'NOT met'}){extra}")
        per_round = [r["ratio"] for rnd in report.get("ratios_per_round", []) for r in rnd
                     if (r["threads"], r["peer"]) == (q["threads"], q["peer"])]
        if per_round:
            lines.append("  each round on its own: " + ", ".join(
                "n/a" if x is None else f"{x:.2f}x" for x in per_round))
    if setup := [r["setup_ms"] for r in report["results"] if r["setup_ms"] is not None]:
        lines.append(f"GenAI og.Generator construction: median {statistics.median(setup):.1f} ms "
                     f"per request, outside its tok/s ('with its setup' counts it)")
    lines.append("tok/s: median over prompts, prefill included; decode: the runtime's decode "
                 "phase; x own: over the peer's target alone; =own / =hf: runs whose greedy ids "
                 "equal the peer's own / Hugging Face's target-alone output")
    return "\n".join(lines + [f"note: {n}" for n in report["notes"]])


def versions() -> dict:
    from importlib.metadata import distributions
    wanted = {"torch", "transformers", "onnxruntime", "onnxruntime-genai", "ssd-toolkit"}
    return {d.metadata["Name"]: d.version for d in distributions()
            if d.metadata["Name"] in wanted}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="target Hugging Face folder")
    p.add_argument("--draft", required=True, help="draft Hugging Face folder")
    p.add_argument("--bundle", help="ssd bundle of the same pair (default: export one)")
    p.add_argument("--prompts", help="JSONL, one {\"prompt\": ...} per line (default: "
                   "runtime/data/bench_prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, help="only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
    p.add_argument("--k", default="auto", help="our speculative ks besides k=0, e.g. auto,4")
    p.add_argument("--genai-k", default="4,adaptive",
                   help="GenAI speculative settings: fixed K (1..16) and/or adaptive")
    p.add_argument("--genai-draft", default="fp32,int8",
                   help="GenAI draft precisions (model builder -p): fp32 (the pair as it is) "
                        "and/or int8, int4 (quantized like ours; its target stays fp32)")
    p.add_argument("--repeats", type=int, default=1, help="passes over the prompts")
    p.add_argument("--skip", default="", help="peers to leave out: ours,hf,genai")
    p.add_argument("--isolate", action="store_true",
                   help="measure each peer in a process of its own, one after the other, and "
                        "report them together: peers sharing a process and cores slow each "
                        "other down (thread pools, caches), and not by the same amount")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --isolate: the peers' processes take turns this many times and "
                        "their runs are pooled (drift between processes then hits each alike)")
    p.add_argument("--json", dest="json_out", help="write the report here")
    p.add_argument("--workdir", help="bundle and GenAI models (default: /tmp/ssd-peers/<pair>)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    target, draft = Path(args.target).resolve(), Path(args.draft).resolve()
    threads = [int(t) for t in args.threads.split(",")]
    ks = [k if k == "auto" else int(k) for k in args.k.split(",") if k not in ("", "0")]
    genai_ks = [k for k in args.genai_k.split(",") if k]
    if bad := [k for k in genai_ks if k != "adaptive" and not 1 <= int(k) <= 16]:
        raise SystemExit(f"--genai-k {bad[0]}: GenAI takes K in [1, 16] or 'adaptive'.")
    genai_drafts = [p for p in args.genai_draft.split(",") if p]
    if bad := [p for p in genai_drafts if p not in ("fp32", "int8", "int4")]:
        raise SystemExit(f"--genai-draft {bad[0]}: choose fp32, int8 or int4.")
    skip = set(filter(None, args.skip.split(",")))
    if args.rounds < 1 or (args.rounds > 1 and not args.isolate):
        raise SystemExit(f"--rounds {args.rounds}: give a count of 1 or more, with --isolate.")
    if args.isolate:
        return isolated(argv if argv is not None else sys.argv[1:], skip, args.json_out,
                        args.rounds)
    stamp = pair_stamp(target, draft)
    workdir = Path(args.workdir or f"/tmp/ssd-peers/{stamp}").resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    prompts = load_prompt_ids(args.prompts, target, args.num_prompts)
    bundle = Path(args.bundle).resolve() if args.bundle else \
        export_bundle(target, draft, workdir, stamp) if "ours" not in skip else None
    genai_roots = None
    if "genai" not in skip:
        try:
            import onnxruntime_genai  # noqa: F401
            genai_roots = build_genai(target, draft, workdir, stamp, genai_drafts)
        except Exception as exc:             # noqa: BLE001 - say why, go on with the others
            notes.append(f"GenAI skipped: {type(exc).__name__}: {exc}")
    hf = None
    if "hf" not in skip:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf = [AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
              for d in (target, draft)]
    rows: list[dict] = []
    for t in threads:
        print(f"threads {t}: {len(prompts)} prompts x {args.max_new_tokens} new tokens "
              f"x {args.repeats}", flush=True)
        variants = (ours_variants(bundle, t, ks) if "ours" not in skip else []) + \
            (hf_variants(*hf, t) if hf else [])
        if genai_roots:
            try:
                variants += genai_variants(genai_roots, t, genai_ks, notes)
            except Exception as exc:         # noqa: BLE001
                notes.append(f"GenAI not loadable at {t} threads: {type(exc).__name__}: {exc}")
        measure(variants, prompts, args.max_new_tokens, args.repeats, notes)
        rows += summarise(t, variants)
    report = {"target": str(target), "draft": str(draft),
              "bundle": str(bundle) if bundle else None,
              "workdir": str(workdir),
              "genai_models": {p: str(r) for p, r in (genai_roots or {}).items()},
              "max_new_tokens": args.max_new_tokens, "threads": threads, "repeats": args.repeats,
              "prompt_tokens": [len(p) for p in prompts], "versions": versions(),
              "results": rows, "ratios": [q for t in threads for q in ratios(rows, t)],
              "notes": notes}
    print(format_table(report))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def isolated(argv: list[str], skip: set[str], json_out: str | None, rounds: int = 1) -> int:
    """--isolate: this script once per peer and round, in a process of its own, the peers
    taking turns; then one report of the pooled runs."""
    import subprocess
    import tempfile

    base = [a for a in argv if a != "--isolate"]
    for flag in ("--skip", "--json", "--rounds"):     # replaced per peer below
        while flag in base:
            i = base.index(flag)
            del base[i:i + 2]
        base = [a for a in base if not a.startswith(flag + "=")]
    peers = [p for p in ("ours", "genai", "hf") if p not in skip]
    assert peers, "every peer skipped"
    reports: list[list[dict]] = []                    # per round: each peer's report
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            reports.append([])
            for peer in peers:
                out = Path(tmp) / f"{peer}-{r}.json"
                others = ",".join(p for p in ("ours", "genai", "hf") if p != peer)
                print(f"--- {peer}, in a process of its own"
                      + (f" (round {r + 1}/{rounds})" if rounds > 1 else ""), flush=True)
                subprocess.run([sys.executable, __file__, *base, "--skip", others,
                                "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
                reports[-1].append(json.loads(out.read_text()))
    merged = dict(reports[0][0])
    every = [rep for round_ in reports for rep in round_]
    merged["bundle"] = next((rep["bundle"] for rep in every if rep["bundle"]), None)
    merged["genai_models"] = next((rep["genai_models"] for rep in every if rep["genai_models"]),
                                  {})
    merged["notes"] = list(dict.fromkeys(n for rep in every for n in rep["notes"]))
    merged["isolated"], merged["rounds"] = True, rounds
    merged["results"] = _pooled([row for rep in every for row in rep["results"]])
    merged["ratios"] = [q for t in merged["threads"] for q in ratios(merged["results"], t)]
    if rounds > 1:
        merged["ratios_per_round"] = [
            [q for t in merged["threads"]
             for q in ratios([row for rep in round_ for row in rep["results"]], t)]
            for round_ in reports]
    merged["results"] = _greedy_across(merged["results"])
    print(format_table(merged))
    if json_out:
        Path(json_out).write_text(json.dumps(merged, indent=2) + "\n")
    return 0


def _pooled(rows: list[dict]) -> list[dict]:
    """Rows of the same (threads, peer, config) from several processes, as one: their runs
    pooled and summarised again (the order of first appearance kept)."""
    variants: dict[tuple, Variant] = {}
    for row in rows:
        key = (row["threads"], row["peer"], row["config"])
        v = variants.setdefault(key, Variant(row["peer"], row["config"], row["speculative"],
                                             run=None))
        v.error = v.error or row["error"]
        v.samples += [Sample(**{k: x for k, x in run.items() if k != "new_tokens"})
                      for run in row["runs"]]
    return [row for t in dict.fromkeys(k[0] for k in variants)
            for row in summarise(t, [v for k, v in variants.items() if k[0] == t])]


def _greedy_across(rows: list[dict]) -> list[dict]:
    """Greedy equality against Hugging Face's target, for rows measured in other processes."""
    ref = {r["threads"]: r for r in rows if r["peer"] == "hf" and not r["speculative"]}
    for r in rows:
        hf = ref.get(r["threads"])
        if hf is None or r is hf or len(hf["runs"]) != len(r["runs"]):
            continue
        r["greedy_vs_hf_target"] = _agreement([run["ids"] for run in r["runs"]],
                                              [run["ids"] for run in hf["runs"]])
    return rows


if __name__ == "__main__":
    sys.exit(main())
