"""Is a quantized MatMul's row a function of that row alone? One node at ONNX level (issue 44).

    python tools/row_exact.py [--shapes 576x1536,1536x576] [--rows 16] [--threads 2]
                              [--time 200] [--json out.json]

For each form (MatMulNBits at accuracy levels 0-4, int4 and int8, blocks 32/64/128; per-row
int8 activations into MatMulInteger; MatMulNBits fed at least two rows) and each (K, N): the
output of rows 0..M-1 computed together (M = 2..rows) against each row computed alone (M=1):
how many rows are bit-equal, and the largest |difference|. With --time, the median time of one
M=1 call (a decode step's shape) and of one M=5 call, interleaved with level 4, the default
form today, so that the ratio is measured side by side.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def nbits_model(k: int, n: int, bits: int, block: int, level: int, rng, pad: bool = False):
    """One MatMulNBits node with random symmetric weights; with `pad`, a zero row is appended
    to A before it and dropped after (so the kernel never sees M = 1)."""
    blocks = k // block
    q = rng.integers(0, 2 ** bits, (n, k)).astype(np.uint8)
    packed = q if bits == 8 else (q[:, 0::2] & 0x0F) | ((q[:, 1::2] & 0x0F) << 4)
    scales = (rng.random((n, blocks)).astype(np.float32) + 0.5) * 0.02
    inits = [numpy_helper.from_array(packed.reshape(n, blocks, block * bits // 8), "B"),
             numpy_helper.from_array(scales.reshape(-1), "S")]
    a = "A"
    nodes = []
    if pad:
        inits.append(numpy_helper.from_array(np.zeros((1, k), np.float32), "Z"))
        inits.append(numpy_helper.from_array(np.array([0], np.int64), "zero"))
        inits.append(numpy_helper.from_array(np.array([-1], np.int64), "minus1"))
        nodes.append(helper.make_node("Concat", ["A", "Z"], ["A2"], axis=0))
        a = "A2"
    out = "Y2" if pad else "Y"
    nodes.append(helper.make_node("MatMulNBits", [a, "B", "S"], [out], domain="com.microsoft",
                                  K=k, N=n, bits=bits, block_size=block, accuracy_level=level))
    if pad:
        nodes.append(helper.make_node("Slice", ["Y2", "zero", "minus1", "zero"], ["Y"]))
    return _model(nodes, inits, k, n)


def rowint8_model(k: int, n: int, rng):
    """Activations quantized to int8 per row (symmetric, scale = max|row| / 127) into
    MatMulInteger against int8 weights per column; int32 accumulation is exact and order-free.

        A (M, K) --Abs--ReduceMax(axis 1)--/127--> s (M, 1)
        A / s --Round--Cast int8--> qa --MatMulInteger(qb)--> (M, N) int32 --Cast--*s*sb--> Y
    """
    qb = rng.integers(-127, 128, (k, n)).astype(np.int8)
    sb = (rng.random((1, n)).astype(np.float32) + 0.5) * 0.002
    inits = [numpy_helper.from_array(qb, "QB"), numpy_helper.from_array(sb, "SB"),
             numpy_helper.from_array(np.array([1], np.int64), "axis"),
             numpy_helper.from_array(np.array(1 / 127, np.float32), "inv"),
             numpy_helper.from_array(np.array(1e-30, np.float32), "tiny")]
    nodes = [helper.make_node("Abs", ["A"], ["absA"]),
             helper.make_node("ReduceMax", ["absA", "axis"], ["m"], keepdims=1),
             helper.make_node("Mul", ["m", "inv"], ["s0"]),
             helper.make_node("Max", ["s0", "tiny"], ["s"]),
             helper.make_node("Div", ["A", "s"], ["As"]),
             helper.make_node("Round", ["As"], ["Ar"]),
             helper.make_node("Cast", ["Ar"], ["QA"], to=TensorProto.INT8),
             helper.make_node("MatMulInteger", ["QA", "QB"], ["I"]),
             helper.make_node("Cast", ["I"], ["F"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["F", "s"], ["Fs"]),
             helper.make_node("Mul", ["Fs", "SB"], ["Y"])]
    return _model(nodes, inits, k, n)


def float_model(k: int, n: int, rng):
    b = (rng.standard_normal((k, n)) * 0.02).astype(np.float32)
    return _model([helper.make_node("MatMul", ["A", "B"], ["Y"])],
                  [numpy_helper.from_array(b, "B")], k, n)


def _model(nodes, inits, k: int, n: int):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT,
                                                                         ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def session(model, threads: int):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def rows_check(sess, a: np.ndarray) -> tuple[int, int, float]:
    """(rows bit-equal to their M=1 result, rows compared, max |diff|) over M = 2..len(a)."""
    alone = np.concatenate([sess.run(None, {"A": a[i:i + 1]})[0] for i in range(len(a))])
    equal = total = 0
    worst = 0.0
    for m in range(2, len(a) + 1):
        together = sess.run(None, {"A": a[:m]})[0]
        same = (together == alone[:m]).all(axis=1)
        equal += int(same.sum())
        total += m
        worst = max(worst, float(np.abs(together - alone[:m]).max()))
    return equal, total, worst


def timed(sessions: dict, a: np.ndarray, runs: int) -> dict[str, float]:
    """Median ms of each session on `a`, the sessions interleaved run by run."""
    times = {name: [] for name in sessions}
    for _ in range(runs):
        for name, sess in sessions.items():
            start = time.perf_counter()
            sess.run(None, {"A": a})
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def forms(k: int, n: int, rng) -> dict:
    out = {}
    for bits in (4, 8):
        for block in (32, 64, 128):
            if k % block:
                continue
            for level in (0, 1, 2, 3, 4):
                if bits == 8 and level in (0, 1) and block != 32:
                    continue            # no float kernel for 8 bits: minutes; one block is enough
                out[f"nbits{bits}_b{block}_l{level}"] = nbits_model(k, n, bits, block, level, rng)
        out[f"nbits{bits}_b32_l4_pad"] = nbits_model(k, n, bits, 32, 4, rng, pad=True)
    out["rowint8_matmulinteger"] = rowint8_model(k, n, rng)
    out["float32_matmul"] = float_model(k, n, rng)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="576x1536,1536x576")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--time", type=int, default=0, help="timed runs per form (0: none)")
    p.add_argument("--only", default="", help="comma-separated substrings of form names")
    p.add_argument("--json")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    report = []
    for shape in args.shapes.split(","):
        k, n = map(int, shape.split("x"))
        a = rng.standard_normal((args.rows, k)).astype(np.float32)
        models = forms(k, n, rng)
        if args.only:
            models = {name: m for name, m in models.items()
                      if any(s in name for s in args.only.split(","))}
        sessions = {name: session(m, args.threads) for name, m in models.items()}
        for name, sess in sessions.items():
            equal, total, worst = rows_check(sess, a)
            row = {"shape": shape, "form": name, "equal": equal, "rows": total, "max_diff": worst}
            report.append(row)
            print(f"{shape:>10} {name:28} bit-equal {equal:4}/{total}  max|diff| {worst:.3g}",
                  flush=True)
        if args.time:
            for m in (1, 5):
                ms = timed(sessions, a[:m], args.time)
                base = ms.get("nbits4_b32_l4") or next(iter(ms.values()))
                for name, t in ms.items():
                    print(f"{shape:>10} M={m} {name:28} {t:8.3f} ms  {base / t:5.2f}x speed of "
                          f"int4 b32 level 4", flush=True)
                    report.append({"shape": shape, "form": name, "M": m, "ms": t})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
