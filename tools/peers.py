"""Speculative decoding peers side by side on one target/draft pair of Hugging Face folders.

Peers, each against its own target-alone run, on the same prompt token ids (the target
tokenizer's encoding, BOS included), greedy, the same max_new_tokens and thread count:
  ours   ssd_runtime.Generator on an `ssd-export` bundle: k=0, k=auto (and --k fixed ks, draft
         trees of a set shape);
  hf     transformers generate() in float32: the target alone, assisted generation with the
         draft at its defaults and with num_assistant_tokens=4, schedule "constant";
  genai  ONNX Runtime GenAI (model builder, cpu): the target alone in fp32 and/or int4
         (--genai-target) and its draft+target speculative mode (model.type "speculative" +
         model.draft, speculative options), with the draft in fp32 and, as ours by default, in
         int8 (--genai-draft);
  llamacpp  llama.cpp's llama-speculative-simple (--llama-cpp BIN --llama-cpp-src SRC; how to
         build them: tools/peer_llamacpp.py): the target alone in f32, Q8_0 and Q4_0, and its
         draft speculative mode with a Q4_0 target and a Q8_0 draft (--llamacpp-spec).
Runs are interleaved prompt by prompt (the order rotates). tok/s: median over prompts of new
tokens / wall time of the call, prefill included (GenAI: from append_tokens on; its fixed
og.Generator construction is reported apart). decode: the runtime's own decode-phase rate.
Greedy ids are checked against the peer's own target alone (in the same precision) and
Hugging Face's float target alone; a quantized target's output differs from the float one's,
so there the agreement is reported, not required. Several --bundle (e.g. our fp32 and int4
exports of the pair) each run as ours, labelled by their target's quantization.
--isolate measures each peer in a process of its own instead (they slow each other down);
with --rounds N the peers' processes take turns N times and their runs are pooled, so that
the machine's drift between processes hits every peer alike (the ratio of each round is
reported too).

    python tools/peers.py --target T --draft D [--bundle B ...] [--threads 1,2]
                          [--genai-target fp32,int4] [--llama-cpp BIN --llama-cpp-src SRC]
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

from peer_llamacpp import QUANTS

PEERS = ("ours", "genai", "hf", "llamacpp")


@dataclass(frozen=True)
class Goal:
    """Ours over a peer, each side its best row of a kind: (target precision, speculative?)."""
    name: str
    ours: tuple[str, bool]
    peer: str
    theirs: tuple[str, bool]
    goal: float
    metric: str = "tokens_per_s"     # or "decode_tokens_per_s": the step, without the prefill


GOALS = [Goal("genai", ("fp32", True), "genai", ("fp32", True), 1.2),
         Goal("hf", ("fp32", True), "hf", ("fp32", True), 3.0),
         # issue 23: a quantized target against the peers' quantized targets
         Goal("genai int4 step", ("int4", False), "genai", ("int4", False), 1.0,
              "decode_tokens_per_s"),
         Goal("llamacpp q4_0 target", ("int4", True), "llamacpp", ("q4_0", False), 1.0),
         Goal("llamacpp speculative", ("int4", True), "llamacpp", ("q4_0", True), 1.0)]


@dataclass
class Sample:
    ids: list[int]                   # new tokens only
    seconds: float
    decode_seconds: float | None = None
    acceptance: float | None = None
    setup_seconds: float | None = None   # GenAI: og.Generator construction, not in `seconds`
    prompt: int = -1
    busy_before: float | None = None     # --wait-idle: the CPUs' busy share just before


@dataclass
class GenaiModels:
    targets: dict[str, Path]                 # precision -> the builder's folder
    speculative: dict[tuple[str, str], Path] = field(default_factory=dict)   # (target, draft)


@dataclass
class Variant:
    peer: str
    config: str
    speculative: bool
    run: Callable[[list[int], int], Sample]
    target: str = "fp32"             # the target's precision: fp32, int8, int4, q8_0, q4_0
    samples: list[Sample] = field(default_factory=list)
    error: str | None = None


# ---------------------------------------------------------------- preparation

def load_prompt_ids(path: str | None, target: Path, limit: int | None
                    ) -> tuple[list[str], list[list[int]]]:
    from ssd_runtime.bench import load_prompts
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    texts = load_prompts(path)[:limit]
    return texts, [[int(i) for i in tok(p)["input_ids"]] for p in texts]


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
                target_precisions: list[str], draft_precisions: list[str]) -> GenaiModels:
    """The target and the draft per precision through the model builder; per (target, draft)
    precisions one folder whose genai_config.json is the speculative one, with the models nested
    under it (GenAI takes model paths only relative to, and under, the config's folder; the
    fp32 one holds the models, the others link to them)."""
    root = workdir / "genai"
    builds = [(_genai_dir("target", p), target, p) for p in target_precisions] + \
        [(_genai_dir("draft", p), draft, p) for p in draft_precisions]
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
    models = GenaiModels({p: root / _genai_dir("target", p) for p in target_precisions})
    for tp in target_precisions:
        for dp in draft_precisions:
            spec_root = root if (tp, dp) == ("fp32", "fp32") else workdir / (
                f"genai-{dp}-draft" if tp == "fp32" else f"genai-{tp}-target-{dp}-draft")
            if spec_root != root:
                shutil.rmtree(spec_root, ignore_errors=True)
                spec_root.mkdir()
                (spec_root / "target").symlink_to(root / _genai_dir("target", tp))
                (spec_root / "draft").symlink_to(root / _genai_dir("draft", dp))
            spec = json.loads((spec_root / "target/genai_config.json").read_text())
            block = json.loads((spec_root / "draft/genai_config.json").read_text())["model"]
            spec["model"]["type"] = "speculative"
            spec["model"]["decoder"]["filename"] = \
                "target/" + spec["model"]["decoder"]["filename"]
            spec["model"]["draft"] = dict(block["decoder"],
                                          filename="draft/" + block["decoder"]["filename"])
            spec["speculative"] = {"max_draft_tokens": 4}        # overridden per run
            (spec_root / "genai_config.json").write_text(json.dumps(spec, indent=2) + "\n")
            models.speculative[tp, dp] = spec_root
    return models


def prepare_llamacpp(bin_dir: str, src: str, target: Path, draft: Path, workdir: Path,
                     stamp: str, targets: list[str], spec: list[tuple[str, str]],
                     texts: list[str], prompts: list[list[int]], notes: list[str]):
    """GGUF files of the pair in the types asked, and the prompt texts, each checked to give
    llama.cpp our prompt ids (it takes text, not ids)."""
    import peer_llamacpp as lc
    from transformers import AutoTokenizer

    tools = lc.locate(bin_dir, src)
    quants = {"target": set(targets) | {t for t, _ in spec}, "draft": {d for _, d in spec}}
    models = {"target": target, **({"draft": draft} if spec else {})}
    files = lc.prepare(tools, models, quants, workdir, stamp, lambda m: print(m, flush=True))
    tok = AutoTokenizer.from_pretrained(target)
    given = {}
    for i, (text, ids) in enumerate(zip(texts, prompts)):
        theirs = lc.tokenize(tools, files["target", "f32"], text)
        if theirs == ids[1:]:
            # the GGUF adds no BOS (the converter's rule for 49,152-token vocabularies, which
            # the random SmolLM2-360M has): give it as text, which llama.cpp parses as special
            text = tok.convert_ids_to_tokens(ids[0]) + text
            theirs = lc.tokenize(tools, files["target", "f32"], text)
        if theirs != ids:
            notes.append(f"llama.cpp tokenizes prompt {i} as {theirs[:12]}..., ours "
                         f"{ids[:12]}...: its runs of it start from other ids")
        given[tuple(ids)] = text
    return lc.Prepared(tools, files, given)


def _genai_paths(models: GenaiModels | None) -> dict[str, str]:
    if models is None:
        return {}
    return {**{f"{p} target": str(d) for p, d in models.targets.items()},
            **{f"{tp} target {dp} draft": str(d) for (tp, dp), d in models.speculative.items()}}


def _genai_dir(role: str, precision: str) -> str:
    return role if precision == "fp32" else f"{role}-{precision}"


def _quantized(**precisions: str) -> str:
    """" int4 target int8 draft": the models not in fp32 (fp32 ones keep earlier runs' names)."""
    return "".join(f" {p} {role}" for role, p in precisions.items() if p != "fp32")


# ---------------------------------------------------------------- peers

def ours_variants(bundle: Path, threads: int, ks: list[int | str]) -> list[Variant]:
    from ssd_runtime import Generator
    from ssd_runtime.machine import cpu_cores
    from ssd_runtime.round.drafting import Drafter
    from ssd_runtime.round.tree_draft import TreeShape

    # The same thread budget as the other peers; within it, what the runtime does by default:
    # with every core allowed it picks each model's count itself (here target 2, draft 1).
    placement = None if threads >= cpu_cores() else (threads, threads)
    gen = Generator.load(bundle, backend="cpu", threads=placement)   # every peer runs on CPU
    where = f" ({gen.target.threads}:{gen.draft.threads})"
    quant = gen.manifest.target.quant        # "none", or issue 23's int8 / int4 target
    precision = "fp32" if quant == "none" else quant
    # a head's bundle apart from a draft model's of the same target precision, and a quantized
    # target's graph flavour (ort or static) named
    flavour = f" {gen.manifest.target.graph}" if quant != "none" else ""
    label = (_quantized(target=precision) + flavour
             + (" head" if gen.features is not None else "")).lstrip()

    def runner(k: int | str, source: str, shape: TreeShape | None
               ) -> Callable[[list[int], int], Sample]:
        def run(ids: list[int], n: int) -> Sample:
            Drafter.tree_shape = shape
            try:
                t0 = time.perf_counter()
                res = gen.generate(ids, max_new_tokens=n, k=k, draft_source=source)
            finally:
                Drafter.tree_shape = None
            return Sample(list(res.token_ids), time.perf_counter() - t0,
                          res.stats.seconds["decode"], res.stats.acceptance_rate if k else None)
        return run

    def variant(spec: int | str) -> Variant:   # "auto", 8, "auto/model", "8/lookup", "t6x5x1x1@1"
        k, _, source = str(spec).partition("/")
        shape = None
        if k.startswith("t"):                   # a draft tree of that TreeShape at k = its K
            dims, _, k = k[1:].partition("@")
            shape = TreeShape.parse(dims)
        k = k if k == "auto" else int(k)
        tree = f" tree {dims}" if shape else ""
        named = f"{label} k={k}{tree}{' ' + source if source else ''}{where}".lstrip()
        return Variant("ours", named, k != 0, runner(k, source or "fused", shape), precision)
    return [variant(k) for k in [0, *ks]]


def named_apart(bundles: list[Path], threads: int, ks: list[int | str]) -> list[Variant]:
    """ours_variants of each bundle, one whose labels an earlier bundle took named by its
    folder too (two bundles of one flavour and precision, e.g. before and after a change)."""
    taken: set[str] = set()
    variants = []
    for bundle in bundles:
        for v in ours_variants(bundle, threads, ks):
            if v.config in taken:
                v.config = f"{v.config} [{bundle.name}]"
            taken.add(v.config)
            variants.append(v)
    return variants


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


def llamacpp_variants(llama, threads: int, targets: list[str], spec: list[tuple[str, str]],
                      ks: list[int], tokenizer_dir: Path) -> list[Variant]:
    import peer_llamacpp as lc
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)

    def runner(tq: str, dq: str | None, draft_threads: int, k: int
               ) -> Callable[[list[int], int], Sample]:
        def run(ids: list[int], n: int) -> Sample:
            text, target = llama.texts[tuple(ids)], llama.files["target", tq]
            r = lc.speculative(llama.tools, target, llama.files["draft", dq], text, len(ids),
                               n, threads, draft_threads, k) if dq else \
                lc.target_alone(llama.tools, target, text, len(ids), n, threads)
            # llama.cpp prints text: its ids are the text encoded again by our tokenizer
            new = tok(r.text, add_special_tokens=False)["input_ids"][:n]
            return Sample(new, r.seconds, r.decode_seconds, r.acceptance)
        return run
    out = [Variant("llamacpp", f"{q} target", False, runner(q, None, threads, 0), q)
           for q in targets]
    for tq, dq in spec:
        # as for GenAI: both models on every thread, and the draft on one (ours' placement)
        for dt in [threads] + ([1] if threads > 1 else []):
            where = f" ({threads}:1)" if dt != threads else ""
            out += [Variant("llamacpp", f"n_max={k}{where} {tq} target {dq} draft", True,
                            runner(tq, dq, dt, k), tq) for k in ks]
    return out


