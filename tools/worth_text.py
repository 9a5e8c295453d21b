"""α of a bundle's draft on the worth check's two held-out texts, side by side in one run: the
default docstrings, and the target graph's own greedy continuations of their openings (what
`ssd-export` reads without --calib since issue 48). Agreement only: no timing, so a busy
machine does not move it.

    .venv/bin/python tools/worth_text.py BUNDLE TARGET_FOLDER
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("target", help="the target's Hugging Face folder (its tokenizer)")
    args = parser.parse_args()

    from ssd_export.qtarget import heldout_ids, read_calibration
    from ssd_export.worth import WORTH_TOKENS, agreement, own_continuations
    from ssd_runtime.backends import open_backend
    from ssd_runtime.manifest import read_manifest
    from transformers import AutoTokenizer

    manifest = read_manifest(args.bundle)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    opened = open_backend(args.bundle, manifest, "cpu", threads=(2, 1))
    docs = read_calibration(None)[1:]
    own = own_continuations(opened.target, tokenizer, docs, manifest)
    for name, held in (("docstrings", docs), ("own continuations", own)):
        windows = heldout_ids(tokenizer, held[0], manifest.target.vocab_size,
                              manifest.max_context, WORTH_TOKENS, "alpha")
        agree, total = agreement(opened.target, opened.draft, windows)
        print(f"{name}: alpha {agree / total:.3f} on {total} tokens ({held[1]})")


if __name__ == "__main__":
    main()
