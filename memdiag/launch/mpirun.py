"""Build the launcher's command line (Open MPI's mpirun, or Slurm's srun inside an allocation) and run
it under supervision (timeout, whole process group). Where mpirun places each rank is :mod:`memdiag.hosts`.

The launcher gets memdiag's whole environment, so any MCA option set as ``OMPI_MCA_<name>=<value>`` (the
rsh agent, network interfaces, ports), or any ``SLURM_*``/``SRUN_*`` input variable, reaches it without an
option of memdiag's. srun passes the whole environment to the ranks itself (``--export=ALL``, its default).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memdiag._errors import UserError
from memdiag.hosts import parse_hosts, placement, ranks_per_host

__all__ = ["Launch", "LaunchResult", "command", "find_launcher", "find_mpirun", "parse_hosts", "placement",
           "ranks_per_host", "run"]

# Variables the ranks need on other hosts too (mpirun passes them with -x).
_FORWARD = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS",
            "TF_USE_LEGACY_KERAS", "KERAS_BACKEND")
_FORWARD_PREFIXES = ("HOROVOD_", "MEMDIAG_")


@dataclass
class Launch:
    world_size: int
    agent_args: list[str]
    hosts: str | None = None
    timeout_s: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    mpirun_args: list[str] = field(default_factory=list)
    launcher: str = "mpirun"  # or "srun"
    # Unbind the ranks (mpirun's --bind-to none): for built-in workloads, which size TensorFlow's pools to
    # the cores themselves. A script runs where mpirun's own default puts it (see command()).
    unbound: bool = False


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    timed_out: bool
    wall_s: float
    command: list[str]


def find_mpirun() -> str:
    path = shutil.which("mpirun")
    if path is None:
        raise UserError("mpirun not found on PATH; install OpenMPI (run `make setup`) or add it to PATH")
    return path


def find_launcher(name: str) -> str:
    if name == "srun":
        path = shutil.which("srun")
        if path is None:
            raise UserError("srun not found on PATH: --launcher srun runs inside a Slurm allocation (sbatch, salloc); "
                            "use --launcher mpirun elsewhere")
        return path
    return find_mpirun()


# Open MPI's binding policy, as an environment variable: how a user chooses one for memdiag's mpirun.
BINDING_MCA = "OMPI_MCA_hwloc_base_binding_policy"


def command(launch: Launch) -> list[str]:
    """mpirun's (or srun's) command line. A script's ranks are bound as a plain ``mpirun -np N`` binds
    them (Open MPI 4: each to a core while the ranks fit the host's cores, to nothing when they do not):
    binding sets how many CPUs TensorFlow sees, and so the size of its thread pools and what they hold.
    A user chooses another binding with ``OMPI_MCA_hwloc_base_binding_policy`` (e.g. ``none``)."""
    if launch.launcher == "srun":
        return _srun_command(launch)
    env = {**os.environ, **launch.extra_env}
    cmd = [find_mpirun(), "-np", str(launch.world_size), "--oversubscribe"]
    if launch.unbound and BINDING_MCA not in env:
        cmd += ["--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if launch.hosts:
        cmd += ["-H", launch.hosts]
    names = [k for k in env if k in _FORWARD or k.startswith(_FORWARD_PREFIXES)]
    for name in sorted(set(names)):
        cmd += ["-x", name]
    cmd += launch.mpirun_args
    cmd += [sys.executable, "-m", "memdiag.agent", *launch.agent_args]
    return cmd


def _srun_command(launch: Launch) -> list[str]:
    """``srun -n N`` in the allocation it runs in. Debian's Open MPI (and so Horovod's MPI) needs PMIx from
    srun: ``--mpi=pmix`` unless the environment names an MPI plugin (SLURM_MPI_TYPE, srun's own input
    variable). A rank that fails ends the step, as mpirun ends the job (``--kill-on-bad-exit``). More ranks
    than the allocation has tasks (a comparison's largest N in a small allocation) are ``--overcommit``."""
    cmd = [find_launcher("srun"), "-n", str(launch.world_size), "--kill-on-bad-exit=1"]
    tasks = os.environ.get("SLURM_NTASKS", "")
    if tasks.isdigit() and launch.world_size > int(tasks):
        # More ranks than the allocation's tasks share its CPUs, as mpirun's --oversubscribe lets them.
        cmd.append("--overcommit")
    if "SLURM_MPI_TYPE" not in os.environ:
        cmd.append("--mpi=pmix")
    cmd += launch.mpirun_args
    cmd += [sys.executable, "-m", "memdiag.agent", *launch.agent_args]
    return cmd


def run(launch: Launch, log_path: str, poll: Callable[[], None] | None = None) -> LaunchResult:
    """Run mpirun with its output in ``log_path``; on timeout, end the whole process group.

    ``poll`` is called about twice a second while the ranks run (progress displays).
    """
    cmd = command(launch)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
           **launch.extra_env}
    if launch.launcher == "mpirun" and not _user_chose_sigkill_timeout(env, launch.mpirun_args):
        env["OMPI_MCA_odls_base_sigkill_timeout"] = str(SIGKILL_TIMEOUT_S)
    start = time.monotonic()
    timed_out = False
    # mpirun runs in its own session (so that a timeout can end every rank), which also keeps it from
    # the signals sent to memdiag's: memdiag passes on a termination, as it does Ctrl-C.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _exit_on_signal)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        try:
            while True:
                try:
                    proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    if poll is not None:
                        poll()
                    if launch.timeout_s is not None and time.monotonic() - start > launch.timeout_s:
                        timed_out = True
                        _end_group(proc, launch.launcher)
                        break
        except (KeyboardInterrupt, SystemExit):
            _end_group(proc, launch.launcher)
            raise
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return LaunchResult(proc.returncode, timed_out, time.monotonic() - start, cmd)


