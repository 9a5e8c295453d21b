#!/usr/bin/env bash
# GPU check for ssd-toolkit on a machine with an NVIDIA GPU, in one go (< 8 minutes).
#
#   tools/gpu_check.sh [REPORT]          # default REPORT: gpu_report.txt
#
# Reports what is installed (driver, GPU, TensorRT, onnxruntime-gpu, cuda-python), installs
# what is missing from PyPI when it can (best effort, never leaving onnxruntime and
# onnxruntime-gpu side by side), builds a small target/draft pair (examples/demo-pair if
# present, else the tests' tiny models), exports it with TensorRT engines, runs the gpu
# tests, compares the token streams of the cuda and trt backends with cpu, and benchmarks
# k=0 against k=auto on each backend. Every step has a time limit; a failed step is
# reported and the script goes on. Environment: PYTHON (default python3), WORK (scratch),
# BUDGET (seconds for the whole run, default 450), BUNDLE (a bundle exported earlier by this
# script's export command: reused instead of exporting again).
set -u
cd "$(dirname "$0")/.."
REPORT="$(realpath -m "${1:-gpu_report.txt}")"
PY="${PYTHON:-python3}"
WORK="${WORK:-$(mktemp -d /tmp/ssd-gpu-check.XXXXXX)}"
START=$(date +%s)
BUDGET=${BUDGET:-450}           # seconds for the whole run: every step gets what is left
: > "$REPORT"

say()     { echo "$*" | tee -a "$REPORT"; }
section() { say ""; say "== $* ($(( $(date +%s) - START )) s)"; }
# step SECONDS LABEL CMD...: run with a time limit (within the budget), log, record the status
step() {
  local limit=$1 label=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ "$left" -lt 20 ]; then say "-- $label: SKIPPED (time budget of ${BUDGET}s spent)"; return 125; fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout --kill-after=5 "$limit" "$@" >> "$REPORT" 2>&1
  local rc=$?
  say "-- $label: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc$([ $rc -eq 124 ] && echo ", timed out after ${limit}s"))")"
  return $rc
}
pyhas() { "$PY" -c "import $1" >/dev/null 2>&1; }
ort_has_cuda() {
  "$PY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" \
    >/dev/null 2>&1
}

section "machine"
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   host: $(hostname)   repo: $(git rev-parse --short HEAD 2>/dev/null)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv >> "$REPORT" 2>&1
  CUDA_MAJOR=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -1)
  say "driver CUDA version (major): ${CUDA_MAJOR:-unknown}"
else
  say "nvidia-smi: not found (no NVIDIA driver?)"; CUDA_MAJOR=""
fi
[ -f /etc/nv_tegra_release ] && say "Jetson: $(head -1 /etc/nv_tegra_release)"

section "python environment"
if ! pyhas ssd_runtime || ! pyhas torch || ! pyhas transformers || ! pyhas onnx; then
  say "ssd-toolkit with the export extra is not importable by $PY: creating $WORK/venv"
  "$PY" -m venv --system-site-packages "$WORK/venv" >> "$REPORT" 2>&1 && PY="$WORK/venv/bin/python"
  step 300 "pip install -e .[export,test]" "$PY" -m pip install -q -e '.[export,test]'
fi
say "python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"

section "GPU packages (install what is missing, best effort)"
if ! ort_has_cuda; then
  # download first: only swap onnxruntime for onnxruntime-gpu once the wheel is here
  if step 180 "pip download onnxruntime-gpu" "$PY" -m pip download -q --no-deps -d "$WORK/wheels" onnxruntime-gpu; then
    "$PY" -m pip uninstall -y -q onnxruntime onnxruntime-gpu >> "$REPORT" 2>&1
    step 120 "pip install onnxruntime-gpu" "$PY" -m pip install -q "$WORK"/wheels/onnxruntime_gpu-*.whl \
      || step 120 "restore onnxruntime" "$PY" -m pip install -q onnxruntime
  fi
fi
if ! pyhas tensorrt; then
  step 300 "pip install tensorrt-cu12 (10.x)" "$PY" -m pip install -q 'tensorrt-cu12>=10,<11'
fi
if ! pyhas cuda.bindings.runtime && ! pyhas cuda.cudart; then
  spec="cuda-python>=12.3"; [ -n "$CUDA_MAJOR" ] && spec="cuda-python>=$CUDA_MAJOR,<$((CUDA_MAJOR + 1))"
  step 120 "pip install $spec" "$PY" -m pip install -q "$spec"
fi
"$PY" - >> "$REPORT" 2>&1 <<'EOF'
import importlib.metadata as md
for dist in ("onnxruntime", "onnxruntime-gpu", "tensorrt", "tensorrt-cu12", "tensorrt_cu12_libs",
             "cuda-python", "cuda-bindings", "numpy", "torch"):
    try:
        print(f"{dist:20} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist:20} -")
