# Developer and CI entry points. Everything runs inside $(VENV), created on
# first use from setup.cfg's [dev] extra (re-created when setup.cfg changes).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Extra pytest arguments, e.g. make test PYTEST_ARGS='-k worker -x'
PYTEST_ARGS ?=

.PHONY: all install demo test test-oldest test-python test-all lint examples docs clean bench bench-quick bench-ab

all: lint test

install: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -e '.[dev]'
	touch $@

# Starts an embedded server unless JOBQ_REDIS_URL names one.
demo: $(VENV)/.installed
	$(BIN)/python examples/quickstart.py

# Default selection (setup.cfg), then the same tests again on a one-node
# cluster, which checks that every script and pipeline stays in one slot,
# and again with RESP3 clients (redis.Redis(protocol=3): maps for XREAD,
# pushes for pub/sub), which checks every reply jobq parses. The browser tests
# (headless Chromium) run in the first pass only: the other two would repeat them.
CLUSTER_RUN = -m "not cluster and not fault and not slow and not load and not sentinel and not tls and not browser"
RESP3_RUN = $(CLUSTER_RUN)
test: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	JOBQ_TEST_CLUSTER=1 $(BIN)/python -m pytest $(CLUSTER_RUN) $(PYTEST_ARGS)
	JOBQ_TEST_RESP3=1 $(BIN)/python -m pytest $(RESP3_RUN) $(PYTEST_ARGS)

# The default selection with the oldest redis-py, croniter and hiredis that setup.cfg
# allows: the scripts' fast path and the worker's own connections use redis-py
# internals; croniter before 6.1 gets daylight-saving changes wrong; hiredis before
# 2.2 has no pack_command.
OLDEST_DEPS ?= redis==5.0.1 croniter==6.1.0 hiredis==2.2.3
OLDEST_VENV ?= .venv-oldest
$(OLDEST_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install -e '.[test]' $(OLDEST_DEPS)
	touch $@

test-oldest: $(OLDEST_VENV)/.installed
	$(OLDEST_VENV)/bin/python -c 'from importlib.metadata import version as v; print("redis-py", v("redis"), "croniter", v("croniter"), "hiredis", v("hiredis"))'
	$(OLDEST_VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The default selection on another interpreter, in a venv of its own:
# make test-python PY=python3.10 (.ci/run runs the oldest supported, 3.10,
# and the newest tested, 3.13, when they are installed).
PY ?= python3.13
PY_VENV = .venv-py$(shell $(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
$(PY_VENV)/.installed: setup.cfg pyproject.toml
	$(PY) -m venv $(PY_VENV)
	$(PY_VENV)/bin/python -m pip install --upgrade pip
	$(PY_VENV)/bin/python -m pip install -e '.[test]'
	touch $@

test-python: $(PY_VENV)/.installed
	$(PY_VENV)/bin/python -c 'import sys; print("Python", sys.version.split()[0])'
	$(PY_VENV)/bin/python -m pytest $(PYTEST_ARGS)

# Every tier, slow, load and fault included.
test-all: $(VENV)/.installed
	$(BIN)/python -m pytest -m "" $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy jobq tests/typed_usage.py

# The documentation site (MkDocs Material, mkdocs.yml) into site/; any
# warning (a broken link, a missing snippet, a bad docstring) fails it.
$(VENV)/.docs-installed: $(VENV)/.installed setup.cfg
	$(BIN)/python -m pip install -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d site

# Runs each examples/*.py that has a "# ci: run" line, two minutes at most each.
examples: $(VENV)/.installed
	@set -e; ran=0; \
	for script in examples/*.py; do \
	    [ -f "$$script" ] || continue; \
	    grep -q '^# ci: run' "$$script" || continue; \
	    echo "--- $$script"; \
	    timeout 120 $(BIN)/python "$$script"; \
	    ran=$$((ran + 1)); \
	done; \
	echo "--- $$ran example(s) ran"

# Side-by-side benchmark of jobq and its peers (bench/README.md); ~25 min.
bench: $(VENV)/.installed
	timeout 2400 $(BIN)/python bench/run.py

# About 3 minutes: fewer jobs, 1 repeat, a subset of peers.
bench-quick: $(VENV)/.installed
	timeout 600 $(BIN)/python bench/run.py --quick

# jobq at revision BASE against HEAD, interleaved, one server (bench/README.md); ~2 min.
BASE ?= cc5c0c5
bench-ab: $(VENV)/.installed
	timeout 1200 $(BIN)/python bench/ab.py --base $(BASE) --head HEAD

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build dist site *.egg-info .mypy_cache .ruff_cache .pytest_cache
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
