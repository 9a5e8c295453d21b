"""Attention over past + new tokens, as every adapter describes it.

Projections (separate or fused in either layout), optional q/k norms, RoPE,
grouped-query attention against the sequence-major past (B, P, Hkv, D), score
soft-capping, ALiBi bias and the causal / sliding-window mask (a draft tree's: past_tree_mask,
tree_mask). Rows of a batch may have different past lengths (key_positions: each row's own is
position_ids[b, 0]). The static flavour and the ort target's rows graph instead write the new
rows into the whole head-major cache (B, Hkv, R, D) at their positions and attend over its
first L rows (cache_positions, scatter_rows; L = the call's longest past + new_len or more,
the whole cache in a static graph of schema 9 or older).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .activations import softmax_with_sinks
from .adapters import Adapter
from .latent import latent_output, latent_qkv
from .positions import Rope

_NEG = -1e30  # additive mask; finite so that softmax never sees -inf - -inf

CacheIndex = tuple[torch.Tensor, torch.Tensor, torch.Tensor]   # cache_index: batch, head, row


@dataclass(frozen=True)
class Heads:
    num_heads: int      # H query heads
    num_kv_heads: int   # Hkv key/value heads; G = H // Hkv queries share one
    head_dim: int       # D

    @property
    def groups(self) -> int:
        return self.num_heads // self.num_kv_heads


def key_positions(position_ids: torch.Tensor, past_len) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row key positions and validity, both (B, S) with S = P + T: the ragged batch contract.

    Row b's own past length is p_b = position_ids[b, 0] <= P (the runtime may bind a slot's
    whole cache, P = max_context); past rows at or beyond p_b are stale (a rejected draft, an
    earlier sequence, zeros) and never visible. The new keys sit at the row's own positions.

        key index   0 ...... p_b-1 | p_b ...... P-1 | P .................. P+T-1
        position    0 ...... p_b-1 | (stale)        | position_ids[b, 0 .. T-1]
        valid       yes            | no             | yes

    For one row with P == p_b this is arange(P + T), every key valid.
    """
    B = position_ids.shape[0]
    past = torch.arange(past_len, device=position_ids.device)[None, :].expand(B, -1)  # (B, P)
    key_pos = torch.cat((past, position_ids), dim=1)                # (B, S)
    valid = torch.cat((past < position_ids[:, :1],                  # (B, P): j < p_b
                       torch.ones_like(position_ids, dtype=torch.bool)), dim=1)
    return key_pos, valid


def cache_positions(position_ids: torch.Tensor, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """The static flavour's key positions and validity, both (B, R): key j is the cache's row
    j, which holds the token at position j once the call's new rows are written there, so
    every row is a key and causality alone hides what lies beyond a query (stale rows, other
    rows' padding, zeros).

        key index   0 ..... p_b-1 | p_b ..... p_b+T-1 | p_b+T ..... R-1
        holds       the past      | this call's rows   | (stale: after every query)
    """
    B = position_ids.shape[0]
    key_pos = torch.arange(rows, device=position_ids.device)[None, :].expand(B, -1)
    return key_pos, torch.ones_like(key_pos, dtype=torch.bool)


def cache_index(position_ids: torch.Tensor, num_kv_heads: int) -> CacheIndex:
    """Where the static flavour writes a call's new keys and values: the cache (B, Hkv, R, D)
    index (batch, head, row = position) of each new row, three tensors (B, T, Hkv) int64, laid
    out as the new rows are (B, T, Hkv, D), so that one ScatterND writes them as they come,
    with no transpose. Built once per call and shared by every layer (docs/design.md §12)."""
    B, T = position_ids.shape
    shape = (B, T, num_kv_heads)
    b = torch.arange(B, device=position_ids.device)[:, None, None].expand(shape)
    h = torch.arange(num_kv_heads, device=position_ids.device)[None, None, :].expand(shape)
    return b, h, position_ids[:, :, None].expand(shape)


def scatter_rows(cache: torch.Tensor, new: torch.Tensor, index: CacheIndex) -> torch.Tensor:
    """cache (B, Hkv, R, D) with new (B, T, Hkv, D) written at `index` (cache_index): one
    ScatterND, whose output the runtime binds over the cache itself (in place)."""
    return cache.index_put(index, new)


def causal_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, key_valid: torch.Tensor,
                window: int | None) -> torch.Tensor:
    """Additive mask (B, 1, 1, T, S) from query positions (B, T) and key positions and
    validity (B, S): key visible iff valid and key <= query (and within the window).

    Finite (_NEG), so that a masked score still rounds to exactly 0 after softmax; stale rows
    may hold any values whose scores q·k are finite (the runtime zero-fills its arenas, and
    what it writes there are this model's own keys and values).
    """
    q = query_pos[:, :, None]                                       # (B, T, 1)
    k = key_pos[:, None, :]                                         # (B, 1, S)
    visible = key_valid[:, None, :] & (k <= q)                      # (B, T, S)
    if window is not None:
        visible = visible & (q - k < window)
    zero = torch.zeros((), dtype=torch.float32)
    neg = torch.full((), _NEG, dtype=torch.float32)
    return torch.where(visible, zero, neg)[:, None, None, :, :]


