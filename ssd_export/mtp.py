"""`--draft mtp`: the target's own MTP layer as the bundle's draft head, no training (docs/design.md
§14): checked from the checkpoint before anything is written, read into a one-layer model of the
target's class, traced with the head contract and checked against that PyTorch layer.

    check_mtp (config, safetensors headers) → load_mtp (graphs/mtp.py) → export_mtp
    → head_parity (ssd_export/eagle3.py: features, its own output, a batch of two rows)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssd_graphs.mtp import MtpConfig, MtpHead, load_mtp
from ssd_graphs.trace import TracedModel
from ssd_runtime import contract
from ssd_runtime.manifest import ModelEntry

from .eagle3 import head_entry, head_parity

MTP_DRAFT = "mtp"               # --draft mtp: a literal keyword, not a folder (vLLM's method "mtp")
FEATURES = "final_norm"         # what the head reads: the target's last hidden state, normed


@dataclass
class LoadedMtp:
    source: str                 # the target's folder: the layer is in its checkpoint
    config: MtpConfig
    head: MtpHead
    architecture: str           # the target's class
    layout = "mtp"

    def settings(self) -> dict[str, Any]:
        """ModelEntry.head (runtime/manifest.py HEAD_FIELDS, and the MTP layer's own)."""
        c = self.config
        return {"layout": self.layout, "hidden_size": c.hidden_size,
                "target_hidden_size": c.target_hidden_size, "draft_vocab_size": c.vocab_size,
                "norm_before_residual": False, "embedding": "target",
                "lm_head": "layer" if c.own_lm_head else "target",
                "source_layer": c.source_layer, "features": FEATURES,
                "num_nextn_predict_layers": c.num_nextn_predict_layers}

    def describe(self) -> str:
        c = self.config
        more = (f"; the checkpoint has {c.num_nextn_predict_layers}, the first drafts every "
                f"step" if c.num_nextn_predict_layers > 1 else "")
        return (f"    draft: the target's own MTP layer (model.layers.{c.source_layer}), reading "
                f"its last hidden state after the final norm{more}")

    def trace(self, path: Path, max_context: int, config, target: TracedModel,
              log) -> tuple[TracedModel, dict[str, float]]:
        """Trace in the flavour the target's calls need (contract.head_graph) and check it
        against the PyTorch layer."""
        from ssd_graphs.mtp_trace import export_mtp

        graph = contract.head_graph(target.graph)
        with log.stage(f"trace the draft (the target's MTP layer, {graph} graph)"):
            traced = export_mtp(self.head, self.source, path, max_context, graph)
        with log.stage("parity of the MTP layer against Hugging Face's"):
            return traced, head_parity(self.head, traced.path, graph, config.max_draft,
                                       max_context)

    def entry(self, root: Path, traced: TracedModel, parity: dict[str, float]) -> ModelEntry:
        """The draft's manifest entry: kind mtp, aux_layer_ids [L], its settings."""
        return head_entry(root, self, traced, parity, kind=contract.MTP)


def read_mtp(source: str, target: Any) -> LoadedMtp:
    """The target's MTP layer beside the loaded target (its embedding, maybe its lm_head)."""
    head = load_mtp(source, target)
    return LoadedMtp(source, head.config, head, type(target).__name__)
