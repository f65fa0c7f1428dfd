"""memdiag runs on Python 3.9, 3.10 and 3.11 (TensorFlow 2.15's range).

Everywhere: every module of memdiag, the tests and the probes parses as Python 3.9, and the version
pyproject.toml requires is 3.9. Where older interpreters with numpy, rich and psutil are named in
MEMDIAG_PYTHONS (paths, separated by ``:``; ``probes/python_versions.sh`` makes them), each imports every
module that does not need TensorFlow, Horovod, mpi4py or memray, and summarises the same run as this
interpreter does, to the same summary.json.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

OLDEST = (3, 9)
SOURCES = sorted(p for folder in ("memdiag", "tests", "probes", "examples") for p in (ROOT / folder).rglob("*.py")
                 if "conformance" not in p.parts)
PYTHONS = [p for p in os.environ.get("MEMDIAG_PYTHONS", "").split(":") if p]
NEEDS = ("tensorflow", "horovod", "mpi4py", "memray")


def test_pyproject_requires_the_oldest_python_tensorflow_2_15_supports():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.9"' in text and 'target-version = "py39"' in text


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_source_parses_as_python_3_9(path):
    ast.parse(path.read_text(), filename=str(path), feature_version=OLDEST)


IMPORT_ALL = f"""
import importlib, json, pkgutil, sys
import memdiag
failed = {{}}
for m in pkgutil.walk_packages(memdiag.__path__, "memdiag."):
    if m.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in {NEEDS!r}:
            failed[m.name] = repr(exc)
    except Exception as exc:
        failed[m.name] = repr(exc)
print(json.dumps(failed))
"""

SUMMARISE = """
import json, sys
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
print(json.dumps(summarize(load_run(sys.argv[1])), default=str, sort_keys=True))
"""


@pytest.mark.skipif(not PYTHONS, reason="MEMDIAG_PYTHONS names no other interpreter (probes/python_versions.sh)")
@pytest.mark.parametrize("python", PYTHONS)
def test_an_older_python_imports_memdiag_and_summarises_a_run_as_this_one_does(python, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([python, "-c", IMPORT_ALL], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {}
    # GIVEN a run directory written by memdiag's own record writer (the two-regime comparison's N=4 sparse)
    from tests.unit.test_compute_phase import write_run

    run = write_run(tmp_path / "run", 4, "sparse", "average")
    here = subprocess.run([sys.executable, "-c", SUMMARISE, str(run)], capture_output=True, text=True, env=env)
    there = subprocess.run([python, "-c", SUMMARISE, str(run)], capture_output=True, text=True, env=env)
    assert here.returncode == 0 and there.returncode == 0, here.stderr[-2000:] + there.stderr[-2000:]
    assert json.loads(there.stdout) == json.loads(here.stdout)


@pytest.mark.parametrize("version,status", [((3, 8, 18), "fail"), ((3, 9, 18), "ok"), ((3, 10, 13), "ok"),
                                            ((3, 11, 7), "ok"), ((3, 12, 1), "warn")])
def test_doctor_accepts_the_pythons_tensorflow_2_15_supports(version, status):
    from memdiag.doctor import _python

    check = _python(version)
    assert check.status == status and check.finding == ".".join(map(str, version))
    assert status == "ok" or "3.9, 3.10 or 3.11" in check.fix
