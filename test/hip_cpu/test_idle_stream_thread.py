"""The HIP CPU runtime's stream thread sleeps while no kernel comes (csrc/hip/hip_cpu_idle.h): a process that has
run the GPU code on the CPU does not keep a core busy afterwards (a test worker would slow every later test)."""
import time

import pytest
import torch

pytestmark = pytest.mark.hip_cpu


def test_stream_thread_sleeps_when_idle(hip_cpu):
    idx = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 2]], dtype=torch.int32)
    hip_cpu.get_indice_pairs(idx, 1, [4] * 3, [4] * 3, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)  # launches
    start = time.process_time()
    time.sleep(1.0)
    used = time.process_time() - start  # every thread of this process; a polling thread that never sleeps: ~1 s
    assert used < 0.3, "the process used %.2f s of CPU time while idle for 1 s" % used
