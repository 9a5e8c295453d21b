"""The bundle manifest: schema, reading with validation, checksums.

The runtime trusts this file alone (docs/design.md §8); the exporter
writes it through `Manifest.to_dict` so that both sides share one schema.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import cache, contract
from .errors import BundleError

FORMAT = "ssd-bundle"
SCHEMA_VERSION = 14         # 2: models carry "graph" (flavour); 1 reads as "standard"
                            # 3: models carry "quant" (weights); 1 and 2 read as "none"
                            # 4: models carry "moe" (how MoE layers run); 1-3 read as "none"
                            # 5: tokenizer carries "special_tokens" (text), "split_special_tokens"
                            #    and "clean_up_spaces"; 1-4 read as {}, false, false
                            # 6: "max_batch", the largest batch the graphs were exported and
                            #    checked for with rows of their own lengths (docs/design.md
                            #    §11); 1-5 read as 1
                            # 7: models carry "quant_scheme" (bits, block, method, form, ...) and
                            #    "quant_quality" (the report against the float model), and a
                            #    target may be quantized (docs/design.md §12); 1-6 read as {},
                            #    their quantized drafts as MatMulNBits
                            # 8: models carry "rows" (an ort target's second graph for several
                            #    rows of several new tokens in one call, contract.ROWS),
                            #    "rows_parity" and "rows_note" (why there is none); 1-7 read
                            #    as "": verifications of a batch run one row at a time
                            # 9: models carry "kind" (contract.KINDS: the draft may be an EAGLE-3
                            #    head), "aux_layer_ids" (the layers whose entering stream the
                            #    target outputs as aux_hidden, and a head reads) and "head" (its
                            #    settings, HEAD_FIELDS); 1-8 read as "model", [], {}
                            # 10: a static graph's inputs end with "attend_rows" (its
                            #    attention reads cache rows [0, L), L that input's length,
                            #    contract.ATTEND_ROWS); 1-9 have none and attend over every
                            #    row (the runtime asks the session which it has)
                            # 11: a draft's "kind" may be "mtp" (the target's own MTP layer,
                            #    docs/design.md §14.1: features of width H, the last layer's
                            #    final-normed output); 1-10 know "model" and "eagle3" only
                            # 12: models carry "fused" (a static or rows graph written in
                            #    fused operators of ONNX opset 23, docs/design.md §12, which
                            #    onnxruntime before contract.STATIC_FUSED_MIN refuses with an
                            #    error of its own); 1-11 read as false
                            # 13: models carry "tree" (the ort target's graph takes draft trees:
                            #    contract.TREE_MASK, docs/design.md §2) and "tree_note" (why
                            #    not); 1-12 read as false. The manifest's "requires" names what
                            #    a runtime must know to run it (REQUIRES): a newer bundle's
                            #    unknown names are the refusal's words
                            # 14: models carry "spare_rows" (an ort target's attention reads
                            #    two rows at least and writes its dummy one row past the
                            #    last: its arenas hold max_context + spare_rows rows,
                            #    docs/design.md §12); 1-13 read as 0, and such a target
                            #    requires "spare_rows"
# what a bundle may require by name (Manifest.requires) and this runtime runs: "tree", a target
# graph that takes draft trees (a runtime before schema 13 refuses it by its schema_version);
# "spare_rows", arenas of max_context + ModelEntry.spare_rows rows
REQUIRES = ("tree", "spare_rows")
MAX_BATCH = 64              # the batch axis' bound in the traced graphs (graphs/trace.py)
# an EAGLE-3 head's settings in ModelEntry.head (docs/design.md §14): the published layout it
# was read from ("safeailab" or "speculators"), its width H, the target's width Ht (features
# are 3·Ht), its draft vocabulary, where its residual starts, and whose embedding table the
# graph holds ("head": its own; "target": a copy of the target's)
HEAD_FIELDS = ("layout", "hidden_size", "target_hidden_size", "draft_vocab_size",
               "norm_before_residual", "embedding")
MANIFEST_NAME = "manifest.json"
_HINT = "---> HINT: re-run ssd-export to rebuild the bundle."


@dataclass(frozen=True)
class ModelEntry:
    """One exported decoder graph and the dimensions of its KV cache."""

    path: str                 # relative to the bundle root
    architecture: str         # Hugging Face class name, for people only
    source: str               # folder or hub id it was exported from
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    kv_dtype: str             # "float32" | "float16"
    logits_dtype: str
    inputs: list[str]
    outputs: list[str]
    parameters: int = 0
    parity: dict[str, float] = field(default_factory=dict)
    graph: str = "standard"   # contract.GRAPHS: "standard" (any backend), "ort" (ORT CPU), "static"
    quant: str = "none"       # contract.QUANTS: "none", or weight-only "int8"/"int4" (ORT CPU)
    quant_agreement: float | None = None   # top-1 agreement with the float graph, if quantized
    quant_scheme: dict[str, Any] = field(default_factory=dict)   # qweights.Scheme, if quantized
    quant_quality: dict[str, Any] = field(default_factory=dict)  # the target's report (§12)
    moe: str = "none"         # contract.MOES: MoE layers "none", "dense" or "kernel" (ORT's MoE)
    # an ort target with max_batch > 1: the rows graph (contract.ROWS), relative to the bundle
    # root, its weights in the target's external data file; its parity (against Hugging Face,
    # and each row of a batch against the row alone); or "" and why not (docs/design.md §11)
    rows: str = ""
    rows_parity: dict[str, float] = field(default_factory=dict)
    rows_note: str = ""
    # schema 9 (docs/design.md §14): a decoder "model", an "eagle3" head or the target's own
    # "mtp" layer (contract.KINDS; only a draft may be a head); the layers, in order, whose
    # entering residual stream the target outputs as contract.AUX_HIDDEN and the head reads
    # as its features ([]: none; an MTP head's [L]: the last layer's output, final-normed);
    # the head's settings (HEAD_FIELDS; {} for a model)
    kind: str = contract.MODEL
    aux_layer_ids: list[int] = field(default_factory=list)
    head: dict[str, Any] = field(default_factory=dict)
    fused: bool = False       # schema 12: the layer in fused operators (contract.STATIC_FUSED_MIN)
    # schema 13: the graph takes contract.TREE_MASK, a verification over a draft tree
    # (docs/design.md §2, "Trees"); or "" and why an ort target's does not
    tree: bool = False
    tree_note: str = ""
    # schema 14: cache rows past max_context that the graph writes (an ort target's dummy
    # attention row, graphs/two_rows.py): the runtime's arenas hold max_context + this many
    spare_rows: int = 0

    @property
    def quant_form(self) -> str:
        """How quantized weights are written: contract.MATMULNBITS (ONNX Runtime's CPU contrib
        op; every quantized graph before schema 7) or contract.DEQUANTIZE (standard ONNX)."""
        if self.quant == contract.NO_QUANT:
            return ""
        return str(self.quant_scheme.get("form", contract.MATMULNBITS))

    @property
    def cpu_only(self) -> str:
        """What makes this graph CPU-only ("" if nothing): the "ort" flavour, MatMulNBits."""
        what = (["the 'ort' graph flavour"] if self.graph == contract.ORT else []) + \
            ([f"{self.quant} MatMulNBits weights"] if self.quant_form == contract.MATMULNBITS
             else [])
        return " with ".join(what)


@dataclass(frozen=True)
class TokenizerEntry:
    """How to turn text into the ids the Hugging Face tokenizer would give."""

    path: str                 # tokenizer.json, relative to the bundle root
    prefix_ids: list[int]     # added before the text (e.g. BOS)
    suffix_ids: list[int]     # added after the text (e.g. EOS for some models)
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    chat_template: str | None = None
    # the Hugging Face tokenizer's bos/eos/pad/unk tokens as text, which chat templates read
    # ({{ eos_token }}); its eos may differ from the generation_config's eos_token_ids[0]
    # (Llama 3 Instruct: <|eot_id|> against <|end_of_text|>)
    special_tokens: dict[str, str] = field(default_factory=dict)
    # settings of the Hugging Face tokenizer that tokenizer.json does not hold: special-token
    # strings in a text encoded as plain text; decode's clean_up_tokenization (" ." -> "."),
    # as Hugging Face applies it (it skips it for BPE models)
    split_special_tokens: bool = False
    clean_up_spaces: bool = False


@dataclass(frozen=True)
class EngineEntry:
    """One TensorRT engine built from a model's ONNX graph for one GPU and TensorRT version."""

    model: str                # "target" | "draft"
    path: str                 # engines/<gpu-slug>-trt<version>/<model>.plan
    sha256: str
    gpu_name: str             # as the CUDA driver names it, e.g. "NVIDIA H200"
    compute_capability: str   # "9.0"
    tensorrt_version: str     # the builder's trt.__version__
    precision: str            # "fp32" | "fp16" | "bf16"
    version_compatible: bool  # built with BuilderFlag.VERSION_COMPATIBLE
    profiles: list[dict[str, Any]]   # [{"name", "new_len": [min, opt, max], "past_len", "batch"}]


