"""Parity: the exported graph, run by ONNX Runtime, against the Hugging Face model.

Cases cover new_len ∈ {1, K+1, prompt} and past_len ∈ {0, prompt}; the past
fed to ONNX Runtime is the graph's own output for the earlier tokens, so the
whole chain prefill → decode is what gets checked.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ssd_graphs.registry import adapter_for
from ssd_runtime import contract
from ssd_runtime.errors import ConfigError, ParityError

PROMPT_LEN = 12
_TOLERANCE = {"float32": (1e-3, 1e-3), "float16": (5e-2, 2e-2)}   # (absolute, relative to max|ref|)


def ort_errors() -> tuple[type[Exception], ...]:
    """What ONNX Runtime raises for a graph it refuses to load or run (its binding's own
    exceptions: Fail, InvalidGraph, NotImplemented, ...; they share no base but Exception)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(e for e in vars(state).values()
                 if isinstance(e, type) and issubclass(e, Exception))


def check_parity(model: Any, onnx_path: Path, role: str, max_draft: int, dtype: str,
                 max_context: int, seed: int = 0, graph: str = contract.STANDARD,
                 session_config: dict[str, str] | None = None,
                 aux_layers: tuple[int, ...] = ()) -> dict[str, float]:
    """Return the max abs differences per output; raise ParityError past tolerance.

    The "ort" and "static" flavours run as the runtime runs them: caches bound as both past
    and present.
    `session_config`: ONNX Runtime session config entries for the check's session.
    `aux_layers`: the graph's contract.AUX_HIDDEN (an EAGLE-3 head's features) is checked
    against Hugging Face's hidden_states at those layers (docs/design.md §14).
    """
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
    with torch.no_grad(), _reference_attention(model, role):
        out = model(torch.from_numpy(ids), use_cache=True, output_hidden_states=bool(aux_layers))
    ref_logits = out.logits.float().numpy()                                  # (1, S, V)
    ref_aux = None
    if aux_layers:
        from ssd_graphs.eagle3 import aux_hidden

        ref_aux = aux_hidden(out.hidden_states, aux_layers).float().numpy()   # (1, S, 3·Ht)
    if not np.isfinite(ref_logits).all():
        raise ConfigError(f"{role} model gives non-finite logits (inf or NaN) in Hugging Face "
                          f"itself in {dtype}: its activations overflow that dtype, so no graph "
                          f"can reproduce it. ---> HINT: "
                          + ("export with --dtype float32." if dtype != "float32" else
                             "check the checkpoint's weights."))
    ref_kv = _hf_cache(out["cache"] if "cache" in out else out.get("past_key_values"), total)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4      # a failing run raises, and is reported (or, under --graph
    #                                  auto, falls back to standard) without ORT's own log lines
    for key, value in (session_config or {}).items():
        opts.add_session_config_entry(key, value)
    session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    n_layers = _layers(session)
    worst: dict[str, float] = {"logits": 0.0, "new_key": 0.0, "new_value": 0.0,
                               **({contract.AUX_HIDDEN: 0.0} if aux_layers else {})}
    abs_tol, rel_tol = _TOLERANCE[dtype]
    for past_len, new_len in cases:
        if contract.in_place(graph):
            logits, kv, aux = _run_in_place(session, ids, past_len, new_len, n_layers, dtype,
                                            total)
        else:
            past = _run(session, ids[:, :past_len], 0, None, n_layers, dtype)[1] \
                if past_len else None
            logits, kv, aux = _run(session, ids[:, past_len:past_len + new_len], past_len,
                                   past, n_layers, dtype)
        ref = ref_logits[:, past_len:past_len + new_len]
        diffs = {"logits": float(np.abs(logits - ref).max())}
        for name, j in (("new_key", 0), ("new_value", 1)):
            found = [_kv_diff(kv[2 * i + j], ref_kv[i][0], ref_kv[i][1 + j], past_len)
                     for i in range(n_layers)] if ref_kv is not None else []
            found = [d for d in found if d is not None]
            if found:
                diffs[name] = max(found)
        limit = abs_tol + rel_tol * float(np.abs(ref).max())
        if ref_aux is not None:     # the features, held to their own scale
            ref_rows = ref_aux[:, past_len:past_len + new_len]
            aux_diff = np.inf if aux is None else float(np.abs(aux - ref_rows).max())
            aux_limit = abs_tol + rel_tol * float(np.abs(ref_rows).max())
            diffs[contract.AUX_HIDDEN] = aux_diff
            if not aux_diff <= aux_limit:
                raise ParityError(f"{role} graph {onnx_path}: its {contract.AUX_HIDDEN} differs "
                                  f"from Hugging Face's hidden_states at layers "
                                  f"{list(aux_layers)} (past_len={past_len}, new_len={new_len}): "
                                  f"max |diff| {aux_diff:.3g} (limit {aux_limit:.3g}). ---> HINT: "
                                  f"please report it with the model's config.json.")
            limit = max(limit, aux_limit)
        # NaN compares False against any limit: a non-finite difference is a failure itself
        if not np.isfinite(list(diffs.values())).all() or diffs["logits"] > limit \
                or max(diffs.values()) > max(limit, 10 * abs_tol):
            shown = ", ".join(f"{k} {v:.3g}" for k, v in diffs.items())
            raise ParityError(f"{role} graph {onnx_path} differs from the Hugging Face model at "
                              f"past_len={past_len}, new_len={new_len}: max |diff| {shown} "
                              f"(limit {limit:.3g}). ---> HINT: this architecture variant is not "
                              f"reproduced; please report it with the model's config.json.")
        for k, v in diffs.items():
            worst[k] = max(worst[k], v)
    return worst


