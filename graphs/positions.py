"""Position schemes done in the graph: rotary (RoPE, full or partial, rotate-half or
interleaved), ALiBi and a per-position query scale.

RoPE tables come from the Hugging Face rotary module (inv_freq, attention_scaling), so
linear / llama3 / yarn scaling is what Hugging Face computed at load time. Learned
absolute positions are a plain embedding lookup in decoder.py.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .adapters import RopePrecision


class Rope(nn.Module):
    """cos/sin tables for absolute positions; rotates the first R = 2·len(inv_freq) dims.

    Rotate-half pairs dim j with j + R/2 (Llama); interleaved pairs 2j with 2j + 1 (GPT-J,
    Cohere). Both use frequency inv_freq[j] for pair j. The precision is where a float16
    model rotates: in its own dtype (Llama), in float32 from float32 cos/sin (OLMo, ERNIE
    4.5), or in float32 from cos/sin rounded to its dtype first (Cohere); q and k come back
    in the model's dtype.
    """

    def __init__(self, inv_freq: torch.Tensor, scale: float = 1.0, interleaved: bool = False,
                 precision: RopePrecision = "model") -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.detach().float().clone(), persistent=False)
        self.scale = scale
        self.interleaved = interleaved
        self.precision = precision
        self.rotary_dim = 2 * self.inv_freq.numel()

    @classmethod
    def from_module(cls, rotary: nn.Module, prefix: str = "", interleaved: bool = False,
                    precision: RopePrecision = "model", scale: float | None = None) -> Rope:
        """From a Hugging Face rotary module's `{prefix}inv_freq` and `{prefix}attention_scaling`
        (Gemma 3 keeps one pair per layer type: prefix "sliding_attention_"), or `scale`."""
        # the load-time frequencies, even if a long forward pass has since changed inv_freq
        inv_freq = getattr(rotary, f"{prefix}original_inv_freq", None)
        inv_freq = getattr(rotary, f"{prefix}inv_freq") if inv_freq is None else inv_freq
        if scale is None:
            scale = float(getattr(rotary, f"{prefix}attention_scaling", 1.0))
        return cls(inv_freq, scale, interleaved, precision)

    @classmethod
    def from_base(cls, base: float, rotary_dim: int, interleaved: bool = False,
                  precision: RopePrecision = "model") -> Rope:
        """base^(-2j/R), computed as Hugging Face does, for models that keep no inv_freq."""
        exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
        return cls(1.0 / (base ** exponent), 1.0, interleaved, precision)

    def tables(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """cos and signed sin (B, T, 1, R) for `apply`: sin carries the sign that rotating a
        pair puts on its first member, so a rotation is x·cos + partner(x)·sin, with no Neg
        node (the same bits: negating is exact; docs/design.md §12)."""
        if self.precision == "float32":
            dtype = torch.float32
        freqs = position_ids[..., None].float() * self.inv_freq     # (B, T, R/2)
        if self.interleaved:
            emb = torch.repeat_interleave(freqs, 2, dim=-1)         # (B, T, R): f0 f0 f1 f1 ..
        else:
            emb = torch.cat((freqs, freqs), dim=-1)                 # (B, T, R): f0 f1 .. f0 f1 ..
        cos = (emb.cos() * self.scale).to(dtype)[:, :, None, :]     # (B, T, 1, R)
        sin = (emb.sin() * self.scale).to(dtype)[:, :, None, :] * self._sign().to(dtype)
        return cos, sin

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, T, n, D): RoPE on x[..., :R], the rest passes through; cos, sin from tables."""
        if self.precision != "model":                               # in float32, rounded back
            return self._rotate(x.float(), cos, sin).to(x.dtype)
        return self._rotate(x, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x·cos + rotate(x)·sin with rotate(x) = sign·partner(x): rotate-half pairs dim j
        with j + R/2, (x0 .. xR-1) -> (-xR/2 .. -xR-1, x0 .. xR/2-1); interleaved pairs 2j
        with 2j + 1, (x0, x1, ..) -> (-x1, x0, ..). The sign is in sin (tables)."""
        if self.rotary_dim == x.shape[-1]:
            return x * cos + self._partner(x) * sin
        rot, rest = x[..., :self.rotary_dim], x[..., self.rotary_dim:]
        return torch.cat((rot * cos + self._partner(rot) * sin, rest), dim=-1)

    def _partner(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., R) with each dim's partner in its place: the halves swapped (one Split and
        one Concat of blocks, which ONNX Runtime runs far faster than a Gather of single
        elements: docs/performance-notes.md, "Figures from code comments"), or each pair
        swapped (interleaved)."""
        R = self.rotary_dim
        if self.interleaved:
            return x.index_select(-1, torch.arange(R) ^ 1)
        first, second = x.split(R // 2, dim=-1)
        return torch.cat((second, first), dim=-1)

    def _sign(self) -> torch.Tensor:
        """-1 where a dim takes its partner negated, else 1 (R,), float32."""
        R = self.rotary_dim
        j = torch.arange(R)
        first = (j % 2 == 0) if self.interleaved else (j < R // 2)
        return torch.where(first, -1.0, 1.0)


def log_position_scale(position_ids: torch.Tensor, beta: float, period: int,
                       dtype: torch.dtype) -> torch.Tensor:
    """Llama 4's attention temperature: 1 + beta·log(1 + floor(position / period)) per query
    position, (B, T) -> (B, T, 1, 1); 1 below the first period."""
    scale = 1 + beta * torch.log(1 + torch.floor(position_ids / period))
    return scale.to(dtype)[:, :, None, None]


def alibi_slopes(num_heads: int, bfloat16: bool = True) -> torch.Tensor:
    """Per-head ALiBi slopes (H,), rounded to bfloat16 as Hugging Face's Falcon does if asked.

    (MPT's formula, 2^(-8k/P) over the power of two P at or above H with the even k first,
    gives these same slopes.)
    """
    closest = 2 ** math.floor(math.log2(num_heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != num_heads:
        extra = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        odd = torch.arange(1, 1 + 2 * min(closest, num_heads - closest), 2, dtype=torch.int32)
        slopes = torch.cat((slopes, torch.pow(extra, odd)))
    return slopes.bfloat16().float() if bfloat16 else slopes


def alibi_bias(slopes: torch.Tensor, key_pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """slopes (Hkv, G), key positions (B, S) -> additive bias (B, Hkv, G, 1, S), float32.

    Key positions are per row (attention.key_positions): rows of a batch have their own past
    lengths, so their new keys sit at their own positions.

    The bias is computed in `dtype` as Hugging Face does: bfloat16 for Falcon (positions
    rounded to bfloat16, product rounded again), the model's dtype for BLOOM (a float32
    product rounded once), float32 for MPT; the casts below reproduce that exactly in
    float32 arithmetic. (MPT's bias is slope·(key - last key): a constant per query away,
    which softmax ignores.)
    """
    pos = key_pos.float()                                            # (B, S)
    if dtype == torch.bfloat16:
        pos = pos.to(torch.bfloat16).float()
    bias = (slopes[None, :, :, None] * pos[:, None, None, :]).to(dtype).float()  # (B, Hkv, G, S)
    return bias[:, :, :, None, :]
