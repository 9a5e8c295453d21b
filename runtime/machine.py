"""What this machine is, as the runtime's timings depend on it: the cores this process may
use (thread placement, backends/placement.py), the CPU's model (what a remembered timing
is keyed by, cache.py), and how busy other processes keep those cores (`Busy`: whether a
timing was made on a busy machine)."""
from __future__ import annotations

import os
import platform
import time


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform says."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("model name", "Model", "CPU part")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class Busy:
    """How many of this process's cores other processes kept busy from its creation to
    `cores()`: the busy time /proc/stat counts on those CPUs less this process's own CPU time,
    over the wall time (e.g. 1.0: one core's worth). Linux only; `cores()` is None elsewhere,
    or where /proc/stat cannot be read. Resolution: a clock tick (10 ms) per CPU, so a window
    of 0.2 s on 2 cores tells busy cores to about 0.1."""

    def __init__(self) -> None:
        self.start = _sample()

    def cores(self) -> float | None:
        end = _sample()
        if self.start is None or end is None:
            return None
        (busy0, own0, wall0), (busy1, own1, wall1) = self.start, end
        if wall1 <= wall0:
            return None
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall1 - wall0)


def _sample() -> tuple[float, float, float] | None:
    """(seconds the CPUs this process may use were busy since boot, this process's CPU
    seconds, the wall clock), or None where /proc/stat is not there."""
    try:
        cpus = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        tick = os.sysconf("SC_CLK_TCK")
        busy = 0
        with open("/proc/stat") as fh:
            for line in fh:
                name, *fields = line.split()
                if name in cpus:   # user nice system idle iowait irq softirq steal ...
                    values = [int(v) for v in fields[:8]]
                    busy += sum(values) - values[3] - values[4]
    except (AttributeError, OSError, ValueError):
        return None
    return busy / tick, time.process_time(), time.monotonic()
