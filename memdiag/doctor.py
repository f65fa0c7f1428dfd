"""Environment checks behind ``memdiag doctor``. Each check returns a finding and how to fix it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

# A TensorFlow + Horovod rank of the tiny presets needs about 0.6 GiB, the small preset about 1.3 GiB.
RANK_MEMORY_BYTES = int(1.3 * 2**30)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    finding: str
    fix: str = ""


# The Pythons TensorFlow 2.15 (and so memdiag, with Horovod 0.28.1 built against it) supports.
SUPPORTED_PYTHONS = ((3, 9), (3, 11))


def _python(version_info: tuple[int, ...] = tuple(sys.version_info[:3])) -> Check:
    version = ".".join(map(str, version_info))
    oldest, newest = SUPPORTED_PYTHONS
    if tuple(version_info[:2]) < oldest:
        return Check("python", "fail", version, "use Python 3.9, 3.10 or 3.11 (TensorFlow 2.15's range)")
    if tuple(version_info[:2]) > newest:
        return Check("python", "warn", version, "TensorFlow 2.15, which Horovod 0.28.1 builds against, has no "
                                                "release for this Python: use Python 3.9, 3.10 or 3.11")
    return Check("python", "ok", version)


def _tensorflow() -> Check:
    try:
        import tensorflow as tf
    except ImportError as exc:
        return Check("tensorflow", "fail", f"not importable ({exc})", "run `make setup`")
    if not tf.__version__.startswith("2.15."):
        return Check("tensorflow", "warn", tf.__version__,
                     "Horovod 0.28.1 builds only against TensorFlow <= 2.15 (Keras 3 from 2.16 on): "
                     "pip install tensorflow-cpu==2.15.1, then rebuild Horovod (`make setup`)")
    return Check("tensorflow", "ok", tf.__version__)


# pip keeps an installed horovod 0.28.1, and the wheel it cached from an earlier build, however built.
_REBUILD_HOROVOD = "`pip uninstall -y horovod && pip cache remove horovod && make setup`"


def _horovod() -> Check:
    try:
        import horovod
        import horovod.tensorflow as hvd
    except ImportError as exc:
        return Check("horovod", "fail", f"horovod.tensorflow not importable ({exc})",
                     f"build Horovod with HOROVOD_WITH_TENSORFLOW=1 after TensorFlow: {_REBUILD_HOROVOD}")
    if not hvd.mpi_built():
        return Check("horovod", "fail", f"{horovod.__version__} built without MPI",
                     f"rebuild it with HOROVOD_WITH_MPI=1: {_REBUILD_HOROVOD}")
    return Check("horovod", "ok", f"{horovod.__version__}, TensorFlow and MPI built")


def _mpirun() -> Check:
    path = shutil.which("mpirun")
    if path is None:
        return Check("mpirun", "fail", "not on PATH", "apt-get install openmpi-bin libopenmpi-dev (`make setup`)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("mpirun", "fail", f"{path} does not run ({exc})", "reinstall openmpi-bin")
    version = out.strip().splitlines()[0] if out.strip() else "unknown version"
    return Check("mpirun", "ok", f"{version}; {os.cpu_count()} slots (cores) on this host")


def _mpi4py() -> Check:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        return Check("mpi4py", "fail", f"not importable ({exc})",
                     "pip install --no-binary mpi4py mpi4py (against the system OpenMPI)")
    library = MPI.Get_library_version().strip().splitlines()[0].replace("\x00", "")
    if "Open MPI" not in library:
        return Check("mpi4py", "warn", library, "mpi4py should use the MPI that Horovod was built with")
    return Check("mpi4py", "ok", library.split(",")[0])


def _memray() -> Check:
    try:
        import memray
    except ImportError as exc:
        return Check("memray", "fail", f"not importable ({exc})", "pip install memray (needed for --memray)")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with memray.Tracker(os.path.join(tmp, "probe.bin"), native_traces=True):
                bytearray(1 << 16)
        except Exception as exc:  # noqa: BLE001 - any failure means --memray will not work here
            return Check("memray", "warn", f"native tracking failed ({exc})", "--memray will not work on this host")
    return Check("memray", "ok", f"{getattr(memray, '__version__', '?')}, native traces work")


def _memory(world_size: int) -> Callable[[], Check]:
    def check() -> Check:
        import psutil

        available = psutil.virtual_memory().available
        per_rank = available / world_size
        finding = f"{available / 2**30:.1f} GiB available, {per_rank / 2**30:.2f} GiB per rank at -n {world_size}"
        if per_rank < RANK_MEMORY_BYTES:
            return Check("memory", "warn", finding,
                         f"fewer ranks per host, or smaller presets: a rank needs about "
                         f"{RANK_MEMORY_BYTES / 2**30:.1f} GiB with --preset small")
        return Check("memory", "ok", finding)

    return check


def _cores(world_size: int) -> Callable[[], Check]:
    def check() -> Check:
        cores = os.cpu_count() or 1
        if world_size > cores:
            return Check("cores", "warn", f"{world_size} ranks on {cores} cores",
                         "runs work (--oversubscribe) but step times measure contention, not scaling")
        return Check("cores", "ok", f"{world_size} ranks on {cores} cores")

    return check


def run_checks(world_size: int) -> list[Check]:
    checks = [_python, _tensorflow, _horovod, _mpirun, _mpi4py, _memray, _memory(world_size), _cores(world_size)]
    return [check() for check in checks]
