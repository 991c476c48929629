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

.PHONY: setup lab lab-command lint test test-shuffled test-busy demo bench gpu-check chaos notebooks screenshots links chromium cluster-daemons clean dist test-dist

# The lab panel's sources: an edit to any of them re-runs the install, which rebuilds the panel
# and copies it where JupyterLab loads it from.
LAB_SOURCES := labextension/package.json labextension/yarn.lock \
               $(shell find labextension/src labextension/style -type f 2>/dev/null)

# The environment gets its pip from the one that made it (pip --python; 2 s) rather than from
# ensurepip, which unpacks and compiles a bundled pip (8 s) only for the next line to upgrade it;
# ensurepip stays the way where the outer Python has no pip new enough for --python.
# torch first, pinned: the CPU build then satisfies the package's own range and pip does not
# fetch several GB of CUDA wheels.  Each step of the set-up keeps one core busy, so two run at a
# time: the panel (node) builds while pip installs torch, and torch's bytecode is compiled while
# pip installs the package, whose editable build then finds the panel built.  pip installs without
# compiling: torch's bytecode, which every kernel and engine imports at once as the tests start,
# is written ahead on all cores (COMPILE); other modules are compiled where first imported and
# cached then (make leaves PYTHONDONTWRITEBYTECODE out): compiling all 12,000 of their files
# ahead took 39 s of the set-up, and most are never imported.  A changed style, package.json or
# yarn.lock removes the built panel first (the editable build only noticed newer files in
# labextension/src).
SITE        := $(VENV)/lib/python3*/site-packages
COMPILE     := $(PY) -m compileall -q -q -j 0
PANEL_BUILT := kernel_ext/phalanx/labextension/package.json
BUILD_PANEL := cd labextension && PATH="$(abspath $(VENV))/bin:$$PATH" && \
               jlpm install --immutable && jlpm build:prod
# $(call beside,NAME,COMMAND,OTHER): runs COMMAND (its output in $(VENV)/NAME.log, shown if it
# fails) while OTHER runs; fails if either fails.
beside = { $(2); } > $(VENV)/$(1).log 2>&1 & pid=$$!; $(3); other=$$?; wait $$pid; own=$$?; \
         if [ $$own -ne 0 ]; then cat $(VENV)/$(1).log; echo "set-up: $(1) failed (above)"; fi; \
         test $$own -eq 0 -a $$other -eq 0
$(STAMP): pyproject.toml $(LAB_SOURCES)
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	$(PIP) --version >/dev/null 2>&1 || $(PYTHON) -m pip --python $(PY) install -q --no-compile pip \
	  >/dev/null 2>&1 || $(PY) -m ensurepip -q
	$(PIP) install -q --upgrade pip "jupyter_builder>=1.3,<2"
	$(if $(filter labextension/%,$?),rm -rf kernel_ext/phalanx/labextension)
	$(call beside,panel-build,test -f $(PANEL_BUILT) || { $(BUILD_PANEL); },\
	  $(PIP) install -q --no-compile torch==2.13.0)
	$(call beside,torch-bytecode,$(COMPILE) $(SITE)/torch || true,\
	  HATCH_JUPYTER_BUILDER_SKIP_NPM=1 $(PIP) install -q --no-compile -e ".[test]")
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium drives the browser tests (Playwright cannot download its own here).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

# `jupyter lab` that also runs as root and ends by printing the address with its token.
# tests/test_lab.py runs this very line, read through `make -s lab-command`.  It opens a working
# copy of notebooks/ in LAB_DIR (ignored by git, copied where it lacks a file): the tracked
# notebooks keep their saved outputs, and a person's edits survive the next `make lab`.
LAB_DIR ?= lab-notebooks
LAB := $(PY) scripts/lab.py --work-dir $(LAB_DIR) notebooks/01-quickstart.ipynb

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