def genai_variants(models: GenaiModels, threads: int, genai_ks: list[str],
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

    out = [Variant("genai", (_quantized(target=tp) or "target").strip(), False,
                   runner(model(path, False), None), tp)
           for tp, path in models.targets.items()]
    for (tp, dp), root in models.speculative.items():
        try:
            spec = model(root, True)
        except Exception as exc:             # noqa: BLE001 - report the peer's own words
            notes.append(f"GenAI speculative mode not loadable ({root}/genai_config.json): "
                         f"{exc}")
            continue
        # the placement ours picks by itself (draft on one thread), offered to GenAI too
        specs = [(spec, "")] + \
            ([(model(root, True, 1), f" ({threads}:1)")] if threads > 1 else [])
        label = _quantized(target=tp, draft=dp)
        for m, where in specs:
            for k in genai_ks:
                adaptive = k == "adaptive"
                opts = {"max_draft_tokens": 4 if adaptive else int(k),
                        "min_adaptive_k": 2 if adaptive else 0}
                name = ("adaptive" if adaptive else f"K={k}") + where + label
                out.append(Variant("genai", name, True, runner(m, opts), tp))
    return out


# ---------------------------------------------------------------- measurement and report

def measure(variants: list[Variant], prompts: list[list[int]], n: int, repeats: int,
            notes: list[str], wait_idle: float = 0.0) -> None:
    for v in variants:                       # warm-up (and k=auto's calibration), not recorded
        _guard(v, notes, v.run, prompts[0], min(8, n))
    for r in range(repeats):
        for p, ids in enumerate(prompts):
            live = [v for v in variants if v.error is None]
            shift = (r * len(prompts) + p) % max(1, len(live))
            for v in live[shift:] + live[:shift]:
                busy = idle_cpus(wait_idle) if wait_idle else None
                _guard(v, notes, _record, v, ids, n, p, busy)
        print(f"  round {r + 1}/{repeats} done", flush=True)


def idle_cpus(limit_s: float, busy_max: float = 0.15, window_s: float = 0.25) -> float:
    """Wait (at most limit_s) until the CPUs were busy less than busy_max of a window, and
    return the last window's busy share. On a shared machine another user's job turns every
    peer's spinning thread pools (ORT's, llama.cpp's OpenMP team) into preempted barriers: a
    llama.cpp run measured 0.3 s alone and 8-27 s beside a test suite here."""
    deadline = time.monotonic() + limit_s
    while True:
        a = _cpu_times()
        time.sleep(window_s)
        b = _cpu_times()
        busy = 1 - (b[1] - a[1]) / max(1, b[0] - a[0])
        if busy < busy_max or time.monotonic() > deadline:
            return busy


def _cpu_times() -> tuple[int, int]:
    """(all, idle) jiffies of the machine, from /proc/stat's first line."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]            # idle + iowait


def _record(v: Variant, ids: list[int], n: int, prompt: int, busy: float | None) -> None:
    v.samples.append(sample := v.run(ids, n))
    sample.prompt, sample.busy_before = prompt, busy


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


def _passes(v: Variant) -> list[float]:
    """The median over prompts of each pass's tok/s (passes: repeats, and rounds pooled)."""
    per_pass = len({s.prompt for s in v.samples}) or 1
    chunks = [v.samples[i:i + per_pass] for i in range(0, len(v.samples), per_pass)]
    return [statistics.median(len(s.ids) / s.seconds for s in c) for c in chunks
            if len(c) == per_pass]


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
    # each row against the same peer's target alone in the same precision
    own: dict[tuple[str, str], Variant] = {}
    for v in variants:                       # the first, where placements differ by round
        if not v.speculative and v.error is None:
            own.setdefault((v.peer, v.target), v)
    hf = own.get(("hf", "fp32"))
    rows = []
    for v in variants:
        tps = _rate(v, lambda s: s.seconds)
        mine = own.get((v.peer, v.target))
        base = _rate(mine, lambda s: s.seconds) if mine else None
        setups = [s.setup_seconds for s in v.samples if s.setup_seconds is not None]
        accs = [s.acceptance for s in v.samples if s.acceptance is not None]
        rows.append({
            "threads": threads, "peer": v.peer, "config": v.config, "target": v.target,
            "speculative": v.speculative,
            "tokens_per_s": tps, "tokens_per_s_passes": _passes(v),
            "decode_tokens_per_s": _rate(v, lambda s: s.decode_seconds),
            "speedup_vs_own_target": tps / base if tps and base else None,
            "acceptance": statistics.mean(accs) if accs else None,
            "setup_ms": 1e3 * statistics.median(setups) if setups else None,
            "tokens_per_s_with_setup": _rate(v, lambda s: s.seconds + s.setup_seconds)
            if setups else None,
            "greedy_vs_own_target": _greedy(v, mine) if v.speculative else None,
            "greedy_vs_hf_target": _greedy(v, hf), "error": v.error,
            "runs": [dict(asdict(s), new_tokens=len(s.ids)) for s in v.samples]})
    return rows


def ratios(rows: list[dict], threads: int) -> list[dict]:
    """Each goal: ours (speculative: k=auto, the default; else k=0) over the peer's best row of
    the kind. Without a bundle of the goal's precision ours is the fp32 bundle, and says so."""
    done = [r for r in rows if r["threads"] == threads and r["tokens_per_s"]]

    def pick(peer: str, precision: str, spec: bool) -> list[dict]:
        return [r for r in done if (r["peer"], r["target"], r["speculative"]) ==
                (peer, precision, spec)]

    def best(found: list[dict], metric: str) -> dict | None:
        return max((r for r in found if r[metric]), key=lambda r: r[metric], default=None)
    out = []
    for g in GOALS:
        q: dict = {"threads": threads, "peer": g.name, "goal": g.goal, "metric": g.metric,
                   "ratio": None}
        out.append(q)
        precision, spec = g.ours
        mine = pick("ours", precision, spec) or pick("ours", "fp32", spec)
        ours = next((r for r in mine if "k=auto (" in r["config"]), None) if spec else None
        ours = ours or best(mine, g.metric)
        other = best(pick(g.peer, *g.theirs), g.metric)
        if not (ours and other and ours[g.metric]):
            continue
        q.update(ours=ours["config"], peer_config=other["config"],
                 ratio=ours[g.metric] / other[g.metric])
        q["met"] = q["ratio"] >= g.goal
        if ours["target"] != precision:
            q["ours_instead"] = f"no {precision} bundle: ours is {ours['target']}"
        if g.metric == "tokens_per_s" and ours["decode_tokens_per_s"] and \
                other["decode_tokens_per_s"]:
            q["decode_ratio"] = ours["decode_tokens_per_s"] / other["decode_tokens_per_s"]
        if g.metric == "tokens_per_s" and other["tokens_per_s_with_setup"]:
            q["ratio_with_peer_setup"] = ours["tokens_per_s"] / other["tokens_per_s_with_setup"]
    return out


def _f(x: float | None, spec: str) -> str:
    return format(x, spec) if x is not None else "-"


def format_table(report: dict) -> str:
    def eq(e: dict | None) -> str:
        return f"{e['equal']}/{e['of']}" if e else "-"
    head = (f"{'thr':>3} {'peer':<8} {'config':<36} {'tok/s':>8} {'spread':>13} {'decode':>8} "
            f"{'x own':>6} {'acc':>5} {'=own':>5} {'=hf':>5}")
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        passes = r.get("tokens_per_s_passes") or []
        spread = f"{min(passes):.0f}-{max(passes):.0f}" if len(passes) > 1 else "-"
        lines.append(f"{r['threads']:>3} {r['peer']:<8} {r['config']:<36} "
                     f"{_f(r['tokens_per_s'], '8.1f'):>8} {spread:>13} "
                     f"{_f(r['decode_tokens_per_s'], '8.1f'):>8}"
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
        what = " (decode phase)" if q.get("metric") == "decode_tokens_per_s" else ""
        instead = f" [{q['ours_instead']}]" if "ours_instead" in q else ""
        lines.append(f"threads {q['threads']}: ours {q['ours']} / {q['peer']} {q['peer_config']}"
                     f"{what} = {q['ratio']:.2f}x (goal >= {q['goal']}x: "
                     f"{'met' if q['met'] else 'NOT met'}){extra}{instead}")
        per_round = [r["ratio"] for rnd in report.get("ratios_per_round", []) for r in rnd
                     if (r["threads"], r["peer"]) == (q["threads"], q["peer"])]
        if per_round:
            lines.append("  each round on its own: " + ", ".join(
                "n/a" if x is None else f"{x:.2f}x" for x in per_round))
    if busy := [run["busy_before"] for r in report["results"] for run in r["runs"]
                if run.get("busy_before") is not None]:
        lines.append(f"--wait-idle: {sum(b >= 0.15 for b in busy)} of {len(busy)} runs started "
                     f"with the CPUs still busy (>= 15%) after the wait; median busy share "
                     f"before a run {statistics.median(busy):.0%}")
    if setup := [r["setup_ms"] for r in report["results"] if r["setup_ms"] is not None]:
        lines.append(f"GenAI og.Generator construction: median {statistics.median(setup):.1f} ms "
                     f"per request, outside its tok/s ('with its setup' counts it)")
    lines.append("tok/s: median over prompts, prefill included; spread: the lowest and highest "
                 "of that median per pass over the prompts; decode: the runtime's decode phase; "
                 "x own: over the peer's target alone in the same precision; =own / =hf: runs "
                 "whose greedy ids equal the peer's own / Hugging Face's target-alone output")
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
    p.add_argument("--bundle", action="append",
                   help="ssd bundle of the same pair (default: export one); repeat it to run "
                        "several, e.g. the fp32 and int4 exports (labelled by the manifest's "
                        "target quant)")
    p.add_argument("--prompts", help="JSONL, one {\"prompt\": ...} per line (default: "
                   "runtime/data/bench_prompts.jsonl)")
    p.add_argument("--num-prompts", type=int, help="only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
    p.add_argument("--k", default="auto",
                   help="our speculative ks besides k=0, e.g. auto,4; K/SOURCE picks who drafts "
                        "(auto/model, 8/lookup; default fused); tNxWxDxB@K a draft tree of that "
                        "TreeShape at k=K (t6x5x1x1@1/model)")
    p.add_argument("--genai-k", default="4,adaptive",
                   help="GenAI speculative settings: fixed K (1..16) and/or adaptive")
    p.add_argument("--genai-draft", default="fp32,int8",
                   help="GenAI draft precisions (model builder -p): fp32 (the pair as it is) "
                        "and/or int8, int4 (quantized like ours); none: no speculative runs")
    p.add_argument("--genai-target", default="fp32",
                   help="GenAI target precisions: fp32 and/or int4 (the builder's CPU int4: "
                        "MatMulNBits, blocks of 32, int8 activations), each alone and with "
                        "every --genai-draft")
    p.add_argument("--llama-cpp", metavar="BIN",
                   help="folder of llama.cpp's built tools (llama-speculative-simple, "
                        "llama-quantize, llama-tokenize); how to build: tools/peer_llamacpp.py. "
                        "Without it the llamacpp peer is skipped")
    p.add_argument("--llama-cpp-src", metavar="SRC",
                   help="llama.cpp's source folder (convert_hf_to_gguf.py and gguf-py)")
    p.add_argument("--llamacpp-target", default="f32,q8_0,q4_0",
                   help="llama.cpp target-alone types: f32, q8_0, q4_0")
    p.add_argument("--llamacpp-spec", default="q4_0+q8_0",
                   help="llama.cpp speculative runs, TARGET+DRAFT types, e.g. q4_0+q8_0,"
                        "q4_0+q4_0; empty: none")
    p.add_argument("--llamacpp-k", default="3,8",
                   help="llama.cpp --spec-draft-n-max values (3 is its default)")
    p.add_argument("--repeats", type=int, default=1, help="passes over the prompts")
    p.add_argument("--skip", default="", help="peers to leave out: ours,hf,genai,llamacpp")
    p.add_argument("--isolate", action="store_true",
                   help="measure each peer in a process of its own, one after the other, and "
                        "report them together: peers sharing a process and cores slow each "
                        "other down (thread pools, caches), and not by the same amount")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --isolate: the peers' processes take turns this many times and "
                        "their runs are pooled (drift between processes then hits each alike)")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                   help="before each run wait up to S seconds for the CPUs to be idle (busy "
                        "< 15%% over 0.25 s): on a shared machine; each run records the busy "
                        "share it started at (busy_before)")
    p.add_argument("--json", dest="json_out", help="write the report here")
    p.add_argument("--workdir", help="bundle, GenAI models and GGUF files (default: "
                   "/tmp/ssd-peers/<pair>)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    target, draft = Path(args.target).resolve(), Path(args.draft).resolve()
    threads = [int(t) for t in args.threads.split(",")]
    ks = [k for k in args.k.split(",") if k not in ("", "0")]
    genai_ks = [k for k in args.genai_k.split(",") if k]
    if bad := [k for k in genai_ks if k != "adaptive" and not 1 <= int(k) <= 16]:
        raise SystemExit(f"--genai-k {bad[0]}: GenAI takes K in [1, 16] or 'adaptive'.")
    genai_drafts = [p for p in args.genai_draft.split(",") if p not in ("", "none")]
    if bad := [p for p in genai_drafts if p not in ("fp32", "int8", "int4")]:
        raise SystemExit(f"--genai-draft {bad[0]}: choose fp32, int8 or int4.")
    genai_targets = [p for p in args.genai_target.split(",") if p]
    if bad := [p for p in genai_targets if p not in ("fp32", "int4")] or not genai_targets:
        raise SystemExit(f"--genai-target {','.join(bad)}: choose fp32 and/or int4.")
    llama_targets = [q for q in args.llamacpp_target.split(",") if q]
    llama_spec = [tuple(s.split("+")) for s in args.llamacpp_spec.split(",") if s]
    llama_ks = [int(k) for k in args.llamacpp_k.split(",") if k]
    if bad := [q for q in llama_targets + [q for s in llama_spec for q in s]
               if q not in QUANTS] + [s for s in llama_spec if len(s) != 2]:
        raise SystemExit(f"--llamacpp-target/--llamacpp-spec {bad[0]}: types are "
                         f"{', '.join(QUANTS)}, speculative runs TARGET+DRAFT.")
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
    texts, prompts = load_prompt_ids(args.prompts, target, args.num_prompts)
    bundles = [Path(b).resolve() for b in args.bundle or []] or \
        ([export_bundle(target, draft, workdir, stamp)] if "ours" not in skip else [])
    genai_models = None
    if "genai" not in skip:
        try:
            import onnxruntime_genai  # noqa: F401
            genai_models = build_genai(target, draft, workdir, stamp, genai_targets,
                                       genai_drafts if genai_ks else [])
        except Exception as exc:             # noqa: BLE001 - say why, go on with the others
            notes.append(f"GenAI skipped: {type(exc).__name__}: {exc}")
    llama = None
    if "llamacpp" not in skip and not args.llama_cpp:
        notes.append("llama.cpp skipped: no --llama-cpp BIN given (to build it: "
                     "tools/peer_llamacpp.py)")
    elif "llamacpp" not in skip:
        try:
            llama = prepare_llamacpp(args.llama_cpp, args.llama_cpp_src or "", target, draft,
                                     workdir, stamp, llama_targets, llama_spec, texts, prompts,
                                     notes)
        except (OSError, ValueError, RuntimeError, subprocess.CalledProcessError) as exc:
            notes.append(f"llama.cpp skipped: {type(exc).__name__}: {exc}")
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
        variants = (named_apart(bundles, t, ks) if "ours" not in skip else []) + \
            (hf_variants(*hf, t) if hf else []) + \
            (llamacpp_variants(llama, t, llama_targets, llama_spec, llama_ks, target)
             if llama else [])
        if genai_models:
            try:
                variants += genai_variants(genai_models, t, genai_ks, notes)
            except Exception as exc:         # noqa: BLE001
                notes.append(f"GenAI not loadable at {t} threads: {type(exc).__name__}: {exc}")
        measure(variants, prompts, args.max_new_tokens, args.repeats, notes, args.wait_idle)
        rows += summarise(t, variants)
    report = {"target": str(target), "draft": str(draft),
              "bundles": [str(b) for b in bundles],
              "workdir": str(workdir),
              "genai_models": _genai_paths(genai_models),
              "llamacpp": llama.describe() if llama else None,
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
    peers = [p for p in PEERS if p not in skip]
    assert peers, "every peer skipped"
    reports: list[list[dict]] = []                    # per round: each peer's report
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            reports.append([])
            for peer in peers:
                out = Path(tmp) / f"{peer}-{r}.json"
                others = ",".join(p for p in PEERS if p != peer)
                print(f"--- {peer}, in a process of its own"
                      + (f" (round {r + 1}/{rounds})" if rounds > 1 else ""), flush=True)
                subprocess.run([sys.executable, __file__, *base, "--skip", others,
                                "--json", str(out)], check=True, stdout=subprocess.DEVNULL)
                reports[-1].append(json.loads(out.read_text()))
    merged = dict(reports[0][0])
    every = [rep for round_ in reports for rep in round_]
    for key in ("bundles", "genai_models", "llamacpp"):     # from the peer's own process
        merged[key] = next((rep[key] for rep in every if rep[key]), merged[key])
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
                                             run=None, target=row["target"]))
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
