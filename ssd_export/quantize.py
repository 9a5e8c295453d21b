"""Weight-only quantization of the draft graph (ONNX Runtime's MatMulNBits, CPU kernels).

The draft only proposes: the target judges every token, so a quantized draft changes how
many tokens are accepted, never which tokens come out (greedy or sampled; the sampled rule
uses the quantized draft's own q). A small draft's step is mostly weight traffic, and after
each target step its weights are evicted from the CPU caches by the target's; 8-bit weights
are a quarter of the float32 bytes, so an int8 draft costs less a round at the same
acceptance; int4 halves the bytes again, but a small draft's tied head quantized to 4 bits
agrees less with the float draft and has fewer tokens accepted (docs/export.md,
`--draft-quant`; docs/performance-notes.md, "int8 draft").

Each MatMul whose B is a constant (or the transpose of one: a tied lm_head) becomes a
MatMulNBits node: symmetric blocks of 32 along K, accuracy level 4 (activations quantized
to int8 inside the kernel, VNNI/AVX-512 where the CPU has them).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ssd_graphs.trace import TracedModel
from ssd_runtime import contract
from ssd_runtime.errors import BackendError, ConfigError

from .parity import ort_errors, run_whole
from .qweights import Scheme, rewrite, save

BITS = {"int8": 8, "int4": 4}     # the quantized kinds of contract.QUANTS
BLOCK = 32
ACCURACY_LEVEL = 4
MIN_AGREEMENT = 0.97      # --draft-quant auto keeps the float draft below this top-1 agreement


def quantize_draft(traced: TracedModel, requested: str, dtype: str, max_context: int,
                   log, follow: str = contract.NO_QUANT) -> tuple[str, float | None]:
    """Quantize the draft's weights in place when chosen (the module says why it pays), and
    measure its top-1 agreement with the float graph. Under auto a draft that agrees on fewer
    than MIN_AGREEMENT of its tokens stays float; asked for explicitly it is kept, with a note.
    `follow`: the target's weights, which auto takes when the target is quantized."""
    quant, why = choose_quant(requested, traced.graph, follow)
    log.print(f"    draft weights: {quant} ({why})")
    if quant == contract.NO_QUANT:
        return quant, None
    path = traced.path
    keep = path.parent.parent / ".float-draft"
    shutil.copytree(path.parent, keep)
    try:
        with log.stage(f"quantize the draft's weights ({quant})"):
            count, agreement, why = _quantize_checked(path, keep / path.name, quant, requested,
                                                      traced, dtype, max_context)
        if count and (requested != "auto" or agreement >= MIN_AGREEMENT):
            others = "int8 or none" if quant == "int4" else "none"
            note = "" if agreement >= MIN_AGREEMENT else \
                f" (low: expect fewer accepted tokens; --draft-quant {others} may be faster)"
            log.print(f"    draft weights: {quant}, {count} MatMuls, {why}{note}")
            return quant, round(agreement, 4)
        shutil.rmtree(path.parent)
        shutil.copytree(keep, path.parent)
    finally:
        shutil.rmtree(keep, ignore_errors=True)
    if quant == "int4" and follow == "int4":      # following an int4 target: int8 next
        log.print(f"    draft weights: not int4 ({why}); trying int8")
        return quantize_draft(traced, requested, dtype, max_context, log, follow="int8")
    log.print(f"    draft weights: kept float ({why})")
    return contract.NO_QUANT, None


def _quantize_checked(path: Path, float_path: Path, quant: str, requested: str,
                      traced: TracedModel, dtype: str, max_context: int
                      ) -> tuple[int, float, str]:
    """(MatMuls quantized, top-1 agreement, what to say). ONNX Runtime refusing the graph (its
    quantizer or its kernels) is an error when asked for explicitly, else 0 MatMuls; any other
    exception is a bug and propagates."""
    try:
        count = quantize_graph(path, quant, traced.graph)
        agreement = top1_agreement(float_path, path, traced.graph, dtype, traced.vocab_size,
                                   max_context)
    except ConfigError as exc:         # a block size that does not divide a weight's K
        if requested != "auto":
            raise
        return 0, 0.0, str(exc).split(" ---> ")[0]
    except (BackendError, *ort_errors()) as exc:
        if requested != "auto":
            raise ConfigError(f"--draft-quant {quant}: ONNX Runtime could not quantize or run "
                              f"the draft ({exc}). ---> HINT: use --draft-quant none.") from None
        return 0, 0.0, f"ONNX Runtime refused it: {(str(exc) or repr(exc)).splitlines()[0]}"
    why = f"top-1 agreement {agreement:.3f} with the float draft"
    if requested == "auto" and agreement < MIN_AGREEMENT:
        why += f", below {MIN_AGREEMENT}"
    return count, agreement, why


