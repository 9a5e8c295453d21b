"""What training steps free goes back to the system once the process has grown past its
ceiling (ssd_distill/memory.py HeapKeeper, docs/distill.md §5 "Memory"): glibc keeps freed
blocks below a live one for reuse, and steps' tensors, shaped by each batch, left an hour's
head training at 9.4–9.6 GiB."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ssd_distill import memory

FRAGMENTS = """
import sys
import numpy as np
from ssd_distill.memory import HeapKeeper

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

keeper = HeapKeeper(slack=int(sys.argv[1]) << 20)
keeper()                     # its ceiling: the size now and the slack
big = np.ones(16 << 20, np.uint8)
del big                      # freeing a mapped block raises glibc's threshold: the heap next
blocks = [np.ones((4 << 20) + 4096 * i, np.uint8) for i in range(100)]   # ~430 MB of sizes
pin = np.ones(200_000, np.uint8)     # a live block above them, as a step's survivors
del blocks
held = rss_mb()
keeper()
print(held, rss_mb())
"""


@pytest.mark.skipif(memory._TRIM is None or sys.platform != "linux",
                    reason="glibc's malloc_trim (Linux)")
def test_the_freed_heap_goes_back_past_the_ceiling_and_stays_below_it():
    def run(slack_mb: int) -> tuple[float, float]:
        out = subprocess.run([sys.executable, "-c", FRAGMENTS, str(slack_mb)],
                             capture_output=True, text=True, check=True).stdout.split()
        return float(out[0]), float(out[1])

    held, after = run(100)                 # ~430 MB freed: past a ceiling 100 MB up
    assert held > 350                      # glibc kept the freed blocks
    assert after < held - 300, (held, after)
    held, after = run(2000)                # below its ceiling: nothing is trimmed
    assert after > held - 50, (held, after)


def test_a_ceiling_that_live_memory_passes_moves_up(monkeypatch):
    """Memory still in use is not trimmed step after step: the ceiling moves past it."""
    sizes = iter([100, 500, 480, 500, 500])          # MB: first step, live growth, and on
    trims = []
    monkeypatch.setattr(memory, "_rss", lambda: next(sizes) << 20)
    monkeypatch.setattr(memory, "_TRIM", lambda pad: trims.append(pad))
    keeper = memory.HeapKeeper(slack=200 << 20)
    keeper()                                         # ceiling 300 MB
    keeper()                                         # 500: trimmed, 480 still there
    assert trims == [0] and keeper.ceiling == (480 + 200) << 20
    keeper()                                         # 500 < 680: no trim
    assert trims == [0]
