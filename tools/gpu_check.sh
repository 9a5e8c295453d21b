#!/usr/bin/env bash
# GPU check for ssd-toolkit on a machine with an NVIDIA GPU, in one go (about 6 minutes).
#
#   tools/gpu_check.sh [REPORT]          # default REPORT: gpu_report.txt
#
# Reports what is installed, installs what is missing from PyPI when it may (INSTALL=1, best
# effort, never leaving onnxruntime and onnxruntime-gpu side by side), exports with the
# machine's own torch (each bundle kept in WORK and reused) the demo pair in the static
# flavour, its int8 target, and a float16 target of SmolLM2-135M's shapes (random weights,
# tools/random_model.py) with a tiny random draft, then on the cuda backend:
#   a. the demo pair's tokens, alone and in batches of 8 rows of different lengths, k = 0, 4,
#      auto, greedy and seeded, against the CPU provider's k=0; where ONNX Runtime puts nodes;
#   b. the 135M float16 target: batched k=0, 4 and auto at 1, 8 and 32 rows
#      (tools/batch_bench.py), and ssd-bench's single stream with its host share of a round;
#   c. ONNX Runtime CUDA graphs (the runtime has no option for them yet: said and skipped);
#   d. a CPU draft beside the GPU target (--draft-backend cpu), sequential;
#   e. the int8 target's tokens against the CPU's k=0 and cuda's own k=0;
#   f. a random EAGLE-3 head on the demo target: its tokens against the CPU's k=0;
#   g. issue 45: response_format (a JSON schema), prediction and logprobs on the demo pair,
#      greedy and seeded, k=0 and auto, alone and in a batch of 4, against the CPU's k=0
#      (tools/gpu_outputs.py);
#   h. issue 48: what a draft costs on the 135M float16 target: a random EAGLE-3 head, a
#      random full-size copy of the target and the tiny draft of b, each with ssd-bench's
#      calibration (target step, c, c1, v(k)) and batched k=0/4 at 1 and 8 rows;
# then the gpu tests, and TensorRT's streams where TensorRT is importable. Without a GPU the
# same steps run on the cpu backend at smaller sizes (a stand-in that tests this script), and
# the GPU-only ones say they were skipped. Every step has a time limit; a failed step is
# reported and the script goes on. Environment: PYTHON (default python3), WORK (scratch, and
# the bundles reused), BUDGET (seconds for the whole run, default 360), INSTALL (1, default:
# install missing GPU packages from PyPI; 0: never), STAGE (all, default; prepare: the models
# and exports alone, which need no GPU: the device's first call starts it in the background,
# tools/gpu_carry.py, and a later run with the same WORK waits for it and reuses them), STEPS
# (the steps to run, default all: "a f e b c d g h tests trt"; STAGE=prepare exports only what
# they need, so prepare and the run take the same STEPS), H_LAYERS (h's target depth: 30,
# SmolLM2-135M's, where nvidia-smi is; 8 for the CPU stand-in, the same widths).
set -u
cd "$(dirname "$0")/.." || exit 2
REPORT="$(realpath -m "${1:-gpu_report.txt}")"
PY="${PYTHON:-python3}"
WORK="${WORK:-$(mktemp -d /tmp/ssd-gpu-check.XXXXXX)}"
START=$(date +%s)
export SSD_CACHE_DIR="${SSD_CACHE_DIR:-$WORK/ssd-cache}"   # what loads remember (design §8.1)
BUDGET=${BUDGET:-360}           # seconds for the whole run: every step gets what is left
INSTALL=${INSTALL:-1}
STAGE=${STAGE:-all}
ALL_STEPS="a f e b c d g h tests trt"
# the default: the run as before g and h (g needs llguidance, which only `gpu_carry.py calls
# --steps` carries; h exports three 135M bundles): name them in STEPS to run them
STEPS=${STEPS:-"a f e b c d tests trt"}
for s in $STEPS; do
  case " $ALL_STEPS " in *" $s "*) ;; *) echo "STEPS: unknown step '$s' (known: $ALL_STEPS)" >&2; exit 2 ;; esac
