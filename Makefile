# The two commands of a new user (README): `make test` and `make demo`. Both create .venv on first
# use and install the pinned CPU torch first (any other torch spec pulls gigabytes of CUDA wheels),
# then the package with the extras the tests and the demo need.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest-xdist workers: two keep both cores busy through the single-threaded parts of the tests
# (imports, tracing, XLA compiles, subprocess launches); `make test TEST_WORKERS=0` runs in-process.
TEST_WORKERS ?= 2
# Whole modules go to a worker (their module fixtures, e.g. multi-process runs, run once), in the
# order tests/conftest.py sorts them: the modules of slow tests first.
DIST := $(if $(filter 0,$(TEST_WORKERS)),,--dist loadscope --no-loadscope-reorder)

.PHONY: install test demo clean-runs

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(DIST) --durations=15

demo: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" bash launch/demo.sh

clean-runs:
	rm -rf runs/demo
