"""Acceptance rules that run the bundle's ONNX heads instead of host numpy.

Same decisions as acceptance.py from the same uniforms (the random stream is
drawn in the same order), but only token ids come back from the heads; a
device backend binds its logits buffer as their input.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import BundleError
from .sampling import SamplingParams, position_uniform

REQUIRED = ("argmax", "sample", "accept")


class HeadSessions:
    """ONNX Runtime sessions over heads/argmax.onnx, sample.onnx and accept.onnx."""

    def __init__(self, root: Path, heads: dict[str, str], providers: list[str]) -> None:
        import onnxruntime as ort

        missing = [h for h in REQUIRED if h not in heads]
        if missing:
            raise BundleError(f"bundle {root} has no fused heads {missing}; re-export it with "
                              f"this version of ssd-export, or load it with fused_heads=False.")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = 1
        self.sessions = {name: ort.InferenceSession(str(root / heads[name]), opts,
                                                    providers=providers) for name in REQUIRED}

    def argmax(self, logits: np.ndarray) -> np.ndarray:
        return self.sessions["argmax"].run(None, {"logits": logits})[0]          # (T,)

    def sample(self, logits: np.ndarray, params: SamplingParams, u: float):
        feeds = {"logits": logits, **_settings(params), "uniform": np.array([u], np.float32)}
        token, probs = self.sessions["sample"].run(None, feeds)
        return int(token[0]), probs                                              # (V,)

    def accept(self, logits: np.ndarray, drafts: list[int], draft_probs: list[np.ndarray],
               uniforms: np.ndarray, params: SamplingParams) -> tuple[int, int]:
        vocab = logits.shape[-1]
        probs = np.stack(draft_probs).astype(np.float32) if draft_probs \
            else np.zeros((0, vocab), np.float32)
        feeds = {"logits": logits, "draft_tokens": np.asarray(drafts, np.int64),
                 "draft_probs": probs, "uniforms": uniforms.astype(np.float32),
                 **_settings(params)}
        accepted, token = self.sessions["accept"].run(None, feeds)
        return int(accepted[0]), int(token[0])


class FusedGreedyAcceptance:
    def __init__(self, heads: HeadSessions) -> None:
        self.heads = heads

    def draft_pick(self, logits: np.ndarray, position: int) -> tuple[int, None]:
        return int(self.heads.argmax(logits[-1:])[0]), None

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list) -> tuple[int, int]:
        choices = self.heads.argmax(target_logits)                                # (k+1,)
        j = 0
        while j < len(drafts) and drafts[j] == choices[j]:
            j += 1
        return j, int(choices[j])


class FusedSamplingAcceptance:
    def __init__(self, heads: HeadSessions, params: SamplingParams) -> None:
        from .acceptance import random_streams

        self.heads, self.params = heads, params
        self.draft_key, self.verify_rng = random_streams(params.seed)

    def draft_pick(self, logits: np.ndarray, position: int) -> tuple[int, np.ndarray]:
        return self.heads.sample(logits, self.params, position_uniform(self.draft_key, position))

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list[np.ndarray]) -> tuple[int, int]:
        accept_u = self.verify_rng.random(len(drafts))
        final_u = self.verify_rng.random()
        uniforms = np.append(accept_u, final_u)
        return self.heads.accept(target_logits, drafts, draft_probs, uniforms, self.params)


def _settings(params: SamplingParams) -> dict[str, np.ndarray]:
    return {"temperature": np.array([params.temperature], np.float32),
            "top_k": np.array([params.top_k], np.int64),
            "top_p": np.array([params.top_p], np.float32)}
