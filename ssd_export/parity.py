"""Parity: the exported graph, run by ONNX Runtime, against the Hugging Face model.

Cases cover new_len ∈ {1, K+1, prompt} and past_len ∈ {0, prompt}; the past
fed to ONNX Runtime is the graph's own output for the earlier tokens, so the
whole chain prefill → decode is what gets checked.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ssd_runtime import contract
from ssd_runtime.errors import ParityError

PROMPT_LEN = 12
_TOLERANCE = {"float32": (1e-3, 1e-3), "float16": (5e-2, 2e-2)}   # (absolute, relative to max|ref|)


def check_parity(model: Any, onnx_path: Path, role: str, max_draft: int, dtype: str,
                 max_context: int, seed: int = 0) -> dict[str, float]:
    """Return the max abs differences per output; raise ParityError past tolerance."""
    import onnxruntime as ort
    import torch

    prompt = min(PROMPT_LEN, max(1, max_context // 2))
    cases = [(0, 1), (0, max_draft + 1), (0, prompt), (prompt, 1), (prompt, max_draft + 1),
             (prompt, prompt)]
    cases = sorted({(p, n) for p, n in cases if p + n <= max_context})
    total = max(p + n for p, n in cases)
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size
    ids = rng.integers(0, vocab, size=(1, total), dtype=np.int64)
    with torch.no_grad():
        out = model(torch.from_numpy(ids), use_cache=True)
    ref_logits = out.logits.float().numpy()                                  # (1, S, V)
    ref_kv = _hf_cache(out["cache"] if "cache" in out else out.get("past_key_values"), total)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    n_layers = len([i for i in session.get_inputs() if i.name.startswith("past_key.")])
    worst: dict[str, float] = {"logits": 0.0, "new_key": 0.0, "new_value": 0.0}
    abs_tol, rel_tol = _TOLERANCE[dtype]
    for past_len, new_len in cases:
        past = _run(session, ids[:, :past_len], 0, None, n_layers, model, dtype)[1] \
            if past_len else None
        logits, kv = _run(session, ids[:, past_len:past_len + new_len], past_len, past, n_layers,
                          model, dtype)
        ref = ref_logits[:, past_len:past_len + new_len]
        diffs = {"logits": float(np.abs(logits - ref).max())}
        if ref_kv is not None:
            sl = slice(past_len, past_len + new_len)
            diffs["new_key"] = max(float(np.abs(kv[2 * i] - ref_kv[i][0][:, sl]).max())
                                   for i in range(n_layers))
            diffs["new_value"] = max(float(np.abs(kv[2 * i + 1] - ref_kv[i][1][:, sl]).max())
                                     for i in range(n_layers))
        limit = abs_tol + rel_tol * float(np.abs(ref).max())
        if diffs["logits"] > limit or max(diffs.values()) > max(limit, 10 * abs_tol):
            shown = ", ".join(f"{k} {v:.3g}" for k, v in diffs.items())
            raise ParityError(f"{role} graph {onnx_path} differs from the Hugging Face model at "
                              f"past_len={past_len}, new_len={new_len}: max |diff| {shown} "
                              f"(limit {limit:.3g}). ---> HINT: this architecture variant is not "
                              f"reproduced; please report it with the model's config.json.")
        for k, v in diffs.items():
            worst[k] = max(worst[k], v)
    return worst


def _run(session, ids: np.ndarray, past_len: int, past: list[np.ndarray] | None, n_layers: int,
         model: Any, dtype: str) -> tuple[np.ndarray, list[np.ndarray]]:
    cfg = model.config
    kv_dtype = np.float16 if dtype == "float16" else np.float32
    feeds = {contract.INPUT_IDS: ids,
             contract.POSITION_IDS: np.arange(past_len, past_len + ids.shape[1])[None]}
    for i in range(n_layers):
        if past is None:
            head_dim = session.get_inputs()[2 + 2 * i].shape[3]
            empty = np.zeros((1, 0, cfg.num_key_value_heads, head_dim), kv_dtype)
            feeds[contract.past_key(i)] = feeds[contract.past_value(i)] = empty
        else:
            feeds[contract.past_key(i)], feeds[contract.past_value(i)] = past[2 * i], past[2 * i + 1]
    outputs = session.run(None, feeds)
    return outputs[0].astype(np.float32), outputs[1:]


def _hf_cache(cache: Any, total: int) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """Per layer (keys, values) as (1, S, Hkv, D), or None if the cache is cropped."""
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    result = []
    for layer in layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or keys.shape[2] != total:
            return None
        result.append((keys.transpose(1, 2).float().numpy(), values.transpose(1, 2).float().numpy()))
    return result
