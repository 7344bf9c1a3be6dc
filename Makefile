# `make train` and `make test` each set up .venv (once) and run.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup train test test-slow bench tensorboard clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

train: $(STAMP)
	$(PY) -m rollx.train --config=configs/frozenlake.py

# the dashboard of `make train` (and every run under ./output/logs): http://localhost:6006
tensorboard: $(STAMP)
	$(VENV)/bin/tensorboard --logdir ./output/logs

# two workers, one test file each at a time, longest first (tests/conftest.py): on 2 cores
# 1,692 s of pytest on a clean clone (746 tests, 2026-12-07); three workers took no less
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Every bench/*.py with its short setting (--quick): its stdout, then its time; stops at
# the first that fails, runs over 10 minutes or whose last line is not a ratio
# ("ratio 1.42x"). ~3 minutes on 2 cores.
bench: $(STAMP)
	@set -e; log=$$(mktemp -d); for b in bench/*.py; do \
	  echo "== $$b --quick"; start=$$(date +%s); \
	  if ! timeout 600 $(PY) $$b --quick >$$log/out 2>$$log/err; then \
	    cat $$log/out; tail -n 30 $$log/err; echo "FAILED: $$b"; exit 1; fi; \
	  cat $$log/out; echo "   ($$(( $$(date +%s) - start )) s)"; \
	  tail -n 1 $$log/out | grep -Eq 'ratio [0-9.]+x' || { \
	    echo "FAILED: $$b: its last line is not a ratio"; exit 1; }; \
	done; rm -rf $$log

clean:
	rm -rf $(VENV) output build *.egg-info
