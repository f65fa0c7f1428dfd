"""The documentation says what the code does, and it and the tests speak of no particular machine."""

import re
from pathlib import Path

import pytest

from memdiag.workloads.configs import PRESETS

ROOT = Path(__file__).resolve().parent.parent.parent
TEXTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "tests").rglob("*.py"), *(ROOT / "tests").rglob("*.sh")])
# Built from parts so that this file does not match itself.
# "this" + "machine", also with a size in between ("this 2-core, 24 GiB" + " machine").
MACHINE = re.compile(r"\bthis\s+(?:\d[\w-]*,?\s+(?:\d+\s*GiB\s+)?)?" + "machine", re.IGNORECASE)
ABSOLUTE = re.compile(r"(?<![\w.~$-])/(?:" + "|".join(("work", "home", "root", "Users")) + r")/"
                      r"|(?<![\w.~$-])/" + "tmp" + r"/\w")


def _preset_table() -> dict[str, dict[str, str]]:
    lines = (ROOT / "docs" / "running.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| preset |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_the_preset_table_of_running_md_is_the_presets_of_the_code():
    table = _preset_table()
    assert set(table) == set(PRESETS["transformer"])
    for name, config in PRESETS["transformer"].items():
        row = table[name]
        assert (row["vocab"], row["d_model"], row["layers"], row["heads"], row["filter"], row["seq. length"],
                row["tokens/rank"]) == tuple(str(v) for v in (config.vocab_size, config.d_model, config.num_layers,
                                                               config.num_heads, config.filter_size, config.seq_len,
                                                               config.tokens_per_rank)), name
        assert row["embedding width"].split(",")[0] == str(config.embedding_width), name
        assert row["target embedding"].startswith("tied" if config.tie_target_embedding else "separate"), name


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_and_tests_name_no_particular_machine_or_absolute_path(path):
    text = path.read_text()
    assert not MACHINE.search(text), "name a machine by its size, e.g. a 2-core, 24 GiB machine"
    assert not [m.group(0) for m in ABSOLUTE.finditer(text)], "give paths relative to the project"


def test_every_record_field_the_code_declares_is_documented():
    """memdiag.schema declares the records; docs/records.md must name each type and each of its fields."""
    from memdiag.schema import RECORD_CLASSES, RECORD_TYPES

    rows = {}
    for line in (ROOT / "docs" / "records.md").read_text().splitlines():
        match = re.match(r"\|\s*`(\w+)`\s*\|", line)
        if match:
            rows[match.group(1)] = line
    assert set(RECORD_TYPES) <= set(rows), sorted(set(RECORD_TYPES) - set(rows))
    for kind, cls in RECORD_CLASSES.items():
        fields = set(cls.__annotations__) - {"type", "rank", "t"}
        missing = sorted(f for f in fields if f"`{f}`" not in rows[kind])
        assert not missing, f"docs/records.md, type {kind}: undocumented {missing}"
