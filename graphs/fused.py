"""The static flavour's decoder layer in fused operators (fused_ops.py), with a row's bits
independent of the rows beside it as before (docs/design.md §2, §12).

Where a float32 model fits it (`Fusion.plan`: pre-norm RMS layers, q, k, v as one packed
projection, RoPE or none, grouped-query attention with G >= 2, no score cap, sinks or ALiBi),
each layer of the static graph and of the ort target's rows graph is

    x ─┬────────────────────────────────────────────────┬─ SkipRMSNorm ─ h' ─ MLP ─ (next)
       │                                                 │
    h ─┴ qkv ─ (B,N,T,D) ─ split ─ RoPE(q|k) ─ split ─ q ─┴ Attention(q grouped, keys[:L], values[:L])
                                 └ v          k, v ─ ScatterND into the caches (in place)

the residual add and the next norm one SkipSimplifiedLayerNormalization, RoPE one
RotaryEmbedding over q and k together, attention one Attention whose batch entries are
(row, KV head) and whose G·T rows are the G query heads of every new token: no product ever
runs on one row, as _attend_cache's layout. Else the graph keeps the plain form (decoder.py).
"""
from __future__ import annotations

import torch
from torch import nn

from ssd_runtime import contract

from .adapters import get_path
from .attention import output_projection
from .fused_ops import grouped_attention, rotary, skip_rms_norm


