"""How much of the CPU route runs on one thread: per layer of the basic network (inference forward, kernel maps
built inside), the time the worker threads sit idle, and what that leaves for a many-core machine.

    OMP_WAIT_POLICY=PASSIVE python tools/serial_time.py --data scan.npz --threads 2

A worker of a passive OpenMP pool sleeps instead of spinning between parallel regions, so its CPU time (read
from /proc, Linux only) is the work it did. Per layer, wall time minus a worker's average CPU time is the time
only the calling thread ran: serial code, Python, and the tail of each parallel region. For the whole forward,
the serial time S is the idle thread time, threads x wall - CPU time, over threads - 1: it also counts the
calling thread waiting for a worker's tail. With the rest of the CPU time P spread over the threads, N threads
take about S + P / N (Amdahl's law), the projection printed for 16 and 64 threads. The threads share this
machine's memory bandwidth, so the projection is a ceiling, not a forecast.
"""
import argparse
import os
import time

import torch

import spconv.pytorch as sp
from spconv.benchmark.network import build_basic_net
from spconv.benchmark.scenes import load_voxels_npz


def thread_cpu_seconds():
    """{thread id: user + system CPU seconds} of this process (clock ticks: sum over many runs)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


class IdleClock:
    """Per child module of net: wall time and the workers' CPU time, summed over calls."""

    def __init__(self, net):
        self.main = os.getpid()
        self.wall = [0.0] * len(net)
        self.worker_cpu = [0.0] * len(net)
        self._mark = None
        for i, m in enumerate(net):
            m.register_forward_pre_hook(lambda mod, inp: self._start())
            m.register_forward_hook(lambda mod, inp, out, i=i: self._stop(i))

    def _workers(self):
        return sum(v for t, v in thread_cpu_seconds().items() if t != self.main)

    def _start(self):
        self._mark = (time.perf_counter(), self._workers())

    def _stop(self, i):
        t0, c0 = self._mark
        self.wall[i] += time.perf_counter() - t0
        self.worker_cpu[i] += self._workers() - c0

    def reset(self):
        self.wall = [0.0] * len(self.wall)
        self.worker_cpu = [0.0] * len(self.worker_cpu)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="voxelized scan (features, indices, spatial_shape)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    if os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        print("note: OMP_WAIT_POLICY is not PASSIVE: spinning workers count as busy, so the idle time reads low")
    torch.set_num_threads(args.threads)
    feats, idx, shape = load_voxels_npz(args.data)[:3]
    feats, idx = torch.as_tensor(feats), torch.as_tensor(idx)
    torch.manual_seed(0)
    net = build_basic_net(sp, feats.shape[1]).float()
    clock = IdleClock(net)

    def forward():
        with torch.no_grad():
            return net(sp.SparseConvTensor(feats, idx, list(shape), 1))

    for _ in range(2):
        forward()
    clock.reset()
    cpu0 = sum(thread_cpu_seconds().values())
    t0 = time.perf_counter()
    for _ in range(args.iters):
        forward()
    wall = (time.perf_counter() - t0) / args.iters * 1000
    cpu = (sum(thread_cpu_seconds().values()) - cpu0) / args.iters * 1000
    workers = max(args.threads - 1, 1)
    print(f"basic network forward, {args.threads} threads, {args.iters} runs: {wall:.1f} ms per forward")
    print(f"{'layer':24s} {'wall ms':>8s} {'idle ms':>8s} {'idle':>5s}")
    idle_sum = 0.0
    for i, m in enumerate(net):
        w = clock.wall[i] / args.iters * 1000
        idle = max(w - clock.worker_cpu[i] / workers / args.iters * 1000, 0.0)
        idle_sum += idle
        print(f"{i:2d} {type(m).__name__:21s} {w:8.2f} {idle:8.2f} {100 * idle / max(w, 1e-9):4.0f}%")
    serial = wall - (cpu - wall) / workers if args.threads > 1 else wall
    print(f"serial time (idle thread time over threads - 1), whole forward: {serial:.1f} ms "
          f"({100 * serial / wall:.1f}%); the layers' worker idle {idle_sum:.1f} ms; CPU time {cpu:.1f} ms")
    one = cpu  # one thread would do all the CPU work: serial + parallel
    for n in (16, 64):
        t = serial + (cpu - serial) / n
        print(f"Amdahl at {n} threads: {t:.1f} ms per forward, {one / t:.1f}x one thread "
              f"(serial {100 * serial / one:.1f}% of one thread's time)")


if __name__ == "__main__":
    main()
