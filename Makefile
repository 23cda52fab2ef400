# Two commands do everything on a fresh machine (Python 3.10+):
#   make book   set up .venv, execute every chapter, build the book into _build/html
#   make test   set up .venv, run the whole test suite
# `make help` lists the rest.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help setup book test verify clean

help:
	@echo "make book    execute every chapter and build the book (_build/html)"
	@echo "make test    run the tests (unit, distributed on gloo, notebooks, book, browser)"
	@echo "make verify  check Distributed Muon against one process on a 2 x 2 grid"
	@echo "make setup   only create .venv from requirements.txt and install dmuon into it (editable)"
	@echo "make clean   remove the build and the virtual environment"

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

book: $(STAMP)
	$(BIN)/python scripts/build_book.py

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 tests

verify: $(STAMP)
	$(BIN)/python scripts/verify.py --dp 2 --tp 2

clean:
	rm -rf _build $(VENV)
