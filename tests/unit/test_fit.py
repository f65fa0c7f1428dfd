"""FitTable: figures whole, names shortened from the left, too-wide tables split with their keys."""

import io

import pytest
from rich.console import Console
from rich.text import Text

from memdiag.report._fit import Column, FitTable, shorten_left

LONG = "encoder/source_embedding/embeddings [values]"


def render(renderable, width: int) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
    console.print(renderable)
    return console.file.getvalue()


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def tensor_table() -> FitTable:
    table = FitTable([Column("tensor", kind="name", justify="left", key=True), Column("collective", justify="left"),
                      Column("rows in>out"), Column("bytes in"), Column("bytes out")], title="Collectives")
    table.add_row(LONG, "allgather", "5000>6000000", "19.5 MiB", "22.9 GiB")
    table.add_row("kernel", "allreduce", "4096>4096", "16 MiB", "16 MiB")
    return table


def test_shorten_left_keeps_the_tail_and_marks_the_cut():
    assert shorten_left("abcdefgh", 5) == Text("…efgh")
    assert shorten_left("abc", 5) == "abc"
    styled = shorten_left(Text("abcdefgh", style="bold"), 4)
    assert styled.plain == "…fgh" and styled.style == "bold"


def test_a_table_that_fits_is_drawn_whole():
    text = render(tensor_table(), 120)
    assert LONG in text and "…" not in text and "(continued)" not in text


@pytest.mark.parametrize("width", [80, 72])
def test_the_name_shrinks_from_the_left_and_the_figures_stay_whole(width):
    text = render(tensor_table(), width)
    assert widest(text) <= width
    for figure in ("allgather", "5000>6000000", "19.5 MiB", "22.9 GiB", "4096>4096", "16 MiB"):
        assert figure in text
    [line] = [line for line in text.splitlines() if "…" in line]
    tail = line.split("…", 1)[1].split("│", 1)[0].rstrip()
    assert LONG.endswith(tail) and len(tail) >= 15 and LONG not in text


def test_markup_like_brackets_in_names_are_text():
    table = FitTable([Column("tensor", kind="name", justify="left")])
    table.add_row("emb [values]")
    assert "emb [values]" in render(table, 80)


def test_figures_wider_than_the_console_split_the_table_and_repeat_the_key_columns():
    headers = ["peak RSS", "coll/step", "gathered", "VmHWM", "step", "items/s", "status", "efficiency"]
    table = FitTable([Column("N", key=True), Column("mode", justify="left", key=True)]
                     + [Column(h, group=0 if i < 4 else 1) for i, h in enumerate(headers)], title="Runs")
    cells = ["1.90 GiB", "45.8 GiB", "45.8 GiB", "1.95 GiB", "61234 ms", "123456", "killed", "100%"]
    table.add_row("1200", "as-written", *cells)
    text = render(table, 80)
    assert widest(text) <= 80
    assert text.count("1200") == 2 and text.count("as-written") == 2  # the keys in both parts
    assert "Runs (continued)" in text
    for figure in cells:
        assert figure in text
    # the groups stay together: the first part holds the memory figures, the second the times
    first, second = text.split("Runs (continued)")
    assert all(h in first for h in headers[:4]) and all(h in second for h in headers[4:])


def test_prose_wraps_at_spaces_and_loses_no_word():
    reason = ("auto: gathered 22.9 GiB (N=1200 x 5000 rows, the most of any rank) > dense 133 MiB, "
              "so the gradient is densified before the allreduce")
    table = FitTable([Column("tensor", kind="name", justify="left", key=True), Column("reduced as", justify="left"),
                      Column("reason", kind="prose", justify="left")])
    table.add_row(LONG, "dense allreduce", reason)
    text = render(table, 80)
    assert widest(text) <= 80 and "dense allreduce" in text
    words = " ".join(cell.strip() for line in text.splitlines() for cell in line.split("│")[3:4])
    assert " ".join(words.split()) == reason
