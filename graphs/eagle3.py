"""The EAGLE-3 draft head in PyTorch: the one module the exporter traces and ssd-distill trains.

One decoder layer over [norm(embed(x_{t+1})) | norm(h_t)], where h_t is the target's features
at t fused by `fc` (or the head's own previous output), a reduced vocabulary mapped back to the
target's by `d2t` (target id = draft id + d2t[draft id]). It reads and writes the published
layouts: SafeAILab's (`LlamaForCausalLMEagle3`, `midlayer.*`) and vLLM speculators'
(`Eagle3Speculator`, `layers.0.*`). docs/design.md §14.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from ssd_runtime.errors import ConfigError
from torch import nn

from .adapters import Adapter
from .attention import Heads, attention, causal_mask, key_positions
from .decoder import MASKED
from .eagle3_config import (SAFEAILAB, SAFEAILAB_ARCHITECTURE, SPECULATORS,  # noqa: F401
                            SPECULATORS_ARCHITECTURE, WEIGHTS, Eagle3Config, Layout,
                            config_dict, head_layout)
from .positions import Rope

_LLAMA = Adapter()                       # q_proj, k_proj, v_proj, o_proj: the head's names


class RMSNorm(nn.Module):
    """Llama's: weight · x / sqrt(mean(x²) + eps), computed in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        H, D = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(2 * H, c.num_attention_heads * D, bias=False)   # 2H: [emb | h]
        self.k_proj = nn.Linear(2 * H, c.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(2 * H, c.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * D, H, bias=False)


class _Mlp(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act_fn = ACT2FN[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    """SafeAILab's `midlayer` (speculators' `layers.0`): parameter names as published."""

    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _Mlp(c)


class Eagle3Head(nn.Module):
    """fc (3·Ht -> H, no bias), the mid layer, norm, lm_head (H -> Vd), d2t (Vd,), t2d (V,).

    The embedding table is the head's own when it carries one (`embed_tokens.weight`), else
    the target's, handed in as `embed_weight` (V, H); `own_embedding` says which.
    """

    def __init__(self, config: Eagle3Config, embed_weight: torch.Tensor | None = None) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.own_embedding = embed_weight is None
        if embed_weight is not None:
            self.set_embedding(embed_weight)
        self.fc = nn.Linear(3 * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        # d2t[i] = target id - draft id; t2d[j]: target id j is in the draft vocabulary
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        if c.draft_vocab_size == c.vocab_size:
            self.t2d.fill_(True)
        self.heads = Heads(c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.rope = _rope(c)

    def set_embedding(self, weight: torch.Tensor, own: bool = False) -> None:
        """Use `weight` (V, H) as the token embedding (the target's, unless `own`)."""
        c = self.config
        if tuple(weight.shape) != (c.vocab_size, c.hidden_size):
            raise ConfigError(f"the embedding table for the EAGLE-3 head is {tuple(weight.shape)}"
                              f"; the head needs ({c.vocab_size}, {c.hidden_size}) (vocab_size, "
                              f"hidden_size). ---> HINT: use the head made for this target.")
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight.detach().float())
        self.own_embedding = own

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's features (B, T, 3·Ht) -> the head's input (B, T, H)."""
        return self.fc(aux)

    def forward(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
                past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One drafting step over T rows.

        input_ids (B, T): row t carries token x_{t+1}; hidden (B, T, H): fused features or a
        previous `hidden_out`; position_ids (B, T) = t; past_kv: keys, values (B, P, Hkv, D),
        sequence-major, row j holding position j. Attention is causal over past + new by
        position (attention.key_positions); `attention_mask`, an additive (B, 1, 1, T, P+T)
        mask, replaces that (training's unrolled steps). Returns draft logits (B, T, Vd),
        hidden_out (B, T, H) (before the final norm: what the next step feeds back), and the
        keys and values of past + new (B, P+T, Hkv, D).
        """
        B, T = input_ids.shape
        if past_kv is None:
            empty = hidden.new_zeros(B, 0, self.heads.num_kv_heads, self.heads.head_dim)
            past_kv = (empty, empty)
        if attention_mask is None:
            key_pos, key_valid = key_positions(position_ids, past_kv[0].shape[1])
            attention_mask = causal_mask(position_ids, key_pos, key_valid, None)
        out, k, v = self.step(input_ids, hidden, position_ids, *past_kv, attention_mask)
        keys = torch.cat((past_kv[0], k), dim=1)                    # (B, P+T, Hkv, D)
        values = torch.cat((past_kv[1], v), dim=1)
        return self.draft_logits(out), out, (keys, values)

    def step(self, input_ids: torch.Tensor, hidden: torch.Tensor, position_ids: torch.Tensor,
             past_k: torch.Tensor, past_v: torch.Tensor, bias: torch.Tensor,
             scatter_at: tuple[torch.Tensor, ...] | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The mid layer (the graph wrapper's and forward's shared path): hidden_out (B, T, H)
        and the new keys and values as attention.attention returns them for the flavour.

            emb ─ input_layernorm ─┐
                                   ├─ cat (2H) ─ attn ─ + res ─ post_norm ─ mlp ─ + ─ out
            hidden ─ hidden_norm ──┘       res = hidden, or hidden_norm(hidden) if
                                           norm_before_residual
        """
        layer = self.midlayer
        emb = self.embed_tokens(input_ids).to(hidden.dtype)         # (B, T, H)
        normed = layer.hidden_norm(hidden)
        residual = normed if self.config.norm_before_residual else hidden
        h = torch.cat((layer.input_layernorm(emb), normed), dim=-1)  # (B, T, 2H)
        cos_sin = self.rope.tables(position_ids, h.dtype)
        attn_out, k, v = attention(layer.self_attn, _LLAMA, self.heads,
                                   self.config.head_dim ** -0.5, h, self.rope, cos_sin, past_k,
                                   past_v, bias, scatter_at=scatter_at)
        x = residual + attn_out
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, k, v

    def draft_logits(self, hidden_out: torch.Tensor) -> torch.Tensor:
        """hidden_out (B, T, H) -> logits over the draft vocabulary (B, T, Vd), float32."""
        return self.lm_head(self.norm(hidden_out)).float()

    def target_logits(self, logits_draft: torch.Tensor) -> torch.Tensor:
        """(B, T, Vd) -> (B, T, V): draft id i lands at target id i + d2t[i], MASKED elsewhere
        (so q = 0 there after softmax, as for a draft's output_vocab.json, design §13)."""
        c = self.config
        ids = torch.arange(c.draft_vocab_size, device=logits_draft.device) + self.d2t  # (Vd,)
        full = logits_draft.new_full((*logits_draft.shape[:-1], c.vocab_size), MASKED)
        return full.scatter(-1, ids.expand(*logits_draft.shape[:-1], -1), logits_draft)


def aux_hidden(hidden_states: tuple[torch.Tensor, ...] | list[torch.Tensor],
               layer_ids: tuple[int, ...]) -> torch.Tensor:
    """Hugging Face `output_hidden_states` (L+1 tensors (B, T, Ht); index l is the residual
    stream entering layer l) -> the head's features (B, T, 3·Ht), in the order given."""
    return torch.cat([hidden_states[l] for l in layer_ids], dim=-1)


def load_head(path: str | Path, num_target_layers: int | None = None,
              embed_weight: torch.Tensor | None = None
              ) -> tuple[Eagle3Config, Eagle3Head, Layout]:
    """Read a head folder in either layout; checks names and shapes of every tensor.

    `num_target_layers` gives the default aux layer ids when the config has none;
    `embed_weight` the target's table when the head carries no embedding.
    """
    folder = Path(path).expanduser()
    config_dict = read_head_config(folder)
    layout = head_layout(config_dict, str(path))
    config = (Eagle3Config.from_safeailab_config if layout == SAFEAILAB else
              Eagle3Config.from_speculators_config)(config_dict, num_target_layers, str(path))
    tensors = read_head_tensors(folder)
    head = Eagle3Head(config, None)
    head.load_state_dict(_state_dict(tensors, config, layout, str(path)), strict=False)
    if "embed_tokens.weight" not in tensors:
        head.own_embedding = False
        if embed_weight is not None:
            head.set_embedding(embed_weight)
    return config, head.eval(), layout


def save_safeailab(head: Eagle3Head, config: Eagle3Config, path: str | Path) -> None:
    """Write the SafeAILab layout (config.json, model.safetensors) that vLLM, SGLang and
    TensorRT-LLM load; the embedding only if the head has its own."""
    from safetensors.torch import save_file

    folder = Path(path).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    skip = set() if head.own_embedding else {"embed_tokens.weight"}
    tensors = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()
               if name not in skip}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config.to_safeailab_config(), indent=2) + "\n")


def is_head(folder: str | Path) -> bool:
    """Whether a model folder's config.json describes an EAGLE-3 head (either layout)."""
    path = Path(folder).expanduser() / "config.json"
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(d, dict):
        return False
    # SafeAILab's architecture (or any "...Eagle3" one, refused by name in head_layout), a
    # speculators model, or SafeAILab's training config: LlamaForCausalLM with draft_vocab_size
    archs = [str(a) for a in d.get("architectures") or []]
    return (any("Eagle3" in a for a in archs) or d.get("speculators_model_type") is not None
            or "draft_vocab_size" in d)


def read_head_config(folder: Path) -> dict[str, Any]:
    try:
        d = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"EAGLE-3 head {str(folder)!r}: config.json cannot be read ({exc}). "
                          f"---> HINT: pass the head's folder, with its config.json.") from None
    if not isinstance(d, dict):
        raise ConfigError(f"EAGLE-3 head {str(folder)!r}: config.json is not a JSON object.")
    return d


def read_head_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The head's tensors from model.safetensors, else pytorch_model.bin (weights only)."""
    safetensors, bin_file = (folder / name for name in WEIGHTS)
    try:
        if safetensors.is_file():
            from safetensors.torch import load_file

            return load_file(str(safetensors))
        if bin_file.is_file():
            state = torch.load(str(bin_file), map_location="cpu", weights_only=True)
            if not isinstance(state, dict):
                raise ValueError("not a dict of tensors")
            return state
    except Exception as exc:     # safetensors' SafetensorError, pickle's errors: the file's fault
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"EAGLE-3 head {str(folder)!r}: its weights cannot be read "
                          f"({type(exc).__name__}: {detail}). ---> HINT: the file is truncated "
                          f"or corrupt; copy or download it again.") from None
    raise ConfigError(f"EAGLE-3 head {str(folder)!r} has no weights: expected "
                      f"{' or '.join(WEIGHTS)}. ---> HINT: copy the head's weight file into "
                      f"the folder.")


def expected_shapes(config: Eagle3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor of the SafeAILab layout and its shape (embed_tokens.weight optional)."""
    c, H, D = config, config.hidden_size, config.head_dim
    m = "midlayer."
    return {
        "fc.weight": (H, 3 * c.target_hidden_size),
        m + "hidden_norm.weight": (H,), m + "input_layernorm.weight": (H,),
        m + "self_attn.q_proj.weight": (c.num_attention_heads * D, 2 * H),
        m + "self_attn.k_proj.weight": (c.num_key_value_heads * D, 2 * H),
        m + "self_attn.v_proj.weight": (c.num_key_value_heads * D, 2 * H),
        m + "self_attn.o_proj.weight": (H, c.num_attention_heads * D),
        m + "post_attention_layernorm.weight": (H,),
        m + "mlp.gate_proj.weight": (c.intermediate_size, H),
        m + "mlp.up_proj.weight": (c.intermediate_size, H),
        m + "mlp.down_proj.weight": (H, c.intermediate_size),
        "norm.weight": (H,), "lm_head.weight": (c.draft_vocab_size, H),
        "d2t": (c.draft_vocab_size,), "t2d": (c.vocab_size,),
        "embed_tokens.weight": (c.vocab_size, H),
    }


def _state_dict(tensors: dict[str, torch.Tensor], config: Eagle3Config, layout: Layout,
                source: str) -> dict[str, torch.Tensor]:
    """Published names -> this module's, every shape checked, d2t and t2d agreeing."""
    if layout == SPECULATORS:
        tensors = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): t
                   for k, t in tensors.items()}
    want = expected_shapes(config)
    reduced = config.draft_vocab_size != config.vocab_size
    optional = {"embed_tokens.weight"} | (set() if reduced else {"d2t", "t2d"})
    missing = [k for k in want if k not in tensors and k not in optional]
    if missing:
        raise ConfigError(f"EAGLE-3 head {source!r} lacks {', '.join(missing)} ({layout} "
                          f"layout). ---> HINT: the weight file is incomplete or is not an "
                          f"EAGLE-3 head; copy it again.")
    for name, shape in want.items():
        if name in tensors and tuple(tensors[name].shape) != shape:
            raise ConfigError(f"EAGLE-3 head {source!r}: {name} is {tuple(tensors[name].shape)}, "
                              f"its config.json implies {shape}. ---> HINT: the config and the "
                              f"weights do not belong together.")
    extra = sorted(k for k in tensors if k not in want and not k.startswith("layers."))
    layers = sorted({k.split(".")[1] for k in tensors if k.startswith("layers.")})
    if layers:
        raise ConfigError(f"EAGLE-3 head {source!r} has decoder layers {', '.join(layers)} "
                          f"beyond the first; this exporter builds one-layer heads. ---> HINT: "
                          f"use a one-layer EAGLE-3 head.")
    if extra:
        raise ConfigError(f"EAGLE-3 head {source!r} has tensors the EAGLE-3 layer does not "
                          f"(e.g. {', '.join(extra[:3])}). ---> HINT: a head with biases or "
                          f"extra norms is another variant; use a plain EAGLE-3 head.")
    state = {k: (t.to(torch.int64) if k == "d2t" else t.bool() if k == "t2d" else t.float())
             for k, t in tensors.items() if k in want}
    if "d2t" in state:
        _check_vocab_map(state["d2t"], state.get("t2d"), config, source)
    return state


