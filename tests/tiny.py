"""Tiny models and a real tokenizer, built from configs for the tests (no downloads).

The tokenizer is a byte-level BPE trained on a few standard-library files;
model weights are drawn with a large init so that greedy choices are not
near-ties between Hugging Face and ONNX Runtime.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import torch

VOCAB = 384
SPECIALS = ["<s>", "</s>", "<pad>"]
CORPUS_FILES = ("textwrap.py", "string.py", "fnmatch.py", "bisect.py")


def build_tokenizer(folder: Path):
    """A PreTrainedTokenizerFast that prepends <s>, like Llama's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = [(stdlib / name).read_text() for name in CORPUS_FILES]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.save_pretrained(folder)
    return fast


# Falcon-RW style: ALiBi, sequential, one KV head per query head; 16 heads give slopes that
# are not powers of two, so Hugging Face's bfloat16 rounding of the bias shows.
FALCON_ALIBI = dict(alibi=True, multi_query=False, parallel_attn=False, num_attention_heads=16)
KINDS = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gpt2", "gpt_neox", "opt",
         "falcon", "gemma3", "starcoder2", "granite", "olmo2", "smollm3", "phi", "stablelm",
         "gpt_bigcode", "gptj", "cohere", "ministral", "exaone4", "glm4", "glm", "ernie4_5",
         "hunyuan", "olmo3", "olmo", "seed_oss", "cohere2", "vaultgemma", "ministral3",
         "qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "granitemoe", "granitemoeshared", "gpt_oss",
         "ernie4_5_moe", "hunyuan_v1_moe", "glm4_moe", "dots1", "phimoe",
         "deepseek_v3", "deepseek_v2")
LEGACY = ("nemotron", "arcee", "helium", "apertus", "gpt_neo", "bloom", "mpt", "codegen")
KINDS += LEGACY
# a sliding window shorter than parity's prompt on the first of two layers
SLIDING_FULL = dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
# mixture of experts: 4 experts of 32, 2 per token
MOE = dict(num_experts_per_tok=2)
SIGMOID_GROUPED = dict(n_routed_experts=4, moe_intermediate_size=32, n_shared_experts=1,
                       n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5)
MLA = dict(num_key_value_heads=4, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
           v_head_dim=12)
YARN = dict(rope_type="yarn", rope_theta=150000.0, beta_fast=32.0, beta_slow=1.0, truncate=False)
GRANITE = dict(embedding_multiplier=6.0, residual_multiplier=0.5, attention_multiplier=0.125,
               logits_scaling=3.0)


