"""Two rows at least in every GroupQueryAttention of an `ort` target (docs/design.md §12).

ONNX Runtime's GroupQueryAttention computes a call of one new token on another kernel than a
call of two or more (its products of one row round differently), so an `ort` target's k = 0
step and the same token among a verification's k+1 differed by ~1e-7, and speculation parted
from k = 0 at near-ties. From two rows on, a row's output has the same bits whatever the
number of rows beside it (measured, `tests/export/test_row_exact.py`). So every attention
node of an ort target is given one dummy row more when a call has a single new token:

    input_ids ─ Shape ─ B, T;  z = max(2 - T, 0) if B = 1 else 0   (once per call)
    query (B,T,W) ─ Concat(zeros (B,z,W)) ─ GroupQueryAttention ─ [:, :T] ─ output
    seqlens_k + z, total_sequence_length + z                       (the dummy is the last row)
    position_ids ─ Concat(its last column z times)                 (where the kernel reads them)
    attention_bias (B,1,T,S) ─ Pad(rows z, columns z)              (where there is one)

The projections, norms and LM head still run on the call's own T rows (a one-row MatMulNBits
keeps a row's bits, design §12): only the attention reads two. The dummy's key and value go to
cache row past_len + 1, past the sequence's last, where its next call writes first; at the
last position of the context that row is the arena's spare one (ModelEntry.spare_rows: the
runtime allocates max_context + 1 rows). The dummy rotates at the last real position, but the
kernel wants cos/sin tables as long as total_sequence_length (max_context + 1 there), so each
table gets its last row again: a Concat of constants, which ONNX Runtime folds when it loads
the graph (the tables on disk stay the ones the rows graph shares). Two nodes a layer (the
Concat, the Slice) and a handful once per call.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from ssd_runtime import contract

from .tree_input import (BIAS, COS, POSITIONS, SEQLENS, SIN, TOTAL, gqa_nodes,
                         int_attribute)

_QUERY, _KEY, _VALUE = 0, 1, 2
SPARE_ROWS = 1          # the dummy row's cache row at the context's last position


def give_two_rows(path: Path) -> bool:
    """Rewrite every GroupQueryAttention of the ort graph at `path` to read two rows at least,
    in place (weights untouched). False where the graph has none (nothing to do)."""
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    gqa = gqa_nodes(graph)
    if not gqa or any("two.t" in n.input for n in graph.node):
        return False
    kv = next(i for i in graph.input if i.name == contract.past_key(0))
    elem = kv.type.tensor_type.elem_type
    head_dim = kv.type.tensor_type.shape.dim[3].dim_value
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0], np.int64), "two.0"),
        numpy_helper.from_array(np.array([1], np.int64), "two.1"),
        numpy_helper.from_array(np.array([2], np.int64), "two.2"),
        numpy_helper.from_array(np.array([-1], np.int64), "two.-1"),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), "two.end"),
        numpy_helper.from_array(np.zeros(6, np.int64), "two.pads0"),
    ])
    first = [   # what the call's shape gives: T, B, z = max(2 - T, 0), in int64 and int32
        helper.make_node("Shape", [contract.INPUT_IDS], ["two.shape"]),
        helper.make_node("Slice", ["two.shape", "two.1", "two.2"], ["two.t"]),        # (1,)
        helper.make_node("Slice", ["two.shape", "two.0", "two.1"], ["two.b"]),        # (1,)
        helper.make_node("Sub", ["two.2", "two.t"], ["two.short"]),
        helper.make_node("Max", ["two.short", "two.0"], ["two.pad_rows"]),
        # one sequence only: the kernel refuses several rows of several new tokens after a
        # past, so a batch's one-token step keeps its one row (design §11, §12)
        helper.make_node("Equal", ["two.b", "two.1"], ["two.alone"]),
        helper.make_node("Cast", ["two.alone"], ["two.alone64"], to=TensorProto.INT64),
        helper.make_node("Mul", ["two.pad_rows", "two.alone64"], ["two.z"]),           # (1,)
        helper.make_node("Cast", ["two.z"], ["two.z32"], to=TensorProto.INT32),
        helper.make_node("Squeeze", ["two.z32", "two.0"], ["two.z32s"]),              # ()
        helper.make_node("Concat", ["two.pads0", "two.z", "two.z"], ["two.pads"], axis=0),
    ]
    derived: dict[tuple[str, str], str] = {}    # (kind, source tensor) -> its two-row form
    before: dict[int, list[onnx.NodeProto]] = {}  # nodes to insert before node index i

    def once(kind: str, source: str, at: int, make) -> str:
        """The two-row form of `source` of this kind, built before node `at` the first time."""
        key = (kind, source)
        if key not in derived:
            derived[key] = name = f"two.{kind}.{len(derived)}"
            before.setdefault(at, []).extend(make(name))
        return derived[key]

    def zeros(name: str, width: int) -> list[onnx.NodeProto]:
        graph.initializer.append(numpy_helper.from_array(np.array([width], np.int64),
                                                         f"{name}.width"))
        return [helper.make_node("Concat", ["two.b", "two.z", f"{name}.width"],
                                 [f"{name}.shape"], axis=0),
                helper.make_node("ConstantOfShape", [f"{name}.shape"], [name],
                                 value=helper.make_tensor("zero", elem, [1], [0]))]

    index = {id(n): i for i, n in enumerate(graph.node)}
    around: dict[int, tuple[list[onnx.NodeProto], onnx.NodeProto]] = {}
    for node in gqa:
        at = index[id(node)]
        inputs = list(node.input) + [""] * max(0, BIAS + 1 - len(node.input))
        heads, kv_heads = (int_attribute(node, n, 0) for n in ("num_heads", "kv_num_heads"))
        packed = not inputs[_KEY]
        own: list[onnx.NodeProto] = []
        for slot in (_QUERY,) if packed else (_QUERY, _KEY, _VALUE):
            width = head_dim * ((heads + 2 * kv_heads) if packed
                                else heads if slot == _QUERY else kv_heads)
            pad = once("zeros", str(width), at, lambda name, w=width: zeros(name, w))
            own.append(helper.make_node("Concat", [inputs[slot], pad],
                                        [f"{inputs[slot]}.two"], axis=1))
            inputs[slot] = f"{inputs[slot]}.two"
        seqlens, total = inputs[SEQLENS], inputs[TOTAL]
        inputs[SEQLENS] = once("seqlens", seqlens, at, lambda name: [
            helper.make_node("Add", [seqlens, "two.z32"], [name])])
        inputs[TOTAL] = once("total", total, at, lambda name: [
            helper.make_node("Add", [total, "two.z32s"], [name])])
        # where the kernel reads positions, the dummy sits at the last real one
        if int_attribute(node, "do_rotary", 0) or inputs[POSITIONS]:
            source = inputs[POSITIONS] or contract.POSITION_IDS
            inputs[POSITIONS] = once("positions", source, at, lambda name: [
                helper.make_node("Slice", [source, "two.-1", "two.end", "two.1"],
                                 [f"{name}.last"]),                              # (B, 1)
                helper.make_node("Concat", ["two.b", "two.z"], [f"{name}.shape"], axis=0),
                helper.make_node("Expand", [f"{name}.last", f"{name}.shape"], [f"{name}.pad"]),
                helper.make_node("Concat", [source, f"{name}.pad"], [name], axis=1)])
        for slot in (COS, SIN):           # the kernel wants total_sequence_length rows
            if inputs[slot]:
                table = inputs[slot]
                inputs[slot] = once("table", table, at, lambda name: [
                    helper.make_node("Slice", [table, "two.-1", "two.end", "two.0"],
                                     [f"{name}.last"]),
                    helper.make_node("Concat", [table, f"{name}.last"], [name], axis=0)])
        if inputs[BIAS]:
            bias = inputs[BIAS]
            inputs[BIAS] = once("bias", bias, at, lambda name: [
                helper.make_node("Pad", [bias, "two.pads"], [name])])
        while not inputs[-1]:
            inputs.pop()
        del node.input[:]
        node.input.extend(inputs)
        out = node.output[0]
        node.output[0] = f"{out}.two"
        around[at] = (own, helper.make_node("Slice", [f"{out}.two", "two.0", "two.t", "two.1"],
                                            [out]))
    rebuilt = list(first)
    for i, node in enumerate(graph.node):
        rebuilt.extend(before.get(i, []))
        own, after = around.get(i, ([], None))
        rebuilt.extend(own + [node] + ([after] if after is not None else []))
    del graph.node[:]
    graph.node.extend(rebuilt)
    onnx.save(model, str(path))
    return True
