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
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
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
    generated: int  # draft data: sequences the target continues from corpus prefixes ...
    corpus_windows: int  # ... plus corpus windows; the target's log-probs on both are cached
    prefix_len: int = 64


# Sized from measured fp32 throughput on 2 quiet cores (batch 8 x 256): full target ~1.1 s/step,
# draft ~0.115 s/step on cached teacher log-probs, target continuations ~3.2 s per 32 x 192 tokens;
# full is ~40 min in all (its draft: 4,800 steps on 3,072 continuations, against 2,400 on 1,536
# before: greedy agreement 0.913 -> 0.920, 4.54 -> 4.71 tokens a round at k=8, +7% tokens/s).
# The budgets cap a slow machine at about 44 minutes. A small vocabulary
# keeps the draft's step cheap (its LM head would otherwise dominate it) and each token easier to
# guess; tokens/s figures are then per (shorter) token, and so are both sides of every ratio.
PRESETS = {
    "quick": Preset(corpus_mb=3, vocab=2048, seq_len=256, batch=8,
                    target=ModelSize(128, 4, 4, 2, 344), draft=ModelSize(64, 1, 2, 1, 172),
                    target_phase=Phase(600, 3e-3, 360), draft_phase=Phase(300, 5e-3, 180),
                    eval_tokens=32768, generated=64, corpus_windows=64),
    "full": Preset(corpus_mb=16, vocab=2048, seq_len=256, batch=8,
                   target=ModelSize(384, 7, 6, 2, 1024), draft=ModelSize(160, 2, 5, 1, 432),
                   target_phase=Phase(1200, 2e-3, 1500), draft_phase=Phase(4800, 3e-3, 600),
                   eval_tokens=65536, generated=3072, corpus_windows=1536),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="full: use --threads 2")
    p.add_argument("--output", required=True, type=Path, help="folder to create: target/, draft/")
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="CPU threads (the weights depend on it)")
    p.add_argument("--force", action="store_true", help="replace an existing --output")
    p.add_argument("--reuse-target", action="store_true",
                   help="keep --output's target (its weights and card entry) and train only a "
                        "new draft: the target is what a full run with the same preset, seed "
                        "and threads trains anyway (checked: same config), minus ~22 minutes")
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


