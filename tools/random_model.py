"""A Hugging Face model folder with RANDOM weights in a published model's configuration.

For measuring speed on models of a real size without downloading anything: the shapes (and so
the FLOPs and the bytes of weights each step moves) are the published model's; the weights are
random (seeded), so its text is noise and a draft for it would be meaningless (measure it at
k=0). The tokenizer is the demo pair's (examples/demo-pair/target: 2,048 tokens, <s>=0,
</s>=1, <pad>=2) while the config keeps the published vocabulary size: the embedding and the
LM head are padded past the tokenizer, as many published models are, which ssd-export
supports; the LM head's cost is the published one's. The padded rows are zero (their logits
are 0, so greedy decoding picks real tokens, whose text streams).

    python tools/random_model.py --config smollm2-360m --output /tmp/smollm2-360m-random
    python tools/random_model.py --config tiny-llama --output /tmp/tiny-draft  # a draft to export with
    python tools/random_model.py --config smollm2-135m --head --output /tmp/head-135m  # EAGLE-3
    python tools/random_model.py --list

`--layers N` keeps the configuration's widths with N layers (a smaller stand-in of the same
shapes per layer, tools/gpu_check.sh's CPU rehearsal). `--head` writes a random one-layer
EAGLE-3 head (SafeAILab layout, graphs/eagle3.py) for the configuration's target instead: the
target's widths, heads and MLP, a draft vocabulary of min(32,000, V) (the first ids), the
target's embedding (none of its own), features from layers 2, L//2 and L-3; for
`ssd-export --draft`, which then adds the target's aux_hidden outputs.

Configurations (`--list`): smollm2-135m (HuggingFaceTB/SmolLM2-135M), smollm2-360m
(HuggingFaceTB/SmolLM2-360M), qwen2.5-0.5b (Qwen/Qwen2.5-0.5B), tiny-llama (2 layers, 64
wide, SmolLM2's vocabulary size: a placeholder draft, since ssd-export needs one;
`--vocab-size 151936` pairs it with qwen2.5-0.5b).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOKENIZER_FROM = REPO / "examples" / "demo-pair" / "target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SPECIAL = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}    # the demo tokenizer's

# Published configurations (their config.json on the hub, the fields that shape the weights).
CONFIGS: dict[str, dict] = {
    "smollm2-135m": {
        "source": "HuggingFaceTB/SmolLM2-135M",
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "dtype": "bfloat16",
        "config": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                   "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                   "vocab_size": 49152, "tie_word_embeddings": True,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu",
                   "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                   "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02},
    },
    "smollm2-360m": {
        "source": "HuggingFaceTB/SmolLM2-360M",
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "dtype": "bfloat16",
        "config": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
                   "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64,
                   "vocab_size": 49152, "tie_word_embeddings": True,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu",
                   "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                   "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02},
    },
    "qwen2.5-0.5b": {
        "source": "Qwen/Qwen2.5-0.5B",
        "architecture": "Qwen2ForCausalLM",
        "model_type": "qwen2",
        "dtype": "bfloat16",
        "config": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                   "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
                   "tie_word_embeddings": True, "max_position_embeddings": 32768,
                   "rms_norm_eps": 1e-6, "hidden_act": "silu", "use_sliding_window": False,
                   "sliding_window": None, "max_window_layers": 24,
                   "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
                   "initializer_range": 0.02},
    },
    "tiny-llama": {
        "source": "none (a placeholder draft)",
        "architecture": "LlamaForCausalLM",
        "model_type": "llama",
        "dtype": "float32",
        "config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                   "vocab_size": 49152, "tie_word_embeddings": True,
                   "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu",
                   "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                   "initializer_range": 0.02},
    },
}


def build(name: str, output: Path, seed: int, vocab_size: int | None, dtype: str | None,
          layers: int | None = None) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    spec = CONFIGS[name]
    fields = dict(spec["config"], **SPECIAL)
    if layers is not None:
        fields["num_hidden_layers"] = layers
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    tokenizer_vocab = len(json.loads((TOKENIZER_FROM / "tokenizer.json").read_text())
                          ["model"]["vocab"])
    if fields["vocab_size"] < tokenizer_vocab:
        raise SystemExit(f"--vocab-size {fields['vocab_size']} is smaller than the demo "
                         f"tokenizer's {tokenizer_vocab} tokens")
    config = AutoConfig.for_model(spec["model_type"], architectures=[spec["architecture"]],
                                  **fields)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Rows past the tokenizer are padding: zero, as never-trained padded rows are, so that their
    # logits are 0 and greedy picks a real token (the best of 2,048 random logits is > 0);
    # random rows there would make most of the text ids with no text, and streams empty.
    with torch.no_grad():
        for emb in {id(m): m for m in (model.get_input_embeddings(),
                                       model.get_output_embeddings()) if m is not None}.values():
            emb.weight[tokenizer_vocab:] = 0
            if getattr(emb, "bias", None) is not None:
                emb.bias[tokenizer_vocab:] = 0
    save_dtype = dtype or spec["dtype"]
    model = model.to(getattr(torch, save_dtype)).eval()
    params = sum(p.numel() for p in model.parameters())
    output.mkdir(parents=True)
    model.config.dtype = save_dtype
    model.save_pretrained(output)
    GenerationConfig(**SPECIAL).save_pretrained(output)
    for f in TOKENIZER_FILES:
        shutil.copy2(TOKENIZER_FROM / f, output / f)
    card = {"random_weights": True, "configuration_of": spec["source"], "seed": seed,
            "parameters": params, "dtype": save_dtype, "vocab_size": fields["vocab_size"],
            "tokenizer": f"examples/demo-pair/target ({tokenizer_vocab} tokens; ids past it "
                         f"are padding)", "made_by": "tools/random_model.py"}
    (output / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    (output / "README.md").write_text(
        f"# {name}, random weights\n\nThe configuration of {spec['source']} with random weights "
        f"(seed {seed}, {params:,} parameters, saved as {save_dtype}) and the demo pair's "
        f"tokenizer, made by `tools/random_model.py` for speed measurements only: its text is "
        f"noise.\n")
    print(f"{name}: {params:,} parameters ({save_dtype}) -> {output} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


def build_head(name: str, output: Path, seed: int, dtype: str | None,
               layers: int | None = None) -> int:
    """A random EAGLE-3 head shaped for the configuration's target (see the module docstring)."""
    import torch
    from ssd_graphs.eagle3 import Eagle3Config, Eagle3Head, save_safeailab

    c = CONFIGS[name]["config"]
    L = layers or c["num_hidden_layers"]
    if L < 6:
        raise SystemExit(f"an EAGLE-3 head reads layers 2, L//2 and L-3: --layers {L} is "
                         f"fewer than 6")
    rope = c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0))
    config = Eagle3Config(
        hidden_size=c["hidden_size"], intermediate_size=c["intermediate_size"],
        num_attention_heads=c["num_attention_heads"],
        num_key_value_heads=c["num_key_value_heads"],
        head_dim=c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]),
        rms_norm_eps=c["rms_norm_eps"], rope_theta=rope,
        max_position_embeddings=c["max_position_embeddings"], vocab_size=c["vocab_size"],
        draft_vocab_size=min(32000, c["vocab_size"]),
        aux_layer_ids=Eagle3Config.default_aux_layer_ids(L), target_hidden_size=c["hidden_size"])
    torch.manual_seed(seed)
    head = Eagle3Head(config)          # nn.Linear's default initialisation: activations of O(1)
    head.t2d[:config.draft_vocab_size] = True        # draft id i is target id i (d2t = 0)
    head.own_embedding = False                       # the target's table, not saved
    if dtype:
        head = head.to(getattr(torch, dtype))
    save_safeailab(head, config, output)
    params = sum(p.numel() for n, p in head.named_parameters() if n != "embed_tokens.weight")
    print(f"EAGLE-3 head for {name} ({L} layers, features {config.aux_layer_ids}): "
          f"{params:,} parameters -> {output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(CONFIGS), help="published configuration")
    p.add_argument("--output", type=Path, help="model folder to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=None,
                   help="override the configuration's vocabulary size (padded past the "
                        "tokenizer's 2,048 tokens)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="dtype of the saved weights (default: the published one; ssd-export "
                        "loads them as float32 either way)")
    p.add_argument("--layers", type=int, default=None,
                   help="override the number of layers (the widths stay the configuration's)")
    p.add_argument("--head", action="store_true",
                   help="write a random EAGLE-3 head for the configuration's target instead")
    p.add_argument("--force", action="store_true", help="replace an existing --output")
    p.add_argument("--list", action="store_true", help="print the configurations and exit")
    args = p.parse_args(argv)
    if args.list:
        for name, spec in CONFIGS.items():
            c = spec["config"]
            print(f"{name:14} {spec['architecture']:18} hidden {c['hidden_size']}, "
                  f"intermediate {c['intermediate_size']}, {c['num_hidden_layers']} layers, "
                  f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads, vocab "
                  f"{c['vocab_size']}  ({spec['source']})")
        return 0
    if not args.config or not args.output:
        p.error("--config and --output are required (or --list)")
    if args.output.exists():
        if not args.force:
            p.error(f"{args.output} exists (--force replaces it)")
        shutil.rmtree(args.output)
    if args.head:
        return build_head(args.config, args.output, args.seed, args.dtype, args.layers)
    return build(args.config, args.output, args.seed, args.vocab_size, args.dtype, args.layers)


if __name__ == "__main__":
    sys.exit(main())
