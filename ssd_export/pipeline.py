"""`export_bundle(config)`: load → check pair → trace → parity → engines → the pair's
worth → write the bundle.

Reads top to bottom; each stage prints one progress line with its time.
"""
from __future__ import annotations

import platform
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from time import perf_counter, strftime

from ssd_graphs.heads import write_heads
from ssd_graphs.mtp import check_mtp
from ssd_graphs.trace import OPSET, TracedModel, append_tops, export_decoder
from ssd_runtime import __version__, contract
from ssd_runtime.backends.trt import probe_tensorrt
from ssd_runtime.errors import ConfigError, SsdError
from ssd_runtime.manifest import MAX_BATCH, Manifest, ModelEntry, TokenizerEntry

from . import rows
from .bundle import check_output, finish_manifest, staging
from .eagle3 import check_head_request, is_head, read_head
from .mtp import MTP_DRAFT, read_mtp
from .config import DEFAULT_MAX_CONTEXT, ExportConfig
from .engines import export_engines, require_tensorrt
from .gguf import check_gguf, hf_folders, is_gguf
from .loading import LoadedModel, check_architecture, load_draft, load_model
from .pair import (added_ids, chat_template, check_vocabularies, eos_ids,
                   generation_defaults, special_tokens, text_settings)
from .parity import check_batch, check_parity, ort_errors
from .qtarget import EXACT_QUANT_GRAPH, ORT_QUANT_NOTE, quantize_target, read_calibration
from .quantize import BITS, check_request, draft_scheme, quantize_draft
from .head_worth import measure_head_worth
from .worth import measure_worth


def export_bundle(config: ExportConfig) -> Manifest:
    """Export `config.target` and `config.draft` into a bundle at `config.output`; a .gguf
    target or draft is first converted into a temporary Hugging Face folder (gguf.py)."""
    log = _Progress(config.quiet)
    _quiet_transformers()
    _check_request(config)
    sources = (config.target, config.draft)
    for source in filter(is_gguf, sources):      # before any conversion: one line each
        check_gguf(Path(source).expanduser())
    with hf_folders(sources, log.print) as (target, draft):
        named = {folder: source for folder, source in zip((target, draft), sources)
                 if folder != source}     # the manifest names the GGUF, not the temporary folder
        return _export(replace(config, target=target, draft=draft), log, named)


def _check_request(config: ExportConfig) -> None:
    """The checks that read no model, before any work."""
    check_output(config.output, config.force)
    if not 1 <= config.max_draft <= 64:
        raise ConfigError(f"--max-draft {config.max_draft} must be between 1 and 64.")
    if not 1 <= config.max_batch <= MAX_BATCH:
        raise ConfigError(f"--max-batch {config.max_batch} must be between 1 and {MAX_BATCH}.")
    if config.max_context is not None and config.max_context < _least_context(config):
        raise ConfigError(f"--max-context {config.max_context} is too small: at least "
                          f"{_least_context(config)} (16, and max_draft + 2 = "
                          f"{config.max_draft + 2} for a prompt token and a verification of "
                          f"max_draft + 1 tokens). ---> HINT: raise --max-context or lower "
                          f"--max-draft.")