def distill_loss(student: torch.Tensor, teacher_logp: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """alpha x KL(teacher || student) at DISTILL_TEMPERATURE + (1 - alpha) x cross-entropy."""
    v, temperature, alpha = student.size(-1), DISTILL_TEMPERATURE, DISTILL_ALPHA
    s = F.log_softmax(student[:, :-1].reshape(-1, v) / temperature, dim=-1)
    t = F.log_softmax(teacher_logp[:, :-1].reshape(-1, v).float() / temperature, dim=-1)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature ** 2
    return alpha * kl + (1 - alpha) * next_token_loss(student, batch)


def windows(stream: torch.Tensor, length: int, n: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - length, (n,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


@torch.no_grad()
def continue_with(target: LlamaForCausalLM, prefixes: torch.Tensor, new_tokens: int, seed: int,
                  chunk: int = 32) -> torch.Tensor:
    """The target's own continuations of `prefixes`: even chunks greedy, odd chunks sampled at
    temperature 1 (no truncation). End-of-text is suppressed so every row has `new_tokens`."""
    out = []
    for i, part in enumerate(prefixes.split(chunk)):
        torch.manual_seed(seed + i)
        sample = i % 2 == 1
        out.append(target.generate(
            part, attention_mask=torch.ones_like(part), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=sample, temperature=1.0 if sample else None,
            top_k=0 if sample else None, top_p=1.0 if sample else None))
    return torch.cat(out)


@torch.no_grad()
def draft_data(target: LlamaForCausalLM, stream: torch.Tensor, preset: Preset,
               seed: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """What the draft learns from: the target's continuations of corpus prefixes (the text it
    will be asked to guess at run time, as in on-policy distillation) and plain corpus windows,
    with the target's log-probs on every position cached once in float16."""
    start = time.monotonic()
    gen = torch.Generator().manual_seed(seed)
    prefixes = windows(stream, preset.prefix_len, preset.generated, gen)
    generated = continue_with(target, prefixes, preset.seq_len - preset.prefix_len, seed)
    gen_seconds = time.monotonic() - start
    seqs = torch.cat([generated, windows(stream, preset.seq_len, preset.corpus_windows, gen)])
    logp = torch.empty(*seqs.shape, target.config.vocab_size, dtype=torch.float16)
    for rows in torch.arange(len(seqs)).split(preset.batch):
        logp[rows] = F.log_softmax(target(input_ids=seqs[rows], use_cache=False).logits, -1).half()
    info = {"generated": len(generated), "corpus_windows": len(seqs) - len(generated),
            "prefix_len": preset.prefix_len, "generate_seconds": round(gen_seconds, 1),
            "seconds": round(time.monotonic() - start, 1)}
    print(f"[draft data] {info}", flush=True)
    return seqs, logp, info


def train_phase(name: str, model: LlamaForCausalLM, preset: Preset, phase: Phase, seed: int,
                stream: torch.Tensor | None = None,
                cached: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """Fixed-step AdamW + cosine training: next-token loss on random `stream` windows, or
    distillation on random rows of `cached` (sequences, teacher log-probs)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=phase.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = get_cosine_schedule_with_warmup(opt, max(1, phase.steps // 10), phase.steps)
    model.train()
    start, loss_ema, step = time.monotonic(), float("nan"), 0
    for step in range(1, phase.steps + 1):
        if cached is None:
            batch = windows(stream, preset.seq_len, preset.batch, gen)
            loss = next_token_loss(model(input_ids=batch, use_cache=False).logits, batch)
        else:
            rows = torch.randint(0, len(cached[0]), (preset.batch,), generator=gen)
            batch = cached[0][rows]
            loss = distill_loss(model(input_ids=batch, use_cache=False).logits, cached[1][rows], batch)
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
             preset: Preset, seed: int) -> dict:
    """Held-out next-token loss of each model, draft/target greedy top-1 agreement on held-out
    text, and the same agreement on the target's greedy continuations of held-out prefixes
    (what greedy speculative decoding sees: its acceptance rate per drafted token)."""
    n = min(len(stream), preset.eval_tokens) // preset.seq_len
    rows = stream[: n * preset.seq_len].view(n, preset.seq_len)
    sums = {"target": 0.0, "draft": 0.0, "agree": 0.0}
    count = 0
    for chunk in rows.split(preset.batch):
        t_logits = target(input_ids=chunk, use_cache=False).logits
        d_logits = draft(input_ids=chunk, use_cache=False).logits
        k = chunk[:, 1:].numel()
        sums["target"] += next_token_loss(t_logits, chunk).item() * k
        sums["draft"] += next_token_loss(d_logits, chunk).item() * k
        sums["agree"] += (t_logits.argmax(-1) == d_logits.argmax(-1))[:, :-1].float().sum().item()
        count += k
    prefixes = windows(stream, preset.prefix_len, 32, torch.Generator().manual_seed(seed))
    greedy = continue_with(target, prefixes, 128, seed, chunk=len(prefixes))  # one greedy chunk
    guesses = draft(input_ids=greedy, use_cache=False).logits[:, preset.prefix_len - 1:-1].argmax(-1)
    return {"heldout_tokens": count, "target_heldout_loss": round(sums["target"] / count, 4),
            "draft_heldout_loss": round(sums["draft"] / count, 4),
            "top1_agreement": round(sums["agree"] / count, 4),
            "greedy_continuation_tokens": guesses.numel(),
            "greedy_continuation_agreement": round(
                (guesses == greedy[:, preset.prefix_len:]).float().mean().item(), 4)}


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
    reused = (", the target's training not included: this draft was trained beside the saved "
              "target with --reuse-target") if card.get("target_reused") else ""
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
{dist['temperature']} + {round(1 - dist['alpha'], 3)} x cross-entropy (its train loss is that mix), on
{dist['data']['generated']:,} continuations written by the target itself ({dist['data']['prefix_len']}-token corpus prefixes,
half greedy, half sampled at temperature 1; {dist['data']['generate_seconds']} s) and
{dist['data']['corpus_windows']:,} corpus windows, the target's log-probs cached once for both.
AdamW, cosine schedule, 10% warmup, batches of {card['batch']} x {card['seq_len']} tokens,
seed {card['seed']}, {card['threads']} thread(s). Losses are nats per token; train loss is an EMA.
Total wall time {card['total_seconds']} s ({card['machine']}){reused}.

## Agreement
Draft/target greedy top-1 agreement (float16-rounded weights run in float32):
- over {ev['heldout_tokens']:,} held-out positions, teacher-forced: **{ev['top1_agreement']}**;
- over {ev['greedy_continuation_tokens']:,} tokens of the target's greedy continuations of held-out prefixes (the
  acceptance rate greedy speculative decoding sees): **{ev['greedy_continuation_agreement']}**.

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
    draft = build_model(preset.draft, preset.vocab)       # after the target: the same RNG state
    if args.reuse_target:
        target, t_train = reused_target(args, target)
    else:
        t_train = train_phase("target", target, preset, preset.target_phase, args.seed + 1,
                              stream=train_stream)
    target.eval()
    round_to_fp16(target)  # the draft learns, and everything is evaluated, on the saved weights
    seqs, logp, d_data = draft_data(target, train_stream, preset, args.seed + 3)
    d_train = train_phase("draft", draft, preset, preset.draft_phase, args.seed + 2,
                          cached=(seqs, logp))
    del seqs, logp
    round_to_fp16(draft)
    ev = evaluate(target, draft, held_stream, preset, args.seed + 4)
    save_model(target, hf_tok, workdir / "target")
    save_model(draft, hf_tok, workdir / "draft")
    return {
        "preset": args.preset, "seed": args.seed, "threads": args.threads, "vocab": preset.vocab,
        "seq_len": preset.seq_len, "batch": preset.batch,
        "distill": {"temperature": DISTILL_TEMPERATURE, "alpha": DISTILL_ALPHA, "data": d_data},
        "corpus": {"stdlib": str(root), "python": platform.python_version(), "files": len(texts),
                   "bytes": sum(len(t.encode()) for t in texts), "heldout_files": len(held_texts),
                   "train_tokens": len(train_stream), "cap_mb": preset.corpus_mb},
        "target": {"params": n_params(target), "size": asdict(preset.target), "train": t_train},
        "draft": {"params": n_params(draft), "size": asdict(preset.draft), "train": d_train},
        "cost_ratio": round(matmul_params(target) / matmul_params(draft), 1),
        "eval": ev, "total_seconds": round(time.monotonic() - t0, 1),
        "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}",
        "target_reused": args.reuse_target,
        # how to rebuild the whole pair (--reuse-target only skips retraining the same target)
        "command": "python " + shlex.join(a for a in sys.argv if a != "--reuse-target"),
    }


def reused_target(args: argparse.Namespace, fresh: LlamaForCausalLM
                  ) -> tuple[LlamaForCausalLM, dict]:
    """--reuse-target: the saved target, if it is the one this preset, seed and thread count
    train (same config and card settings), with its recorded training figures."""
    folder = args.output.resolve()
    card = json.loads((folder / "card.json").read_text())
    same = {k: card.get(k) for k in ("preset", "seed", "threads")} == \
        {"preset": args.preset, "seed": args.seed, "threads": args.threads}
    saved = LlamaForCausalLM.from_pretrained(folder / "target", dtype=torch.float32)
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "intermediate_size", "vocab_size")
    if not same or any(getattr(saved.config, k) != getattr(fresh.config, k) for k in keys):
        raise SystemExit(f"error: {folder}/target was not trained with --preset {args.preset} "
                         f"--seed {args.seed} --threads {args.threads}; drop --reuse-target")
    print(f"[target] reused from {folder / 'target'}", flush=True)
    return saved, card["target"]["train"]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out: Path = args.output.resolve()
    if args.reuse_target and not (out / "card.json").is_file():
        print(f"error: --reuse-target needs an earlier pair in {out}", file=sys.stderr)
        return 2
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
