"""A published EAGLE-3 head as the bundle's draft: read it, check it fits the target before
anything is written, and check its traced graph against the PyTorch head (docs/design.md §14).

    read_head (layout, tensors, fit to the target) → export_head (graphs/eagle3_trace.py)
    → head_parity (ONNX Runtime against the module: a step fed by features, a step fed by
      its own output, a batch of rows at their own lengths)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ssd_graphs.eagle3 import Eagle3Config, Eagle3Head, is_head, load_head  # noqa: F401
from ssd_graphs.trace import TracedModel
from ssd_runtime import contract
from ssd_runtime.errors import ConfigError, ParityError
from ssd_runtime.manifest import ModelEntry

from .quantize import BITS

_TOLERANCE = (1e-3, 1e-3)       # (absolute, relative to max |reference|), float32 as parity.py


@dataclass
class LoadedHead:
    source: str
    config: Eagle3Config
    head: Eagle3Head
    layout: str                 # eagle3.SAFEAILAB or SPECULATORS
    architecture: str           # what its config.json names, for the manifest

    def settings(self) -> dict[str, Any]:
        """ModelEntry.head (runtime/manifest.py HEAD_FIELDS)."""
        c = self.config
        return {"layout": self.layout, "hidden_size": c.hidden_size,
                "target_hidden_size": c.target_hidden_size,
                "draft_vocab_size": c.draft_vocab_size,
                "norm_before_residual": c.norm_before_residual,
                "embedding": "head" if self.head.own_embedding else "target"}

    def describe(self) -> str:
        c = self.config
        return (f"    draft: an EAGLE-3 head ({self.layout} layout) reading the target's layers "
                f"{list(c.aux_layer_ids)}, {c.draft_vocab_size} draft tokens")

    def trace(self, path: Path, max_context: int, config, target: TracedModel,
              log) -> tuple[TracedModel, dict[str, float]]:
        return trace_head(self, path, max_context, config, target, log)

    def entry(self, root: Path, traced: TracedModel, parity: dict[str, float]) -> ModelEntry:
        return head_entry(root, self, traced, parity)


def read_head(source: str, target: Any) -> LoadedHead:
    """Read the head at `source` and check it against the target (a Hugging Face model): one
    ConfigError per misfit, naming both sides, before the bundle is begun."""
    import json

    tc = target.config
    depth = int(tc.num_hidden_layers)
    config, head, layout = load_head(source, num_target_layers=depth)
    where = f"EAGLE-3 head {source!r}"
    hint = "---> HINT: use a head trained for this target (its config.json names its target)."
    width = int(tc.hidden_size)
    if config.target_hidden_size != width:
        raise ConfigError(f"{where} reads features of width {config.target_hidden_size} "
                          f"(target_hidden_size), but the target's hidden size is {width}. {hint}")
    embed = target.get_input_embeddings().weight.detach()          # (V, Ht)
    vocab = int(tc.vocab_size)
    if config.vocab_size != vocab or int(embed.shape[0]) != vocab:
        raise ConfigError(f"{where} is for a vocabulary of {config.vocab_size} tokens; the "
                          f"target has {vocab}. {hint}")
    if max(config.aux_layer_ids) >= depth:
        raise ConfigError(f"{where} reads the target's layers {list(config.aux_layer_ids)}, but "
                          f"the target has {depth} (0 to {depth - 1}). {hint}")
    if not head.own_embedding:
        if config.hidden_size != int(embed.shape[1]):
            raise ConfigError(f"{where} carries no embedding table and is {config.hidden_size} "
                              f"wide, so it cannot take the target's ({tuple(embed.shape)}). "
                              f"---> HINT: use a head that carries embed_tokens.weight.")
        head.set_embedding(embed)
    archs = json.loads((Path(source).expanduser() / "config.json").read_text()).get(
        "architectures") or [layout]
    return LoadedHead(source, config, head.eval(), layout, str(archs[0]))


def check_head_request(config, what: str = "an EAGLE-3 head") -> None:   # config: ExportConfig
    """Refuse, before any work, what a head draft (EAGLE-3, or an MTP layer) does not have yet."""
    if config.draft_quant in BITS:
        raise ConfigError(f"--draft-quant {config.draft_quant} with {what}: the head "
                          f"(one layer) is exported in float only. ---> HINT: drop --draft-quant.")
    if config.engines == "trt":
        raise ConfigError(f"--engines trt with {what}: its TensorRT engine is not built "
                          f"yet. ---> HINT: export with --engines none --graph standard (the "
                          f"graphs are standard ONNX and pass the TensorRT lint) and run them "
                          f"on --backend cuda.")


def trace_head(head: LoadedHead, path: Path, max_context: int, config,
               target: TracedModel, log) -> tuple[TracedModel, dict[str, float]]:
    """Trace the EAGLE-3 head in the flavour its target's calls need (contract.head_graph:
    static beside an ort or static target, standard beside a standard one) and check it
    against the PyTorch head."""
    from ssd_graphs.eagle3_trace import export_head

    graph = contract.head_graph(target.graph)
    with log.stage(f"trace the draft (EAGLE-3 head, {graph} graph)"):
        traced = export_head(head.head, path, max_context, graph)
    with log.stage("parity of the head against its PyTorch module"):
        return traced, head_parity(head.head, traced.path, graph, config.max_draft,
                                   max_context)


def head_entry(root: Path, head, traced: TracedModel, parity: dict[str, float],
               kind: str = contract.EAGLE3) -> ModelEntry:
    """The draft's manifest entry for a head (an EAGLE-3 head's LoadedHead, or an MTP
    layer's LoadedMtp: kind, its settings; design §14)."""
    return ModelEntry(
        path=traced.path.relative_to(root).as_posix(), architecture=head.architecture,
        source=head.source, num_layers=1, num_kv_heads=traced.num_kv_heads,
        head_dim=traced.head_dim, vocab_size=traced.vocab_size, kv_dtype=traced.kv_dtype,
        logits_dtype="float32", inputs=contract.head_input_names(),
        outputs=contract.head_output_names(traced.graph)
        + ([contract.TOP_ID, contract.TOP_PROB] if traced.tops else []),
        parameters=traced.parameters, parity=parity, graph=traced.graph, moe=traced.moe,
        kind=kind, aux_layer_ids=list(traced.aux_layer_ids), head=head.settings())


