#!/usr/bin/env bash
# One idempotent set-up for memdiag on Debian 12 / Python 3.11:
# OpenMPI (Debian), a virtualenv in the checkout, tensorflow-cpu 2.15.1, Horovod 0.28.1 built
# from source against that TensorFlow and MPI, mpi4py, memdiag itself (editable) and its test tools.
# Re-running it when everything is in place takes seconds: each step checks before it acts.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MEMDIAG_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

# TF >= 2.16 brings Keras 3 and Horovod 0.28.1 builds against neither 2.19 nor 2.21: pin 2.15.1.
TF_SPEC="tensorflow-cpu==2.15.1"
HVD_VERSION="0.28.1"

say() { printf '[setup] %s\n' "$*"; }
export TF_CPP_MIN_LOG_LEVEL=2

SETUP_TAG=setup
# shellcheck source=scripts/retry.sh
source "$ROOT/scripts/retry.sh"  # retry CMD...: up to 3 tries

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    say "installing OpenMPI from Debian's packages"
    retry $SUDO apt-get update -qq
    retry env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi
for tool in cmake g++; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        say "installing build tools"
        retry $SUDO apt-get update -qq
        retry env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake g++ >/dev/null
        break
    fi
done

STAMP="$VENV/.memdiag-installed"
# Everything in place (the common case: every make target runs this first): one interpreter start that
# imports TensorFlow once checks it all, rather than one per step below.
ready() {
    "$VENV/bin/python" - <<'PY' 2>/dev/null
import sys
import horovod, horovod.tensorflow as hvd, mpi4py.MPI, tensorflow as tf  # noqa: F401
import memdiag.cli  # noqa: F401  installed (editable)
from memdiag import nativemarks as nm
if tf.__version__ != "2.15.1" or horovod.__version__ != "0.28.1" or not hvd.mpi_built():
    sys.exit(1)
if nm.needs_build():
    sys.exit(1)  # the native marks to build (again)
print(f"[setup] ready: TensorFlow {tf.__version__}, Horovod {horovod.__version__} (MPI built: {hvd.mpi_built()})")
PY
}
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ ! "$ROOT/pyproject.toml" -nt "$STAMP" ] && ready; then
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$PY" -m venv "$VENV"
    retry "$VENV/bin/pip" install -q --upgrade pip wheel setuptools
fi
VPY="$VENV/bin/python"
PIP="$VENV/bin/pip"

if ! "$VPY" -c "import tensorflow as tf, sys; sys.exit(tf.__version__ != '2.15.1')" >/dev/null 2>&1; then
    say "installing $TF_SPEC"
    retry "$PIP" install -q "$TF_SPEC"
fi

hvd_ok() {
    "$VPY" - <<'PY' >/dev/null 2>&1
import sys
import horovod
import horovod.tensorflow as hvd
sys.exit(0 if horovod.__version__ == "0.28.1" and hvd.mpi_built() else 1)
PY
}
if ! hvd_ok; then
    say "building Horovod $HVD_VERSION with TensorFlow and MPI (about 4 minutes)"
    retry env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 \
        "$PIP" install -q --no-build-isolation "horovod==$HVD_VERSION"
fi

if ! "$VPY" -c "import mpi4py.MPI" >/dev/null 2>&1; then
    say "building mpi4py against the system OpenMPI"
    retry "$PIP" install -q --no-binary mpi4py mpi4py
fi

if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    say "installing memdiag (editable) with its test tools and TensorBoard's server"
    retry "$PIP" install -q -e "$ROOT[test,tensorboard]"
    touch "$STAMP"
fi

# memdiag's native marks (the default; MEMDIAG_MARKS=python opts out): built for this TensorFlow; where the
# build fails, memdiag marks collectives through Python, and each rank's start record says why.
if ! "$VPY" -c "from memdiag import nativemarks as nm; import sys; sys.exit(nm.needs_build())" >/dev/null 2>&1; then
    say "building memdiag's native marks (memdiag/native/mark_op.cc)"
    "$VPY" -m memdiag.nativemarks build || say "native marks not built: memdiag marks collectives through Python"
fi

"$VPY" - <<'PY'
import horovod, horovod.tensorflow as hvd, tensorflow as tf  # importing horovod.tensorflow proves TF support
if not hvd.mpi_built():
    raise SystemExit("[setup] Horovod is not built with MPI; remove .venv and run again")
print(f"[setup] ready: TensorFlow {tf.__version__}, Horovod {horovod.__version__} "
      f"(MPI built: {hvd.mpi_built()})")
PY
