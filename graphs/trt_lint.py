"""TensorRT operator lint: is every op, attribute and dtype of an ONNX graph one that
TensorRT 10's ONNX parser takes? Run at export on the decoder graphs and the heads.

The table is onnx-tensorrt's docs/operators.md for TensorRT 10.15 GA (opset 9 to 24;
TensorRT 10.0 read opset 9 to 20), reduced to the supported rows and their types.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

SOURCE = "onnx-tensorrt docs/operators.md, TensorRT 10.15 GA"
OPSET_RANGE = (9, 24)          # what TensorRT 10.15 reads
OPSET_EVERY_10X = 20           # what every TensorRT 10.x reads (10.0: opset 9 to 20)
TOPK_MAX_K = 3840              # "K input must be less than 3840"

_F = "FP32 FP16 BF16"
_N = f"{_F} INT32 INT64"
_A = f"{_N} BOOL"
# op: supported types (the op's data type T), from the "Supported Types" column
_TABLE = f"""
Abs Add ArgMax ArgMin DepthToSpace Div Equal Greater GreaterOrEqual IsNaN Less LessOrEqual
  Max Min Mod Mul Neg Pad Pow Range Relu Scatter ScatterElements ScatterND Shrink Sign
  SpaceToDepth Sub Sum ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean
  ReduceMin ReduceProd ReduceSum ReduceSumSquare TopK: {_N}
Acos Acosh Asin Asinh Atan Atanh AveragePool BatchNormalization Ceil Celu Clip Conv
  ConvTranspose Cos Cosh CumSum Dropout Einsum Elu Erf Exp Floor Gemm GlobalAveragePool
  GlobalLpPool GlobalMaxPool GroupNormalization GRU HardSigmoid HardSwish Hardmax ImageScaler
  InstanceNormalization IsInf LayerNormalization LeakyRelu Log LogSoftmax LRN LSTM
  LpNormalization LpPool MatMul MaxPool MeanVarianceNormalization ParametricSoftplus PRelu
  QuantizeLinear RandomNormal RandomNormalLike RandomUniform RandomUniformLike Reciprocal
  Resize RMSNormalization RNN RotaryEmbedding Round ScaledTanh Scan Selu Sigmoid Sin Sinh
  Softmax Softplus Softsign Sqrt Tan Tanh ThresholdedRelu Upsample: {_F}
Concat Expand EyeLike Flatten Gather GatherElements GatherND Identity If Loop OneHot Reshape
  ReverseSequence Shape Size Slice Split Squeeze Tile Transpose Trilu Unsqueeze Where: {_A}
And Not Or Xor: BOOL
Attention: {_F} INT8 FP8
BlackmanWindow DeformConv GridSample HammingWindow HannWindow Mish NonMaxSuppression NonZero
  RoiAlign: FP32 FP16
