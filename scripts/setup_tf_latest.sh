#!/usr/bin/env bash
# The optional second environment for the tf-distribute engine (issue 12): `.venv-tf-latest`, a
# Python 3.11 virtualenv with the newest tensorflow-cpu the package index serves, Keras 3, mpi4py
# built against the system OpenMPI, and numpy. No Horovod: it does not build against TF >= 2.19.
# memdiag is installed here too (editable, without its dependency list: that pins numpy<2 and memray,
# which this environment decides for itself), so that `memdiag run --engine tf-distribute` and the
# tf-distribute tests run under the newest TensorFlow (`make test-tf-latest`).
#
# Idempotent: when the stamp is present and the packages are those it lists (or the imports work), it
# finishes in seconds without asking the index anything. MEMDIAG_TF_LATEST_UPGRADE=1 asks the index again and upgrades.
#
# numpy: memdiag pins numpy<2 (TF 2.15 is built against NumPy 1). The newest TensorFlow may need
# NumPy 2; this script first tries numpy<2 and keeps it only if TensorFlow and Keras import and run
# a gradient with it, and otherwise lets pip install NumPy 2.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MEMDIAG_TF_LATEST_VENV:-$ROOT/.venv-tf-latest}"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/.tf-latest-ready"

say() { printf '[setup-tf-latest] %s\n' "$*"; }
export TF_CPP_MIN_LOG_LEVEL=2

SETUP_TAG=setup-tf-latest
# shellcheck source=scripts/retry.sh
source "$ROOT/scripts/retry.sh"  # retry CMD...: up to 3 tries

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    say "installing OpenMPI from Debian's packages"
    retry $SUDO apt-get update -qq
    retry env DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
fi

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "[setup-tf-latest] $PY not found (set PYTHON=...)" >&2
    exit 1
fi

# The check that every step must leave true: TF, Keras 3 and mpi4py import, and a gradient runs.
smoke() {
    "$VENV/bin/python" - <<'PY'
import numpy as np
import tensorflow as tf
import keras
import mpi4py.MPI  # noqa: F401  built against the system OpenMPI
assert keras.__version__.startswith("3."), keras.__version__
v = tf.Variable(tf.ones([4, 2]))
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(tf.gather(v, [0, 2, 2]))
g = tape.gradient(loss, v)
assert isinstance(g, tf.IndexedSlices), type(g)
assert np.asarray(tf.convert_to_tensor(g)).sum() == 6.0
print(f"[setup-tf-latest] ready: TensorFlow {tf.__version__}, Keras {keras.__version__}, "
      f"numpy {np.__version__}, mpi4py {mpi4py.__version__} ({mpi4py.MPI.Get_library_version().splitlines()[0]})")
PY
}

memdiag_ok() {
    "$VENV/bin/python" -c "import memdiag.cli, psutil" >/dev/null 2>&1
}

# The packages as the smoke test last passed with them (the stamp; memdiag's own line names its checkout):
# nothing changed since, so the check above still holds without importing TensorFlow again.
unchanged() {
    [ -f "$STAMP" ] && cmp -s <("$VENV/bin/pip" freeze 2>/dev/null | grep -vi memdiag) <(grep -vi memdiag "$STAMP")
}

if [ -f "$STAMP" ] && [ "${MEMDIAG_TF_LATEST_UPGRADE:-0}" != 1 ] && memdiag_ok && { unchanged || smoke 2>/dev/null; }; then
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV ($("$PY" --version))"
    "$PY" -m venv "$VENV"
    retry "$VENV/bin/pip" install -q --upgrade pip wheel setuptools
fi
PIP="$VENV/bin/pip"

newest_tf="$(retry "$PIP" index versions tensorflow-cpu 2>/dev/null | sed -n 's/^tensorflow-cpu (\(.*\))$/\1/p')"
if [ -z "$newest_tf" ]; then
    echo "[setup-tf-latest] could not ask the index for tensorflow-cpu's versions" >&2
    exit 1
fi
say "newest tensorflow-cpu served: $newest_tf"

say "installing tensorflow-cpu==$newest_tf, keras and numpy<2"
retry "$PIP" install -q --upgrade "tensorflow-cpu==$newest_tf" keras "numpy<2"

if ! "$VENV/bin/python" -c "import mpi4py.MPI" >/dev/null 2>&1; then
    say "building mpi4py against the system OpenMPI"
    retry "$PIP" install -q --no-binary mpi4py mpi4py
fi

if ! smoke; then
    say "numpy<2 does not work with tensorflow-cpu $newest_tf: installing NumPy 2"
    retry "$PIP" install -q --upgrade "numpy>=2"
    smoke
fi
if ! memdiag_ok; then
    say "installing memdiag (editable) with psutil and rich"
    retry "$PIP" install -q psutil rich
    retry "$PIP" install -q --no-deps -e "$ROOT"
    memdiag_ok
fi
"$PIP" freeze > "$STAMP"