def _export(config: ExportConfig, log: _Progress, named: dict[str, str]) -> Manifest:
    mtp_draft = config.draft == MTP_DRAFT    # the target's own MTP layer (§14)
    if mtp_draft:       # a class with MTP layers the toolkit does not read: refused by name
        check_head_request(config, "--draft mtp")
        check_mtp(config.target)      # before any loading: the checkpoint gives a layer
    check_architecture(config.target, "target")
    head_draft = mtp_draft or is_head(config.draft)   # or an EAGLE-3 head, published (§14)
    if not head_draft:
        check_architecture(config.draft, "draft")
    elif not mtp_draft:
        check_head_request(config)
    if config.engines == "trt":          # fail before any work, and write nothing
        if config.graph == contract.ORT:
            raise ConfigError("--graph ort cannot go with --engines trt: TensorRT takes only "
                              "standard ONNX. ---> HINT: drop --graph (or use --graph standard).")
        if config.graph == contract.STATIC:
            raise ConfigError("--graph static cannot go with --engines trt: its caches are bound "
                              "as both an input and an output of one call, which TensorRT does "
                              "not allow. ---> HINT: drop --graph (or use --graph standard).")
        if config.quant == "int8":
            raise ConfigError("--quant int8 cannot go with --engines trt: TensorRT 10 "
                              "quantizes weights alone (weight-only) in INT4 only; INT8 there "
                              "quantizes activations too. ---> HINT: use --quant int4, or "
                              "--engines none.")
        if config.quant_method == "hqq" and config.quant != "none":
            raise ConfigError("--quant-method hqq cannot go with --engines trt: its float zero "
                              "points are ONNX Runtime CPU kernels. ---> HINT: use "
                              "--quant-method rtn.")
        if config.draft_quant == "int8":
            raise ConfigError("--draft-quant int8 cannot go with --engines trt: TensorRT 10 "
                              "quantizes weights alone (weight-only) in INT4 only. ---> HINT: "
                              "use --draft-quant int4 or none.")
        require_tensorrt("--engines trt")
    check_request(config.draft_quant)
    graph, why = choose_graph(config)
    log.print(f"    graph flavour: {graph} ({why})")
    if graph == contract.ORT and config.quant != contract.NO_QUANT and config.max_batch > 1:
        log.print(f"    note: {ORT_QUANT_NOTE}")
    check_target_quant(config, graph)
    heldout = read_calibration(config.calib)[1:]     # the quality report's and the worth's

    with log.stage("load models and tokenizers"):
        target = load_model(config.target, "target", config.dtype)
        draft = None if head_draft else load_draft(config.draft, target, config.dtype)
        for loaded in (target, draft):
            if loaded is not None:
                loaded.source = named.get(loaded.source, loaded.source)
    with log.stage("check the pair"):
        if draft is None:       # read, and checked against the target, before any writing
            head = read_mtp(config.target, target.model) if mtp_draft \
                else read_head(config.draft, target.model)
            log.print(head.describe())
        else:
            head = None
            check_vocabularies(target.tokenizer, draft.tokenizer)
        max_context = _max_context(config, *(m for m in (target, draft) if m is not None))
        prefix, suffix = added_ids(target.tokenizer)
        generation, unapplied = generation_defaults(target.model)
        if unapplied:
            log.print(f"    note: the target's generation_config sets {', '.join(unapplied)}, "
                      f"which the runtime does not apply (its defaults: {generation or 'greedy'})")
        template, note = chat_template(target.tokenizer)
        if note:
            log.print(f"    note: {note}")
        eos = eos_ids(target.model)
        if not eos and target.tokenizer.eos_token_id is not None:
            log.print(f"    note: the target's config and generation_config set no eos_token_id, "
                      f"so generation runs to max_new_tokens as Hugging Face's generate() does, "
                      f"past the tokenizer's eos {target.tokenizer.eos_token!r} "
                      f"(id {target.tokenizer.eos_token_id}); set eos_token_id in "
                      f"generation_config.json to stop there")
    with staging(config.output, config.force) as root:
        traced, parity = {}, {}
        aux = head.config.aux_layer_ids if head is not None else ()
        traced["target"], parity["target"] = _trace_checked(
            target, root / "target" / "model.onnx", max_context, config, graph, log, aux)
        if head is not None:
            traced["draft"], parity["draft"] = head.trace(
                root / "draft" / "model.onnx", max_context, config, traced["target"], log)
        else:
            traced["draft"], parity["draft"] = _trace_checked(
                draft, root / "draft" / "model.onnx", max_context, config, graph, log)
        rows_note = rows.refusal(traced["target"], config.max_batch)
        rows_trace, rows_parity = None, {}
        if not rows_note:       # the rows graph, traced and checked while the target is float
            rows_trace, rows_parity, rows_note = _trace_rows(target, traced["target"],
                                                             max_context, config, log)
        if contract.in_place(traced["draft"].graph):     # the loop reads these (§2)
            append_tops(traced["draft"].path)
            traced["draft"] = replace(traced["draft"], tops=True)
        target_quant, scheme, quality, quant_parity = quantize_target(
            target, traced["target"], config.quant, config.quant_block, config.quant_method,
            config.quant_lm_head, heldout, replace(config, max_context=max_context), log)
        if quant_parity is not None:        # the quantized target is the reference now
            parity["target"] = quant_parity
        rows_file = ""
        if rows_trace is not None:
            with log.stage("the target's rows graph: its weights as the target's"):
                if target_quant != contract.NO_QUANT:
                    rows.quantize_rows(rows_trace.path, scheme, traced["target"].vocab_size)
                out, shared, own = rows.share_weights(rows_trace.path, traced["target"].path)
            log.print(f"    rows graph: {shared / 1e6:.1f} MB of weights read from the "
                      f"target's file, {own / 1e6:.2f} MB of its own")
            rows_file = out.relative_to(root).as_posix()
            if target_quant != contract.NO_QUANT:    # the quantized target is the reference
                with log.stage("parity of the quantized rows graph against Hugging Face with "
                               "the same dequantized weights"):
                    try:
                        rows_parity = rows.parity_quantized(target, out, config, max_context)
                    except (SsdError, *ort_errors()) as exc:
                        rows.drop(out.parent)
                        rows_file, rows_parity = "", {}
                        rows_note = f"refused: {str(exc).splitlines()[0]}"
                        log.print(f"    target: no rows graph ({rows_note})")
        quant, agreement = (contract.NO_QUANT, None) if head is not None else quantize_draft(
            traced["draft"], config.draft_quant, config.dtype, max_context, log,
            follow=target_quant)
        with log.stage("write heads and tokenizer"):
            heads = {name: f"heads/{file}" for name, file in write_heads(root / "heads").items()}
            target.tokenizer.save_pretrained(root / "tokenizer")
        manifest = Manifest(
            max_context=max_context, max_draft=config.max_draft,
            target=replace(_entry(root, target, traced["target"], parity["target"]),
                           aux_layer_ids=list(aux),
                           quant=target_quant,
                           quant_scheme=scheme.as_dict() if scheme else {},
                           quant_quality=quality.as_dict() if quality else {},
                           rows=rows_file, rows_parity=rows_parity, rows_note=rows_note,
                           fused=traced["target"].fused or bool(rows_file and rows_trace.fused)),
            draft=head.entry(root, traced["draft"], parity["draft"])
            if head is not None else
            replace(_entry(root, draft, traced["draft"], parity["draft"]), quant=quant,
                          quant_agreement=agreement,
                          quant_scheme=draft_scheme(quant, traced["draft"].graph).as_dict()
                          if quant in BITS else {}),
            tokenizer=TokenizerEntry(
                path="tokenizer/tokenizer.json", prefix_ids=prefix, suffix_ids=suffix,
                eos_token_ids=eos,
                bos_token_id=target.tokenizer.bos_token_id,
                pad_token_id=target.tokenizer.pad_token_id,
                chat_template=template, special_tokens=special_tokens(target.tokenizer),
                **text_settings(target.tokenizer)),
            heads=heads, build=_build_info(config), generation=generation,
            max_batch=config.max_batch,
            requires=(["tree"] if traced["target"].tree else [])
            + (["spare_rows"] if traced["target"].spare_rows else []),
        )
        if config.max_batch > 1:
            with log.stage("check batches of rows at their own lengths"):
                manifest = _check_rows_batch(root, manifest, log)
                if head is None:        # a head's batch: head_parity's third call
                    check_batch(root, manifest, "draft")
        manifest = replace(manifest, engines=export_engines(
            root, manifest, config.engines, config.engine_precision, log, config.output))
        with log.stage("the pair's worth: agreement on held-out text and a quick timing"):
            worth = (measure_worth if head is None else measure_head_worth)(   # design §6
                root, manifest, target.tokenizer, heldout, own=config.calib is None)
        log.print(worth.line())
        if head is None and (warning := worth.warning(manifest.draft.quant)):
            log.print(warning)
        with log.stage("write the manifest"):
            manifest = finish_manifest(root, replace(manifest, pair_worth=worth.as_dict()))
    log.done(config.output)
    return manifest