# The suite with its modules in a shuffled order (the seed is printed in the header; replay one
# with SEED=N): finds a test that passes only because of what an earlier module left behind.
SEED ?= random
test-shuffled:
	$(MAKE) --no-print-directory test PYTEST_ARGS="$(PYTEST_ARGS) --shuffle-modules $(SEED) --no-loadscope-reorder"

# The suite beside two CPU burners, as on a laptop that is also doing other work: a test that
# depends on wall-clock speed fails here.  The burners end with the target, however it ends.
# The browser test that starts burners of its own (test_live_busy_browser.py) runs only here, and
# the plot-documents test makes 30 runs in a row here (6 in make test).
test-busy:
	@burners=""; for i in 1 2; do python3 -c "while True: pass" & burners="$$burners $$!"; done; \
	trap 'kill $$burners 2>/dev/null' EXIT INT TERM; \
	PHALANX_TEST_BURNERS=1 PHALANX_TEST_DOC_RUNS=30 $(MAKE) --no-print-directory test

demo: setup
	$(PY) notebooks/demo.py

bench: setup
	$(PY) benchmarks/run_all.py

# The GPU check (benchmarks/gpu_check.py): under 6 minutes on a machine with a GPU; without one
# each step says "skipped: no GPU".  On a machine with its own CUDA torch (the lent one: its
# python3), `make gpu-check GPU_PY=python3` installs what it lacks from the wheels in .whl first.
GPU_PY ?= $(PY)
GPU_SITE ?= /tmp/phalanx-gpu-site
gpu-check:
	@if ls .whl/*.whl >/dev/null 2>&1; then \
	  $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
	    --target $(GPU_SITE) .whl/*.whl || exit 1; fi
	PYTHONPATH=$(GPU_SITE)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# The example notebooks, rebuilt from notebooks/_build.py and saved executed (2-engine CPU cluster).
notebooks: setup
	$(PY) notebooks/_execute.py

# The README's pictures, from a real JupyterLab session in headless Chromium.
screenshots: setup chromium
	$(PY) docs/screenshots.py

# The sdist and the wheel in dist/, both with the panel that set-up built (a wheel built from the
# sdist needs no Node.js); the wheel is built from the sdist, as pip builds one from it.
dist: setup
	rm -f dist/phalanx-*
	$(PIP) install -q "build>=1.2"
	HATCH_JUPYTER_BUILDER_SKIP_NPM=1 $(PY) -m build --outdir dist .

# The wheel installed as a user would, into a new environment, then driven in JupyterLab and
# Chromium (tests/test_wheel_install.py), and Binder's build replayed (tests/test_binder.py); both
# marked dist: make test leaves them out.
test-dist: dist chromium
	$(PY) -m pytest -m dist tests/test_wheel_install.py tests/test_binder.py

# The README's Binder and nbviewer links, from pyproject.toml's Repository address.
links:
	python3 docs/links.py

# The manual, docs/ into docs/_build/html: Sphinx with MyST, the example notebooks as saved (none
# is executed), the API reference from the docstrings.  Warnings are errors and every reference
# must resolve (-n): a link to a missing page, heading anchor or documented object fails it.
# Nothing is fetched from the network.  -E reads every page again each time: the API pages depend
# on the package's sources, which Sphinx does not track.
.PHONY: docs
DOCS_STAMP := $(VENV)/.phalanx-docs-installed
$(DOCS_STAMP): docs/requirements.txt $(STAMP)
	$(PIP) install -q -r docs/requirements.txt
	touch $@

docs: setup $(DOCS_STAMP)
	$(PY) -m sphinx -E -W --keep-going -n -q -b html docs docs/_build/html
	@echo "the manual: docs/_build/html/index.html"

# One random fault per run on a real 2-engine cluster (CHAOS_ARGS="-n 50 --seed 7 --max-restarts 1").
CHAOS_ARGS ?= -n 50
chaos: setup
	$(PY) benchmarks/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build dist kernel_ext/phalanx/labextension labextension/lib labextension/node_modules