@dataclass(frozen=True)
class Manifest:
    max_context: int
    max_draft: int
    target: ModelEntry
    draft: ModelEntry
    tokenizer: TokenizerEntry
    heads: dict[str, str] = field(default_factory=dict)   # head name -> relative path
    build: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)   # relative path -> sha256
    engines: list[EngineEntry] = field(default_factory=list)   # TensorRT engines, if built
    generation: dict[str, Any] = field(default_factory=dict)  # the target's explicit
                                          # generation_config: do_sample, temperature, top_k,
                                          # top_p, repetition_penalty (the runtime's defaults)
    max_batch: int = 1        # sequences one call may carry, each at its own length
    # what the exporter measured of the pair and predicted from it (docs/design.md §6, §8):
    # agreement, alpha, tokens, text, backend, c, c_first, v, speedups, best_k, speedup,
    # pays, note; {} when not measured (an optional key: a bundle without it reads as {})
    pair_worth: dict[str, Any] = field(default_factory=dict)
    # what a runtime must know to run the bundle, by name (REQUIRES; schema 13 on)
    requires: list[str] = field(default_factory=list)
    format: str = FORMAT
    schema_version: int = SCHEMA_VERSION

    @property
    def cpu_only(self) -> str:
        """Why the bundle runs on ONNX Runtime's CPU kernels only (no TensorRT engines, no ORT
        CUDA), or "" when it does not."""
        return self.cpu_only_of(("target", "draft"))

    def cpu_only_of(self, roles: tuple[str, ...]) -> str:
        """cpu_only for these models alone (("target",): a CPU draft beside a GPU target)."""
        why = [f"the {role} is {getattr(self, role).cpu_only}" for role in roles
               if getattr(self, role).cpu_only]
        return f"{' and '.join(why)}, built for ONNX Runtime's CPU kernels" if why else ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        """sha256 of the manifest, which holds every file's sha256: the bundle a remembered
        timing was measured on (cache.measurement_key)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = MANIFEST_NAME) -> Manifest:
        if data.get("format") != FORMAT:
            raise BundleError(f"{where}: format is {data.get('format')!r}, expected {FORMAT!r}; "
                              f"this is not an SSD bundle. {_HINT}")
        version = data.get("schema_version")
        if not isinstance(version, int):
            raise BundleError(f"{where}: schema_version is {version!r}, expected an integer. {_HINT}")
        unknown = [str(r) for r in data.get("requires", []) if r not in REQUIRES] \
            if isinstance(data.get("requires", []), list) else ["requires"]
        if version > SCHEMA_VERSION or unknown:
            needs = f" and needs {', '.join(map(repr, unknown))}, which this runtime predates" \
                if unknown else ""
            raise BundleError(f"{where}: schema_version {version} is newer than this runtime reads "
                              f"(up to {SCHEMA_VERSION}){needs}. ---> HINT: upgrade ssd-toolkit "
                              f"(pip install -U ssd-toolkit) or re-export with this version.")
        try:
            manifest = cls(
                max_context=int(data["max_context"]),
                max_draft=int(data["max_draft"]),
                target=ModelEntry(**data["models"]["target"]),
                draft=ModelEntry(**data["models"]["draft"]),
                tokenizer=TokenizerEntry(**data["tokenizer"]),
                heads=dict(data.get("heads", {})),
                build=dict(data.get("build", {})),
                files=dict(data.get("files", {})),
                engines=[EngineEntry(**e) for e in data.get("engines", [])],
                generation=_generation(data.get("generation", {})),
                max_batch=int(data.get("max_batch", 1)),
                pair_worth=_pair_worth(data.get("pair_worth", {})),
                requires=[str(r) for r in data.get("requires", [])],
                schema_version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"{where}: missing or malformed field ({exc}). {_HINT}") from None
        for role, entry in (("target", manifest.target), ("draft", manifest.draft)):
            if entry.graph not in contract.GRAPHS:
                raise BundleError(f"{where}: models.{role}.graph is {entry.graph!r}, expected one "
                                  f"of {list(contract.GRAPHS)}. {_HINT}")
            if entry.quant not in contract.QUANTS:
                raise BundleError(f"{where}: models.{role}.quant is {entry.quant!r}, expected one "
                                  f"of {list(contract.QUANTS)}. {_HINT}")
            if entry.moe not in contract.MOES:
                raise BundleError(f"{where}: models.{role}.moe is {entry.moe!r}, expected one "
                                  f"of {list(contract.MOES)}. {_HINT}")
            if type(entry.spare_rows) is not int or not 0 <= entry.spare_rows <= 8:
                raise BundleError(f"{where}: models.{role}.spare_rows is {entry.spare_rows!r}, "
                                  f"expected an integer from 0 to 8. {_HINT}")
        _check_head(manifest, where)
        if not 1 <= manifest.max_batch <= MAX_BATCH:
            raise BundleError(f"{where}: max_batch is {manifest.max_batch}, expected 1 to "
                              f"{MAX_BATCH}. {_HINT}")
        if manifest.max_draft < 1 or manifest.max_context < manifest.max_draft + 2:
            raise BundleError(f"{where}: max_context {manifest.max_context} leaves no room for a "
                              f"prompt token and a verification of max_draft + 1 = "
                              f"{manifest.max_draft + 1} tokens. ---> HINT: re-export with "
                              f"--max-context of at least {manifest.max_draft + 2} or a smaller "
                              f"--max-draft.")
        return manifest


def _check_head(manifest: Manifest, where: str) -> None:
    """A head draft (EAGLE-3, MTP) and its target agree: the target outputs the features the
    head reads."""
    target, draft = manifest.target, manifest.draft
    for role, entry in (("target", target), ("draft", draft)):
        if entry.kind not in contract.KINDS:
            raise BundleError(f"{where}: models.{role}.kind is {entry.kind!r}, expected one of "
                              f"{list(contract.KINDS)}. {_HINT}")
        ids = entry.aux_layer_ids
        if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise BundleError(f"{where}: models.{role}.aux_layer_ids is {ids!r}, expected a "
                              f"list of layer numbers. {_HINT}")
    if target.kind != contract.MODEL:
        raise BundleError(f"{where}: models.target.kind is {target.kind!r}; a target is a "
                          f"model. {_HINT}")
    if draft.kind == contract.MODEL:
        if target.aux_layer_ids or contract.AUX_HIDDEN in target.outputs:
            raise BundleError(f"{where}: the target outputs {contract.AUX_HIDDEN} but the draft "
                              f"is not a head (EAGLE-3 or MTP). {_HINT}")
        return
    missing = [k for k in HEAD_FIELDS if k not in draft.head]
    features = 1 if draft.kind == contract.MTP else 3   # MTP: the last hidden state, normed
    if (missing or len(draft.aux_layer_ids) != features
            or draft.aux_layer_ids != target.aux_layer_ids
            or contract.AUX_HIDDEN not in target.outputs
            or contract.HIDDEN_OUT not in draft.outputs):
        raise BundleError(f"{where}: the draft is a head ({draft.kind}) but the bundle does not "
                          f"describe it whole (head fields missing: {missing}; aux layers: "
                          f"target {target.aux_layer_ids}, head {draft.aux_layer_ids}; "
                          f"{contract.AUX_HIDDEN} among the target's outputs: "
                          f"{contract.AUX_HIDDEN in target.outputs}). {_HINT}")


def _generation(data: Any) -> dict[str, Any]:
    """The recorded generation defaults, checked: unknown keys or non-numbers are malformed."""
    kinds = {"do_sample": (bool,), "temperature": (int, float), "top_k": (int,),
             "top_p": (int, float), "repetition_penalty": (int, float)}
    if not isinstance(data, dict) or any(key not in kinds or not isinstance(value, kinds[key])
                                         for key, value in data.items()):
        raise ValueError(f"generation: {data!r}")
    return dict(data)


def _pair_worth(data: Any) -> dict[str, Any]:
    """The recorded worth of the pair: an object (its values are for people and tools; the
    runtime decides nothing from them), else malformed."""
    if not isinstance(data, dict):
        raise ValueError(f"pair_worth: {data!r}")
    return dict(data)


def manifest_json(manifest: Manifest) -> str:
    """The manifest as written to disk: models grouped under "models"."""
    data = manifest.to_dict()
    data["models"] = {"target": data.pop("target"), "draft": data.pop("draft")}
    head = {"format": data.pop("format"), "schema_version": data.pop("schema_version")}
    return json.dumps({**head, **data}, indent=2) + "\n"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(bundle: str | Path, verify: bool = True) -> Manifest:
    """Read and validate `bundle/manifest.json`; check every file's sha256."""
    root = Path(bundle)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise BundleError(f"bundle folder {root} does not exist. ---> HINT: pass the folder "
                          f"written by ssd-export --output.")
    if not path.is_file():
        raise BundleError(f"{path} not found: {root} is not an SSD bundle. {_HINT}")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: cannot parse JSON ({exc}). {_HINT}") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: expected a JSON object. {_HINT}")
    manifest = Manifest.from_dict(data, where=str(path))
    if verify:
        verify_files(root, manifest)
    return manifest


def verify_files(root: Path, manifest: Manifest) -> None:
    """Every listed file has the manifest's sha256. A file hashed by an earlier load and not
    changed since (same size, mtime, ctime, inode and device: cache.checked) is not hashed
    again; any write changes its ctime, so a modified file is hashed and refused."""
    needed = {manifest.target.path, manifest.draft.path, manifest.tokenizer.path}
    unlisted = needed - set(manifest.files)
    if unlisted:
        raise BundleError(f"{root / MANIFEST_NAME}: no checksum for {sorted(unlisted)}. {_HINT}")
    for rel, expected in sorted(manifest.files.items()):
        file = root / rel
        if not file.is_file():
            raise BundleError(f"bundle file {file} is missing. {_HINT}")
        stat = cache.file_stat(file)                 # taken before hashing: what was hashed
        if cache.checked(file, stat, expected):
            continue
        found = sha256_file(file)
        if found != expected:
            raise BundleError(f"bundle file {file} was modified: sha256 {found[:12]}… does not "
                              f"match the manifest's {expected[:12]}…. {_HINT}")
        cache.remember_checked(file, stat, expected)