done
want() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$WORK"
: > "$REPORT"

say()     { echo "$*" | tee -a "$REPORT"; }
section() { say ""; say "== $* ($(( $(date +%s) - START )) s)"; }
# step SECONDS LABEL CMD...: run with a time limit (within the budget), log, record the status
step() {
  local limit=$1 label=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ "$left" -lt 20 ]; then say "-- $label: SKIPPED (time budget of ${BUDGET}s spent)"; return 125; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0; t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >> "$REPORT" 2>&1
  local rc=$?
  say "-- $label: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc$([ $rc -eq 124 ] && echo ", timed out after ${limit}s"))") in $(( $(date +%s) - t0 )) s"
  return $rc
}
pyhas() { "$PY" -c "import $1" >/dev/null 2>&1; }
ort_has_cuda() {
  "$PY" -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" \
    >/dev/null 2>&1
}
# a session really on the CUDA provider (onnxruntime-gpu lists it even where it cannot load it)
cuda_runs() {
  "$PY" - >/dev/null 2>&1 <<'EOF'
import sys, onnxruntime as ort
from onnx import helper, TensorProto
v = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [2])
model = helper.make_model(helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "p",
                                            [v("x")], [v("y")]),
                          opset_imports=[helper.make_opsetid("", 18)])
model.ir_version = 9
getattr(ort, "preload_dlls", lambda: None)()
s = ort.InferenceSession(model.SerializeToString(),
                         providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
sys.exit(s.get_providers()[0] != "CUDAExecutionProvider")
EOF
}
prepare_running() {
  [ "$STAGE" != prepare ] && [ -f "$WORK/prepare.pid" ] && [ ! -f "$WORK/prepare.done" ] \
    && kill -0 "$(cat "$WORK/prepare.pid")" 2>/dev/null
}
export_once() {   # export_once LIMIT DIR ARGS...: ssd-export into DIR unless a bundle is there
  local limit=$1 dir=$2; shift 2
  local t0; t0=$(date +%s)
  # never export beside the prepare stage into the same folder: wait for its bundle
  while prepare_running && [ ! -f "$dir/manifest.json" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ] \
        && [ $(( $(date +%s) - START )) -lt "$BUDGET" ]; do
    sleep 2
  done
  if [ -f "$dir/manifest.json" ]; then say "-- reusing $dir"; return 0; fi
  step "$limit" "ssd-export $* -> $(basename "$dir")" nice -n 5 "$PY" -m ssd_export.cli \
    --output "$dir" --force --quiet "$@"
}

section "machine"
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   host: $(hostname)   repo: $(git rev-parse --short HEAD 2>/dev/null)   cores: $(nproc)   stage: $STAGE   steps: $STEPS"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv >> "$REPORT" 2>&1
  CUDA_MAJOR=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: \([0-9]*\).*/\1/p' | head -1)
  say "driver CUDA version (major): ${CUDA_MAJOR:-unknown}"
else
  say "nvidia-smi: not found (no NVIDIA driver?)"; CUDA_MAJOR=""
fi
[ -f /etc/nv_tegra_release ] && say "Jetson: $(head -1 /etc/nv_tegra_release)"
if [ "$STAGE" = prepare ]; then
  echo $$ > "$WORK/prepare.pid"; rm -f "$WORK/prepare.done"
fi

section "python environment"
if ! pyhas ssd_runtime; then
  # no install (the device has no network): pyproject's package dirs, linked onto PYTHONPATH
  mkdir -p "$WORK/pkgs"
  for pkg in ssd_runtime=runtime ssd_graphs=graphs ssd_export=ssd_export ssd_distill=ssd_distill; do
    ln -sfn "$PWD/${pkg#*=}" "$WORK/pkgs/${pkg%%=*}"
  done
  export PYTHONPATH="$WORK/pkgs${PYTHONPATH:+:$PYTHONPATH}"
  say "ssd-toolkit is not installed for $PY: its packages are linked from $WORK/pkgs"