class Fusion(nn.Module):
    """What the fused layer needs beyond the decoder's modules: per rope key the cos/sin tables
    of every position (max_context, R/2) for RotaryEmbedding, per layer its norms' epsilons,
    and in the static flavour [gate | up] as one projection where the MLP is gated."""

    def __init__(self, decoder, max_context: int, eps: list[tuple[float, float]],
                 pack_mlp: bool) -> None:
        super().__init__()
        self.eps = eps
        self.tables: dict[str, tuple[str, str]] = {}
        for key, rope in decoder.ropes.items():
            freqs = torch.arange(max_context, dtype=torch.float32)[:, None] * rope.inv_freq
            names = (f"fused_cos_{key}", f"fused_sin_{key}")
            self.register_buffer(names[0], freqs.cos() * rope.scale, persistent=False)
            self.register_buffer(names[1], freqs.sin() * rope.scale, persistent=False)
            self.tables[key] = names
        a = decoder.adapter
        self.gate_up = nn.ModuleList(
            _packed_gate_up(layer, a) if pack_mlp and i not in decoder.moe_layers
            else nn.Identity() for i, layer in enumerate(decoder.layers))

    @classmethod
    def plan(cls, decoder, max_context: int, pack_mlp: bool) -> Fusion | None:
        """The fused layer where every layer of this model fits it, else None (plain form)."""
        a, heads = decoder.adapter, decoder.heads
        dtype = next(decoder.layers.parameters()).dtype
        if (max_context == 0 or dtype != torch.float32 or heads.groups < 2
                or a.norm_position != "pre" or a.residual != "sequential"
                or a.residual_scale != 1.0 or a.attn_out_norm or a.mlp_out_norm
                or a.mlp_norm is None or a.input_norm is None or a.latent is not None
                or a.q_norm is not None or a.qkv_clip is not None or a.attn_sinks
                or a.q_position_scale is not None or a.attn_softcap is not None
                or a.positions == "alibi" or a.scores_fp32):
            return None
        if any(decoder.packed_projection(i) is None for i in range(len(decoder.layers))):
            return None
        import onnxruntime as ort

        if contract.version_tuple(ort.__version__) < contract.STATIC_FUSED_MIN:
            return None
        if any(rope.rotary_dim % 2 for rope in decoder.ropes.values()):
            return None
        eps = []
        for layer in decoder.layers:
            pair = (rms_eps(getattr(layer, a.input_norm)), rms_eps(getattr(layer, a.mlp_norm)))
            if None in pair:
                return None
            eps.append(pair)
        return cls(decoder, max_context, eps, pack_mlp)

    def decode(self, decoder, x: torch.Tensor, position_ids: torch.Tensor,
               past: tuple[torch.Tensor, ...], live_rows, masks: dict,
               rows_at: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, list[torch.Tensor], dict[int, torch.Tensor]]:
        """Every layer over x (B, T, E), as Decoder.decode: (the last layer's output before the
        final norm, the updated caches, the stream entering each layer). masks (B,1,1,T,L) per
        window, from the decoder; rows_at (B, T): the new rows' cache rows (a tree's: not its
        positions), else their positions."""
        a = decoder.adapter
        B, T = position_ids.shape
        G = decoder.heads.groups
        index = head_major_index(position_ids if rows_at is None else rows_at,
                                 decoder.heads.num_kv_heads)                # 3 x (B,Hkv,T)
        grouped = {w: m.expand(B, 1, G, T, m.shape[-1]).reshape(B, 1, G * T, m.shape[-1])
                   for w, m in masks.items()}                       # rows g·T + t: token t's
        outputs: list[torch.Tensor] = []
        entering: dict[int, torch.Tensor] = {}
        n = len(decoder.layers)
        h = getattr(decoder.layers[0], a.input_norm)(x)
        for i, layer in enumerate(decoder.layers):
            entering[i] = x
            out, keys, values = self._attention(decoder, i, h, position_ids, past[2 * i],
                                                past[2 * i + 1], index, live_rows,
                                                grouped[decoder.windows[i]])
            outputs += [keys, values]
            h, x = skip_rms_norm(x, out, getattr(layer, a.mlp_norm).weight, self.eps[i][1])
            m = self._mlp(decoder, i, h)
            if i + 1 < n:
                h, x = skip_rms_norm(x, m, getattr(decoder.layers[i + 1], a.input_norm).weight,
                                     self.eps[i + 1][0])
            else:
                x = x + m
        return x, outputs, entering

    def _attention(self, decoder, i: int, h: torch.Tensor, position_ids: torch.Tensor,
                   past_k: torch.Tensor, past_v: torch.Tensor, index, live_rows,
                   mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """h (B, T, E) -> (output (B, T, E), the caches (B, Hkv, R, D) with the new rows).

            qkv (B, T, N·D) ─ (B, N, T, D) ─┬ q|k ─ RoPE ─┬ q (B,H,T,D) ─ (B,Hkv,G·T,D) ─┐
                                            └ v           └ k                           Attention
            k, v ─ ScatterND at their rows ─ keys, values[:, :, :L] ───────────────────┘
            ─ (B,Hkv,G·T,D) ─ (B,H,T,D) ─ (B,T,H·D) ─ o_proj
        """
        heads = decoder.heads
        H, Hkv, G, D = heads.num_heads, heads.num_kv_heads, heads.groups, heads.head_dim
        B, T, _ = h.shape
        qkv = decoder.packed_projection(i)(h).view(B, T, H + 2 * Hkv, D).transpose(1, 2)  # (B, N, T, D)
        qk, v = qkv.split((H + Hkv, Hkv), dim=1)
        key = decoder.rope_keys[i]
        if key is not None:
            rope = decoder.ropes[key]
            cos, sin = (getattr(self, name) for name in self.tables[key])
            rotary_dim = 0 if rope.rotary_dim == D else rope.rotary_dim
            qk = rotary(qk, cos, sin, position_ids, int(rope.interleaved), rotary_dim)
        q, k = qk.split((H, Hkv), dim=1)                            # (B, H|Hkv, T, D)
        keys = past_k.index_put(index, k)                           # (B, Hkv, R, D)
        values = past_v.index_put(index, v)
        live_k, live_v = (keys, values) if live_rows is None else \
            (keys[:, :, :live_rows], values[:, :, :live_rows])      # (B, Hkv, L, D)
        out = grouped_attention(q.reshape(B, Hkv, G * T, D), live_k, live_v, mask,
                                decoder.scalings[i])                # (B, Hkv, G·T, D)
        out = out.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        attn = get_path(decoder.layers[i], decoder.adapter.attn)
        return output_projection(attn, decoder.adapter, out), keys, values

    def _mlp(self, decoder, i: int, h: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up[i]
        if isinstance(gate_up, nn.Identity):
            return decoder.mlp_block(i, h)
        mlp = get_path(decoder.layers[i], decoder.adapter.mlp[0])
        gate, up = gate_up(h).chunk(2, dim=-1)                      # (B, T, I) each
        return mlp.down_proj(mlp.act_fn(gate) * up)


def head_major_index(position_ids: torch.Tensor, num_kv_heads: int) -> tuple[torch.Tensor, ...]:
    """Where the new keys and values (B, Hkv, T, D) go in the cache (B, Hkv, R, D): batch,
    head and row = position, three (B, Hkv, T) int64 tensors, built once per call."""
    B, T = position_ids.shape
    shape = (B, num_kv_heads, T)
    b = torch.arange(B, device=position_ids.device)[:, None, None].expand(shape)
    h = torch.arange(num_kv_heads, device=position_ids.device)[None, :, None].expand(shape)
    return b, h, position_ids[:, None, :].expand(shape)


def rms_eps(norm: nn.Module) -> float | None:
    """The epsilon of an RMS norm computing weight · x / sqrt(mean(x²) + eps) (checked on a
    random input: Gemma's 1 + weight, a LayerNorm's centring or bias fail it), else None."""
    weight = getattr(norm, "weight", None)
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float) \
            or getattr(norm, "bias", None) is not None:
        return None
    x = 3 * torch.randn(4, weight.numel(), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        out = norm(x)
    return eps if out.shape == ref.shape and torch.allclose(out, ref, rtol=1e-5, atol=1e-6) \
        else None


def _packed_gate_up(layer: nn.Module, a) -> nn.Module:
    """[gate | up] as one Linear where the layer's MLP is down(act(gate(x)) · up(x)) of plain
    Linears (checked on a random input), else Identity: one MatMul instead of two, whose
    columns are the two's bit for bit (MLAS and MatMulNBits reduce each column alike)."""
    mlp = get_path(layer, a.mlp[0]) if len(a.mlp) == 1 else None
    parts = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(p) is nn.Linear for p in parts) or not callable(getattr(mlp, "act_fn", None)) \
            or parts[0].bias is not None or parts[1].bias is not None \
            or parts[0].weight.shape != parts[1].weight.shape:
        return nn.Identity()
    gate, up, down = parts
    x = torch.randn(2, gate.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if not torch.allclose(mlp(x), down(mlp.act_fn(gate(x)) * up(x)), rtol=1e-5, atol=1e-6):
            return nn.Identity()
        weight = torch.cat((gate.weight, up.weight))                # (2I, E)
        packed = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
        packed.weight.copy_(weight)
    return packed.eval()
