"""What start-up remembers (ssd_runtime.cache, docs/design.md §8.1): a second load hashes and
times nothing, a modified file is still refused, and a bad cache is only ignored."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ssd_runtime.backends as backends
from ssd_runtime import BundleError, Generator, cache, manifest
from ssd_runtime.scheduler import planner


@pytest.fixture
def bundle(bundle_factory, tmp_path, monkeypatch) -> Path:
    """A fresh copy of a small bundle, whose files are old enough to be remembered as checked
    (the racy-file margin made short, and waited out)."""
    dst = tmp_path / "bundle"
    shutil.copytree(bundle_factory("llama", "llama_cut", max_context=48), dst)
    monkeypatch.setattr(cache, "RACY_S", 0.05)
    time.sleep(0.1)
    return dst


@pytest.fixture
def counts(monkeypatch) -> dict[str, int]:
    """How many files were hashed, thread placements timed and calibrations run."""
    seen = {"hashed": 0, "timed": 0, "calibrated": 0}

    def counted(module, name: str, what: str) -> None:
        inner = getattr(module, name)

        def wrapper(*args, **kwargs):
            seen[what] += 1
            return inner(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)

    counted(manifest, "sha256_file", "hashed")
    counted(backends, "fastest", "timed")
    # the machine as quiet while threads are timed, whatever else runs on it: a placement
    # timed on a busy one is timed again at later loads (test_placement.py checks that)
    monkeypatch.setattr(backends, "Busy", Quiet)
    counted(planner, "calibrate", "calibrated")
    return seen


class Quiet:
    """machine.Busy on a machine that nothing else uses."""

    def cores(self) -> float:
        return 0.0


def load(bundle: Path, **options) -> Generator:
    gen = Generator.load(bundle, backend="cpu", **options)
    gen.knowledge.cost_model()                         # what the first k="auto" call measures
    return gen


def test_a_second_load_hashes_and_times_nothing(bundle, counts):
    first = load(bundle)
    files = len(first.manifest.files)
    assert counts["hashed"] == files and counts["calibrated"] == 1
    timed = counts["timed"]                  # 2 (target, draft) with more than one core
    second = load(bundle)
    assert counts == {"hashed": files, "timed": timed, "calibrated": 1}
    assert second.knowledge.cost_model() == first.knowledge.cost_model()
    assert (second.target.threads, second.draft.threads) == \
        (first.target.threads, first.draft.threads)
    assert second.generate([0, 5, 9], max_new_tokens=8, k="auto").token_ids == \
        first.generate([0, 5, 9], max_new_tokens=8, k=0).token_ids


@pytest.mark.parametrize("how", ["bytes changed, mtime restored", "replaced, mtime restored"])
def test_a_file_modified_after_it_was_remembered_is_refused(bundle, how):
    manifest.read_manifest(bundle)           # checked and remembered
    data = next((bundle / "target").glob("*.data"))
    before = os.stat(data)
    blob = bytearray(data.read_bytes())
    blob[100] ^= 0xFF
    if how.startswith("bytes"):
        with open(data, "r+b") as fh:        # same file, same size
            fh.write(blob)
    else:
        other = data.with_name("other")
        other.write_bytes(bytes(blob))
        os.replace(other, data)
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(data).st_mtime_ns == before.st_mtime_ns
    with pytest.raises(BundleError, match=r"target/model\.onnx\.data was modified: sha256"):
        manifest.read_manifest(bundle)
    proc = subprocess.run([sys.executable, "-m", "ssd_runtime.cli", str(bundle), "--prompt", "x"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "target/model.onnx.data was modified: sha256" in proc.stderr


def test_a_file_changed_just_now_is_hashed_again(bundle_factory, tmp_path, counts):
    """Within RACY_S of its last change a file is not remembered: a write in the same clock
    tick as the check would leave its size and times as they were."""
    fresh = tmp_path / "fresh"
    shutil.copytree(bundle_factory("llama", "llama_cut", max_context=48), fresh)
    manifest.read_manifest(fresh)
    manifest.read_manifest(fresh)
    assert counts["hashed"] == 2 * len(manifest.read_manifest(fresh, verify=False).files)


def test_recalibrate_measures_again_and_remembers_the_new(bundle, counts):
    load(bundle)
    timed = counts["timed"]
    again = load(bundle, recalibrate=True)
    assert counts["calibrated"] == 2 and counts["timed"] == 2 * timed
    third = load(bundle)
    assert counts["calibrated"] == 2 and counts["timed"] == 2 * timed
    assert third.knowledge.cost_model() == again.knowledge.cost_model()


@pytest.mark.parametrize("damage", ["not JSON", "truncated", "malformed values", "empty"])
def test_a_corrupt_cache_is_ignored(bundle, counts, damage):
    first = load(bundle)
    entries = [p for p in cache.cache_dir().rglob("*.json")]
    assert {p.parent.name for p in entries} == {"checked", "measured"}
    for path in entries:
        text = path.read_text()
        if damage == "not JSON":
            path.write_bytes(b"\x00\xffnot json")
        elif damage == "truncated":
            path.write_text(text[:len(text) // 2])
        elif damage == "malformed values":
            data = json.loads(text)
            data.update(stat="x", sha256=None) if "stat" in data else data.update(value="x")
            path.write_text(json.dumps(data))
        else:
            path.write_text("")
    second = load(bundle)
    files = len(first.manifest.files)
    assert counts["hashed"] == 2 * files and counts["calibrated"] == 2
    assert second.generate([0, 5, 9], max_new_tokens=8, k="auto").stop_reason == "length"
    assert load(bundle).knowledge.cost_model() == second.knowledge.cost_model()     # rewritten whole


def test_an_unwritable_cache_folder_is_ignored(bundle, counts, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV, str(blocker / "cache"))    # under a file: mkdir fails
    load(bundle)
    gen = load(bundle)
    assert counts["hashed"] == 2 * len(gen.manifest.files) and counts["calibrated"] == 2
    assert gen.generate([0, 5, 9], max_new_tokens=8, k="auto").stop_reason == "length"


def test_checks_are_remembered_only_in_a_private_folder(bundle, counts):
    """A folder others may write to could hold a forged "checked" entry for a modified file."""
    manifest.read_manifest(bundle)
    (cache.cache_dir() / "checked").chmod(0o777)
    manifest.read_manifest(bundle)
    files = len(manifest.read_manifest(bundle, verify=False).files)
    assert counts["hashed"] == 2 * files


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "here"))
    assert cache.cache_dir() == tmp_path / "here"
    monkeypatch.delenv(cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "ssd"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path.home() / ".cache" / "ssd"


@pytest.mark.parametrize("flag", [[], ["--recalibrate"]])
def test_the_clis_recalibrate_switch(bundle, flag):
    """ssd-run takes the remembered calibration, or with --recalibrate measures and
    remembers a new one (ssd-bench and ssd-serve pass the switch to the same load). Threads
    are pinned: --recalibrate also times the thread counts again, and on a busy machine a
    different choice files the new calibration under another key (it did once)."""
    load(bundle, threads=1)
    entry, = [p for p in (cache.cache_dir() / "measured").glob("*.json")
              if json.loads(p.read_text())["key"]["what"] == "cost"]
    planted = json.loads(entry.read_text())
    planted["value"] = {"target_step": 1.0, "draft_step": 0.5,
                        "verify": [1.0] * len(planted["value"]["verify"]),
                        "draft_first": 0.5}
    entry.write_text(json.dumps(planted))
    proc = subprocess.run([sys.executable, "-m", "ssd_runtime.cli", str(bundle), "--prompt", "x",
                           "--max-new-tokens", "4", "--backend", "cpu", "--threads", "1", *flag],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    kept = json.loads(entry.read_text())["value"] == planted["value"]
    assert kept == (not flag)
