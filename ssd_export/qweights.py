"""Weight-only quantization of a decoder graph's MatMul weights (docs/design.md §12).

Every MatMul whose B is a constant 2-D weight (K, N) (the LM head too, unless kept float;
a tied head is the embedding's transpose, folded into a weight of its own here, while the
embedding itself stays float) is quantized in blocks of `block` along K and rewritten in one
of two forms:
  MatMulNBits       ONNX Runtime's contrib op (the `ort` flavour, CPU kernels);
  DequantizeLinear  opset 21 blockwise DequantizeLinear feeding the MatMul (the standard
                    flavour): TensorRT 10 builds it as weight-only quantization, ONNX Runtime
                    CPU fuses the pair into MatMulNBits.
Methods: "rtn", round to nearest, symmetric (the block's largest magnitude maps to -2^(b-1),
as ONNX Runtime's own quantizer does, so no zero point); "hqq", Half-Quadratic Quantization
as ONNX Runtime's quantizer implements it (asymmetric, a float zero point per block: the
MatMulNBits form only, since DequantizeLinear's zero point is an integer).

`rewrite` returns, per quantized weight, the float values the graph now computes with
(dequantized), so that the parity check runs the Hugging Face model on exactly those weights.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from ssd_runtime.contract import DEQUANTIZE, MATMULNBITS
from ssd_runtime.errors import ConfigError

METHODS = ("rtn", "hqq")
BLOCKS = (32, 64, 128)
DQ_OPSET = 21       # blockwise DequantizeLinear and the int4 type


@dataclass(frozen=True)
class Scheme:
    """How one model's weights are quantized; recorded in the manifest."""

    bits: int                   # 4 or 8
    block: int                  # weights per scale, along K
    method: str                 # METHODS
    lm_head: bool               # the LM head quantized too
    form: str                   # MATMULNBITS or DEQUANTIZE
    accuracy_level: int = 0     # MatMulNBits' compute type (0: the input's float type)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Weight:
    """One quantized weight: the original (K, N) B's name and its dequantized values."""

    name: str
    original: np.ndarray        # B as traced, in the graph's float dtype
    dequantized: np.ndarray     # what the rewritten graph multiplies by, same dtype