def check_target_quant(config: ExportConfig, graph: str) -> None:
    """Refuse, before any work, a target quantization that cannot be written or run here."""
    if config.quant == contract.NO_QUANT:
        return
    import onnxruntime as ort

    for kind in ("int4", "int8") if config.quant == "auto" else (config.quant,):
        oldest = contract.oldest_onnxruntime(
            graph, kind, form=contract.MATMULNBITS if graph == contract.ORT
            else contract.DEQUANTIZE)
        if oldest and contract.version_tuple(ort.__version__) < oldest[0]:
            raise ConfigError(f"--quant {config.quant}: {oldest[1]} need onnxruntime >= "
                              f"{contract.version_text(oldest[0])} (found {ort.__version__}). "
                              f"---> HINT: pip install -U onnxruntime, or use --quant none.")
    if config.quant_method == "hqq":
        if config.quant == "int8":
            raise ConfigError("--quant-method hqq is 4-bit only here (ONNX Runtime has no CPU "
                              "kernel for 8-bit weights with float zero points). ---> HINT: "
                              "use --quant int4, or --quant-method rtn.")
        if graph != contract.ORT:
            raise ConfigError(f"--quant-method hqq writes MatMulNBits with float zero points, "
                              f"which only the ort flavour takes ({graph} graph here: "
                              f"DequantizeLinear's zero point is an integer, and TensorRT takes "
                              f"none). ---> HINT: use --quant-method rtn, or --graph ort.")
    if config.quant == "int8" and config.quant_compute == "float":
        raise ConfigError("--quant int8 --quant-compute float: ONNX Runtime has no fast CPU "
                          "kernel for 8-bit weights computed in float (measured 13x slower "
                          "than float32 weights on a 360M model). ---> HINT: use --quant-compute "
                          "int8, or --quant int4 --quant-compute float.")


