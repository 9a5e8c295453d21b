#!/usr/bin/env bash
# The runtime on an aarch64 CPU (Jetson, Arm servers), under emulation: tokens equal to x86's.
#
#   tools/aarch64_check.sh [REPORT]          # default REPORT: aarch64_report.txt
#
# Builds (or reuses) a Debian arm64 root with Python, installs the runtime there as the README
# tells a Jetson or Arm user (`pip install '.[structured]'` in a venv: numpy, onnxruntime,
# tokenizers, and llguidance's aarch64 wheel for response_format; no torch), exports the demo
# pair here on x86 twice (the defaults: float target, int8 draft; and `--quant int4`: an int4
# target), runs tools/aarch64_tokens.py's generations (greedy and seeded sampling at k = 0, 4,
# auto, batches included, and greedy under a JSON schema, which llguidance compiles and masks
# there) on both machines and compares the tokens and the target's logits. Exit 0: every
# stream equal, or parted only because the two machines' logits differ (each machine's own
# row, replayed, gives its token: a near-tie the kernels' rounding decided); 1: any other
# difference or a failed step; 2: qemu-user-static, debootstrap or proot missing and not
# installable.
#
# How the arm64 programs run without binfmt_misc: the kernel cannot exec an arm64 binary, so
# every arm64 process has to be started through qemu-aarch64-static. `chroot ROOT
# qemu-aarch64-static /bin/sh` starts one, but the shell's own children (debootstrap's second
# stage, pip's build subprocesses) fail with "Exec format error". proot -q does what
# binfmt_misc would: it intercepts every execve and puts qemu in front, and it maps ROOT to /
# without a chroot. The root is built with `debootstrap --foreign` (downloads and unpacks on
# the host), then `debootstrap --second-stage` under proot.
#
# What the guest sees as its CPU: qemu's model (QEMU_CPU, default cortex-a76: ARMv8.2 with
# dot product and fp16, no i8mm, no SVE, as the Cortex-A78AE of a Jetson Orin; qemu 7.2 has
# no A78). Its features reach programs through the auxiliary vector (HWCAP), which is what
# ONNX Runtime's kernel choice reads. The host's /proc/cpuinfo describes the x86 CPU, and
# ONNX Runtime's cpuinfo library crashes parsing it beside the host's /sys, so the guest gets
# an Arm /proc/cpuinfo (the model's MIDR) and /sys/devices/system/cpu/{possible,present}
# written here.
#
# Environment: AARCH64_ROOT (the arm64 root, reused; default /var/cache/ssd-aarch64/root),
# AARCH64_WORK (bundles and results; default /var/cache/ssd-aarch64/work: the bundles are
# reused, REEXPORT=1 exports again), PYTHON (an x86 Python with the exporter; default
# .venv/bin/python), QEMU_CPU (cortex-a76 | neoverse-n1 | max ...), TOKENS (new tokens per
# stream, default 48), SUITE (default bookworm: Python 3.11, for which onnxruntime, numpy
# and tokenizers publish aarch64 wheels), MIRROR.
set -u
cd "$(dirname "$0")/.."
REPO=$(pwd)
REPORT="$(realpath -m "${1:-aarch64_report.txt}")"
ROOT="${AARCH64_ROOT:-/var/cache/ssd-aarch64/root}"
WORK="${AARCH64_WORK:-/var/cache/ssd-aarch64/work}"
PY="${PYTHON:-.venv/bin/python}"
export QEMU_CPU="${QEMU_CPU:-cortex-a76}"
TOKENS="${TOKENS:-48}"
SUITE="${SUITE:-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
VENV=/opt/ssd-venv                   # inside the root
START=$(date +%s)
: > "$REPORT"

