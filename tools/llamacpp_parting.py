"""How often llama.cpp's speculative output parts from its own quantized target alone (issue 44):
the question tools/near_ties.py asks of a bundle, asked of llama.cpp on the same prompts.

    python tools/llamacpp_parting.py --target HF_DIR --draft HF_DIR --prompts FILE.jsonl \\
        --llama-cpp BIN --llama-cpp-src SRC [--pairs q4_0:q8_0,q8_0:q8_0] [--ks 2,4,8]
        [--tokens 128] [--threads 2] [--workdir DIR] [--json OUT]

For each prompt (JSONL "prompt": text, e.g. a chat rendered through its template) and each
(target, draft) quantization pair: the target alone (llama-completion, greedy) and the
speculative mode (llama-speculative-simple, greedy, at most k draft tokens a round), both
llama.cpp's own tools (how to build them: tools/peer_llamacpp.py). Reports the runs whose new
text equals the target alone's, and where the others part (the character, and the common
prefix's length in the target alone's text). Greedy only: llama.cpp's sampling draws differ
between its two tools, so only greedy output says whether its verification is its target's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peer_llamacpp as lc  # noqa: E402  (a tool beside this one)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, required=True)
    p.add_argument("--draft", type=Path, required=True)
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--llama-cpp", required=True, metavar="BIN")
    p.add_argument("--llama-cpp-src", required=True, metavar="SRC")
    p.add_argument("--pairs", default="q4_0:q8_0,q8_0:q8_0",
                   help="target:draft quantizations (of peer_llamacpp.QUANTS)")
    p.add_argument("--ks", default="2,4,8")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=Path("llamacpp-parting"))
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    pairs = [tuple(x.split(":")) for x in args.pairs.split(",")]
    if any(q not in lc.QUANTS for pair in pairs for q in pair):
        p.error(f"--pairs: quantizations are {', '.join(lc.QUANTS)}")
    ks = [int(k) for k in args.ks.split(",")]
    texts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines()
             if line.strip()]
    tools = lc.locate(args.llama_cpp, args.llama_cpp_src)
    quants = {"target": {t for t, _ in pairs}, "draft": {d for _, d in pairs}}
    stamp = json.dumps([str(args.target.resolve()), str(args.draft.resolve())])
    files = lc.prepare(tools, {"target": args.target, "draft": args.draft}, quants,
                       args.workdir, stamp, lambda line: print(line, file=sys.stderr))
    report = []
    for tq, dq in pairs:
        target, draft = files["target", tq], files["draft", dq]
        same = runs = 0
        where, accepted = [], []         # its acceptance per run (it did speculate)
        for i, text in enumerate(texts):
            n_prompt = len(lc.tokenize(tools, target, text))
            alone = lc.target_alone(tools, target, text, n_prompt, args.tokens, args.threads).text
            for k in ks:
                run = lc.speculative(tools, target, draft, text, n_prompt, args.tokens,
                                     args.threads, args.threads, k)
                spec = run.text
                if run.acceptance is not None:
                    accepted.append(run.acceptance)
                # llama-speculative-simple may run a few tokens past n: compare what both made
                common = min(len(alone), len(spec))
                runs += 1
                at = next((j for j in range(common) if alone[j] != spec[j]), None)
                if at is None:
                    same += 1
                    continue
                where.append({"prompt": i, "k": k, "at_char": at, "of_chars": len(alone),
                              "alone": alone[max(0, at - 20):at + 20],
                              "speculative": spec[max(0, at - 20):at + 20]})
        mean = sum(accepted) / len(accepted) if accepted else None
        print(f"llama.cpp {tq} target, {dq} draft: {same} of {runs} greedy runs equal the "
              f"target alone's text" + (f"; first partings at characters "
                                        f"{[w['at_char'] for w in where]}" if where else "")
              + (f"; its acceptance {mean:.2f} on average" if mean is not None else ""))
        report.append({"target": tq, "draft": dq, "runs": runs, "same": same,
                       "acceptance": mean, "where": where})
    if args.json:
        args.json.write_text(json.dumps({"tokens": args.tokens, "ks": ks, "threads": args.threads,
                                         "prompts": str(args.prompts), "pairs": report},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
