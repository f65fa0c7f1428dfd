"""What a Python-path mark's RSS sample costs (``MemorySampler.mark_now``), against reading RSS alone.

A mark made through Python or an eager collective call samples RSS at the collective's start and at its
end: two calls per collective. Run in one process, no TensorFlow, the sampler thread not started:

    .venv/bin/python probes/mark_now_cost.py --calls 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from memdiag.agent.sampler import MemorySampler, read_rss  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for repeat in range(1, args.repeats + 1):
        sampler = MemorySampler(0.02)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            read_rss()
        t1 = time.perf_counter()
        for _ in range(args.calls):
            sampler.mark_now()
        t2 = time.perf_counter()
        read_us, mark_us = 1e6 * (t1 - t0) / args.calls, 1e6 * (t2 - t1) / args.calls
        print(f"repeat {repeat}: read_rss {read_us:.2f} us, mark_now {mark_us:.2f} us "
              f"(ratio {mark_us / read_us:.2f}); per collective (2 marks) {2 * mark_us:.2f} us")


if __name__ == "__main__":
    main()
