"""What the device tracer (coursetools/learner/devtrace.py, `make.py trace`) costs: one small
training step (an MLP, forward, loss, backward, SGD step) outside the tracer and inside it, on the
CPU, measured with torch.utils.benchmark and interleaved (A B, B A, ...) so that a change in the
machine's load hits both alike. Prints each round, the median ratio and its spread, and the load.
Nothing here asserts on time.

    .venv/bin/python benchmarks/tracer_overhead.py [--rounds 6] [--width 256] [--batch 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils import benchmark

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from coursetools.learner.devtrace import trace_devices  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    ns = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, ns.width), nn.ReLU(), nn.Linear(ns.width, ns.width), nn.ReLU(),
                          nn.Linear(ns.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(ns.batch, 64), torch.randint(0, 10, (ns.batch,))

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def measure(fn):
        return benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median

    def in_one_tracer():
        with trace_devices():            # one tracer around the whole loop, as `make.py trace` runs
            return measure(step)

    ratios = []
    for r in range(ns.rounds):
        order = [("outside", lambda: measure(step)), ("inside", in_one_tracer)]
        if r % 2:
            order.reverse()
        times = dict((name, fn()) for name, fn in order)
        ratios.append(times["inside"] / times["outside"])
        print(f"round {r + 1}: outside {times['outside'] * 1e3:.3f} ms, inside {times['inside'] * 1e3:.3f} ms, "
              f"x{ratios[-1]:.2f}")
    print(f"inside the tracer a step takes x{statistics.median(ratios):.2f} (rounds: "
          f"{min(ratios):.2f} to {max(ratios):.2f}); batch {ns.batch}, width {ns.width}, torch {torch.__version__}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
