"""Imports go one way: each part of memdiag imports only parts below it in LAYERS (or itself).

The parts are the packages (agent, analyze, commands, launch, report, workloads) and the top-level
modules. Every import counts, a function's own too (most of TensorFlow's and Horovod's users import
late). docs/explanation/architecture.md gives the same order; a test checks the two agree.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "memdiag"

# Lowest first. The run directory's format and the records' shapes at the bottom; what runs in a
# rank (densify, workloads, agent) above the analysis it uses (the warm-up's steady rule); reports,
# the launcher and the verbs on top.
LAYERS = [
    "memdiag", "_errors", "compat", "mallinfo", "units", "rounding", "formula", "format", "policy", "hosts",
    "ports", "agentconfig", "agreement",
    "analyze",
    "graphcalls", "nativemarks", "optimizer_input", "densify", "workloads", "doctor", "agent", "tensorflow",
    "report",
    "launch",
    "commands",
    "cli", "__main__",
]


def part(module: str) -> str:
    """The part of memdiag a dotted module name belongs to."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "memdiag"


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported memdiag module, line) for every import in a file, nested ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "memdiag"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "memdiag":
            if node.module == "memdiag":  # from memdiag import rundir, __version__
                found += [("memdiag" if a.name.startswith("__") else f"memdiag.{a.name}", node.lineno)
                          for a in node.names]
            else:
                found.append((node.module, node.lineno))
    return found


def upward_imports() -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        here = part(module)
        assert here in rank, f"{module}: part {here!r} is in no layer of LAYERS"
        for target, line in imports(path):
            there = part(target)
            assert there in rank, f"{module}:{line} imports {target}, whose part is in no layer"
            if rank[there] > rank[here]:
                problems.append(f"{path.relative_to(ROOT)}:{line}: {here} imports {target} ({there} is above it)")
    return problems


def test_no_part_of_memdiag_imports_a_part_above_it():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    # GIVEN a copy of the package where the run-directory module imports the analysis
    copy = tmp_path / "memdiag"
    for path in PACKAGE.rglob("*.py"):
        target = copy / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    rundir = copy / "format" / "rundir.py"
    rundir.write_text(rundir.read_text() + "\n\ndef _late():\n    from memdiag.analyze import summary  # noqa\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__, fromlist=["x"]), "PACKAGE", copy)
    # THEN the check names it
    problems = upward_imports()
    assert len(problems) == 1 and "format imports memdiag.analyze " in problems[0]


def test_the_architecture_doc_gives_the_same_order():
    text = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    block = re.search(r"Import order, lowest first:(.*?`__main__`)", text, re.S)
    assert block, "docs/explanation/architecture.md: no 'Import order, lowest first:' paragraph"
    assert re.findall(r"`([\w.]+)`", block.group(1)) == LAYERS