def rtn(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric round to nearest: (q int8 (K, N) in [-2^(b-1), 2^(b-1) - 1], scale (K/block, N))."""
    k, n = w.shape
    blocks = w.astype(np.float32).reshape(k // block, block, n)
    biggest = np.take_along_axis(blocks, np.abs(blocks).argmax(1)[:, None], 1)[:, 0]
    scale = biggest / -(2 ** (bits - 1))           # the largest magnitude maps to -2^(b-1)
    safe = np.where(scale == 0, 1, scale)[:, None]
    q = np.clip(np.rint(blocks / safe), -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    return q.astype(np.int8).reshape(k, n), scale.astype(np.float32)


def hqq(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX Runtime's HQQ: (q uint8 (K, N) in [0, 2^b - 1], scale, zero (K/block, N) floats);
    dequantized = (q - zero) * scale."""
    import torch

    module = _ort_quantizer_module()
    quantizer = module.HQQWeightOnlyQuantizer(module.HQQWeightOnlyQuantConfig(block_size=block,
                                                                              bits=bits))
    q, scale, zero = quantizer.quantize_internal(torch.from_numpy(
        np.ascontiguousarray(w.astype(np.float32).T)), bits=bits, group_size=block)
    return (q.T.numpy().astype(np.uint8), scale.T.float().numpy().copy(),
            zero.T.float().numpy().copy())


def rewrite(model, scheme: Scheme, vocab_size: int,
            select: Callable[[str, np.ndarray], bool] | None = None, pad: bool = False
            ) -> list[Weight]:
    """Quantize `model`'s (an onnx.ModelProto) constant MatMul weights in place, in
    `scheme.form`; return the weights quantized. `select(name, B)` may keep a weight float.
    A K the block does not divide is refused, or with `pad` its last block is padded with
    zeros (both forms allow it; TensorRT may not)."""
    from onnx import numpy_helper

    _fold_constant_transposes(model, numpy_helper)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    done: list[Weight] = []
    for node in list(graph.node):
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        b = numpy_helper.to_array(inits[node.input[1]])
        if b.ndim != 2 or b.dtype.kind != "f":
            continue
        k, n = b.shape
        if (n == vocab_size and not scheme.lm_head) or (select and not select(node.input[1], b)):
            continue
        if k % scheme.block and not pad:
            raise ConfigError(f"block size {scheme.block} does not divide the MatMul "
                              f"{node.name or node.output[0]}'s K = {k} (weight {b.shape}). "
                              f"---> HINT: use --quant-block "
                              f"{_dividing_block(k) or 'of a divisor'} or --quant none.")
        deq = _quantize_node(model, node, b, scheme)
        done.append(Weight(node.input[1], b, deq.astype(b.dtype)))
    used = {name for n in graph.node for name in n.input}
    kept = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if scheme.form == DEQUANTIZE:
        _require_opset(model, DQ_OPSET)
    else:
        _require_domain(model, "com.microsoft", 1)
    return done


def _quantize_node(model, node, b: np.ndarray, scheme: Scheme) -> np.ndarray:
    """Replace `node` by its quantized form; return the dequantized (K, N) float32 B."""
    from onnx import helper, numpy_helper

    k, n = b.shape
    blocks = -(-k // scheme.block)
    padded = np.zeros((blocks * scheme.block, n), b.dtype)
    padded[:k] = b
    np_float = np.float16 if b.dtype == np.float16 else np.float32
    name = node.input[1]
    if scheme.method == "hqq":
        q, scale, zero = hqq(padded, scheme.bits, scheme.block)
        scale, zero = scale.astype(np_float), zero.astype(np_float)
        deq = (q.astype(np.float32).reshape(blocks, scheme.block, n)
               - zero[:, None].astype(np.float32)) * scale[:, None].astype(np.float32)
    else:
        q, scale = rtn(padded, scheme.bits, scheme.block)
        scale, zero = scale.astype(np_float), None
        deq = q.astype(np.float32).reshape(blocks, scheme.block, n) \
            * scale[:, None].astype(np.float32)
    deq = deq.reshape(-1, n)[:k]
    graph = model.graph
    at = list(graph.node).index(node)
    if scheme.form == MATMULNBITS:
        unsigned = q.astype(np.int16) + (0 if zero is not None else 2 ** (scheme.bits - 1))
        packed = _pack(unsigned.astype(np.uint8).T, scheme.bits)    # (N, K) rows
        blob = scheme.block * scheme.bits // 8
        inits = [numpy_helper.from_array(packed.reshape(n, blocks, blob),
                                         f"{name}_q{scheme.bits}"),
                 numpy_helper.from_array(np.ascontiguousarray(scale.T).reshape(-1),
                                         f"{name}_scales")]
        if zero is not None:
            inits.append(numpy_helper.from_array(np.ascontiguousarray(zero.T).reshape(-1),
                                                 f"{name}_zero_points"))
        new = [helper.make_node(MATMULNBITS, [node.input[0]] + [i.name for i in inits],
                                list(node.output), name=f"{node.name}_q{scheme.bits}",
                                domain="com.microsoft", K=k, N=n, bits=scheme.bits,
                                block_size=scheme.block,
                                accuracy_level=scheme.accuracy_level)]
    else:
        if zero is not None:
            raise ConfigError("HQQ's float zero points have no DequantizeLinear form. "
                              "---> HINT: use --quant-method rtn for a standard-flavour bundle.")
        kind = {4: "INT4", 8: "INT8"}[scheme.bits]
        inits = [_int_tensor(q[:k], kind, f"{name}_q{scheme.bits}"),
                 numpy_helper.from_array(scale, f"{name}_scales")]
        out = f"{name}_dequantized"
        new = [helper.make_node(DEQUANTIZE, [i.name for i in inits], [out],
                                name=f"{node.name}_dq", axis=0, block_size=scheme.block),
               helper.make_node("MatMul", [node.input[0], out], list(node.output),
                                name=node.name)]
    graph.initializer.extend(inits)
    graph.node.remove(node)
    for i, created in enumerate(new):
        graph.node.insert(at + i, created)
    return deq


def save(model, path) -> None:
    """Write a rewritten graph over `path`, its weights in one external file beside it."""
    import onnx

    data = path.with_name(path.name + ".data")
    for old in (path, data):
        old.unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data.name, size_threshold=1024)


def _pack(rows: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned values (R, K) packed along K as MatMulNBits and int4 tensors store them: two
    4-bit values a byte, the first in the low nibble."""
    if bits == 8:
        return np.ascontiguousarray(rows)
    return (rows[:, 0::2] & 0x0F) | ((rows[:, 1::2] & 0x0F) << 4)


def _int_tensor(q: np.ndarray, kind: str, name: str):
    from onnx import TensorProto, helper

    if kind == "INT8":
        return helper.make_tensor(name, TensorProto.INT8, q.shape, q.astype(np.int8).tobytes(),
                                  raw=True)
    flat = q.astype(np.int8).reshape(1, -1).view(np.uint8)
    if flat.shape[1] % 2:
        flat = np.concatenate([flat, np.zeros((1, 1), np.uint8)], axis=1)
    return helper.make_tensor(name, TensorProto.INT4, q.shape, _pack(flat, 4).tobytes(),
                              raw=True)


def _fold_constant_transposes(model, numpy_helper) -> None:
    """Transpose(initializer) feeding a MatMul's B becomes an initializer of its own, so that
    the weight is a constant: a tied lm_head (MatMul(x, Transpose(embedding)))."""
    inits = {i.name: i for i in model.graph.initializer}
    feeds_matmul_b = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    for node in list(model.graph.node):
        if (node.op_type == "Transpose" and node.input[0] in inits
                and node.output[0] in feeds_matmul_b):
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            array = numpy_helper.to_array(inits[node.input[0]])
            folded = np.ascontiguousarray(np.transpose(array, perm))
            model.graph.initializer.append(numpy_helper.from_array(folded, node.output[0]))
            model.graph.node.remove(node)


def _require_opset(model, version: int) -> None:
    """The default domain at `version` at least (the graph's ops keep their meaning from the
    traced opset to 21: checked by the parity run that follows), and the IR version int4 needs."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < version:
            opset.version = version
    model.ir_version = max(model.ir_version, 10)


def _require_domain(model, domain: str, version: int) -> None:
    if not any(o.domain == domain for o in model.opset_import):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid(domain, version))


def _dividing_block(k: int) -> int | None:
    return next((b for b in reversed(BLOCKS) if k % b == 0), None)


def _ort_quantizer_module():
    """onnxruntime's weight-only quantizer module, imported without the logging.basicConfig
    (INFO) it runs on import (one line per node on stderr otherwise)."""
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization import matmul_nbits_quantizer as module

    root.handlers[:] = handlers
    root.setLevel(level)
    module.logger.setLevel(logging.WARNING)
    return module
