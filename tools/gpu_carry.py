"""Carry onnxruntime-gpu to the device machine in slices, and install it there (no network).

    python tools/gpu_carry.py pack [--wheel WHL] [--out .whl] [--slice-mib 30]   # here
    python tools/gpu_carry.py calls [--out .whl] [--steps "g h"] [--budget S]   # here: the calls again
    .venv/bin/python tools/gpu_carry.py extra [llguidance]   # here: a small package to carry too
    python3 tools/gpu_carry.py receive .whl/ortgpu.tar.xz.NN                    # there, per call
    python3 tools/gpu_carry.py install [--allow-no-gpu]                          # there, last call
    eval "$(python3 tools/gpu_carry.py env)"     # PYTHONPATH and LD_LIBRARY_PATH for what follows

The device machine has no network and takes at most 64 MiB a call (the working tree, ~31 MiB,
included), while onnxruntime-gpu's wheel is 255 MB. `pack` keeps only what `import
onnxruntime` and the CUDA provider load (the TensorRT provider, the C API library
libonnxruntime.so that the Python module does not link, and the transformers/tools/datasets
Python packages go; every kept file is byte-identical to the wheel's), writes it as one tar
compressed with LZMA (xz -9: Python's lzma and tarfile unpack it anywhere), cut into slices
of at most --slice-mib under --out with `ortgpu.json` (each slice's and the whole's sha256),
and prints the calls that carry them. `receive` checks a slice's sha256 and keeps it in
/tmp/ortgpu-slices (outside the repository, which each call replaces); `install` joins the
slices, checks the whole, unpacks it into /tmp/ortgpu/site, links the image's pip CUDA
libraries (nvidia/...) beside it for onnxruntime.preload_dlls, and checks in a fresh
interpreter with `env`'s variables (that folder first on PYTHONPATH, the nvidia libraries'
folders on LD_LIBRARY_PATH) that `onnxruntime` is that copy, lists CUDAExecutionProvider,
and runs a one-node graph on it (exit 1 if not).

`--steps "g h"` (pack, calls) prints calls that prepare and run only those steps of
tools/gpu_check.sh (its STEPS), with --budget seconds for the check (default 380 for all steps;
480 for a selection, whose few steps may have to wait for h's 135M exports, which start with the
first call). Step g's response_format needs llguidance, which the device's image may
lack: `extra` packs the installed distribution (its files as pip installed them; abi3, so one
build serves Python 3.9+) into --out/llguidance.tar.xz, which the last call then carries and
`install --extra` unpacks into the same folder and imports.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

VERSION = "1.31.1"
WHEEL = f"onnxruntime_gpu-{VERSION}-cp312-cp312-manylinux_2_28_x86_64.whl"
NAME = "ortgpu.tar.xz"
STASH = Path("/tmp/ortgpu-slices")       # on the device: outlives a call while the machine is warm
SITE = Path("/tmp/ortgpu/site")           # onnxruntime-gpu unpacked, first on PYTHONPATH
# Not loaded by `import onnxruntime` nor by a CUDA session (checked: the pybind module and the
# CUDA provider do not NEED libonnxruntime.so, which is the C API library for C/C++ users).
DROP_PREFIXES = ("onnxruntime/transformers/", "onnxruntime/tools/", "onnxruntime/datasets/")
DROP_FILES = ("onnxruntime/capi/libonnxruntime_providers_tensorrt.so",
              f"onnxruntime/capi/libonnxruntime.so.{VERSION}")
PROBE = r"""
import sys, onnxruntime as ort
from pathlib import Path
site = Path(sys.argv[1]).resolve()
where = Path(ort.__file__).resolve()
print("onnxruntime", ort.__version__, "from", where)
print("available providers:", ort.get_available_providers())
if site not in where.parents:
    sys.exit(f"onnxruntime comes from {where}, not from {site}: the image's copy shadows it")