fi
if [ "$INSTALL" = 1 ] && { ! pyhas torch || ! pyhas transformers || ! pyhas onnx; }; then
  say "the export extra is not importable by $PY: creating $WORK/venv"
  "$PY" -m venv --system-site-packages "$WORK/venv" >> "$REPORT" 2>&1 && PY="$WORK/venv/bin/python"
  step 300 "pip install -e .[export,test]" "$PY" -m pip install -q -e '.[export,test]'
fi
"$PY" - >> "$REPORT" 2>&1 <<'EOF'
import importlib, importlib.metadata as md, sys
print("python:", sys.executable, sys.version.split()[0])
for name in ("onnxruntime", "torch", "transformers", "onnx", "numpy", "llguidance", "ssd_runtime"):
    try:
        m = importlib.import_module(name)
        print(f"{name:13} {getattr(m, '__version__', '')} {m.__file__}")
    except Exception as exc:                                   # noqa: BLE001
        print(f"{name:13} not importable: {exc}")
for dist in ("onnxruntime", "onnxruntime-gpu"):
    try:
        print(f"installed distribution {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
import onnxruntime as ort
print("onnxruntime providers:", ort.get_available_providers())
EOF

section "GPU packages"
if [ "$STAGE" = prepare ]; then
  say "STAGE=prepare: exports only"
elif [ "$INSTALL" != 1 ]; then
  say "INSTALL=0: nothing installed (onnxruntime-gpu comes from PYTHONPATH: tools/gpu_carry.py)"
elif ! command -v nvidia-smi >/dev/null; then
  say "no NVIDIA driver: nothing installed"
else
  # download first: only swap onnxruntime for onnxruntime-gpu once the wheel is here
  if ! ort_has_cuda && step 180 "pip download onnxruntime-gpu" "$PY" -m pip download -q --no-deps -d "$WORK/wheels" onnxruntime-gpu; then
    "$PY" -m pip uninstall -y -q onnxruntime onnxruntime-gpu >> "$REPORT" 2>&1
    step 120 "pip install onnxruntime-gpu" "$PY" -m pip install -q "$WORK"/wheels/onnxruntime_gpu-*.whl \
      || step 120 "restore onnxruntime" "$PY" -m pip install -q onnxruntime
  fi
  pyhas tensorrt || step 300 "pip install tensorrt-cu12 (10.x)" "$PY" -m pip install -q 'tensorrt-cu12>=10,<11'
  if ! pyhas cuda.bindings.runtime && ! pyhas cuda.cudart; then
    spec="cuda-python>=12.3"; [ -n "$CUDA_MAJOR" ] && spec="cuda-python>=$CUDA_MAJOR,<$((CUDA_MAJOR + 1))"
    step 120 "pip install $spec" "$PY" -m pip install -q "$spec"
  fi
fi
BACKEND=cpu; GPU=""
if [ "$STAGE" != prepare ] && command -v nvidia-smi >/dev/null && ort_has_cuda && cuda_runs; then
  BACKEND=cuda; GPU=1
  say "a session runs on CUDAExecutionProvider: the steps below run on the cuda backend"
elif [ "$STAGE" != prepare ]; then
  say "NO GPU SESSION (no driver, no CUDAExecutionProvider, or it did not load): the cuda steps run on the cpu backend at smaller sizes, as a stand-in that tests this script; GPU-only steps are skipped"
fi

section "models and exports (reused from WORK when there)"
export HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
PAIR=examples/demo-pair
DEMO="$WORK/demo-static"; QUANT="$WORK/demo-int8"; B135="$WORK/smollm2-135m-fp16"
HEADB="$WORK/demo-head-static"
demo_bundle() {
  export_once 300 "$DEMO" --target "$PAIR/target" --draft "$PAIR/draft" --max-context 1024 \
    --graph static --max-batch 8
}
quant_bundle() {
  export_once 600 "$QUANT" --target "$PAIR/target" --draft "$PAIR/draft" --max-context 1024 \
    --quant int8 --max-batch 8
}
head_bundle() {   # a random EAGLE-3 head (tests/tiny.py) on the demo target: the plumbing, not α
  [ -f "$HEADB/manifest.json" ] || prepare_running || [ -f "$WORK/demo-head/config.json" ] \
    || step 60 "random EAGLE-3 head for the demo target" "$PY" -c "
import json, sys; sys.path.insert(0, 'tests'); import tiny; from pathlib import Path
c = json.loads(Path('$PAIR/target/config.json').read_text())
L = c['num_hidden_layers']
tiny.build_eagle3_head(Path('$WORK/demo-head'), 'safeailab', target_hidden=c['hidden_size'],
    vocab=c['vocab_size'], hidden=c['hidden_size'], draft_vocab=512, embed=False, seed=1,
    layer_ids=(2, L // 2, L - 3), max_position_embeddings=c['max_position_embeddings'])"
  export_once 300 "$HEADB" --target "$PAIR/target" --draft "$WORK/demo-head" \
    --max-context 1024 --graph static --max-batch 8
}
random_model() {   # random_model DIR ARGS...: tools/random_model.py into DIR unless it is there
  local dir=$1; shift
  [ -f "$dir/config.json" ] || prepare_running \
    || step 120 "random $(basename "$dir")" "$PY" tools/random_model.py "$@" --output "$dir" --force
}
b135_bundle() {
  [ -f "$B135/manifest.json" ] || random_model "$WORK/smollm2-135m" --config smollm2-135m --dtype float16
  [ -f "$B135/manifest.json" ] || random_model "$WORK/tiny-llama" --config tiny-llama --dtype float16
  export_once 600 "$B135" --target "$WORK/smollm2-135m" --draft "$WORK/tiny-llama" \
    --max-context 512 --graph static --dtype float16 --max-batch 32
}
# h: the 135M target (H_LAYERS deep) with three drafts. At full depth its tiny-draft bundle is
# b's. `h_bundles -p` leaves the three exports running beside each other (the caller waits):
# the prepare stage does so where there are 8 cores or more (each export is mostly one core's
# trace; the full-size copy's, two 135M traces, is the longest).
if command -v nvidia-smi >/dev/null; then H_LAYERS=${H_LAYERS:-30}; else H_LAYERS=${H_LAYERS:-8}; fi
if [ "$H_LAYERS" = 30 ]; then HSUF=""; else HSUF="-l$H_LAYERS"; fi
HTARGET="$WORK/smollm2-135m$HSUF"; HCOPY="$WORK/smollm2-135m-copy$HSUF"
HHEAD="$WORK/smollm2-135m-head$HSUF"
H_HEAD="$WORK/h135$HSUF-head"; H_SELF="$WORK/h135$HSUF-self"
if [ -z "$HSUF" ]; then H_TINY="$B135"; else H_TINY="$WORK/h135$HSUF-tiny"; fi
h_bundles() {
  local jobs=(); [ "${1:-}" = -p ] && jobs=(-p)
  local depth=(); [ -n "$HSUF" ] && depth=(--layers "$H_LAYERS")
  local ready=1 b; for b in "$H_HEAD" "$H_SELF" "$H_TINY"; do [ -f "$b/manifest.json" ] || ready=""; done
  if [ -z "$ready" ]; then
    random_model "$HTARGET" --config smollm2-135m --dtype float16 "${depth[@]}"
    random_model "$HCOPY" --config smollm2-135m --dtype float16 --seed 1 "${depth[@]}"
    random_model "$HHEAD" --config smollm2-135m --head "${depth[@]}"
    random_model "$WORK/tiny-llama" --config tiny-llama --dtype float16
  fi
  local common=(--max-context 512 --graph static --dtype float16 --draft-quant none)
  _bg "${jobs[@]}" export_once 600 "$H_HEAD" --target "$HTARGET" --draft "$HHEAD" "${common[@]}" --max-batch 8
  _bg "${jobs[@]}" export_once 600 "$H_SELF" --target "$HTARGET" --draft "$HCOPY" "${common[@]}" --max-batch 8
  if [ -z "$HSUF" ]; then _bg "${jobs[@]}" b135_bundle
  else _bg "${jobs[@]}" export_once 600 "$H_TINY" --target "$HTARGET" --draft "$WORK/tiny-llama" \
         "${common[@]}" --max-batch 8; fi
}
_bg() { if [ "$1" = -p ]; then shift; "$@" & else "$@"; fi; }   # in the background with -p
if prepare_running; then
  # the token checks (a, e, f, g) run beside the exports; the timings (b, d, h) wait for them
  say "the prepare stage (pid $(cat "$WORK/prepare.pid")) is still exporting: each step waits for its bundle"
else
  # h's exports first, in the background where there are cores, the others beside them
  if want h; then if [ "$(nproc)" -ge 8 ]; then h_bundles -p; else h_bundles; fi; fi
  { want a || want d || want g; } && demo_bundle
  want f && head_bundle
  want e && quant_bundle
  want b && { { want h && [ -z "$HSUF" ]; } || b135_bundle; }   # else h's exports make it
  wait
fi
"$PY" - "$DEMO" "$HEADB" "$QUANT" "$B135" "$H_HEAD" "$H_SELF" "$H_TINY" >> "$REPORT" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
for b in map(Path, sys.argv[1:]):
    if (b / "manifest.json").is_file():
        m = json.loads((b / "manifest.json").read_text())
        t, build = m["models"]["target"], m["build"]
        size = sum(f.stat().st_size for f in b.rglob("*") if f.is_file()) / 1e6
        print(f"{b.name}: {size:.0f} MB; target {t['graph']}, {build['dtype']}, quant {t['quant']}, "
              f"{t['parameters'] / 1e6:.1f}M parameters; max_batch {m['max_batch']}, max_context "
              f"{m['max_context']}; exported with torch {build['torch']}, onnxruntime "
              f"{build['onnxruntime']} on {build['created']}")
EOF
if [ "$STAGE" = prepare ]; then
  touch "$WORK/prepare.done"
  section "prepared in $(( $(date +%s) - START )) s"
  exit 0
fi

if [ -n "$GPU" ]; then
  ROWS=8; TOKENS=48; KS=0,4,auto; BROWS=1,8,32; BK=0,4,auto; BTOK=128; BREP=2
  GROWS=4; GTOK=48; HROWS=1,8; HTOK=64; HBTOK=64
else   # the CPU stand-in: the same steps, small enough for a 2-core machine
  ROWS=4; TOKENS=16; KS=0,4,auto; BROWS=1,4; BK=0,auto; BTOK=8; BREP=1
  GROWS=4; GTOK=32; HROWS=1,4; HTOK=8; HBTOK=8
fi
PROMPTS2="$WORK/two_prompts.jsonl"
head -2 runtime/data/bench_prompts.jsonl > "$PROMPTS2"
# tokens_step SECONDS LABEL BUNDLE: the bundle's streams and batches on the backend against
# the CPU provider's k=0 (tools/gpu_tokens.py)
tokens_step() {
  step "$1" "tokens: $2 on $BACKEND" "$PY" tools/gpu_tokens.py "$3" --backend "$BACKEND" \
    --rows "$ROWS" --k "$KS" --max-new-tokens "$TOKENS" --placement
}
wait_prepare() {   # the timings want the cores to themselves
  if prepare_running; then
    say "waiting for the prepare stage to end"
    while prepare_running && [ $(( $(date +%s) - START )) -lt $(( BUDGET - 120 )) ]; do sleep 2; done
  fi
}

if want a; then
section "a. demo pair, static flavour: $BACKEND streams and batches of $ROWS against the cpu's k=0"
demo_bundle
tokens_step 150 "demo static" "$DEMO"
fi

if want g; then
section "g. demo pair, static flavour: response_format, prediction, logprobs on $BACKEND against the cpu's k=0"
demo_bundle
if pyhas llguidance; then
  step 150 "outputs: demo static on $BACKEND" "$PY" tools/gpu_outputs.py "$DEMO" \
    --backend "$BACKEND" --rows "$GROWS" --max-new-tokens "$GTOK"
else
  say "-- outputs: FAILED (exit 2): llguidance is not importable by $PY (response_format needs it; tools/gpu_carry.py calls --steps with g carries it)"
fi
fi

if want f; then
section "f. an EAGLE-3 head (static flavour) on the demo target: $BACKEND against the cpu's k=0"
head_bundle
tokens_step 120 "demo + head" "$HEADB"
fi

if want e; then
section "e. int8 target (static flavour, DequantizeLinear): $BACKEND against the cpu's k=0"
quant_bundle
tokens_step 120 "demo int8" "$QUANT"
fi

# the random draft is never right, but a random target's greedy text repeats itself, which
# lookup drafts (the default draft source) would catch: --draft-source model prices the draft
if want b; then
section "b. SmolLM2-135M shapes, float16, random weights: batched k=0/4/auto on $BACKEND"
b135_bundle
wait_prepare
step 180 "batch_bench rows $BROWS" "$PY" tools/batch_bench.py "$B135" --backend "$BACKEND" \
  --rows "$BROWS" --k "$BK" --repeats "$BREP" --max-new-tokens "$BTOK" --draft-source model \
  --json "$WORK/batch135.json"

section "b. ssd-bench, one stream: host share of a round"
if [ -n "$GPU" ]; then
  step 90 "ssd-bench 135M fp16 --backend cuda" "$PY" -m ssd_runtime.bench "$B135" \
    --backend cuda --k 0,4,auto --repeats 1 --max-new-tokens 128 --draft-source model \
    --json "$WORK/bench135.json"
  step 60 "ssd-bench demo static --backend cuda" "$PY" -m ssd_runtime.bench "$DEMO" \
    --backend cuda --k 0,4,auto --repeats 1 --max-new-tokens 128 --json "$WORK/bench-demo.json"
else
  step 90 "ssd-bench 135M fp16 --backend cpu (2 prompts)" "$PY" -m ssd_runtime.bench "$B135" \
    --backend cpu --k 0 --repeats 1 --max-new-tokens 8 --prompts "$PROMPTS2"
fi
fi

# Random weights: nothing is accepted (lookup would catch a random target's loops: --draft-source
# model leaves it out), so what h measures is what a draft costs: c = a draft step / a target
# step, c1 (a round's first draft step), v(k) (a verification of k+1 tokens / a target step),
# and batched tokens/s of rounds that draft 4 and keep none, against k=0.
if want h; then
section "h. what a draft costs on the 135M float16 target ($H_LAYERS layers): EAGLE-3 head, full-size copy, tiny draft, on $BACKEND"
h_bundles
wait_prepare
for b in "$H_HEAD" "$H_SELF" "$H_TINY"; do
  name=$(basename "$b")
  step 90 "ssd-bench $name (calibration)" "$PY" -m ssd_runtime.bench "$b" --backend "$BACKEND" \
    --k 0,4 --repeats 1 --max-new-tokens "$HTOK" --draft-source model --prompts "$PROMPTS2" \
    --json "$WORK/h-bench-$name.json"
  step 90 "batch_bench $name rows $HROWS" "$PY" tools/batch_bench.py "$b" --backend "$BACKEND" \
    --rows "$HROWS" --k 0,4 --repeats 1 --max-new-tokens "$HBTOK" --draft-source model \
    --json "$WORK/h-batch-$name.json"
done
"$PY" - "$WORK" "$H_HEAD" "$H_SELF" "$H_TINY" >> "$REPORT" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
print("h, what a draft costs (ssd-bench's calibration, medians; batch_bench's tokens/s k=0 -> k=4):")
for b in map(Path, sys.argv[2:]):
    try:
        m = json.loads((b / "manifest.json").read_text())
        cal = next(iter(json.loads((work / f"h-bench-{b.name}.json").read_text())
                        ["calibration"].values()))
    except (OSError, ValueError, StopIteration) as exc:
        print(f"  {b.name}: no result ({exc})")
        continue
    v = ", ".join(f"{x:.2f}" for x in cal["v"][1:6])
    line = (f"  {b.name:20} draft {m['models']['draft']['parameters'] / 1e6:5.1f}M: target step "
            f"{cal['target_step_ms']:.2f} ms, draft step {cal['draft_step_ms']:.2f} ms, "
            f"c {cal['c']:.3f}, c1 {cal['c_first']:.3f}, v(1..5) {v}")
    try:
        rows = json.loads((work / f"h-batch-{b.name}.json").read_text())["rows"]
        line += "".join(f"; rows {r}: {ks['0']['tokens_per_s'][0]:.0f} -> "
                        f"{ks['4']['tokens_per_s'][0]:.0f} tok/s" for r, ks in rows.items())
    except (OSError, ValueError, KeyError) as exc:
        line += f"; no batch result ({exc!r})"
    print(line)
EOF
fi

if want c; then
section "c. ONNX Runtime CUDA graphs over the static flavour"
if grep -rqs -e enable_cuda_graph -e gpu_graph_id runtime/backends; then
  say "the runtime mentions CUDA graphs, but this check has no step for them yet: skipped"
else
  say "skipped: the runtime has no CUDA-graph option (no enable_cuda_graph in runtime/backends); the node placements above say whether ONNX Runtime could capture these graphs (it refuses when a node is on the CPU)"
fi
fi

if want d; then
section "d. a CPU draft beside the GPU target (--draft-backend cpu), sequential"
if [ -n "$GPU" ]; then
  step 90 "ssd-bench demo static --backend cuda --draft-backend cpu" "$PY" -m ssd_runtime.bench \
    "$DEMO" --backend cuda --draft-backend cpu --k 0,4,auto --mode sequential --repeats 1 \
    --max-new-tokens 128 --json "$WORK/bench-cpu-draft.json"
else
  say "-- skipped: needs a GPU target"
fi
fi

if want tests; then
section "gpu tests"
if [ -n "$GPU" ]; then
  step 90 "pytest -m gpu" "$PY" -m pytest -q -p no:logging -p no:cacheprovider -m gpu tests/runtime/test_gpu.py -ra
else
  say "-- skipped: no GPU (they skip themselves)"
fi
fi

if want trt; then
section "TensorRT"
if [ -n "$GPU" ] && pyhas tensorrt; then
  STD="$WORK/demo-standard"
  export_once 240 "$STD" --target "$PAIR/target" --draft "$PAIR/draft" --max-context 1024 \
    --graph standard --engines auto --engine-precision fp32
  step 120 "trt streams against cpu" "$PY" - "$STD" <<'EOF'
import sys
from ssd_runtime import Generator
bundle = sys.argv[1]
prompts = ["def read_config(path):", "import os\n", "for i in range(10):"]
cpu = Generator.load(bundle, backend="cpu")
gen = Generator.load(bundle, backend="trt")
same = sum(gen.generate(p, max_new_tokens=48, k=k).token_ids
           == cpu.generate(p, max_new_tokens=48, k=0).token_ids for p in prompts for k in (0, 4, "auto"))
print(f"trt: {same}/{3 * len(prompts)} streams equal to cpu's k=0  [{gen.backend_reason}]")
sys.exit(same != 3 * len(prompts))
EOF
else
  say "-- skipped: $([ -n "$GPU" ] && echo "TensorRT is not importable" || echo "no GPU")"
fi
fi

section "done in $(( $(date +%s) - START )) s; bundles and JSON in $WORK"
FAILED=$(grep -E '^-- .*(FAILED|SKIPPED)' "$REPORT")
say "${FAILED:-every step ok}"
echo "report: $REPORT"
! grep -qE '^-- .*FAILED' "$REPORT"
