"""Who started this rank: rank, size, local rank and host from the environment its launcher set.

Every launcher a Horovod job meets tells each process its place in variables of its own:

- Open MPI's ``mpirun`` (and ``horovodrun``, which runs it): ``OMPI_COMM_WORLD_RANK``/``_SIZE``/
  ``_LOCAL_RANK``/``_LOCAL_SIZE``, with its PMIx server's ``PMIX_RANK`` and ``PMIX_NAMESPACE`` beside them;
- Slurm's ``srun``: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_STEP_TASKS_PER_NODE``,
  ``SLURMD_NODENAME``, and with ``--mpi=pmix`` ``PMIX_RANK``; with ``--mpi=pmi2`` ``PMI_RANK``/``PMI_SIZE``;
- MPICH's Hydra: ``PMI_RANK``, ``PMI_SIZE``; Horovod's Gloo launcher: ``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...

One process can hold several sets: ``mpirun`` inside ``salloc`` or ``sbatch`` gives its ranks Open MPI's
variables *and* the allocation's ``SLURM_*`` (which then describe the job, or mpirun's daemon started by
srun, not the rank). So the launcher closest to the process is chosen (:data:`PRECEDENCE`) and Slurm's
variables are not held against Open MPI's or Horovod's. Between variables that describe the same
process (Open MPI's against its own ``PMIX_RANK``, Slurm's against the ``PMIX_RANK``/``PMI_RANK`` it set,
Horovod's against MPI's), a disagreement means a stale environment (variables exported by hand, or a
launcher inside another's rank): :class:`LauncherEnvError`, and the agent does not start.

``job_id`` names the job step, the same on every rank of it and different for the next one: the run
directory of ``memdiag agent`` is tied to it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

OPENMPI, HOROVOD, HYDRA, SLURM = "openmpi", "horovod", "hydra", "slurm"
# The launcher nearest to the process first: an mpirun inside a Slurm allocation started this rank,
# not Slurm; Horovod's Gloo launcher may run inside either.
PRECEDENCE = (HOROVOD, OPENMPI, HYDRA, SLURM)


class LauncherEnvError(Exception):
    """No launcher's environment, or two that disagree: the message says which variables and what to do."""


@dataclass(frozen=True)
class LauncherEnv:
    launcher: str  # one of PRECEDENCE
    rank: int
    size: int
    local_rank: int
    local_size: int
    host: str
    job_id: str  # the job (step) this rank belongs to, the same on all its ranks
    variables: tuple[str, ...]  # the variables it was read from

    def as_record(self) -> dict[str, object]:
        return {"launcher": self.launcher, "rank": self.rank, "size": self.size, "local_rank": self.local_rank,
                "local_size": self.local_size, "host": self.host, "job_id": self.job_id,
                "variables": list(self.variables)}


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise LauncherEnvError(f"{name}={value!r} is not a whole number: the launcher's environment is "
                               "damaged; start the job with its launcher (srun, mpirun, horovodrun)") from None


def tasks_on_node(tasks_per_node: str, node: int) -> int | None:
    """Slurm's compressed task counts (``SLURM_STEP_TASKS_PER_NODE``, e.g. ``2(x3),1``): the count of
    node number ``node`` (``SLURM_NODEID``); None when the text is not of that form."""
    index = 0
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            return None
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if node < index + repeat:
            return count
        index += repeat
    return None


def _openmpi(env: Mapping[str, str]) -> LauncherEnv | None:
    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    if rank is None:
        return None
    size = _int(env, "OMPI_COMM_WORLD_SIZE")
    if size is None:
        raise LauncherEnvError("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not: the environment is "
                               "not Open MPI's; start the job with mpirun")
    local_rank = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
    local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
    job = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid") or env.get("OMPI_MCA_orte_hnp_uri", "")
    return LauncherEnv(OPENMPI, rank, size, 0 if local_rank is None else local_rank,
                       1 if local_size is None else local_size, env.get("PMIX_HOSTNAME") or socket.gethostname(),
                       f"openmpi:{job}", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))


