"""The documentation says what the code does, its links lead somewhere, and it and the tests speak of no
particular machine."""

import re
from pathlib import Path

import pytest

from memdiag.workloads.configs import PRESETS

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"  # the manual's table of contents
PRESET_TABLE = DOCS / "reference" / "workloads.md"
RECORD_TABLE = DOCS / "reference" / "records.md"
NOTES = DOCS / "notes"  # measurement logs and history; the manual pages link to them
MARKDOWN = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
TEXTS = sorted([*MARKDOWN, *(ROOT / "tests").rglob("*.py"), *(ROOT / "tests").rglob("*.sh")])
# Where the code names a page of the manual (in comments, docstrings and messages).
CODE = sorted([*(p for d in ("memdiag", "tests", "probes", "examples", "scripts") for p in (ROOT / d).rglob("*.py")),
               *(ROOT / "scripts").rglob("*.sh"), ROOT / "Makefile", ROOT / "pyproject.toml"])
# Built from parts so that this file does not match itself.
# "this" + "machine", also with a size in between ("this 2-core, 24 GiB" + " machine").
MACHINE = re.compile(r"\bthis\s+(?:\d[\w-]*,?\s+(?:\d+\s*GiB\s+)?)?" + "machine", re.IGNORECASE)
ABSOLUTE = re.compile(r"(?<![\w.~$-])/(?:" + "|".join(("work", "home", "root", "Users")) + r")/"
                      r"|(?<![\w.~$-])/" + "tmp" + r"/\w")
# [text](target) and ![alt](target), with an optional "title"
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
# a page named by its path from the project's root: docs/explanation/measurement.md
MENTION = re.compile(r"(?<![\w/.-])(" + "docs" + r"/[\w./-]*\w\.(?:md|png))")
# ... and a section of it: docs/explanation/measurement.md, "Time"
SECTION = re.compile(r"(?<![\w/.-])(" + "docs" + r"/[\w./-]*\w\.md),? \"([^\"]+)\"")
ISSUE = re.compile(r"\b" + "issue" + r"s? #?\d+", re.IGNORECASE)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _table(path: Path, first_cell: str) -> dict[str, dict[str, str]]:
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_cell} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_the_preset_table_of_the_workloads_reference_is_the_presets_of_the_code():
    table = _table(PRESET_TABLE, "preset")
    assert set(table) == set(PRESETS["transformer"])
    for name, config in PRESETS["transformer"].items():
        row = table[name]
        assert (row["vocab"], row["d_model"], row["layers"], row["heads"], row["filter"], row["seq. length"],
                row["tokens/rank"]) == tuple(str(v) for v in (config.vocab_size, config.d_model, config.num_layers,
                                                               config.num_heads, config.filter_size, config.seq_len,
                                                               config.tokens_per_rank)), name
        assert row["embedding width"].split(",")[0] == str(config.embedding_width), name
        assert row["target embedding"].startswith("tied" if config.tie_target_embedding else "separate"), name


@pytest.mark.parametrize("path", TEXTS, ids=_rel)
def test_docs_and_tests_name_no_particular_machine_or_absolute_path(path):
    text = path.read_text()
    assert not MACHINE.search(text), "name a machine by its size, e.g. a 2-core, 24 GiB machine"
    assert not [m.group(0) for m in ABSOLUTE.finditer(text)], "give paths relative to the project"


def test_every_record_field_the_code_declares_is_documented():
    """memdiag.format.records declares the records; docs/reference/records.md must name each type and each of its fields."""
    from memdiag.format.records import RECORD_CLASSES, RECORD_TYPES

    rows = {}
    for line in RECORD_TABLE.read_text().splitlines():
        match = re.match(r"\|\s*`(\w+)`\s*\|", line)
        if match:
            rows[match.group(1)] = line
    assert set(RECORD_TYPES) <= set(rows), sorted(set(RECORD_TYPES) - set(rows))
    for kind, cls in RECORD_CLASSES.items():
        fields = set(cls.__annotations__) - {"type", "rank", "t"}
        missing = sorted(f for f in fields if f"`{f}`" not in rows[kind])
        assert not missing, f"{_rel(RECORD_TABLE)}, type {kind}: undocumented {missing}"


def test_every_record_type_has_a_class_and_an_undeclared_field_is_found():
    """Each record type a rank writes has its fields declared (the integration tests check the records
    real runs write against them); a field a type does not declare is reported, open types excepted."""
    from memdiag.format.records import RECORD_CLASSES, RECORD_TYPES, undeclared_fields

    assert set(RECORD_CLASSES) == set(RECORD_TYPES)
    assert undeclared_fields({"type": "step", "rank": 0, "t": 1.0, "step": 2, "stpe": 3}) == {"stpe"}
    assert undeclared_fields({"type": "end", "rank": 0, "t": 1.0, "status": "ok"}) == set()
    assert undeclared_fields({"type": "choices", "rank": 0, "t": 1.0, "op": "sum"}) == set()
    assert undeclared_fields({"type": "nonesuch", "a": 1}) == {"type", "a"}


