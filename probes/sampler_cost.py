"""What memdiag's sampling thread costs a rank in CPU, and what its per-step high-water-mark work costs.

Each rank of a memdiag run has one sampling thread that wakes every ``interval`` (5 ms by default),
reads the rank's RSS and drains the native marks. On a small virtual machine a thread's wake alone
costs tens of microseconds of CPU, so this is paid 200 times a second, by every rank, while the
step's own threads want the same cores. This probe measures, in one process that has imported
TensorFlow (as a rank has):

    wake only    a thread that only sleeps the interval and wakes (the floor for any sampler in Python)
    event wake   a thread that only waits on an event for the interval (how the loop used to wait)
    old sampler  the loop as memdiag had it before: the stop event's ``wait(interval)``, and
                 /proc/self/statm opened, read and closed at every sample
    sampler      memdiag's MemorySampler as the agent runs it (no marks to drain), its thread's CPU
                 time from the sampler itself (``cpu_s``)

and, per step, the high-water-mark work a step's start and end do (``HighWaterMark.start`` and
``peak``), against the same with every /proc file opened each time, and a Python-path mark's RSS
sample at a collective's edge (``mark_now``) against reading RSS alone. Printed: CPU per wake, the
share of one core, and per-step microseconds. Variants alternate, ``--repeats`` times::

    .venv/bin/python probes/sampler_cost.py [--interval-ms 5] [--seconds 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def _old_read_rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


def _old_read_hwm() -> int:
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _old_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _thread_cpu(loop: object, seconds: float) -> tuple[float, int]:
    """Run ``loop(stop, counter)`` on a thread for ``seconds``; its CPU time and wake count."""
    stop = threading.Event()
    out: dict[str, float] = {}
    wakes = [0]

    def body() -> None:
        loop(stop, wakes)  # type: ignore[operator]
        out["cpu"] = time.thread_time()

    thread = threading.Thread(target=body)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return out["cpu"], wakes[0]


def wake_only(interval: float, seconds: float) -> tuple[float, int]:
    def loop(stop: threading.Event, wakes: list[int]) -> None:
        while not stop.is_set():
            time.sleep(interval)
            wakes[0] += 1
    return _thread_cpu(loop, seconds)


def event_wake(interval: float, seconds: float) -> tuple[float, int]:
    def loop(stop: threading.Event, wakes: list[int]) -> None:
        while not stop.wait(interval):
            wakes[0] += 1
    return _thread_cpu(loop, seconds)


def old_sampler(interval: float, seconds: float) -> tuple[float, int]:
    lock = threading.Lock()
    times: list[float] = []
    rss: list[int] = []

    def loop(stop: threading.Event, wakes: list[int]) -> None:
        while not stop.wait(interval):
            value = _old_read_rss()
            with lock:
                times.append(time.time())
                rss.append(value)
            wakes[0] += 1
    return _thread_cpu(loop, seconds)


def sampler(interval: float, seconds: float) -> tuple[float, int]:
    from memdiag.agent.sampler import MemorySampler

    wakes = [0]
    s = MemorySampler(interval)
    s.on_sample = lambda rss: wakes.__setitem__(0, wakes[0] + 1)
    s.start()
    time.sleep(seconds)
    s.stop()
    return float(s.cpu_s or 0.0), wakes[0]


def step_marks(calls: int) -> tuple[float, float]:
    """Microseconds of CPU for one step's high-water-mark work: memdiag's, and with every file opened."""
    from memdiag.agent.sampler import HighWaterMark

    mark = HighWaterMark()
    t = time.thread_time()
    for _ in range(calls):
        mark.start()
        mark.peak()
    new = (time.thread_time() - t) / calls * 1e6
    t = time.thread_time()
    for _ in range(calls):
        _old_read_hwm()  # start(): the run's peak before the reset
        _old_reset()
        _old_read_hwm()  # start(): the mark after the reset
        _old_read_hwm()  # end of step: peak()
        _old_read_hwm()  # end of step: the run's peak again
    old = (time.thread_time() - t) / calls * 1e6
    return new, old


def edge_samples(calls: int) -> tuple[float, float]:
    """Microseconds of CPU for one RSS sample at a collective's edge made through Python
    (``MemorySampler.mark_now``, two per collective), and for reading RSS alone."""
    from memdiag.agent.sampler import MemorySampler, read_rss

    sampler = MemorySampler()
    t = time.thread_time()
    for _ in range(calls):
        sampler.mark_now()
    mark = (time.thread_time() - t) / calls * 1e6
    t = time.thread_time()
    for _ in range(calls):
        read_rss()
    read = (time.thread_time() - t) / calls * 1e6
    return mark, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: F401 - a rank's process has TensorFlow loaded

    interval = args.interval_ms / 1000
    variants = {"wake only": wake_only, "event wake": event_wake, "old sampler": old_sampler, "sampler": sampler}
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, run in variants.items():
            cpu, wakes = run(interval, args.seconds)
            results[name].append((cpu, wakes))
            print(f"repeat {repeat + 1} {name:12s} cpu {cpu * 1e3:7.1f} ms  wakes {wakes:5d}  "
                  f"{cpu / max(wakes, 1) * 1e6:6.1f} us a wake", flush=True)
    load = os.getloadavg()
    print(f"\ninterval {args.interval_ms:g} ms, {args.seconds:g} s a run, {args.repeats} repeats, {os.cpu_count()} cores, "
          f"load average {load[0]:.1f}")
    print(f"{'variant':12s} {'us a wake':>10s} {'share of a core':>16s} {'vs old':>7s}")
    per_wake = {name: statistics.median(c / max(w, 1) for c, w in rows) * 1e6 for name, rows in results.items()}
    for name, rows in results.items():
        share = statistics.median(c for c, _ in rows) / args.seconds * 100
        print(f"{name:12s} {per_wake[name]:10.1f} {share:15.2f}% {per_wake[name] / per_wake['old sampler']:7.2f}")
    new, old = zip(*(step_marks(2000) for _ in range(args.repeats)))
    print(f"\na step's high-water-mark work (start + peak): {statistics.median(new):.1f} us; "
          f"with every /proc file opened each time: {statistics.median(old):.1f} us "
          f"(ratio {statistics.median(new) / statistics.median(old):.2f})")
    mark, read = zip(*(edge_samples(20000) for _ in range(args.repeats)))
    print(f"a Python-path mark's sample (mark_now): {min(mark):.2f}-{max(mark):.2f} us, "
          f"{2 * statistics.median(mark):.2f} us per collective (two edges); reading RSS alone: "
          f"{min(read):.2f}-{max(read):.2f} us")


if __name__ == "__main__":
    main()
