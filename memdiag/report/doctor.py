"""The doctor's table."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from memdiag.doctor import Check

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def checks_table(checks: list[Check]) -> Table:
    table = Table(title="memdiag doctor", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("finding", overflow="fold", ratio=1)
    table.add_column("how to fix", overflow="fold", ratio=1)
    for c in checks:
        table.add_row(c.name, Text(c.status, style=_STYLE[c.status]), Text(c.finding), Text(c.fix))
    return table


def print_checks(checks: list[Check], console: Console | None = None) -> None:
    (console or Console()).print(checks_table(checks))
