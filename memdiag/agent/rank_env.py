"""Where a rank runs: its place as its launcher gave it (rank, size, ranks on its node), its MPI library, and EnvironmentProblem.

The launcher's variables are read by :mod:`memdiag.agent.launcher_env` (mpirun, srun, horovodrun, Hydra).
"""

from __future__ import annotations

import os

from memdiag.agent import launcher_env


def rank_from_env() -> int:
    return launcher_env.current(os.environ).rank


def ranks_on_node() -> int:
    return launcher_env.current(os.environ).local_size


def world_size_from_env() -> int:
    return launcher_env.current(os.environ).size


def cpus_allowed() -> int | None:
    """How many CPUs this process may run on (its affinity, as the launcher's binding left it): what
    TensorFlow sizes its thread pools by. None where the platform cannot tell."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def mpi_version() -> str | None:
    try:
        from mpi4py import MPI

        return MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # noqa: BLE001 - versions are informative only
        return None


class EnvironmentProblem(Exception):
    """The software on this host cannot run memdiag: nothing about the workload."""
