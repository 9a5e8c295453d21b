"""What a training step frees goes back to the system (ssd_distill/memory.py, docs/distill.md
§5 "Memory"): glibc keeps freed blocks below a live one for reuse, and a step's tensors, shaped
by each batch, left an hour's head training at 9.6 GiB."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ssd_distill import memory

FRAGMENTS = """
import numpy as np
from ssd_distill.memory import give_back_freed

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

big = np.ones(16 << 20, np.uint8)
del big                      # freeing a mapped block raises glibc's threshold: the heap next
blocks = [np.ones((4 << 20) + 4096 * i, np.uint8) for i in range(100)]   # ~430 MB of sizes
pin = np.ones(200_000, np.uint8)     # a live block above them, as a step's survivors
del blocks
held = rss_mb()
give_back_freed()
print(held, rss_mb())
"""


@pytest.mark.skipif(memory._TRIM is None or sys.platform != "linux",
                    reason="glibc's malloc_trim (Linux)")
def test_the_heap_a_step_freed_goes_back_to_the_system():
    out = subprocess.run([sys.executable, "-c", FRAGMENTS], capture_output=True, text=True,
                         check=True).stdout.split()
    held, after = float(out[0]), float(out[1])
    assert held > 350                  # glibc kept the freed blocks
    assert after < held - 300, (held, after)
