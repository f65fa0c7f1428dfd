"""Process memory over time, sampled on a background thread.

RSS is read from /proc/self/statm (what psutil reads, without its per-call overhead) at a fixed
interval; the kernel's high-water mark VmHWM (/proc/self/status) catches peaks between samples. Where
the kernel lets a process reset its mark (writing 5 to /proc/self/clear_refs, Linux 4.0 on), the mark
is reset at the start of every step (:class:`HighWaterMark`), so each step's peak is exact.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from memdiag.format.layout import decimate

_PAGE = os.sysconf("SC_PAGE_SIZE")


class _ProcFile:
    """A file of /proc/self kept open. Read with ``pread`` at offset 0, the kernel writes it afresh each
    time, without the path lookup, open and close that cost more than the read itself (a step's
    high-water-mark work took several times the CPU with the files opened each time; measured with
    ``probes/sampler_cost.py``: docs/explanation/overhead.md#the-sampling-thread). Opened on first use,
    and again in a forked child, whose inherited descriptor names its parent."""

    _all: list[_ProcFile] = []

    def __init__(self, name: str, flags: int = os.O_RDONLY) -> None:
        self.path = f"/proc/self/{name}"
        self._flags = flags
        self._fd = -1
        _ProcFile._all.append(self)

    def fd(self) -> int:
        if self._fd < 0:  # two threads opening it at once leave one descriptor unused, nothing worse
            self._fd = os.open(self.path, self._flags | os.O_CLOEXEC)
        return self._fd

    def _forget(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1


def _forget_proc_files() -> None:
    for proc_file in _ProcFile._all:
        proc_file._forget()


os.register_at_fork(after_in_child=_forget_proc_files)
_STATM = _ProcFile("statm")
_STATUS = _ProcFile("status")
_CLEAR_REFS = _ProcFile("clear_refs", os.O_WRONLY)


def read_rss() -> int:
    return int(os.pread(_STATM.fd(), 256, 0).split()[1]) * _PAGE


def read_hwm() -> int:
    """VmHWM in bytes: the peak resident set size since the process started."""
    status = os.pread(_STATUS.fd(), 16384, 0)
    at = status.find(b"VmHWM:")
    return int(status[at + 6:status.index(b"kB", at)]) * 1024 if at >= 0 else 0


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (/proc/self/clear_refs, 5); False where the kernel refuses."""
    try:
        os.write(_CLEAR_REFS.fd(), b"5")
        return True
    except OSError:
        return False


class HighWaterMark:
    """The kernel's high-water mark made per window (a step): :meth:`start` resets it, so
    :meth:`peak` is the exact peak RSS since the window began, however briefly it was reached. The
    whole run's peak is kept across resets (:meth:`run_peak`). Where the reset is refused
    (``resettable`` false) the mark is the process's, and a window's peak is exact only when the mark
    rose during it."""

    def __init__(self) -> None:
        self._run = read_hwm()
        self.resettable = reset_hwm()
        self._at_start = read_hwm()

    def start(self) -> None:
        self._run = max(self._run, read_hwm())
        if self.resettable:
            reset_hwm()  # the mark is now the current RSS, which _at_start need not know: peak() is exact
        else:
            self._at_start = read_hwm()

    def peak(self) -> int | None:
        """The exact peak since :meth:`start`, or None when it cannot be known (the process's mark did
        not rise and cannot be reset)."""
        hwm = read_hwm()
        self._run = max(self._run, hwm)
        return hwm if self.resettable or hwm > self._at_start else None

    def run_peak(self, read: bool = True) -> int:
        """The peak RSS since the process started (VmHWM as if never reset); ``read`` false: as of the
        last reading (right after :meth:`peak`, the same)."""
        if read:
            self._run = max(self._run, read_hwm())
        return self._run


# With the native timer, the sampling thread wakes at least this often: to tick, and to drain the marks' ring
# early when it is half full (memdiag.agent.hooks.CollectiveHooks.drain_when_due).
TIMER_WAKE_MAX_S = 0.25

# Samples kept per step at most: past it, neighbouring pairs are merged into their larger value, so
# memory stays bounded however long a step (or a script without steps) runs, and no peak is lost.
MAX_SAMPLES_PER_STEP = 4096


class MemorySampler:
    """Samples RSS every ``interval_s``; keeps the series and the running peak of the current step.

    ``on_sample(rss)`` is called from the sampling thread after every sample (memory limits), and
    ``on_tick()`` about once a second (flushing records of a step that takes long or hangs).

    With a native timer (:meth:`use_native_timer`, under ``memdiag run --record-every``), the samples
    are taken every ``interval_s`` by a thread of the marks library (no Python, no GIL), and this
    thread wakes only every ``wake_s`` to drain (``before_sample``, which pulls the timer's samples into
    the series first: :meth:`pull_timer`) and tick.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.on_sample: Callable[[int], None] | None = None
        self.before_sample: Callable[[], None] | None = None  # native marks drained (memdiag.nativemarks)
        self.on_tick: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._times: list[float] = []
        self._rss: list[int] = []
        self._step_peak = 0
        self._since = 0.0  # marks read late that are earlier than this belong to a step already taken
        self._stop = threading.Event()
        # CPU time the sampling thread used (sampling, draining native marks, ending steps, flushing
        # records): memdiag's own cost, set when the thread ends (None before, or if it did not end)
        self.cpu_s: float | None = None
        self._timer: Any = None  # the native timer's owner (memdiag.nativemarks.Marks), once in use
        self.wake_s = interval_s  # how often this thread wakes: the interval, or with the timer longer
        self._thread = threading.Thread(target=self._loop, name="memdiag-sampler", daemon=True)

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def use_native_timer(self, marks: Any, wake_s: float) -> bool:
        """Leave the samples every ``interval_s`` to the native timer of ``marks`` and wake every
        ``wake_s`` (at most :data:`TIMER_WAKE_MAX_S`); False (nothing changed) where the timer cannot start,
        or where ``on_sample`` watches every sample (a memory limit's watchdog)."""
        if self.on_sample is not None or self._timer is not None or not marks.timer_start(self.interval_s):
            return False
        self._timer = marks
        self.wake_s = min(TIMER_WAKE_MAX_S, max(self.interval_s, wake_s))
        return True

    def pull_timer(self) -> None:
        """The native timer's samples since the last pull, into the series (each kept, as :meth:`sample`
        keeps one), where not earlier than the last :meth:`take_step` or :meth:`restart_peak`."""
        if self._timer is None:
            return
        times, pages = self._timer.timer_read()
        if times:
            self._add_late(times, pages, self._insert)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=max(1.0, 2 * self.wake_s))
        if self._timer is not None:
            timer_cpu = self._timer.timer_stop()
            if self.cpu_s is not None and timer_cpu is not None:
                self.cpu_s += timer_cpu  # memdiag's sampling: both threads
            self.pull_timer()
        self.sample()

    def sample(self) -> int:
        rss = read_rss()
        with self._lock:
            # timed under the lock, so the series is in time order and a sample kept after a
            # take_step() is later than every sample that call took
            now = time.time()
            self._times.append(now)
            self._rss.append(rss)
            self._step_peak = max(self._step_peak, rss)
            if len(self._rss) > MAX_SAMPLES_PER_STEP:
                self._times, self._rss = decimate(self._times, self._rss)
        return rss

    def mark_now(self) -> None:
        """A sample where the job reaches a collective's start or end (a mark made through Python, an
        eager call), kept as :meth:`_put` keeps one."""
        rss = read_rss()
        with self._lock:
            self._put(time.time(), rss)

    def add_marks(self, times: list[float], pages: list[int]) -> None:
        """Samples taken by native marks (the op reads the resident pages where the graph reaches it),
        read late, each kept as :meth:`_put` keeps one, and only if later than the last
        :meth:`take_step` or :meth:`restart_peak` (earlier ones belong to no step still open)."""
        self._add_late(times, pages, self._put)

    def _add_late(self, times: list[float], pages: list[int], put: Callable[[float, int], None]) -> None:
        """Samples read late (resident ``pages`` at ``times``) into the series by ``put``, those not
        earlier than the last :meth:`take_step` or :meth:`restart_peak`."""
        with self._lock:
            for t, resident in zip(times, pages):
                if t >= self._since:
                    put(t, resident * _PAGE)
            if len(self._rss) > MAX_SAMPLES_PER_STEP:
                self._times, self._rss = decimate(self._times, self._rss)

    def _put(self, t: float, value: int) -> None:
        """A mark's sample into the series (lock held), in time order, only where RSS differs from the
        sample before it: a sample equal to its predecessor changes none of the rises a step's phases are
        given (memdiag.agent.tracer.phase_rises)."""
        series_t = self._times
        at = len(series_t) if not series_t or t >= series_t[-1] else bisect.bisect_right(series_t, t)
        if at and self._rss[at - 1] == value:
            return
        self._insert(t, value, at)

    def _insert(self, t: float, value: int, at: int | None = None) -> None:
        """A sample into the series (lock held), in time order (``at``: its place, where known)."""
        series_t, series_rss = self._times, self._rss
        if at is None:
            at = len(series_t) if not series_t or t >= series_t[-1] else bisect.bisect_right(series_t, t)
        series_t.insert(at, t)  # at the end, the usual case: an append
        series_rss.insert(at, value)
        if value > self._step_peak:
            self._step_peak = value

    def take_step(self, until: float | None = None) -> tuple[int, list[float], list[int]]:
        """Peak RSS since the last call, and the samples taken since then (cleared). ``until``: only
        the samples up to that time, already past; the later ones stay for the next call."""
        self.pull_timer()
        # A cut at a past time with the native timer (a drain): its samples up to now are in the series, and
        # a read now would belong to no step that ends here (a drain of a second's steps would pile one read
        # a step into the step in progress); it stands in only where no sample is left after the cut.
        late = until is not None and self._timer is not None
        current = 0 if late else self.sample()
        with self._lock:
            if late:
                current = self._rss[-1] if self._rss else read_rss()
            if until is None:
                peak, times, rss = self._step_peak, self._times, self._rss
                self._times, self._rss, self._step_peak = [], [], current
                self._since = times[-1] if times else time.time()
                return peak, times, rss
            self._since = until
            cut = bisect.bisect_right(self._times, until)
            times, rss = self._times[:cut], self._rss[:cut]
            self._times, self._rss = self._times[cut:], self._rss[cut:]
            peak = max(rss, default=self._rss[0] if self._rss else current)
            self._step_peak = max(self._rss, default=current)
        return peak, times, rss

    def restart_peak(self) -> None:
        """Start the step afresh: the running peak from the current RSS, and no samples before it (what
        ran since the last :meth:`take_step` belongs to no step)."""
        current = read_rss()
        with self._lock:
            self._times, self._rss, self._step_peak = [], [], current
            self._since = time.time()

    def _loop(self) -> None:
        last_tick = time.monotonic()
        # time.sleep, not the stop event's wait(): a wake through a Condition costs more CPU than a sleep's,
        # at every wake (measured: docs/explanation/overhead.md#the-sampling-thread); stop() waits up to
        # one interval for it.
        while True:
            if self._timer is None:
                time.sleep(self.interval_s)
            elif self._stop.wait(self.wake_s):  # a few wakes a second here: stop() need not wait for one
                break
            if self._stop.is_set():
                break
            if self.before_sample is not None:
                self.before_sample()
            if self._timer is None:
                rss = self.sample()
                if self.on_sample is not None:
                    self.on_sample(rss)
            if self.on_tick is not None and time.monotonic() - last_tick >= 1.0:
                last_tick = time.monotonic()
                self.on_tick()
        self.cpu_s = time.thread_time()
