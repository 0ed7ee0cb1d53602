# The README's set-up commands. Each creates .venv when absent and installs into it what it needs:
#   make demo      the core package, then the main job on a small real corpus
#   make test      the core, the extras the fast tier uses (hf, retrieval, books) and the test
#                  tools; the fast tier
#   make test-all  every extra (beam with protobuf 7; gpu-compile apart, in .venv/gpu-compile)
#                  and test tool; every test
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Real data fetched from the package registries (never committed) is cached here.
export BERTJAX_CACHE ?= $(CURDIR)/.cache
DEMO_WORKDIR ?= workdir/demo
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
# What the fast tier leaves to `make test-all` (the markers are described in setup.cfg).
FULL_TIER_ONLY = slow or tpu_compile or gpu_compile or gcs or multiprocess or benchmark or notebook \
	or tfds or system_packages

.PHONY: demo test test-all install install-test install-all clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/bin/uv: $(PY)
	$(PY) -m pip install -q uv

# uv installs what pip would resolve, in parallel. It reads no pip configuration, so the
# find-links pip is given (a machine's local wheels) are passed on.
FIND_LINKS = $${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null)}
UV_INSTALL = $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) \
	--index-strategy unsafe-best-match $$(for l in $(FIND_LINKS); do echo --find-links=$$l; done)

$(VENV)/.installed: $(VENV)/bin/uv setup.cfg pyproject.toml
	$(UV_INSTALL) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/bin/uv setup.cfg pyproject.toml
	$(UV_INSTALL) -e '.[hf,retrieval,books,test]'
	touch $@

# The gpu-compile extra (the CUDA plugin) goes into a folder of its own: installed in the venv, it
# makes every JAX process on a machine without a GPU print its failed CUDA checks. The GPU compile
# test puts the folder on its compile's PYTHONPATH.
GPU_COMPILE = $$($(PY) -c "import configparser; c = configparser.ConfigParser(); \
	c.read('setup.cfg'); print(c['options.extras_require']['gpu-compile'])")

# apache-beam caps protobuf below 7; transformers' SentencePiece reader needs 7 (setup.cfg).
BEAM_OVERRIDES = $(VENV)/beam-overrides.txt

$(VENV)/.installed-all: $(VENV)/bin/uv setup.cfg pyproject.toml
	echo 'protobuf>=7' > $(BEAM_OVERRIDES)
	$(UV_INSTALL) --override $(BEAM_OVERRIDES) -e '.[all,beam,test,test-all]'
	$(UV_INSTALL) --no-deps --target $(VENV)/gpu-compile $(GPU_COMPILE)
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-all: $(VENV)/.installed-all

demo: $(VENV)/.installed
	$(PY) -m bertjax.main --config=configs/demo.py --workdir=$(DEMO_WORKDIR)

test: $(VENV)/.installed-test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not ($(FULL_TIER_ONLY))" $(PYTEST_ARGS)

test-all: $(VENV)/.installed-all
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