if "CUDAExecutionProvider" not in ort.get_available_providers():
    sys.exit("no CUDAExecutionProvider in this onnxruntime")
import numpy as np, onnx
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "probe", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
model.ir_version = 9
ort.preload_dlls()
s = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider",
                                                               "CPUExecutionProvider"])
out = s.run(None, {"x": np.arange(4, dtype=np.float32)})[0]
print("a session's providers:", s.get_providers(), "| 2x:", out.tolist())
if s.get_providers()[0] != "CUDAExecutionProvider":
    sys.exit("the CUDA provider did not load (no GPU, or the CUDA/cuDNN libraries are missing)")
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("pack", help="here: repack the wheel into slices and print the calls")
    pk.add_argument("--wheel", type=Path, help=f"the wheel (default: /tmp/whl/{WHEEL}, else "
                                                f"downloaded there)")
    pk.add_argument("--out", type=Path, default=None, help="slices folder (default: .whl in "
                                                           "the repository root)")
    pk.add_argument("--slice-mib", type=float, default=30.0)
    pk.add_argument("--preset", type=int, default=9, help="xz preset (default 9)")
    pk.add_argument("--extreme", action="store_true",
                    help="xz's --extreme too (a little smaller, many times slower)")
    pk.add_argument("--steps", default=None, help="gpu_check.sh's STEPS for the calls "
                                                  "(default: all)")
    pk.add_argument("--budget", type=int, default=None, help="the check's BUDGET in seconds")
    cl = sub.add_parser("calls", help="here: print the calls for slices packed earlier")
    cl.add_argument("--out", type=Path, default=None)
    cl.add_argument("--steps", default=None, help="gpu_check.sh's STEPS for the calls "
                                                  "(default: all)")
    cl.add_argument("--budget", type=int, default=None, help="the check's BUDGET in seconds")
    ex = sub.add_parser("extra", help="here: pack an installed distribution to carry as well")
    ex.add_argument("dist", nargs="?", default="llguidance")
    ex.add_argument("--out", type=Path, default=None)
    rc = sub.add_parser("receive", help="there: check slices and keep them outside the repo")
    rc.add_argument("slices", nargs="+", type=Path)
    rc.add_argument("--stash", type=Path, default=STASH)
    ins = sub.add_parser("install", help="there: join, unpack and probe onnxruntime-gpu")
    ins.add_argument("--stash", type=Path, default=STASH)
    ins.add_argument("--site", type=Path, default=SITE)
    ins.add_argument("--allow-no-gpu", action="store_true",
                     help="a machine without a GPU: do not fail when CUDA does not load")
    ins.add_argument("--extra", type=Path, nargs="*", default=[],
                     help="packages packed by `extra` to unpack into --site as well")
    en = sub.add_parser("env", help="there: print the shell exports that put it first")
    en.add_argument("--site", type=Path, default=SITE)
    args = p.parse_args(argv)
    if args.command == "env":
        print("\n".join(f"export {k}={v}" for k, v in _env(args.site).items()))
        return 0
    if args.command == "pack":
        return pack(args)
    if args.command == "calls":
        repo = Path(_git("rev-parse", "--show-toplevel"))
        out = (args.out or repo / ".whl").resolve()
        return _print_calls(repo, out, json.loads((out / "ortgpu.json").read_text())["slices"],
                            args.steps, args.budget)
    if args.command == "extra":
        return extra(args.dist, args.out)
    if args.command == "receive":
        return receive(args.slices, args.stash)
    return install(args.stash, args.site, args.allow_no_gpu, args.extra)


