"""The multi-host tests' probe (tests/hosts/simulated.py): a skip only where the host running the tests
refuses a simulated host's namespaces, a failure for anything else. Real ``unshare``, no MPI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hosts.simulated import SetupError, namespaces_unavailable

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("unshare") is None,
                                reason="the probe runs unshare, on Linux")


def test_a_process_without_cap_sys_admin_is_refused_the_namespaces_and_told_why():
    # GIVEN the probe in a process without CAP_SYS_ADMIN (root drops it from its bounding set with
    # setpriv; any other user has not got it)
    probe = [sys.executable, "-c", "from tests.hosts.simulated import namespaces_unavailable as u; print(u())"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv (util-linux) is needed to drop CAP_SYS_ADMIN")
        probe = ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin", *probe]
    # WHEN it probes
    result = subprocess.run(probe, capture_output=True, text=True, timeout=60, cwd=ROOT, stdin=subprocess.DEVNULL)
    # THEN it returns the kernel's refusal as the reason to skip, and raises nothing
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("the host running the tests refuses a simulated host's UTS and mount namespaces"), \
        result.stdout
    assert "Operation not permitted" in result.stdout


def test_a_probe_that_fails_for_another_reason_is_a_setup_error_not_a_skip(tmp_path):
    if namespaces_unavailable() is not None:
        pytest.skip("the host running the tests refuses the namespaces, so the probe never reaches the mount")
    # WHEN the tmpfs is to be mounted where no directory exists
    with pytest.raises(SetupError) as raised:
        namespaces_unavailable(tmp_path / "absent")
    # THEN the error names the mount's own complaint
    assert "absent" in str(raised.value) and "does not exist" in str(raised.value)