say()     { echo "$*" | tee -a "$REPORT"; }
section() { say ""; say "== $* ($(( $(date +%s) - START )) s)"; }
refuse()  { echo "aarch64_check: $*" >&2; exit 2; }
# timed LABEL CMD...: run, log its output to the report, say how long it took
timed() {
  local label=$1 t0; shift; t0=$(date +%s)
  "$@" >> "$REPORT" 2>&1; local rc=$?
  say "-- $label: $([ $rc -eq 0 ] && echo ok || echo "FAILED (exit $rc)") in $(( $(date +%s) - t0 )) s"
  return $rc
}
# arm CMD...: run an arm64 command in the root under proot + qemu, with a clean environment.
# The host's CA bundle is bound in, so that pip trusts what the host trusts (a proxy's CA).
# From /tmp: proot starts in the host's working directory, which the root may not have.
# The libraries' own thread pools are kept to one thread (numpy's OpenBLAS, tokenizers'):
# with them qemu-user 7.2 killed the int8 run with "uncaught target signal 11" at instructions
# that cannot fault (an adrp, a load from the stack), at a different case each time, in 6 of
# 13 runs; with one thread 0 of 5 (2026-12-03). ONNX Runtime's threads are the runtime's own
# choice (1 each here) either way.
arm() (
  cd /tmp && env -i PATH=$VENV/bin:/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 QEMU_CPU="$QEMU_CPU" \
    OPENBLAS_NUM_THREADS=1 RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
    proot -q qemu-aarch64-static -r "$ROOT" -w /root -b /dev -b /proc \
      -b "$WORK/fake/cpuinfo:/proc/cpuinfo" -b "$WORK/fake/cpu:/sys/devices/system/cpu" \
      -b /etc/resolv.conf -b /etc/ssl/certs/ca-certificates.crt \
      -b "$WORK:/work" -b "$REPO/tools:/tools" "$@"
)

# arm_tokens NAME: aarch64_tokens.py's run on bundle-NAME there; fails without a complete result
arm_tokens() {
  arm python /tools/aarch64_tokens.py run "/work/bundle-$1" --out "/work/arm-$1.json" \
    --tokens "$TOKENS" --against "/work/x86-$1.json" && grep -q '"total_s"' "$WORK/arm-$1.json"
}

# -- the host's tools: install them where apt can, else refuse in one line
need=()
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
command -v proot >/dev/null || need+=(proot)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing ${need[*]} (apt-get)"
    { apt-get install -y -q "${need[@]}" || { apt-get update -q && apt-get install -y -q "${need[@]}"; }; } \
      > "$REPORT.apt.log" 2>&1
  fi
  missing=()
  for p in "${need[@]}"; do
    case $p in qemu-user-static) c=qemu-aarch64-static ;; *) c=$p ;; esac
    command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] || refuse "missing ${missing[*]} and could not install it: run" \
    "'apt-get install ${missing[*]}' as root (Debian or Ubuntu), then run this again."
fi
[ "$(id -u)" = 0 ] || refuse "building the arm64 root needs root (debootstrap): run it as root."
[ -x "$PY" ] || refuse "no x86 Python with the exporter at $PY: run 'make install' or set PYTHON."
PATH=$PATH:/usr/sbin

section "machine"
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)   host: $(uname -m), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)   repo: $(git rev-parse --short HEAD 2>/dev/null)"
say "qemu: $(qemu-aarch64-static --version | head -1), QEMU_CPU=$QEMU_CPU; proot $(proot --version 2>&1 | grep -o '[0-9][0-9.]*' | tail -1)"
say "root: $ROOT ($SUITE arm64); work: $WORK"

# -- what the guest reads as its CPU (see the header)
mkdir -p "$WORK/fake/cpu"
case $QEMU_CPU in           # MIDR fields: implementer variant part revision
  cortex-a72)  midr="0x41 0x0 0xd08 3" ;;
  cortex-a76)  midr="0x41 0x4 0xd0b 1" ;;
  neoverse-n1) midr="0x41 0x4 0xd0c 1" ;;
  *)           midr="0x00 0x0 0x051 0" ;;   # qemu's "max"
esac
read -r impl var part rev <<< "$midr"
: > "$WORK/fake/cpuinfo"
for i in 0 1; do
  printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: %s\nCPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %s\n\n' \
    "$i" "$impl" "$var" "$part" "$rev" >> "$WORK/fake/cpuinfo"
done
for f in possible present online; do echo 0-1 > "$WORK/fake/cpu/$f"; done

