"""The one-node Slurm cluster of scripts/slurm_local.sh, for the Slurm tier (`make test-slurm`).

`make test-slurm` starts the cluster before the tier and stops it after; run alone (pytest
tests/slurm), the tier starts it itself and stops what it started. The tier is skipped only when Slurm
cannot be installed here (no apt-get, or not root and no sudo); a cluster that is installed but does
not come up is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "slurm_local.sh"
DEFAULT_CONF = "/var/tmp/memdiag-slurm/slurm.conf"


def _up(conf: str) -> bool:
    if shutil.which("sinfo") is None or not os.path.exists(conf):
        return False
    state = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=30,
                           env={**os.environ, "SLURM_CONF": conf})
    return state.returncode == 0 and any(s in state.stdout for s in ("idle", "mixed", "allocated"))


def _installable() -> str | None:
    """Why Slurm cannot be installed here, or None."""
    if shutil.which("slurmctld") and shutil.which("munged"):
        return None
    if shutil.which("apt-get") is None:
        return "no apt-get: scripts/slurm_local.sh installs Debian's slurm-wlm and munge"
    if os.geteuid() != 0 and shutil.which("sudo") is None:
        return "not root and no sudo: the Slurm daemons are installed and run as root"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """SLURM_CONF of a running one-node cluster (set in the environment for the tests' commands)."""
    conf = os.environ.get("SLURM_CONF", DEFAULT_CONF)
    started = False
    if not _up(conf):
        reason = _installable()
        if reason is not None:
            pytest.skip(f"Slurm cannot be installed here: {reason}")
        result = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout + result.stderr
        started = True
        conf = DEFAULT_CONF
        assert _up(conf), f"scripts/slurm_local.sh started, but the node is not up: see {os.path.dirname(conf)}"
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if started:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)
