"""How memdiag ends a launcher it started (a timeout, SIGTERM or Ctrl-C to memdiag): mpirun puts each
local rank in a process group of its own, so the ranks must be signalled by process, and at once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from memdiag.launch import mpirun

# A stand-in for mpirun: in its own session (as memdiag starts it), it starts one "rank" in a process
# group of its own (as Open MPI's odls does) and ignores SIGTERM itself, as mpirun does while its waits
# between SIGCONT, SIGTERM and SIGKILL run. The rank writes "terminated" when a SIGTERM reaches it.
_LAUNCHER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    rank = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], preexec_fn=os.setpgrp)
    signal.signal(signal.SIGTERM, lambda *a: None)
    open(sys.argv[1] + ".pid", "w").write(str(rank.pid))
    while True:
        time.sleep(0.1)
""")
_RANK = textwrap.dedent("""
    import signal, sys, time
    def on_term(signum, frame):
        open(sys.argv[1], "w").write("terminated")
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
    open(sys.argv[1] + ".ready", "w").write("")
    while True:
        time.sleep(0.1)
""")


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    mark = tmp_path / "rank"
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(mark), _RANK], start_new_session=True)
    deadline = time.monotonic() + 30
    while not Path(str(mark) + ".ready").exists():
        assert time.monotonic() < deadline, "the stand-in rank did not start"
        time.sleep(0.05)
    return proc, mark


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_rank_in_its_own_process_group_gets_the_sigterm_at_once_and_nothing_survives_the_launcher(
        tmp_path, monkeypatch):
    # GIVEN a launcher that passes nothing on (it ignores SIGTERM) and a rank outside its process group
    proc, mark = _start(tmp_path)
    rank_pid = int(Path(str(mark) + ".pid").read_text())
    monkeypatch.setitem(mpirun._GRACE_S, "mpirun", 0.0)
    monkeypatch.setattr(mpirun, "SIGKILL_TIMEOUT_S", 1)
    # WHEN memdiag ends the launcher's group
    mpirun._end_group(proc, "mpirun")
    # THEN the rank itself was sent SIGTERM (it wrote where it stopped), and the launcher, which outlived
    # its grace, was killed
    assert mark.read_text() == "terminated"
    assert proc.wait(timeout=10) == -9
    deadline = time.monotonic() + 10
    while _alive(rank_pid):
        assert time.monotonic() < deadline, "the rank outlived its launcher"
        time.sleep(0.05)


def test_memdiag_gives_mpirun_a_longer_wait_before_sigkill_unless_the_user_chose_one():
    assert not mpirun._user_chose_sigkill_timeout({}, ["--mca", "btl", "self,tcp"])
    assert mpirun._user_chose_sigkill_timeout({"OMPI_MCA_odls_base_sigkill_timeout": "9"}, [])
    assert mpirun._user_chose_sigkill_timeout({}, ["--mca", "odls_base_sigkill_timeout", "9"])
    assert mpirun.SIGKILL_TIMEOUT_S > 1  # Open MPI's default, too short for a loaded rank to write its end
