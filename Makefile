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
# into pytest and every process it starts; where it is missing nothing is preloaded. It takes its
# memory in 2 MiB pages where the kernel allows (transparent huge pages on madvise): fewer page
# faults; two tiny fine-tuning runs side by side took 17.4-18.9 s against 17.8-19.3 s (the means
# of three alternating pairs).
MIMALLOC = $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/cmeel.prefix/lib/libmimalloc.so

.PHONY: demo test install install-test clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/bin/uv: $(PY)
	$(PY) -m pip install -q uv

# uv installs the same versions pip resolves, in parallel: the test extras in 5 s against pip's
# 56 s. uv reads no pip configuration, so the find-links pip is given (a machine's local wheels,
# such as its CPU-only torch) are passed on, and the best version across them and the index is
# taken, as pip takes it. Bytecode: the demo's install compiles every package up front (a machine
# with PYTHONDONTWRITEBYTECODE set, this one, would otherwise compile the sources anew in every
# process); the test extras are not (20 s more): the `test` target writes bytecode for what the
# suite's processes import.
FIND_LINKS = $${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null)}
UV_INSTALL = $(VENV)/bin/uv pip install -q --python $(PY) --index-strategy unsafe-best-match \
	$$(for l in $(FIND_LINKS); do echo --find-links=$$l; done)

$(VENV)/.installed: $(VENV)/bin/uv setup.cfg pyproject.toml
	$(UV_INSTALL) --compile-bytecode -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/bin/uv setup.cfg pyproject.toml
	$(UV_INSTALL) -e '.[test]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: $(VENV)/.installed
	$(PY) -m bertjax.main --config=configs/demo.py --workdir=$(DEMO_WORKDIR)

# Bytecode is written for the suite even where PYTHONDONTWRITEBYTECODE is set: the packages and
# bertjax's sources are compiled once, by the first process to import them, not by each of the
# ~130 processes the tests start (bertjax's own import: 59 ms against 232 ms), and the two workers
# share pytest's rewritten test modules. __pycache__/ is ignored by git.
test: $(VENV)/.installed-test
	lib=$(MIMALLOC); test -f "$$lib" || lib=; \
	LD_PRELOAD="$$lib$${LD_PRELOAD:+ $$LD_PRELOAD}" MIMALLOC_ALLOW_LARGE_OS_PAGES=1 \
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
