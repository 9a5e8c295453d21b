"""Trace a Hugging Face causal LM to ONNX with the graph contract.

`export_decoder` wraps the model in `Decoder` and calls
`torch.onnx.export(dynamo=True)` with dynamic batch, new_len and past_len (or, for the
"ort" and "static" flavours, cache rows; and for the static flavour and the rows graph, the
attended rows), in any graph flavour of contract.py.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from ssd_runtime import contract

from .registry import adapter_for, check_rope_context
from .decoder import Decoder

OPSET = 18


@dataclass(frozen=True)
class TracedModel:
    path: Path
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str
    parameters: int
    graph: str = contract.STANDARD
    moe: str = "none"            # contract.MOES: how mixture-of-experts layers run
    tops: bool = False           # contract.TOP_ID / TOP_PROB follow the KV outputs (append_tops)
    moe_note: str = ""           # ... and at what cost, for a progress line
    aux_layer_ids: tuple[int, ...] = ()   # contract.AUX_HIDDEN follows the KV outputs
    fused: bool = False          # the static layer in fused operators (fused.py, opset 23)
    tree: bool = False           # contract.TREE_MASK follows the contract's inputs (tree_input.py)
    tree_note: str = ""          # ... or why an ort target has none
    spare_rows: int = 0          # cache rows past max_context the graph writes (two_rows.py)


def export_decoder(model: torch.nn.Module, source: str, path: Path, max_context: int,
                   graph: str = contract.STANDARD, aux_layers: tuple[int, ...] = (),
                   tree: bool = False, exact: bool = False) -> TracedModel:
    """Write `path` (model.onnx plus external data) for `model` in that graph flavour; with
    `aux_layers`, an EAGLE-3 head's features as one more output (docs/design.md §14); with
    `tree`, a target's draft trees (docs/design.md §2, "Trees"): contract.TREE_MASK as the last
    input, traced in the static flavour and the rows graph, added after tracing in the ort
    flavour (tree_input.py, which may refuse: tree_note says why); none in the standard one.
    `exact`: an ort target's attention reads two rows at least, so that a row's logits do not
    depend on the rows beside it (two_rows.py); the other flavours are so already."""
    decoder = Decoder(model, adapter_for(model, source), graph, max_context, source,
                      aux_layers, tree).eval()
    check_rope_context(model, source, max_context)
    n_layers = len(decoder.layers)
    dtype = next(model.parameters()).dtype
    # Example sizes avoid 0 and 1 so that torch.export keeps every axis symbolic.
    batch, new_len, past_len = 2, 3, 5
    ids = torch.zeros((batch, new_len), dtype=torch.int64)
    pos = torch.arange(past_len, past_len + new_len).repeat(batch, 1)
    B = torch.export.Dim("batch", min=1, max=64)
    T = torch.export.Dim("new_len", min=1, max=max_context)
    if contract.in_place(graph):        # whole head-major caches (B, Hkv, rows, D), rows >= total
        kv_shape = (batch, decoder.num_kv_heads, past_len + new_len + 2, decoder.head_dim)
        kv_dims = {0: B, 2: torch.export.Dim("cache_rows", min=2, max=max_context)}
        extra = {}
        if graph == contract.ORT:
            from .ort_ops import translation_table

            extra = {"custom_translation_table": translation_table()}
        elif decoder.fusion is not None:    # static, rows: the fused layer (fused.py)
            from .fused_ops import translation_table

            extra = {"custom_translation_table": translation_table()}
    else:                               # the past only (B, P, Hkv, D)
        kv_shape = (batch, past_len, decoder.num_kv_heads, decoder.head_dim)
        kv_dims = {0: B, 1: torch.export.Dim("past_len", min=0, max=max_context)}
        extra = {}
    past = tuple(torch.zeros(kv_shape, dtype=dtype) for _ in range(2 * n_layers))
    shapes = ({0: B, 1: T}, {0: B, 1: T}, tuple(kv_dims for _ in past))
    if contract.attends_rows(graph):    # attend_rows (L,): attention reads cache rows [0, L)
        past += (torch.zeros(past_len + new_len, dtype=torch.int64),)
        shapes = shapes[:2] + (shapes[2] + ({0: torch.export.Dim("attend_rows", min=1,
                                                                max=max_context)},),)
    names = contract.input_names(n_layers, graph)
    if decoder.tree:                    # tree_mask (B, T, T): a chain's lower triangle here
        past += (torch.tril(torch.ones(batch, new_len, new_len, dtype=torch.bool)),)
        shapes = shapes[:2] + (shapes[2] + ({0: B, 1: T, 2: T},),)
        names = names + [contract.TREE_MASK]
    path.parent.mkdir(parents=True, exist_ok=True)
    # the exporter logs a warning per missing torchvision op on every export: not ours to fix
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            decoder, (ids, pos, *past), dynamo=True, opset_version=OPSET,
            input_names=names,
            output_names=contract.output_names(n_layers, graph, bool(aux_layers)),
            dynamic_shapes=shapes, verbose=False, **extra,
        )
        program.save(str(path), external_data=True)
    fused = lower_fused(path)
    rewrite_rsqrt_as_div(path)
    tree_note = ""
    if tree and graph == contract.ORT:
        from .tree_input import append_tree_mask

        tree_note = append_tree_mask(path)
    elif tree and not decoder.tree:
        tree_note = f"the {graph} flavour has no tree input"
    spare_rows = 0
    if exact and graph == contract.ORT:
        from .two_rows import SPARE_ROWS, give_two_rows

        spare_rows = SPARE_ROWS if give_two_rows(path) else 0
    return TracedModel(
        path=path, num_layers=n_layers, num_kv_heads=decoder.num_kv_heads,
        head_dim=decoder.head_dim, vocab_size=model.config.vocab_size,
        kv_dtype=str(dtype).removeprefix("torch."),
        parameters=sum(p.numel() for p in model.parameters()), graph=graph,
        moe=decoder.moe_kind, moe_note=decoder.moe_note, aux_layer_ids=tuple(aux_layers),
        tree=tree and not tree_note, tree_note=tree_note,
        fused=fused, spare_rows=spare_rows,
    )


def append_tops(path: Path) -> None:
    """Add contract.TOP_ID and TOP_PROB, the last row's argmax and its softmax probability,
    as outputs after the KV ones; in place, weights untouched. Logits of any float type give a
    float32 probability."""
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    if any(o.name in (contract.TOP_ID, contract.TOP_PROB) for o in graph.output):
        return
    graph.initializer.extend([numpy_helper.from_array(np.array(-1, np.int64), "tops.last"),
                              numpy_helper.from_array(np.array([-1], np.int64), "tops.axis")])
    graph.node.extend([
        helper.make_node("Gather", [contract.LOGITS, "tops.last"], ["tops.row"], axis=1),
        helper.make_node("Cast", ["tops.row"], ["tops.row32"], to=TensorProto.FLOAT),
        helper.make_node("ArgMax", ["tops.row32"], [contract.TOP_ID], axis=-1, keepdims=0),
        helper.make_node("Softmax", ["tops.row32"], ["tops.probs"], axis=-1),
        helper.make_node("ReduceMax", ["tops.probs", "tops.axis"], [contract.TOP_PROB],
                         keepdims=0),
    ])
    graph.output.extend([helper.make_tensor_value_info(contract.TOP_ID, TensorProto.INT64,
                                                       ["batch"]),
                         helper.make_tensor_value_info(contract.TOP_PROB, TensorProto.FLOAT,
                                                       ["batch"])])
    onnx.save(model, str(path))


def lower_fused(path: Path) -> bool:
    """The fused layer's placeholder nodes as the operators ONNX Runtime runs (fused_ops.lower),
    in place; weights untouched. Returns whether the graph had any."""
    from .fused_ops import lower

    model = onnx.load(str(path), load_external_data=False)
    if not lower(model):
        return False
    onnx.save(model, str(path))
    return True


def rewrite_rsqrt_as_div(path: Path) -> int:
    """`x * Reciprocal(Sqrt(a))` -> `x / Sqrt(a)`, in place; returns how many were rewritten.

    Hugging Face RMSNorms compute `x * rsqrt(mean(x²) + eps)`, which traces to
    Sqrt → Reciprocal → Mul. ONNX Runtime fuses the Pow → ReduceMean → Add → Sqrt → Div → Mul
    form into one SimplifiedLayerNormalization kernel, and leaves the other as six nodes per norm
    (docs/performance-notes.md, "Figures from code comments"). Same arithmetic up to one
    rounding; parity is checked on the rewritten graph. Weights stay in the external data file.
    """
    model = onnx.load(str(path), load_external_data=False)
    nodes = model.graph.node
    producer = {out: node for node in nodes for out in node.output}
    consumers: dict[str, list] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    graph_outputs = {o.name for o in model.graph.output}
    dropped = []
    for node in nodes:
        sqrt = producer.get(node.input[0]) if node.op_type == "Reciprocal" else None
        users = consumers.get(node.output[0], []) if sqrt is not None else []
        if (sqrt is None or sqrt.op_type != "Sqrt" or not users or node.output[0] in graph_outputs
                or any(u.op_type != "Mul" or u.domain not in ("", "ai.onnx") for u in users)):
            continue
        for mul in users:
            a, b = mul.input
            other = b if a == node.output[0] else a
            if other == node.output[0]:     # x⁻¹ · x⁻¹: leave that one alone
                break
            mul.op_type = "Div"
            del mul.input[:]
            mul.input.extend([other, sqrt.output[0]])
        else:
            dropped.append(node)
    for node in dropped:
        nodes.remove(node)
    if dropped:
        onnx.save(model, str(path))
    return len(dropped)
