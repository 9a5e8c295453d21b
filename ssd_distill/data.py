"""What the draft learns from: the target's own answers to prompts (on-policy text, as in
DistillSpec) and, when given, the user's text, each position labelled with the target's
next-token distribution (its top-k log-probs) and its argmax (docs/distill.md §2)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Callable

import torch

from ssd_runtime.errors import ConfigError

from .config import Preset

Progress = Callable[[int, int, str], None]   # (done, total, extra text)


@dataclass
class Rows:
    """Token rows and their labels. Row r's position i is labelled (mask[r, i]) with the
    target's distribution over the token after it: `top_ids`, `top_logp` (top-k, log-probs at
    temperature 1) and `argmax`. Rows are right-padded with `pad`."""

    ids: torch.Tensor        # (N, L) int64
    mask: torch.Tensor       # (N, L) bool: position labelled
    top_ids: torch.Tensor    # (N, L, K) int32
    top_logp: torch.Tensor   # (N, L, K) float16
    argmax: torch.Tensor     # (N, L) int64
    features: torch.Tensor | None = None   # (N, L, 3H) float16: --kind head, the target's
                                           # hidden states at the head's layers (head_data.py)

    @property
    def positions(self) -> int:
        return int(self.mask.sum())

    def __len__(self) -> int:
        return len(self.ids)

    def draw(self, gen: torch.Generator, n: int) -> "Rows":
        """n rows drawn at random (with replacement): a training batch."""
        return self.select(torch.randint(0, len(self.ids), (n,), generator=gen))

    def select(self, index: torch.Tensor) -> "Rows":
        return Rows(**{k: v[index] for k, v in self.as_dict().items()})

    def trim(self, width: int) -> "Rows":
        """The first `width` positions of every row."""
        return Rows(**{k: v[:, :width] for k, v in self.as_dict().items()})

    def as_dict(self) -> dict:
        names = ("ids", "mask", "top_ids", "top_logp", "argmax", "features")
        return {k: getattr(self, k) for k in names if getattr(self, k) is not None}


def read_prompts(path: Path | None) -> list[Any]:
    """Prompts from a JSONL file of {"prompt": text} or {"messages": [...]} lines (blank lines
    skipped), or the shipped set (750 chat and code requests) when path is None."""
    source = path if path is not None else files("ssd_distill").joinpath("data/prompts.jsonl")
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompts {path}: cannot read it ({exc.__class__.__name__}: {exc}). "
                          f"---> HINT: give a UTF-8 JSONL file, one {{\"prompt\": ...}} or "
                          f"{{\"messages\": [...]}} object a line.") from None
    prompts: list[Any] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--prompts {path} line {n} is not JSON ({exc.msg}). ---> HINT: "
                              f"one {{\"prompt\": ...}} or {{\"messages\": [...]}} a line.") from None
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(item["prompt"])
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            prompts.append(item["messages"])
        else:
            raise ConfigError(f"--prompts {path} line {n} has neither a \"prompt\" string nor a "
                              f"\"messages\" list. ---> HINT: {{\"prompt\": \"Explain ...\"}}.")
    return prompts


def read_texts(paths: tuple[Path, ...]) -> list[str]:
    texts = []
    for path in paths:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--data {path}: cannot read it as UTF-8 text "
                              f"({exc.__class__.__name__}). ---> HINT: give plain text files "
                              f"(code, documents, chat logs) in UTF-8.") from None
    return texts


def encode_prompt(tokenizer: Any, prompt: Any) -> list[int]:
    """A prompt's ids as the runtime would encode it: through the target's chat template with
    the generation prompt when it has one; else as plain text with the tokenizer's added
    tokens (a chat's messages joined by newlines)."""
    if getattr(tokenizer, "chat_template", None):
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if isinstance(prompt, list):
        prompt = plain_text(prompt)
    return list(tokenizer(prompt)["input_ids"])


def plain_text(messages: list) -> str:
    """A chat for a target without a chat template (a base model): its contents, a line each."""
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


@torch.no_grad()
def answer(model: Any, prompts: list[list[int]], preset: Preset, eos: list[int], seed: int,
           progress: Progress, budget_s: float | None = None, batch: int = 32) -> Rows:
    """The target's answers to `prompts` (each up to preset.new_tokens, ending at an eos), a
    share greedy and the rest sampled at temperature 1, decoded in batches with Hugging Face's
    KV cache; every answer position is labelled with the distribution it was decoded from.
    Past `budget_s` seconds no new batch starts: the rows are those answered."""
    from transformers import DynamicCache

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))   # similar lengths batch
    gen = torch.Generator().manual_seed(seed)
    results: dict[int, tuple[list[int], list[torch.Tensor]]] = {}
    done_tokens, total = 0, len(prompts) * preset.new_tokens
    eos_t = torch.tensor(eos or [-1])
    start = time.monotonic()
    for first in range(0, len(order), batch):
        if budget_s is not None and time.monotonic() - start > budget_s:
            break
        rows = order[first:first + batch]
        width = max(len(prompts[i]) for i in rows)
        pad = 0
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in rows])
        attn = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i])
                             for i in rows])
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        greedy = torch.tensor([(i * 7919 % 1000) / 1000 < preset.greedy_share for i in rows])
        cache = DynamicCache()
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos,
                       cache=cache, use_cache=True).logits[:, -1].float()             # (B, V)
        answers: list[list[int]] = [[] for _ in rows]
        labels: list[list[torch.Tensor]] = [[] for _ in rows]
        alive = torch.ones(len(rows), dtype=torch.bool)
        last = pos[:, -1:]
        for _ in range(preset.new_tokens):
            logp = torch.log_softmax(logits, -1)                              # (B, V)
            top = logp.topk(min(preset.top_k, logp.shape[-1]), -1)
            sampled = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            nxt = torch.where(greedy, logp.argmax(-1), sampled)               # (B,)
            for b in torch.nonzero(alive).flatten().tolist():
                answers[b].append(int(nxt[b]))
                labels[b].append(torch.stack([top.indices[b].float(), top.values[b],
                                              top.indices[b, :1].float().expand(
                                                  top.indices.shape[-1])]))
            alive &= ~torch.isin(nxt, eos_t)
            done_tokens += len(rows)
            if not alive.any():
                break
            attn = torch.cat([attn, torch.ones(len(rows), 1, dtype=attn.dtype)], 1)
            last = last + 1
            logits = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=last,
                           cache=cache, use_cache=True).logits[:, -1].float()
            progress(min(done_tokens, total), total, _rate(done_tokens, start))
        for b, i in enumerate(rows):
            results[i] = (answers[b], labels[b])
        done_tokens = first * preset.new_tokens + len(rows) * preset.new_tokens
        progress(min(done_tokens, total), total, _rate(done_tokens, start))
    return _pack([(prompts[i], *results[i]) for i in range(len(prompts)) if i in results],
                 preset)


