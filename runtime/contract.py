"""Names of the graph contract shared by exporter, runtime and tests.

See docs/design.md §2. The runtime owns these names; the
exporter imports them so that both sides always agree.
"""
from __future__ import annotations

INPUT_IDS = "input_ids"
# The most tokens one prefill call carries: the runtime prefills in chunks of it, and
# TensorRT engines are built with a prefill profile up to it.
PREFILL_CHUNK = 256
# Graph flavours. "standard": plain ONNX, sequence-major past (B, past_len, Hkv, D) in and the
# new rows (B, new_len, Hkv, D) out: runs everywhere, TensorRT included. "ort": ONNX Runtime's
# GroupQueryAttention contrib op over one head-major cache per layer (B, Hkv, max_context, D)
# bound as both `past_*` and `present_*`; the op writes the new rows in place at row past_len.
# CPU provider only. "static": plain ONNX over the same head-major caches as "ort", bound in
# place: each row's new keys/values are scattered (ScatterND) into its cache at its positions,
# then attention reads the cache's first rows (ATTEND_ROWS, below), masked by position, so a
# call's addresses never move (what CUDA graphs capture), and rows of several new
# tokens batch (GroupQueryAttention refuses that). Any ONNX Runtime provider; not TensorRT,
# which does not alias an input and an output. All read the same input_ids / position_ids and
# give the same logits. docs/design.md §2.
STANDARD, ORT, STATIC = "standard", "ort", "static"
GRAPHS = (STANDARD, ORT, STATIC)
# The "ort" flavour's second target graph (docs/design.md §2, §11): the static flavour's
# attention over the same arenas, with q, k and v from the ort flavour's packed projection.
# ONNX Runtime's GroupQueryAttention refuses several rows of several new tokens after a past;
# this graph takes them in one call, so a batch's verification reads the weights once. Not a
# --graph choice: it exists only beside an "ort" target, as ModelEntry.rows.
ROWS = "rows"
# The static flavour (schema 10 on) and the rows graph read only cache rows [0, L), where L is
# the length of their last input, ATTEND_ROWS: int64 of shape (L,), whose values are not read;
# the runtime passes L = max over the call's rows of past_len + new_len. So attention costs
# what the live context costs, not max_context, and a row's logits keep their bits whatever L
# (masked rows add exact zeros; docs/design.md §2, §12). A static graph of schema 9 or older
# has no such input and attends over the whole cache (backends/ort.py checks the session).
ATTEND_ROWS = "attend_rows"

# Draft trees (schema 13; docs/design.md §2, "Trees"): an ort target graph may take one more
# input after the contract's, TREE_MASK bool (B, T, T): [b, i, j] = new token j is new token i
# or one of its ancestors. Node i sits at cache row past_len + i with position_ids past_len +
# depth[i] and attends the committed prefix and its own ancestors only; a chain passes the
# lower triangle (and gives the bits of a graph without the input). The manifest says so
# (ModelEntry.tree); graphs/tree_input.py writes it.
TREE_MASK = "tree_mask"


def attends_rows(graph: str) -> bool:
    """Whether the graph flavour, as this exporter traces it, takes ATTEND_ROWS last."""
    return graph in (STATIC, ROWS)


def in_place(graph: str) -> bool:
    """Whether the graph's caches are whole head-major buffers (B, Hkv, max_context, D) bound
    as both past_* and present_* (the ort and static flavours, and the ort target's rows
    graph)."""
    return graph in (ORT, STATIC, ROWS)
# Weights: "none" (as exported), or weight-only quantized MatMuls ("int8", "int4": ONNX
# Runtime's MatMulNBits contrib op, CPU provider only). Only the draft is ever quantized: it
# changes how many draft tokens are accepted, never the output.
NO_QUANT = "none"
QUANTS = (NO_QUANT, "int8", "int4")
# The oldest onnxruntime that runs each of them right, measured on the demo pair: 1.18 and 1.19
# load the "ort" flavour and give other tokens (1.20 onwards give the standard graph's);
# 1.20 and 1.21 refuse 8-bit MatMulNBits ("Only 4b quantization is supported"), 1.22 runs it
# as 1.32 does; 4-bit gives 1.32's logits from 1.20 on.
ORT_FLAVOUR_MIN = (1, 20)
QUANT_MIN = {"int4": (1, 20), "int8": (1, 22)}
# How quantized weights are written (docs/design.md §12): ONNX Runtime's MatMulNBits (CPU
# kernels; the form QUANT_MIN was measured on), or blockwise DequantizeLinear feeding a MatMul
# (opset 21: standard ONNX, which TensorRT 10 and ONNX Runtime's CPU and CUDA providers take;
# onnxruntime reads opset 21 from 1.18 on)
MATMULNBITS, DEQUANTIZE = "MatMulNBits", "DequantizeLinear"
DEQUANTIZE_MIN = (1, 18)
QDQ_ACCURACY = "session.qdq_matmulnbits_accuracy_level"   # the fused MatMulNBits' compute
# Mixture-of-experts layers: "none", "dense" (every expert on every token, plain ONNX: any
# backend) or "kernel" (ONNX Runtime's com.microsoft::MoE, the routed experts only; "ort"
# flavour). Measured: 1.20-1.22 refuse the kernel's SwiGLU attributes, 1.23.0 has no CPU
# kernel for it, 1.23.1 onwards give 1.32's logits.
MOES = ("none", "dense", "kernel")
MOE_KERNEL_MIN = (1, 23, 1)
# The static flavour's fused layer (ONNX opset 23's Attention and RotaryEmbedding, ONNX
# Runtime's SkipSimplifiedLayerNormalization; docs/design.md §12): 1.22 refuses opset 23,
# 1.23.0 runs the three with a row's bits independent of the rows beside it. The exporter
# writes the plain layer under an older onnxruntime.
STATIC_FUSED_MIN = (1, 23)