def head_parity(head: Eagle3Head, path: Path, graph: str, max_draft: int,
                max_context: int, seed: int = 0) -> dict[str, float]:
    """The head's graph, run by ONNX Runtime as the runtime binds it, against the PyTorch head
    on the same inputs. Two rows, prompts of 12 and 5:

        call 1  each row alone from P = 0, its prompt's rows fed by (random) target features
        call 2  row 0 alone, k+1 rows after its prompt: the first fed by features, the others
                by an H-wide hidden (a round's pending token, then its drafts)
        call 3  both rows in one call at their own past lengths, k+1 and 2 real rows

    Returns the largest |diff| of logits and hidden_out; raises ParityError past tolerance."""
    import onnxruntime as ort
    import torch

    c = head.config
    pasts = (min(12, max_context // 2), min(5, max_context // 2))
    width = max(2, min(max_draft + 1, max_context - pasts[0]))
    real = (width, 2)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, c.vocab_size, size=(2, pasts[0] + width), dtype=np.int64)
    features = rng.standard_normal((2, pasts[0] + width, c.feature_width),
                                   dtype=np.float32)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    run = _Runner(session, graph, head, rows=2, cache_rows=pasts[0] + width)
    worst = {"logits": 0.0, "hidden_out": 0.0}

    def compare(what: str, ours, ref) -> None:
        for name, a, b in (("logits", ours[0], ref[0]), ("hidden_out", ours[1], ref[1])):
            diff = float(np.abs(a - b).max())
            limit = _TOLERANCE[0] + _TOLERANCE[1] * float(np.abs(b).max())
            if not np.isfinite(diff) or diff > limit:
                raise ParityError(f"the head graph {path} differs from the PyTorch head in "
                                  f"{what}: max |diff| of {name} {diff:.3g} (limit "
                                  f"{limit:.3g}). ---> HINT: please report it with the head's "
                                  f"config.json.")
            worst[name] = max(worst[name], diff)

    batch = [np.zeros((2, width), np.int64), np.zeros((2, width), np.int64),
             np.zeros((2, width, c.feature_width), np.float32),
             np.zeros((2, width, c.hidden_size), np.float32)]
    refs = []
    with torch.no_grad():
        for b, (past, n) in enumerate(zip(pasts, real)):
            prompt = (ids[b:b + 1, :past], features[b:b + 1, :past],
                      np.zeros((1, past, c.hidden_size), np.float32))
            first = _reference(head, *prompt, 0)
            compare(f"a step fed by features (row {b}, {past} rows)", run(b, *prompt, 0), first)
            feats = features[b:b + 1, past:past + n].copy()
            feats[:, 1:] = 0                                # rows after the first: hidden
            hidden = np.zeros((1, n, c.hidden_size), np.float32)
            hidden[:, 1:] = rng.standard_normal((1, n - 1, c.hidden_size), dtype=np.float32)
            step = (ids[b:b + 1, past:past + n], feats, hidden)
            refs.append(_reference(head, *step, past, first[2]))
            for part, value in zip(batch, (step[0], np.arange(past, past + width)[None],
                                           feats, hidden)):
                part[b, :value.shape[1]] = value[0]         # padding: later positions, zeros
        compare(f"a step after {pasts[0]} rows fed by features and hidden", run(0, *_step_of(
            batch, 0, real[0]), pasts[0]), refs[0])
        logits, hidden_out = run.batch(*batch)
        for b, n in enumerate(real):
            compare(f"a batch of two rows at their own past lengths (row {b})",
                    (logits[b:b + 1, :n], hidden_out[b:b + 1, :n]), refs[b])
    return worst


def _step_of(batch: list[np.ndarray], b: int, n: int) -> tuple[np.ndarray, ...]:
    """Row b's first n rows of a batch's ids, features and hidden (its positions dropped)."""
    ids, _, features, hidden = batch
    return ids[b:b + 1, :n], features[b:b + 1, :n], hidden[b:b + 1, :n]


def _reference(head: Eagle3Head, ids, features, hidden, past_len: int, past_kv=None):
    """The PyTorch head on the same inputs: (logits over V, hidden_out, its cache)."""
    import torch

    x = head.fuse(torch.from_numpy(features)) + torch.from_numpy(hidden)
    pos = torch.arange(past_len, past_len + ids.shape[1])[None]
    logits, out, kv = head(torch.from_numpy(ids), x, pos, past_kv)
    return head.target_logits(logits).numpy(), out.numpy(), kv


class _Runner:
    """Runs the head graph as the runtime binds it: standard, the past fed and the new rows
    kept per row; static, one zeroed (B, Hkv, rows, D) cache bound as both past and present."""

    def __init__(self, session, graph: str, head: Eagle3Head, rows: int, cache_rows: int):
        self.session, self.static = session, contract.in_place(graph)
        Hkv, D = head.heads.num_kv_heads, head.heads.head_dim
        self.caches = [np.zeros((rows, Hkv, cache_rows + 8, D), np.float32) for _ in range(2)]
        self.past = [[np.zeros((1, 0, Hkv, D), np.float32)] * 2 for _ in range(rows)]

    def __call__(self, row: int, ids, features, hidden, past_len: int):
        """One row alone: (logits, hidden_out)."""
        pos = np.arange(past_len, past_len + ids.shape[1])[None]
        if self.static:
            caches = [np.ascontiguousarray(c[row:row + 1]) for c in self.caches]
            out = self._bound(ids, pos, features, hidden, caches)
            self.caches[0][row], self.caches[1][row] = caches[0][0], caches[1][0]
            return out
        k, v = (p[:, :past_len] for p in self.past[row])
        logits, new_k, new_v, hidden_out = self.session.run(
            None, _feeds(ids, pos, features, hidden, k, v))
        self.past[row] = [np.concatenate((k, new_k), 1), np.concatenate((v, new_v), 1)]
        return logits, hidden_out

    def batch(self, ids, pos, features, hidden):
        """Every row in one call; row b's past is its first pos[b, 0] rows."""
        if self.static:
            return self._bound(ids, pos, features, hidden, self.caches)
        P = int(pos[:, 0].max())
        keys, values = (np.zeros((len(ids), P, *self.past[0][0].shape[2:]), np.float32)
                        for _ in range(2))
        for b, (k, v) in enumerate(self.past):
            n = int(pos[b, 0])
            keys[b, :n], values[b, :n] = k[0, :n], v[0, :n]
        logits, _, _, hidden_out = self.session.run(
            None, _feeds(ids, pos, features, hidden, keys, values))
        return logits, hidden_out

    def _bound(self, ids, pos, features, hidden, caches):
        binding = self.session.io_binding()
        feeds = _feeds(ids, pos, features, hidden, caches[0], caches[1])
        for name in (contract.INPUT_IDS, contract.POSITION_IDS, contract.FEATURES, contract.HIDDEN):
            binding.bind_cpu_input(name, feeds[name])
        binding.bind_output(contract.LOGITS)              # outputs come back in binding order
        binding.bind_output(contract.HIDDEN_OUT)
        for cache, (past, present) in zip(caches, ((contract.past_key(0), contract.present_key(0)),
                                                   (contract.past_value(0),
                                                    contract.present_value(0)))):
            binding.bind_input(past, "cpu", 0, np.float32, cache.shape, cache.ctypes.data)
            binding.bind_output(present, "cpu", 0, np.float32, cache.shape, cache.ctypes.data)
        self.session.run_with_iobinding(binding)
        logits, hidden_out = binding.copy_outputs_to_cpu()[:2]
        return logits, hidden_out


def _feeds(ids, pos, features, hidden, past_k, past_v) -> dict[str, np.ndarray]:
    return {contract.INPUT_IDS: np.ascontiguousarray(ids),
            contract.POSITION_IDS: np.ascontiguousarray(pos),
            contract.FEATURES: np.ascontiguousarray(features),
            contract.HIDDEN: np.ascontiguousarray(hidden),
            contract.past_key(0): np.ascontiguousarray(past_k),
            contract.past_value(0): np.ascontiguousarray(past_v)}
