"""What one ONNX Runtime MatMulNBits costs for 1 row against M rows (a verification of M - 1
draft tokens), per block size and accuracy level, on this CPU.

    python tools/matmulnbits_rows.py [--k 1024] [--n 2560] [--threads 2] [--rounds 40]

A single-node graph with symmetric int4 weights (random), timed in calls of 10, the
configurations and row counts shuffled in each round; prints the lower quartile of each and
the ratio of M rows to 1 row. Speculation pays on a quantized target only where M rows cost
little more than one (design §12, performance.md "Quantized targets").
"""
from __future__ import annotations

import argparse
import random
import time

import numpy as np


def session(k: int, n: int, block: int, accuracy: int, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    blocks = -(-k // block)
    rng = np.random.default_rng(0)
    weights = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
    scales = rng.random(n * blocks).astype(np.float32) * 0.01 + 0.001
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block, accuracy_level=accuracy)
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, "M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, "M", n])],
        [numpy_helper.from_array(weights, "B"), numpy_helper.from_array(scales, "S")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = threads, 3
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--k", type=int, default=1024)
    p.add_argument("--n", type=int, default=2560)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=40)
    args = p.parse_args()
    configs = [(block, acc) for block in (32, 64, 128) for acc in (4, 0)]
    sessions = {c: session(args.k, args.n, *c, args.threads) for c in configs}
    rows = [1, 2, 5, 9]
    inputs = {m: np.random.default_rng(1).standard_normal((1, m, args.k)).astype(np.float32)
              for m in rows}
    keys = [(c, m) for c in configs for m in rows]
    times: dict = {key: [] for key in keys}
    for c, m in keys:
        sessions[c].run(None, {"A": inputs[m]})
    for _ in range(args.rounds):
        random.shuffle(keys)
        for c, m in keys:
            feed, run = {"A": inputs[m]}, sessions[c].run
            start = time.perf_counter()
            for _ in range(10):
                run(None, feed)
            times[(c, m)].append((time.perf_counter() - start) / 10 * 1e6)
    print(f"MatMulNBits K={args.k} N={args.n}, int4 symmetric, {args.threads} threads")
    for block, acc in configs:
        t = {m: np.percentile(times[((block, acc), m)], 25) for m in rows}
        print(f"block {block:3} accuracy_level {acc}: 1 row {t[1]:7.1f} us; "
              + " ".join(f"{m} rows {t[m] / t[1]:.2f}x" for m in rows[1:]))


if __name__ == "__main__":
    main()
