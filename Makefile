# The two set-up commands: `make demo` and `make test` each install what they need first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: install demo test test-fast test-unit test-dist bench clean

install:
	bash scripts/install-deps.sh --venv $(VENV)

# The main job: 2 ranks on this machine, digits (bundled with scikit-learn, no download).
# It starts over in runs/demo each time and fails unless the final test accuracy is >= 0.95.
DEMO_DIR := runs/demo
demo: install
	rm -rf $(DEMO_DIR)
	$(BIN)/horovodrun -np 2 --hostfile hostfiles/localhost.hostfile $(BIN)/hvdtrain --dataset digits --no-cuda \
	    --epochs 10 --lr 0.05 --log-interval 0 --output-dir $(DEMO_DIR)
	$(PY) scripts/check-accuracy.py $(DEMO_DIR)/metrics.jsonl 0.95

# The whole suite, as CI runs it; the 15 slowest tests are listed at the end. Two test
# processes (pytest-xdist): about half of a launched job's time is spent waiting (start-up,
# rendezvous, timeouts), so a second one fills the cores. Tests that share one job carry
# the same xdist_group mark and run in one process (docs/development.md).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -ra --durations=15 -n $(TEST_WORKERS) --dist loadgroup
test: install
	$(PYTEST) tests

# While iterating: everything but the tests marked `slow` (minutes each; CI still runs them).
test-fast: install
	$(PYTEST) -m "not slow" tests

test-unit: install
	$(PY) -m pytest -q -ra tests/unit

test-dist: install
	$(PY) -m pytest -q -ra tests/dist

bench: install
	mkdir -p runs
	$(PY) scripts/bench.py --json runs/bench.json

clean:
	rm -rf runs .pytest_cache
