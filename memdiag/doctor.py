"""Environment checks behind ``memdiag doctor``. Each check returns a finding and how to fix it."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

# What a TensorFlow + Horovod rank of the small preset (make demo's) needs; a rank of the tiny presets
# needs about half of it (measured: docs/notes/code-figures.md#doctor-rank-memory).
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


def in_checkout() -> bool:
    """Whether memdiag runs from its own checkout (``make setup`` is there) rather than installed into
    an environment of the user's (``pip install``): the fixes say what fits."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.isfile(os.path.join(root, "scripts", "setup.sh")) and os.path.isfile(os.path.join(root, "Makefile"))


HOROVOD_VERSION = "0.28.1"  # the Horovod memdiag's hooks are written and tested against
_BUILD_FLAGS = "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1"


def _rebuild_horovod(checkout: bool) -> str:
    """How to rebuild Horovod; pip keeps an installed horovod, and the wheel it cached from an earlier
    build, however either was built."""
    if checkout:
        return "`pip uninstall -y horovod && pip cache remove horovod && make setup`"
    return (f"`pip uninstall -y horovod && pip cache remove horovod && {_BUILD_FLAGS} pip install --no-build-isolation "
            f"horovod=={HOROVOD_VERSION}`, with this TensorFlow installed and the mpicxx of the MPI you launch with first "
            "on PATH")


def _tensorflow(checkout: bool | None = None) -> Check:
    checkout = in_checkout() if checkout is None else checkout
    try:
        import tensorflow as tf
    except ImportError as exc:
        return Check("tensorflow", "fail", f"not importable ({exc})",
                     "run `make setup`" if checkout else "pip install tensorflow-cpu==2.15.1 (or tensorflow==2.15.1)")
    if not tf.__version__.startswith("2.15."):
        return Check("tensorflow", "warn", tf.__version__,
                     f"Horovod {HOROVOD_VERSION} builds only against TensorFlow <= 2.15 (Keras 3 from 2.16 on): "
                     f"pip install tensorflow-cpu==2.15.1, then rebuild Horovod: {_rebuild_horovod(checkout)}; "
                     "memdiag's --engine tf-distribute runs on this TensorFlow without Horovod")
    return Check("tensorflow", "ok", tf.__version__)


def keras_mismatch(tensorflow: str, keras: str | None) -> str | None:
    """Why the installed Keras does not go with the installed TensorFlow, or None. TensorFlow 2.15 and
    older use the Keras of their own minor version (``tf.keras``); 2.16 on use Keras 3 (or tf_keras)."""
    if keras is None:
        return None
    tf_minor = tuple(int(p) for p in tensorflow.split(".")[:2] if p.isdigit())
    keras_parts = tuple(int(p) for p in keras.split(".")[:2] if p.isdigit())
    if len(tf_minor) < 2 or len(keras_parts) < 2:
        return None
    if tf_minor <= (2, 15) and keras_parts != tf_minor:
        return (f"TensorFlow {tensorflow} needs Keras {tf_minor[0]}.{tf_minor[1]} (tf.keras); Keras {keras} is installed: "
                f"pip install keras=={tf_minor[0]}.{tf_minor[1]}.*")
    return None


def _keras() -> Check:
    try:
        import tensorflow as tf
    except ImportError:
        return Check("keras", "ok", "no TensorFlow (see its check)")
    try:
        from importlib.metadata import PackageNotFoundError, version

        keras: str | None = version("keras")
    except PackageNotFoundError:
        keras = None
    problem = keras_mismatch(tf.__version__, keras)
    if problem:
        return Check("keras", "fail", f"Keras {keras} with TensorFlow {tf.__version__}", problem)
    return Check("keras", "ok", f"Keras {keras}" if keras else "no keras package (TensorFlow's own tf.keras)")


def horovod_failure(exc: BaseException, checkout: bool) -> Check:
    """The horovod check for an import of horovod.tensorflow that raised ``exc``."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if "undefined symbol" in text:
        return Check("horovod", "fail", f"horovod.tensorflow does not load ({text})",
                     "Horovod was built against another TensorFlow than the one installed; rebuild it against this one: "
                     + _rebuild_horovod(checkout))
    if isinstance(exc, ModuleNotFoundError) and exc.name == "horovod":
        return Check("horovod", "fail", "not installed", "build it with TensorFlow and MPI: " + _rebuild_horovod(checkout))
    return Check("horovod", "fail", f"horovod.tensorflow not importable ({text})",
                 f"build Horovod with HOROVOD_WITH_TENSORFLOW=1 after TensorFlow: {_rebuild_horovod(checkout)}")


def _horovod(checkout: bool | None = None) -> Check:
    checkout = in_checkout() if checkout is None else checkout
    try:
        import horovod
        import horovod.tensorflow as hvd
    except Exception as exc:  # noqa: BLE001 - an ImportError, or TensorFlow's NotFoundError of a library built for another TF
        return horovod_failure(exc, checkout)
    if not hvd.mpi_built():
        return Check("horovod", "fail", f"{horovod.__version__} built without MPI",
                     f"rebuild it with HOROVOD_WITH_MPI=1: {_rebuild_horovod(checkout)}")
    if horovod.__version__ != HOROVOD_VERSION:
        return Check("horovod", "warn", f"{horovod.__version__}, TensorFlow and MPI built",
                     f"memdiag's hooks are tested with Horovod {HOROVOD_VERSION}; with another version a collective it does "
                     "not recognise runs unlabelled (the report names it)")
    return Check("horovod", "ok", f"{horovod.__version__}, TensorFlow and MPI built")


# -- which MPI: Horovod's library, mpi4py's and mpirun must be one MPI --------------------------------

OPEN_MPI, MPICH_ABI = "Open MPI", "MPICH ABI (MPICH, Intel MPI, MVAPICH)"
_SONAMES = {"libmpi.so.40": OPEN_MPI, "libmpi.so.20": OPEN_MPI, "libmpi.so.12": MPICH_ABI, "libmpich.so.12": MPICH_ABI}


def linked_mpi(ldd_output: str) -> tuple[str, str] | None:
    """(family, resolved path) of the MPI library in ``ldd``'s output for a shared object, or None."""
    for line in ldd_output.splitlines():
        name, _, rest = line.strip().partition(" => ")
        if name in _SONAMES:
            return _SONAMES[name], rest.split(" (")[0].strip()
    return None