import onnxruntime as ort
print("onnxruntime providers:", ort.get_available_providers())
from ssd_runtime.backends.trt import probe_tensorrt
version, gpu, problem = probe_tensorrt()
print("TensorRT:", version, "| GPU:", gpu, "|", problem or "usable")
def installed(dist):
    try:
        return bool(md.version(dist))
    except md.PackageNotFoundError:
        return False
if installed("onnxruntime") and installed("onnxruntime-gpu"):
    print("WARNING: onnxruntime and onnxruntime-gpu are both installed; uninstall both, then "
          "install onnxruntime-gpu alone")
EOF

section "a small target/draft pair"
PAIR="$WORK/pair"; MAX_CONTEXT=256
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
if [ -f examples/demo-pair/target/config.json ] && [ -f examples/demo-pair/draft/config.json ]; then
  PAIR=examples/demo-pair; MAX_CONTEXT=1024; say "using the shipped pair $PAIR"
else
  step 120 "tiny pair from tests/tiny.py" "$PY" - "$PAIR" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import tiny
root = Path(sys.argv[1])
tok = tiny.build_tokenizer(root / "tokenizer")
target = tiny.build_model(root / "target", "llama", tok, seed=1, layers=3, num_key_value_heads=4)
tiny.truncate(target, root / "draft", 1, tok)
print("tiny llama pair (KV rows of 256 bytes) in", root)
EOF
fi

section "export with engines"
BUNDLE="${BUNDLE:-$WORK/bundle}"; BENCH_BUNDLE="$WORK/bundle-fp16"
if [ -f "$BUNDLE/manifest.json" ]; then
  say "reusing the bundle $BUNDLE (exported earlier with the command below)"
else
  step 300 "ssd-export --engines auto --engine-precision fp32" "$PY" -m ssd_export.cli \
    --target "$PAIR/target" --draft "$PAIR/draft" --output "$BUNDLE" --max-context "$MAX_CONTEXT" \
    --engines auto --engine-precision fp32 --graph standard --force
fi
[ -f "$BUNDLE/manifest.json" ] && "$PY" -c "import json, sys; m = json.load(open(sys.argv[1])); \
print('engines:', [(e['path'], e['precision']) for e in m['engines']] or 'none')" \
  "$BUNDLE/manifest.json" >> "$REPORT" 2>&1
rm -rf "$BENCH_BUNDLE"; [ -d "$BUNDLE" ] && cp -r "$BUNDLE" "$BENCH_BUNDLE"
step 240 "ssd-build-engines --precision fp16 --force (for the benchmark)" "$PY" -c \
  "import sys; from ssd_export.cli import build_engines_main; sys.exit(build_engines_main(sys.argv[1:]))" \
  "$BENCH_BUNDLE" --precision fp16 --force

section "token streams: cuda and trt against cpu (greedy and seeded, fp32 engines)"
step 150 "compare token streams" "$PY" - "$BUNDLE" <<'EOF'
import sys
from ssd_runtime import Generator
from ssd_runtime.errors import SsdError
bundle = sys.argv[1]
prompts = ["def read_config(path):", "import os\n", "class Stack:\n    def push(self, item):",
           "for i in range(10):", "x = [1, 2, 3]\n"]
cpu = Generator.load(bundle, backend="cpu")
expected = {(p, k): cpu.generate(p, max_new_tokens=48, k=k).token_ids
            for p in prompts for k in (0, 4, "auto")}
failed = False
for backend in ("cuda", "trt"):
    try:
        gen = Generator.load(bundle, backend=backend)
    except SsdError as exc:
        print(f"{backend}: not available: {exc}")
        continue
    same = sum(gen.generate(p, max_new_tokens=48, k=k).token_ids == ids
               for (p, k), ids in expected.items())
    print(f"{backend}: {same}/{len(expected)} streams equal to cpu  [{gen.backend_reason}]")
    # seeded sampling: the target alone's tokens (invariant coupling), so the cpu's at any k
    sampled = dict(max_new_tokens=48, temperature=0.8, top_p=0.95, seed=7)
    alike = sum(gen.generate(p, k=k, **sampled).token_ids == cpu.generate(p, k=0, **sampled).token_ids
                for p in prompts for k in (0, "auto"))
    print(f"{backend}: {alike}/{2 * len(prompts)} seeded sampled streams equal to cpu's k=0")
    failed |= same != len(expected) or alike != 2 * len(prompts)
print("auto picks:", Generator.load(bundle).backend_reason)
sys.exit(1 if failed else 0)
EOF

section "int4 target, standard flavour (blockwise DequantizeLinear): cuda against cpu"
QBUNDLE="$WORK/bundle-int4"
step 300 "ssd-export --quant int4 --graph standard --engines none" "$PY" -m ssd_export.cli \
  --target "$PAIR/target" --draft "$PAIR/draft" --output "$QBUNDLE" --max-context "$MAX_CONTEXT" \
  --quant int4 --quant-compute float --graph standard --engines none --force
