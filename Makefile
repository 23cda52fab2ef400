# Two commands do everything on a fresh machine (Python 3.10+):
#   make book   set up .venv, execute every chapter, build the book into _build/html
#   make test   set up .venv, run the whole test suite
# `make help` lists the rest.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: help setup lab colab book test verify record step-bench record-gpu mutate clean

help:
	@echo "make book    execute every chapter, build the book (_build/html) and its notebook edition (_build/colab)"
	@echo "make test    run the tests (unit, distributed on gloo, notebooks, book, browser)"
	@echo "make test-unit  one suite alone (also test-distributed, test-book, test-browser)"
	@echo "make verify  check Distributed Muon against one process on a 2 x 2 grid"
	@echo "make record  re-record the timing runs the book cites (book/data/bench_*.json, time_model_cpu.json; ~10 min, idle machine)"
	@echo "make step-bench  one optimizer step's GPU cost counted on the meta device, against torch.optim.Muon (~30 s)"
	@echo "make record-gpu  on a machine with a GPU: time the step there (OUT=file, default _build/record-gpu/step_bench_gpu.json), and with 2+ GPUs the whole iteration against DDP + ZeroRedundancyOptimizer (ITER_OUT)"
	@echo "make lab     set up .venv, add JupyterLab (and jupyterlab-myst) to it, and open the chapters (notebooks/) in it"
	@echo "make colab   run chapters of the notebook edition as Colab would (CHAPTERS=04_zero1_buffer,05_distributed_step)"
	@echo "make mutate  mutation testing (cosmic-ray) of the engine's math, plan and routes; by hand, not in make test (MUTATE_ARGS='--sample 100': fewer)"
	@echo "make setup   only create .venv from requirements.txt and install muongrid into it (editable)"
	@echo "make clean   remove the build and the virtual environment"

# --no-compile: byte-compiling every installed module (torch's and Jupyter's, 17,000 files) cost 80 s of CPU here;
# Python compiles the modules a run imports the first time it imports them. So it must be let write them: with
# PYTHONDONTWRITEBYTECODE set (some shells and containers set it) every process would compile torch again
# (`import torch`: 6.8 s of CPU from source, 2.5 s from bytecode, measured here), and the suite starts hundreds.
unexport PYTHONDONTWRITEBYTECODE
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-compile -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# JupyterLab is for reading the chapters as notebooks; the book build and the tests do not need it.
# jupyterlab-myst renders the chapters' MyST (roles, admonitions, folded solutions) in JupyterLab; a
# reference to another page stays unresolved there (the notebook edition, _build/colab, has links).
lab: $(STAMP)
	$(BIN)/python -c "import jupyterlab, jupyterlab_myst" 2>/dev/null || \
		$(BIN)/pip install --quiet "jupyterlab==4.6.6" "jupyterlab-myst==2.7.0"
	$(BIN)/jupyter lab notebooks

book: $(STAMP)
	$(BIN)/python scripts/build_book.py

# Two workers (pytest-xdist), a file's tests on one worker, the chapters executed beside them (tests/conftest.py).
# (--dist loadgroup would group by xdist_group marks, but xdist 3.8.0 cannot set them on pytest 9's nodes.)
WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 tests

# Chapters of the notebook edition run as Colab runs them (tests/test_colab.py; chapter 1 is in every
# `make test`): make colab CHAPTERS=04_zero1_buffer,05_distributed_step
CHAPTERS ?= 01_muon
colab: $(STAMP)
	MUONGRID_COLAB_CHAPTERS=$(CHAPTERS) $(BIN)/python -m pytest -q tests/test_colab.py

# One suite alone: make test-unit, test-distributed, test-book, test-browser (marks from tests/conftest.py).
test-%: $(STAMP)
	$(BIN)/python -m pytest -q -m $* tests

verify: $(STAMP)
	$(BIN)/python scripts/verify.py --dp 2 --tp 2

