"""The static flavour's fused operators as traceable ops (fused.py uses them; docs/design.md §12).

Each is a PyTorch custom op with a reference implementation in plain torch (so the wrapper
still runs eagerly). The exporter writes each as one placeholder node of the `ssd.fused`
domain, and `lower` then rewrites those into what ONNX Runtime runs:

    skip_rms_norm   -> com.microsoft::SkipSimplifiedLayerNormalization (outputs 0 and 3)
    rotary          -> RotaryEmbedding (ONNX opset 23)
    grouped_attention -> Attention (ONNX opset 23)

A placeholder rather than the op itself, because the exporter writes every output of an op's
schema (Attention's present keys and values and its q·k copy, which ONNX Runtime would then
compute) and keeps the traced opset (18), in which neither ONNX op exists.
"""
from __future__ import annotations

import onnx
import torch

DOMAIN = "ssd.fused"                 # the placeholders' domain, gone after `lower`
ONNX_OPSET = 23                      # Attention and RotaryEmbedding
_MS = "com.microsoft"


@torch.library.custom_op("ssd::skip_rms_norm", mutates_args=())
def skip_rms_norm(x: torch.Tensor, skip: torch.Tensor, weight: torch.Tensor,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight · RMSNorm(x + skip), x + skip): a residual add and the next norm in one."""
    total = x + skip
    f = total.float()
    normed = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype), total


@skip_rms_norm.register_fake
def _(x, skip, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)


@torch.library.custom_op("ssd::rotary", mutates_args=())
def rotary(x: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
           position_ids: torch.Tensor, interleaved: int, rotary_dim: int) -> torch.Tensor:
    """x (B, N, T, D) rotated at position_ids (B, T) from cos/sin (positions, R/2) tables:
    dims [0, R) as pairs (j, j + R/2), or (2j, 2j + 1) if interleaved; the rest pass."""
    R = rotary_dim or x.shape[-1]
    cos = cos_cache[position_ids][:, None]                      # (B, 1, T, R/2)
    sin = sin_cache[position_ids][:, None]
    rot, rest = x[..., :R], x[..., R:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = rot.split(R // 2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((out, rest), dim=-1)


@rotary.register_fake
def _(x, cos_cache, sin_cache, position_ids, interleaved, rotary_dim):
    return torch.empty_like(x)


@torch.library.custom_op("ssd::grouped_attention", mutates_args=())
def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask)·v, one head per key head: q (B, N, S, D), k and v
    (B, N, L, D), mask broadcastable to (B, N, S, L) -> (B, N, S, D)."""
    scores = (q @ k.transpose(-1, -2)) * scale + mask
    return torch.softmax(scores, dim=-1) @ v


@grouped_attention.register_fake
def _(q, k, v, mask, scale):
    return torch.empty_like(q)


def translation_table() -> dict:
    """What the exporter writes for each op: one placeholder node (lowered by `lower`)."""
    from onnxscript.values import Opset

    _register_schemas()
    op = Opset(DOMAIN, 1)

    def skip_onnx(x, skip, weight, eps: float):
        return op.SkipRmsNorm(x, skip, weight, epsilon=eps, _outputs=2)

    def rotary_onnx(x, cos_cache, sin_cache, position_ids, interleaved: int, rotary_dim: int):
        return op.Rotary(x, cos_cache, sin_cache, position_ids, interleaved=interleaved,
                         rotary_embedding_dim=rotary_dim)

    def attention_onnx(q, k, v, mask, scale: float):
        return op.Attention(q, k, v, mask, scale=scale)

    return {torch.ops.ssd.skip_rms_norm.default: skip_onnx,
            torch.ops.ssd.rotary.default: rotary_onnx,
            torch.ops.ssd.grouped_attention.default: attention_onnx}


def lower(model: onnx.ModelProto) -> bool:
    """The placeholders rewritten into ONNX Runtime's and ONNX's ops, in place; the default
    domain raised to opset 23 where one was (the ops traced at 18 mean the same there: the
    parity check runs on the result). Returns whether anything was lowered."""
    fused = [n for n in model.graph.node if n.domain == DOMAIN]
    if not fused:
        return False
    for node in fused:
        if node.op_type == "SkipRmsNorm":           # outputs: y, mean, inv_std_var, sum
            node.domain, node.op_type = _MS, "SkipSimplifiedLayerNormalization"
            y, total = node.output
            del node.output[:]
            node.output.extend([y, "", "", total])
        else:                                        # Rotary, Attention: ONNX's own
            node.domain = ""
            node.op_type = "RotaryEmbedding" if node.op_type == "Rotary" else node.op_type
    imports = {o.domain: o for o in model.opset_import}
    del model.opset_import[:]
    for domain, o in imports.items():
        if domain == DOMAIN:
            continue
        if domain in ("", "ai.onnx"):
            o.version = max(o.version, ONNX_OPSET)
        model.opset_import.append(o)
    if _MS not in imports and any(n.domain == _MS for n in fused):
        model.opset_import.append(onnx.helper.make_opsetid(_MS, 1))
    return True


def _register_schemas() -> None:
    """Tell ONNX the placeholders' signatures (the exporter's evaluator looks ops up there)."""
    from onnx.defs import OpSchema

    try:
        onnx.defs.get_schema("SkipRmsNorm", 1, DOMAIN)
        return
    except onnx.defs.SchemaError:
        pass
    Param, Attr = OpSchema.FormalParameter, OpSchema.Attribute
    types = [("T", ["tensor(float)", "tensor(float16)"], ""), ("P", ["tensor(int64)"], "")]
    for name, inputs, outputs, attributes in (
            ("SkipRmsNorm", ["input", "skip", "gamma"], ["output", "input_skip_sum"],
             {"epsilon": OpSchema.AttrType.FLOAT}),
            ("Rotary", ["input", "cos_cache", "sin_cache", "position_ids"], ["output"],
             {"interleaved": OpSchema.AttrType.INT,
              "rotary_embedding_dim": OpSchema.AttrType.INT}),
            ("Attention", ["q", "k", "v", "mask"], ["output"],
             {"scale": OpSchema.AttrType.FLOAT})):
        onnx.defs.register_schema(OpSchema(
            name, DOMAIN, 1,
            inputs=[Param(n, "P" if n == "position_ids" else "T") for n in inputs],
            outputs=[Param(n, "T") for n in outputs], type_constraints=types,
            attributes=[Attr(n, t, "") for n, t in attributes.items()]))
