"""Trace a target's MTP layer (mtp.py) to ONNX with the head contract of docs/design.md §14.

    inputs   input_ids, position_ids (B,T) · features (B,T,H) · hidden (B,T,H) · one cache
    outputs  logits (B,T,V) · the cache's new rows (standard) or whole cache (static) · hidden_out

The layer runs through the one `Decoder` every target runs through (decoder.py), over the
one-layer model MtpHead holds: its attention, MoE and RoPE are the target graphs' own.
"""
from __future__ import annotations

from pathlib import Path

import torch
from ssd_runtime import contract
from torch import nn

from .decoder import Decoder
from .eagle3_trace import trace_head_graph
from .mtp import MtpHead
from .registry import adapter_for
from .trace import TracedModel


class MtpGraph(nn.Module):
    """One drafting step over T rows, each fed by the target's features or by the layer's own
    previous output (the caller zeroes the other; hnorm reads their sum):

        input_ids ─ embed ─ (0 at position 0) ─ enorm ─┐
        features + hidden ─────────────────── hnorm ─┴ cat ─ eh_proj ─ layer ─┬─ norm ─ head ─ logits
                                                                              └─ hidden_out
    """

    def __init__(self, head: MtpHead, graph: str, source: str) -> None:
        super().__init__()
        if graph not in (contract.STANDARD, contract.STATIC):
            raise ValueError(f"an MTP head's graph is standard or static, not {graph}")
        self.head = head
        self.decoder = Decoder(head.model, adapter_for(head.model, source), graph)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                features: torch.Tensor, hidden: torch.Tensor, past_k: torch.Tensor,
                past_v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        embedded = self.decoder.embed_input(input_ids, position_ids)        # (B, T, H)
        x = self.head.first_input(embedded, position_ids, features + hidden)
        out, (k, v), _ = self.decoder.decode(x, position_ids, (past_k, past_v))
        return self.decoder.lm_logits(out), k, v, out


def export_mtp(head: MtpHead, source: str, path: Path, max_context: int,
               graph: str) -> TracedModel:
    """Write `path` (model.onnx plus external data) for the MTP head in that flavour, float32."""
    wrapper = MtpGraph(head.float().eval(), graph, source).eval()
    c, dec = head.config, wrapper.decoder
    trace_head_graph(wrapper, path, max_context, graph, c.target_hidden_size, c.hidden_size,
                     dec.num_kv_heads, dec.head_dim)
    return TracedModel(path=path, num_layers=1, num_kv_heads=dec.num_kv_heads,
                       head_dim=dec.head_dim, vocab_size=c.vocab_size, kv_dtype="float32",
                       parameters=sum(p.numel() for p in head.parameters()), graph=graph,
                       moe=dec.moe_kind, aux_layer_ids=c.aux_layer_ids)
