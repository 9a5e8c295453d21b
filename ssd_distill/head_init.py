"""A head that starts close (docs/distill.md §9): the EAGLE-3 head's weights taken from the
target before training, so that at step 0 it computes the target's last layer on the deepest
features it reads, then the target's final norm and LM head (the draft vocabulary's rows).

    fc            (H, 3H)  [0 | 0 | I]: the stream entering layer L-3, the deepest read
    midlayer      the last layer's norms, attention and MLP; q/k/v read [emb | hidden]: the
                  hidden half is the last layer's, the embedding half starts at zero
    norm, lm_head the target's final norm; its LM head's rows of the draft vocabulary

So it starts as the target with layers L-3 .. L-2 skipped, predicting the token after the
features' position; training teaches it the next one (given that token's embedding) and
the drafting steps after it. SafeAILab's init (PyTorch's defaults, norms at one) is
`--head-init random`.
"""
from __future__ import annotations

import torch

from ssd_graphs.eagle3 import Eagle3Config

from .features import decoder_layers


def head_config(cfg, draft_vocab: int, layer_ids: list[int]) -> Eagle3Config:
    """An EAGLE-3 head shaped like one of the target's layers (SafeAILab's config.json: the
    target's sizes and activation, one layer), over a draft vocabulary of `draft_vocab`."""
    hidden, heads = int(cfg.hidden_size), int(cfg.num_attention_heads)
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    theta = float(rope.pop("rope_theta", getattr(cfg, "rope_theta", None) or 10000.0))
    static = rope.get("rope_type", "default") in ("linear", "llama3", "yarn")
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None) or "silu"
    return Eagle3Config(
        hidden_size=hidden, intermediate_size=int(getattr(cfg, "intermediate_size", None)
                                                  or 4 * hidden),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
        rms_norm_eps=float(getattr(cfg, "rms_norm_eps", None) or 1e-6), rope_theta=theta,
        rope_scaling=rope if static else None,
        max_position_embeddings=int(getattr(cfg, "max_position_embeddings", None) or 2048),
        vocab_size=int(cfg.vocab_size), draft_vocab_size=draft_vocab,
        aux_layer_ids=tuple(layer_ids), target_hidden_size=hidden, hidden_act=str(act))


@torch.no_grad()
def init_from_target(head, target, ids: list[int]) -> list[str]:
    """Copy what fits from the target into `head` (an Eagle3Head of the target's widths);
    returns the names of the head's tensors it set (the others keep PyTorch's init)."""
    last = decoder_layers(target)[-1]
    layer, c = head.midlayer, head.config
    H = c.hidden_size
    done: list[str] = []

    def put(dst: torch.Tensor, src: torch.Tensor | None, name: str, norm: bool = False) -> None:
        if src is None or tuple(src.shape) != tuple(dst.shape):
            return
        value = src.float()
        if norm and _offset_norm(target):      # Gemma's norms scale by (1 + weight)
            value = value + 1.0
        dst.copy_(value)
        done.append(name)

    attn = _find(last, ("self_attn", "attention", "attn"))
    for proj in ("q_proj", "k_proj", "v_proj"):
        src = getattr(attn, proj, None) if attn is not None else None
        dst = getattr(layer.self_attn, proj).weight                      # (out, 2H)
        if src is not None and tuple(src.weight.shape) == (dst.shape[0], H):
            dst.zero_()
            dst[:, H:] = src.weight.float()                              # the hidden half
            done.append(f"midlayer.self_attn.{proj}")
    if attn is not None and getattr(attn, "o_proj", None) is not None:
        put(layer.self_attn.o_proj.weight, attn.o_proj.weight, "midlayer.self_attn.o_proj")
    mlp = _find(last, ("mlp", "feed_forward"))
    for proj in ("gate_proj", "up_proj", "down_proj"):
        src = getattr(mlp, proj, None) if mlp is not None else None
        if src is not None:
            put(getattr(layer.mlp, proj).weight, src.weight, f"midlayer.mlp.{proj}")
    input_norm = _weight(last, "input_layernorm")
    put(layer.input_layernorm.weight, input_norm, "midlayer.input_layernorm", norm=True)
    put(layer.hidden_norm.weight, input_norm, "midlayer.hidden_norm", norm=True)
    # the MLP's input norm: Llama's post_attention_layernorm, Gemma's pre_feedforward one
    mlp_norm = _weight(last, "pre_feedforward_layernorm")
    put(layer.post_attention_layernorm.weight,
        mlp_norm if mlp_norm is not None else _weight(last, "post_attention_layernorm"),
        "midlayer.post_attention_layernorm", norm=True)
    final = getattr(target.base_model, "norm", None)
    put(head.norm.weight, getattr(final, "weight", None), "norm", norm=True)
    out = target.get_output_embeddings()
    if out is not None and out.weight.shape[1] == H:
        head.lm_head.weight.copy_(out.weight[torch.tensor(ids)].float())  # (Vd, H)
        done.append("lm_head")
    width = c.target_hidden_size
    if head.fc.weight.shape == (H, 3 * width) and width == H:
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * width:] = torch.eye(H)                     # the deepest stream
        done.append("fc")
    return done


def _find(module, names: tuple[str, ...]):
    return next((getattr(module, n) for n in names if hasattr(module, n)), None)


def _weight(module, name: str) -> torch.Tensor | None:
    sub = getattr(module, name, None)
    return getattr(sub, "weight", None) if sub is not None else None


def _offset_norm(target) -> bool:
    """Whether the target's RMSNorm multiplies by (1 + weight) (Gemma's families), where the
    head's multiplies by weight."""
    norm = getattr(target.base_model, "norm", None)
    return norm is not None and "Gemma" in type(norm).__name__