Cast CastLike: {_A} UINT8
Constant ConstantOfShape: {_A} FP8 FP4 INT4
DequantizeLinear: INT8 FP8 FP4 INT4
Gelu: {_N} INT8
Mean: {_N} FP8
STFT: FP32
TensorScatter: {_F} INT32
"""
_ONNX_TYPES = {"FP32": TensorProto.FLOAT, "FP16": TensorProto.FLOAT16,
               "BF16": TensorProto.BFLOAT16, "INT32": TensorProto.INT32,
               "INT64": TensorProto.INT64, "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8,
               "INT8": TensorProto.INT8, "FP8": TensorProto.FLOAT8E4M3FN,
               "FP4": getattr(TensorProto, "FLOAT4E2M1", -1),      # onnx >= 1.18
               "INT4": getattr(TensorProto, "INT4", -2)}
IO_TYPES = frozenset(_ONNX_TYPES[t] for t in _A.split() + ["UINT8", "INT8", "FP8"])
# where an op's type T is read, when not from its first input
_TYPE_FROM = {"Where": ("input", 1), "Constant": ("output", 0), "ConstantOfShape": ("output", 0),
              "RandomNormal": ("output", 0), "RandomUniform": ("output", 0)}
_REDUCE = {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
           "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"}

Severity = Literal["error", "warning"]


def _parse_table(text: str) -> dict[str, frozenset[int]]:
    table, ops = {}, []
    for line in text.strip().splitlines():
        head, sep, types = line.partition(":")
        ops += head.split()
        if sep:
            allowed = frozenset(_ONNX_TYPES[t] for t in types.split())
            table.update({op: allowed for op in ops})
            ops = []
    return table


SUPPORTED: dict[str, frozenset[int]] = _parse_table(_TABLE)


@dataclass(frozen=True)
class Finding:
    graph: str             # e.g. "target/model.onnx"
    node: str
    op: str
    problem: str
    severity: Severity = "error"

    def __str__(self) -> str:
        return f"{self.graph}: node {self.node!r} ({self.op}): {self.problem}"


def lint_file(path: Path, name: str | None = None) -> list[Finding]:
    """Lint an ONNX file; external weights are not loaded (only their dtypes matter)."""
    model = onnx.load(str(path), load_external_data=False)
    return lint_model(model, name or Path(path).name)


def lint_model(model: onnx.ModelProto, name: str) -> list[Finding]:
    """Every finding for `model`: errors TensorRT 10 refuses; warnings it may refuse."""
    findings = _check_opset(model, name)
    try:         # inference is a help for dtypes, not a requirement: its failure is a warning
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except onnx.shape_inference.InferenceError as exc:
        findings.append(Finding(name, "(model)", "type inference", f"ONNX type inference failed "
                                f"({str(exc).splitlines()[0] if str(exc) else 'no message'}), so "
                                f"only declared types were checked", "warning"))
    graph = model.graph
    types = _types(graph)
    constants = _constants(graph)
    for value in [*graph.input, *graph.output]:
        elem = value.type.tensor_type.elem_type
        if elem and elem not in IO_TYPES:
            findings.append(Finding(name, value.name, "graph I/O", f"type "
                                    f"{TensorProto.DataType.Name(elem)} is not a TensorRT network "
                                    f"input/output type"))
    functions = {(f.domain, f.name) for f in model.functions}
    for node in _nodes(graph):
        findings += _check_node(node, name, types, constants, functions)
    for function in model.functions:
        for node in function.node:
            findings += _check_node(node, f"{name}:{function.name}", types, constants, functions)
    return findings


def errors(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def _check_opset(model: onnx.ModelProto, name: str) -> list[Finding]:
    for opset in model.opset_import:
        if opset.domain not in ("", "ai.onnx"):
            continue
        low, high = OPSET_RANGE
        if not low <= opset.version <= high:
            return [Finding(name, "(model)", "opset", f"opset {opset.version} is outside "
                            f"[{low}, {high}], the range TensorRT 10 reads")]
        if opset.version > OPSET_EVERY_10X:
            return [Finding(name, "(model)", "opset", f"opset {opset.version} needs a recent "
                            f"TensorRT 10.x (10.0 reads up to {OPSET_EVERY_10X})", "warning")]
    return []


def _check_node(node: onnx.NodeProto, graph: str, types: dict[str, int],
                constants: dict[str, np.ndarray | None], functions: set) -> list[Finding]:
    op, label = node.op_type, node.name or (node.output[0] if node.output else "?")

    def finding(problem: str, severity: Severity = "error") -> list[Finding]:
        return [Finding(graph, label, op, problem, severity)]

    if node.domain not in ("", "ai.onnx"):
        if (node.domain, op) in functions:
            return []                   # a local function: its body is linted on its own
        return finding(f"custom domain {node.domain!r}: TensorRT would need a plugin for it")
    if op not in SUPPORTED:
        return finding(f"{op} is not supported by TensorRT 10's ONNX parser ({SOURCE})")
    out = []
    allowed = SUPPORTED[op]
    for tensor in _typed_tensors(node):
        elem = types.get(tensor)
        if elem == TensorProto.DOUBLE:
            out += finding(f"{tensor!r} is DOUBLE: TensorRT casts it down to FLOAT", "warning")
        elif elem is not None and elem not in allowed:
            names = ", ".join(sorted(TensorProto.DataType.Name(t) for t in allowed))
            out += finding(f"{tensor!r} is {TensorProto.DataType.Name(elem)}; TensorRT 10 takes "
                           f"{op} on {names}")
    return out + _restrictions(node, op, constants, finding) + _blocked(node, types, finding)


def _blocked(node, types: dict[str, int], finding) -> list[Finding]:
    """Blockwise DequantizeLinear (weight-only quantization, docs/design.md §12): TensorRT 10
    blocks INT4 and FP4 weights only, and its quantization is symmetric (no zero point)."""
    if node.op_type != "DequantizeLinear":
        return []
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if not attrs.get("block_size"):
        return []
    blockable = {_ONNX_TYPES["INT4"], _ONNX_TYPES["FP4"]}
    elem = types.get(node.input[0])
    if elem is not None and elem not in blockable:
        return finding(f"blocked quantization of {TensorProto.DataType.Name(elem)}; TensorRT 10 "
                       f"blocks INT4 and FP4 weights only")
    if len(node.input) > 2 and node.input[2]:
        return finding("a zero point; TensorRT's quantization is symmetric")
    return []


def _restrictions(node, op: str, constants: dict, finding) -> list[Finding]:
    """The "Restrictions" column, for the ops where it concerns attributes or inputs."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input)

    def constant_input(i: int) -> bool:
        return len(inputs) <= i or not inputs[i] or inputs[i] in constants

    if op == "TopK":
        if attrs.get("sorted", 1) != 1:
            return finding("sorted=0; TensorRT needs sorted=1")
        k = constants.get(inputs[1]) if len(inputs) > 1 else None
        if inputs[1] not in constants:
            return finding(f"K is computed at run time; TensorRT needs K < {TOPK_MAX_K}",
                           "warning")
        if k is not None and int(np.max(k)) >= TOPK_MAX_K:
            return finding(f"K={int(np.max(k))}; TensorRT needs K < {TOPK_MAX_K}")
    elif op == "CumSum" and not constant_input(1):
        return finding("axis is not a build-time constant")
    elif op in _REDUCE and not constant_input(1):
        return finding("axes is not an initializer")
    elif op in ("Squeeze", "Unsqueeze") and not constant_input(1):
        return finding("axes may not resolve to a constant", "warning")
    elif op == "ScatterND" and attrs.get("reduction", b"none") not in (b"none", "none"):
        return finding(f"reduction={attrs['reduction']!r}; TensorRT supports only 'none'")
    elif op == "Constant" and set(attrs) & {"sparse_value", "value_string", "value_strings"}:
        return finding("sparse or string constants are unsupported")
    elif op in ("AveragePool", "MaxPool", "LpPool") and any(d != 1 for d in
                                                           attrs.get("dilations", [])):
        return finding("dilations other than 1")
    elif op == "LayerNormalization" and any(node.output[1:]):
        return finding("only the first output Y is supported")
    elif op == "LSTM" and (attrs.get("input_forget", 0) or attrs.get("layout", 0)):
        return finding("input_forget and layout must be 0")
    elif op == "Resize" and attrs.get("antialias", 0):
        return finding("antialiasing is unsupported")
    elif op == "OneHot" and not constant_input(1):
        return finding("depth is not a build-time constant")
    elif op == "TensorScatter" and attrs.get("axis", -2) != -2:
        return finding("axis must be -2")
    elif op == "Attention" and (any(inputs[4:6]) or any(node.output[1:])):
        return finding("past_key/past_value inputs and present/qk outputs are unsupported")
    elif op == "Dropout" and not constant_input(2):
        return finding("training_mode must be an initializer that is false")
    return []


def _typed_tensors(node: onnx.NodeProto) -> list[str]:
    """The tensors that carry the op's type T."""
    if node.op_type in ("Cast", "CastLike"):
        return [node.input[0], node.output[0]]
    if node.op_type in ("If", "Loop", "Scan"):
        return []                            # bodies are linted node by node
    where, index = _TYPE_FROM.get(node.op_type, ("input", 0))
    names = node.input if where == "input" else node.output
    return [names[index]] if len(names) > index and names[index] else []


def _nodes(graph: onnx.GraphProto) -> Iterable[onnx.NodeProto]:
    """Every node, including those of If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _nodes(sub)


def _types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {t.name: t.data_type for t in graph.initializer}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    for node in _nodes(graph):
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    return types


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray | None]:
    """Initializers and Constant outputs: name -> value (None when stored externally)."""
    def value(tensor: TensorProto) -> np.ndarray | None:
        if tensor.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(tensor)

    found = {t.name: value(t) for t in graph.initializer}
    for node in _nodes(graph):
        if node.op_type == "Constant":
            tensors = [a.t for a in node.attribute if a.name == "value"]
            found[node.output[0]] = value(tensors[0]) if tensors else None
    return found