def test_the_writer_takes_every_record_type_and_only_those():
    """RecordWriter.add takes a Record, the union mypy checks every record the ranks make against: it
    must hold each record type's class, and nothing else."""
    import typing

    from memdiag.format.records import RECORD_CLASSES, Record

    assert set(typing.get_args(Record)) == set(RECORD_CLASSES.values())
    from memdiag.format.writer import RecordWriter

    for method in (RecordWriter.add, RecordWriter.write_now):
        assert typing.get_type_hints(method)["record"] == Record


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation but - and _ dropped,
    spaces as -, a repeated one numbered (-1, -2, ...); headings inside fenced code do not count."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
            numbered, k = slug, 0
            while numbered in found:
                k += 1
                numbered = f"{slug}-{k}"
            found.add(numbered)
    return found


def broken_references(path: Path) -> list[str]:
    """The relative links of a Markdown file whose target (resolved from the file's folder) or whose
    #anchor in a Markdown target does not exist, the pages it names by their path from the project's
    root that do not exist, and the sections it names after such a path (the page, then "Section" in
    quotes) that the page does not contain."""
    text = path.read_text()
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # a URL (https:, mailto:)
        file, _, anchor = target.partition("#")
        linked = path.parent / file if file else path
        if not linked.exists():
            broken.append(f"link ({target})")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"anchor ({target})")
    for named in MENTION.findall(text):
        if not (ROOT / named).exists():
            broken.append(f"mention {named}")
    flat = " ".join(text.split())
    for named, section in SECTION.findall(flat):
        page = ROOT / named
        if page.exists() and " ".join(section.split()) not in " ".join(page.read_text().split()):
            broken.append(f'section {named}, "{section}"')
    return broken


@pytest.mark.parametrize("path", MARKDOWN, ids=_rel)
def test_every_relative_link_resolves(path):
    assert not broken_references(path)


def test_the_link_check_finds_a_broken_link(tmp_path):
    """The check above can fail: a missing file, anchor, page and section are each found."""
    page = tmp_path / "page.md"
    page.write_text("# A page\n\n## Below, `here`\n\n"
                    "See [the method](explanation/nowhere.md#steady-state), ![a figure](img/none.png),\n"
                    "[the web](https://example.org), [below](#below-here), [above](#above) and [noise]("
                    + str(DOCS / "explanation" / "measurement.md") + "#no-such-heading); "
                    + "docs" + "/no-such-page.md and\n"
                    + "docs" + '/explanation/measurement.md, "A section that does not exist".\n')
    assert broken_references(page) == ["link (explanation/nowhere.md#steady-state)", "link (img/none.png)",
                                       "anchor (#above)",
                                       "anchor (" + str(DOCS / "explanation" / "measurement.md") + "#no-such-heading)",
                                       "mention " + "docs" + "/no-such-page.md",
                                       "section " + "docs" + '/explanation/measurement.md, "A section that does '
                                       'not exist"']


@pytest.mark.parametrize("path", CODE, ids=_rel)
def test_every_page_the_code_names_exists(path):
    missing = sorted({named for named in MENTION.findall(path.read_text()) if not (ROOT / named).exists()})
    assert not missing, f"{_rel(path)} names pages that do not exist: {missing}"


def test_the_table_of_contents_links_every_page():
    linked = {(INDEX.parent / target.split("#")[0]).resolve() for target in LINK.findall(INDEX.read_text())}
    pages = {p.resolve() for p in DOCS.rglob("*.md")} - {INDEX.resolve()}
    assert not sorted(_rel(p) for p in pages - linked), "add each page to docs/README.md"


@pytest.mark.parametrize("path", sorted(p for p in DOCS.rglob("*.md") if NOTES not in p.parents), ids=_rel)
def test_the_manual_pages_name_no_issue_numbers(path):
    """Issue numbers belong to the history in docs/notes, not to the manual."""
    assert not ISSUE.findall(path.read_text())


def test_the_command_reference_names_every_command_and_option_of_the_cli():
    """docs/reference/commands.md is the reference: every command the parser has, and every long option
    of each but those hidden from --help, appear there (an option added to the code and not to the
    reference fails here)."""
    import argparse

    from memdiag.cli import build_parser

    text = (ROOT / "docs" / "reference" / "commands.md").read_text()
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for name, sub in commands.choices.items():
        if f"`{name}`" not in text:
            missing.append(name)
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:
                continue  # hidden from --help on purpose (the tests' fault injection)
            for option in action.option_strings:
                if option.startswith("--") and option != "--help" and not re.search(rf"`{re.escape(option)}[` =]", text):
                    missing.append(f"{name} {option}")
    assert missing == []


def test_the_report_fields_reference_names_every_key_of_summary_json(tmp_path):
    """Every top-level key the code writes into summary.json (a run of memdiag's own record writer)
    and every key of its per-rank and per-collective entries is in docs/reference/report-fields.md."""
    from memdiag.analyze.summary import summarize
    from memdiag.format.reader import load_run
    from tests.unit.fake_run import make_run

    text = (ROOT / "docs" / "reference" / "report-fields.md").read_text()
    summary = summarize(load_run(str(make_run(tmp_path / "r"))))
    keys = set(summary) | {key for part in ("ranks", "collectives") for entry in summary[part] for key in entry}
    assert sorted(k for k in keys if f"`{k}`" not in text) == []
