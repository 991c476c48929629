# phalanx: every target installs what it needs first, so on a fresh machine
# `make lab` or `make test` is all it takes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.phalanx-installed
PYTEST_ARGS ?=

.PHONY: setup lab test demo bench chaos chromium clean

# The lab panel's sources: an edit to any of them re-runs the install, which rebuilds the panel
# and copies it where JupyterLab loads it from.
LAB_SOURCES := labextension/package.json labextension/yarn.lock \
               $(shell find labextension/src labextension/style -type f 2>/dev/null)

# torch first, pinned: the CPU build then satisfies the package's own range and pip does not
# fetch several GB of CUDA wheels.  The editable build only notices newer files in
# labextension/src, so a changed style, package.json or yarn.lock removes the built panel first.
$(STAMP): pyproject.toml $(LAB_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(if $(filter labextension/%,$?),rm -rf kernel_ext/phalanx/labextension)
	$(PIP) install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium drives the browser tests (Playwright cannot download its own here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

lab: setup
	$(VENV)/bin/jupyter lab notebooks/01-quickstart.ipynb

# The panel's TypeScript unit tests first (seconds), then the Python suite.
test: setup chromium
	cd labextension && ../$(VENV)/bin/jlpm install --immutable && ../$(VENV)/bin/jlpm test
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(PY) notebooks/demo.py

bench: setup
	$(PY) benchmarks/run_all.py

# One random fault per run on a real 2-engine cluster (CHAOS_ARGS="-n 50 --seed 7 --max-restarts 1").
CHAOS_ARGS ?= -n 50
chaos: setup
	$(PY) benchmarks/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build dist kernel_ext/phalanx/labextension labextension/lib labextension/node_modules
