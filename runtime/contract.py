"""Names of the graph contract shared by exporter, runtime and tests.

See DESIGN.md, "The graph contract". The runtime owns these names; the
exporter imports them so that both sides always agree.
"""
from __future__ import annotations

INPUT_IDS = "input_ids"
# Graph flavours. "standard": plain ONNX, sequence-major past (B, past_len, Hkv, D) in and the
# new rows (B, new_len, Hkv, D) out: runs everywhere, TensorRT included. "ort": ONNX Runtime's
# GroupQueryAttention contrib op over one head-major cache per layer (B, Hkv, max_context, D)
# bound as both `past_*` and `present_*`; the op writes the new rows in place at row past_len.
# CPU provider only. Both read the same input_ids / position_ids and give the same logits.
STANDARD, ORT = "standard", "ort"
GRAPHS = (STANDARD, ORT)
# The oldest onnxruntime that runs the "ort" flavour right: 1.18 and 1.19 load it and give
# other tokens (measured on the demo pair; 1.20, 1.22, 1.24 and 1.32 give the standard ones).
ORT_FLAVOUR_MIN = (1, 20)
ORT_FLAVOUR_MIN_TEXT = ".".join(map(str, ORT_FLAVOUR_MIN))


def runs_ort_flavour(onnxruntime_version: str) -> bool:
    """Whether this onnxruntime release may run "ort" flavour graphs."""
    parts = []
    for piece in onnxruntime_version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= ORT_FLAVOUR_MIN
POSITION_IDS = "position_ids"
LOGITS = "logits"


def past_key(i: int) -> str:
    return f"past_key.{i}"


def past_value(i: int) -> str:
    return f"past_value.{i}"


def new_key(i: int) -> str:
    return f"new_key.{i}"


def new_value(i: int) -> str:
    return f"new_value.{i}"


def present_key(i: int) -> str:
    return f"present_key.{i}"


def present_value(i: int) -> str:
    return f"present_value.{i}"


def kv_output_names(i: int, graph: str = STANDARD) -> tuple[str, str]:
    """Layer i's key and value outputs in that graph flavour."""
    return (present_key(i), present_value(i)) if graph == ORT else (new_key(i), new_value(i))


def input_names(num_layers: int) -> list[str]:
    names = [INPUT_IDS, POSITION_IDS]
    for i in range(num_layers):
        names += [past_key(i), past_value(i)]
    return names


def output_names(num_layers: int, graph: str = STANDARD) -> list[str]:
    names = [LOGITS]
    for i in range(num_layers):
        names += kv_output_names(i, graph)
    return names
