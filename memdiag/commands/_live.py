"""Where the ranks of a run going on are, shown as `memdiag run` and `memdiag watch` show it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from memdiag.launch.session import RankProgress, progress_line, progress_parts

# Without a terminal (a batch job's log), a progress line at most this often, and only when it changed.
PLAIN_PROGRESS_EVERY_S = 30.0


def live_display(what: str, status: Any, console: Console) -> Callable[[list[RankProgress]], None]:
    """Where the ranks are, while the run goes on: the status of a terminal (a line per rank), updated
    at each call; elsewhere one plain line every :data:`PLAIN_PROGRESS_EVERY_S` seconds when a rank
    moved on."""
    started = time.monotonic()
    printed_at = [started]
    printed_steps: list[list[int]] = [[]]

    def show(ranks: list[RankProgress]) -> None:
        now = time.monotonic()
        if console.is_terminal:
            status.update("\n  ".join(progress_parts(what, now - started, ranks)))  # a rank a line
            return
        steps = [rank.steps for rank in ranks]
        if now - printed_at[0] >= PLAIN_PROGRESS_EVERY_S and steps != printed_steps[0]:
            console.print(progress_line(what, now - started, ranks), highlight=False, markup=False)
            printed_at[0], printed_steps[0] = now, steps

    return show
