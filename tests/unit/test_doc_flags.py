"""Every option the docs show on a memdiag command line exists in that command's parser."""

from __future__ import annotations

import argparse
import re

import pytest

from memdiag.cli import build_parser
from tests.helpers import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# a memdiag command line in a page: `memdiag VERB ...` up to the end of the line or of the code span
COMMAND = re.compile(r"(?:^|[\s`/])memdiag (run|compare|scale|report|predict|agent|collect|doctor)\b([^`\n]*)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def shown(page) -> list[tuple[str, str, int]]:
    """(verb, option, line) for each option a page shows on a memdiag command line, before any ``--``
    that hands the rest to the user's script."""
    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if "docs/notes/" in str(page):
            continue  # the lab log keeps the commands of its day
        for verb, rest in COMMAND.findall(line):
            own = re.split(r"\s--(?:\s|$)", rest)[0]
            found += [(verb, option, number) for option in OPTION.findall(own)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_option_a_page_shows_exists_in_its_command(page):
    known = {verb: {s for a in p._actions for s in a.option_strings} for verb, p in parsers().items()}
    missing = [f"line {n}: memdiag {verb} {option}" for verb, option, n in shown(page)
               if option not in known[verb]]
    assert not missing, f"{page.relative_to(ROOT)} shows options its commands do not have: {missing}"


def test_the_check_sees_an_option_that_does_not_exist(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("    memdiag run transformer -n 2 --no-such-option -- --script-flag\n")
    assert [(v, o) for v, o, _ in shown(page)] == [("run", "--no-such-option")]
