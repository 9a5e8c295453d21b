"""Position schemes done in the graph: rotary (RoPE, full or partial, rotate-half or
interleaved) and ALiBi.

RoPE tables come from the Hugging Face rotary module (inv_freq, attention_scaling), so
linear / llama3 / yarn scaling is what Hugging Face computed at load time. Learned
absolute positions are a plain embedding lookup in decoder.py.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class Rope(nn.Module):
    """cos/sin tables for absolute positions; rotates the first R = 2·len(inv_freq) dims.

    Rotate-half pairs dim j with j + R/2 (Llama); interleaved pairs 2j with 2j + 1 (GPT-J,
    Cohere). Both use frequency inv_freq[j] for pair j.
    """

    def __init__(self, inv_freq: torch.Tensor, scale: float = 1.0,
                 interleaved: bool = False) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.detach().float().clone(), persistent=False)
        self.scale = scale
        self.interleaved = interleaved
        self.rotary_dim = 2 * self.inv_freq.numel()

    @classmethod
    def from_module(cls, rotary: nn.Module, prefix: str = "", interleaved: bool = False,
                    scale: float | None = None) -> Rope:
        """From a Hugging Face rotary module's `{prefix}inv_freq` and `{prefix}attention_scaling`
        (Gemma 3 keeps one pair per layer type: prefix "sliding_attention_"), or `scale`."""
        # the load-time frequencies, even if a long forward pass has since changed inv_freq
        inv_freq = getattr(rotary, f"{prefix}original_inv_freq", None)
        inv_freq = getattr(rotary, f"{prefix}inv_freq") if inv_freq is None else inv_freq
        if scale is None:
            scale = float(getattr(rotary, f"{prefix}attention_scaling", 1.0))
        return cls(inv_freq, scale, interleaved)

    @classmethod
    def from_base(cls, base: float, rotary_dim: int, interleaved: bool = False) -> Rope:
        """base^(-2j/R), computed as Hugging Face does, for models that keep no inv_freq."""
        exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        return cls(1.0 / (base ** exponent), 1.0, interleaved)

    def tables(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        freqs = position_ids[..., None].float() * self.inv_freq     # (B, T, R/2)
        if self.interleaved:
            emb = torch.repeat_interleave(freqs, 2, dim=-1)         # (B, T, R): f0 f0 f1 f1 ..
        else:
            emb = torch.cat((freqs, freqs), dim=-1)                 # (B, T, R): f0 f1 .. f0 f1 ..
        cos = (emb.cos() * self.scale).to(dtype)[:, :, None, :]     # (B, T, 1, R)
        sin = (emb.sin() * self.scale).to(dtype)[:, :, None, :]
        return cos, sin

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, T, n, D): RoPE on x[..., :R], the rest passes through."""
        rotate = _rotate_pairs if self.interleaved else _rotate_half
        if self.rotary_dim == x.shape[-1]:
            return x * cos + rotate(x) * sin
        rot, rest = x[..., :self.rotary_dim], x[..., self.rotary_dim:]
        return torch.cat((rot * cos + rotate(rot) * sin, rest), dim=-1)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes (H,), rounded to bfloat16 as Hugging Face's Falcon does."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        odd = torch.arange(1, 1 + 2 * min(closest, num_heads - closest), 2, dtype=torch.int32)
        slopes = torch.cat((slopes, torch.pow(extra, odd)))
    return slopes.bfloat16().float()


def alibi_bias(slopes: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """slopes (Hkv, G), key positions (S,) -> additive bias (1, Hkv, G, 1, S).

    Hugging Face multiplies in bfloat16 (positions rounded to bfloat16, product rounded
    again); the casts below reproduce that exactly in float32 arithmetic.
    """
    pos = key_pos.float().to(torch.bfloat16).float()                 # (S,)
    bias = (slopes[:, :, None] * pos).to(torch.bfloat16).float()      # (Hkv, G, S)
    return bias[None, :, :, None, :]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ..) -> (-x1, x0, -x3, x2, ..)."""
    pairs = x.unflatten(-1, (-1, 2))                                # (..., R/2, 2)
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
