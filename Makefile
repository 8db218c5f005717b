# The two set-up commands: `make demo` and `make test` each install what they need first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin

.PHONY: install ecosystem demo test test-fast test-unit test-dist bench clean

install:
	bash scripts/install-deps.sh --venv $(VENV)

# Test-only: GluonCV and GluonNLP, whose models, metrics, losses and samplers the suite runs
# unchanged, in a folder of their own that only the tests using them put on their path
# (tests/ecosystem.py: with scipy in the venv every `import mxnet` imported scipy.stats too).
# A venv an older `make` put them in loses them here.
ECOSYSTEM_DIR := .ecosystem
ECOSYSTEM_PIP := $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt \
    --no-deps --target $(ECOSYSTEM_DIR)
ecosystem: install
	PYTHONPATH=$(ECOSYSTEM_DIR) $(PY) -c "import gluoncv, gluonnlp" 2>/dev/null || { \
	    rm -rf $(ECOSYSTEM_DIR) && $(ECOSYSTEM_PIP) -r tests/ecosystem-requirements.txt && \
	    rm -rf $(ECOSYSTEM_DIR)/tests; }
	! $(PY) -c "import scipy" 2>/dev/null || \
	    $(PY) -m pip uninstall -y -q gluoncv gluonnlp scipy portalocker

# The main job: 2 ranks on this machine, digits (bundled, no download).
# It starts over in runs/demo each time and fails unless the final test accuracy is >= 0.95.
DEMO_DIR := runs/demo
demo: install
	rm -rf $(DEMO_DIR)
	$(BIN)/horovodrun -np 2 --hostfile hostfiles/localhost.hostfile $(BIN)/hvdtrain --dataset digits --no-cuda \
	    --epochs 10 --lr 0.05 --log-interval 0 --output-dir $(DEMO_DIR)
	$(PY) scripts/check-accuracy.py $(DEMO_DIR)/metrics.jsonl 0.95

# The whole suite, as CI runs it; the slowest tests are listed at the end. Tests marked
# `alone` (elastic jobs, whose recovery depends on Gloo's timeout) run after the others,
# test by test in two processes (--dist load): they mostly wait, and beside the rest of the
# suite a joining worker once missed the timeout.
# The others run in four test processes (pytest-xdist; TEST_WORKERS=0 for one): each test
# file whole in one of them, long files first (--dist loadfile --no-loadscope-reorder,
# tests/conftest.py), so a module fixture's job starts once and the documented lines of
# test_readme_commands.py run in order. While a test waits (for a timeout, or for ranks it
# started over ssh) its process uses no CPU; a third process used the core meanwhile
# (13:57 instead of 14:31 for that part), a fourth since 2026-12-08: the profiled run kept
# the two cores 71% busy at three (docs/development.md).
TEST_WORKERS ?= 4
ALONE_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -ra
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The suite starts about a thousand Python processes; with PYTHONDONTWRITEBYTECODE set (as
# on CI's machines) each would compile hvdtrain's modules again: compile them once first.
COMPILE := $(PY) -m compileall -q hvdtrain tests scripts examples > /dev/null
test: ecosystem
	$(COMPILE)
	$(PYTEST) --durations=15 $(PARALLEL) -m "not alone" tests
	$(PYTEST) --durations=5 -n $(ALONE_WORKERS) --dist load -m alone tests

# While iterating: everything but the tests marked `slow` (minutes each; CI still runs them).
test-fast: ecosystem
	$(COMPILE)
	$(PYTEST) --durations=15 $(PARALLEL) -m "not slow and not alone" tests
	$(PYTEST) --durations=5 -n $(ALONE_WORKERS) --dist load -m "alone and not slow" tests

test-unit: ecosystem
	$(PY) -m pytest -q -ra tests/unit

test-dist: ecosystem
	$(PY) -m pytest -q -ra tests/dist

bench: install
	mkdir -p runs
	$(PY) scripts/bench.py --json runs/bench.json

clean:
	rm -rf runs .pytest_cache