def pack(args: argparse.Namespace) -> int:
    repo = Path(_git("rev-parse", "--show-toplevel"))
    out = (args.out or repo / ".whl").resolve()
    wheel = args.wheel or _download(Path("/tmp/whl"))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{NAME}*"):
        old.unlink()
    _exclude(repo, out)
    t0 = time.perf_counter()
    kept, dropped = 0, 0
    raw = io.BytesIO()
    with zipfile.ZipFile(wheel) as z, tarfile.open(fileobj=raw, mode="w",
                                                   format=tarfile.PAX_FORMAT) as tar:
        for info in z.infolist():
            if info.is_dir():
                continue
            if _dropped(info.filename):
                dropped += info.file_size
                continue
            data = z.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line + b"\n" for line in data.splitlines()
                                if not _dropped(line.split(b",")[0].decode()))
            member = tarfile.TarInfo(info.filename)
            member.size, member.mtime = len(data), 0
            member.mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
            tar.addfile(member, io.BytesIO(data))
            kept += info.file_size
    preset = args.preset | (lzma.PRESET_EXTREME if args.extreme else 0)
    packed = lzma.compress(raw.getvalue(), preset=preset)
    size = int(args.slice_mib * 2**20)
    slices = []
    for i in range(0, len(packed), size):
        path = out / f"{NAME}.{i // size:02d}"
        path.write_bytes(packed[i:i + size])
        slices.append({"name": path.name, "bytes": path.stat().st_size,
                       "sha256": hashlib.sha256(packed[i:i + size]).hexdigest()})
    manifest = {"wheel": wheel.name, "wheel_sha256": _sha256(wheel.read_bytes()),
                "packed_bytes": len(packed), "packed_sha256": _sha256(packed),
                "kept_bytes": kept, "dropped_bytes": dropped, "slices": slices}
    (out / "ortgpu.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{wheel.name}: kept {kept / 1e6:.1f} MB, dropped {dropped / 1e6:.1f} MB; xz -{args.preset}{'e' if args.extreme else ''} "
          f"{len(packed) / 1e6:.1f} MB in {len(slices)} slices of <= {args.slice_mib} MiB under "
          f"{out} ({time.perf_counter() - t0:.0f} s)")
    return _print_calls(repo, out, slices, args.steps, args.budget)


def extra(dist: str, out: Path | None) -> int:
    """Pack an installed distribution's files (as pip installed them) into OUT/DIST.tar.xz."""
    import importlib.metadata as md

    repo = Path(_git("rev-parse", "--show-toplevel"))
    out = (out or repo / ".whl").resolve()
    out.mkdir(parents=True, exist_ok=True)
    _exclude(repo, out)
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        print(f"{dist} is not installed for {sys.executable}: run this with the Python that has "
              f"it (.venv/bin/python)")
        return 1
    files = [f for f in d.files or [] if not str(f).startswith("..")
             and "__pycache__" not in str(f)]
    path = out / f"{dist}.tar.xz"
    with tarfile.open(path, mode="w:xz", preset=9) as tar:
        for f in files:
            tar.add(d.locate_file(f), arcname=str(f))
    print(f"{dist} {d.version}: {len(files)} files -> {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def receive(slices: list[Path], stash: Path) -> int:
    manifest = json.loads((slices[0].parent / "ortgpu.json").read_text())
    known = {s["name"]: s["sha256"] for s in manifest["slices"]}
    stash.mkdir(parents=True, exist_ok=True)
    bad = 0
    for path in slices:
        digest = _sha256(path.read_bytes())
        if known.get(path.name) != digest:
            print(f"{path.name}: sha256 {digest} is not the manifest's {known.get(path.name)}")
            bad += 1
            continue
        shutil.copyfile(path, stash / path.name)
        shutil.copyfile(slices[0].parent / "ortgpu.json", stash / "ortgpu.json")
        print(f"{path.name}: ok, kept in {stash}")
    missing = [n for n in known if not (stash / n).is_file()]
    print(f"slices kept: {len(known) - len(missing)}/{len(known)}"
          + (f"; still to send: {', '.join(missing)}" if missing else "; all here"))
    return 1 if bad else 0


def install(stash: Path, site: Path, allow_no_gpu: bool, extras: list[Path]) -> int:
    manifest = json.loads((stash / "ortgpu.json").read_text())
    parts = []
    for s in manifest["slices"]:
        path = stash / s["name"]
        if not path.is_file() or _sha256(path.read_bytes()) != s["sha256"]:
            print(f"{s['name']}: missing or damaged in {stash}: send it again (the machine "
                  f"was given back between calls if several are missing)")
            return 1
        parts.append(path.read_bytes())
    packed = b"".join(parts)
    if _sha256(packed) != manifest["packed_sha256"]:
        print("the joined slices' sha256 is not the manifest's")
        return 1
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    t0 = time.perf_counter()
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(packed)), mode="r:") as tar:
        tar.extractall(site, filter="data")
    print(f"{manifest['wheel']} (less {manifest['dropped_bytes'] / 1e6:.1f} MB) unpacked into "
          f"{site} in {time.perf_counter() - t0:.1f} s")
    _link_nvidia(site)
    for path in extras:                     # xz's own check guards each against damage
        with tarfile.open(path, mode="r:xz") as tar:
            tar.extractall(site, filter="data")
        name = path.name.split(".")[0]
        found = subprocess.run([sys.executable, "-c", f"import {name}; print({name}.__file__)"],
                               env=dict(os.environ, **_env(site)), capture_output=True,
                               text=True)
        print(f"{path.name}: unpacked; import {name}: "
              + (found.stdout.strip() or found.stderr.strip().splitlines()[-1]))
        if found.returncode:
            return 1
    env = dict(os.environ, **_env(site))
    print("\n".join(f"{k}={v}" for k, v in _env(site).items()))
    probe = subprocess.run([sys.executable, "-c", PROBE, str(site)], env=env)
    if probe.returncode and not allow_no_gpu:
        print("onnxruntime-gpu does not run on CUDA here: stop.")
        return 1
    print(f'use it with: eval "$(python3 tools/gpu_carry.py env)"')
    return 0


