# phalanx: every target installs what it needs first, so on a fresh machine
# `make lab` or `make test` is all it takes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.phalanx-installed
PYTEST_ARGS ?=

.PHONY: setup lab test demo bench chromium clean

# torch first, pinned: the CPU build then satisfies the package's own range and pip does not
# fetch several GB of CUDA wheels.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
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

test: setup chromium
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(PY) notebooks/demo.py

bench: setup
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build dist kernel_ext/phalanx/labextension labextension/lib labextension/node_modules
