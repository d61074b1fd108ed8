"""The HIP CPU runtime's stream thread sleeps while no kernel comes (csrc/hip/hip_cpu_idle.h): a process that has
run the GPU code on the CPU does not keep a core busy afterwards (a test worker would slow every later test)."""
import subprocess
import sys

import pytest

from conftest import hip_cpu_library, hip_cpu_library_path

pytestmark = pytest.mark.hip_cpu

# A fresh process: in a test worker, other threads (torch's OpenMP pool after a parallel op) may still be spinning.
PROBE = r"""
import sys, time, torch
torch.ops.load_library(sys.argv[1])
ops = getattr(torch.ops, sys.argv[2])
idx = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 2]], dtype=torch.int32)
ops.get_indice_pairs(idx, 1, [4] * 3, [4] * 3, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)  # launches
time.sleep(0.2)
start = time.process_time()
time.sleep(1.0)
print(time.process_time() - start)  # every thread; polling without a sleep: ~1 s, with the backoff 0.1-0.3 s
"""


def test_stream_thread_sleeps_when_idle():
    ops = hip_cpu_library("simt")
    out = subprocess.run([sys.executable, "-c", PROBE, hip_cpu_library_path("simt"), ops.name],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    used = float(out.stdout.split()[-1])
    assert used < 0.5, "the process used %.2f s of CPU time while idle for 1 s" % used
