"""A target's own multi-token-prediction (MTP) layer as its draft head, no training: read from the
target's checkpoint (transformers drops it at load) and held as a one-layer model of the target's
class, so that its decoder layer is the family's own (MLA, MoE, RoPE). docs/design.md §14.

    h_t: the target's last hidden state, after its final norm ── hnorm ──────┐
    embed(x_{t+1}) (the target's table; zero at position 0) ─── enorm ──┐    │
                                                                 cat [e | h] (2H) ─ eh_proj (H)
    ─ decoder layer ─┬─ shared_head.norm ─ shared_head.head ─ logits (V)
                     └─ hidden_out: the next step's h (the same layer, as vLLM drafts)
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from ssd_runtime.errors import ConfigError
from torch import nn

from .attention import Heads
from .decoder import Decoder
from .registry import adapter_for

# classes whose MTP layer is `model.layers.{num_hidden_layers + i}.*` as vLLM's deepseek_mtp.py
# and glm4_moe_mtp.py read it, and whose target graphs the toolkit builds
MTP_CLASSES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeForCausalLM")
# classes with MTP layers in another layout, or with a target this toolkit does not build
OTHER_MTP = {
    "MiMoForCausalLM": "MiMo keeps its MTP layers as model.mtp_layers.* around a Qwen2 layer "
                       "(vLLM's mimo_mtp.py), and MiMo is not a supported target class",
    "Qwen3NextForCausalLM": "Qwen3-Next keeps its MTP layers as mtp.* beside hybrid linear "
                            "attention, which the toolkit does not build",
}
FUSION = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")
OPTIONAL = ("shared_head.head.weight", "embed_tokens.weight")
INDEX, SINGLE = "model.safetensors.index.json", "model.safetensors"


@dataclass(frozen=True)
class MtpConfig:
    """What defines the head beside the target (the names head_parity reads as an EAGLE-3
    config's): H, the target's H (the features' width), V, the checkpoint's layer index."""

    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    source_layer: int
    num_nextn_predict_layers: int
    own_lm_head: bool           # shared_head.head in the checkpoint (else the target's lm_head)
    rms_norm_eps: float

    @property
    def feature_width(self) -> int:
        return self.target_hidden_size

    @property
    def aux_layer_ids(self) -> tuple[int]:
        """The one feature the head reads: Hugging Face's hidden_states[L], after the final
        norm (decoder.Decoder._aux), L = the target's depth = source_layer."""
        return (self.source_layer,)


class MtpHead(nn.Module):
    """The MTP layer: enorm, hnorm, eh_proj, and `model`, a one-layer Hugging Face model of the
    target's class whose layer is the MTP block, norm shared_head.norm and lm_head
    shared_head.head (or the target's), embedding the target's."""

    def __init__(self, config: MtpConfig, model: nn.Module, fusion: dict[str, torch.Tensor],
                 heads: Heads) -> None:
        super().__init__()
        self.config, self.model = config, model.float().eval()
        H, eps = config.hidden_size, config.rms_norm_eps
        norm = type(model.model.norm)                   # the family's RMSNorm
        self.enorm, self.hnorm = norm(H, eps=eps), norm(H, eps=eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        with torch.no_grad():
            for name, module in (("enorm", self.enorm), ("hnorm", self.hnorm),
                                 ("eh_proj", self.eh_proj)):
                module.weight.copy_(fusion[f"{name}.weight"].float())
        self.heads = heads      # the cache's shape, as the target graphs lay it out
        self.eval()

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features (B, T, H) as the step's h: unchanged (hnorm reads both it and
        a previous hidden_out, so the graph sums the two, one of them zero)."""
        return features

    def first_input(self, embedded: torch.Tensor, position_ids: torch.Tensor,
                    h: torch.Tensor) -> torch.Tensor:
        """eh_proj([enorm(e) | hnorm(h)]) (B, T, H); e, the token's embedding, is zeroed at
        position 0 as vLLM's MTP layers do ("not needed by MTP")."""
        e = embedded.masked_fill((position_ids == 0)[..., None], 0.0)   # (B, T, H)
        return self.eh_proj(torch.cat((self.enorm(e), self.hnorm(h)), dim=-1))

    def forward(self, input_ids: torch.Tensor, h: torch.Tensor, position_ids: torch.Tensor,
                past_kv: Any = None) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """The reference: Hugging Face's own decoder layer over eh_proj's output. input_ids
        (B, T) row t: x_{t+1}; h (B, T, H); position_ids (B, T) = t; past_kv a transformers
        cache (None: empty). Returns logits (B, T, V) float32, hidden_out (B, T, H) (the
        layer's output before shared_head.norm) and the cache."""
        from transformers import DynamicCache

        x = self.first_input(self.model.get_input_embeddings()(input_ids), position_ids, h)
        if past_kv is None:
            past_kv = DynamicCache(config=self.model.config)
        seen: dict[str, torch.Tensor] = {}
        hook = self.model.model.norm.register_forward_pre_hook(
            lambda _, args: seen.setdefault("out", args[0]))
        try:
            out = self.model(inputs_embeds=x, position_ids=position_ids, cache=past_kv,
                             use_cache=True)
        finally:
            hook.remove()
        return out.logits.float(), seen["out"], past_kv

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits           # already over the target's vocabulary


def mtp_refusal(architecture: str) -> str:
    """Why a class cannot give an MTP head here ("" if it can)."""
    if architecture in OTHER_MTP:
        return OTHER_MTP[architecture]
    if architecture not in MTP_CLASSES:
        return (f"{architecture} has no MTP layer this toolkit reads (it reads "
                f"{', '.join(MTP_CLASSES)})")
    return ""


def check_mtp(source: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The target's config.json and where each MTP tensor lives (name -> file), every name and
    shape checked from the safetensors headers alone: one ConfigError per problem, naming the
    fix, before anything is loaded or written."""
    folder = Path(source).expanduser()
    where = f"--draft mtp: the target {str(source)!r}"
    try:
        d = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: its config.json cannot be read ({exc}). ---> HINT: pass "
                          f"the target's folder, with its config.json.") from None
    arch = str((d.get("architectures") or [d.get("model_type")])[0])
    if why := mtp_refusal(arch):
        raise ConfigError(f"{where} is {arch}: {why}. ---> HINT: use a DeepSeek V3 or GLM-4 MoE "
                          f"target with MTP layers, or pass a draft model or EAGLE-3 head.")
    n = int(d.get("num_nextn_predict_layers") or 0)
    if n < 1:
        raise ConfigError(f"{where} has no MTP layer: its config.json sets "
                          f"num_nextn_predict_layers {d.get('num_nextn_predict_layers')!r}. "
                          f"---> HINT: use the checkpoint published with its MTP layers, or "
                          f"pass a draft model or EAGLE-3 head.")
    L = int(d["num_hidden_layers"])
    files = _weight_files(folder, where)
    shapes = _shapes(folder, files)
    want = _expected(d, shapes, L, where)
    mtp = f"model.layers.{L}."
    missing = [k for k in want if mtp + k not in shapes and k not in OPTIONAL]
    if missing:
        raise ConfigError(f"{where}: its config.json sets num_nextn_predict_layers {n}, but its "
                          f"safetensors lack {', '.join(mtp + k for k in missing[:4])}"
                          f"{' and more' if len(missing) > 4 else ''}. ---> HINT: the checkpoint "
                          f"was saved without its MTP layer (transformers drops it at load and "
                          f"save); use the files as published.")
    for k, shape in want.items():
        found = shapes.get(mtp + k)
        if found is not None and found != shape:
            raise ConfigError(f"{where}: {mtp + k} is {found}, expected {shape} (the target's "
                              f"hidden_size, vocab_size and layer {L - 1}'s shapes). ---> HINT: "
                              f"the MTP tensors do not belong to this config; use the files as "
                              f"published.")
    return d, {k: files[mtp + k] for k in want if mtp + k in files}


def load_mtp(source: str | Path, target: nn.Module) -> MtpHead:
    """The MTP head of the target at `source` (checked by check_mtp), its embedding (and its
    head where the checkpoint has no shared_head.head) the target's, float32."""
    from safetensors import safe_open

    folder = Path(source).expanduser()
    d, where = check_mtp(folder)
    L = int(d["num_hidden_layers"])
    mtp = f"model.layers.{L}."
    tensors: dict[str, torch.Tensor] = {}
    for name, file in where.items():
        with safe_open(str(folder / file), framework="pt") as f:
            tensors[name] = f.get_tensor(mtp + name).float()
    embed = target.get_input_embeddings().weight.detach().float()
    head = tensors.get("shared_head.head.weight")
    state = {"model.embed_tokens.weight": embed,
             "model.norm.weight": tensors["shared_head.norm.weight"],
             "lm_head.weight": head if head is not None
             else target.get_output_embeddings().weight.detach().float()}
    state.update({"model.layers.0." + k: t for k, t in tensors.items()
                  if k not in FUSION and k not in OPTIONAL})
    model = _one_layer(folder, d, state)
    config = MtpConfig(hidden_size=int(d["hidden_size"]), target_hidden_size=int(d["hidden_size"]),
                       vocab_size=int(d["vocab_size"]), source_layer=L,
                       num_nextn_predict_layers=int(d["num_nextn_predict_layers"]),
                       own_lm_head=head is not None, rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)))
    return MtpHead(config, model, tensors, Decoder(model, adapter_for(model, str(source))).heads)


def _one_layer(folder: Path, d: dict[str, Any], state: dict[str, torch.Tensor]) -> nn.Module:
    """A one-layer model of the target's class holding `state` (published names), loaded by
    transformers itself so that its layout conversions (fused experts) are the target's."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    L = int(d["num_hidden_layers"])
    config = AutoConfig.from_pretrained(folder)
    config.num_hidden_layers = 1
    config.num_nextn_predict_layers = 0
    config.tie_word_embeddings = False
    if hasattr(config, "first_k_dense_replace"):    # layer L is MoE where the target's L is
        config.first_k_dense_replace = 0 if L >= int(d.get("first_k_dense_replace", 0)) else 1
    for key in ("layer_types", "mlp_layer_types"):
        if isinstance(getattr(config, key, None), list):
            setattr(config, key, getattr(config, key)[-1:])
    with tempfile.TemporaryDirectory(prefix="ssd-mtp-") as tmp:
        config.save_pretrained(tmp)
        save_file({k: v.contiguous() for k, v in state.items()}, str(Path(tmp) / SINGLE),
                  metadata={"format": "pt"})
        model, info = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32,
                                                           output_loading_info=True)
    missing = [k for k in info.get("missing_keys", ()) if "rotary" not in k]
    if missing or info.get("mismatched_keys"):
        raise ConfigError(f"--draft mtp: the target {str(folder)!r}'s MTP layer does not load "
                          f"as a layer of its class (missing {missing[:4]}, mismatched "
                          f"{list(info.get('mismatched_keys') or [])[:4]}). ---> HINT: the MTP "
                          f"tensors do not belong to this config; use the files as published.")
    return model.eval()


def _weight_files(folder: Path, where: str) -> dict[str, str]:
    """name -> file, from model.safetensors.index.json or model.safetensors alone."""
    if (folder / INDEX).is_file():
        return dict(json.loads((folder / INDEX).read_text())["weight_map"])
    if (folder / SINGLE).is_file():
        from safetensors import safe_open

        with safe_open(str(folder / SINGLE), framework="pt") as f:
            return {k: SINGLE for k in f.keys()}
    raise ConfigError(f"{where} has no safetensors ({INDEX} or {SINGLE}): its MTP layer is read "
                      f"from them. ---> HINT: use the checkpoint's safetensors as published.")


def _shapes(folder: Path, files: dict[str, str]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(files.values())):
        with safe_open(str(folder / file), framework="pt") as f:
            for k in f.keys():
                shapes[k] = tuple(f.get_slice(k).get_shape())
    return shapes


def _expected(d: dict[str, Any], shapes: dict[str, tuple[int, ...]], L: int,
              where: str) -> dict[str, tuple[int, ...]]:
    """The MTP layer's tensors (names after model.layers.{L}.) and shapes: the fusion's, and
    the decoder block's as the target's own last layer has them (both MoE past
    first_k_dense_replace)."""
    H, V = int(d["hidden_size"]), int(d["vocab_size"])
    dense_until = int(d.get("first_k_dense_replace", 0))
    if (L - 1 >= dense_until) != (L >= dense_until):
        raise ConfigError(f"{where}: its MTP layer is a mixture-of-experts layer but none of its "
                          f"{L} layers is (first_k_dense_replace {dense_until}), so there is no "
                          f"layer to check it against. ---> HINT: this checkpoint is not supported.")
    last = f"model.layers.{L - 1}."
    want = {k[len(last):]: s for k, s in shapes.items() if k.startswith(last)}
    want.update({"enorm.weight": (H,), "hnorm.weight": (H,), "eh_proj.weight": (H, 2 * H),
                 "shared_head.norm.weight": (H,), "shared_head.head.weight": (V, H),
                 "embed_tokens.weight": (V, H)})
    return want
