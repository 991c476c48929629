# phalanx: every target installs what it needs first, so on a fresh machine
# `make lab` or `make test` is all it takes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
STAMP  := $(VENV)/.phalanx-installed
# The slowest tests are listed at the end of every run: where the suite's time goes.
PYTEST_ARGS ?= --durations=30
# Test modules run on parallel workers (one per CPU, at most 4), a module's tests together on one
# worker so its cluster or JupyterLab is started once.  PYTEST_WORKERS= runs them one by one.
PYTEST_WORKERS ?= -n logical --maxprocesses=4 --dist loadfile

# Python caches compiled modules beside their sources (a machine may turn that off with
# PYTHONDONTWRITEBYTECODE): without the cache every kernel, engine and script the tests start
# compiles phalanx again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup lab lab-command lint test demo bench chaos notebooks screenshots links chromium cluster-daemons clean

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

# `jupyter lab` that also runs as root and ends by printing the address with its token.
# tests/test_lab.py runs this very line, read through `make -s lab-command`.
LAB := $(PY) scripts/lab.py notebooks/01-quickstart.ipynb

# Real daemons for the Slurm and SSH launcher tests (tests skip, saying why, where they cannot run).
cluster-daemons:
	@if command -v sbatch >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 \
	    && command -v sshd >/dev/null 2>&1; then :; else \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq slurm-wlm munge openssh-server \
	    openssh-client >/dev/null; } || echo "could not install slurm-wlm/munge/openssh:" \
	    "the Slurm and SSH launcher tests will skip"; fi

lab: setup
	$(LAB)

lab-command:
	@echo '$(LAB)'

# The linter, the type checker, the panel's TypeScript type check, format check and unit tests
# (about half a minute of CPU).
lint: setup
	$(PY) -m ruff check kernel_ext benchmarks tests scripts notebooks
	$(PY) -m mypy
	cd labextension && ../$(VENV)/bin/jlpm typecheck && ../$(VENV)/bin/jlpm format:check \
		&& ../$(VENV)/bin/jlpm test

# The panel's lock file is checked first; then `make lint` runs beside the Python suite, which
# leaves part of the CPU idle while its tests wait on processes, and its output is printed once
# both are done.  Either failing fails the target.
LINT_LOG := test-artifacts/lint.log
test: setup chromium cluster-daemons
	cd labextension && ../$(VENV)/bin/jlpm install --immutable
	@mkdir -p $(dir $(LINT_LOG))
	@$(MAKE) --no-print-directory lint > $(LINT_LOG) 2>&1 & lint=$$!; \
	$(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS); tests=$$?; \
	wait $$lint; checks=$$?; cat $(LINT_LOG); \
	if [ $$checks -ne 0 ]; then echo "make test: the static checks failed (above)"; fi; \
	test $$tests -eq 0 -a $$checks -eq 0

demo: setup
	$(PY) notebooks/demo.py

bench: setup
	$(PY) benchmarks/run_all.py

# The example notebooks, rebuilt from notebooks/_build.py and saved executed (2-engine CPU cluster).
notebooks: setup
	$(PY) notebooks/_execute.py

# The README's pictures, from a real JupyterLab session in headless Chromium.
screenshots: setup chromium
	$(PY) docs/screenshots.py

# The README's Binder and nbviewer links, from pyproject.toml's Repository address.
links:
	python3 docs/links.py

# One random fault per run on a real 2-engine cluster (CHAOS_ARGS="-n 50 --seed 7 --max-restarts 1").
CHAOS_ARGS ?= -n 50
chaos: setup
	$(PY) benchmarks/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build dist kernel_ext/phalanx/labextension labextension/lib labextension/node_modules
