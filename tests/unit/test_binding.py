"""Where memdiag's mpirun lets the ranks run: a script's ranks as a plain ``mpirun -np N`` binds them,
a built-in workload's unbound, and a binding the user chose in the environment kept. Real Open MPI;
each rank writes down the CPUs it may run on (what TensorFlow sizes its default thread pools by)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from memdiag.launch.mpirun import BINDING_MCA, Launch, command

pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None or not hasattr(os, "sched_getaffinity"),
                                reason="needs Open MPI's mpirun and Linux's affinity")

# each rank writes its count to a file named by its rank in the directory given: mpirun forwards the ranks'
# output in pieces, and two ranks' lines can interleave mid-line
WRITE_CPUS = [sys.executable, "-c", "import os, sys; open(os.path.join(sys.argv[1], os.environ['OMPI_COMM_WORLD_RANK']),"
              " 'w').write(str(len(os.sched_getaffinity(0))))"]


def _cpus(cmd: list[str], env: dict[str, str] | None = None) -> list[int]:
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([*cmd, out], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {})})
        assert done.returncode == 0, done.stdout + done.stderr
        return sorted(int(path.read_text()) for path in Path(out).iterdir())


def _launched(launch: Launch, env: dict[str, str] | None = None) -> list[int]:
    """The ranks' CPUs under memdiag's launch command, with the agent swapped for a one-line script."""
    cmd = command(launch)
    tail = cmd.index("-m")  # [python, -m, memdiag.agent, config]
    return _cpus(cmd[:tail - 1] + WRITE_CPUS, env)


def _plain(ranks: int, env: dict[str, str] | None = None) -> list[int]:
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return _cpus(["mpirun", "-np", str(ranks), "--oversubscribe", *root, *WRITE_CPUS], env)


def test_a_scripts_ranks_are_bound_as_plain_mpirun_binds_them(monkeypatch):
    monkeypatch.delenv(BINDING_MCA, raising=False)
    ranks = min(2, os.cpu_count() or 1)  # fits the cores: Open MPI 4 binds each rank to one
    script = _launched(Launch(ranks, ["config"]))
    assert script == _plain(ranks)
    assert "--bind-to" not in command(Launch(ranks, ["config"]))
    if (os.cpu_count() or 1) >= 2:
        assert script == [1] * ranks  # plain mpirun bound each rank to a core


def test_a_workloads_ranks_are_unbound_unless_the_user_chose_a_binding(monkeypatch):
    monkeypatch.delenv(BINDING_MCA, raising=False)
    ranks = min(2, os.cpu_count() or 1)
    everything = len(os.sched_getaffinity(0))
    assert _launched(Launch(ranks, ["config"], unbound=True)) == [everything] * ranks
    # the user's binding policy in the environment wins over memdiag's default, as it would over mpirun's
    monkeypatch.setenv(BINDING_MCA, "core")
    assert "--bind-to" not in command(Launch(ranks, ["config"], unbound=True))
    assert _launched(Launch(ranks, ["config"], unbound=True)) == _plain(ranks, {BINDING_MCA: "core"})