def mpirun_family(version_output: str) -> str | None:
    """The MPI family ``mpirun --version`` names, or None when it names none memdiag knows."""
    if "Open MPI" in version_output or "OpenRTE" in version_output:
        return OPEN_MPI
    if any(word in version_output for word in ("HYDRA", "MPICH", "Intel(R) MPI", "MVAPICH")):
        return MPICH_ABI
    return None


def _linked(shared_object: str) -> tuple[str, str] | None:
    try:
        out = subprocess.run(["ldd", shared_object], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return linked_mpi(out)


def _mpi_match() -> Check:
    """Horovod's MPI library, mpi4py's and mpirun's: one MPI, or ranks that cannot start (or that start
    as N jobs of one rank each)."""
    import glob
    import importlib.util

    found: dict[str, tuple[str, str]] = {}
    for module, pattern in (("horovod", os.path.join("tensorflow", "mpi_lib*.so")), ("mpi4py", "MPI*.so")):
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            continue
        libraries = glob.glob(os.path.join(list(spec.submodule_search_locations)[0], pattern))
        linked = _linked(libraries[0]) if libraries else None
        if linked:
            found[module] = linked
    path = shutil.which("mpirun")
    version = _mpirun_version(path) if path else None
    launcher = mpirun_family(version) if isinstance(version, str) else None
    families = {f"{module}: {family}" for module, (family, _) in found.items()}
    if launcher:
        families.add(f"mpirun: {launcher}")
    finding = "; ".join(sorted(families)) or "no MPI library found to compare"
    if len({family for family, _ in found.values()} | ({launcher} if launcher else set())) > 1:
        return Check("mpi match", "fail", finding,
                     "Horovod, mpi4py and mpirun must come from one MPI: rebuild Horovod and mpi4py with the mpicc/mpicxx of "
                     "the MPI whose mpirun launches the job (first on PATH), or put that MPI's bin first on PATH")
    paths = {p for _, p in found.values()}
    if len(paths) > 1:
        return Check("mpi match", "warn", finding + " (" + ", ".join(sorted(paths)) + ")",
                     "Horovod and mpi4py load different copies of the MPI library: rebuild mpi4py "
                     "(pip install --no-binary mpi4py mpi4py) with the MPI Horovod was built with")
    return Check("mpi match", "ok", finding)


def _native_marks() -> Check:
    """Whether ranks mark collectives with memdiag's native op (the default) or through Python."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return Check("native marks", "ok", "no TensorFlow (see its check)")
    from memdiag import nativemarks as nm

    try:
        _, word = nm.load({})
    except Exception as exc:  # noqa: BLE001 - the doctor reports, it does not fail
        word = f"python ({type(exc).__name__}: {exc})"
    if word == "native":
        return Check("native marks", "ok", "built for this TensorFlow")
    why = word.removeprefix("python (").removesuffix(")").replace(f": {nm.BUILD}", "")
    return Check("native marks", "warn", f"{why}: ranks mark collectives through Python (slower)",
                 f"{nm.BUILD} (needs g++)" + (", or `make setup`" if in_checkout() else ""))


@functools.cache
def _mpirun_version(path: str) -> str | Exception:
    """``mpirun --version``'s output, or why it did not run; once per doctor (two checks read it)."""
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return exc


def _mpirun() -> Check:
    path = shutil.which("mpirun")
    if path is None:
        return Check("mpirun", "fail", "not on PATH",
                     "apt-get install openmpi-bin libopenmpi-dev (`make setup`), or load your cluster's MPI module")
    out = _mpirun_version(path)
    if not isinstance(out, str):
        return Check("mpirun", "fail", f"{path} does not run ({out})", "reinstall openmpi-bin")
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
    checks: list[Callable[[], Check]] = [_python, _tensorflow, _keras, _horovod, _mpirun, _mpi4py, _mpi_match,
                                         _native_marks, _memray, _memory(world_size), _cores(world_size)]
    return [check() for check in checks]
