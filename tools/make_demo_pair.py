"""Train a small, deterministic target/draft pair of Llama models for speculative-decoding demos.

Corpus: this interpreter's stdlib source. Step counts are fixed per preset (same seed and --threads
give the same weights); each phase also has a wall-clock budget, a safety net recorded if hit."""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.optimization import get_cosine_schedule_with_warmup
from transformers.utils import logging as hf_logging

SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}
DISTILL_TEMPERATURE, DISTILL_ALPHA = 1.0, 0.8  # draft loss: alpha * KL + (1 - alpha) * CE


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


@dataclass(frozen=True)
class Phase:
    steps: int
    lr: float
    budget_s: float  # safety net only: stop early (and say so in the card) if exceeded


@dataclass(frozen=True)
class Preset:
    corpus_mb: float
    vocab: int
    seq_len: int
    batch: int
    target: ModelSize
    draft: ModelSize
    target_phase: Phase
    draft_phase: Phase
    eval_tokens: int


# Sized from measured fp32 throughput (batch 8 x 256). quick: ~3 min on 1 core (target ~0.21 s/step);
# at this budget smaller models reach lower loss. full: ~30 min on 2 cores (target ~1.1 s/step,
# draft ~0.6). The budgets cap a slow machine at about 9 and 37 minutes.
PRESETS = {
    "quick": Preset(corpus_mb=3, vocab=2048, seq_len=256, batch=8,
                    target=ModelSize(128, 4, 4, 2, 344), draft=ModelSize(64, 1, 2, 1, 172),
                    target_phase=Phase(600, 3e-3, 360), draft_phase=Phase(300, 5e-3, 180),
                    eval_tokens=32768),
    "full": Preset(corpus_mb=16, vocab=8192, seq_len=256, batch=8,
                   target=ModelSize(384, 6, 6, 2, 1024), draft=ModelSize(160, 2, 5, 1, 432),
                   target_phase=Phase(520, 2e-3, 1800), draft_phase=Phase(400, 3e-3, 900),
                   eval_tokens=65536),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="full: use --threads 2")
    p.add_argument("--output", required=True, type=Path, help="folder to create: target/, draft/")
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (the weights depend on it)")
    p.add_argument("--force", action="store_true", help="replace an existing --output")
    return p.parse_args(argv)


def read_corpus(cap_bytes: int) -> tuple[Path, list[str]]:
    """Stdlib .py sources in sorted walk order, up to cap_bytes (undecodable files skipped)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for path in sorted(Path(dirpath) / f for f in filenames if f.endswith(".py")):
            try:
                raw = path.read_bytes()
                text = raw.decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            total += len(raw)
            if total > cap_bytes:
                return root, texts
            texts.append(text)
    return root, texts


def split_corpus(texts: list[str]) -> tuple[list[str], list[str]]:
    """Every 50th file (about 2%, at least one) is held out for evaluation."""
    held_idx = set(range(min(25, len(texts) - 1), len(texts), 50))
    held = [t for i, t in enumerate(texts) if i in held_idx]
    train = [t for i, t in enumerate(texts) if i not in held_idx]
    return train, held


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=list(SPECIALS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)])
    return tok


def hf_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=2048)


def encode_stream(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """One long token stream: <s> file </s> <s> file </s> ..."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend([0, *enc.ids, 1])
    return torch.tensor(ids, dtype=torch.long)


