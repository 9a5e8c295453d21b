"""A GGUF file (llama.cpp's format) as a float Hugging Face folder: `ssd-gguf-to-hf MODEL.gguf
OUT/`, and what `ssd-export --target MODEL.gguf` (or `--draft`) converts into a temporary folder
first. Transformers' GGUF reader (the `gguf` package) reads the config, the tokenizer with its
chat template, and the weights, dequantized: the float model is what gets exported.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ssd_runtime.errors import ConfigError

GGUF_MAGIC = b"GGUF"        # the first four bytes of every GGUF file
GGUF_SUFFIX = ".gguf"
DTYPES = ("float32", "float16", "bfloat16")
INSTALL_HINT = "---> HINT: pip install gguf (or pip install 'ssd-toolkit[gguf]')"


def is_gguf(source: str | Path) -> bool:
    """Whether a --target or --draft names a GGUF file (by its suffix, as llama.cpp's do)."""
    return str(source).lower().endswith(GGUF_SUFFIX)


def check_gguf(path: Path) -> None:
    """Fail before any work, in one line: a missing file, a file that is not GGUF, or no
    `gguf` package to read it with."""
    if not path.exists():
        raise ConfigError(f"GGUF file {str(path)!r} does not exist.")
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} is not a file; a GGUF model is one .gguf file.")
    with path.open("rb") as f:
        magic = f.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise ConfigError(f"{str(path)!r} is not a GGUF file: it starts with {magic!r}, not "
                          f"{GGUF_MAGIC!r}. ---> HINT: pass a model file written by llama.cpp "
                          f"(its convert_hf_to_gguf.py) or a Hugging Face model folder.")
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader imports it)
    except ImportError:
        raise ConfigError(f"reading {path.name} needs the `gguf` package, which is not "
                          f"installed. {INSTALL_HINT}") from None


def gguf_to_hf(gguf: Path, output: Path, dtype: str = "float32", force: bool = False,
               say: Callable[[str], None] = lambda text: None) -> Path:
    """Write `gguf` as a Hugging Face folder at `output` (config, safetensors, tokenizer, chat
    template, SOURCE.md) through a temporary folder beside it, renamed into place: a failure
    leaves no `output` behind. Returns `output`."""
    gguf, output = Path(gguf), Path(output)
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
    check_gguf(gguf)
    if output.exists() and not force:
        raise ConfigError(f"output {str(output)!r} already exists. ---> HINT: pass --force to "
                          f"replace it, or choose another folder.")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        _convert(gguf, tmp, dtype, say)
        if output.exists():
            shutil.rmtree(output)
        tmp.rename(output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return output


@contextmanager
def hf_folders(sources: Sequence[str], say: Callable[[str], None]) -> Iterator[list[str]]:
    """`sources` with each .gguf among them converted (once, float32) into a temporary
    Hugging Face folder, which is removed on leaving; other sources pass through."""
    if not any(is_gguf(s) for s in sources):
        yield list(sources)
        return
    with tempfile.TemporaryDirectory(prefix="ssd-gguf-") as root:
        folders: dict[str, str] = {}
        for source in sources:
            if is_gguf(source) and source not in folders:
                gguf = Path(source).expanduser()
                say(f"    {source}: a GGUF file, converted to a temporary Hugging Face folder")
                out = Path(root) / f"{len(folders)}-{gguf.stem}"    # two files, one stem
                folders[source] = str(gguf_to_hf(gguf, out, say=say))
        yield [folders.get(s, s) for s in sources]


def _convert(gguf: Path, out: Path, dtype: str, say: Callable[[str], None]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging

    logging.disable_progress_bar()      # transformers' own (the reader's tqdm bar stays)
    folder, name, torch_dtype = str(gguf.parent), gguf.name, getattr(torch, dtype)
    try:
        say(f"    read the config and tokenizer of {name}")
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        say(f"    dequantize its weights to {dtype}")
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
        # the reader maps GGUF tensor names onto this model's parameters (and undoes
        # llama.cpp's q/k permutation); a tied LM head is not in the file
        weights = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model,
                                       torch_dtype=torch_dtype)["tensors"]
    except Exception as exc:    # a damaged file breaks the reader anywhere (numpy, struct)
        raise ConfigError(f"{name} cannot be read as a Hugging Face causal LM: "
                          f"{_first_line(exc)}") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) | {"lm_head.weight"}
    if unexpected or [k for k in missing if k not in tied]:
        raise ConfigError(f"{name}: its tensors do not fill the model its config describes "
                          f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}).")
    model.tie_weights()
    say(f"    write {dtype} safetensors, tokenizer and chat template")
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    template = getattr(tokenizer, "chat_template", None)
    if template and not (out / "chat_template.jinja").exists():   # older transformers
        cfg_path = out / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.setdefault("chat_template", template)
        cfg_path.write_text(json.dumps(cfg, indent=2))
    (out / "SOURCE.md").write_text(
        f"Dequantized to {dtype} from `{name}` by ssd-gguf-to-hf (transformers' GGUF reader). "
        f"The GGUF's own licence applies.\n")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