def tree_mask(position_ids: torch.Tensor, key_pos: torch.Tensor, tree: torch.Tensor,
              window: int | None) -> torch.Tensor:
    """The static flavour's additive mask (B, 1, 1, T, R) for a call over a draft tree
    (docs/design.md §2, "Trees"): new token i sits at cache row p_b + i (p_b = position_ids[b,
    0], the root's position) and at position position_ids[b, i]; it sees the committed rows
    j < p_b by position (j <= its position, within the window) and the new rows p_b + j where
    tree[b, i, j] (its ancestors and itself), nothing past them. With tree the lower triangle
    (a chain) this is causal_mask's, value for value.

        key row     0 ........ p_b-1 | p_b ........ p_b+T-1 | p_b+T ..... R-1
        visible     by position      | tree[b, i, row-p_b]   | never
    """
    B, T = position_ids.shape
    first = position_ids[:, :1]                                     # (B, 1)
    rel = key_pos - first                                           # (B, R): row - p_b
    past = rel < 0
    new = (rel >= 0) & (rel < T)
    index = rel.clamp(0, T - 1)[:, None, :].expand(B, T, key_pos.shape[1])    # (B, T, R)
    in_tree = torch.gather(tree, 2, index)                          # (B, T, R)
    q = position_ids[:, :, None]                                    # (B, T, 1)
    k = key_pos[:, None, :]                                         # (B, 1, R)
    visible = (past[:, None, :] & (k <= q)) | (new[:, None, :] & in_tree)
    if window is not None:       # by position: a new key's is its node's (p_b + its depth)
        node_pos = torch.gather(position_ids, 1, rel.clamp(0, T - 1))           # (B, R)
        k = torch.where(new, node_pos, key_pos)[:, None, :]
        visible = visible & (q - k < window)
    zero = torch.zeros((), dtype=torch.float32)
    neg = torch.full((), _NEG, dtype=torch.float32)
    return torch.where(visible, zero, neg)[:, None, None, :, :]


def past_tree_mask(position_ids: torch.Tensor, key_pos: torch.Tensor, key_valid: torch.Tensor,
                   tree: torch.Tensor, window: int | None) -> torch.Tensor:
    """The standard flavour's additive mask (B, 1, 1, T, P + T) for a call over a draft tree
    (docs/design.md §2, "Trees"): the keys are the past (P rows, valid as key_positions says)
    then the call's T new ones, new key j being node j at position position_ids[b, j] (p_b + its
    depth). Node i sees a valid past key by position (within the window) and new key j where
    tree[b, i, j] (its ancestors and itself). With tree the lower triangle (a chain) this is
    causal_mask's, value for value: a new key j <= i is at a position <= i's, j > i after it.

        key index   0 ...... P-1                  | P ............. P+T-1
        visible     valid, by position (≤, window) | tree[b, i, j]
    """
    T = position_ids.shape[1]
    q = position_ids[:, :, None]                                    # (B, T, 1)
    k = key_pos[:, None, :]                                         # (B, 1, P+T)
    by_position = key_valid[:, None, :] & (k <= q)                  # (B, T, P+T)
    past = by_position[:, :, :key_pos.shape[1] - T]                 # (B, T, P)
    visible = torch.cat((past, tree), dim=2)                        # (B, T, P+T)
    if window is not None:       # by position: a new key's is its node's (p_b + its depth)
        visible = visible & (q - k < window)
    zero = torch.zeros((), dtype=torch.float32)
    neg = torch.full((), _NEG, dtype=torch.float32)
    return torch.where(visible, zero, neg)[:, None, None, :, :]


