"""Mixture-of-experts blocks computed from their Hugging Face parameters (adapters.MoeSpec).

Hugging Face runs only the experts a token picked, looping over the experts hit: a loop
over data that torch.export cannot trace. Here every expert runs on every token and a dense
routing matrix, zero outside each token's top-k, weighs their outputs: the same products,
summed with exact zeros in between, so the same numbers at num_experts / top_k times the
routed expert compute. The `ort` flavour hands the blocks it computes exactly to ONNX
Runtime's MoE kernel, which runs only the routed ones (ort_ops.py, kernel_refusal).
"""
from __future__ import annotations

import torch
from ssd_runtime.errors import ConfigError
from torch import nn

from .activations import clamped_swiglu
from .adapters import MoeSpec, get_path


def check_moe(layers: nn.ModuleList, spec: MoeSpec, source: str) -> int:
    """The number of experts, after checking that every MoE layer is what moe() computes:
    a linear router (biased only if the spec says so) and fused, gated experts; else a
    ConfigError."""
    counts = set()
    for i in spec.layers:
        block = moe_block(layers[i], spec)
        router, experts = get_path(block, spec.router), get_path(block, spec.experts)
        where = f"{source}: layer {i}'s mixture-of-experts block"
        weight = getattr(router, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 \
                or (getattr(router, "bias", None) is not None) != spec.router_bias:
            raise ConfigError(f"{where} has a router ({type(router).__name__}) that is not a "
                              f"{'biased' if spec.router_bias else 'bias-free'} linear map to "
                              f"one logit per expert; ssd-export reproduces only top-k routing "
                              f"over such logits.")
        gate_up, down = (getattr(experts, n, None) for n in ("gate_up_proj", "down_proj"))
        layout = {"has_gate": True, "has_post_expert_norm": False}
        odd = [f"{k}={getattr(experts, k)}" for k, v in layout.items()
               if getattr(experts, k, v) != v]
        if getattr(experts, "has_bias", False) and not all(
                isinstance(getattr(experts, f"{n}_bias", None), torch.Tensor)
                for n in ("gate_up_proj", "down_proj")):
            odd.append("has_bias=True without gate_up_proj_bias and down_proj_bias")
        if spec.swiglu is None and not callable(getattr(experts, "act_fn", None)):
            odd.append("no act_fn")
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) \
                or gate_up.dim() != 3 or odd:
            raise ConfigError(f"{where} stores its experts ({type(experts).__name__}"
                              f"{': ' + ', '.join(odd) if odd else ''}) in a layout ssd-export "
                              f"does not compute; it expects fused, gated gate_up_proj and "
                              f"down_proj (optionally transposed, interleaved, biased) and the "
                              f"experts' act_fn, with no norm after the experts.")
        E = gate_up.shape[0]
        if weight.shape[0] != E or not 1 <= spec.top_k <= E:
            raise ConfigError(f"{where} routes to the top {spec.top_k} of {weight.shape[0]} "
                              f"logits over {E} experts; expected 1 <= top_k <= experts, one "
                              f"logit per expert.")
        if spec.shared_expert is not None and get_path(block, spec.shared_expert) is None:
            raise ConfigError(f"{where} has no shared expert {spec.shared_expert!r}.")
        if spec.groups > 1 and (E % spec.groups or not 1 <= spec.topk_groups <= spec.groups
                                or spec.topk_groups * E // spec.groups < spec.top_k):
            raise ConfigError(f"{where} routes within the best {spec.topk_groups} of "
                              f"{spec.groups} groups of its {E} experts to the top {spec.top_k}; "
                              f"expected equal groups holding at least top_k experts.")
        counts.add(E)
    if len(counts) > 1:
        raise ConfigError(f"{source}: its mixture-of-experts layers have different numbers of "
                          f"experts ({sorted(counts)}); ssd-export expects one number.")
    return counts.pop() if counts else 0


def moe_block(layer: nn.Module, spec: MoeSpec) -> nn.Module:
    """The module the spec's paths start from: the layer's `block`, or the layer itself."""
    return layer if spec.block is None else get_path(layer, spec.block)


def moe(block: nn.Module, spec: MoeSpec, h: torch.Tensor,
        kernel: tuple[torch.Tensor | None, ...] | None = None) -> torch.Tensor:
    """h (B, T, H) -> the block's output (B, T, H): dense, or on ONNX Runtime's MoE kernel when
    its weights (kernel_weights) are given.

        h ─┬─ router ─ scores ─ top-k [─ / sum] [· scale] ─ dense weights (N, E) ─┐
           ├─ every expert: down · (act(gate · h) * (up · h)) (E, N, H) ─ Σ_e w·out ─┐
           └─ [shared expert · sigmoid(shared_gate · h)] ───────────────────────────── + ─
    """
    B, T, H = h.shape
    x = h.reshape(B * T, H)                                         # (N, H)
    experts = get_path(block, spec.experts)
    logits = router_logits(get_path(block, spec.router), spec, x)   # (N, E)
    if kernel is not None:
        from .ort_ops import moe_kernel

        alpha, beta, limit = spec.swiglu or (1.0, 0.0, 0.0)
        out = moe_kernel(x, logits, *kernel, spec.top_k, int(spec.renormalise), alpha, beta,
                         limit)
    else:
        weights = routing_weights(logits, spec, block)              # (N, E)
        if not spec.float_weights:
            weights = weights.to(x.dtype)
        y = _experts(experts, spec, x)                              # (E, N, H)
        out = (y * weights.t()[:, :, None]).to(x.dtype).sum(dim=0)  # (N, H)
    if spec.shared_expert is not None:
        shared = get_path(block, spec.shared_expert)(x)
        if spec.shared_gate is not None:
            shared = torch.sigmoid(get_path(block, spec.shared_gate)(x)) * shared
        out = out + shared
    return out.view(B, T, H)


def router_logits(router: nn.Module, spec: MoeSpec, x: torch.Tensor) -> torch.Tensor:
    """x (N, H) -> (N, E): the router's linear map, in float32 if the spec says so or the
    router's weights are float32 (HunYuan keeps them so and casts h up)."""
    weight, bias = router.weight, router.bias if spec.router_bias else None
    if spec.router_fp32 or weight.dtype == torch.float32:
        x, weight = x.float(), weight.float()
        bias = None if bias is None else bias.float()
    logits = torch.matmul(x, weight.t())
    return logits if bias is None else logits + bias


def routing_weights(logits: torch.Tensor, spec: MoeSpec, block: nn.Module) -> torch.Tensor:
    """(N, E) logits -> (N, E) float32 weights: each token's top-k scores (renormalised,
    scaled) in their experts' columns, zero elsewhere.

        scores = softmax or sigmoid(logits); choice = scores [+ bias] [outside the best
        groups: -inf]; the k best choices pick the experts, their scores are the weights
    """
    N, E = logits.shape
    if spec.scoring == "sparsemixer":
        return _one_hot_weights(*_sparsemixer(logits.float(), spec.mixer_eps), E)
    scores = torch.softmax(logits.float(), dim=-1) if spec.scoring == "softmax" \
        else torch.sigmoid(logits.float())                          # (N, E)
    choice = scores
    if spec.choice_bias is not None:
        choice = choice + get_path(block, spec.choice_bias).float().reshape(E)
    if spec.groups > 1:
        grouped = choice.view(N, spec.groups, E // spec.groups)     # (N, n, E/n)
        group_scores = grouped.topk(spec.group_score_top, dim=-1)[0].sum(dim=-1)  # (N, n)
        best = torch.topk(group_scores, spec.topk_groups, dim=-1)[1]  # (N, topk_groups)
        eligible = (best[:, :, None] == torch.arange(spec.groups)).any(dim=1)   # (N, n)
        eligible = eligible[:, :, None].expand(N, spec.groups, E // spec.groups).reshape(N, E)
        choice = choice.masked_fill(~eligible, float("-inf"))
    index = torch.topk(choice, spec.top_k, dim=-1)[1]               # (N, k)
    top = scores.gather(1, index)
    if spec.renormalise:
        total = top.sum(dim=-1, keepdim=True)
        top = top / (total.clamp(min=spec.renorm_floor) if spec.renorm_floor else total)
    if spec.routed_scale != 1.0:
        top = top * spec.routed_scale
    return _one_hot_weights(top, index, E)


def _one_hot_weights(top: torch.Tensor, index: torch.Tensor, E: int) -> torch.Tensor:
    """top-k weights and experts (N, k) -> (N, E), zero outside the picked experts."""
    picked = (index[:, :, None] == torch.arange(E)).to(top.dtype)  # (N, k, E) one-hot
    return (picked * top[:, :, None]).sum(dim=1)                    # one non-zero term per cell


def _sparsemixer(logits: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's routing at inference: the best expert, weighted by a softmax over the logits
    within 2·eps (relative) of its own; then the best of the rest, likewise. (N, 2) each."""
    w1, i1 = _mixer_round(logits, logits, eps)
    rest = logits.scatter(-1, i1, float("-inf"))
    w2, i2 = _mixer_round(rest, logits, eps)
    return torch.cat((w1, w2), dim=-1), torch.cat((i1, i2), dim=-1)


def _mixer_round(candidates: torch.Tensor, logits: torch.Tensor, eps: float):
    best, index = candidates.max(dim=-1, keepdim=True)               # (N, 1)
    far = (best - logits) / logits.abs().clamp(min=best) > 2 * eps   # (N, E)
    gates = torch.softmax(candidates.masked_fill(far, float("-inf")), dim=-1)
    return gates.gather(-1, index), index


def kernel_weights(block: nn.Module, spec: MoeSpec) -> tuple[torch.Tensor | None, ...]:
    """fc1, fc1 bias, fc2, fc2 bias for ONNX Runtime's MoE kernel (copies, or None): fc1
    (E, 2I, H) with gate and up rows interleaved (gate_0, up_0, gate_1, ...), as its CPU
    SwiGLU reads them, and fc2 (E, H, I)."""
    experts = get_path(block, spec.experts)
    gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    if getattr(experts, "is_transposed", False):
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    E, two_i, H = gate_up.shape
    bias1, bias2 = _biases(experts)
    if getattr(experts, "is_concatenated", True):                   # [gate; up] -> interleaved
        gate_up = gate_up.reshape(E, 2, two_i // 2, H).transpose(1, 2).reshape(E, two_i, H)
        if bias1 is not None:
            bias1 = bias1.reshape(E, 2, two_i // 2).transpose(1, 2).reshape(E, two_i)
    return tuple(None if w is None else w.detach().contiguous()
                 for w in (gate_up, bias1, down, bias2))


def kernel_refusal(layers: nn.ModuleList, spec: MoeSpec) -> str:
    """Why the `ort` flavour runs this block dense, '' where ONNX Runtime's MoE kernel computes
    it: softmax top-k routing with nothing added (no float32 router, selection bias, groups or
    scale) over logits in the experts' dtype, and SiLU experts (its SwiGLU is silu(gate) * up
    with alpha 1 and beta 0, or MoeSpec.swiglu's clamped one)."""
    if spec.activation != "silu" and spec.swiglu is None:
        return f"ONNX Runtime's MoE kernel takes SiLU experts, not {spec.activation}"
    if spec.scoring != "softmax" or spec.router_fp32 or spec.choice_bias is not None \
            or spec.groups > 1 or spec.routed_scale != 1.0 or spec.renorm_floor:
        return "ONNX Runtime's MoE kernel routes by softmax top-k alone, not this model's routing"
    for i in spec.layers:
        block = moe_block(layers[i], spec)
        router = get_path(block, spec.router).weight.dtype
        if router != get_path(block, spec.experts).gate_up_proj.dtype:
            return (f"ONNX Runtime's MoE kernel takes router logits in the experts' dtype; this "
                    f"router's weights are {str(router).removeprefix('torch.')}")
    return ""


def cost_note(spec: MoeSpec, num_experts: int, ort: bool, refusal: str) -> str:
    """The one progress line an MoE export prints: how its experts run, and at what cost."""
    if ort and not refusal:
        return (f"MoE on ONNX Runtime's MoE kernel: {spec.top_k} of {num_experts} experts run "
                f"per token, as routed")
    why = refusal if ort else "sparse routing does not trace to plain ONNX"
    return (f"MoE exported dense: all {num_experts} experts run for every token, "
            f"{num_experts / spec.top_k:g}x the routed experts' compute ({why})")


def _experts(experts: nn.Module, spec: MoeSpec, x: torch.Tensor) -> torch.Tensor:
    """x (N, H) -> every expert's output (E, N, H), from the weights as they are stored."""
    transposed = getattr(experts, "is_transposed", False)
    bias1, bias2 = _biases(experts)
    w1, w2 = experts.gate_up_proj, experts.down_proj
    gate_up = torch.matmul(x, w1 if transposed else w1.transpose(1, 2))       # (E, N, 2I)
    if bias1 is not None:
        gate_up = gate_up + bias1[:, None, :]
    if getattr(experts, "is_concatenated", True):
        gate, up = gate_up.chunk(2, dim=-1)                                   # [gate | up]
    else:
        gate, up = gate_up[..., 0::2], gate_up[..., 1::2]                     # interleaved
    inner = experts.act_fn(gate) * up if spec.swiglu is None else clamped_swiglu(gate, up,
                                                                               *spec.swiglu)
    y = torch.matmul(inner, w2 if transposed else w2.transpose(1, 2))        # (E, N, H)
    return y if bias2 is None else y + bias2[:, None, :]


def _biases(experts: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    if not getattr(experts, "has_bias", False):
        return None, None
    return experts.gate_up_proj_bias, experts.down_proj_bias
