VENV ?= .venv
PY := $(VENV)/bin/python
# The server's own dependencies, then the test toolchain on top: `make run` installs only the first.
SERVER := $(VENV)/.server-installed
TESTS := $(VENV)/.tests-installed

.PHONY: run test lint bench clean

# uv installs into the virtual environment (pip puts it there first): the test toolchain in under
# half a minute on 2 cores where pip took over a minute; compiled, as pip leaves it, so that the
# suite's many processes do not each compile what they import.
INSTALL := $(PY) -m uv pip install --compile-bytecode --python $(PY)

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install uv

$(SERVER): pyproject.toml | $(PY)
	$(INSTALL) -e .
	touch $@

$(TESTS): pyproject.toml $(SERVER)
	$(INSTALL) -e '.[test]'
	touch $@

PACKAGES := catalog rest events lineage sinks console

# A process compiles each module it imports that has no compiled copy, and where it may not write
# one (PYTHONDONTWRITEBYTECODE) every process of a server compiles the catalog again: a quarter of
# a second each, some 250 processes in `make test`. Compiled once here (what is up to date is skipped).
COMPILE := $(PY) -m compileall -q $(PACKAGES) tests

# `make run PORT=9000` serves another port (ISBRE_PORT and the TOML file's `port` work too).
run: $(SERVER)
	$(COMPILE)
	$(VENV)/bin/isbre serve $(if $(PORT),--port $(PORT))

# mypy reads the packages under their installed names through a tree of links (build/ is ignored):
# it cannot follow the editable install's import hook.
TYPECHECK := build/typecheck

lint: $(TESTS)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layers.py
	rm -rf $(TYPECHECK)/isbre && mkdir -p $(TYPECHECK)/isbre
	for package in $(PACKAGES); do ln -s ../../../$$package $(TYPECHECK)/isbre/$$package; done
	cd $(TYPECHECK) && $(abspath $(VENV))/bin/mypy --config-file $(CURDIR)/pyproject.toml \
		$(foreach package,$(PACKAGES),-p isbre.$(package))

# Test modules run in parallel processes, one module's tests in one process (they share its servers):
# one per core. Half as many again finished a tenth sooner on 2 cores (tests wait on servers,
# clients and timers a good part of the time) for a tenth more CPU: each test process collects
# the suite, starts its own PostgreSQL, zygote and forkservers, and processes that outnumber the
# cores spend more waiting on each other. `make test TEST_PROCESSES=0` runs them one at a time.
TEST_PROCESSES ?= $(shell python3 -c "import os; print(max(2, os.cpu_count() or 1))")
# `make lint` has just run the import-layers test: not again.
test: lint
	$(COMPILE)
	$(PY) -m pytest -n $(TEST_PROCESSES) --dist loadfile --ignore tests/test_layers.py

bench: $(TESTS)
	$(PY) -m tests.bench

clean:
	rm -rf $(VENV) warehouse .pytest_cache
