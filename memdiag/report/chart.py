"""A compact bar chart for the terminal: peak memory against rank count, one bar per mode."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from memdiag.format.results import CompareRow
from memdiag.units import format_bytes

MODE_STYLES = {"sparse": "red", "dense": "green", "auto": "cyan"}


def peak_chart(rows: Sequence[CompareRow], width: int = 40) -> Text:
    """Bars start at the smallest peak shown, so differences of a few percent stay visible."""
    values = [r["steady_peak_rss_bytes_median"] for r in rows if r["steady_peak_rss_bytes_median"]]
    text = Text()
    if not values:
        return text
    low, high = min(values), max(values)
    floor = low - (high - low) * 0.1 if high > low else low * 0.9
    span = max(high - floor, 1)
    for row in rows:
        value = row["steady_peak_rss_bytes_median"]
        if not value:
            continue
        length = max(1, round(width * (value - floor) / span))
        text.append(f"N={row['world_size']:<4} {row['mode']:<6} ")
        text.append("█" * length, style=MODE_STYLES.get(row["mode"], ""))
        text.append(f" {format_bytes(value)}\n")
    text.append(f"(bars start at {format_bytes(floor)})", style="dim")
    return text