def attention(attn: nn.Module, a: Adapter, heads: Heads, scaling: float, h: torch.Tensor,
              rope: Rope | None, cos_sin: tuple[torch.Tensor, ...] | None,
              past_k: torch.Tensor, past_v: torch.Tensor, bias: torch.Tensor | None,
              ort: OrtAttention | None = None, q_scale: torch.Tensor | None = None,
              scatter_at: CacheIndex | None = None, live_rows=None,
              packed: nn.Module | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h (B, T, E) -> (output (B, T, E), new keys, new values (B, T, Hkv, D)).

    `bias` is the mask (plus ALiBi) broadcastable to the scores (B, Hkv, G, T, S); `q_scale`
    (B, T, 1, 1) a per-position factor on the rotated queries. `scatter_at` (the static
    flavour: cache_index of the call): the past is the whole head-major cache (B, Hkv, R, D),
    the new rows are written into it there, attention reads all R rows, and the updated caches
    are returned in place of the new rows. `live_rows` (the static flavour and the ort target's
    rows graph): attention reads only the cache's first live_rows rows (every row's last
    position + 1 or more), so its cost follows the live context, not R; the rows beyond a
    query are masked, add exact zeros, and change no bit of its output. `packed`: q, k and v
    come from one projection [q | k | v] (the ort flavour's, shared on disk, §2; the static
    flavour's own where nothing sits between projection and RoPE), and where `cos_sin` then
    covers all H + 2·Hkv heads (decoder.qkv_tables) one rotation serves q, k and v together.

        h ─ proj ─┬─ q ─ q_norm ─ rope ─ [q_scale] ─┐
                  ├─ k ─ k_norm ─ rope ─ cat(past) ─ softmax(q·kᵀ·s [capped] + bias) · v ─ o
                  └─ v ──────────────── cat(past) ─┘

    (OLMoE clamps q, k and v to ±qkv_clip after the norms; HunYuan norms q and k after RoPE;
    GPT-OSS's sinks join the softmax as one more score per head.)
    """
    B, T, _ = h.shape
    H, Hkv, G, D = heads.num_heads, heads.num_kv_heads, heads.groups, heads.head_dim
    if ort is not None and ort.packed is not None:
        # one projection into [q | k | v], which the kernel reads packed (and rotates itself)
        return _ort_attention(attn, a, heads, scaling, h, ort.packed(h), None, None, past_k,
                              past_v, ort)
    if a.latent is not None:                                        # DeepSeek's MLA
        q, k, v = latent_qkv(attn, a.latent, rope, cos_sin, h)
        rope = None                                                 # (rotated already)
    elif packed is not None:                                        # [q | k | v] as one
        qkv = packed(h).view(B, T, H + 2 * Hkv, D)
        if rope is not None and cos_sin is not None and cos_sin[0].shape[2] == H + 2 * Hkv:
            qkv = rope.apply(qkv, *cos_sin)                         # every head at once
            rope = None                                             # (v: cos 1, sin 0)
        q, k, v = qkv.split((H, Hkv, Hkv), dim=2)                   # (B, T, H|Hkv, D)
    else:
        q, k, v = _project(attn, a, heads, h)                       # (B, T, H|Hkv, D)
    if a.q_norm is not None and not a.qk_norm_after_rope:
        q, k = _qk_norm(attn, a, q, k)
    if a.qkv_clip is not None:                                      # OLMoE's clip_qkv
        q, k, v = (t.clamp(-a.qkv_clip, a.qkv_clip) for t in (q, k, v))
    if rope is not None and cos_sin is not None:
        q = rope.apply(q, *cos_sin)
        k = rope.apply(k, *cos_sin)
    if a.q_norm is not None and a.qk_norm_after_rope:
        q, k = _qk_norm(attn, a, q, k)
    if q_scale is not None:
        q = q * q_scale
    if ort is not None:                                             # the `ort` flavour
        return _ort_attention(attn, a, heads, scaling, h, q, k, v, past_k, past_v, ort)
    sinks = None if a.attn_sinks is None else getattr(attn, a.attn_sinks).float()
    if scatter_at is not None:                                      # the static flavour
        keys = scatter_rows(past_k, k, scatter_at)                  # (B, Hkv, R, D)
        values = scatter_rows(past_v, v, scatter_at)
        out = _attend_cache(a, heads, scaling, q, keys, values, live_rows, bias, sinks)
        return output_projection(attn, a, out.to(h.dtype)), keys, values
    keys = torch.cat((past_k, k), dim=1)                            # (B, S, Hkv, D)
    values = torch.cat((past_v, v), dim=1)
    kt = keys.permute(0, 2, 3, 1)[:, :, None]                       # (B, Hkv, 1, D, S)
    vs = values.permute(0, 2, 1, 3)[:, :, None]                     # (B, Hkv, 1, S, D)
    qg = q.reshape(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4)          # (B, Hkv, G, T, D)
    if a.scores_fp32:                                               # before the product
        qg, kt = qg.float(), kt.float()
    scores = row_exact_matmul(qg, kt).float() * scaling             # (B, Hkv, G, T, S)
    if a.attn_softcap is not None:
        scores = torch.tanh(scores / a.attn_softcap) * a.attn_softcap
    sinks = None if sinks is None else sinks.view(1, Hkv, G, 1, 1)
    probs = softmax_with_sinks(scores + bias, sinks).to(h.dtype)
    out = row_exact_matmul(probs, vs)                               # (B, Hkv, G, T, D)
    out = out.permute(0, 3, 1, 2, 4).reshape(B, T, Hkv * G * D)
    return output_projection(attn, a, out), k, v


def _attend_cache(a: Adapter, heads: Heads, scaling: float, q: torch.Tensor,
                  keys: torch.Tensor, values: torch.Tensor, live_rows, bias: torch.Tensor,
                  sinks: torch.Tensor | None) -> torch.Tensor:
    """The static flavour's attention of q (B, T, H, D) over the caches' first L rows (all R
    without live_rows) -> (B, T, H·D). Each (query token, KV head) is a batch entry of the
    products, its G query heads their rows: a product runs on G rows whatever T is, so its
    kernel never takes the one-row path that rounds differently (G >= 2; at G = 1 a zero row
    is added, row_exact_matmul) and a row's bits do not depend on the rows beside it; q and
    the output keep the projections' layout, with no transpose (docs/design.md §12). bias
    (B|1, Hkv|1, G|1, T, S) as for the standard flavour.

        q (B,T,Hkv,G,D) ──────────────────────────────────┐
        keys[:, :, :L] (B,Hkv,L,D) ─ (B,1,Hkv,L,D) ─ ᵀ ───┴─ @ ─ ·s + bias ─ softmax ─┐
        values[:, :, :L] ─────────── (B,1,Hkv,L,D) ───────────────────────────────────┴─ @
                                                             (B,T,Hkv,G,D) ─ (B,T,H·D)
    """
    B, T = q.shape[:2]
    Hkv, G, D = heads.num_kv_heads, heads.groups, heads.head_dim
    if live_rows is not None:
        keys, values = keys[:, :, :live_rows], values[:, :, :live_rows]   # (B, Hkv, L, D)
    qg = q.reshape(B, T, Hkv, G, D)
    kt = keys[:, None].transpose(3, 4)                              # (B, 1, Hkv, D, L)
    if a.scores_fp32:                                               # before the product
        qg, kt = qg.float(), kt.float()
    matmul = torch.matmul if G > 1 else row_exact_matmul
    scores = matmul(qg, kt).float() * scaling                       # (B, T, Hkv, G, L)
    if a.attn_softcap is not None:
        scores = torch.tanh(scores / a.attn_softcap) * a.attn_softcap
    sinks = None if sinks is None else sinks.view(1, 1, Hkv, G, 1)
    bias = bias.permute(0, 3, 1, 2, 4)                              # (B, T|1, Hkv|1, G|1, S)
    probs = softmax_with_sinks(scores + bias, sinks).to(q.dtype)
    out = matmul(probs, values[:, None])                            # (B, T, Hkv, G, D)
    return out.reshape(B, T, Hkv * G * D)


def row_exact_matmul(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y whose row t has the same bits whatever the number of rows T beside it: ONNX
    Runtime's CPU MatMul of two activations takes another kernel for one row (T = 1: a
    decode step) than for two or more, which rounds differently (~1e-6), and a quantized
    target's int8 activations turn that into ~0.04 in the logits (docs/design.md §12, issue
    44). A zero row appended and dropped keeps every call on the kernel of two or more rows;
    the extra row costs nothing measurable while the step reads its weights.

        x (..., T, K) ─ cat(zero row) ─ (..., T+1, K) ─ @ y ─ [..., :T, :] ─ (..., T, N)
    """
    padded = torch.cat((x, torch.zeros_like(x[..., :1, :])), dim=-2)   # (..., T+1, K)
    return torch.matmul(padded, y)[..., :-1, :]


@dataclass(frozen=True)
class OrtAttention:
    """What the `ort` flavour's GroupQueryAttention node needs besides q, k, v and the caches."""
    seqlens_k: torch.Tensor          # (B,) int32: total length - 1
    total_len: torch.Tensor          # () int32: the longest total length in the batch
    position_ids: torch.Tensor       # (B, T)
    cos_cache: torch.Tensor          # (max_context, D/2) when the kernel rotates, else (1, 1)
    sin_cache: torch.Tensor
    do_rotary: bool
    window: int                      # 0: none
    packed: nn.Module | None = None  # q, k and v as one projection [q | k | v], where nothing
                                     # (norm, RoPE outside the kernel) sits between them and it


def _ort_attention(attn, a: Adapter, heads: Heads, scaling: float, h, q, k, v, cache_k, cache_v,
                   o: OrtAttention):
    """q, k, v (B, T, n, D) -> one GroupQueryAttention that updates the caches in place."""
    from .ort_ops import gqa

    B, T, _ = h.shape
    out, cache_k, cache_v = gqa(
        *(x if x is None or x.dim() == 3 else x.reshape(B, T, -1) for x in (q, k, v)),
        cache_k, cache_v,
        o.seqlens_k, o.total_len, o.cos_cache, o.sin_cache, o.position_ids,
        None if a.attn_sinks is None else getattr(attn, a.attn_sinks),
        heads.num_heads, heads.num_kv_heads, scaling, float(a.attn_softcap or 0.0), o.window,
        int(o.do_rotary))
    return output_projection(attn, a, out), cache_k, cache_v


def output_projection(attn: nn.Module, a: Adapter, out: torch.Tensor) -> torch.Tensor:
    """The heads' outputs (B, T, H·D) through the output projection."""
    return latent_output(attn, a.latent, out) if a.latent is not None else getattr(attn, a.o)(out)


def _qk_norm(attn: nn.Module, a: Adapter, q: torch.Tensor, k: torch.Tensor):
    """The q and k norms over what each reads: one head (B, T, n, D), the heads-first layout
    (B, n, T, D), or the whole projection (B, T, n·D); q, k come back as (B, T, n, D)."""
    q_norm, k_norm = getattr(attn, a.q_norm), getattr(attn, a.k_norm)
    if a.qk_norm_over == "heads_first":
        return q_norm(q.transpose(1, 2)).transpose(1, 2), k_norm(k.transpose(1, 2)).transpose(1, 2)
    if a.qk_norm_over == "projection":
        return q_norm(q.flatten(2)).view_as(q), k_norm(k.flatten(2)).view_as(k)
    return q_norm(q), k_norm(k)


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
    if a.qkv_layout == "blocks_qvk":                                # [q_b | v_b | k_b] per block b
        blocks = fused.view(B, T, a.qkv_blocks, 3, -1)              # (B, T, blocks, 3, H·D/blocks)
        q, v, k = (blocks[:, :, :, j].reshape(B, T, -1, D) for j in range(3))
        return q, k, v
    grouped = fused.view(B, T, Hkv, G + 2, D)                       # per KV head: G queries, k, v
    q = grouped[:, :, :, :G].reshape(B, T, H, D)
    return q, grouped[:, :, :, G], grouped[:, :, :, G + 1]
