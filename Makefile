# The two set-up commands of the README; each works on a fresh machine.
#   make demo   -- build everything and run the demo
#   make test   -- build everything and run the test suite, one worker per core (what CI runs)
#   make docs   -- build the Sphinx documentation into docs/_build/html (scripts/docs.sh)
#   make bench  -- run every benchmark and rewrite docs/benchmarks (benchmarks/README.md)
#   make gpu-check -- on a machine with a GPU: build, test, sanitize, benchmark (scripts/gpu_check.sh)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-slow bench docs clean gpu-check gpu-check-dry-run

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m vmfdist.demo

# -n auto: one pytest-xdist worker per core (the suite takes 4 min on 2 cores instead of 6)
test: setup
	$(PY) -m pytest -q -n auto tests

test-slow: setup
	$(PY) -m pytest -q -n auto --slow tests

bench: setup
	$(PY) -m benchmarks.run all

# Sphinx lives in .venv-docs; torch comes from $(VENV) through a .pth file (no second torch).
docs: setup
	VENV=$(VENV) bash scripts/docs.sh

# The GPU check runs against the python that holds the machine's torch (no venv, no download);
# the dry run rehearses it here (PYTHON=... picks the torch to rehearse against).
gpu-check:
	bash scripts/gpu_check.sh

gpu-check-dry-run:
	bash scripts/gpu_check.sh --dry-run --python $${PYTHON:-$(PY)}

clean:
	rm -rf build *.egg-info vmfdist/*.so
