"""Tables that fit the terminal: figures whole, names shortened from the left, wide tables split.

Every terminal table memdiag draws is a :class:`FitTable`. Invariants, at any console width where
they can hold (tests render every report at 80 columns):

- A figure (bytes, a rank count, a mode, a status, a percentage, a time) is never shortened or
  wrapped: its column is exactly as wide as its widest cell or its header.
- Only a ``name`` column shrinks, and its text is shortened from the LEFT with "…", keeping the
  informative tail (``…/source_embedding/embeddings [values]``). A ``prose`` column wraps at spaces.
- When the figures alone do not fit, the table is drawn as several tables, each of whole column
  groups where possible and each repeating the ``key`` columns (N, mode, the tensor), instead of
  cutting anything.

Widths are computed here, from the width rich gives at render time (``options.max_width``), not left
to rich: rich's last resort for a table wider than the console shortens every column, figures
included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

Cell = Union[str, Text]  # (a runtime alias: Python 3.9 has no `|` between types)
Kind = Literal["figure", "name", "prose"]

ELLIPSIS = "…"
NAME_MIN_WIDTH = 16  # below this a shortened tensor name no longer says which tensor it is
PROSE_MIN_WIDTH = 16
PROSE_LONGEST_WORD = 40  # a prose column is at least as wide as its longest word, up to this
# rich's default table: one space of padding either side of a cell and one rule per column, plus
# the closing rule at the right edge.
CHROME_PER_COLUMN = 3
CHROME_EDGE = 1


@dataclass(frozen=True)
class Column:
    """One column: what it holds decides whether it may shrink."""

    header: str
    kind: Kind = "figure"
    justify: Literal["left", "right"] = "right"
    key: bool = False  # repeated in every part when the table is split
    group: int = 0  # columns of one group stay in the same part where they fit together


def shorten_left(cell: Cell, width: int) -> Cell:
    """``cell`` cut from the left to ``width`` cells, "…" marking the cut; unchanged if it fits."""
    text = cell if isinstance(cell, Text) else Text(cell)
    if text.cell_len <= width:
        return cell
    if width < 1:
        return Text("")
    start = 0
    while cell_len(text.plain[start:]) > width - 1:
        start += 1
    tail = text[start:]
    return Text(ELLIPSIS, style=text.style) + tail


def _as_text(cell: Cell) -> Text:
    return cell if isinstance(cell, Text) else Text(cell)


def _width_of(cell: Cell) -> int:
    plain = cell.plain if isinstance(cell, Text) else cell
    return max((cell_len(line) for line in plain.splitlines()), default=0)


@dataclass
class _Row:
    cells: tuple[Cell, ...]
    end_section: bool = False


@dataclass
class FitTable:
    """A rich table laid out for the console it is drawn on (see the module's invariants)."""

    columns: list[Column]
    title: str | None = None
    rows: list[_Row] = field(default_factory=list)

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(_Row(tuple(cells)))

    def add_section(self) -> None:
        """A rule under the last row added."""
        if self.rows:
            self.rows[-1].end_section = True

    # -- widths ------------------------------------------------------------------------------------

    def natural_width(self, index: int) -> int:
        """The width of the widest cell or of the header: what the column takes when nothing shrinks."""
        column = self.columns[index]
        return max([cell_len(column.header)] + [_width_of(r.cells[index]) for r in self.rows])

    def minimum_width(self, index: int) -> int:
        column = self.columns[index]
        natural = self.natural_width(index)
        if column.kind == "figure":
            return natural
        if column.kind == "name":
            return min(natural, max(NAME_MIN_WIDTH, cell_len(column.header)))
        # Wide enough for the longest word (a module name, a path) where that is reasonable, so that
        # words are wrapped whole rather than folded.
        words = [w for cell in [column.header] + [r.cells[index] for r in self.rows]
                 for w in (cell.plain if isinstance(cell, Text) else cell).split()]
        longest_word = min(PROSE_LONGEST_WORD, max((cell_len(w) for w in words), default=0))
        return min(natural, max(PROSE_MIN_WIDTH, longest_word))

    @staticmethod
    def chrome(count: int) -> int:
        return CHROME_PER_COLUMN * count + CHROME_EDGE

    def widths(self, indices: list[int], max_width: int) -> list[int] | None:
        """Column widths for ``indices`` within ``max_width``, or None when even the minimum is wider.

        Shrinkable columns (names, prose) share what the figures leave, in equal parts, none beyond
        its natural width.
        """
        natural = [self.natural_width(i) for i in indices]
        available = max_width - self.chrome(len(indices))
        if sum(natural) <= available:
            return natural
        widths = [self.minimum_width(i) for i in indices]
        spare = available - sum(widths)
        if spare < 0:
            return None
        growing = [k for k in range(len(indices)) if widths[k] < natural[k]]
        while spare > 0 and growing:
            share = max(1, spare // len(growing))
            for k in list(growing):
                step = min(share, natural[k] - widths[k], spare)
                widths[k] += step
                spare -= step
                if widths[k] == natural[k]:
                    growing.remove(k)
                if not spare:
                    break
        return widths

    def parts(self, max_width: int) -> list[tuple[list[int], list[int]]]:
        """(column indices, widths) of each table to draw: one when everything fits."""
        every = list(range(len(self.columns)))
        widths = self.widths(every, max_width)
        if widths is not None:
            return [(every, widths)]
        keys = [i for i in every if self.columns[i].key]
        groups: list[list[int]] = []
        for i in every:
            if i in keys:
                continue
            if groups and self.columns[groups[-1][-1]].group == self.columns[i].group:
                groups[-1].append(i)
            else:
                groups.append([i])

        def fits(extra: list[int]) -> bool:
            return self.widths(sorted(keys + extra), max_width) is not None

        chosen: list[list[int]] = []
        current: list[int] = []
        for group in groups:
            if fits(current + group):
                current += group
                continue
            if current:
                chosen.append(current)
                current = []
            if fits(group):
                current = list(group)
                continue
            for i in group:  # a group too wide for one part: as many of its columns as fit
                if current and not fits(current + [i]):
                    chosen.append(current)
                    current = []
                current.append(i)
        if current:
            chosen.append(current)
        result = []
        for part in chosen:
            indices = sorted(keys + part)
            # A part that cannot fit even alone is drawn at its natural width: nothing is cut by
            # this module; the console's own cropping is the last resort.
            result.append((indices, self.widths(indices, max_width)
                           or [self.natural_width(i) for i in indices]))
        return result

    # -- rendering ---------------------------------------------------------------------------------

    def _table(self, indices: list[int], widths: list[int]) -> Table:
        table = Table()
        for i, width in zip(indices, widths):
            column = self.columns[i]
            if column.kind == "prose":
                table.add_column(column.header, justify=column.justify, width=width, overflow="fold")
            else:
                # A figure's width is its widest cell, so no_wrap never cuts it; a name's cells are
                # shortened below to the width given.
                table.add_column(column.header, justify=column.justify, width=width, min_width=width,
                                 no_wrap=True)
        for row in self.rows:
            # Text, not str: rich would read "[values]" in a tensor name as markup and drop it.
            texts = [_as_text(row.cells[i]) for i in indices]
            shown: list[str | Text] = [shorten_left(cell, width) if self.columns[i].kind == "name" else cell
                                       for cell, i, width in zip(texts, indices, widths)]
            table.add_row(*shown, end_section=row.end_section)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for number, (indices, widths) in enumerate(self.parts(options.max_width)):
            if self.title is not None:
                # Above the table rather than rich's title, which wraps at the table's own width.
                title = self.title if number == 0 else f"{self.title} (continued)"
                yield Text(title, style="table.title", justify="left")
            yield self._table(indices, widths)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        every = list(range(len(self.columns)))
        natural = sum(self.natural_width(i) for i in every) + self.chrome(len(every))
        return Measurement(min(natural, options.max_width), natural).with_maximum(options.max_width)