def _env(site: Path) -> dict[str, str]:
    """PYTHONPATH with the unpacked onnxruntime-gpu first, and LD_LIBRARY_PATH with the nvidia
    pip libraries' folders (preload_dlls finds them through the link; the loader then too)."""
    def first(name: str, paths: list[str]) -> str:
        return os.pathsep.join(dict.fromkeys(paths + [x for x in os.environ.get(name, "")
                                                      .split(os.pathsep) if x]))
    libs = sorted(str(p) for p in (site / "nvidia").glob("*/lib") if p.is_dir())
    return {"PYTHONPATH": first("PYTHONPATH", [str(site)]),
            "LD_LIBRARY_PATH": first("LD_LIBRARY_PATH", libs)}


def _dropped(name: str) -> bool:
    return name in DROP_FILES or name.startswith(DROP_PREFIXES)


def _link_nvidia(site: Path) -> None:
    """preload_dlls looks for nvidia/<cu13|cudnn>/lib/... beside the onnxruntime package: link
    the image's pip CUDA libraries (the nvidia namespace package torch uses) there."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        print("no nvidia pip libraries in this Python: preload_dlls falls back to the loader's "
              "path (LD_LIBRARY_PATH, a system CUDA)")
        return
    (site / "nvidia").symlink_to(locations[0], target_is_directory=True)
    libs = sorted(str(p.relative_to(locations[0])) for p in Path(locations[0]).glob("*/lib"))
    print(f"linked {site / 'nvidia'} -> {locations[0]} ({', '.join(libs)})")


def _download(folder: Path) -> Path:
    wheel = folder / WHEEL
    if not wheel.is_file():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                        "cp", "--platform", "manylinux_2_28_x86_64", "-d", str(folder),
                        f"onnxruntime-gpu=={VERSION}"], check=True)
    return wheel


def _exclude(repo: Path, out: Path) -> None:
    """Keep the slices out of git in every worktree: the common git dir's info/exclude."""
    try:
        rel = out.relative_to(repo)
    except ValueError:
        return
    pattern = f"/{rel.as_posix()}/"
    exclude = Path(_git("rev-parse", "--path-format=absolute", "--git-common-dir")) / "info" / "exclude"
    lines = exclude.read_text().splitlines() if exclude.is_file() else []
    if pattern not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("\n".join(lines + [pattern]) + "\n")
        print(f"added {pattern} to {exclude}")


