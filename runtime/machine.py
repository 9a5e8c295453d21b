"""What this machine is, as the runtime's timings depend on it: the cores this process may
use (thread placement, backends/__init__.py) and the CPU's model (what a remembered timing
is keyed by, cache.py)."""
from __future__ import annotations

import os
import platform


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
