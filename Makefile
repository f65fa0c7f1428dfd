# Each target sets up what it needs first; `make setup` alone is idempotent and takes seconds when done.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-tf-latest demo test test-slow test-tf-latest test-slurm test-fast lint bench clean-runs

setup:
	bash scripts/setup.sh

# The optional second environment (issue 12): newest tensorflow-cpu with Keras 3, mpi4py, no Horovod.
setup-tf-latest:
	bash scripts/setup_tf_latest.sh

# The main job on its built-in default: sparse, dense and auto on 1, 2 and 4 ranks. TensorFlow's pooled
# CPU allocator (oneDNN's) is turned off for it, so that RSS follows the tensors alive rather than the
# pool's levels (docs/explanation/measurement.md); the report names the setting. memdiag itself never sets it.
demo: setup
	TF_ENABLE_ONEDNN_OPTS=0 $(VENV)/bin/memdiag compare sparse-vs-dense transformer --preset small -n 1,2,4

# The suite a developer runs: unit tests and the core integration tests, of the Horovod engine (pytest 13 min 53 s
# and 13 min 55 s on 2 cores in the last two measurements, 1705 tests; 16 min 38 s before the tf-distribute engine's integration tests
# moved to the extended tier; the goal is 12; two pytest workers do not shorten it: docs/notes/performance.md).
test: setup lint
	$(PY) -m pytest -q -m "not slow and not slurm and not tfdist"

# The extended tier: memray attribution, every example script against plain mpirun, multi-host studies, the
# third-party scripts, and the tf-distribute engine's integration tests (make test-tf-latest runs those again
# under the newest TensorFlow).
test-slow: setup
	$(PY) -m pytest -q -m "(slow or tfdist) and not slurm"

lint: setup
	$(VENV)/bin/ruff check memdiag tests probes examples
	$(VENV)/bin/mypy memdiag

# The tf-distribute tests again, with memdiag and the scripts run by .venv-tf-latest's Python (the newest
# tensorflow-cpu, Keras 3, no Horovod); pytest itself runs from .venv. Tests that need Horovod are left out.
test-tf-latest: setup setup-tf-latest
	MEMDIAG_TEST_PYTHON=$(CURDIR)/.venv-tf-latest/bin/python $(PY) -m pytest -q -m "tfdist and not horovod"

# The Slurm tier (tests/slurm): memdiag under sbatch, srun, salloc + mpirun and horovodrun on a one-node
# cluster that scripts/slurm_local.sh installs and starts first, and stops afterwards even when a test fails.
test-slurm: setup
	status=0; bash scripts/slurm_local.sh start && eval "$$(bash scripts/slurm_local.sh env)" && \
		$(PY) -m pytest -q -m slurm tests/slurm || status=$$?; \
	bash scripts/slurm_local.sh stop; exit $$status

# Unit tests only (no mpirun).
test-fast: setup
	$(PY) -m pytest -q -m "not mpi"

clean-runs:
	rm -rf runs
