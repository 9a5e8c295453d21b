"""Which training signal gives the draft the higher acceptance: `--loss kl`, `top1` or `mix`,
trained side by side on the same labelled rows, from the same start, for the same steps.

    python tools/distill_losses.py --target TARGET --rows WORK/data.pt [--steps 100]
        [--losses mix,kl,top1] [--layers 4] [--head-tokens 8192] [--json OUT]

`--rows` is the `data.pt` an `ssd-distill` run keeps in its `OUTPUT.partial/` folder (the
target's answers with its top-32 log-probs, and the held-out rows): copy it while the run
trains, or stop a run after its answers. Each loss gets the preset's optimiser and schedule
over `--steps` steps (the `default` preset's batch and learning rate unless told), and is
scored by teacher-forced top-1 agreement with the target on the held-out rows (the acceptance
rate a greedy verification sees per token). A few minutes per loss on a 135-270M target.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ssd_distill.config import PRESETS  # noqa: E402
from ssd_distill.data import Rows  # noqa: E402
from ssd_distill.pipeline import _eos, _load_target  # noqa: E402
from ssd_distill.student import freeze_embeddings, make_student, output_vocab  # noqa: E402
from ssd_distill.train import agreement, train  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--rows", required=True, type=Path, help="data.pt of an ssd-distill run")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--losses", default="mix,kl,top1")
    ap.add_argument("--preset", default="default", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int)
    ap.add_argument("--head-tokens", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not args.rows.is_file():
        print(f"distill_losses: {args.rows} is not a file. ---> HINT: pass the data.pt of an "
              f"ssd-distill run's OUTPUT.partial/ folder", file=sys.stderr)
        return 2
    state = torch.load(args.rows, weights_only=False)
    rows, held = Rows(**state["train"]), Rows(**state["heldout"])
    target, tokenizer = _load_target(args.target)
    preset = PRESETS[args.preset]
    layers = args.layers or preset.layers
    head = preset.head_tokens if args.head_tokens is None else (args.head_tokens or None)
    # epochs chosen so that train() takes exactly --steps steps
    preset = dataclasses.replace(preset, layers=layers, head_tokens=head,
                                 epochs=args.steps * preset.batch / len(rows.ids),
                                 train_budget_s=1e9)
    vocab = int(target.config.vocab_size)
    keep = sorted({int(t) for t in [*_eos(target), *tokenizer.all_special_ids] if 0 <= t < vocab})
    ids = output_vocab(rows.argmax, rows.top_ids, rows.mask, vocab, head, keep)
    ids_t = None if ids is None else torch.tensor(ids)
    vocab_map = None
    if ids_t is not None:
        vocab_map = torch.full((vocab,), -1, dtype=torch.long)
        vocab_map[ids_t] = torch.arange(len(ids))
    print(f"{len(rows.ids)} training rows ({rows.positions:,} positions), {len(held.ids)} "
          f"held-out rows ({held.positions:,}); {layers} layers, head "
          f"{len(ids) if ids else vocab:,}; {args.steps} steps of {preset.batch} rows per loss")
    results = []
    for loss in args.losses.split(","):
        torch.manual_seed(args.seed)
        student, idx = make_student(target, layers, "spread")
        params = freeze_embeddings(student)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:   # train() checkpoints every minute
            res = train(student, params, rows, preset, loss, ids_t, vocab_map, args.seed,
                        Path(tmp) / "checkpoint.pt", False, lambda *a: None)
        agree, total = agreement(student, held, ids_t)
        row = {"loss": loss, "steps": res.steps, "train_loss": res.loss,
               "agreement": round(agree / max(total, 1), 4), "heldout_positions": total,
               "seconds": round(time.monotonic() - t0, 1), "tokens_per_s": res.tokens_per_s}
        results.append(row)
        print(f"  {loss:5s} held-out agreement {row['agreement']:.3f} after {res.steps} steps "
              f"({row['seconds']:.0f} s, {res.tokens_per_s:,.0f} tok/s)", flush=True)
        del student, params
    if args.json:
        args.json.write_text(json.dumps({"target": args.target, "rows": str(args.rows),
                                         "steps": args.steps, "layers": layers,
                                         "head_tokens": len(ids) if ids else vocab,
                                         "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
