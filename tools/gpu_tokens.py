"""A bundle's tokens on a backend against the CPU provider's k=0, alone and in batches.

    python tools/gpu_tokens.py BUNDLE [--backend cuda] [--rows 8] [--k 0,4,auto]
                               [--max-new-tokens 48] [--placement]

The reference is the same bundle on backend="cpu": each prompt alone at k=0, greedy and
seeded (temperature 0.8, top_p 0.95, seed 7 + its index; the default coupling makes seeded
tokens the target alone's whatever k). On --backend (loaded with max_batch = --rows) every
prompt then runs alone at each k, and `generate_batch` over the --rows prompts (of different
lengths) at each k; every stream must equal its reference. Each is also compared with the
backend's own k=0 alone, which is what exactness promises where the backend's kernels round
differently from the CPU's (a quantized target's). Also printed: each session's providers
(all must start with the backend's), and with --placement where ONNX Runtime places each
graph's nodes (its verbose log's "Node placements", one line per node not on the first
provider). Exit 1 when a stream differs from the CPU's k=0 or a session is not on its provider.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

PROMPTS = ["def read_config(path):", "import os\n",
           "class Stack:\n    def push(self, item):\n        self.items.append(item)\n"
           "    def pop(self):", "for i in range(10):", "x = [1, 2, 3]\n", "def main():",
           "# parse the command line and read every file it names\nimport argparse\n", "y ="]
SAMPLED = {"temperature": 0.8, "top_p": 0.95}
PROVIDERS = {"cuda": "CUDAExecutionProvider", "cpu": "CPUExecutionProvider"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--k", default="0,4,auto")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--placement", action="store_true",
                   help="print where ONNX Runtime places each graph's nodes on --backend")
    args = p.parse_args(argv)
    from ssd_runtime import Generator

    ks = [k if k == "auto" else int(k) for k in args.k.split(",")]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.rows)]
    n = args.max_new_tokens
    if args.placement:
        for graph in sorted(args.bundle.glob("[dt]*/*.onnx")):    # draft/, target/
            print(f"placement {graph.relative_to(args.bundle)}: {placement(graph, args.backend)}")
    cpu = Generator.load(args.bundle, backend="cpu")
    greedy_ref = [cpu.generate(x, max_new_tokens=n, k=0).token_ids for x in prompts]
    seeded_ref = [cpu.generate(x, max_new_tokens=n, k=0, seed=7 + i, **SAMPLED).token_ids
                  for i, x in enumerate(prompts)]
    lengths = sorted({len(cpu.encode(x)) for x in prompts})
    print(f"reference: cpu k=0, {len(prompts)} prompts of {lengths} tokens, {n} new tokens each")
    del cpu
    gen = Generator.load(args.bundle, backend=args.backend, max_batch=args.rows)
    wrong = providers_ok(gen, args.backend)
    print(f"{args.backend}: {gen.backend_reason}")
    own = {}
    for name, refs, extra in (("greedy", greedy_ref, lambda i: {}),
                              ("seeded", seeded_ref, lambda i: dict(seed=7 + i, **SAMPLED))):
        for k in ks:
            alone = [gen.generate(x, max_new_tokens=n, k=k, **extra(i)).token_ids
                     for i, x in enumerate(prompts)]
            if k == 0:
                own[name] = alone
            wrong += report(f"{name} alone k={k}", alone, refs, own.get(name))
            batch = gen.generate_batch([{"prompt": x, **extra(i)} for i, x in enumerate(prompts)],
                                       max_new_tokens=n, k=k)
            wrong += report(f"{name} batch of {len(prompts)} k={k}",
                            [r.token_ids for r in batch], refs, own.get(name))
    print(f"streams differing from the cpu's k=0: {wrong}")
    return 1 if wrong else 0


def report(label: str, got: list[list[int]], refs: list[list[int]],
           own: list[list[int]] | None) -> int:
    """Print how many streams equal the CPU's k=0 (and this backend's own k=0); return the
    number that differ from the CPU's."""
    same = sum(g == r for g, r in zip(got, refs))
    mine = f"; {sum(g == o for g, o in zip(got, own))}/{len(got)} equal to its own k=0 alone" \
        if own is not None else ""
    first = next((i for i, (g, r) in enumerate(zip(got, refs)) if g != r), None)
    where = ""
    if first is not None:
        g, r = got[first], refs[first]
        at = next((j for j, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
        where = f" (row {first} parts at token {at}: {g[at:at + 3]} against {r[at:at + 3]})"
    print(f"  {label:24} {same}/{len(got)} equal to cpu's k=0{mine}{where}")
    return len(got) - same


def providers_ok(gen, backend: str) -> int:
    """Each ONNX Runtime session's providers; 1 if a session is not on the backend's."""
    bad = 0
    for role, model in (("target", gen.target), ("draft", gen.draft)):
        session = getattr(model, "session", None)
        if session is None:
            print(f"{role}: {model.backend} (no ONNX Runtime session)")
            continue
        names = session.get_providers()
        print(f"{role}: session providers {names}")
        bad |= names[0] != PROVIDERS[model.backend]
    return int(bad)


def placement(graph: Path, backend: str) -> str:
    """Where ONNX Runtime puts the graph's nodes, from its verbose log (fd 2 captured)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 0
    providers = [(PROVIDERS["cuda"], {"use_tf32": 0})] if backend == "cuda" else []
    if providers and hasattr(ort, "preload_dlls"):   # pip's CUDA libraries, as the backend does
        ort.preload_dlls()
    with tempfile.TemporaryFile(mode="w+") as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            ort.InferenceSession(str(graph), so, providers=[*providers, PROVIDERS["cpu"]])
        except Exception as exc:                           # noqa: BLE001 - reported, not raised
            return f"did not open: {exc}"
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        lines = log.read().splitlines()
    out, listing = [], False
    for line in lines:
        text = line.split("] ", 1)[-1].strip() if "] " in line else line.strip()
        if "placed on [" in text or "not assigned to the preferred" in text:
            out.append(text)
            listing = "Node(s) placed on" in text and PROVIDERS[backend] not in text
        elif listing and line.startswith(" ") and text:
            shown = sum(x.startswith("    ") for x in out)
            if shown < 40:
                out.append("    " + text)
            elif shown == 40:
                out.append("    ... (more nodes: the first 40 are listed)")
        elif listing:
            listing = False
    return "\n  ".join(out) if out else "no placement lines in ONNX Runtime's verbose log"


if __name__ == "__main__":
    sys.exit(main())