step 150 "compare int4 token streams" "$PY" - "$QBUNDLE" <<'EOF'
import sys
from ssd_runtime import Generator
from ssd_runtime.errors import SsdError
bundle = sys.argv[1]
prompts = ["def read_config(path):", "import os\n", "for i in range(10):"]
cpu = Generator.load(bundle, backend="cpu")
print("quality:", cpu.manifest.target.quant_quality)
expected = {(p, k): cpu.generate(p, max_new_tokens=48, k=k).token_ids
            for p in prompts for k in (0, "auto")}
try:
    gen = Generator.load(bundle, backend="cuda")
except SsdError as exc:
    sys.exit(f"cuda: not available: {exc}")
# the kernels differ (CUDA's dequantize + GEMM against the CPU's MatMulNBits): equal streams
# are expected but near-ties may part them; k=auto must equal the same backend's k=0
same = sum(gen.generate(p, max_new_tokens=48, k=k).token_ids == ids
           for (p, k), ids in expected.items())
own = sum(gen.generate(p, max_new_tokens=48, k="auto").token_ids ==
          gen.generate(p, max_new_tokens=48, k=0).token_ids for p in prompts)
print(f"cuda int4: {same}/{len(expected)} streams equal to cpu's; k=auto equals cuda's own "
      f"k=0 on {own}/{len(prompts)}  [{gen.backend_reason}]")
sys.exit(0 if own == len(prompts) else 1)
EOF

section "static flavour on cuda: tokens against cpu, and a batch (issues 22, 24)"
SBUNDLE="$WORK/bundle-static"
step 150 "ssd-export --graph static --engines none" "$PY" -m ssd_export.cli \
  --target "$PAIR/target" --draft "$PAIR/draft" --output "$SBUNDLE" --max-context "$MAX_CONTEXT" \
  --graph static --engines none --max-batch 8 --force
step 120 "static: cuda against cpu, batched against alone" "$PY" - "$SBUNDLE" <<'EOF'
import sys, time
from ssd_runtime import Generator
from ssd_runtime.errors import SsdError
bundle = sys.argv[1]
prompts = ["def read_config(path):", "import os\n", "class Stack:\n    def push(self, item):",
           "for i in range(10):", "x = [1, 2, 3]\n", "def main():", "# parse the file\n", "y ="]
cpu = Generator.load(bundle, backend="cpu")
expected = [cpu.generate(p, max_new_tokens=48, k=0).token_ids for p in prompts]
try:
    gen = Generator.load(bundle, backend="cuda", max_batch=8)
except SsdError as exc:
    sys.exit(f"cuda: not available: {exc}")
alone = [gen.generate(p, max_new_tokens=48, k=k).token_ids for p in prompts for k in (0, 4)]
same = sum(ids == expected[i // 2] for i, ids in enumerate(alone))
print(f"cuda static: {same}/{len(alone)} streams (k=0, 4) equal to cpu's k=0  [{gen.backend_reason}]")
t = time.perf_counter()
for p in prompts:
    gen.generate(p, max_new_tokens=48, k=0)
one = time.perf_counter() - t
ok = same == len(alone)
for k in (0, 4, "auto"):
    t = time.perf_counter()
    batch = gen.generate_batch(prompts, max_new_tokens=48, k=k)
    took = time.perf_counter() - t
    equal = sum(r.token_ids == ids for r, ids in zip(batch, expected))
    ok &= equal == len(prompts)
    print(f"cuda static batch of 8, k={k}: {equal}/8 equal to cpu's k=0; {took:.3f} s against "
          f"{one:.3f} s one at a time at k=0")
sys.exit(0 if ok else 1)
EOF

section "gpu tests"
step 270 "pytest -m gpu" "$PY" -m pytest -q -p no:logging -m gpu tests/runtime/test_gpu.py -ra

section "ssd-bench: k=0 against k=auto on each backend (fp16 engines)"
for backend in cpu cuda trt; do
  step 100 "ssd-bench --backend $backend" "$PY" -m ssd_runtime.bench "$BENCH_BUNDLE" \
    --backend "$backend" --k 0,auto --repeats 1 --max-new-tokens 64 \
    --json "$WORK/bench-$backend.json"
done
# a CPU draft beside the GPU target (issue 24), sequential and split
step 100 "ssd-bench --backend cuda --draft-backend cpu" "$PY" -m ssd_runtime.bench \
  "$BENCH_BUNDLE" --backend cuda --draft-backend cpu --k 0,auto --mode sequential,split \
  --repeats 1 --max-new-tokens 64 --json "$WORK/bench-cuda-cpu-draft.json"

section "done in $(( $(date +%s) - START )) s; scratch files in $WORK"
echo "report: $REPORT"
