"""The tree input of an `ort` target graph (docs/design.md §2, "Trees"): contract.TREE_MASK.

A verification call may carry a draft tree instead of a chain: N nodes at cache rows
past_len .. past_len+N-1 (node i at row past_len + i), RoPE positions past_len + depth[i]
(the call's position_ids), and node i attends the committed prefix and the rows of its own
ancestors and itself only. `append_tree_mask` adds that to a traced ort graph, in place
(weights untouched): one more input, `tree_mask` bool (B, T, T) ([b, i, j]: new token j is
new token i or one of its ancestors; a chain passes the lower triangle), turned once per
call into GroupQueryAttention's `attention_bias` (B, 1, T, total): 0 over the past and where
the mask holds, -1e30 elsewhere; every GroupQueryAttention node reads position_ids (its input
9: the kernel rotates q and k by them instead of by cache row); and the rows the kernel writes
and reads come from the root's position, seqlens_k = position_ids[:, 0] + T - 1 (the traced
graph's position_ids[:, -1] is a tree's deepest node's position, not its last row).

    tree_mask (B,T,T) ─ Where(·, 0, -1e30) ─ Unsqueeze(1) ─┐
    zeros (B,1,T,total-T) ────────────────────────────────┴─ Concat(-1) ─ attention_bias
    position_ids[:, :1] + T - 1 ─ seqlens_k;  its max + 1 ─ total_sequence_length

The kernel keeps its own causal mask by cache row, which a tree's ancestors (parents[i] < i)
always satisfy, so the bias only hides siblings and cousins. A chain's call gives the same
bits as the graph without the input (0 added to every score it keeps). A sliding-window layer
loses its kernel window, which counts cache rows, and gets the window by position in its bias
instead (key positions: 0 .. past-1, then the call's position_ids):

    position_ids (B,T,1) - key positions (B,1,S) < w ─ Where(·, attention_bias, -1e30)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from ssd_runtime import contract

GQA = "GroupQueryAttention"
# GroupQueryAttention's inputs by index: seqlens_k, total_sequence_length, the cos/sin tables,
# position_ids, attention_bias
SEQLENS, TOTAL, COS, SIN, POSITIONS, BIAS = 5, 6, 7, 8, 9, 10


def tree_refusal(model: onnx.ModelProto) -> str:
    """Why this ort graph cannot take trees ("" if it can)."""
    if not any(n.op_type == GQA for n in model.graph.node):
        return "it has no GroupQueryAttention node"
    return ""


def int_attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def gqa_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    return [n for n in graph.node if n.op_type == GQA and n.domain == "com.microsoft"]


def _window(node: onnx.NodeProto) -> int:
    return int_attribute(node, "local_window_size", -1)


def append_tree_mask(path: Path) -> str:
    """Give the ort graph at `path` the tree_mask input, in place. Returns "" when done, else
    why not (tree_refusal; the graph is left as it was)."""
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if any(i.name == contract.TREE_MASK for i in graph.input):
        return ""
    why = tree_refusal(model)
    if why:
        return why
    gqa = gqa_nodes(graph)
    elem = next(i.type.tensor_type.elem_type for i in graph.input
                if i.name == contract.past_key(0))
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    neg = np.array(-1e30 if dtype == np.float32 else np.finfo(dtype).min, dtype)
    graph.initializer.extend([
        numpy_helper.from_array(np.array(0, dtype), "tree.zero"),
        numpy_helper.from_array(neg, "tree.neg"),
        numpy_helper.from_array(np.array([1], np.int64), "tree.axis1"),
        numpy_helper.from_array(np.array([0], np.int64), "tree.0"),
        numpy_helper.from_array(np.array([1], np.int64), "tree.1"),
        numpy_helper.from_array(np.array([2], np.int64), "tree.2"),
        numpy_helper.from_array(np.array([3], np.int64), "tree.3"),
        numpy_helper.from_array(np.array(0, np.int64), "tree.zero_s"),
        numpy_helper.from_array(np.array(1, np.int64), "tree.one_s"),
    ])
    zero_value = helper.make_tensor("tree.pad_value", elem, [1], [0])
    nodes = [
        # the rows the kernel writes and reads, from the root's position and T (a node's
        # position is its depth past the root's, not its row): seqlens_k = p_b + T - 1
        helper.make_node("Shape", [contract.INPUT_IDS], ["tree.ids_shape"]),
        helper.make_node("Slice", ["tree.ids_shape", "tree.1", "tree.2"], ["tree.t"]),
        helper.make_node("Slice", [contract.POSITION_IDS, "tree.0", "tree.1", "tree.1"],
                         ["tree.first"]),                                        # (B, 1)
        helper.make_node("Add", ["tree.first", "tree.t"], ["tree.end"]),
        helper.make_node("Sub", ["tree.end", "tree.1"], ["tree.last"]),
        helper.make_node("Squeeze", ["tree.last", "tree.1"], ["tree.last1"]),   # (B,)
        helper.make_node("Cast", ["tree.last1"], ["tree.seqlens_k"], to=TensorProto.INT32),
        helper.make_node("ReduceMax", ["tree.end"], ["tree.total_b"], keepdims=0),
        helper.make_node("Cast", ["tree.total_b"], ["tree.total_len"], to=TensorProto.INT32),
        helper.make_node("Reshape", ["tree.total_b", "tree.1"], ["tree.total"]),
        helper.make_node("Where", [contract.TREE_MASK, "tree.zero", "tree.neg"], ["tree.new"]),
        helper.make_node("Unsqueeze", ["tree.new", "tree.axis1"], ["tree.new4"]),  # (B,1,T,T)
        helper.make_node("Shape", ["tree.new4"], ["tree.shape"]),
        helper.make_node("Slice", ["tree.shape", "tree.0", "tree.3"], ["tree.bht"]),
        helper.make_node("Sub", ["tree.total", "tree.t"], ["tree.past"]),
        helper.make_node("Concat", ["tree.bht", "tree.past"], ["tree.pad_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["tree.pad_shape"], ["tree.pad"],
                         value=zero_value),
        helper.make_node("Concat", ["tree.pad", "tree.new4"], ["tree.bias"], axis=3),
    ]
    # A sliding window by position, not by cache row: the kernel measures its window by row,
    # and a tree's node sits at row past_len + i but position past_len + depth. So a windowed
    # layer's kernel gets no window, and its bias hides the keys a window of w leaves out:
    # key j's position is j over the committed rows, then the call's own positions.
    windows = sorted({_window(n) for n in gqa if _window(n) > 0})
    if windows:
        nodes += [
            helper.make_node("Squeeze", ["tree.past", "tree.0"], ["tree.past_s"]),
            helper.make_node("Range", ["tree.zero_s", "tree.past_s", "tree.one_s"],
                             ["tree.committed"]),                                 # (P,)
            helper.make_node("Unsqueeze", ["tree.committed", "tree.0"], ["tree.committed2"]),
            helper.make_node("Slice", ["tree.bht", "tree.0", "tree.1"], ["tree.b"]),
            helper.make_node("Concat", ["tree.b", "tree.past"], ["tree.committed_shape"], axis=0),
            helper.make_node("Expand", ["tree.committed2", "tree.committed_shape"],
                             ["tree.committed_b"]),                               # (B, P)
            helper.make_node("Concat", ["tree.committed_b", contract.POSITION_IDS],
                             ["tree.key_pos"], axis=1),                           # (B, S)
            helper.make_node("Unsqueeze", [contract.POSITION_IDS, "tree.2"], ["tree.q_pos"]),
            helper.make_node("Unsqueeze", ["tree.key_pos", "tree.1"], ["tree.k_pos"]),
            helper.make_node("Sub", ["tree.q_pos", "tree.k_pos"], ["tree.behind"]),  # (B,T,S)
        ]
        for w in windows:
            graph.initializer.append(numpy_helper.from_array(np.array(w, np.int64),
                                                             f"tree.w{w}"))
            nodes += [
                helper.make_node("Less", ["tree.behind", f"tree.w{w}"], [f"tree.in{w}"]),
                helper.make_node("Unsqueeze", [f"tree.in{w}", "tree.axis1"], [f"tree.in{w}_4"]),
                helper.make_node("Where", [f"tree.in{w}_4", "tree.bias", "tree.neg"],
                                 [f"tree.bias_w{w}"]),
            ]
    for offset, node in enumerate(nodes):      # first: they read graph inputs only
        graph.node.insert(offset, node)
    for node in gqa:
        inputs = list(node.input) + [""] * max(0, BIAS + 1 - len(node.input))
        inputs[SEQLENS], inputs[TOTAL] = "tree.seqlens_k", "tree.total_len"
        window = _window(node)
        inputs[POSITIONS] = contract.POSITION_IDS
        inputs[BIAS] = f"tree.bias_w{window}" if window > 0 else "tree.bias"
        del node.input[:]
        node.input.extend(inputs)
        if window > 0:
            for attr in node.attribute:
                if attr.name == "local_window_size":
                    attr.i = -1
    graph.input.append(helper.make_tensor_value_info(contract.TREE_MASK, TensorProto.BOOL,
                                                     ["batch", "new_len", "new_len"]))
    onnx.save(model, str(path))
    return ""