def _print_calls(repo: Path, out: Path, slices: list[dict], steps: str | None = None,
                 budget: int | None = None) -> int:
    rel = out.relative_to(repo).as_posix()
    n = len(slices)
    # STEPS for gpu_check.sh (both stages): none given, the defaults' calls exactly as before
    env = f"STEPS='{' '.join(steps.split())}' " if steps else ""
    budget = budget or (480 if steps else 380)
    # step g's response_format needs llguidance (the default calls leave the image's as it is)
    extras = [f"{rel}/llguidance.tar.xz"] if steps and "g" in steps.split() else []
    for e in extras:
        if not (repo / e).is_file():
            print(f"{e} is missing: make it first with `.venv/bin/python tools/gpu_carry.py "
                  f"extra llguidance` (step g's response_format needs llguidance)")
            return 1
    print(f"\nThe calls, back to back (the machine goes back 30 s after a call returns; "
          f"`receive` says which slices it holds). Each carries one slice and {rel}/ortgpu.json"
          + (f"; the last also {', '.join(extras)}" if extras else "") + ":")
    for i, s in enumerate(slices):
        carry = [f"{rel}/{s['name']}", f"{rel}/ortgpu.json"] + (extras if i == n - 1 else [])
        command = f"python3 tools/gpu_carry.py receive {rel}/{s['name']}"
        if i == 0:
            command += " && " + PREPARE.replace("STAGE=prepare", env + "STAGE=prepare")
        if i == n - 1:
            final = FINAL.replace("INSTALL=0", env + "INSTALL=0").replace("BUDGET=380",
                                                                          f"BUDGET={budget}")
            if extras:
                final = final.replace("gpu_carry.py install",
                                      "gpu_carry.py install --extra " + " ".join(extras))
            command = "set -o pipefail; " + command + " && " + final
        print(f"\n# call {i + 1} of {n}\ncarry: {json.dumps(carry)}\ncommand ({len(command)} "
              f"characters):\n{command}")
        if len(command) > 2000:
            print(f"call {i + 1}'s command is {len(command)} characters, more than the 2,000 a "
                  f"call takes")
            return 1
    return 0


# The first call also starts the exports in the background (they need no onnxruntime-gpu), on
# a copy of the repository (the next calls replace the working tree); the last call's check
# waits for them and reuses them (WORK).
PREPARE = ("rm -rf /tmp/ssd-src && cp -a . /tmp/ssd-src && mkdir -p /tmp/ssd-gpu && "
           "(cd /tmp/ssd-src && STAGE=prepare INSTALL=0 WORK=/tmp/ssd-gpu BUDGET=900 setsid nohup bash "
           "tools/gpu_check.sh /tmp/ssd-gpu/prepare.txt > /tmp/ssd-gpu/prepare.log 2>&1 "
           "< /dev/null &) && sleep 2 && head -5 /tmp/ssd-gpu/prepare.txt")
FINAL = ("python3 tools/gpu_carry.py install 2>&1 | tee $OUT/install.txt && "
         "eval \"$(python3 tools/gpu_carry.py env)\" && "
         "INSTALL=0 WORK=/tmp/ssd-gpu BUDGET=380 bash tools/gpu_check.sh $OUT/gpu_report.txt; "
         "rc=$?; cp /tmp/ssd-gpu/prepare.txt $OUT/ 2>/dev/null; tail -c 60000 "
         "/tmp/ssd-gpu/prepare.log > $OUT/prepare_log.txt 2>/dev/null; (cd /tmp/ssd-gpu && "
         "tar -czf $OUT/bench_json.tgz *.json) 2>/dev/null; exit $rc")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


if __name__ == "__main__":
    sys.exit(main())
