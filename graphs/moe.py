"""Mixture-of-experts blocks computed from their Hugging Face parameters (adapters.MoeSpec).

Hugging Face runs only the experts a token picked, looping over the experts hit: a loop
over data that torch.export cannot trace. Here every expert runs on every token and a dense
routing matrix, zero outside each token's top-k, weighs their outputs: the same products,
summed with exact zeros in between, so the same numbers at num_experts / top_k times the
routed expert compute. The `ort` flavour hands SiLU experts to ONNX Runtime's MoE kernel,
which runs only the routed ones (ort_ops.py).
"""
from __future__ import annotations

import torch
from ssd_runtime.errors import ConfigError
from torch import nn

from .adapters import MoeSpec, get_path


def check_moe(layers: nn.ModuleList, spec: MoeSpec, source: str) -> int:
    """The number of experts, after checking that every MoE layer is what moe() computes:
    a bias-free router and fused, gated, bias-free experts; else a ConfigError."""
    counts = set()
    for i in spec.layers:
        block = moe_block(layers[i], spec)
        router, experts = get_path(block, spec.router), get_path(block, spec.experts)
        where = f"{source}: layer {i}'s mixture-of-experts block"
        weight = getattr(router, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 \
                or getattr(router, "bias", None) is not None:
            raise ConfigError(f"{where} has a router ({type(router).__name__}) that is not a "
                              f"bias-free linear map to one logit per expert; ssd-export "
                              f"reproduces only top-k routing over such logits.")
        gate_up, down = (getattr(experts, n, None) for n in ("gate_up_proj", "down_proj"))
        layout = {"has_gate": True, "has_bias": False, "is_transposed": False,
                  "is_concatenated": True, "has_post_expert_norm": False}
        odd = [f"{k}={getattr(experts, k)}" for k, v in layout.items()
               if getattr(experts, k, v) != v]
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor) \
                or gate_up.dim() != 3 or odd:
            raise ConfigError(f"{where} stores its experts ({type(experts).__name__}"
                              f"{': ' + ', '.join(odd) if odd else ''}) in a layout ssd-export "
                              f"does not compute; it expects fused gate_up_proj (E, 2I, H) as "
                              f"[gate; up] and down_proj (E, H, I), without biases.")
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
        kernel_fc1: torch.Tensor | None = None) -> torch.Tensor:
    """h (B, T, H) -> the block's output (B, T, H): dense, or on ONNX Runtime's MoE kernel when
    `kernel_fc1` (interleaved_gate_up) is given.

        h ─┬─ router ─ scores ─ top-k [─ / sum] [· scale] ─ dense weights (N, E) ─┐
           ├─ every expert: down · (act(gate · h) * (up · h)) (E, N, H) ─ Σ_e w·out ─┐
           └─ [shared expert · sigmoid(shared_gate · h)] ───────────────────────────── + ─
    """
    B, T, H = h.shape
    x = h.reshape(B * T, H)                                         # (N, H)
    experts = get_path(block, spec.experts)
    logits = router_logits(get_path(block, spec.router), spec, x)   # (N, E)
    if kernel_fc1 is not None:
        from .ort_ops import moe_kernel

        out = moe_kernel(x, logits, kernel_fc1, experts.down_proj, spec.top_k,
                         int(spec.renormalise))
    else:
        weights = routing_weights(logits, spec, block)              # (N, E)
        if not spec.float_weights:
            weights = weights.to(x.dtype)
        gate, up = torch.matmul(x, experts.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
        y = torch.matmul(experts.act_fn(gate) * up, experts.down_proj.transpose(1, 2))  # (E,N,H)
        out = (y * weights.t()[:, :, None]).to(x.dtype).sum(dim=0)  # (N, H)
    if spec.shared_expert is not None:
        shared = get_path(block, spec.shared_expert)(x)
        if spec.shared_gate is not None:
            shared = torch.sigmoid(get_path(block, spec.shared_gate)(x)) * shared
        out = out + shared
    return out.view(B, T, H)


def router_logits(router: nn.Module, spec: MoeSpec, x: torch.Tensor) -> torch.Tensor:
    """x (N, H) -> (N, E): the router's linear map, in float32 if the spec says so."""
    weight = router.weight
    if spec.router_fp32:
        x, weight = x.float(), weight.float()
    return torch.matmul(x, weight.t())


def routing_weights(logits: torch.Tensor, spec: MoeSpec, block: nn.Module) -> torch.Tensor:
    """(N, E) logits -> (N, E) float32 weights: each token's top-k scores (renormalised,
    scaled) in their experts' columns, zero elsewhere.

        scores = softmax or sigmoid(logits); choice = scores [+ bias] [outside the best
        groups: -inf]; the k best choices pick the experts, their scores are the weights
    """
    N, E = logits.shape
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
    experts = torch.arange(E, device=logits.device)
    picked = (index[:, :, None] == experts).to(top.dtype)           # (N, k, E) one-hot
    return (picked * top[:, :, None]).sum(dim=1)                    # one non-zero term per cell


def interleaved_gate_up(block: nn.Module, spec: MoeSpec) -> torch.Tensor:
    """fc1 for ONNX Runtime's MoE kernel, whose CPU SwiGLU reads gate and up rows interleaved
    (gate_0, up_0, gate_1, ...): (E, 2I, H), a copy. Its fc2 is down_proj (E, H, I) as it is."""
    gate_up = get_path(block, spec.experts).gate_up_proj.detach()
    E, two_i, H = gate_up.shape
    return gate_up.view(E, 2, two_i // 2, H).transpose(1, 2).reshape(E, two_i, H).contiguous()


def uses_kernel(spec: MoeSpec) -> bool:
    """Whether the `ort` flavour can use ONNX Runtime's MoE kernel: softmax top-k routing with
    nothing added (no selection bias, groups or scale) and SiLU experts (its SwiGLU is
    silu(gate) * up with alpha 1 and beta 0)."""
    return (spec.activation == "silu" and spec.scoring == "softmax" and spec.choice_bias is None
            and spec.groups == 1 and spec.routed_scale == 1.0 and not spec.renorm_floor)


def kernel_refusal(spec: MoeSpec) -> str:
    """Why the `ort` flavour runs this block dense ('' where the kernel takes it)."""
    if spec.activation != "silu":
        return f"ONNX Runtime's MoE kernel takes SiLU experts, not {spec.activation}"
    if not uses_kernel(spec):
        return ("ONNX Runtime's MoE kernel routes by softmax top-k alone, not this model's "
                "routing")
    return ""


def cost_note(spec: MoeSpec, num_experts: int, ort: bool) -> str:
    """The one progress line an MoE export prints: how its experts run, and at what cost."""
    if ort and uses_kernel(spec):
        return (f"MoE on ONNX Runtime's MoE kernel: {spec.top_k} of {num_experts} experts run "
                f"per token, as routed")
    why = kernel_refusal(spec) if ort else "sparse routing does not trace to plain ONNX"
    return (f"MoE exported dense: all {num_experts} experts run for every token, "
            f"{num_experts / spec.top_k:g}x the routed experts' compute ({why})")