def choose_graph(config: ExportConfig) -> tuple[str, str]:
    """The graph flavour to write, and why (contract.py has what each one is)."""
    import onnxruntime as ort

    if config.graph == contract.ORT and not contract.runs_ort_flavour(ort.__version__):
        raise ConfigError(f"--graph ort needs onnxruntime >= "
                          f"{contract.ORT_FLAVOUR_MIN_TEXT} (found "
                          f"{ort.__version__}). ---> HINT: pip install -U onnxruntime.")
    if config.graph != "auto":
        return config.graph, "--graph"
    if config.engines == "trt":
        return contract.STANDARD, "TensorRT engines take standard ONNX"
    if not contract.runs_ort_flavour(ort.__version__):
        return contract.STANDARD, f"onnxruntime {ort.__version__} is too old for the ort flavour"

    if "CUDAExecutionProvider" in ort.get_available_providers():
        return contract.STANDARD, "onnxruntime has CUDA here; the ort flavour is CPU-only"
    if config.engines == "auto":
        version, gpu, _ = probe_tensorrt()
        if version is not None and gpu is not None:
            return contract.STANDARD, "TensorRT and a GPU are here"
    if config.quant != contract.NO_QUANT and config.quant_method != "hqq":
        # (HQQ's float zero points are MatMulNBits only, the ort flavour: it keeps that form)
        return EXACT_QUANT_GRAPH, ("a quantized target: plain-ONNX attention keeps a row's "
                                   "logits the same alone, among k+1 rows and beside other "
                                   "sequences, so speculation equals k=0; design §12")
    return contract.ORT, ("no TensorRT or CUDA here: ONNX Runtime CPU kernels; "
                          "--graph standard for a bundle that also runs on GPUs")


