"""ONNX-authored heads: greedy ids, draft sampling and speculative acceptance.

They take the logits a decoder graph wrote and return a few integers, so a
GPU backend that binds its device logits buffer as their input never copies
logits to the host. Batch 1: inputs are (T, V) logits of one sequence.

    argmax   logits (T,V)                                   -> ids (T,)
    sample   logits (T,V), temperature, top_k, top_p, uniform (1,)
                                                            -> token (1,), probs (V,)   [last row]
    accept   logits (D+1,V), draft_tokens (D,), draft_probs (D,V), uniforms (D+1,),
             temperature, top_k, top_p                      -> accepted (1,), token (1,)

Processing = temperature, top-k, top-p exactly as ssd_runtime.round.sampling does
(Hugging Face's warpers); acceptance = min(1, p/q), residual max(0, p-q).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 18
HEADS = ("argmax", "sample", "accept")
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


class _Builder:
    """A few lines per op: `b.op("Add", x, y)` returns the output name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs):
        names = [f"{op_type.lower()}_{self.count}_{i}" for i in range(outputs)]
        self.count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, value, dtype=np.int64) -> str:
        name = f"const_{self.count}"
        self.count += 1
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _sampling_inputs() -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info("temperature", F, [1]),
            helper.make_tensor_value_info("top_k", I64, [1]),
            helper.make_tensor_value_info("top_p", F, [1])]


def _process(b: _Builder, logits: str) -> str:
    """(R, V) logits -> (R, V) probabilities after temperature, top-k, top-p."""
    scores = b.op("Div", logits, "temperature")                                 # (R, V)
    vocab = b.op("Gather", b.op("Shape", scores), b.const([1]))                 # (1,)
    on = b.op("Greater", "top_k", b.const([0]))
    kk = b.op("Where", on, b.op("Min", "top_k", vocab), vocab)                  # 0 -> all
    top_vals = b.op("TopK", scores, kk, outputs=2, axis=-1, largest=1, sorted=1)[0]
    kth = b.op("Gather", top_vals, b.op("Sub", kk, b.const([1])), axis=1)       # (R, 1)
    neg_inf = b.const(-np.inf, np.float32)
    scores = b.op("Where", b.op("Less", scores, kth), neg_inf, scores)
    # top-p: drop tokens whose exclusive cumulative mass (descending) reaches top_p
    sorted_vals, order = b.op("TopK", scores, vocab, outputs=2, axis=-1, largest=1, sorted=1)
    before = b.op("CumSum", b.op("Softmax", sorted_vals, axis=-1), b.const(1), exclusive=1)
    drop_sorted = b.op("GreaterOrEqual", before, "top_p")                       # (R, V) ranked
    drop = b.op("ScatterElements", b.op("Cast", drop_sorted, to=I64), order,
                b.op("Cast", drop_sorted, to=I64), axis=1)                      # back to ids
    keep_all = b.op("GreaterOrEqual", "top_p", b.const([1.0], np.float32))
    drop = b.op("And", b.op("Cast", drop, to=B), b.op("Not", keep_all))
    scores = b.op("Where", drop, neg_inf, scores)
    return b.op("Softmax", scores, axis=-1)


def _sample(b: _Builder, probs: str, u: str) -> str:
    """(V,) probabilities, (1,) uniform -> (1,) token, inverse CDF like sampling.sample."""
    cdf = b.op("CumSum", probs, b.const(0))                                     # (V,)
    total = b.op("Gather", cdf, b.const([-1]))
    below = b.op("LessOrEqual", cdf, b.op("Mul", u, total))
    index = b.op("ReduceSum", b.op("Cast", below, to=I64), b.const([0]), keepdims=1)
    last = b.op("Sub", b.op("Shape", probs), b.const([1]))
    return b.op("Min", index, last)


def argmax_head() -> onnx.ModelProto:
    b = _Builder()
    b.nodes.append(helper.make_node("ArgMax", ["logits"], ["ids"], axis=-1, keepdims=0))
    return b.model("argmax_head", [helper.make_tensor_value_info("logits", F, ["T", "V"])],
                   [helper.make_tensor_value_info("ids", I64, ["T"])])


