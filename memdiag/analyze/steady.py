"""Steady state: from which step a rank's per-step peak has stopped rising.

The first steps of a run are not typical: step 0 traces the graph and builds TensorFlow's caches, and
the allocator keeps growing its arenas for a few steps. The rule: the steady state begins with the first
of two consecutive training steps whose peaks differ by at most 1% (of the earlier one); its figures are
the largest over that step and every later one. A run whose peaks never settle is reported as not
steady, with figures from its last two steps, so a reader knows to run more steps.
"""

from __future__ import annotations

from typing import Any

STEADY_TOLERANCE = 0.01


def steady_start(peaks: list[int | float]) -> tuple[int, bool]:
    """(index of the first steady step, whether the peaks settled at all)."""
    for k in range(1, len(peaks)):
        if abs(peaks[k] - peaks[k - 1]) <= STEADY_TOLERANCE * peaks[k - 1]:
            return k - 1, True
    return max(0, len(peaks) - 2), False


def steady_figures(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-rank figures over the steady steps (``steps``: training step records in order)."""
    steps = [s for s in steps if s.get("peak_rss_bytes")]
    if not steps:
        return {"steady": None, "steady_from_step": None, "first_step_peak_rss_bytes": None,
                "steady_peak_rss_bytes": None, "compute_peak_rss_bytes": None,
                "collective_peak_rss_bytes": None, "peak_phase": None, "collective_live_peak_bytes": None}
    start, settled = steady_start([s["peak_rss_bytes"] for s in steps])
    window = steps[start:]
    top = max(window, key=lambda s: s["peak_rss_bytes"])

    def largest(key: str) -> int | None:
        values = [s[key] for s in window if s.get(key) is not None]
        return max(values) if values else None

    return {
        "steady": settled,
        "steady_from_step": window[0]["step"],
        "first_step_peak_rss_bytes": steps[0]["peak_rss_bytes"],
        "steady_peak_rss_bytes": top["peak_rss_bytes"],
        "compute_peak_rss_bytes": largest("compute_peak_rss_bytes"),
        "collective_peak_rss_bytes": largest("collective_peak_rss_bytes"),
        "peak_phase": top.get("peak_phase"),
        "collective_live_peak_bytes": largest("collective_live_peak_bytes"),
    }