def takes_trees(trees: str, graph: str) -> bool:
    """Whether a target of this flavour is traced with the tree input under --trees: auto
    leaves it out of the standard flavour, where it costs every call a few percent on a CPU
    and the GPU backends verify chains only (design §2, "Trees")."""
    return trees == "on" or trees == "auto" and graph != contract.STANDARD


def _trace_checked(loaded: LoadedModel, path: Path, max_context: int, config: ExportConfig,
                   graph: str, log, aux: tuple[int, ...] = ()
                   ) -> tuple[TracedModel, dict[str, float]]:
    """Trace and check one model (`aux`: a head's feature layers, one more output). With
    --graph auto a model the ort flavour cannot express or reproduce (ALiBi, a graph ONNX
    Runtime refuses, a parity failure) falls back to the standard graph, saying why; any
    other exception is a bug and propagates."""
    role = loaded.role
    try:
        with log.stage(f"trace the {role} ({loaded.architecture}, {graph} graph)"):
            # a target takes draft trees where its flavour can and --trees asks (design §2)
            traced = export_decoder(loaded.model, loaded.source, path, max_context, graph, aux,
                                    tree=role == "target" and takes_trees(config.trees, graph),
                                    exact=role == "target")
        if traced.moe_note:
            log.print(f"    {role}: {traced.moe_note}")
        if traced.tree_note:
            log.print(f"    {role}: no draft trees ({traced.tree_note})")
        with log.stage(f"parity of the {role} against Hugging Face"):
            return traced, check_parity(loaded.model, traced.path, role, config.max_draft,
                                        config.dtype, max_context, graph=graph,
                                        aux_layers=aux)
    except (SsdError, *ort_errors()) as exc:   # a refusal (ours or ONNX Runtime's), a parity
        # failure: the standard graph is tried next, or it re-raises; anything else is a bug
        if graph == contract.STANDARD or config.graph != "auto":
            raise
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.print(f"    {role}: the ort flavour does not fit ({why}); using the standard graph")
        shutil.rmtree(path.parent, ignore_errors=True)
        return _trace_checked(loaded, path, max_context, config, contract.STANDARD, log, aux)


def _trace_rows(loaded: LoadedModel, traced: TracedModel, max_context: int,
                config: ExportConfig, log) -> tuple[TracedModel | None, dict[str, float], str]:
    """The target's rows graph traced and checked against Hugging Face: (its trace, parity,
    ""), or (None, {}, why not) where ONNX Runtime or parity refuses it: never a wrong graph."""
    try:
        with log.stage("trace the target's rows graph (a batch's k+1 tokens in one call)"):
            rows_traced = rows.trace_rows(export_decoder, loaded, traced, max_context)
        with log.stage("parity of the rows graph against Hugging Face"):
            parity = check_parity(loaded.model, rows_traced.path, "target rows", config.max_draft,
                                  config.dtype, max_context, graph=contract.ROWS,
                                  aux_layers=traced.aux_layer_ids)
        return rows_traced, parity, ""
    except (SsdError, *ort_errors()) as exc:
        rows.drop(traced.path.parent)
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.print(f"    target: no rows graph ({why}); a batch verifies one row at a time")
        return None, {}, f"refused: {why}"


def _check_rows_batch(root: Path, manifest: Manifest, log) -> Manifest:
    """check_batch of the target, whose several-token rows run in the rows graph where the
    bundle has one; a rows graph that fails it is removed (and the target checked again)."""
    entry = manifest.target
    try:
        worst = check_batch(root, manifest, "target")
    except SsdError as exc:
        if not entry.rows:
            raise
        rows.drop((root / entry.path).parent)
        why = str(exc).splitlines()[0]
        log.print(f"    target: rows graph removed ({why}); a batch verifies one row at a time")
        manifest = replace(manifest, target=replace(entry, rows="", rows_parity={},
                                                    rows_note=f"refused: {why}"))
        check_batch(root, manifest, "target")
        return manifest
    if entry.rows:
        manifest = replace(manifest, target=replace(
            entry, rows_parity={**entry.rows_parity, "in_batch": worst}))
    return manifest


