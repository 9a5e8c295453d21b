"""The target's weights quantized, and the quantized target made the reference (docs/design.md
§12).

Speculative decoding gives exactly the target's output, so once the target is quantized the
quantized target *is* the reference: the bundle's losslessness is against it, not the float
model. Two checks keep it trustworthy:
  parity   ONNX Runtime against the Hugging Face model carrying the graph's own dequantized
           weights, with the same cases and tolerance as a float graph. The graph is checked
           with its kernels computing in the input's float type (accuracy level 0), which
           reproduces that model; the bundle runs them at level 4, with each block of
           activations rounded to int8 (the fast kernels on CPU: docs/performance-notes.md
           §12), an approximation of the activations that the quality report measures as
           part of the quantized target;
  quality  the quantized graph against the float graph on held-out text: top-1 agreement and
           perplexity, printed and recorded. Under `--quant auto` a scheme below its floor is
           not taken; an explicit choice is kept and named.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ssd_graphs.trace import TracedModel
from ssd_runtime import contract
from ssd_runtime.errors import ConfigError

from .loading import LoadedModel
from .parity import check_parity, run_whole
from .qweights import DEQUANTIZE, MATMULNBITS, Scheme, Weight, rewrite, save

# top-1 agreement with the float target that --quant auto takes, per kind: int4 loses more and
# buys more; below both floors the target stays float
FLOOR = {"int4": 0.90, "int8": 0.97}
BITS = {"int8": 8, "int4": 4}
# The flavour --graph auto writes for a quantized target on the CPU: its attention is plain
# ONNX whose MatMuls never run on one row (graphs/attention.py row_exact_matmul), and only its
# shapes are the same for every row (the whole cache), so a row's logits have the same bits
# alone (k=0), among k+1 and beside other sequences; int8 activations would amplify a ~1e-7
# difference into ~0.04 (design §12, issue 44). The ort flavour's target is as exact for one
# sequence (its GroupQueryAttention reads two rows at least, graphs/two_rows.py) but not in a
# batch, and with the fused static layer no faster (docs/performance.md, "Two rows").
EXACT_QUANT_GRAPH = contract.STATIC
ORT_QUANT_NOTE = ("a quantized target in the ort flavour is exact for one sequence (its "
                  "attention reads two rows at least: speculation equals k=0), but in a batch a "
                  "sequence's rows are computed otherwise than alone, and speculation parts from "
                  "k=0 at some tokens (design §12). --graph auto writes the static flavour, "
                  "exact in batches too.")
REPORT_TOKENS = 1024          # held-out tokens the report reads (4 windows of 256)
WINDOW = 256


@dataclass(frozen=True)
class Quality:
    """The quantized target against the float one, on held-out text."""

    top1_agreement: float
    perplexity: float
    float_perplexity: float
    tokens: int
    text: str                 # where the held-out text came from

    def as_dict(self) -> dict:
        return {"top1_agreement": round(self.top1_agreement, 4),
                "perplexity": round(self.perplexity, 3),
                "float_perplexity": round(self.float_perplexity, 3),
                "tokens": self.tokens, "text": self.text}

    def line(self) -> str:
        return (f"top-1 agreement {self.top1_agreement:.3f}, perplexity "
                f"{self.perplexity:.2f} against {self.float_perplexity:.2f} in float "
                f"({self.tokens} held-out tokens of {self.text})")


# MatMulNBits' accuracy_level per --quant-compute: 4 rounds each block of activations to
# int8 (the fast kernels), 0 computes in the input's float type
ACCURACY_LEVEL = {"int8": 4, "float": 0}


def scheme_for(quant: str, graph: str, block: int, method: str, lm_head: bool,
               compute: str = "int8") -> Scheme:
    form = MATMULNBITS if graph == contract.ORT else DEQUANTIZE
    return Scheme(bits=BITS[quant], block=block, method=method, lm_head=lm_head, form=form,
                  accuracy_level=ACCURACY_LEVEL[compute])


def quantize_target(loaded: LoadedModel, traced: TracedModel, requested: str, block: int,
                    method: str, lm_head: bool, heldout: tuple[list[str], str], config, log
                    ) -> tuple[str, Scheme | None, Quality | None, dict[str, float] | None]:
    """Quantize the traced target in place when asked; return (quant, scheme, quality, parity
    against the dequantized Hugging Face model). `auto` tries int4, then int8, and keeps the
    first whose agreement reaches its FLOOR; none reaching it leaves the target float."""
    if requested == contract.NO_QUANT:
        return contract.NO_QUANT, None, None, None
    path = traced.path
    keep = path.parent.parent / ".float-target"
    shutil.copytree(path.parent, keep)
    try:
        texts, source = heldout
        ids = heldout_ids(loaded.tokenizer, texts, traced.vocab_size, config.max_context)
        index = parameter_index(loaded.model)
        for quant in (("int4", "int8") if requested == "auto" else (requested,)):
            scheme = scheme_for(quant, traced.graph, block, method, lm_head,
                                config.quant_compute)
            if requested == "auto" and scheme.bits == 8 and method == "hqq":
                scheme = replace(scheme, method="rtn")       # HQQ has no 8-bit CPU kernel
            with log.stage(f"quantize the target's weights ({quant}, {scheme.method}, blocks "
                           f"of {scheme.block}{', LM head float' if not lm_head else ''})"):
                weights, sources = quantize_graph(keep / path.name, path, scheme,
                                                  traced.vocab_size, index)
            with log.stage("quality of the quantized target against the float one"):
                quality = measure_quality(keep / path.name, path, traced.graph, config.dtype,
                                          ids, source)
            log.print(f"    target weights: {quant}, {len(weights)} MatMuls: {quality.line()}")
            floor = FLOOR[quant]
            if quality.top1_agreement >= floor or requested != "auto":
                if quality.top1_agreement < floor:
                    log.print(f"    note: the {quant} target agrees with the float one on "
                              f"{quality.top1_agreement:.1%} of next tokens, below the "
                              f"{floor:.0%} that --quant auto takes: its text will differ "
                              f"noticeably from the float model's (try "
                              f"{'--quant int8, ' if quant == 'int4' else ''}a smaller "
                              f"--quant-block, or --no-quant-lm-head)")
                with log.stage("parity of the quantized target against Hugging Face with the "
                               "same dequantized weights"):
                    parity = parity_dequantized(loaded, path, weights, sources, config,
                                                traced.graph)
                return quant, scheme, quality, parity
            log.print(f"    --quant auto: {quant} agrees {quality.top1_agreement:.3f} < "
                      f"{floor}; not taken")
        _restore(keep, path.parent)
        log.print("    target weights: kept float (no quantization reached its floor)")
        return contract.NO_QUANT, None, None, None
    finally:
        shutil.rmtree(keep, ignore_errors=True)


def quantize_graph(float_path: Path, path: Path, scheme: Scheme, vocab_size: int, index: dict
                   ) -> tuple[list[Weight], dict[str, list[Part]]]:
    """Write the graph at `float_path`, quantized with `scheme`, to `path` (its external data
    beside it); return the quantized weights and the parameters each is made of. Only weights
    made of the Hugging Face model's parameters (`index`) are quantized, so that parity can
    check them; the rest (e.g. experts rearranged at trace) stay float."""
    import onnx

    model = onnx.load(str(float_path))
    sources: dict[str, list[Part]] = {}

    def select(name: str, b: np.ndarray) -> bool:
        parts = locate(b, index)
        if parts:
            sources[name] = parts
        return parts is not None

    weights = rewrite(model, scheme, vocab_size, select)
    if not weights:
        raise ConfigError(f"{float_path.parent.name}: no MatMul with a constant weight to "
                          f"quantize (its weights are not plain MatMul constants). ---> HINT: "
                          f"use --quant none.")
    save(model, path)
    return weights, sources


def measure_quality(float_path: Path, quant_path: Path, graph: str, dtype: str,
                    windows: list[np.ndarray], source: str) -> Quality:
    """Top-1 agreement and perplexity of both graphs over the held-out windows."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sessions = [ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                for p in (float_path, quant_path)]
    agree = total = 0
    nll = [0.0, 0.0]
    for ids in windows:
        logits = [run_whole(s, ids[None], graph, dtype)[0] for s in sessions]   # (S, V)
        agree += int((logits[0][:-1].argmax(-1) == logits[1][:-1].argmax(-1)).sum())
        total += ids.size - 1
        for i, lg in enumerate(logits):
            lg = lg[:-1].astype(np.float64)
            top = lg.max(-1, keepdims=True)
            logp = lg - top - np.log(np.exp(lg - top).sum(-1, keepdims=True))
            nll[i] -= float(logp[np.arange(ids.size - 1), ids[1:]].sum())
    return Quality(agree / total, math.exp(nll[1] / total), math.exp(nll[0] / total), total,
                   source)


