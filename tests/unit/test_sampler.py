"""The sampler's readings of /proc/self (files kept open) and its own CPU time."""

import os
import re
import time

import numpy as np

from memdiag.agent.sampler import MemorySampler, read_hwm, read_rss

MiB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


def _status_kib(field: str) -> int:
    """A field of /proc/self/status in bytes, read afresh (the file opened here, parsed by line)."""
    with open("/proc/self/status", encoding="ascii") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB$", f.read(), re.M)
    assert match, field
    return int(match.group(1)) * 1024


def _statm_rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * PAGE


def test_readings_from_the_kept_files_follow_the_process_as_it_grows():
    # GIVEN the readers have been used once (their files are open from now on)
    read_rss(), read_hwm()
    before = read_rss()
    # WHEN the process touches 64 MiB more
    block = np.ones(64 * MiB // 8)
    # THEN the kept files give what a fresh open gives, and the growth (a stale read would not show it)
    assert abs(read_rss() - _statm_rss()) < 4 * MiB
    assert read_rss() >= before + 60 * MiB
    assert abs(read_hwm() - _status_kib("VmHWM")) < 4 * MiB
    del block


def test_a_forked_child_reads_its_own_files_not_its_parents():
    # GIVEN the parent has read through its kept files
    read_rss(), read_hwm()
    parent_hwm = read_hwm()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: grow well past the parent's peak, then report both readings
        try:
            os.close(read_end)
            block = np.ones((parent_hwm + 128 * MiB) // 8)
            os.write(write_end, f"{read_hwm()} {_status_kib('VmHWM')} {int(block[0])}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        mine, fresh, _ = map(int, f.read().split())
    os.waitpid(pid, 0)
    # THEN the child's reader gave the child's own peak (its parent's file would say less)
    assert abs(mine - fresh) < 4 * MiB and mine > parent_hwm + 100 * MiB


def test_the_sampler_reports_its_threads_cpu_time_when_it_stops():
    sampler = MemorySampler(0.002)
    assert sampler.cpu_s is None
    wall = time.monotonic()
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    wall = time.monotonic() - wall
    # a thread that woke about 150 times used some CPU, and less than the time it ran
    assert sampler.cpu_s is not None and 0 < sampler.cpu_s < wall
    assert not sampler._thread.is_alive()


def test_samples_of_marks_join_the_series_in_time_order_where_rss_changed(monkeypatch):
    # GIVEN a sampler whose step began at `since`, with two samples of its own around the time `mark`
    sampler = MemorySampler(1.0)  # not started: only the samples taken here
    sampler.restart_peak()
    since = time.time()
    sampler.sample()
    time.sleep(0.002)
    mark = time.time()
    time.sleep(0.002)
    sampler.sample()
    # WHEN native marks read late give their RSS: one from before the step, one at `mark`, one equal to
    # it just after, one that differs again
    sampler.add_marks([since - 1.0, mark, mark + 1e-4, mark + 2e-4], [7, 9, 9, 7])
    peak, times, rss = sampler.take_step()
    # THEN the step's series holds the two that change RSS, between the samples around them, in order
    assert times == sorted(times) and len(times) == 5
    assert times[1:3] == [mark, mark + 2e-4] and rss[1:3] == [9 * PAGE, 7 * PAGE]
    assert peak == max(rss)
    # AND a mark older than the step just taken belongs to no open step
    sampler.add_marks([mark], [11])
    assert 11 * PAGE not in sampler.take_step()[2]


def test_a_live_mark_is_a_sample_only_where_rss_changed(monkeypatch):
    import memdiag.agent.sampler as sampler_module

    readings = iter([100 * PAGE, 100 * PAGE, 200 * PAGE, 200 * PAGE])
    monkeypatch.setattr(sampler_module, "read_rss", lambda: next(readings))
    sampler = MemorySampler(1.0)
    sampler.sample()  # 100 pages
    sampler.mark_now()  # the same: nothing kept
    sampler.mark_now()  # 200 pages: kept
    _, times, rss = sampler.take_step()  # its own sample: 200 pages
    assert rss == [100 * PAGE, 200 * PAGE, 200 * PAGE] and times == sorted(times)


def test_steps_cut_late_from_the_native_timers_samples_take_no_reading_of_their_own():
    # GIVEN a sampler whose samples come from a native timer (stood in for here): one a second, t = 1..10
    class Timer:
        def __init__(self) -> None:
            self.pending = ([float(t) for t in range(1, 11)], [100 + t for t in range(1, 11)])

        def timer_start(self, interval_s: float) -> bool:
            return True

        def timer_read(self) -> tuple[list[float], list[int]]:
            pending, self.pending = self.pending, ([], [])
            return pending

    sampler = MemorySampler(0.02)  # not started
    assert sampler.use_native_timer(Timer(), 1.0)
    # WHEN a drain ends two steps at past times (3.5 and 6.5), then the current one ends now
    first = sampler.take_step(until=3.5)
    second = sampler.take_step(until=6.5)
    peak, times, rss = sampler.take_step()
    # THEN each step has the timer's samples up to its end, and only the step ended now reads RSS now:
    # once, not once per step the drain ended
    assert first[1] == [1.0, 2.0, 3.0] and first[0] == 103 * PAGE
    assert second[1] == [4.0, 5.0, 6.0] and second[0] == 106 * PAGE
    assert times[:4] == [7.0, 8.0, 9.0, 10.0] and len(times) == 5 and times[4] > 10.0
