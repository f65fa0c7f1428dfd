# Each target sets up what it needs first; `make setup` alone is idempotent and takes seconds when done.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast bench clean-runs

setup:
	bash scripts/setup.sh

# The main job on its built-in default: sparse, dense and auto on 1, 2 and 4 ranks.
demo: setup
	$(VENV)/bin/memdiag compare sparse-vs-dense transformer --preset small -n 1,2,4

test: setup
	$(PY) -m pytest -q

# Unit tests only (no mpirun).
test-fast: setup
	$(PY) -m pytest -q -m "not mpi"

clean-runs:
	rm -rf runs
