"""What each stage of `ssd-distill --kind head` costs on this machine, side by side (rounds
alternated, medians and ranges): the features by a PyTorch prefill of the float target (the
pipeline's: it stops at the deepest layer the head reads; float32, or under bfloat16 autocast)
and with the whole model and its top-20 (what a quantized target's answers need), against the
bundle's own target graph prefilling the same rows one sequence at a time (its logits
discarded: a lower bound for a head bundle's graph, whose `aux_hidden` outputs come on top);
and the head's training step in float32 and under bfloat16 autocast. With --answers, instead:
the answers written a second by the runtime over each bundle given (a float target's, an int4
one's), k = 0, greedy, the shipped held-out prompts, the bundles' common max_batch at a time.

    python tools/head_rates.py --target HF_FOLDER --bundle BUNDLE --rows 16 --length 320 \
        --rounds 5 --threads 2 --json docs/results/head-rates.json
    python tools/head_rates.py --target HF_FOLDER --answers float=B1 int4=B2 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--bundle", help="a bundle of the same target (its graphs)")
    p.add_argument("--answers", nargs="+", metavar="NAME=BUNDLE",
                   help="time the runtime's answers on these bundles instead")
    p.add_argument("--prompts", type=int, default=16, help="--answers: prompts a round")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--length", type=int, default=320, help="tokens a row (prompt + answer)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.answers:
        return answers(args)

    from transformers import AutoModelForCausalLM

    from ssd_distill.data import Rows
    from ssd_distill.features import prefill
    from ssd_distill.head import head_config
    from ssd_distill.head_data import aux_layer_ids
    from ssd_distill.ttt import loss
    from ssd_graphs.eagle3 import Eagle3Head
    from ssd_runtime import Generator

    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    layers = aux_layer_ids(int(target.config.num_hidden_layers))
    vocab = int(target.config.vocab_size)
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(100, vocab - 1, (args.rows, args.length)))
    per_call = max(1, 4096 // args.length)
    gen = Generator.load(args.bundle, threads=args.threads, verify=False)

    def torch_prefill(labels: bool, bf16: bool) -> float:
        start = time.monotonic()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            for first in range(0, args.rows, per_call):
                x = ids[first:first + per_call]
                at = torch.ones_like(x, dtype=torch.bool) if labels else None
                prefill(target, x, layers, at)
        return ids.numel() / (time.monotonic() - start)

    def graph_prefill() -> float:
        start = time.monotonic()
        for r in range(args.rows):
            gen.target.prefill(ids[r].numpy(), 0)
        return ids.numel() / (time.monotonic() - start)

    head = Eagle3Head(head_config(target.config, min(args.draft_vocab, vocab), layers),
                      embed_weight=target.get_input_embeddings().weight)
    vd = head.config.draft_vocab_size
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[:vd] = True
    draft_of = torch.where(t2d, torch.arange(vocab), -1)
    opt = torch.optim.AdamW([q for q in head.parameters() if q.requires_grad], lr=1e-5)
    B, T = 8, args.length
    width = 3 * int(target.config.hidden_size)
    top = torch.randint(0, vd, (B, T, 20), dtype=torch.int32)
    batch = Rows(ids[:B], torch.ones(B, T, dtype=torch.bool), top,
                 torch.log_softmax(torch.randn(B, T, 20), -1).half(), top[..., 0].long(),
                 torch.randn(B, T, width).half())

    def train_step(bf16: bool) -> float:
        start = time.monotonic()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            value = loss(head, batch, 4, t2d, draft_of)
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return batch.positions / (time.monotonic() - start)

    cases = {"features, torch fp32 (stops at layer %d)" % max(layers): lambda: torch_prefill(False, False),
             "features, torch bf16 autocast": lambda: torch_prefill(False, True),
             "features + top-20 labels, torch fp32 (whole model)": lambda: torch_prefill(True, False),
             "bundle target graph prefill (ORT, one row a call, logits discarded)": graph_prefill,
             "training step fp32 (positions/s, 4 unrolled steps)": lambda: train_step(False),
             "training step bf16 autocast": lambda: train_step(True)}
    for fn in cases.values():         # warm up
        fn()
    got: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(args.rounds):
        for name, fn in cases.items():
            got[name].append(fn())
        print(f"round {r + 1}: " + ", ".join(f"{v[-1]:.0f}" for v in got.values()), flush=True)
    report = {name: {"median": round(statistics.median(v), 1), "min": round(min(v), 1),
                     "max": round(max(v), 1)} for name, v in got.items()}
    for name, r in report.items():
        print(f"{name}: {r['median']:.0f} [{r['min']:.0f}-{r['max']:.0f}] tokens/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "threads": args.threads, "results": report}, f, indent=2)


def answers(args) -> None:
    from transformers import AutoTokenizer

    from ssd_distill.prompts import HELDOUT, encode, shipped
    from ssd_runtime import Generator
    from ssd_runtime.manifest import read_manifest

    tok = AutoTokenizer.from_pretrained(args.target)
    ids = [encode(tok, p) for p in shipped(HELDOUT)[:args.prompts]]
    named = dict(a.split("=", 1) for a in args.answers)
    slots = min(read_manifest(b, verify=False).max_batch for b in named.values())
    gens = {n: Generator.load(b, max_batch=slots, threads=args.threads, verify=False)
            for n, b in named.items()}
    got: dict[str, list[float]] = {n: [] for n in gens}
    for r in range(args.rounds + 1):
        for name, gen in gens.items():
            start = time.monotonic()
            out = gen.generate_batch(ids, max_new_tokens=args.max_new_tokens, k=0,
                                     temperature=0.0)
            rate = sum(len(o.token_ids) for o in out) / (time.monotonic() - start)
            if r:                             # the first round warms up
                got[name].append(rate)
        if r:
            print(f"round {r}: " + ", ".join(f"{n} {v[-1]:.0f}" for n, v in got.items()),
                  flush=True)
    report = {n: {"median": round(statistics.median(v), 1), "min": round(min(v), 1),
                  "max": round(max(v), 1)} for n, v in got.items()}
    for n, r in report.items():
        print(f"answers, {n}: {r['median']:.0f} [{r['min']:.0f}-{r['max']:.0f}] tokens/s "
              f"({slots} sequences at a time)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "slots": slots, "results": report}, f, indent=2)


if __name__ == "__main__":
    main()
