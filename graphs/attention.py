"""Attention over past + new tokens, as every adapter describes it.

Projections (separate or fused in either layout), optional per-head q/k norms, RoPE,
grouped-query attention against the sequence-major past (B, P, Hkv, D), score
soft-capping, ALiBi bias and the causal / sliding-window mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .adapters import Adapter
from .positions import Rope

_NEG = -1e30  # additive mask; finite so that softmax never sees -inf - -inf


@dataclass(frozen=True)
class Heads:
    num_heads: int      # H query heads
    num_kv_heads: int   # Hkv key/value heads; G = H // Hkv queries share one
    head_dim: int       # D

    @property
    def groups(self) -> int:
        return self.num_heads // self.num_kv_heads


def causal_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """Additive mask (B, 1, 1, T, S): key visible iff key <= query (and within the window)."""
    q = query_pos[:, :, None]                                       # (B, T, 1)
    visible = key_pos[None, None, :] <= q                           # (B, T, S)
    if window is not None:
        visible = visible & (q - key_pos[None, None, :] < window)
    zero = torch.zeros((), dtype=torch.float32)
    neg = torch.full((), _NEG, dtype=torch.float32)
    return torch.where(visible, zero, neg)[:, None, None, :, :]


def attention(attn: nn.Module, a: Adapter, heads: Heads, scaling: float, h: torch.Tensor,
              rope: Rope | None, cos_sin: tuple[torch.Tensor, ...] | None,
              past_k: torch.Tensor, past_v: torch.Tensor, bias: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h (B, T, E) -> (output (B, T, E), new keys, new values (B, T, Hkv, D)).

    `bias` is the mask (plus ALiBi) broadcastable to the scores (B, Hkv, G, T, S).

        h ─ proj ─┬─ q ─ q_norm ─ rope ─────────────┐
                  ├─ k ─ k_norm ─ rope ─ cat(past) ─ softmax(q·kᵀ·s [capped] + bias) · v ─ o
                  └─ v ──────────────── cat(past) ─┘
    """
    B, T, _ = h.shape
    Hkv, G, D = heads.num_kv_heads, heads.groups, heads.head_dim
    q, k, v = _project(attn, a, heads, h)                           # (B, T, H|Hkv, D)
    if a.q_norm is not None:
        q = getattr(attn, a.q_norm)(q)
        k = getattr(attn, a.k_norm)(k)
    if rope is not None:
        q = rope.apply(q, *cos_sin)
        k = rope.apply(k, *cos_sin)
    keys = torch.cat((past_k, k), dim=1)                            # (B, S, Hkv, D)
    values = torch.cat((past_v, v), dim=1)
    qg = q.view(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4)             # (B, Hkv, G, T, D)
    kt = keys.permute(0, 2, 3, 1)[:, :, None]                       # (B, Hkv, 1, D, S)
    scores = torch.matmul(qg, kt).float() * scaling                 # (B, Hkv, G, T, S)
    if a.attn_softcap is not None:
        scores = torch.tanh(scores / a.attn_softcap) * a.attn_softcap
    probs = torch.softmax(scores + bias, dim=-1).to(h.dtype)
    vs = values.permute(0, 2, 1, 3)[:, :, None]                     # (B, Hkv, 1, S, D)
    out = torch.matmul(probs, vs)                                   # (B, Hkv, G, T, D)
    out = out.permute(0, 3, 1, 2, 4).reshape(B, T, Hkv * G * D)
    return getattr(attn, a.o)(out), k, v


def _project(attn: nn.Module, a: Adapter, heads: Heads, h: torch.Tensor):
    """q (B, T, H, D), k and v (B, T, Hkv, D) from separate or fused projections."""
    B, T, _ = h.shape
    H, Hkv, G, D = heads.num_heads, heads.num_kv_heads, heads.groups, heads.head_dim
    if a.qkv is None:
        return (getattr(attn, a.q)(h).view(B, T, H, D), getattr(attn, a.k)(h).view(B, T, Hkv, D),
                getattr(attn, a.v)(h).view(B, T, Hkv, D))
    fused = getattr(attn, a.qkv)(h)                                 # (B, T, (H + 2·Hkv)·D)
    if a.qkv_layout == "split":                                     # [q | k | v]
        q, k, v = fused.split((H * D, Hkv * D, Hkv * D), dim=-1)
        return q.reshape(B, T, H, D), k.reshape(B, T, Hkv, D), v.reshape(B, T, Hkv, D)
    grouped = fused.view(B, T, Hkv, G + 2, D)                       # per KV head: G queries, k, v
    q = grouped[:, :, :, :G].reshape(B, T, H, D)
    return q, grouped[:, :, :, G], grouped[:, :, :, G + 1]
