"""The doctor's table: check names and statuses whole; each finding, with how to fix it under it, wrapped
at spaces in one column (two prose columns side by side would leave each too narrow for a module name
or a command)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from memdiag.doctor import Check
from memdiag.report._fit import Column, FitTable

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def checks_table(checks: list[Check]) -> FitTable:
    table = FitTable([Column("check", justify="left", key=True), Column("status", justify="left"),
                      Column("finding (how to fix)", kind="prose", justify="left")],
                     title="memdiag doctor")
    for c in checks:
        finding = Text(c.finding)
        if c.fix:
            finding.append(f"\nfix: {c.fix}", style="bold")
        table.add_row(c.name, Text(c.status, style=_STYLE[c.status]), finding)
    return table


def print_checks(checks: list[Check], console: Console | None = None) -> None:
    (console or Console()).print(checks_table(checks))