section "arm64 root"
if [ -f "$ROOT/.ssd-root-ready" ]; then
  say "reusing $ROOT (built $(cat "$ROOT/.ssd-root-ready"))"
else
  rm -rf "$ROOT"; mkdir -p "$ROOT"
  timed "debootstrap --foreign (download, unpack)" debootstrap --arch=arm64 --variant=minbase \
    --foreign --include=python3,python3-venv,ca-certificates "$SUITE" "$ROOT" "$MIRROR" || exit 1
  rm -f "$ROOT/proc"; mkdir -p "$ROOT/proc"          # the first stage links it to the host's
  timed "debootstrap --second-stage (under proot + qemu)" env DEBOOTSTRAP_DIR=/debootstrap \
    proot -0 -q qemu-aarch64-static -r "$ROOT" -w / -b /dev -b /proc \
    /debootstrap/debootstrap --second-stage || exit 1
  timed "python3 -m venv $VENV" arm /usr/bin/python3 -m venv "$VENV" || exit 1
  date -u +%Y-%m-%dT%H:%M:%SZ > "$ROOT/.ssd-root-ready"
fi
say "python: $(arm /usr/bin/python3 -c 'import platform; print(platform.machine(), platform.python_version())' 2>&1 | tail -1)"

section "install the runtime there: pip install '.[structured]' (a copy of this checkout, no torch)"
rm -rf "$ROOT/opt/ssd-src"; mkdir -p "$ROOT/opt/ssd-src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$ROOT/opt/ssd-src"
timed "pip install '.[structured]' (emulated)" arm sh -c "cd /opt/ssd-src && pip install -q '.[structured]'" || exit 1
say "$(arm python -c 'import importlib.metadata as m, sys; print(*(f"{d} {m.version(d)}" for d in ("ssd-toolkit", "onnxruntime", "numpy", "tokenizers", "llguidance")), sep=", "); print("torch:", "torch" in {d.metadata["Name"] for d in m.distributions()})' 2>&1 | tr '\n' ' ')"

section "export on x86 (demo pair, --max-context 256 --max-batch 4)"
export_one() {     # NAME ARGS...
  local name=$1; shift
  if [ -f "$WORK/bundle-$name/manifest.json" ] && [ -z "${REEXPORT:-}" ]; then
    say "reusing $WORK/bundle-$name"; return 0
  fi
  timed "ssd-export $name $*" "$(dirname "$PY")/ssd-export" --target examples/demo-pair/target \
    --draft examples/demo-pair/draft --output "$WORK/bundle-$name" --max-context 256 \
    --max-batch 4 --force --quiet "$@"
}
export_one int8 || exit 1                   # defaults: float target, int8 draft, ort flavour
export_one int4 --quant int4 || exit 1      # an int4 target (int8 activations), int8 draft

status=0
for name in int8 int4; do
  section "bundle-$name: x86 against aarch64 ($QEMU_CPU, emulated)"
  timed "x86 run" env -u QEMU_CPU "$PY" tools/aarch64_tokens.py run "$WORK/bundle-$name" \
    --out "$WORK/x86-$name.json" --tokens "$TOKENS" || { status=1; continue; }
  # A qemu-user crash ("uncaught target signal 11", see arm() above) leaves proot's exit
  # status 0, so a run is judged by its result: the JSON with its closing "total_s". A crash
  # is retried once, and the report shows it.
  done_arm=0
  for try in 1 2; do
    rm -f "$WORK/arm-$name.json"
    timed "aarch64 run (emulated, try $try)" arm_tokens "$name" && { done_arm=1; break; }
    say "-- the emulated run left no complete result$([ $try = 1 ] && echo '; once more')"
  done
  [ $done_arm = 1 ] || { say "no aarch64 result for $name"; status=1; continue; }
  env -u QEMU_CPU "$PY" tools/aarch64_tokens.py compare "$WORK/x86-$name.json" "$WORK/arm-$name.json" \
    --bundle "$WORK/bundle-$name" 2>&1 | tee -a "$REPORT"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done

section "done"
say "emulated timings are qemu's on this host, not a board's speed; exit $status"
exit $status
