"""Train a small, deterministic target/draft pair of Hugging Face Llama models for
speculative-decoding demos, on the running interpreter's standard-library source.
Usage: python tools/make_demo_pair.py --output DIR [--preset quick|full] [--seed 0] [--threads 1] [--force]
Steps are fixed per preset (same seed + threads => same weights); a per-phase wall-clock budget is only a safety net."""
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
from transformers import get_cosine_schedule_with_warmup

SPECIALS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "__pycache__"}


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
    distill_temperature: float
    distill_alpha: float  # weight of the KL term; 1 - alpha goes to the hard-label loss
    eval_tokens: int
    log_every: int


PRESETS = {
    "quick": Preset(corpus_mb=3, vocab=2048, seq_len=256, batch=8,
                    target=ModelSize(256, 4, 4, 2, 688), draft=ModelSize(128, 1, 2, 1, 344),
                    target_phase=Phase(200, 2e-3, 300), draft_phase=Phase(200, 3e-3, 150),
                    distill_temperature=1.0, distill_alpha=0.8, eval_tokens=32768, log_every=20),
    "full": Preset(corpus_mb=16, vocab=8192, seq_len=256, batch=8,
                   target=ModelSize(512, 6, 8, 2, 1376), draft=ModelSize(256, 2, 4, 1, 688),
                   target_phase=Phase(720, 1e-3, 1560), draft_phase=Phase(720, 2e-3, 660),
                   distill_temperature=1.0, distill_alpha=0.8, eval_tokens=65536, log_every=40),
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", required=True, type=Path, help="folder to create (holds target/ and draft/)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch/tokenizers threads (results depend on it)")
    p.add_argument("--force", action="store_true", help="replace an existing --output")
    return p.parse_args(argv)


def corpus_files(cap_bytes: int) -> tuple[Path, list[Path]]:
    """Stdlib .py files in sorted walk order, up to cap_bytes of UTF-8 text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    picked: list[Path] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(f for f in filenames if f.endswith(".py")):
            size = (Path(dirpath) / name).stat().st_size
            if total + size > cap_bytes:
                return root, picked
            picked.append(Path(dirpath) / name)
            total += size
    return root, picked


def read_texts(paths: list[Path]) -> list[str]:
    texts = []
    for path in paths:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def split_corpus(texts: list[str]) -> tuple[list[str], list[str]]:
    """Every 50th file (about 2%) is held out for evaluation."""
    held = [t for i, t in enumerate(texts) if i % 50 == 25]
    train = [t for i, t in enumerate(texts) if i % 50 != 25]
    return train, held


def train_tokenizer(texts: list[str], vocab: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
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
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2)
    return model


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def next_token_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, batch: torch.Tensor,
                 temperature: float, alpha: float) -> torch.Tensor:
    v = student.size(-1)
    s = F.log_softmax(student[:, :-1].reshape(-1, v) / temperature, dim=-1)
    t = F.log_softmax(teacher[:, :-1].reshape(-1, v) / temperature, dim=-1)
    kl = F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature ** 2
    return alpha * kl + (1 - alpha) * next_token_loss(student, batch)


def sample_batch(stream: torch.Tensor, preset: Preset, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - preset.seq_len, (preset.batch,), generator=gen)
    return torch.stack([stream[s:s + preset.seq_len] for s in starts.tolist()])


def train_phase(name: str, model: LlamaForCausalLM, stream: torch.Tensor, preset: Preset, phase: Phase,
                seed: int, teacher: LlamaForCausalLM | None = None) -> dict:
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
            loss = distill_loss(logits, t_logits, batch, preset.distill_temperature, preset.distill_alpha)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.9 * loss_ema + 0.1 * loss.item()
        elapsed = time.monotonic() - start
        if step % preset.log_every == 0 or step == phase.steps:
            print(f"[{name}] step {step}/{phase.steps} loss {loss.item():.4f} (ema {loss_ema:.4f}) "
                  f"lr {sched.get_last_lr()[0]:.2e} elapsed {elapsed:.1f}s", flush=True)
        if elapsed > phase.budget_s:
            print(f"[{name}] wall-clock budget {phase.budget_s:.0f}s hit at step {step}; stopping", flush=True)
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


def save_model(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, folder: Path) -> None:
    model.half().save_pretrained(folder, safe_serialization=True)  # config.dtype becomes "float16"
    tok.save_pretrained(folder)


def model_card(card: dict) -> str:
    t, d, ev, c = card["target"], card["draft"], card["eval"], card["corpus"]
    rows = "\n".join(
        f"| {name} | {m['params']:,} | {m['size']['hidden']}x{m['size']['layers']} "
        f"({m['size']['heads']}q/{m['size']['kv_heads']}kv heads) | {m['train']['steps']} | "
        f"{m['train']['train_seconds']} | {m['train']['final_loss_ema']} | {ev[name + '_heldout_loss']} |"
        for name, m in (("target", t), ("draft", d)))
    return f"""# Speculative-decoding demo pair ({card['preset']} preset)

Two `LlamaForCausalLM` models sharing one byte-level BPE tokenizer (vocab {card['vocab']}):
`target/` and a cheaper `draft/` distilled from it. Weights are float16 safetensors. Toy models
for exercising speculative decoding, not for real use.

## Corpus
{c['files']} `.py` files ({c['bytes']:,} bytes) of the Python {c['python']} standard library at
`{c['stdlib']}`, walked in sorted order, skipping {', '.join(sorted(SKIP_DIRS))}; every 50th file
held out ({c['heldout_files']} files, {ev['heldout_tokens']:,} evaluated tokens). Train stream:
{c['train_tokens']:,} tokens.

## Models and training
| model | params | hidden x layers | steps | train s | final loss (EMA) | held-out loss |
| --- | --- | --- | --- | --- | --- | --- |
{rows}

Target: next-token cross-entropy. Draft: {card['distill']['alpha']} x KL(target || draft) at temperature
{card['distill']['temperature']} + {round(1 - card['distill']['alpha'], 3)} x cross-entropy. AdamW, cosine schedule
with 10% warmup, batch {card['batch']} x {card['seq_len']} tokens, seed {card['seed']}, {card['threads']} thread(s).
Total wall time {card['total_seconds']} s on {card['machine']}.

## Agreement
Draft/target greedy top-1 agreement on held-out text: **{ev['top1_agreement']}** (teacher-forced,
measured with the float16-rounded weights computed in float32).

## Reproduce
`{card['command']}`
"""


def build(args: argparse.Namespace, workdir: Path) -> dict:
    preset = PRESETS[args.preset]
    t0 = time.monotonic()
    root, paths = corpus_files(int(preset.corpus_mb * 1024 * 1024))
    texts = read_texts(paths)
    train_texts, held_texts = split_corpus(texts)
    tok = train_tokenizer(train_texts, preset.vocab)
    hf_tok = hf_tokenizer(tok)
    train_stream, held_stream = encode_stream(tok, train_texts), encode_stream(tok, held_texts)
    print(f"corpus: {len(texts)} files, {len(train_stream):,} train / {len(held_stream):,} held-out tokens "
          f"({time.monotonic() - t0:.1f}s)", flush=True)
    torch.manual_seed(args.seed)
    target = build_model(preset.target, preset.vocab)
    draft = build_model(preset.draft, preset.vocab)
    t_train = train_phase("target", target, train_stream, preset, preset.target_phase, args.seed + 1)
    d_train = train_phase("draft", draft, train_stream, preset, preset.draft_phase, args.seed + 2, teacher=target)
    for model in (target, draft):
        model.half().float()  # evaluate exactly the weights that get saved
    ev = evaluate(target, draft, held_stream, preset)
    save_model(target, hf_tok, workdir / "target")
    save_model(draft, hf_tok, workdir / "draft")
    return {
        "preset": args.preset, "seed": args.seed, "threads": args.threads, "vocab": preset.vocab,
        "seq_len": preset.seq_len, "batch": preset.batch,
        "distill": {"temperature": preset.distill_temperature, "alpha": preset.distill_alpha},
        "corpus": {"stdlib": str(root), "python": platform.python_version(), "files": len(texts),
                   "bytes": sum(len(t.encode()) for t in texts), "heldout_files": len(held_texts),
                   "train_tokens": len(train_stream), "cap_mb": preset.corpus_mb},
        "target": {"params": n_params(target), "size": asdict(preset.target), "train": t_train},
        "draft": {"params": n_params(draft), "size": asdict(preset.draft), "train": d_train},
        "eval": ev, "total_seconds": round(time.monotonic() - t0, 1),
        "machine": f"{platform.machine()} {platform.system()}, torch {torch.__version__}",
        "command": "python " + shlex.join(sys.argv),
    }


def report(card: dict) -> None:
    ev = card["eval"]
    for name in ("target", "draft"):
        m = card[name]
        print(f"{name}: {m['params']:,} params, {m['train']['steps']} steps in {m['train']['train_seconds']}s, "
              f"final loss {m['train']['final_loss_ema']}, held-out loss {ev[name + '_heldout_loss']}")
    print(f"top-1 agreement (draft vs target, held-out): {ev['top1_agreement']}; total {card['total_seconds']}s")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    out: Path = args.output.resolve()
    if out.exists() and not args.force:
        print(f"error: {out} exists (use --force to replace it)", file=sys.stderr)
        return 2
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # tokenizers' pool, read on first use
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
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
    report(card)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
