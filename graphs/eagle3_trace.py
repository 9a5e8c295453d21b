"""Trace an EAGLE-3 head (eagle3.py) to ONNX with the head's graph contract (contract.py).

    inputs   input_ids, position_ids (B,T) · features (B,T,3·Ht) · hidden (B,T,H) · one cache
    outputs  logits (B,T,V) · the cache's new rows (standard) or whole cache (static) · hidden_out

Standard: the past (B,P,Hkv,D) in, the new rows out; static: the whole head-major cache
(B,Hkv,rows,D) bound as both, new rows scattered in at their positions. docs/design.md §14.
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import torch
from ssd_runtime import contract
from torch import nn

from .attention import cache_index, cache_positions, causal_mask, key_positions
from .eagle3 import Eagle3Head
from .trace import OPSET, TracedModel, rewrite_rsqrt_as_div


class HeadGraph(nn.Module):
    """One drafting step of the head over T rows, each fed by the target's features or by the
    head's own previous output (the caller zeroes the other):

        features ─ fc ─┐
                       + ─ x ─ mid layer (with embed(input_ids)) ─┬─ norm ─ lm_head ─ d2t ─ logits
        hidden ────────┘                                          └─ hidden_out
    """

    def __init__(self, head: Eagle3Head, graph: str) -> None:
        super().__init__()
        if graph not in (contract.STANDARD, contract.STATIC):
            raise ValueError(f"an EAGLE-3 head's graph is standard or static, not {graph}")
        self.head, self.static = head, graph == contract.STATIC

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                features: torch.Tensor, hidden: torch.Tensor, past_k: torch.Tensor,
                past_v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        head = self.head
        x = head.fuse(features) + hidden                            # (B, T, H)
        if self.static:     # key j is the cache's row j = position j; causality hides the rest
            key_pos, key_valid = cache_positions(position_ids, past_k.shape[2])   # (B, R)
        else:               # each row's past length is position_ids[b, 0]
            key_pos, key_valid = key_positions(position_ids, past_k.shape[1])     # (B, P+T)
        bias = causal_mask(position_ids, key_pos, key_valid, None)                # (B,1,1,T,S)
        out, k, v = head.step(input_ids, x, position_ids, past_k, past_v, bias,
                              scatter_at=cache_index(position_ids, head.heads.num_kv_heads)
                              if self.static else None)
        logits = head.target_logits(head.draft_logits(out))         # (B, T, V)
        return logits, k, v, out


def export_head(head: Eagle3Head, path: Path, max_context: int, graph: str) -> TracedModel:
    """Write `path` (model.onnx plus external data) for the head in that flavour, float32."""
    wrapper = HeadGraph(head.float().eval(), graph).eval()
    c = head.config
    Hkv, D = head.heads.num_kv_heads, head.heads.head_dim
    trace_head_graph(wrapper, path, max_context, graph, c.feature_width, c.hidden_size, Hkv, D)
    return TracedModel(path=path, num_layers=1, num_kv_heads=Hkv, head_dim=D,
                       vocab_size=c.vocab_size, kv_dtype="float32",
                       parameters=sum(p.numel() for p in head.parameters()), graph=graph,
                       aux_layer_ids=tuple(c.aux_layer_ids))


def trace_head_graph(wrapper: nn.Module, path: Path, max_context: int, graph: str,
                     feature_width: int, hidden_width: int, num_kv_heads: int,
                     head_dim: int) -> None:
    """torch.onnx.export of a head's graph wrapper (EAGLE-3's HeadGraph, mtp_trace.MtpGraph)
    with the head contract's names and every axis symbolic; float32."""
    Hkv, D = num_kv_heads, head_dim
    batch, new_len, past_len = 2, 3, 5          # not 0 or 1: every axis stays symbolic
    ids = torch.zeros((batch, new_len), dtype=torch.int64)
    pos = torch.arange(past_len, past_len + new_len).repeat(batch, 1)
    features = torch.zeros((batch, new_len, feature_width))
    hidden = torch.zeros((batch, new_len, hidden_width))
    B = torch.export.Dim("batch", min=1, max=64)
    T = torch.export.Dim("new_len", min=1, max=max_context)
    if contract.in_place(graph):
        kv_shape = (batch, Hkv, past_len + new_len + 2, D)
        kv_dims = {0: B, 2: torch.export.Dim("cache_rows", min=2, max=max_context)}
    else:
        kv_shape = (batch, past_len, Hkv, D)
        kv_dims = {0: B, 1: torch.export.Dim("past_len", min=0, max=max_context)}
    past = (torch.zeros(kv_shape), torch.zeros(kv_shape))
    shapes = ({0: B, 1: T}, {0: B, 1: T}, {0: B, 1: T}, {0: B, 1: T}, kv_dims, kv_dims)
    path.parent.mkdir(parents=True, exist_ok=True)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            wrapper, (ids, pos, features, hidden, *past), dynamo=True, opset_version=OPSET,
            input_names=contract.head_input_names(), output_names=contract.head_output_names(graph),
            dynamic_shapes=shapes, verbose=False)
        program.save(str(path), external_data=True)
    rewrite_rsqrt_as_div(path)
