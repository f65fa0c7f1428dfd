#!/usr/bin/env bash
# Makes a virtualenv with numpy, rich, psutil and pytest for each older Python found (pyenv's, or
# python3.9 / python3.10 on PATH), then runs tests/unit/test_python_versions.py against them and the
# unit tests that need no TensorFlow under each. Prints the interpreters tried and the outcomes.
set -u
cd "$(dirname "$0")/.."
found=()
for version in 3.9 3.10; do
  for candidate in "$HOME"/.pyenv/versions/"$version".*/bin/python "$(command -v "python$version" || true)"; do
    if [ -x "$candidate" ]; then found+=("$version:$candidate"); break; fi
  done
done
pythons=()
for entry in "${found[@]}"; do
  version=${entry%%:*}; python=${entry#*:}
  venv="${TMPDIR:-/tmp}/memdiag-python$version"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/pip" install -q "numpy<2" rich psutil typing_extensions pytest hypothesis pytest-timeout matplotlib >/dev/null 2>&1
  echo "Python $version: $("$venv/bin/python" --version) at $venv"
  pythons+=("$venv/bin/python")
done
[ ${#pythons[@]} -gt 0 ] || { echo "no Python 3.9 or 3.10 found"; exit 0; }
MEMDIAG_PYTHONS=$(IFS=:; echo "${pythons[*]}") .venv/bin/python -m pytest -q tests/unit/test_python_versions.py | tail -1
for python in "${pythons[@]}"; do
  echo "the unit tests under $("$python" --version), in a virtualenv without TensorFlow, Horovod, mpi4py or memray"
  echo "(the tests that need one of them fail or error there: read each reason with --tb=short):"
  PYTHONPATH=. "$python" -m pytest -q -p no:cacheprovider -m "not mpi and not slow and not slurm" tests/unit \
    --continue-on-collection-errors -rfE 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed"
done
