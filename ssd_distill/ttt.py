"""The head's "training-time test" (docs/distill.md §8): K drafting steps unrolled at every
position of a row, as SafeAILab's eagle/traineagle3 trains EAGLE-3, and the loss and the
agreement read from them.

    step 0   h⁰_i = fc(aux_i)   with token x_{i+1}   -> the target's distribution at i+1
    step j   hʲ_i = out^{j-1}_i with token x_{i+1+j} -> the target's distribution at i+1+j

Step j's query at i attends to step 0's keys at positions <= i (the features the target
computed) and to steps 1..j's keys at i alone (the head's own earlier drafts), at RoPE
position i + j: the chain the runtime drafts from position i, every chain in one pass.

    loss = Σ_j 0.8^j · CE(p_target restricted to the draft vocabulary, q_head step j)
"""
from __future__ import annotations

import torch

from .data import Rows

STEP_WEIGHT = 0.8        # SafeAILab's ploss_weight: 0.8^j for the j-th unrolled step
_NEG = -1e30             # an additive mask that softmax turns into exactly 0


def unroll(head, batch: Rows, steps: int):
    """Yield, for each step j, (logits over the draft vocabulary at the positions it is scored,
    those positions' target labels as a Rows-like tuple (top_ids, top_logp, argmax)).

    batch: rows trimmed of padding, with features (B, T, 3H), on the head's device."""
    B, T = batch.ids.shape
    device = batch.ids.device
    hidden = head.fuse(batch.features.float())                            # (B, T, H)
    position = torch.arange(T, device=device)[None, :].expand(B, -1)       # (B, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()      # (T, T) key <= query
    diagonal = torch.eye(T, dtype=torch.bool, device=device)               # (T, T) key == query
    top_logp = batch.top_logp.float()                                      # (B, T, K)
    past_k = past_v = hidden.new_zeros(B, 0, head.heads.num_kv_heads, head.heads.head_dim)
    for j in range(steps):
        tokens = _shift(batch.ids, 1 + j, 0)                               # (B, T): x_{i+1+j}
        scored = _shift(batch.mask, 1 + j, False)                          # (B, T)
        visible = torch.cat([causal] + [diagonal] * j, dim=1)              # (T, (j+1)T)
        bias = torch.where(visible, 0.0, _NEG)[None, None, None].expand(B, 1, 1, -1, -1)
        out, k, v = head.step(tokens, hidden, position + j, past_k, past_v, bias)
        past_k, past_v = torch.cat((past_k, k), 1), torch.cat((past_v, v), 1)  # (B, (j+1)T, Hkv, D)
        logits = head.draft_logits(out[scored])                            # (N, Vd)
        labels = tuple(_shift(t, 1 + j, 0)[scored]          # (float32: autocast's cat
                       for t in (batch.top_ids, top_logp, batch.argmax))   # takes no half)
        yield logits, labels
        hidden = out                                                       # fed back, not detached


def loss(head, batch: Rows, steps: int, t2d: torch.Tensor, draft_of: torch.Tensor
         ) -> torch.Tensor:
    """Σ_j 0.8^j · the mean over step j's scored positions whose target argmax is in the draft
    vocabulary (SafeAILab's position_mask) of CE(p, q): p the target's top-k probabilities kept
    inside the draft vocabulary and renormalised (SafeAILab: its whole distribution there),
    q the head's. `draft_of` maps a target id to its draft id, -1 outside."""
    total = torch.zeros((), device=batch.ids.device)
    for j, (logits, (top_ids, top_logp, argmax)) in enumerate(unroll(head, batch, steps)):
        keep = t2d[argmax]                                                 # (N,)
        if not bool(keep.any()):
            continue
        logq = torch.log_softmax(logits[keep], -1)                         # (n, Vd)
        cols = draft_of[top_ids[keep].long()]                              # (n, K)
        inside = cols >= 0
        p = torch.where(inside, top_logp[keep].float().exp(), 0.0)         # (n, K)
        p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)
        ce = -(p * logq.gather(-1, cols.clamp(min=0))).sum(-1)             # (n,)
        total = total + STEP_WEIGHT ** j * ce.mean()
    return total


@torch.no_grad()
def agreement(head, rows: Rows, steps: int, batch: int, device) -> list[tuple[int, int]]:
    """Per step, (positions where the head's argmax, mapped to a target id, is the target's
    argmax; scored positions): teacher-forced top-1 agreement of each unrolled step."""
    counts = [[0, 0] for _ in range(steps)]
    d2t = head.d2t
    for first in range(0, len(rows), batch):
        part = rows.select(torch.arange(first, min(first + batch, len(rows))))
        width = int(part.mask.any(0).nonzero().max()) + 1 if part.positions else 0
        if width == 0:
            continue
        part = to_device(part.trim(width), device)
        for j, (logits, (_, _, argmax)) in enumerate(unroll(head, part, steps)):
            picks = logits.argmax(-1)
            picks = picks + d2t[picks]                                      # draft -> target id
            counts[j][0] += int((picks == argmax).sum())
            counts[j][1] += len(argmax)
    return [(a, n) for a, n in counts]


def to_device(rows: Rows, device) -> Rows:
    return Rows(**{k: v.to(device) for k, v in rows.as_dict().items()})


def _shift(t: torch.Tensor, n: int, fill) -> torch.Tensor:
    """t moved n positions left along dim 1, `fill` at the end: row i holds t[i + n]."""
    pad = torch.full((t.shape[0], min(n, t.shape[1]), *t.shape[2:]), fill, dtype=t.dtype,
                     device=t.device)
    return torch.cat((t[:, n:], pad), 1)