def parity_dequantized(loaded: LoadedModel, path: Path, weights: list[Weight],
                       sources: dict[str, list[Part]], config, graph: str) -> dict[str, float]:
    """The quantized graph against the Hugging Face model with the graph's dequantized weights
    put in place of its own (the same check as a float graph's, parity.py)."""
    load_dequantized(loaded.model, weights, sources)
    exact = path.with_name("model.accuracy0.onnx")     # shares the external data file
    try:
        with_accuracy_level(path, exact, 0)
        return check_parity(loaded.model, exact, "target", config.max_draft, config.dtype,
                            config.max_context, graph=graph,
                            session_config={contract.QDQ_ACCURACY: "0"})
    finally:
        exact.unlink(missing_ok=True)


def with_accuracy_level(path: Path, out: Path, level: int) -> None:
    """A copy of the graph at `path` whose MatMulNBits nodes compute at `level` (the weights
    stay in the external data file both name)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == MATMULNBITS:
            for attr in node.attribute:
                if attr.name == "accuracy_level":
                    attr.i = level
    onnx.save(model, str(out))


@dataclass(frozen=True)
class Part:
    """Columns [start, start + width) of a graph weight B are a module's weight (transposed:
    a Linear's; as is: a Conv1D's)."""

    module: object
    transposed: bool
    start: int
    width: int


def parameter_index(model) -> dict:
    """The model's 2-D weights as a graph would hold them (a Linear's transposed, a Conv1D's as
    is), by the digest of their first column."""
    import torch

    index: dict[tuple, list] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.nn.Parameter) and weight.dim() == 2:
            array = weight.detach().cpu().numpy()
            for transposed, b in ((True, array.T), (False, array)):
                index.setdefault(_key(b[:, 0]), []).append((module, transposed, b))
    return index


def locate(b: np.ndarray, index: dict) -> list[Part] | None:
    """The parameters B is made of, side by side along N (q, k and v packed into one MatMul at
    trace time), or None when it is not made of them."""
    parts, start = [], 0
    while start < b.shape[1]:
        for module, transposed, candidate in index.get(_key(b[:, start]), []):
            width = candidate.shape[1]
            if candidate.shape[0] == b.shape[0] and start + width <= b.shape[1] \
                    and np.array_equal(b[:, start:start + width], candidate):
                parts.append(Part(module, transposed, start, width))
                start += width
                break
        else:
            return None
    return parts


def load_dequantized(model, weights: list[Weight], sources: dict[str, list[Part]]) -> None:
    """Put each dequantized weight into the parameters it was traced from. The input embedding
    is never replaced: a tied LM head gets a weight of its own (untied), as the graph has."""
    import torch

    embedding = model.get_input_embeddings()
    for w in weights:
        for part in sources[w.name]:
            module = part.module
            if module is embedding:
                module = model.get_output_embeddings()
            columns = w.dequantized[:, part.start:part.start + part.width]
            values = torch.from_numpy(np.ascontiguousarray(
                columns.T if part.transposed else columns))
            module.weight = torch.nn.Parameter(values.to(module.weight.dtype),
                                               requires_grad=False)


def _key(array: np.ndarray) -> tuple:
    import hashlib

    data = np.ascontiguousarray(array)
    return data.shape, data.dtype.str, hashlib.sha1(data.tobytes()).hexdigest()


def _restore(keep: Path, folder: Path) -> None:
    shutil.rmtree(folder)
    shutil.copytree(keep, folder)


def heldout_ids(tokenizer, texts: list[str], vocab: int, max_context: int,
                tokens: int = REPORT_TOKENS, what: str = "the quality report"
                ) -> list[np.ndarray]:
    """Up to `tokens` tokens of the held-out texts (ids below `vocab`), in windows of WINDOW
    (or the bundle's context). `what` reads them, for the error when there are too few."""
    window = min(WINDOW, max_context)
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(stream) >= tokens:
            break
    stream = [t for t in stream[:tokens] if t < vocab]
    if len(stream) < 16:
        raise ConfigError(f"the held-out text gives {len(stream)} tokens; {what} needs at "
                          f"least 16. ---> HINT: give --calib a file with more text.")
    return [np.asarray(stream[i:i + window], np.int64)
            for i in range(0, len(stream) - 1, window) if len(stream[i:i + window]) > 1]


def read_calibration(path: str | None) -> tuple[list[str], list[str], str]:
    """(calibration texts, held-out texts, what they are). A JSONL file of {"text": ...}
    objects: its last tenth (one line at least) is held out for the quality report. Without
    a file, the docstrings of Python's standard library: English prose on every machine."""
    if path is None:
        return [], default_texts(), "the Python standard library's docstrings"
    file = Path(path)
    try:
        lines = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--calib {path}: cannot read it ({exc}). ---> HINT: give a UTF-8 "
                          f"JSONL file, one {{\"text\": ...}} object a line.") from None
    texts = []
    for n, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--calib {path}: line {n} is not JSON ({exc.msg}). ---> HINT: "
                              f"one {{\"text\": ...}} object a line.") from None
        if not isinstance(item, dict) or not isinstance(item.get("text"), str):
            raise ConfigError(f"--calib {path}: line {n} has no string \"text\" field. "
                              f"---> HINT: one {{\"text\": ...}} object a line.")
        texts.append(item["text"])
    if len(texts) < 2:
        raise ConfigError(f"--calib {path}: {len(texts)} text(s); at least 2 are needed (the "
                          f"last tenth is held out for the quality report).")
    held = max(1, len(texts) // 10)
    return texts[:-held], texts[-held:], f"{file.name}'s last {held} line(s)"


_DOC_MODULES = ("argparse", "collections", "functools", "json", "pathlib", "textwrap",
                "itertools", "logging", "subprocess", "threading", "unittest", "datetime",
                "decimal", "fractions", "heapq", "random", "statistics", "string", "typing")


def default_texts() -> list[str]:
    """Docstrings of standard-library modules, classes and functions: prose, the same text on
    every machine with the same Python."""
    import importlib
    import inspect
    import warnings

    texts = []
    with warnings.catch_warnings():     # typing.io and typing.re warn when read (Python 3.11)
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in _DOC_MODULES:
            module = importlib.import_module(name)
            for obj in [module] + [getattr(module, a) for a in sorted(vars(module))
                                   if not a.startswith("_")]:
                doc = inspect.getdoc(obj) if inspect.ismodule(obj) or inspect.isclass(obj) \
                    or inspect.isfunction(obj) else None
                if doc and len(doc) > 200 and doc not in texts:
                    texts.append(doc)
    return texts