def version_tuple(onnxruntime_version: str) -> tuple[int, int, int]:
    parts = []
    for piece in (onnxruntime_version.split(".") + ["0", "0"])[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return parts[0], parts[1], parts[2]


def version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


ORT_FLAVOUR_MIN_TEXT = version_text(ORT_FLAVOUR_MIN)


def runs_ort_flavour(onnxruntime_version: str) -> bool:
    """Whether this onnxruntime release may run "ort" flavour graphs."""
    return version_tuple(onnxruntime_version) >= ORT_FLAVOUR_MIN


def oldest_onnxruntime(graph: str, quant: str, moe: str = "none", form: str = MATMULNBITS,
                       fused: bool = False) -> tuple[tuple[int, ...], str] | None:
    """The oldest onnxruntime a graph with this flavour, these weights (written in `form`),
    these MoE layers and (`fused`) the fused layer needs, and what needs it; None when any
    release does."""
    quant_min = QUANT_MIN if form == MATMULNBITS else dict.fromkeys(QUANT_MIN, DEQUANTIZE_MIN)
    needs = ([(ORT_FLAVOUR_MIN, "the 'ort' graph flavour")] if graph == ORT else []) + \
        ([(quant_min[quant], f"{quant} {form} weights")] if quant in quant_min else []) + \
        ([(MOE_KERNEL_MIN, "ONNX Runtime's MoE kernel")] if moe == "kernel" else []) + \
        ([(STATIC_FUSED_MIN, "the fused layer's opset-23 operators")] if fused else [])
    return max(needs) if needs else None


POSITION_IDS = "position_ids"
LOGITS = "logits"
# Optional outputs after the KV ones, written on "ort" flavour drafts: the last row's argmax
# (B,) int64 and its softmax probability (B,) float32. The loop needs both after every draft
# step (greedy's token, adaptive k's confidence); inside the graph they are a few more ops on
# logits already in cache, on the host numpy calls that run on caches the models have just
# swept, several times dearer (docs/export.md, "The bundle"; docs/performance-notes.md §2).
TOP_ID, TOP_PROB = "top_id", "top_prob"


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
    return (present_key(i), present_value(i)) if in_place(graph) else (new_key(i), new_value(i))


# EAGLE-3 heads (docs/design.md §14). A bundle whose draft is a head has a target whose
# graphs (every flavour, and the ort target's rows graph) output AUX_HIDDEN (B, T, 3·Ht)
# float32 after the KV outputs: the residual stream entering the head's aux layers
# (ModelEntry.aux_layer_ids, in that order) for every row the call computes. The head's graph
# (the draft entry, kind EAGLE3) reads INPUT_IDS (row t: token x_{t+1}), POSITION_IDS (= t),
# FEATURES (B, T, 3·Ht) and HIDDEN (B, T, H), both float32, and one layer's cache; it computes
# x = fc(features) + hidden (the caller passes zeros for the one a row does not use) and gives
# LOGITS (B, T, V) over the target's vocabulary, the KV outputs, then HIDDEN_OUT (B, T, H),
# which the next drafting step feeds back as HIDDEN. A head is never the ort flavour: it is
# static beside an ort or static target (rows of different new_len batch in one call), standard
# beside a standard one (TensorRT).
AUX_HIDDEN, FEATURES, HIDDEN, HIDDEN_OUT = "aux_hidden", "features", "hidden", "hidden_out"
# ModelEntry.kind: a decoder model, an EAGLE-3 head, or the target's own MTP layer (DeepSeek V3,
# GLM-4 MoE), which reads one feature: the target's last hidden state after its final norm
# (aux_layer_ids [L], L the target's depth), as wide as the target (docs/design.md §14)
MODEL, EAGLE3, MTP = "model", "eagle3", "mtp"
KINDS = (MODEL, EAGLE3, MTP)
HEADS = (EAGLE3, MTP)        # the kinds that draft from the target's features
HEAD_INPUTS = (FEATURES, HIDDEN)          # beyond a model's inputs: the runtime's host buffers
EXTRA_OUTPUTS = (AUX_HIDDEN, HIDDEN_OUT)  # ... and outputs (backends/ort.py)


def head_graph(target_graph: str) -> str:
    """The flavour of an EAGLE-3 head's graph beside a target of this flavour."""
    return STANDARD if target_graph == STANDARD else STATIC


def head_input_names() -> list[str]:
    return [INPUT_IDS, POSITION_IDS, FEATURES, HIDDEN, past_key(0), past_value(0)]


def head_output_names(graph: str) -> list[str]:
    return [LOGITS, *kv_output_names(0, graph), HIDDEN_OUT]


def input_names(num_layers: int, graph: str = STANDARD) -> list[str]:
    names = [INPUT_IDS, POSITION_IDS]
    for i in range(num_layers):
        names += [past_key(i), past_value(i)]
    return names + ([ATTEND_ROWS] if attends_rows(graph) else [])


def output_names(num_layers: int, graph: str = STANDARD, aux: bool = False) -> list[str]:
    """Logits, each layer's KV outputs, then AUX_HIDDEN if the target feeds an EAGLE-3 head."""
    names = [LOGITS]
    for i in range(num_layers):
        names += kv_output_names(i, graph)
    return names + ([AUX_HIDDEN] if aux else [])
