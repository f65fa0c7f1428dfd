"""Fixtures shared by the tests (helpers live in tests/helpers.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def sparse_run(runs_root):
    """`memdiag run transformer -n 2 --steps 3 --mode sparse` (real mpirun): made once, read by the tests of
    what a run writes (tests/integration/test_run.py) and of the memory limit (test_faults.py)."""
    from tests.helpers import memdiag

    out = runs_root / "sparse-n2"
    result = memdiag("run", "transformer", "-n", "2", "--steps", "3", "--mode", "sparse", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


@pytest.fixture(autouse=True)
def environment_left_as_found() -> Iterator[None]:
    """Every process a later test starts inherits this one's environment: a variable that code under
    test set in-process (the agent writes TF_CONFIG) and a test left behind makes later runs another job
    (every tf-distribute worker then took the leaked TF_CONFIG's task and port). Put it back, and fail
    the test that left it."""
    before = _environment()
    yield
    after = _environment()
    if after == before:
        return
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for key in changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]
    pytest.fail(f"the test left the environment changed: {', '.join(changed)} (use monkeypatch)", pytrace=False)


# pytest's own (per phase), and the log level memdiag's CLI sets for TensorFlow in its own process when a
# test calls it in-process (memdiag.cli.main); the launcher sets that one for every rank anyway.
_IGNORED = ("PYTEST_CURRENT_TEST", "TF_CPP_MIN_LOG_LEVEL")


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _IGNORED}