def config_for(kind: str, vocab: int, layers: int = 2, hidden: int = 64, **extra):
    """A tiny config of one class: 4 heads of 16, a large init; `extra` overrides any field."""
    import transformers

    ids = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    llama_like = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, initializer_range=0.25,
                      tie_word_embeddings=False, **ids)
    plain = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                 num_attention_heads=4, max_position_embeddings=256, **ids)
    table = {
        "llama": ("LlamaConfig", llama_like),
        "mistral": ("MistralConfig", {**llama_like, "sliding_window": 16}),
        "qwen2": ("Qwen2Config", llama_like),
        "qwen3": ("Qwen3Config", {**llama_like, "head_dim": hidden // 4,
                                  "tie_word_embeddings": True}),
        "phi3": ("Phi3Config", {**llama_like, "original_max_position_embeddings": 256}),
        "gemma": ("GemmaConfig", {**llama_like, "head_dim": hidden // 4, "num_key_value_heads": 1,
                                  "tie_word_embeddings": True}),
        # untied: a tied tiny Gemma 2 only ever repeats one token (its post-norms keep the
        # layers' share of the residual small next to the scaled embedding)
        "gemma2": ("Gemma2Config", {**llama_like, "head_dim": hidden // 4, "sliding_window": 16,
                                    "query_pre_attn_scalar": hidden // 4}),
        "gpt2": ("GPT2Config", dict(vocab_size=vocab, n_positions=256, n_embd=hidden, n_layer=layers,
                                    n_head=4, n_inner=2 * hidden, initializer_range=0.25, **ids)),
        "gpt_neox": ("GPTNeoXConfig", {**plain, "intermediate_size": 2 * hidden,
                                       "initializer_range": 0.25, "rotary_pct": 0.25}),
        "opt": ("OPTConfig", {**plain, "ffn_dim": 2 * hidden, "init_std": 0.25,
                              "word_embed_proj_dim": hidden}),
        "falcon": ("FalconConfig", {**plain, "initializer_range": 0.25, "ffn_hidden_size": 2 * hidden}),
        # a sliding then a full layer, each with its own RoPE base (10k local, 1M global)
        "gemma3": ("Gemma3TextConfig", {**llama_like, "head_dim": hidden // 4, "sliding_window": 8,
                                        "sliding_window_pattern": 2,
                                        "query_pre_attn_scalar": hidden // 4}),
        "starcoder2": ("Starcoder2Config", {**llama_like, "sliding_window": 16}),
        "granite": ("GraniteConfig", {**llama_like, **GRANITE}),
        "olmo2": ("Olmo2Config", llama_like),
        "smollm3": ("SmolLM3Config", {**llama_like, "no_rope_layer_interval": 2}),  # RoPE, NoPE
        "phi": ("PhiConfig", {**plain, "intermediate_size": 2 * hidden, "initializer_range": 0.25}),
        "stablelm": ("StableLmConfig", {**llama_like, "num_key_value_heads": 2}),
        "gpt_bigcode": ("GPTBigCodeConfig", dict(vocab_size=vocab, n_positions=256, n_embd=hidden,
                                                 n_layer=layers, n_head=4, n_inner=2 * hidden,
                                                 initializer_range=0.25, **ids)),
        "gptj": ("GPTJConfig", dict(vocab_size=vocab, n_positions=256, n_embd=hidden,
                                    n_layer=layers, n_head=4, n_inner=2 * hidden, rotary_dim=8,
                                    initializer_range=0.25, **ids)),
        "cohere": ("CohereConfig", {**llama_like, "logit_scale": 0.25}),
        # a sliding then a full layer (Ministral, EXAONE 4, OLMo 3, Command R7B, VaultGemma)
        "ministral": ("MinistralConfig", {**llama_like, **SLIDING_FULL, "head_dim": hidden // 4}),
        # ... the full layer without RoPE
        "exaone4": ("Exaone4Config", {**llama_like, "sliding_window": 8,
                                      "sliding_window_pattern": 2}),
        # interleaved RoPE on half of each head, q/k/v biases
        "glm4": ("Glm4Config", {**llama_like, "head_dim": hidden // 4}),
        "glm": ("GlmConfig", {**llama_like, "head_dim": hidden // 4}),
        "ernie4_5": ("Ernie4_5Config", {**llama_like, "head_dim": hidden // 4, "use_bias": True}),
        # NTK-alpha RoPE, as every HunYuan checkpoint has it (labelled "dynamic", yet static)
        "hunyuan": ("HunYuanDenseV1Config", {**llama_like, "head_dim": hidden // 4,
                                             "rope_parameters": {
            "rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}}),
        # each layer type with its own RoPE base
        "olmo3": ("Olmo3Config", {**llama_like, **SLIDING_FULL, "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6}}}),
        # queries scaled up past each 8 positions (original_max_position_embeddings)
        "ministral3": ("Ministral3Config", {**llama_like, "head_dim": hidden // 4,
                                            "rope_parameters": {
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0,
            "original_max_position_embeddings": 8, "llama_4_scaling_beta": 0.5}}),
        "olmo": ("OlmoConfig", {**llama_like, "clip_qkv": 1.0}),
        "seed_oss": ("SeedOssConfig", {**llama_like, "head_dim": hidden // 4}),
        "cohere2": ("Cohere2Config", {**llama_like, **SLIDING_FULL, "logit_scale": 0.25}),
        "vaultgemma": ("VaultGemmaConfig", {**llama_like, **SLIDING_FULL, "head_dim": hidden // 4,
                                            "query_pre_attn_scalar": hidden // 4}),
        # an MoE layer then a dense one (mlp_only_layers), top-2 renormalised
        "qwen3_moe": ("Qwen3MoeConfig", {**llama_like, **MOE, "head_dim": hidden // 4,
                                         "num_experts": 4, "moe_intermediate_size": 32,
                                         "norm_topk_prob": True, "mlp_only_layers": [1]}),
        # a shared expert behind a sigmoid gate; top-2 weights as they come (not renormalised)
        "qwen2_moe": ("Qwen2MoeConfig", {**llama_like, **MOE, "num_experts": 4,
                                         "moe_intermediate_size": 32,
                                         "shared_expert_intermediate_size": 48}),
        "mixtral": ("MixtralConfig", {**llama_like, **MOE, "num_local_experts": 4,
                                      "intermediate_size": 32}),
        "olmoe": ("OlmoeConfig", {**llama_like, **MOE, "num_experts": 4, "intermediate_size": 32}),
        # legacy and misc: partial rotary with a LayerNorm1P and relu² MLP (Nemotron)
        "nemotron": ("NemotronConfig", {**llama_like, "partial_rotary_factor": 0.5}),
        "arcee": ("ArceeConfig", llama_like),
        "helium": ("HeliumConfig", {**llama_like, "head_dim": hidden // 4}),
        "apertus": ("ApertusConfig", {**llama_like, "rope_parameters": {  # its default: llama3
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
        # a global then a local layer whose window is shorter than parity's sequences
        "gpt_neo": ("GPTNeoConfig", dict(vocab_size=vocab, max_position_embeddings=256,
                                         hidden_size=hidden, num_layers=layers, num_heads=4,
                                         attention_types=[[["global", "local"], layers // 2]],
                                         window_size=8, intermediate_size=2 * hidden,
                                         initializer_range=0.25, **ids)),
        # ALiBi over 12 heads of 8: 8 slopes, then 4 interleaved from the next power of two
        "bloom": ("BloomConfig", dict(vocab_size=vocab, hidden_size=96, n_layer=layers,
                                      n_head=12, initializer_range=0.25, **ids)),
        # MPT's own ALiBi slopes, over 12 heads too
        "mpt": ("MptConfig", dict(vocab_size=vocab, d_model=96, n_layers=layers, n_heads=12,
                                  expansion_ratio=2, max_seq_len=256, initializer_range=0.25,
                                  tie_word_embeddings=False, **ids)),
        # q, v, k in 4 blocks of 2 heads each (8 heads of 8), RoPE on the first 4 dims
        "codegen": ("CodeGenConfig", dict(vocab_size=vocab, n_positions=256, n_embd=hidden,
                                          n_layer=layers, n_head=8, n_inner=2 * hidden,
                                          rotary_dim=4, initializer_range=0.25, **ids)),
        # Granite's multipliers around the experts; the shared variant adds a dense MLP
        "granitemoe": ("GraniteMoeConfig", {**llama_like, **MOE, **GRANITE, "num_local_experts": 4,
                                            "intermediate_size": 32}),
        "granitemoeshared": ("GraniteMoeSharedConfig", {
            **llama_like, **MOE, **GRANITE, "num_local_experts": 4, "intermediate_size": 32,
            "shared_intermediate_size": 48}),
        # sinks, a sliding (shorter than the parity prompt) then a full layer, a SwiGLU clamp
        # low enough to bite
        "gpt_oss": ("GptOssConfig", {**llama_like, **MOE, "head_dim": hidden // 4,
                                     "num_local_experts": 4, "intermediate_size": 32,
                                     "sliding_window": 8, "swiglu_limit": 2.0,
                                     "rope_parameters": {**YARN, "factor": 32.0,
                                                         "original_max_position_embeddings": 8}}),
        # a dense layer then an MoE one with a shared expert, biased projections, tied
        "ernie4_5_moe": ("Ernie4_5_MoeConfig", {
            **llama_like, **MOE, "moe_num_experts": 4, "moe_intermediate_size": 32,
            "moe_num_shared_experts": 1, "moe_layer_start_index": 1, "use_bias": True,
            "tie_word_embeddings": True}),
        # q/k norms after RoPE, a shared MLP beside the experts, a float32 router
        "hunyuan_v1_moe": ("HunYuanMoEV1Config", {
            **llama_like, "num_experts": 4, "moe_topk": 2, "intermediate_size": 32,
            "head_dim": hidden // 4}),
        # a dense layer then sigmoid routing within the best of 2 groups, scaled; q/k norms,
        # partial rotary (GLM's default half)
        "glm4_moe": ("Glm4MoeConfig", {**llama_like, **MOE, **SIGMOID_GROUPED,
                                       "first_k_dense_replace": 1, "use_qk_norm": True}),
        # sigmoid routing on every layer, not renormalised; the second layer slides (8)
        "dots1": ("Dots1Config", {**llama_like, **MOE, **SIGMOID_GROUPED, "n_group": 1,
                                  "topk_group": 1, "norm_topk_prob": False, "head_dim": hidden // 4,
                                  "sliding_window": 8, "max_window_layers": 1}),
        # sparsemixer routing (a wide jitter_eps, so that its masks bite), biased attention
        # and LM head
        "phimoe": ("PhimoeConfig", {**llama_like, **MOE, "num_local_experts": 4,
                                    "intermediate_size": 32, "router_jitter_noise": 0.3,
                                    "attention_bias": True, "lm_head_bias": True}),
        # multi-head latent attention (a query rank, de-interleaved RoPE; value heads of 12
        # beside key heads of 24), then V3's sigmoid routing after a dense layer
        "deepseek_v3": ("DeepseekV3Config", {**llama_like, **MOE, **SIGMOID_GROUPED, **MLA,
                                             "first_k_dense_replace": 1, "q_lora_rank": 24}),
        # MLA without a query rank, RoPE on interleaved pairs; softmax routing within the best
        # of 2 groups, scaled
        "deepseek_v2": ("DeepseekV2Config", {
            **llama_like, **MOE, **SIGMOID_GROUPED, **MLA, "first_k_dense_replace": 1,
            "q_lora_rank": None, "topk_method": "group_limited_greedy"}),
    }
    if kind not in table:
        raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
    name, fields = table[kind]
    return getattr(transformers, name)(**{**fields, **extra})


def build_model(folder: Path, kind: str, tokenizer, seed: int, **config_extra) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = config_for(kind, len(tokenizer), **config_extra)
    model = AutoModelForCausalLM.from_config(config).eval()
    draw_constant_init(model)
    _save(model, tokenizer, folder)
    return folder


# parameters that init sets to a constant which would hide a wrong graph: (mean, std) drawn
DRAWN = {"e_score_correction_bias": (0.0, 0.5),    # zero: selection as without the bias
         "query_layernorm.weight": (1.0, 0.5),     # one: q/k norms commute with RoPE
         "key_layernorm.weight": (1.0, 0.5)}


def draw_constant_init(model) -> None:
    """Draw the DRAWN parameters and buffers of a freshly initialised model."""
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            for suffix, (mean, std) in DRAWN.items():
                if name.endswith(suffix):
                    tensor.normal_(mean, std)


def truncate(source: Path, folder: Path, layers: int, tokenizer) -> Path:
    """The source model cut to its first `layers` layers (a draft that partly agrees)."""
    from transformers import AutoModelForCausalLM

    from ssd_graphs.registry import REGISTRY

    model = AutoModelForCausalLM.from_pretrained(source)
    path = REGISTRY[type(model).__name__](model.config).layers     # e.g. transformer.h
    *parents, name = path.split(".")
    owner = model
    for part in parents:
        owner = getattr(owner, part)
    setattr(owner, name, getattr(owner, name)[:layers])
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    if getattr(model.config, "attention_types", None):         # GPT-Neo's per-layer kinds
        model.config.attention_layers = model.config.attention_layers[:layers]
        model.config.attention_types = [[model.config.attention_layers, 1]]
    _save(model, tokenizer, folder)
    return folder


def _save(model, tokenizer, folder: Path) -> None:
    model.generation_config.eos_token_id = model.config.eos_token_id
    model.generation_config.pad_token_id = model.config.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


SMALL_WORDS = ["<s>", "</s>", "<pad>", *"abcdefghijklm"]    # a 16-token vocabulary


def build_small_vocab_pair(root: Path) -> tuple[Path, Path]:
    """Target and an unrelated draft over a 16-word vocabulary, for exact enumeration."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SMALL_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    # a moderate init: distributions spread over several tokens, so that sampling matters
    target = build_model(root / "small_target", "llama", fast, seed=11, layers=2,
                         initializer_range=0.08)
    draft = build_model(root / "small_draft", "llama", fast, seed=12, layers=1,
                        initializer_range=0.08)
    return target, draft


# An EAGLE-3 head's tensors under their published names (SafeAILab's cnets.Model; the
# speculators layout renames midlayer. to layers.0.), and each layout's config.json
_HEAD_LAYER = ("hidden_norm", "input_layernorm", "post_attention_layernorm")


def build_eagle3_head(folder: Path, layout: str, *, target_hidden: int, vocab: int,
                      layer_ids=(0, 1, 2), hidden: int = 32, draft_vocab: int = 96,
                      embed: bool = True, seed: int = 0, drop: str = "", **config) -> Path:
    """A random one-layer EAGLE-3 head for a target of width `target_hidden` and `vocab` tokens:
    4 heads of hidden/4, 2 KV heads, MLP 2·hidden, a draft vocabulary of `draft_vocab` target
    ids; `drop` leaves one tensor out, `config` overrides config.json fields."""
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    H, D = hidden, hidden // 4
    shapes = {"fc.weight": (H, 3 * target_hidden), "norm.weight": (H,),
              "lm_head.weight": (draft_vocab, H),
              "midlayer.self_attn.q_proj.weight": (4 * D, 2 * H),
              "midlayer.self_attn.k_proj.weight": (2 * D, 2 * H),
              "midlayer.self_attn.v_proj.weight": (2 * D, 2 * H),
              "midlayer.self_attn.o_proj.weight": (H, 4 * D),
              "midlayer.mlp.gate_proj.weight": (2 * H, H), "midlayer.mlp.up_proj.weight": (2 * H, H),
              "midlayer.mlp.down_proj.weight": (H, 2 * H),
              **{f"midlayer.{n}.weight": (H,) for n in _HEAD_LAYER}}
    tensors = {name: torch.randn(shape, generator=g) * 0.3 for name, shape in shapes.items()}
    targets = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    tensors["d2t"] = targets - torch.arange(draft_vocab)      # target id = draft id + d2t
    tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool)
    tensors["t2d"][targets] = True
    if embed:
        tensors["embed_tokens.weight"] = torch.randn(vocab, H, generator=g)
    tensors.pop(drop, None)
    layer = dict(hidden_size=H, intermediate_size=2 * H, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=D, rms_norm_eps=1e-5, rope_theta=10000.0,
                 max_position_embeddings=256, hidden_act="silu", vocab_size=vocab,
                 num_hidden_layers=1)
    eagle = dict(draft_vocab_size=draft_vocab, target_hidden_size=target_hidden,
                 eagle_aux_hidden_state_layer_ids=list(layer_ids))
    if layout == "speculators":
        tensors = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
        body = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                "transformer_layer_config": {**layer, "model_type": "llama"},
                "norm_before_residual": True, **eagle}
    else:
        body = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **layer,
                **eagle}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**body, **config}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def add_mtp_layer(folder: Path, seed: int = 0, head: bool = True, drop: str = "") -> Path:
    """Write an MTP layer into a saved DeepSeek V3 / GLM-4 MoE checkpoint as published (vLLM's
    deepseek_mtp.py reads it): `model.layers.{L}.` + enorm, hnorm, eh_proj (H, 2H),
    shared_head.norm, shared_head.head (unless not `head`) and a decoder block shaped as layer
    L-1 (drawn anew); transformers drops these tensors at load, so they are added to the file.
    `drop` leaves one tensor (its name after the prefix) out."""
    import json

    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(seed)
    d = json.loads((folder / "config.json").read_text())
    L, H, V = d["num_hidden_layers"], d["hidden_size"], d["vocab_size"]
    tensors = load_file(str(folder / "model.safetensors"))
    last, mtp = f"model.layers.{L - 1}.", f"model.layers.{L}."
    for name, t in list(tensors.items()):
        if name.startswith(last):       # norms about 1, the rest at the fixture's init scale
            ones = name.endswith("norm.weight")
            drawn = torch.randn(t.shape, generator=g) * (0.3 if ones else 0.25)
            tensors[mtp + name[len(last):]] = drawn + 1.0 if ones else drawn
    extra = {"enorm.weight": (H,), "hnorm.weight": (H,), "shared_head.norm.weight": (H,),
             "eh_proj.weight": (H, 2 * H), **({"shared_head.head.weight": (V, H)} if head else {})}
    for name, shape in extra.items():
        drawn = torch.randn(shape, generator=g)
        tensors[mtp + name] = drawn * 0.3 + 1.0 if len(shape) == 1 else drawn * 0.25
    tensors.pop(mtp + drop, None)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    d["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(d, indent=2))
    return folder
