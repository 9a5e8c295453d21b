"""Acceptance rules that run the bundle's ONNX heads instead of host numpy.

Same decisions as acceptance.py from the same uniforms (the random stream is
drawn in the same order), but only token ids come back from the heads; a
device backend binds its logits buffer as their input.
"""
from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

from ..backends.device import DeviceLogits
from ..backends.select import CUDA_PROVIDER
from ..errors import BackendError, BundleError
from .rules import Rule, leading_agreement, random_streams
from .sampling import SamplingParams, position_uniform, probabilities
from .tree import Tree
from .tree_draft import race_noise, top_candidates
from .tree_rules import reject, walk

REQUIRED = ("argmax", "sample", "accept")


class HeadSessions:
    """ONNX Runtime sessions over heads/argmax.onnx, sample.onnx and accept.onnx.

    `device="cuda"` runs them on ORT's CUDA provider and binds DeviceLogits where they
    lie (the cuda and trt backends); host arrays take the plain `run` path as before.
    """

    def __init__(self, root: Path, heads: dict[str, str], device: str = "cpu",
                 device_id: int = 0) -> None:
        import onnxruntime as ort

        missing = [h for h in REQUIRED if h not in heads]
        if missing:
            raise BundleError(f"bundle {root} has no fused heads {missing}; re-export it with "
                              f"this version of ssd-export, or load it with fused_heads=False.")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = 1
        providers = [(CUDA_PROVIDER, {"device_id": device_id}), "CPUExecutionProvider"] \
            if device == "cuda" else ["CPUExecutionProvider"]
        self.device, self.device_id = device, device_id
        self.sessions = {name: ort.InferenceSession(str(root / heads[name]), opts,
                                                    providers=providers) for name in REQUIRED}
        # IO bindings per head and per thread (split mode runs the argmax head on the
        # draft's thread and the main one at once), made at their first device call
        self._local = threading.local()
        loaded = self.sessions["argmax"].get_providers()
        if device == "cuda" and CUDA_PROVIDER not in loaded:
            raise BackendError(f"fused heads: ONNX Runtime did not load its CUDA provider "
                               f"(session providers: {loaded}). ---> HINT: install "
                               f"onnxruntime-gpu in place of onnxruntime, or load the bundle "
                               f"with fused_heads=False.")

    def argmax(self, logits) -> np.ndarray:
        return self._run("argmax", logits, {})[0]                                 # (T,)

    def sample(self, logits, params: SamplingParams, u: float):
        feeds = {**_settings(params), "uniform": np.array([u], np.float32)}
        token, probs = self._run("sample", logits, feeds)
        return int(token[0]), probs                                              # (V,)

    def accept(self, logits, drafts: list[int], draft_probs: list[np.ndarray],
               uniforms: np.ndarray, params: SamplingParams) -> tuple[int, int]:
        vocab = logits.shape[-1]
        probs = np.zeros((len(drafts), vocab), np.float32)
        for i, (x, q) in enumerate(zip(drafts, draft_probs)):
            if q is None:                        # a lookup token: a point mass at x
                probs[i, x] = 1.0
            else:
                probs[i] = q
        feeds = {"draft_tokens": np.asarray(drafts, np.int64), "draft_probs": probs,
                 "uniforms": uniforms.astype(np.float32), **_settings(params)}
        accepted, token = self._run("accept", logits, feeds)
        return int(accepted[0]), int(token[0])

    def _run(self, name: str, logits, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Host logits: a plain run. DeviceLogits: bind their memory as the input, the
        small settings from the host, and bring only the (integer) outputs back."""
        session = self.sessions[name]
        if not isinstance(logits, DeviceLogits):
            return session.run(None, {"logits": logits, **feeds})
        if logits.device != self.device:         # e.g. trt logits but heads on the CPU
            return session.run(None, {"logits": logits.numpy(), **feeds})
        bindings = self._local.__dict__.setdefault("bindings", {})
        if name not in bindings:
            bindings[name] = (session.io_binding(), [o.name for o in session.get_outputs()])
        binding, outputs = bindings[name]
        binding.bind_input("logits", logits.device, logits.device_id, logits.dtype.type,
                           logits.shape, logits.ptr)                             # (T, V)
        for key, value in feeds.items():
            binding.bind_cpu_input(key, value)
        for out in outputs:             # rebound each call: output shapes follow T
            binding.bind_output(out, "cpu")
        session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()


class FusedGreedyAcceptance(Rule):
    def __init__(self, heads: HeadSessions) -> None:
        self.heads = heads

    def draft_pick(self, logits: np.ndarray, position: int, top=None, pending=()
                   ) -> tuple[int, None]:
        return int(self.heads.argmax(logits[-1:])[0]), None      # the last row, still on device

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list, position: int) -> tuple[int, int]:
        return leading_agreement(drafts, self.heads.argmax(target_logits))        # (k+1,)

    def verify_tree(self, target_logits: np.ndarray, tree: Tree, draft_probs: list,
                    position: int) -> tuple[list[int], int]:
        choices = self.heads.argmax(target_logits)                                # (N,)
        return walk(tree, lambda i: int(choices[i]))


class FusedSamplingAcceptance(Rule):
    def __init__(self, heads: HeadSessions, params: SamplingParams) -> None:
        self.heads, self.params = heads, params
        self.draft_key, self.verify_rng = random_streams(params.seed)

    def draft_pick(self, logits: np.ndarray, position: int, top=None, pending=()
                   ) -> tuple[int, np.ndarray]:
        return self.heads.sample(logits, self.params, position_uniform(self.draft_key, position))

    def draft_candidates(self, row, count: int, position: int, pending=(), node: int = 0,
                         sampled: bool = False):
        """As SamplingAcceptance's, on the host (a tree's rows are few)."""
        q = probabilities(np.asarray(row), self.params)
        if not sampled:
            tokens = top_candidates(q, q, count)
            return tokens, q[tokens], None
        tokens = top_candidates(q / race_noise(self.draft_key, position, node, len(q)), q, count)
        return tokens, q[tokens], q

    def verify(self, target_logits: np.ndarray, drafts: list[int],
               draft_probs: list[np.ndarray], position: int) -> tuple[int, int]:
        accept_u = self.verify_rng.random(len(drafts))
        final_u = self.verify_rng.random()
        uniforms = np.append(accept_u, final_u)
        return self.heads.accept(target_logits, drafts, draft_probs, uniforms, self.params)

    def verify_tree(self, target_logits: np.ndarray, tree: Tree, draft_probs: list,
                    position: int) -> tuple[list[int], int]:
        """The host's recursive rejection (tree_rules.reject) from the same uniforms as
        SamplingAcceptance.verify_tree: the accept head judges chains only; the rows the walk
        reads come to the host one by one (indexing device logits copies a row)."""
        accept_u = self.verify_rng.random(len(tree) - 1)
        final_u = self.verify_rng.random()
        return reject(tree, lambda i: probabilities(np.asarray(target_logits[i]), self.params),
                      draft_probs, accept_u, final_u)


@functools.lru_cache(maxsize=16)     # one request's settings, fed on every head call
def _settings(params: SamplingParams) -> dict[str, np.ndarray]:
    return {"temperature": np.array([params.temperature], np.float32),
            "top_k": np.array([params.top_k], np.int64),
            "top_p": np.array([params.top_p], np.float32)}
