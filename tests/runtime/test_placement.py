"""The CPU thread placement (backends/placement.py, docs/design.md §9 and §8.1): one timed
beside a busy process is not kept for good; a later load times it again and keeps what the
machine as it is then runs best; and when a remembered placement is trusted or timed again."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from ssd_runtime import Generator, cache
from ssd_runtime.backends import cpu_session
from ssd_runtime.backends.placement import BUSY_CORES, RECHECKS, Placement, recheck
from ssd_runtime.machine import Busy, cpu_cores

# A process that keeps one core busy, for 60 s at most should the test die before its finally
SPIN = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"
# How much slower than the best candidate the chosen threads may be on a shared machine. The
# timings behind the two sides are taken at different moments on a CI runner or a shared
# 2-core machine (load average 3-5 here), so a tight bound would fail at random; the choice
# that issue 47 kept after a busy first load ran at 0.58x of the best (1.7x the time).
SLOWER = 1.5


@pytest.fixture
def bundle(bundle_factory):
    return bundle_factory("llama", "llama_cut", max_context=48)


def test_a_placement_timed_beside_a_busy_process_is_timed_again(bundle, tmp_path, monkeypatch):
    """A first load beside a process spinning on one core is remembered as provisional; the
    next load, with the process stopped, times again instead of trusting it (what failed in
    issue 47: the busy moment's 1:1 was kept for good), and its choice is within SLOWER of the
    best threads timed here and now for each model."""
    if cpu_cores() < 2:
        pytest.skip("one core: there is no placement to choose")
    probe = Busy()
    time.sleep(0.05)
    if probe.cores() is None:
        pytest.skip("no /proc/stat: how busy the machine is cannot be read here")
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.3)                         # started and spinning
        first = Generator.load(bundle, backend="cpu").placement
    finally:
        spinner.kill()
        spinner.wait()
    assert first.source == "measured" and first.provisional, first
    assert first.busy >= BUSY_CORES
    second = Generator.load(bundle, backend="cpu")
    assert second.placement.source == "measured" and second.placement.timings == 2, \
        second.placement
    for name, chosen in (("target", second.target.threads), ("draft", second.draft.threads)):
        times = _best_times(bundle, second.manifest, name)
        assert times[chosen] <= SLOWER * min(times.values()), (name, chosen, times)
    third = Generator.load(bundle, backend="cpu").placement
    # quiet when timed: trusted; still busy (a shared runner): timed again, RECHECKS times
    assert third.source == ("measured" if second.placement.provisional else "remembered")
    assert (third.target, third.draft) == (second.target.threads, second.draft.threads) \
        or third.source == "measured"


def test_when_a_remembered_placement_is_timed_again():
    """Timed on a quiet machine: trusted. On a busy one: timed again at the next RECHECKS
    loads, then only once the machine is BUSY_CORES quieter than it was."""
    quiet = Placement(2, 1, "remembered", busy=0.1, timings=1)
    assert not recheck(quiet, None) and not recheck(quiet, 0.0)
    unknown = Placement(2, 1, "remembered", busy=None, timings=1)   # no /proc/stat
    assert not recheck(unknown, None)
    busy = Placement(1, 1, "remembered", busy=1.0, timings=1)
    assert recheck(busy, None) and recheck(busy, 1.5)
    settled = Placement(1, 1, "remembered", busy=1.0, timings=RECHECKS + 1)
    assert not recheck(settled, None) and not recheck(settled, 0.9)
    assert recheck(settled, 1.0 - BUSY_CORES)


def test_a_given_placement_is_said_to_be_given(bundle, tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    gen = Generator.load(bundle, backend="cpu", threads=(2, 1))
    assert gen.placement == Placement(2, 1, "given")
    assert gen.placement.describe() == "2:1 (given)"
    assert not list((tmp_path / "cache").rglob("measured/*.json"))       # nothing remembered


def _best_times(bundle, manifest, name: str, rounds: int = 30) -> dict[int, float]:
    """Seconds of the passes the loop runs (the target: a token and a verification; the draft:
    a token), at 1 thread and at every core, interleaved; the minimum over rounds, the time
    least touched by whatever else runs on the machine."""
    sessions = {n: cpu_session(name, bundle, manifest, threads=n) for n in (1, cpu_cores())}
    lengths = (1, manifest.max_draft + 1) if name == "target" else (1,)
    past = 16
    for s in sessions.values():
        s.prefill(np.zeros(past, np.int64))
    times: dict[int, list[float]] = {n: [] for n in sessions}
    for r in range(rounds):
        for n in (sorted(sessions) if r % 2 == 0 else sorted(sessions, reverse=True)):
            t0 = time.perf_counter()
            for length in lengths:
                sessions[n].forward(np.zeros(length, np.int64), past)
            times[n].append(time.perf_counter() - t0)
    return {n: min(t) for n, t in times.items()}
