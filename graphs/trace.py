"""Trace a Hugging Face causal LM to ONNX with the graph contract.

`export_decoder` wraps the model in `Decoder` and calls
`torch.onnx.export(dynamo=True)` with dynamic batch, new_len and past_len.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ssd_runtime import contract

from .adapters import adapter_for, check_rope_context
from .decoder import Decoder

OPSET = 18


@dataclass(frozen=True)
class TracedModel:
    path: Path
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str
    parameters: int


def export_decoder(model: torch.nn.Module, source: str, path: Path, max_context: int) -> TracedModel:
    """Write `path` (model.onnx plus external data) for `model`."""
    decoder = Decoder(model, adapter_for(model, source)).eval()
    check_rope_context(model, source, max_context)
    n_layers = len(decoder.layers)
    dtype = next(model.parameters()).dtype
    # Example sizes avoid 0 and 1 so that torch.export keeps every axis symbolic.
    batch, new_len, past_len = 2, 3, 5
    ids = torch.zeros((batch, new_len), dtype=torch.int64)
    pos = torch.arange(past_len, past_len + new_len).repeat(batch, 1)
    kv_shape = (batch, past_len, decoder.num_kv_heads, decoder.head_dim)
    past = tuple(torch.zeros(kv_shape, dtype=dtype) for _ in range(2 * n_layers))
    B = torch.export.Dim("batch", min=1, max=64)
    T = torch.export.Dim("new_len", min=1, max=max_context)
    P = torch.export.Dim("past_len", min=0, max=max_context)
    shapes = ({0: B, 1: T}, {0: B, 1: T}, tuple({0: B, 1: P} for _ in past))
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            decoder, (ids, pos, *past), dynamo=True, opset_version=OPSET,
            input_names=contract.input_names(n_layers),
            output_names=contract.output_names(n_layers),
            dynamic_shapes=shapes, verbose=False,
        )
        program.save(str(path), external_data=True)
    return TracedModel(
        path=path, num_layers=n_layers, num_kv_heads=decoder.num_kv_heads,
        head_dim=decoder.head_dim, vocab_size=model.config.vocab_size,
        kv_dtype=str(dtype).removeprefix("torch."),
        parameters=sum(p.numel() for p in model.parameters()),
    )