def _check_vocab_map(d2t: torch.Tensor, t2d: torch.Tensor | None, config: Eagle3Config,
                     source: str) -> None:
    ids = torch.arange(config.draft_vocab_size) + d2t                # target ids (Vd,)
    V = config.vocab_size
    bad = ids.min() < 0 or ids.max() >= V or ids.unique().numel() != ids.numel()
    if not bad and t2d is not None:     # t2d marks exactly the ids d2t reaches
        bad = int(t2d.sum()) != config.draft_vocab_size or not bool(t2d[ids].all())
    if bad:
        raise ConfigError(f"EAGLE-3 head {source!r}: d2t does not map the "
                          f"{config.draft_vocab_size} draft ids to distinct target ids below "
                          f"{V} that t2d marks. ---> HINT: the head's vocabulary map is corrupt "
                          f"or made for another target.")


def _rope(c: Eagle3Config) -> Rope:
    """The head's RoPE table as Hugging Face's Llama computes it from these settings."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = dict(c.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "dynamic":
        raise ConfigError("EAGLE-3 head: dynamic RoPE scaling changes with the sequence length "
                          "and is not exported. ---> HINT: use a head with static scaling.")
    rope = {"rope_type": kind, "rope_theta": c.rope_theta,
            **{k: v for k, v in scaling.items() if k not in ("type", "rope_type")}}
    llama = LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                        max_position_embeddings=c.max_position_embeddings,
                        rope_parameters=rope)
    return Rope.from_module(LlamaRotaryEmbedding(config=llama))
