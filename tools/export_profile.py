"""Where one trace of a tiny model goes (the tests' export): the dynamo exporter by stage.

    python tools/export_profile.py [--kind llama] [--layers 1] [--graph ort] [--repeats 3]
                                   [--cprofile OUT.prof] [--bundle] [--read-once]

Builds a tiny model as the tests do (tests/tiny.py: 4 heads of 16, 64 wide, eager attention)
and runs graphs/trace.py's `export_decoder` on it `--repeats` times after one untimed warm-up
(the first export in a process also pays imports and torchlib's registration), timing each
stage of `torch.onnx.export(dynamo=True)` by wrapping the function that does it: torchlib's
registry, `torch.export.export`, the decompositions, the translation to ONNX, the opset
conversion, onnxscript's optimizer (constant folding, then its fusions), the save, our own
rsqrt rewrite; "the rest" is the remainder (the Decoder wrapper, input/output renaming,
the exporter's own glue). Then parity against Hugging Face (ssd_export/parity.py), as the
pipeline runs it. Medians and the spread over the repeats are printed, with each stage's share.
`--cprofile` also writes a cProfile of one more export. `--bundle` also times one whole
bundle export (the tests' llama + llama_cut pair, rebuilt on disk) by the pipeline's stages.
`--read-once` exports as the test suite does, reading torchlib's list once (tests/torchlib_once.py).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from contextlib import contextmanager, redirect_stderr
from io import StringIO
from pathlib import Path
from time import perf_counter

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import tiny  # noqa: E402  (the tests' tiny models)

PARITY = "parity (ours, ORT vs Hugging Face)"
REST = "the rest (Decoder, renaming, glue)"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="llama", help="a tests/tiny.py kind (default llama)")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--graph", default="ort", choices=("standard", "ort", "static"))
    p.add_argument("--max-context", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cprofile", type=Path, help="write a cProfile of one more export here")
    p.add_argument("--bundle", action="store_true",
                   help="also time one llama + llama_cut bundle export by stage")
    p.add_argument("--read-once", action="store_true",
                   help="read torchlib's list once, as the test suite does")
    args = p.parse_args()
    if args.read_once:
        import torchlib_once

        torchlib_once.enable()

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    config = tiny.config_for(args.kind, tiny.VOCAB, layers=args.layers)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    print(f"{args.kind}, {args.layers} layer(s), {args.graph} graph, max_context "
          f"{args.max_context}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as tmp:
        one(model, Path(tmp) / "warm", args, defaultdict(float))   # imports, registration: untimed
        runs = []
        for i in range(args.repeats):
            times: dict[str, float] = defaultdict(float)
            one(model, Path(tmp) / str(i), args, times)
            runs.append(times)
        report(runs)
        if args.cprofile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
            one(model, Path(tmp) / "profiled", args, defaultdict(float))
            profiler.disable()
            profiler.dump_stats(args.cprofile)
            print(f"\ncProfile of one export and its parity: {args.cprofile} "
                  f"(python -m pstats {args.cprofile}; sort cumtime)")
        if args.bundle:
            bundle_stages(Path(tmp) / "bundle")


def one(model, folder: Path, args, times: dict[str, float]) -> None:
    """One export_decoder and its parity check, each stage's seconds added to `times`."""
    from ssd_export.parity import check_parity
    from ssd_graphs.trace import export_decoder

    path = folder / "model.onnx"
    with stages(times):
        t0 = perf_counter()
        export_decoder(model, args.kind, path, args.max_context, args.graph)
        times["total export"] += perf_counter() - t0
    t0 = perf_counter()
    check_parity(model, path, "target", 8, "float32", args.max_context, graph=args.graph)
    times[PARITY] += perf_counter() - t0


@contextmanager
def stages(times: dict[str, float]):
    """Wrap each stage's function so that its seconds add up in `times` (outermost call only)."""
    import onnxscript._framework_apis.torch_2_11 as apis
    import torch
    from torch.onnx._internal.exporter import _core, _onnx_program, _registration

    import ssd_graphs.trace as trace

    targets = [("torchlib registry", _registration.ONNXRegistry, "from_torchlib", True),
               ("torch.export.export", torch.export, "export", False),
               ("decompositions", _core, "_prepare_exported_program_for_export", False),
               ("translation to ONNX", _core, "_exported_program_to_onnx_program", False),
               ("opset conversion (18 -> 18)", apis, "convert_version", False),
               ("onnxscript optimizer", apis, "optimize", False),
               ("save (external data)", _onnx_program.ONNXProgram, "save", False),
               ("rsqrt rewrite (ours)", trace, "rewrite_rsqrt_as_div", False)]
    saved = []
    for name, owner, attr, is_classmethod in targets:
        original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
        saved.append((owner, attr, original))
        function = original.__func__ if is_classmethod else original
        wrapped = _timed(function, name, times)
        setattr(owner, attr, classmethod(wrapped) if is_classmethod else wrapped)
    try:
        yield
    finally:
        for owner, attr, original in saved:
            setattr(owner, attr, original)


def _timed(function, name: str, times: dict[str, float]):
    depth = [0]

    def wrapper(*a, **k):
        depth[0] += 1
        t0 = perf_counter()
        try:
            return function(*a, **k)
        finally:
            depth[0] -= 1
            if depth[0] == 0:
                times[name] += perf_counter() - t0
    return wrapper


def report(runs: list[dict[str, float]]) -> None:
    for run in runs:
        inner = sum(v for k, v in run.items() if k not in ("total export", PARITY))
        run[REST] = run["total export"] - inner
        run["export + parity"] = run["total export"] + run[PARITY]
    whole = statistics.median(r["export + parity"] for r in runs)
    print(f"\n{len(runs)} repeats; median seconds (min-max), share of export + parity\n")
    print("| stage | seconds | min-max | share |\n|---|---:|---:|---:|")
    order = [k for k in runs[0] if k not in ("total export", "export + parity", PARITY, REST)]
    for name in [*order, REST, "total export", PARITY, "export + parity"]:
        values = [r.get(name, 0.0) for r in runs]
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | "
              f"{median / whole:.0%} |")


def bundle_stages(root: Path) -> None:
    """One export_bundle of the tests' llama + llama_cut pair, by the pipeline's own stages."""
    from ssd_export import ExportConfig, export_bundle

    tok = tiny.build_tokenizer(root / "tokenizer")
    target = tiny.build_model(root / "llama", "llama", tok, seed=1, layers=3)
    draft = tiny.truncate(target, root / "llama_cut", 1, tok)
    err = StringIO()
    t0 = perf_counter()
    with redirect_stderr(err):
        export_bundle(ExportConfig(target=str(target), draft=str(draft), output=root / "bundle"))
    total = perf_counter() - t0
    print(f"\nOne bundle export (llama 3 layers + llama_cut 1 layer, as bundle_factory's "
          f"commonest key): {total:.1f} s\n")
    print("| pipeline stage | seconds | share |\n|---|---:|---:|")
    for name, seconds in re.findall(r"^\[\d+\] (.*): ([\d.]+) s$", err.getvalue(), re.M):
        print(f"| {name} | {float(seconds):.1f} | {float(seconds) / total:.0%} |")


if __name__ == "__main__":
    main()
