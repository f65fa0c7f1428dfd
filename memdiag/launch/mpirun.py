"""Build the mpirun command line, say where it places each rank, and run it under supervision
(timeout, whole process group).

mpirun gets memdiag's whole environment, so any MCA option set as ``OMPI_MCA_<name>=<value>`` (the
rsh agent, network interfaces, ports) reaches it without an option of memdiag's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from memdiag._errors import UserError

# Variables the ranks need on other hosts too (mpirun passes them with -x).
_FORWARD = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")
_FORWARD_PREFIXES = ("HOROVOD_", "MEMDIAG_")


@dataclass
class Launch:
    world_size: int
    agent_args: list[str]
    hosts: str | None = None
    timeout_s: float | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    mpirun_args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    timed_out: bool
    wall_s: float
    command: list[str]


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """``-H`` as OpenMPI 4.1 reads it: hosts in order of first mention with their slots (``host:N``;
    a host without a count has 1 slot; a host named twice has the sum)."""
    slots: dict[str, int] = {}
    for entry in hosts.split(","):
        name, _, count = entry.strip().partition(":")
        if not name:
            raise UserError(f"--hosts {hosts}: give host names with their slots, e.g. node1:4,node2:4")
        if count and not (count.isdigit() and int(count) > 0):
            raise UserError(f"--hosts {hosts}: {entry!r} needs a positive slot count, e.g. {name}:4")
        slots[name] = slots.get(name, 0) + (int(count) if count else 1)
    return list(slots.items())


def placement(world_size: int, hosts: str | None) -> list[str]:
    """The host of each rank, as ``mpirun -np world_size --oversubscribe -H hosts`` places them
    (OpenMPI 4.1's default mapping by slot, orte/mca/rmaps/round_robin/rmaps_rr_mappers.c,
    orte_rmaps_rr_byslot; checked against ``mpirun --display-map``):

    - hosts are filled in order up to their slots: -H a:2,b:2 -np 3 puts ranks 0,1 on a and 2 on b;
    - ranks past the slots of all hosts are spread evenly, the first hosts taking one more when they
      do not divide: -H a:2,b:2 -np 7 gives a 4 and b 3;
    - ranks are numbered host by host: -H a:2,b:2 -np 7 puts ranks 0-3 on a and 4-6 on b.

    Without hosts every rank runs on the launching host.
    """
    if not hosts:
        return [socket.gethostname()] * world_size
    nodes = parse_hosts(hosts)
    counts = [min(slots, max(0, world_size - sum(s for _, s in nodes[:i]))) for i, (_, slots) in enumerate(nodes)]
    extra = world_size - sum(counts)
    if extra > 0:
        balance, remainder = divmod(extra, len(nodes))
        counts = [c + balance + (1 if i < remainder else 0) for i, c in enumerate(counts)]
    return [name for (name, _), count in zip(nodes, counts) for _ in range(count)]


def ranks_per_host(world_size: int, hosts: str | None) -> int:
    """The most ranks that :func:`placement` puts on one host: what shares a host's cores."""
    per_host: dict[str, int] = {}
    for host in placement(world_size, hosts):
        per_host[host] = per_host.get(host, 0) + 1
    return max(per_host.values(), default=0)


def find_mpirun() -> str:
    path = shutil.which("mpirun")
    if path is None:
        raise UserError("mpirun not found on PATH; install OpenMPI (run `make setup`) or add it to PATH")
    return path


def command(launch: Launch) -> list[str]:
    cmd = [find_mpirun(), "-np", str(launch.world_size), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if launch.hosts:
        cmd += ["-H", launch.hosts]
    env = {**os.environ, **launch.extra_env}
    names = [k for k in env if k in _FORWARD or k.startswith(_FORWARD_PREFIXES)]
    for name in sorted(set(names)):
        cmd += ["-x", name]
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
    start = time.monotonic()
    timed_out = False
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
                        _end_group(proc)
                        break
        except KeyboardInterrupt:
            _end_group(proc)
            raise
    return LaunchResult(proc.returncode, timed_out, time.monotonic() - start, cmd)


def _end_group(proc: subprocess.Popen) -> None:
    """SIGTERM to mpirun and every rank it started, then SIGKILL what is left."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