# The timing runs the book cites rather than reruns on every build: chapter 13's time model
# calibrated on this machine (first: chapter 15's timed run sizes its groups on it), chapter 8's
# benchmarks (more steps than a build can afford), and chapter 15's group layout on the report's
# shapes (tens of seconds a step), its groups sized by FLOPs, then by time on this machine's
# profile. Run it on an idle machine: each file keeps its command, commit, machine and load
# average (muongrid/lab/provenance.py).
# Chapter 8 reruns a short benchmark live beside them and fails if its bytes differ from the record.
# (book/data/convergence_study.json and fault_bench_2x1.json name their own commands inside.)
RECORD := --stack 4 --steps 7 --warmup 2
record: $(STAMP)
	$(BIN)/python scripts/calibrate_time_model.py --out book/data/time_model_cpu.json
	$(BIN)/python scripts/bench.py --dp 4 --tp 1 --layout bucket,owner,aligned --single $(RECORD) --out book/data/bench_layouts_4x1.json
	$(BIN)/python scripts/bench.py --dp 2 --tp 2 --layout bucket,owner,aligned --single $(RECORD) --out book/data/bench_layouts_2x2.json
	$(BIN)/python scripts/bench.py --dp 2 --tp 2 --layout owner --overlap none,naive,prefetch $(RECORD) --out book/data/bench_overlap_2x2.json
	$(BIN)/python scripts/bench.py --dp 2 --tp 2 --layout owner,group --single --report-shapes --steps 5 --warmup 1 --out book/data/bench_group_2x2.json
	$(BIN)/python scripts/bench.py --dp 2 --tp 2 --layout owner,group --hw this-machine --single --report-shapes --steps 5 --warmup 1 --out book/data/bench_group_timed_2x2.json

step-bench: $(STAMP)
	$(BIN)/python scripts/step_bench.py

# On a GPU machine, with a CUDA build of torch (the .venv pins the CPU build): the step against
# torch.optim.Muon + fused AdamW and the floor, timed there: host and device time apart, peak memory, and the
# GPU's model, driver, CUDA and NCCL versions beside the command, commit and machine (muongrid/lab/provenance.py,
# muongrid/lab/gpurecord.py). It writes OUT (default under _build/, which git ignores); copy a record worth
# citing into book/data/ by hand. PYTHON=/path/to/python make record-gpu OUT=/some/file.json
# With two GPUs or more it also records the whole iteration (DDP + torch.optim.Muon, DDP + ZeroRedundancyOptimizer and
# ours, scripts/iteration_bench.py) under torchrun, one rank per GPU on NCCL, into ITER_OUT; it has not run on GPUs yet.
OUT ?= _build/record-gpu/step_bench_gpu.json
ITER_OUT ?= _build/record-gpu/iteration_bench_gpu.json
record-gpu:
	PYTHONPATH=scripts $(PYTHON) scripts/step_bench.py --device cuda --time --out $(OUT)
	@echo "make record-gpu: wrote $(OUT)"
	@gpus=$$($(PYTHON) -c "import torch; print(torch.cuda.device_count())"); \
	if [ "$$gpus" -ge 2 ]; then \
		PYTHONPATH=scripts $(PYTHON) -m torch.distributed.run --standalone --nproc-per-node $$gpus \
			scripts/iteration_bench.py --dp $$gpus --out $(ITER_OUT) && echo "make record-gpu: wrote $(ITER_OUT)"; \
	else echo "make record-gpu: iteration_bench.py needs 2 GPUs or more (one NCCL rank per GPU); $$gpus here"; fi

# Mutation testing (issue 41): cosmic-ray, pinned, installed here rather than in requirements.txt (nothing else
# needs it); it runs in a copy of the tree (tests/mutate_run.py says how) and reports each module's score.
MUTATE_ARGS ?=
mutate: $(STAMP)
	$(BIN)/pip install --quiet cosmic-ray==8.7.0
	$(BIN)/python tests/mutate_run.py $(MUTATE_ARGS)

clean:
	rm -rf _build $(VENV)
