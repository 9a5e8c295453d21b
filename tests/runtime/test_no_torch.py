"""Serving needs no PyTorch: loading a bundle and generating imports none of the exporter."""
from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
from ssd_runtime import Generator
gen = Generator.load(sys.argv[1])
res = gen.generate("def add(a, b):", max_new_tokens=16, k=4)
heavy = ["torch", "transformers", "onnx", "onnxscript", "ssd_export", "ssd_graphs"]
print(json.dumps({"tokens": len(res.token_ids), "loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_runtime_imports_no_torch(bundle_factory):
    bundle = bundle_factory("llama", "llama_cut")
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(bundle)], capture_output=True,
                         text=True, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["tokens"] == 16
    assert report["loaded"] == []