def _slurm(env: Mapping[str, str]) -> LauncherEnv | None:
    rank = _int(env, "SLURM_PROCID")
    # SLURM_STEP_ID: a task of a job step (srun); a batch script also has SLURM_PROCID but is no rank.
    if rank is None or env.get("SLURM_STEP_ID") is None:
        return None
    size = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS") or _int(env, "SLURM_NPROCS")
    if size is None:
        raise LauncherEnvError("SLURM_PROCID is set but neither SLURM_STEP_NUM_TASKS nor SLURM_NTASKS: start the "
                               "ranks with srun")
    local_rank = _int(env, "SLURM_LOCALID")
    node = _int(env, "SLURM_NODEID")
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    local_size = tasks_on_node(per_node, node) if node is not None and per_node else None
    job = f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}"
    return LauncherEnv(SLURM, rank, size, 0 if local_rank is None else local_rank,
                       1 if local_size is None else local_size,
                       env.get("SLURMD_NODENAME") or socket.gethostname(), f"slurm:{job}",
                       ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"))


def _horovod(env: Mapping[str, str]) -> LauncherEnv | None:
    rank = _int(env, "HOROVOD_RANK")
    if rank is None:
        return None
    size = _int(env, "HOROVOD_SIZE")
    if size is None:
        raise LauncherEnvError("HOROVOD_RANK is set but HOROVOD_SIZE is not: start the job with horovodrun")
    local_rank = _int(env, "HOROVOD_LOCAL_RANK")
    local_size = _int(env, "HOROVOD_LOCAL_SIZE")
    job = f"{env.get('HOROVOD_GLOO_RENDEZVOUS_ADDR', '')}:{env.get('HOROVOD_GLOO_RENDEZVOUS_PORT', '')}"
    return LauncherEnv(HOROVOD, rank, size, 0 if local_rank is None else local_rank,
                       1 if local_size is None else local_size, env.get("HOROVOD_HOSTNAME") or socket.gethostname(),
                       f"horovod:{job}", ("HOROVOD_RANK", "HOROVOD_SIZE"))


def _hydra(env: Mapping[str, str]) -> LauncherEnv | None:
    rank = _int(env, "PMI_RANK")
    size = _int(env, "PMI_SIZE")
    if rank is None or size is None:
        return None
    local_rank = _int(env, "MPI_LOCALRANKID")
    local_size = _int(env, "MPI_LOCALNRANKS")
    return LauncherEnv(HYDRA, rank, size, 0 if local_rank is None else local_rank,
                       1 if local_size is None else local_size, socket.gethostname(),
                       f"hydra:{env.get('PMI_PORT', '')}", ("PMI_RANK", "PMI_SIZE"))


_READERS: dict[str, Callable[[Mapping[str, str]], LauncherEnv | None]] = {
    OPENMPI: _openmpi, SLURM: _slurm, HOROVOD: _horovod, HYDRA: _hydra}


def _disagreements(env: Mapping[str, str], found: dict[str, LauncherEnv]) -> list[str]:
    """Pairs of variables that describe this same process and differ, as ``A=x but B=y``."""
    pairs: list[tuple[str, str]] = []
    if OPENMPI in found:
        # Open MPI's own PMIx server sets PMIX_RANK beside OMPI_COMM_WORLD_RANK.
        pairs.append(("OMPI_COMM_WORLD_RANK", "PMIX_RANK"))
    elif SLURM in found:
        # srun --mpi=pmix / --mpi=pmi2 set their rank beside SLURM_PROCID.
        pairs += [("SLURM_PROCID", "PMIX_RANK"), ("SLURM_PROCID", "PMI_RANK")]
        if HYDRA in found:
            pairs.append(("SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS", "PMI_SIZE"))
    if HOROVOD in found:
        # Horovod's ranks are the MPI ranks when both exist.
        pairs += [("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"), ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE"),
                  ("HOROVOD_RANK", "PMI_RANK"), ("HOROVOD_SIZE", "PMI_SIZE")]
    if OPENMPI in found and HYDRA in found:
        pairs += [("OMPI_COMM_WORLD_RANK", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")]
    problems = []
    for a, b in pairs:
        va, vb = _int(env, a), _int(env, b)
        if va is not None and vb is not None and va != vb:
            problems.append(f"{a}={va} but {b}={vb}")
    return problems


def detect(env: Mapping[str, str]) -> LauncherEnv:
    """This process's place in the job, from ``env``; LauncherEnvError when no launcher set it or
    when two launchers' variables disagree."""
    found = {name: value for name, read in _READERS.items() if (value := read(env)) is not None}
    if not found:
        if env.get("PMIX_RANK") is not None:
            raise LauncherEnvError("PMIX_RANK is set but no launcher says how many ranks there are: start the "
                                   "ranks with srun or mpirun")
        raise LauncherEnvError("no launcher's environment (Open MPI's OMPI_COMM_WORLD_*, Slurm's SLURM_PROCID "
                               "with a step, PMI_RANK, HOROVOD_RANK): start `memdiag agent` under srun, mpirun "
                               "or horovodrun, or use `memdiag run` to start the ranks")
    problems = _disagreements(env, found)
    if problems:
        raise LauncherEnvError("launcher variables disagree (" + "; ".join(problems) + "): the environment "
                               "holds another job's variables; unset them or start the job afresh")
    chosen = next(found[name] for name in PRECEDENCE if name in found)
    if not 0 <= chosen.rank < chosen.size:
        raise LauncherEnvError(f"rank {chosen.rank} of {chosen.size} ({', '.join(chosen.variables)}): the "
                               "launcher's environment is damaged; start the job afresh")
    return chosen


def current(env: Mapping[str, str]) -> LauncherEnv:
    """As :func:`detect`, without its checks: for a rank that ``memdiag run`` started, or that
    ``memdiag agent`` checked already; a process that no launcher started is rank 0 of 1."""
    for name in PRECEDENCE:
        try:
            found = _READERS[name](env)
        except LauncherEnvError:
            continue
        if found is not None:
            return found
    return LauncherEnv("none", 0, 1, 0, 1, socket.gethostname(), "", ())
