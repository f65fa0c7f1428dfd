"""Steady state: the last steps of a rank, where its per-step peak has stopped moving.

The first steps of a run are not typical: step 0 traces the graph and builds TensorFlow's caches, and
the allocator keeps growing its arenas for a few steps. The rule (:func:`steady_start`): the steady
window is the longest run of training steps at the end, at least ``STEADY_MIN_STEPS`` (3) long, that

- lies in one band: its largest peak is at most ``STEADY_TOLERANCE`` (1%) above its smallest, and
- has no upward trend: the least-squares slope of its peaks, times the number of training steps in the
  run, is at most ``STEADY_TOLERANCE`` of its smallest peak (at the window's rate, the whole run would
  not have grown by more than the tolerance).

Its figures are the largest over the window. So a series that grows at a constant rate is steady only
if it grew by less than the tolerance over the whole run, however its steps pair up; a late jump, or an
oscillation wider than the tolerance, leaves no window. Three steps, not two: two peaks give one
difference, which a step of a growing series can match by chance (1000, 1005, 1200, ..., 1800 agreed
within 1% at its first two); three show whether the level holds. What the rule cannot see is a rise
within the tolerance over the run (about 10 MiB at 1 GiB).

With ``TF_ENABLE_ONEDNN_OPTS=0`` (as ``make demo`` runs) the tiny preset's peaks hold a level well
within the tolerance, while the small preset's swing from step to step by several times it (measured:
docs/notes/code-figures.md#steady-state-tolerance): such a rank is not steady however long it runs, and
1% is kept, so that the report says so instead of calling a swing a level. The run-to-run spread
(docs/explanation/measurement.md#noise) is measured by ``--repeats``, not here. A run
whose peaks leave no window is reported as not steady, with figures from its last ``STEADY_MIN_STEPS``
steps (the largest of them). A script's last step (``tail`` in its record) also holds what the script
did after its loop, so it is left out of the steady figures and reported apart (``tail_peak_rss_bytes``).

Which phase set the peak: allocators keep what they were given, so RSS hardly falls within a run and
the steady peak is the level the run was pushed to. The compute peak is RSS when the first gradient
reduction started (building, tracing, forward and backward needed that much with no collective); every
rise after it is counted in the phase it happened in (inside a collective window, or in compute). The
collectives set the peak when they pushed RSS more than 1% above the compute peak and raised it more
than compute did afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memdiag.format.layout import in_window
from memdiag.format.records import MemRecord, StepRecord
from memdiag.format.results import PhaseFigures, SteadyFigures

# How far a steady window's peaks may lie apart, and its trend carry the run (module docstring).
STEADY_TOLERANCE = 0.01
STEADY_MIN_STEPS = 3  # two peaks show one difference, three whether the level holds
REGIME_TOLERANCE = 0.01
_AGGREGATES = ("t_first", "rss_first", "t_last", "rss_last", "rss_max")


def steady_start(peaks: Sequence[float]) -> tuple[int, bool]:
    """(index of the first step of the steady window, whether there is one); without one, the index of
    the first of the last ``STEADY_MIN_STEPS`` steps. The module's docstring states the rule."""
    n = len(peaks)
    for start in range(n - STEADY_MIN_STEPS + 1):  # the longest window first
        if _steady_window(peaks[start:], n):
            return start, True
    return max(0, n - STEADY_MIN_STEPS), False


def _steady_window(window: Sequence[float], run_steps: int) -> bool:
    level = min(window)
    if max(window) - level > STEADY_TOLERANCE * level:
        return False
    return least_squares_slope(window) * run_steps <= STEADY_TOLERANCE * level


