# The two set-up commands of the README; each works on a fresh machine.
#   make demo   -- build everything and run the demo
#   make test   -- build everything and run the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-slow bench docs clean

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) -m vmfdist.demo

test: setup
	$(PY) -m pytest -q tests

test-slow: setup
	$(PY) -m pytest -q --slow tests

bench: setup
	$(PY) -m benchmarks.run all

clean:
	rm -rf build *.egg-info vmfdist/*.so