def _quiet_transformers() -> None:
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


MIN_CONTEXT = 16


def _least_context(config: ExportConfig) -> int:
    """A prompt token and a verification of max_draft + 1 tokens; and tracing takes example
    sizes of up to 10 rows (graphs/trace.py), so 16 at the least."""
    return max(MIN_CONTEXT, config.max_draft + 2)


def _max_context(config: ExportConfig, *models: LoadedModel) -> int:
    # MPT names its limit max_seq_len (its ALiBi table in Hugging Face ends there)
    limits = {m.role: int(getattr(m.model.config, "max_position_embeddings", 0)
                          or getattr(m.model.config, "max_seq_len", 0) or 0) for m in models}
    model_limit = min((v for v in limits.values() if v > 0), default=DEFAULT_MAX_CONTEXT)
    if config.max_context is None:
        if model_limit < _least_context(config):
            raise ConfigError(f"the models' limit (max_position_embeddings: {limits}) is below "
                              f"the least context a bundle needs, {_least_context(config)} "
                              f"(16, and max_draft + 2). ---> HINT: lower --max-draft.")
        return min(DEFAULT_MAX_CONTEXT, model_limit)
    if config.max_context > model_limit:
        raise ConfigError(f"--max-context {config.max_context} exceeds the models' limit "
                          f"(max_position_embeddings: {limits}); use at most {model_limit}.")
    return config.max_context


def _entry(root: Path, loaded: LoadedModel, traced: TracedModel,
           parity: dict[str, float]) -> ModelEntry:
    return ModelEntry(
        path=traced.path.relative_to(root).as_posix(), architecture=loaded.architecture,
        source=str(loaded.source), num_layers=traced.num_layers,
        num_kv_heads=traced.num_kv_heads, head_dim=traced.head_dim,
        vocab_size=traced.vocab_size, kv_dtype=traced.kv_dtype, logits_dtype="float32",
        inputs=contract.input_names(traced.num_layers, traced.graph)
        + ([contract.TREE_MASK] if traced.tree else []),
        outputs=contract.output_names(traced.num_layers, traced.graph, bool(traced.aux_layer_ids))
        + ([contract.TOP_ID, contract.TOP_PROB] if traced.tops else []),
        parameters=traced.parameters, parity=parity, graph=traced.graph, moe=traced.moe,
        fused=traced.fused, tree=traced.tree, tree_note=traced.tree_note,
        spare_rows=traced.spare_rows)


def _build_info(config: ExportConfig) -> dict:
    import onnx
    import onnxruntime
    import torch
    import transformers

    return {"toolkit": __version__, "created": strftime("%Y-%m-%dT%H:%M:%S%z"),
            "dtype": config.dtype, "opset": OPSET, "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "engines": config.engines, "command": " ".join(sys.argv)}


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet, self.start, self.n = quiet, perf_counter(), 0

    def stage(self, what: str):
        self.n += 1
        return _Stage(self, what)

    def print(self, text: str) -> None:
        if not self.quiet:
            print(text, file=sys.stderr, flush=True)

    def done(self, output: Path) -> None:
        self.print(f"ssd-export: wrote {output} in {perf_counter() - self.start:.1f} s")


class _Stage:
    def __init__(self, progress: _Progress, what: str) -> None:
        self.progress, self.what = progress, what

    def __enter__(self) -> None:
        self.t0 = perf_counter()
        self.progress.print(f"[{self.progress.n}] {self.what} …")

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.progress.print(f"[{self.progress.n}] {self.what}: {perf_counter() - self.t0:.1f} s")
