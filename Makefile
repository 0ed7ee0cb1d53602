# The two set-up commands of the README. Each creates .venv when absent and installs into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Real data fetched from the package registry (never committed) is cached here.
export BERTJAX_CACHE ?= $(CURDIR)/.cache
DEMO_WORKDIR ?= workdir/demo
PYTEST_ARGS ?=
# Two pytest workers (a file stays on one worker, so its module fixtures are built once, and the
# session fixtures of tests/conftest.py once a worker): most tests spend their time compiling,
# which is single-threaded. Compiled programs are kept in .cache/jax (tests/conftest.py), shared by
# both workers and the processes tests start; a second `make test` starts from them.
TEST_WORKERS ?= 2

.PHONY: demo test install install-test clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# --no-compile: pip would byte-compile every module of the 3 GB of packages (half the install time,
# measured); Python compiles the few that are imported when they first are.
$(VENV)/.installed: $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q --no-compile -e .
	touch $@

$(VENV)/.installed-test: $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q --no-compile -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) -m bertjax.main --config=configs/demo.py --workdir=$(DEMO_WORKDIR)

test: $(VENV)/.installed-test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