def least_squares_slope(values: Sequence[float]) -> float:
    """The slope of the least-squares line through ``values`` at steps 0, 1, ... (per step)."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    spread = sum((x - mean_x) ** 2 for x in range(n))
    return sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / spread if spread else 0.0


def steady_figures(steps: Sequence[StepRecord], memory: Sequence[MemRecord] | None = None) -> SteadyFigures:
    """Per-rank figures over the steady steps (``steps``: training step records in order; ``memory``:
    the rank's ``mem`` records, set-up included)."""
    steps = [s for s in steps if s.get("peak_rss_bytes")]
    # A script's last step runs on to the script's end (its tail: saving, evaluating): the run's peak
    # counts it, the steady state of training leaves it out.
    tail = [s for s in steps if s.get("tail")]
    if tail and len(tail) < len(steps):
        steps = [s for s in steps if not s.get("tail")]
    figures: SteadyFigures = {
        "steady": None, "steady_from_step": None, "first_step_peak_rss_bytes": None,
        "steady_peak_rss_bytes": None, "compute_peak_rss_bytes": None, "collective_peak_rss_bytes": None,
        "collective_rise_bytes": None, "compute_rise_bytes": None, "peak_phase": None,
        "collective_live_peak_bytes": None, "collective_added_peak_bytes": None,
        "collective_live_all_peak_bytes": None, "heap_free_bytes": None,
        "tail_peak_rss_bytes": tail[-1]["peak_rss_bytes"] if tail else None}
    if not steps:
        return figures
    start, settled = steady_start([s["peak_rss_bytes"] for s in steps])
    window = steps[start:]
    steady_peak = max(s["peak_rss_bytes"] for s in window)
    lives = [s["collective_live_peak_bytes"] for s in window if s.get("collective_live_peak_bytes") is not None]
    held = max(lives) if lives else None
    adds = [s["collective_added_peak_bytes"] for s in window if s.get("collective_added_peak_bytes") is not None]
    added = max(adds) if adds else None
    alls = [s["collective_live_all_peak_bytes"] for s in window if s.get("collective_live_all_peak_bytes") is not None]
    phases = _phases(steps, window, memory or [], steady_peak)
    phases["peak_phase"] = held_phase(phases, steady_peak, added)
    return {
        "steady": settled,
        "steady_from_step": window[0]["step"],
        "first_step_peak_rss_bytes": steps[0]["peak_rss_bytes"],
        "steady_peak_rss_bytes": steady_peak,
        "collective_live_peak_bytes": held,
        "collective_added_peak_bytes": added,
        "collective_live_all_peak_bytes": max(alls) if alls else None,
        "heap_free_bytes": _heap_free_at_peak(window),
        "tail_peak_rss_bytes": figures["tail_peak_rss_bytes"],
        **phases,
    }


def _heap_free_at_peak(window: Sequence[StepRecord]) -> int | None:
    """What glibc's heaps held freed, read at the record of the steady step whose peak is the largest; where
    that step was not read (the reads keep within a budget of the steps' time: memdiag.agent.tracer), the
    last read before it in the steady window; None where none was."""
    top = max(range(len(window)), key=lambda i: window[i]["peak_rss_bytes"])
    for s in reversed(window[:top + 1]):
        if s.get("heap_free_bytes") is not None:
            return s["heap_free_bytes"]
    return None


def held_phase(phases: PhaseFigures, steady_peak: int, added: int | None) -> str | None:
    """Which phase set the peak, by what is held at it. The collectives set it when the peak stands more than
    1% above the compute peak (the RSS when the first gradient reduction started) and what they add to
    the step (``added``: the gathered outputs and quotient alive at once, modelled from the records; an
    allreduce's output replaces the gradient it reduces) is more than 1% of the rest of the peak: without
    it the peak would stand lower. Memory that grew while a collective ran is not memory a collective
    holds: inside a ``tf.function`` the reductions run while the backward pass goes on, and the backward
    pass's tensors grow RSS in the collectives' windows. Without the model (no records of outputs), the
    phase the rises fell in decides, as :func:`_phases` found it."""
    compute = phases["compute_peak_rss_bytes"]
    if added is None or compute is None or phases["peak_phase"] is None:
        return phases["peak_phase"]
    if phases["collective_peak_rss_bytes"] is None and not phases["collective_rise_bytes"]:
        return "compute"  # no gradient reduction ran in a window
    pushed = steady_peak > compute * (1 + REGIME_TOLERANCE)
    return "collectives" if pushed and added > REGIME_TOLERANCE * (steady_peak - added) else "compute"


def _phases(steps: Sequence[StepRecord], window: Sequence[StepRecord], memory: Sequence[MemRecord],
            steady_peak: int) -> PhaseFigures:
    windows: dict[int, tuple[float, float | None]] = {}
    for s in steps:
        window_start = s.get("window_start")
        if window_start:
            windows[s["step"]] = (window_start, s.get("window_end"))
    if not windows:  # no collective ran (one rank): compute set everything
        return {"compute_peak_rss_bytes": steady_peak, "collective_peak_rss_bytes": None,
                "collective_rise_bytes": 0, "compute_rise_bytes": 0, "peak_phase": "compute"}
    first_start = min(start for start, _ in windows.values())
    # In time order: every sample of the steps that kept theirs, and the aggregates of the others
    # (memdiag.format.writer: ranks keep the samples of every step until the first collective window,
    # so only steps after it are aggregates; their rises within the step are the step record's own).
    stream: list[tuple[float, int, Any, MemRecord | None]] = []
    for m in memory:
        times, rss = m.get("times"), m.get("rss")
        if isinstance(times, list) and isinstance(rss, list):
            stream.extend((t, r, m.get("step"), None) for t, r in zip(times, rss))
        elif m.get("n") and all(isinstance(m.get(k), (int, float)) for k in _AGGREGATES):
            stream.append((m["t_first"], m["rss_first"], m.get("step"), m))
    stream.sort(key=lambda e: (e[0], e[1]))
    within = {s["step"]: (s.get("collective_rise_bytes") or 0, s.get("compute_rise_bytes") or 0) for s in steps}
    before: list[int] = []
    rises = {"collectives": 0, "compute": 0}
    steady_steps = {s["step"] for s in window}
    inside_steady = []
    previous = None
    for t, r, step, aggregated in stream:
        if aggregated is not None and aggregated["t_last"] < first_start:
            before.append(aggregated["rss_max"])
            previous = aggregated["rss_last"]
            continue
        if t < first_start and aggregated is None:
            before.append(r)
            previous = r
            continue
        start, end = windows.get(step, (None, None))
        inside = in_window(t, start, end)
        if previous is not None and r > previous:
            rises["collectives" if inside else "compute"] += r - previous
        if aggregated is None:
            if inside and step in steady_steps:
                inside_steady.append(r)
            previous = r
            continue
        collectives, compute = within.get(step, (0, 0))
        rises["collectives"] += collectives
        rises["compute"] += compute
        if step in steady_steps and aggregated.get("rss_max_window") is not None:
            inside_steady.append(aggregated["rss_max_window"])
        previous = aggregated["rss_last"]
    compute_peak = max(before) if before else steps[0]["peak_rss_bytes"]
    pushed = steady_peak > compute_peak * (1 + REGIME_TOLERANCE)
    phase = "collectives" if pushed and rises["collectives"] >= rises["compute"] else "compute"
    return {"compute_peak_rss_bytes": compute_peak,
            "collective_peak_rss_bytes": max(inside_steady) if inside_steady else None,
            "collective_rise_bytes": rises["collectives"], "compute_rise_bytes": rises["compute"],
            "peak_phase": phase}