def sample_head() -> onnx.ModelProto:
    b = _Builder()
    last = b.op("Gather", "logits", b.op("Sub", b.op("Gather", b.op("Shape", "logits"),
                                                     b.const([0])), b.const([1])))  # (1, V)
    probs = b.op("Squeeze", _process(b, last), b.const([0]))                    # (V,)
    token = _sample(b, probs, "uniform")
    b.nodes.append(helper.make_node("Identity", [token], ["token"]))
    b.nodes.append(helper.make_node("Identity", [probs], ["probs"]))
    inputs = [helper.make_tensor_value_info("logits", F, ["T", "V"]), *_sampling_inputs(),
              helper.make_tensor_value_info("uniform", F, [1])]
    return b.model("sample_head", inputs, [helper.make_tensor_value_info("token", I64, [1]),
                                           helper.make_tensor_value_info("probs", F, ["V"])])


def accept_head() -> onnx.ModelProto:
    b = _Builder()
    d = b.op("Shape", "draft_tokens")                                           # (1,) = D
    p = _process(b, "logits")                                                   # (D+1, V)
    p_draft = b.op("Slice", p, b.const([0]), d, b.const([0]))                   # (D, V)
    x = b.op("Unsqueeze", "draft_tokens", b.const([1]))                         # (D, 1)
    px = b.op("Squeeze", b.op("GatherElements", p_draft, x, axis=1), b.const([1]))
    qx = b.op("Squeeze", b.op("GatherElements", "draft_probs", x, axis=1), b.const([1]))
    u_accept = b.op("Slice", "uniforms", b.const([0]), d, b.const([0]))         # (D,)
    ok = b.op("Less", b.op("Mul", u_accept, qx), px)                            # u < p/q
    rejected_so_far = b.op("CumSum", b.op("Cast", b.op("Not", ok), to=I64), b.const(0))
    leading = b.op("Cast", b.op("Equal", rejected_so_far, b.const(0)), to=I64)
    j = b.op("ReduceSum", leading, b.const([0]), keepdims=1)                    # (1,)
    # row j of max(0, p - q) with a zero row appended for q (the bonus), or p if it is all 0
    vocab = b.op("Gather", b.op("Shape", p), b.const([1]))
    zero_row = b.op("ConstantOfShape", b.op("Concat", b.const([1]), vocab, axis=0),
                    value=helper.make_tensor("z", F, [1], [0.0]))
    q_ext = b.op("Concat", "draft_probs", zero_row, axis=0)                     # (D+1, V)
    residual = b.op("Max", b.op("Sub", p, q_ext), b.const(0.0, np.float32))
    row = b.op("Squeeze", b.op("Gather", residual, j, axis=0), b.const([0]))    # (V,)
    p_row = b.op("Squeeze", b.op("Gather", p, j, axis=0), b.const([0]))
    empty = b.op("LessOrEqual", b.op("ReduceSum", row, b.const([0]), keepdims=1),
                 b.const([0.0], np.float32))
    row = b.op("Where", empty, p_row, row)
    token = _sample(b, row, b.op("Gather", "uniforms", d))
    b.nodes.append(helper.make_node("Identity", [j], ["accepted"]))
    b.nodes.append(helper.make_node("Identity", [token], ["token"]))
    inputs = [helper.make_tensor_value_info("logits", F, ["T", "V"]),
              helper.make_tensor_value_info("draft_tokens", I64, ["D"]),
              helper.make_tensor_value_info("draft_probs", F, ["D", "V"]),
              helper.make_tensor_value_info("uniforms", F, ["T"]), *_sampling_inputs()]
    return b.model("accept_head", inputs, [helper.make_tensor_value_info("accepted", I64, [1]),
                                           helper.make_tensor_value_info("token", I64, [1])])


def write_heads(folder: Path) -> dict[str, str]:
    """Write every head into `folder`; returns {head name: file name}."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    builders = {"argmax": argmax_head, "sample": sample_head, "accept": accept_head}
    for name in HEADS:
        onnx.save(builders[name](), str(folder / f"{name}.onnx"))
        files[name] = f"{name}.onnx"
    return files
