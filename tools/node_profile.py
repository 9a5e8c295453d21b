"""Nodes per layer and per one-token step of each graph in a bundle, by operator, as exported
and as ONNX Runtime runs them (after its graph optimizations), and optionally its profiler's
time per operator over N one-token steps (issue 59: the next regression in nodes shows).

    python tools/node_profile.py BUNDLE [BUNDLE ...] [--models target,draft,rows]
                                 [--threads 2] [--steps N] [--past 128] [--top 12] [--json OUT]

"exported" is the graph file; "optimized" is what ONNX Runtime's CPU provider runs: the
runtime's own session options (ORT_ENABLE_ALL, the manifest's accuracy level) with
`optimized_model_filepath` set, read back. Every node of such a graph runs on every call (no
control flow), so its node count is the nodes of a one-token step.

Nodes are split by layer through the graph: a node belongs to the highest layer i whose
`past_key.i` or `past_value.i` its values depend on (Shape edges aside: a length is not data).
So layer i's bucket holds layer i from its cache write on and layer i+1 up to its own (its
norm and projections): one whole layer for every i but the last, whose bucket holds the final
norm and the LM head, and "before" holds the embedding, what is built once per call (mask,
cache index, RoPE tables) and the first layer's projections. "a layer" is the count of the
buckets 0..L-2 (their range if they differ); "outside" = the step's nodes - L x a layer.

`--steps N`: the model in the runtime's own CPU session (the arena bound in place) with
ONNX Runtime's profiler on, prefilled to `--past` rows, then N one-token calls at that past
(each rewrites the same row); per operator the kernel time and count a call, from the last N
calls' events. Profiling adds a little to every node, so read its ms per call as relative.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from ssd_runtime import contract
from ssd_runtime.backends.ort import OrtCpuSession
from ssd_runtime.backends.ort_session import session_options
from ssd_runtime.manifest import read_manifest

MODELS = ("target", "rows", "draft")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundles", nargs="+", type=Path)
    p.add_argument("--models", default=",".join(MODELS),
                   help="which graphs: target, rows (an ort target's rows graph), draft")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=0, help="profile N one-token calls (0: none)")
    p.add_argument("--past", type=int, default=128)
    p.add_argument("--top", type=int, default=12, help="operators listed per profile")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    wanted = [m for m in args.models.split(",") if m]
    unknown = set(wanted) - set(MODELS)
    if unknown:
        p.error(f"--models: unknown {sorted(unknown)}; pick from {', '.join(MODELS)}")
    report = []
    for bundle in args.bundles:
        if not (bundle / "manifest.json").exists():
            p.error(f"{bundle} is not a bundle (no manifest.json); give ssd-export's output")
        m = read_manifest(bundle)
        for name in wanted:
            entry = m.target if name == "rows" else getattr(m, name)
            if name == "rows" and not entry.rows:
                continue
            path = bundle / (entry.rows if name == "rows" else entry.path)
            row = describe(bundle, name, path, entry, m, args)
            report.append(row)
            print_row(row, args.top)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def describe(bundle: Path, name: str, path: Path, entry, m, args) -> dict:
    """One graph's counts, exported and optimized, and its profile with --steps."""
    layers = entry.num_layers
    row = {"bundle": str(bundle), "model": name, "graph": entry.graph, "quant": entry.quant,
           "layers": layers,
           "exported": count(onnx.load(str(path), load_external_data=False), layers)}
    with tempfile.TemporaryDirectory() as tmp:
        row["optimized"] = count(optimized(path, entry, args.threads, Path(tmp)), layers)
    if args.steps and name != "rows":
        row["profile"] = profile(bundle, name, entry, m, args)
    return row


def optimized(path: Path, entry, threads: int, tmp: Path) -> onnx.ModelProto:
    """The graph ONNX Runtime's CPU provider runs, with the runtime's own session options."""
    import onnxruntime as ort

    opts = session_options(threads, entry)
    out = tmp / "optimized.onnx"
    opts.optimized_model_filepath = str(out)
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                  "optimized.onnx.data")
    opts.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return onnx.load(str(out), load_external_data=False)