def run_whole(session, ids: np.ndarray, graph: str, dtype: str) -> np.ndarray:
    """Logits (1, S, V) of the graph over `ids` from an empty cache, as float32."""
    n_layers = _layers(session)
    if contract.in_place(graph):
        return _run_in_place(session, ids, 0, ids.shape[1], n_layers, dtype, ids.shape[1])[0]
    return _run(session, ids, 0, None, n_layers, dtype)[0]


def run_with_features(session, ids: np.ndarray, graph: str, dtype: str
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Logits (1, S, V) and contract.AUX_HIDDEN (1, S, 3·Ht) of a target graph that feeds an
    EAGLE-3 head, over `ids` from an empty cache (docs/design.md §14)."""
    n_layers = _layers(session)
    if contract.in_place(graph):
        logits, _, aux = _run_in_place(session, ids, 0, ids.shape[1], n_layers, dtype,
                                       ids.shape[1])
    else:
        logits, _, aux = _run(session, ids, 0, None, n_layers, dtype)
    return logits, aux


def _layers(session) -> int:
    return len([i for i in session.get_inputs() if i.name.startswith("past_key.")])


def _run(session, ids: np.ndarray, past_len: int, past: list[np.ndarray] | None, n_layers: int,
         dtype: str) -> tuple[np.ndarray, list[np.ndarray]]:
    kv_dtype = np.float16 if dtype == "float16" else np.float32
    feeds = {contract.INPUT_IDS: ids,
             contract.POSITION_IDS: np.arange(past_len, past_len + ids.shape[1])[None]}
    if contract.TREE_MASK in {i.name for i in session.get_inputs()}:     # a chain's mask
        feeds[contract.TREE_MASK] = np.tri(ids.shape[1], dtype=np.bool_)[None]
    for i in range(n_layers):
        if past is None:
            _, _, kv_heads, head_dim = session.get_inputs()[2 + 2 * i].shape   # static ints
            empty = np.zeros((1, 0, kv_heads, head_dim), kv_dtype)
            feeds[contract.past_key(i)] = feeds[contract.past_value(i)] = empty
        else:
            feeds[contract.past_key(i)], feeds[contract.past_value(i)] = past[2 * i], past[2 * i + 1]
    outputs = session.run(None, feeds)
    aux = outputs.pop(-1) if _has_aux(session) else None
    return outputs[0].astype(np.float32), outputs[1:], aux


def _run_in_place(session, ids: np.ndarray, past_len: int, new_len: int, n_layers: int,
                  dtype: str, rows: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """The "ort" and "static" flavours (and the rows graph, attending rows [0, stop)): prefill
    ids[:past_len], then run the next new_len ids, each call with every layer's
    (1, Hkv, rows, D) cache bound as past and present. Returns the second call's
    logits and its new rows as (1, new_len, Hkv, D), like the standard graph's outputs."""
    kv_dtype = np.float16 if dtype == "float16" else np.float32
    _, kv_heads, _, head_dim = session.get_inputs()[2].shape
    caches = [np.zeros((1, kv_heads, rows, head_dim), kv_dtype) for _ in range(2 * n_layers)]
    logits = None
    for start, stop in ((0, past_len), (past_len, past_len + new_len)):
        if stop == start:
            continue
        binding = session.io_binding()
        binding.bind_cpu_input(contract.INPUT_IDS, np.ascontiguousarray(ids[:, start:stop]))
        binding.bind_cpu_input(contract.POSITION_IDS, np.arange(start, stop)[None])
        binding.bind_output(contract.LOGITS)
        if _has_aux(session):
            binding.bind_output(contract.AUX_HIDDEN)
        if contract.ATTEND_ROWS in {i.name for i in session.get_inputs()}:   # the rows graph
            binding.bind_cpu_input(contract.ATTEND_ROWS, np.arange(stop, dtype=np.int64))
        if contract.TREE_MASK in {i.name for i in session.get_inputs()}:     # a chain's mask
            binding.bind_cpu_input(contract.TREE_MASK, np.tri(stop - start, dtype=np.bool_)[None])
        for i in range(n_layers):
            for j, (past, present) in enumerate(((contract.past_key(i), contract.present_key(i)),
                                                 (contract.past_value(i),
                                                  contract.present_value(i)))):
                cache = caches[2 * i + j]
                for name, bind in ((past, binding.bind_input), (present, binding.bind_output)):
                    bind(name, "cpu", 0, kv_dtype, cache.shape, cache.ctypes.data)
        session.run_with_iobinding(binding)
        outputs = binding.copy_outputs_to_cpu()          # in binding order: logits, [aux]
        logits, aux = outputs[0], (outputs[1] if _has_aux(session) else None)
    new_rows = [c[:, :, past_len:past_len + new_len].transpose(0, 2, 1, 3) for c in caches]
    return logits.astype(np.float32), new_rows, aux


def _has_aux(session) -> bool:
    """Whether the graph's last output is contract.AUX_HIDDEN (a target beside a head)."""
    return session.get_outputs()[-1].name == contract.AUX_HIDDEN


def _hf_cache(cache: Any, total: int) -> list[tuple[int, np.ndarray, np.ndarray]] | None:
    """Per layer (first row, keys, values) as (1, L, Hkv', D), or None without a usable cache.

    A sliding-window layer keeps only its last L < total rows: the first row is total - L.
    """
    layers = getattr(cache, "layers", None)
    if not layers:
        return None
    result = []
    for layer in layers:
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or keys.shape[2] > total:
            return None
        result.append((total - keys.shape[2], keys.transpose(1, 2).float().numpy(),
                       values.transpose(1, 2).float().numpy()))
    return result


def _kv_diff(ours: np.ndarray, first: int, ref: np.ndarray, past_len: int) -> float | None:
    """Max |diff| of our new rows (1, T, Hkv, D) against the rows Hugging Face kept, if any.

    Where Hugging Face stores each KV head repeated for its query group (Falcon's new
    decoder architecture), one copy per group is compared; where it stores fewer numbers per
    head (multi-head latent attention: the latent as keys, the rotated key part as values,
    which lead our key [c | k_rot] and value [k_rot | c]), the leading ones.
    """
    start, stop = max(past_len, first), min(past_len + ours.shape[1], first + ref.shape[1])
    if start >= stop or ref.shape[2] % ours.shape[2] or ref.shape[3] > ours.shape[3]:
        return None
    ref = ref[:, start - first:stop - first, ::ref.shape[2] // ours.shape[2]]
    ours = ours[:, start - past_len:stop - past_len, :, :ref.shape[3]]
    return float(np.abs(ours.astype(np.float32) - ref).max())


@contextmanager
def _reference_attention(model: Any, role: str) -> Iterator[None]:
    """Run Hugging Face with the attention implementation the adapter names as reference.

    Set on the config: Falcon reads it at call time, and refuses set_attn_implementation().
    """
    wanted = adapter_for(model, role).reference_attn
    current = getattr(model.config, "_attn_implementation", None)
    if wanted is None or wanted == current:
        yield
        return
    model.config._attn_implementation = wanted
    try:
        yield
    finally:
        model.config._attn_implementation = current


def check_batch(root: Path, manifest: Any, role: str, rows: int = 3, seed: int = 0) -> float:
    """The graph as the runtime batches it (docs/design.md §11): rows at different past
    lengths with different numbers of real new tokens in one call give each row's logits as
    that row alone does. Returns the largest difference; raises ParityError past tolerance.

    The tolerance is the float one, or twice the graph's own variation where that is larger:
    how far its logits for row 0's tokens in one call are from the same tokens one at a time.
    A target whose MatMulNBits round their activations to int8 (accuracy level 4) varies so:
    a rounding flipped by any other order of float operations moves its logits by ~1e-2
    (docs/performance.md, "A batch's verification in one call"; docs/performance-notes.md,
    "Figures from code comments")."""
    from ssd_runtime.backends import cpu_session

    entry = getattr(manifest, role)
    rows = min(rows, manifest.max_batch)
    width = min(3, manifest.max_draft + 1)
    pasts = [min(p, manifest.max_context - width) for p in (1, 5, 12)][:rows]
    session = cpu_session(role, root, manifest, threads=1, max_batch=rows)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, entry.vocab_size, size=(rows, max(pasts) + width), dtype=np.int64)
    real = np.asarray([width - b % width for b in range(rows)], np.int64)   # 3, 2, 1 real
    for b, past in enumerate(pasts):
        session.prefill(ids[b, :past], 0, slot=b)
    batch_ids = np.stack([ids[b, pasts[b]:pasts[b] + width] for b in range(rows)])
    together = session.forward_rows(batch_ids, np.asarray(pasts, np.int64), real).copy()
    one_call = session.forward(batch_ids[0], pasts[0], slot=0).copy()
    own = max(float(np.abs(one_call[j] - session.forward(batch_ids[0, j:j + 1], pasts[0] + j,
                                                          slot=0)[0]).max())
              for j in range(width))
    worst = 0.0
    abs_tol, rel_tol = _TOLERANCE[entry.kv_dtype]
    abs_tol = max(abs_tol, 2 * own)
    for b, past in enumerate(pasts):
        alone = session.forward(batch_ids[b, :real[b]], past, slot=b)
        diff = float(np.abs(together[b, :real[b]] - alone).max())
        worst = max(worst, diff)
        if not np.isfinite(diff) or diff > abs_tol + rel_tol * float(np.abs(alone).max()):
            raise ParityError(f"{role} graph {root / entry.path}: in a batch, row {b} (past "
                              f"{past}, {real[b]} new tokens) differs from the same row alone "
                              f"by {diff:.3g} in the logits. ---> HINT: export with "
                              f"--max-batch 1, and report this model.")
    return worst
