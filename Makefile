# splitlab: `make demo` runs the whole pipeline on generated data, `make test` runs the tests.
# Both create .venv and install the project with its dev extras when that is missing.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-distributed test-slow test-slurm lint format clean gpu-check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/splitlab demo --out runs/demo

# Two workers (pytest-xdist, whole files each, the long twins first: tests/conftest.py), one thread
# each: the tiny models are mostly Python, so two processes use both cores where one did not.
test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "not slow and not slurm and not distributed" -n 2 --dist loadfile \
		--no-loadscope-reorder --durations=15  # the slowest tests, to keep the suite under 15 min

# Training on two CPU ranks (DDP and FSDP over gloo): each run takes both cores, so one at a time (~4 min).
test-distributed: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m "distributed and not slow" --durations=5

# On a machine with a GPU: CUDA tests and the paper's benchmarks (<= 8 min), results in $${OUT:-runs/gpu-check}.
gpu-check: $(STAMP)
	BIN=$(BIN) bash scripts/gpu-check.sh

# The project's sbatch scripts under a real single-node SLURM (scripts/slurm-local.sh starts it; needs
# Debian's slurm-wlm and munge, which .ci/run installs): requeues on a time limit and on demand (~10 min).
test-slurm: $(STAMP)
	$(BIN)/python -m pytest -m slurm -rs tests/slurm

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow -s

lint: $(STAMP)
	$(BIN)/ruff check splitlab tests examples
	$(BIN)/ruff format --check splitlab tests examples

format: $(STAMP)
	$(BIN)/ruff format splitlab tests examples
	$(BIN)/ruff check --fix splitlab tests examples

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
