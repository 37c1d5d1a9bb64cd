# Quick start: `make demo`, `make test`, `make bench`. Everything runs from .venv, built from the exact pins.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench lock clean

install: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation --editable .
	touch $@

demo: install
	$(PY) tools/demo.py

lint: install
	$(VENV)/bin/ruff check .

test: install lint
	$(PY) -m pytest

# Benchmark against the seed-style converters and `cp -r` (writes BENCHMARKS.md, benchmarks.png).
# Corpora come from bench/make_corpus.py (Debian's mate-backgrounds photos via `apt-get download`,
# or synthetic photos offline), cached in .bench/. BENCH_ARGS="--rounds 5 --scale 10000" etc.; see bench/run.py.
bench: install
	$(PY) bench/run.py $(BENCH_ARGS)

lock:
	$(PYTHON) tools/lock.py requirements.in requirements.txt
	$(PYTHON) tools/lock.py requirements-dev.in requirements-dev.txt --base requirements.txt

clean:
	rm -rf .demo .pytest_cache .ruff_cache