def _user_chose_sigkill_timeout(env: dict[str, str], mpirun_args: list[str]) -> bool:
    return "OMPI_MCA_odls_base_sigkill_timeout" in env or "odls_base_sigkill_timeout" in mpirun_args


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


# Seconds between the SIGTERM and the SIGKILL of a launcher's process group. srun, on SIGTERM, ends its
# step through slurmd (SIGTERM to the ranks, SIGKILL after the cluster's KillWait): killed itself before
# that, it would leave the step to Slurm's timeouts. mpirun, on SIGTERM, sends its ranks SIGCONT, waits
# odls_base_sigkill_timeout seconds, sends SIGTERM, waits as long again and sends SIGKILL (Open MPI 4.1's
# odls): it must outlive both waits, or the ranks never see the SIGTERM.
_GRACE_S = {"mpirun": 5.0, "srun": 40.0}
# Seconds mpirun waits before each of its signals when memdiag launches it (Open MPI's default is 1),
# unless the user chose (OMPI_MCA_odls_base_sigkill_timeout, or --mca in the launcher's options): with the
# SIGTERM memdiag sends the ranks itself, a rank has about twice this long to write where it stopped.
SIGKILL_TIMEOUT_S = 2


def _end_group(proc: subprocess.Popen[Any], launcher: str = "mpirun") -> None:
    """SIGTERM to the launcher and every rank it started, then SIGKILL what is left.

    mpirun puts each local rank in a process group of its own, so the ranks are signalled by process as
    well as through mpirun: at once, not after mpirun's first wait, and killed with it if it hangs."""
    ranks = _local_ranks(proc.pid) if launcher == "mpirun" else []
    grace_s = _GRACE_S.get(launcher, 5.0) + (2 * SIGKILL_TIMEOUT_S if launcher == "mpirun" else 0)
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for rank in ranks:
            with contextlib.suppress(Exception):  # psutil.NoSuchProcess, AccessDenied: gone, or not ours
                rank.send_signal(sig)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _local_ranks(launcher_pid: int) -> list[Any]:
    """The launcher's descendants outside its own process group (mpirun's local ranks), as psutil
    processes (which check, when signalled, that the pid was not reused)."""
    import psutil

    try:
        group = os.getpgid(launcher_pid)
        children = psutil.Process(launcher_pid).children(recursive=True)
    except (ProcessLookupError, psutil.Error):
        return []
    ranks = []
    for child in children:
        try:
            if os.getpgid(child.pid) != group:
                ranks.append(child)
        except ProcessLookupError:
            continue
    return ranks
