"""The one decoder wrapper that gets traced: the graph contract of DESIGN.md.

    inputs   input_ids (B,T), position_ids (B,T), past_key.i / past_value.i (B,P,Hkv,D)
    outputs  logits (B,T,V), new_key.i / new_value.i (B,T,Hkv,D)

It reuses the Hugging Face modules for embeddings, norms, MLPs and the LM
head, and does attention itself: RoPE, grouped-query attention over
past + new, a causal mask (with a window for sliding-window layers).
"""
from __future__ import annotations

import torch
from torch import nn

from .adapters import Adapter, get_path, rope_type, sliding_windows, STATIC_ROPE_TYPES
from ssd_runtime.errors import ConfigError

_NEG = -1e30  # additive mask; finite so that softmax never sees -inf - -inf


class Decoder(nn.Module):
    def __init__(self, model: nn.Module, adapter: Adapter) -> None:
        super().__init__()
        config = model.config
        kind = rope_type(config)
        if kind not in STATIC_ROPE_TYPES:
            raise ConfigError(f"RoPE type {kind!r} is not supported (its frequencies change with "
                              f"sequence length); supported: {', '.join(STATIC_ROPE_TYPES)}.")
        self.embed = get_path(model, adapter.embed)
        self.layers = nn.ModuleList(get_path(model, adapter.layers))
        self.final_norm = get_path(model, adapter.final_norm)
        self.lm_head = get_path(model, adapter.lm_head)
        self.adapter = adapter
        rotary = get_path(model, adapter.rotary)
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        attn = getattr(self.layers[0], adapter.attn)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = float(attn.scaling)
        self.windows = sliding_windows(config)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed(input_ids)                                   # (B, T, H)
        cos, sin = self._rope(position_ids, x.dtype)                # (B, T, 1, D)
        past_len = past[0].shape[1]
        key_pos = torch.arange(past_len + input_ids.shape[1], device=input_ids.device)  # (S,)
        masks = {w: self._mask(position_ids, key_pos, w) for w in set(self.windows)}
        outputs: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            a = self.adapter
            h = getattr(layer, a.input_norm)(x)
            h, new_k, new_v = self._attention(getattr(layer, a.attn), h, cos, sin,
                                              past[2 * i], past[2 * i + 1], masks[self.windows[i]])
            x = x + h
            x = x + getattr(layer, a.mlp)(getattr(layer, a.post_attn_norm)(x))
            outputs += [new_k, new_v]
        logits = self.lm_head(self.final_norm(x)).float()          # (B, T, V)
        return (logits, *outputs)

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype):
        freqs = position_ids[..., None].float() * self.inv_freq     # (B, T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)                     # (B, T, D)
        cos = (emb.cos() * self.rope_scale).to(dtype)[:, :, None, :]
        sin = (emb.sin() * self.rope_scale).to(dtype)[:, :, None, :]
        return cos, sin

    @staticmethod
    def _mask(query_pos: torch.Tensor, key_pos: torch.Tensor, window: int | None) -> torch.Tensor:
        """Additive mask (B, 1, 1, T, S): key visible iff key <= query (and within the window)."""
        q = query_pos[:, :, None]                                   # (B, T, 1)
        visible = key_pos[None, None, :] <= q                       # (B, T, S)
        if window is not None:
            visible = visible & (q - key_pos[None, None, :] < window)
        zero = torch.zeros((), dtype=torch.float32)
        neg = torch.full((), _NEG, dtype=torch.float32)
        return torch.where(visible, zero, neg)[:, None, None, :, :]

    def _attention(self, attn: nn.Module, h: torch.Tensor, cos, sin, past_k, past_v, mask):
        a = self.adapter
        B, T, _ = h.shape
        Hkv, D = self.num_kv_heads, self.head_dim
        G = self.num_heads // Hkv
        q = getattr(attn, a.q)(h).view(B, T, Hkv * G, D)            # (B, T, H, D)
        k = getattr(attn, a.k)(h).view(B, T, Hkv, D)                # (B, T, Hkv, D)
        v = getattr(attn, a.v)(h).view(B, T, Hkv, D)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys = torch.cat((past_k, k), dim=1)                        # (B, S, Hkv, D)
        values = torch.cat((past_v, v), dim=1)
        q = q.view(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4)         # (B, Hkv, G, T, D)
        kt = keys.permute(0, 2, 3, 1)[:, :, None]                   # (B, Hkv, 1, D, S)
        scores = torch.matmul(q, kt).float() * self.scaling + mask  # (B, Hkv, G, T, S)
        probs = torch.softmax(scores, dim=-1).to(h.dtype)
        vs = values.permute(0, 2, 1, 3)[:, :, None]                 # (B, Hkv, 1, S, D)
        out = torch.matmul(probs, vs)                               # (B, Hkv, G, T, D)
        out = out.permute(0, 3, 1, 2, 4).reshape(B, T, Hkv * G * D)
        return getattr(attn, a.o)(out), k, v


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
