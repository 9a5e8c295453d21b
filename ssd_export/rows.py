"""The ort target's rows graph (contract.ROWS; docs/design.md §2, §11): a batch's several new
tokens per row in one call, over the target's own arenas and weights.

    trace (float, beside the target) → parity against Hugging Face → quantized as the target
    → weights pointed into the target's external data file → checked in a batch (pipeline)
"""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from ssd_graphs.trace import TracedModel
from ssd_runtime import contract

ROWS_FILE = "rows.onnx"          # beside the target's model.onnx, sharing its model.onnx.data
_TRACE = ".rows-trace"           # the rows graph as traced, until its weights are shared


def refusal(traced: TracedModel, max_batch: int) -> str:
    """Why this target gets no rows graph ("" when it gets one)."""
    if traced.graph != contract.ORT:
        return f"only an ort-flavour target needs one (this one is {traced.graph})"
    if max_batch == 1:
        return "max_batch 1: no batches"
    if traced.moe != "none":
        return ("mixture-of-experts layers: the rows graph would run them dense, with weights of "
                "its own")
    return ""


def trace_rows(export, loaded, target: TracedModel, max_context: int) -> TracedModel:
    """Trace the float rows graph into a folder beside the target's graph (before the target's
    weights are quantized: `export` is graphs.trace.export_decoder)."""
    path = target.path.parent / _TRACE / "model.onnx"
    return export(loaded.model, loaded.source, path, max_context, contract.ROWS,
                  target.aux_layer_ids, tree=target.tree)


def quantize_rows(traced: Path, scheme, vocab_size: int) -> None:
    """Quantize the traced rows graph's MatMul weights in place as the target's were (same
    scheme, same kernel): the same float weights give the same bytes, shared below."""
    import onnx

    from .qweights import rewrite, save

    model = onnx.load(str(traced))
    rewrite(model, scheme, vocab_size)
    save(model, traced)


def parity_quantized(loaded, path: Path, config, max_context: int) -> dict[str, float]:
    """A quantized rows graph against the Hugging Face model holding the target's dequantized
    weights (put there by the target's own check, qtarget.parity_dequantized), its MatMulNBits
    computing in float (accuracy level 0), as the quantized target itself is checked."""
    from .parity import check_parity
    from .qtarget import with_accuracy_level

    exact = path.with_name("rows.accuracy0.onnx")      # shares the external data files
    try:
        with_accuracy_level(path, exact, 0)
        return check_parity(loaded.model, exact, "target rows", config.max_draft, config.dtype,
                            max_context, graph=contract.ROWS,
                            session_config={contract.QDQ_ACCURACY: "0"})
    finally:
        exact.unlink(missing_ok=True)


def share_weights(traced: Path, target_path: Path) -> tuple[Path, int, int]:
    """Write target/rows.onnx from the traced rows graph: every initializer whose bytes equal
    one of the target's points at that one in the target's external data file; the others go to
    rows.onnx.data. Removes the traced folder. Returns (path, shared bytes, own bytes)."""
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import set_external_data

    folder = target_path.parent
    target = onnx.load(str(target_path), load_external_data=False)
    index: dict[tuple, list] = {}
    files: dict[str, bytes] = {}
    for t in target.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if t.data_location != onnx.TensorProto.EXTERNAL or "location" not in info:
            continue
        if info["location"] not in files:
            files[info["location"]] = (folder / info["location"]).read_bytes()
        start = int(info.get("offset", 0))
        raw = files[info["location"]][start:start + int(info["length"])]
        index.setdefault(_key(t.data_type, t.dims, raw), list(t.external_data))
    model = onnx.load(str(traced))
    out, data = folder / ROWS_FILE, folder / (ROWS_FILE + ".data")
    data.unlink(missing_ok=True)
    shared = own = 0
    for t in model.graph.initializer:
        raw = numpy_helper.to_array(t).tobytes()
        where = index.get(_key(t.data_type, t.dims, raw))
        if where is not None:
            t.ClearField("raw_data")
            for field in ("float_data", "int32_data", "int64_data", "double_data",
                          "uint64_data", "string_data"):
                t.ClearField(field)
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            t.external_data.extend(where)
            shared += len(raw)
        elif len(raw) > 1024:
            t.raw_data = raw
            set_external_data(t, location=data.name)
            own += len(raw)
    onnx.save(model, str(out))      # writes the tensors that still hold raw_data to data
    shutil.rmtree(traced.parent, ignore_errors=True)
    return out, shared, own


def drop(folder: Path) -> None:
    """Remove a rows graph (and what it traced) from the target's folder."""
    shutil.rmtree(folder / _TRACE, ignore_errors=True)
    for name in (ROWS_FILE, ROWS_FILE + ".data"):
        (folder / name).unlink(missing_ok=True)


def _key(data_type: int, dims, raw: bytes) -> tuple:
    return data_type, tuple(dims), hashlib.sha256(raw).digest()
