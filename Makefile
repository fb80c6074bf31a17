# The README's two commands: `make demo` and `make test`. Both set up a virtual environment
# first (torch pinned to the CPU build before anything that depends on it; a torch 2.13.0 already
# there, such as a CUDA build, is kept: README, "The tests with a CUDA build of torch").
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out/demo

.PHONY: install demo test test-fast lint

# pip's own output (its notices and warnings, such as "Location ... is ignored") goes to
# $(INSTALL_LOG), not into the demo's; a failed install prints the log's end.
INSTALL_LOG := $(VENV)/install.log

$(BIN)/.installed: pyproject.toml
	@echo "installing maskstream into $(VENV) (pip's output: $(INSTALL_LOG))"
	@$(PYTHON) -m venv $(VENV)
	@{ $(BIN)/python -m pip install --upgrade pip \
	  && $(BIN)/python -m pip install torch==2.13.0 \
	  && $(BIN)/python -m pip install -e '.[test]'; } > $(INSTALL_LOG) 2>&1 \
	  || { tail -n 40 $(INSTALL_LOG); echo "install failed: see $(INSTALL_LOG)"; exit 1; }
	@touch $@

install: $(BIN)/.installed

demo: install
	@OUT=$(OUT) PATH=$(abspath $(BIN)):$$PATH bash scripts/demo.sh

# Two pytest workers, a module to a worker (a module's fixtures are built once), the longest modules first
# (issue 62, idle 2-core machines): 21.8 -> 15.3 -> 13 minutes on one machine as the slow tests got cheaper;
# 9.4 -> 8.4 minutes on a faster one with the offline output-hash check inside the suite, a faster soak and
# the longest modules first.
PYTEST_WORKERS := -n 2 --dist loadscope --no-loadscope-reorder  # longest modules first: tests/conftest.py

test: install
	$(BIN)/python -m pytest $(PYTEST_WORKERS)

# For contributors: the tests not marked slow (no subprocess, no Beam pipeline, no training; tests/conftest.py
# holds the marker), in about 2 minutes.
test-fast: install
	$(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not slow" -q

lint: install
	$(BIN)/ruff check .
