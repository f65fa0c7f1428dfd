"""Several hosts on one machine, for the multi-host tests.

Each simulated host is the machine that runs the tests, seen through its own UTS and mount
namespaces: its own host name and its own empty temporary directory (/tmp, or TMPDIR). OpenMPI's rsh
launcher enters them through ``rsh_agent.sh`` (in place of ssh), so ``mpirun -H hostA:2,hostB:2``
starts one daemon per "host", and the ranks on hostA and hostB share no temporary directory. One
simulated host (the launching host, first in ``--hosts``) sees the directory of the run directories;
the others see an empty directory there, as when the run directory is on the launching host's own disk.

memdiag needs no option for any of this: mpirun reads ``OMPI_MCA_plm_rsh_agent`` and
``OMPI_MCA_plm_rsh_no_tree_spawn`` from its environment, which memdiag's launcher passes on.
The host names need not resolve: OpenMPI's rsh launcher only hands them to the agent, and each daemon
connects back to mpirun by the address in its command line (checked with hostA/hostB absent from
/etc/hosts and DNS), so nothing is added to /etc/hosts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
AGENT = Path(__file__).resolve().with_name("rsh_agent.sh")
# The Python that runs memdiag: pytest's own, or MEMDIAG_TEST_PYTHON's (tests/helpers.py).
PYTHON = os.environ.get("MEMDIAG_TEST_PYTHON") or sys.executable
# Every simulated host masks the temporary directory (TMPDIR, or /tmp) with its own: what the ranks
# must see lies elsewhere.
MASKED = Path(tempfile.gettempdir()).resolve()
# The run directories of the tests: under the project's own (git-ignored) runs/ folder, since pytest's
# temporary directories lie under the temporary directory, which the simulated hosts mask.
RUNS = ROOT / "runs"


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def mpirun_base() -> list[str]:
    """mpirun as memdiag starts it (oversubscribed, unbound, as root when root)."""
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd


def agent_env() -> dict[str, str]:
    """What makes mpirun start its daemons through the agent, one namespace per host."""
    return {"OMPI_MCA_plm_rsh_agent": str(AGENT), "OMPI_MCA_plm_rsh_no_tree_spawn": "1"}


# What the kernel or a sandbox (a container without CAP_SYS_ADMIN, seccomp, AppArmor) answers when it
# refuses a namespace, a host name or a mount, as the tools print it with LC_ALL=C: EPERM, EACCES,
# EINVAL and ENOSYS (namespaces not built into the kernel), EOPNOTSUPP, ENOSPC (the sysctl
# user.max_*_namespaces set to 0), and hostname(1)'s own words for EPERM.
REFUSED = ("operation not permitted", "permission denied", "invalid argument", "function not implemented",
           "operation not supported", "no space left on device", "must be root")


class SetupError(Exception):
    """The simulated hosts could be made here, but setting them up failed: a test failure, not a skip."""


def namespaces_unavailable(tmp: Path = MASKED) -> str | None:
    """Why the host running the tests refuses a simulated host's namespaces (None when it allows them),
    probed alone: what ``rsh_agent.sh`` does first, in one throw-away namespace (a host name, a tmpfs
    over ``tmp``).
    Raises :class:`SetupError` when the probe fails for any other reason."""
    if not sys.platform.startswith("linux"):
        return "simulated hosts need Linux namespaces"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    cmd = ["unshare", "--uts", "--mount", "/bin/sh", "-c",
           'hostname memdiag-probe && mount -t tmpfs memdiag-probe "$1"', "probe", str(tmp)]
    probe = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                           env={**os.environ, "LC_ALL": "C"})
    if probe.returncode == 0:
        return None
    output = " ".join((probe.stdout + probe.stderr).split())
    if any(words in output.lower() for words in REFUSED):
        return (f"the host running the tests refuses a simulated host's UTS and mount namespaces (needs root or "
                f"CAP_SYS_ADMIN): {output}")
    raise SetupError(f"{' '.join(cmd)} failed (exit status {probe.returncode}): {output}")


def layout_problem() -> str | None:
    """What in this checkout's layout the simulated hosts would hide from the ranks (None: nothing)."""
    for what, path in (("the tests", TESTS), ("the Python environment", Path(sys.prefix).resolve()),
                       ("the run directories", RUNS)):
        if _under(path, MASKED):
            return f"{what} lie under {MASKED}, which every simulated host masks; move them elsewhere"
    return None


class SimulatedCluster:
    """Run directories visible to the launching host only, and what each host left in its /tmp."""

    def __init__(self, launch_host: str = "hostA") -> None:
        self.launch_host = launch_host
        self.root = RUNS / f"test-multihost-{uuid.uuid4().hex[:8]}"
        self.runs = self.root / "runs"  # seen by the launching host alone
        self.reports = self.root / "reports"  # what each host left in /tmp, listed by the agent
        self.runs.mkdir(parents=True)
        self.reports.mkdir()

    def env(self, report: Path) -> dict[str, str]:
        return {**os.environ, **agent_env(), "COLUMNS": "160", "MEMDIAG_SIM_LAUNCH_HOST": self.launch_host,
                "MEMDIAG_SIM_RUN_ROOT": str(self.runs), "MEMDIAG_SIM_REPORT": str(report)}

    def memdiag(self, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, Path]:
        """``memdiag ARGS`` across the simulated hosts; returns its result and the folder where each
        host's agent lists what the host's daemon left in /tmp."""
        report = self.reports / uuid.uuid4().hex[:8]
        report.mkdir()
        result = subprocess.run([PYTHON, "-m", "memdiag", *args], capture_output=True, text=True,
                                timeout=timeout, cwd=ROOT, env=self.env(report), stdin=subprocess.DEVNULL)
        return result, report

    def left_in_tmp(self, report: Path, hosts: set[str], wait_s: float = 20.0) -> dict[str, list[str]]:
        """host -> entries its temporary directory held once its daemon had exited (the directory itself
        vanished with the host's namespace), from every daemon that ran on it. Waits for each host's list: the agent
        writes it just after its daemon exits, which can be a moment after mpirun returns."""
        deadline = time.monotonic() + wait_s
        while True:
            lists = sorted(report.glob("*.tmp-left"))
            seen = {path.name.split("-")[0] for path in lists}
            if hosts <= seen or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        left: dict[str, list[str]] = {}
        for path in lists:
            left.setdefault(path.name.split("-")[0], []).extend(path.read_text().split())
        return left

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def processes_matching(*needles: str) -> list[str]:
    """Command lines of running processes that contain every one of ``needles`` (this one's left out)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout  # whole lines
    own = str(os.getpid())
    return [line.strip() for line in out.splitlines()
            if line.split(None, 1)[0] != own and all(n in line for n in needles)]
