"""ONNX Runtime's GroupQueryAttention (and MoE) as traceable ops, for the `ort` graph flavour.

`gqa(...)` is a PyTorch custom op with a reference implementation in plain torch (so the
wrapper still runs eagerly) that the ONNX exporter writes as one
`com.microsoft::GroupQueryAttention` node. In that flavour each layer's cache is one
head-major buffer `(B, Hkv, max_context, D)` that the op reads and writes in place
(`past_key` and `present_key` bound to the same memory): the kernel writes the new rows at
the past length it reads from `seqlens_k`, and no past key or value is copied per step.
`moe_kernel(...)` is likewise one `com.microsoft::MoE` node: the experts run as routed.
"""
from __future__ import annotations

import torch

from .activations import clamped_swiglu, softmax_with_sinks

_NEG = -1e30


@torch.library.custom_op("ssd::gqa", mutates_args=())
def gqa(query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
        past_key: torch.Tensor,
        past_value: torch.Tensor, seqlens_k: torch.Tensor, total_len: torch.Tensor,
        cos_cache: torch.Tensor, sin_cache: torch.Tensor, position_ids: torch.Tensor,
        head_sink: torch.Tensor | None, num_heads: int, kv_heads: int, scale: float,
        softcap: float, window: int, do_rotary: int
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """query (B,T,H·D), key/value (B,T,Hkv·D), caches (B,Hkv,M,D) -> out (B,T,H·D), caches.

    Without key and value, query is packed: (B, T, (H + 2·Hkv)·D) as [q | k | v]. head_sink
    (H,): one more logit per head in each softmax's denominator.
    """
    Hkv, _, D = past_key.shape[1:]
    if key is None or value is None:
        query, key, value = query.split((num_heads * D, kv_heads * D, kv_heads * D), dim=-1)
    B, T, _ = query.shape
    G = num_heads // kv_heads
    q = query.view(B, T, num_heads, D)
    k = key.view(B, T, Hkv, D)
    if do_rotary:
        cos, sin = cos_cache[position_ids][:, :, None], sin_cache[position_ids][:, :, None]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    keys, values = past_key.clone(), past_value.clone()
    out = query.new_empty((B, T, num_heads * D))
    for b in range(B):
        total = int(seqlens_k[b]) + 1
        start = total - T
        keys[b, :, start:total] = k[b].transpose(0, 1)
        values[b, :, start:total] = value[b].view(T, Hkv, D).transpose(0, 1)
        qb = q[b].view(T, Hkv, G, D).permute(1, 2, 0, 3)                 # (Hkv, G, T, D)
        scores = qb.float() @ keys[b, :, None, :total].float().transpose(-1, -2) * scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        qpos = torch.arange(start, total)[:, None]
        kpos = torch.arange(total)[None, :]
        visible = kpos <= qpos
        if window > 0:
            visible = visible & (qpos - kpos < window)
        scores = scores.masked_fill(~visible, _NEG)
        sinks = None if head_sink is None else head_sink.float().view(Hkv, G, 1, 1)
        probs = softmax_with_sinks(scores, sinks).to(query.dtype)
        o = probs @ values[b, :, None, :total]                            # (Hkv, G, T, D)
        out[b] = o.permute(2, 0, 1, 3).reshape(T, num_heads * D)
    return out, keys, values


@gqa.register_fake
def _(query, key, value, past_key, past_value, seqlens_k, total_len, cos_cache, sin_cache,
      position_ids, head_sink, num_heads, kv_heads, scale, softcap, window, do_rotary):
    B, T, _ = query.shape
    out = query.new_empty((B, T, num_heads * past_key.shape[-1]))
    return out, torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("ssd::moe", mutates_args=())
def moe_kernel(x: torch.Tensor, router_logits: torch.Tensor, fc1: torch.Tensor,
               fc1_bias: torch.Tensor | None, fc2: torch.Tensor, fc2_bias: torch.Tensor | None,
               k: int, normalize: int, alpha: float, beta: float, limit: float) -> torch.Tensor:
    """x (N, H), router_logits (N, E), fc1 (E, 2I, H) gate/up rows interleaved, fc2 (E, H, I),
    optional biases -> (N, H): softmax, top-k [renormalised], Σ w · (fc2 · swiglu + b2) with
    swiglu = g·σ(alpha·g)·(u + beta), g and u clamped by `limit` when it is not 0."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    top, index = torch.topk(probs, k, dim=-1)                             # (N, k)
    if normalize:
        top = top / top.sum(dim=-1, keepdim=True)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for j in range(k):
        w1, w2 = fc1[index[:, j]], fc2[index[:, j]]                       # (N, 2I, H), (N, H, I)
        gate_up = torch.einsum("nih,nh->ni", w1.float(), x.float())
        if fc1_bias is not None:
            gate_up = gate_up + fc1_bias[index[:, j]].float()
        inner = clamped_swiglu(gate_up[:, 0::2], gate_up[:, 1::2], alpha, beta, limit)
        y = torch.einsum("nhi,ni->nh", w2.float(), inner)
        if fc2_bias is not None:
            y = y + fc2_bias[index[:, j]].float()
        out += top[:, j, None] * y
    return out.to(x.dtype)


@moe_kernel.register_fake
def _(x, router_logits, fc1, fc1_bias, fc2, fc2_bias, k, normalize, alpha, beta, limit):
    return torch.empty_like(x)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = cos.shape[-1]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


_DOMAIN = "com.microsoft"
_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length",
           "cos_cache", "sin_cache", "position_ids", "attention_bias", "head_sink")
_ATTRIBUTES = {"num_heads": "INT", "kv_num_heads": "INT", "scale": "FLOAT", "softcap": "FLOAT",
               "local_window_size": "INT", "do_rotary": "INT"}


def _register_schema() -> None:
    """Tell ONNX the signatures of the contrib ops (it ships no schemas for com.microsoft).

    The ONNX script evaluator the exporter builds graphs with looks every op up in ONNX's
    registry; this declares the parts of ONNX Runtime's GroupQueryAttention and MoE
    signatures used here.
    """
    import onnx
    from onnx.defs import OpSchema

    _register_moe_schema(onnx, OpSchema)
    try:
        onnx.defs.get_schema("GroupQueryAttention", 1, _DOMAIN)
        return
    except onnx.defs.SchemaError:
        pass
    optional, single = OpSchema.FormalParameterOption.Optional, OpSchema.FormalParameterOption.Single
    kinds = {"query": "T", "key": "T", "value": "T", "past_key": "T", "past_value": "T",
             "seqlens_k": "M", "total_sequence_length": "M", "cos_cache": "T", "sin_cache": "T",
             "position_ids": "P", "attention_bias": "T", "head_sink": "T"}
    required = {"query", "seqlens_k", "total_sequence_length"}
    schema = OpSchema(
        "GroupQueryAttention", _DOMAIN, 1,
        inputs=[OpSchema.FormalParameter(n, kinds[n], param_option=single if n in required
                                         else optional) for n in _INPUTS],
        outputs=[OpSchema.FormalParameter(n, "T") for n in ("output", "present_key",
                                                            "present_value")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], ""),
                          ("M", ["tensor(int32)"], ""), ("P", ["tensor(int64)"], "")],
        attributes=[OpSchema.Attribute(n, getattr(OpSchema.AttrType, t), "")
                    for n, t in _ATTRIBUTES.items()],
    )
    onnx.defs.register_schema(schema)


def _register_moe_schema(onnx, OpSchema) -> None:
    try:
        onnx.defs.get_schema("MoE", 1, _DOMAIN)
        return
    except onnx.defs.SchemaError:
        pass
    option = OpSchema.FormalParameterOption
    names = ("input", "router_probs", "fc1_experts_weights", "fc1_experts_bias",
             "fc2_experts_weights", "fc2_experts_bias")
    attributes = {"k": "INT", "activation_type": "STRING", "normalize_routing_weights": "INT",
                  "swiglu_fusion": "INT", "activation_alpha": "FLOAT", "activation_beta": "FLOAT",
                  "swiglu_limit": "FLOAT"}
    onnx.defs.register_schema(OpSchema(
        "MoE", _DOMAIN, 1,
        inputs=[OpSchema.FormalParameter(n, "T", param_option=option.Optional if "bias" in n
                                         else option.Single) for n in names],
        outputs=[OpSchema.FormalParameter("output", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "")],
        attributes=[OpSchema.Attribute(n, getattr(OpSchema.AttrType, t), "")
                    for n, t in attributes.items()],
    ))


def translation_table() -> dict:
    """What the exporter writes for `ssd::gqa` and `ssd::moe`: one contrib node each."""
    from onnxscript.values import Opset

    _register_schema()
    group_query_attention = Opset(_DOMAIN, 1).GroupQueryAttention
    moe = Opset(_DOMAIN, 1).MoE

    def moe_onnx(x, router_logits, fc1, fc1_bias, fc2, fc2_bias, k: int, normalize: int,
                 alpha: float, beta: float, limit: float):
        # SwiGLU g·σ(alpha·g)·(u + beta): with alpha 1 and beta 0 it is silu(gate) * up; the CPU
        # kernel takes gate and up rows interleaved (swiglu_fusion=1) and no separate fc3
        clamp = {"swiglu_limit": limit} if limit else {}
        return moe(x, router_logits, fc1, fc1_bias, fc2, fc2_bias, k=k, activation_type="swiglu",
                   normalize_routing_weights=normalize, swiglu_fusion=1, activation_alpha=alpha,
                   activation_beta=beta, **clamp)

    def gqa_onnx(query, key, value, past_key, past_value, seqlens_k, total_len, cos_cache,
                 sin_cache, position_ids, head_sink, num_heads: int, kv_heads: int,
                 scale: float, softcap: float, window: int, do_rotary: int):
        # Positions are the cache rows here, which is what the kernel assumes without a
        # position_ids input (a later addition to the op); optional attributes only when used,
        # so that older ONNX Runtime releases load the graph too.
        # optional inputs: the cos/sin caches (7, 8) when the kernel rotates, head_sink (11)
        # after empty position_ids and attention_bias
        tail = (cos_cache, sin_cache) if do_rotary else ()
        if head_sink is not None:
            tail = (*(tail or (None, None)), None, None, head_sink)
        optional = {**({"softcap": softcap} if softcap > 0 else {}),
                    **({"local_window_size": window} if window > 0 else {}),
                    **({"do_rotary": 1} if do_rotary else {})}
        return group_query_attention(
            query, key, value, past_key, past_value, seqlens_k, total_len, *tail,
            num_heads=num_heads, kv_num_heads=kv_heads, scale=scale, _outputs=3, **optional)

    return {torch.ops.ssd.gqa.default: gqa_onnx, torch.ops.ssd.moe.default: moe_onnx}