def layer_of_nodes(graph: onnx.GraphProto, layers: int) -> list[int]:
    """Per node, the highest layer whose cache its inputs depend on (-1: none)."""
    level: dict[str, int] = {}
    for i in range(layers):
        for name in (contract.past_key(i), contract.past_value(i)):
            level[name] = i
    out = []
    for node in graph.node:                 # an ONNX graph lists its nodes in order
        at = max((level.get(x, -1) for x in node.input if x), default=-1)
        for y in node.output:
            level[y] = -1 if node.op_type == "Shape" else at
        out.append(at)
    return out


def count(model: onnx.ModelProto, layers: int) -> dict:
    """Nodes of one graph: in all, a layer, outside the layers, by operator (all, a layer)."""
    nodes = list(model.graph.node)
    at = layer_of_nodes(model.graph, layers)
    ops = Counter(op_name(n) for n in nodes)
    buckets = [[n for n, i in zip(nodes, at) if i == layer] for layer in range(layers)]
    whole = buckets[:-1]                    # buckets 0..L-2: one whole layer each
    sizes = [len(b) for b in whole]
    per_layer = statistics.mode(sizes) if sizes else None
    typical = next((b for b in whole if len(b) == per_layer), [])
    return {"step": len(nodes), "layer": per_layer,
            "layer_range": [min(sizes), max(sizes)] if sizes else None,
            "outside": len(nodes) - per_layer * layers if per_layer is not None else None,
            "ops": dict(ops.most_common()),
            "layer_ops": dict(Counter(op_name(n) for n in typical).most_common())}


def op_name(node: onnx.NodeProto) -> str:
    """The operator, its domain named where it is not ONNX's (com.microsoft.MatMulNBits)."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


class _Profiled(OrtCpuSession):
    """The runtime's CPU session with ONNX Runtime's profiler on."""

    prefix = "ort-profile"

    def _open(self, path: Path, threads: int | None):
        import onnxruntime as ort

        opts = session_options(threads, self.entry)
        opts.enable_profiling = True
        opts.profile_file_prefix = self.prefix
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def profile(bundle: Path, name: str, entry, m, args) -> dict:
    """Kernel time and count per operator a one-token call, over the last args.steps calls."""
    with tempfile.TemporaryDirectory() as tmp:
        _Profiled.prefix = str(Path(tmp) / name)
        session = _Profiled(name, bundle / entry.path, entry, m.max_context, m.max_draft + 2,
                            args.threads)
        session.prefill((np.arange(args.past) % 50 + 3).astype(np.int64), 0)
        token = np.array([5], np.int64)
        for _ in range(args.steps + 5):     # 5 untimed
            session.forward(token, args.past)
        events = json.loads(Path(session.session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    runs = runs[-args.steps:]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in runs]
    time_us: Counter = Counter()
    calls: Counter = Counter()
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if any(a <= e["ts"] <= b for a, b in spans):
            op = e.get("args", {}).get("op_name", "?")
            time_us[op] += e["dur"]
            calls[op] += 1
    n = len(runs)
    return {"steps": n, "past": args.past,
            "run_ms": round(statistics.median(e["dur"] for e in runs) / 1e3, 3),
            "kernel_ms": round(sum(time_us.values()) / n / 1e3, 3),
            "nodes_run": round(sum(calls.values()) / n, 1),
            "ops": {op: {"ms": round(t / n / 1e3, 4), "count": round(calls[op] / n, 1)}
                    for op, t in time_us.most_common()}}


def print_row(row: dict, top: int) -> None:
    print(f"{row['bundle']} {row['model']} ({row['graph']}, {row['quant']}, "
          f"{row['layers']} layers)")
    for kind in ("exported", "optimized"):
        c = row[kind]
        span = "" if c["layer_range"] is None or c["layer_range"][0] == c["layer_range"][1] \
            else f" (layers {c['layer_range'][0]}-{c['layer_range'][1]})"
        print(f"  {kind:9s}: {c['step']} nodes a step, {c['layer']} a layer{span}, "
              f"{c['outside']} outside the layers")
        print("    a layer: " + ", ".join(f"{op} {k}" for op, k in c["layer_ops"].items()))
    if "profile" in row:
        pr = row["profile"]
        print(f"  profile  : {pr['steps']} one-token calls at past {pr['past']}: "
              f"run {pr['run_ms']} ms, kernels {pr['kernel_ms']} ms, {pr['nodes_run']} nodes")
        for op, v in list(pr["ops"].items())[:top]:
            print(f"    {op:28s} {v['ms']:8.4f} ms  x{v['count']}")


if __name__ == "__main__":
    sys.exit(main())