def draft_scheme(quant: str, graph: str) -> Scheme:
    """The draft's scheme: blocks of 32, round to nearest, the LM head too; MatMulNBits at
    accuracy level 4 (int8 activations: the faster kernel; the draft's exact values never
    reach the output) in the ort flavour, DequantizeLinear in the others, which ONNX Runtime's
    CPU provider fuses into MatMulNBits at the level the manifest records (design §12): level
    4 there too (at level 0 an int8 weight has no fast kernel: docs/performance-notes.md,
    "Figures from code comments")."""
    form = contract.MATMULNBITS if graph == contract.ORT else contract.DEQUANTIZE
    return Scheme(BITS[quant], BLOCK, "rtn", True, form, ACCURACY_LEVEL)


def quantize_graph(path: Path, quant: str, graph: str = contract.ORT) -> int:
    """Rewrite the ONNX graph at `path` (external data beside it) with `quant` weights in place;
    return how many MatMuls were quantized."""
    import onnx

    model = onnx.load(str(path))
    count = len(rewrite(model, draft_scheme(quant, graph), 0, pad=True))   # the head too
    save(model, path)
    return count


def top1_agreement(float_path: Path, quant_path: Path, graph: str, dtype: str, vocab: int,
                   max_context: int, seed: int = 0) -> float:
    """How often the quantized graph's argmax equals the float graph's, over sequences the
    float draft writes itself (a random prompt, then its own greedy continuation): the tokens
    a draft proposes in a round."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # computing as the runtime will (a DequantizeLinear graph is fused at this level)
    opts.add_session_config_entry(contract.QDQ_ACCURACY, str(ACCURACY_LEVEL))
    reference, quantized = (ort.InferenceSession(str(p), opts,
                                                 providers=["CPUExecutionProvider"])
                            for p in (float_path, quant_path))
    rng = np.random.default_rng(seed)
    # 3 x 48 tokens: each greedy step recomputes the whole sequence (no cache), which stays
    # cheap for a draft; the estimate's standard error is about 1.4 points at 0.97
    length = min(48, max_context)
    agree = total = 0
    for _ in range(3):
        ids = rng.integers(0, vocab, size=(1, min(8, length - 1)), dtype=np.int64)
        while ids.shape[1] < length:      # greedy, recomputed whole: a small draft, short text
            logits = run_whole(reference, ids, graph, dtype)
            ids = np.concatenate([ids, logits[:, -1:].argmax(-1)], axis=1)
        ours = run_whole(quantized, ids, graph, dtype).argmax(-1)
        theirs = run_whole(reference, ids, graph, dtype).argmax(-1)
        agree += int((ours == theirs).sum())
        total += ours.size
    return agree / total


def check_request(requested: str) -> None:
    """Refuse, before any work, quantized weights this onnxruntime cannot run."""
    import onnxruntime as ort

    version = ort.__version__
    if requested in BITS and contract.version_tuple(version) < contract.QUANT_MIN[requested]:
        need = contract.version_text(contract.QUANT_MIN[requested])
        raise ConfigError(f"--draft-quant {requested} needs onnxruntime >= {need} (found "
                          f"{version}). ---> HINT: pip install -U onnxruntime, or use "
                          f"--draft-quant none.")


def choose_quant(requested: str, draft_graph: str, follow: str = contract.NO_QUANT
                 ) -> tuple[str, str]:
    """The draft weights to write, and why."""
    import onnxruntime as ort

    check_request(requested)
    version = ort.__version__
    if requested != "auto":
        return requested, "--draft-quant"
    if follow in BITS:
        return follow, "following the target's quantization (--quant)"
    if draft_graph != contract.ORT:
        return contract.NO_QUANT, f"a {draft_graph} graph, kept free of ONNX Runtime's CPU-only kernels"
    if contract.version_tuple(version) < contract.QUANT_MIN["int8"]:
        return contract.NO_QUANT, f"onnxruntime {version} has no 8-bit MatMulNBits kernel"
    return "int8", "a CPU bundle: the draft's weights are most of its step"
