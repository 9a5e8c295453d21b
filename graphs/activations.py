"""The two activations the traced graphs and ONNX Runtime's kernels share: a softmax with
attention sinks and the clamped SwiGLU. attention.py and moe.py build the graphs with them;
ort_ops.py's reference implementations of GroupQueryAttention and MoE use the same maths.
"""
from __future__ import annotations

import torch


def softmax_with_sinks(scores: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis; `sinks` (broadcast to (..., 1)): one more logit per row that
    takes no value, GPT-OSS's attention sinks (ONNX Runtime's head_sink)."""
    if sinks is None:
        return torch.softmax(scores, dim=-1)
    sinks = sinks.expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, sinks), dim=-1), dim=-1)[..., :-1]


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, alpha: float, beta: float,
                   limit: float) -> torch.Tensor:
    """g·σ(alpha·g)·(u + beta), g = clamp(gate, max=limit), u = clamp(up, ±limit) (GPT-OSS;
    limit 0: no clamp, the MoE kernel's SwiGLU)."""
    if limit:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(gate * alpha) * (up + beta)