@torch.no_grad()
def label_text(model: Any, tokenizer: Any, texts: list[str], preset: Preset,
               progress: Progress) -> Rows | None:
    """Windows of the user's text (at most preset.text_tokens tokens), every position labelled
    by the target teacher-forced."""
    if not texts:
        return None
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for text in texts:
        stream += list(tokenizer(text)["input_ids"]) + ([eos] if eos is not None else [])
    stream = stream[:preset.text_tokens]
    n = preset.seq_len
    windows = [stream[s:s + n] for s in range(0, len(stream) - 1, n) if len(stream[s:s + n]) > 1]
    items, start = [], time.monotonic()
    for first in range(0, len(windows), preset.batch):
        part = windows[first:first + preset.batch]
        width = max(len(w) for w in part)
        ids = torch.tensor([w + [0] * (width - len(w)) for w in part])
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)      # (B, L, V)
        top = logp.topk(min(preset.top_k, logp.shape[-1]), -1)
        for b, w in enumerate(part):
            labels = [torch.stack([top.indices[b, i].float(), top.values[b, i],
                                   top.indices[b, i, :1].float().expand(top.indices.shape[-1])])
                      for i in range(len(w) - 1)]
            items.append(([w[0]], w[1:], labels))   # "prompt" = first token: all labelled
        done = sum(len(w) for w in windows[:first + len(part)])
        progress(done, len(stream), _rate(done, start))
    return _pack(items, preset)


def concat(parts: list[Rows | None]) -> Rows:
    parts = [p for p in parts if p is not None and len(p.ids)]
    width = max(p.ids.shape[1] for p in parts)

    def pad(t: torch.Tensor, value) -> torch.Tensor:
        extra = width - t.shape[1]
        if extra == 0:
            return t
        shape = (t.shape[0], extra, *t.shape[2:])
        return torch.cat([t, torch.full(shape, value, dtype=t.dtype)], 1)

    return Rows(*(torch.cat([pad(getattr(p, name), value) for p in parts])
                  for name, value in (("ids", 0), ("mask", False), ("top_ids", 0),
                                      ("top_logp", -float("inf")), ("argmax", 0))))


def _pack(items: list[tuple[list[int], list[int], list[torch.Tensor]]], preset: Preset) -> Rows:
    """Rows of prompt + answer, cut to preset.seq_len; position len(prompt) - 1 + j is
    labelled with answer token j's distribution."""
    width = min(preset.seq_len, max(len(p) + len(a) for p, a, _ in items))
    n = len(items)
    k = next((labels[0].shape[1] for _, _, labels in items if labels), preset.top_k)
    rows = Rows(torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width, dtype=torch.bool),
                torch.zeros(n, width, k, dtype=torch.int32),
                torch.full((n, width, k), -float("inf"), dtype=torch.float16),
                torch.zeros(n, width, dtype=torch.long))
    for r, (prompt, ans, labels) in enumerate(items):
        seq = (prompt + ans)[:width]
        rows.ids[r, :len(seq)] = torch.tensor(seq)
        for j, label in enumerate(labels):
            i = len(prompt) - 1 + j
            if i >= width:
                break
            rows.mask[r, i] = True
            rows.top_ids[r, i] = label[0].to(torch.int32)
            rows.top_logp[r, i] = label[1].half()
            rows.argmax[r, i] = int(label[2][0])
    return rows


def _rate(done: int, start: float) -> str:
    seconds = max(time.monotonic() - start, 1e-6)
    return f"{done / seconds:,.0f} tok/s"
