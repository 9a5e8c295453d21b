"""Multi-head latent attention (DeepSeek V2/V3) as multi-query attention over its latent cache.

Each token keeps a normed latent c and a rotated key part k_rot, shared by every head;
head h's key is [W_UK_h · c | k_rot] and its value W_UV_h · c (kv_b_proj). Taking W_UK_h
into the query, q_h · k_h = [W_UK_hᵀ · q_nope_h | q_rot_h] · [c | k_rot], so the heads share
one KV head of rank + rope_dims numbers (the graph contract's cache, adapters.LatentSpec):

    key    [c | k_rot]   value  [k_rot | c]         (B, T, 1, rank + rope_dims), one copy each
    out_h  = W_UV_h · (softmax(q_h · keys · s) · values)[rope_dims:]  ->  o_proj

Hugging Face caches c and k_rot too, and decompresses every cached token on every step;
this is the same attention in real arithmetic, its products associated differently.
"""
from __future__ import annotations

import torch
from torch import nn

from .adapters import LatentSpec
from .positions import Rope


def latent_qkv(attn: nn.Module, spec: LatentSpec, rope: Rope | None,
               cos_sin: tuple[torch.Tensor, ...] | None, h: torch.Tensor):
    """h (B, T, E) -> q (B, T, H, R + P), key [c | k_rot] and value [k_rot | c] (B, T, 1, R + P)
    for rank R and rope_dims P."""
    B, T, _ = h.shape
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(h))) if spec.q_rank else attn.q_proj(h)
    q = q.view(B, T, -1, spec.nope_dims + spec.rope_dims)          # (B, T, H, nope + P)
    q_nope, q_rot = q.split((spec.nope_dims, spec.rope_dims), dim=-1)
    c, k_rot = attn.kv_a_proj_with_mqa(h).split((spec.rank, spec.rope_dims), dim=-1)
    c = attn.kv_a_layernorm(c)[:, :, None]                          # (B, T, 1, R)
    k_rot = k_rot[:, :, None]                                       # (B, T, 1, P)
    if spec.deinterleave:
        q_rot, k_rot = (torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1) for x in (q_rot, k_rot))
    if rope is not None and cos_sin is not None:
        q_rot, k_rot = rope.apply(q_rot, *cos_sin), rope.apply(k_rot, *cos_sin)
    w_uk, _ = _absorbed(attn, spec)
    q_c = torch.einsum("bthn,hnr->bthr", q_nope, w_uk)             # (B, T, H, R)
    return (torch.cat((q_c, q_rot), dim=-1), torch.cat((c, k_rot), dim=-1),
            torch.cat((k_rot, c), dim=-1))


def latent_output(attn: nn.Module, spec: LatentSpec, out: torch.Tensor) -> torch.Tensor:
    """Attention output (B, T, H·(P + R)) over the values [k_rot | c] -> o_proj's output."""
    B, T, _ = out.shape
    c = out.view(B, T, -1, spec.rope_dims + spec.rank)[..., spec.rope_dims:]   # (B, T, H, R)
    _, w_uv = _absorbed(attn, spec)
    v = torch.einsum("bthr,hvr->bthv", c, w_uv)                     # (B, T, H, v_dims)
    return attn.o_proj(v.reshape(B, T, -1))


def _absorbed(attn: nn.Module, spec: LatentSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight (H·(nope + v), R) as W_UK (H, nope, R) and W_UV (H, v, R)."""
    w = attn.kv_b_proj.weight.view(-1, spec.nope_dims + spec.v_dims, spec.rank)
    return w[:, :spec.nope_dims], w[:, spec.nope_dims:]