def build_model(size: ModelSize, vocab: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=size.hidden, intermediate_size=size.intermediate,
                      num_hidden_layers=size.layers, num_attention_heads=size.heads,
                      num_key_value_heads=size.kv_heads, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def matmul_params(model: LlamaForCausalLM) -> int:
    """Roughly the per-token compute: every weight but the embedding lookup."""
    return n_params(model) - model.get_input_embeddings().weight.numel()


def next_token_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    v, temperature, alpha = student.size(-1), DISTILL_TEMPERATURE, DISTILL_ALPHA
    s = F.log_softmax(student[:, :-1].reshape(-1, v) / temperature, dim=-1)
    t = F.log_softmax(teacher[:, :-1].reshape(-1, v) / temperature, dim=-1)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature ** 2
    return alpha * kl + (1 - alpha) * next_token_loss(student, batch)


def sample_batch(stream: torch.Tensor, preset: Preset, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - preset.seq_len, (preset.batch,), generator=gen)
    return torch.stack([stream[s:s + preset.seq_len] for s in starts.tolist()])


def train_phase(name: str, model: LlamaForCausalLM, stream: torch.Tensor, preset: Preset,
                phase: Phase, seed: int, teacher: LlamaForCausalLM | None = None) -> dict:
    """Fixed-step AdamW + cosine training; distills from `teacher` when given."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=phase.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = get_cosine_schedule_with_warmup(opt, max(1, phase.steps // 10), phase.steps)
    model.train()
    start, loss_ema, step = time.monotonic(), float("nan"), 0
    for step in range(1, phase.steps + 1):
        batch = sample_batch(stream, preset, gen)
        logits = model(input_ids=batch, use_cache=False).logits
        if teacher is None:
            loss = next_token_loss(logits, batch)
        else:
            with torch.no_grad():
                t_logits = teacher(input_ids=batch, use_cache=False).logits
            loss = distill_loss(logits, t_logits, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.9 * loss_ema + 0.1 * loss.item()
        elapsed = time.monotonic() - start
        if step % max(1, phase.steps // 12) == 0 or step == phase.steps:
            print(f"[{name}] step {step}/{phase.steps} loss {loss.item():.4f} (ema {loss_ema:.4f}) "
                  f"lr {sched.get_last_lr()[0]:.2e} elapsed {elapsed:.1f}s", flush=True)
        if elapsed > phase.budget_s:
            print(f"[{name}] budget of {phase.budget_s:.0f}s hit at step {step}; stopping", flush=True)
            break
    model.eval()
    return {"steps": step, "planned_steps": phase.steps, "stopped_early": step < phase.steps,
            "train_seconds": round(time.monotonic() - start, 1), "final_loss_ema": round(loss_ema, 4)}


@torch.no_grad()
def evaluate(target: LlamaForCausalLM, draft: LlamaForCausalLM, stream: torch.Tensor,
             preset: Preset) -> dict:
    """Held-out next-token loss of each model and draft/target greedy top-1 agreement."""
    n = min(len(stream), preset.eval_tokens) // preset.seq_len
    windows = stream[: n * preset.seq_len].view(n, preset.seq_len)
    sums = {"target": 0.0, "draft": 0.0, "agree": 0.0}
    count = 0
    for chunk in windows.split(preset.batch):
        t_logits = target(input_ids=chunk, use_cache=False).logits
        d_logits = draft(input_ids=chunk, use_cache=False).logits
        k = chunk[:, 1:].numel()
        sums["target"] += next_token_loss(t_logits, chunk).item() * k
        sums["draft"] += next_token_loss(d_logits, chunk).item() * k
        sums["agree"] += (t_logits.argmax(-1) == d_logits.argmax(-1))[:, :-1].float().sum().item()
        count += k
    return {"heldout_tokens": count, "target_heldout_loss": round(sums["target"] / count, 4),
            "draft_heldout_loss": round(sums["draft"] / count, 4),
            "top1_agreement": round(sums["agree"] / count, 4)}


@torch.no_grad()
def round_to_fp16(model: LlamaForCausalLM) -> None:
    """Round the weights (not the rotary buffers) to what float16 saving keeps."""
    for param in model.parameters():
        param.copy_(param.half().float())


def save_model(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, folder: Path) -> None:
    model.half().save_pretrained(folder, safe_serialization=True)  # config.dtype becomes "float16"
    tok.save_pretrained(folder)
    cfg_path = folder / "tokenizer_config.json"  # transformers 5 writes "TokenizersBackend",
    cfg = json.loads(cfg_path.read_text())  # which 4.x cannot load; both load this name
    cfg_path.write_text(json.dumps({**cfg, "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))


def card_row(name: str, m: dict, ev: dict) -> str:
    size, train = m["size"], m["train"]
    early = " (budget hit)" if train["stopped_early"] else ""
    return (f"| {name} | {m['params']:,} | {size['hidden']} x {size['layers']}, "
            f"{size['heads']}q/{size['kv_heads']}kv heads | {train['steps']}{early} | "
            f"{train['train_seconds']} | {train['final_loss_ema']} | {ev[name + '_heldout_loss']} |")


def model_card(card: dict) -> str:
    ev, c, dist = card["eval"], card["corpus"], card["distill"]
    rows = "\n".join(card_row(name, card[name], ev) for name in ("target", "draft"))
    return f"""# Speculative-decoding demo pair ({card['preset']} preset)

Two `LlamaForCausalLM` models sharing one byte-level BPE tokenizer (vocab {card['vocab']}, `<s>`
prepended): `target/` and `draft/`, distilled from it, ~{card['cost_ratio']}x fewer non-embedding
weights per token. float16 safetensors. Toy models for exercising speculative decoding.

## Corpus
{c['files']} `.py` files ({c['bytes']:,} bytes) of the Python {c['python']} standard library
(`{c['stdlib']}`), walked in sorted order, skipping {', '.join(sorted(SKIP_DIRS))} and capped
at {c['cap_mb']} MB. Every 50th file is held out ({c['heldout_files']} files); the rest make a
{c['train_tokens']:,}-token training stream.

## Training
| model | params | hidden x layers, heads | steps | train s | final train loss | held-out loss |
| --- | --- | --- | --- | --- | --- | --- |
{rows}

Target: next-token cross-entropy. Draft: {dist['alpha']} x KL(target ‖ draft) at temperature
{dist['temperature']} + {round(1 - dist['alpha'], 3)} x cross-entropy (its train loss is that mix).
AdamW, cosine schedule, 10% warmup, batches of {card['batch']} x {card['seq_len']} tokens,
seed {card['seed']}, {card['threads']} thread(s). Losses are nats per token; train loss is an EMA.
Total wall time {card['total_seconds']} s ({card['machine']}).

## Agreement
Draft/target greedy top-1 agreement over {ev['heldout_tokens']:,} held-out positions
(teacher-forced, float16-rounded weights run in float32): **{ev['top1_agreement']}**.

## Reproduce
`{card['command']}`
"""


def build(args: argparse.Namespace, workdir: Path) -> dict:
    preset = PRESETS[args.preset]
    t0 = time.monotonic()
    root, texts = read_corpus(int(preset.corpus_mb * 1024 * 1024))
    train_texts, held_texts = split_corpus(texts)
    tok = train_tokenizer(train_texts, preset.vocab)
    hf_tok = hf_tokenizer(tok)
    train_stream, held_stream = encode_stream(tok, train_texts), encode_stream(tok, held_texts)
    if len(held_stream) < preset.seq_len:
        raise SystemExit(f"error: only {len(held_stream)} held-out tokens, need {preset.seq_len}")
    print(f"corpus: {len(texts)} files, {len(train_stream):,} train / {len(held_stream):,} held-out "
          f"tokens ({time.monotonic() - t0:.1f}s)", flush=True)
    torch.manual_seed(args.seed)
    target = build_model(preset.target, preset.vocab)
    draft = build_model(preset.draft, preset.vocab)
    t_train = train_phase("target", target, train_stream, preset, preset.target_phase, args.seed + 1)
    d_train = train_phase("draft", draft, train_stream, preset, preset.draft_phase, args.seed + 2,
                          teacher=target)
    round_to_fp16(target)  # evaluate the weights that get saved
    round_to_fp16(draft)
    ev = evaluate(target, draft, held_stream, preset)
    save_model(target, hf_tok, workdir / "target")
    save_model(draft, hf_tok, workdir / "draft")
    return {
        "preset": args.preset, "seed": args.seed, "threads": args.threads, "vocab": preset.vocab,
        "seq_len": preset.seq_len, "batch": preset.batch,
        "distill": {"temperature": DISTILL_TEMPERATURE, "alpha": DISTILL_ALPHA},
        "corpus": {"stdlib": str(root), "python": platform.python_version(), "files": len(texts),
                   "bytes": sum(len(t.encode()) for t in texts), "heldout_files": len(held_texts),
                   "train_tokens": len(train_stream), "cap_mb": preset.corpus_mb},
        "target": {"params": n_params(target), "size": asdict(preset.target), "train": t_train},
        "draft": {"params": n_params(draft), "size": asdict(preset.draft), "train": d_train},
        "cost_ratio": round(matmul_params(target) / matmul_params(draft), 1),
        "eval": ev, "total_seconds": round(time.monotonic() - t0, 1),
        "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}",
        "command": "python " + shlex.join(sys.argv),
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out: Path = args.output.resolve()
    if out.exists() and not args.force:
        print(f"error: {out} exists (use --force to replace it)", file=sys.stderr)
        return 2
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # tokenizers reads it on first use
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    hf_logging.disable_progress_bar()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        work.mkdir()
        card = build(args, work)
        (work / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        (work / "README.md").write_text(model_card(card))
        if out.exists():
            old = out.with_name(f"{out.name}.old-{os.getpid()}")
            out.rename(old)
            shutil.rmtree(old)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{model_card(card)}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
